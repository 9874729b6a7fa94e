"""The training loop (docs/training.md): `run(config, workdir)` is what `python -m idattn.train` calls.

Order of work, so that a refused start writes nothing:
  1. check every config value (idattn.train.validate), derive the schedule (num_steps, warmup_steps), check
     that the workdir can be written;
  2. load the tokenizer, check it against model.vocab_size and (prepared data) the data's tokenizer; open and
     count every prepared shard;
  3. if the workdir holds a run: compare its saved config (model section and data.tokenizer must match; a
     changed LR schedule only with train.allow_schedule_change);
  4. build the mesh and check that it divides the batch;
  5. only then create the workdir, take its lease (one trainer per workdir, train/lease.py), build/restore the
     state (verified, falling back past damaged checkpoints; a shape mismatch or a workdir that committed before
     but has nothing to restore is refused), and only once that passed write config.json, reconcile
     metrics.jsonl with the checkpoint's copy, and train (or finish what a finished run owes).

Faults (docs/training.md, "Faults and what survives them"): a non-finite step is never applied (train/step.py)
and stops the run unless train.max_bad_steps allows dropping it; a failed checkpoint save or metrics write stops
the run at the next step naming the last committed checkpoint; every write is fenced by the lease (a trainer that
was taken over stops before it writes again); SIGTERM and a first SIGINT save at the next step boundary.

State placement (the pjit pattern): the model's boxed parameters are traced with `jax.eval_shape`, their logical
axis names mapped to mesh shardings with `config.logical_axis_rules`, and the state is created by a `jax.jit`
with those `out_shardings`; the train step is jitted with in/out shardings and the state donated.
"""
from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.experimental import multihost_utils

from idattn import models
from idattn.configs import base_config
from idattn.data import formats, stdlib_corpus, tokenizer as tok_lib
from idattn.rundir import layout, loading
from idattn.rundir.schema import read_results, write_result
from idattn.train import checkpoint as ckpt
from idattn.train import lease as lease_lib
from idattn.train import metrics as metrics_lib
from idattn.train import optim
from idattn.train import sharding as shd
from idattn.train import tracker as tracker_lib
from idattn.train import validate
from idattn.train.plan import RunPlan
from idattn.train.step import BATCH_KEYS, TrainState, make_eval_step, make_train_step

# Keys that must not change when a run resumes (the checkpoint would not match them).
_RESUME_LOCKED = ("model", "data.tokenizer")
# Keys that must not change when a run with checkpoints resumes unless train.allow_data_change: the checkpoint's
# data position is a stream index into this data (in another corpus it would land on an unrelated document).
_DATA_LOCKED = ("data.source", "data.path")


def _pipeline():
    """idattn.data.pipeline, imported when a run first reads data: it needs grain, which the model-only paths
    (`build_setup` for `python -m idattn.bench model` and the AOT twin) do not, so they run on images without it."""
    from idattn.data import pipeline
    return pipeline


class TrainingError(RuntimeError):
    """A run stopped for a reason the user must act on (non-finite loss, refused resume, ...)."""


def log(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


# ------------------------------------------------------------------------------------------------- schedule
def derive_steps(config) -> tuple[int, int, int]:
    """(num_steps, warmup_steps, tokens_per_step) of `config` (idattn.train.plan: checks every value first)."""
    p = RunPlan.from_config(config)
    return p.num_steps, p.warmup_steps, p.tokens_per_step


# ---------------------------------------------------------------------------------------------- refusals
def _same_parameter_shapes(saved_model, live_model) -> bool:
    """True when both model configs build the same parameter tree (names and shapes; `jax.eval_shape`, nothing
    allocated): the condition for train.init_from to load one into the other."""
    def tree(m):
        model = models.build_model(m)
        boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"])
        return jax.tree_util.tree_map(lambda a: tuple(a.shape), nn.meta.unbox(boxed))

    try:
        return tree(saved_model) == tree(live_model)
    except Exception:  # a saved config this version cannot build: do not suggest loading it
        return False


def load_saved_config(workdir: str):
    """The run's saved config.json, checked like a command's config; a damaged or hand-edited file is refused
    naming the file and the key (not the command's flags, which may not have set it)."""
    path = os.path.join(workdir, layout.CONFIG_FILE)
    try:
        saved = layout.load_config(workdir)
    except ValueError as e:
        raise TrainingError(f"refusing to resume {workdir}: {e}") from None
    try:
        validate.check_values(saved)
        derive_steps(saved)
    except (validate.ConfigError, ValueError, KeyError, TypeError) as e:
        first = _first_line(e).split("; set --config.")[0].split("; add --config.")[0]
        raise TrainingError(f"refusing to resume {workdir}: its saved config {path} is invalid ({first}); the "
                            f"file was changed after the run wrote it, not by this command's flags: restore the "
                            f"value the run was trained with in {path}") from None
    return saved


def _new_key_at_default(key: str, saved, live) -> bool:
    """A key a later version added (absent from the saved config.json) whose live value is its default: the run
    was trained with that behaviour, so it is no change (a new model key must default to the old behaviour)."""
    if saved != "<missing>":
        return False
    node = layout.config_to_dict(base_config())
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return node == live


def check_resume_compatible(workdir: str, config) -> dict | None:
    """Refuses a changed model config / tokenizer against the run saved in `workdir`, a changed data.path /
    data.source unless train.allow_data_change, and a changed LR schedule unless train.allow_schedule_change.
    Returns the other diffs (None: no saved run)."""
    path = os.path.join(workdir, layout.CONFIG_FILE)
    if not os.path.exists(path):
        if layout.committed_steps(workdir):
            raise TrainingError(f"refusing to resume {workdir}: it holds checkpoints "
                                f"{layout.committed_steps(workdir)} but no {layout.CONFIG_FILE}, so the model config "
                                f"cannot be checked; restore the file or use a new --workdir")
        return None
    saved_config = load_saved_config(workdir)
    saved = layout.config_to_dict(saved_config)
    live = layout.config_to_dict(config)
    diffs = [d for d in layout.diff_dicts(saved, live) if not _new_key_at_default(*d)]
    locked = [d for d in diffs if any(d[0] == k or d[0].startswith(k + ".") for k in _RESUME_LOCKED)]
    if locked:
        lines = "\n".join(f"    {k}: saved {a!r}, now {b!r}" for k, a, b in locked)
        if _same_parameter_shapes(saved_config.model, config.model):
            start = f"(to start from this run's parameters use --config.train.init_from={workdir})"
        else:  # init_from needs the same parameter tree; a new size or mixer starts fresh
            start = "(its parameters do not fit the new model, so it starts from scratch there)"
        raise TrainingError(
            f"refusing to resume {workdir}: its checkpoints were trained with a different config:\n{lines}\n"
            f"  Fix: rerun with the saved values (see {path}), or use a new --workdir {start}.")
    steps = layout.committed_steps(workdir)
    moved = [(k, a, b) for k, a, b in diffs if k in _DATA_LOCKED and not (
        k == "data.path" and a and b and os.path.realpath(str(a)) == os.path.realpath(str(b)))]
    if moved and steps and not bool(config.train.get("allow_data_change", False)):
        what = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, a, b in moved)
        raise TrainingError(
            f"refusing to resume {workdir}: its checkpoints hold a position in other data ({what}). Rerun with the "
            f"saved value (see {path}), start a new --workdir (--config.train.init_from={workdir} starts from this "
            f"run's parameters), or add --config.train.allow_data_change=true to continue this run on the new data "
            f"(the same folder moved keeps its position; another corpus continues at an unrelated document).")
    if moved and steps:
        log("warning: the data changed under the run (" + "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in moved)
            + "), allowed by train.allow_data_change")
    jump = check_schedule_change(saved_config, config, steps[-1] if steps else None)
    if jump and not bool(config.train.get("allow_schedule_change", False)):
        raise TrainingError(
            f"refusing to resume {workdir}: {jump}. To accept the jump, add "
            f"--config.train.allow_schedule_change=true; to extend a run without one, train with "
            f"--config.train.schedule=wsd from the start (its stable phase extends), or start a new --workdir "
            f"from this run's parameters (--config.train.init_from={workdir}).")
    if jump:
        log(f"warning: {jump} (allowed by train.allow_schedule_change)")
    return {k: (a, b) for k, a, b in diffs}


