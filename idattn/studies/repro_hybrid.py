"""Hybrid stacks: does Interdomain still help inside a hybrid, and does the query readout still matter there?

    python -m idattn.repro hybrid --root=DIR [--restore=docs/reproduction-runs.json --archive=...]

Six models at the pilot's 400-step cell (experiments/repro.py HYBRID), 3 seeds each: Softmax, Interdomain,
S4D-only and three 1:3 hybrids (three recurrent layers then one attention layer): Interdomain + global attention,
Interdomain + sliding-window attention, S4D-only + global attention. Per model: perplexity at the training
context on held-out KJV, the text-recall suite on the same models, and MQAR on a 4-layer model (HYBRID_MQAR: the
2-layer MQAR model holds no 1:3 group). Questions (h1)-(h5): idattn/studies/claims.py QUESTIONS.
"""
from __future__ import annotations

import math
import time
from typing import Any

from idattn.eval.markdown import markdown_table
from idattn.studies.claims import QUESTIONS, label
from idattn.studies.repro_runs import Tally, mqar_by_seed, mqar_keys, text_recall, text_recall_setup
from idattn.studies.repro_verdicts import answer
from idattn.studies.runcache import Ctx, Table, compute_line, run_cost, write_table


def table_hybrid(ctx: Ctx) -> dict[str, Any]:
    t0 = time.time()
    h = ctx.exp.HYBRID
    c = ctx.for_size(h["size"])
    c.table_size = "small"  # <root>/hybrid.md, named like the study's other tables (not hybrid-<size>.md)
    seeds = [s for s in ctx.seeds if s in h["seeds"]] if ctx.seeds_given else list(h["seeds"])
    L = c.train_len()
    dt = ctx.exp.PRIMARY_DT
    tr = ctx.exp.TEXT_RECALL[h["size"]]
    niah, text_keys = text_recall_setup(c)
    mq = ctx.exp.MQAR[h["size"]]
    mq_keys = mqar_keys(mq)
    ppl: dict[str, dict[int, float]] = {m: {} for m in h["mixers"]}
    text: dict[str, dict[str, list]] = {m: {k: [] for k in text_keys} for m in h["mixers"]}
    got = Tally()
    for s in seeds:  # seed-major: a stop leaves every model with the same seeds
        for m in h["mixers"]:
            r = got.ppl(c, m, dt, s, [L], name=f"{m}-s{s}", cost=False)  # counted after its text recall
            if r is None:
                continue
            ppl[m][s], wd = r[L], c.lm_dir(m, dt, s)
            rec = got.take(text_recall(c, m, s), wd, f"text recall {m}-s{s}", cost=False)
            if rec is not None:
                for k in text_keys:
                    text[m][k].append(rec.get(k))
            got.cost += run_cost(wd)
    mq_acc, mq_loss = mqar_by_seed(c, h["mixers"], seeds, got)  # after the language models: seed-major again
    rows, params = [], got.params
    for m in h["mixers"]:
        vals = [ppl[m][s] for s in seeds if s in ppl[m]]
        mean = math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None
        rows.append([label(m), f"{params.get(m):,}" if params.get(m) else "—",
                     " / ".join(f"{v:.2f}" for v in vals) or "—", f"{mean:.2f}" if mean else "—"]
                    + [" / ".join(f"{100 * v:.0f}" for v in text[m][k] if v is not None) or "—" for k in text_keys]
                    + [" / ".join(f"{100 * mq_acc[m][s][k]:.1f}" for s in seeds
                                  if s in mq_acc[m] and mq_acc[m][s].get(k) is not None) or "—" for k in mq_keys])
    verdicts, lines = {}, []
    for q, Q in ((q, Q) for q, Q in QUESTIONS.items() if q.startswith("h")):
        if Q.task == "ppl":
            lr = [math.log(ppl[Q.num][s] / ppl[Q.den][s]) for s in seeds if s in ppl[Q.num] and s in ppl[Q.den]]
            verdicts[q], line = answer(q, Q.text, lr, Q.line, Q.side, "log_ratios", "ratio", "",
                                       lambda x: f"{math.exp(x):.3f}")
        else:
            k = mq_keys[0]
            diffs = [mq_acc[Q.num][s][k] - mq_acc[Q.den][s][k] for s in seeds if s in mq_acc[Q.num] and s in mq_acc[Q.den]]
            verdicts[q], line = answer(q, Q.text, diffs, Q.line, Q.side, "differences", "difference", " points",
                                       lambda x: f"{100 * x:+.1f}")
        lines.append(line)
    cm = ctx.exp.get_mqar_config("softmax", h["size"])
    z = ctx.exp.SIZES[h["size"]]
    wall = time.time() - t0
    md = "\n".join([
        "## " + TABLE.title, "",
        f"Models d_model {z['model']['d_model']} x {z['model']['num_layers']} layers trained on KJV at the pilot's "
        f"cell `{h['size']}` ({z['num_steps']} steps x {z['batch_size']} x {L} tokens, peak LR {z['peak_lr']:g}, "
        f"the paper's Δ range for the recurrent layers), seeds {seeds}; a 1:3 hybrid is three recurrent layers "
        f"then one attention layer (`model.layer_pattern`), the window of SWA {h['window']} tokens. Perplexity at "
        f"{L} tokens on the held-out KJV stream per seed and its geometric mean; text recall: greedy exact match (%) "
        f"on {tr['n']} examples per setting, per seed (S-NIAH-1 at {niah} tokens, phonebook with "
        f"{list(tr['phonebook_sizes'])} entries). Not the paper's models or data: no published number is beside "
        "these.", "",
        f"MQAR (the last {len(mq_keys)} columns, accuracy % at query positions per seed): Zoology's task and the "
        f"recall table's optimiser, fixed for this study at {mq['steps']} steps x {mq['batch_size']}, AdamW "
        f"{mq['lr']:g}, trained at T = {mq['seq_len']} with {mq['num_kv_pairs']} pairs, {mq['num_test']} test "
        f"sequences per setting, on a {cm.model.num_layers}-layer d_model {cm.model.d_model} model for all six (a "
        f"1:3 hybrid is one group), the SWA window {ctx.exp.HYBRID_MQAR['window']} of the {mq['seq_len']} tokens. "
        "At this budget the slowest Interdomain seeds have not finished learning (docs/reproduction-log.md, \"Why an "
        "MQAR seed fails\").", "",
        markdown_table(["model", "params", "ppl per seed", "ppl (geo. mean)"]
                       + [k.split("/")[0] for k in text_keys] + [k.split("/")[0] for k in mq_keys], rows), "",
        "MQAR training loss at the last step (one batch, query positions), per seed: a seed far above the others "
        "has not finished learning the task when the schedule ends. "
        + "; ".join(f"{label(m)} " + " / ".join(f"s{s} {mq_loss[m][s]:.3f}" for s in seeds
                                                 if mq_loss[m].get(s) is not None)
                    for m in h["mixers"] if any(v is not None for v in mq_loss[m].values())) + ".", "",
        "Questions (95% t interval of the per-seed log ratio, judged against the line; `undecided` when the "
        "interval contains it or fewer than 3 seeds pair):", "",
        *lines, "",
        compute_line(ctx, got.cost, wall, "", "", got.missing, "training, evaluation, text recall; this invocation ")])
    data = {"table": "hybrid", "size": h["size"], "seeds": seeds, "ppl": {m: {str(s): v for s, v in ppl[m].items()}
                                                                         for m in ppl},
            "text": text, "mqar": {m: {str(s): v for s, v in mq_acc[m].items()} for m in mq_acc},
            "mqar_final_loss": {m: {str(s): v for s, v in mq_loss[m].items()} for m in mq_loss},
            "params": params, "verdicts": verdicts, "compute_s": got.cost, "wall_s": wall, "missing": got.missing}
    return write_table(c, "hybrid", md, data)


TABLE = Table("hybrid", "Hybrid stacks: Interdomain with a few attention layers", table_hybrid, at_toy=False)
