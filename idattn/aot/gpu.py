"""NVIDIA GPU compile targets for deviceless ahead-of-time compilation on a CPU-only host.

    gpu_target("h200x8")      one host, 8 × H200 (SXM, sm_90a, 141 GB HBM3e)
    gpu_target("h100x8")      one host, 8 × H100 (SXM 80 GB, sm_90a)
    gpu_target("2xh200x8")    2 hosts × 8 × H200 = 16 devices (form  <hosts>x<card>x<per host>)

The card is described by an XLA ``GpuTargetConfigProto`` in text form (``idattn/aot/targets/<card>.txtpb``:
compute capability 9.0 with accelerated features -> sm_90a, 132 SMs, 227 KiB opt-in shared memory per block, 64K
registers per SM and per block, HBM size and bandwidth). ``jax.experimental.topologies.get_topology_desc(
platform="cuda", target_config=..., topology="1x<hosts>x<per host>")`` turns it into compile-only devices; a
``jax.jit(f).lower(...).compile()`` on a mesh of them runs XLA's GPU compiler (fusion, collectives, buffer
assignment) and Triton down to sm_90a cubins through ``ptxas``, with no GPU and no CUDA driver. What it proves and
what it cannot (no autotuning, no timing): docs/kernels.md, "Deviceless compilation".

Needs ``pip install -e ".[cuda12]"`` (jax-cuda12-plugin + jax-cuda12-pjrt at the installed jax's version, and
nvidia-cuda-nvcc-cu12 for ``ptxas`` and ``libdevice``; no cuDNN / cuBLAS / driver needed). Set
``JAX_PLATFORMS=cpu`` before jax is imported on a host without a GPU (otherwise jax tries, and fails noisily, to
open the CUDA backend).

The CUDA toolchain (``ptxas``, ``libdevice``). XLA looks for them under ``xla_gpu_cuda_data_dir`` first, then in
/usr/local/cuda and on PATH. jax fills that option from ``CUDA_ROOT`` or else the nvcc wheel; a machine's own
CUDA toolkit (here CUDA 13 under /usr/local/cuda and /usr/local/bin) is therefore used whenever ``CUDA_ROOT``
points at it or the wheel is missing, and then the cubins come from a different ptxas than the one the jax
release was built and tested with. ``compiler_options()`` pins the wheel per compilation
(``.compile(compiler_options=compiler_options())``: an XLA debug-option override that takes precedence over both
``CUDA_ROOT`` and ``XLA_FLAGS``, works whatever was imported first, and touches no global state).
XLA also probes ``nvlink`` (the wheel has none, so it finds the system's on PATH); it only runs it to link
separately compiled modules, which this compile path does not do (checked with
``TF_CPP_VMODULE=subprocess_compilation=3``: only ``nvlink --version`` runs).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

from jax.experimental import topologies

from idattn.aot.target import Target

_TARGET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets")
CARDS = {"h100": "h100.txtpb", "h200": "h200.txtpb"}
MAX_PER_HOST = 8  # NVLink domain of an HGX board
_NAME = re.compile(r"^(?:(\d+)x)?(h100|h200)(?:x(\d+))?$")
TRITON_CALL = "__gpu$xla.gpu.triton"  # custom-call target a Pallas (Triton) kernel becomes in the compiled HLO


def is_gpu_name(name: str) -> bool:
    """True for names gpu_target takes (h100 / h200 in any of the forms above, case-insensitive)."""
    return bool(_NAME.match(str(name).strip().lower()))


def parse_gpu_name(name: str):
    """'h200x8' -> (hosts 1, card 'h200', per_host 8); '2xh200x8' -> (2, 'h200', 8); 'h100' -> (1, 'h100', 1)."""
    m = _NAME.match(str(name).strip().lower())
    if not m:
        raise ValueError(f"GPU target {name!r}: expected <card>x<per host> or <hosts>x<card>x<per host> with card "
                         f"in {sorted(CARDS)}, e.g. 'h200x8' or '2xh200x8'")
    hosts = int(m.group(1) or 1)
    per_host = int(m.group(3) or 1)
    if hosts < 1 or not 1 <= per_host <= MAX_PER_HOST:
        raise ValueError(f"GPU target {name!r}: hosts must be >= 1 and devices per host in 1..{MAX_PER_HOST} "
                         f"(got {hosts} x {per_host}); e.g. 'h200x8'")
    return hosts, m.group(2), per_host


def target_config(card: str) -> str:
    """The card's GpuTargetConfigProto as text (shipped in idattn/aot/targets/)."""
    if card not in CARDS:
        raise ValueError(f"unknown GPU card {card!r}; known: {sorted(CARDS)}")
    with open(os.path.join(_TARGET_DIR, CARDS[card])) as f:
        return f.read()


