"""TPU kernels (Pallas, Mosaic lowering), shaped for the TPU: big grid steps on the natural layouts.

Grid (batch row, head group, time block), the time block the sequential ("arbitrary") axis. One grid step
takes a block of ``TB = nk·L`` tokens (``T_BLOCK`` = 1024 by default, never fewer chunks than divide T/L) of
``hg`` heads and runs an in-kernel ``fori_loop`` over its ``nk`` chunks; the state of each head is a VMEM
scratch buffer that persists across the loop and across the time blocks. The blocks are DMA'd by the
BlockSpec pipeline (double-buffered: block t+1 loads while block t computes).

Layouts (no HBM transpose: every array is a free reshape of the one ``op.py`` passes):

    features [B, T, H, N] viewed as [B, T, H·N]               block (TB, hg·N): heads are column blocks
    per-token modes [B, T, H, 2, M] viewed as [B, T, H·2·M]   block (TB, hg·2·M)
    tables [H, 2, L, M] etc.                                  block (hg, ...) per head group
    states [B, H, 2, M, N], chunk states [B, H, NC, 2, M, N]  block (hg, [nk,] 2, M, N)
    segments: doc [B, T, 1] (column block (TB, 1)) and [B, NC, 3, L] (per chunk: doc row, doc of the carried
              state, doc of the chunk's last token); the masks cm / em / keep are rebuilt on chip from them.

The head group ``hg`` is the smallest divisor of H that makes both column blocks lane-aligned (hg·N and
hg·2·M multiples of 128, or hg = H): (16, 128, 32) -> 2 heads, (32, 64, 64) -> 1 (N is padded to 128 by op.py).
Inside a step each head reads its own column slice (static lane offsets; the mode planes of M = 32 sit at
lane offsets 0, 32, 64, 96). Heads are *not* packed into the MXU's lanes: each head's matmuls keep their
[L, M] / [M, N] shapes (see docs/kernels.md, "TPU kernels", for what that costs and what is left).

The mode mixing w = s·K (s = conj(p) or p, K = cᴴc or cᵀc; op.py's fused operator) runs per chunk
inside fwd_o, the O-half's scan_rev and bwd_o (which also applies mix_bwd and sums the K cotangent on chip), so
only p (forward) and dp (backward), in the compute dtype, cross HBM between the halves.

Every ``pallas_call`` carries a ``pl.CostEstimate`` from ``kernel_cost`` (the same model ``python -m
idattn.bench tpu`` prints), so XLA schedules the surrounding ops around the kernels' real cost.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from idattn.ops.pallas import _chunk as C

F32 = jnp.float32

T_BLOCK = 1024             # tokens per grid step (target; the largest divisor of T/L chunks that fits)
VMEM_BUDGET = 24 * 2**20   # estimated double-buffered block bytes a step may take (T_BLOCK shrinks to fit)
VMEM_LIMIT = 48 * 2**20    # Mosaic's scoped VMEM limit for these kernels (v5p has 64 MiB, v6e / v5e 128 MiB)
FEATURE_GRANULE = 8        # op.py pads R, D to a multiple of this (not of 128: head groups fill the lanes)
KERNELS = ("fwd_p", "fwd_o", "scan_fwd", "scan_rev", "bwd_o", "bwd_p")


# ----------------------------------------------------------------------------------------------------------------
# geometry and cost model (shared with idattn.bench.tpu_model)


@dataclasses.dataclass(frozen=True)
class Geom:
    B: int
    T: int     # padded to a multiple of L
    H: int
    N: int     # feature width (padded)
    M: int     # modes (padded)
    L: int
    hg: int    # heads per grid step
    nk: int    # chunks per grid step

    @property
    def NC(self):
        return self.T // self.L

    @property
    def NT(self):
        return self.NC // self.nk

    @property
    def TB(self):
        return self.nk * self.L

    @property
    def grid(self):
        return (self.B, self.H // self.hg, self.NT)

    @property
    def steps(self):
        return self.B * (self.H // self.hg) * self.NT


def head_group(H: int, N: int, M: int) -> int:
    """Smallest divisor g of H with g·N and g·2·M lane-aligned (multiples of 128), or H."""
    for g in range(1, H + 1):
        if H % g == 0 and (g * N) % 128 == 0 and (g * 2 * M) % 128 == 0:
            return g
    return H


def _isz(dt):
    return jnp.dtype(dt).itemsize


def vmem_bytes(kernel: str, g: Geom, io_bytes: int = 2, sdt_bytes: int = 2, seg: bool = True,
               save: bool = False, mode_bytes: int = 4) -> int:
    """Estimated VMEM of one grid step's blocks, double-buffered (tiles padded to (8, 128)), plus scratch."""
    def tile(rows, cols, isz):
        return -(-rows // 8) * 8 * -(-cols // 128) * 128 * isz

    TB, hg, N, M, L, nk = g.TB, g.hg, g.N, g.M, g.L, g.nk
    feat = tile(TB, hg * N, io_bytes)
    modes = tile(TB, hg * 2 * M, mode_bytes)
    kmix = hg * 2 * tile(M, M, 4)
    cstate = hg * nk * 2 * tile(M, N, sdt_bytes)
    state = hg * 2 * tile(M, N, 4)
    tabs = hg * 2 * (tile(L, M, 4) + 3 * tile(1, M, 4) + tile(M, 1, 4))
    segb = (tile(TB, 1, 4) + nk * tile(3, L, 4)) if seg else 0
    acc = hg * (4 * tile(1, M, 4) + 2 * tile(M, 1, 4))
    blocks = {
        "fwd_p": 2 * feat + modes + 2 * state + (cstate if save else 0),
        "fwd_o": modes + 2 * feat + 2 * state + (cstate if save else 0),
        "scan_fwd": feat + state + cstate,
        "scan_rev": feat + modes + state + cstate + state,
        "bwd_o": modes + 2 * feat + 2 * cstate + modes + feat + acc,
        "bwd_p": 2 * feat + modes + 2 * cstate + 2 * feat + acc,
    }[kernel]
    scratch = state if kernel in ("fwd_p", "fwd_o", "scan_fwd", "scan_rev") else 0
    return 2 * (blocks + tabs + segb + kmix) + scratch


def geometry(kernel: str, B: int, T: int, H: int, N: int, M: int, L: int, io_bytes: int = 2,
             sdt_bytes: int = 2, seg: bool = True, save: bool = False, t_block: int | None = None) -> Geom:
    """The grid a kernel runs on: head group as ``head_group``, chunks per step the largest divisor of T/L with
    nk·L <= t_block (default ``T_BLOCK``) whose blocks fit ``VMEM_BUDGET``."""
    tb = T_BLOCK if t_block is None else int(t_block)
    NC = T // L
    hg = head_group(H, N, M)
    divs = [d for d in range(NC, 0, -1) if NC % d == 0 and (d == 1 or d * L <= tb)]
    for d in divs:
        g = Geom(B, T, H, N, M, L, hg, d)
        if d == 1 or vmem_bytes(kernel, g, io_bytes, sdt_bytes, seg, save) <= VMEM_BUDGET:
            return g
    return Geom(B, T, H, N, M, L, hg, 1)


def chunk_matmuls(kernel: str, L: int, M: int, N: int, has_k: bool = False):
    """The matmuls of one chunk of one head in _chunk.py, as (m, k, n, count): [m, k] @ [k, n], count times; with
    ``has_k`` the fused mode mixing w = s·K (mix_fwd; bwd_o also mix_bwd)."""
    carry = [(M, L, N, 2)]                                                   # (em·Pe)ᵀ·Z, re and im
    mix = {"fwd_o": [(L, M, M, 4)], "scan_rev": [(L, M, M, 4)],
           "bwd_o": [(L, M, M, 4), (L, M, M, 4), (M, L, M, 4)]}.get(kernel, []) if has_k else []
    return mix + {
        "fwd_p": [(L, N, L, 1), (L, L, M, 2), (L, N, M, 2)] + carry,         # G = FQ·ZKᵀ; G·Ps; FQ·Xᵀ
        "fwd_o": [(L, M, L, 2), (L, M, N, 2), (L, L, N, 1)] + carry,         # A; (w∘pin)·X; A·ZV
        "scan_fwd": carry,
        "scan_rev": carry,
        "bwd_o": [(L, M, L, 2), (L, N, L, 1), (L, L, N, 1), (L, M, N, 2), (L, N, M, 2), (L, L, M, 2),
                  (L, L, M, 2), (L, N, M, 2)],
        "bwd_p": [(L, N, L, 1), (L, L, M, 2), (L, N, M, 2), (L, M, L, 2), (L, L, M, 2), (L, L, N, 1),
                  (L, M, N, 2), (L, L, N, 1), (L, M, N, 2), (L, N, M, 2)],
    }[kernel]


def chunk_flops(kernel: str, L: int, M: int, N: int, mxu: int | None = None, has_k: bool = False) -> int:
    """Matmul FLOPs of one chunk of one head (2·m·k·n per product); with ``mxu`` the FLOPs the MXU spends, k and n
    rounded up to its width (a [128, 32] result fills a quarter of a 128-wide MXU) and m to 8."""
    def up(x, w):
        return -(-x // w) * w

    tot = 0
    for m, k, n, cnt in chunk_matmuls(kernel, L, M, N, has_k):
        if mxu:
            m, k, n = up(m, 8), up(k, mxu), up(n, mxu)
        tot += 2 * m * k * n * cnt
    return tot


def hbm_bytes(kernel: str, g: Geom, io_bytes: int = 2, sdt_bytes: int = 2, seg: bool = True,
              save: bool = False, mode_bytes: int = 4, has_k: bool = False) -> int:
    """HBM bytes a kernel reads and writes: every block once (a block whose index does not change between
    consecutive grid steps - tables, initial and final states, the parameter sums - is fetched once per (row,
    head group))."""
    B, T, H, N, M, L, NC = g.B, g.T, g.H, g.N, g.M, g.L, g.NC
    feat = B * T * H * N * io_bytes
    modes = B * T * H * 2 * M * mode_bytes
    cstate = B * H * NC * 2 * M * N * sdt_bytes
    state = B * H * 2 * M * N * 4
    tabs = B * H * 2 * (L * M + 4 * M) * 4
    kmix = B * H * 2 * M * M * 4 * {"fwd_o": 1, "scan_rev": 1, "bwd_o": 2}.get(kernel, 0) if has_k else 0
    segb = (B * T * 4 + B * NC * 3 * L * 4) * (H // g.hg) if seg else 0
    acc = B * H * 6 * M * 4
    body = {
        "fwd_p": 2 * feat + modes + 2 * state + (cstate if save else 0),
        "fwd_o": modes + 2 * feat + 2 * state + (cstate if save else 0),
        "scan_fwd": feat + state + cstate,
        "scan_rev": feat + modes + 2 * state + cstate,
        "bwd_o": 2 * modes + 3 * feat + 2 * cstate + acc,
        "bwd_p": 2 * feat + modes + 2 * cstate + 2 * feat + acc,
    }[kernel]
    return body + tabs + segb + kmix


def kernel_cost(kernel: str, g: Geom, io_bytes: int = 2, sdt_bytes: int = 2, seg: bool = True,
                save: bool = False, mode_bytes: int = 4, has_k: bool = False) -> dict:
    """Static model of one call: grid steps, tokens per step, VMEM, HBM bytes, FLOPs, transcendentals."""
    heads = g.B * g.H * g.NC
    return dict(kernel=kernel, grid=g.grid, steps=g.steps, tokens_per_step=g.TB, heads_per_step=g.hg,
                vmem=vmem_bytes(kernel, g, io_bytes, sdt_bytes, seg, save, mode_bytes),
                bytes=hbm_bytes(kernel, g, io_bytes, sdt_bytes, seg, save, mode_bytes, has_k),
                flops=heads * chunk_flops(kernel, g.L, g.M, g.N, has_k=has_k),
                transcendentals=heads * g.L * g.M)  # the reciprocal that rebuilds pt from sp


def _estimate(kernel, g, io_bytes, sdt_bytes, seg, save=False, mode_bytes=4, has_k=False):
    c = kernel_cost(kernel, g, io_bytes, sdt_bytes, seg, save, mode_bytes, has_k)
    return pl.CostEstimate(flops=int(c["flops"]), transcendentals=int(c["transcendentals"]),
                           bytes_accessed=int(c["bytes"]))


# ----------------------------------------------------------------------------------------------------------------
# pallas_call plumbing


def _params():
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                vmem_limit_bytes=VMEM_LIMIT)


def _vmem(shape):
    return pltpu.VMEM(shape, F32)


def _call(kernel, name, out_shape, g, in_specs, out_specs, scratch, interpret, cost):
    kw = {} if interpret else {"compiler_params": _params()}
    return pl.pallas_call(kernel, out_shape=out_shape, grid=g.grid, in_specs=in_specs, out_specs=out_specs,
                          scratch_shapes=scratch, interpret=interpret, cost_estimate=cost,
                          name=f"idattn_tpu_{name}", **kw)


class _Specs:
    """BlockSpecs of one geometry; time blocks in reverse order when ``reverse`` (the adjoint scan)."""

    def __init__(self, g: Geom, reverse=False):
        self.g = g
        NT = g.NT
        self.tid = (lambda t: NT - 1 - t) if reverse else (lambda t: t)

    def feat(self, N):  # [B, T, H·N]
        g, tid = self.g, self.tid
        return pl.BlockSpec((None, g.TB, g.hg * N), lambda b, h, t: (b, tid(t), h))

    def modes(self):  # [B, T, H·2·M]
        g, tid = self.g, self.tid
        return pl.BlockSpec((None, g.TB, g.hg * 2 * g.M), lambda b, h, t: (b, tid(t), h))

    def state(self, N):  # [B, H, 2, M, N]
        g = self.g
        return pl.BlockSpec((None, g.hg, 2, g.M, N), lambda b, h, t: (b, h, 0, 0, 0))

    def cstate(self, N):  # [B, H, NC, 2, M, N]
        g, tid = self.g, self.tid
        return pl.BlockSpec((None, g.hg, g.nk, 2, g.M, N), lambda b, h, t: (b, h, tid(t), 0, 0, 0))

    def tabs(self):
        g = self.g
        tab = pl.BlockSpec((g.hg, 2, g.L, g.M), lambda b, h, t: (h, 0, 0, 0))
        row = pl.BlockSpec((g.hg, 2, 1, g.M), lambda b, h, t: (h, 0, 0, 0))
        col = pl.BlockSpec((g.hg, 2, g.M, 1), lambda b, h, t: (h, 0, 0, 0))
        return [tab, row, row, col, row]

    def segs(self, seg):
        if not seg:
            return []
        g, tid = self.g, self.tid
        return [pl.BlockSpec((None, g.TB, 1), lambda b, h, t: (b, tid(t), 0)),
                pl.BlockSpec((None, g.nk, 3, g.L), lambda b, h, t: (b, tid(t), 0, 0))]

    def acc(self):
        g = self.g
        return [pl.BlockSpec((None, g.hg, None, 4, 1, g.M), lambda b, h, t: (b, h, 0, 0, 0, 0)),
                pl.BlockSpec((None, g.hg, None, 2, g.M, 1), lambda b, h, t: (b, h, 0, 0, 0, 0))]


def _seg_prep(segs, L):
    """op.py's (doc, cm, em, keep) -> (doc column [B, T, 1], per-chunk rows [B, NC, 3, L]: the chunk's doc ids,
    the doc of the carried state (0 for the first chunk), the doc of the chunk's last token). cm / em / keep are
    functions of these (rebuilt on chip, as op.py defines them)."""
    if segs is None:
        return ()
    doc = segs[0]
    B, T = doc.shape
    NC = T // L
    dc = doc.reshape(B, NC, L)
    prev = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), dc[:, :-1, -1]], axis=1)
    last = dc[:, :, -1]
    rows = jnp.stack([dc, jnp.broadcast_to(prev[:, :, None], dc.shape), jnp.broadcast_to(last[:, :, None], dc.shape)],
                     axis=2)
    return (doc[:, :, None], rows)


