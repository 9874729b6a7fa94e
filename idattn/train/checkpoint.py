"""Checkpoints of a training run (orbax), the saved config, and `load_params` for evaluation / export.

Layout of a run directory:

    <workdir>/config.json                  the locked config of the run (written once, on the first start)
    <workdir>/checkpoints/<step>/          one orbax checkpoint per saved step, items:
        params/      parameters (float32, sharded save/restore)
        opt_state/   optimiser state
        meta/        {"step": int, "time": float, "loss": float}  (JSON)
        data/        process_<i>-of-<n>.json: the data iterator state of each host
    <workdir>/metrics.jsonl, <workdir>/tb/, <workdir>/eval/

Checkpoints are saved asynchronously (train.async_checkpoint); the manager keeps the last train.keep_last plus
every train.keep_every-th step. A step directory appears only once committed (orbax writes into a temporary
name and renames), so a killed run always resumes from a complete checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

CONFIG_FILE = "config.json"
CKPT_DIR = "checkpoints"


# ------------------------------------------------------------------------------------------------ data state
class DataStateHandler(ocp.CheckpointHandler):
    """Writes each host's data-iterator state (JSON-able value captured at save time) to its own file."""

    def save(self, directory: epath.Path, args: "DataStateSave"):
        i, n = jax.process_index(), jax.process_count()
        (directory / f"process_{i}-of-{n}.json").write_text(json.dumps(_to_jsonable(args.state)))

    def restore(self, directory: epath.Path, args: "DataStateRestore | None" = None):
        i, n = jax.process_index(), jax.process_count()
        path = directory / f"process_{i}-of-{n}.json"
        if not path.exists():
            have = sorted(p.name for p in directory.iterdir())
            raise FileNotFoundError(f"{path} is missing (found {have}): the checkpoint was written by a different "
                                    f"number of processes than the {n} running now; resume with the same host count")
        return _from_jsonable(json.loads(path.read_text()))

    def metadata(self, directory):
        return None

    def finalize(self, directory):
        pass

    def close(self):
        pass

    @classmethod
    def typestr(cls):
        return f"{cls.__module__}.{cls.__qualname__}"


@ocp.args.register_with_handler(DataStateHandler, for_save=True)
@dataclasses.dataclass
class DataStateSave(ocp.args.CheckpointArgs):
    state: Any


@ocp.args.register_with_handler(DataStateHandler, for_restore=True)
@dataclasses.dataclass
class DataStateRestore(ocp.args.CheckpointArgs):
    pass


def _to_jsonable(x):
    """Iterator states may hold bytes or numpy scalars/arrays; tag them so they come back identical."""
    if isinstance(x, bytes):
        return {"__bytes__": x.decode("latin1")}
    if isinstance(x, np.ndarray):
        return {"__ndarray__": x.tolist(), "dtype": str(x.dtype)}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, dict):
        return {str(k): _to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_jsonable(v) for v in x]
    return x


def _from_jsonable(x):
    if isinstance(x, dict):
        if set(x) == {"__bytes__"}:
            return x["__bytes__"].encode("latin1")
        if set(x) == {"__ndarray__", "dtype"}:
            return np.asarray(x["__ndarray__"], dtype=x["dtype"])
        return {k: _from_jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_from_jsonable(v) for v in x]
    return x


# ---------------------------------------------------------------------------------------------------- manager
def make_manager(workdir: str, train_cfg, *, read_only: bool = False) -> ocp.CheckpointManager:
    t = train_cfg
    keep_every = int(t.keep_every) if int(t.keep_every) > 0 else None
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max(1, int(t.keep_last)),
        keep_period=keep_every,
        enable_async_checkpointing=bool(t.async_checkpoint) and not read_only,
        create=not read_only,
        read_only=read_only,
        cleanup_tmp_directories=not read_only,
    )
    return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, CKPT_DIR)), options=options,
                                 item_handlers={"params": ocp.StandardCheckpointHandler(),
                                                "opt_state": ocp.StandardCheckpointHandler(),
                                                "meta": ocp.JsonCheckpointHandler(),
                                                "data": DataStateHandler()})


