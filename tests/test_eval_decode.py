"""Decode benchmark: prefill memory of the chunked recurrent prefill does not grow with the prompt."""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
from flax import linen as nn

from idattn.eval.decode_bench import prefill_memory
from idattn.models import build_model

sys.path.insert(0, "experiments")
from scaling import get_config  # noqa: E402


def _model(mixer):
    c = get_config(f"{mixer},tiny")
    c.model.impl = "chunked"
    m = build_model(c.model)
    # abstract parameters: the memory analysis only compiles, so nothing needs initialising
    return m, nn.unbox(jax.eval_shape(lambda: m.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]))


def test_prefill_memory_chunked_flat_for_interdomain_not_softmax():
    m, p = _model("interdomain")
    a = prefill_memory(m, p, batch_size=2, context=32, chunk=16, modes=("chunked",))
    b = prefill_memory(m, p, batch_size=2, context=128, chunk=16)
    assert a["chunked"]["total_bytes"] == b["chunked"]["total_bytes"]  # constant state, same chunk program
    assert b["full"]["total_bytes"] > b["chunked"]["total_bytes"]
    m, p = _model("softmax")
    a = prefill_memory(m, p, batch_size=2, context=32, chunk=16, modes=("chunked",))
    b = prefill_memory(m, p, batch_size=2, context=128, chunk=16, modes=("chunked",))
    assert b["chunked"]["total_bytes"] > a["chunked"]["total_bytes"]  # the KV cache grows with the context
