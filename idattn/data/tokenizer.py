"""SentencePiece tokenizers: the offline 32K default, any `.model` file, or a small model trained on the
embedded corpus.

`load_tokenizer(spec)` accepts
  "mistral"          the 32K SentencePiece model shipped inside the installed `mistral-common` package
                     (`mistral_common/data/tokenizer.model.v1`): same vocabulary size (32000) and special ids
                     (<unk>=0, <s>=1, </s>=2) as the Llama-2 tokenizer the paper uses, read from the package
                     folder, so nothing is downloaded;
  "<path>.model"     any serialized SentencePiece model (e.g. the Llama-2 `tokenizer.model`);
  "train:<vocab>"    a BPE model with `vocab` pieces trained on the embedded King James corpus's *training*
                     documents (never the held-out ones), cached under `cache_dir` keyed by the corpus hash
                     and the vocabulary size, so it is trained once per machine;
  "stdlib:<vocab>"   the same recipe trained on the training files of the Python standard-library corpus
                     (`train_stdlib_tokenizer`, idattn/data/stdlib_corpus.py's split), cached under its content hash.

Train one on your own text (the same settings; documents prepare would hold out are left out):

    python -m idattn.data.prepare tokenizer --source=my_texts/ --vocab=4096 --out=my_tok.model

or in one go with the data: `python -m idattn.data.prepare --source=my_texts/ --out=DIR --train_tokenizer=4096`
(writes DIR/tokenizer.model). Either path then works as `data.tokenizer=<path>` everywhere.

A tokenizer's identity is `{"vocab_size", "sha256"}`, the sha256 being taken over the serialized model proto:
prepared data (`meta.json`) and checkpoints record it so that data tokenised with one model is never read
with another.
"""
from __future__ import annotations

import hashlib
import importlib.resources
import io
import os
import pathlib
import re
import tempfile
from typing import Iterable, Sequence

import sentencepiece as spm

from idattn.data import corpus, stdlib_corpus  # corpus loads its 6 MB of text on first use, not at import

MISTRAL_MODEL_RESOURCE = ("mistral_common", "data/tokenizer.model.v1")
# Byte fallback needs 256 byte pieces plus <unk>, <s>, </s>; below this SentencePiece cannot train.
MIN_TRAIN_VOCAB = 260 + 16
# Part of the "train:<vocab>" cache key: bump it whenever train_sentencepiece's settings change, so that a model
# cached by older code is never mistaken for the current recipe.
TRAIN_RECIPE = "bpe-bytefallback-identity-1thread-v1"


class Tokenizer:
    """A thin wrapper over a SentencePiece processor with the ids the data pipeline needs.

    `pad_id` is the model's own pad id when it defines one, else 0 (`<unk>` in Llama-style models): padded
    positions carry `segment_ids == 0` and `loss_mask == 0`, so the value is never trained on.
    """

    def __init__(self, model_proto: bytes, name: str = ""):
        if not isinstance(model_proto, (bytes, bytearray)) or not model_proto:
            raise ValueError(f"Tokenizer: model_proto must be non-empty bytes of a SentencePiece model, got "
                             f"{type(model_proto).__name__} of length {len(model_proto or b'')}.")
        self._proto = bytes(model_proto)
        self.name = name
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self._proto)
        except Exception as e:  # sentencepiece raises RuntimeError/OSError with terse text
            raise ValueError(f"Tokenizer {name!r}: the bytes are not a valid SentencePiece model ({e}). "
                             "Pass a `.model` file written by SentencePiece.") from e

    # ---- ids ----
    @property
    def vocab_size(self) -> int:
        return int(self._sp.vocab_size())

    @property
    def bos_id(self) -> int:
        return int(self._sp.bos_id())

    @property
    def eos_id(self) -> int:
        return int(self._sp.eos_id())

    @property
    def pad_id(self) -> int:
        p = int(self._sp.pad_id())
        return p if p >= 0 else 0

    @property
    def model_proto(self) -> bytes:
        return self._proto

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    # ---- text ----
    def encode(self, text: str) -> list[int]:
        """Text -> token ids, without BOS/EOS (the packer adds them)."""
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    # ---- identity ----
    def identity(self) -> dict:
        """{"vocab_size": int, "sha256": hex digest of the serialized model proto}."""
        return {"vocab_size": self.vocab_size, "sha256": hashlib.sha256(self._proto).hexdigest()}

    def __getstate__(self):  # picklable for multiprocessing workers
        return {"proto": self._proto, "name": self.name}

    def __setstate__(self, state):
        self.__init__(state["proto"], state["name"])

    def __repr__(self) -> str:
        ident = self.identity()
        return f"Tokenizer({self.name!r}, vocab_size={ident['vocab_size']}, sha256={ident['sha256'][:12]}...)"


