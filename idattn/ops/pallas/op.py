"""The fused operator: padding, tables, segment masks and the ``custom_vjp`` around the kernels.

The operator factors into two linear-recurrence readouts joined by a tiny per-token mode mixing (c):

    P-half   p_t = Xk_t · fq_t ∈ C^M,         Xk_t = lam∘Xk_{t-1} + b ⊗ zk_t      (kernel: fq, zk -> p)
    mixing   w_t = conj(p_t)·K, K = cᴴc (conj)   or   p_t·K, K = cᵀc                [B, T, H, M]
    O-half   o_t = Re(w_t · Xv_t) ∈ R^D,       Xv_t = lam∘Xv_{t-1} + b ⊗ zv_t      (kernel: p, K, zv -> o)

Both kernel families (GPU and TPU): one ``jax.custom_vjp`` over both halves (``_fused``); the mixing runs in the
kernels - on GPU in kernels of its own (fwd_mix, bwd_mix: registers), on TPU inside the O-half kernels - so only
mode vectors (p, w, dw, dp) cross HBM between the halves, in the compute dtype, never an XLA pass. The
inputs are real planes (fq/zk/zv, Re/Im of lam and b, the initial state, K); K = f(c), the
complex <-> plane conversions and the end-of-sequence padding correction are plain JAX, so autodiff handles c,
the complex cotangent conventions of lam / b / initial_state, and out_dtype casts.

Backward of each half (per batch row and head; never a per-step state):
  1. ``scan_fwd``: recompute the forward state before every chunk (one pass, chunk-boundary states only);
  2. ``scan_rev``: the adjoint recurrence in reverse time, Y_c = keep·conj(lamL)∘Y_{c+1} + (cm·conj(pin)∘g)ᵀ·x;
  3. a chunk-parallel kernel (groups of chunks per program) that recomputes the intra-chunk matrices and
     writes the input cotangents, reducing the parameter cotangents on chip to a few M-vectors per program (TPU)
     or carrying their raw [L, M] tiles across the program's chunks for XLA to fold once per head (GPU; with
     several mode blocks, a program per block).

Padding (all zero, sliced off afterwards): T up to a multiple of L at the *end* (outputs are causal, so only
the returned state sees the pad: it is corrected by lam^(-pad), exact per mode); features R, D and modes M up
to the backend's granule (GPU/Triton: a power of two >= 16; TPU: the kernel module's FEATURE_GRANULE, 8 for modes).
Padded modes get all-zero tables and b = 0, so they contribute nothing.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from idattn.ops.pallas import gpu, tpu

F32 = jnp.float32


def pallas_available() -> bool:
    """True when the default backend is a GPU or a TPU (where the kernels compile natively)."""
    try:
        return jax.default_backend() in ("gpu", "cuda", "rocm", "tpu")
    except Exception:  # pragma: no cover
        return False


def chunk_size_supported(chunk_size: int, family: str | None = None) -> bool:
    """Whether the kernels of `family` (default: the backend's) take this chunk length: GPU (Triton) a power of
    two >= 16, TPU a multiple of 8."""
    if family is None:
        family = "tpu" if jax.default_backend() == "tpu" else "gpu"
    L = int(chunk_size)
    if family == "gpu":
        return L >= 16 and not (L & (L - 1))
    return L % 8 == 0


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _round_up(n: int, k: int) -> int:
    return -(-int(n) // k) * k


def _kernels(family):
    return gpu if family == "gpu" else tpu


# ----------------------------------------------------------------------------------------------------------------
# tables and masks


def _tables(lam_re, lam_im, b_re, b_im, L: int, m_pad: int):
    """Power tables from log(lam) (principal branch) times integer exponents, float32, padded to m_pad modes
    (padded modes: sp = 1 so that its on-chip reciprocal stays finite, and b = lamL = lam^mu = 0, so that
    they contribute nothing).

    Returns (sp [H, 2, L, m_pad] = lam^(mu-j), lmu1 [H, 2, 1, m_pad] = lam^(mu+1), lmu [H, 2, 1, m_pad] = lam^mu,
    laml [H, 2, m_pad, 1] = lam^L, b [H, 2, 1, m_pad]); see _chunk.Tabs for the tables rebuilt from them."""
    lam = lax.complex(lam_re.astype(F32), lam_im.astype(F32))
    loglam = jnp.log(lam)  # [H, M]
    m = lam_re.shape[-1]
    i = jnp.arange(L, dtype=F32)
    mu = (L - 1) / 2.0

    def planes(z, fill=0.0):  # [H, ..., M] complex -> [H, 2, ..., m_pad]
        t = jnp.stack([z.real, z.imag], axis=1)
        pad = [(0, 0)] * (t.ndim - 1) + [(0, m_pad - m)]
        t = jnp.pad(t, pad)
        if fill and m_pad > m:
            t = t.at[:, 0, ..., m:].set(fill)
        return t

    sp = planes(jnp.exp((mu - i)[None, :, None] * loglam[:, None, :]), fill=1.0)
    lmu1 = planes(jnp.exp((mu + 1.0) * loglam))[:, :, None, :]
    lmu = planes(jnp.exp(mu * loglam))[:, :, None, :]
    laml = planes(jnp.exp(L * loglam))[..., None]
    b = planes(lax.complex(b_re.astype(F32), b_im.astype(F32)))[:, :, None, :]
    return (sp, lmu1, lmu, laml, b)


def _segment_arrays(segment_ids, B: int, T: int, tp: int, L: int):
    """doc [B, tp] int32 (d_t = cumsum of id changes, edge-padded so the pad never starts a document),
    cm / em [B, tp, 1] float32 and keep [B, NC] float32 (see idattn/ops/pallas/_chunk.py)."""
    seg = jnp.asarray(segment_ids)
    change = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), (seg[:, 1:] != seg[:, :-1]).astype(jnp.int32)], axis=1)
    doc = jnp.cumsum(change, axis=1).astype(jnp.int32)
    doc = jnp.pad(doc, ((0, 0), (0, tp - T)), mode="edge")
    nc = tp // L
    dc = doc.reshape(B, nc, L)
    prev = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), dc[:, :-1, -1]], axis=1)  # doc of the carried state
    last = dc[:, :, -1]
    cm = (dc == prev[:, :, None]).astype(F32).reshape(B, tp, 1)
    em = (dc == last[:, :, None]).astype(F32).reshape(B, tp, 1)
    keep = (last == prev).astype(F32)
    return doc, cm, em, keep


def _param_grads(row, col, lam_re, lam_im, L: int, yxs=()):
    """Finish the parameter cotangents from the kernels' on-chip sums (see _chunk.py):
    dlam = (s_log + L·conj(lamL)·dlamL) / conj(lam), db = s_b; returned as (Re, Im) planes of [H, M].
    yxs: dlamL sums formed by the GPU's adjoint scans ([B, H, blocks, 2, M] each; gpu.YX_IN_SCAN), added to col's."""
    m = lam_re.shape[-1]
    row = jnp.sum(row, axis=(0, 2))[:, :, 0, :m]   # [H, 4, M]
    col = jnp.sum(col, axis=(0, 2))[:, :, :m, 0]   # [H, 2, M]
    for yx in yxs:
        col = col + jnp.sum(yx, axis=(0, 2))[:, :, :m]
    lam = lax.complex(lam_re.astype(F32), lam_im.astype(F32))
    laml = jnp.exp(L * jnp.log(lam))
    s_log = lax.complex(row[:, 0], row[:, 1]) + L * jnp.conj(laml) * lax.complex(col[:, 0], col[:, 1])
    dlam = s_log / jnp.conj(lam)
    return (dlam.real.astype(lam_re.dtype), dlam.imag.astype(lam_im.dtype),
            row[:, 2].astype(lam_re.dtype), row[:, 3].astype(lam_re.dtype))


# ----------------------------------------------------------------------------------------------------------------
# the two halves


def _segs(segs):
    return None if segs is None or len(segs) == 0 else segs




# ----------------------------------------------------------------------------------------------------------------
# the fused operator (both kernel families): one custom_vjp over both halves, the mode
# mixing inside the O-half kernels, so that only p (forward) and dp (backward) cross HBM between the halves


@dataclasses.dataclass(frozen=True)
class _FusedCfg:
    L: int
    cdt: str             # matmul operand dtype
    mdt: str             # dtype of p / dp between the kernels (the compute dtype)
    sdt: str             # dtype of the per-chunk states stored for the backward
    interpret: bool
    conj: bool
    has_k: bool          # a mixing matrix K (else identity: w = conj(p) or p)
    save_states: bool
    out_dtype: str
    plans: tuple         # ((kernel name, gpu.KernelPlan), ...)
    family: str = "gpu"  # the kernel module (tpu.py plans its own grid: its plans are None)
    parallel_fwd: bool = False  # GPU: states by scan_fwd, then the chunk-parallel readouts (GPU_PARALLEL_FWD_MIN_T)


def _gpu_plans(K, bh, L, r_pad, d_pad, m_pad, cdt, has_k):
    """Feature blocks and Triton tuning of the GPU kernels from the shapes and the card's shared memory
    (``gpu.choose``; fwd_mix and bwd_mix plan their own stages, ``gpu.mix_plan``)."""
    e = jnp.dtype(cdt).itemsize
    lim = K.smem_limit()
    kw = dict(bh=bh, L=L, M=m_pad, in_bytes=e, mode_bytes=e, state_bytes=e, limit=lim)
    # fwd_p / bwd_o / bwd_p keep whole features (target_programs=0): the backward walks them in sub-blocks, fwd_p
    # splits only as far as gpu.MAX_STATE or shared memory ask (fwd_mix adds its partial p sums); fwd_o and the
    # scans split freely for parallelism. The mixing runs in fwd_mix / bwd_mix (gpu.mix_plan): the O-half
    # kernels read w and never hold K.
    plans = dict(fwd_p=K.choose("fwd_p", n=r_pad, target_programs=0, **kw),
                 fwd_o=K.choose("fwd_o", n=d_pad, **kw),
                 fwd_p_readout=K.choose("fwd_p_readout", n=r_pad, target_programs=0, **kw),
                 fwd_o_readout=K.choose("fwd_o_readout", n=d_pad, target_programs=0, **kw),
                 scan_fwd_k=K.choose("scan_fwd", n=r_pad, target_programs=K.SCAN_TARGET_PROGRAMS, **kw),
                 scan_fwd_v=K.choose("scan_fwd", n=d_pad, target_programs=K.SCAN_TARGET_PROGRAMS, **kw),
                 scan_rev_k=K.choose("scan_rev", n=r_pad, target_programs=K.SCAN_TARGET_PROGRAMS, **kw),
                 scan_rev_v=K.choose("scan_rev", n=d_pad, target_programs=K.SCAN_TARGET_PROGRAMS, **kw),
                 bwd_o=K.choose("bwd_o", n=d_pad, target_programs=0, **kw),
                 bwd_p=K.choose("bwd_p", n=r_pad, target_programs=0, **kw))
    return tuple(sorted(plans.items()))


def _add_partials(x):
    """[n, B, T, H, 2, M] partial sums over feature blocks -> [B, T, H, 2, M] (a free reshape when n = 1)."""
    return x[0] if x.shape[0] == 1 else jnp.sum(x.astype(F32), axis=0).astype(x.dtype)


class _ForwardOut(NamedTuple):
    """A serial forward kernel's results (fwd_p: p's partials, Xk_T; fwd_o: o, Xv_T): the value, the state after
    the last chunk, and the states before every chunk (None unless asked for with save_sdt, for the backward)."""
    value: jax.Array
    final_state: jax.Array
    chunk_states: Optional[jax.Array]

    @classmethod
    def of(cls, outs) -> "_ForwardOut":
        return cls(outs[0], outs[1], outs[2] if len(outs) > 2 else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(cfg: _FusedCfg, fq, zk, zv, kmix, lam_re, lam_im, b_re, b_im, xk0, xv0, segs):
    # not differentiated (inference, prefill): nothing to save for a backward
    cfg = dataclasses.replace(cfg, save_states=False)
    return _forward(cfg, fq, zk, zv, kmix, lam_re, lam_im, b_re, b_im, xk0, xv0, segs, residuals=False)[0]


def _fused_fwd(cfg, fq, zk, zv, kmix, lam_re, lam_im, b_re, b_im, xk0, xv0, segs):
    return _forward(cfg, fq, zk, zv, kmix, lam_re, lam_im, b_re, b_im, xk0, xv0, segs, residuals=True)


def _forward(cfg, fq, zk, zv, kmix, lam_re, lam_im, b_re, b_im, xk0, xv0, segs, *, residuals):
    """Both halves. GPU: fwd_p, then (with K) fwd_mix (w = s·K, a kernel of its own), then fwd_o reads w (or
    fwd_mix's per-token factors qu of w, op.GPU_FUSED_FACTORS); the backward reads the saved w or qu (and p, for
    dK). TPU: fwd_o mixes p itself. Returns ((o, Xk_T, Xv_T), the residuals or None)."""
    K = _kernels(cfg.family)
    P = dict(cfg.plans)
    tabs = _tables(lam_re, lam_im, b_re, b_im, cfg.L, xk0.shape[-2])
    sg, km = _segs(segs), (kmix if cfg.has_k else None)
    save = jnp.dtype(cfg.sdt) if cfg.save_states else None
    kw = dict(L=cfg.L, cdt=cfg.cdt, interpret=cfg.interpret, save_sdt=save)
    mdt, odt = jnp.dtype(cfg.mdt), jnp.dtype(cfg.out_dtype)
    w = None
    if cfg.family == "gpu":
        # long T (cfg.parallel_fwd): the serial passes only carry the states (scan_fwd) and the readouts run
        # chunk-parallel from them; those states are the backward's saved states when save_states
        par = cfg.parallel_fwd
        scan_kw = dict(L=cfg.L, cdt=cfg.cdt, interpret=cfg.interpret, sdt=jnp.dtype(cfg.sdt), final=True)
        read_kw = dict(L=cfg.L, cdt=cfg.cdt, interpret=cfg.interpret)
        pre = GPU_PRESCALED_MODES
        if par:
            xsk, xkt = K.scan_fwd(zk, tabs, xk0, sg, plan=P["scan_fwd_k"], name="scan_fwd_k", **scan_kw)
            p = K.fwd_p(fq, zk, tabs, None, sg, plan=P["fwd_p_readout"], mdt=mdt, states=xsk, **read_kw)[0]
        else:
            p, xkt, xsk = _ForwardOut.of(K.fwd_p(fq, zk, tabs, xk0, sg, plan=P["fwd_p"], mdt=mdt, **kw))
        mix_kw = dict(conj=cfg.conj, L=cfg.L, cdt=cfg.cdt, mdt=mdt, interpret=cfg.interpret, write_p=residuals)
        qu = None
        if pre and GPU_FUSED_FACTORS:  # the mixing and fwd_o's factors in one kernel (gpu.fwd_mix with tabs);
            # w is not written: the backward reads q and u from qu instead (bwd_o, the O-half scan)
            w, p, qu = K.fwd_mix(p, km, tabs=tabs, segs=sg, write_w=False, **mix_kw)
            g, gconj = qu, False
        else:
            if km is not None or p.shape[0] > 1:  # the mixing and / or the sum of fwd_p's partials: fwd_mix
                w, p = K.fwd_mix(p, km, **mix_kw)
            g, gconj = (p[0], cfg.conj) if w is None else (w[0], False)
            if pre:  # fwd_o's per-token factors w∘pt and cm·w∘pin formed in XLA (gpu.prescale_fwd_o)
                g, gconj = K.prescale_fwd_o(g, tabs, sg, L=cfg.L, conj=gconj, cdt=cfg.cdt), False
        w = None if w is None else w[0]
        p = None if p is None else p[0]
        if par:
            xsv, xvt = K.scan_fwd(zv, tabs, xv0, sg, plan=P["scan_fwd_v"], name="scan_fwd_v", **scan_kw)
            o = K.fwd_o(g, zv, tabs, None, sg, conj=gconj, plan=P["fwd_o_readout"], out_dtype=odt, states=xsv,
                        prescaled=pre, **read_kw)[0]
            if not cfg.save_states:
                xsk = xsv = None  # the backward recomputes them (memory, as asked)
        else:
            o, xvt, xsv = _ForwardOut.of(K.fwd_o(g, zv, tabs, xv0, sg, conj=gconj, plan=P["fwd_o"], out_dtype=odt,
                                                 prescaled=pre, **kw))
    else:
        qu = None
        p_parts, xkt, xsk = _ForwardOut.of(K.fwd_p(fq, zk, tabs, xk0, sg, plan=P["fwd_p"], mdt=mdt, **kw))
        p = _add_partials(p_parts)
        o, xvt, xsv = _ForwardOut.of(K.fwd_o(p, km, zv, tabs, xv0, sg, conj=cfg.conj, plan=P["fwd_o"],
                                             out_dtype=odt, **kw))
    if not residuals:
        return (o, xkt, xvt), None
    return (o, xkt, xvt), (fq, zk, zv, kmix, lam_re, lam_im, b_re, b_im, xk0, xv0, segs, p, xsk, xsv, w, qu)


def _fused_bwd(cfg, res, cts):
    K = _kernels(cfg.family)
    fq, zk, zv, kmix, lam_re, lam_im, b_re, b_im, xk0, xv0, segs, p, xsk, xsv, w, qu = res
    do, dxkt, dxvt = cts
    P = dict(cfg.plans)
    tabs = _tables(lam_re, lam_im, b_re, b_im, cfg.L, xk0.shape[-2])
    sg, km = _segs(segs), (kmix if cfg.has_k else None)
    kw = dict(L=cfg.L, cdt=cfg.cdt, interpret=cfg.interpret)
    do = do.astype(zv.dtype)
    gsk = None
    if xsv is None:
        xsv = K.scan_fwd(zv, tabs, xv0, sg, plan=P["scan_fwd_v"], sdt=cfg.sdt, name="scan_fwd_v", **kw)
    # the GPU's adjoint scans also form the dlamL sums from the forward's states (gpu.YX_IN_SCAN): a third output
    yx_in_scan = getattr(K, "YX_IN_SCAN", False)
    yxs = []

    def scan_rev(*args, xs, **kws):
        if not yx_in_scan:
            return K.scan_rev(*args, **kws)
        ys, y0, yx = K.scan_rev(*args, xs=xs, **kws)
        yxs.append(yx)
        return ys, y0
    pre = cfg.family == "gpu" and GPU_PRESCALED_SCAN
    if pre and qu is not None:  # the forward's fwd_pw wrote u = cm·pin∘g'; the factor is conj(u)
        ysv, y0v = scan_rev(do, qu, tabs, dxvt.astype(F32), sg, plan=P["scan_rev_v"], sdt=cfg.sdt, xs=xsv,
                            conj_g=True, name="scan_rev_v", prescaled=True, gs_planes=(2, 3), gs_conj=True, **kw)
    elif pre:  # the adjoint scans' per-token factor formed in XLA (gpu.prescale_rev): g' = conj(w), or p conj'ed
        gsv = K.prescale_rev(p if w is None else w, tabs, sg, L=cfg.L, conj=not (w is None and cfg.conj),
                             cdt=cfg.cdt)
        ysv, y0v = scan_rev(do, gsv, tabs, dxvt.astype(F32), sg, plan=P["scan_rev_v"], sdt=cfg.sdt, xs=xsv,
                            conj_g=True, name="scan_rev_v", prescaled=True, **kw)
    # the forward's q = w∘pt for bwd_o (GPU, fused factors: then the forward wrote no w)
    fo = dict(factors=qu) if pre and qu is not None else {}
    if not (cfg.family == "gpu" and cfg.has_k):  # no mixing matrix (GPU), or the TPU kernels: the O-half
        if not pre:                              # kernels mix p per chunk themselves
            ysv, y0v = scan_rev(do, p, tabs, dxvt.astype(F32), sg, plan=P["scan_rev_v"], sdt=cfg.sdt, xs=xsv,
                                conj_g=True, kmix=km, mix_conj=cfg.conj, name="scan_rev_v", **kw)
        dp, dzv, row_o, col_o, dk = K.bwd_o(p, km, zv, do, xsv, ysv, tabs, sg, conj=cfg.conj, plan=P["bwd_o"],
                                            mdt=jnp.dtype(cfg.mdt), **fo, **kw)
    else:  # GPU with K: the O-half reads the forward's w or q (identity mixing), bwd_mix maps dw to dp and dK
        if not pre:
            ysv, y0v = scan_rev(do, w, tabs, dxvt.astype(F32), sg, plan=P["scan_rev_v"], sdt=cfg.sdt, xs=xsv,
                                conj_g=True, name="scan_rev_v", **kw)
        dw, dzv, row_o, col_o, _ = K.bwd_o(w, None, zv, do, xsv, ysv, tabs, sg, conj=False, plan=P["bwd_o"],
                                           mdt=jnp.dtype(cfg.mdt), **fo, **kw)
        if pre and GPU_FUSED_FACTORS:  # the P-half scan's factor formed by bwd_mix beside dp
            dp, dk, gsk = K.bwd_mix(p, km, dw, conj=cfg.conj, mdt=jnp.dtype(cfg.mdt), tabs=tabs, segs=sg, **kw)
        else:
            dp, dk = K.bwd_mix(p, km, dw, conj=cfg.conj, mdt=jnp.dtype(cfg.mdt), **kw)
    dp = _add_partials(dp)
    if xsk is None:
        xsk = K.scan_fwd(zk, tabs, xk0, sg, plan=P["scan_fwd_k"], sdt=cfg.sdt, name="scan_fwd_k", **kw)
    if pre:
        if gsk is None:  # dp's factors for the P-half scan (planes 0, 1) and bwd_p (all four)
            gsk = K.prescale_p(dp, tabs, sg, L=cfg.L, cdt=cfg.cdt) if GPU_FUSED_FACTORS else K.prescale_rev(
                dp, tabs, sg, L=cfg.L, conj=False, cdt=cfg.cdt)
        ysk, y0k = scan_rev(fq, gsk, tabs, dxkt.astype(F32), sg, plan=P["scan_rev_k"], sdt=cfg.sdt, xs=xsk,
                            conj_g=False, name="scan_rev_k", prescaled=True, **kw)
    else:
        ysk, y0k = scan_rev(fq, dp, tabs, dxkt.astype(F32), sg, plan=P["scan_rev_k"], sdt=cfg.sdt, xs=xsk,
                            conj_g=False, name="scan_rev_k", **kw)
    ready = pre and GPU_FUSED_FACTORS  # bwd_p reads dp's factors (gs, ds) instead of dp
    dfq, dzk, row_p, col_p = K.bwd_p(fq, zk, dp, xsk, ysk, tabs, sg, plan=P["bwd_p"],
                                     **(dict(factors=gsk) if ready else {}), **kw)
    dlam_re, dlam_im, db_re, db_im = _param_grads(jnp.concatenate([row_o, row_p], axis=2),
                                      jnp.concatenate([col_o, col_p], axis=2), lam_re, lam_im, cfg.L, yxs)
    dkmix = jnp.sum(dk, axis=(0, 2)) if cfg.has_k else jnp.zeros_like(kmix)
    return (dfq, dzk, dzv, dkmix, dlam_re, dlam_im, db_re, db_im, y0k, y0v,
            None if segs is None else jax.tree.map(jnp.zeros_like, segs))


_fused.defvjp(_fused_fwd, _fused_bwd)


# ----------------------------------------------------------------------------------------------------------------
# public entry


def _planes(z):
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=2)  # [B, H, M, N] -> [B, H, 2, M, N]


# From this padded length on, the GPU forward runs its readouts chunk-parallel from scan_fwd's states (fla's
# chunk_fwd_h + chunk_fwd_o) instead of in the serial passes that carry the state: the scans' body is one
# [M, L] x [L, N] product where the serial kernels' is four, the readouts have B·H·blocks·groups programs, and the
# states are what the backward saves anyway. 1024 since 2026-12-06 (8192 before, a guess): compiled for sm_90a,
# the cost model predicts the chunk-parallel forward faster at every target T, forward + backward at
# (16, 128, 32) 7.28 against 7.57 ms at 1K and 6.85 against 7.46 at 4K (predictions; docs/kernels-results.md).
# Below 1K no configuration was compiled, so the serial kernels stay there.
GPU_PARALLEL_FWD_MIN_T = 1024
# The GPU backward's adjoint scans read their per-token factor cm·conj(pin)∘g formed in XLA (gpu.prescale_rev)
# instead of forming it per chunk and feature block: compiled for sm_90a (bf16, chunk 64, M = 32) the loop falls
# from 1,081-1,145 instructions to 159 and from 100 registers to 64 (docs/kernels-results.md, "Where the time goes").
# False: the kernel forms it (the form the 2026-12-04 device run measured).
GPU_PRESCALED_SCAN = True
# The same for the GPU forward's O-half: fwd_o reads q = w∘pt and u = cm·w∘pin formed in XLA
# (gpu.prescale_fwd_o) instead of forming them per chunk and feature block. False: the 2026-12-04 form.
GPU_PRESCALED_MODES = True
# With the above, the per-token factors are formed inside kernels instead of in XLA's passes: fwd_mix also writes
# fwd_o's q, u (replaces prescale_fwd_o; then it runs without c too; the backward's O-half scan factor is conj(u),
# read from the same tensor), and bwd_mix writes dp's two factors beside dp, the P-half scan's cm·conj(pin)∘dp and
# conj(pt)∘dp, which bwd_p reads instead of dp (without c, XLA's prescale_p forms both; replaces prescale_rev(dp)):
# bwd_p then forms no product with the pt / pin tables.
# False: the XLA passes (the form before 2026-12-06).
GPU_FUSED_FACTORS = True


def _env_save_states():
    v = os.environ.get("IDATTN_PALLAS_SAVE_STATES", "").strip().lower()
    return None if v == "" else v in ("1", "true", "yes")


_SAVE_STATES = _env_save_states()
# Per family when neither the call, set_save_states nor the environment says: the GPU kernels save the chunk
# states in the forward (the backward then skips its two serial scan_fwd passes; under the models' remat the
# states live only within a layer's backward: B·H·T/L·2·M·(R + D) elements in the compute dtype). The TPU
# kernels recompute them (docs/pods.md's fit table was measured so).
SAVE_STATES_DEFAULT = {"gpu": True, "tpu": False}


def set_save_states(flag: bool | None) -> bool | None:
    """Default for ``save_states`` for every family (also env IDATTN_PALLAS_SAVE_STATES=0/1); None restores the
    per-family default (SAVE_STATES_DEFAULT). Returns the previous value."""
    global _SAVE_STATES
    prev, _SAVE_STATES = _SAVE_STATES, (None if flag is None else bool(flag))
    return prev


def _mix_local(fq, zk, zv, lam, b, c=None, *, conj=True, chunk_size=64, segment_ids=None,
               initial_state=None, return_state=False, out_dtype=None, interpret=False, family="gpu",
               save_states=None):
    """One device's fused-kernel ``interdomain_mix`` with a fixed kernel family and interpret flag (the public
    entry ``interdomain_mix_pallas`` chooses both at lowering time and partitions over the mesh)."""
    if family not in ("gpu", "tpu"):
        raise ValueError(f"family must be 'gpu' or 'tpu', got {family!r}")
    B, T, H, R = fq.shape
    D = zv.shape[-1]
    M = lam.shape[-1]
    L = int(chunk_size)
    if family == "gpu" and not chunk_size_supported(L, "gpu"):
        raise ValueError(f"chunk_size: the GPU (Triton) kernels need a power of two >= 16, got {L}; use 64")
    if family == "tpu" and not chunk_size_supported(L, "tpu"):
        raise ValueError(f"chunk_size: the TPU kernels need a multiple of 8, got {L}; use 128")
    out_dtype = jnp.dtype(zv.dtype if out_dtype is None else out_dtype)
    in_dt = jnp.result_type(fq.dtype, zk.dtype, zv.dtype)
    cdt = jnp.bfloat16 if in_dt == jnp.bfloat16 else F32
    io_dt = cdt  # kernel input dtype (f64/f16 inputs are computed as f32)
    if family == "gpu":
        r_pad, d_pad, m_pad = _next_pow2(max(R, 16)), _next_pow2(max(D, 16)), _next_pow2(max(M, 16))
    else:
        fg = getattr(_kernels(family), "FEATURE_GRANULE", 128)  # tpu.py packs heads into 128 lanes itself
        r_pad, d_pad, m_pad = _round_up(R, fg), _round_up(D, fg), _round_up(M, 8)
    tp = _round_up(T, L)
    pad_t = tp - T

    def prep(x, n, np_):
        x = x.astype(io_dt)
        if pad_t or np_ != n:
            x = jnp.pad(x, ((0, 0), (0, pad_t), (0, 0), (0, np_ - n)))
        return x

    fq_, zk_, zv_ = prep(fq, R, r_pad), prep(zk, R, r_pad), prep(zv, D, d_pad)
    lam = jnp.asarray(lam).astype(jnp.complex64)
    b = jnp.asarray(b).astype(jnp.complex64)
    lam_re, lam_im, b_re, b_im = jnp.real(lam), jnp.imag(lam), jnp.real(b), jnp.imag(b)

    if initial_state is None:
        xk0 = jnp.zeros((B, H, 2, m_pad, r_pad), F32)
        xv0 = jnp.zeros((B, H, 2, m_pad, d_pad), F32)
    else:
        k0, v0 = initial_state
        xk0 = jnp.pad(_planes(jnp.asarray(k0).astype(jnp.complex64)).astype(F32),
                      ((0, 0), (0, 0), (0, 0), (0, m_pad - M), (0, r_pad - R)))
        xv0 = jnp.pad(_planes(jnp.asarray(v0).astype(jnp.complex64)).astype(F32),
                      ((0, 0), (0, 0), (0, 0), (0, m_pad - M), (0, d_pad - D)))
    segs = None if segment_ids is None else _segment_arrays(segment_ids, B, T, tp, L)
    if segs is not None and family == "gpu":
        segs = (gpu.doc_starts(segs[0], L),) + segs[1:]

    if save_states is None:
        save_states = SAVE_STATES_DEFAULT[family] if _SAVE_STATES is None else _SAVE_STATES
    save = bool(save_states)
    kmat = None
    if c is not None:
        c = jnp.asarray(c).astype(jnp.complex64)
        # HIGHEST: XLA's default f32 dot on a GPU is TF32 (10-bit mantissa), which cost the f32 kernel ~3e-4
        # relative in o and every gradient on an H200 (scripts/gpu_check.py, 2026-12-04); [H, M, M] is tiny
        kmat = jnp.einsum("hkm,hkn->hmn", jnp.conj(c) if conj else c, c, precision=lax.Precision.HIGHEST)
    K = _kernels(family)
    kmix = None if kmat is None else jnp.pad(jnp.stack([kmat.real, kmat.imag], axis=1).astype(F32),
                                             ((0, 0), (0, 0), (0, m_pad - M), (0, m_pad - M)))
    cfg = _FusedCfg(L=L, cdt=jnp.dtype(cdt).name, mdt=jnp.dtype(cdt).name, sdt=jnp.dtype(cdt).name,
                    interpret=bool(interpret), conj=bool(conj), has_k=kmix is not None, save_states=save,
                    out_dtype=jnp.dtype(out_dtype).name,
                    plans=(_gpu_plans(K, B * H, L, r_pad, d_pad, m_pad, cdt, kmix is not None) if family == "gpu"
                           else K.plans()), family=family,
                    parallel_fwd=family == "gpu" and tp >= GPU_PARALLEL_FWD_MIN_T)
    o, xkt, xvt = _fused(cfg, fq_, zk_, zv_, jnp.zeros((0,), F32) if kmix is None else kmix,
                         lam_re, lam_im, b_re, b_im, xk0, xv0, segs)
    o = o[:, :T, :, :D].astype(out_dtype)
    if not return_state:
        return o

    corr = jnp.exp(-pad_t * jnp.log(lam))[None, :, :, None]  # undo the decay over the end padding
    xk = lax.complex(xkt[:, :, 0, :M, :R], xkt[:, :, 1, :M, :R]) * corr
    xv = lax.complex(xvt[:, :, 0, :M, :D], xvt[:, :, 1, :M, :D]) * corr
    return o, (xk, xv)


# ----------------------------------------------------------------------------------------------------------------
# kernel family by lowering platform, and partitioning over the mesh

# Platforms whose compiler runs each family natively (jax.lax.platform_dependent names).
_NATIVE = {"tpu": ("tpu",), "gpu": ("cuda", "rocm")}


_FALLBACK_WARNED = []


def triton_backend_available() -> bool:
    """Whether this jax still has the Pallas Triton backend the GPU kernels are written for (deprecated from
    jax 0.11 in favour of Mosaic GPU; docs/kernels.md, 'JAX versions')."""
    return gpu.triton_params_class() is not None


def _gpu_branch(fn, gpu_fallback, platform="cuda"):
    """The native GPU branch: the Triton kernels, or - on a jax without the Triton backend - ``gpu_fallback``
    (the XLA chunked operator) with one warning; without a fallback, gpu.TritonUnavailable at trace time.
    On ROCm the kernels are traced without their inline PTX (``gpu.inline_ptx``)."""
    if triton_backend_available() or gpu_fallback is None:
        if platform == "rocm":
            def rocm(*args):
                with gpu.inline_ptx(False):
                    return fn(*args, family="gpu", interpret=False)
            return rocm
        return functools.partial(fn, family="gpu", interpret=False)

    def fallback(*args):
        if not _FALLBACK_WARNED:
            _FALLBACK_WARNED.append(True)
            warnings.warn(f"idattn: jax {jax.__version__} has no Pallas Triton backend, so impl='pallas' runs the XLA "
                          f"chunked operator on GPU (same results, slower); see docs/kernels.md, 'JAX versions'",
                          RuntimeWarning, stacklevel=2)
        return gpu_fallback(*args)
    return fallback


def _local_gpu_platform() -> str | None:
    """'cuda' or 'rocm' for this process's GPU backend, None without one."""
    if jax.default_backend() != "gpu":
        return None
    version = str(getattr(jax.devices()[0].client, "platform_version", "")).lower()
    return "rocm" if "rocm" in version else "cuda"


