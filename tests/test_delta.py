"""The delta update of the Interdomain operator (`beta`: erase before write on the key state) against an independent
float64 NumPy loop.

    Xk_t = (lam_t ∘ Xk_{t-1}) (I − β_t k̂_t k̂_tᵀ) + b_t ⊗ zk_t,   k̂_t = zk_t / ‖zk_t‖,   Xv_t and the readout as today

(the operator's docstring, "Delta", idattn/ops/interdomain.py; the chunk form is derived in docs/model.md, "Delta
core"). The reference applies the erase per token literally, c literally and resets on raw id changes; it does not
call the library. Both cores: the LTI lam [H, M] (tests/test_ops.make_inputs) and the selective lam_t [B, T, H, M]
(tests/test_selective.make_selective). Forward error as tests/test_ops.py: ‖o − o_ref‖ / ‖o_ref‖ per (row, head),
worst case. Gradients: the chunked path against the sequential lax.scan (every input, β included; the selective
core through Δ_t, a_h, ω, θ_t and B, which lam_t and b_t are built from), and the sequential path against central
differences of the NumPy loop.
"""
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from idattn.ops import interdomain_mix, interdomain_step
from idattn.ops import interdomain as op
from tests import train_helpers as T
from tests.op_reference import ref_loop
from tests.test_ops import make_inputs, rel_err
from tests.test_selective import SEG, build_lam_b, make_selective

# compile time dominates on CPU: most XLA optimisations off for this module (conftest.fast_compile)
pytestmark = pytest.mark.usefixtures("fast_compile")

CORES = ("lti", "selective")


def ref_delta(fq, zk, zv, lam, b, beta, c=None, conj=True, seg=None, x0=None):
    """float64 loop: lam, b [H, M] or per token [B, T, H, M]; beta [B, T, H]. Returns o [B, T, H, D] and the
    final (Xk, Xv)."""
    return ref_loop(fq, zk, zv, lam, b, c, conj, seg, x0, beta=beta)


def make_delta(core, bsz=2, t=37, h=2, r=5, d=4, m=6, seed=0):
    """Inputs of either core plus β ~ U[0, 2) [B, T, H]."""
    x = (make_inputs if core == "lti" else make_selective)(bsz=bsz, t=t, h=h, r=r, d=d, m=m, seed=seed)
    x["beta"] = np.random.default_rng(seed + 100).uniform(0, 2, (bsz, t, h))
    return x


def _seg(t):
    """Resets: row 0 at 16 (a chunk boundary of L = 16 and of 1) and 21, with a repeated id; row 1 at 5 (a
    boundary of L = 5) and 30 (tests/test_selective.SEG, cut to t tokens)."""
    return SEG[:, :t].copy()


# ---------------------------------------------------------------------------------------------------------------
# Forward against the NumPy loop
# ---------------------------------------------------------------------------------------------------------------

# (core, impl, chunk, conj, with_c): every chunk length in {1, 5, 16, 64} on the chunked path of both cores
# (T = 37 = 2·16 + 5 is ragged for 5 and 16; 64 > T is one chunk), resets and the initial state throughout.
CASES = [(core, impl, chunk, conj, with_c) for core in CORES for impl, chunk, conj, with_c in (
    ("sequential", 64, True, True), ("chunked", 1, False, True), ("chunked", 5, True, True),
    ("chunked", 16, True, False), ("chunked", 64, False, True))]


@pytest.mark.parametrize("core,impl,chunk,conj,with_c", CASES)
def test_matches_float64_reference(core, impl, chunk, conj, with_c):
    x = make_delta(core, seed=CASES.index((core, impl, chunk, conj, with_c)))
    c = x["c"] if with_c else None
    seg = _seg(37)
    ref, (rk, rv) = ref_delta(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], x["beta"], c, conj, seg, x["x0"])
    with jax.enable_x64(True):
        o, (xk, xv) = interdomain_mix(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], c, conj=conj, impl=impl,
                                      chunk_size=chunk, segment_ids=seg, initial_state=x["x0"], return_state=True,
                                      beta=x["beta"])
    err = rel_err(o, ref)
    serr = max(float(np.abs(np.asarray(xk) - rk).max() / np.abs(rk).max()),
               float(np.abs(np.asarray(xv) - rv).max() / np.abs(rv).max()))
    print(f"\ndelta {core} {impl} L={chunk}: output {err:.2e}, state {serr:.2e}")
    assert o.dtype == np.float64
    assert err <= 1e-10 and serr <= 1e-10


