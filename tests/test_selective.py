"""The selective Interdomain operator (per-token lam_t, b_t) against an independent float64 NumPy loop.

lam_t = exp(Δ_t·a_h + iφ_t,m), one log-decay Δ_t·a_h per (row, token, head) and free per-mode angles
(the operator's docstring, "Selective", idattn/ops/interdomain.py). The reference applies lam_t to the state before
token t enters, applies c literally and resets on raw id changes; it does not call the library. Error metric as
tests/test_ops.py: ‖o − o_ref‖ / ‖o_ref‖ per (batch row, head), worst case. Gradients: the chunked and associative
paths against the sequential lax.scan (every input, including Δ_t, a_h, the per-mode frequencies and the phase
increments θ_t that lam and b are built from), and the sequential path against central differences of the NumPy
reference.
"""
import json
import math
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from idattn.ops import interdomain_mix, interdomain_step, s4d
from idattn.ops import interdomain as op
from tests import train_helpers as T
from tests.test_ops import ref_mix, rel_err


def ref_mix_selective(fq, zk, zv, lam, b, c=None, conj=True, seg=None, x0=None):
    """float64 loop with per-token lam [B, T, H, M], b [B, T, H, M]: o [B, T, H, D] and the final (Xk, Xv)."""
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
                lt, bt = lam[bb, tt, hh], b[bb, tt, hh]
                xk = lt[:, None] * xk + np.outer(bt, zk[bb, tt, hh])
                xv = lt[:, None] * xv + np.outer(bt, zv[bb, tt, hh])
                u = xk if c is None else c[hh] @ xk
                gam = xv if c is None else c[hh] @ xv
                p = u @ fq[bb, tt, hh]
                o[bb, tt, hh] = np.real((np.conj(p) if conj else p) @ gam)
            xk_out[bb, hh], xv_out[bb, hh] = xk, xv
    return o, (xk_out, xv_out)


def build_lam_b(dt, a, w, theta, bc, xp=np):
    """lam_t = exp(Δ_t·(a_h + iω_h,m) + iθ_t,m), b_t = (exp(Δ_t·A) − 1)/A · B (ZOH of A = a + iω; the rotation θ_t
    multiplies lam only). dt [B, T, H] > 0, a [H] < 0, w [H, M], theta [B, T, H, M], bc [H, M] complex."""
    big_a = a[:, None] + 1j * w  # [H, M]
    z = dt[..., None] * big_a  # [B, T, H, M]
    e = xp.exp(z)
    return e * xp.exp(1j * theta), (e - 1) / big_a * bc


def make_selective(bsz=2, t=37, h=2, r=5, d=4, m=6, seed=0, dt_scale=1.0, phase=True):
    rng = np.random.default_rng(seed)
    fq = rng.normal(size=(bsz, t, h, r))
    zk = rng.normal(size=(bsz, t, h, r)) / math.sqrt(r)
    zv = rng.normal(size=(bsz, t, h, d))
    dt = np.exp(rng.uniform(np.log(1e-2), np.log(1.0), (bsz, t, h))) * dt_scale
    a = -np.exp(rng.normal(size=(h,)) * 0.3 - 0.7)
    _, a_im = s4d.init_s4d_a(m, "lin")
    w = np.tile(a_im.astype(np.float64), (h, 1)) + rng.normal(size=(h, m))
    theta = rng.uniform(-np.pi, np.pi, (bsz, t, h, m)) if phase else np.zeros((bsz, t, h, m))
    bc = rng.normal(size=(h, m)) + 1j * rng.normal(size=(h, m))
    lam, b = build_lam_b(dt, a, w, theta, bc)
    c = (rng.normal(size=(h, m, m)) + 1j * rng.normal(size=(h, m, m))) / math.sqrt(m)
    x0 = (rng.normal(size=(bsz, h, m, r)) + 1j * rng.normal(size=(bsz, h, m, r)),
          rng.normal(size=(bsz, h, m, d)) + 1j * rng.normal(size=(bsz, h, m, d)))
    return dict(fq=fq, zk=zk, zv=zv, dt=dt, a=a, w=w, theta=theta, bc=bc, lam=lam, b=b, c=c, x0=x0)


# Resets: row 0 at 16 (a chunk boundary of L = 16, and of 1) and 21, with an id that repeats ([1, 2, 1]);
# row 1 at 5 (a boundary of L = 5) and 30.
SEG = np.zeros((2, 37), np.int32)
SEG[0, 16:], SEG[0, 21:] = 2, 1
SEG[1, 5:], SEG[1, 30:] = 4, 5

# (impl, chunk, conj, with_c): every chunk length in {1, 5, 16, 64} on the chunked path (37 = 2·16 + 5 is ragged;
# 64 > T is one chunk), segment resets and the initial state throughout.
CASES = [("chunked", 1, True, True), ("chunked", 5, False, True), ("chunked", 16, True, False),
         ("chunked", 64, True, True), ("associative", 64, False, False), ("associative", 64, True, True),
         ("sequential", 64, True, True)]


@pytest.mark.parametrize("impl,chunk,conj,with_c", CASES)
def test_matches_float64_reference(impl, chunk, conj, with_c):
    x = make_selective(seed=CASES.index((impl, chunk, conj, with_c)))
    c = x["c"] if with_c else None
    ref, (rk, rv) = ref_mix_selective(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], c, conj, SEG, x["x0"])
    with jax.enable_x64(True):
        o, (xk, xv) = interdomain_mix(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], c, conj=conj, impl=impl,
                                      chunk_size=chunk, segment_ids=SEG, initial_state=x["x0"], return_state=True)
    assert o.dtype == np.float64
    err = rel_err(o, ref)
    serr = max(float(np.abs(np.asarray(xk) - rk).max() / np.abs(rk).max()),
               float(np.abs(np.asarray(xv) - rv).max() / np.abs(rv).max()))
    print(f"\nselective {impl} L={chunk}: output {err:.2e}, state {serr:.2e}")
    assert err <= 1e-10 and serr <= 1e-10
