"""The one Markdown table writer of the tables every command prints (eval, results, repro, quickstart, MQAR)."""
from __future__ import annotations

from typing import Sequence


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub Markdown table: one header row, a `|---|` rule, one line per row (cells formatted with str)."""
    if any(len(r) != len(header) for r in rows):
        bad = next(r for r in rows if len(r) != len(header))
        raise ValueError(f"markdown_table: a row has {len(bad)} cells for {len(header)} columns: {list(bad)[:4]}")
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])
