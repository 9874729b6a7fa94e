"""Faults an operator meets around a run (issue 33), injected through the trainer's entry points, and what survives
them (docs/training.md, "Faults and what survives them"):

1. a second trainer with a smaller train.lease_stale_s does not take a live run over (the holder's declared
   threshold judges its lease);
2. a trainer stopped (SIGSTOP) with a save in flight, taken over, then continued (SIGCONT) writes nothing more:
   the new owner's files are byte-identical before and after (slow);
3. no silent restart from step 0: a shape mismatch is a config error (nothing moved), and a workdir whose
   checkpoints were all rejected is refused, naming checkpoints.rejected/ and the command that restores one;
4. a run killed after its last checkpoint committed and before its final validation finishes both on the rerun;
5. a lease whose heartbeat is in the future expires `stale_s` after the lease file's last write;
6. a full disk: a lowered train.keep_last rotates before the save; a failing metrics write names the last
   committed checkpoint; the one-line error is the last line the CLI prints;
8. SIGINT saves like SIGTERM (exit 130); a second one aborts; train.checkpoint_minutes saves by wall time;
9. metrics.jsonl cut mid-line or deleted is restored from the checkpoint's copy;
and a hand-edited or cut config.json is refused naming the file and the key.
"""
import errno
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import pytest

from idattn.rundir import layout
from idattn.rundir.layout import committed_steps
from idattn.train import checkpoint as ckpt
from idattn.train import lease as lease_lib
from idattn.train import metrics as metrics_lib
from tests import train_helpers as T

pytestmark = pytest.mark.filterwarnings("ignore")


def _copy(finished, tmp_path, name="run"):
    wd = str(tmp_path / name)
    shutil.copytree(finished[0], wd)
    return wd


def _snapshot(wd, skip=(lease_lib.LEASE_FILE,)):
    """{relative path: bytes} of every file under `wd` (the tb/ event files included)."""
    out = {}
    for root, _, files in os.walk(wd):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), wd)
            if rel not in skip:
                with open(os.path.join(root, f), "rb") as fh:
                    out[rel] = fh.read()
    return out


_runner_cmd = T.runner_command


# ------------------------------------------------------------------------------------ 1: the holder's threshold
def test_a_taker_with_a_smaller_stale_threshold_does_not_take_a_live_run_over(tmp_path, in_process):
    """The holder (a live process on this host) declared 600 s and renewed 5 s ago; a trainer started with
    lease_stale_s = 1 judged it stale by its own threshold before (and both wrote): now it is refused."""
    wd = str(tmp_path / "held")
    os.makedirs(wd)
    holder = subprocess.Popen(["sleep", "120"])
    try:
        now = time.time()
        rec = {"host": socket.gethostname(), "pid": holder.pid, "start_time": now - 60, "heartbeat": now - 5,
               "beat": 7, "heartbeat_s": 1.0, "stale_s": 600.0, "token": "holder-token"}
        path = os.path.join(wd, lease_lib.LEASE_FILE)
        with open(path, "w") as f:
            json.dump(rec, f)
        os.utime(path, (now - 5, now - 5))
        before = open(path).read()
        with pytest.raises(in_process.TrainingError, match=rf"in use by another trainer: host .* pid {holder.pid}"):
            in_process.run(T.tiny_config(**{"train.lease_stale_s": 1.0, "train.lease_heartbeat_s": 0.2}), wd)
        assert open(path).read() == before
        assert sorted(os.listdir(wd)) == [lease_lib.LEASE_FILE]  # nothing else written
    finally:
        holder.kill()
        holder.wait()


