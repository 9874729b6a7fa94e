"""Softmax baseline: canonical multi-head causal attention with RoPE (docs/model.md, Mixers).

q, k, v = W_Q x, W_K x, W_V x  ([d] -> [H, d_h], no bias);  q, k <- RoPE(q), RoPE(k);
o = softmax(q kᵀ / √d_h + causal & same-document mask) v;  y = W_O concat_h(o).

Backend (`impl`): "auto" picks, for the platform the program is *lowered for* (the devices of the mesh in context,
so that a CPU host compiling for a TPU topology gets the TPU kernel; without a mesh, the default backend): cuDNN on CUDA (`jax.nn.dot_product_attention(implementation="cudnn")`), the Pallas
TPU flash-attention kernel on TPU (segment ids passed as document indices), XLA elsewhere. "xla", "cudnn",
"pallas_tpu" force one on its platform (XLA on the others). A kernel that refuses the shapes at trace time falls
back to XLA (logged).

Partitioning: a Pallas (Mosaic) kernel cannot be partitioned by XLA, so under a device mesh in context (the
trainer's `jax.set_mesh`) the TPU kernel runs inside `jax.shard_map` over the mesh axes that carry the batch and
the heads (`idattn.ops.pallas.op.mesh_partition`; attention is independent per row and head). Heads that the
tensor axis does not divide are refused with the numbers.

Sequence axis (`config.mesh.sequence > 1`, the length split over the mesh; docs/pods.md, "Long context"):
MaxText's default "all_gather" context parallelism, explicitly: inside `shard_map` over the batch, sequence and
head axes each device keeps its S = T/P queries, `all_gather`s K, V and the document index over the sequence
axes, and masks causally on global offsets (query i of shard p is position p·S + i). On TPU the kernel is
splash attention with the global causal mask's block tables split over the sequence axes (`sequence_splash`:
blocks above the diagonal are skipped); elsewhere XLA attention on the [S, T] scores (`sequence_attention`).
Memory: K and V of the whole sequence on every device of the group during the layer; scores for the local
queries only. Exact against the unsplit call (tests/test_sequence_parallel.py).

Decoding: a KV cache {"k", "v": [B, S_max, H, d_h]}; a chunk of C tokens at `cache_index` is written into the
cache and attends to cache positions ≤ its own (one document per row while decoding).

Sliding window (`window` = W > 0, the `swa` mixer; docs/model.md "Hybrid stacks"): query i attends to key j iff
j ≤ i, i − j < W and both are in the same document (W = 1: each token sees itself only; W ≥ T: global causal
attention, and then the very same code path as `window=0`). Backends: XLA applies the banded mask
(`window_mask`, [B, 1, T, T]: compute is still T², memory the mask's); cuDNN gets `local_window_size=(W−1, 0)`
plus the document mask (XLA fallback as for global attention); TPU: splash attention with `LocalMask((W−1, 0))`
and the document index as segment ids (`tpu_splash_window`: blocks outside the band skipped), the XLA band when
it refuses the shapes (T not a multiple of 128; `attn_impl=pallas_tpu` refuses instead, in one line); under a
sequence-split mesh, when W − 1 ≤ S (the shard length), each device receives only the previous shard's last
W − 1 keys / values / document ids (`sequence_window_attention`, one ppermute), else the XLA all_gather path with
the band on global offsets (`pallas_tpu` refused there). Decoding: a ring buffer
{"k", "v": [B, min(W, max_len), H, d_h]}, position p in slot p mod size: the cache is O(W) whatever the context.
"""
from __future__ import annotations

import functools
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from idattn.layers.common import Dense, Dtype, rope
from idattn.ops.pallas.op import context_platform, mesh_partition, partition_spec
from idattn.ops.sequence import sequence_partition

_log = logging.getLogger(__name__)


def _segment_mask(doc: jax.Array) -> jax.Array:
    """[B, 1, T, T] bool: causal and same document."""
    t = doc.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    same = doc[:, :, None] == doc[:, None, :]
    return (causal[None] & same)[:, None]


