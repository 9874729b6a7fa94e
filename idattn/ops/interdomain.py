r"""The Interdomain operator: keys and values projected onto one shared complex diagonal S4D basis.

Per batch row and head, with feature width R, value width D and M complex modes:

    state    Xk_t = lam ⊙ Xk_{t-1} + b ⊗ zk_t            ∈ C^{M×R}
             Xv_t = lam ⊙ Xv_{t-1} + b ⊗ zv_t            ∈ C^{M×D}
    coeffs   U_t = c·Xk_t,  Γ_t = c·Xv_t                  (c ∈ C^{M×M}; None means identity)
    readout  p_t = U_t · fq_t ∈ C^M
             o_t = Re( Σ_m conj(p_t[m]) Γ_t[m, :] )        conj=True  (default: Re(ξ(q)ᵀ U^H Γ))
             o_t = Re( Σ_m      p_t[m]  Γ_t[m, :] )        conj=False (Re(ξ(q)ᵀ Uᵀ Γ))

The state includes token t. One recurrence (one lam, one b) serves both halves: the shared basis.

Folding c. Because U = c·Xk and Γ = c·Xv, with p0_t = Xk_t · fq_t (the raw-state projection),

    o_t = Re( conj(p0_t)ᵀ (c^H c) Xv_t )   (conj)        o_t = Re( p0_tᵀ (cᵀ c) Xv_t )   (no conj)

so c enters as one M×M matrix K per head and every carried state stays raw. The sequential and associative
paths apply c literally (U = c·Xk, Γ = c·Xv) and so check the fold.

Segment resets. `segment_ids` [B, T]: where seg[t] != seg[t-1] a new document starts and the state is zeroed
before token t enters. Ids may repeat ([1, 2, 1] is three documents), so every path works with the document index
d_t = cumsum(seg[t] != seg[t-1]) (d_0 = 0), never with equality of raw ids. `initial_state` applies to the first
document only.

Chunked form (chunk length L, local positions i, j ∈ [0, l) with l the chunk's true length, μ = (l-1)/2). lam is
time invariant, so every decay factor is a constant table computed from log(lam) (principal branch) times integer
exponents:

    Pin[i,m] = lam^(i+1)    Pt[i,m] = lam^(i-μ)    Ps[j,m] = b·lam^(μ-j)    Pe[j,m] = b·lam^(l-1-j)
    G   = mask(FQ · ZKᵀ)                                        L×L, shared by all modes
    p0  = Pt ∘ (G · Ps) + carried ∘ Pin ∘ (FQ · Xk0ᵀ)           L×M complex (p0[i] = Xk_t · fq_t)
    w   = conj(p0) · K   (conj)      or   p0 · K                K = c^H c or cᵀ c (identity c: w = conj(p0) or p0)
    o   = carried ∘ Re((w ∘ Pin) · Xv0) + mask(Re((w ∘ Pt) · Psᵀ)) · ZV
    Xk1 = [no reset in chunk] lam^l ∘ Xk0 + Peᵀ · (last_doc ∘ ZK)      (same for Xv1 with ZV)

`mask` keeps i ≥ j within one document (d_i == d_j), applied with `where` (never by multiplying: 0·inf = NaN);
`carried` keeps positions before the first reset of the chunk; `last_doc` keeps the tokens of the chunk's last
document. A last chunk shorter than L is computed with its true length l (zero padding would decay the returned
state by lam^pad). Every product is a real matmul: complex values travel as stacked real and imaginary planes.

Numerics: μ-centred tables reach |lam|^-(L-1)/2 in magnitude, so the chunk length is limited by the decay bound
(`idattn.ops.s4d.max_chunk_size`): with κ = 0.25 in float32, L ≤ 178. A lam outside |lam| < 1, or too small for
the chunk size, is refused when concrete. State and accumulation run in float32/complex64 (float64/complex128
when the inputs are float64 under x64); matmuls use precision=HIGHEST.

Cost per token-head (real MACs, complex counted as real planes): L(R+D) + 4M(L+R+D) + 4M² (R=D=M=L=64: ~74K;
without c, 57K), against about T·D for causal softmax attention at context T.

Selective (per-token lam_t, b_t [B, T, H, M]; derived in docs/model.md, "Selective core"). The recurrence is

    Xk_t = lam_t ⊙ Xk_{t-1} + b_t ⊗ zk_t,   Xv_t = lam_t ⊙ Xv_{t-1} + b_t ⊗ zv_t

(lam_t acts on the state before token t enters, exactly where the constant lam does; a reset zeroes the state
before that). lam_t must have one magnitude per (row, token, head) across the modes, lam_t,m = e^{g_t + iφ_t,m}
with g_t ≤ 0 (|lam_t| ≤ 1; Re A tied within a head, as simple GLA / SSD) and free per-mode angles φ; a concrete
lam that breaks the tie is refused. `log_decay_angle` reads g_t = mean_m log|lam_t,m| and φ_t,m = angle(lam_t,m)
∈ (−π, π]. Within a chunk, with Λ_i = Σ_{s≤i} g_s (one real cumsum per head) and Φ_i,m = Σ_{s≤i} φ_s,m:

    D[i,j]  = e^{Λ_i − Λ_j} on i ≥ j in one document, else 0    exponents ≤ 0 (masked to 0 before exp)
    Pin[i]  = e^{Λ_i + iΦ_i}   Pt[i] = e^{iΦ_i}   Ps[j] = b_j e^{−iΦ_j}   Pe[j] = e^{Λ_{l−1} − Λ_j} e^{iΦ_{l−1}} Ps[j]
    p0      = Pt ∘ ((G ∘ D) · Ps) + carried ∘ Pin ∘ (FQ · Xk0ᵀ)
    o       = carried ∘ Re((w ∘ Pin) · Xv0) + (Re((w ∘ Pt) · Psᵀ) ∘ D) · ZV
    Xk1     = [no reset in chunk] e^{Λ_{l−1} + iΦ_{l−1}} ∘ Xk0 + Peᵀ · (last_doc ∘ ZK)          (same for Xv1)

with G, w, K, the masks and resets as above. Every magnitude is ≤ 1 (times |b|): nothing is centred, nothing
overflows whatever Δ_t, and the chunk length has no decay bound (a decay to 1e-30 inside one chunk is finite in
float32). The decay enters the L×L score matrices elementwise (one extra L² multiply and L² exps per chunk and
head: ~L real flops and L exps per token-head beside the LTI count) and the phases as unit-modulus M-wide tables
(2M cos/sin per token-head). Angles: every token's φ is the principal-branch angle of lam_t (wrapped per token),
the cumsum Φ runs within one chunk only (|Φ| ≤ L·π), and the phase carried across chunks lives in the complex
state itself (multiplied in as e^{iΦ_{l−1}}), so no angle grows with the sequence length. A ragged last chunk is
computed at its true length l, as on the LTI path (`chunked_scan`). A constant lam_t = lam is
today's function (the tables then equal the LTI ones up to rounding). `sequential` and `associative` take lam_t
per step literally; the decode step takes this token's lam_t, b_t [B, H, M]; `impl='pallas'` (no kernel yet)
runs this chunked form with one warning. The sequence split (idattn/ops/sequence.py) folds the pairs
(Π_{t∈shard} lam_t, E_shard).

Delta (erase before write on the key state; `beta` [B, T, H] real, β_t ∈ [0, 2]; derived in docs/model.md,
"Delta core"). With k̂_t = zk_t / ‖zk_t‖ (0 for a zero key) the key half becomes

    Xk_t = (lam_t ⊙ Xk_{t-1}) (I − β_t k̂_t k̂_tᵀ) + b_t ⊗ zk_t,    Xv_t and the readout unchanged,

for either core. The mode decay acts on the left and the erase on the right, so they commute. Writing the erase as
a second write, Xk_t = lam_t ⊙ Xk_{t-1} + b_t ⊗ zk_t − u_t ⊗ k̂_t with u_t = β_t (lam_t ⊙ Xk_{t-1}) k̂_t, and
u_t = Pt[t] ∘ ũ_t (the row table of the chunk's readout), the ũ of one chunk solve one real unit-lower-triangular
system shared by all modes:

    N = I + diag(β) · strict(K̂·K̂ᵀ [∘ D])                           L×L real (strict: j < i in one document)
    N · Ũ = diag(β) · ( strict(K̂·ZKᵀ [∘ D]) · Ps + carried ∘ Rin ∘ (K̂ · Xk0ᵀ) )        L×M complex
    p0  −= Pt ∘ ( mask(FQ · K̂ᵀ [∘ D]) · Ũ )
    Xk1 −= Σ_j (last_doc) Te[j] ∘ ũ_j ⊗ k̂_j

LTI: Rin = lam^(μ+1), Te[j] = lam^μ (no D); selective: Rin[i] = e^{Λ_i}, Te[j] = e^{Λ_{l−1} − Λ_j + iΦ_{l−1}}
(D as above). β ≡ 0 gives N = I and Ũ = 0: every correction is an exact zero added to today's terms, so the
output and state equal today's bit for bit. `sequential` applies the update per token literally; the decode step
takes this token's β_t [B, H]; `associative` refuses (its elements would carry R×R erase products) and `pallas`
refuses (no kernel: impl='chunked'). Extra cost per token-head: 3LR + 5LM + 4MR real MACs (about +49K at
R = D = M = L = 64, 1.7× the LTI count with c).
"""
from __future__ import annotations

import math
import os
import warnings
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from idattn.ops import pallas as pallas_ops
from idattn.ops import s4d

IMPLS = ("auto", "sequential", "associative", "chunked", "pallas")
CORES = ("lti", "selective")  # the recurrence: one lam, b per head and mode, or one per token (module docstring)

# The associative path materialises the whole state trajectory [B, T, H, M, R+D] (complex). It refuses to build
# one larger than this many bytes (estimate in the error). Override with IDATTN_ASSOCIATIVE_MAX_BYTES or
# `set_associative_max_bytes`.
_ASSOCIATIVE_MAX_BYTES = int(os.environ.get("IDATTN_ASSOCIATIVE_MAX_BYTES", 4 * 2**30))

_HI = lax.Precision.HIGHEST


