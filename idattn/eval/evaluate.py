"""The library of `python -m idattn.eval`: resolve what a command line names (corpora, validation sources), load
the run, run each suite, write one result file per suite (idattn.rundir.schema) and print a table.

`evaluate(args)` takes the parsed flags of idattn/eval/__main__.py (their help is the documentation) and runs
named phases: `_resolve` (the command line), `Loaded` (config, step, tokenizer), `read_inputs` (every document
to score), `check_train_overlap` (none of them a training document of the run), `Loaded.load_model`, then one
`run_<suite>` per suite. Every refusal is an `EvalError` (one line) raised before anything is written.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn

from idattn.configs import apply_overrides, load_config_file
from idattn.configs.sizes import size_label
from idattn.data import formats, prepare
from idattn.data.pipeline import make_eval_batches
from idattn.data.tokenizer import load_tokenizer
from idattn.eval import harness, perplexity
from idattn.eval.decode_bench import decode_benchmark
from idattn.eval.markdown import markdown_table
from idattn.eval.perplexity import CORPORA
from idattn.eval.recall import run_text_recall
from idattn.eval.scoring import model_score_fn, prefix_token, sequence_mesh
from idattn.models import build_model
from idattn.models.spec import model_label
from idattn.rundir.layout import committed_steps, load_config
from idattn.rundir.loading import load_params
from idattn.rundir.schema import protocol_of, write_result

SUITES = ("validation", "extrapolation", "harness", "recall", "decode")


class EvalError(ValueError):
    """A refused command line (one line: what is wrong and the fix); raised before anything is written."""


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse_corpora(spec: str, data_dir: str = "", hub: bool = False) -> dict[str, str | None]:
    """`a,b=path,...` -> {name: path or None (a known corpus)}; refuses unknown bare names and missing paths."""

    out: dict[str, str | None] = {}
    for item in [c.strip() for c in spec.split(",") if c.strip()]:
        name, eq, path = item.partition("=")
        name = name.strip()
        if not name:
            raise EvalError(f"--corpora item {item!r}: expected name or name=path.")
        if name in out:
            raise EvalError(f"--corpora: {name!r} given twice; give each corpus a distinct name.")
        if eq:
            if not path or not (os.path.exists(os.path.expanduser(path)) or any(c in path for c in "*?[")):
                raise EvalError(f"--corpora {name}={path}: no such file or folder; point it at a prepared folder "
                                "(python -m idattn.data.prepare --out=...) or .txt/.jsonl/.parquet documents.")
            out[name] = os.path.expanduser(path)
        elif name in CORPORA:
            out[name] = None
        else:
            raise EvalError(f"--corpora: unknown corpus {name!r}; known: {', '.join(sorted(CORPORA))}. For your own "
                            f"data pass {name}=<path> (a prepared folder or .txt/.jsonl/.parquet documents).")
    if not out:
        raise EvalError("--corpora is empty; pass e.g. --corpora=mine=data/mine or --corpora=pg19 --data_dir=DIR.")
    return out


def read_token_docs(path: str) -> list[list[int]]:
    """Documents of token ids from a file, never through pickle (a shared file must not run code on load):
      .npy        integers: 1-D = one document, 2-D = one document per row
      .npz        integer arrays, one document each (in the archive's order)
      .ids.jsonl  one JSON list of integers per line
    """


    def ids_of(a, where):
        a = np.asarray(a)
        if a.dtype.kind not in "iu":
            raise EvalError(f"--val_path={path}: {where} holds {a.dtype} values; expected integer token ids "
                            f"(save with np.save(path, np.asarray(ids, np.int32)); object arrays are refused)")
        return [a.astype(np.int64).tolist()] if a.ndim == 1 else [r.tolist() for r in a.astype(np.int64)]

    try:
        if path.endswith(".npy"):
            return ids_of(np.load(path, allow_pickle=False), "the array")
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as z:
                return [d for k in z.files for d in ids_of(z[k], f"array {k!r}")]
    except ValueError as e:  # numpy refuses an object array without allow_pickle
        raise EvalError(f"--val_path={path}: {e}; save token ids as an integer array "
                        f"(np.save(path, np.asarray(ids, np.int32)))") from e
    docs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                row = json.loads(line)
                if not (isinstance(row, list) and all(isinstance(i, int) for i in row)):
                    raise EvalError(f"--val_path={path}: line {n} is not a JSON list of integers")
                docs.append(row)
    return docs


def corpus_label(data_cfg) -> str:
    """The name of a run's own held-out split: `<data name>.val` (kjv.val, <prepared folder name>.val, ...)."""
    src = str(data_cfg.get("source", "kjv"))
    if src == "arrayrecord":
        return os.path.basename(os.path.normpath(str(data_cfg.get("path", "data")))) + ".val"
    if src == "tfds":
        return str(data_cfg.get("tfds_name", "tfds")).replace("/", "_") + ".val"
    return f"{src}.val"


def _is_prepared(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "meta.json"))