def mistral_model_path() -> pathlib.Path:
    """Path of the 32K model inside the installed mistral-common package (no network)."""
    pkg, rel = MISTRAL_MODEL_RESOURCE
    try:
        root = importlib.resources.files(pkg)
    except ModuleNotFoundError as e:
        raise FileNotFoundError(
            "tokenizer='mistral' needs the package mistral-common installed (it ships "
            f"{pkg}/{rel}); install it, or set data.tokenizer to a path of a SentencePiece .model file, "
            "or to 'train:<vocab>' for a small model trained on the embedded corpus.") from e
    path = pathlib.Path(str(root.joinpath(rel)))
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer='mistral': {path} is missing from the installed mistral-common; "
                                "reinstall it or point data.tokenizer at a .model file.")
    return path


def train_sentencepiece(texts: Iterable[str], vocab_size: int, model_prefix: str | os.PathLike | None = None,
                        *, model_type: str = "bpe", num_threads: int = 1) -> bytes:
    """Train a SentencePiece model in memory on `texts` (one sentence/paragraph per item).

    Special ids follow Llama-2: <unk>=0, <s>=1, </s>=2, no pad piece; byte fallback so every string encodes
    (newlines, absent from the line-split training text, become the byte piece <0x0A>); identity
    normalisation, so decoding gives the text back exactly. The result depends on `num_threads` (SentencePiece
    splits the merge statistics by thread), so it stays 1 by default: every host and machine then trains the
    byte-identical model from the same texts (tested: same sha256 twice; 1, 2 and 4 threads all differ).
    Returns the serialized model proto; when `model_prefix` is given also writes `<model_prefix>.model`.
    """
    if not isinstance(vocab_size, int) or vocab_size < MIN_TRAIN_VOCAB:
        raise ValueError(f"train_sentencepiece: vocab_size={vocab_size!r}; expected an int >= {MIN_TRAIN_VOCAB} "
                         "(byte fallback needs 256 byte pieces plus specials).")
    # SentencePiece skips sentences longer than max_sentence_length bytes; split long texts into lines.
    lines = (ln for t in texts for ln in t.split("\n") if ln.strip())
    buf = io.BytesIO()
    try:
        _train(lines, buf, vocab_size, model_type, num_threads)
    except RuntimeError as e:
        if "smaller than required_chars" in str(e):
            raise ValueError(f"train_sentencepiece: vocab_size={vocab_size} is below what the text needs (256 byte "
                             f"pieces + specials + every distinct character): {e}. Use a larger vocabulary, e.g. "
                             "512.") from e
        m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", str(e))
        if m:
            raise ValueError(f"train_sentencepiece: vocab_size={vocab_size} is more pieces than this text can "
                             f"give (at most {m.group(2)}); use a smaller vocabulary or more text.") from None
        raise
    proto = buf.getvalue()
    if model_prefix is not None:
        out = pathlib.Path(f"{model_prefix}.model")
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, proto)
    return proto


def _train(lines, buf, vocab_size, model_type, num_threads) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines, model_writer=buf, vocab_size=vocab_size, model_type=model_type,
        byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=1.0,
        # Llama-2 style: no normalisation and whitespace kept, so decode(encode(text)) == text exactly.
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        num_threads=num_threads, max_sentence_length=1 << 16, shuffle_input_sentence=False,
        input_sentence_size=2_000_000, minloglevel=2)


def atomic_write(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared
    os.replace(tmp, path)


def default_cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("IDATTN_CACHE", pathlib.Path.home() / ".cache" / "idattn"))


