"""idattn.aot.mosaic_gpu compiles Mosaic GPU (plgpu) kernels for sm_90a on this CPU host and reads their SASS (slow:
a wgmma product of known size must read as exactly its MACs on HGMMA, at two sizes, so the count comes from the
compile, not from a constant; the scan probe against Triton's count and its record); the pieces that need no
compile run in the default suite (the stand-in driver, the listing's cut, the probe's math against a float64
token recurrence, the cost model on the record)."""
import ctypes
import json
import os
import shutil

import numpy as np
import pytest

from idattn.aot import mosaic_gpu, sass
from idattn.bench import gpu_model as G
from idattn.bench import mosaic_scan as MS


@pytest.mark.slow
def test_a_wgmma_product_compiles_deviceless_and_reads_as_its_macs():
    why = mosaic_gpu.missing()
    if why:
        pytest.skip(f"needs the CUDA compiler extra, cc, nm and cuobjdump: {why}")
    for n in (128, 64):
        rep = mosaic_gpu.compile_and_read("idattn.aot.mosaic_gpu:wgmma_product", {"m": 64, "k": 64, "n": n})
        [(name, k)] = rep["kernels"].items()
        assert ".target sm_90a" in rep["ptx"][name]
        assert k["threads"] == 128 and k["warps"] == 4  # one warpgroup, read from the PTX's .maxntid
        assert k["smem_dynamic"] >= 64 * 64 * 2 + 64 * n * 2 + 64 * n * 4  # a, b and the output in shared memory
        assert k["all"]["hgmma"] == 64 // 16  # 64xNx16 per instruction, k = 64
        assert k["all"]["mma_macs"] == 64 * 64 * n
        assert 0 < k["registers"] <= 255 and k["local"] == 0 and k["all"]["local (spill)"] == 0
        assert any("sm_90a" in ln for ln in k["ptxas"])  # the plugin's own assembler ran for the named target


def test_a_host_without_a_c_compiler_is_told_what_to_install(monkeypatch):
    which = shutil.which
    monkeypatch.setattr(mosaic_gpu.gpu, "cuda_plugin_missing", lambda: None)
    monkeypatch.setattr(mosaic_gpu.gpu, "nvcc_wheel_dir", lambda: "/nonexistent/cuda_nvcc")
    monkeypatch.setattr(mosaic_gpu.shutil, "which", lambda name: None if name == "cc" else which(name))
    with pytest.raises(RuntimeError, match="`cc` not found.*install gcc"):
        mosaic_gpu.compile_and_read("idattn.aot.mosaic_gpu:wgmma_product")


def test_the_scan_probes_chunk_step_is_the_token_recurrence():
    """idattn.bench.mosaic_scan's math in XLA (its tables, one step per chunk: X <- lam^L X + Peᵀ Z; the dry run's
    stand-in for the kernel) against the float64 token-by-token recurrence the kernel is judged by on a device
    (three chunks of 64, so the decay is crossed), and the check's own verdict line on it."""
    B, T, H, N, M, L = 2, 192, 3, 8, 64, 64
    z, lam, b = MS._inputs(B, T, H, N, M, seed=3)
    pe_t, lam_l = MS.tables(lam, b, L, dtype=np.float32)
    xs, x_end = MS.xla_scan(z, pe_t, lam_l, L=L)
    ref_xs, ref_end = MS.reference(np.asarray(z, np.float64), lam, b, L)
    xs = np.asarray(xs, np.float64)
    assert MS._rel(xs[:, :, :, 0] + 1j * xs[:, :, :, 1], ref_xs) < 1e-5  # float32 tables and accumulation
    assert MS._rel(np.asarray(x_end[:, :, 0]) + 1j * np.asarray(x_end[:, :, 1]), ref_end) < 1e-5
    assert MS._rel(ref_xs[:, :, 1], ref_xs[:, :, 2]) > 0.1  # the chunks' states differ: not a constant
    line = MS.check_and_time(H=2, N=64, T=128, tokens=128, repeats=1, scan=MS.xla_scan)
    assert "PASS" in line and "xla_scan (in place of the probe)" in line, line


