"""`python -m idattn.export`: a run directory's (or a random-init config's) model to safetensors + config.json.

    python -m idattn.export --workdir=/tmp/run --out=/tmp/run_hf
    python -m idattn.export --config=experiments/scaling.py:softmax,tiny --out=/tmp/x   (random init)

The layouts (Hugging Face Llama for softmax, our own names for the recurrent mixers) are idattn.models.export's.
"""
from __future__ import annotations

from absl import app, flags, logging

from idattn.models.export import export
from idattn.configs.flags import step_flag
from idattn.rundir.loading import load_model

_CONFIG = None
FLAGS = flags.FLAGS


def define_flags() -> None:
    """The CLI's flags, defined when run as a CLI (idattn.configs.flags.define_model_flags says why)."""
    global _CONFIG
    from idattn.configs.flags import define_model_flags
    _CONFIG = define_model_flags()
    flags.DEFINE_string("out", None, "output folder")
    flags.DEFINE_integer("seed", 0, "random-init seed (--config)")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax restore logs at INFO
    if not FLAGS.out:
        raise app.UsageError("--out=<folder> is required")
    config, _, params = load_model(_CONFIG.value, FLAGS.workdir, FLAGS.seed, step_flag(FLAGS.step))
    files = export(params, config.model, FLAGS.out)
    print(f"wrote {', '.join(files)} to {FLAGS.out}")


if __name__ == "__main__":
    from idattn.configs.flags import run_app  # a --config.<key> typo: one readable line

    define_flags()
    run_app(main)
