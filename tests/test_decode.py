"""Decoding: chunked prefill + one-token steps against the full forward, greedy generate, top-p sampling."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from idattn.models import build_model, decoding
from test_model import T, _batch, _init, small_cfg

# compile time dominates on CPU: most XLA optimisations off for this module (conftest.fast_compile)
pytestmark = pytest.mark.usefixtures("fast_compile")


@pytest.mark.parametrize("mixer,kw", [
    ("interdomain", dict(scan_layers=False, remat="dots", output_gate=True, conj=False)),
    ("softmax", dict(remat="full")),
])
def test_prefill_chunks_and_greedy_generate(mixer, kw):
    """Chunked prefill (chunks of 3) + decode_step == full forward; greedy generate picks the argmax."""
    model = build_model(small_cfg(mixer, **kw))  # chunk_size 8: prefill chunks of 3 start mid-chunk
    params = _init(model, seed=1)
    _, _, single = _batch()
    full = np.asarray(jax.jit(model.apply)({"params": params}, single)[0])
    cache = decoding.init_cache(model, 1, T + 2)
    logits, cache = decoding.prefill(model, params, single[:, :7], cache, chunk_size=3)
    outs = [np.asarray(logits[0])]
    for t in range(7, T):
        logits, cache = decoding.decode_step(model, params, single[:, t], cache)
        outs.append(np.asarray(logits[0]))
    np.testing.assert_allclose(np.stack(outs), full[6:], atol=1e-4 * np.max(np.abs(full)))
    assert int(cache["index"]) == T

    gen = np.asarray(decoding.generate(model, params, single[:, :6], 3))
    assert gen.shape == (1, 9) and np.array_equal(gen[0, :6], np.asarray(single[0, :6]))
    # each greedy token is the argmax of the full forward on its prefix
    ref = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(gen[:, :8])))[0]
    np.testing.assert_array_equal(gen[0, 6:], ref[5:8].argmax(-1))


def _band(draws, p, n_draws, z=5.0):
    """Per category, the observed frequency against p within z binomial standard deviations (z = 5 over four
    categories: a false failure about once in 10^6 seeds; the keys are fixed, so the test is deterministic)."""
    freq = np.bincount(draws, minlength=p.shape[0]) / n_draws
    sd = np.sqrt(p * (1 - p) / n_draws)
    return freq, np.abs(freq - p) <= z * sd + 1e-12


def test_sampling_top_p_and_temperature():
    """Sample frequencies against softmax(logits / T), computed here in float64, within a binomial band: T = 0.5
    and 2 (p ∝ p₀² and √p₀, far from p₀ itself), and the nucleus taken after the temperature (at T = 0.5 the
    top-0.9 nucleus is {0, 1}; before it, it would be {0, 1, 2})."""
    p0 = np.asarray([0.5, 0.3, 0.15, 0.05])
    logits = jnp.log(jnp.asarray(p0, jnp.float32))[None]
    n = 20000
    keys = jax.random.split(jax.random.PRNGKey(0), n)

    def draw(temperature, top_p=1.0):
        one = jax.vmap(lambda k: decoding.sample_logits(k, logits, temperature, top_p))
        return np.asarray(jax.jit(one)(keys))[:, 0]

    for temp in (0.5, 2.0):
        z = np.log(p0) / temp
        want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        freq, ok = _band(draw(temp), want, n)
        assert ok.all(), (temp, freq, want)
    # nucleus after the temperature: the kept tokens renormalised
    z = np.log(p0) / 0.5
    pt = np.exp(z) / np.exp(z).sum()
    keep = (np.cumsum(pt) - pt) < 0.9
    assert keep.tolist() == [True, True, False, False]
    want = np.where(keep, pt, 0) / pt[keep].sum()
    draws = draw(0.5, 0.9)
    assert set(np.unique(draws)) == {0, 1}
    freq, ok = _band(draws, want, n)
    assert ok.all(), (freq, want)
    assert int(decoding.sample_logits(None, logits, 0.0)[0]) == 0
    with pytest.raises(ValueError, match="top_p"):
        decoding.sample_logits(keys[0], logits, 1.0, 0.0)


def test_recurrent_cache_is_constant_in_context():
    """The recurrent cache has no length axis: same shapes for any max_len; softmax's grows."""
    m = build_model(small_cfg("interdomain"))
    a = jax.tree_util.tree_map(jnp.shape, decoding.init_cache(m, 2, 16))
    b = jax.tree_util.tree_map(jnp.shape, decoding.init_cache(m, 2, 4096))
    assert a == b
    assert a["layers"]["xk"] == (2, 2, 2, 4, 16)  # [L, B, H, M, R]
    s = build_model(small_cfg("softmax"))
    assert decoding.init_cache(s, 2, 16)["layers"]["k"].shape == (2, 2, 16, 2, 16)


def test_softmax_cache_overflow_is_refused():
    model = build_model(small_cfg("softmax"))
    params = _init(model)
    cache = decoding.init_cache(model, 1, 4)
    with pytest.raises(ValueError, match="exceed max_len=4"):
        decoding.prefill(model, params, jnp.zeros((1, 5), jnp.int32), cache)
