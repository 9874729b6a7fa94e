"""GPU kernels (Pallas, Triton lowering): one program per (batch row, head, feature block or chunk group), an
in-kernel ``fori_loop`` over chunks with the state carried in registers.

Refs are whole arrays (no BlockSpec): each program computes its own pointers with ``pl.ds``, which lets a block
be a strided slice of the natural ``[B, T, H, N]`` layout (no transposes in HBM) and lets the loop walk the
time axis. Layouts (all prepared by ``idattn.ops.pallas.op``):

    fq, zk [B, T, H, R]; zv, do [B, T, H, D]         inputs (bf16 or f32), T a multiple of L
    p, w, dw, dp [B, T, H, 2, M]  (mdt)               per-token mode vectors as (re, im) planes; fwd_p writes p as
                                                      [n, B, T, H, 2, M], n partial sums over its feature blocks
                                                      (``MAX_STATE``), which fwd_mix adds
    kmix [H, 2, M, M] float32                         the mode mixing K = cᴴc (conj) or cᵀc, (re, im) planes
    tables: sp [H, 2, L, M]; lam^(mu+1), lam^mu, b [H, 2, 1, M]; laml [H, 2, M, 1]
    states [B, H, 2, M, N] float32; per-chunk states [B, H, NC, 2, M, N] (``sdt``: the compute dtype)
    start [B, T] int32 (doc_starts); cm, em [B, T, 1] float32; keep [B, NC] float32   (only with segment ids)
    parameter sums per chunk: rows [B, H, NC, 4, 1, M], cols [B, H, NC, 2, M, 1] float32

Kernels, in order: fwd_p (fq, zk -> p), fwd_mix (p -> w = s·K, s = conj(p) or p; the sum of p's partials; and
fwd_o's per-token factors q, u [B, T, H, 4, M] when op.GPU_FUSED_FACTORS), fwd_o (q, u or w, zv -> o); from
op.GPU_PARALLEL_FWD_MIN_T the forward is scan_fwd, the chunk-parallel readouts and fwd_mix instead; backward: [scan_fwd,] scan_rev and the chunk-parallel bwd_o (-> dw, dzv) per half, bwd_mix
(dw -> dp, dK) between them, bwd_p (dp -> dfq, dzk). The mixing has kernels of its own on both sides: inside
fwd_o / bwd_o its [L, M] x [M, M] products pushed those programs past the register file. Between any two kernels
only mode vectors cross HBM, in the compute dtype (no XLA pass over them).

Feature blocks: fwd_o and the scans split their feature axis (R or D) into programs for free (feature columns
are independent); fwd_p splits only as far as ``MAX_STATE`` and shared memory ask (partial p sums for fwd_mix);
the backward kernels keep whole features per program and walk them in sub-blocks (``MAX_TILE``) and the modes in
blocks (``MODE_BLOCK``). ``choose`` picks the blocks and the Triton tuning from the shapes and the card's shared
memory per block (``smem_estimate``).
"""
from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from idattn.ops.pallas import _chunk as C

F32 = jnp.float32


class TritonUnavailable(RuntimeError):
    """This jax has no Pallas Triton backend (removed after its deprecation; Mosaic GPU cannot lower these
    kernels). ``idattn.ops`` catches it on the dispatch path and runs the XLA chunked operator instead."""


def triton_params_class():
    """jax.experimental.pallas.triton.CompilerParams, or None when this jax has no Triton backend."""
    try:
        from jax.experimental.pallas import triton as pltr  # noqa: PLC0415 a probe: newer jax dropped this backend
        return pltr.CompilerParams
    except Exception:  # Triton backend removed from this jax
        return None


def _compiler_params(num_warps, num_stages):
    cls = triton_params_class()
    if cls is None:
        # Without explicit Triton parameters Pallas would hand the kernel to Mosaic GPU (jax >= 0.10 defaults
        # jax_pallas_use_mosaic_gpu on), which cannot lower these kernels: refuse here, never silently.
        raise TritonUnavailable(
            f"jax {jax.__version__} has no Pallas Triton backend (jax.experimental.pallas.triton); the GPU kernels "
            f"need it (docs/kernels.md, 'JAX versions'): use impl='chunked', or jax <= 0.10.x")
    return cls(num_warps=num_warps, num_stages=num_stages)


# (num_warps, num_stages) per kernel kind, the defaults ``choose`` starts from. 8 warps everywhere: a program's
# live tiles (the [2, M, N] state, the [L, M] tables, [L, L] and [L, N] products) then spread over 256 threads,
# which the deviceless sm_90a compile measured as fewer spills than 4 warps for every forward and scan kernel
# (docs/kernels-results.md, "What the compiled kernels use"). num_stages > 1 lets Triton prefetch the next chunk's loads
# inside the fori_loop; ``choose`` lowers it to 1, then halves the feature block, until the kernel's
# shared-memory estimate fits the card. The backward kernels start at 1 stage: they read each table at every
# use (LoadTabs), and pipelining those loads would multiply their buffers (a bf16 bwd_p at M = 64 asked for
# 266 KiB at 2 stages). The M = 32 forward ("fwd") also runs at 1 stage: at (16, 128, 32) bf16 fwd_o held 28 B
# of spills per thread at 2 stages and none at 1.
# The scans run 4 warps (2026-12-06): their loop issues about the same instructions per warp at 2, 4 or 8 warps
# (the [M, N] tile of a program is small, and Triton lays a dot's rows over every warp, so above what the tile
# fills the warps repeat each other's work), so 8 warps doubled the issued instructions of 4 (compiled for sm_90a,
# (16, 128, 32) bf16, T = 16K: 427 / 414 / 432 instructions per warp at 8 / 4 / 2 warps; at T = 4K 593 / 830 at
# 8 / 4). Not 2: with about two programs per SM that leaves one warp per scheduler, a latency regime no measured
# row covers (fla's state pass runs 4 warps there).
# The chunk-parallel readouts (fwd_p_readout, fwd_o_readout: no state carried across their loop) run 4 warps at
# one stage for M < 64: compiled for sm_90a at (16, 128, 32) bf16, T = 4K, 903 / 426 instructions per warp
# against 664 / 425 at 8 warps, without spills. At M = 64 fwd_p_readout spilled at 4 warps (94 B per thread at
# (32, 64, 64)) and takes the serial forward's tuning there ("fwd_big"); fwd_o_readout runs 4 warps at every M
# ((32, 64, 64): 489 instructions against 516 at 8 warps, 198 registers, no spills).
TUNING = {"fwd": (8, 1), "fwd_big": (8, 2), "scan": (4, 2), "bwd": (8, 1), "readout": (4, 1)}
# The largest [L, N] tile (L x feature block, in elements) a program of a kind holds per chunk: bounds the
# registers (ptxas spills past 255 per thread) independently of shared memory. None: no bound. The backward
# kernels walk their features in sub-blocks (no partial sums), so a 64 x 64 tile costs them nothing but loop
# trips: at (16, 128, 32) bf16 it cut bwd_p's spills from 1006 to 612 B and bwd_o's from 2334 to 1540 B.
# Keys: a tuning kind, or a kernel kind, which takes precedence. fwd_o and scan_rev split their features across
# programs for free: fwd_o at 64 wide since it reads its per-token factors formed in XLA (op.GPU_PRESCALED_MODES;
# at 32 wide before, when it formed them: bf16 (32, 64, 64) spilled 524 -> 236 B; at (16, 128, 32) bf16 the
# 64-wide loop is 776 instructions for two 32-wide blocks' 2 x 822, none spilled; 128 wide spills) and scan_rev
# at 64 (d_h = 96 padded to 128: two programs instead of one).
# The backward's sub-blocks are 64 wide since 2026-12-06 (64 x 32 before): with the FMAs and masks as inline PTX
# fewer values are live, and each sub-block trip costs its loop body again (bf16 (16, 128, 32) T = 4K, one chunk
# iteration as it runs: bwd_o 2,306 -> 1,792, bwd_p 2,607 -> 2,051 instructions, no spills); BWD_MIN_SUBS keeps
# two sub-blocks at least.
MAX_TILE = {"fwd": None, "fwd_big": None, "scan": None, "bwd": 64 * 64, "fwd_o": 64 * 64, "scan_rev": 64 * 64}
# The backward kernels walk at least this many feature sub-blocks: with one, the sub-block body is straight-line
# code whose values live across both phases (bf16 (32, 64, 64), one 64-wide block: 80 / 88 B of spills per thread
# in bwd_o / bwd_p; two of 32: none).
BWD_MIN_SUBS = 2
# The largest [M, N] state block (modes x feature block, in elements) a program of a kind carries across its
# chunk loop in registers (two float32 planes). fwd_p at M = 64 with d_h = 96 padded to 128 spilled 12 B per
# thread holding [2, 64, 128]; with two feature blocks of 64 it holds none, and fwd_mix adds the two partial
# sums of p (no XLA pass). fwd_o at M = 64 with its 64-wide tile held [2, 64, 64] and spilled 104 B per thread
# (bf16 (32, 64, 64) and (16, 96, 64)); at 32 wide, none (M = 32 keeps its 64-wide block).
# scan_fwd at 4 warps (TUNING) held [2, 64, 128] with 25 B of spills per thread at (16, 96, 64) bf16; at 64 x 64
# none.
MAX_STATE = {"fwd_p": 64 * 64, "fwd_o": 64 * 32, "scan_fwd": 64 * 64}
# The serial scans (scan_fwd, scan_rev) split their features into blocks until about this many programs run (B·H
# times the blocks): fewer leave SMs idle, more give each program a narrower state tile to walk its chunks with
# (more instructions per element). 128 (about one program per SM of an H100 / H200) since 2026-12-07; 256 before.
# It matters only where B·H < 256 (T = 8K and 16K at 65,536 tokens): compiled for sm_90a, bf16 (16, 128, 32) 16K,
# scan_fwd [32, 64] tiles at 243 instructions per chunk against two [32, 32] programs' 2 x 153, scan_rev 395
# against 2 x 232, no spills (docs/kernels-results.md, "Built since: the 16K scans at one program per SM").
SCAN_TARGET_PROGRAMS = 128

# Opt-in shared memory per block by compute capability (CUDA programming guide, "Technical Specifications").
SMEM_BY_CC = {"8.0": 163 * 1024, "8.6": 99 * 1024, "8.7": 163 * 1024, "8.9": 99 * 1024, "9.0": 227 * 1024,
              "10.0": 227 * 1024, "12.0": 99 * 1024}
SMEM_DEFAULT = 227 * 1024  # H100 / H200 (the deviceless targets); IDATTN_GPU_SMEM_BYTES overrides


def smem_limit() -> int:
    """Shared memory per block the kernels may plan for: IDATTN_GPU_SMEM_BYTES, else the local GPU's compute
    capability (SMEM_BY_CC), else 227 KiB (sm_90: the H100 / H200 that deviceless compiles target)."""
    env = os.environ.get("IDATTN_GPU_SMEM_BYTES")
    if env:
        return int(env)
    try:
        for d in jax.local_devices():
            cc = getattr(d, "compute_capability", None)
            if d.platform == "gpu" and cc:
                return SMEM_BY_CC.get(str(cc), SMEM_DEFAULT)
    except Exception:  # pragma: no cover
        pass
    return SMEM_DEFAULT


# ----------------------------------------------------------------------------------------------------------------
# the plan: blocks and tuning from the shapes and the shared-memory limit


