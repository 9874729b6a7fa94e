"""The pilot (idattn.studies.repro_pilot, issue 32) on constructed run records (no training): per-seed ln ppl, the
sd of the paired log-ratio and of ln R, the loss-curve maxima from the marker, the rule's predicted half-widths;
and the run machinery it relies on: a run's recorded recipe, its loss curve, and the record written after every
run (training replaced by a stub)."""
from __future__ import annotations

import json
import math
import os

import pytest

from idattn.rundir.schema import write_result
from idattn.studies import ladder, repro_pilot, repro_pilot as pilot, repro_runs as runs, runcache as cache, tables
from idattn.studies.repro_verdicts import WORDS, t975


def _fake(ctx, mixer, seed, ppl1, ppl4, curve):
    dt = ctx.exp.PRIMARY_DT
    wd = ctx.lm_dir(mixer, dt, seed)
    L = ctx.train_len()
    steps = int(ctx.exp.SIZES[ctx.size]["num_steps"])
    cache.write_marker(wd, {"status": "done", "src": cache.source_hash(), "steps": steps, "params": 1000,
                           "mixer": mixer, "seed": seed, "size": ctx.size, "train_s": 30.0,
                           "recipe": runs.size_recipe(ctx), "loss_curve": curve})
    for Lx, v in ((L, ppl1), (4 * L, ppl4)):
        write_result(wd, "extrapolation", steps, {f"ppl@{Lx}": v}, run={"mixer": mixer, "seed": seed},
                     protocol=runs.ppl_protocol(ctx, Lx))


def _build(root, pair_noise):
    """Every pilot cell: seed s has its own difficulty (Softmax ppl 40·(1 + 0.3 s)); Interdomain is 0.98x it times
    exp(pair_noise[cell][s]); R = 1.5 for Softmax and 1.01 for Interdomain times a small per-seed factor."""
    top = cache.Ctx(root, "small", (0, 1, 2), render_only=True, keep_stale=False)
    for i, size in enumerate(top.exp.PILOT_SIZES):
        ctx = top.for_size(size)
        w = int(ctx.exp.SIZES[size]["warmup_steps"])
        for s in (0, 1, 2):
            base = 40.0 * (1 + 0.3 * s)
            spike = [[10, 6.9], [w + 10, 5.0], [w + 20, 5.8 + s], [w + 30, 4.5]]  # a rise of 0.8 + s after warmup
            _fake(ctx, "softmax", s, base, base * 1.5 * (1 + 0.01 * s), spike)
            inter = base * 0.98 * math.exp(pair_noise[i][s])
            _fake(ctx, "interdomain", s, inter, inter * 1.01, spike)
    return top


def test_pilot_table_measures_the_paired_sd_and_applies_the_rule(tmp_path):
    exp = cache.experiment
    n = len(exp.PILOT_SIZES)
    assert n >= 2 and all(z.startswith("pilot-") for z in exp.PILOT_SIZES)
    tight, loose = (0.001, -0.002, 0.001), (0.2, -0.25, 0.1)
    top = _build(str(tmp_path), [tight] + [loose] * (n - 1))
    data = repro_pilot.table_pilot(top)
    assert data["missing"] == []
    c0, c1 = data["cells"][0], data["cells"][1]
    # the per-seed log-ratio: the seed's own difficulty cancels in the pair
    assert c0["pair_log_ratio"] == pytest.approx([math.log(0.98) + x for x in tight])
    assert c0["sd"]["pair"] == pytest.approx(pilot.sd(tight))
    assert c1["sd"]["pair"] == pytest.approx(pilot.sd(loose))
    # ln ppl of one mixer varies with the seed's difficulty: its sd is far larger than the pair's
    assert c0["sd"]["ln_ppl_softmax"] > 10 * c0["sd"]["pair"]
    rule = {(r["size"], r["claim"]): r for r in data["rule"]}
    r0 = rule[(c0["size"], "a")]
    assert r0["half_width"][3] == pytest.approx(t975(2) * pilot.sd(tight) / math.sqrt(3))
    assert r0["half_width"][5] == pytest.approx(t975(4) * pilot.sd(tight) / math.sqrt(5))
    T = pilot.targets()
    assert r0["target"] == pytest.approx(math.log(19.22 / 16.48) / 2)
    assert r0["meets"] == {3: True, 5: True}
    assert rule[(c1["size"], "a")]["meets"] == {3: False, 5: False}
    # (c): ln R_Softmax − ln R_Interdomain per seed and the sd of ln R_Interdomain (0 here: R 1.01 in every seed)
    assert c0["c_gap"] == pytest.approx([math.log(1.5 * (1 + 0.01 * s) / 1.01) for s in (0, 1, 2)])
    assert c0["sd"]["r_inter"] == pytest.approx(0.0, abs=1e-9)
    assert T["c_flat"]["effect"] == pytest.approx(math.log(1.05) - math.log(14.26 / 14.36))
    # loss-curve maxima after warmup and the largest rise, per seed, from the markers
    curves = c0["per"]["interdomain"]["curve"]
    assert [c["max_after_warmup"] for c in curves] == pytest.approx([5.8, 6.8, 7.8])
    assert [c["max_rise"] for c in curves] == pytest.approx([0.8, 1.8, 2.8])
    md = open(os.path.join(str(tmp_path), "pilot.md")).read()
    assert "5.80 / 6.80 / 7.80" in md and f"{c0['sd']['pair']:.4f}" in md
    assert not any(w in md for w in WORDS)  # the pilot measures spread; it judges no claim
    assert json.load(open(os.path.join(str(tmp_path), "pilot.json")))["cells"][0]["size"] == exp.PILOT_SIZES[0]


