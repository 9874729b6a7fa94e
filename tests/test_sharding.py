"""Sharded training agrees with one device.

1. One process, 8 fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8, set in a subprocess
   before jax starts): two train steps on a 2x2x2 (data, fsdp, tensor) mesh against the same two steps on one
   device, same batches. Tolerance (float32; the sharded run sums partial matmuls and gradients in another
   order, so bitwise equality is not expected): losses within rtol 2e-5; parameters: at least 99.9% of the
   elements within atol 2e-6 and every element within atol 5e-5. The loose bound is for Adam: an element whose
   gradient is ~eps (1e-8) gets a normalised update g/(√v+eps) that amplifies a 1e-7 relative difference of g
   into a visible fraction of one LR step (the LR here is ~1e-3).
   The parameters must really be split (the embedding is sharded over fsdp and tensor).
2. Two processes joined by jax.distributed on localhost (gloo CPU collectives), started with the local launcher:
   they run the same steps, report the same losses, and the first loss equals an independent single-process
   evaluation of the initial parameters on the two hosts' batches concatenated.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests import train_helpers as T
from idattn.rundir.layout import committed_steps

pytestmark = pytest.mark.filterwarnings("ignore")

RTOL, ATOL, ATOL_ALL, MAX_FRAC = 2e-5, 2e-6, 5e-5, 1e-3

SCRIPT = r"""
import json, sys
import jax, numpy as np
jax.config.update("jax_disable_most_optimizations", True)  # compile time dominates (conftest.fast_compile)
from idattn.train import sharding as shd
from tests import train_helpers as T
from idattn.train.trainer import build_setup
from idattn.data import tokenizer as tl, pipeline

cfg = T.tiny_config()
tok = tl.load_tokenizer(cfg.data.tokenizer)
it = pipeline.make_train_iterator(cfg.data, tok, global_batch_size=8, seq_len=cfg.data.seq_len, seed=0)
batches = [next(it) for _ in range(2)]
assert len(jax.devices()) == 8, jax.devices()
out = {}
for name, devices, shape, accum in [("one", jax.devices()[:1], (1, 1, 1), 1), ("mesh", jax.devices(), (2, 2, 2), 1),
                                    ("mesh_accum2", jax.devices(), (2, 2, 2), 2)]:
    cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = shape
    cfg.train.grad_accum = accum
    mesh = shd.make_mesh(cfg.mesh, devices)
    setup = build_setup(cfg, mesh)
    with setup.context():
        state = setup.init(jax.random.PRNGKey(0))
        losses = []
        for b in batches:
            state, m = setup.train(state, shd.global_batch_from_local(b, mesh))
            losses.append(float(m["loss"]))
    emb = state.params["embedding"]
    out[name] = {"losses": losses, "spec": str(emb.sharding.spec),
                 "shards": len({tuple((s.start, s.stop) for s in sh.index) for sh in emb.addressable_shards}),
                 "params": {jax.tree_util.keystr(k): np.asarray(v).tolist()
                            for k, v in jax.tree_util.tree_flatten_with_path(jax.device_get(state.params))[0]}}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def mesh_results(env):
    e = dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=T.REPO, env=e, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])


@pytest.mark.parametrize("variant", ["mesh", "mesh_accum2"])
def test_mesh_2x2x2_matches_one_device(mesh_results, variant):
    """variant mesh_accum2 also splits the batch into 2 accumulated microbatches: same gradient, same step."""
    one, mesh = mesh_results["one"], mesh_results[variant]
    assert "fsdp" in mesh["spec"] and "tensor" in mesh["spec"], mesh["spec"]
    assert mesh["shards"] == 4, mesh  # vocab over tensor (2) x embed over fsdp (2); data replicates
    np.testing.assert_allclose(mesh["losses"], one["losses"], rtol=RTOL, atol=ATOL)
    assert one["losses"][1] < one["losses"][0]  # the step did something
    assert set(one["params"]) == set(mesh["params"])
    moved = 0
    for k in one["params"]:
        a, b = np.asarray(one["params"][k]), np.asarray(mesh["params"][k])
        np.testing.assert_allclose(b, a, rtol=0, atol=ATOL_ALL, err_msg=k)
        far = np.abs(b - a) > ATOL + RTOL * np.abs(a)
        assert far.mean() <= MAX_FRAC, (k, int(far.sum()), a.size)
        moved += a.size
    assert moved > 100_000


