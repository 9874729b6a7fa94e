"""Scaling-law fits over finished runs: Chinchilla's approach 3 (a Huber fit of L(N, D) = E + A/N^α + B/D^β
in log space, from a grid of starts, BFGS), IsoFLOP parabolas and their minima, bootstrap bands, the
compute-optimal frontier and the difference test between two mixers. Pure numpy / scipy on `Point`s;
`idattn.studies.scaling` collects the points from run directories and writes the report and figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy.optimize import minimize

HUBER_DELTA = 1e-3


@dataclass
class Point:
    name: str
    mixer: str
    n: float  # non-embedding parameters
    d: float  # training tokens
    loss: float
    compute: float  # 6 N D, or the sweep's nominal budget
    flops: float  # flops_per_token · D (actual training FLOPs, LM head and mixer included)
    size: str = ""
    workdir: str = ""
    extra: dict = field(default_factory=dict)


PARAM_NAMES = ("E", "A", "alpha", "B", "beta")


def law(p: dict, n, d):
    """L(N, D) = E + A N^-α + B D^-β (broadcasts)."""
    return p["E"] + p["A"] * np.power(n, -p["alpha"]) + p["B"] * np.power(d, -p["beta"])


def _objective(theta, logn, logd, logl, delta):
    a, b, e, al, be = theta
    z = np.stack([a - al * logn, b - be * logd, np.full_like(logn, e)])
    zmax = z.max(axis=0)
    w = np.exp(z - zmax)
    s = w.sum(axis=0)
    pred = zmax + np.log(s)
    w = w / s
    r = pred - logl
    ar = np.abs(r)
    quad = ar <= delta
    loss = np.where(quad, 0.5 * r * r, delta * (ar - 0.5 * delta)).sum()
    g_r = np.where(quad, r, delta * np.sign(r))
    grad = np.array([(g_r * w[0]).sum(), (g_r * w[1]).sum(), (g_r * w[2]).sum(),
                     -(g_r * w[0] * logn).sum(), -(g_r * w[1] * logd).sum()])
    return loss, grad


def default_inits() -> np.ndarray:
    """Fixed initialisations (a, b, e, α, β) after Chinchilla's grid (coarser here; the data-driven starts of
    `grid_inits` do most of the work)."""
    al = be = (0.5,)
    e = (-1.0, 0.5)
    a = b = (3.0, 10.0)
    return np.array([(x1, x2, x3, x4, x5) for x1 in a for x2 in b for x3 in e for x4 in al for x5 in be])


def grid_inits(logn, logd, logl, *, k: int = 6, delta: float = HUBER_DELTA) -> np.ndarray:
    """Data-driven starts: for each (α, β) on a 30 x 30 grid, (E, A, B) is linear given the exponents, so it is
    solved by least squares on relative residuals (coefficients clipped to be positive); the k grid points with
    the lowest Huber objective become starts for BFGS."""
    al = np.linspace(0.05, 2.0, 30)
    ag, bg = [x.ravel() for x in np.meshgrid(al, al)]
    y = np.exp(logl)
    x1 = np.exp(-ag[:, None] * logn[None, :])  # [G, m]
    x2 = np.exp(-bg[:, None] * logd[None, :])
    X = np.stack([np.ones_like(x1), x1, x2], -1) / y[None, :, None]  # relative residuals
    t = np.ones_like(y)[None, :].repeat(len(ag), 0)
    xtx = np.einsum("gmi,gmj->gij", X, X) + 1e-12 * np.eye(3)
    xty = np.einsum("gmi,gm->gi", X, t)
    coef = np.linalg.solve(xtx, xty[..., None])[..., 0]
    coef = np.clip(coef, 1e-6, None)
    pred = np.log(coef[:, :1] + coef[:, 1:2] * x1 + coef[:, 2:3] * x2)
    r = np.abs(pred - logl[None, :])
    obj = np.where(r <= delta, 0.5 * r * r, delta * (r - 0.5 * delta)).sum(1)
    best = np.argsort(obj)[:k]
    return np.stack([np.log(coef[best, 1]), np.log(coef[best, 2]), np.log(coef[best, 0]), ag[best], bg[best]], 1)


def _theta_of(p: dict) -> np.ndarray:
    """The law's parameters as one BFGS start (a, b, e, α, β): the inverse of _params_from_theta."""
    return np.array([[math.log(p["A"]), math.log(p["B"]), math.log(p["E"]), p["alpha"], p["beta"]]])


