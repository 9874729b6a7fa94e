"""`idattn.results`: tables from result JSON files written here, and the transcribed paper numbers."""
from __future__ import annotations

import math
import os

import numpy as np

from idattn.studies import results
from idattn.eval import paper_numbers as P
from idattn.rundir.schema import write_result


def test_paper_numbers_are_consistent():
    """Table 2 is the mean of Table 8's five corpora; the 8-task average is the mean of Table 7's rows."""
    for fam in P.MIXERS:
        five = np.mean([P.TABLE8[c][fam] for c in ("pg19", "codeparrot", "govreport", "qasper", "qmsum")], axis=0)
        np.testing.assert_allclose(five, P.TABLE2[fam], atol=0.011)
        accs = [paper[fam] for key, _, paper in P.TABLE7 if key != "harness/average/acc"]
        assert len(accs) == 8
        np.testing.assert_allclose(np.mean(accs), P.TABLE7[-1][2][fam], atol=0.011)
        assert abs(math.exp(dict((k, v) for k, _, v in P.TABLE6)["validation/loss"][fam]) - P.VAL_PPL["1.3b"][fam]) < 0.02


def _run(root, name, mixer, size, seq_len=64):
    wd = os.path.join(root, name)
    run = {"mixer": mixer, "size": size, "seq_len": seq_len}
    return wd, run