def _prepared_cfg(data_cfg, path: str):
    cfg = ml_collections.ConfigDict(data_cfg.to_dict() if hasattr(data_cfg, "to_dict") else dict(data_cfg))
    cfg.source, cfg.path = "arrayrecord", path
    return cfg


def corpus_docs(name: str, path: str | None, tok, args, *, min_tokens: int = 0) -> tuple[list[list[int]], Any]:
    """(token-id documents of one corpus, their document hashes or None) for the held-out split of a prepared
    folder, documents, or a known corpus. A hash is `idattn.data.prepare.doc_hash` of the document's text (a
    prepared folder's from its val_hashes.npy; None when it has none), so that scored documents can be checked
    against a run's training documents."""


    if path is not None and _is_prepared(path):
        try:
            meta = formats.check_tokenizer_matches(path, tok)
            shards = formats.shard_paths(path, meta, "val")
            hashes = formats.read_doc_hashes(path, "val")
        except (ValueError, FileNotFoundError) as e:
            raise EvalError(f"corpus {name}={path}: {e}") from e
        src = grain.sources.ArrayRecordDataSource(shards)
        every = [np.frombuffer(src[i], meta["dtype"]).astype(np.int64).tolist() for i in range(len(src))]
        keep = [i for i, d in enumerate(every) if d and len(d) >= min_tokens]
        keep = keep[:args.limit] if args.limit else keep
        kept_h = hashes[keep] if hashes is not None and len(hashes) == len(every) else None
        return [every[i] for i in keep], kept_h
    if path is not None:
        try:
            fs, files = prepare.list_inputs(path)
            texts = prepare.iter_texts(fs, files, field=args.text_field,
                                       separator=prepare.decode_separator(args.separator))
        except prepare.PrepareError as e:
            raise EvalError(f"corpus {name}={path}: {e}") from e
    else:
        texts = perplexity.load_corpus(name, data_dir=args.data_dir or None, hub=args.hub, limit=None)
    kept, hashes = [], []
    try:
        for t in texts:
            # encode only a prefix long enough for the longest window (>= 16 characters per token is far more than
            # any tokenizer needs), and stop once `limit` long enough documents are found
            ids = tok.encode(t[:16 * min_tokens] if min_tokens else t)
            if len(ids) >= min_tokens and ids:
                kept.append(ids)
                hashes.append(prepare.doc_hash(t))
                if args.limit and len(kept) >= args.limit:
                    break
    except prepare.PrepareError as e:
        raise EvalError(f"corpus {name}={path}: {e}") from e
    return kept, np.asarray(hashes, np.uint64)


# ------------------------------------------------------------------------------------------------ config / run


