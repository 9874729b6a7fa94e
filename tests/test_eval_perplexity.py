"""Validation perplexity and length extrapolation against closed forms of a bigram lookup model."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from idattn.eval import perplexity
from idattn.eval.datasets import write_jsonl
from tests.eval_fixtures import ByteTokenizer, bigram_score_fn, log_softmax


def _ref_nll(lp, seq):
    return [-lp[a, b] for a, b in zip(seq[:-1], seq[1:])]


def test_validation_perplexity_rolling_closed_form():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(259, 259))
    lp = log_softmax(table)
    docs = [list(rng.integers(3, 259, n)) for n in (5, 70, 33)]
    m = perplexity.validation_perplexity(bigram_score_fn(table), docs, prefix=1, max_length=16, batch_size=2)
    nll = sum(sum(_ref_nll(lp, [1] + d)) for d in docs)
    n = sum(map(len, docs))
    assert m["tokens"] == n
    np.testing.assert_allclose(m["loss"], nll / n, rtol=1e-6)
    np.testing.assert_allclose(m["ppl"], math.exp(nll / n), rtol=1e-6)


def test_extrapolation_closed_form_and_buckets(tmp_path):
    rng = np.random.default_rng(1)
    table = rng.normal(size=(259, 259))
    lp = log_softmax(table)
    corpora = {"pg19": [list(rng.integers(3, 259, n)) for n in (130, 200, 50)],  # the 50-token doc is dropped
               "narrativeqa": [list(rng.integers(3, 259, 128))]}
    m, d = perplexity.extrapolation(bigram_score_fn(table), corpora, [32, 64, 128], bos=1, num_buckets=4)
    for name, docs in corpora.items():
        kept = [x for x in docs if len(x) >= 128]
        assert d["corpora"][name]["docs"] == len(kept)
        for L in (32, 64, 128):
            nll = np.array([_ref_nll(lp, [1] + x[:L]) for x in kept])  # [docs, L]
            np.testing.assert_allclose(m[f"{name}/ppl@{L}"], math.exp(nll.mean()), rtol=1e-6)
            got = d["corpora"][name][str(L)]["bucket_ppl"]
            want = [math.exp(nll[:, a:min(b, L)].mean()) for a, b in zip(range(0, 128, 32), range(32, 160, 32)) if a < L]
            np.testing.assert_allclose(got, want, rtol=1e-6)
    # no headline mean unless all five paper corpora ran (other corpora are never averaged)
    assert not any(k.startswith("ppl@") for k in m) and d["average_over"] == []
    five = {c: corpora["pg19"] for c in perplexity.FIVE_CORPORA}
    m5, d5 = perplexity.extrapolation(bigram_score_fn(table), {**five, "narrativeqa": corpora["narrativeqa"]},
                                      [32, 64, 128], bos=1, num_buckets=4)
    assert d5["average_over"] == list(perplexity.FIVE_CORPORA)  # NarrativeQA is Table 8 only
    assert m5["ppl@64"] == pytest.approx(np.mean([m5[f"{c}/ppl@64"] for c in perplexity.FIVE_CORPORA]), rel=1e-12)
    png = perplexity.plot_extrapolation(d, str(tmp_path / "x.png"), train_len=64)
    assert os.path.getsize(png) > 1000


def test_extrapolation_refuses_short_corpus():
    with pytest.raises(ValueError, match="no document with >= 64"):
        perplexity.extrapolation(bigram_score_fn(np.zeros((259, 259))), {"qmsum": [[5] * 10]}, [32, 64], bos=1)


def test_load_corpus_local_folder_and_field(tmp_path):
    write_jsonl(str(tmp_path / "govreport" / "validation.jsonl"), [{"id": "a", "input": "report text"}])
    write_jsonl(str(tmp_path / "codeparrot" / "shard.jsonl"), [{"content": "def f(): pass"}])  # no split name
    assert perplexity.load_corpus("govreport", data_dir=str(tmp_path)) == ["report text"]
    assert perplexity.load_corpus("codeparrot", data_dir=str(tmp_path)) == ["def f(): pass"]
    with pytest.raises(FileNotFoundError, match="pg19"):
        perplexity.load_corpus("pg19", data_dir=str(tmp_path))
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("report text")) == "report text"
