"""Helpers for the trainer's tests (tiny configs, subprocess commands, metrics reading). Not used in training."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Sequence

from idattn.configs import packaged_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CONFIG = packaged_config("scaling") + ":softmax,tiny"  # the packaged recipe (experiments/scaling.py re-exports it)

# The tiny CPU model with a 512-piece SentencePiece vocabulary trained on the embedded corpus.
TINY_OVERRIDES = {
    "data.tokenizer": "train:512",
    "model.vocab_size": 512,
    "model.dtype": "float32",
    "data.seq_len": 32,
    "data.prefetch": 0,
    "train.batch_size": 8,
    "train.num_steps": 20,
    "train.warmup_steps": 5,
    "train.log_every": 1,
    "train.checkpoint_every": 5,
    "train.eval_every": 0,
    "train.eval_batches": 1,
}


def tiny_config(**overrides):
    """The tiny config as a ConfigDict (for in-process use); keys as in TINY_OVERRIDES ('a.b' dotted)."""
    import importlib.util

    path = TINY_CONFIG.split(":")[0]
    spec = importlib.util.spec_from_file_location("_scaling_cfg", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config(TINY_CONFIG.split(":", 1)[1])
    for k, v in {**TINY_OVERRIDES, **overrides}.items():
        node = c
        *parents, leaf = k.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = v
    return c


def train_command(workdir: str, config: str = TINY_CONFIG, overrides: dict | None = None,
                  extra: Sequence[str] = ()) -> list[str]:
    ov = {**TINY_OVERRIDES, **(overrides or {})}
    return ([sys.executable, "-m", "idattn.train", f"--config={config}", f"--workdir={workdir}"]
            + [f"--config.{k}={v}" for k, v in ov.items()] + list(extra))


def subprocess_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def cached_env(base_dir) -> dict:
    """Subprocess env sharing, across one test session, the tokenizer cache and JAX's persistent compilation
    cache (every later process of the same tiny config skips XLA compilation; the executables are identical)."""
    base = str(base_dir)
    return subprocess_env(IDATTN_CACHE=os.path.join(base, "idattn-cache"),
                          JAX_COMPILATION_CACHE_DIR=os.path.join(base, "idattn-jax-cache"),
                          JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                          JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def run_train(workdir: str, *, overrides: dict | None = None, extra: Sequence[str] = (), env: dict | None = None,
              timeout: float = 300, check: bool = True, config: str = TINY_CONFIG) -> subprocess.CompletedProcess:
    proc = subprocess.run(train_command(workdir, config, overrides=overrides, extra=extra), cwd=REPO, env=env or
                          subprocess_env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"training failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def read_metrics(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


# Runs the trainer's CLI after applying an injection (a Python snippet) to the trainer's modules: the fault is
# injected in the process that trains, through its real entry point.
RUNNER = """
import os, signal, sys, time
from idattn.train import checkpoint as ckpt, trainer, metrics as metrics_lib
{inject}
from idattn.configs.flags import run_app
from idattn.train.__main__ import main
sys.argv = ["idattn.train", *sys.argv[1:]]
run_app(main)
"""


def runner_command(tmp_path, workdir: str, inject: str, overrides: dict | None = None) -> list[str]:
    """The trainer's command line for `workdir`, run through RUNNER with `inject` applied first."""
    path = tmp_path / f"runner_{abs(hash(inject)) % 10**8}.py"
    path.write_text(RUNNER.format(inject=inject))
    return [sys.executable, str(path), *train_command(workdir, overrides=overrides)[3:]]


def stop_at(trainer, workdir: str, config, step: int = 17) -> None:
    """Trains `config` in `workdir` in this process until a metrics write fails at `step` (a full disk): a run
    stopped mid-way with its checkpoints up to there (5, 10 and 15 for the tiny config at step 17)."""
    import errno

    from idattn.train import metrics as metrics_lib
    real = metrics_lib.MetricsWriter.write

    def full(self, s, *a, **k):
        if s == step:
            raise OSError(errno.ENOSPC, "No space left on device", self.path)
        return real(self, s, *a, **k)

    metrics_lib.MetricsWriter.write = full
    try:
        trainer.run(config, workdir)
    except trainer.TrainingError:
        pass
    else:
        raise AssertionError(f"the run did not stop at step {step}")
    finally:
        metrics_lib.MetricsWriter.write = real


def fail_save_at(step: int) -> str:
    """A RUNNER injection: the checkpoint save of `step` fails as a full disk does (in the data-state writer)."""
    return f"""
import errno
_real = ckpt.DataStateHandler.save
def _no_space(self, directory, args):
    if "/{int(step)}.orbax-checkpoint-tmp" in str(directory):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory))
    return _real(self, directory, args)
ckpt.DataStateHandler.save = _no_space
"""