def load_config_of(args) -> tuple[Any, int]:
    """(config, step) of the run a command line names, without loading any parameters."""
    if args.random_init:
        return apply_overrides(load_config_file(args.config), args.set), -1

    steps = committed_steps(args.workdir)
    if not steps:
        raise EvalError(f"--workdir={args.workdir}: no committed checkpoint there; train first (python -m "
                        "idattn.train ... --workdir=...) or pass --random_init --config=...")
    if args.step is not None and args.step not in steps:
        raise EvalError(f"--step={args.step}: no checkpoint of that step in {args.workdir}; available: {steps}.")
    return apply_overrides(load_config(args.workdir), args.set), int(args.step if args.step is not None else steps[-1])


def load_params_of(args, config, step: int):
    """The parameters of `load_config_of`'s run (a random init of `config` for --random_init)."""


    if args.random_init:
        model = build_model(config.model)
        return nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(config.get("seed", 0)),
                                            jnp.zeros((1, 8), jnp.int32))["params"])  # jit: 2x faster than eager

    return load_params(args.workdir, step)[1]


def load_run(args) -> tuple[Any, Any, int]:
    """(config, params, step)."""
    config, step = load_config_of(args)
    return config, load_params_of(args, config, step), step


def run_info(args, config, params) -> dict[str, Any]:
    n = sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
    m = config.model
    return {"workdir": os.path.abspath(args.workdir), "mixer": model_label(m), "size": size_label(m), "params": n,
            "input": str(m.get("input", "")), "readout": str(m.get("readout", "")), "rope": bool(m.get("rope", True)),
            "seq_len": int(config.data.seq_len)}


