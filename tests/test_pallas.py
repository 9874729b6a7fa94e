"""Fused Pallas kernels (idattn.ops.pallas) in interpret mode against independent float64 references.

The references are tests/op_reference.py's, independent of the library: the float64 NumPy loop (forward and
final state) and its float64 ``lax.scan`` twin under ``jax.enable_x64`` (for full gradients of every input). Shapes are tiny:
interpret mode executes the kernels op by op. One jit per case (outputs and the VJP of a random cotangent).
"""
import contextlib
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from idattn.ops.pallas import interdomain_mix_pallas, pallas_available
from tests.op_reference import document_resets, ref_loop, ref_scan64


# ------------------------------------------------------------------------------------------------ references


def ref_numpy(fq, zk, zv, lam, b, c, conj, seg, x0):
    """tests/op_reference.ref_loop in float64 / complex128: o [B,T,H,D], Xk [B,H,M,R], Xv [B,H,M,D]."""
    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    c128 = lambda x: None if x is None else np.asarray(x, np.complex128)  # noqa: E731
    o, (xk, xv) = ref_loop(f64(fq), f64(zk), f64(zv), c128(lam), c128(b), c128(c), conj,
                           None if seg is None else np.asarray(seg), None if x0 is None else tuple(map(c128, x0)))
    return o, xk, xv


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# ------------------------------------------------------------------------------------------------ cases


def _inputs(rng, B, T, H, R, D, M, with_c, with_x0, with_seg):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    cplx = lambda *s, sc=1.0: (sc * (rng.standard_normal(s) + 1j * rng.standard_normal(s))).astype(np.complex64)  # noqa: E731
    # decays from the bound exp(-0.25) to 1 - 1e-6, with phases
    mag = np.exp(-rng.uniform(1e-6, 0.25, (H, M)))
    mag[0, 0] = 1 - 1e-6
    mag[-1, -1] = np.exp(-0.25)
    lam = (mag * np.exp(1j * rng.uniform(-np.pi, np.pi, (H, M)))).astype(np.complex64)
    b = cplx(H, M, sc=0.3)
    c = cplx(H, M, M, sc=0.4) if with_c else None
    x0 = (cplx(B, H, M, R, sc=0.3), cplx(B, H, M, D, sc=0.3)) if with_x0 else None
    seg = None
    if with_seg:  # ids repeat later in the row ([.., 1, 2, 1]) and a reset lands right on a chunk start
        seg = np.zeros((B, T), np.int32)
        seg[0, 7:16] = 1
        seg[0, 16:] = 2
        seg[0, T - 5:] = 1
        if B > 1:
            seg[1, 1:] = 3
    return f(B, T, H, R), f(B, T, H, R), f(B, T, H, D), lam, b, c, x0, seg


