"""What the H100/H200 will run: the fused kernels' SASS, read on a CPU host (no GPU).

    python -m idattn.aot.sass [--shape 16,128,32] [--dtype bfloat16] [--T 4096] [--B 16] [--out DIR]

compiles the fused operator's forward + backward (impl="pallas") for an H200 deviceless (idattn.aot.gpu), with
XLA's ``ptxas`` replaced by a wrapper that keeps every PTX file it assembles and the sm_90a cubin it writes; each
cubin is disassembled (``cuobjdump -sass``) and read per kernel:

  - the instruction mix of the whole kernel and of its innermost-enclosing **chunk loop** (the largest backward
    branch: the ``fori_loop`` over chunks of the serial kernels; chunk-parallel kernels have none and count whole):
    tensor-core MMAs (``HMMA``: the mma.sync path Triton takes, 16x8x16 per warp; ``HGMMA``: wgmma, 64xNx16 per
    warpgroup), FP32 FMA/MUL/ADD, MUFU (exp, sin/cos, reciprocal), global / shared loads and stores, ldmatrix,
    barriers, and the rest;
  - the tensor-core work per instruction: an ``HMMA.16816.F32.BF16`` is 16·8·16 = 2,048 MACs per warp, an
    ``HGMMA.64xNx16`` 64·N·16 per warpgroup;
  - registers, spills and shared memory from ptxas -v (as ``idattn.aot.gpu`` reports them);
  - the launch grid and warps from the compiled HLO's Triton calls.

``cuobjdump`` and ``nvdisasm`` come with Triton's wheel (``triton/backends/nvidia/bin``; ``pip install triton``,
CPU-only hosts included), or from PATH / ``IDATTN_CUOBJDUMP``. docs/kernels-results.md, "What the compiled
kernels use", holds the table and what it says; ``idattn.bench.gpu_model`` turns these counts into predicted times.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from idattn import atomic
from idattn.aot import gpu
from idattn.bench import gpu_model as G

# SASS opcode (the mnemonic before the first '.') -> class. Order of the table is the order of the report.
CLASSES = {
    "mma": ("HMMA", "HGMMA", "IMMA", "DMMA"),
    "ffma": ("FFMA", "FFMA2"),
    "fmul/fadd": ("FMUL", "FADD", "FMUL2", "FADD2", "FMNMX", "FSETP", "FSEL", "FCHK"),
    "mufu": ("MUFU",),
    "cvt/pack": ("F2F", "F2FP", "I2F", "F2I", "F2IP", "PRMT"),
    # LD / ST: generic-address loads and stores (Mosaic GPU writes global memory with them; Triton never emits
    # them); UBLKCP: a bulk copy, sorted by direction in mix()
    "ldg": ("LDG", "LDGSTS", "UTMALDG", "LDGDEPBAR", "LD"),
    "stg": ("STG", "RED", "ATOMG", "UTMASTG", "ST"),
    "lds": ("LDS", "LDSM"),
    "local (spill)": ("LDL", "STL"),
    "shfl": ("SHFL",),
    "sts": ("STS", "STSM"),
    "barrier": ("BAR", "BSYNC", "BSSY", "WARPSYNC", "DEPBAR", "WARPGROUP", "SYNCS", "MEMBAR", "FENCE"),
    "int/addr": ("IMAD", "IADD3", "ISETP", "SEL", "MOV", "UMOV", "LOP3", "SHF", "LEA", "VIADD", "UIADD3", "R2UR",
                 "SGXT", "IABS", "IMNMX", "S2R", "S2UR", "ULDC", "USHF", "ULOP3", "UISETP", "USEL", "UIMAD", "ULEA",
                 "P2R", "R2P", "PLOP3", "CS2R", "VIMNMX", "IMAD.WIDE", "ISCADD", "BMSK", "FLO", "POPC", "BREV"),
}
_CLASS_OF = {op: c for c, ops in CLASSES.items() for op in ops}
# MACs one instruction does, per warp (HMMA) or per warpgroup (HGMMA): from the shape in its mnemonic
_HMMA_SHAPE = re.compile(r"HMMA\.(16)(8)(16|8|4|32)\b")  # HMMA.16816 -> m16 n8 k16; HMMA.1688 -> m16 n8 k8
_HGMMA_SHAPE = re.compile(r"HGMMA\.(\d+)x(\d+)x(\d+)")
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([.\w]*)\s*(.*?);")
_FUNC = re.compile(r"Function : (\S+)")
_BRA_TARGET = re.compile(r"`?\(?\.L_x_(\d+)\)?|0x([0-9a-f]+)")


@dataclasses.dataclass
class Instr:
    addr: int
    op: str  # the mnemonic (HMMA, FFMA, ...)
    mods: str  # its modifiers (.16816.F32.BF16)
    args: str


def parse_sass(text: str) -> dict[str, list[Instr]]:
    """{kernel name: [Instr in address order]} from `cuobjdump -sass` output (one or more functions)."""
    out: dict[str, list[Instr]] = {}
    cur = None
    labels: dict[str, int] = {}
    for line in text.splitlines():
        m = _FUNC.search(line)
        if m:
            cur = m.group(1)
            out[cur] = []
            continue
        if cur is None:
            continue
        m = _LINE.search(line)
        if m:
            out[cur].append(Instr(int(m.group(1), 16), m.group(2), m.group(3), m.group(4)))
    del labels
    return out


def macs(ins: Instr) -> int:
    """Multiply-accumulates of one tensor-core instruction (per warp for HMMA, per warpgroup for HGMMA); 0 else."""
    if ins.op == "HMMA":
        m = _HMMA_SHAPE.match(ins.op + ins.mods)
        if m:
            return int(m.group(1)) * int(m.group(2)) * int(m.group(3))
    if ins.op == "HGMMA":
        m = _HGMMA_SHAPE.match(ins.op + ins.mods)
        if m:
            return int(m.group(1)) * int(m.group(2)) * int(m.group(3))
    return 0


def loops(instrs: list[Instr]) -> list[tuple[int, int]]:
    """(start, end) index ranges of the backward branches (a BRA whose target address is at or before itself),
    outermost first. The target is read from the branch's immediate (cuobjdump prints `(.L_x_N)` labels or an
    address); a branch whose target cannot be read is skipped."""
    by_addr = {ins.addr: i for i, ins in enumerate(instrs)}
    out = []
    for i, ins in enumerate(instrs):
        if ins.op != "BRA":
            continue
        m = re.search(r"0x([0-9a-f]+)", ins.args)
        if not m:
            continue
        tgt = int(m.group(1), 16)
        if tgt <= ins.addr and tgt in by_addr:
            out.append((by_addr[tgt], i))
    return sorted(out, key=lambda r: r[0] - r[1])


_WIDTH = re.compile(r"\.(128|64|32|U16|S16|U8|S8)\b")


def access_bytes(ins: Instr) -> int:
    """Bytes one thread moves with a global load or store (LDG / STG / LDGSTS: .128 = 16, .64 = 8, none = 4)."""
    m = _WIDTH.search(ins.mods)
    w = m.group(1) if m else "32"
    return {"128": 16, "64": 8, "32": 4, "U16": 2, "S16": 2, "U8": 1, "S8": 1}[w]


def _class(ins: Instr) -> str:
    """The CLASSES entry of one instruction; a bulk copy (UBLKCP.G.S: shared to global, .S.G: global to shared)
    by its direction."""
    if ins.op == "UBLKCP":
        return "stg" if ins.mods.startswith(".G.S") else "ldg"
    return _CLASS_OF.get(ins.op, "other")


def mix(instrs: list[Instr], warps: int = 4) -> dict:
    """{class: count} over `instrs` (CLASSES order, then "other"): instructions in one warp's stream; plus
    "bar_sync" (BAR.SYNC: every warp of the program waits), "hgmma" (wgmma instructions), "mma_macs" (the
    program's tensor-core MACs: each warp issues its HMMAs, each warpgroup of four warps one HGMMA) and "total"."""
    c = collections.Counter(_class(i) for i in instrs)
    out = {k: c.get(k, 0) for k in list(CLASSES) + ["other"]}
    out["bar_sync"] = sum(1 for i in instrs if i.op == "BAR" and "SYNC" in i.mods)
    out["hgmma"] = sum(1 for i in instrs if i.op == "HGMMA")
    out["mma_macs"] = (sum(macs(i) for i in instrs if i.op == "HMMA") * warps
                       + sum(macs(i) for i in instrs if i.op == "HGMMA") * warps // 4)
    # bytes one program moves to / from global memory (L2, then HBM): every thread of every warp
    # (TMA and bulk copies move bytes a register names, not the mnemonic: not counted)
    out["ldg_bytes"] = 32 * warps * sum(access_bytes(i) for i in instrs if i.op in ("LDG", "LDGSTS", "LD"))
    out["stg_bytes"] = 32 * warps * sum(access_bytes(i) for i in instrs if i.op in ("STG", "RED", "ATOMG", "ST"))
    out["total"] = len(instrs)
    return out


def top_loops(lp: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The loops no other loop holds (``loops``' ranges, largest first), without 1-instruction branches to
    themselves (the exit pad). A kernel whose chunk loop the compiler unswitched on a program-uniform condition
    (ptxas versions the loop: the backward's programs per mode block, where only block 0 forms and stores
    phase 1's outputs) has two: the largest, with the condition's work, and the other program's copy."""
    return [(a, b) for i, (a, b) in enumerate(lp)
            if b > a and not any(j != i and c <= a and b <= d and (c, d) != (a, b) for j, (c, d) in enumerate(lp))]


def inner_loops(lp: list[tuple[int, int]], outer: tuple[int, int] | None = None) -> list[dict]:
    """The loops inside the outermost one (``loops``' ranges, outermost first), or inside ``outer``, without
    1-instruction branches to themselves (the exit pad): [{"start", "end", "parent": index in this list of the
    innermost loop holding it or None, "holds_loop": whether another loop is inside it}]."""
    if not lp:
        return []
    o0, o1 = outer or lp[0]
    inner = [(a, b) for a, b in lp if o0 <= a and b <= o1 and b > a and (a, b) != (o0, o1)]
    out = []
    for i, (a, b) in enumerate(inner):
        holders = [j for j, (c, d) in enumerate(inner) if j != i and c <= a and b <= d]
        parent = min(holders, key=lambda j: inner[j][1] - inner[j][0]) if holders else None
        out.append({"start": a, "end": b, "parent": parent,
                    "holds_loop": any(j != i and a <= c and d <= b for j, (c, d) in enumerate(inner))})
    return out


def dynamic_mix(instrs: list[Instr], warps: int, trips: dict, outer: tuple[int, int] | None = None) -> dict:
    """The mix of one iteration of the outermost loop (or of ``outer``) as it runs: the backward kernels loop
    inside their chunk loop over feature sub-blocks (``trips["sub"]`` trips) and, with several mode blocks, over
    those (``trips["mode"]``: the loops that hold another loop, or every inner loop when there is one sub-block),
    and the static body holds each inner body once. An inner loop of t trips inside loops of T trips in all adds
    (t - 1)·T copies of its body."""
    lp = loops(instrs)
    outer = outer or lp[0]
    inner = inner_loops(lp, outer)
    total = collections.Counter(mix(instrs[outer[0]:outer[1] + 1], warps))

    def trips_of(i):
        # with one feature sub-block the sub-block body is inlined (the mode loop then holds no loop), with one
        # mode block there is no mode loop; otherwise the mode loop is the one holding the sub-block loop
        if int(trips["sub"]) == 1:
            return int(trips["mode"])
        if int(trips["mode"]) == 1:
            return int(trips["sub"])
        return int(trips["mode"] if inner[i]["holds_loop"] else trips["sub"])

    for i, lo in enumerate(inner):
        outer_trips, j = 1, lo["parent"]
        while j is not None:
            outer_trips, j = outer_trips * trips_of(j), inner[j]["parent"]
        extra = (trips_of(i) - 1) * outer_trips
        if extra:
            for k, v in mix(instrs[lo["start"]:lo["end"] + 1], warps).items():
                total[k] += extra * v
    return dict(total)


def kernel_report(name: str, instrs: list[Instr], warps: int = 4, resources: dict | None = None,
                  trips: dict | None = None) -> dict:
    """Per kernel: its whole mix, and the mix of its chunk loop (the outermost backward branch) if it has one;
    `resources`: cuobjdump -res-usage's {REG, SHARED, LOCAL, STACK} of the kernel. With `trips` (the trip
    counts of the loops inside the chunk loop: {"sub", "mode"}, from the kernel's plan) also "loop_run", the mix
    of one chunk iteration as it runs (``dynamic_mix``): "loop" counts each inner loop's body once."""
    lp = loops(instrs)
    body = instrs[lp[0][0]:lp[0][1] + 1] if lp else []
    rep = {"name": name, "warps": warps, "instructions": len(instrs), "all": mix(instrs, warps),
           "loop": mix(body, warps) if body else None, "loops": len(lp), **(resources or {})}
    if body:
        rep["inner_loops"] = [{"start": lo["start"] - lp[0][0], "end": lo["end"] - lp[0][0],
                               "total": lo["end"] - lo["start"] + 1, "holds_loop": lo["holds_loop"]}
                              for lo in inner_loops(lp)]
        if trips:
            rep["trips"] = dict(trips)
            rep["loop_run"] = dynamic_mix(instrs, warps, trips)
            tops = top_loops(lp)
            if int(trips.get("split", 0)) > 1 and len(tops) > 1 and inner_loops(lp, tops[1]):
                # the chunk loop unswitched on the mode block (gpu.PHASE1_ONCE): the largest copy is block 0's,
                # the next every other block's (a copy without inner loops is not a chunk loop)
                rep["loop_run_rest"] = dynamic_mix(instrs, warps, trips, tops[1])
    return rep


_RES = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def parse_res_usage(text: str) -> dict[str, dict]:
    """{kernel: {"registers", "stack", "smem_static", "local"}} from `cuobjdump -res-usage`."""
    return {m.group(1): {"registers": int(m.group(2)), "stack": int(m.group(3)), "smem_static": int(m.group(4)),
                         "local": int(m.group(5))} for m in _RES.finditer(text)}


def read_cubin(cubin: str, tool: str | None = None, text_out: list | None = None):
    """({kernel: [Instr]}, {kernel: resources}) of one cubin, from `cuobjdump -sass` and `-res-usage` (`tool`,
    else find_tool's); a failing cuobjdump raises with its stderr. `text_out`: the listing is appended to it."""
    tool = tool or find_tool("cuobjdump")
    out = []
    for flag in ("-sass", "-res-usage"):
        p = subprocess.run([tool, flag, cubin], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"cuobjdump {flag} failed on {cubin}: {p.stderr.strip()[-500:]}")
        out.append(p.stdout)
    if text_out is not None:
        text_out.append(out[0])
    return parse_sass(out[0]), parse_res_usage(out[1])


# ---------------------------------------------------------------------------------------------- the toolchain
def find_tool(name: str) -> str | None:
    """cuobjdump / nvdisasm: $IDATTN_<NAME>, then Triton's wheel (found without importing it), then PATH."""
    env = os.environ.get(f"IDATTN_{name.upper()}")
    if env and os.path.isfile(env):
        return env
    spec = importlib.util.find_spec("triton")
    for root in (list(spec.submodule_search_locations or []) if spec else []):
        p = os.path.join(root, "backends", "nvidia", "bin", name)
        if os.path.isfile(p):
            return p
    return shutil.which(name)


_WRAPPER = r"""#!{python}
# ptxas stand-in for idattn.aot.sass: keeps the PTX it assembles and the cubin it writes, then runs the real one
import os, shutil, subprocess, sys, uuid
args = sys.argv[1:]
real = {real!r}
dump = {dump!r}
rc = subprocess.call([real] + args)
tag = uuid.uuid4().hex[:8]
ptx = [a for a in args if a.endswith(".ptx")]
out = args[args.index("-o") + 1] if "-o" in args else None
for p in ptx:
    if os.path.exists(p):
        shutil.copy(p, os.path.join(dump, tag + ".ptx"))
if out and os.path.exists(out):
    shutil.copy(out, os.path.join(dump, tag + ".cubin"))
sys.exit(rc)
"""


def capturing_cuda_dir(dump: str) -> str:
    """A CUDA data folder for ``xla_gpu_cuda_data_dir`` whose bin/ptxas is a wrapper around the nvcc wheel's (PTX
    and cubins copied into `dump`); its nvvm/ (libdevice) is the wheel's."""
    wheel = gpu.nvcc_wheel_dir()
    if wheel is None:
        raise RuntimeError(gpu.cuda_plugin_missing() or "the nvcc wheel is missing: pip install -e '.[cuda12]'")
    root = tempfile.mkdtemp(prefix="idattn-ptxas-")
    os.makedirs(os.path.join(root, "bin"))
    os.symlink(os.path.join(wheel, "nvvm"), os.path.join(root, "nvvm"))
    path = os.path.join(root, "bin", "ptxas")
    with open(path, "w") as f:
        f.write(_WRAPPER.format(python=sys.executable, real=os.path.join(wheel, "bin", "ptxas"), dump=dump))
    os.chmod(path, 0o755)
    return root


_COMPILE_SCRIPT = r"""
import json, sys, time
sys.path.insert(0, {root!r})
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from jax.experimental import topologies
from idattn.aot import gpu
from idattn.ops import interdomain_mix
from idattn.ops.pallas import op as pallas_op
from idattn.ops.pallas import gpu as pallas_gpu
for k, v in {env_opts!r}.items():  # a setter (set_save_states) is called, a constant (GPU_PARALLEL_FWD_MIN_T) set;
    mod, k = (pallas_gpu, k[4:]) if k.startswith("gpu.") else (pallas_op, k)  # "gpu.TUNING": the GPU module's
    getattr(mod, k)(v) if k.startswith("set_") else setattr(mod, k, v)
topo = topologies.get_topology_desc(platform="cuda", target_config=gpu.target_config({card!r}), topology="1x1x1")
s = NamedSharding(topologies.make_mesh(topo, (1,), ("x",)), P())
sd = lambda shp, d: jax.ShapeDtypeStruct(shp, d, sharding=s)
H, dh, M, dt, B, T, L = {case!r}
dt = jnp.dtype(dt)
def loss(fq, zk, zv, lam, b, c, sg):
    o = interdomain_mix(fq, zk, zv, lam, b, c, impl="pallas", chunk_size=L, segment_ids=sg)
    return jnp.sum(o.astype(jnp.float32))
args = ((sd((B, T, H, dh), dt),) * 3 + (sd((H, M), jnp.complex64),) * 2 + (sd((H, M, M), jnp.complex64),)
        + (sd((B, T), jnp.int32),))
fn = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5)) if {mode!r} == "fwdbwd" else loss
c = jax.jit(fn).lower(*args).compile(compiler_options=dict(xla_gpu_cuda_data_dir={cuda_dir!r}))
txt = c.as_text()
print("@@CALLS", json.dumps(gpu.triton_calls(txt)), flush=True)
# the trip counts of the backward kernels' loops inside their chunk loop: feature sub-blocks and mode blocks
pad = lambda n: max(16, 1 << (int(n) - 1).bit_length())
plans = dict(pallas_op._gpu_plans(pallas_gpu, B * H, L, pad(dh), pad(dh), pad(M), dt, True))
nmb = pad(M) // min(pad(M), pallas_gpu.MODE_BLOCK)
# with a program per mode block (gpu.SPLIT_MODE_BLOCKS) no mode-block loop is left, and grid axis 2 holds the
# chunk groups times the blocks ("split")
split = nmb if nmb > 1 and getattr(pallas_gpu, "SPLIT_MODE_BLOCKS", False) else 1
print("@@TRIPS", json.dumps({{"idattn_" + k: {{"sub": pad(dh) // plans[k].block, "mode": nmb // split,
                                               "split": split}} for k in ("bwd_o", "bwd_p")}}), flush=True)
# every kernel's feature block: a chunk-parallel readout's iterations per program depend on it (gpu._readout)
print("@@BLOCKS", json.dumps({{"idattn_" + k: p.block for k, p in plans.items()}}), flush=True)
print("@@XLA", json.dumps(dict(gpu.glue_traffic(txt), fusions=txt.count(" fusion("))), flush=True)
"""


def compile_and_capture(case, *, mode="fwdbwd", card="h200", timeout=1200, env_opts=None) -> dict:
    """Compiles one case (H, d_h, M, dtype name, B, T, chunk L) in a fresh process and returns {"calls": the
    Triton calls of the compiled HLO (name, grid, warps, stages), "kernels": {entry name: kernel_report}, "ptx":
    {entry name: PTX text}}. env_opts: {setter or constant in idattn.ops.pallas.op: value}, e.g. {"set_save_states": False}; a key
    "gpu.NAME" sets idattn.ops.pallas.gpu's NAME instead (e.g. {"gpu.TUNING": {...}}: a tuning tried before it
    lands)."""
    dump = tempfile.mkdtemp(prefix="idattn-sass-")
    cuda_dir = capturing_cuda_dir(dump)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = _COMPILE_SCRIPT.format(root=root, case=tuple(case), card=card, mode=mode, cuda_dir=cuda_dir,
                                    env_opts=dict(env_opts or {}))
    p = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, JAX_PLATFORMS="cpu"),
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"compile failed for {case}:\n{p.stderr[-3000:]}")
    calls = next((json.loads(l[8:]) for l in p.stdout.splitlines() if l.startswith("@@CALLS")), [])
    xla = next((json.loads(l[6:]) for l in p.stdout.splitlines() if l.startswith("@@XLA")), {})
    trips = next((json.loads(l[8:]) for l in p.stdout.splitlines() if l.startswith("@@TRIPS")), {})
    blocks = next((json.loads(l[9:]) for l in p.stdout.splitlines() if l.startswith("@@BLOCKS")), {})
    tool = find_tool("cuobjdump")
    if tool is None:
        raise RuntimeError("cuobjdump not found: pip install triton (its wheel carries cuobjdump and nvdisasm, no "
                           "GPU needed), or set IDATTN_CUOBJDUMP")
    kernels, ptx = {}, {}
    warps = {c["name"]: int(c["num_warps"] or 4) for c in calls if c.get("name")}
    for cubin in sorted(glob.glob(os.path.join(dump, "*.cubin"))):
        functions, res = read_cubin(cubin, tool)
        for name, instrs in functions.items():
            if name.startswith("idattn_"):
                w = warps.get(name) or next((v for n, v in warps.items() if name.startswith(n)), 4)
                kernels[name] = kernel_report(name, instrs, w, res.get(name), trips.get(name))
        src = cubin[:-6] + ".ptx"
        if os.path.exists(src):
            body = open(src).read()
            for name in re.findall(r"\.entry\s+(\w+)", body):
                ptx[name] = body
    shutil.rmtree(dump, ignore_errors=True)
    shutil.rmtree(cuda_dir, ignore_errors=True)
    return {"case": tuple(case), "mode": mode, "calls": calls, "kernels": kernels, "ptx_kernels": sorted(ptx),
            "xla": xla, "blocks": blocks}


def format_report(rep: dict) -> str:
    H, dh, M, dt, B, T, L = rep["case"]
    lines = [f"(H, d_h, M) = ({H}, {dh}, {M}) {dt} B={B} T={T} chunk {L}, {rep['mode']}: "
             f"{len(rep['calls'])} Triton launches"]
    grid = {c["name"]: c for c in rep["calls"]}
    cols = ["mma", "hgmma", "ffma", "fmul/fadd", "mufu", "cvt/pack", "ldg", "stg", "lds", "sts", "local (spill)",
            "barrier", "bar_sync", "int/addr", "other", "total"]
    lines.append("| kernel | grid / warps | where | " + " | ".join(cols) + " | MMA MACs |")
    lines.append("|" + "---|" * (len(cols) + 4))
    for name, k in sorted(rep["kernels"].items()):
        c = grid.get(name) or next((v for n, v in grid.items() if n and name.startswith(n)), None)
        g = f"{tuple(c['grid'])} / {c['num_warps']}" if c else "?"
        for where in ("loop", "all"):
            mx = k[where]
            if mx is None:
                continue
            lines.append(f"| {name} | {g} | {'chunk loop' if where == 'loop' else 'whole kernel'} | "
                         + " | ".join(str(mx[col]) for col in cols) + f" | {mx['mma_macs']:,} |")
    return "\n".join(lines)


def commit_stamp(paths=("idattn/ops/pallas",)) -> str:
    """The checkout's commit (with '+' when `paths`, the kernels' sources, differ from it), or '?' outside a git
    checkout."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", *paths],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return (head or "?") + ("+" if dirty else "")


def collect(out: str, rows=None, log=print) -> dict:
    """Compiles every configuration of ``idattn.bench.gpu_model.MEASURED`` (or `rows`: (tag, (H, d_h, M), T, chunk,
    mode, options)) at 65,536 tokens, bf16, and writes {row key: compile_and_capture report} to `out` (whole, after
    every configuration, so a stop keeps what was done; a rerun skips the keys already there)."""
    rows = rows if rows is not None else [(t, s, T, L, m, G.OPTIONS.get(t, {})) for t, s, T, L, m, _, _ in G.MEASURED]
    data = json.load(open(out)) if os.path.exists(out) else {}
    for tag, (H, dh, M), T, L, mode, opts in rows:
        k = G.key(tag, (H, dh, M), T, L, mode)
        if k in data:
            continue
        t0 = time.time()
        rep = compile_and_capture((H, dh, M, "bfloat16", G.TOKENS // T, T, L), mode=mode, env_opts=opts)
        rep.update(tag=tag, opts=opts, compile_s=time.time() - t0, commit=commit_stamp())
        data[k] = rep
        atomic.write_json(out, data, indent=1, sort_keys=True)
        log(f"{k}: {len(rep['calls'])} launches, compiled in {time.time() - t0:.0f} s")
    return data


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["collect"]:
        ap = argparse.ArgumentParser(prog="python -m idattn.aot.sass collect",
                                     description="compile every configuration the GPU cost model reads")
        ap.add_argument("--out", default=G.DATA)
        ap.add_argument("--tag", default="", help="'now': the target configurations (gpu_model.target_rows) "
                                                  "compiled from this checkout's kernels, under keys now_*; "
                                                  "'' (default): the measured rows (gpu_model.MEASURED)")
        a = ap.parse_args(argv[1:])
        try:
            collect(a.out, rows=G.target_rows(a.tag) if a.tag else None)
        except RuntimeError as e:
            print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
            return 1
        return 0
    ap = argparse.ArgumentParser(prog="python -m idattn.aot.sass", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="16,128,32", help="H,d_h,M")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--mode", default="fwdbwd", choices=("fwd", "fwdbwd"))
    ap.add_argument("--json", default="", help="also write the report as JSON here")
    a = ap.parse_args(argv)
    H, dh, M = (int(x) for x in a.shape.split(","))
    try:
        rep = compile_and_capture((H, dh, M, a.dtype, a.B, a.T, a.chunk), mode=a.mode)
    except RuntimeError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(format_report(rep))
    if a.json:
        atomic.write_json(a.json, rep, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
