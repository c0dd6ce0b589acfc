"""Finding and creating run folders: where a new run goes, which policy a path means.

The rules a user meets: an existing run is never replaced without `--overwrite`, a folder that
is not a run is never deleted, and one process at a time works in a run folder.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
from typing import Any, Iterator, Optional

from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder import layout
from dqn_cartpole.run_folder.lock import RunLock, lock_run
from dqn_cartpole.run_folder.policy_files import recover_policy


def is_run_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, layout.CONFIG_FILE))


def resolve_run_dir(config: Any, output_dir: Optional[str], overwrite: bool) -> str:
    """The run folder: `output_dir`, else output.root/output.run_name, else a fresh timestamped name.

    Checks, without touching anything, that it can be used (`config` may be None with `output_dir`).
    """
    if output_dir:
        path = output_dir
    elif config.output.run_name:
        path = os.path.join(config.output.root, config.output.run_name)
    else:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        base = os.path.join(config.output.root, f"{config.env.id}__s{config.training.seed}__{stamp}")
        path, n = base, 1
        while os.path.exists(path):
            n += 1
            path = f"{base}-{n}"
    if os.path.isfile(path):
        raise UserError(f"{path}: is a file, not a folder; choose another --output-dir")
    if os.path.isdir(path) and os.listdir(path):
        if not overwrite:
            raise UserError(f"{path}: already holds a run; pass --overwrite to replace it, --resume {path} to "
                            f"continue it, or choose another --output-dir")
        if not is_run_folder(path):
            raise UserError(f"{path}: holds files but is not a run folder (no {layout.CONFIG_FILE}); refusing to "
                            f"delete it, even with --overwrite")
    check_can_create(path)
    return path


def check_can_create(path: str, label: str = "") -> None:
    """Checks, without creating anything, that `path`'s missing folders can be made: the nearest existing
    ancestor is a folder this process may write in. `label` (e.g. "--storage ") prefixes the one-line error."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe != os.path.abspath(path) and not os.path.isdir(probe):
        raise UserError(f"{label}{path}: {probe} is a file, not a folder")
    if not os.access(probe if os.path.isdir(probe) else os.path.dirname(probe), os.W_OK):
        raise UserError(f"{label}{path}: cannot write there (no permission on {probe})")


def check_recording_path(output: str, overwrite: bool, output_arg: str = "--output",
                         overwrite_arg: str = "--overwrite") -> None:
    """A recording loses no file: an existing `output` is replaced only with `overwrite`, a folder never, and a file in
    a run folder (one with config.yaml, at any depth above it) only in that run's videos/: its config, checkpoints,
    policies and metrics are what resume, report and compare read. One line (UserError) otherwise."""
    if os.path.isdir(output):
        raise UserError(f"{output_arg} {output}: is a folder; give an .mp4 file name")
    run = enclosing_run_folder(output)
    if run is not None:
        videos = os.path.join(run, layout.VIDEOS_DIR)
        if os.path.dirname(os.path.realpath(output)) != videos:
            raise UserError(f"{output_arg} {output}: is in the run folder {run}; a recording goes in its "
                            f"{layout.VIDEOS_DIR}/ or outside the run, never among the run's own files")
    if os.path.lexists(output) and not overwrite:
        raise UserError(f"{output_arg} {output}: exists; pass {overwrite_arg} to replace it, or give another name")


def enclosing_run_folder(path: str) -> Optional[str]:
    """The run folder `path` (a file, existing or not) would be written in, at any depth (symbolic links resolved);
    None when no folder above it is one."""
    folder = os.path.dirname(os.path.realpath(path))
    while True:
        if is_run_folder(folder):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def create_run_dir(path: str, overwrite: bool, beside_roles: bool = False) -> tuple[bool, RunLock]:
    """Creates (or, with `overwrite`, empties) the run folder and locks it for this process (`lock.lock_run`).

    Returns whether the folder is new, and the lock to keep open while the run lives. A folder
    in use by another process is refused before anything in it is touched.
    """
    existed = os.path.isdir(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{path}: cannot create the run folder: {exc.strerror}") from None
    lock = lock_run(path, beside_roles)
    if existed and overwrite:
        for name in os.listdir(path):
            if name not in (layout.LOCK_FILE, layout.ROLES_LOCK_FILE):
                target = os.path.join(path, name)
                if os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target)
                else:
                    os.remove(target)
        existed = False
    return not existed, lock


@contextlib.contextmanager
def removed_on_bad_input(path: str, created: bool) -> Iterator[None]:
    """Bad input (a UserError) in the block leaves no run folder behind where this command `created` it."""
    try:
        yield
    except UserError:
        if created:
            shutil.rmtree(path, ignore_errors=True)
        raise


def resolve_policy(path: str, final: bool = False) -> tuple[str, Optional[str]]:
    """Returns (policy folder, run folder or None) for a run folder or a policy folder.

    A run folder means its `policy/best` (or `policy/final` with `final`), falling back to the other.
    """
    if not os.path.exists(path):
        raise UserError(f"{path}: no such run or policy folder")

    def run_of(folder: str) -> Optional[str]:
        return folder if is_run_folder(folder) else None

    if os.path.exists(os.path.join(path, "saved_model.pb")):
        parent = os.path.dirname(os.path.abspath(path))
        return path, run_of(parent) or run_of(os.path.dirname(parent))
    order = (layout.FINAL_POLICY, layout.BEST_POLICY) if final else (layout.BEST_POLICY, layout.FINAL_POLICY)
    for base, run in ((os.path.join(path, layout.POLICY_DIR), path), (path, os.path.dirname(os.path.abspath(path)))):
        for name in order:
            candidate = os.path.join(base, name)
            recover_policy(candidate)
            if os.path.exists(os.path.join(candidate, "saved_model.pb")):
                return candidate, run_of(run)
    raise UserError(f"{path}: not a run folder or a saved policy (no saved_model.pb)")
