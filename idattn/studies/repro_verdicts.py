"""The reproduction's verdict rule: every claim of the paper judged on per-seed paired statistics with an interval.

The rule (fixed here and in docs/reproduction.md before the >= 3-seed runs; not tuned to any outcome):

1. **Pairing.** Seed s gives every mixer the same init seed (42 + s) and the same data order (shuffle seed s).
   Each claim is a statistic computed *within* a seed, so the seed's difficulty (which at small sizes moves
   perplexity more than the mixer does) cancels: a log-ratio of perplexities, ln(ppl_x / ppl_y), for (a), (b),
   (c); differences of ln-perplexity main effects for (d); differences of accuracies for (e) (accuracies reach
   0 and 1, where a log-ratio is undefined).
2. **Interval: a two-sided 95% paired t interval** over the n per-seed statistics, mean ± t(0.975, n−1)·sd/√n.
   Why t and not a paired bootstrap: with the 3-5 seeds this budget affords, a percentile bootstrap cannot reach
   beyond the sample's min and max (with n = 3 it has 10 distinct resamples) and covers the true mean far less
   often than 95%; the t interval is exact for normal per-seed statistics and wide when n is small
   (t(0.975, 2) = 4.30), which is the honest width for 3 seeds.
3. **Words.** Each claim part has a line (its no-effect or margin value, below) and the side the paper is on.
   "reproduced": the whole interval is on the paper's side of the line; "not reproduced": the whole interval
   is on the other side; otherwise "inconclusive at this scale", with the interval printed. Fewer than
   MIN_SEEDS = 3 paired seeds is always "inconclusive at this scale" (the interval is still printed when n = 2).
   A claim with several parts is reproduced when every part is, not reproduced when any part is, else
   inconclusive. Each claim is its own test at 95%; no correction across the five claims (so across them about
   one false call in four sets of five is expected by chance; the intervals are printed to be read, not only
   the words).
4. **Toy size** (`--toy`) is a smoke test: the numbers and intervals are printed, the verdict is NO_VERDICT,
   never a verdict word.

The claims (statistic per seed; line; the paper's side):

  a  Interdomain beats S4D-only: ln(ppl_S4D-only / ppl_Interdomain); line 0; above (paper: ln 1.166).
  b  Interdomain matches or beats Softmax: ln(ppl_Interdomain / ppl_Softmax); line ln 1.02 (within 2% counts as
     matching); below (paper: ln 0.990).
  c  Length extrapolation, with R = ppl@longest / ppl@train-length: precondition, Softmax uses its context:
     ln(ppl of the last in-training-length position bucket / ppl of the first bucket) below 0 (interval); when
     it is not shown (or not measured) the claim is VACUOUS at this size, whatever the ratios. Parts:
     Softmax degrades relative to Interdomain: ln R_Softmax − ln R_Interdomain, line 0, above; Interdomain
     flat: ln R_Interdomain, line ln 1.05, below (paper 14K/4K: 0.993 and 4.372).
  d  Cube, main effects in ln ppl (mean over the four pairs differing in one axis): the query readout helps:
     readout effect (ln ppl_linear − ln ppl_query), line 0, above; it dominates the input axis:
     readout − |input|, line 0, above; RoPE barely matters: readout / 4 − |rope|, line 0, above.
  e  Recall order (accuracy): Softmax ≥ Interdomain: acc_Softmax − acc_Interdomain, line −0.02 (a 2-point
     tolerance), above; Interdomain > S4D-only: acc_Interdomain − acc_S4D-only, line 0, above.

Pure functions of numbers; the tables apply them. The questions past the paper (idattn/studies/claims.py QUESTIONS)
take the same interval, and answer yes / no / undecided where a claim says reproduced / not reproduced / inconclusive
(`answer`).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

from scipy import stats as scipy_stats

from idattn.eval import paper_numbers as P
from idattn.models.spec import cube_cells
from idattn.studies.claims import CLAIMS

MIN_SEEDS = 3
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive at this scale"
VACUOUS = "vacuous at this size"
NO_VERDICT = "no verdict (toy size: numbers only)"
WORDS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, VACUOUS)
METHOD = "two-sided 95% paired t interval over seeds (mean ± t(0.975, n−1)·sd/√n)"

class Verdict(NamedTuple):
    verdict: str
    why: str
    parts: list  # [{"name", "values", "interval", "line", "side", "verdict"}]


def t975(df: int) -> float:
    """Student's t quantile t(0.975, df) (scipy.stats; the two-sided 95% interval's multiplier)."""
    if df < 1:
        raise ValueError(f"t975: df={df}; a t interval needs at least 2 values")
    return float(scipy_stats.t.ppf(0.975, df))


def t_interval(values: Sequence[float]) -> dict[str, Any]:
    """{"n", "mean", "sd", "lo", "hi", "method"}: the 95% t interval of the mean (lo = hi = None when n < 2)."""
    v = [float(x) for x in values if x is not None and math.isfinite(x)]
    n = len(v)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "lo": None, "hi": None, "method": METHOD}
    mean, s = sum(v) / n, sd(v)
    h = half_width(s, n)
    return {"n": n, "mean": mean, "sd": s, "lo": None if h is None else mean - h, "hi": None if h is None else mean + h,
            "method": METHOD}


def sd(values) -> float | None:
    """The sample standard deviation (n − 1) of the finite values; None with fewer than 2."""
    v = [float(x) for x in values if x is not None and math.isfinite(x)]
    if len(v) < 2:
        return None
    m = sum(v) / len(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def half_width(s: float | None, n: int) -> float | None:
    """h(n) = t(0.975, n − 1)·sd/√n: the half-width of the 95% t interval of a mean over n values with this sd."""
    return None if s is None or n < 2 else t975(n - 1) * s / math.sqrt(n)


def judge(values: Sequence[float], line: float, side: str) -> tuple[str, dict[str, Any]]:
    """(word, interval) for one claim part: the paper's claim is `statistic > line` (side "above") or
    `statistic < line` (side "below")."""
    if side not in ("above", "below"):
        raise ValueError(f"judge: side {side!r}")
    iv = t_interval(values)
    if iv["n"] < MIN_SEEDS:
        return INCONCLUSIVE, iv
    lo, hi = iv["lo"], iv["hi"]
    if (side == "above" and lo > line) or (side == "below" and hi < line):
        return REPRODUCED, iv
    if (side == "above" and hi < line) or (side == "below" and lo > line):
        return NOT_REPRODUCED, iv
    return INCONCLUSIVE, iv


def combine(words: Sequence[str]) -> str:
    if any(w == NOT_REPRODUCED for w in words):
        return NOT_REPRODUCED
    if words and all(w == REPRODUCED for w in words):
        return REPRODUCED
    return INCONCLUSIVE


def _fmt1(x: float | None, kind: str) -> str:
    """One value in the claim's own unit: `ratio` (exp of a log-ratio), `pct` (a ln difference in %), `pts`
    (accuracy points)."""
    if x is None:
        return "—"
    if kind == "ratio":
        return f"{math.exp(x):.3f}"
    if kind == "pct":
        return f"{x * 100:+.1f}%"
    return f"{x * 100:+.1f} pts"


def _fmt_iv(iv: dict[str, Any], kind: str) -> str:
    if iv["n"] == 0:
        return "no paired seeds"
    if iv["lo"] is None:
        return f"{_fmt1(iv['mean'], kind)} (1 seed, no interval)"
    return (f"{_fmt1(iv['mean'], kind)} [95% t CI {_fmt1(iv['lo'], kind)}, {_fmt1(iv['hi'], kind)}] over "
            f"{iv['n']} seeds")


def _part(name: str, values: list, line: float, side: str, kind: str, line_text: str) -> dict[str, Any]:
    word, iv = judge(values, line, side)
    per = " / ".join(_fmt1(v, kind) for v in values)
    text = (f"{name}: {_fmt_iv(iv, kind)} (per seed {per or '—'}; paper's side: {side} {line_text})")
    return {"name": name, "values": values, "interval": iv, "line": line, "side": side, "verdict": word,
            "text": text}


def _finish(parts: list[dict[str, Any]], judged: bool, extra: str = "", word: str | None = None) -> Verdict:
    n = min((p["interval"]["n"] for p in parts), default=0)
    why = "; ".join(p["text"] for p in parts)
    if n < MIN_SEEDS:
        why += f"; {n} paired seed(s), the rule needs {MIN_SEEDS}"
    if extra:
        why = extra + "; " + why
    w = word or combine([p["verdict"] for p in parts])
    return Verdict(w if judged else NO_VERDICT, why, parts)


def paired(x: list, y: list) -> list[tuple[float, float]]:
    return [(a, b) for a, b in zip(x, y) if a is not None and b is not None]


def log_ratios(num: list, den: list) -> list[float]:
    return [math.log(a / b) for a, b in paired(num, den)]


def _ratio_claim(c: str, num: list, den: list, judged: bool) -> Verdict:
    """Ratio claim `c` of idattn/studies/claims.py CLAIMS (its statistic, line and side): per seed ln(num / den)."""
    cl = CLAIMS[c]
    return _finish([_part(cl.stat, log_ratios(num, den), cl.line, cl.side, "ratio", f"{math.exp(cl.line):g}")],
                   judged)


def verdict_a(inter: list, s4d: list, judged: bool = True) -> Verdict:
    """Per seed ln(ppl_S4D-only / ppl_Interdomain), line 0, above."""
    return _ratio_claim("a", s4d, inter, judged)


def verdict_b(inter: list, soft: list, judged: bool = True) -> Verdict:
    """Per seed ln(ppl_Interdomain / ppl_Softmax), line ln 1.02, below."""
    return _ratio_claim("b", inter, soft, judged)


C_FLAT = math.log(1.05)


def verdict_c(inter: list, soft: list, soft_uses_context: list | None = None, judged: bool = True) -> Verdict:
    """inter, soft: per-seed R = ppl@longest / ppl@train-length (paired by seed); soft_uses_context: per-seed
    ppl(last in-training-length bucket) / ppl(first bucket) of Softmax, or None when not measured."""
    pr = paired(inter, soft)
    parts = [_part("Softmax R / Interdomain R", [math.log(s / i) for i, s in pr], 0.0, "above", "ratio", "1"),
             _part("Interdomain R", [math.log(i) for i, _ in pr], C_FLAT, "below", "ratio", "1.05")]
    if soft_uses_context is None or not [v for v in soft_uses_context if v is not None]:
        return _finish(parts, judged, "Softmax's perplexity by position was not measured here, so its use of "
                                      "its context is not shown", word=VACUOUS)
    pre = _part("precondition, Softmax last / first position-bucket ppl within the training length",
                [math.log(v) for v in soft_uses_context if v is not None], 0.0, "below", "ratio", "1")
    if pre["verdict"] != REPRODUCED:
        return _finish([pre] + parts, judged, "Softmax is not shown to use its context", word=VACUOUS)
    return _finish([pre] + parts, judged, word=combine([p["verdict"] for p in parts]))


def verdict_d(per_seed_axes: list[dict[str, Any]], judged: bool = True, unit: str = "pct") -> Verdict:
    """unit: "pct" for effects in ln ppl (printed in %), "pts" for effects in accuracy (the MAD table)."""
    ax = [a for a in per_seed_axes if None not in (a.get("readout"), a.get("input"), a.get("rope"))]
    basis = sorted({a.get("basis", "all eight cells") for a in ax})
    parts = [_part("readout effect (query better when > 0)", [a["readout"] for a in ax], 0.0, "above", unit, "0"),
             _part("readout − |input|", [a["readout"] - abs(a["input"]) for a in ax], 0.0, "above", unit, "0"),
             _part("readout / 4 − |RoPE|", [a["readout"] / 4 - abs(a["rope"]) for a in ax], 0.0, "above", unit,
                   "0")]
    return _finish(parts, judged, f"main effects from {', '.join(basis) or 'no complete seed'}")


E_TOL = -0.02


def verdict_e(soft: list, inter: list, s4d: list, judged: bool = True) -> Verdict:
    """Accuracies per seed: acc_S − acc_I (line −0.02, above) and acc_I − acc_S4D (line 0, above)."""
    tr = [(a, b, c) for a, b, c in zip(soft, inter, s4d) if None not in (a, b, c)]
    parts = [_part("Softmax − Interdomain accuracy", [a - b for a, b, _ in tr], E_TOL, "above", "pts", "−2 pts"),
             _part("Interdomain − S4D-only accuracy", [b - c for _, b, c in tr], 0.0, "above", "pts", "0")]
    return _finish(parts, judged)


def main_effects(vals: dict[str, float | None], diff) -> dict[str, float | None]:
    """Main effect of each cube axis: the mean over the 4 pairs of cells differing only in that axis of
    diff(value at a, value at b), a = (dualkv | query | rope), b = (generic | linear | norope); None with a cell
    missing."""
    out: dict[str, float | None] = {}
    axes = {"input": (0, "dualkv", "generic"), "readout": (1, "query", "linear"), "rope": (2, "rope", "norope")}
    for name, (i, a, b) in axes.items():
        diffs = []
        for cell in cube_cells():
            parts = cell.split("-")
            if parts[i] != a:
                continue
            other = "-".join(b if j == i else p for j, p in enumerate(parts))
            if vals.get(cell) is not None and vals.get(other) is not None:
                diffs.append(diff(vals[cell], vals[other]))
        out[name] = sum(diffs) / len(diffs) if len(diffs) == 4 else None
    return out


def cube_axes(vals: dict[str, float]) -> dict[str, float | None]:
    """Main effects in ln ppl: ln ppl(b) − ln ppl(a). Positive readout effect = the query readout is better."""
    return main_effects(vals, lambda at_a, at_b: math.log(at_b) - math.log(at_a))


PAPER_PAIRS = {"input": [("dualkv-query-rope", "generic-query-rope"), ("dualkv-linear-rope", "generic-linear-rope")],
               "readout": [("dualkv-query-rope", "dualkv-linear-rope"), ("generic-query-rope", "generic-linear-rope")],
               "rope": [("dualkv-query-rope", "dualkv-query-norope"), ("generic-linear-rope", "generic-linear-norope")]}


def pair_axes(vals: dict[str, float | None]) -> dict[str, list[float] | None]:
    """ln ppl(b) − ln ppl(a) on the pairs the paper reports (PAPER_PAIRS); None for an axis with a cell missing."""
    out: dict[str, list[float] | None] = {}
    for k, prs in PAPER_PAIRS.items():
        ok = all(vals.get(a) is not None and vals.get(b) is not None for a, b in prs)
        out[k] = [math.log(vals[b]) - math.log(vals[a]) for a, b in prs] if ok else None
    return out


def paper_cube_axes() -> dict[str, list[float]]:
    """The paper's own differences on its reported pairs."""
    return pair_axes({c: ppl for c, _, _, ppl in P.TABLE4 if ppl is not None})