@pytest.mark.slow  # ~1-2 min: a 2048-token NumPy loop per case
@pytest.mark.parametrize("core", CORES)
def test_float32_long_sequence(core):
    """float32 chunked (L = 16 and 64) at T = 2048, M = R = D = 16, two documents, against the float64 loop:
    β ~ U[0, 2), and the hard case of near-parallel keys with β ∈ [1.9, 2) (reflections that nearly cancel):
    ≤ 1e-4 (measured ≤ 1.6e-6)."""
    x = make_delta(core, bsz=1, t=2048, h=2, r=16, d=16, m=16, seed=3)
    seg = np.repeat(np.array([[1, 2]]), 1024, axis=1)
    rng = np.random.default_rng(0)
    hard_beta = 1.9 + 0.1 * rng.random(x["beta"].shape)
    hard_zk = (np.ones(16) + 0.05 * rng.normal(size=x["zk"].shape)) / 4
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    mix = {chunk: jax.jit(lambda fq, zk, zv, lam, b, c, beta, chunk=chunk: interdomain_mix(
        fq, zk, zv, lam, b, c, impl="chunked", chunk_size=chunk, segment_ids=seg, beta=beta)) for chunk in (16, 64)}
    for beta, zk in ((x["beta"], x["zk"]), (hard_beta, hard_zk)):
        ref, _ = ref_delta(x["fq"], zk, x["zv"], x["lam"], x["b"], beta, x["c"], True, seg)
        for chunk, f in mix.items():
            o = f(f32(x["fq"]), f32(zk), f32(x["zv"]), x["lam"].astype(np.complex64), x["b"].astype(np.complex64),
                  x["c"].astype(np.complex64), f32(beta))
            err = rel_err(o, ref)
            print(f"\ndelta {core} float32 T=2048 L={chunk}: {err:.2e}")
            assert o.dtype == np.float32 and err <= 1e-4


# ---------------------------------------------------------------------------------------------------------------
# Gradients: chunked against sequential (every input, β included), sequential against the NumPy loop
# ---------------------------------------------------------------------------------------------------------------

def _grad_case(core):
    x = make_delta(core, bsz=2, t=13, h=2, r=3, d=2, m=4, seed=5)
    seg = _seg(13)
    seg[0, 5:] = 7  # a reset at 5 (a boundary of L = 5) beside row 1's at 5
    w = np.random.default_rng(0).normal(size=x["zv"].shape)
    if core == "lti":
        params = (x["lam"].real, x["lam"].imag, x["b"].real, x["b"].imag)

        def lam_b(lr, li, br, bi):
            return jax.lax.complex(lr, li), jax.lax.complex(br, bi)
    else:
        params = (x["dt"], x["a"], x["w"], x["theta"], x["bc"].real, x["bc"].imag)

        def lam_b(dt, a, w_, theta, br, bi):
            return build_lam_b(dt, a, w_, theta, jax.lax.complex(br, bi), xp=jnp)
    args = (x["fq"], x["zk"], x["zv"], x["beta"], *params, x["c"].real, x["c"].imag, x["x0"][0].real,
            x["x0"][0].imag, x["x0"][1].real, x["x0"][1].imag)
    npar = len(params)

    def loss_fn(impl, chunk):
        def loss(fq, zk, zv, beta, *rest):
            lam, b = lam_b(*rest[:npar])
            c_re, c_im, k0r, k0i, v0r, v0i = rest[npar:]
            o, (xk, xv) = interdomain_mix(fq, zk, zv, lam, b, jax.lax.complex(c_re, c_im), impl=impl,
                                          chunk_size=chunk, segment_ids=seg, return_state=True, beta=beta,
                                          initial_state=(jax.lax.complex(k0r, k0i), jax.lax.complex(v0r, v0i)))
            return jnp.sum(o * w) + jnp.sum(jnp.abs(xk) ** 2) * 1e-2 + jnp.sum(jnp.real(xv)) * 1e-2
        return loss
    return args, loss_fn


@pytest.mark.parametrize("core,chunks", [
    ("lti", (5,)), ("selective", (5,)),  # ~15-30 s each on 2 loaded cores; the other lengths under -m slow
    pytest.param("lti", (1, 16, 64), marks=pytest.mark.slow),
    pytest.param("selective", (1, 16, 64), marks=pytest.mark.slow)])
def test_gradients_match_sequential(core, chunks):
    """Every gradient of the chunked path (fq, zk, zv, β, the recurrence's parameters, c, the initial state)
    equals the sequential scan's to 1e-10 relative to the largest entry (T = 13: ragged for L = 5, one chunk for
    L = 16 and 64; resets at 5, a boundary of L = 5)."""
    args, loss_fn = _grad_case(core)
    n = len(args)
    with jax.enable_x64(True):
        g_ref = jax.jit(jax.grad(loss_fn("sequential", 64), argnums=tuple(range(n))))(*args)
        for chunk in chunks:
            g = jax.jit(jax.grad(loss_fn("chunked", chunk), argnums=tuple(range(n))))(*args)
            errs = [float(np.abs(np.asarray(a) - np.asarray(r)).max()) / max(1.0, float(np.abs(r).max()))
                    for a, r in zip(g, g_ref)]
            print(f"\ndelta {core} L={chunk} gradients vs sequential: worst {max(errs):.2e} (dβ {errs[3]:.2e})")
            assert max(errs) <= 1e-10, (chunk, errs)


