"""Model fingerprints (idattn.studies.fingerprint) and `python -m idattn.repro verify`: a recorded run survives a
model-code change that leaves its function alone, and only such a change."""
from __future__ import annotations

import json
import os

import pytest

from idattn.studies import fingerprint as F
from idattn.studies import repro, repro_runs as R, repro_selective, runcache as cache


def _toy_model(ctx, mixer):
    return ctx.config(mixer, "paper", 0).model


@pytest.mark.slow  # three compiles of a model's value-and-grad: ~50 s on 2 cores
def test_fingerprint_is_exact_and_sees_a_changed_function(tmp_path):
    ctx = cache.Ctx(str(tmp_path), "toy", (0,), True, False)
    cfg = _toy_model(ctx, "interdomain")
    cfg.num_layers = 1  # one layer: the same code paths, half the compile
    a, b = F.model_fingerprint(cfg), F.model_fingerprint(cfg)
    assert a == b and len(a) > 10 and all(v > 0 for v in a)  # the same program: equal to the last bit
    assert F.same(F.stamp("h0", a), b)[0]
    changed = cfg.copy_and_resolve_references()
    changed.conj = not cfg.conj  # another function of the same parameters (the readout's conjugation)
    c = F.model_fingerprint(changed)
    ok, why = F.same(F.stamp("h0", a), c)
    assert not ok and "now" in why and "tolerance" in why, (a, c)
    assert max(abs(x - y) / abs(x) for x, y in zip(a, c)) > 100 * F.FP_RTOL  # far outside the tolerance
    assert not F.same({"src": "h0", "version": F.FP_VERSION + 1, "values": a}, a)[0]  # another probe: no answer
    assert not F.same(None, a)[0]


def _fake_lm(ctx, mixer, seed):
    wd = ctx.lm_dir(mixer, "paper", seed)
    cache.write_marker(wd, {"status": "done", "src": cache.source_hash(), "mixer": mixer, "dt": "paper", "seed": seed,
                        "size": ctx.size, "recipe": R.size_recipe(ctx), "steps": 2})
    return wd


def test_verify_stamps_then_keeps_runs_across_a_neutral_change_and_flags_a_changed_one(tmp_path, monkeypatch):
    ctx = cache.Ctx(str(tmp_path / "root"), "toy", (0, 1), False, False)
    probes = []

    def fake_probe(cfg):  # a function of the config, as the real probe is; counted
        probes.append(cfg.mixer)
        return [float(len(cfg.mixer)), 1.0 + cfg.num_layers, 0.5]

    monkeypatch.setattr(F, "model_fingerprint", fake_probe)
    wds = [_fake_lm(ctx, "interdomain", 0), _fake_lm(ctx, "interdomain", 1), _fake_lm(ctx, "softmax", 0)]
    old = cache.source_hash()
    legacy = ctx.lm_dir("s4d_only", "paper", 0)  # another code's run without a fingerprint
    cache.write_marker(legacy, {"status": "done", "src": "0ldc0de000", "mixer": "s4d_only", "dt": "paper", "seed": 0,
                            "size": "toy", "steps": 2})
    probe_cfg = _toy_model(ctx, "softmax")
    assert F.probe_len(probe_cfg) == F.FP_LEN
    probe_cfg.window = 64  # a window the probe must reach past, or windowed and global attention look the same
    assert F.probe_len(probe_cfg) == 69
    out = R.verify_runs(ctx)
    assert sorted(out["stamped"]) == ["toy/lm/interdomain-paper-s0", "toy/lm/interdomain-paper-s1",
                                      "toy/lm/softmax-scaled-s0"]
    assert out["unverifiable"] == ["toy/lm/s4d_only-paper-s0"] and not out["changed"]
    assert sorted(probes) == ["interdomain", "softmax"]  # one probe per config: the seeds share it
    assert cache.read_marker(wds[0])["fingerprint"] == {"src": old, "version": F.FP_VERSION,
                                                    "values": [11.0, 1.0 + _toy_model(ctx, "interdomain").num_layers,
                                                               0.5]}
    assert R.verify_runs(ctx)["unchanged"] == [os.path.relpath(w, os.path.join(ctx.root, "runs")) for w in wds]

    # the model code changes (another hash); the probe still sees the same function for interdomain, not softmax
    monkeypatch.setattr(cache, "source_hash", lambda: "newc0de000")
    monkeypatch.setattr(F, "model_fingerprint",
                        lambda cfg: fake_probe(cfg) if cfg.mixer != "softmax" else [7.0, 9.0, 9.0])
    out = R.verify_runs(ctx)
    assert sorted(out["verified"]) == ["toy/lm/interdomain-paper-s0", "toy/lm/interdomain-paper-s1"]
    assert [c.split(" ")[0] for c in out["changed"]] == ["toy/lm/softmax-scaled-s0"]
    rec = cache.read_marker(wds[1])
    assert rec["src"] == "newc0de000" and rec["fingerprint"]["src"] == old and "fingerprint under" in rec["verified"][-1]
    assert cache.read_marker(wds[2])["src"] == old  # left as it was: a table command trains it again
    assert rec["fingerprint"]["checked"] == "newc0de000"  # the values stay the training code's; a re-verify is free
    n = len(probes)
    assert sorted(R.verify_runs(ctx)["unchanged"]) == ["toy/lm/interdomain-paper-s0", "toy/lm/interdomain-paper-s1"]
    assert len(probes) == n  # the verified runs were not probed again (softmax's changed run is probed, not faked)


