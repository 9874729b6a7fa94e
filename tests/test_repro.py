"""`python -m idattn.repro`: a toy-size table trained by the real trainer, its numbers against the run files and
the paper's numbers against idattn.eval.paper_numbers; run reuse; the verdict rules on constructed inputs."""
from __future__ import annotations

import glob
import json
import math
import os
import re

import pytest

from idattn.studies import claims, code_hash, repro, repro_recall, repro_runs as runs, repro_verdicts as verdicts
from idattn.studies import runcache as cache
from idattn.studies.runcache import Table
from idattn.studies.tables import TABLES
from idattn.eval import paper_numbers as P


def _md_rows(md: str) -> dict[str, list[str]]:
    """Markdown table rows of the first table, by their first cell."""
    out = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("| mixer") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out.setdefault(cells[0], cells)
    return out


def _run_ppl(root, extra=()):
    rc = repro.main(["ppl", "--toy", "--seeds=0", f"--root={root}", "--no_compile_cache", *extra])
    assert rc == 0
    with open(os.path.join(root, "ppl-toy.json")) as f:
        data = json.load(f)
    with open(os.path.join(root, "ppl-toy.md")) as f:
        md = f.read()
    return data, md


@pytest.mark.slow  # ~50 s: 6 toy runs trained and evaluated (the verdict rules are tested without training)
def test_ppl_table_toy_numbers_match_run_files_and_paper(tmp_path):
    root = str(tmp_path)
    data, md = _run_ppl(root, ["--only=interdomain", "--train_dt=paper"])  # one run: the smoke stays short
    exp = cache.experiment
    assert data["primary_dt"] == exp.PRIMARY_DT
    rows = {(r["mixer"], r["dt"]): r for r in data["rows"]}
    md_rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines()
               if line.startswith("| ") and not line.startswith("| mixer")]
    # 3 mixers x the Δ ranges of PPL_DTS + the primary range's variants (PPL_VARIANTS: S4D-only, mode sum)
    assert len(md_rows) == len(data["rows"]) == 3 * len(exp.PPL_DTS) + len(exp.PPL_VARIANTS)
    assert {r["dt"] for r in data["rows"]} == set(exp.PPL_DTS)
    marker = {}
    for dt in ("paper",):
        # the trained runs: the table value is the value in the run's own result file, written by the evaluation
        wd = os.path.join(root, "runs", "toy", "lm", f"interdomain-{dt}-s0")
        files = glob.glob(os.path.join(wd, "eval", "extrapolation-*-c32-*.json"))
        assert len(files) == 1
        with open(files[0]) as f:
            rec = json.load(f)
        v = rec["metrics"]["ppl@32"]
        assert rec["protocol"]["tokens"] == 7 * 128 * 2 and rec["step"] == 4
        assert 1.0 < v < 600.0  # 512-piece vocabulary after 4 steps: near uniform, never far above it
        assert rows[("interdomain", dt)]["ppl_per_seed"] == [v]
        cfg = exp.get_config(f"interdomain,toy,{dt},0")
        line = next(r for r in md_rows if r[0] == "Interdomain" and r[1].startswith(dt))
        assert line[1] == f"{dt} [{cfg.model.dt_min:g}, {cfg.model.dt_max:g}]"
        assert line[3] == f"{v:.2f}" and line[4] == f"{v:.2f}"
        # the trainer really ran: 4 steps checkpointed, parameters counted by the trainer in the marker
        marker[dt] = json.load(open(os.path.join(wd, cache.MARKER)))
        assert marker[dt]["status"] == "done" and marker[dt]["steps"] == 4 and marker[dt]["params"] > 0
        assert marker[dt]["dt_range"] == [cfg.model.dt_min, cfg.model.dt_max]
        assert os.path.isdir(os.path.join(wd, "checkpoints", "4"))
    # the runs not trained in this invocation are reported missing, not invented
    assert rows[("softmax", "paper")]["ppl_per_seed"] == [None] and "softmax-scaled-s0" in data["missing"]
    assert rows[("s4d_only", "paper")]["ppl_per_seed"] == [None] and "s4d_only-paper-s0" in data["missing"]
    assert not os.path.exists(os.path.join(root, "runs", "toy", "lm", "s4d_only-paper-s0"))
    assert "Not available yet" in md
    # the paper column is idattn.eval.paper_numbers, in the JSON and in the Markdown
    for line in md_rows:
        m = {v: k for k, v in claims.LABEL.items()}[line[0]].partition("+")[0]  # a variant: its mixer's paper row
        assert line[8] == f"{P.VAL_PPL['125m'][m]:.2f}"
        assert line[9] == f"{P.VAL_PPL['125m'][m] / P.VAL_PPL['125m']['softmax']:.3f}"
    for r in data["rows"]:
        assert r["paper_ppl_125m"] == P.VAL_PPL["125m"][r["mixer"].partition("+")[0]]
    assert rows[("s4d_only+sum", "paper")]["ppl_per_seed"] == [None] and "s4d_only-sum-paper-s0" in data["missing"]
    # toy size: numbers (and intervals) only, never a verdict word, in the JSON or the Markdown
    assert {v["verdict"] for v in data["verdicts"].values()} == {verdicts.NO_VERDICT}
    assert not re.search(r"\breproduced\b|inconclusive|vacuous", md), md
    assert "no claim is judged at this size" in md
    assert md.startswith("## Fig. 2 (its 125M point): validation perplexity") and data["paper_table"] == "Fig. 2"

    # rerun: the finished runs are reused (not retrained, not re-evaluated)
    mtime = os.path.getmtime(files[0])
    data2, _ = _run_ppl(root, ["--only=interdomain", "--train_dt=paper"])
    assert json.load(open(os.path.join(wd, cache.MARKER)))["train_s"] == marker["paper"]["train_s"]
    assert os.path.getmtime(files[0]) == mtime
    assert [r["ppl_per_seed"] for r in data2["rows"]] == [r["ppl_per_seed"] for r in data["rows"]]


