"""Reproduction configs: the paper's tables at the scale of a 2-core CPU (`python -m idattn.repro`).

Run (every table, or one of ppl | cube | length | recall; `--toy` for a smoke-test size):

    python -m idattn.repro all --root=/tmp/idattn-repro          # writes <root>/<table>.md and <table>.json
    python -m idattn.repro ppl --root=/tmp/idattn-repro --toy     # ~4 min: the smoke test's size, no verdicts

What it should produce (docs/reproduction.md holds a measured run):
  ppl     Fig. 2 (125M point): validation perplexity of Softmax, Interdomain and S4D-only, 3 seeds each, with the
          paper's 125M perplexities beside ours; the paper expects Interdomain <= Softmax < S4D-only.
  cube    Table 4: all eight cells of the mechanism cube and Softmax, 3 seeds each; the paper expects the
          readout (query vs linear) to be the dominant axis and RoPE to barely matter.
  length  Table 2: perplexity at 1x, 2x, 3.5x and 4x the training context, for the context-scaled Δ range
          (the default of every table) and the paper's Δ range, side by side; the paper expects Interdomain
          and S4D-only flat past the training length and Softmax to degrade.
  recall  Table 9 at small size: MQAR (Zoology's task, trained per mixer, 3 seeds) and the paper's text suites
          (S-NIAH-1 and phonebook, at contexts of this scale) scored on the `ppl` models.

Every language model is trained by the real trainer (`idattn.train.run`, the path of `python -m idattn.train`)
on the embedded King James corpus with a 1024-piece SentencePiece vocabulary trained on its training split,
with one recipe for every mixer (nothing is tuned per mixer, as in the paper).

One run alone, with the ordinary trainer entry point:

    python -m idattn.train --config=experiments/repro.py:interdomain,small,scaled,0 --workdir=/tmp/r

    get_config("<mixer>,<size>,<dt>,<seed>")
      mixer: softmax | interdomain | s4d_only | a mechanism-cube cell <input>-<readout>-<rope>; a `+sum`
             suffix (e.g. s4d_only+sum) sets model.linear_contraction = "sum" (c_h = 1ᵀ C_h, not the mean)
      size:  small (the reproduction) | toy (smoke test) | ladder128 | ladder192 (the scale ladder, LADDER)
      dt:    scaled (Δ range scaled with the context; the default) | paper (the paper's Δ range)
      seed:  0, 1, ... (model init seed 42 + seed, data order seed `seed`)

Time scales (docs/evaluation.md). The slowest S4D mode remembers about 1/(Δ_min·|Re A|) tokens (S4D-Inv: Re A = -1/2).
The paper trains at T = 4096 with Δ ∈ [1e-3, 1e-1]: Δ_min·T = 4.1, so the slowest mode (~2,000 tokens) settles
inside the training context. `scaled` keeps Δ·T_train as in the paper: Δ ∈ [1e-3, 1e-1]·4096/T_train
(at T_train = 256: [0.016, 1.6]; Δ·|Re A| is capped at κ = 0.25 by the layer, so the fastest modes remember
about 4 tokens instead of 1.25). `paper` keeps the paper's Δ range, whose slow modes never settle at 256 tokens.
Softmax has no Δ: its runs are the same in both.
"""
from __future__ import annotations

import ml_collections

from idattn.configs import base_config
from idattn.models.spec import apply_mixer_name

PAPER_DT = (1e-3, 1e-1)  # the paper's Δ range (App. A.2 / S4D default)
PAPER_T_TRAIN = 4096

