"""The MAD table (idattn.studies.repro_mad) with a stand-in trainer whose accuracies are built from known effects:
(d) and (e) read per task with intervals, runs reused, unlike tasks never averaged, toy size without verdicts."""
from __future__ import annotations

import json
import os
import re

from idattn.studies import fingerprint, repro_mad, repro_runs as runs, runcache as cache


def _cheap_probe(monkeypatch):
    """The runs' model fingerprint as a stand-in: the real probe compiles each of the nine cells' models (minutes
    on 2 cores) and is tested on its own in tests/test_fingerprint.py; these tests are about the table."""
    monkeypatch.setattr(fingerprint, "model_fingerprint", lambda cfg: [float(len(repr(cfg))), 1.0])


def _fake(calls):
    def train(model_cfg, task, *, seed, **kw):
        calls.append((model_cfg.mixer, getattr(model_cfg, "readout", None), task, seed))
        noise = (0.0, 0.01, -0.01)[seed % 3]
        if model_cfg.mixer == "softmax":
            acc = 0.99
        else:
            acc = 0.3 + noise
            acc += 0.4 if model_cfg.readout == "query" else 0.0  # the readout dominates
            acc += 0.05 if model_cfg.input == "dualkv" else 0.0
            acc += 0.01 if model_cfg.rope else 0.0
        return {"acc": acc, "loss": 0.1, "steps": kw["steps"], "seq_len": 8, "num_test": 8}
    return train


def test_mad_table_reads_d_and_e_per_task_with_intervals(tmp_path, monkeypatch):
    from idattn.eval import mad
    calls = []
    monkeypatch.setattr(mad, "train_mad", _fake(calls))
    _cheap_probe(monkeypatch)
    ctx = cache.Ctx(str(tmp_path), "small", (0, 1, 2), render_only=False, keep_stale=False)
    data = repro_mad.table_mad(ctx)
    tasks = ctx.exp.MAD["tasks"]
    assert len(calls) == 9 * len(tasks) * 3
    for t in tasks:
        assert data["verdicts"][f"d_{t}"]["verdict"] == "reproduced"
        assert data["verdicts"][f"d_{t}"]["parts"][0]["interval"]["mean"] > 0.39
    for t in repro_mad.RECALL_TASKS:
        assert data["verdicts"][f"e_{t}"]["verdict"] == "reproduced"
    assert "e_selective_copying" not in data["verdicts"] and "e_memorization" not in data["verdicts"]
    md = open(os.path.join(str(tmp_path), "mad.md")).read()
    assert "[95% t CI" in md and "pts" in md and "| `softmax` | 99.0 / 99.0 / 99.0 |" in md
    # a rerun reuses every finished run
    repro_mad.table_mad(ctx)
    assert len(calls) == 9 * len(tasks) * 3
    # another recipe retrains
    rec = json.load(open(os.path.join(runs.mad_dir(ctx, "softmax", tasks[0], 0), cache.MARKER)))
    assert rec["recipe"]["steps"] == ctx.exp.MAD["steps"] and rec["status"] == "done"


def test_mad_table_at_toy_size_prints_no_verdict(tmp_path, monkeypatch):
    from idattn.eval import mad
    monkeypatch.setattr(mad, "train_mad", _fake([]))
    _cheap_probe(monkeypatch)
    ctx = cache.Ctx(str(tmp_path), "toy", (0, 1, 2), render_only=False, keep_stale=False)
    data = repro_mad.table_mad(ctx)
    md = open(os.path.join(str(tmp_path), "mad-toy.md")).read()
    assert not re.search(r"\breproduced\b|inconclusive|vacuous", md)
    assert {v["verdict"] for v in data["verdicts"].values()} == {"no verdict (toy size: numbers only)"}


def test_mad_recipe_trains_on_at_most_mads_training_set_per_task(tmp_path, monkeypatch):
    """The recipe's training-set size is capped by MAD's per task: memorization keeps MAD's 256 sequences (its map
    is learnt from them), the others get the recipe's; every task at one sequence length (compression at MAD's),
    MAD's vocabularies."""
    from idattn.eval import mad
    seen = {}

    def train(model_cfg, task, *, seed, num_train, **kw):
        seen[task] = (num_train, kw.get("seq_len"))
        return {"acc": 0.5, "loss": 0.1, "steps": kw["steps"], "seq_len": 8, "num_test": 8}

    monkeypatch.setattr(mad, "train_mad", train)
    ctx = cache.Ctx(str(tmp_path), "small", (0,), render_only=False, keep_stale=False, only=("softmax",))
    repro_mad.table_mad(ctx)
    r = ctx.exp.MAD
    assert seen["memorization"][0] == mad.TASKS["memorization"]["num_train"] == 256
    assert all(n == min(r["num_train"], mad.TASKS[t]["num_train"]) for t, (n, _) in seen.items())
    assert seen["in_context_recall"][0] == r["num_train"] < mad.TASKS["in_context_recall"]["num_train"]
    # every task at one sequence length but compression, which keeps MAD's (None: the task's default, 32)
    assert {L for t, (_, L) in seen.items() if t != "compression"} == {64} and set(seen) == set(r["tasks"])
    assert seen["compression"][1] is None and mad.TASKS["compression"]["seq_len"] == 32
