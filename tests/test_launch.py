"""Launchers in dry-run mode (the commands they would run) and the multi-process start-up logic."""
import os
import shlex
import subprocess
import sys

import pytest

from idattn.train import distributed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a dry run checks these with the trainer (--check_only) before printing anything: a valid config (the tiny size
# keeps the check's parameter count fast), a workdir and data path that exist only on the cluster
TRAIN = ["--config=experiments/scaling.py:interdomain,tiny", "--workdir=/shared/runs/a b",
         "--config.train.batch_size=256", "--config.data.source=arrayrecord", "--config.data.path=/shared/data"]


def _run(script, *args):
    p = subprocess.run([sys.executable, os.path.join(REPO, "launch", script), *args], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_local_dry_run():
    out = _run("local.py", "--num_processes=3", "--port=4567", "--devices_per_process=2", "--dry_run", "--",
               "-m", "idattn.train", *TRAIN).strip().splitlines()
    assert len(out) == 3
    for i, line in enumerate(out):
        words = shlex.split(line)
        env = dict(w.split("=", 1) for w in words if "=" in w and w.split("=", 1)[0].isupper())
        assert env["IDATTN_COORDINATOR_ADDRESS"] == "localhost:4567"
        assert env["IDATTN_NUM_PROCESSES"] == "3" and env["IDATTN_PROCESS_ID"] == str(i)
        assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
        assert words[-len(TRAIN) - 2:] == ["-m", "idattn.train", *TRAIN]  # argument with a space survives


def test_tpu_dry_run_commands():
    create, wait = _run("tpu.py", "create", "--name=pod", "--zone=us-east5-a", "--type=v5p-128", "--queued",
                        "--spot", "--project=p", "--dry_run").strip().splitlines()
    create = shlex.split(create)
    assert wait.startswith("# then, every 30 s for up to 3600 s until ACTIVE: gcloud compute tpus queued-resources "
                           "describe pod") and "--format=value(state.state)" in wait
    assert create[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "pod"]
    assert {"--node-id=pod", "--accelerator-type=v5p-128", "--spot", "--zone=us-east5-a", "--project=p"} <= set(create)
    direct = shlex.split(_run("tpu.py", "create", "--name=pod", "--zone=z", "--dry_run"))
    assert direct[3:6] == ["tpu-vm", "create", "pod"]
    setup = _run("tpu.py", "setup", "--name=pod", "--zone=z", "--dry_run").strip().splitlines()
    assert len(setup) == 3
    # tracked files only: git archive of HEAD (never .venv, run folders or untracked files)
    assert shlex.split(setup[0])[:2] == ["git", "-C"] and "archive" in setup[0] and "--output=/tmp/pod-idattn.tgz" in setup[0]
    assert all("--worker=all" in l for l in setup[1:]) and 'pip install -e ".[tpu]"' in setup[2]
    assert "python3.11 -m venv ~/idattn-venv" in setup[2]
    assert "tpu-vm scp /tmp/pod-idattn.tgz pod:/tmp/pod-idattn.tgz" in setup[1]
    train = shlex.split(_run("tpu.py", "train", "--name=pod", "--zone=z", "--dry_run", "--", *TRAIN))
    assert train[3:6] == ["tpu-vm", "ssh", "pod"] and "--worker=all" in train
    remote = [w for w in train if w.startswith("--command=")][0][len("--command="):]
    detached = remote.split("&&", 2)[2]
    assert detached.strip().startswith("setsid nohup")  # survives a dropped SSH connection
    inner = shlex.split(detached.split(">", 1)[0])[2:]
    assert inner == ["~/idattn-venv/bin/python", "-m", "idattn.train", *TRAIN]
    assert "logs/train-$(hostname).log" in detached and "< /dev/null &" in detached
    # the train command runs in bash on the worker: it must parse
    assert subprocess.run(["bash", "-n", "-c", remote]).returncode == 0
    fg = shlex.split(_run("tpu.py", "train", "--name=pod", "--zone=z", "--foreground", "--dry_run", "--", *TRAIN))
    assert "setsid" not in " ".join(fg) and "tee" in " ".join(fg)
    status = _run("tpu.py", "status", "--name=pod", "--zone=z", "--dry_run").strip().splitlines()
    assert "tpu-vm describe pod" in status[0] and "kill -0" in status[1] and "--worker=all" in status[1]
    logs = shlex.split(_run("tpu.py", "logs", "--name=pod", "--zone=z", "--worker=3", "--lines=7", "--dry_run"))
    assert "--worker=3" in logs and any(w.startswith("--command=tail -n 7") for w in logs)
    stop = _run("tpu.py", "stop", "--name=pod", "--zone=z", "--dry_run")
    assert "kill -TERM" in stop and "--worker=all" in stop
    for line in status[1:] + [stop]:
        cmd = [w for w in shlex.split(line) if w.startswith("--command=")][0][len("--command="):]
        assert subprocess.run(["bash", "-n", "-c", cmd]).returncode == 0
    delete = shlex.split(_run("tpu.py", "delete", "--name=pod", "--zone=z", "--queued", "--dry_run"))
    assert delete[3:6] == ["queued-resources", "delete", "pod"] and "--force" in delete


@pytest.mark.parametrize("launcher", ["tpu", "slurm", "local"])
def test_dry_runs_check_the_config_like_the_real_run(launcher):
    """A misspelled key fails the dry run on this machine, with the trainer's own one line and no command printed;
    a correct config prints the check's summary, then the commands."""
    pre = {"tpu": ["train", "--name=pod", "--zone=z"], "slurm": ["--nodes=1"], "local": ["--num_processes=1"]}
    cmd = (["-m", "idattn.train"] if launcher == "local" else [])
    bad = [a.replace("data.source", "data.sorce") for a in TRAIN]
    p = subprocess.run([sys.executable, os.path.join(REPO, "launch", f"{launcher}.py"), *pre[launcher], "--dry_run",
                        "--", *cmd, *bad], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and p.stdout.strip() == "", (p.stdout, p.stderr)
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert err[-1].startswith("dry run refused: ") and "no key 'sorce'" in err[-1] and "data.source" in err[-1], err
    p = subprocess.run([sys.executable, os.path.join(REPO, "launch", f"{launcher}.py"), *pre[launcher], "--dry_run",
                        "--", *cmd, *TRAIN], capture_output=True, text=True, timeout=120)
    said = [ln for ln in p.stderr.splitlines() if ln.startswith("dry run")]
    assert p.returncode == 0 and said[0].startswith("dry run: config OK: interdomain (interdomain)"), p.stderr
    assert "data arrayrecord /shared/data" in said[0] and "idattn.train" in p.stdout  # stdout: the commands only


def test_tpu_setup_dry_run_refuses_a_folder_that_is_not_a_checkout(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(REPO, "launch", "tpu.py"), "setup", "--name=pod", "--zone=z",
                        "--dry_run", f"--local_dir={tmp_path}"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == "" and "is not a git checkout" in p.stderr, (p.stdout, p.stderr)


def test_slurm_dry_run_script(tmp_path):
    out = _run("slurm.py", "--nodes=4", "--gpus_per_node=8", "--partition=gpu", "--dry_run", "--", *TRAIN)
    script = out.split("# submit with")[0]
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks=32", "#SBATCH --ntasks-per-node=8",
                 "#SBATCH --gpus-per-task=1", "#SBATCH --partition=gpu", "#SBATCH --signal=TERM@120",
                 "#SBATCH --open-mode=append",  # a requeued job appends to its log instead of truncating it
                 "export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"):  # --setup may set it
        assert line in script, line
    srun = [l for l in script.splitlines() if l.startswith("srun")][0]
    words = shlex.split(srun.split("||")[0])
    assert words[words.index("idattn.train") + 1:] == ["--distributed=on", *TRAIN]
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script
    out_line = [l for l in script.splitlines() if l.startswith("#SBATCH --output=")][0]
    assert out_line.startswith("#SBATCH --output=\"/") and "/slurm-logs/" in out_line  # absolute: cwd-independent
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    per_node = _run("slurm.py", "--nodes=2", "--mode=per_node", "--dry_run", "--", *TRAIN)
    assert "#SBATCH --ntasks-per-node=1" in per_node and "--gpus-per-task" not in per_node
    assert "#SBATCH --ntasks=2\n" in per_node
    # the trainer learns the mode (idattn/train/distributed.py): one GPU per task, or all of the node's
    assert "export IDATTN_LOCAL_DEVICES=one\n" in script and "export IDATTN_LOCAL_DEVICES=all\n" in per_node


def test_slurm_modules_and_setup_lines(tmp_path):
    """--module / --setup (repeatable) become `module load` and verbatim shell lines on the nodes, in order,
    after `cd --repo` and before the venv is activated; the script still parses."""
    out = _run("slurm.py", "--repo=/shared/my repo", "--venv=/shared/venv", "--module=cuda/12.4", "--module=nccl 2.21",
               "--setup=export NCCL_SOCKET_IFNAME=ib0", "--setup=ulimit -n 65536", "--python=/opt/my py/bin/python",
               "--dry_run", "--", *TRAIN)
    script = out.split("# submit with")[0]
    lines = script.splitlines()
    want = ["cd '/shared/my repo'", "module load cuda/12.4", "module load 'nccl 2.21'",
            "export NCCL_SOCKET_IFNAME=ib0", "ulimit -n 65536", "source /shared/venv/bin/activate"]
    k = lines.index(want[0])
    assert lines[k:k + len(want)] == want
    assert "srun --kill-on-bad-exit=1 '/opt/my py/bin/python' -m idattn.train" in script
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


@pytest.fixture
def fake_init(monkeypatch):
    calls = []
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(distributed.jax.config, "update", lambda *a, **k: None)
    for k in ("IDATTN_COORDINATOR_ADDRESS", "IDATTN_NUM_PROCESSES", "IDATTN_PROCESS_ID", "SLURM_NTASKS",
              "TPU_WORKER_HOSTNAMES", "IDATTN_HEARTBEAT_TIMEOUT_S", "IDATTN_SHUTDOWN_TIMEOUT_S"):
        monkeypatch.delenv(k, raising=False)
    return calls


def test_distributed_initialize_sources(fake_init, monkeypatch):
    assert distributed.initialize("auto") is False and fake_init == []  # single process
    assert distributed.initialize("auto", "h:1", 2, 1) is True
    timeouts = dict(heartbeat_timeout_seconds=100, shutdown_timeout_seconds=60)  # bounded: a dead peer stops us
    assert fake_init[-1] == dict(coordinator_address="h:1", num_processes=2, process_id=1, local_device_ids=None,
                                 **timeouts)
    monkeypatch.setenv("IDATTN_COORDINATOR_ADDRESS", "localhost:9")
    monkeypatch.setenv("IDATTN_NUM_PROCESSES", "4")
    monkeypatch.setenv("IDATTN_PROCESS_ID", "3")
    distributed.initialize("auto")
    assert fake_init[-1]["coordinator_address"] == "localhost:9" and fake_init[-1]["process_id"] == 3
    for k in ("IDATTN_COORDINATOR_ADDRESS", "IDATTN_NUM_PROCESSES", "IDATTN_PROCESS_ID"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("SLURM_NTASKS", "16")  # SLURM: jax reads the cluster itself
    monkeypatch.setenv("IDATTN_HEARTBEAT_TIMEOUT_S", "10")
    assert distributed.initialize("auto") is True
    assert fake_init[-1] == dict(timeouts, heartbeat_timeout_seconds=10)
    assert distributed.initialize("off") is False and len(fake_init) == 3
    with pytest.raises(ValueError, match="needs num_processes and process_id"):
        distributed.initialize("on", "h:1", None, None)


def test_paper_size_without_data_flags_is_refused_before_any_write(tmp_path):
    """experiments/scaling.py leaves data.source unset for every size but tiny: a 125M run without data flags
    stops with the flags to add, before the workdir exists; an explicit source passes this check."""
    import importlib.util
    from idattn.train.trainer import TrainingError, check_data_choice, run

    spec = importlib.util.spec_from_file_location("_scaling", os.path.join(REPO, "experiments", "scaling.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = mod.get_config("interdomain,125m")
    wd = tmp_path / "run"
    with pytest.raises(TrainingError, match=r"--config\.data\.source=arrayrecord --config\.data\.path=.*"
                                            r"--config\.data\.source=kjv"):
        run(cfg, str(wd))
    assert not wd.exists()
    cfg.data.source = "arrayrecord"
    with pytest.raises(TrainingError, match="--config.data.path"):
        check_data_choice(cfg)
    cfg.data.path = "/data/x"
    check_data_choice(cfg)
    cfg.data.source = "kjv"
    check_data_choice(cfg)
    assert mod.get_config("interdomain,tiny").data.source == "kjv"  # the CPU-sized config keeps its corpus


FAKE_GCLOUD = """#!/bin/sh
# stands in for gcloud: create succeeds; describe prints the next state of $STATES (one per call)
case "$*" in
  *"queued-resources create"*) echo created; exit 0;;
  *"queued-resources describe"*)
    n=$(cat "$COUNTER" 2>/dev/null || echo 0); echo $((n + 1)) > "$COUNTER"
    echo "$STATES" | tr ' ' '\\n' | sed -n "$((n + 1))p"; exit 0;;
esac
exit 3
"""


@pytest.mark.parametrize("states,rc,said", [
    ("WAITING_FOR_RESOURCES WAITING_FOR_RESOURCES PROVISIONING ACTIVE", 0, "pod: ACTIVE after"),
    ("WAITING_FOR_RESOURCES FAILED", 1, "the queued resource is FAILED"),
])
def test_tpu_create_queued_waits_until_active(tmp_path, states, rc, said):
    """create --queued polls the state until ACTIVE, and stops with the state when the request fails."""
    gcloud = tmp_path / "bin" / "gcloud"
    gcloud.parent.mkdir()
    gcloud.write_text(FAKE_GCLOUD)
    gcloud.chmod(0o755)
    env = dict(os.environ, PATH=f"{gcloud.parent}{os.pathsep}{os.environ['PATH']}", STATES=states,
               COUNTER=str(tmp_path / "n"))
    p = subprocess.run([sys.executable, os.path.join(REPO, "launch", "tpu.py"), "create", "--name=pod", "--zone=z",
                        "--queued", "--poll_s=0", "--wait_s=60"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == rc, p.stdout + p.stderr
    assert said in p.stdout + p.stderr
    assert int((tmp_path / "n").read_text()) == len(states.split())  # polled until the last state, no further
    assert "pod: WAITING_FOR_RESOURCES after" in p.stdout and p.stdout.count("WAITING_FOR_RESOURCES") == 1


def test_cuda_extras():
    """`cuda12` brings the CUDA libraries (the plugin's with-cuda extra) at jax's pin and keeps the nvcc wheel;
    `cuda12-local` is the plugin alone, for clusters that load their own CUDA."""
    import setuptools
    seen = {}
    old = setuptools.setup
    setuptools.setup = lambda **kw: seen.update(kw)
    try:
        src = open(os.path.join(REPO, "setup.py")).read()
        exec(compile(src, "setup.py", "exec"), {"__name__": "__main__"})
    finally:
        setuptools.setup = old
    extras = seen["extras_require"]
    assert "jax[cuda12]>=0.10.2" in extras["cuda12"]  # jax's own extra: the plugin[with-cuda] at the installed jax
    assert any(r.startswith("nvidia-cuda-nvcc-cu12") for r in extras["cuda12"])
    assert extras["cuda12-local"] == ["jax[cuda12-local]>=0.10.2"]
    assert not any("with-cuda" in r for r in extras["test"])  # deviceless compile: no runtime libraries


def _remote(line: str) -> str:
    return [w for w in shlex.split(line) if w.startswith("--command=")][0][len("--command="):]


FAKE_PY = """#!/bin/bash
# stands in for the worker's python3.11 / the venv's python: records its arguments and working folder
echo "$PWD|$*" >> "$CALLS"
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
exit "${FAKE_RC:-0}"
"""


def test_tpu_remote_paths_are_quoted(tmp_path):
    """--remote_dir, --venv and --python reach the worker's shell as single words: paths with a space and a `;`
    run the setup in the right folders and nothing after the `;` executes."""
    odd = tmp_path / "a b;touch PWNED;x"
    remote, venv, py = odd / "repo", odd / "venv", odd / "py thon3.11"
    odd.mkdir()
    py.write_text(FAKE_PY)
    py.chmod(0o755)
    name = f"quoting-{os.getpid()}"
    tarball = f"/tmp/{name}-idattn.tgz"
    subprocess.run(["tar", "czf", tarball, "-C", REPO, "setup.py"], check=True)
    try:
        setup = _run("tpu.py", "setup", f"--name={name}", "--zone=z", f"--remote_dir={remote}", f"--venv={venv}",
                     f"--python={py}", "--dry_run").strip().splitlines()
        calls = tmp_path / "calls"
        p = subprocess.run(["bash", "-c", _remote(setup[2])], cwd=tmp_path, capture_output=True, text=True,
                           env=dict(os.environ, CALLS=str(calls)), timeout=60)
    finally:
        os.remove(tarball)
    assert p.returncode == 0, p.stderr
    assert (remote / "setup.py").exists()  # unpacked where asked
    log = calls.read_text().splitlines()
    assert log[0] == f"{tmp_path}|-m venv {venv}" and log[-1] == f"{remote}|-m pip install -e .[tpu]"
    assert not list(tmp_path.rglob("PWNED"))
    train = _run("tpu.py", "train", "--name=pod", "--zone=z", f"--remote_dir={remote}", f"--venv={venv}",
                 "--dry_run", "--", *TRAIN)
    assert subprocess.run(["bash", "-n", "-c", _remote(train)]).returncode == 0
    assert shlex.quote(f"{venv}/bin/python") + " -m idattn.train" in _remote(train)  # one word on the worker
    home = _run("tpu.py", "setup", "--name=pod", "--zone=z", "--dry_run")  # the default ~ still expands
    assert "mkdir -p ~/idattn &&" in home and "-m venv ~/idattn-venv" in home


@pytest.mark.parametrize("rc", [0, 3])
def test_tpu_foreground_returns_the_trainers_status(tmp_path, rc):
    """`train --foreground` pipes through tee; the remote command's status is still the trainer's (pipefail):
    a failed training is not reported as success (the sweep would go on to delete the slice)."""
    remote, venv = tmp_path / "remote", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_PY)
    (venv / "bin" / "python").chmod(0o755)
    remote.mkdir()
    fg = _run("tpu.py", "train", "--name=pod", "--zone=z", "--foreground", f"--remote_dir={remote}",
              f"--venv={venv}", "--dry_run", "--", *TRAIN)
    p = subprocess.run(["bash", "-c", _remote(fg)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, CALLS=str(tmp_path / "calls"), FAKE_RC=str(rc)))
    assert p.returncode == rc, p.stderr
    assert (tmp_path / "calls").read_text().strip() == f"{remote}|-m idattn.train {' '.join(TRAIN)}"
    assert len(list((remote / "logs").glob("train-*.log"))) == 1  # tee still wrote the log


# ------------------------------------------------------------------- issue 54: one check before every submission
# a fake scheduler / interpreter first on PATH: records that it was called (a marker file) and fails
FAKE_TOOL = """#!/bin/sh
touch "{marker}"
exit 1
"""
# the local launcher's --python: the check (`-m idattn.launch.check`) runs the real interpreter; any other start
# (a trainer process) is recorded
FAKE_PYTHON = """#!/bin/sh
case "$*" in *idattn.launch.check*) exec "{python}" "$@";; esac
touch "{marker}"
exec "{python}" "$@"
"""
# a misspelled key and a value of the wrong type, each with the trainer's own reason
BAD = {"typo": ("--config.train.num_stepz=5", ["config.train has no key 'num_stepz'", "did you mean 'num_steps'"]),
       "type": ("--config.train.num_steps=ten", ["--config.train.num_steps=ten: invalid literal for int()",
                                                 "give config.train.num_steps an int"])}


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """sbatch, gcloud and a python first on PATH (inherited by the launchers' subprocesses); returns the folder
    where each writes `called-<name>` when run."""
    bin_dir, marks = tmp_path / "fake-bin", tmp_path / "marks"
    bin_dir.mkdir()
    marks.mkdir()
    for name in ("sbatch", "gcloud"):
        (bin_dir / name).write_text(FAKE_TOOL.format(marker=marks / f"called-{name}"))
    (bin_dir / "python-fake").write_text(FAKE_PYTHON.format(python=sys.executable, marker=marks / "called-python"))
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return marks


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "submit"])
@pytest.mark.parametrize("launcher", ["local", "slurm", "tpu"])
def test_every_submission_is_checked_first(tmp_path, fake_tools, launcher, dry_run):
    """Issue 54: every launcher, dry run or not, runs the trainer's check on the final arguments before it writes a
    script or runs anything: a misspelled key and a value of the wrong type are refused with the trainer's own line
    (key, value, reason, fix); no sbatch / gcloud / trainer process is started, no script written."""
    logs = tmp_path / "slurm-logs"
    pre = {"local": ["--num_processes=2", f"--python={fake_tools.parent / 'fake-bin' / 'python-fake'}"],
           "slurm": ["--nodes=1", f"--log_dir={logs}"], "tpu": ["train", "--name=pod", "--zone=z"]}[launcher]
    cmd = ["-m", "idattn.train"] if launcher == "local" else []
    for flag, reason in BAD.values():
        p = subprocess.run([sys.executable, os.path.join(REPO, "launch", f"{launcher}.py"), *pre,
                            *(["--dry_run"] if dry_run else []), "--", *cmd, *TRAIN, flag],
                           capture_output=True, text=True, timeout=120)
        err = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode != 0 and p.stdout.strip() == "", (p.stdout, p.stderr)
        assert err and err[-1].startswith("dry run refused: error: " if dry_run else "check refused: error: "), err
        assert all(r in err[-1] for r in reason), err
        assert "Traceback" not in p.stderr
        assert sorted(os.listdir(fake_tools)) == [], "a scheduler or trainer process was started"
        assert not logs.exists()  # no sbatch script written


@pytest.mark.parametrize("launcher", ["slurm", "tpu"])
def test_a_missing_scheduler_binary_is_one_line(tmp_path, launcher):
    """Without sbatch / gcloud on PATH a submission is one line naming the binary and what to install, exit 127:
    no traceback, no script written."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    logs = tmp_path / "slurm-logs"
    argv = ({"slurm": ["--nodes=1", f"--log_dir={logs}", "--", *TRAIN]}.get(launcher)
            or ["create", "--name=pod", "--zone=z", "--queued"])
    p = subprocess.run([sys.executable, os.path.join(REPO, "launch", f"{launcher}.py"), *argv], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PATH=str(empty)))
    tool = {"slurm": "sbatch", "tpu": "gcloud"}[launcher]
    said = [ln for ln in p.stderr.splitlines() if tool in ln]
    assert p.returncode == 127 and "Traceback" not in p.stderr, p.stderr
    assert len(said) == 1 and said[0].startswith(f"error: {tool} not found on PATH: "), p.stderr
    assert ("SLURM" if tool == "sbatch" else "Google Cloud CLI") in said[0]
    assert not logs.exists() and p.stdout.strip() == "", p.stdout
