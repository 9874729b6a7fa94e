"""The stall watchdog (train.stall_minutes): a training loop that stops making progress ends the process in a
way its supervisor can act on, instead of hanging silently."""
from __future__ import annotations

import faulthandler
import io
import os
import sys


class StallWatchdog:
    """train.stall_minutes: a run whose next step does not finish within that many minutes (a deadlock inside the
    runtime, a collective waiting for a host that is gone, a filesystem that stopped answering) writes every
    thread's Python stack to stderr and exits with status 1 instead of hanging silently: its supervisor (or
    operator) reruns it and it resumes from the last committed checkpoint.

    faulthandler's timer: a C thread that needs no GIL, so a main thread blocked inside XLA (holding it or not)
    cannot stop it. Armed after every step (`arm`; compilation, inside the first step, is not timed), so the
    window covers a step and what it owes (log, checkpoint, evaluation); `disarm` when the loop ends."""

    def __init__(self, minutes: float):
        self.out = _stderr_file() if minutes > 0 else None  # resolved once, not at every step
        self.seconds = 60.0 * minutes if self.out is not None else 0.0

    def arm(self) -> None:
        if self.seconds > 0:
            faulthandler.dump_traceback_later(self.seconds, exit=True, file=self.out)

    def disarm(self) -> None:
        if self.seconds > 0:
            faulthandler.cancel_dump_traceback_later()


def debug_stall_step() -> int:
    """IDATTN_DEBUG_STALL_AT_STEP: the step at which the loop blocks forever, so that a test sees the stall
    watchdog stop the run (unset, 0, in real runs)."""
    return int(os.environ.get("IDATTN_DEBUG_STALL_AT_STEP", "0") or 0)


def _stderr_file():
    """Where the stacks go: stderr, or the process's own stderr when sys.stderr is not a file (a notebook, a
    captured stream); None (no watchdog) when neither has a file descriptor."""
    for out in (sys.stderr, sys.__stderr__):
        try:
            out.fileno()
            return out
        except (AttributeError, ValueError, io.UnsupportedOperation):
            continue
    return None
