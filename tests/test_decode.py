"""Decoding: chunked prefill + one-token steps against the full forward, greedy generate, top-p sampling."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from idattn.models import build_model, decoding
from test_model import T, _batch, _fast_compile, _init, small_cfg  # noqa: F401  (module fixture re-used)


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


def test_sampling_top_p_and_temperature():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
    keys = jax.random.split(jax.random.PRNGKey(0), 400)
    draws = np.asarray(jax.vmap(lambda k: decoding.sample_logits(k, logits, 1.0, 0.7))(keys))[:, 0]
    assert set(np.unique(draws)) == {0, 1}  # the nucleus of mass 0.7 is {0, 1}
    assert 0.5 < np.mean(draws == 0) < 0.75  # 0.5 / 0.8 = 0.625 after renormalisation
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
