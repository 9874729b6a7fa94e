"""The scale ladder: the `ppl` table's protocol (Softmax, Interdomain, S4D-only at the primary Δ, every seed,
perplexity at the training context on the same held-out KJV tokens) at several compute points, each ratio claim's
per-seed log-ratio with its 95% paired t interval per point, and the trend: the OLS slope of the per-seed log-ratio
on log10 compute with its 95% interval (idattn.studies.repro_verdicts.trend; its sign only when the interval
excludes 0, none with fewer than 3 points). Compute of a point: 6·N·D FLOPs, N = the Interdomain run's parameter
count, D = steps x batch x context tokens.

`ladder`: the points of experiments/repro.py LADDER (the previous recipe); `climb`: the points of CLIMB, each with
its own recipe and seeds (the new ladder). Written as DIR/<table>.md, .json and .png.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any

from idattn.eval import paper_numbers as P
from idattn.eval.figures import save_figure, subplots
from idattn.eval.markdown import markdown_table
from idattn.studies.claims import CLAIMS, PAPER_125M_FLOPS, RATIO_CLAIMS
from idattn.studies.repro_runs import Tally, lm_ppl
from idattn.studies.repro_verdicts import NO_VERDICT, judge, log_ratios, trend
from idattn.studies.runcache import Ctx, Table, compute_line, read_marker, write_table


def ratio_text(iv: dict[str, Any], *, words: bool = False) -> str:
    """A per-seed log-ratio interval (repro_verdicts) as a ratio: `r [lo, hi]` (a table cell), or with
    `words` `r [95% CI lo, hi] over n seeds` (a sentence); `r (1 seed)` without an interval, `—` without seeds."""
    if iv.get("n") == 0:
        return "—"
    r = f"{math.exp(iv['mean']):.3f}"
    if iv.get("lo") is None:
        return f"{r} (1 seed)"
    lo, hi = math.exp(iv["lo"]), math.exp(iv["hi"])
    return f"{r} [95% CI {lo:.3f}, {hi:.3f}] over {iv['n']} seeds" if words else f"{r} [{lo:.3f}, {hi:.3f}]"


def crossing_text(tr: dict[str, Any], points: list[dict[str, Any]]) -> str:
    """Where a trend with a decided sign puts the ratio at 1 (ln ratio 0), as a clause: the compute, its 95%
    interval (Fieller, `repro_verdicts._crossing`), how far past the ladder's top point that extrapolates, and
    the paper's 125M point on the same axis; "" without a crossing."""
    cr = tr.get("cross")
    if not cr:
        return ""
    top = max(math.log10(p["flops"]) for p in points if p.get("flops"))
    where = (f"{cr['x'] - top:.1f} decades past the top point: extrapolated" if cr["x"] > top else
             "inside the trained range")
    return (f"the fitted line reaches ratio 1 at {10 ** cr['x']:.1e} FLOPs [95% CI {10 ** cr['lo']:.1e}, "
            f"{10 ** cr['hi']:.1e}] ({where}; the paper's 125M point, where its ratio is measured, is at "
            f"{PAPER_125M_FLOPS:.1e} FLOPs = 6 x 125M parameters x 2.5B tokens)")


def _devices_note(points) -> str:
    """Where the runs trained, when not all on CPU hosts (scripts/device_study.py): unlike seconds are not one
    budget, so the note names each point's devices."""
    if all(w.startswith("cpu:") for p in points for w in p.get("trained_on", ())):
        return ""
    return (" Trained on: " + "; ".join(f"{p['size']} {', '.join(w.split(':', 1)[1] for w in p['trained_on'])}"
                                        for p in points if p.get("trained_on"))
            + " (the seconds above add CPU-host and device time: they are not one budget).")


def ladder_points(ctx_of, sizes, seeds) -> list[dict[str, Any]]:
    """Per ladder size: compute, tokens, per-seed perplexities of the three mixers (None where missing)."""
    out = []
    for size in sizes:
        ctx = ctx_of(size)
        z = ctx.exp.SIZES[size]
        L = int(z["seq_len"])
        tokens = int(z["num_steps"]) * int(z["batch_size"]) * L
        dt = ctx.exp.PRIMARY_DT
        ppl: dict[str, list] = {m: [] for m in P.MIXERS}
        got, where = Tally(), set()
        for s in seeds:
            for m in ppl:
                r = got.ppl(ctx, m, dt, s, [L], name=f"{size}/{os.path.basename(ctx.lm_dir(m, dt, s))}")
                ppl[m].append(None if r is None else r[L])
                if r is None:
                    continue
                where.add(read_marker(ctx.lm_dir(m, dt, s)).get("trained_on", "cpu:cpu"))  # none: a CPU-era run
        params = got.params.get("interdomain")
        flops = 6.0 * params * tokens if params else None
        out.append({"size": size, "d_model": z["model"]["d_model"], "num_layers": z["model"]["num_layers"],
                    "tokens": tokens, "params_interdomain": params, "flops": flops, "ppl": ppl,
                    "compute_s": got.cost, "missing": got.missing, "judged": ctx.judged, "trained_on": sorted(where)})
    return out


