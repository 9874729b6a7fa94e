"""Files an operator reads later are replaced whole or not at all (temp file + rename).

    write_text(path, text)            write_json(path, obj)            write_bytes(path, data)
    savefig(fig, path, dpi=...)       # a matplotlib figure
    with replacing(path) as tmp:      ...write tmp (e.g. fig.savefig(tmp))...   # renamed over `path` on success
    with Staged() as out:             out.path("a.md"), out.path("b.png") ...  # all renamed together, or none

A write that fails (a full disk, a read-only folder, a quota) leaves the previous file whole and removes its
temporary file; the error is re-raised as `WriteFailed`, an `OSError` whose message is one line naming the file
and the reason. The temporary file sits in the target's folder (a rename within one filesystem is atomic) and keeps
the target's suffix (matplotlib and others choose the format from it). Contents are flushed and fsynced before the
rename, so a crash after it cannot leave an empty file under the final name.

One copy stays elsewhere on purpose: ``idattn.data.tokenizer.atomic_write`` (the tokenizer cache), because that
file's code is part of the training-code hash every recorded study run carries (idattn.studies.code_hash): an
edit of it would mark every run of the reproduction as trained with other code.
"""
from __future__ import annotations

import contextlib
import json
import os
import uuid
from typing import Any, Iterator


class WriteFailed(OSError):
    """A file could not be written; the previous version (if any) is unchanged. str(): the one-line message."""

    def __str__(self) -> str:
        return str(self.strerror)


def _tmp_name(path: str) -> str:
    folder, name = os.path.split(os.path.abspath(path))
    stem, ext = os.path.splitext(name)
    return os.path.join(folder, f".{stem}.tmp-{uuid.uuid4().hex[:8]}{ext}")


def _fsync(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _failed(path: str, e: BaseException) -> WriteFailed:
    text = str(e).strip()
    reason = getattr(e, "strerror", None) or (text.splitlines()[0] if text else type(e).__name__)
    return WriteFailed(getattr(e, "errno", None) or 0, f"could not write {path}: {type(e).__name__}: {reason}; the "
                                                       f"previous file (if any) is unchanged")


@contextlib.contextmanager
def replacing(path: str, *, mode: int = 0o644) -> Iterator[str]:
    """Yields a temporary path beside `path`; when the block ends without an error it is renamed over `path`
    (fsynced first). On any error the temporary file is removed and `path` keeps its previous content."""
    tmp = _tmp_name(path)
    try:
        yield tmp
        if not os.path.exists(tmp):
            raise FileNotFoundError(f"nothing was written to the temporary file {tmp}")
        _fsync(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, WriteFailed):
            raise _failed(path, e) from e
        raise


def write_bytes(path: str, data: bytes) -> str:
    with replacing(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return path


def write_text(path: str, text: str) -> str:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str, obj: Any, **dump_kw) -> str:
    return write_text(path, json.dumps(obj, **dump_kw))


def savefig(fig, path: str, **kw) -> str:
    """`fig.savefig(path, **kw)`, replacing `path` whole (a plot cut by a full disk never replaces a good one)."""
    with replacing(path) as tmp:
        fig.savefig(tmp, **kw)
    return path


class Staged:
    """Several outputs that must agree (a table and its plots): each is written to its own temporary file, and
    only when every one was written are they renamed over their targets, one after another. If any write fails,
    every temporary file is removed and every target keeps its previous content.

        with Staged() as out:
            write(out.path(table_md)); fig.savefig(out.path(plot_png))
    """

    def __init__(self):
        self._pending: list[tuple[str, str]] = []

    def path(self, target: str) -> str:
        tmp = _tmp_name(target)
        self._pending.append((tmp, target))
        return tmp

    def __enter__(self) -> "Staged":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc is None:
                for tmp, target in self._pending:
                    if not os.path.exists(tmp):
                        raise FileNotFoundError(f"nothing was written to the temporary file {tmp}")
                    _fsync(tmp)
                    os.chmod(tmp, 0o644)
                for tmp, target in self._pending:
                    os.replace(tmp, target)
        except OSError as e:
            failed = next((t for tmp, t in self._pending if os.path.exists(tmp)), self._pending[0][1])
            self._cleanup()
            raise _failed(failed, e) from e
        if exc is not None:
            self._cleanup()
            if isinstance(exc, OSError) and not isinstance(exc, WriteFailed):
                # the output being written when it failed is the last one asked for
                raise _failed(self._pending[-1][1] if self._pending else "the staged outputs", exc) from exc
        return False

    def _cleanup(self) -> None:
        for tmp, _ in self._pending:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