@pytest.mark.slow
def test_the_mosaic_scan_probe_compiles_to_the_triton_scans_instruction_count():
    """The probe's chunk loop, compiled for sm_90a: two planes of [64, 64] x [64, 64] products on wgmma (8 HGMMA,
    2*M*L*N MACs), no spills, and as many instructions per chunk and warp as Triton's scan_fwd_k at (32, 64, 64)
    (idattn/bench/gpu_kernels.json, 343): the decay, conversion and stores of the state set the count, not the
    backend (docs/kernels-results.md, "A Mosaic GPU scan, compiled")."""
    why = mosaic_gpu.missing()
    if why:
        pytest.skip(f"needs the CUDA compiler extra, cc, nm and cuobjdump: {why}")
    rep = mosaic_gpu.compile_and_read("idattn.bench.mosaic_scan:factory")
    [(name, k)] = rep["kernels"].items()
    loop = k["loop"]
    assert loop["hgmma"] == 8 and loop["mma_macs"] == 2 * 64 * 64 * 64
    assert loop["ffma"] >= 64  # the complex decay, 32 state elements per plane and thread
    assert k["local"] == 0 and loop["local (spill)"] == 0 and 0 < k["registers"] <= 255
    path = os.path.join(os.path.dirname(mosaic_gpu.__file__), "..", "bench", "gpu_kernels.json")
    triton = json.load(open(path))["now_32_64_64_T4096_L64_fwd"]["kernels"]["idattn_scan_fwd_k"]["loop"]["total"]
    assert 0.85 * triton <= loop["total"] <= 1.15 * triton, (loop["total"], triton)
    # the record the cost model prices (idattn/bench/mosaic_scan_kernel.json) is this compile
    [recorded] = json.load(open(MS.KERNEL_DATA))["kernels"].values()
    assert recorded["loop"]["total"] == loop["total"] and recorded["registers"] == k["registers"]


def test_the_cost_model_prices_the_probe_as_tritons_scan():
    """Equal programs, warps and instructions per chunk: the model, which prices issued instructions, cannot tell
    the probe from Triton's scan_fwd_k (what the device's (b3) row tests); and its price moves with the count."""
    p = MS.predicted_us()
    assert p["probe"] > 0 and abs(p["probe"] / p["triton"] - 1) < 0.10, p
    # three programs per SM for both: Triton's by its 168 registers, the probe's by its 66 KB of shared memory
    assert p["probe_per_sm"] == p["triton_per_sm"] == 3, p
    [kernel] = json.load(open(MS.KERNEL_DATA))["kernels"].values()
    c, _ = G.evaluate(G.load())
    base = G.launch_cost("probe", kernel, programs=512, iterations=64).features() @ c
    doubled = dict(kernel, loop=dict(kernel["loop"], total=2 * kernel["loop"]["total"]))
    assert G.launch_cost("probe", doubled, programs=512, iterations=64).features() @ c > 1.8 * base


def test_the_listing_is_read_up_to_its_last_exit():
    """Mosaic GPU puts a barrier wait's slow path after the kernel's EXIT and branches back into the body: without
    the cut that branch reads as a loop around everything (here 0x00-0x80 instead of the chunk loop 0x20-0x40)."""
    listing = "\n".join(f"        /*{a:04x}*/                   {op} ;" for a, op in [
        (0x00, "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R2"), (0x10, "@!P1 BRA 0x60"),
        (0x20, "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24"), (0x30, "FFMA R1, R2, R3, R1"),
        (0x40, "@P0 BRA 0x20"), (0x50, "EXIT"), (0x60, "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R2"),
        (0x70, "@!P1 BRA 0x60"), (0x80, "BRA 0x00")])
    [(name, instrs)] = sass.parse_sass("\t\tFunction : k\n" + listing).items()
    assert sass.loops(instrs)[0] == (0, 8)  # the stub's branch back
    cut = mosaic_gpu.inline_part(instrs)
    assert [i.op for i in cut][-1] == "EXIT" and sass.loops(cut) == [(2, 4)]
    assert sass.kernel_report(name, cut, 4)["loop"]["hgmma"] == 1


def test_the_stand_in_driver_keeps_the_cubin_and_the_shared_memory(tmp_path):
    """The stand-in libcuda: compute capability 9.0; cuModuleLoadData writes the ELF it is handed, exactly its
    length (the image handed over is followed by other bytes here), to $IDATTN_STAND_IN_CUBIN; the dynamic
    shared memory set on a function goes to $IDATTN_STAND_IN_SMEM."""
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler (cc)")
    lib = ctypes.CDLL(os.path.join(mosaic_gpu.build_fake_libcuda(str(tmp_path)), "libcuda.so.1"))
    v = ctypes.c_int()
    assert lib.cuDeviceGetAttribute(ctypes.byref(v), 75, 0) == 0 and v.value == 9
    elf = open(os.path.join(tmp_path, "libcuda.so.1"), "rb").read()  # an ELF64 of known length
    image = ctypes.create_string_buffer(elf + b"\xff" * 4096)
    os.environ["IDATTN_STAND_IN_CUBIN"] = str(tmp_path / "kept.cubin")
    os.environ["IDATTN_STAND_IN_SMEM"] = str(tmp_path / "smem.txt")
    try:
        handle = ctypes.c_void_p()
        assert lib.cuModuleLoadData(ctypes.byref(handle), image) == 0
        assert lib.cuFuncSetAttribute(handle, 8, 66592) == 0 and lib.cuFuncSetAttribute(handle, 7, 1) == 0
    finally:
        del os.environ["IDATTN_STAND_IN_CUBIN"], os.environ["IDATTN_STAND_IN_SMEM"]
    assert open(tmp_path / "kept.cubin", "rb").read() == elf
    assert open(tmp_path / "smem.txt").read().strip() == "66592"  # attribute 8 only