def trainer_val_rows(config) -> int:
    """Rows of the trainer's validation: train.eval_batches x its microbatch (train.batch_size / grad_accum)."""
    t = config.train
    return int(t.eval_batches) * (int(t.batch_size) // max(int(t.get("grad_accum", 1) or 1), 1))


# ------------------------------------------------------------------------------------------------ output

class Progress:
    """One stderr line per update: `<label>: i/n (p%) elapsed Xs, ETA Ys` (carriage return on a terminal)."""

    def __init__(self, label: str, total: int, quiet: bool = False):
        self.label, self.total, self.quiet = label, max(int(total), 1), quiet
        self.t0 = time.time()
        self.done = 0
        self.tty = sys.stderr.isatty()
        self._last = -1.0

    def __call__(self, n: int = 1) -> None:
        self.done += n
        if self.quiet:
            return
        el = time.time() - self.t0
        frac = min(self.done / self.total, 1.0)
        if not self.tty and self.done < self.total and el - self._last < 2.0:
            return  # a log file gets a line every 2 s at most
        self._last = el
        eta = el / frac * (1 - frac) if frac > 0 else float("nan")
        msg = (f"{self.label}: {self.done}/{self.total} ({100 * frac:.0f}%) elapsed {el:.0f}s, ETA "
               f"{eta:.0f}s")
        end = "\n" if (not self.tty or self.done >= self.total) else ""
        print(("\r" if self.tty else "") + msg, end=end, file=sys.stderr, flush=True)


def format_number(v: float) -> str:
    return f"{v:.4f}"


# what the table's "measured on" column shows of a protocol, in this order
SHOWN = ("corpus", "tokens", "requested_tokens", "context", "batch", "lengths", "mode", "scored", "train_overlap")


def metric_order(name: str) -> tuple:
    """Sort key of a metric name with its numbers read as numbers: ppl@256 < ppl@4096 < ppl@16384 (a JSON file's
    keys come back in text order: 1024, 16384, 256, 4096)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def results_table(records: list[dict[str, Any]]) -> str:
    """Markdown: one row per (suite, protocol, metric) with the value as in the JSON file (4 decimals); a record's
    metrics in `metric_order` (lengths, sizes and contexts ascending as numbers)."""

    rows = []
    for rec in records:
        p = protocol_of(rec)
        on = ", ".join(f"{k.replace('_', ' ')} {p[k]}" for k in SHOWN if p.get(k) not in (None, "", [], {}))
        rows += [[rec["suite"], on or "-", k, format_number(rec["metrics"][k])]
                 for k in sorted(rec["metrics"], key=metric_order)]
    return markdown_table(["suite", "measured on", "metric", "value"], rows)


# ------------------------------------------------------------------------------------------------ resolve

def _resolve(args) -> dict[str, Any]:
    """Phase 1: everything a command line names, checked before the model is loaded or anything is written."""
    out: dict[str, Any] = {"suites": args.suite.split(",")}
    suites = out["suites"]
    if "extrapolation" in suites:
        out["corpora"] = parse_corpora(args.corpora, args.data_dir, args.hub)
    if "validation" in suites and args.val_path:
        name, eq, path = args.val_path.partition("=")
        if not eq:
            name, path = "", args.val_path
        path = os.path.expanduser(path)
        if not os.path.exists(path):
            raise EvalError(f"--val_path={args.val_path}: no such file or folder.")
        if not name:
            base = os.path.basename(os.path.normpath(path))
            name = (base if _is_prepared(path) else os.path.splitext(base)[0]) or "val_path"
        out["val"] = (name, path)
    if args.val_tokens < 0 or args.val_batches < 0 or args.batch_size < 1:
        raise EvalError(f"--val_tokens={args.val_tokens}, --val_batches={args.val_batches}, --batch_size="
                        f"{args.batch_size}: expected non-negative counts and a positive batch size.")
    return out


# ------------------------------------------------------------------------------------------------ load

class Loaded:
    """Phase 2: the run's config, step and tokenizer (cheap: every input is checked against them before any
    parameter is loaded), then `load_model()`: params, model, scorer and the run's identity."""

    def __init__(self, args, suites: list[str]):
        self.args = args
        self.config, self.step = load_config_of(args)
        self.seq_len = int(args.max_length or self.config.data.seq_len)
        self.limit = args.limit or None
        self.tok = load_tokenizer(self.config.data.tokenizer) if set(suites) - {"decode"} else None
        if self.tok is not None and self.tok.vocab_size > int(self.config.model.vocab_size):
            raise EvalError(f"tokenizer {self.config.data.tokenizer!r} has {self.tok.vocab_size} pieces but the "
                            f"model's vocab_size is {self.config.model.vocab_size}: ids would index past the "
                            "embedding. Evaluate with the tokenizer the run was trained with (config.data.tokenizer).")

    def load_model(self) -> None:
        self.params = load_params_of(self.args, self.config, self.step)
        self.model = build_model(self.config.model)
        self.run = run_info(self.args, self.config, self.params)
        n = int(getattr(self.args, "sequence", 1) or 1)
        mesh = None
        if n > 1:  # the length split over n local devices, as the trainer's sequence axis (scoring.make_score_fn)
            try:
                mesh = sequence_mesh(n)
            except ValueError as e:
                raise EvalError(f"--sequence: {e}") from e
        self.score_fn = model_score_fn(self.model, self.params, mesh=mesh,
                                       rules=self.config.get("logical_axis_rules") if mesh is not None else None)


# ------------------------------------------------------------------------------------------------ inputs

