"""Recall: MQAR (Zoology), RULER S-NIAH-1 (passkey in filler text), phonebook lookup.

**MQAR** (multi-query associative recall; Arora et al. 2023, Zoology's `multiquery_ar`): a sequence of T tokens
starts with P key-value pairs `k1 v1 k2 v2 ...` (keys from [1, V/2), values from [V/2, V), distinct within a
sequence), followed by the P keys again as queries placed at random even offsets of the remaining T − 2P
positions (offset g drawn without replacement with probability ∝ g^(a−1), a = 0.01: queries cluster near the
pairs), every other position filled with random tokens. The label at a query's position is its value; all other
labels are −100 (ignored). Accuracy counts only query positions: `mean(argmax logits == value)`. Our generator
draws from the same distribution as Zoology's (numpy `Generator` with the Gumbel top-k trick for sampling
without replacement), not its exact samples. Zoology's standard grid is `MQAR_TRAIN_GRID` / `MQAR_TEST_GRID`
(vocabulary 8192); the CPU check in `experiments/mqar.py` trains at (64 tokens, 4 pairs) with a small
vocabulary.

**S-NIAH-1** (RULER `niah_single_1`): the haystack repeats "The grass is green. The sky is blue. The sun is
yellow. Here we go. There and back again." to the target length, one needle "One of the special magic numbers
for {key} is: {value}." (key a word, value a 7-digit number) is inserted at a uniform depth, then the question;
the answer prefix ends the prompt, and the continuation is " {value}."

**Phonebook** (Jelassi et al. 2024): N lines "{First} {Last}: {ddd-ddd-dddd}", then "What is the phone number
of {name}?\nAnswer:" and the continuation " {number}".

Scoring for both text tasks: an example is correct when the model's *greedy* continuation reproduces the answer
exactly, which is one teacher-forced pass (`is_greedy` over the answer tokens: greedy generation starts with
the answer iff every answer token is the argmax given the previous ones). This is RULER's string-match metric
restricted to an answer at the start of the generation (a lower bound of its `contains` score).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from idattn.eval.scoring import ScoreFn, TextTokenizer, loglikelihood
from idattn.eval.synthetic import IGNORE, fit
from idattn.models import build_model

# Zoology's standard MQAR grid (its `mqar` experiment config): (seq_len, num_kv_pairs, num_examples).
MQAR_TRAIN_GRID = ((64, 4, 100_000), (128, 8, 20_000), (256, 16, 20_000), (256, 32, 20_000), (256, 64, 20_000))
MQAR_TEST_GRID = ((64, 4, 1_000), (64, 8, 1_000), (64, 16, 1_000), (128, 32, 1_000), (256, 64, 1_000),
                  (512, 64, 1_000), (512, 128, 1_000), (1024, 256, 1_000))
MQAR_VOCAB = 8192


def _sample_without_replacement(rng: np.random.Generator, n_rows: int, n_items: int, k: int,
                                p: np.ndarray | None = None) -> np.ndarray:
    """[n_rows, k] indices in [0, n_items), distinct per row; weighted by p (Gumbel top-k) when given."""
    if k > n_items:
        raise ValueError(f"cannot draw {k} distinct items out of {n_items}.")
    scores = rng.gumbel(size=(n_rows, n_items))
    if p is not None:
        scores = scores + np.log(p)[None]
    return np.argsort(-scores, axis=1)[:, :k]


def mqar_generate(vocab_size: int, num_examples: int, seq_len: int, num_kv_pairs: int, *, seed: int = 0,
                  power_a: float = 0.01, random_non_queries: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(inputs [N, T] int32, labels [N, T] int32 with IGNORE off the query positions); module docstring."""
    if seq_len % 2:
        raise ValueError(f"mqar: seq_len={seq_len} must be even.")
    if vocab_size <= seq_len:
        raise ValueError(f"mqar: vocab_size={vocab_size} must exceed seq_len={seq_len} (Zoology's constraint).")
    if num_kv_pairs * 4 > seq_len:
        raise ValueError(f"mqar: num_kv_pairs={num_kv_pairs} needs seq_len >= 4 * pairs = {4 * num_kv_pairs}, "
                         f"got {seq_len}.")
    rng = np.random.default_rng(seed)
    ctx = num_kv_pairs * 2
    key_vocab = vocab_size // 2
    keys = 1 + _sample_without_replacement(rng, num_examples, key_vocab - 1, num_kv_pairs)
    values = key_vocab + _sample_without_replacement(rng, num_examples, vocab_size - key_vocab, num_kv_pairs)
    kvs = np.zeros((num_examples, ctx), np.int64)
    kvs[:, 0::2] = keys
    kvs[:, 1::2] = values
    space = (seq_len - ctx) // 2
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p = p / p.sum()
    gaps = _sample_without_replacement(rng, num_examples, space, num_kv_pairs, p)
    queries = np.zeros((num_examples, seq_len - ctx + 1), np.int64)
    np.put_along_axis(queries, gaps * 2, keys, axis=1)
    examples = np.concatenate([kvs, queries], axis=1)  # [N, T + 1]
    labels = np.full((num_examples, seq_len + 1), IGNORE, np.int64)
    np.put_along_axis(labels, gaps * 2 + ctx + 1, values, axis=1)
    inputs, labels = examples[:, :-1], labels[:, 1:]
    if random_non_queries:
        fill = rng.integers(0, vocab_size, size=inputs.shape)
        inputs = np.where(inputs == 0, fill, inputs)
    return inputs.astype(np.int32), labels.astype(np.int32)


