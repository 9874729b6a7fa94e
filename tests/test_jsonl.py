"""idattn.data.jsonl, the one JSON Lines reader of prepare, score / generate and the eval datasets: the file's own
line numbers in every refusal, gzip by name, null text as "", and each caller's error type with the message kept."""
from __future__ import annotations

import gzip

import pytest

from idattn.data import jsonl


def test_rows_and_texts_keep_the_files_line_numbers_and_read_gzip(tmp_path):
    lines = ['{"text": "a"}', "", '{"text": null, "id": 2}', "   ", '{"text": "c"}']
    plain = tmp_path / "x.jsonl"
    plain.write_text("\n".join(lines) + "\n")
    packed = tmp_path / "x.jsonl.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    for p in (plain, packed):
        assert list(jsonl.texts(str(p), "text")) == [(1, "a"), (3, ""), (5, "c")]
        assert [n for n, _ in jsonl.rows(str(p))] == [1, 3, 5]


@pytest.mark.parametrize("body, field, match", [
    ('{"text": "a"}\n\n{"text": "b",}\n', "text", r"x\.jsonl:3: not a JSON object"),
    ('{"text": "a"}\n{"body": "b"}\n', "text", r"x\.jsonl:2: no field 'text' \(found \['body'\]\); pass --text_field"),
    ('[1, 2]\n', "text", r"x\.jsonl:1: no field 'text' \(found list\)"),
    ('{"text": 3}\n', "text", r"x\.jsonl:1: field 'text' holds int, not text"),
])
def test_a_bad_line_is_refused_in_one_line_naming_file_line_and_fix(tmp_path, body, field, match):
    p = tmp_path / "x.jsonl"
    p.write_text(body)
    with pytest.raises(jsonl.JsonlError, match=match) as e:
        list(jsonl.texts(str(p), field))
    assert "\n" not in str(e.value)


def test_callers_keep_their_error_types_and_the_message(tmp_path):
    from absl import app

    from idattn.data import prepare
    from idattn.eval import datasets
    from idattn.score import read_jsonl_texts
    p = tmp_path / "x.jsonl"
    p.write_text('{"text": "a"}\n{"text": "b"\n')
    with pytest.raises(prepare.PrepareError, match=r"x\.jsonl:2: not a JSON object"):
        list(prepare._iter_jsonl(str(p), "text"))
    with pytest.raises(app.UsageError, match=r"^--texts=.*x\.jsonl:2: not a JSON object"):
        read_jsonl_texts(str(p), "text", "texts")
    with pytest.raises(ValueError, match=r"x\.jsonl:2: not a JSON object"):
        datasets.read_records(str(p))
    # score refuses an empty text (nothing to score) where prepare keeps it as an empty document
    p.write_text('{"text": "a"}\n{"text": null}\n')
    assert list(prepare._iter_jsonl(str(p), "text")) == ["a", ""]
    with pytest.raises(app.UsageError, match=r"--prompts=.*x\.jsonl:2: 'text' is empty or null"):
        read_jsonl_texts(str(p), "text", "prompts")
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(app.UsageError, match=r"--texts=.*nope\.jsonl: unreadable"):
        read_jsonl_texts(str(missing), "text", "texts")


@pytest.mark.parametrize("name", ["texts.txt", "notes.md", "texts.txt.gz"])
def test_score_reads_plain_text_one_text_a_line(tmp_path, name):
    """Issue 54 item 6: `score --texts=file.txt` refused plain text (JSON Lines only). A .txt / .text / .md file (or
    its .gz) holds one text a line, blank lines skipped, each line's text kept as written (no JSON parsing)."""
    from absl import app

    from idattn.score import read_jsonl_texts
    body = 'In the beginning\n\n  {"text": "not JSON here"}\r\nthe end \n   \n'
    p = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(p, "wt", encoding="utf-8", newline="") as f:
            f.write(body)
    else:
        p.write_bytes(body.encode())
    assert read_jsonl_texts(str(p), "text", "texts") == ["In the beginning", '  {"text": "not JSON here"}',
                                                         "the end "]
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(app.UsageError, match=r"^--prompts=.*blank\.txt: no line to read"):
        read_jsonl_texts(str(tmp_path / "blank.txt"), "text", "prompts")
