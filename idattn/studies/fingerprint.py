"""Model fingerprints: a recorded run outlives a change of model code that leaves its function alone (a restored run
has no checkpoint to re-evaluate).

A fingerprint is a small, exact probe of the function a model config computes: from a fixed init (key 0, not the
run's seed: it probes the code, not the run) on a fixed batch of 2 rows x probe_len tokens (ragged across the
chunks, past any attention window; the second row holds two documents, a segment reset at FP_RESET), in float32:

    [ℓ(θ0), ℓ(θ0 − 0.5·∇ℓ/‖∇ℓ‖), ‖∂ℓ/∂θ_1‖, ..., ‖∂ℓ/∂θ_P‖]   (θ_i: the parameter leaves, in tree order)

with ℓ the mean next-token cross-entropy over the rows' valid positions. The per-leaf norms are what make it see a
mixer: at init a change inside the mixer (e.g. the readout's conjugation) moves ℓ by ~1e-7 relative, but the
gradient of the mixer's own parameters by far more (tests/test_fingerprint.py). A run stores the fingerprint of its
config computed by the code that trained it (marker key "fingerprint": {"src", "version", "values"}); under new code
the same config's values equal to it (relative FP_RTOL per value, on at least 1e-3 of the largest value's scale: a
neutral edit compiles to the same program, FP_RTOL allows for another CPU's reassociation) keep the run. What the
probe cannot see (longer contexts, parameter values far from init such as the κ bound, decoding) must be declared by
hand: move the runs aside, or train again.
"""
from __future__ import annotations

import json
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from idattn.models import build_model

FP_LEN = 37  # at least: 2 full 16-token chunks and a ragged tail (probe_len: longer for wider chunks or windows)
FP_RESET = 20  # the second row's second document starts here
FP_RTOL = 1e-5
FP_VERSION = 1  # the probe's own definition; a fingerprint of another version is not compared


def probe_len(cfg: Any) -> int:
    """The probe's tokens per row: FP_LEN, or more so that the first row crosses two chunks of the config's chunk
    size and reaches past any attention window by 5 tokens (a window the probe does not exceed would be invisible
    to it: a 1:3 hybrid with a 64-token window and one with global attention agree on 37 tokens)."""
    T = max(FP_LEN, 2 * int(cfg.get("chunk_size", 16) or 16) + 5)
    window = int(cfg.get("window", 0) or 0)
    return max(T, window + 5) if window > 0 else T


def model_fingerprint(model_cfg: Any) -> list[float]:
    """[loss, loss after a step of length 0.5 down the gradient, the gradient norm of each parameter leaf] of
    build_model(model_cfg) at init key 0 on the module's fixed batch (module docstring), float32, Python floats."""
    cfg = model_cfg.copy_and_resolve_references() if hasattr(model_cfg, "copy_and_resolve_references") else model_cfg
    model = build_model(cfg)
    V, T = int(cfg.vocab_size), probe_len(cfg)
    rng = np.random.default_rng(20261204)
    tokens = rng.integers(0, min(V, 61), (2, T + 1))
    inputs, targets = jnp.asarray(tokens[:, :-1], jnp.int32), jnp.asarray(tokens[:, 1:], jnp.int32)
    segments = np.ones((2, T), np.int32)
    segments[1, FP_RESET:] = 2
    positions = np.tile(np.arange(T, dtype=np.int32), (2, 1))
    positions[1, FP_RESET:] -= FP_RESET
    mask = np.ones((2, T), np.float32)
    mask[1, FP_RESET - 1] = 0.0  # the last token of a document does not predict the next document's first
    segments, positions, mask = jnp.asarray(segments), jnp.asarray(positions), jnp.asarray(mask)
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), inputs[:, :2])["params"])

    def loss(p):
        logits = model.apply({"params": p}, inputs, segment_ids=segments, positions=positions).astype(jnp.float32)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
        return jnp.sum(nll * mask) / jnp.sum(mask)

    @jax.jit
    def probe(p):
        l0, g = jax.value_and_grad(loss)(p)
        leaf_norms = [jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)))) for x in jax.tree.leaves(g)]
        norm = jnp.sqrt(sum(n * n for n in leaf_norms))
        stepped = jax.tree.map(lambda x, gx: x - (0.5 / jnp.maximum(norm, 1e-30)) * gx.astype(x.dtype), p, g)
        return jnp.stack([l0, loss(stepped)] + leaf_norms)

    return [float(v) for v in np.asarray(probe(params))]


