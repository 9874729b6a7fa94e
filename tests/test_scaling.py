"""Scaling-law fitting (idattn.scaling) on synthetic run folders written in the trainer's format.

The losses come from known laws L = E + A/N^α + B/D^β times log-normal noise; the tests check that the fit
recovers the exponents and E within stated tolerances, that the bootstrap intervals cover the truth, that
IsoFLOP minima give the compute-optimal exponent a = β/(α+β), and that the difference test sees a real gap
and does not invent one. Two mixers get *different* true exponents, so a fitter returning a constant (or one
mixer's answer for both) fails.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from idattn.studies import scaling as S, scaling_laws as L
from idattn.configs import base_config
from idattn.rundir.schema import write_result
from idattn.configs.sizes import cpu_shape, non_embedding_params
from idattn.configs.runs import make_run
from idattn.rundir.layout import save_config

TRUTH = {
    "softmax": dict(E=1.8, A=60.0, alpha=0.30, B=300.0, beta=0.32),
    "interdomain": dict(E=1.7, A=150.0, alpha=0.42, B=300.0, beta=0.32),
}
WIDTHS = (32, 64, 128, 256, 512)  # N ≈ 13K .. 51M non-embedding parameters
TOKENS = (2e6, 1e7, 5e7, 2.5e8, 1.25e9)
NOISE = 0.01  # 1 % multiplicative


def _write_run(root, mixer, width, tokens, loss, compute=0.0):
    """One finished run folder as the trainer writes it: config.json, metrics.jsonl, eval/validation-*.json."""
    b = base_config()
    b.data.seq_len = 64
    b.train.batch_size = 8
    c = make_run(b, study="syn", mixer=mixer, shape=cpu_shape(width), tokens=int(tokens), compute=compute)
    wd = os.path.join(root, c.sweep.name)
    os.makedirs(wd, exist_ok=True)
    steps = c.sweep.tokens // 512
    save_config(wd, c)
    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": steps, "loss": loss * 1.01, "tokens_seen": c.sweep.tokens}) + "\n")
    write_result(wd, "validation", steps, {"loss": loss, "ppl": math.exp(loss)}, run={"mixer": mixer})
    return c


@pytest.fixture(scope="module")
def law_fit(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("runs"))
    rng = np.random.default_rng(0)
    for mixer, p in TRUTH.items():
        for w in WIDTHS:
            for t in TOKENS:
                b = base_config()
                b.model.update(cpu_shape(w))
                from idattn.models.spec import apply_mixer_name
                apply_mixer_name(b.model, mixer)
                n = non_embedding_params(b.model)
                d = (int(t) + 511) // 512 * 512
                loss = float(L.law(p, n, d) * math.exp(rng.normal(0, NOISE)))
                _write_run(root, mixer, w, t, loss)
    os.makedirs(os.path.join(root, "unfinished"), exist_ok=True)  # a folder without a result is skipped
    save_config(os.path.join(root, "unfinished"), base_config())
    out = os.path.join(root, "fit")
    res = S.fit_root(root, out=out, n_boot=30, seed=0, plots=True, title="synthetic")
    return root, out, res


def test_law_recovered_with_covering_intervals(law_fit):
    _, _, res = law_fit
    fits = res["_fits"]
    assert set(fits) == {"softmax", "interdomain"}
    assert len(res["points"]) == 50 and any("unfinished" in n for n in res["notes"])
    for mixer, truth in TRUTH.items():
        f = fits[mixer]
        p, ci = f["params"], f["ci"]
        # tolerances: 1 % noise on a 5 x 5 grid over 3.6 decades of N and 2.8 of D
        assert abs(p["alpha"] - truth["alpha"]) < 0.05, (mixer, p)
        assert abs(p["beta"] - truth["beta"]) < 0.05, (mixer, p)
        assert abs(p["E"] - truth["E"]) < 0.15, (mixer, p)
        for k in ("alpha", "beta", "E"):
            lo, hi = ci[k]
            assert lo <= truth[k] <= hi, (mixer, k, truth[k], ci[k])
            assert hi - lo < {"alpha": 0.2, "beta": 0.2, "E": 0.6}[k], (mixer, k, ci[k])  # informative
        # held-out: the largest size, never seen by its refit, predicted within 3 % (noise is 1 %)
        ho = f["held_out"]["largest"]
        assert ho["mean_rel_err"] < 0.03, ho
        obs = np.array(ho["obs"])
        assert np.mean(np.abs(obs.mean() - obs) / obs) > 2 * ho["mean_rel_err"]  # beats a constant predictor
        # compute-optimal exponent a = β/(α+β)
        a_true = truth["beta"] / (truth["alpha"] + truth["beta"])
        assert abs(f["derived"]["a_N_opt"] - a_true) < 0.06
    # the two mixers' true exponents differ by 0.12; the fits must tell them apart
    assert fits["interdomain"]["params"]["alpha"] - fits["softmax"]["params"]["alpha"] > 0.06


def test_outputs_and_difference_test(law_fit):
    _, out, res = law_fit
    with open(os.path.join(out, "scaling_fit.json")) as f:
        saved = json.load(f)
    assert saved["metric"] == "val_loss" and saved["fits"]["softmax"]["n_runs"] == 25
    for name in ("law.png", "isoflop.png", "frontier.png", "gap.png"):
        assert os.path.getsize(os.path.join(out, name)) > 10_000
    d = res["difference"]
    assert d["mixers"] == ["softmax", "interdomain"]
    c = np.array(d["c"])
    truth_gap = (L.optimal_allocation(TRUTH["softmax"], c)[2] - L.optimal_allocation(TRUTH["interdomain"], c)[2])
    inside = c <= d["c_data_max"]
    lo, hi = np.array(d["gap_lo"]), np.array(d["gap_hi"])
    # the true gap (> 0.09 nats everywhere) lies in the band within the data range, and the band excludes 0
    assert np.all(truth_gap > 0.09)
    assert np.mean((lo[inside] <= truth_gap[inside]) & (truth_gap[inside] <= hi[inside])) >= 0.9
    assert np.all(lo[inside] > 0)
    # paper predictions carry intervals and the paper's numbers
    pr = res["paper_predictions"]["interdomain"]["1.3b"]
    assert pr["pred_ci"][0] <= pr["pred_loss"] <= pr["pred_ci"][1]
    assert abs(pr["paper_loss"] - math.log(7.98)) < 1e-9


def test_difference_test_finds_no_gap_between_equal_laws():
    rng = np.random.default_rng(1)
    p = TRUTH["softmax"]
    n, d = [x.ravel() for x in np.meshgrid(np.geomspace(1e4, 5e7, 5), np.geomspace(2e6, 1.25e9, 5))]
    fits = []
    for _ in range(2):
        loss = L.law(p, n, d) * np.exp(rng.normal(0, NOISE, n.size))
        pts = [L.Point(name=str(i), mixer="m", n=a, d=b, loss=c, compute=6 * a * b, flops=0.0)
               for i, (a, b, c) in enumerate(zip(n, d, loss))]
        best = L.fit_law(n, d, loss)
        fits.append({"params": best, "boot": L.bootstrap_law(n, d, loss, n_boot=30, best=best), "points": pts})
    c = np.geomspace(1e12, 1e16, 5)
    r = L.difference_test(fits[0], fits[1], c)
    lo, hi, gap = np.array(r["gap_lo"]), np.array(r["gap_hi"]), np.array(r["gap"])
    # No real gap: the estimated gap stays within 1.5 half-widths of its interval (a 95 % interval that
    # excluded 0 by more than that would be a > 3-sigma event) and below 2 % of the loss.
    assert np.all(np.abs(gap) <= 1.5 * (hi - lo) / 2), r
    l_star = L.optimal_allocation(p, c)[2]
    assert np.all(np.abs(gap) < 0.02 * l_star)
    assert np.all(hi - lo < 0.2)


def test_isoflop_exponents_recovered():
    p = dict(E=1.7, A=400.0, alpha=0.34, B=410.0, beta=0.28)
    a_true = p["beta"] / (p["alpha"] + p["beta"])
    rng = np.random.default_rng(2)
    pts = []
    for c in (1e15, 1e16, 1e17, 1e18):
        n_opt = L.optimal_allocation(p, c)[0]
        for k in range(-3, 4):
            n = float(n_opt * 2.0 ** (k + 0.3))  # not centred on the optimum
            d = c / (6 * n)
            loss = float(L.law(p, n, d) * math.exp(rng.normal(0, 0.002)))
            pts.append(L.Point(name=f"{c}-{k}", mixer="m", n=n, d=d, loss=loss, compute=c, flops=0.0,
                               extra={"nominal_compute": c}))
    r = L.isoflop_fit(pts, n_boot=50)
    ex = r["exponents"]
    assert all(m["ok"] and m["inside"] for m in r["minima"])
    assert abs(ex["a_N_opt"] - a_true) < 0.03, (ex, a_true)
    assert abs(ex["b_D_opt"] - (1 - a_true)) < 0.03
    assert ex["a_ci"][0] <= a_true <= ex["a_ci"][1] or abs(ex["a_N_opt"] - a_true) < 0.01
    for m in r["minima"]:  # each budget's minimum near the law's own optimum (within a factor 1.5)
        assert abs(math.log(m["n_opt"] / L.optimal_allocation(p, m["compute"])[0])) < math.log(1.5)


def test_refusals(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run folders"):
        S.collect(str(tmp_path))
    with pytest.raises(ValueError, match="at least 5 runs"):
        L.fit_law([1e4, 1e5], [1e6, 1e7], [3.0, 2.9])
    with pytest.raises(ValueError, match="val_loss or train_loss"):
        S.collect(str(tmp_path), metric="ppl")
