"""On-disk format of prepared data: ArrayRecord shards of token-id documents plus `meta.json`.

A prepared folder holds
  train-00000.array_record, train-00001.array_record, ...   training documents
  val-00000.array_record, ...                               held-out documents
  meta.json                                                 written last: its presence marks a complete folder

Each ArrayRecord record is one document: its token ids *without* BOS/EOS (the packer adds them), as raw
little-endian bytes of `meta["dtype"]`: "uint16" when the vocabulary fits (vocab_size <= 65536, half the bytes
of int32), else "int32". Records are written with `group_size:1` so that a global shuffle can read any record
without decompressing its neighbours.

meta.json keys: format ("idattn-tokens-v1"), tokenizer {vocab_size, sha256, name, bos_id, eos_id}, dtype,
train_shards / val_shards (file names), train_docs, train_tokens, val_docs, val_tokens, source (what was read:
the source string, subset, input files), val_fraction, created (UTC time).
"""
from __future__ import annotations

import json
import pathlib

import numpy as np

FORMAT = "idattn-tokens-v1"
META = "meta.json"
SHARD_SUFFIX = ".array_record"


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else int32."""
    return np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<i4")


def read_meta(data_dir) -> dict:
    """Read and check `<data_dir>/meta.json`; clear errors when the folder is not a prepared one."""
    d = pathlib.Path(data_dir)
    p = d / META
    if not p.is_file():
        shards = sorted(x.name for x in d.glob(f"*{SHARD_SUFFIX}")) if d.is_dir() else []
        extra = (f" It holds {len(shards)} shard(s) but no meta.json: an interrupted prepare; delete the folder "
                 "and prepare again.") if shards else ""
        raise FileNotFoundError(f"data.path={str(d)!r}: no {META} there, so it is not a prepared data folder."
                                f"{extra} Create one with `python -m idattn.data.prepare --out {d} ...`.")
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
