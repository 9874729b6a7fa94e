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
from tests.op_reference import ref_loop
from tests.test_ops import ref_mix, rel_err


# compile time dominates on CPU: most XLA optimisations off for this module (conftest.fast_compile)
pytestmark = pytest.mark.usefixtures("fast_compile")


def ref_mix_selective(fq, zk, zv, lam, b, c=None, conj=True, seg=None, x0=None):
    """float64 loop with per-token lam [B, T, H, M], b [B, T, H, M]: o [B, T, H, D] and the final (Xk, Xv)."""
    assert lam.ndim == 4 and b.ndim == 4
    return ref_loop(fq, zk, zv, lam, b, c, conj, seg, x0)


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


# ---------------------------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------------------------

SEG21 = np.zeros((2, 21), np.int32)
SEG21[0, 10:], SEG21[0, 16:] = 1, 2  # a reset exactly at the L = 16 boundary (and at 10, a boundary of L = 5)
SEG21[1, 5:], SEG21[1, 15:] = 3, 3 + 4  # at the L = 5 boundary, and at 15 (a boundary of L = 5)


def _sel_loss(impl, chunk, conj, seg, wts):
    """A scalar of every output: o, the final state; through lam/b built from (log Δ_t, a, ω, θ_t, B)."""
    def loss(fq, zk, zv, log_dt, log_neg_a, w, theta, bc_re, bc_im, c_re, c_im, k0_re, k0_im, v0_re, v0_im):
        lam, b = build_lam_b(jnp.exp(log_dt), -jnp.exp(log_neg_a), w, theta, jax.lax.complex(bc_re, bc_im), xp=jnp)
        o, (xk, xv) = interdomain_mix(fq, zk, zv, lam, b, jax.lax.complex(c_re, c_im), conj=conj, impl=impl,
                                      chunk_size=chunk, segment_ids=seg, return_state=True,
                                      initial_state=(jax.lax.complex(k0_re, k0_im), jax.lax.complex(v0_re, v0_im)))
        return jnp.sum(o * wts) + jnp.sum(jnp.abs(xk) ** 2) * 1e-2 + jnp.sum(jnp.real(xv * (1 + 0.5j))) * 1e-2
    return loss


def _sel_args(x):
    return (x["fq"], x["zk"], x["zv"], np.log(x["dt"]), np.log(-x["a"]), x["w"], x["theta"], x["bc"].real,
            x["bc"].imag, x["c"].real, x["c"].imag, x["x0"][0].real, x["x0"][0].imag, x["x0"][1].real,
            x["x0"][1].imag)


GRAD_NAMES = ("fq", "zk", "zv", "log_dt", "log(-a)", "omega", "theta", "B_re", "B_im", "c_re", "c_im", "xk0_re",
              "xk0_im", "xv0_re", "xv0_im")


@pytest.mark.parametrize("impl,chunk,conj", [
    pytest.param("chunked", 1, True, marks=pytest.mark.slow), ("chunked", 5, False), ("chunked", 16, True),
    pytest.param("chunked", 64, False, marks=pytest.mark.slow), ("associative", 64, True)])
def test_gradients_match_sequential(impl, chunk, conj):
    """Every gradient (inputs, Δ_t, a, ω, θ_t, B, c, initial state) of the chunked / associative paths against the
    sequential scan, ≤ 1e-10 relative (max |Δg| / max |g| per argument); T = 21 ragged for L = 5, 16."""
    x = make_selective(bsz=2, t=21, h=2, r=3, d=2, m=4, seed=5 + chunk)
    wts = np.random.default_rng(0).normal(size=x["zv"].shape)
    args = _sel_args(x)
    with jax.enable_x64(True):
        g_ref = jax.jit(jax.grad(_sel_loss("sequential", chunk, conj, SEG21, wts), argnums=tuple(range(15))))(*args)
        g = jax.jit(jax.grad(_sel_loss(impl, chunk, conj, SEG21, wts), argnums=tuple(range(15))))(*args)
    worst = 0.0
    for name, a, r in zip(GRAD_NAMES, g, g_ref):
        err = float(np.abs(np.asarray(a) - np.asarray(r)).max() / np.abs(np.asarray(r)).max())
        worst = max(worst, err)
        assert err <= 1e-10, (name, err)
    print(f"\nselective gradients {impl} L={chunk}: worst relative {worst:.2e}")


def _np_loss(args, conj, seg, wts):
    fq, zk, zv, log_dt, log_neg_a, w, theta, bre, bim, cre, cim, k0r, k0i, v0r, v0i = args
    lam, b = build_lam_b(np.exp(log_dt), -np.exp(log_neg_a), w, theta, bre + 1j * bim)
    o, (xk, xv) = ref_mix_selective(fq, zk, zv, lam, b, cre + 1j * cim, conj, seg, (k0r + 1j * k0i, v0r + 1j * v0i))
    return float(np.sum(o * wts) + np.sum(np.abs(xk) ** 2) * 1e-2 + np.sum(np.real(xv * (1 + 0.5j))) * 1e-2)


