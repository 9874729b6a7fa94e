"""Sequence parallelism (idattn/ops/sequence.py): the length split over a `sequence` mesh axis, states passed.

One subprocess with 8 fake CPU devices (XLA_FLAGS set before jax starts) per check:

- operator: `interdomain_mix_sequence` and `s4d_linear_mix_sequence` under x64 on sequence 4 x tensor 2
  (default) and on sequence 8, 2 x data 2 x tensor 2, 4 x data 2 (slow), forward and every gradient against the
  float64 sequential operator on one device, to 1e-10, with documents crossing shard boundaries, a reset exactly
  at a boundary and one inside a shard; `end_state` against a NumPy loop; the compiled program holds the
  all-gather of the states (the split path ran, not a fallback). In the same program on the first mesh, Softmax
  (the model's `causal_attention` call): value and gradients equal the unsplit call, K and V all-gathered, no
  [T, T] scores. Slow: the same on sequence 4 x fsdp 2 in float32 and with the splash kernel interpreted.
- evaluation (slow): long-context scoring (`make_score_fn(mesh=...)`) on sequence 8 and the trainer's eval
  step on sequence 4 x fsdp 2 equal one device.
- model (slow: Interdomain chunked on sequence 4 x fsdp 2; Pallas interpret, S4D-only, a linear cube
  cell and Softmax on the same mesh, a query cube cell on sequence 8): the loss and every gradient of the full tiny model against one device (float32, 4 x 128
  tokens: loss rtol 2e-6; each gradient within 2e-5 of the largest gradient element of the model).
- training (slow, the query cube cell on sequence 8): three train steps of the sequence-split trainer step:
  losses equal one device's (rtol 2e-5) and decrease.
- prefill on sequence 4 (`prefill_on_mesh`), then decoding: every position equals the full forward.
- a sequence group across two processes (slow): the trainer's losses equal one device's.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from tests import train_helpers as T

pytestmark = pytest.mark.filterwarnings("ignore")

OPERATOR = r"""
import json, re, sys
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_disable_most_optimizations", True)  # compile time dominates (conftest.fast_compile)
import jax.numpy as jnp, numpy as np
from jax.sharding import Mesh
from idattn.ops import interdomain_mix, s4d_linear_mix
from idattn.ops.sequence import end_state, interdomain_mix_sequence, s4d_linear_mix_sequence

rng = np.random.default_rng(0)
B, T, H, R, D, M = 2, 64, 2, 4, 3, 5
cplx = lambda *s: rng.normal(size=s) + 1j * rng.normal(size=s)
lam = np.exp(-np.exp(rng.normal(size=(H, M)) - 2) + 1j * rng.normal(size=(H, M)))
b, c, cv = cplx(H, M) * 0.5, cplx(H, M, M) * 0.3, cplx(H, M)
fq, zk, zv = rng.normal(size=(B, T, H, R)), rng.normal(size=(B, T, H, R)), rng.normal(size=(B, T, H, D))
seg = np.zeros((B, T), np.int32)
seg[0, 16:] = 1; seg[0, 21:] = 2; seg[0, 40:] = 1   # resets at 16 (a boundary of 8 and of 16), 21, 40 (boundary of 8)
seg[1, 3:] = 4; seg[1, 8:] = 5; seg[1, 32:] = 6      # inside shard 0, at the boundaries 8 and 32
x = np.zeros((B, H, M, R), complex)
for t in range(T):
    reset = (t > 0) & (seg[:, t] != seg[:, t - 1])
    x = np.where(reset[:, None, None, None], 0, x)
    x = lam[None, :, :, None] * x + b[None, :, :, None] * zk[:, t][:, :, None, :]
out = {"end_state": float(np.max(np.abs(np.asarray(end_state(zk, lam, b, seg, chunk_size=6)) - x)))}
weight = lambda o: jnp.cos(jnp.arange(o.size).reshape(o.shape))

