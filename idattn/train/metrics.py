"""Training metrics: console progress line with ETA, TensorBoard (tensorboardX) and `metrics.jsonl`.

MFU (model FLOPs utilisation), per device:

    MFU = (tokens/s/device) · F_train(T) / peak FLOP/s of one device

F_train(T) is the model's `flops_per_token(model_cfg, seq_len)` (idattn.models.counting), training FLOPs per
token = 3 × forward (backward = 2 × forward): 6·N for the N non-embedding parameters (2 FLOPs per
multiply-accumulate) plus the mixer per layer: causal softmax attention 6·T·H·d_h (QKᵀ and AV, 4·T·H·d_h
forward, halved for causality, ×3), the interdomain operator 6·H·(L(R+D) + 4M(L+R+D) + 4M²) (idattn/ops/interdomain.py's
real MACs per token-head of the chunked form, L the chunk length). Rematerialisation is not counted (this is
MFU, not hardware FLOPs utilisation).
Peak FLOP/s: dense bf16 peak of the device kind (table below), or train.peak_tflops_per_device when set.
On a device kind not in the table (e.g. CPU) MFU is null unless train.peak_tflops_per_device is given.
"""
from __future__ import annotations

import base64
import json
import math
import os
import zlib
import sys
import time
from typing import Any

from idattn import atomic

# Dense bf16 peak TFLOP/s per device (one JAX device: a TPU core pair on v4/v5p = one chip; a GPU).
PEAK_TFLOPS = {
    "tpu v4": 275.0, "tpu v5 lite": 197.0, "tpu v5e": 197.0, "tpu v5p": 459.0, "tpu v5": 459.0,
    "tpu v6 lite": 918.0, "tpu v6e": 918.0, "tpu7x": 2307.0,
    "h200": 989.0, "h100": 989.0, "gh200": 989.0, "b200": 2250.0, "a100": 312.0, "l40s": 362.0,
    "rtx 6000 ada": 364.0, "a6000": 155.0,
}


def peak_flops_per_device(device_kind: str, override_tflops: float = 0.0) -> float | None:
    if override_tflops and override_tflops > 0:
        return float(override_tflops) * 1e12
    kind = device_kind.lower()
    for name in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if name in kind:
            return PEAK_TFLOPS[name] * 1e12
    return None