def _masks(seg_refs, k, L):
    i = jax.lax.broadcasted_iota(jnp.int32, (L, L), 0)
    j = jax.lax.broadcasted_iota(jnp.int32, (L, L), 1)
    mk = i >= j
    if seg_refs is None:
        return C.Masks(mk)
    dcol_r, drow_r = seg_refs
    dcol = dcol_r[pl.ds(pl.multiple_of(k * L, L), L), :]   # [L, 1]
    r = drow_r[k]                                          # [3, L]
    drow, dprev, dlast = r[0:1, :], r[1:2, 0:1], r[2:3, 0:1]
    mk = jnp.logical_and(mk, dcol == drow)
    return C.Masks(mk, (dcol == dprev).astype(F32), (dcol == dlast).astype(F32), (dprev == dlast).astype(F32))


def _tabs(tab_refs, j):
    two = lambda r: (r[j, 0], r[j, 1])  # noqa: E731
    return C.Tabs(*(two(r) for r in tab_refs))


def _split(refs, n_in, seg):
    k = n_in + (2 if seg else 0)
    ins, rest = refs[:k], refs[k:]
    return (ins[:n_in], ins[n_in:] if seg else None), rest


class _Cols:
    """Column slices of one head inside a [TB, hg·N] / [TB, hg·2·M] block, rows of chunk k."""

    def __init__(self, L, M):
        self.L, self.M = L, M

    def rows(self, k):
        return pl.ds(pl.multiple_of(k * self.L, self.L), self.L)

    def feat(self, ref, k, j, N):
        return ref[self.rows(k), pl.ds(j * N, N)]

    def set_feat(self, ref, k, j, N, v):
        ref[self.rows(k), pl.ds(j * N, N)] = v.astype(ref.dtype)

    def modes(self, ref, k, j):
        M = self.M
        return (ref[self.rows(k), pl.ds(2 * j * M, M)].astype(F32),
                ref[self.rows(k), pl.ds(2 * j * M + M, M)].astype(F32))

    def set_modes(self, ref, k, j, v):
        M = self.M
        ref[self.rows(k), pl.ds(2 * j * M, M)] = v[0].astype(ref.dtype)
        ref[self.rows(k), pl.ds(2 * j * M + M, M)] = v[1].astype(ref.dtype)


