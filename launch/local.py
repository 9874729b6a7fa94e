#!/usr/bin/env python
"""

The launcher lives in the package (idattn/launch/local.py, also `python -m idattn.launch.local`); this script is
the documented path and re-exports it.
"""
import sys

from idattn.launch import local as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})

if __name__ == "__main__":
    sys.exit(_module.main())
