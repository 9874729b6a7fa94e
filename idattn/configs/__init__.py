"""The one config schema every experiment file fills in.

`base_config()` returns an ml_collections ConfigDict with every key the model, data pipeline and trainer read,
at the defaults of the paper's recipe (docs/model.md, docs/data.md, docs/training.md). The experiment recipes live beside it in this package
(`idattn/configs/scaling.py`, `quickstart.py`, `repro.py`, `mqar.py`, `sweeps/*.py`); `experiments/*.py` in a
source checkout are the documented `--config=` paths and re-export them. The command line overrides again with
`--config.key=value`.

`resolve_config_arg("experiments/scaling.py:softmax,tiny")` maps a config path that does not exist where the
command runs (an installed wheel, another folder) to the packaged recipe of the same name, so every documented
`--config=experiments/<file>.py[:arg]` works from anywhere.

Sections:
  model   read by idattn.models (sizes, mixer and its switches, dtypes, remat)
  data    read by idattn.data (source, paths, tokenizer, packing)
  train   read by idattn.train (batch, steps, optimiser, schedule, logging, checkpoints)
  mesh    named mesh axis sizes (-1 fills the remaining devices)
  logical_axis_rules  logical parameter/activation axis -> mesh axes
"""
from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import sys

import ml_collections

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class ConfigError(ValueError):
    """A config key or value is wrong; the message is the one line the user sees."""


def packaged_config(name: str) -> str:
    """Path of a packaged recipe: "scaling" or "scaling.py" or "sweeps/cpu_isoflop.py"."""
    name = name if name.endswith(".py") else name + ".py"
    return os.path.join(PACKAGE_DIR, name)


def resolve_config_arg(spec: str) -> str:
    """`<file>.py[:arg]` unchanged when the file exists; else the packaged recipe it names (experiments/<x>.py,
    idattn/configs/<x>.py or <x>.py, sweeps/ included), else unchanged (the caller's error names it)."""
    path, sep, arg = str(spec).partition(":")
    if not path.endswith(".py") or os.path.exists(path):
        return spec
    parts = path.replace("\\", "/").split("/")
    for anchor in ("experiments", "configs"):
        if anchor in parts:
            parts = parts[len(parts) - parts[::-1].index(anchor):]
            break
    candidate = os.path.join(PACKAGE_DIR, *parts)
    return candidate + sep + arg if os.path.isfile(candidate) else spec


def resolve_argv(argv: list[str]) -> list[str]:
    """argv with every `--config=<file>.py[:arg]` passed through resolve_config_arg (absl CLIs)."""
    out = []
    for a in argv:
        if a.startswith("--config=") and ".py" in a:
            a = "--config=" + resolve_config_arg(a[len("--config="):])
        out.append(a)
    return out

def load_config_file(spec: str):
    """`path.py[:arg]` -> the ConfigDict of its get_config(arg) (a packaged recipe when the path is not here)."""
    path, _, arg = resolve_config_arg(spec).partition(":")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--config={spec!r}: no file {path!r}; expected experiments/<file>.py[:<arg>].")
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    mod_spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.get_config(arg) if arg else mod.get_config()


def apply_overrides(config, sets: list[str]):
    """Each "KEY=VALUE" (eval's --set, the bench's overrides): the value is parsed as a Python literal when it is one (ints, floats, bools), else kept
    as a string; the key must exist (refused with the keys that do, and the closest one)."""
    for item in sets:
        key, eq, raw = item.partition("=")
        if not eq:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. model.impl=chunked")
        try:
            val = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            val = raw
        node, path = config, []
        *parents, leaf = key.split(".")
        for i, p in enumerate(parents + [leaf]):
            if p not in node:
                near = difflib.get_close_matches(p, list(node.keys()), n=1)
                hint = f"; did you mean {'.'.join(path + near)!r}?" if near else ""
                raise ConfigError(f"--set {key}: no config key {'.'.join(path + [p])!r}{hint} (keys there: "
                                f"{', '.join(sorted(node.keys()))})")
            if i < len(parents):
                node = node[p]
                path.append(p)
        node[leaf] = val
    return config


