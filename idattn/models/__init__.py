"""idattn.models: the Llama-style decoder and the functions the trainer and evaluation use.

  build_model(model_cfg) -> nn.Module      apply({"params": p}, tokens [B,T] int32, segment_ids=None,
                                            positions=None) -> logits [B,T,V] float32
  param_labels(params) -> pytree of str    "ssm" | "decay" | "no_decay" (optimiser groups)
  count_params, state_budget, flops_per_token, apply_mixer_name, parse_mixer, cube_cells
  layer_specs, layer_types                  hybrid stacks (model.layer_pattern): one spec per pattern entry / type
  decoding: init_cache, prefill, decode_step, generate, cache_bytes (idattn.models.decoding)

`model_cfg` is `config.model` of `idattn.configs.base_config()` (keys documented there and in docs/model.md).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from idattn.models.counting import (count_params, count_params_closed, differences, flops_per_token, layer_types,
                                    param_breakdown, paper_count, state_budget, table3_equivalent)
from idattn.models.llama import Block, Decoder, build_model
from idattn.models.spec import (ModelSpec, apply_mixer_name, conv_names, cube_cells, layer_specs, model_label,
                                parse_mixer, spec_from_config)


_DECAY_NAMES = ("kernel", "embedding")


def _label(path) -> str:
    names = [str(getattr(p, "key", getattr(p, "name", p))) for p in path]
    if any(n.startswith("ssm_") for n in names):
        return "ssm"
    if names and names[-1] in _DECAY_NAMES:
        return "decay"
    return "no_decay"


def param_labels(params: Any) -> Any:
    """Optimiser group per leaf: "ssm" (N+β scales/biases, log Δ, A, B, C: LR cap, no weight decay),
    "decay" (matrices, embeddings, short-conv kernels: weight decay) and "no_decay" (RMSNorm scales). Accepts boxed (nn.Partitioned) or plain params; the result matches the unboxed tree."""
    return jax.tree_util.tree_map_with_path(lambda p, _: _label(p), nn.meta.unbox(params))


__all__ = ["build_model", "param_labels", "count_params", "count_params_closed", "state_budget",
           "flops_per_token", "apply_mixer_name", "parse_mixer", "cube_cells", "param_breakdown", "paper_count",
           "differences", "table3_equivalent", "spec_from_config", "ModelSpec", "Decoder", "Block", "conv_names",
           "decoding", "init_cache", "prefill", "decode_step", "generate", "sample_logits", "layer_specs",
           "layer_types", "cache_bytes", "model_label"]

from idattn.models import decoding  # noqa: E402
from idattn.models.decoding import cache_bytes, decode_step, generate, init_cache, prefill, sample_logits  # noqa: E402
