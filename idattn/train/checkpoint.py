"""Checkpoints of a training run (orbax), the saved config, and `load_params` for evaluation / export.

Layout of a run directory:

    <workdir>/config.json                  the locked config of the run (written once, on the first start)
    <workdir>/checkpoints/<step>/          one orbax checkpoint per saved step, items:
        params/      parameters (float32, sharded save/restore)
        opt_state/   optimiser state
        meta/        {"step", "time", "loss", "bad_steps", "digests": {params, opt_state, data}} (JSON)
        data/        state.json: the data iterator state (global: the same on every process)
    <workdir>/best/<step>/                 the best-of-run parameters by validation loss (params, meta)
    <workdir>/checkpoints.rejected/        checkpoints that failed to read or verify, moved aside
    <workdir>/metrics.jsonl, <workdir>/tb/, <workdir>/eval/

Checkpoints are saved asynchronously (train.async_checkpoint); the manager keeps the last train.keep_last plus
every train.keep_every-th step. A step directory appears only once committed (orbax writes into a temporary
name and renames), so a killed run always resumes from a complete checkpoint.

Integrity: `save` records per-array digests of the parameters and optimiser state (idattn.rundir.integrity,
computed on the devices) and a SHA-256 of the data state in `meta`; `restore_verified` recomputes them on the
restored arrays, checks finiteness, and on any failure moves the checkpoint to `checkpoints.rejected/` and tries
the next older one (or refuses, `train.checkpoint_fallback=false`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from orbax.checkpoint._src.path import atomicity
from orbax.checkpoint.checkpoint_managers import preservation_policy

from idattn.rundir import integrity, layout
from idattn.rundir.layout import BEST_DIR, CKPT_DIR, DATA_STATE_FILE, REJECTED_DIR
from idattn.rundir.loading import CheckpointError
from idattn.train import lease as lease_lib
from idattn.train.errors import TrainingError, first_line, log
from idattn.train.metrics import format_bytes
from idattn.train.plan import RunPlan


class NonFiniteState(CheckpointError):
    """`save` was given a state with NaN/Inf; nothing was written."""


# ------------------------------------------------------------------------------------------------ data state
class DataStateHandler(ocp.CheckpointHandler):
    """Writes each host's data-iterator state (JSON-able value captured at save time) to its own file."""

    def save(self, directory: epath.Path, args: "DataStateSave"):
        # The training stream is global (every process holds the same state, idattn.data.pipeline), so one
        # file from process 0 restores on any process count.
        if jax.process_index() == 0:
            (directory / DATA_STATE_FILE).write_text(json.dumps(_to_jsonable(args.state)))

    def restore(self, directory: epath.Path, args: "DataStateRestore | None" = None):
        path = directory / DATA_STATE_FILE
        if not path.exists():
            i, n = jax.process_index(), jax.process_count()
            legacy = directory / f"process_{i}-of-{n}.json"  # written before the stream was global
            if n == 1 and legacy.exists():
                path = legacy
            else:
                have = sorted(p.name for p in directory.iterdir()) if directory.exists() else []
                raise FileNotFoundError(f"{path} is missing (the folder holds {have})")
        text = path.read_text()
        try:
            return _from_jsonable(json.loads(text))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e}; {len(text)} bytes)") from e

    def metadata(self, directory):
        return None

    def finalize(self, directory):
        pass

    def close(self):
        pass

    @classmethod
    def typestr(cls):
        return f"{cls.__module__}.{cls.__qualname__}"


@ocp.args.register_with_handler(DataStateHandler, for_save=True)
@dataclasses.dataclass
class DataStateSave(ocp.args.CheckpointArgs):
    state: Any


@ocp.args.register_with_handler(DataStateHandler, for_restore=True)
@dataclasses.dataclass
class DataStateRestore(ocp.args.CheckpointArgs):
    pass


def _to_jsonable(x):
    """Iterator states may hold bytes or numpy scalars/arrays; tag them so they come back identical."""
    if isinstance(x, bytes):
        return {"__bytes__": x.decode("latin1")}
    if isinstance(x, np.ndarray):
        return {"__ndarray__": x.tolist(), "dtype": str(x.dtype)}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, dict):
        return {str(k): _to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_jsonable(v) for v in x]
    return x


