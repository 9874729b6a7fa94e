"""Per-token log-probabilities of a text under a model (a quick probe of a checkpoint).

    python -m idattn.score --workdir=/tmp/run --text="In the beginning God created" [--out=score.json]
    python -m idattn.score --config=experiments/scaling.py:softmax,tiny --tokenizer=bytes --text=abc

Writes JSON: {"text", "token_ids", "pieces", "logprobs" (log p(token_i | tokens_<i), natural log; the first
token has null: nothing predicts it), "total_logprob", "num_scored", "mean_nll"} to --out, or stdout.
"""
from __future__ import annotations

import json
import sys

from absl import app, flags, logging

from idattn.data.tokenizer import check_ids, encode, get_tokenizer
from idattn.eval.scoring import score_ids
from idattn.configs.flags import step_flag
from idattn.rundir.loading import load_model

_CONFIG = None
FLAGS = flags.FLAGS


def define_flags() -> None:
    """The CLI's flags, defined when run as a CLI (idattn.configs.flags.define_model_flags says why)."""
    global _CONFIG
    from idattn.configs.flags import define_model_flags
    _CONFIG = define_model_flags()
    flags.DEFINE_string("text", None, "text to score")
    flags.DEFINE_string("tokenizer", None, "override config.data.tokenizer (mistral | path | train:N | bytes)")
    flags.DEFINE_bool("add_bos", True, "prepend the tokenizer's BOS id when it has one")
    flags.DEFINE_integer("seed", 0, "random-init seed (--config)")
    flags.DEFINE_string("out", None, "JSON output path (default: stdout)")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax restore logs at INFO
    if FLAGS.text is None:
        raise app.UsageError("--text is required")
    config, model, params = load_model(_CONFIG.value, FLAGS.workdir, FLAGS.seed, step_flag(FLAGS.step))
    tok = get_tokenizer(FLAGS.tokenizer, config)
    ids = encode(tok, FLAGS.text, FLAGS.add_bos)
    if len(ids) < 2:
        raise app.UsageError(f"--text gives {len(ids)} token(s); need at least 2 to score one")
    check_ids(ids, model.spec.vocab_size, "text")
    lps = score_ids(model, params, ids)
    scored = [x for x in lps if x is not None]
    rec = {"text": FLAGS.text, "token_ids": ids, "pieces": [tok.id_to_piece(i) for i in ids], "logprobs": lps,
           "total_logprob": sum(scored), "num_scored": len(scored), "mean_nll": -sum(scored) / len(scored)}
    s = json.dumps(rec, indent=1)
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            f.write(s)
    else:
        sys.stdout.write(s + "\n")


if __name__ == "__main__":
    from idattn.configs.flags import run_app

    define_flags()
    run_app(main)
