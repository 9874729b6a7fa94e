"""idattn's models in plain PyTorch, for Hugging Face transformers (`trust_remote_code=True`).

Every export folder carries this file; config.json's `auto_map` points AutoModelForCausalLM at
`IdattnForCausalLM`. It imports only torch and transformers, and it computes in float32 (complex64 for the S4D
state) whatever dtype the model was trained in.

Decoder (Llama-style, untied head, no biases):
    x_0 = E[ids];  per layer:  x <- x + mixer(RMSNorm(x));  x <- x + W_down(SiLU(x W_gate) ⊙ x W_up)(RMSNorm(x))
    logits = RMSNorm(x) · W_head                         RMSNorm(x) = x / sqrt(mean(x²) + eps) · scale
Layer i has mixer pattern[i mod P] (`layer_pattern`; empty: every layer is `mixer`).

Interdomain mixer (H heads of width d_h, M complex modes per head; every tensor [B, T, H·d_h] unless said):
    dualkv input:   k = SC(x W_K) (RoPE if rope),  k̃ = N+β(ξ(k)),  ṽ = N+β(x W_V)
    generic input:  h1 = SC(x W_1) (RoPE if rope), h2 = SC(x W_2),  k̃ = N+β(h1),  ṽ = N+β(h2)
    query readout:  f = ξ(SC(x W_Q)) (RoPE before ξ if rope)
    state:          Xk_t = λ_t ⊙ Xk_{t−1} + b_t ⊗ k̃_t,   Xv_t = λ_t ⊙ Xv_{t−1} + b_t ⊗ ṽ_t     ∈ C^{M×d_h} per head
    query readout:  o_t = Re( conj(p_t)ᵀ Γ_t ),  p_t = (C Xk_t) f_t,  Γ_t = C Xv_t    (conj=False: without conj)
    linear readout: y_t = Re( cᵀ [Xk_t | Xv_t] ),  c = mean_m C[m, :] (or the sum),  o_t = y[:d_h] + y[d_h:],
                    then o <- o · C_out ([H·d_h, H·d_h])
    o <- σ(x W_g) ⊙ o (output gate, before C_out);  y = o · W_O
  Delta update (mixer names ending -delta, s = 1, or -delta2, s = 2; query readout): before the write the key state
    forgets along the new key, Xk_t = (λ_t ⊙ Xk_{t−1})(I − β_t k̂_t k̂_tᵀ) + b_t ⊗ k̃_t with k̂ = k̃/‖k̃‖ (a zero key,
    ‖k̃‖² ≤ √tiny of float32, erases nothing) and β_t = s·σ(x W_β) [B, T, H]; Xv as above. These layers run the
    recurrence token by token in prompts too (exact; O(T) small steps, no chunk form here).
  SC is the causal depthwise convolution of width K (y_t = Σ_{j<K} w[K−1−j] x_{t−j}); ξ(u) = SiLU(u)/‖SiLU(u)‖ per
  head; N+β the per-head RMSNorm with scale and bias; RoPE the rotate-half form per head.
  LTI core:  Δ = exp(log_dt) [H];  z = max(−exp(log_a_re)·Δ, −κ) + i·a_im·Δ;  λ = e^z;  b = (λ − 1)/z · Δ · B.
  Selective core:  Δ_t = softplus(x W_Δ + β_Δ) [B, T, H];  a = −exp(log_a_re) [H];  ω = a_im [H, M];
    b_t = (e^{Δ_t(a + iω)} − 1)/(a + iω) · B;  λ_t = e^{Δ_t a} e^{i(Δ_t ω + Δ_t ϑ_t)} with ϑ_t = π tanh(x W_θ) [B, T, M]
    for selective+phase (else ϑ = 0).
Attention layers (softmax: global; swa: the last `window` positions): q, k, v = x W_{Q,K,V} with RoPE on q, k;
    o = softmax(q kᵀ/√d_h + mask) v;  y = o W_O.

Prompts run the operator chunk by chunk (`chunk_size` tokens, at most 64; exact): with ℓ_t = log λ_t (principal branch; for the
LTI core a constant) and the in-chunk cumulative sum L_i = Σ_{s≤i} ℓ_s,
    A[i, j] = e^{L_i − L_j} b_j  (j ≤ i, else 0)           Re(L_i − L_j) ≤ 0: nothing overflows
    Xk_i    = Σ_j A[i, j] ⊗ k̃_j + e^{L_i} Xk0                (the same for Xv; the chunk's last row is the new state)
so p = (Σ_j A[i, j] (f_i·k̃_j) + e^{L_i}(Xk0 f_i)) and, with K = C^H C (conj) or Cᵀ C and w_i = conj(p_i) K,
    o_i = Σ_j Re(w_i · A[i, j]) ṽ_j + Re(w_i e^{L_i} · Xv0).
Decoding (one token) runs the recurrence itself. The cache (`IdattnCache`) holds per layer the last K−1 inputs of
each short convolution and the two complex states ([B, H, M, d_h] each): its size does not depend on the context.
A hybrid's global attention layers keep every key and value; its window layers the last `window − 1`.

Padding (attention_mask): a padded position feeds zeros to the convolutions and to the state and is never a key, so
left- and right-padded rows give the logits of the unpadded row; positions count the real tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_idattn import IdattnConfig

_ALIASES = {"interdomain": ("dualkv", "query", True), "s4d_only": ("generic", "linear", False)}
_CORES = ("selective", "selective+phase")
_DELTA = {"delta": 1.0, "delta2": 2.0}  # the delta update's suffix -> its scale s
_ATTENTION = ("softmax", "swa")


def split_delta(name: str) -> tuple[str, float]:
    """Mixer name -> (the name without its delta suffix, the delta update's scale s; 0 without one)."""
    base, _, last = str(name).rpartition("-")
    return (base, _DELTA[last]) if base and last in _DELTA else (str(name), 0.0)


def parse_mixer(name: str) -> tuple[str, Optional[str], Optional[str], bool, str]:
    """Mixer name -> (family, input, readout, rope, core); family is softmax, swa or interdomain (the delta suffix:
    `split_delta`)."""
    name = split_delta(name)[0]
    base, _, last = str(name).rpartition("-")
    core = last if base and last in _CORES else "lti"
    if core != "lti":
        name = base
    if name in _ATTENTION:
        return name, None, None, True, core
    if name in _ALIASES:
        return ("interdomain", *_ALIASES[name], core)
    parts = str(name).split("-")
    if (len(parts) == 3 and parts[0] in ("dualkv", "generic") and parts[1] in ("query", "linear")
            and parts[2] in ("rope", "norope")):
        return "interdomain", parts[0], parts[1], parts[2] == "rope", core
    raise ValueError(f"idattn.mixer: got {name!r}; expected softmax, swa, interdomain, s4d_only or a cube cell "
                     "<dualkv|generic>-<query|linear>-<rope|norope> (optionally -selective / -selective+phase, then "
                     "-delta / -delta2 on a query readout); "
                     "fix config.json's idattn.mixer or idattn.layer_pattern")


def layer_mixers(spec: dict) -> list[str]:
    """The mixer name of every layer: layer i has pattern[i mod P] (pattern empty: `mixer`)."""
    pattern = spec.get("layer_pattern") or ()
    if isinstance(pattern, str):
        pattern = [p.strip() for p in pattern.split(",") if p.strip()]
    n = int(spec["num_layers"])
    return [pattern[i % len(pattern)] for i in range(n)] if pattern else [spec["mixer"]] * n


class _Params(nn.Module):
    """A named group of parameters (e.g. `kernel`, or `scale` and `bias`), in idattn's own [in, out] layout."""

    def __init__(self, **shapes):
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.zeros(*shape)))


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) · scale over the last axis."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * scale


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half RoPE of x [B, T, H, D] at positions pos [B, T]: pairs (i, i + D/2) turned by pos·base^(−2i/D)."""
    d = x.shape[-1]
    inv = base ** (-(torch.arange(0, d // 2, dtype=torch.float32, device=x.device) * 2.0 / d))
    ang = pos.to(torch.float32)[..., None] * inv  # [B, T, D/2]
    cos, sin = torch.cos(ang)[:, :, None, :], torch.sin(ang)[:, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def xi(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """ξ(x) = SiLU(x) / ‖SiLU(x)‖₂ over the last axis (x [..., H, D]: per head)."""
    s = F.silu(x)
    return s * torch.rsqrt((s * s).sum(-1, keepdim=True) + eps)


def chunk_mix(lam, b, zk, zv, fq, kmat, xk0, xv0, conj: bool):
    """The query readout over one chunk (module docstring). lam, b [B, l, H, M] complex; zk, fq [B, l, H, R];
    zv [B, l, H, D]; kmat [H, M, M] (C^H C or Cᵀ C); xk0 [B, H, M, R], xv0 [B, H, M, D] complex.
    Returns (o [B, l, H, D], xk1, xv1)."""
    a, dec = _decay_table(lam, b)                                        # [B, i, j, H, M], e^{L_i} [B, l, H, M]
    g = torch.einsum("bihr,bjhr->bijh", fq, zk).to(a.dtype)              # f_i · k̃_j
    p = torch.einsum("bijhm,bijh->bihm", a, g) + dec * torch.einsum("bhmr,bihr->bihm", xk0, fq.to(a.dtype))
    w = torch.einsum("bihm,hmn->bihn", p.conj() if conj else p, kmat)
    s = torch.einsum("bihm,bijhm->bijh", w, a).real
    o = torch.einsum("bijh,bjhd->bihd", s, zv) + torch.einsum("bihm,bhmd->bihd", w * dec, xv0).real
    xk1, xv1 = _carry(a, dec, zk, xk0), _carry(a, dec, zv, xv0)
    return o, xk1, xv1


def chunk_linear(lam, b, z, cvec, x0):
    """The linear readout over one chunk: y_i = Re(cᵀ X_i). lam, b [B, l, H, M]; z [B, l, H, W]; cvec [H, M];
    x0 [B, H, M, W]. Returns (y [B, l, H, W], x1)."""
    a, dec = _decay_table(lam, b)
    t = torch.einsum("hm,bijhm->bijh", cvec, a).real
    y = torch.einsum("bijh,bjhw->bihw", t, z) + torch.einsum("bihm,bhmw->bihw", cvec * dec, x0).real
    return y, _carry(a, dec, z, x0)


def _decay_table(lam, b):
    """A[b, i, j, h, m] = e^{L_i − L_j} b_j (j ≤ i, else 0) and e^{L_i}, with L the in-chunk cumsum of log λ."""
    cum = torch.cumsum(torch.log(lam), dim=1)                            # [B, l, H, M]
    n = lam.shape[1]
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=lam.device))[None, :, :, None, None]
    diff = cum[:, :, None] - cum[:, None, :]                             # L_i − L_j
    # masked to 0 before exp: above the diagonal L_i − L_j has a positive real part that may overflow
    dec_ij = torch.where(causal, torch.exp(torch.where(causal, diff, torch.zeros_like(diff))),
                         torch.zeros_like(diff))
    return dec_ij * b[:, None], torch.exp(cum)


def _carry(a, dec, z, x0):
    """The state after the chunk's last token: e^{L_last} X0 + Σ_j A[last, j] ⊗ z_j."""
    return dec[:, -1, :, :, None] * x0 + torch.einsum("bjhm,bjhw->bhmw", a[:, -1], z.to(a.dtype))


