"""Mosaic GPU kernels compiled for sm_90a on a host without a GPU, and read like the Triton ones.

    python -m idattn.aot.mosaic_gpu MODULE:FACTORY [--kwargs JSON] [--keep DIR] [--json PATH]

``FACTORY(**kwargs)`` returns ``(fn, args)``: a function that calls one or more Mosaic GPU (``plgpu``) kernels and
its arguments as ``jax.ShapeDtypeStruct``. Prints each kernel's registers, spills and the instruction mix of its
loops (``idattn.aot.sass``'s reader); ``compile_and_read`` returns the same as a dict.

Why this needs more than the Triton path. A Triton kernel becomes a cubin inside XLA's compile, which runs on a
CPU host for a named GPU (``idattn.aot.gpu``). A Mosaic GPU kernel does not: the compiled HLO only carries the
kernel as MLIR (the ``mosaic_gpu_v2`` custom call's ``module``), and the CUDA plugin turns it into PTX and a cubin
when the executable is loaded on a device (``MosaicGpuCompile``). That function asks the driver for the current
device's compute capability, runs Mosaic's passes and LLVM's NVPTX backend, writes the PTX (with
``MOSAIC_GPU_DUMP_PTX`` set) and then links its host code, which needs the runtime. So, in a fresh process:

1. lower ``fn`` for an H200 deviceless (a mesh of the target's abstract devices) and take each kernel's module
   bytes from the StableHLO;
2. with a stand-in ``libcuda.so.1`` first on the library path (built here from the C source below with the
   host's C compiler: ``cuCtxGetDevice`` and ``cuDeviceGetAttribute`` report one compute capability 9.0 device,
   nothing runs), call the plugin's ``MosaicGpuCompile`` on those bytes; the plugin registers LLVM's NVPTX
   target only when a GPU client starts, so its four ``LLVMInitializeNVPTX*`` functions (local symbols, found
   with ``nm``) are called first. It writes the PTX, assembles it, loads the cubin and fails at the host-code
   step, as expected without a GPU;
3. the cubin it then hands the driver to load is the one a device would run: the stand-in writes it to a file
   and ``cuobjdump`` reads it. (The plugin assembles with its own PTX compiler, of a newer PTX ISA than the nvcc
   wheel's ptxas reads, so the PTX is kept for reading only.)

Step 2 leans on the plugin's internals (checked with jax 0.10.2's CUDA 12 plugin); where they differ, the error
says which step failed. The semantics of a Mosaic GPU kernel are checked elsewhere (interpret mode); this reads
what the hardware would run, for the cost model (``idattn.bench.gpu_model``).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from idattn import atomic
from idattn.aot import gpu, sass

# A stand-in for the CUDA driver: one device of compute capability 9.0 (H100 / H200), every call succeeds.
# Only what MosaicGpuCompile asks before it writes the PTX is answered with meaning.
FAKE_LIBCUDA_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 12090; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = 0; return 0; }
CUresult cuCtxGetDevice(int *d) { *d = 0; return 0; }
CUresult cuDeviceGetName(char *name, int len, int d) { strncpy(name, "sm_90 stand-in", len); return 0; }
CUresult cuDeviceGetAttribute(int *v, int attribute, int d) {
  switch (attribute) {
    case 75: *v = 9; break;    /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
    case 76: *v = 0; break;    /* ..._MINOR */
    case 16: *v = 132; break;  /* multiprocessors */
    default: *v = 1;
  }
  return 0;
}
/* The cubin MosaicGpuCompile loads is the one a device would run: written to $IDATTN_STAND_IN_CUBIN (an ELF's
   length is the furthest of its headers and sections), and the load "succeeds", so that the compile ends at the
   host-code step with an error, not an abort. */
static int handle;
static void keep(const void *image) {
  const char *out = getenv("IDATTN_STAND_IN_CUBIN");
  const unsigned char *e = image;
  if (!out || e[0] != 0x7f || e[1] != 'E' || e[2] != 'L' || e[3] != 'F' || e[4] != 2) return;
  uint64_t phoff = *(const uint64_t *)(e + 0x20), shoff = *(const uint64_t *)(e + 0x28);
  uint16_t phsz = *(const uint16_t *)(e + 0x36), phn = *(const uint16_t *)(e + 0x38);
  uint16_t shsz = *(const uint16_t *)(e + 0x3A), shn = *(const uint16_t *)(e + 0x3C);
  uint64_t end = shoff + (uint64_t)shsz * shn;
  if (phoff + (uint64_t)phsz * phn > end) end = phoff + (uint64_t)phsz * phn;
  for (int i = 0; i < shn; i++) {
    const unsigned char *h = e + shoff + (uint64_t)i * shsz;
    uint32_t type = *(const uint32_t *)(h + 4);
    uint64_t off = *(const uint64_t *)(h + 0x18), size = *(const uint64_t *)(h + 0x20);
    if (type != 8 && off + size > end) end = off + size;  /* 8: SHT_NOBITS */
  }
  FILE *f = fopen(out, "wb");
  if (f) { fwrite(e, 1, end, f); fclose(f); }
}
CUresult cuModuleLoadData(void **m, const void *image) { keep(image); *m = &handle; return 0; }
CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned n, void *o, void **v) {
  keep(image); *m = &handle; return 0;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { *f = &handle; return 0; }
CUresult cuModuleUnload(void *m) { return 0; }
/* the kernel's dynamic shared memory, as the plugin sets it (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES),
   written to $IDATTN_STAND_IN_SMEM */
CUresult cuFuncSetAttribute(void *f, int attribute, int value) {
  const char *out = getenv("IDATTN_STAND_IN_SMEM");
  FILE *fh;
  if (out && attribute == 8 && (fh = fopen(out, "w"))) { fprintf(fh, "%d\n", value); fclose(fh); }
  return 0;
}
CUresult cuFuncGetAttribute(int *v, int attribute, void *f) { *v = 0; return 0; }
CUresult cuGetErrorString(int e, const char **s) { *s = "libcuda stand-in (idattn.aot.mosaic_gpu)"; return 0; }
CUresult cuGetErrorName(int e, const char **s) { *s = "CUDA_ERROR_STAND_IN"; return 0; }
"""

