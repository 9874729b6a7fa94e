"""On-disk format of prepared data: ArrayRecord shards of token-id documents plus `meta.json`.

A prepared folder holds
  train-00000.array_record, train-00001.array_record, ...   training documents
  val-00000.array_record, ...                               held-out documents
  train_hashes.npy                                          doc hash of every training document (sorted uint64)
  val_hashes.npy                                            doc hash of every held-out document (record order)
  meta.json                                                 written last: its presence marks a complete folder

Each ArrayRecord record is one document: its token ids *without* BOS/EOS (the packer adds them), as raw
little-endian bytes of `meta["dtype"]`: "uint16" when the vocabulary fits (vocab_size <= 65536, half the bytes
of int32), else "int32". Records are written with `group_size:1` so that a global shuffle can read any record
without decompressing its neighbours.

meta.json keys: format ("idattn-tokens-v1"), tokenizer {vocab_size, sha256, name, bos_id, eos_id}, dtype,
train_shards / val_shards (file names), train_docs, train_tokens, val_docs, val_tokens, shards (below), source
(what was read: the source string, subset, input files), val_fraction, doc_hashes, created (UTC time).

Shard checksums (`meta["shards"]`, written by prepare since it records them): {file name: {"records", "tokens",
"bytes", "sha256"}} for every train and val shard: its record count, its token count, its size in bytes and the
SHA-256 of the whole file, taken from the files as moved into place. The trainer (idattn.train.validate.
check_shards) refuses a shard whose size, record count or SHA-256 differs, and a meta.json whose train/val token
counts are not the sums of the shards'. Folders prepared before have no "shards" key (`shard_table` -> None):
they keep working, unverified (the trainer says so once).

Document hashes: a document's hash is the first 8 bytes of sha1(its UTF-8 text), little-endian, as uint64 (the
number the held-out rule reads as a fraction of 2^64; `idattn.data.prepare.doc_hash`). Recording them costs 8
bytes per document (80 MB for 10M documents) and lets `python -m idattn.eval` refuse to score a training
document as held-out. Folders prepared before they were recorded have no hash files (`read_doc_hashes` -> None).
"""
from __future__ import annotations

import hashlib
import json
import pathlib

import numpy as np

from idattn.data import stdlib_corpus

FORMAT = "idattn-tokens-v1"
META = "meta.json"
SHARD_SUFFIX = ".array_record"
TRAIN_HASHES = "train_hashes.npy"
VAL_HASHES = "val_hashes.npy"
# suffixes of the raw inputs prepare reads (idattn.data.prepare.FORMATS): a folder of these is text, not data
RAW_SUFFIXES = (".txt", ".text", ".md", ".jsonl", ".jsonl.gz", ".parquet", ".csv", ".csv.gz", ".tsv", ".tsv.gz",
                ".arrow")


SHARDS = "shards"  # meta.json key of the per-shard checksums (module docstring)


def file_sha256(path) -> str:
    """Hex SHA-256 of a whole file, read in 1 MiB blocks (hashlib releases the GIL: threads hash in parallel)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def shard_table(meta: dict) -> dict | None:
    """meta.json's {shard file name: {"records", "tokens", "bytes", "sha256"}}, or None for a folder prepared
    before prepare recorded them."""
    table = meta.get(SHARDS)
    return table if isinstance(table, dict) and table else None


def read_doc_hashes(data_dir, split: str) -> np.ndarray | None:
    """The uint64 document hashes of a prepared split (train: sorted; val: in record order), or None when the
    folder was prepared before they were recorded."""
    p = pathlib.Path(data_dir) / {"train": TRAIN_HASHES, "val": VAL_HASHES}[split]
    if not p.is_file():
        return None
    a = np.load(p, allow_pickle=False)
    if a.dtype != np.uint64 or a.ndim != 1:
        raise ValueError(f"{p}: expected a 1-D uint64 array of document hashes, got {a.dtype} {a.shape}; prepare "
                         "the folder again.")
    return a


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else int32."""
    return np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<i4")