class InterdomainMixer(nn.Module):
    """One Interdomain (or S4D-only / cube cell / selective) mixer; parameters as idattn names them."""

    def __init__(self, spec: dict, name: str):
        super().__init__()
        family, inp, readout, use_rope, core = parse_mixer(name)
        self.input, self.readout, self.use_rope, self.core = inp, readout, use_rope, core
        self.delta_scale = split_delta(name)[1]
        d, h, dh, m = int(spec["d_model"]), int(spec["num_heads"]), int(spec["head_dim"]), int(spec["num_modes"])
        k = int(spec.get("short_conv", 4))
        self.d, self.h, self.dh, self.m, self.k = d, h, dh, m, k
        self.conj = bool(spec.get("conj", True))
        self.eps = float(spec.get("norm_eps", 1e-5))
        self.kappa = float(spec.get("kappa", 0.25))
        self.rope_base = float(spec.get("rope_base", 10000.0))
        self.chunk = max(1, min(int(spec.get("chunk_size", 64)), 64))
        self.contraction = spec.get("linear_contraction", "mean")
        self.output_gate = bool(spec.get("output_gate", False))
        proj = ["wq"] if readout == "query" else []
        proj += ["wk", "wv"] if inp == "dualkv" else ["w1", "w2"]
        for n in proj:
            setattr(self, n, _Params(kernel=(d, h, dh)))
        self.convs = (["conv_q"] if readout == "query" else []) + (["conv_k"] if inp == "dualkv" else
                                                                    ["conv_1", "conv_2"])
        for n in self.convs:
            setattr(self, n, _Params(kernel=(k, h, dh)))
        self.ssm_norm_k = _Params(scale=(h, dh), bias=(h, dh))
        self.ssm_norm_v = _Params(scale=(h, dh), bias=(h, dh))
        if core == "lti":
            self.ssm_log_dt = nn.Parameter(torch.zeros(h))
            self.ssm_log_a_re = nn.Parameter(torch.zeros(h, m))
        else:
            self.ssm_dt_bias = nn.Parameter(torch.zeros(h))
            self.ssm_log_a_re = nn.Parameter(torch.zeros(h))
            self.w_dt = _Params(kernel=(d, h))
            if core == "selective+phase":
                self.w_theta = _Params(kernel=(d, m))
        self.ssm_a_im = nn.Parameter(torch.zeros(h, m))
        self.ssm_b_re = nn.Parameter(torch.zeros(h, m))
        self.ssm_b_im = nn.Parameter(torch.zeros(h, m))
        self.ssm_c_re = nn.Parameter(torch.zeros(h, m, m))
        self.ssm_c_im = nn.Parameter(torch.zeros(h, m, m))
        if self.output_gate:
            self.wg = _Params(kernel=(d, h, dh))
        if self.delta_scale:
            self.w_beta = _Params(kernel=(d, h))
        if readout == "linear":
            self.c_out = _Params(kernel=(h, dh, h, dh))
        self.wo = _Params(kernel=(h, dh, d))

    def _dense(self, name, x):
        return x @ getattr(self, name).kernel.reshape(self.d, -1)  # [B, T, H·d_h]

    def _conv(self, name, u, valid, state, new_state):
        """Causal depthwise convolution of u [B, T, C]; padded positions enter as zeros."""
        kern = getattr(self, name).kernel.reshape(self.k, -1)
        u = u * valid[..., None]
        prev = state[name] if state is not None else u.new_zeros(u.shape[0], self.k - 1, u.shape[-1])
        ext = torch.cat([prev, u], dim=1)                                # [B, K−1+T, C]
        t = u.shape[1]
        y = sum(kern[self.k - 1 - j] * ext[:, self.k - 1 - j: self.k - 1 - j + t] for j in range(self.k))
        new_state[name] = ext[:, t:]
        return y

    def _heads(self, u):
        return u.reshape(*u.shape[:2], self.h, -1)

    def _head_norm(self, params, u):
        """N+β: per-head RMSNorm with scale and bias, u [B, T, H, D]."""
        return u * torch.rsqrt((u * u).mean(-1, keepdim=True) + self.eps) * params.scale + params.bias

    def _lti(self):
        """(λ, b) [H, M] complex64: ZOH with the decay bound Re(Δ·A) ≥ −κ."""
        dt = torch.exp(self.ssm_log_dt)[:, None]
        z = torch.complex(torch.clamp(-torch.exp(self.ssm_log_a_re) * dt, min=-self.kappa), self.ssm_a_im * dt)
        lam = torch.exp(z)
        return lam, (lam - 1) / z * dt * torch.complex(self.ssm_b_re, self.ssm_b_im)

    def _selective(self, x):
        """(λ_t, b_t) [B, T, H, M] complex64 from the mixer input x [B, T, d] (module docstring)."""
        dt = F.softplus(x @ self.w_dt.kernel + self.ssm_dt_bias)        # [B, T, H]
        a = -torch.exp(self.ssm_log_a_re)                                # [H]
        w = self.ssm_a_im                                                # [H, M]
        z_re, z_im = dt * a, dt[..., None] * w
        mag = torch.exp(z_re)[..., None]
        # e^z − 1 = expm1(Re z)·cos(Im z) − 2 sin²(Im z / 2) + i e^{Re z} sin(Im z): exact at small Δ|A|
        em1 = torch.complex(torch.expm1(z_re)[..., None] * torch.cos(z_im) - 2 * torch.sin(z_im / 2) ** 2,
                            mag * torch.sin(z_im))
        b = em1 / torch.complex(a[:, None].expand_as(w), w) * torch.complex(self.ssm_b_re, self.ssm_b_im)
        phase = z_im
        if self.core == "selective+phase":
            theta = math.pi * torch.tanh(x @ self.w_theta.kernel)          # [B, T, M]
            phase = z_im + dt[..., None] * theta[:, :, None, :]
        return torch.complex(mag * torch.cos(phase), mag * torch.sin(phase)), b

    def forward(self, x, valid, pos, state):
        """x [B, T, d], valid [B, T] float (1 real token, 0 padding), pos [B, T]; state: the layer's cache or None.
        Returns (y [B, T, d], new state)."""
        bsz, t = x.shape[:2]
        new = {}
        rot = (lambda u: rope(u, pos, self.rope_base)) if self.use_rope else (lambda u: u)
        if self.readout == "query":
            fq = xi(rot(self._heads(self._conv("conv_q", self._dense("wq", x), valid, state, new))))
        if self.input == "dualkv":
            k = rot(self._heads(self._conv("conv_k", self._dense("wk", x), valid, state, new)))
            zk = self._head_norm(self.ssm_norm_k, xi(k))
            zv = self._head_norm(self.ssm_norm_v, self._heads(self._dense("wv", x)))
        else:
            h1 = rot(self._heads(self._conv("conv_1", self._dense("w1", x), valid, state, new)))
            h2 = self._heads(self._conv("conv_2", self._dense("w2", x), valid, state, new))
            zk, zv = self._head_norm(self.ssm_norm_k, h1), self._head_norm(self.ssm_norm_v, h2)
        # a padded position adds nothing to the state (its λ then acts on a zero state: left padding is exact)
        zk, zv = zk * valid[..., None, None], zv * valid[..., None, None]
        if self.core == "lti":
            lam, b = self._lti()
            lam, b = lam.expand(bsz, t, -1, -1), b.expand(bsz, t, -1, -1)
        else:
            lam, b = self._selective(x)
        c = torch.complex(self.ssm_c_re, self.ssm_c_im)                  # [H, M, M]
        if state is None:
            xk = torch.zeros(bsz, self.h, self.m, self.dh, dtype=torch.complex64, device=x.device)
            xv = torch.zeros_like(xk)
        else:
            xk, xv = state["xk"], state["xv"]
        if self.delta_scale:
            beta = self.delta_scale * torch.sigmoid(x @ self.w_beta.kernel)  # [B, T, H]
            o, xk, xv = self._query_delta(lam, b, zk, zv, fq, c, xk, xv, beta)
        elif self.readout == "query":
            o, xk, xv = self._query(lam, b, zk, zv, fq, c, xk, xv)
        else:
            o, xk, xv = self._linear(lam, b, zk, zv, c, xk, xv)
        new["xk"], new["xv"] = xk, xv
        o = o.reshape(bsz, t, -1)
        if self.output_gate:
            o = torch.sigmoid(self._dense("wg", x)) * o
        if self.readout == "linear":
            o = o @ self.c_out.kernel.reshape(self.h * self.dh, self.h * self.dh)
        return o @ self.wo.kernel.reshape(self.h * self.dh, self.d), new

    def _query(self, lam, b, zk, zv, fq, c, xk, xv):
        if zk.shape[1] == 1:  # decoding: the recurrence, C applied literally
            xk = lam[:, 0, ..., None] * xk + b[:, 0, ..., None] * zk[:, 0, :, None, :].to(xk.dtype)
            xv = lam[:, 0, ..., None] * xv + b[:, 0, ..., None] * zv[:, 0, :, None, :].to(xv.dtype)
            u, gam = c @ xk, c @ xv                                      # C·Xk, C·Xv [B, H, M, D]
            p = torch.einsum("bhmr,bhr->bhm", u, fq[:, 0].to(u.dtype))
            p = p.conj() if self.conj else p
            return torch.einsum("bhm,bhmd->bhd", p, gam).real[:, None], xk, xv
        kmat = c.conj().transpose(-1, -2) @ c if self.conj else c.transpose(-1, -2) @ c
        outs = []
        for s in range(0, zk.shape[1], self.chunk):
            sl = slice(s, s + self.chunk)
            o, xk, xv = chunk_mix(lam[:, sl], b[:, sl], zk[:, sl], zv[:, sl], fq[:, sl], kmat, xk, xv, self.conj)
            outs.append(o)
        return torch.cat(outs, dim=1), xk, xv

    def _query_delta(self, lam, b, zk, zv, fq, c, xk, xv, beta):
        """The delta update's recurrence token by token (module docstring), read out as the query readout decodes."""
        tiny = math.sqrt(torch.finfo(torch.float32).tiny)
        outs = []
        for s in range(zk.shape[1]):
            n2 = (zk[:, s] * zk[:, s]).sum(-1, keepdim=True)                # [B, H, 1]
            kh = torch.where(n2 > tiny, zk[:, s] * torch.rsqrt(torch.where(n2 > tiny, n2, torch.ones_like(n2))),
                             torch.zeros_like(zk[:, s])).to(xk.dtype)      # k̂ [B, H, R]
            xk = lam[:, s, ..., None] * xk
            proj = torch.einsum("bhmr,bhr->bhm", xk, kh)                    # (λ ⊙ Xk) k̂
            xk = xk - (beta[:, s, :, None].to(xk.dtype) * proj)[..., None] * kh[:, :, None, :]
            xk = xk + b[:, s, ..., None] * zk[:, s, :, None, :].to(xk.dtype)
            xv = lam[:, s, ..., None] * xv + b[:, s, ..., None] * zv[:, s, :, None, :].to(xv.dtype)
            p = torch.einsum("bhmr,bhr->bhm", c @ xk, fq[:, s].to(xk.dtype))
            p = p.conj() if self.conj else p
            outs.append(torch.einsum("bhm,bhmd->bhd", p, c @ xv).real)
        return torch.stack(outs, dim=1), xk, xv

    def _linear(self, lam, b, zk, zv, c, xk, xv):
        cvec = c.mean(dim=1) if self.contraction == "mean" else c.sum(dim=1)  # [H, M]
        z = torch.cat([zk, zv], dim=-1)                                  # [B, T, H, 2·d_h]
        x = torch.cat([xk, xv], dim=-1)
        if z.shape[1] == 1:  # decoding: the recurrence
            x = lam[:, 0, ..., None] * x + b[:, 0, ..., None] * z[:, 0, :, None, :].to(x.dtype)
            y = torch.einsum("hm,bhmw->bhw", cvec, x).real[:, None]
        else:
            ys = []
            for s in range(0, z.shape[1], self.chunk):
                sl = slice(s, s + self.chunk)
                y, x = chunk_linear(lam[:, sl], b[:, sl], z[:, sl], cvec, x)
                ys.append(y)
            y = torch.cat(ys, dim=1)
        return y[..., : self.dh] + y[..., self.dh:], x[..., : self.dh], x[..., self.dh:]


