"""Tokenise text into ArrayRecord shards: `python -m idattn.data.prepare --source=... --out=...`.

    python -m idattn.data.prepare --source=my_texts/ --out=data/mine --train_tokenizer=4096
    python -m idattn.data.prepare --source='notes/*.jsonl.gz' --text_field=body --out=data/notes --tokenizer=tok.model
    python -m idattn.data.prepare --source HuggingFaceFW/fineweb-edu --subset sample-10BT \
        --out /data/fineweb-edu-10BT-mistral --tokenizer mistral --num_proc 16
    python -m idattn.data.prepare tokenizer --source=my_texts/ --vocab=4096 --out=my_tok.model   # a tokenizer only

Sources (`--source`; several may be given comma-separated, and formats may be mixed: each file is read by the
reader of its own format):
  local files, folders (every file of an accepted format under it, recursively, sorted) or glob patterns
      (`'corpus/**/*.txt'`), in these formats (by file name; `--format` forces one):
        text      .txt .text .md   one document per file, or cut into documents at every `--separator`
                                   (e.g. --separator='\n\n\n' or a marker line '<|endoftext|>'; backslash
                                   escapes are decoded);
        jsonl     .jsonl .jsonl.gz one JSON object a line, the document in `--text_field` (default "text");
        parquet   .parquet         a string column `--text_field` (default "text");
        csv, tsv  .csv .tsv (.gz)  a header row and a column `--text_field` (RFC 4180 quoting: cells may hold
                                   newlines, the delimiter and doubled quotes);
        arrow     .arrow           a column `--text_field` of Arrow IPC files; a folder saved by Hugging Face
                                   `datasets` (`save_to_disk`) is read in its own file order (a DatasetDict: its
                                   `train` split, or pass a split's folder);
      any other suffix is refused, naming these formats;
  a Hugging Face hub dataset id (`owner/name`, e.g. HuggingFaceFW/fineweb-edu) with `--subset`
      (sample-10BT -> folder sample/10BT, sample-100BT -> sample/100BT, default -> data, CC-MAIN-... ->
      data/CC-MAIN-...; `--hf_data_dir` overrides the folder): its parquet files are listed and streamed through
      `huggingface_hub.HfFileSystem` (needs `huggingface_hub`; nothing is stored besides the output);
  a bucket or other fsspec URL (gs://bucket/path, needs `gcsfs`): its parquet files, listed and streamed the same way.

Tokenizer: `--tokenizer` (mistral | path to a SentencePiece .model | train:<vocab> on the embedded KJV text), or
`--train_tokenizer=<vocab>`: train a SentencePiece model on the *training* documents of `--source` itself (the
held-out ones never reach it; same settings as the project's own, `idattn.data.tokenizer.train_sentencepiece`),
write it to `<out>/tokenizer.model` and tokenise with it. Then set `data.tokenizer=<out>/tokenizer.model`.

Output (`--out`, a local folder; see idattn.data.formats for the record format): train-XXXXX.array_record
shards of `--docs_per_shard` documents, val-XXXXX.array_record, train_hashes.npy / val_hashes.npy (each
document's `doc_hash`, 8 bytes a document: what lets `python -m idattn.eval` tell training documents from held-out
ones), meta.json (and tokenizer.model when trained). meta.json records every shard's record count, token count,
size and SHA-256 (its "shards" table), which the trainer checks at start: a shard changed after prepare is refused.

Held-out split: a document goes to it when the first 8 bytes of sha1(text), read as a fraction of 2^64, fall
below `--val_fraction`, until `--max_val_docs` are held out: a stable, order-independent choice. When
`--val_fraction` > 0 the split is guaranteed usable: if the rule holds out fewer than `--min_val_docs`
documents or `--min_val_tokens` tokens (a small corpus), the training documents with the smallest hashes are
moved to it until both minimums hold; if that would take more than half of the corpus's tokens, prepare
refuses with the numbers (and writes nothing). `--val_fraction=0` means no held-out split (the trainer then
refuses to start a config that validates on it). Documents with empty text are skipped.

Tokenisation runs in `--num_proc` worker processes started with "spawn" (a fresh interpreter: never a fork of a
process that may have JAX or I/O threads loaded; 0 tokenises in this process); the main process reads batches
of `--batch_docs` texts and writes the records in input order, so the output is the same for any worker count.
At most 2 x num_proc batches are in flight, so memory stays bounded however large the input.

Safety: everything is written to a staging folder inside `--out` and moved into place only when the whole
input was read; meta.json goes last. Refused, with nothing written: an unknown input format, an input file that
is empty, unreadable or lacks the text field; a held-out split below the minimums; an output folder holding
data prepared with another tokenizer; an output folder already holding prepared data with the same tokenizer
(unless `--overwrite`); an output folder holding other files.
"""
from __future__ import annotations

import argparse
import array
import codecs
import collections
import csv
import datetime
import glob
import hashlib
import heapq
import json
import multiprocessing
import os
import pathlib
import shlex
import shutil
import sys
from typing import Iterator

import fsspec
import numpy as np

from idattn import atomic
from idattn.data import corpus, formats, jsonl, stdlib_corpus
from idattn.data.tokenizer import MIN_TRAIN_VOCAB, Tokenizer, load_tokenizer, train_sentencepiece


class PrepareError(ValueError):
    """Input or output refused by prepare (message says why and what to do)."""


# ----------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------

FORMATS = {"text": (".txt", ".text", ".md"), "jsonl": (".jsonl", ".jsonl.gz"), "parquet": (".parquet",),
           "csv": (".csv", ".csv.gz"), "tsv": (".tsv", ".tsv.gz"), "arrow": (".arrow",)}
ACCEPTED = "plain text (" + " ".join(FORMATS["text"]) + "), JSON Lines (" + " ".join(FORMATS["jsonl"]) + \
    "), parquet (.parquet), CSV / TSV (.csv .tsv, .gz), Arrow (.arrow: a `datasets` save_to_disk folder), or a " \
    "Hugging Face hub id (owner/name)"
FORMAT_CHOICES = "|".join(FORMATS)
_GLOB_CHARS = "*?["


