"""`train --topology ray --collectors N`: the roles as Ray actors across a cluster (the Ray placement).

The driver (this process) holds the run folder and its lock, on its node. It places:

* the replay server, the learner and the evaluator on the driver's node (`NodeAffinitySchedulingStrategy`,
  not soft): they share the run folder's file system; the server on a port fixed for the run, so a
  restarted server is found where it was;
* the N collectors over the cluster's nodes (`SPREAD`); each needs only the server's address (this node's
  IP and the port), the run's config (sent as text) and the weights it pulls, and writes its files into a
  folder of its own node, which the driver copies into the run folder (`mirror`).

Every role is a `ray_role.RoleHost` actor with `max_restarts=-1`: Ray starts a new actor process when one
dies (its worker killed, its node lost) or when the driver asks for a restart (`ray.kill(no_restart=False)`
after the role itself ended badly), on a node its scheduling strategy allows. The rules (which role is
restarted, after which backoff, what ends the run, the stop order) are the topology's (`policy.RAY`,
applied by `supervision`); the driver hears of every end through `ray.wait` on each role's `run` call, and
of every placement through its `where` call, which `roles/placement.json` records.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

from dqn_cartpole.distributed import policy
from dqn_cartpole.distributed.mirror import RunFolderAppender
from dqn_cartpole.distributed.policy import COLLECTOR, Role
from dqn_cartpole.distributed.ray_role import NODE_LOCAL, RoleHost
from dqn_cartpole.distributed.supervision import Ended, Event, Placed
from dqn_cartpole.processes.ray_node import pinned_to
from dqn_cartpole.run_folder.csv_files import read_csv
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.metrics import counted_before

MIRROR_EVERY_S = 1.0  # how often the collectors' new rows, logs and events are copied into the run folder
CALL_TIMEOUT_S = 10.0  # a call to an actor that does not answer in this long is given up on
COLLECTOR_CPUS = 0.01  # what a collector asks of a node (SPREAD spreads them; the CPUs are not counted on)


class RayPlacement:
    """The roles of one run as Ray actors (`supervision.Placement`); see the module docstring."""

    def __init__(self, ray: Any, run_dir: str, config_text: str, port: int, node: dict, resume: bool, quiet: bool):
        self.ray, self.run_dir, self.config_text = ray, run_dir, config_text
        self.port, self.node, self.resume, self.quiet = port, node, resume, quiet
        self.layout = RunLayout(run_dir)
        self.host = ray.remote(RoleHost)
        self.run_name = os.path.basename(os.path.abspath(run_dir))
        self.actors: dict = {}  # Role -> actor handle
        self.runs: dict = {}  # the current `run` call of each role: ObjectRef -> Role
        self.wheres: dict = {}  # `where` calls in flight: ObjectRef -> Role
        self.fetches: dict = {}  # `files` calls in flight: ObjectRef -> Role
        self.restarting: dict = {}  # a restarted actor's first answer: ObjectRef -> (Role, its `run` arguments)
        self.tokens: dict = {}  # Role -> the token of its actor's current process (see `RoleHost.ready`)
        self.lost: set = set()  # roles whose actor died: Ray is starting it again
        self.idle: set = set()  # roles whose actor process answered their end (alive, running nothing)
        self.run_ids = 0  # the last `run` call's id (`where` asks for the place of that one)
        self.run_ids_of: dict = {}  # Role -> the id of its current `run` call
        self.appender = RunFolderAppender(run_dir)
        self.console = LogTail(os.path.join(self.layout.roles, Role(policy.LEARNER).log_name))
        self.mirrored_at = 0.0
        os.makedirs(self.layout.roles, exist_ok=True)

    # ---------------------------------------------------------------- starting
    def options(self, role: Role) -> dict:
        common = {"max_restarts": -1, "max_task_retries": 0}
        if role.kind == COLLECTOR:
            return {**common, "num_cpus": COLLECTOR_CPUS, "scheduling_strategy": "SPREAD"}
        return {**common, "num_cpus": 0, **pinned_to(self.node["node_id"])}

    def argv(self, role: Role, restart: bool) -> list:
        resume = self.resume or (restart and role.kind == policy.LEARNER)
        if role.kind != COLLECTOR:  # on this node, beside the run folder
            return policy.role_argv(role, self.layout.config, f"localhost:{self.port}", self.run_dir, resume,
                                    self.quiet)
        argv = policy.role_argv(role, f"{NODE_LOCAL}/config.yaml", f"{self.node['node_ip']}:{self.port}",
                                NODE_LOCAL, resume, self.quiet)
        steps, episodes = counted_before(read_csv(self.layout.collector_metrics(role.index)))
        return argv + ["--count-from", f"{steps},{episodes}"]

    def log_path(self, role: Role) -> str:
        return os.path.join(self.layout.roles, role.log_name)

    def start(self, role: Role, restart: bool) -> None:
        """Starts the role. Again in the same actor process when that process answered the role's end (the role's
        own process ended: it is a fork of the actor's warm start-up process, so it skips Python's and
        TensorFlow's import); in a new actor process otherwise: Ray's own after the actor died, else asked for
        (`ray.kill(no_restart=False)`: an actor that did not answer). `run` goes to a new process once it answers
        (a call sent before could reach the old one and fail with it)."""
        log = os.path.join(NODE_LOCAL, "roles", role.log_name) if role.kind == COLLECTOR else self.log_path(role)
        pending = [ref for ref, other in self.runs.items() if other == role]
        self.runs = {ref: other for ref, other in self.runs.items() if other != role}
        actor = self.actors.get(role)
        if actor is None:  # a new actor: `run` waits in its queue until it is up
            config_text = self.config_text if role.kind == COLLECTOR else None
            self.actors[role] = self.host.options(**self.options(role)).remote(role.name, self.run_name, config_text)
            self.run(role, (self.argv(role, restart), log))
            return
        if restart and role not in self.lost and self.answered(role, pending):  # the same actor process, at once
            self.mirror_now([role])  # its last rows, so that it counts on from them
            self.run(role, (self.argv(role, restart), log))
            return
        run_args = (self.argv(role, restart), log)  # a new actor process: `run` once it answers
        if restart and role not in self.lost:
            self.ray.kill(actor, no_restart=False)
        self.lost.discard(role)
        self.ask_ready(role, run_args)

    def answered(self, role: Role, pending: list) -> bool:
        """Whether the role's actor process answered its last `run` with the role's end (it is alive and idle): the
        end already reported, or a `run` call done now (a companion just stopped)."""
        if not pending:
            return role in self.idle
        done, _ = self.ray.wait(pending, timeout=0)
        if not done:
            return False
        try:
            self.ray.get(done[0])
            return True
        except self.ray.exceptions.RayError:
            return False

    def ask_ready(self, role: Role, run_args: tuple) -> None:
        """Asks the role's actor for its process's token (retried by Ray until a process of the actor answers)."""
        self.restarting[self.actors[role].ready.options(max_task_retries=-1).remote()] = (role, run_args)

    def run(self, role: Role, run_args: tuple) -> None:
        """Sends the role to its actor, and asks where it runs once that start is under way."""
        self.idle.discard(role)
        self.run_ids += 1
        actor = self.actors[role]
        self.run_ids_of[role] = self.run_ids
        self.runs[actor.run.remote(*run_args, self.run_ids)] = role
        self.wheres[actor.where.remote(self.run_ids)] = role

    # ---------------------------------------------------------------- watching
    def wait(self, timeout_s: float) -> list[Event]:
        refs = [*self.runs, *self.wheres, *self.fetches, *self.restarting]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        events = []
        for ref in ready:
            if ref in self.runs:
                events.append(self.ended(ref, self.runs.pop(ref)))
            elif ref in self.wheres:
                placed = self.placed(ref, self.wheres.pop(ref))
                events += [placed] if placed else []
            elif ref in self.fetches:
                self.fetched(ref, self.fetches.pop(ref))
            elif ref in self.restarting:
                events += self.restarted(ref, *self.restarting.pop(ref))
        self.console.copy_to(sys.stdout)
        if time.monotonic() - self.mirrored_at >= MIRROR_EVERY_S:
            self.mirror()
        return events

    def ended(self, ref: Any, role: Role) -> Ended:
        try:
            result = self.ray.get(ref)
            self.idle.add(role)
            return Ended(role, result["status"], result["why"])
        except self.ray.exceptions.RayError as exc:  # its actor died: Ray is starting it again
            self.lost.add(role)
            return Ended(role, None, lost_reason(exc))

    def placed(self, ref: Any, role: Role) -> Optional[Placed]:
        """Where `role` runs, once its process has started (a role is never recorded as running without one)."""
        try:
            where = self.ray.get(ref)
        except self.ray.exceptions.RayError:
            return None  # that actor died before it answered: its next start asks again
        self.tokens[role] = where.pop("token")
        if where["pid"] is None:  # not started yet (a warm process still importing): ask again while it starts
            if role in self.runs.values():
                self.wheres[self.actors[role].where.remote(self.run_ids_of[role])] = role
            return None
        return Placed(role, where)

    def restarted(self, ref: Any, role: Role, run_args: tuple) -> list:
        """Sends `run` to the role's new actor process; the old one may answer `ready` before it is gone."""
        try:
            token = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:  # it could not be started again
            return [Ended(role, None, lost_reason(exc))]
        if token == self.tokens.get(role):
            self.ask_ready(role, run_args)
        else:
            self.tokens[role] = token
            self.run(role, run_args)
        return []

    # ---------------------------------------------------------------- the collectors' files
    def mirror(self) -> None:
        """Asks each collector that has no request in flight for its new files."""
        self.mirrored_at = time.monotonic()
        asked = set(self.fetches.values())
        for role, actor in self.actors.items():
            if role.kind == COLLECTOR and role not in asked and role not in self.lost:
                self.fetches[actor.files.remote(self.appender.offsets_by_token())] = role

    def fetched(self, ref: Any, role: Role) -> None:
        try:
            token, chunks = self.ray.get(ref)
        except self.ray.exceptions.RayError:
            return  # that process is gone; what it wrote last is lost with its node, or read by the next ask
        self.appender.append(token, chunks)

    def mirror_now(self, roles: list) -> None:
        """Copies what `roles` (collectors) wrote up to now, waiting for their answers."""
        refs = {self.actors[role].files.remote(self.appender.offsets_by_token()): role
                for role in roles if role.kind == COLLECTOR and role in self.actors}
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=CALL_TIMEOUT_S) if refs else ([], [])
        for ref in ready:
            self.fetched(ref, refs[ref])

    # ---------------------------------------------------------------- signals and the stop
    def send(self, role: Role, signum: int) -> None:
        if role in self.actors:
            self.actors[role].send.remote(int(signum))

    def stop(self, roles: list, grace_s: float, signum: int) -> None:
        refs = [self.actors[role].stop.remote(int(signum), grace_s) for role in roles if role in self.actors]
        if refs:
            self.ray.wait(refs, num_returns=len(refs), timeout=grace_s + CALL_TIMEOUT_S)
        runs = [ref for ref, role in self.runs.items() if role in roles]  # their ends, for the next `wait`
        if runs:
            self.ray.wait(runs, num_returns=len(runs), timeout=1.0)
        self.mirror_now(roles)
        self.console.copy_to(sys.stdout)

    def close(self) -> None:
        """Ends every actor's warm start-up process, removes the collectors' node-local folders, and ends every
        actor (no restart)."""
        refs = [actor.close.remote() for actor in self.actors.values()]
        if refs:
            self.ray.wait(refs, num_returns=len(refs), timeout=CALL_TIMEOUT_S)
        for actor in self.actors.values():
            self.ray.kill(actor, no_restart=True)


class LogTail:
    """What a log file gained since the last look (the learner's output, which is the run's console); what it held
    before (a resumed run's earlier commands) is not shown again."""

    def __init__(self, path: str):
        self.path = path
        try:
            self.offset = os.path.getsize(path)
        except OSError:
            self.offset = 0

    def copy_to(self, stream: Any) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return
        if data:
            self.offset += len(data)
            stream.buffer.write(data) if hasattr(stream, "buffer") else stream.write(data.decode(errors="replace"))
            stream.flush()


def lost_reason(exc: BaseException) -> str:
    """Why a role's actor is gone, in a few words (Ray's own message runs over several lines)."""
    text = str(exc)
    if "node" in text.lower() and ("died" in text.lower() or "dead" in text.lower()):
        return f"its Ray actor's node was lost ({type(exc).__name__})"
    return f"its Ray actor's process died ({type(exc).__name__})"
