"""Per-token log-probabilities of a text under a model (a quick probe of a checkpoint).

    python -m idattn.score --workdir=/tmp/run --text="In the beginning God created" [--out=score.json]
    python -m idattn.score --config=experiments/scaling.py:softmax,tiny --tokenizer=bytes --text=abc

    python -m idattn.score --workdir=/tmp/run --texts=texts.jsonl [--text_field=text] --out=scores.jsonl
    python -m idattn.score --workdir=/tmp/run --texts=texts.txt --out=scores.jsonl     (one text a line)

Writes JSON: {"text", "token_ids", "pieces", "logprobs" (log p(token_i | tokens_<i), natural log; the first
token has null: nothing predicts it), "total_logprob", "num_scored", "mean_nll"} to --out, or stdout, and prints
a one-line summary (tokens scored, mean NLL, perplexity) to stderr. With `--texts` (JSON Lines, the text in
`--text_field`; or plain text, .txt/.text/.md and .gz of them, one text a line, blank lines skipped): one such record a line in input order to `--out` (JSON Lines), the texts scored in batches of
`--batch_size` (right-padded; a causal model never reads the padding), and the summary over all of them.
"""
from __future__ import annotations

import json
import math
import sys

from absl import app, flags, logging

from idattn.configs.flags import define_model_flags, run_app, step_flag
from idattn.data import jsonl
from idattn.data.tokenizer import check_ids, encode, get_tokenizer
from idattn.eval.scoring import model_score_fn, score_ids, score_sequences
from idattn.rundir.loading import load_model

_CONFIG = None
FLAGS = flags.FLAGS


def define_flags() -> None:
    """The CLI's flags, defined when run as a CLI (idattn.configs.flags.define_model_flags says why)."""
    global _CONFIG
    _CONFIG = define_model_flags()
    flags.DEFINE_string("text", None, "text to score")
    flags.DEFINE_string("tokenizer", None, "override config.data.tokenizer (mistral | path | train:N | bytes)")
    flags.DEFINE_bool("add_bos", True, "prepend the tokenizer's BOS id when it has one")
    flags.DEFINE_integer("seed", 0, "random-init seed (--config)")
    flags.DEFINE_string("out", None, "JSON output path (default: stdout); JSON Lines with --texts")
    flags.DEFINE_string("texts", None, "file of texts to score (instead of --text): JSON Lines (the text in "
                        "--text_field), or plain text (.txt/.text/.md) with one text a line")
    flags.DEFINE_string("text_field", "text", "the field of --texts holding the text")
    flags.DEFINE_integer("batch_size", 8, "texts scored per forward (--texts)")


PLAIN_TEXT = (".txt", ".text", ".md")  # --texts / --prompts files read as one text a line


def read_jsonl_texts(path: str, field: str, flag: str) -> list[str]:
    """The texts of a --texts / --prompts file: a plain text file (PLAIN_TEXT suffixes, .gz of them too) holds one
    text a line (its newline removed; blank lines skipped); any other file is JSON Lines, the `field` of every line
    (idattn.data.jsonl; .gz read through gzip). A bad line, an empty text or an empty file is refused naming the
    flag, file, line and fix."""
    name = path.lower()[:-3] if path.lower().endswith(".gz") else path.lower()
    if name.endswith(PLAIN_TEXT):
        try:
            with jsonl.open_text(path) as f:
                out = [line.rstrip("\r\n") for line in f if line.strip()]
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise app.UsageError(f"--{flag}={path}: unreadable ({e}); expected UTF-8 text, one text a line") from None
        if not out:
            raise app.UsageError(f"--{flag}={path}: no line to read (blank lines are skipped)")
        return out
    out = []
    try:
        for n, text in jsonl.texts(path, field):
            if not text:
                raise app.UsageError(f"--{flag}={path}:{n}: {field!r} is empty or null; every line needs a text to "
                                     "score")
            out.append(text)
    except jsonl.JsonlError as e:
        raise app.UsageError(f"--{flag}={e}") from None
    if not out:
        raise app.UsageError(f"--{flag}={path}: no line to read")
    return out


def score_record(text: str, ids: list[int], lps: list, tok) -> dict:
    scored = [x for x in lps if x is not None]
    return {"text": text, "token_ids": ids, "pieces": [tok.id_to_piece(i) for i in ids], "logprobs": lps,
            "total_logprob": sum(scored), "num_scored": len(scored), "mean_nll": -sum(scored) / len(scored)}


def summary_line(recs: list[dict]) -> str:
    n = sum(r["num_scored"] for r in recs)
    nll = -sum(r["total_logprob"] for r in recs) / n
    return (f"score: {len(recs)} text(s), {n:,} tokens scored, mean NLL {nll:.4f} nats, perplexity "
            f"{math.exp(nll):.3f}")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax restore logs at INFO
    if (FLAGS.text is None) == (FLAGS.texts is None):
        raise app.UsageError("pass --text=<text> or --texts=<file.jsonl | file.txt> (one of them)")
    if FLAGS.texts is not None and not FLAGS.out:
        raise app.UsageError("--texts needs --out=<file.jsonl> (one record a line)")
    texts = [FLAGS.text] if FLAGS.text is not None else read_jsonl_texts(FLAGS.texts, FLAGS.text_field, "texts")
    config, model, params = load_model(_CONFIG.value, FLAGS.workdir, FLAGS.seed, step_flag(FLAGS.step))
    tok = get_tokenizer(FLAGS.tokenizer, config)
    all_ids = []
    for i, text in enumerate(texts):
        ids = encode(tok, text, FLAGS.add_bos)
        where = "--text" if FLAGS.text is not None else f"--texts line {i + 1}"
        if len(ids) < 2:
            raise app.UsageError(f"{where} gives {len(ids)} token(s); need at least 2 to score one")
        check_ids(ids, model.spec.vocab_size, "text")
        all_ids.append(ids)
    if FLAGS.text is not None:
        lps_all = [score_ids(model, params, all_ids[0])]
    else:
        lps_all = score_ids_batched(model, params, all_ids, FLAGS.batch_size)
    recs = [score_record(t, ids, lps, tok) for t, ids, lps in zip(texts, all_ids, lps_all)]
    if FLAGS.texts is not None:
        with open(FLAGS.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs)
    else:
        s = json.dumps(recs[0], indent=1)
        if FLAGS.out:
            with open(FLAGS.out, "w") as f:
                f.write(s)
        else:
            sys.stdout.write(s + "\n")
    print(summary_line(recs) + (f"; wrote {FLAGS.out}" if FLAGS.out else ""), file=sys.stderr)


def score_ids_batched(model, params, all_ids: list[list[int]], batch_size: int) -> list[list]:
    """score_ids for many sequences: right-padded batches (one compile per padded length, a power of two)."""
    fn = model_score_fn(model, params)
    rows = score_sequences(fn, [ids[:-1] for ids in all_ids], [ids[1:] for ids in all_ids],
                           batch_size=max(1, batch_size), max_length=max(len(i) for i in all_ids))
    return [[None] + [float(x) for x in lp] for lp, _ in rows]


if __name__ == "__main__":
    define_flags()
    run_app(main)
