"""Tokenise parquet text (FineWeb-Edu) into ArrayRecord shards: `python -m idattn.data.prepare`.

    python -m idattn.data.prepare --source HuggingFaceFW/fineweb-edu --subset sample-10BT \
        --out /data/fineweb-edu-10BT-mistral --tokenizer mistral --num_proc 16

Sources (`--source`):
  a Hugging Face hub dataset id (`owner/name`, e.g. HuggingFaceFW/fineweb-edu) with `--subset`
      (sample-10BT -> folder sample/10BT, sample-100BT -> sample/100BT, default -> data, CC-MAIN-... ->
      data/CC-MAIN-...; `--hf_data_dir` overrides the folder); files are listed and streamed through
      `huggingface_hub.HfFileSystem` (needs `huggingface_hub`; nothing is stored besides the output);
  a local folder (every *.parquet under it, recursively, sorted) or a single .parquet file;
  a bucket or other fsspec URL (gs://bucket/path, needs `gcsfs`), listed and streamed the same way.
Every file must be parquet with a string column `text`.

Output (`--out`, a local folder; see idattn.data.formats for the record format): train-XXXXX.array_record
shards of `--docs_per_shard` documents, val-XXXXX.array_record, meta.json. A document goes to the held-out
split when the first 8 bytes of sha1(text), read as a fraction of 2^64, fall below `--val_fraction`, until
`--max_val_docs` are held out: a stable, order-independent choice. Documents with empty text are skipped.

Tokenisation runs in `--num_proc` worker processes (forked; 0 tokenises in this process); the main process
reads record batches of `--batch_docs` texts and writes the records in input order, so the output is the same
for any worker count. At most 2 x num_proc batches are in flight, so memory stays bounded however large the
input.

Safety: everything is written to a staging folder inside `--out` and moved into place only when the whole
input was read; meta.json goes last. Refused, with nothing written over existing data: an input file that is
empty, not parquet or has no `text` column; an output folder holding data prepared with another tokenizer;
an output folder already holding prepared data with the same tokenizer (unless `--overwrite`); an output
folder holding other files.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import multiprocessing
import os
import pathlib
import shutil
import sys
from typing import Iterator

import numpy as np

from idattn.data import formats
from idattn.data.tokenizer import Tokenizer, load_tokenizer


class PrepareError(ValueError):
    """Input or output refused by prepare (message says why and what to do)."""


# ----------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------

def _hf_subset_dir(subset: str) -> str:
    if subset.startswith("sample-"):
        return "sample/" + subset[len("sample-"):]
    if subset in ("", "default"):
        return "data"
    return "data/" + subset


def _is_hub_id(source: str) -> bool:
    return ("://" not in source and source.count("/") == 1 and not os.path.exists(source)
            and not source.startswith((".", "/", "~")))


def list_inputs(source: str, subset: str | None = None, hf_data_dir: str | None = None):
    """Return (filesystem or None for local, sorted list of parquet paths)."""
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
        import fsspec
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
    p = pathlib.Path(source).expanduser()
    if p.is_file():
        return None, [str(p)]
    if not p.is_dir():
        raise PrepareError(f"--source={source!r}: no such file or folder (expected a parquet folder, a .parquet "
                           "file, a hub id like HuggingFaceFW/fineweb-edu, or gs://bucket/path).")
    files = sorted(str(f) for f in p.rglob("*.parquet"))
    if not files:
        raise PrepareError(f"--source={source!r}: the folder holds no *.parquet files.")
    return None, files


def _open_parquet(fs, path: str):
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        handle = fs.open(path, "rb") if fs is not None else path
        pf = pq.ParquetFile(handle)
    except (pa.ArrowException, OSError) as e:
        raise PrepareError(f"input shard {path!r} is not a readable parquet file ({e}); it is corrupt or "
                           "truncated. Re-download it or remove it from the source.") from e
    if "text" not in pf.schema_arrow.names:
        raise PrepareError(f"input shard {path!r} has no 'text' column (columns: {pf.schema_arrow.names}); "
                           "prepare reads the FineWeb(-Edu) layout with a string column 'text'.")
    if pf.metadata.num_rows == 0:
        raise PrepareError(f"input shard {path!r} is empty (0 rows); remove it from the source or re-download it.")
    return pf


def iter_text_batches(fs, files, batch_docs: int) -> Iterator[tuple[str, list[str]]]:
    """(file, texts) for record batches of up to batch_docs rows, in file then row order."""
    import pyarrow as pa
    for path in files:
        pf = _open_parquet(fs, path)
        try:
            for rb in pf.iter_batches(batch_size=batch_docs, columns=["text"]):
                texts = [t if t is not None else "" for t in rb.column(0).to_pylist()]
                yield path, texts
        except (pa.ArrowException, OSError) as e:
            raise PrepareError(f"input shard {path!r} is corrupt: reading it failed part-way ({e}). "
                               "Re-download it or remove it from the source.") from e


# ----------------------------------------------------------------------------------------------------------
# Tokenisation workers
# ----------------------------------------------------------------------------------------------------------

_WORKER: dict = {}


def _init_worker(proto: bytes, dtype: str, val_fraction: float) -> None:
    _WORKER["tok"] = Tokenizer(proto, "worker")
    _WORKER["dtype"] = np.dtype(dtype)
    _WORKER["val"] = float(val_fraction)


def _val_hash(text: str) -> float:
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "little") / 2.0**64


def _tokenize_batch(texts: list[str]) -> list[tuple[bytes, int, bool]]:
    """-> [(record bytes, n_tokens, held_out)] for the non-empty texts, in order."""
    tok, dtype, frac = _WORKER["tok"], _WORKER["dtype"], _WORKER["val"]
    texts = [t for t in texts if t]
    out = []
    for t, ids in zip(texts, tok.encode_batch(texts)):
        out.append((np.asarray(ids, dtype).tobytes(), len(ids), _val_hash(t) < frac))
    return out


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
        known = set(meta.get("train_shards", [])) | set(meta.get("val_shards", [])) | {formats.META}
        others = [e.name for e in entries if e.name not in known]
        if others:
            raise PrepareError(f"--out={str(out)!r} holds files prepare did not write ({others[:3]}); refusing "
                               "to overwrite; choose a new --out.")
        return meta
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


class _ShardWriter:
    def __init__(self, folder: pathlib.Path, prefix: str, docs_per_shard: int):
        self.folder, self.prefix, self.per = folder, prefix, docs_per_shard
        self.names: list[str] = []
        self._w = None
        self._n = 0
        self.docs = 0
        self.tokens = 0

    def write(self, record: bytes, n_tokens: int) -> None:
        from array_record.python.array_record_module import ArrayRecordWriter
        if self._w is None or self._n >= self.per:
            self.close()
            name = f"{self.prefix}-{len(self.names):05d}{formats.SHARD_SUFFIX}"
            self._w = ArrayRecordWriter(str(self.folder / name), "group_size:1")
            self.names.append(name)
            self._n = 0
        self._w.write(record)
        self._n += 1
        self.docs += 1
        self.tokens += n_tokens

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self._w = None


def prepare(source: str, out: str, *, tokenizer: str | Tokenizer = "mistral", subset: str | None = None,
            hf_data_dir: str | None = None, val_fraction: float = 0.0005, max_val_docs: int = 10_000,
            docs_per_shard: int = 100_000, num_proc: int | None = None, batch_docs: int = 1024,
            max_docs: int | None = None, max_tokens: int | None = None, overwrite: bool = False,
            log=print) -> dict:
    """Tokenise `source` into ArrayRecord shards in `out`; returns the meta dict written (module docstring)."""
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)
    if not 0.0 <= val_fraction < 1.0:
        raise PrepareError(f"--val_fraction={val_fraction}; expected a number in [0, 1).")
    if docs_per_shard < 1 or batch_docs < 1:
        raise PrepareError(f"--docs_per_shard={docs_per_shard}, --batch_docs={batch_docs}; expected positive ints.")
    out_p = pathlib.Path(out).expanduser()
    if "://" in str(out):
        raise PrepareError(f"--out={out!r}: write to a local (or mounted, e.g. gcsfuse) folder and copy it to the "
                           "bucket afterwards; ArrayRecord writes local files.")
    old_meta = _check_output(out_p, tok, overwrite)
    dtype = formats.token_dtype(tok.vocab_size)
    num_proc = (os.cpu_count() or 1) if num_proc is None else int(num_proc)
    args = (tok.model_proto, dtype.str, val_fraction)
    # Workers are forked before any remote filesystem starts its I/O threads (fork after that can deadlock);
    # fork needs no re-import of __main__, unlike spawn.
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    pool = ctx.Pool(num_proc, initializer=_init_worker, initargs=args) if num_proc > 0 else None
    try:
        fs, files = list_inputs(source, subset, hf_data_dir)
        if fs is None:  # local inputs: check every file before tokenising anything
            for f in files:
                _open_parquet(None, f)
    except BaseException:
        if pool is not None:
            pool.terminate()
            pool.join()
        raise

    out_p.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(out_p)
    staging = out_p / f".prepare-staging-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    train_w = _ShardWriter(staging, "train", docs_per_shard)
    val_w = _ShardWriter(staging, "val", docs_per_shard)
    try:
        if pool is None:
            _init_worker(*args)
        pending: collections.deque = collections.deque()
        batches = iter_text_batches(fs, files, batch_docs)
        stop = False

        def consume(results):
            nonlocal stop
            for record, n, held_out in results:
                if held_out and val_w.docs < max_val_docs:
                    val_w.write(record, n)
                else:
                    train_w.write(record, n)
                if (max_docs is not None and train_w.docs >= max_docs) or (
                        max_tokens is not None and train_w.tokens >= max_tokens):
                    stop = True
                    return

        for n_batch, (_, texts) in enumerate(batches, 1):
            if pool is None:
                consume(_tokenize_batch(texts))
            else:
                pending.append(pool.apply_async(_tokenize_batch, (texts,)))
                if len(pending) >= 2 * num_proc:
                    consume(pending.popleft().get())
            if stop:
                break
            if n_batch % 200 == 0:
                log(f"prepare: {train_w.docs} train docs, {train_w.tokens} tokens, {val_w.docs} val docs")
        while pending and not stop:
            consume(pending.popleft().get())
        train_w.close()
        val_w.close()
        if train_w.docs == 0:
            raise PrepareError(f"--source={source!r}: no non-empty documents were read; nothing to write.")
        meta = {
            "format": formats.FORMAT,
            "tokenizer": {**tok.identity(), "name": tok.name, "bos_id": tok.bos_id, "eos_id": tok.eos_id},
            "dtype": dtype.name,
            "train_shards": train_w.names, "val_shards": val_w.names,
            "train_docs": train_w.docs, "train_tokens": train_w.tokens,
            "val_docs": val_w.docs, "val_tokens": val_w.tokens,
            "source": {"source": source, "subset": subset, "files": [str(f) for f in files],
                       "max_docs": max_docs, "max_tokens": max_tokens, "stopped_early": stop},
            "val_fraction": val_fraction, "max_val_docs": max_val_docs,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        (staging / formats.META).write_text(json.dumps(meta, indent=2))
    except BaseException:
        train_w.close()
        val_w.close()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    # Success: replace the old data (if --overwrite), move the new shards in, meta.json last.
    if old_meta is not None:
        (out_p / formats.META).unlink()
        for name in old_meta.get("train_shards", []) + old_meta.get("val_shards", []):
            (out_p / name).unlink(missing_ok=True)
    for name in train_w.names + val_w.names:
        os.replace(staging / name, out_p / name)
    os.replace(staging / formats.META, out_p / formats.META)
    staging.rmdir()
    log(f"prepare: wrote {train_w.docs} train docs ({train_w.tokens} tokens, {len(train_w.names)} shards) and "
        f"{val_w.docs} val docs ({val_w.tokens} tokens) to {out_p}")
    return meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m idattn.data.prepare", description=__doc__.split("\n")[0])
    p.add_argument("--source", required=True, help="hub id (HuggingFaceFW/fineweb-edu), local folder/file, gs://...")
    p.add_argument("--subset", default=None, help="hub subset, e.g. sample-10BT")
    p.add_argument("--hf_data_dir", default=None, help="hub folder, overrides the subset mapping")
    p.add_argument("--out", required=True, help="local output folder")
    p.add_argument("--tokenizer", default="mistral", help="mistral | path to .model | train:<vocab>")
    p.add_argument("--val_fraction", type=float, default=0.0005)
    p.add_argument("--max_val_docs", type=int, default=10_000)
    p.add_argument("--docs_per_shard", type=int, default=100_000)
    p.add_argument("--num_proc", type=int, default=None, help="tokeniser processes (default: all CPUs; 0: inline)")
    p.add_argument("--batch_docs", type=int, default=1024)
    p.add_argument("--max_docs", type=int, default=None, help="stop after this many train documents")
    p.add_argument("--max_tokens", type=int, default=None, help="stop after this many train tokens")
    p.add_argument("--overwrite", action="store_true", help="replace data prepared with the same tokenizer")
    a = p.parse_args(argv)
    try:
        prepare(a.source, a.out, tokenizer=a.tokenizer, subset=a.subset, hf_data_dir=a.hf_data_dir,
                val_fraction=a.val_fraction, max_val_docs=a.max_val_docs, docs_per_shard=a.docs_per_shard,
                num_proc=a.num_proc, batch_docs=a.batch_docs, max_docs=a.max_docs, max_tokens=a.max_tokens,
                overwrite=a.overwrite)
    except PrepareError as e:
        print(f"prepare: refused: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
