"""MQAR configs: small 2-layer models trained on Zoology's multi-query associative recall.

    get_config("<mixer>[,<seq_len>,<pairs>]")   mixer: softmax | interdomain | s4d_only | a cube cell

The model is the `tiny` scaling size (d_model 64, 2 layers, 4 heads x 16, M = 8 modes) with a 256-token
vocabulary (keys 1..127, values 128..255; Zoology uses 8192, which a CPU run cannot afford to embed and learn
in minutes) and float32 compute. The `mqar` section holds the task and the optimiser (AdamW, warmup + cosine,
loss at query positions only, as Zoology trains).

Run (prints a table; writes one result file per mixer when --workdir is given). Cost of 3000 steps: ~10-30 s
per mixer on one H200, ~70 ms/step softmax on 16 CPU cores, ~1 s/step on a busy 2-core machine:
    python experiments/mqar.py --mixers=softmax,interdomain,s4d_only --steps=3000

This file is the documented `--config=` path; the recipe itself lives in the package (idattn/configs/mqar.py), so that
an installed wheel runs it too. Everything here is re-exported from there.
"""
from idattn.configs import mqar as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})

if __name__ == "__main__":
    _module.main()
