"""MQAR configs: small 2-layer models trained on Zoology's multi-query associative recall.

    get_config("<mixer>[,<seq_len>,<pairs>]")   mixer: softmax | interdomain | s4d_only | a cube cell

The model is the `tiny` scaling size (d_model 64, 2 layers, 4 heads x 16, M = 8 modes) with a 256-token
vocabulary (keys 1..127, values 128..255; Zoology uses 8192, which a CPU run cannot afford to embed and learn
in minutes) and float32 compute. The `mqar` section holds the task and the optimiser (AdamW, warmup + cosine,
loss at query positions only, as Zoology trains).

Run (prints a table; writes one result file per mixer when --workdir is given). Cost of 3000 steps: ~10-30 s
per mixer on one H200, ~70 ms/step softmax on 16 CPU cores, ~1 s/step on a busy 2-core machine:
    python experiments/mqar.py --mixers=softmax,interdomain,s4d_only --steps=3000
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import ml_collections

from idattn.configs.scaling import get_config as scaling_config


def get_config(arg: str = "softmax") -> ml_collections.ConfigDict:
    parts = [p.strip() for p in str(arg).split(",")]
    if len(parts) not in (1, 3):
        raise ValueError(f"experiments/mqar.py: got {arg!r}; expected '<mixer>' or '<mixer>,<seq_len>,<pairs>'.")
    c = scaling_config(f"{parts[0]},tiny")
    c.model.vocab_size = 256
    c.model.impl = "chunked"
    c.model.dtype = "float32"
    c.model.remat = "none"
    c.mqar = ml_collections.ConfigDict(dict(
        seq_len=int(parts[1]) if len(parts) == 3 else 64, num_kv_pairs=int(parts[2]) if len(parts) == 3 else 4,
        vocab_size=256, num_train=20_000, num_test=1_000, steps=3_000, batch_size=64, lr=1e-3,
        weight_decay=0.1, warmup=100, seed=0))
    return c


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixers", default="softmax,interdomain,s4d_only")
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--workdir", default="", help="write <workdir>/<mixer>/eval/recall-step*.json")
    args = ap.parse_args(argv)
    from idattn.eval.recall import train_mqar
    from idattn.rundir.schema import write_result

    rows = []
    for mixer in args.mixers.split(","):
        c = get_config(f"{mixer},{args.seq_len},{args.pairs}")
        q = c.mqar
        steps = args.steps or q.steps
        res = train_mqar(c.model, seq_len=q.seq_len, num_kv_pairs=q.num_kv_pairs, vocab_size=q.vocab_size,
                         num_train=q.num_train, num_test=q.num_test, steps=steps, batch_size=q.batch_size,
                         lr=args.lr or q.lr, weight_decay=q.weight_decay, warmup=q.warmup, seed=q.seed,
                         test_grid=((64, 8), (64, 16), (128, 32)), log=lambda s: print(f"[{mixer}] {s}", flush=True))
        res.pop("params")
        rows.append((mixer, res))
        if args.workdir:
            metrics = {f"mqar@{q.seq_len}x{q.num_kv_pairs}/acc": res["acc"]}
            metrics.update({f"mqar@{k.replace('/', 'x')}/acc": v for k, v in res["grid"].items()})
            write_result(os.path.join(args.workdir, mixer.replace("/", "_")), "recall", steps, metrics,
                         run={"mixer": mixer, "size": "tiny", "task": "mqar"}, details=res)
    print(f"\nMQAR T={args.seq_len} pairs={args.pairs}")
    print("| mixer | query acc | final loss | steps | seconds | other (T/pairs: acc) |")
    print("|---|---|---|---|---|---|")
    for mixer, r in rows:
        grid = ", ".join(f"{k}: {v:.3f}" for k, v in r["grid"].items())
        print(f"| {mixer} | {r['acc']:.4f} | {r['loss']:.4f} | {r['steps']} | {r['train_seconds']:.0f} | {grid} |")
    print(json.dumps({m: {"acc": r["acc"], "grid": r["grid"]} for m, r in rows}))


if __name__ == "__main__":
    main()
