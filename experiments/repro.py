"""Reproduction configs: the paper's tables at the scale of a 2-core CPU (`python -m idattn.repro`).

Run (every table, or one of ppl | cube | length | recall; `--toy` for a smoke-test size):

    python -m idattn.repro all --root=/tmp/idattn-repro          # writes <root>/<table>.md and <table>.json
    python -m idattn.repro ppl --root=/tmp/idattn-repro --toy     # seconds: the smoke test's size

What it should produce (docs/reproduction.md holds a measured run):
  ppl     Table 2 / Fig. 2: validation perplexity of Softmax, Interdomain and S4D-only, 2 seeds each, with the
          paper's 125M perplexities beside ours; the paper expects Interdomain <= Softmax < S4D-only.
  cube    Table 4: all eight cells of the mechanism cube and Softmax, 2 seeds each; the paper expects the
          readout (query vs linear) to be the dominant axis and RoPE to barely matter.
  length  Tables 2 / 8: perplexity at 1x, 2x, 3.5x and 4x the training context, for the context-scaled Δ range
          (the default of every table) and the paper's Δ range, side by side; the paper expects Interdomain
          and S4D-only flat past the training length and Softmax to degrade.
  recall  Table 9 at small size: MQAR (Zoology's task, trained per mixer, 2 seeds) and the paper's text suites
          (S-NIAH-1 and phonebook, at contexts of this scale) scored on the `ppl` models.

Every language model is trained by the real trainer (`idattn.train.run`, the path of `python -m idattn.train`)
on the embedded King James corpus with a 1024-piece SentencePiece vocabulary trained on its training split,
with one recipe for every mixer (nothing is tuned per mixer, as in the paper).

One run alone, with the ordinary trainer entry point:

    python -m idattn.train --config=experiments/repro.py:interdomain,small,scaled,0 --workdir=/tmp/r

    get_config("<mixer>,<size>,<dt>,<seed>")
      mixer: softmax | interdomain | s4d_only | a mechanism-cube cell <input>-<readout>-<rope>; a `+sum`
             suffix (e.g. s4d_only+sum) sets model.linear_contraction = "sum" (c_h = 1ᵀ C_h, not the mean)
      size:  small (the reproduction) | toy (smoke test)
      dt:    scaled (Δ range scaled with the context; the default) | paper (the paper's Δ range)
      seed:  0, 1, ... (model init seed 42 + seed, data order seed `seed`)

Time scales (SPEC section 7). The slowest S4D mode remembers about 1/(Δ_min·|Re A|) tokens (S4D-Inv: Re A = -1/2).
The paper trains at T = 4096 with Δ ∈ [1e-3, 1e-1]: Δ_min·T = 4.1, so the slowest mode (~2,000 tokens) settles
inside the training context. `scaled` keeps Δ·T_train as in the paper: Δ ∈ [1e-3, 1e-1]·4096/T_train
(at T_train = 256: [0.016, 1.6]; Δ·|Re A| is capped at κ = 0.25 by the layer, so the fastest modes remember
about 4 tokens instead of 1.25). `paper` keeps the paper's Δ range, whose slow modes never settle at 256 tokens.
Softmax has no Δ: its runs are the same in both.

This file is the documented `--config=` path; the recipe itself lives in the package (idattn/configs/repro.py), so that
an installed wheel runs it too. Everything here is re-exported from there.
"""
from idattn.configs import repro as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