def save(mngr: ocp.CheckpointManager, step: int, state, data_state, meta: dict, *, force: bool = False) -> bool:
    args = ocp.args.Composite(params=ocp.args.StandardSave(state.params),
                              opt_state=ocp.args.StandardSave(state.opt_state),
                              meta=ocp.args.JsonSave(dict(meta, step=int(step))),
                              data=DataStateSave(data_state))
    return mngr.save(int(step), args=args, force=force)


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state):
    """Restores (params, opt_state, meta, data_state) at `step` onto the shardings of `abstract_state`."""
    out = mngr.restore(int(step), args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_state.params),
        opt_state=ocp.args.StandardRestore(abstract_state.opt_state),
        meta=ocp.args.JsonRestore(),
        data=DataStateRestore()))
    return out["params"], out["opt_state"], out["meta"], out["data"]


def committed_steps(workdir: str) -> list[int]:
    """Steps with a complete (renamed, committed) checkpoint directory; cheap, no orbax needed."""
    d = os.path.join(workdir, CKPT_DIR)
    if not os.path.isdir(d):
        return []
    return sorted(int(n) for n in os.listdir(d) if n.isdigit() and os.path.isdir(os.path.join(d, n)))


# ----------------------------------------------------------------------------------------------------- config
def config_to_dict(config) -> dict:
    """JSON-normalised plain dict (tuples -> lists), so a saved and a live config compare equal."""
    d = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
    return json.loads(json.dumps(d, default=_json_default))


def _json_default(o):
    if isinstance(o, (np.generic,)):
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"config value {o!r} of type {type(o).__name__} is not JSON-serialisable")


def save_config(workdir: str, config, name: str = CONFIG_FILE) -> str:
    path = os.path.join(workdir, name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(config_to_dict(config), f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def load_config(workdir: str) -> ml_collections.ConfigDict:
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: {workdir!r} is not a training run directory (no config.json)")
    with open(path) as f:
        d = json.load(f)
    if "logical_axis_rules" in d:
        d["logical_axis_rules"] = tuple((n, tuple(a) if isinstance(a, list) else a) for n, a in d["logical_axis_rules"])
    return ml_collections.ConfigDict(d)


def diff_dicts(old: dict, new: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """[(dotted key, old value, new value)] for every key that differs (missing keys show as <missing>)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<missing>"), new.get(k, "<missing>")
        key = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff_dicts(a, b, key + ".")
        elif a != b:
            out.append((key, a, b))
    return out


# ------------------------------------------------------------------------------------------------ load_params
def load_params(workdir: str, step: int | None = None, *, shardings: Any = None):
    """(config, params) of a run directory at `step` (default: the latest committed checkpoint).

    Parameters come back as float32 arrays on the default device (or onto `shardings`, a pytree of
    jax.sharding.Sharding matching the parameters) whatever mesh the run was trained on.
    """
    from flax import linen as nn
    import jax.numpy as jnp

    from idattn import models

    config = load_config(workdir)
    steps = committed_steps(workdir)
    if not steps:
        raise FileNotFoundError(f"no committed checkpoint under {os.path.join(workdir, CKPT_DIR)}; train first "
                                f"(python -m idattn.train --workdir={workdir} ...)")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ValueError(f"load_params: step={step} has no checkpoint in {workdir}; available steps: {steps}")
    model = models.build_model(config.model)
    tokens = jnp.zeros((1, 8), jnp.int32)
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens)["params"])
    abstract = nn.unbox(boxed)
    if shardings is None:
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: dev, abstract)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    path = epath.Path(os.path.abspath(os.path.join(workdir, CKPT_DIR, str(step), "params")))
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore(path, abstract)
    return config, params
