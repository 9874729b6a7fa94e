"""The Interdomain operator against an independent float64 NumPy loop (the operator's docstring, idattn/ops/interdomain.py).

The reference below applies c literally (U = c·Xk, Γ = c·Xv) and resets on raw id changes; it does not call the
library. Error metric: ‖o − o_ref‖ / ‖o_ref‖ per (batch row, head), worst case.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from idattn.ops import interdomain_mix, interdomain_step, s4d
from idattn.ops import interdomain as op
from tests.op_reference import ref_loop

IMPLS = ("sequential", "associative", "chunked")


def ref_mix(fq, zk, zv, lam, b, c=None, conj=True, seg=None, x0=None):
    """float64 sequential loop (time-invariant lam, b [H, M]): o [B,T,H,D] and final (Xk, Xv)."""
    return ref_loop(fq, zk, zv, lam, b, c, conj, seg, x0)


def rel_err(o, ref):
    """Worst relative error over (batch row, head)."""
    o, ref = np.asarray(o, np.float64), np.asarray(ref, np.float64)
    num = np.sqrt(((o - ref) ** 2).sum(axis=(1, 3)))
    den = np.sqrt((ref ** 2).sum(axis=(1, 3)))
    return float((num / den).max())


def make_inputs(bsz=2, t=37, h=2, r=5, d=4, m=6, init="inv", seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    fq = rng.normal(size=(bsz, t, h, r)).astype(dtype)
    zk = (rng.normal(size=(bsz, t, h, r)) / math.sqrt(r)).astype(dtype)
    zv = rng.normal(size=(bsz, t, h, d)).astype(dtype)
    log_a_re, a_im = s4d.init_s4d_a(m, init)
    log_dt = np.log(rng.uniform(1e-3, 1e-1, (h,)))
    # Wider Δ than the init so that both fast and slow modes appear; the bound keeps |lam| ≥ exp(-κ).
    log_dt = np.log(np.exp(log_dt) * 4)
    b_re, b_im = rng.normal(size=(h, m)), rng.normal(size=(h, m))
    with jax.enable_x64(True):
        lam, b = s4d.discretize(np.tile(log_a_re, (h, 1)).astype(np.float64), np.tile(a_im, (h, 1)).astype(np.float64),
                                log_dt, b_re, b_im)
        lam, b = np.asarray(lam), np.asarray(b)
    c = (rng.normal(size=(h, m, m)) + 1j * rng.normal(size=(h, m, m))) / math.sqrt(m)
    x0 = (rng.normal(size=(bsz, h, m, r)) + 1j * rng.normal(size=(bsz, h, m, r)),
          rng.normal(size=(bsz, h, m, d)) + 1j * rng.normal(size=(bsz, h, m, d)))
    return dict(fq=fq, zk=zk, zv=zv, lam=lam, b=b, c=c, x0=x0)


SEG = np.array([[1] * 9 + [2] * 6 + [1] * 22, [3] * 30 + [4] * 7])  # [1, 2, 1]: repeated ids, three documents


# Pairwise coverage of (impl, conj, c, init, chunk) with segment resets, initial_state and return_state throughout.
CASES = [
    ("sequential", True, True, "inv", 8),
    ("sequential", False, False, "lin", 8),
    ("associative", True, False, "lin", 8),
    ("associative", False, True, "inv", 8),
    ("chunked", True, True, "inv", 8),  # 37 = 4·8 + 5: tail chunk
    ("chunked", False, True, "lin", 16),
    ("chunked", True, False, "lin", 37),  # one chunk, exact
    ("chunked", False, False, "inv", 64),  # chunk longer than T
    ("chunked", True, True, "legs", 1),  # chunk of one token
]


@pytest.mark.parametrize("impl,conj,with_c,init,chunk", CASES)
def test_matches_float64_reference(impl, conj, with_c, init, chunk):
    x = make_inputs(init=init, seed=CASES.index((impl, conj, with_c, init, chunk)))
    c = x["c"] if with_c else None
    ref, (rk, rv) = ref_mix(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], c, conj, SEG, x["x0"])
    with jax.enable_x64(True):
        o, (xk, xv) = interdomain_mix(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], c, conj=conj, impl=impl,
                                      chunk_size=chunk, segment_ids=SEG, initial_state=x["x0"], return_state=True)
    assert o.dtype == np.float64
    assert rel_err(o, ref) <= 1e-10
    np.testing.assert_allclose(np.asarray(xk), rk, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.asarray(xv), rv, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_float32_long_sequence(impl):
    """float32 at M = 64, T = 4096 against the float64 loop: ≤ 1e-4."""
    x = make_inputs(bsz=1, t=4096, h=2, r=8, d=8, m=64, seed=3)
    seg = np.repeat(np.array([[1, 2, 1, 3]]), 1024, axis=1)
    ref, _ = ref_mix(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], x["c"], True, seg)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    mix = jax.jit(lambda *a: interdomain_mix(*a, impl=impl, segment_ids=seg))
    o = mix(f32(x["fq"]), f32(x["zk"]), f32(x["zv"]), x["lam"].astype(np.complex64), x["b"].astype(np.complex64),
            x["c"].astype(np.complex64))
    assert o.dtype == np.float32
    err = rel_err(o, ref)
    print(f"\nfloat32 T=4096 M=64 {impl}: worst relative error {err:.3e}")
    assert err <= 1e-4


def _loss_fn(impl, conj, chunk, seg, w):
    def loss(fq, zk, zv, lam_re, lam_im, b_re, b_im, c_re, c_im, k0_re, k0_im, v0_re, v0_im):
        o, (xk, xv) = interdomain_mix(fq, zk, zv, jax.lax.complex(lam_re, lam_im), jax.lax.complex(b_re, b_im),
                                      jax.lax.complex(c_re, c_im), conj=conj, impl=impl, chunk_size=chunk,
                                      segment_ids=seg, return_state=True,
                                      initial_state=(jax.lax.complex(k0_re, k0_im), jax.lax.complex(v0_re, v0_im)))
        return jnp.sum(o * w) + jnp.sum(jnp.abs(xk) ** 2) * 1e-2 + jnp.sum(jnp.real(xv)) * 1e-2
    return loss


def _grad_args(x):
    return (x["fq"], x["zk"], x["zv"], x["lam"].real, x["lam"].imag, x["b"].real, x["b"].imag, x["c"].real,
            x["c"].imag, x["x0"][0].real, x["x0"][0].imag, x["x0"][1].real, x["x0"][1].imag)


@pytest.mark.parametrize("impl,conj,chunk", [("associative", True, 4), ("chunked", False, 5), ("chunked", True, 4)])
def test_gradients_match_sequential(impl, conj, chunk):
    """Gradients w.r.t. every input, lam, b, c and the initial state agree with the sequential path (≤ 1e-8)."""
    x = make_inputs(bsz=2, t=13, h=2, r=3, d=2, m=4, seed=5)
    seg = SEG[:, :13].copy()
    seg[1, 6:] = 9
    w = np.random.default_rng(0).normal(size=x["zv"].shape)
    args = _grad_args(x)
    with jax.enable_x64(True):
        g_ref = jax.jit(jax.grad(_loss_fn("sequential", conj, chunk, seg, w), argnums=tuple(range(13))))(*args)
        g = jax.jit(jax.grad(_loss_fn(impl, conj, chunk, seg, w), argnums=tuple(range(13))))(*args)
    for i, (a, r) in enumerate(zip(g, g_ref)):
        scale = max(1.0, float(np.abs(r).max()))
        assert float(np.abs(np.asarray(a) - np.asarray(r)).max()) <= 1e-8 * scale, f"argument {i}"


def test_gradients_finite_differences():
    """Sequential and chunked gradients against central finite differences on a tiny case (x64)."""
    x = make_inputs(bsz=1, t=6, h=1, r=2, d=2, m=3, seed=7)
    seg = np.array([[0, 0, 0, 5, 5, 5]])
    w = np.random.default_rng(1).normal(size=x["zv"].shape)
    args = _grad_args(x)
    eps = 1e-6
    with jax.enable_x64(True):
        for impl in ("sequential", "chunked"):
            f = jax.jit(_loss_fn(impl, True, 4, seg, w))
            grads = jax.jit(jax.grad(_loss_fn(impl, True, 4, seg, w), argnums=tuple(range(13))))(*args)
            rng = np.random.default_rng(2)
            for i, a in enumerate(args):
                a = np.asarray(a, np.float64)
                for _ in range(2):
                    idx = tuple(rng.integers(0, s) for s in a.shape)
                    ap, am = a.copy(), a.copy()
                    ap[idx] += eps
                    am[idx] -= eps
                    fp = f(*args[:i], ap, *args[i + 1:])
                    fm = f(*args[:i], am, *args[i + 1:])
                    fd = (float(fp) - float(fm)) / (2 * eps)
                    assert abs(float(np.asarray(grads[i])[idx]) - fd) <= 1e-5 * max(1.0, abs(fd)), (impl, i, idx)


def test_step_reproduces_mix():
    x = make_inputs(bsz=2, t=11, h=2, r=3, d=4, m=5, seed=11)
    with jax.enable_x64(True):
        o_full, st_full = interdomain_mix(x["fq"], x["zk"], x["zv"], x["lam"], x["b"], x["c"], impl="chunked",
                                          chunk_size=4, initial_state=x["x0"], return_state=True)
        state = x["x0"]
        outs = []
        step = jax.jit(interdomain_step)
        for t in range(11):
            o_t, state = step(state, x["fq"][:, t], x["zk"][:, t], x["zv"][:, t], x["lam"], x["b"], x["c"])
            outs.append(o_t)
    np.testing.assert_allclose(np.stack(outs, 1), o_full, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state[0], st_full[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state[1], st_full[1], rtol=1e-10, atol=1e-12)


def _lam_with_modulus(h, m, modulus, seed=0):
    rng = np.random.default_rng(seed)
    phase = rng.uniform(-np.pi, np.pi, (h, m))
    return (modulus * np.exp(1j * phase)).astype(np.complex64)


@pytest.mark.parametrize("modulus", [math.exp(-s4d.DEFAULT_KAPPA), 1 - 1e-6])
def test_long_sequence_finite_at_extremes(modulus):
    """T = 65,536 stays finite at the decay bound and with |lam| = 1 − 1e-6, and matches the sequential scan."""
    rng = np.random.default_rng(0)
    t, h, r, d, m = 65536, 1, 4, 4, 8
    fq = rng.normal(size=(1, t, h, r)).astype(np.float32)
    zk = rng.normal(size=(1, t, h, r)).astype(np.float32) / 2
    zv = rng.normal(size=(1, t, h, d)).astype(np.float32)
    lam = _lam_with_modulus(h, m, modulus)
    b = ((1 - np.abs(lam)) + 0.01).astype(np.complex64)
    o = np.asarray(jax.jit(lambda *a: interdomain_mix(*a, impl="chunked", chunk_size=64))(fq, zk, zv, lam, b))
    assert np.isfinite(o).all()
    o_seq = np.asarray(jax.jit(lambda *a: interdomain_mix(*a, impl="sequential"))(fq, zk, zv, lam, b))
    assert rel_err(o, o_seq) <= 1e-3


def test_decay_bound_is_applied_in_discretisation():
    log_a_re, a_im = s4d.init_s4d_a(8, "inv")
    lam, _ = s4d.discretize(np.tile(log_a_re, (2, 1)), np.tile(a_im, (2, 1)), np.log(np.array([1e-3, 50.0])),
                            np.ones((2, 8)), np.zeros((2, 8)), kappa=0.25)
    mag = np.abs(np.asarray(lam))
    assert mag.min() >= math.exp(-0.25) * (1 - 1e-6)
    assert mag.max() < 1
    # Δ = 1e-3 is far from the bound: lam = exp(Δ·A) exactly.
    a = -np.exp(log_a_re) + 1j * a_im
    np.testing.assert_allclose(np.asarray(lam)[0], np.exp(1e-3 * a), rtol=1e-5)


def test_zoh_gain_closed_form():
    log_a_re, a_im = s4d.init_s4d_a(4, "lin")
    a = -np.exp(log_a_re.astype(np.float64)) + 1j * a_im
    bc = np.array([1 + 2j, -0.5j, 0.3, 2 - 1j])
    with jax.enable_x64(True):
        lam, b = s4d.discretize(log_a_re.astype(np.float64)[None], a_im.astype(np.float64)[None], np.log([0.05]),
                                bc.real[None], bc.imag[None])
    np.testing.assert_allclose(np.asarray(lam)[0], np.exp(0.05 * a), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(b)[0], (np.exp(0.05 * a) - 1) / a * bc, rtol=1e-12)


def test_s4d_inits_closed_forms():
    m = 6
    _, im = s4d.init_s4d_a(m, "inv")
    n = np.arange(m)
    np.testing.assert_allclose(im, (2 * m / np.pi) * (2 * m / (2 * n + 1) - 1), rtol=1e-6)
    assert (im > 0).all()
    _, im_p = s4d.init_s4d_a(m, "inv_paper")
    assert (im_p < 0).sum() == m // 2  # the paper's literal formula: half the frequencies negative
    _, im_l = s4d.init_s4d_a(m, "lin")
    np.testing.assert_allclose(im_l, np.pi * n, rtol=1e-6)
    # LegS: the eigenvalues of the full normal part -1/2 I + S are -1/2 ± i·(our frequencies).
    log_re, im_s = s4d.init_s4d_a(m, "legs")
    nn = 2 * m
    q = np.arange(nn)
    a = np.zeros((nn, nn))
    for i in range(nn):
        for k in range(nn):
            a[i, k] = -np.sqrt((2 * i + 1) * (2 * k + 1)) if i > k else (-(i + 1) if i == k else 0.0)
    normal = a + np.outer(np.sqrt(q + 0.5), np.sqrt(q + 0.5))
    ev = np.linalg.eigvals(normal)
    np.testing.assert_allclose(ev.real, -0.5, atol=1e-8)
    np.testing.assert_allclose(np.sort(ev.imag[ev.imag > 0]), np.sort(im_s), rtol=1e-5)
    np.testing.assert_allclose(np.exp(log_re), 0.5)


def test_refuses_lam_outside_bound():
    x = make_inputs(bsz=1, t=8, h=1, r=2, d=2, m=3, dtype=np.float32)
    args = (x["fq"], x["zk"], x["zv"])
    with pytest.raises(ValueError, match=r"\|lam\| < 1"):
        interdomain_mix(*args, _lam_with_modulus(1, 3, 1.0001), x["b"][:1].astype(np.complex64))
    with pytest.raises(ValueError, match=r"chunk_size=64.*smaller chunk_size"):
        interdomain_mix(*args, _lam_with_modulus(1, 3, 0.05), x["b"][:1].astype(np.complex64), impl="chunked")
    # The same lam is fine for the sequential path and with a short chunk.
    interdomain_mix(*args, _lam_with_modulus(1, 3, 0.05), x["b"][:1].astype(np.complex64), impl="sequential")
    interdomain_mix(*args, _lam_with_modulus(1, 3, 0.05), x["b"][:1].astype(np.complex64), chunk_size=8)
    assert s4d.max_chunk_size(0.25) == 178
    assert s4d.min_abs_lam(s4d.max_chunk_size(0.25)) <= math.exp(-0.25)


def test_bad_inputs_name_argument_and_shape():
    x = make_inputs(bsz=1, t=8, h=2, r=2, d=3, m=3, dtype=np.float32)
    lam, b = x["lam"].astype(np.complex64), x["b"].astype(np.complex64)
    with pytest.raises(ValueError, match=r"zv must be \[B, T, H, D\] = \[1, 8, 2, D\]"):
        interdomain_mix(x["fq"], x["zk"], x["zv"][:, :5], lam, b)
    with pytest.raises(ValueError, match=r"fq must be \[B, T, H, R\]"):
        interdomain_mix(x["fq"][0], x["zk"], x["zv"], lam, b)
    with pytest.raises(TypeError, match="lam must be complex"):
        interdomain_mix(x["fq"], x["zk"], x["zv"], np.abs(lam), b)
    with pytest.raises(ValueError, match=r"c must be complex \[H, M, M\] = \[2, 3, 3\]"):
        interdomain_mix(x["fq"], x["zk"], x["zv"], lam, b, x["c"][:, :2])
    with pytest.raises(ValueError, match=r"segment_ids must be \[B, T\] = \[1, 8\]"):
        interdomain_mix(x["fq"], x["zk"], x["zv"], lam, b, segment_ids=np.zeros((1, 7), np.int32))
    with pytest.raises(TypeError, match="segment_ids must be an integer"):
        interdomain_mix(x["fq"], x["zk"], x["zv"], lam, b, segment_ids=np.zeros((1, 8), np.float32))
    with pytest.raises(ValueError, match=r"initial_state must be \(Xk \[1, 2, 3, 2\], Xv \[1, 2, 3, 3\]\)"):
        interdomain_mix(x["fq"], x["zk"], x["zv"], lam, b, initial_state=(x["x0"][0], x["x0"][0]))
    with pytest.raises(ValueError, match="impl must be one of"):
        interdomain_mix(x["fq"], x["zk"], x["zv"], lam, b, impl="fast")


def test_associative_refuses_past_memory_bound():
    x = make_inputs(bsz=1, t=64, h=1, r=4, d=4, m=4, dtype=np.float32)
    prev = op.set_associative_max_bytes(1000)
    try:
        with pytest.raises(ValueError, match=r"about .* GiB, over the bound") as e:
            interdomain_mix(x["fq"], x["zk"], x["zv"], x["lam"][:1].astype(np.complex64),
                            x["b"][:1].astype(np.complex64), impl="associative")
        assert "impl='chunked'" in str(e.value)
    finally:
        op.set_associative_max_bytes(prev)


def test_chunked_memory_far_below_associative():
    """Compiled temporary memory at T = 16,384: chunked at least 10x below associative."""
    t, h, r, d, m = 16384, 2, 16, 16, 16
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    cspec = lambda *s: jax.ShapeDtypeStruct(s, jnp.complex64)  # noqa: E731
    args = (spec(1, t, h, r), spec(1, t, h, r), spec(1, t, h, d), cspec(h, m), cspec(h, m))
    temp = {}
    for impl in ("chunked", "associative"):
        f = jax.jit(lambda *a, impl=impl: interdomain_mix(*a, impl=impl))
        temp[impl] = f.lower(*args).compile().memory_analysis().temp_size_in_bytes
    print(f"\ntemp bytes at T=16384: {temp}")
    assert temp["chunked"] * 10 <= temp["associative"]


def test_theory_mode_converges_to_linear_attention():
    from idattn.ops.theory import convergence_table
    with jax.enable_x64(True):
        rows = dict(convergence_table((2, 4, 8, 16, 32)))
    print("\nLegS convergence (N, rel. error):", rows)
    assert rows[2] >= 5 * rows[16]


def test_theory_mode_segments_restart():
    """A reset restarts LegS: document B's outputs equal those of B run alone."""
    from idattn.ops.theory import legs_interdomain, smooth_signals
    fq, fk, v = smooth_signals(60, seed=1)
    seg = np.array([[0] * 25 + [1] * 35])
    with jax.enable_x64(True):
        o = np.asarray(legs_interdomain(fq, fk, v, 8, segment_ids=seg))
        o_b = np.asarray(legs_interdomain(fq[:, 25:], fk[:, 25:], v[:, 25:], 8))
        o_a = np.asarray(legs_interdomain(fq[:, :25], fk[:, :25], v[:, :25], 8))
    np.testing.assert_allclose(o[:, 25:], o_b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(o[:, :25], o_a, rtol=1e-12, atol=1e-12)


def test_pallas_impl_dispatch():
    """impl='pallas' reaches the fused kernels (interpret mode on CPU); 'auto' picks them only on GPU/TPU."""
    from idattn.ops import pallas as pallas_ops
    x = make_inputs(bsz=1, t=20, h=1, r=2, d=2, m=3, dtype=np.float32)
    args = (x["fq"], x["zk"], x["zv"], x["lam"][:1].astype(np.complex64), x["b"][:1].astype(np.complex64))
    want = "pallas" if pallas_ops.pallas_available() else "chunked"
    assert op.resolve_impl("auto", 64) == want
    assert op.resolve_impl("auto", 48) == "chunked"  # a chunk the GPU kernels do not take falls back
    o = interdomain_mix(*args, impl="pallas", chunk_size=16, segment_ids=np.array([[0] * 7 + [1] * 13]))
    ref, _ = ref_mix(*(np.asarray(a, np.float64 if a.dtype == np.float32 else complex) for a in args),
                     seg=np.array([[0] * 7 + [1] * 13]))
    assert rel_err(o, ref) <= 1e-4


def test_ops_and_bench_import_with_only_jax_and_numpy():
    """idattn.ops and idattn.bench must run on a bare accelerator image (jax + numpy only)."""
    import subprocess
    import sys
    blocked = ["flax", "optax", "orbax", "grain", "ml_collections", "sentencepiece", "absl", "tensorboardX",
               "matplotlib", "array_record", "pyarrow", "safetensors"]
    code = ("import sys\n"
            f"for n in {blocked!r}: sys.modules[n] = None\n"
            "import idattn.ops, idattn.ops.theory, idattn.ops.pallas, idattn.bench.op, idattn.bench.theory\n"
            "import idattn.bench.per_kernel, idattn.bench.gpu_model, idattn.bench.tpu_model\n"
            "import idattn.bench.__main__\n"
            "idattn.bench.__main__.main(['model', '--help'])\n")  # the one subcommand that needs flax: refused
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "error: python -m idattn.bench model needs " in res.stderr, res.stderr[-2000:]


# ----------------------------------------------------------------------------------------------------------------
# The linear S4D readout (cube `linear`, S4D-only): y_t = Re(Σ_m c_m X_t[m]), X_t = lam ⊙ X_{t-1} + b ⊗ z_t
# ----------------------------------------------------------------------------------------------------------------

from idattn.ops import s4d_linear_mix, s4d_linear_step  # noqa: E402


def ref_linear(z, lam, b, c, seg=None, x0=None, dz=None, dlam=None, db=None, dc=None, dx0=None):
    """float64 loop: y [B,T,H,W] and final X [B,H,M,W]; with tangents (dz, dlam, db, dc, dx0) also the forward-mode
    derivatives (dy, dX) of the same loop (differentiated by hand: dX_t = dlam X_{t-1} + lam dX_{t-1} + db z_t +
    b dz_t, dy_t = Re(dc X_t + c dX_t), both reset with X)."""
    bsz, t, h, w = z.shape
    m = lam.shape[-1]
    tangent = dz is not None
    y, dy = np.zeros((bsz, t, h, w)), np.zeros((bsz, t, h, w))
    xs, dxs = np.zeros((bsz, h, m, w), complex), np.zeros((bsz, h, m, w), complex)
    for bb in range(bsz):
        for hh in range(h):
            x = np.zeros((m, w), complex) if x0 is None else x0[bb, hh].astype(complex).copy()
            dx = np.zeros((m, w), complex) if (x0 is None or not tangent) else dx0[bb, hh].astype(complex).copy()
            for tt in range(t):
                if seg is not None and tt > 0 and seg[bb, tt] != seg[bb, tt - 1]:
                    x, dx = np.zeros_like(x), np.zeros_like(dx)
                if tangent:
                    dx = dlam[hh][:, None] * x + lam[hh][:, None] * dx + np.outer(db[hh], z[bb, tt, hh]) \
                        + np.outer(b[hh], dz[bb, tt, hh])
                x = lam[hh][:, None] * x + np.outer(b[hh], z[bb, tt, hh])
                y[bb, tt, hh] = np.real(c[hh] @ x)
                if tangent:
                    dy[bb, tt, hh] = np.real(dc[hh] @ x + c[hh] @ dx)
            xs[bb, hh], dxs[bb, hh] = x, dx
    return (y, xs, dy, dxs) if tangent else (y, xs)


def make_linear_inputs(bsz=2, t=37, h=2, w=5, m=6, init="inv", seed=0, dtype=np.float64):
    x = make_inputs(bsz=bsz, t=t, h=h, r=w, d=w, m=m, init=init, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)
    cvec = (rng.normal(size=(h, m)) + 1j * rng.normal(size=(h, m))) / math.sqrt(m)
    return dict(z=np.concatenate([x["zk"], x["zv"]], -1)[..., :w], lam=x["lam"], b=x["b"], c=cvec,
                x0=x["x0"][0])


LINEAR_CASES = [("sequential", 8, "inv"), ("chunked", 8, "inv"), ("chunked", 1, "lin"), ("chunked", 37, "legs"),
                ("chunked", 64, "lin")]  # 8: tail chunk of 5; 37 = T; 64 > T


@pytest.mark.parametrize("impl,chunk,init", LINEAR_CASES)
def test_linear_readout_matches_float64_reference(impl, chunk, init):
    """Forward and final state vs the float64 loop (x64), segment ids [1, 2, 1] and an initial state: ≤ 1e-10."""
    x = make_linear_inputs(init=init, seed=20 + LINEAR_CASES.index((impl, chunk, init)))
    ref, ref_x = ref_linear(x["z"], x["lam"], x["b"], x["c"], SEG, x["x0"])
    with jax.enable_x64(True):
        y, xt = jax.jit(lambda *a: s4d_linear_mix(*a[:4], impl=impl, chunk_size=chunk, segment_ids=SEG,
                                                  return_state=True, initial_state=a[4]))(
            x["z"], x["lam"], x["b"], x["c"], x["x0"])
    assert y.dtype == np.float64 and y.shape == ref.shape
    err = rel_err(y, ref)
    print(f"\nlinear readout {impl} chunk={chunk} x64: relative error {err:.2e}")
    assert err <= 1e-10
    np.testing.assert_allclose(np.asarray(xt), ref_x, rtol=1e-10, atol=1e-10)


def _linear_loss(impl, chunk, seg, wy, wx):
    def loss(z, lam_re, lam_im, b_re, b_im, c_re, c_im, x0_re, x0_im):
        y, xt = s4d_linear_mix(z, jax.lax.complex(lam_re, lam_im), jax.lax.complex(b_re, b_im),
                               jax.lax.complex(c_re, c_im), impl=impl, chunk_size=chunk, segment_ids=seg,
                               initial_state=jax.lax.complex(x0_re, x0_im), return_state=True)
        return jnp.sum(y * wy) + jnp.sum(jnp.real(jnp.conj(wx) * xt))
    return loss


@pytest.mark.parametrize("impl,chunk", [("sequential", 4), ("chunked", 5)])  # 13 = 2·5 + 3: a tail chunk
def test_linear_readout_gradients_match_float64_reference(impl, chunk):
    """Gradients w.r.t. z, lam, b, c and the initial state (complex as real pairs), with segment resets, against the
    float64 loop's hand-written forward-mode derivative: <grad, v> == d/dε loss(p + ε v) for random directions v
    (≤ 1e-10 relative, x64)."""
    x = make_linear_inputs(bsz=2, t=13, h=2, w=3, m=4, seed=31)
    seg = SEG[:, :13].copy()
    seg[1, 6:] = 9
    rng = np.random.default_rng(3)
    wy = rng.normal(size=x["z"].shape)
    wx = rng.normal(size=x["x0"].shape) + 1j * rng.normal(size=x["x0"].shape)
    args = (x["z"], x["lam"].real, x["lam"].imag, x["b"].real, x["b"].imag, x["c"].real, x["c"].imag,
            x["x0"].real, x["x0"].imag)
    with jax.enable_x64(True):
        grads = jax.jit(jax.grad(_linear_loss(impl, chunk, seg, wy, wx), argnums=tuple(range(9))))(*args)
    for k in range(3):
        v = [rng.normal(size=np.shape(a)) for a in args]
        _, _, dy, dxt = ref_linear(x["z"], x["lam"], x["b"], x["c"], seg, x["x0"], dz=v[0], dlam=v[1] + 1j * v[2],
                                   db=v[3] + 1j * v[4], dc=v[5] + 1j * v[6], dx0=v[7] + 1j * v[8])
        want = float(np.sum(dy * wy) + np.sum(np.real(np.conj(wx) * dxt)))
        got = float(sum(np.sum(np.asarray(g) * vi) for g, vi in zip(grads, v)))
        assert abs(got - want) <= 1e-10 * max(1.0, abs(want)), (k, got, want)
        # Per argument too (directions that move one argument only), so no error hides in a sum.
        for i in range(9):
            vi = [np.zeros_like(a) if j != i else v[i] for j, a in enumerate(v)]
            _, _, dy, dxt = ref_linear(x["z"], x["lam"], x["b"], x["c"], seg, x["x0"], dz=vi[0],
                                       dlam=vi[1] + 1j * vi[2], db=vi[3] + 1j * vi[4], dc=vi[5] + 1j * vi[6],
                                       dx0=vi[7] + 1j * vi[8])
            want_i = float(np.sum(dy * wy) + np.sum(np.real(np.conj(wx) * dxt)))
            got_i = float(np.sum(np.asarray(grads[i]) * v[i]))
            assert abs(got_i - want_i) <= 1e-10 * max(1.0, abs(want_i)), (k, i, got_i, want_i)


def test_linear_readout_step_reproduces_mix():
    """Decode step token by token == the full chunked forward (outputs and final state), from an initial state."""
    x = make_linear_inputs(bsz=2, t=11, h=2, w=4, m=5, seed=41)
    with jax.enable_x64(True):
        y_full, x_full = jax.jit(lambda *a: s4d_linear_mix(*a[:4], impl="chunked", chunk_size=4, initial_state=a[4],
                                                           return_state=True))(
            x["z"], x["lam"], x["b"], x["c"], x["x0"])
        state, outs = x["x0"], []
        step = jax.jit(s4d_linear_step)
        for t in range(11):
            y_t, state = step(state, x["z"][:, t], x["lam"], x["b"], x["c"])
            outs.append(y_t)
    np.testing.assert_allclose(np.stack(outs, 1), y_full, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state, x_full, rtol=1e-10, atol=1e-12)


def test_linear_readout_float32_long_sequence():
    """float32 chunked at M = 64, T = 4096 with segments against the float64 loop: ≤ 1e-4."""
    x = make_linear_inputs(bsz=1, t=4096, h=2, w=8, m=64, seed=3)
    seg = np.repeat(np.array([[1, 2, 1, 3]]), 1024, axis=1)
    ref, _ = ref_linear(x["z"], x["lam"], x["b"], x["c"], seg)
    y = jax.jit(lambda *a: s4d_linear_mix(*a, segment_ids=seg))(
        x["z"].astype(np.float32), *(x[k].astype(np.complex64) for k in ("lam", "b", "c")))
    assert y.dtype == np.float32
    err = rel_err(y, ref)
    print(f"\nlinear readout float32 T=4096 M=64: worst relative error {err:.3e}")
    assert err <= 1e-4


def test_linear_readout_is_linear_in_the_state():
    """The defining property (docs/model.md, Mixers): y(z1 + z2) = y(z1) + y(z2), and y(α z) = α y(z). The frozen-query
    bilinear form this replaces fails both (it is quadratic in z)."""
    x = make_linear_inputs(bsz=1, t=20, h=2, w=3, m=4, seed=5)
    z2 = np.random.default_rng(9).normal(size=x["z"].shape)
    with jax.enable_x64(True):
        mix = jax.jit(lambda z: s4d_linear_mix(z, x["lam"], x["b"], x["c"], chunk_size=8))
        f = lambda z: np.asarray(mix(z))  # noqa: E731
        np.testing.assert_allclose(f(x["z"] + z2), f(x["z"]) + f(z2), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(f(3.0 * x["z"]), 3.0 * f(x["z"]), rtol=1e-12, atol=1e-12)


def test_linear_readout_bad_inputs():
    x = make_linear_inputs(bsz=1, t=8, h=2, w=3, m=4, dtype=np.float32)
    lam, b, c = (x[k].astype(np.complex64) for k in ("lam", "b", "c"))
    with pytest.raises(ValueError, match=r"z must be \[B, T, H, W\]"):
        s4d_linear_mix(x["z"][0], lam, b, c)
    with pytest.raises(ValueError, match=r"b and c must have lam's M = 4 modes \(c \[H, M\] = \[2, 4\]\)"):
        s4d_linear_mix(x["z"], lam, b, c[:, :3])
    with pytest.raises(ValueError, match=r"lam per token must be \[B, T, H, M\] = \[1, 8, 2, M\]"):
        s4d_linear_mix(x["z"], np.broadcast_to(lam, (1, 7, 2, 4)), b, c)
    with pytest.raises(ValueError, match=r"initial_state must be complex X \[B, H, M, W\] = \[1, 2, 4, 3\]"):
        s4d_linear_mix(x["z"], lam, b, c, initial_state=np.zeros((1, 2, 4, 2), np.complex64))
    with pytest.raises(ValueError, match="impl must be one of"):
        s4d_linear_mix(x["z"], lam, b, c, impl="associative")
    with pytest.raises(ValueError, match=r"\|lam\| < 1"):
        s4d_linear_mix(x["z"], _lam_with_modulus(2, 4, 1.0001), b, c)