def window_mask(doc, t: int, window: int) -> jax.Array:
    """[B | 1, 1, T, T] bool: M[i, j] = (j ≤ i) ∧ (i − j < window) ∧ (doc_i = doc_j) (no document test when doc
    is None). window ≤ 0 means no band (global causal)."""
    i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
    band = (j <= i) & ((i - j < window) if window > 0 else True)
    if doc is None:
        return band[None, None]
    return (band[None] & (doc[:, :, None] == doc[:, None, :]))[:, None]


def _window_xla(q, k, v, doc, window):
    return jax.nn.dot_product_attention(q, k, v, mask=window_mask(doc, q.shape[1], window), implementation="xla")


def _window_cudnn(q, k, v, doc, window):
    def attend(q, k, v, doc):
        mask = None if doc is None else _segment_mask(doc)
        return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, local_window_size=(window - 1, 0),
                                            implementation="cudnn")
    return attend(q, k, v, None) if doc is None else _even_length(attend)(q, k, v, doc)  # a mask needs an even T


def _xla_attention(q, k, v, doc):
    if doc is None:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    return jax.nn.dot_product_attention(q, k, v, mask=_segment_mask(doc), implementation="xla")


def _tpu_flash_local(q, k, v, doc):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa  # noqa: PLC0415 TPU kernel, on its path only
    t = q.shape[1]
    if t % 128:  # the kernel's blocks (forward and backward) are 128 positions; refuse here, not in the backward
        raise ValueError(f"sequence length {t} is not a multiple of 128")
    qt, kt, vt = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # [B, H, T, D]
    seg = None if doc is None else fa.SegmentIds(q=doc, kv=doc)
    o = fa.flash_attention(qt, kt, vt, segment_ids=seg, causal=True, sm_scale=q.shape[-1] ** -0.5)
    return jnp.swapaxes(o, 1, 2)


def _tpu_flash(q, k, v, doc):
    """The TPU kernel, inside shard_map over the context mesh's batch and head axes (when there is a mesh)."""

    plan = mesh_partition(q.shape[0], q.shape[2])
    if plan is None:
        return _tpu_flash_local(q, k, v, doc)
    mesh, bx, hx = plan
    qs = partition_spec(bx, (), hx, ())
    if doc is None:
        return jax.shard_map(lambda q, k, v: _tpu_flash_local(q, k, v, None), mesh=mesh, in_specs=(qs, qs, qs),
                             out_specs=qs, check_vma=False)(q, k, v)
    return jax.shard_map(_tpu_flash_local, mesh=mesh, in_specs=(qs, qs, qs, partition_spec(bx, ())), out_specs=qs,
                         check_vma=False)(q, k, v, doc)


def _even_length(fn):
    """fn on [B, T, H, D] inputs with T padded to an even length (one position on the right when T is odd), the
    pad's row dropped: exact under the causal mask, which hides the key at position T from every real query.
    cuDNN's masked (bias) attention takes even lengths only in training (jax: "Unsupported sequence length Q 2047,
    KV 2047" on an H200, from `python -m idattn.bench.smoke`'s T − 1 inputs; the trainer's rows are T long)."""
    def run(q, k, v, doc):
        t = q.shape[1]
        if t % 2 == 0:
            return fn(q, k, v, doc)
        pad = lambda x: jnp.pad(x, ((0, 0), (0, 1), (0, 0), (0, 0)))  # noqa: E731
        d = None if doc is None else jnp.pad(doc, ((0, 0), (0, 1)), mode="edge")
        return fn(pad(q), pad(k), pad(v), d)[:, :t]
    return run


def _cudnn(q, k, v, doc):
    if doc is None:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    return _even_length(lambda q, k, v, doc: jax.nn.dot_product_attention(
        q, k, v, mask=_segment_mask(doc), is_causal=True, implementation="cudnn"))(q, k, v, doc)


def _or_xla(fn, name, platform):
    """fn, or XLA attention when fn refuses the shapes / is unavailable while tracing (logged once per trace; a
    warning when this host runs that platform, else debug: a CPU host has no cuDNN to offer)."""
    def run(q, k, v, doc):
        try:
            return fn(q, k, v, doc)
        except Exception as e:  # cuDNN / the flash kernel support a subset of shapes, dtypes and installs
            here = {"gpu": ("cuda", "rocm")}.get(jax.default_backend(), (jax.default_backend(),))
            (_log.warning if platform in here else _log.debug)("%s attention refused (%s); using XLA", name, e)
            return _xla_attention(q, k, v, doc)
    return run


