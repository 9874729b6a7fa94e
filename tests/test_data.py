"""Tokenizers, the embedded KJV corpus, and `idattn.data.prepare` (parquet -> ArrayRecord) with its refusals."""
from __future__ import annotations

import hashlib
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sentencepiece as spm

from idattn.data import corpus, formats, prepare
from idattn.data import tokenizer as tokmod
from idattn.data.tokenizer import Tokenizer, load_tokenizer, train_sentencepiece


@pytest.fixture(scope="module")
def kjv():
    return corpus.kjv_documents()


@pytest.fixture(scope="module")
def small_tok(kjv):
    return Tokenizer(train_sentencepiece(kjv[0][:8], 400), name="small400")


@pytest.fixture(scope="module")
def other_tok(kjv):
    return Tokenizer(train_sentencepiece(kjv[0][8:16], 384), name="small384")


# ---------------------------------------------------------------------------------------------- tokenizers

def test_mistral_tokenizer_matches_sentencepiece_and_identity():
    tok = load_tokenizer("mistral")
    path = tokmod.mistral_model_path()
    ref = spm.SentencePieceProcessor(model_file=str(path))
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (32000, 1, 2, 0)  # Llama-2 layout
    assert tok.id_to_piece(1) == "<s>" and tok.id_to_piece(2) == "</s>"
    text = "In the beginning God created the heaven and the earth.\nAnd the earth was without form, 1611."
    assert tok.encode(text) == ref.encode(text)
    assert tok.decode(tok.encode(text)) == text
    ident = tok.identity()
    assert ident == {"vocab_size": 32000, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def test_trained_tokenizer_round_trip_cache_and_path(tmp_path, monkeypatch, small_tok):
    tok = load_tokenizer("train:420", cache_dir=tmp_path)
    assert tok.vocab_size == 420 and (tok.bos_id, tok.eos_id) == (1, 2)
    text = "And God said, Let there be light:\n\n  there was light 1234. Ünïcödé ☃ \t end"
    ids = tok.encode(text)
    assert 1 not in ids and 2 not in ids  # specials are the packer's job
    assert tok.decode(ids) == text  # identity normalisation + byte fallback: exact
    cached = list(tmp_path.glob("*.model"))
    assert len(cached) == 1
    # second load must come from the cache, not train again
    monkeypatch.setattr(tokmod, "train_sentencepiece", lambda *a, **k: pytest.fail("retrained"))
    again = load_tokenizer("train:420", cache_dir=tmp_path)
    assert again.identity() == tok.identity()
    # a .model path loads the same model
    by_path = load_tokenizer(str(cached[0]))
    assert by_path.identity() == tok.identity() and by_path.encode(text) == ids
    assert small_tok.identity() != tok.identity()


_TRAIN_ON_A_HOST = r"""
import hashlib, os, sys
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:int(sys.argv[1])])  # this host's cores
from idattn.data import corpus
from idattn.data.tokenizer import train_sentencepiece
print(len(os.sched_getaffinity(0)), hashlib.sha256(train_sentencepiece(corpus.kjv_documents()[0][:4], 384)).hexdigest())
"""


def test_train_sentencepiece_is_deterministic_across_hosts(kjv):
    """Hosts training "train:<vocab>" agree: two subprocesses standing in for two hosts (one core and one BLAS/
    OpenMP thread against every core of this machine and as many threads, different hash seeds) train
    byte-identical models, identical to this process's."""
    import os
    import subprocess
    import sys

    want = hashlib.sha256(train_sentencepiece(kjv[0][:4], 384)).hexdigest()
    cores = len(os.sched_getaffinity(0))
    got = []
    for n, seed in ((1, "1"), (cores, "2")):
        env = dict(os.environ, OMP_NUM_THREADS=str(n), OPENBLAS_NUM_THREADS=str(n), PYTHONHASHSEED=seed,
                   PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]))
        out = subprocess.run([sys.executable, "-c", _TRAIN_ON_A_HOST, str(n)], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        ncpu, sha = out.stdout.split()
        assert int(ncpu) == n
        got.append(sha)
    assert got == [want, want], (got, want)


def test_train_sentencepiece_writes_model_file(tmp_path, kjv):
    proto = train_sentencepiece(kjv[0][:3], 384, model_prefix=tmp_path / "m")
    assert (tmp_path / "m.model").read_bytes() == proto
    sp = spm.SentencePieceProcessor(model_proto=proto)
    assert sp.vocab_size() == 384
    with pytest.raises(ValueError, match="vocab_size=290 is below"):
        train_sentencepiece(kjv[0][:3], 290)


@pytest.mark.parametrize("spec,match", [
    ("train:abc", "integer vocabulary"),
    ("train:10", "vocab_size"),
    ("/nonexistent/x.model", "no such file"),
    ("", "expected 'mistral'"),
])
def test_tokenizer_spec_errors(spec, match, tmp_path):
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        load_tokenizer(spec, cache_dir=tmp_path)


def test_tokenizer_rejects_non_model_bytes(tmp_path):
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a sentencepiece model")
    with pytest.raises(ValueError, match="not a valid SentencePiece model"):
        load_tokenizer(str(bad))


# ---------------------------------------------------------------------------------------------- corpus

def test_kjv_corpus_split(kjv):
    train, val = kjv
    ids_train, ids_val = corpus.kjv_document_ids()
    assert len(train) == len(ids_train) and len(val) == len(ids_val)
    n = len(train) + len(val)
    assert 150 < n < 600 and len(val) == int(np.ceil(0.05 * n))
    assert not set(ids_train) & set(ids_val) and not set(train) & set(val)
    words = sum(len(d.split()) for d in train + val)
    assert 750_000 < words < 850_000  # the KJV has ~790K words
    assert "In the beginning God created the heaven and the earth." in train[0]
    assert all("[" not in d and "]" not in d for d in train + val)
    # Revelation's last verse is in whichever split holds the last document
    assert sum("be with you all. Amen." in d for d in train + val) >= 1
    # deterministic and nested: a larger fraction holds out a superset
    t2, v2 = corpus.kjv_documents(val_fraction=0.1)
    assert set(val) <= set(v2) and corpus.corpus_hash(train + val) == corpus.corpus_hash(
        [d for d in corpus.kjv_documents()[0]] + corpus.kjv_documents()[1])
    assert corpus.kjv_documents(val_fraction=0.0)[1] == []
    with pytest.raises(ValueError, match="val_fraction"):
        corpus.kjv_documents(val_fraction=1.5)


# ---------------------------------------------------------------------------------------------- prepare

def _texts(kjv, n=60):
    paras = [p for d in kjv[0][:6] for p in d.split("\n") if p.strip()]
    return [f"Document {i}. {paras[i % len(paras)]}" for i in range(n)]


def _write_parquet(folder: pathlib.Path, texts_per_file):
    folder.mkdir(parents=True, exist_ok=True)
    for i, texts in enumerate(texts_per_file):
        pq.write_table(pa.table({"text": texts, "id": [f"{i}-{j}" for j in range(len(texts))]}),
                       folder / f"{i:03d}_00000.parquet")


def _read_split(out, meta, split):
    import grain
    src = grain.sources.ArrayRecordDataSource(formats.shard_paths(out, meta, split))
    return [np.frombuffer(src[i], meta["dtype"]).astype(np.int64).tolist() for i in range(len(src))]


def _reference_split(tok, texts, val_fraction, max_val_docs):
    """Independent re-statement of the held-out rule: sha1(text)[:8] as a fraction of 2^64."""
    train, val = [], []
    for t in texts:
        if not t:
            continue
        u = int.from_bytes(hashlib.sha1(t.encode()).digest()[:8], "little") / 2**64
        (val if u < val_fraction and len(val) < max_val_docs else train).append(tok.encode(t))
    return train, val


def _snapshot(folder: pathlib.Path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("num_proc", [0, 2])
def test_prepare_round_trip(tmp_path, kjv, small_tok, num_proc):
    texts = _texts(kjv)
    files = [texts[:25] + ["", None], texts[25:]]  # empty/None texts are skipped
    _write_parquet(tmp_path / "src", files)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # spawned workers: no "os.fork() was called ... JAX" warning
        meta = prepare.prepare(str(tmp_path / "src"), str(tmp_path / "out"), tokenizer=small_tok, val_fraction=0.2,
                               max_val_docs=8, docs_per_shard=20, num_proc=num_proc, batch_docs=7,
                               log=lambda s: None, min_val_docs=1, min_val_tokens=1)  # the rule alone meets these
    ref_train, ref_val = _reference_split(small_tok, texts, 0.2, 8)
    assert 0 < len(ref_val) <= 8
    assert _read_split(tmp_path / "out", meta, "train") == ref_train
    assert _read_split(tmp_path / "out", meta, "val") == ref_val
    on_disk = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert on_disk == meta
    assert meta["dtype"] == "uint16" and meta["tokenizer"]["sha256"] == small_tok.identity()["sha256"]
    assert meta["train_docs"] == len(ref_train) and meta["train_tokens"] == sum(map(len, ref_train))
    assert meta["val_docs"] == len(ref_val) and meta["val_tokens"] == sum(map(len, ref_val))
    assert len(meta["train_shards"]) == -(-len(ref_train) // 20)
    # a staging folder of a killed run (dead pid) is cleaned up by the next run
    (tmp_path / "out" / ".prepare-staging-999999999").mkdir()
    prepare.prepare(str(tmp_path / "src"), str(tmp_path / "out"), tokenizer=small_tok, val_fraction=0.2,
                    max_val_docs=8, docs_per_shard=20, num_proc=0, batch_docs=7, log=lambda s: None, overwrite=True,
                    min_val_docs=1, min_val_tokens=1)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        meta["train_shards"] + meta["val_shards"] + ["meta.json", "train_hashes.npy", "val_hashes.npy"])  # no staging
    formats.check_tokenizer_matches(tmp_path / "out", small_tok)
    # the document hashes (sha1[:8], little-endian uint64): train sorted, val in record order, recomputed here
    h = {t: int.from_bytes(hashlib.sha1(t.encode()).digest()[:8], "little") for t in texts}
    val_texts = [t for t in texts if h[t] / 2**64 < 0.2][:8]
    assert formats.read_doc_hashes(tmp_path / "out", "train").tolist() == sorted(h[t] for t in texts
                                                                                 if t not in val_texts)
    assert formats.read_doc_hashes(tmp_path / "out", "val").tolist() == [h[t] for t in val_texts]


def _wide_tokenizer(small_tok, vocab_size: int) -> Tokenizer:
    """small_tok's model with user-defined pieces <w{id}> appended up to `vocab_size` (SentencePiece always
    segments a user-defined piece as itself, so a text holding "<w70000>" encodes to id 70000)."""
    from sentencepiece import sentencepiece_model_pb2 as mp

    m = mp.ModelProto.FromString(small_tok.model_proto)
    for i in range(len(m.pieces), vocab_size):
        p = m.pieces.add()
        p.piece, p.score, p.type = f"<w{i}>", 0.0, mp.ModelProto.SentencePiece.USER_DEFINED
    return Tokenizer(m.SerializeToString(), name=f"wide{vocab_size}")


def test_prepare_int32_shards_for_a_vocabulary_over_65536(tmp_path, kjv, small_tok):
    """A vocabulary of 70,000 pieces: prepare writes int32 shards (meta.json says so, 4 bytes a token) and the
    training pipeline's reader gives back every document's ids exactly, ids past 65,535 included (in uint16
    they would not fit: 65,536 would read back as 0)."""
    import ml_collections

    from idattn.data import pipeline

    tok = _wide_tokenizer(small_tok, 70_000)
    assert tok.vocab_size == 70_000
    high = [65_535, 65_536, 65_537, 69_999]
    assert [tok.encode(f"<w{i}>")[-1] for i in high] == high
    texts = [f"{t} <w{high[i % 4]}> <w{66_000 + i}>" for i, t in enumerate(_texts(kjv, 40))]
    _write_parquet(tmp_path / "src", [texts])
    meta = prepare.prepare(str(tmp_path / "src"), str(tmp_path / "out"), tokenizer=tok, val_fraction=0.2,
                           max_val_docs=8, docs_per_shard=16, num_proc=0, log=lambda s: None, min_val_docs=1,
                           min_val_tokens=1)
    assert meta["dtype"] == "int32"
    ref_train, ref_val = _reference_split(tok, texts, 0.2, 8)
    assert max(max(d) for d in ref_train) >= 65_536 and ref_val
    table = formats.shard_table(meta)
    assert sum(r["tokens"] for n, r in table.items() if n in meta["train_shards"]) == sum(map(len, ref_train))
    assert sum(r["bytes"] for r in table.values()) >= 4 * (meta["train_tokens"] + meta["val_tokens"])
    cfg = ml_collections.ConfigDict(dict(source="arrayrecord", path=str(tmp_path / "out")))
    for split, ref in (("train", ref_train), ("val", ref_val)):
        ds, _ = pipeline._doc_dataset(cfg, tok, split)
        got = [np.asarray(ds[i]).tolist() for i in range(len(ds))]
        assert got == ref, split


@pytest.mark.parametrize("promote", [False, True])
def test_prepare_records_every_shards_checksum(tmp_path, kjv, small_tok, promote):
    """meta.json's "shards" table holds each shard file's true record count, token count, size and SHA-256
    (recomputed here from the files as moved into place), also when the held-out guarantee rewrote the training
    shards; the split totals are its sums."""
    from array_record.python.array_record_module import ArrayRecordReader
    _write_parquet(tmp_path / "src", [_texts(kjv)])
    meta = prepare.prepare(str(tmp_path / "src"), str(tmp_path / "out"), tokenizer=small_tok, val_fraction=0.05,
                           docs_per_shard=16, num_proc=0, log=lambda s: None, min_val_docs=1,
                           min_val_tokens=2000 if promote else 1)
    assert (meta["val_promoted"] > 0) == promote
    table = formats.shard_table(meta)
    assert sorted(table) == sorted(meta["train_shards"] + meta["val_shards"])
    for split in ("train", "val"):
        for name in meta[f"{split}_shards"]:
            path = tmp_path / "out" / name
            r = ArrayRecordReader(str(path))
            recs = r.read(list(range(r.num_records())))
            r.close()
            assert table[name] == {"records": len(recs), "tokens": sum(len(x) for x in recs) // 2,
                                   "bytes": path.stat().st_size,
                                   "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}, name
        assert sum(table[n]["tokens"] for n in meta[f"{split}_shards"]) == meta[f"{split}_tokens"]
        assert sum(table[n]["records"] for n in meta[f"{split}_shards"]) == meta[f"{split}_docs"]


def test_prepare_max_docs_and_cli(tmp_path, kjv, small_tok, capsys):
    _write_parquet(tmp_path / "src", [_texts(kjv)])
    model = tmp_path / "tok.model"
    model.write_bytes(small_tok.model_proto)
    rc = prepare.main(["--source", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "--tokenizer",
                       str(model), "--val_fraction", "0", "--max_docs", "10", "--num_proc", "0"])
    assert rc == 0
    meta = formats.read_meta(tmp_path / "out")
    assert meta["train_docs"] == 10 and meta["val_docs"] == 0 and meta["source"]["stopped_early"]
    assert _read_split(tmp_path / "out", meta, "train") == [small_tok.encode(t) for t in _texts(kjv)[:10]]
    rc = prepare.main(["--source", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o2"),
                       "--tokenizer", str(model)])
    assert rc == 2 and "no such file or folder" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()


def _corrupt(folder):
    folder.mkdir(parents=True)
    good = pa.table({"text": ["fine text"]})
    pq.write_table(good, folder / "a.parquet")
    raw = (folder / "a.parquet").read_bytes()
    (folder / "b.parquet").write_bytes(raw[: len(raw) // 2])  # truncated: footer gone


def _empty(folder):
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["fine text"]}), folder / "a.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), folder / "b.parquet")


def _no_text(folder):
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"content": ["x"]}), folder / "a.parquet")


