"""Perplexity on tokenised documents, and length extrapolation on long-document corpora.

Validation perplexity (`validation_perplexity`): every document is scored with the harness's rolling windows
(`scoring.loglikelihood_rolling`: disjoint windows of `max_length` predicted tokens, the first one fed the
prefix token, BOS), so each token is predicted exactly once with up to `max_length` tokens of its own document
as context. `loss` is the mean token cross-entropy in nats over all predicted tokens (documents weighted by
their token counts), `ppl = exp(loss)`.

Length extrapolation (`extrapolation`), per corpus and context length L:
- documents with at least `max(lengths)` tokens are kept (so that every length sees the same documents; the
  paper evaluates 4K/8K/14K at train length 4K), at most `max_docs` of them;
- each document is scored once per L on its first L tokens: input `[BOS] + doc[:L-1]`, targets `doc[:L]`;
- `ppl@L = exp(mean nll over the L positions of every kept document)`; per position bucket (width
  `max(lengths) / num_buckets`, same edges for every L) the bucket perplexity, which shows where past the
  training length the loss starts to rise;
- the headline `ppl@L` is the arithmetic mean of the per-corpus perplexities over the paper's five corpora
  (PG19, CodeParrot, GovReport, Qasper, QMSum; NarrativeQA is reported per corpus only, as in Table 8), and
  only when all five were evaluated: perplexities of other corpora are never averaged (each is its own
  `<corpus>/ppl@L`).

Corpora (`CORPORA`) read from local files (`<data_dir>/<corpus>/...` jsonl/parquet/json in the HF layout, or
any such file in that folder) or lazily from the hub.
"""
from __future__ import annotations

import math
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from idattn.data import pipeline
from idattn.eval import datasets as ds
from idattn.eval.figures import save_figure, subplots
from idattn.eval.scoring import ScoreFn, loglikelihood_rolling, score_sequences
from idattn.models import build_model
from idattn.train.step import make_loss_sums, token_nll

# name -> (hf path, config, split, text field)
CORPORA: dict[str, tuple[str, str | None, str, str]] = {
    "pg19": ("deepmind/pg19", None, "test", "text"),
    "codeparrot": ("codeparrot/codeparrot-clean-valid", None, "train", "content"),
    "govreport": ("tau/scrolls", "gov_report", "validation", "input"),
    "qasper": ("tau/scrolls", "qasper", "validation", "input"),
    "qmsum": ("tau/scrolls", "qmsum", "validation", "input"),
    "narrativeqa": ("tau/scrolls", "narrative_qa", "validation", "input"),
}
FIVE_CORPORA = ("pg19", "codeparrot", "govreport", "qasper", "qmsum")
TEXT_FIELDS = ("text", "content", "report", "input", "document", "article")


