"""State tracking: parity and modular arithmetic without brackets, trained on short sequences and scored on longer
ones, in scaled accuracy — the protocol Mamba-3 (arXiv 2603.15569) reports its state-tracking table in, after
Grazzi et al. (ICLR 2025, "Unlocking state-tracking in linear RNNs through negative eigenvalues"), who follow
Beck et al. (xLSTM, 2024) and Delétang et al. (ICLR 2023, "Neural networks and the Chomsky hierarchy").

These are the tasks where a real, positive per-step decay cannot succeed (its state can only fade, never flip a
sign), while a rotating state can: parity is a rotation by π per 1-bit. They decide whether the selective core's
phase (`selective+phase`, θ_t) buys state tracking.

**Format** (`generate`): a sequence of L task tokens, then `=`; the one scored position is `=`, whose target is
the answer's token; positions after it are padding (the models are causal: padding after the scored position
changes nothing before it). Arrays are `(inputs [N, T], targets [N, T])` int32 with targets IGNORE (-100) except
at `=`, the MAD format (idattn.eval.mad), so `mad.score` scores them and `mad.fit_and_score` trains on them.

- parity: tokens 0 / 1 (bits), `=` 2, pad 3; the answer is (number of 1s) mod 2, as token 0 or 1. L bits.
- modular arithmetic without brackets: digits 0-4 (tokens 0-4), `+` 5, `-` 6, `*` 7, `=` 8, pad 9; an expression
  of k numbers and k − 1 operators (L = 2k − 1 tokens), evaluated with the usual precedence (`*` before `+` and
  `-`, left to right otherwise) modulo 5; the answer is its digit token. The precedence is our choice (the task
  is regular either way: a finite automaton keeps the running sum and the current product mod 5); Delétang et
  al.'s generator should be checked before comparing numbers with theirs.

**Protocol** (`PROTOCOL`): training lengths L uniform in [3, 40], test lengths uniform in [40, 256] (Grazzi et
al.'s ranges; for arithmetic, L odd); accuracy at the scored position over the test set; scaled accuracy
(acc − 1/C) / (1 − 1/C) with C the number of answers (2, 5): 0 is chance, 1 solved, negative below chance.
Mamba-3 reports it in % (arXiv 2603.15569: Mamba-3 parity 100, arithmetic without brackets 98.51; Mamba-2 0.90 and
47.81) with models, data and training of its own: set beside ours, never mixed with them.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from idattn.eval import mad
from idattn.eval.synthetic import IGNORE

PROTOCOL = {"train_lengths": (3, 40), "test_lengths": (40, 256)}
# task -> vocabulary (task tokens, `=`, pad), number of answers, the answer tokens are 0..C-1
TASKS: dict[str, dict[str, Any]] = {
    "parity": dict(vocab_size=4, classes=2, eq=2, pad=3),
    "modular_arithmetic": dict(vocab_size=10, classes=5, eq=8, pad=9),
}
PLUS, MINUS, TIMES = 5, 6, 7


def arithmetic_value(tokens) -> int:
    """The value mod 5 of digit / operator tokens (module docstring), `*` before `+` and `-`."""
    total, term, sign = 0, int(tokens[0]), 1
    for op, d in zip(tokens[1::2], tokens[2::2]):
        if op == TIMES:
            term = term * int(d) % 5
        else:
            total = (total + sign * term) % 5
            term, sign = int(d), (1 if op == PLUS else -1)
    return (total + sign * term) % 5


def _lengths(rng, n: int, lo: int, hi: int, odd: bool) -> np.ndarray:
    if odd:  # 2k - 1 in [lo, hi]
        ks = rng.integers((lo + 2) // 2, (hi + 1) // 2 + 1, n)
        return 2 * ks - 1
    return rng.integers(lo, hi + 1, n)


def generate(task: str, n: int, seed: int = 0, is_training: bool = True,
             lengths: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(inputs [n, L_max + 1], targets) of `task` at lengths uniform in `lengths` (default: the protocol's
    training or test range by `is_training`), one seeded numpy generator."""
    if task not in TASKS:
        raise ValueError(f"state tracking: task {task!r}; expected one of {sorted(TASKS)}")
    t = TASKS[task]
    lo, hi = lengths or PROTOCOL["train_lengths" if is_training else "test_lengths"]
    if not 1 <= lo <= hi:
        raise ValueError(f"state tracking: lengths=({lo}, {hi}); expected 1 <= lo <= hi")
    rng = np.random.default_rng(seed)
    arith = task == "modular_arithmetic"
    lens = _lengths(rng, n, lo, hi, odd=arith)
    T = int(lens.max()) + 1
    x = np.full((n, T), t["pad"], np.int32)
    y = np.full((n, T), IGNORE, np.int32)
    for i, L in enumerate(lens):
        if arith:
            seq = np.empty(L, np.int32)
            seq[0::2] = rng.integers(0, 5, (L + 1) // 2)
            seq[1::2] = rng.integers(PLUS, TIMES + 1, L // 2)
            ans = arithmetic_value(seq)
        else:
            seq = rng.integers(0, 2, L).astype(np.int32)
            ans = int(seq.sum()) % 2
        x[i, :L] = seq
        x[i, L] = t["eq"]
        y[i, L] = ans
    return x, y


def scaled_accuracy(acc: float, task: str) -> float:
    """(acc − 1/C) / (1 − 1/C): 0 at chance, 1 when solved."""
    c = TASKS[task]["classes"]
    return (float(acc) - 1.0 / c) / (1.0 - 1.0 / c)


def solve(inputs: np.ndarray, task: str) -> np.ndarray:
    """Exact one-hot logits [N, T, V] from the inputs alone (a model that solves the task by construction): the
    scorer's check that `generate` and `mad.score` agree."""
    t = TASKS[task]
    out = np.zeros(inputs.shape + (t["vocab_size"],), np.float32)
    for i, row in enumerate(inputs):
        L = int(np.flatnonzero(row == t["eq"])[0])
        ans = arithmetic_value(row[:L]) if task == "modular_arithmetic" else int(row[:L].sum()) % 2
        out[i, L, ans] = 1.0
    return out


def train_state_tracking(model_cfg: Any, task: str, *, steps: int, batch_size: int, lr: float,
                         weight_decay: float = 0.0, warmup: int = 50, seed: int = 0, num_train: int = 12_800,
                         num_test: int = 1_280, train_lengths=None, test_lengths=None, log_every: int = 0,
                         log=print) -> dict[str, Any]:
    """Trains `idattn.models.build_model(model_cfg)` on `task` (MAD's optimiser and step: idattn.eval.mad.
    fit_and_score) at the training lengths and scores it at the test lengths: {"acc", "scaled", "loss", ...}."""

    if TASKS[task]["vocab_size"] > model_cfg.vocab_size:
        raise ValueError(f"state tracking: task vocabulary {TASKS[task]['vocab_size']} exceeds "
                         f"model.vocab_size={model_cfg.vocab_size}")
    train_lengths = tuple(train_lengths or PROTOCOL["train_lengths"])
    test_lengths = tuple(test_lengths or PROTOCOL["test_lengths"])
    x_tr, y_tr = generate(task, num_train, seed, lengths=train_lengths)
    x_te, y_te = generate(task, num_test, seed + 100_003, lengths=test_lengths)
    res = mad.fit_and_score(model_cfg, x_tr, y_tr, x_te, y_te, steps=steps, batch_size=batch_size, lr=lr,
                            weight_decay=weight_decay, warmup=warmup, seed=seed, log_every=log_every, log=log,
                            name=task)
    res.update(task=task, scaled=scaled_accuracy(res["acc"], task), train_lengths=list(train_lengths),
               test_lengths=list(test_lengths), num_train=int(num_train), num_test=int(num_test),
               vocab_size=TASKS[task]["vocab_size"])
    return res
