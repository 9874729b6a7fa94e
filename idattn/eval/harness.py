"""The eight-task commonsense suite, WikiText-2 and OpenBookQA, built and scored as lm-evaluation-harness does.

Zero-shot, harness v0.4 task YAMLs (read from the harness repository; `docs/evaluation.md` cites them):

| task           | HF dataset (config)                     | split      | context (doc_to_text)                          | continuations (target_delimiter " ")    | gold                           |
|----------------|-----------------------------------------|------------|------------------------------------------------|-----------------------------------------|--------------------------------|
| lambada_openai | EleutherAI/lambada_openai (default)     | test       | `text.split(' ')[:-1]` joined by ' '           | `' ' + text.split(' ')[-1]`             | (loglikelihood)                |
| piqa           | baber/piqa                              | validation | `Question: {goal}\nAnswer:`                    | ` {sol1}`, ` {sol2}`                    | `label`                        |
| hellaswag      | Rowan/hellaswag                         | validation | `preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())` | ` preprocess(ending)` | `int(label)`                   |
| winogrande     | allenai/winogrande (winogrande_xl)      | validation | `sentence[:i] + option{1,2}` (i = index of _)  | ` sentence[i+1:].strip()` (shared)      | `{"1": 0, "2": 1}[answer]`     |
| arc_easy       | allenai/ai2_arc (ARC-Easy)              | test       | `Question: {question}\nAnswer:`                | ` {choices.text[k]}`                    | `choices.label.index(answerKey)` |
| arc_challenge  | allenai/ai2_arc (ARC-Challenge)         | test       | as arc_easy                                    | as arc_easy                             | as arc_easy                    |
| social_iqa     | lighteval/siqa                          | validation | `Q: {context} {question}\nA:`                  | ` {answerA}`, ` {answerB}`, ` {answerC}` | `int(label) - 1`              |
| boolq          | aps/super_glue (boolq)                  | validation | `{passage}\nQuestion: {question}?\nAnswer:`    | ` no`, ` yes`                           | `label`                        |
| openbookqa     | allenai/openbookqa (main)               | test       | `{question_stem}`                              | ` {choices.text[k]}`                    | `choices.label.index(answerKey.lstrip())` |
| wikitext       | EleutherAI/wikitext_document_level (wikitext-2-raw-v1) | test | rolling log-likelihood of `wikitext_detokenizer(page)` at the model's context |  |        |

HellaSwag's `preprocess`: strip, " [title]" -> ". ", remove every "[...]" (non-greedy), "  " -> " ".

Metrics (per document, then mean), as the harness computes them:
- multiple choice: `acc = [argmax_k ll_k == gold]`, `acc_norm = [argmax_k ll_k / len(choice_k) == gold]` where
  `len` is the *character* length of the choice string without the delimiter (the harness's
  `completion_len = [float(len(i)) for i in choices]`; equal to the byte length for ASCII text).
  WinoGrande ("partial scoring"): the two contexts share one continuation; acc only.
- lambada_openai: `acc` = every continuation token is the greedy argmax; `ppl = exp(-mean_doc ll)`.
  `bpb = -sum ll / sum bytes(continuation) / ln 2` is ours (the harness does not report it; Table 6 does).
- wikitext: `word_perplexity = exp(-sum ll / sum words)`, `byte_perplexity = exp(-sum ll / sum bytes)`,
  `bits_per_byte = -sum ll / sum bytes / ln 2`, words = `len(re.split(r"\\s+", page))` and bytes = UTF-8 length
  of the *original* page (before detokenisation), as the harness counts them.
- `average/acc`: mean of the eight headline accuracies (LAMBADA acc, PIQA acc, HellaSwag acc_norm, WinoGrande
  acc, ARC-e acc, ARC-c acc_norm, SIQA acc, BoolQ acc), the Gated DeltaNet protocol the paper follows.
  OpenBookQA is reported beside them, outside the average.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Sequence

import numpy as np

from idattn.eval import datasets as ds
from idattn.eval.scoring import (ScoreFn, TextTokenizer, encode_pair, loglikelihood, loglikelihood_rolling,
                                 prefix_token)


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    hf_path: str
    hf_name: str | None
    split: str
    kind: str  # multiple_choice | loglikelihood | rolling
    headline: str | None  # metric that enters the 8-task average (None: outside it)
    metrics: tuple[str, ...]
    multiple_input: bool = False


TASKS: dict[str, Task] = {t.name: t for t in [
    Task("lambada_openai", "EleutherAI/lambada_openai", "default", "test", "loglikelihood", "acc", ("acc", "ppl", "bpb")),
    Task("piqa", "baber/piqa", None, "validation", "multiple_choice", "acc", ("acc", "acc_norm")),
    Task("hellaswag", "Rowan/hellaswag", None, "validation", "multiple_choice", "acc_norm", ("acc", "acc_norm")),
    Task("winogrande", "allenai/winogrande", "winogrande_xl", "validation", "multiple_choice", "acc", ("acc",),
         multiple_input=True),
    Task("arc_easy", "allenai/ai2_arc", "ARC-Easy", "test", "multiple_choice", "acc", ("acc", "acc_norm")),
    Task("arc_challenge", "allenai/ai2_arc", "ARC-Challenge", "test", "multiple_choice", "acc_norm",
         ("acc", "acc_norm")),
    Task("social_iqa", "lighteval/siqa", None, "validation", "multiple_choice", "acc", ("acc",)),
    Task("boolq", "aps/super_glue", "boolq", "validation", "multiple_choice", "acc", ("acc",)),
    Task("openbookqa", "allenai/openbookqa", "main", "test", "multiple_choice", None, ("acc", "acc_norm")),
    Task("wikitext", "EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", "test", "rolling", None,
         ("word_perplexity", "byte_perplexity", "bits_per_byte")),
]}
EIGHT_TASKS = ("lambada_openai", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "social_iqa",
               "boolq")
DEFAULT_TASKS = EIGHT_TASKS + ("wikitext", "openbookqa")


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise KeyError(f"unknown harness task {name!r}; expected one of {sorted(TASKS)}.")
    return TASKS[name]


# ----------------------------------------------------------------------------------------------------------
# prompts (doc -> requests)
# ----------------------------------------------------------------------------------------------------------


def hellaswag_preprocess(text: str) -> str:
    """The harness's hellaswag `preprocess` (WikiHow bracket artefacts)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def wikitext_detokenizer(page: str) -> str:
    """The harness's `wikitext_detokenizer` (undo WikiText's tokenisation artefacts)."""
    string = page
    string = string.replace("s '", "s'")
    string = re.sub(r"/' [0-9]/", r"/'[0-9]/", string)
    string = string.replace(" @-@ ", "-")
    string = string.replace(" @,@ ", ",")
    string = string.replace(" @.@ ", ".")
    string = string.replace(" : ", ": ")
    string = string.replace(" ; ", "; ")
    string = string.replace(" . ", ". ")
    string = string.replace(" ! ", "! ")
    string = string.replace(" ? ", "? ")
    string = string.replace(" , ", ", ")
    string = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", string)
    string = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", string)
    string = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", string)
    string = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', string)
    string = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", string)
    string = string.replace("= = = =", "====")
    string = string.replace("= = =", "===")
    string = string.replace("= =", "==")
    string = string.replace(" " + chr(176) + " ", chr(176))
    string = string.replace(" \n", "\n")
    string = string.replace("\n ", "\n")
    string = string.replace(" N ", " 1 ")
    string = string.replace(" 's", "'s")
    return string


