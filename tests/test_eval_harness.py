"""Harness prompts (exact strings on HF-format fixtures) and scoring against closed forms / numpy loops."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from idattn.eval import harness
from idattn.eval.datasets import write_jsonl
from idattn.eval.scoring import (encode_pair, loglikelihood, make_disjoint_window, rolling_windows,
                                 score_sequences)
from tests.eval_fixtures import (ARC, BOOLQ, HELLASWAG, LAMBADA, OPENBOOKQA, PIQA, SIQA, WIKITEXT, WINOGRANDE,
                                 ByteTokenizer, bigram_score_fn, log_softmax, ref_ll)

TOK = ByteTokenizer()


# ---------------------------------------------------------------- exact prompts


def test_lambada_requests():
    (ctx, cont), = harness.build_requests("lambada_openai", LAMBADA[1])
    assert (ctx, cont) == ("the cat sat on the", " mat")
    (ctx, cont), = harness.build_requests("lambada_openai", LAMBADA[0])
    assert cont == " angel" and ctx.endswith('"Thanks,') and ctx.startswith("In my palm")


def test_piqa_requests():
    r = harness.build_requests("piqa", PIQA[0])
    assert r[0][0] == "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    assert r[0][1] == " " + PIQA[0]["sol1"] and r[1][1] == " " + PIQA[0]["sol2"] and len(r) == 2
    assert harness.gold_index("piqa", PIQA[0]) == 0


def test_hellaswag_requests_and_preprocess():
    r = harness.build_requests("hellaswag", HELLASWAG[0])
    assert [c for c, _ in r] == ["Roof shingle removal: A man is sitting on a roof. He"] * 4
    assert [x for _, x in r] == [" is using wrap to wrap a pair of skis.", " is ripping level tiles off.",
                                 " is holding a rubik's cube.", " starts pulling up roofing on a roof."]
    assert harness.gold_index("hellaswag", HELLASWAG[0]) == 3
    r = harness.build_requests("hellaswag", HELLASWAG[1])
    # " [title]" -> ". ", brackets removed, double spaces halved once (str.replace), ctx_b.capitalize()
    assert r[0][0] == "Home and Garden: How to clean a cast iron skillet. Scrub the skillet. Use hot water"
    assert [x for _, x in r] == ["  Rinse it well Dry it.", " then dry it. Oil it.", " leave it.",
                                 "  Throw it  away."]


def test_winogrande_partial_scoring_requests():
    r = harness.build_requests("winogrande", WINOGRANDE[0])
    assert r == [("Sarah was a much better surgeon than Maria so Sarah", " always got the harder cases."),
                 ("Sarah was a much better surgeon than Maria so Maria", " always got the harder cases.")]
    assert harness.gold_index("winogrande", WINOGRANDE[0]) == 0


def test_arc_siqa_boolq_obqa_requests():
    r = harness.build_requests("arc_challenge", ARC[0])
    assert r[0][0] == ("Question: An astronomer observes that a planet rotates faster after a meteorite impact. "
                       "Which is the most likely effect of this increase in rotation?\nAnswer:")
    assert r[2][1] == " Planetary days will become shorter." and harness.gold_index("arc_easy", ARC[0]) == 2
    assert harness.gold_index("arc_easy", ARC[1]) == 0 and len(harness.build_requests("arc_easy", ARC[1])) == 3
    r = harness.build_requests("social_iqa", SIQA[0])
    assert r[1] == ("Q: Cameron decided to have a barbecue and gathered her friends together. How would Others "
                    "feel as a result?\nA:", " like staying home")
    assert harness.gold_index("social_iqa", SIQA[0]) == 0
    r = harness.build_requests("boolq", BOOLQ[0])
    assert r == [("Persian language -- Persian is a Western Iranian language.\nQuestion: do iran and afghanistan "
                  "speak the same language?\nAnswer:", " no"),
                 ("Persian language -- Persian is a Western Iranian language.\nQuestion: do iran and afghanistan "
                  "speak the same language?\nAnswer:", " yes")]
    assert harness.gold_index("boolq", BOOLQ[0]) == 1
    r = harness.build_requests("openbookqa", OPENBOOKQA[0])
    assert r[3] == ("The sun is responsible for", " plants sprouting, blooming and wilting")
    assert harness.gold_index("openbookqa", OPENBOOKQA[0]) == 3


def test_wikitext_detokenizer():
    (ctx, target), = harness.build_requests("wikitext", WIKITEXT[0])
    assert ctx == ""
    assert target == (" = Robert Boulter =\nRobert Boulter is an English film, television and theatre actor. He "
                      "had a guest-starring role on the television series The Bill in 2000.\n")


def test_missing_field_error_names_it():
    with pytest.raises(KeyError, match="goal"):
        harness.build_requests("piqa", {"sol1": "a", "sol2": "b", "label": 0})


# ---------------------------------------------------------------- scoring


def test_encode_pair_moves_trailing_space():
    ctx, cont = encode_pair(TOK, "Answer: ", "yes")
    assert ctx == TOK.encode("Answer:") and cont == TOK.encode(" yes")
    ctx, cont = encode_pair(TOK, "", "hello")
    assert ctx == [TOK.bos_id] and cont == TOK.encode("hello")


def test_score_sequences_padding_matches_unpadded():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(259, 259))
    fn = bigram_score_fn(table)
    lp = log_softmax(table)
    rows = [list(rng.integers(3, 259, size=n)) for n in (5, 40, 3, 17, 70)]
    out = score_sequences(fn, [r[:-1] for r in rows], [r[1:] for r in rows], batch_size=3, max_length=128)
    for r, (got, greedy) in zip(rows, out):
        want = [lp[a, b] for a, b in zip(r[:-1], r[1:])]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert list(greedy) == [np.argmax(table[a]) == b for a, b in zip(r[:-1], r[1:])]


def test_loglikelihood_left_truncation():
    """With max_length shorter than ctx+cont, only the last max_length+1 tokens enter (harness)."""
    rng = np.random.default_rng(1)
    table = rng.normal(size=(259, 259))
    ctx, cont = list(rng.integers(3, 259, 50)), list(rng.integers(3, 259, 4))
    (ll, _), = loglikelihood(bigram_score_fn(table), [(ctx, cont)], max_length=16)
    np.testing.assert_allclose(ll, ref_ll(table, ctx, cont)[0], rtol=1e-5)


def test_rolling_windows_cover_every_token_once():
    toks = list(range(10, 20))
    w = list(rolling_windows(toks, 1, 4))
    assert w == [([1, 10, 11, 12], [10, 11, 12, 13]), ([13, 14, 15, 16], [14, 15, 16, 17]),
                 ([15, 16, 17, 18], [18, 19])]
    assert [make_disjoint_window(x) for x in w] == [([1], [10, 11, 12, 13]), ([13], [14, 15, 16, 17]),
                                                    ([15, 16, 17], [18, 19])]


def test_multiple_choice_uniform_model_closed_form():
    """Uniform model: ll_k = -n_bytes_k log V. acc picks the fewest bytes, acc_norm (per *character*) ties
    across ASCII choices (-log V each) so argmax returns choice 0; a 2-byte character shows chars != bytes."""
    fn = bigram_score_fn(np.zeros((259, 259)))
    V = 259
    doc = {"goal": "g", "sol1": "abcd", "sol2": "ab", "label": 1}
    m, _ = harness.evaluate_task("piqa", [doc], fn, TOK, max_length=64)
    assert m == {"acc": 1.0, "acc_norm": 0.0}
    # "éé" = 2 chars, 4 bytes -> ll/len = -2 log V  <  "abc" -> -log V: acc_norm prefers "abc" (index 1)
    doc = {"goal": "g", "sol1": "éé", "sol2": "abc", "label": 1}
    m, _ = harness.evaluate_task("piqa", [doc], fn, TOK, max_length=64)
    assert m == {"acc": 1.0, "acc_norm": 1.0}  # acc: " abc" 4 bytes vs " éé" 5 bytes
    # lambada: the zero table's argmax is token 0, never a target -> acc 0; ppl = V^(n_tokens)
    m, _ = harness.evaluate_task("lambada_openai", [LAMBADA[1]], fn, TOK, max_length=64)
    assert m["acc"] == 0.0
    np.testing.assert_allclose(m["ppl"], V ** 4, rtol=1e-4)  # " mat" is 4 byte tokens
    np.testing.assert_allclose(m["bpb"], 4 * math.log(V) / 4 / math.log(2), rtol=1e-5)


def _all_docs():
    return {"lambada_openai": LAMBADA, "piqa": PIQA, "hellaswag": HELLASWAG, "winogrande": WINOGRANDE,
            "arc_easy": ARC, "arc_challenge": ARC, "social_iqa": SIQA, "boolq": BOOLQ, "openbookqa": OPENBOOKQA,
            "wikitext": WIKITEXT}


def test_suite_against_numpy_reference_from_files(tmp_path):
    """Every task read back from HF-format files, scored by a random bigram table; metrics equal a numpy loop
    over the same strings (the table is biased so that LAMBADA doc 1 is greedy-correct and doc 0 is not)."""
    rng = np.random.default_rng(2)
    table = rng.normal(size=(259, 259))
    ids = TOK.encode("the cat sat on the mat")
    for a, b in zip(ids[-5:-1], ids[-4:]):
        table[a, b] += 20.0
    docs = _all_docs()
    for name, rows in docs.items():
        if name == "hellaswag":  # one task through parquet, the rest through jsonl
            import pyarrow as pa
            import pyarrow.parquet as pq

            os.makedirs(tmp_path / name / "data")
            pq.write_table(pa.Table.from_pylist(rows), tmp_path / name / "data" / "validation-00000-of-00001.parquet")
        else:
            write_jsonl(str(tmp_path / name / f"{harness.TASKS[name].split}.jsonl"), rows)
    fn = bigram_score_fn(table)
    metrics, details = harness.run_harness(fn, TOK, data_dir=str(tmp_path), max_length=256, batch_size=4)

    lp = log_softmax(table)
    for name in harness.EIGHT_TASKS + ("openbookqa",):
        t = harness.TASKS[name]
        if t.kind == "loglikelihood":
            res = [ref_ll(table, TOK.encode(c), TOK.encode(x)) for d in docs[name]
                   for c, x in harness.build_requests(name, d)]
            assert metrics[f"{name}/acc"] == np.mean([g for _, g in res]) == 0.5
            np.testing.assert_allclose(metrics[f"{name}/ppl"], math.exp(-np.mean([l for l, _ in res])), rtol=1e-5)
            continue
        accs, norms = [], []
        for d in docs[name]:
            reqs = harness.build_requests(name, d)
            lls = np.array([ref_ll(table, TOK.encode(c), TOK.encode(x))[0] for c, x in reqs])
            gold = harness.gold_index(name, d)
            lens = np.array([len(c) for c, _ in reqs]) if t.multiple_input else np.array([len(x) - 1 for _, x in reqs])
            accs.append(float(np.argmax(lls) == gold))
            norms.append(float(np.argmax(lls / lens) == gold))
        assert metrics[f"{name}/acc"] == np.mean(accs), name
        if "acc_norm" in t.metrics:
            assert metrics[f"{name}/acc_norm"] == np.mean(norms), name
    heads = [metrics[f"{n}/{harness.TASKS[n].headline}"] for n in harness.EIGHT_TASKS]
    assert metrics["average/acc"] == pytest.approx(np.mean(heads))
    # wikitext: rolling windows of 256 over the detokenised page, first token predicted from BOS
    target = TOK.encode(harness.build_requests("wikitext", WIKITEXT[0])[0][1])
    seq = [TOK.bos_id] + target
    ll = sum(lp[a, b] for a, b in zip(seq[:-1], seq[1:]))
    page = WIKITEXT[0]["page"]
    words, nbytes = len(__import__("re").split(r"\s+", page)), len(page.encode())
    np.testing.assert_allclose(metrics["wikitext/word_perplexity"], math.exp(-ll / words), rtol=1e-5)
    np.testing.assert_allclose(metrics["wikitext/bits_per_byte"], -ll / nbytes / math.log(2), rtol=1e-5)


def test_wikitext_rolling_windows_short_context():
    """max_length 16 (several windows): the total still equals the bigram closed form (each token once)."""
    rng = np.random.default_rng(3)
    table = rng.normal(size=(259, 259))
    m, d = harness.evaluate_task("wikitext", WIKITEXT, bigram_score_fn(table), TOK, max_length=16)
    target = TOK.encode(harness.build_requests("wikitext", WIKITEXT[0])[0][1])
    seq = [TOK.bos_id] + target
    lp = log_softmax(table)
    np.testing.assert_allclose(d["ll"], sum(lp[a, b] for a, b in zip(seq[:-1], seq[1:])), rtol=1e-5)


def test_missing_task_folder_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="piqa"):
        harness.load_task_docs("piqa", data_dir=str(tmp_path))
