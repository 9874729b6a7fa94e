"""The Grain pipeline: packing against a plain-python reference packer, iterator state round trips (also through
orbax), per-host sharding, evaluation batches, config errors."""
from __future__ import annotations

import json

import grain
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from idattn.configs import base_config
from idattn.data import corpus, pipeline, prepare
from idattn.data.tokenizer import Tokenizer, train_sentencepiece

KEYS = ("inputs", "targets", "segment_ids", "positions", "loss_mask")
BOS, EOS, PAD = 1, 2, 0


# ------------------------------------------------------------------------------------------ reference packer

def reference_pack(docs, T, mode="concat", bos=BOS, eos=EOS, pad=PAD):
    """Plain-python packer: list of token-id lists -> list of rows (dict of lists), as documented in pipeline."""
    pieces = []  # (doc index, list of (input, target) pairs), in stream order
    for d, ids in enumerate(docs):
        s = [bos] + list(ids) + [eos]
        pairs = [(s[j], s[j + 1]) for j in range(len(s) - 1)]
        if mode == "pad":
            pieces += [(d, pairs[i:i + T]) for i in range(0, len(pairs), T)]
        else:
            pieces.append((d, pairs))
    rows, cur = [], []  # cur: list of (segment number, position, input, target)

    def flush():
        row = {"inputs": [pad] * T, "targets": [pad] * T, "segment_ids": [0] * T, "positions": [0] * T,
               "loss_mask": [0.0] * T}
        for t, (seg, p, x, y) in enumerate(cur):
            row["inputs"][t], row["targets"][t] = x, y
            row["segment_ids"][t], row["positions"][t], row["loss_mask"][t] = seg, p, 1.0
        rows.append(row)

    for _, pairs in pieces:
        if mode == "pad" and len(cur) + len(pairs) > T:
            flush()
            cur = []
        seg = (cur[-1][0] if cur else 0) + 1
        p = 0
        for x, y in pairs:
            if len(cur) == T:  # concat: the document continues in the next row as a new segment
                flush()
                cur, seg, p = [], 1, 0
            cur.append((seg, p, x, y))
            p += 1
    if cur:
        flush()
    return rows


def stack(rows, b):
    return [{k: np.asarray([r[k] for r in rows[i:i + b]]) for k in KEYS} for i in range(0, len(rows) - b + 1, b)]


def assert_batches_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for k in KEYS:
            np.testing.assert_array_equal(g[k], w[k], err_msg=k)


def assert_invariants(batch, T):
    """Checks that need no reference: next-token targets within segments, positions, dtypes."""
    assert batch["inputs"].dtype == np.int32 and batch["loss_mask"].dtype == np.float32
    for r in range(batch["inputs"].shape[0]):
        x, y, seg, pos = (batch[k][r] for k in ("inputs", "targets", "segment_ids", "positions"))
        for t in range(T - 1):
            if seg[t] > 0 and seg[t + 1] == seg[t]:
                assert y[t] == x[t + 1] and pos[t + 1] == pos[t] + 1
            elif seg[t + 1] > 0:
                assert pos[t + 1] == 0 and seg[t + 1] == seg[t] + 1
        assert seg[0] in (0, 1) and pos[0] == 0
        np.testing.assert_array_equal(batch["loss_mask"][r], (seg > 0).astype(np.float32))


# ------------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def tok():
    train, _ = corpus.kjv_documents()
    return Tokenizer(train_sentencepiece(train[:8], 400), name="small400")


def _cfg(**kw):
    c = base_config().data
    for k, v in kw.items():
        c[k] = v
    return c


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tok):
    """A prepared ArrayRecord folder of 60 short distinct documents (plus a held-out split)."""
    root = tmp_path_factory.mktemp("prep")
    paras = [p for d in corpus.kjv_documents()[0][:3] for p in d.split("\n") if p.strip()]
    texts = [f"Doc {i}. " + " ".join(paras[i % len(paras)].split()[: 3 + (i * 7) % 40]) for i in range(72)]
    (root / "src").mkdir()
    pq.write_table(pa.table({"text": texts}), root / "src" / "a.parquet")
    meta = prepare.prepare(str(root / "src"), str(root / "out"), tokenizer=tok, val_fraction=0.15,
                           docs_per_shard=25, num_proc=0, log=lambda s: None)
    return root / "out", meta, texts


