"""Parameters and models from a run directory: the one loader every command and evaluation uses.

    config, params = load_params(workdir)                 # latest committed step (or step=N, step="best")
    config, model, params = load_model(config, workdir)   # + the built flax model; random init without workdir

Parameters are verified against the digests recorded at save time (idattn.rundir.integrity) and for finiteness.
"""
from __future__ import annotations

import json
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

from idattn import models
from idattn.rundir import integrity
from idattn.rundir.layout import BEST_DIR, CKPT_DIR, best_info, committed_steps, load_config


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, read or verified; the message says which and what survived."""


def load_params(workdir: str, step: int | None = None, *, shardings: Any = None):
    """(config, params) of a run directory at `step` (default: the latest committed checkpoint).

    Parameters come back as float32 arrays on the default device (or onto `shardings`, a pytree of
    jax.sharding.Sharding matching the parameters) whatever mesh the run was trained on. step="best": the
    best-of-run parameters by validation loss (<workdir>/best). The parameters are checked against the digests
    recorded at save time and for finiteness (CheckpointError otherwise).
    """
    config = load_config(workdir)
    if step == "best":
        info = best_info(workdir)
        if info is None:
            raise FileNotFoundError(f"no best-of-run parameters under {os.path.join(workdir, BEST_DIR)} (kept when "
                                    f"train.keep_best and a validation ran)")
        return config, _restore_params(config, os.path.join(info["path"], "params"), shardings,
                                       info.get("digests", {}).get("params"), info["path"])
    steps = committed_steps(workdir)
    if not steps:
        raise FileNotFoundError(f"no committed checkpoint under {os.path.join(workdir, CKPT_DIR)}; train first "
                                f"(python -m idattn.train --workdir={workdir} ...)")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ValueError(f"load_params: step={step} has no checkpoint in {workdir}; available steps: {steps}")
    where = os.path.join(workdir, CKPT_DIR, str(step))
    digests = None
    try:
        with open(os.path.join(where, "meta", "metadata")) as f:
            digests = json.load(f).get("digests", {}).get("params")
    except (OSError, ValueError):
        pass
    return config, _restore_params(config, os.path.join(where, "params"), shardings, digests, where)


def _restore_params(config, params_dir: str, shardings, digests, where: str):
    """Parameters from an orbax `params` folder, verified against `digests` (when recorded) and for finiteness."""
    model = models.build_model(config.model)
    tokens = jnp.zeros((1, 8), jnp.int32)
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens)["params"])
    abstract = nn.unbox(boxed)
    if shardings is None:
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: dev, abstract)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore(epath.Path(os.path.abspath(params_dir)), abstract)
    reason = integrity.verify(params, digests, "params")
    if reason:
        raise CheckpointError(f"{where}: {reason}; it is damaged: use another step (or the best/ copy)")
    return params



def load_model(config=None, workdir: str | None = None, seed: int = 0, step=None):
    """(config, model, params): from a workdir checkpoint (`step`: None = latest, an int, or "best"), else random
    init of `config` (seed)."""
    if workdir:
        config, params = load_params(workdir, step)
        return config, models.build_model(config.model), params
    if config is None:
        raise ValueError("give --workdir=<run dir> or --config=<experiment config> (random init)")
    model = models.build_model(config.model)
    params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 8), jnp.int32))["params"]
    return config, model, nn.meta.unbox(params)
