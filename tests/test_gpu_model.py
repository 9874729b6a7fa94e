"""idattn.bench.gpu_model: the features it reads from a compiled configuration (programs, occupancy, waves,
iterations, barriers, bytes), its fit (exact constants come back from times made with them; a constant that would be
negative is held at 0), and the committed table in docs/kernels-results.md is what the committed kernel data give."""
import os

import numpy as np
import pytest

from idattn.bench import gpu_model as G
from idattn.ops.pallas import gpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mix(total, bars, ldg, stg=0):
    return {"total": total, "bar_sync": bars, "ldg_bytes": ldg, "stg_bytes": stg, "mma_macs": 0}


def _rep(B, T, H, L, warps=8, regs=240):
    """Two launches: a serial kernel (grid (B, H, 2): two feature blocks, every chunk) and a chunk-parallel one."""
    NC = T // L
    per = G._groups_per(NC, B * H)
    return {"case": [H, 128, 32, "bfloat16", B, T, L],
            "calls": [{"name": "idattn_fwd_p", "num_warps": warps, "num_stages": 1, "grid": [B, H, 2]},
                      {"name": "idattn_bwd_o", "num_warps": warps, "num_stages": 1, "grid": [B, H, -(-NC // per)]}],
            "kernels": {"idattn_fwd_p": {"registers": regs, "loop": _mix(1000, 40, 1000), "all": _mix(1200, 50, 1500)},
                        "idattn_bwd_o": {"registers": 128, "loop": _mix(3000, 140, 4000, 500),
                                         "all": _mix(3300, 150, 4000, 500)}},
            "xla": {"glue_ops": 20, "glue_bytes": 10**8}}


def test_features_count_programs_waves_and_iterations_by_hand():
    rep = _rep(B=16, T=4096, H=16, L=64)
    serial, par = G.kernel_costs(rep)
    assert (serial.programs, serial.occupancy, serial.iterations) == (512, 1, 64)  # 240 regs x 256 threads: 1 per SM
    assert serial.waves == 4  # ceil(512 / 132)
    assert par.occupancy == 2 and par.iterations == 32  # 128 regs: 2 per SM; 64 chunks x 256 rows / 512 programs
    assert par.programs == 16 * 16 * 2 and par.waves == 2
    f = G.features(rep)
    work = 512 * 64
    assert f[G.TERMS.index("c_launch")] == 2
    assert f[G.TERMS.index("c_path")] == 4 * 64 + 2 * 32
    assert f[G.TERMS.index("c_bar")] == pytest.approx((work * 40 + 512 * 32 * 140) / 132)
    assert f[G.TERMS.index("c_bytes")] == pytest.approx((work * 1000 + 512 * 500 + 512 * 32 * 4500) / 1e9)
    assert f[G.TERMS.index("c_glue_op")] == 20 and f[G.TERMS.index("c_glue_bytes")] == pytest.approx(0.2)
    # the busiest scheduler: ceil(512 / 132) = 4 programs on its SM, 8 warps each over 4 schedulers -> 8 warps
    assert f[G.TERMS.index("c_issue")] == 64 * 1000 * 8 + 32 * 3000 * 8


def test_idle_sms_are_not_free_issue_slots():
    """The issue term is the busiest scheduler's: a launch of 64 programs of 4 warps leaves 68 SMs idle and one
    warp per scheduler on the others, so it takes as long as 128 such programs (one per SM), twice what spreading
    its work over all 528 schedulers would say (within 132 / 128); from 133 programs some SM runs two, from 265 three."""
    def slots(programs, warps):
        return G.KernelCost("k", programs, 1, 1, 10, 0, 100, warps, 0, 0, 0).issue_slots()

    assert slots(64, 4) == slots(128, 4) == 10 * 100
    assert slots(64, 4) == pytest.approx(2 * 64 * 10 * 100 * 4 / (132 * 4), rel=0.04)  # 528 / 512 schedulers
    assert slots(132, 4) == 1000 and slots(133, 4) == 2000 and slots(265, 4) == 3000
    assert slots(128, 2) == 1000 and slots(256, 2) == 1000 and slots(528, 2) == 2000  # a warp issues from one
    assert slots(128, 8) == 2000  # 8 warps: 2 per scheduler


def test_a_group_longer_than_the_sequence_runs_only_its_chunks():
    """At 1K tokens (B = 64, H = 16, 16 chunks of 64) the backward's group size works out at 32 chunks per program
    for 512 programs, but a program's loop stops at the last chunk: 16 iterations, not 32."""
    rep = _rep(B=64, T=1024, H=16, L=64)
    serial, par = G.kernel_costs(rep)
    assert par.programs == 64 * 16 and par.iterations == 16
    assert serial.iterations == 16


def test_a_readout_walks_the_chunks_its_plans_feature_blocks_imply():
    """A chunk-parallel readout's grid (B, H, nb x groups) is the same for every number of feature blocks nb
    (nb x ceil(NC / per) = 512 / (B·H)), so its iterations per program come from the recorded plan: at (16, 128,
    32) 4K with 64-wide blocks (nb = 2) each program walks all 64 chunks; read from the grid alone, 32."""
    B, T, H, L = 16, 4096, 16, 64
    rep = {"case": [H, 128, 32, "bfloat16", B, T, L],
           "calls": [{"name": "idattn_fwd_o_readout", "num_warps": 4, "num_stages": 1, "grid": [B, H, 2]}],
           "kernels": {"idattn_fwd_o_readout": {"registers": 184, "loop": _mix(300, 8, 1000),
                                                "all": _mix(400, 10, 1200)}}, "xla": {}}
    assert G.kernel_costs(rep)[0].iterations == 32  # no plan recorded: nb = 1 assumed
    rep["blocks"] = {"idattn_fwd_o_readout": 64}
    assert G.kernel_costs(rep)[0].iterations == 64
    rep["blocks"] = {"idattn_fwd_o_readout": 128}
    assert G.kernel_costs(rep)[0].iterations == 32


def test_a_backward_split_by_mode_block_walks_each_chunk_once_per_block():
    """The backward with a program per mode block (gpu.SPLIT_MODE_BLOCKS): grid (B, H, groups x blocks), the groups
    sized for B·H·blocks rows. At (32, 64, 64) 16K (B = 4, NC = 256, two blocks) that is 128 chunks per program on
    a grid axis of 2 x 2, which the grid alone reads as 4 groups of 64; the compile records the split, and
    programs x iterations then cover every (row, head, chunk, block) once."""
    B, T, H, L = 4, 16384, 32, 64
    NC, nmb = T // L, 2
    per, NG = gpu._groups(B, H * nmb, NC)
    rep = {"case": [H, 64, 64, "bfloat16", B, T, L],
           "calls": [{"name": "idattn_bwd_o", "num_warps": 8, "num_stages": 1, "grid": [B, H, NG * nmb]}],
           "kernels": {"idattn_bwd_o": {"registers": 238, "loop": _mix(1500, 58, 4000),
                                        "all": _mix(2500, 70, 6000), "trips": {"sub": 2, "mode": 1}}}, "xla": {}}
    assert G.kernel_costs(rep)[0].iterations == 64  # the grid alone: read as 4 groups of one block each
    rep["kernels"]["idattn_bwd_o"]["trips"]["split"] = nmb
    kc = G.kernel_costs(rep)[0]
    assert kc.iterations == per == 128 and kc.programs * kc.iterations == B * H * NC * nmb


def test_the_fit_returns_the_constants_the_times_were_made_with():
    rng = np.random.default_rng(0)
    true = np.array([5.0, 2.0, 0.0, 0.01, 300.0, 3.0, 0.0])
    rows = [(f, float(f @ true) / 1000) for f in rng.uniform(1, 100, size=(20, len(G.TERMS)))]
    assert np.allclose(G.fit(rows), true, atol=1e-6)
    # a constant the data would make negative is held at 0 and the rest refitted
    true_neg = np.array([5.0, -2.0, 0.0, 0.01, 300.0, 3.0, 0.0])
    rows = [(f, max(float(f @ true_neg), 1.0) / 1000) for f in rng.uniform(1, 100, size=(20, len(G.TERMS)))]
    c = G.fit(rows)
    assert (c >= 0).all() and c[1] == 0


def test_a_fit_with_a_fixed_launch_cost_returns_the_free_constants():
    rng = np.random.default_rng(1)
    true = np.zeros(len(G.TERMS))
    true[G.TERMS.index("c_launch")] = G.LAUNCH_US
    true[G.TERMS.index("c_issue")] = 0.003
    true[G.TERMS.index("c_glue_bytes")] = 600.0
    rows = [(f, float(f @ true) / 1000) for f in rng.uniform(1, 1e5, size=(12, len(G.TERMS)))]
    c = G.fit_model(rows)
    assert np.allclose(c, true, rtol=1e-9), c  # the other five terms stay 0, the launch stays fixed


def test_fla_launches_count_programs_and_iterations_by_layout():
    """An fla launch at T = 4096 (16 rows of 65,536 tokens, 64 chunks): a serial kernel has a program per
    (row, head, K block, V block) walking every chunk; a per-chunk kernel a program per (chunk, V or K block,
    row, head) looping over the other feature's blocks (or once, when its loop is the exit pad)."""
    kern = {"registers": 128, "shared_triton": 96 * 1024, "loop": _mix(500, 2, 1000), "all": _mix(700, 3, 3000)}
    var = {"config": {"BK": 64, "BV": 32, "num_warps": 4, "num_stages": 2}, "kernel": kern}
    s = G.fla_cost("fla_fwd_h", var, 4096)
    assert (s.programs, s.iterations) == (2 * 4 * 16 * 16, 64)
    assert s.occupancy == 2  # 228 KiB / 96 KiB of shared memory binds before 128 regs x 128 threads (4)
    assert s.once_bytes == 2000 and s.instructions == 500
    o = G.fla_cost("fla_fwd_o", var, 4096)
    assert (o.programs, o.iterations) == (4 * 64 * 16 * 16, 2)
    pad = {**kern, "loop": _mix(1, 0, 0)}
    d = G.fla_cost("fla_bwd_dqkwg", {**var, "kernel": pad}, 4096)
    assert (d.programs, d.iterations, d.instructions) == (2 * 64 * 16 * 16, 1, 700)


def test_the_committed_model_table_is_the_committed_data():
    if not os.path.exists(G.DATA):
        pytest.fail(f"{G.DATA} is missing: python -m idattn.aot.sass collect")
    c, rows = G.evaluate(G.load())
    table = G.format_table(c, rows)
    doc = open(os.path.join(REPO, "docs", "kernels-results.md")).read()
    assert table in doc, "docs/kernels-results.md's model table is stale: paste `python -m idattn.bench gpu`'s table"
    assert all(r["predicted"] is not None for r in rows), "a measured row has no collected kernel data"
    now = G.format_now(c, G.load())
    assert now and now in doc, "docs/kernels-results.md's current-kernels table is stale (python -m idattn.bench gpu)"
    fla = G.format_fla(c, G.load(G.FLA_DATA))
    assert fla in doc, "docs/kernels-results.md's fla table is stale: paste `python -m idattn.bench gpu`'s fla table"


@pytest.mark.slow  # the operator's fwd+bwd in Pallas' interpreter, each launch alone (~1.5 min here)
def test_per_kernel_times_record_every_launch_of_the_operator():
    """scripts/gpu_check.py's (b2) on this host: every pallas_call of a forward + backward is recorded while the
    operator is traced and then runs alone (interpret mode: the times mean nothing; the launches and grids do)."""
    import jax.numpy as jnp

    from idattn.bench import per_kernel as PK
    rows = PK.per_kernel_times((2, 32, 16), 128, 256, "fwdbwd", jnp.float32, chunk=16, repeats=1, interpret=True)
    names = [r["name"] for r in rows]
    # no c: no bwd_mix; fwd_mix forms fwd_o's per-token factors (op.GPU_FUSED_FACTORS)
    assert sorted(names) == sorted(["idattn_fwd_p", "idattn_fwd_mix", "idattn_fwd_o", "idattn_scan_rev_v",
                                    "idattn_bwd_o", "idattn_scan_rev_k", "idattn_bwd_p"]), names
    assert all(r["ms"] is not None and r["ms"] > 0 for r in rows), rows
    assert all(r["grid"][:2] == (2, 2) for r in rows)  # (B, H, ...)
    text = PK.format_rows((2, 32, 16), 128, 256, "fwdbwd", rows, total_ms=1e6)
    assert "7 launches" in text and "XLA around the kernels" in text
    # only=: the other launches are neither compiled nor listed ((b2)'s scans at another plan)
    scans = PK.per_kernel_times((2, 32, 16), 128, 256, "fwdbwd", jnp.float32, chunk=16, repeats=1, interpret=True,
                                only=("idattn_scan",))
    assert sorted(r["name"] for r in scans) == ["idattn_scan_rev_k", "idattn_scan_rev_v"], scans
    assert all(r["ms"] is not None for r in scans)


def test_fla_predict_reads_the_shape_from_its_data():
    """fla_predict at the anchor shape is the fla table's fastest column, and the shape it prices is the one its
    data's `case` names (the same kernels read as 32 heads of 64 cost otherwise)."""
    c, _ = G.evaluate(G.load())
    fla = G.load(G.FLA_DATA)
    got = G.fla_predict(c, fla, 4096)
    rows = {r["mode"]: r["fastest"] for r in G.fla_predictions(c, fla) if r["T"] == 4096}
    assert got["fwd"] == pytest.approx(rows["fwd"]) and got["fwdbwd"] == pytest.approx(rows["fwdbwd"])
    other = {**fla, "case": [32, 64, 64] + list(fla["case"][3:])}
    assert G.fla_predict(c, other, 4096)["fwdbwd"] != pytest.approx(got["fwdbwd"])