def read_inputs(args, resolved: dict[str, Any], ctx: Loaded) -> dict[str, Any]:
    """Phase 3: the documents every suite will score, read (and refused) before the first file is written:
    {"val": (name, path, docs, hashes) for --val_path documents, "corpora": {name: docs}, "hashes": {name:
    hashes}, "lengths": [...]}."""
    out: dict[str, Any] = {"val": None, "corpora": {}, "hashes": {}, "lengths": []}
    suites = resolved["suites"]
    if "validation" in suites and resolved.get("val"):
        name, path = resolved["val"]
        if _is_prepared(path):  # packed like the trainer's validation; its whole held-out split is checked
            try:
                out["val_split_hashes"] = formats.read_doc_hashes(path, "val")
            except ValueError as e:
                raise EvalError(f"--val_path={path}: {e}") from e
        else:
            if path.endswith((".npy", ".npz")) or path.endswith(".ids.jsonl"):
                docs, hashes = read_token_docs(path), None  # token ids: no text to hash
            else:
                docs, hashes = corpus_docs(name, path, ctx.tok, args)
            docs = docs[:ctx.limit] if ctx.limit else docs
            hashes = hashes[:len(docs)] if hashes is not None else None
            out["val"] = (name, path, docs, hashes)
    if "extrapolation" in suites:
        lengths = ints(args.lengths) or [ctx.seq_len, 2 * ctx.seq_len, int(3.5 * ctx.seq_len)]
        out["lengths"] = lengths
        for name, path in resolved["corpora"].items():
            rolling = getattr(args, "extrapolation_mode", "docs") == "rolling"  # short documents count too
            try:
                kept, hashes = corpus_docs(name, path, ctx.tok, args, min_tokens=0 if rolling else max(lengths))
            except FileNotFoundError as e:
                if path is not None:
                    raise EvalError(f"corpus {name}: {e}") from e
                print(f"extrapolation: skipping {name}: {e}", file=sys.stderr)
                continue
            if not kept:
                msg = (f"corpus {name!r} has no document with {max(lengths)} tokens (the longest length); lower "
                       "--lengths, add longer documents, or pass --extrapolation_mode=rolling (documents of any "
                       "length, scored whole in windows of L)")
                if path is not None:
                    raise EvalError(msg + ".")
                print(f"extrapolation: skipping {msg}", file=sys.stderr)
                continue
            out["corpora"][name] = kept
            out["hashes"][name] = hashes
        if not out["corpora"]:
            raise EvalError("extrapolation: no corpus found; pass --corpora=name=path, or --data_dir with "
                            "<corpus>/ folders, or --hub.")
    return out


def check_train_overlap(args, resolved: dict[str, Any], ctx: Loaded, inputs: dict[str, Any]) -> dict[str, Any]:
    """Phase 4: refuse to score a training document of the run (config.data) as held-out. Every scored document
    is hashed as prepare hashes it (`doc_hash`) and looked up in the run's training hashes
    (`idattn.data.prepare.training_hashes`). Returns {"validation": "k/N" or None, "extrapolation": {name:
    "k/N"}, "unchecked": reason or None}; raises EvalError (one line, naming how many of N) when any overlap is
    found, unless --allow_train_overlap (then the counts mark the protocols)."""


    sets: list[tuple[str, str, Any]] = []  # (suite, corpus name, hashes of the scored documents)
    if inputs["val"] is not None:
        sets.append(("validation", inputs["val"][0], inputs["val"][3]))
    elif resolved.get("val") and "val_split_hashes" in inputs:
        sets.append(("validation", resolved["val"][0], inputs["val_split_hashes"]))
    for name in inputs["corpora"]:
        sets.append(("extrapolation", name, inputs["hashes"].get(name)))
    out: dict[str, Any] = {"validation": None, "extrapolation": {}, "unchecked": None}
    if not sets:
        return out
    train, what = prepare.training_hashes(ctx.config.data)
    if train is None:
        out["unchecked"] = what
        print(f"eval: warning: scored documents not checked against the run's training data: {what}",
              file=sys.stderr)
        return out
    found, flags = [], []
    for suite, name, hashes in sets:
        if hashes is None:
            continue
        k, n = int(np.isin(np.asarray(hashes, np.uint64), train).sum()), int(len(hashes))
        if k:
            found.append(f"{name}: {k} of {n} documents")
            flags.append("--val_path" if suite == "validation" else "--corpora")
            if suite == "validation":
                out["validation"] = f"{k}/{n}"
            else:
                out["extrapolation"][name] = f"{k}/{n}"
    if found and not args.allow_train_overlap:
        flag = "/".join(dict.fromkeys(flags))
        raise EvalError(f"{flag}: {'; '.join(found)} scored are training documents of this run ({what}), so the "
                        "numbers would not be held-out; score held-out text (e.g. the prepared folder: its held-out "
                        "split), or pass --allow_train_overlap to score them anyway (the result is marked).")
    return out


# ------------------------------------------------------------------------------------------------ suites

