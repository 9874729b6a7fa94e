r"""The linear S4D readout: the shared complex diagonal basis read out linearly in the state (S4D's y = Re(C x)).

This is the operator of the mechanism cube's `linear` readout (S4D-only = generic input + linear readout; paper
Fig. 3b/3d "linear: C_out z_t", Table 4 "vanilla S4D"). Per batch row and head, with W channels and M complex
modes:

    state    X_t = lam ⊙ X_{t-1} + b ⊗ z_t                 ∈ C^{M×W}   (one recurrence per head, every channel)
    readout  y_t[w] = Re( Σ_m c[m] X_t[m, w] )             ∈ R^W       (c ∈ C^M per head, shared by the channels)

The state includes token t. y is linear in the state and therefore in the inputs: it is a causal convolution of
each channel with one real kernel per head,

    y_t[w] = Σ_{s ≤ t} K[t - s] z_s[w],     K[τ] = Re( Σ_m c[m] b[m] lam[m]^τ ),

which is what the chunked path computes (no feature map, no query: nothing multiplies one state by another).
The layer (idattn.layers.interdomain) feeds the two SSM input halves as the W = R + d_h channels and chooses c.

Segment resets. `segment_ids` [B, T]: where seg[t] != seg[t-1] a new document starts and the state is zeroed
before token t enters (document index d_t = cumsum(seg[t] != seg[t-1]); ids may repeat, [1, 2, 1] is three
documents). `initial_state` applies to the first document only.

Chunked form (chunk length L, local positions i, k ∈ [0, l), l the chunk's true length), with X0 the state
carried into the chunk:

    Kt[τ]   = Re(Σ_m c[m] b[m] lam[m]^τ),  τ ∈ [0, l)               one constant kernel per head
    T[i,k]  = Kt[i - k]  if k ≤ i and d_i == d_k, else 0             (causal Toeplitz, masked to one document)
    Y       = T · Z + carried ∘ Re( (c ∘ lam^(i+1)) · X0 )          [l, W]
    X1      = [no reset in chunk] lam^l ∘ X0 + Σ_k b·lam^(l-1-k) ⊗ (last_doc ∘ Z)_k

`carried` keeps the positions before the first reset of the chunk, `last_doc` the tokens of the chunk's last
document.

Selective (per-token lam_t, b_t [B, T, H, M], lam_t acting on the state before token t enters, as in
idattn/ops/interdomain.py): lam_t = exp(g_t + iφ_t,m) with one log-decay g_t ≤ 0 per (row, token, head), the
magnitudes tied across the modes (refused otherwise when concrete). The kernel is no longer a convolution; per
chunk, with G_i = Σ_{j ≤ i} g_j and Φ_i = Σ_{j ≤ i} φ_j cumulated from the chunk's start (so angles never grow past
L·π, whatever T: no precision lost over long sequences),

    T[i,k]  = exp(G_i − G_k) · Re( Σ_m (c_m e^{iΦ_i,m}) (b_k,m e^{−iΦ_k,m}) )   k ≤ i, d_i == d_k, else 0
    Y       = T · Z + carried ∘ Re( (c ∘ e^{G_i + iΦ_i}) · X0 )
    X1      = [no reset] e^{G_l−1 + iΦ_l−1} ∘ X0 + Σ_k (last_doc ∘ e^{G_l−1 − G_k + i(Φ_l−1 − Φ_k)} ∘ b_k) ⊗ z_k

every exponent G_i − G_k (i ≥ k) ≤ 0. Cost per token-head L·(W + 2M) + 4M·W real MACs. Every exponent is ≥ 0, so |lam^τ| ≤ 1 and there is no chunk-size bound (unlike the query readout's
μ-centred tables). Complex products are real matmuls on stacked real/imaginary planes. Cost per token-head:
L·W (the convolution) + 4M·W (carry in and out) real MACs. State and accumulation run in float32/complex64
(float64/complex128 when the inputs are float64 under x64); matmuls use precision=HIGHEST.
"""
from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
import numpy as np
from jax import lax

from idattn.ops.interdomain import (check_selective_lam, chunk_decay, chunked_scan, complex_dtype, decay_matrix,
                                    document_index, document_starts, is_concrete, log_decay_angle, mode_powers,
                                    per_token, real_dtype, resolve_core, shape_str)

LINEAR_IMPLS = ("auto", "sequential", "chunked")
_HI = lax.Precision.HIGHEST


