"""Every Pallas launch of the fused operator, timed alone on the device: where a forward + backward's time goes.

    per_kernel_times((16, 128, 32), T=4096, tokens=65536, mode="fwdbwd")   # [{"name", "grid", "ms"}, ...]

The operator is traced once (``jax.jit(...).lower``, nothing runs) with ``idattn.ops.pallas.gpu._call``
wrapped so that every ``pallas_call`` it builds is recorded with its operand shapes; then each recorded launch is
compiled alone and timed on random operands of those shapes (the kernels have no data-dependent control flow,
so the values do not change their time; integer operands are zeros: one document). The sum over launches beside
the whole program's time (``idattn.bench.op``) is what XLA's ops around the kernels cost. The first device run
measured only whole programs (3-10 launches each), which a cost model cannot split into kernels
(``idattn.bench.gpu_model``; docs/kernels-results.md, "Where the time goes"); these rows can. Imports only jax
and numpy.
"""
from __future__ import annotations

import contextlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from idattn.bench import op as bop
from idattn.ops.pallas import gpu


@contextlib.contextmanager
def recording_launches():
    """Inside: every GPU-family pallas_call the operator builds is appended to the yielded list as (name,
    callable, [ShapeDtypeStruct of its operands], grid) (idattn.ops.pallas.gpu.LAUNCH_RECORDER)."""
    launches: list = []
    gpu.LAUNCH_RECORDER = launches
    try:
        yield launches
    finally:
        gpu.LAUNCH_RECORDER = None


def _operand(spec, key):
    if jnp.issubdtype(spec.dtype, jnp.integer) or spec.dtype == jnp.bool_:
        return jnp.zeros(spec.shape, spec.dtype)
    return (0.1 * jax.random.normal(key, spec.shape, jnp.float32)).astype(spec.dtype)


def per_kernel_times(shape, T, tokens, mode="fwdbwd", dtype=jnp.bfloat16, chunk=64, repeats=5, warmup=1,
                     interpret=None, deadline=None, log=None, only=None) -> list[dict]:
    """[{"name", "grid", "ms" (median of `repeats`, None when skipped or failed), "note"}] for every launch of one
    forward (mode "fwd") or forward + backward ("fwdbwd") at (H, d_h, M) = `shape`, B = tokens // T. interpret:
    run the kernels in Pallas' interpreter (CPU checks of this code path; the times then mean nothing). only: a
    tuple of name prefixes (e.g. ("idattn_scan",)): the other launches are neither compiled nor listed."""
    H, dh, M = shape
    B = max(1, tokens // T)
    fq, zk, zv, lam, b, c = bop.make_inputs(B, T, H, dh, M, dtype)
    fn = bop.mixer_fn("pallas", mode, chunk, False, interpret=interpret,
                      pallas_kwargs={"family": "gpu"} if interpret else None)
    args = (fq, zk, zv, lam, b, c) + ((jnp.ones((B, T, H, dh), jnp.float32),) if mode == "fwdbwd" else ())
    with recording_launches() as launches:
        jax.jit(fn).lower(*args)
    rows = []
    for i, (name, f, specs, grid) in enumerate(launches):
        if only is not None and not name.startswith(tuple(only)):
            continue
        if deadline is not None and time.time() > deadline:
            rows.append(dict(name=name, grid=grid, ms=None, note="skipped (time budget)"))
            continue
        try:
            keys = jax.random.split(jax.random.PRNGKey(i), max(1, len(specs)))
            ops = [_operand(s, k) for s, k in zip(specs, keys)]
            ms, _ = bop.time_compiled(f, ops, warmup, repeats)  # compile once, median of the repeats
            rows.append(dict(name=name, grid=grid, ms=ms, note=""))
        except Exception as e:  # one launch's failure never stops the others
            rows.append(dict(name=name, grid=grid, ms=None, note=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"))
        if log:
            r = rows[-1]
            log(f"  {r['name']:<24} grid {str(r['grid']):<16} "
                + (f"{r['ms']:8.3f} ms" if r["ms"] is not None else r["note"]))
    return rows


def format_rows(shape, T, tokens, mode, rows, total_ms=None) -> str:
    known = [r["ms"] for r in rows if r["ms"] is not None]
    head = (f"{tuple(shape)} T={T} B={max(1, tokens // T)} {mode}: {len(rows)} launches, sum {sum(known):.3f} ms"
            + (f", whole program {total_ms:.3f} ms (XLA around the kernels: {total_ms - sum(known):.3f} ms)"
               if total_ms else ""))
    return head + "\n" + "\n".join(f"  {r['name']:<24} {str(r['grid']):<16} "
                                   + (f"{r['ms']:.3f} ms" if r["ms"] is not None else r["note"]) for r in rows)


def as_json(rows) -> list:
    return [dict(r, grid=list(r["grid"]), ms=None if r["ms"] is None else float(np.round(r["ms"], 4))) for r in rows]
