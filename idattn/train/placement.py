"""Where a run's state lives and what is compiled for it: `build_setup(config, mesh)` -> `Setup`.

The pjit pattern: the model's boxed parameters are traced with `jax.eval_shape`, their logical axis names mapped
to mesh shardings with `config.logical_axis_rules`, and the state is created by a `jax.jit` with those
`out_shardings`; the train step is jitted with in/out shardings and the state donated. The trainer
(idattn.train.trainer), the benchmarks (idattn.bench) and the ahead-of-time compiles (idattn.aot) all compile
through `build_setup`, so they measure and check the same functions. `hbm_estimate` is the per-device memory the
trainer reports at start.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from idattn import models
from idattn.train import optim
from idattn.train import sharding as shd
from idattn.train.plan import RunPlan
from idattn.train.step import BATCH_KEYS, TrainState, make_eval_step, make_train_step


@dataclasses.dataclass
class Setup:
    """Everything compiled for one (config, mesh): abstract state, shardings and the jitted functions.

    init(key) -> TrainState;  train(state, batch) -> (state, metrics) (state donated);
    eval(params, batch) -> (Σ m·nll, Σ m). Call them inside `setup.context()` (mesh + logical axis rules).
    """
    mesh: Any
    rules: Any
    model: Any
    tx: Any
    schedules: dict
    abstract_state: Any
    state_sh: Any
    param_sh: Any
    batch_shardings: dict
    n_params: int
    init: Any
    train: Any
    eval: Any

    def context(self):
        return _Ctx(self.mesh, self.rules)


class _Ctx:
    def __init__(self, mesh, rules):
        self._m, self._r = jax.set_mesh(mesh), nn.logical_axis_rules(rules)

    def __enter__(self):
        self._m.__enter__()
        self._r.__enter__()

    def __exit__(self, *a):
        self._r.__exit__(*a)
        self._m.__exit__(*a)


def build_setup(config, mesh, model=None, *, plan: RunPlan | None = None, num_steps: int | None = None,
                warmup_steps: int | None = None) -> Setup:
    """Abstract state via `jax.eval_shape`, logical -> mesh shardings, and the jitted init / train / eval.
    `plan`: `config`'s (a run passes the one it read; tools that compile a config alone leave it out);
    `num_steps` / `warmup_steps` override the plan's schedule."""
    plan = plan if plan is not None else RunPlan.from_config(config)
    t = config.train  # the optimiser's section (train/optim.py reads its own keys)
    if num_steps is None or warmup_steps is None:
        num_steps, warmup_steps = plan.num_steps, plan.warmup_steps
    model = model if model is not None else models.build_model(config.model)
    rules = shd.normalize_rules(config.logical_axis_rules)
    init_tokens = jnp.zeros((1, min(int(config.data.seq_len), 16)), jnp.int32)
    boxed = jax.eval_shape(lambda k: model.init(k, init_tokens)["params"], jax.random.PRNGKey(0))
    param_sh = shd.logical_param_shardings(boxed, mesh, rules)
    abstract_params = nn.unbox(boxed)
    labels = models.param_labels(abstract_params)
    tx, schedules = optim.make_optimizer(t, labels, num_steps=num_steps, warmup_steps=warmup_steps)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    opt_sh = shd.opt_state_shardings(abstract_opt, param_sh, mesh)
    rep = shd.replicated(mesh)
    state_sh = TrainState(step=rep, params=param_sh, opt_state=opt_sh)
    abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                  TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
                                             opt_state=abstract_opt), state_sh)
    n_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(abstract_params))

    def init_state(key):
        params = nn.unbox(model.init(key, init_tokens)["params"])
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    batch_sh = shd.batch_sharding(mesh)
    batch_shardings = {k: batch_sh for k in BATCH_KEYS}

    def micro_constraint(mb):
        return {k: jax.lax.with_sharding_constraint(v, batch_sh) for k, v in mb.items()}

    loss_chunk = plan.loss_chunk
    train_step = make_train_step(model.apply, tx, grad_accum=plan.grad_accum, lr_fn=schedules["decay"],
                                 micro_constraint=micro_constraint, loss_chunk=loss_chunk)
    eval_step = make_eval_step(model.apply, loss_chunk)
    p_init = jax.jit(init_state, out_shardings=state_sh)
    p_train = jax.jit(train_step, in_shardings=(state_sh, batch_shardings), out_shardings=(state_sh, rep),
                      donate_argnums=(0,))
    p_eval = jax.jit(eval_step, in_shardings=(param_sh, batch_shardings), out_shardings=(rep, rep))
    return Setup(mesh=mesh, rules=rules, model=model, tx=tx, schedules=schedules, abstract_state=abstract_state,
                 state_sh=state_sh, param_sh=param_sh, batch_shardings=batch_shardings, n_params=n_params,
                 init=p_init, train=p_train, eval=p_eval)



