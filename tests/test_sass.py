"""idattn.aot.sass reads what the GPU will run from `cuobjdump -sass`: a hand-written listing in cuobjdump's format
(two functions, a loop, tensor-core and barrier instructions) is counted by hand here, and (slow) the fused
kernels compiled for an H200 on this CPU host are read end to end."""
import os

import pytest

from idattn.aot import sass

LISTING = """
	code for sm_90a
		Function : idattn_toy
	.headerflags	@"EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                                  /* 0x00000a00ff017b82 */
                                                                                           /* 0x000e620000000800 */
        /*0010*/                   S2R R11, SR_TID.X ;                                     /* 0x00000000000b7919 */
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;                        /* 0x0000000402047981 */
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;                           /* 0x0000000000007b1d */
        /*0040*/                   HGMMA.64x16x16.F32.BF16 R32, gdesc[UR12].tnspB, RZ ;    /* 0x402000000c2079f0 */
        /*0050*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;                  /* 0x000000100c08723c */
        /*0060*/                   FFMA R3, R4, R5, R3 ;                                   /* 0x0000000504037223 */
        /*0070*/                   FMUL R6, R6, 0.5 ;                                      /* 0x3f00000006067820 */
        /*0080*/                   MUFU.EX2 R7, R7 ;                                       /* 0x0000000700077308 */
        /*0090*/                   STS.128 [R0], R8 ;                                      /* 0x0000000800007388 */
        /*00a0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;                           /* 0x0000000000007b1d */
        /*00b0*/                   LDS.128 R8, [R0] ;                                      /* 0x0000000000087984 */
        /*00c0*/               @P0 BRA 0x40 ;                                              /* 0xfffffffc00a80947 */
        /*00d0*/                   STG.E desc[UR4][R2.64], R8 ;                            /* 0x0000000802007986 */
        /*00e0*/                   EXIT ;                                                  /* 0x000000000000794d */
        /*00f0*/                   BRA 0xf0;                                               /* 0xfffffffc00fc7947 */
		..........
		Function : other_kernel
        /*0000*/                   FADD R1, R1, R2 ;                                       /* 0x0000000201017221 */
        /*0010*/                   EXIT ;                                                  /* 0x000000000000794d */
"""

