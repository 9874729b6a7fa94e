"""Launchers: local processes (local), SLURM jobs (slurm), Cloud TPU slices (tpu). Each is
`python -m idattn.launch.<name>` and `launch/<name>.py` in a source checkout."""

import os
import subprocess
import sys


def check_trainer_args(trainer_args: list[str], python: str = sys.executable) -> int:
    """A launcher's dry run: resolve and check the trainer's arguments on this machine (`python -m idattn.train
    <args> --check_only`: keys, values, the model, the data choice; no data read, nothing written) before a pod or a
    job is paid for. Prints the trainer's one line to stderr (stdout stays the launcher's commands) and returns its
    exit status (0 when it would start)."""
    if "-m" in trainer_args and trainer_args[trainer_args.index("-m") + 1:][:1] != ["idattn.train"]:
        return 0  # not the trainer (e.g. the local launcher running another module): nothing to check
    args = trainer_args[trainer_args.index("idattn.train") + 1:] if "idattn.train" in trainer_args else trainer_args
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # a check, not a run: never the submitting host's accelerator
    proc = subprocess.run([python, "-m", "idattn.train", *args, "--check_only"], capture_output=True, text=True,
                          env=env)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit {proc.returncode}"
    # stderr either way: stdout stays exactly the commands (or the sbatch script) a user may redirect to a file
    print(("dry run: " if proc.returncode == 0 else "dry run refused: ") + last, file=sys.stderr, flush=True)
    return proc.returncode


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

