"""Reproduce the paper's tables at the scale of this machine: `python -m idattn.repro <table> [--root=DIR] [--toy]`.

    table:  ppl      Fig. 2 (its 125M point): validation perplexity of Softmax, Interdomain and S4D-only
            cube     Table 4: the eight cells of the mechanism cube and Softmax
            length   Table 2 on the stdlib corpus (experiments/repro.py LENGTH_SIZE): perplexity at 1x, 2x,
                     3.5x, 4x the training context, for the context-scaled and the paper's Δ range side by side,
                     and Softmax's perplexity by position bucket ((c)'s precondition)
            recall   Table 9 at small size: MQAR per mixer, S-NIAH-1 and phonebook on the `ppl` models
            mad      the MAD synthetic tasks (Poli et al. 2024) for Softmax and every cube cell; (d), (e) per task
            ladder   the Fig. 2 protocol at the compute points of LADDER (the previous recipe, issue 20), ratios
                     and their trend against compute
            pilot    issue 32: the seed spread of Softmax and Interdomain at the new ladder's lowest point for a
                     few (steps, peak LR) cells of PILOT, and the rule's predicted interval half-widths
                     (idattn/studies/repro_pilot.py)
            length_climb  issue 32: the `length` table ((c) and Softmax's precondition) at the points of
                     LENGTH_CLIMB, the stdlib corpus with the recipe of a point of the new ladder, 5 seeds each
            climb    the new ladder (issue 32): the `ladder` table over CLIMB, each point with its own recipe
            hybrid   issue 35: Softmax, Interdomain, S4D-only and three 1:3 hybrids at the pilot's 400-step cell,
                     3 seeds: perplexity, text recall, three questions (idattn/studies/repro_hybrid.py)
            selective  issue 34: the selective core against its LTI form, Softmax and S4D-only (selective or not) on
                     selective copying, MAD recall, state tracking (parity, modular arithmetic), MQAR and KJV
                     perplexity at two ladder points, 3 seeds, six questions (idattn/studies/repro_selective.py)
            all      pilot, ppl, cube, length, ladder, mad, recall, length_climb, climb, hybrid, selective (no pilot,
                     ladders,
                     hybrid or selective at toy size: `selective --toy` is its own smoke test)

Config: experiments/repro.py (sizes, steps, Δ ranges, evaluation lengths, recall sizes). Every language model is
trained by the real trainer (`idattn.train.run`, the code path of `python -m idattn.train`) on the embedded KJV
corpus (the `length` table: the stdlib corpus), one recipe for every mixer, seeds 0, 1, 2 (init seed 42 + s,
data order seed s). Run folders (`<size>`: small, stdlib, ladder32, ladder48, toy, the pilot's pilot-s<steps>-lr<lr>
and CLIMB's sizes):

    <root>/runs/<size>/lm/<mixer>-<dt>-s<seed>/     trainer workdir + eval/*.json + repro.json (below)
    <root>/runs/<size>/mqar/<mixer>-s<seed>/        eval/recall-*.json + repro.json
    <root>/runs/<size>/mad/<cell>-<task>-s<seed>/   eval/mad-*.json + repro.json
    <root>/runs/<size>/state/<mixer>-<task>-s<seed>/  eval/state-*.json + repro.json (the `selective` table)
    <root>/<table>[-toy].md, <root>/<table>[-toy].json

Reuse and resumption: a run whose `repro.json` says `done` is reused (a language-model run that recorded its
recipe, experiments/repro.py SIZES[size], only with the same recipe; it also records its logged loss curve); an interrupted one resumes from its last
checkpoint (the trainer resumes; MQAR runs, which keep no checkpoint, start over); an evaluation result already
in `eval/` is read instead of recomputed. A reused run must still be the same model: `repro.json` records a hash
of the model code (idattn/ops, idattn/layers, idattn/models). When the code has changed since, a finished
language model is evaluated again at the training length with the current code and reused only if it gives
the recorded perplexity (relative 1e-4), i.e. the change left this model's function alone; otherwise (and for
unfinished runs and MQAR runs, which keep no parameters) the run is moved aside to `<run>.stale-<hash>` and
trained again. An MQAR run also records its recipe (experiments/repro.py MQAR) and is trained again when it changes. `--keep_stale` reuses such runs unchecked instead.
`--render_only` writes the tables from whatever results exist, training and evaluating nothing.

Evaluation (`ppl`, `cube`, `length`): token-level perplexity exp(Σ m·nll / Σ m) over the same first
`EVAL_TOKENS` held-out tokens (KJV; stdlib for `length`: its held-out files packed in list order, the context
restarting at each file boundary) at every length L, cut into rows of L tokens (each row a fresh context;
`idattn.quickstart.perplexities`). The trainer's own end-of-run validation is kept in each run but not used.

Verdicts (in each table's JSON and Markdown): the rule of idattn/studies/repro_verdicts.py (its docstring states
it in full, with every line and side; fixed before the runs, not tuned to the outcome). In short: each claim is a
statistic computed within a seed (seed s gives every mixer the same init and data order), a two-sided 95% paired
t interval over the seeds (at least 3), and "reproduced" / "not reproduced" only when the interval lies wholly
on one side of the claim's line, else "inconclusive at this scale" with the interval printed. (c) is "vacuous
at this size" unless Softmax is shown to use its context. `--toy` prints the numbers and intervals and never a
verdict word.
  a  ln(ppl S4D-only / ppl Interdomain) > 0                      (paper 125M: 1.166)
  b  ln(ppl Interdomain / ppl Softmax) < ln 1.02                 (paper 125M: 0.990)
  c  precondition: Softmax's ppl falls with position inside the training length; then
     ln R_Softmax − ln R_Interdomain > 0 and ln R_Interdomain < ln 1.05, R = ppl@4x / ppl@1x
  d  cube main effects: readout > 0, readout − |input| > 0, readout / 4 − |RoPE| > 0
  e  MQAR accuracy: Softmax − Interdomain > −0.02 and Interdomain − S4D-only > 0

Tables are named as idattn.results names the paper's (results.py is canonical): `ppl` is Fig. 2 (its 125M
point), `length` is Table 2 (one corpus, never the five-corpus mean), `cube` Table 4, `recall` Table 9.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

from idattn.eval.markdown import markdown_table
from idattn.studies.repro_runs import (LABEL, Ctx, ReproError, archive_runs, context_use, ensure_mqar, lm_ppl,
                                       load_experiment, log, missing_note, paper, read_marker, recorded_corpus,
                                       restore_runs, run_cost, run_name, text_recall, write_table)
from idattn.studies.repro_verdicts import (axes_for_verdict, cube_axes, pair_axes, paired, paper_cube_axes, stats,
                                           verdict_a, verdict_b, verdict_c, verdict_d, verdict_e, verdict_json,
                                           verdict_md)

TABLES = ("ppl", "length", "recall", "cube")
# The order of `all`: the budgeted study (experiments/repro.py "Budget") by evidence per CPU-minute, (a) and (b)
# first, then (d), (c), the ladder's trend (16 min for two more points), MAD (80 min), and last the MQAR recall
# table, whose 9 runs of 3,000 steps are outside the budget.
ALL_ORDER = ("pilot", "ppl", "cube", "length", "ladder", "mad", "recall", "length_climb", "climb", "hybrid",
             "selective")
# Tables `all` skips at toy size: the pilot and both ladders (defined for the reproduction's sizes only), and the
# two studies past the paper (their toy forms are their own commands: `hybrid --toy` has no toy size, `selective
# --toy` trains 36 toy runs).
NOT_AT_TOY = ("pilot", "ladder", "length_climb", "climb", "hybrid", "selective")
# The paper's table each of ours reproduces, named as idattn.results names it (results.py is canonical: its
# "Fig. 2" is validation perplexity against scale, "Table 2" length extrapolation, "Table 4" the cube, "Table 9"
# recall; tests/test_repro.py checks these against results.py's own headings).
PAPER_TABLE = {"ppl": "Fig. 2", "length": "Table 2", "cube": "Table 4", "recall": "Table 9"}
TITLES = {"ppl": "Fig. 2 (its 125M point): validation perplexity at the training context ({L} tokens)",
          "length_climb": "Table 2 at the new recipe (issue 32): claim (c) at the points of LENGTH_CLIMB",
          "length": "Table 2: length extrapolation, perplexity against evaluation length (trained at {L} tokens; "
                    "one corpus, not the paper's five-corpus mean)",
          "cube": "Table 4: mechanism cube, validation perplexity at the training context ({L} tokens), {dt} Δ range",
          "recall": "Table 9: recall, at small size"}
MIXERS3 = ("softmax", "interdomain", "s4d_only")
# cube cells by their canonical run name (the two aliased corners share the `ppl` runs)












# ------------------------------------------------------------------------------------------------ run records















# ------------------------------------------------------------------------------------------------ LM runs











# ------------------------------------------------------------------------------------------------ statistics



def f2(v, digits: int = 2) -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def _setup_line(ctx: Ctx) -> str:
    z = ctx.exp.SIZES[ctx.size]
    m = z["model"]
    if z.get("source", "kjv") == "stdlib":  # named by what the runs recorded, never by the rendering machine
        recorded = recorded_corpus(ctx)
        how = "one file = one document, files held out by path hash: idattn/data/stdlib_corpus.py"
        corpus = (f"the Python {recorded.split('-')[2]} standard-library source ({recorded[:-len('.val')]}, as its "
                  f"runs recorded; {how})" if recorded else
                  f"the standard-library source of the interpreter that trains it (no run recorded yet; {how})")
    else:
        corpus = "embedded KJV corpus"
    return (f"Ours: {corpus}, SentencePiece {z['tokenizer'].split(':')[1]}-piece vocabulary, "
            f"d_model {m['d_model']} x {m['num_layers']} layers ({m['num_heads']} heads x {m['head_dim']}, "
            f"M = {m['num_modes']}), context {z['seq_len']}, {z['num_steps']} steps x {z['batch_size']} x "
            f"{z['seq_len']} tokens, float32 on CPU, seeds {list(ctx.seeds)}; perplexity on the first "
            f"{ctx.exp.EVAL_TOKENS[ctx.size]:,} held-out tokens. Paper: FineWeb-Edu, Llama-2 32K tokenizer, 125M-1.3B "
            f"parameters, context 4096, 2.5B-26B tokens. Different corpus, tokenizer and scale: only orderings and "
            f"ratios compare, never the absolute numbers.")


def _rule_line(ctx: Ctx) -> str:
    if not ctx.judged:
        return ("Toy size: a smoke test of the code path. Numbers and intervals are printed; no claim is judged "
                "at this size.")
    return ("Verdict rule (idattn/studies/repro_verdicts.py, fixed before the runs): per-seed paired statistics, "
            "two-sided 95% paired t interval over the seeds; a claim is reproduced / not reproduced only when the "
            "interval lies wholly on one side of its line, else inconclusive at this scale; fewer than 3 paired "
            "seeds is inconclusive.")


def _by_seed(have: list[int], vals: list, seeds) -> list:
    """Values aligned to `seeds` (None where a seed's run is missing), so pairs are always the same seed."""
    d = dict(zip(have, vals))
    return [d.get(s) for s in seeds]


def _missing_note(missing: list[str], ctx: "Ctx | None" = None) -> str:
    return missing_note(missing, ctx, "rerun the command to train / evaluate them")


# ------------------------------------------------------------------------------------------------ ppl







def table_ppl(ctx: Ctx) -> dict[str, Any]:
    """Both Δ ranges: the primary one (experiments/repro.py PRIMARY_DT) carries the verdicts (a), (b); the
    other is shown beside it with its own verdicts."""
    t0 = time.time()
    P = paper()
    L = ctx.train_len()
    primary = ctx.exp.PRIMARY_DT
    # experiments/repro.py PPL_DTS (the primary range first); without it, both ranges
    dts = tuple(getattr(ctx.exp, "PPL_DTS", (primary, "scaled" if primary == "paper" else "paper")))
    if dts[0] != primary:
        raise ReproError(f"experiments/repro.py PPL_DTS={dts!r}: the primary range {primary!r} must come first")
    variants = tuple(getattr(ctx.exp, "PPL_VARIANTS", ()))
    per: dict[tuple[str, str], list] = {(m, dt): [] for dt in dts for m in MIXERS3 + variants}
    params, missing, cost = {}, [], 0.0
    for dt in dts:
        for s in ctx.seeds:  # seeds outer: an interrupted run has every mixer at seed 0 first
            for mixer in MIXERS3 + (variants if dt == primary else ()):
                r = lm_ppl(ctx, mixer, dt, s, [L])
                if r is None or L not in r:
                    missing.append(os.path.basename(ctx.lm_dir(mixer, dt, s)))
                    per[(mixer, dt)].append(None)
                    continue
                per[(mixer, dt)].append(r[L])
                params[mixer] = read_marker(ctx.lm_dir(mixer, dt, s)).get("params")
                if not (mixer == "softmax" and dt != dts[0]):
                    cost += run_cost(ctx.lm_dir(mixer, dt, s))
    pp = P.VAL_PPL["125m"]
    rows, jrows, verdicts = [], [], {}
    for dt in dts:
        soft = per[("softmax", dt)]
        for m in MIXERS3 + (variants if dt == primary else ()):
            v = per[(m, dt)]
            base = m.partition("+")[0]  # the paper's row of a variant (the paper does not give the readout scale)
            st = stats(v)
            seed_ratios = [a / b if a is not None and b is not None else None for a, b in zip(v, soft)]
            pr = paired(v, soft)  # ratio of means over the seeds both have
            ratio = (sum(a for a, _ in pr) / sum(b for _, b in pr)) if pr else None
            cfg = ctx.config(m, dt, 0)
            dtr = "no Δ" if m == "softmax" else f"{dt} [{cfg.model.dt_min:g}, {cfg.model.dt_max:g}]"
            rows.append([LABEL[m], dtr, f"{params.get(m, 0):,}", " / ".join(f2(x) for x in v), f2(st["mean"]),
                         f2(st["spread"]), " / ".join(f2(x, 3) for x in seed_ratios), f2(ratio, 3), f2(pp[base]),
                         f2(pp[base] / pp["softmax"], 3)])
            jrows.append({"mixer": m, "dt": dt, "dt_range": dtr, "params": params.get(m), "ppl_per_seed": v,
                          **{f"ppl_{k}": x for k, x in st.items()}, "ratio_to_softmax_per_seed": seed_ratios,
                          "ratio_to_softmax": ratio, "paper_ppl_125m": pp[base],
                          "paper_ratio_to_softmax": pp[base] / pp["softmax"]})
        va = verdict_a(per[("interdomain", dt)], per[("s4d_only", dt)], judged=ctx.judged)
        vb = verdict_b(per[("interdomain", dt)], soft, judged=ctx.judged)
        sfx = "" if dt == primary else f"_{dt}_dt"
        verdicts["a" + sfx] = verdict_json(va, dt=dt, md=verdict_md(va))
        verdicts["b" + sfx] = verdict_json(vb, dt=dt, md=verdict_md(vb))
    for m in variants:  # (a) against each variant of S4D-only: shown, never the verdict of record
        va = verdict_a(per[("interdomain", primary)], per[(m, primary)], judged=ctx.judged)
        verdicts[f"a_{m}"] = verdict_json(va, dt=primary, variant=m, md=verdict_md(va))
    wall = time.time() - t0
    lines = []
    for dt in dts:
        sfx = "" if dt == primary else f"_{dt}_dt"
        va, vb = verdicts["a" + sfx], verdicts["b" + sfx]
        tag = f"{dt} Δ" + (" (primary)" if dt == primary else "")
        lines += [f"- {tag}: (a) Interdomain beats S4D-only: {va['md']} ({va['why']}; paper "
                  f"{pp['s4d_only'] / pp['interdomain']:.3f})",
                  f"- {tag}: (b) Interdomain matches (within 2%) or beats Softmax: {vb['md']} ({vb['why']}; paper "
                  f"{pp['interdomain'] / pp['softmax']:.3f})"]
    for m in variants:
        va = verdicts[f"a_{m}"]
        lines.append(f"- {primary} Δ, against {LABEL.get(m, m)} (a variant, not the verdict of record): (a) "
                     f"{va['md']} ({va['why']}; paper {pp['s4d_only'] / pp['interdomain']:.3f})")
    md = "\n".join([
        "## " + TITLES["ppl"].format(L=L), "",
        _setup_line(ctx), "",
        f"Δ: `paper` = the paper's recipe [0.001, 0.1]; `scaled` = Δ·T_train as in the paper (× 4096 / {L}). "
        f"The primary range ({primary}; experiments/repro.py PRIMARY_DT says why) is the one of the cube table. "
        f"Softmax has no Δ: its runs are shared.", "",
        markdown_table(["mixer", "Δ", "params", "ppl per seed", "ppl mean", "seed spread", "ratio to Softmax per seed",
                   "ratio of means", "paper 125M ppl †", "paper ratio to Softmax †"], rows), "",
        "† The paper's numbers (FineWeb-Edu, 125M, 2.5B tokens): only the ratio columns compare.", "",
        _rule_line(ctx), "", *lines, "",
        f"Compute: {cost / 60:.1f} min of training + evaluation over the runs of this table (this invocation: "
        f"{ctx.invocation_time(wall)})." + _missing_note(missing, ctx)])
    data = {"table": "ppl", "paper_table": PAPER_TABLE["ppl"], "size": ctx.size, "eval_length": L, "primary_dt": primary, "setup": _setup_line(ctx),
            "rows": jrows, "verdicts": verdicts, "paper": {"source": "VAL_PPL['125m']", "ppl": dict(pp)},
            "compute_s": cost, "wall_s": wall, "missing": missing}
    write_table(ctx, "ppl", md, data)
    return data


# ------------------------------------------------------------------------------------------------ cube













def table_cube(ctx: Ctx) -> dict[str, Any]:
    t0 = time.time()
    P = paper()
    L = ctx.train_len()
    cells = ["softmax"] + [c for c, *_ in P.TABLE4 if c != "softmax"]
    dt = ctx.exp.PRIMARY_DT
    per: dict[str, list] = {c: [] for c in cells}
    missing, cost, params = [], 0.0, {}
    for s in ctx.seeds:  # seeds outer: an interrupted run has the whole cube at seed 0 first
        for cell in cells:
            mixer = run_name(cell)
            r = lm_ppl(ctx, mixer, dt, s, [L])
            if r is None or L not in r:
                missing.append(os.path.basename(ctx.lm_dir(mixer, dt, s)))
                per[cell].append(None)
                continue
            per[cell].append(r[L])
            params[cell] = read_marker(ctx.lm_dir(mixer, dt, s)).get("params")
            cost += run_cost(ctx.lm_dir(mixer, dt, s))
    axes = [cube_axes({c: per[c][i] for c in cells}) for i in range(len(ctx.seeds))]
    seed_pair_axes = [pair_axes({c: per[c][i] for c in cells}) for i in range(len(ctx.seeds))]
    vd = verdict_d([axes_for_verdict(a, b) for a, b in zip(axes, seed_pair_axes)], judged=ctx.judged)
    desc = {c: d for c, d, _, _ in P.TABLE4}
    rows, jrows = [], []
    order = sorted(cells, key=lambda c: (stats(per[c])["mean"] is None, stats(per[c])["mean"] or 0))
    for c in order:
        st = stats(per[c])
        ploss, pppl = next((lo, pp) for cc, _, lo, pp in P.TABLE4 if cc == c)
        rows.append([f"`{c}`", desc[c], f"{params[c]:,}" if params.get(c) else "—", " / ".join(f2(v) for v in per[c]), f2(st["mean"]),
                     f2(math.log(st["mean"]), 4) if st["mean"] else "—", f2(st["spread"]), f2(ploss, 4),
                     f2(pppl)])
        jrows.append({"cell": c, "description": desc[c], "params": params.get(c), "ppl_per_seed": per[c],
                      **{f"ppl_{k}": v for k, v in st.items()}, "paper_loss": ploss, "paper_ppl": pppl})
    pax = paper_cube_axes()
    ax_rows = []
    for name in ("readout", "input", "rope"):
        ax_rows.append([name, " / ".join(f"{ax[name] * 100:+.1f}%" if ax[name] is not None else "—" for ax in axes),
                        " / ".join(" & ".join(f"{d * 100:+.1f}%" for d in pa[name]) if pa[name] else "—"
                                   for pa in seed_pair_axes),
                        " & ".join(f"{d * 100:+.1f}%" for d in pax[name])])
    wall = time.time() - t0
    md = "\n".join([
        "## " + TITLES["cube"].format(L=L, dt=dt), "", _setup_line(ctx), "",
        markdown_table(["cell", "description", "params", "ppl per seed", "ppl mean", "loss (ln ppl)", "seed spread",
                   "paper loss †", "paper ppl †"], rows), "",
        "Axis effects: ln ppl(b) − ln ppl(a) for a → b = query → linear readout, dual KV → generic input, "
        "RoPE → no RoPE (positive: a is better). Ours: the main effect (mean over the four pairs of the cube) and "
        "the two pairs the paper reports (readout: dual KV+RoPE & generic+RoPE; input: query+RoPE & linear+RoPE; "
        "RoPE: dual KV+query & generic+linear), per seed. The verdict uses the main effect when all eight cells "
        "exist, else the mean of the paper's pairs.", "",
        markdown_table(["axis", "ours, all 8 cells, per seed", "ours on the paper's pairs, per seed", "paper pairs †"],
                  ax_rows), "",
        "† The paper's numbers (FineWeb-Edu, 125M, 2.5B tokens); `generic-query-norope` and `dualkv-linear-norope` "
        "are not reported there. Only orderings and ratios compare.", "",
        _rule_line(ctx), "",
        f"- (d) the query readout is the dominant axis and RoPE barely matters: {verdict_md(vd)} ({vd.why})", "",
        f"Compute: {cost / 60:.1f} min of training + evaluation over the runs of this table (this invocation: "
        f"{ctx.invocation_time(wall)})." + _missing_note(missing, ctx)])
    data = {"table": "cube", "paper_table": PAPER_TABLE["cube"], "size": ctx.size, "eval_length": L, "dt": dt, "setup": _setup_line(ctx), "rows": jrows,
            "axes_per_seed": axes, "pair_axes_per_seed": seed_pair_axes, "paper_axes": pax, "verdicts": {"d": verdict_json(vd, md=verdict_md(vd))},
            "paper": {"source": "TABLE4", "rows": [list(r) for r in P.TABLE4]}, "compute_s": cost, "wall_s": wall,
            "missing": missing}
    write_table(ctx, "cube", md, data)
    return data


# ------------------------------------------------------------------------------------------------ length



def table_length(ctx: Ctx) -> dict[str, Any]:
    """Trained and judged at experiments/repro.py LENGTH_SIZE[ctx.size] (the stdlib corpus for the reproduction)
    with the mixers of LENGTH_MIXERS, each recurrent one at both Δ ranges."""
    size = getattr(ctx.exp, "LENGTH_SIZE", {}).get(ctx.size, ctx.size)
    if size != ctx.size:
        ctx = ctx.for_size(size)
    md, data = length_at(ctx)
    write_table(ctx, "length", md, data)
    return data


def length_at(ctx: Ctx) -> tuple[str, dict[str, Any]]:
    """The `length` table's Markdown and JSON at ctx's size and seeds (trains what is missing unless
    --render_only): Softmax and the recurrent mixers of LENGTH_MIXERS at both Δ ranges, (c) and its precondition."""
    t0 = time.time()
    P = paper()
    lengths = ctx.lengths()
    L1, L4 = lengths[0], lengths[-1]
    mixers = tuple(getattr(ctx.exp, "LENGTH_MIXERS", ("softmax", "interdomain", "s4d_only")))
    if "softmax" not in mixers or "interdomain" not in mixers:
        raise ReproError(f"experiments/repro.py LENGTH_MIXERS={mixers!r}: claim (c) needs softmax and interdomain")
    variants = [("softmax", "scaled", "no Δ")] + [(m, dt, None) for dt in ("scaled", "paper")
                                                  for m in mixers if m != "softmax"]
    missing, cost = [], 0.0
    rows, jrows = [], []
    ratios: dict[tuple[str, str], list[float]] = {}
    got: dict[tuple[str, str], list] = {(m, dt): [] for m, dt, _ in variants}
    seed_ratios: dict[tuple[str, str], list] = {(m, dt): [] for m, dt, _ in variants}
    for s in ctx.seeds:  # seeds outer: an interrupted run has every variant at seed 0 first
        for mixer, dt, _ in variants:
            r = lm_ppl(ctx, mixer, dt, s, lengths)
            if r is None or any(L not in r for L in lengths):
                missing.append(f"{mixer}-{dt}-s{s}")
                seed_ratios[(mixer, dt)].append(None)
                continue
            got[(mixer, dt)].append(r)
            seed_ratios[(mixer, dt)].append(r[L4] / r[L1])
            cost += run_cost(ctx.lm_dir(mixer, dt, s))
    for mixer, dt, note in variants:
        per_seed = got[(mixer, dt)]
        rat = [r[L4] / r[L1] for r in per_seed]
        ratios[(mixer, dt)] = rat
        cfg = ctx.config(mixer, dt, 0)
        dtr = note or f"[{cfg.model.dt_min:g}, {cfg.model.dt_max:g}]"
        means = {L: stats([r[L] for r in per_seed]) for L in lengths}
        pt = P.TABLE2[mixer]
        rows.append([LABEL[mixer], dt if mixer != "softmax" else "—", dtr]
                    + [f"{f2(means[L]['mean'])} ± {f2(means[L]['spread'] / 2 if means[L]['spread'] is not None else None)}"
                       for L in lengths]
                    + [" / ".join(f"{v:.3f}" for v in rat) or "—"]
                    + [" / ".join(f"{v:.2f}" for v in pt), f"{pt[-1] / pt[0]:.3f}"])
        jrows.append({"mixer": mixer, "dt": dt, "dt_range": dtr, "ppl_per_seed": [{str(k): v for k, v in r.items()}
                                                                                   for r in per_seed],
                      "ppl_mean": {str(L): means[L]["mean"] for L in lengths},
                      "ppl_spread": {str(L): means[L]["spread"] for L in lengths},
                      "ratio_4x_per_seed": rat, "paper_table2": list(pt), "paper_ratio_3.5x": pt[-1] / pt[0]})
    # (c)'s precondition: does Softmax use its context? Per seed, its perplexity by the context each token had,
    # last bucket of the training length over the first (idattn.studies.repro_runs.context_use)
    uses = []
    for s in ctx.seeds:
        cu = context_use(ctx, "softmax", "scaled", s)
        uses.append(cu["ratio"] if cu else None)
    # ratios are per finished seed; pair them by seed (a missing run leaves a gap, never a shifted pair)
    vc = verdict_c(seed_ratios[("interdomain", "scaled")], seed_ratios[("softmax", "scaled")], uses,
                   judged=ctx.judged)
    vc_paper = verdict_c(seed_ratios[("interdomain", "paper")], seed_ratios[("softmax", "scaled")], uses,
                         judged=ctx.judged)
    wall = time.time() - t0
    head = (["mixer", "Δ", "Δ range"] + [f"ppl@{L} ({L / L1:g}x)" for L in lengths]
            + ["ppl@4x / ppl@1x per seed", "paper 4K / 8K / 14K †", "paper 14K / 4K †"])
    md = "\n".join([
        "## " + TITLES["length"].format(L=L1), "",
        _setup_line(ctx), "",
        "Δ: `scaled` keeps the paper's Δ·T_train (Δ range × 4096 / T_train; the S4D layer caps Δ·|Re A| at κ = "
        "0.25), so the slowest mode settles inside the training context as it does in the paper: "
        "it keeps the paper's time scales. `paper` is the paper's Δ range [0.001, 0.1] unchanged, whose slowest "
        f"modes (~2,000 tokens) never settle in a {L1}-token training context, so past the training length they "
        "reach states training never produced. Values: mean ± half the seed spread.", "",
        markdown_table(head, rows), "",
        "† The paper's Table 2 (1.3B, trained at 4K, five-corpus average; 14K = 3.5x the training length). Only "
        "the ratios compare.", "",
        f"Softmax's use of its context ((c)'s precondition): perplexity of the tokens with the last eighth of "
        f"the training length as context over that of the first eighth, per seed: "
        f"{' / '.join(f2(u, 3) for u in uses)} (below 1: it uses its context).", "",
        _rule_line(ctx), "",
        f"- (c) Interdomain flat past the training length while Softmax degrades (scaled Δ): {verdict_md(vc)} "
        f"({vc.why}; paper 14K/4K: Interdomain {P.TABLE2['interdomain'][2] / P.TABLE2['interdomain'][0]:.3f}, "
        f"Softmax {P.TABLE2['softmax'][2] / P.TABLE2['softmax'][0]:.3f})",
        f"- the same criterion with the paper's Δ range: {verdict_md(vc_paper)} ({vc_paper.why})", "",
        f"Compute: {cost / 60:.1f} min of training + evaluation over the runs of this table (this invocation: "
        f"{ctx.invocation_time(wall)})." + _missing_note(missing, ctx)])
    data = {"table": "length", "paper_table": PAPER_TABLE["length"], "size": ctx.size, "lengths": lengths, "setup": _setup_line(ctx), "rows": jrows,
            "softmax_context_use_per_seed": uses,
            "verdicts": {"c": verdict_json(vc, md=verdict_md(vc)),
                         "c_paper_dt": verdict_json(vc_paper, md=verdict_md(vc_paper))},
            "paper": {"source": "TABLE2", "ratios": list(P.EXTRAP_RATIOS), "table2": {k: list(v) for k, v in
                                                                                      P.TABLE2.items()}},
            "compute_s": cost, "wall_s": wall, "missing": missing}
    return md, data


def table_length_climb(ctx: Ctx) -> dict[str, Any]:
    """(c) at the new recipe (issue 32, item 3): the `length` table at each point of experiments/repro.py
    LENGTH_CLIMB (the stdlib corpus with the recipe of a CLIMB point), each point with its own seeds (SEEDS[size],
    within --seeds when given), trained point by point from the bottom, seeds outer. Written as
    <root>/length_climb.md / .json: one section per point (the `length` table's), verdicts keyed `c@<point>` and
    `c_paper_dt@<point>`."""
    t0 = time.time()
    sizes = tuple(getattr(ctx.exp, "LENGTH_CLIMB", ())) if ctx.size != "toy" else ()
    sections, verdicts, points, missing, cost = [], {}, [], [], 0.0
    for size in sizes:
        c = ctx.for_size(size)
        c.seeds = tuple(s for s in ctx.exp.SEEDS[size] if not ctx.seeds_given or s in ctx.seeds)
        md, d = length_at(c)
        z = ctx.exp.SIZES[size]
        title = md.splitlines()[0].replace("## ", f"### {size} ({z['num_steps']} steps x {z['batch_size']} x "
                                                 f"{z['seq_len']}, d_model {z['model']['d_model']}): ", 1)
        sections.append("\n".join([title] + md.splitlines()[1:]))
        verdicts.update({f"{k}@{size}": dict(v, point=size) for k, v in d["verdicts"].items()})
        points.append(dict(d, size=size, seeds=list(c.seeds)))
        missing += [f"{size}/{m}" for m in d["missing"]]
        cost += d["compute_s"]
    wall = time.time() - t0
    seeds_text = "; ".join(f"{p['size']}: seeds {p['seeds']}" for p in points) or "no points"
    head = [f"## {TITLES['length_climb']}", "",
            "Claim (c) where the new recipe's models can use their context: the `length` table (its protocol, its "
            "verdict rule, Softmax's position-bucket precondition) at each point of experiments/repro.py "
            "LENGTH_CLIMB, the stdlib corpus trained with the recipe of a point of the new ladder, "
            f"{seeds_text}. "
            "The previous recipe's `length` table (above) stays as measured.", ""]
    if not sizes:
        head.append("No points (experiments/repro.py LENGTH_CLIMB is empty, or the toy size).")
    md = "\n".join(head) + "\n\n" + "\n\n".join(sections) + (
        f"\n\nCompute: {cost / 60:.1f} min of training + evaluation over the runs of this table (this invocation: "
        f"{ctx.invocation_time(wall)}).")
    data = {"table": "length_climb", "points": points, "verdicts": verdicts, "compute_s": cost, "wall_s": wall,
            "missing": missing}
    write_table(ctx, "length_climb", md, data)
    return data


# ------------------------------------------------------------------------------------------------ recall

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
    P = paper()
    mq = ctx.exp.MQAR[ctx.size]
    main_key = f"mqar@{mq['seq_len']}x{mq['num_kv_pairs']}/acc"
    grid_keys = [main_key] + [f"mqar@{T}x{Pp}/acc" for T, Pp in mq["test_grid"]]
    missing, cost = [], 0.0
    mq_acc = {m: {k: [] for k in grid_keys} for m in MIXERS3}
    mq_seeds: dict[str, list[int]] = {m: [] for m in MIXERS3}
    mq_loss: dict[str, list] = {m: [] for m in MIXERS3}  # the last logged training loss: a seed that did not learn
    seeds = mqar_seeds(ctx)
    for s in seeds:
        for m in MIXERS3:
            r = ensure_mqar(ctx, m, s)
            if r is None:
                missing.append(f"mqar {m}-s{s}")
                continue
            cost += run_cost(ctx.mqar_dir(m, s))
            mq_seeds[m].append(s)
            mq_loss[m].append((r.get("details") or {}).get("loss"))
            for k in grid_keys:
                mq_acc[m][k].append(r["metrics"].get(k))
    tr = ctx.exp.TEXT_RECALL[ctx.size]
    niah = [int(round(r * ctx.train_len())) for r in tr["niah_ratios"]]
    text_keys = [f"niah@{L}/acc" for L in niah] + [f"phonebook@{n}/acc" for n in tr["phonebook_sizes"]]
    text = {m: {k: [] for k in text_keys} for m in MIXERS3}
    for s in [s for s in ctx.seeds if s in tr.get("seeds", ctx.seeds)]:
        for m in MIXERS3:
            r = text_recall(ctx, m, s)
            if r is None:
                missing.append(f"text recall {os.path.basename(ctx.lm_dir(m, ctx.exp.PRIMARY_DT, s))}")
                continue
            for k in text_keys:
                text[m][k].append(r.get(k))
    ve = verdict_e(*(_by_seed(mq_seeds[m], mq_acc[m][main_key], seeds) for m in MIXERS3), judged=ctx.judged)
    pct = lambda vs: " / ".join(f"{100 * v:.1f}" for v in vs if v is not None) or "—"  # noqa: E731
    mq_rows = [[LABEL[m]] + [pct(mq_acc[m][k]) for k in grid_keys]
               + [" / ".join("—" if v is None else f"{v:.3f}" for v in mq_loss[m]) or "—"] for m in MIXERS3]
    tx_rows = [[LABEL[m]] + [pct(text[m][k]) for k in text_keys]
               + [" / ".join(f"{v:g}" for v in P.TABLE9_NIAH[m]), " / ".join(f"{v:g}" for v in P.TABLE9_PHONEBOOK[m])]
               for m in MIXERS3]
    wall = time.time() - t0
    c = ctx.exp.get_mqar_config("softmax", ctx.size)
    md = "\n".join([
        "## " + TITLES["recall"], "",
        f"MQAR (Zoology's task; the paper reports no MQAR): model d_model {c.model.d_model} x {c.model.num_layers} "
        f"layers, vocabulary {c.mqar.vocab_size}, trained at T = {mq['seq_len']} with {mq['num_kv_pairs']} pairs, "
        f"{mq['steps']} steps x {mq['batch_size']}, the paper's Δ range; accuracy (%) at query positions on "
        f"{mq['num_test']} test sequences per setting, per seed (seeds {seeds}); the last column is the training "
        f"loss (one batch, query positions) at the last step, per seed: a seed whose loss is still far above the "
        f"others' has not finished learning the task when the schedule ends.", "",
        markdown_table(["mixer"] + [k.split("/")[0].replace("mqar@", "T x pairs ") for k in grid_keys]
                       + ["train loss at the end"], mq_rows), "",
        f"Seeds alike (issue 32: no seed more than 10 points from the others at T x pairs {mq['seq_len']} x "
        f"{mq['num_kv_pairs']}): the largest gap between two seeds, in points: " + "; ".join(
            f"{LABEL[m]} {_seed_gap(mq_acc[m][main_key])}" for m in MIXERS3) + ".", "",
        f"Text recall on the `ppl` models (trained at {ctx.train_len()} tokens on KJV; seeds "
        f"{[s for s in ctx.seeds if s in tr.get('seeds', ctx.seeds)]}), {tr['n']} examples per "
        f"setting, greedy exact match (%), per seed; the paper's Table 9 (1.3B; S-NIAH-1 at 1K / 2K / 4K / 8K, "
        f"phonebook with 16 / 32 / 64 / 128 entries) beside it. Our settings: S-NIAH-1 at {niah} tokens, phonebook "
        f"with {list(tr['phonebook_sizes'])} entries.", "",
        markdown_table(["mixer"] + [k.split("/")[0] for k in text_keys] + ["paper S-NIAH-1 †", "paper phonebook †"],
                  tx_rows), "",
        "† The paper's numbers (1.3B, FineWeb-Edu); only orderings compare.", "",
        _rule_line(ctx), "",
        f"- (e) recall: Softmax ≥ Interdomain > S4D-only (MQAR at T = {mq['seq_len']}, {mq['num_kv_pairs']} "
        f"pairs): {verdict_md(ve)} ({ve.why})", "",
        f"Compute: {cost / 60:.1f} min of MQAR training over the runs of this table (this invocation, text recall "
        f"included: {ctx.invocation_time(wall)})." + _missing_note(missing, ctx)])
    data = {"table": "recall", "paper_table": PAPER_TABLE["recall"], "size": ctx.size, "mqar": {m: mq_acc[m] for m in MIXERS3},
            "mqar_final_loss": mq_loss, "mqar_seeds": mq_seeds, "text": text,
            "mqar_setup": {k: (list(v) if isinstance(v, tuple) else v) for k, v in mq.items()},
            "text_setup": {"niah_lengths": niah, "phonebook_sizes": list(tr["phonebook_sizes"]), "n": tr["n"]},
            "verdicts": {"e": verdict_json(ve, md=verdict_md(ve))},
            "paper": {"source": "TABLE9_NIAH, TABLE9_PHONEBOOK", "niah": {k: list(v) for k, v in P.TABLE9_NIAH.items()},
                      "phonebook": {k: list(v) for k, v in P.TABLE9_PHONEBOOK.items()}},
            "compute_s": cost, "wall_s": wall, "missing": missing}
    write_table(ctx, "recall", md, data)
    return data


def table_mad(ctx: Ctx) -> dict[str, Any]:
    from idattn.studies.repro_mad import table_mad as mad
    return mad(ctx)


def table_ladder(ctx: Ctx) -> dict[str, Any]:
    from idattn.studies.ladder import table_ladder as ladder
    return ladder(ctx)


def table_pilot(ctx: Ctx) -> dict[str, Any]:
    from idattn.studies.repro_pilot import table_pilot as pilot
    return pilot(ctx)


def table_hybrid(ctx: Ctx) -> dict[str, Any]:
    from idattn.studies.repro_hybrid import table_hybrid as hybrid
    return hybrid(ctx)


def table_selective(ctx: Ctx) -> dict[str, Any]:
    from idattn.studies.repro_selective import table_selective as selective
    return selective(ctx)


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
    """The new ladder (issue 32): idattn.studies.ladder's table over experiments/repro.py CLIMB, each point with
    its own recipe (steps, batch, warmup, peak LR) and its own seeds (SEEDS[size]), trained in climb_order, written
    as <root>/climb.md / .json / .png. `--seeds` limits the seeds trained and shown (default: every point's own)."""
    import shutil
    import types

    from idattn.studies.ladder import table_ladder as ladder
    sizes = tuple(getattr(ctx.exp, "CLIMB", ())) if ctx.size != "toy" else ()
    chosen = set(ctx.seeds) if ctx.seeds_given else {s for z in sizes for s in ctx.exp.SEEDS[z]}
    for size, s in climb_order(ctx.exp, chosen) if sizes else []:
        c = ctx.for_size(size)
        for m in MIXERS3:
            lm_ppl(c, m, ctx.exp.PRIMARY_DT, s, [c.train_len()])
    every = sorted({s for z in sizes for s in ctx.exp.SEEDS[z] if s in chosen})
    top = ctx.for_size(ctx.size)
    top.seeds = tuple(every) or tuple(ctx.seeds)
    top.render_only = True  # trained above; the table reads
    top.exp = types.SimpleNamespace(**{k: v for k, v in vars(ctx.exp).items() if not k.startswith("__")})
    top.exp.LADDER = sizes
    top.table_size = "climb-tmp"  # ladder writes ladder-climb-tmp.*; renamed below
    data = ladder(top)
    md = open(top.table_path("ladder", "md")).read().rstrip("\n")
    # a seed a point does not have is not missing (SEEDS: 3 at the lower points, 5 at the top two)
    own = {z: set(ctx.exp.SEEDS[z]) for z in sizes}
    missing = [m for m in data["missing"] if int(m.rsplit("-s", 1)[1]) in own.get(m.split("/")[0], set())]
    if data["missing"] or ctx.unverified:
        md = md[:md.index("\n\nNot available yet" if data["missing"] else "\n\nRead without checking")]
        md += missing_note(missing, ctx, "rerun without --render_only to train them")
    data["missing"] = missing
    md = md.replace("## Scale ladder: the Fig. 2 protocol at several compute points",
                    "## Scale ladder, the new recipe (issue 32): the Fig. 2 protocol at the points of CLIMB")
    md = md.replace("the `ppl` table's recipe at each size of experiments/repro.py LADDER",
                    "the recipe of each point of experiments/repro.py CLIMB (its own steps, batch, warmup and peak "
                    "LR, chosen by the pilot's rule; the pilot table lists them) and its own seeds (SEEDS)")
    png = data.get("figure")
    if png and os.path.exists(png):
        dst = ctx.table_path("climb", "png")
        shutil.move(png, dst)
        md = md.replace(f"Figure: {os.path.basename(png)}", f"Figure: {os.path.basename(dst)}")
        data["figure"] = dst
    for ext in ("md", "json"):
        if os.path.exists(top.table_path("ladder", ext)):
            os.remove(top.table_path("ladder", ext))
    data["table"] = "climb"
    write_table(ctx, "climb", md, data)
    return data


SELECTIVE_TASK_FAMILIES = ("state", "mad", "mqar", "lm")  # idattn/studies/repro_selective.py table_selective
TABLE_FNS = {"ppl": table_ppl, "cube": table_cube, "length": table_length, "recall": table_recall,
             "ladder": table_ladder, "mad": table_mad, "pilot": table_pilot, "climb": table_climb,
             "hybrid": table_hybrid, "selective": table_selective, "length_climb": table_length_climb}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", choices=TABLES + ("mad", "ladder", "pilot", "climb", "length_climb", "hybrid", "selective",
                                              "all", "verify"),
                   help="a table, `all`, or `verify`: the root's finished runs by their model fingerprint (stamp it "
                        "under the current model code; re-stamp a run whose fingerprint the current code reproduces; "
                        "idattn/studies/repro_verify.py), then --archive; no table is written")
    p.add_argument("--root", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "idattn-repro"))
    p.add_argument("--toy", action="store_true", help="the smoke-test size: numbers and intervals, never a verdict "
                   "(they mean nothing). Measured on the shared 2-core machine: `ppl --toy` 3.9 min wall (18 toy runs: "
                   "6 per seed x 3 seeds; the first run of each mixer compiles for 20-45 s, the others take 3-10 s); "
                   "`ppl --toy --only=interdomain` 1.4 min (6 runs); `all --toy` trains more (cube, MQAR)")
    p.add_argument("--seeds", default="", help="comma-separated seeds (default: the config's, 0,1,2)")
    p.add_argument("--render_only", action="store_true", help="write the tables from existing results only")
    p.add_argument("--keep_stale", action="store_true", help="reuse runs trained with other model code")
    p.add_argument("--no_compile_cache", action="store_true", help="do not set JAX's persistent compilation "
                   "cache (default: <root>/.jax-cache, so that seeds and reruns reuse compiled programs)")
    p.add_argument("--train_dt", default="", choices=("", "paper", "scaled"),
                   help="train / evaluate only runs of this Δ range (and softmax); the tables read the others")
    p.add_argument("--doc", default="", help="also rewrite the generated part of this Markdown file (between the "
                   "markers of idattn/studies/repro_doc.py, e.g. docs/reproduction.md): the verdict summary and every "
                   "table of the root, in the order of `all`, from what the tables say after this invocation")
    p.add_argument("--only", default="", help="comma-separated mixers to train / evaluate; the tables read the "
                   "others' existing results (e.g. to run part of the grid first)")
    p.add_argument("--tasks", default="", help="the selective table only: comma-separated task families to train "
                   f"({', '.join(SELECTIVE_TASK_FAMILIES)}); the others' runs are read (e.g. a GPU for the slow ones)")
    p.add_argument("--restore", default="", help="first recreate under --root the finished runs this record "
                   "(written by --archive) holds and the root lacks: markers and results, no checkpoints; they are "
                   "reused as finished runs when the model code and recipe match (e.g. docs/reproduction-runs.json)")
    p.add_argument("--archive", default="", help="at the end, record every finished run of --root (markers and "
                   "results) in this JSON file, merged with what it holds: a study then outlives its scratch root")
    args = p.parse_args(argv)

    size = "toy" if args.toy else "small"
    t0 = time.time()
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file at INFO
    try:
        exp = load_experiment()
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds else list(exp.SEEDS[size])
        if not seeds:
            raise ReproError("--seeds: expected comma-separated integers, e.g. 0,1")
        only = [m.strip() for m in args.only.split(",") if m.strip()]
        if only:
            try:
                for m in only:
                    if exp.parse_hybrid(m):  # hybrid-<recurrent>-<attention>-1to<k> (the `hybrid` table)
                        continue
                    exp.get_config(f"{m},toy,paper,0")  # the name as a run would build it (+sum, a core's +phase)
            except ValueError as e:
                raise ReproError(f"--only: {e}") from None
        tasks = frozenset(t.strip() for t in args.tasks.split(",") if t.strip())
        if tasks - set(SELECTIVE_TASK_FAMILIES):
            raise ReproError(f"--tasks: {', '.join(sorted(tasks - set(SELECTIVE_TASK_FAMILIES)))}; expected some of "
                             f"{', '.join(SELECTIVE_TASK_FAMILIES)}, comma-separated")
        if tasks and args.table != "selective":
            raise ReproError(f"--tasks applies to the selective table only (got table {args.table!r}); drop it, or "
                             f"use --only / --seeds to choose runs")
        ctx = Ctx(args.root, size, seeds, args.render_only, args.keep_stale, only)
        ctx.tasks = tasks
        ctx.train_dt = args.train_dt
        ctx.seeds_given = bool(args.seeds)
        ctx.archive = args.archive  # recorded after every finished run too, so a stop loses nothing
        if args.restore:
            log(f"restored {restore_runs(args.restore, ctx.root)} runs from {args.restore} into {ctx.root}")
        import jax
        if not args.no_compile_cache and not jax.config.jax_compilation_cache_dir:
            # the two seeds of a mixer (and reruns) compile the same programs
            jax.config.update("jax_compilation_cache_dir", os.path.join(ctx.root, ".jax-cache"))
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        if args.table == "verify":
            from idattn.studies.repro_verify import verify_runs
            out = verify_runs(ctx)
            for k, names in out.items():
                log(f"{k}: {len(names)}" + (f" ({'; '.join(names[:20])}{'; ...' if len(names) > 20 else ''})"
                                            if names and k in ("changed", "unverifiable", "skipped") else ""))
            if args.archive:
                log(f"recorded {archive_runs(ctx.root, args.archive)} finished runs in {args.archive}")
            log(f"total wall time {(time.time() - t0) / 60:.1f} min")
            return 0
        # `all`: ALL_ORDER (the budgeted tables by evidence per CPU-minute, then MQAR's, outside the budget); at
        # toy size there is no ladder
        every = tuple(t for t in ALL_ORDER if size != "toy" or t not in NOT_AT_TOY)
        tables = every if args.table == "all" else (args.table,)
        log(f"{', '.join(tables)} at size {size}, seeds {seeds}, root {ctx.root}")
        for t in tables:
            ts = time.time()
            ctx.unverified.clear()  # each table names the unchecked runs it read itself, not an earlier table's
            TABLE_FNS[t](ctx)
            log(f"table {t} done in {(time.time() - ts) / 60:.1f} min")
            print(open(ctx.table_path(t, "md")).read(), flush=True)
        if args.doc:
            from idattn.studies import repro_doc
            order = tuple(t for t in ALL_ORDER if size != "toy" or t not in NOT_AT_TOY)
            try:
                repro_doc.update_doc(args.doc, repro_doc.render(ctx.root, order, ctx.table_path,
                                                                os.path.dirname(os.path.abspath(args.doc))),
                                     repro_doc.found(repro_doc.load_tables(order, ctx.table_path)))
            except OSError as e:
                raise ReproError(f"--doc={args.doc}: {e}") from None
            log(f"wrote the generated part of {args.doc}")
        if args.archive:
            log(f"recorded {archive_runs(ctx.root, args.archive)} finished runs in {args.archive}")
    except ReproError as e:
        print(f"idattn.repro: {e}", file=sys.stderr)
        return 1
    log(f"total wall time {(time.time() - t0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
