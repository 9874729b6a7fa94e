"""The model sizes: the paper's four (with their App. A.2 recipe), the CPU `tiny`, and the shape rules that
place sizes between and beyond them. This is the one size table; every other module asks it.

Shape rules, so that a scaling sweep can place sizes between and beyond the
paper's four (125M, 350M, 760M, 1.3B) without hand-written tables.

A `ShapeRule` turns a width d (d_model) into a full shape:

    num_layers L = max(min_layers, round(d / aspect))          aspect ratio d / L
    num_heads  H = d / d_h                                      head width d_h (d must be a multiple of it)
    ffn_dim    f = ceil(ffn_mult · d / ffn_round) · ffn_round   SwiGLU hidden, (2/3)·4d = 8d/3 rounded up

The paper's four sizes (GPT-3's shapes, except 32×64 heads at 1.3B) do not follow one rule; they follow one
rule per width band, which `PAPER_RULES` encodes and `tests/test_sweep.py` checks reproduces all four exactly:

    band          aspect d/L    d_h    paper size in the band
    d <= 768      64            64     125M: 768 × 12 layers, 12 heads
    d <= 1024     128/3 ≈ 42.7  64     350M: 1024 × 24, 16 heads
    d <= 1536     64            96     760M: 1536 × 24, 16 heads of 96
    d >  1536     256/3 ≈ 85.3  64     1.3B: 2048 × 24, 32 heads   (beyond: 2560 × 30, 3072 × 36, ...)

`CPU_RULE` (aspect 32, d_h 16, f rounded to 32, M = 8 modes, vocabulary 512) generates the tiny models of
the CPU study (d = 16, 32, 48, 64, 96 -> 1, 1, 2, 2, 3 layers; Python's round, half to even, then at least 1).
The number of modes M and the vocabulary are not shape rules: they stay fixed along a sweep (the paper uses
M = 64 and 32K at every size).
"""
from __future__ import annotations

import dataclasses
import math

from idattn.models.counting import count_params_closed
from idattn.models.spec import spec_from_config

PAPER_SIZES = ("125m", "350m", "760m", "1.3b")
PAPER_WIDTHS = {"125m": 768, "350m": 1024, "760m": 1536, "1.3b": 2048}
NOMINAL_PARAMS = {"125m": 125e6, "350m": 350e6, "760m": 760e6, "1.3b": 1.3e9}  # the paper's size names
# Paper App. A.2: tokens and peak LR per size (warmup 375M tokens, cosine to 1e-5, batch 128 × 4096, SSM LR cap
# 1e-3; experiments/scaling.py applies it).
PAPER_RECIPE = {
    "125m": dict(total_tokens=2_500_000_000, peak_lr=3e-3),
    "350m": dict(total_tokens=7_000_000_000, peak_lr=1.5e-3),
    "760m": dict(total_tokens=15_000_000_000, peak_lr=1e-3),
    "1.3b": dict(total_tokens=26_000_000_000, peak_lr=1e-3),
}
# A CPU-sized model for tests and smoke runs (not on a rule: 2 layers at width 64 keep one step fast).
TINY = dict(d_model=64, num_layers=2, num_heads=4, head_dim=16, ffn_dim=256, num_modes=8, vocab_size=512)
SIZE_ORDER = ("tiny", *PAPER_SIZES)


@dataclasses.dataclass(frozen=True)
class ShapeRule:
    """One shape rule; see the module docstring for the formulas."""
    aspect: float  # d_model / num_layers
    head_dim: int  # d_h
    ffn_mult: float = 8.0 / 3.0  # SwiGLU hidden before rounding: (2/3) · 4d
    ffn_round: int = 128
    min_layers: int = 1

    def shape(self, d_model: int) -> dict[str, int]:
        d = int(d_model)
        if d <= 0 or d % self.head_dim:
            raise ValueError(f"d_model={d_model}: must be a positive multiple of the rule's head width "
                             f"d_h={self.head_dim} (heads = d_model / d_h); pick e.g. "
                             f"{max(1, round(d / self.head_dim)) * self.head_dim}")
        layers = max(self.min_layers, int(round(d / self.aspect)))
        ffn = int(math.ceil(self.ffn_mult * d / self.ffn_round - 1e-9)) * self.ffn_round
        return dict(d_model=d, num_layers=layers, num_heads=d // self.head_dim, head_dim=self.head_dim,
                    ffn_dim=ffn)


# (largest width of the band, rule). Band edges are the paper's widths.
PAPER_RULES: tuple[tuple[float, ShapeRule], ...] = (
    (768, ShapeRule(aspect=64.0, head_dim=64)),
    (1024, ShapeRule(aspect=128.0 / 3.0, head_dim=64)),
    (1536, ShapeRule(aspect=64.0, head_dim=96)),
    (math.inf, ShapeRule(aspect=256.0 / 3.0, head_dim=64)),
)
PAPER_FIXED = dict(num_modes=64, vocab_size=32000)

CPU_RULE = ShapeRule(aspect=32.0, head_dim=16, ffn_round=32)
CPU_FIXED = dict(num_modes=8, vocab_size=512)


def paper_rule(d_model: int) -> ShapeRule:
    for top, rule in PAPER_RULES:
        if d_model <= top:
            return rule
    raise AssertionError("unreachable")


def paper_shape(d_model: int) -> dict[str, int]:
    """Shape at width d_model under the paper's banded rule (+ M = 64 modes and the 32K vocabulary)."""
    return {**paper_rule(int(d_model)).shape(int(d_model)), **PAPER_FIXED}


def cpu_shape(d_model: int) -> dict[str, int]:
    """Shape at width d_model under the CPU rule (+ M = 8 modes and a 512-piece vocabulary)."""
    return {**CPU_RULE.shape(int(d_model)), **CPU_FIXED}


def size_name(shape: dict[str, int]) -> str:
    """A stable short name of a shape: d<width>L<layers> (e.g. d768L12), used in run names."""
    return f"d{int(shape['d_model'])}L{int(shape['num_layers'])}"


def named_shape(size: str) -> dict[str, int]:
    """The full model shape of a named size: `tiny` or one of the paper's four (its banded rule)."""
    if size == "tiny":
        return dict(TINY)
    if size not in PAPER_WIDTHS:
        raise ValueError(f"size {size!r}: expected one of {SIZE_ORDER}")
    return paper_shape(PAPER_WIDTHS[size])


def size_label(model_cfg) -> str:
    """The named size whose (d_model, layers) a model config matches, else its `size_name` (d<width>L<layers>)."""
    key = (int(model_cfg.d_model), int(model_cfg.num_layers))
    for size in SIZE_ORDER:
        s = named_shape(size)
        if (s["d_model"], s["num_layers"]) == key:
            return size
    return size_name({"d_model": key[0], "num_layers": key[1]})


def non_embedding_params(model_cfg) -> int:
    """N of the scaling laws (Kaplan et al.'s non-embedding count): every parameter except the vocabulary
    matrices, i.e. the input embedding and the untied LM head (2·V·d). At the CPU study's sizes the LM head
    alone is larger than the smallest model's body, so counting it would bend the law at small N.
    (`idattn.models.flops_per_token` does charge the LM head's 6·V·d FLOPs per token: it is compute.)"""
    s = spec_from_config(model_cfg)
    return int(count_params_closed(model_cfg) - 2 * s.vocab_size * s.d_model)
