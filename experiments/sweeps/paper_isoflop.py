"""Paper-recipe IsoFLOP study for a pod: Softmax and Interdomain, 3 compute budgets x 5 sizes each.

    python -m idattn.sweep experiments/sweeps/paper_isoflop.py --root=/shared/runs/iso \
        --data_path=/shared/data/fineweb-edu --launcher=slurm --dry_run -- --nodes=1 --gpus_per_node=8
    python -m idattn.sweep experiments/sweeps/paper_isoflop.py --root=/mnt/runs/iso \
        --data_path=/mnt/data/fineweb-edu --launcher=tpu --dry_run -- --zone=us-east5-a --type=v5p-64
    python -m idattn.scaling fit --root=/shared/runs/iso

Sizes from idattn.shapes.PAPER_RULES (the paper's banded shape rules; widths 512-2048 give 8-24 layers,
~25M-1.2B non-embedding parameters), 32K tokenizer, context 4096, batch 128, the paper's App. A.2 recipe
(warmup 375M tokens or 10% of the run if shorter, cosine to 1e-5, S4D LR cap 1e-3) with the peak LR
interpolated log-linearly in N between the paper's (3e-3 at 125M, 1.5e-3 at 350M, 1e-3 at 760M and above).
Budgets C = 6·N·D = 3e18, 1e19, 3e19 FLOPs (the paper's 125M run is 1.3e18, its 1.3B run 1.9e20); each size
trains D = C / (6N) tokens (whole steps of 524,288): from 0.4B tokens (1.3B at 3e18) to 195B (d512 at 3e19).
Data: prepared FineWeb-Edu shards (`--data_path`, required; see docs/data.md). 30 runs; ~4.3e20 FLOPs in all.
Expected: for each mixer an IsoFLOP minimum per budget and N_opt ∝ C^a with a near 0.5 (Chinchilla).

This file is the documented `--config=` path; the recipe itself lives in the package (idattn/configs/sweeps/paper_isoflop.py), so that
an installed wheel runs it too. Everything here is re-exported from there.
"""
from idattn.configs.sweeps import paper_isoflop as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