def _validate(z, lam, b, c, segment_ids, initial_state, impl, chunk_size, core):
    if impl not in LINEAR_IMPLS:
        raise ValueError(f"impl must be one of {LINEAR_IMPLS} for the linear S4D readout, got {impl!r} "
                         "(the chunked path is a convolution: no associative or pallas path is needed)")
    if z.ndim != 4:
        raise ValueError(f"z must be [B, T, H, W], got {shape_str(z)}")
    if not jnp.issubdtype(z.dtype, jnp.floating):
        raise TypeError(f"z must be a real floating array (float32/bfloat16/float64), got {z.dtype}")
    bsz, t, h, w = z.shape
    for name, x in (("lam", lam), ("b", b), ("c", c)):
        per_tok = name != "c" and core == "selective" and x.ndim != 2  # the selective core: either may stay [H, M]
        if per_tok and tuple(x.shape[:-1]) != (bsz, t, h):
            raise ValueError(f"{name} per token must be [B, T, H, M] = [{bsz}, {t}, {h}, M] complex; got "
                             f"{shape_str(x)}")
        if not per_tok and (x.ndim != 2 or x.shape[0] != h):
            raise ValueError(f"{name} must be [H, M] = [{h}, M] complex" + ("" if name == "c" else
                             " (or [B, T, H, M] per token)") + f"; got {shape_str(x)}")
        if not jnp.issubdtype(x.dtype, jnp.complexfloating):
            raise TypeError(f"{name} must be complex (complex64/complex128), got {x.dtype}; build it with "
                            f"jax.lax.complex(re, im)")
    m = lam.shape[-1]
    if b.shape[-1] != m or c.shape != (h, m):
        raise ValueError(f"b and c must have lam's M = {m} modes (c [H, M] = [{h}, {m}]); got b {tuple(b.shape)}, "
                         f"c {tuple(c.shape)}")
    if segment_ids is not None:
        if tuple(segment_ids.shape) != (bsz, t):
            raise ValueError(f"segment_ids must be [B, T] = [{bsz}, {t}]; got {tuple(segment_ids.shape)}")
        if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
            raise TypeError(f"segment_ids must be an integer array (document ids), got {segment_ids.dtype}")
    if initial_state is not None:
        if tuple(initial_state.shape) != (bsz, h, m, w) or not jnp.issubdtype(initial_state.dtype,
                                                                            jnp.complexfloating):
            raise ValueError(f"initial_state must be complex X [B, H, M, W] = [{bsz}, {h}, {m}, {w}]; got "
                             f"{shape_str(initial_state)}")
    if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if core == "selective":
        if is_concrete(lam):
            check_selective_lam(lam, real_dtype(z, lam))
        return
    if is_concrete(lam):
        mag = np.abs(np.asarray(lam))
        if not np.all(np.isfinite(mag)) or mag.max() >= 1.0:
            raise ValueError(f"lam must satisfy |lam| < 1 (a stable decay); saw max |lam| = {mag.max():.8g}. "
                             f"Build lam with idattn.ops.s4d.discretize, which keeps Re(Δ·A) ≥ -κ < 0")


def _mix_sequential(z, lam, b, c, segment_ids, initial_state, rdt):
    bsz, t, h, w = z.shape
    m = lam.shape[-1]
    cdt = complex_dtype(rdt)
    lam, b = per_token(lam.astype(cdt), b.astype(cdt), bsz, t)  # [B, T, H, M] (a constant lam: broadcast)
    c = c.astype(cdt)
    x0 = jnp.zeros((bsz, h, m, w), cdt) if initial_state is None else initial_state.astype(cdt)
    resets = document_starts(segment_ids, bsz, t)

    def step(x, inp):
        z_t, r_t, lam_t, b_t = inp
        x = jnp.where(r_t[:, None, None, None], jnp.zeros((), cdt), lam_t[..., None] * x)
        x = x + b_t[..., None] * z_t.astype(rdt).astype(cdt)[:, :, None, :]
        y = jnp.real(jnp.einsum("hm,bhmw->bhw", c, x, precision=_HI))
        return x, y

    xs = tuple(jnp.swapaxes(a, 0, 1) for a in (z, resets, lam, b))
    x, ys = lax.scan(step, x0, xs)
    return jnp.swapaxes(ys, 0, 1), x


