"""The training loop (docs/training.md): `run(config, workdir)` is what `python -m idattn.train` calls.

A run, in order, so that a refused start writes nothing:
  1. `preflight` (train/preflight.py): every refusal that reads no device state: the config read once into the
     typed `RunPlan` the run reads from then on, the tokenizer and the data, a saved run's config and content,
     where the run starts from (branch_from / init_from);
  2. the mesh (it must divide the batch) and the compiled functions (`build_setup`, abstract: nothing allocated);
  3. only then the workdir and its lease (one trainer per workdir, train/lease.py), the state built or restored
     (verified, falling back past damaged checkpoints; a shape mismatch, or a workdir that committed before but
     has nothing to restore, is refused), and only once that passed config.json, metrics.jsonl reconciled with
     the checkpoint's copy, and the steps (or what a finished run still owes).

Faults (docs/training.md, "Faults and what survives them"): a non-finite step is never applied (train/step.py)
and stops the run unless train.max_bad_steps allows dropping it; a failed checkpoint save or metrics write stops
the run at the next step naming the last committed checkpoint; every write is fenced by the lease (a trainer that
was taken over stops before it writes again); SIGTERM and a first SIGINT save at the next step boundary. The
checkpoint policy (cadence, rotation, disk room, progress.json) is `checkpoint.Checkpointer`'s; the state's
placement and the compiled functions are `placement.build_setup`'s.
"""
from __future__ import annotations

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
from jax.experimental import multihost_utils

from idattn import models
from idattn.data import pipeline
from idattn.rundir import layout, loading
from idattn.rundir.schema import read_results, write_result
from idattn.train import checkpoint as ckpt
from idattn.train import lease as lease_lib
from idattn.train import metrics as metrics_lib
from idattn.train import sharding as shd
from idattn.train import tracker as tracker_lib
from idattn.train.errors import TrainingError, first_line, log
from idattn.train.plan import RunPlan
from idattn.train.preflight import (Branch, Preflight, describe_data, preflight,
                                    refuse_restart_from_zero)
# the refusals, also the trainer's API (the launchers' dry run, tests)
from idattn.train.preflight import (check_config, check_data_choice, check_resume_compatible,  # noqa: F401
                                    check_schedule_change)
from idattn.train.placement import Setup, build_setup, hbm_estimate  # noqa: F401  (build_setup: also for tools)
from idattn.train.step import TrainState
from idattn.train.watchdog import StallWatchdog, debug_stall_step


