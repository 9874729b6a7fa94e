"""The registry of the study's tables, in the order of `all` (the budgeted study by evidence per CPU-minute: the pilot,
(a) and (b), then (d), (c), the ladder's trend, MAD, the MQAR recall table outside the budget, then the new recipe's
tables and the studies past the paper). Each table's module declares its name, title, paper table and function."""
from __future__ import annotations

from idattn.studies import (ladder, repro_cube, repro_hybrid, repro_length, repro_mad, repro_pilot, repro_ppl,
                            repro_recall, repro_selective)

TABLES = {t.name: t for t in (repro_pilot.TABLE, repro_ppl.TABLE, repro_cube.TABLE, repro_length.TABLE, ladder.TABLE,
                              repro_mad.TABLE, repro_recall.TABLE, repro_length.CLIMB_TABLE, ladder.CLIMB_TABLE,
                              repro_hybrid.TABLE, repro_selective.TABLE, repro_selective.DELTA_TABLE)}


def order(toy: bool, tables=None) -> tuple[str, ...]:
    """The tables `all` writes, in order (at toy size only those defined there)."""
    return tuple(name for name, t in (TABLES if tables is None else tables).items() if t.at_toy or not toy)
