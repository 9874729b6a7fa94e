"""scripts/parity_probe.py: its data are what it says (checked by direct loops), and its reading of a layer's turn
per bit is the layer's own lam_t (checked against the closed form of a selective layer whose projections are zero:
Δ_t = softplus(β_Δ) and ϑ_t = 0 at every token, so lam = exp(Δ_h·(a_h + iω_h,m)) whatever the bit)."""
from __future__ import annotations

import importlib.util
import json
import os

import jax
import numpy as np
import pytest

from idattn.eval import state_tracking as st

# compile time dominates on CPU: most XLA optimisations off for this module (conftest.fast_compile)
pytestmark = pytest.mark.usefixtures("fast_compile")

_SPEC = importlib.util.spec_from_file_location(
    "parity_probe", os.path.join(os.path.dirname(__file__), "..", "scripts", "parity_probe.py"))
PP = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(PP)


def test_prefix_labels_and_the_few_ones_set():
    x, y = st.generate("parity", 50, seed=3, lengths=(3, 12))
    t = PP.prefix_parity_targets(x, y)
    for row, lab, orig in zip(x, t, y):
        L = list(row).index(2)
        parity = 0
        for i in range(L):
            parity ^= int(row[i])
            assert lab[i] == parity
        assert lab[L] == orig[L] == parity and (lab[L + 1:] == orig[L + 1:]).all()
    x, y = PP.few_ones_set(40, seed=5, lengths=(41, 90), max_ones=6)
    for row, lab in zip(x, y):
        L = list(row).index(2)
        assert 41 <= L <= 90 and set(row[:L]) <= {0, 1} and (row[L + 1:] == 3).all()
        assert row[:L].sum() <= 6 and lab[L] == row[:L].sum() % 2 and (np.delete(lab, L) == -100).all()


def _zero_projections(params):
    """w_dt and w_theta kernels to zero: every token gets Δ = softplus(β_Δ) and ϑ = 0."""
    def f(path, v):
        k = jax.tree_util.keystr(path)
        return np.zeros_like(v) if ("w_dt" in k or "w_theta" in k) else v
    return jax.tree_util.tree_map_with_path(f, params)


