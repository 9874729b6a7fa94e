"""idattn's harness against lm-evaluation-harness's own answers, in the default suite (no lm-eval needed).

tests/data/lm_eval_reference.json holds what lm-eval built and computed with its own task definitions on the
documents of tests/eval_fixtures.py, through idattn's adapter, with a closed-form model (the byte tokenizer and a
bigram table drawn from numpy's generator): the (context, continuation) requests, the per-request log-likelihoods
and is-greedy flags, and the aggregated metrics. It was made by `python scripts/make_lm_eval_reference.py` (the
file records lm-eval's version); tests/test_eval_lm_eval.py runs the adapter's command itself in the slow suite.

Checked here, per task: idattn's harness builds the same requests (prompt, target delimiter, choice order,
winogrande's partial scoring, lambada's last word, wikitext's detokenizer); the stored log-likelihoods are the
closed form of the bigram model (a numpy loop, so lm-eval's requests reached the model split where the strings
say); and idattn's aggregation gives lm-eval's metrics (acc, acc_norm's byte-length normalisation, lambada's
perplexity, wikitext's word and byte perplexities).
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from idattn.eval import harness
from tests import eval_fixtures as F

REF_PATH = os.path.join(os.path.dirname(__file__), "data", "lm_eval_reference.json")
REF = json.load(open(REF_PATH))
# lm-eval's metric name -> idattn's (the same quantity)
SAME = {"acc": "acc", "acc_norm": "acc_norm", "perplexity": "ppl", "word_perplexity": "word_perplexity",
        "byte_perplexity": "byte_perplexity", "bits_per_byte": "bits_per_byte"}


def _table():
    t = REF["table"]
    return (np.random.default_rng(t["seed"]).standard_normal((t["vocab"], t["vocab"])) * t["scale"]).astype(
        np.float32)


@pytest.fixture(scope="module")
def model():
    table = _table()
    return table, F.bigram_score_fn(table), F.ByteTokenizer()


@pytest.mark.parametrize("task", sorted(REF["tasks"]))
def test_harness_equals_lm_eval_on_its_own_task_definitions(task, model):
    table, score_fn, tok = model
    ref = REF["tasks"][task]
    docs = getattr(F, ref["fixture"])
    assert len(docs) == len(ref["docs"]), f"{ref['fixture']} changed: rerun scripts/make_lm_eval_reference.py"

    for doc, rd in zip(docs, ref["docs"]):
        ours = harness.build_requests(task, doc)
        if harness.get_task(task).kind == "rolling":  # one ("", target) pair: lm-eval's request is the target
            assert [[t] for _, t in ours] == rd["requests"], task
            ll = sum(F.ref_ll(table, tok.encode(t)[:1], tok.encode(t)[1:])[0] for _, t in ours)
            # the rolling window's first token is predicted from the prefix token (BOS when the tokenizer has one,
            # as lm-eval's HFLM does)
            first = tok.encode(ours[0][1])[0]
            ll += float(F.log_softmax(table)[tok.bos_id, first])
            assert rd["responses"][0] == pytest.approx(ll, rel=1e-5), task
            continue
        assert [list(p) for p in ours] == rd["requests"], task
        for (ctx, cont), (ll, greedy) in zip(ours, rd["responses"]):
            want_ll, want_greedy = F.ref_ll(table, tok.encode(ctx), tok.encode(cont))
            assert ll == pytest.approx(want_ll, rel=1e-5, abs=1e-4), (task, ctx[-30:], cont[:30])
            assert bool(greedy) == want_greedy, task

    metrics, _ = harness.evaluate_task(task, docs, score_fn, tok, max_length=REF["max_length"], batch_size=4)
    compared = 0
    for name, value in ref["results"].items():
        if name in SAME and SAME[name] in metrics:
            assert metrics[SAME[name]] == pytest.approx(value, rel=1e-5, abs=1e-12), (task, name)
            compared += 1
    assert compared == len(ref["results"]) and compared >= 1, (task, ref["results"], metrics)


def test_the_reference_is_not_degenerate():
    """The stored answers can tell a mistake: the choices of a question score differently, and the metrics are
    not all at one extreme (a reference where every accuracy is 0 or every log-likelihood equal proves little)."""
    accs, spread = [], []
    for task, ref in REF["tasks"].items():
        accs += [d["metrics"]["acc"] for d in ref["docs"] if "acc" in d["metrics"]]
        for d in ref["docs"]:
            lls = [r[0] for r in d["responses"] if isinstance(r, list)]
            if len(lls) > 1:
                spread.append(max(lls) - min(lls))
    assert 0 < np.mean(accs) < 1 and min(spread) > 1e-3
    assert REF["lm_eval_version"] and math.isfinite(REF["tasks"]["wikitext"]["results"]["word_perplexity"])
