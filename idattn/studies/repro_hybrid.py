"""Issue 35's study: does Interdomain still help inside a hybrid, and does the query readout still matter there?

    python -m idattn.repro hybrid --root=DIR [--restore=docs/reproduction-runs.json --archive=...]

Six models at the pilot's 400-step cell (experiments/repro.py HYBRID: d 64 x 4 layers on KJV, batch 16 x 256,
peak LR 3e-3, the cell where seeds agree, docs/reproduction.md), 3 seeds each: Softmax, Interdomain, S4D-only, and
three 1:3 hybrids (three recurrent layers then one attention layer): Interdomain + global attention, Interdomain +
sliding-window attention (window 64 of 256), S4D-only + global attention. Per model: validation perplexity at the
training context on the held-out KJV stream, and the text-recall suite (S-NIAH-1 at 1 / 2 / 4 x the training
context, phonebook with 4 / 8 / 16 entries; greedy exact match) on the same trained models.

Five questions, each a paired per-seed log ratio (an accuracy difference for MQAR) with the project's verdict rule
(95% t interval over seeds, a word only when it excludes the line; idattn/studies/repro_verdicts.py):
  (h1) attention helps Interdomain: ppl(Interdomain) / ppl(Interdomain + global) > 1
  (h2) the query readout still matters with attention: ppl(S4D-only + global) / ppl(Interdomain + global) > 1
  (h3) a window is enough: ppl(Interdomain + SWA) / ppl(Interdomain + global) < 1.02 (within 2%)
  (h4) attention repairs Interdomain's recall: MQAR accuracy(Interdomain + global) - accuracy(Interdomain) > 0
  (h5) the query readout still matters for recall with attention: MQAR accuracy(Interdomain + global)
       - accuracy(S4D-only + global) > 0
       ((h4), (h5) at the training setting, T = 64 with 4 pairs; paired per seed, in accuracy points)

MQAR: the recall table's task and optimiser (experiments/repro.py MQAR, fixed for this study at 3000 steps) on a
4-layer d 64 model (HYBRID_MQAR: the
2-layer MQAR model holds no 1:3 group), the same for all six models; the window of SWA is 16 of the 64 tokens.
"""
from __future__ import annotations

import math
import time
from typing import Any

from idattn.eval.markdown import markdown_table
from idattn.studies.repro_runs import (LABEL, Ctx, ensure_mqar, lm_ppl, missing_note, read_marker, run_cost,
                                      text_recall, write_table)
from idattn.studies.repro_verdicts import judge

QUESTIONS = {  # name: (numerator, denominator, line, side, text)
    "h1": ("interdomain", "hybrid-interdomain-softmax-1to3", 0.0, "above",
           "attention helps Interdomain: ppl(Interdomain) / ppl(Interdomain + global 1:3) > 1"),
    "h2": ("hybrid-s4d_only-softmax-1to3", "hybrid-interdomain-softmax-1to3", 0.0, "above",
           "the query readout still matters with attention: ppl(S4D-only + global 1:3) / ppl(Interdomain + global "
           "1:3) > 1"),
    "h3": ("hybrid-interdomain-swa-1to3", "hybrid-interdomain-softmax-1to3", math.log(1.02), "below",
           "a window is enough: ppl(Interdomain + SWA 1:3) / ppl(Interdomain + global 1:3) < 1.02"),
}
# (h4), (h5) on MQAR accuracy differences: (numerator, denominator, line, side, text)
MQAR_QUESTIONS = {
    "h4": ("hybrid-interdomain-softmax-1to3", "interdomain", 0.0, "above",
           "attention repairs Interdomain's recall: MQAR accuracy(Interdomain + global 1:3) - accuracy(Interdomain) "
           "> 0"),
    "h5": ("hybrid-interdomain-softmax-1to3", "hybrid-s4d_only-softmax-1to3", 0.0, "above",
           "the query readout still matters for recall with attention: MQAR accuracy(Interdomain + global 1:3) - "
           "accuracy(S4D-only + global 1:3) > 0"),
}
WORDS = {"reproduced": "yes", "not reproduced": "no"}  # the rule's words for a claim; here a question's answer


def label(mixer: str) -> str:
    if mixer in LABEL:
        return LABEL[mixer]
    _, rec, att, ratio = mixer.split("-")
    att = {"softmax": "global attention", "swa": "sliding-window attention"}[att]
    return f"{LABEL.get(rec, rec)} + {att} 1:{ratio[3:]}"


def answer_question(q: str, what: str, values: list[float], line: float, side: str, key: str, name: str, unit: str,
                    fmt, judged: bool = True) -> tuple[dict[str, Any], str]:
    """A question judged by the verdict rule on paired per-seed `values`: (its record, its Markdown line); `fmt`
    writes a value in the question's unit (a ratio from a log-ratio, accuracy points from a difference). At toy
    size (`judged` False) the interval without a word. Shared by the studies past the paper (hybrid, selective)."""
    word, iv = judge(values, line, side)
    answer = WORDS.get(word, "undecided") if judged else "not judged (toy size)"
    if iv["lo"] is not None:
        ivtxt = f"{name} {fmt(iv['mean'])}{unit} [{fmt(iv['lo'])}, {fmt(iv['hi'])}]"
    elif iv["mean"] is not None:
        ivtxt = f"{name} {fmt(iv['mean'])}{unit} (one seed: no interval)"
    else:
        return ({"question": what, key: values, "interval": iv, "answer": answer},
                f"- ({q}) {what}: **{answer}**, no paired seeds yet")
    record = {"question": what, key: values, "interval": iv, "answer": answer}
    return record, f"- ({q}) {what}: **{answer}**, {ivtxt} over {len(values)} paired seeds"


