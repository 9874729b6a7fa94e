"""The run plan's derived steps (idattn.train.plan.RunPlan.from_config) for every paper recipe, against the paper.

The paper's numbers, typed here from ../shared/PAPER.md (and SPEC.md, which repeats them): tokens 2.5B / 7B /
15B / 26B for 125M / 350M / 760M / 1.3B, batch 524,288 tokens (128 × 4096), linear warmup over 375M tokens,
peak LR 3e-3 / 1.5e-3 / 1e-3 / 1e-3, cosine to 1e-5, the SSM group's LR capped at 1e-3.
"""
from __future__ import annotations

import pytest

from idattn.configs.scaling import get_config
from idattn.models.spec import cube_cells
from idattn.train.plan import RunPlan

PAPER_TOKENS = {"125m": 2.5e9, "350m": 7e9, "760m": 15e9, "1.3b": 26e9}
PAPER_PEAK_LR = {"125m": 3e-3, "350m": 1.5e-3, "760m": 1e-3, "1.3b": 1e-3}
PAPER_BATCH_TOKENS = 524_288
PAPER_WARMUP_TOKENS = 375e6
MIXERS = ["softmax", "interdomain", "s4d_only", *cube_cells()]


def _plan(arg: str, **train) -> RunPlan:
    cfg = get_config(arg)
    cfg.data.source = "kjv"  # the paper sizes leave the source unset (refused until chosen); any source will do
    cfg.train.update(train)
    return RunPlan.from_config(cfg)


@pytest.mark.parametrize("size", list(PAPER_TOKENS))
def test_paper_recipes_train_on_the_papers_token_budget(size):
    """Every mixer at every paper size: 524,288 tokens a step; the fewest steps that reach the paper's token count
    (so the run sees its budget, less than one step over); warmup within half a step of 375M tokens; the LR."""
    for mixer in MIXERS:
        p = _plan(f"{mixer},{size}")
        tokens = PAPER_TOKENS[size]
        assert p.tokens_per_step == PAPER_BATCH_TOKENS and p.batch_size * p.seq_len == PAPER_BATCH_TOKENS
        assert p.num_steps * p.tokens_per_step >= tokens > (p.num_steps - 1) * p.tokens_per_step, (mixer, p.num_steps)
        assert abs(p.warmup_steps * p.tokens_per_step - PAPER_WARMUP_TOKENS) <= p.tokens_per_step / 2, (
            mixer, p.warmup_steps)
        assert (p.peak_lr, p.end_lr, p.ssm_lr_cap) == (PAPER_PEAK_LR[size], 1e-5, 1e-3), mixer
    # the numbers a reader checks by hand: ceil(2.5e9 / 524288) = 4769 at 125M, round(375e6 / 524288) = 715
    if size == "125m":
        assert (p.num_steps, p.warmup_steps) == (4769, 715)


def test_explicit_steps_win_and_warmup_is_capped():
    """train.num_steps > 0 replaces the token budget; train.warmup_steps >= 0 replaces warmup_tokens; a warmup
    longer than the run is cut to the run."""
    p = _plan("interdomain,125m", num_steps=100, warmup_steps=-1)
    assert p.num_steps == 100 and p.warmup_steps == 100  # 715 warmup steps capped at 100
    p = _plan("interdomain,125m", warmup_steps=7)
    assert p.num_steps == 4769 and p.warmup_steps == 7
    p = _plan("softmax,1.3b", batch_size=64)  # half the batch: twice the steps for the same tokens
    assert p.tokens_per_step == 64 * 4096 and p.num_steps * 64 * 4096 >= 26e9 > (p.num_steps - 1) * 64 * 4096