def _doc_index(tokens_list):
    return {tuple(t): i for i, t in enumerate(tokens_list)}


def _docs_in_stream(batches):
    """Reassemble the documents a host read, in order, from its packed batches (concat mode)."""
    stream = [(int(x), int(y)) for b in batches for r in range(b["inputs"].shape[0])
              for x, y, m in zip(b["inputs"][r], b["targets"][r], b["loss_mask"][r]) if m > 0]
    docs, cur = [], None
    for x, y in stream:
        if x == BOS:
            cur = []
        if y == EOS:
            docs.append(tuple(cur))
            cur = None
        elif cur is not None:
            cur.append(y)
    return docs


# ------------------------------------------------------------------------------------------ packing

@pytest.mark.parametrize("mode", ["concat", "pad"])
def test_packer_matches_reference(mode):
    rng = np.random.default_rng(0)
    T = 16
    lens = [0, 3, 14, 15, 16, 40, 1, 7, 33, 2, 5, 9]
    docs = [rng.integers(3, 500, n).tolist() for n in lens]
    ds = pipeline.PackIterDataset(grain.MapDataset.source([np.asarray(d, np.int32) for d in docs]).to_iter_dataset(),
                                  seq_len=T, bos_id=BOS, eos_id=EOS, pad_id=PAD, mode=mode)
    got = list(ds)
    want = reference_pack(docs, T, mode)
    assert_batches_equal([{k: r[k][None] for k in KEYS} for r in got], stack(want, 1))
    for r in got:
        assert_invariants({k: r[k][None] for k in KEYS}, T)
    # every (input, target) pair of every document is emitted exactly once, in order
    flat = [(int(x), int(y)) for r in got for x, y, m in zip(r["inputs"], r["targets"], r["loss_mask"]) if m]
    assert flat == [p for d in docs for p in zip([BOS] + d, d + [EOS])]
    if mode == "concat":
        assert all(r["loss_mask"].all() for r in got[:-1])  # no padding until the stream ends


def test_reference_packer_small_cases():
    # independent hand-worked example: T=4, docs [5,6] and [7]
    rows = reference_pack([[5, 6], [7]], 4)
    assert rows[0]["inputs"] == [1, 5, 6, 1] and rows[0]["targets"] == [5, 6, 2, 7]
    assert rows[0]["segment_ids"] == [1, 1, 1, 2] and rows[0]["positions"] == [0, 1, 2, 0]
    assert rows[1]["inputs"] == [7, 0, 0, 0] and rows[1]["targets"] == [2, 0, 0, 0]
    assert rows[1]["segment_ids"] == [1, 0, 0, 0] and rows[1]["loss_mask"] == [1.0, 0, 0, 0]
    rows = reference_pack([[5, 6], [7]], 4, mode="pad")
    assert rows[0]["segment_ids"] == [1, 1, 1, 0] and rows[1]["inputs"] == [1, 7, 0, 0]


def test_kjv_train_iterator_matches_reference(tok):
    cfg = _cfg(source="kjv", prefetch=2)
    T, b, seed = 64, 3, 7
    it = pipeline.make_train_iterator(cfg, tok, global_batch_size=b, seq_len=T, seed=seed)
    got = [next(it) for _ in range(4)]
    it.close()
    train, _ = corpus.kjv_documents(val_fraction=cfg.val_fraction)
    order = list(grain.MapDataset.range(len(train)).shuffle(seed=seed))
    assert sorted(order) == list(range(len(train))) and order != list(range(len(train)))
    needed = []
    for i in order:  # enough documents for 4 batches
        needed.append(tok.encode(train[i]))
        if sum(len(d) + 1 for d in needed) > 4 * b * T:
            break
    want = stack(reference_pack(needed, T), b)[:4]
    assert_batches_equal(got, want)
    for g in got:
        assert g["inputs"].shape == (b, T)
        assert_invariants(g, T)


# ------------------------------------------------------------------------------------------ state