def test_sequential_gradients_against_finite_differences_of_the_numpy_loop():
    """The sequential path's gradients (the reference of the test above) against central differences of the NumPy
    loop, two entries of every argument, ≤ 1e-6 relative (x64; differences at eps = 1e-6)."""
    x = make_selective(bsz=1, t=7, h=1, r=2, d=2, m=3, seed=7)
    seg = np.array([[0, 0, 0, 5, 5, 5, 5]])
    wts = np.random.default_rng(1).normal(size=x["zv"].shape)
    args = [np.asarray(a, np.float64) for a in _sel_args(x)]
    with jax.enable_x64(True):
        grads = jax.jit(jax.grad(_sel_loss("sequential", 4, True, seg, wts), argnums=tuple(range(15))))(*args)
    rng, eps, worst = np.random.default_rng(2), 1e-6, 0.0
    for i, a in enumerate(args):
        for _ in range(2):
            idx = tuple(int(rng.integers(0, s)) for s in a.shape)
            ap, am = [list(args) for _ in range(2)]
            ap[i], am[i] = a.copy(), a.copy()
            ap[i][idx] += eps
            am[i][idx] -= eps
            fd = (_np_loss(ap, True, seg, wts) - _np_loss(am, True, seg, wts)) / (2 * eps)
            err = abs(float(np.asarray(grads[i])[idx]) - fd) / max(1.0, abs(fd))
            worst = max(worst, err)
            assert err <= 1e-6, (GRAD_NAMES[i], idx, err)
    print(f"\nsequential gradients vs finite differences of the NumPy loop: worst {worst:.2e}")


# ---------------------------------------------------------------------------------------------------------------
# LTI as a special case, decode, float32 extremes
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [5, pytest.param(16, marks=pytest.mark.slow)])
def test_constant_per_token_lam_reproduces_lti(chunk):
    """lam_t = lam, b_t = b for every token (today's [H, M] values, broadcast to [B, T, H, M]) gives today's outputs
    and state: float64 ≤ 1e-10 against the LTI chunked path and the LTI NumPy loop; float32 ≤ 1e-5."""
    from tests.test_ops import SEG as LTI_SEG, make_inputs
    x = make_inputs(seed=3)
    bsz, t, h, _ = x["fq"].shape
    lam_t = np.broadcast_to(x["lam"], (bsz, t) + x["lam"].shape)
    b_t = np.broadcast_to(x["b"], (bsz, t) + x["b"].shape)
    ref, _ = ref_mix(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], x["c"], True, LTI_SEG, x["x0"])
    kw = dict(impl="chunked", chunk_size=chunk, segment_ids=LTI_SEG, return_state=True)
    mix = jax.jit(lambda *a: interdomain_mix(*a[:6], initial_state=a[6], **kw))
    with jax.enable_x64(True):
        o_lti, s_lti = mix(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], x["c"], x["x0"])
        o_sel, s_sel = mix(x["fq"], x["zk"], x["zv"], lam_t, b_t, x["c"], x["x0"])
    e64 = max(rel_err(o_sel, o_lti), rel_err(o_sel, ref))
    assert e64 <= 1e-10
    for a, r in zip(s_sel, s_lti):
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-10, atol=1e-12)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    c64 = lambda a: np.asarray(a, np.complex64)  # noqa: E731
    mix32 = jax.jit(lambda *a: interdomain_mix(*a, impl="chunked", chunk_size=chunk, segment_ids=LTI_SEG))
    o32_lti = mix32(f32(x["fq"]), f32(x["zk"]), f32(x["zv"]), c64(x["lam"]), c64(x["b"]), c64(x["c"]))
    o32_sel = mix32(f32(x["fq"]), f32(x["zk"]), f32(x["zv"]), c64(lam_t), c64(b_t), c64(x["c"]))
    e32 = rel_err(o32_sel, o32_lti)
    print(f"\nconstant lam_t vs LTI, L={chunk}: float64 {e64:.2e}, float32 {e32:.2e}")
    assert e32 <= 1e-5


