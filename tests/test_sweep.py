"""Shape rules (idattn.configs.sizes), sweep files and the sweep runner (idattn.sweep).

The local runner is tested with a stand-in trainer (a tiny script given as --python) that writes the files
the real trainer writes (config.json, metrics.jsonl, checkpoint folders, best/, eval/validation-step<N>.json), so
that skipping finished runs, resuming failed ones and the states shown by `status` are checked without compiling
a model.
"""
from __future__ import annotations

import importlib.util
import io
import json
import os
import stat
import subprocess
import sys
from contextlib import redirect_stdout

import pytest

from idattn.configs import sizes as shapes
from idattn.configs import runs
from idattn.launch import sweep
from idattn.configs import base_config
from idattn.models.counting import count_params_closed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_SWEEP = os.path.join(REPO, "experiments", "sweeps", "cpu_isoflop.py")
PAPER_SWEEP = os.path.join(REPO, "experiments", "sweeps", "paper_sizes.py")
ISO_SWEEP = os.path.join(REPO, "experiments", "sweeps", "paper_isoflop.py")


# The paper's shapes (App. A.1 / Table 3: GPT-3's widths and depths, 32 heads of 64 at 1.3B; SwiGLU hidden
# (2/3)·4d rounded up to 128), written out here independently of the rules in idattn/configs/sizes.py.
PAPER_SHAPES = {
    "125m": dict(d_model=768, num_layers=12, num_heads=12, head_dim=64, ffn_dim=2048),
    "350m": dict(d_model=1024, num_layers=24, num_heads=16, head_dim=64, ffn_dim=2816),
    "760m": dict(d_model=1536, num_layers=24, num_heads=16, head_dim=96, ffn_dim=4096),
    "1.3b": dict(d_model=2048, num_layers=24, num_heads=32, head_dim=64, ffn_dim=5504),
}


# Paper Table 3, softmax column (exact).
TABLE3_SOFTMAX = {"125m": 134_105_856, "350m": 373_867_520, "760m": 777_856_512, "1.3b": 1_345_423_360}


@pytest.mark.parametrize("size", shapes.PAPER_SIZES)
def test_shape_rules_reproduce_the_paper_sizes(size):
    got = shapes.paper_shape(shapes.PAPER_WIDTHS[size])
    want = PAPER_SHAPES[size]
    assert {k: got[k] for k in want} == want, (size, got, want)
    c = base_config()
    c.model.update(got)
    c.model.mixer = "softmax"
    assert count_params_closed(c.model) == TABLE3_SOFTMAX[size]


def test_shape_rules_between_and_beyond():
    # documented formulas: L = round(d / aspect), H = d / d_h, f = ceil(8d/3 / 128) * 128
    assert shapes.paper_shape(896) == dict(d_model=896, num_layers=21, num_heads=14, head_dim=64, ffn_dim=2432,
                                           num_modes=64, vocab_size=32000)
    assert shapes.paper_shape(3072)["num_layers"] == 36 and shapes.paper_shape(3072)["num_heads"] == 48
    assert shapes.cpu_shape(96) == dict(d_model=96, num_layers=3, num_heads=6, head_dim=16, ffn_dim=256,
                                        num_modes=8, vocab_size=512)
    with pytest.raises(ValueError, match="multiple of the rule's head width d_h=96"):
        shapes.paper_shape(1280)
    assert shapes.size_name(shapes.cpu_shape(64)) == "d64L2"


def test_cpu_sweep_names_and_isoflop_budgets():
    configs = runs.load_sweep(CPU_SWEEP)
    names = [c.sweep.name for c in configs]
    assert len(configs) == 30 and len(set(names)) == 30
    assert names[6:9] == ["cpu-iso-softmax-d32L1-C3e10", "cpu-iso-interdomain-d32L1-C3e10",
                          "cpu-iso-softmax-d32L1-C6e10"]
    tps = 8 * 64
    for c in configs:
        n = shapes.non_embedding_params(c.model)
        assert c.sweep.n_params == n
        assert c.sweep.tokens % tps == 0
        # D = C / (6N) to within half a step
        assert abs(c.sweep.tokens - c.sweep.compute / (6 * n)) <= tps / 2 + 1e-6, c.sweep.name
        assert c.model.mixer == c.sweep.mixer
    mod = runs.load_sweep_module(CPU_SWEEP)
    one = mod.get_config(names[5])  # what `python -m idattn.train --config=<file>:<name>` trains
    assert one.to_dict() == configs[5].to_dict()
    with pytest.raises(ValueError, match="no run named"):
        mod.get_config("nope")