def smem_estimate(kind, *, L, M, N, in_bytes, mode_bytes, state_bytes, stages, has_k=False):
    """Shared memory (bytes) for one program of a kernel kind, as a bound: every tile a chunk iteration loads
    (N = the feature block or sub-block), times the pipeline's stages, plus the wide float32 dot operands once
    more (Triton's IEEE fp32 dots stage their operands through shared memory for the FMA layout).
    Fitted as a bound on the deviceless sm_90a compile (Triton's own allocation, logged by XLA) at the paper's
    head shapes in both dtypes: at or above every measured kernel (docs/kernels.md, "Blocks from the shapes"),
    and the kernels it admits compile (tests/test_aot_gpu.py). A newer Triton may allocate differently:
    ``scripts/gpu_check.py``'s probe checks on the device."""
    tab = 2 * L * M * 4                                   # sp planes (float32)
    modes = 2 * L * M * mode_bytes                        # p / dp of one chunk
    tok = L * N * in_bytes                                # one [L, N] input tile
    state = 2 * M * N * state_bytes                       # one [2, M, N] per-chunk state
    loads = {"fwd_p": 2 * tok + tab, "fwd_o": tok + modes + tab, "scan_fwd": tok + tab,
             "scan_rev": tok + modes + tab, "bwd_p": 2 * tok + modes + 2 * state + tab,
             "bwd_o": 2 * tok + modes + 2 * state + tab}
    if kind not in loads:
        raise ValueError(f"unknown kernel kind {kind!r}; one of {sorted(loads)}")
    wide = {"fwd_p": 2 * tok, "fwd_o": tok, "scan_fwd": tok, "scan_rev": tok, "bwd_p": 2 * tok + 2 * state,
            "bwd_o": 2 * tok + 2 * state}  # the [L, N] / [M, N] dot operands
    est = loads[kind] * stages
    if stages > 1:  # the pipeline also buffers every table the kernel loads per chunk (LoadTabs: one load per use)
        est += (TABLE_LOADS[kind] - 1) * tab * stages
    if in_bytes >= 4:  # float32: the wide operands and, in the backward, the [L, L] and [L, M] products again
        est += wide[kind] + ((L * L + 2 * L * M) * 4 if kind.startswith("bwd") else 0)
    return est


# [L, M] table pairs a chunk iteration of each kernel loads (LoadTabs; counted from _chunk.py's uses): with
# num_stages > 1 Triton's pipeliner gives each its own shared-memory buffers.
TABLE_LOADS = {"fwd_p": 4, "fwd_o": 4, "scan_fwd": 1, "scan_rev": 1, "bwd_p": 7, "bwd_o": 8}


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    block: int          # feature block
    num_warps: int
    num_stages: int
    smem: int           # smem_estimate at that choice


def _tuning_kind(kind, M):
    if kind == "fwd_o_readout" or (kind.endswith("_readout") and M < 64):
        return "readout"
    if kind.removesuffix("_readout") in ("fwd_p", "fwd_o"):
        return "fwd" if M < 64 else "fwd_big"
    return "scan" if kind.startswith("scan") else "bwd"


def choose(kind, *, n, bh, L, M, in_bytes, mode_bytes, state_bytes, limit, target_programs=256, min_block=32,
           has_k=False) -> KernelPlan:
    """The kernel's feature block and tuning: the widest power-of-two block that still gives about
    ``target_programs`` programs, capped at ``MAX_TILE`` and ``MAX_STATE``; then, while the shared-memory
    estimate exceeds ``limit``, one pipeline stage instead of two, then half the block (down to 16). Refuses,
    naming the shape, the bytes and the limit, when nothing fits."""
    nb = 1
    while bh * nb < target_programs and n % (2 * nb) == 0 and n // (2 * nb) >= min_block:
        nb *= 2
    block = n // nb
    tk = _tuning_kind(kind, M)
    warps, stages = TUNING[tk]
    kind = kind.removesuffix("_readout")  # a readout's tiles (blocks, shared memory) are its serial kernel's
    tk = _tuning_kind(kind, M)
    cap = MAX_TILE.get(kind, MAX_TILE.get(tk))
    while cap is not None and L * block > cap and block > 16 and block % 2 == 0:
        block //= 2
    cap = MAX_STATE.get(kind)
    while cap is not None and M * block > cap and block > 16 and block % 2 == 0:
        block //= 2
    while kind in ("bwd_o", "bwd_p") and n // block < BWD_MIN_SUBS and block > 16 and block % 2 == 0:
        block //= 2
    kw = dict(L=L, M=M, in_bytes=in_bytes, mode_bytes=mode_bytes, state_bytes=state_bytes, has_k=has_k)
    while True:
        est = smem_estimate(kind, N=block, stages=stages, **kw)
        if est <= limit:
            return KernelPlan(block, warps, stages, est)
        if stages > 1:
            stages = 1
        elif block > 16 and block % 2 == 0:
            block //= 2
        else:
            raise ValueError(
                f"GPU kernel {kind}: no feature block fits at L={L}, M={M}, feature width {n}: the smallest "
                f"(block {block}, 1 stage) needs ~{est} B of shared memory, the card allows {limit} B per block; "
                f"use a smaller chunk_size (e.g. {max(16, L // 2)}) or impl='chunked'")


# idattn.bench.per_kernel sets a list here while it traces the operator: every launch built below is appended as
# (name, callable, [operand ShapeDtypeStructs], grid), so each can be timed alone on a device
LAUNCH_RECORDER: list | None = None


# $0 = $1·$2 + $3·$4, and $1·$2 - $3·$4 (the negation folds into ptxas's FMUL): one FMUL and one FFMA
_DOT2_ASM = {False: "{ .reg .f32 t; mul.rn.f32 t, $3, $4; fma.rn.f32 $0, $1, $2, t; }",
             True: "{ .reg .f32 t; mul.rn.f32 t, $3, $4; neg.f32 t, t; fma.rn.f32 $0, $1, $2, t; }"}
# with an accumulator $5: $0 = $1·$2 ± $3·$4 + $5, two FFMA
_DOT2_ACC_ASM = {False: "{ .reg .f32 t; fma.rn.f32 t, $3, $4, $5; fma.rn.f32 $0, $1, $2, t; }",
                 True: "{ .reg .f32 t, n; neg.f32 n, $4; fma.rn.f32 t, $3, n, $5; fma.rn.f32 $0, $1, $2, t; }"}


def _ptx_dot2(a, b, c, d, sub, acc=None):
    """a·b ± c·d as inline PTX, one multiply and one fused multiply-add (C.dot2 inside the kernels lowered for
    Triton, which ptxas would otherwise compile to two multiplies and an add); float32 only, other dtypes
    plainly. Compiled for sm_90a at (16, 128, 32) bf16 T = 4K this took 30-60 instructions off each loop
    iteration (docs/kernels-results.md, "Built since: fused multiply-adds")."""
    from jax.experimental.pallas import triton as pltr  # noqa: PLC0415 only where the Triton backend lowers
    xs = (a, b, c, d) + (() if acc is None else (acc,))
    if any(jnp.result_type(x) != F32 for x in xs):
        out = a * b - c * d if sub else a * b + c * d
        return out if acc is None else acc + out
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for x in xs))
    args = [jnp.broadcast_to(jnp.asarray(x, F32), shape) for x in xs]
    asm = (_DOT2_ASM if acc is None else _DOT2_ACC_ASM)[bool(sub)]
    return pltr.elementwise_inline_asm(asm, args=args, constraints="=f" + ",f" * len(xs), pack=1,
                                       result_shape_dtypes=[jax.ShapeDtypeStruct(shape, F32)])[0]


# Whether gpu._call traces kernels with the inline PTX (C.dot2, Masks.apply): NVIDIA only. op._gpu_branch turns it
# off while it traces the ROCm branch (Triton's AMD backend takes no PTX); ``inline_ptx``.
INLINE_PTX = True


class inline_ptx:  # noqa: N801 a context manager, used like a function
    """``with gpu.inline_ptx(False):`` traces the kernels without inline PTX (plain jnp arithmetic)."""

    def __init__(self, enabled: bool):
        self.enabled = bool(enabled)

    def __enter__(self):
        global INLINE_PTX
        self.prev, INLINE_PTX = INLINE_PTX, self.enabled
        return self

    def __exit__(self, *exc):
        global INLINE_PTX
        INLINE_PTX = self.prev
        return False


def _with_fma(kernel):
    """kernel, traced with C.dot2 as inline PTX (pallas_call traces the body when it is called)."""
    def traced(*refs):
        prev, C.DOT2 = C.DOT2, _ptx_dot2
        try:
            return kernel(*refs)
        finally:
            C.DOT2 = prev
    return traced


def _call(kernel, out_shape, grid, interpret, plan: KernelPlan | None, name):
    kw = {}
    if not interpret and plan is not None:
        kw["compiler_params"] = _compiler_params(plan.num_warps, plan.num_stages)
    if not interpret and INLINE_PTX:
        kernel = _with_fma(kernel)
    f = pl.pallas_call(kernel, out_shape=out_shape, grid=grid, interpret=interpret, name=f"idattn_{name}", **kw)
    if LAUNCH_RECORDER is None:
        return f
    recorder = LAUNCH_RECORDER

    def recorded(*args):
        recorder.append((f"idattn_{name}", f, [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args],
                         tuple(int(g) for g in grid)))
        return f(*args)
    return recorded


# table refs per kernel: sp, pt, pin, ep, ps, pe [H, 2, L, M], lamL [H, 2, M, 1], lam^(mu+1), lam^mu, b [H, 2, 1, M]
NTAB = 10


def expand_tables(tabs):
    """op.py's (sp, lam^(mu+1), lam^mu, lamL, b) -> the ten tables the GPU kernels read (sp, pt, pin, ep, ps,
    pe [H, 2, L, M], lamL [H, 2, M, 1] and the rows lam^(mu+1), lam^mu, b [H, 2, 1, M]), built once per program
    in XLA (a few KB per head)."""
    if len(tabs) == NTAB:
        return tabs
    sp, lmu1, lmu, laml, b = tabs
    two = lambda t: (t[:, 0], t[:, 1])  # noqa: E731
    tb = C.Tabs(two(sp), two(lmu1), two(lmu), two(laml), two(b))
    st = lambda t: jnp.stack(t, axis=1)  # noqa: E731
    return (sp, st(tb.pt), st(tb.pin), st(tb.ep), st(tb.ps), st(tb.pe), laml, lmu1, lmu, b)


class LoadTabs:
    """A head's tables read from their refs at every use (each property access is a fresh load): a table is
    then live only around the ops that use it, instead of for the whole chunk (registers: six [L, M] pairs of
    float32 planes would take most of a program's register file at L = M = 64). ``ms``: a mode block
    (``pl.ds``) to read instead of all M modes."""

    _IDX = {"sp": 0, "pt": 1, "pin": 2, "ep": 3, "ps": 4, "pe": 5, "laml": 6, "lmu1": 7, "lmu": 8, "b": 9}

    def __init__(self, refs, h, ms=None, flat_rows=False, held=None):
        self._refs, self._h, self._ms, self._flat, self._held = refs, h, ms, flat_rows, held or {}

    def __getattr__(self, name):
        if name in self._held:
            return self._held[name]
        i = LoadTabs._IDX.get(name)
        if i is None:
            raise AttributeError(name)
        r, h = self._refs[i], self._h
        ms = slice(None) if self._ms is None else self._ms
        if name == "laml":  # [H, 2, M, 1]: modes along the rows
            return (r[h, 0, ms, :], r[h, 1, ms, :])
        if self._flat and name in ("lmu1", "lmu", "b"):  # [H, 2, 1, M] rows as [M] vectors (see C.Acc)
            return (r[h, 0, 0, ms], r[h, 1, 0, ms])
        return (r[h, 0, :, ms], r[h, 1, :, ms])


