"""`python -m idattn.train --config=experiments/<file>.py[:arg] --config.<key>=<value> --workdir=<dir>`.

Rerunning the same command in the same workdir resumes from its latest checkpoint. Multi-host: see
idattn/train/distributed.py and launch/. Exit codes: 0 done, 1 refused / failed, 143 preempted (SIGTERM: saved),
130 interrupted (Ctrl-C: saved at the next step boundary; a second Ctrl-C: not saved).
"""
from __future__ import annotations

import os
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from idattn.configs.flags import run_app
from idattn.rundir import layout
from idattn.train import distributed
from idattn.train.trainer import TrainingError, check_config, run

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (experiments/<file>.py[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics, config.json).")
_DISTRIBUTED = flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                                 "jax.distributed: auto = when flags/env/cluster say so.")
_COORD = flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process).")
_NPROC = flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process).")
_PID = flags.DEFINE_integer("process_id", None, "This process's id (multi-process).")
_CHECK_ONLY = flags.DEFINE_bool("check_only", False, "Resolve and check the config (keys, values, model, data "
                                "choice, tokenizer) and exit: 0 and one line when it would start, 1 and the "
                                "refusal otherwise. Reads no data and writes nothing (the launchers' --dry_run).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; use --config, --config.<key>=<value>, --workdir")
    if not flags.FLAGS["verbosity"].present:  # orbax logs every file it writes at INFO
        logging.set_verbosity(logging.WARNING)
        # a failed background save: orbax logs each thread's traceback (30-500 lines) before the trainer's own
        # one-line error; keep their first lines only (--verbosity=0 or higher shows them whole)
        logging.get_absl_logger().addFilter(_one_line_orbax_errors)
    if _CHECK_ONLY.value:
        try:
            print(check_config(_CONFIG.value), flush=True)
        except TrainingError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            sys.exit(1)
        return
    try:
        distributed.initialize(_DISTRIBUTED.value, _COORD.value, _NPROC.value, _PID.value)
    except distributed.StartError as e:  # a device layout that cannot work: one line, before any work
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    try:
        summary = run(_CONFIG.value, _WORKDIR.value)
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:  # a second Ctrl-C (the first saves at the next step boundary), or one during start-up
        steps = layout.committed_steps(os.path.abspath(_WORKDIR.value)) if _WORKDIR.value else []
        print(f"error: interrupted: stopped without saving; last committed checkpoint: "
              f"{os.path.join(os.path.abspath(_WORKDIR.value), 'checkpoints', str(steps[-1])) if steps else 'none'}"
              f" (rerun to resume from it)", file=sys.stderr, flush=True)
        sys.exit(130)
    except OSError as e:  # a write the trainer did not expect to fail (full disk, read-only mount): one line
        wd = os.path.abspath(_WORKDIR.value)
        steps = layout.committed_steps(wd)
        first = (e.strerror or str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
        print(f"error: {type(e).__name__}: {first}{f' ({e.filename})' if e.filename else ''}; stopping. Last "
              f"committed checkpoint: {os.path.join(wd, 'checkpoints', str(steps[-1])) if steps else 'none'}. Free "
              f"space or fix the workdir's permissions / mount, then rerun (it resumes from there).",
              file=sys.stderr, flush=True)
        sys.exit(1)
    except Exception as e:
        if jax.process_count() > 1 and _is_peer_failure(e):
            # Another process died: say so in one line and leave now. jax's exit-time shutdown barrier would
            # wait for the dead peer and then abort with a C++ stack trace.
            first = str(e).strip().splitlines()[0][:300]
            print(f"error: [process {jax.process_index()}] lost contact with another process of this run ({first}); "
                  f"stopping. The checkpoints committed so far are kept; rerun the job to resume.",
                  file=sys.stderr, flush=True)
            os._exit(1)
        raise
    if summary["status"] == "preempted":
        sys.exit(143)
    if summary["status"] == "interrupted":
        sys.exit(130)


def _one_line_orbax_errors(record) -> bool:
    if "orbax" in str(getattr(record, "pathname", "")) and record.exc_info:
        exc = record.exc_info[1]
        record.msg = f"{str(record.getMessage()).splitlines()[0][:300]} ({type(exc).__name__}; traceback with --verbosity=0)"
        record.args, record.exc_info, record.exc_text = (), None, None
    return True


def _is_peer_failure(e: BaseException) -> bool:
    text = f"{type(e).__name__}: {e}"
    return any(k in text for k in ("Gloo", "heartbeat", "coordination service", "Connection closed by peer",
                                   "Barrier failed", "DEADLINE_EXCEEDED", "UNAVAILABLE"))


if __name__ == "__main__":
    run_app(main)  # a --config.<key> typo: one readable line