def _maybe(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # informative extras only; never stop training for them
        return f"n/a ({type(e).__name__}: {e})"


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

    summary: {"status": "done" | "preempted" | "interrupted" | "already_done", "step", "loss", "val_loss",
              "val_ppl", "num_params", "bad_steps", "wall_time"}
    """
    t0 = time.time()
    pre = preflight(config, workdir)  # every refusal that reads no device state; nothing is written before
    setup, micro = _mesh_and_setup(pre, devices)
    lease = _take_lease(pre.workdir, pre.plan)  # the first write
    try:
        token = _broadcast_token(lease.token if lease is not None else None)
        # Process 0 holds the lease and makes every write a fence guards (metadata, the commit's rename); the
        # others only write their array shards into process 0's uniquely named folder. Their checks would be
        # collective-breaking (one process raising before a collective save while the others enter it), so
        # they do not fence: a fenced-out process 0 stops, and the others lose contact with it and stop.
        fence = lease if lease is not None else lease_lib.NO_FENCE
        return _train(pre, t0=t0, setup=setup, micro=micro, fence=fence, tag=token[:12])
    finally:
        if lease is not None:
            lease.release()


def _mesh_and_setup(pre: Preflight, devices) -> tuple[Setup, int]:
    """The mesh (refused when it does not divide the batch or the sequence) and the run's compiled functions
    (abstract: traces shapes only, allocates nothing). Returns (setup, microbatch per step)."""
    plan = pre.plan
    try:
        mesh = shd.make_mesh(pre.config.mesh, devices)
        micro = shd.check_batch_divisible(plan.batch_size, plan.grad_accum, mesh, jax.process_count())
        shd.check_sequence_split(plan.seq_len, mesh)
        return build_setup(pre.config, mesh, plan=plan), micro
    except (ValueError, KeyError) as e:
        raise TrainingError(str(e)) from e


def _take_lease(workdir: str, plan: RunPlan) -> lease_lib.Lease | None:
    """Creates the workdir and takes its lease (process 0; the others get None), or refuses in one line on every
    process: another live trainer holds it, or the workdir cannot be written."""
    lease, held = None, None
    if jax.process_index() == 0:
        try:
            os.makedirs(workdir, exist_ok=True)
            lease = lease_lib.Lease(workdir, heartbeat_s=plan.lease_heartbeat_s, stale_s=plan.lease_stale_s,
                                    log=log).acquire()
        except lease_lib.LeaseHeld as e:
            held = str(e)
        except OSError as e:  # a full disk or a read-only mount: the lease is the first file written
            held = (f"cannot write the workdir lease in {workdir}: {type(e).__name__}: {e.strerror or first_line(e)}"
                    f"; nothing was written. Free space or fix the workdir's permissions / mount, then rerun")
    if not ckpt.all_processes_agree(held is None):
        raise TrainingError(held or "process 0 could not take the workdir lease (its log says why)")
    return lease


def _broadcast_token(token: str | None) -> str:
    """Process 0's lease token on every process (the fencing token and the name of its in-flight checkpoints)."""
    if jax.process_count() == 1:
        return str(token)
    raw = np.frombuffer(bytes.fromhex(token), np.uint8) if token else np.zeros(16, np.uint8)
    return bytes(np.asarray(multihost_utils.broadcast_one_to_all(raw), np.uint8)).hex()


def _write_config(pre: Preflight, fence) -> None:
    """config.json and identity.json, written only once every check of this start has passed (restore included),
    so a refused rerun leaves both as the run wrote them."""
    if jax.process_index() != 0:
        return
    workdir, other_diffs = pre.workdir, pre.other_diffs
    fence.check(layout.IDENTITY_FILE)
    layout.write_identity(workdir, pre.identity)
    if other_diffs is None:
        fence.check("config.json")
        layout.save_config(workdir, pre.config)
    elif other_diffs:
        log("config changes against the saved run (allowed; model and tokenizer are unchanged): "
            + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in other_diffs.items()))
        fence.check("config.json")
        layout.archive_config(workdir, layout.committed_steps(workdir))
        layout.save_config(workdir, pre.config)


def _train(pre: Preflight, *, t0: float, setup: Setup, micro: int, fence, tag: str) -> dict[str, Any]:
    """The phases of a run once it may write: report, restore (or branch / init), config.json, the metrics log,
    what a finished run still owes or the loop, the summary."""
    _log_startup(pre, setup, micro)
    # a checkpoint must carry this run's id once the run has recorded one (a copy from another run is rejected)
    check_id = pre.identity["run_id"] if layout.read_identity(pre.workdir) is not None else None
    loop = _Loop(pre, setup=setup, micro=micro, fence=fence, tag=tag)
    try:
        loop.restore(pre.branch, check_id)
        _write_config(pre, fence)
        loop.open_writer()
    except lease_lib.LeaseLost as e:
        loop.close()
        raise TrainingError(f"stopping before training: {e}") from None
    except BaseException:
        loop.close()
        raise
    if loop.start_step >= pre.plan.num_steps:
        summary = loop.finish_owed()
        return dict(summary, wall_time=time.time() - t0)
    summary = loop.run()
    summary.update(bad_steps=loop.bad_steps, wall_time=time.time() - t0)
    if jax.process_count() > 1 or os.environ.get("IDATTN_LOG_ALL_PROCESSES"):
        print(f"[process {jax.process_index()}] final step {summary['step']} loss {summary['loss']!r}", flush=True)
    return summary


def _log_startup(pre: Preflight, setup: Setup, micro: int) -> None:
    config, plan = pre.config, pre.plan
    mesh, n_params = setup.mesh, setup.n_params
    est = hbm_estimate(n_params, config, mesh, plan)
    fmt = metrics_lib.format_bytes
    log(f"idattn.train: workdir {pre.workdir}")
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
    log(describe_data(config, pre.tokenizer))
    log(f"  schedule: {plan.num_steps} steps x {plan.batch_size} x {plan.seq_len} tokens (grad_accum "
        f"{plan.grad_accum}, microbatch {micro}), warmup {plan.warmup_steps}, peak lr {plan.peak_lr:g} (ssm "
        f"{min(plan.peak_lr, plan.ssm_lr_cap):g}) -> {plan.end_lr:g}"
        + (f"; a step that takes over {plan.stall_minutes:g} min stops the run (train.stall_minutes)"
           if plan.stall_minutes else ""))


