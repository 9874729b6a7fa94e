"""CPU scaling study: Softmax and Interdomain, 5 sizes x 3 IsoFLOP compute budgets, on the embedded KJV corpus.

    python -m idattn.sweep experiments/sweeps/cpu_isoflop.py --root=/work/studies/scaling-cpu
    python -m idattn.sweep status --root=/work/studies/scaling-cpu
    python -m idattn.scaling fit --root=/work/studies/scaling-cpu --out=docs/scaling
    python -m idattn.train --config=experiments/sweeps/cpu_isoflop.py:<run name> --workdir=/tmp/x   # one run

Sizes: widths 16, 32, 48, 64, 96 under idattn.configs.sizes.CPU_RULE (aspect 32, d_h 16, SwiGLU hidden 8d/3 rounded up
to 32; 1, 1, 2, 2, 3 layers; non-embedding N = 4.1K, 13.4K, 55.5K, 106.8K, 332.5K for Softmax; d16 was added
after the first 24 runs put every IsoFLOP minimum at or below d32), M = 8 modes, a 512-piece
SentencePiece vocabulary trained on the corpus, context 64, batch 8 (512 tokens per step), float32.
Budgets: C = 3e10, 6e10, 1.2e11 FLOPs (C = 6·N·D, the Chinchilla convention); each size trains D = C / (6N)
tokens (rounded to whole steps), from 29 steps (d96 at the smallest C) to 9,400 steps (d16 at the largest).
30 runs; about 75 minutes on 2 CPU cores shared with other jobs (each run: 40-100 s of start-up and
compilation + its steps; 8 minutes on a quiet machine would be closer to 25).
Recipe: peak LR 3e-3 (S4D 1e-3), warmup 10% of the steps, cosine to 1e-4, AdamW wd 0.1, clip 1.0; validation
loss on the same 8 x 8 x 64 held-out tokens for every run, at the end only.
Expected: a fitted L(N, D) per mixer and IsoFLOP minima, with wide intervals (12 runs per mixer, tiny models,
< 1 epoch of a ~1M-token corpus at most): a workflow check, not a measurement of the paper's claim.
"""
from __future__ import annotations

import ml_collections

from idattn.configs import base_config
from idattn.configs.sizes import cpu_shape
from idattn.configs.runs import config_by_name, isoflop_tokens, make_run
from idattn.configs.sizes import non_embedding_params

STUDY = "cpu-iso"
MIXERS = ("softmax", "interdomain")
WIDTHS = (16, 32, 48, 64, 96)
BUDGETS = (3e10, 6e10, 1.2e11)


def base() -> ml_collections.ConfigDict:
    c = base_config()
    m = c.model
    m.dtype = "float32"  # CPU: bf16 matmuls are emulated and slow
    m.remat = "none"
    m.chunk_size = 16
    c.data.source = "kjv"
    c.data.tokenizer = "train:512"
    c.data.seq_len = 64
    c.data.prefetch = 0
    t = c.train
    t.batch_size = 8
    t.peak_lr = 3e-3
    t.end_lr = 1e-4
    t.ssm_lr_cap = 1e-3
    t.log_every = 20
    t.eval_every = 0  # validation at the last step only (the fit uses the final loss)
    t.eval_batches = 8
    t.checkpoint_every = 500
    t.keep_last = 1
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    return c


def get_sweep() -> list[ml_collections.ConfigDict]:
    b = base()
    tps = int(b.train.batch_size) * int(b.data.seq_len)
    out = []
    # order: size, budget, mixer (the two mixers alternate, so a study cut short still compares them)
    for width in WIDTHS:
        shape = cpu_shape(width)
        for cbudget in BUDGETS:
            for mixer in MIXERS:
                probe = make_run(b, study=STUDY, mixer=mixer, shape=shape, tokens=tps)
                n = non_embedding_params(probe.model)
                tokens = isoflop_tokens(cbudget, n, tps, min_steps=20)
                c = make_run(b, study=STUDY, mixer=mixer, shape=shape, tokens=tokens, compute=cbudget)
                c.train.warmup_steps = max(1, tokens // tps // 10)
                out.append(c)
    return out


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    sweep = get_sweep()
    return config_by_name(sweep, arg) if arg else sweep[0]