def rel(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) / (1 + float(np.max(np.abs(np.asarray(x)))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

ref_id = jax.value_and_grad(lambda *a: jnp.sum(weight(o := interdomain_mix(*a, impl="sequential", segment_ids=seg)) * o),
                            argnums=tuple(range(6)))(fq, zk, zv, lam, b, c)
z = np.concatenate([zk, zv], -1)
ref_lin = jax.value_and_grad(lambda *a: jnp.sum(weight(y := s4d_linear_mix(*a, impl="sequential", segment_ids=seg)) * y),
                             argnums=tuple(range(4)))(z, lam, b, cv)
for shape in json.loads(sys.argv[1]):  # (sequence, data, tensor)
    mesh = Mesh(np.asarray(jax.devices()).reshape(shape), ("sequence", "data", "tensor"))
    sp = lambda *a: jnp.sum(weight(o := interdomain_mix_sequence(*a, impl="chunked", chunk_size=4, segment_ids=seg)) * o)
    lin = lambda *a: jnp.sum(weight(y := s4d_linear_mix_sequence(*a, chunk_size=3, segment_ids=seg)) * y)
    both = lambda a, l: (jax.value_and_grad(sp, argnums=tuple(range(6)))(*a),
                         jax.value_and_grad(lin, argnums=tuple(range(4)))(*l))
    with jax.set_mesh(mesh):
        f = jax.jit(both).lower((fq, zk, zv, lam, b, c), (z, lam, b, cv)).compile()  # one program per mesh
        got_id, got_lin = f((fq, zk, zv, lam, b, c), (z, lam, b, cv))
    out[str(shape)] = {"interdomain": rel(ref_id, got_id), "linear": rel(ref_lin, got_lin),
                       "all_gathers": f.as_text().count("all-gather")}
# A state entering the first document and the state after the last token (a prefill chunk on the mesh): forward
# (output and both end states) and every gradient, the initial states' included, on the first mesh
xk0, xv0, x0 = cplx(B, H, M, R) * 0.3, cplx(B, H, M, D) * 0.3, cplx(B, H, M, R + D) * 0.3
def with_states(f):
    def loss(*a):
        o, st = f(*a)
        return jnp.sum(weight(o) * o) + sum(jnp.sum(weight(jnp.real(x)) * jnp.real(x) + weight(jnp.imag(x)) * jnp.imag(x))
                                            for x in jax.tree.leaves(st))
    return loss
id_init = lambda impl, fn, **kw: with_states(lambda fq, zk, zv, lam, b, c, x0k, x0v: fn(
    fq, zk, zv, lam, b, c, impl=impl, segment_ids=seg, initial_state=(x0k, x0v), return_state=True, **kw))
lin_init = lambda impl, fn, **kw: with_states(lambda z, lam, b, cv, x0: fn(
    z, lam, b, cv, impl=impl, segment_ids=seg, initial_state=x0, return_state=True, **kw))
id_args, lin_args = (fq, zk, zv, lam, b, c, xk0, xv0), (z, lam, b, cv, x0)
ref = (jax.value_and_grad(id_init("sequential", interdomain_mix), argnums=tuple(range(8)))(*id_args),
       jax.value_and_grad(lin_init("sequential", s4d_linear_mix), argnums=tuple(range(5)))(*lin_args))
shape = json.loads(sys.argv[1])[0]
with jax.set_mesh(Mesh(np.asarray(jax.devices()).reshape(shape), ("sequence", "data", "tensor"))):
    got = jax.jit(lambda a, l: (
        jax.value_and_grad(id_init("chunked", interdomain_mix_sequence, chunk_size=4), argnums=tuple(range(8)))(*a),
        jax.value_and_grad(lin_init("chunked", s4d_linear_mix_sequence, chunk_size=3), argnums=tuple(range(5)))(*l)))(
        id_args, lin_args)
out["initial_state"] = {"interdomain": rel(ref[0], got[0]), "linear": rel(ref[1], got[1])}
# Softmax under the first mesh (the model's causal_attention call; XLA on CPU): K, V gathered, global offsets
from idattn.layers.attention import causal_attention
q, k, v = (rng.normal(size=(B, T, H, 4)) for _ in range(3))
att = lambda *a: jnp.sum(weight(o := causal_attention(*a, seg)) * o)
ref_att = jax.value_and_grad(lambda *a: jnp.sum(weight(o := causal_attention(*a, seg, impl="xla")) * o),
                             argnums=(0, 1, 2))(q, k, v)
shape = json.loads(sys.argv[1])[0]
with jax.set_mesh(Mesh(np.asarray(jax.devices()).reshape(shape), ("sequence", "data", "tensor"))):
    f = jax.jit(jax.value_and_grad(att, argnums=(0, 1, 2))).lower(q, k, v).compile()
    got_att = f(q, k, v)
txt = f.as_text()
out["softmax"] = {"err": rel(ref_att, got_att), "kv_gathers": len(re.findall(r"f64\[%d,%d,%d,4\][^=]*all-gather" % (B, T, H // shape[2]), txt)),
                  "full_scores": sorted(set(re.findall(r"\w+\[[\d,]*%d,%d\]" % (T, T), txt)))}
print("RESULT" + json.dumps(out))
"""

MODEL = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from idattn.layers.common import positions_from_segments
from idattn.models.spec import apply_mixer_name
from idattn.train import sharding as shd
from idattn.train.step import make_loss_sums
from idattn.train.trainer import build_setup
from tests import train_helpers as T

jax.config.update("jax_disable_most_optimizations", True)  # compile time dominates (conftest.fast_compile)
cases, meshes, steps = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
B, S = 4, 128
rng = np.random.default_rng(0)
seg = np.ones((B, S), np.int32)
seg[0, 32:] = 2; seg[0, 41:] = 3   # a reset exactly at a shard boundary (32 = 1 shard of 32, 2 of 16)
seg[1, 10:] = 2; seg[1, 100:] = 3  # documents crossing boundaries
seg[2, 64:] = 2
toks = rng.integers(1, 500, (B, S + 1)).astype(np.int32)
batch = {"inputs": toks[:, :-1], "targets": toks[:, 1:], "segment_ids": seg,
         "positions": np.asarray(positions_from_segments(jnp.asarray(seg), B, S)),
         "loss_mask": np.ones((B, S), np.float32)}
out = {}
for mixer, impl in cases:
    runs = {}
    for name, shape in [("one", [1, 1, 1, 1])] + [(m, meshes[m]) for m in meshes]:
        cfg = T.tiny_config(**{"data.seq_len": S, "train.batch_size": B, "train.num_steps": 3,
                               "train.warmup_steps": 1})
        apply_mixer_name(cfg.model, mixer)
        cfg.model.impl, cfg.model.chunk_size = impl, 16 if impl == "pallas" else 8  # the kernels take 16
        cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.sequence, cfg.mesh.tensor = shape
        mesh = shd.make_mesh(cfg.mesh, jax.devices()[:1] if name == "one" else jax.devices())
        setup = build_setup(cfg, mesh)
        loss_sums = make_loss_sums(setup.model.apply)
        with setup.context():
            state = setup.init(jax.random.PRNGKey(0))
            gb = shd.global_batch_from_local(batch, mesh)
            spec = str(gb["inputs"].sharding.spec)
            loss, grads = jax.jit(jax.value_and_grad(lambda p, b: (lambda s, c: s / c)(*loss_sums(p, b))))(
                state.params, gb)
            losses = []
            for _ in range(steps):
                state, m = setup.train(state, gb)
                losses.append(float(m["loss"]))
        runs[name] = {"loss": float(loss), "spec": spec, "losses": losses,
                      "grads": {jax.tree_util.keystr(k): np.asarray(v) for k, v in
                                jax.tree_util.tree_flatten_with_path(jax.device_get(grads))[0]}}
    one = runs.pop("one")
    scale = max(float(np.max(np.abs(g))) for g in one["grads"].values())
    for name, r in runs.items():
        worst = max((float(np.max(np.abs(r["grads"][k] - g))) / scale, k) for k, g in one["grads"].items())
        out[f"{mixer}/{impl}/{name}"] = {"loss": r["loss"], "loss_one": one["loss"], "grad_err": worst[0],
                                         "worst": worst[1], "spec": r["spec"], "losses": r["losses"],
                                         "losses_one": one["losses"]}
print("RESULT" + json.dumps(out))
"""


ATTENTION = r"""
import json, re, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh
from idattn.layers.attention import causal_attention, sequence_splash
from idattn.ops.sequence import sequence_partition

shape, splash = json.loads(sys.argv[1]), sys.argv[2] == "splash"
rng = np.random.default_rng(0)
B, T, H, D = 2, 256, 4, 16
q, k, v = (rng.normal(size=(B, T, H, D)).astype(np.float32) for _ in range(3))
doc = np.zeros((B, T), np.int32)
doc[0, 64:] = 1; doc[0, 100:] = 2; doc[0, 128:] = 3  # resets exactly at shard boundaries (64 of 4, 128 of 2) and inside
doc[1, 30:] = 1; doc[1, 200:] = 2                   # documents crossing boundaries
w = jnp.cos(jnp.arange(q.size).reshape(q.shape))
loss = lambda f: (lambda q, k, v: jnp.sum(w * f(q, k, v)))
vg = lambda f: jax.value_and_grad(loss(f), argnums=(0, 1, 2))
ref = vg(lambda q, k, v: causal_attention(q, k, v, doc, impl="xla"))(q, k, v)  # one device, no mesh
mesh = Mesh(np.asarray(jax.devices()).reshape(shape), ("data", "fsdp", "sequence", "tensor"))
with jax.set_mesh(mesh):
    plan = sequence_partition(B, H, T)
    fn = ((lambda q, k, v: sequence_splash(q, k, v, doc, plan, interpret=True, block=128)) if splash else
          (lambda q, k, v: causal_attention(q, k, v, doc)))  # the model's call: impl auto, XLA on CPU
    compiled = jax.jit(vg(fn)).lower(q, k, v).compile()
    got = compiled(q, k, v)
txt = compiled.as_text()
bl = B // shape[1]
tables_equal = None
if splash:  # the O(1)-per-block causal mask builds the same block tables as splash's own CausalMask
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    from idattn.layers.attention import causal_block_mask
    tables_equal = True
    for t, blk, shards in ((2048, 128, 4), (1024, 256, 2)):
        sizes = sk.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk, block_kv_dkv=blk,
                              block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk)
        a, b = (jax.tree.leaves(sk.make_splash_mha(sm.MultiHeadMask([m] * 2), head_shards=1, q_seq_shards=shards,
                                                   block_sizes=sizes))
                for m in (sm.CausalMask((t, t)), causal_block_mask(t)))
        tables_equal &= len(a) == len(b) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))
err = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)))
print("RESULT" + json.dumps({
    "err": err, "plan": [list(a) for a in plan[1:]], "tables_equal": tables_equal,
    # K and V gathered over the sequence: [rows, T, local heads, D] results of all-gathers
    "kv_gathers": len(re.findall(r"f32\[%d,%d,%d,%d\][^=]*all-gather" % (bl, T, H // shape[3], D), txt)),
    "full_scores": sorted(set(re.findall(r"\w+\[[\d,]*%d,%d\]" % (T, T), txt)))}))
"""


@pytest.mark.parametrize("kind,shape", [
    # sequence 4 x fsdp 2: the CPU / GPU path (the model's call); the default suite checks it in the operator test
    pytest.param("xla", [1, 2, 4, 1], marks=pytest.mark.slow),
    pytest.param("splash", [1, 2, 2, 2], marks=pytest.mark.slow)])  # the TPU kernel, interpreted (~90 s)
def test_softmax_split_over_the_sequence_gathers_kv_and_equals_one_device(kind, shape):
    """Softmax under the sequence axis: explicit all_gather of K and V inside shard_map, causal on global offsets,
    documents by id (resets at and across boundaries); value and every gradient equal the unsplit call (float32,
    atol 2e-5); no [T, T] score array in the compiled program (each device scores only its own queries)."""
    res = _run(ATTENTION, json.dumps(shape), kind)
    assert res["plan"][1] == ["sequence"], res  # the split path ran, not a fallback
    assert res["err"] < 2e-5, res
    assert res["kv_gathers"] >= 2 and res["full_scores"] == [], res
    assert res["tables_equal"] is (True if kind == "splash" else None), res  # causal_block_mask = CausalMask


EVAL = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_disable_most_optimizations", True)  # compile time dominates (conftest.fast_compile)
from flax.linen import partitioning as nn_partitioning
from idattn.configs import DEFAULT_LOGICAL_AXIS_RULES
from idattn.eval.scoring import model_score_fn, sequence_mesh
from idattn.layers.common import positions_from_segments
from idattn.models import build_model
from idattn.models.spec import apply_mixer_name
from idattn.train import sharding as shd
from idattn.train.trainer import build_setup
from tests import train_helpers as T

mixers, trainer = json.loads(sys.argv[1]), sys.argv[2] == "trainer"
B, S = 2, 256
rng = np.random.default_rng(0)
toks = rng.integers(1, 500, (B, S + 1)).astype(np.int32)
out = {}
for mixer in mixers:
    cfg = T.tiny_config(**{"data.seq_len": S, "train.batch_size": 4})
    apply_mixer_name(cfg.model, mixer)
    cfg.model.chunk_size = 16
    if not trainer:  # long-context scoring (python -m idattn.eval --sequence=8): score_fn on a sequence mesh
        model = build_model(cfg.model)
        params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 16), jnp.int32))["params"]
        one = model_score_fn(model, params)(toks[:, :-1], toks[:, 1:])
        split_fn = model_score_fn(model, params, mesh=sequence_mesh(8))
        split = split_fn(toks[:, :-1], toks[:, 1:])
        mesh = sequence_mesh(8)
        placed = jax.device_put(toks[:, :-1], jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "sequence")))
        with jax.set_mesh(mesh), nn_partitioning.axis_rules(DEFAULT_LOGICAL_AXIS_RULES):
            txt = jax.jit(lambda p, t: model.apply({"params": p}, t)).lower(
                jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())), placed
            ).compile().as_text()
        out[mixer] = {"logp_err": float(np.max(np.abs(one[0] - split[0]))), "greedy_same": bool((one[1] == split[1]).all()),
                      "logp_mean": float(one[0].mean()), "all_gathers": txt.count("all-gather")}
        continue
    seg = np.ones((4, S), np.int32); seg[0, 64:] = 2; seg[1, 100:] = 3  # a reset at a boundary of 4, one across
    batch = {"inputs": np.tile(toks[:, :-1], (2, 1)), "targets": np.tile(toks[:, 1:], (2, 1)), "segment_ids": seg,
             "positions": np.asarray(positions_from_segments(jnp.asarray(seg), 4, S)),
             "loss_mask": np.ones((4, S), np.float32)}
    sums = {}
    for name, shape in (("one", (1, 1, 1, 1)), ("split", (1, 2, 4, 1))):  # the trainer's eval step, seq 4 x fsdp 2
        cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.sequence, cfg.mesh.tensor = shape
        mesh = shd.make_mesh(cfg.mesh, jax.devices()[:1] if name == "one" else jax.devices())
        setup = build_setup(cfg, mesh)
        with setup.context():
            state = setup.init(jax.random.PRNGKey(0))
            gb = shd.global_batch_from_full(batch, mesh)
            s_, c_ = setup.eval(state.params, gb)
        sums[name] = (float(s_), float(c_), str(gb["inputs"].sharding.spec))
    out[mixer] = {"one": sums["one"], "split": sums["split"]}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow  # ~25 s on idle cores: four tiny-model forward programs on 1 and 8 devices
