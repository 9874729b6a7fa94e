"""idattn.train: the sharded trainer (docs/training.md).

    python -m idattn.train --config=experiments/<file>.py[:arg] --workdir=DIR   # train / resume
    from idattn.train import run, load_params                                   # same, from Python

`run(config, workdir)` trains `config` in `workdir` (resuming if it holds a run; idattn.train.trainer.run).
See docs/training.md.
"""
import importlib

# Resolved on first use (PEP 562), so that the trainer's pieces (idattn.train.step, .sharding, .placement) import
# without the checkpoint stack (orbax, tensorstore: compiled packages a bare GPU image lacks; idattn.bench on a
# device, scripts/gpu_check.py).
_EXPORTS = {"run": "idattn.train.trainer", "load_params": "idattn.rundir.loading"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'idattn.train' has no attribute {name!r}")
