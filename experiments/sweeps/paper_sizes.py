"""The paper's four sizes x three token budgets (0.5x, 1x, 2x App. A.2's), Softmax and Interdomain: 24 runs.

    python -m idattn.sweep experiments/sweeps/paper_sizes.py --root=/shared/runs/paper \
        --data_path=/shared/data/fineweb-edu --launcher=slurm --dry_run -- --nodes=4 --gpus_per_node=8
    python -m idattn.scaling fit --root=/shared/runs/paper

Shapes: idattn.shapes.paper_shape at widths 768 / 1024 / 1536 / 2048 (= experiments/scaling.py's 125m / 350m /
760m / 1.3b exactly; tests/test_sweep.py checks it), the paper's recipe (peak LR per size, warmup 375M tokens,
cosine to 1e-5, batch 128 x 4096, S4D LR cap 1e-3, output gate off at 1.3B). The 1x runs are the paper's
Fig. 2 runs; the 0.5x and 2x runs give the D-dependence the parametric law needs. Data: prepared FineWeb-Edu
(`--data_path`, required). Expected: the 1x validation perplexities near the paper's (Fig. 2), and a fitted
L(N, D) per mixer whose difference test says whether Interdomain's advantage grows with compute.

This file is the documented `--config=` path; the recipe itself lives in the package (idattn/configs/sweeps/paper_sizes.py), so that
an installed wheel runs it too. Everything here is re-exported from there.
"""
from idattn.configs.sweeps import paper_sizes as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
