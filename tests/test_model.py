"""Model-level tests for every mixer (softmax, interdomain, s4d_only and the eight cube cells).

Per mixer, one small float32 model and two jitted functions:
  * token-by-token decoding (cache + lax.scan of one-token steps) reproduces the full forward logits;
  * in a packed row [A | B] the logits of document B do not change when document A changes;
  * the model jits, takes gradients (finite, non-zero for the SSM parameters) and three Adam steps lower the
    loss on a fixed batch.
Compile time dominates on CPU, so this module switches off most XLA optimisations while it runs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import flax.linen as nn  # noqa: E402

from idattn.configs import base_config
from idattn.models import apply_mixer_name, build_model, cube_cells, decoding, param_labels

# "s4d_only" is generic-linear-norope and "interdomain" dualkv-query-rope by name (apply_mixer_name;
# tests/test_params.py): the cube cells run the sequential operator here; the full model on the default chunked
# operator is checked by test_decode.py (decode == forward), test_mesh_kernels.py and the trainer tests.
# the default suite runs Softmax and four cube cells (each axis flipped at least once); the other four under -m slow
_DEFAULT_CELLS = ("dualkv-query-rope", "generic-linear-norope", "dualkv-linear-rope", "generic-query-norope")
MIXERS = ["softmax"] + [c if c in _DEFAULT_CELLS else pytest.param(c, marks=pytest.mark.slow) for c in cube_cells()]
T, TA = 10, 4  # row length, length of document A in the packed rows


# compile time dominates on CPU: most XLA optimisations off for this module (conftest.fast_compile)
pytestmark = pytest.mark.usefixtures("fast_compile")


def small_cfg(mixer: str, **kw):
    c = base_config().model
    c.update(dict(vocab_size=64, d_model=32, num_layers=2, num_heads=2, head_dim=16, ffn_dim=128, num_modes=4,
                  dtype="float32", chunk_size=8, remat="none",
                  # "interdomain" runs the default chunked operator (T=10 crosses a chunk boundary), the other
                  # cells the sequential reference, which compiles faster (the operator's paths agree: ops tests)
                  impl="chunked" if mixer == "interdomain" else "sequential"))
    c.update(kw)
    return apply_mixer_name(c, mixer)


def _init(model, seed=0):
    tok = jnp.zeros((1, T), jnp.int32)
    return nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(seed), tok)["params"])


def _batch():
    r = np.random.RandomState(0)
    a1, a2, b = r.randint(0, 64, TA), r.randint(0, 64, TA), r.randint(0, 64, T - TA)
    packed = np.stack([np.concatenate([a1, b]), np.concatenate([a2, b])]).astype(np.int32)
    seg = np.array([[1] * TA + [2] * (T - TA)] * 2, np.int32)
    single = r.randint(0, 64, (1, T)).astype(np.int32)
    return jnp.asarray(packed), jnp.asarray(seg), jnp.asarray(single)


def _check_fn(model):
    @jax.jit
    def run(params, packed, seg, single):
        # one forward for both: the single row is one document (constant segment id)
        logits = model.apply({"params": params}, jnp.concatenate([packed, single]),
                             segment_ids=jnp.concatenate([seg, jnp.zeros_like(single)]))
        packed_logits, full = logits[:2], logits[2]
        cache = decoding.init_cache(model, 1, T)

        def step(cache, tok):
            logits, cache = model.apply({"params": params}, tok[:, None], cache=cache)
            return cache, logits[0, -1]
        _, dec = jax.lax.scan(step, cache, single.T)
        return packed_logits, full, dec
    return run


def _train_fn(model, tokens):
    opt = optax.adam(1e-2)

    def loss(p):
        logits = model.apply({"params": p}, tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()

    @jax.jit
    def run(params):
        def step(carry, _):
            p, s = carry
            val, g = jax.value_and_grad(loss)(p)
            u, s = opt.update(g, s, p)
            return (optax.apply_updates(p, u), s), (val, g)
        _, (losses, grads) = jax.lax.scan(step, (params, opt.init(params)), None, length=4)
        return jax.tree_util.tree_map(lambda g: g[0], grads), losses
    return run


@pytest.mark.parametrize("mixer", MIXERS)
def test_mixer_decode_packing_and_training(mixer):
    model = build_model(small_cfg(mixer))
    params = _init(model)
    packed, seg, single = _batch()
    packed_logits, full, dec = map(np.asarray, _check_fn(model)(params, packed, seg, single))

    # token-by-token decoding == full forward (float32, ≤ 1e-4 relative to the logit scale)
    scale = np.max(np.abs(full))
    assert np.max(np.abs(dec - full)) <= 1e-4 * scale, (mixer, np.max(np.abs(dec - full)) / scale)

    # document B is blind to document A; A's own logits do differ (the check can fail)
    b0, b1 = packed_logits[0, TA:], packed_logits[1, TA:]
    assert np.max(np.abs(b0 - b1)) <= 1e-5 * np.max(np.abs(b0)), mixer
    assert np.max(np.abs(packed_logits[0, :TA] - packed_logits[1, :TA])) > 1e-3

    g0, losses = _train_fn(model, jnp.concatenate([packed, single], 0))(params)
    losses = np.asarray(losses)
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 1e-3, (mixer, losses)
    labels = param_labels(params)
    norms = {}
    for (path, g), lab in zip(jax.tree_util.tree_flatten_with_path(g0)[0], jax.tree_util.tree_leaves(labels)):
        assert np.all(np.isfinite(np.asarray(g))), jax.tree_util.keystr(path)
        norms.setdefault(lab, []).append(float(jnp.linalg.norm(g)))
    assert sum(norms["decay"]) > 0
    if mixer != "softmax":
        assert sum(norms["ssm"]) > 0  # the SSM parameters (stored as real pairs) receive gradients


def test_segment_positions_restart_and_default_positions():
    """positions=None with segment ids == explicit per-document positions; differs from global positions."""
    model = build_model(small_cfg("dualkv-query-rope"))  # softmax+RoPE would be blind to a global shift
    params = _init(model)
    packed, seg, _ = _batch()
    f = jax.jit(lambda p, s, pos: model.apply({"params": p}, packed, segment_ids=s, positions=pos))
    pos = jnp.asarray(np.array([list(range(TA)) + list(range(T - TA))] * 2, np.int32))
    a = np.asarray(f(params, seg, pos))
    b = np.asarray(jax.jit(lambda p, s: model.apply({"params": p}, packed, segment_ids=s))(params, seg))
    np.testing.assert_allclose(a, b, atol=1e-5)
    c = np.asarray(f(params, seg, jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (2, T))))
    assert np.max(np.abs(c[:, TA:] - a[:, TA:])) > 1e-4


def test_bad_configs_have_clear_errors():
    for bad in ("transformer", "generic-query-maybe"):
        c = small_cfg("softmax")
        c.mixer = bad
        with pytest.raises(ValueError, match=f"model.mixer: got '{bad}'.*cube cell"):
            build_model(c)
    with pytest.raises(ValueError, match="model.num_heads.*divisor of d_model=32"):
        build_model(small_cfg("interdomain", num_heads=3))
    with pytest.raises(ValueError, match="model.input.*'generic' for mixer 's4d_only'"):
        c = small_cfg("interdomain")
        c.mixer = "s4d_only"
        build_model(c)
    with pytest.raises(ValueError, match="model.remat.*'sometimes'"):
        build_model(small_cfg("interdomain", remat="sometimes"))
    with pytest.raises(ValueError, match="model.linear_contraction: got 'max'.*'mean', 'sum'"):
        build_model(small_cfg("s4d_only", linear_contraction="max"))
    with pytest.raises(ValueError, match="model.head_dim.*even"):
        build_model(small_cfg("softmax", num_heads=2, head_dim=15))
    with pytest.raises(ValueError, match="tokens: got shape"):
        m = build_model(small_cfg("softmax"))
        m.init(jax.random.PRNGKey(0), jnp.zeros((4,), jnp.int32))
    with pytest.raises(ValueError, match="max_len"):
        decoding.init_cache(build_model(small_cfg("softmax")), 1, None)


def _scan_carry_dtypes(jaxpr) -> list[list]:
    """The carry dtypes of every lax.scan in a jaxpr, nested jaxprs (jit, remat, custom_vjp) included."""
    out = []
    for e in jaxpr.eqns:
        if e.primitive.name == "scan":
            if "num_consts" in e.params:  # jax <= 0.11
                nc, ncar = e.params["num_consts"], e.params["num_carry"]
            else:  # jax >= 0.12: the flat tree of (consts, carry, xs)
                nc, ncar = (len(list(t.vals)) for t in e.params["ft_in"].unpack()[:2])
            out.append([v.aval.dtype for v in e.invars[nc:nc + ncar]])
        for p in e.params.values():
            for sub in p if isinstance(p, (list, tuple)) else [p]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    out += _scan_carry_dtypes(inner)
    return out


def _mix_float64(fq, zk, zv, lam, b):
    """The operator's recurrence (idattn/ops/interdomain.py, c = None, conj=True) as a float64 NumPy loop."""
    fq, zk, zv = (np.asarray(x, np.float64) for x in (fq, zk, zv))
    lam, b = np.asarray(lam, np.complex128)[None, :, :, None], np.asarray(b, np.complex128)[None, :, :, None]
    bsz, t, h, r = fq.shape
    xk = np.zeros((bsz, h, lam.shape[2], r), np.complex128)
    xv = np.zeros((bsz, h, lam.shape[2], zv.shape[-1]), np.complex128)
    out = np.zeros(zv.shape)
    for i in range(t):
        xk = lam * xk + b * zk[:, i, :, None, :]
        xv = lam * xv + b * zv[:, i, :, None, :]
        p = np.einsum("bhmr,bhr->bhm", xk, fq[:, i])
        out[:, i] = np.real(np.einsum("bhm,bhmd->bhd", np.conj(p), xv))
    return out