_PLATFORM_IMPL = {"cudnn": ("cuda", _cudnn, "cuDNN"), "pallas_tpu": ("tpu", _tpu_flash, "Pallas TPU flash")}


def causal_attention(q, k, v, doc=None, impl: str = "auto", window: int = 0):
    """q, k, v [B, T, H, D]; doc [B, T] document index or None. Returns [B, T, H, D].

    The kernel is chosen when the program is lowered (see the module docstring): `impl` names which kernels may
    be used ("auto": cuDNN on CUDA and flash attention on TPU), XLA on every other platform. `window` W > 0:
    sliding-window attention (query i sees keys i − W < j ≤ i of its document); W ≥ T is global attention."""

    plan = sequence_partition(q.shape[0], q.shape[2], q.shape[1])
    if 0 < window < q.shape[1]:
        return _windowed_attention(q, k, v, doc, impl, window, plan)
    if impl == "xla":
        return _xla_attention(q, k, v, doc) if plan is None else sequence_attention(q, k, v, doc, plan)
    if impl == "auto":
        chosen = ("cudnn", "pallas_tpu")
    elif impl in _PLATFORM_IMPL:
        chosen = (impl,)
    else:
        raise ValueError(f"attention impl: got {impl!r}; expected one of auto, xla, cudnn, pallas_tpu")
    branches = {}
    for name in chosen:
        plat, fn, label = _PLATFORM_IMPL[name]
        branches[plat] = _or_xla(fn, label, plat)

    # The mesh in context fixes the platform the program is lowered for; without one, the program runs on the
    # default backend. Not `lax.platform_dependent`: it traces every branch, and the flash kernel's backward
    # raises on shapes it does not take (T = 32 in MQAR) while being traced, past `_or_xla`'s fallback.
    plat = context_platform() or _default_platform()
    if plan is not None:  # the length is split over the mesh: gather K and V, mask on global offsets
        if plat == "tpu" and "pallas_tpu" in chosen:
            try:
                return sequence_splash(q, k, v, doc, plan)
            except Exception as e:  # shapes the kernel does not take (a shard not a multiple of 128 positions)
                _log.warning("splash attention refused (%s); using XLA attention on the [S, T] scores", e)
        return sequence_attention(q, k, v, doc, plan)
    return branches.get(plat, _xla_attention)(q, k, v, doc)


def _windowed_attention(q, k, v, doc, impl, window, plan):
    """causal_attention with a band of `window` < T keys (module docstring: which backend does what)."""
    if impl not in ("auto", "xla", "cudnn", "pallas_tpu"):
        raise ValueError(f"attention impl: got {impl!r}; expected one of auto, xla, cudnn, pallas_tpu")
    if impl == "pallas_tpu" and (context_platform() or _default_platform()) != "tpu":
        raise ValueError(f"model.attn_impl: 'pallas_tpu' sliding-window attention (swa, window={window}) needs a TPU "
                         "target; use attn_impl=auto or xla (the XLA banded mask)")
    if impl == "pallas_tpu" and plan is not None:
        raise ValueError(f"model.attn_impl: 'pallas_tpu' sliding-window attention (swa, window={window}) under a "
                         "sequence-split mesh is not implemented; use attn_impl=auto (XLA all_gather with the band)")
    if plan is not None:
        mesh, _, sx, _ = plan
        shards = int(np.prod([dict(mesh.shape)[a] for a in sx]))
        if window - 1 <= q.shape[1] // shards:  # the band reaches into the previous shard only: pass W − 1 tokens
            return sequence_window_attention(q, k, v, doc, plan, window)
        return sequence_attention(q, k, v, doc, plan, local=functools.partial(_sequence_local_xla, window=window))
    plat = context_platform() or _default_platform()
    if plat == "cuda" and impl in ("auto", "cudnn"):
        return _or_xla_window(q, k, v, doc, window)
    if plat == "tpu" and impl in ("auto", "pallas_tpu"):
        try:
            return tpu_splash_window(q, k, v, doc, window)
        except Exception as e:  # noqa: BLE001  shapes the kernel does not take (T not a multiple of 128)
            if impl == "pallas_tpu":
                raise ValueError(f"model.attn_impl: 'pallas_tpu' sliding-window (splash LocalMask) refused these "
                                 f"shapes ({str(e).splitlines()[0]}); use attn_impl=auto (XLA fallback)") from None
            _log.warning("splash sliding-window attention refused (%s); using the XLA banded mask", e)
    return _window_xla(q, k, v, doc, window)


