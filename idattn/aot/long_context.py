"""The docs/pods.md "Long context" table: 125M and 1.3B x {interdomain, softmax} x T tokens per sequence x a v5p
slice, the train step compiled ahead of time with the length split over a `sequence` axis sized to fit, beside
the communication cost model of that axis.

    python -m idattn.aot.table --kind=long_context --dir=docs/aot/long [--run] [--grid=<size>:<mixer>:<T>[:<slice>],...] \
        [--doc=docs/pods.md]

A cell is (size, mixer, T, slice), one sequence per sequence group: P = `mesh.sequence` chips hold one row of T
tokens (T/P a chip), fsdp = chips/P, global batch chips/P rows. The table gives each cell at the smallest P in
SEQUENCES (4: a v5p host's chips, up to 32) whose train step fits the chip's 95 GiB, and the largest T each
mixer fits per slice. --run compiles what is missing, one `python -m idattn.aot --config=experiments/scaling.py:
<mixer>,<size> --topology=<slice> --steps=train --config.data.seq_len=T --config.mesh.sequence=P
--config.train.batch_size=<chips/P> --json=<dir>/<name>.json` at a time (a subprocess each; a compile that
fails, e.g. out of HBM, leaves `<name>.err` with the compiler's reason), searching P per cell: it starts at the
smallest P whose tokens per chip are at most TOKENS_PER_CHIP_GUESS (measured fits, below), goes up while the
step does not fit, and down while half the P might (argument + 2 x temporary bytes within HBM), so that the P
shown is the smallest that fits, next to the compiled figure at P/2 that did not.

Cost model of the sequence axis, per layer and per row (P shards), beside the compiled program's own figure
("all-gather over sequence" in idattn.aot.compile.collectives_by_axis: the collective's result bytes on one chip,
each op in the program text once, the scanned layer stack's loop body once, so per layer):

- Interdomain: one all_gather of every shard's end state, float32 real and imaginary planes of [H, M, R + d_h]:
  2·H·M·(R + d_h)·4 bytes per shard, P of them gathered; each chip receives (P − 1).
- Softmax: one all_gather of K and V (bf16): 2·T·H·d_h·2 bytes per row in all; each chip receives (P − 1)/P.
- Per train step: 3 such transfers per layer (the forward, its rematerialisation under `remat=full`, and the
  backward's reduce-scatter of the cotangents, the all_gather's transpose, of the same size), times the layers,
  times the rows a chip holds (1).
- Time: bytes a chip receives per step / the v5p chip's ICI bandwidth, ICI_BYTES_PER_S = 4,800 Gbit/s = 600 GB/s
  (Cloud TPU's v5p system-architecture page: "Interchip Interconnect BW 4,800 Gbps" per chip; the sum over its
  links, so an all_gather over a ring that uses one torus axis runs at a fraction of it: this is the
  optimistic end). Against the step's compute: the model's training FLOPs per chip (`idattn.models.
  flops_per_token` x tokens per chip, the MFU numerator; Softmax's includes its causal T² term) at the v5p peak,
  PEAK_FLOPS = 459 TFLOP/s bf16 per chip (the same page), i.e. the fastest the step could run.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

from idattn.configs.scaling import get_config
from idattn.models import flops_per_token
from idattn.models.spec import spec_from_config

GiB = 1024 ** 3
MiB = 1024 ** 2
SLICES = {"v5p-64": 32, "v5p-128": 64}  # slice -> chips (v5p-N has N/2 chips)
HBM_BYTES = 95 * GiB  # a v5p chip
SEQUENCES = (4, 8, 16, 32)
ICI_BYTES_PER_S = 4800e9 / 8  # v5p: 4,800 Gbps inter-chip interconnect per chip (Cloud TPU system architecture)
PEAK_FLOPS = 459e12  # v5p: bf16 peak per chip (Cloud TPU system architecture)
TRANSFERS_PER_STEP = 3  # forward, rematerialised forward, backward reduce-scatter (per layer)
LENGTHS = (131072, 524288, 1048576, 2097152)
SIZES = ("125m", "1.3b")
MIXERS = ("interdomain", "softmax")
# Where --run starts its search: tokens per chip known to fit (docs/pods.md's earlier v5p-128 table at P = 4:
# 125M Interdomain 262,144 in 47 GiB; 1.3B Interdomain 131,072 in 75.6 GiB; Softmax 131,072 (125M at 262,144
# ran out of splash's scoped VMEM; 1.3B took 49 GiB)).
TOKENS_PER_CHIP_GUESS = {("125m", "interdomain"): 262144, ("1.3b", "interdomain"): 131072,
                         ("125m", "softmax"): 131072, ("1.3b", "softmax"): 131072}
DEFAULT_GRID = tuple((s, m, t, sl) for sl in ("v5p-128", "v5p-64") for s in SIZES for m in MIXERS for t in LENGTHS)


def name(size: str, mixer: str, seq_len: int, topology: str, sequence: int) -> str:
    return f"long-{mixer}-{size}-{seq_len}-{topology}-s{sequence}"


def aot_argv(size: str, mixer: str, seq_len: int, topology: str, sequence: int, out_dir: str) -> list[str]:
    argv = [sys.executable, "-m", "idattn.aot", f"--config=experiments/scaling.py:{mixer},{size}",
            f"--topology={topology}", "--steps=train", f"--config.data.seq_len={seq_len}",
            f"--config.mesh.sequence={sequence}", f"--config.train.batch_size={SLICES[topology] // sequence}",
            f"--json={os.path.join(out_dir, name(size, mixer, seq_len, topology, sequence) + '.json')}"]
    if mixer != "softmax":
        argv.append("--config.model.impl=pallas")
    return argv


def command(size: str, mixer: str, seq_len: int, topology: str = "v5p-128", sequence: int = 4) -> str:
    """The `python -m idattn.aot` command of one grid point, as a user types it."""
    return " ".join(["python"] + [a for a in aot_argv(size, mixer, seq_len, topology, sequence, "<dir>")[1:]
                                  if not a.startswith("--json")])


def cost_model(size: str, mixer: str, seq_len: int, sequence: int = 4, chips: int = 64) -> dict:
    """Bytes and seconds of the sequence axis's collective for one grid point (module docstring)."""

    cfg = get_config(f"{mixer},{size}")
    s = spec_from_config(cfg.model)
    h, dh, layers, P = int(s.num_heads), int(s.head_dim), int(s.num_layers), int(sequence)
    if mixer == "softmax":
        gathered = 2 * seq_len * h * dh * 2  # K and V of the whole row, bf16
        received = gathered * (P - 1) // P
    else:
        m = int(s.num_modes)
        gathered = 2 * h * m * (dh + dh) * 4 * P  # every shard's [H, M, R + d_h] complex end state, f32 planes
        received = gathered * (P - 1) // P
    per_step = received * TRANSFERS_PER_STEP * layers  # one row per sequence group: a chip holds one row's shard
    tokens_per_chip = seq_len / P
    compute_s = float(flops_per_token(cfg.model, seq_len)) * tokens_per_chip / PEAK_FLOPS
    comm_s = per_step / ICI_BYTES_PER_S
    return {"layer_bytes": gathered, "received_layer": received, "step_bytes": per_step, "comm_s": comm_s,
            "compute_s": compute_s, "ratio": comm_s / compute_s, "tokens_per_chip": tokens_per_chip}


