"""docs/own-data.md end to end: its commands, run as subprocesses on a small corpus this test writes.

The `$ python -m idattn...` lines of the doc's console blocks are run as written and in the doc's order, from a
folder holding `my_corpus/` (a mixed folder: plain text files and a JSON Lines file, as in the doc); only sizes
are appended (argparse and absl take the last value of a repeated flag): a 300-piece tokenizer, a 3-step run of a
smaller model at context 64, lengths 64/160, 8 generated tokens. Checked: the mixed folder is prepared in one
run; every printed table holds the numbers of the JSON files; the trainer's validation file is byte-identical
after the eval CLI ran, and the eval CLI's validation (same protocol) gives the trainer's number; the user's
corpus name is in the eval files and the results tables; generate and score answer from the trained run. A
command the doc shows refused (the line below it holds " refused: ") must be refused with that line (numbers
aside: the doc's corpus is not the test's) and write nothing.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "own-data.md")
WORDS = ("def return class import self value list dict the for in if else while with as from raise error file "
         "path name data read write open close test check string number result item key").split()

# sizes appended to the doc's commands (the last value of a repeated flag wins)
SMALL = {
    "idattn.data.prepare": ["--train_tokenizer=300", "--num_proc=0", "--min_val_tokens=300"],
    "idattn.train": ["--config.model.vocab_size=300", "--config.data.seq_len=64", "--config.train.num_steps=3",
                     "--config.train.batch_size=4", "--config.train.warmup_steps=1", "--config.train.log_every=1",
                     "--config.train.eval_batches=1", "--config.train.checkpoint_every=3",
                     "--config.model.d_model=64", "--config.model.num_heads=2", "--config.model.head_dim=32",
                     "--config.model.ffn_dim=128", "--config.model.num_modes=8", "--config.model.num_layers=1"],
    "idattn.eval": ["--lengths=64,160", "--batch_size=4"],
    "idattn.generate": ["--max_new_tokens=8", "--out=gen.json"],
    "idattn.score": [],
    "idattn.results": [],
}


def doc_commands() -> list[tuple[list[str], str | None]]:
    """The `$ python -m idattn...` commands of docs/own-data.md, in order (backslash continuations joined), each
    with the refusal line the doc shows right below it (None for a command that succeeds)."""
    lines = open(DOC).read().splitlines()
    out = []
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("$ python -m idattn"):
            cmd = ln[2:]
            while cmd.rstrip().endswith("\\"):
                i += 1
                cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            out.append((shlex.split(cmd), nxt if " refused: " in nxt else None))
        i += 1
    return out


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _run(cmd, cwd, timeout=300, refusal=None):
    """Run a doc command with the sizes appended; a refusal (the doc's line) must come as that one line, rc 2."""
    module = cmd[2]
    full = [sys.executable] + cmd[1:] + SMALL.get(module, [])
    full = [a.replace("experiments/", os.path.join(REPO, "experiments") + "/") for a in full]
    proc = subprocess.run(full, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    if refusal is None:
        assert proc.returncode == 0, (full, proc.stdout[-2000:], proc.stderr[-3000:])
    else:
        err = [re.sub(r"\d+", "N", ln) for ln in proc.stderr.splitlines() if " refused: " in ln]
        assert proc.returncode == 2 and err == [re.sub(r"\d+", "N", refusal)], (full, proc.stderr[-2000:])
    return proc


def _write_corpus(root, rng, n=40):
    """A mixed folder like the doc's: the first 3/4 of the documents as .txt files, the rest in one JSON Lines
    file with the text in "body"."""
    docs = []
    for i in range(n):
        k = 700 if i % 4 == 0 else 250  # some long documents for the length sweep
        docs.append(f"# module {i}\n" + "\n".join(" ".join(rng.choice(WORDS, 10)) for _ in range(k // 10)))
    (root / "my_corpus").mkdir()
    cut = 3 * n // 4
    for i, d in enumerate(docs[:cut]):
        (root / "my_corpus" / f"m{i:03d}.txt").write_text(d)
    with open(root / "my_corpus" / "more_modules.jsonl", "w") as f:
        for i, d in enumerate(docs[cut:], cut):
            f.write(json.dumps({"body": d, "file": f"m{i:03d}.py"}) + "\n")
    return docs


def _table_rows(text, first_cell):
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in text.splitlines()
            if ln.startswith("| " + first_cell)]


@pytest.mark.slow  # ~90 s on 2 cores: every command of docs/own-data.md in order (CI's slow pass runs it)
def test_doc_commands_end_to_end(tmp_path):
    all_cmds = doc_commands()
    mods = [c[2] for c, refusal in all_cmds if refusal is None]
    assert mods == ["idattn.data.prepare", "idattn.train", "idattn.eval", "idattn.generate", "idattn.score",
                    "idattn.results"], mods
    refused = [c[2] for c, refusal in all_cmds if refusal is not None]
    assert refused == ["idattn.data.prepare", "idattn.eval", "idattn.eval"], refused
    docs = _write_corpus(tmp_path, np.random.default_rng(0))
    (tmp_path / "notes.xlsx").write_text("a,b\n")
    procs: dict[str, list] = {}
    for cmd, refusal in all_cmds:
        module = cmd[2]
        before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
        p = _run(cmd, tmp_path, timeout=600, refusal=refusal)
        if refusal is not None:
            assert sorted(str(x.relative_to(tmp_path)) for x in tmp_path.rglob("*")) == before, cmd  # nothing written
            continue
        procs.setdefault(module, []).append((cmd, p))
        if module == "idattn.data.prepare":  # the mixed folder, in one run: every .txt file and every JSONL line
            out = re.search(r"--out=(\S+)", " ".join(cmd)).group(1)
            meta = json.load(open(tmp_path / out / "meta.json"))
            assert meta["train_docs"] + meta["val_docs"] == len(docs) and meta["val_docs"] >= 2
            assert meta["source"]["format"] == ["jsonl", "text"] and meta["val_tokens"] >= 300
        if module == "idattn.train":
            wd = tmp_path / re.search(r"--workdir=(\S+)", " ".join(cmd)).group(1)
            trainer_file = wd / "eval" / "validation-step00000003.json"
            before_bytes = trainer_file.read_bytes()
            trainer_val = json.loads(before_bytes)["metrics"]

    (evalc, p), = procs["idattn.eval"]
    assert trainer_file.read_bytes() == before_bytes  # the eval CLI never replaces the trainer's file
    corpus = re.search(r"--corpora=(\w+)=", " ".join(evalc)).group(1)
    recs = [json.load(open(f)) for f in sorted(glob.glob(str(wd / "eval" / "*.json")))]
    ours = [r for r in recs if r.get("protocol")]
    assert {r["suite"] for r in ours} == {"validation", "extrapolation"}
    for r in ours:  # the printed table: every number of every file written, as in the file
        for k, v in r["metrics"].items():
            row = [x for x in _table_rows(p.stdout, r["suite"]) if x[2] == k]
            assert row and row[0][3] == f"{v:.4f}", (k, v, p.stdout[-3000:])
        assert "train_overlap" not in r["protocol"]  # the prepared folder's held-out split: never trained on
    val = next(r for r in ours if r["suite"] == "validation")
    # same protocol as the trainer's validation (same tokens, context): the same number
    assert val["metrics"]["tokens"] == json.loads(before_bytes)["details"]["tokens"] == val["protocol"]["tokens"]
    assert val["metrics"]["loss"] == pytest.approx(trainer_val["loss"], rel=1e-5)
    ext = next(r for r in ours if r["suite"] == "extrapolation")
    assert set(ext["metrics"]) == {f"{corpus}/ppl@{L}" for L in (64, 160)}  # named, never averaged
    assert "ETA" in p.stderr

    (_, p), = procs["idattn.generate"]
    gen = json.load(open(tmp_path / "gen.json"))  # the continuation: its ids, decoded on stdout
    assert 1 <= len(gen["generated_ids"]) <= 8 and p.stdout == gen["text"] + "\n"
    (_, p), = procs["idattn.score"]
    sc = json.loads(p.stdout)
    assert sc["num_scored"] == len(sc["token_ids"]) - 1 and sc["logprobs"][0] is None
    assert sc["mean_nll"] == pytest.approx(-sum(sc["logprobs"][1:]) / sc["num_scored"])

    (res, p), = procs["idattn.results"]
    outdir = tmp_path / re.search(r"--out=(\S+)", " ".join(res)).group(1)
    md = (outdir / "results.md").read_text()
    assert p.stdout.strip().startswith(md.strip()[:200])
    row = _table_rows(md, corpus)
    assert row and row[0][4] == ", ".join(f"{ext['metrics'][f'{corpus}/ppl@{L}']:.2f} @{L} ({L / 64:g}x)"
                                          for L in (64, 160))
    # validation ppl in the results (Fig. 2 table, Interdomain column) = the trainer's number, protocol named
    fig2 = md.split("### Fig. 2")[1]
    tokens = int(json.loads(before_bytes)["details"]["tokens"])
    assert f"{trainer_val['ppl']:.2f}" in fig2 and f"{corpus}.val, {tokens:,} tokens, context 64" in fig2
    for png in ("extrapolation.png", "scaling.png", "recall.png"):
        assert (outdir / png).stat().st_size > 1000


def test_refusals_are_one_line_and_write_nothing(tmp_path):
    """Unknown input format (prepare), a held-out split that cannot be made (prepare) or is absent (trainer, at
    start), an unknown corpus (eval), a config-key typo (train): one line with the fix; nothing written."""
    env = _env()
    (tmp_path / "a.xlsx").write_text("x,y\n")
    (tmp_path / "docs").mkdir()
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(WORDS, 60)) for _ in range(4)]
    for i, t in enumerate(texts):
        (tmp_path / "docs" / f"{i}.txt").write_text(t)

    def one_line(cmd, needle):
        proc = subprocess.run([sys.executable, "-m"] + cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        err = [ln for ln in proc.stderr.splitlines() if ln.startswith(("prepare:", "eval:", "error:"))]
        assert proc.returncode == 2 and len(err) == 1 and needle in err[0], proc.stderr[-2000:]
        return err[0]

    e = one_line(["idattn.data.prepare", "--source=a.xlsx", "--out=o1", "--train_tokenizer=300"], "unknown format")
    assert "--format" in e
    e = one_line(["idattn.data.prepare", "--source=docs", "--out=o2", "--train_tokenizer=300"], "validation split")
    assert "the corpus has 4 documents" in e and "--min_val_tokens" in e
    e = one_line(["idattn.eval", "--workdir=w", "--suite=extrapolation", "--corpora=pydocs", "--random_init",
                  f"--config={REPO}/experiments/scaling.py:interdomain,tiny"], "unknown corpus 'pydocs'")
    assert "pydocs=<path>" in e
    e = one_line(["idattn.train", f"--config={REPO}/experiments/scaling.py:interdomain,tiny", "--workdir=w",
                  "--config.train.num_step=5"], "has no key 'num_step'")
    assert "did you mean 'num_steps'" in e and "\\n" not in e and "\\'" not in e
    assert sorted(os.listdir(tmp_path)) == ["a.xlsx", "docs"]
    # a key with no near match: one sentence that says where the keys are (in-process: no second subprocess)
    from idattn.configs.flags import config_flag_error
    e = config_flag_error(KeyError("'nonsense'"), ["--config.model.nonsense=3"])
    assert e == ("error: --config.model.nonsense=3: config.model has no key 'nonsense'; run with --helpfull to "
                 "list the flags, or see the config file for its keys.")

    # the trainer refuses a prepared folder without a held-out split at start, before writing the workdir
    from idattn.data import prepare
    from idattn.data.tokenizer import Tokenizer, train_sentencepiece
    from tests import train_helpers as T
    from idattn.train.trainer import TrainingError, run

    tok = Tokenizer(train_sentencepiece(texts, 300), "t")
    (tmp_path / "t.model").write_bytes(tok.model_proto)
    prepare.prepare(str(tmp_path / "docs"), str(tmp_path / "noval"), tokenizer=tok, val_fraction=0.0, num_proc=0,
                    log=lambda s: None)
    cfg = T.tiny_config(**{"data.source": "arrayrecord", "data.path": str(tmp_path / "noval"),
                           "data.tokenizer": str(tmp_path / "t.model"), "model.vocab_size": 300})
    with pytest.raises(TrainingError, match="the val split is empty.*--val_fraction > 0"):
        run(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_documented_hybrid_and_selective_commands_pass_the_config_check():
    """Issue 54 item 5: docs/own-data.md's quickstart-size hybrid (global and sliding-window) and selective commands
    cannot rot: each `python -m idattn.train` line of its section 7 is built from the experiments/ file it names,
    with its --config.* flags, and passes the trainer's config check (no training); each is the quickstart's recipe
    (data, tokenizer, context, batch, steps, validation, width) apart from the model's layers, so its numbers compare
    with the quickstart's; between them they hold a global hybrid, a sliding-window hybrid and a selective core; the
    section's results command reads every run they train."""
    from idattn.configs import apply_overrides, load_config_file
    from idattn.models import layer_specs, spec_from_config
    from idattn.train.trainer import check_config

    section = open(DOC).read().split("\n## 7. Hybrid and selective models")[1]
    cmds = [shlex.split(ln) for ln in section.splitlines() if ln.startswith("python -m idattn.train ")]
    assert len(cmds) == 3, cmds
    kinds, workdirs = set(), []
    for cmd in cmds:
        flags = dict(a[2:].split("=", 1) for a in cmd[3:])
        path, _, arg = flags.pop("config").partition(":")
        assert path.startswith("experiments/") and os.path.isfile(os.path.join(REPO, path)), path
        workdirs.append(flags.pop("workdir"))
        sets = [f"{k[len('config.'):]}={v}" for k, v in flags.items()]
        assert len(sets) == len(flags), flags  # nothing but --config.* besides --config and --workdir
        config = apply_overrides(load_config_file(os.path.join(REPO, path) + ":" + arg), sets)
        assert check_config(config).startswith("config OK"), cmd
        quick = apply_overrides(load_config_file(os.path.join(REPO, "experiments", "quickstart.py") + ":interdomain"),
                                sets)
        for key in ("data.source", "data.path", "data.tokenizer", "data.seq_len", "train.batch_size",
                    "train.num_steps", "train.peak_lr", "train.eval_batches", "model.d_model", "model.num_heads",
                    "model.head_dim", "model.num_modes", "model.ffn_dim", "model.vocab_size"):
            section_, name = key.split(".")
            assert config[section_][name] == quick[section_][name], (cmd, key)
        spec = spec_from_config(config.model)
        layers = {(s.family, s.core) for s in layer_specs(spec)}
        if ("softmax", "lti") in layers:
            kinds.add("hybrid-global")
        if ("swa", "lti") in layers:
            kinds.add("hybrid-swa")
        if spec.core == "selective" and spec.family == "interdomain":
            kinds.add("selective")
    assert kinds == {"hybrid-global", "hybrid-swa", "selective"}, kinds
    res = next(ln for ln in section.splitlines() if ln.startswith("python -m idattn.results "))
    runs = re.search(r"--runs=(\S+)", res).group(1).split(",")
    assert set(workdirs) <= set(runs) and "runs/pystdlib-interdomain" in runs, (runs, workdirs)