def test_long_context_scoring_split_over_the_sequence_equals_one_device():
    """`python -m idattn.eval --sequence=8` (scoring.make_score_fn(mesh=sequence_mesh(8))): the per-token log-probs
    of the tiny Interdomain and Softmax models with the length split over 8 devices equal the unsplit scorer's
    (float32, 2e-5), and the program gathers over the sequence axis (states / K and V: the split path ran)."""
    res = _run(EVAL, json.dumps(["interdomain", "softmax"]), "score")
    for mixer, r in res.items():
        assert r["logp_err"] < 2e-5 and r["greedy_same"], (mixer, r)
        assert r["all_gathers"] >= 1, (mixer, r)
        assert r["logp_mean"] < -1, (mixer, r)  # real scores (a random model: about -ln 512)


@pytest.mark.slow  # ~40 s: two trainer setups per mixer
def test_trainer_eval_split_over_the_sequence_equals_one_device():
    """The trainer's eval step (validation loss sums) on sequence 4 x fsdp 2 equals one device's, with a reset at a
    shard boundary and documents across boundaries."""
    res = _run(EVAL, json.dumps(["interdomain", "softmax"]), "trainer")
    for mixer, r in res.items():
        assert "sequence" in r["split"][2], (mixer, r)
        np.testing.assert_allclose(r["split"][:2], r["one"][:2], rtol=2e-6, err_msg=mixer)