def test_verify_cli_records_the_fingerprints(tmp_path, monkeypatch):
    ctx = cache.Ctx(str(tmp_path / "root"), "toy", (0,), False, False)
    _fake_lm(ctx, "interdomain", 0)
    monkeypatch.setattr(F, "model_fingerprint", lambda cfg: [1.0, 2.0, 3.0])
    record = tmp_path / "rec.json"
    assert repro.main(["verify", "--toy", f"--root={ctx.root}", f"--archive={record}", "--no_compile_cache"]) == 0
    runs = json.loads(record.read_text())["runs"]
    marker = json.loads(runs["runs/toy/lm/interdomain-paper-s0"]["repro.json"])
    assert marker["fingerprint"]["values"] == [1.0, 2.0, 3.0]


def test_every_recorded_run_maps_to_its_config_or_says_why_not(tmp_path):
    """The committed record: each run's model config is rebuilt from its marker (no probe is computed here), or the
    reason it is not this config's run is given (a recipe changed since it was trained)."""
    root = str(tmp_path / "root")
    cache.restore_runs(os.path.join(os.path.dirname(__file__), "..", "docs", "reproduction-runs.json"), root)
    ctx = cache.Ctx(root, "small", (0, 1, 2), True, False)
    built, why_not = 0, []
    for wd in cache.run_dirs(root):
        cfg, why = R.run_model_config(ctx, wd, cache.read_marker(wd))
        if cfg is None:
            why_not.append((os.path.relpath(wd, root), why))
        else:
            assert cfg.vocab_size > 0 and cfg.num_layers > 0
            built += 1
    assert built >= 250, why_not
    # the recall table's 3000-step MQAR runs (replaced by the 6000-step recipe) are the ones that do not map
    assert all("another" in why for _, why in why_not), why_not


def _age(wd, fingerprint=None):
    """Make a finished run's marker that of older model code (as a record restored after a model-code change)."""
    rec = cache.read_marker(wd)
    rec["src"] = "0ldc0de000"
    if fingerprint is not None:
        rec["fingerprint"] = {"src": "0ldc0de000", "version": F.FP_VERSION, "values": fingerprint}
    cache.write_marker(wd, rec)


def test_tables_name_every_family_of_runs_they_read_under_other_model_code(tmp_path):
    """--render_only reads state-tracking, MAD and MQAR runs as it reads language models: one of older model code
    is named under the table as read without checking (only the LM runs were, before)."""
    from tests.test_repro_selective import _populate
    top = cache.Ctx(str(tmp_path), "small", (0, 1, 2), render_only=True, keep_stale=False)
    _populate(top)
    mad_top = top.for_size(top.exp.SELECTIVE_MAD[top.size])
    old = [R.state_dir(top, "interdomain", "parity", 1), R.mad_dir(mad_top, "softmax", "in_context_recall", 2),
           top.mqar_dir("s4d_only", 0), top.for_size(top.exp.SELECTIVE_LM["small"][1]).lm_dir("interdomain", "paper", 2)]  # climb96: read there
    for wd in old:
        _age(wd)
    repro_selective.table_selective(top)
    text = open(top.table_path("selective", "md")).read()
    listed = text[text.index("Read without checking"):]
    for wd in old:
        assert os.path.relpath(wd, top.root) in listed, (wd, listed)
    assert sorted(top.unverified) == sorted(os.path.relpath(w, top.root) for w in old)