def axes_for_verdict(full: dict[str, float | None], pairs: dict[str, list[float] | None]) -> dict[str, Any]:
    """The full-cube main effects when all eight cells exist, else the mean over the paper's pairs."""
    if None not in full.values():
        return dict(full, basis="all eight cells")
    if None not in pairs.values():
        return dict({k: sum(v) / len(v) for k, v in pairs.items()}, basis="the paper's six cells")
    return {"readout": None, "input": None, "rope": None, "basis": "missing cells"}


def stats(vals: list[float]) -> dict[str, Any]:
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    if not vals:
        return {"mean": None, "min": None, "max": None, "spread": None, "n": 0}
    return {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals), "spread": max(vals) - min(vals),
            "n": len(vals)}


def verdict_json(v: Verdict, **extra) -> dict[str, Any]:
    """A verdict as the tables' JSON record, with `md`: its word as the tables print it (verdict_md)."""
    return dict(extra, md=verdict_md(v), verdict=v.verdict, why=v.why, rule=METHOD,
                parts=[{k: p[k] for k in ("name", "values", "interval", "line", "side", "verdict")} for p in v.parts])


def verdict_md(v: Verdict) -> str:
    """The verdict as the tables print it: the word in bold, or at toy size no word at all."""
    return v.verdict if v.verdict == NO_VERDICT else f"**{v.verdict}**"


