"""The operator's paths on a device mesh (`-m slow`; the default suite's mesh check is tests/test_sharding.py's):
Interdomain on a 2x2x2 (data, fsdp, tensor) mesh of 8 fake CPU devices match one device, with impl="chunked" (XLA partitions it) and
impl="pallas" (the kernels in interpret mode, run inside shard_map over the batch and head axes; Interdomain only:
the linear readout runs the same convolution for every impl); and (under -m slow) the other seven cube cells
match one device the same way (impl="pallas" too for the query-readout cells) and take a training step on that
mesh.

One subprocess (8 fake devices must be set before jax starts), one jit per (mixer, impl, mesh); the one-device
reference is impl="chunked" for both (an independent implementation for the pallas path; the kernels
themselves are checked against float64 loops in tests/test_pallas.py). Compared: the loss Σ m·nll / Σ m of one
batch (packed rows with document resets) and the gradient of every parameter, at the same float32 parameters. Tolerances: the sharded program sums partial matmuls and the batch/head cotangents
of Λ, b, C in another order, so equality is to float32 rounding: loss rtol 1e-5; per parameter
‖g_mesh − g_one‖ ≤ 1e-4 ‖g_one‖ (a wrong partition — a missed psum over the batch shards, heads swapped — is
off by O(1)).
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from tests import train_helpers as T

pytestmark = pytest.mark.filterwarnings("ignore")

SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_disable_most_optimizations", True)  # compile time dominates (conftest.fast_compile)
from flax import linen as nn
from idattn.train import sharding as shd
from tests import train_helpers as T
from idattn.train.trainer import build_setup
from idattn.train.step import make_loss_sums
from idattn.models.spec import apply_mixer_name, cube_cells
from idattn.layers.common import positions_from_segments

assert len(jax.devices()) == 8, jax.devices()
B, S = 8, 32
rng = np.random.default_rng(0)
seg = np.zeros((B, S), np.int32)
seg[:, 11:] = 1
seg[::2, 23:] = 2  # resets inside a chunk and on a chunk boundary (chunk 16)
seg[1, :] = 0
batch = {"inputs": rng.integers(0, 512, (B, S)).astype(np.int32), "targets": rng.integers(0, 512, (B, S)).astype(np.int32),
         "segment_ids": seg, "positions": np.asarray(positions_from_segments(jnp.asarray(seg), B, S)),
         "loss_mask": (rng.random((B, S)) < 0.9).astype(np.float32)}


def config(mixer, impl, shape):
    cfg = T.tiny_config(**{"train.warmup_steps": 0, "data.seq_len": S})
    apply_mixer_name(cfg.model, mixer)
    cfg.model.impl = impl
    cfg.model.num_layers = 1
    cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = shape
    return cfg


def init_params(cfg):
    from idattn.models import build_model
    model = build_model(cfg.model)
    # jit: an eager init dispatches every op one by one (~6 s per model on CPU), a compiled one takes ~1 s
    return jax.device_get(nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 16), jnp.int32))["params"]))


def value_and_grad_fn(setup):
    ls = make_loss_sums(setup.model.apply, 8)  # with the chunked token loss (4 chunks of 8 positions)
    return jax.value_and_grad(lambda p, b: (lambda s, c: s / c)(*ls(p, b)))


def loss_and_grads(cases, devices, params):
    # One program for all cases on this mesh: compilation has a large fixed cost per program on CPU.
    setups = []
    for mixer, impl, shape in cases:
        cfg = config(mixer, impl, shape)
        setups.append(build_setup(cfg, shd.make_mesh(cfg.mesh, devices)))
    mesh = setups[0].mesh
    fns = [value_and_grad_fn(s) for s in setups]
    ps = tuple(jax.device_put(params[m], s.param_sh) for (m, _, _), s in zip(cases, setups))
    b = shd.global_batch_from_local(batch, mesh)
    f = jax.jit(lambda ps, b: tuple(fn(p, b) for fn, p in zip(fns, ps)),
                in_shardings=(tuple(s.param_sh for s in setups), setups[0].batch_shardings))
    with setups[0].context():
        traced = f.trace(ps, b)
        jaxpr = str(traced.jaxpr)
        res = traced.lower().compile()(ps, b)
    out = {}
    for (mixer, impl, _), (loss, g) in zip(cases, res):
        out[f"{mixer}/{impl}"] = [float(loss), {jax.tree_util.keystr(k): np.asarray(v).ravel().tolist()
                                                for k, v in jax.tree_util.tree_flatten_with_path(jax.device_get(g))[0]}]
    return out, jaxpr


mixers = [m for m in sys.argv[1].split(",") if m]
out = {"grads": {}, "cells": {}}
if mixers:
    params = {m: init_params(config(m, "chunked", (1, 1, 1))) for m in mixers}
    one, _ = loss_and_grads([(m, "chunked", (1, 1, 1)) for m in mixers], jax.devices()[:1], params)
    # impl="pallas" only where it selects other code: the linear readout is a causal convolution for every impl
    # (idattn.layers.interdomain), so its "pallas" program would be its chunked one compiled twice.
    pairs = [(m, impl) for m in mixers for impl in ("chunked", "pallas") if impl == "chunked" or "query" in m
             or m == "interdomain"]
    mesh_out, jaxpr = loss_and_grads([(m, impl, (2, 2, 2)) for m, impl in pairs], jax.devices(), params)
    out.update(shard_map="shard_map" in jaxpr, pallas_call="pallas_call" in jaxpr)
    for m, impl in pairs:
        out["grads"][f"{m}/{impl}"] = {"one": one[f"{m}/chunked"], "mesh": mesh_out[f"{m}/{impl}"]}

# The other cube cells: one optimiser step each on the mesh, all in one program.
from idattn.train.step import TrainState
cells = [c for c in sys.argv[2].split(",") if c]
if not cells:
    print("RESULT" + json.dumps(out))
    sys.exit(0)
setups, states, p0s = [], [], []
for mixer in cells:
    cfg = config(mixer, "auto", (2, 2, 2))
    setup = build_setup(cfg, shd.make_mesh(cfg.mesh, jax.devices()))
    p0 = init_params(cfg)
    setups.append(setup)
    p0s.append(p0)
    states.append(TrainState(step=jax.device_put(np.int32(0), setup.state_sh.step),
                             params=jax.device_put(p0, setup.param_sh),
                             opt_state=jax.device_put(setup.tx.init(p0), setup.state_sh.opt_state)))
mesh = setups[0].mesh
step_all = jax.jit(lambda sts, b: tuple(s.train(st, b) for s, st in zip(setups, sts)))
with setups[0].context():
    res = step_all(tuple(states), shd.global_batch_from_local(batch, mesh))
for mixer, p0, (state, m) in zip(cells, p0s, res):
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(jax.device_get(state.params))))
    out["cells"][mixer] = {"loss": float(m["loss"]), "step": int(state.step), "moved": moved}
print("RESULT" + json.dumps(out))
"""