def file_format(path: str, forced: str | None = None) -> str | None:
    """A format name of FORMATS ("text", "jsonl", "parquet", "csv", "tsv", "arrow") from the file name (or `forced`);
    None when the suffix is not accepted."""
    if forced:
        return forced
    name = str(path).lower()
    for fmt, suffixes in FORMATS.items():
        if name.endswith(suffixes):
            return fmt
    return None


def _hf_subset_dir(subset: str) -> str:
    if subset.startswith("sample-"):
        return "sample/" + subset[len("sample-"):]
    if subset in ("", "default"):
        return "data"
    return "data/" + subset


def _is_hub_id(source: str) -> bool:
    return ("://" not in source and source.count("/") == 1 and not os.path.exists(source)
            and not source.startswith((".", "/", "~")) and not any(c in source for c in _GLOB_CHARS)
            and file_format(source) is None)


def _local_files(source: str, forced: str | None) -> list[str]:
    """Files of one local source (file, folder or glob), all of accepted formats, sorted."""
    if any(c in source for c in _GLOB_CHARS):
        hits = sorted(glob.glob(os.path.expanduser(source), recursive=True))
        files = [f for f in hits if os.path.isfile(f)]
        if not files:
            raise PrepareError(f"--source={source!r}: the pattern matches no files.")
        bad = [f for f in files if file_format(f, forced) is None]
        if bad:
            raise PrepareError(f"--source={source!r} matches {bad[0]!r}, whose format is unknown; accepted: "
                               f"{ACCEPTED}. Narrow the pattern (e.g. '*.txt') or pass --format={FORMAT_CHOICES}.")
        return files
    p = pathlib.Path(source).expanduser()
    if p.is_file():
        if file_format(str(p), forced) is None:
            raise PrepareError(f"--source={source!r}: unknown format (suffix {''.join(p.suffixes) or 'none'!r}); "
                               f"accepted: {ACCEPTED}. Rename the file or pass --format={FORMAT_CHOICES}.")
        return [str(p)]
    if not p.is_dir():
        raise PrepareError(f"--source={source!r}: no such file or folder (expected {ACCEPTED}, a folder or glob "
                           "of such files, or gs://bucket/path).")
    if (p / "dataset_dict.json").is_file():  # a `datasets` DatasetDict saved with save_to_disk: one split
        splits = json.loads((p / "dataset_dict.json").read_text()).get("splits", [])
        if "train" not in splits:
            raise PrepareError(f"--source={source!r} is a saved DatasetDict with splits {splits} and no 'train'; "
                               f"pass one split's folder, e.g. --source={p / splits[0]}" if splits else
                               f"--source={source!r}: dataset_dict.json lists no split.")
        p = p / "train"
    every = sorted(str(f) for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
    if (p / "state.json").is_file():  # a saved `datasets` Dataset: its Arrow files, in the order it lists them
        names = [d["filename"] for d in json.loads((p / "state.json").read_text()).get("_data_files", [])]
        return [str(p / n) for n in names] or [f for f in every if f.endswith(".arrow")]
    files = [f for f in every if file_format(f, forced) is not None]
    if not files:
        raise PrepareError(f"--source={source!r}: the folder holds no file of an accepted format ({ACCEPTED}); "
                           f"found {[os.path.basename(f) for f in every[:3]]}. Pass --format=text to read them "
                           "as plain text, or --text_field=<field> with --format=jsonl|csv|tsv|parquet for "
                           "structured files.")
    return files


def list_inputs(source: str, subset: str | None = None, hf_data_dir: str | None = None,
                fmt: str | None = None):
    """Return (filesystem or None for local, sorted list of input paths); see the module docstring."""
    if fmt is not None and fmt not in FORMATS:
        raise PrepareError(f"--format={fmt!r}; expected one of {sorted(FORMATS)} (or leave it out to go by suffix).")
    if source.startswith("hf://") or _is_hub_id(source):
        try:
            from huggingface_hub import HfFileSystem
        except ImportError as e:
            raise PrepareError("--source is a Hugging Face hub id; reading it needs the package huggingface_hub "
                               "(pip install huggingface_hub), or download the parquet files and pass their "
                               "folder.") from e
        repo = source[len("hf://"):] if source.startswith("hf://") else source
        repo = repo[len("datasets/"):] if repo.startswith("datasets/") else repo
        folder = hf_data_dir if hf_data_dir is not None else _hf_subset_dir(subset or "default")
        fs = HfFileSystem()
        files = sorted(fs.glob(f"datasets/{repo}/{folder}/**/*.parquet"))
        if not files:
            raise PrepareError(f"--source={source!r} --subset={subset!r}: no parquet files under "
                               f"datasets/{repo}/{folder}; check the subset name (e.g. sample-10BT) or pass "
                               "--hf_data_dir.")
        return fs, files
    if "://" in source:
        proto = source.split("://", 1)[0]
        try:
            fs = fsspec.filesystem(proto)
        except (ImportError, ValueError) as e:
            extra = " (pip install gcsfs)" if proto in ("gs", "gcs") else ""
            raise PrepareError(f"--source={source!r}: cannot open the {proto}:// filesystem ({e}){extra}.") from e
        root = source.rstrip("/")
        files = [root] if root.endswith(".parquet") else sorted(fs.glob(root + "/**/*.parquet"))
        files = [f if "://" in f else f"{proto}://{f}" for f in files]
        if not files:
            raise PrepareError(f"--source={source!r}: no *.parquet files found there.")
        return fs, files
    files: list[str] = []
    for part in [x for x in source.split(",") if x.strip()] or [source]:
        files += [f for f in _local_files(part.strip(), fmt) if f not in files]
    return None, files  # formats may be mixed: each file is read by the reader of its own format


def _open_parquet(fs, path: str, field: str = "text"):
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        handle = fs.open(path, "rb") if fs is not None else path
        pf = pq.ParquetFile(handle)
    except (pa.ArrowException, OSError) as e:
        raise PrepareError(f"input shard {path!r} is not a readable parquet file ({e}); it is corrupt or "
                           "truncated. Re-download it or remove it from the source.") from e
    if field not in pf.schema_arrow.names:
        raise PrepareError(f"input shard {path!r} has no {field!r} column (columns: {pf.schema_arrow.names}); "
                           "pass --text_field=<column> (FineWeb(-Edu) uses 'text').")
    if pf.metadata.num_rows == 0:
        raise PrepareError(f"input shard {path!r} is empty (0 rows); remove it from the source or re-download it.")
    return pf


def _open_text(path: str, newline: str | None = None):
    return jsonl.open_text(path, newline)


def _iter_jsonl(path: str, field: str) -> Iterator[str]:
    try:
        for _, text in jsonl.texts(path, field):
            yield text
    except jsonl.JsonlError as e:
        raise PrepareError(str(e)) from None


def _iter_csv(path: str, field: str, delimiter: str) -> Iterator[str]:
    """The `field` column of a CSV / TSV file with a header row (RFC 4180 quoting: a quoted cell may hold the
    delimiter, doubled quotes and newlines)."""
    csv.field_size_limit(1 << 30)  # a document is one cell: the default 128 KiB limit is too small
    kind = "TSV" if delimiter == "\t" else "CSV"
    try:
        with _open_text(path, newline="") as f:
            reader = csv.DictReader(f, delimiter=delimiter)
            if not reader.fieldnames or field not in reader.fieldnames:
                raise PrepareError(f"{path}: no column {field!r} in the header row (columns: "
                                   f"{reader.fieldnames or []}); pass --text_field=<column>.")
            for row in reader:
                if None in row:  # more cells than the header names: a quoting error upstream
                    raise PrepareError(f"{path}:{reader.line_num}: more cells than the header's "
                                       f"{len(reader.fieldnames)} columns; check the file's quoting ({kind}).")
                yield row[field] or ""
    except csv.Error as e:
        raise PrepareError(f"{path}: not valid {kind} ({e}).") from e
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise PrepareError(f"{path}: unreadable ({e}); expected UTF-8 {kind} with a header row.") from e


def _arrow_batches(path: str, field: str):
    """Record batches of the `field` column of an Arrow IPC file (stream format, as `datasets` writes it, or
    the random-access file format)."""
    import pyarrow as pa
    try:
        source = pa.memory_map(path)
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(pa.memory_map(path))
            reader = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            schema = reader[0].schema if reader else None
        else:
            schema = reader.schema
    except (pa.ArrowException, OSError) as e:
        raise PrepareError(f"{path}: not a readable Arrow file ({e}); it is corrupt or truncated.") from e
    if schema is None or field not in schema.names:
        raise PrepareError(f"{path}: no column {field!r} (columns: {schema.names if schema else []}); pass "
                           "--text_field=<column>.")
    for rb in reader:
        yield rb.column(schema.get_field_index(field))


def _iter_arrow(path: str, field: str) -> Iterator[str]:
    for col in _arrow_batches(path, field):
        yield from (t if t is not None else "" for t in col.to_pylist())


def _iter_plain(path: str, separator: str | None) -> Iterator[str]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise PrepareError(f"{path}: unreadable as UTF-8 text ({e}); convert it to UTF-8 or leave it out.") from e
    if separator:
        yield from (d.strip("\n") for d in text.split(separator))
    else:
        yield text


def _check_local(path: str, fmt: str, field: str) -> None:
    """Refuse an unusable local input before anything is tokenised or written."""
    if fmt == "parquet":
        _open_parquet(None, path, field)
        return
    if os.path.getsize(path) == 0:
        raise PrepareError(f"input file {path!r} is empty; remove it from the source.")
    readers = {"jsonl": lambda: _iter_jsonl(path, field), "csv": lambda: _iter_csv(path, field, ","),
               "tsv": lambda: _iter_csv(path, field, "\t"), "arrow": lambda: _iter_arrow(path, field)}
    if fmt in readers:
        for _ in readers[fmt]():  # the first row checks the field and the encoding
            break


def iter_texts(fs, files, *, fmt: str | None = None, field: str = "text",
               separator: str | None = None) -> Iterator[str]:
    """Document texts of every input file, in file then document order."""
    import pyarrow as pa
    for path in files:
        kind = file_format(path, fmt) or "parquet"  # hub / bucket listings are parquet
        if kind == "text":
            yield from _iter_plain(path, separator)
        elif kind == "jsonl":
            yield from _iter_jsonl(path, field)
        elif kind in ("csv", "tsv"):
            yield from _iter_csv(path, field, "," if kind == "csv" else "\t")
        elif kind == "arrow":
            yield from _iter_arrow(path, field)
        else:
            pf = _open_parquet(fs, path, field)
            try:
                for rb in pf.iter_batches(batch_size=1024, columns=[field]):
                    yield from (t if t is not None else "" for t in rb.column(0).to_pylist())
            except (pa.ArrowException, OSError) as e:
                raise PrepareError(f"input shard {path!r} is corrupt: reading it failed part-way ({e}). "
                                   "Re-download it or remove it from the source.") from e


def iter_text_batches(fs, files, batch_docs: int, **kw) -> Iterator[list[str]]:
    """Lists of up to batch_docs texts, in input order."""
    batch: list[str] = []
    for t in iter_texts(fs, files, **kw):
        batch.append(t)
        if len(batch) >= batch_docs:
            yield batch
            batch = []
    if batch:
        yield batch


# ----------------------------------------------------------------------------------------------------------
# Tokenisation workers
# ----------------------------------------------------------------------------------------------------------

_WORKER: dict = {}


def _init_worker(proto: bytes, dtype: str) -> None:
    _WORKER["tok"] = Tokenizer(proto, "worker")
    _WORKER["dtype"] = np.dtype(dtype)


def doc_hash(text: str) -> int:
    """A document's identity: the first 8 bytes of sha1(UTF-8 text), little-endian, as an unsigned 64-bit int. The
    held-out rule reads it as a fraction of 2^64; `<out>/train_hashes.npy` records those of the training
    documents, so that `python -m idattn.eval` can tell a training document from a held-out one."""
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "little")