def test_bf16_compute_with_remat_tracks_float32():
    """dtype=bfloat16 (fp32 params, fp32/complex64 recurrence) + remat=full: float32 logits near the f32 model;
    the state is float32/complex64 in the program (every lax.scan carry of the forward, the decode cache and what
    decode_step returns); and at T = 512 the bf16 operator is within bf16's rounding of its output alone of a
    float64 loop on the same (bf16) inputs: |o − ref| ≤ 2⁻⁸·|ref| + T·2⁻²⁴·max|ref| (one rounding of the
    output to bf16, unit roundoff 2⁻⁸, plus float32 accumulation over T tokens). A state held in bf16 loses
    2⁻⁸ of its magnitude at every chunk and misses that bound by two orders of magnitude."""
    from idattn.ops.interdomain import interdomain_mix

    tok = jnp.asarray(np.random.RandomState(5).randint(0, 64, (2, T)), jnp.int32)
    m32 = build_model(small_cfg("interdomain", impl="sequential"))
    m16 = build_model(small_cfg("interdomain", impl="sequential", dtype="bfloat16", remat="full"))
    params = _init(m32)
    a = np.asarray(jax.jit(m32.apply)({"params": params}, tok))
    b = jax.jit(m16.apply)({"params": params}, tok)
    assert b.dtype == jnp.float32
    err = np.max(np.abs(a - np.asarray(b))) / np.max(np.abs(a))
    assert 0 < err < 3e-2, err

    # the carry dtypes in the jaxpr: the chunked operator (the training path) and the sequential one; the walker
    # sees a bf16 carry under jit + remat
    toy = jax.make_jaxpr(jax.jit(jax.checkpoint(lambda x: jax.lax.scan(lambda c, _: (c * 2, None), x, None, 3)[0])))
    assert _scan_carry_dtypes(toy(jnp.ones(2, jnp.bfloat16)).jaxpr) == [[jnp.bfloat16]]
    for impl in ("chunked", "sequential"):
        m = build_model(small_cfg("interdomain", impl=impl, dtype="bfloat16", remat="full", scan_layers=False))
        jaxpr = jax.make_jaxpr(m.apply)({"params": _init(m)}, jnp.zeros((1, 64), jnp.int32)).jaxpr
        carries = _scan_carry_dtypes(jaxpr)
        floats = [d for c in carries for d in c if jnp.issubdtype(d, jnp.inexact)]
        assert len(carries) >= 2 and floats, (impl, carries)  # one operator scan per layer
        assert all(d in (jnp.float32, jnp.complex64) for d in floats), (impl, carries)
    cache = decoding.init_cache(m16, 1)
    out = jax.eval_shape(lambda c: decoding.decode_step(m16, params, jnp.zeros((1,), jnp.int32), c)[1], cache)
    for c in (cache, out):
        assert c["layers"]["xk"].dtype == c["layers"]["xv"].dtype == jnp.complex64

    # the operator at T = 512 against float64, slow decays (|lam| = e^-0.001 .. e^-0.01: a long memory)
    t_long, h, r, m_modes = 512, 2, 8, 4
    rs = np.random.RandomState(0)
    fq, zk, zv = (jnp.asarray(rs.randn(1, t_long, h, r), jnp.bfloat16) for _ in range(3))
    lam = jnp.asarray(np.exp(-rs.uniform(1e-3, 1e-2, (h, m_modes)) + 1j * rs.uniform(0, np.pi, (h, m_modes))),
                      jnp.complex64)
    bvec = jnp.asarray(0.1 * (rs.randn(h, m_modes) + 1j * rs.randn(h, m_modes)), jnp.complex64)
    ref = _mix_float64(fq, zk, zv, lam, bvec)
    u = 2.0 ** -8  # bf16 unit roundoff (8 significand bits)
    for impl in ("chunked", "sequential"):
        o = interdomain_mix(fq, zk, zv, lam, bvec, impl=impl, chunk_size=16)
        assert o.dtype == jnp.bfloat16
        excess = np.abs(np.asarray(o, np.float64) - ref) - u * np.abs(ref)
        bound = t_long * 2.0 ** -24 * np.max(np.abs(ref))
        assert np.max(excess) <= bound, (impl, float(np.max(excess)), bound)