def stamp(src: str, values: list[float]) -> dict[str, Any]:
    """The marker's "fingerprint" entry: the values and the code hash (and probe version) they were computed by."""
    return {"src": src, "version": FP_VERSION, "values": [float(v) for v in values]}


def same(recorded: dict[str, Any] | None, values: list[float]) -> tuple[bool, str]:
    """(equal?, why) of a recorded fingerprint entry and this code's values for the same config."""
    if not recorded or "values" not in recorded:
        return False, "no fingerprint recorded"
    if recorded.get("version") != FP_VERSION:
        return False, f"fingerprint of probe version {recorded.get('version')}, not {FP_VERSION}"
    old = [float(v) for v in recorded["values"]]
    if len(old) != len(values):
        return False, f"fingerprint of {len(old)} values, not {len(values)}"
    floor = 1e-3 * max(abs(a) for a in old)  # a leaf whose gradient is ~0 is compared on the others' scale
    worst = max(abs(a - b) / max(abs(a), floor, 1e-30) for a, b in zip(old, values))
    i = max(range(len(old)), key=lambda j: abs(old[j] - values[j]) / max(abs(old[j]), floor, 1e-30))
    text = (f"fingerprint under {recorded.get('src')} ({len(old)} values) against now: largest relative difference "
            f"{worst:.1e} (tolerance {FP_RTOL:g}; value {i}: {old[i]:.7g} then, {values[i]:.7g} now)")
    return worst <= FP_RTOL, text


def check(rec: dict[str, Any], src: str, config: Callable[[], tuple[Any, str]],
          cache: dict[str, list[float]] | None = None, log: Callable[[str], None] | None = None) -> tuple[str, str]:
    """(outcome, why) of one finished run's marker `rec` under the model code of hash `src`, by its fingerprint:

    - "unchanged": model code as recorded and a fingerprint of it already there (or checked under it): no probe;
    - "stamped": model code as recorded: its fingerprint is computed and put in `rec`;
    - "verified": other model code, with a fingerprint the current code reproduces: `rec` takes the current hash,
      notes why in "verified" and marks the fingerprint "checked" under it (the values stay those of the code that
      trained the run, so that tolerances do not chain; "checked" lets the next check skip the probe);
    - "changed": other model code, a fingerprint it does not reproduce (`rec` is left as it is);
    - "unverifiable": other model code and no fingerprint; "skipped": `config()` says why it has no config.
    `config()`: (the run's model config as the current configs build it, "") or (None, why not), called only when a
    probe is needed. `cache`: fingerprints by config, shared across calls (seeds share one probe). The caller
    writes `rec` back when the outcome is "stamped" or "verified"."""
    fp = rec.get("fingerprint")
    if (rec.get("src") == src and fp and fp.get("version") == FP_VERSION
            and src in (fp.get("src"), fp.get("checked"))):
        return "unchanged", ""
    if rec.get("src") != src and not fp:
        return "unverifiable", "no fingerprint recorded"
    cfg, why = config()
    if cfg is None:
        return "skipped", why
    cache = {} if cache is None else cache
    key = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
    if key not in cache:
        cache[key] = model_fingerprint(cfg)
        if log is not None:
            log(f"fingerprint of a {cfg.get('mixer', '?')} config: {', '.join(f'{v:.7g}' for v in cache[key])}")
    values = cache[key]
    if rec.get("src") == src:
        rec["fingerprint"] = stamp(src, values)
        return "stamped", ""
    ok, why = same(fp, values)
    if not ok:
        return "changed", why
    rec["src"] = src
    rec["fingerprint"] = dict(fp, checked=src)
    rec.setdefault("verified", []).append(why)
    return "verified", why
