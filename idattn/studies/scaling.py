"""Scaling-law fits from run folders: `python -m idattn.scaling fit --root=DIR [--metric=val_loss] [--out=DIR]`.

Collection. Every `<root>/**/config.json` with a finished run (the validation file of its last step,
`eval/validation-step<num_steps>.json`, in the evaluation schema) is one point:
    N  non-embedding parameters (idattn.configs.sizes.non_embedding_params: all but the 2·V·d vocabulary matrices)
    D  training tokens = num_steps · batch_size · seq_len
    L  the metric: `val_loss` (validation loss at the last step, nats/token; default) or `train_loss` (last
       logged training loss)
    C  compute, 6·N·D (the Chinchilla convention; IsoFLOP families are grouped by the sweep's nominal budget
       `sweep.compute` when the config has one, else by 6·N·D to 0.02 decades); the actual training FLOPs
       F·D with F = idattn.models.flops_per_token (LM head and mixer included) are reported beside it.
Points are grouped by mixer family (softmax | interdomain | s4d_only | cube cell).

(a) Parametric law (Chinchilla approach 3), per mixer:
        L(N, D) = E + A / N^α + B / D^β
    fitted as log L̂ = LSE(a − α log N, b − β log D, e) (A = e^a, B = e^b, E = e^e) by minimising
    Σ Huber_δ(log L̂ − log L) with δ = 1e-3 (BFGS from several initialisations: the best points of a (α, β)
    grid with (E, A, B) solved linearly, plus a fixed grid after Chinchilla's; the best optimum is kept). Intervals:
    percentile bootstrap (2.5 %, 97.5 %) over runs (resample runs with replacement, refit from the best
    solutions' neighbourhood). Compute-optimal allocation under C = 6ND:
        N*(C) = G (C/6)^a,  D*(C) = G⁻¹ (C/6)^b,  G = (αA / (βB))^{1/(α+β)},  a = β/(α+β),  b = α/(α+β).
    Held-out error: the law refitted without the largest size (all its runs) predicts that size's losses;
    reported as mean and max |L̂ − L| / L (and for every size left out in turn).
(b) IsoFLOP minima (approach 2): for each budget with ≥ 3 sizes, a parabola in log N, L = p₂x² + p₁x + p₀,
    x = log N; N_opt = exp(−p₁ / 2p₂) (only when p₂ > 0; flagged when outside the sizes tried), D_opt =
    C / (6 N_opt); then log N_opt = k + a log C by least squares (and b for D_opt). Bootstrap over runs within
    each budget (resamples with fewer than 4 distinct sizes, of budgets with 5 or more, are redrawn).
(c) Difference test between two mixers: gap(C) = L*_1(C) − L*_2(C) (compute-optimal loss of each fitted law)
    and the relative gap gap/L*_1, with intervals from independent bootstrap draws of the two fits; and the
    change of the relative gap between the smallest and the largest budget of the grid (does the advantage
    grow with compute?), with its interval. Beside it, model-free: the mean relative difference of runs paired
    by size and budget, with a bootstrap interval over pairs.

Outputs (`--out`, default `<root>/scaling`): `scaling_fit.json`, `law.png` (loss against N and against D with
fitted curves and 95 % bands), `isoflop.png`, `frontier.png` (every mixer's compute-optimal loss, N* and D*
against C on one figure) and `gap.png` (the difference test). Predictions at the paper's four sizes and token
budgets come with the paper's numbers beside them, marked as what they are: an extrapolation by 4-6 orders
of magnitude from whatever the runs were (for the CPU study: tiny models on the KJV corpus with a 512-piece
tokenizer, not FineWeb-Edu with a 32K one), so the absolute values are not comparable.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
from dataclasses import asdict
from typing import Sequence

import numpy as np

from idattn import atomic
from idattn.configs.scaling import get_config as scaling_config
from idattn.configs.sizes import PAPER_RECIPE, PAPER_WIDTHS, non_embedding_params, size_name
from idattn.eval import paper_numbers as P
from idattn.eval.figures import pyplot, save_figure, subplots
from idattn.eval.markdown import markdown_table
from idattn.models.counting import flops_per_token
from idattn.rundir.layout import completion, last_metrics, load_config, planned_steps
from idattn.studies.results import mixer_family
from idattn.studies.scaling_laws import (HUBER_DELTA, PARAM_NAMES, Point, difference_test, fit_mixer,
                                         frontier_with_band, isoflop_groups, paired_runs, predict_with_band)


# ------------------------------------------------------------------------------------------------ collection


def collect(root: str, metric: str = "val_loss") -> tuple[list[Point], list[str]]:
    """(points of the finished runs under `root`, notes on the folders skipped and why)."""

    if metric not in ("val_loss", "train_loss"):
        raise ValueError(f"--metric={metric!r}: expected val_loss or train_loss")
    paths = sorted(glob.glob(os.path.join(root, "**", "config.json"), recursive=True))
    if not paths:
        raise FileNotFoundError(f"--root={root}: no run folders (no */config.json below it); run a sweep first "
                                f"(python -m idattn.sweep <sweep file> --root={root})")
    points, skipped = [], []
    for p in paths:
        wd = os.path.dirname(p)
        cfg = load_config(wd)
        t = cfg.train
        seq = int(cfg.data.seq_len)
        tps = int(t.batch_size) * seq
        steps = planned_steps(cfg)
        if metric == "val_loss":  # the final validation, as idattn.rundir.layout.completion reads it
            loss = completion(wd)["val_loss"]
            if loss is None:
                skipped.append(f"{wd}: not finished (no eval/validation-step{steps:08d}.json)")
                continue
        else:
            last = last_metrics(wd)
            if not last or int(last["step"]) != steps:
                skipped.append(f"{wd}: not finished (metrics.jsonl does not reach step {steps})")
                continue
            loss = float(last["loss"])
        if not math.isfinite(loss):
            skipped.append(f"{wd}: non-finite loss {loss}")
            continue
        n = float(non_embedding_params(cfg.model))
        d = float(steps * tps)
        sw = cfg.get("sweep", None)
        nominal = float(sw.compute) if sw is not None and float(sw.get("compute", 0.0)) > 0 else 0.0
        fpt = float(flops_per_token(cfg.model, seq))
        name = str(sw.name) if sw is not None else os.path.relpath(wd, root)
        size = str(sw.size) if sw is not None else size_name(cfg.model)
        points.append(Point(name=name, mixer=mixer_family(str(cfg.model.mixer)), n=n, d=d, loss=loss,
                            compute=nominal or 6.0 * n * d, flops=fpt * d, size=size, workdir=wd,
                            extra={"nominal_compute": nominal, "flops_per_token": fpt,
                                   "six_nd": 6.0 * n * d}))
    return points, skipped


# -------------------------------------------------------------------------------------- paper comparison
def paper_points() -> dict[str, dict]:
    """The paper's four sizes: non-embedding N (Softmax and Interdomain shapes), tokens D, and validation loss
    ln(ppl) from Fig. 2 / Table 6 (FineWeb-Edu, 32K tokenizer; 350M and 760M read off the figure)."""

    out = {}
    for size in PAPER_WIDTHS:
        row = {"d": float(PAPER_RECIPE[size]["total_tokens"]), "n": {}, "paper_loss": {},
               "approx": size in P.APPROX_FIG2}
        for mixer in ("softmax", "interdomain"):  # the paper's config of the size (experiments/scaling.py)
            row["n"][mixer] = float(non_embedding_params(scaling_config(f"{mixer},{size}").model))
            row["paper_loss"][mixer] = math.log(P.VAL_PPL[size][mixer])
        out[size] = row
    return out


# ---------------------------------------------------------------------------------------------------- plots
def _band_curve(ax, x, loss, xx, band, col, label: str) -> None:
    """One group of runs (points at x) and the fitted law's central curve with its 95% band over xx."""
    ax.plot(xx, band[0], color=col, lw=1.2)
    ax.fill_between(xx, band[1], band[2], color=col, alpha=0.2)
    ax.scatter(x, loss, color=col, edgecolor="k", zorder=3, label=label)


