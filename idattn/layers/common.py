"""Shared building blocks: the parameter helper, Dense, RMSNorm, SwiGLU, RoPE, causal short convolution.

Every parameter of the model is created through `param()` so that it carries logical axis names
(`nn.with_logical_partitioning`; names from `idattn.configs.DEFAULT_LOGICAL_AXIS_RULES`). The trainer maps them
to mesh axes with `nn.logical_to_mesh_sharding`. Parameters are stored in `param_dtype` (float32) and cast to the
compute `dtype` where they are used.

Segment ids ([B, T] int): a new document starts wherever `seg[:, t] != seg[:, t-1]`; the document index is
`d_t = cumsum(seg[t] != seg[t-1])`, never equality of raw ids (ids may repeat: [1, 2, 1] is three documents).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from idattn.ops.interdomain import document_index

Dtype = Any
Initializer = Callable[..., jax.Array]


def param(module: nn.Module, name: str, init_fn: Initializer, shape: Sequence[int],
          axes: Sequence[str | None], dtype: Dtype = jnp.float32) -> jax.Array:
    """The one place parameters are created: logical axis names attached (`nn.Partitioned` box)."""
    if len(axes) != len(shape):
        raise ValueError(f"param {name!r}: {len(axes)} logical axes {tuple(axes)} for shape {tuple(shape)}; "
                         "give one axis name (or None) per dimension")
    return module.param(name, nn.with_logical_partitioning(init_fn, tuple(axes)), tuple(shape), dtype)


def positions_from_segments(segment_ids: jax.Array | None, batch: int, length: int) -> jax.Array:
    """Position inside each document: restarts at 0 at every document start ([B, T] int32)."""
    t = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    if segment_ids is None:
        return t
    d = document_index(segment_ids, batch, length)
    start = jnp.concatenate([jnp.ones((batch, 1), bool), d[:, 1:] != d[:, :-1]], axis=1)
    # Index of the latest document start at or before t.
    first = jax.lax.cummax(jnp.where(start, t, 0), axis=1)
    return t - first


def check_segment_ids(segment_ids, tokens_shape) -> None:
    if segment_ids is None:
        return
    if tuple(segment_ids.shape) != tuple(tokens_shape):
        raise ValueError(f"segment_ids: shape {tuple(segment_ids.shape)} but tokens have shape "
                         f"{tuple(tokens_shape)}; pass one integer id per token ([B, T]) or None")
    if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
        raise ValueError(f"segment_ids: dtype {segment_ids.dtype}; expected an integer dtype (int32)")


class Dense(nn.Module):
    """y = x · W over the last `len(in_shape)` axes: W [*in_shape, *out_shape], no bias.

    Shapes: x [..., *in_shape] -> y [..., *out_shape]. Matmul in `dtype`, accumulation in float32.
    flat=True: the same W, with x [..., prod(in_shape)] -> y [..., prod(out_shape)] (heads flattened into the last
    axis: W is viewed as a matrix, so the activations never take a [..., H, d_h] shape; see `per_head`).
    """
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    std: float = 0.02
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    out_fp32: bool = False
    flat: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        w = param(self, "kernel", nn.initializers.normal(self.std), (*self.in_shape, *self.out_shape),
                  self.axes, self.param_dtype)
        if self.flat:
            w2 = w.reshape(int(np.prod(self.in_shape)), int(np.prod(self.out_shape)))
            y = jnp.einsum("...a,an->...n", x.astype(self.dtype), w2.astype(self.dtype),
                           preferred_element_type=jnp.float32)
            return y if self.out_fp32 else y.astype(self.dtype)
        n_in = len(self.in_shape)
        lhs = "".join(chr(ord("a") + i) for i in range(n_in))
        rhs_out = "".join(chr(ord("n") + i) for i in range(len(self.out_shape)))
        eq = f"...{lhs},{lhs}{rhs_out}->...{rhs_out}"
        y = jnp.einsum(eq, x.astype(self.dtype), w.astype(self.dtype), preferred_element_type=jnp.float32)
        return y if self.out_fp32 else y.astype(self.dtype)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) · scale, statistics in float32. scale [d] init 1."""
    eps: float = 1e-5
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    axis_name: str | None = "embed"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = param(self, "scale", nn.initializers.ones, (x.shape[-1],), (self.axis_name,), self.param_dtype)
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * scale.astype(jnp.float32)).astype(self.dtype)


