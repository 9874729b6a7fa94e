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

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32


# --------------------------------------------------------------------------------------------------------------
# small helpers


# dot2's implementation inside the GPU kernels, or None (a*b ± c*d). gpu._call sets it while Pallas traces a
# kernel for Triton: Pallas's Triton lowering reaches ptxas as separate mul.rn / add.rn, which ptxas never fuses,
# so every complex product and multiply-add of the loops cost two multiplies and an add (compiled for sm_90a: no
# FFMA in any kernel before 2026-12-06); gpu._ptx_dot2 writes one multiply and one fma.rn (one rounding fewer).
# Interpret mode and the TPU kernels keep a*b ± c*d.
DOT2 = None


def dot2(a, b, c, d, sub=False, acc=None):
    """a·b + c·d, or a·b - c·d with ``sub`` (elementwise, broadcasting), plus ``acc`` when given: inside the GPU
    kernels one multiply and one fused multiply-add (two fused multiply-adds with acc)."""
    if DOT2 is None:
        out = a * b - c * d if sub else a * b + c * d
        return out if acc is None else acc + out
    return DOT2(a, b, c, d, sub, acc)


def cmul(ar, ai, br, bi):
    """(ar + i ai)(br + i bi) as planes."""
    return dot2(ar, br, ai, bi, sub=True), dot2(ar, bi, ai, br)


def cmul_conj(ar, ai, br, bi):
    """(ar + i ai) · conj(br + i bi) as planes."""
    return dot2(ar, br, ai, bi), dot2(ai, br, ar, bi, sub=True)


class Dots:
    """Matmul policy: operands cast to ``cdt`` (bf16 for bf16 inputs: tensor cores; float32 otherwise with
    precision HIGHEST, which Triton lowers to IEEE fp32 and Mosaic to full fp32), float32 accumulation.

    ``bound``: a traced int32 (the GPU kernels give the chunk index, ``with_bound``) for ``sum``'s one-trip
    loops; None (the TPU kernels) sums plainly."""

    def __init__(self, cdt, bound=None):
        self.cdt = jnp.dtype(cdt)
        self.prec = lax.Precision.HIGHEST if self.cdt == jnp.float32 else lax.Precision.DEFAULT
        self.bound = bound

    def with_bound(self, bound):
        return Dots(self.cdt, bound)

    def sum(self, *terms):
        """Σ_k terms[k]() of dot products given as thunks (float32), so that no term's dot reaches another dot.

        Why (Triton, the GPU kernels): a dot whose result reaches another dot - as that dot's operand, or as
        its accumulator after Triton folds ``acc + dot`` into the dot - gets all warps along its rows
        (warpsPerCTA [num_warps, 1], the layout for flash-attention chains). At L = 64 rows and 8 warps that
        holds every element twice, and the operands that also feed balanced ([4, 2]) dots are built twice in
        two layouts: the bf16 backward's register spills at M = 64 came from there. With a bound, each term is
        computed in a loop of one trip from ``bound`` to ``bound + 1``, which no pass can fold away, with the
        running sum as the loop's carry: Triton folds ``acc + dot`` into the dot's accumulator, and the chain
        it inspects ends at the carry. (Until 2026-12-06 each term started from zeros and the results were added
        after the loops: one float32 add per element and term more; compiled for sm_90a, bf16 (16, 128, 32) 4K,
        chaining took bwd_p from 2,051 to 1,902 instructions per chunk and bwd_o from 1,792 to 1,745, no
        spills at any paper shape.)"""
        if self.bound is None:
            out = terms[0]()
            for t in terms[1:]:
                out = out + t()
            return out
        lo = self.bound
        out = jnp.zeros(jax.eval_shape(terms[0]).shape, F32)
        for t in terms:
            out = lax.fori_loop(lo, lo + 1, lambda _, acc, t=t: acc + t(), out)
        return out

    def __call__(self, a, b):  # a @ b
        return jnp.dot(a.astype(self.cdt), b.astype(self.cdt), precision=self.prec, preferred_element_type=F32)

    def nt(self, a, b):  # a @ bᵀ
        return self(a, b.T)

    def tn(self, a, b):  # aᵀ @ b
        return self(a.T, b)


def causal_mask(length: int, doc=None, start=None):
    """[L, L] bool: i >= j, and d_i == d_j when ``doc`` (int [L]) is given, or j >= s_i when ``start`` (int [L],
    the chunk-local index where row i's document starts: gpu.doc_starts) is given - the same mask."""
    i = lax.broadcasted_iota(jnp.int32, (length, length), 0)
    j = lax.broadcasted_iota(jnp.int32, (length, length), 1)
    m = i >= j
    if doc is not None:
        m = jnp.logical_and(m, doc[:, None] == doc[None, :])
    if start is not None:
        m = jnp.logical_and(m, j >= start[:, None])
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

    def __init__(self, mk, cm=None, em=None, keep=None, select=None):
        self.mk, self.cm, self.em, self.keep, self._select = mk, cm, em, keep, select

    def apply(self, x):
        """x [L, L] where the mask holds, else 0 (a select, never a multiply: masked entries may be inf)."""
        return jnp.where(self.mk, x, 0.0) if self._select is None else self._select(x)


def rowmask(x, m):
    return x if m is None else x * m


def _keep(xr, xi, keep):
    """keep·(xr, xi). keep is 0 or 1 (a reset inside the chunk or not), so the state's decay takes it on the [M, 1]
    decay lamL, not on the [M, N] state: the same numbers, [M, N] multiplies fewer per chunk."""
    return (xr, xi) if keep is None else (xr * keep, xi * keep)


