"""The distributed start under SLURM: which GPUs each process drives (`local_device_ids`), for the launcher's two
modes and several node/task layouts, with SLURM's variables simulated and `jax.distributed.initialize` captured;
and one real two-process CPU start, the processes started the way `srun` starts them."""
import os
import socket
import subprocess
import sys

import pytest
from jax._src import clusters

from idattn.train import distributed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _clean(monkeypatch):
    for k in list(os.environ):
        if k.startswith("SLURM_") or k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                                           "JAX_LOCAL_DEVICE_IDS", "JAX_COORDINATOR_PORT", "TPU_WORKER_HOSTNAMES",
                                           ) or k.startswith("IDATTN_"):
            monkeypatch.delenv(k)


@pytest.fixture
def slurm(monkeypatch, tmp_path):
    """Returns set_env(**SLURM-ish variables) and the captured initialize() kwargs."""
    calls = []
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(distributed.jax.config, "update", lambda *a, **k: None)
    monkeypatch.setattr(distributed, "NVIDIA_PROC_GPUS", str(tmp_path / "no-driver"))
    _clean(monkeypatch)
    # GPU jobs leave JAX_PLATFORMS unset (conftest's cpu would make a task without GPUs legitimate)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)

    def set_env(**env):
        for k, v in env.items():
            monkeypatch.setenv(k, str(v))
    return set_env, calls


def _task(nodes, tasks_per_node, node, local, job="4242"):
    """The variables srun gives task `local` on node `node` of a nodes x tasks_per_node step."""
    return dict(SLURM_JOB_ID=job, SLURM_STEP_NODELIST=f"gpu[001-{nodes:03d}]" if nodes > 1 else "gpu001",
                SLURM_JOB_NODELIST=f"gpu[001-{nodes:03d}]" if nodes > 1 else "gpu001",
                SLURM_NTASKS=nodes * tasks_per_node, SLURM_STEP_NUM_NODES=nodes, SLURM_NNODES=nodes,
                SLURM_NODEID=node, SLURM_LOCALID=local, SLURM_PROCID=node * tasks_per_node + local,
                SLURM_STEP_TASKS_PER_NODE=f"{tasks_per_node}(x{nodes})" if nodes > 1 else str(tasks_per_node))


def _effective(kw):
    """What jax itself ends up with from these initialize() kwargs (its SLURM auto-detection fills the rest)."""
    return clusters.ClusterEnv.auto_detect_unset_distributed_params(
        kw.get("coordinator_address"), kw.get("num_processes"), kw.get("process_id"), kw.get("local_device_ids"),
        None, 300)


@pytest.mark.parametrize("mode,nodes,tpn,node,local,visible,want", [
    # launch/slurm.py --mode=per_gpu on 2 nodes x 8 GPUs: SLURM binds one GPU per task (CUDA_VISIBLE_DEVICES=<its>)
    ("one", 2, 8, 1, 3, "3", [0]),
    ("one", 2, 8, 0, 7, "7", [0]),
    # --mode=per_node, 2 nodes x 1 task seeing the node's 8 GPUs
    ("all", 2, 1, 1, 0, "0,1,2,3,4,5,6,7", list(range(8))),
    # 1 node x 4 tasks without per-task binding (every task sees the 4 GPUs): each its own
    ("one", 1, 4, 0, 2, "0,1,2,3", [2]),
    ("one", 1, 4, 0, 3, "GPU-a,GPU-b,GPU-c,GPU-d", [3]),
    # unset (a hand-written srun): the node's only task takes every GPU, several tasks one each
    (None, 1, 1, 0, 0, "0,1,2,3", [0, 1, 2, 3]),
    (None, 2, 4, 1, 1, "1", [0]),
])
def test_slurm_local_device_ids(slurm, mode, nodes, tpn, node, local, visible, want):
    set_env, calls = slurm
    set_env(**_task(nodes, tpn, node, local), CUDA_VISIBLE_DEVICES=visible)
    if mode:
        set_env(IDATTN_LOCAL_DEVICES=mode)
    assert distributed.initialize("on") is True
    assert calls[-1]["local_device_ids"] == want
    coord, n, pid, ids = _effective(calls[-1])
    assert (n, pid, ids) == (nodes * tpn, node * tpn + local, want)  # jax keeps ours, fills count and id
    assert coord.startswith("gpu001:")


def test_per_node_counts_the_driver_gpus_without_cuda_visible_devices(slurm, monkeypatch, tmp_path):
    set_env, calls = slurm
    gpus = tmp_path / "gpus"
    for i in range(8):
        (gpus / f"0000:{i:02x}:00.0").mkdir(parents=True)
    monkeypatch.setattr(distributed, "NVIDIA_PROC_GPUS", str(gpus))
    set_env(**_task(2, 1, 0, 0), IDATTN_LOCAL_DEVICES="all")
    distributed.initialize("on")
    assert calls[-1]["local_device_ids"] == list(range(8))