@pytest.mark.slow  # ~45 s; the default suite's budget. tests/test_faults.py's slow launcher test also trains on 2
# processes and matches the one-process losses.
def test_two_processes_jax_distributed(tmp_path, env, monkeypatch):
    wd = str(tmp_path / "mp")
    overrides = {"train.num_steps": 3, "train.checkpoint_every": 3, "train.warmup_steps": 3}
    cmd = [sys.executable, os.path.join(T.REPO, "launch", "local.py"), "--num_processes=2", "--port=0", "--"] + \
        T.train_command(wd, overrides=overrides)[1:]
    proc = subprocess.run(cmd, cwd=T.REPO, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    finals = dict(re.findall(r"\[process (\d)\] final step 3 loss (\S+)", out))
    assert set(finals) == {"0", "1"}, out[-3000:]
    assert finals["0"] == finals["1"]
    rec = T.read_metrics(wd)
    assert [r["step"] for r in rec] == [1, 2, 3]
    assert repr(rec[-1]["loss"]) == finals["0"]
    assert 3 in committed_steps(wd)

    # Independent check of step 1: the initial parameters' loss on host 0's rows then host 1's rows.
    import jax
    from idattn.data import pipeline, tokenizer as tl
    from idattn.models import build_model
    from idattn.train.step import make_loss_sums
    monkeypatch.setenv("IDATTN_CACHE", env["IDATTN_CACHE"])
    cfg = T.tiny_config(**overrides)
    tok = tl.load_tokenizer(cfg.data.tokenizer)
    parts = [next(pipeline.make_train_iterator(cfg.data, tok, global_batch_size=8, seq_len=cfg.data.seq_len,
                                               seed=int(cfg.data.shuffle_seed), process_index=p, process_count=2))
             for p in range(2)]
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    model = build_model(cfg.model)
    from flax import linen as nn
    # jit: eager flax init and apply dispatch every op one by one (seconds on CPU)
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(int(cfg.seed)), batch["inputs"][:1, :16])["params"])
    s, c = jax.jit(make_loss_sums(model.apply))(params, batch)
    np.testing.assert_allclose(rec[0]["loss"], float(s) / float(c), rtol=1e-5)


def test_chunked_token_loss_equals_full_logits():
    """train.loss_chunk > 0 computes the loss chunk by chunk inside the model (never the full logits); same loss and
    gradients as the loss from the full logits [B, T, V], including a chunk that does not divide T evenly in the
    config (the model takes the largest divisor of T not above it)."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn
    from idattn.models import build_model
    from idattn.train.step import make_loss_sums

    cfg = T.tiny_config()
    cfg.model.num_layers = 1
    model = build_model(cfg.model)
    rng = np.random.default_rng(0)
    b, t = 4, 24
    batch = {"inputs": rng.integers(0, 512, (b, t)).astype(np.int32),
             "targets": rng.integers(0, 512, (b, t)).astype(np.int32),
             "segment_ids": np.repeat([[0] * 10 + [1] * 14], b, 0).astype(np.int32),
             "positions": np.repeat([list(range(10)) + list(range(14))], b, 0).astype(np.int32),
             "loss_mask": (rng.random((b, t)) < 0.8).astype(np.float32)}
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), batch["inputs"][:1])["params"])
    out = {}
    for chunk in (0, 10):  # 10 -> 8 (the largest divisor of 24 not above 10): 3 chunks
        f = jax.jit(jax.value_and_grad(lambda p: (lambda s, c: s / c)(*make_loss_sums(model.apply, chunk)(p, batch))))
        out[chunk] = f(params)
    l0, g0 = out[0]
    for chunk in (10,):
        lc, gc = out[chunk]
        np.testing.assert_allclose(float(lc), float(l0), rtol=1e-6)
        for a, c in zip(jax.tree.leaves(g0), jax.tree.leaves(gc)):
            np.testing.assert_allclose(np.asarray(c), np.asarray(a), rtol=1e-5, atol=1e-7)
    assert np.isfinite(float(l0)) and float(l0) > 5.0  # ~log(512) at init
    # per token, not only on average: the strided chunks give every position its own target's nll
    import optax
    nll = jax.jit(lambda p: model.apply({"params": p}, batch["inputs"], segment_ids=batch["segment_ids"],
                                        positions=batch["positions"], targets=batch["targets"], loss_chunk=8))(params)
    logits = jax.jit(lambda p: model.apply({"params": p}, batch["inputs"], segment_ids=batch["segment_ids"],
                                           positions=batch["positions"]))(params)
    ref = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    np.testing.assert_allclose(np.asarray(nll), np.asarray(ref), rtol=1e-5, atol=1e-6)
