"""The lm-evaluation-harness adapter's documented command, run by lm-eval itself on a local task YAML.

In the slow suite; skipped unless lm-eval is installed (it pulls torch, so it is not in the `test` extra; CI
installs it and fails instead of skipping). To run it:

    pip install torch==2.13.0 && pip install -e ".[harness]"   # lm-eval (a CPU torch first: see .ci/run)
    python -m pytest -q -m slow tests/test_eval_lm_eval.py

It trains a tiny model for 2 steps, writes a PIQA-format task YAML over local JSON Lines documents, runs
`python -m idattn.eval.lm_eval_adapter --workdir=... --tasks ... --include_path ... --batch_size ... --limit ...
--log_samples --output_path ...` as a subprocess, and checks lm-eval's accuracy against idattn's own harness on
the same documents and prompts (two independent implementations of the same scoring). The default suite's
tests/test_eval_lm_eval_reference.py checks the harness against lm-eval's stored answers on nine tasks.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from tests import train_helpers as T  # noqa: E402
from tests.eval_fixtures import PIQA, write_piqa_task  # noqa: E402

# lm-eval pulls torch: not in the `test` extra, so these run in the slow suite, which .ci/run runs after
# installing the `harness` extra (and where a skip for a missing lm-eval fails: tests/conftest.py).
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _lm_eval():
    pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[harness]')")


def test_adapter_command_runs_local_task_yaml(tmp_path):
    env = T.subprocess_env()
    wd = str(tmp_path / "run")
    overrides = {"train.num_steps": 2, "train.checkpoint_every": 2, "train.warmup_steps": 1, "data.seq_len": 64}
    proc = subprocess.run(T.train_command(wd, overrides=overrides), env=env, capture_output=True, text=True,
                          timeout=600, cwd=T.REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tasks = tmp_path / "tasks"
    docs = PIQA * 3  # 6 documents, 12 requests
    write_piqa_task(tasks, docs)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "idattn.eval.lm_eval_adapter", f"--workdir={wd}", "--tasks", "mypiqa",
           "--include_path", str(tasks), "--batch_size", "2", "--limit", "5", "--log_samples",
           "--output_path", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=T.REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res_files = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    assert res_files, proc.stdout[-2000:]
    res = json.load(open(res_files[0]))["results"]["mypiqa"]
    assert glob.glob(str(out / "**" / "samples_mypiqa_*.jsonl"), recursive=True)  # --log_samples

    # idattn's own harness on the same five documents: the same accuracies
    from idattn.data.tokenizer import load_tokenizer
    from idattn.eval import harness
    from idattn.eval.scoring import model_score_fn
    from idattn.models import build_model
    from idattn.rundir.loading import load_params

    config, params = load_params(wd)
    m, _ = harness.evaluate_task("piqa", docs[:5], model_score_fn(build_model(config.model), params),
                                 load_tokenizer(config.data.tokenizer), max_length=64, batch_size=2)
    assert res["acc,none"] == pytest.approx(m["acc"], abs=1e-9)
    assert res["acc_norm,none"] == pytest.approx(m["acc_norm"], abs=1e-9)


def test_adapter_refuses_model_args():
    from idattn.eval.lm_eval_adapter import lm_eval_argv

    a, fwd = lm_eval_argv(["--workdir=/x", "--tasks", "piqa", "--batch_size", "8", "--limit", "3"])
    assert fwd[:3] == ["--model", "idattn", "--model_args"] and fwd[3].startswith("workdir=/x")
    assert fwd[4:] == ["--tasks", "piqa", "--batch_size", "8", "--limit", "3"] and "batch_size" not in fwd[3]
    with pytest.raises(SystemExit):
        lm_eval_argv(["--workdir=/x", "--model_args", "batch_size=8"])