def run_validation(args, resolved, ctx: Loaded, inputs, overlap, write) -> None:
    """Validation: --val_path documents with rolling windows, else a held-out split packed as the trainer does
    (the run's own, or a prepared --val_path folder's); the protocol names the tokens actually scored."""

    seq_len, tok = ctx.seq_len, ctx.tok
    mark = {"train_overlap": overlap["validation"]} if overlap["validation"] else {}
    extra = {"train_overlap": f"not checked: {overlap['unchecked']}"} if overlap["unchecked"] else {}
    if inputs["val"] is not None:
        name, path, docs, _ = inputs["val"]
        prog = Progress(f"validation {name}", sum(-(-len(d) // seq_len) for d in docs), args.quiet)
        m = perplexity.validation_perplexity(ctx.score_fn, docs, prefix=prefix_token(tok), max_length=seq_len,
                                             batch_size=args.batch_size, progress=prog)
        protocol = {"corpus": name, "tokens": int(m["tokens"]), "context": seq_len, "batch": args.batch_size,
                    "method": "rolling windows over documents", **mark}
        write("validation", m, {"source": path, "method": "rolling windows", "docs": len(docs), **extra}, protocol)
        return

    name, path = resolved.get("val", (None, None))
    data_cfg = ctx.config.data if path is None else _prepared_cfg(ctx.config.data, path)
    label = corpus_label(ctx.config.data) if path is None else name
    if args.val_tokens:
        rows = max(args.val_tokens // seq_len, 1)
    elif args.val_batches:
        rows = args.val_batches * args.batch_size
    else:
        rows = trainer_val_rows(ctx.config)
    nb = -(-rows // args.batch_size)
    try:
        batches = make_eval_batches(data_cfg, tok, batch_size=args.batch_size, seq_len=seq_len, num_batches=nb)
    except (ValueError, FileNotFoundError) as e:
        raise EvalError(f"validation on {label}: {e}") from e
    over = nb * args.batch_size - rows  # rows past the protocol's count in the last batch: masked out
    if over and batches and len(batches) == nb:
        batches[-1] = dict(batches[-1])
        batches[-1]["loss_mask"] = batches[-1]["loss_mask"].copy()
        batches[-1]["loss_mask"][args.batch_size - over:] = 0.0
    prog = Progress(f"validation {label}", len(batches), args.quiet)
    model = ctx.model
    m = perplexity.packed_perplexity(lambda p, b: model.apply({"params": p}, b["inputs"], segment_ids=b["segment_ids"],
                                                              positions=b["positions"]), ctx.params, batches,
                                     progress=prog)
    scored = int(m["tokens"])
    short = scored < rows * seq_len  # a split smaller than asked for: name what was scored, keep what was asked
    protocol = {"corpus": label, "tokens": scored, **({"requested_tokens": rows * seq_len} if short else {}),
                "context": seq_len, "batch": args.batch_size,
                "method": "packed held-out split (the trainer's validation)", **mark}
    if short:
        protocol["note"] = f"the split holds only {scored} tokens of the {rows * seq_len} requested"
    write("validation", m, {"source": f"data.source={data_cfg.source}" + (
        f", data.path={data_cfg.path}" if data_cfg.source == "arrayrecord" else ""),
        "method": "packed eval batches", "batches": len(batches), "rows": rows, **extra}, protocol)


def run_extrapolation(args, ctx: Loaded, inputs, overlap, write) -> None:
    corpora_docs, lengths, limit = inputs["corpora"], inputs["lengths"], ctx.limit
    total = sum(min(len(d), limit or len(d)) for d in corpora_docs.values()) * len(lengths)
    prog = Progress("extrapolation", total, args.quiet)
    mode = getattr(args, "extrapolation_mode", "docs")
    m, details = perplexity.extrapolation(ctx.score_fn, corpora_docs, lengths, bos=prefix_token(ctx.tok),
                                          max_docs=limit, batch_size=1, progress=prog, mode=mode)
    details["train_seq_len"] = int(ctx.config.data.seq_len)
    if overlap["unchecked"]:
        details["train_overlap"] = f"not checked: {overlap['unchecked']}"
    protocol = {"corpus": "+".join(corpora_docs), "context": lengths,
                "docs": {k: details["corpora"][k]["docs"] for k in corpora_docs},
                "scored": ", ".join(f"{k}: {details['corpora'][k]['docs']} docs, "
                                    f"{details['corpora'][k][str(max(lengths))]['tokens']:,} tokens at L={max(lengths)}"
                                    for k in corpora_docs),
                "method": "first L tokens of each document" if mode == "docs" else
                perplexity.EXTRAPOLATION_MODES["rolling"]}
    if mode != "docs":  # in the file name too: a rolling result never overwrites the paper protocol's
        protocol["mode"] = mode
    if overlap["extrapolation"]:
        protocol["train_overlap"] = dict(overlap["extrapolation"])
    path = write("extrapolation", m, details, protocol)
    perplexity.plot_extrapolation(details, path[:-5] + ".png", title=f"{ctx.run['mixer']} {ctx.run['size']}",
                                  train_len=int(ctx.config.data.seq_len))


def run_harness(args, ctx: Loaded, write) -> None:
    tasks = [t for t in args.tasks.split(",") if t] or list(harness.DEFAULT_TASKS)
    prog = Progress("harness (tasks)", len(tasks), args.quiet)
    m, details = harness.run_harness(ctx.score_fn, ctx.tok, tasks=tasks, data_dir=args.data_dir or None,
                                     hub=args.hub, limit=ctx.limit, max_length=ctx.seq_len,
                                     batch_size=args.batch_size, add_bos=args.add_bos, progress=prog)
    write("harness", m, details)


def run_recall(args, ctx: Loaded, write) -> None:
    m, details = run_text_recall(ctx.score_fn, ctx.tok, niah_lengths=ints(args.niah_lengths),
                                 phonebook_sizes=ints(args.phonebook_sizes), n=args.recall_n, batch_size=1)
    write("recall", m, details)


def run_decode(args, ctx: Loaded, write) -> None:
    m, details = decode_benchmark(ctx.model, ctx.params, contexts=ints(args.decode_contexts),
                                  batch_sizes=ints(args.decode_batches), steps=args.decode_steps,
                                  prefill_chunk=args.prefill_chunk)
    write("decode", m, details)


# ------------------------------------------------------------------------------------------------ main

def evaluate(args) -> int:
    """Runs the suites of a parsed command line (`python -m idattn.eval`'s flags) and prints the table.

    Phases: resolve the command line, load the run's config and tokenizer, read every input and check it against
    the run's training documents (all refusals happen by then), load the parameters, then one function per suite,
    each writing one result file."""


    resolved = _resolve(args)
    suites = resolved["suites"]
    ctx = Loaded(args, suites)
    inputs = read_inputs(args, resolved, ctx)
    overlap = check_train_overlap(args, resolved, ctx, inputs)
    ctx.load_model()
    records: list[dict[str, Any]] = []
    written: list[str] = []

    def write(suite, metrics, details, protocol=None):
        path = write_result(args.workdir, suite, ctx.step, metrics, run=ctx.run, details=details, protocol=protocol)
        written.append(path)
        with open(path) as f:
            records.append(json.load(f))
        return path

    if "validation" in suites:
        run_validation(args, resolved, ctx, inputs, overlap, write)
    if "extrapolation" in suites:
        run_extrapolation(args, ctx, inputs, overlap, write)
    if "harness" in suites:
        run_harness(args, ctx, write)
    if "recall" in suites:
        run_recall(args, ctx, write)
    if "decode" in suites:
        run_decode(args, ctx, write)

    print(f"\n{ctx.run['mixer']} ({ctx.run['size']}, {ctx.run['params']:,} params), step {ctx.step}, {args.workdir}:\n")
    print(results_table(records))
    print()
    for p in written:
        print(p)
    return 0
