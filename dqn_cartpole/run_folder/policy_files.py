"""A saved policy's files, without TensorFlow: finishing an interrupted swap, reading `policy_info.json`."""

from __future__ import annotations

import json
import os
from typing import Optional

from dqn_cartpole.run_folder.atomic import recover_dir

INFO_FILE = "policy_info.json"


def recover_policy(path: str, remove_leftovers: bool = False) -> None:
    """Completes a swap that a crash interrupted (see `export.save_policy`); `remove_leftovers` when no process
    writes the policy (see `atomic.recover_dir`)."""
    recover_dir(path, remove_leftovers)


def read_info(path: str) -> Optional[dict]:
    """The `policy_info.json` of a saved policy, or None."""
    try:
        with open(os.path.join(path, INFO_FILE), encoding="utf-8") as handle:
            info = json.load(handle)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None