def _run(script, *args, timeout=900):
    env = dict(T.subprocess_env(), XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=T.REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])


@pytest.mark.parametrize("meshes", [
    [[4, 1, 2]],  # sequence 4 x tensor 2 (heads split too): shards of 16, resets at the boundaries 16 and 32
    pytest.param([[8, 1, 1], [2, 2, 2], [4, 2, 1]], marks=pytest.mark.slow)])
def test_operators_split_over_the_sequence_equal_the_sequential_reference(meshes):
    res = _run(OPERATOR, json.dumps(meshes))
    assert res.pop("end_state") < 1e-12
    init = res.pop("initial_state")  # a cached state in, the end state out (prefill on the mesh): exact too
    assert init["interdomain"] < 1e-10 and init["linear"] < 1e-10, init
    att = res.pop("softmax")  # Softmax on the first mesh: explicit K / V gathers, no [T, T] scores, exact
    # (to 1e-6: jax's XLA attention takes its softmax in float32 even under x64)
    assert att["err"] < 1e-6 and att["kv_gathers"] >= 2 and att["full_scores"] == [], att
    for shape, r in res.items():
        assert r["interdomain"] < 1e-10 and r["linear"] < 1e-10, (shape, r)
        assert r["all_gathers"] >= 1, (shape, r)  # the states were gathered: the split path ran