def _from_jsonable(x):
    if isinstance(x, dict):
        if set(x) == {"__bytes__"}:
            return x["__bytes__"].encode("latin1")
        if set(x) == {"__ndarray__", "dtype"}:
            return np.asarray(x["__ndarray__"], dtype=x["dtype"])
        return {k: _from_jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_from_jsonable(v) for v in x]
    return x


# ---------------------------------------------------------------------------------------------------- manager
def fenced_temporary_path_class(fence, tag: str):
    """orbax's atomic-rename commit, fenced by the workdir lease (train/lease.py): each trainer writes its
    in-flight checkpoint under a name of its own, `<step>.orbax-checkpoint-tmp-<tag>` (`tag` from the lease's
    fencing token, the same on every process of a run), so a trainer that lost its lease while a save was in
    flight never writes into the new owner's temporary folder of the same step; and the rename that commits it
    calls `fence(what)` first, which raises when the lease is no longer this run's. The aborted save's own
    temporary folder is then removed (by its own name; nothing else is touched)."""
    class FencedTemporaryPath(atomicity.AtomicRenameTemporaryPath):
        # orbax uses the class for the step folder and for each item folder inside it; only the step folder
        # (named by its step number) is the run's: the items are renamed inside it.
        @classmethod
        def from_final(cls, final_path, **kwargs):
            obj = super().from_final(final_path, **kwargs)
            if final_path.name.isdigit():
                obj._tmp_path = final_path.parent / f"{final_path.name}{atomicity.TMP_DIR_SUFFIX}-{tag}"
            return obj

        async def finalize(self):
            if not self._final_path.name.isdigit():
                return await super().finalize()
            try:
                fence(f"commit of checkpoint {self._final_path.name}")
            except Exception:
                shutil.rmtree(str(self._tmp_path), ignore_errors=True)
                raise
            await super().finalize()

    return FencedTemporaryPath


def make_manager(workdir: str, train_cfg, *, read_only: bool = False, fence=None,
                 tag: str | None = None) -> ocp.CheckpointManager:
    """The run's orbax manager (rotation from train.keep_last / keep_every / checkpoint_steps). `fence(what)` and
    `tag`: the lease's fencing check and token (fenced_temporary_path_class); None for tools that only read."""
    t = train_cfg  # a RunPlan (idattn.train.plan), or a saved run's config.train for tools that read
    keep_every = int(t.keep_every) if int(t.keep_every) > 0 else None
    pinned = sorted(int(s) for s in (getattr(t, "checkpoint_steps", ()) or ()))
    rotation: dict = dict(max_to_keep=max(1, int(t.keep_last)), keep_period=keep_every)
    if pinned:  # train.checkpoint_steps are kept whatever the rotation says
        policies = [preservation_policy.LatestN(max(1, int(t.keep_last))), preservation_policy.CustomSteps(pinned)]
        if keep_every:
            policies.append(preservation_policy.EveryNSteps(keep_every))
        rotation = dict(preservation_policy=preservation_policy.AnyPreservationPolicy(policies))
    options = ocp.CheckpointManagerOptions(
        **rotation,
        enable_async_checkpointing=bool(t.async_checkpoint) and not read_only,
        create=not read_only,
        read_only=read_only,
        cleanup_tmp_directories=not read_only,
        **({"temporary_path_class": fenced_temporary_path_class(fence, tag)} if fence is not None and tag else {}),
    )
    return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, CKPT_DIR)), options=options,
                                 item_handlers={"params": ocp.StandardCheckpointHandler(),
                                                "opt_state": ocp.StandardCheckpointHandler(),
                                                "meta": ocp.JsonCheckpointHandler(),
                                                "data": DataStateHandler()})