@pytest.mark.parametrize("source,prefetch,workers", [("kjv", 2, 0), ("arrayrecord", 0, 0), ("arrayrecord", 2, 0)])
def test_state_round_trip(tok, prepared, source, prefetch, workers):
    out, meta, _ = prepared
    cfg = _cfg(source=source, path=str(out), prefetch=prefetch, num_workers=workers)
    kw = dict(global_batch_size=2, seq_len=48, seed=3)
    it = pipeline.make_train_iterator(cfg, tok, **kw)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # JSON-able, as grain's orbax handler stores it
    want = [next(it) for _ in range(6)]  # crosses documents and (arrayrecord) an epoch boundary
    it.close()
    it2 = pipeline.make_train_iterator(cfg, tok, **kw)
    it2.set_state(state)
    assert_batches_equal([next(it2) for _ in range(6)], want)
    it2.close()
    # a different seed gives different batches
    it3 = pipeline.make_train_iterator(cfg, tok, **{**kw, "seed": 4})
    assert any(not np.array_equal(next(it3)["inputs"], w["inputs"]) for w in want[:1])
    it3.close()


def test_orbax_checkpoint_round_trip(tmp_path, tok, prepared):
    import orbax.checkpoint as ocp
    out, _, _ = prepared
    cfg = _cfg(source="arrayrecord", path=str(out), prefetch=0)
    kw = dict(global_batch_size=2, seq_len=32, seed=0)
    it = pipeline.make_train_iterator(cfg, tok, **kw)
    for _ in range(3):
        next(it)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mgr:
        mgr.save(3, args=ocp.args.Composite(data=pipeline.checkpoint_save_args(it)))
        mgr.wait_until_finished()
    want = [next(it) for _ in range(4)]
    fresh = pipeline.make_train_iterator(cfg, tok, **kw)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mgr:
        restored = mgr.restore(3, args=ocp.args.Composite(data=pipeline.checkpoint_restore_args(fresh)))
    assert_batches_equal([next(restored["data"]) for _ in range(4)], want)


# ------------------------------------------------------------------------------------------ sharding / epochs