def format_duration(sec: float) -> str:
    if not math.isfinite(sec) or sec < 0:
        return "?"
    sec = int(round(sec))
    h, rem = divmod(sec, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def format_count(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def format_bytes(x: float) -> str:
    for unit, div in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x:.0f} B"


def _read_records(path: str) -> list[tuple[int, str]]:
    """(step, line) of every well-formed line of a metrics.jsonl; a line cut by a kill is skipped."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                out.append((int(rec["step"]), line))
    return out


def _write_lines(path: str, lines: list[str]) -> None:
    atomic.write_text(path, "".join(l + "\n" for l in lines))


def truncate_jsonl(path: str, max_step: int) -> int:
    """Keeps only records with step <= max_step (after a resume the run repeats the steps past its checkpoint)."""
    if not os.path.exists(path):
        return 0
    keep = [line for step, line in _read_records(path) if step <= max_step]
    _write_lines(path, keep)
    return len(keep)


def pack_lines(lines: list[str]) -> str:
    """metrics.jsonl lines as one compact string for a checkpoint's meta (zlib + base64: ~60 bytes a line)."""
    return base64.b64encode(zlib.compress("\n".join(lines).encode(), 6)).decode("ascii")


def unpack_lines(packed: str | None) -> list[str] | None:
    """The lines `pack_lines` packed; None when there are none (a checkpoint from before the copy existed)."""
    if not packed:
        return None
    text = zlib.decompress(base64.b64decode(packed)).decode()
    return [l for l in text.split("\n") if l]


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7, 8] -> "1-3, 7-8"."""
    out, start, prev = [], None, None
    for x in sorted(steps):
        if start is None:
            start = prev = x
        elif x == prev + 1:
            prev = x
        else:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = x
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(out)


def reconcile(path: str, resume_step: int, saved_lines: list[str] | None) -> str | None:
    """Makes metrics.jsonl the record of steps 1..resume_step: drops lines past it (repeated after a resume) and
    restores, from the copy the checkpoint holds (`saved_lines`), every line the file lost (cut mid-line, lines
    removed, the file deleted). Returns one sentence saying what was restored or what is missing, or None."""
    have = [(s, l) for s, l in _read_records(path) if s <= resume_step]
    saved = [] if saved_lines is None else [(int(json.loads(l)["step"]), l) for l in saved_lines]
    present = {s for s, _ in have}
    restored = [(s, l) for s, l in saved if s <= resume_step and s not in present]
    merged = sorted(have + restored, key=lambda x: x[0])
    if os.path.exists(path) or merged:
        _write_lines(path, [l for _, l in merged])
    if restored:
        return (f"{os.path.basename(path)}: restored {len(restored)} line(s) (steps "
                f"{_ranges([s for s, _ in restored])}) from checkpoint {resume_step}'s copy")
    if saved_lines is None and resume_step > 0 and not present:
        return (f"{os.path.basename(path)} has no lines up to step {resume_step} (deleted?) and checkpoint "
                f"{resume_step} holds no copy of it (written by an older version): those steps are not in the log")
    return None


class EventFile:
    """One TensorBoard event file, written synchronously: every event is serialised, written and flushed in the
    caller's thread, so after `flush()` returns nothing of this trainer's is left to reach the disk later.

    tensorboardX's `SummaryWriter` hands events to a writer thread through a `multiprocessing.Queue` (itself fed
    by a thread) and flushes on a timer, so "the queue is empty" does not mean "written": a trainer stopped
    (SIGSTOP) and fenced out could still append its last steps to `tb/` when continued. Here every write happens
    behind the lease's guard, like every other write of the run. The file name carries the pid (two trainers
    starting in the same second on one host would otherwise share it). `purge_step` writes TensorBoard's
    SessionLog START at that step, which hides every earlier event at a step >= it (what tensorboardX's
    `purge_step` does): a resumed run's steps replace the ones logged past the restored checkpoint."""

    def __init__(self, logdir: str, purge_step: int | None = None):
        # local: tensorboardX is optional at runtime (MetricsWriter goes on without TensorBoard on ImportError)
        from tensorboardX.event_file_writer import EventsWriter  # noqa: PLC0415 optional at runtime
        from tensorboardX.proto.event_pb2 import Event, SessionLog  # noqa: PLC0415 optional at runtime
        from tensorboardX.record_writer import directory_check  # noqa: PLC0415 optional at runtime
        from tensorboardX.summary import scalar  # noqa: PLC0415 optional at runtime

        directory_check(logdir)
        self._event, self._scalar = Event, scalar
        self._writer = EventsWriter(os.path.join(logdir, "events"), f".{os.getpid()}")
        if purge_step is not None:
            self._writer.write_event(Event(wall_time=time.time(), step=int(purge_step),
                                           session_log=SessionLog(status=SessionLog.START)))
        self._writer.flush()

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._writer.write_event(self._event(wall_time=time.time(), step=int(step), summary=self._scalar(tag, value)))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class MetricsWriter:
    """Writes on process 0 only; every other process is silent. `guard(what)` runs before every write (the
    workdir lease's fencing check); `lines_up_to(step)` is the log so far (copied into every checkpoint).
    `tracker` (idattn.train.tracker, e.g. Weights & Biases) gets every record and scalar too, as
    `<prefix>/<key>` at its step; it is closed with the writer."""

    def __init__(self, workdir: str, *, enabled: bool, total_steps: int, resume_step: int = 0,
                 tensorboard: bool = True, saved_lines: list[str] | None = None, guard=None, log=print,
                 tracker=None):
        self.enabled = enabled
        self.total_steps = total_steps
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._guard = guard or (lambda what: None)
        self._tb = None
        self._tracker = tracker if enabled else None
        self._file = None
        self._lines: list[tuple[int, str]] = []
        if not enabled:
            return
        said = reconcile(self.path, resume_step, saved_lines)
        if said:
            log(said)
        self._lines = _read_records(self.path)
        self._file = open(self.path, "a", buffering=1)
        if tensorboard:
            try:
                self._tb = EventFile(os.path.join(workdir, "tb"), purge_step=resume_step + 1 if resume_step else None)
            except ImportError:  # optional at runtime; setup.py installs it
                print("tensorboardX not installed: no TensorBoard events (metrics.jsonl is still written)",
                      file=sys.stderr)

    def lines_up_to(self, step: int) -> list[str]:
        return [l for s, l in self._lines if s <= step]

    def write(self, step: int, metrics: dict[str, Any], *, console: bool = True, prefix: str = "train") -> None:
        if not self.enabled:
            return
        rec = {"step": int(step)}
        for k, v in metrics.items():  # JSON has no NaN / inf: write null (mfu is null on unknown devices)
            rec[k] = None if (isinstance(v, float) and not math.isfinite(v)) else v
        line = json.dumps(rec, sort_keys=False)
        self._guard(f"metrics line of step {step}")
        self._file.write(line + "\n")
        self._lines.append((int(step), line))
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(f"{prefix}/{k}", v, step)
            self._flush_tb()
        if self._tracker is not None:
            self._tracker.log({f"{prefix}/{k}": v for k, v in metrics.items()}, step)
        if console:
            print(self.progress_line(step, metrics), flush=True)

    def progress_line(self, step: int, m: dict[str, Any]) -> str:
        pct = 100.0 * step / max(1, self.total_steps)
        eta = (self.total_steps - step) * m.get("step_time", float("nan"))
        mfu = m.get("mfu")
        parts = [f"step {step}/{self.total_steps} ({pct:.1f}%)", f"loss {m['loss']:.4f}", f"lr {m['lr']:.2e}",
                 f"gnorm {m['grad_norm']:.3f}", f"tok/s {format_count(m['tokens_per_sec'])}",
                 "mfu " + (f"{100 * mfu:.1f}%" if mfu is not None else "n/a"),
                 f"step {m['step_time'] * 1e3:.0f}ms", f"data {m['data_wait'] * 1e3:.1f}ms",
                 f"ETA {format_duration(eta)}"]
        return " | ".join(parts)

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.enabled and self._tb is not None:
            self._guard(f"TensorBoard event {tag} of step {step}")
            self._tb.add_scalar(tag, value, step)
            self._flush_tb()
        if self._tracker is not None:
            self._guard(f"tracker scalar {tag} of step {step}")
            self._tracker.log({tag: value}, step)

    def _flush_tb(self) -> None:
        self._tb.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._tracker is not None:
            self._tracker.close()
            self._tracker = None


class Timer:
    def __init__(self):
        self.t = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt
