"""Issue 34's study table (idattn.studies.repro_selective) on constructed run records (no training): every task's
per-seed numbers per model, the six questions answered by the verdict rule's interval over paired seeds (the LM
ones at each ladder point), the published numbers in their own table, and what is missing named; (slow) the toy
study trains end to end for one model."""
from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys

import pytest

from idattn.rundir.schema import write_result
from idattn.studies import repro_runs as runs, repro_selective, repro_selective as sel, runcache as cache
from tests.test_repro_hybrid import _fake_mqar
from tests import train_helpers as T


def _fake_lm(ctx, mixer, seed, ppl):
    wd = ctx.lm_dir(mixer, ctx.exp.PRIMARY_DT, seed)
    L = ctx.train_len()
    steps = int(ctx.exp.SIZES[ctx.size]["num_steps"])
    cache.write_marker(wd, {"status": "done", "src": cache.source_hash(), "train_src": runs.train_code_hash(),
                           "steps": steps, "params": 1000, "mixer": mixer, "seed": seed, "size": ctx.size,
                           "train_s": 60.0, "recipe": runs.size_recipe(ctx)})
    write_result(wd, "extrapolation", steps, {f"ppl@{L}": ppl}, run={"mixer": mixer, "seed": seed},
                 protocol=runs.ppl_protocol(ctx, L))


def _fake_state(ctx, mixer, task, seed, scaled):
    wd = runs.state_dir(ctx, mixer, task, seed)
    cache.write_marker(wd, {"status": "done", "src": cache.source_hash(), "mixer": mixer, "task": task, "seed": seed,
                           "size": ctx.size, "recipe": runs.state_recipe(ctx), "train_s": 10.0})
    c = {"parity": 2, "modular_arithmetic": 5}[task]
    write_result(wd, "state", 1, {f"state/{task}/acc": scaled * (1 - 1 / c) + 1 / c, f"state/{task}/scaled": scaled},
                 run={"mixer": mixer, "seed": seed, "task": task}, protocol={"corpus": f"state.{task}"},
                 details={"loss": (1 - scaled) * math.log(c)})  # the last training batch's loss


def _fake_mad(ctx, mixer, task, seed, acc):
    wd = runs.mad_dir(ctx, mixer, task, seed)
    cache.write_marker(wd, {"status": "done", "src": cache.source_hash(), "cell": mixer, "task": task, "seed": seed,
                           "size": ctx.size, "recipe": runs.mad_recipe(ctx), "train_s": 20.0})
    write_result(wd, "mad", 1, {f"mad/{task}/acc": acc}, run={"mixer": mixer, "seed": seed, "task": task},
                 protocol={"corpus": f"mad.{task}"})


def _populate(top, seeds=(0, 1, 2), skip=()):
    S = top.exp.SELECTIVE
    mad_top = top.for_size(top.exp.SELECTIVE_MAD[top.size])  # the table's MAD runs: a size of their own
    good = {"interdomain-selective", "interdomain-selective+phase", "s4d_only-selective", "softmax"}
    for s in seeds:
        j = 0.01 * (s - 1)  # a seed's own difficulty, shared by every model
        for m in S["mixers"]:
            if (m, s) in skip:
                continue
            _fake_state(top, m, "parity", s, (0.9 if m.endswith("+phase") else 0.02) + j)
            _fake_state(top, m, "modular_arithmetic", s, (0.4 if m.endswith("+phase") else 0.1) + j)
            _fake_mad(mad_top, m, "selective_copying", s, (0.97 if m in good else 0.3) + j)
            _fake_mad(mad_top, m, "in_context_recall", s, 0.8 + j)
            _fake_mad(top, m, "selective_copying", s, 0.05)  # the `mad` table's run (its recipe): never read here
            _fake_mqar(top, m, s, (0.9 if m in good else 0.7) + j)
            for z in top.exp.SELECTIVE_LM[top.size]:
                base = {"softmax": 30.0, "interdomain": 31.0, "interdomain-selective": 29.0,
                        "interdomain-selective+phase": 29.1, "s4d_only": 36.0, "s4d_only-selective": 32.0}[m]
                _fake_lm(top.for_size(z), m, s, base * math.exp(j))


def test_selective_table_answers_its_questions_with_intervals(tmp_path):
    top = cache.Ctx(str(tmp_path), "small", (0, 1, 2), render_only=True, keep_stale=False)
    _populate(top)
    data = repro_selective.table_selective(top)
    assert data["missing"] == []
    v = data["verdicts"]
    assert v["s1"]["answer"] == "yes" and v["s1"]["interval"]["mean"] == pytest.approx(0.67)
    assert v["s2"]["answer"] == "yes" and v["s2"]["interval"]["mean"] == pytest.approx(0.88)
    assert v["s3"]["answer"] == "yes" and v["s4"]["answer"] == "yes"
    *early, top_point = top.exp.SELECTIVE_LM["small"]
    for z in early:
        assert v[f"s5@{z}"]["answer"] == "yes"
        assert v[f"s5@{z}"]["interval"]["mean"] == pytest.approx(math.log(31 / 29), abs=1e-9)
        assert v[f"s6@{z}"]["answer"] == "yes"
    # (s7) at climb128 only, where only its two models train; (s5), (s6) not asked there (one model untrained)
    assert top_point == "climb128" and [k for k in v if k.startswith("s7")] == ["s7@climb128"]
    assert v["s7@climb128"]["answer"] == "no"
    assert v["s7@climb128"]["interval"]["mean"] == pytest.approx(math.log(29 / 29.1), abs=1e-9)
    assert f"s5@{top_point}" not in v and f"s6@{top_point}" not in v
    assert set(data["ppl"][top_point]["interdomain"]) == set()  # written on disk, never read at that point
    md = open(top.table_path("selective", "md")).read()
    row = next(ln for ln in md.splitlines() if ln.startswith("| Interdomain-selective+phase |"))
    assert "89.0 / 90.0 / 91.0" in row  # parity, scaled %, per seed
    assert "| Interdomain-selective |" in md and "| S4D-only-selective |" in md
    assert "Mamba-3 98.51" in md and "S4 (LTI) 18.3" in md  # published numbers, their own table
    assert "at 2000 steps x 16 (size `mad-s2000`" in md  # the MAD tasks' own recipe, named
    mad_top = top.for_size(top.exp.SELECTIVE_MAD["small"])  # its runs train the `mad` table's model
    assert runs.mad_model_config(mad_top, "interdomain-selective") == runs.mad_model_config(
        top, "interdomain-selective")
    assert "(s2) the phase tracks parity" in md and "**yes**" in md and "Not available yet" not in md
    # the training loss of each state-tracking run, beside chance, per seed
    loss_row = next(ln for ln in md.splitlines() if ln.startswith("| Interdomain-selective+phase |") and ln != row)
    want = [f"{(1 - x) * math.log(2):.3f}" for x in (0.89, 0.90, 0.91)]
    assert loss_row.split("|")[2].strip() == " / ".join(want), loss_row
    assert "ln 2 = 0.693 for parity, ln 5 = 1.609 for modular arithmetic" in md
    assert data["state_train_loss"]["state/parity"]["softmax"]["0"] == pytest.approx((1 - 0.01) * math.log(2))


def test_selective_table_is_undecided_on_two_seeds_and_names_what_is_missing(tmp_path):
    top = cache.Ctx(str(tmp_path), "small", (0, 1, 2), render_only=True, keep_stale=False)
    _populate(top, skip={("interdomain-selective+phase", 2)})
    data = repro_selective.table_selective(top)
    assert data["verdicts"]["s2"]["answer"] == "undecided"  # two paired seeds: no verdict under the rule
    assert data["verdicts"]["s1"]["answer"] == "yes"  # the other questions keep their three seeds
    assert "interdomain-selective+phase-parity-s2" in data["missing"]
    assert sel.label("s4d_only-selective") == "S4D-only-selective" and sel.label("softmax") == "Softmax"


