#!/usr/bin/env python
"""Cloud TPU pod launcher (gcloud): create a TPU VM slice (directly or as a queued resource), ship this
repository's tracked files to every worker and install them, train detached on every worker, watch, stop, delete.

    python launch/tpu.py create  --name=idattn-v5p --zone=us-east5-a --type=v5p-64 [--queued] [--spot]
    python launch/tpu.py setup   --name=idattn-v5p --zone=us-east5-a
    python launch/tpu.py train   --name=idattn-v5p --zone=us-east5-a -- \
        --config=experiments/scaling.py:interdomain,1.3b --workdir=/mnt/runs/id-1.3b \
        --config.data.source=arrayrecord --config.data.path=/mnt/data/fineweb-edu
    python launch/tpu.py status  --name=idattn-v5p --zone=us-east5-a [--queued]   # slice + trainer per worker
    python launch/tpu.py logs    --name=idattn-v5p --zone=us-east5-a [--worker=0|all] [--lines=50] [--follow]
    python launch/tpu.py stop    --name=idattn-v5p --zone=us-east5-a     # SIGTERM: the trainer saves and exits
    python launch/tpu.py delete  --name=idattn-v5p --zone=us-east5-a [--queued]

Add --dry_run to print the gcloud commands instead of running them. `train`, dry run or not, first checks the
trainer's arguments here with its `--check_only` (idattn/launch/check.py): a bad key or value is refused with the
trainer's line before any gcloud command runs; without `gcloud` on PATH the launcher says so in one line.
`launch/tpu.py` is a checkout's path; from an installed package the same program is `python -m idattn.launch.tpu`
(setup ships a checkout: --local_dir), and a `--config=experiments/<file>.py` names the packaged recipe
(idattn/configs) wherever no such file exists.

create --queued returns once the request is queued, long before the slice exists; `setup` on a slice that is not
ACTIVE fails on ssh. With --wait_s=N (default 3600; 0: do not wait) create polls the queued resource's state every
--poll_s seconds until ACTIVE, and stops with the state and the describe command when it is FAILED or SUSPENDED
or when N seconds pass (rerunning `create` on an existing request fails in gcloud: use `status --queued`).

setup: `git archive HEAD` of --local_dir (tracked, committed files only: never a virtual environment, run
folders or uncommitted edits — commit first; a dirty tree is reported), copied to every worker, unpacked into
--remote_dir, and installed with `pip install -e ".[tpu]"` (jax[tpu] and libtpu pinned to the repository's jax)
into a virtual environment --venv made with --python. TPU VM images (Ubuntu 22.04, e.g. runtime
v2-alpha-tpuv5 / v2-alpha-tpuv6e) ship Python 3.10; idattn needs Python >= 3.11, so setup installs python3.11
from the Ubuntu archive (`apt-get install python3.11 python3.11-venv`) when --python is missing.

train: on every worker (`--worker=all`), `setsid nohup <venv>/bin/python -m idattn.train <args>` detached from
the SSH session (a dropped connection does not stop it), output in <remote_dir>/logs/train-<hostname>.log and
its pid in <remote_dir>/logs/train-<hostname>.pid. Each worker is one JAX process; `jax.distributed.initialize()`
finds the slice's other hosts by itself (idattn.train.distributed detects TPU_WORKER_HOSTNAMES). Rerunning
`train` with the same arguments resumes from the latest checkpoint. `--foreground` runs it attached instead
(streams the output through `tee` into the same log; returns when training ends, with the trainer's exit status
under `set -o pipefail` — what a script that runs several trainings in turn wants).
Every path (--remote_dir, --venv, --python) is shell-quoted in the remote commands; a leading `~/` is kept
unquoted so that the worker's shell expands it.
The workdir must be a filesystem path that every worker sees as the same folder: a bucket mounted with gcsfuse or
a Filestore/NFS share (the trainer writes metrics.jsonl and config.json with ordinary file I/O).
"""
from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time

from idattn.launch import check_trainer_args, is_git_checkout
from idattn.launch.check import call_tool, require_tools


def _base(args, *cmd) -> list[str]:
    out = ["gcloud", "compute", "tpus", *cmd]
    if args.project:
        out.append(f"--project={args.project}")
    out.append(f"--zone={args.zone}")
    return out


def ssh(args, command: str, worker: str = "all") -> list[str]:
    return _base(args, "tpu-vm", "ssh", args.name) + [f"--worker={worker}", f"--command={command}"]


def ssh_all(args, command: str) -> list[str]:
    return ssh(args, command, "all")