# --------------------------------------------------------------------------------------------------------------
# forward


def carry_fwd(z, X, tb: Tabs, mk: Masks, dot: Dots, pe=None):
    """X' = keep·lamL∘X + (em·Pe)ᵀ·Z.   z [L, N]; X planes [M, N] float32.

    ``pe``: Pe's planes already cast to the compute dtype (loaded once per program, outside the chunk loop), and
    z already em∘Z (rows outside the chunk's last document read as zeros): (em·Pe)ᵀ·Z = Peᵀ·(em∘Z), em in {0, 1},
    the same products."""
    xr, xi = cmul(*_keep(tb.laml[0], tb.laml[1], mk.keep), X[0].astype(F32), X[1].astype(F32))
    if pe is None:
        gr, gi = rowmask(tb.pe[0], mk.em), rowmask(tb.pe[1], mk.em)
    else:
        gr, gi = pe
    if dot.bound is not None:
        return xr + dot.sum(lambda: dot.tn(gr, z)), xi + dot.sum(lambda: dot.tn(gi, z))
    return xr + dot.tn(gr, z), xi + dot.tn(gi, z)


def p_fwd(fq, zk, X, tb: Tabs, mk: Masks, dot: Dots):
    """P-half readout of one chunk: p [L, M] planes (raw Xk_t · fq_t, before c)."""
    g = mk.apply(dot.nt(fq, zk))
    er, ei = dot(g, tb.ps[0]), dot(g, tb.ps[1])
    pr, pi = cmul(tb.pt[0], tb.pt[1], er, ei)
    fr, fi = dot.nt(fq, X[0]), dot.nt(fq, X[1])
    qr, qi = cmul(tb.pin[0], tb.pin[1], fr, fi)
    return pr + rowmask(qr, mk.cm), pi + rowmask(qi, mk.cm)


def o_fwd(w, zv, X, tb: Tabs, mk: Masks, dot: Dots):
    """O-half readout of one chunk: o [L, D] float32 from w [L, M] planes and the carried Xv."""
    qr, qi = cmul(w[0], w[1], tb.pt[0], tb.pt[1])
    ur, ui = cmul(qr, qi, tb.lmu1[0], tb.lmu1[1])  # w∘pin = (w∘pt)·lam^(mu+1): w is dead after Q
    ur, ui = rowmask(ur, mk.cm), rowmask(ui, mk.cm)
    o = dot(ur, X[0]) - dot(ui, X[1])
    a = mk.apply(dot.nt(qr, tb.ps[0]) - dot.nt(qi, tb.ps[1]))
    return o + dot(a, zv)


def o_fwd_scaled(qu, zv, X, tb: Tabs, mk: Masks, dot: Dots):
    """o_fwd with its per-token factors formed outside the kernel (``gpu.prescale_fwd_o``): qu = (q, u) planes
    [L, M] in the compute dtype, q = w∘pt and u = cm·w∘pin, so the chunk's work is three products and the mask:
    o = Re(u·Xv) + mask(Re(q·Psᵀ))·ZV."""
    (qr, qi), (ur, ui) = qu
    o = dot(ur, X[0]) - dot(ui, X[1])
    a = mk.apply(dot.nt(qr, tb.ps[0]) - dot.nt(qi, tb.ps[1]))
    return o + dot(a, zv)


# --------------------------------------------------------------------------------------------------------------
# backward


def carry_rev(x, g, Y, tb: Tabs, mk: Masks, dot: Dots, conj_g: bool):
    """Y_c = keep·conj(lamL)∘Y_{c+1} + (cm·conj(pin)∘g)ᵀ·x.   x [L, N]; g [L, M] planes (conj'ed if conj_g)."""
    yr, yi = cmul_conj(Y[0], Y[1], *_keep(tb.laml[0], tb.laml[1], mk.keep))
    gr, gi = g
    if conj_g:
        gi = -gi
    ur, ui = cmul_conj(gr, gi, tb.pin[0], tb.pin[1])
    ur, ui = rowmask(ur, mk.cm), rowmask(ui, mk.cm)
    return yr + dot.tn(ur, x), yi + dot.tn(ui, x)


def carry_rev_scaled(x, gs, Y, tb: Tabs, mk: Masks, dot: Dots, conj_gs: bool = False):
    """carry_rev with its per-token factor formed outside the kernel: gs = cm·conj(pin)∘g' [L, M] planes (the
    compute dtype; ``gpu.prescale_rev``), so the chunk's work is the state's decay and two products:
    Y_c = keep·conj(lamL)∘Y_{c+1} + gsᵀ·x  (conj(gs) when ``conj_gs``: the sign goes to the product)."""
    yr, yi = cmul_conj(Y[0], Y[1], *_keep(tb.laml[0], tb.laml[1], mk.keep))
    if dot.bound is not None:
        re, im = dot.sum(lambda: dot.tn(gs[0], x)), dot.sum(lambda: dot.tn(gs[1], x))
        return yr + re, (yi - im) if conj_gs else (yi + im)
    im = dot.tn(gs[1], x)
    return yr + dot.tn(gs[0], x), (yi - im) if conj_gs else (yi + im)