def current_identity(config, tokenizer) -> dict:
    """The content this start trains on: the tokenizer's {"spec", "vocab_size", "sha256"} and the data's
    idattn.data.formats.data_identity."""
    tok = dict(tokenizer.identity()) if hasattr(tokenizer, "identity") else {"vocab_size": _vocab_size(tokenizer),
                                                                            "sha256": None}
    tok["spec"] = str(config.data.tokenizer)
    try:
        data = formats.data_identity(config.data)
    except (OSError, ValueError, KeyError) as e:  # the start's own data checks name the problem
        data = {"source": str(config.data.get("source", "")), "error": _first_line(e)}
    return {"tokenizer": tok, "data": data}


def check_config_edits(workdir: str) -> None:
    """Refuses, before anything is written, a run whose config.json was edited by hand after the trainer wrote it
    (identity.json keeps the config as written), naming each edited key with both values. Runs first: an edit
    would otherwise surface as a schedule or model change the operator did not ask for on the command line."""
    saved = layout.read_identity(workdir)
    if saved is None or not layout.committed_steps(workdir):
        return
    path = os.path.join(workdir, layout.CONFIG_FILE)
    written = saved.get("config")
    if isinstance(written, dict) and os.path.exists(path):
        on_disk = layout.config_to_dict(load_saved_config(workdir))
        edits = layout.diff_dicts(written, on_disk)
        if edits:
            what = "; ".join(f"{k}: written {a!r}, now {b!r}" for k, a, b in edits[:4])
            raise TrainingError(
                f"refusing to resume {workdir}: its {path} was edited after the run wrote it ({what}). Restore the "
                f"written value(s) in that file (the run trained with them); to change a value, pass it on the "
                f"command line as --config.<key>=<value> instead, where the resume checks it and records the change")


def check_identity(workdir: str, config, tokenizer) -> dict:
    """Refuses, before anything is written, a resume whose content is not the run's: a tokenizer file replaced at
    the same name (unless train.allow_tokenizer_change) and data whose shards differ at the same path (unless
    train.allow_data_change; a changed data.path was judged by check_resume_compatible and is only recorded).
    Only a run with committed checkpoints is held to its content (without one, nothing trained on it). Returns the
    identity.json to write once the start's checks pass (idattn.rundir.layout.read_identity), with an allowed
    change appended to its history."""
    import uuid

    now = current_identity(config, tokenizer)
    saved = layout.read_identity(workdir)
    steps = layout.committed_steps(workdir)
    if saved is None:
        if steps:
            log(f"recording {layout.IDENTITY_FILE} for {workdir} now (the run predates it): its tokenizer and data "
                f"are checked from this start on")
        return {"run_id": uuid.uuid4().hex, **now, "config": layout.config_to_dict(config), "history": []}
    history = list(saved.get("history") or [])
    if not steps:
        return dict(saved, **now, config=layout.config_to_dict(config), history=history)
    step = steps[-1]
    for kind, flag, fields in (("tokenizer", "allow_tokenizer_change", ("sha256", "vocab_size")),
                               ("data", "allow_data_change", ("source", "train", "val"))):
        old, new = saved.get(kind) or {}, now[kind]
        changed = [f for f in fields if old.get(f) is not None and new.get(f) is not None and old[f] != new[f]]
        if not changed:
            continue
        written = (saved.get("config") or {}).get("data") or {}
        moved = kind == "data" and (written.get("path"), written.get("source")) != (
            config.data.get("path"), config.data.get("source"))  # a new path: check_resume_compatible judged it
        name = (f"data.tokenizer={config.data.tokenizer!r}" if kind == "tokenizer" else
                f"the data at {config.data.get('path') or config.data.get('source')}")
        detail = ("another file (vocab_size {}, sha256 {}..., was {}, {}...)".format(
            new.get("vocab_size"), str(new.get("sha256"))[:12], old.get("vocab_size"), str(old.get("sha256"))[:12])
            if kind == "tokenizer" else f"other content ({', '.join(changed)} split(s) differ from the run's first "
                                        f"start: prepared again in place?)")
        if not bool(config.train.get(flag, False)) and not moved:
            raise TrainingError(
                f"refusing to resume {workdir} at step {step}: {name} is {detail}; its checkpoints were trained on "
                f"the content recorded in {os.path.join(workdir, layout.IDENTITY_FILE)}. Restore it, start a new "
                f"--workdir (--config.train.init_from={workdir} starts from this run's parameters), or add "
                f"--config.train.{flag}=true to continue on the new content (recorded in the run's history)")
        if not moved:
            log(f"warning: {name} is {detail}; continuing at step {step} (train.{flag}; recorded in "
                f"{layout.IDENTITY_FILE})")
        history.append({"step": step, "time": time.time(), "what": kind, "old": old, "new": new})
    return dict(saved, **now, config=layout.config_to_dict(config), history=history)


_SCHEDULE_KEYS = ("train.num_steps", "train.total_tokens", "train.warmup_steps", "train.warmup_tokens",
                  "train.peak_lr", "train.end_lr", "train.ssm_lr_cap", "train.schedule", "train.decay_steps",
                  "train.decay_fraction", "train.wsd_shape", "train.batch_size", "data.seq_len")


def lr_at(config, steps) -> np.ndarray:
    """The decay group's LR of `config` at each of `steps` (float64 numpy)."""
    num_steps, warmup, _ = derive_steps(config)
    fn = optim.schedule_fn(config.train, float(config.train.peak_lr), float(config.train.end_lr),
                           num_steps=num_steps, warmup_steps=warmup)
    return np.asarray(jax.device_get(jax.vmap(fn)(jnp.asarray(steps, jnp.int32))), np.float64)


def check_schedule_change(saved, live, resume_step: int | None) -> str | None:
    """None when resuming at `resume_step` keeps the LR of every step so far and of the next one (e.g. a WSD
    run extended in its stable phase); else a message with the jump. Refused unless
    train.allow_schedule_change (then the message is logged)."""
    if resume_step is None:
        return None
    s = int(resume_step)
    probe = np.unique(np.concatenate([np.linspace(0, s, num=min(s + 1, 512)).round(), [s]]).astype(np.int64))
    old, new = lr_at(saved, probe), lr_at(live, probe)
    bad = np.flatnonzero(~np.isclose(old, new, rtol=1e-6, atol=0.0))
    if bad.size == 0:
        return None
    i = int(bad[0])
    changed = [k for k, a, b in layout.diff_dicts(layout.config_to_dict(saved), layout.config_to_dict(live))
               if k in _SCHEDULE_KEYS]
    past = (f"; the steps already trained had other LRs too (step {int(probe[i])}: {old[i]:.3e}, new schedule "
            f"{new[i]:.3e})" if int(probe[i]) < s else "")
    return (f"the LR schedule changes under the run ({', '.join(changed) or 'schedule keys'}): the next update "
            f"(step {s}) would use LR {new[-1]:.3e} instead of {old[-1]:.3e}{past}")


DATA_FLAGS_HINT = ("--config.data.source=arrayrecord --config.data.path=<folder of prepared shards> (written by "
                   "`python -m idattn.data.prepare`, docs/data.md), or --config.data.source=kjv for a smoke run on "
                   "the embedded corpus")


def check_data_choice(config) -> None:
    """Paper-size configs leave data.source unset (experiments/scaling.py): they must not train on the embedded
    text by accident. Refused before anything is read or written, naming the flags to add."""
    source = str(config.data.get("source", "") or "")
    if not source:
        raise TrainingError("config.data.source is unset: this config trains on prepared data; add "
                            + DATA_FLAGS_HINT)
    if source == "arrayrecord" and not config.data.get("path"):
        raise TrainingError("config.data.source=arrayrecord needs the data folder: add "
                            "--config.data.path=<folder of prepared shards> (python -m idattn.data.prepare)")