def save(mngr: ocp.CheckpointManager, step: int, state, data_state, meta: dict, *, force: bool = False) -> bool:
    """Saves `state` at `step` with digests of every array and of the data state in its meta."""
    data_json = _to_jsonable(data_state)
    (p_dig, p_bad), (o_dig, o_bad) = integrity.summarize(state.params), integrity.summarize(state.opt_state)
    if p_bad or o_bad:  # never reached through the trainer's step (train/step.py); checked here all the same
        raise NonFiniteState(f"the state at step {step} holds non-finite values ({(p_bad + o_bad)[:3]}); not saved")
    digests = {"algorithm": integrity.ALGORITHM, "params": p_dig, "opt_state": o_dig,
               "data": integrity.json_digest(data_json)}
    args = ocp.args.Composite(params=ocp.args.StandardSave(state.params),
                              opt_state=ocp.args.StandardSave(state.opt_state),
                              meta=ocp.args.JsonSave(dict(meta, step=int(step), digests=digests)),
                              data=DataStateSave(data_state))
    return mngr.save(int(step), args=args, force=force)


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state):
    """Restores (params, opt_state, meta, data_state) at `step` onto the shardings of `abstract_state`."""
    out = mngr.restore(int(step), args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_state.params),
        opt_state=ocp.args.StandardRestore(abstract_state.opt_state),
        meta=ocp.args.JsonRestore(),
        data=DataStateRestore()))
    return out["params"], out["opt_state"], out["meta"], out["data"]


def check_restored(params, opt_state, meta, data_state) -> str | None:
    """None when the restored arrays and data state match the digests in `meta` and are finite; else why."""
    if not isinstance(meta, dict):
        return f"meta is not a JSON object ({type(meta).__name__})"
    dig = meta.get("digests")
    if dig is not None and dig.get("algorithm") != integrity.ALGORITHM:
        return f"meta names checksum algorithm {dig.get('algorithm')!r}, this version computes {integrity.ALGORITHM!r}"
    for what, tree in (("params", params), ("opt_state", opt_state)):
        reason = integrity.verify(tree, None if dig is None else dig.get(what), what)
        if reason:
            return reason
    if dig is not None and integrity.json_digest(_to_jsonable(data_state)) != dig.get("data"):
        return "data: the data-iterator state does not match its checksum"
    return None


class _Foreign(Exception):
    """restore_verified: this checkpoint is another run's (the message says whose)."""


class ConfigMismatch(CheckpointError):
    """A checkpoint whose arrays have other shapes than the config builds: the config is wrong, not the file."""


def shape_mismatch(mngr: ocp.CheckpointManager, step: int, abstract_state) -> str | None:
    """The first parameter whose saved shape differs from `abstract_state`'s ("path: saved (a, b), now (c, d)";
    also a parameter only one side has), or None. Read from the checkpoint's metadata, no array is loaded; a
    checkpoint whose metadata cannot be read gives None (the restore then judges it)."""
    try:
        meta = mngr.item_metadata(int(step))
        saved = meta["params"] if isinstance(meta, dict) or hasattr(meta, "__getitem__") else None
        saved_tree = getattr(saved, "tree", saved)
        flat_saved = {jax.tree_util.keystr(k): tuple(v.shape) for k, v in
                      jax.tree_util.tree_flatten_with_path(saved_tree)[0] if hasattr(v, "shape")}
    except Exception:
        return None
    if not flat_saved:
        return None
    return _compare_shapes(flat_saved, abstract_state.params)


def _compare_shapes(flat_saved: dict, target) -> str | None:
    flat_now = {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_flatten_with_path(target)[0]}
    for k in sorted(set(flat_saved) | set(flat_now)):
        a, b = flat_saved.get(k), flat_now.get(k)
        if a != b:
            return f"params{k}: saved {a if a is not None else 'absent'}, now {b if b is not None else 'absent'}"
    return None


def _tree_shape_mismatch(restored, target) -> str | None:
    return _compare_shapes({jax.tree_util.keystr(k): tuple(v.shape) for k, v in
                            jax.tree_util.tree_flatten_with_path(restored)[0]}, target)


def _config_mismatch(where: str, workdir: str, mismatch: str) -> "ConfigMismatch":
    """A config that does not match the run, not damage: never moved aside."""
    return ConfigMismatch(
        f"checkpoint {where} holds other parameter shapes than this config builds ({mismatch}): the config is not "
        f"the one the run was trained with (was {os.path.join(workdir, 'config.json')} edited?). Nothing was "
        f"moved; rerun with the config the run was trained with, or use a new --workdir.")


def all_processes_agree(ok: bool) -> bool:
    """True only when every process says ok (one collective; a no-op with one process)."""
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok, np.int32))))