# Model and schedule per size. `small`: 4 layers, d 64, context 256, 200 steps x 8 x 256 = 410K tokens (~0.4 epoch
# of the KJV training split). Sized for the CPU budget: on the shared 2-core machine (load ~16) one run takes
# ~5 min (1.45 s/step, ~1 min of compilation), and the whole reproduction is ~25 such runs. `toy`: seconds, for
# the smoke test.
SIZES = {
    "small": dict(model=dict(vocab_size=1024, d_model=64, num_layers=4, num_heads=4, head_dim=16, ffn_dim=192,
                             num_modes=16),
                  seq_len=256, batch_size=8, num_steps=200, warmup_steps=20, chunk_size=64, tokenizer="train:1024"),
    "toy": dict(model=dict(vocab_size=512, d_model=32, num_layers=1, num_heads=2, head_dim=16, ffn_dim=64,
                           num_modes=4),
                seq_len=32, batch_size=4, num_steps=4, warmup_steps=1, chunk_size=16, tokenizer="train:512"),
}

# The scale ladder (issue 20, item 2): the `ppl` protocol (Softmax, Interdomain, S4D-only, every seed) at three
# compute points, `small` first. Tokens: 200 x 8 x 256 = 0.41M, 600 x 8 x 256 = 1.23M, 2000 x 8 x 256 = 4.10M
# (3.1 epochs of the 1.3M-token KJV training split: the top point repeats data; the stdlib corpus, ~3.5M tokens of
# training files, would not, once the data pipeline can read it). Compute per run 6·N·D: 8.8e11, 8.4e12 (9.6x),
# 8.2e13 (93x) FLOPs for Interdomain (N from idattn.models.counting). Cost, an *estimate* (nothing above `small`
# has been run): the `small` runs took 46-114 s of training on 2 idle cores (docs/reproduction.md); scaled by
# compute, 7-18 min per ladder128 run and 1.2-3 h per ladder192 run, so ~3 CPU-hours hold the bottom two points
# (3 mixers x 3 seeds each), not the top one.
LADDER = ("small", "ladder128", "ladder192")
SIZES["ladder128"] = dict(model=dict(vocab_size=1024, d_model=128, num_layers=4, num_heads=8, head_dim=16,
                                     ffn_dim=384, num_modes=16),
                          seq_len=256, batch_size=8, num_steps=600, warmup_steps=60, chunk_size=64,
                          tokenizer="train:1024")
SIZES["ladder192"] = dict(model=dict(vocab_size=1024, d_model=192, num_layers=6, num_heads=12, head_dim=16,
                                     ffn_dim=576, num_modes=16),
                          seq_len=256, batch_size=8, num_steps=2000, warmup_steps=200, chunk_size=64,
                          tokenizer="train:1024")


def ladder_tokens(size: str) -> int:
    z = SIZES[size]
    return int(z["num_steps"]) * int(z["batch_size"]) * int(z["seq_len"])


# Length table: evaluation lengths as multiples of the training context (the paper's 1x / 2x / 3.5x, and 4x).
LENGTH_RATIOS = (1.0, 2.0, 3.5, 4.0)
# Held-out tokens scored at every length (the same stream prefix at every length; a multiple of every length).
EVAL_TOKENS = {"small": 7 * 1024 * 4, "toy": 7 * 128 * 2, "ladder128": 7 * 1024 * 4, "ladder192": 7 * 1024 * 4}

# Recall at small size. MQAR: Zoology's task with the `experiments/mqar.py` model and recipe (d 64, 2 layers,
# 256-token vocabulary, the paper's Δ range; 3000 steps x 64, AdamW at 1e-3, 100 warmup steps, cosine), the same
# for every mixer. Its recurrent mixers need the whole schedule: Interdomain's loss stays flat until a phase
# transition between steps ~1,000 and 2,000 (docs/evaluation.md), and 300 x 32 at 3e-3 (this table's first
# recipe) left both recurrent mixers at chance. ~5-10 min per run on 2 idle cores. Text suites: S-NIAH-1 at
# contexts up to 4x the LM's training length, phonebook with 4 / 8 / 16 entries, `n` examples each, on the seed-0
# `ppl` models (the ordering claim (e) is judged on MQAR's two seeds).
MQAR = {
    "small": dict(seq_len=64, num_kv_pairs=4, steps=3000, batch_size=64, lr=1e-3, warmup=100, num_train=20_000,
                  num_test=1000, test_grid=((64, 8), (128, 16))),
    "toy": dict(seq_len=16, num_kv_pairs=2, steps=3, batch_size=4, lr=1e-3, warmup=1, num_train=64, num_test=16,
                test_grid=()),
}
TEXT_RECALL = {
    "small": dict(niah_ratios=(1.0, 2.0, 4.0), phonebook_sizes=(4, 8, 16), n=20, seeds=(0,)),
    "toy": dict(niah_ratios=(4.0,), phonebook_sizes=(2,), n=2, seeds=(0,)),
}

