"""Trainer pieces against independent references, one real run, and the refusals.

- schedule: closed form; optimiser groups: one AdamW step against a numpy implementation;
- loss: masked token cross-entropy against numpy; gradient accumulation = one big batch (toy model);
- a real 4-step run through `python -m idattn.train`: metrics.jsonl keys and LR values, TensorBoard events,
  validation JSON, and `load_params` (its parameters reproduce the logged validation loss);
- refusals that write nothing: changed model config on resume, a batch the mesh cannot divide, data tokenised
  with another tokenizer, a tokenizer larger than the model's vocabulary; the non-finite-loss guard.
"""
import glob
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from idattn.train import optim
from tests import train_helpers as T
from idattn.rundir.layout import committed_steps, diff_dicts
from idattn.train.step import TrainState, make_loss_sums, make_train_step

pytestmark = pytest.mark.filterwarnings("ignore")


# ------------------------------------------------------------------------------------------- pure pieces
def _sched_ref(s, peak, end, w, n):
    if s < w:
        return peak * (s + 1) / w
    frac = min(1.0, (s - w) / max(1, n - w))
    return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * frac))


def test_schedule_closed_form():
    f = optim.lr_schedule(3e-3, 1e-5, 10, 100)
    for s in [0, 1, 5, 9, 10, 11, 50, 99, 100, 150]:
        np.testing.assert_allclose(float(f(s)), _sched_ref(s, 3e-3, 1e-5, 10, 100), rtol=1e-5)  # float32
    assert float(f(9)) == pytest.approx(3e-3) and float(f(100)) == pytest.approx(1e-5)


def test_adamw_groups_one_step_against_numpy():
    cfg = T.tiny_config().train
    cfg.peak_lr, cfg.ssm_lr_cap, cfg.weight_decay, cfg.grad_clip = 2e-3, 5e-4, 0.1, 1.0
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(3, 4)).astype(np.float32), "g": rng.normal(size=4).astype(np.float32),
              "ssm_dt": rng.normal(size=5).astype(np.float32)}
    labels = {"w": "decay", "g": "no_decay", "ssm_dt": "ssm"}
    grads = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()}
    tx, _ = optim.make_optimizer(cfg, labels, num_steps=10, warmup_steps=4)
    upd, _ = tx.update(grads, tx.init(params), params)
    new = optax.apply_updates(params, upd)
    gnorm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
    scale = min(1.0, 1.0 / gnorm)
    for k, (lr, wd) in {"w": (2e-3, 0.1), "g": (2e-3, 0.0), "ssm_dt": (5e-4, 0.0)}.items():
        lr_t = lr * 1 / 4  # step 0 of a 4-step warmup
        g = grads[k].astype(np.float64) * scale
        m, v = 0.1 * g / 0.1, 0.05 * g * g / 0.05  # bias-corrected first step (b1=0.9, b2=0.95)
        ref = params[k] - lr_t * (m / (np.sqrt(v) + cfg.eps) + wd * params[k])
        np.testing.assert_allclose(np.asarray(new[k]), ref, rtol=2e-5, atol=1e-8, err_msg=k)
    with pytest.raises(ValueError, match="unknown optimiser groups"):
        optim.make_optimizer(cfg, {"w": "oops"}, num_steps=10, warmup_steps=1)


def _toy_apply(variables, tokens, segment_ids=None, positions=None):
    """A bigram model: logits = E[tokens] @ W (enough to test the loss and the step plumbing)."""
    p = variables["params"]
    return jnp.take(p["emb"], tokens, axis=0) @ p["out"]


def _toy_batch(rng, b=8, t=6, v=11):
    return {"inputs": rng.integers(0, v, (b, t)).astype(np.int32),
            "targets": rng.integers(0, v, (b, t)).astype(np.int32),
            "segment_ids": np.ones((b, t), np.int32), "positions": np.tile(np.arange(t, dtype=np.int32), (b, 1)),
            "loss_mask": (rng.random((b, t)) > 0.3).astype(np.float32)}


def test_masked_loss_against_numpy():
    rng = np.random.default_rng(1)
    params = {"emb": rng.normal(size=(11, 5)).astype(np.float32), "out": rng.normal(size=(5, 11)).astype(np.float32)}
    batch = _toy_batch(rng)
    s, c = make_loss_sums(_toy_apply)(params, batch)
    logits = params["emb"][batch["inputs"]].astype(np.float64) @ params["out"]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
    np.testing.assert_allclose(float(s), (nll * batch["loss_mask"]).sum(), rtol=1e-5)
    assert float(c) == batch["loss_mask"].sum()


