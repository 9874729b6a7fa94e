"""The Hugging Face export (idattn.export): transformers loads every model kind with trust_remote_code, computes
idattn's logits, generates what `python -m idattn.generate` generates with a cache of fixed-size states, and
lm-eval's `hf` backend scores it as idattn's own harness does; the folder imports back into idattn.

Default suite (numpy only): the tokenizer description, import from a save_pretrained-style folder, refusals.
Slow suite (torch + transformers + lm-eval, the `harness` extra; CI installs it):

    pip install torch==2.13.0 && pip install -e ".[harness]"
    python -m pytest -q -m slow tests/test_export_hf.py

Every comparison is against idattn's own JAX model on the same parameters (perturbed away from the init, so that
an identity C or unit norms cannot hide a wrong formula), in float32, to 1e-4 of the largest logit.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from idattn.configs import base_config
from idattn.export import export_hf, import_folder, tokenizer_json
from idattn.models import apply_mixer_name, build_model
from idattn.models.export import IDATTN_CONFIG
from tests.eval_fixtures import write_piqa_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RTOL = 1e-4  # of the largest |logit|
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
os.environ.update(OFFLINE)  # nothing here may reach a hub

# every kind of the list: Interdomain, S4D-only, two more cube cells, both selective cores, the delta update
# (s = 1 on the LTI core, s = 2 on the selective one), a hybrid with a global attention layer and one with a window
# layer; plus the windowed model alone and an unrolled stack
KINDS = {
    "interdomain": {},
    "s4d_only": {},
    "generic-query-rope": {},
    "dualkv-linear-norope": {},
    "interdomain-selective": {},
    "interdomain-selective+phase": {},
    "interdomain-delta": {},
    "interdomain-selective-delta2": {},
    "hybrid_global": {"mixer": "interdomain", "layer_pattern": "interdomain,softmax"},
    "hybrid_window": {"mixer": "interdomain", "layer_pattern": "s4d_only-selective,swa", "window": 5},
    "swa": {"window": 6},
    "s4d_only_unrolled": {"mixer": "s4d_only", "scan_layers": False},
}


def _cfg(kind, vocab=48, **kw):
    over = dict(KINDS.get(kind, {}))
    mixer = over.pop("mixer", kind)
    c = base_config().model
    c.update(dict(vocab_size=vocab, d_model=32, num_layers=2, num_heads=2, head_dim=16, ffn_dim=64, num_modes=4,
                  dtype="float32", remat="none", impl="chunked", chunk_size=8))
    c.update(over)
    c.update(kw)
    return apply_mixer_name(c, mixer)


def _params(cfg, seed=0):
    """The model's init, every leaf moved by 0.1·N(0, 1): the formulas are tested, not the init's symmetries."""
    m = build_model(cfg)
    p = nn.meta.unbox(jax.jit(m.init)(jax.random.PRNGKey(seed), jnp.zeros((1, 4), jnp.int32))["params"])
    r = np.random.RandomState(seed)
    return m, jax.tree_util.tree_map(lambda a: np.asarray(a) + 0.1 * r.randn(*a.shape).astype(np.float32), p)


def _eq_tree(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


# ---------------------------------------------------------------------------------------------- default suite


def test_tokenizer_json_describes_sentencepiece_segmentation():
    """SentencePiece's dummy prefix and spaces as "▁" (a normaliser, so a leading space stays a piece of its
    own), BPE merges from the pieces, byte fallback, control pieces special, nothing added around a text."""
    from idattn.data.tokenizer import load_tokenizer

    tok = load_tokenizer("mistral")
    j = tokenizer_json(tok.model_proto)
    assert [n["type"] for n in j["normalizer"]["normalizers"]] == ["Prepend", "Replace"]
    assert j["pre_tokenizer"] is None and j["model"]["type"] == "BPE" and j["model"]["byte_fallback"]
    assert len(j["model"]["vocab"]) == 32000 and len(j["model"]["merges"]) > 30000
    assert [(t["id"], t["content"]) for t in j["added_tokens"]] == [(0, "<unk>"), (1, "<s>"), (2, "</s>")]
    assert j["post_processor"] is None  # no <s> added: idattn's harness scores without it
    left, right = j["model"]["merges"][0]
    assert left + right in j["model"]["vocab"]


def test_import_folder_reads_a_save_pretrained_folder(tmp_path):
    """Without idattn_config.json (what save_pretrained writes): the config from config.json's `idattn`, the
    tensors from every *.safetensors file; scanned, unrolled and hybrid trees alike."""
    from safetensors.numpy import load_file, save_file

    for kind in ("interdomain-selective+phase", "hybrid_window", "s4d_only_unrolled"):
        cfg = _cfg(kind)
        m = build_model(cfg)
        shapes = nn.meta.unbox(jax.eval_shape(lambda: m.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))))
        r = np.random.RandomState(1)
        params = jax.tree_util.tree_map(lambda s: r.randn(*s.shape).astype(np.float32), shapes["params"])
        out = tmp_path / kind
        files = export_hf(params, cfg, str(out))
        assert {"config.json", "configuration_idattn.py", "modeling_idattn.py", "model.safetensors"} <= set(files)
        hf = json.load(open(out / "config.json"))
        assert hf["auto_map"]["AutoModelForCausalLM"] == "modeling_idattn.IdattnForCausalLM"
        _eq_tree(params, import_folder(str(out))[1])
        os.remove(out / IDATTN_CONFIG)  # as after save_pretrained, and split in two shards
        t = load_file(str(out / "model.safetensors"))
        os.remove(out / "model.safetensors")
        keys = sorted(t)
        save_file({k: t[k] for k in keys[::2]}, str(out / "model-00001-of-00002.safetensors"))
        save_file({k: t[k] for k in keys[1::2]}, str(out / "model-00002-of-00002.safetensors"))
        cfg_back, back = import_folder(str(out))
        assert build_model(cfg_back).spec == build_model(cfg).spec
        _eq_tree(params, back)


def test_export_refusals_are_one_line(tmp_path):
    cfg = _cfg("interdomain", theory=True)
    with pytest.raises(ValueError, match=r"^model.theory=True: .*model.theory=False\)$"):
        export_hf({}, cfg, str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"^tokenizer: got ByteTokenizer; .*--tokenizer=none"):
        from idattn.data.tokenizer import ByteTokenizer
        from idattn.export import write_tokenizer
        write_tokenizer(ByteTokenizer(), str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        import_folder(str(tmp_path))


# ------------------------------------------------------------------------------------------------- slow suite


@pytest.fixture
def torch_hf():
    torch = pytest.importorskip("torch", reason="torch not installed (pip install -e '.[harness]')")
    transformers = pytest.importorskip("transformers", reason="transformers not installed (the harness extra)")
    torch.manual_seed(0)
    return torch, transformers


def _load(transformers, folder):
    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True).eval()


def _rel(a, ref):
    return float(np.abs(np.asarray(a) - np.asarray(ref)).max() / np.abs(np.asarray(ref)).max())


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_transformers_logits_equal_idattn(tmp_path, torch_hf, kind):
    """Logits within 1e-4 relative in float32: (a) 40 tokens, five of idattn's chunks of 8 (and of the PyTorch
    prompt path's); (b) a batch with a full row, a left-padded row and a right-padded row, each against idattn on
    the unpadded row."""
    torch, transformers = torch_hf
    cfg = _cfg(kind)
    model, params = _params(cfg)
    export_hf(params, cfg, str(tmp_path / "hf"))
    hf = _load(transformers, tmp_path / "hf")
    r = np.random.RandomState(3)
    # one idattn call (one compile): row 0 is the 40-token sequence, rows 1 and 2 hold the short rows at their
    # start (a causal model's logits there do not depend on what follows)
    ref_ids = r.randint(3, 48, (3, 40))
    ref = np.asarray(model.apply({"params": params}, jnp.asarray(ref_ids, jnp.int32)))
    with torch.no_grad():
        out = hf(torch.tensor(ref_ids[:1])).logits.numpy()
    err_long = _rel(out, ref[:1])
    t, lens = 19, (19, 11, 14)
    ids, mask = np.zeros((3, t), np.int64), np.zeros((3, t), np.int64)
    spans = [slice(0, 19), slice(t - 11, t), slice(0, 14)]  # full, left-padded, right-padded
    for i, sp in enumerate(spans):
        ids[i, sp], mask[i, sp] = ref_ids[i, :lens[i]], 1
    with torch.no_grad():
        out = hf(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    err_pad = max(_rel(out[i, sp], ref[i, :lens[i]]) for i, sp in enumerate(spans))
    print(f"\n{kind}: max relative logits error, 40 tokens {err_long:.2e}, padded batch {err_pad:.2e}")
    assert err_long < RTOL and err_pad < RTOL, (err_long, err_pad)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["interdomain", "dualkv-linear-norope", "interdomain-selective+phase",
                                  "interdomain-delta2",
                                  "hybrid_window", "hybrid_global"])
def test_decoding_cache_holds_states_and_matches(tmp_path, torch_hf, kind):
    """Token-by-token decoding through the cache gives the prompt path's logits, and a recurrent layer's cache has
    the same size after 5 tokens as after 45 (a window layer's at most window − 1 keys): states, not tokens. A
    global attention layer's keys grow with the context, as they must. Greedy generate() equals idattn's greedy
    decoding (idattn.models.decoding.generate) for 32 tokens, batched with left padding too."""
    torch, transformers = torch_hf
    from idattn.models import decoding

    cfg = _cfg(kind)
    model, params = _params(cfg)
    export_hf(params, cfg, str(tmp_path / "hf"))
    hf = _load(transformers, tmp_path / "hf")
    ids = torch.tensor(np.random.RandomState(4).randint(0, 48, (2, 45)))
    with torch.no_grad():
        full = hf(ids).logits
        out = hf(ids[:, :5], use_cache=True)
        cache, steps = out.cache, [out.logits]
        sizes5 = [cache.state_numel(i) for i in range(len(hf.layers))]
        for j in range(5, 45):
            out = hf(ids[:, j:j + 1], cache=cache, use_cache=True)
            cache = out.cache
            steps.append(out.logits)
    assert _rel(torch.cat(steps, 1).numpy(), full.numpy()) < RTOL
    sizes45 = [cache.state_numel(i) for i in range(len(hf.layers))]
    mixers = [layer.mixer for layer in hf.layers]
    for i, mx in enumerate(mixers):
        if type(mx).__name__ == "InterdomainMixer":
            assert sizes45[i] == sizes5[i], (i, sizes5, sizes45)
            assert set(cache.layers[i]) == {*mx.convs, "xk", "xv"}
            assert cache.layers[i]["xk"].shape == (2, 2, 4, 16) and cache.layers[i]["xk"].is_complex()
        elif mx.window > 0:
            assert cache.layers[i]["k"].shape[1] == mx.window - 1
        else:
            assert cache.layers[i]["k"].shape[1] == 45 and sizes45[i] > sizes5[i]

    prompt = np.random.RandomState(5).randint(3, 48, (1, 13))
    ours = np.asarray(decoding.generate(model, params, jnp.asarray(prompt, jnp.int32), 32))[0, 13:]
    with torch.no_grad():
        gen = hf.generate(torch.tensor(prompt), max_new_tokens=32, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    assert gen.shape[1] == 13 + 32 and gen[0, 13:].tolist() == ours.tolist()
    short = prompt[:, 4:]  # batched: row 1 left-padded by 4
    ids2 = torch.tensor(np.concatenate([prompt, np.concatenate([np.zeros((1, 4), int), short], 1)]))
    mask = torch.ones_like(ids2)
    mask[1, :4] = 0
    with torch.no_grad():
        gen2 = hf.generate(ids2, attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    ours2 = np.asarray(decoding.generate(model, params, jnp.asarray(short, jnp.int32), 8))[0, 9:]
    assert gen2[0, 13:].tolist() == ours[:8].tolist() and gen2[1, 13:].tolist() == ours2.tolist()


def _cli(args, env=None):
    env = dict(env or os.environ, JAX_PLATFORMS="cpu", **OFFLINE)
    out = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.slow
def test_generate_equals_idattn_generate_cli(tmp_path, torch_hf):
    """`python -m idattn.export` then transformers' greedy generate() = `python -m idattn.generate` greedy, 32 new
    tokens, on the same random-init model (same config and seed)."""
    torch, transformers = torch_hf
    cfg = ["--config=experiments/scaling.py:interdomain,tiny", "--config.model.dtype=float32", "--seed=3"]
    _cli(["idattn.export", *cfg, "--tokenizer=none", f"--out={tmp_path}/hf"])
    prompt = [1, 17, 254, 3, 99, 42, 7, 310, 12, 5, 77]
    _cli(["idattn.generate", *cfg, f"--prompt_ids={','.join(map(str, prompt))}", "--max_new_tokens=32",
          f"--out={tmp_path}/g.json"])
    want = json.load(open(tmp_path / "g.json"))["generated_ids"]
    hf = _load(transformers, tmp_path / "hf")
    with torch.no_grad():
        got = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
    print(f"\nidattn.generate {want}\ntransformers    {got}")
    assert len(want) == 32 and got == want


@pytest.mark.slow
def test_a_model_changed_in_transformers_imports_back(tmp_path, torch_hf):
    """Fine-tuned elsewhere: a weight changed in PyTorch, save_pretrained, import_folder -> idattn's model gives
    the changed model's logits (and every other tensor is the export's)."""
    torch, transformers = torch_hf
    cfg = _cfg("hybrid_window")
    model, params = _params(cfg)
    export_hf(params, cfg, str(tmp_path / "hf"))
    hf = _load(transformers, tmp_path / "hf")
    with torch.no_grad():
        hf.layers[0].mixer.ssm_c_im.add_(0.05)
        hf.layers[1].mlp.w_up.kernel.mul_(1.5)
    hf.save_pretrained(str(tmp_path / "tuned"))
    cfg_back, back = import_folder(str(tmp_path / "tuned"))
    ids = np.random.RandomState(6).randint(0, 48, (1, 24))
    ours = np.asarray(build_model(cfg_back).apply({"params": back}, jnp.asarray(ids, jnp.int32)))
    with torch.no_grad():
        theirs = hf(torch.tensor(ids)).logits.numpy()
    assert _rel(theirs, ours) < RTOL
    moved = np.asarray(back["layers"]["block_0"]["mixer"]["ssm_c_im"]) - np.asarray(
        params["layers"]["block_0"]["mixer"]["ssm_c_im"])
    np.testing.assert_allclose(moved[0], 0.05, atol=1e-6)
    np.testing.assert_array_equal(back["embedding"], params["embedding"])


# PIQA-format documents written here (lm-eval's `json` loader reads them from a local file)
_GOALS = ["How do I keep bread fresh?", "How can I clean a cast iron pan?", "How to cool a hot drink quickly?",
          "How do I stop a door from squeaking?", "How to remove a stripped screw?", "How do I dry wet shoes?",
          "How to keep cut apples from browning?", "How do I sharpen a pencil without a sharpener?"]
_SOLS = [("Store it in a sealed bag at room temperature.", "Store it in an open bowl of water."),
         ("Scrub it with salt and oil, then dry it on the stove.", "Soak it in the dishwasher overnight."),
         ("Pour it over ice in a metal cup.", "Wrap it in a thick wool blanket."),
         ("Rub the hinge with a little oil.", "Paint the door a darker colour."),
         ("Press a rubber band between the screwdriver and the screw.", "Hit the screw with a feather."),
         ("Stuff them with newspaper overnight.", "Put them in the freezer."),
         ("Brush the slices with lemon juice.", "Leave them in the sun."),
         ("Scrape the wood away with a small knife.", "Dip it in a glass of milk.")]


@pytest.mark.slow
def test_lm_eval_hf_backend_matches_builtin_harness(tmp_path, torch_hf):
    """`lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True` on a local PIQA-format task gives
    idattn's built-in harness accuracy (acc and acc_norm) on the same model and documents, and every request's
    log-likelihood to 1e-4 (relative). The exported tokenizer segments the texts as idattn's SentencePiece."""
    pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[harness]')")
    torch, transformers = torch_hf
    from idattn.data.tokenizer import load_tokenizer
    from idattn.eval import harness
    from idattn.eval.scoring import encode_pair, loglikelihood, model_score_fn

    tok = load_tokenizer("train:512")
    cfg = _cfg("interdomain", vocab=512)
    model, params = _params(cfg)
    export_hf(params, cfg, str(tmp_path / "hf"), tokenizer=tok, max_length=256)
    docs = [{"goal": g, "sol1": a, "sol2": b, "label": i % 2} if i % 2 == 0 else
            {"goal": g, "sol1": b, "sol2": a, "label": 1} for i, (g, (a, b)) in enumerate(zip(_GOALS, _SOLS))]
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True)
    for d in docs:
        for (ctx, cont) in harness.build_requests("piqa", d):
            for s in (ctx, ctx + cont, cont):
                assert hf_tok(s)["input_ids"] == tok.encode(s), s
    tasks = tmp_path / "tasks"
    write_piqa_task(tasks, docs)
    out = tmp_path / "out"
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf_home"), **OFFLINE)
    _cli(["lm_eval", "--model", "hf", "--model_args",
          f"pretrained={tmp_path / 'hf'},trust_remote_code=True,dtype=float32,max_length=256",
          "--tasks", "mypiqa", "--include_path", str(tasks), "--batch_size", "2", "--device", "cpu",
          "--log_samples", "--output_path", str(out)], env=env)
    res = json.load(open(glob.glob(str(out / "**" / "results_*.json"), recursive=True)[0]))["results"]["mypiqa"]
    samples = [json.loads(ln) for f in glob.glob(str(out / "**" / "samples_mypiqa_*.jsonl"), recursive=True)
               for ln in open(f)]
    score = model_score_fn(model, params)
    m, _ = harness.evaluate_task("piqa", docs, score, tok, max_length=256, batch_size=2)
    print(f"\nlm-eval hf backend: acc {res['acc,none']}, acc_norm {res['acc_norm,none']}; "
          f"idattn harness: acc {m['acc']}, acc_norm {m['acc_norm']}")
    assert res["acc,none"] == pytest.approx(m["acc"], abs=1e-9)
    assert res["acc_norm,none"] == pytest.approx(m["acc_norm"], abs=1e-9)
    assert len(samples) == len(docs)
    worst = 0.0
    for s in samples:
        d = docs[s["doc_id"]]
        pairs = [encode_pair(tok, c, x) for c, x in harness.build_requests("piqa", d)]
        ours = [ll for ll, _ in loglikelihood(score, pairs, max_length=256, batch_size=2)]
        theirs = [float(r[0][0]) for r in s["resps"]]
        np.testing.assert_allclose(theirs, ours, rtol=1e-4)
        worst = max(worst, float(np.max(np.abs(np.subtract(theirs, ours)) / np.abs(ours))))
    print(f"largest relative log-likelihood difference over {2 * len(docs)} requests: {worst:.2e}")
