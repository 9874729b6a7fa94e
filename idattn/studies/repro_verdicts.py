"""The reproduction's verdict rules: each claim of the paper as a fixed rule on per-seed numbers (the rules and
their thresholds are stated in idattn/studies/repro.py's docstring and docs/reproduction.md, fixed before the
runs). Pure functions of numbers; `idattn.studies.repro` applies them to its tables.
"""
from __future__ import annotations

import math
from typing import Any

from idattn.eval import paper_numbers as P


def paired(x: list, y: list) -> list[tuple[float, float]]:
    return [(a, b) for a, b in zip(x, y) if a is not None and b is not None]


def verdict_a(inter: list, s4d: list) -> tuple[str, str]:
    """Per seed (same data order and init seed for both mixers): S4D-only / Interdomain perplexity."""
    pr = paired(inter, s4d)
    if not pr:
        return "inconclusive", "missing runs"
    r = [b / a for a, b in pr]
    why = f"S4D-only / Interdomain per seed {' / '.join(f'{v:.3f}' for v in r)} ({len(r)} seed(s))"
    if all(v >= 1.05 for v in r):
        return "reproduced", why
    if all(v < 1.0 for v in r):
        return "not reproduced", why + "; Interdomain worse in every seed"
    return "inconclusive", why + "; under 5% or not in every seed"


def verdict_b(inter: list, soft: list) -> tuple[str, str]:
    """Per seed: Interdomain / Softmax perplexity; 'matches' = within 2%."""
    pr = paired(inter, soft)
    if not pr:
        return "inconclusive", "missing runs"
    r = [a / b for a, b in pr]
    why = f"Interdomain / Softmax per seed {' / '.join(f'{v:.3f}' for v in r)} ({len(r)} seed(s))"
    if all(v < 1.0 for v in r):
        return "reproduced", why + "; Interdomain better in every seed"
    if all(v <= 1.02 for v in r):
        return "reproduced", why + "; matches (within 2%) in every seed"
    if all(v > 1.02 for v in r):
        return "not reproduced", why + "; Interdomain more than 2% worse in every seed"
    return "inconclusive", why


def verdict_c(inter: list[float], soft: list[float]) -> tuple[str, str]:
    si, ss = stats(inter), stats(soft)
    if not si["n"] or not ss["n"]:
        return "inconclusive", "missing runs"
    why = (f"ppl@4x / ppl@1x: Interdomain {' / '.join(f'{v:.3f}' for v in inter)}, Softmax "
           f"{' / '.join(f'{v:.3f}' for v in soft)}")
    if si["max"] <= 1.05 and ss["min"] >= 1.20:
        return "reproduced", why
    if si["min"] > 1.05 or ss["max"] < 1.05:
        return "not reproduced", why
    return "inconclusive", why


def verdict_d(per_seed_axes: list[dict[str, Any]]) -> tuple[str, str]:
    per_seed_axes = [ax for ax in per_seed_axes if None not in (ax["readout"], ax["input"], ax["rope"])]
    if not per_seed_axes:
        return "inconclusive", "missing cells"
    why = "; ".join(f"seed {i} ({ax.get('basis', 'all eight cells')}): readout {ax['readout'] * 100:+.1f}%, input {ax['input'] * 100:+.1f}%, "
                    f"RoPE {ax['rope'] * 100:+.1f}%" for i, ax in enumerate(per_seed_axes))
    ok = [ax["readout"] > 0 and ax["readout"] > abs(ax["input"]) and abs(ax["rope"]) < ax["readout"] / 4
          for ax in per_seed_axes]
    if all(ok):
        return "reproduced", why
    dominant_other = [ax["readout"] <= 0 or abs(ax["input"]) > abs(ax["readout"]) or
                      abs(ax["rope"]) > abs(ax["readout"]) for ax in per_seed_axes]
    if all(dominant_other):
        return "not reproduced", why
    return "inconclusive", why


def verdict_e(soft: list, inter: list, s4d: list) -> tuple[str, str]:
    """Per seed (MQAR accuracy): Softmax >= Interdomain - 0.02 and Interdomain >= S4D-only + 0.02."""
    tr = [(a, b, c) for a, b, c in zip(soft, inter, s4d) if None not in (a, b, c)]
    if not tr:
        return "inconclusive", "missing runs"
    why = (f"MQAR accuracy per seed: Softmax {' / '.join(f'{a:.3f}' for a, _, _ in tr)}, Interdomain "
           f"{' / '.join(f'{b:.3f}' for _, b, _ in tr)}, S4D-only {' / '.join(f'{c:.3f}' for _, _, c in tr)}")
    ok = [a >= b - 0.02 and b >= c + 0.02 for a, b, c in tr]
    if all(ok):
        return "reproduced", why
    if not any(ok):
        return "not reproduced", why
    return "inconclusive", why


def cube_axes(vals: dict[str, float]) -> dict[str, float | None]:
    """Main effect of each axis: mean over the 4 pairs differing only in that axis of ln ppl(b) − ln ppl(a),
    a = (dualkv | query | rope), b = (generic | linear | norope). Positive readout effect = query is better."""
    from idattn.models.spec import cube_cells
    out: dict[str, float | None] = {}
    axes = {"input": (0, "dualkv", "generic"), "readout": (1, "query", "linear"), "rope": (2, "rope", "norope")}
    for name, (i, a, b) in axes.items():
        diffs = []
        for cell in cube_cells():
            parts = cell.split("-")
            if parts[i] != a:
                continue
            other = "-".join(b if j == i else p for j, p in enumerate(parts))
            if vals.get(cell) is None or vals.get(other) is None:
                continue
            diffs.append(math.log(vals[other]) - math.log(vals[cell]))
        out[name] = sum(diffs) / len(diffs) if len(diffs) == 4 else None
    return out


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
