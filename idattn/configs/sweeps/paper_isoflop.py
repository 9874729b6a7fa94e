"""Paper-recipe IsoFLOP study for a pod: Softmax and Interdomain, 3 compute budgets x 5 sizes each.

    python -m idattn.sweep experiments/sweeps/paper_isoflop.py --root=/shared/runs/iso \
        --data_path=/shared/data/fineweb-edu --launcher=slurm --dry_run -- --nodes=1 --gpus_per_node=8
    python -m idattn.sweep experiments/sweeps/paper_isoflop.py --root=/mnt/runs/iso \
        --data_path=/mnt/data/fineweb-edu --launcher=tpu --dry_run -- --zone=us-east5-a --type=v5p-64
    python -m idattn.scaling fit --root=/shared/runs/iso

Sizes from idattn.configs.sizes.PAPER_RULES (the paper's banded shape rules; widths 512-2048 give 8-24 layers,
~25M-1.2B non-embedding parameters), 32K tokenizer, context 4096, batch 128, the paper's App. A.2 recipe
(warmup 375M tokens or 10% of the run if shorter, cosine to 1e-5, S4D LR cap 1e-3) with the peak LR
interpolated log-linearly in N between the paper's (3e-3 at 125M, 1.5e-3 at 350M, 1e-3 at 760M and above).
Budgets C = 6·N·D = 3e18, 1e19, 3e19 FLOPs (the paper's 125M run is 1.3e18, its 1.3B run 1.9e20); each size
trains D = C / (6N) tokens (whole steps of 524,288): from 0.4B tokens (1.3B at 3e18) to 195B (d512 at 3e19).
Data: prepared FineWeb-Edu shards (`--data_path`, required; see docs/data.md). 30 runs; ~4.3e20 FLOPs in all.
Expected: for each mixer an IsoFLOP minimum per budget and N_opt ∝ C^a with a near 0.5 (Chinchilla).
"""
from __future__ import annotations

import math

import ml_collections

from idattn.configs import base_config
from idattn.configs.sizes import non_embedding_params, paper_shape
from idattn.configs.runs import config_by_name, isoflop_tokens, make_run

STUDY = "paper-iso"
MIXERS = ("softmax", "interdomain")
WIDTHS = (512, 768, 1024, 1536, 2048)
BUDGETS = (3e18, 1e19, 3e19)
PAPER_NAMES = {768: "125m", 1024: "350m", 1536: "760m", 2048: "1.3b"}


def peak_lr(n_params: float) -> float:
    """The paper's peak LRs (3e-3 at 125M, 1.5e-3 at 350M, 1e-3 from 760M), log-linear in N between them."""
    pts = [(85e6, 3e-3), (302e6, 1.5e-3), (680e6, 1e-3)]  # non-embedding N of the paper's sizes (approx.)
    if n_params <= pts[0][0]:
        return pts[0][1]
    if n_params >= pts[-1][0]:
        return pts[-1][1]
    for (n0, l0), (n1, l1) in zip(pts, pts[1:]):
        if n_params <= n1:
            w = (math.log(n_params) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return float(math.exp((1 - w) * math.log(l0) + w * math.log(l1)))
    return pts[-1][1]


def base() -> ml_collections.ConfigDict:
    c = base_config()
    c.data.source = "arrayrecord"  # prepared data; the sweep refuses to start without --data_path
    c.data.path = ""
    c.data.seq_len = 4096
    t = c.train
    t.batch_size = 128
    t.ssm_lr_cap = 1e-3
    t.eval_every = 1000
    t.checkpoint_every = 1000
    return c


def get_sweep() -> list[ml_collections.ConfigDict]:
    b = base()
    tps = int(b.train.batch_size) * int(b.data.seq_len)
    out = []
    for cbudget in BUDGETS:
        for width in WIDTHS:
            shape = paper_shape(width)
            for mixer in MIXERS:
                probe = make_run(b, study=STUDY, mixer=mixer, shape=shape, tokens=tps)
                n = non_embedding_params(probe.model)
                tokens = isoflop_tokens(cbudget, n, tps, min_steps=100)
                c = make_run(b, study=STUDY, mixer=mixer, shape=shape, tokens=tokens, compute=cbudget,
                             size=PAPER_NAMES.get(width, ""))
                c.train.peak_lr = peak_lr(n)
                c.train.warmup_tokens = min(375_000_000, tokens // 10)
                out.append(c)
    return out


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    sweep = get_sweep()
    return config_by_name(sweep, arg) if arg else sweep[0]
