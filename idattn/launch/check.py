"""The one check before every submission: every launcher (local, SLURM, TPU) and every sweep member, dry
run or not, runs the trainer's own `--check_only` on the run's final arguments before it writes a script or calls
`sbatch` / `gcloud` / the trainer; and a missing scheduler binary is one line naming it.

    check_runs([trainer_args, ...], names=[...], dry_run=...)   # 0, or the first refused run's exit status
    require_tools(["sbatch"])                                    # 0, or 127 and one line naming what to install
    call_tool(["sbatch", path])                                  # subprocess.call; a missing binary is one line

`check_runs` starts one process on this machine (`python -m idattn.launch.check`, JAX_PLATFORMS=cpu: a check, not
a run, never the submitting host's accelerator) that imports the trainer's command line once and, per run, forks a
child (up to one per CPU at a time) that runs `python -m idattn.train <args> --check_only` exactly (the trainer's
flags, `run_app`, `main`): keys, values, the model, the data choice, the tokenizer; no data read, nothing written.
A sweep of 24 runs pays the imports once. The refusal printed (stderr: stdout stays the launcher's commands or
script) is the trainer's own `error: ...` line.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from typing import Sequence

from idattn.configs.flags import run_app

_RESULT = "idattn.launch.check results: "

# what to do when a scheduler's binary is not on PATH
TOOL_HINTS = {
    "sbatch": "run this on a SLURM login node, or put SLURM's bin folder (the one holding sbatch) on PATH",
    "gcloud": "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), put its bin folder on PATH "
              "and run `gcloud auth login` once",
    "git": "install git (setup ships `git archive HEAD` of the checkout)",
}


def trainer_args_of(cmd: Sequence[str]) -> list[str] | None:
    """The trainer's arguments of one process's python command line (`[python options] -m idattn.train <args>`),
    or None when it runs something else (another module, a script): nothing to check."""
    cmd = list(cmd)
    if "-m" not in cmd:
        return None
    k = cmd.index("-m")
    return cmd[k + 2:] if cmd[k + 1:k + 2] == ["idattn.train"] else None


def check_runs(runs: Sequence[Sequence[str]], *, python: str = sys.executable, names: Sequence[str] | None = None,
               dry_run: bool = False) -> int:
    """Check every run's trainer arguments with the trainer's `--check_only` (module docstring). Prints one line to
    stderr: `dry run: config OK ...` / `check: config OK ...` (several runs: how many passed), or per distinct
    refusal `dry run refused: <the trainer's line>` / `check refused: <the trainer's line>` (several runs: which).
    Returns 0 when every run would start, else the first refused run's exit status."""
    runs = [list(r) for r in runs]
    if not runs:
        return 0
    names = list(names) if names is not None else [f"run {i}" for i in range(len(runs))]
    prefix = "dry run" if dry_run else "check"
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # a check, not a run: never the submitting host's accelerator
    try:
        proc = subprocess.run([python, "-m", "idattn.launch.check"], input=json.dumps(runs), capture_output=True,
                              text=True, env=env)
    except OSError as e:  # the interpreter itself is missing or not executable
        print(f"{prefix} refused: cannot check the trainer's arguments with {python!r}: {e}", file=sys.stderr,
              flush=True)
        return 127
    results = None
    for ln in reversed(proc.stdout.splitlines()):
        if ln.startswith(_RESULT):
            results = json.loads(ln[len(_RESULT):])
            break
    if results is None:  # the checker did not get to the runs (e.g. an interpreter without idattn)
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        print(f"{prefix} refused: the check did not run with {python!r}: "
              f"{lines[-1] if lines else f'exit {proc.returncode}'}", file=sys.stderr, flush=True)
        return proc.returncode or 1
    bad = [(n, r) for n, r in zip(names, results) if r["rc"] != 0]
    if not bad:
        say = results[0]["line"] if len(runs) == 1 else f"all {len(runs)} runs' configs OK"
        print(f"{prefix}: {say}", file=sys.stderr, flush=True)
        return 0
    by_line: dict[str, list[str]] = {}
    for n, r in bad:
        by_line.setdefault(r["line"], []).append(n)
    for line, which in by_line.items():
        runs_of = ("" if len(runs) == 1 else
                   f" ({len(which)} of {len(runs)} runs: {', '.join(which[:3])}{', ...' if len(which) > 3 else ''})")
        print(f"{prefix} refused{runs_of}: {line}", file=sys.stderr, flush=True)
    return bad[0][1]["rc"]


