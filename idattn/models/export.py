"""Export a model's parameters to safetensors + config.json (`python -m idattn.export` runs it on a run directory).

Softmax -> the Hugging Face Llama layout: `config.json` with `"architectures": ["LlamaForCausalLM"]` and
`model.safetensors` with the standard names (PyTorch [out, in] weights):
  model.embed_tokens.weight [V, d]                 <- embedding
  model.layers.{i}.self_attn.{q,k,v}_proj.weight  <- W_{Q,K,V} [d, H, d_h] reshaped to [d, H·d_h], transposed
  model.layers.{i}.self_attn.o_proj.weight         <- W_O [H, d_h, d] reshaped to [H·d_h, d], transposed
  model.layers.{i}.mlp.{gate,up,down}_proj.weight  <- w_gate, w_up, w_down transposed
  model.layers.{i}.input_layernorm.weight / post_attention_layernorm.weight, model.norm.weight, lm_head.weight
q/k permutation convention: our RoPE is the rotate-half form (pairs (i, i + d_h/2)), which is exactly what the
Hugging Face Llama code applies, so q_proj / k_proj are exported **without** a permutation. (Meta's original
checkpoints rotate interleaved pairs (2i, 2i+1); converting those to this layout needs the permutation
w.view(H, d_h/2, 2, d).transpose(1, 2).reshape(H·d_h, d). We never use the interleaved form.)

Recurrent mixers (interdomain, s4d_only, cube cells) -> `model.safetensors` with our own names, one tensor per
layer (`layers.{i}.mixer.ssm_c_re`, ... in our [in, out] layout; complex values as the stored real pairs) and a
`config.json` with `"architectures": ["IdattnForCausalLM"]` and every mixer setting.

Sliding-window (swa) and hybrid stacks (model.layer_pattern) -> the same own format: Llama's layout has no window
and one mixer for every layer, so it cannot hold them; `layers.{i}.*` is layer i whatever its mixer (layer i of a
scanned hybrid is `layers/block_<i mod P>` at index i // P).

Both write `idattn_config.json` (the full model config), from which `import_export(out)` rebuilds the exact
parameter tree (tested: export -> import gives identical weights).
"""
from __future__ import annotations

import json
import os

import flax.linen as nn
import jax
import numpy as np
from safetensors.numpy import load_file, save_file

from idattn.models.spec import ModelSpec, spec_from_config

IDATTN_CONFIG = "idattn_config.json"
WEIGHTS = "model.safetensors"


def _to_numpy(params):
    return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float32), nn.meta.unbox(params))


