"""`python -m idattn.repro verify`: every finished run of a root checked by its model fingerprint
(idattn/studies/fingerprint.py), as the current configs build each run's model (`run_model_config`)."""
from __future__ import annotations

import os
from typing import Any

from idattn.studies import fingerprint as F, runcache as C
from idattn.studies.repro_runs import KINDS, identity


def run_model_config(ctx: Any, wd: str, rec: dict[str, Any]) -> tuple[Any, str]:
    """(model config, "") of a finished run as the current configs build it, or (None, why not): the run's kind
    from its folder (runs/<size>/<lm|mqar|mad|state>/<name>), its size, mixer, Δ range and seed from its marker.
    A run whose marker differs from the current config's identity (repro_runs.identity: its recipe, its MQAR
    model) is not this config's run."""
    parts = os.path.relpath(wd, ctx.root).split(os.sep)
    if len(parts) != 4 or parts[0] != "runs":
        return None, f"not a run folder runs/<size>/<kind>/<name>: {'/'.join(parts)}"
    if parts[2] not in KINDS:
        return None, f"unknown run kind {parts[2]!r}"
    try:
        idn = identity(ctx.for_size(parts[1]), parts[2], rec)
    except (KeyError, ValueError) as e:
        return None, f"its config no longer builds ({type(e).__name__}: {e})"
    other = C.differs(rec, idn["ident"], idn["legacy"])
    if other:
        return None, f"trained with another {parts[2]} {' and '.join(other)} than the current config's"
    return idn["model"], ""


def verify_runs(ctx: Any) -> dict[str, list[str]]:
    """Every finished run under ctx.root by its model fingerprint (fingerprint.check: stamped under the current
    model code, or re-stamped where the current code reproduces the recorded one; a run left "changed" is trained
    again by a table command, or listed by --render_only as read without checking). One probe per distinct model
    config. Returns {outcome: [run folder as <size>/<kind>/<name>, ...]}."""
    out: dict[str, list[str]] = {k: [] for k in ("stamped", "verified", "unchanged", "changed", "unverifiable",
                                                 "skipped")}
    cache: dict[str, list[float]] = {}
    src = C.source_hash()
    for wd in C.run_dirs(ctx.root):
        rec = C.read_marker(wd)
        if rec.get("status") != "done":
            continue
        name = os.path.relpath(wd, os.path.join(ctx.root, "runs"))
        outcome, why = F.check(rec, src, lambda: run_model_config(ctx, wd, rec), cache,
                               log=lambda s: C.log(f"{name}: {s}"))
        if outcome in ("stamped", "verified"):
            C.write_marker(wd, rec)
        out[outcome].append(f"{name} ({why})" if outcome in ("changed", "skipped") else name)
    return out