# ----------------------------------------------------------------------------------- 5: a clock that runs ahead
@pytest.mark.parametrize("stale_s, file_age, taken", [(2.0, 3.0, True), (600.0, 0.0, False)])
def test_a_heartbeat_from_the_future_expires_by_the_lease_files_age(tmp_path, in_process, stale_s, file_age, taken):
    """A holder on another host whose clock runs an hour ahead: its lease is taken over once the lease file is
    older than the holder's declared stale_s (the documented bound; it used to block until that clock time +
    stale_s), and refused while the file is fresh."""
    wd = str(tmp_path / "future")
    os.makedirs(wd)
    now = time.time()
    path = os.path.join(wd, lease_lib.LEASE_FILE)
    with open(path, "w") as f:
        json.dump({"host": "elsewhere", "pid": 1, "start_time": now + 3000, "heartbeat": now + 3600, "beat": 3,
                   "heartbeat_s": 0.5, "stale_s": stale_s, "token": "ahead"}, f)
    os.utime(path, (now - file_age, now - file_age))
    if taken:
        summary = in_process.run(T.tiny_config(**{"train.num_steps": 5}), wd)
        assert summary["status"] == "done" and committed_steps(wd) == [5]
        assert not os.path.exists(path)  # released at the end
    else:
        with pytest.raises(in_process.TrainingError, match=r"host elsewhere pid 1 .*in the future"):
            in_process.run(T.tiny_config(**{"train.num_steps": 5}), wd)
        assert sorted(os.listdir(wd)) == [lease_lib.LEASE_FILE]


def test_stale_reason_watches_a_lease_whose_times_are_all_in_the_future(tmp_path):
    path = str(tmp_path / lease_lib.LEASE_FILE)
    now = time.time()
    rec = {"host": "elsewhere", "pid": 1, "heartbeat": now + 3600, "beat": 4, "heartbeat_s": 1.0, "stale_s": 2.0,
           "token": "t"}
    with open(path, "w") as f:
        json.dump(rec, f)
    os.utime(path, (now + 3600, now + 3600))
    watched = []
    assert lease_lib.stale_reason(path, rec, watch=lambda s: watched.append(s) or False) is None
    assert "not renewed in 2 s of watching" in lease_lib.stale_reason(path, rec, watch=lambda s: True)
    assert watched == [2.0]  # two of the holder's heartbeat periods


# ------------------------------------------------------------------------------ 2: a stopped holder is fenced out
SLOW_COMMIT = """
_made = ckpt.fenced_temporary_path_class if hasattr(ckpt, "fenced_temporary_path_class") else None
def _slow(cls):
    class Slow(cls):
        async def finalize(self):
            if self._final_path.name == "10":
                time.sleep(4.0)  # slow storage: the commit of step 10 is in flight
            return await super().finalize()
    return Slow
if _made is not None:
    ckpt.fenced_temporary_path_class = lambda fence, tag: _slow(_made(fence, tag))
else:  # the code before fencing: the same slow commit on orbax's own class
    from orbax.checkpoint._src.path import atomicity
    _real = atomicity.AtomicRenameTemporaryPath.finalize
    async def _fin(self):
        if self._final_path.name == "10":
            time.sleep(4.0)
        return await _real(self)
    atomicity.AtomicRenameTemporaryPath.finalize = _fin
"""


