"""The run directory's layout: file names, the saved config, committed steps, the best-of-run copy.

    <workdir>/config.json                  the locked config of the run (written once, on the first start)
    <workdir>/config.history/              the configs a resumed run had before (config.step<N>.json)
    <workdir>/checkpoints/<step>/          one orbax checkpoint per saved step, items:
        params/      parameters (float32, sharded save/restore)
        opt_state/   optimiser state
        meta/        {"step", "time", "loss", "bad_steps", "digests": {params, opt_state, data}} (JSON)
        data/        state.json: the data iterator state (global: the same on every process)
    <workdir>/best/<step>/                 the best-of-run parameters by validation loss (params, meta.json)
    <workdir>/checkpoints.rejected/        checkpoints that failed to read or verify, moved aside
    <workdir>/eval/                        result files (idattn.rundir.schema)
    <workdir>/metrics.jsonl, <workdir>/tb/ the trainer's per-step log
    <workdir>/progress.json                the newest step ever committed here (no silent restart from step 0)
    <workdir>/identity.json                the run's id, its tokenizer and data by content, the config as written
    <workdir>/lease.json                   the live trainer's lease and fencing token (idattn.train.lease)

A step directory appears only once committed (orbax writes into a temporary name and renames), so listing the
digit-named folders is the list of complete checkpoints. The trainer (idattn.train.checkpoint) writes this
layout; everything downstream reads it through this package.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Iterator

import ml_collections
import numpy as np

from idattn import atomic

CONFIG_FILE = "config.json"
CKPT_DIR = "checkpoints"
BEST_DIR = "best"  # the best-of-run parameters by validation loss, outside the rotation
DATA_STATE_FILE = "state.json"  # inside checkpoints/<step>/data/
METRICS_FILE = "metrics.jsonl"  # one JSON line per logged step (idattn.train.metrics)
REJECTED_DIR = "checkpoints.rejected"  # checkpoints that failed to read or verify, moved aside (never deleted)


def committed_steps(workdir: str) -> list[int]:
    """Steps with a complete (renamed, committed) checkpoint directory; cheap, no orbax needed."""
    d = os.path.join(workdir, CKPT_DIR)
    if not os.path.isdir(d):
        return []
    return sorted(int(n) for n in os.listdir(d) if n.isdigit() and os.path.isdir(os.path.join(d, n)))


def read_json(path: str, default: Any = None, tolerate=(FileNotFoundError, json.JSONDecodeError)) -> Any:
    """The JSON value in `path`, or `default` when reading it raises one of `tolerate` (the caller's choice: a
    missing file, or also a half-written or unreadable one). The one reader of a JSON file that may be missing
    (this layout's records, and the sweep's and the studies' markers and results)."""
    try:
        with open(path) as f:
            return json.load(f)
    except tolerate:
        return default


PROGRESS_FILE = "progress.json"  # {"committed_step": N}: the newest checkpoint this workdir ever committed


def read_progress(workdir: str) -> dict:
    """The workdir's progress record ({} when none: a new run, or one written before the record existed)."""
    d = read_json(os.path.join(workdir, PROGRESS_FILE), {}, (OSError, ValueError))
    return d if isinstance(d, dict) else {}


def write_progress(workdir: str, committed_step: int) -> None:
    """Records that `committed_step` was committed (atomic replace); the trainer refuses to restart such a
    workdir from step 0 without train.restart_from_scratch, whatever happens to its checkpoints later."""
    atomic.write_json(os.path.join(workdir, PROGRESS_FILE), {"committed_step": int(committed_step)})


def best_info(workdir: str) -> dict | None:
    """{"step", "val_loss", "path", ...} of the best-of-run parameters kept in <workdir>/best, or None."""
    root = os.path.join(workdir, BEST_DIR)
    if not os.path.isdir(root):
        return None
    steps = sorted(int(n) for n in os.listdir(root) if n.isdigit())
    for step in reversed(steps):
        try:
            with open(os.path.join(root, str(step), "meta.json")) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        return dict(meta, path=os.path.join(root, str(step)))
    return None


def planned_steps(config: dict) -> int:
    """The run's train.num_steps from its saved config dict (or ceil(total_tokens / tokens per step)), as the
    trainer's RunPlan derives it."""
    t, seq = config["train"], int(config["data"]["seq_len"])
    if int(t.get("num_steps", -1)) > 0:
        return int(t["num_steps"])
    return -(-int(t["total_tokens"]) // (int(t["batch_size"]) * seq))


def completion(workdir: str) -> dict[str, Any]:
    """What a run has durably finished, read from the folder alone; the one definition of "done" that the trainer's
    rerun, `sweep status`, a sweep's skip rule and `load_params` share.

    {"done", "num_steps", "committed" (newest committed checkpoint step, the one `load_params` loads, or None),
    "val_loss" (of the final validation, or None), "missing" (what keeps it from done, [] when done)}.
    Done means all three: the final checkpoint (step num_steps) is committed, the final validation result exists,
    and, when train.keep_best, best/ holds parameters at least as good as the final validation (a best/ write that
    failed at the end leaves an older, worse best/). A validation file without its checkpoint is not done."""
    out: dict[str, Any] = {"done": False, "num_steps": None, "committed": None, "val_loss": None, "missing": []}
    try:
        with open(os.path.join(workdir, CONFIG_FILE)) as f:
            cfg = json.load(f)
        out["num_steps"] = n = planned_steps(cfg)
    except (OSError, ValueError, KeyError, TypeError):
        out["missing"] = [f"a readable {CONFIG_FILE}"]
        return out
    steps = committed_steps(workdir)
    out["committed"] = steps[-1] if steps else None
    missing = []
    if n not in steps:
        missing.append(f"the final checkpoint {n} (newest committed: {out['committed']})")
    try:
        with open(os.path.join(workdir, "eval", f"validation-step{n:08d}.json")) as f:
            out["val_loss"] = float(json.load(f)["metrics"]["loss"])
    except (OSError, ValueError, KeyError, TypeError):
        missing.append(f"the final validation at step {n}")
    if bool(cfg["train"].get("keep_best", True)) and out["val_loss"] is not None:
        best = best_info(workdir)
        if best is None:
            missing.append("best/")
        elif float(best.get("val_loss", math.inf)) > out["val_loss"] * (1 + 1e-9):
            missing.append(f"best/ (it holds step {best.get('step')} at validation loss {best.get('val_loss')}, worse "
                           f"than the final {out['val_loss']:.6g})")
    out["missing"] = missing
    out["done"] = not missing
    return out


IDENTITY_FILE = "identity.json"  # the run's id and what it trains on, by content (written at its first start)


def read_identity(workdir: str) -> dict | None:
    """<workdir>/identity.json: {"run_id", "tokenizer": {"spec", "vocab_size", "sha256"}, "data": {"source",
    "train", "val"} (idattn.data.formats.data_identity), "config": the config.json the trainer last wrote,
    "history": [{"step", "time", "what", "old", "new"}] (allowed changes)}; None for a run that predates it or a
    damaged file (the trainer then records it anew from the current content)."""
    d = read_json(os.path.join(workdir, IDENTITY_FILE), None, (OSError, ValueError))
    return d if isinstance(d, dict) and d.get("run_id") else None


def write_identity(workdir: str, identity: dict) -> str:
    return atomic.write_json(os.path.join(workdir, IDENTITY_FILE), identity, indent=1, sort_keys=True)


def archive_config(workdir: str, steps: list[int]) -> str | None:
    """Keeps the config a run had so far as config.history/config.step<N>.json before it is replaced."""
    src = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(src):
        return None
    d = os.path.join(workdir, "config.history")
    os.makedirs(d, exist_ok=True)
    dst = os.path.join(d, f"config.step{steps[-1] if steps else 0}.json")
    with open(src) as f_in, open(dst, "w") as f_out:
        f_out.write(f_in.read())
    return dst


def config_to_dict(config) -> dict:
    """JSON-normalised plain dict (tuples -> lists), so a saved and a live config compare equal."""
    d = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
    return json.loads(json.dumps(d, default=_json_default))


def _json_default(o):
    if isinstance(o, (np.generic,)):
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"config value {o!r} of type {type(o).__name__} is not JSON-serialisable")


def save_config(workdir: str, config, name: str = CONFIG_FILE) -> str:
    return atomic.write_json(os.path.join(workdir, name), config_to_dict(config), indent=1, sort_keys=True)


def load_config(workdir: str) -> ml_collections.ConfigDict:
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: {workdir!r} is not a training run directory (no config.json)")
    with open(path) as f:
        text = f.read()
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}, {len(text)} bytes; "
                         f"cut or hand-edited?): restore it (earlier versions are in "
                         f"{os.path.join(workdir, 'config.history')} when the run was resumed with changes)") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path} holds a JSON {type(d).__name__}, not the config object; restore the file")
    if "logical_axis_rules" in d:
        d["logical_axis_rules"] = tuple((n, tuple(a) if isinstance(a, list) else a) for n, a in d["logical_axis_rules"])
    return ml_collections.ConfigDict(d)


def diff_dicts(old: dict, new: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """[(dotted key, old value, new value)] for every key that differs (missing keys show as <missing>)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<missing>"), new.get(k, "<missing>")
        key = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff_dicts(a, b, key + ".")
        elif a != b:
            out.append((key, a, b))
    return out


def metrics_records(workdir: str) -> Iterator[Any]:
    """Each well-formed line of a run's metrics.jsonl (the trainer's per-step log), in order; none without one."""
    path = os.path.join(workdir, METRICS_FILE)
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill mid-write
                    pass


def last_metrics(workdir: str) -> dict | None:
    """The last well-formed line of a run's metrics.jsonl, or None."""
    last = None
    for last in metrics_records(workdir):
        pass
    return last