def test_tables_from_result_files(tmp_path, capsys):
    root = str(tmp_path)
    vals = {"softmax": 2.20, "interdomain": 2.10, "s4d_only": 2.30}
    for i, (mixer, loss) in enumerate(vals.items()):
        wd, run = _run(root, mixer, mixer, "1.3b")
        write_result(wd, "validation", 100, {"loss": loss + 0.5, "ppl": math.exp(loss + 0.5)}, run=run)
        write_result(wd, "validation", 200, {"loss": loss, "ppl": math.exp(loss)}, run=run)  # best
        write_result(wd, "validation", 300, {"loss": loss + 0.1, "ppl": math.exp(loss + 0.1)}, run=run)  # final
        m = {f"{t}/acc": 0.5 + 0.01 * i for t in ("lambada_openai", "piqa", "winogrande", "arc_easy", "social_iqa",
                                                 "boolq")}
        m.update({"hellaswag/acc_norm": 0.4, "arc_challenge/acc_norm": 0.3, "lambada_openai/ppl": 30.0 + i,
                  "wikitext/word_perplexity": 40.0, "wikitext/bits_per_byte": 0.9, "average/acc": 0.45})
        write_result(wd, "harness", 300, m, run=run)
        ext = {}
        for L in (64, 128, 224):
            for c in ("pg19", "codeparrot", "govreport", "qasper", "qmsum", "narrativeqa"):
                ext[f"{c}/ppl@{L}"] = 10.0 + i + L / 1000 + (0.5 if c == "govreport" else 0.0)
            ext[f"ppl@{L}"] = 10.0 + i + L / 1000 + 0.1  # the five-corpus mean
        write_result(wd, "extrapolation", 300, ext, run=run)
        write_result(wd, "recall", 300, {"niah@1024/acc": 0.25 * i, "phonebook@16/acc": 0.125},
                     run=run)
    wd, run = _run(root, "cube", "generic-query-rope", "125m")
    write_result(wd, "validation", 10, {"loss": 2.9, "ppl": math.exp(2.9)}, run=run)
    wd, run = _run(root, "soft125", "softmax", "125m")
    write_result(wd, "validation", 10, {"loss": 2.8, "ppl": math.exp(2.8)}, run=run)
    # a cube cell validated on another token count: marked, and no ratio to softmax
    wd, run = _run(root, "cube2", "dualkv-linear-rope", "125m")
    write_result(wd, "validation", 10, {"loss": 2.7, "ppl": math.exp(2.7)}, run=run, details={"tokens": 999})
    # a user's own corpus (and an old-style headline mean over it): never in the five-corpus Table 2
    wd, run = _run(root, "mine", "interdomain", "d128xL2")
    write_result(wd, "extrapolation", 5, {"pydocs/ppl@64": 30.0, "pydocs/ppl@128": 31.5, "ppl@64": 99.0,
                                          "ppl@128": 98.0}, run=run, details={"corpora": {"pydocs": {"docs": 3}}})

    out = str(tmp_path / "out")
    assert results.main(["--runs", os.path.join(root, "*"), "--out", out]) == 0
    md = open(os.path.join(out, "results.md")).read()
    assert "### Table 2" in capsys.readouterr().out and "### Table 9" in md
    for png in ("extrapolation.png", "scaling.png", "recall.png"):
        assert os.path.getsize(os.path.join(out, png)) > 1000
    lines = md.splitlines()

    def row(prefix):
        hits = [ln for ln in lines if ln.startswith(prefix)]
        assert hits, prefix
        return [c.strip() for c in hits[0].strip("|").split("|")]

    # Table 6: best-of-run validation (2.10 for interdomain), paper values beside ours; accuracies in %
    r = row("| Validation CE")
    assert r[1:4] == ["2.1550", "2.0770", "2.2120"] and r[4:7] == ["2.2000", "2.1000", "2.3000"]
    r = row("| LAMBADA acc")
    assert r[1:4] == ["39.43", "44.36", "25.64"] and r[4:7] == ["50.00", "51.00", "52.00"]
    r = row("| HellaSwag (acc_norm)")
    assert r[4:7] == ["40.00", "40.00", "40.00"]
    # Table 2: our 1x / 2x / 3.5x columns come from lengths 64 / 128 / 224 at seq_len 64 (five-corpus runs only)
    r = row("| Interdomain | 14.36")
    assert r[4:7] == ["11.16", "11.23", "11.32"] and r[7] == "1.3b"
    t2 = md.split("### Table 2")[1].split("###")[0]
    assert "99.00" not in t2 and "98.00" not in t2 and "pydocs" in t2  # named as not averaged in
    # the per-corpus table: the user's corpus by its name, each value at its length
    r = row("| pydocs |")
    assert r[1] == "dualkv-query-rope (lti core, d128xl2)" and r[3] == "3 docs, first L tokens of each" and r[4] == "30.00 @64 (1x), 31.50 @128 (2x)"
    # Table 8: per corpus
    assert row("| qmsum | S4D-only")[5:8] == ["12.06", "12.13", "12.22"]
    assert row("| govreport | Softmax")[5:8] == ["10.56", "10.63", "10.72"]
    # Table 4: the 125M cells, relative to the 125M softmax run
    r = row("| generic-query-rope")
    assert r[5] == "2.9000" and r[7] == f"{(math.exp(2.9) / math.exp(2.8) - 1) * 100:+.2f}%" and r[8] == "125m"
    assert row("| softmax | Softmax")[5] == "2.8000"
    # the cell validated on another token count has its own row, with no softmax run of that protocol to compare
    r = row("| dualkv-linear-rope")
    assert r[5] == "2.7000" and "999 tokens" in r[4] and r[7] == "—"
    t4 = md.split("### Table 4")[1].split("###")[0]
    assert "†" not in t4 and "validated under 2 protocols" in t4
    # Table 9: S-NIAH-1 at 1K (ours 0 / 25 / 50 %), phonebook 12.5 %
    assert row("| S-NIAH-1 | S4D-only")[6] == "50.00"
    assert row("| Phonebook (16/32/64/128 entries) | Softmax")[6] == "12.50"
    # Fig. 2: best-of-run ppl at 1.3b
    r = row("| 1.3b")
    assert r[5:8] == [f"{math.exp(2.2):.2f}", f"{math.exp(2.1):.2f}", f"{math.exp(2.3):.2f}"]