def _flat(x):  # [B, T, H, ...] -> [B, T, H·...]  (a free reshape)
    return x.reshape(x.shape[0], x.shape[1], -1)


def _geom(kernel, B, T, H, N, M, L, io_dt, sdt, seg, save=False):
    return geometry(kernel, B, T, H, N, M, L, io_bytes=_isz(io_dt), sdt_bytes=_isz(sdt), seg=seg, save=save)


# ----------------------------------------------------------------------------------------------------------------
# forward


def _kspec(g: Geom):  # kmix [H, 2, M, M]
    return pl.BlockSpec((g.hg, 2, g.M, g.M), lambda b, h, t: (h, 0, 0, 0))


def _kmat(k_r, j):
    return None if k_r is None else (k_r[j, 0], k_r[j, 1])


def _unpack(ins, names):
    """Input refs by name; names ending in '?' are optional (absent -> None, name listed as None)."""
    out, i = {}, 0
    for n in names:
        if n is None:
            continue
        if n == "tabs":
            out[n] = ins[i:i + 5]
            i += 5
        else:
            out[n] = ins[i]
            i += 1
    return out


def _fwd_kernel(g: Geom, N, seg, save, has_k, readout):
    """Shared body of fwd_p / fwd_o: state scratch [hg, 2, M, N]; per chunk the readout and the carry."""
    cols, hg, nk = _Cols(g.L, g.M), g.hg, g.nk
    n_in = 8 + int(has_k)

    def kernel(*refs):
        (ins, seg_r), rest = _split(refs, n_in, seg)
        r = _unpack(ins, ["a", "k" if has_k else None, "z", "tabs", "x0"])
        a_r, k_r, z_r, tab_r, x0_r = r["a"], r.get("k"), r["z"], r["tabs"], r["x0"]
        out_r, xt_r, st = rest[0], rest[1], rest[-1]
        xs_r = rest[2] if save else None
        t = pl.program_id(2)

        @pl.when(t == 0)
        def _():
            st[...] = x0_r[...]

        def body(k, carry):
            mk = _masks(seg_r, k, g.L)
            for j in range(hg):
                tb = _tabs(tab_r, j)
                X = (st[j, 0], st[j, 1])
                if save:
                    xs_r[j, k, 0] = X[0].astype(xs_r.dtype)
                    xs_r[j, k, 1] = X[1].astype(xs_r.dtype)
                z = cols.feat(z_r, k, j, N)
                readout(cols, a_r, _kmat(k_r, j), out_r, k, j, z, X, tb, mk)
                nr, ni = C.carry_fwd(z, X, tb, mk, readout.dot)
                st[j, 0] = nr
                st[j, 1] = ni
            return carry

        jax.lax.fori_loop(0, nk, body, 0)

        @pl.when(t == g.NT - 1)
        def _():
            xt_r[...] = st[...]

    return kernel


