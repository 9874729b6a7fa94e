"""Parameter count, Table-3 reconciliation and state budget of an experiment config.

    python -m idattn.params --config=experiments/scaling.py:interdomain,1.3b

Prints the parameters by module (from `jax.eval_shape` of the real model: nothing is allocated, so 1.3B is
instant), the recurrent state per layer, the itemised deliberate differences from the paper's
parameterisation (ours − paper), and as its last two lines `params: <int>` and `table3_equivalent: <int>`
(= params − Σ differences; equals the paper's Table 3 for softmax, interdomain and s4d_only at the paper
sizes, and for every mechanism-cube cell at 125M the paper's count inside App. B.1's range
[135,379,344, 135,462,288], whose ends are dualkv-linear-* and generic-query-*). Works for every mixer name:

    python -m idattn.params --config=experiments/scaling.py:generic-query-norope,125m
"""
from __future__ import annotations

import collections

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from ml_collections import config_flags

from idattn import models



def module_breakdown(model_cfg) -> "collections.OrderedDict[str, int]":
    """Counts grouped by module path (layers summed over depth), from eval_shape of the built model."""
    model = models.build_model(model_cfg)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    flat = jax.tree_util.tree_flatten_with_path(nn.meta.unbox(shapes["params"]))[0]
    out: collections.OrderedDict[str, int] = collections.OrderedDict()
    for path, leaf in flat:
        names = [str(getattr(p, "key", p)) for p in path]
        if names[0].startswith("layers_"):
            names[0] = "layers"
        key = "/".join(names[:3] if names[0] == "layers" else names[:1])
        out[key] = out.get(key, 0) + int(np.prod(leaf.shape))
    return out


def report(model_cfg) -> list[str]:
    spec = models.spec_from_config(model_cfg)
    rows = module_breakdown(model_cfg)
    total = sum(rows.values())
    closed = models.count_params_closed(model_cfg)
    if total != closed:
        raise AssertionError(f"eval_shape count {total} != closed form {closed}: update idattn/models/counting.py")
    lines = [f"model: mixer={spec.mixer} input={spec.input} readout={spec.readout} rope={spec.rope} "
             f"gate={spec.output_gate} theory={spec.theory} d={spec.d_model} layers={spec.num_layers} "
             f"heads={spec.num_heads}x{spec.head_dim} ffn={spec.ffn_dim} M={spec.num_modes} V={spec.vocab_size}",
             "parameters by module (summed over layers):"]
    w = max(len(k) for k in rows)
    lines += [f"  {k:<{w}}  {v:>15,}" for k, v in rows.items()]
    sb = models.state_budget(model_cfg)
    unit = "per token (KV cache), per layer" if spec.family == "softmax" else "per layer (constant in context)"
    lines.append(f"state budget: {sb:,} real numbers {unit}")
    diffs = models.differences(model_cfg)
    lines.append(f"differences from the paper's parameterisation (ours − paper): {len(diffs)} items")
    for desc, n in diffs:
        lines.append(f"  {n:+,}  {desc}")
    lines.append(f"paper formula: {models.paper_count(model_cfg):,}")
    lines.append(f"params: {total}")
    lines.append(f"table3_equivalent: {total - sum(n for _, n in diffs)}")
    return lines


def main(argv, config_flag):
    del argv
    if config_flag.value is None:
        raise app.UsageError("--config is required, e.g. --config=experiments/scaling.py:interdomain,1.3b")
    print("\n".join(report(config_flag.value.model)))


if __name__ == "__main__":
    from idattn.configs.flags import run_app  # a --config.<key> typo: one readable line

    # Defined here, not at import: `report` is imported by tests and tools beside other CLIs that define --config.
    _CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config, e.g. "
                                              "experiments/scaling.py:softmax,125m", lock_config=False)
    run_app(lambda argv: main(argv, _CONFIG))