def mqar_accuracy(logits_fn: Callable[[np.ndarray], np.ndarray], inputs: np.ndarray, labels: np.ndarray,
                  batch_size: int = 64) -> float:
    """Accuracy at query positions (labels != IGNORE) of `logits_fn(tokens [B, T]) -> logits [B, T, V]`."""
    hit = tot = 0
    for s in range(0, len(inputs), batch_size):
        x, y = inputs[s:s + batch_size], labels[s:s + batch_size]
        pred = np.asarray(logits_fn(x)).argmax(-1)
        m = y != IGNORE
        hit += int(((pred == y) & m).sum())
        tot += int(m.sum())
    return hit / max(tot, 1)


def train_mqar(model_cfg: Any, *, seq_len: int = 64, num_kv_pairs: int = 4, vocab_size: int | None = None,
               num_train: int = 20_000, num_test: int = 1_000, steps: int = 1_000, batch_size: int = 64,
               lr: float = 1e-3, weight_decay: float = 0.1, warmup: int = 50, seed: int = 0,
               test_grid: Sequence[tuple[int, int]] = (), log_every: int = 100, curve_every: int = 50,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Trains `idattn.models.build_model(model_cfg)` on MQAR with AdamW (loss at query positions only) and
    returns {"acc": test accuracy at (seq_len, num_kv_pairs), "grid": {"T/P": acc}, "loss", "steps",
    "loss_curve": [[step, batch loss], ...] every `curve_every` steps and at the last, ...}: the curve is what
    tells a seed that never leaves MQAR's loss plateau from one that leaves it late.

    Training is idattn.eval.synthetic.fit: the trainer's step (masked token cross-entropy, the update applied
    only when finite) with Zoology's optimiser: AdamW (b2 0.999, decay on every parameter), global-norm clip 1.0,
    linear warmup then cosine to lr/100."""


    V = int(vocab_size or model_cfg.vocab_size)
    if V > model_cfg.vocab_size:
        raise ValueError(f"train_mqar: vocab_size={V} exceeds model.vocab_size={model_cfg.vocab_size}.")
    model = build_model(model_cfg)
    x_tr, y_tr = mqar_generate(V, num_train, seq_len, num_kv_pairs, seed=seed)
    out = fit(model, x_tr, y_tr, steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
              warmup=warmup, seed=seed, log_every=log_every, curve_every=curve_every or steps, log=log,
              name="mqar")
    out.update(seq_len=seq_len, num_kv_pairs=num_kv_pairs, vocab_size=V)
    apply = jax.jit(lambda p, x: model.apply({"params": p}, x))
    out["acc"], out["grid"] = mqar_scores(lambda x: apply(out["params"], jnp.asarray(x)), vocab_size=V,
                                          seq_len=seq_len, num_kv_pairs=num_kv_pairs, num_test=num_test, seed=seed,
                                          test_grid=test_grid)
    return out


def mqar_metrics(seq_len: int, num_kv_pairs: int, acc: float, grid: dict[str, float]) -> dict[str, float]:
    """An MQAR run's metrics: accuracy at the training setting and at each test-grid "T/P" (`mqar@TxP/acc`)."""
    return {f"mqar@{seq_len}x{num_kv_pairs}/acc": acc, **{f"mqar@{k.replace('/', 'x')}/acc": v for k, v in grid.items()}}