@pytest.fixture
def check_recorded(monkeypatch):
    """The trainer's check of every member recorded instead of run (a few seconds per sweep of 24): for the tests
    about what a sweep writes. The check itself runs on the paper sweep in
    test_slurm_dry_run_is_a_job_array_with_data_flags, and every launcher's in tests/test_launch.py."""
    seen = []

    def fake(sweep_file, configs, root, extra, per_run=None, *, dry_run):
        seen.append([c.sweep.name for c in configs])
        return 0
    monkeypatch.setattr(sweep, "check_members", fake)
    return seen


def _main(argv):
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = sweep.main(argv)
    return rc, buf.getvalue()


@pytest.fixture
def no_subprocess(monkeypatch):
    """A dry run starts no process but the trainer's check of every member (idattn/launch/check.py: it runs
    nothing, writes nothing)."""
    popen = subprocess.Popen

    def boom(*a, **k):
        raise AssertionError(f"a dry run started a process: {a}")

    def only_the_check(cmd, *a, **k):
        if "idattn.launch.check" in list(cmd):
            return popen(cmd, *a, **k)
        boom(cmd)
    monkeypatch.setattr(subprocess, "call", boom)
    monkeypatch.setattr(subprocess, "Popen", only_the_check)


def test_paper_sweeps_need_data_flags(tmp_path, no_subprocess, check_recorded):
    with pytest.raises(SystemExit, match="--data_path"):
        _main([PAPER_SWEEP, f"--root={tmp_path}", "--dry_run"])
    assert not os.listdir(tmp_path)  # nothing written before the refusal
    rc, out = _main([PAPER_SWEEP, f"--root={tmp_path}/r", "--dry_run", "--data_path=/data/fw"])
    assert rc == 0 and "--config.data.source=arrayrecord --config.data.path=/data/fw" in out
    assert not os.path.exists(f"{tmp_path}/r")
    rc, out = _main([PAPER_SWEEP, f"--root={tmp_path}/r", "--dry_run", "--set", "data.source=kjv"])
    assert rc == 0 and "--config.data.source=kjv" in out and "arrayrecord" not in out
    assert [len(names) for names in check_recorded] == [24, 24]  # every member checked, once per dry run
    # a config that leaves data.source unset (experiments/scaling.py's paper sizes) is refused the same way
    unset = runs.load_sweep(PAPER_SWEEP)[:1]
    unset[0].data.source = ""
    with pytest.raises(SystemExit, match="--data_path"):
        sweep.data_flags(unset, "")
    configs = runs.load_sweep(ISO_SWEEP)
    assert {c.sweep.size for c in configs} >= {"125m", "350m", "760m", "1.3b"}


def test_slurm_dry_run_is_a_job_array_with_data_flags(tmp_path, no_subprocess):
    rc, out = _main([PAPER_SWEEP, f"--root={tmp_path}", "--launcher=slurm", "--dry_run", "--data_path=/data/fw",
                     "--max_parallel=4", "--", "--nodes=4", "--gpus_per_node=8", "--partition=gpu"])
    assert rc == 0
    assert "#SBATCH --array=0-23%4" in out and "#SBATCH --nodes=4" in out
    assert 'RUN="${RUNS[$SLURM_ARRAY_TASK_ID]}"' in out
    line = [l for l in out.splitlines() if l.startswith("srun ")][0]
    assert '--config=experiments/sweeps/paper_sizes.py:"${RUN}"' in line or \
           f'--config={PAPER_SWEEP}:"${{RUN}}"' in line
    assert f'--workdir={tmp_path}/"${{RUN}}"' in line
    assert "--config.data.source=arrayrecord --config.data.path=/data/fw" in line
    runs = [l for l in out.splitlines() if l.startswith("RUNS=(")][0]
    assert runs.count("paper-") == 24 and "paper-interdomain-1.3b-D5.2e10" in runs


