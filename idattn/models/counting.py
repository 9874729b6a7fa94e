"""Parameter counts, the Table-3 reconciliation, state budget and training FLOPs per token.

Closed forms (V vocab, d model width, L layers, f SwiGLU hidden, H heads, d_h head width, R = d_h, M modes,
K short-conv kernel):

  softmax   = 2·V·d + L·(4·d·H·d_h + 3·d·f + 2d) + d                         (paper Table 3, exact)
  ours (interdomain family) per layer, over the shared 3·d·f + 2d:
      projections  (#matrices)·d·H·d_h   (4 in every cube cell: W_Q or C_out, two input maps, W_O; +1 gate)
      short convs  (#convs)·K·H·d_h      (q and k, or h1 and h2, [+ q])
      N+β          2·H·(R + d_h)         (scale and bias, both halves)
      S4D          H (log Δ) + 2HM (A) + 2HM (B) + 2HM² (C)
      (the linear readout has no parameter besides C_out, which takes W_Q's place)
  paper interdomain = softmax + L·[8d + H(2M² + 2M + 1 + 4d_h) + (R + d_h)]                (Table 3, exact)
  paper cube cells: generic input + L·(4d + H·M), linear readout − L·4d      (App. B.1 range, Table 3 S4D-only)

`differences(spec)` itemises ours − paper; `table3_equivalent = params − Σ differences`.

swa (sliding-window attention) has softmax's parameters. A hybrid stack (model.layer_pattern, P entries repeated
L/P times) counts each layer with its own mixer: mixer terms = Σ_types (layers of that type)·(that mixer's
per-layer count), and the paper's count / the differences likewise per type over the shared 2·V·d + d.
"""
from __future__ import annotations

import collections
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from idattn.models.decoding import cache_bytes
from idattn.models.llama import build_model
from idattn.models.spec import ATTENTION_FAMILIES, ModelSpec, conv_names, layer_specs, spec_from_config


def _mixer_counts(s: ModelSpec) -> dict[str, int]:
    d, h, dh, m = s.d_model, s.num_heads, s.head_dim, s.num_modes
    hd = h * dh
    if s.family in ATTENTION_FAMILIES:
        return {"projections (W_Q, W_K, W_V, W_O)": 4 * d * hd}
    out: dict[str, int] = {}
    n_mat = 3 + int(s.output_gate)  # two input maps + W_O (+ gate)
    n_mat += 1 if s.readout == "query" else 0  # W_Q; the linear readout's C_out is counted below
    out["projections"] = n_mat * d * hd
    if s.readout == "linear":
        out["C_out contraction"] = hd * hd
    convs = conv_names(s) if not s.theory else ("conv_q", "conv_k")
    out["short convolutions"] = len(convs) * s.short_conv * hd
    if not s.theory:
        out["N+beta (scales, biases)"] = 2 * h * (dh + dh)
        if s.core == "lti":
            out["S4D log_dt"] = h
            out["S4D A (re, im)"] = 2 * h * m
        else:  # selective: Δ_t's bias β_Δ per head, Re A tied within a head, the projections W_Δ (and W_θ)
            out["S4D dt bias"] = h
            out["S4D A (re per head, im per mode)"] = h + h * m
            out["selective W_dt"] = d * h
            if s.core == "selective+phase":
                out["selective W_theta"] = d * m
        out["S4D B (re, im)"] = 2 * h * m
        out["S4D C (re, im)"] = 2 * h * m * m
        if s.delta_scale:  # the delta update's erase strength β_t = s·σ(x_t·W_β) (docs/model.md, Delta core)
            out["delta W_beta"] = d * h
    return out


def param_breakdown(model_cfg: Any) -> dict[str, int]:
    """Closed-form parameter count by module (totals over all layers)."""
    s = spec_from_config(model_cfg)
    v, d, n, f = s.vocab_size, s.d_model, s.num_layers, s.ffn_dim
    out = {"embedding": v * d, "lm_head": d * v, "final_norm": d, "block norms": n * 2 * d, "SwiGLU": n * 3 * d * f}
    if s.family == "hybrid":
        for ls, count in layer_types(s):
            for k, c in _mixer_counts(ls).items():
                out[f"mixer {ls.mixer} ({count} layers): {k}"] = count * c
        return out
    for k, c in _mixer_counts(s).items():
        out[f"mixer: {k}"] = n * c
    return out