def trend(points: Sequence[tuple[float, Sequence[float]]]) -> dict[str, Any]:
    """Least-squares line s = a + b·x through every per-seed value s at its compute point x (x = log10 FLOPs),
    with the 95% t interval of the slope b (df = n − 2, the ordinary OLS standard error). `sign`: "+" / "−" when
    the interval excludes 0, else "undetermined"; needs 3 distinct compute points (else sign None). With a decided
    sign also `cross` = {x, lo, hi}: where the line crosses 0 and its 95% interval (`_crossing`)."""
    xs, ys = [], []
    for x, vals in points:
        for v in vals:
            if v is not None and math.isfinite(v):
                xs.append(float(x))
                ys.append(float(v))
    n, k = len(xs), len(set(xs))
    out: dict[str, Any] = {"n": n, "points": k, "slope": None, "lo": None, "hi": None, "sign": None,
                           "method": "OLS over per-seed values, 95% t interval of the slope (df n−2)"}
    if k < 3 or n < 4:
        return out
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    rss = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(rss / (n - 2) / sxx)
    t = t975(n - 2)
    h = t * se
    out.update(slope=b, intercept=a, lo=b - h, hi=b + h,
               sign="+" if b - h > 0 else ("−" if b + h < 0 else "undetermined"))
    if abs(b) > h:  # the sign is decided: where the line crosses 0, and Fieller's interval for that x
        out["cross"] = _crossing(b, my, mx, h, t * t * rss / (n - 2) / n)
    return out


