"""Render the paper's tables from run directories: `python -m idattn.results --runs=DIR [DIR ...] [--out=DIR]`.

Reads every `<run>/eval/*.json` (schema `idattn.eval/v1`, see idattn/eval/schema.py) and prints Markdown with
the paper's numbers (idattn/eval/paper_numbers.py) beside ours:

  Table 2   length extrapolation, five-corpus average perplexity at 1x / 2x / 3.5x the train length
  Table 4   mechanism cube: best-of-run validation loss / perplexity per cube cell
  Table 6   validation CE, 8-task average, LAMBADA acc / ppl / bpb, WikiText-2 ppl / bpb
  Table 7   per-task accuracies of the eight-task suite
  Table 8   per-corpus extrapolation perplexity
  Table 9   recall: RULER S-NIAH-1 against context, phonebook against size (Based: paper only)
  Fig. 2    validation perplexity against scale
and writes `results.md` plus PNG plots (extrapolation against length, validation perplexity against scale,
S-NIAH-1 accuracy against context) to
`--out` (default: the current directory).

Which run fills a column: a run's identity is its result files' `run` record (mixer, size, ...); the mixer is
canonicalised (`interdomain` = `dualkv-query-rope`, `s4d_only` = `generic-linear-norope`). For the 1.3B tables
each mixer's column takes its largest run (1.3b if present) and the header names the size, so small runs
still render. Validation loss is best-of-run (the minimum over all validation files, as the paper reports);
every other suite takes the latest step.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys
from typing import Any

from idattn.eval import paper_numbers as P
from idattn.eval.schema import read_results

SIZE_ORDER = ("tiny", "125m", "350m", "760m", "1.3b")
CANON = {"interdomain": "dualkv-query-rope", "s4d_only": "generic-linear-norope"}
FAMILY = {v: k for k, v in CANON.items()}


def canonical_mixer(name: str) -> str:
    return CANON.get(name, name)


def mixer_family(name: str) -> str:
    """softmax | interdomain | s4d_only for the three headline mixers, else the cube cell name."""
    c = canonical_mixer(name)
    return "softmax" if c == "softmax" else FAMILY.get(c, c)


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
        cfg = _saved_config(workdir) if ("size" not in ident or "seq_len" not in ident) else None
        if cfg is not None:  # the trainer's validation records no size / seq_len: take them from the config
            from idattn.eval.__main__ import size_name

            ident.setdefault("size", size_name(cfg.model))
            ident.setdefault("seq_len", int(cfg.data.seq_len))
            ident.setdefault("mixer", str(cfg.model.mixer))
        self.mixer = canonical_mixer(str(ident.get("mixer", os.path.basename(os.path.normpath(workdir)))))
        self.size = str(ident.get("size", "?")).lower()
        self.ident = ident
        self.metrics: dict[str, float] = {}
        self.details: dict[str, Any] = {}
        latest: dict[str, dict] = {}
        for r in recs:
            if r["suite"] not in latest or r["step"] >= latest[r["suite"]]["step"]:
                latest[r["suite"]] = r
        for suite, r in latest.items():
            self.metrics.update({f"{suite}/{k}": v for k, v in r["metrics"].items()})
            self.details[suite] = r.get("details", {})
            self.details[suite + "/run"] = r.get("run", {})
        vals = [r for r in recs if r["suite"] == "validation" and "loss" in r["metrics"]]
        if vals:
            best = min(vals, key=lambda r: r["metrics"]["loss"])
            self.metrics["validation/loss"] = best["metrics"]["loss"]
            self.metrics["validation/ppl"] = math.exp(best["metrics"]["loss"])
            self.metrics["validation/final_loss"] = latest["validation"]["metrics"]["loss"]

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
        return f"Run({self.workdir!r}, {self.mixer}, {self.size})"


def _saved_config(workdir: str):
    """The run's saved config (written by the trainer), or None when there is none or it cannot be read."""
    try:
        from idattn.train.checkpoint import load_config

        return load_config(workdir)
    except Exception:  # no trainer config in this folder (e.g. result files written by hand)
        return None


def _size_rank(s: str) -> int:
    return SIZE_ORDER.index(s) if s in SIZE_ORDER else -1


