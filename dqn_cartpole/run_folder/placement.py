"""`roles/placement.json`: where each role of a distributed run runs now, and where it ran before.

Written (atomically) by the command that supervises the roles each time one is placed or ends, so it is
current as roles move (a collector restarted on another node, a learner restarted from its checkpoint); a resumed
run goes on from its record (`restarts` counts the run's restarts, over every command that ran it):

    {"topology": "ray", "updated_unix_s": 1795628352.4,
     "roles": {"collector 1": {"node_ip": "10.0.0.3", "node_id": "8f...", "pid": 4242, "worker_pid": 4240,
                               "restarts": 1, "state": "running", "since_unix_s": 1795628350.1,
                               "before": [{"node_ip": "10.0.0.2", "node_id": "3c...", "pid": 4101,
                                           "ended": "was lost", ...}]}}}

`pid` is the role's own process (`python -m dqn_cartpole collect ...`); `worker_pid` the Ray worker that holds it
(ray only). Read without TensorFlow (the report shows it).
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional

from dqn_cartpole.run_folder.atomic import write_json_atomic
from dqn_cartpole.run_folder.layout import RunLayout

KEEP_BEFORE = 10  # earlier placements kept per role


class PlacementRecord:
    """The record of one topology's roles, rewritten whole at each change."""

    def __init__(self, run_dir: str, topology: str):
        """A resumed run's record goes on from the one on disk: where its roles ran before, and their restarts."""
        self.path = RunLayout(run_dir).placement
        earlier = read_placement(run_dir) or {"roles": {}}
        self.base = {role: int(entry.get("restarts", 0)) for role, entry in earlier["roles"].items()}
        self.data = {"topology": topology, "updated_unix_s": time.time(), "roles": earlier["roles"]}

    def placed(self, role: str, where: dict, restarts: int) -> None:
        """`role` runs now at `where` (node_ip, pid, ...), after `restarts` restarts in this command."""
        roles = self.data["roles"]
        previous = roles.get(role)
        before = list(previous.get("before", [])) if previous else []
        if previous and previous.get("pid") is not None:
            before.append({key: previous.get(key) for key in ("node_ip", "node_id", "pid", "since_unix_s", "ended")})
        state = "running" if where.get("pid") is not None else "starting"  # never running without a process
        roles[role] = {**where, "restarts": self.base.get(role, 0) + restarts, "state": state,
                       "since_unix_s": round(time.time(), 1), "before": before[-KEEP_BEFORE:]}
        self.write()

    def ended(self, role: str, how: str) -> None:
        """`role`'s process ended (`how`: e.g. "exited with status 0", "was killed by SIGKILL")."""
        entry = self.data["roles"].get(role)
        if entry is None:
            return
        entry["state"], entry["ended"] = "ended", how
        self.write()

    def write(self) -> None:
        self.data["updated_unix_s"] = round(time.time(), 1)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_json_atomic(self.path, self.data)


def read_placement(run_dir: str) -> Optional[dict]:
    """The run's placement record, or None (a single-process run, or an unreadable file)."""
    try:
        with open(RunLayout(run_dir).placement, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("roles"), dict) else None
