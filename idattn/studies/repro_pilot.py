"""The pilot: the seed spread of Softmax and Interdomain at the new ladder's lowest point, measured before the
ladder's recipe (experiments/repro.py CLIMB) is fixed.

`python -m idattn.repro pilot --root=DIR` trains experiments/repro.py PILOT (the `ppl` protocol on KJV, the primary
Δ, batch 16 x 256) for each (steps, peak LR) cell and seed, and writes per cell and mixer the per-seed ln ppl and
its sd over seeds, the logged training loss's maximum after warmup and its largest rise (spikes), and per cell the
sd of the paired statistics the verdicts use:

  ln(ppl_Interdomain / ppl_Softmax) per seed     the pair's log-ratio ((a) and (b) are such log-ratios)
  ln R_Interdomain, R = ppl@4x / ppl@1x          (c)'s "Interdomain flat" part (KJV here)
  ln R_Softmax − ln R_Interdomain                (c)'s gap

and THE RULE: the predicted half-width of the 95% paired t interval with n seeds, h(n) = t(0.975, n−1)·sd/√n, must
be below half the paper's effect (the distance from the paper's value of the statistic to the claim's line).
"""
from __future__ import annotations

import math
import os
import time
from typing import Any

from idattn.eval import paper_numbers as P
from idattn.eval.markdown import markdown_table
from idattn.models.counting import count_params_closed
from idattn.studies.claims import CLAIMS, f2, label
from idattn.studies.repro_runs import Tally, lm_ppl
from idattn.studies.repro_verdicts import C_FLAT, half_width, sd
from idattn.studies.runcache import Ctx, Table, compute_line, read_marker, write_table


def targets() -> dict[str, dict[str, Any]]:
    """The effects the pilot's sd must resolve: per claim statistic, the paper's value, the claim's line and the
    effect (their distance), from idattn.eval.paper_numbers and the claims of idattn/studies/claims.py."""
    t2, pp = P.TABLE2, P.VAL_PPL["125m"]
    r_soft = math.log(t2["softmax"][-1] / t2["softmax"][0])
    r_inter = math.log(t2["interdomain"][-1] / t2["interdomain"][0])
    a, b = CLAIMS["a"], CLAIMS["b"]
    r = {m: f"{t2[m][-1]:.2f} / {t2[m][0]:.2f}" for m in ("softmax", "interdomain")}  # Table 2's 14K / 4K
    out = {
        "a": dict(stat="ln(ppl_S4D-only / ppl_Interdomain)", paper=math.log(a.paper), line=a.line,
                  source=f"Fig. 2 / Table 4, 125M: {pp['s4d_only']:.2f} / {pp['interdomain']:.2f}", sd_from="pair"),
        "c_gap": dict(stat="ln R_Softmax − ln R_Interdomain", paper=r_soft - r_inter, line=0.0,
                      source=f"Table 2, 1.3B, 14K / 4K: Softmax {r['softmax']}, Interdomain {r['interdomain']}",
                      sd_from="c_gap"),
        "c_flat": dict(stat="ln R_Interdomain (line ln 1.05)", paper=r_inter, line=C_FLAT,
                       source=f"Table 2, 1.3B, 14K / 4K: Interdomain {r['interdomain']}", sd_from="r_inter"),
        "b": dict(stat="ln(ppl_Interdomain / ppl_Softmax) (line ln 1.02)", paper=math.log(b.paper), line=b.line,
                  source=f"Fig. 2 / Table 4, 125M: {pp['interdomain']:.2f} / {pp['softmax']:.2f}", sd_from="pair"),
    }
    for v in out.values():
        v["effect"] = abs(v["paper"] - v["line"])
    return out


# the claims the rule is fixed for ((a) and (c)); (b) is shown for information
RULE_CLAIMS = ("a", "c_gap", "c_flat")


def curve_stats(curve, warmup: int) -> dict[str, float | None]:
    """Of a logged loss curve [[step, loss], ...]: the maximum after warmup, and the largest rise of the loss above
    its running minimum (from the first logged step on): a spike shows in the second even late in training."""
    pts = [(int(s), float(v)) for s, v in (curve or [])]
    after = [v for s, v in pts if s > warmup]
    rise, low = 0.0, math.inf
    for _, v in pts:
        low = min(low, v)
        rise = max(rise, v - low)
    return {"max_after_warmup": max(after) if after else None, "max_rise": rise if pts else None,
            "last": pts[-1][1] if pts else None}


