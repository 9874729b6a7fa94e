"""Per-chunk math shared by the GPU (Triton) and TPU (Mosaic) kernels.

Every function here works on *loaded values* of one chunk (never on refs), so the same code is the body of the
GPU kernels (an in-kernel loop over chunks, state in registers) and of the TPU kernels (chunk = sequential grid
axis, state in VMEM scratch). Complex values are pairs of real planes ``(re, im)``; all products are real
matmuls with float32 accumulation. Shapes (one batch row, one head, one chunk of length L, M modes, N features):

    tables  pin[i]  = lam^(i+1)       pt[i] = lam^(i-mu)      (query side, [L, M])
            sp[j]   = lam^(mu-j)      ep[j] = lam^(L-1-j)     (key side, b-free, [L, M]); mu = (L-1)/2
            (only sp is loaded; the others are rebuilt on chip, see Tabs)
            lamL    = lam^L  [M, 1] (a column: it scales state rows);  b [1, M]
            Ps = b * sp,  Pe = b * ep
    masks   mk [L, L] bool: i >= j and same document;  cm [L, 1]: row may read the carried state;
            em [L, 1]: token belongs to the chunk's last document;  keep: carried state survives the chunk.

Forward of the two halves (see ``idattn/ops/pallas/__init__.py`` for how they compose):

    P-half   G = mk ? FQ·ZKᵀ : 0                    p  = pt∘(G·Ps) + cm·pin∘(FQ·Xkᵀ)        [L, M] complex
    O-half   A = mk ? Re((w∘pt)·Psᵀ) : 0            o  = Re((cm·w∘pin)·Xv) + A·ZV          [L, D] real
    carry    X' = keep·lamL∘X + (em·Pe)ᵀ·Z          (Z = ZK or ZV)

Backward (cotangent convention for a complex z = x + iy: dz = ∂L/∂x + i ∂L/∂y; then for z' = a·z, dz = conj(a)·dz'):

    adjoint  Y_c = keep·conj(lamL)∘Y_{c+1} + (cm·conj(pin)∘g)ᵀ·x     (reverse scan; g = dp, x = FQ for the P-half;
                                                                       g = conj(w), x = dO for the O-half)
    params   every table is β·lam^e with an integer exponent e per row, so the kernels reduce their table
             cotangents dT on chip to   s_log = Σ_i e_i·conj(T_i)·dT_i   and   s_b = Σ_j conj(T̂_j)·dT_j
             (T̂ = b-free power), and the wrapper finishes  dlam = s_log / conj(lam),  db = s_b.
             Exponents are chunk-local (|e| ≤ L), so there is no cancellation of large position indices.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

F32 = jnp.float32


# --------------------------------------------------------------------------------------------------------------
# small helpers


def cmul(ar, ai, br, bi):
    """(ar + i ai)(br + i bi) as planes."""
    return ar * br - ai * bi, ar * bi + ai * br


def cmul_conj(ar, ai, br, bi):
    """(ar + i ai) · conj(br + i bi) as planes."""
    return ar * br + ai * bi, ai * br - ar * bi


class Dots:
    """Matmul policy: operands cast to ``cdt`` (bf16 for bf16 inputs: tensor cores; float32 otherwise with
    precision HIGHEST, which Triton lowers to IEEE fp32 and Mosaic to full fp32), float32 accumulation."""

    def __init__(self, cdt):
        self.cdt = jnp.dtype(cdt)
        self.prec = lax.Precision.HIGHEST if self.cdt == jnp.float32 else lax.Precision.DEFAULT

    def __call__(self, a, b):  # a @ b
        return jnp.dot(a.astype(self.cdt), b.astype(self.cdt), precision=self.prec, preferred_element_type=F32)

    def nt(self, a, b):  # a @ bᵀ
        return self(a, b.T)

    def tn(self, a, b):  # aᵀ @ b
        return self(a.T, b)


def causal_mask(length: int, doc=None):
    """[L, L] bool: i >= j, and d_i == d_j when ``doc`` (int [L]) is given."""
    i = lax.broadcasted_iota(jnp.int32, (length, length), 0)
    j = lax.broadcasted_iota(jnp.int32, (length, length), 1)
    m = i >= j
    if doc is not None:
        m = jnp.logical_and(m, doc[:, None] == doc[None, :])
    return m


def exponents(length: int):
    """Column vectors [L, 1] float32: (i+1, i-mu, mu-j, L-1-j) - the power of lam in pin, pt, sp, ep."""
    i = lax.broadcasted_iota(jnp.int32, (length, 1), 0).astype(F32)
    mu = (length - 1) / 2.0
    return i + 1.0, i - mu, mu - i, (length - 1.0) - i


class Tabs:
    """Tables of one head (planes), rebuilt on chip from one loaded [L, M] table and four constant vectors:

        sp [L, M] = lam^(mu-j);  pt = 1/sp = lam^(i-mu);  pin = pt·lam^(mu+1) = lam^(i+1);
        ep = sp·lam^mu = lam^(L-1-j)  (L-1 = 2 mu);   ps = b·sp;  pe = b·ep.

    Loading one table instead of four halves the per-chunk table traffic and the shared memory that Triton
    would pipeline for it; the rebuild is a handful of elementwise ops on [L, M] (|sp| stays within
    exp(±κ(L-1)/2), so the reciprocal is exact to an ulp)."""

    def __init__(self, sp, lmu1, lmu, laml, b):
        self.sp, self.lmu1, self.lmu, self.laml, self.b = sp, lmu1, lmu, laml, b
        self._cache = {}

    # Derived tables are built on first use (in program order), not all up front: each is an [L, M] pair of
    # fp32 planes, and building them where they are needed keeps fewer of them live at once (registers).
    def _get(self, name, fn):
        if name not in self._cache:
            self._cache[name] = fn()
        return self._cache[name]

    @property
    def pt(self):
        def build():
            inv = 1.0 / (self.sp[0] * self.sp[0] + self.sp[1] * self.sp[1])
            return (self.sp[0] * inv, -self.sp[1] * inv)
        return self._get("pt", build)

    @property
    def pin(self):
        return self._get("pin", lambda: cmul(*self.pt, *self.lmu1))

    @property
    def ep(self):
        return self._get("ep", lambda: cmul(*self.sp, *self.lmu))

    @property
    def ps(self):
        return self._get("ps", lambda: cmul(*self.b, *self.sp))

    @property
    def pe(self):
        return self._get("pe", lambda: cmul(*self.b, *self.ep))


class Masks:
    """Per-chunk masks. Without segments: mk causal, cm = em = 1, keep = 1 (all stay Python None / scalars so
    the kernels skip the multiplies)."""

    def __init__(self, mk, cm=None, em=None, keep=None):
        self.mk, self.cm, self.em, self.keep = mk, cm, em, keep


def _rowmask(x, m):
    return x if m is None else x * m


def _keep(xr, xi, keep):
    return (xr, xi) if keep is None else (xr * keep, xi * keep)


# --------------------------------------------------------------------------------------------------------------
# forward


def carry_fwd(z, X, tb: Tabs, mk: Masks, dot: Dots):
    """X' = keep·lamL∘X + (em·Pe)ᵀ·Z.   z [L, N]; X planes [M, N] float32."""
    xr, xi = cmul(tb.laml[0], tb.laml[1], X[0].astype(F32), X[1].astype(F32))
    xr, xi = _keep(xr, xi, mk.keep)
    gr, gi = _rowmask(tb.pe[0], mk.em), _rowmask(tb.pe[1], mk.em)
    return xr + dot.tn(gr, z), xi + dot.tn(gi, z)