def mqar_scores(logits_fn: Callable[[np.ndarray], np.ndarray], *, vocab_size: int, seq_len: int,
                num_kv_pairs: int, num_test: int, seed: int, test_grid: Sequence[tuple[int, int]] = ()
                ) -> tuple[float, dict[str, float]]:
    """(accuracy at (seq_len, num_kv_pairs), {"T/P": accuracy}) of a trained model on train_mqar's test sets: the
    same examples for the same seed, so a saved model re-scored with other code is compared like for like."""
    x_te, y_te = mqar_generate(vocab_size, num_test, seq_len, num_kv_pairs, seed=seed + 12345)
    acc = mqar_accuracy(logits_fn, x_te, y_te)
    grid = {}
    for T, P in test_grid:
        if vocab_size <= T or 4 * P > T:
            continue
        x, y = mqar_generate(vocab_size, num_test, T, P, seed=seed + 777 + T + P)
        grid[f"{T}/{P}"] = mqar_accuracy(logits_fn, x, y)
    return acc, grid


# ----------------------------------------------------------------------------------------------------------
# text recall: S-NIAH-1 and phonebook
# ----------------------------------------------------------------------------------------------------------

NIAH_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NIAH_TEMPLATE = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
                 "I will quiz you about the numbers afterwards.\n{context}\nWhat is the special magic number for "
                 "{query} mentioned in the provided text? The special magic number for {query} mentioned in the "
                 "provided text is")
NIAH_NEEDLE = "One of the special magic numbers for {key} is: {value}."
_WORDS = ("amused", "brave", "calm", "eager", "gentle", "jolly", "kind", "lively", "proud", "silly", "witty",
          "zealous", "apple", "breeze", "castle", "dragon", "ember", "forest", "garden", "harbor", "island",
          "jungle", "lantern", "meadow", "nectar", "orchid", "pepper", "quartz", "river", "saddle", "tulip",
          "violet", "walnut", "yonder")
_FIRST = ("John", "Mary", "Ahmed", "Li", "Sofia", "Carlos", "Yuki", "Olga", "Kwame", "Priya", "Lars", "Amara",
          "Diego", "Hana", "Ivan", "Zoe", "Omar", "Elena", "Tariq", "Nina")
_LAST = ("Powell", "Chen", "Garcia", "Okafor", "Smith", "Tanaka", "Novak", "Haddad", "Kumar", "Berg", "Rossi",
         "Mensah", "Silva", "Kowalski", "Dubois", "Park", "Ali", "Moreau", "Jensen", "Costa")


