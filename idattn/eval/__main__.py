"""Evaluate a checkpoint: `python -m idattn.eval --workdir=DIR --suite=validation,extrapolation,harness,...`.

Suites (each writes `<workdir>/eval/<suite>-step<step>.json` through `idattn.eval.schema.write_result`):
  validation     token perplexity of the run's held-out split, packed exactly as the trainer's validation
                 (`make_eval_batches`), or of `--val_path` documents (jsonl/parquet/json text, or .npy tokens)
                 with rolling windows at the model's context
  extrapolation  perplexity at `--lengths` on the long-document corpora in `--data_dir/<corpus>` (or `--hub`),
                 per corpus and position bucket, plus a PNG plot beside the JSON
  harness        the eight-task suite + WikiText-2 + OpenBookQA from `--data_dir/<task>` (or `--hub`)
  recall         RULER S-NIAH-1 at `--niah_lengths`, phonebook at `--phonebook_sizes`
  decode         ms/token and tokens/s against context and batch, prefill memory (chunked and full)

The checkpoint comes from `idattn.train.checkpoint.load_params(workdir, step)`; `--config=<file.py>:<arg>
--random_init` evaluates a freshly initialised model instead (decode benchmarks, smoke tests; step -1).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any

SUITES = ("validation", "extrapolation", "harness", "recall", "decode")


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m idattn.eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--suite", default="validation", help=f"comma-separated subset of {SUITES}")
    ap.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    ap.add_argument("--config", default="", help="experiments/<file>.py:<arg> (with --random_init)")
    ap.add_argument("--random_init", action="store_true", help="evaluate a random-init model built from --config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key, e.g. --set=model.impl=chunked (repeatable)")
    ap.add_argument("--batch_size", type=int, default=8)
    ap.add_argument("--max_length", type=int, default=0, help="scoring context (default: config.data.seq_len)")
    ap.add_argument("--data_dir", default="", help="folder of <task>/ and <corpus>/ dataset files")
    ap.add_argument("--hub", action="store_true", help="download missing datasets with `datasets`")
    ap.add_argument("--limit", type=int, default=0, help="documents per task/corpus (0: all)")
    ap.add_argument("--tasks", default="", help="harness tasks (default: the eight + wikitext + openbookqa)")
    ap.add_argument("--add_bos", action="store_true", help="harness: prepend BOS to every context")
    ap.add_argument("--val_path", default="", help="validation: documents to score instead of the run's split")
    ap.add_argument("--val_batches", type=int, default=0, help="validation: packed batches (default train.eval_batches)")
    ap.add_argument("--lengths", default="", help="extrapolation lengths (default: 1x, 2x, 3.5x the train length)")
    ap.add_argument("--corpora", default="pg19,codeparrot,govreport,qasper,qmsum,narrativeqa")
    ap.add_argument("--niah_lengths", default="1024,2048,4096,8192")
    ap.add_argument("--phonebook_sizes", default="16,32,64,128")
    ap.add_argument("--recall_n", type=int, default=200)
    ap.add_argument("--decode_contexts", default="512,2048,8192")
    ap.add_argument("--decode_batches", default="1,8")
    ap.add_argument("--decode_steps", type=int, default=32)
    ap.add_argument("--prefill_chunk", type=int, default=2048)
    a = ap.parse_args(argv)
    bad = [s for s in a.suite.split(",") if s not in SUITES]
    if bad:
        ap.error(f"--suite: unknown {bad}; expected a comma-separated subset of {SUITES}")
    if a.random_init and not a.config:
        ap.error("--random_init needs --config=experiments/<file>.py:<arg>")
    return a


def load_config_file(spec: str):
    """`path.py[:arg]` -> the ConfigDict of its get_config(arg)."""
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--config={spec!r}: no file {path!r}; expected experiments/<file>.py[:<arg>].")
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    mod_spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.get_config(arg) if arg else mod.get_config()


def apply_overrides(config, sets: list[str]):
    """--set KEY=VALUE: the value is parsed as a Python literal when it is one (ints, floats, bools), else kept
    as a string; the key must exist (ConfigDict refuses new keys with the key named)."""
    import ast

    for item in sets:
        key, eq, raw = item.partition("=")
        if not eq:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. model.impl=chunked")
        try:
            val = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            val = raw
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        if leaf not in node:
            raise KeyError(f"--set {key}: no such config key; keys here: {sorted(node.keys())}")
        node[leaf] = val
    return config


def load_run(args) -> tuple[Any, Any, int]:
    """(config, params, step)."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    from idattn.models import build_model

    if args.random_init:
        config = apply_overrides(load_config_file(args.config), args.set)
        model = build_model(config.model)
        params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(config.get("seed", 0)),
                                             jnp.zeros((1, 8), jnp.int32))["params"])  # jit: 2x faster than eager
        return config, params, -1
    from idattn.train import checkpoint

    steps = checkpoint.committed_steps(args.workdir)
    step = args.step if args.step is not None else (steps[-1] if steps else None)
    config, params = checkpoint.load_params(args.workdir, step)
    return apply_overrides(config, args.set), params, int(step)


def size_name(model_cfg) -> str:
    """The paper size label whose (d_model, layers) the config matches, else 'd<d>xL<l>'."""
    table = {(64, 2): "tiny", (768, 12): "125m", (1024, 24): "350m", (1536, 24): "760m", (2048, 24): "1.3b"}
    return table.get((int(model_cfg.d_model), int(model_cfg.num_layers)),
                     f"d{model_cfg.d_model}xL{model_cfg.num_layers}")


