"""The reproduction's runs: train (or resume, or reuse) the small language models and MQAR models, evaluate
them, and keep a marker per run (`repro.json`: recipe, model-code hash, status) so that a finished run is reused
and a run trained with other model code is re-verified or moved aside, never silently mixed in.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import time
from typing import Any

from idattn.configs import packaged_config
from idattn.studies.code_hash import (SRC_DIRS, SRC_EXCLUDE, TRAIN_FILES, source_hash,  # noqa: F401
                                     synthetic_train_hash, train_code_hash)




REPRO_CONFIG = packaged_config("repro")  # experiments/repro.py re-exports it


LABEL = {"softmax": "Softmax", "interdomain": "Interdomain", "s4d_only": "S4D-only",
         "s4d_only+sum": "S4D-only, mode sum (c_h = 1ᵀ C_h)"}


RUN_NAME = {"dualkv-query-rope": "interdomain", "generic-linear-norope": "s4d_only",
            "s4d_only+sum": "s4d_only-sum", "generic-linear-norope+sum": "s4d_only-sum"}


MARKER = "repro.json"


class ReproError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[repro {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_experiment():
    from idattn.configs import repro
    return repro


def run_name(mixer: str) -> str:
    return RUN_NAME.get(mixer, mixer)


def paper():
    from idattn.eval import paper_numbers as P
    return P


def read_marker(wd: str) -> dict[str, Any]:
    try:
        with open(os.path.join(wd, MARKER)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def write_marker(wd: str, rec: dict[str, Any]) -> None:
    os.makedirs(wd, exist_ok=True)
    tmp = os.path.join(wd, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(wd, MARKER))


def move_aside(wd: str, rec: dict[str, Any], why: str) -> dict[str, Any]:
    dst = f"{wd}.stale-{rec.get('src', 'unknown')}"
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(wd, dst)
    log(f"{wd}: {why}; moved to {dst}, training it again")
    return {}


def check_reuse(wd: str, src: str, keep_stale: bool, verify=None, train_src: str | None = None,
                model: Any = None, ctx: "Ctx | None" = None) -> dict[str, Any]:
    """The run's marker when it may be reused or resumed with the current model code, else {} (moved aside).

    Same source hash: reuse / resume. Other source hash: a finished run is reused and re-stamped when the current
    code reproduces its model fingerprint (with `model`, the run's model config, and `ctx` for its probe cache;
    idattn/studies/fingerprint.py: a probe of seconds that needs no checkpoint, so a run restored from the record is
    checked too) or else when `verify()` returns
    True (its trained parameters give the recorded perplexity or accuracy with the current code); an
    unfinished one, or one that fails both, is moved to `<run>.stale-<old hash>` (with --keep_stale it is
    kept and marked stale). With `train_src` (train_code_hash; synthetic_train_hash for MQAR, MAD and state
    tracking): a run recorded with other training code is moved aside (kept and marked stale with --keep_stale)
    whatever `verify` would say; a marker written before the training code was hashed (no `train_src`) is
    stamped with the current one, and the log says so."""
    rec = read_marker(wd)
    if rec and train_src is not None:
        if "train_src" not in rec:
            rec["train_src"] = train_src
            write_marker(wd, rec)
            log(f"{wd}: recorded before the training code was hashed; stamped with the current {train_src}")
        elif rec["train_src"] != train_src:
            if keep_stale:
                log(f"{wd}: trained with other training code ({rec['train_src']} != {train_src}); kept "
                    "(--keep_stale)")
                return dict(rec, stale=True)
            return move_aside(wd, rec, f"trained with other training code (loss, optimiser, packing or tokenizer: "
                                       f"{rec['train_src']} != {train_src}; evaluation cannot re-verify that)")
    if not rec or rec.get("src") == src:
        return rec
    if keep_stale:
        log(f"{wd}: trained with other model code ({rec.get('src')} != {src}); kept (--keep_stale)")
        return dict(rec, stale=True)
    if rec.get("status") == "done" and model is not None and rec.get("fingerprint"):
        from idattn.studies import fingerprint
        outcome, why = fingerprint.check(rec, src, lambda: (model, ""), ctx.fingerprints if ctx else None)
        if outcome == "verified":
            write_marker(wd, rec)
            log(f"{wd}: model code changed ({why}); same function, reused")
            return rec
        log(f"{wd}: model code changed; fingerprint {outcome} ({why})")
    if rec.get("status") == "done" and verify is not None:
        ok, why = verify()
        if ok:
            rec["src"] = src
            rec.setdefault("verified", []).append(why)
            write_marker(wd, rec)
            log(f"{wd}: model code changed ({why}); same function, reused")
            return rec
        return move_aside(wd, rec, f"model code changed and the run no longer evaluates the same ({why})")
    return move_aside(wd, rec, f"trained with other model code ({rec.get('src')} != {src})")


class Ctx:
    """One invocation: experiment module, size, root, seeds, flags."""

    def __init__(self, root: str, size: str, seeds, render_only: bool, keep_stale: bool, only=()):
        self.exp = load_experiment()
        self.only = {run_name(m) for m in only}
        self.train_dt = ""
        # runs read (not trained) whose model code differs from the current, by path under root; shared by
        # for_size copies, cleared before each table (main)
        self.unverified: set[str] = set()
        # model fingerprints by config (the cache of fingerprint.check), shared by for_size copies: the seeds of a
        # config finished by one invocation share one probe
        self.fingerprints: dict[str, list[float]] = {}
        self.root, self.size = os.path.abspath(root), size
        self.judged = size != "toy"  # toy size: numbers and intervals, never a verdict word
        self.seeds = tuple(seeds)
        self.render_only, self.keep_stale = render_only, keep_stale
        self.tok = None
        self.archive = ""  # --archive: the record every finished run is written to as soon as it finishes
        self.seeds_given = False  # --seeds named the seeds (else each table's default)
        self.tasks: frozenset[str] = frozenset()  # --tasks: the task families the selective table trains (empty: all)

    def invocation_time(self, seconds: float) -> str:
        """This invocation's wall time as a table prints it; with --render_only a fixed phrase, so that rendering
        the same runs writes the same doc on a loaded machine as on an idle one."""
        return "rendering only" if self.render_only else f"{seconds / 60:.1f} min"

    def skip(self, mixer: str, dt: str | None = None) -> bool:
        """True when this invocation only reads the runs of (mixer, dt): --render_only, --only without the mixer,
        or --train_dt naming another Δ range (softmax has none)."""
        if self.render_only or bool(self.only and run_name(mixer) not in self.only):
            return True
        return bool(self.train_dt and dt is not None and dt != self.train_dt and run_name(mixer) != "softmax")

    def lm_dir(self, mixer: str, dt: str, seed: int) -> str:
        dt = "scaled" if run_name(mixer) == "softmax" else dt  # no Δ: one softmax run serves both ranges
        return os.path.join(self.root, "runs", self.size, "lm", f"{run_name(mixer)}-{dt}-s{seed}")

    def mqar_dir(self, mixer: str, seed: int) -> str:
        return os.path.join(self.root, "runs", self.size, "mqar", f"{run_name(mixer)}-s{seed}")

    def config(self, mixer: str, dt: str, seed: int):
        dt = "scaled" if run_name(mixer) == "softmax" else dt
        return self.exp.get_config(f"{mixer},{self.size},{dt},{seed}")

    def tokenizer(self, cfg):
        if self.tok is None:
            from idattn.data import tokenizer as tok_lib
            self.tok = tok_lib.load_tokenizer(cfg.data.tokenizer)
        return self.tok

    def train_len(self) -> int:
        return int(self.exp.SIZES[self.size]["seq_len"])

    def lengths(self) -> list[int]:
        return [int(round(r * self.train_len())) for r in self.exp.LENGTH_RATIOS]

    def for_size(self, size: str) -> "Ctx":
        """The same invocation (root, seeds, flags) at another size: the runs of `size`, the tables of this one
        (the `length` table trains at LENGTH_SIZE, the ladder at each LADDER size)."""
        c = Ctx(self.root, size, self.seeds, self.render_only, self.keep_stale, ())
        c.only, c.train_dt, c.unverified = self.only, self.train_dt, self.unverified
        c.fingerprints = self.fingerprints
        c.archive = self.archive
        c.seeds_given = self.seeds_given
        c.judged = self.judged
        c.table_size = self.table_size
        c.tasks = self.tasks
        return c

    def for_task(self, family: str) -> "Ctx":
        """This invocation for one task family of the selective table (state, mad, mqar, lm): itself, or a copy
        that only reads the family's runs when --tasks names others."""
        if not self.tasks or family in self.tasks:
            return self
        c = self.for_size(self.size)
        c.render_only = True
        return c

    @property
    def table_size(self) -> str:
        return getattr(self, "_table_size", self.size)

    @table_size.setter
    def table_size(self, size: str) -> None:
        self._table_size = size

    def table_path(self, table: str, ext: str) -> str:
        size = self.table_size
        return os.path.join(self.root, f"{table}{'' if size == 'small' else '-' + size}.{ext}")