def _platform_dispatch(fn, args, family, interpret, chunk_size, gpu_fallback=None):
    """Calls fn(*args, family=..., interpret=...) with the kernels of the platform the program is *lowered for*
    (``jax.lax.platform_dependent``), not the host's default backend: a CPU host compiling for a TPU topology gets
    Mosaic kernels, for CUDA the Triton kernels, and a CPU run the kernels in interpret mode. `family` / `interpret`
    given: that choice only (interpret=None then means: natively on the family's platforms, interpreted elsewhere).
    """
    if family is not None and family not in ("gpu", "tpu"):
        raise ValueError(f"family must be 'gpu' or 'tpu', got {family!r}")
    if interpret is not None:
        fam = family or ("tpu" if jax.default_backend() == "tpu" else "gpu")
        if fam == "gpu" and not interpret and (context_platform() or _local_gpu_platform()) == "rocm":
            with gpu.inline_ptx(False):  # Triton's AMD backend takes no PTX
                return fn(*args, family=fam, interpret=False)
        return fn(*args, family=fam, interpret=bool(interpret))
    fams = [family] if family is not None else [f for f in ("tpu", "gpu") if chunk_size_supported(chunk_size, f)]
    if not fams:
        raise ValueError(f"chunk_size: {chunk_size} suits neither kernel family (GPU/Triton: a power of two >= 16; "
                         f"TPU: a multiple of 8); use 64 or 128")
    plat = context_platform()
    if plat is not None:  # the mesh in context fixes the platform: trace one family only (a third of the work)
        native = [f for f in fams if plat in _NATIVE[f]]
        if native:
            if native[0] == "gpu":
                return _gpu_branch(fn, gpu_fallback, plat)(*args)
            return fn(*args, family=native[0], interpret=False)
        return fn(*args, family="gpu" if "gpu" in fams else fams[0], interpret=True)
    branches = {}
    for fam in fams:
        for plat in _NATIVE[fam]:
            branches[plat] = (_gpu_branch(fn, gpu_fallback, plat) if fam == "gpu"
                              else functools.partial(fn, family=fam, interpret=False))
    # Everything else (CPU) runs the kernels in interpret mode: the GPU family where it takes the chunk size.
    default = functools.partial(fn, family="gpu" if "gpu" in fams else fams[0], interpret=True)
    return lax.platform_dependent(*args, default=default, **branches)


