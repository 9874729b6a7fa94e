"""A compilation target: the devices a program is compiled for, whether or not they are attached to this host.

    Target(name, platform, devices, hbm_bytes_per_device, description)

`devices` are JAX device objects to build a `jax.sharding.Mesh` from: for TPU, the devices of a
`jax.experimental.topologies.get_topology_desc(...)` topology (compile-only, any host with libtpu installed);
for GPU, those of a GPU topology description. `hbm_bytes_per_device` is the memory one device offers the
program (the chip's HBM), the budget `idattn.aot` checks the compiled per-device footprint against.
Builders: `idattn.aot.tpu.tpu_target(name, num_slices)` and `idattn.aot.gpu.gpu_target(name)`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

GiB = 1024 ** 3


@dataclasses.dataclass
class Target:
    name: str                      # what the user typed, e.g. "v5p-128", "v5p:2x2x1", "h100x8"
    platform: str                  # "tpu" | "gpu" (the platform the program is lowered for)
    devices: Sequence[Any]         # jax devices (compile-only is fine), in topology order
    hbm_bytes_per_device: int      # memory one device offers the program
    description: str = ""          # chip kind, topology, slices, hosts: one line for the report
    num_slices: int = 1            # slices joined by the data-centre network (DCN); 1 = one ICI domain

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def hbm_gib(self) -> float:
        return self.hbm_bytes_per_device / GiB