def _val_hash(text: str) -> float:
    return doc_hash(text) / 2.0**64


def _tokenize_batch(texts: list[str]) -> list[tuple[bytes, int, int]]:
    """-> [(record bytes, n_tokens, doc_hash)] for the non-empty texts, in order."""
    tok, dtype = _WORKER["tok"], _WORKER["dtype"]
    texts = [t for t in texts if t]
    return [(np.asarray(ids, dtype).tobytes(), len(ids), doc_hash(t))
            for t, ids in zip(texts, tok.encode_batch(texts))]


def training_hashes(data_cfg) -> tuple[np.ndarray | None, str]:
    """(sorted uint64 doc_hash of every training document of a run's data config, or None; what they are) for
    data.source='kjv' (the split is computed) and 'arrayrecord' (the folder's train_hashes.npy, written by prepare
    since it records them); None with the reason for anything else (tfds, a folder prepared before)."""
    get = data_cfg.get if hasattr(data_cfg, "get") else (lambda k, d=None: getattr(data_cfg, k, d))
    source = str(get("source", "kjv"))
    if source == "kjv":
        train, _ = corpus.kjv_documents(val_fraction=float(get("val_fraction", 0.05)))
        return np.unique(np.fromiter((doc_hash(t) for t in train), np.uint64, len(train))), "kjv training documents"
    if source == "stdlib":
        train = [t for _, t in stdlib_corpus.split()[0]]
        return (np.unique(np.fromiter((doc_hash(t) for t in train), np.uint64, len(train))),
                "stdlib training files")
    if source == "arrayrecord":
        path = str(get("path", ""))
        h = formats.read_doc_hashes(path, "train")
        if h is None:
            return None, (f"data.path={path} has no {formats.TRAIN_HASHES} (prepared before prepare recorded "
                          "them; prepare it again to enable the check)")
        return h, f"training documents of {path}"
    return None, f"data.source={source!r} records no document hashes"


