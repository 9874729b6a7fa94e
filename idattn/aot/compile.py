"""Ahead-of-time compilation of the real train / eval / decode steps for a target topology, on any host.

    python -m idattn.aot --config=experiments/scaling.py:interdomain,1.3b --topology=v5p-128 \
        [--num_slices=N] [--steps=train,eval,decode] [--json=out.json] [--config.<key>=<value> ...]

What is compiled: `idattn.train.trainer.build_setup(config, mesh)` — the same jitted functions, shardings and
donation the trainer runs — lowered with abstract inputs (`jax.ShapeDtypeStruct` with `NamedSharding`s, nothing
allocated) for the target's devices (`idattn.aot.tpu.tpu_target`, `idattn.aot.gpu.gpu_target`) and compiled by
the target's compiler: XLA:TPU with its Mosaic kernels for TPU (libtpu; compile-only devices). The global batch
is `train.batch_size × data.seq_len`; the mesh is `config.mesh` (one axis may be -1), times a data-parallel
DCN axis across slices when `--num_slices > 1`. The decode step is one token per row for `train.batch_size`
rows against a cache of `data.seq_len` positions.

`model.impl="auto"` and `model.attn_impl="auto"` are resolved as they would be on the target: the fused Pallas
operator (`impl="pallas"`) on TPU / GPU when the chunk size suits its kernels; the attention kernel is chosen
by the lowering platform anyway (see idattn.layers.attention).

Printed per step (per chip, from `compiled.memory_analysis()`): argument, output, temporary and aliased bytes,
and their total `argument + output − alias + temp` against the chip's HBM; FLOPs per step per chip from
`compiled.cost_analysis()` (XLA's count: custom kernels — Mosaic / Triton — are counted by their cost
estimate if they give one, else not at all, and a loop body counts once, so with `scan_layers` the layer stack
counts as one layer), beside the model's training FLOPs per chip for the train step
(`idattn.models.flops_per_token` × tokens per chip, the MFU numerator); the collectives in the compiled program by kind (count, bytes
of their results). The last line:

    aot: <config> on <topology> mesh <d>x<f>x<t>: <GiB> per chip of <HBM GiB>: fits|does not fit

for the largest step (the train step in practice). Exit status: 0 fits, 1 does not fit, 2 did not compile
(or bad arguments).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from idattn.aot import gpu, tpu
from idattn.models import flops_per_token
from idattn.models.decoding import init_cache
from idattn.models.spec import mixer_core, mixer_delta
from idattn.ops.pallas import chunk_size_supported
from idattn.train import sharding as shd
from idattn.train.step import BATCH_KEYS
from idattn.train.trainer import build_setup

GiB = 1024 ** 3
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "ragged-all-to-all", "collective-broadcast")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}


class AotError(RuntimeError):
    """Did not compile, or bad arguments (exit status 2)."""


def get_target(topology: str, num_slices: int = 1):
    """TPU names (v4-*, v5p-*, v5e-*, v6e-*, <gen>:<shape>) via idattn.aot.tpu; h100* / h200* (and NxhostsxM
    GPU names) via idattn.aot.gpu."""
    t = str(topology).strip().lower()
    if t.startswith(("h100", "h200")) or re.fullmatch(r"\d+x?hosts?x\d+.*", t) or t.startswith(("a100", "b200")) \
            or re.fullmatch(r"\d+x(h100|h200)x\d+", t):  # <hosts>x<card>x<per host>, e.g. 2xh200x8
        if num_slices != 1:
            raise AotError(f"--num_slices={num_slices}: GPU targets name their hosts in the topology (e.g. 4xhostsx8)")
        return gpu.gpu_target(topology)
    return tpu.tpu_target(topology, num_slices)


def resolve_auto(config, platform: str) -> list[str]:
    """impl='auto' -> what it picks on the target (pallas on TPU/GPU where the kernels take the chunk size)."""
    notes = []
    m = config.model
    if str(m.impl) == "auto" and platform in ("tpu", "gpu"):
        fam = "tpu" if platform == "tpu" else "gpu"
        impl = "pallas" if chunk_size_supported(int(m.chunk_size), fam) else "chunked"
        with m.unlocked() if hasattr(m, "unlocked") else _null():
            m.impl = impl
        # the delta update and the selective core have no kernel: their layers run the chunked form under "pallas"
        mixer = str(m.mixer)
        chunked = [what for what, on in (("the delta update", mixer_delta(mixer)[1]),
                                         ("the selective core", mixer_core(mixer)[1] != "lti")) if on]
        notes.append(f"model.impl=auto -> {impl} (as on {platform})" + (
            f"; {' and '.join(chunked)} {'has' if len(chunked) == 1 else 'have'} no kernel: those layers run "
            "impl=chunked" if impl == "pallas" and chunked
            else ""))
    return notes


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _collective_ops(hlo_text: str):
    """(kind, bytes of its result on one device, the line) per collective op in the HLO text (an async -start op
    once, counting the result half of its (operands, results, ...) tuple; -done ops not)."""
    pat = re.compile(r"=\s*(\(?[^=]*?\)?)\s+(" + "|".join(map(re.escape, COLLECTIVES)) + r")(-start)?\(")
    for line in hlo_text.splitlines():
        m = pat.search(line)
        if not m:
            continue
        nbytes = 0
        for dt, dims in re.findall(r"(\w+)\[([\d,]*)\]", m.group(1)):
            if dt in _DTYPE_BYTES:
                n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
                nbytes += n * _DTYPE_BYTES[dt]
        if m.group(3):
            nbytes //= 2
        yield m.group(2), nbytes, line


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """{kind: {"count", "bytes"}} over the compiled HLO (async -start ops counted once, -done ops not)."""
    out: dict[str, dict[str, int]] = {}
    for kind, nbytes, _ in _collective_ops(hlo_text):
        e = out.setdefault(kind, {"count": 0, "bytes": 0})
        e["count"] += 1
        e["bytes"] += nbytes
    return out


def replica_groups(line: str) -> list[list[int]] | None:
    """The device groups of one collective's HLO line: explicit `replica_groups={{0,1},{2,3}}` (a collective-
    permute's `source_target_pairs` as groups of two), XLA's iota form `replica_groups=[G,S]<=[d0,d1,...]` /
    `...<=[d0,d1]T(1,0)` (arange over the dims, transposed, reshaped to G groups of S), or its mesh form
    `replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_1'}` (row-major over those axes; groups span the named
    ones). With `use_global_device_ids` (SPMD) the ids are positions in the mesh's flattened device
    array, not device ids (checked on a permuted CPU mesh in tests/test_aot_tpu.py). None if the line has none."""
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:
        shape = [int(x) for x in m.group(1).split(",")]
        dims = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        return ids.reshape(shape[0], -1).tolist()
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:  # the compiler's own mesh: 'axis_i'=size, row-major; the braces name the axes a group spans
        axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
        names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
        span = [names.index(a) for a in re.findall(r"'([^']+)'", m.group(2))]
        ids = np.arange(math.prod(sizes)).reshape(sizes)
        ids = ids.transpose([i for i in range(len(sizes)) if i not in span] + span)
        return ids.reshape(-1, math.prod(sizes[i] for i in span)).tolist()
    m = re.search(r"(?:replica_groups|source_target_pairs)=\{((?:\{[\d,]*\},?)*)\}", line)
    if m:  # explicit groups; a collective-permute's (source, target) pairs read as groups of two
        return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
    return None


def collectives_by_axis(hlo_text: str, axis_names, axis_sizes) -> dict[str, dict[str, int]]:
    """{"<kind> over <axes>": {"count", "bytes"}}: `collectives` split by the mesh axes each collective's groups
    span (the axes along which a group's members differ, e.g. "all-gather over sequence" is the sequence axis's
    state or K/V gather; "fsdp+sequence" a gradient reduction over both). Bytes are each op's result on one
    device, counted once per op in the text: an op inside the scanned layer stack's loop body counts once, i.e.
    per layer. Ops without readable groups are "over ?"."""
    shape = tuple(int(n) for n in axis_sizes)
    out: dict[str, dict[str, int]] = {}
    for kind, nbytes, line in _collective_ops(hlo_text):
        groups = replica_groups(line)
        axes = "?"
        if groups and max(max(g) for g in groups if g) < math.prod(shape):
            coords = np.array(np.unravel_index(np.array(groups[0]), shape)).T  # [members, axes]
            varying = [n for n, c in zip(axis_names, coords.T) if len(set(c.tolist())) > 1]
            axes = "+".join(varying) or "none"
        e = out.setdefault(f"{kind} over {axes}", {"count": 0, "bytes": 0})
        e["count"] += 1
        e["bytes"] += nbytes
    return out


@dataclasses.dataclass
class StepReport:
    name: str
    compile_s: float
    argument: int
    output: int
    temp: int
    alias: int
    flops: float | None
    collectives: dict
    mosaic: int  # number of Mosaic (tpu_custom_call) / Triton custom calls in the compiled program
    model_flops: float | None = None  # train: flops_per_token x tokens per chip (idattn.models), for comparison
    by_axis: dict = dataclasses.field(default_factory=dict)  # collectives_by_axis: "<kind> over <mesh axes>"

    @property
    def total(self) -> int:
        return self.argument + self.output - self.alias + self.temp


def _flops(compiled) -> float | None:
    try:
        ca = compiled.cost_analysis()
    except Exception:
        return None
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else None
    if not ca:
        return None
    f = ca.get("flops")
    return float(f) if f is not None else None


def _report(name, compiled, seconds, mesh=None) -> StepReport:
    ma = compiled.memory_analysis()
    txt = compiled.as_text()
    by_axis = collectives_by_axis(txt, mesh.axis_names, mesh.devices.shape) if mesh is not None else {}
    kernels = txt.count("tpu_custom_call") + txt.count("__gpu$xla.gpu.triton") + txt.count("triton_kernel_call")
    return StepReport(name=name, compile_s=seconds, argument=int(ma.argument_size_in_bytes),
                      output=int(ma.output_size_in_bytes), temp=int(ma.temp_size_in_bytes),
                      alias=int(ma.alias_size_in_bytes), flops=_flops(compiled), collectives=collectives(txt),
                      mosaic=kernels, by_axis=by_axis)


def _device_count_hint(msg: str, target) -> str:
    """For a mesh of the wrong size on a v4 / v5p slice: its names count TensorCores (2 per chip, one JAX device
    per chip), the usual way to ask for twice the devices a slice has."""
    m = re.search(r"needs (\d+) devices but (\d+) are available", msg)
    gen = re.match(r"(v4|v5p)-\d+$", str(target.name))
    if not (m and gen):
        return ""
    want = int(m.group(1))
    return (f" ({target.name} is {m.group(2)} chips, one device each: {gen.group(1)}-N counts TensorCores, 2 per "
            f"chip; {want} devices is --topology={gen.group(1)}-{2 * want})")


def compile_steps(config, target, steps=("train", "eval", "decode"), log=print) -> tuple[Any, list[StepReport]]:
    """Builds the mesh on the target's devices and compiles the requested steps. Returns (mesh, reports)."""
    try:
        mesh = shd.make_mesh(config.mesh, target.devices, num_slices=target.num_slices)
        shd.check_batch_divisible(int(config.train.batch_size), int(config.train.grad_accum), mesh, 1)
        shd.check_sequence_split(int(config.data.seq_len), mesh)
        setup = build_setup(config, mesh)
    except (ValueError, KeyError) as e:
        raise AotError(str(e) + _device_count_hint(str(e), target)) from e
    B, S = int(config.train.batch_size), int(config.data.seq_len)
    batch = {k: jax.ShapeDtypeStruct((B, S), jnp.float32 if k == "loss_mask" else jnp.int32,
                                     sharding=setup.batch_shardings[k]) for k in BATCH_KEYS}
    reports = []
    for step in steps:
        t0 = time.perf_counter()
        try:
            with setup.context():
                if step == "train":
                    lowered = setup.train.lower(setup.abstract_state, batch)
                elif step == "eval":
                    lowered = setup.eval.lower(setup.abstract_state.params, batch)
                elif step == "decode":
                    lowered = _lower_decode(config, setup, mesh, B, S)
                else:
                    raise AotError(f"--steps: unknown step {step!r}; expected train, eval, decode")
                opts = None
                if target.platform == "gpu":  # pin ptxas / libdevice to the nvcc wheel (idattn/aot/gpu.py)
                    opts = gpu.compiler_options() or None
                compiled = lowered.compile(compiler_options=opts)
        except AotError:
            raise
        except Exception as e:
            raise AotError(f"{step} step did not compile: {type(e).__name__}: {str(e).splitlines()[0][:2000]}") from e
        rep = _report(step, compiled, time.perf_counter() - t0, mesh)
        if step == "train":
            try:
                rep.model_flops = float(flops_per_token(config.model, S)) * B * S / mesh.size
            except Exception:  # informative only
                pass
        reports.append(rep)
        log(format_step(rep, target))
    return mesh, reports