def verify_lm(ctx: Ctx, wd: str, rec: dict[str, Any]):
    """(same?, why): the trained run's perplexity at the training length, recomputed with the current code,
    against its recorded value (relative 1e-4)."""
    from idattn.rundir.schema import result_path
    L = ctx.train_len()
    path = result_path(wd, "extrapolation", int(rec.get("steps", -1)), ppl_protocol(ctx, L))
    if not os.path.exists(path):
        return False, "no recorded evaluation to compare with"
    with open(path) as f:
        old = float(json.load(f)["metrics"][f"ppl@{L}"])
    try:
        from idattn.studies.quickstart import perplexities
        from idattn.rundir import load_params
        cfg, params = load_params(wd)
        new = perplexities(cfg, params, ctx.tokenizer(cfg), [L], int(ctx.exp.EVAL_TOKENS[ctx.size]))[L]
    except Exception as e:  # noqa: BLE001 - a changed parameter tree is the expected way to fail here
        return False, f"the checkpoint no longer loads: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return abs(new - old) <= 1e-4 * abs(old), f"ppl@{L} recorded {old:.6g}, now {new:.6g}"


def size_recipe(ctx: Ctx) -> dict[str, Any]:
    """The recipe of the invocation's size (experiments/repro.py SIZES[size]: model, context, batch, steps, warmup,
    LR), as JSON, recorded in every new LM run's marker: a run whose recorded recipe differs is trained again."""
    return json.loads(json.dumps(ctx.exp.SIZES[ctx.size], sort_keys=True))