def tpu_splash_window(q, k, v, doc, window: int, interpret: bool = False, block: int = 512):
    """TPU: sliding-window attention with the splash kernel's `LocalMask` (window (W − 1, 0): key j is seen by
    query i iff i − W < j ≤ i) and the document index as splash segment ids; blocks outside the band are skipped,
    so the work is O(T·W), not O(T²). Under a device mesh it runs inside `shard_map` over the batch and head axes
    (as the flash kernel). q, k, v [B, T, H, D] (T a multiple of 128), doc [B, T] or None -> [B, T, H, D]."""

    b, t, h, d = q.shape
    if t % 128:
        raise ValueError(f"sequence length {t} is not a multiple of 128")
    plan = mesh_partition(b, h)
    doc = jnp.zeros((b, t), jnp.int32) if doc is None else doc.astype(jnp.int32)
    if plan is None:
        return _splash_window_local(q, k, v, doc, window, h, interpret, block)
    mesh, bx, hx = plan
    nh = int(np.prod([dict(mesh.shape)[a] for a in hx])) if hx else 1
    qs = partition_spec(bx, (), hx, ())
    return jax.shard_map(lambda q, k, v, doc: _splash_window_local(q, k, v, doc, window, h // nh, interpret, block),
                         mesh=mesh, in_specs=(qs, qs, qs, partition_spec(bx, ())), out_specs=qs,
                         check_vma=False)(q, k, v, doc)


def _splash_window_local(q, k, v, doc, window, heads, interpret, block):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # noqa: PLC0415 TPU kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm  # noqa: PLC0415 TPU kernel

    t = q.shape[1]
    bs = min(block, t)
    sizes = sk.BlockSizes(block_q=bs, block_kv=bs, block_kv_compute=bs, block_q_dkv=bs, block_kv_dkv=bs,
                          block_kv_dkv_compute=bs, block_q_dq=bs, block_kv_dq=bs)
    one = sm.LocalMask((t, t), window_size=(window - 1, 0), offset=0)
    kernel = sk.make_splash_mha(sm.MultiHeadMask([one] * heads), head_shards=1, q_seq_shards=1, block_sizes=sizes,
                                interpret=bool(interpret))
    qt, kt, vt = (jnp.swapaxes(a, 1, 2) for a in (q * q.shape[-1] ** -0.5, k, v))  # [B, H, T, D]

    def one_row(qr, kr, vr, dr):
        return kernel(qr, kr, vr, segment_ids=sk.SegmentIds(q=dr, kv=dr))
    return jnp.swapaxes(jax.vmap(one_row)(qt, kt, vt, doc), 1, 2).astype(q.dtype)


def _or_xla_window(q, k, v, doc, window):
    try:
        return _window_cudnn(q, k, v, doc, window)
    except Exception as e:  # noqa: BLE001  cuDNN takes a subset of shapes / masks
        _log.warning("cuDNN sliding-window attention refused (%s); using the XLA banded mask", e)
        return _window_xla(q, k, v, doc, window)


def sequence_attention(q, k, v, doc, plan, local=None):
    """Causal attention with the length split over the mesh's sequence axes (MaxText's default "all_gather"
    context parallelism): inside `shard_map` over (batch, sequence, head) axes, every device keeps its S queries,
    `all_gather`s K, V and the document index over the sequence axes (the whole T = P·S positions of its rows
    and heads), and masks causally on global offsets (query i of shard p is position p·S + i) and by document.
    Exact; K and V of the whole sequence are held on every device of the group during the layer (the memory
    that grows with T), the scores only for the local queries. `plan` is `idattn.ops.sequence.
    sequence_partition`'s; `local(q, k_all, v_all, doc_q, doc_all, offset)` computes one shard (default XLA)."""

    mesh, bx, sx, hx = plan
    local = _sequence_local_xla if local is None else local
    qs, rows = partition_spec(bx, sx, hx, ()), partition_spec(bx, sx)
    doc = jnp.zeros(q.shape[:2], jnp.int32) if doc is None else doc

    def shard(q, k, v, doc):
        gather = lambda a: jax.lax.all_gather(a, sx, axis=1, tiled=True)  # noqa: E731
        offset = jax.lax.axis_index(sx) * q.shape[1]
        return local(q, gather(k), gather(v), doc, gather(doc), offset)

    return jax.shard_map(shard, mesh=mesh, in_specs=(qs, qs, qs, rows), out_specs=qs, check_vma=False)(q, k, v, doc)


def sequence_window_attention(q, k, v, doc, plan, window: int):
    """Sliding-window attention with the length split over the sequence axes, W − 1 ≤ S (the shard length): each
    device receives only the last W − 1 keys, values and document ids of the previous shard (one `ppermute` over
    the sequence axes, shard p − 1 -> p; shard 0 receives zeros, masked by position), instead of the whole
    sequence. Local keys are [halo (positions pS − W + 1 .. pS − 1) | own (pS .. pS + S − 1)]; query pS + i sees
    key position j iff j ≥ 0, j ≤ pS + i, pS + i − j < W and the documents agree. Exact against the unsplit call
    (tests/test_hybrid.py)."""

    mesh, bx, sx, hx = plan
    n = int(np.prod([dict(mesh.shape)[a] for a in sx]))
    qs, rows = partition_spec(bx, sx, hx, ()), partition_spec(bx, sx)
    doc = jnp.zeros(q.shape[:2], jnp.int32) if doc is None else doc.astype(jnp.int32)
    halo = window - 1
    perm = [(i, i + 1) for i in range(n - 1)]

    def shard(q, k, v, doc):
        s_len = q.shape[1]
        p = jax.lax.axis_index(sx)
        prev = lambda a: jax.lax.ppermute(a[:, s_len - halo:], sx, perm)  # noqa: E731
        if halo:
            k, v, dk = (jnp.concatenate([prev(a), a], axis=1) for a in (k, v, doc))
        else:
            dk = doc
        qpos = p * s_len + jnp.arange(s_len)
        kpos = p * s_len - halo + jnp.arange(s_len + halo)
        band = ((kpos[None, :] >= 0) & (kpos[None, :] <= qpos[:, None]) & (qpos[:, None] - kpos[None, :] < window))
        mask = band[None] & (doc[:, :, None] == dk[:, None, :])
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="xla")

    return jax.shard_map(shard, mesh=mesh, in_specs=(qs, qs, qs, rows), out_specs=qs, check_vma=False)(q, k, v, doc)


