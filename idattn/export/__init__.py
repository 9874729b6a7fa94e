"""Export to Hugging Face transformers, and import back (`python -m idattn.export`; docs/evaluation.md).

    export_hf(params, model_cfg, out, tokenizer) -> files     the folder (idattn.export.hf says what it holds)
    import_folder(out) -> (model config dict, params)         an export folder, or a save_pretrained one

configuration_idattn.py and modeling_idattn.py here are the code files every folder carries (plain PyTorch and
transformers; nothing in idattn imports them).
"""
from idattn.export.cli import define_flags, main
from idattn.export.hf import export_hf, import_folder, tokenizer_json, write_tokenizer

__all__ = ["export_hf", "import_folder", "tokenizer_json", "write_tokenizer", "define_flags", "main"]
