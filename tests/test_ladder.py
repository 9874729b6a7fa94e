"""The scale ladder (idattn.studies.ladder) on constructed run records (no training): per-point intervals and
words, the trend's slope and sign with its interval, and no trend with fewer than 3 compute points."""
from __future__ import annotations

import json
import math
import os

import pytest

from idattn.rundir.schema import write_result
from idattn.studies import ladder, repro_runs as runs, repro_verdicts as verdicts, runcache as cache


def _fake_run(ctx, mixer, seed, ppl, params=400_000):
    wd = ctx.lm_dir(mixer, ctx.exp.PRIMARY_DT, seed)
    L = ctx.train_len()
    steps = int(ctx.exp.SIZES[ctx.size]["num_steps"])
    cache.write_marker(wd, {"status": "done", "src": cache.source_hash(), "steps": steps, "params": params,
                           "mixer": mixer, "seed": seed, "size": ctx.size, "train_s": 60.0})
    write_result(wd, "extrapolation", steps, {f"ppl@{L}": ppl}, run={"mixer": mixer, "seed": seed},
                 protocol=runs.ppl_protocol(ctx, L))


def _build(root, log_ratio_a, sizes=None, noise=(0.0, 0.01, -0.01)):
    """Runs where ln(S4D-only / Interdomain) at ladder point i is log_ratio_a[i] + noise[seed]; every seed has
    its own difficulty (a common factor), which the pairing removes."""
    exp = cache.experiment
    sizes = sizes or exp.LADDER
    for i, size in enumerate(sizes):
        ctx = cache.Ctx(root, size, (0, 1, 2), render_only=True, keep_stale=False)
        params = 100_000 * 2 ** i  # any increasing sizes: the table reads them from the run markers
        for s in (0, 1, 2):
            base = 60.0 * (1 + 0.3 * s) / (1 + i)  # the seed moves perplexity by 30%; the size lowers it
            _fake_run(ctx, "softmax", s, base, params)
            _fake_run(ctx, "interdomain", s, base * 1.005, params)
            _fake_run(ctx, "s4d_only", s, base * 1.005 * math.exp(log_ratio_a[i] + noise[s]), params)


def _table(root):
    ctx = cache.Ctx(root, "small", (0, 1, 2), render_only=True, keep_stale=False)
    return ladder.table_ladder(ctx), open(os.path.join(root, "ladder.md")).read()


def test_ladder_trend_has_a_sign_when_the_ratio_moves_with_compute(tmp_path):
    root = str(tmp_path)
    _build(root, [-0.10, 0.0, 0.10])
    data, md = _table(root)
    a = data["claims"]["a"]
    assert [p["verdict"] for p in a["points"]] == ["not reproduced", "inconclusive at this scale", "reproduced"]
    tr = a["trend"]
    assert tr["points"] == 3 and tr["n"] == 9 and tr["sign"] == "+" and tr["lo"] > 0
    # slope per decade of compute: the points' compute from 6 x params x tokens
    flops = [p["flops"] for p in data["points"]]
    exp = cache.experiment
    assert flops == pytest.approx([6 * 100_000 * 2 ** i * exp.ladder_tokens(z) for i, z in enumerate(exp.LADDER)])
    x = [math.log10(f) for f in flops]
    assert tr["slope"] == pytest.approx(0.2 / (x[2] - x[0]), rel=0.2)
    assert "sign +" in md and "[95% t CI" in md
    # the ratio crosses 1 at the middle point (ln ratios −0.1, 0, +0.1): inside the trained range, with its interval
    assert tr["cross"]["lo"] < x[1] < tr["cross"]["hi"] and tr["cross"]["x"] == pytest.approx(x[1], abs=0.05)
    assert f"reaches ratio 1 at {10 ** tr['cross']['x']:.1e} FLOPs" in md and "inside the trained range" in md
    # (b): Interdomain / Softmax = 1.005 in every seed at every point: within the 2% margin everywhere, no trend
    b = data["claims"]["b"]
    assert [p["verdict"] for p in b["points"]] == ["reproduced"] * 3
    assert b["trend"]["slope"] == pytest.approx(0.0, abs=1e-9)
    assert json.load(open(os.path.join(root, "ladder.json")))["claims"]["a"]["trend"]["sign"] == "+"


def test_ladder_trend_undetermined_on_noise_and_absent_below_three_points(tmp_path):
    root = str(tmp_path / "noise")
    _build(root, [0.0, 0.0, 0.0], noise=(0.05, -0.06, 0.02))
    data, md = _table(root)
    assert data["claims"]["a"]["trend"]["sign"] == "undetermined"
    assert {p["verdict"] for p in data["claims"]["a"]["points"]} == {"inconclusive at this scale"}
    root2 = str(tmp_path / "two")
    exp = cache.experiment
    _build(root2, [-0.1, 0.1], sizes=exp.LADDER[:2])
    data2, md2 = _table(root2)
    assert data2["claims"]["a"]["trend"]["sign"] is None and "it needs 3" in md2
    assert any(m.startswith(exp.LADDER[2] + "/") for m in data2["missing"])


def test_trend_on_constructed_points():
    up = verdicts.trend([(15, [0.01, 0.02, 0.0]), (16, [0.05, 0.06, 0.04]), (17, [0.1, 0.11, 0.09])])
    assert up["slope"] == pytest.approx(0.045) and up["sign"] == "+"
    down = verdicts.trend([(15, [0.1, 0.11]), (16, [0.05, 0.06]), (17, [0.0, 0.01])])
    assert down["sign"] == "−"
    assert verdicts.trend([(15, [0.1, 0.2]), (16, [0.3, 0.4])])["sign"] is None


def test_ladder_figure_waits_for_paired_seeds_and_draws_the_claims_that_have_them(tmp_path):
    """The first runs of a ladder have no paired seeds for some claim (a mixer's seed 0 still training): the figure
    must not crash on an empty log axis (it did, through matplotlib) — no figure at all until some claim has data,
    then an empty panel for the claims still without."""
    pytest.importorskip("matplotlib")
    nan = {"softmax": [None], "interdomain": [None], "s4d_only": [None]}
    points = [{"size": "d64", "flops": 1e12, "ppl": nan, "judged": True},
              {"size": "d96", "flops": 3e12, "ppl": dict(nan), "judged": True}]
    assert ladder._plot(str(tmp_path / "none.png"), points, ladder.claim_stats(points)) is None
    assert not (tmp_path / "none.png").exists()
    points[0]["ppl"] = {"softmax": [20.0], "interdomain": [19.0], "s4d_only": [None]}
    stats = ladder.claim_stats(points)
    assert any(pp["interval"]["n"] for st in stats.values() for pp in st["points"])
    assert not all(pp["interval"]["n"] for st in stats.values() for pp in st["points"])
    out = ladder._plot(str(tmp_path / "some.png"), points, stats)
    assert out == str(tmp_path / "some.png") and os.path.getsize(out) > 1000
