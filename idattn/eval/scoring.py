"""The scoring core every evaluation shares: per-token target log-probabilities, batched and jitted.

Everything downstream (harness tasks, perplexity, extrapolation, recall) reduces to one primitive,

    score_fn(tokens [B, T] int32, targets [B, T] int32) -> (logp [B, T] float32, greedy [B, T] bool)
    logp[b, t]   = log softmax(logits[b, t])[targets[b, t]]
    greedy[b, t] = argmax(logits[b, t]) == targets[b, t]

built once per model by `make_score_fn(apply_fn, params)` from any `apply_fn(params, tokens) -> logits
[B, T, V]` (an idattn model, or a lookup table in tests: nothing here imports the model). The log-softmax and
the gather run inside the jit, so only [B, T] values leave the device.

Batching (`score_sequences`): sequences are sorted by length (longest first, as the harness does; results do
not depend on the order), grouped into batches of `batch_size` rows, right-padded to a length bucket (powers of
two from `min_bucket`, capped at the longest allowed length) and the batch is padded to `batch_size` rows, so
the jit compiles once per bucket. Right padding is exact for causal models: position t never reads t' > t.

Harness semantics (lm-evaluation-harness, HFLM):
- `encode_pair`: trailing spaces of the context move to the continuation; the continuation's ids are the ids
  of `encode(context + continuation)` after the first `len(encode(context))` ones; an empty context becomes
  the prefix token (BOS, else EOS).
- `loglikelihood`: input `(ctx + cont)[-(max_length + 1):][:-1]` (left truncation), score the last
  `len(cont)` positions (at most `max_length`); returns (sum of log-probs, every scored continuation token is
  the argmax).
- `rolling_windows` / `make_disjoint_window`: the harness's `get_rolling_token_windows(context_len=1)`:
  disjoint windows of `max_length` predicted tokens, the first fed `[prefix] + tokens[:max_length - 1]`.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import partitioning as nn_partitioning
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from idattn.configs import DEFAULT_LOGICAL_AXIS_RULES

ScoreFn = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


class TextTokenizer(Protocol):
    """What evaluation needs from a tokenizer (idattn.data.tokenizer.Tokenizer satisfies it)."""

    def encode(self, text: str) -> list[int]: ...  # no BOS/EOS

    def decode(self, ids) -> str: ...

    @property
    def bos_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...


def make_score_fn(apply_fn: Callable[[Any, jax.Array], jax.Array], params: Any = None, mesh=None,
                  rules=None) -> ScoreFn:
    """Jitted `score_fn(tokens, targets) -> (logp, greedy)` (module docstring) for `apply_fn(params, tokens)`.

    `params` is passed as a jit argument (not closed over) so that large weights are not baked into the HLO.
    `mesh` (a `jax.sharding.Mesh` with a "sequence" axis, e.g. `sequence_mesh(N)`): long-context scoring with
    the length split over that axis, as the trainer splits it (docs/pods.md, "Long context"): parameters
    replicated on the mesh, tokens and targets placed with their length on "sequence" (rows on the other axes
    when they divide the batch), and the call traced under the mesh and the logical axis `rules` (default: the
    trainer's), so every mixer passes states (Interdomain, the linear readout) or gathers K and V (Softmax)
    between the shards; a length the axis does not divide is scored unsplit on the mesh. Exact either way.
    """
    place = None
    if mesh is not None:
        rows_axes = tuple(a for a in mesh.axis_names if a != "sequence" and int(mesh.shape[a]) > 1)
        n_rows = int(np.prod([mesh.shape[a] for a in rows_axes])) if rows_axes else 1
        seq = int(dict(mesh.shape).get("sequence", 1))
        params = jax.device_put(params, NamedSharding(mesh, P()))

        def place(a):
            b, t = a.shape
            spec = P(rows_axes if rows_axes and b % n_rows == 0 else None, "sequence" if t % seq == 0 else None)
            return jax.device_put(a, NamedSharding(mesh, spec))

    @jax.jit
    def _score(p, tokens, targets):
        logits = apply_fn(p, tokens).astype(jnp.float32)  # [B, T, V]
        logp = jax.nn.log_softmax(logits, axis=-1)
        tgt = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        greedy = jnp.argmax(logits, axis=-1) == targets
        return tgt, greedy

    def score_fn(tokens, targets):
        tokens = np.asarray(tokens, np.int32)
        targets = np.asarray(targets, np.int32)
        if tokens.ndim != 2 or tokens.shape != targets.shape:
            raise ValueError(f"score_fn: tokens and targets must both be [B, T] int; got {tokens.shape} and "
                             f"{targets.shape}.")
        if place is None:
            lp, g = _score(params, tokens, targets)
        else:
            with _mesh_context(mesh, rules):
                lp, g = _score(params, place(tokens), place(targets))
        return np.asarray(lp), np.asarray(g)

    return score_fn


class _mesh_context:
    """`jax.set_mesh(mesh)` and flax's logical axis rules (the trainer's by default) together."""

    def __init__(self, mesh, rules):
        self.mesh, self.rules, self.stack = mesh, rules, []

    def __enter__(self):
        rules = tuple((str(n), tuple(a) if isinstance(a, list) else a) for n, a in
                      (DEFAULT_LOGICAL_AXIS_RULES if self.rules is None else self.rules))
        self.stack = [jax.set_mesh(self.mesh), nn_partitioning.axis_rules(rules)]
        for c in self.stack:
            c.__enter__()
        return self

    def __exit__(self, *exc):
        for c in reversed(self.stack):
            c.__exit__(*exc)
        return False


def sequence_mesh(sequence: int, devices=None):
    """A (data, fsdp, sequence, tensor) = (1, 1, N, 1) mesh of the first N devices, for `make_score_fn(mesh=)`."""

    devices = list(jax.devices() if devices is None else devices)
    if int(sequence) < 1 or int(sequence) > len(devices):
        raise ValueError(f"sequence={sequence}: expected 1 to {len(devices)} (the devices here); the length of every "
                         f"scored sequence is split over that many devices")
    return Mesh(np.asarray(devices[:int(sequence)]).reshape(1, 1, int(sequence), 1),
                ("data", "fsdp", "sequence", "tensor"))


def prefill_on_mesh(model, params, tokens, cache, mesh, chunk_size: int = 256, rules=None):
    """Chunked prefill of a long prompt with each chunk's length split over the mesh's "sequence" axis:
    the layers pass the cached state into shard 0 and fold it through the shards (Interdomain, the linear-readout
    cells: `interdomain_mix_sequence` / `s4d_linear_mix_sequence` with `initial_state`, `return_state`), Softmax
    writes the chunk's K and V into its cache and attends over it as XLA partitions the call (K / V gathered).

    tokens [B, P] int; cache from `idattn.models.decoding.init_cache`. Returns (logits [B, P, V] float32 of every
    prompt position, the cache after the prompt, gathered to the default device), so that decoding continues with
    `decoding.decode_step` exactly as after `decoding.prefill`. A chunk whose length the sequence axis does not
    divide runs unsplit on the mesh (exact either way)."""
    tokens = np.asarray(tokens, np.int32)
    if tokens.ndim != 2 or tokens.shape[1] == 0:
        raise ValueError(f"prefill tokens: got shape {tokens.shape}; expected [B, P] with P ≥ 1")
    seq = int(dict(mesh.shape).get("sequence", 1))
    replicated = NamedSharding(mesh, P())

    @jax.jit
    def run(p, tok, c):
        logits, new_cache = model.apply({"params": p}, tok, cache=c)
        return logits.astype(jnp.float32), new_cache

    params = jax.device_put(params, replicated)
    cache = jax.device_put(cache, replicated)
    outs = []
    with _mesh_context(mesh, rules):
        for start in range(0, tokens.shape[1], chunk_size):
            chunk = tokens[:, start:start + chunk_size]
            spec = P(None, "sequence" if chunk.shape[1] % seq == 0 else None)
            logits, cache = run(params, jax.device_put(chunk, NamedSharding(mesh, spec)), cache)
            outs.append(np.asarray(logits))
    cache = jax.tree_util.tree_map(lambda a: jnp.asarray(np.asarray(a)), cache)  # off the mesh, for decoding
    return np.concatenate(outs, axis=1), cache


def model_score_fn(model, params, mesh=None, rules=None) -> ScoreFn:
    """`score_fn` for a flax linen model with `model.apply({"params": p}, tokens) -> logits [B, T, V]` (`mesh`,
    `rules`: see make_score_fn)."""
    return make_score_fn(lambda p, t: model.apply({"params": p}, t), params, mesh=mesh, rules=rules)


# ----------------------------------------------------------------------------------------------------------
# batching
# ----------------------------------------------------------------------------------------------------------


def bucket_length(n: int, max_length: int, min_bucket: int = 32) -> int:
    """Smallest power of two >= max(n, min_bucket), capped at `max_length` (n itself must fit)."""
    if n > max_length:
        raise ValueError(f"bucket_length: sequence of {n} tokens exceeds max_length={max_length}.")
    b = max(min_bucket, 1 << max(0, math.ceil(math.log2(max(n, 1)))))
    return min(b, max_length)


def score_sequences(score_fn: ScoreFn, inputs: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *,
                    batch_size: int = 8, max_length: int | None = None, min_bucket: int = 32,
                    pad_id: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Scores each (input, target) row; returns per row (logp [len] float64, greedy [len] bool), in order.

    inputs[i] and targets[i] are aligned (targets[i][t] is the token to predict after reading inputs[i][:t+1]).
    """
    if len(inputs) != len(targets):
        raise ValueError(f"score_sequences: {len(inputs)} inputs but {len(targets)} targets.")
    if batch_size < 1:
        raise ValueError(f"score_sequences: batch_size={batch_size}; expected >= 1.")
    lens = [len(x) for x in inputs]
    for i, (x, y) in enumerate(zip(inputs, targets)):
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"score_sequences: row {i} has {len(x)} inputs and {len(y)} targets; expected equal, "
                             "non-zero lengths.")
    cap = max_length if max_length is not None else max(lens, default=1)
    order = sorted(range(len(inputs)), key=lambda i: -lens[i])
    out: list[Any] = [None] * len(inputs)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        T = bucket_length(max(lens[i] for i in idx), max(cap, max(lens[i] for i in idx)), min_bucket)
        tok = np.full((batch_size, T), pad_id, np.int32)
        tgt = np.full((batch_size, T), pad_id, np.int32)
        for r, i in enumerate(idx):
            tok[r, :lens[i]] = inputs[i]
            tgt[r, :lens[i]] = targets[i]
        lp, g = score_fn(tok, tgt)
        for r, i in enumerate(idx):
            out[i] = (np.asarray(lp[r, :lens[i]], np.float64), np.asarray(g[r, :lens[i]], bool))
    return out


