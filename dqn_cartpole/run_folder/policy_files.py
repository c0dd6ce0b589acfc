"""A saved policy's files, without TensorFlow: finishing an interrupted swap, reading `policy_info.json`."""

from __future__ import annotations

import json
import os
import shutil
from typing import Optional

INFO_FILE = "policy_info.json"


def recover_policy(path: str) -> None:
    """Completes a swap that a crash interrupted (see `save_policy`)."""
    tmp, old = path + ".tmp", path + ".old"
    if os.path.exists(path) or not os.path.exists(old):
        return
    # `old` exists only once `tmp` was completely written, so `tmp` is the newer, whole policy.
    os.replace(tmp if os.path.exists(tmp) else old, path)
    shutil.rmtree(old, ignore_errors=True)


def read_info(path: str) -> Optional[dict]:
    """The `policy_info.json` of a saved policy, or None."""
    try:
        with open(os.path.join(path, INFO_FILE), encoding="utf-8") as handle:
            info = json.load(handle)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None
