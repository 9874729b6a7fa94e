"""Reproduce the paper's tables at the scale of this machine: `python -m idattn.repro <table> [--root=DIR] [--toy]`.

Every language model is trained by the real trainer (`idattn.train.run`) with one recipe per size for every mixer
(experiments/repro.py: sizes, steps, Δ ranges, evaluation lengths, seeds 0, 1, 2: init seed 42 + s, data order s);
runs are cached under `<root>/runs/` (idattn/studies/runcache.py), tables written as `<root>/<table>[-toy].md`
and `.json`, each with the verdicts of idattn/studies/repro_verdicts.py (`--toy`: numbers and intervals, never a
verdict word). docs/reproduction.md has the scope, the findings and the commands.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
from absl import logging as absl_logging

from idattn.studies import repro_doc
from idattn.studies.repro_runs import verify_runs
from idattn.studies.repro_selective import TASK_FAMILIES
from idattn.studies.runcache import Ctx, ReproError, archive_now, experiment, log, restore_runs
from idattn.studies.tables import TABLES, order


def _parser() -> argparse.ArgumentParser:
    epilog = "tables, in the order of `all`:\n" + "\n".join(
        f"  {t.name:13s}{t.title.format(L='L', dt='<dt>')}" + ("" if t.at_toy else " (not at toy size)")
        for t in TABLES.values())
    p = argparse.ArgumentParser(description=__doc__, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", choices=tuple(TABLES) + ("all", "verify"),
                   help="a table, `all`, or `verify`: the root's finished runs by their model fingerprint (stamp it "
                        "under the current model code; re-stamp a run whose fingerprint the current code reproduces; "
                        "idattn/studies/repro_runs.py verify_runs), then --archive; no table is written")
    p.add_argument("--root", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "idattn-repro"))
    p.add_argument("--toy", action="store_true", help="the smoke-test size: numbers and intervals, never a verdict "
                   "(they mean nothing). Measured on the shared 2-core machine: `ppl --toy` 3.9 min wall (18 toy runs: "
                   "6 per seed x 3 seeds; the first run of each mixer compiles for 20-45 s, the others take 3-10 s); "
                   "`ppl --toy --only=interdomain` 1.4 min (6 runs); `all --toy` trains more (cube, MQAR)")
    p.add_argument("--seeds", default="", help="comma-separated seeds (default: the config's, 0,1,2)")
    p.add_argument("--render_only", action="store_true", help="write the tables from existing results only")
    p.add_argument("--keep_stale", action="store_true", help="reuse runs trained with other model code")
    p.add_argument("--no_compile_cache", action="store_true", help="do not set JAX's persistent compilation "
                   "cache (default: <root>/.jax-cache, so that seeds and reruns reuse compiled programs)")
    p.add_argument("--train_dt", default="", choices=("", "paper", "scaled"),
                   help="train / evaluate only runs of this Δ range (and softmax); the tables read the others")
    p.add_argument("--doc", default="", help="also rewrite the generated parts of this Markdown file (e.g. "
                   "docs/reproduction.md: 'what we found' and the verdict summary) and write every table of the "
                   "root, in the order of `all`, to its sibling <name>-tables.md (idattn/studies/repro_doc.py)")
    p.add_argument("--only", default="", help="comma-separated mixers to train / evaluate; the tables read the "
                   "others' existing results (e.g. to run part of the grid first)")
    p.add_argument("--tasks", default="", help="the selective and delta tables only: comma-separated task families to train "
                   f"({', '.join(TASK_FAMILIES)}); the others' runs are read (e.g. a GPU for the slow ones)")
    p.add_argument("--restore", default="", help="first recreate under --root the finished runs this record "
                   "(written by --archive) holds and the root lacks: markers and results, no checkpoints; they are "
                   "reused as finished runs when the model code and recipe match (e.g. docs/reproduction-runs.json)")
    p.add_argument("--archive", default="", help="at the end, record every finished run of --root (markers and "
                   "results) in this JSON file, merged with what it holds: a study then outlives its scratch root")
    return p


def _ctx(args) -> Ctx:
    """The invocation's context, after refusing bad flags (one line each, before anything is written)."""
    size = "toy" if args.toy else "small"
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds else list(experiment.SEEDS[size])
    if not seeds:
        raise ReproError("--seeds: expected comma-separated integers, e.g. 0,1")
    only = [m.strip() for m in args.only.split(",") if m.strip()]
    try:
        for m in only:  # the name as a run would build it (+sum, a core's +phase, hybrid-<rec>-<att>-1to<k>)
            if not experiment.parse_hybrid(m):
                experiment.get_config(f"{m},toy,paper,0")
    except ValueError as e:
        raise ReproError(f"--only: {e}") from None
    tasks = frozenset(t.strip() for t in args.tasks.split(",") if t.strip())
    if tasks - set(TASK_FAMILIES):
        raise ReproError(f"--tasks: {', '.join(sorted(tasks - set(TASK_FAMILIES)))}; expected some of "
                         f"{', '.join(TASK_FAMILIES)}, comma-separated")
    if tasks and args.table not in ("selective", "delta"):
        raise ReproError(f"--tasks applies to the selective and delta tables only (got table {args.table!r}); drop it, or "
                         f"use --only / --seeds to choose runs")
    ctx = Ctx(args.root, size, seeds, args.render_only, args.keep_stale, only)
    ctx.tasks, ctx.train_dt, ctx.seeds_given, ctx.archive = tasks, args.train_dt, bool(args.seeds), args.archive
    return ctx


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    t0 = time.time()
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file at INFO
    try:
        ctx = _ctx(args)
        if args.restore:
            log(f"restored {restore_runs(args.restore, ctx.root)} runs from {args.restore} into {ctx.root}")
        if not args.no_compile_cache and not jax.config.jax_compilation_cache_dir:
            # the seeds of a mixer (and reruns) compile the same programs
            jax.config.update("jax_compilation_cache_dir", os.path.join(ctx.root, ".jax-cache"))
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        if args.table == "verify":
            for k, names in verify_runs(ctx).items():
                log(f"{k}: {len(names)}" + (f" ({'; '.join(names[:20])}{'; ...' if len(names) > 20 else ''})"
                                            if names and k in ("changed", "unverifiable", "skipped") else ""))
        else:
            every = order(ctx.size == "toy", TABLES)
            log(f"{args.table} at size {ctx.size}, seeds {list(ctx.seeds)}, root {ctx.root}")
            for t in every if args.table == "all" else (args.table,):
                ts = time.time()
                ctx.unverified.clear()  # each table names the unchecked runs it read itself, not an earlier table's
                TABLES[t].fn(ctx)
                log(f"table {t} done in {(time.time() - ts) / 60:.1f} min")
                print(open(ctx.table_path(t, "md")).read(), flush=True)
            if args.doc:
                log(f"wrote the generated parts of {', '.join(repro_doc.write(args.doc, ctx, every))}")
        archive_now(ctx)  # --archive
    except ReproError as e:
        print(f"idattn.repro: {e}", file=sys.stderr)
        return 1
    log(f"total wall time {(time.time() - t0) / 60:.1f} min")
    return 0