def _lower_decode(config, setup, mesh, B, S):
    """One decode step: token [B] against a cache of S positions (batch rows over the batch shards)."""
    model = setup.model
    cache = jax.eval_shape(lambda: init_cache(model, B, max_len=S))
    bx = shd.batch_axes(mesh) if B % shd.batch_size_per_shard(mesh) == 0 else None

    def cache_sh(a):
        if a.ndim >= 2:  # [layers, B, ...]
            return NamedSharding(mesh, P(None, bx))
        return NamedSharding(mesh, P())

    cache = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=cache_sh(a)), cache)
    token = jax.ShapeDtypeStruct((B,), jnp.int32, sharding=NamedSharding(mesh, P(bx)))

    def step(params, token, cache):
        logits, new_cache = model.apply({"params": params}, token[:, None], cache=cache)
        return logits[:, -1], new_cache

    fn = jax.jit(step, in_shardings=(setup.param_sh, token.sharding, jax.tree.map(lambda a: a.sharding, cache)),
                 out_shardings=(NamedSharding(mesh, P(bx)), jax.tree.map(lambda a: a.sharding, cache)),
                 donate_argnums=(2,))
    return fn.lower(setup.abstract_state.params, token, cache)


def _gib(n: float) -> str:
    return f"{n / GiB:.2f}"