def run_info(args, config, params) -> dict[str, Any]:
    import jax

    n = sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
    m = config.model
    return {"workdir": os.path.abspath(args.workdir), "mixer": str(m.mixer), "size": size_name(m), "params": n,
            "input": str(m.get("input", "")), "readout": str(m.get("readout", "")), "rope": bool(m.get("rope", True)),
            "seq_len": int(config.data.seq_len)}


def main(argv=None) -> int:
    args = parse_args(argv)
    import numpy as np

    from idattn.data.tokenizer import load_tokenizer
    from idattn.eval import perplexity
    from idattn.eval.schema import write_result
    from idattn.eval.scoring import model_score_fn, prefix_token
    from idattn.models import build_model

    config, params, step = load_run(args)
    model = build_model(config.model)
    run = run_info(args, config, params)
    seq_len = int(args.max_length or config.data.seq_len)
    limit = args.limit or None
    score_fn = model_score_fn(model, params)
    suites = args.suite.split(",")
    tok = load_tokenizer(config.data.tokenizer) if set(suites) - {"decode"} else None
    if tok is not None and tok.vocab_size > int(config.model.vocab_size):
        raise ValueError(f"tokenizer {config.data.tokenizer!r} has {tok.vocab_size} pieces but the model's "
                         f"vocab_size is {config.model.vocab_size}: ids would index past the embedding. Evaluate "
                         "with the tokenizer the run was trained with (config.data.tokenizer).")
    written = []

    if "validation" in suites:
        if args.val_path:
            if args.val_path.endswith(".npy"):
                arr = np.load(args.val_path, allow_pickle=True)
                docs = [list(map(int, d)) for d in (arr if arr.dtype == object or arr.ndim == 2 else [arr])]
            else:
                from idattn.eval.datasets import read_records

                docs = [tok.encode(t) for t in perplexity._texts(read_records(args.val_path), None, args.val_path)]
            m = perplexity.validation_perplexity(score_fn, docs[:limit] if limit else docs, prefix=prefix_token(tok),
                                                 max_length=seq_len, batch_size=args.batch_size)
            details = {"source": args.val_path, "method": "rolling windows"}
        else:
            from idattn.data.pipeline import make_eval_batches

            batches = make_eval_batches(config.data, tok, batch_size=args.batch_size, seq_len=seq_len,
                                        num_batches=args.val_batches or int(config.train.eval_batches))
            m = perplexity.packed_perplexity(lambda p, b: model.apply({"params": p}, b["inputs"],
                                                                      segment_ids=b["segment_ids"],
                                                                      positions=b["positions"]), params, batches)
            details = {"source": f"data.source={config.data.source}", "method": "packed eval batches",
                       "batches": len(batches)}
        written.append(write_result(args.workdir, "validation", step, m, run=run, details=details))

    if "extrapolation" in suites:
        lengths = _ints(args.lengths) or [seq_len, 2 * seq_len, int(3.5 * seq_len)]
        corpora = {}
        for name in [c for c in args.corpora.split(",") if c]:
            try:
                texts = perplexity.load_corpus(name, data_dir=args.data_dir or None, hub=args.hub, limit=None)
            except FileNotFoundError as e:
                print(f"extrapolation: skipping {name}: {e}", file=sys.stderr)
                continue
            # encode only a prefix long enough for the longest window (>= 16 characters per token is far more
            # than any tokenizer needs), and stop once `limit` long documents are found
            kept = []
            for t in texts:
                ids = tok.encode(t[:16 * max(lengths)])
                if len(ids) >= max(lengths):
                    kept.append(ids)
                    if limit and len(kept) >= limit:
                        break
            if not kept:
                print(f"extrapolation: skipping {name}: no document has {max(lengths)} tokens", file=sys.stderr)
                continue
            corpora[name] = kept
        if not corpora:
            raise FileNotFoundError("extrapolation: no corpus found; pass --data_dir with <corpus>/ folders or --hub.")
        m, details = perplexity.extrapolation(score_fn, corpora, lengths, bos=prefix_token(tok), max_docs=limit,
                                              batch_size=1)
        path = write_result(args.workdir, "extrapolation", step, m, run=run, details=details)
        perplexity.plot_extrapolation(details, path[:-5] + ".png", title=f"{run['mixer']} {run['size']}")
        written.append(path)

    if "harness" in suites:
        from idattn.eval import harness

        tasks = [t for t in args.tasks.split(",") if t] or list(harness.DEFAULT_TASKS)
        m, details = harness.run_harness(score_fn, tok, tasks=tasks, data_dir=args.data_dir or None, hub=args.hub,
                                         limit=limit, max_length=seq_len, batch_size=args.batch_size,
                                         add_bos=args.add_bos)
        written.append(write_result(args.workdir, "harness", step, m, run=run, details=details))

    if "recall" in suites:
        from idattn.eval.recall import run_text_recall

        m, details = run_text_recall(score_fn, tok, niah_lengths=_ints(args.niah_lengths),
                                     phonebook_sizes=_ints(args.phonebook_sizes), n=args.recall_n, batch_size=1)
        written.append(write_result(args.workdir, "recall", step, m, run=run, details=details))

    if "decode" in suites:
        from idattn.eval.decode_bench import decode_benchmark

        m, details = decode_benchmark(model, params, contexts=_ints(args.decode_contexts),
                                      batch_sizes=_ints(args.decode_batches), steps=args.decode_steps,
                                      prefill_chunk=args.prefill_chunk)
        written.append(write_result(args.workdir, "decode", step, m, run=run, details=details))

    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
