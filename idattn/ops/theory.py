r"""The theory mode (docs/model.md, theory mode): the paper's ideal derivation with a dense HiPPO-LegS basis.

Keys, values and the constant 1 are projected online onto the first N scaled Legendre polynomials of the
history [0, t] under the uniform measure (HiPPO-LegS): coefficients c_t ∈ R^N with

    c_k = A_k c_{k-1} + B_k f_k,        A_k = (I - A/(2t))⁻¹ (I + A/(2t)),   B_k = (I - A/(2t))⁻¹ B / t,   t = k + 1

(bilinear discretisation of dc/dt = (A/t) c + (B/t) f, the HiPPO code's convention), where
A_nk = -sqrt(2n+1)sqrt(2k+1) (n > k), -(n+1) (n = k), 0 (n < k) and B_n = sqrt(2n+1). The basis is orthonormal
under the measure 1/t on [0, t], so for projections U_t (of ξ(k), N×R), Γ_t (of v, N×D) and η_t (of 1, N):

    Σ_n U_t[n] Γ_t[n]ᵀ ≈ (1/t) Σ_s ξ(k_s) v_sᵀ        Σ_n U_t[n] η_t[n] ≈ (1/t) Σ_s ξ(k_s)

and the Nadaraya-Watson readout

    o_t = (ξ(q_t)ᵀ U_tᵀ Γ_t) / (ξ(q_t)ᵀ U_tᵀ η_t + ε)

converges, as N grows, to normalised causal linear attention Σ_s (ξq·ξk_s) v_s / Σ_s (ξq·ξk_s). The error stops
improving around N = 32 on ~200-step signals: the continuous projection is compared against a discrete sum.
A segment reset zeroes the coefficients and restarts LegS's time counter t. Use a positive feature map
(elu + 1 by default in the layer) so the denominator stays positive.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from idattn.ops.interdomain import document_index

_HI = lax.Precision.HIGHEST


def legs_matrices(num_basis: int) -> tuple[np.ndarray, np.ndarray]:
    """Continuous HiPPO-LegS (A [N, N], B [N]) in float64."""
    q = np.arange(num_basis, dtype=np.float64)
    r = np.sqrt(2 * q + 1)
    a = -np.tril(np.outer(r, r), -1) - np.diag(q + 1)
    return a, r.copy()


@functools.lru_cache(maxsize=16)
def legs_tables(num_basis: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear LegS transition tables for steps k = 0..length-1 (t = k + 1): A [T, N, N], B [T, N], float64."""
    a, bvec = legs_matrices(num_basis)
    eye = np.eye(num_basis)
    a_stack = np.empty((length, num_basis, num_basis))
    b_stack = np.empty((length, num_basis))
    for k in range(length):
        t = k + 1.0
        lhs = eye - a / (2 * t)
        a_stack[k] = np.linalg.solve(lhs, eye + a / (2 * t))
        b_stack[k] = np.linalg.solve(lhs, bvec / t)
    return a_stack, b_stack