def sequence_splash(q, k, v, doc, plan, interpret: bool = False, block: int = 512):
    """TPU: `sequence_attention` with the splash-attention kernel (MaxText's all_gather context parallelism): one
    kernel for the global causal mask [T, T] with its block tables split over the sequence axes
    (`q_seq_shards`, `manual_sharding_spec`), so each device gets the rows of its own queries and skips the
    blocks above the diagonal; K, V and document ids all_gathered over the sequence axes inside `shard_map`."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # noqa: PLC0415 TPU kernel

    mesh, bx, sx, hx = plan
    b, t, h, d = q.shape
    ns = int(np.prod([dict(mesh.shape)[a] for a in sx]))
    nh = int(np.prod([dict(mesh.shape)[a] for a in hx])) if hx else 1
    s_len = t // ns
    if s_len % min(block, s_len) or s_len % 128:
        raise ValueError(f"sequence length {t} over {ns} shards: {s_len} tokens per shard is not a multiple of 128")
    bq = bkv = min(block, s_len)
    # The block tables live in SMEM (1 MiB on TPU; ~4 B per (q block, kv block) entry): grow the blocks until a
    # shard's table has at most 2^17 entries (at 1M tokens over 4 shards: 2048 x 1024 blocks).
    while (s_len // bq) * (t // bkv) > 1 << 17 and (2 * bq <= s_len or 2 * bkv <= t):
        if bq <= bkv and 2 * bq <= s_len:
            bq *= 2
        else:
            bkv *= 2
    kernel = _splash_kernel(t, h // nh, ns, bq, bkv, min(bkv, block), bool(interpret))
    kspec = kernel.manual_sharding_spec(NamedSharding(mesh, P(None, sx if len(sx) > 1 else sx[0])))
    qs, rows = partition_spec(bx, sx, hx, ()), partition_spec(bx, sx)
    doc = jnp.zeros((b, t), jnp.int32) if doc is None else doc.astype(jnp.int32)
    scale = d ** -0.5

    def shard(kernel, q, k, v, doc):
        gather = lambda a: jax.lax.all_gather(a, sx, axis=1, tiled=True)  # noqa: E731
        k_all, v_all, doc_all = gather(k), gather(v), gather(doc)
        qt, kt, vt = (jnp.swapaxes(a, 1, 2) for a in (q * scale, k_all, v_all))  # [B, H, S|T, D]

        def one(qr, kr, vr, dq, dk):
            return kernel(qr, kr, vr, segment_ids=sk.SegmentIds(q=dq, kv=dk))
        return jnp.swapaxes(jax.vmap(one)(qt, kt, vt, doc, doc_all), 1, 2).astype(q.dtype)

    return jax.shard_map(shard, mesh=mesh, in_specs=(kspec, qs, qs, qs, rows), out_specs=qs,
                         check_vma=False)(kernel, q, k, v, doc)


def _splash_kernel(t: int, heads: int, shards: int, bq: int, bkv: int, bc: int, interpret: bool):
    """The splash kernel for a global causal [t, t] mask, its block tables split into `shards` row ranges. Built
    per trace (its tables become constants of that trace; a kernel kept across traces leaks their tracers), from
    `causal_block_mask`, whose tables cost O((T/block)²) constant-time block tests on the host instead of
    splash's ~T² mask evaluations (this repository's CPU host: 3.4 s instead of 78 s at T = 64K; about 4 min at
    1M with 32 heads, against hours)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # noqa: PLC0415 TPU kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm  # noqa: PLC0415 TPU kernel

    sizes = sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bc, block_q_dkv=bq, block_kv_dkv=bkv,
                          block_kv_dkv_compute=bc, block_q_dq=bq, block_kv_dq=bkv)
    one = causal_block_mask(t)  # one object for every head: splash keeps one table for identical heads
    mask = sm.MultiHeadMask([one] * heads)
    return sk.make_splash_mha(mask, head_shards=1, q_seq_shards=shards, block_sizes=sizes, interpret=interpret)


