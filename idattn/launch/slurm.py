#!/usr/bin/env python
"""SLURM launcher for GPU clusters: writes an sbatch script and submits it.

    python launch/slurm.py --nodes=4 --gpus_per_node=8 --partition=gpu --time=48:00:00 \
        --repo=/shared/idattn --venv=/shared/idattn/.venv -- \
        --config=experiments/scaling.py:interdomain,1.3b --workdir=/shared/runs/id-1.3b \
        --config.data.source=arrayrecord --config.data.path=/shared/data/fineweb-edu
    python launch/slurm.py ... --dry_run        # print the script and the sbatch command only

`launch/slurm.py` is a checkout's path; from an installed package the same program is `python -m
idattn.launch.slurm`, and `--config=experiments/<file>.py` names the packaged recipe (idattn/configs).
Modes: --mode=per_gpu (default) runs one process per GPU (`--ntasks-per-node=G --gpus-per-task=1`);
--mode=per_node runs one process per node that sees all its G GPUs. In both, `srun` starts the processes and
`python -m idattn.train --distributed=on` calls `jax.distributed.initialize()`, which reads the coordinator,
process count and process id from the SLURM environment (SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID,
SLURM_LOCALID). The script exports IDATTN_LOCAL_DEVICES=one (per_gpu) or all (per_node), from which
idattn/train/distributed.py passes each process its GPUs (`local_device_ids`; jax's own SLURM default gives
every task one device numbered by its local id, wrong in both modes) and refuses a layout that cannot work.

Environment on the nodes: `--module=X` (repeatable) adds `module load X` lines (e.g. a cluster's CUDA / NCCL
modules, needed with the `cuda12-local` extra), `--setup=LINE` (repeatable) adds shell lines (e.g.
`export NCCL_SOCKET_IFNAME=ib0`), both after `cd --repo` and before `source --venv`/bin/activate. With the
`cuda12` extra the CUDA libraries come from pip and no module is needed. `--signal=TERM@120` makes SLURM send SIGTERM 120 s before the time limit; the trainer saves a checkpoint and
exits 143, and the script then requeues the job (`scontrol requeue`), which resumes where it stopped (the same
command in the same workdir resumes). `--requeue` also requeues jobs preempted by the scheduler.

Before the script is written or printed, the trainer's arguments are checked here with its `--check_only`
(idattn/launch/check.py): a bad key or value is refused with the trainer's line, nothing written or submitted;
without `sbatch` on PATH the launcher says so in one line (before writing the script).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile

from idattn.launch import check_trainer_args
from idattn.launch.check import call_tool, require_tools

TEMPLATE = """#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks={ntasks}
#SBATCH --ntasks-per-node={tasks_per_node}
#SBATCH --gpus-per-node={gpus_per_node}
{gpus_per_task}#SBATCH --cpus-per-task={cpus_per_task}
#SBATCH --time={time}
#SBATCH --output="{log_dir}/%x-%j.out"
#SBATCH --open-mode=append
#SBATCH --signal=TERM@120
#SBATCH --requeue
{extra_sbatch}
set -euo pipefail
{setup}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${{XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}}
# GPUs per process for idattn/train/distributed.py (jax's SLURM default would be one, numbered by SLURM_LOCALID)
export IDATTN_LOCAL_DEVICES={local_devices}
# a dead task: srun --kill-on-bad-exit stops the others; jax.distributed's heartbeat bounds any collective wait
export IDATTN_HEARTBEAT_TIMEOUT_S=${{IDATTN_HEARTBEAT_TIMEOUT_S:-60}}
echo "job $SLURM_JOB_ID: $SLURM_NNODES nodes x $SLURM_NTASKS_PER_NODE tasks on $SLURM_JOB_NODELIST"
rc=0
srun --kill-on-bad-exit=1 {python} -m idattn.train --distributed=on {train_args} || rc=$?
if [ "$rc" -eq 143 ]; then  # SIGTERM before the time limit / preemption: the trainer saved; continue later
  echo "saved on SIGTERM; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