def context_platform() -> str | None:
    """The platform of the devices of the mesh in context (``jax.set_mesh``; inside ``jit`` its abstract mesh
    keeps the device kind): the program is lowered for them. "tpu", "cuda", "rocm" or "cpu"; None without a mesh
    (then ``jax.lax.platform_dependent`` decides at lowering time)."""
    try:
        mesh = jax.sharding.get_abstract_mesh()
        dev = None if mesh is None or getattr(mesh, "empty", True) else getattr(mesh, "abstract_device", None)
    except Exception:
        return None
    plat = getattr(dev, "platform", None)
    if not plat:
        return None
    plat = str(plat).lower()
    if plat == "gpu":  # a device's platform says "gpu"; platform_dependent's names are cuda / rocm
        plat = "rocm" if "rocm" in str(getattr(dev, "device_kind", "")).lower() else "cuda"
    return plat


def logical_mesh_axes(names):
    """Mesh axes of logical axis names under flax's logical axis rules, when flax and rules are present (the
    trainer sets them); None otherwise. Imported lazily: idattn.ops imports with jax and numpy only."""
    try:
        from flax.linen import partitioning as nn_partitioning  # noqa: PLC0415 flax optional: ops needs jax, numpy only
        rules = nn_partitioning.get_axis_rules()
    except Exception:  # flax missing: no rules
        return None
    if not rules:
        return None
    out = []
    for name in names:
        axes = dict(rules).get(name)
        if axes is None:
            out.append(())
        else:
            out.append(tuple(axes) if isinstance(axes, (tuple, list)) else (axes,))
    return out


