"""A population folder: K seeds trained in one process (`training.population`), each into an ordinary run folder.

    POP/
      population.yaml   what the population is: its config (seed = the first seed's), its seeds, its members' folders
      checkpoints/      the population's checkpoints (every seed's weights, optimizer, replay, run state)
      run.lock          held by the process that trains it
      s0/ s1/ ...       the members' run folders (`train --population`); a sweep's members live beside POP instead

`train --resume POP` continues it (a manifest without a checkpoint starts from iteration 0): a sweep writes the
manifest and starts it that way. No TensorFlow here.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from typing import Optional, Sequence

import yaml

from dqn_cartpole.run_folder import layout
from dqn_cartpole.run_folder.atomic import write_text_atomic

MANIFEST_FILE = "population.yaml"
DONE_STATUSES = (0, 1)  # a member whose summary's exit status is one of these has ended (a stopped one resumes)


@dataclass(frozen=True)
class Manifest:
    """A population: its config (a dict, `training.seed` the first seed's), seeds and members' run folders (absolute,
    in the seeds' order)."""

    folder: str
    config: dict
    seeds: tuple
    members: tuple
    video_seeds: tuple  # the seeds whose run folders get the videos

    def member_config(self, index: int) -> dict:
        """Member `index`'s config: the population's with its own seed."""
        return {**self.config, "training": {**self.config["training"], "seed": self.seeds[index]}}


def manifest_path(folder: str) -> str:
    return os.path.join(folder, MANIFEST_FILE)


def is_population(folder: str) -> bool:
    return os.path.isfile(manifest_path(folder))


def checkpoints_dir(folder: str) -> str:
    return os.path.join(folder, layout.CHECKPOINTS_DIR)


def default_members(folder: str, seeds: Sequence[int]) -> list[str]:
    """`train --population`'s member folders: POP/s<seed>."""
    return [os.path.join(folder, f"s{seed}") for seed in seeds]


def write_manifest(folder: str, config: dict, seeds: Sequence[int], members: Sequence[str],
                   video_seeds: Sequence[int], command: Optional[str] = None) -> Manifest:
    """Writes POP/population.yaml (member folders relative to POP) and returns it."""
    os.makedirs(folder, exist_ok=True)
    data = {"seeds": list(seeds), "members": [os.path.relpath(m, folder) for m in members],
            "video_seeds": list(video_seeds), "created": dt.datetime.now().isoformat(timespec="seconds"),
            "command": command, "config": config}
    write_text_atomic(manifest_path(folder), yaml.safe_dump(data, sort_keys=False))
    return read_manifest(folder)


def read_manifest(folder: str) -> Manifest:
    with open(manifest_path(folder), encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    members = tuple(os.path.normpath(os.path.join(folder, m)) for m in data["members"])
    return Manifest(os.path.abspath(folder), data["config"], tuple(data["seeds"]), members,
                    tuple(data.get("video_seeds") or ()))


def member_finished(run_dir: str) -> bool:
    """Whether a member's run folder holds a finished run: its summary's exit status 0 (ended) or 1 (diverged or
    failed); a stopped one (130, 143) resumes."""
    from dqn_cartpole.run_folder.record import read_run

    if not os.path.isfile(os.path.join(run_dir, layout.SUMMARY_FILE)):
        return False
    return read_run(run_dir).get("exit_status") in DONE_STATUSES


def member_of(run_dir: str) -> Optional[str]:
    """The population folder a member run folder belongs to (its summary or config says so), else None."""
    parent = os.path.dirname(os.path.abspath(run_dir))
    for candidate in [parent] + [os.path.join(parent, name) for name in _listdir(parent)]:
        if is_population(candidate):
            try:
                if os.path.abspath(run_dir) in read_manifest(candidate).members:
                    return candidate
            except (OSError, KeyError, yaml.YAMLError):
                continue
    return None


def _listdir(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []
