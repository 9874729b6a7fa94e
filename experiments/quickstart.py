"""Quickstart config: tiny Softmax / Interdomain / S4D-only models on the embedded King James corpus (CPU).

Run everything (three models, evaluation, table and plot; under 15 minutes on 2 CPU cores):

    pip install -e . && python -m idattn.quickstart                     # writes /tmp/idattn-quickstart/

It trains each mixer with the real trainer (`python -m idattn.train`'s code path) at context 256 on the KJV
text with a 1024-piece SentencePiece vocabulary trained on the same text, evaluates validation perplexity at
256, 512 and 896 tokens (length extrapolation past the training context), prints one table with a unigram
baseline (perplexity of the training-token frequencies) and saves `quickstart.png` (perplexity against
evaluation length). Expected: every model's perplexity finite and at least 30% below the unigram baseline.

One model alone, with the ordinary trainer entry point:

    python -m idattn.train --config=experiments/quickstart.py:interdomain --workdir=/tmp/qs-interdomain

    get_config("<mixer>")   mixer: softmax | interdomain | s4d_only | any mechanism-cube cell

This file is the documented `--config=` path; the recipe itself lives in the package (idattn/configs/quickstart.py), so that
an installed wheel runs it too. Everything here is re-exported from there.
"""
from idattn.configs import quickstart as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
