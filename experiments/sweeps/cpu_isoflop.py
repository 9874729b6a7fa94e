"""CPU scaling study: Softmax and Interdomain, 5 sizes x 3 IsoFLOP compute budgets, on the embedded KJV corpus.

    python -m idattn.sweep experiments/sweeps/cpu_isoflop.py --root=/work/studies/scaling-cpu
    python -m idattn.sweep status --root=/work/studies/scaling-cpu
    python -m idattn.scaling fit --root=/work/studies/scaling-cpu --out=docs/scaling
    python -m idattn.train --config=experiments/sweeps/cpu_isoflop.py:<run name> --workdir=/tmp/x   # one run

Sizes: widths 16, 32, 48, 64, 96 under idattn.shapes.CPU_RULE (aspect 32, d_h 16, SwiGLU hidden 8d/3 rounded up
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

This file is the documented `--config=` path; the recipe itself lives in the package (idattn/configs/sweeps/cpu_isoflop.py), so that
an installed wheel runs it too. Everything here is re-exported from there.
"""
from idattn.configs.sweeps import cpu_isoflop as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