# State passing at scale (docs/pods.md, "State passing at scale"): how the shards' end states could travel, per
# layer and transfer, for a sequence group of P chips. S = one shard's end state (2·H·M·(R + d_h)·4 bytes per row).
#   all_gather (what the code does; LASP-2): one collective; each chip receives (P − 1)·S; on a bidirectional
#     ring along a torus axis (2 links): time (P − 1)·(α + S / (2·β_link)) (bandwidth-optimal ring all-gather).
#   ring (LASP-1): shard p waits for p − 1 (a dependent chain of P − 1 hops of S on one link): the same bytes on
#     the critical path as the all-gather and P − 1 serial latencies, and the fold cannot start before its input
#     arrives, so it is never cheaper than the all-gather: not modelled further.
#   tree (a Blelloch up- and down-sweep, ZeCO's all-scan): 2·log2(P) rounds of S on one link each: time
#     2·log2(P)·(α + S / β_link), each chip receives 2·log2(P)·S.
# β_link = 4,800 Gbit/s over a v5p chip's 6 ICI links = 100 GB/s; α = 2 µs per hop (an assumed ICI latency, the
# order of published TPU ICI latencies; the conclusion below does not depend on it).
LINK_BYTES_PER_S = ICI_BYTES_PER_S / 6
HOP_LATENCY_S = 2e-6
STATE_PASSING_P = (4, 8, 16, 32, 64)