def validation_perplexity(score_fn: ScoreFn, docs_tokens: Sequence[Sequence[int]], *, prefix: int, max_length: int,
                          batch_size: int = 8, progress=None) -> dict[str, float]:
    """{"loss": nats/token, "ppl": exp(loss), "tokens": count} over documents (module docstring).
    `progress(n)` is called with the number of windows scored after each chunk of documents."""
    docs_tokens = [d for d in docs_tokens if len(d)]
    if not docs_tokens:
        raise ValueError("validation_perplexity: no non-empty documents.")
    lls: list[float] = []
    chunk = max(1, 4 * batch_size)
    for i in range(0, len(docs_tokens), chunk):
        part = docs_tokens[i:i + chunk]
        lls += loglikelihood_rolling(score_fn, part, prefix=prefix, max_length=max_length, batch_size=batch_size)
        if progress is not None:
            progress(sum(-(-len(d) // max_length) for d in part))
    n = sum(len(d) for d in docs_tokens)
    loss = -sum(lls) / n
    return {"loss": float(loss), "ppl": float(math.exp(loss)), "tokens": float(n)}


def packed_perplexity(apply_fn, params, batches: Sequence[dict[str, np.ndarray]], progress=None) -> dict[str, float]:
    """Token perplexity of packed batches exactly as the trainer validates: `apply_fn(params, batch) -> logits`
    on {"inputs", "targets", "segment_ids", "positions", "loss_mask"} [B, T]; loss = sum(nll * mask) / sum(mask)."""

    if not batches:
        raise ValueError("packed_perplexity: no batches (the held-out split is empty?).")

    @jax.jit
    def _sums(p, b):
        logits = apply_fn(p, b).astype(jnp.float32)
        lp = jax.nn.log_softmax(logits, -1)
        nll = -jnp.take_along_axis(lp, b["targets"][..., None], -1)[..., 0]
        return jnp.sum(nll * b["loss_mask"]), jnp.sum(b["loss_mask"])

    tot = cnt = 0.0
    for b in batches:
        s, c = _sums(params, {k: jnp.asarray(v) for k, v in b.items()})
        tot, cnt = tot + float(s), cnt + float(c)
        if progress is not None:
            progress(1)
    loss = tot / max(cnt, 1.0)
    return {"loss": loss, "ppl": float(math.exp(loss)), "tokens": cnt}


def eval_batches(config, tokenizer, length: int, total_tokens: int):
    """The first `total_tokens` held-out tokens of config.data cut into rows of `length` (each a fresh context)."""
    rows = total_tokens // length
    b = max(d for d in range(1, min(rows, 16) + 1) if rows % d == 0)  # the largest batch of at most 16 rows
    return pipeline.make_eval_batches(config.data, tokenizer, batch_size=b, seq_len=length, num_batches=rows // b)


def perplexities(config, params, tokenizer, lengths, total_tokens) -> dict[int, float]:
    """{L: exp(Σ m·nll / Σ m)} over `eval_batches` at each length L (the quickstart's and the study's protocol)."""
    fn = jax.jit(make_loss_sums(build_model(config.model).apply))
    out = {}
    for length in lengths:
        s = c = 0.0
        for batch in eval_batches(config, tokenizer, length, total_tokens):
            bs, bc = fn(params, batch)
            s, c = s + float(bs), c + float(bc)
        out[length] = math.exp(s / max(c, 1.0)) if math.isfinite(s) else float("nan")
    return out


def token_nlls(config, params, tokenizer, length: int, total_tokens: int) -> tuple[np.ndarray, ...]:
    """(per-token nll, loss mask, segment ids), each [rows, length], over `eval_batches`: what `context_buckets`
    reads."""
    model = build_model(config.model)
    fn = jax.jit(lambda p, b: token_nll(model.apply({"params": p}, b["inputs"], segment_ids=b["segment_ids"],
                                                    positions=b["positions"]), b["targets"]))
    nll, mask, seg = [], [], []
    for b in eval_batches(config, tokenizer, length, total_tokens):
        nll.append(np.asarray(fn(params, b)))
        mask.append(np.asarray(b["loss_mask"]))
        seg.append(np.asarray(b["segment_ids"]))
    return np.concatenate(nll), np.concatenate(mask), np.concatenate(seg)


def context_buckets(nll, mask, segment_ids, length: int, num_buckets: int = 8) -> dict[str, Any]:
    """Per-bucket perplexity by the context a token had: its column minus the first column of its segment (a
    packed row restarts the context at a document boundary). nll, mask, segment_ids: [rows, L] arrays.
    `ratio` = ppl of the last bucket / ppl of the first (below 1: the model uses its context)."""
    nll, mask, seg = np.asarray(nll, np.float64), np.asarray(mask, np.float64), np.asarray(segment_ids)
    cols = np.broadcast_to(np.arange(seg.shape[1]), seg.shape)
    start = np.zeros(seg.shape, np.int64)
    for r in range(seg.shape[0]):  # first column of each token's segment
        new = np.concatenate([[True], seg[r, 1:] != seg[r, :-1]])
        start[r] = np.maximum.accumulate(np.where(new, cols[r], 0))
    ctx_len = cols - start
    width = max(1, -(-length // num_buckets))
    edges = list(range(0, length, width)) + [length]
    ppl = []
    for a, b in zip(edges[:-1], edges[1:]):
        m = mask * ((ctx_len >= a) & (ctx_len < b))
        ppl.append(float(np.exp((nll * m).sum() / m.sum())) if m.sum() > 0 else None)
    ratio = ppl[-1] / ppl[0] if ppl and ppl[0] and ppl[-1] else None
    return {"edges": edges, "bucket_ppl": ppl, "ratio": ratio}


def _texts(rows: list[dict[str, Any]], field: str | None, corpus: str) -> list[str]:
    fields = (field,) + TEXT_FIELDS if field else TEXT_FIELDS
    out = []
    for r in rows:
        f = next((k for k in fields if isinstance(r.get(k), str)), None)
        if f is None:
            raise KeyError(f"corpus {corpus!r}: a row has none of the text fields {fields}; got fields {sorted(r)}.")
        out.append(r[f])
    return out


def load_corpus(name: str, *, data_dir: str | None = None, hub: bool = False, limit: int | None = None) -> list[str]:
    """Texts of one long-document corpus: `<data_dir>/<name>` (file or folder; the split's files, else every
    jsonl/parquet/json file there) or the hub (`CORPORA[name]`)."""
    if name not in CORPORA:
        raise KeyError(f"unknown corpus {name!r}; expected one of {sorted(CORPORA)}.")
    path, cfg, split, field = CORPORA[name]
    local = os.path.join(data_dir, name) if data_dir else None
    if local and not os.path.exists(local):
        if not hub:
            raise FileNotFoundError(f"corpus {name!r}: {local} does not exist; put the {path} rows (jsonl/parquet, "
                                    f"text field {field!r}) there, or pass --hub.")
        local = None
    if local and os.path.isdir(local):
        try:
            rows = ds.load_split(path, cfg, split, local=local, limit=limit)
        except FileNotFoundError:  # a folder of plain files that do not name the split
            files = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(local) for f in fs if f.endswith(ds.SUFFIXES))
            if not files:
                raise FileNotFoundError(f"corpus {name!r}: no .jsonl/.json/.parquet files under {local}.") from None
            rows = [r for f in files for r in ds.read_records(f)][:limit]
    else:
        rows = ds.load_split(path, cfg, split, local=local, hub=hub and local is None, limit=limit)
    return _texts(rows, field, name)


EXTRAPOLATION_MODES = {
    "docs": "first L tokens of each document of at least L tokens (a fresh context per document)",
    "rolling": "every document whole, in disjoint windows of L predicted tokens (lm-eval's loglikelihood_rolling, "
               "context_len 1): each window read afresh with only the token before it as extra context (the last, "
               "shorter window with the L tokens before its end), nothing carried across documents",
}


def extrapolation(score_fn: ScoreFn, corpora: dict[str, Sequence[Sequence[int]]], lengths: Sequence[int], *,
                  bos: int, num_buckets: int = 16, max_docs: int | None = None, batch_size: int = 1,
                  progress=None, mode: str = "docs") -> tuple[dict[str, float], dict[str, Any]]:
    """Perplexity at each context length per corpus (module docstring). Returns (metrics, details).

    mode "docs" (the paper's protocol): the first L tokens of every document with at least L tokens. mode
    "rolling" (EXTRAPOLATION_MODES): every document, short ones included, scored whole in windows of L, so a corpus
    of short documents still has a number at every L, and each L's entry says how many documents and tokens it
    scored (no per-position buckets: a window's positions are not the document's).

    metrics: `<corpus>/ppl@<L>`, and `ppl@<L>` (five-corpus mean) only when all five paper corpora ran;
    details: per corpus and L the token count, number of documents and the per-bucket perplexities with their
    bucket edges; `average_over` (the five, or [] when no mean was taken). `progress(n)` is called with the
    number of documents scored (once per document and length).
    """
    lengths = sorted(int(x) for x in lengths)
    if not lengths or lengths[0] < 2:
        raise ValueError(f"extrapolation: lengths={lengths}; expected context lengths >= 2.")
    if mode not in EXTRAPOLATION_MODES:
        raise ValueError(f"extrapolation: mode={mode!r}; expected one of {sorted(EXTRAPOLATION_MODES)}.")
    if mode == "rolling":
        return _extrapolation_rolling(score_fn, corpora, lengths, bos=bos, max_docs=max_docs,
                                      batch_size=batch_size, progress=progress)
    longest = lengths[-1]
    width = max(1, math.ceil(longest / num_buckets))
    edges = list(range(0, longest, width)) + [longest]
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {"lengths": lengths, "bucket_edges": edges, "corpora": {}}
    for name, docs in corpora.items():
        kept = [list(d[:longest]) for d in docs if len(d) >= longest][:max_docs]
        if not kept:
            raise ValueError(f"extrapolation: corpus {name!r} has no document with >= {longest} tokens "
                             f"(longest has {max((len(d) for d in docs), default=0)}); lower the lengths or add "
                             "longer documents.")
        cd: dict[str, Any] = {"docs": len(kept)}
        for L in lengths:
            inputs = [[bos] + d[:L - 1] for d in kept]
            targets = [d[:L] for d in kept]
            scored = []
            for j in range(0, len(inputs), batch_size):
                scored += score_sequences(score_fn, inputs[j:j + batch_size], targets[j:j + batch_size],
                                          batch_size=batch_size, max_length=L)
                if progress is not None:
                    progress(len(inputs[j:j + batch_size]))
            nll = -np.stack([lp for lp, _ in scored])  # [docs, L]
            ppl = float(np.exp(nll.mean()))
            bucket_ppl = [float(np.exp(nll[:, a:min(b, L)].mean())) for a, b in zip(edges[:-1], edges[1:]) if a < L]
            metrics[f"{name}/ppl@{L}"] = ppl
            cd[str(L)] = {"ppl": ppl, "tokens": int(nll.size), "bucket_ppl": bucket_ppl}
        details["corpora"][name] = cd
    return _with_five_corpus_mean(metrics, details, corpora, lengths)


def _with_five_corpus_mean(metrics, details, corpora, lengths):
    """Adds the headline `ppl@<L>` (the arithmetic mean over the paper's five corpora) only when all five ran."""
    avg_over = list(FIVE_CORPORA) if all(c in corpora for c in FIVE_CORPORA) else []
    details["average_over"] = avg_over
    for L in lengths if avg_over else []:
        metrics[f"ppl@{L}"] = float(np.mean([metrics[f"{c}/ppl@{L}"] for c in avg_over]))
    return metrics, details


def _extrapolation_rolling(score_fn, corpora, lengths, *, bos, max_docs, batch_size, progress):
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {"lengths": lengths, "mode": "rolling", "method": EXTRAPOLATION_MODES["rolling"],
                               "corpora": {}}
    for name, docs in corpora.items():
        kept = [list(d) for d in docs if len(d)][:max_docs]
        if not kept:
            raise ValueError(f"extrapolation: corpus {name!r} has no document with a token.")
        n_tok = sum(len(d) for d in kept)
        cd: dict[str, Any] = {"docs": len(kept), "tokens_per_doc": {"mean": n_tok / len(kept),
                                                                   "max": max(len(d) for d in kept)}}
        for L in lengths:
            lls = loglikelihood_rolling(score_fn, kept, prefix=bos, max_length=L, batch_size=batch_size)
            if progress is not None:
                progress(len(kept))
            ppl = float(math.exp(-sum(lls) / n_tok))
            metrics[f"{name}/ppl@{L}"] = ppl
            cd[str(L)] = {"ppl": ppl, "tokens": n_tok, "docs": len(kept),
                          "docs_longer_than_L": sum(len(d) > L for d in kept)}
        details["corpora"][name] = cd
    return _with_five_corpus_mean(metrics, details, corpora, lengths)


def plot_extrapolation(details: dict[str, Any], path: str, title: str = "", train_len: int | None = None) -> str:
    """PNG: left, perplexity against context length per corpus; right, per-position-bucket perplexity at the
    longest length (where past the training context the loss starts to rise). The training length (`train_len`,
    else details["train_seq_len"]) is marked on both by a dotted vertical line."""
    lengths = details["lengths"]
    rolling = details.get("mode") == "rolling"  # no per-position buckets: one panel
    if rolling:
        fig, a1 = subplots(1, 1, figsize=(6, 4))
        axes = (a1,)
    else:
        edges = details["bucket_edges"]
        fig, (a1, a2) = subplots(1, 2, figsize=(11, 4))
        axes = (a1, a2)
    for name, cd in details["corpora"].items():
        scored = cd[str(lengths[-1])]
        label = f"{name} ({cd['docs']} docs, {int(scored['tokens']):,} tokens at L={lengths[-1]})"
        a1.plot(lengths, [cd[str(L)]["ppl"] for L in lengths], marker="o", label=label)
        if not rolling:
            bp = scored["bucket_ppl"]
            mids = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])][:len(bp)]
            a2.plot(mids, bp, marker=".", label=name)
    train_len = train_len or details.get("train_seq_len")
    if train_len:
        for ax in axes:
            ax.axvline(train_len, color="k", lw=0.8, ls=":", label=f"training length {train_len}")
    a1.set_xlabel("context length (tokens)")
    a1.set_ylabel("perplexity (per token)")
    a1.set_xscale("log", base=2)
    a1.set_xticks(lengths, [str(L) for L in lengths])
    a1.minorticks_off()
    a1.legend(fontsize=7)
    if not rolling:
        a2.set_xlabel(f"token position (tokens; bucket width {edges[1] - edges[0]}) at L={lengths[-1]}")
        a2.set_ylabel("bucket perplexity (per token)")
        a2.legend(fontsize=7)
        a2.set_yscale("log")
    else:
        a1.set_xlabel("window length L (tokens; documents scored whole in disjoint windows of L)")
    fig.suptitle(title or "length extrapolation")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return save_figure(fig, path, dpi=110)
