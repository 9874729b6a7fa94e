"""A Hugging Face folder for every idattn model, and the way back.

`export_hf(params, model_cfg, out, tokenizer)` writes

  config.json               Softmax: Hugging Face Llama (`LlamaForCausalLM`, idattn.models.export's layout).
                            Every other model (Interdomain, S4D-only, the cube cells, the selective cores, swa,
                            hybrids): `"architectures": ["IdattnForCausalLM"]`, `"model_type": "idattn"`, the model
                            config under `"idattn"` and an `auto_map` to the two code files below, so that
                            `AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)` builds it.
  configuration_idattn.py   the config class (transformers only)
  modeling_idattn.py        the model in plain PyTorch: the operator's chunked form for prompts (the delta
                            update's layers: its recurrence), its recurrence for decoding, the attention layers
                            of hybrids, and a cache of fixed-size states
  model.safetensors         idattn's own tensor names and [in, out] layout (idattn.models.export), which the
                            PyTorch modules carry under the same names: `embedding`, `layers.{i}.mixer.ssm_c_re`,
                            `layers.{i}.mlp.w_gate.kernel`, `final_norm.scale`, `lm_head.kernel`, ...
  idattn_config.json        the full model config (idattn.models.export.import_export reads it)
  tokenizer.model           the SentencePiece model, with tokenizer.json (the same segmentation for Hugging Face's
  tokenizer.json            tokenizers: SentencePiece's dummy prefix "▁" and spaces as "▁", the BPE merges in piece
  tokenizer_config.json     score order, byte fallback) and tokenizer_config.json: `AutoTokenizer` loads it, and
                            `tokenizer(text)` gives idattn's ids for the text exactly (no <s> added: idattn's
                            harness scores without it, and lm-eval's `hf` backend then does the same)

`import_folder(out)` is the inverse: (model config dict, parameter tree in idattn's layout) from an export folder or
from what `save_pretrained` of the loaded Hugging Face model wrote (there is no idattn_config.json then: the config
comes from config.json's `idattn`, the tensors from every *.safetensors file).
"""
from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
from safetensors.numpy import load_file
from sentencepiece import sentencepiece_model_pb2

from idattn.models.export import IDATTN_CONFIG, export, import_export
from idattn.models.spec import spec_from_config

HERE = os.path.dirname(os.path.abspath(__file__))
CODE_FILES = ("configuration_idattn.py", "modeling_idattn.py")
AUTO_MAP = {"AutoConfig": "configuration_idattn.IdattnConfig",
            "AutoModelForCausalLM": "modeling_idattn.IdattnForCausalLM"}
SP_PIECE = "\u2581"  # SentencePiece's whitespace symbol "▁"


def hf_config(cfg: dict, bos_id: int = 1, eos_id: int = 2, pad_id: int | None = None, max_length: int = 2048
              ) -> dict:
    """config.json of a recurrent / windowed / hybrid model (IdattnConfig's fields; `idattn` = the model config)."""
    return {"architectures": ["IdattnForCausalLM"], "model_type": "idattn", "auto_map": dict(AUTO_MAP),
            "idattn": cfg, "vocab_size": cfg["vocab_size"], "hidden_size": cfg["d_model"],
            "num_hidden_layers": cfg["num_layers"], "num_attention_heads": cfg["num_heads"],
            "head_dim": cfg["head_dim"], "intermediate_size": cfg["ffn_dim"], "rms_norm_eps": cfg["norm_eps"],
            "max_position_embeddings": int(max_length), "tie_word_embeddings": False, "use_cache": True,
            "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id, "torch_dtype": "float32",
            "dtype": "float32"}


def export_hf(params, model_cfg, out_dir: str, tokenizer=None, max_length: int = 2048) -> list[str]:
    """Write the Hugging Face folder of `params` (boxed or plain) to out_dir (module docstring). `tokenizer`: an
    idattn.data.tokenizer.Tokenizer (its SentencePiece model is written beside the weights) or None.
    `max_length`: the context lm-eval and other tools read as the model's (config.json max_position_embeddings;
    the recurrent model itself has no limit). Returns the written file names."""
    spec = spec_from_config(model_cfg)
    if spec.theory:
        raise ValueError("model.theory=True: the LegS theory mode has no step form and no PyTorch port; export an "
                         "S4D model (model.theory=False)")
    files = export(params, model_cfg, out_dir)
    bos, eos, pad = _special_ids(tokenizer)
    if spec.family != "softmax":
        with open(os.path.join(out_dir, IDATTN_CONFIG)) as f:
            cfg = json.load(f)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(hf_config(cfg, bos, eos, pad, max_length), f, indent=1)
        for name in CODE_FILES:
            shutil.copyfile(os.path.join(HERE, name), os.path.join(out_dir, name))
        files += list(CODE_FILES)
    if tokenizer is not None:
        files += write_tokenizer(tokenizer, out_dir, max_length)
    return files


