"""Text generation from a trained run or a random-init config.

    python -m idattn.generate --workdir=/tmp/run --prompt="In the beginning" --max_new_tokens=64 \
        [--temperature=0.8 --top_p=0.95 --seed=0] [--out=gen.json]
    python -m idattn.generate --config=experiments/scaling.py:interdomain,tiny --tokenizer=bytes --prompt=abc

`--workdir` loads the latest checkpoint with `idattn.rundir.load_params`; `--config` builds the model
with random parameters (`--seed`). Greedy when `--temperature=0` (default), else temperature / nucleus
(top-p) sampling. The prompt is prefilled in chunks of `--prefill_chunk` tokens, then decoded one token at a
time (`idattn.models.decoding`). `--tokenizer` overrides config.data.tokenizer; `bytes` is UTF-8 bytes as ids
(needs vocab ≥ 256; for random-init smoke runs).
"""
from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
from absl import app, flags, logging


from idattn.data.tokenizer import check_ids, encode, get_tokenizer
from idattn.configs.flags import step_flag
from idattn.rundir.loading import load_model  # noqa: E402


_CONFIG = None
FLAGS = flags.FLAGS


def define_flags() -> None:
    """The CLI's flags, defined when run as a CLI (idattn.configs.flags.define_model_flags says why)."""
    global _CONFIG
    from idattn.configs.flags import define_model_flags
    _CONFIG = define_model_flags()
    flags.DEFINE_string("prompt", "", "prompt text")
    flags.DEFINE_string("prompt_ids", None, "comma-separated prompt token ids (instead of --prompt)")
    flags.DEFINE_string("tokenizer", None, "override config.data.tokenizer (mistral | path | train:N | bytes)")
    flags.DEFINE_integer("max_new_tokens", 64, "tokens to generate")
    flags.DEFINE_float("temperature", 0.0, "0 = greedy")
    flags.DEFINE_float("top_p", 1.0, "nucleus sampling mass")
    flags.DEFINE_integer("seed", 0, "sampling seed and random-init seed")
    flags.DEFINE_integer("prefill_chunk", 256, "prefill chunk length")
    flags.DEFINE_bool("add_bos", True, "prepend the tokenizer's BOS id when it has one")
    flags.DEFINE_string("out", None, "write a JSON record here")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax restore logs at INFO
    from idattn.models import decoding

    config, model, params = load_model(_CONFIG.value, FLAGS.workdir, FLAGS.seed, step_flag(FLAGS.step))
    tok = None if FLAGS.prompt_ids else get_tokenizer(FLAGS.tokenizer, config)
    if FLAGS.prompt_ids:
        ids = [int(x) for x in FLAGS.prompt_ids.split(",") if x.strip()]
    else:
        ids = encode(tok, FLAGS.prompt, FLAGS.add_bos)
    if not ids:
        raise app.UsageError("empty prompt: pass --prompt=<text> or --prompt_ids=1,2,3")
    check_ids(ids, model.spec.vocab_size)
    eos = None
    if tok is not None:
        e = getattr(tok, "eos_id", None)
        e = e() if callable(e) else e
        eos = e if e is not None and e >= 0 else None
    out = decoding.generate(model, params, jnp.asarray([ids], jnp.int32), FLAGS.max_new_tokens,
                            rng=jax.random.PRNGKey(FLAGS.seed), temperature=FLAGS.temperature, top_p=FLAGS.top_p,
                            eos_id=eos, prefill_chunk=FLAGS.prefill_chunk)
    new_ids = [int(i) for i in out[0, len(ids):]]
    text = tok.decode(new_ids) if tok is not None else None
    rec = {"prompt_ids": ids, "generated_ids": new_ids, "text": text, "temperature": FLAGS.temperature,
           "top_p": FLAGS.top_p, "seed": FLAGS.seed}
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump(rec, f, indent=1)
    sys.stdout.write((text if text is not None else " ".join(map(str, new_ids))) + "\n")


if __name__ == "__main__":
    from idattn.configs.flags import run_app  # a --config.<key> typo: one readable line

    define_flags()
    run_app(main)
