"""Suite-wide settings.

The test extra installs libtpu and the CUDA plugin (for the ahead-of-time compile tests), so a bare `import jax`
would probe for TPU and GPU runtimes that a CPU host does not have. Tests run on the CPU backend unless the caller
chose a platform; subprocesses inherit the setting. Ahead-of-time tests reach TPU/GPU compilers through
`jax.experimental.topologies`, which does not need those backends initialised.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