def legs_interdomain(fq, fk, v, num_basis: int, *, denominator: bool = True, segment_ids=None, eps: float = 1e-6):
    """Interdomain readout on the dense HiPPO-LegS basis.

    Args:
      fq, fk: [B, T, H, R] feature-mapped queries and keys (use a positive map with the denominator).
      v: [B, T, H, D] values.
      num_basis: N, the number of Legendre coefficients.
      denominator: divide by the projection of the constant 1 (Nadaraya-Watson); False gives the bare numerator.
      segment_ids: [B, T] int, or None. A new document zeroes the coefficients and restarts t.
      eps: added to the denominator.
    Returns:
      o [B, T, H, D] in v's dtype (computed in float32, float64 under x64 with float64 inputs).
    """
    fq, fk, v = jnp.asarray(fq), jnp.asarray(fk), jnp.asarray(v)
    if fq.ndim != 4 or fk.shape != fq.shape or v.ndim != 4 or v.shape[:3] != fq.shape[:3]:
        raise ValueError(f"legs_interdomain wants fq, fk [B, T, H, R] and v [B, T, H, D]; got fq {tuple(fq.shape)}, "
                         f"fk {tuple(fk.shape)}, v {tuple(v.shape)}")
    if not isinstance(num_basis, (int, np.integer)) or num_basis < 1:
        raise ValueError(f"num_basis must be a positive int, got {num_basis!r}")
    bsz, t, h, r = fq.shape
    d = v.shape[-1]
    rdt = jnp.float64 if (jax.config.jax_enable_x64 and v.dtype == jnp.float64) else jnp.float32
    a_tab, b_tab = (jnp.asarray(x, rdt) for x in legs_tables(int(num_basis), t))
    docs = document_index(segment_ids, bsz, t)
    starts = jnp.concatenate([jnp.ones((bsz, 1), bool), docs[:, 1:] != docs[:, :-1]], axis=1)
    # Position within the document: t minus the index of the document's first token.
    idx = jnp.broadcast_to(jnp.arange(t), (bsz, t))
    pos = idx - lax.cummax(jnp.where(starts, idx, 0), axis=1)
    ones = jnp.ones((bsz, t, h, 1), rdt)
    f = jnp.concatenate([fk.astype(rdt), v.astype(rdt), ones], axis=-1)  # [B, T, H, R+D+1]

    def step(coef, xs):
        f_t, fq_t, pos_t, start_t = xs
        coef = jnp.where(start_t[:, None, None, None], 0, coef)
        a_t, b_t = a_tab[pos_t], b_tab[pos_t]  # [B, N, N], [B, N]
        coef = jnp.einsum("bnk,bhkf->bhnf", a_t, coef, precision=_HI) + b_t[:, None, :, None] * f_t[:, :, None, :]
        u, gam, eta = coef[..., :r], coef[..., r:r + d], coef[..., -1]
        p = jnp.einsum("bhnr,bhr->bhn", u, fq_t, precision=_HI)
        num = jnp.einsum("bhn,bhnd->bhd", p, gam, precision=_HI)
        if denominator:
            den = jnp.einsum("bhn,bhn->bh", p, eta, precision=_HI)
            num = num / (den + eps)[..., None]
        return coef, num

    coef0 = jnp.zeros((bsz, h, num_basis, r + d + 1), rdt)
    xs = (jnp.moveaxis(f, 1, 0), jnp.moveaxis(fq.astype(rdt), 1, 0), pos.T, starts.T)
    _, o = lax.scan(step, coef0, xs)
    return jnp.moveaxis(o, 0, 1).astype(v.dtype)


def normalized_linear_attention(fq, fk, v, eps: float = 1e-6):
    """Σ_{s≤t} (fq_t·fk_s) v_s / (Σ_{s≤t} fq_t·fk_s + ε): the limit the LegS readout converges to. [B, T, H, ·]."""
    scores = jnp.einsum("bthr,bshr->bhts", fq, fk, precision=_HI)
    t = fq.shape[1]
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, 0)
    num = jnp.einsum("bhts,bshd->bthd", scores, v, precision=_HI)
    den = jnp.sum(scores, axis=-1)  # [B, H, T]
    return num / (jnp.swapaxes(den, 1, 2)[..., None] + eps)


def smooth_signals(length: int = 200, r: int = 4, d: int = 4, seed: int = 0):
    """Smooth sine-like test signals [1, T, 1, ·] with a positive feature map (elu + 1) on queries and keys."""
    rng = np.random.default_rng(seed)
    s = np.linspace(0.0, 1.0, length)[:, None]

    def sines(width):
        freq = rng.uniform(0.5, 2.0, (1, width))
        phase = rng.uniform(0, 2 * np.pi, (1, width))
        return np.sin(2 * np.pi * freq * s + phase)

    def elu1(x):
        return np.where(x > 0, x + 1.0, np.exp(x))

    fq, fk, v = elu1(sines(r)), elu1(sines(r)), sines(d)
    return tuple(x[None, :, None, :].astype(np.float64) for x in (fq, fk, v))


def convergence_table(basis_sizes=(2, 4, 8, 16, 32), length: int = 200, seed: int = 0):
    """Relative error ‖o_LegS − o_linear‖ / ‖o_linear‖ for each N on `smooth_signals`: list of (N, error)."""
    fq, fk, v = smooth_signals(length, seed=seed)
    ref = np.asarray(normalized_linear_attention(fq, fk, v))
    rows = []
    for n in basis_sizes:
        o = np.asarray(legs_interdomain(fq, fk, v, n))
        rows.append((n, float(np.linalg.norm(o - ref) / np.linalg.norm(ref))))
    return rows