def test_decode_equals_the_prefix_of_the_chunked_output():
    """interdomain_step with this token's lam_t, b_t ([B, H, M], and [B, 1, H, M]) reproduces the chunked output
    and state token by token (float64, ≤ 1e-10)."""
    x = make_selective(bsz=2, t=11, h=2, r=3, d=4, m=5, seed=11)
    with jax.enable_x64(True):
        o_full, st_full = interdomain_mix(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], x["c"], impl="chunked",
                                          chunk_size=4, initial_state=x["x0"], return_state=True)
        state, outs = x["x0"], []
        step = jax.jit(interdomain_step)
        for t in range(11):
            lam_t, b_t = (x["lam"][:, t], x["b"][:, t]) if t % 2 else (x["lam"][:, t:t + 1], x["b"][:, t:t + 1])
            o_t, state = step(state, x["fq"][:, t], x["zk"][:, t], x["zv"][:, t], lam_t, b_t, x["c"])
            outs.append(o_t)
    err = rel_err(np.stack(outs, 1), o_full)
    print(f"\nselective decode vs chunked: {err:.2e}")
    assert err <= 1e-10
    np.testing.assert_allclose(state[0], st_full[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state[1], st_full[1], rtol=1e-10, atol=1e-12)


def test_large_decay_stays_finite_in_float32():
    """Δ·|a| up to 70 per token (a decay to 1e-30 within one chunk of 64) and one token whose lam underflows to 0 in
    complex64 (Δ·|a| = 200): the chunked float32 output and every gradient (through log Δ_t, log(−a), ω, θ_t, B,
    the inputs and c) are finite and match the float64 sequential path: output ≤ 1e-4, gradients ≤ 1e-3
    (max |Δg| / max |g| per argument). The LTI form's centred tables would reach e^{+35·63} here."""
    x = make_selective(bsz=2, t=96, h=2, r=4, d=4, m=8, seed=13)
    dt = x["dt"].copy()
    dt[0, 10] = 70.0 / -x["a"]  # decay e^{-70} ≈ 4e-31 in one step, row 0
    dt[1, 40:60] = 3.5 / -x["a"][None, :]  # e^{-3.5·20} = e^{-70} over 20 steps, row 1
    dt[0, 70, 1] = 200.0 / -x["a"][1]  # underflows: |lam| = e^{-200} = 0 in complex64
    x["dt"] = dt
    lam, b = build_lam_b(dt, x["a"], x["w"], x["theta"], x["bc"])
    ref, _ = ref_mix_selective(x["fq"], x["zk"], x["zv"], lam, b, x["c"])
    wts = np.random.default_rng(3).normal(size=x["zv"].shape)
    args64 = _sel_args(x)
    args32 = tuple(np.asarray(a, np.float32) for a in args64)
    with jax.enable_x64(True):
        g64 = jax.jit(jax.grad(_sel_loss("sequential", 64, True, None, wts), argnums=tuple(range(15))))(*args64)
    lam32, _ = build_lam_b(*(jnp.asarray(a) for a in (np.exp(args32[3]), -np.exp(args32[4]), args32[5], args32[6])),
                           jnp.asarray(x["bc"], jnp.complex64), xp=jnp)
    assert float(jnp.abs(lam32[0, 70, 1]).max()) == 0.0
    o = interdomain_mix(args32[0], args32[1], args32[2], lam32, jnp.asarray(b, jnp.complex64),
                        jnp.asarray(x["c"], jnp.complex64), impl="chunked", chunk_size=64)
    assert np.all(np.isfinite(np.asarray(o)))
    err = rel_err(o, ref)
    g32 = jax.jit(jax.grad(_sel_loss("chunked", 64, True, None, np.float32(wts)), argnums=tuple(range(15))))(*args32)
    gerr = 0.0
    for name, a, r in zip(GRAD_NAMES, g32, g64):
        assert bool(np.all(np.isfinite(np.asarray(a)))), name
        gerr = max(gerr, float(np.abs(np.asarray(a) - np.asarray(r)).max() / np.abs(np.asarray(r)).max()))
    print(f"\nfloat32 decay to 1e-30 in a chunk: output {err:.2e}, gradients {gerr:.2e}")
    assert err <= 1e-4 and gerr <= 1e-3


def test_float32_long_sequence_with_phases():
    """float32, T = 4096, M = 16, uniformly random phase increments θ_t ∈ (−π, π] (the worst case for the angle
    cumsum, which runs within a chunk only) and frequencies up to ω·Δ ≈ 1e3 rad per step: chunked (L = 64) and
    the sequence split's end state against the float64 loop, ≤ 1e-4."""
    x = make_selective(bsz=1, t=4096, h=2, r=8, d=8, m=16, seed=17)
    w = x["w"] * 20  # up to ~20·(15π + noise) ≈ 1e3 rad per unit Δ (Δ ≤ 1)
    lam, b = build_lam_b(x["dt"], x["a"], w, x["theta"], x["bc"])
    seg = np.repeat(np.array([[1, 2, 1, 3]]), 1024, axis=1)
    ref, (rk, _) = ref_mix_selective(x["fq"], x["zk"], x["zv"], lam, b, x["c"], True, seg)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    c64 = lambda a: np.asarray(a, np.complex64)  # noqa: E731
    mix = jax.jit(lambda *a: interdomain_mix(*a, impl="chunked", chunk_size=64, segment_ids=seg, return_state=True))
    o, (xk, _) = mix(f32(x["fq"]), f32(x["zk"]), f32(x["zv"]), c64(lam), c64(b), c64(x["c"]))
    err = rel_err(o, ref)
    serr = float(np.abs(np.asarray(xk) - rk).max() / np.abs(rk).max())
    from idattn.ops.sequence import end_state_selective
    xe, _ = end_state_selective(f32(x["zk"]), c64(lam), c64(b), seg, chunk_size=64)
    eerr = float(np.abs(np.asarray(xe) - rk).max() / np.abs(rk).max())
    print(f"\nfloat32 T=4096 selective with phases: output {err:.2e}, state {serr:.2e}, end_state {eerr:.2e}")
    assert err <= 1e-4 and serr <= 1e-4 and eerr <= 1e-4


# ---------------------------------------------------------------------------------------------------------------
# The linear readout with a selective core (S4D-only selective: the Mamba-like control)
# ---------------------------------------------------------------------------------------------------------------

def ref_linear_selective(z, lam, b, c, seg=None, x0=None):
    """float64 loop: X_t = lam_t ⊙ X_{t−1} + b_t ⊗ z_t (zeroed at a document start), y_t = Re(Σ_m c_m X_t[m])."""
    bsz, t, h, w = z.shape
    m = lam.shape[-1]
    y = np.zeros((bsz, t, h, w))
    x_out = np.zeros((bsz, h, m, w), complex)
    for bb in range(bsz):
        for hh in range(h):
            x = np.zeros((m, w), complex) if x0 is None else x0[bb, hh].astype(complex).copy()
            for tt in range(t):
                if seg is not None and tt > 0 and seg[bb, tt] != seg[bb, tt - 1]:
                    x[:] = 0
                x = lam[bb, tt, hh][:, None] * x + np.outer(b[bb, tt, hh], z[bb, tt, hh])
                y[bb, tt, hh] = np.real(c[hh] @ x)
            x_out[bb, hh] = x
    return y, x_out


@pytest.mark.parametrize("impl,chunk", [("sequential", 64), ("chunked", 1), ("chunked", 5), ("chunked", 16),
                                        ("chunked", 64)])
def test_selective_linear_readout_matches_float64_reference(impl, chunk):
    """s4d_linear_mix with per-token lam_t, b_t (phase on) against the loop above: resets (one exactly at the
    L = 16 and L = 5 boundaries, an id that repeats), the initial state, ragged T = 37; ≤ 1e-10 relative."""
    from idattn.ops import s4d_linear_mix
    x = make_selective(seed=11 + chunk)
    rng = np.random.default_rng(chunk)
    z = np.concatenate([x["zk"], x["zv"]], axis=-1)
    c = rng.normal(size=x["bc"].shape) + 1j * rng.normal(size=x["bc"].shape)
    x0 = np.concatenate(x["x0"], axis=-1)
    ref, rx = ref_linear_selective(z, x["lam"], x["b"], c, SEG, x0)
    with jax.enable_x64(True):
        y, xt = s4d_linear_mix(z, x["lam"], x["b"], c, impl=impl, chunk_size=chunk, segment_ids=SEG,
                               initial_state=x0, return_state=True)
    err = rel_err(y, ref)
    serr = float(np.abs(np.asarray(xt) - rx).max() / np.abs(rx).max())
    print(f"\nselective linear {impl} L={chunk}: output {err:.2e}, state {serr:.2e}")
    assert y.dtype == np.float64 and err <= 1e-10 and serr <= 1e-10


def _lin_loss(impl, chunk, seg, wts):
    from idattn.ops import s4d_linear_mix

    def loss(z, log_dt, log_neg_a, w, theta, bc_re, bc_im, c_re, c_im, x0_re, x0_im):
        lam, b = build_lam_b(jnp.exp(log_dt), -jnp.exp(log_neg_a), w, theta, jax.lax.complex(bc_re, bc_im), xp=jnp)
        y, xt = s4d_linear_mix(z, lam, b, jax.lax.complex(c_re, c_im), impl=impl, chunk_size=chunk, segment_ids=seg,
                               initial_state=jax.lax.complex(x0_re, x0_im), return_state=True)
        return jnp.sum(y * wts) + jnp.sum(jnp.real(xt * (1 + 0.5j))) * 1e-2
    return loss


@pytest.mark.parametrize("chunk", [5, 16])
def test_selective_linear_readout_gradients_match_sequential(chunk):
    """Every gradient (z, Δ_t, a, ω, θ_t, B, c, initial state) of the chunked path against the sequential scan,
    ≤ 1e-10 relative; the sequential one against central differences of the NumPy loop, ≤ 1e-6."""
    x = make_selective(bsz=2, t=21, h=2, r=3, d=2, m=4, seed=30 + chunk)
    rng = np.random.default_rng(chunk)
    z = np.concatenate([x["zk"], x["zv"]], axis=-1)
    c = rng.normal(size=x["bc"].shape) + 1j * rng.normal(size=x["bc"].shape)
    x0 = np.concatenate(x["x0"], axis=-1)
    wts = rng.normal(size=z.shape)
    args = (z, np.log(x["dt"]), np.log(-x["a"]), x["w"], x["theta"], x["bc"].real, x["bc"].imag, c.real, c.imag,
            x0.real, x0.imag)
    with jax.enable_x64(True):
        g_ref = jax.jit(jax.grad(_lin_loss("sequential", chunk, SEG21, wts), argnums=tuple(range(11))))(*args)
        g = jax.jit(jax.grad(_lin_loss("chunked", chunk, SEG21, wts), argnums=tuple(range(11))))(*args)
    for i, (a, r) in enumerate(zip(g, g_ref)):
        err = float(np.abs(np.asarray(a) - np.asarray(r)).max() / np.abs(np.asarray(r)).max())
        assert err <= 1e-10, (i, err)

    def np_loss(a):
        lam, b = build_lam_b(np.exp(a[1]), -np.exp(a[2]), a[3], a[4], a[5] + 1j * a[6])
        y, xt = ref_linear_selective(a[0], lam, b, a[7] + 1j * a[8], SEG21, a[9] + 1j * a[10])
        return float(np.sum(y * wts) + np.sum(np.real(xt * (1 + 0.5j))) * 1e-2)
    eps = 1e-6
    for i, a in enumerate(args):
        idx = tuple(int(rng.integers(0, s)) for s in a.shape)
        ap, am = [list(args) for _ in range(2)]
        ap[i], am[i] = np.array(a, np.float64), np.array(a, np.float64)
        ap[i][idx] += eps
        am[i][idx] -= eps
        fd = (np_loss(ap) - np_loss(am)) / (2 * eps)
        assert abs(float(np.asarray(g_ref[i])[idx]) - fd) / max(1.0, abs(fd)) <= 1e-6, (i, idx)


def test_selective_linear_step_equals_the_prefix_and_a_constant_lam_is_the_lti_readout():
    """Decoding token by token equals the chunked output and its state; a per-token lam that is today's constant
    gives today's LTI outputs."""
    from idattn.ops import s4d_linear_mix, s4d_linear_step
    x = make_selective(bsz=1, t=12, h=2, r=2, d=2, m=3, seed=3)
    z = np.concatenate([x["zk"], x["zv"]], axis=-1)
    c = x["bc"][::-1].copy()
    with jax.enable_x64(True):
        y, xt = s4d_linear_mix(z, x["lam"], x["b"], c, chunk_size=5, return_state=True)
        state = np.zeros((1, 2, 3, 4), complex)
        for t in range(12):
            y_t, state = s4d_linear_step(state, z[:, t], x["lam"][:, t], x["b"][:, t], c)
            np.testing.assert_allclose(np.asarray(y_t), np.asarray(y)[:, t], rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(np.asarray(state), np.asarray(xt), rtol=1e-11, atol=1e-12)
        lam_c = np.exp(-0.3 + 1j * np.linspace(0.1, 1.0, 3))[None].repeat(2, 0)
        b_c = x["bc"]
        lti = s4d_linear_mix(z, lam_c, b_c, c, chunk_size=5)
        per = s4d_linear_mix(z, np.broadcast_to(lam_c, (1, 12, 2, 3)), np.broadcast_to(b_c, (1, 12, 2, 3)), c,
                             chunk_size=5)
    assert rel_err(per, np.asarray(lti)) <= 1e-12


# ---------------------------------------------------------------------------------------------------------------
# Validation and the pallas fallback
# ---------------------------------------------------------------------------------------------------------------

def test_refuses_untied_magnitudes_and_unstable_lam():
    x = make_selective(bsz=1, t=6, h=2, r=2, d=2, m=3, seed=1)
    args = (x["fq"], x["zk"], x["zv"])
    lam = x["lam"].copy()
    lam[0, 3, 1, 2] *= 0.5  # one mode of one head decays faster
    with jax.enable_x64(True):
        with pytest.raises(ValueError, match=r"lam \(per token\) must have one magnitude per \(row, token, head\)"):
            interdomain_mix(*args, lam, x["b"], impl="chunked")
        with pytest.raises(ValueError, match=r"\|lam\| <= 1"):
            interdomain_mix(*args, x["lam"] * 2.0, x["b"], impl="chunked")
        with pytest.raises(ValueError, match=r"lam must be \[H, M\] = \[2, M\] \(time invariant\) or \[B, T, H, M\]"):
            interdomain_mix(*args, x["lam"][:, :5], x["b"], impl="chunked")
        with pytest.raises(ValueError, match="interdomain_step: b must be"):
            interdomain_step(tuple(s for s in x["x0"]), x["fq"][:, 0], x["zk"][:, 0], x["zv"][:, 0],
                             x["lam"][:, 0], x["b"][:, :2], None)
        # a pure rotation (|lam| = 1) is accepted
        rot = np.exp(1j * x["theta"])
        interdomain_mix(*args, rot, x["b"], impl="chunked")


def test_pallas_with_per_token_lam_falls_back_with_one_warning():
    x = make_selective(bsz=1, t=9, h=2, r=2, d=2, m=3, seed=2)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    c64 = lambda a: np.asarray(a, np.complex64)  # noqa: E731
    args = (f32(x["fq"]), f32(x["zk"]), f32(x["zv"]), c64(x["lam"]), c64(x["b"]))
    op._PALLAS_FALLBACK_WARNED = False
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        o1 = interdomain_mix(*args, impl="pallas", chunk_size=16)
        o2 = interdomain_mix(*args, impl="pallas", chunk_size=16)
    msgs = [str(w.message) for w in rec if "per-token" in str(w.message)]
    assert len(msgs) == 1, msgs
    ref = interdomain_mix(*args, impl="chunked", chunk_size=16)
    for o in (o1, o2):
        np.testing.assert_array_equal(np.asarray(o), np.asarray(ref))
    assert op.resolve_impl("auto", 64, selective=True) == "chunked"
    from idattn.ops.pallas import interdomain_mix_pallas  # the kernel entry itself refuses, naming the dispatcher
    with pytest.raises(ValueError, match="interdomain_mix_pallas: lam/b must be \\[H, M\\].*call idattn.ops.interdomain_mix"):
        interdomain_mix_pallas(*args, chunk_size=16)


# ---------------------------------------------------------------------------------------------------------------
# The sequence split (CPU mesh of fake devices)
# ---------------------------------------------------------------------------------------------------------------

SPLIT = r"""
import json, sys
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_disable_most_optimizations", True)  # compile time dominates (conftest.fast_compile)
import jax.numpy as jnp, numpy as np
from jax.sharding import Mesh
from idattn.ops import interdomain_mix
from idattn.ops.sequence import end_state_selective, interdomain_mix_sequence

rng = np.random.default_rng(0)
B, T, H, R, D, M = 2, 64, 2, 4, 3, 5
fq, zk, zv = rng.normal(size=(B, T, H, R)), rng.normal(size=(B, T, H, R)), rng.normal(size=(B, T, H, D))
log_dt = rng.uniform(np.log(1e-2), np.log(2.0), (B, T, H))
log_neg_a, w = rng.normal(size=(H,)) * 0.3 - 0.7, rng.normal(size=(H, M)) * 3
theta = rng.uniform(-np.pi, np.pi, (B, T, H, M))
bre, bim, cre, cim = rng.normal(size=(H, M)), rng.normal(size=(H, M)), rng.normal(size=(H, M, M)), rng.normal(size=(H, M, M))
seg = np.zeros((B, T), np.int32)
seg[0, 16:] = 1; seg[0, 21:] = 2; seg[0, 40:] = 1   # resets at 16 (a shard boundary), 21, 40
seg[1, 3:] = 4; seg[1, 8:] = 5; seg[1, 32:] = 6      # inside shard 0, at 8 and at the shard boundary 32

def lam_b(log_dt, log_neg_a, w, theta, bre, bim):
    big_a = -jnp.exp(log_neg_a)[:, None] + 1j * w
    e = jnp.exp(jnp.exp(log_dt)[..., None] * big_a)
    return e * jnp.exp(1j * theta), (e - 1) / big_a * jax.lax.complex(bre, bim)

lam, b = lam_b(log_dt, log_neg_a, w, theta, bre, bim)
x = np.zeros((B, H, M, R), complex)
for t in range(T):
    reset = (t > 0) & (seg[:, t] != seg[:, t - 1])
    x = np.where(reset[:, None, None, None], 0, x)
    x = np.asarray(lam)[:, t, :, :, None] * x + np.asarray(b)[:, t, :, :, None] * zk[:, t][:, :, None, :]
out = {"end_state": float(np.max(np.abs(np.asarray(end_state_selective(zk, lam, b, seg, chunk_size=6)[0]) - x)))}
weight = lambda o: jnp.cos(jnp.arange(o.size).reshape(o.shape))
args = (fq, zk, zv, log_dt, log_neg_a, w, theta, bre, bim, cre, cim)

def loss(mix):
    def f(fq, zk, zv, log_dt, log_neg_a, w, theta, bre, bim, cre, cim):
        lam, b = lam_b(log_dt, log_neg_a, w, theta, bre, bim)
        o = mix(fq, zk, zv, lam, b, jax.lax.complex(cre, cim))
        return jnp.sum(weight(o) * o)
    return jax.value_and_grad(f, argnums=tuple(range(11)))

def rel(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) / float(np.max(np.abs(np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

ref = jax.jit(loss(lambda *a: interdomain_mix(*a, impl="chunked", chunk_size=4, segment_ids=seg)))(*args)
seq = jax.jit(loss(lambda *a: interdomain_mix(*a, impl="sequential", segment_ids=seg)))(*args)
out["one_device_vs_sequential"] = rel(ref, seq)
for shape in json.loads(sys.argv[1]):  # (sequence, data, tensor)
    mesh = Mesh(np.asarray(jax.devices()).reshape(shape), ("sequence", "data", "tensor"))
    with jax.set_mesh(mesh):
        f = jax.jit(loss(lambda *a: interdomain_mix_sequence(*a, impl="chunked", chunk_size=4, segment_ids=seg)))
        comp = f.lower(*args).compile()
        got = comp(*args)
    out[str(shape)] = {"err": rel(got, ref), "all_gathers": comp.as_text().count("all-gather")}
print("RESULT" + json.dumps(out))
"""


def _run_split(meshes):
    env = dict(T.subprocess_env(), XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-c", SPLIT, json.dumps(meshes)], cwd=T.REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])


@pytest.mark.parametrize("meshes", [
    [[4, 1, 2]],  # sequence 4 x tensor 2 (heads split too): shards of 16, resets at the boundaries 16 and 32
    pytest.param([[8, 1, 1], [2, 2, 2]], marks=pytest.mark.slow)])
def test_sequence_split_equals_one_device(meshes):
    """The selective operator with the length split over a `sequence` mesh axis (shards fold (Π lam_t, E_p)):
    value and every gradient (through Δ_t, a, ω, θ_t, B, c) equal the one-device chunked path, float64, ≤ 1e-10."""
    res = _run_split(meshes)
    print(f"\nselective sequence split: {res}")
    assert res.pop("end_state") < 1e-12
    assert res.pop("one_device_vs_sequential") < 1e-10
    for shape, r in res.items():
        assert r["err"] < 1e-10, (shape, r)
        assert r["all_gathers"] >= 1, (shape, r)  # the split path ran


# ---------------------------------------------------------------------------------------------------------------
# The layer (core = selective / selective+phase) and a tiny model
# ---------------------------------------------------------------------------------------------------------------

def _unbox(tree):
    import flax.linen as nn
    return nn.meta.unbox(tree)


def test_layer_with_constant_delta_is_the_lti_layer():
    """core='selective' with W_Δ = 0 is the LTI layer whose log Δ is log softplus(β_Δ) and whose Re A is the tied
    a_h (float32, ≤ 1e-5 relative); its parameters add W_Δ [d, H] and β_Δ [H] and tie ssm_log_a_re to [H]."""
    from idattn.layers.interdomain import InterdomainMixer
    bsz, t, d, h, dh, m = 2, 21, 32, 2, 16, 8
    x = jax.random.normal(jax.random.PRNGKey(0), (bsz, t, d))
    pos = jnp.broadcast_to(jnp.arange(t), (bsz, t))
    kw = dict(d_model=d, num_heads=h, head_dim=dh, num_modes=m, chunk_size=8, impl="chunked")
    sel, lti = InterdomainMixer(core="selective", **kw), InterdomainMixer(**kw)
    ps = _unbox(jax.jit(sel.init)(jax.random.PRNGKey(1), x, None, pos)["params"])
    pl = _unbox(jax.jit(lti.init)(jax.random.PRNGKey(1), x, None, pos)["params"])
    assert ps["w_dt"]["kernel"].shape == (d, h) and ps["ssm_dt_bias"].shape == (h,)
    assert ps["ssm_log_a_re"].shape == (h,) and "ssm_log_dt" not in ps
    ps = dict(ps, w_dt={"kernel": jnp.zeros((d, h))})
    for k in ("ssm_a_im", "ssm_b_re", "ssm_b_im", "ssm_c_re", "ssm_c_im"):
        ps[k] = pl[k]
    for k in ("wq", "wk", "wv", "wo", "conv_q", "conv_k", "ssm_norm_k", "ssm_norm_v"):
        ps[k] = pl[k]
    pl = dict(pl, ssm_log_dt=jnp.log(jax.nn.softplus(ps["ssm_dt_bias"])),
              ssm_log_a_re=jnp.broadcast_to(ps["ssm_log_a_re"][:, None], (h, m)))
    ys, _ = jax.jit(sel.apply)({"params": ps}, x, None, pos)
    yl, _ = jax.jit(lti.apply)({"params": pl}, x, None, pos)
    err = float(jnp.linalg.norm(ys - yl) / jnp.linalg.norm(yl))
    print(f"\nselective layer with W_Δ = 0 vs LTI layer: {err:.2e}")
    assert err <= 1e-5


def _selective_mixers():
    """Every cube cell × selective core, and the S4D-only control's two cores (issue 34: "every cube cell × core
    builds, trains, decodes and exports"; the LTI core is tests/test_model.py's)."""
    from idattn.models import cube_cells
    return [f"{cell}-{core}" for cell in cube_cells() for core in ("selective", "selective+phase")] + \
        ["s4d_only-selective", "s4d_only-selective+phase"]


_DEFAULT_SELECTIVE = "dualkv-query-rope-selective+phase"  # the default suite's one compiled model; the rest: -m slow


@pytest.mark.parametrize("mixer", [m if m == _DEFAULT_SELECTIVE else pytest.param(m, marks=pytest.mark.slow)
                                   for m in _selective_mixers()])
def test_tiny_selective_model_decodes_packs_and_trains(mixer):
    """The full model with a selective core: token-by-token decoding equals the forward (≤ 1e-4 of the logit
    scale), a packed document is blind to the one before it, gradients are finite (non-zero for W_Δ, β_Δ and,
    with the phase, W_θ) and four Adam steps lower the loss (tests/test_model.py's checks). Every cube cell ×
    selective core (one in the default suite, the other 17 under -m slow)."""
    from tests.test_model import _batch, _check_fn, _init, _train_fn, small_cfg
    from idattn.models import build_model
    from idattn.models.spec import mixer_core, spec_from_config

    cfg = small_cfg(mixer, impl="chunked")
    assert spec_from_config(cfg).core == mixer_core(mixer)[1]
    model = build_model(cfg)
    params = _init(model)
    packed, seg, single = _batch()
    packed_logits, full, dec = map(np.asarray, _check_fn(model)(params, packed, seg, single))
    scale = np.max(np.abs(full))
    assert np.max(np.abs(dec - full)) <= 1e-4 * scale
    b0, b1 = packed_logits[0, 4:], packed_logits[1, 4:]
    assert np.max(np.abs(b0 - b1)) <= 1e-5 * np.max(np.abs(b0))
    g0, losses = _train_fn(model, jnp.concatenate([packed, single], 0))(params)
    losses = np.asarray(losses)
    print(f"\n{mixer}: losses {np.round(losses, 4).tolist()}")
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 1e-3
    flat = {jax.tree_util.keystr(p): np.asarray(g) for p, g in jax.tree_util.tree_flatten_with_path(g0)[0]}
    assert all(np.all(np.isfinite(g)) for g in flat.values())
    names = ["w_dt", "ssm_dt_bias"] + (["w_theta"] if mixer.endswith("+phase") else [])
    for n in names:
        assert any(n in k and np.abs(g).max() > 0 for k, g in flat.items()), n


def test_mixer_names_carry_the_core():
    from idattn.models.spec import mixer_core, parse_mixer
    assert mixer_core("interdomain-selective") == ("interdomain", "selective")
    assert mixer_core("dualkv-query-norope-selective+phase") == ("dualkv-query-norope", "selective+phase")
    assert mixer_core("dualkv-query-norope") == ("dualkv-query-norope", "lti")
    assert parse_mixer("generic-query-rope-selective") == ("interdomain", "generic", "query", True)
    with pytest.raises(ValueError, match="model.mixer"):
        parse_mixer("softmax-selective")
    from idattn.configs import base_config
    from idattn.models import apply_mixer_name
    from idattn.models.spec import spec_from_config
    assert spec_from_config(apply_mixer_name(base_config().model, "s4d_only-selective")).core == "selective"
    theory = apply_mixer_name(base_config().model, "interdomain-selective")
    theory.theory = True
    with pytest.raises(ValueError, match="an S4D cell for a selective core"):
        spec_from_config(theory)


@pytest.mark.slow  # ~2-3 min on 2 cores: two tiny-model programs on 8 fake devices, three train steps each
def test_selective_model_split_over_the_sequence_equals_one_device_and_trains():
    """The tiny models with core selective+phase (chunked; Interdomain and S4D-only) through the trainer's setup:
    loss and every gradient on
    a sequence 4 x fsdp 2 mesh equal one device (tests/test_sequence_parallel.py's MODEL script and checks), and
    three train steps lower the loss identically on both."""
    from tests.test_sequence_parallel import MODEL, _check_model, _run
    res = _run(MODEL, json.dumps([["interdomain-selective+phase", "chunked"], ["s4d_only-selective+phase", "chunked"]]),
               json.dumps({"seq4xfsdp2": [1, 2, 4, 1]}), "3")
    print(f"\nselective model split: {json.dumps(res)[:600]}")
    assert len(res) == 2  # the query readout and the linear one (S4D-only selective)
    _check_model(res, steps=3)
