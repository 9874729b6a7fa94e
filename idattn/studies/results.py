"""Render the paper's tables from run directories: `python -m idattn.results --runs=DIR [DIR ...] [--out=DIR]`.

Reads every `<run>/eval/*.json` (schema `idattn.eval/v1`, see idattn/rundir/schema.py) and prints Markdown with
the paper's numbers (idattn/eval/paper_numbers.py) beside ours:

  Table 2   length extrapolation, five-corpus average perplexity at 1x / 2x / 3.5x the train length
  Table 4   mechanism cube: best-of-run validation loss / perplexity per cube cell
  Table 6   validation CE, 8-task average, LAMBADA acc / ppl / bpb, WikiText-2 ppl / bpb
  Table 7   per-task accuracies of the eight-task suite
  Table 8   per-corpus extrapolation perplexity
  Table 9   recall: RULER S-NIAH-1 against context, phonebook against size (Based: paper only)
  Fig. 2    validation perplexity against scale
  Extrapolation per corpus   every corpus a run was evaluated on (your own corpora by the name given to
            `python -m idattn.eval --corpora=name=path`), each row on its own corpus, never averaged
and writes `results.md` plus PNG plots (extrapolation against length, validation perplexity against parameter
count, S-NIAH-1 accuracy against context; labelled axes with units, training length marked) to
`--out` (default: the current directory).

Numbers are never mixed: a run's validation perplexity is its trainer's validation (held-out split, first
eval_batches x microbatch x seq_len tokens at the training context; `idattn.rundir.schema`), or, for a run with no
trainer file, the eval CLI's. Table 4, Fig. 2 and the scaling plot have one row / line per validation protocol
(corpus, token count, context), so no row sets two protocols side by side; Table 6 (split by corpus) lists what
each validation number was measured on and marks † one measured on another token count or context. Table 2's "five-corpus mean" is filled only from runs evaluated on all five
paper corpora; any other corpus appears, named, in the per-corpus table.

Which run fills a column: a run's identity is its result files' `run` record (mixer, size, ...) and the corpus
its validation was measured on; the mixer is canonicalised (`interdomain` = `dualkv-query-rope`, `s4d_only` =
`generic-linear-norope`; a core suffix is kept: `interdomain-selective` = `dualkv-query-rope-selective`). Every run
given appears, with its numbers in every table it has numbers for, whatever the order of `--runs` (runs are sorted
by mixer, size, corpus, folder): the header describes each (mixer or layer pattern, core, size, corpus); a model
outside the paper's three (hybrid, selective core, cube cell) gets its own column or row, named by its mixer or
layer pattern and core (`family_label`), in Tables 2, 4 (below the cube), 6, 7, 8, 9 and Fig. 2; the validation tables (Table 4, Fig. 2) and `scaling.png` have one row / line per
validation protocol, labelled with it. For the 1.3B tables each mixer's column takes its largest run (1.3b if present) and
the header names the size, so small runs still render. When several runs compete for one cell the latest step
wins, then the corpus and folder names, and the section "Which run fills a cell" says which was chosen over
which. Validation loss is best-of-run (the minimum over all validation files, as the paper reports);
every other suite takes the latest step (extrapolation: the latest of each protocol, the paper's and rolling
windows, each its own row in the per-corpus table; Tables 2 and 8 read the paper's). Plot legends sit beside the axes.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys
from typing import Any

from idattn import atomic
from idattn.configs.sizes import NOMINAL_PARAMS, SIZE_ORDER, size_label
from idattn.eval import paper_numbers as P
from idattn.eval.evaluate import corpus_label
from idattn.eval.figures import save_figure, subplots
from idattn.eval.markdown import markdown_table
from idattn.eval.perplexity import FIVE_CORPORA
from idattn.models.spec import ATTENTION_FAMILIES, mixer_core, model_label, parse_mixer
from idattn.rundir.layout import load_config
from idattn.rundir.schema import protocol_of, read_results

CANON = {"interdomain": "dualkv-query-rope", "s4d_only": "generic-linear-norope"}
FAMILY = {v: k for k, v in CANON.items()}


def canonical_mixer(name: str) -> str:
    """The cube-cell name of a mixer, its core suffix kept: interdomain-selective = dualkv-query-rope-selective."""
    base, core = mixer_core(name)
    c = CANON.get(base, base)
    return c if core == "lti" else f"{c}-{core}"


def mixer_family(name: str) -> str:
    """softmax | interdomain | s4d_only for the three headline mixers, else the cube cell name (with its core
    suffix: interdomain-selective), or a hybrid's label (hybrid[...])."""
    base, core = mixer_core(canonical_mixer(name))
    fam = "softmax" if base == "softmax" else FAMILY.get(base, base)
    return fam if core == "lti" else f"{fam}-{core}"


def core_text(mixer: str) -> str:
    """The recurrence cores (lti | selective | selective+phase) of a model's recurrent layers, of every entry of a
    hybrid's layer pattern, as tables name them ("lti core", "lti/selective core"); "" for attention or no mixer."""
    m = str(mixer)
    entries = m[len("hybrid["):-1].split(",") if m.startswith("hybrid[") and m.endswith("]") else [m]
    cores = []
    for e in entries:
        name = e.split("@")[0].strip()  # swa@<window>
        try:
            if parse_mixer(name)[0] in ATTENTION_FAMILIES:
                continue
        except ValueError:
            continue
        cores.append(mixer_core(name)[1])
    return f"{'/'.join(dict.fromkeys(cores))} core" if cores else ""


