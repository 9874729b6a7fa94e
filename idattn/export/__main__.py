"""`python -m idattn.export`: a run directory's (or a random-init config's) model to a Hugging Face
folder (idattn.export.hf says what it holds).

    python -m idattn.export --workdir=/tmp/run --out=/tmp/run_hf [--step=best] [--tokenizer=...] [--max_length=2048]
    python -m idattn.export --config=experiments/scaling.py:interdomain,tiny --out=/tmp/x   (random init, --seed)

The tokenizer is the run's `data.tokenizer` unless `--tokenizer` names another (`none`: weights and config only).
"""
from __future__ import annotations

from absl import app, flags, logging

from idattn.configs.flags import define_model_flags, run_app, step_flag
from idattn.data.tokenizer import load_tokenizer
from idattn.export.hf import export_hf
from idattn.rundir.loading import load_model

_CONFIG = None
FLAGS = flags.FLAGS


def define_flags() -> None:
    """The CLI's flags, defined when run as a CLI (idattn.configs.flags.define_model_flags says why)."""
    global _CONFIG
    _CONFIG = define_model_flags()
    flags.DEFINE_string("out", None, "output folder")
    flags.DEFINE_integer("seed", 0, "random-init seed (--config)")
    flags.DEFINE_string("tokenizer", None, "tokenizer to write beside the weights (default: config.data.tokenizer; "
                        "mistral | path.model | train:N | none)")
    flags.DEFINE_integer("max_length", None, "the context tools read as the model's (default: data.seq_len)")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax restore logs at INFO
    if not FLAGS.out:
        raise app.UsageError("--out=<folder> is required")
    config, _, params = load_model(_CONFIG.value, FLAGS.workdir, FLAGS.seed, step_flag(FLAGS.step))
    tok = None
    name = FLAGS.tokenizer or config.data.tokenizer
    if name and name != "none":
        tok = load_tokenizer(name)
    max_length = FLAGS.max_length or int(config.data.seq_len)
    files = export_hf(params, config.model, FLAGS.out, tok, max_length)
    print(f"wrote {', '.join(files)} to {FLAGS.out}")


if __name__ == "__main__":
    define_flags()
    run_app(main)
