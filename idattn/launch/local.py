#!/usr/bin/env python
"""Local multi-process launcher: N processes on this machine joined by jax.distributed.

    python launch/local.py --num_processes=2 -- -m idattn.train --config=experiments/scaling.py:softmax,tiny \
        --workdir=/tmp/mp --config.data.tokenizer=train:512 --config.model.vocab_size=512
    python launch/local.py --num_processes=2 --dry_run -- -m idattn.train ...   # print the commands only

`launch/local.py` is a checkout's path; from an installed package the same program is `python -m
idattn.launch.local`, and `--config=experiments/<file>.py` names the packaged recipe (idattn/configs).
Everything after `--` is the python command line of one process (`-m idattn.train ...` or `script.py ...`).
Before any process starts (and before a dry run prints), `-m idattn.train <args>` is checked once here with the
trainer's `--check_only` (idattn/launch/check.py): a bad key or value stops the launch with the trainer's line.
Process i gets IDATTN_COORDINATOR_ADDRESS=localhost:<port>, IDATTN_NUM_PROCESSES=N, IDATTN_PROCESS_ID=i
(read by idattn.train.distributed), JAX_PLATFORMS (default cpu) and, with --devices_per_process=K on CPU,
XLA_FLAGS=--xla_force_host_platform_device_count=K. Output lines are prefixed with [i]. CPU collectives between
the processes use gloo.

The launcher owns its processes:
  - SIGTERM / SIGINT to the launcher is forwarded (as SIGTERM) to every child, which saves at its next step
    boundary and exits 143; the launcher waits for them (--stop_timeout_s, then SIGKILL) and reports each.
  - The children run in their own sessions, so a Ctrl-C reaches them only through the launcher (as SIGTERM:
    a save, not a KeyboardInterrupt).
  - When a child dies, the others are stopped by jax.distributed within IDATTN_HEARTBEAT_TIMEOUT_S
    (--heartbeat_timeout_s, default 10 s; idattn/train/distributed.py); any still alive after that plus a grace
    of 10 s are killed. A collective save cannot happen without every process, so none is attempted.
  - At the end one line per child says how it ended (exit code or signal), and the exit code is 0 when all
    exited 0, 143 when a forwarded stop ended with every child saved, else the first failure's code
    (128 + signal number for a signal).
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from idattn.launch import check_trainer_args
from idattn.launch.check import trainer_args_of


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def build(args, cmd: list[str]) -> list[tuple[dict, list[str]]]:
    port = args.port or free_port()
    out = []
    for i in range(args.num_processes):
        env = {"IDATTN_COORDINATOR_ADDRESS": f"localhost:{port}", "IDATTN_NUM_PROCESSES": str(args.num_processes),
               "IDATTN_PROCESS_ID": str(i)}
        if args.platform:
            env["JAX_PLATFORMS"] = args.platform
        if args.devices_per_process:
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices_per_process}"
        env["IDATTN_HEARTBEAT_TIMEOUT_S"] = str(args.heartbeat_timeout_s)
        out.append((env, [args.python] + cmd))
    return out


def _relay(i: int, stream, sink):
    for line in stream:
        sink.write(f"[{i}] {line}")
        sink.flush()


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="launch/local.py [options] -- <python args of one process>")
    p.add_argument("--num_processes", type=int, default=2)
    p.add_argument("--port", type=int, default=0, help="coordinator port (0: pick a free one)")
    p.add_argument("--devices_per_process", type=int, default=0, help="fake CPU devices per process (0: leave)")
    p.add_argument("--platform", default="cpu", help="JAX_PLATFORMS for the children ('' to leave unset)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--dry_run", action="store_true", help="print the commands and exit")
    p.add_argument("--no_check", action="store_true", help="start (or print) without first checking the trainer's "
                   "arguments here (`-m idattn.train ... --check_only`)")
    p.add_argument("--heartbeat_timeout_s", type=int, default=10,
                   help="jax.distributed heartbeat timeout: survivors of a dead process stop within this")
    p.add_argument("--stop_timeout_s", type=float, default=600.0,
                   help="after a forwarded SIGTERM, wait this long for the saves before SIGKILL")
    k = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:k])  # --help here prints the options
    if k == len(argv):
        p.error("expected `-- <python args of one process>` after the options")
    cmd = argv[k + 1:]
    if args.num_processes < 1:
        p.error(f"--num_processes={args.num_processes}: must be >= 1")
    if not cmd:
        p.error("nothing to run after `--`")
    jobs = build(args, cmd)
    # the trainer's check, dry run or not, before any process starts (another module or a script: not checked)
    targs = trainer_args_of(cmd)
    rc = 0 if args.no_check or targs is None else check_trainer_args(targs, python=args.python,
                                                                       dry_run=args.dry_run)
    if rc:
        return rc
    if args.dry_run:
        for env, c in jobs:
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(c))
        return 0
    return supervise(jobs, heartbeat_timeout_s=args.heartbeat_timeout_s, stop_timeout_s=args.stop_timeout_s)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    if code == 143:
        return "exit 143 (stopped by SIGTERM after saving)"
    return f"exit {code}"


def _say(msg: str) -> None:
    print(f"[launcher] {msg}", file=sys.stderr, flush=True)


def supervise(jobs, *, heartbeat_timeout_s: float, stop_timeout_s: float, poll_s: float = 0.2) -> int:
    """Starts every (env, argv) job, relays output, forwards stops, reports each exit (module docstring)."""
    procs, threads = [], []
    for i, (env, c) in enumerate(jobs):
        pr = subprocess.Popen(c, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
        procs.append(pr)
        th = threading.Thread(target=_relay, args=(i, pr.stdout, sys.stdout), daemon=True)
        th.start()
        threads.append(th)
    stop = {"signal": None, "at": None}
    failed: dict = {}

    def forward(signum, frame):
        if stop["signal"] is None:
            _say(f"{signal.Signals(signum).name}: forwarding SIGTERM to {sum(p.poll() is None for p in procs)} "
                 f"process(es); each saves at its next step and exits")
            stop.update(signal=signum, at=time.time())
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    codes: dict[int, int] = {}
    try:
        while len(codes) < len(procs):
            time.sleep(poll_s)
            # the processes found ended in one round, those killed by a signal first: when one child dies, the
            # others fail on the lost connection within milliseconds, and on a loaded machine the round can see
            # both; the dead one is the cause, not the child that exited with an error after it
            ended = sorted((i for i, p in enumerate(procs) if i not in codes and p.poll() is not None),
                           key=lambda i: (procs[i].returncode >= 0, i))
            for i in ended:
                p = procs[i]
                codes[i] = p.returncode
                _say(f"process {i} ended: {describe_exit(p.returncode)}")
                if p.returncode != 0 and stop["signal"] is None and not failed:
                    failed.update(index=i, code=p.returncode, at=time.time())
                    alive = [j for j, q in enumerate(procs) if q.poll() is None]
                    if alive:
                        _say(f"process {i} failed; the others ({alive}) stop when jax.distributed misses its "
                             f"heartbeat (<= {heartbeat_timeout_s:g} s), else they are killed "
                             f"{heartbeat_timeout_s + 10:g} s from now")
            now = time.time()
            deadline = None
            if failed:
                deadline = failed["at"] + heartbeat_timeout_s + 10
            if stop["signal"] is not None:
                deadline = min(deadline or math.inf, stop["at"] + stop_timeout_s)
            if deadline is not None and now > deadline:
                for i, p in enumerate(procs):
                    if p.poll() is None:
                        _say(f"process {i} still running past its deadline: SIGKILL")
                        p.kill()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for th in threads:
        th.join(timeout=5)
    for i in range(len(procs)):
        _say(f"summary: process {i}: {describe_exit(codes[i])}")
    if all(c == 0 for c in codes.values()):
        return 0
    if stop["signal"] is not None and all(c in (0, 143) for c in codes.values()):
        return 143
    first = failed.get("index", min(i for i, c in codes.items() if c != 0))
    c = codes[first]
    _say(f"failed: process {first} ({describe_exit(c)})")
    return 128 - c if c < 0 else c


if __name__ == "__main__":
    sys.exit(main())