def reject(workdir: str, step: int, reason: str) -> str:
    """Moves checkpoint `step` aside (process 0) into checkpoints.rejected/, with the reason beside it."""
    src = os.path.join(workdir, CKPT_DIR, str(step))
    dst_dir = os.path.join(workdir, REJECTED_DIR)
    dst = os.path.join(dst_dir, f"{step}.{time.strftime('%Y%m%d-%H%M%S')}")
    if jax.process_index() == 0 and os.path.exists(src):
        os.makedirs(dst_dir, exist_ok=True)
        os.replace(src, dst)
        with open(dst + ".reason.txt", "w") as f:
            f.write(reason + "\n")
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"idattn-reject-{step}")
    return dst


def foreign_run(where: str, run_id: str | None) -> str | None:
    """Why checkpoint folder `where` belongs to another run (its meta names another run id), or None. Read from
    the meta item's file, before anything is loaded; checkpoints saved before run ids were recorded pass."""
    if not run_id:
        return None
    try:
        with open(os.path.join(where, "meta", "metadata")) as f:
            theirs = json.load(f).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None  # unreadable: the restore judges it
    if theirs and theirs != run_id:
        return (f"copied from another run (its meta names run {str(theirs)[:12]}, this workdir's identity.json run "
                f"{run_id[:12]})")
    return None


def restore_verified(mngr: ocp.CheckpointManager, workdir: str, abstract_state, *, fallback: bool = True,
                     log=print, step: int | None = None, run_id: str | None = None):
    """The newest checkpoint that reads and verifies: (step, params, opt_state, meta, data_state), or None when
    the workdir has no committed checkpoint. A failing one is named with the reason and moved aside; with
    fallback=False the first failure raises CheckpointError instead (nothing is moved). `step`: only that one.
    `run_id`: the workdir's run id; a checkpoint of another run (copied in) is rejected like a damaged one, before
    its shapes are compared (a copy of another size would otherwise read as an edited config)."""
    steps = sorted(mngr.all_steps(), reverse=True) if step is None else [int(step)]
    rejected = []
    for step in steps:
        where = os.path.join(workdir, CKPT_DIR, str(step))
        foreign = foreign_run(where, run_id)
        if foreign is None:
            mismatch = shape_mismatch(mngr, step, abstract_state)  # from the metadata: before loading anything
            if mismatch:
                raise _config_mismatch(where, workdir, mismatch)
        try:
            if foreign is not None:
                raise _Foreign(foreign)
            params, opt_state, meta, data_state = restore(mngr, step, abstract_state)
            # orbax restores an array at its saved shape whatever the target says: check again on the arrays
            mismatch = _tree_shape_mismatch(params, abstract_state.params)
            if mismatch:
                raise _config_mismatch(where, workdir, mismatch)
            reason = check_restored(params, opt_state, meta, data_state)
        except ConfigMismatch:
            raise
        except _Foreign as e:
            params = opt_state = meta = data_state = None
            reason = str(e)
        except Exception as e:  # orbax / tensorstore / JSON errors: any of them means this one is unusable
            params = opt_state = meta = data_state = None
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            reason = f"unreadable ({type(e).__name__}: {first[:300]})"
        ok = all_processes_agree(reason is None)
        if ok:
            if rejected:
                log(f"falling back to checkpoint {step} ({where}): it verifies; rejected: " + "; ".join(rejected))
            elif meta.get("digests") is None:
                log(f"checkpoint {step} predates checksums: checked for finiteness only")
            return step, params, opt_state, meta, data_state
        reason = reason or "another process could not read or verify it"
        if not fallback:
            raise CheckpointError(f"checkpoint {where} failed verification: {reason}; refusing to resume "
                                  f"(train.checkpoint_fallback=false). Move it aside to fall back to an older one.")
        dst = reject(workdir, step, reason)
        log(f"checkpoint {step} {'is not this run' + chr(39) + 's' if foreign else 'is damaged'}: {reason}; moved "
            f"to {dst}")
        rejected.append(f"{step} ({reason})")
        mngr.reload()
    if rejected:
        raise CheckpointError(f"no checkpoint in {os.path.join(workdir, CKPT_DIR)} verifies (rejected, moved to "
                              f"{os.path.join(workdir, REJECTED_DIR)}: {'; '.join(rejected)}); use a new --workdir "
                              f"or restore a copy")
    return None