def pick(runs: list[Run], family: str, *, size: str | None = None, need: str | None = None,
         exact: bool = False) -> Run | None:
    """The run of a mixer family (at `size`, else - unless `exact` - the largest) that has metric prefix `need`."""
    cands = [r for r in runs if r.family == family and (need is None or any(k.startswith(need) for k in r.metrics))]
    if size is not None:
        at = [r for r in cands if r.size == size]
        cands = at if (at or exact) else cands
    return max(cands, key=lambda r: _size_rank(r.size), default=None)


def fmt(v: float | None, digits: int = 2, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v * 100 if pct else v:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _col(run: Run | None, fam: str) -> str:
    return f"{P.MIXER_LABEL.get(fam, fam)} ours ({run.size})" if run else f"{P.MIXER_LABEL.get(fam, fam)} ours"


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


def table2(runs: list[Run]) -> str:
    header = ["mixer"] + [f"paper {l}" for l in P.EXTRAP_LABELS] + [f"ours {r:g}x" for r in P.EXTRAP_RATIOS] + ["ours run"]
    rows = []
    for fam in P.MIXERS:
        r = pick(runs, fam, need="extrapolation/ppl@")
        ours = [fmt(_ratio_value(r, x, "extrapolation/ppl@")) if r else "—" for x in P.EXTRAP_RATIOS]
        rows.append([P.MIXER_LABEL[fam]] + [fmt(v) for v in P.TABLE2[fam]] + ours + [r.size if r else "—"])
    return "### Table 2: length extrapolation (five-corpus mean perplexity; paper: 1.3B trained at 4K)\n\n" + \
        _table(header, rows)


def table8(runs: list[Run]) -> str:
    header = ["corpus", "mixer"] + [f"paper {l}" for l in P.EXTRAP_LABELS] + [f"ours {r:g}x" for r in P.EXTRAP_RATIOS]
    rows = []
    for corpus, per in P.TABLE8.items():
        for fam in P.MIXERS:
            r = pick(runs, fam, need=f"extrapolation/{corpus}/ppl@")
            ours = [fmt(_ratio_value(r, x, f"extrapolation/{corpus}/ppl@")) if r else "—" for x in P.EXTRAP_RATIOS]
            rows.append([corpus, P.MIXER_LABEL[fam]] + [fmt(v) for v in per[fam]] + ours)
    return "### Table 8: per-corpus extrapolation perplexity (NarrativeQA outside the Table 2 mean)\n\n" + \
        _table(header, rows)


def table4(runs: list[Run]) -> str:
    header = ["cell", "description", "paper loss", "paper ppl", "ours loss", "ours ppl", "ours vs softmax", "ours run"]
    rows = []
    # one size for the whole cube (125M when measured there, else the size with the most cells measured), so
    # that "vs softmax" never compares across sizes
    sizes = [r.size for r in runs if "validation/loss" in r.metrics]
    size = "125m" if "125m" in sizes else max(set(sizes), key=lambda s: (sizes.count(s), _size_rank(s)), default=None)
    soft = pick(runs, "softmax", size=size, need="validation/loss", exact=True)
    for cell, desc, loss, ppl in P.TABLE4:
        fam = mixer_family(cell)
        r = pick(runs, fam, size=size, need="validation/loss", exact=True)
        ol = r.metrics["validation/loss"] if r else None
        rel = (f"{(math.exp(ol) / math.exp(soft.metrics['validation/loss']) - 1) * 100:+.2f}%"
               if r and soft and cell != "softmax" else "—")
        rows.append([cell, desc, fmt(loss, 4), fmt(ppl), fmt(ol, 4), fmt(math.exp(ol) if ol is not None else None),
                     rel, r.size if r else "—"])
    return "### Table 4: mechanism cube (best-of-run validation; paper: 125M / 2.5B tokens)\n\n" + _table(header, rows)


def _paper_vs_ours(title: str, spec, runs: list[Run], *, pct_keys=("acc", "acc_norm")) -> str:
    picked = {fam: pick(runs, fam, size="1.3b", need=spec[0][0].split("/")[0] if spec else None) for fam in P.MIXERS}
    header = ["metric"] + [f"{P.MIXER_LABEL[f]} paper" for f in P.MIXERS] + [_col(picked[f], f) for f in P.MIXERS]
    rows = []
    for key, label, paper in spec:
        pct = key.split("/")[-1] in pct_keys
        digits = 4 if ("bpb" in key or "bits" in key or "loss" in key) else 2
        ours = []
        for f in P.MIXERS:
            r = pick(runs, f, size="1.3b", need=key) or picked[f]
            ours.append(fmt(r.metrics.get(key) if r else None, digits, pct=pct))
        rows.append([label] + [fmt(paper[f], digits) for f in P.MIXERS] + ours)
    return f"### {title}\n\n" + _table(header, rows)


def table6(runs: list[Run]) -> str:
    return _paper_vs_ours("Table 6: validation and downstream (paper: 1.3B / 26B tokens)", P.TABLE6, runs)


def table7(runs: list[Run]) -> str:
    return _paper_vs_ours("Table 7: eight-task commonsense suite, accuracy % (paper: 1.3B)", P.TABLE7, runs)


def table9(runs: list[Run]) -> str:
    header = ["task", "mixer"] + [f"paper {x}" for x in P.NIAH_LENGTHS] + [f"ours {x}" for x in P.NIAH_LENGTHS] + ["ours run"]
    rows = []
    for fam in P.MIXERS:
        r = pick(runs, fam, size="1.3b", need="recall/niah@")
        ours = [fmt(r.metrics.get(f"recall/niah@{L}/acc") if r else None, 2, pct=True) for L in P.NIAH_LENGTHS]
        rows.append(["S-NIAH-1", P.MIXER_LABEL[fam]] + [fmt(v) for v in P.TABLE9_NIAH[fam]] + ours + [r.size if r else "—"])
    for fam in P.MIXERS:
        r = pick(runs, fam, size="1.3b", need="recall/phonebook@")
        ours = [fmt(r.metrics.get(f"recall/phonebook@{N}/acc") if r else None, 2, pct=True) for N in P.PHONEBOOK_SIZES]
        rows.append([f"Phonebook ({'/'.join(map(str, P.PHONEBOOK_SIZES))} entries)", P.MIXER_LABEL[fam]] +
                    [fmt(v) for v in P.TABLE9_PHONEBOOK[fam]] + ours + [r.size if r else "—"])
    based = _table(["mixer"] + list(P.BASED_TASKS),
                   [[P.MIXER_LABEL[f]] + [fmt(v) for v in P.TABLE9_BASED[f]] for f in P.MIXERS])
    mqar = [r for r in runs if any(k.startswith("recall/mqar@") for k in r.metrics)]
    extra = ""
    if mqar:
        keys = sorted({k for r in mqar for k in r.metrics if k.startswith("recall/mqar@")})
        extra = "\n\nMQAR (ours; query accuracy %)\n\n" + _table(
            ["run"] + [k[len("recall/"):] for k in keys],
            [[f"{r.mixer} ({r.size})"] + [fmt(r.metrics.get(k), 2, pct=True) for k in keys] for r in mqar])
    return ("### Table 9: recall, accuracy % (paper: 1.3B; columns are context tokens for S-NIAH-1, entries for "
            "the phonebook)\n\n" + _table(header, rows) + "\n\nBased recall suite (paper only; not run here)\n\n" +
            based + extra)


def fig2_table(runs: list[Run]) -> str:
    header = ["size"] + [f"{P.MIXER_LABEL[f]} paper" for f in P.MIXERS] + [f"{P.MIXER_LABEL[f]} ours" for f in P.MIXERS]
    rows = []
    sizes = list(P.VAL_PPL) + sorted({r.size for r in runs} - set(P.VAL_PPL), key=_size_rank)
    for s in sizes:
        paper = P.VAL_PPL.get(s, {})
        ours = []
        for f in P.MIXERS:
            r = next((x for x in runs if x.family == f and x.size == s and "validation/ppl" in x.metrics), None)
            ours.append(fmt(r.metrics["validation/ppl"] if r else None))
        approx = "≈" if s in P.APPROX_FIG2 else ""
        rows.append([s] + [approx + fmt(paper.get(f)) if f in paper else "—" for f in P.MIXERS] + ours)
    return "### Fig. 2: best-of-run validation perplexity against scale\n\n" + _table(header, rows)


def plot_extrapolation(runs: list[Run], path: str) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for i, fam in enumerate(P.MIXERS):
        ax.plot(P.EXTRAP_RATIOS, P.TABLE2[fam], ls="--", marker="x", color=f"C{i}", label=f"{P.MIXER_LABEL[fam]} paper 1.3B")
        r = pick(runs, fam, need="extrapolation/ppl@")
        if r:
            Ls = _extrap_lengths(r)
            base = r.seq_len() or Ls[0]
            ax.plot([L / base for L in Ls], [r.metrics[f"extrapolation/ppl@{L}"] for L in Ls], marker="o",
                    color=f"C{i}", label=f"{P.MIXER_LABEL[fam]} ours {r.size}")
            drawn = True
    for r in runs:
        if r.family not in P.MIXERS and any(k.startswith("extrapolation/ppl@") for k in r.metrics):
            Ls = _extrap_lengths(r)
            base = r.seq_len() or Ls[0]
            ax.plot([L / base for L in Ls], [r.metrics[f"extrapolation/ppl@{L}"] for L in Ls], marker="o",
                    label=f"{r.mixer} ours {r.size}")
            drawn = True
    ax.set_xlabel("context length / train length")
    ax.set_ylabel("perplexity (corpus mean)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title("Length extrapolation" + ("" if drawn else " (paper only)"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_scaling(runs: list[Run], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = list(P.VAL_PPL)
    for i, fam in enumerate(P.MIXERS):
        ax.plot(range(len(xs)), [P.VAL_PPL[s][fam] for s in xs], ls="--", marker="x", color=f"C{i}",
                label=f"{P.MIXER_LABEL[fam]} paper")
        pts = [(xs.index(r.size), r.metrics["validation/ppl"]) for r in runs
               if r.family == fam and r.size in xs and "validation/ppl" in r.metrics]
        if pts:
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i}", label=f"{P.MIXER_LABEL[fam]} ours")
    ax.set_xticks(range(len(xs)), xs)
    ax.set_ylabel("validation perplexity")
    ax.set_title("Validation perplexity against scale (Fig. 2)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_recall(runs: list[Run], path: str) -> str:
    """S-NIAH-1 accuracy against context length: paper (dashed) and ours (solid) per mixer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, fam in enumerate(P.MIXERS):
        ax.plot(P.NIAH_LENGTHS, P.TABLE9_NIAH[fam], ls="--", marker="x", color=f"C{i}",
                label=f"{P.MIXER_LABEL[fam]} paper 1.3B")
        r = pick(runs, fam, size="1.3b", need="recall/niah@")
        if r:
            Ls = sorted(int(k.split("@")[1].split("/")[0]) for k in r.metrics if k.startswith("recall/niah@"))
            ax.plot(Ls, [100 * r.metrics[f"recall/niah@{L}/acc"] for L in Ls], marker="o", color=f"C{i}",
                    label=f"{P.MIXER_LABEL[fam]} ours {r.size}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context tokens")
    ax.set_ylabel("S-NIAH-1 accuracy (%)")
    ax.set_title("Recall against context length (Table 9)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render(runs: list[Run]) -> str:
    parts = ["# idattn results against the paper (arXiv 2605.24330)", "",
             "Runs: " + ", ".join(f"`{r.workdir}` ({r.mixer}, {r.size})" for r in runs), "",
             "Accuracies in %, perplexities per token (WikiText-2: per word). '—': not measured.", ""]
    for fn in (table2, table4, table6, table7, table8, table9, fig2_table):
        parts += [fn(runs), ""]
    return "\n".join(parts)


def expand_runs(items: list[str]) -> list[str]:
    out = []
    for it in items:
        for part in it.split(","):
            part = part.strip()
            if not part:
                continue
            matches = sorted(glob.glob(part)) or [part]
            out += matches
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
    runs = [Run(d) for d in dirs]
    md = render(runs)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(md)
    plot_extrapolation(runs, os.path.join(a.out, "extrapolation.png"))
    plot_scaling(runs, os.path.join(a.out, "scaling.png"))
    plot_recall(runs, os.path.join(a.out, "recall.png"))
    print(md)
    print(f"wrote {os.path.join(a.out, 'results.md')}, extrapolation.png, scaling.png, recall.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
