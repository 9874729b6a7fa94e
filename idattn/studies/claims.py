"""The claims the study judges and the questions it asks past the paper, each declared once with its line, side and
paper value (the doc, the ladder, the pilot and the hybrid / selective tables read them here); the mixers' labels;
the text every table shares.

A claim or question is a statistic per seed s (seed s gives every model the same init and data order):

    ratio questions:       x_s = ln(ppl_num,s / ppl_den,s)         (printed as the ratio e^x)
    accuracy questions:    x_s = acc_num,s − acc_den,s              (printed in points)

judged by the rule of idattn/studies/repro_verdicts.py against `line` on the paper's `side`.
"""
from __future__ import annotations

import dataclasses
import math

from idattn.configs.sizes import NOMINAL_PARAMS, PAPER_RECIPE
from idattn.eval import paper_numbers as P
from idattn.models.spec import mixer_delta
from idattn.studies.repro_runs import recorded_corpus
from idattn.studies.runcache import Ctx

PPL_125M = P.VAL_PPL["125m"]
# the compute of the paper's 125M point on the ladder's axis, 6·N·D: 125M parameters x 2.5B tokens
PAPER_125M_FLOPS = 6.0 * NOMINAL_PARAMS["125m"] * PAPER_RECIPE["125m"]["total_tokens"]


@dataclasses.dataclass(frozen=True)
class Claim:
    title: str  # as the doc names it
    num: str = ""  # the ratio claims (a), (b): numerator and denominator mixers of ppl
    den: str = ""
    line: float = 0.0
    side: str = "above"
    stat: str = ""  # the statistic's label
    paper: float | None = None  # the paper's value of the ratio (125M)


@dataclasses.dataclass(frozen=True)
class Question:
    text: str
    num: str
    den: str
    task: str = "ppl"  # "ppl": a log ratio of perplexities; else the accuracy key whose difference is judged
    line: float = 0.0
    side: str = "above"
    points: tuple[str, ...] = ()  # ppl questions: the LM points it is asked at (empty: every point that trains both)


CLAIMS = {
    "a": Claim("(a) Interdomain beats S4D-only", "s4d_only", "interdomain", 0.0, "above", "S4D-only / Interdomain ppl",
               PPL_125M["s4d_only"] / PPL_125M["interdomain"]),
    "b": Claim("(b) Interdomain matches (within 2%) or beats Softmax", "interdomain", "softmax", math.log(1.02),
               "below", "Interdomain / Softmax ppl", PPL_125M["interdomain"] / PPL_125M["softmax"]),
    "c": Claim("(c) Interdomain flat past the training length, Softmax degrades"),
    "d": Claim("(d) the query readout dominates, RoPE barely matters"),
    "e": Claim("(e) recall: Softmax ≥ Interdomain > S4D-only"),
}
RATIO_CLAIMS = ("a", "b")  # judged per ladder point, with a trend

_G, _S4G, _SWA = "hybrid-interdomain-softmax-1to3", "hybrid-s4d_only-softmax-1to3", "hybrid-interdomain-swa-1to3"
_SEL, _PH = "interdomain-selective", "interdomain-selective+phase"
_DELTA, _DELTA2 = "interdomain-delta", "interdomain-delta2"
_MQAR = "mqar"  # the MQAR accuracy at the recall table's training setting
QUESTIONS = {
    # hybrid stacks (idattn/studies/repro_hybrid.py)
    "h1": Question("attention helps Interdomain: ppl(Interdomain) / ppl(Interdomain + global 1:3) > 1",
                   "interdomain", _G),
    "h2": Question("the query readout still matters with attention: ppl(S4D-only + global 1:3) / ppl(Interdomain + "
                   "global 1:3) > 1", _S4G, _G),
    "h3": Question("a window is enough: ppl(Interdomain + SWA 1:3) / ppl(Interdomain + global 1:3) < 1.02", _SWA, _G,
                   line=math.log(1.02), side="below"),
    "h4": Question("attention repairs Interdomain's recall: MQAR accuracy(Interdomain + global 1:3) - "
                   "accuracy(Interdomain) > 0", _G, "interdomain", _MQAR),
    "h5": Question("the query readout still matters for recall with attention: MQAR accuracy(Interdomain + global "
                   "1:3) - accuracy(S4D-only + global 1:3) > 0", _G, _S4G, _MQAR),
    # the selective core (idattn/studies/repro_selective.py); ppl questions at each LM point
    "s1": Question("selectivity copies: acc(Interdomain-selective) − acc(Interdomain) > 0 on selective copying",
                   _SEL, "interdomain", "mad/selective_copying"),
    "s2": Question("the phase tracks parity: scaled acc(Interdomain-selective+phase) − scaled "
                   "acc(Interdomain-selective) > 0", _PH, _SEL, "state/parity"),
    "s3": Question("the phase tracks arithmetic: scaled acc(Interdomain-selective+phase) − scaled "
                   "acc(Interdomain-selective) > 0 on modular arithmetic", _PH, _SEL, "state/modular_arithmetic"),
    "s4": Question("selectivity recalls: MQAR acc(Interdomain-selective) − acc(Interdomain) > 0 at the training "
                   "setting", _SEL, "interdomain", _MQAR),
    "s5": Question("selectivity models language: ppl(Interdomain) / ppl(Interdomain-selective) > 1", "interdomain",
                   _SEL),
    "s6": Question("the query readout still matters under a selective core: ppl(S4D-only-selective) / "
                   "ppl(Interdomain-selective) > 1", "s4d_only-selective", _SEL),
    # registered 2026-12-05 before any of its runs, at climb128 only (the climb96 numbers that chose it are no part
    # of its answer)
    "s7": Question("the phase models language: ppl(Interdomain-selective) / ppl(Interdomain-selective+phase) > 1",
                   _SEL, _PH, points=("climb128",)),
    # the delta update (idattn/studies/repro_selective.py DELTA), registered 2026-12-06 before any of its runs
    "d1a": Question("the erase recalls: MQAR acc(Interdomain-delta, s = 1) − acc(Interdomain) > 0 at 64 x 8",
                    _DELTA, "interdomain", "mqar@64x8/acc"),
    "d1b": Question("the erase recalls: MQAR acc(Interdomain-delta, s = 1) − acc(Interdomain) > 0 at 128 x 16",
                    _DELTA, "interdomain", "mqar@128x16/acc"),
    "d2": Question("the erase models language: ppl(Interdomain) / ppl(Interdomain-delta, s = 1) > 1", "interdomain", _DELTA),
    "d3a": Question("negative eigenvalues track parity: scaled acc(Interdomain-delta, s = 2) − scaled "
                    "acc(Interdomain-delta, s = 1) > 0", _DELTA2, _DELTA, "state/parity"),
    "d3b": Question("negative eigenvalues track arithmetic: scaled acc(Interdomain-delta, s = 2) − scaled "
                    "acc(Interdomain-delta, s = 1) > 0 on modular arithmetic", _DELTA2, _DELTA, "state/modular_arithmetic"),
}

