"""Hybrid stacks at the paper's sizes (docs/model.md "Hybrid stacks"): a recurrent mixer with one
attention layer every k + 1 layers, with the scaling study's full recipe (idattn/configs/scaling.py, App. A.2).

    get_config("<recurrent>,<attention>,1:<k>,<size>")
      recurrent: interdomain | s4d_only | any cube cell <input>-<readout>-<rope>
      attention: softmax (global causal attention) | swa (sliding window over the last `model.window` tokens)
      1:<k>:     one attention layer per k recurrent ones: model.layer_pattern = k × <recurrent>, <attention>
                 (attention last in each group of k + 1 layers, as in Qwen3-Next / Kimi Linear's 3:1);
                 k + 1 must divide the depth: 1:3 fits every paper size, 1:7 the 24-layer ones (350M-1.3B),
                 125M (12 layers) takes 1:3, 1:5 or 1:11
      size:      tiny | 125m | 350m | 760m | 1.3b   (tiny: the CPU model with k + 1 layers, one group)
    swa's window: model.window = 2048 (Samba's at 4K training context; --config.model.window=<tokens>)

Examples:
    python -m idattn.params --config=experiments/hybrid.py:interdomain,softmax,1:3,1.3b
    python -m idattn.train  --config=experiments/hybrid.py:interdomain,swa,1:7,350m --workdir=/tmp/run \
        --config.data.source=arrayrecord --config.data.path=/data/idattn-mistral
    python -m idattn.aot    --config=experiments/hybrid.py:interdomain,softmax,1:3,1.3b --topology=v5p-128
"""
from __future__ import annotations

import ml_collections

from idattn.configs.scaling import get_config as scaling_config
from idattn.models.spec import parse_mixer

ATTENTION = ("softmax", "swa")
DEFAULT_WINDOW = 2048


def pattern(recurrent: str, attention: str, k: int) -> str:
    """The layer pattern of a 1:k hybrid: k recurrent layers then one attention layer."""
    return ",".join([recurrent] * k + [attention])


def get_config(arg: str = "interdomain,softmax,1:3,125m") -> ml_collections.ConfigDict:
    parts = [p.strip() for p in str(arg).split(",")]
    want = "'<recurrent>,<attention>,1:<k>,<size>', e.g. interdomain,softmax,1:3,1.3b"
    if len(parts) != 4:
        raise ValueError(f"experiments/hybrid.py: got {arg!r}; expected {want}")
    recurrent, attention, ratio, size = parts[0], parts[1], parts[2], parts[3].lower()
    if parse_mixer(recurrent)[0] != "interdomain":
        raise ValueError(f"experiments/hybrid.py: recurrent mixer {recurrent!r}; expected interdomain, s4d_only or a "
                         f"cube cell ({want})")
    if attention not in ATTENTION:
        raise ValueError(f"experiments/hybrid.py: attention {attention!r}; expected one of {ATTENTION} ({want})")
    num, _, den = ratio.partition(":")
    if num != "1" or not den.isdigit() or int(den) < 1:
        raise ValueError(f"experiments/hybrid.py: ratio {ratio!r}; expected 1:<k> with k >= 1 ({want})")
    c = scaling_config(f"{recurrent},{size}")
    k = int(den)
    if size == "tiny":  # the CPU model: one group of k + 1 layers
        c.model.num_layers = k + 1
    if c.model.num_layers % (k + 1):
        ok = [f"1:{j - 1}" for j in range(2, c.model.num_layers + 1) if c.model.num_layers % j == 0]
        raise ValueError(f"experiments/hybrid.py: ratio 1:{k} needs a depth divisible by {k + 1}; {size} has "
                         f"{c.model.num_layers} layers (ratios that fit: {', '.join(ok)})")
    c.model.layer_pattern = pattern(recurrent, attention, k)
    if attention == "swa":
        c.model.window = DEFAULT_WINDOW if size != "tiny" else 16
    return c
