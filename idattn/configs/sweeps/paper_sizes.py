"""The paper's four sizes x three token budgets (0.5x, 1x, 2x App. A.2's), Softmax and Interdomain: 24 runs.

    python -m idattn.sweep experiments/sweeps/paper_sizes.py --root=/shared/runs/paper \
        --data_path=/shared/data/fineweb-edu --launcher=slurm --dry_run -- --nodes=4 --gpus_per_node=8
    python -m idattn.scaling fit --root=/shared/runs/paper

Shapes: idattn.configs.sizes.paper_shape at widths 768 / 1024 / 1536 / 2048 (= experiments/scaling.py's 125m / 350m /
760m / 1.3b exactly; tests/test_sweep.py checks it), the paper's recipe (peak LR per size, warmup 375M tokens,
cosine to 1e-5, batch 128 x 4096, S4D LR cap 1e-3, output gate off at 1.3B). The 1x runs are the paper's
Fig. 2 runs; the 0.5x and 2x runs give the D-dependence the parametric law needs. Data: prepared FineWeb-Edu
(`--data_path`, required). Expected: the 1x validation perplexities near the paper's (Fig. 2), and a fitted
L(N, D) per mixer whose difference test says whether Interdomain's advantage grows with compute.
"""
from __future__ import annotations

import ml_collections

from idattn.configs import base_config
from idattn.configs.sizes import PAPER_WIDTHS, paper_shape
from idattn.configs.runs import config_by_name, make_run

STUDY = "paper"
MIXERS = ("softmax", "interdomain")
TOKENS = {"125m": 2_500_000_000, "350m": 7_000_000_000, "760m": 15_000_000_000, "1.3b": 26_000_000_000}
PEAK_LR = {"125m": 3e-3, "350m": 1.5e-3, "760m": 1e-3, "1.3b": 1e-3}
MULTIPLIERS = (0.5, 1.0, 2.0)


def get_sweep() -> list[ml_collections.ConfigDict]:
    b = base_config()
    b.data.source = "arrayrecord"
    b.data.path = ""
    b.data.seq_len = 4096
    b.train.batch_size = 128
    b.train.warmup_tokens = 375_000_000
    b.train.ssm_lr_cap = 1e-3
    out = []
    for size, width in PAPER_WIDTHS.items():
        for mult in MULTIPLIERS:
            for mixer in MIXERS:
                c = make_run(b, study=STUDY, mixer=mixer, shape=paper_shape(width), tokens=int(TOKENS[size] * mult),
                             size=size)
                c.train.peak_lr = PEAK_LR[size]
                if size == "1.3b":
                    c.model.output_gate = False  # the paper: output gate off at 1.3B
                out.append(c)
    return out


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    sweep = get_sweep()
    return config_by_name(sweep, arg) if arg else sweep[0]
