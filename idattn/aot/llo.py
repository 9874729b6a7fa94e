"""What a compiled Pallas TPU (Mosaic) kernel does per grid step, read from Mosaic's last LLO dump.

Mosaic writes its lowering stages when libtpu is started with ``--xla_mosaic_dump_to=DIR``; the last one,
``*-post-finalize-llo.txt``, is one ``func.func @<kernel>`` per kernel: the body of one grid step in vector
register (vreg) operations, every vreg [8, 128] 32-bit lanes (bf16 packed two per lane), with the step's
``scf.for`` loops (the chunks inside a step) and ``scf.if`` blocks (work on some steps only, such as the state's
initialisation on the first). This module counts those operations per grid step, by unit:

    mxu      vreg pushes through the matrix unit (``vmatmul``): 8 rows of a product against a latched 128 x 128
             block each
    mxu_io   the matrix unit's other traffic: weights latched (``vlatch``), results popped (``vmatres``)
    vpu      elementwise vreg arithmetic, compares, selects, packs and conversions (``vadd``, ``vmul``, ...)
    eup      transcendentals (``vrecip``, ``vexp``, ``vlog``, ``vtanh``, ``vrsqrt``, ``vpow2``, ...)
    xlu      cross-lane moves: transposes, rotations, permutations (``vxpose``, ``vrot``, ``vperm``)
    load / store    vreg loads from and stores to VMEM
    scalar   the scalar unit's address and loop arithmetic

a loop body counted once per trip (its bounds are the step's constants); an ``scf.if`` block counted once (an
upper bound: it may run on some steps only). The DMA between HBM and VMEM is Pallas' pipeline around the body and
is not in it: the static model (idattn.bench.tpu_model) prices it from the block bytes.

    python -m idattn.aot.llo DIR          # a table per kernel found in DIR's post-finalize-llo dumps

What the counts cannot say: how the compiler packs them into VLIW bundles (several units issue in one cycle)
and the dependent latencies between them; a time read from them is a range (docs/kernels-results.md, "TPU").
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re

UNITS = ("mxu", "mxu_io", "vpu", "eup", "xlu", "load", "store", "scalar")
_MXU = ("vmatmul",)
_MXU_IO = ("vlatch", "vmatres", "vdwg")
_EUP = ("vrecip", "vexp", "vlog", "vtanh", "vrsqrt", "vpow2", "vlog2", "vsqrt", "vsin", "vcos", "verf")
_XLU = ("vxpose", "vrot", "vperm", "vpermres", "vsetperm", "vshuffle", "vbcast_lane")
_LOAD = ("vector_load", "vld")
_STORE = ("vector_store", "vector_store_masked", "vst")
_FREE = ("constant", "type", "assume_multiple", "vslaneid", "vxlaneid")  # no work of their own
_OP = re.compile(r'^\s*(?:%[\w#:]+(?:\s*,\s*%[\w#:]+)*\s*=\s*)?"?llo\.([a-z_0-9]+)')
_CONST = re.compile(r"^\s*(%\w+)\s*=\s*llo\.constant\s*\{value\s*=\s*(-?\d+)\s*:\s*i32\}")
_FOR = re.compile(r"^\s*scf\.for\s+%\w+\s*=\s*(%\w+)\s+to\s+(%\w+)\s+step\s+(%\w+)")
_FUNC = re.compile(r"^\s*func\.func\s+@(\w+)")
_GRID = re.compile(r"iteration_bounds = array<i64: ([\d, ]+)>")


def unit_of(op: str) -> str | None:
    """The unit an LLO op name (without its type suffix) runs on; None for ops that do no work."""
    if op in _FREE:
        return None
    if op in _MXU:
        return "mxu"
    if op in _MXU_IO:
        return "mxu_io"
    if op in _EUP:
        return "eup"
    if op in _XLU:
        return "xlu"
    if op in _LOAD:
        return "load"
    if op in _STORE:
        return "store"
    if op.startswith("v"):
        return "vpu"
    return "scalar"


def count_kernels(text: str) -> dict[str, dict[str, float]]:
    """{kernel name: {unit: operations per grid step, ...}} of one post-finalize-llo dump. Loop bodies count once
    per trip (constant bounds; a bound that is not a constant counts the body once and marks the kernel
    "dynamic_loops"), `scf.if` blocks once; kernels other than @idattn_* (the index maps) are skipped."""
    out: dict[str, dict[str, float]] = {}
    consts: dict[str, int] = {}
    name, counts, grid = None, collections.Counter(), ()
    stack: list[float] = []  # the trip multiplier of each open block
    mult = 1.0
    dynamic = 0
    for line in text.splitlines():
        f = _FUNC.match(line)
        if f:
            if name and name.startswith("idattn"):
                out[name] = dict(counts, dynamic_loops=dynamic, grid=grid)
            name, counts, stack, mult, dynamic = f.group(1), collections.Counter(), [], 1.0, 0
            g = _GRID.search(line)
            grid = tuple(int(x) for x in g.group(1).split(",")) if g else ()
            continue
        c = _CONST.match(line)
        if c:
            consts[c.group(1)] = int(c.group(2))
        loop = _FOR.match(line)
        if loop:
            lo, hi, st = (consts.get(g) for g in loop.groups())
            trips = (hi - lo + st - 1) // st if None not in (lo, hi, st) and st > 0 else None
            dynamic += trips is None
            stack.append(mult)
            mult *= max(trips or 1, 0)
            continue
        if re.match(r"^\s*scf\.if\b", line) or re.match(r"^\s*\}\s*else\s*\{", line):
            if not re.match(r"^\s*\}\s*else", line):
                stack.append(mult)
            continue
        if re.match(r"^\s*\}", line) and stack:
            mult = stack.pop()
            continue
        m = _OP.match(line)
        if m and name:
            u = unit_of(m.group(1).split(".")[0])
            if u:
                counts[u] += mult
    if name and name.startswith("idattn"):
        out[name] = dict(counts, dynamic_loops=dynamic, grid=grid)
    return out


def read_dumps(folder: str) -> dict[str, dict[str, float]]:
    """Every kernel of the post-finalize-llo dumps in `folder` (a kernel compiled twice keeps its last dump)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "*post-finalize-llo.txt"))):
        with open(path) as fh:
            out.update(count_kernels(fh.read()))
    return out


def format_counts(kernels: dict[str, dict[str, float]]) -> str:
    lines = ["| kernel | grid | " + " | ".join(UNITS) + " |", "|---" * (len(UNITS) + 2) + "|"]
    for k in sorted(kernels):
        lines.append(f"| {k.removeprefix('idattn_tpu_')} | {kernels[k].get('grid')} | "
                     + " | ".join(f"{kernels[k].get(u, 0):,.0f}" for u in UNITS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m idattn.aot.llo", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="a --xla_mosaic_dump_to folder")
    a = ap.parse_args(argv)
    kernels = read_dumps(a.folder)
    if not kernels:
        print(f"no idattn kernel in {a.folder}/*post-finalize-llo.txt (compile with LIBTPU_INIT_ARGS="
              f"--xla_mosaic_dump_to={a.folder})")
        return 1
    print(format_counts(kernels))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
