"""Multi-process start-up: `jax.distributed.initialize` from flags, the environment, or the cluster.

Sources, first match wins:
  1. explicit flags --coordinator_address, --num_processes, --process_id (the local launcher passes these);
  2. environment IDATTN_COORDINATOR_ADDRESS / IDATTN_NUM_PROCESSES / IDATTN_PROCESS_ID;
  3. a detected cluster: SLURM with more than one task (SLURM_NTASKS > 1) or a multi-host Cloud TPU slice
     (TPU_WORKER_HOSTNAMES lists several hosts): `jax.distributed.initialize()` reads the cluster itself.
Single process otherwise (`--distributed=on` starts jax.distributed even for one SLURM task). On CPU,
cross-process collectives use gloo.

GPUs per process under SLURM. Left alone, jax gives every SLURM task `local_device_ids=[SLURM_LOCALID]` (one
device per task, numbered by the task's local id): a one-task-per-node job would drive GPU 0 of each node only,
and a task that SLURM already restricted to its own GPU (`--gpus-per-task=1` sets CUDA_VISIBLE_DEVICES per task)
would ask for device SLURM_LOCALID of the one it sees ("invalid device ordinal"). So `initialize` passes the ids
itself, from IDATTN_LOCAL_DEVICES (launch/slurm.py exports it):
  - `all` (--mode=per_node): every GPU this process sees, [0 .. n-1]; refused when several tasks share the node;
  - `one` (--mode=per_gpu): the one GPU it sees ([0]) or, when every task sees all of the node's GPUs (no
    per-task binding), the task's own (SLURM_LOCALID); refused when that GPU does not exist;
  - `auto` (unset): `all` when this is the node's only task (SLURM_STEP_TASKS_PER_NODE, SLURM_NODEID), else `one`.
"Sees" is counted without starting a backend (jax.distributed must come first): CUDA_VISIBLE_DEVICES (or
HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES), else the NVIDIA driver's /proc/driver/nvidia/gpus. After the start,
on a GPU backend, `jax.local_device_count()` must equal the number of ids passed. Mistakes stop with one line
(`StartError`). With no GPU in sight (a CPU job) the ids are left to jax, where they do not matter.

Failure detection: jax's coordination service declares a process dead after `heartbeat_timeout_seconds` without
a heartbeat and then terminates every other process with an error naming the dead task, so the survivors of a
killed process stop instead of waiting in a collective forever. The bound comes from
IDATTN_HEARTBEAT_TIMEOUT_S (default 100, jax's; launch/local.py sets 10), and the shutdown barrier's from
IDATTN_SHUTDOWN_TIMEOUT_S (default 60; jax's 300 leaves a survivor hanging five minutes at exit).
"""
from __future__ import annotations

import os
import re

import jax

LOCAL_DEVICES_ENV = "IDATTN_LOCAL_DEVICES"
LOCAL_DEVICES = ("auto", "all", "one")
# the variables jax's SLURM cluster (jax/_src/clusters/slurm_cluster.py) needs before it takes over
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
NVIDIA_PROC_GPUS = "/proc/driver/nvidia/gpus"  # one entry per GPU the driver knows (module-level: tests move it)


class StartError(ValueError):
    """A distributed start that cannot work; the message is one line naming the setting and the fix."""


def detect_cluster() -> str | None:
    if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        return "slurm"
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if "," in hosts:
        return "tpu"
    return None


def in_slurm_step(env=None) -> bool:
    """True inside an `srun` step (every variable jax's SLURM detection reads is set)."""
    env = os.environ if env is None else env
    return all(v in env for v in SLURM_VARS)


def visible_gpu_count(env=None) -> int | None:
    """GPUs this process can see, counted without starting a jax backend; None when nothing says."""
    env = os.environ if env is None else env
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if var in env:
            value = env[var].strip()
            if value in ("", "-1", "NoDevFiles"):
                return 0
            return len([t for t in value.split(",") if t.strip()])
    try:
        return len(os.listdir(NVIDIA_PROC_GPUS)) or None
    except OSError:
        return None


