"""Issue 34's evaluation: what the selective core (per-token Δ_t, and Mamba-3's rotation θ_t) buys, on the tasks
where time-invariant cores are known to fail.

    python -m idattn.repro selective --root=DIR [--toy] [--restore=docs/reproduction-runs.json --archive=...]
        [--only=MIXERS --seeds=SEEDS --tasks=state,mad,mqar,lm]   # train a part; the rest is read

Six models (experiments/repro.py SELECTIVE), 3 seeds each: Softmax, Interdomain (LTI), Interdomain-selective,
Interdomain-selective+phase, S4D-only (LTI), and S4D-only-selective (the Mamba-like control: a selective decay and
no query readout). Each task keeps a recipe of the reproduction's lower points, where its seeds agree:

- selective copying and in-context recall: MAD's tasks, model (d 64 x 2) and optimiser with 10x the `mad` table's
  steps (SELECTIVE_MAD: the size `mad-s2000`, where Softmax learns selective copying; runs of their own);
- state tracking: parity and modular arithmetic without brackets (idattn.eval.state_tracking: trained at 3-40
  tokens, scored at 40-256, scaled accuracy; STATE_TRACKING);
- MQAR: the recall table's (trained at 64 x 4, scored at 64 x 4, 64 x 8, 128 x 16; MQAR);
- KJV perplexity at the climb's two lowest points (SELECTIVE_LM; the Softmax / Interdomain / S4D-only runs there
  are the climb's own).

Questions, each a paired per-seed difference (accuracy points) or log ratio (perplexity) judged by the project's
verdict rule (95% t interval over seeds; a word only when it excludes the line; idattn/studies/repro_verdicts.py):

  (s1) selectivity copies: acc(Interdomain-selective) − acc(Interdomain) > 0 on selective copying
  (s2) the phase tracks parity: scaled(Interdomain-selective+phase) − scaled(Interdomain-selective) > 0
  (s3) the phase tracks arithmetic: the same on modular arithmetic
  (s4) selectivity recalls: MQAR acc(Interdomain-selective) − acc(Interdomain) > 0 at 64 x 4
  (s5) selectivity models language: ppl(Interdomain) / ppl(Interdomain-selective) > 1, at each LM point
  (s6) the query readout still matters under a selective core: ppl(S4D-only-selective) /
       ppl(Interdomain-selective) > 1, at each LM point

Published numbers (Mamba: selective copying; Mamba-3: state tracking) are shown in their own table, beside ours
and never mixed with them: other models, data, lengths and training.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from idattn.eval.markdown import markdown_table
from idattn.studies.repro_runs import (LABEL, Ctx, check_reuse, ensure_mqar, finish_run, lm_ppl, log,
                                       missing_note, move_aside, read_marker, read_only, run_cost, run_name,
                                       source_hash, synthetic_train_hash, trained_on, write_marker, write_table)
from idattn.studies.repro_hybrid import answer_question

# (numerator model, denominator model, task key, line, side, text): differences in accuracy points
ACC_QUESTIONS = {
    "s1": ("interdomain-selective", "interdomain", "mad/selective_copying", 0.0, "above",
           "selectivity copies: acc(Interdomain-selective) − acc(Interdomain) > 0 on selective copying"),
    "s2": ("interdomain-selective+phase", "interdomain-selective", "state/parity", 0.0, "above",
           "the phase tracks parity: scaled acc(Interdomain-selective+phase) − scaled acc(Interdomain-selective) > 0"),
    "s3": ("interdomain-selective+phase", "interdomain-selective", "state/modular_arithmetic", 0.0, "above",
           "the phase tracks arithmetic: scaled acc(Interdomain-selective+phase) − scaled acc(Interdomain-selective) "
           "> 0 on modular arithmetic"),
    "s4": ("interdomain-selective", "interdomain", "mqar", 0.0, "above",
           "selectivity recalls: MQAR acc(Interdomain-selective) − acc(Interdomain) > 0 at the training setting"),
}
# (numerator, denominator, line, side, text): log ratios of perplexity, at each LM point
PPL_QUESTIONS = {
    "s5": ("interdomain", "interdomain-selective", 0.0, "above",
           "selectivity models language: ppl(Interdomain) / ppl(Interdomain-selective) > 1"),
    "s6": ("s4d_only-selective", "interdomain-selective", 0.0, "above",
           "the query readout still matters under a selective core: ppl(S4D-only-selective) / "
           "ppl(Interdomain-selective) > 1"),
}
# Published numbers the table echoes (BEYOND.md section 4), in %: other models, data and training.
PUBLISHED = (
    ("Mamba (arXiv 2312.00752), selective copying", "S4 (LTI) 18.3", "Mamba (selective) 99.8"),
    ("Mamba-3 (arXiv 2603.15569), parity, scaled", "Mamba-2 0.90; Mamba-3 without RoPE 2.27", "Mamba-3 100"),
    ("Mamba-3, arithmetic without brackets, scaled", "Mamba-2 47.81; Mamba-3 without RoPE 1.49", "Mamba-3 98.51"),
)


def label(mixer: str) -> str:
    base, sep, core = mixer.partition("-selective")
    name = LABEL.get(base, base)
    return f"{name}-selective{core}" if sep else name


def state_dir(ctx: Ctx, mixer: str, task: str, seed: int) -> str:
    return os.path.join(ctx.root, "runs", ctx.size, "state", f"{run_name(mixer)}-{task}-s{seed}")


def state_recipe(ctx: Ctx) -> dict[str, Any]:
    return json.loads(json.dumps(ctx.exp.STATE_TRACKING[ctx.size]))


def state_model_config(ctx: Ctx, mixer: str):
    """The MQAR recipe's model for `mixer` (experiments/repro.py get_mqar_config) at STATE_TRACKING's width and
    depth, with a 16-token vocabulary (the tasks use 4 and 10)."""
    c = ctx.exp.get_mqar_config(mixer, ctx.size).model
    c.update(ctx.exp.STATE_TRACKING[ctx.size]["model"])
    c.vocab_size = 16
    return c


def ensure_state(ctx: Ctx, mixer: str, task: str, seed: int) -> dict[str, float] | None:
    """{"acc", "scaled"} of one (mixer, task, seed) state-tracking run: read, or trained now; None if not there."""
    from idattn.eval.state_tracking import train_state_tracking
    from idattn.rundir.schema import read_results, write_result
    wd = state_dir(ctx, mixer, task, seed)
    recipe = state_recipe(ctx)
    m = read_marker(wd)

    def read() -> dict[str, float] | None:
        recs = read_results(wd, "state") if os.path.isdir(wd) else []
        if not recs:
            return None
        met, det = recs[-1]["metrics"], recs[-1].get("details") or {}
        out = {"acc": float(met[f"state/{task}/acc"]), "scaled": float(met[f"state/{task}/scaled"])}
        if det.get("loss") is not None:  # the last training batch's loss: was the task learnt at training lengths?
            out["train_loss"] = float(det["loss"])
        return out

    if ctx.skip(mixer):
        read_only(ctx, wd, m)  # names it when its model code is not the current
        return read() if m.get("status") == "done" and m.get("recipe") == recipe else None
    src = source_hash()
    if m and m.get("recipe") != recipe and not ctx.keep_stale:
        move_aside(wd, m, "trained with another state-tracking recipe")
    train_src = synthetic_train_hash()
    model = state_model_config(ctx, mixer)
    reused = check_reuse(wd, src, ctx.keep_stale, train_src=train_src, model=model, ctx=ctx)
    if reused.get("status") == "done" and read() is not None:
        return read()
    r = ctx.exp.STATE_TRACKING[ctx.size]
    write_marker(wd, {"src": src, "train_src": train_src, "mixer": mixer, "task": task, "seed": seed,
                       "size": ctx.size, "status": "training", "recipe": recipe, "trained_on": trained_on()})
    t0 = time.time()
    log(f"state tracking {task} {mixer} seed {seed}: {r['steps']} steps x {r['batch_size']}")
    res = train_state_tracking(model, task, steps=int(r["steps"]),
                               batch_size=int(r["batch_size"]), lr=float(r["lr"]),
                               weight_decay=float(r["weight_decay"]), warmup=int(r["warmup"]), seed=seed,
                               num_train=int(r["num_train"]), num_test=int(r["num_test"]),
                               train_lengths=r.get("train_lengths"), test_lengths=r.get("test_lengths"),
                               log_every=max(1, int(r["steps"]) // 4),
                               log=lambda s: log(f"[{mixer} s{seed}] {s}"))
    write_result(wd, "state", int(r["steps"]), {f"state/{task}/acc": float(res["acc"]),
                                                f"state/{task}/scaled": float(res["scaled"])},
                 run={"mixer": mixer, "size": f"repro-{ctx.size}", "task": task, "seed": seed}, details=res,
                 protocol={"corpus": f"state.{task}", "tokens": int(res["num_test"]),
                           "context": list(res["test_lengths"]),
                           "method": "accuracy at the `=` position, trained at the shorter lengths "
                                     "(idattn.eval.state_tracking)"})
    finish_run(ctx, wd, {"src": src, "train_src": train_src, "mixer": mixer, "task": task, "seed": seed,
                         "size": ctx.size, "status": "done", "recipe": recipe, "train_s": time.time() - t0,
                         "trained_on": trained_on()}, model)
    return read()


def table_selective(ctx: Ctx) -> dict[str, Any]:
    """Trains what is missing (cheapest first, seed-major) and writes <root>/selective[-toy].md and .json."""
    from idattn.studies.repro_mad import ensure_mad, mad_dir
    t0 = time.time()
    sel = ctx.exp.SELECTIVE
    seeds = list(ctx.seeds) if ctx.seeds_given else list(sel["seeds"] if ctx.size != "toy" else ctx.seeds)
    mixers = list(sel["mixers"])
    acc: dict[str, dict[str, dict[int, float]]] = {}  # task key -> mixer -> seed -> accuracy (scaled for state)
    raw: dict[str, dict[str, dict[int, float]]] = {}  # state tasks: the unscaled accuracy
    train_loss: dict[str, dict[str, dict[int, float]]] = {}  # state tasks: the last training batch's loss
    missing, cost = [], 0.0

    def put(key, m, s, v, store=acc):
        store.setdefault(key, {x: {} for x in mixers})[m][s] = v

    # --tasks: the families this invocation trains (the others' runs are only read)
    sctx, qctx = ctx.for_task("state"), ctx.for_task("mqar")
    for s in seeds:  # the cheapest runs first: state tracking, then MAD, MQAR, the language models
        for task in sel["state_tasks"]:
            for m in mixers:
                r = ensure_state(sctx, m, task, s)
                if r is None:
                    missing.append(os.path.basename(state_dir(ctx, m, task, s)))
                    continue
                put(f"state/{task}", m, s, r["scaled"])
                put(f"state/{task}", m, s, r["acc"], raw)
                if "train_loss" in r:
                    put(f"state/{task}", m, s, r["train_loss"], train_loss)
                cost += run_cost(state_dir(ctx, m, task, s))
    mctx = ctx.for_task("mad").for_size(ctx.exp.SELECTIVE_MAD[ctx.size])  # the MAD size of this table
    for s in seeds:
        for task in sel["mad_tasks"]:
            for m in mixers:
                v = ensure_mad(mctx, m, task, s)
                if v is None:
                    missing.append(os.path.basename(mad_dir(mctx, m, task, s)))
                    continue
                put(f"mad/{task}", m, s, v)
                cost += run_cost(mad_dir(mctx, m, task, s))
    mq = ctx.exp.MQAR[ctx.size]
    mq_keys = [f"mqar@{mq['seq_len']}x{mq['num_kv_pairs']}/acc"] + [f"mqar@{T}x{p}/acc" for T, p in mq["test_grid"]]
    for s in seeds:
        for m in mixers:
            r = ensure_mqar(qctx, m, s)
            if r is None:
                missing.append(f"mqar {m}-s{s}")
                continue
            for k in mq_keys:
                if r["metrics"].get(k) is not None:
                    put(k, m, s, float(r["metrics"][k]))
            cost += run_cost(ctx.mqar_dir(m, s))
    dt = ctx.exp.PRIMARY_DT
    lm_sizes = list(ctx.exp.SELECTIVE_LM[ctx.size])
    ppl: dict[str, dict[str, dict[int, float]]] = {z: {m: {} for m in mixers} for z in lm_sizes}
    for z in lm_sizes:
        c = ctx.for_task("lm").for_size(z)
        L = c.train_len()
        for s in seeds:
            for m in mixers:
                r = lm_ppl(c, m, dt, s, [L])
                if r is None or L not in r:
                    missing.append(f"lm {z} {m}-s{s}")
                    continue
                ppl[z][m][s] = r[L]
                cost += run_cost(c.lm_dir(m, dt, s))

    verdicts, lines = {}, []
    for q, (num, den, key, line, side, what) in ACC_QUESTIONS.items():
        key = mq_keys[0] if key == "mqar" else key
        a = acc.get(key, {})
        diffs = [a[num][s] - a[den][s] for s in seeds if s in a.get(num, {}) and s in a.get(den, {})]
        verdicts[q], text = answer_question(q, what, diffs, line, side, "values", "difference", " points",
                                            lambda x: f"{100 * x:+.1f}", ctx.judged)
        lines.append(text)
    for q, (num, den, line, side, what) in PPL_QUESTIONS.items():
        for z in lm_sizes:
            lr = [math.log(ppl[z][num][s] / ppl[z][den][s]) for s in seeds
                  if s in ppl[z][num] and s in ppl[z][den]]
            verdicts[f"{q}@{z}"], text = answer_question(f"{q}, {z}", what, lr, line, side, "values", "ratio", "",
                                                         lambda x: f"{math.exp(x):.3f}", ctx.judged)
            lines.append(text)

    pct = lambda d, m: " / ".join(f"{100 * d[m][s]:.1f}" for s in seeds if s in d.get(m, {})) or "—"  # noqa: E731
    task_keys = [f"mad/{t}" for t in sel["mad_tasks"]] + [f"state/{t}" for t in sel["state_tasks"]] + mq_keys
    heads = ([t.split("/")[1].replace("_", " ") for t in task_keys[:len(sel["mad_tasks"])]]
             + [f"{t.replace('_', ' ')} (scaled)" for t in sel["state_tasks"]] + [k.split("/")[0] for k in mq_keys])
    rows = []
    for m in mixers:
        row = [label(m)] + [pct(acc.get(k, {}), m) for k in task_keys]
        for z in lm_sizes:
            vals = [ppl[z][m][s] for s in seeds if s in ppl[z][m]]
            row.append(" / ".join(f"{v:.2f}" for v in vals) or "—")
        rows.append(row)
    st = ctx.exp.STATE_TRACKING[ctx.size]
    from idattn.eval.state_tracking import PROTOCOL, TASKS as STATE_TASKS
    trl, tel = st.get("train_lengths", PROTOCOL["train_lengths"]), st.get("test_lengths", PROTOCOL["test_lengths"])
    mad_r = ctx.exp.MAD_SIZES[mctx.size]
    setup = (f"Ours, per seed (seeds {seeds}): MAD tasks with the `mad` table's model, data and optimiser at "
             f"{mad_r['steps']} steps x {mad_r['batch_size']} (size `{mctx.size}`; d_model "
             f"{mad_r['model']['d_model']} x {mad_r['model']['num_layers']} blocks), test accuracy %; state tracking ({st['steps']} steps x {st['batch_size']} at lengths {trl[0]}-{trl[1]}, "
             f"scored at {tel[0]}-{tel[1]}, d_model {st['model']['d_model']} x {st['model']['num_layers']} blocks), "
             f"scaled accuracy % (0 chance, 100 solved; idattn.eval.state_tracking); MQAR (the recall table's "
             f"recipe: {mq['steps']} steps x {mq['batch_size']}, trained at T = {mq['seq_len']} with "
             f"{mq['num_kv_pairs']} pairs), accuracy % at query positions; KJV perplexity at the training context "
             f"of each LM point ({', '.join(lm_sizes)}; paper Δ), per seed.")
    loss_rows = [[label(m)] + [" / ".join(f"{train_loss[f'state/{t}'][m][s]:.3f}" for s in seeds
                                          if s in train_loss.get(f"state/{t}", {}).get(m, {})) or "—"
                               for t in sel["state_tasks"]] for m in mixers]
    loss_note = (f"Was the state-tracking task learnt at the training lengths? The loss of the last training batch "
                 f"({st['batch_size']} sequences of {trl[0]}-{trl[1]} tokens; cross-entropy at the `=` position; "
                 f"chance: " + ", ".join(f"ln {STATE_TASKS[t]['classes']} = {math.log(STATE_TASKS[t]['classes']):.3f}"
                                         f" for {t.replace('_', ' ')}" for t in sel["state_tasks"])
                 + "), per seed. Near chance, the test lengths' chance-level accuracy is a failure to learn the task "
                   "at this budget, not only to extrapolate it:")
    rule = ("Toy size: numbers and intervals only; no question is judged at this size." if not ctx.judged else
            "Questions: the 95% t interval of the paired per-seed difference (accuracy points) or log ratio "
            "(perplexity), judged against the line; `undecided` when it contains the line or fewer than 3 seeds "
            "pair (idattn/studies/repro_verdicts.py).")
    md = "\n".join([
        "## The selective core (issue 34): what a data-dependent decay and phase buy", "",
        setup, "",
        markdown_table(["model"] + heads + [f"KJV ppl {z}" for z in lm_sizes], rows), "",
        loss_note, "",
        markdown_table(["model"] + [f"{t.replace('_', ' ')}: training loss" for t in sel["state_tasks"]],
                       loss_rows), "",
        rule, "", *lines, "",
        "Published numbers these echo (their models, data, lengths and training; not comparable with the rows "
        "above, and never averaged with them):", "",
        markdown_table(["source and task", "time-invariant / no rotation", "selective / rotating"],
                       [list(p) for p in PUBLISHED]), "",
        f"Compute: {cost / 60:.1f} min over the runs of this table (this invocation "
        f"{ctx.invocation_time(time.time() - t0)})." + missing_note(missing, ctx)])
    data = {"table": "selective", "size": ctx.size, "seeds": seeds, "accuracy": {k: {m: {str(s): v for s, v in d.items()}
                                                                                      for m, d in a.items()}
                                                                                  for k, a in acc.items()},
            "state_raw_accuracy": {k: {m: {str(s): v for s, v in d.items()} for m, d in a.items()}
                                   for k, a in raw.items()},
            "state_train_loss": {k: {m: {str(s): v for s, v in d.items()} for m, d in a.items()}
                                 for k, a in train_loss.items()},
            "ppl": {z: {m: {str(s): v for s, v in d.items()} for m, d in p.items()} for z, p in ppl.items()},
            "verdicts": verdicts, "compute_s": cost, "wall_s": time.time() - t0, "missing": missing}
    write_table(ctx, "selective", md, data)
    return data