def reprepare_command(meta: dict, out) -> str:
    """The `python -m idattn.data.prepare ... --overwrite` command that writes `out` again as its meta.json says it
    was written (prepare is deterministic: the same shards, byte for byte, from the same inputs): the source, the
    tokenizer option and every recorded setting that is not the default."""
    src = meta.get("source") or {}
    tok = meta.get("tokenizer") or {}
    args = [f"--source={src.get('source') or '<your texts>'}"]
    if src.get("subset"):
        args.append(f"--subset={src['subset']}")
    args += [f"--out={out}", "--overwrite"]
    if (tok.get("trained") or {}).get("vocab_size"):
        args.append(f"--train_tokenizer={tok['trained']['vocab_size']}")
    elif tok.get("name") and tok["name"] != "mistral":
        args.append(f"--tokenizer={tok['name']}")
    defaults = {"val_fraction": 0.0005, "max_val_docs": 10_000, "min_val_docs": 2, "min_val_tokens": 2048}
    args += [f"--{k}={meta[k]}" for k, v in defaults.items() if meta.get(k) is not None and meta[k] != v]
    shards, table = meta.get("train_shards") or [], meta.get(formats.SHARDS) or {}
    if len(shards) > 1 and isinstance(table.get(shards[0]), dict):  # the first of several shards is a full one
        per = table[shards[0]].get("records")
        if per and per != 100_000:
            args.append(f"--docs_per_shard={per}")
    if src.get("text_field") not in (None, "text"):
        args.append(f"--text_field={src['text_field']}")
    if src.get("separator"):
        args.append(f"--separator={codecs.encode(src['separator'], 'unicode_escape').decode()}")
    args += [f"--{k}={src[k]}" for k in ("max_docs", "max_tokens") if src.get(k) is not None]
    return shlex.join(["python", "-m", "idattn.data.prepare", *args])


# ----------------------------------------------------------------------------------------------------------
# Output folder checks
# ----------------------------------------------------------------------------------------------------------

def _check_output(out: pathlib.Path, tok: Tokenizer, overwrite: bool) -> dict | None:
    """Refuse unsafe outputs; return the existing meta when it will be replaced (overwrite)."""
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out={str(out)!r} exists and is not a folder; choose another --out.")
    if not out.exists():
        return None
    entries = [e for e in out.iterdir() if not e.name.startswith(".prepare-staging-")]
    if not entries:
        return None
    if (out / formats.META).is_file():
        try:
            meta = formats.read_meta(out)
        except (ValueError, FileNotFoundError) as e:
            raise PrepareError(f"--out={str(out)!r} holds a damaged meta.json ({e}); choose another --out.") from e
        have = meta.get("tokenizer", {})
        want = tok.identity()
        if have.get("sha256") != want["sha256"] or have.get("vocab_size") != want["vocab_size"]:
            raise PrepareError(
                f"--out={str(out)!r} already holds data tokenised with {have.get('name', '?')!r} (vocab_size="
                f"{have.get('vocab_size')}, sha256={str(have.get('sha256'))[:16]}...), not with the requested "
                f"tokenizer {tok.name!r} (vocab_size={want['vocab_size']}, sha256={want['sha256'][:16]}...). "
                "Refusing to mix or replace it: choose a new --out folder.")
        if not overwrite:
            raise PrepareError(f"--out={str(out)!r} already holds prepared data ({meta.get('train_docs')} train "
                               "documents) with this tokenizer; pass --overwrite to replace it, or choose a new "
                               "--out.")
        known = (set(meta.get("train_shards", [])) | set(meta.get("val_shards", [])) |
                 {formats.META, TOKENIZER_FILE, formats.TRAIN_HASHES, formats.VAL_HASHES})
        others = [e.name for e in entries if e.name not in known]
        if others:
            raise PrepareError(f"--out={str(out)!r} holds files prepare did not write ({others[:3]}); refusing "
                               "to overwrite; choose a new --out.")
        return meta
    if any(e.name.lower().endswith(formats.RAW_SUFFIXES) for e in entries):  # a corpus: never suggest deleting it
        raise PrepareError(f"--out={str(out)!r} holds no meta.json but text files ({[e.name for e in entries][:3]}"
                           "...): a corpus, not prepared data; prepare writes into a folder of its own: pass them "
                           "as --source and choose a new, empty --out.")
    raise PrepareError(f"--out={str(out)!r} is not empty and holds no meta.json ({[e.name for e in entries][:3]}"
                       "...): not a prepared folder, or an interrupted one. Choose a new --out (or delete it).")


# ----------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------