def _head_indicator(num_heads: int, width: int) -> jax.Array:
    """E [H, H·w]: E[h, j] = 1 where lane j belongs to head h."""
    return jnp.asarray(np.kron(np.eye(num_heads, dtype=np.float32), np.ones((1, width), np.float32)))


def head_sum(x: jax.Array, num_heads: int) -> jax.Array:
    """Σ over each head's slice of the flat last axis: x [..., H·w] (float32) -> [..., H].

    A matmul with the head indicator rather than a sum over a [..., H, w] view: with w < 128 that view's tiles
    are part padding on TPU, and XLA lays it (and its neighbours) out T-minor, relaid out around every kernel.
    HIGHEST precision: a float32 sum (TPU's default would round x to bf16)."""
    w = x.shape[-1] // num_heads
    return jnp.dot(x, _head_indicator(num_heads, w).T, precision=jax.lax.Precision.HIGHEST)


def per_head(x: jax.Array, r: jax.Array) -> jax.Array:
    """x [..., H·w] times r [..., H] (float32), each head's slice by its own factor: [..., H·w]. r is spread
    over the lanes by the indicator matmul (exact: one nonzero term per output)."""
    h = r.shape[-1]
    return x * jnp.dot(r, _head_indicator(h, x.shape[-1] // h), precision=jax.lax.Precision.HIGHEST)


class HeadNorm(nn.Module):
    """N+β (paper Eq. 12): per-head RMSNorm with learned scale and learned bias, each [H, w].

    y[..., h, :] = x[..., h, :] / sqrt(mean_w(x²) + eps) · scale[h] + bias[h]. Statistics in float32.
    x is [..., H, w], or flat [..., H·w] (flat=True; the layout the TPU kernels read, `per_head`).
    """
    num_heads: int
    width: int
    eps: float = 1e-5
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    flat: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = param(self, "scale", nn.initializers.ones, (self.num_heads, self.width), ("heads", "kv"),
                      self.param_dtype)
        bias = param(self, "bias", nn.initializers.zeros, (self.num_heads, self.width), ("heads", "kv"),
                     self.param_dtype)
        xf = x.astype(jnp.float32)
        if self.flat:
            y = per_head(xf, jax.lax.rsqrt(head_sum(xf * xf, self.num_heads) / self.width + self.eps))
            return (y * scale.reshape(-1) + bias.reshape(-1)).astype(self.dtype)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * scale + bias).astype(self.dtype)


class SwiGLU(nn.Module):
    """y = W_down (SiLU(x W_gate) ⊙ (x W_up)); W_gate, W_up [d, f], W_down [f, d] (residual init std)."""
    d_model: int
    ffn_dim: int
    init_std: float = 0.02
    out_std: float = 0.02
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        g = Dense((self.d_model,), (self.ffn_dim,), ("embed", "mlp"), self.init_std, name="w_gate", **kw)(x)
        u = Dense((self.d_model,), (self.ffn_dim,), ("embed", "mlp"), self.init_std, name="w_up", **kw)(x)
        h = (jax.nn.silu(g.astype(jnp.float32)) * u.astype(jnp.float32)).astype(self.dtype)
        return Dense((self.ffn_dim,), (self.d_model,), ("mlp", "embed"), self.out_std, name="w_down", **kw)(h)


def rope(x: jax.Array, positions: jax.Array, base: float = 10000.0, num_heads: int | None = None) -> jax.Array:
    """Rotary position embedding, rotate-half convention (the Hugging Face Llama layout).

    x [B, T, H, D] (D even), positions [B, T] int. With i < D/2, θ_i = base^(−2i/D):
      y[..., i]       = x[..., i] cos(p θ_i) − x[..., i + D/2] sin(p θ_i)
      y[..., i + D/2] = x[..., i + D/2] cos(p θ_i) + x[..., i] sin(p θ_i)
    Computed in float32, returned in x's dtype. With `num_heads`, x is flat [B, T, H·D] and so is y (the same
    values; the rotation partner is found by rolling the flat axis by ∓D/2, never a [.., H, D] view).
    """
    if num_heads is not None:
        return _rope_flat(x, positions, base, num_heads)
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"rope: head dimension {d} is odd; RoPE needs an even head_dim")
    inv_freq = base ** (-np.arange(0, d // 2, dtype=np.float32) * 2.0 / d)
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, D/2]
    cos, sin = jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _rope_flat(x: jax.Array, positions: jax.Array, base: float, num_heads: int) -> jax.Array:
    hd = x.shape[-1]
    d = hd // num_heads
    if d % 2 or d * num_heads != hd:
        raise ValueError(f"rope: head dimension {hd}/{num_heads} is not an even integer; RoPE needs an even head_dim")
    inv_freq = base ** (-np.arange(0, d // 2, dtype=np.float32) * 2.0 / d)
    lane = np.arange(hd) % d
    first = jnp.asarray(lane < d // 2)  # [H·D]: the lane is in its head's first half
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(np.tile(np.concatenate([inv_freq, inv_freq]),
                                                                          num_heads))  # [B, T, H·D]
    xf = x.astype(jnp.float32)
    partner = jnp.where(first, -jnp.roll(xf, -(d // 2), axis=-1), jnp.roll(xf, d // 2, axis=-1))
    return (xf * jnp.cos(ang) + partner * jnp.sin(ang)).astype(x.dtype)


def _torch_conv_init(kernel_size: int):
    # PyTorch's Conv1d default for a depthwise kernel: U(−1/√K, 1/√K) (fan_in = K). Mamba and FLA keep it.
    bound = 1.0 / np.sqrt(kernel_size)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)
    return init


class ShortConv(nn.Module):
    """Causal depthwise convolution over time, kernel K (4), no bias, per channel of [H, D].

    y_t = Σ_{j<K} w[K−1−j] · x_{t−j}, where x_{t−j} counts only if it is in the same document as t (segment
    ids) and t − j ≥ 0. Weight w [K, H, D] (w[K−1] multiplies the current token, PyTorch's layout).
    x is [B, T, H, D] or flat [B, T, H·D] (then y is flat too; the state keeps its [B, K−1, H, D] shape).
    With `state` (decoding: the last K−1 inputs [B, K−1, H, D] before this chunk, one document) the chunk is
    continued from it; returns (y, new_state).
    """
    num_heads: int
    head_dim: int
    kernel_size: int = 4
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, doc: jax.Array | None = None, state: jax.Array | None = None):
        k = self.kernel_size
        w = param(self, "kernel", _torch_conv_init(k), (k, self.num_heads, self.head_dim),
                  ("conv", "heads", "kv"), self.param_dtype).astype(jnp.float32)
        b, t = x.shape[:2]
        xf = x.astype(jnp.float32)
        flat = x.ndim == 3
        if flat:
            w = w.reshape(k, -1)
        if state is not None:
            st = state.astype(jnp.float32)
            ext = jnp.concatenate([st.reshape(*st.shape[:2], -1) if flat else st, xf], axis=1)  # [B, K−1+T, ...]
            y = sum(w[k - 1 - j] * ext[:, k - 1 - j: k - 1 - j + t] for j in range(k))
            new_state = ext[:, t:].reshape(state.shape).astype(state.dtype)
            return y.astype(self.dtype), new_state
        pad_rest = ((0, 0),) * (x.ndim - 2)
        y = w[k - 1] * xf
        for j in range(1, k):
            xs = jnp.pad(xf, ((0, 0), (j, 0), *pad_rest))[:, :t]
            if doc is not None:
                ds = jnp.pad(doc, ((0, 0), (j, 0)), constant_values=-1)[:, :t]
                xs = jnp.where((ds == doc).reshape(b, t, *(1,) * (x.ndim - 2)), xs, 0.0)
            y = y + w[k - 1 - j] * xs
        return y.astype(self.dtype), None
