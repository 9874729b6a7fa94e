"""The Grain input pipeline: documents -> seeded global shuffle -> per-host shard -> packed rows -> batches.

Sources (`data.source`)
  "kjv"          the embedded King James corpus (`idattn.data.corpus`), tokenised in memory once per process;
  "arrayrecord"  shards written by `python -m idattn.data.prepare` in `data.path` (see `idattn.data.formats`),
                 read through `grain.sources.ArrayRecordDataSource`;
  "tfds"         `tfds.data_sources(data.tfds_name)` (optional extra; records with a "text" feature are
                 tokenised on the fly; splits `data.tfds_train_split`/`data.tfds_val_split`, default
                 "train"/"validation").

Packing. A document with token ids t_1..t_n becomes s = [BOS, t_1, ..., t_n, EOS] and contributes the n+1
(input, target) pairs (s_j, s_{j+1}), j = 0..n: the first input is BOS and the last target is EOS, so
`targets` are always the next token *within the document*. Rows of length T are filled with these pairs:

  data.packing = "concat" (default)  the stream of documents is concatenated and cut every T pairs; a document
                                     that does not fit in what is left of a row continues at the start of the
                                     next row. No padding except at the end of a finite stream (evaluation).
  data.packing = "pad"               a document is cut into pieces of T pairs; a piece that does not fit in
                                     what is left of the row closes the row (padding) and starts the next.

Per row: `segment_ids` = 1, 2, 3, ... for the successive document pieces in the row and 0 on padding;
`positions` count 0, 1, 2, ... from the start of every piece; `loss_mask` is 1.0 except on padding. A piece
that continues a document from the previous row is its own segment starting at position 0 (the model never
sees across rows, so positions are relative to what the row holds).

Order. Training documents are shuffled globally with `seed` (grain's index shuffle, reseeded every epoch:
`shuffle(seed).repeat()`, an infinite stream), packed into one global stream of rows and cut into global
batches of `global_batch_size` rows; host p of P keeps rows [p·b, (p+1)·b) of every global batch, b =
global_batch_size / P. Row r of step s is therefore a function of (seed, s, r) only, whatever the process
count: a run checkpointed on N processes resumes on M with the same global batches (elastic resume), and the
iterator state is the same on every process. The cost: every host reads and packs all the documents of a
global batch (a few MB of token ids per step at the paper's 0.5M-token batches), not a 1/P share. `data.num_workers > 0` adds grain multiprocess prefetch (each worker packs a
slice of the host's stream: deterministic for a fixed worker count, but changing the count changes batches);
`data.prefetch` adds a thread prefetch buffer of that many batches.

Checkpointing. The iterator is a `grain.DatasetIterator`: `get_state()` is a small JSON-able dict (grain's
stream index plus the packer's position inside the current document) and `set_state(state)` makes the
iterator yield exactly the batches it would have yielded. With orbax, save it as
`ocp.args.Composite(..., data=checkpoint_save_args(it))` and restore with `checkpoint_restore_args(it)`
(grain's `grain.checkpoint.CheckpointSave/CheckpointRestore`, one JSON file per process).
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import grain
import numpy as np
from absl import flags

from idattn.data import corpus, formats, stdlib_corpus
from idattn.data.formats import check_tokenizer_matches  # noqa: F401  (public API)

log = logging.getLogger(__name__)

SOURCES = ("kjv", "stdlib", "arrayrecord", "tfds")
PACKING = ("concat", "pad")
# Threads reading ArrayRecord records in parallel per host (I/O bound; grain's default is 16).
ARRAYRECORD_READ_THREADS = 8
ARRAYRECORD_READ_BUFFER = 256


def _cfg(data_cfg, key: str, default=None):
    try:
        return data_cfg[key]
    except (KeyError, AttributeError):
        return default


# ----------------------------------------------------------------------------------------------------------
# Packing
# ----------------------------------------------------------------------------------------------------------

class _PackIterator(grain.DatasetIterator):
    """Packs a stream of token-id documents into rows of `seq_len` (input, target) pairs (module docstring).

    State: the parent's state *before* the current (partly emitted) document was read, and how many of its
    pairs were already emitted; restoring re-reads that document and skips them.
    """

    def __init__(self, parent, seq_len: int, bos_id: int, eos_id: int, pad_id: int, mode: str):
        super().__init__(parent)
        self._T = int(seq_len)
        self._bos, self._eos, self._pad = int(bos_id), int(eos_id), int(pad_id)
        self._mode = mode
        self._doc: np.ndarray | None = None  # s = [BOS, ids..., EOS], int32
        self._doc_state: dict | None = None
        self._offset = 0  # pairs of self._doc already emitted

    def _read_doc(self) -> None:
        state = self._parent.get_state()
        ids = np.asarray(next(self._parent))
        s = np.empty(ids.shape[0] + 2, np.int32)
        s[0], s[-1] = self._bos, self._eos
        s[1:-1] = ids
        self._doc, self._doc_state, self._offset = s, state, 0

    def __next__(self) -> dict[str, np.ndarray]:
        T = self._T
        inputs = np.full(T, self._pad, np.int32)
        targets = np.full(T, self._pad, np.int32)
        segs = np.zeros(T, np.int32)
        pos = np.zeros(T, np.int32)
        filled, seg = 0, 0
        while filled < T:
            if self._doc is None:
                try:
                    self._read_doc()
                except StopIteration:
                    break
            doc, off = self._doc, self._offset
            left = doc.shape[0] - 1 - off
            room = T - filled
            if self._mode == "pad":
                k = min(left, T)  # pieces start at multiples of T within the document
                if k > room:
                    break  # close the row with padding; the piece starts the next row
            else:
                k = min(left, room)
            seg += 1
            inputs[filled:filled + k] = doc[off:off + k]
            targets[filled:filled + k] = doc[off + 1:off + k + 1]
            segs[filled:filled + k] = seg
            pos[filled:filled + k] = np.arange(k, dtype=np.int32)
            filled += k
            self._offset = off + k
            if self._offset == doc.shape[0] - 1:
                self._doc = None
        if filled == 0:
            raise StopIteration
        return {"inputs": inputs, "targets": targets, "segment_ids": segs, "positions": pos,
                "loss_mask": (segs > 0).astype(np.float32)}

    def get_state(self) -> dict[str, Any]:
        if self._doc is None:
            return {"parent": self._parent.get_state(), "has_doc": 0, "offset": 0}
        return {"parent": self._doc_state, "has_doc": 1, "offset": int(self._offset)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._doc = None
        if state["has_doc"]:
            self._read_doc()
            offset = int(state["offset"])
            if 0 <= offset < self._doc.shape[0] - 1:
                self._offset = offset
            else:  # the saved position is past this document: the data changed under the run (resumed with
                # train.allow_data_change); the document is done, the stream goes on at the next one
                log.warning("data position: the restored document holds %d pairs but the saved position is %d (the "
                            "data changed under the run); continuing at the next document",
                            self._doc.shape[0] - 1, offset)
                self._doc = None


class PackIterDataset(grain.IterDataset):
    """`IterDataset` of packed rows (dict of [T] arrays) from an `IterDataset` of 1-D token-id documents."""

    def __init__(self, parent, *, seq_len: int, bos_id: int, eos_id: int, pad_id: int, mode: str = "concat"):
        super().__init__(parent)
        if mode not in PACKING:
            raise ValueError(f"data.packing={mode!r}; expected one of {PACKING}.")
        if int(seq_len) < 1:
            raise ValueError(f"seq_len={seq_len!r}; expected a positive int.")
        self._args = (int(seq_len), bos_id, eos_id, pad_id, mode)

    def __iter__(self):
        return _PackIterator(self._parent.__iter__(), *self._args)

    def __str__(self) -> str:
        return f"PackIterDataset(seq_len={self._args[0]}, mode={self._args[4]!r})"


# ----------------------------------------------------------------------------------------------------------
# Document sources
# ----------------------------------------------------------------------------------------------------------

_KJV_CACHE: dict[tuple, tuple[np.ndarray, ...]] = {}


def kjv_token_docs(tokenizer, split: str, val_fraction: float) -> tuple[np.ndarray, ...]:
    key = (tokenizer.identity()["sha256"], float(val_fraction), split)
    if key not in _KJV_CACHE:
        train, val = corpus.kjv_documents(val_fraction=val_fraction)
        docs = train if split == "train" else val
        if not docs:
            raise ValueError(f"data.source='kjv': the {split} split is empty with data.val_fraction="
                             f"{val_fraction}; use a val_fraction in (0, 1).")
        _KJV_CACHE[key] = tuple(np.asarray(ids, np.int32) for ids in tokenizer.encode_batch(docs))
    return _KJV_CACHE[key]


def stdlib_token_docs(tokenizer, split: str) -> tuple[np.ndarray, ...]:
    """The running interpreter's standard-library source files as documents (idattn/data/stdlib_corpus.py: a
    deterministic list, held-out files by a path hash), tokenised; cached per (tokenizer, split)."""
    key = ("stdlib", tokenizer.identity()["sha256"], split)
    if key not in _KJV_CACHE:
        train, val = stdlib_corpus.split()
        docs = train if split == "train" else val
        _KJV_CACHE[key] = tuple(np.asarray(ids, np.int32) for ids in tokenizer.encode_batch([t for _, t in docs]))
    return _KJV_CACHE[key]


def _decode_record(record: bytes, dtype: str) -> np.ndarray:
    return np.frombuffer(record, dtype=dtype).astype(np.int32)


def _tokenize_text(example, tokenizer) -> np.ndarray:
    text = example["text"] if isinstance(example, dict) else example
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return np.asarray(tokenizer.encode(str(text)), np.int32)


def _doc_dataset(data_cfg, tokenizer, split: str) -> tuple[grain.MapDataset, int]:
    """MapDataset of 1-D int32 token-id documents (no BOS/EOS) and the read-thread count that suits it."""
    source = _cfg(data_cfg, "source", "kjv")
    if source == "kjv":
        docs = kjv_token_docs(tokenizer, split, _cfg(data_cfg, "val_fraction", 0.05))
        return grain.MapDataset.source(list(docs)), 0  # in memory: threads would only contend for the GIL
    if source == "stdlib":
        return grain.MapDataset.source(list(stdlib_token_docs(tokenizer, split))), 0
    if source == "arrayrecord":
        path = _cfg(data_cfg, "path", "")
        if not path:
            raise ValueError("data.source='arrayrecord' needs data.path: the folder written by "
                             "`python -m idattn.data.prepare --source=<your texts> --out=<folder>`.")
        meta = check_tokenizer_matches(path, tokenizer)
        src = grain.sources.ArrayRecordDataSource(formats.shard_paths(path, meta, split))
        ds = grain.MapDataset.source(src).map(functools.partial(_decode_record, dtype=meta["dtype"]))
        return ds, ARRAYRECORD_READ_THREADS
    if source == "tfds":
        name = _cfg(data_cfg, "tfds_name", "")
        if not name:
            raise ValueError("data.source='tfds' needs data.tfds_name (a TFDS dataset name with a 'text' "
                             "feature, e.g. 'wikipedia/20230601.en').")
        try:
            import tensorflow_datasets as tfds
        except ImportError as e:
            raise ImportError("data.source='tfds' needs tensorflow-datasets (an optional extra: "
                              "`pip install tensorflow-datasets`), or use data.source='arrayrecord'.") from e
        tsplit = _cfg(data_cfg, "tfds_train_split" if split == "train" else "tfds_val_split",
                      "train" if split == "train" else "validation")
        src = tfds.data_sources(name, split=tsplit)
        return grain.MapDataset.source(src).map(functools.partial(_tokenize_text, tokenizer=tokenizer)), 4
    raise ValueError(f"data.source={source!r}; expected one of {SOURCES}.")


def _packing_mode(data_cfg) -> str:
    mode = _cfg(data_cfg, "packing", "concat")
    if mode not in PACKING:
        raise ValueError(f"data.packing={mode!r}; expected one of {PACKING}.")
    return mode


# ----------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------

def check_splits(data_cfg, tokenizer, splits=("train", "val")) -> None:
    """Refuse (ValueError, one line with the fix) when a split the run will read is missing or empty, so a run
    fails at start rather than at its first validation. Cheap: reads meta.json, never the documents (kjv: the
    split rule; tfds: not checked, listing it needs the dataset)."""
    source = _cfg(data_cfg, "source", "kjv")
    for split in splits:
        if source == "kjv":
            vf = float(_cfg(data_cfg, "val_fraction", 0.05))
            if split == "val" and vf <= 0:
                raise ValueError(f"data.source='kjv' with data.val_fraction={vf}: the val split the trainer "
                                 "validates on is empty; set data.val_fraction in (0, 1), e.g. 0.05.")
        elif source == "arrayrecord":
            path = _cfg(data_cfg, "path", "")
            try:
                meta = formats.read_meta(path)
                formats.shard_paths(path, meta, split)
            except FileNotFoundError as e:
                raise ValueError(str(e)) from e
            docs = meta.get(f"{split}_docs", 0)
            if not docs:
                raise ValueError(f"data.path={path!r}: the {split} split has 0 documents; prepare the data again "
                                 "with --val_fraction > 0 (prepare then guarantees --min_val_docs / "
                                 "--min_val_tokens).")


def make_train_dataset(data_cfg, tokenizer, *, global_batch_size: int, seq_len: int, seed: int,
                       process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
    """The training `IterDataset` (see `make_train_iterator`)."""
    if process_count < 1 or not (0 <= process_index < process_count):
        raise ValueError(f"process_index={process_index}, process_count={process_count}; expected "
                         "0 <= process_index < process_count (jax.process_index(), jax.process_count()).")
    if global_batch_size < 1 or global_batch_size % process_count:
        raise ValueError(f"global_batch_size={global_batch_size} must be a positive multiple of "
                         f"process_count={process_count}; change train.batch_size.")
    if not 0 <= int(seed) < 2**32:
        raise ValueError(f"seed={seed}; expected an int in [0, 2**32).")
    docs, threads = _doc_dataset(data_cfg, tokenizer, "train")
    ds = docs.shuffle(seed=int(seed)).repeat()  # reseeded every epoch
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=(
        ARRAYRECORD_READ_BUFFER if threads else 1)))
    it = PackIterDataset(it, seq_len=seq_len, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                         pad_id=tokenizer.pad_id, mode=_packing_mode(data_cfg))
    it = it.batch(global_batch_size, drop_remainder=True)
    if process_count > 1:  # this host's rows of the global batch (module docstring, "Order")
        b = global_batch_size // process_count
        lo = process_index * b
        it = it.map(lambda batch: {k: v[lo:lo + b] for k, v in batch.items()})
    workers = int(_cfg(data_cfg, "num_workers", 0) or 0)
    prefetch = int(_cfg(data_cfg, "prefetch", 0) or 0)
    if workers > 0:
        if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; outside absl.app nobody parsed them
            flags.FLAGS.mark_as_parsed()
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers,
                                                         per_worker_buffer_size=max(prefetch, 1)))
    elif prefetch > 0:
        it = grain.experimental.ThreadPrefetchIterDataset(it, prefetch_buffer_size=prefetch)
    return it


def make_train_iterator(data_cfg, tokenizer, *, global_batch_size: int, seq_len: int, seed: int,
                        process_index: int = 0, process_count: int = 1) -> grain.DatasetIterator:
    """Infinite iterator of this host's training batches.

    Yields dicts of numpy arrays, b = global_batch_size / process_count:
      inputs [b, T] int32, targets [b, T] int32 (next token within the document; last target of a document is
      EOS), segment_ids [b, T] int32 (1, 2, ... per document piece in a row, 0 = padding), positions [b, T]
      int32 (0 at every piece start), loss_mask [b, T] float32 (0 on padding).
    Checkpointable: `it.get_state()` / `it.set_state(state)`, or orbax via `checkpoint_save_args(it)`.
    """
    return iter(make_train_dataset(data_cfg, tokenizer, global_batch_size=global_batch_size, seq_len=seq_len,
                                   seed=seed, process_index=process_index, process_count=process_count))


def make_eval_batches(data_cfg, tokenizer, *, batch_size: int, seq_len: int, num_batches: int
                      ) -> list[dict[str, np.ndarray]]:
    """Up to `num_batches` deterministic batches of the held-out split (same packing as training, no shuffle).

    The held-out documents are read in order; the last row is padded, and rows missing from the last batch are
    all padding (loss_mask 0), so every batch has shape [batch_size, seq_len]. Fewer batches come back when the
    split runs out (a warning says how many); token-level perplexity = exp(sum(loss*mask) / sum(mask)).
    """
    if batch_size < 1 or num_batches < 1:
        raise ValueError(f"batch_size={batch_size}, num_batches={num_batches}; expected positive ints.")
    docs, threads = _doc_dataset(data_cfg, tokenizer, "val")
    it = docs.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=(
        ARRAYRECORD_READ_BUFFER if threads else 1)))
    it = PackIterDataset(it, seq_len=seq_len, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                         pad_id=tokenizer.pad_id, mode=_packing_mode(data_cfg))
    rows = iter(it)
    out: list[dict[str, np.ndarray]] = []
    pad_row = {"inputs": np.full(seq_len, tokenizer.pad_id, np.int32),
               "targets": np.full(seq_len, tokenizer.pad_id, np.int32),
               "segment_ids": np.zeros(seq_len, np.int32), "positions": np.zeros(seq_len, np.int32),
               "loss_mask": np.zeros(seq_len, np.float32)}
    done = False
    while len(out) < num_batches and not done:
        batch = []
        for _ in range(batch_size):
            try:
                batch.append(next(rows))
            except StopIteration:
                done = True
                break
        if not batch:
            break
        batch += [pad_row] * (batch_size - len(batch))
        out.append({k: np.stack([r[k] for r in batch]) for k in pad_row})
    if len(out) < num_batches:
        log.warning("make_eval_batches: the held-out split gives only %d of the %d requested batches "
                    "(batch_size=%d, seq_len=%d).", len(out), num_batches, batch_size, seq_len)
    return out


def checkpoint_save_args(iterator):
    """orbax save args for the data iterator (grain's handler: one JSON state file per process)."""
    return grain.checkpoint.CheckpointSave(item=iterator)


def checkpoint_restore_args(iterator):
    """orbax restore args: restores the state *into* `iterator` (built the same way as when saved)."""
    return grain.checkpoint.CheckpointRestore(item=iterator)