def p_fwd(fq, zk, X, tb: Tabs, mk: Masks, dot: Dots):
    """P-half readout of one chunk: p [L, M] planes (raw Xk_t · fq_t, before c)."""
    g = jnp.where(mk.mk, dot.nt(fq, zk), 0.0)
    er, ei = dot(g, tb.ps[0]), dot(g, tb.ps[1])
    pr, pi = cmul(tb.pt[0], tb.pt[1], er, ei)
    fr, fi = dot.nt(fq, X[0]), dot.nt(fq, X[1])
    qr, qi = cmul(tb.pin[0], tb.pin[1], fr, fi)
    return pr + _rowmask(qr, mk.cm), pi + _rowmask(qi, mk.cm)


def o_fwd(w, zv, X, tb: Tabs, mk: Masks, dot: Dots):
    """O-half readout of one chunk: o [L, D] float32 from w [L, M] planes and the carried Xv."""
    qr, qi = cmul(w[0], w[1], tb.pt[0], tb.pt[1])
    a = jnp.where(mk.mk, dot.nt(qr, tb.ps[0]) - dot.nt(qi, tb.ps[1]), 0.0)
    ur, ui = cmul(w[0], w[1], tb.pin[0], tb.pin[1])
    ur, ui = _rowmask(ur, mk.cm), _rowmask(ui, mk.cm)
    return dot(ur, X[0]) - dot(ui, X[1]) + dot(a, zv)