def archive_now(ctx: Ctx) -> None:
    """With --archive: record the root's finished runs now (called after every run, so a stop loses nothing)."""
    if ctx.archive:
        n = archive_runs(ctx.root, ctx.archive)
        log(f"recorded {n} finished runs in {ctx.archive}")


def finish_run(ctx: Ctx, wd: str, rec: dict[str, Any], model: Any) -> None:
    """Writes a finished run's marker (rec, status "done"), stamps it with the fingerprint of its model config
    `model` (idattn/studies/fingerprint.py: a later change of model code re-verifies it without its checkpoint) and
    records it with --archive. A probe that fails leaves the run finished and unstamped, and says so: `python -m
    idattn.repro verify` stamps it later."""
    write_marker(wd, rec)
    try:
        from idattn.studies import fingerprint
        if fingerprint.check(rec, rec["src"], lambda: (model, ""), ctx.fingerprints)[0] == "stamped":
            write_marker(wd, rec)
    except Exception as e:  # noqa: BLE001 - the run is trained and recorded; only its stamp is missing
        log(f"{wd}: finished, but its fingerprint was not computed ({type(e).__name__}: {e}); "
            "`python -m idattn.repro verify` stamps it")
    archive_now(ctx)


def read_only(ctx: Ctx, wd: str, rec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The marker of a run this invocation only reads (Ctx.skip: --render_only, --only without its mixer, --tasks
    without its family; `rec`: the marker when the caller has read it already). A finished run of other model code
    is named in ctx.unverified, and the table's missing_note lists it as read without checking (`verify` first
    re-stamps the runs the current code reproduces)."""
    rec = read_marker(wd) if rec is None else rec
    if rec.get("status") == "done" and rec.get("src") != source_hash():
        ctx.unverified.add(os.path.relpath(wd, ctx.root))  # runs/<size>/<kind>/<name>: names repeat across sizes
    return rec


def loss_curve(wd: str) -> list[list[float]]:
    """[[step, training loss], ...] from the trainer's metrics.jsonl (one line per `log_every` steps; the loss of
    that step's batch, not an average), kept in the marker so that the record holds it (spikes are findings)."""
    path = os.path.join(wd, "metrics.jsonl")
    out: dict[int, float] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if "loss" in r and "step" in r:
                    out[int(r["step"])] = round(float(r["loss"]), 5)
    return [[k, out[k]] for k in sorted(out)]


def missing_note(missing: list[str], ctx: "Ctx | None" = None, hint: str = "") -> str:
    """The end of a table's text: the runs it lacks (`hint`: how to get them) and the runs it read without checking
    them under the current model code (`Ctx.unverified`, cleared before each table)."""
    out = "" if not missing else f"\n\nNot available yet{f' ({hint})' if hint else ''}: " + ", ".join(missing) + "."
    if ctx is not None and ctx.unverified:
        out += ("\n\nRead without checking (this invocation did not train them): the model code changed since "
                "these runs were trained, and a run without --render_only / --only re-evaluates them and retrains "
                "the ones whose function changed: " + ", ".join(sorted(ctx.unverified)) + ".")  # paths under --root
    return out


def ensure_lm(ctx: Ctx, mixer: str, dt: str, seed: int) -> dict[str, Any] | None:
    """Trains (or resumes / reuses) one language-model run; returns its marker, None when not available."""
    wd = ctx.lm_dir(mixer, dt, seed)
    if ctx.skip(mixer, dt):
        rec = read_only(ctx, wd)
        return rec if rec.get("status") == "done" else None
    check_corpus(ctx)
    cfg = ctx.config(mixer, dt, seed)
    src = source_hash()
    recipe = size_recipe(ctx)
    old = read_marker(wd)
    # a run that recorded its recipe (issue 32 on) is the same run only with the same recipe; older markers have
    # none and are judged by their model code alone, as before
    if old and "recipe" in old and old["recipe"] != recipe and not ctx.keep_stale:
        move_aside(wd, old, f"trained with another recipe ({old['recipe']} != {recipe})")
    train_src = train_code_hash()
    rec = check_reuse(wd, src, ctx.keep_stale, verify=lambda: verify_lm(ctx, wd, read_marker(wd)),
                      train_src=train_src, model=cfg.model, ctx=ctx)
    if rec.get("status") == "done":
        return rec
    from idattn.train import run
    log(f"train {os.path.basename(wd)}: python -m idattn.train --config={REPRO_CONFIG}:{mixer},{ctx.size},{dt},"
        f"{seed} --workdir={wd}")
    rec = dict(rec or {}, src=src, train_src=train_src, mixer=mixer, dt=dt, seed=seed, size=ctx.size, status="training",
               dt_range=[float(cfg.model.dt_min), float(cfg.model.dt_max)], recipe=recipe, trained_on=trained_on())
    write_marker(wd, rec)
    t0 = time.time()
    summary = run(cfg, wd)
    rec["train_s"] = float(rec.get("train_s", 0.0)) + (time.time() - t0)
    if summary["status"] == "preempted":
        write_marker(wd, rec)
        raise ReproError(f"{wd}: stopped by a signal; rerun the same command to resume")
    rec.update(status="done", params=int(summary["num_params"]), steps=int(cfg.train.num_steps),
               final_train_loss=summary.get("loss"), loss_curve=loss_curve(wd))
    log(f"trained {os.path.basename(wd)} in {rec['train_s']:.0f} s (loss {summary.get('loss')})")
    finish_run(ctx, wd, rec, cfg.model)
    return read_marker(wd)


