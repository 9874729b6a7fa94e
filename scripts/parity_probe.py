"""Does a selective core count parity by turning its state by π per 1-bit? A probe of the selective study's
question (s2).

Parity is a half-turn per 1-bit: a mode with lam = e^{iπ} at every 1-bit and lam = 1 at every 0-bit holds
(−1)^(number of 1-bits) at any length. The protocol's runs (`python -m idattn.repro selective`, one label at `=`)
leave every model at the class prior, so this probe trains with a label at every bit (the prefix's parity), which
makes the training lengths 3-40 learnable at once (docs/reproduction.md), and then reads what was learnt from
every selective layer, on 40-bit inputs:

    turn(h, m)   = arg( mean_{1-bits} lam_t/|lam_t| · conj(mean_{0-bits} lam_t/|lam_t|) )   in (−π, π]
    angle1, angle0 = arg of those circular means;  concentration = |mean_{1-bits} lam_t/|lam_t||  (1: every 1-bit
    turns alike);  |lam| at the 1-bits and at the 0-bits (1: the state is kept).

per layer at the (head, mode) with the largest |turn|. It also scores three test sets: the training lengths (3-40),
the protocol's test lengths (40-256), and 41-256 bits with at most 20 ones (the counts of 1-bits seen in training:
a model that reads parity from the angles it has seen fails the protocol's test set but not this one, unless the
0-bits turn too). A parity solution that extrapolates needs turn = π and angle0 = 0 exactly: an error of ε per token
is n·ε after n tokens.

    python scripts/parity_probe.py --mixer=s4d_only-selective+phase --seed=0 --steps=1200 --out=probe.json

A delta mixer (`-delta`, `-delta2`: the erase before write on the key state, β_t = s·σ(x_t·w_β)) is read for its
erase instead (and for its turns too when its core is selective). The erase (I − β_t k̂_t k̂_tᵀ) has eigenvalue
1 − β_t along k̂_t: a reflection (−1) at β = 2, the delta rule's way to count parity (Grazzi et al.), so a delta
layer that has learnt parity that way puts β near s = 2 at 1-bits and near 0 at 0-bits, on a key direction
shared by the 1-bits. Per delta layer, at the head whose mean β differs most between the bits:

    beta1, beta0         mean β_t at 1-bits and at 0-bits;
    flip1, flip0         the fraction of those tokens with β_t > 1 (a negative eigenvalue 1 − β_t);
    key_concentration1   |mean of k̂_t over the 1-bits| (1: every 1-bit erases along one direction).

    python scripts/parity_probe.py --mixer=interdomain-delta2 --seed=0 --steps=1200 --out=probe.json

Model: the state-tracking table's model family (`experiments/repro.py` get_mqar_config) at d_model `--width` × 2
blocks, 2 heads × 16, M = 16 modes, layers unrolled (the reading captures each layer's `recurrence`); MAD's
optimiser (idattn.eval.synthetic.fit), peak LR 3e-3, warmup 50, batch 64, 20,000 training sequences.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from idattn.eval import state_tracking as st
from idattn.eval.synthetic import IGNORE

PARITY = st.TASKS["parity"]


def prefix_parity_targets(inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """`st.generate("parity")`'s targets with a label at every bit too: the parity of the prefix up to it."""
    out = targets.copy()
    for i, row in enumerate(inputs):
        n = int(np.flatnonzero(row == PARITY["eq"])[0])
        out[i, :n] = np.cumsum(row[:n]) % 2
    return out


def few_ones_set(num: int, seed: int, lengths: tuple[int, int] = (41, 256), max_ones: int = 20):
    """(inputs, targets) of `num` parity examples of lengths in `lengths` with at most `max_ones` 1-bits (at random
    positions); labelled at `=` only, the protocol's format."""
    rng = np.random.default_rng(seed)
    T = lengths[1] + 1
    x = np.full((num, T), PARITY["pad"], np.int32)
    y = np.full((num, T), IGNORE, np.int32)
    for i in range(num):
        L = int(rng.integers(lengths[0], lengths[1] + 1))
        n = int(rng.integers(0, min(max_ones, L) + 1))
        x[i, :L] = 0
        x[i, rng.choice(L, n, replace=False)] = 1
        x[i, L] = PARITY["eq"]
        y[i, L] = n % 2
    return x, y


