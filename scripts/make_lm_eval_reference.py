"""Writes tests/data/lm_eval_reference.json: what lm-evaluation-harness itself asks and answers on our fixtures.

    pip install torch==2.13.0 && pip install -e ".[harness]"     # lm-eval (a CPU torch first: see .ci/run)
    python scripts/make_lm_eval_reference.py [--out tests/data/lm_eval_reference.json]

lm-eval runs its own task definitions (each task's YAML from the installed lm_eval package, `include`d with only
the dataset swapped for the documents of tests/eval_fixtures.py written as local JSON Lines) on the idattn adapter
(`idattn.eval.lm_eval_adapter.IdattnLM`) whose model is a closed-form one: the byte tokenizer and a bigram lookup
table drawn from numpy's generator (seed and scale in the file), so the default suite rebuilds the same model
without jax's PRNG, torch or lm-eval. Stored per task and document: the (context, continuation) requests lm-eval
built, its per-request log-likelihoods (and is-greedy) and its per-document metrics, and per task its aggregated
metrics. tests/test_eval_lm_eval_reference.py compares idattn's own harness against them in the default suite.
Rerun when lm-eval changes a task, and commit the file with the version it records.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # tests.eval_fixtures: the documents

TABLE_SEED, TABLE_SCALE = 0, 1.0
MAX_LENGTH = 2048
# task name in idattn's harness -> lm-eval's YAML (relative to lm_eval/tasks) and the fixture documents' name
TASKS = {
    "lambada_openai": ("lambada/lambada_openai.yaml", "LAMBADA"),
    "piqa": ("piqa/piqa.yaml", "PIQA"),
    "hellaswag": ("hellaswag/hellaswag.yaml", "HELLASWAG"),
    "winogrande": ("winogrande/default.yaml", "WINOGRANDE"),
    "arc_easy": ("arc/arc_easy.yaml", "ARC"),
    "social_iqa": ("siqa/siqa.yaml", "SIQA"),
    "boolq": ("super_glue/boolq/default.yaml", "BOOLQ"),
    "openbookqa": ("openbookqa/openbookqa.yaml", "OPENBOOKQA"),
    "wikitext": ("wikitext/wikitext.yaml", "WIKITEXT"),
}


def bigram_table(seed: int = TABLE_SEED, scale: float = TABLE_SCALE, vocab: int = 259) -> np.ndarray:
    """The reference model: logits[prev] = table[prev], float32 (the default suite rebuilds it from seed, scale)."""
    return (np.random.default_rng(seed).standard_normal((vocab, vocab)) * scale).astype(np.float32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "lm_eval_reference.json"))
    a = ap.parse_args(argv)

    import lm_eval
    from lm_eval.tasks import TaskManager

    from idattn.eval import lm_eval_adapter
    from tests import eval_fixtures as F

    tok = F.ByteTokenizer()
    score_fn = F.bigram_score_fn(bigram_table())
    lm_eval_adapter._build = lambda *_: (None, None, tok, score_fn, MAX_LENGTH)  # noqa: SLF001 (the model only)
    lm_eval_adapter.register()
    tasks_root = os.path.join(os.path.dirname(lm_eval.__file__), "tasks")
    out = {"made_by": "python scripts/make_lm_eval_reference.py", "lm_eval_version": lm_eval.__version__,
           "table": {"seed": TABLE_SEED, "scale": TABLE_SCALE, "vocab": 259, "dtype": "float32",
                     "draw": "numpy.random.default_rng(seed).standard_normal((vocab, vocab)) * scale"},
           "tokenizer": "tests.eval_fixtures.ByteTokenizer", "max_length": MAX_LENGTH, "tasks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        names = []
        for name, (yaml_rel, fixture) in TASKS.items():
            base = os.path.join(tasks_root, yaml_rel)
            if not os.path.isfile(base):
                raise SystemExit(f"lm-eval {lm_eval.__version__} has no {base}; update TASKS in {__file__}")
            docs = getattr(F, fixture)
            data = os.path.join(tmp, f"{name}.jsonl")
            with open(data, "w") as f:
                f.writelines(json.dumps(d) + "\n" for d in docs)
            ref = f"ref_{name}"
            with open(os.path.join(tmp, f"{ref}.yaml"), "w") as f:  # lm-eval's task, our documents
                f.write(f"include: {base}\ntask: {ref}\ndataset_path: json\n"
                        f"dataset_name: null\ndataset_kwargs:\n  data_files:\n"
                        + "".join(f"    {s}: {data}\n" for s in ("train", "validation", "test")))
            names.append(ref)
        res = lm_eval.simple_evaluate(model="idattn", model_args="workdir=unused", tasks=names, batch_size=4,
                                      log_samples=True, task_manager=TaskManager(include_path=tmp),
                                      num_fewshot=0, bootstrap_iters=0)
    for name in TASKS:
        ref = f"ref_{name}"
        samples = sorted(res["samples"][ref], key=lambda s: s["doc_id"])
        per_doc = []
        for s in samples:
            per_doc.append({"doc_id": s["doc_id"], "requests": [list(x[:2]) for x in s["arguments"]],
                            "responses": [r[0] if isinstance(r, list) and len(r) == 1 else r
                                          for r in s["resps"]],
                            "metrics": {k: s[k] for k in ("acc", "acc_norm", "perplexity", "word_perplexity",
                                                          "byte_perplexity", "bits_per_byte") if k in s}})
        agg = {k.split(",")[0]: v for k, v in res["results"][ref].items()
               if "," in k and "_stderr" not in k and isinstance(v, (int, float))}
        out["tasks"][name] = {"lm_eval_yaml": TASKS[name][0], "fixture": TASKS[name][1], "docs": per_doc,
                              "results": agg}
        print(f"{name}: {len(per_doc)} docs, {agg}")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True, default=float)
        f.write("\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
