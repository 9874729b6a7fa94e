"""Exact resume: a run killed with SIGKILL (or stopped with SIGTERM) and rerun with the same command reproduces
the uninterrupted run's losses bit for bit on CPU (same batches through the checkpointed data-iterator state,
same parameters and optimiser state through the orbax checkpoint)."""
import os
import re
import signal
import subprocess
import time

import pytest

from tests import train_helpers as T
from idattn.rundir.layout import committed_steps

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return T.cached_env(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def straight(tmp_path_factory, env):
    wd = str(tmp_path_factory.mktemp("straight"))
    T.run_train(wd, env=env)
    rec = T.read_metrics(wd)
    assert [r["step"] for r in rec] == list(range(1, 21))
    return {r["step"]: r["loss"] for r in rec}


def _start_slow(wd, env):
    slow = dict(env, IDATTN_DEBUG_STEP_SLEEP="0.25")
    return slow, subprocess.Popen(T.train_command(wd), cwd=T.REPO, env=slow, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)


def _wait_for(pred, proc, timeout=180.0):
    t0 = time.time()
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"run ended early (rc={proc.returncode}):\n{proc.stdout.read()[-3000:]}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.05)


def _check_resumed(wd, rerun_out, straight, min_step):
    m = re.search(r"restored step (\d+) from (\S+)", rerun_out)
    assert m, f"no restore line in the rerun's output:\n{rerun_out[-3000:]}"
    restored = int(m.group(1))
    assert restored >= min_step and m.group(2).endswith(os.path.join("checkpoints", str(restored)))
    rec = T.read_metrics(wd)
    steps = [r["step"] for r in rec]
    assert all(b > a for a, b in zip(steps, steps[1:])), f"steps not strictly increasing: {steps}"
    assert steps == list(range(1, 21)), steps
    resumed = {r["step"]: r["loss"] for r in rec}
    for s in range(restored + 1, 21):  # bitwise: float32 losses written with repr
        assert resumed[s] == straight[s], (s, resumed[s], straight[s])
    for s in range(1, restored + 1):
        assert resumed[s] == straight[s], (s, resumed[s], straight[s])
    return restored


def test_sigkill_then_rerun_matches_straight_run(tmp_path, env, straight):
    wd = str(tmp_path / "killed")
    slow, proc = _start_slow(wd, env)
    _wait_for(lambda: any(s >= 10 for s in committed_steps(wd)), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert max(committed_steps(wd)) < 20, "the run finished before it was killed; the test proves nothing"
    rerun = T.run_train(wd, env=slow)
    _check_resumed(wd, rerun.stdout + rerun.stderr, straight, min_step=10)


@pytest.mark.slow  # the default suite's budget; tests/test_faults.py's slow launcher test also stops runs with
# SIGTERM (one process and through the launcher) and checks the resumed losses
def test_sigterm_saves_and_rerun_matches(tmp_path, env, straight):
    wd = str(tmp_path / "term")
    slow, proc = _start_slow(wd, env)
    metrics = os.path.join(wd, "metrics.jsonl")
    _wait_for(lambda: os.path.exists(metrics) and len(T.read_metrics(wd)) >= 7, proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-3000:]
    m = re.search(r"preemption signal: saving step (\d+)", out)
    assert m, out[-3000:]
    saved = int(m.group(1))
    assert 7 <= saved < 20 and saved in committed_steps(wd), (saved, committed_steps(wd))
    rerun = T.run_train(wd, env=env)
    assert _check_resumed(wd, rerun.stdout + rerun.stderr, straight, min_step=saved) == saved
