"""Model-level accelerator smoke check (run on a GPU/TPU host): `python -m idattn.bench.smoke`.

1. cuDNN attention (with and without segment masks) against XLA, bf16.
2. 125M softmax / interdomain in bf16 with packed segment ids: finite logits, forward and train-step time.
3. Tiny interdomain model in float32 with impl=auto (the fused kernel where available): token-by-token
   decoding (interdomain_step) reproduces the full forward.

`--tiny` (CPU dry run of every code path, used by `scripts/gpu_check.py --dry-run`): 2-layer models and
256-token sequences instead of 125M at 2048; the cuDNN comparison says "skipped (no GPU)" off a GPU.
"""
from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from idattn.configs import base_config
from idattn.ops.interdomain import document_index
from idattn.models import apply_mixer_name, build_model, decoding
from idattn.train.step import make_loss_sums


def _t(f, *a, n=3):
    jax.block_until_ready(f(*a))
    t0 = time.time()
    for _ in range(n):
        out = f(*a)
    jax.block_until_ready(out)
    return (time.time() - t0) / n * 1e3


def cudnn_vs_xla(tiny: bool) -> list[str]:
    """Section 1: cuDNN attention (causal, and with segment masks) against XLA in bf16, one line each; off a GPU
    each line says it was skipped (cuDNN needs an NVIDIA GPU), never FAILED."""
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    TA = 128 if tiny else 1024
    q, k, v = (jax.random.normal(x, (2, TA, 8, 64), jnp.bfloat16) for x in ks)
    seg = jnp.concatenate([jnp.zeros((2, 300 * TA // 1024), jnp.int32),
                           jnp.ones((2, TA - 300 * TA // 1024), jnp.int32)], 1)
    doc = document_index(seg, 2, TA)
    mask = ((doc[:, :, None] == doc[:, None, :]) & jnp.tril(jnp.ones((TA, TA), bool)))[:, None]
    lines = []
    for name, kw in (("causal", dict(is_causal=True)), ("segments", dict(mask=mask, is_causal=True))):
        if jax.default_backend() != "gpu":
            lines.append(f"cudnn vs xla [{name}]: skipped (no GPU: cuDNN attention needs an NVIDIA GPU)")
            continue
        try:
            a = jax.nn.dot_product_attention(q, k, v, implementation="cudnn", **kw).astype(jnp.float32)
            kw2 = dict(kw, is_causal=False) if "mask" in kw else kw
            b = jax.nn.dot_product_attention(q, k, v, implementation="xla", **kw2).astype(jnp.float32)
            lines.append(f"cudnn vs xla [{name}]: max abs diff {float(jnp.max(jnp.abs(a - b))):.3e}")
        except Exception as e:  # noqa: BLE001
            lines.append(f"cudnn [{name}] FAILED: {type(e).__name__}: {str(e)[:300]}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m idattn.bench.smoke", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU dry run: 2-layer models, 256-token sequences")
    tiny = ap.parse_args(argv).tiny
    print(jax.__version__, jax.devices(), "(tiny)" if tiny else "", flush=True)
    for line in cudnn_vs_xla(tiny):
        print(line, flush=True)

    T = 256 if tiny else 2048
    for mixer in ("softmax", "interdomain"):
        c = base_config().model
        if tiny:
            c.update(dict(num_layers=2, d_model=128, num_heads=2, head_dim=64, ffn_dim=256))
        apply_mixer_name(c, mixer)
        try:
            m = build_model(c)
            tok = jax.random.randint(jax.random.PRNGKey(1), (4, T), 0, 32000)
            sg = jnp.asarray(np.repeat(np.array([[0] * (T // 3) + [1] * (T - T // 3)]), 4, 0), jnp.int32)
            p = nn.meta.unbox(jax.jit(m.init)(jax.random.PRNGKey(0), tok[:, :8])["params"])
            fwd = jax.jit(lambda p, t, s: m.apply({"params": p}, t, segment_ids=s))
            lg = fwd(p, tok, sg)

            loss_sums = make_loss_sums(m.apply)  # the trainer's loss (idattn.train.step)
            pos = jnp.broadcast_to(jnp.arange(T - 1, dtype=jnp.int32), (4, T - 1))

            def loss(p, tok, sg):  # tokens as arguments: as constants XLA would spend the compile folding them
                batch = {"inputs": tok[:, :-1], "targets": tok[:, 1:], "segment_ids": sg[:, :-1], "positions": pos,
                         "loss_mask": jnp.ones((4, T - 1), jnp.float32)}
                total, count = loss_sums(p, batch)
                return total / count
            g = jax.jit(jax.value_and_grad(loss))
            val, _ = g(p, tok, sg)
            print(f"{mixer} {'tiny' if tiny else '125M'} bf16 [4,{T}]: finite={bool(jnp.all(jnp.isfinite(lg)))} "
                  f"loss={float(val):.3f} "
                  f"fwd {_t(fwd, p, tok, sg):.1f} ms  fwd+bwd {_t(g, p, tok, sg):.1f} ms", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{mixer} 125M FAILED: {type(e).__name__}: {str(e)[:500]}", flush=True)

    c = base_config().model
    c.update(dict(vocab_size=64, d_model=64, num_layers=2, num_heads=2, head_dim=32, ffn_dim=128, num_modes=8,
                  dtype="float32", remat="none", chunk_size=16))
    for mixer in ("interdomain", "s4d_only", "softmax"):
        try:
            apply_mixer_name(c, mixer)
            m = build_model(c)
            tok = jax.random.randint(jax.random.PRNGKey(2), (1, 40), 0, 64)
            p = nn.meta.unbox(m.init(jax.random.PRNGKey(0), tok)["params"])
            full = jax.jit(m.apply)({"params": p}, tok)[0]
            cache = decoding.init_cache(m, 1, 40)
            lg, cache = decoding.prefill(m, p, tok[:, :13], cache, chunk_size=5)
            outs = [lg[0]]
            for t in range(13, 40):
                lg, cache = decoding.decode_step(m, p, tok[:, t], cache)
                outs.append(lg[0])
            err = float(jnp.max(jnp.abs(jnp.stack(outs) - full[12:])) / jnp.max(jnp.abs(full)))
            print(f"decode vs full [{mixer}, impl=auto]: rel err {err:.2e} {'PASS' if err < 1e-3 else 'FAIL'}",
                  flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"decode [{mixer}] FAILED: {type(e).__name__}: {str(e)[:500]}", flush=True)


if __name__ == "__main__":
    main()