def _run_case(family, dtype, conj, B, T, H, R, D, M, L, with_c, with_x0, with_seg, tol_fwd, tol_grad, seed=0,
              save_states=False):
    rng = np.random.default_rng(seed)
    fq, zk, zv, lam, b, c, x0, seg = _inputs(rng, B, T, H, R, D, M, with_c, with_x0, with_seg)
    fq_d, zk_d, zv_d = (jnp.asarray(x).astype(dtype) for x in (fq, zk, zv))
    # the references see exactly the (rounded) inputs the kernels see
    fq64, zk64, zv64 = (np.asarray(x.astype(jnp.float32), np.float64) for x in (fq_d, zk_d, zv_d))

    # cotangents
    go = rng.standard_normal((B, T, H, D)).astype(np.float32)
    gk = (rng.standard_normal((B, H, M, R)) + 1j * rng.standard_normal((B, H, M, R))).astype(np.complex64)
    gv = (rng.standard_normal((B, H, M, D)) + 1j * rng.standard_normal((B, H, M, D))).astype(np.complex64)

    seg_j = None if seg is None else jnp.asarray(seg)
    x0k = jnp.zeros((B, H, M, R), jnp.complex64) if x0 is None else jnp.asarray(x0[0])
    x0v = jnp.zeros((B, H, M, D), jnp.complex64) if x0 is None else jnp.asarray(x0[1])

    def f_pallas(fq, zk, zv, lam, b, c, x0k, x0v):
        o, (xk, xv) = interdomain_mix_pallas(
            fq, zk, zv, lam, b, c, conj=conj, chunk_size=L, segment_ids=seg_j, initial_state=(x0k, x0v),
            return_state=True, out_dtype=jnp.float32, interpret=True, family=family,
            save_states=save_states)
        return o, xk, xv

    @jax.jit
    def run(*args):
        out, vjp = jax.vjp(f_pallas, *args)
        return out, vjp((jnp.asarray(go), jnp.asarray(gk), jnp.asarray(gv)))

    args = (fq_d, zk_d, zv_d, jnp.asarray(lam), jnp.asarray(b), None if c is None else jnp.asarray(c), x0k, x0v)
    (o, xk, xv), grads = run(*args)

    # forward against the numpy float64 loop
    o_ref, xk_ref, xv_ref = ref_numpy(fq64, zk64, zv64, lam, b, c, conj, seg,
                                      None if x0 is None else (np.asarray(x0k), np.asarray(x0v)))
    errs = {"o": _rel(o, o_ref), "Xk": _rel(xk, xk_ref), "Xv": _rel(xv, xv_ref)}
    for k, e in errs.items():
        assert e <= tol_fwd, f"{family}/{dtype.__name__}: forward {k} rel err {e:.3g} > {tol_fwd}"

    # gradients against the float64 scan
    with jax.enable_x64(True):
        resets = jnp.asarray(document_resets(seg, B, T))
        a64 = (jnp.asarray(fq64), jnp.asarray(zk64), jnp.asarray(zv64), jnp.asarray(lam, jnp.complex128),
               jnp.asarray(b, jnp.complex128), None if c is None else jnp.asarray(c, jnp.complex128),
               jnp.asarray(np.asarray(x0k), jnp.complex128), jnp.asarray(np.asarray(x0v), jnp.complex128))
        out64, vjp64 = jax.vjp(lambda *a: ref_scan64(*a, conj=conj, resets=resets), *a64)
        assert _rel(out64[0], o_ref) < 1e-10  # the two references agree
        g64 = vjp64((jnp.asarray(go, jnp.float64), jnp.asarray(gk, jnp.complex128), jnp.asarray(gv, jnp.complex128)))
        g64 = [None if g is None else np.asarray(g) for g in g64]
    names = ["fq", "zk", "zv", "lam", "b", "c", "Xk0", "Xv0"]
    for name, g, gr in zip(names, grads, g64):
        if gr is None:
            continue
        e = _rel(np.asarray(g).astype(np.complex128 if np.iscomplexobj(gr) else np.float64), gr)
        assert e <= tol_grad, f"{family}/{dtype.__name__}: grad {name} rel err {e:.3g} > {tol_grad}"
    return errs


def test_gpu_family_f32_everything_on(monkeypatch):
    """Segment resets (repeated ids, a reset at a chunk start), carried initial state, c, conj=True,
    T = 40 not a multiple of L = 16, R = D = 96 (padded to 128 inside), decays at the bound and near 1.
    The shared-memory limit is lowered to 50 KB so that the plan cuts the features: the backward kernels walk
    R = D = 128 in 4 sub-blocks of 32, fwd_o and the scans split into programs of 32 features; the mode block
    is lowered to 8 so that the backward kernels walk M = 16 (4 padded to 16) in 2 mode blocks, and fwd_p's state
    block to 16 x 64 so that it writes two partial sums of p, which fwd_mix adds. The GPU default path: the
    forward saves the chunk states, fwd_mix writes w (and p for the backward), the O-half's backward reads w and
    bwd_mix maps dw to dp and dK."""
    from idattn.ops.pallas import gpu, op
    monkeypatch.setattr(gpu, "smem_limit", lambda: 50_000)
    monkeypatch.setattr(gpu, "MODE_BLOCK", 8)
    monkeypatch.setitem(gpu.MAX_STATE, "fwd_p", 16 * 64)
    assert gpu._mode_blocks(16) == (2, 8)
    plans = dict(op._gpu_plans(gpu, 2, 16, 128, 128, 16, jnp.float32, True))
    assert (plans["bwd_o"].block, plans["bwd_p"].block, plans["fwd_o"].block, plans["fwd_p"].block) == (
        32, 32, 32, 64), plans
    assert all(p.smem <= 50_000 for p in plans.values())
    _run_case("gpu", jnp.float32, True, B=2, T=40, H=1, R=96, D=96, M=4, L=16,
              with_c=True, with_x0=True, with_seg=True, tol_fwd=1e-4, tol_grad=1e-4, save_states=True)