LABEL = {**P.MIXER_LABEL, "s4d_only+sum": "S4D-only, mode sum (c_h = 1ᵀ C_h)"}
_ATTENTION = {"softmax": "global attention", "swa": "sliding-window attention"}


def label(mixer: str) -> str:
    """A model's name in the tables: Softmax, Interdomain-selective+phase, S4D-only + global attention 1:3,
    Interdomain-delta (s = 2), ..."""
    if mixer in LABEL:
        return LABEL[mixer]
    base, scale = mixer_delta(mixer)
    if scale:  # the delta update: Interdomain-delta (s = 2)
        return f"{label(base)}-delta (s = {scale:g})"
    if mixer.startswith("hybrid-"):
        _, rec, att, ratio = mixer.split("-")
        return f"{LABEL.get(rec, rec)} + {_ATTENTION[att]} 1:{ratio[3:]}"
    base, sep, core = mixer.partition("-selective")
    return f"{LABEL.get(base, base)}-selective{core}" if sep else mixer


def f2(v, digits: int = 2) -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def by_seed(have: list[int], vals: list, seeds) -> list:
    """Values aligned to `seeds` (None where a seed's run is missing), so pairs are always the same seed."""
    d = dict(zip(have, vals))
    return [d.get(s) for s in seeds]


def setup_line(ctx: Ctx) -> str:
    z = ctx.exp.SIZES[ctx.size]
    m = z["model"]
    if z.get("source", "kjv") == "stdlib":  # named by what the runs recorded, never by the rendering machine
        recorded = recorded_corpus(ctx)
        how = "one file = one document, files held out by path hash: idattn/data/stdlib_corpus.py"
        corpus = (f"the Python {recorded.split('-')[2]} standard-library source ({recorded[:-len('.val')]}, as its "
                  f"runs recorded; {how})" if recorded else
                  f"the standard-library source of the interpreter that trains it (no run recorded yet; {how})")
    else:
        corpus = "embedded KJV corpus"
    return (f"Ours: {corpus}, SentencePiece {z['tokenizer'].split(':')[1]}-piece vocabulary, "
            f"d_model {m['d_model']} x {m['num_layers']} layers ({m['num_heads']} heads x {m['head_dim']}, "
            f"M = {m['num_modes']}), context {z['seq_len']}, {z['num_steps']} steps x {z['batch_size']} x "
            f"{z['seq_len']} tokens, float32 on CPU, seeds {list(ctx.seeds)}; perplexity on the first "
            f"{ctx.exp.EVAL_TOKENS[ctx.size]:,} held-out tokens. Paper: FineWeb-Edu, Llama-2 32K tokenizer, 125M-1.3B "
            f"parameters, context 4096, 2.5B-26B tokens. Different corpus, tokenizer and scale: only orderings and "
            f"ratios compare, never the absolute numbers.")


def rule_line(ctx: Ctx) -> str:
    if not ctx.judged:
        return ("Toy size: a smoke test of the code path. Numbers and intervals are printed; no claim is judged "
                "at this size.")
    return ("Verdict rule (idattn/studies/repro_verdicts.py, fixed before the runs): per-seed paired statistics, "
            "two-sided 95% paired t interval over the seeds; a claim is reproduced / not reproduced only when the "
            "interval lies wholly on one side of its line, else inconclusive at this scale; fewer than 3 paired "
            "seeds is inconclusive.")