def test_global_batches_same_on_any_process_count_and_epochs_reshuffle(tok, prepared):
    """Row r of step s depends on (seed, s, r) only: the hosts' rows of P = 2 and P = 3 stacked are the P = 1
    global batch, an iterator state saved on 2 processes restores on 1 and on 3 to the same next batches, and
    the global stream reads every document once per epoch with a new order every epoch."""
    out, meta, texts = prepared
    cfg = _cfg(source="arrayrecord", path=str(out), prefetch=0)
    from idattn.data import formats
    import grain as g
    src = g.sources.ArrayRecordDataSource(formats.shard_paths(out, meta, "train"))
    train_docs = [tuple(np.frombuffer(src[i], meta["dtype"]).tolist()) for i in range(len(src))]
    n = len(train_docs)
    index = _doc_index(train_docs)
    assert len(index) == n  # documents are distinct
    total_pairs = sum(len(d) + 1 for d in train_docs)
    T, B = 32, 6
    nb = 2 * (total_pairs // (T * B)) + 4  # a little more than two epochs of the global stream

    def its(P, seed=11):
        return [pipeline.make_train_iterator(cfg, tok, global_batch_size=B, seq_len=T, seed=seed,
                                             process_index=p, process_count=P) for p in range(P)]

    one = its(1)[0]
    ref = [next(one) for _ in range(nb)]
    for P in (2, 3):
        hosts = its(P)
        for s in range(nb):
            parts = [next(h) for h in hosts]
            assert parts[0]["inputs"].shape == (B // P, T)
            for k in ref[s]:
                np.testing.assert_array_equal(np.concatenate([x[k] for x in parts]), ref[s][k], err_msg=(P, s, k))
    # a state saved on 2 processes after 3 steps (identical on both) restores on 1 and 3 processes
    two = its(2)
    for _ in range(3):
        [next(h) for h in two]
    states = [h.get_state() for h in two]
    assert states[0] == states[1]
    for P in (1, 3):
        hosts = its(P)
        for h in hosts:
            h.set_state(states[0])
        for s in range(3, 6):
            got = np.concatenate([next(h)["inputs"] for h in hosts])
            np.testing.assert_array_equal(got, ref[s]["inputs"], err_msg=(P, s))
    stream = [index[d] for d in _docs_in_stream(ref)]
    epoch0, epoch1 = stream[:n], stream[n:2 * n]
    assert sorted(epoch0) == list(range(n)) and sorted(epoch1) == list(range(n))
    assert epoch0 != epoch1  # a new shuffle every epoch
    other = its(1, seed=12)[0]
    assert not np.array_equal(next(other)["inputs"], ref[0]["inputs"])  # the seed decides the order


# ------------------------------------------------------------------------------------------ eval / errors

def test_eval_batches_deterministic_and_padded(tok, prepared):
    out, meta, _ = prepared
    cfg = _cfg(source="arrayrecord", path=str(out))
    from idattn.data import formats
    import grain as g
    src = g.sources.ArrayRecordDataSource(formats.shard_paths(out, meta, "val"))
    val_docs = [np.frombuffer(src[i], meta["dtype"]).tolist() for i in range(len(src))]
    T, b = 32, 2
    rows = reference_pack(val_docs, T)
    n_full = len(rows) // b
    ev = pipeline.make_eval_batches(cfg, tok, batch_size=b, seq_len=T, num_batches=100)
    assert len(ev) == -(-len(rows) // b)  # ran out: as many as the split gives
    pad = {"inputs": [0] * T, "targets": [0] * T, "segment_ids": [0] * T, "positions": [0] * T,
           "loss_mask": [0.0] * T}
    assert_batches_equal(ev, stack(rows + [pad] * (len(ev) * b - len(rows)), b))
    again = pipeline.make_eval_batches(cfg, tok, batch_size=b, seq_len=T, num_batches=2)
    assert_batches_equal(again, ev[:2])
    assert n_full >= 2
    # kjv held-out split
    kev = pipeline.make_eval_batches(_cfg(source="kjv"), tok, batch_size=2, seq_len=64, num_batches=2)
    _, kval = corpus.kjv_documents()
    assert_batches_equal(kev, stack(reference_pack([tok.encode(kval[0])], 64), 2)[:2])


def test_config_errors(tok, prepared, tmp_path):
    out, _, _ = prepared
    kw = dict(global_batch_size=4, seq_len=16, seed=0)
    with pytest.raises(ValueError, match="data.source='nope'"):
        pipeline.make_train_iterator(_cfg(source="nope"), tok, **kw)
    with pytest.raises(ValueError, match="needs data.path"):
        pipeline.make_train_iterator(_cfg(source="arrayrecord", path=""), tok, **kw)
    with pytest.raises(ValueError, match="multiple of process_count=3"):
        pipeline.make_train_iterator(_cfg(), tok, global_batch_size=4, seq_len=16, seed=0, process_count=3)
    with pytest.raises(ValueError, match="process_index=2"):
        pipeline.make_train_iterator(_cfg(), tok, **kw, process_index=2, process_count=2)
    with pytest.raises(FileNotFoundError, match="not a prepared data folder"):
        pipeline.make_train_iterator(_cfg(source="arrayrecord", path=str(tmp_path)), tok, **kw)
    other = Tokenizer(train_sentencepiece(corpus.kjv_documents()[0][20:24], 384), name="other384")
    with pytest.raises(ValueError, match="Tokenizer mismatch"):
        pipeline.make_train_iterator(_cfg(source="arrayrecord", path=str(out)), other, **kw)
    with pytest.raises(ValueError, match="data.packing='bogus'"):
        pipeline.make_train_iterator(_cfg(packing="bogus"), tok, **kw)
    pipeline.check_tokenizer_matches(out, tok)  # same tokenizer: no error


@pytest.mark.slow
def test_multiprocess_prefetch_state_round_trip(tok, prepared):
    """data.num_workers > 0 (grain mp_prefetch; ~10 s to start workers, hence slow)."""
    out, _, _ = prepared
    cfg = _cfg(source="arrayrecord", path=str(out), num_workers=2, prefetch=2)
    kw = dict(global_batch_size=2, seq_len=32, seed=5)
    it = pipeline.make_train_iterator(cfg, tok, **kw)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    want = [next(it) for _ in range(4)]
    it.close()
    it2 = pipeline.make_train_iterator(cfg, tok, **kw)
    it2.set_state(state)
    got = [next(it2) for _ in range(4)]
    it2.close()
    assert_batches_equal(got, want)
    for g in got:
        assert_invariants(g, 32)


def test_tfds_source_errors(tok):
    import importlib.util
    kw = dict(global_batch_size=2, seq_len=16, seed=0)
    with pytest.raises(ValueError, match="needs data.tfds_name"):
        pipeline.make_train_iterator(_cfg(source="tfds", tfds_name=""), tok, **kw)
    if importlib.util.find_spec("tensorflow_datasets") is None:
        with pytest.raises(ImportError, match="optional extra"):
            pipeline.make_train_iterator(_cfg(source="tfds", tfds_name="wikipedia/20230601.en"), tok, **kw)
