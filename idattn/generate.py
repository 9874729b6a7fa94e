"""Text generation from a trained run or a random-init config.

    python -m idattn.generate --workdir=/tmp/run --prompt="In the beginning" --max_new_tokens=64 \
        [--temperature=0.8 --top_p=0.95 --seed=0] [--out=gen.json]
    python -m idattn.generate --config=experiments/scaling.py:interdomain,tiny --tokenizer=bytes --prompt=abc

    python -m idattn.generate --workdir=/tmp/run --prompts=prompts.jsonl [--text_field=text] --out=gen.jsonl

`--prompts` (JSON Lines, the prompt in `--text_field`; or plain text, .txt/.text/.md, one prompt a line): one record a line to `--out` in input order, {"prompt",
"prompt_ids", "generated_ids", "text" (the continuation), "full_text" (the prompt echoed, then the continuation)},
generated in batches of up to `--batch_size` prompts of equal token length (exact: a recurrent state never reads
padding because there is none). `--workdir` loads the latest checkpoint with `idattn.rundir.load_params`; `--config` builds the model
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

from idattn.configs.flags import define_model_flags, run_app, step_flag
from idattn.data.tokenizer import check_ids, encode, get_tokenizer
from idattn.models import decoding
from idattn.rundir.loading import load_model
from idattn.score import read_jsonl_texts


_CONFIG = None
FLAGS = flags.FLAGS


def define_flags() -> None:
    """The CLI's flags, defined when run as a CLI (idattn.configs.flags.define_model_flags says why)."""
    global _CONFIG
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
    flags.DEFINE_string("out", None, "write a JSON record here (JSON Lines with --prompts)")
    flags.DEFINE_string("prompts", None, "file of prompts (instead of --prompt): JSON Lines, or plain text "
                        "(.txt/.text/.md) with one prompt a line")
    flags.DEFINE_string("text_field", "text", "the field of --prompts holding the prompt")
    flags.DEFINE_integer("batch_size", 8, "prompts generated together (--prompts; equal token lengths)")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax restore logs at INFO

    if FLAGS.prompts is not None:
        return generate_file()
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


def _eos(tok):
    e = getattr(tok, "eos_id", None)
    e = e() if callable(e) else e
    return e if e is not None and e >= 0 else None


def generate_file() -> None:
    """--prompts: every prompt of the file, batched by equal token length, one JSON line each in input order."""

    if not FLAGS.out:
        raise app.UsageError("--prompts needs --out=<file.jsonl> (one record a line)")
    prompts = read_jsonl_texts(FLAGS.prompts, FLAGS.text_field, "prompts")
    config, model, params = load_model(_CONFIG.value, FLAGS.workdir, FLAGS.seed, step_flag(FLAGS.step))
    tok = get_tokenizer(FLAGS.tokenizer, config)
    ids = [encode(tok, p, FLAGS.add_bos) for p in prompts]
    for i, x in enumerate(ids):
        if not x:
            raise app.UsageError(f"--prompts line {i + 1}: an empty prompt")
        check_ids(x, model.spec.vocab_size)
    by_len: dict[int, list[int]] = {}
    for i, x in enumerate(ids):
        by_len.setdefault(len(x), []).append(i)
    new: dict[int, list[int]] = {}
    rng = jax.random.PRNGKey(FLAGS.seed)
    for n, members in sorted(by_len.items()):
        for k in range(0, len(members), max(1, FLAGS.batch_size)):
            group = members[k:k + max(1, FLAGS.batch_size)]
            rng, sub = jax.random.split(rng)
            out = decoding.generate(model, params, jnp.asarray([ids[i] for i in group], jnp.int32),
                                    FLAGS.max_new_tokens, rng=sub, temperature=FLAGS.temperature, top_p=FLAGS.top_p,
                                    eos_id=_eos(tok), prefill_chunk=FLAGS.prefill_chunk)
            for r, i in enumerate(group):
                new[i] = [int(t) for t in out[r, n:]]
    with open(FLAGS.out, "w") as f:
        for i, p in enumerate(prompts):
            text = tok.decode(new[i])
            # decoded together: a continuation that starts a word (SentencePiece's leading "▁") keeps its space,
            # which decoding it alone drops
            f.write(json.dumps({"prompt": p, "prompt_ids": ids[i], "generated_ids": new[i], "text": text,
                                "full_text": tok.decode(list(ids[i]) + new[i]), "temperature": FLAGS.temperature, "top_p": FLAGS.top_p,
                                "seed": FLAGS.seed}) + "\n")
    print(f"generate: {len(prompts)} prompt(s) in {sum(-(-len(m) // max(1, FLAGS.batch_size)) for m in by_len.values())}"
          f" batch(es) of equal prompt length; wrote {FLAGS.out}", file=sys.stderr)


if __name__ == "__main__":
    define_flags()
    run_app(main)