def check_config(config) -> str:
    """What a launcher's dry run checks on the submitting machine, before a pod or a job is paid for: every value
    (RunPlan), the model (its spec and parameter count, by `jax.eval_shape`: nothing allocated), the data choice
    and the tokenizer. Data shards and the workdir are not read (they live on the cluster). Raises TrainingError
    with the one line a real run would print; returns a one-line summary."""
    try:
        plan = RunPlan.from_config(config)
        spec = models.spec_from_config(config.model)
        n = models.count_params(config.model)
    except (validate.ConfigError, ValueError) as e:
        raise TrainingError(str(e)) from e
    check_data_choice(config)
    source = str(config.data.source)
    if source != "arrayrecord":  # a prepared folder's tokenizer is checked where the folder is (at the start)
        try:
            tok_lib.load_tokenizer(config.data.tokenizer)
        except (ValueError, FileNotFoundError) as e:
            raise TrainingError(f"config.data.tokenizer={config.data.tokenizer!r} could not be loaded: {e}") from e
    where = f"{source} {config.data.get('path') or ''}".strip()
    return (f"config OK: {models.model_label(config.model)} ({spec.family}), {n:,} parameters, {plan.num_steps} "
            f"steps x {plan.batch_size} x {int(config.data.seq_len)} tokens, data {where}")


def describe_data(config, tokenizer) -> str:
    """One line for the start-up banner: source, path, tokenizer and the training tokens available."""
    d = config.data
    source = str(d.source)
    tokens = "n/a"
    try:
        if source == "arrayrecord":
            meta = formats.read_meta(d.path)
            tokens = f"{int(meta.get('train_tokens', 0)):,} train / {int(meta.get('val_tokens', 0)):,} val tokens"
        elif source == "kjv":
            docs = _pipeline().kjv_token_docs(tokenizer, "train", float(d.val_fraction))
            tokens = (f"{sum(len(x) for x in docs):,} train tokens (the embedded KJV text; a smoke-test corpus, not "
                      f"the paper's data)")
        elif source == "stdlib":
            docs = _pipeline().stdlib_token_docs(tokenizer, "train")
            tokens = f"{sum(len(x) for x in docs):,} train tokens ({stdlib_corpus.corpus_id()})"
    except Exception as e:  # informative only
        tokens = f"n/a ({type(e).__name__}: {e})"
    path = d.path if source == "arrayrecord" else (d.get("tfds_name", "") if source == "tfds" else "(embedded)")
    vocab, rows = _vocab_size(tokenizer), int(config.model.vocab_size)
    unused = f"; model.vocab_size {rows}: {rows - vocab} rows never used" if vocab is not None and rows > vocab else ""
    return (f"  data: source {source}, path {path or '-'}, tokenizer {d.tokenizer} ({vocab} pieces{unused}), "
            f"{tokens}")


def check_tokenizer(config, tokenizer, data_mod) -> None:
    vocab = _vocab_size(tokenizer)
    if vocab is not None and vocab > int(config.model.vocab_size):
        raise TrainingError(f"config.data.tokenizer={config.data.tokenizer!r} has {vocab} tokens but "
                            f"config.model.vocab_size={config.model.vocab_size}; set --config.model.vocab_size={vocab}"
                            f" (or larger) or use a smaller tokenizer")
    if config.data.source == "arrayrecord":
        if not config.data.path:
            raise TrainingError("config.data.source='arrayrecord' needs config.data.path (folder of prepared shards)")
        try:
            data_mod.check_tokenizer_matches(config.data.path, tokenizer)
        except (ValueError, FileNotFoundError) as e:
            raise TrainingError(f"refusing to train on {config.data.path}: {e}") from e


def _vocab_size(tokenizer) -> int | None:
    for name in ("vocab_size", "n_vocab"):
        v = getattr(tokenizer, name, None)
        if v is not None:
            return int(v() if callable(v) else v)
    return None


# ------------------------------------------------------------------------------------------------- estimates
def hbm_estimate(n_params: int, config, mesh) -> dict[str, float]:
    """Rough per-device bytes: fp32 params + grads + 2 Adam moments (sharded over fsdp x tensor), and activations
    of one microbatch (sharded over data x fsdp): with remat, the residual stream per layer (compute dtype) plus
    one layer's working set (~ 10 d + 3 ffn + 4 H d_h values per token) plus float32 logits and their gradient
    (of one train.loss_chunk of positions when the loss is chunked)."""
    m = config.model
    plan = RunPlan.from_config(config)
    n_dev = mesh.size
    param_shards = mesh.shape["fsdp"] * mesh.shape["tensor"]
    cbytes = 2 if str(m.dtype) in ("bfloat16", "float16") else 4
    params = 4 * n_params / param_shards
    opt = 8 * n_params / param_shards
    grads = 4 * n_params / param_shards
    micro_tokens = plan.batch_size // max(1, plan.grad_accum) * plan.seq_len
    tok_dev = micro_tokens / shd.batch_size_per_shard(mesh) / int(dict(mesh.shape).get("sequence", 1))
    d, ffn, h, dh = int(m.d_model), int(m.ffn_dim), int(m.num_heads), int(m.head_dim)
    remat = str(m.get("remat", "full"))
    per_layer_saved = d if remat == "full" else (10 * d + 3 * ffn + 4 * h * dh)
    act = tok_dev * cbytes * (int(m.num_layers) * per_layer_saved + 10 * d + 3 * ffn + 4 * h * dh)
    seq = int(config.data.seq_len)
    lc = plan.loss_chunk
    live = min(lc, seq) / seq if lc > 0 else 1.0  # chunked loss: one chunk of logits (+ gradient) at a time
    logits = tok_dev * live * int(m.vocab_size) * 4 * 2 / mesh.shape["tensor"]
    scores = attention_scores_bytes(config, tok_dev, mesh)
    del n_dev
    return {"params": params, "opt_state": opt, "grads": grads, "activations": act + logits, "scores": scores,
            "total": params + opt + grads + act + logits + scores}


def attention_scores_bytes(config, tokens_per_device: float, mesh) -> float:
    """The T x T attention scores of one softmax layer (live at a time under remat) when attention runs as XLA's
    dot_product_attention, which materialises them: float32 scores, probabilities and their gradient per head,
    3 x 4 x H x T bytes per token (sharded over tensor). cuDNN and the TPU flash kernel never hold them (0 then);
    `model.attn_impl=auto` runs XLA on a CPU, so a Softmax run at T = 4096 on a CPU needs ~200 KiB x H per token."""
    m = config.model
    spec = models.spec_from_config(m)
    if not any(s.family in models.spec.ATTENTION_FAMILIES for s in models.layer_specs(spec)):
        return 0.0
    impl = str(m.get("attn_impl", "auto"))
    platform = mesh.devices.flat[0].platform
    if impl != "xla" and not (impl == "auto" and platform == "cpu"):
        return 0.0
    seq = int(config.data.seq_len)
    return 3.0 * 4.0 * tokens_per_device * seq * int(m.num_heads) / mesh.shape["tensor"]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:400] if text else repr(e)


def _state_nbytes(abstract_state) -> int:
    """Bytes of one checkpoint (parameters + optimiser state, as saved)."""
    return int(sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize
                   for a in jax.tree.leaves((abstract_state.params, abstract_state.opt_state))))