def pilot_cells(ctx: Ctx) -> list[dict[str, Any]]:
    """Per pilot cell: per mixer and seed ln ppl@1x, ln R (4x / 1x) and the loss-curve stats; trains what is missing
    (unless --render_only)."""
    pilot = ctx.exp.PILOT
    dt = ctx.exp.PRIMARY_DT
    out = []
    for size in ctx.exp.PILOT_SIZES:
        c = ctx.for_size(size)
        z = ctx.exp.SIZES[size]
        L = int(z["seq_len"])
        lengths = [L, 4 * L]
        seeds = tuple(ctx.seeds)
        per: dict[str, dict[str, list]] = {m: {"ln_ppl": [], "ln_r": [], "curve": []} for m in pilot["mixers"]}
        got = Tally()
        for s in seeds:  # seeds outer: a stop leaves whole pairs
            for m in pilot["mixers"]:
                r, wd = lm_ppl(c, m, dt, s, lengths), c.lm_dir(m, dt, s)
                if got.take(r if r and L in r else None, wd, f"{size}/{os.path.basename(wd)}") is None:
                    for k in per[m]:
                        per[m][k].append(None)
                    continue
                rec = read_marker(wd)
                per[m]["ln_ppl"].append(math.log(r[L]))
                per[m]["ln_r"].append(math.log(r[4 * L] / r[L]) if r.get(4 * L) else None)
                per[m]["curve"].append(curve_stats(rec.get("loss_curve"), int(z["warmup_steps"])))
        soft, inter = per["softmax"], per["interdomain"]
        pair = [a - b if a is not None and b is not None else None for a, b in zip(inter["ln_ppl"], soft["ln_ppl"])]
        gap = [a - b if a is not None and b is not None else None for a, b in zip(soft["ln_r"], inter["ln_r"])]
        sds = {"pair": sd(pair), "c_gap": sd(gap), "r_inter": sd(inter["ln_r"]),
               **{f"ln_ppl_{m}": sd(per[m]["ln_ppl"]) for m in per}}
        out.append({"size": size, "steps": int(z["num_steps"]), "batch": int(z["batch_size"]), "seq_len": L,
                    "warmup": int(z["warmup_steps"]), "peak_lr": float(z.get("peak_lr", 3e-3)),
                    "tokens": int(z["num_steps"]) * int(z["batch_size"]) * L, "seeds": list(seeds), "per": per,
                    "pair_log_ratio": pair, "c_gap": gap, "sd": sds, "missing": got.missing, "compute_s": got.cost})
    return out


def apply_rule(cells: list[dict[str, Any]], ns=(3, 5)) -> list[dict[str, Any]]:
    """Per cell, claim and seed count: the predicted half-width against half the paper's effect."""
    T = targets()
    rows = []
    for cell in cells:
        for c in RULE_CLAIMS + ("b",):
            t = T[c]
            s = cell["sd"][t["sd_from"]]
            hw = {n: half_width(s, n) for n in ns}
            rows.append({"size": cell["size"], "claim": c, "sd": s, "half_width": hw, "target": t["effect"] / 2,
                         "meets": {n: (hw[n] is not None and hw[n] < t["effect"] / 2) for n in ns},
                         "in_rule": c in RULE_CLAIMS})
    return rows


