"""Operator benchmark: ``interdomain_mix`` implementations against causal softmax attention, side by side.

For each head shape (H, d_h, M) and context T (batch B = tokens // T, so every row processes the same number
of tokens), each implementation is compiled once (``jax.jit(f).lower(...).compile()``: the same executable
gives the peak temporary memory, ``memory_analysis().temp_size_in_bytes``, and the timings), warmed up, and
timed as the median of ``repeats`` calls with ``block_until_ready``. Modes: "fwd" (the output) and "fwdbwd"
(value and gradients of a fixed random projection of the output w.r.t. every input and, for the mixer, lam and
b). The attention baseline is ``jax.nn.dot_product_attention(q, k, v, is_causal=True)`` with
``implementation="cudnn"`` on GPU (XLA's default elsewhere) on [B, T, H, d_h] inputs of the same dtype.
``x attn`` = attention time / implementation time (> 1: faster than attention), measured in the same run.

Only jax and numpy are imported (runs on a bare accelerator image).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time


import jax
import jax.numpy as jnp

from idattn.ops import interdomain_mix, interdomain_step, s4d
from idattn.ops.pallas import interdomain_mix_pallas


MODES = ("fwd", "fwdbwd")  # the output; value and gradients (module docstring)


@dataclasses.dataclass
class Row:
    shape: tuple          # (H, d_h, M)
    T: int
    B: int
    impl: str
    mode: str
    ms: float | None = None
    temp_bytes: int | None = None
    note: str = ""

    @property
    def tokens_per_s(self):
        return None if not self.ms else self.B * self.T / (self.ms / 1e3)


def log(*a):
    print(*a, flush=True)
    sys.stdout.flush()


def make_inputs(B, T, H, dh, M, dtype, seed=0, with_c=False):
    """Mixer inputs of the layer's scale: unit-variance features, S4D-discretised (lam, b)."""
    key = jax.random.PRNGKey(seed)
    k1, k2, k3, k4, k5, k6 = jax.random.split(key, 6)
    fq = (jax.random.normal(k1, (B, T, H, dh), jnp.float32) / math.sqrt(dh)).astype(dtype)
    zk = (jax.random.normal(k2, (B, T, H, dh), jnp.float32) / math.sqrt(dh)).astype(dtype)
    zv = jax.random.normal(k3, (B, T, H, dh), jnp.float32).astype(dtype)
    log_a_re, a_im = s4d.init_s4d_a(M)
    log_dt = s4d.init_log_dt(k4, (H,))
    b_re = jax.random.normal(k5, (H, M), jnp.float32)
    b_im = jax.random.normal(k6, (H, M), jnp.float32)
    lam, b = s4d.discretize(jnp.broadcast_to(log_a_re, (H, M)), jnp.broadcast_to(a_im, (H, M)), log_dt, b_re, b_im)
    c = None
    if with_c:
        c = (jnp.eye(M, dtype=jnp.complex64)[None] + 0.1 * jax.random.normal(k6, (H, M, M))).astype(jnp.complex64)
    return fq, zk, zv, lam.astype(jnp.complex64), b.astype(jnp.complex64), c


def mixer_fn(impl, mode, chunk, c_present, interpret=None, pallas_kwargs=None):
    def fwd(fq, zk, zv, lam, b, c):
        if impl == "pallas" and (interpret is not None or pallas_kwargs):
            return interdomain_mix_pallas(fq, zk, zv, lam, b, c, conj=True, chunk_size=chunk, segment_ids=None,
                                          initial_state=None, return_state=False, out_dtype=None,
                                          interpret=interpret, **(pallas_kwargs or {}))
        return interdomain_mix(fq, zk, zv, lam, b, c, impl=impl, chunk_size=chunk)

    if mode == "fwd":
        return fwd

    def loss(fq, zk, zv, lam, b, c, g):
        return jnp.sum(fwd(fq, zk, zv, lam, b, c).astype(jnp.float32) * g)

    argnums = (0, 1, 2, 3, 4, 5) if c_present else (0, 1, 2, 3, 4)
    vg = jax.value_and_grad(loss, argnums=argnums)
    return vg