GRAD_MIXERS = ("interdomain",)  # the other seven cells: the slow cells test (and tests/test_sequence_parallel.py)


def _run_script(tmp_path_factory, mixers, cells):
    env = dict(T.cached_env(tmp_path_factory.getbasetemp()), XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, ",".join(mixers), ",".join(cells)], cwd=T.REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])


@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory):
    return _run_script(tmp_path_factory, GRAD_MIXERS, [])


@pytest.fixture(scope="module")
def mesh_cells(tmp_path_factory):
    from idattn.models.spec import cube_cells
    cells = [c for c in cube_cells() if c != "dualkv-query-rope"]
    return _run_script(tmp_path_factory, cells, cells)


def _assert_matches_one_device(r, name):
    """The mesh's loss and every parameter's gradient against one device (tolerances: the module docstring)."""
    (l1, g1), (l8, g8) = r["one"], r["mesh"]
    assert np.isfinite(l1) and l1 > 1.0, name
    np.testing.assert_allclose(l8, l1, rtol=1e-5, err_msg=name)
    assert set(g1) == set(g8), name
    for k in g1:
        a, b = np.asarray(g1[k]), np.asarray(g8[k])
        ref = np.linalg.norm(a)
        assert np.linalg.norm(b - a) <= 1e-4 * ref + 1e-9, (name, k, float(np.linalg.norm(b - a)), float(ref))
    ssm = [k for k in g1 if "ssm_log_dt" in k]
    assert ssm and all(np.linalg.norm(g1[k]) > 0 for k in ssm), name  # the S4D parameters get gradient


@pytest.mark.slow  # the default suite's 2x2x2 mesh against one device: tests/test_sharding.py
@pytest.mark.parametrize("mixer,impl", [(m, "chunked") for m in GRAD_MIXERS] + [("interdomain", "pallas")])
def test_mesh_2x2x2_loss_and_grads_match_one_device(mesh_run, mixer, impl):
    _assert_matches_one_device(mesh_run["grads"][f"{mixer}/{impl}"], f"{mixer}/{impl}")
    if impl == "pallas":
        # the kernels really ran (Interdomain's query readout), inside shard_map
        assert mesh_run["pallas_call"] and mesh_run["shard_map"]


@pytest.mark.slow  # two more programs on 8 devices (gradients, five+ train steps): most of this file's compile time
def test_every_cube_cell_matches_one_device_and_trains_on_the_mesh(mesh_cells):
    """The seven cells not covered above, as Interdomain is: on the 2x2x2 mesh, the loss and every parameter's
    gradient equal one device's (impl="chunked", and impl="pallas" where it selects other code: the query
    readout); and one optimiser step on the mesh: finite loss, parameters move."""
    from idattn.models.spec import cube_cells

    cells = mesh_cells["cells"]
    assert sorted(cells) == sorted(c for c in cube_cells() if c != "dualkv-query-rope")
    assert len(cells) + len(GRAD_MIXERS) == 8
    grads = mesh_cells["grads"]
    want = {f"{c}/chunked" for c in cells} | {f"{c}/pallas" for c in cells if "query" in c}
    assert set(grads) == want, sorted(grads)
    for name, r in sorted(grads.items()):
        _assert_matches_one_device(r, name)
    assert mesh_cells["pallas_call"] and mesh_cells["shard_map"]
    for name, r in cells.items():
        assert np.isfinite(r["loss"]) and r["loss"] > 1.0, (name, r)
        assert r["step"] == 1 and r["moved"] > 0, (name, r)
