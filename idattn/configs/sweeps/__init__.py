"""Sweep files (python -m idattn.sweep <file>): each defines get_sweep() and get_config(name)."""
