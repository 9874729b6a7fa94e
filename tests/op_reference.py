"""The float64 sequential loop every implementation of the operator is judged against (NumPy; it calls nothing
in idattn). One loop for the three cores the tests cover:

    Xk_t = (lam_t ∘ Xk_{t-1}) (I − β_t k̂_t k̂_tᵀ) + b_t ⊗ zk_t,   k̂_t = zk_t / ‖zk_t‖   (β ≡ 0 without `beta`)
    Xv_t = lam_t ∘ Xv_{t-1} + b_t ⊗ zv_t
    o_t  = Re(conj(U_t fq_t)ᵀ Γ_t),   U_t = C Xk_t, Γ_t = C Xv_t   (C = I without `c`; no conj with conj=False)

with both states zeroed where the segment id changes (`seg`), from an optional initial state `x0`. lam and b are
[H, M] (the time-invariant core) or per token [B, T, H, M] (the selective core); beta is [B, T, H].

`ref_scan64` is the time-invariant case again as a float64 `lax.scan` (jax, still nothing of idattn), for the
gradients: the kernels' tests (tests/test_pallas.py) and the device check (scripts/gpu_check.py) differentiate it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def ref_loop(fq, zk, zv, lam, b, c=None, conj=True, seg=None, x0=None, beta=None):
    """o [B, T, H, D] and the final (Xk [B, H, M, R], Xv [B, H, M, D]), complex128."""
    bsz, t, h, r = fq.shape
    d, m = zv.shape[-1], lam.shape[-1]
    o = np.zeros((bsz, t, h, d))
    xk_out = np.zeros((bsz, h, m, r), complex)
    xv_out = np.zeros((bsz, h, m, d), complex)
    for bb in range(bsz):
        for hh in range(h):
            xk = np.zeros((m, r), complex) if x0 is None else x0[0][bb, hh].astype(complex).copy()
            xv = np.zeros((m, d), complex) if x0 is None else x0[1][bb, hh].astype(complex).copy()
            for tt in range(t):
                if seg is not None and tt > 0 and seg[bb, tt] != seg[bb, tt - 1]:
                    xk[:] = 0
                    xv[:] = 0
                lt = lam[bb, tt, hh] if lam.ndim == 4 else lam[hh]
                bt = b[bb, tt, hh] if b.ndim == 4 else b[hh]
                k = zk[bb, tt, hh]
                xk = lt[:, None] * xk
                if beta is not None:  # erase after the decay, before the write; a zero key erases nothing
                    kh = k / np.linalg.norm(k) if np.any(k) else k
                    xk = xk - beta[bb, tt, hh] * np.outer(xk @ kh, kh)
                xk = xk + np.outer(bt, k)
                xv = lt[:, None] * xv + np.outer(bt, zv[bb, tt, hh])
                u = xk if c is None else c[hh] @ xk
                gam = xv if c is None else c[hh] @ xv
                p = u @ fq[bb, tt, hh]
                o[bb, tt, hh] = np.real((np.conj(p) if conj else p) @ gam)
            xk_out[bb, hh], xv_out[bb, hh] = xk, xv
    return o, (xk_out, xv_out)


def document_resets(seg, B, T):
    """[B, T] bool: True where the segment id changes (the states restart there); all False without `seg`."""
    r = np.zeros((B, T), bool)
    if seg is not None:
        seg = np.asarray(seg)
        r[:, 1:] = seg[:, 1:] != seg[:, :-1]
    return r


def ref_scan64(fq, zk, zv, lam, b, c, x0k, x0v, *, conj, resets):
    """ref_loop's time-invariant recurrence as a lax.scan over time, vmapped over the batch (differentiable in
    every argument): (o [B, T, H, D], Xk [B, H, M, R], Xv [B, H, M, D]). Call under float64 (jax.enable_x64)
    with complex128 lam, b, c, x0k, x0v; `resets` is document_resets' [B, T]."""
    H, M = lam.shape
    cm = jnp.broadcast_to(jnp.eye(M, dtype=jnp.complex128), (H, M, M)) if c is None else c

    def one(fq, zk, zv, rs, xk, xv):
        def step(carry, xs):
            xk, xv = carry
            q, k, v, r = xs
            xk = jnp.where(r, 0, xk)
            xv = jnp.where(r, 0, xv)
            xk = lam[:, :, None] * xk + b[:, :, None] * k[:, None, :]
            xv = lam[:, :, None] * xv + b[:, :, None] * v[:, None, :]
            p = jnp.einsum("hmr,hr->hm", cm @ xk, q)
            return (xk, xv), jnp.real(jnp.einsum("hm,hmd->hd", jnp.conj(p) if conj else p, cm @ xv))

        (xk, xv), o = jax.lax.scan(step, (xk, xv), (fq, zk, zv, rs))
        return o, xk, xv

    return jax.vmap(one)(fq, zk, zv, resets, x0k, x0v)
