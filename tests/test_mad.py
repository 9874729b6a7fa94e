"""The MAD synthetic suite (idattn.eval.mad): each task's format on a hand-written example, its generator's
instances against the task's rule, and an exact solver scoring 100% through `score` (the function a model is
scored with), while a wrong solver does not."""
from __future__ import annotations

import numpy as np
import pytest

from idattn.eval import mad

I = mad.IGNORE


def _acc(task, x, y, **kw):
    return mad.score(mad.solver(task, **kw), np.asarray(x)[None], np.asarray(y)[None])


def test_in_context_recall_hand_written_example_and_rule():
    # vocab 8, multi-query: keys 0..3, values 4..7; the sequence k v pairs 0:5, 1:6, 0:5 (repeat), 2:7, 1:6 (repeat)
    x = [0, 5, 1, 6, 0, 5, 2, 7, 1]
    y = [I, I, I, I, 5, I, I, I, 6]  # the output at a repeated key must be its value
    assert _acc("in_context_recall", x, y, vocab_size=8) == 1.0
    assert _acc("in_context_recall", x, [I, I, I, I, 6, I, I, I, 6], vocab_size=8) == 0.5  # a wrong label is missed
    # the generator: every scored position is a key seen before, labelled with the value that followed it, and
    # every repeated key is scored
    X, Y = mad.generate("in_context_recall", 50, seed=3)
    assert X.shape == Y.shape == (50, 127) and X.min() >= 0 and X.max() < 16
    for xs, ys in zip(X, Y):
        seen = {}
        for t in range(0, len(xs) - 1, 2):
            k, v = int(xs[t]), int(xs[t + 1])
            assert k < 8 <= v
            assert ys[t] == (seen[k] if k in seen else I) and seen.setdefault(k, v) == v
    X2, Y2 = mad.generate("in_context_recall", 50, seed=3)
    assert (X2 == X).all() and (Y2 == Y).all() and not (mad.generate("in_context_recall", 50, seed=4)[0] == X).all()
    # training instances: next-token targets everywhere
    Xt, Yt = mad.generate("in_context_recall", 4, seed=0, is_training=True)
    assert (Xt[:, 1:] == Yt[:, :-1]).all()


def test_noisy_recall_hand_written_example():
    # vocab 12 with 4 noise tokens: keys 0..3, values 4..7, noise 8..11; a noise pair between the repeats
    x, y = [0, 5, 9, 10, 0], [I, I, I, I, 5]
    assert _acc("noisy_recall", x, y, vocab_size=12, noise_vocab_size=4) == 1.0
    X, Y = mad.generate("noisy_recall", 200, seed=0)
    noise = (X >= 16) & (X < 32)
    assert 0.1 < noise.mean() < 0.3 and (Y[noise] == I).all()  # ~20% noise pairs, never scored


def test_fuzzy_recall_hand_written_example():
    # vocab 10 (pad 9): keys 0..3, values 4..8; pairs (0 1):(4), (2):(5 6), then (0 1) and (2) again
    x = [9, 0, 1, 4, 2, 5, 6, 0, 1, 4, 2, 5]
    y = [I, I, I, I, I, I, I, I, 4, I, 5, 6]  # multi-token values come out token by token
    assert _acc("fuzzy_recall", x, y, vocab_size=10) == 1.0
    assert _acc("fuzzy_recall", x, [I] * 8 + [4, I, 5, 5], vocab_size=10) == pytest.approx(2 / 3)
    X, Y = mad.generate("fuzzy_recall", 100, seed=1)
    assert X.shape == (100, 128) and ((Y != I).sum(1) >= 1).all()  # the final query is always answerable


def test_selective_copying_hand_written_example():
    # vocab 6 (blank 4, copy 5), T = 8, 2 tokens to copy: they come out after the copy token, in order
    x, y = [4, 2, 4, 3, 4, 5, 4, 4], [I, I, I, I, I, I, 2, 3]
    assert _acc("selective_copying", x, y, vocab_size=6) == 1.0
    X, Y = mad.selective_copying(20, 0, vocab_size=6, seq_len=8, num_tokens_to_copy=2)
    assert (X[:, 5] == 5).all() and ((X[:, :5] != 4).sum(1) == 2).all()
    for xs, ys in zip(X, Y):
        assert list(ys[6:]) == [t for t in xs[:5] if t != 4] and (ys[:6] == I).all()


def test_compression_hand_written_example():
    x = [2, 0, 1, 3]  # vocab 4: three tokens and the compression token 3; every input token comes back
    assert _acc("compression", x, x, vocab_size=4) == 1.0
    X, Y = mad.generate("compression", 10, seed=0)
    assert (X == Y).all() and (X[:, -1] == 15).all() and X[:, :-1].max() < 15


def test_memorization_hand_written_example():
    kv = mad.memorization_map(8, 0)  # 7 non-special tokens: keys 0..2, values 3..6, insert token 7
    assert set(kv) == {0, 1, 2} and len(set(kv.values())) == 3 and all(3 <= v <= 6 for v in kv.values())
    x = [1, 7, 0, 7, 1, 7]
    y = [I, kv[1], I, kv[0], I, kv[1]]
    assert _acc("memorization", x, y, vocab_size=8, kv_map_seed=0) == 1.0
    X, Y = mad.generate("memorization", 5, seed=0)
    assert (X[:, 1::2] == 255).all() and (Y[:, 1::2] == np.vectorize(mad.memorization_map().get)(X[:, 0::2])).all()
    # the map is one for every split: train and test instances share it
    assert mad.memorization_map() == mad.memorization_map(256, 12345)