def _tables(lam, b, c, length, rdt):
    """Kernel Kt [H, l], carry-in table c·lam^(i+1) [H, l, M] and carry-out table b·lam^(l-1-k) [H, l, M] (real
    planes), and lam^l [H, M] (planes) for a chunk of true length `length`."""
    log_lam = jnp.log(lam)
    lr, li = jnp.real(log_lam).astype(rdt), jnp.imag(log_lam).astype(rdt)
    br, bi = jnp.real(b).astype(rdt)[:, None, :], jnp.imag(b).astype(rdt)[:, None, :]
    cr, ci = jnp.real(c).astype(rdt)[:, None, :], jnp.imag(c).astype(rdt)[:, None, :]
    pos = jnp.arange(length, dtype=rdt)
    p_r, p_i = mode_powers(lr, li, pos)  # lam^τ
    cb_r, cb_i = cr * br - ci * bi, cr * bi + ci * br
    kt = jnp.sum(cb_r * p_r - cb_i * p_i, axis=-1)  # Re(c b lam^τ) summed over modes: [H, l]
    q_r, q_i = mode_powers(lr, li, pos + 1)
    cin = (cr * q_r - ci * q_i, cr * q_i + ci * q_r)
    e_r, e_i = mode_powers(lr, li, (length - 1) - pos)
    cout = (br * e_r - bi * e_i, br * e_i + bi * e_r)
    lam_l = mode_powers(lr, li, jnp.asarray([float(length)], rdt))
    return dict(kt=kt, cin=cin, cout=cout, lam_l=(lam_l[0][:, 0], lam_l[1][:, 0]))


def _chunk_body(carry, xs, tables):
    """carry: (x_r, x_i [B, H, M, W], d_prev [B]); xs: z [B, H, l, W], d [B, l]. Returns (carry, y [B, H, l, W])."""
    x_r, x_i, d_prev = carry
    zc, dch = xs
    l = zc.shape[2]
    m = x_r.shape[2]
    kt = tables["kt"]
    cin_r, cin_i = tables["cin"]
    cout_r, cout_i = tables["cout"]
    laml_r, laml_i = tables["lam_l"]

    same_doc = dch[:, :, None] == dch[:, None, :]  # [B, l, l]
    ii = jnp.arange(l)
    diff = ii[:, None] - ii[None, :]
    causal = diff >= 0
    toeplitz = jnp.where(causal[None], kt[:, jnp.clip(diff, 0, l - 1)], 0)  # [H, l, l]
    tm = jnp.where((same_doc & causal)[:, None], toeplitz[None], 0)  # [B, H, l, l]
    carried = (dch == d_prev[:, None])[:, None, :, None]  # [B, 1, l, 1]
    last_doc = (dch == dch[:, -1:])[:, None, :, None]
    reset_in_chunk = (dch[:, -1] != d_prev)[:, None, None, None]

    y = jnp.einsum("bhik,bhkw->bhiw", tm, zc, precision=_HI)
    # Carried term Re((c ∘ lam^(i+1)) · X0) = [cin_r, -cin_i] · [X0_r; X0_i].
    a2 = jnp.concatenate([cin_r, -cin_i], axis=-1)  # [H, l, 2M]
    x2 = jnp.concatenate([x_r, x_i], axis=2)  # [B, H, 2M, W]
    y = y + jnp.where(carried, jnp.einsum("him,bhmw->bhiw", a2, x2, precision=_HI), 0)
    # Carry out.
    zl = jnp.where(last_doc, zc, 0)
    pe2 = jnp.concatenate([cout_r, cout_i], axis=-1)  # [H, l, 2M]
    n = jnp.einsum("hlm,bhlw->bhmw", pe2, zl, precision=_HI)
    dr = laml_r[None, :, :, None] * x_r - laml_i[None, :, :, None] * x_i
    di = laml_r[None, :, :, None] * x_i + laml_i[None, :, :, None] * x_r
    keep = ~reset_in_chunk
    new = (jnp.where(keep, dr, 0) + n[:, :, :m], jnp.where(keep, di, 0) + n[:, :, m:], dch[:, -1])
    return new, y


