"""End to end: `python -m idattn.eval` on a tiny random-init model (every suite), then `idattn.results`."""
from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pytest

from idattn.eval import harness
from idattn.eval.datasets import write_jsonl
from idattn.rundir.schema import read_results
from tests.eval_fixtures import ARC, BOOLQ, HELLASWAG, LAMBADA, OPENBOOKQA, PIQA, SIQA, WIKITEXT, WINOGRANDE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the grass is green and the sky is blue while rivers run to the sea under a yellow sun we go there "
         "and back again reading old books of code reports and meeting notes").split()


def _setup(tmp_path):
    from idattn.data.tokenizer import train_sentencepiece

    rng = np.random.default_rng(0)
    text = [" ".join(rng.choice(WORDS, 60)) + "." for _ in range(200)]
    train_sentencepiece(text + [d["text"] for d in LAMBADA], 300, str(tmp_path / "tok"))
    cfg = tmp_path / "cfg.py"
    cfg.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.join(REPO, 'experiments')!r})
        from scaling import get_config as scaling_config

        def get_config(mixer):
            c = scaling_config(mixer + ",tiny")
            c.model.vocab_size = 300
            c.model.impl = "chunked"
            c.data.tokenizer = {str(tmp_path / 'tok.model')!r}
            c.data.seq_len = 64
            return c
    """))
    data = tmp_path / "data"
    long_docs = [{"text": " ".join(rng.choice(WORDS, 400))} for _ in range(3)]
    write_jsonl(str(data / "pg19" / "test.jsonl"), long_docs)
    docs = {"lambada_openai": LAMBADA, "piqa": PIQA, "hellaswag": HELLASWAG, "winogrande": WINOGRANDE,
            "arc_easy": ARC, "arc_challenge": ARC, "social_iqa": SIQA, "boolq": BOOLQ, "openbookqa": OPENBOOKQA,
            "wikitext": WIKITEXT}
    for name, rows in docs.items():
        write_jsonl(str(data / name / f"{harness.TASKS[name].split}.jsonl"), rows)
    write_jsonl(str(tmp_path / "val.jsonl"), [{"text": t} for t in text[:4]])
    return str(cfg), str(data)


class _Reference:
    """log p(next | prefix) in float64 NumPy from a direct forward of the same random-init model (one jit: inputs
    are right-padded to 64 tokens, which a causal model never reads back)."""

    def __init__(self, cfg_spec):
        import jax
        import jax.numpy as jnp
        from flax import linen as nn

        from idattn.configs import load_config_file
        from idattn.models import build_model

        config = load_config_file(cfg_spec)
        model = build_model(config.model)
        self.params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(config.get("seed", 0)),
                                                   jnp.zeros((1, 8), jnp.int32))["params"])
        self.fn = jax.jit(lambda p, x: model.apply({"params": p}, x))

    def logprobs(self, inputs, pad_to=64):
        x = np.zeros((1, pad_to), np.int32)
        x[0, :len(inputs)] = inputs
        logits = np.asarray(self.fn(self.params, x)[0, :len(inputs)], np.float64)
        m = logits.max(-1, keepdims=True)
        return logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))


def _rolling_ll(ref, bos, toks, L=64):
    """Total log-likelihood under lm-eval's rolling windows (max length L, context 1), written out here: the first
    window reads [BOS] + toks[:L-1] and predicts toks[:L]; each next one predicts the next <= L tokens reading the
    L tokens before each of them."""
    e = min(L, len(toks))
    total = ref.logprobs([bos] + toks[:e - 1])[np.arange(e), toks[:e]].sum()
    s = e
    while s < len(toks):
        e = min(len(toks), s + L)
        inp = toks[max(0, e - L - 1):e - 1]
        n = e - s
        total += ref.logprobs(inp)[np.arange(len(inp) - n, len(inp)), toks[s:e]].sum()
        s = e
    return total


@pytest.mark.slow  # ~95 s: every suite end to end against NumPy recomputations (CI's slow pass)
def test_eval_cli_all_suites_then_results(tmp_path, capsys):
    import re

    from idattn.studies import results
    from idattn.data.tokenizer import load_tokenizer
    from idattn.eval.__main__ import main

    cfg, data = _setup(tmp_path)
    wd = str(tmp_path / "run")
    rc = main([f"--workdir={wd}", "--suite=validation,extrapolation,harness,recall,decode", "--random_init",
               f"--config={cfg}:interdomain", f"--data_dir={data}", f"--val_path={tmp_path / 'val.jsonl'}",
               "--lengths=32,64,112", "--corpora=pg19", "--niah_lengths=96", "--phonebook_sizes=2",
               "--recall_n=2", "--decode_contexts=8", "--decode_batches=1", "--decode_steps=2", "--batch_size=4",
               "--prefill_chunk=8"])
    assert rc == 0
    printed = capsys.readouterr()
    recs = {r["suite"]: r for r in read_results(wd)}
    assert set(recs) == {"validation", "extrapolation", "harness", "recall", "decode"}
    for r in recs.values():
        assert r["step"] == -1 and r["run"]["mixer"] == "interdomain" and r["run"]["size"] == "tiny"
    assert "ETA" in printed.err  # progress lines
    # the final table holds every metric with the value of the JSON files
    for r in recs.values():
        for k, v in r["metrics"].items():
            assert re.search(rf"\| {r['suite']} \| [^|]* \| {re.escape(k)} \| {v:.4f} \|", printed.out), (k, v)

    tok = load_tokenizer(str(tmp_path / "tok.model"))
    bos = tok.bos_id
    ref = _Reference(f"{cfg}:interdomain")
    # validation (rolling windows of 64): NumPy recomputation
    texts = [json.loads(ln)["text"] for ln in open(tmp_path / "val.jsonl")]
    nll = n = 0.0
    for t in texts:
        ids = tok.encode(t)
        nll -= _rolling_ll(ref, bos, ids)
        n += len(ids)
    assert n > 64 * len(texts)  # several windows per document
    v = recs["validation"]["metrics"]
    assert v["tokens"] == n and v["loss"] == pytest.approx(nll / n, rel=1e-5) and v["ppl"] == pytest.approx(np.exp(nll / n), rel=1e-5)
    assert os.path.basename(recs["validation"]["path"]) == f"validation-val-t{int(n)}-c64-b4-stepinit.json"
    # extrapolation: pg19 at L=32 is the mean nll of the first 32 tokens of each document (input [BOS] + doc[:31])
    e = recs["extrapolation"]["metrics"]
    assert set(e) == {"pg19/ppl@32", "pg19/ppl@64", "pg19/ppl@112"}  # one corpus: no "mean" headline
    docs = [json.loads(ln)["text"] for ln in open(os.path.join(data, "pg19", "test.jsonl"))]
    nlls = []
    for t in docs:
        ids = tok.encode(t)[:32]
        lp = ref.logprobs([bos] + ids[:-1])
        nlls.append(-lp[np.arange(32), ids])
    assert e["pg19/ppl@32"] == pytest.approx(float(np.exp(np.mean(nlls))), rel=1e-5)
    assert os.path.getsize(recs["extrapolation"]["path"][:-5] + ".png") > 1000
    # harness: the average is the mean of the eight headline accuracies; WikiText word perplexity recomputed from
    # direct forwards over each (detokenised) page's rolling windows: exp(-sum log p / words)
    h = recs["harness"]["metrics"]
    heads = [h[f"{t}/{harness.TASKS[t].headline}"] for t in harness.EIGHT_TASKS]
    assert h["average/acc"] == pytest.approx(float(np.mean(heads)), abs=1e-12)
    ll = words = 0.0
    for d in WIKITEXT:
        ll += _rolling_ll(ref, bos, tok.encode(harness.wikitext_detokenizer(d["page"])))
        words += len(re.split(r"\s+", d["page"]))
    assert h["wikitext/word_perplexity"] == pytest.approx(float(np.exp(-ll / words)), rel=1e-4)
    # recall: the phonebook's greedy match recomputed from direct forwards (each answer token must be the argmax)
    from idattn.eval import recall as rc
    hits = []
    for prompt, ans in rc.phonebook_examples(2, 2, seed=2):
        ctx = [bos] + tok.encode(prompt)
        cont = tok.encode(prompt + ans)[len(ctx) - 1:]
        lp = ref.logprobs(ctx + cont[:-1], pad_to=128)
        hits.append(all(lp[len(ctx) - 1 + j].argmax() == c for j, c in enumerate(cont)))
    assert recs["recall"]["metrics"]["phonebook@2/acc"] == float(np.mean(hits))
    assert "niah@96/acc" in recs["recall"]["metrics"]
    assert "ms_per_token@8/b1" in recs["decode"]["metrics"]

    # the default validation path: the run's held-out split packed as the trainer validates (KJV corpus here), on
    # the trainer's token count (eval_batches x batch x seq_len) whatever --batch_size; a file of its own
    assert main([f"--workdir={wd}", "--suite=validation", "--random_init", f"--config={cfg}:interdomain",
                 "--batch_size=3", "--quiet"]) == 0
    from idattn.configs import load_config_file
    from idattn.eval.evaluate import trainer_val_rows
    c = load_config_file(f"{cfg}:interdomain")
    rows = trainer_val_rows(c)
    v2 = [r for r in read_results(wd, "validation") if r["protocol"]["corpus"] == "kjv.val"][0]
    assert v2["metrics"]["tokens"] == rows * 64 and v2["protocol"]["tokens"] == rows * 64
    assert os.path.basename(v2["path"]) == f"validation-kjv.val-t{rows * 64}-c64-b3-stepinit.json"
    assert abs(v2["metrics"]["loss"] - np.log(300)) < 0.5

    out = str(tmp_path / "tables")
    assert results.main([f"--runs={wd}", f"--out={out}"]) == 0
    md = open(os.path.join(out, "results.md")).read()
    ours = f"{h['lambada_openai/acc'] * 100:.2f}"
    assert any(ln.startswith("| LAMBADA (acc)") and ln.rstrip(" |").split("|")[6].strip() == ours
               for ln in md.splitlines())
    assert f"{e['pg19/ppl@64']:.2f} @64" in md and "Interdomain ours (tiny)" in md
    json.dumps(recs)  # everything JSON-serialisable


@pytest.mark.slow  # 22 s of the default suite's budget; CI's slow pass runs it
def test_extrapolation_rolling_mode_scores_short_documents_and_says_how_many(tmp_path, capsys):
    """A corpus of documents shorter than the longest length: the paper's protocol refuses it (naming the rolling
    mode); --extrapolation_mode=rolling scores every document whole in windows of L, equal to lm-eval's rolling
    windows written out in NumPy (_rolling_ll), and the table, the result file and the plot say how many documents
    and tokens each number is over."""
    from idattn.data.tokenizer import load_tokenizer
    from idattn.eval.__main__ import main

    cfg, _ = _setup(tmp_path)
    rng = np.random.default_rng(1)
    docs = [" ".join(rng.choice(WORDS, n)) for n in (5, 12, 20)]  # all shorter than 96 tokens
    write_jsonl(str(tmp_path / "short.jsonl"), [{"text": t} for t in docs])
    wd = str(tmp_path / "run")
    common = [f"--workdir={wd}", "--suite=extrapolation", "--random_init", f"--config={cfg}:interdomain",
              f"--corpora=short={tmp_path / 'short.jsonl'}", "--lengths=16,96"]
    assert main(common) == 2
    err = capsys.readouterr().err
    assert "no document with 96 tokens" in err and "--extrapolation_mode=rolling" in err
    assert main(common + ["--extrapolation_mode=rolling"]) == 0
    out = capsys.readouterr().out
    rec = read_results(wd, "extrapolation")[-1]
    tok = load_tokenizer(str(tmp_path / "tok.model"))
    ids = [tok.encode(t) for t in docs]
    assert max(map(len, ids)) < 96 and sum(len(d) > 16 for d in ids) >= 2  # windows of 16 cut documents
    ref = _Reference(f"{cfg}:interdomain")
    ref_logprobs = ref.logprobs
    ref.logprobs = lambda inputs: ref_logprobs(inputs, pad_to=96)  # windows up to 96 tokens here
    got = {L: rec["metrics"][f"short/ppl@{L}"] for L in (16, 96)}
    want = {L: float(np.exp(-sum(_rolling_ll(ref, tok.bos_id, d, L=L) for d in ids) / sum(map(len, ids))))
            for L in (16, 96)}
    assert got == pytest.approx(want, rel=1e-5), (got, want)
    n_tok = sum(map(len, ids))
    assert rec["protocol"]["mode"] == "rolling" and rec["protocol"]["docs"] == {"short": 3}
    assert f"short: 3 docs, {n_tok:,} tokens at L=96" in out and "mode rolling" in out
    assert os.path.basename(rec["path"]).endswith("-mrolling-stepinit.json")
    assert os.path.getsize(rec["path"][:-5] + ".png") > 1000


def test_eval_table_orders_lengths_as_numbers(tmp_path):
    """Issue 54 item 6: the eval CLI's table printed ppl@1024, ppl@16384, ppl@256, ppl@4096 (the result file's key
    order); lengths, sizes and contexts are numbers, ascending, whatever the file's order."""
    from idattn.eval.evaluate import results_table
    from idattn.rundir.schema import write_result

    lengths = (256, 1024, 4096, 16384)
    write_result(str(tmp_path), "extrapolation", 5, {f"pg19/ppl@{L}": L / 100 for L in lengths} |
                 {f"mine/ppl@{L}": L / 10 for L in lengths}, protocol={"corpus": "mine+pg19", "context": list(lengths)})
    write_result(str(tmp_path), "recall", 5, {"niah@8192/acc": 0.1, "niah@512/acc": 0.2, "phonebook@64/acc": 0.3,
                                              "phonebook@128/acc": 0.4})
    recs = read_results(str(tmp_path))
    assert list(recs[0]["metrics"])[:2] == ["mine/ppl@1024", "mine/ppl@16384"]  # the file's (text) order
    got = [ln.split("|")[3].strip() for ln in results_table(recs).splitlines()[2:]]
    assert got == [f"mine/ppl@{L}" for L in lengths] + [f"pg19/ppl@{L}" for L in lengths] + \
        ["niah@512/acc", "niah@8192/acc", "phonebook@64/acc", "phonebook@128/acc"], got