def _params_from_theta(theta) -> dict:
    a, b, e, al, be = (float(x) for x in theta)
    return {"E": math.exp(e), "A": math.exp(a), "alpha": al, "B": math.exp(b), "beta": be}


def fit_law(n, d, loss, *, inits: np.ndarray | None = None, grid_k: int = 6, delta: float = HUBER_DELTA) -> dict:
    """Fits E, A, α, B, β by Huber loss on log-residuals from every start (the `grid_k` best `grid_inits` plus
    `inits`, default `default_inits()`); returns the parameters of the start that converged lowest."""
    n, d, loss = (np.asarray(x, np.float64) for x in (n, d, loss))
    if n.size < 5:
        raise ValueError(f"fit_law: {n.size} runs; the law has 5 parameters, give at least 5 runs (better 12+)")
    if np.any(loss <= 0) or np.any(n <= 0) or np.any(d <= 0):
        raise ValueError("fit_law: N, D and the loss must be positive")
    logn, logd, logl = np.log(n), np.log(d), np.log(loss)
    starts = [default_inits() if inits is None else np.atleast_2d(inits)]
    if grid_k > 0:
        starts.append(grid_inits(logn, logd, logl, k=grid_k, delta=delta))
    inits = np.concatenate(starts)
    results = []
    for x0 in inits:
        # BFGS (unbounded): on this 5-parameter problem 20-100x faster than scipy's L-BFGS-B, same minima
        r = minimize(_objective, x0, args=(logn, logd, logl, delta), jac=True, method="BFGS",
                     options={"maxiter": 1000})
        if np.all(np.isfinite(r.x)):
            results.append((float(r.fun), r.x))
    if not results:
        raise RuntimeError("fit_law: no initialisation converged")
    return _params_from_theta(min(results, key=lambda t: t[0])[1])


def optimal_allocation(p: dict, c):
    """(N*, D*, L*) at compute C = 6 N D under the law p (closed form; a = β/(α+β))."""
    c = np.asarray(c, np.float64)
    al, be = p["alpha"], p["beta"]
    if al <= 0 or be <= 0:
        return np.full_like(c, np.nan), np.full_like(c, np.nan), np.full_like(c, np.nan)
    g = (al * p["A"] / (be * p["B"])) ** (1.0 / (al + be))
    n = g * (c / 6.0) ** (be / (al + be))
    d = (c / 6.0) / n
    return n, d, law(p, n, d)


def bootstrap_law(n, d, loss, *, best: dict, n_boot: int = 200, seed: int = 0) -> list[dict]:
    """Parameter sets refitted on runs resampled with replacement (draws with < 5 distinct runs are redrawn).
    Each refit starts from the full fit's solution `best` and the resample's two best `grid_inits`."""
    n, d, loss = (np.asarray(x, np.float64) for x in (n, d, loss))
    rng = np.random.default_rng(seed)
    m = n.size
    starts = _theta_of(best)
    out = []
    while len(out) < n_boot:
        idx = rng.integers(0, m, m)
        if len(np.unique(idx)) < 5:
            continue
        out.append(fit_law(n[idx], d[idx], loss[idx], inits=starts, grid_k=2))
    return out