def layer_types(model_cfg: Any) -> list[tuple[ModelSpec, int]]:
    """[(spec of a layer type, number of layers of that type)] in pattern order; one entry for a homogeneous
    model. The specs carry num_layers of the whole stack (the residual init scale), not the type's count."""
    s = spec_from_config(model_cfg)
    specs = layer_specs(s)
    reps = s.num_layers // len(specs)
    out: dict[str, list] = {}
    for ls in specs:
        out.setdefault(ls.mixer, [ls, 0])[1] += reps
    return [(ls, c) for ls, c in out.values()]


def count_params_closed(model_cfg: Any) -> int:
    return int(sum(param_breakdown(model_cfg).values()))


def _paper_layer_terms(s: ModelSpec) -> dict[str, int]:
    """The paper's per-layer mixer count (Table 3, App. B.1) as named terms, for a recurrent cube cell.

    Interdomain (Table 3, exact at all four sizes): 4d² + 8d + H(2M² + 2M + 1 + 4d_h) + (R + d_h).
    Cube (App. B.1 range [135,379,344, 135,462,288] at 125M, Table 3 S4D-only = Interdomain + H·M):
      generic input [a, b]: + 4d (a third short conv: SC on both halves) + H·M
      linear readout:       − 4d (no q short conv; C_out's d² takes W_Q's d²)
    """
    d, h, dh, m = s.d_model, s.num_heads, s.head_dim, s.num_modes
    r = dh
    n_conv = 2 + (s.input == "generic") - (s.readout == "linear")
    terms = {"projections (4 d×d)": 4 * d * d, "short convolutions (width 4 over d)": n_conv * 4 * d,
             "N+beta": 4 * h * dh, "S4D log_dt": h, "S4D A": 2 * h * m, "S4D C": 2 * h * m * m,
             "unidentified R + d_h": r + dh}
    if s.input == "generic":
        terms["generic-input H·M"] = h * m
    return terms


def paper_count(model_cfg: Any) -> int:
    """The paper's parameter count for this model's sizes: Table 3's formula for softmax and interdomain, and for
    the other cube cells the App. B.1 / Table 3 deltas (generic input +4d + H·M, linear readout −4d per layer)."""
    s = spec_from_config(model_cfg)
    v, d, n, f = s.vocab_size, s.d_model, s.num_layers, s.ffn_dim
    if s.family == "hybrid":  # per layer type, the shared embedding / head / final norm once
        shared = 2 * v * d + d
        return shared + sum(paper_count(ls.replace(num_layers=c)) - shared for ls, c in layer_types(s))
    softmax = 2 * v * d + n * (4 * d * d + 3 * d * f + 2 * d) + d
    if s.family in ATTENTION_FAMILIES:
        return softmax
    return softmax - n * 4 * d * d + n * sum(_paper_layer_terms(s).values())


def differences(model_cfg: Any) -> list[tuple[str, int]]:
    """Itemised differences from the paper's parameterisation: (description, ours − paper), totals over layers.
    `count_params_closed − Σ differences == paper_count` for every cell (checked in tests/test_params.py)."""
    s = spec_from_config(model_cfg)
    if s.family == "hybrid":
        return [(f"[{ls.mixer} layers] {desc}", c) for ls, n_type in layer_types(s)
                for desc, c in differences(ls.replace(num_layers=n_type))]
    if s.family in ATTENTION_FAMILIES:
        return []
    d, n, h, dh, m = s.d_model, s.num_layers, s.num_heads, s.head_dim, s.num_modes
    r = dh
    mc = _mixer_counts(s)
    pt = _paper_layer_terms(s)
    items: list[tuple[str, int]] = []
    if not s.theory:
        items.append(("learned complex B per head and mode (b_re, b_im; 2·H·M per layer): the paper's Interdomain "
                      "count has no B", n * 2 * h * m))
        if s.input == "generic":
            items.append(("the paper's count adds H·M per layer with the generic input [a, b] (Table 3 S4D-only − "
                          "Interdomain; App. B.1's range puts it with the input, not the readout), a term its text "
                          "does not describe; we read it as vanilla S4D's learned input gain B (real, per head and "
                          "mode), which our complex B above already is, in every cell", -n * h * m))
        items.append(("the paper's count has R + d_h more per layer, a term its text does not describe (we read "
                      "it as a layer-wide scale over [k, v]); our N+beta is per head only", -n * (r + dh)))
        if s.core != "lti":  # beyond the paper (docs/model.md, Selective core)
            items.append((f"selective core ({s.core}): Re A tied within a head (H instead of H·M) and the "
                          "projection W_dt (d·H)" + (" and W_theta (d·M)" if s.core == "selective+phase" else ""),
                          n * (h - h * m + d * h + (d * m if s.core == "selective+phase" else 0))))
        if s.delta_scale:  # beyond the paper (docs/model.md, Delta core)
            items.append((f"delta update (s = {s.delta_scale:g}): the erase strength's projection W_beta (d·H)",
                          n * d * h))
    else:
        items.append(("theory mode: fixed LegS basis, no N+beta and no S4D parameters",
                      -n * (h * (2 * m * m + 2 * m + 1 + 4 * dh) + (r + dh))))
    mats = mc["projections"] + mc.get("C_out contraction", 0)
    if mats != pt["projections (4 d×d)"]:
        items.append(("projection matrices: ours " + ("with the output gate W_g" if s.output_gate else
                      "with H·d_h != d_model") + " vs the paper's 4·d² per layer",
                      n * (mats - pt["projections (4 d×d)"])))
    paper_conv = pt["short convolutions (width 4 over d)"]
    if mc["short convolutions"] != paper_conv:
        k = len(conv_names(s)) if not s.theory else 2
        items.append((f"short convolutions: {k} kernels of width {s.short_conv} over H·d_h (paper: "
                      f"{paper_conv // (4 * d)} of width 4 over d)", n * (mc["short convolutions"] - paper_conv)))
    return items


