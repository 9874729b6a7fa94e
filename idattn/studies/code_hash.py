"""The code a study's numbers depend on, as hashes a run records (idattn.studies.repro_runs, the quickstart):
the model code (`source_hash`, re-verifiable by evaluating a trained run) and the training code (`train_code_hash`
for language-model runs, `synthetic_train_hash` for MQAR / MAD / state tracking; not re-verifiable: a change
trains the run again)."""
from __future__ import annotations

import ast
import hashlib
import io
import os
import pathlib
import tokenize

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # idattn/


class CodeHashError(RuntimeError):
    """The package has none of the files a hash covers (a broken install)."""


SRC_DIRS = ("ops", "layers", "models")  # inside the package
# Left out of the hash: the fused Pallas kernels. Every model of the study runs impl="chunked" and
# attn_impl="xla" (experiments/repro.py; asserted in tests/test_repro.py), so no study run executes them, and a
# GPU / TPU kernel change must not retrain the CPU study (it did once: every run went stale).
SRC_EXCLUDE = (os.path.join("ops", "pallas"),)


_SRC: list[str] = []


def code_text(source: str) -> str:
    """A Python file's code without its comments, docstrings and blank lines: what a hash of the model code sees.
    Comments are found by `tokenize` (a '#' inside a string is not one), docstrings by `ast` (the string statement
    opening a module, class or function body, removed with the lines it spans); both agree across the Python
    versions this project runs (3.11 here, 3.12 on the device images), where token streams and `ast.dump` do not.
    Source that does not parse is hashed as it is."""
    try:
        tree = ast.parse(source)
        comments = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    except (SyntaxError, tokenize.TokenError):
        return source
    lines = source.splitlines()
    for t in reversed(comments):  # cut each comment from its line (a line holds at most one, at its end)
        (row, col) = t.start
        lines[row - 1] = lines[row - 1][:col]
    drop = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            drop.update(range(body[0].lineno, body[0].end_lineno + 1))
    return "\n".join(ln.rstrip() for i, ln in enumerate(lines, 1) if i not in drop and ln.strip())


def source_hash() -> str:
    """sha1 (10 hex) of the model code: every .py file under idattn/ops, idattn/layers and idattn/models but the
    fused kernels (SRC_EXCLUDE: no study run executes them), each reduced to its code (`code_text`: no comments,
    docstrings or blank lines, so that rewording the prose beside the math retrains and re-verifies nothing), as
    a sorted set of per-file hashes, so that moving or renaming a file changes nothing either; any change of code
    re-verifies a finished run."""
    if not _SRC:
        digests = []
        skip = [os.path.join(PACKAGE, x) for x in SRC_EXCLUDE]
        for d in SRC_DIRS:
            for root, _, files in os.walk(os.path.join(PACKAGE, d)):
                if any(root == x or root.startswith(x + os.sep) for x in skip):
                    continue
                digests += [hashlib.sha1(code_text(pathlib.Path(root, n).read_text()).encode()).hexdigest()
                            for n in files if n.endswith(".py")]
        if not digests:
            raise CodeHashError(f"no model code under {PACKAGE}/{{{','.join(SRC_DIRS)}}} to hash")
        _SRC.append(hashlib.sha1("".join(sorted(digests)).encode()).hexdigest()[:10])
    return _SRC[0]


# What decides a run's numbers besides the model: the loss and the update (train/step.py), the optimiser and the
# schedule (train/optim.py), packing (data/pipeline.py) and the token ids (data/tokenizer.py). A change here cannot
# be re-verified by evaluating the trained parameters (their perplexity is that of the old training), so a finished
# run trained with other training code is trained again (check_reuse); files are named, not globbed, because the
# rest of idattn/train (checkpointing, leases, metrics) moves no number.
TRAIN_FILES = (os.path.join("train", "step.py"), os.path.join("train", "optim.py"),
               os.path.join("data", "pipeline.py"), os.path.join("data", "tokenizer.py"))
_TRAIN_SRC: list[str] = []


def train_code_hash() -> str:
    """sha1 (10 hex) of TRAIN_FILES' contents, in their listed order."""
    return _files_hash(TRAIN_FILES, _TRAIN_SRC)


def _files_hash(files: tuple[str, ...], cache: list[str]) -> str:
    """sha1 (10 hex) of the files' contents in order, computed once into `cache` (a one-item list)."""
    if not cache:
        h = hashlib.sha1()
        for rel in files:
            path = os.path.join(PACKAGE, rel)
            if not os.path.isfile(path):
                raise CodeHashError(f"no training code at {path} to hash ({rel} in {__name__})")
            h.update(hashlib.sha1(pathlib.Path(path).read_bytes()).digest())
        cache.append(h.hexdigest()[:10])
    return cache[0]


# What decides a synthetic-task run's numbers (MQAR, MAD, state tracking) besides the model and the task's data: the
# one training loop they share and the trainer's step. Not TRAIN_FILES: those runs never read the LM data pipeline
# or its tokenizer, so a change there must not train them again.
SYNTHETIC_TRAIN_FILES = (os.path.join("eval", "synthetic.py"), os.path.join("train", "step.py"))
_SYNTHETIC_SRC: list[str] = []


def synthetic_train_hash() -> str:
    """sha1 (10 hex) of SYNTHETIC_TRAIN_FILES' contents, in their listed order."""
    return _files_hash(SYNTHETIC_TRAIN_FILES, _SYNTHETIC_SRC)
