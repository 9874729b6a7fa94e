"""Scaling sweeps: one run folder per config of a sweep file, run locally, as a SLURM job array, or as TPU jobs.

    python -m idattn.sweep experiments/sweeps/cpu_isoflop.py --root=/work/studies/scaling-cpu [--dry_run]
    python -m idattn.sweep experiments/sweeps/paper_isoflop.py --root=/shared/runs/iso --launcher=slurm \
        --data_path=/shared/data/fineweb-edu --dry_run -- --partition=gpu --nodes=1 --gpus_per_node=8
    python -m idattn.sweep experiments/sweeps/paper_isoflop.py --root=/mnt/runs/iso --launcher=tpu \
        --data_path=/mnt/data/fineweb-edu --dry_run -- --zone=us-east5-a --type=v5p-64
    python -m idattn.sweep status --root=/work/studies/scaling-cpu

A sweep file (`experiments/sweeps/<name>.py`) defines `get_sweep()` -> list of ml_collections configs, each a
complete trainer config with a `sweep` section (`name`: the stable run name and folder, `study`, `mixer`,
`size`, `tokens`, `compute`: the nominal IsoFLOP budget C = 6·N·D or 0, `n_params`: non-embedding N), and
`get_config(name)` returning the config of one run (so `python -m idattn.train --config=<file>:<name>` trains
it; every launcher runs exactly that command with `--workdir=<root>/<name>`). idattn.configs.runs.make_run()
builds such a config from a mixer, a shape and a token budget.

Launchers (each prints what it will do first; `--dry_run` prints and stops). Before that, dry run or not, every
member's final trainer arguments are checked here with the trainer's `--check_only` (idattn/launch/check.py, in one
process): a bad key or value in any run stops the sweep with the trainer's line before anything is written, run or
submitted; so does a missing `sbatch` / `gcloud` (one line naming it).
  local  runs the configs one after another, each as `python -m idattn.train` in a subprocess, output appended
         to `<root>/<name>/train.log`. A finished run (validation at its last step) is skipped; an interrupted
         one resumes from its last checkpoint (the trainer's resume). A failed run is recorded and the sweep
         goes on; the exit code is 1 if any failed.
  slurm  one job array (`#SBATCH --array=0-(n-1)[%max_parallel]`) whose script is launch/slurm.py's, with the
         run picked by SLURM_ARRAY_TASK_ID; arguments after `--` go to launch/slurm.py.
  tpu    one queued TPU slice per run through launch/tpu.py (create --queued, setup, train, delete), or with
         `--tpu_name=<existing slice>` every run on that slice in turn; arguments after `--` go to launch/tpu.py.

WSD branches (`--wsd_branches`, local launcher): the runs of one (study, mixer, size) that differ only in their
token budget share one warmup-stable-decay trunk instead of training from scratch each. The largest budget is
the trunk (train.schedule=wsd; its decay is its own); every smaller budget S_i branches from the trunk's
checkpoint at step S_i − D_i (D_i = round(train.decay_fraction · S_i), pinned in the trunk with
train.checkpoint_steps) and decays over its last D_i steps (train.branch_from, docs/training.md). The trunk runs
first; a group's total cost is the trunk plus the decays, not the sum of the budgets. Each run's extra flags are
printed with the plan.

Data flags: every trainer command carries `--config.data.source=...` explicitly, and with `--data_path=DIR`
`--config.data.source=arrayrecord --config.data.path=DIR` (the paper sizes need prepared data: a sweep whose
configs say `data.source=arrayrecord` is refused without `--data_path`). `--set key=value` (repeatable) adds
`--config.key=value` to every run. State per run (`status`): pending | running | interrupted | failed | done;
"running" is any live trainer holding the run's workdir lease (train/lease.py), this sweep's or another's. The
local launcher never starts a run another live trainer holds (two sweeps on one root, a run started by hand):
it reports it "running elsewhere", not failed, and it does not make the sweep's exit code 1.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Any

from idattn import atomic
from idattn.configs.runs import load_sweep
from idattn.launch import check, slurm, tpu
from idattn.rundir import layout
from idattn.train import lease as lease_lib, optim

STATE_FILE = "sweep_state.json"
MANIFEST = "sweep.json"


# ---------------------------------------------------------------------------------------------- run states
def run_status(workdir: str) -> dict[str, Any]:
    """{state, step, num_steps, loss, val_loss} of one run folder (see the module docstring for the states).
    "done" is idattn.rundir.layout.completion's (the final checkpoint committed, its validation written, best/
    consistent); otherwise `step` is the newest committed checkpoint, the step a rerun resumes from and
    `load_params` loads (metrics.jsonl may run ahead of it: those steps are trained again)."""
    out: dict[str, Any] = {"state": "pending", "step": 0, "num_steps": None, "loss": None, "val_loss": None}
    cfg = layout.read_json(os.path.join(workdir, "config.json"))
    done = layout.completion(workdir)
    out["num_steps"] = done["num_steps"]
    last = layout.last_metrics(workdir)
    if last:
        out["loss"] = last.get("loss")
    out["step"] = done["committed"] or 0
    st = layout.read_json(os.path.join(workdir, STATE_FILE)) or {}
    holder = lease_lib.holder_alive(workdir) if not done["done"] else None
    if done["done"]:
        out.update(state="done", val_loss=done["val_loss"], step=done["num_steps"])
    elif holder is not None:  # a live trainer holds the workdir (this sweep's, another sweep's, or by hand)
        out.update(state="running", where=f"host {holder.get('host', '?')} pid {holder.get('pid', '?')}")
        if last:
            out["step"] = int(last["step"])
    elif st.get("state") == "running" and lease_lib.pid_alive(st.get("pid")):
        out["state"] = "running"
    elif st.get("state") == "failed":
        out["state"] = "failed"
        out["rc"] = st.get("rc")
    elif cfg is not None:
        out["state"] = "interrupted"
        out["missing"] = done["missing"]
    return out


def _write_state(workdir: str, **kw) -> None:
    """sweep_state.json of one run, replaced whole. It only tells `status` what this controller did (done-ness is
    read from the run folder), so a failed write is a one-line warning and the sweep goes on."""
    try:
        os.makedirs(workdir, exist_ok=True)
        atomic.write_json(os.path.join(workdir, STATE_FILE), {**kw, "time": time.time()})
    except OSError as e:
        print(f"warning: {e} (the sweep goes on; `status` reads each run's own files)", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------- commands
def data_flags(configs, data_path: str, sets: list[str] = ()) -> list[str]:
    """Explicit data flags for every trainer command (see the module docstring). A config that leaves
    data.source unset (as experiments/scaling.py's paper sizes do) or names arrayrecord without a path needs
    --data_path, or the source given with --set data.source=... (e.g. kjv for a smoke run)."""
    if data_path:
        return ["--config.data.source=arrayrecord", f"--config.data.path={data_path}"]
    if any(kv.split("=", 1)[0] == "data.source" for kv in sets):
        return []  # the --set flags carry it
    sources = {str(c.data.get("source", "") or "") for c in configs}
    paths = {str(c.data.get("path", "") or "") for c in configs}
    if "" in sources or ("arrayrecord" in sources and "" in paths):
        raise SystemExit("this sweep trains on prepared data but names no folder: pass --data_path=<folder of "
                         "prepared ArrayRecord shards> (python -m idattn.data.prepare writes them, docs/data.md), "
                         "or --set data.source=kjv for a smoke run on the embedded corpus")
    if len(sources) != 1:
        raise SystemExit(f"configs of this sweep disagree on data.source: {sorted(sources)}")
    source = sources.pop()
    if source == "arrayrecord":
        return ["--config.data.source=arrayrecord", f"--config.data.path={paths.pop()}"]
    return [f"--config.data.source={source}"]


def wsd_branch_plan(configs, root: str) -> tuple[list, dict[str, list[str]]]:
    """(configs with each trunk before its branches, {run name: extra trainer flags}) for --wsd_branches."""
    groups: dict[tuple, list] = {}
    for c in configs:
        model = json.dumps(c.model.to_dict(), sort_keys=True, default=str)
        key = (c.sweep.study, c.sweep.mixer, c.sweep.size, model, int(c.train.batch_size), int(c.data.seq_len))
        groups.setdefault(key, []).append(c)
    ordered, flags = [], {}
    for members in groups.values():
        steps = {c.sweep.name: -(-int(c.sweep.tokens) // (int(c.train.batch_size) * int(c.data.seq_len)))
                 for c in members}
        members = sorted(members, key=lambda c: -steps[c.sweep.name])
        trunk = members[0]
        flags[trunk.sweep.name] = ["--config.train.schedule=wsd"]
        points = []
        for c in members[1:]:
            n = steps[c.sweep.name]
            d = optim.decay_steps_of(c.train, n)
            point = n - d
            if point < 1 or n >= steps[trunk.sweep.name]:
                flags[c.sweep.name] = ["--config.train.schedule=wsd"]  # too short to branch: trains on its own
                continue
            points.append(point)
            flags[c.sweep.name] = ["--config.train.schedule=wsd", f"--config.train.decay_steps={d}",
                                   f"--config.train.branch_from={os.path.join(root, trunk.sweep.name)}:{point}"]
        if points:
            flags[trunk.sweep.name].append(f"--config.train.checkpoint_steps=({','.join(map(str, sorted(points)))},)")
        ordered += members
    return ordered, flags


def train_args(sweep_file: str, name: str, root: str, extra: list[str]) -> list[str]:
    return [f"--config={sweep_file}:{name}", f"--workdir={os.path.join(root, name)}", *extra]


def check_members(sweep_file, configs, root, extra, per_run=None, *, dry_run: bool) -> int:
    """The trainer's `--check_only` on every member's final arguments (idattn/launch/check.py: one process, the
    trainer's own flags and check per run), with this interpreter (the sweep's own; `--python` may be anything that
    runs the trainer's command). 0 when every run would start; else the trainer's line per refusal (stderr) and its
    exit status."""
    per_run = per_run or {}
    runs = [train_args(sweep_file, c.sweep.name, root, extra + per_run.get(c.sweep.name, [])) for c in configs]
    return check.check_runs(runs, names=[c.sweep.name for c in configs], dry_run=dry_run)


def _extra_flags(configs, args) -> list[str]:
    extra = data_flags(configs, args.data_path, args.set)
    for kv in args.set:
        if "=" not in kv:
            raise SystemExit(f"--set {kv!r}: expected key=value, e.g. --set train.eval_batches=16")
        extra.append(f"--config.{kv}")
    return extra


# ---------------------------------------------------------------------------------------------- launchers
def run_local(sweep_file, configs, root, extra, *, dry_run: bool, python: str,
              per_run: dict[str, list[str]] | None = None) -> int:
    per_run = per_run or {}
    rows = []
    for c in configs:
        wd = os.path.join(root, c.sweep.name)
        st = run_status(wd)
        action = ("skip (done)" if st["state"] == "done" else "running elsewhere" if st.get("where") else
                  "resume" if st["state"] in ("interrupted", "failed") else "train")
        rows.append((c, wd, st, action))
    print(f"idattn.sweep: {len(configs)} runs in {root} (local, one after another)")
    for c, wd, st, action in rows:
        print(f"  {action:12s} {c.sweep.name}  N={c.sweep.n_params:,} D={c.sweep.tokens:,}"
              + (f"  ({st['where']}: skipped)" if action == "running elsewhere" else "")
              + (f"  {' '.join(per_run[c.sweep.name])}" if per_run.get(c.sweep.name) else ""))
    todo = [r for r in rows if r[3] not in ("skip (done)", "running elsewhere")]
    elsewhere = [r[0].sweep.name for r in rows if r[3] == "running elsewhere"]
    skipped = 0  # runs of `todo` found held by another trainer when their turn came
    if todo:
        print("  command of each: " + shlex.join([python, "-m", "idattn.train",
                                                   *train_args(sweep_file, "<name>", root, extra)]))
    if dry_run:
        return 0
    os.makedirs(root, exist_ok=True)
    failed = []
    for i, (c, wd, st, action) in enumerate(todo):
        cmd = [python, "-m", "idattn.train", *train_args(sweep_file, c.sweep.name, root,
                                                         extra + per_run.get(c.sweep.name, []))]
        holder = lease_lib.holder_alive(wd)  # taken since the plan was printed (another sweep got there first)
        if holder is not None:
            elsewhere.append(c.sweep.name)
            skipped += 1
            print(f"[{i + 1}/{len(todo)}] running elsewhere {c.sweep.name} (host {holder.get('host', '?')} pid "
                  f"{holder.get('pid', '?')}): skipped", flush=True)
            continue
        print(f"[{i + 1}/{len(todo)}] {action} {c.sweep.name}", flush=True)
        os.makedirs(wd, exist_ok=True)
        before = layout.read_json(os.path.join(wd, STATE_FILE))
        t0 = time.time()
        with open(os.path.join(wd, "train.log"), "a") as log:
            log.write(f"\n# idattn.sweep {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            _write_state(wd, state="running", pid=proc.pid)
            try:
                rc = proc.wait()
            except KeyboardInterrupt:
                proc.terminate()  # the trainer saves on SIGTERM; rerunning the sweep resumes
                proc.wait()
                _write_state(wd, state="interrupted", rc=proc.returncode)
                raise
        st = run_status(wd) if rc == 0 else {}
        holder = lease_lib.holder_alive(wd) if rc != 0 else None
        if holder is not None and str(holder.get("pid")) != str(proc.pid):
            # refused because another trainer took the workdir between our check and the start: not a failure
            elsewhere.append(c.sweep.name)
            skipped += 1
            if before is not None:
                _write_state(wd, **{k: v for k, v in before.items() if k != "time"})  # the other sweep's record
            else:
                os.remove(os.path.join(wd, STATE_FILE))
            print(f"    running elsewhere (host {holder.get('host', '?')} pid {holder.get('pid', '?')} holds the "
                  f"workdir); not counted as failed", flush=True)
        elif rc == 0 and st.get("state") == "done":
            _write_state(wd, state="done", rc=0, wall_time=time.time() - t0)
            print(f"    done in {time.time() - t0:.0f} s: val_loss {st['val_loss']:.4f}", flush=True)
        else:
            _write_state(wd, state="failed", rc=rc, wall_time=time.time() - t0)
            failed.append(c.sweep.name)
            print(f"    FAILED (exit {rc}); see {os.path.join(wd, 'train.log')}", flush=True)
    print(f"idattn.sweep: {len(todo) - len(failed) - skipped} trained, "
          f"{sum(r[3] == 'skip (done)' for r in rows)} already done, "
          + (f"{len(elsewhere)} running elsewhere (another trainer holds them; `status` follows them): "
             f"{elsewhere}, " if elsewhere else "")
          + f"{len(failed)} failed" + (f": {failed}" if failed else ""))
    return 1 if failed else 0


def slurm_script(sweep_file, configs, root, extra, launcher_args: list[str], max_parallel: int = 0
                 ) -> tuple[str, str]:
    """(launch/slurm.py's script with `--array` and the run chosen by SLURM_ARRAY_TASK_ID, its log folder)."""
    array = f"--array=0-{len(configs) - 1}" + (f"%{max_parallel}" if max_parallel else "")
    # launch/slurm.py's own parser and template; the config names the placeholder RUN_NAME (each run's config was
    # checked here)
    args, targs = slurm.parse([*launcher_args, f"--sbatch={array}", "--",
                               *train_args(sweep_file, "RUN_NAME", root, extra)])
    script = slurm.render(args, targs)
    if "RUN_NAME" not in script:
        raise SystemExit("launch/slurm.py's script does not contain the run placeholder; cannot make an array")
    names = " ".join(shlex.quote(c.sweep.name) for c in configs)
    pick = (f"RUNS=({names})\nRUN=\"${{RUNS[$SLURM_ARRAY_TASK_ID]}}\"\n"
            f"echo \"array task $SLURM_ARRAY_TASK_ID: run $RUN\"\n")
    script = script.replace("set -euo pipefail\n", "set -euo pipefail\n" + pick, 1)
    return expand_run_placeholder(script), slurm.log_dir_of(args)


def expand_run_placeholder(script: str) -> str:
    """Every RUN_NAME of a shell script becomes the array task's run, "${RUN}": closed out of a single-quoted word
    (shlex quotes a path with a space as '...'; a variable inside single quotes would stay literal)."""
    out = []
    for line in script.splitlines(keepends=True):
        parts = line.split("RUN_NAME")
        text = parts[0]
        for rest in parts[1:]:
            inside = text.replace("'\"'\"'", "").count("'") % 2 == 1  # shlex writes a quote as '"'"'
            text += ("'\"${RUN}\"'" if inside else '"${RUN}"') + rest
        out.append(text)
    return "".join(out)


def run_slurm(sweep_file, configs, root, extra, launcher_args, *, dry_run: bool, max_parallel: int) -> int:
    script, log_dir = slurm_script(sweep_file, configs, root, extra, launcher_args, max_parallel)
    print(f"idattn.sweep: {len(configs)} runs in {root} as one SLURM job array (task i = run i):")
    for i, c in enumerate(configs):
        print(f"  [{i}] {c.sweep.name}  N={c.sweep.n_params:,} D={c.sweep.tokens:,}")
    print(script)
    if dry_run:
        print("# dry run: nothing submitted (without --dry_run: sbatch <this script>)")
        return 0
    os.makedirs(root, exist_ok=True)
    # SLURM opens the --output file before the script starts, in a folder that must exist: a missing one fails
    # every array task silently (launch/slurm.py creates it only when it submits itself)
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(root, "sweep-array.sbatch")
    with open(path, "w") as f:
        f.write(script)
    print(f"wrote {path}")
    return check.call_tool(["sbatch", path])


def tpu_commands(sweep_file, configs, root, extra, launcher_args, *, tpu_name: str, prefix: str
                 ) -> list[tuple[str, list[str]]]:
    """(run name, argv of launch/tpu.py) for every step of every run."""
    out = []
    for i, c in enumerate(configs):
        targs = train_args(sweep_file, c.sweep.name, root, extra)
        name = tpu_name or f"{prefix}-{i:03d}"
        steps = [] if tpu_name else [["create", f"--name={name}", "--queued"], ["setup", f"--name={name}"]]
        steps.append(["train", f"--name={name}", "--foreground", "--"])  # attached: runs in turn, then delete
        if not tpu_name:
            steps.append(["delete", f"--name={name}", "--queued"])
        for s in steps:
            s[2:2] = list(launcher_args)  # launcher options before `--`
            if s[0] == "train":
                s.extend(targs)
            out.append((c.sweep.name, s))
    return out


def run_tpu(sweep_file, configs, root, extra, launcher_args, *, dry_run, tpu_name, prefix) -> int:
    cmds = tpu_commands(sweep_file, configs, root, extra, launcher_args, tpu_name=tpu_name, prefix=prefix)
    how = f"in turn on the slice {tpu_name}" if tpu_name else "one queued TPU slice per run"
    print(f"idattn.sweep: {len(configs)} runs in {root}, {how} (launch/tpu.py):")
    last = None
    for name, argv in cmds:
        if name != last:
            print(f"# run {name}")
            last = name
        print("python launch/tpu.py " + shlex.join(argv))
        # --dry_run / --no_check must precede `--` (after it, they would be trainer arguments); --no_check: main
        # checked every member's arguments before this
        k = argv.index("--") if "--" in argv else len(argv)
        checked = [*argv[:k], "--no_check", *argv[k:]]
        if dry_run:
            if any(a.startswith("--zone") for a in argv[:k]):  # launch/tpu.py requires --zone to render
                tpu.main([*argv[:k], "--dry_run", *checked[k:]])
            continue
        rc = tpu.main(checked)
        if rc:
            print(f"launch/tpu.py {argv[0]} failed with exit {rc} for run {name}; stopping")
            return rc
    if dry_run:
        print("# dry run: nothing created or started")
    return 0


# ----------------------------------------------------------------------------------------------------- status
def status(root: str, sweep_file: str = "") -> list[dict[str, Any]]:
    names: list[str]
    if sweep_file:
        names = [c.sweep.name for c in load_sweep(sweep_file)]
    else:
        man = layout.read_json(os.path.join(root, MANIFEST)) or {}
        names = man.get("runs") or sorted(os.path.basename(os.path.dirname(p))
                                          for p in glob.glob(os.path.join(root, "*", "config.json")))
    return [{"name": n, **run_status(os.path.join(root, n))} for n in names]


def print_status(rows) -> None:
    counts: dict[str, int] = {}
    print(f"{'run':48s} {'state':11s} {'step':>11s} {'loss':>8s} {'val_loss':>9s}")
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
        step = f"{r['step']}/{r['num_steps']}" if r["num_steps"] else "-"
        loss = f"{r['loss']:.4f}" if r["loss"] is not None else "-"
        val = f"{r['val_loss']:.4f}" if r["val_loss"] is not None else "-"
        print(f"{r['name']:48s} {r['state']:11s} {step:>11s} {loss:>8s} {val:>9s}")
    print("total: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))


# ------------------------------------------------------------------------------------------------------- CLI
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, rest = argv[:k], argv[k + 1:]
    if argv and argv[0] == "status":
        p = argparse.ArgumentParser(prog="python -m idattn.sweep status",
                                    description="Each run's step, loss, validation loss and state.")
        p.add_argument("--root", required=True)
        p.add_argument("--sweep", default="", help="sweep file (default: the root's sweep.json, else its folders)")
        p.add_argument("--json", action="store_true")
        a = p.parse_args(argv[1:])
        rows = status(a.root, a.sweep)
        if not rows:
            print(f"sweep status: no {MANIFEST} and no run folders (<run>/config.json) under --root={a.root}; give "
                  f"the --root the sweep ran with (or --sweep=<sweep file>)", file=sys.stderr)
            return 1
        if a.json:
            print(json.dumps(rows, indent=1))
        else:
            print_status(rows)
        return 0
    p = argparse.ArgumentParser(prog="python -m idattn.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_file")
    p.add_argument("--root", required=True, help="folder of the run folders (one per config)")
    p.add_argument("--launcher", choices=["local", "slurm", "tpu"], default="local")
    p.add_argument("--dry_run", action="store_true", help="print what would run, run nothing")
    p.add_argument("--data_path", default="", help="prepared ArrayRecord shards (sets data.source=arrayrecord)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every run (repeatable), e.g. --set train.eval_batches=16")
    p.add_argument("--only", default="", help="comma-separated substrings: run only the matching names")
    p.add_argument("--python", default=sys.executable, help="local: the interpreter of the trainer subprocesses")
    p.add_argument("--max_parallel", type=int, default=0, help="slurm: at most this many array tasks at once")
    p.add_argument("--tpu_name", default="", help="tpu: an existing slice to run every run on in turn")
    p.add_argument("--tpu_prefix", default="idattn-sweep", help="tpu: name prefix of the per-run slices")
    p.add_argument("--wsd_branches", action="store_true",
                   help="local: one WSD trunk per (mixer, size), smaller token budgets branch their decay from it")
    a = p.parse_args(argv)
    configs = load_sweep(a.sweep_file)
    if a.only:
        keys = [s for s in a.only.split(",") if s]
        configs = [c for c in configs if any(k in c.sweep.name for k in keys)]
        if not configs:
            raise SystemExit(f"--only={a.only!r} matches no run of {a.sweep_file}")
    extra = _extra_flags(configs, a)
    per_run = None
    if a.wsd_branches:
        if a.launcher != "local":
            raise SystemExit("--wsd_branches runs each trunk before its branches, which the local launcher does; "
                             "on slurm/tpu print the plan with --launcher=local --dry_run and submit the trunks, "
                             "then the branches")
        configs, per_run = wsd_branch_plan(configs, a.root)
    if a.launcher == "local" and rest:
        raise SystemExit(f"arguments after `--` ({rest}) are for the slurm/tpu launchers; local takes none")
    # every member's final trainer arguments, checked before anything is written, printed, run or submitted
    rc = check_members(a.sweep_file, configs, a.root, extra, per_run, dry_run=a.dry_run)
    if rc:
        return rc
    if not a.dry_run:
        rc = check.require_tools({"slurm": ["sbatch"], "tpu": ["gcloud"]}.get(a.launcher, []))
        if rc:
            return rc
        os.makedirs(a.root, exist_ok=True)
        man = {"sweep_file": a.sweep_file, "launcher": a.launcher, "extra_flags": extra,
               "runs": [c.sweep.name for c in load_sweep(a.sweep_file)], "time": time.time()}
        atomic.write_json(os.path.join(a.root, MANIFEST), man, indent=1)
    if a.launcher == "local":
        return run_local(a.sweep_file, configs, a.root, extra, dry_run=a.dry_run, python=a.python, per_run=per_run)
    if a.launcher == "slurm":
        return run_slurm(a.sweep_file, configs, a.root, extra, rest, dry_run=a.dry_run, max_parallel=a.max_parallel)
    return run_tpu(a.sweep_file, configs, a.root, extra, rest, dry_run=a.dry_run, tpu_name=a.tpu_name,
                   prefix=a.tpu_prefix)


if __name__ == "__main__":
    sys.exit(main())
