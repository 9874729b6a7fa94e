"""Multi-process start-up: `jax.distributed.initialize` from flags, the environment, or the cluster.

Sources, first match wins:
  1. explicit flags --coordinator_address, --num_processes, --process_id (the local launcher passes these);
  2. environment IDATTN_COORDINATOR_ADDRESS / IDATTN_NUM_PROCESSES / IDATTN_PROCESS_ID;
  3. a detected cluster: SLURM with more than one task (SLURM_NTASKS > 1) or a multi-host Cloud TPU slice
     (TPU_WORKER_HOSTNAMES lists several hosts): `jax.distributed.initialize()` reads the cluster itself.
Single process otherwise. On CPU, cross-process collectives use gloo.

Failure detection: jax's coordination service declares a process dead after `heartbeat_timeout_seconds` without
a heartbeat and then terminates every other process with an error naming the dead task, so the survivors of a
killed process stop instead of waiting in a collective forever. The bound comes from
IDATTN_HEARTBEAT_TIMEOUT_S (default 100, jax's; launch/local.py sets 10), and the shutdown barrier's from
IDATTN_SHUTDOWN_TIMEOUT_S (default 60; jax's 300 leaves a survivor hanging five minutes at exit).
"""
from __future__ import annotations

import os

import jax


def detect_cluster() -> str | None:
    if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        return "slurm"
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if "," in hosts:
        return "tpu"
    return None


def initialize(mode: str = "auto", coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: list[int] | None = None) -> bool:
    """Initialises jax.distributed when needed; returns True if it did. mode: auto | on | off."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"--distributed={mode!r}: expected auto, on or off")
    if mode == "off":
        return False
    env = os.environ
    coordinator_address = coordinator_address or env.get("IDATTN_COORDINATOR_ADDRESS") or None
    if num_processes is None and env.get("IDATTN_NUM_PROCESSES"):
        num_processes = int(env["IDATTN_NUM_PROCESSES"])
    if process_id is None and env.get("IDATTN_PROCESS_ID"):
        process_id = int(env["IDATTN_PROCESS_ID"])
    explicit = coordinator_address is not None
    if explicit and (num_processes is None or process_id is None):
        raise ValueError(f"distributed start: coordinator_address={coordinator_address!r} needs num_processes and "
                         f"process_id too (got {num_processes}, {process_id}); pass --num_processes and --process_id")
    cluster = detect_cluster()
    if mode == "auto" and not explicit and cluster is None:
        return False
    # CPU processes exchange collectives through gloo (harmless for GPU / TPU backends).
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except Exception:
        pass
    timeouts = dict(heartbeat_timeout_seconds=int(env.get("IDATTN_HEARTBEAT_TIMEOUT_S", "100") or 100),
                    shutdown_timeout_seconds=int(env.get("IDATTN_SHUTDOWN_TIMEOUT_S", "60") or 60))
    if explicit:
        jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                                   process_id=process_id, local_device_ids=local_device_ids, **timeouts)
    else:
        jax.distributed.initialize(**timeouts)
    return True
