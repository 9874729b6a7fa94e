"""JSON Lines, read one way everywhere: `prepare` (a corpus), `score` / `generate` (texts and prompts) and the eval
datasets (records) all read a .jsonl file through `rows` or `texts`.

- one JSON value a line, blank lines skipped; a `.gz` name is read through gzip;
- line numbers in every refusal are the file's own (1-based, blank lines counted), so "path:41" is line 41;
- `texts` reads one string field a row: a row that is not an object or lacks the field is refused naming the
  keys it has and the fix (`--text_field`); a null text is the empty document "".
Refusals are `JsonlError` (a ValueError) with a one-line message that starts with the path; callers re-raise it
as their own error type (PrepareError, absl's UsageError) with the message unchanged.
"""
from __future__ import annotations

import gzip
import json
from typing import Any, Iterator


class JsonlError(ValueError):
    """A .jsonl file that cannot be read as asked (the message names the file, the line and the fix)."""


def open_text(path: str, newline: str | None = None):
    """A text file as UTF-8, through gzip when its name ends in .gz."""
    if path.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline=newline)
    return open(path, encoding="utf-8", newline=newline)


def rows(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON value) of every non-blank line."""
    try:
        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as e:
                    raise JsonlError(f"{path}:{n}: not a JSON object ({e}); JSON Lines need one object a line.") \
                        from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise JsonlError(f"{path}: unreadable ({e}); expected UTF-8 JSON Lines (gzip for .jsonl.gz).") from None


def texts(path: str, field: str) -> Iterator[tuple[int, str]]:
    """(line number, the string in `field`) of every row; null is ""."""
    for n, row in rows(path):
        if not isinstance(row, dict) or field not in row:
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise JsonlError(f"{path}:{n}: no field {field!r} (found {keys}); pass --text_field=<field>.")
        text = row[field]
        if text is not None and not isinstance(text, str):
            raise JsonlError(f"{path}:{n}: field {field!r} holds {type(text).__name__}, not text; pass "
                             "--text_field=<a string field>.")
        yield n, text or ""