# --------------------------------------------------------------------------------------------------------------
# backward


def carry_rev(x, g, Y, tb: Tabs, mk: Masks, dot: Dots, conj_g: bool):
    """Y_c = keep·conj(lamL)∘Y_{c+1} + (cm·conj(pin)∘g)ᵀ·x.   x [L, N]; g [L, M] planes (conj'ed if conj_g)."""
    yr, yi = cmul_conj(Y[0], Y[1], tb.laml[0], tb.laml[1])
    yr, yi = _keep(yr, yi, mk.keep)
    gr, gi = g
    if conj_g:
        gi = -gi
    ur, ui = cmul_conj(gr, gi, tb.pin[0], tb.pin[1])
    ur, ui = _rowmask(ur, mk.cm), _rowmask(ui, mk.cm)
    return yr + dot.tn(ur, x), yi + dot.tn(ui, x)


class Acc:
    """Running parameter-cotangent sums of one program: s_log, s_b as [1, M] planes; dlamL as [M, 1] planes."""

    @staticmethod
    def zeros(m):
        z_row = jnp.zeros((1, m), F32)
        z_col = jnp.zeros((m, 1), F32)
        return (z_row, z_row, z_row, z_row, z_col, z_col)


def _acc_tables(acc, tb: Tabs, length, d_pin, d_pt, d_ps, d_pe, X, Y, keep):
    """Fold one chunk's table cotangents into (s_log, s_b) rows and dlamL columns."""
    # dlamL = keep·Σ_n Y∘conj(X)  ([M, 1] columns; the wrapper adds L·conj(lamL)·dlamL to s_log)
    cr, ci = cmul_conj(Y[0], Y[1], X[0].astype(F32), X[1].astype(F32))
    yx = (jnp.sum(cr, axis=1, keepdims=True), jnp.sum(ci, axis=1, keepdims=True))
    return _acc_tables_sums(acc, tb, length, d_pin, d_pt, d_ps, d_pe, yx, keep)


