"""Train state, loss, and the jitted train / eval steps. The trainer knows nothing about mixers.

Loss: mean token cross-entropy over the tokens the batch marks with `loss_mask` (float32 [B, T]):

    L = Σ_{b,t} m_bt · (−log softmax(logits_bt)[y_bt]) / max(1, Σ_{b,t} m_bt)

Gradient accumulation splits the B rows into A = train.grad_accum microbatches (rows j, j+A, j+2A, ... form
microbatch j, so each keeps the batch sharding) and sums ∂(Σ m·nll)/∂θ over them with `lax.scan`, dividing by
the token count of the whole batch: the result is the gradient of L itself, not a mean of per-microbatch means.

Finite by construction. An update is applied only when the loss, the gradient norm and the norm of the update
are finite (`metrics["finite"]`, 1.0 or 0.0); otherwise the step returns the parameters and optimiser state it was
given (the batch is dropped, the step counter still advances so that the schedule and the data stay aligned).
From a finite state that is enough: a finite gradient norm makes every g² finite, so AdamW's moments stay finite,
and a finite update norm bounds every |Δθ| below 2^64, so θ + Δθ cannot overflow float32 for any parameter a
model could have trained to. Three scalar checks instead of a finiteness reduction over every array of three
trees: the latter cost ~50% more XLA compile time per step program on CPU. The checkpoint writer checks every
array directly anyway (idattn.train.checkpoint.save refuses a non-finite state). The trainer decides whether a
dropped step is tolerated (train.max_bad_steps) or stops the run.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct

BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "loss_mask")


@struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimiser updates applied so far
    params: Any
    opt_state: Any


def token_nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """−log softmax(logits)[target] per token; logits [B, T, V] (any float dtype, computed in float32)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def make_loss_sums(apply_fn: Callable, loss_chunk: int = 0) -> Callable:
    """(params, batch) -> (Σ m·nll, Σ m) for one (micro)batch.

    loss_chunk > 0: the model computes the token loss itself, `loss_chunk` positions at a time
    (`apply_fn(..., targets=, loss_chunk=)` -> nll [B, T]; idattn.models.llama), so the full logits and their
    gradient are never materialised; 0: from the logits [B, T, V] the model returns."""

    def loss_sums(params, batch):
        kw = dict(segment_ids=batch["segment_ids"], positions=batch["positions"])
        if loss_chunk and loss_chunk > 0:
            nll = apply_fn({"params": params}, batch["inputs"], targets=batch["targets"], loss_chunk=int(loss_chunk),
                           **kw)
        else:
            nll = token_nll(apply_fn({"params": params}, batch["inputs"], **kw), batch["targets"])
        mask = batch["loss_mask"].astype(jnp.float32)
        return jnp.sum(nll * mask), jnp.sum(mask)

    return loss_sums


def _split_micro(x: jax.Array, accum: int) -> jax.Array:
    """[B, ...] -> [A, B/A, ...] with microbatch j = rows j, j+A, ... (keeps a contiguous batch sharding)."""
    b = x.shape[0]
    x = x.reshape((b // accum, accum) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)


def make_train_step(apply_fn: Callable, tx: optax.GradientTransformation, *, grad_accum: int = 1,
                    lr_fn: Callable | None = None, micro_constraint: Callable | None = None,
                    loss_chunk: int = 0) -> Callable:
    """Returns train_step(state, batch) -> (new_state, metrics) with metrics loss, grad_norm, lr, tokens."""
    loss_sums = make_loss_sums(apply_fn, loss_chunk)
    grad_fn = jax.value_and_grad(lambda p, b: loss_sums(p, b), has_aux=True)

    def train_step(state: TrainState, batch: dict[str, jax.Array]):
        count = jnp.sum(batch["loss_mask"].astype(jnp.float32))
        denom = jnp.maximum(count, 1.0)
        if grad_accum == 1:
            (nll_sum, _), grads = grad_fn(state.params, batch)
        else:
            micro = {k: _split_micro(v, grad_accum) for k, v in batch.items()}

            def body(carry, mb):
                if micro_constraint is not None:
                    mb = micro_constraint(mb)
                g_acc, l_acc = carry
                (l, _), g = grad_fn(state.params, mb)
                return (jax.tree.map(jnp.add, g_acc, g), l_acc + l), None

            zeros = jax.tree.map(jnp.zeros_like, state.params)
            (grads, nll_sum), _ = jax.lax.scan(body, (zeros, jnp.zeros((), jnp.float32)), micro)
        grads = jax.tree.map(lambda g: g / denom, grads)
        loss = nll_sum / denom
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        grad_norm = optax.global_norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.global_norm(updates))
        # A non-finite step is dropped whole: XLA computes both sides of the select, the state keeps its buffers.
        params = jax.tree.map(lambda new, old: jnp.where(finite, new, old), params, state.params)
        opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), opt_state, state.opt_state)
        metrics = {"loss": loss, "grad_norm": grad_norm, "tokens": count, "finite": finite.astype(jnp.float32)}
        if lr_fn is not None:
            metrics["lr"] = lr_fn(state.step)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(apply_fn: Callable, loss_chunk: int = 0) -> Callable:
    """eval_step(params, batch) -> (Σ m·nll, Σ m) as float32 scalars."""
    return make_loss_sums(apply_fn, loss_chunk)