def table3_equivalent(model_cfg: Any) -> int:
    return count_params_closed(model_cfg) - sum(c for _, c in differences(model_cfg))


def count_params(model_cfg: Any) -> int:
    """Number of parameters of the built model, from `jax.eval_shape` (no memory, fast at 1.3B)."""
    model = build_model(model_cfg)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    leaves = jax.tree_util.tree_leaves(nn.meta.unbox(shapes["params"]))
    return int(sum(int(np.prod(x.shape)) for x in leaves))


def state_budget(model_cfg: Any) -> int:
    """Recurrent state per layer in real numbers (complex counted twice, Mamba-3 accounting).

    Interdomain / S4D-only / cube cells: H·2(R + d_h)·M (1.3B: 524,288). Theory mode (real LegS basis with the
    denominator channel): H·M·(R + d_h + 1). Softmax: the KV cache, 2·H·d_h real numbers **per token**; swa the
    same per token, for at most `window` tokens. Hybrid: the fixed state of one of its recurrent layers (the
    largest; 2·H·d_h per token when it has none); `report` and `cache_bytes` give every type.
    """
    s = spec_from_config(model_cfg)
    h, dh, m = s.num_heads, s.head_dim, s.num_modes
    if s.family == "hybrid":
        rec = [state_budget(ls) for ls, _ in layer_types(s) if ls.family not in ATTENTION_FAMILIES]
        return max(rec) if rec else 2 * h * dh
    if s.family in ATTENTION_FAMILIES:
        return 2 * h * dh
    if s.theory:
        return h * m * (dh + dh + 1)
    return h * 2 * (dh + dh) * m


def mixer_macs_per_token_head(model_cfg: Any, seq_len: int) -> float:
    """The operator's cost: L(R+D) + 4M(L+R+D) + 4M² real MACs per token-head (L: chunk length), plus
    3LR + 5LM + 4MR with the delta update; the linear readout (a convolution per chunk plus the carried state):
    L(R+D) + 4M(R+D)."""
    s = spec_from_config(model_cfg)
    lch, r, dd, m = min(s.chunk_size, seq_len), s.head_dim, s.head_dim, s.num_modes
    if s.readout == "linear":
        return lch * (r + dd) + 4 * m * (r + dd)
    delta = 3 * lch * r + 5 * lch * m + 4 * m * r if s.delta_scale else 0
    return lch * (r + dd) + 4 * m * (lch + r + dd) + 4 * m * m + delta


def flops_per_token(model_cfg: Any, seq_len: int) -> float:
    """Training FLOPs per token: 6·N (N without the input embedding, a gather) + the mixer term.

    Softmax: QKᵀ and AV cost 4·T·H·d_h forward FLOPs per token, halved for causality, ×3 for training:
    6·T·H·d_h per layer. Interdomain: 6·H·(idattn/ops/interdomain.py's MACs) per layer (2 FLOPs per MAC, ×3 for training).
    """
    s = spec_from_config(model_cfg)
    n = count_params_closed(s) - s.vocab_size * s.d_model
    return 6.0 * n + sum(count * mixer_flops_per_token(ls, seq_len) for ls, count in layer_types(s))