def format_step(r: StepReport, target) -> str:
    coll = ", ".join(f"{k} {v['count']} ({_gib(v['bytes'])} GiB)" for k, v in sorted(r.collectives.items())) or "none"
    seq = {k: v for k, v in r.by_axis.items() if k.endswith(" over sequence")}
    if seq:  # the sequence axis's own traffic (state passing / K,V gather), per op in the text (a scanned layer once)
        coll += "; over the sequence axis alone: " + ", ".join(
            f"{k.split(' over ')[0]} {v['count']} ({v['bytes'] / 2 ** 20:.2f} MiB)" for k, v in sorted(seq.items()))
    fl = "n/a" if r.flops is None else f"{r.flops:.4g}"
    if getattr(r, "model_flops", None):
        fl += f" (model: {r.model_flops:.4g})"
    return (f"[{r.name}] compiled in {r.compile_s:.1f} s; per chip: arguments {_gib(r.argument)} GiB, outputs "
            f"{_gib(r.output)} GiB, temporaries {_gib(r.temp)} GiB, aliased {_gib(r.alias)} GiB -> total "
            f"{_gib(r.total)} GiB of {target.hbm_gib:.0f} GiB; FLOPs per chip {fl}; kernels "
            f"(custom calls) {r.mosaic}; collectives: {coll}")


