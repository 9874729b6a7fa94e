"""Softmax baseline: canonical multi-head causal attention with RoPE (SPEC section 3).

q, k, v = W_Q x, W_K x, W_V x  ([d] -> [H, d_h], no bias);  q, k <- RoPE(q), RoPE(k);
o = softmax(q kᵀ / √d_h + causal & same-document mask) v;  y = W_O concat_h(o).

Backend (`impl`): "auto" picks cuDNN on GPU (`jax.nn.dot_product_attention(implementation="cudnn")`), the Pallas
TPU flash-attention kernel on TPU when importable (segment ids passed as document indices), XLA otherwise.
"xla", "cudnn", "pallas_tpu" force one. A backend that refuses the shapes falls back to XLA.

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


def _tpu_flash(q, k, v, doc):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa  # noqa: WPS433 (optional, TPU only)
    qt, kt, vt = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # [B, H, T, D]
    seg = None if doc is None else fa.SegmentIds(q=doc, kv=doc)
    o = fa.flash_attention(qt, kt, vt, segment_ids=seg, causal=True, sm_scale=q.shape[-1] ** -0.5)
    return jnp.swapaxes(o, 1, 2)


def causal_attention(q, k, v, doc=None, impl: str = "auto"):
    """q, k, v [B, T, H, D]; doc [B, T] document index or None. Returns [B, T, H, D]."""
    backend = jax.default_backend()
    if impl == "auto":
        impl = {"gpu": "cudnn", "tpu": "pallas_tpu"}.get(backend, "xla")
    if impl == "cudnn":
        try:
            if doc is None:
                return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
            return jax.nn.dot_product_attention(q, k, v, mask=_segment_mask(doc), is_causal=True,
                                                implementation="cudnn")
        except Exception as e:  # cuDNN supports a subset of shapes / dtypes
            _log.warning("cuDNN attention refused (%s); using XLA", e)
    elif impl == "pallas_tpu":
        try:
            return _tpu_flash(q, k, v, doc)
        except Exception as e:  # not importable, or block sizes do not divide T
            _log.warning("Pallas TPU flash attention unavailable (%s); using XLA", e)
    elif impl != "xla":
        raise ValueError(f"attention impl: got {impl!r}; expected one of auto, xla, cudnn, pallas_tpu")
    return _xla_attention(q, k, v, doc)


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
