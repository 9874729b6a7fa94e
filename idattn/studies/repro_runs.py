"""The reproduction's run kinds, each through the run cache (idattn.studies.runcache.cached): language models
(`lm_run`, trained by the real trainer), MQAR (`mqar_run`), MAD (`mad_run`) and state tracking (`state_run`);
the language models' evaluations (perplexity by length, text recall, perplexity by context position); and
`python -m idattn.repro verify` (`verify_runs`), every finished run judged by the identity the current configs give
its kind (`identity`, as `cached` judges it) and its model fingerprint.

Runs live at `<root>/runs/<size>/<lm|mqar|mad|state>/<name>/`. A language model is re-verified under new model code
by its perplexity at the training length (relative 1e-4), an MQAR model by re-scoring its saved parameters; every
kind first by its fingerprint.
"""
from __future__ import annotations

import glob
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import serialization

from idattn import atomic, train as trainer
from idattn.configs import packaged_config
from idattn.data import stdlib_corpus
from idattn.eval import mad as mad_lib, recall, state_tracking
from idattn.eval.perplexity import context_buckets, perplexities, token_nlls
from idattn.eval.scoring import model_score_fn
from idattn.models import build_model
from idattn.models.spec import cube_cells
from idattn.rundir import load_params
from idattn.rundir.layout import metrics_records, read_json
from idattn.rundir.schema import read_results, result_path, write_result
from idattn.studies import fingerprint, runcache
from idattn.studies.code_hash import synthetic_train_hash, train_code_hash
from idattn.studies.runcache import (Ctx, ReproError, add_time, archive_now, cached, differs, log, read_marker,
                                    run_cost, run_dirs, run_name, write_marker)

REPRO_CONFIG = packaged_config("repro")  # experiments/repro.py re-exports it
CONTEXT_BUCKETS = 8


# ------------------------------------------------------------------------------------------------ language models

def _plain(value: Any) -> Any:
    """`value` as a marker holds it: through JSON (tuples as lists; a value JSON cannot hold as its str)."""
    return json.loads(json.dumps(value, default=str))


def size_recipe(ctx: Ctx) -> dict[str, Any]:
    """The size's recipe (experiments/repro.py SIZES[size]) as JSON, in every LM marker: another recipe retrains."""
    return _plain(ctx.exp.SIZES[ctx.size])


