"""The study's run cache: a run is trained once, reused while its training, code and function stay the same, and
kept in a record (`docs/reproduction-runs.json`) that outlives the scratch root.

A run folder holds a marker (`repro.json`: the fields that identify its training, the model-code hash `src`, the
training-code hash `train_src`, the model fingerprint, status) beside its results (`eval/*.json`). `cached` is
the one path every run kind (LM, MQAR, MAD, state tracking; idattn.studies.repro_runs) takes:

    skip (Ctx.skip: read only) → move aside (another identity) → reuse check (hashes, fingerprint, verify)
    → marker "training" → train → result → finish (status "done", fingerprint, --archive)
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import pathlib
import shutil
import time
from typing import Any, Callable

import jax

from idattn import atomic
from idattn.configs import repro as experiment
from idattn.data import tokenizer as tok_lib
from idattn.rundir.layout import read_json
from idattn.studies import fingerprint
from idattn.studies.code_hash import current_train_hash, source_hash

MARKER = "repro.json"
RUN_NAME = {"dualkv-query-rope": "interdomain", "generic-linear-norope": "s4d_only",
            "s4d_only+sum": "s4d_only-sum", "generic-linear-norope+sum": "s4d_only-sum"}


class ReproError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class Table:
    """One table of the study: its CLI name, title (a format string), the paper's table it reproduces (as
    idattn.results names it; "" for a study past the paper) and the function that writes it."""
    name: str
    title: str
    fn: Callable[[Any], dict[str, Any]]
    paper: str = ""
    at_toy: bool = True  # run by `all --toy` (the pilot, ladders and studies past the paper are not)
    where: str = ""  # where its verdicts were judged, as the doc's summary names it


def log(msg: str) -> None:
    print(f"[repro {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_name(mixer: str) -> str:
    return RUN_NAME.get(mixer, mixer)


def read_marker(wd: str) -> dict[str, Any]:
    return read_json(os.path.join(wd, MARKER), {}, FileNotFoundError)


def write_marker(wd: str, rec: dict[str, Any], name: str = MARKER) -> None:
    """Writes the marker `rec` (or another record of the run folder: `name`) whole."""
    os.makedirs(wd, exist_ok=True)
    atomic.write_json(os.path.join(wd, name), rec, indent=1, sort_keys=True)


def move_aside(wd: str, rec: dict[str, Any], why: str) -> dict[str, Any]:
    dst = f"{wd}.stale-{rec.get('src', 'unknown')}"
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(wd, dst)
    log(f"{wd}: {why}; moved to {dst}, training it again")
    return {}


def run_cost(wd: str) -> float:
    rec = read_marker(wd)
    return float(rec.get("train_s", 0.0)) + float(rec.get("eval_s", 0.0)) + float(rec.get("recall_s", 0.0))


def trained_on() -> str:
    """"<platform>:<device kind>" of the first device (markers without it were trained on CPU hosts)."""
    d = jax.devices()[0]
    return f"{d.platform}:{d.device_kind}"


def check_reuse(wd: str, src: str, keep_stale: bool, verify=None, train_src: str | None = None,
                model: Any = None, ctx: "Ctx | None" = None) -> dict[str, Any]:
    """The run's marker when it may be reused or resumed with the current code, else {} (moved aside).

    Same model-code hash: reuse / resume. Another: a finished run is reused and re-stamped when the current code
    reproduces its fingerprint (`model`: its model config; idattn/studies/fingerprint.py) or else when `verify()`
    is (True, why) (its parameters give the recorded result); otherwise (and for an unfinished run) it is moved
    to `<run>.stale-<old hash>`, or kept and marked stale with `keep_stale`. Another training-code hash
    (`train_src`) cannot be re-verified: moved aside; a marker without one is stamped with the current."""
    rec = read_marker(wd)
    if rec and train_src is not None:
        if "train_src" not in rec:
            rec["train_src"] = train_src
            write_marker(wd, rec)
            log(f"{wd}: recorded before the training code was hashed; stamped with the current {train_src}")
        elif current_train_hash(rec["train_src"]) != train_src:  # a v1 stamp of migrated code: its v2 value
            if keep_stale:
                log(f"{wd}: trained with other training code ({rec['train_src']} != {train_src}); kept "
                    "(--keep_stale)")
                return dict(rec, stale=True)
            return move_aside(wd, rec, f"trained with other training code (loss, optimiser, packing or tokenizer: "
                                       f"{rec['train_src']} != {train_src}; evaluation cannot re-verify that)")
    if not rec or rec.get("src") == src:
        return rec
    if keep_stale:
        log(f"{wd}: trained with other model code ({rec.get('src')} != {src}); kept (--keep_stale)")
        return dict(rec, stale=True)
    if rec.get("status") == "done" and model is not None and rec.get("fingerprint"):
        outcome, why = fingerprint.check(rec, src, lambda: (model, ""), ctx.fingerprints if ctx else None)
        if outcome == "verified":
            write_marker(wd, rec)
            log(f"{wd}: model code changed ({why}); same function, reused")
            return rec
        log(f"{wd}: model code changed; fingerprint {outcome} ({why})")
    if rec.get("status") == "done" and verify is not None:
        ok, why = verify()
        if ok:
            rec["src"] = src
            rec.setdefault("verified", []).append(why)
            write_marker(wd, rec)
            log(f"{wd}: model code changed ({why}); same function, reused")
            return rec
        return move_aside(wd, rec, f"model code changed and the run no longer evaluates the same ({why})")
    return move_aside(wd, rec, f"trained with other model code ({rec.get('src')} != {src})")


class Ctx:
    """One invocation: experiment module, size, root, seeds, flags."""

    def __init__(self, root: str, size: str, seeds, render_only: bool, keep_stale: bool, only=()):
        self.exp = experiment
        self.only = {run_name(m) for m in only}
        self.train_dt = ""
        # runs read (not trained) under other model code, by path under root; cleared before each table (main)
        self.unverified: set[str] = set()
        self.fingerprints: dict[str, list[float]] = {}  # fingerprint.check's cache: a config's seeds share a probe
        self.root, self.size, self.table_size = os.path.abspath(root), size, size
        self.judged = size != "toy"  # toy size: numbers and intervals, never a verdict word
        self.seeds = tuple(seeds)
        self.render_only, self.keep_stale = render_only, keep_stale
        self.tok = None
        self.archive = ""  # --archive: the record every finished run is written to as soon as it finishes
        self.seeds_given = False  # --seeds named the seeds (else each table's default)
        self.tasks: frozenset[str] = frozenset()  # --tasks: the task families the selective table trains (empty: all)

    def invocation_time(self, seconds: float) -> str:
        """This invocation's wall time as a table prints it; with --render_only a fixed phrase (a render is the
        same on a loaded machine as on an idle one)."""
        return "rendering only" if self.render_only else f"{seconds / 60:.1f} min"

    def skip(self, mixer: str, dt: str | None = None) -> bool:
        """True when this invocation only reads the runs of (mixer, dt): --render_only, --only without the mixer,
        or --train_dt naming another Δ range (softmax has none)."""
        if self.render_only or bool(self.only and run_name(mixer) not in self.only):
            return True
        return bool(self.train_dt and dt is not None and dt != self.train_dt and run_name(mixer) != "softmax")

    def lm_dir(self, mixer: str, dt: str, seed: int) -> str:
        dt = "scaled" if run_name(mixer) == "softmax" else dt  # no Δ: one softmax run serves both ranges
        return os.path.join(self.root, "runs", self.size, "lm", f"{run_name(mixer)}-{dt}-s{seed}")

    def mqar_dir(self, mixer: str, seed: int) -> str:
        return os.path.join(self.root, "runs", self.size, "mqar", f"{run_name(mixer)}-s{seed}")

    def config(self, mixer: str, dt: str, seed: int):
        dt = "scaled" if run_name(mixer) == "softmax" else dt
        return self.exp.get_config(f"{mixer},{self.size},{dt},{seed}")

    def tokenizer(self, cfg):
        if self.tok is None:
            self.tok = tok_lib.load_tokenizer(cfg.data.tokenizer)
        return self.tok

    def train_len(self) -> int:
        return int(self.exp.SIZES[self.size]["seq_len"])

    def lengths(self) -> list[int]:
        return [int(round(r * self.train_len())) for r in self.exp.LENGTH_RATIOS]

    def for_size(self, size: str) -> "Ctx":
        """The same invocation (root, seeds, flags, shared caches) at another size: the runs of `size`, the tables
        of this one."""
        c = copy.copy(self)
        c.size, c.tok = size, None
        return c

    def for_task(self, family: str) -> "Ctx":
        """This invocation for one task family of the selective table: itself, or a read-only copy when --tasks
        names others."""
        if not self.tasks or family in self.tasks:
            return self
        c = copy.copy(self)
        c.render_only = True
        return c

    def table_path(self, table: str, ext: str) -> str:
        size = self.table_size
        return os.path.join(self.root, f"{table}{'' if size == 'small' else '-' + size}.{ext}")


def read_only(ctx: Ctx, wd: str, rec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The marker of a run this invocation only reads; a finished run of other model code is named in
    ctx.unverified (the table's missing_note lists it as read without checking)."""
    rec = read_marker(wd) if rec is None else rec
    if rec.get("status") == "done" and rec.get("src") != source_hash():
        ctx.unverified.add(os.path.relpath(wd, ctx.root))  # runs/<size>/<kind>/<name>: names repeat across sizes
    return rec


