"""One-shot GPU check of the fused Pallas kernels (needs only jax + numpy):

    PYTHONPATH=. python scripts/gpu_check.py [--budget-s 330] [--skip-table] [--skip-check]

(a) correctness: the Pallas kernels on the GPU against float64 references computed on the CPU backend (a numpy
    loop for outputs and final states, a float64 lax.scan for the gradients of every input), fp32 and bf16,
    segment resets, carried initial state, c, conj both ways, R = D = 96, T not a multiple of the chunk;
    plus pallas vs the XLA chunked path at a benchmark shape. Prints max relative errors and PASS/FAIL.
(b) the operator table of ``python -m idattn.bench op`` at (H, d_h, M) = (16, 128, 32) and (32, 64, 64),
    T = 1K..16K, 65,536 tokens per batch, fwd and fwd+bwd, against cuDNN causal attention; then the XLA
    chunked path and the decode step while the time budget lasts.
Every case catches and prints its own error; progress is flushed as it goes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

T0 = time.time()
SUMMARY = []
_LOGFILE = None


def log(*a):
    line = " ".join(str(x) for x in a)
    print(f"[{time.time() - T0:6.1f}s]", line, flush=True)
    if _LOGFILE is not None:
        _LOGFILE.write(f"[{time.time() - T0:6.1f}s] {line}\n")
        _LOGFILE.flush()


# ----------------------------------------------------------------------------------------------------------------
# float64 references (CPU)


def ref_numpy(fq, zk, zv, lam, b, c, conj, seg, x0):
    B, T, H, R = fq.shape
    D, M = zv.shape[-1], lam.shape[-1]
    cm = np.broadcast_to(np.eye(M), (H, M, M)) if c is None else c
    resets = np.zeros((B, T), bool)
    if seg is not None:
        resets[:, 1:] = seg[:, 1:] != seg[:, :-1]
    o = np.zeros((B, T, H, D))
    xks, xvs = [], []
    for bi in range(B):
        xk = np.zeros((H, M, R), complex) if x0 is None else x0[0][bi].astype(complex).copy()
        xv = np.zeros((H, M, D), complex) if x0 is None else x0[1][bi].astype(complex).copy()
        for t in range(T):
            if resets[bi, t]:
                xk[:], xv[:] = 0, 0
            xk = lam[:, :, None] * xk + b[:, :, None] * zk[bi, t][:, None, :]
            xv = lam[:, :, None] * xv + b[:, :, None] * zv[bi, t][:, None, :]
            p = np.einsum("hmr,hr->hm", cm @ xk, fq[bi, t])
            o[bi, t] = np.real(np.einsum("hm,hmd->hd", np.conj(p) if conj else p, cm @ xv))
        xks.append(xk)
        xvs.append(xv)
    return o, np.stack(xks), np.stack(xvs)


def ref_scan64(fq, zk, zv, lam, b, c, x0k, x0v, *, conj, resets):
    H, M = lam.shape
    cm = jnp.broadcast_to(jnp.eye(M, dtype=jnp.complex128), (H, M, M)) if c is None else c

    def one(fq, zk, zv, rs, xk, xv):
        def step(carry, xs):
            xk, xv = carry
            q, k, v, r = xs
            xk = jnp.where(r, 0, xk)
            xv = jnp.where(r, 0, xv)
            xk = lam[:, :, None] * xk + b[:, :, None] * k[:, None, :]
            xv = lam[:, :, None] * xv + b[:, :, None] * v[:, None, :]
            p = jnp.einsum("hmr,hr->hm", cm @ xk, q)
            return (xk, xv), jnp.real(jnp.einsum("hm,hmd->hd", jnp.conj(p) if conj else p, cm @ xv))

        (xk, xv), o = jax.lax.scan(step, (xk, xv), (fq, zk, zv, rs))
        return o, xk, xv

    return jax.vmap(one)(fq, zk, zv, resets, x0k, x0v)


def x64():
    """float64 context across jax versions (jax.enable_x64 / jax.experimental.enable_x64)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64
    return enable_x64()


def rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def make_case(rng, B, T, H, R, D, M, with_c, with_x0, with_seg):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    cplx = lambda *s, sc=1.0: (sc * (rng.standard_normal(s) + 1j * rng.standard_normal(s))).astype(np.complex64)  # noqa: E731
    mag = np.exp(-rng.uniform(1e-6, 0.25, (H, M)))
    mag[0, 0], mag[-1, -1] = 1 - 1e-6, np.exp(-0.25)
    lam = (mag * np.exp(1j * rng.uniform(-np.pi, np.pi, (H, M)))).astype(np.complex64)
    b = cplx(H, M, sc=0.3)
    c = cplx(H, M, M, sc=0.4) if with_c else None
    x0 = (cplx(B, H, M, R, sc=0.3), cplx(B, H, M, D, sc=0.3)) if with_x0 else None
    seg = None
    if with_seg:
        seg = np.zeros((B, T), np.int32)
        seg[:, T // 5:] = 1
        seg[:, T // 2:] = 2
        seg[:, (3 * T) // 4:] = 1        # ids repeat: a fourth document
        seg[:, 128] = 7 if T > 130 else 0  # a one-token document at a chunk start
    return f(B, T, H, R), f(B, T, H, R), f(B, T, H, D), lam, b, c, x0, seg


def check_case(name, dtype, conj, B, T, H, R, D, M, L, with_c, with_x0, with_seg, tol, seed=0):
    from idattn.ops.pallas import interdomain_mix_pallas
    rng = np.random.default_rng(seed)
    fq, zk, zv, lam, b, c, x0, seg = make_case(rng, B, T, H, R, D, M, with_c, with_x0, with_seg)
    gpu = jax.devices()[0]
    cpu = jax.devices("cpu")[0]
    fq_d, zk_d, zv_d = (jax.device_put(jnp.asarray(x).astype(dtype), gpu) for x in (fq, zk, zv))
    fq64, zk64, zv64 = (np.asarray(x.astype(jnp.float32), np.float64) for x in (fq_d, zk_d, zv_d))
    go = rng.standard_normal((B, T, H, D)).astype(np.float32)
    gk = (rng.standard_normal((B, H, M, R)) + 1j * rng.standard_normal((B, H, M, R))).astype(np.complex64)
    gv = (rng.standard_normal((B, H, M, D)) + 1j * rng.standard_normal((B, H, M, D))).astype(np.complex64)
    x0k = np.zeros((B, H, M, R), np.complex64) if x0 is None else x0[0]
    x0v = np.zeros((B, H, M, D), np.complex64) if x0 is None else x0[1]
    seg_j = None if seg is None else jnp.asarray(seg)

    def f(fq, zk, zv, lam, b, c, a, v):
        o, (xk, xv) = interdomain_mix_pallas(fq, zk, zv, lam, b, c, conj=conj, chunk_size=L, segment_ids=seg_j,
                                             initial_state=(a, v), return_state=True, out_dtype=jnp.float32)
        return o, xk, xv

    @jax.jit
    def run(*args):
        out, vjp = jax.vjp(f, *args)
        return out, vjp((jnp.asarray(go), jnp.asarray(gk), jnp.asarray(gv)))

    t = time.time()
    (o, xk, xv), grads = run(fq_d, zk_d, zv_d, jnp.asarray(lam), jnp.asarray(b),
                             None if c is None else jnp.asarray(c), jnp.asarray(x0k), jnp.asarray(x0v))
    jax.block_until_ready(grads)
    t_gpu = time.time() - t
    o_ref, xk_ref, xv_ref = ref_numpy(fq64, zk64, zv64, lam.astype(complex), b.astype(complex),
                                      None if c is None else c.astype(complex), conj, seg,
                                      None if x0 is None else (x0k, x0v))
    resets = np.zeros((B, T), bool)
    if seg is not None:
        resets[:, 1:] = seg[:, 1:] != seg[:, :-1]
    with x64(), jax.default_device(cpu):
        a64 = (jnp.asarray(fq64), jnp.asarray(zk64), jnp.asarray(zv64), jnp.asarray(lam, jnp.complex128),
               jnp.asarray(b, jnp.complex128), None if c is None else jnp.asarray(c, jnp.complex128),
               jnp.asarray(x0k, jnp.complex128), jnp.asarray(x0v, jnp.complex128))
        _, vjp64 = jax.vjp(lambda *a: ref_scan64(*a, conj=conj, resets=jnp.asarray(resets)), *a64)
        g64 = vjp64((jnp.asarray(go, jnp.float64), jnp.asarray(gk, jnp.complex128),
                     jnp.asarray(gv, jnp.complex128)))
        g64 = [None if g is None else np.asarray(g) for g in g64]
    errs = {"o": rel(o, o_ref), "Xk": rel(xk, xk_ref), "Xv": rel(xv, xv_ref)}
    for n, g, gr in zip(["dfq", "dzk", "dzv", "dlam", "db", "dc", "dXk0", "dXv0"], grads, g64):
        if gr is not None and g is not None:
            errs[n] = rel(np.asarray(g), gr)
    worst = max(errs.values())
    status = "PASS" if worst <= tol else "FAIL"
    msg = (f"{status} {name}: worst {worst:.2e} (tol {tol:g}; gpu compile+run {t_gpu:.1f}s) "
           + " ".join(f"{k}={v:.1e}" for k, v in errs.items()))
    log(msg)
    SUMMARY.append(msg)
    return status == "PASS"


def check_vs_chunked(shape, T, tokens, dtype=jnp.bfloat16):
    """pallas vs the XLA chunked path at a benchmark shape (forward and input gradients)."""
    from idattn.bench.op import make_inputs
    from idattn.ops import interdomain_mix
    H, dh, M = shape
    B = tokens // T
    fq, zk, zv, lam, b, _ = make_inputs(B, T, H, dh, M, dtype)
    g = jax.random.normal(jax.random.PRNGKey(3), (B, T, H, dh), jnp.float32)

    def vg(impl, cast):
        def loss(fq, zk, zv, lam, b):
            o = interdomain_mix(fq.astype(cast), zk.astype(cast), zv.astype(cast), lam, b, impl=impl, chunk_size=64)
            return jnp.sum(o.astype(jnp.float32) * g), o
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))

    (_, o1), g1 = vg("pallas", dtype)(fq, zk, zv, lam, b)
    (_, o2), g2 = vg("chunked", jnp.float32)(fq, zk, zv, lam, b)
    errs = {"o": rel(o1.astype(jnp.float32), o2)}
    for n, a, r in zip(["dfq", "dzk", "dzv", "dlam", "db"], g1, g2):
        errs[n] = rel(np.asarray(a).astype(np.complex128 if np.iscomplexobj(r) else np.float64), np.asarray(r))
    worst = max(errs.values())
    msg = (f"{'PASS' if worst < 3e-2 else 'FAIL'} pallas({jnp.dtype(dtype).name}) vs chunked(f32) at {shape} T={T} "
           f"B={B}: " + " ".join(f"{k}={v:.1e}" for k, v in errs.items()))
    log(msg)
    SUMMARY.append(msg)


def probe_tuning(shapes, T=1024, tokens=65536):
    """Compile (no run) fwd+bwd at the benchmark tiles under each Triton tuning until one compiles for every
    shape (shared-memory / register limits are only known to the device compiler); keep the first that does."""
    from idattn.bench.op import mixer_fn
    from idattn.ops.pallas import gpu as G
    cands = [dict(G.TUNING), {"fwd": (4, 1), "fwd_big": (8, 1), "scan": (4, 1), "bwd": (8, 1)},
             {"fwd": (8, 1), "fwd_big": (8, 1), "scan": (4, 1), "bwd": (4, 1)}]
    for cand in cands:
        G.TUNING.clear()
        G.TUNING.update(cand)
        ok = True
        for (H, dh, M) in shapes:
            B = tokens // T
            sds = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt)  # noqa: E731
            args = (sds(B, T, H, dh), sds(B, T, H, dh), sds(B, T, H, dh), sds(H, M, dt=jnp.complex64),
                    sds(H, M, dt=jnp.complex64), None, sds(B, T, H, dh, dt=jnp.float32))
            t = time.time()
            try:
                jax.jit(mixer_fn("pallas", "fwdbwd", 64, False)).lower(*args).compile()
                log(f"probe tuning {cand} at {(H, dh, M)}: compiles ({time.time() - t:.1f}s)")
            except Exception as e:
                ok = False
                log(f"probe tuning {cand} at {(H, dh, M)}: FAILS {type(e).__name__}: {str(e)[:600]}")
                break
        if ok:
            return cand
    G.TUNING.clear()
    G.TUNING.update(cands[0])
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--budget-s", type=float, default=360.0, help="total wall-clock budget of this script")
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--skip-table", action="store_true")
    p.add_argument("--shapes", default="16,128,32;32,64,64", help="(H,d_h,M) list for the table")
    p.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    p.add_argument("--tokens", type=int, default=65536)
    a = p.parse_args()
    global _LOGFILE
    if os.environ.get("OUT"):
        _LOGFILE = open(os.path.join(os.environ["OUT"], "gpu_check.log"), "w")
    deadline = T0 + a.budget_s
    log(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
    try:
        from idattn.ops.pallas import pallas_available
        log(f"pallas_available() = {pallas_available()}")
    except Exception as e:
        log(f"cannot import idattn.ops.pallas: {type(e).__name__}: {e}")

    shapes = [tuple(int(x) for x in sh.split(",")) for sh in a.shapes.split(";")]
    if jax.default_backend() == "gpu":
        log("=== compile probe (Triton tuning) ===")
        tun = probe_tuning(shapes)
        log(f"using tuning {tun}")
        SUMMARY.append(f"triton tuning (num_warps, num_stages): {tun}")

    if not a.skip_check:
        log("=== (a) correctness vs float64 references (CPU) ===")
        cases = [
            ("f32 conj c seg x0 R=D=96 T=300", jnp.float32, True, 2, 300, 2, 96, 96, 8, 64, True, True, True, 1e-4),
            ("f32 plain conj=False T=256", jnp.float32, False, 2, 256, 2, 64, 64, 16, 64, False, False, False, 1e-4),
            ("bf16 conj=False c seg x0 (16,128,32)-heads T=1000", jnp.bfloat16, False, 1, 1000, 2, 128, 128, 32,
             64, True, True, True, 2e-2),
            ("bf16 conj c seg x0 R=D=96 T=300", jnp.bfloat16, True, 2, 300, 2, 96, 96, 8, 64, True, True, True, 2e-2),
        ]
        for i, cs in enumerate(cases):
            if time.time() > T0 + 0.35 * a.budget_s:
                log(f"skip {cs[0]} (time budget: the table comes first)")
                continue
            try:
                check_case(*cs, seed=i)
            except Exception as e:
                log(f"ERROR {cs[0]}: {type(e).__name__}: {str(e)[:2000]}")
                SUMMARY.append(f"ERROR {cs[0]}: {type(e).__name__}: {str(e)[:300]}")
                traceback.print_exc(limit=3)
        for (shape, T, tok) in (((16, 128, 32), 65536, 65536),):
            try:
                check_vs_chunked(shape, T, tok)
            except Exception as e:
                log(f"ERROR pallas vs chunked T={T}: {type(e).__name__}: {str(e)[:1000]}")
                SUMMARY.append(f"ERROR pallas vs chunked T={T}: {type(e).__name__}: {str(e)[:300]}")

    if not a.skip_table:
        from idattn.bench import op as bop
        log("=== (b) operator table: pallas vs cuDNN causal attention, bf16, 65,536 tokens/batch ===")
        rows = []
        seqs = [int(x) for x in a.seqs.split(",")]
        for shape in shapes:
            for T in seqs:
                rows += bop.bench_case(shape, T, a.tokens, ["pallas"], ["fwd", "fwdbwd"], jnp.bfloat16,
                                       repeats=10, warmup=2, deadline=deadline - 60)
        log("\n" + bop.format_table(rows))
        rows2 = []
        log("=== pallas variants at (16, 128, 32), fwd+bwd: save_states=True, chunk 128 ===")
        for T in [t for t in (4096, 16384) if t in seqs] or seqs[-1:]:
            rows2 += bop.bench_case(shapes[0], T, a.tokens, ["pallas"], ["fwdbwd"], jnp.bfloat16, repeats=10,
                                    attention=False, deadline=deadline - 40, pallas_kwargs={"save_states": True},
                                    label="pallas+save")
            rows2 += bop.bench_case(shapes[0], T, a.tokens, ["pallas"], ["fwdbwd"], jnp.bfloat16, chunk=128,
                                    repeats=10, attention=False, deadline=deadline - 40, label="pallas L128")
        log("=== XLA chunked path (while the budget lasts) ===")
        for shape in shapes:
            for T in [t for t in (1024, 4096, 16384) if t in seqs] or seqs[:1]:
                rows2 += bop.bench_case(shape, T, a.tokens, ["chunked"], ["fwd", "fwdbwd"], jnp.bfloat16,
                                        repeats=5, warmup=1, attention=False, deadline=deadline - 20)
        attn_rows = [r for r in rows if r.impl == "attention"]
        log("\n" + bop.format_table(attn_rows + rows2))
        SUMMARY.append(bop.format_table(rows + rows2))
        if time.time() < deadline - 10:
            for shape in shapes:
                SUMMARY.extend(bop.bench_decode(shape, batches=(1, 64)))
    print("\n======================== SUMMARY ========================", flush=True)
    print(f"jax {jax.__version__} {jax.devices()}", flush=True)
    for line in SUMMARY:
        print(line, flush=True)
    log("done")


if __name__ == "__main__":
    main()
