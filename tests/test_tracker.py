"""The Weights & Biases hook (idattn/train/tracker.py), through the trainer, read back from W&B's own offline
writer: its transaction log (`run-<id>.wandb`, LevelDB log records holding W&B's protobuf `Record`s) is parsed here
independently of the tracker, and every metrics.jsonl record must be in it at its step with its values."""
from __future__ import annotations

import glob
import json
import os
import struct
import sys

import pytest

from tests import train_helpers as T

wandb = pytest.importorskip("wandb")


def read_offline_history(run_dir: str) -> tuple[dict[int, dict[str, float]], dict]:
    """({step: {key: value}}, config) from an offline W&B run folder's transaction log."""
    from wandb.proto import wandb_internal_pb2 as pb
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:8]
    block, pos, buf = 32768, 7, b""  # 7: the file header (magic, version)
    history: dict[int, dict[str, float]] = {}
    config: dict = {}
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a record header is zero padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0:
            pos += left - 7
            continue
        buf += data[pos:pos + n]
        pos += n
        if kind not in (1, 4):  # FULL or LAST: the record is complete
            continue
        rec = pb.Record()
        rec.ParseFromString(buf)
        buf = b""
        which = rec.WhichOneof("record_type")
        if which == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            history[int(items["_step"])] = items
        elif which in ("run", "config"):  # the config given to wandb.init comes with the run record
            for u in (rec.run.config if which == "run" else rec.config).update:
                config[u.key or "/".join(u.nested_key)] = json.loads(u.value_json)
    return history, config


def test_offline_wandb_run_holds_every_metrics_record(tmp_path, in_process, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    wd = str(tmp_path / "run")
    in_process.run(T.tiny_config(**{"train.wandb_project": "idattn-test", "train.wandb_mode": "offline"}), wd)
    run_id = open(os.path.join(wd, "wandb_run_id")).read().strip()
    (run_dir,) = glob.glob(os.path.join(wd, "wandb", f"offline-run-*-{run_id}"))
    history, config = read_offline_history(run_dir)
    records = T.read_metrics(wd)
    train = [r for r in records if "loss" in r and "tokens_per_sec" in r]
    assert len(train) >= 2
    for r in train:
        logged = history[r["step"]]
        for k in ("loss", "lr", "grad_norm", "tokens_per_sec"):
            assert logged[f"train/{k}"] == pytest.approx(r[k], rel=1e-12), (r["step"], k)
    final = max(history)
    assert any(k.startswith("validation/") for k in history[final]), history[final]
    assert config["model"]["mixer"] == T.tiny_config().model.mixer
    assert config["train"]["wandb_project"] == "idattn-test"


def test_missing_wandb_is_refused_in_one_line_before_any_write(tmp_path, in_process, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    wd = str(tmp_path / "never")
    with pytest.raises(in_process.TrainingError) as e:
        in_process.run(T.tiny_config(**{"train.wandb_project": "p"}), wd)
    msg = str(e.value)
    assert "config.train.wandb_project='p': needs the wandb package" in msg and "\n" not in msg, msg
    assert 'pip install -e ".[wandb]"' in msg
    assert not os.path.exists(wd)
