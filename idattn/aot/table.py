"""The docs/pods.md table: every paper size x {softmax, interdomain, s4d_only} compiled ahead of time for a
topology a lab would rent for it, at the paper's global batch (128 x 4096 tokens).

    python -m idattn.aot.table --dir=aot-results [--run] [--steps=train,eval,decode]
    python -m idattn.aot.table --kind=configs --dir=aot-configs [--run]      (CONFIGS below: hybrids, selective)
    python -m idattn.aot.table --kind=long_context --dir=docs/aot/long [--run] [--grid=...]   (idattn/aot/long_context.py)

--run compiles what is missing, one `python -m idattn.aot ... --json=<dir>/<mixer>-<size>.json` at a time (each
a subprocess: a fresh compiler per config); without it the table is printed from the JSON files already in
--dir. Every number in the table comes from those files (idattn/aot/compile.py).

docs/pods.md's fit tables are rendered from the records committed under docs/aot/ (tests/test_aot_table.py
checks every figure against them); after recompiling, rewrite them in place with

    python -m idattn.aot.table --dir=docs/aot/paper --doc=docs/pods.md
    python -m idattn.aot.table --kind=configs --dir=docs/aot/configs --doc=docs/pods.md
    python -m idattn.aot.table --kind=long_context --dir=docs/aot/long --doc=docs/pods.md
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from idattn.aot import long_context

# size -> topology (chips: v5p-N has N/2 chips): the smallest v5p slice that comfortably fits the paper batch
TOPOLOGY = {"125m": "v5p-32", "350m": "v5p-64", "760m": "v5p-64", "1.3b": "v5p-128"}
MIXERS = ("softmax", "interdomain", "s4d_only")
GiB = 1024 ** 3
# The `configs` table: configs past the paper's three mixers, (record name, config, topology, what it is)
CONFIGS = (
    ("hybrid-interdomain-softmax-1to3-1.3b", "experiments/hybrid.py:interdomain,softmax,1:3,1.3b", "v5p-128",
     "Interdomain + global attention every 4th layer"),
    ("hybrid-interdomain-swa-1to3-125m", "experiments/hybrid.py:interdomain,swa,1:3,125m", "v5p-32",
     "sliding window 2048, the splash window kernel"),
    ("interdomain-selective-125m", "experiments/scaling.py:interdomain-selective,125m", "v5p-32",
     "selective core, chunked XLA form; docs/model.md"),
    ("interdomain-selective-125m-h200x8", "experiments/scaling.py:interdomain-selective,125m", "h200x8",
     "selective core, chunked XLA form, 8 H200s"),
)
MARKERS = {"paper": ("<!-- idattn.aot.table --kind=paper: begin -->", "<!-- idattn.aot.table --kind=paper: end -->"),
           "configs": ("<!-- idattn.aot.table --kind=configs: begin -->",
                       "<!-- idattn.aot.table --kind=configs: end -->"),
           "long_context": ("<!-- idattn.aot.table --kind=long_context: begin -->",
                            "<!-- idattn.aot.table --kind=long_context: end -->")}


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


def render_paper(out_dir: str, sizes) -> list[str]:
    lines = ["| size | mixer | topology | mesh d x f x t | train step GiB per chip | eval / decode GiB | peak of HBM GiB"
             " | train compile s | launch |", "|---|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        for mixer in MIXERS:
            path = os.path.join(out_dir, name(mixer, size) + ".json")
            if not os.path.exists(path):
                lines.append(f"| {size} | {mixer} | {TOPOLOGY[size]} | - | not compiled (no {path}) | | | | |")
                continue
            with open(path) as f:
                lines.append(row(json.load(f), mixer, size))
    return lines


def config_row(rec: dict, what: str) -> str:
    tr = {s["name"]: s for s in rec["steps"]}.get("train") or max(rec["steps"], key=lambda s: s["total"])
    m = rec["mesh"]
    unit = "GPUs" if "h100" in rec["topology"] or "h200" in rec["topology"] else "chips"
    return (f"| `{rec['config']}` ({what}) | {rec['topology']} ({len_chips(rec)} {unit}) | "
            f"{m['data']}x{m['fsdp']}x{m['tensor']} | {tr['total'] / GiB:.2f} ({tr['temp'] / GiB:.2f} temp) | "
            f"{tr['total'] / GiB:.2f} of {rec['hbm_bytes'] / GiB:.0f}: {'fits' if rec['fits'] else 'does not fit'} | "
            f"{tr['compile_s']:.0f} |")


def render_configs(out_dir: str) -> list[str]:
    lines = ["| config | topology | mesh d x f x t | train step GiB per device | fits | compile s |",
             "|---|---|---|---|---|---|"]
    for rec_name, config, topo, what in CONFIGS:
        path = os.path.join(out_dir, rec_name + ".json")
        if not os.path.exists(path):
            lines.append(f"| `{config}` ({what}) | {topo} | - | not compiled (no {path}) | | |")
            continue
        with open(path) as f:
            lines.append(config_row(json.load(f), what))
    return lines


def write_doc(doc: str, kind: str, lines: list[str]) -> None:
    """Replaces the text between the `kind` table's markers in `doc` by `lines` (refuses a doc without them)."""
    begin, end = MARKERS[kind]
    with open(doc) as f:
        text = f.read()
    if begin not in text or end not in text:
        raise ValueError(f"--doc={doc}: no {begin} ... {end} markers to write the {kind} table between")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    with open(doc, "w") as f:
        f.write(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)


