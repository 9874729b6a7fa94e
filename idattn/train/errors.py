"""How a run speaks to its operator: `TrainingError` (one line to act on) and `log` (process 0's stdout).

Shared by the start's refusals (train/preflight.py), the checkpoint policy (train/checkpoint.py) and the loop
(train/trainer.py): each stop names what is kept and the fix, in one line.
"""
from __future__ import annotations

import jax


class TrainingError(RuntimeError):
    """A run stopped for a reason the user must act on (non-finite loss, refused resume, ...)."""


def log(msg: str) -> None:
    """Prints `msg` once per run (on process 0)."""
    if jax.process_index() == 0:
        print(msg, flush=True)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (at most 400 characters), or its repr when it has none."""
    text = str(e).strip()
    return text.splitlines()[0][:400] if text else repr(e)