def _need(doc: dict, task: str, *keys: str) -> None:
    missing = [k for k in keys if k not in doc]
    if missing:
        raise KeyError(f"{task}: document is missing field(s) {missing}; got fields {sorted(doc)}. Expected the "
                       f"Hugging Face rows of {TASKS[task].hf_path}.")


def _mc(doc: dict, task: str) -> tuple[str, list[str], int]:
    """(context, choice strings without delimiter, gold index) for the multiple-choice tasks."""
    if task == "piqa":
        _need(doc, task, "goal", "sol1", "sol2", "label")
        return f"Question: {doc['goal']}\nAnswer:", [doc["sol1"], doc["sol2"]], int(doc["label"])
    if task == "hellaswag":
        _need(doc, task, "activity_label", "ctx_a", "ctx_b", "endings", "label")
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        query = hellaswag_preprocess(doc["activity_label"] + ": " + ctx)
        return query, [hellaswag_preprocess(e) for e in doc["endings"]], int(doc["label"])
    if task in ("arc_easy", "arc_challenge"):
        _need(doc, task, "question", "choices", "answerKey")
        ch = doc["choices"]
        return (f"Question: {doc['question']}\nAnswer:", list(ch["text"]),
                list(ch["label"]).index(doc["answerKey"]))
    if task == "social_iqa":
        _need(doc, task, "context", "question", "answerA", "answerB", "answerC", "label")
        return (f"Q: {doc['context']} {doc['question']}\nA:", [doc["answerA"], doc["answerB"], doc["answerC"]],
                int(doc["label"]) - 1)
    if task == "boolq":
        _need(doc, task, "passage", "question", "label")
        return f"{doc['passage']}\nQuestion: {doc['question']}?\nAnswer:", ["no", "yes"], int(doc["label"])
    if task == "openbookqa":
        _need(doc, task, "question_stem", "choices", "answerKey")
        ch = doc["choices"]
        return doc["question_stem"], list(ch["text"]), list(ch["label"]).index(doc["answerKey"].lstrip())
    raise KeyError(f"{task!r} is not a plain multiple-choice task.")


