"""The MAD table: Softmax and every cube cell trained on each MAD task of experiments/repro.py MAD (idattn.eval.mad),
every seed; claims (d) and (e) per task, beside MQAR's. Accuracies of different tasks are never averaged.

(d) in accuracy: per seed and task, the main effect of an axis is the mean over the four cube pairs differing in
it of acc(a) − acc(b), a = (dual KV | query | RoPE): positive when a is better, as in the perplexity version.
(e): Softmax − Interdomain > −0.02 and Interdomain − S4D-only > 0, per recall task.
"""
from __future__ import annotations

import time
from typing import Any

from idattn.eval.mad import TASKS
from idattn.eval.markdown import markdown_table
from idattn.models.counting import state_budget
from idattn.studies.repro_runs import Tally, cells, mad_dir, mad_model_config, mad_recipe, mad_run
from idattn.studies.repro_verdicts import main_effects, verdict_d, verdict_e, verdict_json, verdict_md
from idattn.studies.runcache import Ctx, Table, compute_line, write_table

RECALL_TASKS = ("in_context_recall", "fuzzy_recall", "noisy_recall")


def acc_axes(vals: dict[str, float | None]) -> dict[str, float | None]:
    """Cube main effects in accuracy, acc(a) − acc(b) averaged over the four pairs (None with a cell missing)."""
    return main_effects(vals, lambda at_a, at_b: at_a - at_b)


def table_mad(ctx: Ctx) -> dict[str, Any]:
    t0 = time.time()
    r = ctx.exp.MAD_SIZES[ctx.size]
    tasks = tuple(r["tasks"])
    cs = cells()
    acc, got = {t: {c: [] for c in cs} for t in tasks}, Tally()
    for s in ctx.seeds:
        for t in tasks:
            for c in cs:
                acc[t][c].append(got.take(mad_run(ctx, c, t, s), mad_dir(ctx, c, t, s)))
    verdicts, lines = {}, []
    for t in tasks:
        ax = [acc_axes({c: acc[t][c][i] for c in cs}) for i in range(len(ctx.seeds))]
        vd = verdict_d(ax, judged=ctx.judged, unit="pts")
        verdicts[f"d_{t}"] = verdict_json(vd, task=t)
        lines.append(f"- {t}: (d) the query readout is the dominant axis and RoPE barely matters: {verdict_md(vd)} "
                     f"({vd.why})")
        if t in RECALL_TASKS:
            # Interdomain and S4D-only are the cube cells dualkv-query-rope and generic-linear-norope
            ve = verdict_e(acc[t]["softmax"], acc[t]["dualkv-query-rope"], acc[t]["generic-linear-norope"],
                           judged=ctx.judged)
            verdicts[f"e_{t}"] = verdict_json(ve, task=t)
            lines.append(f"- {t}: (e) Softmax ≥ Interdomain > S4D-only: {verdict_md(ve)} ({ve.why})")
    pct = lambda vs: " / ".join("—" if v is None else f"{100 * v:.1f}" for v in vs)  # noqa: E731
    rows = [[f"`{c}`"] + [pct(acc[t][c]) for t in tasks] for c in cs]
    m = r["model"]
    over = r.get("task_overrides", {})
    lens = sorted({int(over[t]["seq_len"]) for t in tasks if "seq_len" in over.get(t, {})})
    kept = [t for t in tasks if "seq_len" not in over.get(t, {})]
    setup = ("Ours: MAD tasks (idattn.eval.mad TASKS: MAD's vocabularies, noise and motif settings"
             + (f"; sequence length {' / '.join(map(str, lens))}" + (" for every task" if not kept else
                " for " + ", ".join(t for t in tasks if t not in kept)) + ", MAD's 128 / 256 / 32" if lens else "")
             + ("".join(f"; {t} at MAD's length {TASKS[t]['seq_len']}" for t in kept) if lens else "")
             + ("; compression through MAD's auto-encoder (idattn.eval.mad.auto_encoder: the cell as the encoder, "
                "MAD's MLP decoder from the last token)" if "compression" in tasks else "")
             + f"), d_model {m['d_model']} x {m['num_layers']} blocks of (mixer, MLP) (MAD's depth counts "
             f"{2 * m['num_layers']} layers), {r['steps']} steps x {r['batch_size']} sequences at AdamW {r['lr']:g}, "
             f"{r.get('num_train') or 'MAD'} training sequences (at most MAD's per task), {r.get('num_test') or 'MAD'} "
             f"test; recurrent state of the fixed-state cells {state_budget(mad_model_config(ctx, 'interdomain')):,} "
             f"real numbers per layer (MAD: 200 epochs of 12,800 at width 128, the best of an LR x weight-decay "
             f"grid; experiments/repro.py MAD lists every difference), seeds {list(ctx.seeds)}; test accuracy (%) at "
             "the scored positions after the last step, per seed. No paper numbers: the Interdomain paper reports "
             "no MAD results.")
    rule = ("Toy size: numbers and intervals only; no claim is judged at this size." if not ctx.judged else
            "Verdict rule: idattn/studies/repro_verdicts.py (95% paired t interval over seeds; effects in accuracy "
            "points here).")
    md = "\n".join(["## " + TABLE.title, "", setup, "",
                    markdown_table(["cell"] + list(tasks), rows), "", rule, "", *lines, "",
                    compute_line(ctx, got.cost, what="of training ", hint="", missing=got.missing)])
    data = {"table": "mad", "size": ctx.size, "tasks": list(tasks), "accuracy": acc, "verdicts": verdicts,
            "setup": setup, "recipe": mad_recipe(ctx), "compute_s": got.cost, "wall_s": time.time() - t0,
            "missing": got.missing}
    return write_table(ctx, "mad", md, data)


TABLE = Table("mad", "MAD synthetic tasks (Poli et al. 2024): Softmax and the mechanism cube", table_mad, where="MAD")