def interval(values, level: float = 0.95) -> tuple[float, float]:
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return (float("nan"), float("nan"))
    lo, hi = np.percentile(v, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def derived(p: dict) -> dict:
    s = p["alpha"] + p["beta"]
    return {"a_N_opt": p["beta"] / s if s > 0 else float("nan"), "b_D_opt": p["alpha"] / s if s > 0 else float("nan")}


def held_out(points: Sequence[Point], *, inits=None) -> dict:
    """Leave-one-size-out: refit without each size (all its runs) and predict them; `largest` is the headline."""
    sizes = sorted({pt.n for pt in points})
    out: dict[str, Any] = {"per_size": []}
    for s in sizes:
        train = [pt for pt in points if pt.n != s]
        test = [pt for pt in points if pt.n == s]
        if len({pt.n for pt in train}) < 2 or len(train) < 5:
            continue
        p = fit_law([t.n for t in train], [t.d for t in train], [t.loss for t in train], inits=inits, grid_k=3)
        pred = law(p, np.array([t.n for t in test]), np.array([t.d for t in test]))
        obs = np.array([t.loss for t in test])
        rel = np.abs(pred - obs) / obs
        out["per_size"].append({"n": s, "size": test[0].size, "mean_rel_err": float(rel.mean()),
                                "max_rel_err": float(rel.max()), "pred": pred.tolist(), "obs": obs.tolist(),
                                "d": [t.d for t in test]})
    if out["per_size"]:
        out["largest"] = out["per_size"][-1]
    return out


def isoflop_groups(points: Sequence[Point]) -> dict[float, list[Point]]:
    """Budget -> points; nominal budgets as they are, else 6ND rounded to 0.02 decades."""
    groups: dict[float, list[Point]] = {}
    for pt in points:
        key = pt.extra.get("nominal_compute") or 10 ** (round(math.log10(pt.compute) / 0.02) * 0.02)
        groups.setdefault(float(key), []).append(pt)
    return dict(sorted(groups.items()))


def parabola_min(n, loss) -> dict:
    x, y = np.log(np.asarray(n, np.float64)), np.asarray(loss, np.float64)
    if len(np.unique(x)) < 3:
        return {"ok": False, "why": "fewer than 3 sizes"}
    p2, p1, p0 = np.polyfit(x, y, 2)
    if p2 <= 0:
        return {"ok": False, "why": "parabola opens downwards (no minimum)", "coef": [p2, p1, p0]}
    xs = -p1 / (2 * p2)
    return {"ok": True, "n_opt": float(math.exp(xs)), "loss_opt": float(p0 + p1 * xs + p2 * xs * xs),
            "inside": bool(x.min() <= xs <= x.max()), "coef": [float(p2), float(p1), float(p0)]}


def _powerlaw(c, v) -> tuple[float, float]:
    """log v = k + e log c by least squares -> (exponent, prefactor)."""
    e, k = np.polyfit(np.log(c), np.log(v), 1)
    return float(e), float(math.exp(k))


def isoflop_fit(points: Sequence[Point], *, n_boot: int = 200, seed: int = 0) -> dict:
    groups = isoflop_groups(points)
    minima = []
    for c, pts in groups.items():
        r = parabola_min([p.n for p in pts], [p.loss for p in pts])
        r["compute"] = c
        r["sizes"] = len({p.n for p in pts})
        if r["ok"]:
            r["d_opt"] = c / (6.0 * r["n_opt"])
        minima.append(r)
    good = [m for m in minima if m["ok"]]
    out: dict[str, Any] = {"minima": minima}
    if len(good) < 2:
        out["exponents"] = None
        out["why"] = f"{len(good)} budget(s) with a parabola minimum; exponents need >= 2"
        return out
    cs = np.array([m["compute"] for m in good])
    a, ka = _powerlaw(cs, [m["n_opt"] for m in good])
    b, kb = _powerlaw(cs, [m["d_opt"] for m in good])
    rng = np.random.default_rng(seed)
    boot_a, boot_b, tries = [], [], 0
    while len(boot_a) < n_boot and tries < 200 * n_boot:
        tries += 1
        cc, nn = [], []
        for c, pts in groups.items():
            # a resample needs more distinct sizes than the parabola's 3 coefficients (else it interpolates
            # and its minimum is arbitrary): at least 4 when the budget has 5 or more sizes, else 3
            need = min(4, len({p.n for p in pts})) if len({p.n for p in pts}) >= 5 else 3
            for _ in range(100):
                idx = rng.integers(0, len(pts), len(pts))
                if len({pts[i].n for i in idx}) >= need:
                    break
            sub = [pts[i] for i in idx]
            r = parabola_min([p.n for p in sub], [p.loss for p in sub])
            if r["ok"]:
                cc.append(c)
                nn.append(r["n_opt"])
        if len(cc) >= 2 and len(set(cc)) >= 2:
            ea, _ = _powerlaw(np.array(cc), nn)
            boot_a.append(ea)
            boot_b.append(1.0 - ea)  # D_opt = C / (6 N_opt): b = 1 - a exactly
    out["exponents"] = {"a_N_opt": a, "b_D_opt": b, "k_N": ka, "k_D": kb, "budgets_used": len(good),
                        "a_ci": interval(boot_a), "b_ci": interval(boot_b), "boot_draws": len(boot_a)}
    return out


def fit_mixer(points: Sequence[Point], *, n_boot: int = 200, seed: int = 0) -> dict:
    n = np.array([p.n for p in points])
    d = np.array([p.d for p in points])
    y = np.array([p.loss for p in points])
    best = fit_law(n, d, y)
    boots = bootstrap_law(n, d, y, n_boot=n_boot, seed=seed, best=best)
    ci = {k: interval([b[k] for b in boots]) for k in PARAM_NAMES}
    der = derived(best)
    der_ci = {k: interval([derived(b)[k] for b in boots]) for k in der}
    resid = np.log(law(best, n, d)) - np.log(y)
    return {"n_runs": len(points), "params": best, "ci": ci, "derived": der, "derived_ci": der_ci,
            "rms_log_resid": float(np.sqrt(np.mean(resid ** 2))), "boot": boots,
            "held_out": held_out(points, inits=_theta_of(best)),
            "isoflop": isoflop_fit(points, n_boot=n_boot, seed=seed),
            "range": {"n": [float(n.min()), float(n.max())], "d": [float(d.min()), float(d.max())],
                      "c": [float((6 * n * d).min()), float((6 * n * d).max())]}}


def predict_with_band(fit: dict, n, d) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(central, 2.5 %, 97.5 %) of L(N, D) over the bootstrap fits."""
    mid = law(fit["params"], np.asarray(n, float), np.asarray(d, float))
    draws = np.array([law(b, np.asarray(n, float), np.asarray(d, float)) for b in fit["boot"]])
    return mid, np.percentile(draws, 2.5, axis=0), np.percentile(draws, 97.5, axis=0)


def frontier_with_band(fit: dict, c) -> dict:
    c = np.asarray(c, float)
    nn, dd, ll = optimal_allocation(fit["params"], c)
    draws = [optimal_allocation(b, c) for b in fit["boot"]]
    out = {"c": c, "n": nn, "d": dd, "loss": ll}
    for i, k in enumerate(("n", "d", "loss")):
        arr = np.array([x[i] for x in draws])
        out[k + "_lo"] = np.nanpercentile(arr, 2.5, axis=0)
        out[k + "_hi"] = np.nanpercentile(arr, 97.5, axis=0)
    return out


def difference_test(fit1: dict, fit2: dict, c) -> dict:
    """gap(C) = L*_1(C) − L*_2(C) and gap / L*_1 with bootstrap intervals (draw i of each fit paired)."""
    c = np.asarray(c, float)
    l1 = optimal_allocation(fit1["params"], c)[2]
    l2 = optimal_allocation(fit2["params"], c)[2]
    k = min(len(fit1["boot"]), len(fit2["boot"]))
    g, rel = [], []
    for i in range(k):
        a = optimal_allocation(fit1["boot"][i], c)[2]
        b = optimal_allocation(fit2["boot"][i], c)[2]
        g.append(a - b)
        rel.append((a - b) / a)
    g, rel = np.array(g), np.array(rel)
    growth = rel[:, -1] - rel[:, 0]
    return {"c": c.tolist(), "gap": (l1 - l2).tolist(), "gap_lo": np.nanpercentile(g, 2.5, 0).tolist(),
            "gap_hi": np.nanpercentile(g, 97.5, 0).tolist(), "rel_gap": ((l1 - l2) / l1).tolist(),
            "rel_lo": np.nanpercentile(rel, 2.5, 0).tolist(), "rel_hi": np.nanpercentile(rel, 97.5, 0).tolist(),
            "rel_growth": float(((l1 - l2) / l1)[-1] - ((l1 - l2) / l1)[0]),
            "rel_growth_ci": list(interval(growth)), "draws": int(k)}


def paired_runs(points: Sequence[Point], a: str, b: str, *, n_boot: int = 2000, seed: int = 0) -> dict | None:
    """Model-free check beside the fitted gap: runs of mixers a and b with the same size name and budget
    (nominal compute, else tokens), relative difference (L_a − L_b) / L_a per pair, its mean with a percentile
    bootstrap interval over pairs, and how many pairs favour b."""
    def key(p):
        return (p.size, p.extra.get("nominal_compute") or p.d)
    pa = {key(p): p for p in points if p.mixer == a}
    pb = {key(p): p for p in points if p.mixer == b}
    common = sorted(set(pa) & set(pb), key=lambda k: (pa[k].n, k[1]))
    if not common:
        return None
    rel = np.array([(pa[k].loss - pb[k].loss) / pa[k].loss for k in common])
    rng = np.random.default_rng(seed)
    boot = [rel[rng.integers(0, rel.size, rel.size)].mean() for _ in range(n_boot)]
    return {"pairs": [{"size": k[0], "budget": k[1], "loss_" + a: pa[k].loss, "loss_" + b: pb[k].loss,
                       "rel": float(r)} for k, r in zip(common, rel)],
            "mean_rel": float(rel.mean()), "mean_rel_ci": list(interval(boot)), "b_better": int((rel > 0).sum()),
            "n": int(rel.size)}