def _maybe(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # informative extras only; never stop training for them
        return f"n/a ({type(e).__name__}: {e})"


# ---------------------------------------------------------------------------------------------------- setup
@dataclasses.dataclass
class Setup:
    """Everything compiled for one (config, mesh): abstract state, shardings and the jitted functions.

    init(key) -> TrainState;  train(state, batch) -> (state, metrics) (state donated);
    eval(params, batch) -> (Σ m·nll, Σ m). Call them inside `setup.context()` (mesh + logical axis rules).
    """
    mesh: Any
    rules: Any
    model: Any
    tx: Any
    schedules: dict
    abstract_state: Any
    state_sh: Any
    param_sh: Any
    batch_shardings: dict
    n_params: int
    init: Any
    train: Any
    eval: Any

    def context(self):
        return _Ctx(self.mesh, self.rules)


class _Ctx:
    def __init__(self, mesh, rules):
        self._m, self._r = jax.set_mesh(mesh), nn.logical_axis_rules(rules)

    def __enter__(self):
        self._m.__enter__()
        self._r.__enter__()

    def __exit__(self, *a):
        self._r.__exit__(*a)
        self._m.__exit__(*a)


def build_setup(config, mesh, model=None, *, num_steps: int | None = None, warmup_steps: int | None = None) -> Setup:
    """Abstract state via `jax.eval_shape`, logical -> mesh shardings, and the jitted init / train / eval."""

    plan = RunPlan.from_config(config)
    t = config.train  # the optimiser's section (train/optim.py reads its own keys)
    if num_steps is None or warmup_steps is None:
        num_steps, warmup_steps = plan.num_steps, plan.warmup_steps
    model = model if model is not None else models.build_model(config.model)
    rules = shd.normalize_rules(config.logical_axis_rules)
    init_tokens = jnp.zeros((1, min(int(config.data.seq_len), 16)), jnp.int32)
    boxed = jax.eval_shape(lambda k: model.init(k, init_tokens)["params"], jax.random.PRNGKey(0))
    param_sh = shd.logical_param_shardings(boxed, mesh, rules)
    abstract_params = nn.unbox(boxed)
    labels = models.param_labels(abstract_params)
    tx, schedules = optim.make_optimizer(t, labels, num_steps=num_steps, warmup_steps=warmup_steps)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    opt_sh = shd.opt_state_shardings(abstract_opt, param_sh, mesh)
    rep = shd.replicated(mesh)
    state_sh = TrainState(step=rep, params=param_sh, opt_state=opt_sh)
    abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                  TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
                                             opt_state=abstract_opt), state_sh)
    n_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(abstract_params))

    def init_state(key):
        params = nn.unbox(model.init(key, init_tokens)["params"])
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    batch_sh = shd.batch_sharding(mesh)
    batch_shardings = {k: batch_sh for k in BATCH_KEYS}

    def micro_constraint(mb):
        return {k: jax.lax.with_sharding_constraint(v, batch_sh) for k, v in mb.items()}

    loss_chunk = plan.loss_chunk
    train_step = make_train_step(model.apply, tx, grad_accum=plan.grad_accum, lr_fn=schedules["decay"],
                                 micro_constraint=micro_constraint, loss_chunk=loss_chunk)
    eval_step = make_eval_step(model.apply, loss_chunk)
    p_init = jax.jit(init_state, out_shardings=state_sh)
    p_train = jax.jit(train_step, in_shardings=(state_sh, batch_shardings), out_shardings=(state_sh, rep),
                      donate_argnums=(0,))
    p_eval = jax.jit(eval_step, in_shardings=(param_sh, batch_shardings), out_shardings=(rep, rep))
    return Setup(mesh=mesh, rules=rules, model=model, tx=tx, schedules=schedules, abstract_state=abstract_state,
                 state_sh=state_sh, param_sh=param_sh, batch_shardings=batch_shardings, n_params=n_params,
                 init=p_init, train=p_train, eval=p_eval)


# ------------------------------------------------------------------------------------------------------ run
class _Preemption:
    """SIGTERM, and a first SIGINT (Ctrl-C), set a flag; the loop saves at the next step boundary and exits (143
    for SIGTERM, 130 for SIGINT). A second SIGINT aborts at once (KeyboardInterrupt: nothing more is saved)."""

    def __init__(self):
        self.flag = threading.Event()
        self.interrupted = False
        self._old: dict = {}

    def install(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if signum == signal.SIGINT:
            if self.interrupted:
                raise KeyboardInterrupt
            self.interrupted = True
            print("interrupt: saving at the next step boundary, then exiting (Ctrl-C again to abort without "
                  "saving)", file=sys.stderr, flush=True)
        self.flag.set()

    def what(self) -> str:
        return "interrupt (SIGINT)" if self.interrupted else "preemption signal"

    def uninstall(self):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}


def _time_to_save(every_s: float, last: float, step: int, process_count: int, log_every: int) -> bool:
    """train.checkpoint_minutes: True when that much wall time passed since the last save. With several
    processes process 0's clock decides, read at log_every boundaries (one broadcast), so that all save together."""
    if every_s <= 0:
        return False
    if process_count == 1:
        return time.monotonic() - last >= every_s
    if step % max(1, log_every):
        return False
    due = np.asarray(time.monotonic() - last >= every_s, np.int32)
    return bool(multihost_utils.broadcast_one_to_all(due))


def _should_stop(preempt: _Preemption, mngr, step: int, process_count: int, log_every: int) -> bool:
    """SIGTERM seen (or orbax's preemption sync point reached). With several processes the local flags are
    combined with an all-gather every `log_every` steps, so that every process stops at the same step (a
    save is collective: one process saving alone would hang)."""
    if mngr.reached_preemption(step):
        return True
    if process_count == 1:
        return preempt.flag.is_set()
    if step % max(1, log_every):
        return False
    flags = multihost_utils.process_allgather(np.asarray(preempt.flag.is_set(), np.int32))
    return bool(np.any(flags))


def run(config, workdir: str, *, devices=None) -> dict[str, Any]:
    """Trains `config` in `workdir` (resuming if it holds a run). Returns a summary dict.

    summary: {"status": "done" | "preempted" | "already_done", "step", "loss", "val_loss", "val_ppl",
              "num_params", "wall_time"}
    """

    t0 = time.time()
    if "://" in str(workdir):
        raise TrainingError(f"--workdir={workdir!r}: a URL; the trainer needs a filesystem path (mount the bucket, "
                            f"e.g. with gcsfuse, and pass the mount point)")
    workdir = os.path.abspath(workdir)
    try:
        plan = RunPlan.from_config(config)  # every value checked once; below, the loop reads only the plan
        validate.check_workdir(workdir)
    except (validate.ConfigError, ValueError) as e:
        raise TrainingError(str(e)) from e

    # ---- refusals: nothing is written before these pass
    check_data_choice(config)
    try:
        tokenizer = tok_lib.load_tokenizer(config.data.tokenizer)
    except (ValueError, FileNotFoundError) as e:
        raise TrainingError(f"config.data.tokenizer={config.data.tokenizer!r} could not be loaded: {e}") from e
    check_tokenizer(config, tokenizer, _pipeline())
    try:
        validate.check_shards(config)
    except (validate.ConfigError, ValueError, FileNotFoundError) as e:
        raise TrainingError(str(e)) from e
    check_config_edits(workdir)
    other_diffs = check_resume_compatible(workdir, config)
    identity = check_identity(workdir, config, tokenizer)
    # a branch is read once, into an empty workdir; its resumes do not need the trunk any more
    if plan.branch_from and _branch_source(plan.branch_from) == workdir:
        raise TrainingError(f"config.train.branch_from={plan.branch_from!r} is the workdir itself; branch into a new "
                            f"--workdir")
    branch = (_check_branch(config, workdir) if plan.branch_from and not layout.committed_steps(workdir)
              else None)
    if plan.init_from and os.path.abspath(plan.init_from) == workdir:
        raise TrainingError(f"config.train.init_from={plan.init_from!r} is the workdir itself; resuming happens by "
                            f"rerunning the same command, init_from is for starting from another run")
    if plan.init_from:
        try:
            src_model = layout.config_to_dict(layout.load_config(plan.init_from).model)
        except FileNotFoundError as e:
            raise TrainingError(f"config.train.init_from={plan.init_from!r}: {e}") from e
        diffs = layout.diff_dicts(src_model, layout.config_to_dict(config.model))
        if diffs:
            raise TrainingError(f"config.train.init_from={plan.init_from!r}: that run's model config differs: "
                                + ", ".join(f"model.{k}: {a!r} there, {b!r} here" for k, a, b in diffs))
        if not layout.committed_steps(plan.init_from):
            raise TrainingError(f"config.train.init_from={plan.init_from!r} has no committed checkpoint")
    process_count, process_index = jax.process_count(), jax.process_index()
    try:
        _pipeline().check_splits(config.data, tokenizer, ("train", "val"))  # val: the final validation always runs
        mesh = shd.make_mesh(config.mesh, devices)
        micro = shd.check_batch_divisible(plan.batch_size, plan.grad_accum, mesh, process_count)
        shd.check_sequence_split(int(config.data.seq_len), mesh)
        model = models.build_model(config.model)
        # abstract: traces shapes only, allocates nothing
        setup = build_setup(config, mesh, model, num_steps=plan.num_steps, warmup_steps=plan.warmup_steps)
    except (ValueError, KeyError) as e:
        raise TrainingError(str(e)) from e

    # ---- workdir, its lease, and config (first writes)
    is_main = process_index == 0
    lease = None
    if is_main:
        try:
            os.makedirs(workdir, exist_ok=True)
            lease = lease_lib.Lease(workdir, heartbeat_s=plan.lease_heartbeat_s, stale_s=plan.lease_stale_s,
                                    log=log).acquire()
            held = None
        except lease_lib.LeaseHeld as e:
            held = str(e)
        except OSError as e:  # a full disk or a read-only mount: the lease is the first file written
            held = (f"cannot write the workdir lease in {workdir}: {type(e).__name__}: {e.strerror or _first_line(e)}"
                    f"; nothing was written. Free space or fix the workdir's permissions / mount, then rerun")
    else:
        held = None
    if not ckpt.all_processes_agree(held is None):
        raise TrainingError(held or "process 0 could not take the workdir lease (its log says why)")
    try:
        token = _broadcast_token(lease.token if lease is not None else None)
        # Process 0 holds the lease and makes every write a fence guards (metadata, the commit's rename); the
        # others only write their array shards into process 0's uniquely named folder. Their checks would be
        # collective-breaking (one process raising before a collective save while the others enter it), so
        # they do not fence: a fenced-out process 0 stops, and the others lose contact with it and stop.
        fence = lease if lease is not None else lease_lib.NO_FENCE
        return _train(config, plan, workdir, t0=t0, setup=setup, tokenizer=tokenizer, micro=micro, fence=fence,
                      tag=token[:12], branch=branch, other_diffs=other_diffs, identity=identity)
    finally:
        if lease is not None:
            lease.release()


