"""Suite-wide settings.

The test extra installs libtpu and the CUDA plugin (for the ahead-of-time compile tests), so a bare `import jax`
would probe for TPU and GPU runtimes that a CPU host does not have. Tests run on the CPU backend unless the caller
chose a platform; subprocesses inherit the setting. Ahead-of-time tests reach TPU/GPU compilers through
`jax.experimental.topologies`, which does not need those backends initialised.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

# Skips that are facts of the host, not missing packages: allowed under CI=true too.
_HOST_SKIPS = ("needs an accelerator-less host",)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skipped test fails: CI (.ci/run) installs every package a test needs, so a skip there means
    a test that silently stopped running (e.g. a missing optional package)."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI", "").lower() != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
    if any(s in reason for s in _HOST_SKIPS) or item.get_closest_marker("skip_ok_in_ci"):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true ({reason}): CI must install what the tests need (.ci/run)"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a whole module skipped at collection (a module-level importorskip)."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI", "").lower() != "true" or not report.skipped:
        return
    reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
    if not any(s in reason for s in _HOST_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true ({reason}): CI must install what the tests need (.ci/run)"


# ---- the trainer's test fixtures, shared by the fault, resume, train and sharding tests

@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The environment of trainer subprocesses: CPU, the session's shared tokenizer and JAX compilation caches."""
    from tests import train_helpers as T
    return T.cached_env(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def finished(tmp_path_factory, env):
    """A complete 20-step run of the tiny config: checkpoints 10, 15, 20 (keep_last 3), validation and best/ at
    step 20; (workdir, {step: loss})."""
    from idattn.rundir.layout import committed_steps
    from tests import train_helpers as T
    wd = str(tmp_path_factory.mktemp("finished"))
    T.run_train(wd, env=env)
    assert committed_steps(wd) == [10, 15, 20]
    return wd, {r["step"]: r["loss"] for r in T.read_metrics(wd)}


@pytest.fixture
def in_process(env, monkeypatch):
    """idattn.train.trainer for in-process runs, sharing the subprocesses' tokenizer cache and JAX compilation
    cache (the same tiny programs: compiled once per session)."""
    import jax
    monkeypatch.setenv("IDATTN_CACHE", env["IDATTN_CACHE"])
    jax.config.update("jax_compilation_cache_dir", env["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from idattn.train import trainer
    return trainer


@pytest.fixture(scope="module")
def fast_compile():
    """Most XLA optimisations off for one module (`pytestmark = pytest.mark.usefixtures("fast_compile")`): on
    CPU the compile of a small model or operator dominates its test, and the numbers do not depend on it."""
    import jax
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", old)
