"""An experiment, not an implementation of the operator: the forward's carry scan written for Mosaic GPU.

Question it answers: is the Triton lowering what keeps the GPU kernels issue-bound (docs/kernels-results.md, "A
Mosaic GPU scan, compiled")? The cost model says the kernels' time is the instructions their warps issue, and
the issue lists a Mosaic GPU (``plgpu``: wgmma, TMA) port among the candidates. This is the smallest kernel with
the shape of the others: one program per (batch row, head, feature block) walks the chunks with the complex state
in registers, one tensor-core product per chunk.

Math, per batch row, head and block of N features (chunk c of length L, X_0 = 0):

    X_{c+1} = lam^L ∘ X_c + Peᵀ · Z_c        Pe[j, m] = b_m · lam_m^(L-1-j)       X_c ∈ C^{M×N}, Z_c ∈ R^{L×N}

and X_c (the state before chunk c) is written for every c, X_NC at the end: what ``idattn.ops.pallas.gpu.scan_fwd``
computes without segment resets. The two complex planes are two [M, N] wgmma accumulators (M = 64 rows: one
warpgroup's product), so the complex decay is elementwise between registers of the same thread; Peᵀ (per head,
both planes) sits in shared memory for the whole loop; Z arrives by TMA, two chunks in flight
(``plgpu.emit_pipeline``); the states leave by TMA.

Limits (it is a probe): LTI, no segment resets, zero initial state, M = 64, N a multiple of 64, bf16 operands.
jax 0.10.2's Mosaic GPU interpret mode runs neither ``pl.run_state`` nor ``layout_cast`` nor ``emit_pipeline``'s
predicated copies, so its values are checked on a device
(``check_and_time``, from ``scripts/gpu_check.py`` (b3), against the float64 ``reference``); on this host it is
compiled for sm_90a and read (``python -m idattn.aot.mosaic_gpu idattn.bench.mosaic_scan:factory``). Imports only
jax and numpy; ``plgpu`` is imported where the kernel is built (its API moves between jax releases).
"""
from __future__ import annotations

import inspect
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from idattn.bench import op as bop

F32 = jnp.float32


def tables(lam, b, L: int, dtype=jnp.bfloat16):
    """(peT [H, 2, M, L] in `dtype`: Peᵀ's real and imaginary planes, lamL [H, 2, M] float32: lam^L's) from lam, b
    [H, M] complex."""
    lam, b = jnp.asarray(lam, jnp.complex64), jnp.asarray(b, jnp.complex64)
    pe = b[:, None, :] * lam[:, None, :] ** jnp.arange(L - 1, -1, -1)[None, :, None]  # [H, L, M]
    pe_t = jnp.swapaxes(pe, 1, 2)
    lam_l = lam ** L
    return (jnp.stack([pe_t.real, pe_t.imag], 1).astype(dtype),
            jnp.stack([lam_l.real, lam_l.imag], 1).astype(F32))