@pytest.mark.parametrize("make,match", [(_corrupt, "corrupt"), (_empty, "empty"), (_no_text, "no 'text' column")])
def test_prepare_refuses_bad_shards_and_keeps_existing_data(tmp_path, kjv, small_tok, make, match):
    out = tmp_path / "out"
    _write_parquet(tmp_path / "good", [_texts(kjv, 12)])
    prepare.prepare(str(tmp_path / "good"), str(out), tokenizer=small_tok, min_val_tokens=1, num_proc=0, log=lambda s: None)
    before = _snapshot(out)
    make(tmp_path / "bad")
    with pytest.raises(prepare.PrepareError, match=match):
        prepare.prepare(str(tmp_path / "bad"), str(out), tokenizer=small_tok, min_val_tokens=1, num_proc=0, overwrite=True,
                        log=lambda s: None)
    assert _snapshot(out) == before
    with pytest.raises(prepare.PrepareError, match=match):  # into a fresh folder: nothing created either
        prepare.prepare(str(tmp_path / "bad"), str(tmp_path / "fresh"), tokenizer=small_tok, min_val_tokens=1, num_proc=0,
                        log=lambda s: None)
    assert not (tmp_path / "fresh").exists() or not any((tmp_path / "fresh").iterdir())


def test_prepare_refuses_other_tokenizer_and_unflagged_overwrite(tmp_path, kjv, small_tok, other_tok):
    out = tmp_path / "out"
    _write_parquet(tmp_path / "src", [_texts(kjv, 12)])
    prepare.prepare(str(tmp_path / "src"), str(out), tokenizer=small_tok, min_val_tokens=1, num_proc=0, log=lambda s: None)
    before = _snapshot(out)
    for kw in ({}, {"overwrite": True}):
        with pytest.raises(prepare.PrepareError, match="already holds data tokenised with 'small400'"):
            prepare.prepare(str(tmp_path / "src"), str(out), tokenizer=other_tok, min_val_tokens=1, num_proc=0, log=lambda s: None,
                            **kw)
        assert _snapshot(out) == before
    with pytest.raises(prepare.PrepareError, match="--overwrite"):
        prepare.prepare(str(tmp_path / "src"), str(out), tokenizer=small_tok, min_val_tokens=1, num_proc=0, log=lambda s: None)
    assert _snapshot(out) == before
    # the pipeline's check names both tokenizers
    with pytest.raises(ValueError, match="Tokenizer mismatch.*small400.*small384"):
        formats.check_tokenizer_matches(out, other_tok)
    # a folder with foreign files is refused
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(prepare.PrepareError, match="holds no meta.json"):
        prepare.prepare(str(tmp_path / "src"), str(tmp_path / "foreign"), tokenizer=small_tok, min_val_tokens=1, num_proc=0)
    # overwrite with the same tokenizer replaces the data
    _write_parquet(tmp_path / "src2", [_texts(kjv, 5)])
    meta = prepare.prepare(str(tmp_path / "src2"), str(out), tokenizer=small_tok, min_val_tokens=1, num_proc=0, overwrite=True,
                           val_fraction=0.0, log=lambda s: None)
    assert meta["train_docs"] == 5 and formats.read_meta(out)["train_docs"] == 5


