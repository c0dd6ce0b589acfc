"""Every atomic write of the package: a reader never sees half a file or half a folder.

A file (`replacing`, `write_text_atomic`, `write_json_atomic`) or a folder (`replacing_dir`: a SavedModel, a
checkpoint) is written under a temporary name unique to the call, in the same folder, fsync'ed, then renamed
into place. `recover_dir` finishes a folder swap that a crash interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from typing import Any, Callable, Iterator, Optional

TMP_SUFFIX = ".tmp"
OLD_SUFFIX = ".old"


def unique_token() -> str:
    """A name part no other call (in this process or another) uses: the pid and 8 random hex digits."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


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
    tmp = f"{path}.{unique_token()}{suffix}"
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def fsync_tree(path: str) -> None:
    """fsyncs every file and folder under `path`, then `path`'s parent, so a rename is durable."""
    for folder, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


@contextlib.contextmanager
def replacing_dir(path: str, between: Optional[Callable[[], None]] = None) -> Iterator[str]:
    """Yields a new empty folder next to `path`, `path.<token>.tmp`; when the block ends without error, fsyncs
    everything in it and swaps it in: an existing `path` is renamed to `path.<token>.old`, the new folder to
    `path`, then the old one is removed.

    `between` runs between the two renames (a test's crash point). A crash there leaves no `path`, the `.old`
    and the complete `.tmp` of the same token: `recover_dir` finishes the swap. On error the temporary folder is
    removed and `path` is left as it was.
    """
    token = unique_token()
    tmp, old = f"{path}.{token}{TMP_SUFFIX}", f"{path}.{token}{OLD_SUFFIX}"
    os.makedirs(tmp)
    try:
        yield tmp
        fsync_tree(tmp)
        if os.path.exists(path):
            os.replace(path, old)
        if between is not None:
            between()
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.exists(old) and not os.path.exists(path):
            os.replace(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)


def recover_dir(path: str, remove_leftovers: bool = False) -> None:
    """Completes a `replacing_dir` swap that a crash interrupted: with no `path`, the newest `.tmp` whose `.old`
    exists (the `.old` is renamed only once its `.tmp` is complete) becomes `path`, else that `.old` does.
    Folders of older versions (`path.tmp`, `path.old`) count too. With `remove_leftovers` (no writer running),
    every other `.tmp` and `.old` of `path` is removed."""
    folder, base = os.path.split(os.path.abspath(path))
    if not os.path.isdir(folder):
        return
    leftovers = [n for n in os.listdir(folder) if n.startswith(base + ".") and n.endswith((TMP_SUFFIX, OLD_SUFFIX))]
    olds = sorted((n for n in leftovers if n.endswith(OLD_SUFFIX)), key=lambda n: os.path.getmtime(
        os.path.join(folder, n)))
    if not os.path.exists(path) and olds:
        old = olds[-1]
        tmp = old[:-len(OLD_SUFFIX)] + TMP_SUFFIX
        os.replace(os.path.join(folder, tmp if tmp in leftovers else old), path)
        shutil.rmtree(os.path.join(folder, old), ignore_errors=True)
    if remove_leftovers:
        for name in leftovers:
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def write_text_atomic(path: str, text: str) -> None:
    with replacing(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())


def write_json_atomic(path: str, data: Any, indent: int = 2) -> None:
    write_text_atomic(path, json.dumps(data, indent=indent) + "\n")