@pytest.mark.slow
def test_selective_study_trains_at_toy_size(tmp_path):
    """`python -m idattn.repro selective --toy --only=interdomain-selective+phase --seeds=0`: the one model's
    state-tracking, MAD, MQAR and LM runs train through the real paths, and the table names every other model's
    runs as missing (not judged at toy size)."""
    root = str(tmp_path / "root")
    proc = subprocess.run([sys.executable, "-m", "idattn.repro", "selective", "--toy", f"--root={root}",
                           "--seeds=0", "--only=interdomain-selective+phase"], cwd=str(tmp_path),
                          env=T.subprocess_env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    md = open(os.path.join(root, "selective-toy.md")).read()
    row = next(ln for ln in md.splitlines() if ln.startswith("| Interdomain-selective+phase |"))
    assert "—" not in row, row  # every task's column has its seed
    assert "not judged (toy size)" in md and "softmax-parity-s0" in md
    marker = json.load(open(os.path.join(root, "runs", "toy", "state", "interdomain-selective+phase-parity-s0",
                                         "repro.json")))
    assert marker["status"] == "done" and marker["trained_on"] == "cpu:cpu"  # where it trained (device_study)
    for kind in ("state", "mad", "mqar", "lm"):  # every family's run is stamped with its fingerprint as it finishes
        for wd in glob.glob(os.path.join(root, "runs", "*", kind, "*")):
            m = json.load(open(os.path.join(wd, "repro.json")))
            assert m["fingerprint"]["src"] == m["src"] and len(m["fingerprint"]["values"]) > 2, wd


def test_tasks_flag_trains_only_the_named_families(tmp_path, monkeypatch):
    """`--tasks=state`: the state-tracking runs are the invocation's own (reused here: all recorded), every other
    family is only read, so a missing MQAR run is named missing and never trained; a bad family or another table
    is refused in one line."""
    import idattn.eval.recall as recall

    def no_training(*a, **k):
        raise AssertionError("--tasks=state trained an MQAR run")

    monkeypatch.setattr(recall, "train_mqar", no_training)
    top = cache.Ctx(str(tmp_path), "small", (0, 1, 2), render_only=False, keep_stale=False)
    top.tasks = frozenset({"state"})
    _populate(top, skip=set())
    missing_mqar = top.mqar_dir("interdomain-selective", 1)
    import shutil
    shutil.rmtree(missing_mqar)
    assert top.for_task("state") is top and top.for_task("mqar").render_only
    assert top.for_task("mad").for_size("climb96").render_only  # kept through a size change
    data = repro_selective.table_selective(top)
    assert data["missing"] == ["mqar interdomain-selective-s1"]
    assert data["verdicts"]["s2"]["answer"] == "yes"  # the state runs were read as the invocation's own
    for argv, want in ((["selective", "--tasks=state,bogus"], "--tasks: bogus; expected some of state, mad, mqar, lm"),
                       (["ppl", "--tasks=state"], "--tasks applies to the selective and delta tables only")):
        p = subprocess.run([sys.executable, "-m", "idattn.repro", *argv, f"--root={tmp_path}/x", "--render_only"],
                           capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert p.returncode == 1 and want in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_delta_table_answers_d1_to_d3_from_the_runs_each_family_trains(tmp_path):
    """The delta study reuses the selective table's function: MQAR and the LM train s = 1 only, state tracking
    both scales; (d1) at the two test settings of MQAR, (d2) at climb96, (d3) s = 2 against s = 1; its own
    published rows; no MAD column; what is missing is only what its families train."""
    top = cache.Ctx(str(tmp_path), "small", (0, 1, 2), render_only=True, keep_stale=False)
    D = top.exp.DELTA
    for s in (0, 1, 2):
        j = 0.01 * (s - 1)
        for m in D["mixers"]:
            _fake_state(top, m, "parity", s, (0.8 if m.endswith("delta2") else 0.02) + j)
            _fake_state(top, m, "modular_arithmetic", s, 0.1 + j + (0.001 * s if m.endswith("delta2") else 0))
            if m != "interdomain-delta2":
                _fake_mqar(top, m, s, (0.95 if m == "interdomain-delta" else 0.7) + j)
                _fake_lm(top.for_size("climb96"), m, s, {"softmax": 30.0, "interdomain": 31.0,
                                                         "interdomain-delta": 32.0}[m] * math.exp(j))
    data = repro_selective.table_delta(top)
    assert data["missing"] == [] and data["table"] == "delta"
    v = data["verdicts"]
    # _fake_mqar writes acc / 2 at the test grid: (0.95 - 0.7) / 2 per seed
    assert v["d1a"]["answer"] == "yes" and v["d1a"]["interval"]["mean"] == pytest.approx(0.125)
    assert v["d1b"]["answer"] == "yes"
    assert v["d2@climb96"]["answer"] == "no"  # the delta model's perplexity is higher on every seed
    assert v["d2@climb96"]["interval"]["mean"] == pytest.approx(math.log(31 / 32), abs=1e-9)
    assert v["d3a"]["answer"] == "yes" and v["d3a"]["interval"]["mean"] == pytest.approx(0.78)
    assert v["d3b"]["answer"] == "undecided"  # a difference of 0.000, 0.001, 0.002: the interval holds 0
    assert set(v) == {"d1a", "d1b", "d2@climb96", "d3a", "d3b"}  # the selective questions are not asked here
    md = open(top.table_path("delta", "md")).read()
    assert md.startswith("## The delta update") and "MAD tasks" not in md and "selective copying" not in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| Interdomain-delta (s = 2) |"))
    assert "79.0 / 80.0 / 81.0" in row and row.count("—") == 4  # no MQAR (3 settings) or LM run at s = 2
    assert "Gated DeltaNet [-1, 1] 100" in md and "DeltaNet 28.24" in md