class Acc:
    """Running parameter-cotangent sums of one program: s_log, s_b as [1, M] planes; dlamL as [M, 1] planes
    (``flat``: all six as [M] vectors, what the GPU's o_bwd_modes / p_bwd_modes take: Triton holds a [1, M]
    tensor in a dot's layout replicated over the rows of its tile - 8 registers per thread for [1, 32] - and a
    [M] reduction result in a compact slice of it)."""

    @staticmethod
    def zeros(m, flat=False):
        if flat:
            z = jnp.zeros((m,), F32)
            return (z,) * 6
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
    a = mk.apply(dot.nt(qr, tb.ps[0]) - dot.nt(qi, tb.ps[1]))
    da = mk.apply(dot.nt(do, zv))
    per, pei = rowmask(tb.pe[0], mk.em), rowmask(tb.pe[1], mk.em)
    dzv = dot.tn(a, do) + dot(per, Y[0]) + dot(pei, Y[1])
    # readout of the carried state: dW~ = dO·conj(X)ᵀ
    tr, ti = dot.nt(do, X[0]), -dot.nt(do, X[1])
    tr, ti = rowmask(tr, mk.cm), rowmask(ti, mk.cm)
    dwr, dwi = cmul_conj(tr, ti, tb.pin[0], tb.pin[1])
    d_pin = cmul_conj(tr, ti, w[0], w[1])
    # intra-chunk: dQ = dA·conj(Ps), dPs = dAᵀ·conj(Q)
    dqr, dqi = dot(da, tb.ps[0]), -dot(da, tb.ps[1])
    xr, xi = cmul_conj(dqr, dqi, tb.pt[0], tb.pt[1])
    dwr, dwi = dwr + xr, dwi + xi
    d_pt = cmul_conj(dqr, dqi, w[0], w[1])
    d_ps = (dot.tn(da, qr), -dot.tn(da, qi))
    d_pe = (rowmask(dot.nt(zv, Y[0]), mk.em), rowmask(dot.nt(zv, Y[1]), mk.em))
    acc = _acc_tables(acc, tb, length, d_pin, d_pt, d_ps, d_pe, X, Y, mk.keep)
    return (dwr, dwi), dzv, acc


def p_bwd(fq, zk, dp, X, Y, tb: Tabs, mk: Masks, dot: Dots, acc, length):
    """P-half backward of one chunk. Returns dfq [L, R], dzk [L, R] float32, updated acc."""
    g = mk.apply(dot.nt(fq, zk))
    er, ei = dot(g, tb.ps[0]), dot(g, tb.ps[1])
    fr, fi = dot.nt(fq, X[0]), dot.nt(fq, X[1])
    der, dei = cmul_conj(dp[0], dp[1], tb.pt[0], tb.pt[1])
    d_pt = cmul_conj(dp[0], dp[1], er, ei)
    dpr, dpi = rowmask(dp[0], mk.cm), rowmask(dp[1], mk.cm)
    dfr, dfi = cmul_conj(dpr, dpi, tb.pin[0], tb.pin[1])
    d_pin = cmul_conj(dpr, dpi, fr, fi)
    dg = mk.apply(dot.nt(der, tb.ps[0]) + dot.nt(dei, tb.ps[1]))
    d_ps = (dot.tn(g, der), dot.tn(g, dei))
    dfq = dot(dg, zk) + dot(dfr, X[0]) + dot(dfi, X[1])
    per, pei = rowmask(tb.pe[0], mk.em), rowmask(tb.pe[1], mk.em)
    dzk = dot.tn(dg, fq) + dot(per, Y[0]) + dot(pei, Y[1])
    d_pe = (rowmask(dot.nt(zk, Y[0]), mk.em), rowmask(dot.nt(zk, Y[1]), mk.em))
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
    if k is None:
        return mix_bwd_dp(dw, None, conj, dot), None
    return mix_bwd_dp(dw, k, conj, dot), mix_bwd_dk(dw, s, dot)


def mix_bwd_dp(dw, k, conj: bool, dot: Dots):
    """dp from dw (mix_bwd's first output): ds = dw·Kᴴ, dp = conj(ds) when conj."""
    dwr, dwi = dw
    if k is None:
        dsr, dsi = dwr, dwi
    else:
        kr, ki = k
        dsr = dot.nt(dwr, kr) + dot.nt(dwi, ki)
        dsi = dot.nt(dwi, kr) - dot.nt(dwr, ki)
    return (dsr, -dsi) if conj else (dsr, dsi)


def mix_bwd_dk(dw, s, dot: Dots):
    """dK = sᴴ·dw of one chunk (mix_bwd's second output), [M, M] planes."""
    (dwr, dwi), (sr, si) = dw, s
    return (dot.tn(sr, dwr) + dot.tn(si, dwi), dot.tn(sr, dwi) - dot.tn(si, dwr))


# --------------------------------------------------------------------------------------------------------------
# backward with the feature axis in sub-blocks and the modes in blocks (GPU: bounds the tiles a program holds -
# shared memory and registers - without splitting the program, so nothing is written as partial sums)
#
# Everything in o_bwd / p_bwd that contracts over the feature axis (dA = dO·ZVᵀ, dO·Xᵀ, ZV·Yᵀ, G = FQ·ZKᵀ,
# FQ·Xᵀ, ZK·Yᵀ, Σ_n Y∘conj(X)) is a sum over feature sub-blocks, and every per-feature output (dzv, dfq, dzk)
# depends on one sub-block and on quantities computed before the loop. One pass over the sub-blocks therefore
# gives the same result as the whole-width functions above.


