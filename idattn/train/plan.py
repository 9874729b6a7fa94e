"""The run plan: a config resolved and checked once into a frozen, typed record that the training loop reads.

`RunPlan.from_config(config)` checks every value (idattn.train.validate: one line per refusal naming the key),
derives the step counts from the token budgets, and returns the plan. A run builds it once, first
(idattn.train.preflight), and passes it down; the refusals, the compiled step (train/placement.py), the loop, its
checkpointer and its fault boundaries read the plan, never `config.train` (one key, one reading, one type:
levanter's `TrainLmConfig` is the model). The model, data and
optimiser sections still travel as their config sections to the modules that own them (models.build_model,
data.pipeline, train.optim), which check their own keys.

Derived values:
  tokens_per_step = batch_size · seq_len
  num_steps       = train.num_steps if > 0, else ceil(train.total_tokens / tokens_per_step)
  warmup_steps    = train.warmup_steps if >= 0, else round(train.warmup_tokens / tokens_per_step), capped at
                    num_steps
"""
from __future__ import annotations

import dataclasses
import math

from idattn.train import validate


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What a training run does, as resolved from its config (docs/training.md names every key)."""

    # schedule (derived: see the module docstring)
    num_steps: int
    warmup_steps: int
    tokens_per_step: int
    batch_size: int  # global sequences per step
    grad_accum: int
    seq_len: int
    peak_lr: float
    end_lr: float
    ssm_lr_cap: float
    # the loop
    seed: int
    log_every: int
    eval_every: int  # 0: only at the end
    eval_batches: int
    max_bad_steps: int
    loss_chunk: int  # 0: the loss from full logits
    peak_tflops_per_device: float  # 0: look the device kind up (train/metrics.py)
    # checkpoints
    checkpoint_every: int
    checkpoint_minutes: float  # 0: off
    stall_minutes: float  # 0: off (train/watchdog.py)
    checkpoint_steps: tuple[int, ...]
    keep_last: int
    keep_every: int  # 0: none beyond keep_last
    keep_best: bool
    async_checkpoint: bool
    checkpoint_fallback: bool
    # the workdir and where a run starts from
    lease_heartbeat_s: float
    lease_stale_s: float
    restart_from_scratch: bool
    allow_schedule_change: bool
    init_from: str
    branch_from: str

    @classmethod
    def from_config(cls, config) -> "RunPlan":
        """Checks every value, derives the steps; raises validate.ConfigError / ValueError in one line."""
        validate.check_values(config)
        t, d = config.train, config.data
        seq_len = int(d.seq_len)
        batch = int(t.batch_size)
        if seq_len <= 0 or batch <= 0:
            raise ValueError(f"config.data.seq_len={seq_len} and config.train.batch_size={batch} must be > 0")
        tokens_per_step = batch * seq_len
        num_steps = int(t.num_steps) if int(t.num_steps) > 0 else math.ceil(int(t.total_tokens) / tokens_per_step)
        if num_steps <= 0:
            raise ValueError(f"config.train.num_steps={t.num_steps}, total_tokens={t.total_tokens}: no steps to run; "
                             f"set train.num_steps > 0 or train.total_tokens > 0")
        warmup = int(t.warmup_steps) if int(t.warmup_steps) >= 0 else round(int(t.warmup_tokens) / tokens_per_step)
        warmup = min(warmup, num_steps)
        validate.check_warmup(config, num_steps, warmup)
        get = t.get  # keys added after a run was saved are absent from its config.json: their defaults
        return cls(
            num_steps=num_steps, warmup_steps=warmup, tokens_per_step=tokens_per_step, batch_size=batch,
            grad_accum=int(t.grad_accum), seq_len=seq_len, peak_lr=float(t.peak_lr), end_lr=float(t.end_lr),
            ssm_lr_cap=float(t.ssm_lr_cap), seed=int(config.seed), log_every=max(1, int(t.log_every)),
            eval_every=int(t.eval_every), eval_batches=int(t.eval_batches), max_bad_steps=int(t.max_bad_steps),
            loss_chunk=int(get("loss_chunk", 0) or 0),
            peak_tflops_per_device=float(get("peak_tflops_per_device", 0.0) or 0.0),
            checkpoint_every=max(1, int(t.checkpoint_every)),
            checkpoint_minutes=float(get("checkpoint_minutes", 0.0) or 0.0),
            stall_minutes=float(get("stall_minutes", 60.0) or 0.0),
            checkpoint_steps=tuple(sorted(int(x) for x in (get("checkpoint_steps", ()) or ()))),
            keep_last=max(1, int(t.keep_last)), keep_every=max(0, int(t.keep_every)), keep_best=bool(t.keep_best),
            async_checkpoint=bool(t.async_checkpoint), checkpoint_fallback=bool(t.checkpoint_fallback),
            lease_heartbeat_s=float(get("lease_heartbeat_s", 30.0)), lease_stale_s=float(get("lease_stale_s", 600.0)),
            restart_from_scratch=bool(get("restart_from_scratch", False)),
            allow_schedule_change=bool(get("allow_schedule_change", False)),
            init_from=str(get("init_from", "") or ""), branch_from=str(get("branch_from", "") or ""))