def finish_run(ctx: Ctx, wd: str, rec: dict[str, Any], model: Any) -> None:
    """Writes a finished run's marker, stamps it with its model fingerprint and records it with --archive. A probe
    that fails leaves the run finished and unstamped, and says so (`python -m idattn.repro verify` stamps it)."""
    write_marker(wd, rec)
    try:
        if fingerprint.check(rec, rec["src"], lambda: (model, ""), ctx.fingerprints)[0] == "stamped":
            write_marker(wd, rec)
    except Exception as e:  # noqa: BLE001 - the run is trained and recorded; only its stamp is missing
        log(f"{wd}: finished, but its fingerprint was not computed ({type(e).__name__}: {e}); "
            "`python -m idattn.repro verify` stamps it")
    archive_now(ctx)


def differs(rec: dict[str, Any], ident: dict[str, Any], legacy: tuple[str, ...] = ()) -> list[str]:
    """The keys of `ident` on which the marker `rec` differs (a key of `legacy` that it lacks is taken as equal)."""
    return [k for k, v in ident.items() if rec.get(k, v if k in legacy else None) != v]


def cached(ctx: Ctx, wd: str, *, mixer: str, ident: dict[str, Any], fields: dict[str, Any], model: Any,
           train: Callable[[dict[str, Any]], dict[str, Any]], read: Callable[[dict[str, Any]], Any],
           train_src: str, dt: str | None = None, verify=None, legacy: tuple[str, ...] = (),
           stamp_legacy: bool = False) -> Any:
    """`read(marker)` of the finished run at `wd`, trained now if needed; None when not available.

    `ident`: the marker fields that make the training (recipe, task model); a run whose marker differs in one is
    moved aside, and only read when it matches. A key of `legacy` that an older marker lacks is taken as the
    current (and written into it on reuse with `stamp_legacy`). `fields`: the rest of the marker (mixer, seed,
    size, ...). `train(marker)` trains, writes the results `read` reads, and returns the fields the finished
    marker adds; it raises ReproError when stopped (the marker keeps its training time, and a rerun resumes)."""
    rec = read_marker(wd)
    other = differs(rec, ident, legacy)
    if ctx.skip(mixer, dt):
        read_only(ctx, wd, rec)
        return read(rec) if rec.get("status") == "done" and not other else None
    if rec and other and not ctx.keep_stale:
        move_aside(wd, rec, "trained with another " + "; ".join(f"{k} ({rec.get(k)} != {ident[k]})" for k in other))
    src = source_hash()
    rec = check_reuse(wd, src, ctx.keep_stale, verify=verify, train_src=train_src, model=model, ctx=ctx)
    if rec.get("status") == "done":
        if stamp_legacy and not rec.get("stale") and any(k not in rec for k in legacy):
            write_marker(wd, dict(rec, **{k: ident[k] for k in legacy if k not in rec}))
        out = read(rec)
        if out is not None:
            return out
    rec = dict(rec, src=src, train_src=train_src, **fields, **ident, status="training", trained_on=trained_on())
    write_marker(wd, rec)
    t0 = time.time()
    try:
        done = train(rec)
    except ReproError:
        write_marker(wd, dict(rec, train_s=float(rec.get("train_s", 0.0)) + (time.time() - t0)))
        raise
    rec = dict(rec, **done, status="done", train_s=float(rec.get("train_s", 0.0)) + (time.time() - t0))
    log(f"{os.path.relpath(wd, ctx.root)}: trained in {rec['train_s']:.0f} s")
    finish_run(ctx, wd, rec, model)
    return read(read_marker(wd))


