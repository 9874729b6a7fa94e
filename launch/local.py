#!/usr/bin/env python
"""Local multi-process launcher: N processes on this machine joined by jax.distributed.

    python launch/local.py --num_processes=2 -- -m idattn.train --config=experiments/scaling.py:softmax,tiny \
        --workdir=/tmp/mp --config.data.tokenizer=train:512 --config.model.vocab_size=512
    python launch/local.py --num_processes=2 --dry_run -- -m idattn.train ...   # print the commands only

Everything after `--` is the python command line of one process (`-m idattn.train ...` or `script.py ...`).
Process i gets IDATTN_COORDINATOR_ADDRESS=localhost:<port>, IDATTN_NUM_PROCESSES=N, IDATTN_PROCESS_ID=i
(read by idattn.train.distributed), JAX_PLATFORMS (default cpu) and, with --devices_per_process=K on CPU,
XLA_FLAGS=--xla_force_host_platform_device_count=K. Output lines are prefixed with [i]. If one process fails,
the others are stopped and its exit code is returned. CPU collectives between the processes use gloo.
"""
from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
import threading


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
        out.append((env, [args.python] + cmd))
    return out


def _relay(i: int, stream, sink):
    for line in stream:
        sink.write(f"[{i}] {line}")
        sink.flush()


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: launch/local.py [options] -- <python args of one process>", file=sys.stderr)
        return 2
    k = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num_processes", type=int, default=2)
    p.add_argument("--port", type=int, default=0, help="coordinator port (0: pick a free one)")
    p.add_argument("--devices_per_process", type=int, default=0, help="fake CPU devices per process (0: leave)")
    p.add_argument("--platform", default="cpu", help="JAX_PLATFORMS for the children ('' to leave unset)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--dry_run", action="store_true", help="print the commands and exit")
    args = p.parse_args(argv[:k])
    cmd = argv[k + 1:]
    if args.num_processes < 1:
        p.error(f"--num_processes={args.num_processes}: must be >= 1")
    if not cmd:
        p.error("nothing to run after `--`")
    jobs = build(args, cmd)
    if args.dry_run:
        for env, c in jobs:
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(c))
        return 0
    procs, threads = [], []
    for i, (env, c) in enumerate(jobs):
        pr = subprocess.Popen(c, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        procs.append(pr)
        th = threading.Thread(target=_relay, args=(i, pr.stdout, sys.stdout), daemon=True)
        th.start()
        threads.append(th)
    rc = 0
    try:
        pending = list(procs)
        while pending:
            for pr in list(pending):
                try:
                    code = pr.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    continue
                pending.remove(pr)
                if code != 0 and rc == 0:
                    rc = code
                    for other in pending:  # one failed: the others would wait on it forever
                        other.terminate()
    except KeyboardInterrupt:
        for pr in procs:
            pr.terminate()
        rc = 130
    for th in threads:
        th.join(timeout=5)
    return rc


if __name__ == "__main__":
    sys.exit(main())
