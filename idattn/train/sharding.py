"""The device mesh and the placement of parameters, optimiser state and batches (docs/training.md).

One `jax.sharding.Mesh` with named axes (data, fsdp, sequence, tensor). Sizes come from `config.mesh` (per slice);
one axis may be -1 and takes the remaining devices; `sequence` (default 1, and 1 for configs saved before it
existed) splits the length of every sequence: activations carry the logical length axis on it, and the mixers
pass states between the shards (idattn/ops/sequence.py). Multi-slice: the data axis also spans the slices (DCN), see make_mesh. Parameters carry logical axis names (flax `with_logical_partitioning`);
`config.logical_axis_rules` maps them to mesh axes (default: FSDP over `embed`, tensor parallelism over
heads / MLP / vocab). Batches are split over ("data", "fsdp") on their leading axis and over "sequence" on their
length axis.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np
from flax import linen as nn
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "sequence", "tensor")
BATCH_AXES = ("data", "fsdp")
SEQUENCE_AXIS = "sequence"
_OPTIONAL_AXES = {"sequence": 1}  # axes a config may omit (saved before the axis existed)


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, ...]:
    """Resolves config.mesh (one axis may be -1) against the device count; clear error when impossible."""
    sizes = []
    mesh_cfg = {**_OPTIONAL_AXES, **dict(mesh_cfg)}
    for ax in MESH_AXES:
        if ax not in mesh_cfg:
            raise KeyError(f"config.mesh.{ax} is missing; config.mesh needs keys {MESH_AXES} (sizes, one may be -1)")
        sizes.append(int(mesh_cfg[ax]))
    extra = sorted(set(dict(mesh_cfg).keys()) - set(MESH_AXES))
    if extra:
        raise ValueError(f"config.mesh has unknown axes {extra}; the mesh axes are {MESH_AXES}")
    fill = [i for i, s in enumerate(sizes) if s == -1]
    if len(fill) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"config.mesh={dict(zip(MESH_AXES, sizes))}: sizes must be positive, with at most one -1 "
                         f"(fills the remaining devices)")
    known = math.prod(s for s in sizes if s != -1)
    if fill:
        if num_devices % known:
            raise ValueError(f"config.mesh={dict(zip(MESH_AXES, sizes))}: the fixed axes use {known} devices, which "
                             f"does not divide the {num_devices} devices available; change config.mesh")
        sizes[fill[0]] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(f"config.mesh={dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices but "
                         f"{num_devices} are available; set one axis to -1 or change the sizes")
    return tuple(sizes)


def count_slices(devices: Sequence[jax.Device]) -> int:
    """Number of TPU slices among `devices` (distinct `slice_index`; 1 for devices without one)."""
    return len({getattr(d, "slice_index", 0) for d in devices}) or 1


def make_mesh(mesh_cfg, devices: Sequence[jax.Device] | None = None, num_slices: int | None = None) -> Mesh:
    """The (data, fsdp, sequence, tensor) mesh. `config.mesh` describes one slice (its ICI-connected devices); with several
    slices (multi-slice TPU: devices carry `slice_index`; or `num_slices`), the data axis is multiplied by the
    number of slices — data parallelism over the data-centre network (DCN), the slowest link carrying only the
    gradient all-reduce — with `mesh_utils.create_hybrid_device_mesh` (MaxText's dcn_data_parallelism)."""
    devices = list(jax.devices() if devices is None else devices)
    n_slices = int(num_slices) if num_slices else count_slices(devices)
    if n_slices < 1 or len(devices) % n_slices:
        raise ValueError(f"{len(devices)} devices cannot form {n_slices} equal slices")
    per_slice = mesh_shape(mesh_cfg, len(devices) // n_slices)
    if n_slices > 1:
        try:
            dev = mesh_utils.create_hybrid_device_mesh(per_slice, (n_slices,) + (1,) * (len(MESH_AXES) - 1),
                                                       devices=devices,
                                                       allow_split_physical_axes=True)
        except Exception:  # devices without slice_index (CPU tests): slice k = the k-th block of devices
            dev = np.stack([np.asarray(devices[k * len(devices) // n_slices:(k + 1) * len(devices) // n_slices])
                            .reshape(per_slice) for k in range(n_slices)]).reshape(
                (n_slices * per_slice[0],) + tuple(per_slice[1:]))
        return Mesh(dev, MESH_AXES)
    try:
        dev = mesh_utils.create_device_mesh(per_slice, devices=devices, allow_split_physical_axes=True)
    except Exception:  # CPU / unusual topologies: plain order is fine
        dev = np.asarray(devices).reshape(per_slice)
    return Mesh(host_local_sequence(dev, per_slice), MESH_AXES)


def host_local_sequence(dev: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`dev` unchanged unless a sequence group (the devices along the sequence axis) spans processes while a
    host-major order keeps every (sequence x tensor) block on one host (when sequence x tensor divides every
    process's device count); then that order (devices sorted by
    process, then id). The torus layout of `create_device_mesh` puts the trailing axes across hosts on a v5p
    slice (its 4x4x4 torus has 4 chips per host in 2x2x1 blocks); kept host-local where it can be, each process
    reads only its own rows (a group that spans processes works too: `sequence_spans_processes`)."""
    n = int(shape[MESH_AXES.index(SEQUENCE_AXIS)])
    if n == 1 or not _sequence_spans_processes(dev, n):
        return dev
    flat = sorted(dev.reshape(-1), key=lambda d: (d.process_index, d.id))
    per_proc: dict[int, int] = {}
    for d in flat:
        per_proc[d.process_index] = per_proc.get(d.process_index, 0) + 1
    inner = n * int(shape[MESH_AXES.index("tensor")])  # the trailing (sequence, tensor) block of the mesh
    if any(c % inner for c in per_proc.values()):
        return dev  # cannot be made host-local: every process will read the whole batch
    return np.asarray(flat, dtype=object).reshape(shape)


def _sequence_spans_processes(dev: np.ndarray, n: int) -> bool:
    """Whether some group of `n` devices along the sequence axis of the device array `dev` has devices of more
    than one process."""
    groups = np.moveaxis(np.asarray(dev), MESH_AXES.index(SEQUENCE_AXIS), -1).reshape(-1, n)
    return any(len({d.process_index for d in g}) > 1 for g in groups)


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    return BATCH_AXES


def normalize_rules(rules: Any) -> tuple[tuple[str, Any], ...]:
    """Rules as saved in JSON come back as lists; flax wants tuples (mesh axes may be a str, tuple or None)."""
    out = []
    for item in rules:
        if len(item) != 2:
            raise ValueError(f"config.logical_axis_rules: each rule is (logical_name, mesh_axes); got {item!r}")
        name, axes = item
        if isinstance(axes, list):
            axes = tuple(axes)
        out.append((str(name), axes))
    return tuple(out)


def batch_size_per_shard(mesh: Mesh) -> int:
    return int(mesh.shape["data"] * mesh.shape["fsdp"])


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """[B, T, ...] batch arrays: rows over the batch axes, tokens over the sequence axis."""
    if ndim < 2:
        return NamedSharding(mesh, P(BATCH_AXES))
    return NamedSharding(mesh, P(BATCH_AXES, SEQUENCE_AXIS, *([None] * (ndim - 2))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def logical_param_shardings(boxed_abstract_params, mesh: Mesh, rules) -> Any:
    """NamedShardings for a (possibly boxed) abstract parameter tree; unannotated leaves are replicated."""
    specs = nn.get_partition_spec(boxed_abstract_params)
    return nn.logical_to_mesh_sharding(specs, mesh, normalize_rules(rules))


def check_batch_divisible(global_batch: int, grad_accum: int, mesh: Mesh, process_count: int) -> int:
    """Returns the microbatch size; refuses a batch the mesh / accumulation / hosts cannot divide (hosts: only
    when each reads its own rows, i.e. no sequence group spans processes)."""
    if grad_accum < 1:
        raise ValueError(f"config.train.grad_accum={grad_accum}: must be >= 1")
    shards = batch_size_per_shard(mesh)
    if global_batch % grad_accum:
        raise ValueError(f"config.train.batch_size={global_batch} is not divisible by config.train.grad_accum="
                         f"{grad_accum}; choose a batch size that is a multiple of grad_accum")
    micro = global_batch // grad_accum
    if micro % shards:
        raise ValueError(
            f"config.train.batch_size={global_batch} with grad_accum={grad_accum} gives microbatches of {micro} "
            f"sequences, which the mesh cannot split over its data x fsdp = {mesh.shape['data']} x "
            f"{mesh.shape['fsdp']} = {shards} batch shards; use a batch size that is a multiple of "
            f"{shards * grad_accum} (or change config.mesh / grad_accum)")
    if global_batch % process_count and not sequence_spans_processes(mesh):
        raise ValueError(f"config.train.batch_size={global_batch} is not divisible by the {process_count} "
                         f"processes (each host reads batch_size / processes rows; or split the sequence over "
                         f"hosts with config.mesh.sequence, and every host reads the whole batch)")
    return micro


def global_batch_from_local(local: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Each process holds its contiguous rows of the global batch, every token of them; builds global arrays
    sharded over the batch (and the sequence axis: the global length equals the local one, so each device picks
    its tokens out of the process's rows)."""
    out = {}
    for k, v in local.items():
        v = np.asarray(v)
        shape = (v.shape[0] * jax.process_count(),) + v.shape[1:]
        out[k] = jax.make_array_from_process_local_data(batch_sharding(mesh, v.ndim), v, shape)
    return out


def check_sequence_split(seq_len: int, mesh: Mesh) -> None:
    """Refuses a length the sequence axis does not divide."""
    n = int(dict(mesh.shape).get(SEQUENCE_AXIS, 1))
    if n > 1 and seq_len % n:
        raise ValueError(f"config.data.seq_len={seq_len} is not divisible by config.mesh.sequence={n}; use a "
                         f"length that is a multiple of {n}")


def sequence_spans_processes(mesh: Mesh) -> bool:
    """True when the devices of some sequence group belong to more than one process (a long context split over
    hosts). Each process then reads the whole global batch and keeps its devices' blocks of it
    (`global_batch_from_full`) instead of whole rows of its own (`global_batch_from_local`): every process packs
    the global batch anyway (idattn.data.pipeline, "Order"), so this reads nothing more, and the stream, its
    checkpointed state and elastic resume are the same (docs/pods.md, "Long context across hosts")."""
    n = int(dict(mesh.shape).get(SEQUENCE_AXIS, 1))
    return n > 1 and _sequence_spans_processes(mesh.devices, n)


def global_batch_from_full(full: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Every process holds the same full batch (evaluation); each device takes its slice."""
    out = {}
    for k, v in full.items():
        v = np.asarray(v)
        out[k] = jax.make_array_from_callback(v.shape, batch_sharding(mesh, v.ndim), lambda idx, v=v: v[idx])
    return out


def opt_state_shardings(abstract_opt_state, param_shardings, mesh: Mesh) -> Any:
    """Shardings for an optax state: a leaf whose key path ends in a parameter's path (Adam's mu / nu mirror the
    parameter tree) and has that parameter's shape takes the parameter's sharding; anything else (step counts,
    scalars) is replicated."""
    by_path = {}
    for path, s in jax.tree_util.tree_flatten_with_path(param_shardings)[0]:
        by_path[_dict_keys(path)] = s
    rep = replicated(mesh)

    def pick(path, leaf):
        keys = _dict_keys(path)
        for start in range(len(keys)):
            s = by_path.get(keys[start:])
            if s is not None:
                return s
        return rep

    return jax.tree_util.tree_map_with_path(pick, abstract_opt_state)


def _dict_keys(path) -> tuple:
    out = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            out.append(("d", k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            out.append(("a", k.name))
        elif isinstance(k, jax.tree_util.SequenceKey):
            out.append(("s", k.idx))
        else:
            out.append(("o", str(k)))
    return tuple(out)