@pytest.mark.parametrize("yx_in_scan", [False, True])
def test_gpu_family_dlam_sums_and_chained_scans_and_mode_blocks(monkeypatch, yx_in_scan):
    """The dlamL sums keep·Σ_n Y∘conj(X) formed in bwd_o / bwd_p (YX_IN_SCAN off) or in the adjoint scans from
    the forward's states (on: a chunk with a reset reads its state as zeros, a masked load), with every scan's
    product as the state's accumulator (SCAN_UNCHAINED_MAX_STATE = 0; the test shapes are otherwise small enough
    for the unchained form), and the backward in four mode blocks of 4 (M = 8 padded to 16: real modes in two
    blocks): with the sums in the kernels a program per block (SPLIT_MODE_BLOCKS, the default), each carrying its
    block's raw sums, and without the held tables (the form scripts/gpu_check.py (b1) times); with the sums in
    the scans one program folding every block in every chunk (SPLIT_MODE_BLOCKS off). lam's gradient and all
    others against float64, segment resets included."""
    from idattn.ops.pallas import gpu
    monkeypatch.setattr(gpu, "YX_IN_SCAN", yx_in_scan)
    monkeypatch.setattr(gpu, "SCAN_UNCHAINED_MAX_STATE", 0)
    monkeypatch.setattr(gpu, "MODE_BLOCK", 4)
    if yx_in_scan:
        monkeypatch.setattr(gpu, "SPLIT_MODE_BLOCKS", False)
    else:
        monkeypatch.setattr(gpu, "HOLD_TABLES", False)
        monkeypatch.setattr(gpu, "BWD_HELD", ())
    assert gpu._mode_blocks(16) == (4, 4)
    _run_case("gpu", jnp.float32, False, B=2, T=48, H=2, R=32, D=32, M=8, L=16,
              with_c=True, with_x0=True, with_seg=True, tol_fwd=1e-4, tol_grad=1e-4, save_states=True)


@pytest.mark.parametrize("case", ["one block, bf16", pytest.param("split", marks=pytest.mark.slow),
                                  pytest.param("separate dots", marks=pytest.mark.slow),
                                  pytest.param("M = 64", marks=pytest.mark.slow)])
def test_gpu_family_backward_planes_side_by_side(monkeypatch, case):
    """bwd_o / bwd_p with the complex planes side by side (gpu.MERGED_PLANES, C.Stacked), where the other tests
    do not reach: one mode block without segments in bf16 (em·Pe read whole, not as a masked load), a program per
    mode block without segments (M = 8 padded to 16 in four blocks of 4), the flag off with the per-token
    factors on (two dots per sum over the planes), and M = 64 with c (bwd_mix's dw·Kᴴ as two dots from M = 64;
    two mode blocks of 32, phase 1 in block 0's program). Every gradient against float64."""
    from idattn.ops.pallas import _chunk as C
    from idattn.ops.pallas import gpu
    made = []
    real = C.Stacked
    monkeypatch.setattr(C, "Stacked", lambda *a, **k: made.append(1) or real(*a, **k))
    if case == "split":
        monkeypatch.setattr(gpu, "MODE_BLOCK", 4)
    if case == "separate dots":
        monkeypatch.setattr(gpu, "MERGED_PLANES", False)
    dtype, tol = (jnp.bfloat16, 2e-2) if case == "one block, bf16" else (jnp.float32, 1e-4)
    _run_case("gpu", dtype, case != "separate dots", B=2, T=40, H=1, R=16, D=16,
              M={"split": 8, "M = 64": 64}.get(case, 4),
              L=16, with_c=True, with_x0=case == "separate dots", with_seg=case == "separate dots", tol_fwd=tol,
              tol_grad=tol, seed=6, save_states=True)  # seed 5: lam's bf16 gradient at 2.4e-2, merged or not
    assert bool(made) == (case != "separate dots"), made


def test_gpu_plan_refuses_what_cannot_fit():
    """No block fits: one line naming the kernel, the shape, the bytes and the limit, with the fix."""
    from idattn.ops.pallas import gpu
    with pytest.raises(ValueError, match=r"GPU kernel bwd_o: no feature block fits at L=64, M=64.*needs ~\d+ B.*"
                                         r"allows 1000 B.*chunk_size"):
        gpu.choose("bwd_o", n=128, bh=1, L=64, M=64, in_bytes=4, mode_bytes=4, state_bytes=4, limit=1000)