def _check_model(res, steps):
    for case, r in res.items():
        assert "sequence" in r["spec"], (case, r["spec"])  # the batch really is split along the length
        np.testing.assert_allclose(r["loss"], r["loss_one"], rtol=2e-6, err_msg=case)
        assert r["grad_err"] < 2e-5, (case, r["grad_err"], r["worst"])
        if steps:
            np.testing.assert_allclose(r["losses"], r["losses_one"], rtol=2e-5, err_msg=case)
            assert r["losses"][-1] < r["losses"][0], (case, r["losses"])


@pytest.mark.slow  # ~80 s on 2 cores; the default suite keeps the operator check
def test_interdomain_model_split_over_the_sequence_equals_one_device():
    res = _run(MODEL, json.dumps([["interdomain", "chunked"]]), json.dumps({"seq4xfsdp2": [1, 2, 4, 1]}), "0")
    assert set(res) == {"interdomain/chunked/seq4xfsdp2"}
    _check_model(res, steps=0)


@pytest.mark.slow  # ~6 min on 2 cores: eight tiny-model programs on 8 fake devices, one with Pallas interpreted
def test_every_mixer_split_over_the_sequence_equals_one_device_and_trains():
    cases = [["interdomain", "pallas"], ["s4d_only", "chunked"], ["dualkv-linear-norope", "chunked"],
             ["softmax", "auto"]]
    res = _run(MODEL, json.dumps(cases), json.dumps({"seq4xfsdp2": [1, 2, 4, 1]}), "0", timeout=1800)
    assert len(res) == len(cases)
    _check_model(res, steps=0)
    res = _run(MODEL, json.dumps([["generic-query-rope", "chunked"]]), json.dumps({"seq8": [1, 1, 8, 1]}), "3")
    assert len(res) == 1
    _check_model(res, steps=3)