def test_slurm_array_expands_the_run_in_quoted_paths(tmp_path, no_subprocess, monkeypatch, check_recorded):
    """A root with a space and a ';' is single-quoted in the script; the array task's run still expands there (it
    used to stay a literal ${RUN} inside the quotes: every task in one folder)."""
    root = tmp_path / "my runs;x"
    rc, out = _main([PAPER_SWEEP, f"--root={root}", "--launcher=slurm", "--dry_run", "--data_path=/data/fw", "--",
                     "--nodes=1", "--gpus_per_node=8", "--partition=gpu"])
    assert rc == 0
    line = [l for l in out.splitlines() if l.startswith("srun ")][0].split(" || ")[0]
    monkeypatch.undo()  # the dry run is over: now let bash parse the line as the job would
    args = subprocess.run(["bash", "-c", 'RUN=paper-softmax-125m; eval "set -- ${0#srun }"; printf "%s\\n" "$@"',
                           line], capture_output=True, text=True, check=True).stdout.splitlines()
    assert f"--workdir={root}/paper-softmax-125m" in args, args
    assert any(a.endswith(":paper-softmax-125m") and a.startswith("--config=") for a in args), args


def test_slurm_submit_creates_the_log_folder_first(tmp_path, monkeypatch, fake_tools, check_recorded):
    """Submitting writes the array script and creates its #SBATCH --output folder before calling sbatch (an sbatch
    is on PATH: a missing one is refused first)."""
    calls = []

    def fake_call(cmd, *a, **k):
        text = open(cmd[1]).read()
        out = [ln for ln in text.splitlines() if ln.startswith("#SBATCH --output=")][0].split("=", 1)[1].strip("\"")
        calls.append((cmd, os.path.isdir(os.path.dirname(out)), out))
        return 0

    monkeypatch.setattr(subprocess, "call", fake_call)
    logs = tmp_path / "logs" / "sweep"
    rc, _ = _main([PAPER_SWEEP, f"--root={tmp_path}/r", "--launcher=slurm", "--data_path=/data/fw", "--",
                   f"--log_dir={logs}"])
    assert rc == 0 and len(calls) == 1 and len(check_recorded) == 1
    cmd, existed, out = calls[0]
    assert cmd == ["sbatch", f"{tmp_path}/r/sweep-array.sbatch"]
    assert existed and out.startswith(str(logs) + "/")


def test_tpu_dry_run_prints_per_run_commands(tmp_path, no_subprocess):
    rc, out = _main([PAPER_SWEEP, f"--root={tmp_path}", "--launcher=tpu", "--dry_run", "--data_path=/mnt/fw",
                     "--only=125m-D2.5", "--", "--zone=us-east5-a", "--type=v5p-64"])
    assert rc == 0
    assert out.count("# run paper-") == 2
    assert out.count("gcloud compute tpus queued-resources create") == 2
    trains = [l for l in out.splitlines() if l.startswith("gcloud") and "idattn.train" in l]
    assert len(trains) == 2
    assert all("--config.data.source=arrayrecord --config.data.path=/mnt/fw" in l for l in trains)
    assert "queued-resources delete" in out