def mesh_str(mesh) -> str:
    axes = ("data", "fsdp", "sequence", "tensor") if dict(mesh.shape).get("sequence", 1) > 1 else ("data", "fsdp", "tensor")
    return "x".join(str(mesh.shape[a]) for a in axes)


def final_line(config_name: str, topology: str, mesh, reports: list[StepReport], target) -> tuple[str, bool]:
    worst = max(reports, key=lambda r: r.total)
    fits = worst.total <= target.hbm_bytes_per_device
    line = (f"aot: {config_name} on {topology} mesh {mesh_str(mesh)}: {_gib(worst.total)} GiB per chip of "
            f"{target.hbm_gib:.0f} GiB: {'fits' if fits else 'does not fit'}")
    return line, fits


def run(config, config_name: str, topology: str, num_slices: int = 1, steps=("train", "eval", "decode"),
        json_path: str | None = None, log=print) -> int:
    t0 = time.perf_counter()
    try:
        target = get_target(topology, num_slices)
    except (ValueError, RuntimeError) as e:
        log(f"error: {e}")
        return 2
    log(f"target: {target.description}")
    for note in resolve_auto(config, target.platform):
        log(note)
    m, t = config.model, config.train
    log(f"config: {config_name}: model {m.mixer} d={m.d_model} layers={m.num_layers} heads={m.num_heads} "
        f"impl={m.impl} attn_impl={m.get('attn_impl', 'auto')} dtype={m.dtype} remat={m.get('remat', 'full')}; "
        f"global batch {t.batch_size} x {config.data.seq_len} tokens, grad_accum {t.grad_accum}, loss_chunk "
        f"{t.get('loss_chunk', 0)}")
    try:
        mesh, reports = compile_steps(config, target, steps, log=log)
    except AotError as e:
        log(f"error: {e}")
        log(f"aot: {config_name} on {topology}: did not compile")
        return 2
    line, fits = final_line(config_name, topology, mesh, reports, target)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"config": config_name, "topology": topology, "num_slices": num_slices,
                       "target": target.description, "mesh": dict(mesh.shape), "hbm_bytes": target.hbm_bytes_per_device,
                       "fits": fits, "wall_s": time.perf_counter() - t0,
                       "steps": [dict(dataclasses.asdict(r), total=r.total) for r in reports]}, f, indent=1)
    log(f"wall time {time.perf_counter() - t0:.1f} s")
    log(line)
    return 0 if fits else 1