def test_read_meta_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a prepared data folder"):
        formats.read_meta(tmp_path)
    (tmp_path / "train-00000.array_record").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="interrupted prepare"):
        formats.read_meta(tmp_path)
    (tmp_path / "meta.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="format='other'"):
        formats.read_meta(tmp_path)


def test_hub_subset_mapping():
    assert prepare._hf_subset_dir("sample-10BT") == "sample/10BT"
    assert prepare._hf_subset_dir("sample-100BT") == "sample/100BT"
    assert prepare._hf_subset_dir("default") == "data"
    assert prepare._hf_subset_dir("CC-MAIN-2024-10") == "data/CC-MAIN-2024-10"
    assert prepare._is_hub_id("HuggingFaceFW/fineweb-edu")
    assert not prepare._is_hub_id("./data/x") and not prepare._is_hub_id("gs://b/p")


def _memory_fs_with(paths_texts):
    import fsspec
    fs = fsspec.filesystem("memory")
    for path, texts in paths_texts.items():
        with fs.open(path, "wb") as f:
            pq.write_table(pa.table({"text": texts}), f)
    return fs


def test_prepare_from_fsspec_url(tmp_path, kjv, small_tok):
    """The bucket path (gs://...) goes through fsspec; memory:// exercises the same code without network."""
    texts = _texts(kjv, 20)
    fs = _memory_fs_with({"/idattn-test/fw/b.parquet": texts[10:], "/idattn-test/fw/a.parquet": texts[:10]})
    try:
        meta = prepare.prepare("memory://idattn-test/fw", str(tmp_path / "out"), tokenizer=small_tok,
                               val_fraction=0.0, num_proc=0, log=lambda s: None)
    finally:
        fs.rm("/idattn-test", recursive=True)
    assert [pathlib.PurePosixPath(f).name for f in meta["source"]["files"]] == ["a.parquet", "b.parquet"]
    assert _read_split(tmp_path / "out", meta, "train") == [small_tok.encode(t) for t in texts]


def test_prepare_from_hub_id_with_subset(tmp_path, kjv, small_tok, monkeypatch):
    """A hub id + subset lists `datasets/<repo>/<subset folder>` through HfFileSystem (faked: no network)."""
    import sys
    import types
    texts = _texts(kjv, 8)
    fs = _memory_fs_with({"/datasets/HuggingFaceFW/fineweb-edu/sample/10BT/000_00000.parquet": texts,
                          "/datasets/HuggingFaceFW/fineweb-edu/sample/100BT/000_00000.parquet": ["wrong"]})
    fake = types.ModuleType("huggingface_hub")
    fake.HfFileSystem = lambda: fs
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    try:
        meta = prepare.prepare("HuggingFaceFW/fineweb-edu", str(tmp_path / "out"), subset="sample-10BT",
                               tokenizer=small_tok, val_fraction=0.0, num_proc=0, log=lambda s: None)
    finally:
        fs.rm("/datasets", recursive=True)
    assert meta["source"]["subset"] == "sample-10BT" and len(meta["source"]["files"]) == 1
    assert _read_split(tmp_path / "out", meta, "train") == [small_tok.encode(t) for t in texts]


# ---------------------------------------------------------------------------------------------- own data

def _docs(n, seed=0, words=40):
    rng = np.random.default_rng(seed)
    vocab = ("the grass is green and the sky is blue while rivers run to the sea under a yellow sun we go "
             "there and back again").split()
    return [f"Doc {i}: " + " ".join(rng.choice(vocab, words)) + "." for i in range(n)]


def test_prepare_plain_text_jsonl_and_globs(tmp_path, small_tok):
    """Plain text (one document per file, or cut at a separator), JSON Lines (.jsonl, .jsonl.gz, another field)
    and glob patterns all give the documents written by hand, tokenised, in file order."""
    import gzip
    docs = _docs(12)
    (tmp_path / "txt").mkdir()
    for i, d in enumerate(docs[:6]):
        (tmp_path / "txt" / f"{i:02d}.txt").write_text(d)
    (tmp_path / "txt" / ".hidden").write_text("never read")
    (tmp_path / "sep.txt").write_text("\n<|endoftext|>\n".join(docs[6:]))
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(docs[:4])))
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps({"body": d}) + "\n" for d in docs[4:]))
    kw = dict(tokenizer=small_tok, val_fraction=0.0, log=lambda s: None)
    meta = prepare.prepare(str(tmp_path / "txt"), str(tmp_path / "o1"), num_proc=0, **kw)
    assert _read_split(tmp_path / "o1", meta, "train") == [small_tok.encode(d) for d in docs[:6]]
    assert meta["source"]["format"] == ["text"]
    meta = prepare.prepare(str(tmp_path / "sep.txt"), str(tmp_path / "o2"), separator="\\n<|endoftext|>\\n",
                           num_proc=0, **kw)
    assert _read_split(tmp_path / "o2", meta, "train") == [small_tok.encode(d) for d in docs[6:]]
    meta = prepare.prepare(str(tmp_path / "*.jsonl*"), str(tmp_path / "o3"), text_field="body", num_proc=0, **kw)
    assert _read_split(tmp_path / "o3", meta, "train") == [small_tok.encode(d) for d in docs]
    with pytest.raises(prepare.PrepareError, match="no field 'text'.*--text_field"):
        prepare.prepare(str(tmp_path / "a.jsonl"), str(tmp_path / "o4"), num_proc=0, **kw)
    assert not (tmp_path / "o4").exists()


