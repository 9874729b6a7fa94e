"""The benchmark entry points run end to end at tiny sizes and report what they claim (not timed tests)."""
import re

import jax.numpy as jnp
import numpy as np
import pytest

from idattn.bench import op as bop


def test_op_rows_and_table():
    rows = bop.bench_case((2, 8, 4), 32, 64, ["sequential", "chunked"], ["fwd", "fwdbwd"], jnp.float32,
                          chunk=16, warmup=1, repeats=2)
    got = {(r.impl, r.mode) for r in rows}
    assert got == {(i, m) for i in ("attention", "sequential", "chunked") for m in ("fwd", "fwdbwd")}
    for r in rows:
        assert r.ms is not None and r.ms > 0, r
        assert r.B == 2 and r.T == 32
        assert abs(r.tokens_per_s - 64 / (r.ms / 1e3)) < 1e-6 * r.tokens_per_s
    table = bop.format_table(rows)
    attn = {r.mode: r.ms for r in rows if r.impl == "attention"}
    # the ratio printed for chunked fwd is attention ms / chunked ms of this very run
    ch = next(r for r in rows if r.impl == "chunked" and r.mode == "fwd")
    line = next(ln for ln in table.splitlines() if " chunked " in ln and " fwd " in ln)
    assert re.search(r"(\d+\.\d\d)x", line).group(1) == f"{attn['fwd'] / ch.ms:.2f}"


def test_op_errors_become_notes():
    """An implementation that refuses (associative past its memory bound) is reported, not raised."""
    from idattn.ops import set_associative_max_bytes
    prev = set_associative_max_bytes(1)
    try:
        rows = bop.bench_case((1, 4, 2), 16, 16, ["associative"], ["fwd"], jnp.float32, chunk=16, warmup=0,
                              repeats=1, attention=False)
    finally:
        set_associative_max_bytes(prev)
    note = rows[0].note.lower()
    assert rows[0].ms is None and "valueerror" in note and "associative" in note, rows[0]


@pytest.mark.slow  # the default suite's 10-minute budget (CI measured 13 s); CI's slow pass runs it
def test_mixer_fwdbwd_grads_match_chunked():
    """The fwd+bwd function the benchmark times is the gradient of the same loss for every impl."""
    fq, zk, zv, lam, b, c = bop.make_inputs(1, 24, 2, 8, 4, jnp.float32)
    g = jnp.ones((1, 24, 2, 8), jnp.float32)
    v1, g1 = bop.mixer_fn("sequential", "fwdbwd", 8, False)(fq, zk, zv, lam, b, c, g)
    v2, g2 = bop.mixer_fn("chunked", "fwdbwd", 8, False)(fq, zk, zv, lam, b, c, g)
    assert np.allclose(v1, v2, rtol=1e-4)
    for a, r in zip(g1, g2):
        assert np.max(np.abs(np.asarray(a) - np.asarray(r))) <= 1e-4 * np.max(np.abs(np.asarray(r)))


def test_theory_table_converges():
    from idattn.bench import theory
    rows = theory.run((2, 16), length=120, seeds=(0,))
    (m2, e2, _, _), (m16, e16, _, _) = rows
    assert e2 / e16 >= 5.0, rows


def test_cli_dispatch(capsys, monkeypatch):
    from idattn.bench import theory
    from idattn.bench.__main__ import main
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2 and "{op,theory,model,tpu,gpu,checksum}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["thoery"])
    assert e.value.code == 2 and "invalid choice: 'thoery'" in capsys.readouterr().err
    seen = []
    monkeypatch.setattr(theory, "main", seen.append)
    assert main(["theory", "--length", "64", "--seeds=1"]) == 0 and seen == [["--length", "64", "--seeds=1"]]


@pytest.mark.parametrize("flag,said", [
    ("--modes=fwd+bwd", "error: --modes=fwd+bwd: unknown mode(s) fwd+bwd; expected a comma-separated list of fwd, "
                        "fwdbwd"),
    ("--modes=fwd,bwd", "unknown mode(s) bwd;"),
    ("--impls=chunky", "error: --impls=chunky: unknown chunky; expected a comma-separated list of sequential"),
])
def test_op_refuses_unknown_modes_and_impls_up_front(capsys, monkeypatch, flag, said):
    """An unknown --modes / --impls value stops before any benchmark runs, in one line naming the valid ones
    (fwd+bwd used to reach the benchmark and fail there with a TypeError about loss())."""
    monkeypatch.setattr(bop, "bench_case", lambda *a, **k: pytest.fail("benchmark ran"))
    with pytest.raises(SystemExit) as e:
        bop.main([flag, "--no-decode"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and said in err and len(err.splitlines()) == 1


def _gpu_check_script():
    """scripts/gpu_check.py as a module (it is a script, not part of the package)."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "gpu_check.py")
    spec = importlib.util.spec_from_file_location("gpu_check_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_stops_a_silent_child_at_its_budget():
    """A section's child that prints nothing is still killed at its deadline (the budget once overran by the
    time a silent child took: the timeout was checked only when a line arrived)."""
    import time
    gc = _gpu_check_script()
    t = time.time()
    lines = gc.run_module(["-c", "import time; print('started', flush=True); time.sleep(60)"], timeout=3)
    assert time.time() - t < 15, lines
    assert lines[0] == "started" and "(stopped after 3 s: time budget)" in lines, lines


@pytest.mark.slow
def test_gpu_check_dry_run_fits_its_budget_and_skips_what_needs_a_gpu():
    """`scripts/gpu_check.py --dry-run --budget-s B` on CPU: done within B, and nothing reports FAILED or ERROR
    (issue 38 item 5; the cuDNN section's 'skipped (no GPU)' is checked below, it runs only when the budget lets
    the script reach it)."""
    import os
    import subprocess
    import sys
    import time
    root = os.path.join(os.path.dirname(__file__), "..")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=root)
    env.pop("OUT", None)
    budget = 150
    t = time.time()
    proc = subprocess.run([sys.executable, os.path.join(root, "scripts", "gpu_check.py"), "--dry-run",
                           f"--budget-s={budget}"], env=env, capture_output=True, text=True, timeout=3 * budget)
    wall = time.time() - t
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    total = float(re.search(r"total (\d+) s of 150 s budget", out).group(1))
    assert total <= budget and wall <= budget + 30, (total, wall)  # + the interpreter's start and jax's import
    assert "FAILED" not in out and "ERROR" not in out, out[-3000:]  # how far it gets depends on the load


def test_smoke_skips_cudnn_off_a_gpu():
    """`python -m idattn.bench.smoke` (gpu_check's section (c)) on CPU: the cuDNN comparison says it was skipped,
    never FAILED (issue 38 item 5)."""
    from idattn.bench import smoke
    lines = smoke.cudnn_vs_xla(tiny=True)
    assert [ln.split(":")[0] for ln in lines] == ["cudnn vs xla [causal]", "cudnn vs xla [segments]"]
    assert all("skipped (no GPU: cuDNN attention needs an NVIDIA GPU)" in ln for ln in lines), lines
