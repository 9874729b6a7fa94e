"""Cost of the checkpoint checksums (idattn.rundir.integrity) next to a plain read of the same bytes.

    python -m idattn.bench checksum [--params=134e6,374e6] [--repeats=3] [--leaves=16]

For each parameter count N it builds a float32 train state of 3·N values (parameters and AdamW's two moments,
what a checkpoint holds) as `--leaves` arrays, and times, in one run side by side:
  read     jnp.sum over every leaf (one read of the state: the floor for any pass over it)
  digest   integrity.summarize (the two 32-bit sums per leaf and the finiteness flags; what save and restore run)
Printed: seconds (median of --repeats, after one warm-up) and the ratio digest / read. On an accelerator the
pass is bandwidth-bound and runs on each device's shard: seconds ≈ ratio × (state bytes / devices) / HBM
bandwidth. Default sizes: the paper's 125M and 350M Softmax models (Table 3); larger ones need > 16 GiB of host
memory on CPU.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from idattn.rundir import integrity


def _state(n_params: int, leaves: int):
    per = -(-3 * n_params // leaves)
    rows = 1024
    return [jnp.asarray(np.random.default_rng(i).standard_normal((rows, -(-per // rows)), dtype=np.float32))
            for i in range(leaves)]


def _time(fn, repeats: int) -> float:
    jax.block_until_ready(fn())
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m idattn.bench checksum", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", default="134e6,374e6", help="comma-separated parameter counts")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--leaves", type=int, default=16)
    a = p.parse_args(argv)
    read = jax.jit(lambda xs: [jnp.sum(x) for x in xs])
    dev = jax.devices()[0]
    print(f"device {dev.device_kind} ({dev.platform}), jax {jax.__version__}; float32 state = 3 x N values")
    print(f"{'N':>12} {'state':>9} {'read s':>8} {'digest s':>9} {'ratio':>6} {'digest GB/s':>12}")
    for n in (int(float(x)) for x in a.params.split(",") if x):
        xs = _state(n, a.leaves)
        gb = sum(x.size * 4 for x in xs) / 1e9
        t_read = _time(lambda: read(xs), a.repeats)
        t_dig = _time(lambda: integrity.summarize(xs), a.repeats)
        print(f"{n:>12,} {gb:>7.2f}GB {t_read:>8.3f} {t_dig:>9.3f} {t_dig / t_read:>6.2f} {gb / t_dig:>12.2f}")
        del xs