def test_prepare_csv_tsv_and_saved_datasets_folders(tmp_path, small_tok, capsys):
    """CSV and TSV (a named column; quoted cells holding newlines, the delimiter and doubled quotes), Arrow files
    and a folder laid out as Hugging Face `datasets` save_to_disk writes it (state.json listing its Arrow stream
    files; a DatasetDict's dataset_dict.json and one folder per split), through prepare's command line: the
    documents written by hand, tokenised, in order; a missing column refused in one line naming the columns."""
    import csv

    import pyarrow as pa

    docs = _docs(9)
    docs[1] = 'He said, "go on,\nthen"\n\nand left; a cell with "quotes", commas\tand a tab.'
    (tmp_path / "model.model").write_bytes(small_tok.model_proto)
    for name, delim in (("d.csv", ","), ("d.tsv", "\t")):
        with open(tmp_path / name, "w", newline="") as f:
            w = csv.writer(f, delimiter=delim)
            w.writerow(["id", "description"])
            w.writerows([i, d] for i, d in enumerate(docs))

    def write_dataset(folder, texts, shards=2):  # the save_to_disk layout: Arrow IPC streams + state.json
        folder.mkdir(parents=True)
        names = [f"data-{k:05d}-of-{shards:05d}.arrow" for k in range(shards)]
        cut = (len(texts) + 1) // 2
        for name, part in zip(names, (texts[:cut], texts[cut:])):
            table = pa.table({"description": part, "n": list(range(len(part)))})
            with pa.ipc.new_stream(str(folder / name), table.schema) as w:
                w.write_table(table)
        (folder / "dataset_info.json").write_text("{}")
        (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names]}))

    write_dataset(tmp_path / "saved", docs)
    (tmp_path / "dict").mkdir()
    write_dataset(tmp_path / "dict" / "train", docs[:5])
    write_dataset(tmp_path / "dict" / "test", docs[5:])
    (tmp_path / "dict" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))

    def run(source, out, *extra):
        rc = prepare.main(["--source", str(source), "--out", str(tmp_path / out), "--tokenizer",
                           str(tmp_path / "model.model"), "--val_fraction=0", "--num_proc=0", *extra])
        return rc, capsys.readouterr().err.strip()

    for source, out, want in (("d.csv", "o_csv", docs), ("d.tsv", "o_tsv", docs), ("saved", "o_saved", docs),
                              ("dict", "o_dict", docs[:5])):
        rc, err = run(tmp_path / source, out, "--text_field=description")
        assert rc == 0, err
        meta = json.load(open(tmp_path / out / "meta.json"))
        assert _read_split(tmp_path / out, meta, "train") == [small_tok.encode(d) for d in want], source
    rc, err = run(tmp_path / "d.csv", "o_bad")  # the default field "text" is not a column
    assert rc == 2 and len(err.splitlines()) == 1 and "no column 'text'" in err and "'description'" in err, err
    assert "--text_field" in err and not (tmp_path / "o_bad").exists()
    rc, err = run(tmp_path / "saved", "o_bad2")
    assert rc == 2 and "no column 'text'" in err and "'description'" in err and not (tmp_path / "o_bad2").exists()


