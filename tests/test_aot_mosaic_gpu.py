"""idattn.aot.mosaic_gpu compiles Mosaic GPU (plgpu) kernels for sm_90a on this CPU host and reads their SASS:
a wgmma product of known size must read as exactly its MACs on HGMMA, at two sizes (so the count comes from the
compile, not from a constant)."""
import shutil

import pytest

from idattn.aot import mosaic_gpu


@pytest.mark.slow
def test_a_wgmma_product_compiles_deviceless_and_reads_as_its_macs():
    why = mosaic_gpu.missing()
    if why:
        pytest.skip(f"needs the CUDA compiler extra, cc, nm and cuobjdump: {why}")
    for n in (128, 64):
        rep = mosaic_gpu.compile_and_read("idattn.aot.mosaic_gpu:wgmma_product", {"m": 64, "k": 64, "n": n})
        [(name, k)] = rep["kernels"].items()
        assert ".target sm_90a" in rep["ptx"][name]
        assert k["warps"] == 4  # one warpgroup
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
