"""The MAD synthetic suite (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures", arXiv
2403.17844; reference code github.com/athms/mad-lab, `mad/data/instances.py` and `configs/tasks/*.yml`):
in-context recall, fuzzy recall, noisy recall, selective copying, compression, memorization, as seeded numpy
generators, an exact solver per task (a "model" that solves it by construction), and the one accuracy function
every model and solver is scored with.

Settings (`TASKS`, MAD's baseline row of each `configs/tasks/<task>.yml`; MAD varies vocabulary, length and
training-set size around it, which we do not):

| task | vocab | length | other | train / test examples |
|---|---|---|---|---|
| in-context recall | 16 | 128 | multi-query | 12,800 / 1,280 |
| fuzzy recall | 16 | 128 | keys and values of 1-3 tokens, multi-query | 12,800 / 1,280 |
| noisy recall | 32 (16 of them noise) | 128 | 20% noise pairs, multi-query | 12,800 / 1,280 |
| selective copying | 16 | 256 | 16 tokens to copy | 12,800 / 1,280 |
| compression | 16 | 32 | | 12,800 / 1,280 |
| memorization | 256 | 32 | one fixed key-value map (seed 12345) | 256 / 1,280 |

MAD's training protocol (`mad/configs.py`): width 128, AdamW, batch 128, 200 epochs, cosine to 1e-6, learning
rate in {1e-4, 5e-4, 1e-3} x weight decay in {0, 0.1}, best test accuracy reported. Its architectures are two
blocks of (sequence mixer, channel mixer), i.e. 4 layers.

**Format.** Each generator returns `(inputs [N, T], targets [N, T])` int32; `targets` is IGNORE (-100) except at
the positions scored, and `targets[:, t]` is what the output at position t must predict. Recall tasks follow
MAD: with `is_training=True` the targets are the next tokens everywhere (`inputs[1:]`, language modelling);
with `is_training=False` only the recalled values. Selective copying, compression and memorization have their
targets aligned with the input positions in both modes (MAD's format). Compression is scored as MAD's
auto-encoder: the representation at the last (compression) token must give back every input token, so its
`targets` are the inputs themselves and a model needs a decoder head from the last position (mad-lab's
`AutoEncoder`; ours: `auto_encoder(model_cfg)`, which `train_mad` uses for this task); `score` only sees the
logits.

**Where ours differ from mad-lab's generators** (same task, not the same samples; all randomness from the one
seeded `np.random.Generator`):
- fuzzy recall: mad-lab can skip inserting the probed pair into the context when its random insertion index
  falls in the last few positions (then the final query asks for a key the context never defined); ours always
  inserts it before the end, so every scored value is recallable.
- selective copying: mad-lab places the blanks with numpy's *global* RNG (`np.random.randint`, unaffected by
  its seed); ours draws the positions of the tokens to copy uniformly among the first T − n − 1 positions from
  the seeded generator.
- in-context / noisy / fuzzy recall with `multi_query=True` have T − 1 tokens per sequence, as mad-lab's do (the
  autoregressive shift of a T-token sequence); the others have T.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from idattn.eval.synthetic import IGNORE, fit
from idattn.layers.common import RMSNorm
from idattn.models import build_model
from idattn.models.llama import Decoder
from idattn.models.spec import ModelSpec, spec_from_config

TASKS: dict[str, dict[str, Any]] = {
    "in_context_recall": dict(vocab_size=16, seq_len=128, multi_query=True, num_train=12_800, num_test=1_280),
    "fuzzy_recall": dict(vocab_size=16, seq_len=128, k_motif_size=3, v_motif_size=3, multi_query=True,
                         num_train=12_800, num_test=1_280),
    "noisy_recall": dict(vocab_size=32, seq_len=128, noise_vocab_size=16, frac_noise=0.2, multi_query=True,
                         num_train=12_800, num_test=1_280),
    "selective_copying": dict(vocab_size=16, seq_len=256, num_tokens_to_copy=16, num_train=12_800, num_test=1_280),
    "compression": dict(vocab_size=16, seq_len=32, num_train=12_800, num_test=1_280),
    "memorization": dict(vocab_size=256, seq_len=32, kv_map_seed=12345, num_train=256, num_test=1_280),
}


# ------------------------------------------------------------------------------------------------ recall

def _recall_vocab(vocab_size: int, multi_query: bool, noise_vocab_size: int, specials: int):
    ns = vocab_size - (specials - 1 if multi_query else specials) - noise_vocab_size
    if ns < 4:
        raise ValueError(f"mad recall: vocab_size={vocab_size} leaves {ns} key/value tokens")
    return np.arange(ns // 2), np.arange(ns // 2, ns), np.arange(ns, ns + noise_vocab_size)


def _recall_one(rng, vocab_size, seq_len, multi_query, noise_vocab_size, frac_noise):
    keys, values, noise = _recall_vocab(vocab_size, multi_query, noise_vocab_size, specials=1)
    copy_prefix = vocab_size - 1
    if seq_len % 2:
        raise ValueError(f"mad recall: seq_len={seq_len} must be even")
    n_pairs = seq_len // 2
    keep = rng.integers(n_pairs)  # at least one real pair
    kv: dict[int, int] = {}
    toks, tgt = [], []
    for i in range(n_pairs - 1):
        if frac_noise > 0 and i != keep and rng.random() < frac_noise:
            toks += list(rng.choice(noise, 2))
            tgt += [IGNORE, IGNORE]
            continue
        k = int(rng.choice(keys))
        seen = k in kv
        v = kv.setdefault(k, int(rng.choice(values)))
        toks += [k, v]
        tgt += [IGNORE, v if (seen and multi_query) else IGNORE]
    kq = int(rng.choice(sorted(kv)))
    if not multi_query:
        toks.append(copy_prefix)
        tgt.append(IGNORE)
    toks += [kq, kv[kq]]
    tgt += [IGNORE, kv[kq]]
    return np.array(toks), np.array(tgt)


def _fuzzy_one(rng, vocab_size, seq_len, k_motif_size, v_motif_size, multi_query, is_training):
    keys, values, _ = _recall_vocab(vocab_size, multi_query, 0, specials=2)
    copy_prefix, pad = vocab_size - 1, (vocab_size - 1 if multi_query else vocab_size - 2)
    k_sizes = list(range(1, k_motif_size + 1)) if is_training else [k_motif_size]
    v_sizes = list(range(1, v_motif_size + 1))

    def motif(vocab, size):
        return tuple(int(x) for x in rng.permutation(vocab)[:size])  # distinct tokens, as mad-lab's permutations

    kq, vq = motif(keys, int(rng.choice(k_sizes))), motif(values, int(rng.choice(v_sizes)))
    budget = seq_len - len(kq) - len(vq) - (k_motif_size + v_motif_size)
    probe_at = int(rng.integers(max(1, budget - len(kq) - len(vq))))  # always before the loop ends (see docstring)
    kv = {kq: vq}
    presented: set = set()
    toks, tgt = [], []
    placed = False
    while len(toks) < budget:
        if not placed and len(toks) >= probe_at:
            k, v = kq, vq
            placed = True
        else:
            k = motif(keys, int(rng.choice(k_sizes)))
            v = kv.setdefault(k, motif(values, int(rng.choice(v_sizes))))
            placed = placed or k == kq
        toks += list(k) + list(v)
        tgt += [IGNORE] * len(k) + (list(v) if (k in presented and multi_query) else [IGNORE] * len(v))
        presented.add(k)
    if not multi_query:
        toks.append(copy_prefix)
        tgt.append(IGNORE)
    toks += list(kq) + list(vq)
    tgt += [IGNORE] * len(kq) + list(vq)
    n_pad = seq_len + 1 - len(toks)
    return np.array([pad] * n_pad + toks), np.array([IGNORE] * n_pad + tgt)


def _stack_shifted(pairs, is_training):
    lens = {len(t) for t, _ in pairs}
    if len(lens) != 1:
        raise AssertionError(f"mad: ragged sequences {sorted(lens)}")
    toks = np.stack([t for t, _ in pairs])
    tgt = np.stack([g for _, g in pairs])
    x = toks[:, :-1]
    y = toks[:, 1:] if is_training else tgt[:, 1:]
    return x.astype(np.int32), y.astype(np.int32)


def in_context_recall(n: int, seed: int = 0, *, vocab_size: int = 16, seq_len: int = 128, multi_query: bool = True,
                      noise_vocab_size: int = 0, frac_noise: float = 0.0, is_training: bool = False, **_):
    """Key-value pairs `k v k v ...` (keys and values from disjoint halves of the vocabulary, one value per key in
    a sequence); each repeated key's value is scored (multi-query), and the final pair is a query."""
    if not 0 <= frac_noise < 1:
        raise ValueError(f"mad recall: frac_noise={frac_noise}; expected [0, 1)")
    rng = np.random.default_rng(seed)
    return _stack_shifted([_recall_one(rng, vocab_size, seq_len, multi_query, noise_vocab_size, frac_noise)
                           for _ in range(n)], is_training)