class AttentionMixer(nn.Module):
    """Causal softmax attention with RoPE; `window` > 0: the last `window` positions only (the swa mixer)."""

    def __init__(self, spec: dict, window: int):
        super().__init__()
        d, h, dh = int(spec["d_model"]), int(spec["num_heads"]), int(spec["head_dim"])
        self.d, self.h, self.dh, self.window = d, h, dh, int(window)
        self.rope_base = float(spec.get("rope_base", 10000.0))
        for n in ("wq", "wk", "wv"):
            setattr(self, n, _Params(kernel=(d, h, dh)))
        self.wo = _Params(kernel=(h, dh, d))

    def forward(self, x, valid, pos, state):
        """As InterdomainMixer.forward; the state holds the keys and values (all of them, or the last W − 1)."""
        bsz, t = x.shape[:2]
        proj = lambda n: (x @ getattr(self, n).kernel.reshape(self.d, -1)).reshape(bsz, t, self.h, self.dh)  # noqa
        q, k, v = rope(proj("wq"), pos, self.rope_base), rope(proj("wk"), pos, self.rope_base), proj("wv")
        vb = valid.bool()
        own = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))[None] & vb[:, None, :]
        if state is not None:
            k, v = torch.cat([state["k"], k], 1), torch.cat([state["v"], v], 1)
            kpos, kvalid = torch.cat([state["pos"], pos], 1), torch.cat([state["valid"], vb], 1)
            mask = torch.cat([state["valid"][:, None, :].expand(-1, t, -1), own], dim=2)  # [B, T, S + T]
        else:
            kpos, kvalid, mask = pos, vb, own
        if self.window > 0:
            mask = mask & (pos[:, :, None] - kpos[:, None, :] < self.window)
        # a padded query sees itself only (its output is never used; this keeps its softmax finite)
        mask = mask | torch.cat([torch.zeros(bsz, t, k.shape[1] - t, dtype=torch.bool, device=x.device),
                                 torch.eye(t, dtype=torch.bool, device=x.device)[None].expand(bsz, -1, -1)], 2)
        s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(self.dh)
        s = s.masked_fill(~mask[:, None], float("-inf"))
        o = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v)
        keep = k.shape[1] if self.window <= 0 else self.window - 1  # a window layer needs the last W − 1 keys
        new = {"k": k[:, k.shape[1] - keep:], "v": v[:, k.shape[1] - keep:], "pos": kpos[:, k.shape[1] - keep:],
               "valid": kvalid[:, k.shape[1] - keep:]}
        return o.reshape(bsz, t, -1) @ self.wo.kernel.reshape(self.h * self.dh, self.d), new


