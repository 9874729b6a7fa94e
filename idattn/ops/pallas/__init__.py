"""Fused Pallas kernels for ``interdomain_mix`` (GPU: Triton lowering; TPU: Mosaic), with a chunked backward.

    interdomain_mix_pallas(fq, zk, zv, lam, b, c, *, conj, chunk_size, segment_ids, initial_state,
                           return_state, out_dtype, interpret=None, family=None)
    pallas_available() -> bool     # default backend is a GPU or a TPU

Design, tiling and numerics: docs/kernels.md; the per-chunk math: ``idattn/ops/pallas/_chunk.py``; the
wrapper (padding, masks, custom_vjp): ``idattn/ops/pallas/op.py``. Imports only jax and numpy.
"""
from idattn.ops.pallas.op import chunk_size_supported, interdomain_mix_pallas, pallas_available, set_save_states

__all__ = ["chunk_size_supported", "interdomain_mix_pallas", "pallas_available", "set_save_states"]
