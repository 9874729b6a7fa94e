"""idattn: Interdomain Attention (arXiv 2605.24330) in JAX/Flax."""

__version__ = "0.1.0"
