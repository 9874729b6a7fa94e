"""The TPU (Mosaic) kernels' shape: big grid steps, natural layouts, cost estimates - and their values.

Values: interpret mode against the float64 references of tests/test_pallas.py (numpy loop for the forward,
float64 lax.scan for every gradient), with ``tpu.T_BLOCK`` lowered so that a tiny T still runs several time
blocks (the state crosses grid steps) of several chunks each (the in-kernel loop), and head groups of 2 (the
mode planes of M = 32 at lane offsets 0, 32, 64, 96 of one block); op.py's fused operator runs them (the mode
mixing inside fwd_o / scan_rev / bwd_o), so the gradient of c checks the on-chip K cotangent. Shape: the pallas_calls that forward +
backward trace at the benchmark shape and the 1.3B layer (T = 4096) each take >= 512 tokens per grid step and
read their activations through free reshapes only (no transpose in the traced program).
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from idattn.ops.pallas import interdomain_mix_pallas
from idattn.ops.pallas import tpu
from tests.test_pallas import _run_case


def test_tpu_blocks_and_head_groups_match_float64(monkeypatch):
    """T = 61 (padded to 64, 4 chunks of 16) in time blocks of 2 chunks; H = 2 heads of M = 32 modes in one head
    group (both heads' mode planes in one 128-lane block); segment resets, c, initial state, conj=True."""
    monkeypatch.setattr(tpu, "T_BLOCK", 32)
    g = tpu.geometry("fwd_p", 2, 64, 2, 128, 32, 16)
    assert (g.hg, g.nk, g.NT) == (2, 2, 2)
    _run_case("tpu", jnp.float32, True, B=1, T=61, H=2, R=8, D=8, M=32, L=16,
              with_c=True, with_x0=True, with_seg=True, tol_fwd=1e-4, tol_grad=1e-4, seed=11)


@pytest.mark.slow
def test_tpu_paper_layer_dh64_m64_matches_float64(monkeypatch):
    """The paper's layer (d_h = 64, M = 64: two heads per 128-lane feature block), two time blocks, segments,
    c and initial state, the forward's saved states (save_states=True), conj=False."""
    monkeypatch.setattr(tpu, "T_BLOCK", 32)
    assert tpu.geometry("bwd_p", 1, 64, 2, 64, 64, 16).grid == (1, 1, 2)  # both heads of 64 in one 128-lane block
    _run_case("tpu", jnp.float32, False, B=1, T=64, H=2, R=64, D=64, M=64, L=16,
              with_c=True, with_x0=True, with_seg=True, tol_fwd=1e-4, tol_grad=1e-4, seed=12, save_states=True)


@pytest.mark.slow
def test_tpu_bf16_matches_float64(monkeypatch):
    monkeypatch.setattr(tpu, "T_BLOCK", 32)
    _run_case("tpu", jnp.bfloat16, True, B=2, T=64, H=2, R=64, D=64, M=64, L=16,
              with_c=True, with_x0=True, with_seg=True, tol_fwd=2e-2, tol_grad=2e-2, seed=13)


# ------------------------------------------------------------------------------------------------ shape


def _pallas_eqns(jaxpr):
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            out.append(eqn)
        for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else ():
            out += _pallas_eqns(sub)
        for p in eqn.params.values():
            for j in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(j, "jaxpr", None)
                if inner is not None and hasattr(inner, "eqns"):
                    out += _pallas_eqns(inner)
                elif hasattr(j, "eqns"):
                    out += _pallas_eqns(j)
    return out


def _transposes(jaxpr):
    n = 0
    for eqn in jaxpr.eqns:
        aval = eqn.invars[0].aval if eqn.invars else None
        if (eqn.primitive.name == "transpose" and len(aval.shape) >= 3
                and not jnp.issubdtype(aval.dtype, jnp.complexfloating)):
            n += 1
        for p in eqn.params.values():
            for j in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(j, "jaxpr", None)
                if inner is not None and hasattr(inner, "eqns"):
                    n += _transposes(inner)
    return n


def _trace(B, T, H, dh, M, L=128, seg=True):
    sd = jax.ShapeDtypeStruct
    x = sd((B, T, H, dh), jnp.bfloat16)
    lam, b, c = sd((H, M), jnp.complex64), sd((H, M), jnp.complex64), sd((H, M, M), jnp.complex64)
    seg_ids = sd((B, T), jnp.int32)

    def loss(fq, zk, zv, lam, b, c, s):
        o = interdomain_mix_pallas(fq, zk, zv, lam, b, c, conj=True, chunk_size=L, segment_ids=s if seg else None,
                                   initial_state=None, return_state=False, out_dtype=None, interpret=False,
                                   family="tpu")
        return jnp.sum(o.astype(jnp.float32))

    return jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3, 4, 5)))(x, x, x, lam, b, c, seg_ids).jaxpr


