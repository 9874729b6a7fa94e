"""Model benchmark: training tokens/s and MFU per mixer at one size and context, and decode tokens/s against
context.

Training step = loss (next-token cross-entropy) + gradients + AdamW update, jitted, timed as the median of
``--repeats`` steps after warmup. MFU = flops_per_token(cfg.model, T) · tokens/s / peak FLOP/s, with
``idattn.models.flops_per_token`` (6·N plus the mixer term; the interdomain mixer uses the operator's MAC count
(idattn/ops/interdomain.py's docstring)) and the peak from ``--peak-tflops`` or a table of known accelerators (bf16 dense).

Decode: one ``decode_step`` per token with the cache index set to the context length (the KV cache of the
softmax model is allocated for it, so its per-token cost grows with context; the recurrent mixers' state does
not). Needs flax / optax / ml_collections: only the `model` subcommand loads this module (idattn.bench.__main__).
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from idattn.configs import apply_overrides
from idattn.configs.scaling import get_config
from idattn.models import build_model, decode_step, flops_per_token, init_cache
from idattn.train import sharding as shd
from idattn.train.metrics import peak_flops_per_device
from idattn.train.placement import build_setup


def peak_flops(device, override=None):
    """The trainer's peak table (idattn.train.metrics.PEAK_TFLOPS), so bench and trainer report the same MFU."""
    return peak_flops_per_device(getattr(device, "device_kind", ""), float(override or 0.0))


def _timeit(fn, n, warmup):
    out = None
    for _ in range(warmup):
        out = fn()
        jax.block_until_ready(out)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        jax.block_until_ready(out)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def train_throughput(mixer, size, seq_len, batch, repeats=5, warmup=2, peak=None, overrides=()):
    """Tokens/s and MFU of the trainer's own jitted step (idattn.train.trainer.build_setup: the same loss,
    optimiser groups, clipping, sharding and donation as `python -m idattn.train`) on all local devices."""
    cfg = get_config(f"{mixer},{size}")
    apply_overrides(cfg, [kv if "." in kv.split("=", 1)[0] else "model." + kv for kv in overrides])
    cfg.data.seq_len, cfg.train.batch_size = int(seq_len), int(batch)
    mesh = shd.make_mesh(cfg.mesh)
    setup = build_setup(cfg, mesh)
    rng = np.random.default_rng(0)
    toks = rng.integers(0, cfg.model.vocab_size, (batch, seq_len + 1)).astype(np.int32)
    local = {"inputs": toks[:, :-1], "targets": toks[:, 1:], "segment_ids": np.ones((batch, seq_len), np.int32),
             "positions": np.tile(np.arange(seq_len, dtype=np.int32), (batch, 1)),
             "loss_mask": np.ones((batch, seq_len), np.float32)}
    with setup.context():
        state = {"s": setup.init(jax.random.PRNGKey(0))}
        batch_arrays = shd.global_batch_from_full(local, mesh)

        def run():
            state["s"], m = setup.train(state["s"], batch_arrays)
            return m["loss"]

        sec = _timeit(run, repeats, warmup)
    tps = batch * seq_len / sec
    fpt = flops_per_token(cfg.model, seq_len)
    pk = peak_flops(jax.devices()[0], peak)
    mfu = None if pk is None else fpt * tps / (pk * jax.device_count())
    return dict(mixer=mixer, size=size, T=seq_len, B=batch, ms=sec * 1e3, tok_s=tps, flops_per_token=fpt, mfu=mfu)


def decode_throughput(mixer, size, contexts, batch, steps=20):
    cfg = get_config(f"{mixer},{size}")
    model = build_model(cfg.model)
    tok = jnp.zeros((batch,), jnp.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), tok[:, None])["params"]
    rows = []
    for ctx in contexts:
        cache = init_cache(cfg.model, batch, max_len=ctx + 2 * steps + 8)
        cache["index"] = jnp.asarray(ctx, jnp.int32)  # pretend a prefilled context of ctx tokens
        state = {"c": cache}

        def run():
            logits, state["c"] = decode_step(model, params, tok, state["c"])
            return logits

        sec = _timeit(run, steps, 3)
        rows.append(dict(mixer=mixer, ctx=ctx, B=batch, ms_per_token=sec * 1e3, tok_s=batch / sec))
    return rows


def _ints(text):
    return [int(x) for x in str(text).split(",") if x]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m idattn.bench model", description=__doc__.split("\n\n")[0])
    on_acc = jax.default_backend() in ("gpu", "tpu")
    p.add_argument("--mixers", default="softmax,interdomain,s4d_only")
    p.add_argument("--size", default="125m" if on_acc else "tiny")
    p.add_argument("--seq", default="4096" if on_acc else "128", help="training contexts, comma list (e.g. 4096,16384)")
    p.add_argument("--batch", type=int, default=8 if on_acc else 2, help="training batch (rows) per step")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens per training step instead of --batch: batch = tokens // T for every T")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's peak (bf16 dense)")
    p.add_argument("--decode-contexts", default="512,2048,8192,16384" if on_acc else "64,256")
    p.add_argument("--decode-batch", default="1", help="decode batch sizes, comma list (e.g. 1,8)")
    p.add_argument("--decode-steps", type=int, default=20)
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--no-decode", action="store_true")
    p.add_argument("--set", action="append", default=[], help="config override, e.g. model.chunk_size=64")
    a = p.parse_args(argv)
    mixers = [m for m in a.mixers.split(",") if m]
    seqs = _ints(a.seq)
    print(f"backend={jax.default_backend()} devices={jax.devices()} jax {jax.__version__}", flush=True)
    if not a.no_train:
        print(f"{'mixer':>14} {'size':>6} {'T':>6} {'B':>4} {'ms/step':>10} {'tok/s':>12} {'GFLOP/tok':>10} {'MFU':>7}")
        tps = {}
        for T in seqs:
            B = max(1, a.tokens // T) if a.tokens else a.batch
            for m in mixers:
                try:
                    r = train_throughput(m, a.size, T, B, a.repeats, peak=a.peak_tflops, overrides=a.set)
                    tps[(m, T)] = r["tok_s"]
                    mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:6.1f}%"
                    print(f"{m:>14} {a.size:>6} {T:>6} {B:>4} {r['ms']:>10.1f} {r['tok_s']:>12.0f} "
                          f"{r['flops_per_token'] / 1e9:>10.3f} {mfu:>7}", flush=True)
                except Exception as e:
                    print(f"{m:>14} {a.size:>6} {T:>6} {B:>4}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        for T in seqs:
            if ("softmax", T) in tps:
                rat = " ".join(f"{m} {tps[(m, T)] / tps[('softmax', T)]:.2f}x" for m in mixers
                               if m != "softmax" and (m, T) in tps)
                if rat:
                    print(f"training tok/s relative to softmax at T={T} (same run): {rat}", flush=True)
    if not a.no_decode:
        ctxs = _ints(a.decode_contexts)
        print(f"\n{'mixer':>14} {'context':>8} {'B':>4} {'ms/token':>10} {'tok/s':>10}")
        for bsz in _ints(a.decode_batch):
            for m in mixers:
                try:
                    for r in decode_throughput(m, a.size, ctxs, bsz, steps=a.decode_steps):
                        print(f"{m:>14} {r['ctx']:>8} {r['B']:>4} {r['ms_per_token']:>10.2f} {r['tok_s']:>10.1f}",
                              flush=True)
                except Exception as e:
                    print(f"{m:>14} B={bsz}: {type(e).__name__}: {str(e)[:300]}", flush=True)
