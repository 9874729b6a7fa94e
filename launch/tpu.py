#!/usr/bin/env python
"""Cloud TPU pod launcher (gcloud): create a TPU VM slice (directly or as a queued resource), copy this
repository to every worker, install it, run the trainer on all workers, delete the slice.

    python launch/tpu.py create  --name=idattn-v5p --zone=us-east5-a --type=v5p-64 [--queued] [--spot]
    python launch/tpu.py setup   --name=idattn-v5p --zone=us-east5-a
    python launch/tpu.py train   --name=idattn-v5p --zone=us-east5-a -- \
        --config=experiments/scaling.py:interdomain,1.3b --workdir=/mnt/runs/id-1.3b
    python launch/tpu.py status  --name=idattn-v5p --zone=us-east5-a [--queued]
    python launch/tpu.py delete  --name=idattn-v5p --zone=us-east5-a [--queued]

Add --dry_run to print the gcloud commands instead of running them. `train` runs `python -m idattn.train <args>`
on every worker with `--worker=all`; each worker is one JAX process and `jax.distributed.initialize()` finds the
slice's other hosts by itself (idattn.train.distributed detects TPU_WORKER_HOSTNAMES). Rerunning `train` with
the same arguments resumes from the latest checkpoint. The workdir must be a filesystem path that every worker
sees as the same folder: a bucket mounted with gcsfuse or a Filestore/NFS share (the trainer writes
metrics.jsonl and config.json with ordinary file I/O). Output goes to
<remote_dir>/train.log on each worker (`--foreground` streams it instead).
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys


def _base(args, *cmd) -> list[str]:
    out = ["gcloud", "compute", "tpus", *cmd]
    if args.project:
        out.append(f"--project={args.project}")
    out.append(f"--zone={args.zone}")
    return out


def ssh_all(args, command: str) -> list[str]:
    return _base(args, "tpu-vm", "ssh", args.name) + ["--worker=all", f"--command={command}"]


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
        return [
            ["tar", "czf", tarball, "--exclude=.git", "--exclude=__pycache__", "-C", args.local_dir, "."],
            _base(args, "tpu-vm", "scp", tarball, f"{args.name}:{tarball}") + ["--worker=all"],
            ssh_all(args, f"mkdir -p {args.remote_dir} && tar xzf {tarball} -C {args.remote_dir} && "
                          f"cd {args.remote_dir} && pip install -U 'jax[tpu]' && pip install -e ."),
        ]
    if a == "train":
        if not rest:
            raise SystemExit("train: pass the trainer's arguments after `--` (at least --config and --workdir)")
        train = f"cd {args.remote_dir} && python -m idattn.train {shlex.join(rest)}"
        if not args.foreground:
            train = f"{train} > {args.remote_dir}/train.log 2>&1"
        return [ssh_all(args, train)]
    if a == "status":
        if args.queued:
            return [_base(args, "queued-resources", "describe", args.name)]
        return [_base(args, "tpu-vm", "describe", args.name)]
    if a == "delete":
        if args.queued:
            return [_base(args, "queued-resources", "delete", args.name) + ["--force", "--quiet"]]
        return [_base(args, "tpu-vm", "delete", args.name) + ["--quiet"]]
    raise SystemExit(f"unknown action {a!r}")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = []
    if "--" in argv:
        k = argv.index("--")
        argv, rest = argv[:k], argv[k + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["create", "setup", "train", "status", "delete"])
    p.add_argument("--name", required=True, help="TPU VM / queued resource name")
    p.add_argument("--zone", required=True)
    p.add_argument("--project", default="")
    p.add_argument("--type", default="v5p-64", help="accelerator type, e.g. v4-32, v5p-64, v6e-256")
    p.add_argument("--version", default="v2-alpha-tpuv5", help="TPU VM runtime / software version")
    p.add_argument("--queued", action="store_true", help="use queued resources (create/status/delete)")
    p.add_argument("--spot", action="store_true")
    p.add_argument("--local_dir", default=".", help="repository to copy (setup)")
    p.add_argument("--remote_dir", default="~/idattn")
    p.add_argument("--foreground", action="store_true", help="train: stream output instead of train.log")
    p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    for c in commands(args, rest):
        if args.dry_run:
            print(shlex.join(c))
            continue
        rc = subprocess.call(c)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