def corpus_name(ctx: Ctx) -> str:
    """The held-out split the size's runs are scored on: `kjv.val`, or `<stdlib corpus_id>.val` (the interpreter
    version and the file list's hash, idattn.data.stdlib_corpus.corpus_id, so a result names its corpus exactly).
    For the stdlib, the corpus the size's recorded runs name (`recorded_corpus`) before the running interpreter's:
    a record restored under another Python renders what was measured, and `ensure_lm` refuses to train beside it."""
    source = ctx.exp.SIZES[ctx.size].get("source", "kjv")
    if source == "kjv":
        return "kjv.val"
    if source == "stdlib":
        from idattn.data import stdlib_corpus
        return recorded_corpus(ctx) or f"{stdlib_corpus.corpus_id()}.val"
    raise ReproError(f"size {ctx.size!r}: data source {source!r} has no held-out protocol here")


def recorded_corpus(ctx: Ctx) -> str | None:
    """The held-out corpus the size's language-model runs were scored on, as their extrapolation results name it
    (e.g. `python-stdlib-3.11.7-dcb608b59349.val`); None when no run has one. Runs moved aside are not read; runs
    of one size that name two corpora are refused."""
    import glob
    found = set()
    for path in glob.glob(os.path.join(ctx.root, "runs", ctx.size, "lm", "*", "eval", "extrapolation-*.json")):
        if ".stale-" in path:
            continue
        try:
            with open(path) as f:
                found.add(str(json.load(f)["protocol"]["corpus"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if len(found) > 1:
        raise ReproError(f"size {ctx.size!r}: its runs were scored on {len(found)} corpora "
                         f"({', '.join(sorted(found))}); move aside the runs of all but one under "
                         f"{os.path.join(ctx.root, 'runs', ctx.size)}")
    return next(iter(found), None)


def check_corpus(ctx: Ctx) -> None:
    """Refuses (one line, before anything is written) to train a stdlib run under an interpreter whose standard
    library is not the corpus the size's recorded runs were trained on: the table would set unlike numbers side by
    side."""
    if ctx.exp.SIZES[ctx.size].get("source", "kjv") != "stdlib":
        return
    from idattn.data import stdlib_corpus
    recorded, here = recorded_corpus(ctx), f"{stdlib_corpus.corpus_id()}.val"
    if recorded is not None and recorded != here:
        raise ReproError(f"size {ctx.size!r}: its runs were trained on {recorded[:-len('.val')]}, this interpreter's "
                         f"standard library is {here[:-len('.val')]}; train it under that Python, or move "
                         f"{os.path.join(ctx.root, 'runs', ctx.size)} aside to start the size over on this one")


def ppl_protocol(ctx: Ctx, L: int) -> dict[str, Any]:
    return {"corpus": corpus_name(ctx), "tokens": int(ctx.exp.EVAL_TOKENS[ctx.size]), "context": int(L),
            "method": "held-out stream prefix cut into rows of `context` tokens, each a fresh context"}


def lm_ppl(ctx: Ctx, mixer: str, dt: str, seed: int, lengths) -> dict[int, float] | None:
    """{L: perplexity} of one run (trains / evaluates what is missing); None when not available."""
    from idattn.rundir.schema import result_path, write_result
    rec = ensure_lm(ctx, mixer, dt, seed)
    if rec is None:
        return None
    wd = ctx.lm_dir(mixer, dt, seed)
    step = int(rec["steps"])
    out: dict[int, float] = {}
    todo = []
    for L in lengths:
        path = result_path(wd, "extrapolation", step, ppl_protocol(ctx, L))
        if os.path.exists(path):
            with open(path) as f:
                out[L] = float(json.load(f)["metrics"][f"ppl@{L}"])
        else:
            todo.append(L)
    if todo and ctx.skip(mixer, dt):
        return out or None
    if todo:
        from idattn.studies.quickstart import perplexities
        from idattn.rundir import load_params
        t0 = time.time()
        cfg, params = load_params(wd)
        tok = ctx.tokenizer(cfg)
        for L in todo:
            v = perplexities(cfg, params, tok, [L], int(ctx.exp.EVAL_TOKENS[ctx.size]))[L]
            write_result(wd, "extrapolation", step, {f"ppl@{L}": v},
                         run={"workdir": wd, "mixer": mixer, "params": rec.get("params"), "size": f"repro-{ctx.size}",
                              "seq_len": int(cfg.data.seq_len), "dt": dt, "seed": seed},
                         protocol=ppl_protocol(ctx, L))
            out[L] = v
        rec = read_marker(wd)
        rec["eval_s"] = float(rec.get("eval_s", 0.0)) + (time.time() - t0)
        write_marker(wd, rec)
        log(f"evaluated {os.path.basename(wd)} at {todo}: " + ", ".join(f"{out[L]:.2f}" for L in todo))
        archive_now(ctx)
    return out


def run_cost(wd: str) -> float:
    rec = read_marker(wd)
    return float(rec.get("train_s", 0.0)) + float(rec.get("eval_s", 0.0)) + float(rec.get("recall_s", 0.0))


MQAR_PARAMS = "params.msgpack"  # an MQAR run's trained parameters (flax msgpack): what verify_mqar re-scores
MQAR_ACC_TOL = 1e-3  # re-scored accuracy may move by this much (4 of 4,000 queries at 1,000 x 4): argmax near-ties


def mqar_metrics(q, acc: float, grid: dict[str, float]) -> dict[str, float]:
    """An MQAR run's recorded metrics: accuracy at the training setting and at each test-grid "T/P"."""
    out = {f"mqar@{q.seq_len}x{q.num_kv_pairs}/acc": acc}
    out.update({f"mqar@{k.replace('/', 'x')}/acc": v for k, v in grid.items()})
    return out


def save_mqar_params(wd: str, params) -> None:
    from flax import serialization
    os.makedirs(wd, exist_ok=True)
    tmp = os.path.join(wd, MQAR_PARAMS + ".tmp")
    with open(tmp, "wb") as f:
        f.write(serialization.msgpack_serialize(serialization.to_state_dict(params)))
    os.replace(tmp, os.path.join(wd, MQAR_PARAMS))


def verify_mqar(ctx: Ctx, mixer: str, seed: int, wd: str):
    """(same?, why): the saved MQAR model re-scored with the current code on the run's own test sets
    (idattn.eval.recall.mqar_scores), against its recorded accuracies (each within MQAR_ACC_TOL)."""
    from idattn.rundir.schema import read_results
    path = os.path.join(wd, MQAR_PARAMS)
    recs = read_results(wd, "recall")
    if not os.path.exists(path) or not recs:
        return False, "no saved parameters to re-score (trained before they were kept)"
    c = ctx.exp.get_mqar_config(mixer, ctx.size)
    q = c.mqar
    old = recs[-1]["metrics"]
    try:
        import jax
        import jax.numpy as jnp
        from flax import serialization

        from idattn.eval.recall import mqar_scores
        from idattn.models import build_model
        with open(path, "rb") as f:
            params = serialization.msgpack_restore(f.read())
        apply = jax.jit(build_model(c.model).apply)
        acc, grid = mqar_scores(lambda x: apply({"params": params}, jnp.asarray(x)),
                                vocab_size=int(q.vocab_size or c.model.vocab_size), seq_len=q.seq_len,
                                num_kv_pairs=q.num_kv_pairs, num_test=q.num_test, seed=seed,
                                test_grid=tuple(q.test_grid))
    except Exception as e:  # noqa: BLE001 - a changed parameter tree is the expected way to fail here
        return False, f"the saved parameters no longer load: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    new = mqar_metrics(q, acc, grid)
    worst = max((abs(new[k] - float(old.get(k, float("inf")))) for k in new), default=0.0)
    key = f"mqar@{q.seq_len}x{q.num_kv_pairs}/acc"
    return worst <= MQAR_ACC_TOL, f"{key} recorded {float(old.get(key, float('nan'))):.4f}, now {acc:.4f}"


# model-config keys that choose how a model is executed, not what it computes: left out of an MQAR run's "model"
EXECUTION_KEYS = ("impl", "attn_impl", "remat", "scan_layers")


def mqar_model_record(model_cfg) -> dict[str, Any]:
    """The MQAR model as a run's marker records it (JSON, without the execution-only keys)."""
    return {k: v for k, v in json.loads(json.dumps(model_cfg.to_dict(), default=str)).items()
            if k not in EXECUTION_KEYS}


def trained_on() -> str:
    """Where a run trains, as its marker records it: "<platform>:<device kind>" of the first device (e.g. "cpu:cpu",
    "gpu:NVIDIA H200"); markers from before this was recorded have none and were all trained on CPU hosts."""
    import jax
    d = jax.devices()[0]
    return f"{d.platform}:{d.device_kind}"


def ensure_mqar(ctx: Ctx, mixer: str, seed: int) -> dict[str, Any] | None:
    from idattn.eval.recall import train_mqar
    from idattn.rundir.schema import read_results, write_result
    wd = ctx.mqar_dir(mixer, seed)
    c = ctx.exp.get_mqar_config(mixer, ctx.size)
    q = c.mqar
    recipe = json.loads(json.dumps(q.to_dict()))  # the task and optimiser (experiments/repro.py MQAR), as JSON
    # the model it trains (experiments/repro.py get_mqar_config: depth, window, widths), recorded beside the recipe
    # so that a change of the MQAR model (e.g. HYBRID_MQAR) retrains the run; a marker from before this was recorded
    # has no "model": it is taken as the current one (those runs were trained with the configs of their commit) and
    # stamped with it when reused
    model = mqar_model_record(c.model)
    same = lambda m: m.get("recipe") == recipe and m.get("model", model) == model  # noqa: E731
    if ctx.skip(mixer):
        recs = read_results(wd, "recall") if os.path.isdir(wd) else []
        m = read_only(ctx, wd)
        return recs[-1] if recs and m.get("status") == "done" and same(m) else None
    src = source_hash()
    old = read_marker(wd)
    if old and not same(old) and not ctx.keep_stale:
        why = (f"another MQAR recipe ({old.get('recipe')} != {recipe})" if old.get("recipe") != recipe else
               "another MQAR model (" + ", ".join(f"{k}: {old['model'].get(k)} != {v}" for k, v in model.items()
                                                  if old["model"].get(k) != v) + ")")
        move_aside(wd, old, f"trained with {why}")
    # a run saved with its parameters (MQAR_PARAMS) is re-scored under new model code; an older one is retrained
    train_src = synthetic_train_hash()
    rec = check_reuse(wd, src, ctx.keep_stale, verify=lambda: verify_mqar(ctx, mixer, seed, wd), train_src=train_src,
                      model=c.model, ctx=ctx)
    if rec.get("status") == "done":
        recs = read_results(wd, "recall")
        if recs:
            if "model" not in rec and not rec.get("stale"):  # stamped once, as train_src is
                write_marker(wd, dict(rec, model=model))
            return recs[-1]
    log(f"MQAR {mixer} seed {seed}: T={q.seq_len}, {q.num_kv_pairs} pairs, {q.steps} steps x {q.batch_size}")
    write_marker(wd, {"src": src, "train_src": train_src, "mixer": mixer, "seed": seed, "size": ctx.size,
                       "status": "training", "recipe": recipe, "model": model, "trained_on": trained_on()})
    t0 = time.time()
    res = train_mqar(c.model, seq_len=q.seq_len, num_kv_pairs=q.num_kv_pairs, vocab_size=q.vocab_size,
                     num_train=q.num_train, num_test=q.num_test, steps=q.steps, batch_size=q.batch_size, lr=q.lr,
                     weight_decay=q.weight_decay, warmup=q.warmup, seed=seed, test_grid=tuple(q.test_grid),
                     log_every=max(1, q.steps // 4), log=lambda s: log(f"[{mixer} s{seed}] {s}"))
    save_mqar_params(wd, res.pop("params"))
    metrics = mqar_metrics(q, res["acc"], res["grid"])
    write_result(wd, "recall", q.steps, metrics, run={"mixer": mixer, "size": f"repro-{ctx.size}", "task": "mqar",
                                                     "seed": seed},
                 details=res, protocol={"corpus": "mqar", "tokens": int(q.num_test), "context": int(q.seq_len),
                                        "method": "Zoology MQAR, accuracy at query positions"})
    log(f"MQAR {mixer} seed {seed}: acc {res['acc']:.3f} ({time.time() - t0:.0f} s)")
    finish_run(ctx, wd, {"src": src, "train_src": train_src, "mixer": mixer, "seed": seed, "size": ctx.size,
                         "status": "done", "recipe": recipe, "model": model, "train_s": time.time() - t0,
                         "trained_on": trained_on()}, c.model)
    return read_results(wd, "recall")[-1]


def text_recall(ctx: Ctx, mixer: str, seed: int) -> dict[str, float] | None:
    """S-NIAH-1 and phonebook accuracy of the `ppl` run (mixer, scaled Δ, seed)."""
    from idattn.rundir.schema import result_path, write_result
    tr = ctx.exp.TEXT_RECALL[ctx.size]
    rec = ensure_lm(ctx, mixer, ctx.exp.PRIMARY_DT, seed)
    if rec is None:
        return None
    wd = ctx.lm_dir(mixer, ctx.exp.PRIMARY_DT, seed)
    niah = [int(round(r * ctx.train_len())) for r in tr["niah_ratios"]]
    proto = {"corpus": "niah+phonebook", "tokens": int(tr["n"]), "context": niah + [f"pb{n}" for n in
                                                                                      tr["phonebook_sizes"]],
             "method": "greedy exact match of the answer (idattn.eval.recall)"}
    path = result_path(wd, "recall", int(rec["steps"]), proto)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["metrics"]
    if ctx.skip(mixer):
        return None
    from idattn.eval.recall import run_text_recall
    from idattn.eval.scoring import model_score_fn
    from idattn.models import build_model
    from idattn.rundir import load_params
    t0 = time.time()
    cfg, params = load_params(wd)
    tok = ctx.tokenizer(cfg)
    metrics, details = run_text_recall(model_score_fn(build_model(cfg.model), params), tok, niah_lengths=niah,
                                       phonebook_sizes=tr["phonebook_sizes"], n=int(tr["n"]), batch_size=4)
    write_result(wd, "recall", int(rec["steps"]), metrics, run={"workdir": wd, "mixer": mixer,
                                                               "size": f"repro-{ctx.size}", "seed": seed},
                 details=details, protocol=proto)
    rec = read_marker(wd)
    rec["recall_s"] = float(rec.get("recall_s", 0.0)) + (time.time() - t0)
    write_marker(wd, rec)
    log(f"text recall {os.path.basename(wd)}: " + ", ".join(f"{k} {v:.2f}" for k, v in metrics.items()))
    return metrics


CONTEXT_BUCKETS = 8


def context_buckets(nll, mask, segment_ids, length: int, num_buckets: int = CONTEXT_BUCKETS) -> dict[str, Any]:
    """Per-bucket perplexity by the context a token had: its column minus the first column of its segment (a
    packed row restarts the context at a document boundary). nll, mask, segment_ids: [rows, L] arrays.
    `ratio` = ppl of the last bucket / ppl of the first (below 1: the model uses its context)."""
    import numpy as np
    nll, mask, seg = np.asarray(nll, np.float64), np.asarray(mask, np.float64), np.asarray(segment_ids)
    cols = np.broadcast_to(np.arange(seg.shape[1]), seg.shape)
    start = np.zeros(seg.shape, np.int64)
    for r in range(seg.shape[0]):  # first column of each token's segment
        new = np.concatenate([[True], seg[r, 1:] != seg[r, :-1]])
        start[r] = np.maximum.accumulate(np.where(new, cols[r], 0))
    ctx_len = cols - start
    width = max(1, -(-length // num_buckets))
    edges = list(range(0, length, width)) + [length]
    ppl = []
    for a, b in zip(edges[:-1], edges[1:]):
        m = mask * ((ctx_len >= a) & (ctx_len < b))
        ppl.append(float(np.exp((nll * m).sum() / m.sum())) if m.sum() > 0 else None)
    ratio = ppl[-1] / ppl[0] if ppl and ppl[0] and ppl[-1] else None
    return {"edges": edges, "bucket_ppl": ppl, "ratio": ratio}


def context_protocol(ctx: Ctx) -> dict[str, Any]:
    """The protocol of a `context_use` result: the `ppl` protocol's tokens at the training length, bucketed."""
    return dict(ppl_protocol(ctx, ctx.train_len()), method="per-token nll bucketed by the context each token had "
                                                            f"({CONTEXT_BUCKETS} buckets of the training length)")


def context_use(ctx: Ctx, mixer: str, dt: str, seed: int) -> dict[str, Any] | None:
    """Position-bucket perplexity of one run at its training length on the `ppl` protocol's held-out tokens
    (`context_buckets`); written to / read from `eval/context-*.json`; None when not available."""
    from idattn.rundir.schema import result_path, write_result
    rec = ensure_lm(ctx, mixer, dt, seed)
    if rec is None:
        return None
    wd = ctx.lm_dir(mixer, dt, seed)
    L = ctx.train_len()
    proto = context_protocol(ctx)
    path = result_path(wd, "context", int(rec["steps"]), proto)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["details"]
    if ctx.skip(mixer, dt):
        return None
    import jax
    import numpy as np

    from idattn.models import build_model
    from idattn.rundir import load_params
    from idattn.studies.quickstart import eval_batches
    from idattn.train.step import token_nll
    t0 = time.time()
    cfg, params = load_params(wd)
    model = build_model(cfg.model)
    fn = jax.jit(lambda p, b: token_nll(model.apply({"params": p}, b["inputs"], segment_ids=b["segment_ids"],
                                                    positions=b["positions"]), b["targets"]))
    nll, mask, seg = [], [], []
    for b in eval_batches(cfg, ctx.tokenizer(cfg), L, int(ctx.exp.EVAL_TOKENS[ctx.size])):
        nll.append(np.asarray(fn(params, b)))
        mask.append(np.asarray(b["loss_mask"]))
        seg.append(np.asarray(b["segment_ids"]))
    out = context_buckets(np.concatenate(nll), np.concatenate(mask), np.concatenate(seg), L)
    write_result(wd, "context", int(rec["steps"]), {"context/ratio_last_first": out["ratio"] or float("nan")},
                 run={"workdir": wd, "mixer": mixer, "size": f"repro-{ctx.size}", "dt": dt, "seed": seed},
                 details=out, protocol=proto)
    rec = read_marker(wd)
    rec["eval_s"] = float(rec.get("eval_s", 0.0)) + (time.time() - t0)
    write_marker(wd, rec)
    log(f"context use {os.path.basename(wd)}: last / first bucket ppl {out['ratio']}")
    return out


def write_table(ctx: Ctx, table: str, md: str, data: dict[str, Any]) -> None:
    """<root>/<table>[-<size>].md and .json, each written whole and renamed (a kill leaves the previous one)."""
    os.makedirs(ctx.root, exist_ok=True)
    for ext, text in (("json", json.dumps(data, indent=1, sort_keys=True, default=float)), ("md", md + "\n")):
        path = ctx.table_path(table, ext)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    log(f"wrote {ctx.table_path(table, 'md')} and .json")


# ----------------------------------------------------------------------------------------------------------------
# a record of finished runs that outlives the root (the root is a scratch folder; machines are not kept)

ARCHIVE_FORMAT = "idattn.repro runs v1"


def run_dirs(root: str):
    """Every run folder under `<root>/runs` (a folder with a marker; never one moved aside as `.stale-`)."""
    base = os.path.join(root, "runs")
    for top, dirs, _ in os.walk(base):
        dirs[:] = sorted(d for d in dirs if ".stale-" not in d)
        if os.path.exists(os.path.join(top, MARKER)):
            dirs[:] = []  # a run's own sub-folders (checkpoints, eval) are not runs
            yield top


# Marker keys that later checks add to, or rewrite in, a finished run's marker without retraining it (the
# re-verification of check_reuse, the fingerprint stamps of idattn/studies/fingerprint.py, evaluation times). The
# other keys (seed, size, recipe, train_s, losses, ...) are fixed when the run finishes: they identify the training.
STAMP_KEYS = frozenset({"src", "verified", "fingerprint", "train_src", "stale", "eval_s", "recall_s"})


def _same_training(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k not in STAMP_KEYS} == {k: v for k, v in b.items() if k not in STAMP_KEYS}


def _supersedes(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Of two markers of the same training (`_same_training`, checked by the caller): `a` has checks added since
    `b`: its `verified` history extends b's, and it has more of it, or a fingerprint / training-code stamp b lacks."""
    va, vb = a.get("verified", []), b.get("verified", [])
    if va[:len(vb)] != vb:
        return False
    return len(va) > len(vb) or any(k in a and k not in b for k in ("fingerprint", "train_src"))


def merge_run(recorded: dict[str, str] | None, found: dict[str, str]) -> dict[str, str]:
    """One run's files for the record, from the record's copy and the copy found under the study root.

    The root's copy wins (a retrained run replaces the old one whole), except where both are the same training:
    then the eval results are the union (the root's where both have one: an evaluation run since), and the marker
    is the record's when it supersedes the root's (`_supersedes`: the root holds a copy restored before the
    record's runs were re-verified or fingerprinted, and archiving it must not undo that)."""
    if not recorded or MARKER not in recorded:
        return found
    old, new = json.loads(recorded[MARKER]), json.loads(found[MARKER])
    if not _same_training(old, new):
        return found
    merged = {**recorded, **found}
    if _supersedes(old, new):
        merged[MARKER] = recorded[MARKER]
    return merged


def archive_runs(root: str, path: str) -> int:
    """Write every finished run under `<root>/runs` - its `repro.json` marker and its `eval/*.json` results,
    never a checkpoint - into one JSON file at `path` (written whole, then renamed), merged with the runs
    already recorded there (`merge_run`: a run present in both is taken from the root, unless the root's is an
    older copy of the same training than the record's). Returns the number of runs recorded.
    With `restore_runs` a later machine reuses them as finished runs (same model code and recipe: the markers
    are checked as usual), so a study can span sessions whose scratch folders do not survive."""
    runs: dict[str, dict[str, str]] = {}
    if os.path.exists(path):
        runs.update(_read_archive(path))
    for wd in run_dirs(root):
        if read_marker(wd).get("status") != "done":
            continue
        files = {MARKER: pathlib.Path(wd, MARKER).read_text()}
        ev = os.path.join(wd, "eval")
        for n in sorted(os.listdir(ev)) if os.path.isdir(ev) else []:
            if n.endswith(".json"):
                files[f"eval/{n}"] = pathlib.Path(ev, n).read_text()
        rel = os.path.relpath(wd, root)
        runs[rel] = merge_run(runs.get(rel), files)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"format": ARCHIVE_FORMAT, "runs": dict(sorted(runs.items()))}, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return len(runs)


def _read_archive(path: str) -> dict[str, dict[str, str]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ReproError(f"--restore / --archive {path}: cannot read it ({type(e).__name__}: {e}); expected the "
                         f"JSON that --archive writes") from None
    if not isinstance(data, dict) or data.get("format") != ARCHIVE_FORMAT:
        raise ReproError(f"{path}: not a runs record (format {data.get('format') if isinstance(data, dict) else None!r}"
                         f", expected {ARCHIVE_FORMAT!r}); write one with --archive")
    return data["runs"]


def restore_runs(path: str, root: str) -> int:
    """Recreate under `root` the recorded runs it does not have (a run folder that exists is never touched).
    Refuses, before writing anything, a record whose paths leave `<root>/runs` or name other files than a
    marker and eval/*.json results. Returns the number of runs restored."""
    runs = _read_archive(path)
    base = os.path.realpath(os.path.join(root, "runs"))
    for rel, files in runs.items():
        wd = os.path.realpath(os.path.join(root, rel))
        names_ok = all(n == MARKER or (n.startswith("eval/") and n.count("/") == 1 and n.endswith(".json"))
                       for n in files)
        if not wd.startswith(base + os.sep) or os.path.isabs(rel) or ".." in rel.split(os.sep) or not names_ok:
            raise ReproError(f"{path}: run {rel!r} (files {sorted(files)}) is not a run folder under "
                             f"<root>/runs with a marker and eval/*.json; refusing the whole record")
    n = 0
    for rel, files in runs.items():
        wd = os.path.join(root, rel)
        if os.path.exists(os.path.join(wd, MARKER)):
            continue
        for name, text in files.items():
            p = os.path.join(wd, name)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p + ".tmp", "w") as f:
                f.write(text)
            os.replace(p + ".tmp", p)
        n += 1
    return n