def test_gpu_mask_from_document_starts_is_the_document_mask():
    """The GPU kernels mask a chunk with s_i <= j <= i (s_i where row i's document starts in the chunk,
    gpu.doc_starts) instead of i >= j and d_i == d_j: the same [L, L] mask for every chunk, with documents that
    start mid-chunk, at a chunk's first token, span chunks, and repeated ids that start new documents."""
    from idattn.ops.pallas import _chunk as C
    from idattn.ops.pallas import gpu, op
    rng = np.random.default_rng(3)
    B, T, L = 3, 64, 16
    seg = np.cumsum(rng.random((B, T)) < 0.15, axis=1) % 3  # ids repeat: 0, 1, 2, 0, ...
    seg[1] = 5  # one document throughout
    seg[2, 16:] = seg[2, 15] + 1  # a document starting exactly at a chunk boundary
    doc, *_ = op._segment_arrays(jnp.asarray(seg, jnp.int32), B, T, T, L)
    starts = gpu.doc_starts(doc, L)
    for bi in range(B):
        for c in range(T // L):
            d, st = doc[bi, c * L:(c + 1) * L], starts[bi, c * L:(c + 1) * L]
            np.testing.assert_array_equal(C.causal_mask(L, start=st), C.causal_mask(L, d), err_msg=f"{bi} {c}")
    assert int(starts.max()) > 0  # some document starts mid-chunk


def test_gpu_dot2_is_plain_outside_the_triton_lowering():
    """C.dot2 (a·b ± c·d; inline PTX fused multiply-adds while gpu._call traces a kernel for Triton) computes
    plainly everywhere else, and the hook is restored after a kernel is traced."""
    from idattn.ops.pallas import _chunk as C
    from idattn.ops.pallas import gpu
    a, b, c, d = (jnp.asarray(np.random.default_rng(i).normal(size=(4, 3)), jnp.float32) for i in range(4))
    assert C.DOT2 is None
    np.testing.assert_allclose(C.dot2(a, b, c, d), a * b + c * d, rtol=1e-6)
    np.testing.assert_allclose(C.dot2(a, b, c, d, sub=True), a * b - c * d, rtol=1e-6)
    seen = []
    gpu._with_fma(lambda: seen.append(C.DOT2))()
    assert seen == [gpu._ptx_dot2] and C.DOT2 is None
    # non-float32 operands never reach the inline assembly (its constraints are .f32 registers)
    np.testing.assert_allclose(gpu._ptx_dot2(a.astype(jnp.bfloat16), b, c, d, True),
                               (a.astype(jnp.bfloat16) * b - c * d), rtol=1e-2)


def test_gpu_inline_ptx_is_nvidia_only(monkeypatch):
    """The kernels' inline PTX (C.dot2, Masks.apply) is traced only for CUDA: the ROCm branch of the dispatch traces
    them with plain arithmetic (Triton's AMD backend takes no PTX), and gpu._call then hands pallas_call the kernel
    as written."""
    from idattn.ops.pallas import _chunk as C
    from idattn.ops.pallas import gpu, op
    seen = []
    op._gpu_branch(lambda *a, **k: seen.append(("rocm", gpu.INLINE_PTX, k)), None, "rocm")(1)
    op._gpu_branch(lambda *a, **k: seen.append(("cuda", gpu.INLINE_PTX, k)), None, "cuda")(1)
    assert seen == [("rocm", False, dict(family="gpu", interpret=False)),
                    ("cuda", True, dict(family="gpu", interpret=False))] and gpu.INLINE_PTX
    got = []
    monkeypatch.setattr(gpu.pl, "pallas_call", lambda kernel, **kw: got.append(kernel) or (lambda *a: None))

    def kernel():
        return C.DOT2

    gpu._call(kernel, None, (1,), False, None, "probe")
    with gpu.inline_ptx(False):
        gpu._call(kernel, None, (1,), False, None, "probe")
    assert got[0] is not kernel and got[0]() is gpu._ptx_dot2  # CUDA: traced with the PTX hook
    assert got[1] is kernel and got[1]() is None                 # ROCm: as written


def test_gpu_mix_kernels_fit_the_card_or_are_refused():
    """fwd_mix / bwd_mix take their stages from the card's shared memory: at M = 64 two on an H100 / H200 (227 KiB),
    one on a 99 KiB card where float32 would not fit two, and a one-line refusal naming the kernel, the shape, the
    bytes and the limit where one stage does not fit. Below M = 64 bwd_mix runs 4 warps at one stage by choice
    (gpu.MIX_TUNING_SMALL_M: two stages spilled)."""
    from idattn.ops.pallas import gpu
    small = gpu.mix_plan("bwd_mix", L=64, M=32, n_modes_in=2, mode_bytes=2, k_bytes=2, limit=227 * 1024)
    assert (small.num_warps, small.num_stages) == gpu.MIX_TUNING_SMALL_M == (4, 1)
    kw = dict(L=64, M=64, n_modes_in=2, mode_bytes=4, k_bytes=4)
    assert gpu.mix_plan("bwd_mix", limit=227 * 1024, **kw).num_stages == 2
    small = gpu.mix_plan("bwd_mix", limit=99 * 1024, **kw)
    assert small.num_stages == 1 and small.smem <= 99 * 1024
    assert gpu.mix_plan("fwd_mix", L=64, M=32, n_modes_in=1, mode_bytes=2, k_bytes=2, limit=99 * 1024).num_stages == 2
    with pytest.raises(ValueError, match=r"GPU kernel fwd_mix: does not fit at L=64, M=64: ~\d+ B .*allows 50000 B"):
        gpu.mix_plan("fwd_mix", limit=50_000, **dict(kw, n_modes_in=1))


@pytest.mark.slow  # 11 s of the default suite's budget; CI's slow pass runs it
@pytest.mark.parametrize("prescaled", [True, False])
def test_gpu_family_f32_plain_conj_false(monkeypatch, prescaled):
    """No c, no segments, no initial state, conj=False, T = 37, two heads; the forward keeps its
    chunk-boundary states for the backward (save_states=True) instead of recomputing them. The adjoint scans
    read their per-token factor formed in XLA (op.GPU_PRESCALED_SCAN, the default) or form it themselves."""
    from idattn.ops.pallas import op
    monkeypatch.setattr(op, "GPU_PRESCALED_SCAN", prescaled)
    _run_case("gpu", jnp.float32, False, B=1, T=37, H=2, R=8, D=16, M=4, L=16,
              with_c=False, with_x0=False, with_seg=False, tol_fwd=1e-4, tol_grad=1e-4, seed=1, save_states=True)


@pytest.mark.parametrize("save_states", [pytest.param(False, marks=pytest.mark.slow), True])  # budget: CI 12.5 s
def test_gpu_family_bf16(monkeypatch, save_states):
    """bf16 inputs/outputs path (bf16 matmul operands, fp32 state and accumulation), with c: the backward either
    recomputes the chunk states or reads the saved ones; it reads the forward's w (bf16) either way. The backward's
    chunk groups are forced to 2 chunks per program (3 chunks: groups [0, 2) and a partial [2, 3))."""
    from idattn.ops.pallas import gpu
    monkeypatch.setattr(gpu, "BWD_TARGET_PROGRAMS", 3)
    assert gpu._groups(2, 1, 3) == (2, 2)
    _run_case("gpu", jnp.bfloat16, True, B=2, T=40, H=1, R=16, D=16, M=4, L=16,
              with_c=True, with_x0=True, with_seg=True, tol_fwd=2e-2, tol_grad=2e-2, seed=2,
              save_states=save_states)


@pytest.mark.parametrize("dtype,save_states", [(jnp.float32, True),
                                               pytest.param(jnp.bfloat16, False, marks=pytest.mark.slow)])
def test_gpu_family_chunk_parallel_forward(monkeypatch, dtype, save_states):
    """The long-T forward (op.GPU_PARALLEL_FWD_MIN_T lowered to 0): scan_fwd carries the states (and the final
    one), fwd_p / fwd_o read every chunk's state in programs of 2 chunks (3 chunks: a full group and a partial
    one; fwd_o's features in 2 blocks, so the chunk-group and feature-block grid axes are both walked); the
    backward reads those states (save_states) or recomputes them. Segment resets, carried state, c, conj."""
    from idattn.ops.pallas import gpu, op
    monkeypatch.setattr(op, "GPU_PARALLEL_FWD_MIN_T", 0)
    monkeypatch.setattr(gpu, "BWD_TARGET_PROGRAMS", 3)
    monkeypatch.setattr(gpu, "smem_limit", lambda: 50_000)
    seen = []
    real = gpu._readout
    monkeypatch.setattr(gpu, "_readout", lambda kind, *a, **k: seen.append(kind) or real(kind, *a, **k))
    tol = 1e-4 if dtype == jnp.float32 else 2e-2
    _run_case("gpu", dtype, True, B=2, T=40, H=1, R=96, D=96, M=4, L=16, with_c=True, with_x0=True,
              with_seg=True, tol_fwd=tol, tol_grad=tol, seed=4, save_states=save_states)
    assert {"fwd_p", "fwd_o"} <= set(seen), seen


@pytest.mark.parametrize("dtype,with_c,conj,parallel", [
    (jnp.float32, True, True, True),
    pytest.param(jnp.float32, False, True, False, marks=pytest.mark.slow),
    pytest.param(jnp.bfloat16, True, False, False, marks=pytest.mark.slow),
    pytest.param(jnp.bfloat16, False, False, True, marks=pytest.mark.slow)])
def test_gpu_family_fused_factors(monkeypatch, dtype, with_c, conj, parallel):
    """The per-token factors formed inside the kernels (op.GPU_FUSED_FACTORS, the default): fwd_mix writes fwd_o's
    (q, u) beside w (with c) or from p alone (without c: it then runs for the factors only), so XLA's passes
    prescale_fwd_o and, with c, prescale_rev(dp) do not run; the backward's O-half scan reads conj(u) from the
    same tensor, bwd_o reads q from it instead of w (which the forward no longer writes), and bwd_mix writes dp's
    two factors beside dp (the P-half scan's and bwd_p's, which bwd_p reads instead of dp; without c XLA's
    prescale_p forms them). The serial and the chunk-parallel forward;
    segment resets, carried state, conj both ways, 3 chunks in groups of 2; forward and every gradient against the
    float64 references."""
    from idattn.ops.pallas import gpu, op
    monkeypatch.setattr(op, "GPU_PARALLEL_FWD_MIN_T", 0 if parallel else 1 << 30)
    monkeypatch.setattr(gpu, "BWD_TARGET_PROGRAMS", 3)
    calls = []

    def spy(name, tag=None):
        real = getattr(gpu, name)
        monkeypatch.setattr(gpu, name, lambda *a, **k: calls.append(
            name + ("+factors" if tag and k.get(tag) is not None else "")) or real(*a, **k))
    for name in ("prescale_fwd_o", "prescale_rev", "prescale_p", "scan_fwd"):
        spy(name)
    spy("fwd_mix", "tabs")
    spy("bwd_mix", "tabs")
    spy("bwd_o", "factors")
    spy("bwd_p", "factors")
    tol = 1e-4 if dtype == jnp.float32 else 2e-2
    _run_case("gpu", dtype, conj, B=2, T=40, H=1, R=16, D=16, M=4, L=16, with_c=with_c, with_x0=True,
              with_seg=True, tol_fwd=tol, tol_grad=tol, seed=5, save_states=True)
    # without c, bwd_o writes dp, and dp's factors are XLA's prescale_p(dp)
    expect = (["scan_fwd"] if parallel else []) + ["fwd_mix+factors"] + (["scan_fwd"] if parallel else []) + (
        ["bwd_o+factors", "bwd_mix+factors"] if with_c else ["bwd_o+factors", "prescale_p"]) + ["bwd_p+factors"]
    assert calls == expect, calls


@pytest.mark.slow
def test_tpu_family_f32(monkeypatch):
    """The Mosaic kernels compute the same function: conj=False, two rows, T = 40 (3 chunks of 16) in time blocks
    of one chunk each (the state crosses every grid step). tests/test_pallas_tpu.py has the default-suite case."""
    from idattn.ops.pallas import tpu
    monkeypatch.setattr(tpu, "T_BLOCK", 32)
    _run_case("tpu", jnp.float32, False, B=2, T=40, H=1, R=8, D=8, M=4, L=16,
              with_c=True, with_x0=True, with_seg=True, tol_fwd=1e-4, tol_grad=1e-4, seed=3)


# ------------------------------------------------------------------------------------------------ lowering


def _lower(platform, family):
    B, T, H, R, D, M = 1, 128, 2, 96, 96, 16
    fq = jnp.zeros((B, T, H, R), jnp.bfloat16)
    zv = jnp.zeros((B, T, H, D), jnp.bfloat16)
    lam = jnp.full((H, M), 0.9 + 0.1j, jnp.complex64)
    c = jnp.ones((H, M, M), jnp.complex64)
    seg = jnp.zeros((B, T), jnp.int32)

    def loss(fq, zk, zv, lam, b, c):
        o, (xk, _) = interdomain_mix_pallas(fq, zk, zv, lam, b, c, conj=True, chunk_size=64, segment_ids=seg,
                                            initial_state=None, return_state=True, out_dtype=None,
                                            interpret=False, family=family)
        return jnp.sum(o.astype(jnp.float32)) + jnp.sum(xk.real)

    # value and gradients, as the trainer takes them: under jax.grad alone jax >= 0.12 drops the forward's output
    # kernel, whose value the gradient of this loss does not need
    g = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5))
    # jax >= 0.12 lowers a Triton kernel only for a known GPU: an abstract one here (no device, no plugin needed)
    gpu = jax.sharding.AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=gpu)) if (
            platform == "cuda") else contextlib.nullcontext():
        return jax.jit(g).trace(fq, fq, zv, lam, lam, c).lower(lowering_platforms=(platform,)).as_text()