def test_theory_mode_model():
    """theory=True (LegS + Nadaraya-Watson denominator): runs, isolates documents, has no SSM parameters,
    takes gradients; decoding is refused with a clear error; the count matches the closed form."""
    from idattn.models import count_params, count_params_closed

    cfg = small_cfg("interdomain", theory=True)
    model = build_model(cfg)
    params = _init(model)
    assert not any("ssm_" in jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0])
    assert count_params(cfg) == count_params_closed(cfg)
    packed, seg, _ = _batch()

    @jax.jit
    def run(p):
        def loss(p):
            lg = model.apply({"params": p}, packed, segment_ids=seg)
            return optax.softmax_cross_entropy_with_integer_labels(lg[:, :-1], packed[:, 1:]).mean(), lg
        (val, lg), g = jax.value_and_grad(loss, has_aux=True)(p)
        return val, lg, g
    val, lg, g = run(params)
    lg = np.asarray(lg)
    assert np.isfinite(float(val)) and all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(g))
    assert np.max(np.abs(lg[0, TA:] - lg[1, TA:])) <= 1e-5 * np.max(np.abs(lg))
    assert float(jnp.linalg.norm(g["layers"]["mixer"]["wk"]["kernel"])) > 0
    with pytest.raises(NotImplementedError, match="theory"):
        decoding.init_cache(model, 1, 8)
    with pytest.raises(ValueError, match="model.theory"):
        build_model(small_cfg("s4d_only", theory=True))
