#!/usr/bin/env python
"""The documented path of the launcher in idattn/launch/tpu.py (its docstring says how to run it); everything is
re-exported from there, so that an installed wheel runs the same launcher."""
import sys

from idattn.launch import tpu as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})

if __name__ == "__main__":
    sys.exit(_module.main())
