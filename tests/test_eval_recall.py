"""MQAR generator (Zoology's definition), text recall prompts and greedy-match scoring."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from idattn.eval import recall
from tests.eval_fixtures import ByteTokenizer, bigram_score_fn


def test_mqar_structure():
    V, T, P = 256, 64, 4
    x, y = recall.mqar_generate(V, 200, T, P, seed=3)
    assert x.shape == y.shape == (200, T) and x.dtype == np.int32
    assert x.min() >= 0 and x.max() < V
    for i in range(200):
        keys, vals = x[i, 0:2 * P:2], x[i, 1:2 * P:2]
        assert len(set(keys)) == P and len(set(vals)) == P
        assert keys.min() >= 1 and keys.max() < V // 2 and vals.min() >= V // 2
        q = np.nonzero(y[i] != recall.IGNORE)[0]
        assert len(q) == P and (q >= 2 * P).all() and ((q - 2 * P) % 2 == 0).all()
        kv = dict(zip(keys, vals))
        for t in q:  # the token at a query position is a key; its label is that key's value
            assert x[i, t] in kv and y[i, t] == kv[x[i, t]]
        # the label sits on the query token itself (the model predicts the value after reading the key)
    # power-law gaps: queries cluster right after the pairs
    x, y = recall.mqar_generate(8192, 2000, 256, 16, seed=0)
    first = np.array([np.nonzero(r != recall.IGNORE)[0].min() for r in y]) - 32
    assert np.median(first) < 8


def test_mqar_bad_args():
    with pytest.raises(ValueError, match="num_kv_pairs"):
        recall.mqar_generate(256, 1, 64, 17)
    with pytest.raises(ValueError, match="vocab_size"):
        recall.mqar_generate(64, 1, 64, 4)


def test_mqar_accuracy_oracle():
    """An oracle that reads the pairs scores 1; a constant predictor scores 0."""
    x, y = recall.mqar_generate(256, 50, 64, 4, seed=1)

    def oracle(xb):
        out = np.zeros(xb.shape + (256,))
        for i, row in enumerate(xb):
            kv = dict(zip(row[0:8:2], row[1:8:2]))
            for t, tok in enumerate(row):
                out[i, t, kv.get(tok, 0)] = 1.0
        return out

    assert recall.mqar_accuracy(oracle, x, y, batch_size=7) == 1.0
    assert recall.mqar_accuracy(lambda xb: np.zeros(xb.shape + (256,)), x, y) == 0.0


def test_text_recall_prompts():
    tok = ByteTokenizer()
    ex = recall.niah_examples(tok, 1024, 3, seed=0)
    for prompt, ans in ex:
        value = ans.strip(" .")
        assert f"is: {value}." in prompt and len(value) == 7
        assert prompt.endswith("mentioned in the provided text is")
        assert 900 < len(tok.encode(prompt)) <= 1024
    ex = recall.phonebook_examples(16, 2, seed=0)
    for prompt, ans in ex:
        lines = prompt.split("\n")
        assert len(lines) == 18 and lines[-1] == "Answer:"
        name = lines[-2][len("What is the phone number of "):-1]
        assert f"{name}:{ans}" in prompt


def test_greedy_match_with_lookup_model():
    """A bigram table whose argmax follows the answer's byte chain makes the answer greedy; the zero table
    (argmax token 0) never is."""
    tok = ByteTokenizer()
    ex = [("x: 12", " 34"), ("y: 56", " 78")]
    table = np.zeros((259, 259))
    ids = tok.encode("x: 12 34")
    for a, b in zip(ids[-4:-1], ids[-3:]):
        table[a, b] = 10.0
    assert recall.greedy_match_accuracy(bigram_score_fn(table), tok, ex, max_length=32) == 0.5
    assert recall.greedy_match_accuracy(bigram_score_fn(np.zeros((259, 259))), tok, ex, max_length=32) == 0.0


def _mqar_config(arg):
    """experiments/mqar.py's get_config, loaded by path (independent of the working directory)."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "mqar.py")
    spec = importlib.util.spec_from_file_location("idattn_test_mqar_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(arg)


@pytest.mark.slow  # ~25 s of training; the generator and accuracy tests stay in the default suite
def test_train_mqar_short_run_learns():
    """A very short MQAR run of the 2-layer softmax model (the documented run is experiments/mqar.py)."""
    c = _mqar_config("softmax,32,2")
    res = recall.train_mqar(c.model, seq_len=32, num_kv_pairs=2, vocab_size=64, num_train=512, num_test=64,
                            steps=40, batch_size=32, lr=3e-3, warmup=5, log_every=0, curve_every=15)
    assert res["loss"] < res["first_loss"] - 0.3, res
    # the loss curve: every 15 steps and the last, its last point the returned loss
    assert [s for s, _ in res["loss_curve"]] == [15, 30, 40] and res["loss_curve"][-1][1] == res["loss"]
    # the reported accuracy, recomputed in NumPy from the returned parameters on the same test set
    from idattn.models import build_model
    x, y = recall.mqar_generate(64, 64, 32, 2, seed=0 + 12345)
    logits = np.asarray(jax.jit(build_model(c.model).apply)({"params": res["params"]}, x), np.float64)
    q = y != recall.IGNORE
    assert q.sum() == 64 * 2
    assert res["acc"] == pytest.approx(float((logits.argmax(-1)[q] == y[q]).mean()), abs=1e-12)


@pytest.mark.slow
def test_mqar_softmax_reaches_90_percent():
    """The documented CPU check (experiments/mqar.py, 64 tokens, 4 pairs): softmax >= 90% query accuracy, after
    700 steps (99.7% there on the CPU it was tuned on; 100% at the documented 1,500)."""
    c = _mqar_config("softmax")
    q = c.mqar
    res = recall.train_mqar(c.model, seq_len=q.seq_len, num_kv_pairs=q.num_kv_pairs, vocab_size=q.vocab_size,
                            num_train=q.num_train, num_test=q.num_test, steps=700, batch_size=q.batch_size,
                            lr=q.lr, weight_decay=q.weight_decay, warmup=q.warmup, seed=q.seed, log_every=0)
    assert res["acc"] >= 0.9, res["acc"]


def test_mqar_cli_passes_seed_lr_and_steps_to_training(monkeypatch, capsys):
    """`python -m idattn.mqar --seed=s --lr --steps` trains the reproduction's seed s (the failing-seed runs of
    docs/reproduction.md are this command); the default stays the config's seed 0."""
    from idattn.studies import mqar as cli
    seen = []

    def fake(model_cfg, **kw):
        seen.append(kw)
        return {"acc": 0.5, "grid": {}, "loss": 1.0, "steps": kw["steps"], "train_seconds": 0.0, "params": {}}

    monkeypatch.setattr(cli, "train_mqar", fake)
    cli.main(["--mixers=interdomain", "--seed=1", "--lr=3e-3", "--steps=3000"])
    cli.main(["--mixers=interdomain"])
    assert (seen[0]["seed"], seen[0]["lr"], seen[0]["steps"]) == (1, 3e-3, 3000)
    # the default is the recall table's recipe (6000 steps at 1e-3), so the command and the table train alike
    from idattn.configs import repro
    table = repro.MQAR["small"]
    assert (seen[1]["seed"], seen[1]["lr"], seen[1]["steps"]) == (0, table["lr"], table["steps"]) == (0, 1e-3, 6000)
    assert "| interdomain | 0.5000 |" in capsys.readouterr().out
