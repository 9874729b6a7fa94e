"""A cost model of the fused GPU kernels, built from what the compiled kernels do and tested on device times it was
not fitted on (``python -m idattn.bench gpu``).

Inputs, per configuration (shape, T, chunk, forward or forward + backward, options), from the deviceless compile
for an H200 (``python -m idattn.aot.sass collect``, written to ``gpu_kernels.json`` beside this file): every
Triton launch's grid and warps, and per kernel from its SASS the instructions of one chunk iteration (the loop
body: all instructions, ``BAR.SYNC`` barriers, tensor-core MACs), its registers and the XLA ops around the calls.
From those, per kernel:

    programs per SM  occ   = min(65536 // (32 · warps · regs), 64 // warps)        (registers bind first here)
    waves                  = ceil(programs / (132 · occ))
    iterations             = T/L for the serial kernels (a program walks every chunk: fwd_p, fwd_o, scan_*),
                             else the chunks of one group (the chunk-parallel kernels' ``_groups``)
    warps per scheduler    = ceil(ceil(programs / 132) · warps / 4)   (the busiest SM's programs, all waves)
    t_kernel               = c_launch + c_issue · iterations · instructions · warps per scheduler
                             (+ c_path · waves · iterations + c_bar · barriers + c_bytes · bytes: fitted to 0)

and the configuration's time is the sum over its launches plus XLA's glue around them (c_glue_bytes per GB it
writes and reads). c_launch is fixed at LAUNCH_US; c_issue, the time per instruction slot of the busiest
scheduler, and c_glue_bytes are fitted, in relative error, on the first device run's main rows (2026-12-04, H200,
bf16, 65,536 tokens, ``MEASURED`` below, role "fit"), and the model then predicts the rows of that day the fit
never saw (role "held-out": ``save_states`` off, chunk 128, the serial forward at 16K). The other terms (a
dependent iteration's latency, barriers, the kernels' own bytes) are held at 0: fitted freely (v1, printed beside
the model) they put a launch at ~200 us, which no launch costs. Every time this prints for a configuration without a measured row is a prediction and says so.
What the fitted constants mean and where the model misses: docs/kernels-results.md, "Where the time goes".
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_kernels.json")
SMS = 132  # H100 / H200 SXM
REGS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
TOKENS = 65536
# name prefixes of the serial kernels (a program walks every chunk); the chunk-parallel readouts
# (idattn_fwd_p_readout, ...) walk one group of chunks
SERIAL = ("idattn_fwd_p", "idattn_fwd_o", "idattn_scan_fwd", "idattn_scan_rev")
BWD_TARGET_PROGRAMS = 512  # idattn.ops.pallas.gpu.BWD_TARGET_PROGRAMS (chunk groups of the parallel kernels)

# The first device run (docs/kernels-results.md, "Measured on an H200", 2026-12-04): H200, jax 0.11.2 (CUDA 13 plugin),
# code 16957a3, bf16, 65,536 tokens per batch, median ms. (tag, (H, d_h, M), T, chunk, mode, ms, role)
MEASURED = (
    ("main", (16, 128, 32), 1024, 64, "fwd", 4.028, "fit"),
    ("main", (16, 128, 32), 1024, 64, "fwdbwd", 14.264, "fit"),
    ("main", (16, 128, 32), 2048, 64, "fwd", 4.022, "fit"),
    ("main", (16, 128, 32), 2048, 64, "fwdbwd", 14.117, "fit"),
    ("main", (16, 128, 32), 4096, 64, "fwd", 4.691, "fit"),
    ("main", (16, 128, 32), 4096, 64, "fwdbwd", 13.777, "fit"),
    ("main", (16, 128, 32), 16384, 64, "fwd", 4.921, "fit"),
    ("main", (16, 128, 32), 16384, 64, "fwdbwd", 15.191, "fit"),
    ("main", (32, 64, 64), 4096, 64, "fwd", 5.550, "fit"),
    ("main", (32, 64, 64), 4096, 64, "fwdbwd", 24.887, "fit"),
    ("main", (32, 64, 64), 16384, 64, "fwd", 6.587, "fit"),
    ("main", (32, 64, 64), 16384, 64, "fwdbwd", 27.950, "fit"),
    ("save_states_off", (16, 128, 32), 4096, 64, "fwdbwd", 14.6, "held-out"),
    ("save_states_off", (16, 128, 32), 16384, 64, "fwdbwd", 17.0, "held-out"),
    ("chunk128", (16, 128, 32), 4096, 128, "fwdbwd", 16.0, "held-out"),
    ("chunk128", (16, 128, 32), 16384, 128, "fwdbwd", 16.2, "held-out"),
    ("serial_fwd", (16, 128, 32), 16384, 64, "fwd", 4.64, "held-out"),
    ("serial_fwd", (16, 128, 32), 16384, 64, "fwdbwd", 14.7, "held-out"),
)
# The configurations the kernel targets name (forward + backward <= 4.0 ms at (16, 128, 32) for T = 1K..16K; the
# 1.3B head shape (32, 64, 64)), compiled from the current kernels under a tag (`python -m idattn.aot.sass collect
# --tag now`, keys now_*) and predicted beside the 2026-12-04 kernels.
TARGET_SHAPES = (((16, 128, 32), (1024, 2048, 4096, 16384)), ((32, 64, 64), (4096, 16384)))
TARGET_MS = 4.0  # forward + backward at (16, 128, 32)


def target_rows(tag: str = "now") -> list:
    """(tag, shape, T, chunk, mode, options) of every target configuration, for idattn.aot.sass.collect."""
    return [(tag, shape, T, 64, mode, {}) for shape, Ts in TARGET_SHAPES for T in Ts for mode in ("fwd", "fwdbwd")]


TERMS = ("c_launch", "c_path", "c_issue", "c_bar", "c_bytes", "c_glue_op", "c_glue_bytes")
# The model (v2): a launch costs LAUNCH_US, not fitted (a kernel launch costs microseconds); the fit chooses only
# the cost of one issued warp-instruction per scheduler (c_issue, us; x CLOCK_MHZ it is the cycles per instruction)
# and of XLA's bytes. v1 fitted all seven terms freely and came out at 594 us per launch and 208 us per global GB:
# within 30% of our held-out rows, but 84-152% above fla's measured times (docs/kernels-results.md, "Where the
# time goes").
LAUNCH_US = 5.0
FITTED = ("c_issue", "c_glue_bytes")
CLOCK_MHZ = 1980.0  # H200 / H100 SXM boost clock: c_issue x CLOCK_MHZ = cycles per issued instruction
# how each tag's configuration is compiled (idattn.aot.sass env_opts: setters of idattn.ops.pallas.op, constants)
OPTIONS = {"save_states_off": {"set_save_states": False}, "serial_fwd": {"GPU_PARALLEL_FWD_MIN_T": 1 << 30}}


def key(tag, shape, T, L, mode) -> str:
    H, dh, M = shape
    return f"{tag}_{H}_{dh}_{M}_T{T}_L{L}_{mode}"


@dataclasses.dataclass
class KernelCost:
    name: str
    programs: int
    occupancy: int
    waves: int
    iterations: int
    barriers: int  # BAR.SYNC per program per iteration
    instructions: int  # per warp per iteration
    warps: int
    loop_bytes: int  # global bytes per program per iteration (loads + stores)
    once_bytes: int  # global bytes per program outside the loop
    macs: int  # tensor-core MACs per program per iteration

    def warps_per_scheduler(self) -> int:
        """Warps the busiest scheduler runs over the launch: the busiest SM takes ceil(programs / 132) programs
        (in one wave or several) and spreads their warps over its four schedulers, and a warp issues from one
        scheduler only. At 64 programs of 4 warps that is 1 (64 SMs busy, one warp on each scheduler), where
        spreading all the work over 528 schedulers would say half a warp: the model before 2026-12-07 (evening)
        did that, and so priced a launch that leaves SMs idle as if it filled them."""
        return -(-(-(-self.programs // SMS) * self.warps) // 4)

    def issue_slots(self) -> float:
        """Warp-instructions the busiest scheduler issues: iterations x instructions x warps_per_scheduler."""
        return float(self.iterations * self.instructions * self.warps_per_scheduler())

    def features(self) -> np.ndarray:
        """Coefficients of TERMS in this kernel's time (us per unit):
        c_launch   per launch;
        c_path     per iteration on the critical path (waves x iterations: one dependent iteration's latency);
        c_issue    per instruction slot of the busiest of the machine's 132 x 4 schedulers (``issue_slots``);
        c_bar      per barrier of one SM, all programs' barriers spread evenly over the SMs;
        c_bytes    per GB of global loads and stores (L2 / HBM) of all programs."""
        work = self.programs * self.iterations
        return np.array([1.0, self.waves * self.iterations, self.issue_slots(),
                         work * self.barriers / SMS,
                         (work * self.loop_bytes + self.programs * self.once_bytes) / 1e9, 0.0, 0.0])


def _pad(n: int) -> int:
    """A feature or mode width as the kernels pad it (a power of two, at least 16)."""
    return max(16, 1 << (int(n) - 1).bit_length())


def _groups_per(NC: int, rows: int) -> int:
    """Chunks per program of a chunk-parallel kernel over `rows` (B·H·feature blocks) rows (gpu._groups)."""
    return max(1, -(-NC * rows // BWD_TARGET_PROGRAMS))


def _occupancy(registers: int, warps: int, smem: int = 0) -> int:
    """Programs resident per SM: registers (allocated in units of 8 per thread), warps and shared memory."""
    regs = -(-int(registers) // 8) * 8
    return max(1, min(REGS_PER_SM // (32 * warps * regs), MAX_WARPS_PER_SM // warps, SMEM_PER_SM // max(1, smem)))


def launch_cost(name: str, kernel: dict, programs: int, iterations: int) -> KernelCost:
    """One launch priced from a kernel report (``idattn.aot.sass.kernel_report``) whose grid the caller knows and
    whose outermost loop is its chunk loop: the Mosaic GPU scan probe (``idattn.bench.mosaic_scan``, compiled by
    ``idattn.aot.mosaic_gpu``, which records the dynamic shared memory the kernel asks for: it, not the
    registers, can bound the programs per SM). Its TMA traffic is not in the byte counts; c_bytes is 0 anyway."""
    body, warps = kernel["loop"] or kernel["all"], int(kernel["warps"])
    occ = _occupancy(kernel["registers"], warps, kernel.get("smem_dynamic", 0) + kernel.get("smem_static", 0))
    loop_b = body["ldg_bytes"] + body["stg_bytes"]
    return KernelCost(name, programs, occ, -(-programs // (SMS * occ)), iterations, body["bar_sync"], body["total"],
                      warps, loop_b, 0, body["mma_macs"])


def kernel_costs(rep: dict) -> list[KernelCost]:
    """Per Triton launch of a collected configuration (idattn.aot.sass.compile_and_capture's report)."""
    H, dh, M, _, B, T, L = rep["case"]
    NC = T // L
    out = []
    for call in rep["calls"]:
        k = rep["kernels"].get(call["name"])
        if k is None:
            continue
        gx, gy, gz = call["grid"]
        warps = int(call["num_warps"])
        occ = _occupancy(k["registers"], warps)
        programs = gx * gy * gz
        block = rep.get("blocks", {}).get(call["name"])
        split = int((k.get("trips") or {}).get("split", 0))
        if call["name"].startswith(SERIAL) and "readout" not in call["name"]:
            iters = NC
        elif block and "readout" in call["name"]:  # (B, H, feature blocks x groups), the blocks from the plan
            iters = min(_groups_per(NC, B * H * (_pad(dh) // block)), NC)
        elif split:  # the backward's (B, H, groups x mode blocks), a program per mode block (recorded since 979b911)
            iters = min(_groups_per(NC, B * H * split), NC)
        else:  # the backward's (B, H, groups); a readout compiled before its plan was recorded: the first blocks
            # nb that reproduce the grid's z (ambiguous: gz = 512 / (B·H) for every nb, so this took nb = 1); a
            # group of `per` chunks runs min(per, NC) of them (the loop stops at the last chunk)
            iters = next((min(per, NC) for nb in (1, 2, 4, 8, 16) for per in [_groups_per(NC, B * H * nb)]
                          if nb * -(-NC // per) == gz), -(-NC // gz))
        body = k.get("loop_run") or k["loop"] or k["all"]  # one chunk iteration as it runs (inner loops' trips)
        rest = k.get("loop_run_rest")
        if split > 1 and rest:  # block 0's programs run `body`, the other blocks' their own copy (sass.top_loops)
            body = {f: (body.get(f, 0) + (split - 1) * rest.get(f, 0)) / split
                    for f in ("total", "bar_sync", "ldg_bytes", "stg_bytes", "mma_macs")}
        loop_b = body.get("ldg_bytes", 0) + body.get("stg_bytes", 0)
        all_b = k["all"].get("ldg_bytes", 0) + k["all"].get("stg_bytes", 0)
        out.append(KernelCost(call["name"], programs, occ, -(-programs // (SMS * occ)), iters, body["bar_sync"],
                              body["total"], warps, loop_b, max(0, all_b - loop_b) if k["loop"] else 0,
                              body["mma_macs"]))
    return out


# ------------------------------------------------------------------------------------------- fla, another design
# flash-linear-attention's chunk_simple_gla compiled deviceless by scripts/fla_sass.py (fla-core 0.6.0, Triton 3.6,
# sm_90a; every configuration fla's autotuner offers on Hopper), and its times on the same card from the anchor run
# (2026-11-30, H200, torch 2.11, bf16, H = 16, K = V = 128, 65,536 tokens, per-head decay g_gamma): a design the
# fit never saw. (T, forward ms, forward + backward ms)
FLA_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fla_kernels.json")
FLA_MEASURED = ((1024, 0.75, 3.29), (2048, 0.76, 3.31), (4096, 0.76, 3.33), (8192, 0.83, 3.46), (16384, 0.74, 3.43))
SMEM_PER_SM = 228 * 1024
# how each fla launch maps programs to work: "serial" (one program per (B, H, K block, V block) walks every chunk),
# "chunk_v" / "chunk_k" (one program per chunk and V / K block; its loop runs over the other feature's blocks)
FLA_LAYOUT = {"fla_fwd_h": "serial", "fla_bwd_h": "serial", "fla_bwd_dh": "serial", "fla_fwd_o": "chunk_v",
              "fla_bwd_dv": "chunk_v", "fla_bwd_dqkwg": "chunk_k"}


def fla_cost(name: str, variant: dict, T: int, heads: int = 16, k: int = 128, v: int = 128,
             chunk: int = 64) -> KernelCost:
    """One fla launch at sequence length T (65,536 tokens) in one of its compiled configurations."""
    cfg, kr = variant["config"], variant["kernel"]
    B, NT = TOKENS // T, T // chunk
    nk, nv = -(-k // cfg["BK"]), -(-v // cfg["BV"])
    layout = FLA_LAYOUT[name]
    programs = {"serial": nk * nv * B * heads, "chunk_v": nv * NT * B * heads, "chunk_k": nk * NT * B * heads}[layout]
    loop = kr["loop"] if kr["loop"] and kr["loop"]["total"] > 16 else None  # a 1-instruction loop is the exit pad
    iters = NT if layout == "serial" else ({"chunk_v": nk, "chunk_k": nv}[layout] if loop else 1)
    body = loop or kr["all"]
    warps = int(cfg["num_warps"])
    occ = _occupancy(kr["registers"], warps, int(kr.get("shared_triton", 0)))
    loop_b = body["ldg_bytes"] + body["stg_bytes"]
    all_b = kr["all"]["ldg_bytes"] + kr["all"]["stg_bytes"]
    return KernelCost(name, programs, occ, -(-programs // (SMS * occ)), iters, body["bar_sync"], body["total"],
                      warps, loop_b, max(0, all_b - loop_b) if loop else 0, body["mma_macs"])


def fla_predictions(c: np.ndarray, data: dict) -> list[dict]:
    """Per T and mode: the model's fla time for the configuration it rates fastest per launch (the autotuner
    keeps the fastest on the device) and for the slowest, beside the measured time."""
    rows = []
    for T, fwd_ms, fwdbwd_ms in FLA_MEASURED:
        for mode, ms in (("fwd", fwd_ms), ("fwdbwd", fwdbwd_ms)):
            lo = hi = 0.0
            for launch in data["launches"]:
                if mode == "fwd" and launch["part"] != "fwd":
                    continue
                us = [float(fla_cost(launch["name"], var, T).features() @ c) for var in launch["variants"]
                      if "kernel" in var]
                lo, hi = lo + min(us), hi + max(us)
            rows.append(dict(T=T, mode=mode, measured=ms, fastest=lo / 1000, slowest=hi / 1000,
                             error=lo / 1000 / ms - 1.0))
    return rows


# fla's kernels compiled at the 1.3B model's heads (H = 32, K = V = 64; scripts/fla_sass.py --shape 32,64,64): no
# device has run them, so what the model says of them is a prediction the target at (32, 64, 64) is read against
FLA_DATA_32_64_64 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fla_kernels_32_64_64.json")


def fla_predict(c: np.ndarray, data: dict, T: int) -> dict[str, float]:
    """{"fwd", "fwdbwd"}: the model's fla time (ms) at T for the shape its data were compiled at (`case`
    [H, K, V, ...]), each launch in the configuration the model rates fastest."""
    H, K, V = (int(x) for x in data["case"][:3])
    out = {"fwd": 0.0, "fwdbwd": 0.0}
    for launch in data["launches"]:
        us = min(float(fla_cost(launch["name"], var, T, H, K, V).features() @ c) for var in launch["variants"]
                 if "kernel" in var)
        out["fwdbwd"] += us / 1000
        if launch["part"] == "fwd":
            out["fwd"] += us / 1000
    return out


def fla_chosen(c: np.ndarray, data: dict, T: int) -> list[tuple[str, dict, KernelCost]]:
    """Per fla launch, the configuration the model rates fastest at T: (name, variant, its cost)."""
    out = []
    for launch in data["launches"]:
        var = min((v for v in launch["variants"] if "kernel" in v),
                  key=lambda v: float(fla_cost(launch["name"], v, T).features() @ c))
        out.append((launch["name"], var, fla_cost(launch["name"], var, T)))
    return out


def format_fla(c: np.ndarray, data: dict) -> str:
    """fla's measured times beside the model's, and its launches at T = 4096 read like ours."""
    per = ["", "fla's launches at T = 4096 in the configuration the model rates fastest (per iteration of one warp; "
           "a per-chunk kernel without a loop counts whole):", "",
           "| launch | BK, BV / warps / stages | regs / stack | smem KB | programs (occ.) | iterations | instr. "
           "| MMA | FP32 | int/addr | bar | model us |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, var, kc in fla_chosen(c, data, 4096):
        cfg, k = var["config"], var["kernel"]
        body = k["loop"] if k["loop"] and k["loop"]["total"] > 16 else k["all"]
        per.append(f"| {name} | {cfg['BK']}, {cfg['BV']} / {cfg['num_warps']} / {cfg['num_stages']} | "
                   f"{k.get('registers')} / {k.get('stack', 0)} | {k.get('shared_triton', 0) // 1024} | "
                   f"{kc.programs} ({kc.occupancy}) | {kc.iterations} | {body['total']} | {body['mma']} | "
                   f"{body['ffma'] + body['fmul/fadd']} | {body['int/addr']} | {body['bar_sync']} | "
                   f"{float(kc.features() @ c):.0f} |")
    lines = [f"fla chunk_simple_gla ({data.get('source', '?')}); measured: H200 2026-11-30 anchor run",
             "", "| T | mode | measured ms | model ms (fastest config) | model ms (slowest config) | error (fastest) |",
             "|---|---|---|---|---|---|"]
    for r in fla_predictions(c, data):
        lines.append(f"| {r['T']} | {r['mode']} | {r['measured']:.2f} | {r['fastest']:.2f} | {r['slowest']:.2f} | "
                     f"{100 * r['error']:+.0f}% |")
    return "\n".join(lines + per)


def features(rep: dict) -> np.ndarray:
    f = sum((kc.features() for kc in kernel_costs(rep)), np.zeros(len(TERMS)))
    xla = rep.get("xla") or {}
    f[TERMS.index("c_glue_op")] = float(xla.get("glue_ops") or 0)  # per XLA op around the kernels
    f[TERMS.index("c_glue_bytes")] = 2.0 * float(xla.get("glue_bytes") or 0) / 1e9  # per GB (written + read)
    return f


def fit(rows: list[tuple[np.ndarray, float]], free: tuple[str, ...] = TERMS,
        fixed: dict[str, float] | None = None) -> np.ndarray:
    """Non-negative constants (us) minimising the relative error over `rows` [(features, ms)] (an active-set
    least squares: a constant that comes out negative is fixed at 0 and the rest refitted). `free`: the terms
    fitted (the others are 0 unless `fixed` gives them a value, which is subtracted before the fit)."""
    fixed = fixed or {}
    cf = np.array([fixed.get(t, 0.0) for t in TERMS])
    cols = [TERMS.index(t) for t in free]
    A = np.array([f[cols] / (1000.0 * y) for f, y in rows])  # relative: (f·c)/(1000 y) - 1 -> 0, c in us
    b = np.array([1.0 - float(f @ cf) / (1000.0 * y) for f, y in rows])
    active = list(range(A.shape[1]))
    while True:
        c_act, *_ = np.linalg.lstsq(A[:, active], b, rcond=None)
        if (c_act >= 0).all():
            break
        active.pop(int(np.argmin(c_act)))
    c = cf.copy()
    c[[cols[i] for i in active]] = c_act
    return c


def fit_model(rows: list[tuple[np.ndarray, float]]) -> np.ndarray:
    """The model's constants: LAUNCH_US per launch, FITTED fitted, every other term 0."""
    return fit(rows, FITTED, {"c_launch": LAUNCH_US})


# XLA's elementwise passes around the kernels at the card's memory speed: about 80% of the H200's 4.8 TB/s, so
# 260 us per GB. The fitted c_glue_bytes is ~10x that: the fit rows cannot tell XLA's bytes from any other cost
# that only the forward + backward rows have (their glue is 0.55-0.61 GB, the forward rows' 0.01-0.07 GB), so
# the model is also fitted with this physical value held fixed, and the current kernels (whose three per-token
# factor passes add ~1.1 GB of glue) are predicted under both: the device decides between them.
HBM_GLUE_US_PER_GB = 260.0


def fit_hbm_glue(rows: list[tuple[np.ndarray, float]]) -> np.ndarray:
    """The model with XLA's bytes held at HBM_GLUE_US_PER_GB: c_issue fitted, c_launch = LAUNCH_US."""
    return fit(rows, ("c_issue",), {"c_launch": LAUNCH_US, "c_glue_bytes": HBM_GLUE_US_PER_GB})


def predict_ms(rep: dict, c: np.ndarray) -> float:
    return float(features(rep) @ c) / 1000.0


def breakdown(rep: dict, c: np.ndarray) -> list[dict]:
    """Per launch: its predicted us and how much of it each term is."""
    rows = []
    for kc in kernel_costs(rep):
        f = kc.features()
        rows.append(dict(name=kc.name, programs=kc.programs, occupancy=kc.occupancy, waves=kc.waves,
                         iterations=kc.iterations, barriers=kc.barriers, instructions=kc.instructions, macs=kc.macs,
                         us=float(f @ c), terms={t: float(f[i] * c[i]) for i, t in enumerate(TERMS)}))
    return rows


def load(path: str = DATA) -> dict:
    with open(path) as f:
        return json.load(f)


def evaluate(data: dict, fitter=fit_model) -> tuple[np.ndarray, list[dict]]:
    """Fit on the "fit" rows of MEASURED, predict every row: (constants, [{row, predicted, measured, error}]).
    `fitter`: fit_model (the model), or fit (v1: all seven terms free)."""
    fit_rows, out = [], []
    for tag, shape, T, L, mode, ms, role in MEASURED:
        rep = data.get(key(tag, shape, T, L, mode))
        if rep is not None and role == "fit":
            fit_rows.append((features(rep), ms))
    c = fitter(fit_rows)
    for tag, shape, T, L, mode, ms, role in MEASURED:
        rep = data.get(key(tag, shape, T, L, mode))
        pred = predict_ms(rep, c) if rep is not None else None
        out.append(dict(tag=tag, shape=shape, T=T, L=L, mode=mode, role=role, measured=ms, predicted=pred,
                        error=None if pred is None else pred / ms - 1.0))
    return c, out


def beside_measured(measured: list, data: dict | None = None) -> str:
    """A table of the model's prediction beside times measured now (``idattn.bench.op`` rows of impl "pallas":
    shape, T, mode, ms), for the device check (scripts/gpu_check.py): the constants are fitted on MEASURED's fit
    rows, so a row there is in-sample; every other row is a test of the model. Rows without collected kernel data
    say so."""
    try:
        data = load() if data is None else data
    except OSError as e:
        return f"(no model: {e})"
    c, _ = evaluate(data)
    c_hbm = evaluate(data, fit_hbm_glue)[0]  # the same rows decide between the two glue constants (HBM_GLUE_US_PER_GB)
    lines = ["| (H, d_h, M) | T | mode | kernels | measured ms (now) | model ms | error | model ms, XLA's bytes at HBM "
             "speed | error | compiled data |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in measured:
        if not r.impl.startswith("pallas") or not r.ms:
            continue
        # the 2026-12-04 form's rows are predicted from its own compiled data (fitted there: in-sample); the
        # current kernels' from the `now` data (sass collect --tag now), when collected
        old = "2026-12-04" in r.impl
        tag = "main" if old else "now"
        rep = data.get(key(tag, tuple(r.shape), r.T, 64, r.mode))
        preds = [None if rep is None else predict_ms(rep, k) for k in (c, c_hbm)]
        lines.append(f"| {tuple(r.shape)} | {r.T} | {r.mode} | {'2026-12-04' if old else 'current'} | {r.ms:.3f} | "
                     + "".join("no kernel data | - | " if p is None else f"{p:.3f} | {100 * (p / r.ms - 1):+.0f}% | "
                               for p in preds)
                     + f"{tag} ({'fit rows' if old else (rep or {}).get('commit', '-')}) |")
    return "\n".join(lines)


def format_now(c: np.ndarray, data: dict, tag: str = "now") -> str:
    """The current kernels' predicted times (compiled under `tag`) beside the 2026-12-04 kernels' (measured, and
    predicted by the same constants), for every target configuration; '' when none is collected."""
    measured = {(tuple(sh), T, m): ms for t, sh, T, L, m, ms, _ in MEASURED if t == "main"}
    c_hbm = evaluate(data, fit_hbm_glue)[0]
    lines = []
    for _, shape, T, L, mode, _ in target_rows(tag):
        now = data.get(key(tag, shape, T, L, mode))
        if now is None:
            continue
        old = data.get(key("main", shape, T, L, mode))
        ms = measured.get((tuple(shape), T, mode))
        lines.append(f"| {tuple(shape)} | {T} | {mode} | {'-' if ms is None else f'{ms:.2f}'} | "
                     f"{'-' if old is None else f'{predict_ms(old, c):.2f}'} | {predict_ms(now, c):.2f} | "
                     f"{predict_ms(now, c_hbm):.2f} | "
                     f"{len([x for x in now['calls'] if x.get('name')])} | {now.get('commit', '?')} |")
    if not lines:
        return ""
    head = f"Target: forward + backward <= {TARGET_MS} ms at (16, 128, 32). Model times are predictions."
    return "\n".join([head, "",
                      "| (H, d_h, M) | T | mode | 2026-12-04 kernels, measured ms (H200) | 2026-12-04 kernels, model "
                      "ms | current kernels, model ms | current kernels, model ms with XLA's bytes at HBM speed | "
                      "launches | compiled at |", "|---|---|---|---|---|---|---|---|---|"]
                     + lines)


def format_table(c: np.ndarray, rows: list[dict]) -> str:
    lines = [f"Constants (us; c_launch = {LAUNCH_US:g} fixed, {' and '.join(FITTED)} fitted on the 'fit' rows): "
             + ", ".join(f"{t} = {v:.4g}" for t, v in zip(TERMS, c) if v)
             + f" (c_issue: {c[TERMS.index('c_issue')] * CLOCK_MHZ:.1f} cycles per issued warp-instruction)",
             "", "| row | (H, d_h, M) | T | chunk | mode | role | measured ms (H200, 2026-12-04) | model ms | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pred = "-" if r["predicted"] is None else f"{r['predicted']:.2f}"
        err = "-" if r["error"] is None else f"{100 * r['error']:+.0f}%"
        lines.append(f"| {r['tag']} | {tuple(r['shape'])} | {r['T']} | {r['L']} | {r['mode']} | {r['role']} | "
                     f"{r['measured']:.2f} | {pred} | {err} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m idattn.bench gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DATA, help="collected kernel facts (python -m idattn.aot.sass collect)")
    ap.add_argument("--fla", default=FLA_DATA, help="fla's kernels compiled deviceless (scripts/fla_sass.py)")
    ap.add_argument("--breakdown", default="", help="a row key (e.g. main_16_128_32_T4096_L64_fwdbwd): per kernel")
    a = ap.parse_args(argv)
    if not os.path.exists(a.data):
        print(f"error: {a.data} not found: run `python -m idattn.aot.sass collect --out {a.data}` (a CPU host with "
              f"the cuda12 extra and triton)")
        return 1
    data = load(a.data)
    c, rows = evaluate(data)
    print(format_table(c, rows))
    held = [abs(r["error"]) for r in rows if r["role"] == "held-out" and r["error"] is not None]
    if held:
        print(f"\nheld-out rows: mean |error| {100 * np.mean(held):.0f}%, max {100 * max(held):.0f}% "
              f"({sum(e <= 0.30 for e in held)} of {len(held)} within 30%)")
    c_h, rows_h = evaluate(data, fit_hbm_glue)
    err_h = [abs(r["error"]) for r in rows_h if r["error"] is not None]
    held_h = [abs(r["error"]) for r in rows_h if r["role"] == "held-out" and r["error"] is not None]
    print(f"\nwith XLA's bytes at HBM speed (c_glue_bytes = {HBM_GLUE_US_PER_GB:g} fixed, c_issue = "
          f"{c_h[TERMS.index('c_issue')]:.4g} fitted): every row within {100 * max(err_h):.0f}%, held-out within "
          f"{100 * max(held_h):.0f}%")
    now = format_now(c, data)
    if now:
        print("\n" + now)
    if os.path.exists(a.fla):
        fla = load(a.fla)
        print("\n" + format_fla(c, fla))
        c1, rows1 = evaluate(data, fit)
        held1 = [abs(r["error"]) for r in rows1 if r["role"] == "held-out" and r["error"] is not None]
        err1 = [r["error"] for r in fla_predictions(c1, fla)]
        print(f"\nv1 (all seven terms fitted: c_launch {c1[0]:.0f} us, c_bytes {c1[TERMS.index('c_bytes')]:.0f} "
              f"us/GB): held-out rows within {100 * max(held1):.0f}%, fla {100 * min(err1):+.0f}% to "
              f"{100 * max(err1):+.0f}%")
    if os.path.exists(FLA_DATA_32_64_64):
        fla64 = fla_predict(c, load(FLA_DATA_32_64_64), 4096)
        fla64_h = fla_predict(c_h, load(FLA_DATA_32_64_64), 4096)
        ours = [predict_ms(data[k], x) for k in [key("now", (32, 64, 64), 4096, 64, "fwdbwd")] if k in data
                for x in (c, c_h)]
        print(f"\nfla at (32, 64, 64), T = 4096, 65,536 tokens (compiled deviceless; model, fastest configuration): "
              f"forward {fla64['fwd']:.2f} ms, forward + backward {fla64['fwdbwd']:.2f} ms "
              f"({fla64_h['fwdbwd']:.2f} with XLA's bytes at HBM speed)"
              + (f"; the current kernels {ours[0]:.2f} / {ours[1]:.2f} ms: {ours[0] / fla64['fwdbwd']:.1f}x / "
                 f"{ours[1] / fla64_h['fwdbwd']:.1f}x fla's (target: 1.2x)" if ours else ""))
    if a.breakdown:
        rep = data[a.breakdown]
        print(f"\n{a.breakdown} (model ms {predict_ms(rep, c):.2f}; a prediction unless a row above measured it):")
        for b in breakdown(rep, c):
            print(f"  {b['name']:<22} programs {b['programs']:>5} occ {b['occupancy']} waves {b['waves']:>2} "
                  f"iters {b['iterations']:>3} barriers {b['barriers']:>3} instr {b['instructions']:>5}: "
                  f"{b['us']:>7.0f} us (" + ", ".join(f"{t} {v:.0f}" for t, v in b["terms"].items() if v) + ")")
    return 0 if math.isfinite(float(np.sum(c))) else 1