def _captured_lams(tree: Any) -> list[tuple[str, Any]]:
    """(layer path, lam [B, T, H, M]) of every selective `recurrence` call in flax's captured intermediates (an
    LTI layer's lam [H, M] is not per token and is skipped)."""
    return [(path, lam) for path, lam in _captured(tree, "recurrence") if lam.ndim == 4]


def _captured(tree: Any, method: str, path: str = "") -> list[tuple[str, Any]]:
    """(layer path, the first output) of every captured call of `method` in flax's intermediates."""
    out = []
    for k, v in tree.items():
        if k == method:
            out.append((path, v[0] if method != "recurrence" else v[0][0]))
        elif isinstance(v, Mapping):
            out += _captured(v, method, f"{path}/{k}" if path else k)
    return out


def read_turns(model: Any, params: Any, inputs: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per selective layer (module docstring): the (head, mode) whose 1-bit turns furthest from its 0-bit, and how.
    `inputs` [B, T] of bits (0 / 1) only; the model's layers must be unrolled (scan_layers=False)."""
    return read_layers(model, params, inputs, erase=False)


def read_layers(model: Any, params: Any, inputs: np.ndarray, erase: bool = True) -> dict[str, dict[str, Any]]:
    """Per layer: its turn statistics when its core is selective (`turn_stats`), and its erase statistics when it
    has the delta update (`erase_stats`, with `erase`); layers with neither are not listed."""
    import jax.numpy as jnp

    if getattr(getattr(model, "spec", None), "scan_layers", False):
        raise ValueError("parity probe: the model has scan_layers=True; build it with model.scan_layers=False so "
                         "that each layer's recurrence can be captured")
    if not np.isin(inputs, (0, 1)).all():
        raise ValueError("parity probe: inputs must be bits (tokens 0 / 1) only")
    import jax

    methods = ("recurrence", "erase_strength") if erase else ("recurrence",)

    def wanted(mdl, method):  # the layer's methods, and (for the erase) its key norm's output: the keys k̃_t
        return method in methods or (erase and method == "__call__" and mdl.name == "ssm_norm_k")

    capture = jax.jit(lambda p, x: model.apply({"params": p}, x, mutable=["intermediates"],
                                               capture_intermediates=wanted))
    _, state = capture(params, jnp.asarray(inputs))
    inter = dict(state["intermediates"])
    out = {name: turn_stats(np.asarray(lam), inputs) for name, lam in _captured_lams(inter)}
    if erase:
        keys = {path.rsplit("/ssm_norm_k", 1)[0]: k for path, k in _captured(inter, "__call__")
                if path.endswith("/ssm_norm_k")}
        for name, beta in _captured(inter, "erase_strength"):
            if beta is not None:
                k = keys.get(name)
                k = None if k is None else np.asarray(k).reshape(beta.shape + (-1,))  # [B, T, H, R]
                out.setdefault(name, {}).update(erase_stats(np.asarray(beta), inputs, k))
    if not out:
        raise ValueError("parity probe: nothing to read; the mixer has neither a selective core nor the delta update")
    return out


def erase_stats(beta: np.ndarray, inputs: np.ndarray, keys: np.ndarray | None = None) -> dict[str, Any]:
    """The module docstring's erase statistics of one layer's β [B, T, H] on bits `inputs` [B, T], at the head
    whose mean β differs most between 1-bits and 0-bits; `keys` [B, T, H, R] (the layer's feature-mapped keys),
    when given, adds the concentration of k̂ over the 1-bits at that head."""
    beta = np.asarray(beta, np.float64)
    one, zero = inputs == 1, inputs == 0
    b1, b0 = beta[one].mean(0), beta[zero].mean(0)  # [H]
    h = int(np.argmax(np.abs(b1 - b0)))
    out = {"erase_head": h, "beta1": float(b1[h]), "beta0": float(b0[h]),
           "flip1": float((beta[one][:, h] > 1).mean()), "flip0": float((beta[zero][:, h] > 1).mean())}
    if keys is not None:
        k = np.asarray(keys, np.float64)[one][:, h]  # [N, R]
        kh = k / np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-30)
        out["key_concentration1"] = float(np.linalg.norm(kh.mean(0)))
    return out