def family_label(fam: str) -> str:
    """What a table calls a model: the paper's name for the three headline mixers; any other model by its mixer
    or layer pattern and core, e.g. "hybrid[interdomain,swa@64] (lti core)", "interdomain-selective (selective
    core)"."""
    if fam in P.MIXER_LABEL:
        return P.MIXER_LABEL[fam]
    core = core_text(fam)
    return f"{fam} ({core})" if core else fam


class Run:
    """The results of one run directory, flattened to `<suite>/<metric>` (latest step; validation best-of-run)."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        recs = read_results(workdir)
        if not recs:
            raise FileNotFoundError(f"--runs: {workdir} has no eval/*.json result files (python -m idattn.eval "
                                    f"--workdir={workdir} --suite=... writes them).")
        ident: dict[str, Any] = {}
        for r in recs:
            ident.update({k: v for k, v in r.get("run", {}).items() if v not in (None, "")})
        try:  # the run's saved config (written by the trainer); none in a folder of result files written by hand
            cfg = load_config(workdir)
        except Exception:
            cfg = None
        self.cfg = cfg
        if cfg is not None and ("size" not in ident or "seq_len" not in ident):
            # the trainer's validation records no size / seq_len: take them from the config
            ident.setdefault("size", size_label(cfg.model))
            ident.setdefault("seq_len", int(cfg.data.seq_len))
            ident.setdefault("mixer", model_label(cfg.model))
        self.mixer = canonical_mixer(str(ident.get("mixer", os.path.basename(os.path.normpath(workdir)))))
        self.size = str(ident.get("size", "?")).lower()
        self.ident = ident
        self.metrics: dict[str, float] = {}
        self.details: dict[str, Any] = {}
        self.protocols: dict[str, dict] = {}
        latest: dict[str, dict] = {}
        for r in recs:
            if r["suite"] == "validation":
                continue
            # the paper protocol's extrapolation and a rolling one are two results (`extrapolation` and
            # `extrapolation-rolling`): the latest of one never hides the other
            key = extrap_suite(protocol_of(r).get("mode")) if r["suite"] == "extrapolation" else r["suite"]
            if key not in latest or (r["step"], r.get("time", 0)) >= (latest[key]["step"],
                                                                     latest[key].get("time", 0)):
                latest[key] = r
        for suite, r in latest.items():
            m = dict(r["metrics"])
            if suite == "extrapolation" and not any("/" in k for k in m):
                # an old-style file: a headline ppl@L with no per-corpus numbers is not a five-corpus mean
                name = protocol_of(r).get("corpus") or ("kjv.val" if r.get("details", {}).get("eval_tokens")
                                                        else "unnamed corpus")
                m = {f"{name}/{k}": v for k, v in m.items()}
            self.metrics.update({f"{suite}/{k}": v for k, v in m.items()})
            self.details[suite] = r.get("details", {})
            self.details[suite + "/run"] = r.get("run", {})
            self.protocols[suite] = protocol_of(r)
        # validation: the trainer's files (one protocol) when there are any, else the eval CLI's of one protocol
        vals = [r for r in recs if r["suite"] == "validation" and "loss" in r["metrics"]]
        trainer = [r for r in vals if not r["tagged"]]
        if not trainer and vals:
            last = max(vals, key=lambda r: (r["step"], r.get("time", 0)))
            trainer = [r for r in vals if protocol_key(protocol_of(r)) == protocol_key(protocol_of(last))]
        if trainer:
            best = min(trainer, key=lambda r: r["metrics"]["loss"])
            final = max(trainer, key=lambda r: (r["step"], r.get("time", 0)))
            self.metrics["validation/loss"] = best["metrics"]["loss"]
            self.metrics["validation/ppl"] = math.exp(best["metrics"]["loss"])
            self.metrics["validation/final_loss"] = final["metrics"]["loss"]
            self.protocols["validation"] = protocol_of(best)
            if not best["tagged"] and "corpus" not in best.get("details", {}) and cfg is not None:
                self.protocols["validation"]["corpus"] = corpus_label(cfg.data)
            if cfg is not None and "tokenizer" not in self.protocols["validation"]:  # the run's own vocabulary
                self.protocols["validation"]["tokenizer"] = str(cfg.data.tokenizer)
        self.step = max(int(r["step"]) for r in recs)
        self.corpus = self._corpus()

    def _corpus(self) -> str:
        """The corpus the run's validation numbers were measured on (its trainer's held-out split), else the
        saved config's held-out split, else "unknown corpus": what labels the run in every validation table."""
        c = (self.protocols.get("validation") or {}).get("corpus")
        if c:
            return str(c)
        return "unknown corpus" if self.cfg is None else corpus_label(self.cfg.data)

    def sort_key(self) -> tuple:
        """Runs are rendered in this order whatever the order of `--runs`: mixer, size, corpus, folder."""
        return (self.family, _size_rank(self.size), self.size, self.corpus, os.path.normpath(self.workdir))

    def params(self) -> int | None:
        p = self.ident.get("params")
        return int(p) if isinstance(p, (int, float)) and p > 0 else None

    def describe(self) -> str:
        """Mixer or layer pattern, the core of its recurrent layers (none for attention alone), size and validation
        corpus: what the run is, for the tables' header."""
        core = core_text(self.mixer)
        return f"{self.mixer}{', ' + core if core else ''}, {self.size}, validated on {self.corpus}"

    def label(self) -> str:
        """A row's name for the run: e.g. "hybrid[interdomain,softmax] (lti core, d128l2)"."""
        core = core_text(self.mixer)
        return f"{self.mixer} ({core + ', ' if core else ''}{self.size})"

    def extrap_series(self) -> list[tuple[str, str]]:
        """(suite, corpus) of every per-corpus extrapolation result: the paper's protocol first, then any other of
        the run (rolling windows), each its own series."""
        suites = ["extrapolation"] + sorted(k for k in self.protocols if k.startswith("extrapolation-"))
        return [(s, c) for s in suites for c in self.extrap_corpora(s)]

    def extrap_corpora(self, suite: str = "extrapolation") -> list[str]:
        """Corpora with per-corpus extrapolation numbers of `suite` (extrapolation: the paper's protocol;
        extrapolation-rolling: rolling windows), in first-seen order."""
        return list(dict.fromkeys(k.split("/")[1] for k in self.metrics
                                  if k.startswith(suite + "/") and k.count("/") == 2))

    def five_corpus_mean(self) -> bool:
        """True when the headline extrapolation/ppl@L is the paper's five-corpus mean (all five measured)."""
        return all(c in self.extrap_corpora() for c in FIVE_CORPORA) and any(
            k.startswith("extrapolation/ppl@") for k in self.metrics)

    @property
    def family(self) -> str:
        return mixer_family(self.mixer)

    def seq_len(self) -> int | None:
        """The run's training context (run record, the quickstart's `train_seq_len` detail, or its config)."""
        if self.ident.get("seq_len"):
            return int(self.ident["seq_len"])
        for v in self.details.values():
            if isinstance(v, dict) and v.get("train_seq_len"):
                return int(v["train_seq_len"])
        return None

    def __repr__(self) -> str:
        return f"Run({self.workdir!r}, {self.mixer}, {self.size}, {self.corpus})"


