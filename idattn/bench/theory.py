"""LegS convergence table (docs/model.md, theory mode): relative error of ``idattn.ops.theory.legs_interdomain`` to
normalised causal linear attention with the same positive feature map, on smooth ~200-step signals, as the
number of LegS basis functions M grows. Expect a fall of ≥ 5x from M = 2 to M = 16 and a plateau (or a slight
rise) around M = 32: the discretised continuous projection against a discrete sum."""
from __future__ import annotations

import argparse

import jax
import numpy as np

from idattn.ops import theory


def run(basis_sizes=(2, 4, 8, 16, 32), length=200, seeds=(0, 1, 2)):
    rows = []
    with jax.enable_x64(True):  # jax >= 0.10.2 (setup.py) has the context manager at the top level
        per_seed = [dict(theory.convergence_table(basis_sizes, length=length, seed=s)) for s in seeds]
    for m in basis_sizes:
        errs = np.array([d[m] for d in per_seed])
        rows.append((m, float(np.mean(errs)), float(np.min(errs)), float(np.max(errs))))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m idattn.bench theory", description=__doc__.split("\n")[0])
    p.add_argument("--basis", default="2,4,8,16,32")
    p.add_argument("--length", type=int, default=200)
    p.add_argument("--seeds", default="0,1,2")
    a = p.parse_args(argv)
    basis = tuple(int(x) for x in a.basis.split(","))
    rows = run(basis, a.length, tuple(int(x) for x in a.seeds.split(",")))
    print(f"LegS interdomain vs normalised causal linear attention (T={a.length}, float64, seeds {a.seeds})")
    print(f"{'M':>4} {'rel err (mean)':>15} {'min':>10} {'max':>10} {'vs M=' + str(basis[0]):>10}")
    for m, e, lo, hi in rows:
        print(f"{m:>4} {e:>15.4e} {lo:>10.3e} {hi:>10.3e} {rows[0][1] / e:>9.1f}x")
    return rows
