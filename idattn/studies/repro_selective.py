"""Studies of a core past the paper, on the tasks where time-invariant cores are known to fail: the selective core
(per-token Δ_t, and Mamba-3's rotation θ_t) and the delta update (erase before write on the key state).

    python -m idattn.repro selective --root=DIR [--toy] [--only=MIXERS --seeds=SEEDS --tasks=state,mad,mqar,lm]
    python -m idattn.repro delta --root=DIR [--toy] [--only=MIXERS --seeds=SEEDS --tasks=state,mqar,lm]

One table function, `core_table`, serves both; a `CoreStudy` names the study's config in experiments/repro.py
(SELECTIVE, DELTA: mixers, seeds, MAD and state-tracking tasks, the models each task family trains), its LM
points, its question ids and the published numbers it echoes. The tasks: selective copying and in-context recall
(MAD at 10x the `mad` table's steps: SELECTIVE_MAD), state tracking (parity, modular arithmetic without brackets,
trained at 3-40 tokens and scored at 40-256: STATE_TRACKING), MQAR (the recall table's, tested at its grid) and KJV
perplexity at ladder points. Questions: idattn/studies/claims.py QUESTIONS ((s1)-(s7), (d1)-(d3)). Published
numbers are shown in their own table, never mixed with ours.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any

from idattn.eval.markdown import markdown_table
from idattn.eval.state_tracking import PROTOCOL, TASKS as STATE_TASKS
from idattn.studies.claims import QUESTIONS, label
from idattn.studies.repro_runs import Tally, mad_dir, mad_run, mqar_keys, mqar_run, state_dir, state_run
from idattn.studies.repro_verdicts import answer
from idattn.studies.runcache import Ctx, Table, compute_line, write_table

TASK_FAMILIES = ("state", "mad", "mqar", "lm")  # --tasks: the families one invocation trains


@dataclasses.dataclass(frozen=True)
class CoreStudy:
    """One study of a core: its table name, its config's name in experiments/repro.py (a dict with `mixers`,
    `seeds`, `mad_tasks`, `state_tasks` and optionally `families`: task family -> the mixers it trains, default
    all, and `lm_at`: LM point -> the mixers trained there, default the `lm` family's), the name of its LM points (size -> ladder sizes), its questions' id prefix and the published rows it
    echoes (source and task, the weaker model's numbers, the stronger one's: column heads in `published_heads`)."""
    name: str
    config: str
    lm_points: str
    prefix: str
    published: tuple[tuple[str, str, str], ...]
    published_heads: tuple[str, str] = ("time-invariant / no rotation", "selective / rotating")


SELECTIVE = CoreStudy("selective", "SELECTIVE", "SELECTIVE_LM", "s", (
    ("Mamba (arXiv 2312.00752), selective copying", "S4 (LTI) 18.3", "Mamba (selective) 99.8"),
    ("Mamba-3 (arXiv 2603.15569), parity, scaled", "Mamba-2 0.90; Mamba-3 without RoPE 2.27", "Mamba-3 100"),
    ("Mamba-3, arithmetic without brackets, scaled", "Mamba-2 47.81; Mamba-3 without RoPE 1.49", "Mamba-3 98.51"),
))
# The delta rule's published counterparts, as their sources state them (other models, data and training): Gated
# DeltaNet with β ∈ [0, 2) ("[-1, 1]" eigenvalues) in Mamba-3's state-tracking table; DeltaNet against
# Transformer++ at 340M / 15B tokens of SlimPajama (Wikitext perplexity).
DELTA = CoreStudy("delta", "DELTA", "DELTA_LM", "d", (
    ("Mamba-3 (arXiv 2603.15569), parity, scaled", "Mamba-2 0.90", "Gated DeltaNet [-1, 1] 100"),
    ("Mamba-3, arithmetic without brackets, scaled", "Mamba-2 47.81", "Gated DeltaNet [-1, 1] 99.25"),
    ("DeltaNet (arXiv 2406.06484), 340M / 15B tokens, Wikitext ppl", "Transformer++ 28.39", "DeltaNet 28.24"),
), ("without the erase / other core", "with the delta rule"))


def core_table(ctx: Ctx, study: CoreStudy) -> dict[str, Any]:
    """Trains what is missing (cheapest first, seed-major) and writes <root>/<study.name>[-toy].md and .json."""
    t0 = time.time()
    sel = getattr(ctx.exp, study.config)
    seeds = list(ctx.seeds) if ctx.seeds_given else list(sel["seeds"] if ctx.size != "toy" else ctx.seeds)
    mixers = list(sel["mixers"])
    trains = lambda family: [m for m in mixers if m in sel.get("families", {}).get(family, mixers)]  # noqa: E731
    acc: dict[str, dict[str, dict[int, float]]] = {}  # task key -> mixer -> seed -> accuracy (scaled for state)
    raw: dict[str, dict[str, dict[int, float]]] = {}  # state tasks: the unscaled accuracy
    train_loss: dict[str, dict[str, dict[int, float]]] = {}  # state tasks: the last training batch's loss
    got = Tally()

    def put(key, m, s, v, store=acc):
        store.setdefault(key, {x: {} for x in mixers})[m][s] = v

    # --tasks: the families this invocation trains (the others' runs are only read)
    sctx, qctx = ctx.for_task("state"), ctx.for_task("mqar")
    for s in seeds:  # the cheapest runs first: state tracking, then MAD, MQAR, the language models
        for task in sel["state_tasks"]:
            for m in trains("state"):
                r = got.take(state_run(sctx, m, task, s), state_dir(ctx, m, task, s))
                if r is None:
                    continue
                put(f"state/{task}", m, s, r["scaled"])
                put(f"state/{task}", m, s, r["acc"], raw)
                if "train_loss" in r:
                    put(f"state/{task}", m, s, r["train_loss"], train_loss)
    mctx = ctx.for_task("mad").for_size(ctx.exp.SELECTIVE_MAD[ctx.size])  # the MAD size of these tables
    for s in seeds:
        for task in sel["mad_tasks"]:
            for m in trains("mad"):
                v = got.take(mad_run(mctx, m, task, s), mad_dir(mctx, m, task, s))
                if v is not None:
                    put(f"mad/{task}", m, s, v)
    mq = ctx.exp.MQAR[ctx.size]
    mq_keys = mqar_keys(mq)
    for s in seeds:
        for m in trains("mqar"):
            r = got.take(mqar_run(qctx, m, s), ctx.mqar_dir(m, s), f"mqar {m}-s{s}")
            if r is None:
                continue
            for k in mq_keys:
                if r["metrics"].get(k) is not None:
                    put(k, m, s, float(r["metrics"][k]))
    dt = ctx.exp.PRIMARY_DT
    lm_sizes = list(getattr(ctx.exp, study.lm_points)[ctx.size])
    ppl: dict[str, dict[str, dict[int, float]]] = {z: {m: {} for m in mixers} for z in lm_sizes}
    for z in lm_sizes:
        c = ctx.for_task("lm").for_size(z)
        L = c.train_len()
        for s in seeds:
            for m in sel.get("lm_at", {}).get(z, trains("lm")):
                r = got.ppl(c, m, dt, s, [L], name=f"lm {z} {m}-s{s}")
                if r is not None:
                    ppl[z][m][s] = r[L]

    verdicts, lines = {}, []
    for q, Q in ((q, Q) for q, Q in QUESTIONS.items() if q.startswith(study.prefix)):
        if Q.task != "ppl":
            a = acc.get(mq_keys[0] if Q.task == "mqar" else Q.task, {})
            diffs = [a[Q.num][s] - a[Q.den][s] for s in seeds if s in a.get(Q.num, {}) and s in a.get(Q.den, {})]
            verdicts[q], text = answer(q, Q.text, diffs, Q.line, Q.side, "values", "difference", " points",
                                       lambda x: f"{100 * x:+.1f}", ctx.judged)
            lines.append(text)
            continue
        for z in (z for z in lm_sizes if z in Q.points or not Q.points):
            if not {Q.num, Q.den} <= set(sel.get("lm_at", {}).get(z, trains("lm"))):
                continue  # a point where one of its models does not train
            lr = [math.log(ppl[z][Q.num][s] / ppl[z][Q.den][s]) for s in seeds if s in ppl[z][Q.num] and s in ppl[z][Q.den]]
            verdicts[f"{q}@{z}"], text = answer(f"{q}, {z}", Q.text, lr, Q.line, Q.side, "values", "ratio", "",
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
    trl, tel = st.get("train_lengths", PROTOCOL["train_lengths"]), st.get("test_lengths", PROTOCOL["test_lengths"])
    mad_r = ctx.exp.MAD_SIZES[mctx.size]
    mad_setup = (f"MAD tasks with the `mad` table's model, data and optimiser at {mad_r['steps']} steps x "
                 f"{mad_r['batch_size']} (size `{mctx.size}`; d_model {mad_r['model']['d_model']} x "
                 f"{mad_r['model']['num_layers']} blocks), test accuracy %; ") if sel["mad_tasks"] else ""
    setup = (f"Ours, per seed (seeds {seeds}): {mad_setup}state tracking ({st['steps']} steps x {st['batch_size']} at lengths {trl[0]}-{trl[1]}, "
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
        "## " + TABLES[study.name].title, "",
        setup, "",
        markdown_table(["model"] + heads + [f"KJV ppl {z}" for z in lm_sizes], rows), "",
        loss_note, "",
        markdown_table(["model"] + [f"{t.replace('_', ' ')}: training loss" for t in sel["state_tasks"]],
                       loss_rows), "",
        rule, "", *lines, "",
        "Published numbers these echo (their models, data, lengths and training; not comparable with the rows "
        "above, and never averaged with them):", "",
        markdown_table(["source and task", *study.published_heads], [list(p) for p in study.published]), "",
        compute_line(ctx, got.cost, time.time() - t0, "", "", got.missing, "this invocation ")])
    keyed = lambda d: {k: {m: {str(s): v for s, v in x.items()} for m, x in a.items()} for k, a in d.items()}  # noqa: E731
    data = {"table": study.name, "size": ctx.size, "seeds": seeds, "accuracy": keyed(acc),
            "state_raw_accuracy": keyed(raw), "state_train_loss": keyed(train_loss), "ppl": keyed(ppl),
            "verdicts": verdicts, "compute_s": got.cost, "wall_s": time.time() - t0, "missing": got.missing}
    return write_table(ctx, study.name, md, data)


table_selective = functools.partial(core_table, study=SELECTIVE)
table_delta = functools.partial(core_table, study=DELTA)
TABLE = Table("selective", "The selective core: what a data-dependent decay and phase buy", table_selective, at_toy=False)
DELTA_TABLE = Table("delta", "The delta update: what erasing a key's old value buys", table_delta, at_toy=False)
TABLES = {t.name: t for t in (TABLE, DELTA_TABLE)}