def extrap_suite(mode: str | None) -> str:
    """Where a run keeps an extrapolation result of protocol mode `mode`: `extrapolation` for the paper's (first L
    tokens of each document), `extrapolation-<mode>` for another (rolling windows)."""
    return "extrapolation" if mode in (None, "", "docs") else f"extrapolation-{mode}"


def families(runs: list[Run], need: str | None = None) -> list[str]:
    """The three headline mixers, then every other model (family) among `runs` with a metric of prefix `need`, in
    the runs' order: the rows or columns of a table, so that every run given has its numbers shown."""
    extra = dict.fromkeys(r.family for r in sorted(runs, key=Run.sort_key)
                          if need is None or any(k.startswith(need) for k in r.metrics))
    return list(P.MIXERS) + [f for f in extra if f not in P.MIXERS]


def protocol_key(p: dict | None) -> tuple:
    """What makes two numbers comparable: corpus, token count, context, the tokenizer (per-token perplexities of
    two vocabularies do not compare) and any training-document overlap."""
    p = p or {}
    return (str(p.get("corpus")), p.get("tokens"), str(p.get("context")), str(p.get("train_overlap") or ""),
            str(p.get("tokenizer") or ""))


def protocol_text(p: dict | None) -> str:
    p = p or {}
    parts = [str(p["corpus"])] if p.get("corpus") else []
    if p.get("tokens"):
        parts.append(f"{int(p['tokens']):,} tokens")
    if p.get("context"):
        c = p["context"]
        parts.append("context " + ("/".join(map(str, c)) if isinstance(c, (list, tuple)) else str(c)))
    if p.get("tokenizer"):
        tok = str(p["tokenizer"])
        parts.append("tokenizer " + ("/".join(tok.split("/")[-2:]) if "/" in tok else tok))
    if p.get("train_overlap"):  # scored with --allow_train_overlap: some documents were trained on
        parts.append(f"train overlap {p['train_overlap']} documents")
    return ", ".join(parts) or "unknown protocol"


def _size_rank(s: str) -> int:
    return SIZE_ORDER.index(s) if s in SIZE_ORDER else -1