def _broadcast_token(token: str | None) -> str:
    """Process 0's lease token on every process (the fencing token and the name of its in-flight checkpoints)."""
    if jax.process_count() == 1:
        return str(token)
    raw = np.frombuffer(bytes.fromhex(token), np.uint8) if token else np.zeros(16, np.uint8)
    return bytes(np.asarray(multihost_utils.broadcast_one_to_all(raw), np.uint8)).hex()


def _write_config(workdir: str, config, other_diffs, fence, identity: dict) -> None:
    """config.json and identity.json, written only once every check of this start has passed (restore included),
    so a refused rerun leaves both as the run wrote them."""
    if jax.process_index() != 0:
        return
    fence.check(layout.IDENTITY_FILE)
    layout.write_identity(workdir, identity)
    if other_diffs is None:
        fence.check("config.json")
        layout.save_config(workdir, config)
    elif other_diffs:
        log("config changes against the saved run (allowed; model and tokenizer are unchanged): "
            + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in other_diffs.items()))
        fence.check("config.json")
        layout.archive_config(workdir, layout.committed_steps(workdir))
        layout.save_config(workdir, config)


def _branch_source(spec: str) -> str:
    src, _, step_s = spec.rpartition(":")
    return os.path.abspath(src if step_s.isdigit() else spec)


def _check_branch(config, workdir: str) -> tuple[str, int]:
    """train.branch_from = "<workdir>[:<step>]": the source run and step, checked before anything is written."""
    spec = str(config.train.branch_from)
    src, _, step_s = spec.rpartition(":") if spec.rpartition(":")[2].isdigit() else (spec, "", "")
    src = os.path.abspath(src)
    if src == workdir:
        raise TrainingError(f"config.train.branch_from={spec!r} is the workdir itself; branch into a new --workdir")
    try:
        saved = layout.load_config(src)
    except FileNotFoundError as e:
        raise TrainingError(f"config.train.branch_from={spec!r}: {e}") from e
    steps = layout.committed_steps(src)
    step = int(step_s) if step_s else (steps[-1] if steps else None)
    if step is None or step not in steps:
        raise TrainingError(f"config.train.branch_from={spec!r}: no committed checkpoint"
                            f"{'' if step is None else f' at step {step}'} in {src} (it has {steps})")
    a, b = layout.config_to_dict(saved), layout.config_to_dict(config)
    must_match = [d for d in layout.diff_dicts(a, b) if d[0].split(".")[0] in ("model", "data", "seed")
                  or d[0] in ("train.batch_size", "train.grad_accum")]
    if must_match:
        raise TrainingError(f"config.train.branch_from={spec!r}: the branch must keep the source run's model, data "
                            f"and batch (its checkpoint holds their state); differs: "
                            + ", ".join(f"{k}: {x!r} there, {y!r} here" for k, x, y in must_match))
    old_lr, new_lr = lr_at(saved, [step])[0], lr_at(config, [step])[0]
    if not np.isclose(old_lr, new_lr, rtol=1e-6):
        log(f"warning: branching at step {step}: the source run's LR there is {old_lr:.3e}, this run's {new_lr:.3e} "
            f"(a decay branch should start where the source's stable phase is: train.schedule=wsd with "
            f"num_steps - decay_steps = {step})")
    return src, step


def _train(config, plan: RunPlan, workdir: str, *, t0: float, setup: "Setup", tokenizer, micro: int, fence, tag: str,
           branch, other_diffs, identity: dict) -> dict[str, Any]:
    """The phases of a run once it may write: report, restore (or branch / init), config.json, the metrics log,
    what a finished run still owes or the loop, the summary."""
    _log_startup(config, plan, workdir, setup, tokenizer, micro)
    # a checkpoint must carry this run's id once the run has recorded one (a copy from another run is rejected)
    check_id = identity["run_id"] if layout.read_identity(workdir) is not None else None
    loop = _Loop(config, plan, workdir, setup=setup, tokenizer=tokenizer, micro=micro, fence=fence, tag=tag,
                 run_id=identity["run_id"])
    try:
        loop.restore(branch, check_id)
        _write_config(workdir, config, other_diffs, fence, identity)
        loop.open_writer()
    except lease_lib.LeaseLost as e:
        loop.close()
        raise TrainingError(f"stopping before training: {e}") from None
    except BaseException:
        loop.close()
        raise
    if loop.start_step >= plan.num_steps:
        summary = loop.finish_owed()
        return dict(summary, wall_time=time.time() - t0)
    summary = loop.run()
    summary.update(bad_steps=loop.bad_steps, wall_time=time.time() - t0)
    if jax.process_count() > 1 or os.environ.get("IDATTN_LOG_ALL_PROCESSES"):
        print(f"[process {jax.process_index()}] final step {summary['step']} loss {summary['loss']!r}", flush=True)
    return summary


def _log_startup(config, plan: RunPlan, workdir: str, setup: "Setup", tokenizer, micro: int) -> None:

    mesh, n_params = setup.mesh, setup.n_params
    est = hbm_estimate(n_params, config, mesh)
    fmt = metrics_lib.format_bytes
    log(f"idattn.train: workdir {workdir}")
    log(f"  devices {mesh.size} x {jax.devices()[0].device_kind} over {jax.process_count()} process(es); mesh "
        f"{dict(mesh.shape)}" + ("; a sequence group spans processes: each reads the whole global batch and keeps "
                                 "its devices' blocks" if shd.sequence_spans_processes(mesh) else ""))
    log(f"  model {models.model_label(config.model)}: {n_params:,} parameters (count_params: "
        f"{_maybe(models.count_params, config.model)}); state budget per layer "
        f"{_maybe(models.state_budget, config.model)} real dof")
    log(f"  HBM estimate per device: params {fmt(est['params'])} + opt state {fmt(est['opt_state'])} + grads "
        f"{fmt(est['grads'])} + activations {fmt(est['activations'])}"
        + (f" + attention scores {fmt(est['scores'])} (XLA attention holds T x T per head)" if est["scores"] else "")
        + f" = {fmt(est['total'])}")
    log(describe_data(config, tokenizer))
    log(f"  schedule: {plan.num_steps} steps x {plan.batch_size} x {plan.seq_len} tokens (grad_accum "
        f"{plan.grad_accum}, microbatch {micro}), warmup {plan.warmup_steps}, peak lr {plan.peak_lr:g} (ssm "
        f"{min(plan.peak_lr, plan.ssm_lr_cap):g}) -> {plan.end_lr:g}")