def _remove_stale_staging(out: pathlib.Path) -> None:
    """Delete staging folders left by killed prepare runs (their pid is gone); a live run's is kept."""
    for d in out.glob(".prepare-staging-*"):
        try:
            os.kill(int(d.name.rsplit("-", 1)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError):
            pass


TOKENIZER_FILE = "tokenizer.model"
# Training documents with the smallest held-out hashes remembered for the validation guarantee (bounded memory).
_RESERVE = 100_000


class _ShardWriter:
    def __init__(self, folder: pathlib.Path, prefix: str, docs_per_shard: int):
        self.folder, self.prefix, self.per = folder, prefix, docs_per_shard
        self.names: list[str] = []
        self._w = None
        self._n = 0
        self.docs = 0
        self.tokens = 0
        self.hashes = array.array("Q")  # doc_hash of every document written, in record order (8 bytes each)
        self.stats: dict[str, list[int]] = {}  # shard name -> [records, tokens] (meta.json's "shards" table)

    def write(self, record: bytes, n_tokens: int, h: int) -> None:
        from array_record.python.array_record_module import ArrayRecordWriter
        if self._w is None or self._n >= self.per:
            self.close()
            name = f"{self.prefix}-{len(self.names):05d}{formats.SHARD_SUFFIX}"
            self._w = ArrayRecordWriter(str(self.folder / name), "group_size:1")
            self.names.append(name)
            self.stats[name] = [0, 0]
            self._n = 0
        self._w.write(record)
        self._n += 1
        stat = self.stats[self.names[-1]]
        stat[0] += 1
        stat[1] += n_tokens
        self.docs += 1
        self.tokens += n_tokens
        self.hashes.append(h)

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self._w = None


def _promote_to_val(staging: pathlib.Path, train_w: "_ShardWriter", val_w: "_ShardWriter", promote: set,
                    docs_per_shard: int, itemsize: int) -> "_ShardWriter":
    """Move the training documents whose indices are in `promote` to the held-out split (rewrites the staged
    training shards; only happens for small corpora). Returns the new training writer."""
    from array_record.python.array_record_module import ArrayRecordReader
    old = [staging / n for n in train_w.names]
    tmp = staging / "rewrite"
    tmp.mkdir()
    new_w = _ShardWriter(tmp, "train", docs_per_shard)
    i = 0
    for path in old:
        r = ArrayRecordReader(str(path))
        n = r.num_records()
        for rec in r.read(list(range(n))) if n else []:
            ntok = len(rec) // itemsize
            (val_w if i in promote else new_w).write(rec, ntok, train_w.hashes[i])
            i += 1
        r.close()
        path.unlink()
    new_w.close()
    val_w.close()
    for name in new_w.names:
        os.replace(tmp / name, staging / name)
    tmp.rmdir()
    new_w.folder = staging
    return new_w


def decode_separator(sep: str | None) -> str | None:
    if not sep:
        return None
    return codecs.decode(sep, "unicode_escape") if "\\" in sep else sep


def train_tokenizer_on(source: str, vocab: int, *, fs=None, files=None, fmt: str | None = None,
                       field: str = "text", separator: str | None = None, val_fraction: float = 0.0,
                       subset: str | None = None, hf_data_dir: str | None = None) -> bytes:
    """A SentencePiece model (`train_sentencepiece`, the project's settings) trained on the documents of `source`
    that the held-out rule (sha1 fraction < val_fraction) keeps for training. Returns the model proto."""
    if files is None:
        fs, files = list_inputs(source, subset, hf_data_dir, fmt)
    failure: list[BaseException] = []

    def texts():
        # An input error raised inside sentencepiece's C++ trainer would surface as its traceback: keep it,
        # end the stream, and raise it after the trainer returns, the same one-line refusal as --tokenizer.
        try:
            for t in iter_texts(fs, files, fmt=fmt, field=field, separator=separator):
                if t and not _val_hash(t) < val_fraction:
                    yield t
        except (PrepareError, FileNotFoundError) as e:
            failure.append(e)

    try:
        proto = train_sentencepiece(texts(), int(vocab))
    except (ValueError, RuntimeError) as e:
        if failure:
            raise failure[0] from None
        raise PrepareError(f"--train_tokenizer={vocab}: {e}") from e
    if failure:
        raise failure[0]
    return proto


def _check_args(out: str, *, val_fraction: float, docs_per_shard: int, batch_docs: int, min_val_docs: int,
                min_val_tokens: int, max_val_docs: int) -> pathlib.Path:
    """Phase 1a: refuse impossible numbers and outputs; the output folder as a path."""
    if not 0.0 <= val_fraction < 1.0:
        raise PrepareError(f"--val_fraction={val_fraction}; expected a number in [0, 1).")
    if docs_per_shard < 1 or batch_docs < 1:
        raise PrepareError(f"--docs_per_shard={docs_per_shard}, --batch_docs={batch_docs}; expected positive ints.")
    if min_val_docs < 0 or min_val_tokens < 0 or (val_fraction > 0 and min_val_docs > max_val_docs):
        raise PrepareError(f"--min_val_docs={min_val_docs}, --min_val_tokens={min_val_tokens}, --max_val_docs="
                           f"{max_val_docs}; expected 0 <= min_val_docs <= max_val_docs and min_val_tokens >= 0.")
    out_p = pathlib.Path(out).expanduser()
    if "://" in str(out):
        raise PrepareError(f"--out={out!r}: write to a local (or mounted, e.g. gcsfuse) folder and copy it to the "
                           "bucket afterwards; ArrayRecord writes local files.")
    if out_p.exists() and not out_p.is_dir():
        raise PrepareError(f"--out={str(out_p)!r} exists and is not a folder; choose another --out.")
    return out_p


def _resolve_inputs(source: str, subset, hf_data_dir, fmt, text_field: str):
    """Phase 1b: (filesystem or None, input files); every local file is checked before anything is tokenised."""
    fs, files = list_inputs(source, subset, hf_data_dir, fmt)
    if fs is None:
        for f in files:
            _check_local(f, file_format(f, fmt), text_field)
    return fs, files


def _resolve_tokenizer(source, out_p, tokenizer, train_tokenizer, *, fs, files, fmt, text_field, separator,
                       val_fraction, log) -> tuple[Tokenizer, bytes | None]:
    """Phase 1c: (tokenizer, trained model proto or None): `--train_tokenizer` trains one on the training documents."""
    if not train_tokenizer:
        return (tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)), None
    log(f"prepare: training a {train_tokenizer}-piece SentencePiece tokenizer on the training documents of "
        f"{source}")
    proto = train_tokenizer_on(source, int(train_tokenizer), fs=fs, files=files, fmt=fmt, field=text_field,
                               separator=separator, val_fraction=val_fraction)
    return Tokenizer(proto, name=str((out_p / TOKENIZER_FILE).resolve())), proto


