"""idattn.rundir: the run directory, the contract between the trainer and everything downstream.

The trainer (idattn.train) writes it; evaluation, the studies and the model commands read it through here and
never through the trainer's modules:

    layout     file names, the saved config (load_config / save_config / diff_dicts), committed steps, best/
    integrity  per-array checkpoint digests (recorded at save, verified at every load)
    loading    load_params(workdir, step) and load_model(config, workdir): the one model loader
    schema     result files under <workdir>/eval/ (write_result / read_results, protocols)

It sits below the trainer (idattn.train imports it; it imports models, never train), because the trainer is the
first writer of the layout it defines.
"""
from idattn.rundir.layout import committed_steps, load_config  # noqa: F401
from idattn.rundir.loading import CheckpointError, load_model, load_params  # noqa: F401