# ----------------------------------------------------------------------------------------------------------
# harness semantics
# ----------------------------------------------------------------------------------------------------------


def prefix_token(tok: TextTokenizer) -> int:
    """The harness's prefix token: BOS when the tokenizer has one, else EOS."""
    bos = getattr(tok, "bos_id", None)
    return int(bos) if bos is not None and bos >= 0 else int(tok.eos_id)


def encode_pair(tok: TextTokenizer, context: str, continuation: str, *, add_bos: bool = False
                ) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) exactly as HFLM builds them (module docstring).

    add_bos: prepend BOS to the context (HFLM's `add_bos_token=True`; off by default, as in the harness).
    """
    if context == "":
        return [prefix_token(tok)], list(tok.encode(continuation))
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = list(tok.encode(context + continuation))
    ctx = list(tok.encode(context))
    cont = whole[len(ctx):]
    if add_bos:
        ctx = [prefix_token(tok)] + ctx
    return ctx, cont


def loglikelihood(score_fn: ScoreFn, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, max_length: int,
                  batch_size: int = 8, min_bucket: int = 32) -> list[tuple[float, bool]]:
    """[(sum log p(cont | ctx), all continuation tokens greedy)] for token-id pairs, harness truncation."""
    inputs, targets, ncont = [], [], []
    for i, (ctx, cont) in enumerate(pairs):
        if len(cont) == 0:
            raise ValueError(f"loglikelihood: pair {i} has an empty continuation; nothing to score.")
        if len(ctx) == 0:
            raise ValueError(f"loglikelihood: pair {i} has an empty context; encode_pair substitutes the prefix "
                             "token for an empty context string.")
        whole = (list(ctx) + list(cont))[-(max_length + 1):]
        inputs.append(whole[:-1])
        targets.append(whole[1:])
        # a continuation longer than the window keeps only its last max_length tokens (left truncation, as the
        # harness truncates; its own slice is ill-defined there)
        ncont.append(min(len(cont), max_length))
    scored = score_sequences(score_fn, inputs, targets, batch_size=batch_size, max_length=max_length,
                             min_bucket=min_bucket)
    out = []
    for (lp, g), n in zip(scored, ncont):
        out.append((float(lp[-n:].sum()), bool(g[-n:].all())))
    return out


def rolling_windows(tokens: Sequence[int], prefix: int, max_seq_len: int, context_len: int = 1
                    ) -> Iterator[tuple[list[int], list[int]]]:
    """The harness's `get_rolling_token_windows`: yields (input, predicted) windows covering every token."""
    if not 1 <= context_len <= max_seq_len:
        raise ValueError(f"rolling_windows: need 1 <= context_len ({context_len}) <= max_seq_len ({max_seq_len}).")
    tokens = list(tokens)
    if not tokens:
        return
    pred_len = max_seq_len - context_len + 1
    predicted = 0
    first = min(max_seq_len, len(tokens))
    yield [prefix] + tokens[:first - 1], tokens[:first]
    predicted += first
    while predicted < len(tokens):
        n = min(len(tokens) - predicted, pred_len)
        end = predicted + n
        yield tokens[max(0, end - max_seq_len - 1):end - 1], tokens[end - n:end]
        predicted += n


def make_disjoint_window(pair: tuple[list[int], list[int]]) -> tuple[list[int], list[int]]:
    """The harness's `make_disjoint_window`: (context, continuation) with no overlap."""
    a, b = pair
    return a[:len(a) - (len(b) - 1)], b


def loglikelihood_rolling(score_fn: ScoreFn, docs_tokens: Sequence[Sequence[int]], *, prefix: int, max_length: int,
                          batch_size: int = 8, min_bucket: int = 32) -> list[float]:
    """Total log-likelihood of each token list under rolling windows of `max_length` (harness semantics)."""
    pairs, owner = [], []
    for d, toks in enumerate(docs_tokens):
        for w in rolling_windows(toks, prefix, max_length, 1):
            pairs.append(make_disjoint_window(w))
            owner.append(d)
    lls = loglikelihood(score_fn, pairs, max_length=max_length, batch_size=batch_size, min_bucket=min_bucket)
    total = [0.0] * len(docs_tokens)
    for d, (ll, _) in zip(owner, lls):
        total[d] += ll
    return total


def score_ids(model, params, ids: list[int]) -> list[float | None]:
    """log p(ids[i] | ids[:i]) for i ≥ 1 of one sequence (float32 logits; `python -m idattn.score`); entry 0
    is None (nothing predicts the first token)."""

    tokens = jnp.asarray([ids], jnp.int32)
    logits = jax.jit(model.apply)({"params": params}, tokens)[0]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    lp = jnp.take_along_axis(logp[:-1], tokens[0, 1:, None], axis=-1)[:, 0]
    return [None] + [float(x) for x in lp]