def build_requests(task: str, doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The (context, continuation) strings the harness scores for one raw HF document (zero-shot).

    Multiple choice: one pair per choice, in choice order; lambada: one pair; wikitext: one ("", target) pair
    standing for a rolling log-likelihood of `target`.
    """
    t = get_task(task)
    if task == "lambada_openai":
        _need(doc, task, "text")
        words = doc["text"].split(" ")
        return [(" ".join(words[:-1]), " " + words[-1])]
    if task == "winogrande":
        _need(doc, task, "sentence", "option1", "option2", "answer")
        s = doc["sentence"]
        i = s.index("_")
        cont = " " + s[i + 1:].strip()
        return [(s[:i] + opt, cont) for opt in (doc["option1"], doc["option2"])]
    if task == "wikitext":
        _need(doc, task, "page")
        return [("", wikitext_detokenizer(doc["page"]))]
    assert t.kind == "multiple_choice"
    ctx, choices, _ = _mc(doc, task)
    return [(ctx, " " + c) for c in choices]


def gold_index(task: str, doc: dict[str, Any]) -> int:
    if task == "winogrande":
        _need(doc, task, "answer")
        return {"1": 0, "2": 1}[str(doc["answer"])]
    return _mc(doc, task)[2]


def choice_lengths(task: str, doc: dict[str, Any]) -> np.ndarray:
    """Character lengths of the choice strings (the harness's acc_norm divisor)."""
    if task == "winogrande":
        return np.array([float(len(c)) for c, _ in build_requests(task, doc)])
    return np.array([float(len(c)) for c in _mc(doc, task)[1]])


# ----------------------------------------------------------------------------------------------------------
# scoring
# ----------------------------------------------------------------------------------------------------------


def mc_metrics(lls: Sequence[float], gold: int, lengths: np.ndarray) -> dict[str, float]:
    """acc / acc_norm of one multiple-choice document from its choices' log-likelihoods (argmax, first wins)."""
    lls = np.asarray(lls, np.float64)
    return {"acc": float(np.argmax(lls) == gold), "acc_norm": float(np.argmax(lls / lengths) == gold)}


def evaluate_task(task: str, docs: Sequence[dict[str, Any]], score_fn: ScoreFn, tok: TextTokenizer, *,
                  max_length: int, batch_size: int = 8, add_bos: bool = False) -> tuple[dict[str, float], dict]:
    """Scores one task on raw documents; returns (metrics {name: value}, details {counts, per-doc samples})."""
    t = get_task(task)
    if not docs:
        raise ValueError(f"evaluate_task({task!r}): no documents.")
    if t.kind == "rolling":
        targets = [build_requests(task, d)[0][1] for d in docs]
        toks = [list(tok.encode(s)) for s in targets]
        lls = loglikelihood_rolling(score_fn, toks, prefix=prefix_token(tok), max_length=max_length,
                                    batch_size=batch_size)
        words = sum(len(re.split(r"\s+", d["page"])) for d in docs)
        nbytes = sum(len(d["page"].encode("utf-8")) for d in docs)
        ll = float(sum(lls))
        return ({"word_perplexity": math.exp(-ll / words), "byte_perplexity": math.exp(-ll / nbytes),
                 "bits_per_byte": -ll / nbytes / math.log(2)},
                {"docs": len(docs), "words": words, "bytes": nbytes, "tokens": sum(map(len, toks)), "ll": ll})

    reqs = [build_requests(task, d) for d in docs]
    flat = [encode_pair(tok, c, x, add_bos=add_bos) for r in reqs for (c, x) in r]
    res = loglikelihood(score_fn, flat, max_length=max_length, batch_size=batch_size)
    if t.kind == "loglikelihood":  # lambada
        lls = np.array([r[0] for r in res])
        greedy = np.array([r[1] for r in res], np.float64)
        nbytes = sum(len(r[0][1].encode("utf-8")) for r in reqs)
        return ({"acc": float(greedy.mean()), "ppl": float(math.exp(-lls.mean())),
                 "bpb": float(-lls.sum() / nbytes / math.log(2))},
                {"docs": len(docs), "samples": [{"ll": float(a), "greedy": bool(b)} for a, b in res[:5]]})
    per_doc, k = [], 0
    for d, r in zip(docs, reqs):
        lls = [x[0] for x in res[k:k + len(r)]]
        k += len(r)
        m = mc_metrics(lls, gold_index(task, d), choice_lengths(task, d))
        per_doc.append((m, lls))
    metrics = {name: float(np.mean([m[name] for m, _ in per_doc])) for name in t.metrics}
    return metrics, {"docs": len(docs), "samples": [{"lls": lls, **m} for m, lls in per_doc[:5]]}


def load_task_docs(task: str, *, data_dir: str | None = None, hub: bool = False, limit: int | None = None
                   ) -> list[dict[str, Any]]:
    """Raw documents of a task: `<data_dir>/<task>` (or `<data_dir>/<dataset basename>`), else the hub."""
    t = get_task(task)
    local = None
    if data_dir:
        for cand in (os.path.join(data_dir, task), os.path.join(data_dir, t.hf_path.split("/")[-1])):
            if os.path.exists(cand):
                local = cand
                break
        if local is None and not hub:
            raise FileNotFoundError(f"harness task {task!r}: no {os.path.join(data_dir, task)} folder or file. Put "
                                    f"the {t.split!r} split of {t.hf_path} there (jsonl/parquet), or pass --hub.")
    return ds.load_split(t.hf_path, t.hf_name, t.split, local=local, hub=hub and local is None, limit=limit)


def run_harness(score_fn: ScoreFn, tok: TextTokenizer, *, tasks: Sequence[str] = DEFAULT_TASKS,
                data_dir: str | None = None, hub: bool = False, limit: int | None = None, max_length: int = 4096,
                batch_size: int = 8, add_bos: bool = False, docs: dict[str, list] | None = None,
                progress=None) -> tuple[dict[str, float], dict]:
    """Runs tasks; returns flat metrics `<task>/<metric>` plus `average/acc` when all eight ran, and details.
    `progress(1)` is called after each task."""
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {"max_length": max_length, "add_bos": add_bos, "limit": limit}
    for name in tasks:
        task_docs = (docs or {}).get(name) or load_task_docs(name, data_dir=data_dir, hub=hub, limit=limit)
        m, d = evaluate_task(name, task_docs, score_fn, tok, max_length=max_length, batch_size=batch_size,
                             add_bos=add_bos)
        metrics.update({f"{name}/{k}": v for k, v in m.items()})
        details[name] = d
        if progress is not None:
            progress(1)
    if all(f"{n}/{TASKS[n].headline}" in metrics for n in EIGHT_TASKS):
        metrics["average/acc"] = float(np.mean([metrics[f"{n}/{TASKS[n].headline}"] for n in EIGHT_TASKS]))
    return metrics, details
