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

Decoding: a KV cache {"k", "v": [B, S_max, H, d_h]}; a chunk of C tokens at `cache_index` is written into the
cache and attends to cache positions ≤ its own (one document per row while decoding).
"""
from __future__ import annotations

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp

from idattn.layers.common import Dense, Dtype, rope

_log = logging.getLogger(__name__)


def _segment_mask(doc: jax.Array) -> jax.Array:
    """[B, 1, T, T] bool: causal and same document."""
    t = doc.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    same = doc[:, :, None] == doc[:, None, :]
    return (causal[None] & same)[:, None]


def _xla_attention(q, k, v, doc):
    if doc is None:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    return jax.nn.dot_product_attention(q, k, v, mask=_segment_mask(doc), implementation="xla")


def _tpu_flash_local(q, k, v, doc):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa  # noqa: WPS433 (optional, TPU only)
    t = q.shape[1]
    if t % 128:  # the kernel's blocks (forward and backward) are 128 positions; refuse here, not in the backward
        raise ValueError(f"sequence length {t} is not a multiple of 128")
    qt, kt, vt = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # [B, H, T, D]
    seg = None if doc is None else fa.SegmentIds(q=doc, kv=doc)
    o = fa.flash_attention(qt, kt, vt, segment_ids=seg, causal=True, sm_scale=q.shape[-1] ** -0.5)
    return jnp.swapaxes(o, 1, 2)


def _tpu_flash(q, k, v, doc):
    """The TPU kernel, inside shard_map over the context mesh's batch and head axes (when there is a mesh)."""
    from idattn.ops.pallas.op import partition_spec, mesh_partition

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


def _cudnn(q, k, v, doc):
    if doc is None:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    return jax.nn.dot_product_attention(q, k, v, mask=_segment_mask(doc), is_causal=True, implementation="cudnn")


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


def causal_attention(q, k, v, doc=None, impl: str = "auto"):
    """q, k, v [B, T, H, D]; doc [B, T] document index or None. Returns [B, T, H, D].

    The kernel is chosen when the program is lowered (see the module docstring): `impl` names which kernels may
    be used ("auto": cuDNN on CUDA and flash attention on TPU), XLA on every other platform."""
    if impl == "xla":
        return _xla_attention(q, k, v, doc)
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
    from idattn.ops.pallas.op import context_platform

    # The mesh in context fixes the platform the program is lowered for; without one, the program runs on the
    # default backend. Not `lax.platform_dependent`: it traces every branch, and the flash kernel's backward
    # raises on shapes it does not take (T = 32 in MQAR) while being traced, past `_or_xla`'s fallback.
    plat = context_platform() or _default_platform()
    return branches.get(plat, _xla_attention)(q, k, v, doc)


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
            o = causal_attention(q, k, v, doc, self.impl)
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