def claim_stats(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Per claim: per point the per-seed log-ratios, their interval and word; the trend over compute."""
    res: dict[str, Any] = {}
    for c in RATIO_CLAIMS:
        cl = CLAIMS[c]
        per_point = []
        for p in points:
            vals = log_ratios(p["ppl"][cl.num], p["ppl"][cl.den])
            word, iv = judge(vals, cl.line, cl.side)
            per_point.append({"size": p["size"], "log_ratios": vals, "interval": iv,
                              "verdict": word if p["judged"] else NO_VERDICT})
        tr = trend([(math.log10(p["flops"]), pp["log_ratios"]) for p, pp in zip(points, per_point) if p["flops"]])
        res[c] = dict(label=cl.stat, line=cl.line, side=cl.side, paper=cl.paper, points=per_point, trend=tr)
    return res


def _plot(path: str, points, stats) -> str | None:
    """The ladder figure: one panel per claim, ratio against compute. None while no claim has a paired seed at any
    point yet (the first runs of a ladder: nothing to put on a log axis), or without matplotlib."""
    if not any(p["flops"] and pp["interval"]["n"] for st in stats.values() for p, pp in zip(points, st["points"])):
        return None
    try:  # matplotlib is an optional extra: the table is written without its figure
        fig, axes = subplots(1, len(stats), figsize=(5 * len(stats), 3.6))
    except ImportError:
        return None
    for ax, (c, st) in zip(axes, stats.items()):
        xs, ys, lo, hi = [], [], [], []
        for p, pp in zip(points, st["points"]):
            iv = pp["interval"]
            if p["flops"] and iv["n"]:
                xs.append(p["flops"])
                ys.append(math.exp(iv["mean"]))
                lo.append(math.exp(iv["mean"]) - math.exp(iv["lo"] if iv["lo"] is not None else iv["mean"]))
                hi.append(math.exp(iv["hi"] if iv["hi"] is not None else iv["mean"]) - math.exp(iv["mean"]))
        ax.set_title(f"claim ({c})")
        if not xs:  # this claim has no paired seed yet: an empty panel, not a log axis with nothing on it
            ax.text(0.5, 0.5, "no paired seeds yet", ha="center", va="center", transform=ax.transAxes)
            continue
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", capsize=3, label="ours (mean of per-seed log-ratios, 95% t)")
        ax.axhline(math.exp(st["line"]), color="grey", ls=":", label="claim's line")
        ax.axhline(st["paper"], color="tab:red", ls="--", label="paper 125M (FineWeb-Edu; not comparable in size)")
        ax.set(xscale="log", xlabel="training compute (FLOPs, 6·N·D)", ylabel=st["label"])
        ax.legend(fontsize=7)
    return save_figure(fig, path, dpi=120)


def table_ladder(ctx: Ctx, table: Table | None = None) -> dict[str, Any]:
    """The ladder table of `ctx`'s invocation (its root, seeds, flags) over experiments/repro.py LADDER, or with
    `table` CLIMB_TABLE over CLIMB (each point with its own seeds: a seed a point does not have is not missing)."""
    t0 = time.time()
    table = table or TABLE
    climb = table.name == "climb"
    sizes = tuple(getattr(ctx.exp, "CLIMB" if climb else "LADDER", ())) if ctx.size != "toy" else ()
    points = ladder_points(ctx.for_size, sizes, ctx.seeds)
    stats = claim_stats(points)
    rows = []
    for i, p in enumerate(points):
        rows.append([p["size"], f"{p['d_model']} x {p['num_layers']}", f"{p['tokens'] / 1e6:.2f}M",
                     f"{p['params_interdomain']:,}" if p["params_interdomain"] else "—",
                     f"{p['flops']:.2e}" if p["flops"] else "—"]
                    + [f"{ratio_text(st['points'][i]['interval'])} ({st['points'][i]['verdict']})"
                       for st in stats.values()])
    trend_lines = []
    for c, st in stats.items():
        tr = st["trend"]
        if tr["sign"] is None:
            trend_lines.append(f"- ({c}) {st['label']}: no trend fitted ({tr['points']} compute point(s) with runs; "
                               "it needs 3)")
        else:
            cross = crossing_text(tr, points)
            trend_lines.append(f"- ({c}) {st['label']}: slope of ln ratio per decade of compute {tr['slope']:+.4f} "
                               f"[95% t CI {tr['lo']:+.4f}, {tr['hi']:+.4f}] over {tr['n']} runs at "
                               f"{tr['points']} points: sign {tr['sign']}" + (f"; {cross}" if cross else ""))
    png = _plot(ctx.table_path(table.name, "png"), points, stats) if any(p["flops"] for p in points) else None
    cost = sum(p["compute_s"] for p in points)
    missing = [m for p in points for m in p["missing"]
               if not climb or int(m.rsplit("-s", 1)[1]) in ctx.exp.SEEDS[m.split("/")[0]]]
    recipe = ("the recipe of each point of experiments/repro.py CLIMB (its own steps, batch, warmup and peak LR, "
              "chosen by the pilot's rule; the pilot table lists them) and its own seeds (SEEDS)" if climb else
              "the `ppl` table's recipe at each size of experiments/repro.py LADDER")
    md = "\n".join([
        "## " + table.title, "",
        (f"Ours: embedded KJV corpus, {recipe}, "
         f"{ctx.exp.PRIMARY_DT} Δ, seeds {list(ctx.seeds)}; per point the ratio of the geometric means over seeds "
         "with the 95% paired t interval of the mean per-seed log-ratio, and the verdict rule's word there. The "
         "paper's ratios (125M, FineWeb-Edu) are never fitted with ours." if sizes else
         "Toy size: no ladder (it is defined for the reproduction's sizes only)."), "",
        markdown_table(["size", "d_model x layers", "tokens", "params (Interdomain)", "compute (6·N·D FLOPs)"]
                       + [f"({c}) {st['label']}" for c, st in stats.items()], rows) if rows else "", "",
        *trend_lines, "",
        (f"Figure: {os.path.basename(png)}" if png else "No figure (no point has runs yet)."), "",
        compute_line(ctx, cost, hint="rerun without --render_only to train them", missing=missing,
                     note=_devices_note(points))])
    data = {"table": table.name, "sizes": list(sizes), "seeds": list(ctx.seeds), "points": points, "claims": stats,
            "compute_s": cost, "wall_s": time.time() - t0, "figure": png, "missing": missing}
    return write_table(ctx, table.name, md, data)


def climb_order(exp, seeds) -> list[tuple[str, int]]:
    """(size, seed) in training order: first the seeds every point has (SEEDS[size], within `seeds`), point by
    point from the bottom, then the extra seeds of the points that have more (the top two: 5), again bottom-up;
    so a stop leaves a complete 3-seed ladder before any fourth seed."""
    sizes = tuple(getattr(exp, "CLIMB", ()))
    if not sizes:
        return []
    own = {z: [s for s in exp.SEEDS[z] if s in seeds] for z in sizes}
    base = min(len(v) for v in own.values())
    return ([(z, s) for z in sizes for s in own[z][:base]] + [(z, s) for z in sizes for s in own[z][base:]])


def table_climb(ctx: Ctx) -> dict[str, Any]:
    """The new ladder: the ladder table over experiments/repro.py CLIMB, each point with its own recipe (steps,
    batch, warmup, peak LR) and its own seeds (SEEDS[size]), trained in climb_order first. `--seeds` limits the
    seeds trained and shown (default: every point's own)."""
    sizes = tuple(getattr(ctx.exp, "CLIMB", ())) if ctx.size != "toy" else ()
    chosen = set(ctx.seeds) if ctx.seeds_given else {s for z in sizes for s in ctx.exp.SEEDS[z]}
    for size, s in climb_order(ctx.exp, chosen) if sizes else []:
        c = ctx.for_size(size)
        for m in P.MIXERS:
            lm_ppl(c, m, ctx.exp.PRIMARY_DT, s, [c.train_len()])
    top = ctx.for_size(ctx.size)
    top.seeds = tuple(sorted({s for z in sizes for s in ctx.exp.SEEDS[z] if s in chosen})) or tuple(ctx.seeds)
    top.render_only = True  # trained above, in climb_order; the table reads
    return table_ladder(top, table=CLIMB_TABLE)


TABLE = Table("ladder", "Scale ladder: the Fig. 2 protocol at several compute points", table_ladder, at_toy=False,
              where="ladder (previous recipe)")
CLIMB_TABLE = Table("climb", "Scale ladder, the new recipe: the Fig. 2 protocol at the points of CLIMB", table_climb,
                    at_toy=False, where="new ladder")
