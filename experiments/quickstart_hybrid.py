"""The documented path of the recipe in idattn/configs/quickstart_hybrid.py (its docstring says how to run it);
everything is re-exported from there, so that an installed wheel runs the same recipe."""
from idattn.configs import quickstart_hybrid as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