def test_grad_accumulation_equals_one_batch():
    rng = np.random.default_rng(2)
    params = {"emb": rng.normal(size=(11, 5)).astype(np.float32), "out": rng.normal(size=(5, 11)).astype(np.float32)}
    batch = _toy_batch(rng)
    tx = optax.sgd(0.5)  # linear in the gradient: any difference of the accumulated gradient shows
    out = {}
    for a in (1, 4):
        step = jax.jit(make_train_step(_toy_apply, tx, grad_accum=a))
        st = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
        st, m = step(st, batch)
        out[a] = (float(m["loss"]), float(m["grad_norm"]), jax.device_get(st.params))
    assert out[1][0] == pytest.approx(out[4][0], rel=1e-6) and out[1][1] == pytest.approx(out[4][1], rel=1e-5)
    for k in params:
        np.testing.assert_allclose(out[4][2][k], out[1][2][k], rtol=1e-5, atol=1e-6)
        assert np.abs(out[1][2][k] - params[k]).max() > 1e-3


def test_diff_dicts():
    assert diff_dicts({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3, "d": 4}}) == [("a.c", 2, 3),
                                                                                 ("a.d", "<missing>", 4)]


# -------------------------------------------------------------------------------------------- a real run
RUN = {"train.num_steps": 4, "train.checkpoint_every": 2, "train.eval_every": 2, "train.warmup_steps": 2,
       "train.eval_batches": 2, "train.peak_tflops_per_device": 0.25}  # CPU: no table entry, MFU from the override


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, env):
    wd = str(tmp_path_factory.mktemp("run"))
    proc = T.run_train(wd, overrides=RUN, env=env)
    return wd, proc.stdout + proc.stderr


def test_run_outputs(run_dir):
    wd, out = run_dir
    for needle in ("parameters (count_params:", "state budget", "HBM estimate per device", "ETA"):
        assert needle in out, needle
    rec = T.read_metrics(wd)
    assert [r["step"] for r in rec] == [1, 2, 3, 4]
    for r in rec:
        for k in ("loss", "lr", "grad_norm", "tokens_per_sec", "mfu", "step_time", "data_wait"):
            assert k in r, k
        assert math.isfinite(r["loss"]) and r["tokens_per_sec"] > 0
        np.testing.assert_allclose(r["lr"], _sched_ref(r["step"] - 1, 3e-3, 1e-5, 2, 4), rtol=1e-6)
    assert glob.glob(os.path.join(wd, "tb", "events.out.tfevents.*"))
    assert committed_steps(wd) == [2, 4]
    cfg = json.load(open(os.path.join(wd, "config.json")))
    assert cfg["train"]["num_steps"] == 4 and cfg["model"]["vocab_size"] == 512
    from idattn.rundir.schema import read_results
    res = read_results(wd, "validation")
    assert [r["step"] for r in res] == [2, 4]
    for r in res:
        assert r["metrics"]["ppl"] == pytest.approx(math.exp(r["metrics"]["loss"]), rel=1e-9)


def test_mfu_value_in_the_metrics(run_dir):
    """Every step line's MFU is tokens/s/device · flops_per_token(model, seq_len) / the device's peak FLOP/s, with
    tokens/s = batch · seq_len / step time and the per-device rate over the devices of the run (metrics.py's
    formula; train.peak_tflops_per_device = 0.25 TFLOP/s here, CPU having no table entry)."""
    from idattn import models

    wd, _ = run_dir
    cfg = json.load(open(os.path.join(wd, "config.json")))
    seq_len, batch = cfg["data"]["seq_len"], cfg["train"]["batch_size"]
    import ml_collections

    flops = models.flops_per_token(ml_collections.ConfigDict(cfg["model"]), seq_len)
    devices = jax.device_count()  # the run's subprocess sees the same CPU devices as this one
    for r in T.read_metrics(wd):
        assert r["tokens_per_sec"] == pytest.approx(batch * seq_len / r["step_time"], rel=1e-9)
        assert r["tokens_per_sec_per_device"] == pytest.approx(r["tokens_per_sec"] / devices, rel=1e-9)
        want = r["tokens_per_sec_per_device"] * flops / 0.25e12
        assert r["mfu"] == pytest.approx(want, rel=1e-9), (r["step"], r["mfu"], want)
        assert 0 < r["mfu"] < 1


