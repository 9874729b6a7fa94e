"""The config reference: every key of `base_config()` with its default and meaning (docs/config.md is generated).

    python -m idattn.configs.reference --out=docs/config.md      # regenerate after adding or changing a key

Defaults are read from `base_config()` itself, so they cannot drift; the meanings live in DESCRIPTIONS below, one
per key, and tests/test_config_reference.py fails when a key has none (or a description names no key), and when
docs/config.md differs from what this module renders. Any key is set on the command line as
`--config.<section>.<key>=<value>`.
"""
from __future__ import annotations

import argparse
import sys

from idattn.configs import base_config

SECTIONS = {
    "seed": "Top level",
    "model": "model (idattn.models, docs/model.md)",
    "data": "data (idattn.data, docs/data.md)",
    "train": "train (idattn.train, docs/training.md)",
    "mesh": "mesh (idattn.train.sharding, docs/pods.md)",
    "logical_axis_rules": "Top level",
}

DESCRIPTIONS = {
    "seed": "Initialisation seed of the parameters (and of the embedded corpus's shuffle when unset there).",
    "logical_axis_rules": "Logical axis name -> mesh axis for every parameter and activation annotation (FSDP over "
                          "the embedding, tensor parallelism over heads / MLP, `length` over `sequence`).",
    # ---- model
    "model.vocab_size": "Vocabulary size of the embedding and the output head: at least the tokenizer's size "
                        "(refused below it; rows above it are never used, and the start-up log says how many).",
    "model.d_model": "Residual stream width d.",
    "model.num_layers": "Number of blocks (mixer + SwiGLU).",
    "model.num_heads": "Heads H of the mixer.",
    "model.head_dim": "Width d_h per head (also the Interdomain feature width R).",
    "model.ffn_dim": "Hidden width of the SwiGLU MLP.",
    "model.mixer": "Token mixer: softmax | swa | interdomain | s4d_only | a cube cell <input>-<readout>-<rope>, "
                   "optionally with a core suffix -selective / -selective+phase and, for the query readout, a "
                   "delta suffix -delta / -delta2 after it (the erase's scale s = 1 / 2).",
    "model.layer_pattern": "Hybrid stack: comma-separated mixer names repeated to the depth ('' = every layer is "
                           "`mixer`).",
    "model.window": "Tokens a `swa` (sliding-window attention) layer sees, itself included.",
    "model.input": "Interdomain input: dualkv (k through ξ, v) | generic (two convolved projections); set from "
                   "`mixer`.",
    "model.readout": "Interdomain readout: query | linear; set from `mixer`.",
    "model.rope": "RoPE on the key-side input and the query; set from `mixer`.",
    "model.output_gate": "Multiply the mixer output by σ(W_g x) before W_O.",
    "model.linear_contraction": "Linear readout's c_h: mean (default) or sum over the modes of C_h.",
    "model.conj": "Read the conjugate-symmetric real part of the complex state (the operator's default).",
    "model.theory": "The paper's dense HiPPO-LegS derivation instead of S4D (dualkv + query; no decoding).",
    "model.num_modes": "Complex S4D modes M per head (the state is M x (R + d_h) per head and layer).",
    "model.s4d_init": "Initialisation of A: inv | lin | legs | inv_paper.",
    "model.kappa": "Decay bound Re(Δ·A) >= -κ of the LTI core.",
    "model.dt_min": "Lower end of the log-uniform Δ initialisation.",
    "model.dt_max": "Upper end of the log-uniform Δ initialisation.",
    "model.rope_base": "RoPE base frequency.",
    "model.short_conv": "Width K of the causal short convolutions.",
    "model.impl": "Interdomain operator implementation: auto | chunked | sequential | associative | pallas.",
    "model.chunk_size": "Chunk length L of the chunked form and the kernels.",
    "model.attn_impl": "Softmax attention implementation: auto | xla | cudnn | pallas_tpu.",
    "model.norm_eps": "Epsilon of RMSNorm and the per-head norms.",
    "model.init_std": "Standard deviation of the input projections' and embedding's initialisation.",
    "model.dtype": "Compute dtype (bfloat16 | float32); the state and accumulation stay float32.",
    "model.param_dtype": "Storage dtype of the parameters (and AdamW moments).",
    "model.scan_layers": "Scan over the (repeated group of) layers: compile time flat in depth.",
    "model.remat": "Rematerialisation of the block in the backward: none | full | dots.",
    # ---- data
    "data.source": "kjv (the embedded corpus) | arrayrecord (a prepared folder, `data.path`) | tfds.",
    "data.path": "Folder of prepared ArrayRecord shards (source=arrayrecord; python -m idattn.data.prepare).",
    "data.tfds_name": "TFDS dataset name (source=tfds).",
    "data.tfds_train_split": "TFDS split trained on.",
    "data.tfds_val_split": "TFDS split validated on.",
    "data.tokenizer": "mistral (the offline 32K model) | a SentencePiece .model path | train:<vocab> (on the "
                      "embedded text).",
    "data.seq_len": "Training context T in tokens per row.",
    "data.shuffle_seed": "Seed of the document order.",
    "data.num_workers": "Grain worker processes (0: in the trainer's process).",
    "data.prefetch": "Batches prefetched ahead of the step.",
    "data.val_fraction": "Embedded corpus: share of documents held out for validation.",
    "data.packing": "concat (the document stream cut every seq_len) | pad (every row starts a document).",
    # ---- train
    "train.batch_size": "Global sequences per optimiser step.",
    "train.grad_accum": "Microbatches accumulated per step (batch_size / grad_accum rows at a time).",
    "train.total_tokens": "Training tokens; num_steps is derived from it when num_steps = -1.",
    "train.num_steps": "Optimiser steps (-1: total_tokens / (batch_size x seq_len)).",
    "train.peak_lr": "Peak learning rate after warmup.",
    "train.end_lr": "Learning rate at the end of the schedule.",
    "train.warmup_tokens": "Warmup length in tokens; warmup_steps is derived from it when warmup_steps = -1.",
    "train.warmup_steps": "Linear warmup steps (-1: from warmup_tokens).",
    "train.weight_decay": "AdamW weight decay (not on the SSM group, norms or biases).",
    "train.grad_clip": "Global gradient-norm clip.",
    "train.b1": "AdamW β1.",
    "train.b2": "AdamW β2.",
    "train.eps": "AdamW ε.",
    "train.ssm_lr_cap": "The SSM parameters' learning rate is min(peak_lr, cap), without weight decay (the paper's "
                        "1e-3).",
    "train.log_every": "Steps between log lines (loss, tokens/s, MFU) and metrics.jsonl records.",
    "train.eval_every": "Steps between validations (0: at the end only).",
    "train.eval_batches": "Validation batches per evaluation.",
    "train.checkpoint_every": "Steps between checkpoints.",
    "train.keep_last": "Most recent checkpoints kept.",
    "train.keep_every": "Also keep every checkpoint whose step is a multiple of this (0: none).",
    "train.async_checkpoint": "Save checkpoints in the background while training continues.",
    "train.init_from": "Workdir of another run to initialise the parameters from (fresh optimiser, step 0).",
    "train.loss_chunk": "Positions per chunk of the token loss (0: from the full logits).",
    "train.peak_tflops_per_device": "MFU denominator in TFLOP/s (0: looked up from the device kind).",
    "train.wandb_project": "Weights & Biases project to log every metrics record to ('' = no tracker; needs "
                           "pip install -e \".[wandb]\").",
    "train.wandb_mode": "offline (written under <workdir>/wandb, `wandb sync` later) | online.",
    "train.wandb_entity": "W&B team or user ('' = the account's default).",
    "train.schedule": "cosine (the paper's) | wsd (warmup-stable-decay: extendable and branchable).",
    "train.decay_steps": "WSD: steps of the final decay (-1: decay_fraction x num_steps).",
    "train.decay_fraction": "WSD: share of the steps in the decay.",
    "train.wsd_shape": "WSD decay shape: 1-sqrt | linear.",
    "train.allow_schedule_change": "Accept a resume whose LR schedule differs from the saved run's.",
    "train.allow_data_change": "Accept a resume with another data.source / data.path than the saved run's, or "
                               "other data at the same path (recorded in identity.json's history).",
    "train.allow_tokenizer_change": "Accept a resume whose tokenizer has other content than the run's first start's "
                                    "(the same data.tokenizer name, another file; recorded in identity.json).",
    "train.branch_from": "<workdir>[:<step>]: start from that run's full state (a WSD decay branch).",
    "train.checkpoint_steps": "Steps always saved and never rotated away (branch points of a WSD trunk).",
    "train.max_bad_steps": "Non-finite steps dropped before the run stops (0: stop at the first).",
    "train.checkpoint_fallback": "A damaged latest checkpoint falls back to the newest one that verifies.",
    "train.keep_best": "Keep the best-of-run parameters by validation loss in <workdir>/best.",
    "train.lease_heartbeat_s": "Workdir lease heartbeat period in seconds.",
    "train.lease_stale_s": "A lease not renewed for this long is a dead trainer's (written into the lease).",
    "train.stall_minutes": "No step finished for this many minutes after the first (compilation): every thread's "
                           "Python stack goes to stderr and the process exits with status 1, so that the rerun "
                           "resumes from the last committed checkpoint instead of hanging silently (0: off).",
    "train.checkpoint_minutes": "Also save after this many minutes of wall time since the last save (0: off).",
    "train.restart_from_scratch": "Train a workdir with history from step 0 when none of its checkpoints restores "
                                  "(explicit only).",
    # ---- mesh
    "mesh.data": "Data-parallel replicas.",
    "mesh.fsdp": "Fully sharded data parallelism (-1: every device left over).",
    "mesh.sequence": "Devices a sequence is split over (long context; states passed between shards).",
    "mesh.tensor": "Tensor parallelism over heads and the MLP.",
}