def niah_examples(tok: TextTokenizer, context_length: int, n: int, *, seed: int = 0
                  ) -> list[tuple[str, str]]:
    """n (prompt, answer continuation) pairs whose prompt is about `context_length` tokens (module docstring)."""
    rng = np.random.default_rng(seed)
    per = max(1, len(tok.encode(" " + NIAH_NOISE)))
    overhead = len(tok.encode(NIAH_TEMPLATE.format(context="", query="amused-apple")))
    needle_len = len(tok.encode(" " + NIAH_NEEDLE.format(key="amused-apple", value="1234567")))
    reps = max(1, (context_length - overhead - needle_len) // per)
    out = []
    for _ in range(n):
        key = f"{_WORDS[rng.integers(0, 12)]}-{_WORDS[rng.integers(12, len(_WORDS))]}"
        value = str(int(rng.integers(1_000_000, 10_000_000)))
        depth = int(rng.integers(0, reps + 1))
        sents = [NIAH_NOISE] * reps
        sents.insert(depth, NIAH_NEEDLE.format(key=key, value=value))
        out.append((NIAH_TEMPLATE.format(context=" ".join(sents), query=key), f" {value}."))
    return out


def phonebook_examples(num_entries: int, n: int, *, seed: int = 0) -> list[tuple[str, str]]:
    """n (prompt, answer continuation) pairs over phonebooks of `num_entries` distinct names."""
    rng = np.random.default_rng(seed)
    names = [f"{a} {b}" for a in _FIRST for b in _LAST]
    if num_entries > len(names):
        raise ValueError(f"phonebook: num_entries={num_entries} exceeds the {len(names)} distinct names.")
    out = []
    for _ in range(n):
        pick = rng.choice(len(names), size=num_entries, replace=False)
        nums = [f"{rng.integers(200, 1000)}-{rng.integers(100, 1000)}-{rng.integers(1000, 10000)}" for _ in pick]
        book = "\n".join(f"{names[i]}: {p}" for i, p in zip(pick, nums))
        q = int(rng.integers(0, num_entries))
        out.append((f"{book}\nWhat is the phone number of {names[pick[q]]}?\nAnswer:", f" {nums[q]}"))
    return out


def greedy_match_accuracy(score_fn: ScoreFn, tok: TextTokenizer, examples: Sequence[tuple[str, str]], *,
                          max_length: int, batch_size: int = 4, bos: bool = True) -> float:
    """Fraction of (prompt, answer) pairs whose answer tokens are all greedy (module docstring)."""
    pairs = []
    for prompt, ans in examples:
        ctx = list(tok.encode(prompt))
        cont = list(tok.encode(prompt + ans))[len(ctx):]
        pairs.append((([tok.bos_id] if bos else []) + ctx, cont))
    res = loglikelihood(score_fn, pairs, max_length=max_length, batch_size=batch_size)
    return float(np.mean([g for _, g in res]))


def run_text_recall(score_fn: ScoreFn, tok: TextTokenizer, *, niah_lengths: Sequence[int] = (1024, 2048, 4096, 8192),
                    phonebook_sizes: Sequence[int] = (16, 32, 64, 128), n: int = 200, max_length: int | None = None,
                    batch_size: int = 1, seed: int = 0) -> tuple[dict[str, float], dict[str, Any]]:
    """Metrics `niah@<len>/acc` and `phonebook@<entries>/acc` (fractions), details with prompt lengths."""
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {"n": n}
    for L in niah_lengths:
        ex = niah_examples(tok, L, n, seed=seed + L)
        cap = max(len(tok.encode(p + a)) + 2 for p, a in ex)
        metrics[f"niah@{L}/acc"] = greedy_match_accuracy(score_fn, tok, ex, max_length=max_length or cap,
                                                         batch_size=batch_size)
        details[f"niah@{L}"] = {"tokens": cap}
    for N in phonebook_sizes:
        ex = phonebook_examples(N, n, seed=seed + N)
        cap = max(len(tok.encode(p + a)) + 2 for p, a in ex)
        metrics[f"phonebook@{N}/acc"] = greedy_match_accuracy(score_fn, tok, ex, max_length=max_length or cap,
                                                              batch_size=batch_size)
        details[f"phonebook@{N}"] = {"tokens": cap}
    return metrics, details