@pytest.mark.parametrize("kind,tflops", [
    # device_kind strings as JAX reports them -> the vendor's dense bf16 peak per device (spec sheets)
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H200", 989.0), ("NVIDIA GH200 480GB", 989.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA B200", 2250.0), ("NVIDIA L40S", 362.0),
    ("TPU v4", 275.0), ("TPU v5 lite", 197.0), ("TPU v5e", 197.0), ("TPU v5p", 459.0), ("TPU v5", 459.0),
    ("TPU v6 lite", 918.0), ("TPU7x", 2307.0),
    ("cpu", None), ("TFRT_CPU_0", None), ("Tesla T4", None),
])
def test_peak_flops_table_lookup(kind, tflops):
    """The device kind picks its own entry, the longest name first ("TPU v5 lite" is not "TPU v5", "GH200" not
    "H200"); a kind not in the table gives None (MFU null) unless train.peak_tflops_per_device overrides it."""
    from idattn.train.metrics import peak_flops_per_device

    got = peak_flops_per_device(kind)
    assert got == (None if tflops is None else tflops * 1e12), (kind, got)
    assert peak_flops_per_device(kind, 123.0) == 123.0e12


def test_load_params_reproduces_validation(run_dir, env, monkeypatch):
    wd, _ = run_dir
    monkeypatch.setenv("IDATTN_CACHE", env["IDATTN_CACHE"])
    from idattn.data import pipeline, tokenizer as tl
    from idattn.rundir.schema import read_results
    from idattn.models import build_model
    from idattn.train import load_params
    config, params = load_params(wd)
    assert config.train.num_steps == 4
    tok = tl.load_tokenizer(config.data.tokenizer)
    batches = pipeline.make_eval_batches(config.data, tok, batch_size=8, seq_len=config.data.seq_len, num_batches=2)
    loss_sums = jax.jit(make_loss_sums(build_model(config.model).apply))
    s = c = 0.0
    for b in batches:
        bs, bc = loss_sums(params, b)
        s, c = s + float(bs), c + float(bc)
    logged = [r for r in read_results(wd, "validation") if r["step"] == 4][0]["metrics"]["loss"]
    np.testing.assert_allclose(s / c, logged, rtol=1e-5)
    _, p2 = load_params(wd, step=2)
    assert not np.allclose(np.asarray(p2["embedding"]), np.asarray(params["embedding"]))
    with pytest.raises(ValueError, match="available steps"):
        load_params(wd, step=3)


def _snapshot(d):
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[p] = os.stat(p).st_mtime_ns
    return out


def test_refuses_changed_model_on_resume(run_dir, env):
    wd, _ = run_dir
    before = _snapshot(wd)
    proc = T.run_train(wd, overrides={**RUN, "model.d_model": 96, "train.num_steps": 6}, env=env, check=False)
    assert proc.returncode == 1
    assert "refusing to resume" in proc.stderr and "model.d_model: saved 64, now 96" in proc.stderr, proc.stderr
    assert "init_from" not in proc.stderr and "starts from scratch" in proc.stderr  # init_from cannot change size
    assert _snapshot(wd) == before


@pytest.mark.parametrize("key, value, init_from_hint", [("model.d_model", 96, False), ("model.impl", "sequential", True)])
def test_resume_refusal_suggests_init_from_only_when_the_parameters_fit(tmp_path, key, value, init_from_hint):
    from idattn.rundir import layout
    from idattn.train.trainer import TrainingError, check_resume_compatible
    layout.save_config(str(tmp_path), T.tiny_config())
    section, name = key.split(".")
    live = T.tiny_config()
    live[section][name] = value
    with pytest.raises(TrainingError, match="refusing to resume") as e:
        check_resume_compatible(str(tmp_path), live)
    assert (f"--config.train.init_from={tmp_path}" in str(e.value)) == init_from_hint, str(e.value)


def _refusal(tmp_path, env, overrides, extra_env=None):
    wd = str(tmp_path / "never")
    proc = T.run_train(wd, overrides=overrides, env={**env, **(extra_env or {})}, check=False)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not os.path.exists(wd), os.listdir(wd)
    return proc.stderr