def _expand_tasks_per_node(spec: str) -> list[int]:
    """SLURM's compressed per-node task counts: '8(x2),4' -> [8, 8, 4]."""
    out = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return []
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def slurm_tasks_on_node(env=None) -> int | None:
    """How many tasks of this step run on this node; None when SLURM does not say."""
    env = os.environ if env is None else env
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        counts = _expand_tasks_per_node(env.get(var, ""))
        node = int(env.get("SLURM_NODEID", "0") or 0)
        if counts and node < len(counts):
            return counts[node]
    n = env.get("SLURM_NTASKS_PER_NODE", "")
    return int(n) if n.isdigit() else None


def _gpus_excluded(env) -> bool:
    platforms = env.get("JAX_PLATFORMS", "").strip()
    return bool(platforms) and not any(p in platforms for p in ("cuda", "gpu", "rocm"))


def slurm_local_device_ids(env=None, local_devices: str | None = None) -> list[int] | None:
    """The `local_device_ids` for this SLURM task (module docstring); None: leave them to jax (no GPU seen)."""
    env = os.environ if env is None else env
    asked = local_devices or env.get(LOCAL_DEVICES_ENV, "") or "auto"
    if asked not in LOCAL_DEVICES:
        raise StartError(f"{LOCAL_DEVICES_ENV}={asked!r}: expected one of {', '.join(LOCAL_DEVICES)} "
                         f"(launch/slurm.py sets it: all for --mode=per_node, one for --mode=per_gpu)")
    tasks = slurm_tasks_on_node(env)
    mode = asked if asked != "auto" else ("all" if tasks == 1 else "one")
    n = visible_gpu_count(env)
    seen = ", ".join(f"{v}={env[v]!r}" for v in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                                  "ROCR_VISIBLE_DEVICES") if v in env) or "no *_VISIBLE_DEVICES"
    if not n:
        if asked != "auto" and not _gpus_excluded(env):
            raise StartError(f"{LOCAL_DEVICES_ENV}={asked}: this SLURM task sees no GPU ({seen}); request GPUs "
                             f"(launch/slurm.py --gpus_per_node) or set JAX_PLATFORMS=cpu for a CPU job")
        return None
    if mode == "all":
        if tasks is not None and tasks > 1:
            raise StartError(f"{LOCAL_DEVICES_ENV}=all (launch/slurm.py --mode=per_node): {tasks} tasks share this "
                             f"node and each would drive all {n} GPUs; run one task per node "
                             f"(--ntasks-per-node=1) or use --mode=per_gpu")
        return list(range(n))
    if n == 1:
        return [0]
    local = int(env.get("SLURM_LOCALID", "0") or 0)
    if local >= n:
        raise StartError(f"{LOCAL_DEVICES_ENV}=one: SLURM_LOCALID={local} but this task sees only {n} GPUs "
                         f"({seen}); give each task one GPU (--gpus-per-task=1, launch/slurm.py --mode=per_gpu) "
                         f"or at most {n} tasks per node")
    return [local]


def initialize(mode: str = "auto", coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: list[int] | None = None,
               local_devices: str | None = None) -> bool:
    """Initialises jax.distributed when needed; returns True if it did. mode: auto | on | off.
    local_devices: all | one | auto for a SLURM task (default: IDATTN_LOCAL_DEVICES; module docstring)."""
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
    if local_device_ids is None and in_slurm_step(env):
        # jax's SLURM default (one device, numbered by SLURM_LOCALID) is wrong for both launch modes
        local_device_ids = slurm_local_device_ids(env, local_devices)
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
    elif local_device_ids is not None:
        jax.distributed.initialize(local_device_ids=local_device_ids, **timeouts)
    else:
        jax.distributed.initialize(**timeouts)
    if local_device_ids is not None and not _gpus_excluded(env):
        check_local_devices(local_device_ids)
    return True


def check_local_devices(local_device_ids: list[int]) -> None:
    """On a GPU backend, this process must drive exactly the GPUs it asked for."""
    if jax.default_backend() not in ("gpu", "cuda", "rocm"):
        return
    have = jax.local_device_count()
    if have != len(local_device_ids):
        raise StartError(f"distributed start: asked for local GPUs {local_device_ids} but jax sees {have} "
                         f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                         f"check {LOCAL_DEVICES_ENV} against the job's --gpus-per-task / --gpus-per-node")