def test_runs_without_results_refused(tmp_path):
    import pytest

    os.makedirs(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no eval"):
        results.Run(str(tmp_path / "empty"))


def test_run_identity_from_trainer_config(tmp_path):
    """The trainer's validation records carry no size / seq_len: they come from the saved config."""
    import importlib.util

    from idattn.rundir.layout import save_config

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "scaling.py")
    spec = importlib.util.spec_from_file_location("_scaling_cfg_results", path)  # by path: any working directory
    scaling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scaling)
    get_config = scaling.get_config

    wd = str(tmp_path / "run")
    os.makedirs(wd)
    save_config(wd, get_config("s4d_only,tiny"))
    write_result(wd, "validation", 5, {"loss": 3.0, "ppl": math.exp(3.0)}, run={"workdir": wd, "mixer": "s4d_only"})
    r = results.Run(wd)
    assert (r.size, r.seq_len(), r.family, r.mixer) == ("tiny", 64, "s4d_only", "generic-linear-norope")


def test_runs_of_two_tokenizers_are_never_one_row(tmp_path):
    """Same corpus, token count and context, two tokenizers (their saved configs say which): per-token perplexities
    of two vocabularies do not compare, so Fig. 2 gives each its own row, named by its tokenizer (issue 38 item 3)."""
    from idattn.rundir.layout import save_config
    from tests import train_helpers as T
    run = {"mixer": "interdomain", "size": "d128xl2", "seq_len": 64, "params": 696456}
    dirs = []
    for name, tok, loss in (("t512", "train:512", 4.0), ("t1024", "train:1024", 4.4)):
        wd = os.path.join(str(tmp_path), name)
        os.makedirs(wd)
        save_config(wd, T.tiny_config(**{"data.tokenizer": tok}))
        _trainer_val(wd, "kjv.val", loss, run)
        dirs.append(wd)
    md = results.render([results.Run(d) for d in dirs])
    fig2 = md.split("### Fig. 2")[1].split("###")[0]
    rows = sorted(ln for ln in fig2.splitlines() if ln.startswith("| d128xl2"))
    assert len(rows) == 2, rows
    assert "tokenizer train:1024" in rows[0] and f"{math.exp(4.4):.2f}" in rows[0]
    assert "tokenizer train:512" in rows[1] and f"{math.exp(4.0):.2f}" in rows[1]


def _trainer_val(wd, corpus, loss, run, step=100, tokens=32768):
    """A trainer-style validation file (no protocol; the corpus in its details) and one eval CLI file."""
    write_result(wd, "validation", step, {"loss": loss, "ppl": math.exp(loss)}, run=run,
                 details={"tokens": tokens, "seq_len": 64, "corpus": corpus})


def test_two_corpora_same_mixer_and_size_both_shown_in_any_order(tmp_path):
    """Two runs of one mixer and size on two corpora: both appear, labelled by corpus, in Fig. 2, Table 4 and the
    scaling plot's series (one per corpus), and the output is identical whichever order --runs gives them."""
    root = str(tmp_path)
    run = {"mixer": "interdomain", "size": "d128xl2", "seq_len": 64, "params": 696456}
    _trainer_val(os.path.join(root, "on_kjv"), "kjv.val", math.log(150.65), run)
    _trainer_val(os.path.join(root, "on_py"), "pystdlib.val", math.log(26.05), run)
    a, b = os.path.join(root, "on_kjv"), os.path.join(root, "on_py")
    outs = []
    for order in ([a, b], [b, a]):
        out = str(tmp_path / f"out{len(outs)}")
        assert results.main(["--runs", *order, "--out", out]) == 0
        outs.append(open(os.path.join(out, "results.md")).read())
    assert outs[0] == outs[1]
    md = outs[0]
    fig2 = md.split("### Fig. 2")[1].split("###")[0]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in fig2.splitlines() if ln.startswith("| d128xl2")]
    # one row per corpus, each unmarked: a row is one protocol, so nothing in it needs a † (issue 38 item 3)
    protocol = ", 32,768 tokens, context 64"
    assert sorted((r[1], r[6]) for r in rows) == [("kjv.val" + protocol, "150.65"),
                                                   ("pystdlib.val" + protocol, "26.05")]
    t4 = md.split("### Table 4")[1].split("###")[0]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in t4.splitlines()
            if ln.startswith("| dualkv-query-rope")]
    assert sorted((r[4], r[6]) for r in rows) == [("kjv.val" + protocol, "150.65"),
                                                   ("pystdlib.val" + protocol, "26.05")]
    series = results.scaling_series(sorted((results.Run(d) for d in (b, a)), key=results.Run.sort_key))
    assert [(f, [round(p[1], 2) for p in pts]) for f, _, pts in series] == [("interdomain", [150.65]),
                                                                           ("interdomain", [26.05])]
    assert "kjv.val" in series[0][1] and "pystdlib.val" in series[1][1]