def test_sequential_gradients_against_finite_differences_of_the_numpy_loop():
    """The sequential scan's dβ, dzk (through k̂) and dlam against central differences of the NumPy loop (LTI,
    tiny case): the reference the chunked gradients are held to is itself right."""
    x = make_delta("lti", bsz=1, t=6, h=1, r=3, d=2, m=3, seed=7)
    seg = np.array([[0, 0, 0, 5, 5, 5]])
    w = np.random.default_rng(1).normal(size=x["zv"].shape)

    def np_loss(beta, zk, lam):
        o, _ = ref_delta(x["fq"], zk, x["zv"], lam, x["b"], beta, x["c"], True, seg, x["x0"])
        return float(np.sum(o * w))

    def loss(beta, zk, lr, li):
        o = interdomain_mix(x["fq"], zk, x["zv"], jax.lax.complex(lr, li), x["b"], x["c"], impl="sequential",
                            segment_ids=seg, initial_state=x["x0"], beta=beta)
        return jnp.sum(o * w)

    with jax.enable_x64(True):
        gb, gz, glr, gli = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(x["beta"], x["zk"], x["lam"].real,
                                                                          x["lam"].imag)
    eps = 1e-6
    rng = np.random.default_rng(3)
    base = dict(beta=x["beta"], zk=x["zk"], lam=x["lam"])
    for name, key, grad, step in (("beta", "beta", gb, eps), ("zk", "zk", gz, eps), ("lam.re", "lam", glr, eps),
                                  ("lam.im", "lam", gli, 1j * eps)):
        for _ in range(3):
            idx = tuple(rng.integers(0, s) for s in base[key].shape)
            plus, minus = dict(base), dict(base)
            plus[key], minus[key] = base[key].copy(), base[key].copy()
            plus[key][idx] += step
            minus[key][idx] -= step
            fd = (np_loss(**plus) - np_loss(**minus)) / (2 * eps)
            got = float(np.asarray(grad)[idx])
            assert abs(got - fd) <= 1e-6 * max(1.0, abs(fd)), (name, idx, got, fd)


# ---------------------------------------------------------------------------------------------------------------
# β ≡ 0 is today's operator, bit for bit
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("core,dtype,eager", [
    ("lti", "float32", False), ("selective", "float32", False), ("lti", "float64", False),
    ("selective", "float64", False), pytest.param("lti", "float64", True, marks=pytest.mark.slow),
    pytest.param("selective", "float32", True, marks=pytest.mark.slow)])
def test_zero_beta_is_todays_operator_bit_for_bit(core, dtype, eager):
    """beta = zeros passed as an array (traced under jit; `eager`: op by op) gives exactly the bits of beta=None:
    output and both states, on the sequential and chunked paths (ragged chunks, resets, initial state, c) and in
    the decode step. associative and pallas refuse any beta (test_refusals)."""
    x = make_delta(core, seed=21)
    seg = _seg(37)
    dt, ct = (np.float64, np.complex128) if dtype == "float64" else (np.float32, np.complex64)
    f = {k: x[k].astype(dt) for k in ("fq", "zk", "zv")}
    cx = {k: x[k].astype(ct) for k in ("lam", "b", "c")}
    x0 = tuple(s.astype(ct) for s in x["x0"])
    zero = np.zeros(x["fq"].shape[:3], dt)
    jit = (lambda fn: fn) if eager else jax.jit
    with jax.enable_x64(dt == np.float64):
        for impl, chunk in (("sequential", 64), ("chunked", 5), ("chunked", 16)):
            def run(beta, impl=impl, chunk=chunk):
                return interdomain_mix(f["fq"], f["zk"], f["zv"], cx["lam"], cx["b"], cx["c"], impl=impl,
                                       chunk_size=chunk, segment_ids=seg, initial_state=x0, return_state=True,
                                       beta=beta)
            today, delta = jit(lambda: run(None))(), jit(run)(zero)
            for a, b in zip(jax.tree.leaves(today), jax.tree.leaves(delta)):
                assert np.array_equal(np.asarray(a), np.asarray(b)), (impl, chunk)
        state0, state1 = x0, x0
        step = jit(interdomain_step)
        for t in range(5):
            lam_t, b_t = (cx["lam"][:, t], cx["b"][:, t]) if core == "selective" else (cx["lam"], cx["b"])
            args = (f["fq"][:, t], f["zk"][:, t], f["zv"][:, t], lam_t, b_t, cx["c"])
            o0, state0 = step(state0, *args)
            o1, state1 = step(state1, *args, beta=zero[:, t])
            for a, b in zip(jax.tree.leaves((o0, state0)), jax.tree.leaves((o1, state1))):
                assert np.array_equal(np.asarray(a), np.asarray(b)), ("decode", t)


