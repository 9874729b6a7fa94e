"""idattn.eval: evaluation (docs/evaluation.md). Results are JSON files in the run directory (`schema`).

  scoring        the shared core: jitted per-token target log-probs, bucketed batching, harness semantics
                 (encode_pair, loglikelihood with left truncation, rolling windows)
  harness        the eight-task commonsense suite + WikiText-2 + OpenBookQA, prompts as lm-evaluation-harness
  datasets       Hugging Face rows from local jsonl/parquet/json (or the hub, lazily)
  perplexity     validation perplexity, length extrapolation per corpus and position bucket, the plot
  recall         MQAR (Zoology) with a small training loop, RULER S-NIAH-1, phonebook
  decode_bench   decode latency / tokens/s against context and batch, prefill memory
  paper_numbers  the paper's tables as data;  `python -m idattn.results` renders them beside ours
  lm_eval_adapter  optional: the model registered with lm-evaluation-harness (lazy import)

Command line: `python -m idattn.eval --workdir=DIR --suite=validation,extrapolation,harness,recall,decode`.
"""
