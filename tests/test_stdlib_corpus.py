"""The Python-stdlib corpus (idattn.data.stdlib_corpus): a deterministic file list and hash, held-out files
disjoint from training files by a path-hash rule, long documents present, a tokenizer trained on training files."""
from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from idattn.data import stdlib_corpus as S
from idattn.data import tokenizer as TK


def _fresh():
    S._load.cache_clear()


def test_real_stdlib_list_and_hash_are_deterministic_and_named():
    _fresh()
    files = S.list_files()
    assert files == S.list_files() == sorted(files) and len(files) > 300
    assert all(f.endswith(".py") for f in files)
    assert not any(set(f.split("/")[:-1]) & S.EXCLUDED_DIRS for f in files)
    assert "os.py" in files and "json/decoder.py" in files and not any(f.startswith("test/") for f in files)
    info = S.corpus_info()
    _fresh()
    assert S.corpus_info() == info  # recomputed from disk: the same list, hashes and split
    assert info["files_sha256"] == hashlib.sha256("\n".join(files).encode()).hexdigest()  # no UTF-8 skips here
    import sys
    assert info["python"] == sys.version.split()[0] and S.corpus_id().startswith(f"python-stdlib-{info['python']}-")


def test_real_stdlib_split_is_disjoint_and_has_long_heldout_documents():
    train, held = S.split()
    tp, hp = {p for p, _ in train}, {p for p, _ in held}
    assert not tp & hp and tp | hp == set(S.list_files())
    assert 0.05 < len(hp) / (len(tp) + len(hp)) < 0.15
    assert all(S.is_heldout(p) for p in hp) and not any(S.is_heldout(p) for p in tp)
    # a 256-token training context is ~1K characters of code: 16x that fits inside single held-out files
    assert len(S.long_documents(16 * 1024)) >= 10
    assert all(len(t) >= 16 * 1024 for _, t in S.long_documents(16 * 1024))


def _tree(root, files):
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())


def test_exclusions_and_hash_on_a_constructed_tree(tmp_path):
    _fresh()
    _tree(tmp_path, {"a.py": "x = 1\n", "pkg/b.py": "y = 2\n", "pkg/notes.txt": "no",
                     "site-packages/numpy/c.py": "z", "test/test_a.py": "t", "pkg/tests/t.py": "t",
                     "idlelib/idle_test/x.py": "t", "pkg/__pycache__/b.py": "t", "bad.py": b"\xff\xfe not utf-8"})
    os.symlink(tmp_path / "a.py", tmp_path / "alias.py")
    assert S.list_files(str(tmp_path)) == ["a.py", "bad.py", "pkg/b.py"]
    info = S.corpus_info(str(tmp_path))
    assert info["num_files"] == 2 and info["skipped_not_utf8"] == ["bad.py"]
    assert info["files_sha256"] == hashlib.sha256(b"a.py\npkg/b.py").hexdigest()
    assert [p for p, _ in S.documents(str(tmp_path))] == ["a.py", "pkg/b.py"]
    # another file changes the list hash; editing a file changes the content hash, not the list hash
    _tree(tmp_path, {"pkg/c.py": "w = 3\n"})
    _fresh()
    info2 = S.corpus_info(str(tmp_path))
    assert info2["files_sha256"] != info["files_sha256"]
    _tree(tmp_path, {"a.py": "x = 10\n"})
    _fresh()
    info3 = S.corpus_info(str(tmp_path))
    assert info3["files_sha256"] == info2["files_sha256"] and info3["content_sha256"] != info2["content_sha256"]


def test_split_rule_depends_on_the_path_only():
    paths = [f"m{i}/f{i}.py" for i in range(2000)]
    held = {p for p in paths if S.is_heldout(p)}
    assert 150 < len(held) < 250  # ~10%
    assert held == {p for p in paths[::-1] if S.is_heldout(p)}  # order and neighbours do not matter
    assert {p for p in paths if S.is_heldout(p, 0.0)} == set()
    with pytest.raises(ValueError, match="val_fraction"):
        S.is_heldout("a.py", 1.0)