class Block(nn.Module):
    """x <- x + mixer(RMSNorm(x)); x <- x + SwiGLU(RMSNorm(x))."""

    def __init__(self, spec: dict, mixer: str):
        super().__init__()
        d, f = int(spec["d_model"]), int(spec["ffn_dim"])
        self.eps = float(spec.get("norm_eps", 1e-5))
        family = parse_mixer(mixer)[0]
        if family == "interdomain":
            self.mixer = InterdomainMixer(spec, mixer)
        else:
            self.mixer = AttentionMixer(spec, int(spec.get("window", 0)) if family == "swa" else 0)
        self.attn_norm, self.mlp_norm = _Params(scale=(d,)), _Params(scale=(d,))
        self.mlp = nn.Module()
        self.mlp.w_gate, self.mlp.w_up, self.mlp.w_down = _Params(kernel=(d, f)), _Params(kernel=(d, f)), \
            _Params(kernel=(f, d))

    def forward(self, x, valid, pos, state):
        y, new = self.mixer(rms_norm(x, self.attn_norm.scale, self.eps), valid, pos, state)
        x = x + y
        h = rms_norm(x, self.mlp_norm.scale, self.eps)
        return x + (F.silu(h @ self.mlp.w_gate.kernel) * (h @ self.mlp.w_up.kernel)) @ self.mlp.w_down.kernel, new