def state_passing(size: str, P: int, seq_len: int) -> dict:
    """Per train step and chip (one row per sequence group, T = seq_len split over P chips): the all_gather and
    the tree scan of the end states (bytes received, seconds) against the step's compute at peak."""

    cfg = get_config(f"interdomain,{size}")
    s = spec_from_config(cfg.model)
    state = 2 * int(s.num_heads) * int(s.num_modes) * (2 * int(s.head_dim)) * 4
    per_step = TRANSFERS_PER_STEP * int(s.num_layers)
    ag_bytes = (P - 1) * state * per_step
    ag_s = (P - 1) * (HOP_LATENCY_S + state / (2 * LINK_BYTES_PER_S)) * per_step
    rounds = 2 * math.ceil(math.log2(P))
    tree_bytes = rounds * state * per_step
    tree_s = rounds * (HOP_LATENCY_S + state / LINK_BYTES_PER_S) * per_step
    compute_s = float(flops_per_token(cfg.model, seq_len)) * (seq_len / P) / PEAK_FLOPS
    return {"state_bytes": state, "all_gather_bytes": ag_bytes, "all_gather_s": ag_s, "tree_bytes": tree_bytes,
            "tree_s": tree_s, "compute_s": compute_s, "all_gather_frac": ag_s / compute_s,
            "tree_frac": tree_s / compute_s, "saving_frac": (ag_s - tree_s) / compute_s}


def state_passing_table(seq_len: int = 1048576) -> str:
    """docs/pods.md's state-passing table (`python -m idattn.aot.table --kind=state_passing`)."""
    lines = [f"| size | P (sequence) | tokens per chip | state per shard | all_gather: received, time | tree scan: "
             f"received, time | step compute at peak | all_gather / compute | tree / compute |",
             "|---|---|---|---|---|---|---|---|---|"]
    for size in SIZES:
        for P in STATE_PASSING_P:
            c = state_passing(size, P, seq_len)
            lines.append(f"| {size} | {P} | {seq_len // P:,} | {_size(c['state_bytes'])} | "
                         f"{_size(c['all_gather_bytes'])}, {_time(c['all_gather_s'])} | {_size(c['tree_bytes'])}, "
                         f"{_time(c['tree_s'])} | {_time(c['compute_s'])} | {100 * c['all_gather_frac']:.2f}% | "
                         f"{100 * c['tree_frac']:.2f}% |")
    return "\n".join(lines)


def _size(n: float) -> str:
    return f"{n / MiB:.2f} MiB" if n < GiB else f"{n / GiB:.1f} GiB"


