"""TPU compile targets by their Cloud TPU names, on any host with libtpu installed (`pip install -e ".[tpu]"`).

    tpu_target("v5p-128")            -> Target: 64 v5p chips, topology v5p:4x4x4, 95 GiB HBM per chip
    tpu_target("v5p:2x2x1")          -> the topology named directly (4 chips)
    tpu_target("v6e-64", num_slices=2) -> two v6e-64 slices joined by DCN (128 chips)

Names (Cloud TPU accelerator types): v4-N and v5p-N count TensorCores (N = 2 × chips; 3-D torus topologies,
megacore: one JAX device per chip), v5e-N / v5litepod-N and v6e-N count chips (2-D topologies, one core per chip).
Topology shapes for power-of-two slices as Cloud TPU lists them (v4/v5p: 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4,
4x4x8, 4x8x8, 8x8x8, ...; v5e/v6e: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16); other shapes by the explicit form
`<gen>:<X>x<Y>[x<Z>]`. Chips per host: 4 (a 2x2 block) for v4, v5p and multi-host v5e/v6e slices; the single-host
v5e/v6e shapes 1x1 and 2x4 put all their chips on one host. HBM per chip (Cloud TPU system architecture):
v4 32 GiB, v5e 16 GiB, v5p 95 GiB, v6e 32 GiB.

The devices come from `jax.experimental.topologies.get_topology_desc`: they compile with the real TPU compiler
(Mosaic kernels included) but cannot run. libtpu takes a process lock (/tmp/libtpu_lockfile); several compile
processes on one host need ALLOW_MULTIPLE_LIBTPU_LOAD=1, which `tpu_target` sets when unset.
"""
from __future__ import annotations

import math
import os
import re

from jax.experimental import topologies

from idattn.aot.quiet import quiet_stderr
from idattn.aot.target import GiB, Target

# What libtpu prints when it starts on a host that is not a TPU VM (not errors for compile-only devices)
LIBTPU_PROBE_LINES = ("Failed to find host bounds for accelerator type", "Logging before InitGoogle()",
                      "unexpected worker hostname", "=== Source Location Trace: ===", "libtpu_init_utils.cc")

# generation -> (libtpu topology prefix, chip_config_name, dims, HBM GiB per chip, name counts cores)
GENERATIONS = {
    "v4": ("v4", "megacore", 3, 32, True),
    "v5p": ("v5p", "megacore", 3, 95, True),
    "v5e": ("v5e", "default", 2, 16, False),
    "v5litepod": ("v5e", "default", 2, 16, False),
    "v6e": ("v6e", "default", 2, 32, False),
}


def _grow(chips: int, dims: int) -> tuple[int, ...] | None:
    """Cloud TPU's shape for a power-of-two chip count: from 2x2(x1), double the smallest axis (ties: the last)."""
    if chips < 1 or chips & (chips - 1):
        return None
    if dims == 2:
        if chips == 1:
            return (1, 1)
        if chips == 2:
            return None
        shape = [2, 2]
    else:
        if chips < 4:
            return None
        shape = [2, 2, 1]
    while math.prod(shape) < chips:
        m = min(shape)
        i = max(j for j, s in enumerate(shape) if s == m)
        shape[i] *= 2
    return tuple(shape)


def parse_tpu_name(name: str) -> tuple[str, tuple[int, ...]]:
    """'v5p-128' | 'v5p:4x4x4' | 'v6e-64' | 'v5litepod-16' -> (generation, topology shape in chips)."""
    s = str(name).strip().lower()
    m = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e|v5):(\d+(?:x\d+){1,2})", s)
    if m:
        gen = "v5p" if m.group(1) == "v5" else m.group(1)
        shape = tuple(int(x) for x in m.group(2).split("x"))
        dims = GENERATIONS[gen][2]
        if dims == 3 and len(shape) == 2:
            shape = shape + (1,)
        if len(shape) != dims:
            raise ValueError(f"--topology={name!r}: {gen} topologies have {dims} axes, e.g. "
                             f"{gen}:{'x'.join(['2'] * dims)}")
        return gen, shape
    m = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e)-(\d+)", s)
    if not m:
        raise ValueError(f"--topology={name!r}: expected a Cloud TPU slice name (v4-N, v5p-N, v5e-N / v5litepod-N, "
                         f"v6e-N, e.g. v5p-128) or a topology <gen>:<X>x<Y>[x<Z>] (e.g. v5p:2x2x1)")
    gen, n = m.group(1), int(m.group(2))
    _, _, dims, _, cores = GENERATIONS[gen]
    if cores and n % 2:
        raise ValueError(f"--topology={name!r}: {gen}-N counts TensorCores (2 per chip); N must be even")
    chips = n // 2 if cores else n
    shape = _grow(chips, dims)
    if shape is None:
        raise ValueError(f"--topology={name!r}: {chips} chips is not a power-of-two slice this tool knows the shape "
                         f"of; name the topology directly, e.g. {gen}:{'x'.join(['4'] * dims)}")
    return gen, shape


def chips_per_host_bounds(gen: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    dims = GENERATIONS[gen][2]
    if dims == 2 and shape in ((1, 1), (2, 4), (4, 2)):  # single-host v5e / v6e machines (1 or 8 chips)
        return (shape[0], shape[1], 1)
    full = tuple(shape) + (1,) * (3 - len(shape))
    return tuple(min(a, b) for a, b in zip(full, (2, 2, 1)))  # slices smaller than one host (v5p:1x1x1)


def tpu_target(name: str, num_slices: int = 1) -> Target:
    """A compile-only TPU Target: `num_slices` slices of the named topology (joined by DCN when > 1)."""
    if int(num_slices) < 1:
        raise ValueError(f"--num_slices={num_slices}: must be >= 1")
    gen, shape = parse_tpu_name(name)
    prefix, chip_config, dims, hbm_gib, _ = GENERATIONS[gen]
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topo_name = f"{prefix}:{'x'.join(str(s) for s in shape)}"
    bounds = chips_per_host_bounds(gen, shape)
    try:
        # libtpu's start-up probes of a TPU VM's metadata (accelerator type, worker hostnames) print five lines of
        # warnings and an INVALID_ARGUMENT trace on any other host; compile-only devices never need them
        describe = quiet_stderr(topologies.get_topology_desc, LIBTPU_PROBE_LINES)
        topo = describe(platform="tpu", topology_name=topo_name, chip_config_name=chip_config,
                        chips_per_host_bounds=bounds, num_slices=int(num_slices))
    except Exception as e:
        msg = str(e)
        if "libtpu" in msg.lower() or "plugin" in msg.lower() or "tpu" in msg.lower() and "not found" in msg.lower():
            raise RuntimeError(f"cannot describe TPU topology {topo_name}: {msg.splitlines()[0]}; install libtpu with "
                               f"`pip install -e \".[tpu]\"` (the jax[tpu] extra pinned to the installed jax)") from e
        raise
    devices = list(topo.devices)
    chips = math.prod(shape)
    hosts = chips // math.prod(bounds)
    desc = (f"TPU {gen} topology {topo_name} ({chips} chips, {max(1, hosts)} host(s) x {math.prod(bounds)} chips)"
            + (f" x {num_slices} slices over DCN" if num_slices > 1 else "")
            + f", {hbm_gib} GiB HBM per chip")
    return Target(name=str(name), platform="tpu", devices=devices, hbm_bytes_per_device=int(hbm_gib * GiB),
                  description=desc, num_slices=int(num_slices))
