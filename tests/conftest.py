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