def test_eval_cli_refuses_unknown_corpus_before_anything(tmp_path, capsys):
    from idattn.eval.__main__ import main

    wd = tmp_path / "run"
    rc = main([f"--workdir={wd}", "--suite=extrapolation", "--corpora=pg19,pydocs", "--random_init",
               "--config=experiments/scaling.py:interdomain,tiny"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "unknown corpus 'pydocs'" in err and "pydocs=<path>" in err and "pg19" in err
    assert not wd.exists()
    rc = main([f"--workdir={wd}", "--suite=extrapolation", f"--corpora=mine={tmp_path / 'nowhere'}",
               "--random_init", "--config=experiments/scaling.py:interdomain,tiny"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "no such file or folder" in err
    assert not wd.exists()


class _Payload:
    """Unpickling this object writes a marker file: what a shared pickled .npy could do to its reader."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_token_id_files_are_read_without_pickle(tmp_path):
    import numpy as np

    from idattn.eval.evaluate import EvalError, read_token_docs
    marker = tmp_path / "pwned"
    bad = tmp_path / "shared.npy"
    np.save(bad, np.array([_Payload(str(marker)), [1, 2, 3]], dtype=object), allow_pickle=True)
    with pytest.raises(EvalError, match=r"--val_path=.*shared\.npy.*integer"):
        read_token_docs(str(bad))
    assert not marker.exists()  # nothing ran
    np.save(tmp_path / "one.npy", np.arange(5, dtype=np.int32))
    np.save(tmp_path / "rows.npy", np.arange(6, dtype=np.int64).reshape(2, 3))
    np.savez(tmp_path / "docs.npz", a=np.array([7, 8], np.int16), b=np.array([9], np.int32))
    (tmp_path / "docs.ids.jsonl").write_text("[1, 2]\n\n[3]\n")
    assert read_token_docs(str(tmp_path / "one.npy")) == [[0, 1, 2, 3, 4]]
    assert read_token_docs(str(tmp_path / "rows.npy")) == [[0, 1, 2], [3, 4, 5]]
    assert read_token_docs(str(tmp_path / "docs.npz")) == [[7, 8], [9]]
    assert read_token_docs(str(tmp_path / "docs.ids.jsonl")) == [[1, 2], [3]]
    np.save(tmp_path / "floats.npy", np.ones(3, np.float32))
    with pytest.raises(EvalError, match="float32 values; expected integer token ids"):
        read_token_docs(str(tmp_path / "floats.npy"))
    (tmp_path / "text.ids.jsonl").write_text('["a"]\n')
    with pytest.raises(EvalError, match="line 1 is not a JSON list of integers"):
        read_token_docs(str(tmp_path / "text.ids.jsonl"))