def plans():
    """op.py's fused operator asks the kernel module for per-kernel plans; the TPU kernels plan their own grid
    (``geometry``) from the shapes, so every plan is None."""
    return tuple((k, None) for k in ("bwd_o", "bwd_p", "fwd_o", "fwd_p", "scan_fwd_k", "scan_fwd_v", "scan_rev_k",
                                     "scan_rev_v"))


def fwd_p(fq, zk, tabs, x0, segs, *, L, cdt, interpret, mdt=F32, save_sdt=None, plan=None, block_r=None):
    """p [1, B, T, H, 2, M] (mdt) and Xk_T [B, H, 2, M, R] float32 (and xs [B, H, NC, 2, M, R] with save_sdt)."""
    B, T, H, R = fq.shape
    M = tabs[0].shape[-1]
    seg, save = segs is not None, save_sdt is not None
    g = _geom("fwd_p", B, T, H, R, M, L, fq.dtype, save_sdt or cdt, seg, save)
    dot = C.Dots(cdt)

    def readout(cols, fq_r, _k, p_r, k, j, z, X, tb, mk):
        cols.set_modes(p_r, k, j, C.p_fwd(cols.feat(fq_r, k, j, R), z, X, tb, mk, dot))

    readout.dot = dot
    s = _Specs(g)
    in_specs = [s.feat(R), s.feat(R)] + s.tabs() + [s.state(R)] + s.segs(seg)
    out_specs = [s.modes(), s.state(R)]
    out = (jax.ShapeDtypeStruct((B, T, H * 2 * M), mdt), jax.ShapeDtypeStruct((B, H, 2, M, R), F32))
    if save:
        out_specs.append(s.cstate(R))
        out = out + (jax.ShapeDtypeStruct((B, H, g.NC, 2, M, R), save_sdt),)
    res = _call(_fwd_kernel(g, R, seg, save, False, readout), "fwd_p", out, g, in_specs, out_specs,
                [_vmem((g.hg, 2, M, R))], interpret,
                _estimate("fwd_p", g, _isz(fq.dtype), _isz(save_sdt or cdt), seg, save, mode_bytes=_isz(mdt)))(
        _flat(fq), _flat(zk), *tabs, x0, *_seg_prep(segs, L))
    return (res[0].reshape(B, T, H, 2, M)[None],) + tuple(res[1:])


