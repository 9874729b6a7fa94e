"""A second built-in corpus of long documents: the Python standard library's source files of the running
interpreter (always present, no download), for length extrapolation (the reproduction's `length` table).

**Which files.** Every `*.py` file under `sysconfig.get_paths()["stdlib"]`, walked in sorted order, as POSIX paths
relative to that folder, except:

- `site-packages/` and `dist-packages/` (installed third-party code, which differs between machines);
- test folders: any path component named `test`, `tests` or `idle_test` (the stdlib's own test suite is ~40% of
  its source and full of generated data and deliberately broken files), and `__pycache__`;
- files that are not valid UTF-8 (none in CPython 3.11's stdlib outside the test suite; counted in
  `corpus_info()["skipped_not_utf8"]`), and symlinks (so one file is never listed twice).

**Naming the corpus exactly.** `corpus_info()` records the interpreter (`sys.version`, implementation, the stdlib
folder), the number of files, `files_sha256` (sha256 of the newline-joined sorted relative paths: the file list)
and `content_sha256` (sha256 over every file's length-prefixed bytes in list order: the texts). A result measured
on this corpus should carry `corpus_info()` (the `corpus_id()` string is its short form), so a number names the
interpreter and file set it came from.

**Held-out files.** A file is held out when the first 16 hex digits of sha256("stdlib-heldout-v1:" + path),
read as an integer, fall below `val_fraction * 2**64` (default 10%). The rule depends on the path alone, so the
split is disjoint by construction, the same on every machine with the same file list, and adding or removing a
file moves no other file between the splits. Documents are whole files (one file = one document), so a held-out
document never shares text with a training one beyond what two stdlib modules share.

**Tokenizer.** `idattn.data.tokenizer.train_stdlib_tokenizer(vocab)` (the `stdlib:<vocab>` spec) trains the
project's SentencePiece recipe (`train_sentencepiece`: BPE, byte fallback, identity normalisation, 1 thread, so
byte-identical everywhere) on the *training* files of `split` only, and caches it under their content hash.

Long documents: CPython 3.11's stdlib has hundreds of files above 32K characters (a 256-token training context is
~1K characters of code), so 8x and 16x the training context fit inside single held-out files.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import sys
import sysconfig
from functools import lru_cache
from typing import Any

# folder names inside the stdlib (one string, split: these are the interpreter's folders, not this repository's)
EXCLUDED_DIRS = frozenset("site-packages dist-packages test tests idle_test __pycache__".split())
SPLIT_SALT = "stdlib-heldout-v1:"
VAL_FRACTION = 0.1


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def list_files(root: str | None = None) -> list[str]:
    """Sorted relative POSIX paths of the corpus's candidate files (module docstring), before the UTF-8 check."""
    root = os.path.abspath(root or stdlib_root())
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in EXCLUDED_DIRS and not os.path.islink(os.path.join(d, x)))
        for f in sorted(files):
            p = os.path.join(d, f)
            if f.endswith(".py") and not os.path.islink(p):
                out.append(pathlib.Path(os.path.relpath(p, root)).as_posix())
    return sorted(out)


@lru_cache(maxsize=4)
def _load(root: str) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    docs, skipped = [], []
    for rel in list_files(root):
        data = pathlib.Path(root, rel).read_bytes()
        try:
            docs.append((rel, data.decode("utf-8")))
        except UnicodeDecodeError:
            skipped.append(rel)
    return tuple(docs), tuple(skipped)


def documents(root: str | None = None) -> list[tuple[str, str]]:
    """[(relative path, text)] of every corpus file, in list order."""
    return list(_load(os.path.abspath(root or stdlib_root()))[0])


def is_heldout(rel: str, val_fraction: float = VAL_FRACTION) -> bool:
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"stdlib corpus: val_fraction={val_fraction!r}; expected a number in [0, 1)")
    h = int(hashlib.sha256((SPLIT_SALT + rel).encode()).hexdigest()[:16], 16)
    return h < val_fraction * 2 ** 64


def split(root: str | None = None, val_fraction: float = VAL_FRACTION
          ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, held-out): [(path, text)] each, in list order, by the path-hash rule."""
    docs = documents(root)
    return ([d for d in docs if not is_heldout(d[0], val_fraction)],
            [d for d in docs if is_heldout(d[0], val_fraction)])


def _sha_list(paths) -> str:
    return hashlib.sha256("\n".join(paths).encode()).hexdigest()


def content_hash(docs) -> str:
    h = hashlib.sha256()
    for _, text in docs:
        b = text.encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def corpus_info(root: str | None = None, val_fraction: float = VAL_FRACTION) -> dict[str, Any]:
    """What names this corpus exactly: interpreter, folder, file list hash, content hash, split sizes."""
    root = os.path.abspath(root or stdlib_root())
    docs, skipped = _load(root)
    train, held = split(root, val_fraction)
    return {"corpus": "python-stdlib", "python": sys.version.split()[0], "python_full": sys.version,
            "implementation": sys.implementation.name, "root": root, "num_files": len(docs),
            "files_sha256": _sha_list([p for p, _ in docs]), "content_sha256": content_hash(docs),
            "skipped_not_utf8": list(skipped), "excluded_dirs": sorted(EXCLUDED_DIRS),
            "split": {"rule": f"sha256({SPLIT_SALT!r} + path)[:16] < {val_fraction} * 2**64",
                      "val_fraction": val_fraction, "train_files": len(train), "heldout_files": len(held),
                      "train_chars": sum(len(t) for _, t in train), "heldout_chars": sum(len(t) for _, t in held)}}


def corpus_id(root: str | None = None) -> str:
    """Short name of the corpus for result files: `python-stdlib-<version>-<files_sha256[:12]>`."""
    info = corpus_info(root)
    return f"python-stdlib-{info['python']}-{info['files_sha256'][:12]}"


def long_documents(min_chars: int, heldout: bool = True, root: str | None = None) -> list[tuple[str, str]]:
    """The held-out (or training) files of at least `min_chars` characters, in list order."""
    train, held = split(root)
    return [d for d in (held if heldout else train) if len(d[1]) >= min_chars]