def o_bwd(w, zv, do, X, Y, tb: Tabs, mk: Masks, dot: Dots, acc, length):
    """O-half backward of one chunk.  X: forward state before the chunk; Y: adjoint of the state after it.
    Returns dw [L, M] planes, dzv [L, D] float32, updated acc."""
    qr, qi = cmul(w[0], w[1], tb.pt[0], tb.pt[1])
    a = jnp.where(mk.mk, dot.nt(qr, tb.ps[0]) - dot.nt(qi, tb.ps[1]), 0.0)
    da = jnp.where(mk.mk, dot.nt(do, zv), 0.0)
    per, pei = _rowmask(tb.pe[0], mk.em), _rowmask(tb.pe[1], mk.em)
    dzv = dot.tn(a, do) + dot(per, Y[0]) + dot(pei, Y[1])
    # readout of the carried state: dW~ = dO·conj(X)ᵀ
    tr, ti = dot.nt(do, X[0]), -dot.nt(do, X[1])
    tr, ti = _rowmask(tr, mk.cm), _rowmask(ti, mk.cm)
    dwr, dwi = cmul_conj(tr, ti, tb.pin[0], tb.pin[1])
    d_pin = cmul_conj(tr, ti, w[0], w[1])
    # intra-chunk: dQ = dA·conj(Ps), dPs = dAᵀ·conj(Q)
    dqr, dqi = dot(da, tb.ps[0]), -dot(da, tb.ps[1])
    xr, xi = cmul_conj(dqr, dqi, tb.pt[0], tb.pt[1])
    dwr, dwi = dwr + xr, dwi + xi
    d_pt = cmul_conj(dqr, dqi, w[0], w[1])
    d_ps = (dot.tn(da, qr), -dot.tn(da, qi))
    d_pe = (_rowmask(dot.nt(zv, Y[0]), mk.em), _rowmask(dot.nt(zv, Y[1]), mk.em))
    acc = _acc_tables(acc, tb, length, d_pin, d_pt, d_ps, d_pe, X, Y, mk.keep)
    return (dwr, dwi), dzv, acc


def p_bwd(fq, zk, dp, X, Y, tb: Tabs, mk: Masks, dot: Dots, acc, length):
    """P-half backward of one chunk. Returns dfq [L, R], dzk [L, R] float32, updated acc."""
    g = jnp.where(mk.mk, dot.nt(fq, zk), 0.0)
    er, ei = dot(g, tb.ps[0]), dot(g, tb.ps[1])
    fr, fi = dot.nt(fq, X[0]), dot.nt(fq, X[1])
    der, dei = cmul_conj(dp[0], dp[1], tb.pt[0], tb.pt[1])
    d_pt = cmul_conj(dp[0], dp[1], er, ei)
    dpr, dpi = _rowmask(dp[0], mk.cm), _rowmask(dp[1], mk.cm)
    dfr, dfi = cmul_conj(dpr, dpi, tb.pin[0], tb.pin[1])
    d_pin = cmul_conj(dpr, dpi, fr, fi)
    dg = jnp.where(mk.mk, dot.nt(der, tb.ps[0]) + dot.nt(dei, tb.ps[1]), 0.0)
    d_ps = (dot.tn(g, der), dot.tn(g, dei))
    dfq = dot(dg, zk) + dot(dfr, X[0]) + dot(dfi, X[1])
    per, pei = _rowmask(tb.pe[0], mk.em), _rowmask(tb.pe[1], mk.em)
    dzk = dot.tn(dg, fq) + dot(per, Y[0]) + dot(pei, Y[1])
    d_pe = (_rowmask(dot.nt(zk, Y[0]), mk.em), _rowmask(dot.nt(zk, Y[1]), mk.em))
    acc = _acc_tables(acc, tb, length, d_pin, d_pt, d_ps, d_pe, X, Y, mk.keep)
    return dfq, dzk, acc


# --------------------------------------------------------------------------------------------------------------
# the per-token mode mixing, fused into the O-half kernels (w_t = s_t·K with s = conj(p) or p, K = cᴴc or cᵀc)


def mix_fwd(p, k, conj: bool, dot: Dots):
    """w = s·K for one chunk: p [L, M] planes (the P-half's readout), k [M, M] planes or None (identity),
    s = conj(p) if conj else p. Returns (w planes [L, M], s planes)."""
    sr, si = (p[0], -p[1]) if conj else (p[0], p[1])
    if k is None:
        return (sr, si), (sr, si)
    kr, ki = k
    return (dot(sr, kr) - dot(si, ki), dot(sr, ki) + dot(si, kr)), (sr, si)