def load_tokenizer(spec: str, cache_dir: str | os.PathLike | None = None) -> Tokenizer:
    """Load a tokenizer from `spec` ("mistral" | path to a .model | "train:<vocab>" | "stdlib:<vocab>"); see the
    module docstring."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"data.tokenizer={spec!r}; expected 'mistral', a path to a SentencePiece .model file, "
                         "or 'train:<vocab>' (e.g. 'train:4096').")
    if spec == "mistral":
        path = mistral_model_path()
        return Tokenizer(path.read_bytes(), name="mistral")
    if spec.startswith("train:"):
        vocab = _spec_vocab(spec, "train", 4096)
        train_docs, _ = corpus.kjv_documents()
        path = _trained_model(f"kjv-bpe{vocab}", corpus.corpus_hash(train_docs), train_docs, vocab, cache_dir)
        return Tokenizer(path.read_bytes(), name=spec)
    if spec.startswith("stdlib:"):
        tok = train_stdlib_tokenizer(_spec_vocab(spec, "stdlib", 1024), cache_dir=cache_dir)
        tok.name = spec
        return tok
    path = pathlib.Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"data.tokenizer={spec!r}: no such file. Expected 'mistral', an existing "
                                "SentencePiece .model path, or 'train:<vocab>'.")
    return Tokenizer(path.read_bytes(), name=str(path))


# ------------------------------------------------------------ tokenizers of the inference commands
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
    return load_tokenizer(name)


def _bos(tok):
    b = getattr(tok, "bos_id", None)
    b = b() if callable(b) else b
    return None if b is None or b < 0 else int(b)


def encode(tok, text: str, add_bos: bool = True) -> list[int]:
    ids = list(tok.encode(text))
    bos = _bos(tok)
    return ([bos] if add_bos and bos is not None else []) + ids




def check_ids(ids, vocab_size: int, what: str = "prompt") -> None:
    bad = [i for i in ids if not 0 <= int(i) < vocab_size]
    if bad:
        raise ValueError(f"{what}: token ids {bad[:5]} outside the model vocabulary [0, {vocab_size}); the "
                         "tokenizer does not match the model (check --tokenizer)")


if __name__ == "__main__":  # the command reads inputs, which prepare does: it is prepare's (imports run one way)
    raise SystemExit("the tokenizer command is `python -m idattn.data.prepare tokenizer --source=<files|folder|glob|"
                     "hub id> --vocab=N --out=<file>.model` (the arguments of `train` here before)")


def stdlib_tokenizer_path(vocab_size: int = 1024, root: str | None = None,
                          cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Path of the SentencePiece model trained on the standard-library corpus's training files only
    (idattn.data.stdlib_corpus; trained and cached on first use, keyed by the training files' content hash, the
    vocabulary and the recipe). Also usable as `data.tokenizer=<path>`."""
    train, _ = stdlib_corpus.split(root)
    return _trained_model(f"stdlib-bpe{vocab_size}", stdlib_corpus.content_hash(train), [t for _, t in train],
                          vocab_size, cache_dir)


def _spec_vocab(spec: str, prefix: str, example: int) -> int:
    try:
        return int(spec.split(":", 1)[1])
    except ValueError:
        raise ValueError(f"data.tokenizer={spec!r}: the part after '{prefix}:' must be an integer vocabulary "
                         f"size, e.g. '{prefix}:{example}'.") from None


def _trained_model(stem: str, docs_hash: str, docs, vocab_size: int, cache_dir) -> pathlib.Path:
    """<cache>/<stem>-<key>.model, trained with the project's recipe on `docs` on first use; the key hashes the
    documents, the vocabulary and the recipe."""
    key = hashlib.sha256(f"{docs_hash}:{vocab_size}:{TRAIN_RECIPE}".encode()).hexdigest()[:16]
    cache = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir() / "tokenizers"
    path = cache / f"{stem}-{key}.model"
    if not path.is_file():
        train_sentencepiece(docs, vocab_size, model_prefix=str(path)[: -len(".model")])
    return path


def train_stdlib_tokenizer(vocab_size: int = 1024, root: str | None = None,
                           cache_dir: str | os.PathLike | None = None) -> "Tokenizer":
    """The Tokenizer of `stdlib_tokenizer_path` (the `stdlib:<vocab>` spec)."""
    path = stdlib_tokenizer_path(vocab_size, root, cache_dir)
    return Tokenizer(path.read_bytes(), name=f"stdlib:{vocab_size}")