def noisy_recall(n: int, seed: int = 0, *, vocab_size: int = 32, seq_len: int = 128, noise_vocab_size: int = 16,
                 frac_noise: float = 0.2, multi_query: bool = True, is_training: bool = False, **_):
    """In-context recall with a fraction of the pairs replaced by two tokens of a separate noise vocabulary."""
    return in_context_recall(n, seed, vocab_size=vocab_size, seq_len=seq_len, multi_query=multi_query,
                             noise_vocab_size=noise_vocab_size, frac_noise=frac_noise, is_training=is_training)


def fuzzy_recall(n: int, seed: int = 0, *, vocab_size: int = 16, seq_len: int = 128, k_motif_size: int = 3,
                 v_motif_size: int = 3, multi_query: bool = True, is_training: bool = False, **_):
    """Keys and values are motifs of 1..k (1..v) distinct tokens; at test the keys have the maximal size.
    Left-padded to the common length."""
    rng = np.random.default_rng(seed)
    return _stack_shifted([_fuzzy_one(rng, vocab_size, seq_len, k_motif_size, v_motif_size, multi_query,
                                      is_training) for _ in range(n)], is_training)


# ------------------------------------------------------------------------------------------------ the others

def selective_copying(n: int, seed: int = 0, *, vocab_size: int = 16, seq_len: int = 256,
                      num_tokens_to_copy: int = 16, **_):
    """n_c tokens scattered among blanks in the first T − n_c − 1 positions, a copy token, then n_c blanks at
    whose positions the tokens must come out in order."""
    nc = num_tokens_to_copy
    if seq_len <= 2 * nc + 1:
        raise ValueError(f"mad selective copying: seq_len={seq_len} must exceed 2 * {nc} + 1")
    blank, copy = vocab_size - 2, vocab_size - 1
    rng = np.random.default_rng(seed)
    span = seq_len - nc - 1
    x = np.full((n, seq_len), blank, np.int64)
    y = np.full((n, seq_len), IGNORE, np.int64)
    for i in range(n):
        toks = rng.integers(0, vocab_size - 2, nc)
        pos = np.sort(rng.permutation(span)[:nc])
        x[i, pos] = toks
        y[i, span + 1:] = toks
    x[:, span] = copy
    return x.astype(np.int32), y.astype(np.int32)