def attention_fn(mode):
    impl = "cudnn" if jax.default_backend() == "gpu" else None

    def fwd(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)

    if mode == "fwd":
        return fwd

    def loss(q, k, v, g):
        return jnp.sum(fwd(q, k, v).astype(jnp.float32) * g)

    return jax.value_and_grad(loss, argnums=(0, 1, 2))


def time_compiled(fn, args, warmup=2, repeats=10):
    """Compile once; return (median ms, temp bytes)."""
    compiled = jax.jit(fn).lower(*args).compile()
    temp = None
    try:
        ma = compiled.memory_analysis()
        temp = None if ma is None else int(ma.temp_size_in_bytes)
    except Exception:  # pragma: no cover - backend without memory analysis
        temp = None
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), temp


def bench_case(shape, T, tokens, impls, modes, dtype, chunk=64, warmup=2, repeats=10, with_c=False,
               attention=True, deadline=None, interpret=None, pallas_kwargs=None, label=None):
    """Rows for one (shape, T): every impl and attention, in every mode. Errors become notes (never raise)."""
    H, dh, M = shape
    B = max(1, tokens // T)
    rows = []
    try:
        fq, zk, zv, lam, b, c = make_inputs(B, T, H, dh, M, dtype, with_c=with_c)
    except Exception as e:  # pragma: no cover
        return [Row(shape, T, B, "inputs", "-", note=f"{type(e).__name__}: {str(e)[:200]}")]
    g = jax.random.normal(jax.random.PRNGKey(7), (B, T, H, dh), jnp.float32)
    for mode in modes:
        entries = ([("attention", None)] if attention else []) + [(i, None) for i in impls]
        for name, _ in entries:
            if deadline is not None and time.time() > deadline:
                rows.append(Row(shape, T, B, name, mode, note="skipped (time budget)"))
                continue
            try:
                if name == "attention":
                    fn = attention_fn(mode)
                    args = (fq.astype(dtype), zk.astype(dtype), zv) + ((g,) if mode == "fwdbwd" else ())
                else:
                    fn = mixer_fn(name, mode, chunk, c is not None, interpret=interpret, pallas_kwargs=pallas_kwargs)
                    args = (fq, zk, zv, lam, b, c) + ((g,) if mode == "fwdbwd" else ())
                ms, temp = time_compiled(fn, args, warmup, repeats)
                rows.append(Row(shape, T, B, label if (label and name != "attention") else name, mode, ms, temp))
            except Exception as e:
                msg = str(e).strip().splitlines()
                rows.append(Row(shape, T, B, name, mode, note=f"{type(e).__name__}: {(msg[0] if msg else '')[:160]}"))
            log(format_row(rows[-1], None))
    return rows


def format_row(r: Row, attn_ms):
    ms = "-" if r.ms is None else f"{r.ms:9.3f}"
    tps = "-" if r.ms is None else f"{r.tokens_per_s / 1e6:8.2f}M"
    mem = "-" if r.temp_bytes is None else f"{r.temp_bytes / 2**20:9.1f}"
    ratio = "-" if (attn_ms is None or r.ms is None) else f"{attn_ms / r.ms:7.2f}x"
    return (f"{str(r.shape):>14} {r.T:>6} {r.B:>4} {r.mode:>7} {r.impl:>12} {ms:>10} {tps:>10} {mem:>10} "
            f"{ratio:>9}  {r.note}")


HEADER = (f"{'(H,d_h,M)':>14} {'T':>6} {'B':>4} {'mode':>7} {'impl':>12} {'ms':>10} {'tok/s':>10} "
          f"{'temp MiB':>10} {'x attn':>9}")


def format_table(rows):
    attn = {(r.shape, r.T, r.mode): r.ms for r in rows if r.impl == "attention"}
    out = [HEADER, "-" * len(HEADER)]
    for r in rows:
        out.append(format_row(r, attn.get((r.shape, r.T, r.mode))))
    out.append("x attn = attention ms / impl ms in the same run (> 1: faster than attention).")
    return "\n".join(out)


def bench_decode(shape, batches=(1, 8, 64), dtype=jnp.bfloat16, repeats=50):
    """Latency of one ``interdomain_step`` (state [B, H, M, R+D] complex64), independent of context."""
    H, dh, M = shape
    lines = []
    for B in batches:
        try:
            fq, zk, zv, lam, b, _ = make_inputs(B, 1, H, dh, M, dtype)
            state = (jnp.zeros((B, H, M, dh), jnp.complex64), jnp.zeros((B, H, M, dh), jnp.complex64))
            fn = lambda s, q, k, v, lam, b: interdomain_step(s, q, k, v, lam, b)  # noqa: E731
            ms, _ = time_compiled(fn, (state, fq[:, 0], zk[:, 0], zv[:, 0], lam, b), 3, repeats)
            lines.append(f"decode step {str(shape):>14} B={B:<4} {ms * 1e3:9.1f} us/step   "
                         f"{B / (ms / 1e3):12.0f} tok/s (per layer)")
        except Exception as e:
            lines.append(f"decode step {shape} B={B}: {type(e).__name__}: {str(e)[:160]}")
        log(lines[-1])
    return lines


def default_settings():
    if jax.default_backend() in ("gpu", "tpu"):
        return dict(shapes=[(16, 128, 32), (32, 64, 64)], seqs=[1024, 2048, 4096, 8192, 16384], tokens=65536,
                    impls=["chunked", "pallas"], dtype="bfloat16")
    return dict(shapes=[(4, 32, 16)], seqs=[256, 512, 1024], tokens=4096,
                impls=["sequential", "associative", "chunked"], dtype="float32")


def main(argv=None):
    d = default_settings()
    p = argparse.ArgumentParser(prog="python -m idattn.bench op", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=";".join(",".join(map(str, s)) for s in d["shapes"]),
                   help="head shapes H,d_h,M separated by ';' (default: %(default)s)")
    p.add_argument("--seqs", default=",".join(map(str, d["seqs"])), help="contexts T (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=d["tokens"], help="tokens per batch (B = tokens // T)")
    p.add_argument("--impls", default=",".join(d["impls"]),
                   help="comma list of sequential,associative,chunked,pallas (default: %(default)s)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, of %(default)s")
    p.add_argument("--dtype", default=d["dtype"], choices=["bfloat16", "float32"])
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--with-c", action="store_true", help="include the readout mixing c")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-decode", action="store_true")
    p.add_argument("--budget-s", type=float, default=None, help="skip remaining cases after this many seconds")
    a = p.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shapes.split(";") if s]
    seqs = [int(x) for x in a.seqs.split(",") if x]
    impls = [x for x in a.impls.split(",") if x]
    modes = [x for x in a.modes.split(",") if x]
    bad = [i for i in impls if i not in ("sequential", "associative", "chunked", "pallas")]
    if bad:
        p.exit(2, f"error: --impls={a.impls}: unknown {', '.join(bad)}; expected a comma-separated list of "
                  f"sequential, associative, chunked, pallas\n")
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:  # refused here: an unknown mode would fail inside the benchmark, case after case
        p.exit(2, f"error: --modes={a.modes}: unknown mode(s) {', '.join(bad) or '(none given)'}; expected a "
                  f"comma-separated list of {', '.join(MODES)} (e.g. --modes=fwd,fwdbwd)\n")
    deadline = None if a.budget_s is None else time.time() + a.budget_s
    log(f"backend={jax.default_backend()} devices={jax.devices()} dtype={a.dtype} tokens/batch={a.tokens}")
    rows = []
    for shape in shapes:
        for T in seqs:
            rows += bench_case(shape, T, a.tokens, impls, modes, jnp.dtype(a.dtype), a.chunk, a.warmup,
                               a.repeats, a.with_c, deadline=deadline)
    log("")
    log(format_table(rows))
    if not a.no_decode:
        log("")
        for shape in shapes:
            bench_decode(shape)
    return rows
