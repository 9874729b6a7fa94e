r"""Sequence parallelism by state passing: the operators with the length axis split over mesh devices.

Per batch row and head, split T into P contiguous shards of length S (shard p holds tokens [pS, (p+1)S)). Both
operators carry a state of the one recurrence X_t = lam ⊙ X_{t-1} + b ⊗ z_t (Interdomain: z = [k̃ | ṽ], the Xk and
Xv halves; the linear readout: z its W channels), and each reads its output from the state exactly given the state
that enters its first document (the operator's `initial_state`). Because lam is time invariant:

    E_p      = Σ_{t in p, t in p's last document} lam^(end_p − t) ∘ (b ⊗ z_t)     shard p's zero-initialised end state
    A_p      = lam^S  if shard p holds no document start (none inside, none at its first token), else 0
    X_out(p) = A_p ∘ X_out(p−1) + E_p,      X_out(−1) = 0                      the state after shard p
    X_in(p)  = 0 if a document starts at p's first token, else X_out(p−1)     the state entering shard p

so each device computes E_p with one state-only pass (`end_state`: the chunk end-state accumulation, no
readout, 4·M·W real MACs per token-head), all devices `all_gather` the P end states (2·H·M·W real numbers per
row: a few hundred KiB per layer, whatever S) and the first/last segment id of every shard, fold the P pairs
(A_j, E_j) in order (P steps of an elementwise complex multiply-add), and then run the ordinary operator on
their shard with `initial_state = X_in(p)`. Document starts are detected from segment ids, so a document that
crosses a boundary is one document and a reset exactly at a boundary resets. Gradients flow through
`shard_map`'s collectives (the all_gather transposes to a reduce-scatter) and the operators' initial-state
cotangent; nothing is recomputed across devices.

A per-token (selective) lam_t [B, T, H, M] changes only A_p: the product Π_{t in p} lam_t of the shard's
decays (0 when the shard holds a document start), per row and head. E_p comes from `end_state_selective`
(exponents ≤ 0, the phase product by complex multiplication, never by summing angles over the shard), and the
pairs (A_j, E_j) still combine associatively: (A, E)∘(A', E') = (A'A, A'E + E'). The transitions are
all_gathered with the end states (2·H·M more real numbers per row and shard).

The delta update (`beta`, idattn/ops/interdomain.py "Delta") erases on the key features, on the right of the
key state, where the mode decay acts on the left, so a shard maps the key half as Xk ↦ (A_p ∘ Xk)·P_p + Ek_p with
P_p = Π_{t in p} (I − β_t k̂_t k̂_tᵀ) (R×R real, in time order) and the value half as before. The triples compose
as (A, P, E)∘(A', P', E') = (A'A, P P', (A' ∘ E)·P' + E'), associative, so the fold is exact; `delta_end_state`
computes (E_p, Π lam_t, P_p) in one state-only chunked pass and the P_p are all_gathered with the end states
(H·R² more real numbers per row and shard).

A prefill chunk continuing a cached state starts the fold from it (X_out(−1) = X0 instead of 0), and the state
after the chunk is X_out(P − 1), which every shard computes alike in the same fold (`initial_state`,
`return_state` of the two operators; `idattn.eval.scoring.prefill_on_mesh`).

`sequence_partition` reads the mesh in context and the logical axis rules ("batch", "length", "heads"; the
trainer sets them), so the layers call `interdomain_mix_sequence` / `s4d_linear_mix_sequence` and fall back to
the plain operators when no mesh axis splits the length.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from idattn.ops.interdomain import (check_beta, chunk_decay, complex_dtype, delta_end_state, document_index,
                                   interdomain_mix, log_decay_angle, per_token, real_dtype, resolve_core,
                                   resolve_impl)
from idattn.ops.pallas.op import interdomain_mix_pallas, logical_mesh_axes, mesh_partition, partition_spec
from idattn.ops.s4d_linear import s4d_linear_mix

_HI = lax.Precision.HIGHEST
_DEFAULT_SEQUENCE_AXES = ("sequence",)


def end_state(z, lam, b, segment_ids=None, chunk_size: int = 64):
    """X after the last token of X_t = lam ⊙ X_{t-1} + b ⊗ z_t from X = 0, restarted at every document start:
    [B, H, M, W] complex (complex128 for float64 inputs). Only the last document contributes.

    z [B, T, H, W] float; lam, b [H, M] complex; segment_ids [B, T] or None. Chunked: per chunk of L tokens
    X ← lam^L ∘ X + Σ_k b·lam^(L−1−k) ⊗ z_k as one real matmul on stacked planes; zero tokens are prepended to
    make T a multiple of L (they add nothing and start no document)."""
    z = jnp.asarray(z)
    bsz, t, h, w = z.shape
    rdt = real_dtype(z, lam, b)
    cdt = jnp.complex128 if rdt == jnp.float64 else jnp.complex64
    lam, b = jnp.asarray(lam).astype(cdt), jnp.asarray(b).astype(cdt)
    m = lam.shape[-1]
    docs = document_index(segment_ids, bsz, t)
    z = jnp.where((docs == docs[:, -1:])[:, :, None, None], z.astype(rdt), 0)  # the last document only
    big_l = max(1, min(int(chunk_size), t))
    pad = (-t) % big_l
    if pad:
        z = jnp.concatenate([jnp.zeros((bsz, pad, h, w), rdt), z], axis=1)
    n = (t + pad) // big_l
    log_lam = jnp.log(lam)  # principal branch; |lam| < 1 so every power below has magnitude <= 1
    k = jnp.arange(big_l, dtype=rdt)
    pe = b[:, None, :] * jnp.exp((big_l - 1 - k)[None, :, None] * log_lam[:, None, :])  # [H, L, M]
    pe2 = jnp.concatenate([jnp.real(pe), jnp.imag(pe)], axis=-1).astype(rdt)  # [H, L, 2M]
    lam_l = jnp.exp(big_l * log_lam)  # [H, M]
    zc = jnp.moveaxis(z.reshape(bsz, n, big_l, h, w), 1, 0)  # [n, B, L, H, W]

    def body(x, zch):
        x_r, x_i = x
        add = jnp.einsum("hlm,blhw->bhmw", pe2, zch, precision=_HI)  # [B, H, 2M, W]
        lr, li = jnp.real(lam_l)[None, :, :, None], jnp.imag(lam_l)[None, :, :, None]
        return (lr * x_r - li * x_i + add[:, :, :m], lr * x_i + li * x_r + add[:, :, m:]), None

    zero = jnp.zeros((bsz, h, m, w), rdt)
    (x_r, x_i), _ = lax.scan(body, (zero, zero), zc)
    return lax.complex(x_r, x_i).astype(cdt)


def end_state_selective(z, lam, b, segment_ids=None, chunk_size: int = 64):
    """Per-token lam_t, b_t [B, T, H, M] (either may be [H, M]): (X_end [B, H, M, W], Π_t lam_t [B, H, M]), the
    zero-initialised end state of X_t = lam_t ⊙ X_{t-1} + b_t ⊗ z_t restarted at every document start (only the
    last document contributes) and the product of all the tokens' decays (the shard's transition when it holds
    no document start). Chunked as the operator's selective form: per chunk, with Λ_i = Σ_{s≤i} g_s and
    Φ_i = Σ_{s≤i} φ_s (`log_decay_angle`), X ← e^{Λ_{l−1}+iΦ_{l−1}} ∘ X + Σ_j b_j e^{Λ_{l−1}−Λ_j}
    e^{i(Φ_{l−1}−Φ_j)} ⊗ z_j (exponents ≤ 0). The product across chunks is a complex multiplication: no angle
    is summed beyond one chunk. Identity tokens (lam = 1, b = 0, z = 0) are prepended to make T a multiple of L."""

    z = jnp.asarray(z)
    bsz, t, h, w = z.shape
    rdt = real_dtype(z, lam, b)
    cdt = complex_dtype(rdt)
    lam, b = per_token(jnp.asarray(lam).astype(cdt), jnp.asarray(b).astype(cdt), bsz, t)
    m = lam.shape[-1]
    docs = document_index(segment_ids, bsz, t)
    z = jnp.where((docs == docs[:, -1:])[:, :, None, None], z.astype(rdt), 0)  # the last document only
    g, ph = log_decay_angle(lam, rdt)
    br, bi = jnp.real(b).astype(rdt), jnp.imag(b).astype(rdt)
    big_l = max(1, min(int(chunk_size), t))
    pad = (-t) % big_l
    n = (t + pad) // big_l

    def chunks(x):  # [B, T, ...] -> [n, B, L, ...] with `pad` zeros in front
        if pad:
            x = jnp.concatenate([jnp.zeros((bsz, pad) + x.shape[2:], x.dtype), x], axis=1)
        return jnp.moveaxis(x.reshape((bsz, n, big_l) + x.shape[2:]), 1, 0)

    def body(carry, xs):
        x_r, x_i, p_r, p_i = carry  # state [B, H, M, W], product [B, H, M]
        zc, gc, pc, brc, bic = xs  # [B, L, H, W], [B, L, H], [B, L, H, M] ×3
        cd = chunk_decay(gc, pc, axis=1)  # Λ [B, L, H], e^{iΦ} [B, L, H, M] from the chunk's start
        er, ei = cd.cos, cd.sin
        tail = cd.to_end[..., None]  # [B, L, H, 1]
        dr, di = er[:, -1:] * er + ei[:, -1:] * ei, ei[:, -1:] * er - er[:, -1:] * ei  # e^{i(Φ_{l−1} − Φ_j)}
        pe_r, pe_i = (brc * dr - bic * di) * tail, (brc * di + bic * dr) * tail
        pe2 = jnp.concatenate([pe_r, pe_i], axis=-1)  # [B, L, H, 2M]
        add = jnp.einsum("blhm,blhw->bhmw", pe2, zc, precision=_HI)
        tot = cd.whole[..., None]  # [B, H, 1]
        tr, ti = tot * er[:, -1], tot * ei[:, -1]  # [B, H, M]
        x_r, x_i = (tr[..., None] * x_r - ti[..., None] * x_i + add[:, :, :m],
                    tr[..., None] * x_i + ti[..., None] * x_r + add[:, :, m:])
        return (x_r, x_i, tr * p_r - ti * p_i, tr * p_i + ti * p_r), None

    zero = jnp.zeros((bsz, h, m, w), rdt)
    one, nil = jnp.ones((bsz, h, m), rdt), jnp.zeros((bsz, h, m), rdt)
    (x_r, x_i, p_r, p_i), _ = lax.scan(body, (zero, zero, one, nil),
                                       (chunks(z), chunks(g), chunks(ph), chunks(br), chunks(bi)))
    return lax.complex(x_r, x_i).astype(cdt), lax.complex(p_r, p_i).astype(cdt)


def incoming_state(x_end, segment_ids, lam, shard_len: int, axis, transition=None, initial=None,
                   return_final: bool = False, erase=None):
    """Inside `shard_map` over the sequence axes `axis`: the state entering this shard (X_in(p) in the module
    docstring), from every shard's zero-initialised end state `x_end` [B, H, M, W] and this shard's segment ids
    [B, S]. Collectives: one all_gather of the end states (as real planes) and of the first / last segment ids.
    `transition` [B, H, M] complex: this shard's Π_t lam_t for a per-token lam (then `lam` is unused and the
    transitions are gathered too); None: lam^S from the time-invariant lam [H, M].

    `initial` [B, H, M, W]: the state entering the whole sequence's first document (X_out(−1) = initial instead of
    0: a prefill chunk continuing a cached state). `return_final`: also return X_out(P − 1), the state after the
    sequence's last token, which the fold computes on every shard alike (the decoding cache after a prefill).

    `erase` [B, H, R, R] real: this shard's erase product P under the delta update (`delta_end_state`), acting on
    the first R columns of the state (the key half): X_out(j) = (A_j ∘ X_out(j−1))·P_j + E_j there (gathered too)."""
    rdt = jnp.float64 if x_end.dtype == jnp.complex128 else jnp.float32
    planes = lax.all_gather(jnp.stack([jnp.real(x_end), jnp.imag(x_end)]).astype(rdt), axis)  # [P, 2, B, H, M, W]
    seg = jnp.asarray(segment_ids)
    firsts, lasts = lax.all_gather(seg[:, 0], axis), lax.all_gather(seg[:, -1], axis)  # [P, B]
    inside = lax.all_gather(jnp.any(seg[:, 1:] != seg[:, :-1], axis=1), axis)  # [P, B]
    starts = jnp.concatenate([jnp.zeros_like(firsts[:1], bool), firsts[1:] != lasts[:-1]], axis=0)  # [P, B]
    passes = ~(starts | inside)
    if transition is None:
        decay = jnp.exp(float(shard_len) * jnp.log(lam.astype(x_end.dtype)))  # lam^S [H, M]
        dplanes = jnp.broadcast_to(jnp.stack([jnp.real(decay), jnp.imag(decay)]).astype(rdt)[None, :, None],
                                   (planes.shape[0], 2, 1) + decay.shape)  # [P, 2, 1, H, M]
    else:  # the pair (Π lam_t, E_p) of every shard
        dplanes = lax.all_gather(jnp.stack([jnp.real(transition), jnp.imag(transition)]).astype(rdt), axis)

    def fold(x, xs):  # X_out(j) = A_j ∘ X_out(j−1) + E_j
        (x_r, x_i), (e, dp, ok) = x, xs[:3]
        d_r, d_i = dp[0][..., None], dp[1][..., None]
        keep = ok[:, None, None, None]
        if erase is None:
            x_r, x_i = (jnp.where(keep, d_r * x_r - d_i * x_i, 0) + e[0],
                        jnp.where(keep, d_r * x_i + d_i * x_r, 0) + e[1])
            return (x_r, x_i), (x_r, x_i)
        # the delta update: the key columns leave as (A_j ∘ X)·P_j (decay and erase commute)
        pm = xs[3]
        y_r, y_i = d_r * x_r - d_i * x_i, d_r * x_i + d_i * x_r
        y_r, y_i = (jnp.concatenate([jnp.einsum("bhms,bhsr->bhmr", y[..., :r], pm, precision=_HI), y[..., r:]],
                                    axis=-1) for y in (y_r, y_i))
        x_r, x_i = jnp.where(keep, y_r, 0) + e[0], jnp.where(keep, y_i, 0) + e[1]
        return (x_r, x_i), (x_r, x_i)

    if initial is None:
        start = (jnp.zeros(planes.shape[2:], rdt),) * 2
    else:
        initial = jnp.asarray(initial).astype(x_end.dtype)
        start = (jnp.real(initial).astype(rdt), jnp.imag(initial).astype(rdt))
    xs = (planes, dplanes, passes)
    if erase is not None:
        r = erase.shape[-1]
        xs = xs + (lax.all_gather(erase.astype(rdt), axis),)  # [P, B, H, R, R]
    _, (outs_r, outs_i) = lax.scan(fold, start, xs)  # [P, B, H, M, W] each
    p = lax.axis_index(axis)
    prev = jnp.maximum(p - 1, 0)
    first = (p == 0)
    x_r = jnp.where(first, start[0], outs_r[prev])  # shard 0 enters with the initial state (0 without one)
    x_i = jnp.where(first, start[1], outs_i[prev])
    zeroed = starts[p][:, None, None, None]
    x_in = lax.complex(jnp.where(zeroed, 0, x_r), jnp.where(zeroed, 0, x_i)).astype(x_end.dtype)
    if return_final:
        return x_in, lax.complex(outs_r[-1], outs_i[-1]).astype(x_end.dtype)
    return x_in


def sequence_partition(batch: int, heads: int, length: int, sequence_axes=None):
    """(mesh, batch_axes, sequence_axes, head_axes) when the mesh in context splits the length axis (the logical
    name "length", else the mesh axis "sequence"), else None. The batch and head axes are those of
    `idattn.ops.pallas.op.mesh_partition`. A length the sequence axes do not divide (an init pass, a short
    prompt) gives None: the plain operator, which XLA computes on the gathered sequence (exact, not split); the
    trainer refuses a data.seq_len the axis does not divide (idattn.train.sharding.check_sequence_split)."""

    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or getattr(mesh, "empty", True) or mesh.size <= 1:
        return None
    if sequence_axes is None:
        logical = logical_mesh_axes(("length",))
        sequence_axes = logical[0] if logical is not None else _DEFAULT_SEQUENCE_AXES
    shape = dict(mesh.shape)
    sx = tuple(ax for ax in sequence_axes if int(shape.get(ax, 1)) > 1)
    if not sx:
        return None
    ns = 1
    for ax in sx:
        ns *= int(shape[ax])
    if length % ns:  # e.g. the 16-token init pass: computed whole (XLA gathers it), still exact
        return None
    plan = mesh_partition(batch, heads)
    _, bx, hx = plan if plan is not None else (mesh, (), ())
    return mesh, tuple(a for a in bx if a not in sx), sx, tuple(a for a in hx if a not in sx)


def _specs(bx, sx, hx):
    return (partition_spec(bx, sx, hx, ()), partition_spec(hx, ()), partition_spec(hx, (), ()),
            partition_spec(bx, sx))


def interdomain_mix_sequence(fq, zk, zv, lam, b, c=None, *, conj: bool = True, impl: str = "auto",
                             chunk_size: int = 64, segment_ids=None, out_dtype=None, plan=None, initial_state=None,
                             return_state: bool = False, core: str | None = None, beta=None):
    """`interdomain_mix` with the length split over the mesh's sequence axes (module docstring); the plain
    operator when no axis splits it. Same arguments and result: `initial_state` (Xk0, Xv0) enters the first
    document (shard 0, and through the fold every shard it reaches), and `return_state` also returns the state
    after the last token, (Xk, Xv) [B, H, M, R] / [B, H, M, D], replicated over the sequence shards (a prefill
    split over the sequence axis, then decoding from it). `beta` [B, T, H]: the delta update, split like the
    tokens; each shard's summary adds its erase product P (`delta_end_state`) to the fold."""
    bsz, t, h, r = fq.shape
    plan = sequence_partition(bsz, h, t) if plan is None else plan
    core = resolve_core(lam, b, core)
    delta = beta is not None
    if delta:
        beta = jnp.asarray(beta)
        check_beta(beta, (bsz, t, h), impl)
    kw = dict(conj=conj, impl=impl, chunk_size=chunk_size, out_dtype=out_dtype, core=core)
    if plan is None:
        return interdomain_mix(fq, zk, zv, lam, b, c, segment_ids=segment_ids, initial_state=initial_state,
                               return_state=return_state, beta=beta, **kw)
    mesh, bx, sx, hx = plan
    tok, per_head, per_head2, rows = _specs(bx, sx, hx)
    seg = jnp.zeros((bsz, t), jnp.int32) if segment_ids is None else jnp.asarray(segment_ids)
    has_c = c is not None
    lam, b, lam_spec = _core_args(lam, b, core, bsz, t, tok, per_head)
    selective = core == "selective"

    has_init = initial_state is not None
    d = zv.shape[-1]

    def local(fq, zk, zv, lam, b, c, seg, x0, beta):
        z = jnp.concatenate([zk, zv], axis=-1)
        x0 = x0 if has_init else None
        beta = beta if delta else None
        if delta:  # the summary (E, Π lam_t, P): the key half leaves a shard as (A ∘ Xk)·P + Ek
            x_end, trans, pm = delta_end_state(zk, zv, lam, b, beta, seg, chunk_size, core)
            x_in = incoming_state(x_end, seg, lam, fq.shape[1], sx, transition=trans, initial=x0,
                                  return_final=return_state, erase=pm)
        elif selective:  # a shard's transition is the product of its tokens' decays
            x_end, trans = end_state_selective(z, lam, b, seg, chunk_size)
            x_in = incoming_state(x_end, seg, None, fq.shape[1], sx, transition=trans, initial=x0,
                                  return_final=return_state)
        else:
            x_in = incoming_state(end_state(z, lam, b, seg, chunk_size), seg, lam, fq.shape[1], sx, initial=x0,
                                  return_final=return_state)
        x_in, x_fin = x_in if return_state else (x_in, None)
        init = (x_in[..., :r], x_in[..., r:])
        c = c if has_c else None
        # Inside shard_map the kernel call must not nest one. A per-token lam has no kernel: interdomain_mix warns
        # once and runs the chunked XLA form.
        if not selective and _resolved(impl, chunk_size, delta=delta) == "pallas":
            o = interdomain_mix_pallas(fq, zk, zv, lam, b, c, conj=conj, chunk_size=chunk_size, segment_ids=seg,
                                       initial_state=init, out_dtype=out_dtype, batch_axes=(), head_axes=())
        else:
            o = interdomain_mix(fq, zk, zv, lam, b, c, segment_ids=seg, initial_state=init, beta=beta, **kw)
        return (o, x_fin[..., :r], x_fin[..., r:]) if return_state else o

    c_arg = c if has_c else jnp.zeros((h, 1, 1), jnp.complex64)
    x0 = (jnp.concatenate([jnp.asarray(initial_state[0]), jnp.asarray(initial_state[1])], axis=-1) if has_init
          else jnp.zeros((bsz, h, lam.shape[-1], r + d), jnp.complex64))
    state = partition_spec(bx, hx, (), ())  # [B, H, M, W]: replicated over the sequence shards
    out_specs = (tok, state, state) if return_state else tok
    beta_arg = beta if delta else jnp.zeros((bsz, t, h), jnp.float32)  # a placeholder, unused without beta
    out = jax.shard_map(local, mesh=mesh, in_specs=(tok, tok, tok, lam_spec, lam_spec, per_head2, rows, state,
                                                    partition_spec(bx, sx, hx)),
                        out_specs=out_specs, check_vma=False)(fq, zk, zv, lam, b, c_arg, seg, x0, beta_arg)
    return (out[0], (out[1], out[2])) if return_state else out