def leaves(config, prefix: str = "") -> list[tuple[str, object]]:
    """[(dotted key, default)] of every leaf of `config`, in its own order."""
    out = []
    for k, v in config.items():
        if hasattr(v, "items"):
            out += leaves(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def missing_and_stale() -> tuple[list[str], list[str]]:
    keys = [k for k, _ in leaves(base_config())]
    return [k for k in keys if k not in DESCRIPTIONS], [k for k in DESCRIPTIONS if k not in keys]


def _default(v) -> str:
    if isinstance(v, tuple) and v and isinstance(v[0], tuple):
        return "see idattn/configs/__init__.py (DEFAULT_LOGICAL_AXIS_RULES)"
    return f"`{v!r}`" if not isinstance(v, str) else (f"`{v!r}`" if v else "`''`")


def render() -> str:
    missing, stale = missing_and_stale()
    if missing or stale:
        raise ValueError(f"idattn/configs/reference.py: keys without a description {missing}; descriptions of no "
                         f"key {stale}. Add or remove them in DESCRIPTIONS.")
    rows: dict[str, list[str]] = {}
    for key, value in leaves(base_config()):
        section = SECTIONS[key.split(".")[0]]
        meaning = DESCRIPTIONS[key].replace("|", "\\|")  # a choice list's bars must not split the table's cells
        rows.setdefault(section, []).append(f"| `{key}` | {_default(value)} | {meaning} |")
    parts = ["# Config reference", "",
             "**What you do**: set any key below on a command that takes an experiment config, as "
             "`--config.<key>=<value>` (for example `--config.model.mixer=softmax`), and check the result with "
             "`python -m idattn.train ... --check_only`, which prints whether the config would start. **What you "
             "get** here: every key with its default and meaning, by section; the experiment configs "
             "(`experiments/*.py`) change some defaults.", "",
             "Generated by `python -m idattn.configs.reference --out=docs/config.md` from `base_config()` (the "
             "defaults) and `idattn/configs/reference.py` (the meanings); do not edit by hand.", ""]
    for section, lines in rows.items():
        parts += [f"## {section}", "", "| key | default | meaning |", "|---|---|---|", *lines, ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="", help="write here (default: stdout)")
    a = p.parse_args(argv)
    text = render()
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