class Stacked:
    """Phase-1 dot operands with the complex planes side by side (gpu.MERGED_PLANES), so that a sum of two real
    dots over the planes is one dot of twice the depth: df() -> [L, 2M] (p_bwd's dF = gs: dF·X = dFr·Xr + dFi·Xi),
    pe() -> [L, 2M] (em·Pe), x(j) / y(j) -> [2M, n] (the chunk's states, planes stacked along the modes), and
    the score's operands ds() -> [L, 2M] and ps() -> [L, 2M] with the sign folded into the table (p_bwd:
    dG = Re(ds·conj(Ps)ᵀ) = [ds_r | ds_i]·[Ps_r | Ps_i]ᵀ; o_bwd: A = Re(q·Psᵀ) = [q_r | q_i]·[Ps_r | -Ps_i]ᵀ).
    Each is a loader, called where the operand is used. ds and ps may be None (the score then as two dots); df
    and x are p_bwd's only (o_bwd passes None)."""

    def __init__(self, df, pe, x, y, ds=None, ps=None):
        self.df, self.pe, self.x, self.y, self.ds, self.ps = df, pe, x, y, ds, ps


def _em_pe(tb, mk: Masks, dot: Dots):
    """em·Pe as dot operands (planes), formed once per chunk, not once per feature sub-block (bf16 (16, 128, 32):
    bwd_o 1,745 -> 1,663, bwd_p 1,902 -> 1,795 instructions per chunk as run, no spills at any paper shape)."""
    return tuple(rowmask(tb.pe[k], mk.em).astype(dot.cdt) for k in (0, 1))


def _sub_loop(nsub, body, init):
    if nsub == 1:
        return body(0, init)
    return lax.fori_loop(0, nsub, body, init)


def _value(x):
    """A per-chunk operand given as planes or as a function that loads (or rebuilds) them: the GPU kernels
    pass loaders, so that an operand used before and after the sub-block loop is not held across it."""
    return x() if callable(x) else x


def _state_products(nsub, lx, ly, ld, m, L, mb, dot: Dots, yx=True):
    """Phase 2 of o_bwd_modes / p_bwd_modes for mode block m, summed over the feature sub-blocks: the products of
    the inputs with the chunk's states, A·X0ᵀ, A·X1ᵀ, B·Y0ᵀ, B·Y1ᵀ [L, mb] (A = lx(j), B = ly(j): dO, ZV or FQ, ZK),
    and (``yx``) the dlamL sums Σ_n Y∘conj(X) [mb] planes (else None: the GPU's adjoint scan forms them,
    gpu.scan_rev(.., xs=))."""

    def body(j, carry):
        xr, xi, yr, yi = carry[:4]
        a, b, X, Y = lx(j), ly(j), ld.x(j, m), ld.y(j, m)
        out = (xr + dot.nt(a, X[0]), xi + dot.nt(a, X[1]), yr + dot.nt(b, Y[0]), yi + dot.nt(b, Y[1]))
        if not yx:
            return out
        c_r, c_i = cmul_conj(Y[0].astype(F32), Y[1].astype(F32), X[0].astype(F32), X[1].astype(F32))
        return out + (carry[4] + jnp.sum(c_r, axis=1), carry[5] + jnp.sum(c_i, axis=1))

    zm, zc = jnp.zeros((L, mb), F32), jnp.zeros((mb,), F32)
    if not yx:
        return _sub_loop(nsub, body, (zm,) * 4) + (None, None)
    return _sub_loop(nsub, body, (zm, zm, zm, zm, zc, zc))


def _phase1_once(first, score, store_sub, product, nsub, zero):
    """Phase 1 of o_bwd_modes / p_bwd_modes with a program per mode block (gpu.PHASE1_ONCE): ``first(fn)`` runs
    fn in mode block 0's program only, and there the [L, L] score (score(): A or dG) and, per feature sub-block j,
    store_sub(j, score) (dzv, or dfq and dzk, formed and stored); every program returns Σ_j product(j) (dA or G
    before the mask, what its phase 2 needs), in a loop of its own."""
    def stores():
        t = score()

        def body(j, carry):
            store_sub(j, t)
            return carry
        _sub_loop(nsub, body, 0)

    first(stores)
    return _sub_loop(nsub, lambda j, acc: acc + product(j), zero)


def _mode_block_loop(nmb, phase2, store_acc):
    """store_acc(m, phase2(m)) for every mode block: in a loop over traced m when there are several, so that the
    epilogue's code exists once and one block's sums are live at a time, each stored as soon as it is formed
    (at M = 64 the unrolled blocks left 4-16 B of spills per thread in the bf16 backward; the loop none)."""
    if nmb == 1:
        store_acc(0, phase2(0))
        return

    def body(m, carry):
        store_acc(m, phase2(m))
        return carry

    lax.fori_loop(0, nmb, body, 0)


class _Fold:
    """A sink for one chunk's raw parameter cotangents of one mode block that folds each piece into a flat Acc
    as soon as it is given (its [L, mb] tile then dies at once: registers), with the block's tables tb:

        yx  keep·Σ_n Y∘conj(X) [mb]             -> dlamL
        de  dPe = em·(Z·Yᵀ) [L, mb]             -> s_log += conj(b·lam^mu)·Σ e_e·conj(sp)·dPe, s_b likewise
        ds  dPs [L, mb]                         -> s_log += conj(b)·Σ e_s·conj(sp)·dPs, s_b likewise
        h   the pt-family term before its table -> s_log += Σ_i conj(pt_i)·h_i

    Every fold is linear in its piece and the tables are the same in every chunk of an LTI head, so the pieces
    may equally be summed over chunks first and folded once (_Carry, then fold_raw)."""

    def __init__(self, tb, length, mb):
        self.tb, self.acc = tb, Acc.zeros(mb, flat=True)
        _, _, self.e_s, self.e_e = exponents(length)

    def yx(self, c):
        self.acc = _fold_yx(self.acc, c, None)

    def de(self, t):
        self.acc = _fold_sp_rows(self.acc, self.tb, None, _pe_rows(self.tb, t, self.e_e))

    def ds(self, t):
        self.acc = _fold_sp_rows(self.acc, self.tb, _ps_rows(self.tb, t, self.e_s))

    def h(self, t):
        ur, ui = cmul_conj(t[0], t[1], self.tb.pt[0], self.tb.pt[1])
        self.acc = _fold_sp_rows(self.acc, self.tb, a_rows=(jnp.sum(ur, axis=0), jnp.sum(ui, axis=0)))

    def hp(self, t):  # the pt-family term with conj(pt) already applied (p_bwd_modes with ready-made factors)
        self.acc = _fold_sp_rows(self.acc, self.tb, a_rows=(jnp.sum(t[0], axis=0), jnp.sum(t[1], axis=0)))