def test_prepare_unknown_format_refused_before_writing(tmp_path, small_tok, capsys):
    (tmp_path / "data.xlsx").write_text("a,b\n1,2\n")
    (tmp_path / "model.model").write_bytes(small_tok.model_proto)
    rc = prepare.main(["--source", str(tmp_path / "data.xlsx"), "--out", str(tmp_path / "out"), "--tokenizer",
                       str(tmp_path / "model.model")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "unknown format" in err and ".txt" in err and ".jsonl.gz" in err and ".parquet" in err and "--format" in err
    assert not (tmp_path / "out").exists()
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "x.xlsx").write_text("1")
    with pytest.raises(prepare.PrepareError, match="no file of an accepted format"):
        prepare.prepare(str(tmp_path / "folder"), str(tmp_path / "out"), tokenizer=small_tok, num_proc=0)
    assert not (tmp_path / "out").exists()


def test_prepare_guarantees_validation_split(tmp_path, small_tok):
    """A corpus too small for the hash rule to hold anything out: the training documents of smallest
    sha1 fraction (recomputed here) move to the held-out split until both minimums hold."""
    docs = _docs(30, words=30)
    (tmp_path / "src").mkdir()
    for i, d in enumerate(docs):
        (tmp_path / "src" / f"{i:02d}.txt").write_text(d)
    meta = prepare.prepare(str(tmp_path / "src"), str(tmp_path / "out"), tokenizer=small_tok, val_fraction=0.0005,
                           min_val_docs=3, min_val_tokens=300, docs_per_shard=7, num_proc=0, log=lambda s: None)
    u = {d: int.from_bytes(hashlib.sha1(d.encode()).digest()[:8], "little") / 2**64 for d in docs}
    assert min(u.values()) >= 0.0005  # the rule alone holds out nothing
    order = sorted(docs, key=u.get)
    k, toks = 0, 0
    while k < 3 or toks < 300:
        toks += len(small_tok.encode(order[k]))
        k += 1
    val = set(order[:k])
    assert meta["val_docs"] == k and meta["val_tokens"] == toks and meta["val_promoted"] == k
    assert sorted(map(tuple, _read_split(tmp_path / "out", meta, "val"))) == sorted(
        tuple(small_tok.encode(d)) for d in val)
    assert _read_split(tmp_path / "out", meta, "train") == [small_tok.encode(d) for d in docs if d not in val]
    # too small: refused with the numbers, nothing written
    with pytest.raises(prepare.PrepareError, match=r"the corpus has 30 documents / \d+ tokens.*--min_val_tokens"):
        prepare.prepare(str(tmp_path / "src"), str(tmp_path / "o2"), tokenizer=small_tok, min_val_tokens=10**6,
                        num_proc=0, log=lambda s: None)
    assert not (tmp_path / "o2").exists()


def test_tokenizer_cli_and_prepare_train_tokenizer_agree(tmp_path):
    """`python -m idattn.data.prepare tokenizer` and `prepare --train_tokenizer` train the same model, on the
    training documents only (the held-out ones never reach it), with the project's settings."""
    from idattn.data.prepare import main, tokenizer_main  # the code of `python -m idattn.data.prepare tokenizer`
    docs = _docs(40, seed=1)
    (tmp_path / "src").mkdir()
    for i, d in enumerate(docs):
        (tmp_path / "src" / f"{i:02d}.txt").write_text(d)
    held = [d for d in docs if int.from_bytes(hashlib.sha1(d.encode()).digest()[:8], "little") / 2**64 < 0.2]
    assert held
    assert main(["tokenizer", f"--source={tmp_path / 'src'}", "--vocab=300", f"--out={tmp_path / 't.model'}",
                 "--val_fraction=0.2"]) == 0
    ref = train_sentencepiece([d for d in docs if d not in held], 300)
    assert (tmp_path / "t.model").read_bytes() == ref
    meta = prepare.prepare(str(tmp_path / "src"), str(tmp_path / "out"), train_tokenizer=300, val_fraction=0.2,
                           min_val_docs=1, min_val_tokens=1, num_proc=0, log=lambda s: None)
    assert (tmp_path / "out" / "tokenizer.model").read_bytes() == ref
    tok = load_tokenizer(str(tmp_path / "out" / "tokenizer.model"))
    formats.check_tokenizer_matches(tmp_path / "out", tok)
    assert meta["tokenizer"]["vocab_size"] == 300 and meta["val_docs"] == len(held)
    assert tokenizer_main([f"--source={tmp_path / 'src'}", "--vocab=300", f"--out={tmp_path / 't.model'}"]) == 2


def test_the_old_tokenizer_command_names_the_new_one():
    """`python -m idattn.data.tokenizer train ...` (the command before it moved to prepare, which reads the inputs:
    tokenizer.py imports nothing back) refuses, naming `python -m idattn.data.prepare tokenizer`."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-m", "idattn.data.tokenizer", "train", "--vocab=300"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "python -m idattn.data.prepare tokenizer --source=" in out.stderr, out.stderr


def test_check_splits_refuses_missing_split(tmp_path, small_tok):
    import ml_collections

    from idattn.data import pipeline
    docs = _docs(6)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    prepare.prepare(str(tmp_path / "a.jsonl"), str(tmp_path / "out"), tokenizer=small_tok, val_fraction=0.0,
                    num_proc=0, log=lambda s: None)
    cfg = ml_collections.ConfigDict({"source": "arrayrecord", "path": str(tmp_path / "out")})
    pipeline.check_splits(cfg, small_tok, ("train",))
    with pytest.raises(ValueError, match="val split is empty.*--val_fraction > 0"):
        pipeline.check_splits(cfg, small_tok, ("train", "val"))
    with pytest.raises(ValueError, match="val_fraction in"):
        pipeline.check_splits(ml_collections.ConfigDict({"source": "kjv", "val_fraction": 0.0}), small_tok)


def test_train_sentencepiece_too_many_pieces_for_the_text():
    with pytest.raises(ValueError, match=r"more pieces than this text can give \(at most \d+\)"):
        train_sentencepiece(["ab ab ab"] * 3, 400)


def test_prepare_mixes_formats_in_one_run(tmp_path, small_tok):
    """`--source=a.jsonl,folder/` and a folder holding .txt and .jsonl files: every input is read by its own
    reader, in one run (docs/data.md: --source takes several inputs)."""
    docs = _docs(10, seed=3)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:4]))
    (tmp_path / "txt").mkdir()
    for i, d in enumerate(docs[4:7]):
        (tmp_path / "txt" / f"{i}.txt").write_text(d)
    (tmp_path / "txt" / "more.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[7:]))
    kw = dict(tokenizer=small_tok, val_fraction=0.0, num_proc=0, log=lambda s: None)
    meta = prepare.prepare(f"{tmp_path / 'a.jsonl'},{tmp_path / 'txt'}/", str(tmp_path / "o1"), **kw)
    # inputs in the order given, a folder's files sorted (0.txt 1.txt 2.txt more.jsonl)
    assert _read_split(tmp_path / "o1", meta, "train") == [small_tok.encode(d) for d in docs]
    assert meta["source"]["format"] == ["jsonl", "text"]
    assert prepare.main(["--source", str(tmp_path / "txt"), "--out", str(tmp_path / "o2"), "--val_fraction=0",
                         "--num_proc=0", "--train_tokenizer=400"]) == 0
    assert formats.read_meta(tmp_path / "o2")["train_docs"] == 6


def test_raw_text_folder_as_data_path_hint(tmp_path, small_tok):
    """data.path pointing at a folder of raw text: the fix names prepare --source=<that folder> --out=<a new
    folder> (prepare refuses --out=<that folder>, and never suggests deleting it)."""
    import ml_collections

    from idattn.data import pipeline
    (tmp_path / "my_corpus").mkdir()
    for i, d in enumerate(_docs(3)):
        (tmp_path / "my_corpus" / f"{i}.txt").write_text(d)
    cfg = ml_collections.ConfigDict({"source": "arrayrecord", "path": str(tmp_path / "my_corpus")})
    with pytest.raises(ValueError) as e:
        pipeline.check_splits(cfg, small_tok)
    msg = str(e.value)
    assert "\n" not in msg and "3 text file(s)" in msg
    assert f"prepare --source={tmp_path / 'my_corpus'} --out=<a new folder>" in msg and "--out " not in msg
    assert "--text_field=<field or column>" in msg  # for JSON Lines / CSV / Parquet whose text is elsewhere
    with pytest.raises(prepare.PrepareError,
                       match="holds no meta.json but text files.*pass them as --source.*new, empty --out") as e:
        prepare.prepare(str(tmp_path / "my_corpus"), str(tmp_path / "my_corpus"), tokenizer=small_tok, num_proc=0,
                        val_fraction=0.0, log=lambda s: None)
    assert "delete" not in str(e.value)
    assert sorted(p.name for p in (tmp_path / "my_corpus").iterdir()) == ["0.txt", "1.txt", "2.txt"]
    assert formats.RAW_SUFFIXES == tuple(x for v in prepare.FORMATS.values() for x in v)