def test_curve_stats_find_a_late_spike():
    c = pilot.curve_stats([[10, 7.0], [20, 5.0], [30, 4.0], [40, 6.5], [50, 3.9]], warmup=15)
    assert c["max_after_warmup"] == 6.5 and c["max_rise"] == pytest.approx(2.5) and c["last"] == 3.9
    assert pilot.curve_stats([], warmup=0)["max_rise"] is None


def test_pilot_not_at_toy_size(tmp_path):
    ctx = cache.Ctx(str(tmp_path), "toy", (0,), render_only=True, keep_stale=False)
    data = repro_pilot.table_pilot(ctx)
    assert data["cells"] == [] and "no pilot" in open(os.path.join(str(tmp_path), "pilot-toy.md")).read()
    assert "pilot" not in tables.order(toy=True)


def test_lm_run_records_recipe_and_curve_is_retrained_on_another_recipe_and_archived_at_once(tmp_path,
                                                                                             monkeypatch):
    import idattn.train as train
    root = str(tmp_path / "root")
    rec_path = str(tmp_path / "record.json")
    calls = []

    def fake_run(cfg, wd):
        calls.append(wd)
        with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
            for s, v in ((10, 6.0), (20, 5.5)):
                f.write(json.dumps({"step": s, "loss": v}) + "\n")
        return {"status": "done", "num_params": 123, "loss": 5.5}

    monkeypatch.setattr(train, "run", fake_run)
    exp = cache.experiment
    ctx = cache.Ctx(root, exp.PILOT_SIZES[0], (0,), render_only=False, keep_stale=False)
    ctx.archive = rec_path
    rec = runs.lm_run(ctx, "softmax", exp.PRIMARY_DT, 0)
    assert rec["status"] == "done" and rec["recipe"] == runs.size_recipe(ctx) and len(calls) == 1
    assert rec["loss_curve"] == [[10, 6.0], [20, 5.5]]
    # recorded at once (not only at the end of the invocation)
    held = json.load(open(rec_path))["runs"]
    assert any(k.endswith("softmax-scaled-s0") for k in held)
    # the same recipe: reused; another recipe: moved aside and trained again
    assert runs.lm_run(ctx, "softmax", exp.PRIMARY_DT, 0)["status"] == "done" and len(calls) == 1
    wd = ctx.lm_dir("softmax", exp.PRIMARY_DT, 0)
    cache.write_marker(wd, dict(cache.read_marker(wd), recipe=dict(runs.size_recipe(ctx), num_steps=1)))
    runs.lm_run(ctx, "softmax", exp.PRIMARY_DT, 0)
    assert len(calls) == 2 and any(".stale-" in d for d in os.listdir(os.path.dirname(wd)))
    # a marker from before recipes were recorded is judged by its model code alone, as before
    wd2 = ctx.lm_dir("interdomain", exp.PRIMARY_DT, 0)
    cache.write_marker(wd2, {"status": "done", "src": cache.source_hash(), "steps": 1, "params": 1})
    assert runs.lm_run(ctx, "interdomain", exp.PRIMARY_DT, 0)["params"] == 1 and len(calls) == 2