def add_time(wd: str, key: str, t0: float) -> None:
    """Adds the seconds since `t0` to the marker's `key` (eval_s, recall_s: evaluation after training)."""
    rec = read_marker(wd)
    rec[key] = float(rec.get(key, 0.0)) + (time.time() - t0)
    write_marker(wd, rec)


def missing_note(missing: list[str], ctx: "Ctx | None" = None,
                 hint: str = "") -> str:
    """The end of a table's text: the runs it lacks (`hint`: how to get them) and the runs it read without checking
    them under the current model code (`Ctx.unverified`)."""
    out = "" if not missing else f"\n\nNot available yet{f' ({hint})' if hint else ''}: " + ", ".join(missing) + "."
    if ctx is not None and ctx.unverified:
        out += ("\n\nRead without checking (this invocation did not train them): the model code changed since "
                "these runs were trained, and a run without --render_only / --only re-evaluates them and retrains "
                "the ones whose function changed: " + ", ".join(sorted(ctx.unverified)) + ".")
    return out


HINT = "rerun the command to train / evaluate them"  # how a table's reader gets the runs it lacks


def compute_line(ctx: Ctx, cost: float, wall: float | None = None, what: str = "of training + evaluation ",
                 hint: str = HINT, missing=(), invocation: str = "this invocation: ", note: str = "") -> str:
    """A table's last paragraph: its runs' recorded compute (`what`: of which work), this invocation's time (none
    without `wall`), a `note`, and what it lacks (`missing`; None: no missing_note at all)."""
    text = f"Compute: {cost / 60:.1f} min {what}over the runs of this table"
    text += f" ({invocation}{ctx.invocation_time(wall)})." if wall is not None else "."
    return text + note + ("" if missing is None else missing_note(list(missing), ctx, hint))


