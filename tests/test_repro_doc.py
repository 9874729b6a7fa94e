"""docs/reproduction.md's generated parts (idattn.studies.repro_doc): the verdict summary replaced between its markers
and the tables written whole beside it (reproduction-tables.md), the prose around them untouched, tables not written
yet named as not run, verdicts summarised from the JSON."""
from __future__ import annotations

import os

import pytest

from idattn.studies import ladder, repro, repro_doc, repro_length, runcache as cache

from test_repro_length import _build


def _doc(tmp_path, body="old numbers 12.34"):
    path = tmp_path / "reproduction.md"
    path.write_text(f"# Title\n\nprose before\n\n{repro_doc.BEGIN}\n{body}\n{repro_doc.END}\n\nprose after\n")
    return str(path)


def test_doc_part_is_regenerated_from_the_tables(tmp_path):
    root = str(tmp_path / "root")
    top, _ = _build(root, softmax_use=0.8)
    data = repro_length.table_length(top)
    doc = _doc(tmp_path)
    rc = repro.main(["all", f"--root={root}", "--render_only", f"--doc={doc}", "--no_compile_cache"])
    assert rc == 0
    text = open(doc).read()
    assert text.startswith("# Title\n\nprose before\n\n") and text.endswith("\n\nprose after\n")
    assert "old numbers 12.34" not in text
    gen = text[text.index(repro_doc.BEGIN):text.index(repro_doc.END)]
    tab = open(repro_doc.tables_path(doc)).read()
    # the length table's own Markdown in the tables' file, and its verdict in the summary
    md = open(os.path.join(root, "length.md")).read()
    assert "## Table 2" in tab and md.splitlines()[2] in tab and md.splitlines()[2] not in gen
    row = next(line for line in gen.splitlines() if line.startswith("| (c)") and "stdlib" in line)
    assert data["verdicts"]["c"]["md"] in row and data["verdicts"]["c"]["why"] in row
    # the status line of the length table: its runs' recorded compute (9 fake runs of 30 s), none missing
    assert f"| `length` | {9 * 30 / 60:.1f} | 0 |" in tab
    # the run folders' totals: the same 9 runs, each once
    size = top.exp.LENGTH_SIZE["small"]
    assert f"| `{size}/lm` | 9 | {9 * 30 / 60:.1f} |" in tab and f"| **all** | 9 | {9 * 30 / 60:.1f} (" in tab
    # the tables without runs are written from nothing, their runs listed as not available, and nothing is
    # trained (--render_only)
    assert "Not available yet" in tab
    # a claim of a table without a single paired seed is "not run yet" in the summary, not a verdict word
    row_d = next(line for line in gen.splitlines() if line.startswith("| (d)") and "Table 4" in line)
    assert f"| {repro_doc.NOT_RUN} |" in row_d and "inconclusive" not in row_d.split("|")[3]
    assert not os.path.exists(os.path.join(root, "runs", "small", "lm", "softmax-scaled-s0", "checkpoints"))


def test_doc_part_names_tables_not_run_and_refuses_a_doc_without_markers(tmp_path):
    root = str(tmp_path / "empty")
    os.makedirs(root)
    ctx = cache.Ctx(root, "small", (0, 1, 2), render_only=True, keep_stale=False)
    tables = repro_doc.load_tables(("ppl", "mad"), ctx.table_path)
    gen = repro_doc.render(root, tables, ctx.table_path, str(tmp_path), "reproduction.md")
    assert "## `ppl`: not run yet" in gen and "## `mad`: not run yet" in gen
    assert "| `ppl` | — | table not written |" in gen
    assert "No verdict yet" in repro_doc.summary(tables, "reproduction-tables.md")
    bad = tmp_path / "bad.md"
    bad.write_text("no markers here\n")
    with pytest.raises(repro_doc.DocError, match="expected one"):
        repro_doc.write(str(bad), ctx, ("ppl", "mad"))
    assert bad.read_text() == "no markers here\n" and not os.path.exists(repro_doc.tables_path(str(bad)))
    assert repro.main(["ppl", f"--root={root}", "--render_only", f"--doc={bad}", "--no_compile_cache"]) == 1


def _place(word, parts):
    return {"verdict": word, "md": f"**{word}**", "why": "", "parts": [
        {"name": n, "verdict": w, "interval": {"n": 3, "mean": 0.1, "lo": 0.05, "hi": 0.15}} for n, w in parts]}