def test_changed_code_reuses_only_runs_that_still_compute_the_same(tmp_path):
    wd = str(tmp_path / "run")
    cache.write_marker(wd, {"src": "old", "status": "done"})
    assert cache.check_reuse(wd, "old", False)["status"] == "done"
    assert cache.check_reuse(wd, "new", True)["stale"] is True and os.path.isdir(wd)
    # same function under the new code: reused and re-stamped
    assert cache.check_reuse(wd, "new", False, verify=lambda: (True, "same"))["src"] == "new"
    assert json.load(open(os.path.join(wd, cache.MARKER)))["src"] == "new"
    # another function: moved aside, nothing reused
    assert cache.check_reuse(wd, "newer", False, verify=lambda: (False, "ppl differs")) == {}
    assert not os.path.exists(wd) and os.path.isdir(wd + ".stale-new")
    # an unfinished run under other code is never resumed
    cache.write_marker(wd, {"src": "old", "status": "training"})
    assert cache.check_reuse(wd, "new", False, verify=lambda: (True, "same")) == {}
    assert os.path.isdir(wd + ".stale-old")


def test_cube_axis_effects_are_main_effects():
    # ln ppl = 3 + 0.2·[linear] + 0.03·[generic] − 0.01·[norope]: each main effect is its coefficient
    from idattn.models.spec import cube_cells
    vals = {}
    for c in cube_cells():
        i, r, p = c.split("-")
        vals[c] = math.exp(3 + 0.2 * (r == "linear") + 0.03 * (i == "generic") - 0.01 * (p == "norope"))
    ax = verdicts.cube_axes(vals)
    assert ax["readout"] == pytest.approx(0.2) and ax["input"] == pytest.approx(0.03)
    assert ax["rope"] == pytest.approx(-0.01)
    jitter = [dict(ax, readout=ax["readout"] + e, rope=ax["rope"] - e / 10) for e in (0.0, 0.01, -0.01)]
    assert verdicts.verdict_d(jitter).verdict == "reproduced"
    assert verdicts.verdict_d([ax, ax]).verdict == "inconclusive at this scale"  # two seeds never decide
    assert verdicts.verdict_d([{"readout": 0.01 + e, "input": 0.2, "rope": 0.0} for e in (0, .001, .002)]
                              ).verdict == "not reproduced"
    vals.pop("generic-query-norope")
    assert verdicts.cube_axes(vals)["readout"] is None
    # without the two unreported corners the verdict falls back to the paper's pairs, which see the same effects
    vals.pop("dualkv-linear-norope")
    pa = verdicts.pair_axes(vals)
    assert pa["readout"] == pytest.approx([0.2, 0.2]) and pa["rope"] == pytest.approx([-0.01, -0.01])
    ax2 = verdicts.axes_for_verdict(verdicts.cube_axes(vals), pa)
    assert ax2["basis"] == "the paper's six cells" and ax2["input"] == pytest.approx(0.03)
    assert verdicts.verdict_d([ax2] * 3).parts[0]["interval"]["mean"] == pytest.approx(0.2)
    # the paper's own pairs: readout +22% / +17%, RoPE under 3%
    pax = verdicts.paper_cube_axes()
    assert pax["readout"][0] == pytest.approx(math.log(20.18 / 16.48))
    assert max(abs(x) for x in pax["rope"]) < min(pax["readout"]) / 4


def test_t_interval_matches_the_textbook_formula_and_scipy():
    """The interval that decides every verdict: closed forms of t(0.975, df) for df 1 and 2, a published table
    value, scipy.stats.t.interval for df 1..500."""
    import numpy as np
    from scipy import stats as st
    iv = verdicts.t_interval([1.0, 2.0, 3.0])
    assert (iv["n"], iv["mean"], iv["sd"]) == (3, 2.0, 1.0)
    assert iv["lo"] == pytest.approx(2 - 0.95 / math.sqrt(2 * 0.975 * 0.025) / math.sqrt(3), rel=1e-12)
    assert verdicts.t975(1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-12)  # Cauchy
    assert verdicts.t975(2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), rel=1e-12)  # (2p-1)/sqrt(2p(1-p))
    assert verdicts.t975(10) == pytest.approx(2.228, abs=5e-4)
    rng = np.random.default_rng(0)
    for n in list(range(2, 40)) + [64, 101, 250, 501]:
        v = rng.normal(0.1, 0.3, n)
        iv = verdicts.t_interval(list(v))
        lo, hi = st.t.interval(0.95, n - 1, loc=v.mean(), scale=st.sem(v))
        assert (iv["lo"], iv["hi"]) == (pytest.approx(lo, rel=1e-10, abs=1e-12), pytest.approx(hi, rel=1e-10))
    assert verdicts.t_interval([None, 1.0])["lo"] is None
    with pytest.raises(ValueError, match="at least 2 values"):
        verdicts.t975(0)


def test_trend_equals_scipy_linregress():
    """The ladder's trend (slope of ln ratio per decade, its 95% interval) against scipy.stats.linregress, with
    seeds repeated at each compute point as the ladder has them."""
    import numpy as np
    from scipy import stats as st
    rng = np.random.default_rng(1)
    for k, seeds, slope in [(3, 2, 0.05), (4, 3, -0.02), (6, 5, 0.0)]:
        xs = np.linspace(11.0, 12.5, k)
        pts = [(float(x), list(0.3 + slope * x + rng.normal(0, 0.02, seeds))) for x in xs]
        tr = verdicts.trend(pts)
        X = np.repeat(xs, seeds)
        Y = np.concatenate([p[1] for p in pts])
        ref = st.linregress(X, Y)
        h = st.t.ppf(0.975, len(X) - 2) * ref.stderr
        assert tr["slope"] == pytest.approx(ref.slope, rel=1e-9, abs=1e-12)
        assert tr["intercept"] == pytest.approx(ref.intercept, rel=1e-9, abs=1e-12)
        assert (tr["lo"], tr["hi"]) == (pytest.approx(ref.slope - h, rel=1e-9, abs=1e-12),
                                        pytest.approx(ref.slope + h, rel=1e-9, abs=1e-12))
        assert tr["sign"] == ("+" if ref.slope - h > 0 else "−" if ref.slope + h < 0 else "undetermined")