def test_sequence_split_refusals_and_old_configs():
    import jax

    from idattn.train import sharding as shd
    assert shd.mesh_shape({"data": 1, "fsdp": -1, "tensor": 1}, 1) == (1, 1, 1, 1)  # saved before the axis existed
    mesh = shd.make_mesh({"data": 1, "fsdp": 1, "sequence": 1, "tensor": 1}, jax.devices()[:1])
    shd.check_sequence_split(30, mesh)  # size 1: anything goes

    class FakeMesh:  # two processes, each holding one device of a sequence group of 2
        shape = {"data": 1, "fsdp": 1, "sequence": 2, "tensor": 1}
        devices = np.array([type("D", (), {"process_index": i})() for i in range(2)]).reshape(1, 1, 2, 1)

    with pytest.raises(ValueError, match=r"data.seq_len=31 is not divisible by config.mesh.sequence=2"):
        shd.check_sequence_split(31, FakeMesh)
    # a group across processes is accepted (issue 37): every process then reads the whole global batch
    shd.check_sequence_split(32, FakeMesh)
    assert shd.sequence_spans_processes(FakeMesh) and not shd.sequence_spans_processes(mesh)


@pytest.mark.slow  # two trainer launches per mixer (~1-2 min each on 2 cores)
@pytest.mark.parametrize("mixer", ["interdomain", "softmax"])
def test_sequence_group_across_two_processes_matches_one_device(tmp_path, env, mixer):
    """Issue 37: a sequence group that spans processes. Two processes of 2 CPU devices each (launch/local.py, gloo
    collectives), mesh sequence = 4: every group has devices of both processes, so each process reads the whole
    global batch and keeps its devices' blocks. Its per-step losses equal one device's (no split) to float32
    reduction order: the state hand-off (Interdomain) and the K/V gather (Softmax) cross the process boundary."""
    import os
    import re
    overrides = {"train.batch_size": 2, "train.num_steps": 3, "train.warmup_steps": 1, "train.checkpoint_every": 3,
                 "mesh.fsdp": 1, "model.chunk_size": 8}
    config = T.TINY_CONFIG.replace("softmax,tiny", f"{mixer},tiny")
    mp = str(tmp_path / "two-processes")
    cmd = [sys.executable, os.path.join(T.REPO, "launch", "local.py"), "--num_processes=2", "--devices_per_process=2",
           "--port=0", "--"] + T.train_command(mp, config=config, overrides={**overrides, "mesh.sequence": 4})[1:]
    proc = subprocess.run(cmd, cwd=T.REPO, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "over 2 process(es); mesh {'data': 1, 'fsdp': 1, 'sequence': 4, 'tensor': 1}; a sequence group spans " \
           "processes" in out, out[-3000:]
    finals = dict(re.findall(r"\[process (\d)\] final step 3 loss (\S+)", out))
    assert set(finals) == {"0", "1"} and finals["0"] == finals["1"], out[-3000:]
    one = str(tmp_path / "one-device")
    T.run_train(one, config=config, overrides={**overrides, "mesh.sequence": 1}, env=env, timeout=900)
    got, want = T.read_metrics(mp), T.read_metrics(one)
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in want], rtol=2e-6)
    assert want[-1]["loss"] < want[0]["loss"] + 0.5  # it trained, it did not blow up