def fwd_o(p, kmix, zv, tabs, x0, segs, *, conj, L, cdt, out_dtype, interpret, save_sdt=None, plan=None):
    """o [B, T, H, D] and Xv_T [B, H, 2, M, D] (and xs with save_sdt); the mode vector of every token,
    w = mix(p) (kmix [H, 2, M, M] planes or None = identity), is computed per chunk in the kernel."""
    B, T, H, D = zv.shape
    M = tabs[0].shape[-1]
    seg, save, has_k = segs is not None, save_sdt is not None, kmix is not None
    g = _geom("fwd_o", B, T, H, D, M, L, zv.dtype, save_sdt or cdt, seg, save)
    dot = C.Dots(cdt)

    def readout(cols, p_r, kk, o_r, k, j, z, X, tb, mk):
        w, _ = C.mix_fwd(cols.modes(p_r, k, j), kk, conj, dot)
        cols.set_feat(o_r, k, j, D, C.o_fwd(w, z, X, tb, mk, dot))

    readout.dot = dot
    s = _Specs(g)
    in_specs = [s.modes()] + ([_kspec(g)] if has_k else []) + [s.feat(D)] + s.tabs() + [s.state(D)] + s.segs(seg)
    out_specs = [s.feat(D), s.state(D)]
    out = (jax.ShapeDtypeStruct((B, T, H * D), out_dtype), jax.ShapeDtypeStruct((B, H, 2, M, D), F32))
    if save:
        out_specs.append(s.cstate(D))
        out = out + (jax.ShapeDtypeStruct((B, H, g.NC, 2, M, D), save_sdt),)
    res = _call(_fwd_kernel(g, D, seg, save, has_k, readout), "fwd_o", out, g, in_specs, out_specs,
                [_vmem((g.hg, 2, M, D))], interpret,
                _estimate("fwd_o", g, _isz(zv.dtype), _isz(save_sdt or cdt), seg, save, mode_bytes=_isz(p.dtype),
                          has_k=has_k))(
        _flat(p), *((kmix,) if has_k else ()), _flat(zv), *tabs, x0, *_seg_prep(segs, L))
    return (res[0].reshape(B, T, H, D),) + tuple(res[1:])