# ---------------------------------------------------------------------------------------------------------------
# β = 1: a repeated key's last write wins (closed form)
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("core", CORES)
def test_repeated_key_with_unit_beta_reads_back_the_new_write(core):
    """A key written at tokens 2 and 9 (scaled copies of one direction k̂, other keys and β in between) and
    rewritten at the last token with β = 1: the erase removes everything the state held along k̂, so
    Xk·k̂ = b_T ‖zk_T‖ exactly (the new write alone), on every path and in the decode step; with β = 0 it does
    not (the older writes, decayed, remain)."""
    t = 23
    x = make_delta(core, bsz=2, t=t, h=2, r=4, d=3, m=5, seed=31)
    rng = np.random.default_rng(4)
    zk = x["zk"].copy()
    k = rng.normal(size=(2, 2, 4))
    for tt, s in ((2, 0.7), (9, -1.3), (t - 1, 2.1)):
        zk[:, tt] = s * k
    beta = x["beta"].copy()
    beta[:, t - 1] = 1.0
    khat = k / np.linalg.norm(k, axis=-1, keepdims=True)
    b_last = x["b"][:, t - 1] if core == "selective" else np.broadcast_to(x["b"], (2, 2, 5))
    want = b_last * (2.1 * np.linalg.norm(k, axis=-1))[..., None]  # b_T ‖zk_T‖ [B, H, M]
    beta0 = np.where(np.arange(t)[None, :, None] == t - 1, 0.0, beta)
    with jax.enable_x64(True):
        for impl, chunk, bt, close in (("sequential", 64, beta, True), ("chunked", 4, beta, True),
                                       ("chunked", 16, beta, True), ("chunked", 16, beta0, False)):
            _, (xk, _) = interdomain_mix(x["fq"], zk, x["zv"], x["lam"], x["b"], x["c"], impl=impl,
                                         chunk_size=chunk, initial_state=x["x0"], return_state=True, beta=bt)
            got = np.einsum("bhmr,bhr->bhm", np.asarray(xk), khat)
            err = float(np.abs(got - want).max() / np.abs(want).max())
            assert (err <= 1e-12) == close, (impl, chunk, close, err)
        state = x["x0"]
        step = jax.jit(interdomain_step)
        for tt in range(t):
            lam_t, b_t = (x["lam"][:, tt], x["b"][:, tt]) if core == "selective" else (x["lam"], x["b"])
            _, state = step(state, x["fq"][:, tt], zk[:, tt], x["zv"][:, tt], lam_t, b_t, x["c"], beta=beta[:, tt])
        got = np.einsum("bhmr,bhr->bhm", np.asarray(state[0]), khat)
        assert float(np.abs(got - want).max() / np.abs(want).max()) <= 1e-12


