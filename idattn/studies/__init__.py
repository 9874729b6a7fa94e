"""idattn.studies: what is built from many runs: scaling fits, the reproduction, result tables, the quickstart.
Each module is a library with a `main(argv)`; the commands are the thin `idattn/<name>.py` entries
(`python -m idattn.scaling`, `.results`, `.repro`, `.quickstart`).
"""
from __future__ import annotations

import json
from typing import Any


def read_json(path: str, default: Any = None, tolerate=(FileNotFoundError, json.JSONDecodeError)) -> Any:
    """The JSON value in `path`, or `default` when reading it raises one of `tolerate` (the caller's choice: a
    missing file, or also a half-written or unreadable one)."""
    try:
        with open(path) as f:
            return json.load(f)
    except tolerate:
        return default
