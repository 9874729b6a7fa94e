"""The docs/pods.md table: every paper size x {softmax, interdomain, s4d_only} compiled ahead of time for a
topology a lab would rent for it, at the paper's global batch (128 x 4096 tokens).

    python -m idattn.aot.table --dir=aot-results [--run] [--steps=train,eval,decode]
    python -m idattn.aot.table --kind=long_context --dir=aot-long [--run] [--grid=...]   (idattn/aot/long_context.py)

--run compiles what is missing, one `python -m idattn.aot ... --json=<dir>/<mixer>-<size>.json` at a time (each
a subprocess: a fresh compiler per config); without it the table is printed from the JSON files already in
--dir. Every number in the table comes from those files (idattn/aot/compile.py).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# size -> topology (chips: v5p-N has N/2 chips): the smallest v5p slice that comfortably fits the paper batch
TOPOLOGY = {"125m": "v5p-32", "350m": "v5p-64", "760m": "v5p-64", "1.3b": "v5p-128"}
MIXERS = ("softmax", "interdomain", "s4d_only")
GiB = 1024 ** 3


def name(mixer: str, size: str) -> str:
    return f"{mixer}-{size}"


def aot_argv(mixer: str, size: str, out_dir: str, steps: str) -> list[str]:
    argv = [sys.executable, "-m", "idattn.aot", f"--config=experiments/scaling.py:{mixer},{size}",
            f"--topology={TOPOLOGY[size]}", f"--json={os.path.join(out_dir, name(mixer, size) + '.json')}",
            f"--steps={steps}"]
    if mixer != "softmax":
        argv.append("--config.model.impl=pallas")
    return argv


def launch_command(mixer: str, size: str) -> str:
    return (f"`python launch/tpu.py train --name=<slice> --zone=<zone> -- --config=experiments/scaling.py:{mixer},"
            f"{size} --workdir=<workdir> --config.data.source=arrayrecord --config.data.path=<data>`")


def row(rec: dict, mixer: str, size: str) -> str:
    steps = {s["name"]: s for s in rec["steps"]}
    tr = steps.get("train") or max(rec["steps"], key=lambda s: s["total"])
    m = rec["mesh"]
    worst = max(s["total"] for s in rec["steps"])
    others = ", ".join(f"{k} {v['total'] / GiB:.1f}" for k, v in steps.items() if k != "train")
    return (f"| {size} | {mixer} | {rec['topology']} ({len_chips(rec)} chips) | {m['data']}x{m['fsdp']}x{m['tensor']} | "
            f"{tr['total'] / GiB:.1f} ({tr['temp'] / GiB:.1f} temp) | {others or '-'} | "
            f"{worst / GiB:.1f} of {rec['hbm_bytes'] / GiB:.0f}: {'fits' if rec['fits'] else 'does not fit'} | "
            f"{tr['compile_s']:.0f} | {launch_command(mixer, size)} |")


def len_chips(rec: dict) -> int:
    m = rec["mesh"]
    return int(m["data"]) * int(m["fsdp"]) * int(m["tensor"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="aot-results")
    p.add_argument("--run", action="store_true", help="compile the missing configs first")
    p.add_argument("--steps", default="train,eval,decode")
    p.add_argument("--sizes", default=",".join(TOPOLOGY))
    p.add_argument("--kind", default="paper", choices=("paper", "long_context"),
                   help="paper: the paper batch table; long_context: docs/pods.md's Long context table "
                        "(idattn/aot/long_context.py)")
    p.add_argument("--grid", default="", help="long_context: <size>:<mixer>:<T>,... (default: 125m and 1.3b x "
                                              "interdomain and softmax x 131072, 524288, 1048576)")
    args = p.parse_args(argv)
    if args.kind == "long_context":
        from idattn.aot import long_context
        try:
            return long_context.main(args.dir, args.run, args.grid or None)
        except ValueError as e:
            p.error(str(e))
    os.makedirs(args.dir, exist_ok=True)
    sizes = [s for s in args.sizes.split(",") if s]
    for size in sizes:
        for mixer in MIXERS:
            path = os.path.join(args.dir, name(mixer, size) + ".json")
            if args.run and not os.path.exists(path):
                print("running: " + " ".join(aot_argv(mixer, size, args.dir, args.steps)), file=sys.stderr, flush=True)
                subprocess.run(aot_argv(mixer, size, args.dir, args.steps), check=False)
    print("| size | mixer | topology | mesh d x f x t | train step GiB per chip | eval / decode GiB | peak of HBM GiB"
          " | train compile s | launch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        for mixer in MIXERS:
            path = os.path.join(args.dir, name(mixer, size) + ".json")
            if not os.path.exists(path):
                print(f"| {size} | {mixer} | {TOPOLOGY[size]} | - | not compiled (no {path}) | | | | |")
                continue
            with open(path) as f:
                print(row(json.load(f), mixer, size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