def _layer_trees(params, spec: ModelSpec) -> list[dict]:
    if "layers" in params and spec.family == "hybrid":
        p = len(spec.layer_pattern)
        return [jax.tree_util.tree_map(lambda a, i=i: a[i // p], params["layers"][f"block_{i % p}"])
                for i in range(spec.num_layers)]
    if "layers" in params:
        return [jax.tree_util.tree_map(lambda a, i=i: a[i], params["layers"]) for i in range(spec.num_layers)]
    return [params[f"layers_{i}"] for i in range(spec.num_layers)]


def _flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _unflatten(flat: dict) -> dict:
    out: dict = {}
    for name, v in flat.items():
        node = out
        parts = name.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return out


def hf_llama_tensors(params, spec: ModelSpec) -> dict[str, np.ndarray]:
    d, h, dh = spec.d_model, spec.num_heads, spec.head_dim
    t = {"model.embed_tokens.weight": params["embedding"], "model.norm.weight": params["final_norm"]["scale"],
         "lm_head.weight": params["lm_head"]["kernel"].T}
    for i, lp in enumerate(_layer_trees(params, spec)):
        pre = f"model.layers.{i}."
        m = lp["mixer"]
        for n in ("q", "k", "v"):
            t[f"{pre}self_attn.{n}_proj.weight"] = m[f"w{n}"]["kernel"].reshape(d, h * dh).T
        t[f"{pre}self_attn.o_proj.weight"] = m["wo"]["kernel"].reshape(h * dh, d).T
        for n in ("gate", "up", "down"):
            t[f"{pre}mlp.{n}_proj.weight"] = lp["mlp"][f"w_{n}"]["kernel"].T
        t[f"{pre}input_layernorm.weight"] = lp["attn_norm"]["scale"]
        t[f"{pre}post_attention_layernorm.weight"] = lp["mlp_norm"]["scale"]
    return {k: np.ascontiguousarray(v, np.float32) for k, v in t.items()}


def hf_llama_config(spec: ModelSpec) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": spec.vocab_size,
            "hidden_size": spec.d_model, "intermediate_size": spec.ffn_dim, "num_hidden_layers": spec.num_layers,
            "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_heads, "head_dim": spec.head_dim,
            "hidden_act": "silu", "rms_norm_eps": spec.norm_eps, "rope_theta": spec.rope_base,
            "max_position_embeddings": 4096, "tie_word_embeddings": False, "attention_bias": False,
            "mlp_bias": False, "initializer_range": spec.init_std, "torch_dtype": "float32", "bos_token_id": 1,
            "eos_token_id": 2}


def export(params, model_cfg, out_dir: str) -> list[str]:
    """Write the export of `params` (boxed or plain) to out_dir. Returns the written file names."""
    spec = spec_from_config(model_cfg)
    params = _to_numpy(params)
    os.makedirs(out_dir, exist_ok=True)
    cfg_dict = {k: getattr(spec, k) for k in spec.__dataclass_fields__}
    if spec.family == "softmax":
        tensors, hf = hf_llama_tensors(params, spec), hf_llama_config(spec)
    else:
        tensors = {"embedding": params["embedding"], "final_norm.scale": params["final_norm"]["scale"],
                   "lm_head.kernel": params["lm_head"]["kernel"]}
        for i, lp in enumerate(_layer_trees(params, spec)):
            tensors.update({f"layers.{i}.{k}": v for k, v in _flatten(lp).items()})
        tensors = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
        hf = {"architectures": ["IdattnForCausalLM"], "model_type": "idattn", "idattn": cfg_dict,
              "torch_dtype": "float32",
              "note": "complex S4D parameters are stored as real pairs (*_re, *_im); see idattn docs/model.md"}
    save_file(tensors, os.path.join(out_dir, WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf, f, indent=1)
    with open(os.path.join(out_dir, IDATTN_CONFIG), "w") as f:
        json.dump(cfg_dict, f, indent=1)
    return [WEIGHTS, "config.json", IDATTN_CONFIG]


def import_export(out_dir: str) -> tuple[dict, dict]:
    """Inverse of `export`: (model config dict, params tree in the model's own layout)."""
    with open(os.path.join(out_dir, IDATTN_CONFIG)) as f:
        cfg = json.load(f)
    spec = spec_from_config(cfg)
    t = load_file(os.path.join(out_dir, WEIGHTS))
    d, h, dh = spec.d_model, spec.num_heads, spec.head_dim
    layers = []
    if spec.family == "softmax":
        params = {"embedding": t["model.embed_tokens.weight"], "final_norm": {"scale": t["model.norm.weight"]},
                  "lm_head": {"kernel": t["lm_head.weight"].T}}
        for i in range(spec.num_layers):
            pre = f"model.layers.{i}."
            mixer = {f"w{n}": {"kernel": t[f"{pre}self_attn.{n}_proj.weight"].T.reshape(d, h, dh)}
                     for n in ("q", "k", "v")}
            mixer["wo"] = {"kernel": t[f"{pre}self_attn.o_proj.weight"].T.reshape(h, dh, d)}
            mlp = {f"w_{n}": {"kernel": t[f"{pre}mlp.{n}_proj.weight"].T} for n in ("gate", "up", "down")}
            layers.append({"mixer": mixer, "mlp": mlp, "attn_norm": {"scale": t[f"{pre}input_layernorm.weight"]},
                           "mlp_norm": {"scale": t[f"{pre}post_attention_layernorm.weight"]}})
    else:
        params = {"embedding": t["embedding"], "final_norm": {"scale": t["final_norm.scale"]},
                  "lm_head": {"kernel": t["lm_head.kernel"]}}
        for i in range(spec.num_layers):
            pre = f"layers.{i}."
            layers.append(_unflatten({k[len(pre):]: v for k, v in t.items() if k.startswith(pre)}))
    if spec.scan_layers and spec.family == "hybrid":
        p = len(spec.layer_pattern)
        params["layers"] = {f"block_{j}": jax.tree_util.tree_map(lambda *a: np.stack(a), *layers[j::p])
                            for j in range(p)}
    elif spec.scan_layers:
        params["layers"] = jax.tree_util.tree_map(lambda *a: np.stack(a), *layers)
    else:
        params.update({f"layers_{i}": lp for i, lp in enumerate(layers)})
    return cfg, params