def _kernel_names(txt: str) -> list[str]:
    """The idattn kernels in a lowered program: Triton's `name = "idattn_..."`, Mosaic's `kernel_name = ...`."""
    return sorted(re.findall(r'\b(?:kernel_)?name = "(idattn_\w+)"', txt))


# What the operator's design (idattn/ops/pallas/op.py) runs for forward + backward with a mixing matrix c, T below
# the GPU's chunk-parallel forward threshold: the forward's kernels, then the backward's, each exactly once.
#   GPU: fwd_p, fwd_mix (w = conj(p)·K, a kernel of its own), fwd_o; backward scan_rev_v, bwd_o on the saved w,
#        bwd_mix (dw -> dp, dK), scan_rev_k, bwd_p.
#   TPU: fwd_p, fwd_o (mixes p itself); backward scan_rev_v, bwd_o, scan_rev_k, bwd_p.
#   Unless the forward saved the chunk states, the backward recomputes them first: scan_fwd_v and scan_fwd_k.
_GPU_KERNELS = {"fwd_p", "fwd_mix", "fwd_o", "scan_rev_v", "bwd_o", "bwd_mix", "scan_rev_k", "bwd_p"}
_TPU_KERNELS = {"fwd_p", "fwd_o", "scan_rev_v", "bwd_o", "scan_rev_k", "bwd_p"}
_RECOMPUTE = {"scan_fwd_v", "scan_fwd_k"}


