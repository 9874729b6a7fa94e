"""State-tracking tasks (idattn.eval.state_tracking): instances against independent rules (parity by counting,
arithmetic by Python's own expression evaluator), the protocol's lengths, the exact solver scoring 100% through
the scorer a model is scored with, chance at scaled accuracy 0, and (slow) the training path."""
from __future__ import annotations

import numpy as np
import pytest

from idattn.eval import mad
from idattn.eval import state_tracking as st


def _scored(x, y, eq):
    """(L, the answer) per row: the one scored position must be `=`."""
    out = []
    for row, tgt in zip(x, y):
        pos = np.flatnonzero(tgt != st.IGNORE)
        assert len(pos) == 1 and row[pos[0]] == eq, (row, tgt)
        out.append((int(pos[0]), int(tgt[pos[0]])))
    return out


def test_parity_instances_follow_the_rule_and_the_protocol_lengths():
    for training, (lo, hi) in ((True, (3, 40)), (False, (40, 256))):
        x, y = st.generate("parity", 300, seed=1, is_training=training)
        got = _scored(x, y, eq=2)
        lens = [L for L, _ in got]
        assert min(lens) >= lo and max(lens) <= hi and len(set(lens)) > 20
        assert x.shape[1] == max(lens) + 1
        for row, (L, ans) in zip(x, got):
            bits = "".join(str(int(b)) for b in row[:L])
            assert set(bits) <= {"0", "1"} and ans == bits.count("1") % 2
            assert (row[L + 1:] == 3).all()  # padding after `=`
        assert 0.35 < np.mean([a for _, a in got]) < 0.65


def test_modular_arithmetic_follows_pythons_own_evaluation_mod_5():
    """Every instance's answer equals eval() of the expression string modulo 5 (Python's precedence: `*` before
    `+` and `-`), lengths odd within the protocol's ranges."""
    sym = {5: "+", 6: "-", 7: "*"}
    for training, (lo, hi) in ((True, (3, 40)), (False, (40, 256))):
        x, y = st.generate("modular_arithmetic", 200, seed=2, is_training=training)
        for row, (L, ans) in zip(x, _scored(x, y, eq=8)):
            assert lo <= L <= hi and L % 2 == 1
            expr = "".join(str(int(t)) if i % 2 == 0 else sym[int(t)] for i, t in enumerate(row[:L]))
            assert all(int(t) < 5 for t in row[:L:2])
            assert ans == eval(expr) % 5, expr  # noqa: S307 (digits and + - * only)
    assert st.arithmetic_value([2, 5, 3, 7, 4]) == (2 + 3 * 4) % 5
    assert st.arithmetic_value([2, 6, 3, 7, 4, 5, 1]) == (2 - 3 * 4 + 1) % 5


def test_exact_solver_scores_100_and_chance_scores_0_scaled():
    for task in st.TASKS:
        x, y = st.generate(task, 64, seed=3, is_training=False)
        assert mad.score(lambda b: st.solve(b, task), x, y) == 1.0
        assert st.scaled_accuracy(1.0, task) == 1.0
        c = st.TASKS[task]["classes"]
        assert st.scaled_accuracy(1.0 / c, task) == pytest.approx(0.0)
        const = lambda b: np.eye(st.TASKS[task]["vocab_size"], dtype=np.float32)[np.zeros(b.shape, int)]  # noqa
        assert abs(st.scaled_accuracy(mad.score(const, x, y), task)) < 0.35  # always answering 0: near chance
    with pytest.raises(ValueError, match="state tracking: task 'copying'"):
        st.generate("copying", 1)
    with pytest.raises(ValueError, match=r"lengths=\(5, 3\)"):
        st.generate("parity", 1, lengths=(5, 3))


@pytest.mark.slow
def test_train_state_tracking_runs_the_trainer_step_and_scores_longer_sequences():
    """A few steps of a tiny selective+phase model on parity: trains at 3-8 tokens, scores at 8-24 (the test
    set is longer than any training sequence), gives a finite loss, acc in [0, 1] and scaled = (acc − ½) / ½."""
    from idattn.configs import repro
    cfg = repro.get_mqar_config("interdomain-selective+phase", "toy").model
    r = st.train_state_tracking(cfg, "parity", steps=3, batch_size=4, lr=1e-3, warmup=1, num_train=32,
                                num_test=16, train_lengths=(3, 8), test_lengths=(8, 24))
    assert r["steps"] == 3 and np.isfinite(r["loss"]) and 0.0 <= r["acc"] <= 1.0
    assert r["seq_len"] <= 9 and r["scaled"] == pytest.approx((r["acc"] - 0.5) / 0.5)