@pytest.mark.parametrize("B,H,dh,M", [(16, 16, 128, 32), (2, 32, 64, 64)])
def test_grid_steps_carry_512_tokens_at_4k(B, H, dh, M):
    """Forward + backward at T = 4096, L = 128 (benchmark shape at 4K; the 1.3B layer per chip): 8 pallas_calls,
    each with a cost estimate and >= 512 tokens of a (row, head group) per grid step, grid (B, H/hg, T/TB); no
    transpose of a real rank >= 3 array anywhere in the traced program (features and mode planes are read in place;
    the complex [B, T, H, M] transposes left are op.py's XLA mixing einsum and its VJP, outside the kernels)."""
    T = 4096
    jaxpr = _trace(B, T, H, dh, M)
    eqns = _pallas_eqns(jaxpr)
    names = sorted(str(e.params["name"]) for e in eqns)
    assert names == sorted("idattn_tpu_" + k for k in ("fwd_p", "fwd_o", "scan_fwd_k", "scan_fwd_v", "scan_rev_k",
                                                       "scan_rev_v", "bwd_o", "bwd_p")), names
    for e in eqns:
        grid = tuple(e.params["grid_mapping"].grid)
        assert len(grid) == 3 and grid[0] == B, grid
        hg = H // grid[1]
        tokens_per_step = T // grid[2]
        assert tokens_per_step >= 512, (names, grid)
        # heads packed: the column blocks of hg heads' features (d_h = 64: 2 heads, no padding) and of their 2·M
        # mode planes fill whole 128-lane tiles
        assert (hg * dh) % 128 == 0 and (hg * 2 * M) % 128 == 0 and hg == tpu.head_group(H, dh, M), grid
        ce = e.params["cost_estimate"]
        assert ce is not None and ce.flops > 0 and ce.bytes_accessed > 0, e.params["name"]
    assert _transposes(jaxpr) == 0


def test_cost_model_counts():
    """The static model (what the CostEstimates carry): steps and bytes at the benchmark shape, T = 4K."""
    g = tpu.geometry("fwd_p", 16, 4096, 16, 128, 32, 128)
    assert (g.hg, g.TB, g.grid, g.steps) == (2, 1024, (16, 8, 4), 512)
    c = tpu.kernel_cost("fwd_p", g, io_bytes=2, seg=False)
    tok = 16 * 4096 * 16
    # fq, zk in (bf16), p out (f32 planes), x0 in and xT out
    assert c["bytes"] >= tok * (2 * 128 * 2 + 2 * 32 * 4)
    assert c["flops"] == 16 * 16 * 32 * tpu.chunk_flops("fwd_p", 128, 32, 128)
    np.testing.assert_equal(tpu.chunk_flops("scan_fwd", 128, 32, 128), 4 * 128 * 32 * 128)


def test_bench_tpu_prints_the_static_model(capsys):
    """`python -m idattn.bench tpu` prints before / after rows from the same model as the CostEstimates."""
    from idattn.bench.__main__ import main
    from idattn.bench import tpu_model
    main(["tpu", "--seqs", "4096", "--per-kernel", "4096"])
    out = capsys.readouterr().out
    before = next(ln for ln in out.splitlines() if " 4096 " in ln and "before" in ln).split()
    after = next(ln for ln in out.splitlines() if " 4096 " in ln and " after " in ln).split()
    assert before[6] == str(8 * 16 * 16 * 32) and after[6] == str(8 * 512)  # grid steps of the 8 calls
    assert float(after[9]) < float(before[9]) / 3  # v5p ms
    c = tpu_model.after("bwd_p", 16, 4096, 16, 128, 32, 128)
    assert c["steps"] == 512 and c["tokens_per_step"] == 1024
    assert f"{c['bytes'] / 2**20:.0f}" in out