# Axis names of idattn.train.sharding's mesh, used when no logical rules are set.
_DEFAULT_BATCH_AXES = ("dcn", "data", "fsdp")
_DEFAULT_HEAD_AXES = ("tensor",)


def mesh_partition(batch: int, heads: int, batch_axes=None, head_axes=None):
    """How the context mesh splits an operator call that is independent per batch row and per head.

    The mesh is the one in context (``jax.set_mesh`` / ``jax.sharding.get_abstract_mesh()``; the trainer sets
    it); the axes that carry the batch and the heads come from the arguments, else flax's logical axis rules
    ("batch", "heads"), else the trainer's names (dcn, data, fsdp / tensor). Returns None without a mesh (or with
    a mesh of one device), else (mesh, batch_axes, head_axes) with only axes of size > 1. Batch axes that do not
    divide `batch` are left out (those rows are computed replicated, e.g. a decode batch of 1); heads that the
    head axes do not divide are refused, naming the numbers.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or getattr(mesh, "empty", True) or mesh.size <= 1:
        return None
    if batch_axes is None or head_axes is None:
        logical = logical_mesh_axes(("batch", "heads"))
        if logical is not None:
            batch_axes = logical[0] if batch_axes is None else batch_axes
            head_axes = logical[1] if head_axes is None else head_axes
        batch_axes = _DEFAULT_BATCH_AXES if batch_axes is None else batch_axes
        head_axes = _DEFAULT_HEAD_AXES if head_axes is None else head_axes
    shape = dict(mesh.shape)
    b_axes = []
    rest = int(batch)
    for ax in batch_axes:
        n = int(shape.get(ax, 1))
        if n > 1 and rest % n == 0:
            b_axes.append(ax)
            rest //= n
    h_axes = tuple(ax for ax in head_axes if int(shape.get(ax, 1)) > 1 and ax not in b_axes)
    nh = 1
    for ax in h_axes:
        nh *= int(shape[ax])
    if heads % nh:
        raise ValueError(f"heads: the mesh splits heads over {'x'.join(h_axes)} = {nh} devices but the layer has "
                         f"{heads} heads ({heads} % {nh} = {heads % nh}); use a head count divisible by {nh} or a "
                         f"smaller tensor axis (config.mesh.tensor)")
    if not b_axes and not h_axes:
        return None
    return mesh, tuple(b_axes), h_axes


def partition_spec(*dims):
    return PartitionSpec(*[(d if len(d) > 1 else d[0]) if d else None for d in dims])


def interdomain_mix_pallas(fq, zk, zv, lam, b, c=None, *, conj=True, chunk_size=64, segment_ids=None,
                           initial_state=None, return_state=False, out_dtype=None, interpret=None, family=None,
                           save_states=None, batch_axes=None, head_axes=None, gpu_fallback=None):
    """Fused-kernel ``interdomain_mix`` (inputs already validated by ``idattn.ops.interdomain_mix``).

    Args as ``interdomain_mix``; extra:
      interpret: run the kernels in Pallas interpret mode. Default None: chosen when the program is lowered
        (natively on GPU / TPU, interpreted on CPU).
      family: "gpu" (Triton lowering) or "tpu" (Mosaic) kernels. Default None: the family of the platform the
        program is lowered for (``jax.lax.platform_dependent``), never the host's default backend, so that a
        CPU host compiling for a TPU topology gets Mosaic kernels.
      save_states: keep the forward's chunk-boundary states [B, H, T/L, 2, M, R+D] (compute dtype) as
        residuals instead of recomputing them in the backward (two fewer sequential passes, more memory held
        between forward and backward). Default: ``SAVE_STATES_DEFAULT`` per family (GPU True, TPU False), or
        ``set_save_states`` / env IDATTN_PALLAS_SAVE_STATES.
      batch_axes, head_axes: mesh axes that carry the batch rows and the heads (default: see mesh_partition).
      gpu_fallback: fn(fq, zk, zv, lam, b, c, segment_ids, initial_state) -> the same outputs, run on GPU
        instead of the kernels when this jax has no Pallas Triton backend (``idattn.ops.interdomain_mix`` passes
        its XLA chunked path; one warning). None: such a jax raises ``gpu.TritonUnavailable`` when lowering.
    Partitioning: Pallas kernels cannot be partitioned by XLA, so under a device mesh in context the whole
    operator runs inside ``jax.shard_map``, each device on its rows (batch axes) and heads (head axes): the
    recurrence is independent per row and per head, so this is exact. Λ, b, c [H, ...] are split over the head
    axes only; their cotangents are summed over the batch axes by shard_map's transpose.
    Returns o [B, T, H, D] (out_dtype, default zv's dtype), plus (Xk [B, H, M, R], Xv [B, H, M, D]) complex64
    when return_state. Matmul operands are bf16 when the inputs are bf16 (else float32 at HIGHEST precision);
    the state and all accumulation are float32 (float64 inputs are computed in float32).
    """
    if jnp.ndim(lam) == 4 or jnp.ndim(b) == 4:  # the kernels are time invariant; the dispatcher owns the fallback
        raise ValueError(f"interdomain_mix_pallas: lam/b must be [H, M] (time invariant); got lam {jnp.shape(lam)}, "
                         f"b {jnp.shape(b)}. A per-token (selective) lam has no kernel: call "
                         "idattn.ops.interdomain_mix(..., impl='pallas' or 'chunked'), which runs the chunked form")
    B, T, H, _ = fq.shape
    L = int(chunk_size)
    if family == "gpu" and not chunk_size_supported(L, "gpu"):
        raise ValueError(f"chunk_size: the GPU (Triton) kernels need a power of two >= 16, got {L}; use 64")
    if family == "tpu" and not chunk_size_supported(L, "tpu"):
        raise ValueError(f"chunk_size: the TPU kernels need a multiple of 8, got {L}; use 128")
    out_dtype = jnp.dtype(zv.dtype if out_dtype is None else out_dtype)
    kw = dict(conj=conj, chunk_size=L, return_state=return_state, out_dtype=out_dtype, save_states=save_states)
    has_c, has_seg, has_x0 = c is not None, segment_ids is not None, initial_state is not None

    def local(fq, zk, zv, lam, b, c, seg, x0, *, family, interpret):
        return _mix_local(fq, zk, zv, lam, b, c if has_c else None, segment_ids=seg if has_seg else None,
                          initial_state=x0 if has_x0 else None, family=family, interpret=interpret, **kw)

    def fallback(fq, zk, zv, lam, b, c, seg, x0):
        return gpu_fallback(fq, zk, zv, lam, b, c if has_c else None, seg if has_seg else None,
                            x0 if has_x0 else None)

    def run(fq, zk, zv, lam, b, c, seg, x0):
        return _platform_dispatch(local, (fq, zk, zv, lam, b, c, seg, x0), family, interpret, L,
                                  None if gpu_fallback is None else fallback)

    empty = jnp.zeros((0,), F32)
    args = (fq, zk, zv, jnp.asarray(lam), jnp.asarray(b), jnp.asarray(c) if has_c else empty,
            jnp.asarray(segment_ids) if has_seg else empty, tuple(initial_state) if has_x0 else (empty, empty))
    plan = mesh_partition(B, H, batch_axes, head_axes)
    if plan is None:
        return run(*args)
    mesh, bx, hx = plan
    tok, head_p, rowhead, rep = partition_spec(bx, (), hx, ()), partition_spec(hx, ()), partition_spec(bx, hx, (), ()), partition_spec()
    in_specs = (tok, tok, tok, head_p, head_p, partition_spec(hx, (), ()) if has_c else rep, partition_spec(bx, ()) if has_seg else rep,
                (rowhead, rowhead) if has_x0 else (rep, rep))
    out_specs = (tok, (rowhead, rowhead)) if return_state else tok
    return jax.shard_map(run, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*args)
