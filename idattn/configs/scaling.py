"""Scaling-study configs: one mixer at one paper size, with the paper's full training recipe (App. A.2).

    get_config("<mixer>,<size>")
      mixer: softmax | interdomain | s4d_only | a mechanism-cube cell <input>-<readout>-<rope>
             (input: dualkv | generic; readout: query | linear; rope: rope | norope), e.g. generic-query-rope
      size:  tiny | 125m | 350m | 760m | 1.3b   (tiny: a CPU-sized model for tests and smoke runs)

Data: every size but `tiny` leaves `data.source` unset, and the trainer refuses to start until it is chosen:
prepared shards (`--config.data.source=arrayrecord --config.data.path=<folder>`, written by
`python -m idattn.data.prepare`, docs/data.md) or, for a smoke run only, `--config.data.source=kjv`.

Run (ml_collections config_flags, big_vision style):
    python -m idattn.train  --config=experiments/scaling.py:interdomain,125m --workdir=/tmp/run \
        --config.data.source=arrayrecord --config.data.path=/data/idattn-mistral
    python -m idattn.params --config=experiments/scaling.py:s4d_only,1.3b
    python -m idattn.train  --config=experiments/scaling.py:softmax,tiny --workdir=/tmp/tiny \
        --config.train.total_tokens=100000
"""
from __future__ import annotations

import ml_collections

from idattn.configs import base_config
from idattn.configs.sizes import PAPER_RECIPE, SIZE_ORDER, named_shape
from idattn.models.spec import apply_mixer_name

SIZES = {size: named_shape(size) for size in SIZE_ORDER}  # the one size table: idattn/configs/sizes.py


def get_config(arg: str = "interdomain,125m") -> ml_collections.ConfigDict:
    parts = [p.strip() for p in str(arg).split(",")]
    if len(parts) != 2:
        raise ValueError(f"experiments/scaling.py: got {arg!r}; expected '<mixer>,<size>', e.g. interdomain,125m")
    mixer, size = parts[0], parts[1].lower()
    if size not in SIZES:
        raise ValueError(f"experiments/scaling.py: size {size!r}; expected one of {tuple(SIZES)}")
    c = base_config()
    c.model.update(SIZES[size])
    apply_mixer_name(c.model, mixer)  # validates the name
    if size == "1.3b":
        c.model.output_gate = False  # the paper: output gate off at 1.3B
    c.train.batch_size = 128
    c.data.seq_len = 4096
    c.train.warmup_tokens = 375_000_000
    c.train.ssm_lr_cap = 1e-3
    if size == "tiny":
        c.model.dtype = "float32"  # CPU: bf16 matmuls are emulated and slow
        c.model.chunk_size = 16
        c.model.remat = "none"
        c.data.seq_len = 64
        c.data.tokenizer = "train:512"  # the SentencePiece trainer needs >= 276 (byte fallback)
        c.train.batch_size = 8
        c.train.total_tokens = 8 * 64 * 200
        c.train.warmup_tokens = 8 * 64 * 20
        c.train.peak_lr = 3e-3
        c.train.checkpoint_every = 100
        c.train.eval_every = 100
        c.train.eval_batches = 2
    else:
        c.train.update(PAPER_RECIPE[size])
        c.data.source = ""  # must be chosen on the command line (see the module docstring); refused while unset
    return c