def _loss_axes(ax, xlabel: str, title: str, **title_kw) -> None:
    ax.set(xscale="log", xlabel=xlabel, ylabel="validation loss (nats/token)")
    ax.set_title(title, **title_kw)
    ax.legend(fontsize=8)


def _plot_law(fits: dict, points_by_mixer: dict, out: str, title: str) -> str:
    """law.png: per mixer, loss vs N along each budget (IsoFLOP curves) or fixed D, and loss vs D per size."""
    mixers = list(fits)
    fig, axes = subplots(len(mixers), 2, figsize=(11, 4.2 * len(mixers)), squeeze=False)
    for r, m in enumerate(mixers):
        pts, fit = points_by_mixer[m], fits[m]
        groups = isoflop_groups(pts)
        for i, (c, gp) in enumerate(groups.items()):
            ns = np.array([p.n for p in gp])
            nn = np.geomspace(ns.min() / 1.5, ns.max() * 1.5, 60)
            _band_curve(axes[r, 0], ns, [p.loss for p in gp], nn, predict_with_band(fit, nn, c / (6 * nn)),
                        pyplot().get_cmap("viridis")(i / max(1, len(groups) - 1)), f"C = {c:.2g} FLOPs")
        _loss_axes(axes[r, 0], "non-embedding parameters N",
                   f"{m}: loss vs N at fixed compute C = 6ND\n(fitted law, 95% bootstrap band)")
        sizes = sorted({p.n for p in pts})
        for i, s in enumerate(sizes):
            gp = [p for p in pts if p.n == s]
            ds = np.array([p.d for p in gp])
            dd = np.geomspace(ds.min() / 1.5, ds.max() * 1.5, 60)
            _band_curve(axes[r, 1], ds, [p.loss for p in gp], dd, predict_with_band(fit, np.full_like(dd, s), dd),
                        pyplot().get_cmap("plasma")(i / max(1, len(sizes) - 1) * 0.85), f"{gp[0].size} (N = {s:,.0f})")
        _loss_axes(axes[r, 1], "training tokens D", f"{m}: loss vs D at fixed N")
    return save_figure(fig, os.path.join(out, "law.png"), title, dpi=80)


