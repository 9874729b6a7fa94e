"""Llama-style decoder (docs/model.md).

x_0 = E[tokens];  for each of N blocks:  x <- x + mixer(RMSNorm(x));  x <- x + SwiGLU(RMSNorm(x));
logits = W_head RMSNorm(x)   (untied head, no biases, no dropout; logits float32).

Blocks are stacked with `nn.scan` (parameters get a leading `layers` axis) under a remat policy
(none | full | dots), so that compile time does not grow with depth; `scan_layers=False` unrolls them
(parameters `layers_0`, `layers_1`, ...). A hybrid stack (`model.layer_pattern` of P mixers, docs/model.md
"Hybrid stacks") scans a group of P blocks `num_layers / P` times: parameters `layers/block_<j>/...` with a leading
axis of length num_layers / P (layer i = group i // P, position j = i mod P); unrolled, `layers_<i>` as above. Parameters are float32, compute in `dtype` (bf16 by default); norms,
the recurrence and the readout accumulate in float32 / complex64.

Call: `model.apply({"params": p}, tokens [B, T] int32, segment_ids=None, positions=None) -> logits [B, T, V]`.
With `targets=` [B, T] int32 it returns the per-token loss instead, nll [B, T] float32 = −log softmax(logits)[y],
computed `loss_chunk` positions at a time (a `lax.map` over T / loss_chunk strided chunks, each rematerialised in
the backward), so that neither the logits [B, T, V] nor their gradient ever exist whole: per chip at most
B/shards × loss_chunk × V float32 values live at once.

Sharding (under the trainer's mesh and logical axis rules; no-ops without them): the residual stream is
constrained to ("batch", "length", "act_embed") after the embedding, after every block and before the head,
and the logits to ("batch", "length", "act_vocab"): activations stay split over the batch shards, so XLA
gathers the FSDP-sharded weights instead of computing partial products for the whole batch on every chip.
Positions default to the position inside each document (restarting at each segment start). With
`cache=` (see idattn.models.decoding) it returns `(logits, new_cache)` and continues from the cache; with
`hidden=True` the final-normed representation [B, T, d] instead of logits (no `lm_head` is applied or created).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from idattn.layers.attention import SoftmaxAttention
from idattn.layers.common import RMSNorm, SwiGLU, check_segment_ids, param, positions_from_segments
from idattn.layers.interdomain import InterdomainMixer
from idattn.models.spec import ATTENTION_FAMILIES, ModelSpec, layer_specs, spec_from_config
from idattn.ops.interdomain import document_index


def make_mixer(spec: ModelSpec, name: str = "mixer") -> nn.Module:
    common = dict(d_model=spec.d_model, num_heads=spec.num_heads, head_dim=spec.head_dim, rope_base=spec.rope_base,
                  init_std=spec.init_std, out_std=spec.out_std, dtype=jnp.dtype(spec.dtype),
                  param_dtype=jnp.dtype(spec.param_dtype), name=name)
    if spec.family == "softmax":
        return SoftmaxAttention(impl=spec.attn_impl, **common)
    if spec.family == "swa":
        return SoftmaxAttention(impl=spec.attn_impl, window=spec.window, **common)
    if spec.family == "hybrid":
        raise ValueError("make_mixer: a hybrid spec has one mixer per pattern entry; use layer_specs(spec)")
    return InterdomainMixer(num_modes=spec.num_modes, input=spec.input, readout=spec.readout, use_rope=spec.rope,
                            output_gate=spec.output_gate, linear_contraction=spec.linear_contraction,
                            conj=spec.conj, theory=spec.theory, s4d_init=spec.s4d_init,
                            kappa=spec.kappa, dt_min=spec.dt_min, dt_max=spec.dt_max, short_conv=spec.short_conv,
                            impl=spec.impl, chunk_size=spec.chunk_size, norm_eps=spec.norm_eps, core=spec.core,
                            delta_scale=spec.delta_scale, **common)


RESIDUAL_AXES = ("batch", "length", "act_embed")
LOGITS_AXES = ("batch", "length", "act_vocab")


def constrain(x, axes):
    """Logical sharding constraint (a no-op without a mesh and axis rules in context)."""
    return nn.with_logical_constraint(x, axes)


def _divisor_at_most(n: int, k: int) -> int:
    k = max(1, min(int(k), int(n)))
    while n % k:
        k -= 1
    return k


class LMHead(nn.Module):
    """logits = x · W_head (W [d, V], float32 output); or, with targets, the chunked token loss (see the module
    docstring). The parameter is `lm_head/kernel` either way."""
    vocab_size: int
    d_model: int
    init_std: float
    dtype: jnp.dtype
    param_dtype: jnp.dtype

    @nn.compact
    def __call__(self, x, targets=None, loss_chunk: int = 0):
        w = param(self, "kernel", nn.initializers.normal(self.init_std), (self.d_model, self.vocab_size),
                  ("embed", "vocab"), self.param_dtype)

        def logits_of(xc):
            y = jnp.einsum("...a,an->...n", xc.astype(self.dtype), w.astype(self.dtype),
                           preferred_element_type=jnp.float32)
            return constrain(y, LOGITS_AXES)

        if targets is None:
            return logits_of(x)
        b, t, d = x.shape
        c = _divisor_at_most(t, loss_chunk) if loss_chunk and loss_chunk > 0 else t
        n = t // c

        @jax.checkpoint  # the backward recomputes one chunk's logits instead of keeping all of them
        def chunk_nll(args):
            xc, tc = args
            return optax.softmax_cross_entropy_with_integer_labels(logits_of(xc), tc)

        # Strided chunks: chunk j holds positions i·n + j (i < c). The loss is per token, so which positions share
        # a chunk changes nothing; but under a sequence-sharded T (mesh.sequence = P, contiguous blocks) each chunk
        # then takes c/P positions of every shard and the map's slicing stays local. Contiguous chunks each lived
        # on one shard, and XLA resharded the whole hidden state (all-to-alls over `sequence`, ~0.8 GB a chip and
        # step at 125M and 1M tokens on v5p-128, measured by idattn.aot's collectives_by_axis).
        xs = jnp.moveaxis(x.reshape(b, c, n, d), 2, 0)            # [n, B, c, d]
        ts = jnp.moveaxis(targets.reshape(b, c, n), 2, 0)         # [n, B, c]
        nll = jax.lax.map(chunk_nll, (xs, ts))                    # [n, B, c]
        return jnp.moveaxis(nll, 0, 2).reshape(b, t)


class Block(nn.Module):
    """x <- x + mixer(RMSNorm(x)); x <- x + SwiGLU(RMSNorm(x)). Scan-compatible: (carry, *xs) -> (carry, ys)."""
    spec: ModelSpec

    @nn.compact
    def __call__(self, x, doc, positions, segment_ids, cache, cache_index):
        s = self.spec
        dt, pdt = jnp.dtype(s.dtype), jnp.dtype(s.param_dtype)
        h = RMSNorm(s.norm_eps, dt, pdt, name="attn_norm")(x)
        mixer = make_mixer(s)
        if s.family in ATTENTION_FAMILIES:
            y, new_cache = mixer(h, doc if segment_ids is not None else None, positions, cache, cache_index)
        else:
            y, new_cache = mixer(h, doc if segment_ids is not None else None, positions, cache,
                                 segment_ids=segment_ids)  # a fixed state: no cache position
        x = x + y.astype(x.dtype)
        h = RMSNorm(s.norm_eps, dt, pdt, name="mlp_norm")(x)
        x = x + SwiGLU(s.d_model, s.ffn_dim, s.init_std, s.out_std, dt, pdt, name="mlp")(h).astype(x.dtype)
        return constrain(x, RESIDUAL_AXES), new_cache


def _remat(spec: ModelSpec, cls):
    if spec.remat == "none":
        return cls
    policy = None if spec.remat == "full" else jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims
    return nn.remat(cls, policy=policy, prevent_cse=not spec.scan_layers)


class BlockGroup(nn.Module):
    """One repetition of a hybrid pattern: blocks `block_0` .. `block_<P−1>`, block j with the mixer of pattern
    entry j (`layer_specs`). Scan-compatible like Block; the cache is {"block_<j>": that block's cache}."""
    spec: ModelSpec

    @nn.compact
    def __call__(self, x, doc, positions, segment_ids, cache, cache_index):
        block = _remat(self.spec, Block)
        new = {}
        for j, ls in enumerate(layer_specs(self.spec)):
            name = f"block_{j}"
            x, new[name] = block(ls, name=name)(x, doc, positions, segment_ids,
                                                None if cache is None else cache[name], cache_index)
        return x, (None if cache is None else new)


class Decoder(nn.Module):
    spec: ModelSpec

    @nn.compact
    def __call__(self, tokens, segment_ids=None, positions=None, cache=None, targets=None, loss_chunk: int = 0,
                 hidden: bool = False):
        s = self.spec
        tokens = jnp.asarray(tokens)
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"tokens: got shape {tokens.shape} dtype {tokens.dtype}; expected [B, T] int32")
        check_segment_ids(segment_ids, tokens.shape)
        b, t = tokens.shape
        dt, pdt = jnp.dtype(s.dtype), jnp.dtype(s.param_dtype)
        cache_index, layer_cache = None, None
        if cache is not None:
            if segment_ids is not None:
                raise ValueError("segment_ids: decoding with a cache handles one document per row; pass None")
            cache_index = cache["index"]
            layer_cache = cache["layers"]
            positions = cache_index + jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        elif positions is None:
            positions = positions_from_segments(segment_ids, b, t)
        doc = document_index(segment_ids, b, t)

        emb = param(self, "embedding", nn.initializers.normal(s.init_std), (s.vocab_size, s.d_model),
                    ("vocab", "embed"), pdt)
        x = constrain(jnp.take(emb, tokens, axis=0).astype(dt), RESIDUAL_AXES)

        block = _remat(s, Block)
        if s.family == "hybrid":
            x, new_layer_cache = self._hybrid(x, doc, positions, segment_ids, layer_cache, cache_index)
        elif s.scan_layers:
            stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                            in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, 0, nn.broadcast),
                            length=s.num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
            x, new_layer_cache = stack(s, name="layers")(x, doc, positions, segment_ids, layer_cache, cache_index)
        else:
            outs = []
            for i in range(s.num_layers):
                lc = None if layer_cache is None else jax.tree_util.tree_map(lambda a: a[i], layer_cache)
                x, nc = block(s, name=f"layers_{i}")(x, doc, positions, segment_ids, lc, cache_index)
                outs.append(nc)
            new_layer_cache = None if layer_cache is None else jax.tree_util.tree_map(
                lambda *a: jnp.stack(a), *outs)
        x = constrain(RMSNorm(s.norm_eps, dt, pdt, name="final_norm")(x), RESIDUAL_AXES)
        if hidden:  # the final representation [B, T, d] (no head: e.g. the MAD auto-encoder's encoder)
            if cache is not None or targets is not None:
                raise ValueError("hidden=True: returns the representation only; pass no cache and no targets")
            return x
        head = LMHead(s.vocab_size, s.d_model, s.init_std, dt, pdt, name="lm_head")
        if targets is not None:
            if cache is not None:
                raise ValueError("targets: the chunked loss is for training / evaluation; decode without targets")
            if tuple(targets.shape) != (b, t):
                raise ValueError(f"targets: shape {tuple(targets.shape)}; expected [B, T] = [{b}, {t}]")
            return head(x, targets, loss_chunk)
        logits = head(x)
        if cache is None:
            return logits
        return logits, {"index": cache_index + t, "layers": new_layer_cache}


    def _hybrid(self, x, doc, positions, segment_ids, layer_cache, cache_index):
        """The hybrid stack: scanned over groups of P blocks, or unrolled (`layers_<i>`, pattern entry i mod P).
        The cache is {"block_<j>": [num_layers / P, ...] stacked per pattern position} either way."""
        s = self.spec
        specs = layer_specs(s)
        p = len(specs)
        if s.scan_layers:
            stack = nn.scan(BlockGroup, variable_axes={"params": 0}, split_rngs={"params": True},
                            in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, 0, nn.broadcast),
                            length=s.num_layers // p, metadata_params={nn.PARTITION_NAME: "layers"})
            return stack(s, name="layers")(x, doc, positions, segment_ids, layer_cache, cache_index)
        block = _remat(s, Block)
        outs = {f"block_{j}": [] for j in range(p)}
        for i in range(s.num_layers):
            name, g = f"block_{i % p}", i // p
            lc = None if layer_cache is None else jax.tree_util.tree_map(lambda a: a[g], layer_cache[name])
            x, nc = block(specs[i % p], name=f"layers_{i}")(x, doc, positions, segment_ids, lc, cache_index)
            outs[name].append(nc)
        if layer_cache is None:
            return x, None
        return x, {k: jax.tree_util.tree_map(lambda *a: jnp.stack(a), *v) for k, v in outs.items()}


def build_model(model_cfg) -> nn.Module:
    """Validate `model_cfg` (a config's `model` section) and return the Decoder module."""
    return Decoder(spec_from_config(model_cfg))