def doc_table(doc: str, kind: str) -> list[str]:
    """The lines between the `kind` table's markers in `doc` (what write_doc wrote)."""
    begin, end = MARKERS[kind]
    with open(doc) as f:
        text = f.read()
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n").splitlines()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="aot-results")
    p.add_argument("--run", action="store_true", help="compile the missing configs first")
    p.add_argument("--steps", default="train,eval,decode")
    p.add_argument("--sizes", default=",".join(TOPOLOGY))
    p.add_argument("--kind", default="paper", choices=("paper", "configs", "long_context", "state_passing"),
                   help="paper: the paper batch table; configs: CONFIGS (hybrids, the selective core); "
                        "long_context: docs/pods.md's Long context table (idattn/aot/long_context.py)")
    p.add_argument("--grid", default="", help="long_context: <size>:<mixer>:<T>[:<slice>],... (default: 125m and "
                                              "1.3b x interdomain and softmax x 128K, 512K, 1M, 2M x v5p-128, "
                                              "v5p-64)")
    p.add_argument("--doc", default="", help="also write the table between its markers in this Markdown file "
                                             "(docs/pods.md)")
    args = p.parse_args(argv)
    if args.kind == "state_passing":  # a cost model: nothing to compile (idattn/aot/long_context.py)
        print(long_context.state_passing_table())
        return 0
    if args.kind == "long_context":
        try:
            lines: list[str] = []
            rc = long_context.main(args.dir, args.run, args.grid or None, log=lines.append)
        except ValueError as e:
            p.error(str(e))
        print("\n".join(lines))
        if args.doc:
            write_doc(args.doc, "long_context", lines)
        return rc
    os.makedirs(args.dir, exist_ok=True)
    if args.kind == "configs":
        for rec_name, config, topo, _ in CONFIGS:
            path = os.path.join(args.dir, rec_name + ".json")
            if args.run and not os.path.exists(path):
                argv = [sys.executable, "-m", "idattn.aot", f"--config={config}", f"--topology={topo}",
                        f"--json={path}", "--steps=train"]
                print("running: " + " ".join(argv), file=sys.stderr, flush=True)
                subprocess.run(argv, check=False)
        lines = render_configs(args.dir)
    else:
        sizes = [s for s in args.sizes.split(",") if s]
        for size in sizes:
            for mixer in MIXERS:
                path = os.path.join(args.dir, name(mixer, size) + ".json")
                if args.run and not os.path.exists(path):
                    print("running: " + " ".join(aot_argv(mixer, size, args.dir, args.steps)), file=sys.stderr,
                          flush=True)
                    subprocess.run(aot_argv(mixer, size, args.dir, args.steps), check=False)
        lines = render_paper(args.dir, sizes)
    print("\n".join(lines))
    if args.doc:
        try:
            write_doc(args.doc, args.kind, lines)
        except ValueError as e:
            p.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