def pick(runs: list[Run], family: str, *, size: str | None = None, need: str | None = None,
         exact: bool = False, corpus: str | None = None, protocol: tuple | None = None,
         why: list[str] | None = None) -> Run | None:
    """The run of a mixer family (at `size`, else - unless `exact` - the largest; on `corpus` when given; with
    the validation protocol `protocol`, a protocol_key, when given) that has metric prefix `need`. When several runs compete for the cell, the rule is the same whatever the order of
    `--runs`: the latest step (the most trained), then the corpus and folder names; the choice is appended to `why`."""
    cands = [r for r in runs if r.family == family and (need is None or any(k.startswith(need) for k in r.metrics))]
    if corpus is not None:
        cands = [r for r in cands if r.corpus == corpus]
    if protocol is not None:
        cands = [r for r in cands if protocol_key(r.protocols.get("validation")) == protocol]
    if size is not None:
        at = [r for r in cands if r.size == size]
        cands = at if (at or exact) else cands
    if not cands:
        return None
    top = max(_size_rank(r.size) for r in cands)
    tied = sorted((r for r in cands if _size_rank(r.size) == top), key=lambda r: (-r.step, r.sort_key()))
    chosen = tied[0]
    if why is not None and len(tied) > 1:
        others = ", ".join(f"`{r.workdir}` ({r.corpus}, step {r.step})" for r in tied[1:])
        why.append(f"{family_label(family)} {chosen.size}" + (f" on {corpus}" if corpus else "") +
                   (f" ({need.rstrip('/@')})" if need else "") + f": `{chosen.workdir}` ({chosen.corpus}, step "
                   f"{chosen.step}) chosen over {others}: the latest step, then the corpus and folder names")
    return chosen


def fmt(v: float | None, digits: int = 2, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v * 100 if pct else v:.{digits}f}"


def _extrap_lengths(run: Run, prefix: str = "extrapolation/ppl@") -> list[int]:
    return sorted({int(k.split("@")[1]) for k in run.metrics if k.startswith(prefix)})


def _ratio_value(run: Run, ratio: float, key_prefix: str) -> float | None:
    """Our metric at the length closest to ratio x train length (exact match on `seq_len` when known)."""
    lengths = _extrap_lengths(run, key_prefix)
    if not lengths:
        return None
    base = run.seq_len() or lengths[0]
    target = ratio * base
    best = min(lengths, key=lambda L: abs(L - target))
    return run.metrics.get(f"{key_prefix}{best}") if abs(best - target) <= 0.15 * target else None


EXTRAP_HEADER = [f"paper {x}" for x in P.EXTRAP_LABELS] + [f"ours {r:g}x" for r in P.EXTRAP_RATIOS]


def _extrap_rows(runs: list[Run], prefix: str, paper: dict, why) -> list[tuple[list[str], Run | None]]:
    """Tables 2 and 8: per model measured (the paper's three first) its name, the paper's perplexities and ours at
    each ratio of the training length (metric `prefix`<L>), with the run they come from."""
    out = []
    for fam in families(runs, prefix):
        r = pick(runs, fam, need=prefix, why=why)
        out.append(([family_label(fam)] + [fmt(v) for v in paper.get(fam, (None,) * len(P.EXTRAP_RATIOS))]
                    + [fmt(_ratio_value(r, x, prefix)) if r else "—" for x in P.EXTRAP_RATIOS], r))
    return out


def table2(runs: list[Run], why: list[str] | None = None) -> str:
    five = [r for r in runs if r.five_corpus_mean()]
    rows = [row + [r.size if r else "—"] for row, r in _extrap_rows(five, "extrapolation/ppl@", P.TABLE2, why)]
    others = sorted({c for r in runs for c in r.extrap_corpora()} - set(FIVE_CORPORA))
    note = ("\n\n'ours' is filled only from runs evaluated on all five corpora (PG19, CodeParrot, GovReport, "
            "Qasper, QMSum), the paper's mean." + (f" Other corpora ({', '.join(others)}) are never averaged in: "
                                                   "see the per-corpus table." if others else ""))
    return ("### Table 2: length extrapolation (five-corpus mean perplexity; paper: 1.3B trained at 4K)\n\n" +
            markdown_table(["mixer"] + EXTRAP_HEADER + ["ours run"], rows) + note)


def table_corpora(runs: list[Run]) -> str:
    """Every (run, corpus) measured, each on its own row, at the lengths it was measured (no averaging)."""
    rows = []
    for r in runs:
        rows += [[c, r.label()] + _corpus_cells(r, suite, c) for suite, c in r.extrap_series()]
    if not rows:
        return "### Length extrapolation per corpus (ours)\n\nno extrapolation results."
    return ("### Length extrapolation per corpus (ours; perplexity per token at each context length L, each row "
            "on its own corpus, never averaged)\n\n" +
            markdown_table(["corpus", "run", "train length", "measured on", "ppl @ L (x train length)"], rows))


def _corpus_cells(r: Run, suite: str, c: str) -> list[str]:
    """The per-corpus table's train length, "measured on" and values of run `r`'s `suite` result on corpus `c`."""
    Ls = _extrap_lengths(r, f"{suite}/{c}/ppl@")
    base = r.seq_len()
    vals = ", ".join(f"{r.metrics[f'{suite}/{c}/ppl@{L}']:.2f} @{L}" + (f" ({L / base:g}x)" if base else "")
                     for L in Ls)
    corpus = (r.details.get(suite, {}).get("corpora", {}).get(c, {}) or {})
    docs = corpus.get("docs")
    proto = r.protocols.get(suite) or {}
    tokens = proto.get("tokens")
    scored = corpus.get(str(Ls[-1]), {}) or {}
    on = (f"{docs} docs whole, {int(scored.get('tokens', 0)):,} tokens, disjoint windows of L (rolling)"
          if proto.get("mode") == "rolling" else
          f"first {int(tokens):,} tokens, rows of L" if tokens else
          f"{docs} docs, first L tokens of each" if docs is not None else "?")
    return [str(base or "?"), on, vals]


