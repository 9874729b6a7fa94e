"""Inference helpers shared by the CLIs (idattn.generate, idattn.score, idattn.export): model loading from a
run directory (lazily through idattn.train.checkpoint.load_params) or random init, and tokenizers."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255 (no BOS/EOS); for random-init smoke runs and tests."""
    vocab_size = 256
    bos_id = None
    eos_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def id_to_piece(self, i: int) -> str:
        return bytes([int(i)]).decode("latin-1")


def get_tokenizer(name: str | None, config=None):
    """`bytes` -> ByteTokenizer; else idattn.data.tokenizer.load_tokenizer(name or config.data.tokenizer)."""
    name = name or (config.data.tokenizer if config is not None else None)
    if not name:
        raise ValueError("tokenizer: none given; pass --tokenizer=<mistral|path.model|train:N|bytes>")
    if name == "bytes":
        return ByteTokenizer()
    from idattn.data.tokenizer import load_tokenizer

    return load_tokenizer(name)


def _bos(tok):
    b = getattr(tok, "bos_id", None)
    b = b() if callable(b) else b
    return None if b is None or b < 0 else int(b)


def encode(tok, text: str, add_bos: bool = True) -> list[int]:
    ids = list(tok.encode(text))
    bos = _bos(tok)
    return ([bos] if add_bos and bos is not None else []) + ids


def load_model(config=None, workdir: str | None = None, seed: int = 0):
    """(config, model, params): from a workdir checkpoint, else random init of `config` (seed)."""
    from idattn import models

    if workdir:
        from idattn.train.checkpoint import load_params  # the trainer owns checkpoints

        config, params = load_params(workdir)
        return config, models.build_model(config.model), params
    if config is None:
        raise ValueError("give --workdir=<run dir> or --config=<experiment config> (random init)")
    model = models.build_model(config.model)
    params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 8), jnp.int32))["params"]
    return config, model, nn.meta.unbox(params)


def check_ids(ids, vocab_size: int, what: str = "prompt") -> None:
    bad = [i for i in ids if not 0 <= int(i) < vocab_size]
    if bad:
        raise ValueError(f"{what}: token ids {bad[:5]} outside the model vocabulary [0, {vocab_size}); the "
                         "tokenizer does not match the model (check --tokenizer)")