def background_error(mngr: ocp.CheckpointManager) -> BaseException | None:
    """The error of a finished background save, or None, without waiting for a running one.

    `check_for_errors()` surfaces the item writers' errors; the step folder is committed (renamed) by the
    manager's own finalize thread, whose error orbax 0.12 only raises in the next save or wait. This reads it
    (a private attribute; None if a later orbax changes it, and the next save then reports it)."""
    mngr.check_for_errors()
    try:
        thread = mngr._finalize_thread.map(lambda t: t)  # noqa: SLF001
    except AttributeError:
        return None
    if thread is not None and not thread.is_alive():
        return getattr(thread, "exception", None)
    return None


def disk_free_bytes(path: str) -> int:
    return int(shutil.disk_usage(path).free)


# -------------------------------------------------------------------------------------------- the run's policy
def state_nbytes(abstract_state) -> int:
    """Bytes of one checkpoint (parameters + optimiser state, as saved)."""
    return int(sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                   for a in jax.tree.leaves((abstract_state.params, abstract_state.opt_state))))


def time_to_save(every_s: float, last: float, step: int, process_count: int, log_every: int) -> bool:
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


class Checkpointer:
    """One run's checkpoint policy over its orbax manager (as levanter's Checkpointer): when a save is due, what
    the rotation keeps, whether the disk has room, progress.json, and the one-line stop when a save fails.

    Due at step s when  s % checkpoint_every = 0,  s = num_steps,  s ∈ checkpoint_steps,  or checkpoint_minutes
    of wall time passed since the last save (`time_to_save`). Rotation: the keep_last newest, every keep_every-th
    and the checkpoint_steps are kept. Room: a save needs free ≥ 1.1 · state_bytes, after deleting first what
    the rotation would delete after it; free < 3 · state_bytes is warned about. Every write is fenced by the
    workdir lease (`fence.check(what)`, train/lease.py); process 0 writes the metadata (`is_main`).
    """

    def __init__(self, workdir: str, plan: RunPlan, *, state_bytes: int, fence, tag: str, is_main: bool):
        self.workdir, self.plan, self.fence = workdir, plan, fence
        self.state_bytes, self.is_main = state_bytes, is_main
        self.mngr = make_manager(workdir, plan, fence=fence.check, tag=tag)
        self.pinned = set(plan.checkpoint_steps)
        self.last_save_time = time.monotonic()

    # ---- cadence
    def start_clock(self) -> None:
        """checkpoint_minutes counts from now (the first step of this start), not from the restore."""
        self.last_save_time = time.monotonic()

    def due(self, step: int) -> bool:
        """Whether step `step` saves (the class docstring); every process gets the same answer."""
        p = self.plan
        return (step % p.checkpoint_every == 0 or step == p.num_steps or step in self.pinned
                or time_to_save(60.0 * p.checkpoint_minutes, self.last_save_time, step, jax.process_count(),
                                p.log_every))

    # ---- saving
    def save(self, s: int, state, data_state, meta: dict, *, force: bool = False) -> None:
        """Saves `state` and the data position at step `s` (in the background with train.async_checkpoint), after
        the checks above; `meta` is stored beside them with the time of the save. A failure stops the run naming
        the last committed checkpoint."""
        self.check_saves(s)
        self.fenced(s, f"checkpoint {s}")
        self.record_progress(s)
        fmt = format_bytes
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
        try:
            save(self.mngr, s, state, data_state, {"time": time.time(), **meta}, force=force)
        except NonFiniteState as e:
            raise TrainingError(f"{e}. Stopping; last finite checkpoint: {self.last_committed()}. Lower "
                                f"train.peak_lr or check the data, then rerun.") from e
        except lease_lib.LeaseLost as e:
            raise self.fenced_out(s, e) from None
        except Exception as e:
            raise self.save_failed(s, e) from None
        self.last_save_time = time.monotonic()

    def saved(self, s: int) -> bool:
        """Whether step `s` is committed or being saved already (a stop at a step that just saved saves nothing)."""
        return s in layout.committed_steps(self.workdir) or self.mngr.latest_step() == s

    def wait_committed(self, s: int) -> None:
        """Blocks until checkpoint `s` is committed; a save that failed in the background stops the run in one
        line naming the last committed checkpoint (the rerun trains from there)."""
        try:
            self.mngr.wait_until_finished()
        except lease_lib.LeaseLost as e:
            raise self.fenced_out(s, e) from None
        except Exception as e:
            raise self.save_failed(s, e) from None
        self.check_saves(s)
        if s not in layout.committed_steps(self.workdir):
            raise self.save_failed(s, RuntimeError(f"checkpoint {s} was not committed"))

    def finish(self, s: int) -> None:
        """The end of the steps (done or stopped at `s`): every save committed and checked, progress.json."""
        self.mngr.wait_until_finished()
        self.check_saves(s)
        self.record_progress(s)

    def keep_if_best(self, step: int, params, val_loss: float, best_loss: float) -> float:
        """train.keep_best: keeps `params` of `step` in best/ when `val_loss` is below `best_loss`, the best so
        far; returns the new best. A failed write stops the run (it is not done until best/ is written)."""
        if not self.plan.keep_best or val_loss >= best_loss:
            return best_loss
        self.fenced(step, f"best/ at step {step}")
        try:
            where = save_best(self.workdir, step, params, val_loss)
        except lease_lib.LeaseLost as e:
            raise self.fenced_out(step, e) from None
        except Exception as e:  # orbax/tensorstore raise their own types for a full disk (RESOURCE_EXHAUSTED)
            kept = layout.best_info(self.workdir)
            raise TrainingError(
                f"could not write best/ at step {step}: {type(e).__name__}: {first_line(e)[:300]}. best/ keeps "
                f"{'step ' + str(kept.get('step')) if kept else 'nothing'}; last committed checkpoint: "
                f"{self.last_committed()}. The run is not done until best/ is written: free space, then rerun (it "
                f"writes best/ from the committed checkpoint or trains on from it).") from None
        log(f"best validation loss so far: kept step {step} in {where}")
        return val_loss

    def close(self) -> None:
        """Waits for pending saves (a failure here is reported, never masking the error being raised), then
        releases the manager."""
        try:
            self.mngr.wait_until_finished()
        except Exception as e:  # don't mask the original error
            print(f"warning: waiting for pending checkpoint saves failed: {first_line(e)}", file=sys.stderr)
        try:
            self.mngr.close()
        except Exception as e:  # e.g. the workdir vanished under an in-flight save: the error being raised says why
            print(f"warning: closing the checkpoint manager failed: {first_line(e)}", file=sys.stderr)

    # ---- rotation, room, progress
    def _rotation_victims(self, s: int) -> list[int]:
        """Committed steps that the rotation after saving step `s` deletes anyway (train.keep_last newest are kept,
        counting `s`; keep_every multiples and checkpoint_steps never go)."""
        keep_last, keep_every = self.plan.keep_last, self.plan.keep_every
        steps = [x for x in layout.committed_steps(self.workdir) if x != s]
        keep = set(steps[-(keep_last - 1):]) if keep_last > 1 else set()
        return [x for x in steps
                if x not in keep and x not in self.pinned and not (keep_every > 0 and x % keep_every == 0)]

    def _free_bytes(self) -> int | None:
        """Free bytes where the checkpoints go; None when that cannot be read (never a reason to stop)."""
        try:
            return disk_free_bytes(os.path.join(self.workdir, CKPT_DIR))
        except Exception:  # informative only
            return None

    def _make_room(self, s: int) -> int | None:
        """Free bytes for checkpoint `s`, after deleting first what its rotation would delete after it (so that a
        lowered train.keep_last takes effect on a full disk); None when the free space cannot be read."""
        free = self._free_bytes()
        if free is None or free >= 1.1 * self.state_bytes:
            return free
        victims = self._rotation_victims(s)
        if victims:
            self.mngr.wait_until_finished()
            self.fenced(s, f"deleting rotated checkpoints {victims}")
            for v in victims:
                self.mngr.delete(v)
            log(f"low on disk space: deleted checkpoint(s) {victims} before saving step {s} instead of after "
                f"(train.keep_last={self.plan.keep_last})")
            free = self._free_bytes()
        return free

    def record_progress(self, s: int) -> None:
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

    # ---- fault boundaries: each returns (or raises) the one line that stops the run
    def last_committed(self) -> str:
        """The newest committed checkpoint's folder (after any save in flight ended), or "none (...)"."""
        try:
            self.mngr.wait_until_finished()
        except Exception:  # the failed save itself; what is on disk is what counts
            pass
        steps = layout.committed_steps(self.workdir)
        return (os.path.join(self.workdir, CKPT_DIR, str(steps[-1])) if steps else
                "none (no checkpoint was committed yet)")

    def check_saves(self, s: int) -> None:
        """A failed background save (no space, permissions, quota) stops the run at once, saying what is kept;
        so does a lease another trainer took over."""
        try:
            err = background_error(self.mngr)
        except lease_lib.LeaseLost as e:
            raise self.fenced_out(s, e) from None
        except Exception as e:
            err = e
        if isinstance(err, lease_lib.LeaseLost) or getattr(self.fence, "lost", None):
            raise self.fenced_out(s, err if isinstance(err, lease_lib.LeaseLost) else self.fence.lost)
        if err is not None:
            raise self.save_failed(s, err) from None

    def fenced(self, s: int, what: str) -> None:
        """The lease check before a write (train/lease.py): a trainer that was taken over stops here, writing
        nothing more."""
        try:
            self.fence.check(what)
        except lease_lib.LeaseLost as e:
            raise self.fenced_out(s, e) from None

    def fenced_out(self, s: int, e: BaseException) -> TrainingError:
        # moved (or deleted): the folder is gone, or holds no config.json any more (an in-flight save may have
        # re-created the bare path)
        if not os.path.exists(os.path.join(self.workdir, layout.CONFIG_FILE)):
            return TrainingError(f"stopping at step {s} without writing: {lease_lib.MOVED.format(workdir=self.workdir)}"
                                 f"; no other trainer is involved. Rerun the command with --workdir=<its new path> "
                                 f"to resume from its last committed checkpoint.")
        return TrainingError(f"stopping at step {s} without writing: {e}. Another trainer took over {self.workdir}; "
                             f"this process wrote nothing after that (its in-flight checkpoint, if any, is "
                             f"discarded) and the new owner's files are untouched.")

    def save_failed(self, s: int, e: BaseException) -> TrainingError:
        return TrainingError(f"checkpoint save failed at step {s}: {type(e).__name__}: {first_line(e)}. Stopping "
                             f"so that no more work is lost; last committed checkpoint: {self.last_committed()}. "
                             f"Free space or fix the workdir's permissions, then rerun (it resumes from there).")

    def write_failed(self, s: int, what: str, e: OSError) -> TrainingError:
        return TrainingError(f"could not write {what} at step {s}: {type(e).__name__}: {first_line(e)}. Stopping "
                             f"so that no more work is lost; last committed checkpoint: {self.last_committed()}. "
                             f"Free space or fix the workdir's permissions, then rerun (it resumes from there).")