RAW = ("h", "ds", "de", "yx")  # the raw pieces, in the order of a program's raw sums (each a pair of planes)
# "hp" (h with its table already applied) rides h's slot: a program hands one or the other, never both, and
# fold_raw(.., h_pre=True) folds the slot as hp


class _Carry:
    """A sink that adds the pieces to the program's running raw sums (a loop carry: RAW's order, flat)."""

    def __init__(self, raw):
        self.raw = list(raw)

    def _add(self, k, t):
        i = 2 * RAW.index(k)
        self.raw[i], self.raw[i + 1] = self.raw[i] + t[0], self.raw[i + 1] + t[1]

    def __getattr__(self, k):
        k = "h" if k == "hp" else k
        if k not in RAW:
            raise AttributeError(k)
        return lambda t: self._add(k, t)


def fold_raw(raw, tb, length, h_pre=False):
    """The flat Acc from raw sums (RAW's order, flat: h, ds, de as [L, mb] planes, yx as [mb] planes), summed
    over any number of chunks of one head: _Fold applied to each piece (h's slot as hp when ``h_pre``). XLA runs
    it once per head on the programs' sums (gpu._fold_raw_sums)."""
    f = _Fold(tb, length, raw[0].shape[-1])
    for i, k in enumerate(RAW):
        getattr(f, "hp" if (k == "h" and h_pre) else k)((raw[2 * i], raw[2 * i + 1]))
    return f.acc


def _raw_epilogue(nmb, phase2, tabs, store_acc, raw, length, only=None):
    """The parameter epilogue of o_bwd_modes / p_bwd_modes; phase2(m, sink) hands mode block m's raw pieces to
    the sink as it forms them. With ``raw`` (the running sums over the program's chunks, a loop carry) and one
    mode block - the only one, or mode block ``only`` of several when each program takes one (gpu's
    SPLIT_MODE_BLOCKS) - they are added to it and the new sums returned: fold_raw then runs once per program,
    after the chunk loop, instead of once per chunk (its row reductions - shuffles and barriers - were ~60% of
    the backward kernels' instructions). Otherwise each block is folded as it goes (_Fold) and handed to
    store_acc (a flat Acc per chunk)."""
    if raw is not None:
        if nmb != 1 and only is None:
            raise ValueError(f"raw parameter sums need one mode block or `only` (got {nmb} blocks)")
        sink = _Carry(raw)
        phase2(0 if only is None else only, sink)
        return tuple(sink.raw)

    def folded(m):
        tb = tabs(m)
        sink = _Fold(tb, length, tb.pt[0].shape[-1])
        phase2(m, sink)
        return sink.acc

    _mode_block_loop(nmb, folded, store_acc)
    return None