def table8(runs: list[Run], why: list[str] | None = None) -> str:
    rows = [[corpus] + row for corpus, per in P.TABLE8.items()
            for row, _ in _extrap_rows(runs, f"extrapolation/{corpus}/ppl@", per, why)]
    return "### Table 8: per-corpus extrapolation perplexity (NarrativeQA outside the Table 2 mean)\n\n" + \
        markdown_table(["corpus", "mixer"] + EXTRAP_HEADER, rows)


def _protocol_notes(runs: list[Run], shown: list[Run]) -> tuple[dict[int, str], str]:
    """Marks (†) for runs whose validation protocol differs from the most common one among `shown`, and a
    'measured on' note listing each protocol."""
    shown = [r for r in shown if r is not None and "validation" in r.protocols]
    if not shown:
        return {}, ""
    keys = [protocol_key(r.protocols["validation"]) for r in shown]
    common = max(sorted(set(keys), key=str), key=keys.count)  # ties: the same choice in any order
    marks = {id(r): ("" if protocol_key(r.protocols["validation"]) == common else "†") for r in shown}
    seen, lines = set(), []
    for r in shown:
        t = protocol_text(r.protocols["validation"])
        if (r.workdir, t) not in seen:
            seen.add((r.workdir, t))
            lines.append(f"{marks[id(r)]}{r.mixer} ({r.size}, `{r.workdir}`): {t}")
    note = "\n\nValidation measured on: " + "; ".join(lines)
    if any(marks.values()):
        note += ". † measured on another corpus / token count / context than the unmarked values: not comparable."
    return marks, note


def _validation_protocols(runs: list[Run]) -> dict[tuple, str]:
    """The distinct validation protocols (protocol_key) of `runs`, in a fixed order, each with its protocol_text."""
    texts = {protocol_key(r.protocols.get("validation")): protocol_text(r.protocols.get("validation")) for r in runs}
    return dict(sorted(texts.items(), key=lambda kv: str(kv[0])))


def table4(runs: list[Run], why: list[str] | None = None) -> str:
    header = ["cell", "description", "paper loss", "paper ppl", "ours on", "ours loss", "ours ppl", "ours vs softmax",
              "ours run"]
    rows = []
    # one size for the whole cube (125M when measured there, else the size with the most cells measured), so
    # that "vs softmax" never compares across sizes; one row per validation protocol measured (corpus, token
    # count, context), "vs softmax" within it: a row never sets numbers of two protocols side by side
    sizes = [r.size for r in runs if "validation/loss" in r.metrics]
    size = "125m" if "125m" in sizes else max(sorted(set(sizes)), key=lambda s: (sizes.count(s), _size_rank(s)),
                                              default=None)
    measured = [r for r in runs if r.size == size and "validation/loss" in r.metrics]
    protocols = text = _validation_protocols(measured)
    cube = [(mixer_family(cell), cell, desc, loss, ppl) for cell, desc, loss, ppl in P.TABLE4]
    # every other model of ours at this size (a selective core, a hybrid stack, ...) below the cube, paper "—"
    others = [(f, family_label(f), _not_in_cube(f), None, None) for f in families(measured)
              if f not in {c[0] for c in cube}]
    for fam, cell, desc, loss, ppl in cube + others:
        got = [(pk, pick(runs, fam, size=size, need="validation/loss", exact=True, protocol=pk,
                         why=why)) for pk in protocols]
        got = [(pk, r) for pk, r in got if r] or [(None, None)]
        for pk, r in got:
            soft = pick(runs, "softmax", size=size, need="validation/loss", exact=True, protocol=pk) if r else None
            ol = r.metrics["validation/loss"] if r else None
            rel = (f"{(math.exp(ol) / math.exp(soft.metrics['validation/loss']) - 1) * 100:+.2f}%"
                   if r and soft and cell != "softmax" else "—")
            rows.append([cell, desc, fmt(loss, 4), fmt(ppl), text[pk] if r else "—", fmt(ol, 4),
                         fmt(math.exp(ol) if ol is not None else None), rel, r.size if r else "—"])
    note = ""
    if len(protocols) > 1:
        note = (f"\n\nOur cube runs were validated under {len(protocols)} protocols (corpus, token count, context): "
                "one row per cell and protocol; 'vs softmax' only against the softmax run of the same protocol.")
    return ("### Table 4: mechanism cube (best-of-run validation; paper: 125M / 2.5B tokens; ours: one row per "
            "validation protocol measured, 'vs softmax' against the softmax run of the same protocol)\n\n" +
            markdown_table(header, rows) + note)


def _not_in_cube(fam: str) -> str:
    """Table 4's description of a model of ours outside the paper's cube."""
    if fam.startswith("hybrid["):
        return "hybrid stack (this layer pattern repeated to the depth); not in the paper"
    base, core = mixer_core(canonical_mixer(fam))
    if core != "lti":
        return f"{base} with the {core} core (per-token Δ_t{', θ_t' if 'phase' in core else ''}); not in the paper"
    return "not in the paper's cube"


