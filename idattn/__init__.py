"""idattn: Interdomain Attention (arXiv 2605.24330) in JAX/Flax.

On a host with no accelerator (no NVIDIA, AMD or TPU device), importing idattn before jax keeps the probes of
the installed accelerator runtimes quiet; they are not errors there:
  - JAX_PLATFORMS defaults to `cpu` (when unset), so jax does not start the CUDA plugin ("Unable to load CUDA",
    with a traceback) or libtpu ("unexpected worker hostname ...") only to fall back to the CPU;
  - the CUDA plugin's "Could not find cuda drivers on your machine" lines, printed by its libraries while jax is
    imported (even with JAX_PLATFORMS=cpu), are dropped; everything else printed then is passed on.
Set JAX_PLATFORMS yourself to override; on a host with an accelerator nothing is changed.
"""
import glob as _glob
import importlib.util as _importlib_util
import os as _os
import sys as _sys
from importlib.machinery import PathFinder as _PathFinder

from idattn.aot.quiet import quiet_stderr as _quiet_stderr  # os, sys and tempfile only: nothing that loads jax

__version__ = "0.1.0"

_PROBE_LINES = ("cudart_stub.cc", "Could not find cuda drivers",
                "All log messages before absl::InitializeLog() is called are written to STDERR")


def _has_accelerator() -> bool:
    if any(_os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd",
                                         "/dev/dxg")):
        return True
    if _glob.glob("/dev/accel*") or _glob.glob("/dev/vfio/[0-9]*"):
        return True
    for vendor in _glob.glob("/sys/bus/pci/devices/*/vendor"):  # Google (TPU) PCI devices, as jax looks for them
        try:
            if open(vendor).read().strip() == "0x1ae0":
                return True
        except OSError:
            pass
    return False


class _QuietCudaProbe:
    """Meta-path finder for the modules whose import loads the CUDA plugin's libraries (jax._src.lib at import,
    the plugin module at backend start): runs each with file descriptor 2 captured, then writes back every line
    but the driver probes."""

    names = {"jax._src.lib", "jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"}

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        self.names = self.names - {name}
        if not self.names:
            _sys.meta_path.remove(self)
        spec = _PathFinder.find_spec(name, path)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        # an extension module's library loads in create_module, a Python module's imports in exec_module
        spec.loader.create_module = self._quiet(spec.loader.create_module)
        run = self._quiet(spec.loader.exec_module)

        def exec_module(module):
            run(module)
            if callable(getattr(module, "initialize", None)):  # the plugin loads its library when jax starts it
                module.initialize = self._quiet(module.initialize)
        spec.loader.exec_module = exec_module
        return spec

    @staticmethod
    def _quiet(run):
        return _quiet_stderr(run, _PROBE_LINES)


def _quiet_absent_accelerators() -> None:
    try:
        if _has_accelerator():
            return
        if not _os.environ.get("JAX_PLATFORMS"):  # unset or empty: jax would try every installed runtime
            _os.environ["JAX_PLATFORMS"] = "cpu"
        if "jax._src.lib" not in _sys.modules:
            if _importlib_util.find_spec("jax_cuda12_plugin") or _importlib_util.find_spec("jax_cuda13_plugin"):
                _sys.meta_path.insert(0, _QuietCudaProbe())
    except Exception:  # never let the quieting stop an import
        pass


_quiet_absent_accelerators()
