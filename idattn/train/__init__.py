"""idattn.train: the sharded trainer (docs/training.md).

    python -m idattn.train --config=experiments/<file>.py[:arg] --workdir=DIR   # train / resume
    from idattn.train import run, load_params                                   # same, from Python

`run(config, workdir)` trains `config` in `workdir` (resuming if it holds a run; idattn.train.trainer.run).
See docs/training.md.
"""
from idattn.rundir.loading import load_params  # noqa: F401
from idattn.train.trainer import run  # noqa: F401