def _field(text: str, key: str) -> str:
    m = re.search(rf"\b{key}:\s*\"?([^\s\"]+)", text)
    if not m:
        raise ValueError(f"target config has no {key!r} field")
    return m.group(1)


def card_facts(card: str) -> dict:
    """Numbers from the card's target config: hbm_bytes, sms, smem_optin (bytes per block), regs_per_block,
    name."""
    t = target_config(card)
    return dict(hbm_bytes=int(_field(t, "device_memory_size")), sms=int(_field(t, "core_count")),
                smem_optin=int(_field(t, "shared_memory_per_block_optin")),
                regs_per_block=int(_field(t, "registers_per_block_limit")),
                name=re.search(r'device_description_str:\s*"([^"]+)"', t).group(1))


# ----------------------------------------------------------------------------------------------------------------
# toolchain


def nvcc_wheel_dir() -> str | None:
    """Folder of the nvidia-cuda-nvcc-cu12 wheel (holds bin/ptxas and nvvm/libdevice), found without importing
    it; None when not installed."""
    spec = importlib.util.find_spec("nvidia")
    for root in (list(spec.submodule_search_locations or []) if spec else []):
        d = os.path.join(root, "cuda_nvcc")
        if os.path.isfile(os.path.join(d, "bin", "ptxas")) and os.path.isdir(os.path.join(d, "nvvm", "libdevice")):
            return d
    return None


def cuda_plugin_missing() -> str | None:
    """None when deviceless CUDA compilation can run here, else the reason (one line, with the fix)."""
    missing = [m for m in ("jax_plugins.xla_cuda12",) if importlib.util.find_spec(m) is None]
    if missing:
        return "the jax CUDA plugin (jax-cuda12-plugin / jax-cuda12-pjrt) is not installed: pip install -e '.[cuda12]'"
    if nvcc_wheel_dir() is None:
        return "ptxas / libdevice not found (nvidia-cuda-nvcc-cu12 wheel): pip install -e '.[cuda12]'"
    return None


def compiler_options() -> dict:
    """Per-compilation XLA options for GPU targets: pin ptxas / libdevice to the nvcc wheel (see the module
    docstring). Pass as ``lowered.compile(compiler_options=compiler_options())``; {} when the wheel is absent."""
    d = nvcc_wheel_dir()
    return {} if d is None else {"xla_gpu_cuda_data_dir": d}


