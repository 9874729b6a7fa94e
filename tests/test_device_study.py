"""scripts/device_study.py: what comes back from a device is exactly the runs trained there, and merging it into a
record keeps the record's runs and leaves the new ones to be fingerprinted on the CPU host."""
from __future__ import annotations

import importlib.util
import json
import os

from idattn.studies import runcache as cache
from idattn.studies.ladder import _devices_note

_SPEC = importlib.util.spec_from_file_location(
    "device_study", os.path.join(os.path.dirname(__file__), "..", "scripts", "device_study.py"))
DS = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(DS)


def _run(root, size, mixer, seed, **marker):
    wd = os.path.join(root, "runs", size, "lm", f"{mixer}-paper-s{seed}")
    cache.write_marker(wd, dict({"status": "done", "src": "h0", "mixer": mixer, "dt": "paper", "seed": seed,
                             "size": size}, **marker))
    os.makedirs(os.path.join(wd, "eval"), exist_ok=True)
    with open(os.path.join(wd, "eval", "ppl.json"), "w") as f:
        json.dump({"ppl": 20.0 + seed}, f)
    return wd


def test_collect_returns_only_device_runs_and_merge_keeps_the_record(tmp_path, monkeypatch):
    record = str(tmp_path / "record.json")
    old = str(tmp_path / "old")
    _run(old, "climb96", "softmax", 0)  # a CPU-era run: no trained_on
    cache.archive_runs(old, record)
    roots = []
    for seed in (0, 1):  # two jobs, each restored from the record, one finishing a device run
        root = str(tmp_path / f"job{seed}")
        cache.restore_runs(record, root)
        _run(root, "climb192", "softmax", seed, trained_on="gpu:NVIDIA H200",
             fingerprint={"src": "h0", "version": 1, "values": [1.0]})
        _run(root, "climb128", "softmax", seed, trained_on="cpu:cpu")  # e.g. a CPU host's test of the script
        cache.write_marker(os.path.join(root, "runs", "climb192", "lm", f"interdomain-paper-s{seed}"),
                       {"status": "training", "trained_on": "gpu:NVIDIA H200"})  # stopped at the deadline: lost
        roots.append(("job", [], root))
    out = str(tmp_path / "device-runs.json")
    assert DS.collect(roots, out) == 2
    got = json.load(open(out))["runs"]
    assert sorted(got) == ["runs/climb192/lm/softmax-paper-s0", "runs/climb192/lm/softmax-paper-s1"]

    DS.merge(out, record)
    runs = json.load(open(record))["runs"]
    assert sorted(runs) == ["runs/climb192/lm/softmax-paper-s0", "runs/climb192/lm/softmax-paper-s1",
                            "runs/climb96/lm/softmax-paper-s0"]
    marker = json.loads(runs["runs/climb192/lm/softmax-paper-s1"]["repro.json"])
    assert marker["trained_on"] == "gpu:NVIDIA H200" and "fingerprint" not in marker  # stamped on the CPU later
    assert json.loads(runs["runs/climb192/lm/softmax-paper-s1"]["eval/ppl.json"]) == {"ppl": 21.0}


def test_jobs_and_the_ladder_note():
    todo = DS.jobs("climb", ["softmax", "s4d_only"], [0, 3], "/tmp/x")
    assert [n for n, _, _ in todo] == ["climb-softmax-s0", "climb-softmax-s3", "climb-s4d_only-s0",
                                       "climb-s4d_only-s3"]
    assert todo[3][1][-2:] == ["--only=s4d_only", "--seeds=3"] and todo[3][2] == "/tmp/x/climb-s4d_only-s3"
    assert _devices_note([{"size": "climb96", "trained_on": ["cpu:cpu"]}]) == ""  # an all-CPU table is unchanged
    note = _devices_note([{"size": "climb96", "trained_on": ["cpu:cpu"]},
                          {"size": "climb192", "trained_on": ["gpu:NVIDIA H200"]}])
    assert "climb96 cpu" in note and "climb192 NVIDIA H200" in note and "not one budget" in note


def test_a_record_under_other_model_code_is_refused(tmp_path):
    root, record = str(tmp_path / "r"), str(tmp_path / "rec.json")
    _run(root, "climb96", "softmax", 0, src=cache.source_hash())
    cache.archive_runs(root, record)
    assert DS.stale_runs(record) == []
    _run(root, "climb96", "softmax", 1, src="0ldc0de000")  # trained before a model-code edit, not re-verified
    cache.archive_runs(root, record)
    assert DS.stale_runs(record) == ["runs/climb96/lm/softmax-paper-s1"]


def test_preflight_names_the_missing_module_and_wheels_pin_this_hosts_versions(monkeypatch):
    """A job environment that cannot import what the jobs need is refused with the import's own error line, before
    any job starts; the device's wheels are pinned to the versions installed here (what the suite tests)."""
    from importlib.metadata import version
    monkeypatch.setattr(DS, "PREFLIGHT", ("json", "idattn_no_such_module"))
    err = DS.preflight(DS.job_env())
    assert err is not None and "idattn_no_such_module" in err, err
    monkeypatch.setattr(DS, "PREFLIGHT", ("json", "idattn.studies.repro_runs"))
    assert DS.preflight(DS.job_env()) is None
    (name, job, root), = DS.jobs("selective", ["interdomain-selective"], [2], "/s", tasks="mqar,lm")
    assert name == "selective-interdomain-selective-s2" and root == "/s/selective-interdomain-selective-s2"
    assert job[-3:] == ["--only=interdomain-selective", "--seeds=2", "--tasks=mqar,lm"], job
    argv = DS.wheels("/tmp/w")
    assert f"flax=={version('flax')}" in argv and f"orbax-checkpoint=={version('orbax-checkpoint')}" in argv
    assert argv[argv.index("--python-version") + 1] == "3.12" and argv[argv.index("-d") + 1] == "/tmp/w"