def turn_stats(lam: np.ndarray, inputs: np.ndarray) -> dict[str, Any]:
    """The module docstring's statistics of one layer's lam [B, T, H, M] on bits `inputs` [B, T], at the (head, mode)
    with the largest |turn|. That maximum is taken over K = H·M pairs, so it is near π by selection alone once the
    turns spread over the circle (a per-token Δ_t turns mode m by (Δ₁ − Δ₀)·ω_m, which wraps for the fast modes):
    `max_turn_if_uniform_over_pi` = K / (K + 1) is the expected maximum of K uniform |turns| / π, and
    `near_pi` counts the pairs with |turn| ≥ 0.95π beside `near_pi_if_uniform` = 0.05·K."""
    lam = np.asarray(lam, np.complex128)
    one, zero = inputs == 1, inputs == 0
    mag = np.abs(lam)
    unit = lam / np.maximum(mag, 1e-30)
    u1, u0 = unit[one].mean(0), unit[zero].mean(0)  # [H, M] circular means
    turn = np.angle(u1 * np.conj(u0))
    h, m = np.unravel_index(np.argmax(np.abs(turn)), turn.shape)
    k = turn.size
    return {"head": int(h), "mode": int(m), "turn_over_pi": float(turn[h, m] / np.pi),
            "angle1_over_pi": float(np.angle(u1[h, m]) / np.pi), "angle0_over_pi": float(np.angle(u0[h, m]) / np.pi),
            "concentration1": float(np.abs(u1[h, m])),
            "mag1": float(mag[one][:, h, m].mean()), "mag0": float(mag[zero][:, h, m].mean()),
            "near_pi": int((np.abs(turn) >= 0.95 * np.pi).sum()), "near_pi_if_uniform": 0.05 * k,
            "max_turn_if_uniform_over_pi": k / (k + 1)}


def probe_config(mixer: str, width: int):
    from idattn.configs import repro as exp
    c = exp.get_mqar_config(mixer, "small").model
    c.update(dict(d_model=width, num_layers=2, num_heads=2, head_dim=16, ffn_dim=3 * width, num_modes=16,
                  vocab_size=16, scan_layers=False, remat="none"))
    return c


def probe(mixer: str, seed: int, steps: int, width: int = 32, num_train: int = 20_000, num_test: int = 512,
          log=print) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    from idattn.eval import mad
    from idattn.eval.synthetic import fit
    from idattn.models import build_model

    model = build_model(probe_config(mixer, width))
    x_tr, y_tr = st.generate("parity", num_train, seed, lengths=(3, 40))
    t0 = time.time()
    res = fit(model, x_tr, prefix_parity_targets(x_tr, y_tr), steps=steps, batch_size=64, lr=3e-3, warmup=50,
              seed=seed, log_every=max(1, steps // 6), log=log, name="parity (a label at every bit)")
    params = res["params"]
    apply = jax.jit(lambda p, x: model.apply({"params": p}, x))
    score = lambda x, y: mad.score(lambda b: apply(params, jnp.asarray(b)), x, y)  # noqa: E731
    out: dict[str, Any] = {"mixer": mixer, "seed": seed, "steps": steps, "width": width,
                           "train_s": round(time.time() - t0, 1), "final_train_loss": float(res["loss"])}
    out["acc_3_40"] = score(*st.generate("parity", num_test, seed + 100_003, lengths=(3, 40)))
    out["acc_40_256"] = score(*st.generate("parity", num_test, seed + 100_003, lengths=(40, 256)))
    out["acc_41_256_at_most_20_ones"] = score(*few_ones_set(num_test, seed + 11))
    bits, _ = st.generate("parity", 256, seed + 7, lengths=(40, 40))
    out["layers"] = read_layers(model, params, bits[:, :40])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mixer", required=True, help="a selective or delta mixer, e.g. s4d_only-selective+phase, "
                    "interdomain-delta2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--out", default=None, help="write the result as JSON here (default: print it)")
    a = ap.parse_args(argv)
    if "selective" not in a.mixer and "-delta" not in a.mixer:
        ap.error(f"--mixer={a.mixer}: expected a selective core or the delta update (a name with -selective, "
                 f"-selective+phase, -delta or -delta2)")
    res = probe(a.mixer, a.seed, a.steps, a.width, log=lambda s: print(s, file=sys.stderr, flush=True))
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
