"""The Hugging Face configuration of an idattn model (written into every export folder beside modeling_idattn.py).

Loaded by `AutoConfig.from_pretrained(DIR, trust_remote_code=True)` through config.json's `auto_map`. It imports
only transformers. The whole idattn model config travels as one dict, `idattn` (the fields of idattn's ModelSpec:
sizes, `mixer`, `layer_pattern`, the cube switches `input` / `readout` / `rope`, `core`, `num_modes`, `kappa`,
`conj`, `linear_contraction`, `output_gate`, `short_conv`, `window`, `norm_eps`, `rope_base`, `chunk_size`, ...),
so that `save_pretrained` writes it back and idattn can import the folder again. The usual Hugging Face names
(hidden_size, num_hidden_layers, ...) are derived from it for tools that read them.
"""
from transformers import PretrainedConfig


class IdattnConfig(PretrainedConfig):
    """idattn: dict, the model config (see the module docstring). Every other keyword is PretrainedConfig's."""

    model_type = "idattn"

    def __init__(self, idattn=None, bos_token_id=1, eos_token_id=2, pad_token_id=None, **kwargs):
        self.idattn = dict(idattn or {})
        spec = self.idattn
        # Hugging Face's names for the sizes (read by generic tooling; the model reads `idattn`)
        self.vocab_size = int(spec.get("vocab_size", kwargs.pop("vocab_size", 32000)))
        self.hidden_size = int(spec.get("d_model", kwargs.pop("hidden_size", 512)))
        self.num_hidden_layers = int(spec.get("num_layers", kwargs.pop("num_hidden_layers", 1)))
        self.num_attention_heads = int(spec.get("num_heads", kwargs.pop("num_attention_heads", 8)))
        self.head_dim = int(spec.get("head_dim", kwargs.pop("head_dim", 64)))
        self.intermediate_size = int(spec.get("ffn_dim", kwargs.pop("intermediate_size", 1536)))
        self.rms_norm_eps = float(spec.get("norm_eps", kwargs.pop("rms_norm_eps", 1e-5)))
        self.max_position_embeddings = int(kwargs.pop("max_position_embeddings", 2048))  # no limit: a fixed state
        self.use_cache = bool(kwargs.pop("use_cache", True))
        self.tie_word_embeddings = bool(kwargs.pop("tie_word_embeddings", False))  # untied head
        self.bos_token_id, self.eos_token_id, self.pad_token_id = bos_token_id, eos_token_id, pad_token_id
        super().__init__(**kwargs)


__all__ = ["IdattnConfig"]