RES = """
Resource usage:
 Common:
  GLOBAL:24 CONSTANT[4]:8
 Function idattn_toy:
  REG:236 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:600 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_a_listing_is_counted_as_by_hand():
    fns = sass.parse_sass(LISTING)
    assert sorted(fns) == ["idattn_toy", "other_kernel"] and len(fns["idattn_toy"]) == 16
    ins = fns["idattn_toy"]
    assert sass.loops(ins) == [(4, 12), (15, 15)]  # the chunk loop 0x40..0xc0, then the trailing self-branch
    rep = sass.kernel_report("idattn_toy", ins, warps=8, resources=sass.parse_res_usage(RES)["idattn_toy"])
    loop = rep["loop"]
    assert loop["total"] == 9 and loop["mma"] == 2 and loop["hgmma"] == 1 and loop["ffma"] == 1
    assert loop["fmul/fadd"] == 1 and loop["mufu"] == 1 and loop["sts"] == 1 and loop["lds"] == 1
    assert loop["bar_sync"] == 1 and loop["ldg"] == 0  # the load before the loop is not in it
    # 8 warps each issue the HMMA (16x8x16), 2 warpgroups the HGMMA (64x16x16)
    assert loop["mma_macs"] == 8 * 16 * 8 * 16 + 2 * 64 * 16 * 16
    assert rep["all"]["ldg"] == 1 and rep["all"]["stg"] == 1 and rep["all"]["bar_sync"] == 2
    assert rep["registers"] == 236 and rep["smem_static"] == 1024


def _line(addr, text):
    return f"        /*{addr:04x}*/                   {text} ;   /* 0x0 */"


# a chunk loop 0x10..0xa0 holding a sub-block loop (0x20..0x40, 3 instructions) and a mode-block loop
# (0x50..0x90, 5 instructions) that holds another sub-block loop (0x60..0x70, 2 instructions)
NESTED = "\n".join(["\t\tFunction : idattn_nested"] + [_line(a, t) for a, t in [
    (0x00, "LDC R1, c[0x0][0x28]"), (0x10, "FADD R1, R1, R2"), (0x20, "FMUL R2, R2, R3"),
    (0x30, "FFMA R3, R3, R4, R5"), (0x40, "@P0 BRA 0x20"), (0x50, "LDS R6, [R0]"), (0x60, "FADD R7, R7, R6"),
    (0x70, "@P1 BRA 0x60"), (0x80, "STS [R0], R7"), (0x90, "@P2 BRA 0x50"), (0xa0, "@P3 BRA 0x10"),
    (0xb0, "EXIT"), (0xc0, "BRA 0xc0")]])


def test_inner_loops_are_counted_as_they_run():
    """The backward kernels loop over feature sub-blocks (and mode blocks) inside their chunk loop: one chunk
    iteration as it runs holds each inner body as often as it runs, which the static body does not."""
    ins = sass.parse_sass(NESTED)["idattn_nested"]
    rep = sass.kernel_report("idattn_nested", ins, warps=4, trips={"sub": 4, "mode": 2})
    assert rep["loop"]["total"] == 10  # 0x10..0xa0, each inner body once
    assert [(lo["total"], lo["holds_loop"]) for lo in rep["inner_loops"]] == [(5, True), (3, False), (2, False)]
    # outer 10 + the first sub loop 3 more times (3 x 3) + the mode loop once more (5) + the nested sub loop
    # 3 more times in each of the 2 mode iterations (2 x 3 x 2)
    assert rep["loop_run"]["total"] == 10 + 9 + 5 + 12
    # FADD 0x10 once, FMUL 0x20 in the first sub loop 4 times, FADD 0x60 in the nested one 2 x 4 times
    assert rep["loop_run"]["fmul/fadd"] == 1 + 4 + 2 * 4 and rep["loop_run"]["ffma"] == 4
    # one feature sub-block: the sub-block body is inlined, so every inner loop is a mode loop
    one_sub = sass.kernel_report("idattn_nested", ins, warps=4, trips={"sub": 1, "mode": 2})
    assert one_sub["loop_run"]["total"] == 10 + 3 + 5 + 2 * 2  # each inner loop once more, the nested one per trip
    no_trips = sass.kernel_report("idattn_nested", ins, warps=4)
    assert "loop_run" not in no_trips and no_trips["loop"] == rep["loop"]


# a chunk loop unswitched on the mode block: block 0's copy 0x10..0x70 (7 instructions, a sub-block loop 0x20..0x30
# and the stores only block 0 makes) and the other blocks' copy 0x90..0xc0 (4 instructions, a sub-block loop
# 0xa0..0xb0), then the exit pad
UNSWITCHED = "\n".join(["\t\tFunction : idattn_unswitched"] + [_line(a, t) for a, t in [
    (0x00, "@P0 BRA 0x90"), (0x10, "FADD R1, R1, R2"), (0x20, "FMUL R2, R2, R3"), (0x30, "@P1 BRA 0x20"),
    (0x40, "STG.E desc[UR4][R2.64], R8"), (0x50, "BAR.SYNC.DEFER_BLOCKING 0x0"), (0x60, "FADD R4, R4, R2"),
    (0x70, "@P2 BRA 0x10"), (0x80, "EXIT"), (0x90, "FADD R1, R1, R2"), (0xa0, "FMUL R2, R2, R3"),
    (0xb0, "@P1 BRA 0xa0"), (0xc0, "@P2 BRA 0x90"), (0xd0, "EXIT"), (0xe0, "BRA 0xe0")]])


def test_an_unswitched_chunk_loop_is_read_per_copy():
    """A backward kernel with a program per mode block forms phase 1's outputs in block 0's program only
    (gpu.PHASE1_ONCE), and ptxas versions the chunk loop on that program-uniform condition: two top-level loops.
    The report reads the largest as the chunk loop (block 0's) and, with several mode blocks, the other as
    loop_run_rest; the cost model averages the two over the blocks."""
    from idattn.bench import gpu_model as G
    ins = sass.parse_sass(UNSWITCHED)["idattn_unswitched"]
    lp = sass.loops(ins)
    assert sass.top_loops(lp) == [(1, 7), (9, 12)]
    rep = sass.kernel_report("idattn_unswitched", ins, warps=8, trips={"sub": 3, "mode": 1, "split": 2})
    assert rep["loop"]["total"] == 7 and rep["loop_run"]["total"] == 7 + 2 * 2  # block 0: the sub loop 3 times
    assert rep["loop_run"]["bar_sync"] == 1 and rep["loop_run"]["stg"] == 1
    rest = rep["loop_run_rest"]
    assert rest["total"] == 4 + 2 * 2 and rest["bar_sync"] == 0 and rest["stg"] == 0
    assert "loop_run_rest" not in sass.kernel_report("idattn_unswitched", ins, warps=8, trips={"sub": 3, "mode": 1})
    call = {"name": "idattn_bwd_o", "num_warps": 8, "num_stages": 1, "grid": [1, 1, 2]}
    model_rep = {"case": [1, 64, 64, "bfloat16", 1, 128, 64], "calls": [call], "xla": {},
                 "kernels": {"idattn_bwd_o": dict(rep, registers=128)}}
    kc, = G.kernel_costs(model_rep)
    assert kc.instructions == (11 + 8) / 2 and kc.barriers == 0.5  # two blocks: block 0's copy and the other's
    model_rep["kernels"]["idattn_bwd_o"]["trips"] = {"sub": 3, "mode": 1, "split": 4}
    model_rep["kernels"]["idattn_bwd_o"]["loop_run_rest"] = rest
    assert G.kernel_costs(model_rep)[0].instructions == (11 + 3 * 8) / 4


def test_tensor_core_shapes():
    i = sass.Instr(0, "HMMA", ".1688.F32.TF32", "")
    assert sass.macs(i) == 16 * 8 * 8
    assert sass.macs(sass.Instr(0, "HGMMA", ".64x128x16.F32.BF16", "")) == 64 * 128 * 16
    assert sass.macs(sass.Instr(0, "FFMA", "", "")) == 0


@pytest.mark.slow  # compiles the fused forward for an H200 (~1 min here)
def test_the_fused_forward_for_an_h200_reads_as_tensor_core_loops():
    from idattn.aot import gpu
    if gpu.cuda_plugin_missing() or sass.find_tool("cuobjdump") is None:
        pytest.skip(f"needs the CUDA compiler extra and cuobjdump (pip install triton): "
                    f"{gpu.cuda_plugin_missing() or 'no cuobjdump'}")
    rep = sass.compile_and_capture((16, 128, 32, "bfloat16", 16, 4096, 64), mode="fwd")
    names = {c["name"] for c in rep["calls"]}
    # T = 4096 >= op.GPU_PARALLEL_FWD_MIN_T: the chunk-parallel forward (states by the scans, then the readouts)
    assert names == {"idattn_scan_fwd_k", "idattn_fwd_p_readout", "idattn_fwd_mix", "idattn_scan_fwd_v",
                     "idattn_fwd_o_readout"} and set(rep["kernels"]) == names
    for name, k in rep["kernels"].items():
        assert k["loop"] is not None and k["loop"]["mma"] > 0, name  # a chunk loop on the tensor cores
        assert k["loop"]["local (spill)"] == 0 and k["local"] == 0, name  # bf16: no spills (as ptxas -v says)
        assert 0 < k["registers"] <= 255
    # the scans' complex decay and the readouts' complex products as fused multiply-adds (C.dot2 as inline PTX:
    # ptxas never fuses the separate mul / add that Pallas's Triton lowering emits)
    for name in ("idattn_scan_fwd_k", "idattn_fwd_p_readout", "idattn_fwd_mix"):
        assert rep["kernels"][name]["loop"]["ffma"] >= 32, name
    # per chunk, at least the P readout's G = FQ·ZKᵀ, G·Ps and FQ·Xᵀ MACs, and the scan's state update
    L, M, R = 64, 32, 128
    assert rep["kernels"]["idattn_fwd_p_readout"]["loop"]["mma_macs"] >= L * L * R + L * L * 2 * M + L * R * 2 * M
    assert rep["kernels"]["idattn_scan_fwd_k"]["loop"]["mma_macs"] >= L * R * 2 * M
    assert os.environ.get("JAX_PLATFORMS", "cpu") == "cpu"