# Seeds per cell: at least 3 (issue 20: a verdict needs an interval, and a t interval over per-seed log-ratios needs
# n >= 3 to be finite enough to exclude anything; the verdict rule refuses to judge on fewer, see
# idattn/studies/repro_verdicts.py). Seed s varies both the init (42 + s) and the data order (shuffle seed s).
SEEDS = {"small": (0, 1, 2), "toy": (0, 1, 2), "ladder128": (0, 1, 2), "ladder192": (0, 1, 2)}

# MAD (idattn.eval.mad; Poli et al. 2024): their protocol's width and depth (d_model 128, 4 layers = 2 blocks of
# mixer + channel mixer), AdamW at 5e-4 (the middle of their LR grid; they sweep {1e-4, 5e-4, 1e-3} x wd {0, 0.1}
# and keep the best, we run one point), batch 128. MAD trains 200 epochs of 12,800 examples (20,000 steps); STEPS
# is what a CPU affords and is stated with every number. Recurrent state budget of the fixed-state mixers, per
# layer (idattn.models.counting.state_budget, the paper's Table 5 convention): 8 heads x 2·(16 + 16)·16 = 8,192
# real numbers; Softmax's KV cache grows by 2·H·d_h = 256 numbers per token per layer instead (at MAD's length
# 128 that is 32,768, 4x the fixed state).
MAD = dict(model=dict(d_model=128, num_layers=4, num_heads=8, head_dim=16, ffn_dim=384, num_modes=16),
           steps=2000, batch_size=128, lr=5e-4, weight_decay=0.0, warmup=50,
           tasks=("in_context_recall", "fuzzy_recall", "noisy_recall", "selective_copying", "memorization"))
# `toy`: the smoke size of `python -m idattn.repro mad --toy` (short sequences, a few steps; numbers mean nothing)
MAD_SIZES = {"small": MAD,
             "toy": dict(model=dict(d_model=32, num_layers=1, num_heads=2, head_dim=16, ffn_dim=64, num_modes=4),
                         steps=2, batch_size=4, lr=1e-3, weight_decay=0.0, warmup=1, num_train=16, num_test=8,
                         tasks=("in_context_recall", "memorization"),
                         task_overrides={"in_context_recall": {"seq_len": 16}, "memorization": {"seq_len": 8}})}
# Measured cost: Softmax at this size on in-context recall, ~7 s per step on the shared 2-core CPU (load ~4), so
# ~4 h per run and ~500 CPU-hours for 5 tasks x 9 cells x 3 seeds: meant for an accelerator.
# compression is not in `tasks`: MAD scores it through an auto-encoder head (a decoder from the last position)
# that the decoder LM does not have, and idattn.eval.mad.train_mad refuses it rather than score it differently.

# The Δ range of the `ppl` table's verdicts, the cube and the text-recall models (the `ppl` and `length` tables
# show both). "paper": measured at this size, the context-scaled range leaves Interdomain 1.5x worse than
# Softmax (seed 0: ppl 98.7 scaled vs 62.2 paper, Softmax 66.9) where the paper's range does not, so the cube
# uses the paper's own recipe for every mixer; the `length` table keeps both side by side (docs/evaluation.md).
PRIMARY_DT = "paper"

