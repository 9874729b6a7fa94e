"""The CPU quickstart: train tiny Softmax, Interdomain and S4D-only models on the embedded KJV corpus, evaluate
validation perplexity and a length sweep past the training context, print one table and save a plot.

    python -m idattn.quickstart [--workdir=./idattn-quickstart] [--mixers=softmax,interdomain,s4d_only]
                                [--steps=N] [--fresh]

Config: experiments/quickstart.py (model sizes, steps, tokenizer). Each model is trained by the real trainer
(`idattn.train.run`, the code path of `python -m idattn.train`) in <workdir>/<mixer> (the workdir, under the current
folder by default, is the first line printed). A rerun reuses a finished run, or resumes an unfinished one, only
when its code (the hashes of the model and training code, idattn.studies.code_hash) and its resolved config are
this invocation's; otherwise the old run is moved to <mixer>.stale-<n> and trained again. A reused run's training
time is the one it recorded, marked "(reused)" in the table (--fresh starts over). Evaluation: token-level perplexity exp(Σ m·nll / Σ m) over the same
first 64,512 held-out tokens at every length L, cut into rows of L tokens (each row a fresh context; a row
that starts inside a document sees no earlier context). Unigram baseline: add-one smoothed frequencies of
the target tokens of the training batches the models saw (same stream, same number of tokens), scored on the
same held-out tokens. Results: the table on stdout, <workdir>/quickstart.json, <workdir>/quickstart.png, and
`extrapolation` result JSON in each run directory (idattn.rundir.schema).
Pass criterion (exit code 1 otherwise): every model's perplexity at the training length is finite and at
least 30% below the unigram baseline.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import shutil
import sys
import time

import jax
import numpy as np
from absl import logging as absl_logging

from idattn import atomic, train as trainer
from idattn.configs import packaged_config, quickstart as experiment
from idattn.data import pipeline, tokenizer as tok_lib
from idattn.eval.figures import save_figure, subplots
from idattn.eval.markdown import markdown_table
from idattn.eval.perplexity import eval_batches, perplexities
from idattn.rundir.layout import config_to_dict, read_json
from idattn.rundir.schema import read_results, write_result
from idattn.studies.claims import label
from idattn.studies.code_hash import current_train_hash, source_hash, train_code_hash
from idattn.studies.runcache import write_marker

QUICKSTART_CONFIG = packaged_config("quickstart")  # experiments/quickstart.py re-exports it
REQUIRED_GAIN = 0.30


def unigram_baseline(config, tokenizer, lengths, total_tokens, train_batches: int) -> tuple[dict[int, float], int]:
    v = int(config.model.vocab_size)
    counts = np.zeros(v, np.float64)
    it = pipeline.make_train_iterator(config.data, tokenizer, global_batch_size=int(config.train.batch_size),
                                      seq_len=int(config.data.seq_len), seed=int(config.data.shuffle_seed))
    for _ in range(train_batches):
        b = next(it)
        np.add.at(counts, b["targets"][b["loss_mask"] > 0], 1.0)
    if hasattr(it, "close"):
        it.close()
    logp = np.log((counts + 1.0) / (counts.sum() + v))
    out = {}
    for length in lengths:
        s = c = 0.0
        for batch in eval_batches(config, tokenizer, length, total_tokens):
            s -= float((logp[batch["targets"]] * batch["loss_mask"]).sum())
            c += float(batch["loss_mask"].sum())
        out[length] = math.exp(s / c)
    return out, int(counts.sum())


def plot(path: str, lengths, rows, unigram, train_len: int, eval_tokens: int) -> dict[str, str]:
    """The length sweep (what `perplexities` measured: the first `eval_tokens` held-out tokens in rows of L
    tokens), not the trainer's validation perplexity; returns the axis labels and title as drawn."""
    fig, ax = subplots(figsize=(6, 4))
    for r in rows:
        ax.plot(lengths, [r["ppl"][L] for L in lengths], marker="o", label=r["name"])
    ax.plot(lengths, [unigram[L] for L in lengths], ls="--", color="gray", label="Unigram")
    ax.axvline(train_len, color="k", lw=0.8, ls=":")
    ax.text(train_len, ax.get_ylim()[1], " train length", va="top", fontsize=8)
    ax.set(xlabel="evaluation context length L (tokens)", yscale="log", xticks=list(lengths),
           title="Quickstart length sweep: tiny models on the KJV corpus")
    ax.set_ylabel(f"perplexity per token, log scale\n(first {eval_tokens:,} held-out KJV tokens, rows of L)",
                  fontsize=8)
    ax.legend(fontsize=8)
    labels = {"xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "title": ax.get_title()}
    save_figure(fig, path, dpi=120)
    return labels


def format_table(lengths, rows, unigram, train_len: int) -> str:
    # ppl ratio to Softmax at the training length (the paper's "vs Softmax" column of Table 4, as a ratio)
    soft = next((r["ppl"][train_len] for r in rows if r["mixer"] == "softmax"), None)
    head = (["model", "params", "train s"] + [f"ppl@{L}" for L in lengths]
            + [f"vs unigram @{train_len}", f"ppl / Softmax @{train_len}"])
    rows_out = [["Unigram", "-", "-"] + [f"{unigram[L]:.2f}" for L in lengths]
                + ["+0.0%", f"{unigram[train_len] / soft:.3f}" if soft else "-"]]
    for r in rows:
        gain = 1.0 - r["ppl"][train_len] / unigram[train_len]
        rows_out.append([r["name"], f"{r['params']:,}", f"{r['train_s']:.0f}" + (" (reused)" if r.get("reused") else "")] + [f"{r['ppl'][L]:.2f}" for L in lengths]
                        + [f"{-100 * gain:+.1f}%", f"{r['ppl'][train_len] / soft:.3f}" if soft else "-"])
    return markdown_table(head, rows_out)


RUN_MARKER = "quickstart-run.json"  # per run: code and config hashes, recorded training seconds, finished


def run_identity(config) -> dict[str, str]:
    """What makes a finished quickstart run reusable: the code that trains and evaluates it (idattn.studies.code_hash)
    and its config."""
    cfg = json.dumps(config_to_dict(config), sort_keys=True, default=str)
    return {"code": f"{source_hash()}-{train_code_hash()}", "config": hashlib.sha1(cfg.encode()).hexdigest()[:12]}


def claim_run(wd: str, ident: dict[str, str], log=print) -> dict:
    """The run's recorded marker when `wd` may be reused or resumed (same code and config), else {} after moving
    an old run of other code or config (or without a marker) aside to <wd>.stale-<n>."""
    if not os.path.exists(wd):
        return {}
    rec = read_json(os.path.join(wd, RUN_MARKER), {}, (OSError, ValueError))
    if rec.get("code"):  # "<model hash>-<training hash>": a v1 training hash of migrated code reads as its v2 value
        model_src, _, train_src = rec["code"].rpartition("-")
        rec["code"] = f"{model_src}-{current_train_hash(train_src)}"
    if rec and all(rec.get(k) == v for k, v in ident.items()):
        return rec
    n = 1
    while os.path.exists(f"{wd}.stale-{n}"):
        n += 1
    os.replace(wd, f"{wd}.stale-{n}")
    why = ("its code or config differ from this invocation's" if rec else "it has no quickstart record")
    log(f"{wd}: {why}; moved to {wd}.stale-{n}, training again")
    return {}


write_run_marker = functools.partial(write_marker, name=RUN_MARKER)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="idattn-quickstart", help="where the runs, table and plot go (default: "
                   "./idattn-quickstart, under the current folder)")
    p.add_argument("--mixers", default="softmax,interdomain,s4d_only")
    p.add_argument("--steps", type=int, default=0, help="override train.num_steps (0: the config's)")
    p.add_argument("--fresh", action="store_true", help="delete earlier quickstart runs in --workdir first")
    args = p.parse_args(argv)

    t0 = time.time()
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file at INFO
    exp = experiment
    lengths = tuple(exp.EVAL_LENGTHS)
    mixers = [m.strip() for m in args.mixers.split(",") if m.strip()]
    args.workdir = os.path.abspath(args.workdir)
    print(f"idattn quickstart: workdir {args.workdir}", flush=True)
    os.makedirs(args.workdir, exist_ok=True)
    print(f"{', '.join(mixers)} on the KJV corpus; {jax.device_count()} x {jax.devices()[0].device_kind}", flush=True)
    rows = []
    config = None
    for mixer in mixers:
        config = exp.get_config(mixer)
        if args.steps > 0:
            config.train.num_steps = args.steps
            config.train.warmup_steps = min(int(config.train.warmup_steps), args.steps)
        wd = os.path.join(args.workdir, mixer)
        if args.fresh and os.path.exists(wd):
            shutil.rmtree(wd)
        print(f"\n=== {label(mixer)}: python -m idattn.train --config={QUICKSTART_CONFIG}:{mixer} "
              f"--workdir={wd}", flush=True)
        ident = run_identity(config)
        rec = claim_run(wd, ident)
        reused = bool(rec.get("finished"))
        ts = time.time()
        write_run_marker(wd, dict(rec, **ident, finished=reused, train_s=float(rec.get("train_s", 0.0))))
        summary = trainer.run(config, wd)
        # a reused run reports the time it recorded; a resumed one its earlier time plus this invocation's
        train_s = float(rec.get("train_s", 0.0)) + (0.0 if reused else time.time() - ts)
        write_run_marker(wd, dict(ident, finished=summary["status"] == "done", train_s=train_s))
        if summary["status"] == "preempted":
            print("stopped by SIGTERM; rerun to continue", file=sys.stderr)
            return 143
        if reused:
            print(f"{label(mixer)}: reused the finished run in {wd} (same code and config; trained in "
                  f"{train_s:.0f} s then)", flush=True)
        cfg, params = trainer.load_params(wd)
        tokenizer = tok_lib.load_tokenizer(cfg.data.tokenizer)
        ppl = perplexities(cfg, params, tokenizer, lengths, exp.EVAL_TOKENS)
        step = int(cfg.train.num_steps)
        # the length sweep is measured on EVAL_TOKENS held-out tokens (its own protocol, named in its file), not
        # on the trainer's validation tokens: its ppl@<train length> is not "the validation perplexity"
        write_result(wd, "extrapolation", step, {f"kjv.val/ppl@{L}": v for L, v in ppl.items()},
                     run={"workdir": wd, "mixer": mixer, "params": summary["num_params"], "size": "quickstart"},
                     details={"eval_tokens": exp.EVAL_TOKENS, "train_seq_len": int(cfg.data.seq_len)},
                     protocol={"corpus": "kjv.val", "tokens": exp.EVAL_TOKENS, "context": list(lengths),
                               "method": "rows of L tokens from the first eval_tokens held-out tokens"})
        val = [r for r in read_results(wd, "validation") if not r["tagged"] and r["step"] == step]
        rows.append({"mixer": mixer, "name": label(mixer), "params": summary["num_params"],
                     "train_s": train_s, "reused": reused, "ppl": ppl, "val_ppl": val[0]["metrics"]["ppl"] if val else float("nan"),
                     "val_tokens": int(val[0]["details"].get("tokens", 0)) if val else 0})
        print(f"{label(mixer)}: " + ", ".join(f"ppl@{L} {v:.2f}" for L, v in ppl.items())
              + f"  ({time.time() - ts:.0f} s)", flush=True)

    unigram, n_tok = unigram_baseline(config, tokenizer, lengths, exp.EVAL_TOKENS, int(config.train.num_steps))
    train_len = int(config.data.seq_len)
    table = format_table(lengths, rows, unigram, train_len)
    png = os.path.join(args.workdir, "quickstart.png")
    plot(png, lengths, rows, unigram, train_len, exp.EVAL_TOKENS)
    ok = all(math.isfinite(r["ppl"][train_len]) and r["ppl"][train_len] <= (1 - REQUIRED_GAIN) * unigram[train_len]
             for r in rows)
    wall = time.time() - t0
    atomic.write_json(os.path.join(args.workdir, "quickstart.json"),
                      {"lengths": list(lengths), "unigram": unigram, "unigram_train_tokens": n_tok, "models": rows,
                       "wall_time_s": wall, "pass": ok}, indent=1, default=str)
    print(f"\nPerplexity at each evaluation length on the first {exp.EVAL_TOKENS:,} held-out KJV tokens (trained at "
          f"context {train_len}; unigram from {n_tok:,} training tokens):\n")
    print(table)
    vt = next((r["val_tokens"] for r in rows if r["val_tokens"]), 0)
    print(f"\nValidation perplexity (the trainer's: first {vt:,} held-out tokens at context {train_len}; the number "
          "in idattn.results and `python -m idattn.eval --suite=validation`). It differs from ppl@"
          f"{train_len} above only by the tokens scored ({vt:,} vs {exp.EVAL_TOKENS:,}):\n")
    print(markdown_table(["model", "validation ppl"], [[r["name"], f"{r['val_ppl']:.2f}"] for r in rows]))
    print(f"\nplot: {png}\ntotal wall time {wall / 60:.1f} min")
    print(("PASS" if ok else "FAIL") + f": every model's ppl@{train_len} finite and >= {100 * REQUIRED_GAIN:.0f}% "
          f"below the unigram baseline")
    return 0 if ok else 1