def o_bwd_modes(w, ld, store_dzv, store_dw, nsub, nmb, tabs, mk: Masks, dot: Dots, length, store_acc, raw=None,
                pre=None, yx=True, only=None, stacked: Stacked | None = None, first=None):
    """o_bwd over nsub feature sub-blocks and nmb mode blocks (the GPU kernels; same result as o_bwd).

    w(m) -> w [L, mb] planes of mode block m (m = None: all modes); tabs(m) -> the tables of mode block m;
    ld.zv(j), ld.do(j) -> [L, n] of feature sub-block j; ld.x(j, m), ld.y(j, m) -> X, Y planes [mb, n];
    store_dzv(j, dzv [L, n] float32); store_dw(m, dw [L, mb] planes); store_acc(m, acc): the parameter sums of
    mode block m (a flat Acc). m is a Python int or, with several mode blocks, a traced one (phase 2's loop).
    raw: with one mode block (or ``only``), the program's running raw sums (fold_raw's input), returned with this
    chunk's added, and store_acc is not called (see _raw_epilogue).

    Two phases, for registers: (1) what contracts over the modes - A = Re((w∘pt)·Psᵀ) (summed over mode
    blocks), dzv = Aᵀ·dO + Pe·Y, and dA = dO·ZVᵀ - over the feature sub-blocks; (2) per mode block, the [L, mb]
    products dO·Xᵀ, ZV·Yᵀ and the epilogue (dw and the table cotangents, every one of which is per mode). A
    program then holds [L, mb] tiles instead of [L, M] ones where most of them are live; the sub-block inputs are
    read once per phase (L2-resident at these sizes). Every sum of dots goes through ``dot.sum`` (see there).

    pre(m) -> q = w∘pt [L, mb] planes, the forward's factor (``gpu.fwd_mix``'s qu): every use of w here is one of
    q (A's operand, dPs), or conj(w) in the pt-family term, which times conj(pt) is conj(q)∘(...); so w is not
    read, nor pt but for dw, and that term goes to the sink as ``hp`` (fold_raw(.., h_pre=True)).

    yx=False: the dlamL sums Σ_n Y∘conj(X) are left out (the sink gets none: the GPU's adjoint scan forms them,
    gpu.scan_rev(.., xs=)); the same in p_bwd_modes.

    only: with several mode blocks, phase 2 for this one (a traced index) only, its raw sums carried in ``raw``
    (store_dw is then called for it alone); phase 1 still contracts over every block, so its outputs are the
    same in every program of the chunk (the caller stores them once). The same in p_bwd_modes."""
    L = length
    e_in, e_t, e_s, e_e = exponents(L)

    def q_of(m):  # w∘pt of mode block m
        if pre is not None:
            return pre(m)
        tb, wv = tabs(m), w(m)
        return cmul(wv[0], wv[1], tb.pt[0], tb.pt[1])

    def a_terms(m):  # Re((w∘pt)·Psᵀ) of mode block m: Re(q)·Re(Ps)ᵀ - Im(q)·Im(Ps)ᵀ
        return (lambda: dot.nt(q_of(m)[0], tabs(m).ps[0]), lambda: dot.nt(-q_of(m)[1], tabs(m).ps[1]))

    def a_tile():
        if stacked is not None and stacked.ds is not None:  # [q_r | q_i]·[Ps_r | -Ps_i]ᵀ (Stacked.ds, .ps)
            return mk.apply(dot.sum(lambda: dot.nt(stacked.ds(), stacked.ps())))
        return mk.apply(dot.sum(*[t for m in range(nmb) for t in a_terms(m)]))

    zero_ll = jnp.zeros((L, L), F32)
    if stacked is not None and first is not None:  # dzv, and A (its only use), in the first block's program only
        da = _phase1_once(first, a_tile, lambda j, a: store_dzv(j, dot.sum(
            lambda: dot.tn(a, ld.do(j)), lambda: dot(stacked.pe(), stacked.y(j)))),
            lambda j: dot.nt(ld.do(j), ld.zv(j)), nsub, zero_ll)
    else:
        a = a_tile()
        if stacked is not None:  # the planes side by side: Pe·Y as one dot
            def body1(j, da):
                zv, do = ld.zv(j), ld.do(j)
                store_dzv(j, dot.sum(lambda: dot.tn(a, do), lambda: dot(stacked.pe(), stacked.y(j))))
                return da + dot.nt(do, zv)
        else:
            per, pei = _em_pe(tabs(None), mk, dot)

            def body1(j, da):
                zv, do, Y = ld.zv(j), ld.do(j), ld.y(j, None)
                store_dzv(j, dot.sum(lambda: dot.tn(a, do), lambda: dot(per, Y[0]), lambda: dot(pei, Y[1])))
                return da + dot.nt(do, zv)

        da = _sub_loop(nsub, body1, zero_ll)
        del a
    da = mk.apply(da)

    def phase2(m, sink):
        tb = tabs(m)
        mb = tb.pt[0].shape[-1]
        tr, ti, yr, yi, cr, ci = _state_products(nsub, ld.do, ld.zv, ld, m, L, mb, dot, yx)
        ti = -ti  # dO·conj(X)ᵀ
        if yx:
            sink.yx(_keep(cr, ci, mk.keep))
        sink.de((rowmask(yr, mk.em), rowmask(yi, mk.em)))                               # dPe = em·(ZV·Yᵀ)
        del yr, yi
        qr, qi = q_of(m)
        sink.ds((dot.tn(da, qr), -dot.tn(da, qi)))                                         # dPs = dAᵀ·conj(Q)
        del qr, qi
        dqr, dqi = dot(da, tb.ps[0]), -dot(da, tb.ps[1])                                   # dQ = dA·conj(Ps)
        tr, ti = rowmask(tr, mk.cm), rowmask(ti, mk.cm)
        zr, zi = cmul_conj(tr, ti, tb.lmu1[0], tb.lmu1[1])                                 # t·conj(lam^(mu+1))
        u = tb.pt
        store_dw(m, cmul_conj(zr + dqr, zi + dqi, u[0], u[1]))
        if pre is not None:  # conj(pt)·conj(w)·(...) = conj(q)·(...)
            qr, qi = pre(m)
            sink.hp(cmul_conj(dot2(e_t, dqr, e_in, zr), dot2(e_t, dqi, e_in, zi), qr, qi))
            return
        wv = w(m)
        # dPt = dq∘conj(w), dPin = t∘conj(w): s_log += Σ_i conj(pt_i)·conj(w_i)·(e_t·dq + e_in·t·conj(lam^(mu+1)))
        sink.h(cmul_conj(dot2(e_t, dqr, e_in, zr), dot2(e_t, dqi, e_in, zi), wv[0], wv[1]))

    return _raw_epilogue(nmb, phase2, tabs, store_acc, raw, L, only)