def table_hybrid(ctx: Ctx) -> dict[str, Any]:
    t0 = time.time()
    h = ctx.exp.HYBRID
    c = ctx.for_size(h["size"])
    c.table_size = "small"  # <root>/hybrid.md, named like the study's other tables (not hybrid-<size>.md)
    seeds = [s for s in ctx.seeds if s in h["seeds"]] if ctx.seeds_given else list(h["seeds"])
    L = c.train_len()
    dt = ctx.exp.PRIMARY_DT
    tr = ctx.exp.TEXT_RECALL[h["size"]]
    niah = [int(round(r * L)) for r in tr["niah_ratios"]]
    text_keys = [f"niah@{n}/acc" for n in niah] + [f"phonebook@{n}/acc" for n in tr["phonebook_sizes"]]
    mq = ctx.exp.MQAR[h["size"]]
    mq_keys = [f"mqar@{mq['seq_len']}x{mq['num_kv_pairs']}/acc"] + [f"mqar@{T}x{p}/acc" for T, p in mq["test_grid"]]
    mq_acc: dict[str, dict[int, dict[str, float]]] = {m: {} for m in h["mixers"]}
    ppl: dict[str, dict[int, float]] = {m: {} for m in h["mixers"]}
    text: dict[str, dict[str, list]] = {m: {k: [] for k in text_keys} for m in h["mixers"]}
    params: dict[str, int] = {}
    missing, cost = [], 0.0
    for s in seeds:  # seed-major: a stop leaves every model with the same seeds
        for m in h["mixers"]:
            r = lm_ppl(c, m, dt, s, [L])
            if r is None or L not in r:
                missing.append(f"{m}-s{s}")
                continue
            ppl[m][s] = r[L]
            wd = c.lm_dir(m, dt, s)
            params.setdefault(m, read_marker(wd).get("params"))
            rec = text_recall(c, m, s)
            if rec is None:
                missing.append(f"text recall {m}-s{s}")
            else:
                for k in text_keys:
                    text[m][k].append(rec.get(k))
            cost += run_cost(wd)
    mq_loss: dict[str, dict[int, float | None]] = {m: {} for m in h["mixers"]}  # last logged training loss
    for s in seeds:  # MQAR after the language models: seed-major again
        for m in h["mixers"]:
            r = ensure_mqar(c, m, s)
            if r is None:
                missing.append(f"mqar {m}-s{s}")
                continue
            mq_acc[m][s] = {k: r["metrics"].get(k) for k in mq_keys}
            mq_loss[m][s] = (r.get("details") or {}).get("loss")
            cost += run_cost(c.mqar_dir(m, s))
    rows = []
    for m in h["mixers"]:
        vals = [ppl[m][s] for s in seeds if s in ppl[m]]
        mean = math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None
        rows.append([label(m), f"{params.get(m):,}" if params.get(m) else "—",
                     " / ".join(f"{v:.2f}" for v in vals) or "—", f"{mean:.2f}" if mean else "—"]
                    + [" / ".join(f"{100 * v:.0f}" for v in text[m][k] if v is not None) or "—" for k in text_keys]
                    + [" / ".join(f"{100 * mq_acc[m][s][k]:.1f}" for s in seeds
                                  if s in mq_acc[m] and mq_acc[m][s].get(k) is not None) or "—" for k in mq_keys])
    verdicts, lines = {}, []
    for q, (num, den, line, side, what) in QUESTIONS.items():
        lr = [math.log(ppl[num][s] / ppl[den][s]) for s in seeds if s in ppl[num] and s in ppl[den]]
        verdicts[q], text_line = answer_question(q, what, lr, line, side, "log_ratios", "ratio", "",
                                         lambda x: f"{math.exp(x):.3f}")
        lines.append(text_line)
    for q, (num, den, line, side, what) in MQAR_QUESTIONS.items():
        k = mq_keys[0]
        diffs = [mq_acc[num][s][k] - mq_acc[den][s][k] for s in seeds if s in mq_acc[num] and s in mq_acc[den]]
        verdicts[q], text_line = answer_question(q, what, diffs, line, side, "differences", "difference", " points",
                                         lambda x: f"{100 * x:+.1f}")
        lines.append(text_line)
    cm = ctx.exp.get_mqar_config("softmax", h["size"])
    z = ctx.exp.SIZES[h["size"]]
    wall = time.time() - t0
    md = "\n".join([
        "## Hybrid stacks (issue 35): Interdomain with a few attention layers", "",
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
        "At this budget the slowest Interdomain seeds have not finished learning (\"Why an MQAR seed fails\" "
        "above).", "",
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
        f"Compute: {cost / 60:.1f} min over the runs of this table (training, evaluation, text recall; this "
        f"invocation {ctx.invocation_time(wall)})."
        + missing_note(missing, ctx)])
    data = {"table": "hybrid", "size": h["size"], "seeds": seeds, "ppl": {m: {str(s): v for s, v in ppl[m].items()}
                                                                         for m in ppl},
            "text": text, "mqar": {m: {str(s): v for s, v in mq_acc[m].items()} for m in mq_acc},
            "mqar_final_loss": {m: {str(s): v for s, v in mq_loss[m].items()} for m in mq_loss},
            "params": params, "verdicts": verdicts, "compute_s": cost, "wall_s": wall,
            "missing": missing}
    write_table(c, "hybrid", md, data)
    return data
