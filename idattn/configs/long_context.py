"""Long-context training: one paper size at a long context, the sequence split over `config.mesh.sequence`.

    get_config("<mixer>,<size>[,<seq_len>[,<sequence>]]")   defaults: seq_len 65536, sequence 4

The recipe is the scaling config's (idattn/configs/scaling.py: the paper's optimiser, warmup and token budget)
at `seq_len` tokens per sequence, with the global batch cut so that a step keeps the paper's 128 × 4096 = 524,288
tokens (8 sequences of 65,536), the length split over `sequence` devices (idattn/ops/sequence.py: one all_gather
of the layer's end states per layer; docs/pods.md, "Long context"), and every remaining device on fsdp. The
devices of one sequence group must be on one host (a v5p host has 4 chips, v5e / v6e hosts 8).

Check that it fits, then train on a pod (docs/pods.md):
    python -m idattn.aot --config=experiments/long_context.py:interdomain,125m --topology=v5p-32
    python -m idattn.launch.tpu train --tpu_name=<slice> ... -- \
        --config=experiments/long_context.py:interdomain,125m --workdir=/mnt/runs/id-125m-64k \
        --config.data.source=arrayrecord --config.data.path=/mnt/data/fineweb-edu
"""
from __future__ import annotations

import ml_collections

from idattn.configs.scaling import get_config as scaling_config

TOKENS_PER_STEP = 128 * 4096  # the paper's batch, in tokens


def get_config(arg: str = "interdomain,125m") -> ml_collections.ConfigDict:
    parts = [p.strip() for p in str(arg).split(",")]
    if not 2 <= len(parts) <= 4:
        raise ValueError(f"long_context: got {arg!r}; expected '<mixer>,<size>[,<seq_len>[,<sequence>]]', e.g. "
                         f"interdomain,125m,65536,4")
    seq_len = int(parts[2]) if len(parts) > 2 else 65536
    sequence = int(parts[3]) if len(parts) > 3 else 4
    if seq_len % sequence or TOKENS_PER_STEP % seq_len:
        raise ValueError(f"long_context: seq_len={seq_len} must divide the {TOKENS_PER_STEP:,} tokens of a step "
                         f"and be divisible by sequence={sequence}")
    c = scaling_config(f"{parts[0]},{parts[1]}")
    c.data.seq_len = seq_len
    c.train.batch_size = TOKENS_PER_STEP // seq_len
    c.mesh.sequence, c.mesh.fsdp = sequence, -1
    c.train.loss_chunk = 512
    return c