def _time(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if t < 1 else f"{t:.1f} s"


def _load(out_dir: str, cell: tuple, sequence: int) -> dict | None:
    """The compiled record of one cell at one P: the idattn.aot JSON, {"error": reason} from a .err, or None."""
    base = os.path.join(out_dir, name(*cell, sequence))
    if os.path.exists(base + ".json"):
        with open(base + ".json") as f:
            return json.load(f)
    if os.path.exists(base + ".err"):
        with open(base + ".err") as f:
            return {"error": f.read().strip()}
    return None


def _train(rec: dict) -> dict:
    return next(st for st in rec["steps"] if st["name"] == "train")


def fits(rec: dict | None) -> bool | None:
    """True / False from a compiled record (an out-of-HBM compile error is False); None: not compiled."""
    if rec is None:
        return None
    if "error" in rec:
        return False
    return _train(rec)["total"] <= rec["hbm_bytes"]


def candidates(cell: tuple) -> list[int]:
    size, mixer, seq_len, topology = cell
    return [p for p in SEQUENCES if SLICES[topology] % p == 0 and seq_len % p == 0]


def chosen(out_dir: str, cell: tuple) -> tuple[int | None, dict | None, int | None, dict | None]:
    """(P, record) at the smallest compiled P that fits, and (P', record) of the largest compiled P' < P (the
    evidence that P is the smallest); P None if no compiled P fits (then P' is the largest compiled)."""
    recs = {p: _load(out_dir, cell, p) for p in candidates(cell)}
    fit = [p for p, r in recs.items() if fits(r)]
    if fit:
        p = min(fit)
        below = [q for q, r in recs.items() if r is not None and q < p]
        return p, recs[p], (max(below) if below else None), (recs[max(below)] if below else None)
    tried = [q for q, r in recs.items() if r is not None]
    return None, None, (max(tried) if tried else None), (recs[max(tried)] if tried else None)


def _why(rec: dict) -> str:
    """A failed compile's reason, shortened (the HBM figure when the compiler gives one)."""
    err = rec["error"]
    m = re.search(r"Used ([\d.]+)G of ([\d.]+)G hbm", err)
    if m:
        return f"out of HBM ({m.group(1)} GiB)"
    why = err.split("JaxRuntimeError: ")[-1].replace("RESOURCE_EXHAUSTED: ", "")
    why = why.replace("XLA:TPU compile permanent error. ", "")
    return ". ".join(why.split(". ")[:2])[:120].replace("|", "/")


def _memory(rec: dict) -> str:
    if "error" in rec:
        return f"did not compile: {_why(rec)}"
    tr = _train(rec)
    return f"{tr['total'] / GiB:.1f} ({tr['temp'] / GiB:.1f} temp)"


def _sequence_gather(rec: dict) -> str:
    """The compiled program's all-gather over the sequence axis alone: ops in its text and their result bytes."""
    by = _train(rec).get("by_axis") or {}
    g = by.get("all-gather over sequence")
    return f"{g['count']} ops, {_size(g['bytes'])}" if g else "none found"


def row(out_dir: str, cell: tuple) -> str:
    size, mixer, seq_len, topology = cell
    p, rec, q, below = chosen(out_dir, cell)
    head = f"| {size} | {mixer} | {seq_len:,} | {topology} |"
    smaller = f"P = {q}: {_memory(below)}" if below is not None else "-"
    if p is None:
        if below is None:
            return f"{head} not compiled | | {smaller} | | | | | | |"
        return f"{head} none up to P = {q} | | {smaller} | | | | | | |"
    c = cost_model(size, mixer, seq_len, p, SLICES[topology])
    m = rec["mesh"]
    tr = _train(rec)
    return (f"{head} {p} | {int(c['tokens_per_chip']):,} | {smaller} | {_memory(rec)} | "
            f"{m['data']}x{m['fsdp']}x{m['sequence']}x{m['tensor']} | {tr['compile_s']:.0f} ({tr.get('mosaic', 0)}) | "
            f"{_size(c['layer_bytes'])}; compiled: {_sequence_gather(rec)} | {_size(c['step_bytes'])}, "
            f"{_time(c['comm_s'])} | {_time(c['compute_s'])} ({100 * c['ratio']:.3g}%) |")


HEADER = ("| size | mixer | T tokens per sequence | slice | sequence P (smallest that fits) | tokens per chip | at a "
          "smaller P: GiB per chip | train step GiB per chip of 95 | mesh d x f x s x t | compile s (Mosaic "
          "kernels) | gathered per layer and row (model; compiled) | received per chip and step, time at 600 GB/s "
          "| step compute at peak (gather / compute) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def largest_table(out_dir: str, grid: tuple) -> list[str]:
    """The largest T of the grid that fits (with its P) per size, mixer and slice."""
    lines = ["| size | mixer | " + " | ".join(f"largest T on {t} (P)" for t in SLICES) + " |",
             "|---|---|" + "---|" * len(SLICES)]
    for size in SIZES:
        for mixer in MIXERS:
            cells = []
            for topo in SLICES:
                ts = sorted(t for (s, m, t, sl) in grid if (s, m, sl) == (size, mixer, topo))
                best, open_ = None, False
                for t in ts:
                    p = chosen(out_dir, (size, mixer, t, topo))[0]
                    if p is not None:
                        best = (t, p)
                    elif _load_any(out_dir, (size, mixer, t, topo)) is None:
                        open_ = True
                if not ts:
                    cells.append("-")
                elif best is None:
                    cells.append("not compiled" if open_ else f"< {ts[0]:,}")
                else:
                    more = best[0] == ts[-1]
                    cells.append(f"{'≥ ' if more else ''}{best[0]:,} ({best[1]})" + (" (grid incomplete)" if open_ else ""))
            if any(c != "-" for c in cells):
                lines.append(f"| {size} | {mixer} | " + " | ".join(cells) + " |")
    return lines


def _load_any(out_dir: str, cell: tuple):
    return next((r for p in candidates(cell) if (r := _load(out_dir, cell, p)) is not None), None)


def parse_grid(text: str | None) -> tuple:
    if not text:
        return DEFAULT_GRID
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        ok = len(parts) in (3, 4) and parts[0] in SIZES and parts[1] in MIXERS and parts[2].isdigit()
        if not ok or (len(parts) == 4 and parts[3] not in SLICES):
            raise ValueError(f"--grid: got {item!r}; expected <size>:<mixer>:<T>[:<slice>] with size in {SIZES}, "
                             f"mixer in {MIXERS}, slice in {tuple(SLICES)}, e.g. 1.3b:interdomain:1048576:v5p-128")
        slices = (parts[3],) if len(parts) == 4 else tuple(SLICES)
        out.extend((parts[0], parts[1], int(parts[2]), sl) for sl in slices)
    return tuple(out)


def next_sequence(out_dir: str, cell: tuple) -> int | None:
    """The next P to compile for a cell (module docstring's search), or None when the cell is settled."""
    ps = candidates(cell)
    recs = {p: _load(out_dir, cell, p) for p in ps}
    fit = [p for p in ps if fits(recs[p])]
    if fit:
        p = min(fit)
        smaller = [q for q in ps if q < p]
        if not smaller or recs[smaller[-1]] is not None:
            return None
        tr = _train(recs[p])
        might = tr["total"] + tr["temp"] * (p / smaller[-1] - 1) <= recs[p]["hbm_bytes"]  # temporaries scale with T/P
        return smaller[-1] if might else None
    tried = [p for p in ps if recs[p] is not None]
    if tried:
        up = [q for q in ps if q > max(tried)]
        return up[0] if up else None
    guess = TOKENS_PER_CHIP_GUESS[cell[:2]]
    return next((p for p in ps if cell[2] // p <= guess), ps[-1] if ps else None)


def compile_cell(out_dir: str, cell: tuple, sequence: int) -> None:
    path = os.path.join(out_dir, name(*cell, sequence) + ".json")
    argv = aot_argv(*cell, sequence, out_dir)
    print("running: " + " ".join(argv), file=sys.stderr, flush=True)
    proc = subprocess.run(argv, check=False, capture_output=True, text=True)
    print(proc.stdout, end="", file=sys.stderr, flush=True)
    if not os.path.exists(path):  # did not compile: keep the compiler's reason for the table
        errors = [x for x in proc.stdout.splitlines() if x.startswith("error: ")] or [
            f"error: exit status {proc.returncode}"]
        with open(path[:-len(".json")] + ".err", "w") as f:
            f.write(errors[-1][len("error: "):] + "\n")


def render(out_dir: str, grid: tuple) -> list[str]:
    lines = HEADER.split("\n")
    lines += [row(out_dir, cell) for cell in grid]
    return lines + [""] + largest_table(out_dir, grid)


def main(out_dir: str, run: bool, grid_text: str | None = None, log=print) -> int:
    grid = parse_grid(grid_text)
    os.makedirs(out_dir, exist_ok=True)
    if run:
        for cell in grid:
            while (p := next_sequence(out_dir, cell)) is not None:
                compile_cell(out_dir, cell, p)
    lines = render(out_dir, grid)
    for line in lines:
        log(line)
    return 0