@pytest.mark.parametrize("family,save_states", [("gpu", None), ("gpu", False), ("tpu", None), ("tpu", True)])
def test_lowered_program_holds_exactly_the_kernels(family, save_states):
    """Forward + backward lower to the family's kernels and nothing else: Triton kernels for CUDA, Mosaic for TPU,
    on a CPU-only jaxlib (PTX / TPU compilation itself only happens on the device). save_states None is the
    family's default (GPU saves the chunk states, TPU recomputes them)."""
    from idattn.ops.pallas import op

    platform, prefix, call = {"gpu": ("cuda", "idattn_", "__gpu"), "tpu": ("tpu", "idattn_tpu_", "tpu_custom_call")}[
        family]
    prev = op.set_save_states(save_states)
    try:
        txt = _lower(platform, family)
    finally:
        op.set_save_states(prev)
    saves = {"gpu": True, "tpu": False}[family] if save_states is None else save_states  # documented defaults
    want = (_GPU_KERNELS if family == "gpu" else _TPU_KERNELS) | (set() if saves else _RECOMPUTE)
    got, want = _kernel_names(txt), sorted(prefix + k for k in want)
    extra = sorted(set(got) - set(want)) or got
    assert got == want, f"missing {sorted(set(want) - set(got))}, extra or repeated {extra}"
    assert f"custom_call @{call}" in txt


