"""Pure-function operators (jax + numpy only; no Flax), importable on a bare accelerator image.

    interdomain_mix(fq, zk, zv, lam, b, c=None, *, conj=True, impl="auto", chunk_size=64, segment_ids=None,
                    initial_state=None, return_state=False, out_dtype=None, core=None, beta=None)
    interdomain_step(state, fq_t, zk_t, zv_t, lam, b, c=None, *, conj=True, beta=None) -> (o_t, new_state)
        lam, b: [H, M] (LTI) or [B, T, H, M] per token (selective; one |lam_t| per row, token and head; the step
        takes this token's [B, H, M]); see "Selective" in idattn/ops/interdomain.py. `core` names the recurrence,
        "lti" or "selective" (idattn.ops.interdomain.CORES); None reads it from lam's and b's shapes. beta:
        [B, T, H] in [0, 2] (the step: [B, H]), the delta update's erase on the key state ("Delta"), or None
    s4d_linear_mix(z, lam, b, c, *, impl="auto", chunk_size=64, segment_ids=None, initial_state=None,
                   return_state=False, out_dtype=None, core=None)          the linear S4D readout y = Re(c·X) (cube `linear`)
    s4d_linear_step(state, z_t, lam, b, c) -> (y_t, new_state)
    s4d: init_s4d_a, init_log_dt, discretize, max_chunk_size
    theory.legs_interdomain(fq, fk, v, num_basis, *, denominator=True, segment_ids=None)
"""
from idattn.ops import s4d
from idattn.ops.interdomain import (IMPLS, associative_bytes, chunked_cost_macs, document_index, interdomain_mix,
                                    interdomain_step, resolve_impl, set_associative_max_bytes)
from idattn.ops.s4d_linear import LINEAR_IMPLS, linear_cost_macs, s4d_linear_mix, s4d_linear_step

__all__ = ["IMPLS", "associative_bytes", "chunked_cost_macs", "document_index", "interdomain_mix",
           "interdomain_step", "resolve_impl", "s4d", "set_associative_max_bytes", "LINEAR_IMPLS", "linear_cost_macs",
           "s4d_linear_mix", "s4d_linear_step"]