_NVPTX_INIT = ("LLVMInitializeNVPTXTargetInfo", "LLVMInitializeNVPTXTarget", "LLVMInitializeNVPTXTargetMC",
               "LLVMInitializeNVPTXAsmPrinter")


def missing() -> str | None:
    """Why this host cannot compile Mosaic GPU kernels deviceless (None when it can)."""
    if gpu.cuda_plugin_missing():
        return gpu.cuda_plugin_missing()
    if gpu.nvcc_wheel_dir() is None:
        return "the nvcc wheel (ptxas) is missing: pip install -e '.[cuda12]'"
    for tool in ("cc", "nm"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found: the stand-in libcuda is built with the host's C compiler and `nm` " \
                   f"locates the plugin's NVPTX initialisers (install gcc and binutils)"
    if sass.find_tool("cuobjdump") is None:
        return "cuobjdump not found: pip install triton (its wheel carries it), or set IDATTN_CUOBJDUMP"
    return None


def build_fake_libcuda(folder: str) -> str:
    """Compiles FAKE_LIBCUDA_C into `folder`/libcuda.so.1 and returns the folder."""
    src = os.path.join(folder, "libcuda_stand_in.c")
    with open(src, "w") as f:
        f.write(FAKE_LIBCUDA_C)
    p = subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", os.path.join(folder, "libcuda.so.1"), src],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"building the stand-in libcuda failed: {p.stderr.strip()[-500:]}")
    return folder


_WORKER = r"""
import ctypes, importlib, json, os, subprocess, sys
sys.path.insert(0, {root!r})
import jax
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec as P
from idattn.aot import gpu

module_name, factory_name = {factory!r}.split(":")
fn, args = getattr(importlib.import_module(module_name), factory_name)(**{kwargs!r})
topo = topologies.get_topology_desc(platform="cuda", target_config=gpu.target_config({card!r}), topology="1x1x1")
s = NamedSharding(topologies.make_mesh(topo, (1,), ("x",)), P())
args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a in args]
ir = jax.jit(fn).lower(*args).compiler_ir()

def walk(op):
    for region in op.regions:
        for block in region.blocks:
            for o in block.operations:
                yield o
                yield from walk(o.operation)

modules = []
with ir.context:
    for o in walk(ir.operation):
        if o.operation.name == "stablehlo.custom_call" and \
                o.operation.attributes["call_target_name"].value == "mosaic_gpu_v2":
            modules.append(o.operation.attributes["mhlo.backend_config"]["module"].value_bytes)
print("@@MODULES", len(modules), flush=True)
if not modules:
    sys.exit("no Mosaic GPU kernel in the lowered function (is it a plgpu kernel?)")

import jax_plugins.xla_cuda12 as plugin
path = plugin._get_library_path()
lib = ctypes.CDLL(path)
compile_fn = lib.MosaicGpuCompile
compile_fn.argtypes = [ctypes.c_char_p, ctypes.c_int]
compile_fn.restype = ctypes.c_void_p
symbols = {{}}
for line in subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout.splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[2] in {nvptx_init!r} + ("MosaicGpuCompile",):
        symbols[parts[2]] = int(parts[0], 16)
lost = [n for n in {nvptx_init!r} + ("MosaicGpuCompile",) if n not in symbols]
if lost:
    sys.exit(f"the CUDA plugin has no symbol {{lost}}: this jax's plugin is not the one this reader knows")
base = ctypes.cast(compile_fn, ctypes.c_void_p).value - symbols["MosaicGpuCompile"]
for name in {nvptx_init!r}:
    ctypes.CFUNCTYPE(None)(base + symbols[name])()
os.environ.update(MOSAIC_GPU_CUDA_ROOT={cuda_root!r}, MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_PTXAS="1")
import glob, shutil
for i, asm in enumerate(modules):
    os.environ["MOSAIC_GPU_DUMP_TO"] = os.path.join({dump!r}, str(i))
    os.makedirs(os.environ["MOSAIC_GPU_DUMP_TO"], exist_ok=True)
    os.environ["IDATTN_STAND_IN_CUBIN"] = os.path.join(os.environ["MOSAIC_GPU_DUMP_TO"], "loaded.cubin")
    os.environ["IDATTN_STAND_IN_SMEM"] = os.path.join(os.environ["MOSAIC_GPU_DUMP_TO"], "smem.txt")
    # the plugin assembles in a folder of its own under /tmp (fixed there) and never removes it
    before = set(glob.glob("/tmp/mosaic-gpu-*"))
    try:
        compile_fn(asm, len(asm))  # fails after loading the cubin: the host code needs the runtime
    finally:
        for leftover in set(glob.glob("/tmp/mosaic-gpu-*")) - before:
            shutil.rmtree(leftover, ignore_errors=True)
"""


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def inline_part(instrs: list) -> list:
    """The listing up to its last EXIT. Mosaic GPU places the slow path of every barrier wait (try_wait, sleep,
    branch back into the body) after the kernel's end; those backward branches would read as loops enclosing
    the whole body, and they run only while a wait spins."""
    ends = [i for i, ins in enumerate(instrs) if ins.op == "EXIT"]
    return instrs[:ends[-1] + 1] if ends else instrs


def compile_and_read(factory: str, kwargs: dict | None = None, *, card: str = "h200", timeout: int = 600,
                     keep: str | None = None) -> dict:
    """Compiles the Mosaic GPU kernels of ``factory(**kwargs)`` (see the module docstring) for sm_90a and returns
    {"kernels": {entry name: sass.kernel_report + "ptxas" (the assembler's report)}, "ptx": {entry name: PTX}};
    with ``keep``, the PTX, cubins and SASS listings are copied into that folder."""
    why = missing()
    if why:
        raise RuntimeError(f"cannot compile Mosaic GPU kernels on this host: {why}")
    work = tempfile.mkdtemp(prefix="idattn-mgpu-")
    try:
        os.makedirs(os.path.join(work, "libcuda"))
        fake = build_fake_libcuda(os.path.join(work, "libcuda"))
        dump = os.path.join(work, "dump")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        script = _WORKER.format(root=root, factory=factory, kwargs=dict(kwargs or {}), card=card, dump=dump,
                                nvptx_init=_NVPTX_INIT, cuda_root=gpu.nvcc_wheel_dir())
        env = dict(os.environ, JAX_PLATFORMS="cpu",
                   LD_LIBRARY_PATH=os.pathsep.join(filter(None, [fake, os.environ.get("LD_LIBRARY_PATH")])))
        p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                           timeout=timeout)
        expected = next((int(ln.split()[1]) for ln in p.stdout.splitlines() if ln.startswith("@@MODULES")), 0)
        cubins = sorted(glob.glob(os.path.join(dump, "*", "loaded.cubin")), key=lambda c: int(c.split(os.sep)[-2]))
        if not cubins or len(cubins) != expected:  # the process ends in an error after the load: its exit status
            # says nothing, the cubins do
            raise RuntimeError(f"Mosaic GPU compile of {factory}: {len(cubins)} of {expected} kernel(s) reached the "
                               f"cubin (exit {p.returncode}):\n{(p.stderr or p.stdout)[-3000:]}")
        cuobjdump = sass.find_tool("cuobjdump")
        kernels, ptx = {}, {}
        for cubin in cubins:
            folder = os.path.dirname(cubin)
            body = "".join(_read(f) for f in sorted(glob.glob(os.path.join(folder, "*.ptx"))))
            log = "".join(_read(f) for f in sorted(glob.glob(os.path.join(folder, "*.ptxas"))))
            listing = []
            functions, res = sass.read_cubin(cubin, cuobjdump, listing)
            text = listing[0]
            threads = {m.group(1): int(m.group(2)) for m in re.finditer(
                r"\.entry\s+(\w+)\([^)]*\)\s*\.maxntid\s+(\d+)", body, re.S)}
            if keep:
                os.makedirs(keep, exist_ok=True)
                tag = os.path.basename(folder)
                shutil.copy(cubin, os.path.join(keep, f"{tag}.cubin"))
                for ext, content in (("sass", text), ("ptx", body)):
                    with open(os.path.join(keep, f"{tag}.{ext}"), "w") as f:
                        f.write(content)
            if not functions:
                raise RuntimeError(f"cuobjdump read no function from {cubin}")
            for name, instrs in functions.items():
                if name not in threads:
                    raise RuntimeError(f"{name}: no .maxntid in its PTX, so its warps are unknown")
                rep = sass.kernel_report(name, inline_part(instrs), max(1, threads[name] // 32), res.get(name))
                rep["threads"] = threads[name]
                smem = os.path.join(folder, "smem.txt")  # the dynamic shared memory the plugin asked for
                rep["smem_dynamic"] = int(_read(smem)) if os.path.exists(smem) else 0
                rep["ptxas"] = [ln.strip() for ln in log.splitlines() if ln.strip()]
                # kernels of one function are named alike (the body's name): the later ones get their index
                key = name if name not in kernels else f"{name}#{os.path.basename(folder)}"
                kernels[key] = rep
                ptx[key] = body
        return {"factory": factory, "kwargs": dict(kwargs or {}), "card": card, "kernels": kernels, "ptx": ptx}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def wgmma_product(m: int = 64, k: int = 64, n: int = 128):
    """A factory for the reader's own check: one [m, k] x [k, n] bf16 product on the tensor cores (wgmma, fp32
    accumulator), operands in shared memory. Compiled, it must read as m*n*k MACs of HGMMA."""
    # here, not at the top: plgpu's API moves between jax releases, and the reader itself does not need it
    from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

    def kernel(a_ref, b_ref, o_ref):
        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_ref, b_ref)
            plgpu.wgmma_wait(0)
            return acc_ref[...]
        o_ref[...] = pl.run_scoped(scope, plgpu.ACC((m, n), jnp.float32))

    swizzled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # the layout wgmma reads

    def product(a, b):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
                              in_specs=[plgpu.BlockSpec(memory_space=plgpu.SMEM, transforms=swizzled)] * 2,
                              out_specs=plgpu.BlockSpec(memory_space=plgpu.SMEM),
                              compiler_params=plgpu.CompilerParams())(a, b)
    return product, [jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16)]


