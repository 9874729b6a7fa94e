"""Quickstart-size hybrid stacks (docs/own-data.md "Hybrid and selective models"): the quickstart's tiny
model and recipe (idattn/configs/quickstart.py: d=128, 4x32 heads, M=16 modes, context 256, 150 steps of 16 x 256
tokens, the same 32,768-token validation) with one attention layer per k recurrent ones, so that its runs compare
with the quickstart's Softmax / Interdomain / S4D-only runs on the same data.

    get_config("<recurrent>,<attention>[,1:<k>]")
      recurrent: interdomain | s4d_only | any cube cell, with a core suffix or not (interdomain-selective)
      attention: softmax (global causal attention) | swa (sliding window over the last `model.window` tokens)
      1:<k>:     k recurrent layers then one attention layer, one group of k + 1 layers (default 1:1: two layers,
                 the quickstart's depth; 1:3 has four layers, so about twice the quickstart's layer parameters)
    swa's window: model.window = 64 tokens (a quarter of the 256-token context; --config.model.window=<tokens>)

On the embedded KJV text (as the quickstart) or your own prepared data (docs/own-data.md):

    python -m idattn.train --config=experiments/quickstart_hybrid.py:interdomain,softmax --workdir=runs/qs-hybrid
    python -m idattn.train --config=experiments/quickstart_hybrid.py:interdomain,swa --workdir=runs/qs-swa \
        --config.data.source=arrayrecord --config.data.path=data/pystdlib \
        --config.data.tokenizer=data/pystdlib/tokenizer.model

A selective model of the same size is the quickstart's own recipe with the core suffix:
`--config=experiments/quickstart.py:interdomain-selective`.
"""
from __future__ import annotations

import ml_collections

from idattn.configs.hybrid import ATTENTION, pattern
from idattn.configs.quickstart import get_config as quickstart_config
from idattn.models.spec import parse_mixer

WINDOW = 64  # swa: a quarter of the quickstart's 256-token context (the tiny hybrid's 16 of 64)


def get_config(arg: str = "interdomain,softmax") -> ml_collections.ConfigDict:
    parts = [p.strip() for p in str(arg).split(",")]
    want = "'<recurrent>,<attention>[,1:<k>]', e.g. interdomain,softmax or interdomain,swa,1:3"
    if len(parts) not in (2, 3):
        raise ValueError(f"experiments/quickstart_hybrid.py: got {arg!r}; expected {want}")
    recurrent, attention = parts[0], parts[1]
    ratio = parts[2] if len(parts) == 3 else "1:1"
    try:
        family = parse_mixer(recurrent)[0]
    except ValueError:
        family = None
    if family != "interdomain":
        raise ValueError(f"experiments/quickstart_hybrid.py: recurrent mixer {recurrent!r}; expected interdomain, "
                         f"s4d_only or a cube cell, optionally with a core suffix ({want})")
    if attention not in ATTENTION:
        raise ValueError(f"experiments/quickstart_hybrid.py: attention {attention!r}; expected one of {ATTENTION} "
                         f"({want})")
    num, _, den = ratio.partition(":")
    if num != "1" or not den.isdigit() or int(den) < 1:
        raise ValueError(f"experiments/quickstart_hybrid.py: ratio {ratio!r}; expected 1:<k> with k >= 1 ({want})")
    k = int(den)
    c = quickstart_config(recurrent)
    c.model.num_layers = k + 1  # one group: k recurrent layers, then the attention layer
    c.model.layer_pattern = pattern(recurrent, attention, k)
    if attention == "swa":
        c.model.window = WINDOW
    return c
