"""A role's files from a folder of its own node into the run folder, without a shared file system.

Under `--topology ray` a collector may run on any node, and the run folder is on the driver's. So a collector
writes into a node-local folder laid out like the run folder (its `roles/collector-I.csv`, its
`roles/collector-I.log`, its `tensorboard/collector-I/` events); its actor reads what is new there
(`FolderTail`, in the actor's process) and the driver appends it to the same paths in the run folder
(`RunFolderAppender`). Every file involved is append-only, so the run folder's copy is the concatenation of
what each of the collector's processes wrote, in order:

* text files (CSV, log) travel in whole lines; a CSV's header is kept only once, from the first process
  (each restarted process writes a fresh file, which starts with the same header);
* TensorBoard event files travel as bytes; each process writes its own file (the name holds its pid), so
  their records stay whole.

The driver asks for each file from the offset it has, so a reply lost with its actor is asked for again of
that file (a new process starts new files).
"""

from __future__ import annotations

import os
from typing import Optional

from dqn_cartpole.run_folder.layout import ROLES_DIR, TENSORBOARD_DIR

TEXT_SUFFIXES = (".csv", ".log")
MAX_CHUNK = 4 * 1024 * 1024  # bytes of one file per reply: a reply stays small, the rest comes next time
MIRRORED = (ROLES_DIR, TENSORBOARD_DIR)  # the run folder's sub-folders a node-local folder may write into


def node_local_files(root: str) -> list[str]:
    """The files under `root`'s mirrored sub-folders, as paths relative to `root` (no lock files)."""
    found = []
    for top in MIRRORED:
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if not name.endswith(".lock"):
                    found.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(found)


def read_new(root: str, offsets: dict) -> list[tuple[str, int, bytes]]:
    """(path, offset, data) of what each file under `root` holds past `offsets[path]` (0 if absent): whole lines
    of a text file, any bytes of another, up to MAX_CHUNK a file."""
    chunks = []
    for path in node_local_files(root):
        offset = int(offsets.get(path, 0))
        try:
            with open(os.path.join(root, path), "rb") as handle:
                handle.seek(offset)
                data = handle.read(MAX_CHUNK)
        except OSError:
            continue
        if path.endswith(TEXT_SUFFIXES):
            data = data[:data.rfind(b"\n") + 1]  # a line still being written comes next time
        if data:
            chunks.append((path, offset, data))
    return chunks


class RunFolderAppender:
    """The driver's end: appends each process's new bytes to the run folder's files."""

    def __init__(self, run_dir: str):
        self.run_dir = os.path.abspath(run_dir)
        self.offsets: dict = {}  # (process token, path) -> bytes taken so far

    def offsets_by_token(self) -> dict:
        """{token: {path: offset}}: what was taken from each process so far."""
        taken: dict = {}
        for (token, path), offset in self.offsets.items():
            taken.setdefault(token, {})[path] = offset
        return taken

    def append(self, token: str, chunks: list) -> None:
        for path, offset, data in chunks:
            if self.offsets.get((token, path), 0) != offset:
                continue  # a reply that crossed another: asked again from the right offset next time
            target = self.target(path)
            if target is None:
                continue
            self.offsets[(token, path)] = offset + len(data)
            if offset == 0 and path.endswith(".csv") and _has_content(target):
                data = data[data.find(b"\n") + 1:]  # the header is already there, from an earlier process
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "ab") as handle:
                handle.write(data)

    def target(self, path: str) -> Optional[str]:
        """`path` inside the run folder's mirrored sub-folders, or None (a path that would leave them)."""
        target = os.path.abspath(os.path.join(self.run_dir, path))
        allowed = tuple(os.path.join(self.run_dir, top) + os.sep for top in MIRRORED)
        return target if target.startswith(allowed) else None


def _has_content(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False