def test_refuses_batch_the_mesh_cannot_divide(tmp_path, env):
    err = _refusal(tmp_path, env, {"train.batch_size": 6},
                   {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert "config.train.batch_size=6" in err and "batch shards" in err and "multiple of 4" in err, err


def test_refuses_data_from_another_tokenizer(tmp_path, env):
    from idattn.data import formats
    data = tmp_path / "data"
    data.mkdir()
    (data / formats.META).write_text(json.dumps({"format": formats.FORMAT, "tokenizer": {
        "name": "mistral", "vocab_size": 32000, "sha256": "0" * 64}}))
    err = _refusal(tmp_path, env, {"data.source": "arrayrecord", "data.path": str(data)})
    assert "Tokenizer mismatch" in err and "mistral" in err, err


def test_refuses_tokenizer_larger_than_vocab(tmp_path, env):
    err = _refusal(tmp_path, env, {"model.vocab_size": 300})
    assert "has 512 tokens but config.model.vocab_size=300" in err, err


@pytest.mark.slow  # the default suite's 10-minute budget (clean clone: 19 s); CI's slow pass runs it
def test_nonfinite_steps_are_never_applied_nor_checkpointed(tmp_path, env):
    """LR 1e30: the first bad step is dropped (train.max_bad_steps=1, logged and counted), the second stops the run
    naming the last checkpoint; every checkpoint written, the named one included, restores finite and verifies."""
    from idattn.rundir.loading import load_params
    wd = str(tmp_path / "nan")
    proc = T.run_train(wd, overrides={"train.peak_lr": 1e30, "train.warmup_steps": 0, "train.checkpoint_every": 1,
                                      "train.num_steps": 8, "train.max_bad_steps": 1}, env=env, check=False)
    assert proc.returncode == 1
    err, out = proc.stderr, proc.stdout
    assert "non-finite step" in err and "the update was not applied" in err, err[-3000:]
    step = int(err.split("error: non-finite step ")[1].split(" ")[0])
    assert "(bad step 1 of train.max_bad_steps=1)" in out, out[-3000:]
    dropped = int(out.split("(bad step 1 of")[0].rsplit("step ", 2)[-2].split(":")[0])
    assert dropped < step
    good = committed_steps(wd)
    named = err.split("Last finite checkpoint: ")[1].split(" ")[0]
    assert good and named == os.path.join(wd, "checkpoints", str(max(good))), (named, good)
    for s in good:
        _, params = load_params(wd, s)  # verifies the digests recorded at save time
        assert all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree.leaves(params)), s
    rec = T.read_metrics(wd)
    assert [r["bad_steps"] for r in rec if r["step"] >= dropped][0] == 1


@pytest.mark.slow
def test_quickstart_smoke(tmp_path, env):
    """The quickstart end to end, 3 steps of one model (the full run takes ~10 minutes: not in the default suite)."""
    proc = subprocess.run([sys.executable, "-m", "idattn.quickstart", f"--workdir={tmp_path}", "--steps=3",
                           "--mixers=softmax"], cwd=T.REPO, env=env, capture_output=True, text=True, timeout=600)
    res = json.load(open(tmp_path / "quickstart.json"))
    assert set(res["unigram"]) == {"256", "512", "896"}
    uni, soft = res["unigram"]["256"], res["models"][0]["ppl"]["256"]
    # 3 steps from a near-uniform init over the 1024-piece vocabulary: perplexity near the vocabulary size, far
    # above the unigram model of the training tokens (which cannot be beaten by 30% yet), so the health criterion
    # must fail and the exit code must say so (1), with FAIL printed.
    assert 100 < uni < 1024 and uni < soft <= 1024 * 1.05, (uni, soft)
    assert not soft <= 0.7 * uni and res["pass"] is False
    assert proc.returncode == 1 and "FAIL: every model's ppl@256" in proc.stdout, proc.stderr[-3000:]
    # the table prints the JSON's numbers; Softmax's ratio to itself is 1.000 and the unigram's is uni / soft
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| Softmax |"))
    assert f"| {soft:.2f} |" in row and row.rstrip().endswith("| 1.000 |")
    uni_row = next(line for line in proc.stdout.splitlines() if line.startswith("| Unigram |"))
    assert uni_row.rstrip().endswith(f"| {uni / soft:.3f} |")
    assert os.path.getsize(tmp_path / "quickstart.png") > 1000


def test_quickstart_reuses_only_a_run_of_its_own_code_and_config(tmp_path):
    from idattn.studies.quickstart import claim_run, write_run_marker
    ident = {"code": "a1-b2", "config": "c3"}
    wd = str(tmp_path / "softmax")
    assert claim_run(wd, ident, log=lambda s: None) == {}
    write_run_marker(wd, dict(ident, finished=True, train_s=12.5))
    assert claim_run(wd, ident, log=lambda s: None)["train_s"] == 12.5 and os.path.isdir(wd)
    said = []
    assert claim_run(wd, dict(ident, config="other"), log=said.append) == {}
    assert not os.path.exists(wd) and os.path.isdir(wd + ".stale-1") and "moved to" in said[0]
    os.makedirs(wd)  # an old folder without a record (an older quickstart's): not reused either
    assert claim_run(wd, ident, log=said.append) == {} and os.path.isdir(wd + ".stale-2")
    assert "no quickstart record" in said[1]


@pytest.mark.slow  # ~3 min: three quickstart invocations of 2-3 steps
def test_quickstart_folder_and_reuse_rule(tmp_path, env):
    """The quickstart writes under the current folder by default (printed first); a rerun with the same code and
    config reuses the finished run and reports the training time it recorded, marked "(reused)"; another config
    (here --steps) moves the old run aside and trains again."""
    def quickstart(*extra):
        proc = subprocess.run([sys.executable, "-m", "idattn.quickstart", "--mixers=softmax", *extra], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: 2 steps cannot pass the quality gate
        return proc.stdout

    out = quickstart("--steps=2")
    wd = tmp_path / "idattn-quickstart"
    assert out.splitlines()[0] == f"idattn quickstart: workdir {wd}"
    first = json.load(open(wd / "softmax" / "quickstart-run.json"))
    assert first["finished"] and first["train_s"] > 1.0
    out = quickstart("--steps=2")
    assert "reused the finished run" in out
    row = next(line for line in out.splitlines() if line.startswith("| Softmax |"))
    assert f"| {first['train_s']:.0f} (reused) |" in row, row
    assert json.load(open(wd / "quickstart.json"))["models"][0]["reused"] is True
    out = quickstart("--steps=3")
    assert "moved to" in out and (tmp_path / "idattn-quickstart" / "softmax.stale-1").is_dir()
    row = next(line for line in out.splitlines() if line.startswith("| Softmax |"))
    assert "(reused)" not in row and json.load(open(wd / "softmax" / "quickstart-run.json"))["finished"]


@pytest.mark.slow  # ~20 s: a second training subprocess
def test_init_from_another_run(run_dir, env, tmp_path):
    """train.init_from starts a new run (step 0, fresh optimiser) from another run's latest parameters."""
    src, _ = run_dir
    wd = str(tmp_path / "child")
    proc = T.run_train(wd, overrides={**RUN, "train.init_from": src}, env=env)
    assert f"initialised parameters from {src}" in proc.stdout
    child, parent = T.read_metrics(wd), T.read_metrics(src)
    assert [r["step"] for r in child] == [1, 2, 3, 4]
    # step 1 of the child is scored with the parent's step-4 parameters on the parent's step-1 batch: far below
    # the parent's own step-1 loss at random init
    assert child[0]["loss"] < parent[0]["loss"] - 0.1, (child[0]["loss"], parent[0]["loss"])
    err = T.run_train(str(tmp_path / "bad"), overrides={**RUN, "train.init_from": src, "model.num_layers": 3},
                      env=env, check=False)
    assert err.returncode == 1 and "model.num_layers: 2 there, 3 here" in err.stderr, err.stderr[-2000:]
    assert not os.path.exists(str(tmp_path / "bad"))


def test_refuses_checkpoints_without_config(tmp_path):
    from idattn.train.trainer import TrainingError, check_resume_compatible
    (tmp_path / "checkpoints" / "5").mkdir(parents=True)
    with pytest.raises(TrainingError, match=r"checkpoints \[5\] but no config.json"):
        check_resume_compatible(str(tmp_path), T.tiny_config())