def _plot_isoflop(fits: dict, points_by_mixer: dict, out: str, title: str) -> str:
    """isoflop.png: the IsoFLOP parabolas and their minima per budget, one panel per mixer."""
    mixers = list(fits)
    fig, axes = subplots(1, len(mixers), figsize=(5.5 * len(mixers), 4.2), squeeze=False)
    for j, m in enumerate(mixers):
        ax = axes[0, j]
        groups = isoflop_groups(points_by_mixer[m])
        mins = {mm["compute"]: mm for mm in fits[m]["isoflop"]["minima"]}
        for i, (c, gp) in enumerate(groups.items()):
            col = pyplot().get_cmap("viridis")(i / max(1, len(groups) - 1))
            ns = np.array([p.n for p in gp])
            ax.scatter(ns, [p.loss for p in gp], color=col, edgecolor="k", zorder=3, label=f"C = {c:.2g}")
            mm = mins.get(c)
            if mm and "coef" in mm:
                xx = np.linspace(np.log(ns.min()) - 0.3, np.log(ns.max()) + 0.3, 80)
                ax.plot(np.exp(xx), np.polyval(mm["coef"], xx), color=col, lw=1)
            if mm and mm.get("ok"):  # filled: minimum inside the sizes tried; hollow: extrapolated outside
                ax.scatter([mm["n_opt"]], [mm["loss_opt"]], marker="*", s=160, zorder=4,
                           color=col if mm["inside"] else "none", edgecolor=col if not mm["inside"] else "k")
        _loss_axes(ax, "non-embedding parameters N", f"{m}: IsoFLOP profiles (parabola in log N)\n* minimum "
                   "(hollow: outside the sizes tried)", fontsize=9)
    return save_figure(fig, os.path.join(out, "isoflop.png"), title, dpi=80)


