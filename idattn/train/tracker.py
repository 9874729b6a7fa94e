"""Experiment trackers beside TensorBoard: Weights & Biases (optional: `pip install -e ".[wandb]"`).

    --config.train.wandb_project=<project>        # '' (the default): no tracker
    --config.train.wandb_mode=offline             # offline (default) | online
    --config.train.wandb_entity=<team>            # optional

Every record the trainer writes to metrics.jsonl is logged to the tracker too, under `<prefix>/<key>` at its
step (`train/loss`, `train/tokens_per_sec`, `val/loss`, ...), together with the resolved config. Offline mode
writes the run under `<workdir>/wandb/` and needs no network or account (`wandb sync <workdir>/wandb/offline-run-*`
uploads it later); online mode needs `WANDB_API_KEY` or `wandb login`.

The W&B run id is stored in `<workdir>/wandb_run_id` when the run first starts, so a resumed run (after a
preemption, with `resume="allow"`) continues the same W&B run. W&B keeps a step's first logged value: the steps a
resumed run repeats (from its checkpoint up to where the killed run had logged) keep the killed run's values there,
while metrics.jsonl and TensorBoard hold the rerun's (the `rewind` feature of W&B that would replace them is
online-only). Only process 0 logs, behind the workdir lease like every other write.
"""
from __future__ import annotations

import math
import os
import uuid
from typing import Any

from idattn.configs import ConfigError

MODES = ("offline", "online")
RUN_ID_FILE = "wandb_run_id"


def check_tracker_config(train_cfg) -> None:
    """One-line refusals for the tracker keys (idattn.train.validate calls this before anything is written)."""
    project = str(train_cfg.get("wandb_project", "") or "")
    mode = str(train_cfg.get("wandb_mode", "offline"))
    if mode not in MODES:
        raise ConfigError(f"config.train.wandb_mode={mode!r}: expected one of {MODES}; set "
                          "--config.train.wandb_mode=offline (written under <workdir>/wandb, synced later)")
    if project:
        try:
            import wandb  # noqa: F401  # local: the optional wandb extra, checked when configured
        except ImportError:
            raise ConfigError(f"config.train.wandb_project={project!r}: needs the wandb package, which is not "
                              "installed; pip install -e \".[wandb]\", or set --config.train.wandb_project='' "
                              "(no tracker)") from None


class WandbTracker:
    """`log(metrics, step)` / `close()` over one W&B run; built by `make_tracker`."""

    def __init__(self, run):
        self._run = run

    def log(self, metrics: dict[str, Any], step: int) -> None:
        clean = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        if clean:
            self._run.log(clean, step=int(step))

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def make_tracker(config, workdir: str) -> WandbTracker | None:
    """The configured tracker for this run (None when `train.wandb_project` is empty). Call on process 0 only."""
    t = config.train
    project = str(t.get("wandb_project", "") or "")
    if not project:
        return None
    import wandb  # local: the optional wandb extra (train.wandb_project)
    id_path = os.path.join(workdir, RUN_ID_FILE)
    if os.path.exists(id_path):
        with open(id_path) as f:
            run_id = f.read().strip()
    else:
        run_id = uuid.uuid4().hex[:12]
        with open(id_path, "w") as f:
            f.write(run_id + "\n")
    run = wandb.init(project=project, entity=str(t.get("wandb_entity", "") or "") or None,
                     mode=str(t.get("wandb_mode", "offline")), dir=workdir, id=run_id, resume="allow",
                     name=os.path.basename(os.path.abspath(workdir)), config=config.to_dict())
    return WandbTracker(run)
