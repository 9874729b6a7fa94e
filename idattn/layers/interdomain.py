"""The Interdomain mixer (paper Fig. 3a) and its mechanism cube (docs/model.md, Mixers).

Per layer, with H heads of width d_h, feature width R = d_h and M complex S4D modes per head:

  dualkv input:   k = SC(W_K x), v = W_V x;  k <- RoPE(k) if rope;  k̃ = N+β(ξ(k)),  ṽ = N+β(v)
  generic input:  h1 = SC(W_1 x), h2 = SC(W_2 x);  h1 <- RoPE(h1) if rope;  k̃ = N+β(h1),  ṽ = N+β(h2)
  query readout:  q = SC(W_Q x);  q <- RoPE(q) if rope;  f_q = ξ(q)
                  o = interdomain_mix(f_q, k̃, ṽ, Λ_h, b_h, C_h)     (idattn/ops/interdomain.py)
  linear readout: no W_Q, no query. Both halves enter the one shared recurrence, X = [X_k | X_v] ∈ C^{M×(R+d_h)},
                  and are read out linearly in the state, as S4D's y = Re(C x), with the mode contraction
                  c_h = (1/M) 1ᵀ C_h ∈ C^M (column means of the same C_h: mean_m (C_h X)[m, :] = c_hᵀ X):
                      y = s4d_linear_mix([k̃ | ṽ], Λ_h, b_h, c_h)          ∈ R^{R+d_h} per head
                      o = y[:R] + y[R:]                                   (each half reaches o additively)
                  then a learned d×d contraction C_out (stored [H, d_h, H, d_h]) before W_O. No parameter
                  besides C_out (which takes W_Q's place); see docs/model.md for why this reading.
  ξ(x) = SiLU(x) / ‖SiLU(x)‖₂ per head;  N+β = per-head RMSNorm with learned scale and bias ([H, w] each)
  o <- σ(W_g x) ⊙ o   (output gate, optional);  y = W_O concat_h(o)

S4D parameterisation per head h and mode m (idattn.ops.s4d):
  A = −exp(log_a_re) + i·a_im,  Δ_h = exp(log_dt_h) (log-uniform in [dt_min, dt_max] at init),
  Λ = exp(Δ·A) with Re(Δ·A) ≥ −κ,  b = (Λ − 1)/A · B (ZOH),  B = b_re + i·b_im (init 1 + 0i),
  C_h = c_re + i·c_im ∈ C^{M×M} (init: the identity, see docs/model.md).
Complex parameters are stored as pairs of real float32 arrays. All SSM parameters (N+β scales and biases,
log Δ, A, B, C) have names starting with `ssm_` so that `idattn.models.param_labels` puts them in the SSM
optimiser group.

Selective core (`core`; docs/model.md "Selective core" derives the chunked form), either readout (the
linear one with a selective core is S4D-only selective, the Mamba-like control):
  Δ_t = softplus(x_t·W_Δ + β_Δ) ∈ R^H      (W_Δ [d, H] normal(init_std); β_Δ = softplus⁻¹(Δ0), log Δ0 ~ U[log dt_min,
                                            log dt_max]: at W_Δ = 0 the LTI layer's Δ range)
  A_h,m = a_h + iω_h,m,  a_h = −exp(ssm_log_a_re_h)   (Re A tied within a head: [H], not [H, M]; ω as the LTI A)
  lam_t = exp(Δ_t·A) · exp(iΔ_t·ϑ_t)         ϑ_t = π·tanh(x_t·W_θ) ∈ R^M (shared by the heads; selective+phase
                                            only, W_θ [d, M])
  b_t   = (exp(Δ_t·A) − 1)/A · B             (ZOH of A, without the rotation)
  o     = interdomain_mix(f_q, k̃, ṽ, lam_t, b_t, C_h)   (lam_t, b_t [B, T, H, M]; no κ bound: exponents ≤ 0)
  linear readout: y = s4d_linear_mix([k̃ | ṽ], lam_t, b_t, c_h), then as the LTI linear readout (S4D-only selective)
The state (Xk, Xv) and the decoding cache are the LTI layer's: the state size per layer is unchanged.

Delta update (`delta_scale` s > 0; query readout, either core; docs/model.md "Delta core"):
  β_t = s·σ(x_t·W_β) ∈ (0, s)^H             (W_β [d, H] normal(init_std): β ≈ s/2 at init)
  Xk_t = (lam_t ⊙ Xk_{t−1}) (I − β_t k̂_t k̂_tᵀ) + b_t ⊗ k̃_t,  k̂ = k̃/‖k̃‖   (o = interdomain_mix(..., beta=β))
s = 1 erases a repeated key's old content (β ≤ 1); s = 2 also reflects it (β ∈ (0, 2): negative eigenvalues).
The state and the decoding cache are unchanged.

Theory mode (`theory=True`, dualkv + query only): the dense real HiPPO-LegS basis with the Nadaraya-Watson
denominator, `idattn.ops.theory.legs_interdomain(elu(q)+1, elu(k)+1, v, M)`; it has no SSM parameters.

Decoding cache (one document per row): {"conv_<name>": [B, K−1, H, d_h] last inputs of every short
convolution, "xk": [B, H, M, R] complex64, "xv": [B, H, M, d_h] complex64} (both readouts: the linear readout
carries the same two state halves).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from idattn.layers.common import Dense, Dtype, HeadNorm, ShortConv, head_sum, param, per_head, rope
from idattn.ops import interdomain_step, s4d_linear_step
from idattn.ops.s4d import discretize, init_log_dt, init_s4d_a
from idattn.ops.sequence import interdomain_mix_sequence, s4d_linear_mix_sequence, sequence_partition
from idattn.ops.theory import legs_interdomain

INPUTS = ("dualkv", "generic")
READOUTS = ("query", "linear")
CORES = ("lti", "selective", "selective+phase")  # the recurrence: time invariant, or per-token Δ_t (and θ_t)


def xi(x: jax.Array, eps: float = 1e-6, num_heads: int | None = None) -> jax.Array:
    """ξ(x) = SiLU(x) / ‖SiLU(x)‖₂ over the last axis (float32 statistics); with `num_heads`, x is flat
    [..., H·w] and the norm is each head's."""
    s = jax.nn.silu(x.astype(jnp.float32))
    if num_heads is not None:
        return per_head(s, jax.lax.rsqrt(head_sum(s * s, num_heads) + eps)).astype(x.dtype)
    return (s * jax.lax.rsqrt(jnp.sum(s * s, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def _const_init(value: np.ndarray):
    def init(key, shape, dtype=jnp.float32):
        del key
        return jnp.broadcast_to(jnp.asarray(value, dtype), shape)
    return init


class InterdomainMixer(nn.Module):
    """One Interdomain token mixer (module docstring: the math; docs/model.md: the cube and the defaults).

    Fields:
      d_model, num_heads (H), head_dim (d_h; the feature width R = d_h): the layer's widths.
      num_modes: M, complex S4D modes per head (the state is [H, M, R + d_h] per row).
      input: "dualkv" (k = W_K x through ξ, v = W_V x) or "generic" (two convolved projections, no ξ).
      readout: "query" (a query reads the state: interdomain_mix) or "linear" (S4D's y = Re(c_hᵀ X), then C_out).
      use_rope: RoPE on the key-side input (and the query). output_gate: o <- σ(W_g x) ⊙ o.
      linear_contraction: the linear readout's c_h, "mean" (default) or "sum" over the modes of C_h.
      core: "lti" (one Λ per head and mode), "selective" (per-token Δ_t), "selective+phase" (and θ_t).
      delta_scale: s of the delta update's β_t = s·σ(x_t·W_β) (module docstring); 0 = no erase.
      conj: the readout uses the conjugate-symmetric real part (idattn.ops.interdomain).
      theory: the paper's dense HiPPO-LegS derivation instead of S4D (dualkv + query; no decoding).
      s4d_init, kappa, dt_min, dt_max: A's initialisation, the bound Re(Δ·A) ≥ −κ, the log-uniform Δ range.
      rope_base, short_conv (the causal convolution's width K), norm_eps: as named.
      impl, chunk_size: the operator's implementation ("auto" | "chunked" | "pallas" | ...) and its chunk.
      init_std, out_std: the input projections' and W_O's init scales. dtype, param_dtype: compute, storage.
    """
    d_model: int
    num_heads: int
    head_dim: int
    num_modes: int = 64
    input: str = "dualkv"
    readout: str = "query"
    use_rope: bool = True
    output_gate: bool = False
    linear_contraction: str = "mean"  # linear readout: c_h = mean (default) or sum over the modes of C_h
    core: str = "lti"  # lti | selective | selective+phase (module docstring, "Selective core")
    delta_scale: float = 0.0  # the delta update's s (module docstring, "Delta update"); 0 = none
    conj: bool = True
    theory: bool = False
    s4d_init: str = "inv"
    kappa: float = 0.25
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    rope_base: float = 10000.0
    short_conv: int = 4
    impl: str = "auto"
    chunk_size: int = 64
    norm_eps: float = 1e-5
    init_std: float = 0.02
    out_std: float = 0.02
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    def _dense(self, name, out_axes=("heads", "kv"), flat=False):
        return Dense((self.d_model,), (self.num_heads, self.head_dim), ("embed", *out_axes), self.init_std,
                     dtype=self.dtype, param_dtype=self.param_dtype, flat=flat, name=name)

    def _conv(self, name, x, doc, cache, new_cache):
        conv = ShortConv(self.num_heads, self.head_dim, self.short_conv, dtype=self.dtype,
                         param_dtype=self.param_dtype, name=name)
        if cache is None:
            return conv(x, doc)[0]
        y, new_cache[name] = conv(x, None, cache[name])
        return y

    def ssm_params(self):
        """The S4D parameters, declared once for every core, in float32: (Δ's parameter [H], log(−Re A),
        Im A [H, M], Re B, Im B [H, M], C = c_re + i·c_im [H, M, M] complex). Δ's parameter is log Δ_h
        (`ssm_log_dt`) for the LTI core and the bias β_Δ of Δ_t = softplus(x_t·W_Δ + β_Δ) (`ssm_dt_bias`) for a
        selective one; log(−Re A) is [H, M] for the LTI core and [H] (Re A tied within a head) for a selective one.
        Declared in this order (the init keys follow it)."""
        h, m = self.num_heads, self.num_modes
        log_a_re0, a_im0 = init_s4d_a(m, init=self.s4d_init)
        pd, f32 = self.param_dtype, jnp.float32
        if self.core == "lti":
            dt = param(self, "ssm_log_dt", lambda k, s, d=pd: init_log_dt(k, s, self.dt_min, self.dt_max)
                       .astype(d), (h,), ("heads",), pd)
            log_a_re = param(self, "ssm_log_a_re", _const_init(log_a_re0), (h, m), ("heads", "modes"), pd)
        else:
            def dt_bias_init(key, shape, dtype=pd):  # softplus(bias) = Δ0, log Δ0 ~ U[log dt_min, log dt_max]
                dt0 = jnp.exp(init_log_dt(key, shape, self.dt_min, self.dt_max))
                return (dt0 + jnp.log(-jnp.expm1(-dt0))).astype(dtype)  # softplus⁻¹(Δ0) = log(e^Δ0 − 1)

            dt = param(self, "ssm_dt_bias", dt_bias_init, (h,), ("heads",), pd)
            # Re A tied within a head: one log(−Re A) per head (every init starts at Re A = −1/2).
            log_a_re = param(self, "ssm_log_a_re", _const_init(np.float32(np.mean(log_a_re0))), (h,), ("heads",),
                             pd)
        a_im = param(self, "ssm_a_im", _const_init(a_im0), (h, m), ("heads", "modes"), pd)
        b_re = param(self, "ssm_b_re", nn.initializers.ones, (h, m), ("heads", "modes"), pd)
        b_im = param(self, "ssm_b_im", nn.initializers.zeros, (h, m), ("heads", "modes"), pd)
        eye = np.eye(m, dtype=np.float32)
        c_re = param(self, "ssm_c_re", _const_init(eye), (h, m, m), ("heads", "modes", None), pd)
        c_im = param(self, "ssm_c_im", nn.initializers.zeros, (h, m, m), ("heads", "modes", None), pd)
        c = jax.lax.complex(c_re.astype(f32), c_im.astype(f32))
        return dt.astype(f32), log_a_re.astype(f32), a_im.astype(f32), b_re.astype(f32), b_im.astype(f32), c

    def recurrence(self, x):
        """(lam, b, C) of the layer's core from `ssm_params`: the LTI core's lam, b [H, M] (ZOH, Re(Δ·A) ≥ −κ),
        or a selective core's lam_t, b_t [B, T, H, M] complex64 from x [B, T, d] (module docstring, "Selective
        core"); C [H, M, M]."""
        dt_p, log_a_re, a_im, b_re, b_im, c = self.ssm_params()
        if self.core == "lti":
            lam, b = discretize(log_a_re, a_im, dt_p, b_re, b_im, kappa=self.kappa)
            return lam, b, c
        h, m, d = self.num_heads, self.num_modes, self.d_model
        dense = lambda name, n, axes: Dense((d,), (n,), ("embed", axes), self.init_std, dtype=self.dtype,  # noqa
                                            param_dtype=self.param_dtype, out_fp32=True, name=name)(x)
        dt = jax.nn.softplus(dense("w_dt", h, "heads") + dt_p)  # Δ_t [B, T, H] > 0
        a = -jnp.exp(log_a_re)  # [H] < 0
        w = a_im  # [H, M]
        z_re = dt * a  # Δ_t·a_h [B, T, H]: the one log-decay per token and head
        z_im = dt[..., None] * w  # Δ_t·ω_h,m [B, T, H, M]
        mag = jnp.exp(z_re)[..., None]
        # ZOH gain of A = a + iω (without the rotation): b_t = (e^{Δ_t A} − 1)/A · B, with e^z − 1 formed as
        # expm1(Re z)·cos(Im z) − 2 sin²(Im z / 2) + i e^{Re z} sin(Im z) (no cancellation at small Δ_t·|A|).
        em1 = jax.lax.complex(jnp.expm1(z_re)[..., None] * jnp.cos(z_im) - 2 * jnp.sin(z_im / 2) ** 2,
                              mag * jnp.sin(z_im))
        b = em1 / jax.lax.complex(jnp.broadcast_to(a[:, None], w.shape), w) * jax.lax.complex(b_re, b_im)
        phase = z_im
        if self.core == "selective+phase":  # Mamba-3's data-dependent rotation: angle Δ_t·ϑ_t,m, ϑ = π tanh(x W_θ)
            theta = jnp.pi * jnp.tanh(dense("w_theta", m, "modes"))  # [B, T, M], shared by the heads
            phase = z_im + dt[..., None] * theta[:, :, None, :]
        lam = jax.lax.complex(mag * jnp.cos(phase), mag * jnp.sin(phase))
        return lam, b, c

    def erase_strength(self, x):
        """The delta update's β_t = s·σ(x_t·W_β) [B, T, H] float32 (module docstring), or None without one."""
        if not self.delta_scale:
            return None
        w = Dense((self.d_model,), (self.num_heads,), ("embed", "heads"), self.init_std, dtype=self.dtype,
                  param_dtype=self.param_dtype, out_fp32=True, name="w_beta")(x)
        return self.delta_scale * jax.nn.sigmoid(w)

    @property
    def op_core(self) -> str:
        """The operators' core (idattn.ops.interdomain.CORES): "lti", or "selective" for either selective core."""
        return "lti" if self.core == "lti" else "selective"

    @nn.compact
    def __call__(self, x, doc, positions, cache=None, segment_ids=None):
        """x [B, T, d] -> (y [B, T, d], new cache or None).

        doc [B, T] int: the document index of each token (idattn.ops.document_index; None without packing): the
          short convolutions read no token of an earlier document. segment_ids [B, T] (None without packing): the
          operator's resets, the recurrence restarting at each new id. Both describe the same boundaries; the
          convolutions take `doc` (a counter that only increases along a row), the operator the raw ids.
        positions [B, T] int: RoPE's positions (restarting per document when packed).
        cache: None to run a whole sequence (training, scoring); the decoding cache (module docstring) to continue
          one: T = 1 steps the recurrence, T > 1 is a chunk of a prefill from the cached state.
        """
        if self.core not in CORES:
            raise ValueError(f"model.core: got {self.core!r}; expected one of {CORES} (a mixer-name suffix, e.g. "
                             f"interdomain-selective)")
        if self.core != "lti" and self.theory:
            raise ValueError(f"model.core={self.core!r} needs theory=False: the LegS basis of the theory mode has "
                             f"no selective form. Use an S4D cell, e.g. interdomain-selective")
        if self.input not in INPUTS:
            raise ValueError(f"model.input: got {self.input!r}; expected one of {INPUTS}")
        if self.readout not in READOUTS:
            raise ValueError(f"model.readout: got {self.readout!r}; expected one of {READOUTS}")
        if self.delta_scale and (self.readout != "query" or self.theory):
            raise ValueError(f"delta_scale={self.delta_scale} needs the query readout of an S4D cell: the delta "
                             f"update erases on the key state the query reads (readout={self.readout!r}, "
                             f"theory={self.theory})")
        h, dh = self.num_heads, self.head_dim
        bsz, t = x.shape[:2]
        new_cache = {} if cache is not None else None
        if self.theory:
            return self._theory(x, doc, positions, cache, segment_ids)

        # Every per-token tensor is flat, [B, T, H·d_h] (heads in the last axis): the layout the kernels read in
        # place. A [B, T, H, d_h] view would let XLA:TPU lay it out T-minor (d_h = 64 fills half a 128-lane tile)
        # and put a relayout copy on each side of every kernel call (docs/kernels.md, TPU kernels).
        dense = lambda name: self._dense(name, flat=True)(x)  # noqa: E731
        heads = lambda a: a.reshape(bsz, t, h, a.shape[-1] // h)  # noqa: E731  the operators' [B, T, H, N]

        # Readout features f_q [B, T, H·R] (query readout only).
        if self.readout == "query":
            q = self._conv("conv_q", dense("wq"), doc, cache, new_cache)
            if self.use_rope:
                q = rope(q, positions, self.rope_base, num_heads=h)
            fq = xi(q, num_heads=h)

        # SSM inputs k̃ [B, T, H·R], ṽ [B, T, H·d_h].
        norm_kw = dict(eps=self.norm_eps, dtype=self.dtype, param_dtype=self.param_dtype, flat=True)
        if self.input == "dualkv":
            k = self._conv("conv_k", dense("wk"), doc, cache, new_cache)
            if self.use_rope:
                k = rope(k, positions, self.rope_base, num_heads=h)
            zk = HeadNorm(h, dh, name="ssm_norm_k", **norm_kw)(xi(k, num_heads=h))
            zv = HeadNorm(h, dh, name="ssm_norm_v", **norm_kw)(dense("wv"))
        else:
            h1 = self._conv("conv_1", dense("w1"), doc, cache, new_cache)
            if self.use_rope:
                h1 = rope(h1, positions, self.rope_base, num_heads=h)
            h2 = self._conv("conv_2", dense("w2"), doc, cache, new_cache)
            zk = HeadNorm(h, dh, name="ssm_norm_k", **norm_kw)(h1)
            zv = HeadNorm(h, dh, name="ssm_norm_v", **norm_kw)(h2)

        lam, b, c = self.recurrence(x)
        if self.readout == "linear":
            o = self._linear(heads(zk), heads(zv), lam, b, c, cache, new_cache, segment_ids)
            return self._output(x, o.reshape(bsz, t, -1)), new_cache

        fq, zk, zv = heads(fq), heads(zk), heads(zv)
        beta = self.erase_strength(x)  # [B, T, H] or None
        # The delta update has no kernel: "auto" runs the chunked form (the operator refuses "pallas" with beta).
        impl = "chunked" if beta is not None and self.impl == "pallas" else self.impl
        if cache is None:  # a mesh axis that splits the length passes states between shards (ops/sequence.py)
            o = interdomain_mix_sequence(fq, zk, zv, lam, b, c, conj=self.conj, impl=impl,
                                         chunk_size=self.chunk_size, segment_ids=segment_ids, out_dtype=self.dtype,
                                         core=self.op_core, beta=beta)
        elif t == 1:
            lam_t, b_t = (lam, b) if self.op_core == "lti" else (lam[:, 0], b[:, 0])  # this token's [B, H, M]
            o_t, (xk, xv) = interdomain_step((cache["xk"], cache["xv"]), fq[:, 0], zk[:, 0], zv[:, 0], lam_t, b_t, c,
                                             conj=self.conj, beta=None if beta is None else beta[:, 0])
            o = o_t[:, None].astype(self.dtype)
            new_cache["xk"], new_cache["xv"] = xk, xv
        else:  # a prefill chunk; split over the sequence axis when a mesh in context splits its length
            o, (xk, xv) = interdomain_mix_sequence(fq, zk, zv, lam, b, c, conj=self.conj, impl=impl,
                                                   chunk_size=self.chunk_size,
                                                   initial_state=(cache["xk"], cache["xv"]), return_state=True,
                                                   out_dtype=self.dtype, core=self.op_core, beta=beta)
            new_cache["xk"], new_cache["xv"] = xk, xv
        return self._output(x, o.reshape(bsz, t, h * dh)), new_cache

    def _linear(self, zk, zv, lam, b, c, cache, new_cache, segment_ids):
        """The linear readout: o = Re(c_hᵀ X_k) + Re(c_hᵀ X_v) with c_h = (1/M) 1ᵀ C_h (module docstring)."""

        r = zk.shape[-1]
        # [H, M]: mean_m (C_h X)[m, :] = ((1/M) 1ᵀ C_h) X. The mean by default, not the sum: the output scale and
        # the step size of c_h (Adam moves a whole column of C_h together) then do not grow with M (docs/model.md).
        # The paper does not say; `linear_contraction="sum"` gives c_h = 1ᵀ C_h.
        cvec = jnp.mean(c, axis=1) if self.linear_contraction == "mean" else jnp.sum(c, axis=1)
        z = jnp.concatenate([zk, zv], axis=-1)  # [B, T, H, R + d_h]
        # The chunked path is a convolution (no kernel needed): every other impl name maps to it.
        impl = "sequential" if self.impl == "sequential" else "chunked"
        if cache is None:
            y = s4d_linear_mix_sequence(z, lam, b, cvec, impl=impl, chunk_size=self.chunk_size,
                                        segment_ids=segment_ids, out_dtype=jnp.float32, core=self.op_core)
        else:
            x0 = jnp.concatenate([cache["xk"], cache["xv"]], axis=-1)
            if z.shape[1] == 1:
                lam_t, b_t = (lam, b) if self.op_core == "lti" else (lam[:, 0], b[:, 0])  # this token's [B, H, M]
                y, xt = s4d_linear_step(x0, z[:, 0].astype(jnp.float32), lam_t, b_t, cvec)
                y = y[:, None]
            else:
                y, xt = s4d_linear_mix_sequence(z, lam, b, cvec, impl=impl, chunk_size=self.chunk_size,
                                                initial_state=x0, return_state=True, out_dtype=jnp.float32,
                                                core=self.op_core)
            new_cache["xk"], new_cache["xv"] = xt[..., :r].astype(jnp.complex64), xt[..., r:].astype(jnp.complex64)
        return (y[..., :r] + y[..., r:]).astype(self.dtype)

    def _output(self, x, o):
        """o [B, T, H·d_h] (flat) -> [B, T, d]: gate, C_out (linear readout), W_O."""
        h, dh, d = self.num_heads, self.head_dim, self.d_model
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, flat=True)
        if self.output_gate:
            g = self._dense("wg", flat=True)(x)
            o = (jax.nn.sigmoid(g.astype(jnp.float32)) * o.astype(jnp.float32)).astype(self.dtype)
        if self.readout == "linear":
            o = Dense((h, dh), (h, dh), ("heads", "kv", None, None), 1.0 / np.sqrt(h * dh), name="c_out", **kw)(o)
        return Dense((h, dh), (d,), ("heads", "kv", "embed"), self.out_std, name="wo", **kw)(o)

    def _theory(self, x, doc, positions, cache, segment_ids):
        if cache is not None:
            raise NotImplementedError(
                "model.theory=True: the LegS basis is time-varying and has no step API; decoding supports the "
                "S4D mixers only (set model.theory=False)")
        if self.input != "dualkv" or self.readout != "query":
            raise ValueError(f"model.theory=True needs input='dualkv' and readout='query' (got input="
                             f"{self.input!r}, readout={self.readout!r}); the theory mode is the paper's ideal "
                             "derivation of the full layer only")

        if sequence_partition(x.shape[0], self.num_heads, x.shape[1]) is not None:
            raise ValueError("model.theory=True under a sequence-split mesh: the LegS basis is time-varying, so "
                             "shards cannot pass one state; set config.mesh.sequence=1 for the theory mode")
        q = self._conv("conv_q", self._dense("wq")(x), doc, None, None)
        k = self._conv("conv_k", self._dense("wk")(x), doc, None, None)
        if self.use_rope:
            q, k = rope(q, positions, self.rope_base), rope(k, positions, self.rope_base)
        v = self._dense("wv")(x)
        pos = lambda a: (jax.nn.elu(a.astype(jnp.float32)) + 1.0)  # noqa: E731  positive feature map
        o = legs_interdomain(pos(q), pos(k), v.astype(jnp.float32), self.num_modes, denominator=True,
                             segment_ids=segment_ids)
        return self._output(x, o.astype(self.dtype).reshape(*o.shape[:2], -1)), None