def _crossing(b: float, my: float, mx: float, h: float, w: float) -> dict[str, float]:
    """x0 = −a/b, where the fitted line a + b·x crosses 0, with its 95% interval (Fieller): the x whose fitted mean's
    95% t band contains 0, |my + b·u| ≤ t·s·sqrt(1/n + u²/Sxx) with u = x − mx, i.e. the u between the roots of
    (b² − h²)·u² + 2·b·my·u + my² − w ≤ 0, h = t·s/sqrt(Sxx) the slope's half-width, w = t²·s²/n. Bounded when
    |b| > h (the slope's interval excludes 0), which is when this is called."""
    qa, qb, qc = b * b - h * h, 2.0 * b * my, my * my - w
    root = math.sqrt(max(qb * qb - 4.0 * qa * qc, 0.0))  # ≥ 0: the band contains 0 at x0 itself
    u1, u2 = sorted(((-qb - root) / (2.0 * qa), (-qb + root) / (2.0 * qa)))
    return {"x": mx - my / b, "lo": mx + u1, "hi": mx + u2}


ANSWERS = {REPRODUCED: "yes", NOT_REPRODUCED: "no"}  # the rule's words for a claim; for a question its answer


def answer(q: str, what: str, values: list[float], line: float, side: str, key: str, name: str, unit: str, fmt,
           judged: bool = True) -> tuple[dict[str, Any], str]:
    """A question judged by the rule on paired per-seed `values`: (its record, its Markdown line); `fmt` writes a
    value in the question's unit (a ratio from a log ratio, points from a difference). Toy size: no answer."""
    word, iv = judge(values, line, side)
    ans = ANSWERS.get(word, "undecided") if judged else "not judged (toy size)"
    record = {"question": what, key: values, "interval": iv, "answer": ans}
    if iv["lo"] is not None:
        ivtxt = f"{name} {fmt(iv['mean'])}{unit} [{fmt(iv['lo'])}, {fmt(iv['hi'])}]"
    elif iv["mean"] is not None:
        ivtxt = f"{name} {fmt(iv['mean'])}{unit} (one seed: no interval)"
    else:
        return record, f"- ({q}) {what}: **{ans}**, no paired seeds yet"
    return record, f"- ({q}) {what}: **{ans}**, {ivtxt} over {len(values)} paired seeds"