class _Staged:
    """What phase 2 wrote into the staging folder: the two writers, the reserve for the validation guarantee and
    whether --max_docs / --max_tokens stopped the read."""

    def __init__(self, staging: pathlib.Path, docs_per_shard: int):
        self.train = _ShardWriter(staging, "train", docs_per_shard)
        self.val = _ShardWriter(staging, "val", docs_per_shard)
        self.reserve: list[tuple[float, int, int]] = []  # max-heap (by -hash) of the smallest-hash training docs
        self.stopped = False

    def close(self) -> None:
        self.train.close()
        self.val.close()


def _tokenise_to_staging(st: _Staged, fs, files, *, tok: Tokenizer, dtype: np.dtype, num_proc: int,
                         batch_docs: int, fmt, text_field, separator, val_fraction: float, max_val_docs: int,
                         max_docs, max_tokens, log) -> None:
    """Phase 2: read the inputs in batches, tokenise them (in `num_proc` spawned workers), write every document
    to the train or val shards in input order, and remember each one's doc_hash."""
    # "spawn": workers are fresh interpreters, never forks of a process that may hold JAX's or a remote
    # filesystem's threads (a fork of those can deadlock); they import only numpy and sentencepiece.
    args = (tok.model_proto, dtype.str)
    pool = None
    try:
        if num_proc > 0:
            pool = multiprocessing.get_context("spawn").Pool(num_proc, initializer=_init_worker, initargs=args)
        else:
            _init_worker(*args)
        pending: collections.deque = collections.deque()

        def consume(results) -> None:
            for record, n, h in results:
                u = h / 2.0**64
                if u < val_fraction and st.val.docs < max_val_docs:
                    st.val.write(record, n, h)
                else:
                    if val_fraction > 0:
                        item = (-u, st.train.docs, n)
                        if len(st.reserve) < _RESERVE:
                            heapq.heappush(st.reserve, item)
                        elif item > st.reserve[0]:
                            heapq.heapreplace(st.reserve, item)
                    st.train.write(record, n, h)
                if (max_docs is not None and st.train.docs >= max_docs) or (
                        max_tokens is not None and st.train.tokens >= max_tokens):
                    st.stopped = True
                    return

        batches = iter_text_batches(fs, files, batch_docs, fmt=fmt, field=text_field, separator=separator)
        for n_batch, texts in enumerate(batches, 1):
            if pool is None:
                consume(_tokenize_batch(texts))
            else:
                pending.append(pool.apply_async(_tokenize_batch, (texts,)))
                if len(pending) >= 2 * num_proc:
                    consume(pending.popleft().get())
            if st.stopped:
                break
            if n_batch % 200 == 0:
                log(f"prepare: {st.train.docs} train docs, {st.train.tokens} tokens, {st.val.docs} val docs")
        while pending and not st.stopped:
            consume(pending.popleft().get())
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    st.close()


def _guarantee_val(st: _Staged, staging: pathlib.Path, source: str, *, val_fraction: float, min_val_docs: int,
                   min_val_tokens: int, docs_per_shard: int, itemsize: int, log) -> int:
    """Phase 3: refuse an empty corpus; top a too-small held-out split up with the training documents of smallest
    hash (a stable choice), or refuse with the numbers. Returns the number of documents moved."""
    if st.train.docs + st.val.docs == 0:
        raise PrepareError(f"--source={source!r}: no non-empty documents were read; nothing to write.")
    promoted = 0
    if val_fraction > 0 and (st.val.docs < min_val_docs or st.val.tokens < min_val_tokens):
        cands = sorted((-h, i, n) for h, i, n in st.reserve)
        promote, docs, toks = set(), st.val.docs, st.val.tokens
        for _, i, n in cands:
            if docs >= min_val_docs and toks >= min_val_tokens:
                break
            promote.add(i)
            docs, toks = docs + 1, toks + n
        total_docs, total_toks = st.train.docs + st.val.docs, st.train.tokens + st.val.tokens
        if docs < min_val_docs or toks < min_val_tokens or 2 * toks > total_toks or docs >= total_docs:
            raise PrepareError(
                f"validation split: the corpus has {total_docs} documents / {total_toks} tokens; a held-out "
                f"split of >= {min_val_docs} documents and >= {min_val_tokens} tokens would take {docs} "
                f"documents / {toks} tokens ({100 * toks / max(total_toks, 1):.0f}% of the tokens; at most 50% "
                "allowed). Add text, or lower --min_val_docs / --min_val_tokens (or --val_fraction=0 for no "
                "held-out split).")
        if promote:
            st.train = _promote_to_val(staging, st.train, st.val, promote, docs_per_shard, itemsize)
            promoted = len(promote)
            log(f"prepare: the held-out rule (val_fraction={val_fraction}) kept {st.val.docs - promoted} "
                f"documents; moved {promoted} more to the validation split to reach >= {min_val_docs} "
                f"documents and >= {min_val_tokens} tokens")
    if st.train.docs == 0:
        raise PrepareError(f"--source={source!r}: every document went to the held-out split; add text or "
                           "lower --val_fraction.")
    return promoted


