"""Evaluate a checkpoint: `python -m idattn.eval --workdir=DIR --suite=validation,extrapolation,harness,...`.

Suites (each writes one JSON file under `<workdir>/eval/` through `idattn.rundir.schema.write_result`):
  validation     token perplexity of the run's held-out split, packed exactly as the trainer validates
                 (`make_eval_batches`) and by default on the *same tokens* as the trainer's validation
                 (train.eval_batches x microbatch x data.seq_len), so the number equals the trainer's for the same
                 checkpoint; `--val_tokens` changes the count. `--val_path=[name=]path` scores another corpus: a
                 prepared folder (its held-out split, packed the same way) or documents (.jsonl/.jsonl.gz/.txt/
                 .parquet/.json text, or token ids: integer .npy/.npz arrays or .ids.jsonl lists, never unpickled)
                 with rolling windows at the model's context
  extrapolation  perplexity at `--lengths` per corpus of `--corpora` and per position bucket, plus a PNG plot;
                 `--extrapolation_mode=rolling` scores documents of any length whole in windows of L (every table
                 and plot says how many documents and tokens it scored)
  harness        the eight-task suite + WikiText-2 + OpenBookQA from `--data_dir/<task>` (or `--hub`)
  recall         RULER S-NIAH-1 at `--niah_lengths`, phonebook at `--phonebook_sizes`
  decode         ms/token and tokens/s against context and batch, prefill memory (chunked and full)

Corpora (`--corpora=a,b=path,...`): a bare name is one of the six long-document corpora the paper uses
(pg19, codeparrot, govreport, qasper, qmsum, narrativeqa) read from `--data_dir/<name>` (or `--hub`);
`name=path` is *any* corpus under the name you choose, shown in every file, table and plot: a prepared folder
(`python -m idattn.data.prepare --out=path`; its held-out split is scored) or a file / folder / glob of
.txt / .jsonl / .jsonl.gz / .parquet documents (`--text_field`, `--separator` as in prepare). An unknown bare
name is refused before anything is loaded or written.

Held-out means held-out: every scored document of `--corpora` and `--val_path` is hashed as prepare hashes it
(sha1 of its text, first 8 bytes) and looked up among the run's training documents (config.data: the
embedded KJV split is recomputed; a prepared folder's `train_hashes.npy`). If any is a training document the
command is refused in one line naming how many of how many, before anything is written; `--allow_train_overlap`
scores them anyway and marks the protocol (`train_overlap`: k/N). A folder prepared before the hashes were
recorded (or data.source=tfds) cannot be checked: a warning says so and the result's details record it.

Files never replace the trainer's: the validation and extrapolation files carry their protocol in the name
(`validation-<corpus>-t<tokens scored>-c<context>-b<batch>-step<step>.json`, `extrapolation-<corpora>-c<lengths>-...`;
see idattn.rundir.schema). Progress goes to stderr with an ETA; at the end a table of every number measured is
printed (the same values as the JSON files, rounded to 4 decimals) followed by the files written.

The checkpoint comes from `idattn.rundir.load_params(workdir, step)`; `--config=<file.py>:<arg>
--random_init` evaluates a freshly initialised model instead (decode benchmarks, smoke tests; step -1).
"""
from __future__ import annotations

import argparse
import sys

from idattn.configs import ConfigError
from idattn.eval.evaluate import SUITES, EvalError, evaluate


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m idattn.eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--suite", default="validation", help=f"comma-separated subset of {SUITES}")
    ap.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    ap.add_argument("--config", default="", help="experiments/<file>.py:<arg> (with --random_init)")
    ap.add_argument("--random_init", action="store_true", help="evaluate a random-init model built from --config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key, e.g. --set=model.impl=chunked (repeatable)")
    ap.add_argument("--batch_size", type=int, default=8, help="rows per forward pass (speed only: same numbers)")
    ap.add_argument("--max_length", type=int, default=0, help="scoring context (default: config.data.seq_len)")
    ap.add_argument("--sequence", type=int, default=1, help="split the length of every scored sequence over this "
                                                            "many local devices (long-context scoring; docs/pods.md)")
    ap.add_argument("--data_dir", default="", help="folder of <task>/ and <corpus>/ dataset files")
    ap.add_argument("--hub", action="store_true", help="download missing datasets with `datasets`")
    ap.add_argument("--limit", type=int, default=0, help="documents per task/corpus (0: all)")
    ap.add_argument("--tasks", default="", help="harness tasks (default: the eight + wikitext + openbookqa)")
    ap.add_argument("--add_bos", action="store_true", help="harness: prepend BOS to every context")
    ap.add_argument("--val_path", default="", help="validation: [name=]path of another corpus (prepared folder "
                                                   "or documents) instead of the run's held-out split")
    ap.add_argument("--val_tokens", type=int, default=0,
                    help="validation: packed tokens scored (default: the trainer's, eval_batches x micro x seq_len)")
    ap.add_argument("--val_batches", type=int, default=0, help="validation: packed batches of --batch_size rows "
                                                               "(alternative to --val_tokens)")
    ap.add_argument("--lengths", default="", help="extrapolation lengths (default: 1x, 2x, 3.5x the train length)")
    ap.add_argument("--extrapolation_mode", default="docs", choices=("docs", "rolling"),
                    help="docs: the first L tokens of each document of >= L tokens (the paper's); rolling: every "
                         "document whole in disjoint windows of L, each read afresh, nothing carried across "
                         "documents (lm-eval's loglikelihood_rolling), for corpora of short documents")
    ap.add_argument("--corpora", default="pg19,codeparrot,govreport,qasper,qmsum,narrativeqa",
                    help="extrapolation corpora: known names and/or name=path (prepared folder or documents)")
    ap.add_argument("--text_field", default="text", help="field holding the text in .jsonl/.parquet corpora")
    ap.add_argument("--separator", default=None, help="plain-text corpora: document separator (default: per file)")
    ap.add_argument("--niah_lengths", default="1024,2048,4096,8192")
    ap.add_argument("--phonebook_sizes", default="16,32,64,128")
    ap.add_argument("--recall_n", type=int, default=200)
    ap.add_argument("--decode_contexts", default="512,2048,8192")
    ap.add_argument("--decode_batches", default="1,8")
    ap.add_argument("--decode_steps", type=int, default=32)
    ap.add_argument("--prefill_chunk", type=int, default=2048)
    ap.add_argument("--allow_train_overlap", action="store_true",
                    help="score documents that are training documents of the run (refused by default); the result's "
                         "protocol is marked with the count")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    a = ap.parse_args(argv)
    bad = [s for s in a.suite.split(",") if s not in SUITES]
    if bad:
        ap.error(f"--suite: unknown {bad}; expected a comma-separated subset of {SUITES}")
    if a.random_init and not a.config:
        ap.error("--random_init needs --config=experiments/<file>.py:<arg>")
    return a


# ------------------------------------------------------------------------------------------------ corpora


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return evaluate(args)
    except (EvalError, ConfigError) as e:
        print(f"eval: refused: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
