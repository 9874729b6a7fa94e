"""docs/pods.md's fit tables are what `python -m idattn.aot.table` renders from the compiled records committed
under docs/aot/ (issue 38 item 6): every figure in them comes from a JSON file a command wrote, and a doc edited
by hand, or a record replaced without re-rendering, fails here."""
from __future__ import annotations

import json
import os
import re

import pytest

from idattn.aot import table

ROOT = os.path.join(os.path.dirname(__file__), "..")
DOC = os.path.join(ROOT, "docs", "pods.md")


@pytest.mark.parametrize("kind, folder", [("paper", "paper"), ("configs", "configs")])
def test_pods_md_fit_tables_are_rendered_from_the_committed_records(kind, folder):
    out_dir = os.path.join("docs", "aot", folder)  # as the command in the doc names it
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        rendered = (table.render_paper(out_dir, list(table.TOPOLOGY)) if kind == "paper"
                    else table.render_configs(out_dir))
    finally:
        os.chdir(cwd)
    assert not [x for x in rendered if "not compiled" in x], rendered  # every row has its record
    assert table.doc_table(DOC, kind) == rendered


def test_pods_md_long_context_table_is_rendered_from_the_committed_records():
    """The long-context grid (issue 37 item 4): docs/pods.md's table is what docs/aot/long renders to; rows not
    compiled yet say so (the grid is compiled over several sessions), and every compiled record is a cell's."""
    from idattn.aot import long_context as L
    out_dir = os.path.join(ROOT, "docs", "aot", "long")
    assert table.doc_table(DOC, "long_context") == L.render(out_dir, L.DEFAULT_GRID)
    names = {L.name(*cell, p) for cell in L.DEFAULT_GRID for p in L.SEQUENCES}
    stray = [f for f in os.listdir(out_dir) if f.rsplit(".", 1)[0] not in names]
    assert not stray, stray


def test_every_figure_of_a_row_is_the_records():
    """The renderer itself, against the record read here: GiB per chip, temporaries, HBM, fit, compile time."""
    path = os.path.join(ROOT, "docs", "aot", "paper", "interdomain-125m.json")
    rec = json.load(open(path))
    line = table.row(rec, "interdomain", "125m")
    train = next(s for s in rec["steps"] if s["name"] == "train")
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4] == f"{train['total'] / 2**30:.1f} ({train['temp'] / 2**30:.1f} temp)"
    assert cells[6] == f"{max(s['total'] for s in rec['steps']) / 2**30:.1f} of 95: fits"
    assert cells[7] == f"{train['compile_s']:.0f}"
    assert re.fullmatch(r"eval [\d.]+, decode [\d.]+", cells[5]), cells[5]


def test_doc_writer_replaces_only_between_the_markers(tmp_path):
    doc = tmp_path / "d.md"
    begin, end = table.MARKERS["configs"]
    doc.write_text(f"head\n{begin}\nold\n{end}\ntail\n")
    table.write_doc(str(doc), "configs", ["| a |", "| b |"])
    assert doc.read_text() == f"head\n{begin}\n| a |\n| b |\n{end}\ntail\n"
    assert table.doc_table(str(doc), "configs") == ["| a |", "| b |"]
    (tmp_path / "none.md").write_text("no markers\n")
    with pytest.raises(ValueError, match="no <!-- idattn.aot.table --kind=paper: begin -->"):
        table.write_doc(str(tmp_path / "none.md"), "paper", [])


def test_state_passing_cost_model_and_its_crossover(capsys):
    """Issue 37 item 2: the closed forms of the all_gather and the tree scan of the end states (1.3B: H = 32,
    M = 64, R = d_h = 64, 24 layers, 3 transfers a step), and where the tree starts to win: P >= 16."""
    from idattn.aot import long_context as L
    c = L.state_passing("1.3b", 32, 1 << 20)
    state = 2 * 32 * 64 * 128 * 4
    assert c["state_bytes"] == state
    assert c["all_gather_bytes"] == 31 * state * 3 * 24 and c["tree_bytes"] == 10 * state * 3 * 24
    hop = L.HOP_LATENCY_S
    assert c["all_gather_s"] == pytest.approx(31 * (hop + state / (2 * L.LINK_BYTES_PER_S)) * 72)
    assert c["tree_s"] == pytest.approx(10 * (hop + state / L.LINK_BYTES_PER_S) * 72)
    for size in ("125m", "1.3b"):
        wins = [P for P in L.STATE_PASSING_P if L.state_passing(size, P, 1 << 20)["tree_s"] <
                L.state_passing(size, P, 1 << 20)["all_gather_s"]]
        assert wins == [16, 32, 64], (size, wins)
    assert table.main(["--kind=state_passing"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n| 1.3b |") == len(L.STATE_PASSING_P) and "all_gather / compute" in out