exit "$rc"
"""


def log_dir_of(args) -> str:
    """--log_dir as an absolute path (relative ones are inside --repo): SLURM opens the --output file before the
    script starts, in a folder that must already exist, so `main` creates it before submitting."""
    return os.path.join(os.path.abspath(args.repo), args.log_dir) if not os.path.isabs(args.log_dir) else args.log_dir


def render(args, train_args: list[str]) -> str:
    per_gpu = args.mode == "per_gpu"
    extra = []
    if args.partition:
        extra.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        extra.append(f"#SBATCH --account={args.account}")
    for s in args.sbatch:
        extra.append(f"#SBATCH {s}")
    setup = f"cd {shlex.quote(os.path.abspath(args.repo))}"
    log_dir = log_dir_of(args)
    for m in args.module:
        setup += f"\nmodule load {shlex.quote(m)}"
    for line in args.setup:  # the user's own shell line, verbatim
        setup += f"\n{line}"
    if args.venv:
        setup += f"\nsource {shlex.quote(os.path.join(args.venv, 'bin', 'activate'))}"
    return TEMPLATE.format(
        job_name=args.job_name, nodes=args.nodes, tasks_per_node=args.gpus_per_node if per_gpu else 1,
        ntasks=args.nodes * (args.gpus_per_node if per_gpu else 1),  # with --gpus-per-task, newer SLURM wants -n
        gpus_per_node=args.gpus_per_node, gpus_per_task="#SBATCH --gpus-per-task=1\n" if per_gpu else "",
        cpus_per_task=args.cpus_per_task or (8 if per_gpu else 8 * args.gpus_per_node), time=args.time, log_dir=log_dir, extra_sbatch="\n".join(extra),
        setup=setup, python=shlex.quote(args.python), train_args=shlex.join(train_args),
        local_devices="one" if per_gpu else "all")


def parse(argv) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's options and the trainer's arguments (after `--`), refused here (usage, exit 2) when wrong."""
    argv = list(argv)
    rest = []
    if "--" in argv:
        k = argv.index("--")
        argv, rest = argv[:k], argv[k + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus_per_node", type=int, default=8)
    p.add_argument("--mode", choices=["per_gpu", "per_node"], default="per_gpu")
    p.add_argument("--cpus_per_task", type=int, default=0,
                   help="CPUs per task (default: 8 per GPU, i.e. 8 in per_gpu and 8 x gpus_per_node in per_node)")
    p.add_argument("--time", default="24:00:00")
    p.add_argument("--partition", default="")
    p.add_argument("--account", default="")
    p.add_argument("--job_name", default="idattn")
    p.add_argument("--log_dir", default="slurm-logs", help="job output folder (relative: inside --repo); created")
    p.add_argument("--repo", default=".", help="repository folder on the shared filesystem")
    p.add_argument("--venv", default="", help="virtual environment to activate on the nodes")
    p.add_argument("--python", default="python")
    p.add_argument("--sbatch", action="append", default=[], help="extra #SBATCH line (repeatable)")
    p.add_argument("--module", action="append", default=[],
                   help="environment module to load on the nodes, `module load X` (repeatable)")
    p.add_argument("--setup", action="append", default=[],
                   help="shell line run on the nodes before training, verbatim (repeatable)")
    p.add_argument("--dry_run", action="store_true", help="print the script and the command, submit nothing")
    p.add_argument("--no_check", action="store_true", help="submit (or print) without first checking the trainer's "
                   "arguments here (for callers that checked them, e.g. idattn.sweep's array template)")
    args = p.parse_args(argv)
    if args.nodes < 1 or args.gpus_per_node < 1:
        p.error(f"--nodes={args.nodes}, --gpus_per_node={args.gpus_per_node}: must be >= 1")
    if not rest:
        p.error("pass the trainer's arguments after `--` (at least --config and --workdir)")
    return args, rest


def main(argv=None) -> int:
    args, rest = parse(sys.argv[1:] if argv is None else argv)
    script = render(args, rest)
    # dry run or not: fails here as the job would, before a script is written or anything queues
    rc = 0 if args.no_check else check_trainer_args(rest, dry_run=args.dry_run)
    if rc:
        return rc
    if args.dry_run:
        print(script)
        print("# submit with: sbatch <this script>")
        return 0
    rc = require_tools(["sbatch"])  # one line naming it, before the script is written
    if rc:
        return rc
    log_dir = log_dir_of(args)
    os.makedirs(log_dir, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=f"{args.job_name}-", suffix=".sbatch", dir=log_dir)
    with os.fdopen(fd, "w") as f:
        f.write(script)
    print(f"wrote {path}")
    return call_tool(["sbatch", path])


if __name__ == "__main__":
    sys.exit(main())
