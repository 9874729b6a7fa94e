"""A sweep's runs: one complete trainer config per run, with its `sweep` section, and the loader of sweep files.

A sweep file (`experiments/sweeps/<name>.py`, packaged as `idattn/configs/sweeps/<name>.py`) defines
`get_sweep()` -> list of configs built with `make_run`, and `get_config(name)` = `config_by_name(get_sweep(),
name)`, so `python -m idattn.train --config=<file>:<name>` trains one run. `idattn.sweep` runs them all.
"""
from __future__ import annotations

import importlib.util
import os

import ml_collections

from idattn.configs import resolve_config_arg
from idattn.configs.sizes import non_embedding_params, size_name
from idattn.models.spec import apply_mixer_name


def make_run(base: ml_collections.ConfigDict, *, study: str, mixer: str, shape: dict[str, int], tokens: int,
             compute: float = 0.0, size: str = "") -> ml_collections.ConfigDict:
    """A copy of `base` with the model `shape`, `mixer` and `tokens` training tokens, plus its `sweep` section.

    Run name: `<study>-<mixer>-<size>-<budget>` with size `d<width>L<layers>` (or the paper name) and budget
    `C<compute:.2g>` for IsoFLOP members, else `D<tokens:.2g>` (no '+'); e.g. `cpu-iso-softmax-d64L2-C1.2e11`.
    """
    c = ml_collections.ConfigDict(base.to_dict())
    c.model.update(shape)
    apply_mixer_name(c.model, mixer)
    c.train.total_tokens = int(tokens)
    c.train.num_steps = -1
    tps = int(c.train.batch_size) * int(c.data.seq_len)
    steps = max(1, -(-int(tokens) // tps))
    size = size or size_name(shape)
    budget = f"C{compute:.2g}" if compute else f"D{tokens:.2g}"
    name = f"{study}-{mixer}-{size}-{budget}".replace("+", "")
    n = non_embedding_params(c.model)
    c.sweep = ml_collections.ConfigDict(dict(name=name, study=study, mixer=mixer, size=size,
                                             tokens=int(steps * tps), compute=float(compute), n_params=int(n)))
    return c


def isoflop_tokens(compute: float, n_params: int, tokens_per_step: int, min_steps: int = 1) -> int:
    """D = C / (6 N), rounded to whole optimiser steps (at least `min_steps`)."""
    steps = max(min_steps, int(round(compute / (6.0 * n_params) / tokens_per_step)))
    return steps * tokens_per_step


def load_sweep_module(path: str):
    path = resolve_config_arg(path)  # experiments/sweeps/<x>.py: the packaged sweep from any folder
    if not os.path.exists(path):
        raise FileNotFoundError(f"sweep file {path!r} not found; expected experiments/sweeps/<name>.py with "
                                f"get_sweep()")
    spec = importlib.util.spec_from_file_location(f"_sweep_{abs(hash(os.path.abspath(path)))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "get_sweep"):
        raise AttributeError(f"{path}: no get_sweep(); a sweep file defines get_sweep() -> list of configs")
    return mod


def load_sweep(path: str) -> list[ml_collections.ConfigDict]:
    configs = list(load_sweep_module(path).get_sweep())
    names = [c.sweep.name for c in configs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{path}: run names must be unique; repeated: {dup}")
    return configs


def config_by_name(configs: list[ml_collections.ConfigDict], name: str) -> ml_collections.ConfigDict:
    """For a sweep file's get_config(name)."""
    for c in configs:
        if c.sweep.name == name:
            return c
    raise ValueError(f"no run named {name!r} in this sweep; names: {[c.sweep.name for c in configs][:6]} ...")

