"""Faults an operator still met after the third trial (issue 53), injected and checked for what survives:

1. a clock that runs an hour ahead (or behind) never takes a live run over: a live, running pid on this host is
   conclusive; against another host's lease the trainer measures its clock against the filesystem and refuses in
   one line when it is off (ages are measured on the filesystem's clock); a reused pid is not a live holder;
2. "done" is durable: a best/ or final-checkpoint write that fails at the end is one line, the run is not reported
   done (`sweep status`, the sweep's skip rule and `load_params` agree on the step), and a rerun finishes it with
   the straight run's numbers;
3. the results command replaces its table and plots together or not at all; the sweep's state file too;
4. content, not names: a tokenizer file replaced at the same path is refused unless allowed (then recorded);
   (a data folder prepared again in place: tests/test_faults_data.py);
5. one line each: a full disk at the lease, a failing progress.json write, a checkpoint copied from another run
   (rejected, the run falls back and finishes exactly), a hand-edited config.json (the key named), a workdir moved
   mid-run (named as moved); the memory estimate counts XLA attention's T x T scores.
"""
import errno
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import time

import pytest

from idattn.rundir import layout
from idattn.rundir.layout import committed_steps
from idattn.train import lease as lease_lib
from idattn.train import metrics as metrics_lib
from tests import train_helpers as T

pytestmark = pytest.mark.filterwarnings("ignore")


def _lease(path, **rec):
    with open(path, "w") as f:
        json.dump(rec, f)
    return open(path).read()