class _Uniform:
    """A mask block that is all True or all False, answered without materialising it."""

    def __init__(self, value: bool):
        self.value = bool(value)

    def any(self):
        return self.value

    def all(self):
        return self.value


def causal_block_mask(t: int):
    """splash's `CausalMask((t, t))`, but a block entirely below the diagonal (every key before every query) or
    entirely above it is answered in O(1) instead of evaluating its block² entries; only the diagonal blocks are
    computed. Splash's table builder (`process_mask`) asks each block `.any()` / `.all()` and keeps only the
    partial ones, so the tables are identical (tests/test_sequence_parallel.py) and building them costs O(T/block)
    diagonal blocks plus O((T/block)²) constant-time answers instead of ~T² mask evaluations."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm  # noqa: PLC0415 TPU kernel

    class FastCausalMask(sm.CausalMask):
        def __getitem__(self, idx):
            if isinstance(idx, tuple) and len(idx) == 2 and all(isinstance(i, slice) and i.step in (None, 1)
                                                                for i in idx):
                (q0, q1, _), (k0, k1, _) = (i.indices(n) for i, n in zip(idx, self.shape))
                if q1 > q0 and k1 > k0:
                    if k1 - 1 <= q0 + self.offset:
                        return _Uniform(True)
                    if k0 > q1 - 1 + self.offset:
                        return _Uniform(False)
            return super().__getitem__(idx)

    return FastCausalMask((int(t), int(t)))


def _sequence_local_xla(q, k, v, doc_q, doc_kv, offset, window: int = 0):
    """[B, S] queries at global positions offset + i against [B, T] keys: causal on global positions, same
    document (and, with window W > 0, within the last W positions)."""
    qpos = offset + jnp.arange(q.shape[1])
    kpos = jnp.arange(k.shape[1])[None, :]
    causal = kpos <= qpos[:, None]  # [S, T]
    if window > 0:
        causal = causal & (qpos[:, None] - kpos < window)
    mask = causal[None] & (doc_q[:, :, None] == doc_kv[:, None, :])
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="xla")


def _default_platform() -> str:
    plat = jax.default_backend()
    return "cuda" if plat == "gpu" else plat


class SoftmaxAttention(nn.Module):
    d_model: int
    num_heads: int
    head_dim: int
    rope_base: float = 10000.0
    init_std: float = 0.02
    out_std: float = 0.02
    impl: str = "auto"
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    window: int = 0  # > 0: sliding-window attention over the last `window` tokens (the swa mixer)

    @nn.compact
    def __call__(self, x, doc, positions, cache=None, cache_index=None):
        h, dh, d = self.num_heads, self.head_dim, self.d_model
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        q = Dense((d,), (h, dh), ("embed", "heads", "kv"), self.init_std, name="wq", **kw)(x)
        k = Dense((d,), (h, dh), ("embed", "heads", "kv"), self.init_std, name="wk", **kw)(x)
        v = Dense((d,), (h, dh), ("embed", "heads", "kv"), self.init_std, name="wv", **kw)(x)
        q, k = rope(q, positions, self.rope_base), rope(k, positions, self.rope_base)
        new_cache = None
        if cache is None:
            o = causal_attention(q, k, v, doc, self.impl, self.window)
        elif self.window > 0:
            o, new_cache = self._ring_step(q, k, v, cache, cache_index)
        else:
            t = x.shape[1]
            ck = jax.lax.dynamic_update_slice_in_dim(cache["k"], k.astype(cache["k"].dtype), cache_index, 1)
            cv = jax.lax.dynamic_update_slice_in_dim(cache["v"], v.astype(cache["v"].dtype), cache_index, 1)
            s = ck.shape[1]
            qpos = cache_index + jnp.arange(t)
            mask = (jnp.arange(s)[None, :] <= qpos[:, None])[None, None]  # [1, 1, T, S]
            o = jax.nn.dot_product_attention(q, ck.astype(q.dtype), cv.astype(q.dtype), mask=mask,
                                             implementation="xla")
            new_cache = {"k": ck, "v": cv}
        y = Dense((h, dh), (d,), ("heads", "kv", "embed"), self.out_std, name="wo", **kw)(o)
        return y, new_cache

    def _ring_step(self, q, k, v, cache, cache_index):
        """Decoding with a ring buffer of S = min(W, max_len) slots (position p in slot p mod S). A chunk of C
        tokens at positions idx..idx+C−1 attends to [the ring as it was | its own keys]: slot s holds the position
        p_s = idx − 1 − ((idx − 1 − s) mod S) (valid iff p_s ≥ 0), and query position i sees key position j iff
        j ≤ i and i − j < W. Then the chunk's last min(C, S) keys are written to their slots.
        q, k, v [B, C, H, d_h]; cache {"k", "v": [B, S, H, d_h]}. Returns (o [B, C, H, d_h], new cache)."""
        ck, cv = cache["k"], cache["v"]
        size, c, w = ck.shape[1], q.shape[1], self.window
        slot_pos = cache_index - 1 - jnp.mod(cache_index - 1 - jnp.arange(size), size)  # [S]
        qpos = cache_index + jnp.arange(c)
        m_ring = (slot_pos[None, :] >= 0) & (qpos[:, None] - slot_pos[None, :] < w)  # [C, S]
        i = jnp.arange(c)
        m_new = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < w)  # [C, C]
        mask = jnp.concatenate([m_ring, m_new], axis=1)[None, None]
        keys = jnp.concatenate([ck.astype(q.dtype), k], axis=1)
        vals = jnp.concatenate([cv.astype(q.dtype), v], axis=1)
        o = jax.nn.dot_product_attention(q, keys, vals, mask=mask, implementation="xla")
        n = min(c, size)
        slots = jnp.mod(cache_index + c - n + jnp.arange(n), size)
        new_cache = {"k": ck.at[:, slots].set(k[:, c - n:].astype(ck.dtype)),
                     "v": cv.at[:, slots].set(v[:, c - n:].astype(cv.dtype))}
        return o, new_cache