def ptxas_version() -> str | None:
    d = nvcc_wheel_dir()
    if d is None:
        return None
    try:
        out = subprocess.run([os.path.join(d, "bin", "ptxas"), "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else None


# ----------------------------------------------------------------------------------------------------------------
# targets


def gpu_target(name: str) -> Target:
    """A compile-only GPU Target for ``name`` (see the module docstring for the forms)."""
    hosts, card, per_host = parse_gpu_name(name)
    why = cuda_plugin_missing()
    if why:
        raise RuntimeError(f"GPU target {name!r}: {why}")
    facts = card_facts(card)
    topo = topologies.get_topology_desc(platform="cuda", target_config=target_config(card),
                                        topology=f"1x{hosts}x{per_host}")
    devices = list(topo.devices)
    n = len(devices)
    if n != hosts * per_host:  # pragma: no cover - plugin topology semantics changed
        raise RuntimeError(f"GPU target {name!r}: the CUDA plugin returned {n} devices, expected {hosts * per_host}")
    desc = (f"{facts['name']} (sm_90a, {facts['sms']} SMs, {facts['hbm_bytes'] / 2**30:.0f} GiB HBM) x {n}"
            f" = {hosts} host(s) x {per_host}, deviceless (ptxas {ptxas_version() or '?'} from the nvcc wheel)")
    return Target(name=name, platform="gpu", devices=devices, hbm_bytes_per_device=facts["hbm_bytes"],
                  description=desc, num_slices=1)


# ----------------------------------------------------------------------------------------------------------------
# what the compiled kernels use: XLA logs the shared memory of every Triton kernel (xtile_compiler, vlog 2) and
# ptxas -v (registers, spills; subprocess_compilation, vlog 3). The log level is read when jaxlib loads, so this
# runs in a fresh process.


_LOG_RECORD = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+(\d+) ([\w.]+):\d+\] ?(.*)$")
_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")
_SMEM = re.compile(r"Shared memory usage: (\d+) B")


def triton_calls(hlo_text: str) -> list[dict]:
    """The Triton custom calls of a compiled HLO module: [{name, num_warps, num_stages, grid}] from their
    backend configs (the Triton IR blob is skipped; fields a jax version does not state are None)."""
    calls = []
    for line in hlo_text.splitlines():
        if TRITON_CALL not in line or "backend_config" not in line:
            continue
        cfg = re.sub(r'ir = "[^"]*"', "", line[line.index("backend_config"):])
        num = lambda k: (lambda m: int(m.group(1)) if m else None)(re.search(rf"\b{k} = (-?\d+)", cfg))  # noqa
        nm = re.search(r'\bname = "([^"]*)"', cfg)
        calls.append(dict(name=nm.group(1) if nm else None, num_warps=num("num_warps"),
                          num_stages=num("num_stages"), grid=(num("grid_x"), num("grid_y"), num("grid_z"))))
    return calls


_HLO_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+ = (.+?) ([a-z][\w\-]*)\(")
_HLO_SHAPE = re.compile(r"\b(f32|bf16|f16|c64)\[([\d,]*)\]")
# Instructions that move no bytes (or are the kernels themselves)
_FREE_OPS = {"custom-call", "parameter", "get-tuple-element", "bitcast", "tuple", "reshape"}


_HLO_COMP = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
_HLO_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")
_BITCAST_OF_FUSION = re.compile(r"\bbitcast\(%?[\w.\-]*fusion[\w.\-]*\)")


def mode_round_trips(hlo_text: str, B: int, T: int, H: int, M: int) -> list[str]:
    """XLA instructions of a compiled module (outside the kernels) that write a per-token mode tensor of the
    fused operator to memory - shape [.., B, T, H, k, M] with k = 2 (planes) or 4 (two planes of two vectors),
    or complex [B, T, H, M] - i.e. a pass of mode vectors through HBM between the kernels: the mixing, p / dp
    partial sums, or a per-token scaling (gpu.prescale_rev / prescale_fwd_o). Instructions inside a fusion's
    body are not passes (only the fusion's result is written) and are skipped. Returns the offending lines
    (opcode and shape)."""
    cplx = (B, T, H, M)
    fused = set(_HLO_CALLS.findall("\n".join(l for l in hlo_text.splitlines() if " fusion(" in l)))
    out, skip = [], False
    for line in hlo_text.splitlines():
        head = _HLO_COMP.match(line)
        if head:
            skip = head.group(1) in fused
            continue
        m = _HLO_INSTR.match(line)
        # a bitcast moves nothing, but a bitcast of a fusion's result names the shape that fusion wrote (XLA
        # writes elementwise results flat and bitcasts them to the shape the kernel reads)
        if skip or not m or (m.group(2) in _FREE_OPS
                             and not (m.group(2) == "bitcast" and _BITCAST_OF_FUSION.search(line))):
            continue
        for dt, dims in _HLO_SHAPE.findall(m.group(1)):
            d = tuple(int(x) for x in dims.split(",") if x)
            if (len(d) >= 5 and d[-5:-2] == (B, T, H) and d[-2] in (2, 4) and d[-1] == M) or (
                    dt == "c64" and d[-4:] == cplx):
                out.append(f"{m.group(2)} {dt}{list(d)}: {line.strip()[:160]}")
                break
    return out


_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "c64": 8, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1, "s64": 8,
          "f64": 8, "c128": 16}
_SHAPES = re.compile(r"\b(f32|bf16|f16|c64|c128|s32|u32|s64|f64|pred|s8|u8)\[([\d,]*)\]")


def glue_traffic(hlo_text: str) -> dict:
    """What XLA does around the Triton kernels in a compiled module's entry computation: {"glue_ops": the
    instructions that run (fusions, copies, reductions: not parameters, tuples, bitcasts or the kernels),
    "glue_bytes": the bytes they write (each output once; their reads are at least that again)}."""
    entry = hlo_text[hlo_text.find("ENTRY"):] if "ENTRY" in hlo_text else hlo_text
    ops, nbytes = 0, 0
    for line in entry.splitlines():
        m = _HLO_INSTR.match(line)
        if not m or m.group(2) in _FREE_OPS or m.group(2) in ("constant", "copy-start", "copy-done"):
            continue
        ops += 1
        for dt, dims in _SHAPES.findall(m.group(1)):
            n = 1
            for x in dims.split(","):
                n *= int(x) if x else 1
            nbytes += n * _BYTES[dt]
    return {"glue_ops": ops, "glue_bytes": nbytes}


def _records(text: str):
    """absl log records (thread id, source file, message incl. continuation lines)."""
    recs = []
    for line in text.splitlines():
        m = _LOG_RECORD.match(line)
        if m:
            recs.append([int(m.group(1)), m.group(2), m.group(3)])
        elif recs:
            recs[-1][2] += "\n" + line
    return recs


def parse_ptxas(msg: str) -> dict | None:
    """{name, arch, registers, barriers, smem_static, stack, spill_stores, spill_loads} from one ptxas -v
    report (None if it has no entry function)."""
    m = _PTXAS_ENTRY.search(msg)
    if not m:
        return None
    out = dict(name=m.group(1), arch=m.group(2), registers=None, barriers=0, smem_static=0, stack=0,
               spill_stores=0, spill_loads=0)
    m = _PTXAS_SPILL.search(msg)
    if m:
        out.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
    m = _PTXAS_USED.search(msg)
    if m:
        out.update(registers=int(m.group(1)), barriers=int(m.group(2) or 0), smem_static=int(m.group(3) or 0))
    return out


def parse_kernel_log(text: str) -> list[dict]:
    """Per Triton kernel compiled (in log order): {"smem": dynamic shared memory bytes, **parse_ptxas(...)}.
    A Triton kernel's shared-memory record and its ptxas report come from the same compile thread, in that
    order; XLA's own fusions (no shared-memory record) are left out."""
    pending, out = {}, []
    for tid, src, msg in _records(text):
        m = _SMEM.search(msg)
        if m:
            pending.setdefault(tid, []).append(int(m.group(1)))
            continue
        if src.startswith("subprocess_compilation"):
            info = parse_ptxas(msg)
            if info is None:
                continue
            if pending.get(tid):
                out.append(dict(smem=pending[tid].pop(0), **info))
            elif info["name"].startswith("idattn_"):
                # our kernels are named: keep the ptxas report even when its shared-memory record was logged on
                # another thread (its smem is then unknown, None)
                out.append(dict(smem=None, **info))
    return out


_RESOURCE_SCRIPT = r"""
import os, sys, json, time
sys.path.insert(0, {root!r})
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from jax.experimental import topologies
from idattn.aot import gpu
from idattn.ops import interdomain_mix
from idattn.ops.pallas import gpu as G
G.TUNING.update({tuning!r})
G.MAX_TILE.update({max_tile!r})
topo = topologies.get_topology_desc(platform="cuda", target_config=gpu.target_config({card!r}), topology="1x1x1")
s = NamedSharding(topologies.make_mesh(topo, (1,), ("x",)), P())
sd = lambda shp, d: jax.ShapeDtypeStruct(shp, d, sharding=s)
for (H, dh, M, dt, B, T, seg) in {cases!r}:
    dt = jnp.dtype(dt)
    def loss(fq, zk, zv, lam, b, c, sg):
        o = interdomain_mix(fq, zk, zv, lam, b, c, impl="pallas", chunk_size=64,
                            segment_ids=sg if seg else None)
        return jnp.sum(o.astype(jnp.float32))
    args = ((sd((B, T, H, dh), dt),) * 3 + (sd((H, M), jnp.complex64),) * 2 + (sd((H, M, M), jnp.complex64),)
            + (sd((B, T), jnp.int32),))
    mark = json.dumps([H, dh, M, str(dt), B, T, seg])
    sys.stderr.write("I0000 00:00:00.000000 0 case_marker.py:0] @@CASE " + mark + "\n")
    sys.stderr.flush()
    t0 = time.time()
    try:
        with jax.set_mesh(s.mesh):  # jax >= 0.12 lowers a Triton kernel only for the GPU kind of the mesh in context
            c = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5))).lower(*args).compile(
                compiler_options=gpu.compiler_options())
        txt = c.as_text()
        print("@@HLO", json.dumps(dict(calls=gpu.triton_calls(txt), error=None, s=time.time() - t0,
                                       round_trips=gpu.mode_round_trips(txt, B, T, H, max(16, 1 << (M - 1).bit_length())),
                                       bytes=c.cost_analysis().get("bytes accessed") if c.cost_analysis() else None)),
              flush=True)
    except Exception as e:
        print("@@HLO", json.dumps(dict(calls=[], error=f"{{type(e).__name__}}: {{str(e).splitlines()[0][:300]}}",
                                       s=time.time() - t0)), flush=True)
"""


def kernel_resources(cases, card="h200", timeout=900, tuning=None, max_tile=None) -> list[dict]:
    """Compile the fused operator's forward + backward (impl="pallas", chunk 64) for one ``card`` in a fresh
    process with XLA's kernel logging on, with the mode mixing c [H, M, M] as the layer has it. cases:
    [(H, d_h, M, dtype name, B, T, with segment ids)]; tuning: entries to override in
    ``idattn.ops.pallas.gpu.TUNING`` ({kind: (num_warps, num_stages)}) and ``MAX_TILE`` for this run.
    Returns per case {"case", "triton": [calls from triton_calls], "kernels": [parse_kernel_log entries],
    "error": the compile error's first line or None, "seconds": compile time, "round_trips": mode_round_trips
    of the compiled module, "hbm_bytes": XLA's cost analysis "bytes accessed" (XLA ops only)}."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="0",
               TF_CPP_VMODULE="subprocess_compilation=3,xtile_compiler=2")
    p = subprocess.run([sys.executable, "-c", _RESOURCE_SCRIPT.format(root=root, cases=list(cases), card=card,
                                                                           tuning=dict(tuning or {}),
                                                                           max_tile=dict(max_tile or {}))],
                       env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"kernel_resources: compile failed:\n{p.stderr[-3000:]}")
    hlos = [json.loads(line[6:]) for line in p.stdout.splitlines() if line.startswith("@@HLO")]
    parts = p.stderr.split("@@CASE ")[1:]
    out = []
    for part, hlo in zip(parts, hlos):
        case = json.loads(part.splitlines()[0])
        out.append(dict(case=tuple(case), triton=hlo["calls"], error=hlo["error"], seconds=hlo["s"],
                        kernels=parse_kernel_log(part), round_trips=hlo.get("round_trips", []),
                        hbm_bytes=hlo.get("bytes")))
    return out


def format_resources(res, card="h200") -> str:
    """A table of kernel_resources(...) output: per case the Triton calls (grid, warps, stages) and per compiled
    Triton kernel its dynamic shared memory, registers per thread and spill bytes (ptxas entry names
    kernel, kernel__1, ... in compile order, which need not be the HLO's order)."""
    f = card_facts(card)
    lines = [f"limits ({f['name']}): {f['smem_optin']} B = {f['smem_optin'] / 1024:.0f} KiB shared memory per block, "
             f"{f['regs_per_block']} registers per block, 255 per thread"]
    for r in res:
        H, dh, M, dt, B, T, seg = r["case"]
        head = f"(H, d_h, M) = ({H}, {dh}, {M}) {dt} B={B} T={T}{' seg' if seg else ''}, fwd+bwd, chunk 64"
        if r.get("error"):
            lines.append(f"{head}: COMPILE FAILED after {r['seconds']:.0f} s: {r['error']}")
        else:
            calls = ", ".join(f"{tuple(c['grid'])}/w{c['num_warps']}/s{c['num_stages']}" for c in r["triton"])
            lines.append(f"{head}: compiled in {r['seconds']:.0f} s; {len(r['triton'])} Triton calls "
                         f"(grid/warps/stages): {calls}")
            trips = r.get("round_trips") or []
            lines.append(f"    mode tensors through XLA between the kernels: {len(trips) or 'none'}"
                         + (f" ({trips[0]})" if trips else "")
                         + (f"; XLA ops' bytes accessed {r['hbm_bytes'] / 2**20:.1f} MiB" if r.get("hbm_bytes") else ""))
        for k in r["kernels"]:
            smem = ("   ?    B (  ?   KiB)" if k["smem"] is None
                    else f"{k['smem']:>7} B ({k['smem'] / 1024:5.1f} KiB)")
            lines.append(f"    {k['name']:>10}  smem {smem}  "
                         f"regs {k['registers']:>3}  spill {k['spill_stores']:>6} B stores / "
                         f"{k['spill_loads']:>6} B loads")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m idattn.aot.gpu: kernel resources at the tested shapes, H200
    import argparse
    argparse.ArgumentParser(prog="python -m idattn.aot.gpu", description="Compile the fused GPU kernels for an "
                            "H200 (no GPU needed) and print their registers, spills and shared memory at the "
                            "tested shapes (docs/kernels.md).").parse_args()
    # the three kernel sets of the paper's head shapes and the benchmark's (H only sets the grid), both dtypes:
    # bf16 at B·H = 256 (the benchmark's tiles at T <= 4K), float32 at B = 1 (as its checks run)
    cases = [(16, 128, 32, "bfloat16", 16, 128, True), (32, 64, 64, "bfloat16", 8, 128, True),
             (16, 96, 64, "bfloat16", 16, 128, True), (16, 128, 32, "float32", 1, 128, True),
             (32, 64, 64, "float32", 1, 128, True), (16, 96, 64, "float32", 1, 128, True)]
    print(format_resources(kernel_resources(cases)))