def recorded_corpus(ctx: Ctx) -> str | None:
    """The held-out corpus the size's LM runs were scored on, as their extrapolation results name it (e.g.
    `python-stdlib-3.11.7-dcb608b59349.val`); None when no run has one; two corpora in one size are refused."""
    found = set()
    for path in glob.glob(os.path.join(ctx.root, "runs", ctx.size, "lm", "*", "eval", "extrapolation-*.json")):
        if ".stale-" in path:
            continue
        try:
            found.add(str(read_json(path, tolerate=())["protocol"]["corpus"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if len(found) > 1:
        raise ReproError(f"size {ctx.size!r}: its runs were scored on {len(found)} corpora "
                         f"({', '.join(sorted(found))}); move aside the runs of all but one under "
                         f"{os.path.join(ctx.root, 'runs', ctx.size)}")
    return next(iter(found), None)


def corpus_name(ctx: Ctx) -> str:
    """The held-out split the size's runs are scored on: `kjv.val`, or `<stdlib corpus_id>.val` (the one its
    recorded runs name before the running interpreter's: a record restored under another Python renders as
    measured)."""
    source = ctx.exp.SIZES[ctx.size].get("source", "kjv")
    if source == "kjv":
        return "kjv.val"
    if source == "stdlib":
        return recorded_corpus(ctx) or f"{stdlib_corpus.corpus_id()}.val"
    raise ReproError(f"size {ctx.size!r}: data source {source!r} has no held-out protocol here")


def check_corpus(ctx: Ctx) -> None:
    """Refuses to train a stdlib run under an interpreter whose standard library is not the corpus the size's
    recorded runs were trained on (the table would set unlike numbers side by side)."""
    if ctx.exp.SIZES[ctx.size].get("source", "kjv") != "stdlib":
        return
    recorded, here = recorded_corpus(ctx), f"{stdlib_corpus.corpus_id()}.val"
    if recorded is not None and recorded != here:
        raise ReproError(f"size {ctx.size!r}: its runs were trained on {recorded[:-len('.val')]}, this interpreter's "
                         f"standard library is {here[:-len('.val')]}; train it under that Python, or move "
                         f"{os.path.join(ctx.root, 'runs', ctx.size)} aside to start the size over on this one")


def ppl_protocol(ctx: Ctx, L: int) -> dict[str, Any]:
    return {"corpus": corpus_name(ctx), "tokens": int(ctx.exp.EVAL_TOKENS[ctx.size]), "context": int(L),
            "method": "held-out stream prefix cut into rows of `context` tokens, each a fresh context"}


def context_protocol(ctx: Ctx) -> dict[str, Any]:
    """The protocol of a `context_use` result: the `ppl` protocol's tokens at the training length, bucketed."""
    return dict(ppl_protocol(ctx, ctx.train_len()), method="per-token nll bucketed by the context each token had "
                                                            f"({CONTEXT_BUCKETS} buckets of the training length)")


def loss_curve(wd: str) -> list[list[float]]:
    """[[step, training loss], ...] from the trainer's metrics.jsonl (the loss of that step's batch), kept in the
    marker so that the record holds it (spikes are findings)."""
    out = {int(r["step"]): round(float(r["loss"]), 5) for r in metrics_records(wd) if "loss" in r and "step" in r}
    return [[k, out[k]] for k in sorted(out)]


def recorded_ppl(ctx: Ctx, wd: str, step: int, L: int) -> float | None:
    """The run's recorded ppl@L (its `extrapolation` result on the `ppl` protocol at L); None when not written."""
    path = result_path(wd, "extrapolation", step, ppl_protocol(ctx, L))
    return float(read_json(path, tolerate=())["metrics"][f"ppl@{L}"]) if os.path.exists(path) else None


def verify_lm(ctx: Ctx, wd: str, rec: dict[str, Any]):
    """(same?, why): the run's ppl at the training length, recomputed now, against the recorded (relative 1e-4)."""
    L = ctx.train_len()
    old = recorded_ppl(ctx, wd, int(rec.get("steps", -1)), L)
    if old is None:
        return False, "no recorded evaluation to compare with"
    try:
        cfg, params = load_params(wd)
        new = perplexities(cfg, params, ctx.tokenizer(cfg), [L], int(ctx.exp.EVAL_TOKENS[ctx.size]))[L]
    except Exception as e:  # noqa: BLE001 - a changed parameter tree is the expected way to fail here
        return False, f"the checkpoint no longer loads: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return abs(new - old) <= 1e-4 * abs(old), f"ppl@{L} recorded {old:.6g}, now {new:.6g}"


def lm_run(ctx: Ctx, mixer: str, dt: str, seed: int) -> dict[str, Any] | None:
    """Trains (or resumes / reuses) one language-model run; its marker, None when not available. A marker from
    before recipes were recorded is judged by its code alone."""
    wd, cfg = ctx.lm_dir(mixer, dt, seed), ctx.config(mixer, dt, seed)
    fields = {"mixer": mixer, "dt": dt, "seed": seed, "size": ctx.size}
    if not ctx.skip(mixer, dt):
        check_corpus(ctx)

    def train(rec):
        log(f"train {os.path.basename(wd)}: python -m idattn.train --config={REPRO_CONFIG}:{mixer},{ctx.size},{dt},"
            f"{seed} --workdir={wd}")
        summary = trainer.run(cfg, wd)
        if summary["status"] == "preempted":
            raise ReproError(f"{wd}: stopped by a signal; rerun the same command to resume")
        return {"params": int(summary["num_params"]), "steps": int(cfg.train.num_steps),
                "final_train_loss": summary.get("loss"), "loss_curve": loss_curve(wd)}

    return cached(ctx, wd, mixer=mixer, dt=dt, **identity(ctx, "lm", fields),
                  fields=dict(fields, dt_range=[float(cfg.model.dt_min), float(cfg.model.dt_max)]), train=train,
                  read=lambda rec: rec, train_src=train_code_hash(), verify=lambda: verify_lm(ctx, wd, read_marker(wd)))


def lm_ppl(ctx: Ctx, mixer: str, dt: str, seed: int, lengths) -> dict[int, float] | None:
    """{L: perplexity} of one run (trains / evaluates what is missing); None when not available."""
    rec = lm_run(ctx, mixer, dt, seed)
    if rec is None:
        return None
    wd, step = ctx.lm_dir(mixer, dt, seed), int(rec["steps"])
    out = {L: v for L in lengths if (v := recorded_ppl(ctx, wd, step, L)) is not None}
    todo = [L for L in lengths if L not in out]
    if todo and ctx.skip(mixer, dt):
        return out or None
    if todo:
        t0 = time.time()
        cfg, params = load_params(wd)
        for L in todo:
            out[L] = perplexities(cfg, params, ctx.tokenizer(cfg), [L], int(ctx.exp.EVAL_TOKENS[ctx.size]))[L]
            write_result(wd, "extrapolation", step, {f"ppl@{L}": out[L]},
                         run={"workdir": wd, "mixer": mixer, "params": rec.get("params"), "size": f"repro-{ctx.size}",
                              "seq_len": int(cfg.data.seq_len), "dt": dt, "seed": seed},
                         protocol=ppl_protocol(ctx, L))
        add_time(wd, "eval_s", t0)
        log(f"evaluated {os.path.basename(wd)} at {todo}: " + ", ".join(f"{out[L]:.2f}" for L in todo))
        archive_now(ctx)
    return out


class Tally:
    """What a table read: the recorded compute of its runs, the names of the runs it lacks and, per mixer, the
    parameter count its first language-model run recorded."""

    def __init__(self):
        self.cost, self.missing, self.params = 0.0, [], {}

    def take(self, value, wd: str, name: str | None = None, cost: bool = True):
        """`value`, one run's result, adding the run's recorded compute (unless `cost` is false: a run counted
        elsewhere); None when there is none, the run named missing (`name`, else its folder's name)."""
        if value is None:
            self.missing.append(os.path.basename(wd) if name is None else name)
        elif cost:
            self.cost += run_cost(wd)
        return value

    def ppl(self, ctx: Ctx, mixer: str, dt: str, seed: int, lengths, name: str | None = None,
            cost: bool = True) -> dict[int, float] | None:
        """lm_ppl's {L: perplexity} of one run when it has every length of `lengths`, else None (`take`)."""
        r, wd = lm_ppl(ctx, mixer, dt, seed, lengths), ctx.lm_dir(mixer, dt, seed)
        if r is not None and all(L in r for L in lengths):
            self.params.setdefault(mixer, read_marker(wd).get("params"))
            return self.take(r, wd, name, cost)
        return self.take(None, wd, name, cost)


def text_recall_setup(ctx: Ctx) -> tuple[list[int], list[str]]:
    """The text-recall suite's S-NIAH-1 lengths (TEXT_RECALL's ratios of the training length) and its metric keys."""
    tr = ctx.exp.TEXT_RECALL[ctx.size]
    niah = [int(round(r * ctx.train_len())) for r in tr["niah_ratios"]]
    return niah, [f"niah@{n}/acc" for n in niah] + [f"phonebook@{n}/acc" for n in tr["phonebook_sizes"]]


def text_recall(ctx: Ctx, mixer: str, seed: int) -> dict[str, float] | None:
    """S-NIAH-1 and phonebook accuracy of the `ppl` run (mixer, primary Δ, seed)."""
    tr = ctx.exp.TEXT_RECALL[ctx.size]
    rec = lm_run(ctx, mixer, ctx.exp.PRIMARY_DT, seed)
    if rec is None:
        return None
    wd = ctx.lm_dir(mixer, ctx.exp.PRIMARY_DT, seed)
    niah = text_recall_setup(ctx)[0]
    proto = {"corpus": "niah+phonebook", "tokens": int(tr["n"]), "context": niah + [f"pb{n}" for n in
                                                                                      tr["phonebook_sizes"]],
             "method": "greedy exact match of the answer (idattn.eval.recall)"}
    path = result_path(wd, "recall", int(rec["steps"]), proto)
    if os.path.exists(path):
        return read_json(path, tolerate=())["metrics"]
    if ctx.skip(mixer):
        return None
    t0 = time.time()
    cfg, params = load_params(wd)
    metrics, details = recall.run_text_recall(model_score_fn(build_model(cfg.model), params), ctx.tokenizer(cfg),
                                              niah_lengths=niah, phonebook_sizes=tr["phonebook_sizes"],
                                              n=int(tr["n"]), batch_size=4)
    write_result(wd, "recall", int(rec["steps"]), metrics, run={"workdir": wd, "mixer": mixer,
                                                               "size": f"repro-{ctx.size}", "seed": seed},
                 details=details, protocol=proto)
    add_time(wd, "recall_s", t0)
    log(f"text recall {os.path.basename(wd)}: " + ", ".join(f"{k} {v:.2f}" for k, v in metrics.items()))
    return metrics


def context_use(ctx: Ctx, mixer: str, dt: str, seed: int) -> dict[str, Any] | None:
    """Position-bucket perplexity of one run at its training length on the `ppl` protocol's held-out tokens
    (idattn.eval.perplexity.context_buckets), in `eval/context-*.json`; None when not available."""
    rec = lm_run(ctx, mixer, dt, seed)
    if rec is None:
        return None
    wd, L = ctx.lm_dir(mixer, dt, seed), ctx.train_len()
    path = result_path(wd, "context", int(rec["steps"]), context_protocol(ctx))
    if os.path.exists(path):
        return read_json(path, tolerate=())["details"]
    if ctx.skip(mixer, dt):
        return None
    t0 = time.time()
    cfg, params = load_params(wd)
    nll = token_nlls(cfg, params, ctx.tokenizer(cfg), L, int(ctx.exp.EVAL_TOKENS[ctx.size]))
    out = context_buckets(*nll, L, CONTEXT_BUCKETS)
    write_result(wd, "context", int(rec["steps"]), {"context/ratio_last_first": out["ratio"] or float("nan")},
                 run={"workdir": wd, "mixer": mixer, "size": f"repro-{ctx.size}", "dt": dt, "seed": seed},
                 details=out, protocol=context_protocol(ctx))
    add_time(wd, "eval_s", t0)
    log(f"context use {os.path.basename(wd)}: last / first bucket ppl {out['ratio']}")
    return out


# ------------------------------------------------------------------------------------------------ MQAR

MQAR_PARAMS = "params.msgpack"  # an MQAR run's trained parameters (flax msgpack): what verify_mqar re-scores
MQAR_ACC_TOL = 1e-3  # re-scored accuracy may move by this much (4 of 4,000 queries at 1,000 x 4): argmax near-ties
EXECUTION_KEYS = ("impl", "attn_impl", "remat", "scan_layers")  # how a model runs, not what it computes


def mqar_keys(mq) -> list[str]:
    """The result keys of an MQAR recipe (experiments/repro.py MQAR[size]): its training setting, then its test grid."""
    return [f"mqar@{mq['seq_len']}x{mq['num_kv_pairs']}/acc"] + [f"mqar@{T}x{p}/acc" for T, p in mq["test_grid"]]


def mqar_model_record(model_cfg) -> dict[str, Any]:
    """The MQAR model as a run's marker records it (JSON, without the execution-only keys)."""
    return {k: v for k, v in _plain(model_cfg.to_dict()).items() if k not in EXECUTION_KEYS}


def verify_mqar(ctx: Ctx, mixer: str, seed: int, wd: str):
    """(same?, why): the saved MQAR model re-scored now on the run's own test sets, against its recorded
    accuracies (each within MQAR_ACC_TOL)."""
    last = last_result(wd, "recall")
    if not os.path.exists(os.path.join(wd, MQAR_PARAMS)) or not last:
        return False, "no saved parameters to re-score (trained before they were kept)"
    c = ctx.exp.get_mqar_config(mixer, ctx.size)
    q, old = c.mqar, last["metrics"]
    try:
        with open(os.path.join(wd, MQAR_PARAMS), "rb") as f:
            params = serialization.msgpack_restore(f.read())
        apply = jax.jit(build_model(c.model).apply)
        acc, grid = recall.mqar_scores(lambda x: apply({"params": params}, jnp.asarray(x)),
                                       vocab_size=int(q.vocab_size or c.model.vocab_size), seq_len=q.seq_len,
                                       num_kv_pairs=q.num_kv_pairs, num_test=q.num_test, seed=seed,
                                       test_grid=tuple(q.test_grid))
    except Exception as e:  # noqa: BLE001 - a changed parameter tree is the expected way to fail here
        return False, f"the saved parameters no longer load: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    new = recall.mqar_metrics(q.seq_len, q.num_kv_pairs, acc, grid)
    worst = max((abs(new[k] - float(old.get(k, float("inf")))) for k in new), default=0.0)
    key = f"mqar@{q.seq_len}x{q.num_kv_pairs}/acc"
    return worst <= MQAR_ACC_TOL, f"{key} recorded {float(old.get(key, float('nan'))):.4f}, now {acc:.4f}"


def mqar_run(ctx: Ctx, mixer: str, seed: int) -> dict[str, Any] | None:
    """The last recall result of one MQAR run (experiments/repro.py MQAR, get_mqar_config), trained if needed. The
    marker records the task model beside the recipe (a marker without one is taken as the current and stamped)."""
    wd, c = ctx.mqar_dir(mixer, seed), ctx.exp.get_mqar_config(mixer, ctx.size)
    q = c.mqar

    def train(rec):
        log(f"MQAR {mixer} seed {seed}: T={q.seq_len}, {q.num_kv_pairs} pairs, {q.steps} steps x {q.batch_size}")
        # the recipe's fields are train_mqar's arguments (the run's seed in place of the config's)
        res = recall.train_mqar(c.model, **dict(q.to_dict(), seed=seed, test_grid=tuple(q.test_grid)),
                                log_every=max(1, q.steps // 4), log=lambda s: log(f"[{mixer} s{seed}] {s}"))
        params = res.pop("params")
        atomic.write_bytes(os.path.join(wd, MQAR_PARAMS),
                           serialization.msgpack_serialize(serialization.to_state_dict(params)))
        write_result(wd, "recall", q.steps, recall.mqar_metrics(q.seq_len, q.num_kv_pairs, res["acc"], res["grid"]),
                     run={"mixer": mixer, "size": f"repro-{ctx.size}", "task": "mqar", "seed": seed}, details=res,
                     protocol={"corpus": "mqar", "tokens": int(q.num_test), "context": int(q.seq_len),
                               "method": "Zoology MQAR, accuracy at query positions"})
        return {}

    fields = {"mixer": mixer, "seed": seed, "size": ctx.size}
    return cached(ctx, wd, mixer=mixer, **identity(ctx, "mqar", fields), stamp_legacy=True, fields=fields,
                  train=train, read=lambda rec: last_result(wd, "recall"),
                  train_src=synthetic_train_hash(), verify=lambda: verify_mqar(ctx, mixer, seed, wd))


def mqar_by_seed(ctx: Ctx, mixers, seeds, got: Tally) -> tuple[dict, dict]:
    """The MQAR runs of `mixers` x `seeds` (seed-major), trained if needed: ({mixer: {seed: {key: accuracy}}} over
    mqar_keys of the size's recipe, {mixer: {seed: the last logged training loss}}); `got` takes each run."""
    keys, acc, loss = mqar_keys(ctx.exp.MQAR[ctx.size]), {m: {} for m in mixers}, {m: {} for m in mixers}
    for s in seeds:
        for m in mixers:
            r = got.take(mqar_run(ctx, m, s), ctx.mqar_dir(m, s), f"mqar {m}-s{s}")
            if r is not None:
                acc[m][s] = {k: r["metrics"].get(k) for k in keys}
                loss[m][s] = (r.get("details") or {}).get("loss")
    return acc, loss


# ------------------------------------------------------------------------------------------------ MAD

def cells() -> list[str]:
    """Softmax and the eight cells of the mechanism cube."""
    return ["softmax"] + list(cube_cells())


def mad_dir(ctx: Ctx, cell: str, task: str, seed: int) -> str:
    return os.path.join(ctx.root, "runs", ctx.size, "mad", f"{run_name(cell)}-{task}-s{seed}")


def mad_recipe(ctx: Ctx) -> dict[str, Any]:
    return _plain({k: v for k, v in ctx.exp.MAD_SIZES[ctx.size].items() if k != "tasks"})


def task_model_config(ctx: Ctx, mixer: str, recipe: dict[str, Any], vocab_size: int):
    """The MQAR recipe's model for `mixer` at a synthetic task recipe's width and depth (`recipe["model"]`; a recipe
    of its own names the size whose MQAR model it trains: `model_size`), with the task's vocabulary."""
    c = ctx.exp.get_mqar_config(mixer, recipe.get("model_size", ctx.size)).model
    c.update(recipe["model"])
    c.vocab_size = vocab_size
    return c


def last_result(wd: str, suite: str) -> dict[str, Any] | None:
    """The run's newest `suite` result, or None."""
    recs = read_results(wd, suite) if os.path.isdir(wd) else []
    return recs[-1] if recs else None


def mad_model_config(ctx: Ctx, cell: str):
    """MAD's model for `cell` (task_model_config) with a vocabulary holding every MAD task's (memorization: 256)."""
    return task_model_config(ctx, cell, ctx.exp.MAD_SIZES[ctx.size], 256)


def mad_run(ctx: Ctx, cell: str, task: str, seed: int) -> float | None:
    """Test accuracy of one (cell, task, seed) MAD run, trained if needed; None when not available."""
    fields = {"cell": cell, "task": task, "seed": seed, "size": ctx.size}
    wd, r, idn = mad_dir(ctx, cell, task, seed), ctx.exp.MAD_SIZES[ctx.size], identity(ctx, "mad", fields)

    def train(rec):
        log(f"MAD {task} {cell} seed {seed}: {r['steps']} steps x {r['batch_size']}")
        n = r.get("num_train")  # at most MAD's own (memorization keeps MAD's 256 sequences: its map is learnt from them)
        res = mad_lib.train_mad(idn["model"], task, steps=int(r["steps"]), batch_size=int(r["batch_size"]),
                                lr=float(r["lr"]), weight_decay=float(r["weight_decay"]), warmup=int(r["warmup"]),
                                seed=seed,
                                num_train=None if n is None else min(int(n), int(mad_lib.TASKS[task]["num_train"])),
                                num_test=r.get("num_test"), **dict(r.get("task_overrides", {}).get(task, {})))
        write_result(wd, "mad", int(r["steps"]), {f"mad/{task}/acc": float(res["acc"])},
                     run={"mixer": cell, "size": f"repro-{ctx.size}", "task": task, "seed": seed}, details=res,
                     protocol={"corpus": f"mad.{task}", "tokens": int(res.get("num_test", 0)),
                               "context": int(res.get("seq_len", 0)),
                               "method": "MAD (Poli et al. 2024) task, accuracy at scored positions (idattn.eval.mad)"})
        return {}

    def read(rec):
        r = last_result(wd, "mad")
        return float(r["metrics"][f"mad/{task}/acc"]) if r else None

    return cached(ctx, wd, mixer=cell, **idn, train=train, read=read, fields=fields, train_src=synthetic_train_hash())


# ------------------------------------------------------------------------------------------------ state tracking

def state_dir(ctx: Ctx, mixer: str, task: str, seed: int) -> str:
    return os.path.join(ctx.root, "runs", ctx.size, "state", f"{run_name(mixer)}-{task}-s{seed}")


def state_recipe(ctx: Ctx) -> dict[str, Any]:
    return _plain(ctx.exp.STATE_TRACKING[ctx.size])


KINDS = ("lm", "mqar", "mad", "state")  # runs/<size>/<kind>/<name>


def identity(ctx: Ctx, kind: str, rec: dict[str, Any]) -> dict[str, Any]:
    """A `kind` run with the marker fields `rec` as the current configs build it (`cached` and `repro verify` judge
    a marker by it): {"ident": the marker fields that make its training, "legacy": those an older marker may lack,
    "model": its model config}."""
    if kind == "mqar":
        c = ctx.exp.get_mqar_config(rec["mixer"], ctx.size)
        return {"ident": {"recipe": _plain(c.mqar.to_dict()), "model": mqar_model_record(c.model)},
                "legacy": ("model",), "model": c.model}
    model = (ctx.config(rec["mixer"], rec["dt"], int(rec["seed"])).model if kind == "lm" else
             mad_model_config(ctx, rec["cell"]) if kind == "mad" else
             task_model_config(ctx, rec["mixer"], ctx.exp.STATE_TRACKING[ctx.size], 16))  # state tasks: 4, 10 tokens
    recipe = {"lm": size_recipe, "mad": mad_recipe, "state": state_recipe}[kind](ctx)
    return {"ident": {"recipe": recipe}, "legacy": ("recipe",) if kind == "lm" else (), "model": model}


def state_run(ctx: Ctx, mixer: str, task: str, seed: int) -> dict[str, float] | None:
    """{"acc", "scaled"[, "train_loss"]} of one state-tracking run, trained if needed; None when not available."""
    fields = {"mixer": mixer, "task": task, "seed": seed, "size": ctx.size}
    wd, r, idn = state_dir(ctx, mixer, task, seed), ctx.exp.STATE_TRACKING[ctx.size], identity(ctx, "state", fields)

    def train(rec):
        log(f"state tracking {task} {mixer} seed {seed}: {r['steps']} steps x {r['batch_size']}")
        res = state_tracking.train_state_tracking(
            idn["model"], task, steps=int(r["steps"]), batch_size=int(r["batch_size"]), lr=float(r["lr"]),
            weight_decay=float(r["weight_decay"]), warmup=int(r["warmup"]), seed=seed, num_train=int(r["num_train"]),
            num_test=int(r["num_test"]), train_lengths=r.get("train_lengths"), test_lengths=r.get("test_lengths"),
            log_every=max(1, int(r["steps"]) // 4), log=lambda s: log(f"[{mixer} s{seed}] {s}"))
        write_result(wd, "state", int(r["steps"]), {f"state/{task}/acc": float(res["acc"]),
                                                    f"state/{task}/scaled": float(res["scaled"])},
                     run={"mixer": mixer, "size": f"repro-{ctx.size}", "task": task, "seed": seed}, details=res,
                     protocol={"corpus": f"state.{task}", "tokens": int(res["num_test"]),
                               "context": list(res["test_lengths"]),
                               "method": "accuracy at the `=` position, trained at the shorter lengths "
                                         "(idattn.eval.state_tracking)"})
        return {}

    def read(rec):
        r = last_result(wd, "state")
        if not r:
            return None
        met, det = r["metrics"], r.get("details") or {}
        out = {"acc": float(met[f"state/{task}/acc"]), "scaled": float(met[f"state/{task}/scaled"])}
        if det.get("loss") is not None:  # the last training batch's loss: was the task learnt at training lengths?
            out["train_loss"] = float(det["loss"])
        return out

    return cached(ctx, wd, mixer=mixer, **idn, train=train, read=read, fields=fields, train_src=synthetic_train_hash())


# ------------------------------------------------------------------------------------------------ verify

def run_model_config(ctx: Any, wd: str, rec: dict[str, Any]) -> tuple[Any, str]:
    """(model config, "") of a finished run as the current configs build it, or (None, why not): the run's kind
    from its folder (runs/<size>/<lm|mqar|mad|state>/<name>), its size, mixer, Δ range and seed from its marker.
    A run whose marker differs from the current config's identity (`identity`: its recipe, its MQAR
    model) is not this config's run."""
    parts = os.path.relpath(wd, ctx.root).split(os.sep)
    if len(parts) != 4 or parts[0] != "runs":
        return None, f"not a run folder runs/<size>/<kind>/<name>: {'/'.join(parts)}"
    if parts[2] not in KINDS:
        return None, f"unknown run kind {parts[2]!r}"
    try:
        idn = identity(ctx.for_size(parts[1]), parts[2], rec)
    except (KeyError, ValueError) as e:
        return None, f"its config no longer builds ({type(e).__name__}: {e})"
    other = differs(rec, idn["ident"], idn["legacy"])
    if other:
        return None, f"trained with another {parts[2]} {' and '.join(other)} than the current config's"
    return idn["model"], ""


def verify_runs(ctx: Any) -> dict[str, list[str]]:
    """Every finished run under ctx.root by its model fingerprint (fingerprint.check: stamped under the current
    model code, or re-stamped where the current code reproduces the recorded one; a run left "changed" is trained
    again by a table command, or listed by --render_only as read without checking). One probe per distinct model
    config. Returns {outcome: [run folder as <size>/<kind>/<name>, ...]}."""
    out: dict[str, list[str]] = {k: [] for k in ("stamped", "verified", "unchanged", "changed", "unverifiable",
                                                 "skipped")}
    cache: dict[str, list[float]] = {}
    src = runcache.source_hash()  # the current model code as the run cache judges it
    for wd in run_dirs(ctx.root):
        rec = read_marker(wd)
        if rec.get("status") != "done":
            continue
        name = os.path.relpath(wd, os.path.join(ctx.root, "runs"))
        outcome, why = fingerprint.check(rec, src, lambda: run_model_config(ctx, wd, rec), cache,
                                         log=lambda s: log(f"{name}: {s}"))
        if outcome in ("stamped", "verified"):
            write_marker(wd, rec)
        out[outcome].append(f"{name} ({why})" if outcome in ("changed", "skipped") else name)
    return out
