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


def _tb_events(wd) -> list[list]:
    """Every event file of the run (oldest first), each a list of its events (tensorboardX protos), read as
    TFRecords: 8-byte length, 4-byte CRC, the record, 4-byte CRC."""
    import glob
    import struct

    from tensorboardX.proto.event_pb2 import Event

    files = []
    for path in sorted(glob.glob(os.path.join(wd, "tb", "events.out.tfevents.*")),
                       key=lambda p: int(os.path.basename(p).split(".")[3])):
        data, events, i = open(path, "rb").read(), [], 0
        while i + 12 <= len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            events.append(Event.FromString(data[i + 12:i + 12 + n]))
            i += 12 + n + 4
        files.append(events)
    return files


def _tb_scalars(files, tag, purge=True) -> list[tuple[int, float]]:
    """(step, value) of `tag` as TensorBoard shows it: a SessionLog START at step s (tensorboardX's purge_step)
    expires every earlier event at step >= s (TensorBoard's orphaned-data purge); purge=False: the raw events."""
    from tensorboardX.proto.event_pb2 import SessionLog

    out = []
    for events in files:
        for e in events:
            if purge and e.HasField("session_log") and e.session_log.status == SessionLog.START:
                out = [(st, v) for st, v in out if st < e.step]
            for v in e.summary.value:
                if v.tag == tag:
                    out.append((e.step, v.simple_value))
    return out


@pytest.mark.slow  # the default suite's 10-minute budget (clean clone: 37 s with its fixture); CI's slow pass runs it
def test_sigkill_then_rerun_matches_straight_run(tmp_path, env, straight):
    """Also TensorBoard's purge on resume: the killed run logged steps past its last checkpoint, which the rerun
    logs again; its event file starts with a purge at restored + 1, so TensorBoard shows every step once, with
    the rerun's values (metrics.jsonl's)."""
    wd = str(tmp_path / "killed")
    slow, proc = _start_slow(wd, env)

    def past_a_checkpoint():  # two steps past a committed step >= 10, the next commit three steps away
        c = [s for s in committed_steps(wd) if s >= 10]
        return bool(c) and os.path.exists(os.path.join(wd, "metrics.jsonl")) and max(
            r["step"] for r in T.read_metrics(wd)) >= max(c) + 2

    _wait_for(past_a_checkpoint, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert max(committed_steps(wd)) < 20, "the run finished before it was killed; the test proves nothing"
    killed_last = max(r["step"] for r in T.read_metrics(wd))
    rerun = T.run_train(wd, env=slow)
    restored = _check_resumed(wd, rerun.stdout + rerun.stderr, straight, min_step=10)

    files = _tb_events(wd)
    assert len(files) == 2, [len(f) for f in files]
    raw = [st for st, _ in _tb_scalars(files, "train/loss", purge=False)]
    twice = sorted({st for st in raw if raw.count(st) == 2})
    # the killed run's TensorBoard writer flushes behind metrics.jsonl (a SIGKILL loses its queue): the steps
    # logged twice are the first ones past the restored checkpoint, up to the last the killed run wrote
    assert twice and twice == list(range(restored + 1, restored + 1 + len(twice))), (restored, killed_last, twice)
    assert twice[-1] <= killed_last, (restored, killed_last, twice)
    shown = _tb_scalars(files, "train/loss")
    steps = [st for st, _ in shown]
    assert steps == list(range(1, 21)), ("TensorBoard shows", sorted({st for st in steps if steps.count(st) > 1}),
                                         "more than once; restored", restored)
    jsonl = {r["step"]: r["loss"] for r in T.read_metrics(wd)}
    for st, v in shown:
        assert v == pytest.approx(jsonl[st], rel=1e-6), (st, v, jsonl[st])


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