def test_tokenizer_is_trained_on_the_training_files_only(tmp_path):
    """The cache key moves when a training file changes and not when a held-out file does."""
    _fresh()
    train, held = S.split()
    root = tmp_path / "lib"
    src = S.stdlib_root()
    pick = [p for p, _ in train[:40]] + [held[0][0]]
    for p in pick:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(src, p), root / p)
    cache = tmp_path / "cache"
    tok = TK.train_stdlib_tokenizer(512, root=str(root), cache_dir=cache)
    text = "def f(x):\n    return x + 1\n"
    assert tok.decode(tok.encode(text)) == text
    models = sorted(os.listdir(cache))
    assert len(models) == 1
    with open(root / held[0][0], "a") as f:
        f.write("\n# held-out edit\n")
    _fresh()
    TK.train_stdlib_tokenizer(512, root=str(root), cache_dir=cache)
    assert sorted(os.listdir(cache)) == models  # same key: held-out text is not in the tokenizer's input
    with open(root / pick[0], "a") as f:
        f.write("\n# training edit\n")
    _fresh()
    TK.train_stdlib_tokenizer(512, root=str(root), cache_dir=cache)
    assert len(os.listdir(cache)) == 2


def test_stdlib_is_a_data_source_with_its_held_out_files(tmp_path):
    """data.source='stdlib' feeds the trainer's pipeline: training batches come from the training files only, the
    validation batches from the held-out files, and the overlap check knows which are which."""
    import ml_collections
    import numpy as np

    from idattn.data import pipeline
    from idattn.data.prepare import doc_hash, training_hashes
    from idattn.data.tokenizer import ByteTokenizer

    class Tok(ByteTokenizer):  # bytes as ids: nothing to train; 256-258 as the specials the packer writes
        bos_id, eos_id, pad_id = 256, 257, 258

        def identity(self):
            return {"sha256": "bytes"}

        def encode_batch(self, texts):
            return [self.encode(t) for t in texts]

    tok = Tok()
    cfg = ml_collections.ConfigDict(dict(source="stdlib", seq_len=256, shuffle_seed=0, num_workers=0, prefetch=0,
                                         packing="concat", path="", tokenizer="bytes"))
    train, val = S.split()
    train_hash = {doc_hash(t) for _, t in train}
    val_hash = {doc_hash(t) for _, t in val}
    train_bytes = b"\x00".join(t.encode() for _, t in train)  # bytes: a cut may split a UTF-8 character
    val_bytes = b"\x00".join(t.encode() for _, t in val)
    # Every row split at its document boundaries (segment_ids); a piece that starts with BOS and ends with EOS is
    # a whole document: its hash is a training file's and no held-out file's. A cut piece (the row started or
    # ended inside its document) is a substring of the training files' text, and, when long, of no held-out file.
    it = pipeline.make_train_iterator(cfg, tok, global_batch_size=4, seq_len=16384, seed=0)
    whole, pieces = 0, 0
    for _ in range(4):
        batch = next(it)
        for inp, tgt, seg in zip(batch["inputs"], batch["targets"], batch["segment_ids"]):
            for sid in np.unique(seg[seg > 0]):
                x, y = inp[seg == sid], tgt[seg == sid]
                assert np.array_equal(x[1:], y[:-1])  # one contiguous piece of one document
                if x[0] == tok.bos_id and y[-1] == tok.eos_id:
                    h = doc_hash(tok.decode(y[:-1]))
                    assert h in train_hash and h not in val_hash, ("a whole document in a training batch is "
                                                                   f"not a training file: {tok.decode(y[:-1])[:80]!r}")
                    whole += 1
                else:
                    piece = bytes(int(i) for i in np.concatenate([x[:1], y]) if i < 256)  # without BOS / EOS
                    assert piece in train_bytes, f"a piece of a training row is in no training file: {piece[:80]!r}"
                    if len(piece) >= 2048:
                        assert piece not in val_bytes, f"a piece of a training row is held-out text: {piece[:80]!r}"
                    pieces += 1
    assert whole >= 3 and pieces >= 2, (whole, pieces)  # both kinds were checked
    ev = pipeline.make_eval_batches(cfg, tok, batch_size=2, seq_len=256, num_batches=1)
    first_val = tok.decode(ev[0]["inputs"][0][:64])
    assert first_val and first_val in val[0][1][:1000], first_val
    hashes, what = training_hashes(cfg)
    assert what == "stdlib training files" and len(hashes) == len({doc_hash(t) for _, t in train})
    assert not np.isin([doc_hash(t) for _, t in val], hashes).any()