# ---------------------------------------------------------------------------------------------------------------
# Decode, refusals
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("core", CORES)
def test_decode_equals_the_chunked_prefix(core):
    """interdomain_step with this token's β_t ([B, H], and [B, 1, H]) reproduces the chunked output and state
    token by token (float64, ≤ 1e-10), from an initial state."""
    t = 11
    x = make_delta(core, bsz=2, t=t, h=2, r=3, d=4, m=5, seed=11)
    with jax.enable_x64(True):
        o_full, st_full = interdomain_mix(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], x["c"], impl="chunked",
                                          chunk_size=4, initial_state=x["x0"], return_state=True, beta=x["beta"])
        state, outs = x["x0"], []
        step = jax.jit(interdomain_step)
        for tt in range(t):
            lam_t, b_t = (x["lam"][:, tt], x["b"][:, tt]) if core == "selective" else (x["lam"], x["b"])
            beta_t = x["beta"][:, tt] if tt % 2 else x["beta"][:, tt:tt + 1]
            o_t, state = step(state, x["fq"][:, tt], x["zk"][:, tt], x["zv"][:, tt], lam_t, b_t, x["c"],
                              beta=beta_t)
            outs.append(o_t)
    err = rel_err(np.stack(outs, 1), o_full)
    print(f"\ndelta {core} decode vs chunked: {err:.2e}")
    assert err <= 1e-10
    np.testing.assert_allclose(state[0], st_full[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state[1], st_full[1], rtol=1e-10, atol=1e-12)


def test_refusals():
    """associative and pallas refuse the delta update in one line with the reason; β outside [0, 2], of the
    wrong shape or not real is refused."""
    x = make_delta("lti", bsz=1, t=6, h=1, r=3, d=2, m=3, seed=2)
    args = (x["fq"], x["zk"], x["zv"], x["lam"], x["b"])
    with pytest.raises(ValueError, match="impl='associative' has no delta form.*R×R erase product.*'chunked'"):
        interdomain_mix(*args, impl="associative", beta=x["beta"])
    with pytest.raises(ValueError, match="impl='pallas' has no delta .* use impl='chunked'"):
        interdomain_mix(*args, impl="pallas", beta=x["beta"])
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        interdomain_mix(*args, beta=x["beta"] + 2.5)
    with pytest.raises(ValueError, match="beta must be \\[B, T, H\\]"):
        interdomain_mix(*args, beta=x["beta"][..., None])
    with pytest.raises(TypeError, match="beta must be a real floating array"):
        interdomain_mix(*args, beta=np.ones((1, 6, 1), np.int32))
    assert op.resolve_impl("auto", 64, delta=True) == "chunked"
    assert op.chunked_cost_macs(64, 64, 64, 64, delta=True) - op.chunked_cost_macs(64, 64, 64, 64) == 12 * 4096


def test_zero_key_erases_nothing():
    """A zero key (padding, a masked token) reads as k̂ = 0: the output equals the loop's with nothing erased at
    that token, and the gradient is finite."""
    x = make_delta("lti", bsz=1, t=6, h=1, r=3, d=2, m=3, seed=2)
    zk = x["zk"].copy()
    zk[0, 2] = 0.0
    with jax.enable_x64(True):
        mix = jax.jit(lambda z: interdomain_mix(x["fq"], z, x["zv"], x["lam"], x["b"], impl="chunked",
                                                chunk_size=4, beta=x["beta"]))
        o = mix(zk)
        g = jax.grad(lambda z: jnp.sum(mix(z)))(zk)
    ref, _ = ref_delta(x["fq"], zk, x["zv"], x["lam"], x["b"], x["beta"])
    assert np.all(np.isfinite(np.asarray(g)))
    assert rel_err(o, ref) <= 1e-12


def test_the_cpu_solve_is_forward_substitution_not_lapack():
    """The per-chunk solve (I + N)·X = R against NumPy's float64 solve, values and both gradients; on CPU it lowers
    without LAPACK's custom call (whose batch waits inside XLA's thread pool: two at once hung a 2-core host), the
    chunked delta op and its gradient too; for GPU and TPU it lowers to XLA's triangular solve."""
    r = np.random.RandomState(5)
    n, rhs = 0.3 * r.randn(2, 3, 16, 16), r.randn(2, 3, 16, 5)
    a = np.eye(16) + np.tril(n, -1)
    with jax.enable_x64(True):
        x = np.asarray(jax.jit(op.unit_lower_solve)(n, rhs))
        gn, gr = jax.grad(lambda n_, r_: jnp.sum(jnp.sin(op.unit_lower_solve(n_, r_))), (0, 1))(n, rhs)
    ref = np.linalg.solve(a, rhs)
    # d/dR sum(sin X) = A^-T cos(X); d/dN = -(A^-T cos X) Xᵀ on the strict lower part
    gr_ref = np.linalg.solve(np.swapaxes(a, -1, -2), np.cos(ref))
    gn_ref = np.tril(-gr_ref @ np.swapaxes(ref, -1, -2), -1)
    for got, want in ((x, ref), (gr, gr_ref), (gn, gn_ref)):
        assert np.abs(np.asarray(got) - want).max() <= 1e-12 * np.abs(want).max()
    x = make_delta("lti", bsz=1, t=8, h=1, r=3, d=2, m=3, seed=1)
    mix = lambda z: jnp.sum(interdomain_mix(x["fq"], z, x["zv"], x["lam"], x["b"], impl="chunked",  # noqa: E731
                                            chunk_size=4, beta=x["beta"]))
    hlo = jax.jit(jax.value_and_grad(mix)).lower(x["zk"]).as_text()
    assert "lapack" not in hlo and "custom_call" not in hlo
    for platform in ("cuda", "tpu"):
        txt = jax.jit(op.unit_lower_solve).trace(n, rhs).lower(lowering_platforms=(platform,)).as_text()
        assert "triangular_solve" in txt, platform


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
from idattn.ops.interdomain import delta_end_state
from idattn.ops.sequence import interdomain_mix_sequence

rng = np.random.default_rng(0)
B, T, H, R, D, M = 2, 64, 2, 4, 3, 5
cplx = lambda *s: rng.normal(size=s) + 1j * rng.normal(size=s)
fq, zk, zv = rng.normal(size=(B, T, H, R)), rng.normal(size=(B, T, H, R)), rng.normal(size=(B, T, H, D))
beta = rng.uniform(0, 2, (B, T, H))
lam_lti = np.exp(-np.exp(rng.normal(size=(H, M)) - 2) + 1j * rng.normal(size=(H, M)))
b_lti = cplx(H, M) * 0.5
log_dt = rng.uniform(np.log(1e-2), np.log(2.0), (B, T, H))
log_neg_a, w, theta = rng.normal(size=(H,)) * 0.3 - 0.7, rng.normal(size=(H, M)) * 3, rng.uniform(-np.pi, np.pi, (B, T, H, M))
bre, bim, cre, cim = rng.normal(size=(H, M)), rng.normal(size=(H, M)), rng.normal(size=(H, M, M)) * 0.3, rng.normal(size=(H, M, M)) * 0.3
xk0, xv0 = cplx(B, H, M, R) * 0.3, cplx(B, H, M, D) * 0.3
seg = np.zeros((B, T), np.int32)
seg[0, 16:] = 1; seg[0, 21:] = 2; seg[0, 40:] = 1   # resets at 16 (a shard boundary), 21, 40
seg[1, 3:] = 4; seg[1, 8:] = 5; seg[1, 32:] = 6      # inside shard 0, at 8 and at the shard boundary 32

def sel_lam_b(log_dt, log_neg_a, w, theta, bre, bim):
    big_a = -jnp.exp(log_neg_a)[:, None] + 1j * w
    e = jnp.exp(jnp.exp(log_dt)[..., None] * big_a)
    return e * jnp.exp(1j * theta), (e - 1) / big_a * jax.lax.complex(bre, bim)

# The shard summary against a NumPy loop (the selective core, one shard of 20 tokens holding a reset at 3):
# E from zero over the last document, Π lam_t, and P = Π (I − β k̂k̂ᵀ) over the last document.
lam_s, b_s = (np.asarray(a) for a in sel_lam_b(log_dt, log_neg_a, w, theta, bre, bim))
out = {}
for name, lam, b in (("lti", lam_lti, b_lti), ("selective", lam_s, b_s)):
    n = 20
    sg = seg[:, :n].copy(); sg[:, 3:] += 1
    e, trans, pm = delta_end_state(zk[:, :n], zv[:, :n], lam if lam.ndim == 2 else lam[:, :n],
                                   b if b.ndim == 2 else b[:, :n], beta[:, :n], sg, chunk_size=6)
    ek = np.zeros((B, H, M, R), complex); ev = np.zeros((B, H, M, D), complex)
    p = np.broadcast_to(np.eye(R), (B, H, R, R)).copy(); a = np.ones((B, H, M), complex)
    for t in range(n):
        reset = (t > 0) & (sg[:, t] != sg[:, t - 1])
        ek[reset], ev[reset], p[reset] = 0, 0, np.eye(R)
        lt = lam[None] if lam.ndim == 2 else lam[:, t]
        bt = b[None] if b.ndim == 2 else b[:, t]
        kh = zk[:, t] / np.linalg.norm(zk[:, t], axis=-1, keepdims=True)
        er = np.eye(R) - beta[:, t, :, None, None] * kh[..., :, None] * kh[..., None, :]
        ek = (lt[..., None] * ek) @ er + bt[..., None] * zk[:, t][:, :, None, :]
        ev = lt[..., None] * ev + bt[..., None] * zv[:, t][:, :, None, :]
        p, a = p @ er, a * lt
    out["summary_" + name] = max(float(np.abs(np.asarray(e) - np.concatenate([ek, ev], -1)).max()),
                                 float(np.abs(np.asarray(pm) - p).max()),
                                 0.0 if trans is None else float(np.abs(np.asarray(trans) - a).max()))

weight = lambda o: jnp.cos(jnp.arange(o.size).reshape(o.shape))

def loss(mix, core):
    def f(fq, zk, zv, beta, lp, cre, cim, k0r, k0i, v0r, v0i):
        lam, b = sel_lam_b(*lp) if core == "selective" else (jax.lax.complex(lp[0], lp[1]), jax.lax.complex(lp[2], lp[3]))
        o, st = mix(fq, zk, zv, lam, b, jax.lax.complex(cre, cim), beta=beta, segment_ids=seg, return_state=True,
                    initial_state=(jax.lax.complex(k0r, k0i), jax.lax.complex(v0r, v0i)))
        return jnp.sum(weight(o) * o) + sum(jnp.sum(weight(jnp.real(x)) * jnp.real(x) + weight(jnp.imag(x)) * jnp.imag(x))
                                            for x in jax.tree.leaves(st))
    return jax.value_and_grad(f, argnums=tuple(range(11)))

def rel(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) / (1 + float(np.max(np.abs(np.asarray(y)))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

params = {"lti": (lam_lti.real, lam_lti.imag, b_lti.real, b_lti.imag),
          "selective": (log_dt, log_neg_a, w, theta, bre, bim)}
for core in json.loads(sys.argv[2]):
    args = (fq, zk, zv, beta, params[core], cre, cim, xk0.real, xk0.imag, xv0.real, xv0.imag)
    ref = jax.jit(loss(lambda *a, **k: interdomain_mix(*a, impl="sequential", **k), core))(*args)
    for shape in json.loads(sys.argv[1]):  # (sequence, data, tensor)
        mesh = Mesh(np.asarray(jax.devices()).reshape(shape), ("sequence", "data", "tensor"))
        with jax.set_mesh(mesh):
            f = jax.jit(loss(lambda *a, **k: interdomain_mix_sequence(*a, impl="chunked", chunk_size=6, **k), core))
            comp = f.lower(*args).compile()
            got = comp(*args)
        out[core + str(shape)] = {"err": rel(got, ref), "all_gathers": comp.as_text().count("all-gather")}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow  # the default suite's sequence splits: tests/test_sequence_parallel.py, tests/test_selective.py
@pytest.mark.parametrize("meshes,cores", [
    # sequence 4 x tensor 2 (heads split too): shards of 16, resets at the boundaries 16 and 32
    ([[4, 1, 2], [8, 1, 1], [2, 2, 2]], ["lti"]),
    ([[4, 1, 2], [8, 1, 1], [2, 2, 2]], ["selective"])])
def test_sequence_split_equals_one_device(meshes, cores):
    """Both cores with β, the length split over a `sequence` mesh axis (each shard's summary (E, Π lam_t, P), P the
    R×R erase product, folded exactly): value, both end states and every gradient (β, the recurrence's parameters,
    c, the initial state included) equal the one-device sequential path, float64, ≤ 1e-10, with documents that
    cross shard boundaries and resets at them (chunk 6: ragged within each shard of 16); the shard summary
    (`delta_end_state`) against a NumPy loop to 1e-12."""
    env = dict(T.subprocess_env(), XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-c", SPLIT, json.dumps(meshes), json.dumps(cores)], cwd=T.REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    print(f"\ndelta sequence split: {res}")
    for core in CORES:
        assert res.pop("summary_" + core) < 1e-12, core
    for key, r in res.items():
        assert r["err"] < 1e-10, (key, r)
        assert r["all_gathers"] >= 1, (key, r)  # the split path ran


# ---------------------------------------------------------------------------------------------------------------
# The model option: the -delta / -delta2 mixer suffix (docs/model.md, "Delta core")
# ---------------------------------------------------------------------------------------------------------------

def test_mixer_names_carry_the_delta():
    """`-delta` (s = 1) and `-delta2` (s = 2) after any core suffix of a query-readout cell; refused for the
    linear readout, the theory mode and attention, and when a config's model.delta_scale disagrees with the name;
    a hybrid pattern carries it per entry."""
    from idattn.configs import base_config
    from idattn.models import apply_mixer_name
    from idattn.models.spec import layer_specs, mixer_core, mixer_delta, model_label, parse_mixer, spec_from_config
    assert mixer_delta("interdomain-delta") == ("interdomain", 1.0)
    assert mixer_delta("interdomain-selective-delta2") == ("interdomain-selective", 2.0)
    assert mixer_delta("interdomain-selective") == ("interdomain-selective", 0.0)
    assert mixer_core("dualkv-query-norope-selective+phase-delta2") == ("dualkv-query-norope", "selective+phase")
    assert parse_mixer("generic-query-rope-delta") == ("interdomain", "generic", "query", True)
    spec = spec_from_config(apply_mixer_name(base_config().model, "interdomain-selective-delta2"))
    assert (spec.core, spec.delta_scale) == ("selective", 2.0)
    assert spec_from_config(apply_mixer_name(base_config().model, "interdomain")).delta_scale == 0.0
    for bad, match in (("softmax-delta", "delta suffix applies to query-readout"),
                       ("s4d_only-delta", "a query-readout S4D cell for the delta update")):
        with pytest.raises(ValueError, match=match):
            spec_from_config(apply_mixer_name(base_config().model, bad))
    theory = apply_mixer_name(base_config().model, "interdomain-delta")
    theory.theory = True
    with pytest.raises(ValueError, match="a query-readout S4D cell for the delta update"):
        spec_from_config(theory)
    cfg = apply_mixer_name(base_config().model, "interdomain-delta")
    with pytest.raises(ValueError, match="model.delta_scale"):
        spec_from_config(dict(cfg.to_dict(), delta_scale=2.0))
    assert spec_from_config(dict(cfg.to_dict(), delta_scale=1.0)).delta_scale == 1.0  # a saved spec's value
    hyb = base_config().model
    hyb.update(num_layers=4, layer_pattern="interdomain-delta2,interdomain,interdomain-selective-delta,softmax")
    got = [(ls.mixer, ls.core, ls.delta_scale) for ls in layer_specs(spec_from_config(hyb))]
    assert got == [("interdomain-delta2", "lti", 2.0), ("interdomain", "lti", 0.0),
                   ("interdomain-selective-delta", "selective", 1.0), ("softmax", "lti", 0.0)]
    assert model_label(hyb) == "hybrid[interdomain-delta2,interdomain,interdomain-selective-delta,softmax]"


def test_delta_counts_match_the_module():
    """The closed-form count equals the module's eval_shape count (125M: the homogeneous model and a hybrid), and
    the delta update adds exactly W_β (d·H) per layer that has it, written here from docs/model.md; the FLOP count
    adds 3LR + 5LM + 4MR per token-head."""
    from idattn import models
    from idattn.configs import scaling
    from idattn.models.counting import mixer_macs_per_token_head
    lti, cfg = scaling.get_config("interdomain,125m").model, scaling.get_config("interdomain-delta2,125m").model
    for c in (lti, cfg):
        c.impl = "chunked"
    n = models.count_params(cfg)
    assert n == models.count_params_closed(cfg)
    d, L, H = cfg.d_model, cfg.num_layers, cfg.num_heads
    assert n - models.count_params(lti) == L * d * H
    hyb = scaling.get_config("interdomain,125m").model
    hyb.update(impl="chunked", layer_pattern="interdomain-selective-delta,interdomain,interdomain,softmax")
    plain = scaling.get_config("interdomain,125m").model
    plain.update(impl="chunked", layer_pattern="interdomain-selective,interdomain,interdomain,softmax")
    assert models.count_params(hyb) == models.count_params_closed(hyb)
    assert models.count_params(hyb) - models.count_params(plain) == (L // 4) * d * H
    r = m = lch = 64
    assert mixer_macs_per_token_head(cfg, 4096) - mixer_macs_per_token_head(lti, 4096) == \
        3 * lch * r + 5 * lch * m + 4 * m * r


def test_delta_export_roundtrip(tmp_path):
    """idattn's own export writes W_β like every layer tensor and the config keeps the mixer and s (the Hugging
    Face port's logits and decoding: tests/test_export_hf.py, interdomain-delta and -selective-delta2)."""
    from idattn.models import export as ex
    from idattn.models.spec import spec_from_config
    from tests.test_export import _cfg, _random_params
    cfg = _cfg("interdomain-selective-delta2")
    params = _random_params(cfg, seed=3)
    assert any("w_beta" in jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0])
    ex.export(params, cfg, str(tmp_path / "own"))
    cfg_back, back = ex.import_export(str(tmp_path / "own"))
    spec = spec_from_config(cfg_back)
    assert (spec.mixer, spec.core, spec.delta_scale) == ("interdomain-selective-delta2", "selective", 2.0)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), params, back)


@pytest.mark.parametrize("mixer", ["interdomain-delta2", pytest.param("interdomain-selective-delta", marks=pytest.mark.slow),
                                   pytest.param("dualkv-query-norope-selective+phase-delta2", marks=pytest.mark.slow)])
def test_tiny_delta_model_decodes_packs_and_trains(mixer):
    """The full model with the delta update (chunked, L = 8 over T = 10): token-by-token decoding and a prefill
    chunk then steps equal the forward (≤ 1e-4 of the logit scale), a packed document is blind to the one before
    it, gradients are finite (non-zero for W_β) and four Adam steps lower the loss (tests/test_model.py's
    checks). One in the default suite, the selective cores under -m slow."""
    from idattn.models import build_model, decoding
    from idattn.models.spec import spec_from_config
    from tests.test_model import T as TT, _batch, _check_fn, _init, _train_fn, small_cfg

    cfg = small_cfg(mixer, impl="chunked")
    assert spec_from_config(cfg).delta_scale == (2.0 if mixer.endswith("delta2") else 1.0)
    model = build_model(cfg)
    params = _init(model)
    packed, seg, single = _batch()
    packed_logits, full, dec = map(np.asarray, _check_fn(model)(params, packed, seg, single))
    scale = np.max(np.abs(full))
    assert np.max(np.abs(dec - full)) <= 1e-4 * scale
    b0, b1 = packed_logits[0, 4:], packed_logits[1, 4:]
    assert np.max(np.abs(b0 - b1)) <= 1e-5 * np.max(np.abs(b0))

    @jax.jit
    def prefill_then_steps(params, tokens):  # a 6-token prefill chunk from the empty cache, then one token a step
        cache = decoding.init_cache(model, 1, TT)
        first, cache = model.apply({"params": params}, tokens[:, :6], cache=cache)

        def step(cache, tok):
            logits, cache = model.apply({"params": params}, tok[:, None], cache=cache)
            return cache, logits[0, -1]
        _, rest = jax.lax.scan(step, cache, tokens[:, 6:].T)
        return jnp.concatenate([first[0], rest], 0)
    pre = np.asarray(prefill_then_steps(params, single))
    assert np.max(np.abs(pre - full)) <= 1e-4 * scale
    g0, losses = _train_fn(model, jnp.concatenate([packed, single], 0))(params)
    losses = np.asarray(losses)
    print(f"\n{mixer}: losses {np.round(losses, 4).tolist()}")
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 1e-3
    flat = {jax.tree_util.keystr(p): np.asarray(g) for p, g in jax.tree_util.tree_flatten_with_path(g0)[0]}
    assert all(np.all(np.isfinite(g)) for g in flat.values())
    assert any("w_beta" in k and np.abs(g).max() > 0 for k, g in flat.items())


@pytest.mark.slow  # ~2-3 min on 2 cores: a tiny-model program on 8 fake devices, three train steps
def test_delta_model_split_over_the_sequence_equals_one_device_and_trains():
    """The tiny delta model (chunked) through the trainer's setup: loss and every gradient on a sequence 4 x fsdp 2
    mesh equal one device (tests/test_sequence_parallel.py's MODEL script and checks), and three train steps lower
    the loss identically on both."""
    from tests.test_sequence_parallel import MODEL, _check_model, _run
    res = _run(MODEL, json.dumps([["interdomain-selective-delta2", "chunked"]]),
               json.dumps({"seq4xfsdp2": [1, 2, 4, 1]}), "3")
    print(f"\ndelta model split: {json.dumps(res)[:600]}")
    assert len(res) == 1
    _check_model(res, steps=3)


def test_an_ahead_of_time_compile_says_the_delta_layers_run_chunked():
    """`python -m idattn.aot` resolves impl=auto to the kernels on an accelerator; a delta (or selective) model's
    layers have none and run the chunked form, and the compile's notes say so instead of leaving it silent."""
    import ml_collections as mc

    from idattn.aot.compile import resolve_auto

    def notes(mixer, platform="tpu"):
        return resolve_auto(mc.ConfigDict({"model": {"impl": "auto", "chunk_size": 64, "mixer": mixer}}), platform)

    assert notes("interdomain") == ["model.impl=auto -> pallas (as on tpu)"]
    assert notes("interdomain-delta2", "gpu") == [
        "model.impl=auto -> pallas (as on gpu); the delta update has no kernel: those layers run impl=chunked"]
    assert "the delta update and the selective core have no kernel" in notes("interdomain-selective-delta")[0]