def test_competing_runs_choice_is_stated_and_order_independent(tmp_path):
    """Two runs for one cell (same mixer, size, corpus): the latest step wins, in any order, and the tables say
    which run was chosen over which."""
    root = str(tmp_path)
    run = {"mixer": "interdomain", "size": "d128xl2", "seq_len": 64, "params": 696456}
    _trainer_val(os.path.join(root, "short"), "kjv.val", 4.0, run, step=30)
    _trainer_val(os.path.join(root, "long"), "kjv.val", 3.5, run, step=300)
    mds = [results.render([results.Run(os.path.join(root, n)) for n in names])
           for names in (("short", "long"), ("long", "short"))]
    assert mds[0] == mds[1]
    assert f"| d128xl2 | kjv.val, 32,768 tokens, context 64 | — | — | — | — | {math.exp(3.5):.2f} | — |" in mds[0]
    why = mds[0].split("### Which run fills a cell")[1]
    assert f"`{os.path.join(root, 'long')}` (kjv.val, step 300) chosen over `{os.path.join(root, 'short')}`" in why
    assert "the latest step" in why


def test_quickstart_plot_labels_what_it_plots(tmp_path):
    """The quickstart plot draws the length sweep (the first EVAL_TOKENS held-out tokens in rows of L), not the
    trainer's validation perplexity (another token count): its y label says so."""
    from idattn.studies import quickstart

    lengths = (64, 128)
    rows = [{"name": "Softmax", "ppl": {64: 30.0, 128: 29.0}}]
    labels = quickstart.plot(str(tmp_path / "q.png"), lengths, rows, {64: 300.0, 128: 300.0}, 64, 64512)
    assert "first 64,512 held-out KJV tokens" in labels["ylabel"] and "validation" not in labels["ylabel"]
    assert os.path.getsize(tmp_path / "q.png") > 1000


def test_a_hybrid_is_its_own_model_in_results_never_its_recurrent_mixer(tmp_path):
    """A hybrid keeps `model.mixer` (its recurrent layers' name): results must not group it with the homogeneous
    model of that name. Its label is the repeated group (with the window of swa entries), from the saved config
    and in the trainer's and evaluator's run records alike."""
    from idattn.configs import hybrid, scaling
    from idattn.models import model_label
    from idattn.rundir.layout import save_config

    homo = scaling.get_config("interdomain,tiny")
    mixed = hybrid.get_config("interdomain,softmax,1:3,tiny")
    swa = hybrid.get_config("interdomain,swa,1:3,tiny")
    assert model_label(homo.model) == "interdomain"
    assert model_label(mixed.model) == "hybrid[interdomain,interdomain,interdomain,softmax]"
    assert model_label(swa.model) == f"hybrid[interdomain,interdomain,interdomain,swa@{swa.model.window}]"
    runs = []
    for name, cfg in (("homo", homo), ("mixed", mixed)):
        wd = str(tmp_path / name)
        os.makedirs(wd)
        save_config(wd, cfg)
        write_result(wd, "validation", 5, {"loss": 3.0, "ppl": math.exp(3.0)}, run={"workdir": wd})
        runs.append(results.Run(wd))
    assert [r.mixer for r in runs] == ["dualkv-query-rope", "hybrid[interdomain,interdomain,interdomain,softmax]"]
    assert runs[0].family != runs[1].family