def test_trend_crossing_is_where_the_lines_band_contains_zero():
    """Where a decided trend crosses 0 and its 95% interval (Fieller) against a dense grid of the definition: the x
    whose fitted mean's 95% t band contains 0. No crossing while the slope's interval contains 0."""
    import numpy as np
    from scipy import stats as st
    rng = np.random.default_rng(3)
    xs = [12.5] * 3 + [13.0] * 3 + [13.5] * 3 + [14.0]
    ys = [-0.08 + 0.04 * (x - 12.5) + rng.normal(0, 0.005) for x in xs]
    tr = verdicts.trend([(x, [y]) for x, y in zip(xs, ys)])
    X, Y = np.array(xs), np.array(ys)
    ref = st.linregress(X, Y)
    n, mx = len(X), X.mean()
    s2 = ((Y - ref.intercept - ref.slope * X) ** 2).sum() / (n - 2)
    g = np.linspace(10, 20, 400001)
    band = st.t.ppf(0.975, n - 2) * np.sqrt(s2 * (1 / n + (g - mx) ** 2 / ((X - mx) ** 2).sum()))
    inside = g[np.abs(ref.intercept + ref.slope * g) <= band]
    cr = tr["cross"]
    assert cr["x"] == pytest.approx(-ref.intercept / ref.slope, rel=1e-9)
    assert cr["lo"] == pytest.approx(inside.min(), abs=1e-4) and cr["hi"] == pytest.approx(inside.max(), abs=1e-4)
    assert cr["lo"] < cr["x"] < cr["hi"]
    flat = verdicts.trend([(x, [0.01 * (-1) ** i]) for i, x in enumerate(xs)])
    assert flat["sign"] == "undetermined" and "cross" not in flat


def test_verdict_clear_effect_gives_a_verdict_noise_gives_inconclusive_with_interval():
    # a clear paired effect: every seed's S4D-only / Interdomain ratio ~1.16, while the seeds' own difficulty moves
    # perplexity by 30% (the unpaired ranges overlap; the pairing removes the seed)
    inter, s4d = [16.4, 21.0, 18.2], [19.1, 24.3, 21.3]
    v = verdicts.verdict_a(inter, s4d)
    assert v.verdict == "reproduced" and "95% t CI" in v.why and v.parts[0]["interval"]["lo"] > 0
    assert verdicts.verdict_a(s4d, inter).verdict == "not reproduced"  # the same effect the other way
    # noise: ratios on both sides of 1 -> inconclusive at this scale, the interval printed
    v = verdicts.verdict_a([16.4, 21.0, 18.2], [17.9, 19.5, 19.0])
    assert v.verdict == "inconclusive at this scale"
    lo, hi = v.parts[0]["interval"]["lo"], v.parts[0]["interval"]["hi"]
    assert lo < 0 < hi and f"[95% t CI {math.exp(lo):.3f}, {math.exp(hi):.3f}] over 3 seeds" in v.why
    # two seeds never decide, however clear (the rule needs 3), and the interval is still shown
    v = verdicts.verdict_a(inter[:2], s4d[:2])
    assert v.verdict == "inconclusive at this scale" and "over 2 seeds" in v.why and "needs 3" in v.why
    # pairs are by seed: a missing run drops its seed, never shifts the others
    assert verdicts.verdict_a([16.4, None, 21.0, 18.2], [19.1, 30.0, 24.3, 21.3]).parts[0]["interval"]["n"] == 3
    # (b): within 2% counts as matching; clearly worse -> not reproduced; straddling 1.02 -> inconclusive
    soft = [16.6, 20.0, 18.0]
    assert verdicts.verdict_b([16.6 * 1.005, 20.0 * 1.006, 18.0 * 1.004], soft).verdict == "reproduced"
    assert verdicts.verdict_b([16.6 * 1.10, 20.0 * 1.12, 18.0 * 1.09], soft).verdict == "not reproduced"
    assert verdicts.verdict_b([16.6 * 0.95, 20.0 * 1.10, 18.0 * 1.02], soft).verdict == "inconclusive at this scale"
    # (e): accuracy differences
    assert verdicts.verdict_e([1.0, 1.0, 0.99], [0.9, 0.95, 0.92], [0.1, 0.2, 0.15]).verdict == "reproduced"
    assert verdicts.verdict_e([0.5, 0.6, 0.55], [0.9, 0.95, 0.92], [0.1, 0.2, 0.15]).verdict == "not reproduced"
    assert verdicts.verdict_e([1.0, 1.0, 1.0], [0.3, 0.2, 0.1], [0.2, 0.25, 0.15]).verdict == \
        "inconclusive at this scale"
    # toy: the same clear inputs, no verdict word
    v = verdicts.verdict_a(inter, s4d, judged=False)
    assert v.verdict == verdicts.NO_VERDICT and verdicts.verdict_md(v) == verdicts.NO_VERDICT
    assert not re.search(r"\breproduced\b|inconclusive", verdicts.verdict_md(v))
    assert verdicts.verdict_md(verdicts.verdict_a(inter, s4d)) == "**reproduced**"


def test_length_claim_is_vacuous_unless_softmax_uses_its_context():
    inter, soft = [1.00, 1.01, 0.99], [1.40, 1.30, 1.50]  # R = ppl@4x / ppl@1x per seed
    assert verdicts.verdict_c(inter, soft, None).verdict == "vacuous at this size"
    assert verdicts.verdict_c(inter, soft, [0.99, 1.01, 1.0]).verdict == "vacuous at this size"  # not shown
    uses = [0.80, 0.85, 0.82]  # Softmax's last / first bucket perplexity inside the training length
    assert verdicts.verdict_c(inter, soft, uses).verdict == "reproduced"
    assert verdicts.verdict_c(inter, [1.0, 1.01, 1.0], uses).verdict == "inconclusive at this scale"
    assert verdicts.verdict_c(inter, [0.90, 0.92, 0.91], uses).verdict == "not reproduced"
    assert verdicts.verdict_c([1.3, 1.35, 1.32], [1.9, 1.95, 1.92], uses).verdict == "not reproduced"  # not flat