def _tabs(tab_refs, h, ms=None, flat_rows=False, held=None):
    return LoadTabs(tab_refs, h, ms, flat_rows, held)


def _masked_load(ref, keep, shape):
    """ref[...] ([r, n] = `shape`) where keep > 0, else 0; keep a row vector [r, 1] or a scalar, broadcast to
    `shape`. Triton's masked load: the masked-off elements are not read, so the mask costs no multiply or select
    on the loaded tile."""
    from jax.experimental.pallas import triton as pltr  # noqa: PLC0415 only where the Triton backend lowers
    return pltr.load(ref, mask=jnp.broadcast_to(keep > 0, shape), other=0)


def _pin_cm(tab_refs, h, mk, L, M):
    """cm·pin [L, M] planes (float32) as a masked load: the rows of tokens that may not read the carried state
    (cm = 0) read zeros, so the row mask costs no multiply; pin itself when there are no segments."""
    tb = LoadTabs(tab_refs, h)
    if mk.cm is None:
        return tb.pin
    ref = tab_refs[LoadTabs._IDX["pin"]]
    return tuple(_masked_load(ref.at[h, jnp.int32(k)], mk.cm, (L, M)) for k in (0, 1))


def _held_operands(tab_refs, h, names, cdt):
    """{name: planes in the compute dtype}: tables that the chunk loop uses only as dot operands, loaded and cast
    once per program before the loop (loop-invariant; the loop then neither re-reads nor re-casts them)."""
    tb = LoadTabs(tab_refs, h)
    return {n: tuple(p.astype(cdt) for p in getattr(tb, n)) for n in names}