def test_pilot_cells_are_the_small_model_at_batch_16():
    exp = cache.experiment
    for size, (steps, lr) in zip(exp.PILOT_SIZES, exp.PILOT["cells"]):
        z = exp.SIZES[size]
        assert z["model"] == exp.SIZES["small"]["model"] and z["batch_size"] == 16 and z["num_steps"] == steps
        c = exp.get_config(f"interdomain,{size},paper,1")
        assert c.train.peak_lr == lr and c.train.warmup_steps == round(0.1 * steps) and c.train.log_every == 10
        assert c.seed == 43 and c.data.shuffle_seed == 1
    # `small` keeps its recipe (the previous study's runs stay valid)
    c = exp.get_config("interdomain,small,paper,0")
    assert (c.train.peak_lr, c.train.batch_size, c.train.num_steps, c.train.log_every) == (3e-3, 8, 200, 50)


def test_recipe_cost_is_steps_times_measured_step_time_and_spans_the_ladder():
    exp = cache.experiment
    rows = pilot.recipe_rows(exp)
    assert [r["size"] for r in rows] == list(exp.CLIMB) and len(rows) >= 4
    r0 = rows[0]
    z = exp.SIZES[r0["size"]]
    s, measured = pilot.step_seconds(exp, z["model"]["d_model"], z["model"]["num_layers"], "interdomain")
    assert measured and r0["run_s"]["interdomain"] == pytest.approx(z["num_steps"] * s + exp.RUN_OVERHEAD_S)
    assert r0["cost_s"] == pytest.approx(len(exp.SEEDS[r0["size"]]) * sum(r0["run_s"].values()))
    # climbs: compute grows point by point, upward from `small` (8.8e11 FLOPs), over >= 1.5 decades
    flops = [r["flops"] for r in rows]
    assert flops == sorted(flops) and flops[0] > 6 * 356_944 * 200 * 8 * 256
    assert math.log10(flops[-1] / flops[0]) >= 1.5
    # >= 3 seeds everywhere, 5 at the top two
    assert [r["seeds"] for r in rows][-2:] == [5, 5] and min(r["seeds"] for r in rows) >= 3
    # a mixer not measured at a size: Interdomain's time there times the mixer's ratio at the nearest measured size
    fake = type("E", (), {"STEP_S": {"64x4": {"interdomain": 1.0, "softmax": 0.5}, "96x4": {"interdomain": 3.0}}})
    assert pilot.step_seconds(fake, 96, 4, "softmax") == (pytest.approx(1.5), False)


def test_climb_trains_three_seeds_everywhere_before_the_top_points_fourth_and_reads_per_point_seeds(tmp_path):
    exp = cache.experiment
    order = ladder.climb_order(exp, {0, 1, 2, 3, 4})
    k = 3 * len(exp.CLIMB)
    assert order[:k] == [(z, s) for z in exp.CLIMB for s in (0, 1, 2)]
    assert order[k:] == [(z, s) for z in exp.CLIMB if len(exp.SEEDS[z]) == 5 for s in (3, 4)]
    # the table on constructed records: a seed a point does not have is not "missing"
    def _fake_run(ctx, mixer, seed, ppl, params):
        _fake(ctx, mixer, seed, ppl, ppl, [])

    top = cache.Ctx(str(tmp_path), "small", (0, 1, 2), render_only=True, keep_stale=False)
    for i, z in enumerate(exp.CLIMB):
        c = top.for_size(z)
        for s in exp.SEEDS[z]:
            for m, f in (("softmax", 1.0), ("interdomain", 0.99), ("s4d_only", 1.2 + 0.01 * s)):
                _fake_run(c, m, s, 50.0 / (1 + i) * (1 + 0.2 * s) * f, params=100_000 * 2 ** i)
    data = ladder.table_climb(top)
    assert data["missing"] == [] and data["table"] == "climb"
    assert [p["interval"]["n"] for p in data["claims"]["a"]["points"]] == [len(exp.SEEDS[z]) for z in exp.CLIMB]
    md = open(os.path.join(str(tmp_path), "climb.md")).read()
    assert "CLIMB" in md and "Not available yet" not in md
    assert not os.path.exists(os.path.join(str(tmp_path), "ladder-climb-tmp.md"))
    # one top-point run removed: named missing
    import shutil
    shutil.rmtree(top.for_size(exp.CLIMB[-1]).lm_dir("softmax", exp.PRIMARY_DT, 4))
    data = ladder.table_climb(top)
    assert data["missing"] == [f"{exp.CLIMB[-1]}/softmax-scaled-s4"]
