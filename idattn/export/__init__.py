"""Export to Hugging Face transformers, and import back (`python -m idattn.export`; docs/evaluation.md).

    export_hf(params, model_cfg, out, tokenizer) -> files     the folder (idattn.export.hf says what it holds)
    import_folder(out) -> (model config dict, params)         an export folder, or a save_pretrained one

The command's flags and main are in __main__.py. configuration_idattn.py and modeling_idattn.py here are the code
files every folder carries (plain PyTorch and transformers; nothing in idattn imports them).
"""
from idattn.export.hf import export_hf, import_folder, tokenizer_json, write_tokenizer

__all__ = ["export_hf", "import_folder", "tokenizer_json", "write_tokenizer"]