# Logical axis names used by every parameter annotation (`idattn.layers.common.param`; the trainer places them,
# idattn/train/sharding.py) and their default mesh mapping: FSDP over the embedding axis, tensor parallelism over heads / MLP hidden.
# Activations: "batch" over the batch shards, their feature axis ("act_embed") whole on every chip, the logits'
# vocabulary ("act_vocab") and the heads of per-head activations ("act_heads") over tensor.
DEFAULT_LOGICAL_AXIS_RULES = (
    ("batch", ("data", "fsdp")),
    ("act_embed", None),
    ("act_vocab", "tensor"),
    ("act_heads", "tensor"),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("modes", None),
    ("layers", None),
    ("length", "sequence"),  # the tokens of a sequence (config.mesh.sequence > 1 splits them; ops/sequence.py)
    ("conv", None),
)


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 42

    # ---- model (owned by idattn.models; see idattn/models/__init__.py for the meaning of each key) ----
    c.model = ml_collections.ConfigDict()
    m = c.model
    m.vocab_size = 32000
    m.d_model = 768
    m.num_layers = 12
    m.num_heads = 12
    m.head_dim = 64
    m.ffn_dim = 2048
    m.mixer = "interdomain"  # softmax | swa | interdomain | s4d_only | <input>-<readout>-<rope> cube cell
    # Hybrid stacks (docs/model.md "Hybrid stacks"): comma-separated mixer names repeated to the depth,
    # e.g. "interdomain,interdomain,interdomain,softmax" (num_layers a multiple of its length). "" = every layer is
    # `mixer` (checkpoints and counts unchanged). `window`: tokens a `swa` (sliding-window attention) layer sees.
    m.layer_pattern = ""
    m.window = 0
    m.input = "dualkv"  # dualkv | generic      (filled from `mixer` by the experiment configs)
    m.readout = "query"  # query | linear
    m.rope = True
    m.output_gate = False
    m.linear_contraction = "mean"  # linear readout: c_h = mean | sum over modes of C_h (paper silent; docs/model.md)
    m.conj = True
    m.theory = False  # LegS operator with the Nadaraya-Watson denominator (docs/model.md, theory mode)
    m.num_modes = 64
    m.s4d_init = "inv"  # inv | lin | legs | inv_paper
    m.kappa = 0.25
    m.dt_min = 1e-3
    m.dt_max = 1e-1
    m.rope_base = 10000.0
    m.short_conv = 4
    m.impl = "auto"  # operator implementation: auto | chunked | sequential | associative | pallas
    m.chunk_size = 64
    m.attn_impl = "auto"  # softmax attention: auto | xla | cudnn | pallas_tpu
    m.norm_eps = 1e-5
    m.init_std = 0.02
    m.dtype = "bfloat16"  # compute dtype
    m.param_dtype = "float32"
    m.scan_layers = True
    m.remat = "full"  # none | full | dots

    # ---- data (owned by idattn.data) ----
    c.data = ml_collections.ConfigDict()
    d = c.data
    d.source = "kjv"  # kjv (embedded corpus) | arrayrecord (prepared shards) | tfds
    d.path = ""  # folder of prepared ArrayRecord shards (source=arrayrecord)
    d.tfds_name = ""
    d.tfds_train_split = "train"
    d.tfds_val_split = "validation"
    d.tokenizer = "mistral"  # "mistral" (offline 32K Llama-2-compatible model) | path to a .model | "train:<vocab>"
    d.seq_len = 4096
    d.shuffle_seed = 0
    d.num_workers = 0
    d.prefetch = 2
    d.val_fraction = 0.05  # embedded corpus: share of documents held out
    d.packing = "concat"  # concat (cut the document stream every seq_len) | pad (docs start rows; see docs/data.md)

    # ---- train (owned by idattn.train) ----
    c.train = ml_collections.ConfigDict()
    t = c.train
    t.batch_size = 128  # global sequences per optimiser step
    t.grad_accum = 1
    t.total_tokens = 2_500_000_000
    t.num_steps = -1  # -1: derive from total_tokens / (batch_size * seq_len)
    t.peak_lr = 3e-3
    t.end_lr = 1e-5
    t.warmup_tokens = 375_000_000
    t.warmup_steps = -1  # -1: derive from warmup_tokens
    t.weight_decay = 0.1
    t.grad_clip = 1.0
    t.b1 = 0.9
    t.b2 = 0.95
    t.eps = 1e-8
    t.ssm_lr_cap = 1e-3  # SSM group LR = min(peak, cap), no weight decay
    t.log_every = 10
    t.eval_every = 1000
    t.eval_batches = 16
    t.checkpoint_every = 1000
    t.keep_last = 3
    t.keep_every = 0  # 0: keep none beyond the last N
    t.async_checkpoint = True
    t.init_from = ""  # workdir of another run to initialise parameters from (explicit, never implicit)
    t.loss_chunk = 512  # token loss computed this many positions at a time (0: from full logits); see models/llama.py
    t.peak_tflops_per_device = 0.0  # MFU denominator; 0: look up the device kind (idattn.train.metrics)
    t.wandb_project = ""  # Weights & Biases project beside TensorBoard ('' = none; idattn/train/tracker.py)
    t.wandb_mode = "offline"  # offline (under <workdir>/wandb, `wandb sync` later) | online
    t.wandb_entity = ""  # W&B team or user ('' = the account's default)
    t.schedule = "cosine"  # cosine (the paper's) | wsd (warmup-stable-decay: extendable, branchable; train/optim.py)
    t.decay_steps = -1  # wsd: steps of the final decay; -1: round(decay_fraction * num_steps)
    t.decay_fraction = 0.2  # wsd: share of the steps in the decay (Hägele et al. 2024: ~20% matches cosine)
    t.wsd_shape = "1-sqrt"  # wsd decay shape: 1-sqrt | linear
    t.allow_schedule_change = False  # resume with a changed LR schedule (num_steps, peak_lr, ...): explicit only
    t.allow_data_change = False  # resume with another data.path / data.source than the saved run's: explicit only
    #   (the checkpoint's data position is a stream index; in other data it continues at an unrelated document),
    #   and with other content at the same path (a folder prepared again in place: its shard checksums differ)
    t.allow_tokenizer_change = False  # resume with another tokenizer file at the same data.tokenizer: explicit only
    t.branch_from = ""  # "<workdir>[:<step>]": start from that run's full state (a WSD decay branch)
    t.checkpoint_steps = ()  # extra steps always saved and never rotated away (branch points of a WSD trunk)
    t.max_bad_steps = 0  # non-finite steps (loss / grad norm / update) dropped before the run stops
    t.checkpoint_fallback = True  # a damaged latest checkpoint: fall back to the newest one that verifies
    t.keep_best = True  # keep the best-of-run parameters by validation loss in <workdir>/best (never rotated)
    t.lease_heartbeat_s = 30.0  # workdir lease: heartbeat period (train/lease.py)
    t.lease_stale_s = 600.0  # workdir lease: this run's lease not renewed for this long is a dead trainer's (written
    #   into the lease: a later trainer judges this run by this value, never by its own)
    t.stall_minutes = 60.0  # no step finished for this long (after the first): stacks to stderr, exit 1 (0: off)
    t.checkpoint_minutes = 0.0  # also save when this many minutes of wall time passed since the last save (0: off):
    #   bounds what a preemption without warning loses
    t.restart_from_scratch = False  # a workdir that has committed checkpoints but none restores: start at step 0
    #   anyway (explicit only; the refusal names checkpoints.rejected/ and how to restore from it)

    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, sequence=1, tensor=1))
    c.logical_axis_rules = DEFAULT_LOGICAL_AXIS_RULES
    return c
