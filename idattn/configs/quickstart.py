"""Quickstart config: tiny Softmax / Interdomain / S4D-only models on the embedded King James corpus (CPU).

Run everything (three models, evaluation, table and plot; 9-16 minutes on 2 CPU cores, depending on their load;
measured on this project's 2-core host on 2026-12-03: 9.2 min in all, 2.4-3.9 min per model, with an
ahead-of-time compile on the other core, and 15.9 min with both cores shared with other jobs):

    pip install -e . && python -m idattn.quickstart                     # writes ./idattn-quickstart/

It trains each mixer with the real trainer (`python -m idattn.train`'s code path) at context 256 on the KJV
text with a 1024-piece SentencePiece vocabulary trained on the same text, evaluates validation perplexity at
256, 512 and 896 tokens (length extrapolation past the training context), prints one table with a unigram
baseline (perplexity of the training-token frequencies) and saves `quickstart.png` (perplexity against
evaluation length). Expected: every model's perplexity finite and at least 30% below the unigram baseline.

One model alone, with the ordinary trainer entry point:

    python -m idattn.train --config=experiments/quickstart.py:interdomain --workdir=/tmp/qs-interdomain

    get_config("<mixer>")   mixer: softmax | interdomain | s4d_only | any mechanism-cube cell, each recurrent one
                            optionally with a core suffix: interdomain-selective, interdomain-selective+phase,
                            s4d_only-selective (the selective core, docs/model.md "Selective core")

The same size with a selective core, and hybrid stacks of the same size (experiments/quickstart_hybrid.py), on your
own data: docs/own-data.md, "Hybrid and selective models".
"""
from __future__ import annotations

import ml_collections

from idattn.configs import base_config
from idattn.models.spec import apply_mixer_name

# Evaluation lengths of the length sweep (the training context is data.seq_len = 256).
EVAL_LENGTHS = (256, 512, 896)
EVAL_TOKENS = 64_512  # held-out tokens per evaluation length: the same stream prefix at every length (72 x 896)


def get_config(arg: str = "interdomain") -> ml_collections.ConfigDict:
    mixer = str(arg).strip() or "interdomain"
    c = base_config()
    m = c.model
    m.update(dict(vocab_size=1024, d_model=128, num_layers=2, num_heads=4, head_dim=32, ffn_dim=384, num_modes=16))
    apply_mixer_name(m, mixer)
    m.dtype = "float32"  # CPU: bf16 matmuls are emulated and slow
    m.remat = "none"
    m.chunk_size = 64

    c.data.source = "kjv"
    c.data.tokenizer = "train:1024"
    c.data.seq_len = 256
    c.data.prefetch = 0

    t = c.train
    t.batch_size = 16
    t.num_steps = 150  # 150 x 16 x 256 = 614K tokens (~0.3 epoch of the training split)
    t.warmup_steps = 15
    t.peak_lr = 3e-3
    t.end_lr = 1e-4
    t.ssm_lr_cap = 1e-3
    t.log_every = 50
    t.eval_every = 0  # validation at the end only
    t.eval_batches = 8
    t.checkpoint_every = 75
    t.keep_last = 1

    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    return c