def _mix_chunked(z, lam, b, c, segment_ids, initial_state, rdt, chunk_size):
    bsz, t, h, w = z.shape
    m = lam.shape[-1]
    cdt = complex_dtype(rdt)
    lam, b, c = lam.astype(cdt), b.astype(cdt), c.astype(cdt)
    docs = document_index(segment_ids, bsz, t)
    if initial_state is None:
        x0 = (jnp.zeros((bsz, h, m, w), rdt), jnp.zeros((bsz, h, m, w), rdt))
    else:
        x0 = (jnp.real(initial_state).astype(rdt), jnp.imag(initial_state).astype(rdt))
    carry = (*x0, jnp.zeros((bsz,), jnp.int32))
    z_ = jnp.swapaxes(z.astype(rdt), 1, 2)  # [B, H, T, W]

    def chunk_body(length):  # the kernel and carry tables of a chunk of `length` tokens
        tables = _tables(lam, b, c, length, rdt)
        return lambda cr, xs: _chunk_body(cr, xs, tables)

    carry, y = chunked_scan(chunk_body, carry, (z_, docs), (2, 1), chunk_size, out_axis=2)
    x_r, x_i, _ = carry
    return jnp.swapaxes(y, 1, 2), lax.complex(x_r, x_i).astype(cdt)


def _selective_chunk(carry, xs, c):
    """One chunk of the selective form (module docstring). carry: (X [B, H, M, W] complex, d_prev [B]); xs: g
    [B, l, H], φ, b [B, l, H, M], z [B, l, H, W], d [B, l]. Returns (carry, y [B, l, H, W])."""
    x, d_prev = carry
    g, phi, bt, zc, dch = xs
    cdt = x.dtype
    cd = chunk_decay(g, phi, axis=1)  # G_i [B, l, H] (non-increasing), e^{iΦ_i} [B, l, H, M] from the chunk's start
    rot = lax.complex(cd.cos, cd.sin).astype(cdt)  # e^{iΦ_i}
    a = c[None, None] * rot  # c_m e^{iΦ_i,m}
    bk = bt * jnp.conj(rot)  # b_k,m e^{−iΦ_k,m}
    s = jnp.real(jnp.einsum("bihm,bkhm->bhik", a, bk, precision=_HI))
    l = zc.shape[1]
    ii = jnp.arange(l)
    mask = (ii[:, None] >= ii[None, :])[None] & (dch[:, :, None] == dch[:, None, :])  # [B, l, l]
    decay = decay_matrix(jnp.moveaxis(cd.cum, 2, 1), mask[:, None])  # e^{G_i − G_k} [B, H, i, k]
    y = jnp.einsum("bhik,bkhw->bihw", s * decay, zc, precision=_HI)
    carried = (dch == d_prev[:, None])[:, :, None, None]  # [B, l, 1, 1]
    a_in = a * cd.into[..., None].astype(cdt)  # c_m e^{G_i + iΦ_i,m}
    y = y + jnp.where(carried, jnp.real(jnp.einsum("bihm,bhmw->bihw", a_in, x, precision=_HI)), 0)
    last_doc = (dch == dch[:, -1:])[:, :, None, None]  # [B, l, 1, 1]
    g_out = cd.to_end[..., None].astype(cdt)  # e^{G_l−1 − G_k}
    w_out = jnp.where(last_doc, g_out * rot[:, -1:] * bk, 0)  # e^{G_l−1 − G_k + i(Φ_l−1 − Φ_k)} b_k
    n = jnp.einsum("bkhm,bkhw->bhmw", w_out, zc.astype(cdt), precision=_HI)
    whole = (cd.whole[..., None].astype(cdt) * rot[:, -1])[..., None]  # [B, H, M, 1]
    keep = (dch[:, -1] == d_prev)[:, None, None, None]
    return (jnp.where(keep, whole * x, 0) + n, dch[:, -1]), y


def _mix_chunked_selective(z, lam, b, c, segment_ids, initial_state, rdt, chunk_size):
    """The chunked form with per-token lam_t, b_t; the chunks as the LTI form's (`chunked_scan`: a ragged last
    chunk at its true length)."""
    bsz, t, h, w = z.shape
    m = lam.shape[-1]
    cdt = complex_dtype(rdt)
    lam, b = per_token(lam.astype(cdt), b.astype(cdt), bsz, t)
    g, phi = log_decay_angle(lam, rdt)  # [B, T, H], [B, T, H, M]
    docs = document_index(segment_ids, bsz, t)
    x0 = jnp.zeros((bsz, h, m, w), cdt) if initial_state is None else initial_state.astype(cdt)
    c = c.astype(cdt)
    (x, _), y = chunked_scan(lambda _: lambda cr, xc: _selective_chunk(cr, xc, c), (x0, jnp.zeros((bsz,), jnp.int32)),
                             (g, phi, b, z.astype(rdt), docs), (1, 1, 1, 1, 1), chunk_size, out_axis=1)
    return y, x