def test_table6_never_sets_runs_of_two_corpora_side_by_side(tmp_path):
    """The trial's case: Softmax validated on one corpus, Interdomain on that corpus (an older step) and on another
    (a later step). "Latest step" must not pick the other corpus's run for a row beside Softmax: the table is split
    by corpus, each part holding only its corpus's numbers."""
    root = str(tmp_path)
    soft = {"mixer": "softmax", "size": "1.3b", "seq_len": 64}
    inter = {"mixer": "interdomain", "size": "1.3b", "seq_len": 64}
    _trainer_val(os.path.join(root, "soft_kjv"), "kjv.val", math.log(40.0), soft, step=100)
    _trainer_val(os.path.join(root, "inter_kjv"), "kjv.val", math.log(42.0), inter, step=100)
    _trainer_val(os.path.join(root, "inter_py"), "pystdlib.val", math.log(9.0), inter, step=500)
    out = str(tmp_path / "out")
    assert results.main(["--runs", *(os.path.join(root, d) for d in ("soft_kjv", "inter_kjv", "inter_py")),
                         "--out", out]) == 0
    md = open(os.path.join(out, "results.md")).read()
    parts = md.split("### Table 6")[1:]
    assert len(parts) == 2, md[:3000]
    kjv = next(p for p in parts if p.startswith(": validation and downstream (paper: 1.3B / 26B tokens): ours "
                                                "validated on kjv.val"))
    py = next(p for p in parts if "ours validated on pystdlib.val" in p.split("\n")[0])

    def ce_row(part):
        row = next(ln for ln in part.splitlines() if ln.startswith("| Validation CE"))
        return [c.strip() for c in row.strip("|").split("|")][4:]  # ours: Softmax, Interdomain, S4D-only
    assert ce_row(kjv)[:2] == [f"{math.log(40.0):.4f}", f"{math.log(42.0):.4f}"]
    assert ce_row(py)[:2] == ["—", f"{math.log(9.0):.4f}"]
    assert "never set side by side" in md


def _tables(md, heading):
    """(header, rows) of the first Markdown table under every section whose heading starts with `heading`."""
    out = []
    for part in md.split("### " + heading)[1:]:
        lines = [ln for ln in part.split("\n###")[0].splitlines() if ln.startswith("|")]
        cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
        end = next((i for i in range(2, len(cells)) if len(cells[i]) != len(cells[0])), len(cells))
        out.append((cells[0], cells[2:end]))
    return out


# (run folder, the mixer its result files record, what results must call it, its core)
ZOO = [("softmax", "softmax", "Softmax", None), ("interdomain", "interdomain", "Interdomain", "lti"),
       ("s4d_only", "s4d_only", "S4D-only", "lti"),
       ("hybrid-global", "hybrid[interdomain,softmax]", "hybrid[interdomain,softmax]", "lti"),
       ("hybrid-swa", "hybrid[interdomain,swa@64]", "hybrid[interdomain,swa@64]", "lti"),
       ("selective", "interdomain-selective", "interdomain-selective", "selective"),
       ("cube", "generic-query-rope", "generic-query-rope", "lti")]


