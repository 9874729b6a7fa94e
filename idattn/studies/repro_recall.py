"""Table 9 at small size: MQAR per mixer (claim (e)), S-NIAH-1 and phonebook on the `ppl` models."""
from __future__ import annotations

import os
import time
from typing import Any

from idattn.eval import paper_numbers as P
from idattn.eval.markdown import markdown_table
from idattn.studies.claims import CLAIMS, by_seed, label, rule_line
from idattn.studies.repro_runs import Tally, mqar_by_seed, mqar_keys, text_recall, text_recall_setup
from idattn.studies.repro_verdicts import verdict_e, verdict_json, verdict_md
from idattn.studies.runcache import Ctx, Table, compute_line, write_table


def mqar_seeds(ctx: Ctx) -> list[int]:
    """The recall table's MQAR seeds: --seeds when given, else experiments/repro.py MQAR_SEEDS at this size (5 at
    `small`), else the size's seeds."""
    return list(ctx.seeds) if ctx.seeds_given else list(ctx.exp.MQAR_SEEDS.get(ctx.size, ctx.seeds))


def _seed_gap(accs: list) -> str:
    """max − min of the per-seed accuracies in points (one decimal), or "—" with fewer than 2 seeds."""
    vs = [v for v in accs if v is not None]
    return f"{100 * (max(vs) - min(vs)):.1f} over {len(vs)} seeds" if len(vs) >= 2 else "—"


def table_recall(ctx: Ctx) -> dict[str, Any]:
    t0 = time.time()
    mq = ctx.exp.MQAR[ctx.size]
    grid_keys = mqar_keys(mq)
    main_key, got, seeds = grid_keys[0], Tally(), mqar_seeds(ctx)
    acc, loss = mqar_by_seed(ctx, P.MIXERS, seeds, got)  # loss: the last logged training loss (did a seed learn?)
    mq_seeds = {m: list(acc[m]) for m in P.MIXERS}
    mq_acc = {m: {k: [a[k] for a in acc[m].values()] for k in grid_keys} for m in P.MIXERS}
    mq_loss = {m: list(loss[m].values()) for m in P.MIXERS}
    tr = ctx.exp.TEXT_RECALL[ctx.size]
    niah, text_keys = text_recall_setup(ctx)
    text = {m: {k: [] for k in text_keys} for m in P.MIXERS}
    for s in [s for s in ctx.seeds if s in tr.get("seeds", ctx.seeds)]:
        for m in P.MIXERS:
            wd = ctx.lm_dir(m, ctx.exp.PRIMARY_DT, s)
            r = got.take(text_recall(ctx, m, s), wd, f"text recall {os.path.basename(wd)}", cost=False)
            if r is not None:
                for k in text_keys:
                    text[m][k].append(r.get(k))
    ve = verdict_e(*(by_seed(mq_seeds[m], mq_acc[m][main_key], seeds) for m in P.MIXERS), judged=ctx.judged)
    pct = lambda vs: " / ".join(f"{100 * v:.1f}" for v in vs if v is not None) or "—"  # noqa: E731
    mq_rows = [[label(m)] + [pct(mq_acc[m][k]) for k in grid_keys]
               + [" / ".join("—" if v is None else f"{v:.3f}" for v in mq_loss[m]) or "—"] for m in P.MIXERS]
    tx_rows = [[label(m)] + [pct(text[m][k]) for k in text_keys]
               + [" / ".join(f"{v:g}" for v in P.TABLE9_NIAH[m]), " / ".join(f"{v:g}" for v in P.TABLE9_PHONEBOOK[m])]
               for m in P.MIXERS]
    wall = time.time() - t0
    c = ctx.exp.get_mqar_config("softmax", ctx.size)
    md = "\n".join([
        "## " + TABLE.title, "",
        f"MQAR (Zoology's task; the paper reports no MQAR): model d_model {c.model.d_model} x {c.model.num_layers} "
        f"layers, vocabulary {c.mqar.vocab_size}, trained at T = {mq['seq_len']} with {mq['num_kv_pairs']} pairs, "
        f"{mq['steps']} steps x {mq['batch_size']}, the paper's Δ range; accuracy (%) at query positions on "
        f"{mq['num_test']} test sequences per setting, per seed (seeds {seeds}); the last column is the training "
        f"loss (one batch, query positions) at the last step, per seed: a seed whose loss is still far above the "
        f"others' has not finished learning the task when the schedule ends.", "",
        markdown_table(["mixer"] + [k.split("/")[0].replace("mqar@", "T x pairs ") for k in grid_keys]
                       + ["train loss at the end"], mq_rows), "",
        f"Seeds alike (the new recipe's check: no seed more than 10 points from the others at T x pairs {mq['seq_len']} x "
        f"{mq['num_kv_pairs']}): the largest gap between two seeds, in points: " + "; ".join(
            f"{label(m)} {_seed_gap(mq_acc[m][main_key])}" for m in P.MIXERS) + ".", "",
        f"Text recall on the `ppl` models (trained at {ctx.train_len()} tokens on KJV; seeds "
        f"{[s for s in ctx.seeds if s in tr.get('seeds', ctx.seeds)]}), {tr['n']} examples per "
        f"setting, greedy exact match (%), per seed; the paper's Table 9 (1.3B; S-NIAH-1 at 1K / 2K / 4K / 8K, "
        f"phonebook with 16 / 32 / 64 / 128 entries) beside it. Our settings: S-NIAH-1 at {niah} tokens, phonebook "
        f"with {list(tr['phonebook_sizes'])} entries.", "",
        markdown_table(["mixer"] + [k.split("/")[0] for k in text_keys] + ["paper S-NIAH-1 †", "paper phonebook †"],
                  tx_rows), "",
        "† The paper's numbers (1.3B, FineWeb-Edu); only orderings compare.", "",
        rule_line(ctx), "",
        f"- {CLAIMS['e'].title} (MQAR at T = {mq['seq_len']}, {mq['num_kv_pairs']} "
        f"pairs): {verdict_md(ve)} ({ve.why})", "",
        compute_line(ctx, got.cost, wall, "of MQAR training ", missing=got.missing,
                     invocation="this invocation, text recall included: ")])
    data = {"table": "recall", "paper_table": TABLE.paper, "size": ctx.size, "mqar": {m: mq_acc[m] for m in P.MIXERS},
            "mqar_final_loss": mq_loss, "mqar_seeds": mq_seeds, "text": text,
            "mqar_setup": {k: (list(v) if isinstance(v, tuple) else v) for k, v in mq.items()},
            "text_setup": {"niah_lengths": niah, "phonebook_sizes": list(tr["phonebook_sizes"]), "n": tr["n"]},
            "verdicts": {"e": verdict_json(ve)},
            "paper": {"source": "TABLE9_NIAH, TABLE9_PHONEBOOK", "niah": {k: list(v) for k, v in P.TABLE9_NIAH.items()},
                      "phonebook": {k: list(v) for k, v in P.TABLE9_PHONEBOOK.items()}},
            "compute_s": got.cost, "wall_s": wall, "missing": got.missing}
    return write_table(ctx, "recall", md, data)


TABLE = Table("recall", "Table 9: recall, at small size", table_recall, paper="Table 9", where="MQAR")