def write_table(ctx: Ctx, table: str, md: str, data: dict[str, Any]) -> dict[str, Any]:
    """<root>/<table>[-<size>].md and .json, each written whole (a kill leaves the previous one); returns `data`."""
    os.makedirs(ctx.root, exist_ok=True)
    for ext, text in (("json", json.dumps(data, indent=1, sort_keys=True, default=float)), ("md", md + "\n")):
        atomic.write_text(ctx.table_path(table, ext), text)
    log(f"wrote {ctx.table_path(table, 'md')} and .json")
    return data


# ------------------------------------------------------------------------------- the record (outlives the root)

ARCHIVE_FORMAT = "idattn.repro runs v1"
# Marker keys later checks add or rewrite without retraining (re-verification, fingerprint stamps, evaluation
# times); the others are fixed when the run finishes: they identify the training.
STAMP_KEYS = frozenset({"src", "verified", "fingerprint", "train_src", "stale", "eval_s", "recall_s"})


def archive_now(ctx: Ctx) -> None:
    """With --archive: record the root's finished runs now (called after every run, so a stop loses nothing)."""
    if ctx.archive:
        log(f"recorded {archive_runs(ctx.root, ctx.archive)} finished runs in {ctx.archive}")


def run_dirs(root: str):
    """Every run folder under `<root>/runs` (a folder with a marker; never one moved aside as `.stale-`)."""
    for top, dirs, _ in os.walk(os.path.join(root, "runs")):
        dirs[:] = sorted(d for d in dirs if ".stale-" not in d)
        if os.path.exists(os.path.join(top, MARKER)):
            dirs[:] = []  # a run's own sub-folders (checkpoints, eval) are not runs
            yield top