def test_a_restored_run_is_reused_under_new_model_code_only_when_its_fingerprint_holds(tmp_path, monkeypatch):
    """A finished run without its checkpoint (restored from the record) under other model code: a table command
    reuses it, re-stamped, when the current code reproduces its fingerprint, and trains it again when not."""
    import idattn.eval.state_tracking as st
    from tests.test_repro_selective import _fake_state

    class Retrained(Exception):
        pass

    def no_training(*a, **k):
        raise Retrained

    monkeypatch.setattr(st, "train_state_tracking", no_training)
    monkeypatch.setattr(F, "model_fingerprint", lambda cfg: [1.0, 2.0, 3.0])
    ctx = cache.Ctx(str(tmp_path), "small", (0, 1), render_only=False, keep_stale=False)
    for seed, values in ((0, [1.0, 2.0, 3.0]), (1, [1.0, 2.0, 3.5])):
        _fake_state(ctx, "interdomain", "parity", seed, 0.25)
        _age(R.state_dir(ctx, "interdomain", "parity", seed), values)
    assert R.state_run(ctx, "interdomain", "parity", 0)["scaled"] == 0.25  # same function: read, not trained
    rec = cache.read_marker(R.state_dir(ctx, "interdomain", "parity", 0))
    assert rec["src"] == cache.source_hash() and rec["fingerprint"]["checked"] == cache.source_hash()
    assert "fingerprint under 0ldc0de000" in rec["verified"][-1]
    with pytest.raises(Retrained):  # another function: moved aside and trained again
        R.state_run(ctx, "interdomain", "parity", 1)
    assert os.path.isdir(R.state_dir(ctx, "interdomain", "parity", 1) + ".stale-0ldc0de000")
    # a language model restored without a checkpoint: the fingerprint decides before any re-evaluation is tried
    lm = ctx.for_size("climb96")
    wd = lm.lm_dir("interdomain", "paper", 0)
    cache.write_marker(wd, {"status": "done", "src": cache.source_hash(), "train_src": R.train_code_hash(), "steps": 600,
                        "mixer": "interdomain", "dt": "paper", "seed": 0, "size": "climb96",
                        "recipe": R.size_recipe(lm)})
    _age(wd, [1.0, 2.0, 3.0])
    monkeypatch.setattr(R, "verify_lm", lambda *a: pytest.fail("re-evaluated a run its fingerprint verifies"))
    monkeypatch.setattr(R, "check_corpus", lambda ctx: None)
    assert R.lm_run(lm, "interdomain", "paper", 0)["src"] == cache.source_hash()


def test_a_finished_run_is_stamped_with_its_fingerprint(tmp_path, monkeypatch):
    """A run finishing now carries its fingerprint (no `verify` needed before the next model-code change); a probe
    that fails leaves the run finished and unstamped, and says so."""
    import idattn.eval.state_tracking as st

    def fake_training(cfg, task, **k):
        return {"acc": 0.75, "scaled": 0.5, "num_test": 4, "test_lengths": [40, 256], "loss": 0.3}

    monkeypatch.setattr(st, "train_state_tracking", fake_training)
    probes = []
    monkeypatch.setattr(F, "model_fingerprint", lambda cfg: probes.append(cfg) or [4.0, 5.0])
    ctx = cache.Ctx(str(tmp_path), "small", (0, 2), render_only=False, keep_stale=False)
    for seed in (0, 2):
        assert R.state_run(ctx, "interdomain", "parity", seed)["scaled"] == 0.5
        rec = cache.read_marker(R.state_dir(ctx, "interdomain", "parity", seed))
        assert rec["status"] == "done" and rec["fingerprint"] == F.stamp(cache.source_hash(), [4.0, 5.0])
    assert len(probes) == 1  # one invocation, one config: the seeds share the probe

    def broken_probe(cfg):
        raise RuntimeError("probe broke")

    monkeypatch.setattr(F, "model_fingerprint", broken_probe)
    lines = []
    monkeypatch.setattr(cache, "log", lines.append)
    ctx = cache.Ctx(str(tmp_path), "small", (1,), render_only=False, keep_stale=False)  # a new invocation: no probe cached
    assert R.state_run(ctx, "interdomain", "parity", 1)["scaled"] == 0.5
    rec = cache.read_marker(R.state_dir(ctx, "interdomain", "parity", 1))
    assert rec["status"] == "done" and "fingerprint" not in rec
    assert any("fingerprint was not computed (RuntimeError: probe broke)" in s for s in lines), lines