def _paper_vs_ours(title: str, spec, runs: list[Run], need: str | None, why: list[str] | None,
                   corpus: str | None) -> str:
    """Paper columns beside ours, every 'ours' value of the table from runs validated on one corpus (`corpus`;
    None when the runs have one corpus between them); `need`: the suite of the table's metrics."""
    fams = families([r for r in runs if corpus is None or r.corpus == corpus], need)  # + every other model
    picked = {fam: pick(runs, fam, size="1.3b", need=need, corpus=corpus) for fam in fams}
    header = ["metric"] + [f"{P.MIXER_LABEL[f]} paper" for f in P.MIXERS] + [
        f"{family_label(f)} ours" + (f" ({picked[f].size})" if picked[f] else "") for f in fams]
    rows = []
    for key, label, paper in spec:
        pct = key.split("/")[-1] in ("acc", "acc_norm")
        digits = 4 if ("bpb" in key or "bits" in key or "loss" in key) else 2
        ours = []
        for f in fams:
            r = pick(runs, f, size="1.3b", need=key, corpus=corpus, why=why) or picked[f]
            ours.append(fmt(r.metrics.get(key) if r else None, digits, pct=pct))
        rows.append([label] + [fmt(paper[f], digits) for f in P.MIXERS] + ours)
    return f"### {title}\n\n" + markdown_table(header, rows)


def _split_by_corpus(title: str, spec, runs: list[Run], why, note_fn=None) -> str:
    """One table when the runs share a validation corpus; else one table per corpus, titled with it, so that no
    row sets a run of one corpus beside a run of another ("the latest step" never chooses between corpora)."""
    need = spec[0][0].split("/")[0] if spec else None  # the validation corpora of the runs with the table's metrics
    corpora = sorted({r.corpus for r in runs if need is None or any(k.startswith(need) for k in r.metrics)})
    groups = [None] if len(corpora) <= 1 else corpora
    out = []
    for c in groups:
        t = title if c is None else f"{title}: ours validated on {c}"
        out.append(_paper_vs_ours(t, spec, runs, need, why, c) + (note_fn(c) if note_fn else ""))
    if len(groups) > 1:
        out.append(f"Our runs were validated on {len(groups)} corpora ({', '.join(corpora)}): one table per corpus; "
                   "numbers of different corpora are never set side by side.")
    return "\n\n".join(out)


def table6(runs: list[Run], why: list[str] | None = None) -> str:
    def note(corpus):
        return _protocol_notes(runs, [pick(runs, f, size="1.3b", need="validation/loss", corpus=corpus)
                                      for f in families(runs, "validation/loss")])[1]
    return _split_by_corpus("Table 6: validation and downstream (paper: 1.3B / 26B tokens)", P.TABLE6, runs, why,
                            note_fn=note)


def table7(runs: list[Run], why: list[str] | None = None) -> str:
    return _split_by_corpus("Table 7: eight-task commonsense suite, accuracy % (paper: 1.3B)", P.TABLE7, runs, why)


def table9(runs: list[Run], why: list[str] | None = None) -> str:
    header = ["task", "mixer"] + [f"paper {x}" for x in P.NIAH_LENGTHS] + [f"ours {x}" for x in P.NIAH_LENGTHS] + ["ours run"]
    rows = []
    for task, name, xs, paper in (("niah", "S-NIAH-1", P.NIAH_LENGTHS, P.TABLE9_NIAH),
                                  ("phonebook", f"Phonebook ({'/'.join(map(str, P.PHONEBOOK_SIZES))} entries)",
                                   P.PHONEBOOK_SIZES, P.TABLE9_PHONEBOOK)):
        for fam in families(runs, f"recall/{task}@"):  # the paper's three, then every other model measured
            r = pick(runs, fam, size="1.3b", need=f"recall/{task}@", why=why)
            ours = [fmt(r.metrics.get(f"recall/{task}@{x}/acc") if r else None, 2, pct=True) for x in xs]
            rows.append([name, family_label(fam)] + [fmt(v) for v in paper.get(fam, (None,) * len(xs))] + ours
                        + [r.size if r else "—"])
    based = markdown_table(["mixer"] + list(P.BASED_TASKS),
                   [[P.MIXER_LABEL[f]] + [fmt(v) for v in P.TABLE9_BASED[f]] for f in P.MIXERS])
    mqar = [r for r in runs if any(k.startswith("recall/mqar@") for k in r.metrics)]
    extra = ""
    if mqar:
        keys = sorted({k for r in mqar for k in r.metrics if k.startswith("recall/mqar@")})
        extra = "\n\nMQAR (ours; query accuracy %)\n\n" + markdown_table(
            ["run"] + [k[len("recall/"):] for k in keys],
            [[r.label()] + [fmt(r.metrics.get(k), 2, pct=True) for k in keys] for r in mqar])
    return ("### Table 9: recall, accuracy % (paper: 1.3B; columns are context tokens for S-NIAH-1, entries for "
            "the phonebook)\n\n" + markdown_table(header, rows) + "\n\nBased recall suite (paper only; not run here)\n\n" +
            based + extra)