def set_associative_max_bytes(n: int) -> int:
    """Sets the associative path's memory bound in bytes; returns the previous bound."""
    global _ASSOCIATIVE_MAX_BYTES
    prev, _ASSOCIATIVE_MAX_BYTES = _ASSOCIATIVE_MAX_BYTES, int(n)
    return prev


def associative_max_bytes() -> int:
    return _ASSOCIATIVE_MAX_BYTES


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


def is_concrete(x) -> bool:
    return x is not None and not isinstance(x, jax.core.Tracer)


def shape_str(x) -> str:
    return f"shape {tuple(x.shape)} dtype {x.dtype}"


def real_dtype(*arrays):
    """float64 when any input is 64-bit (and x64 is on), else float32: state/accumulation precision."""
    for a in arrays:
        if a is not None and jnp.dtype(a.dtype) in (jnp.dtype(jnp.float64), jnp.dtype(jnp.complex128)):
            return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    return jnp.float32


def resolve_core(lam, b, core: Optional[str] = None) -> str:
    """The recurrence's core, named once for every path below: "lti" (lam, b [H, M], one decay per head and mode)
    or "selective" (lam_t, b_t per token, [B, T, H, M]; either may stay [H, M]). `core=None` names it from the
    shapes (a per-token lam or b is the selective core), for callers that pass per-token arrays without naming it;
    a named core must match them."""
    per_token_arg = [name for name, x in (("lam", lam), ("b", b)) if jnp.ndim(x) == 4]
    if core is None:
        return "selective" if per_token_arg else "lti"
    if core not in CORES:
        raise ValueError(f"core must be one of {CORES} (or None: read from lam and b), got {core!r}")
    if core == "lti" and per_token_arg:
        raise ValueError(f"core='lti' takes lam, b [H, M] (time invariant); {' and '.join(per_token_arg)} "
                         f"{'are' if len(per_token_arg) > 1 else 'is'} per token ([B, T, H, M]): pass core='selective'")
    return core


def _validate(fq, zk, zv, lam, b, c, segment_ids, initial_state, impl, chunk_size, core, beta=None):
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if beta is not None:
        check_beta(beta, fq.shape[:3], impl)
    for name, x in (("fq", fq), ("zk", zk), ("zv", zv)):
        if x.ndim != 4:
            raise ValueError(f"{name} must be [B, T, H, {'D' if name == 'zv' else 'R'}], got {shape_str(x)}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} must be a real floating array (float32/bfloat16/float64), got {x.dtype}")
    if fq.shape != zk.shape:
        raise ValueError(f"fq and zk must share [B, T, H, R]: fq {tuple(fq.shape)} vs zk {tuple(zk.shape)}")
    bsz, t, h, _ = fq.shape
    if zv.shape[:3] != (bsz, t, h):
        raise ValueError(f"zv must be [B, T, H, D] = [{bsz}, {t}, {h}, D] like fq; got {tuple(zv.shape)}")
    leading = ((h,), (bsz, t, h)) if core == "selective" else ((h,),)  # the axes before M, per core
    for name, x in (("lam", lam), ("b", b)):
        if x.ndim < 2 or tuple(x.shape[:-1]) not in leading:
            raise ValueError(f"{name} must be [H, M] = [{h}, M] (time invariant) or [B, T, H, M] = [{bsz}, {t}, {h}, M] "
                             f"(one value per token) complex; got {shape_str(x)}")
        if not jnp.issubdtype(x.dtype, jnp.complexfloating):
            raise TypeError(f"{name} must be complex (complex64/complex128), got {x.dtype}; build it with "
                            f"idattn.ops.s4d.discretize or jax.lax.complex(re, im)")
    m = lam.shape[-1]
    if b.shape[-1] != m:
        raise ValueError(f"b must have lam's M = {m} modes in its last axis; got b {tuple(b.shape)}, "
                         f"lam {tuple(lam.shape)}")
    if c is not None:
        if tuple(c.shape) != (h, m, m) or not jnp.issubdtype(c.dtype, jnp.complexfloating):
            raise ValueError(f"c must be complex [H, M, M] = [{h}, {m}, {m}] or None; got {shape_str(c)}")
    if segment_ids is not None:
        if tuple(segment_ids.shape) != (bsz, t):
            raise ValueError(f"segment_ids must be [B, T] = [{bsz}, {t}]; got {tuple(segment_ids.shape)}")
        if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
            raise TypeError(f"segment_ids must be an integer array (document ids), got {segment_ids.dtype}")
    if initial_state is not None:
        if not (isinstance(initial_state, (tuple, list)) and len(initial_state) == 2):
            raise ValueError("initial_state must be a pair (Xk [B, H, M, R], Xv [B, H, M, D]) or None")
        xk0, xv0 = initial_state
        want_k, want_v = (bsz, h, m, fq.shape[3]), (bsz, h, m, zv.shape[3])
        if tuple(xk0.shape) != want_k or tuple(xv0.shape) != want_v:
            raise ValueError(f"initial_state must be (Xk {list(want_k)}, Xv {list(want_v)}); got "
                             f"(Xk {list(xk0.shape)}, Xv {list(xv0.shape)})")
        if not (jnp.issubdtype(xk0.dtype, jnp.complexfloating) and jnp.issubdtype(xv0.dtype, jnp.complexfloating)):
            raise TypeError(f"initial_state must be complex, got ({xk0.dtype}, {xv0.dtype})")
    if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    # Value checks when the inputs are concrete (not under jit tracing).
    if core == "selective":
        if is_concrete(lam):
            check_selective_lam(lam, real_dtype(fq, zv, lam))
        return
    if is_concrete(lam):
        mag = np.abs(np.asarray(lam))
        if not np.all(np.isfinite(mag)) or mag.max() >= 1.0:
            raise ValueError(f"lam must satisfy |lam| < 1 (a stable decay); saw max |lam| = {mag.max():.8g}. "
                             f"Build lam with idattn.ops.s4d.discretize, which keeps Re(Δ·A) ≥ -κ < 0")
        if impl in ("chunked", "pallas", "auto") and chunk_size > 1:
            floor = s4d.min_abs_lam(chunk_size, real_dtype(fq, zv, lam))
            if mag.min() < floor:
                raise ValueError(
                    f"lam has min |lam| = {mag.min():.6g}, below {floor:.6g}, the smallest the chunked path allows "
                    f"at chunk_size={chunk_size} (its power tables reach |lam|^-(L-1)). Keep the S4D decay bound "
                    f"Re(Δ·A) ≥ -κ (idattn.ops.s4d.discretize, κ = {s4d.DEFAULT_KAPPA} allows chunks up to "
                    f"{s4d.max_chunk_size()}), use a smaller chunk_size, or impl='sequential'")


def check_beta(beta, bth, impl: str):
    """The delta update's β [B, T, H]: real, in [0, 2] when concrete; the impls without a delta form refuse."""
    if impl == "associative":
        raise ValueError("impl='associative' has no delta form (beta): its scan elements would carry each token's "
                         "R×R erase product, R³ MACs per token and T·R² memory per row and head; use "
                         "impl='chunked' (or 'sequential')")
    if impl == "pallas":
        raise ValueError("impl='pallas' has no delta (beta) kernel yet; use impl='chunked'")
    if tuple(beta.shape) != tuple(bth):
        raise ValueError(f"beta must be [B, T, H] = {list(bth)} (one erase strength per token and head); got "
                         f"{shape_str(beta)}")
    if not jnp.issubdtype(beta.dtype, jnp.floating):
        raise TypeError(f"beta must be a real floating array, got {beta.dtype}")
    if is_concrete(beta):
        v = np.asarray(beta, np.float64)
        if v.size and (not np.all(np.isfinite(v)) or v.min() < 0 or v.max() > 2):
            raise ValueError(f"beta must lie in [0, 2] (I − β k̂k̂ᵀ non-expansive); saw [{v.min():.6g}, "
                             f"{v.max():.6g}]")


def check_selective_lam(lam, rdt):
    """Concrete per-token lam: |lam| <= 1 and one magnitude per (row, token, head) across the modes."""
    lam = np.asarray(lam)
    mag = np.abs(lam)
    if not np.all(np.isfinite(mag)) or mag.max() > 1.0 + 8 * float(jnp.finfo(rdt).eps):  # rounding of |e^{iθ}|
        raise ValueError(f"lam (per token) must satisfy |lam| <= 1; saw max |lam| = {mag.max():.8g}. Build it as "
                         f"exp(Δ_t·A + iθ_t) with Δ_t >= 0 and Re A <= 0")
    if lam.ndim != 4:
        return
    tiny = float(np.finfo(np.float32 if jnp.dtype(rdt) == jnp.dtype(jnp.float32) else np.float64).tiny)
    logm = np.log(np.maximum(mag, tiny)).astype(np.float64)
    spread = np.abs(logm - logm.mean(axis=-1, keepdims=True)).max(axis=-1)
    tol = math.sqrt(float(jnp.finfo(rdt).eps)) * (1.0 + np.abs(logm).mean(axis=-1))
    if np.any(spread > tol):
        i = np.unravel_index(int(np.argmax(spread - tol)), spread.shape)
        raise ValueError(f"lam (per token) must have one magnitude per (row, token, head) across its M modes "
                         f"(Re A tied within a head); at [b, t, h] = {list(map(int, i))} log|lam| spreads by "
                         f"{spread[i]:.3g}. Build lam_t = exp(Δ_t·a_h + iφ_t,m) with one real a_h per head")


# ----------------------------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------------------------


