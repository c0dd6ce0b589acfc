"""Checkpoints that survive a crash at any moment, and finding the newest good one on resume.

One checkpoint is one folder under `RUN/checkpoints/`:

    ckpt-0000005000/            the iteration is in the name
      tf/ckpt.index, tf/ckpt.data-00000-of-00001
                                a `tf.train.Checkpoint` of the agent (Q-network, target network,
                                optimizer slots and step, train-step counter, hence the epsilon
                                schedule), the env-step metric and, for `tf_uniform` and
                                `py_uniform`, the replay buffer's contents
      reverb/<timestamp>/       Reverb's own checkpoint of the table (backend `reverb` only)
      metrics/*.csv             the metrics CSVs as they were at this checkpoint
      state.json                the loop: iteration, best return so far, RNG states, wall time, config
      MANIFEST.json             written last: every file above with its size and SHA-256
    ckpt-0000010000.<pid>-<hex>.tmp/
                                being written, or left behind by a crash: never read
    ckpt-0000005000.damaged/    set aside on resume (a failed checksum): the newest one is kept for a look
    reverb-server/              where the Reverb server writes (and, on resume, loads) its checkpoint

A checkpoint is written into a temporary folder of a name unique to the write (`atomic.replacing_dir`),
every file is fsync'ed, then the folder is renamed to `ckpt-N` (a single atomic rename). A SIGKILL at
any moment therefore leaves either the old set of checkpoints or the old set plus the new one. On resume the newest folder whose manifest
checks out is used; partial (`.tmp`) and damaged ones are reported on one line each and set
aside. The newest `keep` complete checkpoints are kept, and the newest `.damaged` one; older `.damaged` ones and
`.old` ones whose replacement is complete are removed.

Reverb writes its table checkpoint into the server's own folder (`reverb-server/<timestamp>/`, a `DONE` file
last); the writer moves it into the temporary checkpoint folder before that folder is renamed, and removes
the tables an interrupted write left there (no `DONE`), so no partial table outlives the next checkpoint.

This module imports TensorFlow only inside `CheckpointWriter`, so the CLI can look for a
usable checkpoint before any heavy import.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from typing import Any, Optional

from dqn_cartpole.console import quiet
from dqn_cartpole.run_folder.atomic import OLD_SUFFIX, TMP_SUFFIX, replacing, replacing_dir
from dqn_cartpole.run_folder.layout import CHECKPOINTS_DIR

FORMAT = 1
PREFIX = "ckpt-"
DAMAGED_SUFFIX = ".damaged"
MANIFEST_FILE = "MANIFEST.json"
STATE_FILE = "state.json"
TF_PREFIX = os.path.join("tf", "ckpt")
REVERB_DIR = "reverb"
METRICS_DIR = "metrics"
REVERB_SERVER_DIR = "reverb-server"
REVERB_DONE_FILE = "DONE"  # Reverb writes it last into each table checkpoint
_NAME = re.compile(r"^ckpt-(\d+)$")
_OLD_NAME = re.compile(r"^ckpt-(\d+)(?:\.[0-9a-f-]+)?\.old$")  # being replaced by a newer write of the iteration
_DAMAGED_NAME = re.compile(r"^ckpt-(\d+).*\.damaged$")

# Config keys a resumed run cannot change: they fix the shapes of what the checkpoint holds
# (env spaces, network weights, replay storage and sequence length) or the run's identity.
FROZEN_SECTIONS = ("env", "network")
FROZEN_KEYS = (("agent", "n_step"), ("replay", "backend"), ("replay", "capacity"), ("training", "seed"),
               ("distributed", "replay"), ("replay", "prioritized"), ("replay", "priority_exponent"))

TEST_KILL_ENV = "DQN_CARTPOLE_TEST_KILL"


class CheckpointError(Exception):
    """A checkpoint cannot be used; the message is one line."""


class DiskFullError(Exception):
    """The disk filled up while the run was writing; the message is one line."""


def is_disk_full(exc: BaseException) -> bool:
    """True for ENOSPC/EDQUOT from Python, and for TensorFlow's and Reverb's wording of it."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


def crash_point(stage: str) -> None:
    """Test hook: SIGKILLs this process at the n-th time it reaches `stage`.

    `DQN_CARTPOLE_TEST_KILL=checkpoint-write:2` kills during the second checkpoint write, after
    the TensorFlow files are on disk and before the folder is renamed. Does nothing unless set.
    """
    spec = os.environ.get(TEST_KILL_ENV)
    if not spec:
        return
    counts = crash_point.__dict__.setdefault("counts", {})
    counts[stage] = counts.get(stage, 0) + 1
    for item in spec.split(","):
        name, _, nth = item.partition(":")
        if name == stage and counts[stage] == int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------------------- finding checkpoints


def checkpoint_name(iteration: int) -> str:
    return f"{PREFIX}{iteration:010d}"


@dataclass(frozen=True)
class Found:
    """A checkpoint whose manifest checks out."""

    path: str
    iteration: int
    state: dict

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def tf_prefix(self) -> str:
        return os.path.join(self.path, TF_PREFIX)

    @property
    def finished(self) -> bool:
        return bool(self.state.get("finished"))


@dataclass(frozen=True)
class Bad:
    """A partial or damaged checkpoint, and why it cannot be used."""

    path: str
    reason: str

    @property
    def partial(self) -> bool:
        return self.path.endswith(TMP_SUFFIX)


@dataclass(frozen=True)
class ResumePlan:
    """What `--resume` found: the checkpoint to continue from (None: start again) and the unusable ones."""

    found: Optional[Found]
    bad: tuple = ()


def plan_resume(run_dir: str) -> ResumePlan:
    """Picks the newest usable checkpoint of a run folder (no TensorFlow needed)."""
    good, bad = scan(os.path.join(run_dir, CHECKPOINTS_DIR))
    return ResumePlan(good[0] if good else None, tuple(bad))


def scan(root: str) -> tuple[list[Found], list[Bad]]:
    """Every checkpoint under `root`: usable ones newest first, then partial or damaged ones."""
    good: list[Found] = []
    bad: list[Bad] = []
    if not os.path.isdir(root):
        return good, bad
    for name in sorted(os.listdir(root), reverse=True):
        path = os.path.join(root, name)
        if name.startswith(PREFIX) and name.endswith(TMP_SUFFIX):
            bad.append(Bad(path, "partial: the process stopped while writing it"))
            continue
        match = _NAME.match(name) or _OLD_NAME.match(name)
        if not match or not os.path.isdir(path):
            continue
        if name.endswith(OLD_SUFFIX) and os.path.isdir(os.path.join(root, checkpoint_name(int(match.group(1))))):
            continue  # the replacement is complete; the old one is only left over
        try:
            state = verify(path)
        except CheckpointError as exc:
            bad.append(Bad(path, str(exc)))
            continue
        if state.get("iteration") != int(match.group(1)):
            bad.append(Bad(path, f"damaged: state.json says iteration {state.get('iteration')}"))
            continue
        good.append(Found(path, int(match.group(1)), state))
    good.sort(key=lambda f: f.iteration, reverse=True)
    return good, bad


def verify(path: str) -> dict:
    """Checks every file against the manifest; returns state.json. Raises CheckpointError."""
    try:
        with open(os.path.join(path, MANIFEST_FILE), encoding="utf-8") as handle:
            manifest = json.load(handle)
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not isinstance(files, dict) or STATE_FILE not in files:
            raise ValueError("unknown manifest format")
    except FileNotFoundError:
        raise CheckpointError("damaged: no MANIFEST.json") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"damaged: unreadable MANIFEST.json ({_first_line(exc)})") from None
    for rel, expected in files.items():
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            raise CheckpointError(f"damaged: {rel} is missing")
        if os.path.getsize(full) != expected.get("size"):
            raise CheckpointError(f"damaged: {rel} has {os.path.getsize(full)} bytes, expected {expected.get('size')}")
        if _sha256(full) != expected.get("sha256"):
            raise CheckpointError(f"damaged: {rel} does not match its checksum")
    return read_state(path)


def read_state(path: str) -> dict:
    """A checkpoint's state.json (the loop's state at that checkpoint). Raises CheckpointError."""
    try:
        with open(os.path.join(path, STATE_FILE), encoding="utf-8") as handle:
            state = json.load(handle)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"damaged: unreadable state.json ({_first_line(exc)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError("written by an incompatible version (state.json format)")
    return state


def set_aside(bad: list[Bad]) -> None:
    """Deletes partial checkpoints and renames damaged ones to `<name>.damaged` (the newest kept for a look)."""
    for item in bad:
        if item.partial:
            shutil.rmtree(item.path, ignore_errors=True)
        elif not item.path.endswith(DAMAGED_SUFFIX):
            target = item.path + DAMAGED_SUFFIX
            shutil.rmtree(target, ignore_errors=True)
            os.replace(item.path, target)
    if bad:
        prune_set_aside(os.path.dirname(bad[0].path))