def read_meta(data_dir) -> dict:
    """Read and check `<data_dir>/meta.json`; clear errors when the folder is not a prepared one."""
    d = pathlib.Path(data_dir)
    p = d / META
    if not p.is_file():
        shards = sorted(x.name for x in d.glob(f"*{SHARD_SUFFIX}")) if d.is_dir() else []
        raw = sorted(x.name for x in d.rglob("*") if x.is_file() and x.name.lower().endswith(RAW_SUFFIXES)) \
            if d.is_dir() and not shards else []
        if shards:
            fix = (f" It holds {len(shards)} shard(s) but no meta.json: an interrupted prepare; delete the folder "
                   f"and prepare again (`python -m idattn.data.prepare --source=<your texts> --out={d}`).")
        elif raw:  # raw text, not prepared data: prepare it into another folder (prepare refuses this one)
            fix = (f" It holds {len(raw)} text file(s) ({', '.join(raw[:2])}{', ...' if len(raw) > 2 else ''}): "
                   f"prepare them into a fresh folder with `python -m idattn.data.prepare --source={d} "
                   f"--out=<a new folder> --train_tokenizer=<vocab>` (JSON Lines, CSV / TSV, Parquet and Arrow: "
                   f"add --text_field=<field or column> when the text is not in 'text') and point data.path (and "
                   f"data.tokenizer) there.")
        else:
            fix = f" Create one with `python -m idattn.data.prepare --source=<your texts> --out={d}`."
        raise FileNotFoundError(f"data.path={str(d)!r}: no {META} there, so it is not a prepared data folder.{fix}")
    try:
        meta = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e}); the folder is damaged, prepare it again.") from e
    if meta.get("format") != FORMAT:
        raise ValueError(f"{p}: format={meta.get('format')!r}, expected {FORMAT!r}; prepare the data again with "
                         "this version of idattn.")
    return meta


def check_tokenizer_matches(data_dir, tokenizer) -> dict:
    """Raise when the data in `data_dir` was tokenised with another tokenizer than `tokenizer`; return meta."""
    meta = read_meta(data_dir)
    want = tokenizer.identity()
    have = meta.get("tokenizer", {})
    if have.get("vocab_size") != want["vocab_size"] or have.get("sha256") != want["sha256"]:
        raise ValueError(
            f"Tokenizer mismatch: the data in {str(data_dir)!r} was tokenised with "
            f"{have.get('name', '?')!r} (vocab_size={have.get('vocab_size')}, sha256={str(have.get('sha256'))[:16]}...)"
            f" but the config's data.tokenizer is {getattr(tokenizer, 'name', '?')!r} "
            f"(vocab_size={want['vocab_size']}, sha256={want['sha256'][:16]}...). Set data.tokenizer to the "
            "model the data was prepared with, or prepare the data again with this tokenizer into a new folder.")
    return meta


def shard_paths(data_dir, meta: dict, split: str) -> list[str]:
    key = {"train": "train_shards", "val": "val_shards"}[split]
    names = meta.get(key) or []
    if not names:
        raise ValueError(f"{data_dir}/{META}: no {key} listed; the {split} split is empty. Prepare the data again "
                         "with --val_fraction > 0 (prepare then guarantees a held-out split of --min_val_docs "
                         "documents and --min_val_tokens tokens), or with more documents.")
    paths = [pathlib.Path(data_dir) / n for n in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{data_dir}: meta.json lists shards that are missing: {missing[:3]}"
                                f"{' ...' if len(missing) > 3 else ''}; copy the whole folder or prepare again.")
    return [str(p) for p in paths]


def data_identity(data_cfg) -> dict:
    """What a run trains and validates on, by content rather than by name: {"source", "train", "val"}, where
    train / val are SHA-256 digests. For a prepared folder they are taken over each split's shard list with the
    per-shard checksums prepare recorded (a folder prepared again in place, with other documents, gets other
    digests although its path is the same; an older folder without checksums: names, sizes and counts); for the
    embedded corpora over the corpus id and the held-out fraction. A run records it at its first start and a resume
    compares it (idattn.train.trainer)."""
    source = str(data_cfg.get("source", "") or "")
    out: dict = {"source": source}

    def digest(items) -> str:
        return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()

    if source == "arrayrecord":
        path = str(data_cfg.get("path", "") or "")
        meta = read_meta(path)
        table = shard_table(meta) or {}
        for split in ("train", "val"):
            names = list(meta.get({"train": "train_shards", "val": "val_shards"}[split]) or [])
            rows = [[n, table.get(n) or {"bytes": (pathlib.Path(path) / n).stat().st_size
                                         if (pathlib.Path(path) / n).is_file() else None}] for n in names]
            out[split] = digest([rows, meta.get(f"{split}_tokens"), meta.get("tokenizer", {}).get("sha256")])
    elif source == "kjv":
        out["train"] = out["val"] = digest(["kjv-embedded-v1", float(data_cfg.get("val_fraction", 0.05))])
    elif source == "stdlib":
        out["train"] = out["val"] = digest([stdlib_corpus.corpus_id()])
    else:  # tfds and others: the name is all this version knows to record
        out["train"] = out["val"] = digest([source, str(data_cfg.get("tfds_name", "") or ""),
                                            str(data_cfg.get("path", "") or "")])
    return out