def s4d_linear_mix(z, lam, b, c, *, impl: str = "auto", chunk_size: int = 64, segment_ids=None,
                   initial_state=None, return_state: bool = False, out_dtype=None, core: Optional[str] = None):
    """Linear S4D readout over a sequence (see the module docstring for the math).

    Args:
      z: [B, T, H, W] float: the SSM input channels (the layer passes both halves [k̃, ṽ], W = R + d_h).
      lam, b: [H, M] complex: discrete decay (|lam| < 1) and input gain; or [B, T, H, M] per token (selective:
        lam_t acts on the state before token t enters; |lam_t| ≤ 1, one magnitude per (row, token, head)).
      c: [H, M] complex: the readout vector over modes (y = Re(Σ_m c_m X[m])).
      impl: "auto" (= "chunked") | "sequential" | "chunked".
      chunk_size: chunk length L of the chunked path (any positive int: every power table has |·| ≤ 1).
      segment_ids: [B, T] int document ids (state reset where the id changes), or None.
      initial_state: X [B, H, M, W] complex for the first document, or None (zeros).
      return_state: also return X after the last position.
      out_dtype: output dtype (default: z's dtype).
      core: "lti" (lam, b [H, M]) or "selective" (the per-token form); None reads it from lam's and b's shapes.
    Returns:
      y [B, T, H, W], or (y, X [B, H, M, W]) when return_state.
    """
    z, lam, b, c = jnp.asarray(z), jnp.asarray(lam), jnp.asarray(b), jnp.asarray(c)
    core = resolve_core(lam, b, core)
    _validate(z, lam, b, c, segment_ids, initial_state, impl, chunk_size, core)
    out_dtype = z.dtype if out_dtype is None else jnp.dtype(out_dtype)
    rdt = real_dtype(z, lam, b, c)
    if impl == "sequential":
        y, x = _mix_sequential(z, lam, b, c, segment_ids, initial_state, rdt)
    elif core == "selective":
        y, x = _mix_chunked_selective(z, lam, b, c, segment_ids, initial_state, rdt, int(chunk_size))
    else:
        y, x = _mix_chunked(z, lam, b, c, segment_ids, initial_state, rdt, int(chunk_size))
    y = y.astype(out_dtype)
    return (y, x) if return_state else y


def s4d_linear_step(state, z_t, lam, b, c):
    """One decoding step: (y_t [B, H, W], new_state X [B, H, M, W]) from X [B, H, M, W] complex and z_t
    [B, H, W]; lam, b [H, M], or this token's [B, H, M] (selective). X ← lam ⊙ X + b ⊗ z_t;  y_t = Re(Σ_m c_m X[m]). Cost and memory do not depend on the context."""
    if z_t.ndim != 3:
        raise ValueError(f"s4d_linear_step wants z_t [B, H, W]; got {tuple(z_t.shape)}")
    bsz, h, w = z_t.shape
    m = lam.shape[-1]
    if tuple(state.shape) != (bsz, h, m, w):
        raise ValueError(f"state must be X [{bsz}, {h}, {m}, {w}] complex; got {list(state.shape)}")
    rdt = real_dtype(z_t, lam, b, c)
    cdt = complex_dtype(rdt)
    lam, b, c = lam.astype(cdt), b.astype(cdt), c.astype(cdt)
    lam = lam[..., None] if lam.ndim == 3 else lam[None, :, :, None]  # this token's [B, H, M], or [H, M]
    b = b[..., None] if b.ndim == 3 else b[None, :, :, None]
    x = lam * state.astype(cdt) + b * z_t.astype(rdt).astype(cdt)[:, :, None]
    y = jnp.real(jnp.einsum("hm,bhmw->bhw", c, x, precision=_HI))
    return y.astype(z_t.dtype), x


def linear_cost_macs(w: int, m: int, chunk: int) -> int:
    """Real MACs per token-head of the chunked linear readout: L·W (convolution) + 4M·W (carry in and out)."""
    return chunk * w + 4 * m * w


__all__ = ["s4d_linear_mix", "s4d_linear_step", "linear_cost_macs", "LINEAR_IMPLS"]