def q(path: str) -> str:
    """`path` as one word of the remote shell command: shell-quoted, except that a leading `~/` stays unquoted
    so that the worker's shell still expands it to the home folder."""
    m = re.match(r"~[A-Za-z0-9._-]*(?=/|$)", path)
    if m:
        rest = path[m.end():]
        return m.group(0) + ("/" + shlex.quote(rest[1:]) if rest[1:] else rest)
    return shlex.quote(path)


def _py(args) -> str:
    return q(f"{args.venv}/bin/python")


def _log(args) -> str:
    return f"{q(args.remote_dir + '/logs')}/train-$(hostname)"


def archive_command(args, tarball: str) -> list[str]:
    return ["git", "-C", args.local_dir, "archive", "--format=tar.gz", f"--output={tarball}", "HEAD"]


def commands(args, rest: list[str]) -> list[list[str]]:
    a = args.action
    if a == "create":
        if args.queued:
            c = _base(args, "queued-resources", "create", args.name) + [
                f"--node-id={args.name}", f"--accelerator-type={args.type}", f"--runtime-version={args.version}"]
        else:
            c = _base(args, "tpu-vm", "create", args.name) + [f"--accelerator-type={args.type}",
                                                             f"--version={args.version}"]
        if args.spot:
            c.append("--spot")
        return [c]
    if a == "setup":
        tarball = f"/tmp/{args.name}-idattn.tgz"
        py, rd, tb = q(args.python), q(args.remote_dir), q(tarball)
        get_py = (f"(command -v {py} >/dev/null || (sudo apt-get update -q && sudo apt-get install -y -q {py} "
                  f"{q(args.python + '-venv')}))")
        return [
            archive_command(args, tarball),
            _base(args, "tpu-vm", "scp", tarball, f"{args.name}:{tarball}") + ["--worker=all"],
            ssh_all(args, f"mkdir -p {rd} && tar xzf {tb} -C {rd} && {get_py} && "
                          f"{py} -m venv {q(args.venv)} && {_py(args)} -m pip install -q -U pip && "
                          f"cd {rd} && {_py(args)} -m pip install -e \".[tpu]\""),
        ]
    if a == "train":
        if not rest:
            raise SystemExit("train: pass the trainer's arguments after `--` (at least --config and --workdir)")
        run = f"{_py(args)} -m idattn.train {shlex.join(rest)}"
        pre = f"cd {q(args.remote_dir)} && mkdir -p logs && "
        if args.foreground:
            # pipefail: the command's status is the trainer's, not tee's (a sweep must not delete a failed run's
            # slice as if it had finished)
            return [ssh_all(args, "set -o pipefail; " + pre + f"{run} 2>&1 | tee {_log(args)}.log")]
        return [ssh_all(args, pre + f"setsid nohup {run} > {_log(args)}.log 2>&1 < /dev/null & "
                              f"echo $! > {_log(args)}.pid && echo \"$(hostname): training, pid $(cat {_log(args)}"
                              f".pid), log {_log(args)}.log\"")]
    if a == "status":
        describe = (_base(args, "queued-resources", "describe", args.name) if args.queued
                    else _base(args, "tpu-vm", "describe", args.name))
        check = (f"p=$(cat {_log(args)}.pid 2>/dev/null); if [ -n \"$p\" ] && kill -0 \"$p\" 2>/dev/null; "
                 f"then echo \"$(hostname): running (pid $p)\"; else echo \"$(hostname): not running\"; fi; "
                 f"tail -n 1 {_log(args)}.log 2>/dev/null || true")
        return [describe, ssh_all(args, check)]
    if a == "logs":
        tail = f"tail -n {int(args.lines)}" + (" -f" if args.follow else "")
        return [ssh(args, f"{tail} {_log(args)}.log", args.worker)]
    if a == "stop":
        return [ssh_all(args, f"p=$(cat {_log(args)}.pid 2>/dev/null) && kill -TERM \"$p\" && "
                              f"echo \"$(hostname): sent SIGTERM to $p (the trainer saves and exits)\" || "
                              f"echo \"$(hostname): no trainer running\"")]
    if a == "delete":
        if args.queued:
            return [_base(args, "queued-resources", "delete", args.name) + ["--force", "--quiet"]]
        return [_base(args, "tpu-vm", "delete", args.name) + ["--quiet"]]
    raise SystemExit(f"unknown action {a!r}")


QUEUED_DONE, QUEUED_BAD = "ACTIVE", ("FAILED", "SUSPENDED", "SUSPENDING")


