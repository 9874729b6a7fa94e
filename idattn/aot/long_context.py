"""The docs/pods.md "Long context" table: 125M and 1.3B x {interdomain, softmax} x T tokens per sequence, the
train step compiled ahead of time for a v5p slice with the length split over a `sequence` axis, beside the
communication cost model of that axis.

    python -m idattn.aot.table --kind=long_context --dir=aot-long [--run] [--grid=<size>:<mixer>:<T>,...]

--run compiles the missing grid points, one `python -m idattn.aot --config=experiments/scaling.py:<mixer>,<size>
--topology=v5p-128 --steps=train --config.data.seq_len=T --config.mesh.sequence=4 --config.train.batch_size=16
--json=<dir>/long-<mixer>-<size>-<T>.json` at a time (a subprocess each); the table is printed from those JSON
files (per-chip memory from the compiler's `memory_analysis()`, idattn/aot/compile.py) and from the cost model
below (closed forms of the config, no measurement).

Mesh: v5p-128 (64 chips, 16 hosts of 4) as data 1 x fsdp 16 x sequence 4 x tensor 1, one sequence per sequence
group (global batch 16 rows of T tokens, T/4 tokens per chip). The sequence axis is 4: a v5p host's 4 chips,
the most a group could use before groups could span hosts (`idattn.train.sharding.sequence_spans_processes`);
the grid with larger groups is not compiled yet.

Cost model of the sequence axis, per layer and per row (P = 4 shards):

- Interdomain: one all_gather of every shard's end state, float32 real and imaginary planes of [H, M, R + d_h]:
  2·H·M·(R + d_h)·4 bytes per shard; each chip receives (P − 1) of them.
- Softmax: one all_gather of K and V (bf16): 2·T·H·d_h·2 bytes per row in all; each chip receives (P − 1)/P.
- Per train step: 3 such transfers per layer (the forward, its rematerialisation under `remat=full`, and the
  backward's reduce-scatter of the cotangents, the all_gather's transpose, of the same size), times the layers,
  times the rows a chip holds (1).
- Time: bytes a chip receives per step / the v5p chip's ICI bandwidth, ICI_BYTES_PER_S = 4,800 Gbit/s = 600 GB/s
  (Cloud TPU's v5p system-architecture page: "Interchip Interconnect BW 4,800 Gbps" per chip; the sum over its
  links, so an all_gather over a 4-chip ring that uses one torus axis runs at a fraction of it: this is the
  optimistic end). Against the step's compute: the model's training FLOPs per chip (`idattn.models.
  flops_per_token` x tokens per chip, the MFU numerator; Softmax's includes its causal T² term) at the v5p peak,
  PEAK_FLOPS = 459 TFLOP/s bf16 per chip (the same page), i.e. the fastest the step could run.
"""
from __future__ import annotations

import json
import os
import sys

GiB = 1024 ** 3
MiB = 1024 ** 2
TOPOLOGY = "v5p-128"
CHIPS = 64
SEQUENCE = 4
ROWS = CHIPS // SEQUENCE  # one sequence per sequence group
ICI_BYTES_PER_S = 4800e9 / 8  # v5p: 4,800 Gbps inter-chip interconnect per chip (Cloud TPU system architecture)
PEAK_FLOPS = 459e12  # v5p: bf16 peak per chip (Cloud TPU system architecture)
TRANSFERS_PER_STEP = 3  # forward, rematerialised forward, backward reduce-scatter (per layer)
LENGTHS = (131072, 524288, 1048576)
SIZES = ("125m", "1.3b")
MIXERS = ("interdomain", "softmax")
DEFAULT_GRID = tuple((s, m, t) for s in SIZES for m in MIXERS for t in LENGTHS)


def name(size: str, mixer: str, seq_len: int) -> str:
    return f"long-{mixer}-{size}-{seq_len}"


def aot_argv(size: str, mixer: str, seq_len: int, out_dir: str) -> list[str]:
    argv = [sys.executable, "-m", "idattn.aot", f"--config=experiments/scaling.py:{mixer},{size}",
            f"--topology={TOPOLOGY}", "--steps=train", f"--config.data.seq_len={seq_len}",
            f"--config.mesh.sequence={SEQUENCE}", f"--config.train.batch_size={ROWS}",
            f"--json={os.path.join(out_dir, name(size, mixer, seq_len) + '.json')}"]
    if mixer != "softmax":
        argv.append("--config.model.impl=pallas")
    return argv


def command(size: str, mixer: str, seq_len: int) -> str:
    """The `python -m idattn.aot` command of one grid point, as a user types it."""
    return " ".join(["python"] + [a for a in aot_argv(size, mixer, seq_len, "<dir>")[1:] if not a.startswith("--json")])