def _special_ids(tokenizer) -> tuple[int, int, int | None]:
    if tokenizer is None:
        return 1, 2, None
    bos, eos = int(tokenizer.bos_id), int(tokenizer.eos_id)
    return (bos if bos >= 0 else None), (eos if eos >= 0 else None), int(tokenizer.pad_id)


def write_tokenizer(tokenizer, out_dir: str, max_length: int = 2048) -> list[str]:
    """tokenizer.model, tokenizer.json and tokenizer_config.json of an idattn SentencePiece tokenizer."""
    proto = getattr(tokenizer, "model_proto", None)
    if not proto:
        raise ValueError(f"tokenizer: got {type(tokenizer).__name__}; expected a SentencePiece tokenizer "
                         "(data.tokenizer = mistral, a .model path or train:<vocab>); pass --tokenizer=none to "
                         "export the weights without one")
    with open(os.path.join(out_dir, "tokenizer.model"), "wb") as f:
        f.write(proto)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(proto), f, ensure_ascii=False)
    names = _piece_names(proto)
    special = {"bos_token": names.get(int(tokenizer.bos_id)), "eos_token": names.get(int(tokenizer.eos_id)),
               "unk_token": names.get(0), "pad_token": names.get(int(tokenizer.pad_id))}
    conf = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(max_length),
            "clean_up_tokenization_spaces": False, "add_bos_token": False, "add_eos_token": False,
            "split_special_tokens": True,  # "<s>" typed in a text is text, as SentencePiece encodes it
            **{k: v for k, v in special.items() if v is not None}}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(conf, f, indent=1)
    return ["tokenizer.model", "tokenizer.json", "tokenizer_config.json"]


def _model_proto(proto: bytes):
    m = sentencepiece_model_pb2.ModelProto()
    m.ParseFromString(proto)
    return m


def _piece_names(proto: bytes) -> dict[int, str]:
    return {i: p.piece for i, p in enumerate(_model_proto(proto).pieces)}


