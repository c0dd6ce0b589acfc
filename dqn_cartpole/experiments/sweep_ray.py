"""`sweep --ray`: the sweep's runs placed by Ray on a cluster's nodes, gathered into the same folder a local sweep
makes, so `compare`, `report`, `evaluate` and a later `sweep` (with or without --ray) read it unchanged.

Each unfinished member is a `RunJob` (a stopped one travels with its folder, to be resumed); Ray runs it on a
node with a free CPU (`executor.RayActors`), and its folder comes back as bytes into `<sweep>/<member>/`, its console output
into `<sweep>/logs/<member>.log` (after a line naming the node and the attempt). The console shows runs done out
of the total, where each one runs, and each loss, retry and failure. Ctrl-C (or SIGTERM) reaches every run on
every node; each saves a checkpoint and sends its folder back, so the same command continues the sweep.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field

from dqn_cartpole.console import exit_status
from dqn_cartpole.console.signals import STOP_CHILDREN, StopRequest
from dqn_cartpole.experiments import ray_transfer
from dqn_cartpole.experiments.executor import Landed, RayActors, describe_node
from dqn_cartpole.experiments.run_actor import RunJob, code_version
from dqn_cartpole.experiments.sweep import Member, Outcome, SweepPlan, member_state, write_manifest, write_page
from dqn_cartpole.experiments.sweep_progress import SweepProgress

POLL_S = 0.5
STOP_WAIT_S = 150.0  # the local sweep's 120 s for the checkpoint, and the folder's way back


@dataclass
class Transfers:
    """What Ray added to the runs: the folders' bytes and the seconds spent packing, fetching and unpacking them
    (`cluster`, how the command joined or started Ray and how long that took, is set by the command)."""

    folders: int = 0
    bytes: int = 0
    pack_s: float = 0.0
    get_s: float = 0.0
    install_s: float = 0.0
    cluster: str = ""
    retried: int = 0
    nodes: Counter = field(default_factory=Counter)  # runs finished per node

    def line(self) -> str:
        where = ", ".join(f"{node} {count}" for node, count in sorted(self.nodes.items()))
        return (f"ray: {self.cluster}; {self.folders} run folders "
                f"back ({self.bytes / 2**20:.1f} MB; packed in {self.pack_s:.2f} s on the workers, fetched in "
                f"{self.get_s:.2f} s, unpacked in {self.install_s:.2f} s); {self.retried} retried; runs per node: "
                f"{where or 'none'}")


class RaySweep:
    """One `sweep --ray` command: submits the members, follows them, writes what comes back."""

    def __init__(self, plan: SweepPlan, ray, show_progress: bool) -> None:
        self.plan, self.ray = plan, ray
        self.outcome, self.transfers = Outcome(), Transfers()
        with open(plan.config_path, encoding="utf-8") as handle:
            config_text = handle.read()
        self.template = RunJob(key="", folder_name="", config_name=os.path.basename(plan.config_path),
                               config_text=config_text, overrides=(), code=code_version())
        self.members = {m.name: m for m in plan.members}
        self.running: Counter = Counter()  # node -> runs running there
        self.where: dict = {}  # member name -> node it runs on
        self.progress = SweepProgress(f"sweep {plan.name}", len(plan.members), "runs", show_progress)

    def run(self) -> Outcome:
        plan = self.plan
        os.makedirs(plan.folder, exist_ok=True)
        write_manifest(plan)
        ray_transfer.clear_staging(plan.folder)
        queue = self._queue()
        pool = RayActors(self.ray, plan.jobs)
        with StopRequest(STOP_CHILDREN, second_signal_interrupts=False) as stop:
            try:
                while (queue or pool.flights) and not stop.requested:
                    while queue and pool.room() > 0 and not stop.requested:
                        self._submit(pool, *queue.pop(0))
                    self._handle(pool.step(POLL_S))
            finally:  # a signal, or an error in this loop: no run outlives the sweep
                self.outcome.stopped_by = stop.signum
                if pool.flights:
                    self._handle(pool.stop_all(stop.signum or signal.SIGTERM, STOP_WAIT_S))
                pool.close()
        self.progress.close()
        write_page(plan)
        return self.outcome

    def _queue(self) -> list:
        queue = []
        for member in self.plan.members:
            state = member_state(member)
            if state == "done":
                self.outcome.done.append(member.name)
            elif state == "broken":
                self.outcome.failed.append((member.name, None, "holds files but no config.yaml; move it away",
                                            member.run_dir))
            else:
                queue.append((member, state))
        self._update()
        return queue

    def _submit(self, pool: RayActors, member: Member, state: str) -> None:
        resume = state == "resume"
        job = RunJob(member.name, member.name, self.template.config_name, self.template.config_text,
                     (*self.plan.manifest["set"], *member.overrides), resume=resume, code=self.template.code)
        folder = None
        if resume:
            try:
                folder = ray_transfer.pack(member.run_dir)
            except ray_transfer.FolderTooLarge as exc:
                self._failed(member, None, f"cannot resume on Ray: {exc}")
                return
        pool.submit(job, folder)

    # -- events
    def _handle(self, events: list) -> None:
        for event in events:
            kind, job = event[0], event[1]
            if kind == "started":
                node = describe_node(event[3])
                self.where[job.key] = node
                self.running[node] += 1
                attempt = f" (attempt {event[2]})" if event[2] > 1 else ""
                self._event(f"{job.key}: started on {node}{attempt}")
            elif kind == "lost":
                self._not_running(job.key)
                _, _, node, why, retrying = event
                self.transfers.retried += retrying
                again = "; running it again on another node" if retrying else ""
                self._event(f"{job.key}: lost with {describe_node(node)} ({why}){again}", always=True)
                self._log(self.members[job.key], f"# lost with {describe_node(node)}: {why}{again}\n")
            elif kind == "landed":
                self._not_running(job.key)
                self._landed(event[2])
        self._update()

    def _landed(self, landed: Landed) -> None:
        member, outcome = self.members[landed.job.key], landed.outcome
        if outcome is None:
            if not landed.cancelled:
                self._failed(member, None, landed.error)
            elif landed.node is not None:
                self._event(f"{member.name}: stopped on {describe_node(landed.node)} without sending its folder "
                            f"back in time; it starts again next time", always=True)
            return
        start = time.monotonic()
        if outcome.folder:
            ray_transfer.install(outcome.folder, member.run_dir, outcome.written_at)
        self._count(landed, outcome, time.monotonic() - start)
        node = describe_node(landed.node)
        self._log(member, f"# attempt {landed.attempts} on {node}\n{outcome.log_text}")
        status = outcome.status
        if status == exit_status.EXIT_OK:
            self.outcome.ok.append(member.name)
            self._event(f"{member.name}: finished on {node} in {outcome.seconds.get('run', 0):.1f} s")
        elif self.outcome.stopped_by is not None and status is not None and exit_status.is_stop(status):
            self._event(f"{member.name}: stopped on {node}, checkpoint saved")
        else:
            self._failed(member, status, outcome.last_error)

    def _count(self, landed: Landed, outcome, install_s: float) -> None:
        t = self.transfers
        t.folders += bool(outcome.folder)
        t.bytes += landed.bytes
        t.pack_s += outcome.seconds.get("pack", 0.0)
        t.get_s += landed.get_s
        t.install_s += install_s
        t.nodes[describe_node(landed.node)] += 1

    def _failed(self, member: Member, status, error: str) -> None:
        log = os.path.join(self.plan.logs, f"{member.name}.log")
        self.outcome.failed.append((member.name, status, error, log))
        if status is None:
            self._log(member, f"# failed: {error}\n")
        self._event(f"{member.name}: failed (exit {status}): {error or '?'}  [log: {log}]", always=True)

    def _not_running(self, key: str) -> None:
        node = self.where.pop(key, None)
        if node is not None:
            self.running[node] -= 1
            if self.running[node] <= 0:
                del self.running[node]

    def _log(self, member: Member, text: str) -> None:
        os.makedirs(self.plan.logs, exist_ok=True)
        with open(os.path.join(self.plan.logs, f"{member.name}.log"), "a", encoding="utf-8") as handle:
            handle.write(text if text.endswith("\n") else text + "\n")

    def _event(self, text: str, always: bool = False) -> None:
        done = len(self.outcome.done) + len(self.outcome.ok)
        self.progress.event(f"[{done}/{len(self.plan.members)}] {text}", always)

    def _update(self) -> None:
        o = self.outcome
        running = sum(self.running.values())
        where = ", ".join(f"{node}: {n}" for node, n in sorted(self.running.items()))
        note = (f"{running} running{f' ({where})' if where else ''}, {len(o.failed)} failed, "
                f"{self.transfers.retried} retried")
        self.progress.update(len(o.done) + len(o.ok), note)