def test_read_turns_is_the_layers_lam():
    import jax.numpy as jnp
    from flax import linen as nn

    from idattn.models import build_model

    model = build_model(PP.probe_config("s4d_only-selective+phase", width=16))
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"])
    params = _zero_projections(params)
    bits = np.random.default_rng(0).integers(0, 2, (4, 12)).astype(np.int32)
    got = PP.read_turns(model, params, bits)
    assert len(got) == 2  # both layers read
    flat = {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    for name, r in got.items():
        layer = name.split("/")[0]
        pick = lambda s: next(v for k, v in flat.items() if layer in k and s in k)  # noqa: E731
        dt = np.log1p(np.exp(pick("ssm_dt_bias")))[r["head"]]
        a = -np.exp(pick("ssm_log_a_re"))[r["head"]]
        w = pick("ssm_a_im")[r["head"], r["mode"]]
        want = np.angle(np.exp(1j * dt * w)) / np.pi
        assert abs(r["turn_over_pi"]) < 1e-5  # every token alike: no turn of a 1-bit past a 0-bit
        assert r["angle1_over_pi"] == pytest.approx(want, abs=1e-5)
        assert r["angle0_over_pi"] == pytest.approx(want, abs=1e-5)
        assert r["concentration1"] == pytest.approx(1.0, abs=1e-6)
        assert r["mag1"] == pytest.approx(np.exp(dt * a), rel=1e-5) and r["mag0"] == pytest.approx(np.exp(dt * a),
                                                                                                  rel=1e-5)


def test_turn_stats_on_a_known_lam():
    """A hand-made lam: at (head 1, mode 5) a 1-bit has angle 0.95π and magnitude 0.9, a 0-bit angle 0.1π and
    magnitude 0.99 (turn 0.85π); every other pair turns by at most 0.2π; the masks must not be swapped."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2, (6, 20))
    H, M = 2, 8
    ang = np.where(bits[..., None, None] == 1, 0.12, 0.05) * np.pi * np.ones((1, 1, H, M))
    mag = np.full(bits.shape + (H, M), 0.97)
    ang[..., 1, 5] = np.where(bits == 1, 0.95 * np.pi, 0.1 * np.pi)
    mag[..., 1, 5] = np.where(bits == 1, 0.9, 0.99)
    r = PP.turn_stats(mag * np.exp(1j * ang), bits)
    assert (r["head"], r["mode"]) == (1, 5)
    assert r["turn_over_pi"] == pytest.approx(0.85) and r["angle1_over_pi"] == pytest.approx(0.95)
    assert r["angle0_over_pi"] == pytest.approx(0.1) and r["concentration1"] == pytest.approx(1.0)
    assert r["mag1"] == pytest.approx(0.9) and r["mag0"] == pytest.approx(0.99)
    assert r["near_pi"] == 0 and r["near_pi_if_uniform"] == pytest.approx(0.8)
    assert r["max_turn_if_uniform_over_pi"] == pytest.approx(16 / 17)
    ang[..., 0, 2] = np.where(bits == 1, -0.5 * np.pi, 0.48 * np.pi)  # a turn of 0.98π, through the wrap
    r = PP.turn_stats(mag * np.exp(1j * ang), bits)
    assert (r["head"], r["mode"]) == (0, 2) and r["turn_over_pi"] == pytest.approx(-0.98) and r["near_pi"] == 1


def test_refusals():
    import jax.numpy as jnp
    from flax import linen as nn

    from idattn.models import build_model

    cfg = PP.probe_config("s4d_only-selective", width=16)
    model = build_model(cfg)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"])
    with pytest.raises(ValueError, match="bits"):
        PP.read_turns(model, params, np.full((1, 4), 2, np.int32))
    cfg.scan_layers = True
    with pytest.raises(ValueError, match="scan_layers"):
        PP.read_turns(build_model(cfg), params, np.zeros((1, 4), np.int32))
    with pytest.raises(SystemExit):
        PP.main(["--mixer=interdomain"])


@pytest.mark.slow  # one tiny training run end to end (~30 s)
def test_probe_end_to_end(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert PP.main(["--mixer=s4d_only-selective", "--steps=3", "--width=16", f"--out={out}"]) == 0
    res = json.loads(out.read_text())
    assert res["steps"] == 3 and len(res["layers"]) == 2
    for k in ("acc_3_40", "acc_40_256", "acc_41_256_at_most_20_ones"):
        assert 0.0 <= res[k] <= 1.0
    for r in res["layers"].values():
        assert -1.0 <= r["turn_over_pi"] <= 1.0 and 0 < r["mag0"] <= 1.0 and 0 < r["mag1"] <= 1.0


def test_erase_stats_on_a_known_beta():
    """A hand-made β: head 1 erases by 1.9 at every 1-bit and 0.1 at every 0-bit, head 0 by 0.5 at both; the keys
    at head 1 are one direction at every 1-bit (concentration 1), random elsewhere."""
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2, (5, 30))
    beta = np.full(bits.shape + (2,), 0.5)
    beta[..., 1] = np.where(bits == 1, 1.9, 0.1)
    keys = rng.normal(size=bits.shape + (2, 8))
    keys[..., 1, :] = np.where((bits == 1)[..., None], 3.0 * np.eye(8)[2], keys[..., 1, :])
    r = PP.erase_stats(beta, bits, keys)
    assert r["erase_head"] == 1 and r["beta1"] == pytest.approx(1.9) and r["beta0"] == pytest.approx(0.1)
    assert r["flip1"] == 1.0 and r["flip0"] == 0.0 and r["key_concentration1"] == pytest.approx(1.0)
    assert "key_concentration1" not in PP.erase_stats(beta, bits)


def test_read_layers_is_a_delta_layers_beta():
    """With w_beta's kernel at zero every token gets β = s·σ(0) = s / 2 (s = 2 here: 1.0, no token above 1), and
    an LTI delta layer has no turns to read."""
    import jax.numpy as jnp
    from flax import linen as nn

    from idattn.models import build_model

    model = build_model(PP.probe_config("interdomain-delta2", width=16))
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"])
    params = jax.tree_util.tree_map_with_path(
        lambda p, v: np.zeros_like(v) if "w_beta" in jax.tree_util.keystr(p) else v, params)
    bits = np.random.default_rng(0).integers(0, 2, (4, 12)).astype(np.int32)
    got = PP.read_layers(model, params, bits)
    assert len(got) == 2
    for r in got.values():
        assert r["beta1"] == pytest.approx(1.0, abs=1e-6) and r["beta0"] == pytest.approx(1.0, abs=1e-6)
        assert r["flip1"] == 0.0 and r["flip0"] == 0.0 and 0.0 < r["key_concentration1"] <= 1.0 + 1e-9
        assert "turn_over_pi" not in r
    with pytest.raises(ValueError, match="neither"):
        plain = build_model(PP.probe_config("interdomain", width=16))
        PP.read_layers(plain, nn.meta.unbox(jax.jit(plain.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
                                            ["params"]), bits)