def test_what_we_found_states_each_claims_verdict_trend_and_meaning_from_the_tables(tmp_path):
    """The "What we found" block (repro_doc.found) from hand-built tables: (a) and (b) per ladder point with the
    ratio read back from the per-seed perplexities, the trend's direction against the paper's side, the points not
    trained named; (c)-(e) per place, with what a broken part means; written only between its own markers."""
    import math

    from idattn.studies import repro_verdicts as rv

    # three points; S4D-only / Interdomain grows with compute (a: reproduced at the top, trend toward the paper),
    # Interdomain trails Softmax by ~10% at the top (b: not reproduced); a fourth point not trained
    pts = []
    for i, (r_a, r_b) in enumerate([(0.95, 1.00), (1.05, 1.05), (1.20, 1.10)]):
        ppl = {"interdomain": [20.0 + s for s in range(3)]}
        ppl["s4d_only"] = [v * r_a * (1 + 0.01 * s) for s, v in enumerate(ppl["interdomain"])]
        ppl["softmax"] = [v / r_b / (1 + 0.005 * s) for s, v in enumerate(ppl["interdomain"])]
        pts.append({"size": f"p{i}", "ppl": ppl, "judged": True, "flops": 10.0 ** (12 + i)})
    pts.append({"size": "p3", "ppl": {m: [None] * 3 for m in ("interdomain", "s4d_only", "softmax")},
                "judged": True, "flops": None})
    climb = {"claims": ladder.claim_stats(pts), "points": pts}
    top_a = [math.log(a / b) for a, b in zip(pts[2]["ppl"]["s4d_only"], pts[2]["ppl"]["interdomain"])]
    assert climb["claims"]["a"]["points"][2]["verdict"] == rv.REPRODUCED
    assert climb["claims"]["a"]["trend"]["sign"] == "+"
    tables = {
        "climb": climb,
        "length": {"verdicts": {"c": _place(rv.VACUOUS, [("precondition, Softmax ...", rv.INCONCLUSIVE)])}},
        "cube": {"verdicts": {"d": _place(rv.REPRODUCED, [("readout effect (query better when > 0)", rv.REPRODUCED)])}},
        "mad": {"verdicts": {"e_noisy_recall": dict(_place(rv.NOT_REPRODUCED, [
            ("Softmax − Interdomain accuracy", rv.NOT_REPRODUCED), ("Interdomain − S4D-only accuracy", rv.REPRODUCED)]),
            task="noisy_recall")}},
        "recall": None,
    }
    text = repro_doc.found(tables)
    para = {line[4:7]: line for line in text.splitlines() if line.startswith("- **(")}
    mean_a = sum(top_a) / 3
    assert f"p2, 1.0e+14 FLOPs: **{rv.REPRODUCED}**, S4D-only / Interdomain ppl {math.exp(mean_a):.3f} [95% CI" in para["(a)"]
    assert f"Interdomain's perplexity is {100 * (1 - math.exp(-mean_a)):.0f}% below S4D-only's" in para["(a)"]
    assert "p3 not trained yet" in para["(a)"] and "moves toward the paper's side with compute" in para["(a)"]
    assert f"**{rv.NOT_REPRODUCED}**" in para["(b)"].split("p2")[1] and "trails Softmax by 1" in para["(b)"]
    assert "moves away from the paper's side" in para["(b)"]  # b's ratio rises with compute, its side is below
    assert "cannot be judged" in para["(c)"]
    assert "reproduced on Table 4 cube (KJV): the query readout is the cube's main effect" in para["(d)"]
    assert ("not reproduced on MAD: noisy recall (Interdomain recalls better than Softmax by more than the claim's "
            "2-point band)") in para["(e)"]
    # written between its own markers, the rest untouched; a doc without them gets the main block only
    path = tmp_path / "doc.md"
    path.write_text(f"top\n{repro_doc.FOUND_BEGIN}\nold\n{repro_doc.FOUND_END}\nmid\n{repro_doc.BEGIN}\nx\n"
                    f"{repro_doc.END}\nend\n")
    repro_doc.update_doc(str(path), "MAIN", text)
    out = path.read_text()
    assert out == (f"top\n{repro_doc.FOUND_BEGIN}\n\n{text}\n\n{repro_doc.FOUND_END}\nmid\n{repro_doc.BEGIN}\n\nMAIN\n\n"
                   f"{repro_doc.END}\nend\n")
    plain = _doc(tmp_path)
    repro_doc.update_doc(plain, "MAIN", text)
    assert "MAIN" in open(plain).read() and text not in open(plain).read()
    # a second FOUND_BEGIN is refused and nothing is written
    bad = tmp_path / "bad.md"
    bad.write_text(out.replace("top\n", f"top\n{repro_doc.FOUND_BEGIN}\n"))
    before = bad.read_text()
    with pytest.raises(repro_doc.DocError, match="expected one"):
        repro_doc.update_doc(str(bad), "MAIN", text)
    assert bad.read_text() == before