class _Loop:
    """One run's training loop and what it carries between steps: the state, the data iterator and its
    position, the checkpoint manager, the metrics writer, the count of dropped (non-finite) steps.

    Phases: `restore` (a verified checkpoint of this run, else a branch source, else init / init_from), `run`
    (the steps; each step's finiteness is read one step late so the host never waits on the device, except at
    log / checkpoint / eval steps), with `save`, `evaluate`, `check_finite` and `check_saves` as the fault
    boundaries: each either completes or stops the run naming the last committed checkpoint."""

    def __init__(self, config, plan: RunPlan, workdir: str, *, setup: "Setup", tokenizer, micro: int, fence,
                 tag: str, run_id: str):
        self.run_id = run_id

        self.config, self.plan, self.workdir, self.setup = config, plan, workdir, setup
        self.tokenizer, self.micro, self.fence = tokenizer, micro, fence
        self.num_steps, self.tokens_per_step = plan.num_steps, plan.tokens_per_step
        self.seq_len = plan.seq_len
        self.mesh = setup.mesh
        self.is_main = jax.process_index() == 0
        self.mngr = ckpt.make_manager(workdir, plan, fence=fence.check, tag=tag)
        self.restored_meta: dict = {}
        # a sequence group across hosts: every process reads the whole global batch and keeps its devices' blocks
        self.full_batches = shd.sequence_spans_processes(self.mesh)
        self.data_iter = _pipeline().make_train_iterator(
            config.data, tokenizer, global_batch_size=plan.batch_size, seq_len=self.seq_len,
            seed=int(config.data.shuffle_seed), process_index=0 if self.full_batches else jax.process_index(),
            process_count=1 if self.full_batches else jax.process_count())
        self.state = None
        self.start_step = 0
        self.bad_steps = 0
        self.max_bad = plan.max_bad_steps
        self.eval_data = None
        self.state_bytes = _state_nbytes(setup.abstract_state)
        self.run_info = {"workdir": workdir, "mixer": models.model_label(config.model), "params": setup.n_params}
        self.summary: dict[str, Any] = {"status": "done", "step": 0, "loss": None, "val_loss": None,
                                        "val_ppl": None, "num_params": setup.n_params}
        self.writer = None

    # ---- state
    def restore(self, branch, run_id: str | None = None) -> None:
        plan, workdir, setup = self.plan, self.workdir, self.setup
        try:
            restored = ckpt.restore_verified(self.mngr, workdir, setup.abstract_state,
                                             fallback=plan.checkpoint_fallback, log=log, run_id=run_id)
            if restored is None and branch is not None:
                src_mngr = ckpt.make_manager(branch[0], plan, read_only=True)
                try:
                    restored = ckpt.restore_verified(src_mngr, branch[0], setup.abstract_state, fallback=False,
                                                     log=log, step=branch[1])
                finally:
                    src_mngr.close()
                log(f"branched from {os.path.join(branch[0], layout.CKPT_DIR, str(branch[1]))} (full state: "
                    f"parameters, optimiser, data position; step {branch[1]})")
        except ckpt.CheckpointError as e:
            raise TrainingError(str(e)) from None
        if restored is None and branch is None:
            self.refuse_restart_from_zero()
        if restored is not None:
            latest, params, opt_state, meta, data_state = restored
            self.restored_meta = dict(meta)
            if branch is not None and not layout.committed_steps(workdir):
                # the trunk's metrics stay in the trunk: a branch's metrics.jsonl starts at its first own step
                self.restored_meta.pop("metrics_log", None)
            state = TrainState(step=jnp.asarray(latest, jnp.int32), params=params, opt_state=opt_state)
            self.state = jax.device_put(state, setup.state_sh)
            self.data_iter.set_state(data_state)
            self.bad_steps = int(meta.get("bad_steps", 0) or 0)
            if branch is None or layout.committed_steps(workdir):
                log(f"restored step {latest} from {os.path.join(workdir, layout.CKPT_DIR, str(latest))} "
                    f"(checksums verified)")
            self.start_step = int(latest)
        else:
            with setup.context():
                self.state = setup.init(jax.random.PRNGKey(int(self.config.seed)))
            if plan.init_from:
                _, src_params = loading.load_params(plan.init_from, shardings=setup.param_sh)
                self.state = self.state.replace(params=src_params)
                log(f"initialised parameters from {plan.init_from} (fresh optimiser state, step 0)")
            self.start_step = 0
        self.summary["step"] = self.start_step

    def refuse_restart_from_zero(self) -> None:
        """A workdir that has committed a checkpoint never silently trains from step 0 again (its checkpoints were
        all rejected, or removed): refused unless train.restart_from_scratch, naming what is left."""
        if self.plan.restart_from_scratch:
            return
        workdir = self.workdir
        progress = layout.read_progress(workdir)
        rejected_dir = os.path.join(workdir, layout.REJECTED_DIR)
        rejected = sorted((n for n in os.listdir(rejected_dir) if not n.endswith(".reason.txt")),
                          key=lambda n: int(n.split(".")[0]) if n.split(".")[0].isdigit() else -1
                          ) if os.path.isdir(rejected_dir) else []
        best = layout.best_info(workdir)
        if not (progress.get("committed_step") or rejected or best):
            return
        what = []
        if progress.get("committed_step"):
            what.append(f"it committed checkpoint {progress['committed_step']} before")
        if best:
            what.append(f"best/ holds step {best.get('step')}")
        if rejected:
            newest = rejected[-1]
            step = newest.split(".")[0]
            what.append(f"{len(rejected)} checkpoint(s) were moved to {rejected_dir}/ ({', '.join(rejected[-3:])}); "
                        f"to resume from the newest: mv {os.path.join(rejected_dir, newest)} "
                        f"{os.path.join(workdir, layout.CKPT_DIR, step)} and rerun (its reason is in "
                        f"{os.path.join(rejected_dir, newest)}.reason.txt)")
        raise TrainingError(f"refusing to train {workdir} from step 0: no checkpoint of it restores, but "
                            + "; ".join(what) + ". To start over deliberately (metrics.jsonl is truncated), add "
                            "--config.train.restart_from_scratch=true, or use a new --workdir.")

    def open_writer(self) -> None:
        """metrics.jsonl (and TensorBoard) from the restored step on: lines past it are dropped (the run repeats
        those steps), lines missing before it (a file cut or deleted) are restored from the checkpoint's copy."""
        saved = metrics_lib.unpack_lines(self.restored_meta.get("metrics_log"))
        tracker = None
        if self.is_main:
            self.fence.check("metrics.jsonl")
            tracker = tracker_lib.make_tracker(self.config, self.workdir)  # train.wandb_project: W&B
        self.writer = metrics_lib.MetricsWriter(self.workdir, enabled=self.is_main, total_steps=self.num_steps,
                                                resume_step=self.start_step, saved_lines=saved,
                                                guard=self.fence.check, log=log, tracker=tracker)

    def close(self) -> None:
        """Waits for pending saves (a failure here is reported, never masking the error being raised), then
        releases the manager, the writer and the data workers."""
        try:
            self.mngr.wait_until_finished()
        except Exception as e:  # don't mask the original error
            print(f"warning: waiting for pending checkpoint saves failed: {_first_line(e)}", file=sys.stderr)
        try:
            self.mngr.close()
        except Exception as e:  # e.g. the workdir vanished under an in-flight save: the error being raised says why
            print(f"warning: closing the checkpoint manager failed: {_first_line(e)}", file=sys.stderr)
        if self.writer is not None:
            self.writer.close()
        if hasattr(self.data_iter, "close"):
            self.data_iter.close()

    # ---- fault boundaries
    def last_committed(self) -> str:
        try:
            self.mngr.wait_until_finished()
        except Exception:  # the failed save itself; what is on disk is what counts
            pass
        steps = layout.committed_steps(self.workdir)
        return (os.path.join(self.workdir, layout.CKPT_DIR, str(steps[-1])) if steps else
                "none (no checkpoint was committed yet)")

    def check_finite(self, s: int, m) -> float:
        """Step s's update was applied only if it was finite (train/step.py); count or stop on a dropped one."""
        host = jax.device_get(m)
        loss = float(host["loss"])
        if float(host.get("finite", 1.0)) > 0.5:
            return loss
        self.bad_steps += 1
        what = f"loss {loss:.4g}, grad norm {float(host['grad_norm']):.4g}"
        if self.bad_steps <= self.max_bad:
            log(f"step {s}: non-finite step ({what}); the update was not applied, the batch is dropped "
                f"(bad step {self.bad_steps} of train.max_bad_steps={self.max_bad})")
            return loss
        raise TrainingError(
            f"non-finite step {s} ({what}); the update was not applied and the run stops "
            f"({self.bad_steps} bad step(s), train.max_bad_steps={self.max_bad}). Last finite checkpoint: "
            f"{self.last_committed()} (a checkpoint only ever holds a finite state). Lower train.peak_lr or raise "
            f"train.warmup_steps, check the data, or allow dropping a few bad batches with "
            f"--config.train.max_bad_steps=<N>; then rerun (it resumes from that checkpoint).")

    def _save_failed(self, s: int, e: BaseException) -> TrainingError:
        return TrainingError(f"checkpoint save failed at step {s}: {type(e).__name__}: {_first_line(e)}. Stopping "
                             f"so that no more work is lost; last committed checkpoint: {self.last_committed()}. "
                             f"Free space or fix the workdir's permissions, then rerun (it resumes from there).")

    def fenced(self, s: int, what: str) -> None:
        """The lease check before a write (train/lease.py): a trainer that was taken over stops here, writing
        nothing more."""
        try:
            self.fence.check(what)
        except lease_lib.LeaseLost as e:
            raise self._fenced_out(s, e) from None

    def _fenced_out(self, s: int, e: BaseException) -> TrainingError:
        # moved (or deleted): the folder is gone, or holds no config.json any more (an in-flight save may have
        # re-created the bare path)
        if not os.path.exists(os.path.join(self.workdir, layout.CONFIG_FILE)):
            return TrainingError(f"stopping at step {s} without writing: {lease_lib.MOVED.format(workdir=self.workdir)}"
                                 f"; no other trainer is involved. Rerun the command with --workdir=<its new path> "
                                 f"to resume from its last committed checkpoint.")
        return TrainingError(f"stopping at step {s} without writing: {e}. Another trainer took over {self.workdir}; "
                             f"this process wrote nothing after that (its in-flight checkpoint, if any, is "
                             f"discarded) and the new owner's files are untouched.")

    def check_saves(self, s: int) -> None:
        """A failed background save (no space, permissions, quota) stops the run at once, saying what is kept;
        so does a lease another trainer took over."""
        try:
            err = ckpt.background_error(self.mngr)
        except lease_lib.LeaseLost as e:
            raise self._fenced_out(s, e) from None
        except Exception as e:
            err = e
        if isinstance(err, lease_lib.LeaseLost) or getattr(self.fence, "lost", None):
            raise self._fenced_out(s, err if isinstance(err, lease_lib.LeaseLost) else self.fence.lost)
        if err is not None:
            raise self._save_failed(s, err) from None

    def _record_progress(self, s: int) -> None:
        """progress.json: the newest committed step (cheap listing; written when it moved). A failed write stops
        the run in one line like any other write."""
        if not self.is_main:
            return
        steps = layout.committed_steps(self.workdir)
        if steps and steps[-1] > int(layout.read_progress(self.workdir).get("committed_step", 0) or 0):
            self.fenced(s, "progress.json")
            try:
                layout.write_progress(self.workdir, steps[-1])
            except OSError as e:
                raise self.write_failed(s, os.path.join(self.workdir, layout.PROGRESS_FILE), e) from None

    def _rotation_victims(self, s: int) -> list[int]:
        """Committed steps that the rotation after saving step `s` deletes anyway (train.keep_last newest are kept,
        counting `s`; keep_every multiples and checkpoint_steps never go)."""
        keep_last, keep_every, pinned = self.plan.keep_last, self.plan.keep_every, set(self.plan.checkpoint_steps)
        steps = [x for x in layout.committed_steps(self.workdir) if x != s]
        keep = set(steps[-(keep_last - 1):]) if keep_last > 1 else set()
        return [x for x in steps if x not in keep and x not in pinned and not (keep_every > 0 and x % keep_every == 0)]

    def _make_room(self, s: int) -> int | None:
        """Free bytes for checkpoint `s`, after deleting first what its rotation would delete after it (so that a
        lowered train.keep_last takes effect on a full disk); None when the free space cannot be read."""
        free = _maybe(ckpt.disk_free_bytes, os.path.join(self.workdir, layout.CKPT_DIR))
        if not isinstance(free, int) or free >= 1.1 * self.state_bytes:
            return free if isinstance(free, int) else None
        victims = self._rotation_victims(s)
        if victims:
            self.mngr.wait_until_finished()
            self.fenced(s, f"deleting rotated checkpoints {victims}")
            for v in victims:
                self.mngr.delete(v)
            log(f"low on disk space: deleted checkpoint(s) {victims} before saving step {s} instead of after "
                f"(train.keep_last={self.plan.keep_last})")
            free = _maybe(ckpt.disk_free_bytes, os.path.join(self.workdir, layout.CKPT_DIR))
        return free if isinstance(free, int) else None

    def save(self, s: int, data_state, *, force: bool = False) -> None:
        self.check_saves(s)
        self.fenced(s, f"checkpoint {s}")
        self._record_progress(s)
        fmt = metrics_lib.format_bytes
        free = self._make_room(s)
        if free is not None:
            if free < 1.1 * self.state_bytes:
                more = len(layout.committed_steps(self.workdir))
                advice = (f" (or lower train.keep_last, now {self.plan.keep_last}: the rerun deletes the "
                          f"checkpoints beyond it before its first save; {more} are kept now)"
                          if more > 1 else "")
                raise TrainingError(f"not enough disk space for checkpoint {s}: {fmt(free)} free in {self.workdir}, "
                                    f"the checkpoint needs about {fmt(self.state_bytes)}. Stopping; last committed "
                                    f"checkpoint: {self.last_committed()}. Free space{advice}, then rerun.")
            if free < 3 * self.state_bytes:
                log(f"warning: {fmt(free)} free in {self.workdir}: room for fewer than 3 more checkpoints of "
                    f"{fmt(self.state_bytes)}")
        meta = {"time": time.time(), "loss": self.summary["loss"], "bad_steps": self.bad_steps, "run_id": self.run_id}
        if self.writer is not None and self.is_main:
            meta["metrics_log"] = metrics_lib.pack_lines(self.writer.lines_up_to(s))
        try:
            ckpt.save(self.mngr, s, self.state, data_state, meta, force=force)
        except ckpt.NonFiniteState as e:
            raise TrainingError(f"{e}. Stopping; last finite checkpoint: {self.last_committed()}. Lower "
                                f"train.peak_lr or check the data, then rerun.") from e
        except lease_lib.LeaseLost as e:
            raise self._fenced_out(s, e) from None
        except Exception as e:
            raise self._save_failed(s, e) from None
        self.last_save_time = time.monotonic()

    def wait_committed(self, s: int) -> None:
        """Blocks until checkpoint `s` is committed; a save that failed in the background stops the run in one
        line naming the last committed checkpoint (the rerun trains from there)."""
        try:
            self.mngr.wait_until_finished()
        except lease_lib.LeaseLost as e:
            raise self._fenced_out(s, e) from None
        except Exception as e:
            raise self._save_failed(s, e) from None
        self.check_saves(s)
        if s not in layout.committed_steps(self.workdir):
            raise self._save_failed(s, RuntimeError(f"checkpoint {s} was not committed"))

    def write_failed(self, s: int, what: str, e: OSError) -> TrainingError:
        return TrainingError(f"could not write {what} at step {s}: {type(e).__name__}: {_first_line(e)}. Stopping "
                             f"so that no more work is lost; last committed checkpoint: {self.last_committed()}. "
                             f"Free space or fix the workdir's permissions, then rerun (it resumes from there).")

    # ---- evaluation
    def evaluate(self, step: int) -> tuple[float, float]:
        """The trainer's validation (docs/evaluation.md): the first train.eval_batches packed held-out batches."""

        if self.eval_data is None:
            self.eval_data = _pipeline().make_eval_batches(self.config.data, self.tokenizer, batch_size=self.micro,
                                                        seq_len=self.seq_len, num_batches=self.plan.eval_batches)
        nll, cnt = 0.0, 0.0
        with self.setup.context():
            for b in self.eval_data:
                s, c = self.setup.eval(self.state.params, shd.global_batch_from_full(
                    {k: b[k] for k in self.setup.batch_shardings}, self.mesh))
                nll += float(s)
                cnt += float(c)
        loss = nll / max(cnt, 1.0)
        ppl = math.exp(min(loss, 700.0))
        if self.is_main:
            self.fenced(step, f"eval/ result of step {step}")
            try:
                write_result(self.workdir, "validation", step, {"loss": loss, "ppl": ppl}, run=self.run_info,
                             details={"tokens": cnt, "batches": len(self.eval_data), "seq_len": self.seq_len})
                self.writer.scalar("validation/loss", loss, step)
                self.writer.scalar("validation/ppl", ppl, step)
            except lease_lib.LeaseLost as e:
                raise self._fenced_out(step, e) from None
            except OSError as e:
                raise self.write_failed(step, "the validation result", e) from None
        log(f"validation step {step}: loss {loss:.4f} ppl {ppl:.3f} ({int(cnt)} tokens)")
        return loss, ppl

    def best_step(self, step: int, val_loss: float, best_loss: float) -> float:
        """Keeps the parameters of `step` in best/ when its validation loss is the best so far."""
        if not self.plan.keep_best or val_loss >= best_loss:
            return best_loss
        self.fenced(step, f"best/ at step {step}")
        try:
            where = ckpt.save_best(self.workdir, step, self.state.params, val_loss)
        except lease_lib.LeaseLost as e:
            raise self._fenced_out(step, e) from None
        except Exception as e:  # orbax/tensorstore raise their own types for a full disk (RESOURCE_EXHAUSTED)
            kept = layout.best_info(self.workdir)
            raise TrainingError(
                f"could not write best/ at step {step}: {type(e).__name__}: {_first_line(e)[:300]}. best/ keeps "
                f"{'step ' + str(kept.get('step')) if kept else 'nothing'}; last committed checkpoint: "
                f"{self.last_committed()}. The run is not done until best/ is written: free space, then rerun (it "
                f"writes best/ from the committed checkpoint or trains on from it).") from None
        log(f"best validation loss so far: kept step {step} in {where}")
        return val_loss

    def finish_owed(self) -> dict[str, Any]:
        """A rerun of a finished run: what it still owes when it was killed between its last checkpoint and its
        end (the final validation, best/), then "already_done"."""

        step = self.start_step
        try:
            val = next((float(r["metrics"]["loss"]) for r in read_results(self.workdir, "validation")
                        if int(r["step"]) == step), None)
        except (OSError, ValueError, KeyError, TypeError):
            val = None
        best = layout.best_info(self.workdir) if self.plan.keep_best else None
        best_loss = float(best.get("val_loss", math.inf)) if best else math.inf
        # best/ is owed when missing or older and worse than the final validation (its write failed at the end)
        owe_best = self.plan.keep_best and (best is None or (val is not None and best_loss > val * (1 + 1e-9)))
        owed = ([] if val is not None else ["the final validation"]) + (["best/"] if owe_best else [])
        try:
            if not owed:
                log(f"run already complete at step {step} (train.num_steps={self.num_steps})")
                return dict(self.summary, status="already_done")
            log(f"run trained to step {step} (train.num_steps={self.num_steps}) but was stopped before "
                f"{' and '.join(owed)}: finishing that now")
            if val is None:
                val_loss, val_ppl = self.evaluate(step)
            else:
                val_loss, val_ppl = val, math.exp(min(val, 700.0))
            self.summary.update(val_loss=val_loss, val_ppl=val_ppl,
                                loss=self.restored_meta.get("loss", self.summary["loss"]))
            self.best_step(step, val_loss, best_loss)
            return dict(self.summary, status="done")
        finally:
            self.close()

    # ---- the steps
    def run(self) -> dict[str, Any]:

        plan, summary, num_steps = self.plan, self.summary, self.num_steps
        peak = metrics_lib.peak_flops_per_device(jax.devices()[0].device_kind,
                                                 plan.peak_tflops_per_device)
        flops_tok = _maybe(models.flops_per_token, self.config.model, self.seq_len)  # fwd + bwd FLOPs per token
        train_flops_tok = float(flops_tok) if isinstance(flops_tok, (int, float)) else None
        preempt = _Preemption()
        preempt.install()
        save_every_s = 60.0 * plan.checkpoint_minutes
        self.last_save_time = time.monotonic()
        debug_sleep = float(os.environ.get("IDATTN_DEBUG_STEP_SLEEP", "0") or 0)  # tests: make a run slow to kill
        pinned = set(plan.checkpoint_steps)
        pending: tuple[int, Any] | None = None  # (step, metrics) not yet checked for finiteness
        win_steps, win_wait, win_t = 0, 0.0, time.perf_counter()
        step, first_dt = self.start_step, float("nan")
        data_state = self.data_iter.get_state()
        best = layout.best_info(self.workdir) if plan.keep_best else None
        best_loss = float(best["val_loss"]) if best else math.inf
        try:
            while step < num_steps:
                if _should_stop(preempt, self.mngr, step, jax.process_count(), plan.log_every):
                    if pending is not None:
                        self.check_finite(*pending)
                        pending = None
                    log(f"{preempt.what()}: saving step {step} and exiting")
                    if step not in layout.committed_steps(self.workdir) and self.mngr.latest_step() != step:
                        self.save(step, data_state, force=True)
                    self.mngr.wait_until_finished()
                    self.check_saves(step)
                    self._record_progress(step)
                    summary.update(status="interrupted" if preempt.interrupted else "preempted", step=step)
                    break
                tw = time.perf_counter()
                batch_np = next(self.data_iter)
                data_state = self.data_iter.get_state()
                to_global = shd.global_batch_from_full if self.full_batches else shd.global_batch_from_local
                batch = to_global({k: batch_np[k] for k in self.setup.batch_shardings}, self.mesh)
                win_wait += time.perf_counter() - tw
                with self.setup.context():
                    self.state, m = self.setup.train(self.state, batch)
                step += 1
                win_steps += 1
                if pending is not None:
                    self.check_finite(*pending)
                pending = (step, m)
                if step == self.start_step + 1:  # keep compilation out of the step time, the throughput and the ETA
                    jax.block_until_ready(m)
                    first_dt = time.perf_counter() - win_t
                    log(f"first step done in {first_dt:.1f} s (includes compilation)")
                    win_steps, win_wait, win_t = 0, 0.0, time.perf_counter()
                if debug_sleep:
                    time.sleep(debug_sleep)
                self.check_saves(step)

                is_log = step % plan.log_every == 0 or step == num_steps
                is_ckpt = (step % plan.checkpoint_every == 0 or step == num_steps or step in pinned
                           or _time_to_save(save_every_s, self.last_save_time, step, jax.process_count(),
                                            plan.log_every))
                is_eval = (plan.eval_every > 0 and step % plan.eval_every == 0) or step == num_steps
                if is_log or is_ckpt or is_eval:
                    summary.update(step=step, loss=self.check_finite(*pending))
                    pending = None
                if is_log:
                    dt = (time.perf_counter() - win_t) / win_steps if win_steps else first_dt
                    try:
                        self._log_step(step, m, dt, win_wait / max(1, win_steps), peak, train_flops_tok)
                    except lease_lib.LeaseLost as e:
                        raise self._fenced_out(step, e) from None
                    except OSError as e:
                        raise self.write_failed(step, self.writer.path, e) from None
                    win_steps, win_wait, win_t = 0, 0.0, time.perf_counter()
                if is_ckpt:
                    self.save(step, data_state)
                    if step == num_steps:  # "done" needs the final checkpoint durable before its validation
                        self.wait_committed(step)
                if is_eval:
                    summary["val_loss"], summary["val_ppl"] = self.evaluate(step)
                    best_loss = self.best_step(step, summary["val_loss"], best_loss)
                    win_t = time.perf_counter()  # evaluation time is not step time
            else:
                if pending is not None:
                    summary["loss"] = self.check_finite(*pending)
            self.mngr.wait_until_finished()
            self.check_saves(step)
            self._record_progress(step)
        finally:
            preempt.uninstall()
            self.close()
        return summary

    def _log_step(self, step: int, m, dt: float, data_wait: float, peak, train_flops_tok) -> None:
        """One line of metrics.jsonl (and TensorBoard): loss, lr, grad norm, tokens/s, MFU, step time."""
        tps = self.tokens_per_step / dt
        tps_dev = tps / self.mesh.size
        mfu = (tps_dev * train_flops_tok / peak) if (peak and train_flops_tok) else None
        host = jax.device_get(m)
        self.writer.write(step, {"loss": float(host["loss"]), "lr": float(host["lr"]),
                                 "grad_norm": float(host["grad_norm"]), "tokens_per_sec": tps,
                                 "tokens_per_sec_per_device": tps_dev, "mfu": mfu, "step_time": dt,
                                 "data_wait": data_wait, "tokens_seen": step * self.tokens_per_step,
                                 "bad_steps": self.bad_steps})