STUB = r'''#!{python}
"""Stand-in for `python -m idattn.train`: writes the trainer's output files; fails when asked."""
import json, os, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
wd, name = args["workdir"], args["config"].rsplit(":", 1)[1]
os.makedirs(os.path.join(wd, "eval"), exist_ok=True)
with open(os.path.join(os.path.dirname(wd), "calls.txt"), "a") as f:
    f.write(name + "\n")
json.dump({{"train": {{"num_steps": 4, "batch_size": 1, "total_tokens": 4}}, "data": {{"seq_len": 1}}}},
          open(os.path.join(wd, "config.json"), "w"))
os.makedirs(os.path.join(wd, "checkpoints", "2"), exist_ok=True)  # committed checkpoints are step folders
if os.environ.get("STUB_FAIL") == name:
    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({{"step": 2, "loss": 3.5}}) + "\n")
    sys.exit(3)
with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({{"step": 4, "loss": 3.0}}) + "\n")
os.makedirs(os.path.join(wd, "checkpoints", "4"), exist_ok=True)
os.makedirs(os.path.join(wd, "best", "4"), exist_ok=True)
json.dump({{"step": 4, "val_loss": 2.9}}, open(os.path.join(wd, "best", "4", "meta.json"), "w"))
json.dump({{"schema": "idattn.eval/v1", "suite": "validation", "step": 4, "metrics": {{"loss": 2.9, "ppl": 18.2}}}},
          open(os.path.join(wd, "eval", "validation-step00000004.json"), "w"))
'''


def test_local_runner_skips_done_and_resumes_failed(tmp_path, monkeypatch):
    stub = tmp_path / "stub.py"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    root = tmp_path / "root"
    argv = [CPU_SWEEP, f"--root={root}", f"--python={stub}", "--only=d32L1-C3e10"]
    monkeypatch.setenv("STUB_FAIL", "cpu-iso-interdomain-d32L1-C3e10")
    rc, out = _main(argv)
    assert rc == 1 and "FAILED (exit 3)" in out
    rows = {r["name"]: r for r in sweep.status(str(root))}
    assert rows["cpu-iso-softmax-d32L1-C3e10"]["state"] == "done"
    assert rows["cpu-iso-softmax-d32L1-C3e10"]["val_loss"] == pytest.approx(2.9)
    assert rows["cpu-iso-interdomain-d32L1-C3e10"]["state"] == "failed"
    assert rows["cpu-iso-interdomain-d32L1-C3e10"]["step"] == 2
    assert rows["cpu-iso-softmax-d64L2-C3e10"]["state"] == "pending"  # in the manifest, not run (--only)
    monkeypatch.delenv("STUB_FAIL")
    rc, out = _main(argv)
    assert rc == 0 and "skip (done)  cpu-iso-softmax-d32L1-C3e10" in out and "resume" in out
    calls = (root / "calls.txt").read_text().split()
    assert calls == ["cpu-iso-softmax-d32L1-C3e10", "cpu-iso-interdomain-d32L1-C3e10",
                     "cpu-iso-interdomain-d32L1-C3e10"]
    rc, out = _main(["status", f"--root={root}"])
    assert rc == 0 and "2 done" in out and "28 pending" in out
    log = (root / "cpu-iso-softmax-d32L1-C3e10" / "train.log").read_text()
    assert "--config.data.source=kjv" in log  # the data flag is explicit on every command


