"""flash-linear-attention's `chunk_simple_gla` kernels compiled for an H200 on a CPU host, read like ours.

    python scripts/fla_sass.py [--T 4096] [--shape 16,128,128] [--out idattn/bench/fla_kernels.json]

The one device run measured fla's `chunk_simple_gla` (fla-core 0.6.0, Triton 3.6, bf16, H = 16, K = V = 128,
65,536 tokens, a per-head decay `g_gamma`) at 3.29-3.46 ms forward + backward and 0.74-0.83 ms forward, flat in T.
This script compiles the same Triton kernels that call runs, for sm_90a without a GPU (`triton.compile` with a
named target), and reads each cubin's SASS with `idattn.aot.sass` (the reader of our own kernels): registers,
the instruction mix of one chunk iteration, tensor-core MACs and the global bytes a program moves. The result is
written in the format of `idattn/bench/gpu_kernels.json`, so that `idattn.bench.gpu_model` can predict fla's time
with the constants fitted on our kernels: a row of another design that the fit never saw.

What the call runs (fla 0.6.0, `g_gamma` given, no initial or final state):
  forward   chunk_fwd_kernel_h (the states before every chunk, bf16; a serial loop over chunks per program),
            chunk_fwd_kernel_o (one chunk per program: the intra-chunk product and the read of its state);
  backward  chunk_fwd_kernel_h again (float32 states), chunk_bwd_kernel_dh (the adjoint states, serial),
            chunk_bwd_kernel_dqkwg and chunk_bwd_kernel_dv (one chunk per program).
Several of these are autotuned on the device; which configuration won there was not recorded, so every
configuration fla offers on Hopper (its lists, reproduced below) is compiled and the report keeps all of them;
the model's prediction is given for the configuration it rates fastest and for the slowest.

Needs torch (CPU is enough), triton and fla-core in the running Python; not a dependency of the package (run it
from a separate environment: `pip install torch triton fla-core numpy jax`). Exits 2 with one line if they are missing.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

S = None  # idattn.aot.sass, the SASS reader (imported in main, after the check that jax is here)

H, K, V, BT, TOKENS = 16, 128, 128, 64, 65536

# fla 0.6.0's autotuning space on Hopper (fla/ops/common/chunk_h.py, chunk_o.py read with a Hopper device: its
# module-level lists depend on the device found at import, so they are written out here)
HOPPER_H = [dict(BK=bk, BV=bv, num_warps=w, num_stages=s) for bk, bv, w, s in
            itertools.product([32, 64], [32, 64], [1, 2, 4, 8], [2, 3, 4])]
HOPPER_O = [dict(BK=128, BV=128, num_warps=8, num_stages=3), dict(BK=64, BV=64, num_warps=4, num_stages=3),
            dict(BK=32, BV=32, num_warps=2, num_stages=3)]
HOPPER_BWD = [dict(BK=128, BV=128, num_warps=w, num_stages=s) for w, s in itertools.product([2, 4], [2, 3, 4])]


def _jit(obj):
    """The JITFunction under fla's autotune / heuristics wrappers."""
    from triton.runtime.jit import JITFunction
    while not isinstance(obj, JITFunction):
        obj = obj.fn
    return obj


