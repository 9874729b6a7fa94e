"""The float64 sequential loop every implementation of the operator is judged against (NumPy only; it calls
nothing in idattn). One loop for the three cores the tests cover:

    Xk_t = (lam_t ∘ Xk_{t-1}) (I − β_t k̂_t k̂_tᵀ) + b_t ⊗ zk_t,   k̂_t = zk_t / ‖zk_t‖   (β ≡ 0 without `beta`)
    Xv_t = lam_t ∘ Xv_{t-1} + b_t ⊗ zv_t
    o_t  = Re(conj(U_t fq_t)ᵀ Γ_t),   U_t = C Xk_t, Γ_t = C Xv_t   (C = I without `c`; no conj with conj=False)

with both states zeroed where the segment id changes (`seg`), from an optional initial state `x0`. lam and b are
[H, M] (the time-invariant core) or per token [B, T, H, M] (the selective core); beta is [B, T, H]."""
from __future__ import annotations

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