def prune_set_aside(root: str) -> None:
    """Removes what no resume reads: `.old` checkpoints whose replacement is complete, and every `.damaged` one
    but the newest (a user may want to look at what went wrong)."""
    names = os.listdir(root) if os.path.isdir(root) else []
    for name in names:
        match = _OLD_NAME.match(name)
        if match and os.path.isdir(os.path.join(root, checkpoint_name(int(match.group(1))))):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    damaged = sorted((int(m.group(1)), name) for name in names for m in [_DAMAGED_NAME.match(name)] if m)
    for _, name in damaged[:-1]:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def frozen_changes(old: dict, new: dict) -> list[str]:
    """`section.key (old -> new)` for every frozen key that differs between two config dicts."""
    keys = [(section, key) for section in FROZEN_SECTIONS
            for key in sorted(set(old.get(section, {})) | set(new.get(section, {})))] + list(FROZEN_KEYS)
    out = []
    for section, key in keys:
        if key not in old.get(section, {}):
            continue  # a key the run's version did not write yet (it ran with that key's old behaviour)
        before, after = old.get(section, {}).get(key), new.get(section, {}).get(key)
        if _plain(before) != _plain(after):
            out.append(f"{section}.{key} ({_show(before)} -> {_show(after)})")
    return out


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _show(value: Any) -> str:
    return json.dumps(_plain(value))


# ---------------------------------------------------------------------------- writing


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def dir_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, files in os.walk(path) for name in files)


@dataclass(frozen=True)
class Saved:
    """One written checkpoint: where, how big, how long it took."""

    path: str
    iteration: int
    bytes: int
    seconds: float


class CheckpointWriter:
    """Saves and restores a run's trainable state under `root` (RUN/checkpoints): the agent's (a `ValueAgent`)
    `checkpoint_objects()`, the env-step counter and the replay (a uniform buffer's variables, or Reverb's table
    checkpoint). The agent builds its optimizer's slots itself, so a restore fills them at once."""

    def __init__(self, root: str, agent: Any, env_steps: Any, replay: Any, keep: int):
        import tensorflow as tf

        self.root, self.agent, self.replay, self.keep = root, agent, replay, keep
        objects = {**agent.checkpoint_objects(), "env_steps": env_steps}
        self.reverb = replay.backend == "reverb"
        if not self.reverb:
            objects["replay"] = replay.buffer  # TFUniformReplayBuffer variables / PyUniform's NumpyState
        objects.update(replay.priority_trackables())  # prioritized replay: the largest priority seen (Reverb)
        self._checkpoint = tf.train.Checkpoint(**objects)
        self._agent_only = tf.train.Checkpoint(**agent.checkpoint_objects())

    # -- saving
    def save(self, iteration: int, state: dict, metrics: dict[str, str]) -> Saved:
        """Writes checkpoint `iteration`; `metrics` maps CSV names to paths copied in as they are."""
        started = time.perf_counter()
        final = os.path.join(self.root, checkpoint_name(iteration))
        try:
            # The same iteration again keeps the old one (`ckpt-N.<token>.old`) until the new one is in place.
            with replacing_dir(final, between=lambda: crash_point("checkpoint-rename")) as tmp:
                self.write_files(tmp, iteration, state, metrics)
        except BaseException as exc:
            if is_disk_full(exc):
                raise DiskFullError(f"disk full while writing checkpoint {final} (no space left on device)") from None
            raise
        self.prune()
        return Saved(final, iteration, dir_size(final), time.perf_counter() - started)

    def write_files(self, tmp: str, iteration: int, state: dict, metrics: dict[str, str]) -> None:
        """Everything of checkpoint `iteration` into the folder `tmp`, the manifest last."""
        os.makedirs(os.path.join(tmp, METRICS_DIR))
        self._checkpoint.write(os.path.join(tmp, TF_PREFIX))
        crash_point("checkpoint-write")
        if self.reverb:
            with quiet.NativeStderrFilter():
                written = self.replay.checkpoint().rstrip("/")
            os.makedirs(os.path.join(tmp, REVERB_DIR))
            os.replace(written, os.path.join(tmp, REVERB_DIR, os.path.basename(written)))
            discard_unfinished_tables(os.path.dirname(written), os.path.basename(written))
        for name, path in metrics.items():
            if os.path.exists(path):
                shutil.copyfile(path, os.path.join(tmp, METRICS_DIR, name))
        with open(os.path.join(tmp, STATE_FILE), "w", encoding="utf-8") as handle:
            json.dump(dict(state, format=FORMAT, iteration=iteration), handle, indent=1)
        files = {}
        for folder, _, names in os.walk(tmp):
            for name in names:
                full = os.path.join(folder, name)
                files[os.path.relpath(full, tmp)] = {"size": os.path.getsize(full), "sha256": _sha256(full)}
        with open(os.path.join(tmp, MANIFEST_FILE), "w", encoding="utf-8") as handle:
            json.dump({"format": FORMAT, "iteration": iteration, "files": files}, handle, indent=1)

    def prune(self) -> None:
        """Keeps the newest `keep` complete checkpoints; removes older ones, stale partial ones and what
        `prune_set_aside` removes. (This process holds the run's lock: no other writes here.)"""
        names = sorted(n for n in os.listdir(self.root) if _NAME.match(n))
        for name in names[:-self.keep]:
            shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        for name in os.listdir(self.root):
            if name.startswith(PREFIX) and name.endswith(TMP_SUFFIX):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        prune_set_aside(self.root)

    # -- restoring
    def restore(self, found: Found) -> None:
        """Loads everything but Reverb's table (the server loaded that when it started)."""
        try:
            self._checkpoint.read(found.tf_prefix).assert_consumed()
        except Exception as exc:  # pylint: disable=broad-except
            raise CheckpointError(f"cannot restore {found.path}: {_first_line(exc)}") from None

    def restore_agent(self, tf_prefix: str) -> None:
        """Loads only the agent's variables (after a divergence, to export the last good policy)."""
        self._agent_only.read(tf_prefix).expect_partial()