def scan_fwd(z, pe_t, lam_l, *, L: int = 64, block_n: int = 64, steps: int = 2):
    """xs [B, H, NC, 2, M, N] (dtype of z): the state before every chunk; x_end [B, H, 2, M, N] float32.
    z [B, T, H, N]; pe_t, lam_l from ``tables``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415 (see the module docstring)

    B, T, H, N = z.shape
    M = pe_t.shape[2]
    if M != 64 or N % block_n or block_n % 64 or T % L or L % 64:
        raise ValueError(f"mosaic_scan is a probe for M = 64, N a multiple of {block_n}, L and T multiples of 64; "
                         f"got M={M}, N={N}, L={L}, T={T}")
    NC, NB = T // L, N // block_n
    swizzled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # what wgmma reads from SMEM
    wgmma = plgpu.Layout.WGMMA

    def entry(z_ref, pe_ref, lam_ref, xs_ref, end_ref, pe_smem, lam_smem, bars):
        bh, nb = lax.axis_index("bh"), lax.axis_index("nb")
        b, h = bh // H, bh % H
        plgpu.copy_gmem_to_smem(pe_ref.at[h], pe_smem, bars.at[0])
        plgpu.copy_gmem_to_smem(lam_ref.at[h], lam_smem, bars.at[1])
        plgpu.barrier_wait(bars.at[0])
        plgpu.barrier_wait(bars.at[1])
        # lam^L's planes as [M, block_n] in the accumulators' layout: row m of both planes in the same thread
        lr = lax.broadcast_in_dim(plgpu.layout_cast(lam_smem[0], wgmma.reduce(1)), (M, block_n), [0])
        li = lax.broadcast_in_dim(plgpu.layout_cast(lam_smem[1], wgmma.reduce(1)), (M, block_n), [0])
        zero = plgpu.layout_cast(jnp.zeros((M, block_n), F32), wgmma)

        def chunk(_, z_smem, xs_smem, carry):
            xr, xi = carry
            xs_smem[0] = xr.astype(xs_smem.dtype)
            xs_smem[1] = xi.astype(xs_smem.dtype)

            def product(acc):  # X <- lam^L ∘ X + Peᵀ·Z, the decayed state as the accumulator's start
                plgpu.wgmma(acc[0], pe_smem.at[0], z_smem)
                plgpu.wgmma(acc[1], pe_smem.at[1], z_smem)
            return pl.run_state(product)((plgpu.ACC.init(lr * xr - li * xi), plgpu.ACC.init(lr * xi + li * xr)))

        xr, xi = plgpu.emit_pipeline(
            chunk, grid=(NC,),
            in_specs=[plgpu.BlockSpec((None, L, None, block_n), lambda c: (b, c, h, nb), transforms=swizzled)],
            out_specs=[plgpu.BlockSpec((None, None, None, 2, M, block_n), lambda c: (b, h, c, 0, 0, nb))],
            max_concurrent_steps=steps, init_carry=(zero, zero))(z_ref, xs_ref)
        end_ref[b, h, 0, :, pl.ds(nb * block_n, block_n)] = xr
        end_ref[b, h, 1, :, pl.ds(nb * block_n, block_n)] = xi

    out = (jax.ShapeDtypeStruct((B, H, NC, 2, M, N), z.dtype), jax.ShapeDtypeStruct((B, H, 2, M, N), F32))
    return plgpu.kernel(entry, out_type=out, grid=(B * H, NB), grid_names=("bh", "nb"),
                        scratch_types=[plgpu.SMEM((2, M, L), pe_t.dtype, transforms=swizzled),
                                       plgpu.SMEM((2, M), F32), plgpu.Barrier(num_barriers=2)],
                        compiler_params=plgpu.CompilerParams())(z, pe_t, lam_l)


def xla_scan(z, pe_t, lam_l, *, L: int = 64):
    """The probe's chunk step in XLA (same tables, same outputs, float32 accumulation): what ``check_and_time``
    runs in a dry run on a host without a GPU, and what the tests hold against ``reference``."""
    B, T, H, N = z.shape
    pe = (pe_t[:, 0] + 1j * pe_t[:, 1].astype(F32)).astype(jnp.complex64)  # [H, M, L]
    decay = (lam_l[:, 0] + 1j * lam_l[:, 1]).astype(jnp.complex64)[None, :, :, None]
    chunks = jnp.moveaxis(z.astype(F32).reshape(B, T // L, L, H, N), 1, 0)

    def step(x, zc):
        return decay * x + jnp.einsum("hml,blhn->bhmn", pe, zc.astype(jnp.complex64)), x

    x_end, xs = lax.scan(step, jnp.zeros((B, H, pe.shape[1], N), jnp.complex64), chunks)
    xs = jnp.moveaxis(xs, 0, 2)
    return (jnp.stack([xs.real, xs.imag], 3).astype(z.dtype),
            jnp.stack([x_end.real, x_end.imag], 2).astype(F32))


# the probe at factory()'s shape compiled on a CPU host (python -m idattn.aot.mosaic_gpu
# idattn.bench.mosaic_scan:factory --json idattn/bench/mosaic_scan_kernel.json), for the cost model's prediction
KERNEL_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mosaic_scan_kernel.json")


def predicted_us(data: str = KERNEL_DATA) -> dict:
    """The cost model's time for the probe at ``factory()``'s shape (512 programs of one warpgroup, 64 chunks)
    beside its prediction for Triton's ``idattn_scan_fwd_k`` at (32, 64, 64) T = 4K: {"probe", "triton",
    "commit"} in us. Predictions, from kernels compiled on a CPU host."""
    from idattn.bench import gpu_model as G  # noqa: PLC0415 (numpy and json only; kept out of the kernel's import)
    with open(data) as f:
        record = json.load(f)
    [kernel] = record["kernels"].values()
    shape = dict(inspect.signature(factory).parameters)
    shape = {k: record.get("kwargs", {}).get(k, v.default) for k, v in shape.items()}  # the compiled case
    kc = G.launch_cost("mosaic_scan", kernel, programs=shape["B"] * shape["H"] * (shape["N"] // 64),
                       iterations=shape["T"] // shape["L"])
    c, _ = G.evaluate(G.load())
    triton = next((r for r in G.breakdown(G.load()[G.key("now", (32, 64, 64), 4096, 64, "fwd")], c)
                   if r["name"] == "idattn_scan_fwd_k"), None)
    if triton is None:
        raise KeyError("no idattn_scan_fwd_k in the collected (32, 64, 64) T=4096 forward")
    return {"probe": float(kc.features() @ c), "triton": triton["us"], "probe_per_sm": kc.occupancy,
            "triton_per_sm": triton["occupancy"], "commit": record.get("commit", "?")}


def reference(z, lam, b, L: int):
    """float64 NumPy, token by token: X_t = lam ∘ X_{t-1} + b ⊗ z_t. Returns (xs [B, H, NC, M, N] complex: the
    state before every chunk, x_end [B, H, M, N])."""
    z = np.asarray(z, np.float64)
    lam, b = np.asarray(lam, np.complex128), np.asarray(b, np.complex128)
    B, T, H, N = z.shape
    x = np.zeros((B, H, lam.shape[1], N), np.complex128)
    xs = []
    for t in range(T):
        if t % L == 0:
            xs.append(x.copy())
        x = lam[None, :, :, None] * x + b[None, :, :, None] * z[:, t, :, None, :]
    return np.stack(xs, 2), x


def factory(B: int = 16, T: int = 4096, H: int = 32, N: int = 64, M: int = 64, L: int = 64):
    """(fn, args) for ``idattn.aot.mosaic_gpu``: the scan at the 1.3B head shape's key half by default."""
    return (lambda z, pe_t, lam_l: scan_fwd(z, pe_t, lam_l, L=L),
            [jax.ShapeDtypeStruct((B, T, H, N), jnp.bfloat16), jax.ShapeDtypeStruct((H, 2, M, L), jnp.bfloat16),
             jax.ShapeDtypeStruct((H, 2, M), F32)])