def test_bad_chunk_size_is_refused():
    x = jnp.zeros((1, 8, 1, 4))
    lam = jnp.full((1, 2), 0.9 + 0j, jnp.complex64)
    with pytest.raises(ValueError, match="chunk_size"):
        interdomain_mix_pallas(x, x, x, lam, lam, None, conj=True, chunk_size=24, segment_ids=None,
                               initial_state=None, return_state=False, out_dtype=None, family="gpu")


def test_auto_dispatch_and_chunk_sizes(monkeypatch):
    """impl='auto' takes the kernels exactly on a GPU/TPU backend: on a CPU-only host the kernel entry point is never
    called (patched to raise) and the output is the float64 loop's; on an accelerator it is called. The chunk
    lengths each kernel family takes are the documented ones (GPU: a power of two >= 16; TPU: a multiple of 8)."""
    from idattn.ops import interdomain_mix
    from idattn.ops import pallas as pallas_ops
    on_accel = any(d.platform in ("gpu", "cuda", "rocm", "tpu") for d in jax.devices())
    assert pallas_available() is on_accel
    calls = []
    real = pallas_ops.interdomain_mix_pallas

    def spy(*a, **k):
        if not on_accel:
            raise AssertionError("impl='auto' called the Pallas kernels on a CPU-only backend")
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(pallas_ops, "interdomain_mix_pallas", spy)
    rng = np.random.default_rng(6)
    fq, zk, zv, lam, b, c, _, seg = _inputs(rng, 1, 20, 1, 8, 8, 2, True, False, True)
    o = jax.jit(lambda *a: interdomain_mix(*a, impl="auto", chunk_size=16, segment_ids=seg))(fq, zk, zv, lam, b, c)
    o_ref, _, _ = ref_numpy(fq, zk, zv, lam, b, c, True, seg, None)
    assert _rel(o, o_ref) <= 1e-4
    assert len(calls) == int(on_accel)
    assert [L for L in range(1, 130) if pallas_ops.chunk_size_supported(L, "gpu")] == [16, 32, 64, 128]
    assert [L for L in range(1, 30) if pallas_ops.chunk_size_supported(L, "tpu")] == [8, 16, 24]