# ------------------------------------------------------------------------------------------------- estimates
def hbm_estimate(n_params: int, config, mesh, plan: RunPlan | None = None) -> dict[str, float]:
    """Rough per-device bytes: fp32 params + grads + 2 Adam moments (sharded over fsdp x tensor), and activations
    of one microbatch (sharded over data x fsdp): with remat, the residual stream per layer (compute dtype) plus
    one layer's working set (~ 10 d + 3 ffn + 4 H d_h values per token) plus float32 logits and their gradient
    (of one train.loss_chunk of positions when the loss is chunked). `plan`: `config`'s, when the caller has it."""
    m = config.model
    plan = plan if plan is not None else RunPlan.from_config(config)
    n_dev = mesh.size
    param_shards = mesh.shape["fsdp"] * mesh.shape["tensor"]
    cbytes = 2 if str(m.dtype) in ("bfloat16", "float16") else 4
    params = 4 * n_params / param_shards
    opt = 8 * n_params / param_shards
    grads = 4 * n_params / param_shards
    micro_tokens = plan.batch_size // max(1, plan.grad_accum) * plan.seq_len
    tok_dev = micro_tokens / shd.batch_size_per_shard(mesh) / int(dict(mesh.shape).get("sequence", 1))
    d, ffn, h, dh = int(m.d_model), int(m.ffn_dim), int(m.num_heads), int(m.head_dim)
    remat = str(m.get("remat", "full"))
    per_layer_saved = d if remat == "full" else (10 * d + 3 * ffn + 4 * h * dh)
    act = tok_dev * cbytes * (int(m.num_layers) * per_layer_saved + 10 * d + 3 * ffn + 4 * h * dh)
    seq = int(config.data.seq_len)
    lc = plan.loss_chunk
    live = min(lc, seq) / seq if lc > 0 else 1.0  # chunked loss: one chunk of logits (+ gradient) at a time
    logits = tok_dev * live * int(m.vocab_size) * 4 * 2 / mesh.shape["tensor"]
    scores = attention_scores_bytes(config, tok_dev, mesh)
    del n_dev
    return {"params": params, "opt_state": opt, "grads": grads, "activations": act + logits, "scores": scores,
            "total": params + opt + grads + act + logits + scores}


def attention_scores_bytes(config, tokens_per_device: float, mesh) -> float:
    """The T x T attention scores of one softmax layer (live at a time under remat) when attention runs as XLA's
    dot_product_attention, which materialises them: float32 scores, probabilities and their gradient per head,
    3 x 4 x H x T bytes per token (sharded over tensor). cuDNN and the TPU flash kernel never hold them (0 then);
    `model.attn_impl=auto` runs XLA on a CPU, so a Softmax run at T = 4096 on a CPU needs ~200 KiB x H per token."""
    m = config.model
    spec = models.spec_from_config(m)
    if not any(s.family in models.spec.ATTENTION_FAMILIES for s in models.layer_specs(spec)):
        return 0.0
    impl = str(m.get("attn_impl", "auto"))
    platform = mesh.devices.flat[0].platform
    if impl != "xla" and not (impl == "auto" and platform == "cpu"):
        return 0.0
    seq = int(config.data.seq_len)
    return 3.0 * 4.0 * tokens_per_device * seq * int(m.num_heads) / mesh.shape["tensor"]