def test_every_run_has_its_numbers_in_every_table_it_belongs_to(tmp_path):
    """Issue 54 item 1: hybrid (global and sliding-window), selective and cube-cell runs beside the three baselines,
    all of one size on one corpus, each with validation, harness, extrapolation and recall files: every run is
    described in the header (mixer or layer pattern, core, size, corpus) and has its own numbers in Fig. 2,
    Tables 4, 6, 7 and 9, the per-corpus table and the scaling plot's series."""
    root = str(tmp_path)
    dirs = []
    for i, (name, mixer, _, _) in enumerate(ZOO):
        wd = os.path.join(root, name)
        run = {"mixer": mixer, "size": "d128l2", "seq_len": 64, "params": 600000 + 1000 * i}
        _trainer_val(wd, "kjv.val", 4.0 + 0.1 * i, run)
        write_result(wd, "harness", 100, {"lambada_openai/acc": 0.01 * (i + 1), "average/acc": 0.3 + 0.01 * i},
                     run=run)
        write_result(wd, "extrapolation", 100, {f"kjv/ppl@{L}": 50.0 + i + L / 1000 for L in (64, 128)}, run=run,
                     details={"corpora": {"kjv": {"docs": 3}}})
        write_result(wd, "recall", 100, {"niah@1024/acc": 0.05 * (i + 1)}, run=run)
        dirs.append(wd)
    runs = [results.Run(d) for d in dirs]
    md = results.render(runs)

    header = md.split("Runs: ")[1].split("\n")[0]
    for (name, _, _, core), r in zip(ZOO, runs):
        desc = f"`{os.path.join(root, name)}` ({r.mixer}" + (f", {core} core" if core else "") + \
            ", d128l2, validated on kjv.val)"
        assert desc in header, (desc, header)
    assert "selective core" in header and "hybrid[interdomain,swa@64]" in header

    def col(header_row, label, suffix):
        hits = [j for j, h in enumerate(header_row) if h.startswith(label) and suffix in h
                and (label != "Interdomain" or not h.startswith("Interdomain ("))]
        assert len(hits) == 1, (label, header_row)
        return hits[0]

    (h, rows), = _tables(md, "Fig. 2")
    row = next(r for r in rows if r[0] == "d128l2")
    for i, (_, _, label, _) in enumerate(ZOO):
        assert row[col(h, label, "ours")] == f"{math.exp(4.0 + 0.1 * i):.2f}", (label, h, row)
    (h, rows), = _tables(md, "Table 6")
    row = next(r for r in rows if r[0].startswith("Validation CE"))
    for i, (_, _, label, _) in enumerate(ZOO):
        assert row[col(h, label, "ours")] == f"{4.0 + 0.1 * i:.4f}", (label, h, row)
    (h, rows), = _tables(md, "Table 7")
    row = next(r for r in rows if r[0] == "LAMBADA (acc)")
    for i, (_, _, label, _) in enumerate(ZOO):
        assert row[col(h, label, "ours")] == f"{i + 1:.2f}", (label, h, row)
    (h, rows), = _tables(md, "Table 9")
    for i, (_, _, label, _) in enumerate(ZOO):
        row = next((r for r in rows if r[0] == "S-NIAH-1" and (r[1] == label or r[1].startswith(label + " ("))),
                   None)
        assert row and row[h.index("ours 1024")] == f"{5 * (i + 1):.2f}", (label, rows)
    # Table 4: the cube's cells (the cube-cell run included) and every other model of the cube's size, each
    # against the softmax run of its protocol
    (h, rows), = _tables(md, "Table 4")
    t4 = {r[0]: r for r in rows if r[h.index("ours loss")] != "—"}
    want = {"softmax": 0, "dualkv-query-rope": 1, "generic-linear-norope": 2, "generic-query-rope": 6}
    for i, (_, _, label, _) in enumerate(ZOO):
        cell = next((c for c in t4 if c == label or c.startswith(label + " ")), None) if i not in want.values() \
            else next(c for c, j in want.items() if j == i)
        assert cell in t4 and t4[cell][h.index("ours loss")] == f"{4.0 + 0.1 * i:.4f}", (label, sorted(t4))
        if i:
            rel = (math.exp(4.0 + 0.1 * i) / math.exp(4.0) - 1) * 100
            assert t4[cell][h.index("ours vs softmax")] == f"{rel:+.2f}%"
    (h, rows), = _tables(md, "Length extrapolation per corpus")
    assert sorted(r[1] for r in rows) == sorted(f"{r.label()}" for r in runs) and len(rows) == len(ZOO)
    series = results.scaling_series(runs)
    assert sorted(round(pts[0][1], 2) for _, _, pts in series) == \
        sorted(round(math.exp(4.0 + 0.1 * i), 2) for i in range(len(ZOO)))