def table_pilot(ctx: Ctx) -> dict[str, Any]:
    t0 = time.time()
    if not ctx.judged or not hasattr(ctx.exp, "PILOT_SIZES"):
        md = "## Pilot\n\nToy size: no pilot (it is defined for the reproduction's sizes only)."
        data = {"table": "pilot", "cells": [], "rule": [], "compute_s": 0.0, "missing": []}
        return write_table(ctx, "pilot", md, data)
    cells = pilot_cells(ctx)
    rule = apply_rule(cells)
    T = targets()
    pilot = ctx.exp.PILOT
    rows = []
    for cell in cells:
        head = (f"{cell['steps']} x {cell['batch']} x {cell['seq_len']} ({cell['tokens'] / 1e6:.2f}M), warmup "
                f"{cell['warmup']}, LR {cell['peak_lr']:g}")
        for m in pilot["mixers"]:
            p = cell["per"][m]
            rows.append([head, label(m),
                         " / ".join("—" if v is None else f"{v:.3f} ({math.exp(v):.1f})" for v in p["ln_ppl"]),
                         f2(cell["sd"][f"ln_ppl_{m}"], 4),
                         " / ".join("—" if c is None else f2(c["max_after_warmup"], 2) for c in p["curve"]),
                         " / ".join("—" if c is None else f2(c["max_rise"], 2) for c in p["curve"]),
                         " / ".join(f2(v, 3) for v in p["ln_r"])])
    prow = []
    for cell in cells:
        hw = {r["claim"]: r for r in rule if r["size"] == cell["size"]}
        prow.append([f"{cell['steps']} steps, LR {cell['peak_lr']:g}",
                     " / ".join(f2(v, 4) for v in cell["pair_log_ratio"]), f2(cell["sd"]["pair"], 4),
                     " / ".join(f2(v, 3) for v in cell["c_gap"]), f2(cell["sd"]["c_gap"], 4),
                     f2(cell["sd"]["r_inter"], 4)]
                    + [f"{f2(hw[c]['half_width'][3], 4)} / {f2(hw[c]['half_width'][5], 4)} "
                       f"({'yes' if hw[c]['meets'][3] else 'no'} / {'yes' if hw[c]['meets'][5] else 'no'})"
                       for c in RULE_CLAIMS + ("b",)])
    cost = sum(c["compute_s"] for c in cells)
    missing = [m for c in cells for m in c["missing"]]
    tgt = "; ".join(f"({c}) {T[c]['stat']}: paper {T[c]['paper']:+.4f} ({T[c]['source']}), line {T[c]['line']:+.4f}, "
                    f"effect {T[c]['effect']:.4f}, half {T[c]['effect'] / 2:.4f}" for c in RULE_CLAIMS + ("b",))
    z0 = ctx.exp.SIZES[cells[0]["size"]]["model"] if cells else {}
    md = "\n".join([
        "## " + TABLE.title, "",
        f"Ours: embedded KJV corpus, SentencePiece 1024 pieces, d_model {z0.get('d_model')} x {z0.get('num_layers')} "
        f"layers (the `small` model), context 256, batch {pilot['batch_size']} x 256, cosine to 1e-4 after a warmup "
        f"of {pilot['warmup_frac']:.0%} of the steps, {ctx.exp.PRIMARY_DT} Δ, float32 on one CPU core, seeds "
        f"{list(ctx.seeds)} (init 42 + s, data order s); perplexity on the first "
        f"{ctx.exp.EVAL_TOKENS[cells[0]['size']] if cells else 0:,} held-out tokens at 256 (1x) and 1024 (4x). "
        "Loss-curve columns: the trainer's logged training loss (one batch, every 10 steps), its maximum after "
        "warmup and its largest rise above the running minimum (a spike; batch-to-batch noise alone is ~0.1).", "",
        markdown_table(["cell", "mixer", "ln ppl (ppl) per seed", "sd ln ppl", "loss max after warmup per seed",
                        "largest loss rise per seed", "ln R = ln(ppl@4x / ppl@1x) per seed"], rows), "",
        "Paired statistics per seed and THE RULE: predicted 95% paired t half-width h(n) = t(0.975, n−1)·sd/√n with "
        "the pilot's sd, for n = 3 / n = 5 seeds, against half the paper's effect (yes: h(n) below it). Targets, "
        f"from idattn/eval/paper_numbers.py: {tgt}. The (a) column uses the sd of ln(ppl_Interdomain / "
        "ppl_Softmax) (S4D-only is not in the pilot); (c)'s columns use R on KJV (the study's (c) is on the stdlib "
        "corpus). An sd from 3 seeds is itself uncertain (its 95% interval is 0.52x-6.3x the estimate).", "",
        markdown_table(["cell", "ln(ppl_I / ppl_S) per seed", "sd", "ln R_S − ln R_I per seed", "sd",
                        "sd ln R_I"] + [f"({c}) h(3) / h(5) vs {T[c]['effect'] / 2:.4f}" for c in RULE_CLAIMS + ("b",)],
                       prow), "",
        *((["The new ladder's recipe (experiments/repro.py CLIMB, fixed from this table before its runs; "
             "docs/reproduction.md states how) and its estimated cost:", "", recipe_md(ctx.exp), ""])
          if getattr(ctx.exp, "CLIMB", ()) else []),
        *((["The alternative that fits the ~10 CPU-hour budget (experiments/repro.py CLIMB_BUDGET; not the recipe "
             "of record):", "", recipe_md(ctx.exp, ctx.exp.CLIMB_BUDGET), ""])
          if getattr(ctx.exp, "CLIMB_BUDGET", ()) else []),
        compute_line(ctx, cost, time.time() - t0, hint="rerun without --render_only to train them", missing=missing)])
    data = {"table": "pilot", "cells": cells, "rule": rule, "targets": T, "compute_s": cost,
            "recipe": recipe_rows(ctx.exp) if getattr(ctx.exp, "CLIMB", ()) else [],
            "wall_s": time.time() - t0, "missing": missing}
    return write_table(ctx, "pilot", md, data)