# ----------------------------------------------------------------------------------------------------------------
# scans


def scan_fwd(z, tabs, x0, segs, *, L, cdt, sdt, interpret, plan=None, name="scan_fwd", block_n=None):
    """States before every chunk: xs [B, H, NC, 2, M, N] (dtype sdt)."""
    B, T, H, N = z.shape
    M = tabs[0].shape[-1]
    seg = segs is not None
    g = _geom("scan_fwd", B, T, H, N, M, L, z.dtype, sdt, seg)
    dot, cols = C.Dots(cdt), _Cols(L, M)

    def kernel(*refs):
        ((z_r, *tab_r, x0_r), seg_r), (out_r, st) = _split(refs, 7, seg)
        t = pl.program_id(2)

        @pl.when(t == 0)
        def _():
            st[...] = x0_r[...]

        def body(k, carry):
            mk = _masks(seg_r, k, L)
            for j in range(g.hg):
                tb = _tabs(tab_r, j)
                X = (st[j, 0], st[j, 1])
                out_r[j, k, 0] = X[0].astype(out_r.dtype)
                out_r[j, k, 1] = X[1].astype(out_r.dtype)
                nr, ni = C.carry_fwd(cols.feat(z_r, k, j, N), X, tb, mk, dot)
                st[j, 0] = nr
                st[j, 1] = ni
            return carry

        jax.lax.fori_loop(0, g.nk, body, 0)

    s = _Specs(g)
    in_specs = [s.feat(N)] + s.tabs() + [s.state(N)] + s.segs(seg)
    out = jax.ShapeDtypeStruct((B, H, g.NC, 2, M, N), sdt)
    return _call(kernel, name, out, g, in_specs, s.cstate(N), [_vmem((g.hg, 2, M, N))], interpret,
                 _estimate("scan_fwd", g, _isz(z.dtype), _isz(sdt), seg))(
        _flat(z), *tabs, x0, *_seg_prep(segs, L))


