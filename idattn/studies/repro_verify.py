"""`python -m idattn.repro verify`: every finished run of a root checked by its model fingerprint
(idattn/studies/fingerprint.py), as the current configs build each run's model (`run_model_config`)."""
from __future__ import annotations

import os
from typing import Any

from idattn.studies import fingerprint as F, runcache as C
from idattn.studies.repro_runs import (mad_model_config, mad_recipe, mqar_model_record, size_recipe, state_model_config,
                                       state_recipe)


def run_model_config(ctx: Any, wd: str, rec: dict[str, Any]) -> tuple[Any, str]:
    """(model config, "") of a finished run as the current configs build it, or (None, why not): the run's kind
    from its folder (runs/<size>/<lm|mqar|mad|state>/<name>), its size, mixer, Δ range and seed from its marker.
    A run whose recorded recipe (or MQAR model) differs from the current config's is not this config's run."""
    parts = os.path.relpath(wd, ctx.root).split(os.sep)
    if len(parts) != 4 or parts[0] != "runs":
        return None, f"not a run folder runs/<size>/<kind>/<name>: {'/'.join(parts)}"
    size, kind = parts[1], parts[2]
    c = ctx.for_size(size)
    try:
        if kind == "lm":
            if "recipe" in rec and rec["recipe"] != size_recipe(c):
                return None, "trained with another recipe than the current config's"
            return c.config(rec["mixer"], rec["dt"], int(rec["seed"])).model, ""
        if kind == "mqar":
            cfg = c.exp.get_mqar_config(rec["mixer"], size)
            model = mqar_model_record(cfg.model)
            if rec.get("model", model) != model:
                return None, "trained with another MQAR model than the current config's"
            return cfg.model, ""
        if kind == "mad":
            if rec.get("recipe") != mad_recipe(c):
                return None, "trained with another MAD recipe than the current config's"
            return mad_model_config(c, rec["cell"]), ""
        if kind == "state":
            if rec.get("recipe") != state_recipe(c):
                return None, "trained with another state-tracking recipe than the current config's"
            return state_model_config(c, rec["mixer"]), ""
    except (KeyError, ValueError) as e:
        return None, f"its config no longer builds ({type(e).__name__}: {e})"
    return None, f"unknown run kind {kind!r}"


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
