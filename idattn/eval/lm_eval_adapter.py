"""Optional: run lm-evaluation-harness itself on an idattn checkpoint (extra `harness`: `pip install -e ".[harness]"`).

    python -m idattn.eval.lm_eval_adapter --workdir=DIR --tasks piqa,hellaswag --batch_size 8 \
        [--include_path my_tasks/] [--log_samples --output_path out/] [--limit 100] [any other lm-eval option]
    idattn-lm-eval --workdir=DIR --tasks piqa ...          # the same, as a console script

The adapter's own options are `--workdir` (required), `--step`, `--max_length`, `--add_bos`, `--max_gen_toks`;
everything else is lm-eval's own command line, passed through untouched (`--tasks`, `--include_path`,
`--log_samples`, `--output_path`, `--batch_size`, `--limit`, `--num_fewshot`, ...): the adapter registers the
model class under the name "idattn" and runs lm-eval's CLI with `--model idattn --model_args workdir=DIR,...`.
Batch size is lm-eval's `--batch_size` (never a model argument: lm-eval passes it to the model itself).
Plain `lm_eval --model idattn` cannot work: lm-eval's CLI never imports idattn, so the name is unknown there.
From Python: `from idattn.eval.lm_eval_adapter import register; register()` then `lm_eval.simple_evaluate(
model="idattn", model_args="workdir=DIR", ...)`.

`register()` registers the model class under the name "idattn". Its `loglikelihood` and
`loglikelihood_rolling` use the same scoring core as `idattn.eval.harness` (`scoring.encode_pair`,
`scoring.loglikelihood`, `scoring.loglikelihood_rolling`), so the two paths agree to float rounding;
`generate_until` decodes greedily with `idattn.models.decoding.generate` and cuts at the first stop string.
lm_eval (and torch, which it pulls in) is imported lazily: nothing else in idattn needs it. Its test
(`tests/test_eval_lm_eval.py`) runs the command on a local task YAML when lm-eval is installed and is skipped
otherwise.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import jax.numpy as jnp

from idattn.data.tokenizer import load_tokenizer
from idattn.eval import scoring
from idattn.eval.scoring import model_score_fn
from idattn.models import build_model
from idattn.models.decoding import generate
from idattn.rundir.loading import load_params

_REGISTERED: dict[str, Any] = {}


def _build(workdir: str, step: int | None, max_length: int | None):
    config, params = load_params(workdir, step)
    model = build_model(config.model)
    tok = load_tokenizer(config.data.tokenizer)
    return model, params, tok, model_score_fn(model, params), int(max_length or config.data.seq_len)


def register():
    """Registers and returns the lm_eval model class `idattn` (idempotent)."""
    if "cls" in _REGISTERED:
        return _REGISTERED["cls"]
    try:
        from lm_eval.api.model import LM
        from lm_eval.api.registry import register_model
    except ImportError as e:
        raise ImportError("idattn.eval.lm_eval_adapter needs lm-evaluation-harness: `pip install lm-eval` (the "
                          "`harness` extra of idattn). idattn's own `python -m idattn.eval --suite=harness` "
                          "needs nothing extra.") from e


    @register_model("idattn")
    class IdattnLM(LM):
        def __init__(self, workdir: str, step: int | None = None, batch_size: int | str = 8,
                     max_length: int | None = None, add_bos: bool = False, max_gen_toks: int = 64, **_):
            super().__init__()
            self.model, self.params, self.tok, self.score_fn, self._max_length = _build(
                workdir, None if step in (None, "", "None") else int(step), None if max_length is None else int(max_length))
            self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
            self.add_bos = str(add_bos).lower() in ("1", "true", "yes")
            self.max_gen_toks = int(max_gen_toks)

        @property
        def max_length(self) -> int:
            return self._max_length

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            pairs = [scoring.encode_pair(self.tok, *r.args[:2], add_bos=self.add_bos) for r in requests]
            return scoring.loglikelihood(self.score_fn, pairs, max_length=self.max_length, batch_size=self.batch_size)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            toks = [self.tok.encode(r.args[0]) for r in requests]
            return scoring.loglikelihood_rolling(self.score_fn, toks, prefix=scoring.prefix_token(self.tok),
                                                 max_length=self.max_length, batch_size=self.batch_size)

        def generate_until(self, requests, disable_tqdm: bool = False):


            out = []
            for r in requests:
                ctx, kw = r.args[0], (r.args[1] if len(r.args) > 1 else {}) or {}
                until = kw.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                n = int(kw.get("max_gen_toks", self.max_gen_toks))
                ids = ([self.tok.bos_id] if self.add_bos else []) + self.tok.encode(ctx)
                ids = ids[-(self.max_length - n):] if self.max_length > n else ids[-1:]
                gen = generate(self.model, self.params, jnp.asarray([ids], jnp.int32), n, eos_id=self.tok.eos_id)
                text = self.tok.decode([int(t) for t in gen[0, len(ids):] if int(t) != self.tok.eos_id])
                for stop in until:
                    if stop and stop in text:
                        text = text[:text.index(stop)]
                out.append(text)
            return out

    _REGISTERED["cls"] = IdattnLM
    return IdattnLM


ADAPTER_OPTIONS = ("--workdir", "--step", "--max_length", "--add_bos", "--max_gen_toks")


def lm_eval_argv(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """(our options, lm-eval's argv with `--model idattn --model_args ...` added); refuses options that would
    override the model."""
    ap = argparse.ArgumentParser(prog="python -m idattn.eval.lm_eval_adapter", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, add_help=True)
    ap.add_argument("--workdir", required=True, help="the run directory (checkpoints)")
    ap.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    ap.add_argument("--max_length", type=int, default=None, help="scoring context (default: data.seq_len)")
    ap.add_argument("--add_bos", action="store_true", help="prepend BOS to every context")
    ap.add_argument("--max_gen_toks", type=int, default=64)
    a, rest = ap.parse_known_args(argv)
    for bad in ("--model", "--model_args", "-a"):
        if any(x == bad or x.startswith(bad + "=") for x in rest):
            ap.error(f"{bad} is set by the adapter (model idattn, workdir={a.workdir}); leave it out and use "
                     "--step / --max_length / --add_bos for the model, --batch_size for lm-eval's batch size.")
    margs = f"workdir={a.workdir}"
    for key in ("step", "max_length"):
        if getattr(a, key) is not None:
            margs += f",{key}={getattr(a, key)}"
    margs += f",add_bos={a.add_bos},max_gen_toks={a.max_gen_toks}"
    return a, ["--model", "idattn", "--model_args", margs] + rest


def main(argv=None) -> int:
    a, fwd = lm_eval_argv(argv)
    register()
    from lm_eval.__main__ import cli_evaluate

    old = sys.argv
    sys.argv = ["lm-eval"] + fwd  # lm-eval's CLI reads sys.argv (every version: 0.4.5 ... 0.4.13)
    try:
        cli_evaluate()
    finally:
        sys.argv = old
    return 0


if __name__ == "__main__":
    sys.exit(main())