def mix_bwd(dw, s, k, conj: bool, dot: Dots):
    """Cotangents of mix_fwd (the convention above: for w = s·K, ds = dw·Kᴴ and dK = sᴴ·dw; s = conj(p) gives
    dp = conj(ds)). dw, s [L, M] planes; k [M, M] planes or None. Returns (dp planes [L, M], dK planes [M, M]
    or None)."""
    dwr, dwi = dw
    if k is None:
        dsr, dsi, dk = dwr, dwi, None
    else:
        kr, ki = k
        dsr = dot.nt(dwr, kr) + dot.nt(dwi, ki)
        dsi = dot.nt(dwi, kr) - dot.nt(dwr, ki)
        sr, si = s
        dk = (dot.tn(sr, dwr) + dot.tn(si, dwi), dot.tn(sr, dwi) - dot.tn(si, dwr))
    return ((dsr, -dsi) if conj else (dsr, dsi)), dk


# --------------------------------------------------------------------------------------------------------------
# backward with the feature axis in sub-blocks (GPU: bounds the tiles a program holds - shared memory and
# registers - without splitting the program, so nothing is written as partial sums)
#
# Everything in o_bwd / p_bwd that contracts over the feature axis (dA = dO·ZVᵀ, dO·Xᵀ, ZV·Yᵀ, G = FQ·ZKᵀ,
# FQ·Xᵀ, ZK·Yᵀ, Σ_n Y∘conj(X)) is a sum over feature sub-blocks, and every per-feature output (dzv, dfq, dzk)
# depends on one sub-block and on quantities computed before the loop. One pass over the sub-blocks therefore
# gives the same result as the whole-width functions above.


def _sub_loop(nsub, body, init):
    if nsub == 1:
        return body(0, init)
    return lax.fori_loop(0, nsub, body, init)


def o_bwd_sub(w, load, store_dzv, nsub, tb: Tabs, mk: Masks, dot: Dots, acc, length, M):
    """o_bwd over nsub feature sub-blocks: load(j) -> (zv [L, n], do [L, n], X planes [M, n], Y planes [M, n]);
    store_dzv(j, dzv [L, n] float32). Returns dw [L, M] planes and the updated acc."""
    L = length
    qr, qi = cmul(w[0], w[1], tb.pt[0], tb.pt[1])
    a = jnp.where(mk.mk, dot.nt(qr, tb.ps[0]) - dot.nt(qi, tb.ps[1]), 0.0)
    per, pei = _rowmask(tb.pe[0], mk.em), _rowmask(tb.pe[1], mk.em)

    def body(j, carry):
        da, tr, ti, yr, yi, cr, ci = carry
        zv, do, X, Y = load(j)
        store_dzv(j, dot.tn(a, do) + dot(per, Y[0]) + dot(pei, Y[1]))
        xr, xi = X[0].astype(F32), X[1].astype(F32)
        c_r, c_i = cmul_conj(Y[0], Y[1], xr, xi)
        return (da + dot.nt(do, zv), tr + dot.nt(do, X[0]), ti - dot.nt(do, X[1]),
                yr + dot.nt(zv, Y[0]), yi + dot.nt(zv, Y[1]),
                cr + jnp.sum(c_r, axis=1, keepdims=True), ci + jnp.sum(c_i, axis=1, keepdims=True))

    zl, zm, zc = jnp.zeros((L, L), F32), jnp.zeros((L, M), F32), jnp.zeros((M, 1), F32)
    da, tr, ti, yr, yi, cr, ci = _sub_loop(nsub, body, (zl, zm, zm, zm, zm, zc, zc))
    da = jnp.where(mk.mk, da, 0.0)
    tr, ti = _rowmask(tr, mk.cm), _rowmask(ti, mk.cm)
    dwr, dwi = cmul_conj(tr, ti, tb.pin[0], tb.pin[1])
    d_pin = cmul_conj(tr, ti, w[0], w[1])
    dqr, dqi = dot(da, tb.ps[0]), -dot(da, tb.ps[1])
    xr, xi = cmul_conj(dqr, dqi, tb.pt[0], tb.pt[1])
    dwr, dwi = dwr + xr, dwi + xi
    d_pt = cmul_conj(dqr, dqi, w[0], w[1])
    d_ps = (dot.tn(da, qr), -dot.tn(da, qi))
    d_pe = (_rowmask(yr, mk.em), _rowmask(yi, mk.em))
    acc = _acc_tables_sums(acc, tb, length, d_pin, d_pt, d_ps, d_pe, (cr, ci), mk.keep)
    return (dwr, dwi), acc


