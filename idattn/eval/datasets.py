"""Readers for evaluation datasets in their Hugging Face formats: local files first, the hub only on request.

A split is a list of dict records (one per document), exactly the rows `datasets.load_dataset(path, name,
split=split)` would give. Sources, in order:

1. `local` is a file: `.jsonl` (one JSON object a line), `.json` (a list of objects, or {"data": [...]}) or
   `.parquet`; read as is.
2. `local` is a folder: the files under it (recursively) whose relative path names the split as a word
   (`test.jsonl`, `data/validation-00000-of-00001.parquet`, `ARC-Easy/test-0000.parquet`,
   `default/test/0000.parquet`; "validation" also matches "dev" and "val"). When the folder has a
   sub-folder named after the dataset config (`ARC-Easy`, `wikitext-2-raw-v1`), only that one is searched.
   The files are concatenated in sorted path order.
3. `hub=True`: `datasets.load_dataset(hf_path, hf_name, split=split)` - imported lazily, never in tests; it
   needs the `datasets` package and the network.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Iterable

from idattn.data import jsonl

SPLIT_ALIASES = {"validation": ("validation", "dev", "val", "valid"), "test": ("test",), "train": ("train",)}
SUFFIXES = (".jsonl", ".json", ".parquet")


def read_records(path: str) -> list[dict[str, Any]]:
    """All rows of one .jsonl / .json / .parquet file as dicts."""
    if path.endswith(".jsonl"):
        return [row for _, row in jsonl.rows(path)]  # a bad line: jsonl.JsonlError (a ValueError), path:line
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
        if isinstance(obj, dict) and isinstance(obj.get("data"), list):
            obj = obj["data"]
        if not isinstance(obj, list):
            raise ValueError(f"{path}: expected a JSON list of records (or {{'data': [...]}}), got {type(obj).__name__}.")
        return obj
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: unsupported file type; expected one of {SUFFIXES}.")


def _split_files(folder: str, split: str, config_name: str | None) -> list[str]:
    root = folder
    if config_name and os.path.isdir(os.path.join(folder, config_name)):
        root = os.path.join(folder, config_name)
    names = SPLIT_ALIASES.get(split, (split,))
    pat = re.compile(r"(^|[^a-z0-9])(" + "|".join(map(re.escape, names)) + r")([^a-z0-9]|$)", re.I)
    files = []
    for p in sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True)):
        if not os.path.isfile(p) or not p.endswith(SUFFIXES):
            continue
        if pat.search(os.path.relpath(p, root)):
            files.append(p)
    return files


def load_split(hf_path: str, hf_name: str | None, split: str, *, local: str | None = None, hub: bool = False,
               limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of one dataset split (module docstring for the lookup order); `limit` keeps the first rows."""
    rows: list[dict[str, Any]]
    if local:
        if os.path.isfile(local):
            rows = read_records(local)
        elif os.path.isdir(local):
            files = _split_files(local, split, hf_name)
            if not files:
                raise FileNotFoundError(
                    f"load_split({hf_path!r}, split={split!r}): no .jsonl/.json/.parquet file naming the split "
                    f"under {local!r}. Put e.g. {split}.jsonl there (the Hugging Face rows of {hf_path}), or pass "
                    "hub=True to download.")
            rows = [r for f in files for r in read_records(f)]
        else:
            raise FileNotFoundError(f"load_split({hf_path!r}): local={local!r} is neither a file nor a folder.")
    elif hub:
        try:
            import datasets  # lazy: optional dependency, needs the network
        except ImportError as e:
            raise ImportError(f"load_split({hf_path!r}, hub=True) needs the `datasets` package; install it or "
                              "download the split and pass its folder as local=...") from e
        ds = datasets.load_dataset(hf_path, hf_name, split=split)
        rows = [dict(r) for r in (ds.select(range(min(limit, len(ds)))) if limit else ds)]
    else:
        raise ValueError(f"load_split({hf_path!r}, split={split!r}): no source; pass local=<file or folder> or "
                         "hub=True.")
    return rows[:limit] if limit else rows


def write_jsonl(path: str, rows: Iterable[dict[str, Any]]) -> str:
    """Writes rows as JSON Lines (used by tests and to cache hub downloads locally)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path