class IdattnCache:
    """The decoding cache: per layer a dict of tensors (recurrent: `conv_*` [B, K−1, H·d_h] and the complex states
    `xk`, `xv` [B, H, M, d_h]; attention: `k`, `v`, `pos`, `valid`), `seen` (time steps consumed, padding
    included) and `positions` [B] (real tokens per row). A recurrent layer's entry has the same size at every
    context length."""

    is_compileable = False

    def __init__(self, layers: list, seen: int, positions: torch.Tensor):
        self.layers, self.seen, self.positions = layers, seen, positions

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def reorder_cache(self, beam_idx: torch.LongTensor) -> "IdattnCache":
        """Rows picked by beam_idx (beam search)."""
        self.layers = [{k: v.index_select(0, beam_idx.to(v.device)) for k, v in lay.items()} for lay in self.layers]
        self.positions = self.positions.index_select(0, beam_idx.to(self.positions.device))
        return self

    def state_numel(self, layer_idx: int) -> int:
        """Elements (complex counted once) held for layer `layer_idx`."""
        return sum(v.numel() for v in self.layers[layer_idx].values())


@dataclass
class IdattnCausalLMOutput(ModelOutput):
    loss: Optional[torch.FloatTensor] = None
    logits: Optional[torch.FloatTensor] = None
    cache: Optional[Any] = None
    past_key_values: Optional[Any] = None  # the same cache, under the name older transformers read