def p_bwd_modes(dp, ld, store, nsub, nmb, tabs, mk: Masks, dot: Dots, length, store_acc, raw=None, pre=None,
                yx=True, only=None, stacked: Stacked | None = None, first=None):
    """p_bwd over nsub feature sub-blocks and nmb mode blocks (the GPU kernels; same result as p_bwd).

    dp(m) -> dp [L, mb] planes of mode block m (None: all modes); tabs(m) as in o_bwd_modes; ld.fq(j), ld.zk(j)
    -> [L, n]; ld.x(j, m), ld.y(j, m) -> X, Y planes; store(j, dfq, dzk [L, n] float32); store_acc and raw as in
    o_bwd_modes.
    Phase 1: dG = mk∘((dp∘conj(pt))·conj(Ps)ᵀ) (summed over mode blocks) and the per-feature outputs
    dfq = dG·ZK + dF·X, dzk = dGᵀ·FQ + Pe·Y with G = FQ·ZKᵀ accumulated; phase 2 per mode block: FQ·Xᵀ, ZK·Yᵀ
    and the table cotangents (see o_bwd_modes).

    pre(m) -> (gs, ds), dp's two per-token factors made ready where dp was formed (``gpu.bwd_mix``): the adjoint
    scan's gs = cm·conj(pin)∘dp and ds = conj(pt)∘dp. Every use of dp here is one of the two (dF = gs, the dG
    operand is ds, and since pin = pt·lam^(mu+1) the pt-family term times conj(pt) is
    e_t·ds∘conj(G·Ps) + e_in·gs∘conj(FQ·Xᵀ)), so dp and the pt, pin, lam^(mu+1) tables are not read, and that term
    goes to the sink as ``hp`` (fold_raw(.., h_pre=True))."""
    L = length
    e_in, e_t, e_s, e_e = exponents(L)

    def ds_of(m):  # conj(pt)∘dp of mode block m
        if pre is not None:
            return pre(m)[1]
        tb, dv = tabs(m), dp(m)
        return cmul_conj(dv[0], dv[1], tb.pt[0], tb.pt[1])

    def dg_terms(m):  # Re((dp∘conj(pt))·conj(Ps)ᵀ) of mode block m
        return (lambda: dot.nt(ds_of(m)[0], tabs(m).ps[0]), lambda: dot.nt(ds_of(m)[1], tabs(m).ps[1]))

    def dg_tile():
        if stacked is not None and stacked.ds is not None:  # Re(ds·conj(Ps)ᵀ) = [ds_r | ds_i]·[Ps_r | Ps_i]ᵀ
            return mk.apply(dot.sum(lambda: dot.nt(stacked.ds(), stacked.ps())))
        return mk.apply(dot.sum(*[t for m in range(nmb) for t in dg_terms(m)]))

    zero_ll = jnp.zeros((L, L), F32)
    if stacked is not None and first is not None:  # dfq, dzk and dG (their only use) in the first block's program
        def store_j(j, dg):  # each output formed where it is stored (one live at a time: registers)
            fq, zk = ld.fq(j), ld.zk(j)
            store(j, lambda: dot.sum(lambda: dot(dg, zk), lambda: dot(stacked.df(), stacked.x(j))),
                  lambda: dot.sum(lambda: dot.tn(dg, fq), lambda: dot(stacked.pe(), stacked.y(j))))

        g = _phase1_once(first, dg_tile, store_j, lambda j: dot.nt(ld.fq(j), ld.zk(j)), nsub, zero_ll)
    else:
        dg = dg_tile()
        tbf = tabs(None)
        if stacked is not None:  # the planes side by side: one dot per sum over them
            def body1(j, g):
                fq, zk = ld.fq(j), ld.zk(j)
                store(j, dot.sum(lambda: dot(dg, zk), lambda: dot(stacked.df(), stacked.x(j))),
                      dot.sum(lambda: dot.tn(dg, fq), lambda: dot(stacked.pe(), stacked.y(j))))
                return g + dot.nt(fq, zk)
        else:
            if pre is not None:
                dfr, dfi = pre(None)[0]
            else:
                dv = dp(None)
                dfr, dfi = cmul_conj(rowmask(dv[0], mk.cm), rowmask(dv[1], mk.cm), tbf.pin[0], tbf.pin[1])
                del dv

            per, pei = _em_pe(tbf, mk, dot)

            def body1(j, g):
                fq, zk, X, Y = ld.fq(j), ld.zk(j), ld.x(j, None), ld.y(j, None)
                store(j, dot.sum(lambda: dot(dg, zk), lambda: dot(dfr, X[0]), lambda: dot(dfi, X[1])),
                      dot.sum(lambda: dot.tn(dg, fq), lambda: dot(per, Y[0]), lambda: dot(pei, Y[1])))
                return g + dot.nt(fq, zk)

        g = _sub_loop(nsub, body1, zero_ll)
        del dg
    g = mk.apply(g)

    def phase2(m, sink):
        tb = tabs(m)
        mb = tb.pt[0].shape[-1]
        fr, fi, yr, yi, cr, ci = _state_products(nsub, ld.fq, ld.zk, ld, m, L, mb, dot, yx)
        if yx:
            sink.yx(_keep(cr, ci, mk.keep))
        sink.de((rowmask(yr, mk.em), rowmask(yi, mk.em)))                               # dPe = em·(ZK·Yᵀ)
        del yr, yi
        if pre is not None:
            gs, dsv = pre(m)
            sink.ds((dot.tn(g, dsv[0]), dot.tn(g, dsv[1])))                                # dPs = Gᵀ·ds
            er, ei = dot(g, tb.ps[0]), dot(g, tb.ps[1])
            tr, ti = cmul_conj(dsv[0], dsv[1], er, ei)                                     # conj(pt)∘dPt
            del er, ei, dsv
            zr, zi = cmul_conj(gs[0], gs[1], fr, fi)                                       # conj(pt)∘dPin·conj(lam^(mu+1))
            sink.hp((dot2(e_t, tr, e_in, zr), dot2(e_t, ti, e_in, zi)))
            return
        dv = dp(m)
        u = tb.pt
        der, dei = cmul_conj(dv[0], dv[1], u[0], u[1])
        sink.ds((dot.tn(g, der), dot.tn(g, dei)))                                          # dPs = Gᵀ·(dp∘conj(pt))
        del der, dei
        er, ei = dot(g, tb.ps[0]), dot(g, tb.ps[1])
        tr, ti = cmul_conj(dv[0], dv[1], er, ei)                                           # dPt = dp∘conj(G·Ps)
        del er, ei
        dpr, dpi = rowmask(dv[0], mk.cm), rowmask(dv[1], mk.cm)
        zr, zi = cmul_conj(*cmul_conj(dpr, dpi, fr, fi), tb.lmu1[0], tb.lmu1[1])            # dPin·conj(lam^(mu+1))
        sink.h((dot2(e_t, tr, e_in, zr), dot2(e_t, ti, e_in, zi)))

    return _raw_epilogue(nmb, phase2, tabs, store_acc, raw, L, only)


