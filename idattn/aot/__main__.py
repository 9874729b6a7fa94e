"""`python -m idattn.aot --config=<experiment config> --topology=<name> [--num_slices=N] [--config.key=value ...]`

Compiles the real train, eval and one decode step for the named topology on this host (a CPU machine is
enough; TPU targets need libtpu: `pip install -e ".[tpu]"`) and ends with one line
`aot: <config> on <topology> mesh <d>x<f>x<t>: <GiB> per chip of <HBM GiB>: fits|does not fit`.
Exit status 0 fits, 1 does not fit, 2 did not compile. Details: idattn/aot/compile.py.
"""
from __future__ import annotations

import os
import sys

# Compile-only: never grab a local accelerator; several compile processes may share libtpu.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from idattn.aot.compile import run  # noqa: E402
from idattn.configs import resolve_argv  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (experiments/<file>.py[:arg]).",
                                          lock_config=False)
_TOPOLOGY = flags.DEFINE_string("topology", None, "Target: v5p-128, v4-256, v6e-64, v5p:2x2x1, h100x8, ...")
_SLICES = flags.DEFINE_integer("num_slices", 1, "TPU slices joined by DCN (data parallel across them).")
_STEPS = flags.DEFINE_list("steps", ["train", "eval", "decode"], "Steps to compile.")
_JSON = flags.DEFINE_string("json", None, "Also write the numbers to this JSON file.")
flags.mark_flags_as_required(["config", "topology"])


def _config_name() -> str:
    path = flags.FLAGS["config"].value
    for a in sys.argv[1:]:
        if a.startswith("--config="):
            return a.split("=", 1)[1]
    return str(path)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    rc = run(_CONFIG.value, _config_name(), _TOPOLOGY.value, num_slices=_SLICES.value, steps=tuple(_STEPS.value),
             json_path=_JSON.value, log=lambda m: print(m, flush=True))
    sys.exit(rc)


def cli(argv=None) -> int:
    argv = resolve_argv(list(argv)) if argv is not None else None
    if argv is None:
        sys.argv[:] = resolve_argv(sys.argv)
    try:
        app.run(main, argv=argv)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.argv[:] = resolve_argv(sys.argv)  # packaged recipes from any folder (idattn.configs)
    app.run(main)