def scan_rev(x, g_modes, tabs, yT, segs, *, L, cdt, sdt, conj_g, interpret, kmix=None, mix_conj=None, plan=None,
             name="scan_rev", block_n=None):
    """Adjoint states after every chunk ys [B, H, NC, 2, M, N] (sdt) and y0 [B, H, 2, M, N] float32.
    g_modes [B, T, H, 2, M]: the per-token vector is g (mix_conj None: the P-half's dp) or mix(g) (the O-half's
    w from p, mixed in the kernel), conjugated when conj_g."""
    B, T, H, N = x.shape
    M = tabs[0].shape[-1]
    seg, has_k = segs is not None, kmix is not None
    g = _geom("scan_rev", B, T, H, N, M, L, x.dtype, sdt, seg)
    dot, cols, nk = C.Dots(cdt), _Cols(L, M), g.nk

    def kernel(*refs):
        (ins, seg_r), (ys_r, y0_r, st) = _split(refs, 8 + int(has_k), seg)
        r = _unpack(ins, ["x", "g", "k" if has_k else None, "tabs", "yt"])
        x_r, g_r, k_r, tab_r, yt_r = r["x"], r["g"], r.get("k"), r["tabs"], r["yt"]
        t = pl.program_id(2)

        @pl.when(t == 0)
        def _():
            st[...] = yt_r[...]

        def body(i, carry):
            k = nk - 1 - i
            mk = _masks(seg_r, k, L)
            for j in range(g.hg):
                tb = _tabs(tab_r, j)
                Y = (st[j, 0], st[j, 1])
                ys_r[j, k, 0] = Y[0].astype(ys_r.dtype)
                ys_r[j, k, 1] = Y[1].astype(ys_r.dtype)
                gc = cols.modes(g_r, k, j)
                if mix_conj is not None:
                    gc, _ = C.mix_fwd(gc, _kmat(k_r, j), mix_conj, dot)
                nr, ni = C.carry_rev(cols.feat(x_r, k, j, N), gc, Y, tb, mk, dot, conj_g)
                st[j, 0] = nr
                st[j, 1] = ni
            return carry

        jax.lax.fori_loop(0, nk, body, 0)

        @pl.when(t == g.NT - 1)
        def _():
            y0_r[...] = st[...]

    s = _Specs(g, reverse=True)
    in_specs = ([s.feat(N), s.modes()] + ([_kspec(g)] if has_k else []) + s.tabs() + [s.state(N)]
                + s.segs(seg))
    out_specs = [s.cstate(N), s.state(N)]
    out = (jax.ShapeDtypeStruct((B, H, g.NC, 2, M, N), sdt), jax.ShapeDtypeStruct((B, H, 2, M, N), F32))
    return _call(kernel, name, out, g, in_specs, out_specs, [_vmem((g.hg, 2, M, N))], interpret,
                 _estimate("scan_rev", g, _isz(x.dtype), _isz(sdt), seg, mode_bytes=_isz(g_modes.dtype),
                           has_k=has_k and mix_conj is not None))(
        _flat(x), _flat(g_modes), *((kmix,) if has_k else ()), *tabs, yT, *_seg_prep(segs, L))


# ----------------------------------------------------------------------------------------------------------------
# chunk-parallel backward (parameter sums accumulated in the resident output blocks across the time axis)


def _acc_out(B, H, M):
    return (jax.ShapeDtypeStruct((B, H, 1, 4, 1, M), F32), jax.ShapeDtypeStruct((B, H, 1, 2, M, 1), F32))


def _bwd_kernel(g: Geom, seg, has_k, names, n_out, chunk):
    hg, nk = g.hg, g.nk
    n_in = 10 + int(has_k)  # 5 named inputs + tabs (5) [+ kmix]

    def kernel(*refs):
        (ins, seg_r), outs = _split(refs, n_in, seg)
        r = _unpack(ins, names)
        row_r, col_r = outs[n_out], outs[n_out + 1]
        dk_r = outs[n_out + 2] if has_k else None
        t = pl.program_id(2)

        @pl.when(t == 0)
        def _():
            row_r[...] = jnp.zeros(row_r.shape, F32)
            col_r[...] = jnp.zeros(col_r.shape, F32)
            if has_k:
                dk_r[...] = jnp.zeros(dk_r.shape, F32)

        def body(k, carry):
            mk = _masks(seg_r, k, g.L)
            for j in range(hg):
                tb = _tabs(r["tabs"], j)
                X = (r["xs"][j, k, 0].astype(F32), r["xs"][j, k, 1].astype(F32))
                Y = (r["ys"][j, k, 0].astype(F32), r["ys"][j, k, 1].astype(F32))
                acc = tuple(row_r[j, i] for i in range(4)) + (col_r[j, 0], col_r[j, 1])
                acc, dk = chunk(r, outs, k, j, X, Y, tb, mk, acc)
                for i in range(4):
                    row_r[j, i] = acc[i]
                col_r[j, 0] = acc[4]
                col_r[j, 1] = acc[5]
                if dk is not None:
                    dk_r[j, 0] = dk_r[j, 0] + dk[0]
                    dk_r[j, 1] = dk_r[j, 1] + dk[1]
            return carry

        jax.lax.fori_loop(0, nk, body, 0)

    return kernel


