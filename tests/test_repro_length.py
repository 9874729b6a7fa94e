"""The `length` table on constructed run records (no training): it reads the runs of experiments/repro.py
LENGTH_SIZE (the stdlib corpus for the reproduction) and names that corpus, judges (c) only where Softmax's
position-bucket perplexity shows it uses its context, and writes the table under the invocation's name."""
from __future__ import annotations

import json
import os

import pytest

from idattn.rundir.schema import result_path, write_result
from idattn.studies import repro_length, repro_runs as runs, runcache as cache


def _fake(ctx, mixer, dt, seed, ppl_by_len, context_ratio=None):
    wd = ctx.lm_dir(mixer, dt, seed)
    steps = int(ctx.exp.SIZES[ctx.size]["num_steps"])
    cache.write_marker(wd, {"status": "done", "src": cache.source_hash(), "steps": steps, "params": 1000,
                           "mixer": mixer, "seed": seed, "size": ctx.size, "train_s": 30.0})
    for L, v in ppl_by_len.items():
        write_result(wd, "extrapolation", steps, {f"ppl@{L}": v}, run={"mixer": mixer, "seed": seed},
                     protocol=runs.ppl_protocol(ctx, L))
    if context_ratio is not None:
        proto = runs.context_protocol(ctx)
        write_result(wd, "context", steps, {"context/ratio_last_first": context_ratio},
                     details={"ratio": context_ratio, "edges": [], "bucket_ppl": []}, protocol=proto)
        assert os.path.exists(result_path(wd, "context", steps, proto))


def _build(root, softmax_use, softmax_r=1.5, inter_r=1.01):
    top = cache.Ctx(root, "small", (0, 1, 2), render_only=True, keep_stale=False)
    size = top.exp.LENGTH_SIZE["small"]
    ctx = top.for_size(size)
    lengths = ctx.lengths()
    for s, noise in zip((0, 1, 2), (1.0, 1.02, 0.98)):
        base = 20.0 * (1 + 0.2 * s)  # every seed its own difficulty: the pairing removes it
        grow = lambda r: {L: base * r ** ((L / lengths[0] - 1) / 3) * noise for L in lengths}  # noqa: E731
        _fake(ctx, "softmax", "scaled", s, grow(softmax_r), context_ratio=softmax_use)
        for dt in ("scaled", "paper"):
            _fake(ctx, "interdomain", dt, s, grow(inter_r))
    return top, ctx


def test_length_table_reads_the_stdlib_runs_and_judges_c_there(tmp_path):
    top, ctx = _build(str(tmp_path), softmax_use=0.8)
    assert ctx.exp.SIZES[ctx.size].get("source") == "stdlib"
    data = repro_length.table_length(top)
    # written under the invocation's name (length.md), from the runs of the stdlib size
    md = open(os.path.join(str(tmp_path), "length.md")).read()
    assert not os.path.exists(os.path.join(str(tmp_path), f"length-{ctx.size}.md"))
    assert data["size"] == ctx.size and data["missing"] == []
    from idattn.data import stdlib_corpus
    assert stdlib_corpus.corpus_id() in md and "standard-library" in md
    assert data["softmax_context_use_per_seed"] == [0.8, 0.8, 0.8]
    assert data["verdicts"]["c"]["verdict"] == "reproduced"
    # only the mixers of LENGTH_MIXERS, each recurrent one at both Δ ranges
    assert [(r["mixer"], r["dt"]) for r in data["rows"]] == [("softmax", "scaled"), ("interdomain", "scaled"),
                                                             ("interdomain", "paper")]
    r4 = data["rows"][0]["ratio_4x_per_seed"]
    assert r4 == pytest.approx([1.5] * 3)
    assert json.load(open(os.path.join(str(tmp_path), "length.json")))["verdicts"]["c"]["verdict"] == "reproduced"


def test_length_claim_is_vacuous_when_softmax_does_not_use_its_context(tmp_path):
    top, _ = _build(str(tmp_path), softmax_use=1.0)
    data = repro_length.table_length(top)
    assert data["verdicts"]["c"]["verdict"] == "vacuous at this size"
    assert data["verdicts"]["c_paper_dt"]["verdict"] == "vacuous at this size"


def test_stdlib_size_is_small_on_another_corpus():
    exp = cache.experiment
    a, b = exp.get_config("interdomain,small,scaled,1").to_dict(), exp.get_config("interdomain,stdlib,scaled,1").to_dict()
    assert a["model"] == b["model"] and a["train"] == b["train"] and a["seed"] == b["seed"]
    assert {k for k in a["data"] if a["data"][k] != b["data"][k]} == {"source", "tokenizer"}
    assert (b["data"]["source"], b["data"]["tokenizer"]) == ("stdlib", "stdlib:1024")
    from idattn.data import tokenizer
    with pytest.raises(ValueError, match="after 'stdlib:' must be an integer"):
        tokenizer.load_tokenizer("stdlib:many")


def test_length_at_the_new_recipe_judges_c_per_point_with_each_points_own_seeds(tmp_path):
    """`length_climb`: the `length` table at each LENGTH_CLIMB point (stdlib corpus, a new-ladder recipe), 5 seeds a
    point; verdicts keyed <claim>@<point>; a point without runs is listed as missing, never judged on nothing."""
    root = str(tmp_path)
    top = cache.Ctx(root, "small", (0, 1, 2), render_only=True, keep_stale=False)
    low, high = top.exp.LENGTH_CLIMB
    assert top.exp.SEEDS[low] == (0, 1, 2, 3, 4) and top.exp.SIZES[low]["source"] == "stdlib"
    assert top.exp.SIZES[low]["num_steps"] == top.exp.SIZES[top.exp.CLIMB[0]]["num_steps"]
    ctx = top.for_size(low)
    lengths = ctx.lengths()
    for s in range(5):
        noise = 1 + 0.01 * s
        grow = lambda r: {L: 20.0 * r ** ((L / lengths[0] - 1) / 3) * noise for L in lengths}  # noqa: E731
        _fake(ctx, "softmax", "scaled", s, grow(1.5), context_ratio=0.8 + 0.01 * s)
        for dt in ("scaled", "paper"):
            _fake(ctx, "interdomain", dt, s, grow(1.01 + 0.001 * s))
    data = repro_length.table_length_climb(top)
    assert [p["size"] for p in data["points"]] == [low, high]
    assert data["points"][0]["seeds"] == [0, 1, 2, 3, 4]
    v = data["verdicts"][f"c@{low}"]
    assert v["verdict"] == "reproduced" and v["point"] == low
    assert all(p["interval"]["n"] == 5 for p in v["parts"])
    assert data["verdicts"][f"c@{high}"]["verdict"] != "reproduced"
    assert len([m for m in data["missing"] if m.startswith(high + "/")]) == 3 * 5
    assert not [m for m in data["missing"] if m.startswith(low + "/")]
    md = open(os.path.join(root, "length_climb.md")).read()
    assert f"### {low} (400 steps x 16 x 256, d_model 64)" in md and f"### {high} (" in md
    # the doc's summary names the point
    from idattn.studies import repro_doc
    rows = repro_doc.summary_rows({"length_climb": data})
    assert any(r[1] == f"{repro_length.CLIMB_TABLE.where}: {low}" and "reproduced" in r[2] for r in rows)