def discard_unfinished_tables(server_dir: str, newest: str) -> None:
    """Removes the table checkpoints the server began before `newest` (its names are timestamps) and never
    finished (no DONE file): a write that was interrupted. The server writes one at a time, so none of them is
    still being written; a later one may be (the server's own timer), and is left alone."""
    for name in os.listdir(server_dir) if os.path.isdir(server_dir) else []:
        path = os.path.join(server_dir, name)
        if name < newest and os.path.isdir(path) and not os.path.exists(os.path.join(path, REVERB_DONE_FILE)):
            shutil.rmtree(path, ignore_errors=True)


def reverb_server_dir(root: str) -> str:
    return os.path.join(root, REVERB_SERVER_DIR)


def stage_reverb(root: str, found: Optional[Found]) -> str:
    """Empties the Reverb server's checkpoint folder and copies `found`'s table into it.

    Reverb loads the newest checkpoint in that folder when the server starts; a fresh run
    starts from an empty folder. Returns the folder.
    """
    server_dir = reverb_server_dir(root)
    shutil.rmtree(server_dir, ignore_errors=True)
    os.makedirs(server_dir)
    if found is not None:
        source = os.path.join(found.path, REVERB_DIR)
        if not os.path.isdir(source) or not os.listdir(source):
            raise CheckpointError(f"{found.path}: holds no Reverb table to restore")
        for name in os.listdir(source):
            shutil.copytree(os.path.join(source, name), os.path.join(server_dir, name))
    return server_dir


def restage_newest_table(root: str) -> Optional[str]:
    """Before a server that holds the replay starts again within a run (Ray restarts it on its port): Reverb loads
    the newest complete table checkpoint in the server's folder, but each learner checkpoint moved the table it wrote
    into `ckpt-N/reverb/`, so the folder may hold none (the server would start empty) or only an older one of its
    timer's. Copies the newest usable checkpoint's table in when it is newer (its name is a timestamp) than every
    complete one there, through a folder beside it and one rename; returns the checkpoint's name, or None."""
    server_dir = reverb_server_dir(root)
    present = [name for name in os.listdir(server_dir) if os.path.exists(os.path.join(server_dir, name,
                                                                                        REVERB_DONE_FILE))]
    good, _ = scan(root)
    source = os.path.join(good[0].path, REVERB_DIR) if good else None
    tables = sorted(os.listdir(source)) if source and os.path.isdir(source) else []
    if not tables or (present and max(present) >= tables[-1]):
        return None
    staging = server_dir + ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(os.path.join(source, tables[-1]), staging)
    os.rename(staging, os.path.join(server_dir, tables[-1]))
    return os.path.basename(good[0].path)


def restore_metrics(found: Found, paths: dict[str, str]) -> None:
    """Puts back each metrics CSV as it was at the checkpoint (rows written after it are dropped)."""
    for name, path in paths.items():
        source = os.path.join(found.path, METRICS_DIR, name)
        if os.path.exists(source):
            with replacing(path) as tmp:
                shutil.copyfile(source, tmp)
        elif os.path.exists(path):
            os.remove(path)
