"""Shared fixtures for the evaluation tests: a byte tokenizer, lookup (bigram) models, HF-format documents."""
from __future__ import annotations

import json
import textwrap

import numpy as np

from idattn.eval.scoring import make_score_fn


class ByteTokenizer:
    """UTF-8 bytes + 3 (0 unk, 1 BOS, 2 EOS): prefix-stable, so the harness's pair split is exact."""

    vocab_size = 259
    bos_id = 1
    eos_id = 2

    def encode(self, text):
        return [b + 3 for b in text.encode("utf-8")]

    def decode(self, ids):
        return bytes(int(i) - 3 for i in ids if int(i) >= 3).decode("utf-8", errors="replace")


def bigram_score_fn(table):
    """score_fn of the lookup model logits[b, t] = table[tokens[b, t]] (log p(next | prev) in closed form)."""
    import jax.numpy as jnp

    return make_score_fn(lambda p, t: jnp.asarray(p)[t], np.asarray(table, np.float32))


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def ref_ll(table, ctx_ids, cont_ids):
    """Numpy loop: sum_t log p(cont[t] | previous token), and whether every cont token is the argmax."""
    lp = log_softmax(table)
    seq = list(ctx_ids) + list(cont_ids)
    total, greedy = 0.0, True
    for i in range(len(ctx_ids), len(seq)):
        prev, nxt = seq[i - 1], seq[i]
        total += lp[prev, nxt]
        greedy &= bool(np.argmax(table[prev]) == nxt)
    return total, greedy


# ---- documents in the Hugging Face formats (field names and types as the hub rows have them) ----
LAMBADA = [
    {"text": "In my palm is a clear stone, and inside it is a small ivory statuette. A guardian angel.\n\n"
             "\"Figured if you're going to be out at night getting hit by cars, you might as well have some "
             "extra protection.\" I tried to say thank you, but I couldn't speak. He pushed the stone into my "
             "palm and closed my fingers around it. \"Thanks, angel"},
    {"text": "the cat sat on the mat"},
]
PIQA = [
    {"goal": "How do I ready a guinea pig cage for it's new occupants?",
     "sol1": "Provide the guinea pig with a cage full of a few inches of bedding made of ripped paper strips, "
             "you will also need to supply it with a water bottle and a food dish.",
     "sol2": "Provide the guinea pig with a cage full of a few inches of bedding made of ripped jeans material, "
             "you will also need to supply it with a water bottle and a food dish.", "label": 0},
]
HELLASWAG = [
    {"ind": 24, "activity_label": "Roof shingle removal",
     "ctx_a": "A man is sitting on a roof.", "ctx_b": "he", "ctx": "A man is sitting on a roof. he",
     "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."],
     "source_id": "activitynet~v_-JhWjGDPHMY", "split": "val", "split_type": "indomain", "label": "3"},
    {"ind": 92, "activity_label": "Home and Garden",
     "ctx_a": "[header] How to clean a cast iron skillet [title] Scrub the skillet.", "ctx_b": "use HOT water",
     "ctx": "", "endings": ["[step] Rinse it  well [substeps] Dry it.", " then dry it [title] Oil it.",
                            "leave it.", "[step] Throw it   away."],
     "source_id": "wikihow~1", "split": "val", "split_type": "zeroshot", "label": "1"},
]
WINOGRANDE = [
    {"sentence": "Sarah was a much better surgeon than Maria so _ always got the harder cases.",
     "option1": "Sarah", "option2": "Maria", "answer": "1"},
]
ARC = [
    {"id": "Mercury_7175875", "question": "An astronomer observes that a planet rotates faster after a meteorite "
     "impact. Which is the most likely effect of this increase in rotation?",
     "choices": {"text": ["Planetary density will decrease.", "Planetary years will become longer.",
                          "Planetary days will become shorter.", "Planetary gravity will become stronger."],
                 "label": ["A", "B", "C", "D"]}, "answerKey": "C"},
    {"id": "NYSEDREGENTS_2015_4_8", "question": "Which object is a mineral?",
     "choices": {"text": ["quartz", "sand", "soil"], "label": ["1", "2", "3"]}, "answerKey": "1"},
]
SIQA = [
    {"context": "Cameron decided to have a barbecue and gathered her friends together.",
     "question": "How would Others feel as a result?", "answerA": "like attending",
     "answerB": "like staying home", "answerC": "a good friend to have", "label": "1"},
]
BOOLQ = [
    {"question": "do iran and afghanistan speak the same language",
     "passage": "Persian language -- Persian is a Western Iranian language.", "idx": 0, "label": 1},
]
OPENBOOKQA = [
    {"id": "7-980", "question_stem": "The sun is responsible for",
     "choices": {"text": ["puppies learning new tricks", "children growing up and getting old",
                          "flowers wilting in a vase", "plants sprouting, blooming and wilting"],
                 "label": ["A", "B", "C", "D"]}, "answerKey": "D"},
]
WIKITEXT = [
    {"page": " = Robert Boulter = \n Robert Boulter is an English film , television and theatre actor . He had "
             "a guest @-@ starring role on the television series The Bill in 2000 . \n"},
]


def write_piqa_task(tasks, docs) -> None:
    """A local lm-eval task `mypiqa` in folder `tasks` (created): the PIQA-format `docs` as JSON Lines and the
    task's YAML (multiple choice between sol1 / sol2, acc and acc_norm), for `--include_path tasks`: lm-eval
    reads nothing from the network."""
    tasks.mkdir()
    (tasks / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tasks / "mypiqa.yaml").write_text(textwrap.dedent(f"""\
        task: mypiqa
        dataset_path: json
        dataset_kwargs:
          data_files:
            validation: {tasks / 'docs.jsonl'}
        output_type: multiple_choice
        validation_split: validation
        doc_to_text: "Question: {{{{goal}}}}\\nAnswer:"
        doc_to_target: label
        doc_to_choice: "{{{{[sol1, sol2]}}}}"
        metric_list:
          - metric: acc
          - metric: acc_norm
        metadata:
          version: 1.0
        """))
