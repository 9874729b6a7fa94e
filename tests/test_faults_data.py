"""Data that changed under a run (issue 33, item 7; docs/training.md, "Faults and what survives them").

Prepared folders are written by `python -m idattn.data.prepare` (a subprocess, as a user runs it) from small
corpora the tests write; the trainer is `idattn.train.trainer.run`, in process, on the tiny config (sharing
the JAX compilation cache with tests/test_faults.py). Checked:
- a shard replaced by another corpus's shard with the same record count, or with one byte flipped (same size,
  same record count), is refused at start naming the shard and both SHA-256 / sizes; nothing is written;
- a meta.json whose train_tokens is 100x the shards' is refused (with and without recorded checksums);
- a folder prepared before checksums were recorded still trains and says so once;
- resuming with another data.path is refused (config.json byte-identical, checkpoints untouched) and allowed
  with train.allow_data_change=true, also when the saved data position points past the new corpus's document.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from idattn.rundir.layout import committed_steps
from tests import train_helpers as T

pytestmark = pytest.mark.filterwarnings("ignore")

WORDS = ("in the beginning was the word and light darkness water earth heaven spirit day night evening "
         "morning firmament seas grass herb seed fruit tree").split()
PREPARE = ["--tokenizer=train:512", "--num_proc=0", "--val_fraction=0.2", "--max_val_docs=6", "--min_val_tokens=100",
           "--docs_per_shard=10"]
# the tiny config's run (20 steps, checkpoints 10, 15, 20): the programs tests/test_faults.py compiles
RUN: dict = {}


def _write_corpus(folder, seed: int, n: int, words: int):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"d{i:03d}.txt").write_text(f"document {seed}.{i}: " + " ".join(rng.choice(WORDS, words)))


def _prepare(src, out, env) -> dict:
    proc = subprocess.run([sys.executable, "-m", "idattn.data.prepare", f"--source={src}", f"--out={out}", *PREPARE],
                          cwd=T.REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "meta.json").read_text())


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, env):
    """Two prepared folders with the same tokenizer: `long` (40 documents of 120 words) and `short` (80 of 4
    words: shorter than the packer's position inside a long document)."""
    base = tmp_path_factory.mktemp("corpora")
    _write_corpus(base / "long_texts", 1, 40, 120)
    _write_corpus(base / "short_texts", 2, 80, 4)
    return {"long": (base / "long", _prepare(base / "long_texts", base / "long", env)),
            "short": (base / "short", _prepare(base / "short_texts", base / "short", env))}


def _copy(corpora, name, dest):
    shutil.copytree(corpora[name][0], dest)
    return dest, json.loads((dest / "meta.json").read_text())


def _cfg(path, **kw):
    return T.tiny_config(**{"data.source": "arrayrecord", "data.path": str(path), **RUN, **kw})


def _records(path) -> int:
    from array_record.python.array_record_module import ArrayRecordReader
    r = ArrayRecordReader(str(path))
    try:
        return int(r.num_records())
    finally:
        r.close()


def _flip_byte(path):
    """One bit of a record's compressed bytes (away from the 64 KiB block headers the reader checks on open)."""
    data = bytearray(path.read_bytes())
    i = len(data) // 3
    i += 100 if i % 65536 < 100 else 0
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------------- changed shards
@pytest.mark.parametrize("change", ["other_corpus", "bit_flip"])
def test_changed_shard_with_the_same_record_count_is_refused_before_any_write(tmp_path, corpora, in_process, env,
                                                                              change):
    data, meta = _copy(corpora, "long", tmp_path / "data")
    shard = data / meta["train_shards"][1]
    want = hashlib.sha256(shard.read_bytes()).hexdigest()
    if change == "other_corpus":  # another corpus's shard with as many documents
        other_dir, other_meta = corpora["short"]
        other = other_dir / other_meta["train_shards"][1]
        assert _records(other) == _records(shard) == 10
        shutil.copyfile(other, shard)
        what = (r"its (size is \d+ bytes|SHA-256 is [0-9a-f]{64}), meta\.json recorded (\d+|[0-9a-f]{64}) at "
                r"prepare time")
    else:  # one flipped byte: same size, same record count (check_shards' header read cannot see it)
        size = shard.stat().st_size
        _flip_byte(shard)
        assert shard.stat().st_size == size and _records(shard) == 10
        what = rf"its SHA-256 is [0-9a-f]{{64}}, meta\.json recorded {want} at prepare time"
    wd = tmp_path / "never"
    with pytest.raises(in_process.TrainingError,
                       match=rf"^shard {shard}: {what}; re-prepare the data \(python -m idattn\.data\.prepare "
                             rf"--source=\S+ --out={data} --overwrite --tokenizer=train:512 --val_fraction=0\.2 "
                             rf"--max_val_docs=6 --min_val_tokens=100 --docs_per_shard=10\) or restore the shard$"
                       ) as e:
        in_process.run(_cfg(data), str(wd))
    assert not wd.exists()
    if change == "bit_flip":  # the advice works: the command it names writes the very shards again
        cmd = shlex.split(re.search(r"\((python -m idattn\.data\.prepare .*)\) or restore", str(e.value)).group(1))
        proc = subprocess.run([sys.executable, *cmd[1:]], cwd=T.REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert hashlib.sha256(shard.read_bytes()).hexdigest() == want
        assert json.loads((data / "meta.json").read_text())["shards"] == meta["shards"]


def test_inflated_meta_token_count_is_refused(tmp_path, corpora, in_process):
    data, meta = _copy(corpora, "long", tmp_path / "data")
    real = meta["train_tokens"]
    meta["train_tokens"] = 100 * real
    (data / "meta.json").write_text(json.dumps(meta, indent=2))
    wd = tmp_path / "never"
    with pytest.raises(in_process.TrainingError,
                       match=rf"^data\.path={data}: meta\.json says train_tokens={100 * real} but the train shards "
                             rf"hold {real} tokens"):
        in_process.run(_cfg(data), str(wd))
    assert not wd.exists()


def _as_older_version(data, meta):
    """meta.json as prepare wrote it before it recorded checksums (no "shards" table)."""
    meta = {k: v for k, v in meta.items() if k != "shards"}
    (data / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def test_folder_prepared_before_checksums_trains_and_says_so_once(tmp_path, corpora, in_process, capsys):
    data, meta = _copy(corpora, "long", tmp_path / "data")
    _as_older_version(data, meta)
    summary = in_process.run(_cfg(data), str(tmp_path / "run"))
    assert summary["status"] == "done" and summary["step"] == 20
    out = capsys.readouterr().out
    assert out.count("no checksums recorded (prepared by an older version)") == 1, out[-3000:]
    assert f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens" in out


def test_inflated_meta_of_a_folder_without_checksums_is_refused(tmp_path, corpora, in_process):
    """A small split is counted record by record, so an older folder's inflated count is refused too."""
    data, meta = _copy(corpora, "long", tmp_path / "data")
    meta = _as_older_version(data, meta)
    real = meta["val_tokens"]
    meta["val_tokens"] = 100 * real
    (data / "meta.json").write_text(json.dumps(meta, indent=2))
    with pytest.raises(in_process.TrainingError,
                       match=rf"^data\.path={data}: meta\.json says val_tokens={100 * real} but the val shards hold "
                             rf"{real} tokens"):
        in_process.run(_cfg(data), str(tmp_path / "never"))


# ------------------------------------------------------------------------------------------ another data.path
def test_resume_with_another_data_path_is_refused_unless_allowed(tmp_path, corpora, in_process, caplog):
    wd = tmp_path / "run"
    first = in_process.run(_cfg(corpora["long"][0]), str(wd))
    assert first["step"] == 20 and committed_steps(str(wd)) == [10, 15, 20]
    for step in (15, 20):  # the run resumes mid-document, from step 10
        shutil.rmtree(wd / "checkpoints" / str(step))
    saved = (wd / "config.json").read_bytes()
    other = corpora["short"][0]
    with pytest.raises(in_process.TrainingError) as e:
        in_process.run(_cfg(other), str(wd))
    msg = str(e.value)
    assert "\n" not in msg and f"data.path: saved {str(corpora['long'][0])!r}, now {str(other)!r}" in msg, msg
    assert "--config.train.allow_data_change=true" in msg, msg
    assert (wd / "config.json").read_bytes() == saved and committed_steps(str(wd)) == [10]
    # allowed: the saved data position (inside a long document) continues in the short corpus without a crash
    with caplog.at_level(logging.WARNING, logger="idattn.data.pipeline"):
        done = in_process.run(_cfg(other, **{"train.allow_data_change": True}), str(wd))
    assert "the data changed under the run" in caplog.text  # the position that crashed the packer before
    assert done["status"] == "done" and done["step"] == 20 and committed_steps(str(wd)) == [10, 15, 20]
    assert json.loads((wd / "config.json").read_text())["data"]["path"] == str(other)


# ------------------------------------------------------------------------------- data prepared again in place
def test_data_prepared_again_in_place_is_refused_unless_allowed(tmp_path, corpora, in_process, env):
    """The trial: `prepare --overwrite` into the same data.path with more documents resumed silently (the shard
    checksums agree with the new meta.json): steps 21-40 differed from a straight run and the validation set
    changed. The run records its data by content (identity.json) at its first start."""
    from idattn.rundir import layout
    data, _ = _copy(corpora, "long", tmp_path / "data")
    wd = str(tmp_path / "run")
    T.stop_at(in_process, wd, _cfg(data))
    assert committed_steps(wd) == [5, 10, 15]
    more = tmp_path / "more_texts"
    _write_corpus(more, 3, 50, 120)
    proc = subprocess.run([sys.executable, "-m", "idattn.data.prepare", f"--source={more}", f"--out={data}",
                           *PREPARE, "--overwrite"], cwd=T.REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = lambda: {os.path.relpath(os.path.join(r, p), wd): open(os.path.join(r, p), "rb").read()  # noqa: E731
                     for r, _, fs in os.walk(wd) for p in fs}
    before = files()
    with pytest.raises(in_process.TrainingError, match=rf"refusing to resume .* at step 15: the data at {re.escape(str(data))}"
                       r" is other content \(train, val split\(s\) differ .*allow_data_change=true") as e:
        in_process.run(_cfg(data), wd)
    assert "\n" not in str(e.value)
    assert files() == before  # nothing written
    done = in_process.run(_cfg(data, **{"train.allow_data_change": True}), wd)
    assert done["status"] == "done" and committed_steps(wd)[-1] == 20
    assert [(h["what"], h["step"]) for h in layout.read_identity(wd)["history"]] == [("data", 15)]