def mixer_flops_per_token(layer_spec: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token of one layer's sequence mixing (the part not in 6·N).

    softmax: 6·T·H·d_h (4·H·d_h per query-key pair forward, T/2 keys per query on average, ×3 for training).
    swa (window W < T): the band's mean keys per query, W − W²/(2T) (continuous area of the band over T), in
    place of T/2: 12·H·d_h·(W − W²/(2T)); W ≥ T is softmax's count. These are the useful FLOPs: the XLA path
    computes the full T² scores under the mask. Recurrent: 6·H·(the operator's MACs per token-head)."""
    s, t = layer_spec, seq_len
    if s.family == "softmax" or (s.family == "swa" and s.window >= t):
        return 6.0 * t * s.num_heads * s.head_dim
    if s.family == "swa":
        w = s.window
        return 12.0 * s.num_heads * s.head_dim * (w - w * w / (2.0 * t))
    return 6.0 * s.num_heads * mixer_macs_per_token_head(s, seq_len)


# ------------------------------------------------------------- the report of `python -m idattn.params`
DECODE_CONTEXTS = (4096, 32768, 131072)  # the decode-memory table's context lengths (docs/model.md)
def module_breakdown(model_cfg) -> "collections.OrderedDict[str, int]":
    """Counts grouped by module path (layers summed over depth), from eval_shape of the built model."""
    model = build_model(model_cfg)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    flat = jax.tree_util.tree_flatten_with_path(nn.meta.unbox(shapes["params"]))[0]
    out: collections.OrderedDict[str, int] = collections.OrderedDict()
    for path, leaf in flat:
        names = [str(getattr(p, "key", p)) for p in path]
        if names[0].startswith("layers_"):
            names[0] = "layers"
        key = "/".join(names[:3] if names[0] == "layers" else names[:1])
        out[key] = out.get(key, 0) + int(np.prod(leaf.shape))
    return out


def report(model_cfg) -> list[str]:
    spec = spec_from_config(model_cfg)
    rows = module_breakdown(model_cfg)
    total = sum(rows.values())
    closed = count_params_closed(model_cfg)
    if total != closed:
        raise AssertionError(f"eval_shape count {total} != closed form {closed}: update this module's closed form")
    mixer = (f"layer_pattern={','.join(spec.layer_pattern)} (hybrid)" if spec.family == "hybrid" else
             f"mixer={spec.mixer} input={spec.input} readout={spec.readout} rope={spec.rope}")
    lines = [f"model: {mixer} gate={spec.output_gate} theory={spec.theory} d={spec.d_model} "
             f"layers={spec.num_layers} heads={spec.num_heads}x{spec.head_dim} ffn={spec.ffn_dim} "
             f"M={spec.num_modes} V={spec.vocab_size}" + (f" window={spec.window}" if spec.window else ""),
             "parameters by module (summed over layers):"]
    w = max(len(k) for k in rows)
    lines += [f"  {k:<{w}}  {v:>15,}" for k, v in rows.items()]
    types = layer_types(spec)
    if spec.family == "hybrid":
        lines.append("parameters per layer type (mixer + norms + SwiGLU, per layer; layers; total):")
        shared = 2 * spec.d_model + 3 * spec.d_model * spec.ffn_dim
        for ls, count in types:
            per = sum(_mixer_counts(ls).values()) + shared
            lines.append(f"  {ls.mixer:<24} {per:>13,} x {count:>3} = {per * count:>15,}")
    for ls, count in types:
        sb = state_budget(ls)
        unit = {"softmax": "per token (KV cache), per layer",
                "swa": f"per token for the last {ls.window} tokens (ring buffer), per layer"}.get(
                    ls.family, "per layer (constant in context)")
        who = f" [{ls.mixer}, {count} layers]" if spec.family == "hybrid" else ""
        lines.append(f"state budget{who}: {sb:,} real numbers {unit}")
    if not spec.theory:
        lines.append("decode cache per sequence (bytes, init_cache): " + ", ".join(
            f"{t // 1024}K: {cache_bytes(spec, t):,}" for t in DECODE_CONTEXTS))
    diffs = differences(model_cfg)
    lines.append(f"differences from the paper's parameterisation (ours − paper): {len(diffs)} items")
    for desc, n in diffs:
        lines.append(f"  {n:+,}  {desc}")
    lines.append(f"paper formula: {paper_count(model_cfg):,}")
    lines.append(f"params: {total}")
    lines.append(f"table3_equivalent: {total - sum(n for _, n in diffs)}")
    return lines