def _same_training(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k not in STAMP_KEYS} == {k: v for k, v in b.items() if k not in STAMP_KEYS}


def _supersedes(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Of two markers of the same training: `a` has checks added since `b` (its `verified` history extends b's
    and is longer, or it has a fingerprint / training-code stamp b lacks)."""
    va, vb = a.get("verified", []), b.get("verified", [])
    if va[:len(vb)] != vb:
        return False
    return len(va) > len(vb) or any(k in a and k not in b for k in ("fingerprint", "train_src"))


def merge_run(recorded: dict[str, str] | None, found: dict[str, str]) -> dict[str, str]:
    """One run's files for the record: the root's copy wins (a retrained run replaces the old one whole), except
    for the same training: then the eval results are the union (the root's where both have one) and the marker is
    the record's when it supersedes the root's (a root restored before the record's runs were re-stamped)."""
    if not recorded or MARKER not in recorded:
        return found
    old, new = json.loads(recorded[MARKER]), json.loads(found[MARKER])
    if not _same_training(old, new):
        return found
    merged = {**recorded, **found}
    if _supersedes(old, new):
        merged[MARKER] = recorded[MARKER]
    return merged


def archive_runs(root: str, path: str) -> int:
    """Records every finished run under `<root>/runs` (its marker and `eval/*.json`, never a checkpoint) in the
    JSON file `path`, merged with the runs recorded there (`merge_run`); returns the number of runs recorded."""
    runs: dict[str, dict[str, str]] = {}
    if os.path.exists(path):
        runs.update(_read_archive(path))
    for wd in run_dirs(root):
        if read_marker(wd).get("status") != "done":
            continue
        files = {MARKER: pathlib.Path(wd, MARKER).read_text()}
        ev = os.path.join(wd, "eval")
        for n in sorted(os.listdir(ev)) if os.path.isdir(ev) else []:
            if n.endswith(".json"):
                files[f"eval/{n}"] = pathlib.Path(ev, n).read_text()
        rel = os.path.relpath(wd, root)
        runs[rel] = merge_run(runs.get(rel), files)
    atomic.write_text(path, json.dumps({"format": ARCHIVE_FORMAT, "runs": dict(sorted(runs.items()))}, indent=1,
                                       sort_keys=True) + "\n")
    return len(runs)


def _read_archive(path: str) -> dict[str, dict[str, str]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ReproError(f"--restore / --archive {path}: cannot read it ({type(e).__name__}: {e}); expected the "
                         f"JSON that --archive writes") from None
    if not isinstance(data, dict) or data.get("format") != ARCHIVE_FORMAT:
        raise ReproError(f"{path}: not a runs record (format {data.get('format') if isinstance(data, dict) else None!r}"
                         f", expected {ARCHIVE_FORMAT!r}); write one with --archive")
    return data["runs"]


def restore_runs(path: str, root: str) -> int:
    """Recreates under `root` the recorded runs it does not have (an existing run folder is never touched), after
    refusing a record whose paths leave `<root>/runs` or name other files than a marker and eval/*.json."""
    runs = _read_archive(path)
    base = os.path.realpath(os.path.join(root, "runs"))
    for rel, files in runs.items():
        wd = os.path.realpath(os.path.join(root, rel))
        names_ok = all(n == MARKER or (n.startswith("eval/") and n.count("/") == 1 and n.endswith(".json"))
                       for n in files)
        if not wd.startswith(base + os.sep) or os.path.isabs(rel) or ".." in rel.split(os.sep) or not names_ok:
            raise ReproError(f"{path}: run {rel!r} (files {sorted(files)}) is not a run folder under "
                             f"<root>/runs with a marker and eval/*.json; refusing the whole record")
    n = 0
    for rel, files in runs.items():
        wd = os.path.join(root, rel)
        if os.path.exists(os.path.join(wd, MARKER)):
            continue
        # the results first, the marker last (each written whole, synced, renamed): a restore cut short leaves a
        # folder without a marker, which the next restore fills in, never a marker over missing results
        for name in sorted(files, key=lambda name: name == MARKER):
            p = os.path.join(wd, name)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            atomic.write_text(p, files[name])
        n += 1
    return n
