"""The documented path of the recipe in idattn/configs/sweeps/cpu_isoflop.py (its docstring says how to run it); everything is
re-exported from there, so that an installed wheel runs the same recipe."""
from idattn.configs.sweeps import cpu_isoflop as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