def queued_state_command(args) -> list[str]:
    return _base(args, "queued-resources", "describe", args.name) + ["--format=value(state.state)"]


def wait_active(args, sleep=None, clock=None) -> int:
    """Poll the queued resource until ACTIVE (0); 1 with one line naming the state when it failed or timed out."""
    sleep, clock = sleep or time.sleep, clock or time.monotonic
    t0, last = clock(), None
    cmd = queued_state_command(args)
    while True:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        state = proc.stdout.strip() or f"unknown (gcloud exit {proc.returncode}: {proc.stderr.strip()[-200:]})"
        if state != last:
            print(f"{args.name}: {state} after {clock() - t0:.0f} s", flush=True)
            last = state
        if state == QUEUED_DONE:
            return 0
        if state in QUEUED_BAD:
            print(f"{args.name}: the queued resource is {state}; see `{shlex.join(cmd[:-1])}`", file=sys.stderr)
            return 1
        if clock() - t0 >= args.wait_s:
            print(f"{args.name}: still {state} after --wait_s={args.wait_s:g} s; rerun `status --queued` later "
                  f"and `setup` once it is ACTIVE", file=sys.stderr)
            return 1
        sleep(args.poll_s)


def _dirty(local_dir: str) -> str:
    try:
        return subprocess.run(["git", "-C", local_dir, "status", "--porcelain", "--untracked-files=no"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = []
    if "--" in argv:
        k = argv.index("--")
        argv, rest = argv[:k], argv[k + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["create", "setup", "train", "status", "logs", "stop", "delete"])
    p.add_argument("--name", required=True, help="TPU VM / queued resource name")
    p.add_argument("--zone", required=True)
    p.add_argument("--project", default="")
    p.add_argument("--type", default="v5p-64", help="accelerator type, e.g. v4-32, v5p-64, v6e-256")
    p.add_argument("--version", default="v2-alpha-tpuv5", help="TPU VM runtime / software version")
    p.add_argument("--queued", action="store_true", help="use queued resources (create/status/delete)")
    p.add_argument("--spot", action="store_true")
    p.add_argument("--wait_s", type=float, default=3600.0,
                   help="create --queued: wait up to this long for the slice to be ACTIVE (0: return at once)")
    p.add_argument("--poll_s", type=float, default=30.0, help="create --queued: seconds between state checks")
    p.add_argument("--local_dir", default=".", help="git checkout whose HEAD is shipped (setup)")
    p.add_argument("--remote_dir", default="~/idattn")
    p.add_argument("--venv", default="~/idattn-venv", help="virtual environment on the workers (setup, train)")
    p.add_argument("--python", default="python3.11", help="interpreter that makes --venv (>= 3.11; setup)")
    p.add_argument("--foreground", action="store_true", help="train: attached, streaming the output, until it ends")
    p.add_argument("--worker", default="0", help="logs: worker index or 'all'")
    p.add_argument("--lines", type=int, default=50, help="logs: last lines to show")
    p.add_argument("--follow", action="store_true", help="logs: keep following (tail -f)")
    p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--no_check", action="store_true", help="train: run (or print) without first checking the "
                   "trainer's arguments here (for callers that checked them, e.g. idattn.sweep)")
    args = p.parse_args(argv)
    if args.action == "train" and rest and not args.no_check:
        # dry run or not: fails here as the real run would, before any gcloud command runs
        rc = check_trainer_args(rest, dry_run=args.dry_run)
        if rc:
            return rc
    if args.action == "setup" and not is_git_checkout(args.local_dir):
        print(f"error: --local_dir={args.local_dir!r} is not a git checkout; setup ships `git archive HEAD` of one "
              "(clone the repository, or pass --local_dir=<checkout>)", file=sys.stderr)
        return 2
    if args.action == "setup":
        dirty = _dirty(args.local_dir)
        if dirty:
            print(f"note: {args.local_dir} has uncommitted changes; setup ships HEAD only (git archive):\n{dirty}",
                  file=sys.stderr)
    cmds = commands(args, rest)
    if not args.dry_run:
        rc = require_tools([c[0] for c in cmds])  # gcloud (and git for setup): one line naming a missing one
        if rc:
            return rc
    for c in cmds:
        if args.dry_run:
            print(shlex.join(c))
            continue
        rc = call_tool(c)
        if rc:
            return rc
    if args.action == "create" and args.queued and args.wait_s > 0:
        if args.dry_run:
            print(f"# then, every {args.poll_s:g} s for up to {args.wait_s:g} s until ACTIVE: "
                  f"{shlex.join(queued_state_command(args))}")
            return 0
        return wait_active(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
