"""idattn.train: the sharded trainer (docs/training.md).

    python -m idattn.train --config=experiments/<file>.py[:arg] --workdir=DIR   # train / resume
    from idattn.train import run, load_params                                   # same, from Python

See docs/training.md.
"""
from idattn.rundir.loading import load_params  # noqa: F401


def run(config, workdir, **kw):
    """Trains `config` in `workdir` (resumes if it holds a run); see idattn.train.trainer.run."""
    from idattn.train.trainer import run as _run
    return _run(config, workdir, **kw)