def cost_model(size: str, mixer: str, seq_len: int) -> dict:
    """Bytes and seconds of the sequence axis's collective for one grid point (module docstring)."""
    from idattn.configs.scaling import get_config
    from idattn.models import flops_per_token
    from idattn.models.spec import spec_from_config

    cfg = get_config(f"{mixer},{size}")
    s = spec_from_config(cfg.model)
    h, dh, layers = int(s.num_heads), int(s.head_dim), int(s.num_layers)
    if mixer == "softmax":
        gathered = 2 * seq_len * h * dh * 2  # K and V of the whole row, bf16
        received = gathered * (SEQUENCE - 1) // SEQUENCE
    else:
        m = int(s.num_modes)
        gathered = 2 * h * m * (dh + dh) * 4 * SEQUENCE  # every shard's [H, M, R + d_h] complex end state, f32 planes
        received = gathered * (SEQUENCE - 1) // SEQUENCE
    per_step = received * TRANSFERS_PER_STEP * layers * (ROWS * SEQUENCE // CHIPS)
    tokens_per_chip = ROWS * seq_len / CHIPS
    compute_s = float(flops_per_token(cfg.model, seq_len)) * tokens_per_chip / PEAK_FLOPS
    comm_s = per_step / ICI_BYTES_PER_S
    return {"layer_bytes": gathered, "received_layer": received, "step_bytes": per_step, "comm_s": comm_s,
            "compute_s": compute_s, "ratio": comm_s / compute_s, "tokens_per_chip": tokens_per_chip}


# State passing at scale (issue 37 item 2): how the shards' end states could travel, per layer and transfer, for
# a sequence group of P chips. S = one shard's end state (2·H·M·(R + d_h)·4 bytes per row).
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
    from idattn.configs.scaling import get_config
    from idattn.models import flops_per_token
    from idattn.models.spec import spec_from_config
    import math

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


def row(size: str, mixer: str, seq_len: int, rec: dict | None) -> str:
    c = cost_model(size, mixer, seq_len)
    model = (f"{_size(c['layer_bytes'])} | {_size(c['step_bytes'])} | {_time(c['comm_s'])} | "
             f"{_time(c['compute_s'])} | {100 * c['ratio']:.3g}%")
    head = f"| {size} | {mixer} | {seq_len:,} | {int(c['tokens_per_chip']):,} |"
    if rec is None:
        return f"{head} not compiled | | | {model} |"
    if "error" in rec:  # the compiler's reason, shortened to its first clause
        why = rec["error"].split("JaxRuntimeError: ")[-1].replace("RESOURCE_EXHAUSTED: ", "")
        why = why.replace("XLA:TPU compile permanent error. ", "")
        why = ". ".join(why.split(". ")[:2])[:160].replace("|", "/")
        return f"{head} did not compile: {why} | {TOPOLOGY} | | {model} |"
    tr = next(st for st in rec["steps"] if st["name"] == "train")
    m = rec["mesh"]
    mesh = f"{m['data']}x{m['fsdp']}x{m['sequence']}x{m['tensor']}"
    fits = "fits" if tr["total"] <= rec["hbm_bytes"] else "does not fit"
    return (f"{head} {tr['total'] / GiB:.1f} ({tr['temp'] / GiB:.1f} temp): {fits} | {mesh} | "
            f"{tr['compile_s']:.0f} ({tr.get('mosaic', 0)}) | {model} |")


HEADER = ("| size | mixer | T tokens per sequence | tokens per chip | train step GiB per chip of 95 | mesh d x f x s x t "
          "| compile s (Mosaic kernels) | gathered per layer and row | received per chip and step | gather time per step at 600 GB/s "
          "| step compute at peak | gather / compute |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def parse_grid(text: str | None) -> tuple:
    if not text:
        return DEFAULT_GRID
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or parts[0] not in SIZES or parts[1] not in MIXERS or not parts[2].isdigit():
            raise ValueError(f"--grid: got {item!r}; expected <size>:<mixer>:<T> with size in {SIZES}, mixer in "
                             f"{MIXERS}, e.g. 1.3b:interdomain:1048576")
        out.append((parts[0], parts[1], int(parts[2])))
    return tuple(out)


def main(out_dir: str, run: bool, grid_text: str | None = None, log=print) -> int:
    import subprocess

    grid = parse_grid(grid_text)
    os.makedirs(out_dir, exist_ok=True)
    for size, mixer, t in grid:
        path = os.path.join(out_dir, name(size, mixer, t) + ".json")
        if run and not os.path.exists(path):
            argv = aot_argv(size, mixer, t, out_dir)
            print("running: " + " ".join(argv), file=sys.stderr, flush=True)
            proc = subprocess.run(argv, check=False, capture_output=True, text=True)
            print(proc.stdout, end="", file=sys.stderr, flush=True)
            if not os.path.exists(path):  # did not compile: keep the compiler's reason for the table
                errors = [x for x in proc.stdout.splitlines() if x.startswith("error: ")] or ["error: exit status "
                                                                                           f"{proc.returncode}"]
                with open(path[:-len(".json")] + ".err", "w") as f:
                    f.write(errors[-1][len("error: "):] + "\n")
    log(HEADER)
    for size, mixer, t in grid:
        path = os.path.join(out_dir, name(size, mixer, t) + ".json")
        rec = None
        if os.path.exists(path):
            with open(path) as f:
                rec = json.load(f)
        elif os.path.exists(path[:-len(".json")] + ".err"):
            with open(path[:-len(".json")] + ".err") as f:
                rec = {"error": f.read().strip()}
        log(row(size, mixer, t, rec))
    return 0