def fig2_table(runs: list[Run], why: list[str] | None = None) -> str:
    shown = [r for r in runs if "validation/ppl" in r.metrics]
    fams = families(shown)  # the paper's three, then a column for every other model of ours
    header = (["size", "ours on"] + [f"{P.MIXER_LABEL[f]} paper" for f in P.MIXERS] +
              [f"{family_label(f)} ours" for f in fams])
    rows = []
    sizes = list(P.VAL_PPL) + sorted({r.size for r in runs} - set(P.VAL_PPL), key=lambda s: (_size_rank(s), s))
    for s in sizes:
        paper = P.VAL_PPL.get(s, {})
        approx = "≈" if s in P.APPROX_FIG2 else ""
        # one row per validation protocol measured at this size (corpus, token count, context): a row's three
        # values are always of one protocol
        text = _validation_protocols([r for r in shown if r.size == s])
        for pk in text or [None]:
            ours = []
            for f in fams:
                r = pick(shown, f, size=s, exact=True, protocol=pk, why=why) if pk else None
                ours.append(fmt(r.metrics["validation/ppl"] if r else None))
            rows.append([s, text[pk] if pk else "—"] +
                        [approx + fmt(paper.get(f)) if f in paper else "—" for f in P.MIXERS] + ours)
    return ("### Fig. 2: best-of-run validation perplexity against scale (ours: one row per size and validation "
            "protocol)\n\n" + markdown_table(header, rows))


PAPER_TRAIN_LEN = 4096


