"""The code a study's numbers depend on, as hashes a run records (idattn.studies.repro_runs, the quickstart):
the model code (`source_hash`, re-verifiable by evaluating a trained run) and the training code (`train_code_hash`
for language-model runs, `synthetic_train_hash` for MQAR / MAD / state tracking; not re-verifiable: a change
trains the run again). The training hashes see code only (scheme v2: `_files_hash`); runs stamped under the
raw-bytes scheme v1 are read through V1_TO_V2."""
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


def code_text(source: str, *, training: bool = False) -> str:
    """A Python file's code without its comments, docstrings and blank lines: what a hash of the model code sees.
    Comments are found by `tokenize` (a '#' inside a string is not one), docstrings by `ast` (the string statement
    opening a module, class or function body, removed with the lines it spans); both agree across the Python
    versions this project runs (3.11 here, 3.12 on the device images), where token streams and `ast.dump` do not.
    Source that does not parse is hashed as it is.

    `training=True` (what the training hashes see, scheme v2) also leaves out every import statement, at any depth
    (the lines it spans), and the module's `if __name__ == "__main__":` block: moving an import between a function
    and the module's top changes no number (the imported module's code is hashed by its own file where it matters),
    and the command block never runs when training imports the file."""
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
        if training and (isinstance(node, (ast.Import, ast.ImportFrom))
                         or (isinstance(node, ast.If) and node in tree.body and _is_main_guard(node))):
            drop.update(range(node.lineno, node.end_lineno + 1))
    return "\n".join(ln.rstrip() for i, ln in enumerate(lines, 1) if i not in drop and ln.strip())


def _is_main_guard(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in t.comparators))


def source_hash() -> str:
    """sha1 (10 hex) of the model code: every .py file under SRC_DIRS but SRC_EXCLUDE, each reduced to its
    `code_text` (rewording the prose beside the math retrains and re-verifies nothing), as a sorted set of per-file
    hashes (moving or renaming a file changes nothing either); any change of code re-verifies a finished run."""
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
    """sha1 (10 hex) of TRAIN_FILES' code (scheme v2, `_files_hash`), in their listed order."""
    return _files_hash(TRAIN_FILES, _TRAIN_SRC)


def _files_hash(files: tuple[str, ...], cache: list[str] | None = None, scheme: str = "v2") -> str:
    """sha1 (10 hex) of the files in order, computed once into `cache` (a one-item list) when one is given. Scheme
    v2 (the current) hashes each file's `code_text(..., training=True)`; v1 hashed the raw bytes (a run stamped with
    it is read through V1_TO_V2, `current_train_hash`; kept for the test that checks that table)."""
    if cache:
        return cache[0]
    h = hashlib.sha1()
    for rel in files:
        path = os.path.join(PACKAGE, rel)
        if not os.path.isfile(path):
            raise CodeHashError(f"no training code at {path} to hash ({rel} in {__name__})")
        raw = pathlib.Path(path).read_bytes()
        h.update(hashlib.sha1(raw if scheme == "v1" else code_text(raw.decode(), training=True).encode()).digest())
    out = h.hexdigest()[:10]
    if cache is not None:
        cache.append(out)
    return out


# What decides a synthetic-task run's numbers (MQAR, MAD, state tracking) besides the model and the task's data: the
# one training loop they share and the trainer's step. Not TRAIN_FILES: those runs never read the LM data pipeline
# or its tokenizer, so a change there must not train them again.
SYNTHETIC_TRAIN_FILES = (os.path.join("eval", "synthetic.py"), os.path.join("train", "step.py"))
_SYNTHETIC_SRC: list[str] = []


def synthetic_train_hash() -> str:
    """sha1 (10 hex) of SYNTHETIC_TRAIN_FILES' code (scheme v2, `_files_hash`), in their listed order."""
    return _files_hash(SYNTHETIC_TRAIN_FILES, _SYNTHETIC_SRC)


# The training hashes' migration from scheme v1 (raw bytes) to v2: each v1 value of the files as committed at
# V1_TO_V2_COMMIT (train_code_hash, synthetic_train_hash) -> the v2 value of the same files. The runs of the
# reproduction record that carry a training hash carry one of these v1 values; such a run counts as stamped with
# its v2 value (runcache.check_reuse, the quickstart's claim_run), so the change of scheme trains nothing again.
V1_TO_V2_COMMIT = "5b19ebce8bdb68ac947c2895ddf1bf09d5d75528"
V1_TO_V2 = {
    "0bb96c459a": "2129566416",  # train_code_hash
    "6a6bb0189e": "c41ced7de3",  # synthetic_train_hash
}


def current_train_hash(recorded: str | None) -> str | None:
    """A run's recorded training hash in the current scheme: a migrated v1 value as its v2 value (V1_TO_V2),
    any other as it is."""
    return V1_TO_V2.get(recorded, recorded)