@pytest.mark.slow
def test_a_stopped_trainer_that_lost_its_lease_writes_nothing_when_continued(tmp_path, env):
    """A (heartbeat 0.2 s, stale after 2 s) is stopped while its commit of step 10 is in flight; B takes the
    lease over, resumes from step 5 and finishes; A is continued: it exits 1 saying it was taken over, and every
    file of B's (checkpoints, metrics, eval, best, tb, config) is byte-identical before and after."""
    wd = str(tmp_path / "taken")
    ov = {"train.lease_heartbeat_s": 0.2, "train.lease_stale_s": 2.0, "train.keep_last": 3}
    a = subprocess.Popen(_runner_cmd(tmp_path, wd, SLOW_COMMIT, ov), cwd=T.REPO,
                         env=dict(env, IDATTN_DEBUG_STEP_SLEEP="0.3"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while not glob.glob(os.path.join(wd, "checkpoints", "10.orbax-checkpoint-tmp*")):
            assert a.poll() is None, a.communicate()
            assert time.time() - t0 < 240
            time.sleep(0.05)
        time.sleep(0.5)
        a.send_signal(signal.SIGSTOP)
        time.sleep(3.0)  # past A's declared 2 s
        b = T.run_train(wd, overrides=ov, env=env)
        assert "taking over the workdir lease" in b.stdout + b.stderr
        assert "restored step 5" in b.stdout, b.stdout[-3000:]
        owner = _snapshot(wd)
        assert committed_steps(wd) == [10, 15, 20]
        a.send_signal(signal.SIGCONT)
        out, err = a.communicate(timeout=240)
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
            a.kill()
    assert a.returncode == 1, (out[-2000:], err[-3000:])
    last = err.strip().splitlines()[-1]
    assert "Another trainer took over" in last and "without writing" in last, err[-3000:]
    after = _snapshot(wd)
    assert sorted(after) == sorted(owner), set(after) ^ set(owner)
    assert all(after[k] == owner[k] for k in owner), [k for k in owner if after[k] != owner[k]]
    assert [r["step"] for r in T.read_metrics(wd)] == list(range(1, 21))


# --------------------------------------------------------------------------------- 3: no silent restart from 0
@pytest.mark.parametrize("recorded", [True, False], ids=["identity", "run-before-identity"])
def test_a_shape_mismatch_is_a_config_error_and_nothing_is_moved(tmp_path, finished, in_process, recorded):
    """The refusal's own advice after a hand-edited config.json (rerun with the saved d_model) used to move every
    checkpoint to checkpoints.rejected/ and let the next rerun train from step 1. With identity.json (the config as
    the trainer wrote it) the edit itself is named; a run from before it gets the shape mismatch."""
    wd = _copy(finished, tmp_path)
    if not recorded:
        os.remove(os.path.join(wd, layout.IDENTITY_FILE))
    path = os.path.join(wd, "config.json")
    cfg = json.load(open(path))
    cfg["model"]["d_model"] = 48
    json.dump(cfg, open(path, "w"), indent=1)
    before = _snapshot(wd)
    match = (r"config.json was edited after the run wrote it \(model.d_model: written 64, now 48\)" if recorded else
             r"other parameter shapes .*saved \(512, 64\), now \(512, 48\).*Nothing was moved")
    with pytest.raises(in_process.TrainingError, match=match):
        in_process.run(T.tiny_config(**{"model.d_model": 48}), wd)
    assert _snapshot(wd) == before and not os.path.exists(os.path.join(wd, layout.REJECTED_DIR))


def test_all_checkpoints_rejected_is_never_a_silent_restart(tmp_path, finished, in_process, monkeypatch):
    """Every checkpoint fails to read once (a transient read error): they are moved aside and the run stops;
    the next plain rerun is refused (it used to train from step 1 and truncate metrics.jsonl), naming the
    command that restores the newest; after that command the run resumes."""
    wd = _copy(finished, tmp_path)
    real = ckpt.restore
    monkeypatch.setattr(ckpt, "restore", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(in_process.TrainingError, match=r"no checkpoint .* verifies"):
        in_process.run(T.tiny_config(), wd)
    monkeypatch.setattr(ckpt, "restore", real)
    assert committed_steps(wd) == []
    metrics = open(os.path.join(wd, "metrics.jsonl")).read()
    with pytest.raises(in_process.TrainingError, match=r"refusing to train .* from step 0") as e:
        in_process.run(T.tiny_config(), wd)
    msg = str(e.value)
    assert "restart_from_scratch=true" in msg and layout.REJECTED_DIR in msg and "\n" not in msg
    assert open(os.path.join(wd, "metrics.jsonl")).read() == metrics  # not truncated
    mv = msg.split("to resume from the newest: ")[1].split(" and rerun")[0].split()
    assert mv[0] == "mv" and mv[2].endswith(os.path.join("checkpoints", "20")), mv
    os.replace(mv[1], mv[2])
    summary = in_process.run(T.tiny_config(), wd)
    assert summary["status"] == "already_done" and summary["step"] == 20
    # and the explicit flag starts over
    shutil.rmtree(os.path.join(wd, "checkpoints"))
    summary = in_process.run(T.tiny_config(**{"train.restart_from_scratch": True, "train.num_steps": 5}), wd)
    assert summary["status"] == "done" and committed_steps(wd) == [5]


# ---------------------------------------------------------------------------- 4: the final evaluation is owed
KILL_BEFORE_EVAL = """
_real_eval = trainer._Loop.evaluate
def _killer(self, step):
    if step == self.num_steps:
        self.mngr.wait_until_finished()  # the last checkpoint has committed
        os.kill(os.getpid(), signal.SIGKILL)
    return _real_eval(self, step)
trainer._Loop.evaluate = _killer
"""


@pytest.mark.slow  # the default suite's 10-minute budget (CI measured 17 s); CI's slow pass runs it
def test_a_run_killed_before_its_final_validation_finishes_it_on_the_rerun(tmp_path, env, finished):
    wd = str(tmp_path / "killed")
    proc = subprocess.run(_runner_cmd(tmp_path, wd, KILL_BEFORE_EVAL), cwd=T.REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert committed_steps(wd) == [10, 15, 20]
    assert not os.path.exists(os.path.join(wd, "eval")) and not os.path.exists(os.path.join(wd, "best"))
    rerun = T.run_train(wd, env=env)
    assert "before the final validation and best/: finishing that now" in rerun.stdout, rerun.stdout[-2000:]
    assert os.path.exists(os.path.join(wd, "eval")) and layout.best_info(wd)["step"] == 20
    val = json.load(open(glob.glob(os.path.join(wd, "eval", "validation-step*20.json"))[0]))
    ref = json.load(open(glob.glob(os.path.join(finished[0], "eval", "validation-step*20.json"))[0]))
    assert val["metrics"] == ref["metrics"]  # the straight run's final validation
    again = T.run_train(wd, env=env)
    assert "run already complete" in again.stdout


# -------------------------------------------------------------------------------------------- 6: a full disk
def test_a_lowered_keep_last_rotates_before_the_save_on_a_full_disk(tmp_path, in_process, monkeypatch):
    """The disk holds 3.6 checkpoints until another job takes one checkpoint's worth once step 15 is committed:
    the save of step 20 cannot fit even after deleting step 5 (which its rotation drops anyway), and the refusal
    advises lowering keep_last; the rerun with keep_last = 1 deletes 10 and 15 before saving 20 (it used to
    refuse again: the rotation ran only after the save that did not fit)."""
    wd = str(tmp_path / "full")
    cfg = T.tiny_config(**{"train.keep_last": 3, "train.async_checkpoint": False})  # the listing is the disk
    from idattn.train import sharding as shd
    from idattn.train.checkpoint import state_nbytes
    nbytes = state_nbytes(in_process.build_setup(cfg, shd.make_mesh(cfg.mesh)).abstract_state)
    filled = []

    def free(path):
        steps = committed_steps(wd)
        if 15 in steps:
            filled.append(1)
        return int((3.6 - len(steps) - (1 if filled else 0)) * nbytes)

    monkeypatch.setattr(ckpt, "disk_free_bytes", free)
    with pytest.raises(in_process.TrainingError, match=r"not enough disk space for checkpoint 20: .*lower "
                       r"train.keep_last, now 3") as e:
        in_process.run(cfg, wd)
    assert "checkpoints/15" in str(e.value) and committed_steps(wd) == [10, 15]
    summary = in_process.run(T.tiny_config(**{"train.keep_last": 1, "train.async_checkpoint": False}), wd)
    assert summary["status"] == "done" and committed_steps(wd) == [20]


def test_a_failing_metrics_write_names_the_last_committed_checkpoint(tmp_path, in_process, monkeypatch):
    real = metrics_lib.MetricsWriter.write

    def full(self, step, *a, **k):
        if step == 12:
            raise OSError(errno.ENOSPC, "No space left on device", self.path)
        return real(self, step, *a, **k)

    monkeypatch.setattr(metrics_lib.MetricsWriter, "write", full)
    wd = str(tmp_path / "metrics-full")
    with pytest.raises(in_process.TrainingError, match=r"could not write .*metrics.jsonl at step 12: OSError: "
                       r".*No space left.*last committed checkpoint: .*checkpoints/10") as e:
        in_process.run(T.tiny_config(), wd)
    assert "\n" not in str(e.value)


FAIL_SAVE_10 = T.fail_save_at(10)


def test_a_failed_save_ends_the_cli_with_one_line_last(tmp_path, env):
    wd = str(tmp_path / "save-fails")
    proc = subprocess.run(_runner_cmd(tmp_path, wd, FAIL_SAVE_10), cwd=T.REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]  # orbax's thread tracebacks buried it before
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: checkpoint save failed at step 1") and "No space left" in last, proc.stderr[-3000:]
    assert f"last committed checkpoint: {os.path.join(wd, 'checkpoints', '5')}" in last


# -------------------------------------------------------------------------------------------- 8: Ctrl-C
@pytest.mark.slow  # the default suite's 10-minute budget (CI measured 16 s); CI's slow pass runs it
def test_ctrl_c_saves_at_the_next_step_and_the_rerun_resumes(tmp_path, env, finished):
    wd = str(tmp_path / "ctrl-c")
    ov = {"train.checkpoint_every": 100}  # no periodic save before step 20: what is kept is what SIGINT saved
    p = subprocess.Popen(T.train_command(wd, overrides=ov), cwd=T.REPO, env=dict(env, IDATTN_DEBUG_STEP_SLEEP="0.3"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not (os.path.exists(os.path.join(wd, "metrics.jsonl")) and len(T.read_metrics(wd)) >= 3):
        assert p.poll() is None and time.time() - t0 < 240, p.communicate()
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "interrupt (SIGINT): saving step" in out, (out[-2000:], err[-2000:])
    steps = committed_steps(wd)
    assert len(steps) == 1 and 3 <= steps[0] < 20 and T.read_metrics(wd)[-1]["step"] == steps[0]
    rerun = T.run_train(wd, overrides=ov, env=env)
    assert f"restored step {steps[0]}" in rerun.stdout
    assert [r["step"] for r in T.read_metrics(wd)] == list(range(1, 21))


@pytest.mark.slow
def test_a_stalled_step_ends_the_run_with_its_stacks_and_the_rerun_resumes(tmp_path, env, finished):
    """The trial (2026-12-06): a training process deadlocked inside XLA's CPU runtime (two LAPACK solves waiting
    on its thread pool) and hung for an hour, silently. With train.stall_minutes a step that does not end in time
    prints every thread's Python stack and exits with status 1; what was committed survives and the rerun resumes
    from it, training the straight run's losses."""
    wd = str(tmp_path / "stalled")
    ov = {"train.stall_minutes": 0.2}  # 12 s: far above a tiny step, far below the test's patience
    proc = subprocess.run(T.train_command(wd, overrides=ov), cwd=T.REPO, capture_output=True, text=True,
                          env=dict(env, IDATTN_DEBUG_STALL_AT_STEP="12"), timeout=300)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Timeout (0:00:12)!" in proc.stderr and "trainer.py" in proc.stderr, proc.stderr[-3000:]
    assert "a step that takes over 0.2 min stops the run" in proc.stdout
    assert committed_steps(wd) == [5, 10]
    rerun = T.run_train(wd, env=env)
    assert "restored step 10" in rerun.stdout, rerun.stdout[-2000:]
    assert {r["step"]: r["loss"] for r in T.read_metrics(wd)} == finished[1]


def test_a_second_ctrl_c_aborts_at_once():
    from idattn.train.trainer import _Preemption
    p = _Preemption()
    p._handle(signal.SIGINT, None)
    assert p.flag.is_set() and p.interrupted and p.what() == "interrupt (SIGINT)"
    with pytest.raises(KeyboardInterrupt):
        p._handle(signal.SIGINT, None)
    q = _Preemption()
    q._handle(signal.SIGTERM, None)
    assert q.flag.is_set() and not q.interrupted


def test_checkpoint_minutes_saves_by_wall_time(tmp_path, in_process, monkeypatch):
    monkeypatch.setenv("IDATTN_DEBUG_STEP_SLEEP", "0.1")
    wd = str(tmp_path / "timed")
    cfg = T.tiny_config(**{"train.checkpoint_every": 1000, "train.checkpoint_minutes": 0.005, "train.keep_last": 3})
    in_process.run(cfg, wd)
    steps = committed_steps(wd)
    assert steps[-1] == 20 and len(steps) == 3 and steps[0] < steps[1] < 20, steps  # 0.3 s apart, not only the end


# ---------------------------------------------------------------------------------- 9: metrics without holes
@pytest.mark.parametrize("cut", ["mid_line", "deleted"])
def test_metrics_cut_or_deleted_are_restored_from_the_checkpoint(tmp_path, finished, in_process, cut):
    """Killed before checkpoint 20 committed (it is removed), metrics.jsonl cut in the middle of step 12's line
    (or deleted): the rerun resumes at 15 and the log holds every step 1..20 with the straight run's losses."""
    wd = _copy(finished, tmp_path)
    shutil.rmtree(os.path.join(wd, "checkpoints", "20"))
    shutil.rmtree(os.path.join(wd, "eval"))
    path = os.path.join(wd, "metrics.jsonl")
    if cut == "mid_line":
        lines = open(path).read().splitlines(keepends=True)
        open(path, "w").write("".join(lines[:11]) + lines[11][: len(lines[11]) // 2])
    else:
        os.remove(path)
    in_process.run(T.tiny_config(), wd)
    got = {r["step"]: r["loss"] for r in T.read_metrics(wd)}
    assert got == finished[1]


# ------------------------------------------------------------------------------------------- config.json
@pytest.mark.parametrize("damage", ["bad_value", "cut"])
def test_a_damaged_config_json_is_named_with_its_key(tmp_path, finished, in_process, damage):
    wd = _copy(finished, tmp_path)
    path = os.path.join(wd, "config.json")
    if damage == "bad_value":
        cfg = json.load(open(path))
        cfg["train"]["peak_lr"] = -1.0
        json.dump(cfg, open(path, "w"), indent=1)
    else:
        text = open(path).read()
        open(path, "w").write(text[: len(text) // 2])
    before = _snapshot(wd)
    with pytest.raises(in_process.TrainingError) as e:
        in_process.run(T.tiny_config(), wd)
    msg = str(e.value)
    assert path in msg and "\n" not in msg and "set --config" not in msg, msg
    assert ("config.train.peak_lr=-1.0" in msg) if damage == "bad_value" else ("not valid JSON" in msg)
    assert _snapshot(wd) == before


def test_a_run_saved_before_a_key_existed_resumes(tmp_path, finished, in_process):
    """A key a later version added (absent from the run's config.json) at its default is no change: the run
    resumes (a new model key refused every existing run's resume before)."""
    from idattn.configs import base_config
    wd = _copy(finished, tmp_path)
    path = os.path.join(wd, "config.json")
    cfg = json.load(open(path))
    base = layout.config_to_dict(base_config())
    dropped = [k for k in cfg["model"] if k in base["model"] and cfg["model"][k] == base["model"][k]][:2]
    assert dropped, "no model key at its default to drop"
    for k in dropped:
        del cfg["model"][k]
    del cfg["train"]["checkpoint_minutes"]
    json.dump(cfg, open(path, "w"), indent=1)
    assert in_process.check_resume_compatible(wd, T.tiny_config()) is not None  # no refusal
    cfg["model"][dropped[0]] = "something else"
    json.dump(cfg, open(path, "w"), indent=1)
    with pytest.raises(in_process.TrainingError, match=rf"model.{dropped[0]}: saved 'something else'"):
        in_process.check_resume_compatible(wd, T.tiny_config())