def _finish(fig, ax, path: str, xlabel: str, ylabel: str, title: str, **scales) -> str:
    """Labels the axes (`scales`: xscale, yscale) and writes the figure, its legend beside the axes, right of them,
    so that it never covers a point or an axis label; the figure is widened by the legend (the axes keep their size)."""
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title, **scales)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        legend = ax.legend(handles, labels, fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                           borderaxespad=0.0, ncol=1 + (len(labels) - 1) // 24)
        fig.canvas.draw()
        fig.set_size_inches(fig.get_figwidth() + legend.get_window_extent().width / fig.dpi + 0.3,
                            fig.get_figheight())
    return save_figure(fig, path, dpi=110, bbox_inches="tight")


def plot_extrapolation(runs: list[Run], path: str) -> str | None:
    """Five-corpus mean perplexity against context length / training length (paper dashed, ours solid), plus
    every other corpus of ours as its own dotted line named by its corpus; the training length is x = 1."""
    fig, ax = subplots(figsize=(6.5, 4))
    drawn = False
    five = [r for r in runs if r.five_corpus_mean()]
    fams = families(five, "extrapolation/ppl@")
    for i, fam in enumerate(fams):
        if fam in P.TABLE2:
            ax.plot(P.EXTRAP_RATIOS, P.TABLE2[fam], ls="--", marker="x", color=f"C{i % 10}",
                    label=f"{P.MIXER_LABEL[fam]} paper 1.3B (five-corpus mean)")
        r = pick(five, fam, need="extrapolation/ppl@")
        if r:
            Ls = _extrap_lengths(r)
            base = r.seq_len() or Ls[0]
            ax.plot([L / base for L in Ls], [r.metrics[f"extrapolation/ppl@{L}"] for L in Ls], marker="o",
                    color=f"C{i % 10}", label=f"{family_label(fam)} ours {r.size} (five-corpus mean)")
            drawn = True
    k = len(fams)
    for r in runs:
        for suite, c in r.extrap_series():
            if suite == "extrapolation" and r in five and c in FIVE_CORPORA:
                continue
            Ls = _extrap_lengths(r, f"{suite}/{c}/ppl@")
            base = r.seq_len() or Ls[0]
            mode = "" if suite == "extrapolation" else f" ({suite.split('-', 1)[1]})"
            ax.plot([L / base for L in Ls], [r.metrics[f"{suite}/{c}/ppl@{L}"] for L in Ls], marker="o",
                    ls=":", color=f"C{k % 10}", label=f"{r.label()} ours on {c}{mode}")
            k += 1
            drawn = True
    ax.axvline(1.0, color="k", lw=0.8, ls=":")
    ax.text(1.0, 0.98, " training length", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
    ax.set_yscale("log")
    return _finish(fig, ax, path, "context length / training length (ratio; paper: 4K tokens = 1)",
                   "perplexity (per token, log scale)", "Length extrapolation" + ("" if drawn else " (paper only)"))


def scaling_series(runs: list[Run]) -> list[tuple[str, str, list[tuple[int, float]]]]:
    """Our points of the scaling plot: one series per (mixer family, validation protocol: corpus, token count,
    context), never a line joining two protocols; each (family, label naming the protocol, [(params, best-of-run
    ppl)]), in a fixed order."""
    shown = sorted((r for r in runs if "validation/ppl" in r.metrics and r.params()), key=Run.sort_key)
    out = []
    for fam in families(shown):
        mine = [r for r in shown if r.family == fam]
        for pk in _validation_protocols(mine):
            rs = [r for r in mine if protocol_key(r.protocols.get("validation")) == pk]
            pts = sorted((r.params(), r.metrics["validation/ppl"]) for r in rs)
            out.append((fam, f"{family_label(fam)} ours ({protocol_text(rs[0].protocols['validation'])})",
                        pts))
    return out


def plot_scaling(runs: list[Run], path: str) -> str:
    """Best-of-run validation perplexity against parameter count (log-log): the paper's sizes at their nominal
    counts, and every run of ours, of any size, at its own count, one line per mixer and validation protocol (its
    label names the protocol: lines of two protocols are never joined)."""
    fig, ax = subplots(figsize=(6.5, 4))
    xs = list(P.VAL_PPL)
    for i, fam in enumerate(P.MIXERS):
        ax.plot([NOMINAL_PARAMS[s] for s in xs], [P.VAL_PPL[s][fam] for s in xs], ls="--", marker="x", color=f"C{i}",
                label=f"{P.MIXER_LABEL[fam]} paper (FineWeb-Edu val)")
    series = scaling_series(runs)
    families = list(dict.fromkeys(f for f, _, _ in series))
    styles = ("-", "-.", ":", (0, (5, 1)))
    seen: dict[str, int] = {}
    for fam, label, pts in series:
        k = seen.get(fam, 0)
        seen[fam] = k + 1
        i = list(P.MIXERS).index(fam) if fam in P.MIXERS else len(P.MIXERS) + families.index(fam)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="os^D"[k % 4], ls=styles[k % 4],
                color=f"C{i % 10}", label=label)
    return _finish(fig, ax, path, "parameters (count, log scale)", "validation perplexity (per token, log scale)",
                   "Validation perplexity against scale (Fig. 2)", xscale="log", yscale="log")


def plot_recall(runs: list[Run], path: str) -> str:
    """S-NIAH-1 accuracy against context length: paper (dashed) and ours (solid) per mixer; training lengths
    marked (paper 4K, ours per run)."""
    fig, ax = subplots(figsize=(6, 4))
    ax.axvline(PAPER_TRAIN_LEN, color="k", lw=0.8, ls=":", label=f"paper training length {PAPER_TRAIN_LEN}")
    for i, fam in enumerate(families(runs, "recall/niah@")):  # the paper's three, then every other model
        if fam in P.TABLE9_NIAH:
            ax.plot(P.NIAH_LENGTHS, P.TABLE9_NIAH[fam], ls="--", marker="x", color=f"C{i % 10}",
                    label=f"{P.MIXER_LABEL[fam]} paper 1.3B")
        r = pick(runs, fam, size="1.3b", need="recall/niah@")
        if r:
            Ls = sorted(int(k.split("@")[1].split("/")[0]) for k in r.metrics if k.startswith("recall/niah@"))
            ax.plot(Ls, [100 * r.metrics[f"recall/niah@{L}/acc"] for L in Ls], marker="o", color=f"C{i % 10}",
                    label=f"{family_label(fam)} ours {r.size}")
            if r.seq_len():
                ax.axvline(r.seq_len(), color=f"C{i % 10}", lw=0.8, ls=":",
                           label=f"{family_label(fam)} ours training length {r.seq_len()}")
    ax.set_xscale("log", base=2)
    return _finish(fig, ax, path, "context length (tokens)", "S-NIAH-1 accuracy (%)",
                   "Recall against context length (Table 9)")


def render(runs: list[Run]) -> str:
    runs = sorted(runs, key=Run.sort_key)  # the same tables whatever the order of --runs
    why: list[str] = []
    parts = ["# idattn results against the paper (arXiv 2605.24330)", "",
             "Runs: " + ", ".join(f"`{r.workdir}` ({r.describe()})" for r in runs), "",
             "Accuracies in %, perplexities per token (WikiText-2: per word). '—': not measured.", ""]
    for fn in (table2, table_corpora, table4, table6, table7, table8, table9, fig2_table):
        parts += [fn(runs, why) if fn is not table_corpora else fn(runs), ""]
    if why:
        parts += ["### Which run fills a cell (several runs of one mixer and size)", "",
                  "\n".join(f"- {w}" for w in dict.fromkeys(why)), ""]
    return "\n".join(parts)


def expand_runs(items: list[str]) -> list[str]:
    """--runs: comma- or space-separated folders, each glob expanded (sorted), a pattern matching none kept as is."""
    out = []
    for part in (p.strip() for it in items for p in it.split(",")):
        if part:
            out += sorted(glob.glob(part)) or [part]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m idattn.results", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", required=True, help="run directories (comma/space separated, globs ok)")
    ap.add_argument("--out", default=".", help="folder for results.md and the PNG plots")
    a = ap.parse_args(argv)
    dirs = expand_runs(a.runs)
    missing = [d for d in dirs if not os.path.isdir(d)]
    if missing:
        ap.error(f"--runs: not a directory: {missing}")
    runs = sorted((Run(d) for d in dirs), key=Run.sort_key)
    md = render(runs)
    try:
        os.makedirs(a.out, exist_ok=True)
        # the table and its plots are replaced together or not at all: they always describe the same runs
        with atomic.Staged() as out:
            with open(out.path(os.path.join(a.out, "results.md")), "w") as f:
                f.write(md)
            plot_extrapolation(runs, out.path(os.path.join(a.out, "extrapolation.png")))
            plot_scaling(runs, out.path(os.path.join(a.out, "scaling.png")))
            plot_recall(runs, out.path(os.path.join(a.out, "recall.png")))
    except OSError as e:
        print(f"error: {e} (results.md and the plots in {a.out} were left as they were; free space or choose "
              f"another --out, then rerun)", file=sys.stderr)
        return 1
    print(md)
    print(f"wrote {os.path.join(a.out, 'results.md')}, extrapolation.png, scaling.png, recall.png", file=sys.stderr)
    return 0