def test_wsd_branches_plan_one_trunk_per_size_and_branch_points_it_keeps(tmp_path):
    """--wsd_branches: per (mixer, size) the largest budget is a WSD trunk that pins the branch points; each
    smaller budget S branches at S - D (D = round(0.2 S)) and decays over its last D steps."""
    from idattn.train import optim
    configs = runs.load_sweep(CPU_SWEEP)
    root = str(tmp_path / "root")
    ordered, flags = sweep.wsd_branch_plan(configs, root)
    assert sorted(c.sweep.name for c in ordered) == sorted(c.sweep.name for c in configs)
    tps = 8 * 64
    group = [c for c in ordered if c.sweep.mixer == "softmax" and c.sweep.size == "d32L1"]
    steps = [-(-c.sweep.tokens // tps) for c in group]
    assert steps == sorted(steps, reverse=True) and len(group) == 3  # the trunk (largest budget) first
    trunk = group[0].sweep.name
    points = []
    for c, n in zip(group[1:], steps[1:]):
        d = optim.decay_steps_of(c.train, n)
        assert d == round(0.2 * n)
        points.append(n - d)
        assert flags[c.sweep.name] == ["--config.train.schedule=wsd", f"--config.train.decay_steps={d}",
                                       f"--config.train.branch_from={os.path.join(root, trunk)}:{n - d}"]
    assert flags[trunk] == ["--config.train.schedule=wsd",
                            f"--config.train.checkpoint_steps=({','.join(map(str, sorted(points)))},)"]
    rc, out = _main([CPU_SWEEP, f"--root={root}", "--wsd_branches", "--dry_run", "--only=softmax-d32L1"])
    assert rc == 0 and f"branch_from={os.path.join(root, trunk)}:" in out
    with pytest.raises(SystemExit, match="local launcher"):
        sweep.main([CPU_SWEEP, f"--root={root}", "--wsd_branches", "--launcher=slurm", "--dry_run"])


def test_status_of_a_root_without_a_sweep_says_so(tmp_path, capsys):
    assert sweep.main(["status", f"--root={tmp_path / 'nothing'}"]) == 1
    assert "no sweep.json and no run folders" in capsys.readouterr().err


# The stand-in trainer, with the real one's lease rule: a workdir whose lease.json names a live process is refused
# (exit 1, as `python -m idattn.train` does); STUB_RACE=<run> makes it find the lease taken at its start (another
# trainer, here the test process, got there between the sweep's check and the launch).
LEASE_STUB = r'''#!{python}
import json, os, socket, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
wd, name = args["workdir"], args["config"].rsplit(":", 1)[1]
lease = os.path.join(wd, "lease.json")
if os.environ.get("STUB_RACE") == name:
    json.dump({{"host": socket.gethostname(), "pid": os.getppid(), "heartbeat": time.time(), "token": "race"}},
              open(lease, "w"))
if os.path.exists(lease):
    pid = json.load(open(lease))["pid"]
    try:
        os.kill(pid, 0)
        print(f"error: workdir {{wd}} is in use by another trainer: pid {{pid}}", file=sys.stderr)
        sys.exit(1)
    except ProcessLookupError:
        pass
'''


def test_a_run_another_live_trainer_holds_is_running_elsewhere_not_failed(tmp_path, monkeypatch):
    """Two sweeps on one root: the run the other one trains (its trainer holds the workdir lease: a live pid on
    this host, a fresh heartbeat) is reported running elsewhere, not started, not FAILED, exit 0; `status` says
    running, also where an older sweep had recorded it failed. The same when the lease is taken between the
    sweep's check and its trainer's start (the trainer's refusal is then not a failure)."""
    import socket
    import time

    stub = tmp_path / "stub.py"
    stub.write_text(LEASE_STUB.format(python=sys.executable) + STUB.split("\n", 1)[1].format())
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    root = tmp_path / "root"
    held, raced = root / "cpu-iso-softmax-d32L1-C3e10", root / "cpu-iso-interdomain-d32L1-C3e10"
    held.mkdir(parents=True)
    (held / "config.json").write_text(json.dumps({"train": {"num_steps": 4, "batch_size": 1, "total_tokens": 4},
                                                  "data": {"seq_len": 1}}))
    (held / "metrics.jsonl").write_text(json.dumps({"step": 2, "loss": 3.5}) + "\n")
    (held / "lease.json").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                                 "start_time": time.time(), "heartbeat": time.time(), "beat": 3,
                                                 "heartbeat_s": 30.0, "stale_s": 600.0, "token": "other-sweep"}))
    (held / "sweep_state.json").write_text(json.dumps({"state": "running", "pid": os.getpid()}))
    monkeypatch.setenv("STUB_RACE", raced.name)
    argv = [CPU_SWEEP, f"--root={root}", f"--python={stub}", "--only=d32L1-C3e10"]
    rc, out = _main(argv)
    assert rc == 0 and "FAILED" not in out, out
    assert f"running elsewhere {held.name}" in out, out
    assert "0 trained, 0 already done, 2 running elsewhere" in out, out
    assert not (root / "calls.txt").exists()  # the held run was not started; the raced one was refused at start
    assert json.loads((held / "sweep_state.json").read_text())["state"] == "running"  # the other sweep's record
    assert not (raced / "sweep_state.json").exists()
    rows = {r["name"]: r for r in sweep.status(str(root))}
    assert rows[held.name]["state"] == rows[raced.name]["state"] == "running"
    assert rows[held.name]["step"] == 2
    (held / "sweep_state.json").write_text(json.dumps({"state": "failed", "rc": 1}))  # an older sweep's verdict
    rc, out = _main(["status", f"--root={root}"])
    assert rc == 0 and "2 running" in out and "failed" not in out, out
    # the other trainers ended: the runs train here
    monkeypatch.delenv("STUB_RACE")
    (held / "lease.json").unlink()
    (raced / "lease.json").unlink()
    rc, out = _main(argv)
    assert rc == 0 and "2 trained" in out, out


