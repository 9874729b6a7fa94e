"""Δ initialisation: the range the reproduction's "paper vs scaled Δ" rows vary reaches the layers.

The paper's recipe draws each head's log Δ uniformly in [log dt_min, log dt_max] (S4D; Δ ∈ [1e-3, 1e-1]). The
reproduction trains at a shorter context T_train and compares that range ("paper") with one scaled so that
Δ·T_train is the paper's ("scaled": × 4096 / T_train). Checked on the built model's initial parameters (the
`ssm_log_dt` of every layer and head, pooled over seeds): inside the configured range, spanning it, uniform in
log Δ, and the two variants differing by exactly the scale for the same seed.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from idattn.configs.repro import get_config
from idattn.models import build_model

SEEDS = 16


def _initial_log_dt(model_cfg) -> np.ndarray:
    """Every layer's and head's initial log Δ, pooled over SEEDS seeds."""
    model = build_model(model_cfg)
    init = jax.jit(model.init)  # compiled once, run per seed
    out = []
    for seed in range(SEEDS):
        params = nn.meta.unbox(init(jax.random.PRNGKey(seed), jnp.zeros((1, 8), jnp.int32))["params"])
        leaves = [np.asarray(v).ravel() for p, v in jax.tree_util.tree_flatten_with_path(params)[0]
                  if "ssm_log_dt" in jax.tree_util.keystr(p)]
        assert leaves, "no ssm_log_dt parameter"
        out += leaves
    return np.concatenate(out).astype(np.float64)


@pytest.fixture(scope="module")
def variants():
    out = {}
    for dt in ("paper", "scaled"):
        cfg = get_config(f"interdomain,small,{dt},0")
        out[dt] = (cfg, _initial_log_dt(cfg.model))
    return out


@pytest.mark.parametrize("dt", ["paper", "scaled"])
def test_initial_dt_lies_in_and_spans_the_configured_range(variants, dt):
    cfg, log_dt = variants[dt]
    lo, hi = math.log(cfg.model.dt_min), math.log(cfg.model.dt_max)
    n = log_dt.size
    assert n >= 200, n  # layers × heads × seeds
    assert np.all(log_dt >= lo - 1e-6) and np.all(log_dt <= hi + 1e-6), (dt, log_dt.min(), log_dt.max(), lo, hi)
    # spanning: with n uniform draws, an end 5% of the width from the bound has probability 0.95^n (< 1e-5)
    width = hi - lo
    assert log_dt.min() - lo <= 0.05 * width and hi - log_dt.max() <= 0.05 * width, (dt, log_dt.min(),
                                                                                       log_dt.max(), lo, hi)
    # log-uniform: Kolmogorov-Smirnov against U[log dt_min, log dt_max]
    p = stats.kstest(log_dt, stats.uniform(loc=lo, scale=width).cdf).pvalue
    assert p > 1e-3, (dt, p)


def test_scaled_range_is_the_papers_times_4096_over_the_training_context(variants):
    paper_cfg, paper = variants["paper"]
    scaled_cfg, scaled = variants["scaled"]
    assert (paper_cfg.model.dt_min, paper_cfg.model.dt_max) == (1e-3, 1e-1)  # the paper's Δ range (S4D, App. A)
    scale = 4096 / scaled_cfg.data.seq_len
    assert scaled_cfg.data.seq_len == paper_cfg.data.seq_len and scale > 1
    assert scaled_cfg.model.dt_min == pytest.approx(1e-3 * scale) and scaled_cfg.model.dt_max == pytest.approx(
        1e-1 * scale)
    # the same seeds draw the same uniforms: every initial Δ is the paper variant's times the scale
    np.testing.assert_allclose(scaled - paper, math.log(scale), atol=1e-5)
