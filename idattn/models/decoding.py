"""Decoding: cache, chunked prefill, one-token steps and sampling (docs/model.md).

Cache (one document per batch row):
  {"index": int32 scalar (tokens consumed), "layers": per-layer pytree stacked on a leading [num_layers] axis}
  softmax:      {"k", "v": [L, B, max_len, H, d_h]}                         grows with context (KV cache)
  recurrent:    {"conv_<n>": [L, B, K−1, H, d_h], "xk": [L, B, H, M, R] complex64, "xv": [L, B, H, M, d_h]}
                constant in the context length
  swa:          {"k", "v": [L, B, min(W, max_len), H, d_h]}                 a ring buffer of the last W tokens
  hybrid:       {"block_<j>": the cache above of pattern entry j, stacked on [L / P]}   (model.layer_pattern)
`prefill` feeds the prompt in chunks of `chunk_size` tokens (one jitted function per chunk length), so that
activation memory is O(chunk) and, for the recurrent mixers, the whole prefill is independent of the prompt
length. `decode_step` takes one token per row; for the recurrent mixers it runs `interdomain_step` (query
readout) or `s4d_linear_step` (linear readout: the same two state halves xk, xv), whose cost does not depend on
the context length.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from idattn.models.spec import ModelSpec, conv_names, layer_specs, spec_from_config


def _spec(model_or_cfg) -> ModelSpec:
    spec = getattr(model_or_cfg, "spec", None)
    return spec if isinstance(spec, ModelSpec) else spec_from_config(model_or_cfg)


def init_cache(model_or_cfg: Any, batch_size: int, max_len: int | None = None, dtype=None) -> dict:
    """Empty cache. `max_len` (prompt + new tokens) is required for softmax (and hybrids with a softmax layer),
    optional for swa (the ring then has min(W, max_len) slots), ignored by the recurrent mixers.
    `dtype` (KV cache and short-conv states) defaults to the model's compute dtype; the S4D states are always
    complex64."""
    s = _spec(model_or_cfg)
    dtype = jnp.dtype(s.dtype) if dtype is None else dtype
    if s.theory:
        raise NotImplementedError("model.theory=True has no decoding path (time-varying LegS basis); "
                                  "use the S4D mixer (theory=False)")
    if s.family == "hybrid":
        specs = layer_specs(s)
        n = s.num_layers // len(specs)
        layers = {f"block_{j}": _layer_cache(ls, n, batch_size, max_len, dtype) for j, ls in enumerate(specs)}
    else:
        layers = _layer_cache(s, s.num_layers, batch_size, max_len, dtype)
    return {"index": jnp.zeros((), jnp.int32), "layers": layers}


def _layer_cache(s: ModelSpec, n: int, b: int, max_len, dtype) -> dict:
    """The cache of n stacked layers of one (non-hybrid) spec s."""
    h, dh, m = s.num_heads, s.head_dim, s.num_modes
    if s.family == "softmax":
        if not max_len or max_len <= 0:
            raise ValueError(f"init_cache: max_len={max_len!r}; softmax needs the KV cache length "
                             "(prompt length + new tokens)")
        shape = (n, b, max_len, h, dh)
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
    if s.family == "swa":
        size = s.window if not max_len or max_len <= 0 else min(s.window, int(max_len))
        shape = (n, b, size, h, dh)
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
    layers = {name: jnp.zeros((n, b, s.short_conv - 1, h, dh), dtype) for name in conv_names(s)}
    layers["xk"] = jnp.zeros((n, b, h, m, dh), jnp.complex64)
    layers["xv"] = jnp.zeros((n, b, h, m, dh), jnp.complex64)
    return layers


def cache_bytes(model_or_cfg: Any, context: int, batch_size: int = 1) -> int:
    """Bytes of the decoding cache `init_cache` allocates for `batch_size` sequences of `context` tokens
    (`jax.eval_shape`: nothing is allocated), the index scalar included."""
    shapes = jax.eval_shape(lambda: init_cache(model_or_cfg, batch_size, context))
    return int(sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize for a in jax.tree_util.tree_leaves(shapes)))


@functools.lru_cache(maxsize=32)
def _chunk_fn(model):
    @jax.jit
    def run(params, tokens, cache):
        logits, new_cache = model.apply({"params": params}, tokens, cache=cache)
        return logits[:, -1], new_cache
    return run


def _check_room(model, cache, extra: int) -> None:
    s = _spec(model)
    caps = []  # a softmax KV cache, or an swa ring cut to max_len < W, holds at most its length
    if s.family in ("softmax", "swa"):
        pairs = [(s, cache["layers"])]
    elif s.family == "hybrid":
        pairs = [(ls, cache["layers"][f"block_{j}"]) for j, ls in enumerate(layer_specs(s))]
    else:
        pairs = []
    for ls, lc in pairs:
        size = lc["k"].shape[2] if ls.family in ("softmax", "swa") else None
        if size is not None and (ls.family == "softmax" or size < ls.window):
            caps.append(size)
    for cap in sorted(caps)[:1]:
        used = int(cache["index"])
        if used + extra > cap:
            raise ValueError(f"KV cache: {used} + {extra} tokens exceed max_len={cap}; "
                             "call init_cache with a larger max_len")


def prefill(model, params, tokens, cache, chunk_size: int = 256):
    """Feed tokens [B, P] in chunks of `chunk_size`. Returns (logits of the last token [B, V], cache)."""
    tokens = jnp.asarray(tokens, jnp.int32)
    if tokens.ndim != 2 or tokens.shape[1] == 0:
        raise ValueError(f"prefill tokens: got shape {tokens.shape}; expected [B, P] with P ≥ 1")
    if chunk_size <= 0:
        raise ValueError(f"prefill chunk_size: got {chunk_size}; expected a positive integer")
    _check_room(model, cache, tokens.shape[1])
    fn = _chunk_fn(model)
    logits = None
    for start in range(0, tokens.shape[1], chunk_size):
        logits, cache = fn(params, tokens[:, start:start + chunk_size], cache)
    return logits, cache


def decode_step(model, params, token, cache):
    """One token per row, token [B] int32. Returns (logits [B, V] float32, cache)."""
    token = jnp.asarray(token, jnp.int32)
    if token.ndim != 1:
        raise ValueError(f"decode_step token: got shape {token.shape}; expected [B]")
    return _chunk_fn(model)(params, token[:, None], cache)


def sample_logits(rng, logits, temperature: float = 0.0, top_p: float = 1.0):
    """Greedy (temperature 0) or temperature / nucleus (top-p) sampling. logits [B, V] -> [B] int32."""
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"sampling: temperature={temperature} (want ≥ 0), top_p={top_p} (want in (0, 1])")
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / temperature
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p
        cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def generate(model, params, prompt, max_new_tokens: int, *, rng=None, temperature: float = 0.0,
             top_p: float = 1.0, eos_id: int | None = None, prefill_chunk: int = 256, cache_dtype=None):
    """Prompt [B, P] int32 -> [B, P + max_new_tokens] int32 (after `eos_id`, a row repeats eos_id)."""
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.ndim != 2:
        raise ValueError(f"generate prompt: got shape {prompt.shape}; expected [B, P] int32")
    if max_new_tokens < 0:
        raise ValueError(f"generate max_new_tokens: got {max_new_tokens}; expected ≥ 0")
    rng = jax.random.PRNGKey(0) if rng is None else rng
    b, p = prompt.shape
    cache = init_cache(model, b, p + max_new_tokens, cache_dtype)
    logits, cache = prefill(model, params, prompt, cache, prefill_chunk)
    out = [prompt]
    done = jnp.zeros((b,), bool)
    for i in range(max_new_tokens):
        rng, sub = jax.random.split(rng)
        tok = sample_logits(sub, logits, temperature, top_p)
        if eos_id is not None:
            tok = jnp.where(done, eos_id, tok)
            done = done | (tok == eos_id)
        out.append(tok[:, None])
        if i + 1 < max_new_tokens:
            logits, cache = decode_step(model, params, tok, cache)
    return jnp.concatenate(out, axis=1)