def tokenizer_json(proto: bytes) -> dict:
    """The Hugging Face `tokenizers` description of a SentencePiece model (BPE or unigram, byte fallback).

    SentencePiece's segmentation: the text gets one "▁" in front (the dummy prefix, also before a leading space)
    and every space becomes "▁"; no other normalisation (the identity rule of idattn's and Llama-2's models is
    required, refused otherwise); then BPE merges in the order of the merged piece's score (highest first), or
    the unigram Viterbi path over the piece scores; a character without a piece becomes its UTF-8 byte pieces.
    Control pieces (<unk>, <s>, </s>) are special added tokens. Nothing is added around a text (no <s>), as
    idattn's harness scores and as lm-eval's `hf` backend then encodes: prepend `bos_token_id` where wanted."""
    m = _model_proto(proto)
    norm = m.normalizer_spec
    if norm.name not in ("identity", "") or norm.remove_extra_whitespaces:
        raise ValueError(f"tokenizer: its SentencePiece normaliser is {norm.name!r} (remove_extra_whitespaces="
                         f"{norm.remove_extra_whitespaces}); expected the identity rule without whitespace removal "
                         "(Llama-2 style, as idattn trains them); export with --tokenizer=none")
    pieces = [(p.piece, float(p.score), int(p.type)) for p in m.pieces]
    unk_id = int(m.trainer_spec.unk_id)
    control = {i for i, (_, _, t) in enumerate(pieces) if t in (2, 3)}  # UNKNOWN, CONTROL
    added = [{"id": i, "content": pieces[i][0], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in sorted(control)]
    if m.trainer_spec.model_type == 2:  # BPE
        vocab = {p: i for i, (p, _, _) in enumerate(pieces)}
        merges = []
        for i, (piece, score, kind) in enumerate(pieces):
            if kind != 1 or len(piece) < 2:  # NORMAL pieces are the merge results
                continue
            for cut in range(1, len(piece)):
                left, right = piece[:cut], piece[cut:]
                if left in vocab and right in vocab:
                    merges.append((-score, i, vocab[left], vocab[right], left, right))
        merges.sort()
        model = {"type": "BPE", "dropout": None, "unk_token": pieces[unk_id][0], "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": bool(m.trainer_spec.byte_fallback),
                 "ignore_merges": False, "vocab": vocab, "merges": [[x[4], x[5]] for x in merges]}
    elif m.trainer_spec.model_type == 1:  # UNIGRAM
        model = {"type": "Unigram", "unk_id": unk_id, "vocab": [[p, s] for p, s, _ in pieces],
                 "byte_fallback": bool(m.trainer_spec.byte_fallback)}
    else:
        raise ValueError(f"tokenizer: SentencePiece model_type={m.trainer_spec.model_type}; expected BPE (2) or "
                         "unigram (1); export with --tokenizer=none")
    prefix = bool(norm.add_dummy_prefix)
    normalizers = ([{"type": "Prepend", "prepend": SP_PIECE}] if prefix else []) + [
        {"type": "Replace", "pattern": {"String": " "}, "content": SP_PIECE}]
    decoders = [{"type": "Replace", "pattern": {"String": SP_PIECE}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}] + ([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else [])
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": normalizers}, "pre_tokenizer": None,
            "post_processor": None, "decoder": {"type": "Sequence", "decoders": decoders}, "model": model}


def import_folder(out_dir: str) -> tuple[dict, dict]:
    """(model config dict, params tree in idattn's layout) of an export folder, or of a folder written by the
    loaded model's `save_pretrained` (module docstring). Load it with `idattn.models.build_model(cfg)`."""
    if os.path.exists(os.path.join(out_dir, IDATTN_CONFIG)):
        return import_export(out_dir)
    path = os.path.join(out_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"import_folder: {out_dir} has no config.json; expected a folder written by "
                                "`python -m idattn.export` or by save_pretrained of the exported model")
    with open(path) as f:
        cfg = json.load(f).get("idattn")
    if not isinstance(cfg, dict):
        raise ValueError(f"import_folder: {path} has no `idattn` model config; expected an IdattnForCausalLM "
                         "folder (a Llama folder needs its idattn_config.json, which the export writes)")
    files = sorted(glob.glob(os.path.join(out_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"import_folder: no *.safetensors in {out_dir}; expected model.safetensors")
    t: dict[str, np.ndarray] = {}
    for name in files:
        t.update(load_file(name))
    return cfg, own_layout_tree(cfg, t)


def own_layout_tree(cfg: dict, t: dict) -> dict:
    """Flat tensors `layers.{i}.a.b` (+ embedding, final_norm.scale, lm_head.kernel) -> the model's tree: scanned
    layers stacked on a leading axis (a hybrid's as `layers/block_<j>` over the groups), else `layers_<i>`."""
    spec = spec_from_config(cfg)
    t = {k: np.asarray(v, np.float32) for k, v in t.items()}
    params = {"embedding": t["embedding"], "final_norm": {"scale": t["final_norm.scale"]},
              "lm_head": {"kernel": t["lm_head.kernel"]}}
    layers = []
    for i in range(spec.num_layers):
        pre, tree = f"layers.{i}.", {}
        for k, v in t.items():
            if k.startswith(pre):
                node = tree
                *path, leaf = k[len(pre):].split(".")
                for p in path:
                    node = node.setdefault(p, {})
                node[leaf] = v
        layers.append(tree)

    def stack(trees):
        return {k: stack([tr[k] for tr in trees]) if isinstance(trees[0][k], dict) else np.stack([tr[k] for tr in trees])
                for k in trees[0]}

    if spec.scan_layers and spec.family == "hybrid":
        p = len(spec.layer_pattern)
        params["layers"] = {f"block_{j}": stack(layers[j::p]) for j in range(p)}
    elif spec.scan_layers:
        params["layers"] = stack(layers)
    else:
        params.update({f"layers_{i}": lp for i, lp in enumerate(layers)})
    return params