def p_bwd_sub(dp, load, store, nsub, tb: Tabs, mk: Masks, dot: Dots, acc, length, M):
    """p_bwd over nsub feature sub-blocks: load(j) -> (fq [L, n], zk [L, n], X planes, Y planes);
    store(j, dfq [L, n], dzk [L, n]) float32. Returns the updated acc."""
    L = length
    der, dei = cmul_conj(dp[0], dp[1], tb.pt[0], tb.pt[1])
    dpr, dpi = _rowmask(dp[0], mk.cm), _rowmask(dp[1], mk.cm)
    dfr, dfi = cmul_conj(dpr, dpi, tb.pin[0], tb.pin[1])
    dg = jnp.where(mk.mk, dot.nt(der, tb.ps[0]) + dot.nt(dei, tb.ps[1]), 0.0)
    per, pei = _rowmask(tb.pe[0], mk.em), _rowmask(tb.pe[1], mk.em)

    def body(j, carry):
        g, fr, fi, yr, yi, cr, ci = carry
        fq, zk, X, Y = load(j)
        store(j, dot(dg, zk) + dot(dfr, X[0]) + dot(dfi, X[1]), dot.tn(dg, fq) + dot(per, Y[0]) + dot(pei, Y[1]))
        xr, xi = X[0].astype(F32), X[1].astype(F32)
        c_r, c_i = cmul_conj(Y[0], Y[1], xr, xi)
        return (g + dot.nt(fq, zk), fr + dot.nt(fq, X[0]), fi + dot.nt(fq, X[1]),
                yr + dot.nt(zk, Y[0]), yi + dot.nt(zk, Y[1]),
                cr + jnp.sum(c_r, axis=1, keepdims=True), ci + jnp.sum(c_i, axis=1, keepdims=True))

    zl, zm, zc = jnp.zeros((L, L), F32), jnp.zeros((L, M), F32), jnp.zeros((M, 1), F32)
    g, fr, fi, yr, yi, cr, ci = _sub_loop(nsub, body, (zl, zm, zm, zm, zm, zc, zc))
    g = jnp.where(mk.mk, g, 0.0)
    er, ei = dot(g, tb.ps[0]), dot(g, tb.ps[1])
    d_pt = cmul_conj(dp[0], dp[1], er, ei)
    d_pin = cmul_conj(dpr, dpi, fr, fi)
    d_ps = (dot.tn(g, der), dot.tn(g, dei))
    d_pe = (_rowmask(yr, mk.em), _rowmask(yi, mk.em))
    return _acc_tables_sums(acc, tb, length, d_pin, d_pt, d_ps, d_pe, (cr, ci), mk.keep)


def _acc_tables_sums(acc, tb: Tabs, length, d_pin, d_pt, d_ps, d_pe, yx, keep):
    """_acc_tables with Σ_n Y∘conj(X) already summed (the [M, 1] columns yx)."""
    e_in, e_t, e_s, e_e = exponents(length)
    lr, li, br_, bi_, ar, ai = acc
    for e, tab, d in ((e_in, tb.pin, d_pin), (e_t, tb.pt, d_pt), (e_s, tb.ps, d_ps), (e_e, tb.pe, d_pe)):
        if d is None:
            continue
        cr, ci = cmul_conj(d[0], d[1], tab[0], tab[1])
        lr = lr + jnp.sum(e * cr, axis=0, keepdims=True)
        li = li + jnp.sum(e * ci, axis=0, keepdims=True)
    for free, d in ((tb.sp, d_ps), (tb.ep, d_pe)):
        cr, ci = cmul_conj(d[0], d[1], free[0], free[1])
        br_ = br_ + jnp.sum(cr, axis=0, keepdims=True)
        bi_ = bi_ + jnp.sum(ci, axis=0, keepdims=True)
    cr, ci = yx
    if keep is not None:
        cr, ci = cr * keep, ci * keep
    return (lr, li, br_, bi_, ar + cr, ai + ci)