def _plot_frontier(fits: dict, out: str, title: str) -> str:
    """frontier.png: every mixer's compute-optimal L*, N*, D* against C with bootstrap bands."""
    mixers = list(fits)
    colors = {m: c for m, c in zip(mixers, ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange"))}
    cmin = min(f["range"]["c"][0] for f in fits.values()) / 3
    cmax = max(f["range"]["c"][1] for f in fits.values()) * 30
    cc = np.geomspace(cmin, cmax, 80)
    fig, axes = subplots(1, 3, figsize=(16, 4.4))
    for m in mixers:
        fr = frontier_with_band(fits[m], cc)
        col = colors[m]
        for ax, k, lab in zip(axes, ("loss", "n", "d"), ("compute-optimal loss L*(C) (nats/token)",
                                                           "compute-optimal N*(C) (non-embedding params)",
                                                           "compute-optimal D*(C) (tokens)")):
            ax.plot(cc, fr[k], color=col, label=f"{m} (fitted law)")
            ax.fill_between(cc, fr[k + "_lo"], fr[k + "_hi"], color=col, alpha=0.2)
            ax.set(xscale="log", xlabel="training compute C = 6ND (FLOPs)", ylabel=lab)
            if k != "loss":
                ax.set_yscale("log")
        for mm in fits[m]["isoflop"]["minima"]:
            if mm.get("ok"):
                for ax, k in zip(axes, ("loss_opt", "n_opt", "d_opt")):
                    ax.scatter([mm["compute"]], [mm[k]], color=col, marker="*", s=120, edgecolor="k", zorder=4)
        for ax in axes:
            for edge in fits[m]["range"]["c"]:
                ax.axvline(edge, color=col, ls=":", lw=0.8)
    axes[0].legend(fontsize=8)
    axes[0].set_title("frontier (band: 95% bootstrap; * IsoFLOP minima;\ndotted: the data's range of C, "
                      "extrapolation outside)", fontsize=9)
    return save_figure(fig, os.path.join(out, "frontier.png"), title, dpi=80)


def _plot_gap(diff: dict, out: str, title: str) -> str:
    """gap.png: the second mixer's relative advantage over the first, in range and extrapolated."""
    a, b = diff["mixers"]
    fig, axes = subplots(1, 2, figsize=(13, 4.4))
    c = np.array(diff["c"])
    lo_c, hi_c = diff["in_range"]["c"]
    for ax, (x0, x1), ttl in zip(axes, ((lo_c / 1.5, hi_c * 1.5), (c.min(), c.max() * 1.5)),
                                 ("within the data's compute range", "extrapolated to the paper's compute")):
        keep = (c >= x0) & (c <= x1)
        if keep.sum() < 2:
            keep = np.ones_like(c, bool)
        ax.plot(c[keep], 100 * np.array(diff["rel_gap"])[keep], color="k", label="fitted laws (this study)")
        ax.fill_between(c[keep], 100 * np.array(diff["rel_lo"])[keep], 100 * np.array(diff["rel_hi"])[keep],
                        color="gray", alpha=0.3, label="95% bootstrap band")
        ax.axhline(0, color="k", lw=0.6)
        for edge in (lo_c, hi_c):
            ax.axvline(edge, color="k", ls=":", lw=0.8)
        ax.set(xscale="log", xlabel="training compute C = 6ND (FLOPs)", ylabel=f"(L*_{a} − L*_{b}) / L*_{a}  (%)")
        ax.set_title(f"{b}'s advantage over {a}\nat each law's compute-optimal size, {ttl}", fontsize=9)
    pp = diff.get("paper")
    if pp:
        axes[1].scatter(pp["c"], [100 * g for g in pp["rel_gap"]], color="tab:red", marker="D", zorder=4,
                        label="paper, fixed sizes (FineWeb-Edu, 32K tokenizer:\nanother corpus, not comparable)")
        axes[1].set_ylim(-100, 100)
    axes[1].legend(fontsize=7, loc="lower left")
    return save_figure(fig, os.path.join(out, "gap.png"), title, 8, dpi=80)


def _plots(fits: dict, points_by_mixer: dict, out: str, diff: dict | None, title: str) -> list[str]:
    """The study's figures (law, isoflop, frontier and, for two mixers, gap) written to `out`; their paths."""
    files = [_plot_law(fits, points_by_mixer, out, title), _plot_isoflop(fits, points_by_mixer, out, title),
             _plot_frontier(fits, out, title)]
    if diff is not None:
        files.append(_plot_gap(diff, out, title))
    return files


# -------------------------------------------------------------------------------------------------- driver
def _fmt_ci(v, ci, f="{:.3g}"):
    return f"{f.format(v)} [{f.format(ci[0])}, {f.format(ci[1])}]"


def fit_root(root: str, *, metric: str = "val_loss", out: str = "", n_boot: int = 200, seed: int = 0,
             plots: bool = True, title: str = "", compare: Sequence[str] = ("softmax", "interdomain")) -> dict:
    points, skipped = collect(root, metric)
    by_mixer: dict[str, list[Point]] = {}
    for p in points:
        by_mixer.setdefault(p.mixer, []).append(p)
    fits, notes = {}, list(skipped)
    for m, pts in sorted(by_mixer.items()):
        if len(pts) < 5 or len({p.n for p in pts}) < 2 or len({p.d for p in pts}) < 2:
            notes.append(f"{m}: {len(pts)} finished runs ({len({p.n for p in pts})} sizes); need >= 5 runs over "
                         f">= 2 sizes and >= 2 token budgets to fit")
            continue
        fits[m] = fit_mixer(pts, n_boot=n_boot, seed=seed)
    if not fits:
        raise SystemExit("idattn.scaling: nothing to fit:\n  " + "\n  ".join(notes))
    out = out or os.path.join(root, "scaling")
    os.makedirs(out, exist_ok=True)
    diff, paper = None, paper_points()
    if len(compare) == 2 and all(m in fits for m in compare):
        lo = min(fits[m]["range"]["c"][0] for m in compare)
        hi = max(fits[m]["range"]["c"][1] for m in compare)
        paper_c = [6 * r["n"]["softmax"] * r["d"] for r in paper.values()]
        grid = np.geomspace(lo, max(hi, max(paper_c)), 60)
        diff = difference_test(fits[compare[0]], fits[compare[1]], grid)
        diff["mixers"] = list(compare)
        diff["c_data_max"] = hi
        diff["paired_runs"] = paired_runs(points, compare[0], compare[1])
        pts = paper if set(compare) <= {"softmax", "interdomain"} else {}
        diff["paper"] = None if not pts else {"sizes": list(pts), "c": [6 * r["n"][compare[0]] * r["d"] for r in pts.values()],
                         "rel_gap": [(r["paper_loss"][compare[0]] - r["paper_loss"][compare[1]])
                                     / r["paper_loss"][compare[0]] for r in pts.values()],
                         "note": "the paper's validation losses (ln ppl) at its fixed sizes and token budgets, "
                                 "FineWeb-Edu: another corpus and tokenizer, and not compute-optimal sizes"}
        # the headline: the change of the relative gap over the data's own compute range
        inside = difference_test(fits[compare[0]], fits[compare[1]], np.array([lo, hi]))
        diff["in_range"] = {"c": [lo, hi], **{k: inside[k] for k in ("rel_gap", "rel_lo", "rel_hi", "rel_growth",
                                                                    "rel_growth_ci")}}
    preds = {}
    for m, fit in fits.items():
        if m not in ("softmax", "interdomain"):
            continue
        preds[m] = {}
        for size, row in paper.items():
            mid, lo_, hi_ = predict_with_band(fit, np.array([row["n"][m]]), np.array([row["d"]]))
            preds[m][size] = {"n": row["n"][m], "d": row["d"], "pred_loss": float(mid[0]),
                              "pred_ci": [float(lo_[0]), float(hi_[0])], "paper_loss": row["paper_loss"][m],
                              "paper_approx": row["approx"]}
    files = _plots(fits, by_mixer, out, diff, title or f"{root} ({metric})") if plots else []
    result = {"root": os.path.abspath(root), "metric": metric, "n_boot": n_boot, "huber_delta": HUBER_DELTA,
              "notes": notes, "points": [asdict(p) for p in points],
              "fits": {m: {k: v for k, v in f.items() if k != "boot"} for m, f in fits.items()},
              "difference": diff, "paper_predictions": preds, "plots": files,
              "paper_predictions_note": "extrapolation of the fitted law far beyond the data (N, D up to "
                                        "10^4-10^5 x larger); the paper trained on FineWeb-Edu with a 32K "
                                        "tokenizer: absolute losses are not comparable to these runs'"}
    atomic.write_json(os.path.join(out, "scaling_fit.json"), result, indent=1, default=_json_default)
    result["_fits"] = fits
    return result


def _json_default(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o))


def _pct_ci(v, lo, hi) -> str:
    return _fmt_ci(100 * v, (100 * lo, 100 * hi), "{:+.2f}%")


def print_report(res: dict) -> None:
    fits = res["_fits"]
    print(f"idattn.scaling: {len(res['points'])} finished runs under {res['root']} (metric {res['metric']}); "
          f"intervals: 95% percentile bootstrap over runs ({res['n_boot']} draws)")
    for n in res["notes"]:
        print(f"  note: {n}")
    print("\nL(N, D) = E + A/N^alpha + B/D^beta  (Huber on log residuals, delta 1e-3; N non-embedding params, "
          "D tokens)")
    rows = []
    for m, f in fits.items():
        ho = f["held_out"].get("largest")
        hos = f"{ho['size']}: {100 * ho['mean_rel_err']:.2f}% / {100 * ho['max_rel_err']:.2f}%" if ho else "-"
        rows.append([m, f["n_runs"]] + [_fmt_ci(f["params"][k], f["ci"][k]) for k in PARAM_NAMES]
                    + [_fmt_ci(f["derived"][k], f["derived_ci"][k]) for k in ("a_N_opt", "b_D_opt")]
                    + [f"{f['rms_log_resid']:.4f}", hos])
    print(markdown_table(["mixer", "runs", *PARAM_NAMES, "a (N*~C^a)", "b (D*~C^b)", "rms log resid",
                          "held-out (largest size) mean / max rel. err"], rows))
    print("\nIsoFLOP minima (parabola in log N per budget) and compute-optimal exponents")
    print(markdown_table(["mixer", "C (FLOPs)", "sizes", "N_opt", "D_opt", "L_opt", "minimum inside the sizes?"],
                         [[m, f"{mm['compute']:.2g}", mm["sizes"]]
                          + ([f"{mm['n_opt']:,.0f}", f"{mm['d_opt']:,.0f}", f"{mm['loss_opt']:.4f}",
                              "yes" if mm["inside"] else "no (extrapolated)"] if mm.get("ok") else
                             ["-", "-", "-", mm["why"]])
                          for m, f in fits.items() for mm in f["isoflop"]["minima"]]))
    for m, f in fits.items():
        ex = f["isoflop"].get("exponents")
        if ex:
            print(f"  {m}: N_opt ~ C^{_fmt_ci(ex['a_N_opt'], ex['a_ci'])}, "
                  f"D_opt ~ C^{_fmt_ci(ex['b_D_opt'], ex['b_ci'])} ({ex['budgets_used']} budgets)")
        else:
            print(f"  {m}: no IsoFLOP exponents ({f['isoflop'].get('why')})")
    print("\nHeld-out: law refitted without each size, predicting that size's runs (mean / max relative error)")
    for m, f in fits.items():
        print(f"  {m}: " + "; ".join(f"{r['size']} {100 * r['mean_rel_err']:.2f}% / {100 * r['max_rel_err']:.2f}%"
                                      for r in f["held_out"]["per_size"]))
    d = res.get("difference")
    if d:
        a, b = d["mixers"]
        ir = d["in_range"]
        print(f"\nDifference test: relative gap (L*_{a} - L*_{b}) / L*_{a} at the compute-optimal size")
        for c, g, lo, hi in zip(ir["c"], ir["rel_gap"], ir["rel_lo"], ir["rel_hi"]):
            print(f"  C = {c:.2g}: {_pct_ci(g, lo, hi)}")
        gi = ir["rel_growth_ci"]
        verdict = ("grows" if gi[0] > 0 else "shrinks" if gi[1] < 0 else "no significant change")
        print(f"  change over the data's compute range: {100 * ir['rel_growth']:+.2f} points "
              f"[{100 * gi[0]:+.2f}, {100 * gi[1]:+.2f}] -> {verdict}")
        pr = d.get("paired_runs")
        if pr:
            print(f"  model-free: {pr['n']} pairs of runs (same size and budget): mean (L_{a} - L_{b}) / L_{a} = "
                  f"{_pct_ci(pr['mean_rel'], *pr['mean_rel_ci'])}; {b} lower in {pr['b_better']} of {pr['n']}")
        print(f"  extrapolated to C = {d['c'][-1]:.2g} (the paper's 1.3B): "
              f"{_pct_ci(d['rel_gap'][-1], d['rel_lo'][-1], d['rel_hi'][-1])} (extrapolation)")
    if res["paper_predictions"]:
        print("\nPredictions at the paper's sizes and token budgets -- EXTRAPOLATION of the fitted law by orders of "
              "magnitude; different corpus and tokenizer from the paper (FineWeb-Edu, 32K): absolute values are "
              "not comparable")
        print(markdown_table(["mixer", "size", "N (non-emb.)", "D", "predicted loss [95%]", "paper val loss (ln ppl)"],
                             [[m, size, f"{r['n']:,.0f}", f"{r['d']:.2g}",
                               f"{r['pred_loss']:.3f} [{r['pred_ci'][0]:.3f}, {r['pred_ci'][1]:.3f}]",
                               f"{r['paper_loss']:.3f}" + (" (read off Fig. 2)" if r["paper_approx"] else "")]
                              for m, rows in res["paper_predictions"].items() for size, r in rows.items()]))
    if res["plots"]:
        print("\nplots: " + ", ".join(res["plots"]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m idattn.scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit scaling laws to the run folders under --root")
    f.add_argument("--root", required=True)
    f.add_argument("--metric", default="val_loss", choices=["val_loss", "train_loss"])
    f.add_argument("--out", default="", help="output folder (default <root>/scaling)")
    f.add_argument("--n_boot", type=int, default=200, help="bootstrap draws")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--compare", default="softmax,interdomain", help="two mixers for the difference test")
    f.add_argument("--title", default="", help="caption of the plots (say what the runs were)")
    f.add_argument("--no_plots", action="store_true")
    a = p.parse_args(argv)
    res = fit_root(a.root, metric=a.metric, out=a.out, n_boot=a.n_boot, seed=a.seed, plots=not a.no_plots,
                   title=a.title, compare=tuple(x for x in a.compare.split(",") if x))
    print_report(res)
    return 0