def format_report(rep: dict) -> str:
    cols = ["mma", "hgmma", "ffma", "fmul/fadd", "mufu", "cvt/pack", "ldg", "stg", "lds", "sts", "local (spill)",
            "barrier", "int/addr", "other", "total"]
    lines = [f"{rep['factory']} {rep['kwargs']}: {len(rep['kernels'])} Mosaic GPU kernel(s), sm_90a",
             "| kernel | warps | registers | spill (stack B) | where | " + " | ".join(cols) + " | MMA MACs |",
             "|" + "---|" * (len(cols) + 6)]
    for name, k in sorted(rep["kernels"].items()):
        for where in ("loop", "all"):
            mx = k[where]
            if mx is None:
                continue
            lines.append(f"| {name} | {k['warps']} | {k.get('registers', '?')} | {k.get('stack', '?')} | "
                         f"{'first loop' if where == 'loop' else 'whole kernel'} | "
                         + " | ".join(str(mx.get(col, 0)) for col in cols) + f" | {mx['mma_macs']:,} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m idattn.aot.mosaic_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("factory", help="MODULE:FUNCTION returning (fn, args)")
    ap.add_argument("--kwargs", default="{}", help="JSON keyword arguments for the factory")
    ap.add_argument("--card", default="h200", choices=("h100", "h200"))
    ap.add_argument("--keep", default=None, help="a folder for the PTX, cubins and SASS listings")
    ap.add_argument("--json", default=None, help="write the report (without the PTX) there, with the commit")
    a = ap.parse_args(argv)
    rep = compile_and_read(a.factory, json.loads(a.kwargs), card=a.card, keep=a.keep)
    print(format_report(rep))
    if a.json:
        record = {k: v for k, v in rep.items() if k != "ptx"}
        module = a.factory.split(":")[0].replace(".", "/") + ".py"  # its source marks the record dirty too
        record["commit"] = sass.commit_stamp(("idattn/ops/pallas", module))
        atomic.write_json(a.json, record, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
