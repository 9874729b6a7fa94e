"""MQAR configs: small 2-layer models trained on Zoology's multi-query associative recall.

    get_config("<mixer>[,<seq_len>,<pairs>]")   mixer: softmax | interdomain | s4d_only | a cube cell

The model is the `tiny` scaling size (d_model 64, 2 layers, 4 heads x 16, M = 8 modes) with a 256-token
vocabulary (keys 1..127, values 128..255; Zoology uses 8192, which a CPU run cannot afford to embed and learn
in minutes) and float32 compute. The `mqar` section holds the task and the optimiser (AdamW, warmup + cosine,
loss at query positions only, as Zoology trains).

Run with `python -m idattn.mqar` (idattn/studies/mqar.py; `python experiments/mqar.py` is the same).
"""
from __future__ import annotations

import ml_collections

from idattn.configs.scaling import get_config as scaling_config


def get_config(arg: str = "softmax") -> ml_collections.ConfigDict:
    parts = [p.strip() for p in str(arg).split(",")]
    if len(parts) not in (1, 3):
        raise ValueError(f"experiments/mqar.py: got {arg!r}; expected '<mixer>' or '<mixer>,<seq_len>,<pairs>'.")
    c = scaling_config(f"{parts[0]},tiny")
    c.model.vocab_size = 256
    c.model.impl = "chunked"
    c.model.dtype = "float32"
    c.model.remat = "none"
    c.mqar = ml_collections.ConfigDict(dict(
        seq_len=int(parts[1]) if len(parts) == 3 else 64, num_kv_pairs=int(parts[2]) if len(parts) == 3 else 4,
        vocab_size=256, num_train=20_000, num_test=1_000, steps=6_000, batch_size=64, lr=1e-3,
        weight_decay=0.1, warmup=100, seed=0))  # 6,000 steps: the recall table's (at 3,000 one Interdomain seed in
    # three had not finished its loss drop when the schedule ended; docs/reproduction.md "Why an MQAR seed fails")
    return c