def missing_tool_line(name: str) -> str:
    return (f"error: {name} not found on PATH: {TOOL_HINTS.get(name, f'install {name} and put it on PATH')}; "
            f"--dry_run prints what would run without it")


def require_tools(names: Sequence[str]) -> int:
    """0 when every program is on PATH; else one line naming the first missing one and what to install (stderr)
    and 127 (the shell's 'command not found')."""
    for name in dict.fromkeys(names):
        if shutil.which(name) is None:
            print(missing_tool_line(name), file=sys.stderr, flush=True)
            return 127
    return 0


def call_tool(cmd: Sequence[str]) -> int:
    """`subprocess.call(cmd)`, with a missing program reported as `require_tools` does (one line, 127)."""
    try:
        return subprocess.call(list(cmd))
    except FileNotFoundError:
        print(missing_tool_line(cmd[0]), file=sys.stderr, flush=True)
        return 127


# ------------------------------------------------------------------------------ the checking process (one per call)
def _trainer_line(output: str, rc: int) -> str:
    """The trainer's own line: its `error: ...` line (the last), else absl's flag error, else the last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for pick in (lambda ln: ln.startswith("error:"), lambda ln: ln.startswith("FATAL Flags parsing error")):
        found = [ln for ln in lines if pick(ln)]
        if found:
            return found[-1]
    return lines[-1] if lines else f"exit {rc}"


def _fork_check(cli, run_app, args: list[str], out_fd: int) -> int:
    """Fork a child that runs `python -m idattn.train <args> --check_only` exactly (the trainer's flags, run_app,
    main; the imports already paid here), its output into `out_fd`; returns its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        sys.argv[:] = ["idattn.train", *args, "--check_only"]  # ml_collections reads the overrides from sys.argv
        run_app(cli.main)
        code = 0
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _check_all(runs: list[list[str]]) -> list[dict]:
    """{rc, line} per run: each run's check in its own forked child, up to one per CPU at a time (a subprocess
    each where fork is not available)."""
    if not hasattr(os, "fork"):
        out = []
        for args in runs:
            p = subprocess.run([sys.executable, "-m", "idattn.train", *args, "--check_only"], capture_output=True,
                               text=True)
            out.append({"rc": p.returncode, "line": _trainer_line(p.stdout + p.stderr, p.returncode)})
        return out
    # local: the trainer's CLI (absl flags, jax) in the checking process only, once; every forked child has it
    cli = importlib.import_module("idattn.train.__main__")

    width = max(1, min(len(runs), os.cpu_count() or 1, 8))
    results: list = [None] * len(runs)
    todo, running = list(enumerate(runs)), {}
    while todo or running:
        while todo and len(running) < width:
            i, args = todo.pop(0)
            f = tempfile.TemporaryFile()
            running[_fork_check(cli, run_app, list(args), f.fileno())] = (i, f)
        pid, status = os.wait()
        if pid not in running:
            continue
        i, f = running.pop(pid)
        with f:
            f.seek(0)
            out = f.read().decode(errors="replace")
        rc = os.waitstatus_to_exitcode(status)
        results[i] = {"rc": rc, "line": _trainer_line(out, rc)}
    return results


def main(argv=None) -> int:
    """`python -m idattn.launch.check` < JSON list of trainer argument lists: prints one result line (JSON)."""
    argparse.ArgumentParser(prog="python -m idattn.launch.check", description=__doc__ + "\nReads a JSON list of "
                            "the runs' trainer argument lists on stdin; prints one line, the JSON list of each run's "
                            "{rc, line}.", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    runs = [list(r) for r in json.load(sys.stdin)]
    print(_RESULT + json.dumps(_check_all(runs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