def doc_starts(doc, L):
    """op.py's document index doc [B, T] (T a multiple of L) -> s [B, T] int32: the chunk-local index of the first
    token of each token's document within its chunk (0 when the document began in an earlier chunk). Documents are
    contiguous, so within a chunk token j is in token i's document and not after it exactly when s_i <= j <= i:
    the kernels' mask is then two compares against a row vector instead of an [L, L] comparison of doc ids in
    two layouts."""
    B, T = doc.shape
    dc = doc.reshape(B, T // L, L)
    k = lax.broadcasted_iota(jnp.int32, dc.shape, 2)
    first = jnp.concatenate([jnp.ones_like(dc[..., :1], bool), dc[..., 1:] != dc[..., :-1]], axis=-1)
    return lax.cummax(jnp.where(first, k, 0), axis=2).reshape(B, T)


# $0 = $1 where $2 >= $3 (i >= j), and with the document start $4 also $3 >= $4, else +0
_SELECT_ASM = {False: "{ .reg .pred q; setp.ge.s32 q, $2, $3; selp.f32 $0, $1, 0f00000000, q; }",
               True: "{ .reg .pred p, q; setp.ge.s32 p, $3, $4; setp.ge.and.s32 q, $2, $3, p; "
                     "selp.f32 $0, $1, 0f00000000, q; }"}


def _ptx_select(x, L, s=None):
    """C.Masks.apply inside the kernels lowered for Triton: x [L, L] float32 where i >= j (and j >= s_i with the
    document starts s, doc_starts), else 0, as inline PTX: two compares and a select per element. Written as
    jnp.where, LLVM narrows the select through the bf16 cast that follows (a dot operand), so each element was
    unpacked, selected and repacked (PRMT, SEL, PRMT), and the mask's predicates were parked bit by bit in a
    register (two LOP3 each) between its two uses; compiled for sm_90a, (16, 128, 32) bf16 T = 4K, this took
    bwd_o's loop from 1,281 to 1,175 instructions and fwd_o_readout's from 406 to 359."""
    from jax.experimental.pallas import triton as pltr  # noqa: PLC0415 only where the Triton backend lowers
    if x.dtype != F32:
        return jnp.where(C.causal_mask(L, start=s), x, 0.0)
    i = lax.broadcasted_iota(jnp.int32, (L, L), 0)
    j = lax.broadcasted_iota(jnp.int32, (L, L), 1)
    args = [x, i, j] + ([] if s is None else [jnp.broadcast_to(s[:, None], (L, L))])
    cons = "=f,f,r,r" + ("" if s is None else ",r")
    return pltr.elementwise_inline_asm(_SELECT_ASM[s is not None], args=args, constraints=cons, pack=1,
                                       result_shape_dtypes=[jax.ShapeDtypeStruct((L, L), F32)])[0]


def _masks(seg_refs, bi, c, t0, L, asm=True):
    """The chunk's Masks; ``asm``: Masks.apply as _ptx_select when lowering for Triton (else jnp.where)."""
    asm = asm and C.DOT2 is not None
    if seg_refs is None:
        return C.Masks(C.causal_mask(L), select=(lambda x: _ptx_select(x, L)) if asm else None)
    start, cm, em, keep = seg_refs
    s = start[bi, pl.ds(t0, L)]
    return C.Masks(C.causal_mask(L, start=s), cm[bi, pl.ds(t0, L), :], em[bi, pl.ds(t0, L), :], keep[bi, c],
                   select=(lambda x: _ptx_select(x, L, s)) if asm else None)


def _split(refs, n_in, seg):
    """refs = inputs (n_in, of which the last 4 are segment refs when seg) + outputs."""
    ins, outs = refs[:n_in], refs[n_in:]
    if seg:
        return ins[:-4], ins[-4:], outs
    return ins, None, outs


def _modes(ref, bi, ts, h, ms=None):
    """A mode tensor [B, T, H, 2, M] at (row, chunk, head): float32 planes [L, M] (or [L, mb]: mode block ms)."""
    ms = slice(None) if ms is None else ms
    return ref[bi, ts, h, 0, ms].astype(F32), ref[bi, ts, h, 1, ms].astype(F32)


def _kmat(k_ref, h):
    return None if k_ref is None else (k_ref[h, 0], k_ref[h, 1])


# ----------------------------------------------------------------------------------------------------------------
# forward: fused readout + carry


def fwd_p(fq, zk, tabs, x0, segs, *, L, plan, cdt, mdt, interpret, save_sdt=None, states=None):
    """p [nRB, B, T, H, 2, M] (mdt; partial sums over feature blocks) and Xk_T [B, H, 2, M, R]; with
    ``save_sdt`` also the states before every chunk xs [B, H, NC, 2, M, R] (dtype save_sdt) for the backward.

    ``states`` (xs from ``scan_fwd``; x0 is then unused): the chunk-parallel readout - every chunk reads its
    state instead of carrying it, the grid gains a chunk-group axis (``_readout``), and only (p,) is returned."""
    if states is not None:
        return _readout("fwd_p", (fq, zk), tabs, states, segs, L=L, plan=plan, cdt=cdt, out_dtype=mdt,
                        interpret=interpret)
    tabs = expand_tables(tabs)
    B, T, H, R = fq.shape
    M = tabs[0].shape[-1]
    block_r = plan.block
    NC, nrb = T // L, R // block_r
    dot, seg = C.Dots(cdt), segs is not None

    def kernel(*refs):
        (fq_r, zk_r, *tab_r, x0_r), seg_r, outs = _split(refs, 13 + (4 if seg else 0), seg)
        p_r, xt_r = outs[0], outs[1]
        bi, h, rb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        rs = pl.ds(rb * block_r, block_r)

        def body(c, X):
            t0 = c * L
            tb, mk = _tabs(tab_r, h), _masks(seg_r, bi, c, t0, L)
            if save_sdt is not None:
                outs[2][bi, h, c, 0, :, rs] = X[0].astype(outs[2].dtype)
                outs[2][bi, h, c, 1, :, rs] = X[1].astype(outs[2].dtype)
            q = fq_r[bi, pl.ds(t0, L), h, rs]
            k = zk_r[bi, pl.ds(t0, L), h, rs]
            pr, pi = C.p_fwd(q, k, X, tb, mk, dot)
            p_r[rb, bi, pl.ds(t0, L), h, 0, :] = pr.astype(p_r.dtype)
            p_r[rb, bi, pl.ds(t0, L), h, 1, :] = pi.astype(p_r.dtype)
            return C.carry_fwd(k, X, tb, mk, dot)

        X = (x0_r[bi, h, 0, :, rs], x0_r[bi, h, 1, :, rs])
        X = lax.fori_loop(0, NC, body, X)
        xt_r[bi, h, 0, :, rs] = X[0]
        xt_r[bi, h, 1, :, rs] = X[1]

    out = (jax.ShapeDtypeStruct((nrb, B, T, H, 2, M), mdt), jax.ShapeDtypeStruct((B, H, 2, M, R), F32))
    if save_sdt is not None:
        out = out + (jax.ShapeDtypeStruct((B, H, NC, 2, M, R), save_sdt),)
    args = (fq, zk, *tabs, x0) + (tuple(segs) if seg else ())
    return _call(kernel, out, (B, H, nrb), interpret, plan, "fwd_p")(*args)


# fwd_mix's (num_warps, num_stages): as bwd_mix (its tiles are [L, M] and [M, M] only); mix_plan lowers the stages
# where the card's shared memory asks. Below M = 64 it runs 4 warps (MIX_FWD_TUNING_SMALL_M): its [L, M] tiles are
# small enough that 8 warps repeat each other's work (compiled for sm_90a, bf16 (16, 128, 32) T = 4K: 389
# instructions per warp at 8 warps, 622 at 4, 20% fewer in all, 144-146 registers, no spills; forward predicted
# 1.49 -> 1.43 ms); at M = 64 4 warps spilled 72 B per thread ((32, 64, 64)), so 8 stay there.
MIX_FWD_TUNING = (8, 2)
MIX_FWD_TUNING_SMALL_M = (4, 2)


def mix_plan(kind, *, L, M, n_modes_in, mode_bytes, k_bytes, limit=None) -> KernelPlan:
    """The plan of fwd_mix / bwd_mix: their tuning (MIX_FWD_TUNING[_SMALL_M] / MIX_TUNING[_SMALL_M]), at one stage
    when the two-stage estimate passes the card's shared memory per block (``smem_limit``); refused, naming the kernel, shape,
    bytes and limit, when one stage does not fit either. Estimate: per chunk, ``n_modes_in`` [2, L, M] mode
    tiles (p's partial sums, or p and dw) and the [2, M, M] planes of K, times the stages: a bound on Triton's
    allocation at every measured case (bf16 and float32, M = 32 and 64: actual / estimate 0.5-1.0)."""
    if kind == "fwd_mix":
        warps, stages = MIX_FWD_TUNING_SMALL_M if M < 64 else MIX_FWD_TUNING
    else:
        warps, stages = MIX_TUNING_SMALL_M if M < 64 else MIX_TUNING
    limit = smem_limit() if limit is None else int(limit)
    per_stage = n_modes_in * 2 * L * M * mode_bytes + 2 * M * M * k_bytes
    while per_stage * stages > limit and stages > 1:
        stages -= 1
    if per_stage * stages > limit:
        raise ValueError(f"GPU kernel {kind}: does not fit at L={L}, M={M}: ~{per_stage} B of shared memory at one "
                         f"stage, the card allows {limit} B per block; use a smaller chunk_size (e.g. "
                         f"{max(16, L // 2)}) or impl='chunked'")
    return KernelPlan(M, warps, stages, per_stage * stages)


def fwd_mix(p, kmix, *, conj, L, cdt, mdt, interpret, write_p=False, tabs=None, segs=None, write_w=True):
    """Between fwd_p and fwd_o: p = Σ of fwd_p's partial sums p [n, B, T, H, 2, M] over its feature blocks, and
    the mode mixing w = s·K (s = conj(p) if conj else p; kmix [H, 2, M, M] planes, or None: no mixing).
    Returns (w [1, B, T, H, 2, M] or None without kmix, p [1, B, T, H, 2, M] when ``write_p`` or without
    kmix, else None), in mdt.

    With ``tabs`` (and ``segs`` when there are segment ids) it also forms fwd_o's per-token factors from the O-half's
    mode vector g' (w, or s without kmix), as rounded to mdt:

        q = pt∘g',   u = cm·pin∘g'      -> qu [B, T, H, 4, M] (q's planes, then u's; cdt)

    (what XLA's pass ``prescale_fwd_o`` forms; op.GPU_FUSED_FACTORS) and returns (w, p, qu); w is then written
    only with ``write_w`` (the backward reads it) and p only with ``write_p``. The backward's O-half scan factor
    cm·conj(pin)∘conj(g') is conj(u): it reads qu too (``scan_rev(..., gs_planes=(2, 3), gs_conj=True)``).

    A kernel of its own: inside fwd_o or fwd_p the four [L, M] x [M, M] products pushed the program past the
    register file (at (32, 64, 64) bf16: fwd_o 244 B of spills per thread with the mixing, 0 without; fwd_p
    0 -> 240 B with it; the chunk-parallel P readout with the mixing and the factors, 2026-12-06: 255 registers
    and spills at (16, 128, 32)), and summing fwd_p's partials here lets fwd_p split its features
    (``MAX_STATE``) without a pass of XLA over the mode tensors. p and w cross HBM in the compute dtype. Grid
    (B, H, chunk groups) as bwd_mix."""
    has_k = kmix is not None
    factors = tabs is not None
    write_w = has_k and (write_w or not factors)
    write_p = write_p or not (has_k or factors)
    kmix = kmix.astype(cdt) if has_k else None  # only a dot operand
    tabs = expand_tables(tabs) if factors else ()
    seg = factors and segs is not None
    n, B, T, H = p.shape[:4]
    M = p.shape[-1]
    NC = T // L
    per, NG = _groups(B, H, NC)
    dot = C.Dots(cdt)
    # the planes side by side (MERGED_PLANES): w = s·K as [p_r | p_i]·K2 with K2 [H, 2, 2M, M] the real form of K
    # (the conjugation of s folded in), two dots of depth 2M instead of four of depth M
    merged = MERGED_PLANES and has_k and n == 1
    if merged:
        kr, ki = kmix[:, 0], kmix[:, 1]
        sgn = 1 if conj else -1  # conj: w_r = p_r·K_r + p_i·K_i, w_i = p_r·K_i - p_i·K_r
        kmix = jnp.stack([jnp.concatenate([kr, sgn * ki], axis=1),
                          jnp.concatenate([ki, -sgn * kr], axis=1)], axis=1)  # [H, 2, 2M, M]
        p = p.reshape(*p.shape[:4], 2 * M)
    n_in = 1 + int(has_k) + len(tabs) + (4 if seg else 0)

    def kernel(*refs):
        ins, seg_r, outs = _split(refs, n_in, seg)
        p_r, k_r, tab_r = ins[0], (ins[1] if has_k else None), ins[1 + int(has_k):]
        outs = list(outs)
        w_r = outs.pop(0) if write_w else None
        po_r = outs.pop(0) if write_p else None
        qu_r = outs.pop(0) if factors else None
        bi, h, gi = pl.program_id(0), pl.program_id(1), pl.program_id(2)

        def body(c, carry):
            ts = pl.ds(c * L, L)
            if merged:
                p2 = p_r[0, bi, ts, h, :]  # [L, 2M]: p_r | p_i
                if po_r is not None:
                    po_r[0, bi, ts, h, 0, :] = p_r[0, bi, ts, h, pl.ds(0, M)].astype(po_r.dtype)
                    po_r[0, bi, ts, h, 1, :] = p_r[0, bi, ts, h, pl.ds(M, M)].astype(po_r.dtype)
                g = (dot(p2, k_r[h, 0]), dot(p2, k_r[h, 1]))
                if not factors:
                    w_r[0, bi, ts, h, 0, :] = g[0].astype(w_r.dtype)
                    w_r[0, bi, ts, h, 1, :] = g[1].astype(w_r.dtype)
                    return carry
                return mixed(c, g, carry)
            pr = pi = None
            for k in range(n):  # fwd_p's partial sums over its feature blocks
                xr, xi = p_r[k, bi, ts, h, 0, :].astype(F32), p_r[k, bi, ts, h, 1, :].astype(F32)
                pr, pi = (xr, xi) if pr is None else (pr + xr, pi + xi)
            if po_r is not None:
                po_r[0, bi, ts, h, 0, :] = pr.astype(po_r.dtype)
                po_r[0, bi, ts, h, 1, :] = pi.astype(po_r.dtype)
            if not factors:
                if w_r is not None:
                    wc, _ = C.mix_fwd((pr, pi), _kmat(k_r, h), conj, dot)
                    w_r[0, bi, ts, h, 0, :] = wc[0].astype(w_r.dtype)
                    w_r[0, bi, ts, h, 1, :] = wc[1].astype(w_r.dtype)
                return carry
            # the factors from p and g' in float32 as formed here (the XLA passes read them back in mdt)
            g, _ = C.mix_fwd((pr, pi), _kmat(k_r, h), conj, dot)
            return mixed(c, g, carry)

        def mixed(c, g, carry):
            ts = pl.ds(c * L, L)
            if has_k:
                if w_r is not None:
                    w_r[0, bi, ts, h, 0, :] = g[0].astype(w_r.dtype)
                    w_r[0, bi, ts, h, 1, :] = g[1].astype(w_r.dtype)
            tb, mk = _tabs(tab_r, h), _masks(seg_r, bi, c, c * L, L)
            qr, qi = C.cmul(g[0], g[1], *tb.pt)
            ur, ui = C.cmul(g[0], g[1], *_pin_cm(tab_r, h, mk, L, M))  # u = cm·pin∘g'
            qu_r[bi, ts, h, 0, :] = qr.astype(qu_r.dtype)
            qu_r[bi, ts, h, 1, :] = qi.astype(qu_r.dtype)
            qu_r[bi, ts, h, 2, :] = ur.astype(qu_r.dtype)
            qu_r[bi, ts, h, 3, :] = ui.astype(qu_r.dtype)
            return carry

        lax.fori_loop(gi * per, jnp.minimum((gi + 1) * per, NC), body, 0)

    one = jax.ShapeDtypeStruct((1, B, T, H, 2, M), mdt)
    out = (one,) * (int(write_w) + int(write_p))
    if factors:
        out = out + (jax.ShapeDtypeStruct((B, T, H, 4, M), cdt),)
    plan = mix_plan("fwd_mix", L=L, M=M, n_modes_in=n, mode_bytes=jnp.dtype(p.dtype).itemsize,
                    k_bytes=jnp.dtype(cdt).itemsize * (2 if merged else 1))  # K2 is [2, 2M, M]
    args = (p,) + ((kmix,) if has_k else ()) + tuple(tabs) + (tuple(segs) if seg else ())
    res = list(_call(kernel, out, (B, H, NG), interpret, plan, "fwd_mix")(*args))
    w = res.pop(0) if write_w else None
    po = res.pop(0) if write_p else None
    return (w, po, res.pop(0)) if factors else (w, po)


def fwd_o(w, zv, tabs, x0, segs, *, conj, L, plan, cdt, out_dtype, interpret, save_sdt=None, states=None,
          prescaled=False):
    """o [B, T, H, D] and Xv_T [B, H, 2, M, D] (and xs [B, H, NC, 2, M, D] with ``save_sdt``, else None) from
    the per-token mode vectors w [B, T, H, 2, M] (fwd_p's mixed w; or p itself when there is no mixing matrix,
    then conjugated here when ``conj``). ``states``: the chunk-parallel readout as in fwd_p; returns (o,).
    ``prescaled``: w is ``prescale_fwd_o``'s [B, T, H, 4, M] (q, u): the conjugation, cm and the tables already
    applied (conj is then ignored)."""
    if states is not None:
        return _readout("fwd_o", (w, zv), tabs, states, segs, L=L, plan=plan, cdt=cdt, out_dtype=out_dtype,
                        interpret=interpret, conj=conj, prescaled=prescaled)
    tabs = expand_tables(tabs)
    B, T, H, D = zv.shape
    M = tabs[0].shape[-1]
    block_d = plan.block
    NC, ndb = T // L, D // block_d
    dot, seg = C.Dots(cdt), segs is not None

    def kernel(*refs):
        (w_r, zv_r, *tab_r, x0_r), seg_r, outs = _split(refs, 13 + (4 if seg else 0), seg)
        o_r, xt_r = outs[0], outs[1]
        bi, h, db = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        ds_ = pl.ds(db * block_d, block_d)

        def body(c, X):
            t0 = c * L
            ts = pl.ds(t0, L)
            tb, mk = _tabs(tab_r, h), _masks(seg_r, bi, c, t0, L)
            if save_sdt is not None:
                outs[2][bi, h, c, 0, :, ds_] = X[0].astype(outs[2].dtype)
                outs[2][bi, h, c, 1, :, ds_] = X[1].astype(outs[2].dtype)
            v = zv_r[bi, ts, h, ds_]
            if prescaled:
                o = C.o_fwd_scaled(_qu(w_r, bi, ts, h), v, X, tb, mk, dot)
            else:
                wc, _ = C.mix_fwd(_modes(w_r, bi, ts, h), None, conj, dot)
                o = C.o_fwd(wc, v, X, tb, mk, dot)
            o_r[bi, ts, h, ds_] = o.astype(o_r.dtype)
            return C.carry_fwd(v, X, tb, mk, dot)

        X = (x0_r[bi, h, 0, :, ds_], x0_r[bi, h, 1, :, ds_])
        X = lax.fori_loop(0, NC, body, X)
        xt_r[bi, h, 0, :, ds_] = X[0]
        xt_r[bi, h, 1, :, ds_] = X[1]

    out = (jax.ShapeDtypeStruct((B, T, H, D), out_dtype), jax.ShapeDtypeStruct((B, H, 2, M, D), F32))
    if save_sdt is not None:
        out = out + (jax.ShapeDtypeStruct((B, H, NC, 2, M, D), save_sdt),)
    args = (w, zv, *tabs, x0) + (tuple(segs) if seg else ())
    res = _call(kernel, out, (B, H, ndb), interpret, plan, "fwd_o")(*args)
    return res[0], res[1], (res[2] if save_sdt is not None else None)


# ----------------------------------------------------------------------------------------------------------------
# backward building blocks


# Tables a chunk loop uses only as dot operands, loaded and cast to the compute dtype once per program before
# the loop (_held_operands) instead of read in float32 and cast at every chunk: scan_fwd's Pe, the readouts' Ps
# (HOLD_TABLES), and those named in BWD_HELD in bwd_o / bwd_p with one mode block. Compiled for sm_90a, bf16
# (16, 128, 32) T = 4K: with em as a masked load of z, scan_fwd 743 -> 433 instructions per chunk; Ps in the
# backward 1,429 -> 1,402 (bwd_o), 1,584 -> 1,559 (bwd_p), 238 registers; Pe there too pushed both to 255, so
# it stays out.
HOLD_TABLES = True
BWD_HELD = ("ps",)
# Up to this many state elements per plane (modes x feature block) the scans add each chunk's product to the
# decayed state after the dot (C.Dots.sum's one-trip loop) instead of as the dot's accumulator: a dot chained
# through the loop carry gets all warps along its rows (Dots.sum), which a [32, 32] tile does not fill, so each
# warp repeated another's work (compiled for sm_90a, bf16 (16, 128, 32) T = 16K, 32-wide blocks: scan_fwd 207 ->
# 153, scan_rev 356 -> 232 instructions per chunk; at T = 4K's [32, 128] tiles the chained form is fewer: 433
# against 479).
SCAN_UNCHAINED_MAX_STATE = 32 * 32


def scan_fwd(z, tabs, x0, segs, *, L, plan, cdt, sdt, interpret, name="scan_fwd", final=False):
    """States before every chunk: xs [B, H, NC, 2, M, N] (dtype sdt); with ``final`` also (xs, the state after
    the last chunk X_T [B, H, 2, M, N] float32), what the chunk-parallel forward needs."""
    tabs = expand_tables(tabs)
    B, T, H, N = z.shape
    M = tabs[0].shape[-1]
    block_n = plan.block
    NC, nnb = T // L, N // block_n
    dot, seg = C.Dots(cdt), segs is not None
    unchained = M * block_n <= SCAN_UNCHAINED_MAX_STATE

    def kernel(*refs):
        (z_r, *tab_r, x0_r), seg_r, outs = _split(refs, 12 + (4 if seg else 0), seg)
        xs_r = outs[0]
        bi, h, nb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        ns = pl.ds(nb * block_n, block_n)

        pe = tuple(p.astype(dot.cdt) for p in _tabs(tab_r, h).pe) if HOLD_TABLES else None

        def body(c, X):
            t0 = c * L
            tb, mk = _tabs(tab_r, h), _masks(seg_r, bi, c, t0, L)
            xs_r[bi, h, c, 0, :, ns] = X[0].astype(xs_r.dtype)
            xs_r[bi, h, c, 1, :, ns] = X[1].astype(xs_r.dtype)
            if pe is None or mk.em is None:
                z = z_r[bi, pl.ds(t0, L), h, ns]
            else:  # em∘Z as a masked load: rows outside the chunk's last document are not read
                z = _masked_load(z_r.at[bi, pl.ds(t0, L), h, ns], mk.em, (L, block_n))
            return C.carry_fwd(z, X, tb, mk, dot.with_bound(c) if unchained else dot, pe=pe)

        X = lax.fori_loop(0, NC, body, (x0_r[bi, h, 0, :, ns], x0_r[bi, h, 1, :, ns]))
        if final:
            outs[1][bi, h, 0, :, ns] = X[0]
            outs[1][bi, h, 1, :, ns] = X[1]

    out = (jax.ShapeDtypeStruct((B, H, NC, 2, M, N), sdt),)
    if final:
        out = out + (jax.ShapeDtypeStruct((B, H, 2, M, N), F32),)
    args = (z, *tabs, x0) + (tuple(segs) if seg else ())
    res = _call(kernel, out, (B, H, nnb), interpret, plan, name)(*args)
    return (res[0], res[1]) if final else res[0]


def _readout(kind, ins, tabs, xs, segs, *, L, plan, cdt, out_dtype, interpret, conj=False, prescaled=False):
    """The chunk-parallel forward readout (fla's chunk_fwd_o after chunk_fwd_h): fwd_p's p [nRB, B, T, H, 2, M]
    from (fq, zk) or fwd_o's o [B, T, H, D] from (w, zv), every chunk reading its incoming state from xs
    [B, H, NC, 2, M, N] (scan_fwd's, dtype sdt) instead of carrying it. Grid (B, H, feature blocks x chunk
    groups): at long T the serial kernels' B·H·blocks programs each walk T/L chunks in a row; here every
    program walks one group (``_groups``), the same per-chunk math (C.p_fwd / C.o_fwd). Returns a 1-tuple."""
    tabs = expand_tables(tabs)
    a, z = ins
    B, T, H, N = z.shape
    M = tabs[0].shape[-1]
    block = plan.block
    NC, nb = T // L, N // block
    per, NG = _groups(B, H * nb, NC)
    dot, seg = C.Dots(cdt), segs is not None

    def kernel(*refs):
        (a_r, z_r, *tab_r, xs_r), seg_r, (out_r,) = _split(refs, 13 + (4 if seg else 0), seg)
        bi, h, q = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        fb, gi = q // NG, q % NG
        ns = pl.ds(fb * block, block)
        held = _held_operands(tab_r, h, ("ps",), dot.cdt) if HOLD_TABLES else None

        def body(c, carry):
            t0 = c * L
            ts = pl.ds(t0, L)
            tb, mk = _tabs(tab_r, h, held=held), _masks(seg_r, bi, c, t0, L)
            X = (xs_r[bi, h, c, 0, :, ns].astype(F32), xs_r[bi, h, c, 1, :, ns].astype(F32))
            zc = z_r[bi, ts, h, ns]
            if kind == "fwd_p":  # cm·pin read as a masked load; p_fwd then has no row mask to apply
                tb = _tabs(tab_r, h, held=dict(held or {}, pin=_pin_cm(tab_r, h, mk, L, M)))
                mk = C.Masks(mk.mk, None, mk.em, mk.keep, select=mk._select)
                pr, pi = C.p_fwd(a_r[bi, ts, h, ns], zc, X, tb, mk, dot)
                out_r[fb, bi, ts, h, 0, :] = pr.astype(out_r.dtype)
                out_r[fb, bi, ts, h, 1, :] = pi.astype(out_r.dtype)
            elif prescaled:
                out_r[bi, ts, h, ns] = C.o_fwd_scaled(_qu(a_r, bi, ts, h), zc, X, tb, mk, dot).astype(out_r.dtype)
            else:
                wc, _ = C.mix_fwd(_modes(a_r, bi, ts, h), None, conj, dot)
                out_r[bi, ts, h, ns] = C.o_fwd(wc, zc, X, tb, mk, dot).astype(out_r.dtype)
            return carry

        lax.fori_loop(gi * per, jnp.minimum((gi + 1) * per, NC), body, 0)

    shape = (nb, B, T, H, 2, M) if kind == "fwd_p" else (B, T, H, N)
    out = (jax.ShapeDtypeStruct(shape, out_dtype),)
    args = (a, z, *tabs, xs) + (tuple(segs) if seg else ())
    return _call(kernel, out, (B, H, nb * NG), interpret, plan, kind + "_readout")(*args)


def _qu(ref, bi, ts, h):
    """prescale_fwd_o's (q, u) planes [L, M] of one chunk, in the dtype they were written in."""
    return (ref[bi, ts, h, 0, :], ref[bi, ts, h, 1, :]), (ref[bi, ts, h, 2, :], ref[bi, ts, h, 3, :])


def _scale_per_token(g, weights, cm, *, L, cdt, cm_rows):
    """out[b, t, h, k, m] = cm_k · (g_re·W[k, 0] + g_im·W[k, 1]) with W = ``weights`` [K, 2, L, H, M] float32 (a
    real 2-vector's image under K rows of per-position, per-mode coefficients, j = t mod L), cm [B, T, 1] or None
    applied to the rows in ``cm_rows``. Written as broadcast products so that XLA forms it in one elementwise
    pass (no stack of planes: in float32 that was a second pass); ``g`` passes an optimization barrier so that
    its float32 conversion is not shared with another pass over the same tensor (the forward's and the
    backward's factors of w), which XLA would otherwise write to HBM in float32 between them."""
    g = lax.optimization_barrier(g)
    B, T, H, _, M = g.shape
    NC = T // L
    gr = g[:, :, :, 0:1, :].astype(F32).reshape(B, NC, L, H, 1, M)
    gi = g[:, :, :, 1:2, :].astype(F32).reshape(B, NC, L, H, 1, M)
    w = jnp.transpose(weights, (2, 3, 0, 1, 4))  # [L, H, K, 2, M]
    out = gr * w[:, :, :, 0, :] + gi * w[:, :, :, 1, :]  # [B, NC, L, H, K, M]
    if cm is not None:
        rows = jnp.asarray([k in cm_rows for k in range(weights.shape[0])])[:, None]  # [K, 1]
        out = out * jnp.where(rows, cm.reshape(B, NC, L, 1, 1, 1), 1.0)
    return out.reshape(B, T, H, weights.shape[0], M).astype(cdt)


def _cmul_weights(tr, ti, conj_table=False, conj_g=False):
    """W [2, 2, ...] of z ↦ z·t (or z·conj(t) with conj_table), z conjugated first with conj_g: rows (re, im)
    of the result, columns the coefficients of (z_re, z_im)."""
    if conj_table:
        ti = -ti
    w = jnp.stack([jnp.stack([tr, -ti]), jnp.stack([ti, tr])])
    return w.at[:, 1].multiply(-1.0) if conj_g else w


def _by_position(w):
    """[K, 2, H, L, M] -> [K, 2, L, H, M]."""
    return jnp.swapaxes(w, 2, 3)


def prescale_fwd_o(g, tabs, segs, *, L, conj, cdt):
    """fwd_o's per-token factors formed once per token in XLA (one elementwise pass) instead of once per chunk and
    feature block in the kernel:

        q_t = pt_{t mod L} ∘ g'_t,    u_t = cm_t · pin_{t mod L} ∘ g'_t,

    g' = conj(g) if ``conj`` else g, pt_j = lam^(j−μ), pin_j = lam^(j+1). g [B, T, H, 2, M] (T a multiple of L);
    returns [B, T, H, 4, M] in ``cdt``: q's planes then u's, the dot operands the kernel would have cast them to."""
    tabs = expand_tables(tabs)
    pt, pin = tabs[1], tabs[2]  # [H, 2, L, M]
    w = jnp.concatenate([_cmul_weights(pt[:, 0], pt[:, 1], conj_g=conj),
                         _cmul_weights(pin[:, 0], pin[:, 1], conj_g=conj)])  # [4, 2, H, L, M]
    return _scale_per_token(g, _by_position(w), None if segs is None else segs[1], L=L, cdt=cdt, cm_rows=(2, 3))


def prescale_rev(g, tabs, segs, *, L, conj, cdt):
    """The adjoint scan's per-token factor, formed once per token in XLA (one elementwise pass at memory speed)
    instead of once per chunk and feature block in the kernel, where the complex product with the [L, M] table
    and its loads were most of the loop's instructions:

        gs_t = cm_t · conj(pin_{t mod L}) ∘ g'_t,    g' = conj(g) if ``conj`` else g,    pin_j = lam^(j+1).

    g [B, T, H, 2, M] (T a multiple of L, M the padded modes); returns gs [B, T, H, 2, M] in ``cdt`` (the dot
    operand the kernel would have cast it to). ``scan_rev(..., prescaled=True)`` reads it."""
    pin = expand_tables(tabs)[2]  # [H, 2, L, M]
    w = _cmul_weights(pin[:, 0], pin[:, 1], conj_table=True, conj_g=conj)  # [2, 2, H, L, M]
    return _scale_per_token(g, _by_position(w), None if segs is None else segs[1], L=L, cdt=cdt, cm_rows=(0, 1))


def prescale_p(dp, tabs, segs, *, L, cdt):
    """dp's two per-token factors in one XLA pass (the GPU backward without a mixing matrix, where ``bwd_o``
    writes dp; with one, ``bwd_mix`` forms them beside dp):

        gs_t = cm_t · conj(pin_{t mod L}) ∘ dp_t     (the P-half adjoint scan's factor; ``prescale_rev``)
        ds_t = conj(pt_{t mod L}) ∘ dp_t             (``bwd_p``'s: C.p_bwd_modes(.., pre=...))

    dp [B, T, H, 2, M]; returns [B, T, H, 4, M] in ``cdt``: gs's planes then ds's."""
    tabs = expand_tables(tabs)
    pt, pin = tabs[1], tabs[2]  # [H, 2, L, M]
    w = jnp.concatenate([_cmul_weights(pin[:, 0], pin[:, 1], conj_table=True),
                         _cmul_weights(pt[:, 0], pt[:, 1], conj_table=True)])  # [4, 2, H, L, M]
    return _scale_per_token(dp, _by_position(w), None if segs is None else segs[1], L=L, cdt=cdt, cm_rows=(0, 1))


# The dlamL sums keep_c·Σ_n Y_{c+1}∘conj(X_c) (lam's cotangent through the chunk-to-chunk decay) are formed in the
# adjoint scan, which holds Y_{c+1} in float32 and reads X_c, instead of in bwd_o / bwd_p (per chunk there they
# were 13% of both kernels' instructions; compiled for sm_90a, bf16 (16, 128, 32) 4K).
YX_IN_SCAN = True


def scan_rev(x, g, tabs, yT, segs, *, L, plan, cdt, sdt, conj_g, interpret, kmix=None, mix_conj=None,
             name="scan_rev", prescaled=False, gs_planes=(0, 1), gs_conj=False, xs=None):
    """Adjoint states after every chunk ys [B, H, NC, 2, M, N] (sdt) and the adjoint of the initial state
    y0 [B, H, 2, M, N] float32. g [B, T, H, 2, M]: the per-token vector (the P-half's dp; the O-half's w, or p
    conjugated per ``mix_conj`` when there is no mixing matrix), conjugated again when conj_g. kmix must be None:
    on GPU the mixing runs in fwd_mix and the O-half's backward reads w (the argument keeps the TPU signature).
    ``prescaled``: g is ``prescale_rev``'s gs (conjugations, cm and the table already applied; conj_g and
    mix_conj are then ignored): its planes ``gs_planes`` of g [B, T, H, P, M], conjugated when ``gs_conj`` (the
    O-half reads conj(u) from fwd_pw's qu: planes (2, 3), conjugated).
    ``xs``: the forward's states before every chunk [B, H, NC, 2, M, N]; then a third output, the dlamL sums
    yx [B, H, N / block, 2, M] float32 = Σ_c keep_c·Σ_n Y_{c+1}∘conj(X_c) over the program's feature block, the
    Y_{c+1} being the float32 carry (bwd_o / bwd_p then leave them out: YX_IN_SCAN)."""
    _no_kmix("scan_rev", kmix)
    tabs = expand_tables(tabs)
    B, T, H, N = x.shape
    M = tabs[0].shape[-1]
    block_n = plan.block
    NC, nnb = T // L, N // block_n
    dot, seg = C.Dots(cdt), segs is not None
    yx = xs is not None
    unchained = M * block_n <= SCAN_UNCHAINED_MAX_STATE

    def kernel(*refs):
        ins, seg_r, outs = _split(refs, 13 + yx + (4 if seg else 0), seg)
        (x_r, g_r, *tab_r, yt_r), xs_r = ins[:13], (ins[13] if yx else None)
        ys_r, y0_r = outs[:2]
        bi, h, nb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        ns = pl.ds(nb * block_n, block_n)

        def body(k, carry):
            Y, acc = (carry[:2], carry[2:]) if yx else (carry, None)
            c = NC - 1 - k
            t0 = c * L
            ts = pl.ds(t0, L)
            tb, mk = _tabs(tab_r, h), _masks(seg_r, bi, c, t0, L)
            ys_r[bi, h, c, 0, :, ns] = Y[0].astype(ys_r.dtype)
            ys_r[bi, h, c, 1, :, ns] = Y[1].astype(ys_r.dtype)
            if yx:  # acc += keep_c·Y_{c+1}∘conj(X_c): keep as a masked load (a chunk with a reset reads zeros)
                X = [xs_r.at[bi, h, c, jnp.int32(i), :, ns] for i in (0, 1)]
                if mk.keep is None:
                    X = [x[...] for x in X]
                else:
                    X = [_masked_load(x, mk.keep, (M, block_n)) for x in X]
                xr, xi = X[0].astype(F32), X[1].astype(F32)  # acc += Y∘conj(X), two FFMA per plane
                acc = (C.dot2(Y[0], xr, Y[1], xi, acc=acc[0]), C.dot2(Y[1], xr, Y[0], xi, sub=True, acc=acc[1]))
            if prescaled:
                gs = (g_r[bi, ts, h, gs_planes[0], :], g_r[bi, ts, h, gs_planes[1], :])
                Y = C.carry_rev_scaled(x_r[bi, ts, h, ns], gs, Y, tb, mk, dot.with_bound(c) if unchained else dot,
                                       conj_gs=gs_conj)
            else:
                gc = _modes(g_r, bi, ts, h)
                if mix_conj is not None:
                    gc, _ = C.mix_fwd(gc, None, mix_conj, dot)
                Y = C.carry_rev(x_r[bi, ts, h, ns], gc, Y, tb, mk, dot, conj_g)
            return tuple(Y) + tuple(acc) if yx else Y

        init = (yt_r[bi, h, 0, :, ns], yt_r[bi, h, 1, :, ns])
        if yx:
            init = init + (jnp.zeros((M, block_n), F32),) * 2
        out = lax.fori_loop(0, NC, body, init)
        y0_r[bi, h, 0, :, ns] = out[0]
        y0_r[bi, h, 1, :, ns] = out[1]
        if yx:
            outs[2][bi, h, nb, 0, :] = jnp.sum(out[2], axis=1)
            outs[2][bi, h, nb, 1, :] = jnp.sum(out[3], axis=1)

    out = (jax.ShapeDtypeStruct((B, H, NC, 2, M, N), sdt), jax.ShapeDtypeStruct((B, H, 2, M, N), F32))
    if yx:
        out = out + (jax.ShapeDtypeStruct((B, H, nnb, 2, M), F32),)
    args = (x, g, *tabs, yT) + ((xs,) if yx else ()) + (tuple(segs) if seg else ())
    return _call(kernel, out, (B, H, nnb), interpret, plan, name)(*args)


def _no_kmix(kind, kmix):
    if kmix is not None:
        raise ValueError(f"gpu.{kind}: kmix must be None (the GPU kernels mix in fwd_mix; the O-half's backward "
                         f"reads the forward's w and bwd_mix maps dw to dp and dK)")


def _acc_out(B, H, NC, M):
    return (jax.ShapeDtypeStruct((B, H, NC, 4, 1, M), F32), jax.ShapeDtypeStruct((B, H, NC, 2, M, 1), F32))


def _store_flat_acc(row_r, col_r, bi, h, c, acc, ms):
    """One chunk's flat Acc (C.Acc.zeros(.., flat=True)) of mode block ms into rows [.., NC, 4, 1, M] and cols
    [.., NC, 2, M, 1]."""
    for k in range(4):
        row_r[bi, h, c, k, 0, ms] = acc[k]
    col_r[bi, h, c, 0, ms, 0] = acc[4]
    col_r[bi, h, c, 1, ms, 0] = acc[5]


# The parameter sums of a backward kernel with one mode block per program (M <= MODE_BLOCK, or a program per
# block: SPLIT_MODE_BLOCKS): each program carries the raw cotangent tiles (C.fold_raw's input) of its block
# across its chunks and writes them once; XLA sums them over rows and chunk groups and folds them with the
# head's tables (a few KB per head).


def _raw_out(B, H, NG, L, M):
    return (jax.ShapeDtypeStruct((B, H, NG, 6, L, M), F32), jax.ShapeDtypeStruct((B, H, NG, 2, 1, M), F32))


def _raw_zeros(L, M):
    z, zc = jnp.zeros((L, M), F32), jnp.zeros((M,), F32)
    return (z,) * 6 + (zc, zc)


def _store_raw(tile_r, vec_r, bi, h, gi, raw, mo=None, mb=None):
    """A program's raw sums into its group's slot: all modes, or mode block `mo` (of `mb` modes) when split."""
    ms = slice(None) if mo is None else pl.ds(mo * mb, mb)
    for k in range(6):
        tile_r[bi, h, gi, k, :, ms] = raw[k]
    vec_r[bi, h, gi, 0, 0, ms] = raw[6]
    vec_r[bi, h, gi, 1, 0, ms] = raw[7]


# Several mode blocks (M > MODE_BLOCK): one program per mode block of each chunk group (grid axis 2 = groups x
# blocks), each carrying its block's raw parameter sums across its chunks (what one mode block does) instead of
# folding every block in every chunk (the fold's row reductions: at (32, 64, 64) bf16, 488 FADD + 368 SHFL + 100
# BAR.SYNC per block and chunk in bwd_o). Phase 1 (what contracts over the modes: dzv / dfq, dzk) is then done
# by every block's program and stored by the first.
SPLIT_MODE_BLOCKS = True


def _split_grid(B, H, NC, nmb):
    """(per, NG, programs along grid axis 2, split) of a backward kernel with nmb mode blocks."""
    split = nmb > 1 and SPLIT_MODE_BLOCKS
    blocks = nmb if split else 1  # programs per chunk group
    per, NG = _groups(B, H * blocks, NC)
    return per, NG, NG * blocks, split


def _group_and_block(split, nmb):
    """(chunk group, mode block or None) of this program (grid axis 2 as _split_grid lays it out)."""
    g = pl.program_id(2)
    return (g // nmb, g % nmb) if split else (g, None)


def _first_block_only(mo, write):
    """write() in the program of mode block 0 only (mo None: always)."""
    if mo is None:
        write()
    else:
        pl.when(mo == 0)(write)


def _fold_raw_sums(tiles, vecs, tabs, L, h_pre=False):
    """The raw sums [B, H, NG, 6, L, M], [B, H, NG, 2, 1, M] -> rows [1, H, 1, 4, 1, M] and cols [1, H, 1, 2, M, 1]
    (the per-chunk layout _store_flat_acc writes, summed); h_pre as in C.fold_raw."""
    tiles, vecs = jnp.sum(tiles, axis=(0, 2)), jnp.sum(vecs, axis=(0, 2))[:, :, 0]  # [H, 6, L, M], [H, 2, M]
    sp, lmu1, lmu, b = tabs[0], tabs[7], tabs[8], tabs[9]

    def one_head(t, v, sp, lmu1, lmu, b):
        tb = C.Tabs((sp[0], sp[1]), (lmu1[0, 0], lmu1[1, 0]), (lmu[0, 0], lmu[1, 0]), None, (b[0, 0], b[1, 0]))
        return jnp.stack(C.fold_raw(tuple(t) + (v[0], v[1]), tb, L, h_pre=h_pre))  # [6, M]

    acc = jax.vmap(one_head)(tiles, vecs, sp, lmu1, lmu, b)
    return acc[None, :, None, :4, None, :], jnp.moveaxis(acc[None, :, None, 4:, None, :], -2, -1)


# The backward kernels walk the modes in blocks of this many (o_bwd_modes / p_bwd_modes): at M = 64 their
# [L, M] epilogue tiles took most of the register file (docs/kernels-results.md, "What the compiled kernels use")
MODE_BLOCK = 32


def _mode_blocks(M):
    """(number of mode blocks, block) for the backward kernels."""
    mb = min(M, MODE_BLOCK)
    return M // mb, mb


class _Loads:
    """Per-chunk loaders of a backward kernel: ld.<name>(j) reads feature sub-block j of a [B, T, H, N]
    input; ld.x(j, m) / ld.y(j, m) the [2, mb, n] planes of the chunk's states in mode block m (None: all).
    ``stacked`` (M): the state refs are [B, H, NC, 2M, N], the planes stacked along the modes (a free reshape of
    [.., 2, M, N]; MERGED_PLANES), and ld.xm(j) / ld.ym(j) read both planes as one [2M, n] dot operand."""

    def __init__(self, feats, xs_r, ys_r, bi, h, c, ts, sub, mb, stacked=None):
        self._f, self._xs, self._ys = feats, xs_r, ys_r
        self._bi, self._h, self._c, self._ts, self._sub, self._mb = bi, h, c, ts, sub, mb
        self._stacked = stacked

    def __getattr__(self, name):
        r = self._f[name]
        return lambda j: r[self._bi, self._ts, self._h, pl.ds(j * self._sub, self._sub)]

    def _state(self, ref, j, m):
        ns = pl.ds(j * self._sub, self._sub)
        if self._stacked is not None:
            M, mb = self._stacked, self._mb if m is not None else self._stacked
            off = 0 if m is None else m * self._mb
            return tuple(ref[self._bi, self._h, self._c, pl.ds(k * M + off, mb), ns] for k in (0, 1))
        ms = slice(None) if m is None else pl.ds(m * self._mb, self._mb)
        return (ref[self._bi, self._h, self._c, 0, ms, ns], ref[self._bi, self._h, self._c, 1, ms, ns])

    def x(self, j, m):
        return self._state(self._xs, j, m)

    def y(self, j, m):
        return self._state(self._ys, j, m)

    def xm(self, j):
        return self._xs[self._bi, self._h, self._c, :, pl.ds(j * self._sub, self._sub)]

    def ym(self, j):
        return self._ys[self._bi, self._h, self._c, :, pl.ds(j * self._sub, self._sub)]


# The backward kernels with the per-token factors (bwd_o / bwd_p reading fwd_mix's / bwd_mix's factors) and one
# mode block, or a program per mode block (SPLIT_MODE_BLOCKS), read the complex planes of their phase-1 dot
# operands side by side, so that a sum of two real dots over
# the planes is one dot of twice the depth (C.Stacked): the states as [2M, N] (a free reshape), the factors'
# [.., 4, M] as [.., 4M], em·Pe and Ps (conj(Ps) for bwd_o) as [H, L, 2M] tables of their own. Each merged pair
# saves a dot's bookkeeping (wgmma fences, descriptors, the one-trip loop of Dots.sum, a shared-memory round trip):
# compiled for sm_90a, bf16 (16, 128, 32) T = 4K, bwd_p 1,559 -> 1,465 and bwd_o 1,402 -> 1,328 instructions per
# chunk as run, barriers 60 -> 48 and 53 -> 40, 250 / 244 registers, no spills. The same merge of fwd_o_readout's
# A = Re(q·Psᵀ) took it from 329 to 417 instructions (another layout for its mask and product): not done there.
# At (32, 64, 64) (two mode blocks, a program each) phase 1's sums over both blocks' planes become one dot of depth
# 2M: bwd_o 1,505 -> 1,387, bwd_p 1,663 -> 1,532 instructions per chunk, 255 registers, no spills. The mixing
# kernels take the same flag: fwd_mix's w = s·K and (from M = 64) bwd_mix's dw·Kᴴ as two dots of depth 2M.
MERGED_PLANES = True
# With a program per mode block (SPLIT_MODE_BLOCKS) and the planes side by side, the per-feature outputs of phase 1
# (bwd_o's dzv, bwd_p's dfq and dzk) and the score they alone use (A, dG) are formed only in the program of mode
# block 0, which stores them; every program forms the [L, L] product phase 2 needs (dA, G) in a loop of its own.
PHASE1_ONCE = True


def _side_by_side(t, sign=1):
    """A table's planes [H, 2, L, M] side by side as [H, L, 2M]: re | sign·im (MERGED_PLANES)."""
    return jnp.concatenate([t[:, 0], sign * t[:, 1]], axis=-1)


def _stack_states(*states):
    """Chunk states [B, H, NC, 2, M, N] as [B, H, NC, 2M, N], the planes stacked along the modes (a free reshape)."""
    return tuple(a.reshape(*a.shape[:3], -1, a.shape[-1]) for a in states)


def _em_pe_loader(pem_r, h, seg_r, mk, L, M):
    """em·Pe [L, 2M] of head h from _side_by_side(pe): the whole table, or a masked load of the chunk's last
    document's rows when there are segments."""
    if seg_r is None:
        return lambda: pem_r[h]
    return lambda: _masked_load(pem_r.at[h], mk.em, (L, 2 * M))


# The chunk-parallel backward kernels give each program a contiguous group of chunks (parameter sums stay in
# registers across the group) and one feature block; groups are sized so that B·H·blocks·groups reaches about
# this many programs.
BWD_TARGET_PROGRAMS = 512


def _groups(B, H, NC, target_programs=None):
    target_programs = BWD_TARGET_PROGRAMS if target_programs is None else target_programs
    per = max(1, -(-NC * B * H // target_programs))
    ng = -(-NC // per)
    return per, ng


def bwd_o(w, kmix, zv, do, xs, ys, tabs, segs, *, conj, L, plan, cdt, mdt, interpret, factors=None):
    """O-half backward: dg [1, B, T, H, 2, M] (mdt), the cotangent of the per-token vector g it reads (w, or p
    when there is no mixing matrix: then conj(w) = p per ``conj``), dzv [B, T, H, D] (zv's dtype), parameter
    rows [B, H, NC, 4, 1, M] and cols [.., 2, M, 1] per chunk (or, with one mode block per program, their sums
    as [1, H, 1, 4, 1, M] and [1, H, 1, 2, M, 1]: _fold_raw_sums), and None (the TPU signature's K cotangent: on GPU
    ``bwd_mix`` maps dw to dp and dK, a kernel of its own; in bwd_o the mixing's backward was 2/3 of its register
    spills).
    kmix must be None. Grid (B, H, chunk groups), or (B, H, chunk groups x mode blocks) with several blocks and
    SPLIT_MODE_BLOCKS. Each program walks the whole feature width in sub-blocks of ``plan.block`` and the modes
    in blocks of MODE_BLOCK for what contracts over them, then its own block (split) or every block
    (o_bwd_modes); the parameter sums are carried across the program's chunks (one block per program) or
    written per chunk.
    ``factors``: the forward's qu [B, T, H, 4, M] (``fwd_mix`` with tabs); the kernel then reads q = w∘pt from
    it (planes 0, 1) instead of w (C.o_bwd_modes' ``pre``), and w (may be None) is not read."""
    _no_kmix("bwd_o", kmix)
    pre = factors is not None
    if pre:
        w = factors  # the kernel reads q from this ref (f_r); w itself is not read
    tabs = expand_tables(tabs)
    B, T, H, D = zv.shape
    M = tabs[0].shape[-1]
    sub = plan.block
    NC, nsub = T // L, D // sub
    nmb, mb = _mode_blocks(M)
    per, NG, gz, split = _split_grid(B, H, NC, nmb)
    sums = nmb == 1 or split  # the parameter sums carried across the program's chunks (_raw_out)
    dot, seg = C.Dots(cdt), segs is not None
    merged = MERGED_PLANES and (nmb == 1 or split) and pre
    extra = ()
    if merged:  # see MERGED_PLANES: dzv's Pe·Y and A = Re(q·Psᵀ) = [q_r | q_i]·[Ps_r | -Ps_i]ᵀ
        xs, ys = _stack_states(xs, ys)
        w = factors.reshape(*factors.shape[:3], 4 * M)
        extra = (_side_by_side(tabs[5]), _side_by_side(tabs[4], -1).astype(cdt))  # pe, conj(ps) [H, L, 2M]

    def kernel(*refs):
        (w_r, zv_r, do_r, xs_r, ys_r, *tab_r), seg_r, outs = _split(refs, 15 + len(extra) + (4 if seg else 0), seg)
        psm_r, pem_r = (tab_r.pop(), tab_r.pop()) if merged else (None, None)
        dw_r, dzv_r, row_r, col_r = outs
        bi, h = pl.program_id(0), pl.program_id(1)
        gi, mo = _group_and_block(split, nmb)
        first = functools.partial(_first_block_only, mo) if split and merged and PHASE1_ONCE else None
        f_r = w_r if pre else None
        held = _held_operands(tab_r, h, BWD_HELD, dot.cdt) if nmb == 1 else None

        def body(c, carry):
            t0 = c * L
            mk = _masks(seg_r, bi, c, t0, L)
            ts = pl.ds(t0, L)
            msl = lambda m: None if m is None else pl.ds(m * mb, mb)  # noqa: E731
            tabs = lambda m: _tabs(tab_r, h, msl(m), flat_rows=True, held=held)  # noqa: E731
            # w is loaded again wherever it is used (per mode block), never held across the loops
            w_fn = lambda m: C.mix_fwd(_modes(w_r, bi, ts, h, msl(m)), None, conj, dot)[0]  # noqa: E731
            ld = _Loads(dict(zv=zv_r, do=do_r), xs_r, ys_r, bi, h, c, ts, sub, mb, stacked=M if merged else None)
            stacked = None
            if merged:
                stacked = C.Stacked(df=None, x=None, y=ld.ym, pe=_em_pe_loader(pem_r, h, seg_r, mk, L, M),
                                    ds=lambda: f_r[bi, ts, h, pl.ds(0, 2 * M)], ps=lambda: psm_r[h])

            def pre_fn(m):  # q = w∘pt (re, im) [L, mb] float32 of mode block m
                if merged:
                    off, width = (0, M) if m is None else (m * mb, mb)
                    return tuple(f_r[bi, ts, h, pl.ds(k * M + off, width)].astype(F32) for k in (0, 1))
                ms = slice(None) if m is None else msl(m)
                return f_r[bi, ts, h, 0, ms].astype(F32), f_r[bi, ts, h, 1, ms].astype(F32)

            def store(j, dzv):
                def write():
                    dzv_r[bi, ts, h, pl.ds(j * sub, sub)] = dzv.astype(dzv_r.dtype)
                _first_block_only(mo, write)

            def store_dw(m, dw):
                dw = C.mix_bwd_dp(dw, None, conj, dot)  # identity mixing: a conjugation when conj
                dw_r[0, bi, ts, h, 0, msl(m)] = dw[0].astype(dw_r.dtype)
                dw_r[0, bi, ts, h, 1, msl(m)] = dw[1].astype(dw_r.dtype)

            return C.o_bwd_modes(w_fn, ld, store, store_dw, nsub, nmb, tabs, mk, dot.with_bound(c), L,
                                 store_acc=lambda m, acc: _store_flat_acc(row_r, col_r, bi, h, c, acc, msl(m)),
                                 raw=carry, pre=pre_fn if pre else None, yx=not YX_IN_SCAN, only=mo,
                                 stacked=stacked, first=first)

        raw = lax.fori_loop(gi * per, jnp.minimum((gi + 1) * per, NC), body, _raw_zeros(L, mb) if sums else None)
        if sums:
            _store_raw(row_r, col_r, bi, h, gi, raw, mo, mb)

    out = ((jax.ShapeDtypeStruct((1, B, T, H, 2, M), mdt), jax.ShapeDtypeStruct(zv.shape, zv.dtype))
           + (_raw_out(B, H, NG, L, M) if sums else _acc_out(B, H, NC, M)))
    args = (w, zv, do, xs, ys, *tabs, *extra) + (tuple(segs) if seg else ())
    dw, dzv, row, col = _call(kernel, out, (B, H, gz), interpret, plan, "bwd_o")(*args)
    if sums:
        row, col = _fold_raw_sums(row, col, tabs, L, h_pre=pre)
    return dw, dzv, row, col, None


# bwd_mix's (num_warps, num_stages): its tiles are [L, M] and [M, M] only; 8 warps keep s, dw, dK and K (about
# five 64 x 64 float32 pairs at M = 64) under the register cap, 2 stages prefetch the next chunk's p and dw.
# Below M = 64 4 warps at one stage (MIX_TUNING_SMALL_M), as fwd_mix: compiled for sm_90a, bf16 (16, 128, 32)
# T = 4K, with dot2 as FMAs, 419 instructions per warp at 8 warps against 568 at 4 (32% fewer in all), 184
# registers, no spills; at two stages 4 warps spilled 8 B per thread, and at M = 64 424 B.
MIX_TUNING = (8, 2)
MIX_TUNING_SMALL_M = (4, 1)


def bwd_mix(p, kmix, dw, *, conj, L, cdt, mdt, interpret, tabs=None, segs=None):
    """The mixing's backward for the O-half: dp [1, B, T, H, 2, M] (mdt) = conj(dw·Kᴴ) (conj) or dw·Kᴴ, and
    dK [B, H, NG, 2, M, M] float32 = Σ_t sᴴ·dw per chunk group (s = conj(p) or p); p, dw [.., B, T, H, 2, M],
    kmix [H, 2, M, M] (compute dtype). Grid (B, H, chunk groups) (bwd_o's without the mode-block split).

    With ``tabs`` (and ``segs`` when there are segment ids) also dp's two per-token factors, formed where dp is
    (from dp as rounded to mdt): the P-half's adjoint-scan factor gs = cm·conj(pin)∘dp and bwd_p's
    ds = conj(pt)∘dp, as [B, T, H, 4, M] (cdt; gs's planes then ds's: what XLA's pass ``prescale_p(dp)``
    forms): returns (dp, dK, gs_ds)."""
    kmix = kmix.astype(cdt)  # only a dot operand
    B, T, H = p.shape[:3]
    M = p.shape[-1]
    NC = T // L
    per, NG = _groups(B, H, NC)
    dot = C.Dots(cdt)
    # the planes side by side (MERGED_PLANES): ds = dw·Kᴴ as [dw_r | dw_i]·K2ᵀ, K2 [H, 2, M, 2M] = ([K_r | K_i],
    # [-K_i | K_r]): two dots of depth 2M instead of four of depth M (dK keeps its four: they contract over tokens).
    # From M = 64 (8 warps): bf16 (32, 64, 64) 4K 669 -> 627 instructions per chunk, 246 registers; at M = 32 (4
    # warps) 554 -> 543 but 16 B of stack per thread, so not there.
    merged = MERGED_PLANES and M >= 64
    if merged:
        kr, ki = kmix[:, 0], kmix[:, 1]
        kmix = jnp.stack([jnp.concatenate([kr, ki], axis=2), jnp.concatenate([-ki, kr], axis=2)], axis=1)
        dw = dw.reshape(*dw.shape[:4], 2 * M)
    fold = tabs is not None
    tabs = expand_tables(tabs) if fold else ()
    seg = fold and segs is not None

    def kernel(*refs):
        (p_r, k_r, dw_r, *tab_r), seg_r, (dp_r, dk_r, *gs_r) = _split(refs, 3 + len(tabs) + (4 if seg else 0),
                                                                      seg)
        bi, h, gi = pl.program_id(0), pl.program_id(1), pl.program_id(2)

        def body(c, dk):
            ts = pl.ds(c * L, L)
            _, s = C.mix_fwd(_modes(p_r, bi, ts, h), None, conj, dot)
            if merged:
                dwc = tuple(dw_r[0, bi, ts, h, pl.ds(k * M, M)].astype(F32) for k in (0, 1))
                dkc = C.mix_bwd_dk(dwc, s, dot)
                dw2 = dw_r[0, bi, ts, h, :]
                dsr, dsi = dot.nt(dw2, k_r[h, 0]), dot.nt(dw2, k_r[h, 1])
                dpc = (dsr, -dsi) if conj else (dsr, dsi)
            else:
                dwc = (dw_r[0, bi, ts, h, 0, :].astype(F32), dw_r[0, bi, ts, h, 1, :].astype(F32))
                dkc = C.mix_bwd_dk(dwc, s, dot)
                dpc = C.mix_bwd_dp(dwc, _kmat(k_r, h), conj, dot)
            dp_r[0, bi, ts, h, 0, :] = dpc[0].astype(dp_r.dtype)
            dp_r[0, bi, ts, h, 1, :] = dpc[1].astype(dp_r.dtype)
            if fold:  # cm·pin as a masked load
                dpr = tuple(x.astype(dp_r.dtype).astype(F32) for x in dpc)  # as bwd_p reads it
                mk = _masks(seg_r, bi, c, c * L, L)
                tb = _tabs(tab_r, h)
                gr, gi_ = C.cmul_conj(*dpr, *_pin_cm(tab_r, h, mk, L, M))
                gs_r[0][bi, ts, h, 0, :] = gr.astype(gs_r[0].dtype)
                gs_r[0][bi, ts, h, 1, :] = gi_.astype(gs_r[0].dtype)
                dr, di = C.cmul_conj(*dpr, *tb.pt)
                gs_r[0][bi, ts, h, 2, :] = dr.astype(gs_r[0].dtype)
                gs_r[0][bi, ts, h, 3, :] = di.astype(gs_r[0].dtype)
            return dk[0] + dkc[0], dk[1] + dkc[1]

        dk0 = (jnp.zeros((M, M), F32), jnp.zeros((M, M), F32))
        dk = lax.fori_loop(gi * per, jnp.minimum((gi + 1) * per, NC), body, dk0)
        dk_r[bi, h, gi, 0, :, :] = dk[0]
        dk_r[bi, h, gi, 1, :, :] = dk[1]

    out = (jax.ShapeDtypeStruct((1, B, T, H, 2, M), mdt), jax.ShapeDtypeStruct((B, H, NG, 2, M, M), F32))
    if fold:
        out = out + (jax.ShapeDtypeStruct((B, T, H, 4, M), cdt),)
    plan = mix_plan("bwd_mix", L=L, M=M, n_modes_in=2, mode_bytes=jnp.dtype(p.dtype).itemsize,
                    k_bytes=jnp.dtype(cdt).itemsize * (2 if merged else 1))  # K2 is [2, M, 2M]
    args = (p, kmix, dw, *tabs) + (tuple(segs) if seg else ())
    return _call(kernel, out, (B, H, NG), interpret, plan, "bwd_mix")(*args)


def bwd_p(fq, zk, dp, xs, ys, tabs, segs, *, L, plan, cdt, interpret, factors=None):
    """dfq, dzk [B, T, H, R] (input dtypes), acc rows / cols as in bwd_o; dp [B, T, H, 2, M]. Each program walks
    the whole feature width in sub-blocks of ``plan.block`` and the modes in blocks (p_bwd_modes).
    ``factors``: dp's per-token factors (gs, ds) [B, T, H, 4, M] (``bwd_mix`` with tabs, or ``prescale_p``); the
    kernel then reads them instead of dp (C.p_bwd_modes' ``pre``), and dp is not read."""
    tabs = expand_tables(tabs)
    B, T, H, R = fq.shape
    M = tabs[0].shape[-1]
    sub = plan.block
    NC, nsub = T // L, R // sub
    nmb, mb = _mode_blocks(M)
    per, NG, gz, split = _split_grid(B, H, NC, nmb)
    sums = nmb == 1 or split  # as in bwd_o
    dot, seg = C.Dots(cdt), segs is not None
    pre = factors is not None
    if pre:
        dp = factors  # only its shape and position in the argument list matter: the kernel reads f_r
    merged = MERGED_PLANES and pre and (nmb == 1 or split)
    extra = ()
    if merged:  # see MERGED_PLANES
        xs, ys = _stack_states(xs, ys)
        dp = factors.reshape(*factors.shape[:3], 4 * M)
        extra = (_side_by_side(tabs[5]), _side_by_side(tabs[4]).astype(cdt))  # pe, ps [H, L, 2M]

    def kernel(*refs):
        (fq_r, zk_r, dp_r, xs_r, ys_r, *tab_r), seg_r, (dfq_r, dzk_r, row_r, col_r) = _split(
            refs, 15 + len(extra) + (4 if seg else 0), seg)
        psm_r, pem_r = (tab_r.pop(), tab_r.pop()) if merged else (None, None)
        bi, h = pl.program_id(0), pl.program_id(1)
        gi, mo = _group_and_block(split, nmb)
        first = functools.partial(_first_block_only, mo) if split and merged and PHASE1_ONCE else None
        f_r = dp_r if pre else None
        held = _held_operands(tab_r, h, BWD_HELD, dot.cdt) if nmb == 1 else None

        def body(c, carry):
            t0 = c * L
            # at M = 64 the select's operands pushed bwd_p to 255 registers and 4 B of spills at (16, 96, 64) bf16
            mk = _masks(seg_r, bi, c, t0, L, asm=nmb == 1)
            ts = pl.ds(t0, L)
            msl = lambda m: None if m is None else pl.ds(m * mb, mb)  # noqa: E731
            tabs = lambda m: _tabs(tab_r, h, msl(m), flat_rows=True, held=held)  # noqa: E731
            dp_fn = lambda m: _modes(dp_r, bi, ts, h, msl(m))  # noqa: E731
            ld = _Loads(dict(fq=fq_r, zk=zk_r), xs_r, ys_r, bi, h, c, ts, sub, mb, stacked=M if merged else None)

            def pre_fn(m):  # ((gs re, im), (ds re, im)) [L, mb] float32 of mode block m
                if merged:
                    off, width = (0, M) if m is None else (m * mb, mb)
                    pk = [f_r[bi, ts, h, pl.ds(k * M + off, width)].astype(F32) for k in range(4)]
                else:
                    ms = slice(None) if m is None else msl(m)
                    pk = [f_r[bi, ts, h, k, ms].astype(F32) for k in range(4)]
                return (pk[0], pk[1]), (pk[2], pk[3])

            stacked = None
            if merged:
                stacked = C.Stacked(df=lambda: f_r[bi, ts, h, pl.ds(0, 2 * M)],
                                    pe=_em_pe_loader(pem_r, h, seg_r, mk, L, M),
                                    x=ld.xm, y=ld.ym, ds=lambda: f_r[bi, ts, h, pl.ds(2 * M, 2 * M)],
                                    ps=lambda: psm_r[h])

            def store(j, dfq, dzk):  # each a value, or a thunk formed where it is stored (one live at a time)
                def write():
                    ns = pl.ds(j * sub, sub)
                    dfq_r[bi, ts, h, ns] = (dfq() if callable(dfq) else dfq).astype(dfq_r.dtype)
                    dzk_r[bi, ts, h, ns] = (dzk() if callable(dzk) else dzk).astype(dzk_r.dtype)
                _first_block_only(mo, write)

            return C.p_bwd_modes(dp_fn, ld, store, nsub, nmb, tabs, mk, dot.with_bound(c), L,
                                 store_acc=lambda m, acc: _store_flat_acc(row_r, col_r, bi, h, c, acc, msl(m)),
                                 raw=carry, pre=pre_fn if pre else None, yx=not YX_IN_SCAN, only=mo,
                                 stacked=stacked, first=first)

        raw = lax.fori_loop(gi * per, jnp.minimum((gi + 1) * per, NC), body, _raw_zeros(L, mb) if sums else None)
        if sums:
            _store_raw(row_r, col_r, bi, h, gi, raw, mo, mb)

    out = ((jax.ShapeDtypeStruct(fq.shape, fq.dtype), jax.ShapeDtypeStruct(zk.shape, zk.dtype))
           + (_raw_out(B, H, NG, L, M) if sums else _acc_out(B, H, NC, M)))
    args = (fq, zk, dp, xs, ys, *tabs, *extra) + (tuple(segs) if seg else ())
    dfq, dzk, row, col = _call(kernel, out, (B, H, gz), interpret, plan, "bwd_p")(*args)
    if sums:
        row, col = _fold_raw_sums(row, col, tabs, L, h_pre=pre)
    return dfq, dzk, row, col
