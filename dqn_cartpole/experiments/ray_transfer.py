"""A run folder as bytes and back: how a run made on another machine reaches the driver's sweep or study folder.

No file system is shared with the cluster's nodes. A worker packs the run folder it trained into an uncompressed
tar (its videos, plots and policies are compressed already, and its checkpoints barely compress) and returns the
bytes through Ray's object store; the driver unpacks them into a staging folder beside the run's place and swaps
it in, so the place holds either the old folder or the whole new one. A stopped run travels the other way to be
resumed. summary.json names its files by absolute path: those written on the worker are moved to the driver's
place (`relocate`), so the folder reads exactly as one trained here.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from typing import Any

from dqn_cartpole.run_folder import layout
from dqn_cartpole.run_folder.atomic import write_json_atomic

STAGING_DIR = ".incoming"  # inside the sweep or study folder; emptied by every command that uses it
# One run folder in the object store: a default run's is about 1-3 MB. A folder this large is refused (it would
# crowd the object store, 256 MB on a local instance) rather than shipped.
MAX_FOLDER_BYTES = 512 * 2**20


class FolderTooLarge(Exception):
    """A run folder over MAX_FOLDER_BYTES (raised on the worker; the run fails with this message)."""


def pack(folder: str) -> bytes:
    """The folder's contents as an uncompressed tar, names relative to the folder."""
    size = sum(os.path.getsize(os.path.join(root, name)) for root, _, files in os.walk(folder) for name in files)
    if size > MAX_FOLDER_BYTES:
        raise FolderTooLarge(f"the run folder holds {size / 2**20:.0f} MB, more than the "
                             f"{MAX_FOLDER_BYTES / 2**20:.0f} MB a run may send back (fewer checkpoints: "
                             f"training.keep_checkpoints)")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in sorted(os.listdir(folder)):
            tar.add(os.path.join(folder, name), arcname=name)
    return buffer.getvalue()


def unpack(data: bytes, folder: str) -> None:
    """Extracts `data` into `folder`, which must not exist yet (tarfile's "data" filter: no path leaves it)."""
    os.makedirs(folder)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(folder, filter="data")


def clear_staging(parent: str) -> None:
    """Removes what an interrupted command left in `parent`'s staging folder, and puts back a run folder that was
    set aside just before its replacement was swapped in."""
    folder = os.path.join(parent, STAGING_DIR)
    if not os.path.isdir(folder):
        return
    for name in os.listdir(folder):
        if name.endswith(".old"):
            target = os.path.join(parent, name[:-len(".old")])
            if not os.path.exists(target):
                os.rename(os.path.join(folder, name), target)
    shutil.rmtree(folder, ignore_errors=True)


def install(data: bytes, run_dir: str, written_at: str) -> None:
    """Puts the run folder in `data` (trained on a worker at `written_at`) at `run_dir`, replacing what was there."""
    parent, name = os.path.split(os.path.abspath(run_dir))
    stage = os.path.join(parent, STAGING_DIR)
    os.makedirs(stage, exist_ok=True)
    incoming, old = os.path.join(stage, name), os.path.join(stage, f"{name}.old")
    for leftover in (incoming, old):
        shutil.rmtree(leftover, ignore_errors=True)
    unpack(data, incoming)
    relocate(incoming, written_at, os.path.abspath(run_dir))
    if os.path.exists(run_dir):
        os.rename(run_dir, old)
    os.rename(incoming, run_dir)
    shutil.rmtree(old, ignore_errors=True)
    if not os.listdir(stage):
        os.rmdir(stage)


def relocate(folder: str, written_at: str, run_dir: str) -> None:
    """Rewrites the paths in `folder`'s summary.json that start with `written_at` to start with `run_dir`."""
    path = os.path.join(folder, layout.SUMMARY_FILE)
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as handle:
        summary = json.load(handle)
    write_json_atomic(path, _moved(summary, written_at.rstrip(os.sep), run_dir))


def _moved(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {key: _moved(item, old, new) for key, item in value.items()}
    if isinstance(value, list):
        return [_moved(item, old, new) for item in value]
    if isinstance(value, str) and (value == old or value.startswith(old + os.sep)):
        return new + value[len(old):]
    return value
