"""GPU kernels (Pallas, Triton lowering): one program per (batch row, head, feature block or chunk group), an
in-kernel ``fori_loop`` over chunks with the state carried in registers.

Refs are whole arrays (no BlockSpec): each program computes its own pointers with ``pl.ds``, which lets a block
be a strided slice of the natural ``[B, T, H, N]`` layout (no transposes in HBM) and lets the loop walk the
time axis. Layouts (all prepared by ``idattn.ops.pallas.op``):

    fq, zk [B, T, H, R]; zv, do [B, T, H, D]         inputs (bf16 or f32), T a multiple of L
    p, w, dp, dw [B, T, H, 2, M] float32              complex per-token mode vectors as (re, im) planes
    tables: sp [H, 2, L, M]; lam^(mu+1), lam^mu, b [H, 2, 1, M]; laml [H, 2, M, 1]
    states [B, H, 2, M, N] float32; per-chunk states [B, H, NC, 2, M, N] (``sdt``: the compute dtype)
    doc [B, T] int32; cm, em [B, T, 1] float32; keep [B, NC] float32       (only with segment ids)
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from idattn.ops.pallas import _chunk as C

F32 = jnp.float32


def _compiler_params(num_warps, num_stages):
    try:
        from jax.experimental.pallas import triton as pltr
        return pltr.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    except Exception:  # pragma: no cover - Triton backend removed from this jax
        return None


# (num_warps, num_stages) per kernel kind. The fused forward and the scans carry a small state tile per program
# (4 warps); the chunk-parallel backward kernels hold several L×L and L×D fp32 tiles at once (8 warps, fewer
# registers per thread). num_stages > 1 lets Triton prefetch the next chunk's loads inside the fori_loop.
# "fwd_big": the forward kernels when the padded mode count M >= 64 (bigger [L, M] tiles per program).
# "bwd_f32": the backward kernels with float32 operands: with 2 stages their tiles need 242 KiB (M = 32, D = 128)
# and 259 KiB (M = 64, D = 64) of shared memory, over sm_90's 227 KiB (found by the deviceless H200 compile,
# tests/test_aot_gpu.py); one stage fits (208 and 224 KiB).
TUNING = {"fwd": (4, 2), "fwd_big": (8, 2), "scan": (4, 2), "bwd": (8, 2), "bwd_f32": (8, 1)}


def _call(kernel, out_shape, grid, interpret, kind="fwd"):
    kw = {}
    if not interpret:
        num_warps, num_stages = TUNING[kind]
        cp = _compiler_params(num_warps, num_stages)
        if cp is not None:
            kw["compiler_params"] = cp
    return pl.pallas_call(kernel, out_shape=out_shape, grid=grid, interpret=interpret, **kw)


def _tabs(tab_refs, h):
    two = lambda r: (r[h, 0], r[h, 1])  # noqa: E731
    return C.Tabs(*(two(r) for r in tab_refs))


def _masks(seg_refs, bi, c, t0, L):
    if seg_refs is None:
        return C.Masks(C.causal_mask(L))
    doc, cm, em, keep = seg_refs
    d = doc[bi, pl.ds(t0, L)]
    return C.Masks(C.causal_mask(L, d), cm[bi, pl.ds(t0, L), :], em[bi, pl.ds(t0, L), :], keep[bi, c])


def _split(refs, n_in, seg):
    """refs = inputs (n_in, of which the last 4 are segment refs when seg) + outputs."""
    ins, outs = refs[:n_in], refs[n_in:]
    if seg:
        return ins[:-4], ins[-4:], outs
    return ins, None, outs


# ----------------------------------------------------------------------------------------------------------------
# forward: fused readout + carry


def fwd_p(fq, zk, tabs, x0, segs, *, L, block_r, cdt, interpret, save_sdt=None):
    """p [nRB, B, T, H, 2, M] (partial sums over feature blocks) and Xk_T [B, H, 2, M, R]; with ``save_sdt``
    also the states before every chunk xs [B, H, NC, 2, M, R] (dtype save_sdt) for the backward."""
    B, T, H, R = fq.shape
    M = tabs[0].shape[-1]
    NC, nrb = T // L, R // block_r
    dot, seg = C.Dots(cdt), segs is not None

    def kernel(*refs):
        (fq_r, zk_r, *tab_r, x0_r), seg_r, outs = _split(refs, 8 + (4 if seg else 0), seg)
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
            p_r[rb, bi, pl.ds(t0, L), h, 0, :] = pr
            p_r[rb, bi, pl.ds(t0, L), h, 1, :] = pi
            return C.carry_fwd(k, X, tb, mk, dot)

        X = (x0_r[bi, h, 0, :, rs], x0_r[bi, h, 1, :, rs])
        X = lax.fori_loop(0, NC, body, X)
        xt_r[bi, h, 0, :, rs] = X[0]
        xt_r[bi, h, 1, :, rs] = X[1]

    out = (jax.ShapeDtypeStruct((nrb, B, T, H, 2, M), F32), jax.ShapeDtypeStruct((B, H, 2, M, R), F32))
    if save_sdt is not None:
        out = out + (jax.ShapeDtypeStruct((B, H, NC, 2, M, R), save_sdt),)
    args = (fq, zk, *tabs, x0) + (tuple(segs) if seg else ())
    return _call(kernel, out, (B, H, nrb), interpret, "fwd" if M < 64 else "fwd_big")(*args)


def fwd_o(w, zv, tabs, x0, segs, *, L, block_d, cdt, out_dtype, interpret, save_sdt=None):
    """o [B, T, H, D] and Xv_T [B, H, 2, M, D] (and xs [B, H, NC, 2, M, D] with ``save_sdt``)."""
    B, T, H, D = zv.shape
    M = tabs[0].shape[-1]
    NC, ndb = T // L, D // block_d
    dot, seg = C.Dots(cdt), segs is not None

    def kernel(*refs):
        (w_r, zv_r, *tab_r, x0_r), seg_r, outs = _split(refs, 8 + (4 if seg else 0), seg)
        o_r, xt_r = outs[0], outs[1]
        bi, h, db = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        ds_ = pl.ds(db * block_d, block_d)

        def body(c, X):
            t0 = c * L
            tb, mk = _tabs(tab_r, h), _masks(seg_r, bi, c, t0, L)
            if save_sdt is not None:
                outs[2][bi, h, c, 0, :, ds_] = X[0].astype(outs[2].dtype)
                outs[2][bi, h, c, 1, :, ds_] = X[1].astype(outs[2].dtype)
            wc = (w_r[bi, pl.ds(t0, L), h, 0, :], w_r[bi, pl.ds(t0, L), h, 1, :])
            v = zv_r[bi, pl.ds(t0, L), h, ds_]
            o = C.o_fwd(wc, v, X, tb, mk, dot)
            o_r[bi, pl.ds(t0, L), h, ds_] = o.astype(o_r.dtype)
            return C.carry_fwd(v, X, tb, mk, dot)

        X = (x0_r[bi, h, 0, :, ds_], x0_r[bi, h, 1, :, ds_])
        X = lax.fori_loop(0, NC, body, X)
        xt_r[bi, h, 0, :, ds_] = X[0]
        xt_r[bi, h, 1, :, ds_] = X[1]

    out = (jax.ShapeDtypeStruct((B, T, H, D), out_dtype), jax.ShapeDtypeStruct((B, H, 2, M, D), F32))
    if save_sdt is not None:
        out = out + (jax.ShapeDtypeStruct((B, H, NC, 2, M, D), save_sdt),)
    args = (w, zv, *tabs, x0) + (tuple(segs) if seg else ())
    return _call(kernel, out, (B, H, ndb), interpret, "fwd" if M < 64 else "fwd_big")(*args)


# ----------------------------------------------------------------------------------------------------------------
# backward building blocks


def scan_fwd(z, tabs, x0, segs, *, L, block_n, cdt, sdt, interpret):
    """States before every chunk: xs [B, H, NC, 2, M, N] (dtype sdt)."""
    B, T, H, N = z.shape
    M = tabs[0].shape[-1]
    NC, nnb = T // L, N // block_n
    dot, seg = C.Dots(cdt), segs is not None

    def kernel(*refs):
        (z_r, *tab_r, x0_r), seg_r, (xs_r,) = _split(refs, 7 + (4 if seg else 0), seg)
        bi, h, nb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        ns = pl.ds(nb * block_n, block_n)

        def body(c, X):
            t0 = c * L
            tb, mk = _tabs(tab_r, h), _masks(seg_r, bi, c, t0, L)
            xs_r[bi, h, c, 0, :, ns] = X[0].astype(xs_r.dtype)
            xs_r[bi, h, c, 1, :, ns] = X[1].astype(xs_r.dtype)
            return C.carry_fwd(z_r[bi, pl.ds(t0, L), h, ns], X, tb, mk, dot)

        lax.fori_loop(0, NC, body, (x0_r[bi, h, 0, :, ns], x0_r[bi, h, 1, :, ns]))

    out = (jax.ShapeDtypeStruct((B, H, NC, 2, M, N), sdt),)
    args = (z, *tabs, x0) + (tuple(segs) if seg else ())
    return _call(kernel, out, (B, H, nnb), interpret, "scan")(*args)[0]


def scan_rev(x, g, tabs, yT, segs, *, L, block_n, cdt, sdt, conj_g, interpret):
    """Adjoint states after every chunk ys [B, H, NC, 2, M, N] (sdt) and the adjoint of the initial state
    y0 [B, H, 2, M, N] float32."""
    B, T, H, N = x.shape
    M = tabs[0].shape[-1]
    NC, nnb = T // L, N // block_n
    dot, seg = C.Dots(cdt), segs is not None

    def kernel(*refs):
        (x_r, g_r, *tab_r, yt_r), seg_r, (ys_r, y0_r) = _split(refs, 8 + (4 if seg else 0), seg)
        bi, h, nb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        ns = pl.ds(nb * block_n, block_n)

        def body(k, Y):
            c = NC - 1 - k
            t0 = c * L
            tb, mk = _tabs(tab_r, h), _masks(seg_r, bi, c, t0, L)
            ys_r[bi, h, c, 0, :, ns] = Y[0].astype(ys_r.dtype)
            ys_r[bi, h, c, 1, :, ns] = Y[1].astype(ys_r.dtype)
            gc = (g_r[bi, pl.ds(t0, L), h, 0, :], g_r[bi, pl.ds(t0, L), h, 1, :])
            return C.carry_rev(x_r[bi, pl.ds(t0, L), h, ns], gc, Y, tb, mk, dot, conj_g)

        Y = lax.fori_loop(0, NC, body, (yt_r[bi, h, 0, :, ns], yt_r[bi, h, 1, :, ns]))
        y0_r[bi, h, 0, :, ns] = Y[0]
        y0_r[bi, h, 1, :, ns] = Y[1]

    out = (jax.ShapeDtypeStruct((B, H, NC, 2, M, N), sdt), jax.ShapeDtypeStruct((B, H, 2, M, N), F32))
    args = (x, g, *tabs, yT) + (tuple(segs) if seg else ())
    return _call(kernel, out, (B, H, nnb), interpret, "scan")(*args)


def _acc_out(B, H, NG, M):
    return (jax.ShapeDtypeStruct((B, H, NG, 4, 1, M), F32), jax.ShapeDtypeStruct((B, H, NG, 2, M, 1), F32))


def _store_acc(row_r, col_r, bi, h, gi, acc):
    for k in range(4):
        row_r[bi, h, gi, k, :, :] = acc[k]
    col_r[bi, h, gi, 0, :, :] = acc[4]
    col_r[bi, h, gi, 1, :, :] = acc[5]


# The chunk-parallel backward kernels give each program a contiguous group of chunks (parameter sums stay in
# registers across the group); groups are sized so that B·H·groups reaches about this many programs.
BWD_TARGET_PROGRAMS = 512


def _groups(B, H, NC, target_programs=None):
    target_programs = BWD_TARGET_PROGRAMS if target_programs is None else target_programs
    per = max(1, -(-NC * B * H // target_programs))
    ng = -(-NC // per)
    return per, ng


def bwd_o(w, zv, do, xs, ys, tabs, segs, *, L, cdt, interpret):
    """dw [B, T, H, 2, M] f32, dzv [B, T, H, D] (zv's dtype), acc rows [B, H, NG, 4, 1, M], cols [.., 2, M, 1]."""
    B, T, H, D = zv.shape
    M = tabs[0].shape[-1]
    NC = T // L
    per, NG = _groups(B, H, NC)
    dot, seg = C.Dots(cdt), segs is not None

    def kernel(*refs):
        (w_r, zv_r, do_r, xs_r, ys_r, *tab_r), seg_r, (dw_r, dzv_r, row_r, col_r) = _split(
            refs, 10 + (4 if seg else 0), seg)
        bi, h, gi = pl.program_id(0), pl.program_id(1), pl.program_id(2)

        def body(c, acc):
            t0 = c * L
            tb, mk = _tabs(tab_r, h), _masks(seg_r, bi, c, t0, L)
            ts = pl.ds(t0, L)
            wc = (w_r[bi, ts, h, 0, :], w_r[bi, ts, h, 1, :])
            X = (xs_r[bi, h, c, 0], xs_r[bi, h, c, 1])
            Y = (ys_r[bi, h, c, 0].astype(F32), ys_r[bi, h, c, 1].astype(F32))
            dw, dzv, acc = C.o_bwd(wc, zv_r[bi, ts, h, :], do_r[bi, ts, h, :], X, Y, tb, mk, dot, acc, L)
            dw_r[bi, ts, h, 0, :] = dw[0]
            dw_r[bi, ts, h, 1, :] = dw[1]
            dzv_r[bi, ts, h, :] = dzv.astype(dzv_r.dtype)
            return acc

        acc = lax.fori_loop(gi * per, jnp.minimum((gi + 1) * per, NC), body, C.Acc.zeros(M))
        _store_acc(row_r, col_r, bi, h, gi, acc)

    out = (jax.ShapeDtypeStruct((B, T, H, 2, M), F32), jax.ShapeDtypeStruct(zv.shape, zv.dtype)) + _acc_out(B, H, NG, M)
    args = (w, zv, do, xs, ys, *tabs) + (tuple(segs) if seg else ())
    return _call(kernel, out, (B, H, NG), interpret, "bwd" if jnp.dtype(cdt) == jnp.bfloat16 else "bwd_f32")(*args)


def bwd_p(fq, zk, dp, xs, ys, tabs, segs, *, L, cdt, interpret):
    """dfq, dzk [B, T, H, R] (input dtypes), acc rows / cols as in bwd_o."""
    B, T, H, R = fq.shape
    M = tabs[0].shape[-1]
    NC = T // L
    per, NG = _groups(B, H, NC)
    dot, seg = C.Dots(cdt), segs is not None

    def kernel(*refs):
        (fq_r, zk_r, dp_r, xs_r, ys_r, *tab_r), seg_r, (dfq_r, dzk_r, row_r, col_r) = _split(
            refs, 10 + (4 if seg else 0), seg)
        bi, h, gi = pl.program_id(0), pl.program_id(1), pl.program_id(2)

        def body(c, acc):
            t0 = c * L
            tb, mk = _tabs(tab_r, h), _masks(seg_r, bi, c, t0, L)
            ts = pl.ds(t0, L)
            dpc = (dp_r[bi, ts, h, 0, :], dp_r[bi, ts, h, 1, :])
            X = (xs_r[bi, h, c, 0], xs_r[bi, h, c, 1])
            Y = (ys_r[bi, h, c, 0].astype(F32), ys_r[bi, h, c, 1].astype(F32))
            dfq, dzk, acc = C.p_bwd(fq_r[bi, ts, h, :], zk_r[bi, ts, h, :], dpc, X, Y, tb, mk, dot, acc, L)
            dfq_r[bi, ts, h, :] = dfq.astype(dfq_r.dtype)
            dzk_r[bi, ts, h, :] = dzk.astype(dzk_r.dtype)
            return acc

        acc = lax.fori_loop(gi * per, jnp.minimum((gi + 1) * per, NC), body, C.Acc.zeros(M))
        _store_acc(row_r, col_r, bi, h, gi, acc)

    out = (jax.ShapeDtypeStruct(fq.shape, fq.dtype), jax.ShapeDtypeStruct(zk.shape, zk.dtype)) + _acc_out(B, H, NG, M)
    args = (fq, zk, dp, xs, ys, *tabs) + (tuple(segs) if seg else ())
    return _call(kernel, out, (B, H, NG), interpret, "bwd" if jnp.dtype(cdt) == jnp.bfloat16 else "bwd_f32")(*args)
