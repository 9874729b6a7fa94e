"""Decode benchmark: prefill memory of the chunked recurrent prefill does not grow with the prompt."""
from __future__ import annotations

import importlib.util
import os

import jax
import jax.numpy as jnp
from flax import linen as nn

from idattn.eval.decode_bench import prefill_memory
from idattn.models import build_model

# experiments/scaling.py loaded by path (not via sys.path): the test runs from any working directory.
_spec = importlib.util.spec_from_file_location(
    "_scaling_cfg_decode", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments",
                                        "scaling.py"))
_scaling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_scaling)
get_config = _scaling.get_config


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
