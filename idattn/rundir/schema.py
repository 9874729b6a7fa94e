"""The one JSON schema for evaluation results in a run directory.

Every evaluation (the trainer's periodic validation, `python -m idattn.eval`, the quickstart) writes one file per
(suite, step) under `<workdir>/eval/`:

    <workdir>/eval/<suite>-step<step:08d>.json          (<suite>-stepinit.json for step < 0)
    <workdir>/eval/<suite>-<tag>-step<step:08d>.json    a result with a protocol (below)
    {
      "schema": "idattn.eval/v1",
      "suite": "validation" | "extrapolation" | "harness" | "recall" | "decode" | ...,
      "step": int,                       # optimiser step of the checkpoint evaluated (-1: random init / unknown)
      "run": {"workdir": str, "mixer": str, "size": str, "params": int, ...},   # free-form identity of the run
      "metrics": {"<name>": float, ...}, # flat scalars; names below
      "details": {...},                  # free-form, JSON-serialisable (per-bucket curves, per-task counts, ...)
      "protocol": {...},                 # optional: what the numbers were measured on (below)
      "time": float                      # unix time written
    }

Protocol. A number means something only with what it was measured on. The trainer's periodic validation
(`validation-step*.json`, no tag) is *the* validation perplexity of a run: its held-out split, packed at the
training context, the first `train.eval_batches x microbatch x data.seq_len` tokens. `python -m idattn.eval`
writes its results with a protocol {"corpus", "tokens", "context", "batch", "method", ...} and a file tag made of
it (`validation-kjv.val-t32768-c256-b8-step00000300.json`, `extrapolation-pg19-c256.512.896-step...`), so it
never replaces the trainer's file, and two protocols never share a file. `protocol_of(record)` gives the
protocol of any record (the trainer's is read from its details).

Metric names (flat, so tables can join runs): validation `loss` (mean token cross-entropy, nats) and `ppl`
(exp(loss)); extrapolation `ppl@<len>`; harness `<task>/acc`, `<task>/acc_norm`, `<task>/ppl`, `average/acc`;
recall `<task>@<len>/acc`; decode `ms_per_token@<ctx>/b<batch>`.
"""
from __future__ import annotations

import glob
import json
import os
import re
import time
from typing import Any

from idattn import atomic

SCHEMA = "idattn.eval/v1"


def _safe(x) -> str:
    return re.sub(r"[^A-Za-z0-9_.+]+", ".", str(x)).strip(".") or "x"


def protocol_tag(protocol: dict[str, Any] | None) -> str:
    """File-name tag of a protocol: `<corpus>-t<tokens>-c<context>-b<batch>-m<mode>` (the parts present)."""
    if not protocol:
        return ""
    parts = [_safe(protocol["corpus"])] if protocol.get("corpus") else []
    for key, letter in (("tokens", "t"), ("context", "c"), ("batch", "b"), ("mode", "m")):
        v = protocol.get(key)
        if v not in (None, "", []):
            parts.append(letter + (".".join(map(str, v)) if isinstance(v, (list, tuple)) else _safe(v)))
    return "-".join(parts)


def result_path(workdir: str, suite: str, step: int, protocol: dict[str, Any] | None = None) -> str:
    """`<workdir>/eval/<suite>[-<tag>]-step<step:08d>.json`; a random-init / unknown step (< 0) is `-stepinit`."""
    tag = "init" if int(step) < 0 else f"{int(step):08d}"
    ptag = protocol_tag(protocol)
    return os.path.join(workdir, "eval", f"{suite}{'-' + ptag if ptag else ''}-step{tag}.json")


def protocol_of(record: dict[str, Any]) -> dict[str, Any]:
    """What a record was measured on: its `protocol`, or for the trainer's validation (no protocol) the run's
    held-out split with the token count and context from its details."""
    if record.get("protocol"):
        return dict(record["protocol"])
    d = record.get("details", {}) or {}
    if record.get("suite") == "validation":
        return {"corpus": d.get("corpus", "held-out split"), "tokens": d.get("tokens"), "context": d.get("seq_len"),
                "method": "trainer validation (packed held-out split)"}
    return {"corpus": d.get("corpus"), "tokens": d.get("eval_tokens") or d.get("tokens"),
            "context": d.get("seq_len") or d.get("train_seq_len")}


def write_result(workdir: str, suite: str, step: int, metrics: dict[str, float], *,
                 run: dict[str, Any] | None = None, details: dict[str, Any] | None = None,
                 protocol: dict[str, Any] | None = None) -> str:
    """Writes one result file atomically (temp file + rename) and returns its path (see `result_path`)."""
    bad = {k: v for k, v in metrics.items() if not isinstance(v, (int, float))}
    if bad:
        raise TypeError(f"metrics must be flat name -> number; got non-numeric values for {sorted(bad)}")
    path = result_path(workdir, suite, step, protocol)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {"schema": SCHEMA, "suite": suite, "step": int(step), "run": dict(run or {}),
              "metrics": {k: float(v) for k, v in metrics.items()}, "details": details or {}, "time": time.time()}
    if protocol:
        record["protocol"] = dict(protocol)
    return atomic.write_json(path, record, indent=1, sort_keys=True)


def read_results(workdir: str, suite: str | None = None) -> list[dict[str, Any]]:
    """All result records of a run directory (optionally of one suite), sorted by (suite, step); each carries
    `path` (its file) and `tagged` (True for a result written with a protocol, e.g. by `python -m idattn.eval`)."""
    pattern = os.path.join(workdir, "eval", f"{suite or '*'}*-step*.json")
    out = []
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            rec = json.load(f)
        if rec.get("schema") != SCHEMA:
            raise ValueError(f"{path}: schema {rec.get('schema')!r}, expected {SCHEMA!r}")
        if suite is not None and rec.get("suite") != suite:
            continue
        rec["path"] = path
        rec["tagged"] = bool(rec.get("protocol"))
        out.append(rec)
    return sorted(out, key=lambda r: (r["suite"], r["step"], r["tagged"], r["path"]))
