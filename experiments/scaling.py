"""Scaling-study configs: one mixer at one paper size, with the paper's full training recipe (App. A.2).

    get_config("<mixer>,<size>")
      mixer: softmax | interdomain | s4d_only | a mechanism-cube cell <input>-<readout>-<rope>
             (input: dualkv | generic; readout: query | linear; rope: rope | norope), e.g. generic-query-rope
      size:  tiny | 125m | 350m | 760m | 1.3b   (tiny: a CPU-sized model for tests and smoke runs)

Data: every size but `tiny` leaves `data.source` unset, and the trainer refuses to start until it is chosen:
prepared shards (`--config.data.source=arrayrecord --config.data.path=<folder>`, written by
`python -m idattn.data.prepare`, docs/data.md) or, for a smoke run only, `--config.data.source=kjv`.

Run (ml_collections config_flags, big_vision style):
    python -m idattn.train  --config=experiments/scaling.py:interdomain,125m --workdir=/tmp/run \
        --config.data.source=arrayrecord --config.data.path=/data/idattn-mistral
    python -m idattn.params --config=experiments/scaling.py:s4d_only,1.3b
    python -m idattn.train  --config=experiments/scaling.py:softmax,tiny --workdir=/tmp/tiny \
        --config.train.total_tokens=100000

This file is the documented `--config=` path; the recipe itself lives in the package (idattn/configs/scaling.py), so that
an installed wheel runs it too. Everything here is re-exported from there.
"""
from idattn.configs import scaling as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
