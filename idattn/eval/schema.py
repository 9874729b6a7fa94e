"""The one JSON schema for evaluation results in a run directory.

Every evaluation (the trainer's periodic validation, `python -m idattn.eval`, the quickstart) writes one file per
(suite, step) under `<workdir>/eval/`:

    <workdir>/eval/<suite>-step<step:08d>.json          (<suite>-stepinit.json for step < 0)
    {
      "schema": "idattn.eval/v1",
      "suite": "validation" | "extrapolation" | "harness" | "recall" | "decode" | ...,
      "step": int,                       # optimiser step of the checkpoint evaluated (-1: random init / unknown)
      "run": {"workdir": str, "mixer": str, "size": str, "params": int, ...},   # free-form identity of the run
      "metrics": {"<name>": float, ...}, # flat scalars; names below
      "details": {...},                  # free-form, JSON-serialisable (per-bucket curves, per-task counts, ...)
      "time": float                      # unix time written
    }

Metric names (flat, so tables can join runs): validation `loss` (mean token cross-entropy, nats) and `ppl`
(exp(loss)); extrapolation `ppl@<len>`; harness `<task>/acc`, `<task>/acc_norm`, `<task>/ppl`, `average/acc`;
recall `<task>@<len>/acc`; decode `ms_per_token@<ctx>/b<batch>`.
"""
from __future__ import annotations

import glob
import json
import os
import time
from typing import Any

SCHEMA = "idattn.eval/v1"


def result_path(workdir: str, suite: str, step: int) -> str:
    """`<workdir>/eval/<suite>-step<step:08d>.json`; a random-init / unknown step (< 0) is `<suite>-stepinit.json`."""
    tag = "init" if int(step) < 0 else f"{int(step):08d}"
    return os.path.join(workdir, "eval", f"{suite}-step{tag}.json")


def write_result(workdir: str, suite: str, step: int, metrics: dict[str, float], *,
                 run: dict[str, Any] | None = None, details: dict[str, Any] | None = None) -> str:
    """Writes one result file atomically (temp file + rename) and returns its path."""
    bad = {k: v for k, v in metrics.items() if not isinstance(v, (int, float))}
    if bad:
        raise TypeError(f"metrics must be flat name -> number; got non-numeric values for {sorted(bad)}")
    path = result_path(workdir, suite, step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {"schema": SCHEMA, "suite": suite, "step": int(step), "run": dict(run or {}),
              "metrics": {k: float(v) for k, v in metrics.items()}, "details": details or {}, "time": time.time()}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def read_results(workdir: str, suite: str | None = None) -> list[dict[str, Any]]:
    """All result records of a run directory (optionally of one suite), sorted by (suite, step)."""
    pattern = os.path.join(workdir, "eval", f"{suite or '*'}-step*.json")
    out = []
    for path in glob.glob(pattern):
        with open(path) as f:
            rec = json.load(f)
        if rec.get("schema") != SCHEMA:
            raise ValueError(f"{path}: schema {rec.get('schema')!r}, expected {SCHEMA!r}")
        out.append(rec)
    return sorted(out, key=lambda r: (r["suite"], r["step"]))