def _compile(kernel, args: dict, cfg: dict, target):
    """Compile `kernel` for `target` with `args` (name -> "*bf16"-like type, int/float/bool/None constexpr values,
    or ("i32"|"fp32", None) for a runtime scalar) and a config's constexprs and launch options."""
    import triton
    from triton.compiler import ASTSource
    fn = _jit(kernel)
    sig, const, attrs = {}, {}, {}
    values = {**args, **{k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages")}}
    for i, name in enumerate(fn.arg_names):
        v = values.get(name, None)
        p = fn.params[i]
        if p.is_constexpr or v is None or isinstance(v, (bool, int)) and not isinstance(v, tuple):
            sig[name] = "constexpr"
            const[name] = v
        else:
            sig[name] = v[0] if isinstance(v, tuple) else v
            if isinstance(v, str) and v.startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]  # torch's allocations are 16-byte aligned
    src = ASTSource(fn, sig, const, attrs)
    return triton.compile(src, target=target, options={"num_warps": cfg["num_warps"],
                                                       "num_stages": cfg["num_stages"]})


def _read(compiled, name: str, warps: int) -> dict:
    """idattn.aot.sass's report of one compiled kernel (its cubin disassembled with cuobjdump)."""
    tool = S.find_tool("cuobjdump")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        text = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    funcs = S.parse_sass(text)
    fname, instrs = next(iter(funcs.items()))
    rep = S.kernel_report(name, instrs, warps, next(iter(S.parse_res_usage(res).values()), None))
    rep["n_regs_triton"] = int(getattr(compiled, "n_regs", 0) or 0)
    rep["shared_triton"] = int(compiled.metadata.shared)
    return rep


def kernels(T: int):
    """(launch name, fla kernel, args, configs, grid(cfg), iterations(cfg)) of one forward + backward."""
    from fla.ops.common import chunk_h as ch
    from fla.ops.common import chunk_o as co
    B, NT = TOKENS // T, T // BT
    bf, f32 = "*bf16", "*fp32"
    common = dict(T=("i32", None), H=H, K=K, V=V, BT=BT)
    h_fwd = dict(k=bf, v=bf, h=bf, g=None, g_gamma=f32, gk=None, gv=None, h0=None, ht=None, cu_seqlens=None,
                 split_offsets=None, BS=BT, USE_G=False, USE_G_GAMMA=True, USE_GK=False, USE_GV=False,
                 USE_INITIAL_STATE=False, STORE_FINAL_STATE=False, IS_VARLEN=False, STATE_V_FIRST=False, **common)
    h_bwd = {**h_fwd, "h": f32}
    dh = dict(q=bf, g=None, g_gamma=f32, gk=None, gv=None, do=bf, dh=f32, dht=None, dh0=None, cu_seqlens=None,
              split_offsets=None, scale=("fp32", None), HQ=H, BS=BT, NG=1, USE_G=False, USE_G_GAMMA=True,
              USE_GK=False, USE_GV=False, STORE_INITIAL_STATE_GRADIENT=False, USE_FINAL_STATE_GRADIENT=False,
              IS_VARLEN=False, STATE_V_FIRST=False, **common)
    o = dict(q=bf, k=bf, v=bf, h=bf, g=None, g_gamma=f32, o=bf, cu_seqlens=None, chunk_indices=None,
             scale=("fp32", None), HV=H, USE_G=False, USE_G_GAMMA=True, IS_VARLEN=False, STATE_V_FIRST=False,
             **common)
    dqk = dict(q=bf, k=bf, v=bf, g=None, g_gamma=f32, h=f32, do=bf, dh=f32, dq=bf, dk=bf, dw=None, dv=None,
               dg=None, cu_seqlens=None, chunk_indices=None, scale=("fp32", None), B=B, HV=H, USE_G=False,
               USE_G_GAMMA=True, USE_DW=False, IS_VARLEN=False, STATE_V_FIRST=False, **common)
    dv = dict(q=bf, k=bf, g=None, g_gamma=f32, do=bf, dv=bf, dh=f32, cu_seqlens=None, chunk_indices=None,
              scale=("fp32", None), HV=H, USE_G=False, USE_G_GAMMA=True, IS_VARLEN=False, STATE_V_FIRST=False,
              **common)
    serial = lambda c: (-(-K // c["BK"]) * -(-V // c["BV"]) * B * H, 1, 1)  # noqa: E731
    per_chunk = lambda c: (-(-V // c["BV"]) * NT, B * H, 1)  # noqa: E731
    return [
        ("fla_fwd_h", "fwd", ch.chunk_fwd_kernel_h, h_fwd, HOPPER_H, serial, lambda c: NT),
        ("fla_fwd_o", "fwd", co.chunk_fwd_kernel_o, o, HOPPER_O, per_chunk, lambda c: -(-K // c["BK"])),
        ("fla_bwd_h", "bwd", ch.chunk_fwd_kernel_h, h_bwd, HOPPER_H, serial, lambda c: NT),
        ("fla_bwd_dh", "bwd", ch.chunk_bwd_kernel_dh, dh, HOPPER_H, serial, lambda c: NT),
        ("fla_bwd_dqkwg", "bwd", co.chunk_bwd_kernel_dqkwg, dqk, HOPPER_BWD,
         lambda c: (-(-K // c["BK"]) * NT, B * H, 1), lambda c: -(-V // c["BV"])),
        ("fla_bwd_dv", "bwd", co.chunk_bwd_kernel_dv, dv, HOPPER_BWD, per_chunk, lambda c: -(-K // c["BK"])),
    ]


def main(argv=None) -> int:
    global S, H, K, V
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--shape", default=f"{H},{K},{V}", help="H,K,V (heads, key and value width): the anchor run's "
                    "16,128,128 by default; 32,64,64 is the 1.3B model's heads")
    ap.add_argument("--out", default=os.path.join(ROOT, "idattn", "bench", "fla_kernels.json"))
    ap.add_argument("--quick", action="store_true", help="one configuration per kernel (a smoke run)")
    a = ap.parse_args(argv)
    H, K, V = (int(x) for x in a.shape.split(","))
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        import fla
        from idattn.aot import sass as S
    except ImportError as e:
        print(f"error: {e.name} is not installed here: run this from an environment with torch, triton and "
              f"fla-core (pip install torch triton fla-core numpy jax: the SASS reader, idattn.aot.sass, imports jax)")
        return 2
    target = GPUTarget("cuda", 90, 32)
    out = {"source": f"fla-core {getattr(fla, '__version__', '?')}, triton {triton.__version__}, sm_90a, "
                     f"compiled deviceless by scripts/fla_sass.py",
           "case": [H, K, V, "bfloat16", TOKENS // a.T, a.T, BT], "launches": []}
    for name, part, kern, args, cfgs, grid, iters in kernels(a.T):
        variants = []
        for cfg in cfgs[:1] if a.quick else cfgs:
            try:
                comp = _compile(kern, args, cfg, target)
            except Exception as e:  # a configuration Triton refuses (e.g. out of shared memory) is not a choice
                variants.append({"config": cfg, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
                continue
            rep = _read(comp, name, cfg["num_warps"])
            variants.append({"config": cfg, "grid": list(grid(cfg)), "iterations": iters(cfg), "kernel": rep})
            lp = rep["loop"] or rep["all"]
            print(f"{name:<14} {cfg}: regs {rep.get('registers')} spill {rep.get('local')} smem "
                  f"{rep['shared_triton']} loop instr {lp['total']} mma {lp['mma']} macs {lp['mma_macs']} "
                  f"bytes {lp['ldg_bytes'] + lp['stg_bytes']}", flush=True)
        out["launches"].append({"name": name, "part": part, "variants": variants})
    with open(a.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
