"""Fig. 2 at its 125M point: validation perplexity of Softmax, Interdomain and S4D-only (and S4D-only's variants) at
the training context, both Δ ranges; claims (a) and (b)."""
from __future__ import annotations

import time
from typing import Any

from idattn.eval import paper_numbers as P
from idattn.eval.markdown import markdown_table
from idattn.studies.claims import CLAIMS, f2, label, rule_line, setup_line
from idattn.studies.repro_runs import Tally
from idattn.studies.repro_verdicts import paired, stats, verdict_a, verdict_b, verdict_json, verdict_md
from idattn.studies.runcache import Ctx, ReproError, Table, compute_line, write_table


def table_ppl(ctx: Ctx) -> dict[str, Any]:
    """Both Δ ranges: the primary one (experiments/repro.py PRIMARY_DT) carries the verdicts (a), (b); the
    other is shown beside it with its own verdicts."""
    t0 = time.time()
    L = ctx.train_len()
    primary = ctx.exp.PRIMARY_DT
    # experiments/repro.py PPL_DTS (the primary range first); without it, both ranges
    dts = tuple(getattr(ctx.exp, "PPL_DTS", (primary, "scaled" if primary == "paper" else "paper")))
    if dts[0] != primary:
        raise ReproError(f"experiments/repro.py PPL_DTS={dts!r}: the primary range {primary!r} must come first")
    variants = tuple(getattr(ctx.exp, "PPL_VARIANTS", ()))
    per: dict[tuple[str, str], list] = {(m, dt): [] for dt in dts for m in P.MIXERS + variants}
    got = Tally()
    for dt in dts:
        for s in ctx.seeds:  # seeds outer: an interrupted run has every mixer at seed 0 first
            for mixer in P.MIXERS + (variants if dt == primary else ()):
                r = got.ppl(ctx, mixer, dt, s, [L], cost=not (mixer == "softmax" and dt != dts[0]))
                per[(mixer, dt)].append(None if r is None else r[L])
    pp = P.VAL_PPL["125m"]
    rows, jrows, verdicts, lines, params = [], [], {}, [], got.params
    for dt in dts:
        soft = per[("softmax", dt)]
        for m in P.MIXERS + (variants if dt == primary else ()):
            v = per[(m, dt)]
            base = m.partition("+")[0]  # the paper's row of a variant (the paper does not give the readout scale)
            st = stats(v)
            seed_ratios = [a / b if a is not None and b is not None else None for a, b in zip(v, soft)]
            pr = paired(v, soft)  # ratio of means over the seeds both have
            ratio = (sum(a for a, _ in pr) / sum(b for _, b in pr)) if pr else None
            cfg = ctx.config(m, dt, 0)
            dtr = "no Δ" if m == "softmax" else f"{dt} [{cfg.model.dt_min:g}, {cfg.model.dt_max:g}]"
            rows.append([label(m), dtr, f"{params.get(m, 0):,}", " / ".join(f2(x) for x in v), f2(st["mean"]),
                         f2(st["spread"]), " / ".join(f2(x, 3) for x in seed_ratios), f2(ratio, 3), f2(pp[base]),
                         f2(pp[base] / pp["softmax"], 3)])
            jrows.append({"mixer": m, "dt": dt, "dt_range": dtr, "params": params.get(m), "ppl_per_seed": v,
                          **{f"ppl_{k}": x for k, x in st.items()}, "ratio_to_softmax_per_seed": seed_ratios,
                          "ratio_to_softmax": ratio, "paper_ppl_125m": pp[base],
                          "paper_ratio_to_softmax": pp[base] / pp["softmax"]})
        for c, v in (("a", verdict_a(per[("interdomain", dt)], per[("s4d_only", dt)], judged=ctx.judged)),
                     ("b", verdict_b(per[("interdomain", dt)], soft, judged=ctx.judged))):
            verdicts[c + ("" if dt == primary else f"_{dt}_dt")] = verdict_json(v, dt=dt)
            lines.append(f"- {dt} Δ{' (primary)' if dt == primary else ''}: {CLAIMS[c].title}: {verdict_md(v)} "
                         f"({v.why}; paper {CLAIMS[c].paper:.3f})")
    for m in variants:  # (a) against each variant of S4D-only: shown, never the verdict of record
        va = verdict_a(per[("interdomain", primary)], per[(m, primary)], judged=ctx.judged)
        verdicts[f"a_{m}"] = verdict_json(va, dt=primary, variant=m)
        lines.append(f"- {primary} Δ, against {label(m)} (a variant, not the verdict of record): (a) "
                     f"{verdict_md(va)} ({va.why}; paper {CLAIMS['a'].paper:.3f})")
    wall = time.time() - t0
    md = "\n".join([
        "## " + TABLE.title.format(L=L), "",
        setup_line(ctx), "",
        f"Δ: `paper` = the paper's recipe [0.001, 0.1]; `scaled` = Δ·T_train as in the paper (× 4096 / {L}). "
        f"The primary range ({primary}; experiments/repro.py PRIMARY_DT says why) is the one of the cube table. "
        f"Softmax has no Δ: its runs are shared.", "",
        markdown_table(["mixer", "Δ", "params", "ppl per seed", "ppl mean", "seed spread", "ratio to Softmax per seed",
                   "ratio of means", "paper 125M ppl †", "paper ratio to Softmax †"], rows), "",
        "† The paper's numbers (FineWeb-Edu, 125M, 2.5B tokens): only the ratio columns compare.", "",
        rule_line(ctx), "", *lines, "", compute_line(ctx, got.cost, wall, missing=got.missing)])
    data = {"table": "ppl", "paper_table": TABLE.paper, "size": ctx.size, "eval_length": L, "primary_dt": primary, "setup": setup_line(ctx),
            "rows": jrows, "verdicts": verdicts, "paper": {"source": "VAL_PPL['125m']", "ppl": dict(pp)},
            "compute_s": got.cost, "wall_s": wall, "missing": got.missing}
    return write_table(ctx, "ppl", md, data)


TABLE = Table("ppl", "Fig. 2 (its 125M point): validation perplexity at the training context ({L} tokens)", table_ppl,
              paper="Fig. 2", where="Fig. 2 protocol (KJV)")
