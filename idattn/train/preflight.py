"""The start's refusals: `preflight(config, workdir)` checks everything a run needs before it writes anything.

Order of work, so that a refused start writes nothing:
  1. check every config value and derive the schedule once, into the typed `RunPlan` (idattn.train.plan) that
     the run reads from then on; check that the workdir can be written (and is a path, not a URL);
  2. check the data choice; load the tokenizer and check it against model.vocab_size and (prepared data) the
     data's tokenizer; open, count and hash every prepared shard (idattn.train.validate.check_shards);
  3. if the workdir holds a run: refuse a hand-edited config.json, compare its saved config (model section and
     data.tokenizer must match; the data and the LR schedule only with train.allow_data_change /
     allow_schedule_change) and its recorded content (identity.json: tokenizer file, data shards);
  4. where the run starts from: train.branch_from = "<workdir>[:<step>]" (parsed once, into a `Branch`) and
     train.init_from, each refused when it names the workdir itself or a run that does not fit;
  5. both data splits hold a batch (train, and val: the final validation always runs).

The mesh, the model's shardings and the lease are the trainer's (idattn.train.trainer.run), after this.
`check_config` is the launchers' dry run: the same value checks without reading data or the workdir.
"""
from __future__ import annotations

import dataclasses
import os
import time
import uuid
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from idattn import models
from idattn.configs import base_config
from idattn.data import formats, pipeline, stdlib_corpus, tokenizer as tok_lib
from idattn.rundir import layout
from idattn.train import optim, validate
from idattn.train.errors import TrainingError, first_line, log
from idattn.train.plan import RunPlan


class Branch(NamedTuple):
    """train.branch_from resolved: the source run's absolute workdir and the committed step read from it."""
    source: str
    step: int


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What a start that passed every refusal carries into the run.

    plan: the config read once (RunPlan); workdir: absolute; tokenizer: loaded and checked; branch: the source to
    read into an empty workdir (None: none, or the branch already has its own checkpoints); other_diffs: config
    changes against the saved run that are allowed (None: no saved run, so config.json is written fresh);
    identity: the identity.json to write once the restore passed."""
    config: Any
    plan: RunPlan
    workdir: str
    tokenizer: Any
    branch: Branch | None
    other_diffs: dict | None
    identity: dict


def preflight(config, workdir: str) -> Preflight:
    """Every check of a start that reads no device state (see the module docstring), in order; raises
    TrainingError with the one line to act on. Writes nothing."""
    if "://" in str(workdir):
        raise TrainingError(f"--workdir={workdir!r}: a URL; the trainer needs a filesystem path (mount the bucket, "
                            f"e.g. with gcsfuse, and pass the mount point)")
    workdir = os.path.abspath(workdir)
    try:
        plan = RunPlan.from_config(config)  # every value checked once; from here on the run reads the plan
        validate.check_workdir(workdir)
    except (validate.ConfigError, ValueError) as e:
        raise TrainingError(str(e)) from e
    check_data_choice(config)
    tokenizer = load_tokenizer(config)
    check_tokenizer(config, tokenizer)
    try:
        validate.check_shards(config)
    except (validate.ConfigError, ValueError, FileNotFoundError) as e:
        raise TrainingError(str(e)) from e
    check_config_edits(workdir)
    other_diffs = check_resume_compatible(workdir, config, plan)
    identity = check_identity(workdir, config, tokenizer)
    branch = check_branch(config, plan, workdir)
    check_init_from(config, plan, workdir)
    try:
        pipeline.check_splits(config.data, tokenizer, ("train", "val"))  # val: the final validation runs
    except (ValueError, KeyError) as e:
        raise TrainingError(str(e)) from e
    return Preflight(config=config, plan=plan, workdir=workdir, tokenizer=tokenizer, branch=branch,
                     other_diffs=other_diffs, identity=identity)


def load_tokenizer(config):
    """config.data.tokenizer, loaded; a missing or unreadable one is refused in one line."""
    try:
        return tok_lib.load_tokenizer(config.data.tokenizer)
    except (ValueError, FileNotFoundError) as e:
        raise TrainingError(f"config.data.tokenizer={config.data.tokenizer!r} could not be loaded: {e}") from e


# Keys that must not change when a run resumes (the checkpoint would not match them).
_RESUME_LOCKED = ("model", "data.tokenizer")
# Keys that must not change when a run with checkpoints resumes unless train.allow_data_change: the checkpoint's
# data position is a stream index into this data (in another corpus it would land on an unrelated document).
_DATA_LOCKED = ("data.source", "data.path")


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
        RunPlan.from_config(saved)  # every value, as for a command's config
    except (validate.ConfigError, ValueError, KeyError, TypeError) as e:
        first = first_line(e).split("; set --config.")[0].split("; add --config.")[0]
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


def check_resume_compatible(workdir: str, config, plan: RunPlan | None = None) -> dict | None:
    """Refuses a changed model config / tokenizer against the run saved in `workdir`, a changed data.path /
    data.source unless train.allow_data_change, and a changed LR schedule unless train.allow_schedule_change.
    Returns the other diffs (None: no saved run). `plan`: `config`'s, when the caller has it."""
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
    jump = check_schedule_change(saved_config, config, steps[-1] if steps else None, live_plan=plan)
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
        data = {"source": str(config.data.get("source", "")), "error": first_line(e)}
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