def check_and_time(H: int = 32, N: int = 64, T: int = 4096, tokens: int = 65536, L: int = 64, repeats: int = 10,
                   check_rows: int = 1, scan=None) -> str:
    """On a GPU: the probe's states against ``reference`` (float64, on the first `check_rows` batch rows; bf16
    operands, so <= 2e-2 relative) and its time at B = tokens / T, as one line. ``scan``: another function of
    (z, pe_t, lam_l, L=) to check and time instead (``xla_scan`` in a dry run on a CPU)."""
    scan = scan or scan_fwd
    M, B = 64, max(1, tokens // T)
    z, lam, b = _inputs(B, T, H, N, M, seed=0)
    pe_t, lam_l = tables(lam, b, L)
    zb = z.astype(jnp.bfloat16)
    xs, x_end = jax.jit(lambda *a: scan(*a, L=L))(zb, pe_t, lam_l)
    ref_xs, ref_end = reference(np.asarray(zb[:check_rows].astype(F32)), lam, b, L)
    got = np.asarray(xs[:check_rows].astype(F32), np.float64)
    err = max(_rel(got[:, :, :, 0] + 1j * got[:, :, :, 1], ref_xs),
              _rel(np.asarray(x_end[:check_rows, :, 0]) + 1j * np.asarray(x_end[:check_rows, :, 1]), ref_end))
    ms, _ = bop.time_compiled(lambda *a: scan(*a, L=L), (zb, pe_t, lam_l), 2, repeats)
    verdict = "PASS" if err <= 2e-2 else "FAIL"
    what = ("Mosaic GPU scan probe" if scan is scan_fwd
            else f"{getattr(scan, '__name__', type(scan).__name__)} (in place of the probe)")
    try:
        p = predicted_us()
        model = (f"; model (a prediction, compiled at {p['commit']}, for (32, 64, 64) T=4096 65,536 tokens): "
                 f"probe {p['probe']:.0f} us ({p['probe_per_sm']} per SM), Triton scan_fwd_k {p['triton']:.0f} us "
                 f"({p['triton_per_sm']} per SM)")
    except (OSError, KeyError, ValueError) as e:
        model = f"; no model ({type(e).__name__}: {e})"
    return (f"(b3) {what} (H, N, M) = ({H}, {N}, {M}) T={T} B={B} bf16: {ms:.3f} ms "
            f"(median of {repeats}); states vs float64 max rel {err:.2e} {verdict} (<= 2e-2){model}")


def _rel(a, b) -> float:
    """max |a - b| / max |b|."""
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _inputs(B, T, H, N, M, seed=0):
    """z [B, T, H, N] float32, lam and b [H, M] complex128 (|lam| in [0.9, 0.999], phases up to 0.5)."""
    rng = np.random.default_rng(seed)
    z = jnp.asarray(rng.standard_normal((B, T, H, N)), F32)
    lam = rng.uniform(0.9, 0.999, (H, M)) * np.exp(1j * rng.uniform(0, 0.5, (H, M)))
    b = (rng.standard_normal((H, M)) + 1j * rng.standard_normal((H, M))) * np.sqrt(1 - np.abs(lam) ** 2)
    return z, lam, b
