"""TPU kernels (Pallas, Mosaic lowering): grid (batch row, head, chunk) with the chunk as the sequential
("arbitrary") grid axis and the state in a VMEM scratch buffer that persists across it; the chunk blocks are
DMA'd by the BlockSpec pipeline (double-buffered, overlapped with compute).

Same entry points and argument layouts as ``idattn.ops.pallas.gpu`` (so ``op.py`` is backend-agnostic); this
module transposes to the TPU-friendly layouts internally, because a Mosaic block's last two dimensions must
be (8, 128)-aligned or whole:

    inputs [B, T, H, N] -> [B, H, T, N]   block (L, N)
    per-token modes [B, T, H, 2, M] -> [B, H, 2, T, M]   block (2, L, M)
    doc -> [B, T, 1] and [B, NC, 1, L] (column / row blocks);  keep -> [B, NC, 1, 1]

The transposes cost HBM traffic (a layer that already keeps [B, H, T, N] could skip them: future work).
Feature blocking is not used here (block = the whole padded feature width, a multiple of 128), and the
backward kernels accumulate the parameter sums in their resident output block across the chunk axis.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from idattn.ops.pallas import _chunk as C

F32 = jnp.float32


def _params():
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))


def _vmem(shape):
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.VMEM(shape, F32)


def _call(kernel, out_shape, grid, in_specs, out_specs, scratch, interpret):
    kw = {} if interpret else {"compiler_params": _params()}
    return pl.pallas_call(kernel, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs,
                          scratch_shapes=scratch, interpret=interpret, **kw)


def _t_in(x):  # [B, T, H, N] -> [B, H, T, N]
    return jnp.transpose(x, (0, 2, 1, 3))


def _t_modes(x):  # [B, T, H, 2, M] -> [B, H, 2, T, M]
    return jnp.transpose(x, (0, 2, 3, 1, 4))


def _u_modes(x):  # back
    return jnp.transpose(x, (0, 3, 1, 2, 4))


def _cidx(NC, reverse):
    return (lambda c: NC - 1 - c) if reverse else (lambda c: c)


def _specs_common(tabs, L, NC, reverse=False):
    H, _, _, M = tabs[0].shape
    cid = _cidx(NC, reverse)
    tab = pl.BlockSpec((None, 2, L, M), lambda b, h, c: (h, 0, 0, 0))
    laml = pl.BlockSpec((None, 2, M, 1), lambda b, h, c: (h, 0, 0, 0))
    row = pl.BlockSpec((None, 2, 1, M), lambda b, h, c: (h, 0, 0, 0))
    return [tab, row, row, laml, row], cid


def _seg_prep(segs, NC):
    if segs is None:
        return ()
    doc, cm, em, keep = segs
    B, T = doc.shape
    return (doc[:, :, None], doc.reshape(B, NC, 1, T // NC), cm, em, keep.reshape(B, NC, 1, 1))


def _seg_specs(seg, L, cid):
    if not seg:
        return []
    return [pl.BlockSpec((None, L, 1), lambda b, h, c: (b, cid(c), 0)),
            pl.BlockSpec((None, None, 1, L), lambda b, h, c: (b, cid(c), 0, 0)),
            pl.BlockSpec((None, L, 1), lambda b, h, c: (b, cid(c), 0)),
            pl.BlockSpec((None, L, 1), lambda b, h, c: (b, cid(c), 0)),
            pl.BlockSpec((None, None, 1, 1), lambda b, h, c: (b, cid(c), 0, 0))]


def _tabs(tab_refs):
    two = lambda r: (r[0], r[1])  # noqa: E731
    return C.Tabs(*(two(r) for r in tab_refs))


def _masks(seg_refs, L):
    i = jax.lax.broadcasted_iota(jnp.int32, (L, L), 0)
    j = jax.lax.broadcasted_iota(jnp.int32, (L, L), 1)
    mk = i >= j
    if seg_refs is None:
        return C.Masks(mk)
    dcol, drow, cm, em, keep = seg_refs
    mk = jnp.logical_and(mk, dcol[...] == drow[...])
    return C.Masks(mk, cm[...], em[...], keep[...])


def _split(refs, n_in, seg):
    ins, rest = refs[:n_in + (5 if seg else 0)], refs[n_in + (5 if seg else 0):]
    return (ins[:n_in], ins[n_in:] if seg else None), rest


def _seq(B, T, H, N, L, cid):
    return pl.BlockSpec((None, None, L, N), lambda b, h, c: (b, h, cid(c), 0))


def _modes_spec(M, L, cid):
    return pl.BlockSpec((None, None, 2, L, M), lambda b, h, c: (b, h, 0, cid(c), 0))


def _state_spec(M, N):
    return pl.BlockSpec((None, None, 2, M, N), lambda b, h, c: (b, h, 0, 0, 0))


# ----------------------------------------------------------------------------------------------------------------


def fwd_p(fq, zk, tabs, x0, segs, *, L, block_r, cdt, interpret, save_sdt=None):
    B, T, H, R = fq.shape
    M = tabs[0].shape[-1]
    NC = T // L
    dot, seg = C.Dots(cdt), segs is not None
    tspecs, cid = _specs_common(tabs, L, NC)

    def kernel(*refs):
        ((fq_r, zk_r, *tab_r, x0_r), seg_r), rest = _split(refs, 8, seg)
        p_r, xt_r, xs = rest[0], rest[1], rest[-1]
        c = pl.program_id(2)

        @pl.when(c == 0)
        def _():
            xs[...] = x0_r[...]

        tb, mk = _tabs(tab_r), _masks(seg_r, L)
        X = (xs[0], xs[1])
        if save_sdt is not None:
            rest[2][0] = X[0].astype(rest[2].dtype)
            rest[2][1] = X[1].astype(rest[2].dtype)
        q, k = fq_r[...], zk_r[...]
        pr, pi = C.p_fwd(q, k, X, tb, mk, dot)
        p_r[0] = pr
        p_r[1] = pi
        nr, ni = C.carry_fwd(k, X, tb, mk, dot)
        xs[0] = nr
        xs[1] = ni

        @pl.when(c == NC - 1)
        def _():
            xt_r[...] = xs[...]

    in_specs = [_seq(B, T, H, R, L, cid)] * 2 + tspecs + [_state_spec(M, R)] + _seg_specs(seg, L, cid)
    out_specs = [_modes_spec(M, L, cid), _state_spec(M, R)]
    out = (jax.ShapeDtypeStruct((B, H, 2, T, M), F32), jax.ShapeDtypeStruct((B, H, 2, M, R), F32))
    if save_sdt is not None:
        out_specs.append(_chunk_state_spec(M, R, cid))
        out = out + (jax.ShapeDtypeStruct((B, H, NC, 2, M, R), save_sdt),)
    res = _call(kernel, out, (B, H, NC), in_specs, out_specs, [_vmem((2, M, R))], interpret)(
        _t_in(fq), _t_in(zk), *tabs, x0, *_seg_prep(segs, NC))
    return (_u_modes(res[0])[None],) + tuple(res[1:])


def fwd_o(w, zv, tabs, x0, segs, *, L, block_d, cdt, out_dtype, interpret, save_sdt=None):
    B, T, H, D = zv.shape
    M = tabs[0].shape[-1]
    NC = T // L
    dot, seg = C.Dots(cdt), segs is not None
    tspecs, cid = _specs_common(tabs, L, NC)

    def kernel(*refs):
        ((w_r, zv_r, *tab_r, x0_r), seg_r), rest = _split(refs, 8, seg)
        o_r, xt_r, xs = rest[0], rest[1], rest[-1]
        c = pl.program_id(2)

        @pl.when(c == 0)
        def _():
            xs[...] = x0_r[...]

        tb, mk = _tabs(tab_r), _masks(seg_r, L)
        X = (xs[0], xs[1])
        if save_sdt is not None:
            rest[2][0] = X[0].astype(rest[2].dtype)
            rest[2][1] = X[1].astype(rest[2].dtype)
        v = zv_r[...]
        o_r[...] = C.o_fwd((w_r[0], w_r[1]), v, X, tb, mk, dot).astype(o_r.dtype)
        nr, ni = C.carry_fwd(v, X, tb, mk, dot)
        xs[0] = nr
        xs[1] = ni

        @pl.when(c == NC - 1)
        def _():
            xt_r[...] = xs[...]

    in_specs = ([_modes_spec(M, L, cid), _seq(B, T, H, D, L, cid)] + tspecs + [_state_spec(M, D)]
                + _seg_specs(seg, L, cid))
    out_specs = [_seq(B, T, H, D, L, cid), _state_spec(M, D)]
    out = (jax.ShapeDtypeStruct((B, H, T, D), out_dtype), jax.ShapeDtypeStruct((B, H, 2, M, D), F32))
    if save_sdt is not None:
        out_specs.append(_chunk_state_spec(M, D, cid))
        out = out + (jax.ShapeDtypeStruct((B, H, NC, 2, M, D), save_sdt),)
    res = _call(kernel, out, (B, H, NC), in_specs, out_specs, [_vmem((2, M, D))], interpret)(
        _t_modes(w), _t_in(zv), *tabs, x0, *_seg_prep(segs, NC))
    return (_t_in(res[0]),) + tuple(res[1:])


def _chunk_state_spec(M, N, cid):
    return pl.BlockSpec((None, None, None, 2, M, N), lambda b, h, c: (b, h, cid(c), 0, 0, 0))


def scan_fwd(z, tabs, x0, segs, *, L, block_n, cdt, sdt, interpret):
    B, T, H, N = z.shape
    M = tabs[0].shape[-1]
    NC = T // L
    dot, seg = C.Dots(cdt), segs is not None
    tspecs, cid = _specs_common(tabs, L, NC)

    def kernel(*refs):
        ((z_r, *tab_r, x0_r), seg_r), (out_r, xs) = _split(refs, 7, seg)
        c = pl.program_id(2)

        @pl.when(c == 0)
        def _():
            xs[...] = x0_r[...]

        tb, mk = _tabs(tab_r), _masks(seg_r, L)
        X = (xs[0], xs[1])
        out_r[0] = X[0].astype(out_r.dtype)
        out_r[1] = X[1].astype(out_r.dtype)
        nr, ni = C.carry_fwd(z_r[...], X, tb, mk, dot)
        xs[0] = nr
        xs[1] = ni

    in_specs = [_seq(B, T, H, N, L, cid)] + tspecs + [_state_spec(M, N)] + _seg_specs(seg, L, cid)
    out = jax.ShapeDtypeStruct((B, H, NC, 2, M, N), sdt)
    return _call(kernel, out, (B, H, NC), in_specs, _chunk_state_spec(M, N, cid), [_vmem((2, M, N))],
                 interpret)(_t_in(z), *tabs, x0, *_seg_prep(segs, NC))


def scan_rev(x, g, tabs, yT, segs, *, L, block_n, cdt, sdt, conj_g, interpret):
    B, T, H, N = x.shape
    M = tabs[0].shape[-1]
    NC = T // L
    dot, seg = C.Dots(cdt), segs is not None
    tspecs, cid = _specs_common(tabs, L, NC, reverse=True)

    def kernel(*refs):
        ((x_r, g_r, *tab_r, yt_r), seg_r), (ys_r, y0_r, ysc) = _split(refs, 8, seg)
        k = pl.program_id(2)

        @pl.when(k == 0)
        def _():
            ysc[...] = yt_r[...]

        tb, mk = _tabs(tab_r), _masks(seg_r, L)
        Y = (ysc[0], ysc[1])
        ys_r[0] = Y[0].astype(ys_r.dtype)
        ys_r[1] = Y[1].astype(ys_r.dtype)
        nr, ni = C.carry_rev(x_r[...], (g_r[0], g_r[1]), Y, tb, mk, dot, conj_g)
        ysc[0] = nr
        ysc[1] = ni

        @pl.when(k == NC - 1)
        def _():
            y0_r[...] = ysc[...]

    in_specs = ([_seq(B, T, H, N, L, cid), _modes_spec(M, L, cid)] + tspecs + [_state_spec(M, N)]
                + _seg_specs(seg, L, cid))
    out_specs = [_chunk_state_spec(M, N, cid), _state_spec(M, N)]
    out = (jax.ShapeDtypeStruct((B, H, NC, 2, M, N), sdt), jax.ShapeDtypeStruct((B, H, 2, M, N), F32))
    return _call(kernel, out, (B, H, NC), in_specs, out_specs, [_vmem((2, M, N))], interpret)(
        _t_in(x), _t_modes(g), *tabs, yT, *_seg_prep(segs, NC))


def _acc_specs(M):
    return [pl.BlockSpec((None, None, None, 4, 1, M), lambda b, h, c: (b, h, 0, 0, 0, 0)),
            pl.BlockSpec((None, None, None, 2, M, 1), lambda b, h, c: (b, h, 0, 0, 0, 0))]


def _acc_out(B, H, M):
    return (jax.ShapeDtypeStruct((B, H, 1, 4, 1, M), F32), jax.ShapeDtypeStruct((B, H, 1, 2, M, 1), F32))


def _acc_step(c, row_r, col_r, fn):
    @pl.when(c == 0)
    def _():
        row_r[...] = jnp.zeros(row_r.shape, F32)
        col_r[...] = jnp.zeros(col_r.shape, F32)

    acc = tuple(row_r[k] for k in range(4)) + (col_r[0], col_r[1])
    acc = fn(acc)
    for k in range(4):
        row_r[k] = acc[k]
    col_r[0] = acc[4]
    col_r[1] = acc[5]


def bwd_o(w, zv, do, xs, ys, tabs, segs, *, L, cdt, interpret):
    B, T, H, D = zv.shape
    M = tabs[0].shape[-1]
    NC = T // L
    dot, seg = C.Dots(cdt), segs is not None
    tspecs, cid = _specs_common(tabs, L, NC)

    def kernel(*refs):
        ((w_r, zv_r, do_r, xs_r, ys_r, *tab_r), seg_r), (dw_r, dzv_r, row_r, col_r) = _split(refs, 10, seg)
        c = pl.program_id(2)
        tb, mk = _tabs(tab_r), _masks(seg_r, L)

        def fn(acc):
            X = (xs_r[0], xs_r[1])
            Y = (ys_r[0].astype(F32), ys_r[1].astype(F32))
            dw, dzv, acc = C.o_bwd((w_r[0], w_r[1]), zv_r[...], do_r[...], X, Y, tb, mk, dot, acc, L)
            dw_r[0] = dw[0]
            dw_r[1] = dw[1]
            dzv_r[...] = dzv.astype(dzv_r.dtype)
            return acc

        _acc_step(c, row_r, col_r, fn)

    in_specs = ([_modes_spec(M, L, cid), _seq(B, T, H, D, L, cid), _seq(B, T, H, D, L, cid),
                 _chunk_state_spec(M, D, cid), _chunk_state_spec(M, D, cid)] + tspecs + _seg_specs(seg, L, cid))
    out_specs = [_modes_spec(M, L, cid), _seq(B, T, H, D, L, cid)] + _acc_specs(M)
    out = (jax.ShapeDtypeStruct((B, H, 2, T, M), F32), jax.ShapeDtypeStruct((B, H, T, D), zv.dtype)) + _acc_out(B, H, M)
    dw, dzv, row, col = _call(kernel, out, (B, H, NC), in_specs, out_specs, [], interpret)(
        _t_modes(w), _t_in(zv), _t_in(do), xs, ys, *tabs, *_seg_prep(segs, NC))
    return _u_modes(dw), _t_in(dzv), row, col


def bwd_p(fq, zk, dp, xs, ys, tabs, segs, *, L, cdt, interpret):
    B, T, H, R = fq.shape
    M = tabs[0].shape[-1]
    NC = T // L
    dot, seg = C.Dots(cdt), segs is not None
    tspecs, cid = _specs_common(tabs, L, NC)

    def kernel(*refs):
        ((fq_r, zk_r, dp_r, xs_r, ys_r, *tab_r), seg_r), (dfq_r, dzk_r, row_r, col_r) = _split(refs, 10, seg)
        c = pl.program_id(2)
        tb, mk = _tabs(tab_r), _masks(seg_r, L)

        def fn(acc):
            X = (xs_r[0], xs_r[1])
            Y = (ys_r[0].astype(F32), ys_r[1].astype(F32))
            dfq, dzk, acc = C.p_bwd(fq_r[...], zk_r[...], (dp_r[0], dp_r[1]), X, Y, tb, mk, dot, acc, L)
            dfq_r[...] = dfq.astype(dfq_r.dtype)
            dzk_r[...] = dzk.astype(dzk_r.dtype)
            return acc

        _acc_step(c, row_r, col_r, fn)

    seq = _seq(B, T, H, R, L, cid)
    in_specs = ([seq, seq, _modes_spec(M, L, cid), _chunk_state_spec(M, R, cid), _chunk_state_spec(M, R, cid)]
                + tspecs + _seg_specs(seg, L, cid))
    out_specs = [seq, seq] + _acc_specs(M)
    out = (jax.ShapeDtypeStruct((B, H, T, R), fq.dtype), jax.ShapeDtypeStruct((B, H, T, R), zk.dtype)) + _acc_out(B, H, M)
    dfq, dzk, row, col = _call(kernel, out, (B, H, NC), in_specs, out_specs, [], interpret)(
        _t_in(fq), _t_in(zk), _t_modes(dp), xs, ys, *tabs, *_seg_prep(segs, NC))
    return _t_in(dfq), _t_in(dzk), row, col