# ------------------------------------------------------------------------------------------------------ best
def save_best(workdir: str, step: int, params, val_loss: float) -> str:
    """Writes the parameters at `step` to <workdir>/best/<step> (with digests), then removes the older best.

    Written whole under a temporary name and renamed, so a crash leaves the previous best intact. Every
    process calls it (the array write is collective); the renames are process 0's."""
    root = os.path.join(os.path.abspath(workdir), BEST_DIR)
    tmp = os.path.join(root, f".{step}.tmp")
    final = os.path.join(root, str(step))
    if jax.process_index() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(root, exist_ok=True)
    _sync(f"idattn-best-start-{step}")
    try:
        with ocp.StandardCheckpointer() as c:
            c.save(epath.Path(tmp) / "params", params)
        meta = {"step": int(step), "val_loss": float(val_loss), "digests": {
            "algorithm": integrity.ALGORITHM, "params": integrity.state_digests(params)}}
        if jax.process_index() == 0:
            with open(os.path.join(tmp, "meta.json"), "w") as f:
                json.dump(meta, f, indent=1)
            if os.path.exists(final):
                shutil.rmtree(final)
            os.replace(tmp, final)
    except BaseException:
        if jax.process_index() == 0:  # a failed write leaves the previous best/ alone and no half-written copy
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if jax.process_index() == 0:
        for n in os.listdir(root):
            if n.isdigit() and int(n) != int(step):
                shutil.rmtree(os.path.join(root, n), ignore_errors=True)
    _sync(f"idattn-best-done-{step}")
    return final


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