def test_table_names_are_the_ones_of_idattn_results():
    """idattn.results is canonical: each repro table carries the paper table's name as results.py's heading for
    the same content (Fig. 2 validation perplexity, Table 2 length extrapolation, Table 4 cube, Table 9 recall)."""
    import inspect

    from idattn.studies import results
    heads = dict(re.findall(r'"### ((?:Table|Fig\.) \d+): ([^("]+)', inspect.getsource(results)))
    topic = {"ppl": "validation perplexity", "length": "length extrapolation", "cube": "mechanism cube",
             "recall": "recall"}
    for table in (t for t in TABLES.values() if t.paper):
        name = table.paper
        assert topic[table.name] in heads[name], (name, heads[name])
        title = table.title.format(L=256, dt="paper")
        assert title.startswith(name + " ") or title.startswith(name + ":"), title
        assert topic[table.name] in title, title
    assert {t.name for t in TABLES.values() if t.paper} == set(topic)
    assert not any("Tables 2 / 8" in t.title or "Table 2 / Fig. 2" in t.title for t in TABLES.values())


def test_toy_help_states_a_measured_duration_in_minutes(capsys):
    with pytest.raises(SystemExit):
        repro.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    toy = out[out.index("--toy the smoke-test size"):][:400]
    assert re.search(r"\d+(\.\d+)? min", toy) and "seconds;" not in toy, toy


def test_recipe_has_at_least_three_seeds():
    exp = cache.experiment
    assert all(len(v) >= verdicts.MIN_SEEDS for v in exp.SEEDS.values())


def test_scaled_dt_keeps_the_papers_dt_times_context():
    exp = cache.experiment
    c = exp.get_config("interdomain,small,scaled,1")
    assert c.model.dt_min * c.data.seq_len == pytest.approx(1e-3 * 4096)
    assert c.model.dt_max * c.data.seq_len == pytest.approx(1e-1 * 4096)
    p = exp.get_config("s4d_only,small,paper,0")
    assert (p.model.dt_min, p.model.dt_max) == (1e-3, 1e-1)
    assert (c.seed, c.data.shuffle_seed, p.seed) == (43, 1, 42)
    assert exp.PRIMARY_DT in ("paper", "scaled")
    # one recipe for every mixer: the configs differ only in the mixer switches
    a, b = exp.get_config("softmax,small,scaled,0").to_dict(), exp.get_config("s4d_only,small,scaled,0").to_dict()
    diff = {k for k in a["model"] if a["model"][k] != b["model"][k]}
    assert diff <= {"mixer", "input", "readout", "rope"} and a["train"] == b["train"] and a["data"] == b["data"]
    # the mode-sum variant differs from S4D-only in that one switch only
    v = exp.get_config("s4d_only+sum,small,paper,0").to_dict()
    assert {k for k in v["model"] if v["model"][k] != p.to_dict()["model"][k]} == {"linear_contraction"}
    assert v["model"]["linear_contraction"] == "sum" and p.model.linear_contraction == "mean"
    with pytest.raises(ValueError, match="expected '<mixer>,<size>,<dt>,<seed>'"):
        exp.get_config("interdomain,small")
    with pytest.raises(ValueError, match="suffix '\\+max'; expected none, '\\+sum'"):
        exp.get_config("s4d_only+max,small,paper,0")


def test_refusals_are_one_line(capsys):
    assert repro.main(["ppl", "--toy", "--only=nonsense", "--root=/nonexistent-never-written"]) == 1
    err = capsys.readouterr().err
    # the mixer list is the model's (idattn.models.spec; it grows, e.g. swa): name the flag and the known mixers
    assert "--only" in err and "expected softmax" in err and "interdomain, s4d_only" in err
    assert not os.path.exists("/nonexistent-never-written")
    assert re.search(r"idattn.repro: ", err)


def test_mqar_run_is_retrained_when_its_recipe_changes(tmp_path, monkeypatch):
    """An MQAR run records its recipe; a finished run with another recipe is moved aside, the current one reused."""
    from idattn.eval import recall
    calls = []

    def fake_train(model_cfg, **kw):
        calls.append(kw)
        return {"acc": 0.25, "grid": {}, "loss": 1.0, "steps": kw["steps"], "params": {"w": [0.0]}}

    monkeypatch.setattr(recall, "train_mqar", fake_train)
    ctx = cache.Ctx(str(tmp_path), "toy", [0], render_only=False, keep_stale=False)
    wd = ctx.mqar_dir("softmax", 0)
    recipe = ctx.exp.get_mqar_config("softmax", "toy").mqar.to_dict()
    cache.write_marker(wd, {"src": cache.source_hash(), "status": "done", "recipe": dict(recipe, steps=1)})
    r = runs.mqar_run(ctx, "softmax", 0)
    assert len(calls) == 1 and calls[0]["steps"] == recipe["steps"]
    assert r["metrics"][f"mqar@{recipe['seq_len']}x{recipe['num_kv_pairs']}/acc"] == 0.25
    assert glob.glob(wd + ".stale-*") and json.load(open(os.path.join(wd, cache.MARKER)))["recipe"]["steps"] == \
        recipe["steps"]
    runs.mqar_run(ctx, "softmax", 0)  # same recipe, same code: reused
    assert len(calls) == 1
    # trained by another synthetic-task training loop (idattn.eval.synthetic): trained again, the old one kept aside
    marker = cache.read_marker(wd)
    assert marker["train_src"] == runs.synthetic_train_hash()
    cache.write_marker(wd, dict(marker, train_src="0000000000"))
    runs.mqar_run(ctx, "softmax", 0)
    assert len(calls) == 2 and glob.glob(wd + ".stale-*") and cache.read_marker(wd)["train_src"] != "0000000000"
    # a marker from before the loop was hashed is stamped, not trained again
    cache.write_marker(wd, {k: v for k, v in cache.read_marker(wd).items() if k != "train_src"})
    runs.mqar_run(ctx, "softmax", 0)
    assert len(calls) == 2 and cache.read_marker(wd)["train_src"] == runs.synthetic_train_hash()