class IdattnPreTrainedModel(PreTrainedModel):
    config_class = IdattnConfig
    base_model_prefix = "idattn"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = False

    def _init_weights(self, module):
        """Initialisation for parameters a checkpoint lacks (normal(init_std) matrices, unit norms, identity C;
        the S4D values of idattn's own init live in idattn, this is only a valid starting point)."""
        std = float(self.config.idattn.get("init_std", 0.02))
        for name, p in module.named_parameters(recurse=False):
            if getattr(p, "_is_hf_initialized", False):
                continue
            with torch.no_grad():
                if name == "scale":
                    p.fill_(1.0)
                elif name in ("kernel", "embedding"):
                    p.normal_(0.0, std)
                elif name == "ssm_c_re":
                    p.copy_(torch.eye(p.shape[-1]).expand_as(p))
                elif name in ("ssm_b_re",):
                    p.fill_(1.0)
                elif name in ("ssm_log_a_re",):
                    p.fill_(math.log(0.5))
                elif name == "ssm_log_dt":
                    p.fill_(math.log(0.01))
                elif name == "ssm_dt_bias":
                    p.fill_(math.log(math.expm1(0.01)))
                else:
                    p.zero_()


class IdattnForCausalLM(IdattnPreTrainedModel, GenerationMixin):
    """The decoder with its head: forward(input_ids [B, T], attention_mask [B, T_total] (optional), cache) ->
    logits [B, T, V] float32 (and the cache when use_cache)."""

    def __init__(self, config: IdattnConfig):
        super().__init__(config)
        spec = config.idattn
        if spec.get("theory"):
            raise ValueError("idattn.theory=True: the LegS theory mode has no PyTorch form; export an S4D model "
                             "(theory=False)")
        v, d = int(spec["vocab_size"]), int(spec["d_model"])
        self.eps = float(spec.get("norm_eps", 1e-5))
        self.embedding = nn.Parameter(torch.zeros(v, d))
        self.layers = nn.ModuleList([Block(spec, name) for name in layer_mixers(spec)])
        self.final_norm = _Params(scale=(d,))
        self.lm_head = _Params(kernel=(d, v))
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model keeps its own cache (fixed-size states), created by forward

    def prepare_inputs_for_generation(self, input_ids, cache=None, past_key_values=None, attention_mask=None,
                                      use_cache=True, **kwargs):
        """Only the tokens the cache has not consumed; the full attention mask (its last columns are theirs)."""
        cache = cache if cache is not None else past_key_values
        if cache is not None:
            input_ids = input_ids[:, cache.seen:]
        return {"input_ids": input_ids, "cache": cache, "attention_mask": attention_mask, "use_cache": use_cache}

    def forward(self, input_ids=None, attention_mask=None, cache=None, past_key_values=None, use_cache=None,
                labels=None, return_dict=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        if input_ids is None:
            raise ValueError("IdattnForCausalLM.forward: input_ids is None; pass token ids [B, T] (inputs_embeds "
                             "is not supported)")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        bsz, t = input_ids.shape
        dev = input_ids.device
        valid = (torch.ones(bsz, t, device=dev) if attention_mask is None
                 else attention_mask[:, -t:].to(device=dev, dtype=torch.float32))
        before = cache.positions if cache is not None else torch.zeros(bsz, dtype=torch.long, device=dev)
        pos = (before[:, None] + torch.cumsum(valid.long(), dim=1) - 1).clamp(min=0)
        x = self.embedding[input_ids].to(torch.float32)
        states = cache.layers if cache is not None else [None] * len(self.layers)
        new = []
        for layer, st in zip(self.layers, states):
            x, ns = layer(x, valid, pos, st)
            new.append(ns)
        logits = rms_norm(x, self.final_norm.scale, self.eps) @ self.lm_head.kernel
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        out_cache = None
        if use_cache:
            out_cache = IdattnCache(new, (cache.seen if cache is not None else 0) + t,
                                    before + valid.long().sum(dim=1))
        return IdattnCausalLMOutput(loss=loss, logits=logits, cache=out_cache, past_key_values=out_cache)


__all__ = ["IdattnForCausalLM", "IdattnPreTrainedModel", "IdattnCache", "parse_mixer", "layer_mixers"]