class _StepTimer:
    """Step time and data wait, averaged over the steps since the last log line. The first step of a start
    compiles: it is timed alone and kept out of the step time, the throughput and the ETA."""

    def __init__(self):
        self.first = float("nan")
        self.restart()

    def restart(self) -> None:
        self.steps, self.data_wait, self.t0 = 0, 0.0, time.perf_counter()

    def first_step_done(self, metrics) -> None:
        jax.block_until_ready(metrics)
        self.first = time.perf_counter() - self.t0
        log(f"first step done in {self.first:.1f} s (includes compilation)")
        self.restart()

    def step_time(self) -> float:
        return (time.perf_counter() - self.t0) / self.steps if self.steps else self.first


def _test_step_delay() -> float:
    """IDATTN_DEBUG_STEP_SLEEP: seconds each step sleeps, so that a test can stop or kill a run mid-way (unset,
    0, in real runs)."""
    return float(os.environ.get("IDATTN_DEBUG_STEP_SLEEP", "0") or 0)


class _Loop:
    """One run's training loop and what it carries between steps: the state, the data iterator and its
    position, the checkpoints (`ckpt.Checkpointer`: cadence, rotation, room), the metrics writer, the count of
    dropped (non-finite) steps.

    Phases: `restore` (a verified checkpoint of this run, else a branch source, else init / init_from), `run`
    (the steps; each step's finiteness is read one step late so the host never waits on the device, except at
    log / checkpoint / eval steps), with `save`, `evaluate`, `check_finite` and the checkpointer's `check_saves`
    as the fault boundaries: each either completes or stops the run naming the last committed checkpoint."""

    def __init__(self, pre: Preflight, *, setup: Setup, micro: int, fence, tag: str):
        plan, config = pre.plan, pre.config
        self.config, self.plan, self.workdir, self.setup = config, plan, pre.workdir, setup
        self.tokenizer, self.micro, self.fence, self.run_id = pre.tokenizer, micro, fence, pre.identity["run_id"]
        self.num_steps, self.tokens_per_step, self.seq_len = plan.num_steps, plan.tokens_per_step, plan.seq_len
        self.mesh = setup.mesh
        self.is_main = jax.process_index() == 0
        self.checkpoints = ckpt.Checkpointer(self.workdir, plan, state_bytes=ckpt.state_nbytes(setup.abstract_state),
                                             fence=fence, tag=tag, is_main=self.is_main)
        self.mngr = self.checkpoints.mngr
        self.restored_meta: dict = {}
        # a sequence group across hosts: every process reads the whole global batch and keeps its devices' blocks
        self.full_batches = shd.sequence_spans_processes(self.mesh)
        self.data_iter = pipeline.make_train_iterator(
            config.data, pre.tokenizer, global_batch_size=plan.batch_size, seq_len=self.seq_len,
            seed=int(config.data.shuffle_seed), process_index=0 if self.full_batches else jax.process_index(),
            process_count=1 if self.full_batches else jax.process_count())
        self.state = None
        self.start_step = 0
        self.bad_steps = 0
        self.max_bad = plan.max_bad_steps
        self.eval_data = None
        self.run_info = {"workdir": self.workdir, "mixer": models.model_label(config.model),
                         "params": setup.n_params}
        self.summary: dict[str, Any] = {"status": "done", "step": 0, "loss": None, "val_loss": None,
                                        "val_ppl": None, "num_params": setup.n_params}
        self.writer = None

    # ---- state
    def restore(self, branch: Branch | None, run_id: str | None = None) -> None:
        """The state to start from: this run's newest checkpoint that verifies, else the branch source's, else a
        fresh init (with train.init_from's parameters); `run_id`: the run a checkpoint must belong to."""
        plan, workdir, setup = self.plan, self.workdir, self.setup
        try:
            restored = ckpt.restore_verified(self.mngr, workdir, setup.abstract_state,
                                             fallback=plan.checkpoint_fallback, log=log, run_id=run_id)
            if restored is None and branch is not None:
                src_mngr = ckpt.make_manager(branch.source, plan, read_only=True)
                try:
                    restored = ckpt.restore_verified(src_mngr, branch.source, setup.abstract_state, fallback=False,
                                                     log=log, step=branch.step)
                finally:
                    src_mngr.close()
                log(f"branched from {os.path.join(branch.source, layout.CKPT_DIR, str(branch.step))} (full state: "
                    f"parameters, optimiser, data position; step {branch.step})")
        except ckpt.CheckpointError as e:
            raise TrainingError(str(e)) from None
        if restored is None and branch is None:
            refuse_restart_from_zero(workdir, plan)
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
            f"{self.checkpoints.last_committed()} (a checkpoint only ever holds a finite state). Lower train.peak_lr "
            f"or raise train.warmup_steps, check the data, or allow dropping a few bad batches with "
            f"--config.train.max_bad_steps=<N>; then rerun (it resumes from that checkpoint).")

    # ---- evaluation
    def evaluate(self, step: int) -> tuple[float, float]:
        """The trainer's validation (docs/evaluation.md): the first train.eval_batches packed held-out batches."""
        if self.eval_data is None:
            self.eval_data = pipeline.make_eval_batches(
                self.config.data, self.tokenizer, batch_size=self.micro, seq_len=self.seq_len,
                num_batches=self.plan.eval_batches)
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
            self.checkpoints.fenced(step, f"eval/ result of step {step}")
            try:
                write_result(self.workdir, "validation", step, {"loss": loss, "ppl": ppl}, run=self.run_info,
                             details={"tokens": cnt, "batches": len(self.eval_data), "seq_len": self.seq_len})
                self.writer.scalar("validation/loss", loss, step)
                self.writer.scalar("validation/ppl", ppl, step)
            except lease_lib.LeaseLost as e:
                raise self.checkpoints.fenced_out(step, e) from None
            except OSError as e:
                raise self.checkpoints.write_failed(step, "the validation result", e) from None
        log(f"validation step {step}: loss {loss:.4f} ppl {ppl:.3f} ({int(cnt)} tokens)")
        return loss, ppl

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
            self.checkpoints.keep_if_best(step, self.state.params, val_loss, best_loss)
            return dict(self.summary, status="done")
        finally:
            self.close()

    def close(self) -> None:
        """Waits for pending saves (a failure here is reported, never masking the error being raised), then
        releases the manager, the writer and the data workers."""
        self.checkpoints.close()
        if self.writer is not None:
            self.writer.close()
        if hasattr(self.data_iter, "close"):
            self.data_iter.close()

    # ---- the steps
    def run(self) -> dict[str, Any]:
        """The steps from start_step to num_steps, or to a preemption / Ctrl-C (saved at that step boundary)."""
        self._begin()
        preempt = _Preemption()
        preempt.install()
        step = self.start_step
        stall = StallWatchdog(self.plan.stall_minutes)
        try:
            while step < self.num_steps:
                if _should_stop(preempt, self.mngr, step, jax.process_count(), self.plan.log_every):
                    self._stop(step, preempt)
                    break
                step = self.step(step)
                stall.arm()
            else:
                if self.pending is not None:
                    self.summary["loss"] = self.check_finite(*self.pending)
            self.checkpoints.finish(step)
        finally:
            stall.disarm()
            preempt.uninstall()
            self.close()
        return self.summary

    def _begin(self) -> None:
        """What the steps carry from one to the next, set before the first step of this start."""
        self.peak_flops = metrics_lib.peak_flops_per_device(jax.devices()[0].device_kind,
                                                            self.plan.peak_tflops_per_device)
        flops_tok = _maybe(models.flops_per_token, self.config.model, self.seq_len)  # fwd + bwd FLOPs per token
        self.train_flops_tok = float(flops_tok) if isinstance(flops_tok, (int, float)) else None
        self.checkpoints.start_clock()
        self.step_delay_s = _test_step_delay()
        self.stall_at = debug_stall_step()
        self.pending: tuple[int, Any] | None = None  # (step, metrics) not yet checked for finiteness
        self.timer = _StepTimer()
        self.data_state = self.data_iter.get_state()
        best = layout.best_info(self.workdir) if self.plan.keep_best else None
        self.best_loss = float(best["val_loss"]) if best else math.inf

    def step(self, step: int) -> int:
        """One update (train/step.py: a non-finite one is not applied): the next batch, the jitted step, the
        previous step's finiteness (read one step late, so the host never waits on the device), then what is due
        at the new step. Returns the new step."""
        t = time.perf_counter()
        batch = self._next_batch()
        self.timer.data_wait += time.perf_counter() - t
        with self.setup.context():
            self.state, m = self.setup.train(self.state, batch)
        step += 1
        self.timer.steps += 1
        if self.pending is not None:
            self.check_finite(*self.pending)
        self.pending = (step, m)
        if step == self.start_step + 1:  # keep compilation out of the step time, the throughput and the ETA
            self.timer.first_step_done(m)
        if self.step_delay_s:  # tests only: a run slow enough to stop or kill mid-way
            time.sleep(self.step_delay_s)
        if step == self.stall_at:  # tests only: a step that never ends (the stall watchdog's case)
            threading.Event().wait()
        self.checkpoints.check_saves(step)
        self._due(step, m)
        return step

    def _next_batch(self) -> dict:
        """The next global batch; the data position after it is what the next checkpoint saves."""
        batch_np = next(self.data_iter)
        self.data_state = self.data_iter.get_state()
        to_global = shd.global_batch_from_full if self.full_batches else shd.global_batch_from_local
        return to_global({k: batch_np[k] for k in self.setup.batch_shardings}, self.mesh)

    def _due(self, step: int, m) -> None:
        """What step `step` owes: a log line, a checkpoint, an evaluation (each reads the step's loss first)."""
        plan, summary = self.plan, self.summary
        is_log = step % plan.log_every == 0 or step == self.num_steps
        is_ckpt = self.checkpoints.due(step)
        is_eval = (plan.eval_every > 0 and step % plan.eval_every == 0) or step == self.num_steps
        if is_log or is_ckpt or is_eval:
            summary.update(step=step, loss=self.check_finite(*self.pending))
            self.pending = None
        if is_log:
            self._log_step(step, m)
        if is_ckpt:
            self.save(step)
            if step == self.num_steps:  # "done" needs the final checkpoint durable before its validation
                self.checkpoints.wait_committed(step)
        if is_eval:
            summary["val_loss"], summary["val_ppl"] = self.evaluate(step)
            self.best_loss = self.checkpoints.keep_if_best(step, self.state.params, summary["val_loss"],
                                                          self.best_loss)
            self.timer.t0 = time.perf_counter()  # evaluation time is not step time

    def _stop(self, step: int, preempt: _Preemption) -> None:
        """A preemption signal or Ctrl-C: step `step` is saved (unless it already is) and the steps end."""
        if self.pending is not None:
            self.check_finite(*self.pending)
            self.pending = None
        log(f"{preempt.what()}: saving step {step} and exiting")
        if not self.checkpoints.saved(step):
            self.save(step, force=True)
        self.checkpoints.finish(step)
        self.summary.update(status="interrupted" if preempt.interrupted else "preempted", step=step)

    def save(self, step: int, *, force: bool = False) -> None:
        """Checkpoint `step`: the state, the data position and, in its meta, the metrics log so far."""
        meta = {"loss": self.summary["loss"], "bad_steps": self.bad_steps, "run_id": self.run_id}
        if self.writer is not None and self.is_main:
            meta["metrics_log"] = metrics_lib.pack_lines(self.writer.lines_up_to(step))
        self.checkpoints.save(step, self.state, self.data_state, meta, force=force)

    def _log_step(self, step: int, m) -> None:
        """One line of metrics.jsonl (and TensorBoard): loss, lr, grad norm, tokens/s, MFU, step time."""
        timer = self.timer
        try:
            dt = timer.step_time()
            tps = self.tokens_per_step / dt
            tps_dev = tps / self.mesh.size
            mfu = (tps_dev * self.train_flops_tok / self.peak_flops) if (self.peak_flops and self.train_flops_tok) \
                else None
            host = jax.device_get(m)
            self.writer.write(step, {"loss": float(host["loss"]), "lr": float(host["lr"]),
                                     "grad_norm": float(host["grad_norm"]), "tokens_per_sec": tps,
                                     "tokens_per_sec_per_device": tps_dev, "mfu": mfu, "step_time": dt,
                                     "data_wait": timer.data_wait / max(1, timer.steps),
                                     "tokens_seen": step * self.tokens_per_step, "bad_steps": self.bad_steps})
        except lease_lib.LeaseLost as e:
            raise self.checkpoints.fenced_out(step, e) from None
        except OSError as e:
            raise self.checkpoints.write_failed(step, self.writer.path, e) from None
        timer.restart()
