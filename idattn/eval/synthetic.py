"""Training a model on a synthetic task held as arrays: the one loop behind MQAR (idattn.eval.recall.train_mqar),
MAD (idattn.eval.mad.fit_and_score) and state tracking (idattn.eval.state_tracking), so that the three tasks train
alike and a change of that training is one change (the studies record its hash:
idattn.studies.code_hash.synthetic_train_hash).

The format: ``inputs`` int [N, T] token ids, ``targets`` int [N, T] with IGNORE wherever a position is not scored
(the loss is the masked token cross-entropy at the scored positions only). The step is the trainer's
(idattn.train.step.make_train_step: the update is applied only when finite) with Zoology's / MAD's optimiser:
AdamW (decay on every parameter), global-norm clip 1.0, linear warmup from 0 to `lr` over `warmup` steps, then
cosine to lr/100. The model is initialised from PRNGKey(`seed`); each step draws `batch_size` rows with
replacement from a NumPy generator seeded with `seed` + 1, so a run is a function of (model, arrays, recipe, seed).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from idattn.train.step import TrainState, make_train_step

IGNORE = -100  # a target that is not scored


def fit(model: Any, x_tr: np.ndarray, y_tr: np.ndarray, *, steps: int, batch_size: int, lr: float,
        weight_decay: float = 0.0, warmup: int = 50, seed: int = 0, log_every: int = 0, curve_every: int = 0,
        log: Callable[[str], None] = print, name: str = "task") -> dict[str, Any]:
    """Trains the flax `model` on (x_tr, y_tr) [N, T] and returns {"params": the trained parameters, "loss": the
    last step's batch loss, "first_loss": the first step's, "loss_curve": [[step, batch loss], ...] every
    `curve_every` steps and at the last (empty with curve_every=0), "steps", "train_seconds", "seq_len"}."""
    n_train, T = x_tr.shape
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.asarray(x_tr[:2]))["params"])
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), lr * 0.01)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=weight_decay))
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt.init(params))
    step = jax.jit(make_train_step(model.apply, opt))
    positions = jnp.asarray(np.broadcast_to(np.arange(T, dtype=np.int32), (batch_size, T)))
    segments = jnp.ones((batch_size, T), jnp.int32)

    rng = np.random.default_rng(seed + 1)
    t0, loss, first_loss, curve = time.time(), float("nan"), float("nan"), []
    for i in range(steps):
        idx = rng.integers(0, n_train, batch_size)
        x, y = x_tr[idx], y_tr[idx]
        mask = y != IGNORE
        state, metrics = step(state, {"inputs": jnp.asarray(x), "targets": jnp.asarray(np.where(mask, y, 0)),
                                      "segment_ids": segments, "positions": positions,
                                      "loss_mask": jnp.asarray(mask, jnp.float32)})
        loss = metrics["loss"]
        if i == 0:
            first_loss = float(loss)
        if curve_every and ((i + 1) % curve_every == 0 or i + 1 == steps):
            curve.append([i + 1, float(loss)])
        if log_every and (i + 1) % log_every == 0:
            log(f"{name} step {i + 1}/{steps} loss {float(loss):.4f} ({time.time() - t0:.0f}s)")
    return {"params": state.params, "loss": float(loss), "first_loss": first_loss, "loss_curve": curve,
            "steps": steps, "train_seconds": time.time() - t0, "seq_len": int(T)}