def lr_at(config, steps, plan: RunPlan | None = None) -> np.ndarray:
    """The decay group's LR of `config` at each of `steps` (float64 numpy). `plan`: `config`'s, when the caller
    has it (a saved run's config is read into its own plan here)."""
    plan = plan if plan is not None else RunPlan.from_config(config)
    fn = optim.schedule_fn(config.train, float(config.train.peak_lr), float(config.train.end_lr),
                           num_steps=plan.num_steps, warmup_steps=plan.warmup_steps)
    return np.asarray(jax.device_get(jax.vmap(fn)(jnp.asarray(steps, jnp.int32))), np.float64)


def check_schedule_change(saved, live, resume_step: int | None, *, live_plan: RunPlan | None = None) -> str | None:
    """None when resuming at `resume_step` keeps the LR of every step so far and of the next one (e.g. a WSD
    run extended in its stable phase); else a message with the jump. Refused unless
    train.allow_schedule_change (then the message is logged)."""
    if resume_step is None:
        return None
    s = int(resume_step)
    probe = np.unique(np.concatenate([np.linspace(0, s, num=min(s + 1, 512)).round(), [s]]).astype(np.int64))
    old, new = lr_at(saved, probe), lr_at(live, probe, live_plan)
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
        load_tokenizer(config)
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
            docs = pipeline.kjv_token_docs(tokenizer, "train", float(d.val_fraction))
            tokens = (f"{sum(len(x) for x in docs):,} train tokens (the embedded KJV text; a smoke-test corpus, not "
                      f"the paper's data)")
        elif source == "stdlib":
            docs = pipeline.stdlib_token_docs(tokenizer, "train")
            tokens = f"{sum(len(x) for x in docs):,} train tokens ({stdlib_corpus.corpus_id()})"
    except Exception as e:  # informative only
        tokens = f"n/a ({type(e).__name__}: {e})"
    path = d.path if source == "arrayrecord" else (d.get("tfds_name", "") if source == "tfds" else "(embedded)")
    vocab, rows = _vocab_size(tokenizer), int(config.model.vocab_size)
    unused = f"; model.vocab_size {rows}: {rows - vocab} rows never used" if vocab is not None and rows > vocab else ""
    return (f"  data: source {source}, path {path or '-'}, tokenizer {d.tokenizer} ({vocab} pieces{unused}), "
            f"{tokens}")


def check_tokenizer(config, tokenizer) -> None:
    """The tokenizer fits model.vocab_size and (prepared data) is the one the data was prepared with."""
    vocab = _vocab_size(tokenizer)
    if vocab is not None and vocab > int(config.model.vocab_size):
        raise TrainingError(f"config.data.tokenizer={config.data.tokenizer!r} has {vocab} tokens but "
                            f"config.model.vocab_size={config.model.vocab_size}; set --config.model.vocab_size={vocab}"
                            f" (or larger) or use a smaller tokenizer")
    if config.data.source == "arrayrecord":
        if not config.data.path:
            raise TrainingError("config.data.source='arrayrecord' needs config.data.path (folder of prepared shards)")
        try:
            formats.check_tokenizer_matches(config.data.path, tokenizer)
        except (ValueError, FileNotFoundError) as e:
            raise TrainingError(f"refusing to train on {config.data.path}: {e}") from e


def _vocab_size(tokenizer) -> int | None:
    for name in ("vocab_size", "n_vocab"):
        v = getattr(tokenizer, name, None)
        if v is not None:
            return int(v() if callable(v) else v)
    return None


def parse_branch(spec: str) -> tuple[str, int | None]:
    """train.branch_from = "<workdir>[:<step>]" -> (the source's absolute path, the step or None: its newest)."""
    src, _, step_s = spec.rpartition(":")
    if not step_s.isdigit():
        return os.path.abspath(spec), None
    return os.path.abspath(src), int(step_s)


def check_branch(config, plan: RunPlan, workdir: str) -> Branch | None:
    """train.branch_from: the source run and step to read into this (empty) workdir, checked before anything is
    written; None when there is no branch source or the branch already committed checkpoints of its own (a branch
    is read once; its resumes do not need the trunk any more). The source is never the workdir itself."""
    if not plan.branch_from:
        return None
    spec = plan.branch_from
    src, step = parse_branch(spec)
    if src == workdir:
        raise TrainingError(f"config.train.branch_from={spec!r} is the workdir itself; branch into a new --workdir")
    if layout.committed_steps(workdir):
        return None
    try:
        saved = layout.load_config(src)
    except FileNotFoundError as e:
        raise TrainingError(f"config.train.branch_from={spec!r}: {e}") from e
    steps = layout.committed_steps(src)
    step = step if step is not None else (steps[-1] if steps else None)
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
    old_lr, new_lr = lr_at(saved, [step])[0], lr_at(config, [step], plan)[0]
    if not np.isclose(old_lr, new_lr, rtol=1e-6):
        log(f"warning: branching at step {step}: the source run's LR there is {old_lr:.3e}, this run's {new_lr:.3e} "
            f"(a decay branch should start where the source's stable phase is: train.schedule=wsd with "
            f"num_steps - decay_steps = {step})")
    return Branch(src, step)


def check_init_from(config, plan: RunPlan, workdir: str) -> None:
    """train.init_from: another run (not this workdir) with the same model config and a committed checkpoint."""
    if not plan.init_from:
        return
    if os.path.abspath(plan.init_from) == workdir:
        raise TrainingError(f"config.train.init_from={plan.init_from!r} is the workdir itself; resuming happens by "
                            f"rerunning the same command, init_from is for starting from another run")
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


def refuse_restart_from_zero(workdir: str, plan: RunPlan) -> None:
    """A workdir that has committed a checkpoint never silently trains from step 0 again (its checkpoints were
    all rejected, or removed): refused unless train.restart_from_scratch, naming what is left. Called once the
    restore found nothing to resume from."""
    if plan.restart_from_scratch:
        return
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