# ------------------------------------------------------------------------------------------------ the recipe's cost

def step_seconds(exp, d_model: int, num_layers: int, mixer: str) -> tuple[float, bool]:
    """(seconds per training step at 16 x 256 tokens on one core, measured?) from experiments/repro.py STEP_S; a
    mixer not measured at that size is estimated from Interdomain's time there and the mixer's ratio to
    Interdomain at the nearest size where both were measured (measured = False)."""
    key = f"{d_model}x{num_layers}"
    row = exp.STEP_S[key]
    if mixer in row:
        return float(row[mixer]), True
    both = [k for k, r in exp.STEP_S.items() if mixer in r and "interdomain" in r]
    near = min(both, key=lambda k: abs(int(k.split("x")[0]) * int(k.split("x")[1]) - d_model * num_layers))
    return float(row["interdomain"]) * exp.STEP_S[near][mixer] / exp.STEP_S[near]["interdomain"], False


def recipe_rows(exp, sizes=None) -> list[dict[str, Any]]:
    """Per ladder point (default experiments/repro.py CLIMB): its recipe, parameters (Interdomain, closed form),
    6·N·D, seeds, and the estimated cost of its runs (the ladder's three mixers; steps x measured step time x
    batch / 16 + RUN_OVERHEAD_S per run)."""
    out = []
    for size in (getattr(exp, "CLIMB", ()) if sizes is None else sizes):
        z = exp.SIZES[size]
        m = z["model"]
        n = count_params_closed(exp.get_config(f"interdomain,{size},{exp.PRIMARY_DT},0").model)
        tokens = int(z["num_steps"]) * int(z["batch_size"]) * int(z["seq_len"])
        per_mixer, measured = {}, True
        for mx in ("softmax", "interdomain", "s4d_only"):
            s, ok = step_seconds(exp, m["d_model"], m["num_layers"], mx)
            measured &= ok
            per_mixer[mx] = int(z["num_steps"]) * s * int(z["batch_size"]) / 16 + exp.RUN_OVERHEAD_S
        seeds = len(exp.SEEDS[size])
        out.append({"size": size, "d_model": m["d_model"], "num_layers": m["num_layers"], "steps": int(z["num_steps"]),
                    "batch": int(z["batch_size"]), "warmup": int(z["warmup_steps"]), "peak_lr": float(z["peak_lr"]),
                    "tokens": tokens, "params_interdomain": n, "flops": 6.0 * n * tokens, "seeds": seeds,
                    "run_s": per_mixer, "all_measured": measured, "cost_s": seeds * sum(per_mixer.values())})
    return out


def recipe_md(exp, sizes=None) -> str:
    rows = recipe_rows(exp, sizes)
    if not rows:
        return ""
    f0 = rows[0]["flops"]
    body = [[r["size"], f"{r['d_model']} x {r['num_layers']}", f"{r['steps']} x {r['batch']} x 256",
             f"{r['tokens'] / 1e6:.2f}M", str(r["warmup"]), f"{r['peak_lr']:g}", f"{r['params_interdomain']:,}",
             f"{r['flops']:.2e} ({r['flops'] / f0:.1f}x)", str(r["seeds"]),
             " / ".join(f"{r['run_s'][m] / 60:.1f}" for m in ("softmax", "interdomain", "s4d_only"))
             + ("" if r["all_measured"] else " *"), f"{r['cost_s'] / 60:.0f}"] for r in rows]
    total = sum(r["cost_s"] for r in rows)
    span = math.log10(rows[-1]["flops"] / f0)
    return "\n".join([
        markdown_table(["point", "d_model x layers", "steps x batch x context", "tokens", "warmup", "peak LR",
                        "params (Interdomain)", "6·N·D FLOPs", "seeds", "min per run (S / I / S4D)",
                        "min, all runs"], body), "",
        f"Span {span:.2f} decades of 6·N·D; estimated {total / 60:.0f} min ({total / 3600:.1f} CPU-hours) for the "
        f"{sum(3 * r['seeds'] for r in rows)} runs (3 mixers x seeds), from experiments/repro.py STEP_S (seconds "
        f"per step measured on one core) + {exp.RUN_OVERHEAD_S:.0f} s per run (compilation, evaluation, "
        "checkpoints). * a mixer's step time estimated from Interdomain's at that size (STEP_S says which).",
    ])


TABLE = Table("pilot", "Pilot: seed spread at the new ladder's lowest point", table_pilot, at_toy=False)