def bwd_o(p, kmix, zv, do, xs, ys, tabs, segs, *, conj, L, cdt, interpret, mdt=F32, plan=None):
    """O-half backward with the mixing: dp [1, B, T, H, 2, M] (mdt), dzv [B, T, H, D] (zv's dtype), acc rows
    [B, H, 1, 4, 1, M], cols [B, H, 1, 2, M, 1], and the K cotangent planes dk [B, H, 1, 2, M, M] float32
    (None without kmix)."""
    B, T, H, D = zv.shape
    M = tabs[0].shape[-1]
    seg, has_k = segs is not None, kmix is not None
    g = _geom("bwd_o", B, T, H, D, M, L, zv.dtype, xs.dtype, seg)
    dot, cols = C.Dots(cdt), _Cols(L, M)

    def chunk(r, outs, k, j, X, Y, tb, mk, acc):
        kk = _kmat(r.get("k"), j)
        w, sv = C.mix_fwd(cols.modes(r["p"], k, j), kk, conj, dot)
        dw, dzv, acc = C.o_bwd(w, cols.feat(r["zv"], k, j, D), cols.feat(r["do"], k, j, D), X, Y, tb, mk, dot,
                               acc, L)
        dpc, dkc = C.mix_bwd(dw, sv, kk, conj, dot)
        cols.set_modes(outs[0], k, j, dpc)
        cols.set_feat(outs[1], k, j, D, dzv)
        return acc, dkc

    s = _Specs(g)
    in_specs = ([s.modes()] + ([_kspec(g)] if has_k else []) + [s.feat(D), s.feat(D), s.cstate(D), s.cstate(D)]
                + s.tabs() + s.segs(seg))
    out_specs = [s.modes(), s.feat(D)] + s.acc()
    out = ((jax.ShapeDtypeStruct((B, T, H * 2 * M), mdt), jax.ShapeDtypeStruct((B, T, H * D), zv.dtype))
           + _acc_out(B, H, M))
    if has_k:
        out_specs.append(pl.BlockSpec((None, g.hg, None, 2, M, M), lambda b, h, t: (b, h, 0, 0, 0, 0)))
        out = out + (jax.ShapeDtypeStruct((B, H, 1, 2, M, M), F32),)
    names = ["p", "k" if has_k else None, "zv", "do", "xs", "ys", "tabs"]
    res = _call(_bwd_kernel(g, seg, has_k, names, 2, chunk), "bwd_o", out, g, in_specs, out_specs, [], interpret,
                _estimate("bwd_o", g, _isz(zv.dtype), _isz(xs.dtype), seg, mode_bytes=_isz(mdt), has_k=has_k))(
        _flat(p), *((kmix,) if has_k else ()), _flat(zv), _flat(do), xs, ys, *tabs, *_seg_prep(segs, L))
    dp, dzv, row, col = res[:4]
    return (dp.reshape(B, T, H, 2, M)[None], dzv.reshape(B, T, H, D), row, col, res[4] if has_k else None)


def bwd_p(fq, zk, dp, xs, ys, tabs, segs, *, L, cdt, interpret, plan=None):
    """dfq, dzk [B, T, H, R] (input dtypes), acc rows / cols as in bwd_o; dp [B, T, H, 2, M]."""
    B, T, H, R = fq.shape
    M = tabs[0].shape[-1]
    seg = segs is not None
    g = _geom("bwd_p", B, T, H, R, M, L, fq.dtype, xs.dtype, seg)
    dot, cols = C.Dots(cdt), _Cols(L, M)

    def chunk(r, outs, k, j, X, Y, tb, mk, acc):
        dfq, dzk, acc = C.p_bwd(cols.feat(r["fq"], k, j, R), cols.feat(r["zk"], k, j, R), cols.modes(r["dp"], k, j),
                                X, Y, tb, mk, dot, acc, L)
        cols.set_feat(outs[0], k, j, R, dfq)
        cols.set_feat(outs[1], k, j, R, dzk)
        return acc, None

    s = _Specs(g)
    in_specs = [s.feat(R), s.feat(R), s.modes(), s.cstate(R), s.cstate(R)] + s.tabs() + s.segs(seg)
    out_specs = [s.feat(R), s.feat(R)] + s.acc()
    out = (jax.ShapeDtypeStruct((B, T, H * R), fq.dtype), jax.ShapeDtypeStruct((B, T, H * R), zk.dtype)) + _acc_out(B, H, M)
    names = ["fq", "zk", "dp", "xs", "ys", "tabs"]
    dfq, dzk, row, col = _call(_bwd_kernel(g, seg, False, names, 2, chunk), "bwd_p", out, g, in_specs, out_specs, [],
                               interpret, _estimate("bwd_p", g, _isz(fq.dtype), _isz(xs.dtype), seg,
                                                    mode_bytes=_isz(dp.dtype)))(
        _flat(fq), _flat(zk), _flat(dp), xs, ys, *tabs, *_seg_prep(segs, L))
    return dfq.reshape(B, T, H, R), dzk.reshape(B, T, H, R), row, col