def document_index(segment_ids, batch: int, length: int):
    """d_t = cumsum(seg[t] != seg[t-1]) with d_0 = 0: [B, T] int32 (all zeros without segment ids)."""
    if segment_ids is None:
        return jnp.zeros((batch, length), jnp.int32)
    seg = jnp.asarray(segment_ids)
    starts = jnp.concatenate([jnp.zeros((batch, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
    return jnp.cumsum(starts.astype(jnp.int32), axis=1)


def document_starts(segment_ids, batch: int, length: int):
    """[B, T] bool: True where a new document starts (never at t = 0, where initial_state applies)."""
    if segment_ids is None:
        return jnp.zeros((batch, length), bool)
    seg = jnp.asarray(segment_ids)
    return jnp.concatenate([jnp.zeros((batch, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)


def _readout_literal(xk, xv, fq, c, conj):
    """o = Re(Σ_m conj?(p[m]) Γ[m,:]) with U = c·Xk, Γ = c·Xv, p = U·fq, applying c literally.

    xk: [..., H, M, R], xv: [..., H, M, D], fq: [..., H, R] -> [..., H, D] real.
    """
    if c is not None:
        xk = jnp.einsum("hmn,...hnr->...hmr", c, xk, precision=_HI)
        xv = jnp.einsum("hmn,...hnd->...hmd", c, xv, precision=_HI)
    p = jnp.einsum("...hmr,...hr->...hm", xk, fq.astype(xk.dtype), precision=_HI)
    if conj:
        p = jnp.conj(p)
    return jnp.real(jnp.einsum("...hm,...hmd->...hd", p, xv, precision=_HI))


def complex_dtype(rdt):
    """The complex dtype paired with real dtype `rdt` (complex128 for float64, else complex64)."""
    return jnp.complex128 if jnp.dtype(rdt) == jnp.dtype(jnp.float64) else jnp.complex64


def _zero_state(bsz, h, m, r, d, cdt):
    return jnp.zeros((bsz, h, m, r), cdt), jnp.zeros((bsz, h, m, d), cdt)


# ----------------------------------------------------------------------------------------------------------------
# Sequential: lax.scan over time (the readable reference)
# ----------------------------------------------------------------------------------------------------------------


def per_token(lam, b, bsz: int, t: int):
    """(lam, b) broadcast to [B, T, H, M] (either may be [H, M] or [B, T, H, M])."""
    h, m = lam.shape[-2], lam.shape[-1]
    return (jnp.broadcast_to(lam, (bsz, t, h, m)), jnp.broadcast_to(b, (bsz, t, h, m)))


def _mix_sequential(fq, zk, zv, lam, b, c, conj, segment_ids, initial_state, rdt, core, beta=None):
    bsz, t, h, r = fq.shape
    d, m = zv.shape[-1], lam.shape[-1]
    cdt = complex_dtype(rdt)
    lam, b = lam.astype(cdt), b.astype(cdt)
    selective = core == "selective"
    delta = beta is not None
    c = None if c is None else c.astype(cdt)
    state = _zero_state(bsz, h, m, r, d, cdt) if initial_state is None else tuple(s.astype(cdt) for s in initial_state)
    resets = document_starts(segment_ids, bsz, t)

    def step(carry, xs):
        xk, xv = carry
        fq_t, zk_t, zv_t, reset_t = xs[:4]
        lam_t, b_t = xs[4:6] if selective else (lam, b)  # [B, H, M] per token, else [H, M]
        keep = ~reset_t[:, None, None, None]
        xk = jnp.where(keep, xk, 0)
        xv = jnp.where(keep, xv, 0)
        o_t, (xk, xv) = _step(xk, xv, fq_t, zk_t, zv_t, lam_t, b_t, c, conj, rdt, beta=xs[-1] if delta else None)
        return (xk, xv), o_t

    xs = (jnp.moveaxis(fq, 1, 0), jnp.moveaxis(zk, 1, 0), jnp.moveaxis(zv, 1, 0), jnp.moveaxis(resets, 1, 0))
    if selective:
        xs = xs + tuple(jnp.moveaxis(x, 1, 0) for x in per_token(lam, b, bsz, t))
    if delta:
        xs = xs + (jnp.moveaxis(beta.astype(rdt), 1, 0),)
    state, o = lax.scan(step, state, xs)
    return jnp.moveaxis(o, 0, 1), state


def unit_keys(zk, rdt):
    """k̂ = zk / ‖zk‖ over the last (feature) axis, in `rdt`. A key with ‖zk‖² ≤ √tiny of the dtype (a zero key:
    padding, a masked token) reads as k̂ = 0 and erases nothing, with zero gradient: no 0/0 in the value, no
    overflow of ‖zk‖^-3 in the backward."""
    zk = zk.astype(rdt)
    n2 = jnp.sum(zk * zk, axis=-1, keepdims=True)
    ok = n2 > math.sqrt(float(jnp.finfo(rdt).tiny))
    return jnp.where(ok, zk * lax.rsqrt(jnp.where(ok, n2, 1)), 0)


def _erase(x, kh, beta):
    """x (I − β k̂ k̂ᵀ) = x − β (x·k̂) ⊗ k̂ for x [B, H, M, R] complex, k̂ [B, H, R] and β [B, H] real."""
    proj = jnp.einsum("bhmr,bhr->bhm", x, kh.astype(x.dtype), precision=_HI)
    return x - (beta[:, :, None].astype(x.dtype) * proj)[..., None] * kh[:, :, None, :].astype(x.dtype)


def _step(xk, xv, fq_t, zk_t, zv_t, lam, b, c, conj, rdt, beta=None):
    """One token: lam, b [H, M] (time invariant) or [B, H, M] (this token's); beta [B, H] (the delta update's
    erase strength, module docstring "Delta") or None (no erase: today's update, the same operations)."""
    cdt = xk.dtype
    lam = lam[..., None] if lam.ndim == 3 else lam[None, :, :, None]
    b = b[..., None] if b.ndim == 3 else b[None, :, :, None]
    if beta is None:
        xk = lam * xk + b * zk_t.astype(rdt)[:, :, None, :].astype(cdt)
    else:  # erase after the decay, before the write (β = 0: an exact zero subtracted)
        xk = _erase(lam * xk, unit_keys(zk_t, rdt), beta.astype(rdt)) + b * zk_t.astype(rdt)[:, :, None, :].astype(cdt)
    xv = lam * xv + b * zv_t.astype(rdt)[:, :, None, :].astype(cdt)
    o_t = _readout_literal(xk, xv, fq_t.astype(rdt), c, conj)
    return o_t, (xk, xv)


# ----------------------------------------------------------------------------------------------------------------
# Associative: jax.lax.associative_scan over the complex state (small sizes only)
# ----------------------------------------------------------------------------------------------------------------


def associative_bytes(bsz, t, h, m, r, d, real_dtype=jnp.float32) -> int:
    """Estimated peak bytes of the associative path: the [B, T, H, M, R+D] complex trajectory, about 3 live copies
    (elements, scan intermediates, output)."""
    item = 2 * jnp.dtype(real_dtype).itemsize
    return 3 * bsz * t * h * m * (r + d) * item


def _mix_associative(fq, zk, zv, lam, b, c, conj, segment_ids, initial_state, rdt):
    """Materialises the whole state trajectory [B, T, H, M, R+D] (complex): memory O(T·M·(R+D)) per row and head.
    For small sizes and as a cross-check only; refuses past `associative_max_bytes()`."""
    bsz, t, h, r = fq.shape
    d, m = zv.shape[-1], lam.shape[-1]
    est = associative_bytes(bsz, t, h, m, r, d, rdt)
    if est > _ASSOCIATIVE_MAX_BYTES:
        raise ValueError(
            f"impl='associative' would materialise the state trajectory [B, T, H, M, R+D] = "
            f"[{bsz}, {t}, {h}, {m}, {r + d}] complex: about {est / 2**30:.2f} GiB, over the bound of "
            f"{_ASSOCIATIVE_MAX_BYTES / 2**30:.2f} GiB. Use impl='chunked' (memory O(T/L · state)), or raise the bound "
            f"with IDATTN_ASSOCIATIVE_MAX_BYTES / idattn.ops.interdomain.set_associative_max_bytes")
    cdt = complex_dtype(rdt)
    lam, b = per_token(lam.astype(cdt), b.astype(cdt), bsz, t)  # [B, T, H, M]: lam_t, b_t (constant: broadcast)
    c = None if c is None else c.astype(cdt)
    z = jnp.concatenate([zk, zv], axis=-1).astype(rdt).astype(cdt)  # [B, T, H, R+D]
    x = b[..., None] * z[:, :, :, None, :]  # [B, T, H, M, R+D]
    if initial_state is not None:
        x0 = jnp.concatenate([s.astype(cdt) for s in initial_state], axis=-1)  # [B, H, M, R+D]
        x = x.at[:, 0].add(lam[:, 0, :, :, None] * x0)
    resets = document_starts(segment_ids, bsz, t)
    a = jnp.where(resets[:, :, None, None], jnp.zeros((), cdt), lam)  # [B, T, H, M]
    a = a[..., None]

    def combine(left, right):
        a_l, x_l = left
        a_r, x_r = right
        return a_l * a_r, a_r * x_l + x_r

    _, states = lax.associative_scan(combine, (jnp.broadcast_to(a, a.shape), x), axis=1)
    xk, xv = states[..., :r], states[..., r:]
    o = _readout_literal(xk, xv, fq.astype(rdt), c, conj)
    return o, (xk[:, -1], xv[:, -1])


# ----------------------------------------------------------------------------------------------------------------
# Chunked: the chunk-parallel matmul form (pure XLA; the reference for the kernels)
# ----------------------------------------------------------------------------------------------------------------


def mode_powers(log_lam_re, log_lam_im, exponents):
    """lam^k for real exponents k [L] and log lam (re, im) [H, M] -> (re, im) [H, L, M]."""
    e = exponents[None, :, None]
    mag = jnp.exp(log_lam_re[:, None, :] * e)
    ang = log_lam_im[:, None, :] * e
    return mag * jnp.cos(ang), mag * jnp.sin(ang)


def _cmul(ar, ai, br, bi):
    return ar * br - ai * bi, ar * bi + ai * br


def _chunk_tables(lam, b, length, rdt):
    """Power tables of one chunk of true length `length`, as real planes [H, l, M] (and lam^l [H, M])."""
    log_lam = jnp.log(lam)  # principal branch: the phase is already reduced to (-π, π]
    lr, li = jnp.real(log_lam).astype(rdt), jnp.imag(log_lam).astype(rdt)
    br, bi = jnp.real(b).astype(rdt), jnp.imag(b).astype(rdt)
    pos = jnp.arange(length, dtype=rdt)
    mu = (length - 1) / 2.0
    pin = mode_powers(lr, li, pos + 1)
    pt = mode_powers(lr, li, pos - mu)
    ps = _cmul(*mode_powers(lr, li, mu - pos), br[:, None, :], bi[:, None, :])
    pe = _cmul(*mode_powers(lr, li, (length - 1) - pos), br[:, None, :], bi[:, None, :])
    lam_l = mode_powers(lr, li, jnp.asarray([float(length)], rdt))
    return dict(pin=pin, pt=pt, ps=ps, pe=pe, lam_l=(lam_l[0][:, 0], lam_l[1][:, 0]))


def _fold_c(c, conj, rdt):
    """K = c^H c (conj) or cᵀ c, as the real block matrix [[Kr, Ki], [-Ki, Kr]] [H, 2M, 2M] so that
    [wr, wi] = [qr, qi] @ block computes w = q · K for complex row vectors q."""
    if c is None:
        return None
    ct = jnp.conj(c) if conj else c
    k = jnp.einsum("hmi,hmj->hij", ct, c, precision=_HI)
    kr, ki = jnp.real(k).astype(rdt), jnp.imag(k).astype(rdt)
    top = jnp.concatenate([kr, ki], axis=-1)
    bot = jnp.concatenate([-ki, kr], axis=-1)
    return jnp.concatenate([top, bot], axis=-2)


def _table_dot(x, table, eq: str):
    """x [B, H, l, K] times a per-head table [H, ...] shared by every row -> [B, H, l, N]; `eq` names the table's
    axes after the fold, "hxk,hkn->hxn" (table [H, K, N]) or "hxk,hnk->hxn" (table [H, N, K]).

    The rows are folded into the matmul's free dimension, [H, B·l, K] · table, rather than written as one einsum
    with a broadcast operand ("bhik,hkn->bhin"): XLA:CPU lowers the broadcast form, and above all its transpose
    (the table's cotangent, contracted over B and l), to a slow dot, which made the chunked backward ~5x its forward
    at the `small` shapes (python -m idattn.bench op). Same products and sums; only the association order of the
    float additions may differ."""
    bsz, h, l, k = x.shape
    y = jnp.einsum(eq, jnp.swapaxes(x, 0, 1).reshape(h, bsz * l, k), table, precision=_HI)
    return jnp.swapaxes(y.reshape(h, bsz, l, y.shape[-1]), 0, 1)


def remat_chunk(body):
    """A chunked form's scan body, recomputed in the backward pass (`jax.checkpoint`) instead of saving its
    residuals: the chunk's L×L score matrices, masks and the per-head tables broadcast over the rows, which cost
    more to store, stack and reload than the chunk's forward costs to recompute. On one CPU core at the `small`
    shapes the chunked backward fell from ~5x to ~3x the forward with it (python -m idattn.bench op); on
    accelerators it trades one forward of the chunk for its activation memory, as flash-linear-attention's
    chunked kernels do. The values are the same computation, so the gradients are unchanged."""
    return jax.checkpoint(body, prevent_cse=False)


def chunked_scan(chunk_body, carry, xs, axes, chunk_size: int, out_axis: int):
    """Every chunked form's walk over the sequence, the same for both cores: the arrays `xs` (time along axes[k]
    of xs[k]) cut into chunks of L = min(chunk_size, T) tokens; the full chunks by `lax.scan` of
    `chunk_body(L)` (recomputed in the backward, `remat_chunk`), then a ragged last chunk of its true length
    l = T mod L by one call of `chunk_body(l)`: nothing is padded, so neither a power table nor the returned state
    ever sees a token that is not there. `chunk_body(l)` -> body(carry, xs of l tokens) -> (carry, y), y with its
    l tokens along `out_axis`. Returns (carry, ys) with the T tokens of the outputs along `out_axis`."""
    t = xs[0].shape[axes[0]]
    big_l = min(int(chunk_size), t)
    n_full, tail = divmod(t, big_l)
    outs = []
    if n_full:
        def split(x, ax):  # [..., n·L (ax), ...] -> [n, ..., L (ax), ...]
            x = lax.slice_in_dim(x, 0, n_full * big_l, axis=ax)
            return jnp.moveaxis(x.reshape(x.shape[:ax] + (n_full, big_l) + x.shape[ax + 1:]), ax, 0)

        carry, ys = lax.scan(remat_chunk(chunk_body(big_l)), carry, tuple(split(x, a) for x, a in zip(xs, axes)))
        ys = jnp.moveaxis(ys, 0, out_axis)  # [..., n, L, ...]
        outs.append(ys.reshape(ys.shape[:out_axis] + (n_full * big_l,) + ys.shape[out_axis + 2:]))
    if tail:
        s0 = n_full * big_l
        carry, y = chunk_body(tail)(carry, tuple(lax.slice_in_dim(x, s0, t, axis=a) for x, a in zip(xs, axes)))
        outs.append(y)
    return carry, (jnp.concatenate(outs, axis=out_axis) if len(outs) > 1 else outs[0])


def _delta_tables(lam, length, rdt):
    """The LTI delta form's two extra mode tables of a chunk of true length l (module docstring "Delta"), real
    planes [H, M]: Rin = lam^(μ+1) (the carried state's decay to token i, over Pt[i] = lam^(i−μ)) and
    Te = lam^μ = Pt[l−1] (an erase at j, over Pt[j], decayed to the chunk's end). Both have magnitude ≤ 1."""
    log_lam = jnp.log(lam)
    lr, li = jnp.real(log_lam).astype(rdt), jnp.imag(log_lam).astype(rdt)
    mu = (length - 1) / 2.0
    rin = mode_powers(lr, li, jnp.asarray([mu + 1.0], rdt))
    te = mode_powers(lr, li, jnp.asarray([mu], rdt))
    return dict(rin=(rin[0][:, 0], rin[1][:, 0]), te=(te[0][:, 0], te[1][:, 0]))


def unit_lower_solve(n, rhs):
    """X with (I + N)·X = rhs, N [..., l, l] strictly lower triangular (its diagonal and upper part are ignored),
    rhs [..., l, w] real: the delta update's per-chunk solve.

    On CPU by forward substitution in XLA (a loop over the l rows, X_i = rhs_i − N_i·X): jaxlib's LAPACK solve
    runs its batch on XLA's intra-op thread pool and waits inside that pool, so two solves running at once
    deadlock a host with as few pool threads as solves (seen on a 2-core host: every worker blocked in
    ParallelBatchMap, the training loop hung). Elsewhere `lax.linalg.triangular_solve` (cuBLAS, or XLA's own
    expansion on TPU). Both are exact to rounding; the float64 tests check the CPU one."""
    l = n.shape[-1]
    n = jnp.where(jnp.tril(jnp.ones((l, l), bool), -1), n, 0)

    def substitute(n, rhs):
        def row(i, x):
            n_i = lax.dynamic_slice_in_dim(n, i, 1, axis=-2)  # [..., 1, l]: zero at and past column i
            r_i = lax.dynamic_slice_in_dim(rhs, i, 1, axis=-2)
            return lax.dynamic_update_slice_in_dim(x, r_i - jnp.matmul(n_i, x, precision=_HI), i, axis=-2)
        return lax.fori_loop(0, l, row, rhs)

    def library(n, rhs):
        return lax.linalg.triangular_solve(n, rhs, left_side=True, lower=True, unit_diagonal=True)

    return lax.platform_dependent(n, rhs, cpu=substitute, default=library)


def _erase_chunk(fq, zk, kh, beta, xk2, ps_dot, rin_mul, mask, carried, dec=None):
    """The delta update inside one chunk (module docstring "Delta"): (Ũ, F·Ũ), both [B, H, l, 2M] real planes.

    With strict = mask without its diagonal (j < i in one document) and D the selective decay matrix (None: LTI,
    whose decay sits in the tables),

        N = I + diag(β)·strict(K̂·K̂ᵀ ∘ D)    (unit lower triangular, real, shared by the modes)
        N·Ũ = diag(β)·(strict(K̂·ZKᵀ ∘ D)·Ps + carried ∘ Rin ∘ (K̂·Xk0ᵀ))
        F = mask(FQ·K̂ᵀ ∘ D)

    fq, zk, kh [B, H, l, R], beta [B, H, l], xk2 [B, H, 2M, R] (the carried Xk0 as planes), `ps_dot(x)` = x·Ps
    for x [B, H, l, l], `rin_mul(y)` = Rin ∘ y for planes y [B, H, l, 2M]; mask, carried as the chunk bodies'.
    β = 0 gives Ũ = 0 and F·Ũ = 0 exactly (N = I; the right side is β times a finite number)."""
    l = fq.shape[2]
    strict = mask & ~jnp.eye(l, dtype=bool)
    kk = jnp.einsum("bhir,bhjr->bhij", kh, kh, precision=_HI)
    kz = jnp.einsum("bhir,bhjr->bhij", kh, zk, precision=_HI)
    fk = jnp.einsum("bhir,bhjr->bhij", fq, kh, precision=_HI)
    if dec is not None:
        kk, kz, fk = kk * dec, kz * dec, fk * dec
    kk, kz, fk = jnp.where(strict, kk, 0), jnp.where(strict, kz, 0), jnp.where(mask, fk, 0)
    kx = jnp.einsum("bhlr,bhmr->bhlm", kh, xk2, precision=_HI)  # K̂·Xk0ᵀ as planes
    rhs = ps_dot(kz) + jnp.where(carried, rin_mul(kx), 0)
    bcol = beta[..., None]
    u = unit_lower_solve(bcol * kk, bcol * rhs)
    return u, jnp.einsum("bhij,bhjm->bhim", fk, u, precision=_HI)


def _chunk_body(carry, xs, tables, kblock, conj, delta=None):
    """One chunk. carry: (xk_r, xk_i [B,H,M,R], xv_r, xv_i [B,H,M,D], d_prev [B]); xs: fq, zk [B,H,l,R],
    zv [B,H,l,D], d [B,l] (and k̂ [B,H,l,R], β [B,H,l] with `delta`, the chunk's `_delta_tables`: the erase of
    the module docstring's "Delta", added to today's terms). Returns (new carry, o [B,H,l,D])."""
    xk_r, xk_i, xv_r, xv_i, d_prev = carry
    fq, zk, zv, dch = xs[:4]
    l = fq.shape[2]
    m = xk_r.shape[2]
    pin_r, pin_i = tables["pin"]
    pt_r, pt_i = tables["pt"]
    ps_r, ps_i = tables["ps"]
    pe_r, pe_i = tables["pe"]
    laml_r, laml_i = tables["lam_l"]

    same_doc = dch[:, :, None] == dch[:, None, :]  # [B, l, l]
    causal = jnp.tril(jnp.ones((l, l), bool))
    mask = (same_doc & causal)[:, None]  # [B, 1, l, l]
    carried = (dch == d_prev[:, None])[:, None, :, None]  # [B, 1, l, 1]: before the first reset in the chunk
    last_doc = (dch == dch[:, -1:])[:, None, :, None]  # [B, 1, l, 1]
    reset_in_chunk = (dch[:, -1] != d_prev)[:, None, None, None]  # [B, 1, 1, 1]

    g = jnp.einsum("bhir,bhjr->bhij", fq, zk, precision=_HI)
    g = jnp.where(mask, g, 0)
    # G · Ps as one real matmul on stacked planes [H, l, 2M].
    ps2 = jnp.concatenate([ps_r, ps_i], axis=-1)
    gps = _table_dot(g, ps2, "hxj,hjm->hxm")
    p_r, p_i = _cmul(pt_r[None], pt_i[None], gps[..., :m], gps[..., m:])
    # Carried term Pin ∘ (FQ · Xk0ᵀ).
    xk2 = jnp.concatenate([xk_r, xk_i], axis=2)  # [B, H, 2M, R]
    fx = jnp.einsum("bhlr,bhmr->bhlm", fq, xk2, precision=_HI)
    c_r, c_i = _cmul(pin_r[None], pin_i[None], fx[..., :m], fx[..., m:])
    p_r = p_r + jnp.where(carried, c_r, 0)
    p_i = p_i + jnp.where(carried, c_i, 0)
    if delta is not None:  # p0 −= Pt ∘ (F·Ũ)
        rin_r, rin_i = (x[None, :, None, :] for x in delta["rin"])

        def rin_mul(y):
            return jnp.concatenate(_cmul(rin_r, rin_i, y[..., :m], y[..., m:]), axis=-1)

        u, fu = _erase_chunk(fq, zk, xs[4], xs[5], xk2, lambda x: _table_dot(x, ps2, "hxj,hjm->hxm"), rin_mul,
                             mask, carried)
        e_r, e_i = _cmul(pt_r[None], pt_i[None], fu[..., :m], fu[..., m:])
        p_r, p_i = p_r - e_r, p_i - e_i
    q_r, q_i = (p_r, -p_i) if conj else (p_r, p_i)
    if kblock is None:
        w_r, w_i = q_r, q_i
    else:
        w2 = _table_dot(jnp.concatenate([q_r, q_i], -1), kblock, "hxm,hmn->hxn")
        w_r, w_i = w2[..., :m], w2[..., m:]
    # Carried readout Re((w ∘ Pin) · Xv0).
    a_r, a_i = _cmul(w_r, w_i, pin_r[None], pin_i[None])
    xv2 = jnp.concatenate([xv_r, xv_i], axis=2)  # [B, H, 2M, D]
    o_carry = jnp.einsum("bhlm,bhmd->bhld", jnp.concatenate([a_r, -a_i], -1), xv2, precision=_HI)
    # Intra-chunk readout mask(Re((w ∘ Pt) · Psᵀ)) · ZV.
    e_r, e_i = _cmul(w_r, w_i, pt_r[None], pt_i[None])
    s = _table_dot(jnp.concatenate([e_r, -e_i], -1), ps2, "hxm,hjm->hxj")
    s = jnp.where(mask, s, 0)
    o = jnp.einsum("bhij,bhjd->bhid", s, zv, precision=_HI) + jnp.where(carried, o_carry, 0)
    # Carry: lam^l ∘ X0 unless the chunk holds a reset, plus the last document's tokens.
    pe2 = jnp.concatenate([pe_r, pe_i], axis=-1)  # [H, l, 2M]
    zk_last = jnp.where(last_doc, zk, 0)
    zv_last = jnp.where(last_doc, zv, 0)
    nk = jnp.einsum("hlm,bhlr->bhmr", pe2, zk_last, precision=_HI)
    nv = jnp.einsum("hlm,bhld->bhmd", pe2, zv_last, precision=_HI)
    dk_r, dk_i = _cmul(laml_r[None, :, :, None], laml_i[None, :, :, None], xk_r, xk_i)
    dv_r, dv_i = _cmul(laml_r[None, :, :, None], laml_i[None, :, :, None], xv_r, xv_i)
    keep = ~reset_in_chunk
    new = (jnp.where(keep, dk_r, 0) + nk[:, :, :m], jnp.where(keep, dk_i, 0) + nk[:, :, m:],
           jnp.where(keep, dv_r, 0) + nv[:, :, :m], jnp.where(keep, dv_i, 0) + nv[:, :, m:], dch[:, -1])
    if delta is not None:  # Xk1 −= Te ∘ Σ_j ũ_j ⊗ k̂_j over the last document
        uk = jnp.einsum("bhlm,bhlr->bhmr", jnp.where(last_doc, u, 0), xs[4], precision=_HI)
        te_r, te_i = (x[None, :, :, None] for x in delta["te"])
        g_r, g_i = _cmul(te_r, te_i, uk[:, :, :m], uk[:, :, m:])
        new = (new[0] - g_r, new[1] - g_i) + new[2:]
    return new, o


def _state_planes(initial_state, bsz, h, m, r, d, rdt):
    """The chunked forms' carried state as real planes (Xk_r, Xk_i, Xv_r, Xv_i): the initial state's, or zeros."""
    if initial_state is None:
        return (jnp.zeros((bsz, h, m, r), rdt), jnp.zeros((bsz, h, m, r), rdt), jnp.zeros((bsz, h, m, d), rdt),
                jnp.zeros((bsz, h, m, d), rdt))
    xk0, xv0 = initial_state
    return (jnp.real(xk0).astype(rdt), jnp.imag(xk0).astype(rdt), jnp.real(xv0).astype(rdt),
            jnp.imag(xv0).astype(rdt))


def _mix_chunked(fq, zk, zv, lam, b, c, conj, segment_ids, initial_state, rdt, chunk_size, beta=None):
    bsz, t, h, r = fq.shape
    d, m = zv.shape[-1], lam.shape[-1]
    cdt = complex_dtype(rdt)
    lam, b = lam.astype(cdt), b.astype(cdt)
    kblock = _fold_c(None if c is None else c.astype(cdt), conj, rdt)
    docs = document_index(segment_ids, bsz, t)
    carry = (*_state_planes(initial_state, bsz, h, m, r, d, rdt), jnp.zeros((bsz,), jnp.int32))
    # [B, T, H, X] -> [B, H, T, X] in the compute dtype.
    fq_, zk_, zv_ = (jnp.swapaxes(x.astype(rdt), 1, 2) for x in (fq, zk, zv))
    xs, axes = (fq_, zk_, zv_, docs), (2, 2, 2, 1)
    if beta is not None:  # the delta update: k̂ [B, H, T, R] and β [B, H, T] travel with the chunk
        xs, axes = xs + (unit_keys(zk_, rdt), jnp.swapaxes(beta.astype(rdt), 1, 2)), axes + (2, 2)

    def chunk_body(length):  # the power tables of a chunk of `length` tokens
        tables = _chunk_tables(lam, b, length, rdt)
        delta = None if beta is None else _delta_tables(lam, length, rdt)
        return lambda cr, xs: _chunk_body(cr, xs, tables, kblock, conj, delta)

    carry, o = chunked_scan(chunk_body, carry, xs, axes, chunk_size, out_axis=2)
    xk_r, xk_i, xv_r, xv_i, _ = carry
    state = (lax.complex(xk_r, xk_i).astype(cdt), lax.complex(xv_r, xv_i).astype(cdt))
    return jnp.swapaxes(o, 1, 2), state


# ----------------------------------------------------------------------------------------------------------------
# Chunked, selective: per-token lam_t = exp(g_t + iφ_t,m) with one log-decay g_t per (row, token, head)
# ----------------------------------------------------------------------------------------------------------------


def log_decay_angle(lam, rdt):
    """Per-token lam [..., M] complex -> (g [...], φ [..., M]) in `rdt`: g = mean_m log|lam_m| (one log-decay per
    row, token and head: the magnitudes are tied across the modes) and φ = angle(lam) ∈ (−π, π] (principal branch:
    every token's phase increment is already wrapped); g is clamped to ≤ 0. A |lam| below √tiny of the dtype (1.1e-19 in float32,
    1.5e-154 in float64; an underflowed decay, lam = 0, included) reads as g = log √tiny, φ = 0, with zero
    gradient: no NaN from log 0 or angle 0, and the backward's 1/lam stays far from overflow. Such a decay
    multiplies the carried state by ≤ √tiny, below the dtype's resolution next to any fresh token.

    Gradients with respect to lam are those of the tied form: a perturbation that breaks the tie is averaged over
    the modes. Build lam from (Δ_t, a_h, φ_t) and differentiate those (the layer does): d lam/dΔ = A·lam cancels
    the 1/lam of the log, so dΔ keeps full precision however small the decay, whereas the gradient with respect to
    lam itself loses relative precision as 1/|lam|."""
    lam = lam.astype(complex_dtype(rdt))
    floor = math.sqrt(float(jnp.finfo(rdt).tiny))
    ok = lax.stop_gradient(jnp.abs(lam)) > floor
    safe = jnp.where(ok, lam, jnp.ones((), lam.dtype))
    logm = jnp.where(ok, jnp.log(jnp.abs(safe)), math.log(floor)).astype(rdt)
    ang = jnp.where(ok, jnp.angle(safe), 0).astype(rdt)
    g = jnp.mean(logm, axis=-1)
    # g ≤ 0 by construction (a |lam| of 1 + rounding reads as 1; the gradient passes where g ≤ 0), so every
    # cumulated exponent Λ_i − Λ_j (i ≥ j), Λ_i and Λ_{l−1} − Λ_j is ≤ 0 in floating point too.
    return jnp.where(g <= 0, g, 0), ang


class ChunkDecay(NamedTuple):
    """One chunk of the per-token decay lam_t = e^{g_t + iφ_t} (`chunk_decay`): the cumulated exponents from the
    chunk's start and the factors every selective chunked form reads from them. Time runs along the axis given to
    `chunk_decay`; `cum`, `into` and `to_end` are shaped like g, `cos` and `sin` like φ."""
    cum: jax.Array  # Λ_i = Σ_{s≤i} g_s: non-increasing, ≤ 0
    cos: jax.Array  # e^{iΦ_i} = cos Φ_i + i sin Φ_i, Φ_i = Σ_{s≤i} φ_s: |Φ| ≤ l·π (within the chunk only)
    sin: jax.Array
    into: jax.Array  # e^{Λ_i} ≤ 1: the decay of the state carried into the chunk, to token i
    to_end: jax.Array  # e^{Λ_{l−1} − Λ_j} ≤ 1: token j's decay to the chunk's end
    whole: jax.Array  # e^{Λ_{l−1}} ≤ 1: the whole chunk's decay (the time axis dropped)


def chunk_decay(g, ph, axis: int) -> ChunkDecay:
    """The per-token decay form of one chunk of l tokens (module docstring, "Selective"), shared by the selective
    chunked forms of interdomain_mix, s4d_linear_mix and the sequence split's end state: g [..., l, ...]
    (`log_decay_angle`'s log-decay, time along `axis`) and φ [..., l, ..., M] (angles, time along the same
    `axis`). Only one chunk is ever summed, so no exponent and no angle grows with the sequence; every exponent
    is ≤ 0, so nothing overflows whatever Δ_t."""
    cum = jnp.cumsum(g, axis=axis)
    phc = jnp.cumsum(ph, axis=axis)
    n = cum.shape[axis]
    last = lax.slice_in_dim(cum, n - 1, n, axis=axis)  # Λ_{l−1}, the time axis kept (size 1)
    return ChunkDecay(cum, jnp.cos(phc), jnp.sin(phc), jnp.exp(cum), jnp.exp(last - cum),
                      jnp.exp(jnp.squeeze(last, axis)))


def decay_matrix(cum, mask):
    """D[i, j] = e^{Λ_i − Λ_j} where `mask` (i ≥ j in one document), else 0: cum [..., l] (time last) ->
    [..., l, l]. Every kept exponent is ≤ 0; masked ones are set to 0 before exp (and the entry to 0 after), so
    nothing overflows whatever Δ_t."""
    diff = cum[..., :, None] - cum[..., None, :]
    return jnp.where(mask, jnp.exp(jnp.where(mask, diff, 0)), 0)


def _chunk_body_selective(carry, xs, kblock, conj, delta: bool = False):
    """One chunk of the selective form (module docstring). carry as `_chunk_body`; xs: fq, zk [B,H,l,R],
    zv [B,H,l,D], d [B,l], g [B,H,l] (log-decay), ph [B,H,l,M] (angles), b_r, b_i [B,H,l,M] (and k̂ [B,H,l,R],
    β [B,H,l] with `delta`: the erase of the module docstring's "Delta", added to today's terms)."""
    xk_r, xk_i, xv_r, xv_i, d_prev = carry
    fq, zk, zv, dch, g, ph, b_r, b_i = xs[:8]
    l, m = fq.shape[2], xk_r.shape[2]
    cd = chunk_decay(g, ph, axis=2)  # Λ [B, H, l], e^{iΦ} [B, H, l, M]
    er, ei = cd.cos, cd.sin  # e^{iΦ_i}: unit modulus

    same_doc = dch[:, :, None] == dch[:, None, :]
    causal = jnp.tril(jnp.ones((l, l), bool))
    mask = (same_doc & causal)[:, None]  # [B, 1, l, l]
    carried = (dch == d_prev[:, None])[:, None, :, None]
    last_doc = (dch == dch[:, -1:])[:, None, :, None]
    reset_in_chunk = (dch[:, -1] != d_prev)[:, None, None, None]

    dec = decay_matrix(cd.cum, mask)  # D[i, j] = e^{Λ_i − Λ_j} on i ≥ j (same document) [B, H, l, l]
    gd = jnp.einsum("bhir,bhjr->bhij", fq, zk, precision=_HI) * dec
    ps_r, ps_i = _cmul(b_r, b_i, er, -ei)  # Ps[j] = b_j e^{−iΦ_j}
    ps2 = jnp.concatenate([ps_r, ps_i], axis=-1)  # [B, H, l, 2M]
    gps = jnp.einsum("bhij,bhjm->bhim", gd, ps2, precision=_HI)
    p_r, p_i = _cmul(er, ei, gps[..., :m], gps[..., m:])  # e^{iΦ_i} ∘ ((G∘D) · Ps)
    ein = cd.into[..., None]  # e^{Λ_i} ≤ 1
    pin_r, pin_i = ein * er, ein * ei  # Pin[i] = e^{Λ_i + iΦ_i}: the decay of the carried state to token i
    xk2 = jnp.concatenate([xk_r, xk_i], axis=2)
    fx = jnp.einsum("bhlr,bhmr->bhlm", fq, xk2, precision=_HI)
    c_r, c_i = _cmul(pin_r, pin_i, fx[..., :m], fx[..., m:])
    p_r = p_r + jnp.where(carried, c_r, 0)
    p_i = p_i + jnp.where(carried, c_i, 0)
    if delta:  # p0 −= e^{iΦ_i} ∘ (F·Ũ), Rin[i] = e^{Λ_i} (real)
        u, fu = _erase_chunk(fq, zk, xs[8], xs[9], xk2,
                             lambda x: jnp.einsum("bhij,bhjm->bhim", x, ps2, precision=_HI), lambda y: ein * y,
                             mask, carried, dec)
        e_r, e_i = _cmul(er, ei, fu[..., :m], fu[..., m:])
        p_r, p_i = p_r - e_r, p_i - e_i
    q_r, q_i = (p_r, -p_i) if conj else (p_r, p_i)
    if kblock is None:
        w_r, w_i = q_r, q_i
    else:
        w2 = _table_dot(jnp.concatenate([q_r, q_i], -1), kblock, "hxm,hmn->hxn")
        w_r, w_i = w2[..., :m], w2[..., m:]
    a_r, a_i = _cmul(w_r, w_i, pin_r, pin_i)
    xv2 = jnp.concatenate([xv_r, xv_i], axis=2)
    o_carry = jnp.einsum("bhlm,bhmd->bhld", jnp.concatenate([a_r, -a_i], -1), xv2, precision=_HI)
    e_r, e_i = _cmul(w_r, w_i, er, ei)
    sc = jnp.einsum("bhim,bhjm->bhij", jnp.concatenate([e_r, -e_i], -1), ps2, precision=_HI) * dec
    o = jnp.einsum("bhij,bhjd->bhid", sc, zv, precision=_HI) + jnp.where(carried, o_carry, 0)
    # Carry: X1 = e^{Λ_{l−1} + iΦ_{l−1}} ∘ X0 (no reset in the chunk) + Σ_j Pe[j] ⊗ z_j (last document),
    # Pe[j] = e^{Λ_{l−1} − Λ_j} · e^{iΦ_{l−1}} · Ps[j]  (exponent ≤ 0; the phase by complex multiplication).
    last_r, last_i = er[:, :, -1:], ei[:, :, -1:]  # [B, H, 1, M]
    tail = cd.to_end[..., None]  # [B, H, l, 1]
    pe_r, pe_i = _cmul(ps_r, ps_i, last_r, last_i)
    pe2 = jnp.concatenate([pe_r * tail, pe_i * tail], axis=-1)
    zk_last = jnp.where(last_doc, zk, 0)
    zv_last = jnp.where(last_doc, zv, 0)
    nk = jnp.einsum("bhlm,bhlr->bhmr", pe2, zk_last, precision=_HI)
    nv = jnp.einsum("bhlm,bhld->bhmd", pe2, zv_last, precision=_HI)
    tot = cd.whole[..., None]  # [B, H, 1]
    tr, ti = (tot * last_r[:, :, 0])[..., None], (tot * last_i[:, :, 0])[..., None]  # [B, H, M, 1]
    dk_r, dk_i = _cmul(tr, ti, xk_r, xk_i)
    dv_r, dv_i = _cmul(tr, ti, xv_r, xv_i)
    keep = ~reset_in_chunk
    new = (jnp.where(keep, dk_r, 0) + nk[:, :, :m], jnp.where(keep, dk_i, 0) + nk[:, :, m:],
           jnp.where(keep, dv_r, 0) + nv[:, :, :m], jnp.where(keep, dv_i, 0) + nv[:, :, m:], dch[:, -1])
    if delta:  # Xk1 −= e^{iΦ_{l−1}} ∘ Σ_j e^{Λ_{l−1} − Λ_j} ũ_j ⊗ k̂_j over the last document
        uk = jnp.einsum("bhlm,bhlr->bhmr", jnp.where(last_doc, u * tail, 0), xs[8], precision=_HI)
        g_r, g_i = _cmul(last_r[:, :, 0, :, None], last_i[:, :, 0, :, None], uk[:, :, :m], uk[:, :, m:])
        new = (new[0] - g_r, new[1] - g_i) + new[2:]
    return new, o


def _mix_chunked_selective(fq, zk, zv, lam, b, c, conj, segment_ids, initial_state, rdt, chunk_size, beta=None):
    """The chunked form with per-token lam_t, b_t (module docstring, "Selective"); the chunks as the LTI form's
    (`chunked_scan`: a ragged last chunk at its true length)."""
    bsz, t, h, r = fq.shape
    d, m = zv.shape[-1], lam.shape[-1]
    cdt = complex_dtype(rdt)
    lam, b = per_token(lam.astype(cdt), b.astype(cdt), bsz, t)
    kblock = _fold_c(None if c is None else c.astype(cdt), conj, rdt)
    docs = document_index(segment_ids, bsz, t)
    g, ph = log_decay_angle(lam, rdt)  # [B, T, H], [B, T, H, M]
    carry = (*_state_planes(initial_state, bsz, h, m, r, d, rdt), jnp.zeros((bsz,), jnp.int32))
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [B, T, H, ...] -> [B, H, T, ...]
    xs = (*(heads_first(x.astype(rdt)) for x in (fq, zk, zv)), docs, heads_first(g), heads_first(ph),
          heads_first(jnp.real(b).astype(rdt)), heads_first(jnp.imag(b).astype(rdt)))
    axes = (2, 2, 2, 1, 2, 2, 2, 2)
    delta = beta is not None
    if delta:  # the delta update: k̂ [B, H, T, R] and β [B, H, T] travel with the chunk
        xs, axes = xs + (unit_keys(xs[1], rdt), heads_first(beta.astype(rdt))), axes + (2, 2)
    carry, o = chunked_scan(lambda _: lambda cr, x: _chunk_body_selective(cr, x, kblock, conj, delta), carry, xs,
                            axes, chunk_size, out_axis=2)  # o [B, H, T, D]
    xk_r, xk_i, xv_r, xv_i, _ = carry
    state = (lax.complex(xk_r, xk_i).astype(cdt), lax.complex(xv_r, xv_i).astype(cdt))
    return jnp.swapaxes(o, 1, 2), state


def delta_end_state(zk, zv, lam, b, beta, segment_ids=None, chunk_size: int = 64, core: Optional[str] = None):
    """One sequence shard's summary under the delta update (module docstring "Delta"; docs/model.md, "Delta core",
    the sequence split): (E [B, H, M, R+D] complex, A [B, H, M] complex or None, P [B, H, R, R] real).

    E = (Ek | Ev) is the state after the last token from a zero state, restarted at every document start (only the
    last document contributes); A = Π_t lam_t, the shard's decay (None for the LTI core, whose decay is lam^T);
    P = Π_t (I − β_t k̂_t k̂_tᵀ) in time order over the last document's tokens, the shard's erase product. A state
    entering a shard that holds no document start leaves it as Xk ↦ (A ∘ Xk)·P + Ek, Xv ↦ A ∘ Xv + Ev, and the
    triples compose associatively: (A, P, E) then (A', P', E') is (A'A, P P', (A' ∘ E)·P' + E'), with the erase
    product acting on the key columns only (decay and erase commute: modes on the left, features on the right).

    zk [B, T, H, R], zv [B, T, H, D] float; lam, b [H, M] (LTI) or [B, T, H, M] (selective); beta [B, T, H].
    Chunked as the operator (`chunked_scan`, a ragged last chunk at its true length), no readout: per chunk the
    state's erase solves N·Ũ = diag(β)·(strict(K̂·ZKᵀ [∘ D])·Ps + Rin ∘ (K̂·Xk0ᵀ)) and P's solves
    (I + diag(β)·strict(K̂·K̂ᵀ))·Ũp = diag(β)·K̂·Pᵀ, P ← P − Ũpᵀ·K̂ (the same system for the LTI core, whose decay
    sits in the tables; without D for the selective core)."""
    zk, zv = jnp.asarray(zk), jnp.asarray(zv)
    bsz, t, h, r = zk.shape
    d = zv.shape[-1]
    lam, b = jnp.asarray(lam), jnp.asarray(b)
    core = resolve_core(lam, b, core)
    rdt = real_dtype(zk, zv, lam, b)
    cdt = complex_dtype(rdt)
    m = lam.shape[-1]
    docs = document_index(segment_ids, bsz, t)
    last = jnp.swapaxes((docs == docs[:, -1:])[:, :, None], 1, 2)[..., None]  # [B, 1, T, 1]
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [B, T, H, ...] -> [B, H, T, ...]
    # The last document only: earlier tokens write nothing and erase nothing (k̂ = 0), so the state from zero stays
    # zero until the last document starts; P is read only for a shard without a document start (all one document).
    zk_, zv_ = (jnp.where(last, heads_first(x.astype(rdt)), 0) for x in (zk, zv))
    kh = unit_keys(zk_, rdt)
    beta_ = heads_first(jnp.asarray(beta).astype(rdt))
    eye = jnp.broadcast_to(jnp.eye(r, dtype=rdt), (bsz, h, r, r))
    zero = lambda w: jnp.zeros((bsz, h, m, w), rdt)  # noqa: E731
    selective = core == "selective"

    def solve(beta_c, kk, rhs):
        bcol = beta_c[..., None]
        return unit_lower_solve(bcol * kk, bcol * rhs)

    def common(l, zk_c, kh_c):
        strict = jnp.tril(jnp.ones((l, l), bool), -1)
        kk = jnp.where(strict, jnp.einsum("bhir,bhjr->bhij", kh_c, kh_c, precision=_HI), 0)
        kz = jnp.where(strict, jnp.einsum("bhir,bhjr->bhij", kh_c, zk_c, precision=_HI), 0)
        return strict, kk, kz

    if not selective:
        lam, b = lam.astype(cdt), b.astype(cdt)

        def body_lti(l):
            tab, dtab = _chunk_tables(lam, b, l, rdt), _delta_tables(lam, l, rdt)

            def body(carry, xs):
                xk_r, xk_i, xv_r, xv_i, pm = carry
                zk_c, zv_c, kh_c, beta_c = xs
                _, kk, kz = common(l, zk_c, kh_c)
                ps2 = jnp.concatenate(tab["ps"], axis=-1)  # [H, l, 2M]
                kx = jnp.einsum("bhlr,bhmr->bhlm", kh_c, jnp.concatenate([xk_r, xk_i], axis=2), precision=_HI)
                rin_r, rin_i = (x[None, :, None, :] for x in dtab["rin"])
                rhs = _table_dot(kz, ps2, "hxj,hjm->hxm") + jnp.concatenate(
                    _cmul(rin_r, rin_i, kx[..., :m], kx[..., m:]), axis=-1)
                kp = jnp.einsum("bhlr,bhsr->bhls", kh_c, pm, precision=_HI)  # K̂·Pᵀ
                sol = solve(beta_c, kk, jnp.concatenate([rhs, kp], axis=-1))
                u, up = sol[..., :2 * m], sol[..., 2 * m:]
                pe2 = jnp.concatenate(tab["pe"], axis=-1)
                nk = jnp.einsum("hlm,bhlr->bhmr", pe2, zk_c, precision=_HI)
                nv = jnp.einsum("hlm,bhld->bhmd", pe2, zv_c, precision=_HI)
                uk = jnp.einsum("bhlm,bhlr->bhmr", u, kh_c, precision=_HI)
                te_r, te_i = (x[None, :, :, None] for x in dtab["te"])
                g_r, g_i = _cmul(te_r, te_i, uk[:, :, :m], uk[:, :, m:])
                ll_r, ll_i = (x[None, :, :, None] for x in tab["lam_l"])
                dk_r, dk_i = _cmul(ll_r, ll_i, xk_r, xk_i)
                dv_r, dv_i = _cmul(ll_r, ll_i, xv_r, xv_i)
                pm = pm - jnp.einsum("bhls,bhlr->bhsr", up, kh_c, precision=_HI)
                return (dk_r + nk[:, :, :m] - g_r, dk_i + nk[:, :, m:] - g_i, dv_r + nv[:, :, :m],
                        dv_i + nv[:, :, m:], pm), jnp.zeros((bsz, h, l, 0), rdt)
            return body

        carry = (zero(r), zero(r), zero(d), zero(d), eye)
        (xk_r, xk_i, xv_r, xv_i, pm), _ = chunked_scan(body_lti, carry, (zk_, zv_, kh, beta_), (2, 2, 2, 2),
                                                       chunk_size, out_axis=2)
        trans = None
    else:
        lam, b = per_token(lam.astype(cdt), b.astype(cdt), bsz, t)
        g, ph = log_decay_angle(lam, rdt)

        def body_sel(l):
            def body(carry, xs):
                xk_r, xk_i, xv_r, xv_i, pm, a_r, a_i = carry
                zk_c, zv_c, kh_c, beta_c, g_c, ph_c, b_r, b_i = xs
                strict, kk, kz = common(l, zk_c, kh_c)
                cd = chunk_decay(g_c, ph_c, axis=2)
                er, ei = cd.cos, cd.sin
                dec = decay_matrix(cd.cum, strict)
                ps_r, ps_i = _cmul(b_r, b_i, er, -ei)  # b_j e^{−iΦ_j}
                ps2 = jnp.concatenate([ps_r, ps_i], axis=-1)
                kx = jnp.einsum("bhlr,bhmr->bhlm", kh_c, jnp.concatenate([xk_r, xk_i], axis=2), precision=_HI)
                rhs = (jnp.einsum("bhij,bhjm->bhim", kz * dec, ps2, precision=_HI) + cd.into[..., None] * kx)
                u = solve(beta_c, kk * dec, rhs)
                up = solve(beta_c, kk, jnp.einsum("bhlr,bhsr->bhls", kh_c, pm, precision=_HI))
                last_r, last_i = er[:, :, -1:], ei[:, :, -1:]  # e^{iΦ_{l−1}} [B, H, 1, M]
                tail = cd.to_end[..., None]
                pe_r, pe_i = _cmul(ps_r, ps_i, last_r, last_i)
                pe2 = jnp.concatenate([pe_r * tail, pe_i * tail], axis=-1)
                nk = jnp.einsum("bhlm,bhlr->bhmr", pe2, zk_c, precision=_HI)
                nv = jnp.einsum("bhlm,bhld->bhmd", pe2, zv_c, precision=_HI)
                uk = jnp.einsum("bhlm,bhlr->bhmr", u * tail, kh_c, precision=_HI)
                ph_r, ph_i = last_r[:, :, 0, :, None], last_i[:, :, 0, :, None]
                g_r, g_i = _cmul(ph_r, ph_i, uk[:, :, :m], uk[:, :, m:])
                tot = cd.whole[..., None]  # [B, H, 1]
                tr, ti = tot * last_r[:, :, 0], tot * last_i[:, :, 0]  # the chunk's decay [B, H, M]
                dk_r, dk_i = _cmul(tr[..., None], ti[..., None], xk_r, xk_i)
                dv_r, dv_i = _cmul(tr[..., None], ti[..., None], xv_r, xv_i)
                pm = pm - jnp.einsum("bhls,bhlr->bhsr", up, kh_c, precision=_HI)
                a_r, a_i = _cmul(tr, ti, a_r, a_i)
                return (dk_r + nk[:, :, :m] - g_r, dk_i + nk[:, :, m:] - g_i, dv_r + nv[:, :, :m],
                        dv_i + nv[:, :, m:], pm, a_r, a_i), jnp.zeros((bsz, h, l, 0), rdt)
            return body

        one, nil = jnp.ones((bsz, h, m), rdt), jnp.zeros((bsz, h, m), rdt)
        carry = (zero(r), zero(r), zero(d), zero(d), eye, one, nil)
        xs = (zk_, zv_, kh, beta_, heads_first(g), heads_first(ph), heads_first(jnp.real(b).astype(rdt)),
              heads_first(jnp.imag(b).astype(rdt)))
        (xk_r, xk_i, xv_r, xv_i, pm, a_r, a_i), _ = chunked_scan(body_sel, carry, xs, (2,) * 8, chunk_size,
                                                                 out_axis=2)
        trans = lax.complex(a_r, a_i).astype(cdt)
    x_end = jnp.concatenate([lax.complex(xk_r, xk_i), lax.complex(xv_r, xv_i)], axis=-1).astype(cdt)
    return x_end, trans, pm


# ----------------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------------


_PALLAS_FALLBACK_WARNED = False


def warn_pallas_fallback():
    """One warning per process: impl='pallas' with a per-token lam / b runs the chunked XLA form."""
    global _PALLAS_FALLBACK_WARNED
    if not _PALLAS_FALLBACK_WARNED:
        _PALLAS_FALLBACK_WARNED = True
        warnings.warn("interdomain_mix: impl='pallas' has no kernel for a per-token (selective) lam / b; running "
                      "the chunked XLA form instead (docs/kernels.md)", stacklevel=3)


def resolve_impl(impl: str, chunk_size: int = 64, selective: bool = False, delta: bool = False) -> str:
    """'auto' -> 'pallas' where the fused kernels are available (GPU/TPU) and take this chunk size, else 'chunked'.
    With a per-token lam (`selective`) or the delta update (`delta`), 'auto' is 'chunked' (the kernels are LTI
    without an erase only)."""
    if impl != "auto":
        return impl
    if selective or delta:
        return "chunked"
    if pallas_ops.pallas_available() and pallas_ops.chunk_size_supported(chunk_size):
        return "pallas"
    return "chunked"


def interdomain_mix(fq, zk, zv, lam, b, c=None, *, conj: bool = True, impl: str = "auto", chunk_size: int = 64,
                    segment_ids=None, initial_state=None, return_state: bool = False, out_dtype=None,
                    core: Optional[str] = None, beta=None):
    """Interdomain mixing over a sequence (see the module docstring for the math).

    Args:
      fq: [B, T, H, R] float: query features ξ(q_t).
      zk: [B, T, H, R] float: key half of the SSM input (k̃_t).
      zv: [B, T, H, D] float: value half (ṽ_t).
      lam, b: [H, M] complex: discrete decay (|lam| < 1) and input gain; or [B, T, H, M] complex, one value per
        token (selective: lam_t acts on the state before token t enters; |lam_t| <= 1 and one magnitude per
        (row, token, head) across the modes; either may stay [H, M]). See "Selective" in the module docstring.
      c: [H, M, M] complex readout mixing, or None for identity.
      conj: conjugate the query projection (Re(ξ(q)ᵀ U^H Γ)) or not (Re(ξ(q)ᵀ Uᵀ Γ)).
      impl: "auto" | "sequential" | "associative" | "chunked" | "pallas".
      chunk_size: chunk length L of the chunked / pallas paths (≤ idattn.ops.s4d.max_chunk_size(κ)).
      segment_ids: [B, T] int document ids (state reset where the id changes), or None.
      initial_state: (Xk [B, H, M, R], Xv [B, H, M, D]) complex for the first document, or None (zeros).
      return_state: also return (Xk, Xv) after the last position.
      out_dtype: output dtype (default: zv's dtype).
      core: "lti" (lam, b [H, M]) or "selective" (the per-token form; lam, b [B, T, H, M] or [H, M]); None reads
        it from lam's and b's shapes (`resolve_core`).
      beta: [B, T, H] real in [0, 2], the delta update's erase strength on the key state (module docstring
        "Delta"; either core), or None: today's operator. "auto" then runs the chunked form; "associative" and
        "pallas" refuse. β ≡ 0 computes today's function bit for bit.
    Returns:
      o [B, T, H, D], or (o, (Xk, Xv)) when return_state.
    """
    fq, zk, zv = jnp.asarray(fq), jnp.asarray(zk), jnp.asarray(zv)
    lam, b = jnp.asarray(lam), jnp.asarray(b)
    c = None if c is None else jnp.asarray(c)
    core = resolve_core(lam, b, core)
    beta = None if beta is None else jnp.asarray(beta)
    _validate(fq, zk, zv, lam, b, c, segment_ids, initial_state, impl, chunk_size, core, beta)
    selective = core == "selective"
    out_dtype = zv.dtype if out_dtype is None else jnp.dtype(out_dtype)
    rdt = real_dtype(fq, zk, zv, lam, b)
    impl = resolve_impl(impl, int(chunk_size), selective=selective, delta=beta is not None)
    if selective and impl == "pallas":
        warn_pallas_fallback()
        impl = "chunked"
    if selective and impl == "chunked":
        o, state = _mix_chunked_selective(fq, zk, zv, lam, b, c, conj, segment_ids, initial_state, rdt,
                                          int(chunk_size), beta)
    elif impl == "sequential":
        o, state = _mix_sequential(fq, zk, zv, lam, b, c, conj, segment_ids, initial_state, rdt, core, beta)
    elif impl == "associative":
        o, state = _mix_associative(fq, zk, zv, lam, b, c, conj, segment_ids, initial_state, rdt)
    elif impl == "chunked":
        o, state = _mix_chunked(fq, zk, zv, lam, b, c, conj, segment_ids, initial_state, rdt, int(chunk_size),
                                beta)
    else:  # pallas
        L = int(chunk_size)

        def chunked(fq, zk, zv, lam, b, c, seg, x0):  # a jax without the Triton backend, on GPU
            o, st = _mix_chunked(fq, zk, zv, lam, b, c, conj, seg, x0, rdt, L)
            return (o.astype(out_dtype), st) if return_state else o.astype(out_dtype)

        return pallas_ops.interdomain_mix_pallas(
            fq, zk, zv, lam, b, c, conj=conj, chunk_size=L, segment_ids=segment_ids,
            initial_state=initial_state, return_state=return_state, out_dtype=out_dtype, gpu_fallback=chunked)
    o = o.astype(out_dtype)
    return (o, state) if return_state else o


def interdomain_step(state, fq_t, zk_t, zv_t, lam, b, c=None, *, conj: bool = True, beta=None):
    """One decoding step: (o_t [B, H, D], new_state) from state (Xk [B, H, M, R], Xv [B, H, M, D]) complex and
    fq_t, zk_t [B, H, R], zv_t [B, H, D]. lam, b: [H, M] (time invariant) or this token's [B, H, M] (also
    accepted as [B, 1, H, M]): X ← lam_t ⊙ X + b_t ⊗ z_t. beta: this token's [B, H] (also [B, 1, H]) erase
    strength, Xk ← (lam_t ⊙ Xk)(I − β_t k̂_t k̂_tᵀ) + b_t ⊗ zk_t (module docstring "Delta"; one M×R complex
    matvec and a rank-one update more), or None. Cost and memory do not depend on the context length."""
    xk, xv = state
    if fq_t.ndim != 3 or zk_t.shape != fq_t.shape or zv_t.ndim != 3 or zv_t.shape[:2] != fq_t.shape[:2]:
        raise ValueError(f"interdomain_step wants fq_t, zk_t [B, H, R] and zv_t [B, H, D]; got fq_t "
                         f"{tuple(fq_t.shape)}, zk_t {tuple(zk_t.shape)}, zv_t {tuple(zv_t.shape)}")
    bsz, h, r = fq_t.shape
    lam, b = jnp.asarray(lam), jnp.asarray(b)
    lam, b = (x[:, 0] if x.ndim == 4 and x.shape[1] == 1 else x for x in (lam, b))
    for name, x in (("lam", lam), ("b", b)):
        if tuple(x.shape[:-1]) not in ((h,), (bsz, h)):
            raise ValueError(f"interdomain_step: {name} must be [H, M] = [{h}, M] or this token's [B, H, M] = "
                             f"[{bsz}, {h}, M]; got {tuple(x.shape)}")
    m = lam.shape[-1]
    if tuple(xk.shape) != (bsz, h, m, r) or tuple(xv.shape) != (bsz, h, m, zv_t.shape[-1]):
        raise ValueError(f"state must be (Xk [{bsz}, {h}, {m}, {r}], Xv [{bsz}, {h}, {m}, {zv_t.shape[-1]}]); got "
                         f"(Xk {list(xk.shape)}, Xv {list(xv.shape)})")
    if beta is not None:
        beta = jnp.asarray(beta)
        beta = beta[:, 0] if beta.ndim == 3 and beta.shape[1] == 1 else beta
        if tuple(beta.shape) != (bsz, h) or not jnp.issubdtype(beta.dtype, jnp.floating):
            raise ValueError(f"interdomain_step: beta must be this token's real [B, H] = [{bsz}, {h}]; got "
                             f"{shape_str(beta)}")
    rdt = real_dtype(fq_t, zk_t, zv_t, lam, b)
    cdt = complex_dtype(rdt)
    o_t, new_state = _step(xk.astype(cdt), xv.astype(cdt), fq_t, zk_t, zv_t, lam.astype(cdt), b.astype(cdt),
                           None if c is None else c.astype(cdt), conj, rdt, beta=beta)
    return o_t.astype(zv_t.dtype), new_state


def chunked_cost_macs(r: int, d: int, m: int, chunk: int, with_c: bool = True, delta: bool = False) -> int:
    """Real multiply-accumulates per token-head of the chunked form: L(R+D) + 4M(L+R+D) + 4M² (without c, no 4M²);
    the delta update adds 3LR + 5LM + 4MR (module docstring "Delta"). This is the mixer FLOP count (×2) used for
    MFU."""
    extra = 3 * chunk * r + 5 * chunk * m + 4 * m * r if delta else 0
    return chunk * (r + d) + 4 * m * (chunk + r + d) + (4 * m * m if with_c else 0) + extra


__all__ = ["interdomain_mix", "interdomain_step", "document_index", "log_decay_angle", "per_token", "associative_bytes",
           "set_associative_max_bytes", "associative_max_bytes", "chunked_cost_macs", "resolve_impl", "resolve_core",
           "chunk_decay", "ChunkDecay", "decay_matrix", "chunked_scan", "unit_keys", "check_beta", "delta_end_state", "IMPLS",
           "CORES"]