def test_dispatcher_impl_pallas_matches_float64_loop():
    """The lead's interdomain_mix(impl='pallas') routes here (interpret mode on CPU): against the float64 loop."""
    from idattn.ops import interdomain_mix
    rng = np.random.default_rng(5)
    fq, zk, zv, lam, b, c, x0, seg = _inputs(rng, 1, 20, 1, 8, 8, 2, True, False, False)
    o = jax.jit(lambda *a: interdomain_mix(*a, impl="pallas", chunk_size=16))(fq, zk, zv, lam, b, c)
    o_ref, _, _ = ref_numpy(fq, zk, zv, lam, b, c, True, None, None)
    assert _rel(o, o_ref) < 1e-4


def test_jax_without_triton_degrades_to_chunked_with_one_warning(monkeypatch):
    """A jax whose Pallas Triton backend is gone (deprecated from 0.11; Mosaic GPU cannot lower these kernels):
    lowering impl='pallas' for CUDA takes the XLA chunked operator with one RuntimeWarning (no Triton call, and
    never an unparameterised kernel handed to Mosaic GPU); the kernels called explicitly are refused with the fix;
    the CPU (interpret) path is unchanged and equals the float64 loop."""
    import warnings

    from idattn.ops import interdomain_mix
    from idattn.ops.pallas import gpu, op
    monkeypatch.setattr(gpu, "triton_params_class", lambda: None)
    monkeypatch.setattr(op, "_FALLBACK_WARNED", [])
    rng = np.random.default_rng(7)
    fq, zk, zv, lam, b, c, _, seg = _inputs(rng, 1, 32, 2, 8, 8, 4, True, False, True)
    f = lambda *a: interdomain_mix(*a, impl="pallas", chunk_size=16, segment_ids=seg)  # noqa: E731
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        txt = jax.jit(f).trace(fq, zk, zv, lam, b, c).lower(lowering_platforms=("cuda",)).as_text()
        jax.jit(lambda *a: f(*a) * 2).trace(fq, zk, zv, lam, b, c).lower(lowering_platforms=("cuda",))
    msgs = [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning) and "Triton" in str(w.message)]
    assert len(msgs) == 1 and "chunked" in msgs[0], msgs
    assert "triton" not in txt.lower()
    with pytest.raises(gpu.TritonUnavailable, match="impl='chunked'"):
        jax.jit(lambda *a: interdomain_mix_pallas(*a, conj=True, chunk_size=16, segment_ids=seg, interpret=False,
                                                  family="gpu")).trace(fq, zk, zv, lam, b, c).lower(
            lowering_platforms=("cuda",))
    o_ref, _, _ = ref_numpy(fq, zk, zv, lam, b, c, True, seg, None)
    assert _rel(jax.jit(f)(fq, zk, zv, lam, b, c), o_ref) <= 1e-4
