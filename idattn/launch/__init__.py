"""Launchers: local processes (local), SLURM jobs (slurm), Cloud TPU slices (tpu). Each is
`python -m idattn.launch.<name>` and `launch/<name>.py` in a source checkout. `sweep` runs every config of a sweep
file through one of them (`python -m idattn.sweep`)."""

import os
import sys

from idattn.launch.check import check_runs, trainer_args_of


def check_trainer_args(trainer_args: list[str], python: str = sys.executable, dry_run: bool = True) -> int:
    """The check before a launcher writes a script or submits (dry run or not): the trainer's `--check_only` on
    these arguments, on this machine (idattn.launch.check.check_runs: keys, values, the model, the data choice; no
    data read, nothing written), before a pod or a job is paid for. Prints the trainer's one line to stderr (stdout
    stays the launcher's commands) and returns its exit status (0 when it would start). `trainer_args` may carry a
    leading `-m idattn.train` (the local launcher's process command); another module is not checked."""
    if "-m" in trainer_args:
        args = trainer_args_of(trainer_args)
        if args is None:
            return 0  # not the trainer (e.g. the local launcher running another module): nothing to check
    else:
        args = list(trainer_args)
    return check_runs([args], python=python, dry_run=dry_run)


def is_git_checkout(path: str) -> bool:
    """True when `path` or a folder above it holds `.git` (a folder, or a file for worktrees and submodules):
    read from the filesystem, so a dry run starts no process."""
    d = os.path.abspath(path)
    while True:
        if os.path.exists(os.path.join(d, ".git")):
            return True
        parent = os.path.dirname(d)
        if parent == d:
            return False
        d = parent