def _shift_clock(monkeypatch, seconds):
    """This process's clock `seconds` ahead (negative: behind), as faketime does; file times stay the kernel's."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


# ------------------------------------------------------------------------------------------- 1: leases and clocks
def test_a_live_trainer_on_this_host_keeps_its_lease_whatever_the_clocks_say(tmp_path, monkeypatch):
    """The trial: a trainer whose clock ran an hour ahead took over a live run on the same host ("last renewed
    3616 s ago" while the holder had renewed 16 s before)."""
    holder = subprocess.Popen(["sleep", "60"])
    try:
        path = str(tmp_path / lease_lib.LEASE_FILE)
        before = _lease(path, host=socket.gethostname(), pid=holder.pid, start_time=time.time() - 60,
                        heartbeat=time.time() - 16, beat=3, heartbeat_s=30.0, stale_s=600.0, token="live")
        _shift_clock(monkeypatch, 3600)
        with pytest.raises(lease_lib.LeaseHeld, match=rf"in use by another trainer: host .* pid {holder.pid}") as e:
            lease_lib.Lease(str(tmp_path), heartbeat_s=30, stale_s=600).acquire()
        assert not isinstance(e.value, lease_lib.ClockSkew)
        assert open(path).read() == before and os.listdir(tmp_path) == [lease_lib.LEASE_FILE]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("skew", [3600, -3600], ids=["ahead", "behind"])
def test_a_skewed_clock_is_refused_before_it_judges_another_hosts_lease(tmp_path, monkeypatch, skew):
    path = str(tmp_path / lease_lib.LEASE_FILE)
    before = _lease(path, host="elsewhere", pid=1, start_time=time.time() - 60, heartbeat=time.time() - 16, beat=3,
                    heartbeat_s=0.2, stale_s=600.0, token="remote")
    _shift_clock(monkeypatch, skew)
    word = "ahead of" if skew > 0 else "behind"
    with pytest.raises(lease_lib.ClockSkew, match=rf"this host's clock is 3\d\d\d s {word} the filesystem's .*host "
                       r"elsewhere pid 1.*nothing was written\. Synchronise this host's clock") as e:
        lease_lib.Lease(str(tmp_path), heartbeat_s=30, stale_s=600).acquire()
    assert "\n" not in str(e.value)
    assert open(path).read() == before and os.listdir(tmp_path) == [lease_lib.LEASE_FILE]  # the probe is gone


def test_within_the_bound_a_lease_is_aged_on_the_filesystems_clock(tmp_path, monkeypatch):
    """A clock 30 s ahead (inside the bound) ages a dead host's lease by the filesystem's time: 700 s, not 730."""
    path = str(tmp_path / lease_lib.LEASE_FILE)
    old = time.time() - 700
    _lease(path, host="elsewhere", pid=1, heartbeat=old, beat=3, heartbeat_s=30.0, stale_s=600.0, token="dead")
    os.utime(path, (old, old))
    said = []
    _shift_clock(monkeypatch, 30)
    lease = lease_lib.Lease(str(tmp_path), heartbeat_s=60, stale_s=600, log=said.append).acquire()
    lease.release()
    assert len(said) == 1 and any(f"last renewed {a} s ago" in said[0] for a in (699, 700, 701)), said


def test_a_reused_pid_is_not_a_live_holder(tmp_path):
    """The lease's pid now belongs to another process (its start time differs from the recorded one): taken over
    at once (it read as "in use" for up to the holder's stale_s)."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        stat = lease_lib._proc_stat(other.pid)
        assert stat is not None  # /proc: this suite runs on Linux
        path = str(tmp_path / lease_lib.LEASE_FILE)
        _lease(path, host=socket.gethostname(), pid=other.pid, pid_start=stat[1] - 100, heartbeat=time.time(),
               beat=1, heartbeat_s=30.0, stale_s=600.0, token="dead-trainer")
        said = []
        lease = lease_lib.Lease(str(tmp_path), heartbeat_s=60, stale_s=600, log=said.append).acquire()
        lease.release()
        assert "the pid now belongs to another process" in said[0], said
    finally:
        other.kill()
        other.wait()


CLOCK_AHEAD = """
_real_time = time.time
time.time = lambda: _real_time() + 3600  # as `faketime -f '+1h'`: this process's clock only
"""


@pytest.mark.slow  # two trainers, one slowed down (~1 min)
def test_a_trainer_with_a_fast_clock_does_not_take_a_live_run(tmp_path, env, finished):
    wd = str(tmp_path / "live")
    a = subprocess.Popen(T.train_command(wd), cwd=T.REPO, env=dict(env, IDATTN_DEBUG_STEP_SLEEP="0.8"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while not committed_steps(wd):  # A is training and has renewed its lease
            assert a.poll() is None, a.communicate()
            assert time.time() - t0 < 240
            time.sleep(0.1)
        b = subprocess.run(T.runner_command(tmp_path, wd, CLOCK_AHEAD), cwd=T.REPO, env=env, capture_output=True,
                           text=True, timeout=240)
        assert a.poll() is None, "A ended before B started: the test proves nothing"
        out, err = a.communicate(timeout=300)
    finally:
        if a.poll() is None:
            a.kill()
    assert b.returncode == 1 and "Traceback" not in b.stderr, b.stderr[-3000:]
    assert f"in use by another trainer: host {socket.gethostname()} pid {a.pid}" in b.stderr.strip().splitlines()[-1]
    assert a.returncode == 0, err[-3000:]
    got = {r["step"]: r["loss"] for r in T.read_metrics(wd)}
    assert got == finished[1]  # the live run went on untouched: the straight run's losses


# ------------------------------------------------------------------------------------- 2: "done" means durable
FAIL_BEST_AT_20 = """
import errno
_real_save = ckpt.ocp.StandardCheckpointer.save
def _full(self, directory, *a, **k):
    if "/.20.tmp" in str(directory):  # best/ of the final step: a full disk, as tensorstore reports it
        os.makedirs(str(directory), exist_ok=True)
        open(os.path.join(str(directory), "half-written"), "w").write("x")
        raise ValueError("RESOURCE_EXHAUSTED: Error writing local file: No space left on device\\n" + "  at ...\\n" * 40)
    return _real_save(self, directory, *a, **k)
ckpt.ocp.StandardCheckpointer.save = _full
"""

FAIL_FINAL_CHECKPOINT = T.fail_save_at(20)


def _status(wd):
    from idattn.launch import sweep
    return sweep.run_status(wd)


def _loaded_step(wd):
    """The step `load_params(wd)` loads (the newest committed: what it verifies and returns)."""
    from idattn.rundir import loading
    loading.load_params(wd)
    return committed_steps(wd)[-1]


@pytest.mark.parametrize("what", ["best", pytest.param("final_checkpoint", marks=pytest.mark.slow)])
def test_a_failed_write_at_the_end_is_not_done_and_the_rerun_finishes(tmp_path, env, finished, what):
    """The trial: a full disk while best/ was written at the end let orbax's error through (190-337 lines), left
    best/.40.tmp, and `sweep status` said "done 40/40" (the sweep skipped the run forever) while load_params gave
    step-20 parameters. Now: one line, no half-written best/, not done, the same step everywhere, and the rerun
    finishes with the straight run's validation."""
    wd = str(tmp_path / what)
    ov = {"train.eval_every": 10}  # best/ at step 10 first, then the final one fails
    inject = FAIL_BEST_AT_20 if what == "best" else FAIL_FINAL_CHECKPOINT
    proc = subprocess.run(T.runner_command(tmp_path, wd, inject, ov), cwd=T.REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert not glob.glob(os.path.join(wd, "best", ".*tmp*"))
    st, done = _status(wd), layout.completion(wd)
    assert not done["done"] and st["state"] == "interrupted", (st, done)
    if what == "best":
        assert last.startswith("error: could not write best/ at step 20: ValueError: RESOURCE_EXHAUSTED") and \
            "best/ keeps step 10" in last and "rerun" in last, last
        assert committed_steps(wd)[-1] == 20 and layout.best_info(wd)["step"] == 10
        assert any("best/" in m for m in done["missing"]), done
    else:
        assert last.startswith("error: checkpoint save failed at step 20") and "checkpoints/15" in last, last
        assert committed_steps(wd)[-1] == 15
        assert not os.path.exists(os.path.join(wd, "eval", "validation-step00000020.json"))  # no result without it
    assert st["step"] == _loaded_step(wd) == committed_steps(wd)[-1]  # status and load_params agree
    rerun = T.run_train(wd, overrides=ov, env=env)
    assert "Traceback" not in rerun.stderr
    st, done = _status(wd), layout.completion(wd)
    assert done["done"] and st["state"] == "done" and st["step"] == 20 and layout.best_info(wd)["step"] == 20
    val = json.load(open(os.path.join(wd, "eval", "validation-step00000020.json")))
    ref = json.load(open(os.path.join(finished[0], "eval", "validation-step00000020.json")))
    assert val["metrics"] == ref["metrics"]  # the straight run's final validation
    assert {r["step"]: r["loss"] for r in T.read_metrics(wd)} == finished[1]


# ------------------------------------------------------------------------------------ 3: whole-or-nothing writes
def test_the_results_command_keeps_the_previous_table_and_plots_on_a_failed_write(tmp_path, finished, monkeypatch,
                                                                                capsys):
    """The trial: regenerating on a full disk truncated scaling.png (the earlier plot destroyed, table and plot
    no longer agreeing) with a 36-line traceback."""
    import matplotlib.figure

    from idattn.studies import results
    out = tmp_path / "results"
    assert results.main(["--runs", finished[0], "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"results.md", "extrapolation.png", "scaling.png", "recall.png"}
    real = matplotlib.figure.Figure.savefig

    def full(self, path, *a, **k):
        if "scaling" in str(path):
            with open(path, "wb") as f:
                f.write(b"\x89PNG half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, path, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    capsys.readouterr()
    assert results.main(["--runs", finished[0], "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "scaling" in err[0], err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # every file whole, no temporary left


def test_a_sweep_state_that_cannot_be_written_is_a_warning(tmp_path, monkeypatch, capsys):
    from idattn import atomic
    from idattn.launch import sweep

    def full(path, obj, **kw):
        raise atomic.WriteFailed(errno.ENOSPC, f"could not write {path}: OSError: No space left on device; the "
                                               f"previous file (if any) is unchanged")

    monkeypatch.setattr(atomic, "write_json", full)
    sweep._write_state(str(tmp_path / "run"), state="running", pid=os.getpid())
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: could not write") and "sweep goes on" in err[0], err


def test_atomic_writes_leave_the_previous_file_whole(tmp_path):
    from idattn import atomic
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.png")
    atomic.write_json(a, {"v": 1})
    atomic.write_bytes(b, b"old")
    with pytest.raises(atomic.WriteFailed, match=r"could not write .*b.png: OSError: No space left"):
        with atomic.Staged() as out:
            with open(out.path(a), "w") as f:
                f.write('{"v": 2}')
            with open(out.path(b), "wb") as f:
                f.write(b"ne")
                raise OSError(errno.ENOSPC, "No space left on device")
    assert json.load(open(a)) == {"v": 1} and open(b, "rb").read() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.png"]
    with atomic.Staged() as out:
        with open(out.path(a), "w") as f:
            f.write('{"v": 3}')
    assert json.load(open(a)) == {"v": 3} and sorted(os.listdir(tmp_path)) == ["a.json", "b.png"]


# ------------------------------------------------------------------------------------- 4 and 5: a stopped run
def _snapshot(wd):
    return {os.path.relpath(os.path.join(r, f), wd): open(os.path.join(r, f), "rb").read()
            for r, _, fs in os.walk(wd) for f in fs}


def _other_tokenizer(src: bytes) -> bytes:
    """A valid SentencePiece model with the same pieces and other scores: another file, same vocab_size."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    m = pb.ModelProto()
    m.ParseFromString(src)
    for p in m.pieces[300:]:
        p.score -= 1.0
    return m.SerializeToString()


def test_a_tokenizer_replaced_at_the_same_path_is_refused_unless_allowed(tmp_path, in_process):
    """The trial: only the path string was compared, so the steps after the checkpoint trained on other ids and
    the final validation was measured with the other tokenizer."""
    from idattn.data import tokenizer as tok_lib
    tok = tmp_path / "tok.model"
    tok.write_bytes(tok_lib.load_tokenizer("train:512").model_proto)
    cfg = lambda **kw: T.tiny_config(**{"data.tokenizer": str(tok), **kw})  # noqa: E731
    wd = str(tmp_path / "run")
    T.stop_at(in_process, wd, cfg())
    tok.write_bytes(_other_tokenizer(tok.read_bytes()))
    before = _snapshot(wd)
    with pytest.raises(in_process.TrainingError, match=r"refusing to resume .* at step 15: data.tokenizer=.*tok.model"
                       r"' is another file .*--config.train.allow_tokenizer_change=true") as e:
        in_process.run(cfg(), wd)
    assert "\n" not in str(e.value) and _snapshot(wd) == before  # nothing written
    done = in_process.run(cfg(**{"train.allow_tokenizer_change": True}), wd)
    assert done["status"] == "done" and committed_steps(wd)[-1] == 20
    hist = layout.read_identity(wd)["history"]
    assert [(h["what"], h["step"]) for h in hist] == [("tokenizer", 15)]
    assert hist[0]["new"]["sha256"] == tok_lib.load_tokenizer(str(tok)).identity()["sha256"]


def test_a_checkpoint_copied_from_another_run_is_rejected_and_the_run_finishes_exactly(tmp_path, in_process,
                                                                                      finished, monkeypatch, capsys):
    """The trial: a checkpoint copied in from another run read as "config.json edited?". Now it is named as
    another run's, moved aside, and the run falls back to its own step 15 and trains on to the straight run's
    losses. The run id is read before the shapes: a copy of another size is named the same way."""
    from idattn.train import checkpoint as ckpt
    wd = str(tmp_path / "run")
    T.stop_at(in_process, wd, T.tiny_config())
    shutil.copytree(os.path.join(finished[0], "checkpoints", "20"), os.path.join(wd, "checkpoints", "20"))
    real = ckpt.shape_mismatch
    monkeypatch.setattr(ckpt, "shape_mismatch", lambda m, step, a: "params['x']: saved (1,), now (2,)" if step == 20
                        else real(m, step, a))
    capsys.readouterr()
    done = in_process.run(T.tiny_config(), wd)
    out = capsys.readouterr().out
    assert "checkpoint 20 is not this run's: copied from another run" in out, out[-3000:]
    assert "restored step 15" in out and done["status"] == "done"
    assert len(glob.glob(os.path.join(wd, "checkpoints.rejected", "20.*.reason.txt"))) == 1
    got = {r["step"]: r["loss"] for r in T.read_metrics(wd)}
    assert got == finished[1]


def test_a_hand_edited_config_names_the_edit(tmp_path, in_process):
    """The trial: an edited learning rate in config.json was refused as "the LR schedule changes"."""
    wd = str(tmp_path / "run")
    T.stop_at(in_process, wd, T.tiny_config())
    path = os.path.join(wd, "config.json")
    cfg = json.load(open(path))
    lr = cfg["train"]["peak_lr"]
    cfg["train"]["peak_lr"] = lr / 3
    json.dump(cfg, open(path, "w"), indent=1)
    before = _snapshot(wd)
    with pytest.raises(in_process.TrainingError, match=rf"config.json was edited after the run wrote it "
                       rf"\(train.peak_lr: written {lr!r}, now {lr / 3!r}\)\. Restore") as e:
        in_process.run(T.tiny_config(), wd)
    assert "\n" not in str(e.value) and _snapshot(wd) == before


def test_a_full_disk_at_the_lease_and_a_failing_progress_write_are_one_line(tmp_path, in_process, monkeypatch):
    def no_space(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(lease_lib.Lease, "_create", no_space)
        with pytest.raises(in_process.TrainingError, match=r"cannot write the workdir lease in .*: OSError: No space "
                           r"left on device; nothing was written\. Free space") as e:
            in_process.run(T.tiny_config(), str(tmp_path / "full"))
    assert "\n" not in str(e.value) and os.listdir(tmp_path / "full") == []

    def read_only(workdir, step):
        raise PermissionError(errno.EROFS, "Read-only file system", os.path.join(workdir, "progress.json"))

    monkeypatch.setattr(layout, "write_progress", read_only)
    ro = str(tmp_path / "ro")
    with pytest.raises(in_process.TrainingError, match=r"could not write .*progress.json at step \d+: PermissionError: "
                       r".*Read-only file system.*last committed checkpoint: .*checkpoints/\d+\. Free space") as e:
        in_process.run(T.tiny_config(), ro)
    msg = str(e.value)
    assert "\n" not in msg
    # Which save first sees a committed checkpoint depends on when the background save of step 5 ends (CI found
    # both), so the line is checked against the disk: it names the newest committed checkpoint, older than the
    # step that stopped.
    stopped = int(re.search(r"at step (\d+):", msg).group(1))
    named = int(re.search(r"checkpoints/(\d+)\. Free", msg).group(1))
    assert named == layout.committed_steps(ro)[-1] < stopped, (msg, layout.committed_steps(ro))


def test_a_workdir_moved_mid_run_is_named_as_moved(tmp_path, in_process, finished):
    """The trial: a workdir moved mid-run stopped with "Another trainer took over" (nobody did)."""
    wd, moved = str(tmp_path / "run"), str(tmp_path / "run-moved")
    real = metrics_lib.MetricsWriter.write

    def move(self, s, *a, **k):
        if s == 12 and os.path.exists(wd):
            os.rename(wd, moved)
        return real(self, s, *a, **k)

    metrics_lib.MetricsWriter.write = move
    try:
        with pytest.raises(in_process.TrainingError) as e:
            in_process.run(T.tiny_config(), wd)
    finally:
        metrics_lib.MetricsWriter.write = real
    msg = str(e.value)
    assert "no longer exists (moved or deleted while the run trained)" in msg and "took over" not in msg, msg
    assert "--workdir=<its new path>" in msg
    # the lease moved with the folder; its holder is this test's own process, still alive (a CLI rerun finds the
    # stopped trainer's pid gone and takes it over)
    os.remove(os.path.join(moved, lease_lib.LEASE_FILE))
    done = in_process.run(T.tiny_config(), moved)  # resumed on its new path
    assert done["status"] == "done"
    assert {r["step"]: r["loss"] for r in T.read_metrics(moved)} == finished[1]


@pytest.mark.parametrize("mixer, impl, expect", [("softmax", "auto", True), ("softmax", "cudnn", False),
                                                 ("interdomain", "auto", False)])
def test_the_memory_estimate_counts_xla_attention_scores(in_process, mixer, impl, expect):
    """The trial: the estimate said 643 MiB for a Softmax run at T = 4096 on a CPU that was OOM-killed at 18.5 GB."""
    from idattn.train import sharding as shd
    cfg = T.tiny_config(**{"data.seq_len": 4096, "model.attn_impl": impl})
    if mixer != "softmax":
        from idattn import models
        models.apply_mixer_name(cfg.model, mixer)
    mesh = shd.make_mesh(cfg.mesh)
    est = in_process.hbm_estimate(10**6, cfg, mesh)
    heads, micro = int(cfg.model.num_heads), int(cfg.train.batch_size)
    closed = 3 * 4 * micro * 4096 * 4096 * heads  # float32 scores, probabilities, gradient: one layer at a time
    assert est["scores"] == (pytest.approx(closed) if expect else 0.0)
    assert est["total"] == pytest.approx(sum(est[k] for k in ("params", "opt_state", "grads", "activations",
                                                              "scores")))