def test_plot_legends_sit_outside_the_data_and_the_axis_labels(tmp_path, monkeypatch):
    """Issue 54 item 1: with seven runs the scaling plot's legend covered points and the y-axis label. Every plot's
    legend is drawn beside the axes: its box overlaps neither the axes (the data) nor either axis label, and it
    stays inside the saved figure."""
    root = str(tmp_path)
    for i, (name, mixer, _, _) in enumerate(ZOO):
        wd = os.path.join(root, name)
        run = {"mixer": mixer, "size": "d128l2", "seq_len": 64, "params": 600000 + 1000 * i}
        _trainer_val(wd, "kjv.val", 4.0 + 0.1 * i, run)
        write_result(wd, "extrapolation", 100, {f"kjv/ppl@{L}": 50.0 + i + L / 1000 for L in (64, 128)}, run=run,
                     details={"corpora": {"kjv": {"docs": 3}}})
        write_result(wd, "recall", 100, {"niah@1024/acc": 0.05 * (i + 1)}, run=run)
    runs = [results.Run(os.path.join(root, n)) for n, *_ in ZOO]
    figs = []

    def keep(fig, path, **kw):
        fig.canvas.draw()
        figs.append((os.path.basename(path), fig, kw))
        return path

    monkeypatch.setattr(results.atomic, "savefig", keep)
    monkeypatch.setattr("matplotlib.pyplot.close", lambda *a: None)
    results.plot_scaling(runs, str(tmp_path / "scaling.png"))
    results.plot_extrapolation(runs, str(tmp_path / "extrapolation.png"))
    results.plot_recall(runs, str(tmp_path / "recall.png"))
    assert [n for n, _, _ in figs] == ["scaling.png", "extrapolation.png", "recall.png"]
    for name, fig, kw in figs:
        ax = fig.axes[0]
        legend = ax.get_legend() or fig.legends[0]
        r = fig.canvas.get_renderer()
        box = legend.get_window_extent(r)
        assert len(legend.get_texts()) >= len(ZOO), name
        for other, what in ((ax.get_window_extent(r), "the axes"), (ax.yaxis.label.get_window_extent(r), "y label"),
                            (ax.xaxis.label.get_window_extent(r), "x label")):
            assert not box.overlaps(other), (name, what, box, other)
        whole = fig.bbox if kw.get("bbox_inches") != "tight" else fig.get_tightbbox(r).transformed(
            fig.dpi_scale_trans)
        assert whole.x0 - 1 <= box.x0 and box.x1 <= whole.x1 + 1 and whole.y0 - 1 <= box.y0 and \
            box.y1 <= whole.y1 + 1, (name, box, whole)


def test_rolling_extrapolation_never_hides_the_paper_protocol(tmp_path):
    """Issue 54 item 6: a run scored on one corpus with the paper's protocol (first L tokens of each document) and
    later with rolling windows: the per-corpus table has a row for each, named by its protocol, and Table 8 takes
    only the paper protocol's numbers."""
    wd = str(tmp_path / "run")
    run = {"mixer": "interdomain", "size": "1.3b", "seq_len": 64}
    write_result(wd, "extrapolation", 100, {f"pg19/ppl@{L}": 20.0 + L / 1000 for L in (64, 128, 224)}, run=run,
                 details={"corpora": {"pg19": {"docs": 4}}},
                 protocol={"corpus": "pg19", "context": [64, 128, 224]})
    write_result(wd, "extrapolation", 100, {f"pg19/ppl@{L}": 30.0 + L / 1000 for L in (64, 128, 224)}, run=run,
                 details={"corpora": {"pg19": {"docs": 9, "224": {"tokens": 5000}}}},
                 protocol={"corpus": "pg19", "context": [64, 128, 224], "mode": "rolling"})
    md = results.render([results.Run(wd)])
    (_, rows), = _tables(md, "Length extrapolation per corpus")
    got = sorted((r[3], r[4]) for r in rows if r[0] == "pg19")
    assert got == [("4 docs, first L tokens of each", "20.06 @64 (1x), 20.13 @128 (2x), 20.22 @224 (3.5x)"),
                   ("9 docs whole, 5,000 tokens, disjoint windows of L (rolling)",
                    "30.06 @64 (1x), 30.13 @128 (2x), 30.22 @224 (3.5x)")], rows
    (_, rows), = _tables(md, "Table 8")
    assert next(r for r in rows if r[:2] == ["pg19", "Interdomain"])[5:8] == ["20.06", "20.13", "20.22"]
