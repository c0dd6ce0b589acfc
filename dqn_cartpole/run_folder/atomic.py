"""Writes a reader never sees half of: a temporary name in the same folder, fsync, then one rename."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from typing import Any, Iterator


def fsync_dir(path: str) -> None:
    """Makes a rename inside `path` durable (best effort: some filesystems refuse)."""
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


@contextlib.contextmanager
def replacing(path: str, suffix: str = ".tmp") -> Iterator[str]:
    """Yields a temporary path next to `path`; when the block ends without error, renames it to `path`.

    `suffix` keeps the extension writers look at (e.g. ".tmp.png" for matplotlib, ".tmp.mp4" for
    ffmpeg). The temporary name is unique to this call, so two processes replacing the same file (two
    tune workers redrawing a study's plots) each rename a whole file of their own: the last one wins.
    On error the temporary file is removed and `path` is left as it was.
    """
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}{suffix}"
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_text_atomic(path: str, text: str) -> None:
    with replacing(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())


def write_json_atomic(path: str, data: Any, indent: int = 2) -> None:
    write_text_atomic(path, json.dumps(data, indent=indent) + "\n")
