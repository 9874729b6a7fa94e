"""The scale ladder (issue 20, item 2): the `ppl` table's protocol (Softmax, Interdomain, S4D-only at the primary Δ,
every seed, perplexity at the training context on the same held-out KJV tokens) at the compute points of
experiments/repro.py LADDER, each claim's per-seed ratio tabulated and plotted against compute with its 95%
paired t interval, and the fitted trend (OLS of the per-seed log-ratio on log10 compute) with the 95% interval of
its slope (idattn.studies.repro_verdicts.trend).

Compute of a point: 6 · N · D FLOPs, N = the Interdomain run's parameter count (the trainer's, in its marker), D =
steps x batch x context tokens. The slope's sign says whether the ratio moves with scale (and toward the paper's
value or away); it is "undetermined" when its interval contains 0, and no sign is given with fewer than 3
points. The per-point words follow the verdict rule of repro_verdicts (toy size: none).

`python -m idattn.repro ladder --root=DIR` trains what is missing (hours at the top point; see LADDER's cost
note) and writes DIR/ladder.md, DIR/ladder.json and DIR/ladder.png; `--render_only` tabulates what exists.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any

from idattn import atomic
from idattn.eval.markdown import markdown_table
from idattn.studies.repro_runs import Ctx, lm_ppl, missing_note, read_marker, run_cost, write_table
from idattn.studies.repro_verdicts import B_MARGIN, NO_VERDICT, judge, trend

CLAIMS = {  # claim: (numerator mixer, denominator mixer, line, paper's side, label, paper value)
    "a": ("s4d_only", "interdomain", 0.0, "above", "S4D-only / Interdomain ppl", 19.22 / 16.48),
    "b": ("interdomain", "softmax", B_MARGIN, "below", "Interdomain / Softmax ppl", 16.48 / 16.65),
}


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
        ppl: dict[str, list] = {m: [] for m in ("softmax", "interdomain", "s4d_only")}
        params, cost, missing, where = None, 0.0, [], set()
        for s in seeds:
            for m in ppl:
                r = lm_ppl(ctx, m, dt, s, [L])
                if r is None or L not in r:
                    ppl[m].append(None)
                    missing.append(f"{size}/{os.path.basename(ctx.lm_dir(m, dt, s))}")
                    continue
                ppl[m].append(r[L])
                cost += run_cost(ctx.lm_dir(m, dt, s))
                marker = read_marker(ctx.lm_dir(m, dt, s))
                where.add(marker.get("trained_on", "cpu:cpu"))  # none: a CPU-era run
                if m == "interdomain" and params is None:
                    params = marker.get("params")
        flops = 6.0 * params * tokens if params else None
        out.append({"size": size, "d_model": z["model"]["d_model"], "num_layers": z["model"]["num_layers"],
                    "tokens": tokens, "params_interdomain": params, "flops": flops, "ppl": ppl,
                    "compute_s": cost, "missing": missing, "judged": ctx.judged, "trained_on": sorted(where)})
    return out


def claim_stats(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Per claim: per point the per-seed log-ratios, their interval and word; the trend over compute."""
    res: dict[str, Any] = {}
    for c, (num, den, line, side, label, paper) in CLAIMS.items():
        per_point = []
        for p in points:
            vals = [math.log(a / b) for a, b in zip(p["ppl"][num], p["ppl"][den]) if a is not None and b is not None]
            word, iv = judge(vals, line, side)
            per_point.append({"size": p["size"], "log_ratios": vals, "interval": iv,
                              "verdict": word if p["judged"] else NO_VERDICT})
        tr = trend([(math.log10(p["flops"]), pp["log_ratios"]) for p, pp in zip(points, per_point) if p["flops"]])
        res[c] = {"label": label, "line": line, "side": side, "paper": paper, "points": per_point, "trend": tr}
    return res


def _plot(path: str, points, stats) -> str | None:
    """The ladder figure: one panel per claim, ratio against compute. None without matplotlib, or while no claim
    has a paired seed at any point yet (the first runs of a ladder: nothing to put on a log axis)."""
    if not any(p["flops"] and pp["interval"]["n"] for st in stats.values() for p, pp in zip(points, st["points"])):
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(stats), figsize=(5 * len(stats), 3.6))
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
        ax.set_xscale("log")
        ax.set_xlabel("training compute (FLOPs, 6·N·D)")
        ax.set_ylabel(st["label"])
        ax.legend(fontsize=7)
    fig.tight_layout()
    atomic.savefig(fig, path, dpi=120)
    plt.close(fig)
    return path


def table_ladder(ctx: Ctx, ctx_of=None) -> dict[str, Any]:
    """The ladder table of `ctx`'s invocation (its root, seeds, flags) over experiments/repro.py LADDER."""
    t0 = time.time()
    sizes = tuple(getattr(ctx.exp, "LADDER", ())) if ctx.size != "toy" else ()
    if ctx_of is None:
        ctx_of = ctx.for_size
    points = ladder_points(ctx_of, sizes, ctx.seeds)
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
            trend_lines.append(f"- ({c}) {st['label']}: slope of ln ratio per decade of compute {tr['slope']:+.4f} "
                               f"[95% t CI {tr['lo']:+.4f}, {tr['hi']:+.4f}] over {tr['n']} runs at "
                               f"{tr['points']} points: sign {tr['sign']}")
    png = _plot(ctx.table_path("ladder", "png"), points, stats) if any(p["flops"] for p in points) else None
    cost = sum(p["compute_s"] for p in points)
    missing = [m for p in points for m in p["missing"]]
    md = "\n".join([
        "## Scale ladder: the Fig. 2 protocol at several compute points", "",
        (f"Ours: embedded KJV corpus, the `ppl` table's recipe at each size of experiments/repro.py LADDER, "
         f"{ctx.exp.PRIMARY_DT} Δ, seeds {list(ctx.seeds)}; per point the ratio of the geometric means over seeds "
         "with the 95% paired t interval of the mean per-seed log-ratio, and the verdict rule's word there. The "
         "paper's ratios (125M, FineWeb-Edu) are never fitted with ours." if sizes else
         "Toy size: no ladder (it is defined for the reproduction's sizes only)."), "",
        markdown_table(["size", "d_model x layers", "tokens", "params (Interdomain)", "compute (6·N·D FLOPs)"]
                       + [f"({c}) {st['label']}" for c, st in stats.items()], rows) if rows else "", "",
        *trend_lines, "",
        (f"Figure: {os.path.basename(png)}" if png else "No figure (no point has runs yet)."), "",
        f"Compute: {cost / 60:.1f} min of training + evaluation over the runs of this table."
        + _devices_note(points) + missing_note(missing, ctx, "rerun without --render_only to train them")])
    data = {"table": "ladder", "sizes": list(sizes), "seeds": list(ctx.seeds), "points": points, "claims": stats,
            "compute_s": cost, "wall_s": time.time() - t0, "figure": png, "missing": missing}
    write_table(ctx, "ladder", md, data)
    return data