PREFILL = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_disable_most_optimizations", True)  # compile time dominates (conftest.fast_compile)
import flax.linen as nn
from idattn.configs import base_config
from idattn.models import apply_mixer_name, build_model, decoding
from idattn.eval.scoring import prefill_on_mesh, sequence_mesh
from idattn.ops import sequence as seq_ops

calls = []
real = seq_ops.incoming_state
def counted(*a, **k):
    calls.append(k.get("initial") is not None)
    return real(*a, **k)
seq_ops.incoming_state = counted  # looked up at trace time: proves the split path ran, with the cached state

out = {}
mesh = sequence_mesh(4)
for mixer in json.loads(sys.argv[1]):
    c = base_config().model
    c.update(dict(vocab_size=64, d_model=64, num_layers=2, num_heads=2, head_dim=32, ffn_dim=128, num_modes=8,
                  dtype="float32", remat="none", chunk_size=8, impl="chunked", attn_impl="xla"))
    apply_mixer_name(c, mixer)
    m = build_model(c)
    tok = jax.random.randint(jax.random.PRNGKey(2), (2, 48), 0, 64)
    p = nn.meta.unbox(jax.jit(m.init)(jax.random.PRNGKey(0), tok[:, :8])["params"])
    full = np.asarray(jax.jit(m.apply)({"params": p}, tok))
    scale = float(np.max(np.abs(full)))
    calls.clear()
    logits, cache = prefill_on_mesh(m, p, tok[:, :40], decoding.init_cache(m, 2, 48), mesh, chunk_size=16)
    split_calls = len(calls)
    _, ref_cache = decoding.prefill(m, p, tok[:, :40], decoding.init_cache(m, 2, 48), chunk_size=16)
    cache_err = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) / max(1e-30, float(np.max(np.abs(np.asarray(b)))))
                    for a, b in zip(jax.tree_util.tree_leaves(cache), jax.tree_util.tree_leaves(ref_cache))
                    if np.asarray(b).dtype != np.int32)
    dec = []
    for t in range(40, 48):
        lg, cache = decoding.decode_step(m, p, tok[:, t], cache)
        dec.append(np.asarray(lg))
    out[mixer] = {"prefill": float(np.max(np.abs(logits - full[:, :40]))) / scale,
                  "decode": float(np.max(np.abs(np.stack(dec, 1) - full[:, 40:]))) / scale,
                  "cache": cache_err, "split_calls": split_calls, "with_state": sum(calls)}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow  # ~40-90 s a subprocess (the default suite's budget); the float64 operator check above is default
@pytest.mark.parametrize("mixers", [["interdomain", "s4d_only", "softmax"],
                                    ["interdomain-selective+phase", "generic-linear-rope"]])
def test_prefill_split_over_the_sequence_then_decode_equals_the_full_forward(mixers):
    """Issue 37 item 3: a 40-token prompt prefilled in chunks of 16 (and a last one of 8), each chunk's length split
    over 4 devices (`prefill_on_mesh`), the cached state handed into shard 0 and folded through the shards; then 8
    decode steps from the gathered cache. Logits at every prompt position and every decoded one equal the full
    forward's (float32, 1e-5 of the largest logit); the recurrent layers took the split path with the cached state
    (its state fold ran, with an initial state after the first chunk)."""
    res = _run(PREFILL, json.dumps(mixers))
    for mixer in mixers:
        r = res[mixer]
        assert r["prefill"] < 1e-5 and r["decode"] < 1e-5 and r["cache"] < 1e-5, (mixer, r)  # cache: as unsplit
        if mixer != "softmax":
            # traced once per chunk shape (16, then the last 8), every time with the cached state entering shard 0
            assert r["split_calls"] >= 2 and r["with_state"] == r["split_calls"], (mixer, r)
