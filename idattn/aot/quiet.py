"""Accelerator runtimes' start-up probes, kept off stderr on hosts that do not have the accelerator: the CUDA
plugin's driver probes while jax is imported (idattn/__init__.py) and libtpu's TPU VM metadata probes when a
compile-only topology is described (idattn.aot.tpu). Standard library only: idattn's import uses it before jax."""
from __future__ import annotations

import os
import sys
import tempfile


def quiet_stderr(run, drop):
    """`run` wrapped so that what it (or any library it calls, through file descriptor 2) prints to stderr is
    captured and written back afterwards without the lines containing any of the strings in `drop`: for the
    start-up probes of accelerator runtimes that are not errors on this host."""
    def quiet(*a, **kw):
        sys.stderr.flush()
        saved, buf = os.dup(2), tempfile.TemporaryFile()
        os.dup2(buf.fileno(), 2)
        try:
            return run(*a, **kw)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            buf.seek(0)
            kept = [line for line in buf.read().decode(errors="replace").splitlines(keepends=True)
                    if not any(p in line for p in drop)]
            buf.close()
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
    return quiet
