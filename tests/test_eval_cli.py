"""End to end: `python -m idattn.eval` on a tiny random-init model (every suite), then `idattn.results`."""
from __future__ import annotations

import json
import os
import textwrap

import numpy as np

from idattn.eval import harness
from idattn.eval.datasets import write_jsonl
from idattn.eval.schema import read_results
from tests.eval_fixtures import ARC, BOOLQ, HELLASWAG, LAMBADA, OPENBOOKQA, PIQA, SIQA, WIKITEXT, WINOGRANDE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the grass is green and the sky is blue while rivers run to the sea under a yellow sun we go there "
         "and back again reading old books of code reports and meeting notes").split()


def _setup(tmp_path):
    from idattn.data.tokenizer import train_sentencepiece

    rng = np.random.default_rng(0)
    text = [" ".join(rng.choice(WORDS, 60)) + "." for _ in range(200)]
    train_sentencepiece(text + [d["text"] for d in LAMBADA], 300, str(tmp_path / "tok"))
    cfg = tmp_path / "cfg.py"
    cfg.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.join(REPO, 'experiments')!r})
        from scaling import get_config as scaling_config

        def get_config(mixer):
            c = scaling_config(mixer + ",tiny")
            c.model.vocab_size = 300
            c.model.impl = "chunked"
            c.data.tokenizer = {str(tmp_path / 'tok.model')!r}
            c.data.seq_len = 64
            return c
    """))
    data = tmp_path / "data"
    long_docs = [{"text": " ".join(rng.choice(WORDS, 400))} for _ in range(3)]
    write_jsonl(str(data / "pg19" / "test.jsonl"), long_docs)
    docs = {"lambada_openai": LAMBADA, "piqa": PIQA, "hellaswag": HELLASWAG, "winogrande": WINOGRANDE,
            "arc_easy": ARC, "arc_challenge": ARC, "social_iqa": SIQA, "boolq": BOOLQ, "openbookqa": OPENBOOKQA,
            "wikitext": WIKITEXT}
    for name, rows in docs.items():
        write_jsonl(str(data / name / f"{harness.TASKS[name].split}.jsonl"), rows)
    write_jsonl(str(tmp_path / "val.jsonl"), [{"text": t} for t in text[:4]])
    return str(cfg), str(data)


def test_eval_cli_all_suites_then_results(tmp_path, capsys):
    from idattn import results
    from idattn.eval.__main__ import main

    cfg, data = _setup(tmp_path)
    wd = str(tmp_path / "run")
    rc = main([f"--workdir={wd}", "--suite=validation,extrapolation,harness,recall,decode", "--random_init",
               f"--config={cfg}:interdomain", f"--data_dir={data}", f"--val_path={tmp_path / 'val.jsonl'}",
               "--lengths=32,64,112", "--corpora=pg19", "--niah_lengths=96", "--phonebook_sizes=2",
               "--recall_n=2", "--decode_contexts=8", "--decode_batches=1", "--decode_steps=2", "--batch_size=4",
               "--prefill_chunk=8"])
    assert rc == 0
    recs = {r["suite"]: r for r in read_results(wd)}
    assert set(recs) == {"validation", "extrapolation", "harness", "recall", "decode"}
    for r in recs.values():
        assert r["step"] == -1 and r["run"]["mixer"] == "interdomain" and r["run"]["size"] == "tiny"
    v = recs["validation"]["metrics"]
    # random init: the loss is near log(vocab) (weights std 0.02), never wildly off
    assert abs(v["loss"] - np.log(300)) < 0.5 and v["ppl"] == np.exp(v["loss"])
    e = recs["extrapolation"]["metrics"]
    assert set(e) == {"pg19/ppl@32", "pg19/ppl@64", "pg19/ppl@112", "ppl@32", "ppl@64", "ppl@112"}
    assert os.path.getsize(os.path.join(wd, "eval", "extrapolation-stepinit.png")) > 1000
    h = recs["harness"]["metrics"]
    assert 0.0 <= h["average/acc"] <= 1.0 and h["wikitext/word_perplexity"] > 1
    assert {"niah@96/acc", "phonebook@2/acc"} <= set(recs["recall"]["metrics"])
    assert "ms_per_token@8/b1" in recs["decode"]["metrics"]

    # the default validation path: the run's held-out split packed as the trainer validates (KJV corpus here)
    assert main([f"--workdir={wd}", "--suite=validation", "--random_init", f"--config={cfg}:interdomain",
                 "--val_batches=1", "--batch_size=2"]) == 0
    v2 = read_results(wd, "validation")[0]
    assert v2["details"]["method"] == "packed eval batches" and v2["metrics"]["tokens"] > 64
    assert abs(v2["metrics"]["loss"] - np.log(300)) < 0.5

    out = str(tmp_path / "tables")
    assert results.main([f"--runs={wd}", f"--out={out}"]) == 0
    md = open(os.path.join(out, "results.md")).read()
    ours = f"{h['lambada_openai/acc'] * 100:.2f}"
    assert any(ln.startswith("| LAMBADA (acc)") and ln.rstrip(" |").split("|")[6].strip() == ours
               for ln in md.splitlines())
    assert f"{e['ppl@64']:.2f}" in md and "Interdomain ours (tiny)" in md
    json.dumps(recs)  # everything JSON-serialisable
