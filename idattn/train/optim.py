"""Optimiser and learning-rate schedule of the paper's recipe (docs/training.md).

Schedule (step s counts optimiser updates from 0; W warmup steps, S total steps, peak η, end η_end):

    η(s) = η · (s + 1) / W                                              s < W   (linear warmup, never 0)
    η(s) = η_end + (η − η_end) · ½ (1 + cos(π · min(1, (s − W) / max(1, S − W))))   s ≥ W   (cosine)

Optimiser: global-norm clipping (train.grad_clip, on the whole gradient, before the groups) then AdamW
(train.b1, b2, eps) in three groups selected by the model's `param_labels(params)`:

    "decay"     schedule(peak_lr)                       weight decay train.weight_decay
    "no_decay"  schedule(peak_lr)                       no weight decay (norm scales, embeddings' biases, ...)
    "ssm"       schedule(min(peak_lr, ssm_lr_cap))      no weight decay (S4D Δ, A, B, C and the N+β scales/biases)

Warmup-stable-decay (train.schedule = "wsd", as in MiniCPM, arXiv 2404.06395): after the warmup the LR stays at
η until step S − D (D = train.decay_steps, or round(train.decay_fraction · S) when that is -1), then decays to
η_end over the last D steps:

    η(s) = η                                                        W ≤ s < S − D
    η(s) = η_end + (η − η_end) · (1 − g((s − S + D) / D))           S − D ≤ s        g(x) = √x ("1-sqrt") or x

Default shape "1-sqrt" and D = 0.2·S: Hägele et al. (arXiv 2405.18392) find a 1-sqrt cooldown over ~20% of the
steps matches or beats cosine; the paper itself trains with cosine only, which stays our default. Because the
LR of the stable phase does not depend on S, a run in its stable phase can be extended (raise num_steps), and a
decay can branch from any stable-phase checkpoint (train.branch_from, docs/training.md).

The SSM group keeps the same schedule shape with its peak capped; its end value is min(end_lr, capped peak).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

GROUPS = ("decay", "no_decay", "ssm")


def lr_schedule(peak: float, end: float, warmup_steps: int, total_steps: int) -> Callable[[Any], jax.Array]:
    """Linear warmup to `peak` over `warmup_steps` (first update already at peak/W), then cosine to `end`."""
    if warmup_steps < 0 or total_steps <= 0:
        raise ValueError(f"lr_schedule: need warmup_steps >= 0 and total_steps > 0, got warmup_steps={warmup_steps}, "
                         f"total_steps={total_steps}")
    peak, end = float(peak), float(end)
    warm = max(1, int(warmup_steps))
    decay = max(1, int(total_steps) - int(warmup_steps))

    def schedule(step):
        s = jnp.asarray(step, jnp.float32)
        warm_lr = peak * (s + 1.0) / warm
        frac = jnp.clip((s - warmup_steps) / decay, 0.0, 1.0)
        cos_lr = end + (peak - end) * 0.5 * (1.0 + jnp.cos(math.pi * frac))
        return jnp.where(s < warmup_steps, warm_lr, cos_lr)

    return schedule


SCHEDULES = ("cosine", "wsd")
WSD_SHAPES = ("1-sqrt", "linear")


def wsd_schedule(peak: float, end: float, warmup_steps: int, total_steps: int, decay_steps: int,
                 shape: str = "1-sqrt") -> Callable[[Any], jax.Array]:
    """Linear warmup, constant `peak`, then a decay to `end` over the last `decay_steps` (module docstring)."""
    if warmup_steps < 0 or total_steps <= 0 or not 0 < decay_steps <= total_steps:
        raise ValueError(f"wsd_schedule: need warmup_steps >= 0, total_steps > 0 and 0 < decay_steps <= total_steps, "
                         f"got {warmup_steps}, {total_steps}, {decay_steps}")
    if shape not in WSD_SHAPES:
        raise ValueError(f"train.wsd_shape={shape!r}; expected one of {WSD_SHAPES}")
    peak, end = float(peak), float(end)
    warm = max(1, int(warmup_steps))
    start = int(total_steps) - int(decay_steps)

    def schedule(step):
        s = jnp.asarray(step, jnp.float32)
        warm_lr = peak * (s + 1.0) / warm
        frac = jnp.clip((s - start) / float(decay_steps), 0.0, 1.0)
        g = jnp.sqrt(frac) if shape == "1-sqrt" else frac
        lr = jnp.where(s < start, peak, end + (peak - end) * (1.0 - g))
        return jnp.where(s < warmup_steps, warm_lr, lr)

    return schedule


def decay_steps_of(train_cfg, num_steps: int) -> int:
    """D of the WSD schedule: train.decay_steps, or round(decay_fraction · num_steps) when that is -1 (>= 1)."""
    t = train_cfg
    d = int(t.get("decay_steps", -1))
    if d < 0:
        d = round(float(t.get("decay_fraction", 0.2)) * num_steps)
    return max(1, min(int(d), int(num_steps)))


def schedule_fn(train_cfg, peak: float, end: float, *, num_steps: int, warmup_steps: int):
    kind = str(train_cfg.get("schedule", "cosine"))
    if kind == "cosine":
        return lr_schedule(peak, end, warmup_steps, num_steps)
    if kind == "wsd":
        return wsd_schedule(peak, end, warmup_steps, num_steps, decay_steps_of(train_cfg, num_steps),
                            str(train_cfg.get("wsd_shape", "1-sqrt")))
    raise ValueError(f"train.schedule={kind!r}; expected one of {SCHEDULES}")


def make_optimizer(train_cfg, labels: Any, *, num_steps: int, warmup_steps: int):
    """Returns (optax transformation, {group: schedule}) for the given pytree of group labels.

    `labels` is a pytree with the structure of the parameters whose leaves are "decay" | "no_decay" | "ssm"
    (the model's `param_labels(params)`), or a callable params -> such a pytree.
    """
    t = train_cfg
    peak = float(t.peak_lr)
    ssm_peak = min(peak, float(t.ssm_lr_cap))
    kw = dict(num_steps=num_steps, warmup_steps=warmup_steps)
    schedules = {
        "decay": schedule_fn(t, peak, t.end_lr, **kw),
        "no_decay": schedule_fn(t, peak, t.end_lr, **kw),
        "ssm": schedule_fn(t, ssm_peak, min(float(t.end_lr), ssm_peak), **kw),
    }

    def adamw(group, wd):
        return optax.adamw(schedules[group], b1=float(t.b1), b2=float(t.b2), eps=float(t.eps), weight_decay=wd)

    if not callable(labels):
        seen = set(jax.tree.leaves(labels))
        unknown = seen - set(GROUPS)
        if unknown:
            raise ValueError(f"param_labels returned unknown optimiser groups {sorted(unknown)}; expected a subset "
                             f"of {GROUPS}")
    tx = optax.chain(
        optax.clip_by_global_norm(float(t.grad_clip)) if float(t.grad_clip) > 0 else optax.identity(),
        optax.multi_transform({"decay": adamw("decay", float(t.weight_decay)),
                               "no_decay": adamw("no_decay", 0.0),
                               "ssm": adamw("ssm", 0.0)}, labels),
    )
    return tx, schedules
