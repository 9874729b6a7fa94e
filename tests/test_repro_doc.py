"""docs/reproduction.md's generated part (idattn.studies.repro_doc): replaced between its markers from the tables'
files, the prose around it untouched, tables not written yet named as not run, verdicts summarised from the JSON."""
from __future__ import annotations

import os

import pytest

from idattn.studies import repro, repro_doc, repro_runs as runs

from test_repro_length import _build


def _doc(tmp_path, body="old numbers 12.34"):
    path = tmp_path / "reproduction.md"
    path.write_text(f"# Title\n\nprose before\n\n{repro_doc.BEGIN}\n{body}\n{repro_doc.END}\n\nprose after\n")
    return str(path)


def test_doc_part_is_regenerated_from_the_tables(tmp_path):
    root = str(tmp_path / "root")
    top, _ = _build(root, softmax_use=0.8)
    data = repro.table_length(top)
    doc = _doc(tmp_path)
    rc = repro.main(["all", f"--root={root}", "--render_only", f"--doc={doc}", "--no_compile_cache"])
    assert rc == 0
    text = open(doc).read()
    assert text.startswith("# Title\n\nprose before\n\n") and text.endswith("\n\nprose after\n")
    assert "old numbers 12.34" not in text
    gen = text[text.index(repro_doc.BEGIN):text.index(repro_doc.END)]
    # the length table's own Markdown, one heading level down, and its verdict in the summary
    md = open(os.path.join(root, "length.md")).read()
    assert "### Table 2" in gen and md.splitlines()[2] in gen
    row = next(line for line in gen.splitlines() if line.startswith("| (c)") and "stdlib" in line)
    assert data["verdicts"]["c"]["md"] in row and data["verdicts"]["c"]["why"] in row
    # the status line of the length table: its runs' recorded compute (9 fake runs of 30 s), none missing
    assert f"| `length` | {9 * 30 / 60:.1f} | 0 |" in gen
    # the run folders' totals: the same 9 runs, each once
    size = top.exp.LENGTH_SIZE["small"]
    assert f"| `{size}/lm` | 9 | {9 * 30 / 60:.1f} |" in gen and f"| **all** | 9 | {9 * 30 / 60:.1f} (" in gen
    # the tables without runs are written from nothing, their runs listed as not available, and nothing is
    # trained (--render_only)
    assert "Not available yet" in gen
    # a claim of a table without a single paired seed is "not run yet" in the summary, not a verdict word
    row_d = next(line for line in gen.splitlines() if line.startswith("| (d)") and "Table 4" in line)
    assert f"| {repro_doc.NOT_RUN} |" in row_d and "inconclusive" not in row_d.split("|")[3]
    assert not os.path.exists(os.path.join(root, "runs", "small", "lm", "softmax-scaled-s0", "checkpoints"))


def test_doc_part_names_tables_not_run_and_refuses_a_doc_without_markers(tmp_path):
    root = str(tmp_path / "empty")
    os.makedirs(root)
    ctx = runs.Ctx(root, "small", (0, 1, 2), render_only=True, keep_stale=False)
    gen = repro_doc.render(root, ("ppl", "mad"), ctx.table_path, str(tmp_path))
    assert "### `ppl`: not run yet" in gen and "### `mad`: not run yet" in gen
    assert "| `ppl` | — | table not written |" in gen
    assert "No verdict yet" in gen
    bad = tmp_path / "bad.md"
    bad.write_text("no markers here\n")
    with pytest.raises(repro_doc.DocError, match="expected one"):
        repro_doc.update_doc(str(bad), gen)
    assert bad.read_text() == "no markers here\n"
    assert repro.main(["ppl", f"--root={root}", "--render_only", f"--doc={bad}", "--no_compile_cache"]) == 1