def test_mqar_run_under_new_model_code_is_rescored_from_its_saved_parameters(tmp_path, monkeypatch):
    """A finished MQAR run keeps its parameters; under another model-code hash it is re-scored on its own test
    sets and reused when the accuracies agree, moved aside and retrained when they do not (or nothing was saved)."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    from idattn.eval import recall
    from idattn.models import build_model
    calls, compiled = [], {}

    def fake_train(model_cfg, **kw):  # an untrained toy model, scored by the code under test's own scorer
        calls.append(kw)
        if not compiled:  # one model and one compile for the test's three trainings
            model = build_model(model_cfg)
            x = jnp.zeros((1, kw["seq_len"]), jnp.int32)
            compiled["params"] = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(7), x)["params"])
            compiled["apply"] = jax.jit(model.apply)
        params, apply = compiled["params"], compiled["apply"]
        acc, grid = recall.mqar_scores(lambda v: apply({"params": params}, jnp.asarray(v)),
                                       vocab_size=kw["vocab_size"], seq_len=kw["seq_len"],
                                       num_kv_pairs=kw["num_kv_pairs"], num_test=kw["num_test"], seed=kw["seed"],
                                       test_grid=kw["test_grid"])
        return {"acc": acc, "grid": grid, "loss": 1.0, "steps": kw["steps"], "params": params}

    monkeypatch.setattr(recall, "train_mqar", fake_train)
    ctx = cache.Ctx(str(tmp_path), "toy", [0], render_only=False, keep_stale=False)
    wd = ctx.mqar_dir("softmax", 0)
    first = runs.mqar_run(ctx, "softmax", 0)
    assert len(calls) == 1 and os.path.exists(os.path.join(wd, runs.MQAR_PARAMS))
    monkeypatch.setattr(cache, "source_hash", lambda: "0123012301")  # the model code changed
    assert runs.mqar_run(ctx, "softmax", 0)["metrics"] == first["metrics"]  # its fingerprint holds: reused
    marker = cache.read_marker(wd)
    assert len(calls) == 1 and marker["src"] == "0123012301" and "fingerprint under" in marker["verified"][-1]
    # a run finished before runs were stamped has no fingerprint: re-scored from its saved parameters instead
    cache.write_marker(wd, {k: v for k, v in marker.items() if k not in ("fingerprint", "verified")})
    monkeypatch.setattr(cache, "source_hash", lambda: "0123456789")
    again = runs.mqar_run(ctx, "softmax", 0)
    assert len(calls) == 1 and again["metrics"] == first["metrics"]  # re-scored equal: reused
    marker = cache.read_marker(wd)
    assert marker["src"] == "0123456789" and "recorded" in marker["verified"][-1]
    # a recorded accuracy the saved model does not give: other function, moved aside and retrained
    res_file = glob.glob(os.path.join(wd, "eval", "recall-*.json"))[0]
    res = json.load(open(res_file))
    key = next(iter(res["metrics"]))
    res["metrics"][key] += 0.5
    json.dump(res, open(res_file, "w"))
    monkeypatch.setattr(cache, "source_hash", lambda: "abcdefabcd")
    runs.mqar_run(ctx, "softmax", 0)
    assert len(calls) == 2 and glob.glob(wd + ".stale-0123456789")
    # a run that kept no parameters nor a fingerprint (trained before either was saved) cannot be checked: retrained
    os.remove(os.path.join(wd, runs.MQAR_PARAMS))
    cache.write_marker(wd, {k: v for k, v in cache.read_marker(wd).items() if k != "fingerprint"})
    monkeypatch.setattr(cache, "source_hash", lambda: "fedcbafedc")
    runs.mqar_run(ctx, "softmax", 0)
    assert len(calls) == 3
    # the marker records the model it trained; a marker from before that (no "model") is reused and stamped
    marker = cache.read_marker(wd)
    assert marker["model"]["num_layers"] == ctx.exp.get_mqar_config("softmax", "toy").model.num_layers
    assert "impl" not in marker["model"]  # how it runs is not what it computes
    cache.write_marker(wd, {k: v for k, v in marker.items() if k != "model"})
    runs.mqar_run(ctx, "softmax", 0)
    assert len(calls) == 3 and cache.read_marker(wd)["model"] == marker["model"]
    # another MQAR model (one layer more, the MQAR recipe unchanged): moved aside, named why, and retrained
    get = ctx.exp.get_mqar_config

    def deeper(mixer, size="small"):
        c = get(mixer, size)
        c.model.num_layers += 1
        return c

    monkeypatch.setattr(ctx.exp, "get_mqar_config", deeper)
    n_stale = len(glob.glob(wd + ".stale-*"))
    runs.mqar_run(ctx, "softmax", 0)
    assert len(calls) == 4 and len(glob.glob(wd + ".stale-*")) == n_stale + 1
    assert cache.read_marker(wd)["model"]["num_layers"] == marker["model"]["num_layers"] + 1


def test_source_hash_is_over_content_not_paths(tmp_path, monkeypatch):
    """Moving or renaming model files keeps finished runs valid; changing one byte of code re-verifies them."""
    import shutil

    from idattn.studies import code_hash
    pkg = tmp_path / "idattn"
    for d in code_hash.SRC_DIRS:
        shutil.copytree(os.path.join(code_hash.PACKAGE, d), pkg / d)
    monkeypatch.setattr(code_hash, "PACKAGE", str(pkg))

    def fresh_hash():
        monkeypatch.setattr(code_hash, "_SRC", [])
        return code_hash.source_hash()

    base = fresh_hash()
    assert base == fresh_hash()
    os.replace(pkg / "ops" / "s4d.py", pkg / "models" / "moved_s4d.py")
    assert fresh_hash() == base
    with open(pkg / "ops" / "pallas" / "gpu.py", "a") as f:  # the fused kernels: no study run executes them
        f.write("\n# a kernel change\n")
    assert fresh_hash() == base
    with open(pkg / "layers" / "common.py", "a") as f:  # prose: a comment, a docstring, blank lines
        f.write('\n# a comment\n\n\ndef _f(x):  # another\n    """A docstring,\n    two lines."""\n    return x  # "#"\n')
    with_f = fresh_hash()
    assert with_f != base  # _f is code
    src = (pkg / "layers" / "common.py").read_text()
    (pkg / "layers" / "common.py").write_text(src.replace("# a comment", "# reworded").replace("two lines", "2 lines")
                                              .replace("# another", ""))
    assert fresh_hash() == with_f
    (pkg / "layers" / "common.py").write_text(src.replace("return x  #", "return -x  #"))
    assert fresh_hash() != with_f  # one character of code
    (pkg / "layers" / "common.py").write_text(src.replace("return x", 'return "#" + x'))
    assert fresh_hash() != with_f  # a '#' inside a string is code
    shutil.rmtree(pkg)
    pkg.mkdir()
    with pytest.raises(code_hash.CodeHashError, match="no model code"):
        fresh_hash()


def test_training_code_hash_covers_what_decides_a_runs_numbers(tmp_path, monkeypatch):
    """Editing the loss (train/step.py), the optimiser (train/optim.py), packing (data/pipeline.py) or the
    tokenizer changes train_code_hash; a finished run recorded with another one is trained again even though
    evaluating its parameters would pass (that check cannot see a training change); a marker from before the hash
    existed is stamped, not retrained."""
    import shutil

    from idattn.studies import code_hash
    pkg = tmp_path / "idattn"
    for rel in code_hash.TRAIN_FILES:
        (pkg / os.path.dirname(rel)).mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(code_hash.PACKAGE, rel), pkg / rel)
    monkeypatch.setattr(code_hash, "PACKAGE", str(pkg))

    def fresh_hash():
        monkeypatch.setattr(code_hash, "_TRAIN_SRC", [])
        return code_hash.train_code_hash()

    base = fresh_hash()
    seen = {base}
    for rel in code_hash.TRAIN_FILES:
        original = (pkg / rel).read_bytes()
        (pkg / rel).write_bytes(original + b"\n_A_CHANGE = 1\n")
        seen.add(fresh_hash())
        (pkg / rel).write_bytes(original)
        assert fresh_hash() == base
    assert len(seen) == 1 + len(code_hash.TRAIN_FILES)
    # the synthetic tasks' hash (MQAR, MAD, state tracking): their loop and the step, not the LM data pipeline
    for rel in code_hash.SYNTHETIC_TRAIN_FILES:
        (pkg / os.path.dirname(rel)).mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(os.path.dirname(code_hash.__file__), "..", rel), pkg / rel)

    def fresh_synthetic():
        monkeypatch.setattr(code_hash, "_SYNTHETIC_SRC", [])
        return code_hash.synthetic_train_hash()

    synth = fresh_synthetic()
    for rel, moves in [(r, True) for r in code_hash.SYNTHETIC_TRAIN_FILES] + [(os.path.join("data", "pipeline.py"),
                                                                                False)]:
        original = (pkg / rel).read_bytes()
        (pkg / rel).write_bytes(original + b"\n_A_CHANGE = 1\n")
        assert (fresh_synthetic() != synth) is moves, rel
        (pkg / rel).write_bytes(original)

    wd = str(tmp_path / "run")
    cache.write_marker(wd, {"status": "done", "src": "m1", "train_src": "other"})
    verified = []
    rec = cache.check_reuse(wd, "m1", False, verify=lambda: verified.append(1) or (True, "same"), train_src=base)
    assert rec == {} and not os.path.exists(wd) and glob.glob(wd + ".stale-*") and not verified
    cache.write_marker(wd, {"status": "done", "src": "m1", "train_src": "other"})
    assert cache.check_reuse(wd, "m1", True, train_src=base)["stale"] is True  # --keep_stale keeps it, marked
    cache.write_marker(wd, {"status": "done", "src": "m1"})  # recorded before the training code was hashed
    rec = cache.check_reuse(wd, "m1", False, train_src=base)
    assert rec["status"] == "done" and cache.read_marker(wd)["train_src"] == base


def test_context_buckets_measure_the_context_each_token_had():
    """(c)'s precondition: tokens are bucketed by the context they had, which restarts at a document boundary
    inside a packed row; padding (mask 0) is not counted."""
    import numpy as np
    nll = np.array([[3.0, 3.0, 2.0, 1.0], [3.0, 2.0, 3.0, 2.0], [9.0, 9.0, 9.0, 9.0]])
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], float)
    seg = np.array([[1, 1, 1, 1], [1, 1, 2, 2], [0, 0, 0, 0]])
    out = runs.context_buckets(nll, mask, seg, 4, num_buckets=2)
    # context lengths: row 0 -> 0 1 2 3, row 1 -> 0 1 0 1 (a new document at column 2)
    assert out["edges"] == [0, 2, 4]
    assert out["bucket_ppl"] == pytest.approx([math.exp(16 / 6), math.exp(1.5)])
    assert out["ratio"] == pytest.approx(math.exp(1.5 - 16 / 6))
    # the same numbers by column alone (ignoring the boundary) would differ: the test can tell
    assert out["bucket_ppl"][0] != pytest.approx(math.exp((3 + 3 + 3 + 2) / 4))


def test_every_study_model_runs_no_fused_kernel():
    """What lets source_hash leave idattn/ops/pallas out: every model the study trains (each table's mixers and
    sizes, the cube, MAD's cells, MQAR) runs the XLA paths, impl="chunked" and attn_impl="xla"."""
    from idattn.configs import repro as exp

    assert code_hash.SRC_EXCLUDE == (os.path.join("ops", "pallas"),)
    models = []
    for size in exp.SIZES:
        for mixer in ("softmax", "interdomain", "s4d_only", "s4d_only+sum", *runs.cells()[1:]):
            for dt in ("paper", "scaled"):
                models.append(exp.get_config(f"{mixer},{size},{dt},0").model)
    for size in exp.MQAR:
        for cell in runs.cells():
            models.append(exp.get_mqar_config(cell, size).model)
    ctx = cache.Ctx("/nonexistent", "small", (0,), render_only=True, keep_stale=False, only=())
    models += [runs.mad_model_config(ctx, c) for c in runs.cells()]
    assert len(models) > 40
    for m in models:
        assert m.impl == "chunked" and m.attn_impl == "xla", (m.mixer if "mixer" in m else m)


def test_runs_record_restores_finished_runs_for_reuse_and_refuses_bad_records(tmp_path, monkeypatch):
    """--archive / --restore: a finished MAD run (marker + eval result) recorded in one JSON, the root deleted, the
    run restored into a fresh root and reused without training; a run folder that exists is not overwritten; a
    record reaching outside <root>/runs, or naming other files, is refused before anything is written."""
    import shutil

    from idattn.eval import mad
    calls = []

    def train(model_cfg, task, **kw):
        calls.append(task)
        return {"acc": 0.25, "loss": 0.1, "steps": kw["steps"], "seq_len": 8, "num_test": 8}

    monkeypatch.setattr(mad, "train_mad", train)
    root, record = str(tmp_path / "a"), str(tmp_path / "record.json")
    ctx = cache.Ctx(root, "toy", (0,), render_only=False, keep_stale=False, only=())
    assert runs.mad_run(ctx, "softmax", "memorization", 0) == 0.25 and calls == ["memorization"]
    cache.write_marker(os.path.join(root, "runs", "toy", "mad", "half-done"), {"status": "training"})
    assert cache.archive_runs(root, record) == 1  # finished runs only
    shutil.rmtree(root)
    root2 = str(tmp_path / "b")
    assert cache.restore_runs(record, root2) == 1 and cache.restore_runs(record, root2) == 0
    ctx2 = cache.Ctx(root2, "toy", (0,), render_only=False, keep_stale=False, only=())
    assert runs.mad_run(ctx2, "softmax", "memorization", 0) == 0.25 and calls == ["memorization"]
    wd = runs.mad_dir(ctx2, "softmax", "memorization", 0)
    assert sorted(os.listdir(os.path.join(wd, "eval")))  # the result came back
    for bad in ({"../escape": {"repro.json": "{}"}}, {"runs/toy/mad/x": {"params/ckpt.bin": "0"}}):
        with open(record, "w") as f:
            json.dump({"format": cache.ARCHIVE_FORMAT, "runs": bad}, f)
        with pytest.raises(cache.ReproError, match="refusing the whole record"):
            cache.restore_runs(record, str(tmp_path / "c"))
        assert not os.path.exists(tmp_path / "c")
    with open(record, "w") as f:
        f.write("[]")
    with pytest.raises(cache.ReproError, match="not a runs record"):
        cache.restore_runs(record, root2)


def test_a_restore_cut_short_leaves_no_marker_over_missing_results_and_the_next_one_completes_it(tmp_path,
                                                                                                  monkeypatch):
    """A write that fails while a run is restored (injected at its second file) leaves that run without its
    marker, so the next restore writes the whole run; the marker is written last."""
    from idattn import atomic
    record, root = str(tmp_path / "record.json"), str(tmp_path / "root")
    files = {cache.MARKER: json.dumps({"status": "done"}), "eval/a.json": "{\"acc\": 0.5}",
             "eval/b.json": "{\"acc\": 0.75}"}
    with open(record, "w") as f:
        json.dump({"format": cache.ARCHIVE_FORMAT, "runs": {"runs/toy/mqar/x": files}}, f)
    real, written = atomic.write_text, []

    def failing_second(path, text):
        if len(written) == 1:
            raise OSError(28, "No space left on device", path)
        written.append(os.path.relpath(path, os.path.join(root, "runs/toy/mqar/x")))
        return real(path, text)

    monkeypatch.setattr(atomic, "write_text", failing_second)
    with pytest.raises(OSError, match="No space left"):
        cache.restore_runs(record, root)
    wd = os.path.join(root, "runs/toy/mqar/x")
    assert written == ["eval/a.json"] and not os.path.exists(os.path.join(wd, cache.MARKER))
    monkeypatch.setattr(atomic, "write_text", real)
    assert cache.restore_runs(record, root) == 1
    for name, text in files.items():
        assert open(os.path.join(wd, name)).read() == text
    assert sorted(os.listdir(os.path.join(wd, "eval"))) == ["a.json", "b.json"]  # no temporary file left


def test_archiving_a_root_keeps_the_records_later_stamps_and_adds_new_results(tmp_path):
    """A study root restored from an older record holds markers without the stamps the record gained since
    (re-verification, fingerprint): archiving that root into the record keeps the record's marker and adds the
    root's new eval results; a run retrained in the root (another training) replaces the record's whole; a run
    only in the root is added."""
    root, record = str(tmp_path / "root"), str(tmp_path / "record.json")
    base = {"status": "done", "seed": 0, "size": "toy", "src": "aaa", "train_s": 12.5, "final_train_loss": 3.1}
    stamped = dict(base, src="bbb", verified=["model code aaa -> bbb: same ppl"],
                   fingerprint={"src": "bbb", "values": [1.0, 2.0]})
    record_runs = {
        "runs/toy/lm/a-s0": {cache.MARKER: json.dumps(stamped), "eval/ppl.json": '{"ppl": 30.0}'},
        "runs/toy/lm/b-s0": {cache.MARKER: json.dumps(stamped), "eval/ppl.json": '{"ppl": 31.0}'},
    }
    with open(record, "w") as f:
        json.dump({"format": cache.ARCHIVE_FORMAT, "runs": record_runs}, f)
    # a: the old copy, plus a result evaluated since; b: retrained (another training); c: new
    for name, marker, ev in (("a-s0", base, {"ppl.json": '{"ppl": 30.0}', "context_use.json": '{"r": 0.9}'}),
                             ("b-s0", dict(base, train_s=99.0, final_train_loss=2.9), {"ppl.json": '{"ppl": 28.0}'}),
                             ("c-s0", base, {"ppl.json": '{"ppl": 40.0}'})):
        wd = os.path.join(root, "runs", "toy", "lm", name)
        cache.write_marker(wd, marker)
        os.makedirs(os.path.join(wd, "eval"))
        for n, text in ev.items():
            with open(os.path.join(wd, "eval", n), "w") as f:
                f.write(text)
    assert cache.archive_runs(root, record) == 3
    got = json.load(open(record))["runs"]
    a = got["runs/toy/lm/a-s0"]
    assert json.loads(a[cache.MARKER]) == stamped, "the root's older copy undid the record's stamps"
    assert a["eval/context_use.json"] == '{"r": 0.9}' and a["eval/ppl.json"] == '{"ppl": 30.0}'
    b = got["runs/toy/lm/b-s0"]
    assert json.loads(b[cache.MARKER])["train_s"] == 99.0 and "fingerprint" not in json.loads(b[cache.MARKER])
    assert b["eval/ppl.json"] == '{"ppl": 28.0}'
    assert json.loads(got["runs/toy/lm/c-s0"][cache.MARKER]) == base
    # the root re-stamped later than the record (its verified history extends the record's): the root's wins
    later = dict(stamped, verified=stamped["verified"] + ["bbb -> ccc: same ppl"], src="ccc")
    cache.write_marker(os.path.join(root, "runs", "toy", "lm", "a-s0"), later)
    cache.archive_runs(root, record)
    assert json.loads(json.load(open(record))["runs"]["runs/toy/lm/a-s0"][cache.MARKER]) == later


def test_committed_doc_is_what_the_committed_runs_record_renders(tmp_path, monkeypatch):
    """docs/reproduction.md's generated parts and docs/reproduction-tables.md come from docs/reproduction-runs.json
    and the committed code alone: restored on a fresh root (as a new machine would) and rendered into a copy, both
    are unchanged, also where the interpreter's standard library is another corpus (another Python: the stdlib
    tables name the corpus their recorded runs were scored on, never the rendering machine's)."""
    import shutil

    from idattn.data import stdlib_corpus
    from tests.train_helpers import REPO
    doc, record = os.path.join(REPO, "docs", "reproduction.md"), os.path.join(REPO, "docs", "reproduction-runs.json")
    tables = os.path.join(REPO, "docs", "reproduction-tables.md")
    if not (os.path.exists(doc) and os.path.exists(record)):
        pytest.skip("not a source checkout (docs/ absent)")
    monkeypatch.setattr(stdlib_corpus, "corpus_id", lambda root=None: "python-stdlib-3.99.0-ffffffffffff")
    monkeypatch.setattr(stdlib_corpus, "corpus_info", lambda *a, **k: pytest.fail("read this interpreter's corpus"))
    copy = tmp_path / "reproduction.md"
    shutil.copyfile(doc, copy)
    assert repro.main(["all", f"--root={tmp_path / 'root'}", f"--restore={record}", "--render_only",
                       f"--doc={copy}"]) == 0
    how = ("is not what the committed record renders: python -m idattn.repro all --root=DIR "
           "--restore=docs/reproduction-runs.json --render_only --doc=docs/reproduction.md")
    assert copy.read_text() == open(doc).read(), "docs/reproduction.md " + how
    assert (tmp_path / "reproduction-tables.md").read_text() == open(tables).read(), "docs/reproduction-tables.md " + how


def test_recall_table_shows_each_mqar_seeds_last_training_loss(tmp_path):
    """The recall table's MQAR rows end with each seed's last training loss (read from its result), the evidence
    that a low-accuracy seed had not finished learning when the schedule ended."""
    from test_repro_hybrid import _fake_mqar
    ctx = cache.Ctx(str(tmp_path), "small", (0, 1, 2), render_only=True, keep_stale=False)
    for m in ("softmax", "interdomain", "s4d_only"):
        for s, acc in zip((0, 1, 2), (0.98, 0.64, 0.99) if m == "interdomain" else (0.9, 0.9, 0.9)):
            _fake_mqar(ctx, m, s, acc)
    data = repro_recall.table_recall(ctx)
    assert data["mqar_final_loss"]["interdomain"] == [0.02, 0.36, 0.01]
    row = next(ln for ln in open(ctx.table_path("recall", "md")).read().splitlines()
               if ln.startswith("| Interdomain |") and "64.0" in ln)
    assert row.rstrip(" |").endswith("| 0.020 / 0.360 / 0.010")


def test_unchecked_runs_are_named_under_the_table_that_read_them_by_path(tmp_path, monkeypatch):
    """A run read under other model code is listed by its path under the root (names repeat across sizes) and only
    under the table that read it: `all` once listed an earlier table's runs under every later one."""
    root = str(tmp_path)
    cache.write_marker(os.path.join(root, "runs", "small", "lm", "interdomain-paper-s0"),
                      {"src": "older-model-code", "status": "done"})

    def reads_the_run(ctx):
        assert runs.lm_run(ctx, "interdomain", "paper", 0)["status"] == "done"
        open(ctx.table_path("ppl", "md"), "w").write("ppl" + cache.missing_note([], ctx))

    def reads_nothing(ctx):
        open(ctx.table_path("recall", "md"), "w").write("recall" + cache.missing_note([], ctx))

    monkeypatch.setattr(repro, "TABLES", {"ppl": Table("ppl", "", reads_the_run),
                                          "recall": Table("recall", "", reads_nothing)})
    assert repro.main(["all", f"--root={root}", "--render_only", "--no_compile_cache"]) == 0
    ppl, recall = (open(os.path.join(root, f"{t}.md")).read() for t in ("ppl", "recall"))
    assert "Read without checking" in ppl and ppl.rstrip().endswith("runs/small/lm/interdomain-paper-s0.")
    assert recall == "recall"


def test_stdlib_tables_name_the_corpus_their_runs_recorded_and_refuse_to_train_beside_another(tmp_path):
    """A record restored under another Python renders the corpus its runs were scored on (not the rendering
    interpreter's), and training beside it under this interpreter is refused before anything is written."""
    from idattn.data import stdlib_corpus
    ctx = cache.Ctx(str(tmp_path), "small", (0,), False, False, ()).for_size("stdlib")
    here = stdlib_corpus.corpus_id()
    assert runs.corpus_name(ctx) == f"{here}.val" and "no run recorded yet" in claims.setup_line(ctx)

    def record(name, corpus):
        d = tmp_path / "runs" / "stdlib" / "lm" / name / "eval"
        d.mkdir(parents=True)
        (d / "extrapolation-x.json").write_text(json.dumps({"protocol": {"corpus": corpus}}))

    other = "python-stdlib-9.9.9-0123456789ab"
    record("softmax-scaled-s0", f"{other}.val")
    assert runs.corpus_name(ctx) == f"{other}.val"
    assert f"the Python 9.9.9 standard-library source ({other}, as its runs recorded" in claims.setup_line(ctx)
    with pytest.raises(cache.ReproError) as e:
        runs.lm_run(ctx, "interdomain", "paper", 0)
    assert "\n" not in str(e.value) and other in str(e.value) and here in str(e.value)
    assert not (tmp_path / "runs" / "stdlib" / "lm" / "interdomain-paper-s0").exists()
    record("interdomain-paper-s0.stale-abc", f"{here}.val")  # a run moved aside is not read
    assert runs.corpus_name(ctx) == f"{other}.val"
    record("interdomain-paper-s1", f"{here}.val")
    with pytest.raises(cache.ReproError, match="2 corpora"):
        runs.recorded_corpus(ctx)
