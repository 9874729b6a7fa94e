"""Parameter count, Table-3 reconciliation and state budget of an experiment config.

    python -m idattn.params --config=experiments/scaling.py:interdomain,1.3b

Prints the parameters by module (from `jax.eval_shape` of the real model: nothing is allocated, so 1.3B is
instant), the recurrent state per layer, the itemised deliberate differences from the paper's
parameterisation (ours − paper), and as its last two lines `params: <int>` and `table3_equivalent: <int>`
(= params − Σ differences; equals the paper's Table 3 for softmax, interdomain and s4d_only at the paper
sizes, and for every mechanism-cube cell at 125M the paper's count inside App. B.1's range
[135,379,344, 135,462,288], whose ends are dualkv-linear-* and generic-query-*). Works for every mixer name:

    python -m idattn.params --config=experiments/scaling.py:generic-query-norope,125m
"""
from __future__ import annotations

from absl import app
from ml_collections import config_flags

from idattn.configs.flags import run_app  # a --config.<key> typo: one readable line
from idattn.models.counting import report


def main(argv, config_flag):
    del argv
    if config_flag.value is None:
        raise app.UsageError("--config is required, e.g. --config=experiments/scaling.py:interdomain,1.3b")
    print("\n".join(report(config_flag.value.model)))


if __name__ == "__main__":
    # Defined here, not at import: `report` is imported by tests and tools beside other CLIs that define --config.
    _CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config, e.g. "
                                              "experiments/scaling.py:softmax,125m", lock_config=False)
    run_app(lambda argv: main(argv, _CONFIG))