# The GPU epilogues fold the four table cotangents through two tables only: every table is a power of lam
# times b, pin = pt·lam^(mu+1), ps = b·sp, ep = sp·lam^mu, pe = b·ep, so
#     Σ e·conj(pin)·d  = conj(lam^(mu+1))·Σ e·conj(pt)·d,     Σ e·conj(ps)·d = conj(b)·Σ e·conj(sp)·d,
#     Σ e·conj(pe)·d   = conj(b·lam^mu)·Σ e·conj(sp)·d,       and the b-free sums likewise,
# with the per-mode factors applied to [1, M] rows. Fewer [L, M] tables live in the epilogue (registers).


def _row_sums(d, tab, e):
    """(Σ_i e_i·d_i·conj(T_i), Σ_i d_i·conj(T_i)) as [M] planes (1-D: see AccRows)."""
    cr, ci = cmul_conj(d[0], d[1], tab[0], tab[1])
    return ((jnp.sum(e * cr, axis=0), jnp.sum(e * ci, axis=0)), (jnp.sum(cr, axis=0), jnp.sum(ci, axis=0)))


def _pe_rows(tb, d_pe, e_e):
    return _row_sums(d_pe, tb.sp, e_e)


def _ps_rows(tb, d_ps, e_s):
    return _row_sums(d_ps, tb.sp, e_s)


def _fold_sp_rows(acc, tb, ps_rows=None, pe_rows=None, a_rows=None):
    """acc += the pt/pin part (a_rows, already weighted) and the sp-based rows of dPs and dPe (each
    (Σ e·d·conj(sp), Σ d·conj(sp)) from _row_sums):  s_log += a + conj(b)·(R_s + conj(lam^mu)·R_e),
    s_b += S_s + conj(lam^mu)·S_e. Any part may be None: the GPU epilogues fold each one as soon as it is
    formed, so that its [L, M] operands die at once."""
    l0, l1, b0, b1, c0, c1 = acc
    if a_rows is not None:
        l0, l1 = l0 + a_rows[0], l1 + a_rows[1]
    lmu, b = tb.lmu, tb.b
    for rows, scale in ((ps_rows, None), (pe_rows, lmu)):
        if rows is None:
            continue
        r, srow = rows
        if scale is not None:  # dPe's rows carry conj(lam^mu) (pe = b·sp·lam^mu)
            r = cmul_conj(r[0], r[1], scale[0], scale[1])
            srow = cmul_conj(srow[0], srow[1], scale[0], scale[1])
        lr, li = cmul_conj(r[0], r[1], b[0], b[1])
        l0, l1, b0, b1 = l0 + lr, l1 + li, b0 + srow[0], b1 + srow[1]
    return (l0, l1, b0, b1, c0, c1)


def _fold(acc, e, tab, d, free=None):
    """Fold one table's cotangent d [L, M] planes into acc: s_log += Σ_i e_i·conj(T_i)·d_i, and with the
    b-free power ``free`` (ps and pe carry b) s_b += Σ_i conj(T̂_i)·d_i."""
    lr, li, br_, bi_, ar, ai = acc
    cr, ci = cmul_conj(d[0], d[1], tab[0], tab[1])
    lr = lr + jnp.sum(e * cr, axis=0, keepdims=True)
    li = li + jnp.sum(e * ci, axis=0, keepdims=True)
    if free is not None:
        cr, ci = cmul_conj(d[0], d[1], free[0], free[1])
        br_ = br_ + jnp.sum(cr, axis=0, keepdims=True)
        bi_ = bi_ + jnp.sum(ci, axis=0, keepdims=True)
    return (lr, li, br_, bi_, ar, ai)


def _fold_yx(acc, yx, keep):
    """acc's dlamL columns += keep·Σ_n Y∘conj(X) (yx: the [M, 1] sums)."""
    cr, ci = yx
    if keep is not None:
        cr, ci = cr * keep, ci * keep
    return acc[:4] + (acc[4] + cr, acc[5] + ci)


def _acc_tables_sums(acc, tb: Tabs, length, d_pin, d_pt, d_ps, d_pe, yx, keep):
    """_acc_tables with Σ_n Y∘conj(X) already summed (the [M, 1] columns yx)."""
    e_in, e_t, e_s, e_e = exponents(length)
    for e, tab, d, free in ((e_in, tb.pin, d_pin, None), (e_t, tb.pt, d_pt, None), (e_s, tb.ps, d_ps, tb.sp),
                            (e_e, tb.pe, d_pe, tb.ep)):
        if d is not None:
            acc = _fold(acc, e, tab, d, free)
    return _fold_yx(acc, yx, keep)