def compression(n: int, seed: int = 0, *, vocab_size: int = 16, seq_len: int = 32, **_):
    """T − 1 random tokens and a compression token; the targets are the whole input (auto-encoder scoring)."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.integers(0, vocab_size - 1, (n, seq_len - 1)),
                        np.full((n, 1), vocab_size - 1)], axis=1)
    return x.astype(np.int32), x.astype(np.int32).copy()


def memorization_map(vocab_size: int = 256, kv_map_seed: int = 12345) -> dict[int, int]:
    """The fixed key -> value map (the same for every sequence and split): keys from the first half of the
    non-special vocabulary, values from the second, paired by two seeded permutations."""
    ns = vocab_size - 1  # the last token is the insert token
    rng = np.random.default_rng(kv_map_seed)
    keys = list(rng.permutation(ns // 2))
    values = list(ns // 2 + rng.permutation(ns - ns // 2))
    return {int(k): int(v) for k, v in zip(keys, values)}


def memorization(n: int, seed: int = 0, *, vocab_size: int = 256, seq_len: int = 32, kv_map_seed: int = 12345, **_):
    """`k <insert> k <insert> ...`: at each insert token the model must output the fixed map's value of the key
    before it (nothing in the context gives it: it is stored in the weights)."""
    kv = memorization_map(vocab_size, kv_map_seed)
    keys = np.array(sorted(kv))
    rng = np.random.default_rng(seed)
    k = rng.choice(keys, (n, seq_len // 2))
    x = np.full((n, seq_len), vocab_size - 1, np.int64)
    y = np.full((n, seq_len), IGNORE, np.int64)
    x[:, 0::2] = k
    y[:, 1::2] = np.vectorize(kv.get)(k)
    return x.astype(np.int32), y.astype(np.int32)


GENERATORS: dict[str, Callable[..., tuple[np.ndarray, np.ndarray]]] = {
    "in_context_recall": in_context_recall, "fuzzy_recall": fuzzy_recall, "noisy_recall": noisy_recall,
    "selective_copying": selective_copying, "compression": compression, "memorization": memorization}


def generate(task: str, n: int, seed: int = 0, is_training: bool = False, **overrides):
    """(inputs, targets) of `task` with its MAD settings (TASKS), any of them overridden."""
    if task not in GENERATORS:
        raise ValueError(f"mad: task {task!r}; expected one of {sorted(GENERATORS)}")
    kw = {k: v for k, v in TASKS[task].items() if k not in ("num_train", "num_test")}
    kw.update(overrides)
    return GENERATORS[task](n, seed, is_training=is_training, **kw)


# ------------------------------------------------------------------------------------------------ scoring

def accuracy(logits: np.ndarray, targets: np.ndarray) -> float:
    """Fraction of scored positions (targets != IGNORE) where argmax(logits) equals the target."""
    logits, targets = np.asarray(logits), np.asarray(targets)
    if logits.shape[:2] != targets.shape:
        raise ValueError(f"mad accuracy: logits {logits.shape} vs targets {targets.shape}")
    m = targets != IGNORE
    return float(((logits.argmax(-1) == targets) & m).sum() / max(int(m.sum()), 1))


def score(logits_fn: Callable[[np.ndarray], np.ndarray], inputs: np.ndarray, targets: np.ndarray,
          batch_size: int = 128) -> float:
    """`accuracy` over batches of `logits_fn(inputs [B, T]) -> logits [B, T, V]`: how models and solvers are scored."""
    hit = tot = 0
    for s in range(0, len(inputs), batch_size):
        y = targets[s:s + batch_size]
        m = y != IGNORE
        pred = np.asarray(logits_fn(inputs[s:s + batch_size])).argmax(-1)
        if pred.shape != y.shape:
            raise ValueError(f"mad score: predictions {pred.shape} vs targets {y.shape}")
        hit += int(((pred == y) & m).sum())
        tot += int(m.sum())
    return hit / max(tot, 1)


# ------------------------------------------------------------------------------------------------ exact solvers

def _one_hot(pred: np.ndarray, vocab_size: int) -> np.ndarray:
    return np.eye(vocab_size, dtype=np.float32)[np.clip(pred, 0, vocab_size - 1)]


def _kind(tok: int, ns: int) -> int:
    """0 key, 1 value, 2 anything else (noise, pad, copy prefix) for the recall vocabularies."""
    return 0 if tok < ns // 2 else (1 if tok < ns else 2)


def solve_recall(inputs: np.ndarray, *, vocab_size: int, multi_query: bool = True, noise_vocab_size: int = 0,
                 fuzzy: bool = False, **_) -> np.ndarray:
    """An exact lookup over the context, written independently of the generators: cut the sequence into runs of
    key tokens and runs of value tokens (disjoint vocabularies); at a position inside a key run K, or inside a
    value run P following K, answer with the next token of the value that followed K the last time K appeared.
    Single-token keys are the case fuzzy=False. Returns one-hot logits [N, T, V]."""
    specials = 2 if fuzzy else 1
    ns = vocab_size - (specials - 1 if multi_query else specials) - noise_vocab_size
    pred = np.zeros(inputs.shape, np.int64)
    for r, seq in enumerate(np.asarray(inputs)):
        memory: dict[tuple, tuple] = {}
        key: list[int] = []
        val: list[int] = []
        for t, tok in enumerate(int(x) for x in seq):
            kind = _kind(tok, ns)
            if kind == 0:
                if val:  # a new key starts: the previous pair is complete
                    memory[tuple(key)] = tuple(val)
                    key, val = [], []
                key.append(tok)
                if not fuzzy:
                    key = key[-1:]
            elif kind == 1 and key:
                val.append(tok)
                if not fuzzy:  # single tokens: the pair is complete at once
                    memory[tuple(key)] = tuple(val)
            else:
                if key and val:
                    memory[tuple(key)] = tuple(val)
                key, val = [], []
                continue
            got = memory.get(tuple(key))
            if kind == 0 and got:
                pred[r, t] = got[0]
            elif kind == 1 and fuzzy and got and len(got) > len(val) and got[:len(val)] == tuple(val):
                pred[r, t] = got[len(val)]
    return _one_hot(pred, vocab_size)


def solve_selective_copying(inputs: np.ndarray, *, vocab_size: int, **_) -> np.ndarray:
    blank, copy = vocab_size - 2, vocab_size - 1
    pred = np.zeros(inputs.shape, np.int64)
    for r, seq in enumerate(np.asarray(inputs)):
        at = int(np.flatnonzero(seq == copy)[0])
        content = [int(x) for x in seq[:at] if x != blank]
        for j, t in enumerate(range(at + 1, len(seq))):
            if j < len(content):
                pred[r, t] = content[j]
    return _one_hot(pred, vocab_size)


def solve_compression(inputs: np.ndarray, *, vocab_size: int, **_) -> np.ndarray:
    """A perfect memory: the decoder gives the input back (what a lossless state at the last token allows)."""
    return _one_hot(np.asarray(inputs).astype(np.int64), vocab_size)


def solve_memorization(inputs: np.ndarray, *, vocab_size: int, kv_map_seed: int = 12345, **_) -> np.ndarray:
    """The fixed map looked up: the output at an insert token is the value of the key before it."""
    kv = memorization_map(vocab_size, kv_map_seed)
    x = np.asarray(inputs).astype(np.int64)
    prev = np.concatenate([np.full((len(x), 1), -1), x[:, :-1]], axis=1)
    pred = np.vectorize(lambda k: kv.get(int(k), 0))(prev)
    return _one_hot(pred, vocab_size)


def solver(task: str, **overrides) -> Callable[[np.ndarray], np.ndarray]:
    """The exact solver of `task` as a logits function (the signature `score` takes)."""
    kw = {k: v for k, v in TASKS[task].items() if k not in ("num_train", "num_test")}
    kw.update(overrides)
    if task in ("in_context_recall", "noisy_recall"):
        return lambda x: solve_recall(x, **kw)
    if task == "fuzzy_recall":
        return lambda x: solve_recall(x, fuzzy=True, **kw)
    fns = {"selective_copying": solve_selective_copying, "compression": solve_compression,
           "memorization": solve_memorization}
    if task not in fns:
        raise ValueError(f"mad: task {task!r}; expected one of {sorted(GENERATORS)}")
    return lambda x: fns[task](x, **kw)


# ------------------------------------------------------------------------------------------------ training

_GENERATED: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _generated(task: str, n: int, seed: int, is_training: bool, overrides: dict[str, Any]):
    """`generate(...)`, kept for the next call with the same arguments (the cells of a MAD table train on the same
    data per task and seed, and the Python recall generators take seconds); the last 4 data sets are kept."""
    key = (task, int(n), int(seed), bool(is_training), tuple(sorted(overrides.items())))
    if key not in _GENERATED:
        while len(_GENERATED) >= 4:
            _GENERATED.pop(next(iter(_GENERATED)))
        _GENERATED[key] = generate(task, n, seed=seed, is_training=is_training, **overrides)
    return _GENERATED[key]


def _sincos(length: int, dim: int) -> np.ndarray:
    """[length, dim] fixed sinusoidal position embedding (sin | cos halves, frequencies 10000^(-k/(dim/2 - 1)),
    the form mad-lab's decoder adds; dim even)."""
    half = dim // 2
    omega = 1.0 / (10000.0 ** (np.arange(half) / max(half - 1, 1)))
    ang = np.arange(length)[:, None] * omega[None, :]
    return np.concatenate([np.sin(ang), np.cos(ang)], axis=1).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _auto_encoder_class():
    # defined on first use: flax is imported lazily (the generators and solvers need numpy only)


    class AutoEncoder(nn.Module):
        spec: ModelSpec

        @nn.compact
        def __call__(self, tokens, segment_ids=None, positions=None):
            s = self.spec
            init = nn.initializers.normal(0.02)  # mad-lab's initializer_range
            h = Decoder(s, name="encoder")(tokens, segment_ids=segment_ids, positions=positions, hidden=True)
            z = h[:, -1, :].astype(jnp.float32)                                        # [B, d]
            x = z[:, None, :] + jnp.asarray(_sincos(tokens.shape[1], s.d_model))[None]  # [B, T, d]
            for i in range(2):
                x = RMSNorm(s.norm_eps, name=f"dec_norm_{i}")(x)
                x = nn.gelu(nn.Dense(s.d_model, kernel_init=init, name=f"dec_{i}")(x), approximate=False)
            x = RMSNorm(s.norm_eps, name="unembed_norm")(x)
            return nn.Dense(s.vocab_size, kernel_init=init, name="unembed")(x).astype(jnp.float32)

    return AutoEncoder


def auto_encoder(model_cfg: Any):
    """MAD's compression model (mad-lab `AutoEncoder` with global pool "last"), a flax module: the encoder is
    the language model of ``model_cfg`` up to its final norm (``Decoder(..., hidden=True)``: the mixers under
    test, causal, no head), and the representation z at the last (compression) token is all the decoder sees:
    for every position t, x_t = z + sincos_t, then RMSNorm -> Dense(d) -> GELU twice, then RMSNorm -> Dense(V):
    logits [B, T, V] float32. Called as the language model: ``apply({"params": p}, tokens, segment_ids=,
    positions=)``. Differences from mad-lab: our encoder ends in the LM's final RMSNorm (theirs feeds the
    residual stream to the decoder's first norm), and its blocks are ours (SwiGLU channel mixers)."""
    return _auto_encoder_class()(spec_from_config(model_cfg))


def train_mad(model_cfg: Any, task: str, *, steps: int = 1_000, batch_size: int = 128, lr: float = 5e-4,
              weight_decay: float = 0.0, warmup: int = 50, seed: int = 0, num_train: int | None = None,
              num_test: int | None = None, log_every: int = 0, log: Callable[[str], None] = print,
              **task_overrides) -> dict[str, Any]:
    """Trains `idattn.models.build_model(model_cfg)` on one MAD task (`fit_and_score`) and returns {"acc": test
    accuracy through `score`, "loss", "steps", ...}. Training instances: `generate(..., is_training=True)`
    (next-token targets for the recall tasks, as MAD's datasets). Compression trains ``auto_encoder(model_cfg)``
    (the config's language model as the encoder, MAD's MLP decoder from the last position) instead."""
    spec = TASKS[task]
    V = int(task_overrides.get("vocab_size", spec["vocab_size"]))
    if V > model_cfg.vocab_size:
        raise ValueError(f"train_mad: task vocabulary {V} exceeds model.vocab_size={model_cfg.vocab_size}")
    n_train = int(num_train or spec["num_train"])
    x_tr, y_tr = _generated(task, n_train, seed, True, task_overrides)
    x_te, y_te = _generated(task, int(num_test or spec["num_test"]), seed + 100_003, False, task_overrides)
    res = fit_and_score(model_cfg, x_tr, y_tr, x_te, y_te, steps=steps, batch_size=batch_size, lr=lr,
                        weight_decay=weight_decay, warmup=warmup, seed=seed, log_every=log_every, log=log,
                        name=f"mad {task}", auto_encode=task == "compression")
    res.update(task=task, vocab_size=V, num_train=n_train)
    return res


def fit_and_score(model_cfg: Any, x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray, *,
                  steps: int, batch_size: int, lr: float, weight_decay: float = 0.0, warmup: int = 50,
                  seed: int = 0, log_every: int = 0, log: Callable[[str], None] = print, name: str = "task",
                  auto_encode: bool = False) -> dict[str, Any]:
    """Trains on (inputs, targets) in the MAD format (targets IGNORE where not scored) and scores the test set
    with `score`: {"acc", "loss", "steps", "train_seconds", "seq_len", "num_test"}. Training is
    idattn.eval.synthetic.fit (the trainer's step; AdamW, global-norm clip 1.0, cosine to lr/100 after `warmup`:
    MAD gives cosine to 1e-6 and no warmup; batches drawn with replacement from `seed` + 1; init from `seed`).
    The test set may be longer than the training set (idattn.eval.state_tracking). `auto_encode`: train
    ``auto_encoder``."""


    model = auto_encoder(model_cfg) if auto_encode else build_model(model_cfg)
    res = fit(model, x_tr, y_tr, steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
              warmup=warmup, seed=seed, log_every=log_every, log=log, name=name)
    apply = jax.jit(lambda p, x: model.apply({"params": p}, x))
    p = res["params"]
    acc = score(lambda x: apply(p, jnp.asarray(x)), x_te, y_te)
    return {"acc": acc, "loss": res["loss"], "steps": steps, "train_seconds": res["train_seconds"],
            "seq_len": res["seq_len"], "num_test": int(len(x_te))}