@pytest.mark.parametrize("task", sorted(mad.TASKS))
def test_exact_solver_scores_100_percent_and_a_wrong_one_does_not(task):
    x, y = mad.generate(task, 64, seed=7)
    fn = mad.solver(task)
    assert mad.score(fn, x, y, batch_size=16) == 1.0
    assert mad.accuracy(fn(x), y) == 1.0
    V = mad.TASKS[task]["vocab_size"]
    assert mad.score(lambda a: np.zeros(a.shape + (V,)), x, y) < 0.5  # always token 0
    assert mad.score(lambda a: np.roll(fn(a), 1, axis=1), x, y) < 0.9  # one position late


def test_scoring_refuses_mismatched_shapes():
    x, y = mad.generate("compression", 4, seed=0)
    with pytest.raises(ValueError, match="predictions"):
        mad.score(lambda a: np.zeros((a.shape[0], a.shape[1] - 1, 16)), x, y)
    with pytest.raises(ValueError, match="task"):
        mad.generate("copying", 1)


@pytest.mark.slow
def test_train_mad_smoke_runs_the_trainer_step():
    """A few steps of the trainer's step on a short in-context recall: runs, gives a finite loss and an accuracy
    in [0, 1] from `score` (no claim about learning at this size)."""
    from idattn.configs import repro
    cfg = repro.get_mqar_config("softmax", "toy").model
    r = mad.train_mad(cfg, "in_context_recall", steps=3, batch_size=4, num_train=16, num_test=8, seq_len=16,
                      warmup=1)
    assert r["steps"] == 3 and np.isfinite(r["loss"]) and 0.0 <= r["acc"] <= 1.0 and r["seq_len"] == 15


@pytest.mark.slow  # 31 s of the default suite's budget; CI's slow pass runs it
def test_auto_encoder_decodes_every_position_from_the_last_representation_only():
    """The compression model against a float64 numpy reference of mad-lab's decoder: logits[b, t] =
    unembed(RMSNorm(MLP(z_b + sincos_t))) with z_b the encoder's final representation at the last token (the
    language model's `hidden=True` output, which is also checked: its product with lm_head is the LM's logits)."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    from idattn.configs import repro
    from idattn.models import build_model

    cfg = repro.get_mqar_config("interdomain", "toy").model
    x = np.random.default_rng(0).integers(0, 8, (2, 6)).astype(np.int32)
    lm = build_model(cfg)
    p_lm = nn.unbox(lm.init(jax.random.PRNGKey(0), jnp.asarray(x))["params"])
    h = np.asarray(lm.apply({"params": p_lm}, jnp.asarray(x), hidden=True), np.float64)
    logits = np.asarray(lm.apply({"params": p_lm}, jnp.asarray(x)), np.float64)
    np.testing.assert_allclose(h @ np.asarray(p_lm["lm_head"]["kernel"], np.float64), logits, rtol=2e-2, atol=2e-3)

    ae = mad.auto_encoder(cfg)
    p = nn.unbox(ae.init(jax.random.PRNGKey(1), jnp.asarray(x))["params"])
    assert "lm_head" not in p["encoder"] and set(p) >= {"encoder", "dec_0", "dec_1", "unembed"}
    out = np.asarray(ae.apply({"params": p}, jnp.asarray(x)), np.float64)
    z = np.asarray(build_model(cfg).apply({"params": p["encoder"]}, jnp.asarray(x), hidden=True), np.float64)[:, -1]

    def rms(v, scale):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + cfg.norm_eps) * np.asarray(scale, np.float64)

    from math import erf
    gelu = np.vectorize(lambda v: 0.5 * v * (1.0 + erf(v / np.sqrt(2.0))))
    T, d = x.shape[1], cfg.d_model
    k = np.arange(d // 2)
    ang = np.arange(T)[:, None] / 10000.0 ** (k / (d // 2 - 1))[None, :]
    v = z[:, None, :] + np.concatenate([np.sin(ang), np.cos(ang)], axis=1)[None]
    for i in range(2):
        dense = p[f"dec_{i}"]
        v = gelu(rms(v, p[f"dec_norm_{i}"]["scale"]) @ np.asarray(dense["kernel"], np.float64)
                 + np.asarray(dense["bias"], np.float64))
    ref = rms(v, p["unembed_norm"]["scale"]) @ np.asarray(p["unembed"]["kernel"], np.float64) + np.asarray(
        p["unembed"]["bias"], np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    assert out.shape == (2, T, cfg.vocab_size)


@pytest.mark.slow
def test_auto_encoder_learns_a_short_compression_task():
    """train_mad on compression (3 random tokens of 3 symbols and the compression token): the auto-encoder
    reconstructs far above chance (chance: (3 * 1/3 + 1) / 4 = 0.5 with the compression token given away); a
    decoder without position information could not exceed it."""
    from idattn.configs import repro
    cfg = repro.get_mqar_config("softmax", "toy").model
    r = mad.train_mad(cfg, "compression", steps=300, batch_size=32, num_train=2048, num_test=256, seq_len=4,
                      vocab_size=4, warmup=10, lr=3e-3)
    assert r["acc"] >= 0.9, r
