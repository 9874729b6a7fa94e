"""Export (HF Llama layout for softmax, own layout for the recurrent mixers) and the inference CLIs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from idattn.models import export as ex
from idattn.configs import base_config
from idattn.models import apply_mixer_name, build_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cfg(mixer, **kw):
    c = base_config().model
    c.update(dict(vocab_size=48, d_model=32, num_layers=2, num_heads=2, head_dim=16, ffn_dim=64, num_modes=4,
                  dtype="float32", remat="none", impl="sequential"))
    c.update(kw)
    return apply_mixer_name(c, mixer)


def _params(cfg, seed=0):
    m = build_model(cfg)
    return m, nn.meta.unbox(jax.jit(m.init)(jax.random.PRNGKey(seed), jnp.zeros((1, 4), jnp.int32))["params"])


def _random_params(cfg, seed=0):
    """Random values in the model's exact parameter tree (eval_shape: no forward pass needed)."""
    m = build_model(cfg)
    shapes = nn.meta.unbox(jax.eval_shape(lambda: m.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))))
    r = np.random.RandomState(seed)
    return jax.tree_util.tree_map(lambda s: r.randn(*s.shape).astype(np.float32), shapes["params"])


def np_hf_llama(t, c, ids):
    """Hugging Face Llama forward (rotate-half RoPE, [out, in] weights), float64 numpy."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    h_, dh = c["num_attention_heads"], c["head_dim"]
    rms = lambda x, w: x / np.sqrt(np.mean(x * x, -1, keepdims=True) + c["rms_norm_eps"]) * w  # noqa: E731
    n = len(ids)
    inv = 1.0 / c["rope_theta"] ** (np.arange(0, dh, 2) / dh)
    ang = np.arange(n)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]
    rot = lambda x: np.concatenate([-x[..., dh // 2:], x[..., :dh // 2]], -1)  # noqa: E731
    x = t["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, t[p + "input_layernorm.weight"])
        q, k, v = ((h @ t[p + f"self_attn.{n_}_proj.weight"].T).reshape(n, h_, dh) for n_ in "qkv")
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(dh) + np.triu(np.full((n, n), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", a, v).reshape(n, h_ * dh) @ t[p + "self_attn.o_proj.weight"].T
        h = rms(x, t[p + "post_attention_layernorm.weight"])
        g, u = h @ t[p + "mlp.gate_proj.weight"].T, h @ t[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ t[p + "mlp.down_proj.weight"].T
    return rms(x, t["model.norm.weight"]) @ t["lm_head.weight"].T


def test_softmax_export_is_hf_llama(tmp_path):
    from safetensors.numpy import load_file

    cfg = _cfg("softmax")
    model, params = _params(cfg)
    ex.export(params, cfg, str(tmp_path))
    hf = json.load(open(tmp_path / "config.json"))
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["num_key_value_heads"] == 2
    t = load_file(str(tmp_path / "model.safetensors"))
    assert t["model.layers.1.self_attn.q_proj.weight"].shape == (32, 32)
    assert t["model.layers.0.mlp.down_proj.weight"].shape == (32, 64) and t["lm_head.weight"].shape == (48, 32)
    ids = np.array([3, 17, 5, 40, 0, 9, 22])
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(ids[None], jnp.int32)))[0]
    np.testing.assert_allclose(ours, np_hf_llama(t, hf, ids), atol=1e-4)
    # re-import gives identical weights
    cfg2, back = ex.import_export(str(tmp_path))
    assert cfg2["mixer"] == "softmax"
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), params, back)


def _selective_cells():
    from idattn.models import cube_cells
    return [(f"{cell}-{core}", {}) for cell in cube_cells() for core in ("selective", "selective+phase")]


@pytest.mark.parametrize("mixer,kw", [("interdomain", {}), ("generic-linear-rope", {"scan_layers": False}),
                                      ("interdomain-selective+phase", {}), ("s4d_only-selective", {}),
                                      ("s4d_only-selective+phase", {})] + _selective_cells())
def test_recurrent_export_roundtrip(tmp_path, mixer, kw):
    """Every core round-trips: the selective cores' Δ (and phase) projections are layer tensors like the rest, and
    the config records the core (issue 34: every cube cell × selective core; no forward pass, so all in the
    default suite)."""
    from idattn.models.spec import mixer_core
    cfg = _cfg(mixer, **kw)
    params = _random_params(cfg, seed=3)
    ex.export(params, cfg, str(tmp_path))
    hf = json.load(open(tmp_path / "config.json"))
    name, core = mixer_core(mixer)
    assert hf["architectures"] == ["IdattnForCausalLM"] and hf["idattn"]["core"] == core
    assert hf["idattn"]["mixer"] in (name, mixer)
    assert hf["idattn"]["num_modes"] == 4 and hf["idattn"]["conj"] is True
    _, back = ex.import_export(str(tmp_path))
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), params, back)


def _run(args):
    env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS="1", JAX_PLATFORMS="cpu")  # tiny model: compile fast
    out = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.slow  # ~45 s: three CLI processes (the wheel test runs each command's --help, the own-data walk both)
def test_cli_score_generate_export(tmp_path):
    cfg = ["--config=experiments/scaling.py:s4d_only,tiny", "--config.model.impl=sequential"]
    _run(["idattn.score", *cfg, "--tokenizer=bytes", "--text=abcab", f"--out={tmp_path}/s.json"])
    rec = json.load(open(tmp_path / "s.json"))
    assert rec["token_ids"] == [97, 98, 99, 97, 98] and rec["pieces"] == list("abcab")
    assert rec["logprobs"][0] is None and all(-20 < x < 0 for x in rec["logprobs"][1:])
    assert rec["total_logprob"] == pytest.approx(sum(rec["logprobs"][1:]))
    _run(["idattn.generate", *cfg, "--prompt_ids=1,2,3", "--max_new_tokens=3", "--temperature=0.7", "--top_p=0.9",
          f"--out={tmp_path}/g.json"])
    g = json.load(open(tmp_path / "g.json"))
    assert g["prompt_ids"] == [1, 2, 3] and len(g["generated_ids"]) == 3
    assert all(0 <= i < 512 for i in g["generated_ids"])
    _run(["idattn.export", *cfg, f"--out={tmp_path}/exp"])
    assert (tmp_path / "exp" / "model.safetensors").is_file()
    cfg_back, _ = ex.import_export(str(tmp_path / "exp"))
    assert cfg_back["mixer"] == "s4d_only" and cfg_back["vocab_size"] == 512


@pytest.mark.slow  # ~60 s: four CLI processes
def test_score_and_generate_on_files_of_texts(tmp_path):
    """--texts / --prompts (JSON Lines in, JSON Lines out, batched): every record in input order equals what the
    single-text command gives for it (batched right-padded scoring; prompts batched by equal length, greedy), the
    prompt echoed before the continuation, and a summary line."""
    cfg = ["--config=experiments/scaling.py:s4d_only,tiny", "--config.model.impl=sequential", "--tokenizer=bytes",
           "--add_bos=false"]
    texts = ["abcab", "the cat sat", "abcab abcab", "zz"]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    out = _run(["idattn.score", *cfg, f"--texts={tmp_path / 't.jsonl'}", "--text_field=body", "--batch_size=3",
                f"--out={tmp_path}/s.jsonl"])
    recs = [json.loads(ln) for ln in open(tmp_path / "s.jsonl")]
    assert [r["text"] for r in recs] == texts
    assert "score: 4 text(s)" in out.stderr and "perplexity" in out.stderr
    _run(["idattn.score", *cfg, "--text=the cat sat", f"--out={tmp_path}/one.json"])
    one = json.load(open(tmp_path / "one.json"))
    assert one["token_ids"] == recs[1]["token_ids"]
    np.testing.assert_allclose(recs[1]["logprobs"][1:], one["logprobs"][1:], rtol=1e-5, atol=1e-6)
    prompts = ["abc", "xyz", "hello", "abc"]  # two of length 3 batched together (twice "abc": same greedy output)
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in prompts))
    out = _run(["idattn.generate", *cfg, f"--prompts={tmp_path / 'p.jsonl'}", "--max_new_tokens=4",
                f"--out={tmp_path}/g.jsonl"])
    gens = [json.loads(ln) for ln in open(tmp_path / "g.jsonl")]
    assert [g["prompt"] for g in gens] == prompts and all(g["full_text"].startswith(g["prompt"]) for g in gens)
    assert gens[0]["generated_ids"] == gens[3]["generated_ids"] and all(len(g["generated_ids"]) == 4 for g in gens)
    assert "2 batch(es)" in out.stderr  # lengths 3 (three prompts) and 5
    _run(["idattn.generate", *cfg, "--prompt=hello", "--max_new_tokens=4", f"--out={tmp_path}/g1.json"])
    assert json.load(open(tmp_path / "g1.json"))["generated_ids"] == gens[2]["generated_ids"]


def test_cli_modules_import_together():
    """The CLIs' library functions import side by side (one pytest worker imports them all): none of them defines
    its absl flags at import, where a second --config would raise DuplicateFlagError."""
    import importlib

    from absl import flags
    for name in ("idattn.export", "idattn.score", "idattn.params", "idattn.generate"):
        importlib.import_module(name)
    assert "out" not in flags.FLAGS and "text" not in flags.FLAGS


def test_step_flag_of_the_model_commands():
    """generate / score / export take --step (docs/own-data.md): latest by default, an integer, or 'best'."""
    from idattn.configs.flags import step_flag
    assert step_flag(None) is None and step_flag("best") == "best" and step_flag("12") == 12
    with pytest.raises(SystemExit, match=r"--step='last': expected a checkpoint step \(an integer\) or 'best'"):
        step_flag("last")