# ------------------------------------------------------------------- issue 54: one check before every submission
FAKE_TOOL = "#!/bin/sh\ntouch \"{marker}\"\nexit 1\n"  # a fake sbatch / gcloud: records that it was called


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """sbatch and gcloud first on PATH; returns the folder where each writes `called-<name>` when run."""
    bin_dir, marks = tmp_path / "fake-bin", tmp_path / "marks"
    bin_dir.mkdir()
    marks.mkdir()
    for name in ("sbatch", "gcloud"):
        (bin_dir / name).write_text(FAKE_TOOL.format(marker=marks / f"called-{name}"))
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return marks


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "submit"])
@pytest.mark.parametrize("launcher", ["local", "slurm", "tpu"])
def test_sweep_checks_every_member_before_anything(tmp_path, fake_tools, capsys, launcher, dry_run):
    """Issue 54: the sweep runs the trainer's check on every member's final arguments before it writes, runs or
    submits anything, with each launcher, dry run or not: a misspelled key and a value of the wrong type are refused
    with the trainer's own line (key, value, reason); no trainer, sbatch or gcloud runs, the root stays unwritten."""
    stub = tmp_path / "stub.py"  # the local launcher's trainer: records every run it starts in <root>/calls.txt
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    root = tmp_path / "root"
    after = {"local": [], "slurm": ["--", "--nodes=1", f"--log_dir={tmp_path / 'logs'}"],
             "tpu": ["--", "--zone=z", "--wait_s=0"]}[launcher]
    for kv, reason in [("train.num_stepz=5", ["config.train has no key 'num_stepz'", "did you mean 'num_steps'"]),
                       ("train.num_steps=ten", ["--config.train.num_steps=ten: invalid literal for int()",
                                                "give config.train.num_steps an int"])]:
        rc, out = _main([CPU_SWEEP, f"--root={root}", f"--launcher={launcher}", f"--python={stub}",
                         "--only=d32L1-C3e10", "--set", kv, *(["--dry_run"] if dry_run else []), *after])
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert rc != 0 and out == "", (out, err)
        assert err and err[-1].startswith(("dry run" if dry_run else "check") + " refused (2 of 2 runs: "), err
        assert all(r in err[-1] for r in reason), err
        assert not root.exists() and not (tmp_path / "logs").exists()  # no manifest, script, state or log
        assert os.listdir(fake_tools) == []  # neither sbatch nor gcloud was called


def test_sweep_without_sbatch_is_one_line(tmp_path, monkeypatch, capsys):
    """A SLURM sweep with no sbatch on PATH: one line naming it (exit 127), no traceback, nothing written."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    root = tmp_path / "root"
    rc, out = _main([CPU_SWEEP, f"--root={root}", "--launcher=slurm", "--only=softmax-d32L1-C3e10", "--",
                     "--nodes=1", f"--log_dir={tmp_path / 'logs'}"])
    err = capsys.readouterr().err
    said = [ln for ln in err.splitlines() if "sbatch" in ln]
    assert rc == 127 and len(said) == 1 and said[0].startswith("error: sbatch not found on PATH: "), err
    assert not root.exists() and not (tmp_path / "logs").exists() and out == ""