# Extra rows of the `ppl` table (primary Δ, every seed): the linear readout with the mode *sum* instead of the
# default mean (docs/model.md). The paper does not give the readout's scale, and at this size it decides claim
# (a), so both are shown; the verdicts use the default (mean) row, as decided before these runs.
PPL_VARIANTS = ("s4d_only+sum",)


def dt_range(kind: str, seq_len: int) -> tuple[float, float]:
    """(dt_min, dt_max): the paper's range, or scaled so that Δ·T_train equals the paper's."""
    if kind == "paper":
        return PAPER_DT
    if kind == "scaled":
        s = PAPER_T_TRAIN / float(seq_len)
        return PAPER_DT[0] * s, PAPER_DT[1] * s
    raise ValueError(f"experiments/repro.py: dt {kind!r}; expected 'scaled' or 'paper'")


def get_config(arg: str = "interdomain,small,scaled,0") -> ml_collections.ConfigDict:
    parts = [p.strip() for p in str(arg).split(",")]
    if len(parts) != 4:
        raise ValueError(f"experiments/repro.py: got {arg!r}; expected '<mixer>,<size>,<dt>,<seed>', "
                         f"e.g. interdomain,small,scaled,0")
    mixer, size, dt, seed = parts[0], parts[1].lower(), parts[2].lower(), int(parts[3])
    mixer, _, variant = mixer.partition("+")
    if variant not in ("", "sum"):
        raise ValueError(f"experiments/repro.py: mixer suffix {'+' + variant!r}; expected none or '+sum'")
    if size not in SIZES:
        raise ValueError(f"experiments/repro.py: size {size!r}; expected one of {tuple(SIZES)}")
    z = SIZES[size]
    c = base_config()
    m = c.model
    m.update(z["model"])
    apply_mixer_name(m, mixer)
    if variant == "sum":
        m.linear_contraction = "sum"
    m.dt_min, m.dt_max = dt_range(dt, z["seq_len"])
    m.dtype = "float32"  # CPU: bf16 matmuls are emulated and slow
    m.remat = "none"
    m.impl = "chunked"
    # XLA attention: what runs on CPU anyway; "auto" also traces the TPU flash kernel under
    # lax.platform_dependent, whose backward refuses the toy size's short sequences
    m.attn_impl = "xla"
    m.chunk_size = z["chunk_size"]
    c.seed = 42 + seed

    c.data.source = "kjv"
    c.data.tokenizer = z["tokenizer"]
    c.data.seq_len = z["seq_len"]
    c.data.prefetch = 0
    c.data.shuffle_seed = seed

    t = c.train
    t.batch_size = z["batch_size"]
    t.num_steps = z["num_steps"]
    t.warmup_steps = z["warmup_steps"]
    t.peak_lr = 3e-3  # the paper's 125M peak LR; SSM group capped at 1e-3 as in the paper
    t.end_lr = 1e-4
    t.ssm_lr_cap = 1e-3
    t.log_every = 50
    t.eval_every = 0  # validation at the end only (the repro scores its own held-out stream)
    t.eval_batches = 4
    t.checkpoint_every = 100
    t.keep_last = 1
    t.async_checkpoint = False

    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    return c


def get_mqar_config(mixer: str, size: str = "small") -> ml_collections.ConfigDict:
    """The MQAR model (experiments/mqar.py's: d 64, 2 layers, 256-token vocabulary) and task at this size."""
    from idattn.configs.mqar import get_config as mqar_config
    c = mqar_config(mixer)
    if size == "toy":
        c.model.update(dict(d_model=32, num_layers=1, num_heads=2, head_dim=16, ffn_dim=64, num_modes=4))
        c.model.chunk_size = 8
    c.model.attn_impl = "xla"  # as in get_config
    c.mqar.update(MQAR[size])
    return c