def _stage_meta(st: _Staged, staging: pathlib.Path, *, tok: Tokenizer, trained_proto, train_tokenizer, dtype,
                source, subset, files, fmt, text_field, separator, max_docs, max_tokens, val_fraction,
                max_val_docs, min_val_docs, min_val_tokens, promoted) -> dict:
    """Phase 4: the document hashes, the trained tokenizer and meta.json, into the staging folder."""
    np.save(staging / formats.TRAIN_HASHES, np.unique(np.frombuffer(st.train.hashes, np.uint64)))
    np.save(staging / formats.VAL_HASHES, np.frombuffer(st.val.hashes, np.uint64))
    if trained_proto is not None:
        (staging / TOKENIZER_FILE).write_bytes(trained_proto)
    shards = {}  # per-shard checksums, checked by the trainer at start (formats module docstring)
    for w in (st.train, st.val):
        for name in w.names:
            records, tokens = w.stats[name]
            shards[name] = {"records": records, "tokens": tokens, "bytes": (staging / name).stat().st_size,
                            "sha256": formats.file_sha256(staging / name)}
    meta = {
        "format": formats.FORMAT,
        "tokenizer": {**tok.identity(), "name": tok.name, "bos_id": tok.bos_id, "eos_id": tok.eos_id},
        "dtype": dtype.name,
        "train_shards": st.train.names, "val_shards": st.val.names,
        "train_docs": st.train.docs, "train_tokens": st.train.tokens,
        "val_docs": st.val.docs, "val_tokens": st.val.tokens,
        formats.SHARDS: shards,
        "doc_hashes": {"train": formats.TRAIN_HASHES, "val": formats.VAL_HASHES,
                       "hash": "first 8 bytes of sha1(UTF-8 text), little-endian uint64"},
        "source": {"source": source, "subset": subset, "files": [str(f) for f in files],
                   "format": sorted({file_format(f, fmt) or "parquet" for f in files}),
                   "text_field": text_field, "separator": separator,
                   "max_docs": max_docs, "max_tokens": max_tokens, "stopped_early": st.stopped},
        "val_fraction": val_fraction, "max_val_docs": max_val_docs, "min_val_docs": min_val_docs,
        "min_val_tokens": min_val_tokens, "val_promoted": promoted,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if trained_proto is not None:
        meta["tokenizer"]["trained"] = {"file": TOKENIZER_FILE, "vocab_size": int(train_tokenizer)}
    (staging / formats.META).write_text(json.dumps(meta, indent=2))
    return meta


def _move_into_place(st: _Staged, staging: pathlib.Path, out_p: pathlib.Path, old_meta: dict | None,
                     trained: bool) -> None:
    """Phase 5 (success only): replace the old data (if --overwrite), move the new files in, meta.json last."""
    extra = [formats.TRAIN_HASHES, formats.VAL_HASHES] + ([TOKENIZER_FILE] if trained else [])
    if old_meta is not None:
        (out_p / formats.META).unlink()
        for name in (old_meta.get("train_shards", []) + old_meta.get("val_shards", []) +
                     [TOKENIZER_FILE, formats.TRAIN_HASHES, formats.VAL_HASHES]):
            (out_p / name).unlink(missing_ok=True)
    for name in st.train.names + st.val.names + extra:
        os.replace(staging / name, out_p / name)
    os.replace(staging / formats.META, out_p / formats.META)
    staging.rmdir()


def prepare(source: str, out: str, *, tokenizer: str | Tokenizer = "mistral", subset: str | None = None,
            hf_data_dir: str | None = None, val_fraction: float = 0.0005, max_val_docs: int = 10_000,
            min_val_docs: int = 2, min_val_tokens: int = 2048, docs_per_shard: int = 100_000,
            num_proc: int | None = None, batch_docs: int = 1024, max_docs: int | None = None,
            max_tokens: int | None = None, overwrite: bool = False, fmt: str | None = None,
            text_field: str = "text", separator: str | None = None, train_tokenizer: int | None = None,
            log=print) -> dict:
    """Tokenise `source` into ArrayRecord shards in `out`; returns the meta dict written (module docstring).

    Phases: resolve (arguments, inputs, tokenizer, output folder: every refusal before anything is written),
    tokenise into a staging folder, guarantee the held-out split, stage the hashes and meta.json, move into place."""
    out_p = _check_args(out, val_fraction=val_fraction, docs_per_shard=docs_per_shard, batch_docs=batch_docs,
                        min_val_docs=min_val_docs, min_val_tokens=min_val_tokens, max_val_docs=max_val_docs)
    separator = decode_separator(separator)
    fs, files = _resolve_inputs(source, subset, hf_data_dir, fmt, text_field)
    tok, trained_proto = _resolve_tokenizer(source, out_p, tokenizer, train_tokenizer, fs=fs, files=files, fmt=fmt,
                                            text_field=text_field, separator=separator, val_fraction=val_fraction,
                                            log=log)
    old_meta = _check_output(out_p, tok, overwrite)
    dtype = formats.token_dtype(tok.vocab_size)
    num_proc = (os.cpu_count() or 1) if num_proc is None else int(num_proc)

    created = not out_p.exists()
    out_p.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(out_p)
    staging = out_p / f".prepare-staging-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    st = _Staged(staging, docs_per_shard)
    try:
        _tokenise_to_staging(st, fs, files, tok=tok, dtype=dtype, num_proc=num_proc, batch_docs=batch_docs, fmt=fmt,
                             text_field=text_field, separator=separator, val_fraction=val_fraction,
                             max_val_docs=max_val_docs, max_docs=max_docs, max_tokens=max_tokens, log=log)
        promoted = _guarantee_val(st, staging, source, val_fraction=val_fraction, min_val_docs=min_val_docs,
                                  min_val_tokens=min_val_tokens, docs_per_shard=docs_per_shard,
                                  itemsize=dtype.itemsize, log=log)
        meta = _stage_meta(st, staging, tok=tok, trained_proto=trained_proto, train_tokenizer=train_tokenizer,
                           dtype=dtype, source=source, subset=subset, files=files, fmt=fmt, text_field=text_field,
                           separator=separator, max_docs=max_docs, max_tokens=max_tokens, val_fraction=val_fraction,
                           max_val_docs=max_val_docs, min_val_docs=min_val_docs, min_val_tokens=min_val_tokens,
                           promoted=promoted)
    except BaseException:
        st.close()
        shutil.rmtree(staging, ignore_errors=True)
        if created and not any(out_p.iterdir()):
            out_p.rmdir()  # created by this run: leave nothing behind
        raise
    _move_into_place(st, staging, out_p, old_meta, trained_proto is not None)
    log(f"prepare: wrote {st.train.docs} train docs ({st.train.tokens} tokens, {len(st.train.names)} shards) and "
        f"{st.val.docs} val docs ({st.val.tokens} tokens) to {out_p}")
    if trained_proto is not None:
        log(f"prepare: tokenizer {out_p / TOKENIZER_FILE} ({tok.vocab_size} pieces); train with "
            f"--config.data.source=arrayrecord --config.data.tokenizer={out_p / TOKENIZER_FILE} "
            f"--config.data.path={out_p}")
    return meta


def main(argv=None) -> int:
    """`python -m idattn.data.prepare --source=... --out=...`, or `python -m idattn.data.prepare tokenizer ...`
    (`tokenizer_main`: a tokenizer only)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["tokenizer"]:
        return tokenizer_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m idattn.data.prepare", description=__doc__.split("\n")[0],
                                epilog="A tokenizer only: python -m idattn.data.prepare tokenizer --help. Details: "
                                       "python -c 'import idattn.data.prepare as p; help(p)' or docs/data.md")
    p.add_argument("--source", required=True,
                   help="file(s), folder, glob ('texts/*.txt'), hub id (HuggingFaceFW/fineweb-edu) or gs://...; "
                        "comma-separated for several")
    p.add_argument("--format", default=None, choices=sorted(FORMATS), help="force the input format (default: suffix)")
    p.add_argument("--text_field", default="text", help="JSON Lines field / parquet, CSV, TSV or Arrow column holding the text")
    p.add_argument("--separator", default=None,
                   help="plain text: cut files into documents at this string (backslash escapes decoded, e.g. "
                        "'\\n\\n\\n'); default: one document per file")
    p.add_argument("--subset", default=None, help="hub subset, e.g. sample-10BT")
    p.add_argument("--hf_data_dir", default=None, help="hub folder, overrides the subset mapping")
    p.add_argument("--out", required=True, help="local output folder")
    p.add_argument("--tokenizer", default="mistral", help="mistral | path to .model | train:<vocab> (KJV text)")
    p.add_argument("--train_tokenizer", type=int, default=None, metavar="VOCAB",
                   help="train a VOCAB-piece SentencePiece model on --source's training documents, write it to "
                        "<out>/tokenizer.model and use it (instead of --tokenizer)")
    p.add_argument("--val_fraction", type=float, default=0.0005)
    p.add_argument("--max_val_docs", type=int, default=10_000)
    p.add_argument("--min_val_docs", type=int, default=2, help="held-out split minimum (documents)")
    p.add_argument("--min_val_tokens", type=int, default=2048, help="held-out split minimum (tokens)")
    p.add_argument("--docs_per_shard", type=int, default=100_000)
    p.add_argument("--num_proc", type=int, default=None, help="tokeniser processes (default: all CPUs; 0: inline)")
    p.add_argument("--batch_docs", type=int, default=1024)
    p.add_argument("--max_docs", type=int, default=None, help="stop after this many train documents")
    p.add_argument("--max_tokens", type=int, default=None, help="stop after this many train tokens")
    p.add_argument("--overwrite", action="store_true", help="replace data prepared with the same tokenizer")
    a = p.parse_args(argv)
    try:
        prepare(a.source, a.out, tokenizer=a.tokenizer, subset=a.subset, hf_data_dir=a.hf_data_dir,
                val_fraction=a.val_fraction, max_val_docs=a.max_val_docs, min_val_docs=a.min_val_docs,
                min_val_tokens=a.min_val_tokens, docs_per_shard=a.docs_per_shard, num_proc=a.num_proc,
                batch_docs=a.batch_docs, max_docs=a.max_docs, max_tokens=a.max_tokens, overwrite=a.overwrite,
                fmt=a.format, text_field=a.text_field, separator=a.separator, train_tokenizer=a.train_tokenizer)
    except (PrepareError, FileNotFoundError) as e:
        print(f"prepare: refused: {e}", file=sys.stderr)
        return 2
    return 0


def tokenizer_main(argv=None) -> int:
    """`python -m idattn.data.prepare tokenizer --source=<files|folder|glob|hub id> --vocab=N --out=<file>.model`.

    Here, not in idattn.data.tokenizer, because it reads the inputs the way prepare does (and leaves out the
    documents prepare would hold out): prepare imports the tokenizer module, never the reverse."""
    t = argparse.ArgumentParser(prog="python -m idattn.data.prepare tokenizer",
                                description="Train a SentencePiece tokenizer on your own text (the settings of "
                                            "train_sentencepiece: BPE, byte fallback, identity normalisation, "
                                            "<unk>=0 <s>=1 </s>=2, one thread so the model is reproducible).")
    t.add_argument("--source", required=True, help="the same forms as `python -m idattn.data.prepare --source`")
    t.add_argument("--vocab", type=int, required=True, help=f"vocabulary size (>= {MIN_TRAIN_VOCAB})")
    t.add_argument("--out", required=True, help="output path ending in .model")
    t.add_argument("--format", default=None, choices=sorted(FORMATS))
    t.add_argument("--text_field", default="text")
    t.add_argument("--separator", default=None, help="plain text: document separator (default: one per file)")
    t.add_argument("--val_fraction", type=float, default=0.0005,
                   help="leave out the documents prepare would hold out with this fraction (use the same value)")
    t.add_argument("--overwrite", action="store_true")
    a = t.parse_args(argv)
    out = pathlib.Path(a.out).expanduser()
    try:
        if out.suffix != ".model":
            raise PrepareError(f"--out={a.out!r}: expected a path ending in .model (e.g. tok.model).")
        if out.exists() and not a.overwrite:
            raise PrepareError(f"--out={a.out!r} exists; pass --overwrite or choose another path.")
        if a.vocab < MIN_TRAIN_VOCAB:
            raise PrepareError(f"--vocab={a.vocab}; expected >= {MIN_TRAIN_VOCAB} (256 byte pieces + specials).")
        proto = train_tokenizer_on(a.source, a.vocab, fmt=a.format, field=a.text_field,
                                        separator=decode_separator(a.separator), val_fraction=a.val_fraction)
    except PrepareError as e:
        print(f"tokenizer: refused: {e}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(str(out), proto)
    tok = Tokenizer(proto, str(out))
    print(f"tokenizer: wrote {out} ({tok.vocab_size} pieces, sha256 {tok.identity()['sha256'][:16]}...); use it with "
          f"--tokenizer={out} (prepare) and data.tokenizer={out} (train, eval)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