def test_single_task_job_is_started_with_on(slurm):
    """One node, one task (SLURM_NTASKS=1) under --distributed=on: still all 8 GPUs, not jax's [0]."""
    set_env, calls = slurm
    set_env(**_task(1, 1, 0, 0), CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7", IDATTN_LOCAL_DEVICES="all")
    distributed.initialize("on")
    assert _effective(calls[-1])[3] == list(range(8))


@pytest.mark.parametrize("mode,tpn,local,visible,said", [
    ("one", 4, 3, "0,1", "IDATTN_LOCAL_DEVICES=one: SLURM_LOCALID=3 but this task sees only 2 GPUs"),
    ("all", 4, 1, "0,1,2,3", "IDATTN_LOCAL_DEVICES=all (launch/slurm.py --mode=per_node): 4 tasks share this node"),
    ("one", 1, 0, "", "IDATTN_LOCAL_DEVICES=one: this SLURM task sees no GPU (CUDA_VISIBLE_DEVICES='')"),
    ("both", 1, 0, "0", "IDATTN_LOCAL_DEVICES='both': expected one of auto, all, one"),
])
def test_impossible_layouts_are_refused_in_one_line(slurm, mode, tpn, local, visible, said):
    set_env, calls = slurm
    set_env(**_task(1, tpn, 0, local), CUDA_VISIBLE_DEVICES=visible, IDATTN_LOCAL_DEVICES=mode)
    with pytest.raises(distributed.StartError) as e:
        distributed.initialize("on")
    assert said in str(e.value) and "\n" not in str(e.value)
    assert calls == []  # refused before jax.distributed starts


def test_cpu_job_leaves_the_ids_to_jax(slurm, monkeypatch):
    """JAX_PLATFORMS=cpu and no GPU in sight: nothing to choose, nothing refused."""
    set_env, calls = slurm
    set_env(**_task(2, 2, 0, 1), JAX_PLATFORMS="cpu", IDATTN_LOCAL_DEVICES="one")
    distributed.initialize("on")
    assert "local_device_ids" not in calls[-1]


def test_tasks_per_node_spec():
    assert distributed._expand_tasks_per_node("8(x2),4") == [8, 8, 4]
    assert distributed.slurm_tasks_on_node({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}) == 1
    assert distributed.slurm_tasks_on_node({"SLURM_NTASKS_PER_NODE": "8"}) == 8


CHILD = """
import jax
from idattn.train import distributed
assert distributed.initialize("on")
from jax._src import xla_bridge
print("RESULT", jax.process_count(), jax.process_index(), xla_bridge.CUDA_VISIBLE_DEVICES.value, flush=True)
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_started_like_srun(tmp_path):
    """Two real processes on CPU with srun's variables (1 node x 2 tasks, --gpus-per-task=1 binding: each task's
    CUDA_VISIBLE_DEVICES names its own GPU): both join one jax.distributed run, and each asks for device 0 of
    the one it sees (jax's default would make task 1 ask for device 1)."""
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "IDATTN_"))}
    procs = []
    for i in range(2):
        env = dict(base, **{k: str(v) for k, v in _task(1, 2, 0, i).items()})
        env.update(SLURM_STEP_NODELIST="localhost", SLURM_JOB_NODELIST="localhost", SLURM_TASKS_PER_NODE="2",
                   JAX_COORDINATOR_PORT=str(port), JAX_PLATFORMS="cpu",
                   CUDA_VISIBLE_DEVICES=str(i), IDATTN_LOCAL_DEVICES="one", IDATTN_HEARTBEAT_TIMEOUT_S="10",
                   IDATTN_SHUTDOWN_TIMEOUT_S="10")
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err[-2000:]
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = sorted(line.split()[1:] for o in outs for line in o.splitlines() if line.startswith("RESULT"))
    assert results == [["2", "0", "0"], ["2", "1", "0"]]


def test_cpu_host_start_is_quiet():
    """On a host without accelerators, with libtpu and the CUDA plugin installed, `import idattn` first keeps
    jax's start free of the runtimes' probe messages (idattn/__init__.py); the CPU backend is the result."""
    import importlib.util
    import idattn
    if idattn._has_accelerator() or not (importlib.util.find_spec("jax_cuda12_plugin")
                                         or importlib.util.find_spec("libtpu")):
        pytest.skip("needs an accelerator-less host with the accelerator runtimes installed")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    p = subprocess.run([sys.executable, "-c", "import idattn, jax; print(jax.default_backend())"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "cpu", p.stderr
    for noise in ("Could not find cuda drivers", "unexpected worker hostname", "Unable to load CUDA"):
        assert noise not in p.stderr, p.stderr