def s4d_linear_mix_sequence(z, lam, b, c, *, impl: str = "chunked", chunk_size: int = 64, segment_ids=None,
                            out_dtype=None, plan=None, initial_state=None, return_state: bool = False,
                            core: str | None = None):
    """`s4d_linear_mix` with the length split over the mesh's sequence axes (module docstring); the plain
    operator when no axis splits it. `initial_state` [B, H, M, W] and `return_state` as in
    `interdomain_mix_sequence` (the returned state replicated over the sequence shards)."""

    bsz, t, h, w = z.shape
    plan = sequence_partition(bsz, h, t) if plan is None else plan
    core = resolve_core(lam, b, core)
    kw = dict(impl=impl, chunk_size=chunk_size, out_dtype=out_dtype, core=core)
    if plan is None:
        return s4d_linear_mix(z, lam, b, c, segment_ids=segment_ids, initial_state=initial_state,
                              return_state=return_state, **kw)
    mesh, bx, sx, hx = plan
    tok, per_head, _, rows = _specs(bx, sx, hx)
    seg = jnp.zeros((bsz, t), jnp.int32) if segment_ids is None else jnp.asarray(segment_ids)
    lam, b, lam_spec = _core_args(lam, b, core, bsz, t, tok, per_head)
    selective = core == "selective"
    has_init = initial_state is not None

    def local(z, lam, b, c, seg, x0):
        x0 = x0 if has_init else None
        if selective:  # a shard's transition is the product of its tokens' decays
            x_end, trans = end_state_selective(z, lam, b, seg, chunk_size)
            x_in = incoming_state(x_end, seg, None, z.shape[1], sx, transition=trans, initial=x0,
                                  return_final=return_state)
        else:
            x_in = incoming_state(end_state(z, lam, b, seg, chunk_size), seg, lam, z.shape[1], sx, initial=x0,
                                  return_final=return_state)
        x_in, x_fin = x_in if return_state else (x_in, None)
        y = s4d_linear_mix(z, lam, b, c, segment_ids=seg, initial_state=x_in, **kw)
        return (y, x_fin) if return_state else y

    x0 = jnp.asarray(initial_state) if has_init else jnp.zeros((bsz, h, lam.shape[-1], w), jnp.complex64)
    state = partition_spec(bx, hx, (), ())
    return jax.shard_map(local, mesh=mesh, in_specs=(tok, lam_spec, lam_spec, per_head, rows, state),
                         out_specs=(tok, state) if return_state else tok, check_vma=False)(z, lam, b, c, seg, x0)


def _core_args(lam, b, core: str, bsz: int, t: int, tok, per_head):
    """(lam, b, their in_spec) for the split: the selective core's per token ([B, T, H, M], either broadcast from
    [H, M] when it stays constant), split over the sequence like the tokens; the LTI core's [H, M], per head."""
    lam, b = jnp.asarray(lam), jnp.asarray(b)
    if core == "selective":
        return (*per_token(lam, b, bsz, t), tok)
    return lam, b, per_head


def _resolved(impl: str, chunk_size: int, selective: bool = False, delta: bool = False) -> str:
    return resolve_impl(impl, int(chunk_size), selective=selective, delta=delta)
