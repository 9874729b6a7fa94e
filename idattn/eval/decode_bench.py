"""Decode benchmark: per-token latency and tokens/s against context length and batch size; prefill memory.

For each (batch B, context P): a random prompt of P tokens is prefilled (chunked, `prefill_chunk`), then
`warmup` decode steps run untimed and `steps` decode steps are timed one by one (each step blocks on its logits,
so the time includes dispatch, as a serving loop would see it). Reported per cell:
  ms_per_token@<P>/b<B>   median step time in ms (one token per row per step)
  tokens_per_s@<P>/b<B>   B / median step time
The recurrent mixers' step cost must not depend on P (their state is constant); softmax reads a KV cache that
grows with P.

Prefill memory (`prefill_memory`): XLA's compiled memory analysis of one prefill call (arguments + outputs +
temporaries, bytes) for the whole prompt at once ("full") and for one chunk of `chunk` tokens with the cache
carried ("chunked"), which is what bounds the peak of a chunked prefill. It needs no accelerator and is exact for
the compiled program (it does not include allocator fragmentation). On a GPU the allocator's own peak
(`memory_stats()["peak_bytes_in_use"]`) is added to details when available.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from idattn.models.decoding import decode_step, init_cache, prefill


def _compiled_bytes(fn, *args) -> dict[str, int]:
    comp = jax.jit(fn).lower(*args).compile()
    ma = comp.memory_analysis()
    if ma is None:
        return {}
    get = lambda k: int(getattr(ma, k, 0) or 0)  # noqa: E731
    out = {"argument_bytes": get("argument_size_in_bytes"), "output_bytes": get("output_size_in_bytes"),
           "temp_bytes": get("temp_size_in_bytes"), "alias_bytes": get("alias_size_in_bytes")}
    out["total_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
    return out


def prefill_memory(model, params, *, batch_size: int, context: int, chunk: int = 2048,
                   modes: Sequence[str] = ("full", "chunked")) -> dict[str, Any]:
    """Compiled memory of a full-prompt prefill and of one chunk of a chunked prefill (module docstring)."""

    def run(p, t, c):
        return model.apply({"params": p}, t, cache=c)

    cache = init_cache(model, batch_size, context + 1)
    out = {}
    for mode, T in (("full", context), ("chunked", min(chunk, context))):
        if mode not in modes:
            continue
        toks = jax.ShapeDtypeStruct((batch_size, T), jnp.int32)
        try:
            out[mode] = _compiled_bytes(run, params, toks, cache)
        except Exception as e:  # an out-of-memory compile is a result, not a crash
            out[mode] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return out


def decode_benchmark(model, params, *, contexts: Sequence[int] = (512, 2048, 8192),
                     batch_sizes: Sequence[int] = (1, 8), steps: int = 32, warmup: int = 4, prefill_chunk: int = 2048,
                     vocab_size: int | None = None, memory: bool = True, seed: int = 0, log=print
                     ) -> tuple[dict[str, float], dict[str, Any]]:
    """Times decode for each (context, batch); returns (metrics, details) (module docstring for the names)."""

    V = int(vocab_size or model.spec.vocab_size)
    rng = np.random.default_rng(seed)
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {"backend": jax.default_backend(), "device": str(jax.devices()[0]), "steps": steps,
                               "cells": {}}
    for B in batch_sizes:
        for P in contexts:
            key = f"{P}/b{B}"
            try:
                prompt = jnp.asarray(rng.integers(3, V, size=(B, P)), jnp.int32)
                cache = init_cache(model, B, P + warmup + steps + 1)
                t0 = time.perf_counter()
                logits, cache = prefill(model, params, prompt, cache, prefill_chunk)
                jax.block_until_ready(logits)
                prefill_s = time.perf_counter() - t0
                tok = jnp.argmax(logits, -1).astype(jnp.int32)
                times = []
                for i in range(warmup + steps):
                    t0 = time.perf_counter()
                    logits, cache = decode_step(model, params, tok, cache)
                    jax.block_until_ready(logits)
                    if i >= warmup:
                        times.append(time.perf_counter() - t0)
                    tok = jnp.argmax(logits, -1).astype(jnp.int32)
                med = float(np.median(times))
                metrics[f"ms_per_token@{key}"] = med * 1e3
                metrics[f"tokens_per_s@{key}"] = B / med
                cell = {"ms_median": med * 1e3, "ms_min": float(np.min(times)) * 1e3,
                        "ms_max": float(np.max(times)) * 1e3, "prefill_s_incl_compile": prefill_s}
            except Exception as e:  # OOM at long contexts is a result (the paper's tables report it)
                cell = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            if memory:
                cell["prefill_memory"] = prefill_memory(model, params, batch_size=B, context=P, chunk=prefill_chunk)
                for mode, m in cell["prefill_memory"].items():
                    if "total_bytes" in m:
                        metrics[f"prefill_gb@{key}/{mode}"] = m["total_bytes"] / 2 ** 30
            details["cells"][key] = cell
            log(f"decode {key}: {cell.get('ms_median', float('nan')):.3f} ms/token "
                f"{cell.get('error', '')}")
    try:
        stats = jax.devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            details["allocator_peak_bytes"] = int(stats["peak_bytes_in_use"])
    except Exception:  # CPU backends have no allocator statistics
        pass
    return metrics, details
