"""Runs on a Ray cluster, seen from the driver: placed one per CPU, retried when lost with a node, all stopped.

`RayPool` submits `RunJob`s as Ray tasks of one CPU each (and the memory a run needs), no more at a time than the
cluster has CPUs (re-read every few seconds, as nodes come and go; `--jobs` caps it), so Ray places each as a CPU
frees up. `step` returns what happened since the last call, in order:

  ("started", job, attempt, node)        a run began on a node (from the board)
  ("evaluations", job, [(step, return)])  a study's run evaluated its policy
  ("lost", job, node, why, retrying)     its worker or node died, or its result was lost with the node: it is
                                          submitted again (up to MAX_ATTEMPTS in all), unless the pool is stopping
  ("landed", job, Landed)                 it ended: its RunOutcome, or why there is none

A run is retried by the driver rather than by Ray's `max_retries`, so the retry is seen and said, and a run
stopped on purpose is never run again. `stop_all` forwards a stop signal to every run through the board, cancels
the ones not started, waits for the others to send back their folders (each saves a checkpoint first), and
force-cancels what is left after the grace period.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, TextIO

from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import ray_board, ray_worker
from dqn_cartpole.experiments.ray_worker import RunJob, RunOutcome
from dqn_cartpole.processes import ray_private

MAX_ATTEMPTS = 3  # a run lost with its node this many times fails
MEMORY_PER_RUN_MB = 700  # as sweep.MEMORY_PER_RUN_MB: Ray places no more runs on a node than its memory holds
CAPACITY_REFRESH_S = 5.0
FORCE_CANCEL_WAIT_S = 10.0


@dataclass
class Flight:
    """A job in the air: its task, its attempt and, once it started, its node."""

    job: RunJob
    ref: object
    attempt: int
    resume_ref: object = None  # the folder to resume, put in the object store once for every attempt
    node: Optional[dict] = None
    submitted: float = field(default_factory=time.monotonic)


@dataclass
class Landed:
    """A job that ended: its outcome, or why there is none (`error`); `get_s` is the seconds the result took to
    reach the driver once ready, `bytes` its size."""

    job: RunJob
    outcome: Optional[RunOutcome]
    error: str = ""
    node: Optional[dict] = None
    attempts: int = 1
    cancelled: bool = False
    get_s: float = 0.0
    bytes: int = 0


def describe_node(node: Optional[dict]) -> str:
    if not node:
        return "an unknown node"
    return f"{node['ip']} ({node['host']}, node {node['node_id'][:8]})"


class RayPool:
    """The driver's runs on the cluster (see the module docstring)."""

    def __init__(self, ray, jobs: Optional[int] = None, max_attempts: int = MAX_ATTEMPTS) -> None:
        self.ray, self.jobs, self.max_attempts = ray, jobs, max_attempts
        self.board = ray_board.start_board(ray)
        self.task = ray.remote(ray_worker.run_on_worker).options(
            num_cpus=1, memory=MEMORY_PER_RUN_MB * 2**20, max_retries=0, name="dqn_cartpole run")
        self.flights: dict = {}  # ObjectRef -> Flight
        self.stopping = False
        self._capacity, self._capacity_at = 1, float("-inf")

    # -- submitting
    def room(self) -> int:
        """How many more jobs to submit now: the cluster's CPUs (capped by --jobs) less those in the air."""
        if time.monotonic() - self._capacity_at > CAPACITY_REFRESH_S:
            self._capacity = max(1, int(self.ray.cluster_resources().get("CPU", 0)))
            self._capacity_at = time.monotonic()
        capacity = min(self._capacity, self.jobs) if self.jobs else self._capacity
        return 0 if self.stopping else max(0, capacity - len(self.flights))

    def submit(self, job: RunJob, resume_folder: Optional[bytes] = None) -> None:
        resume_ref = self.ray.put(resume_folder) if resume_folder is not None else None
        self._launch(job, 1, resume_ref)

    def _launch(self, job: RunJob, attempt: int, resume_ref) -> None:
        ref = self.task.remote(job, attempt, resume_ref, self.board)
        self.flights[ref] = Flight(job, ref, attempt, resume_ref)

    def by_key(self, key: str) -> Optional[Flight]:
        return next((f for f in self.flights.values() if f.job.key == key), None)

    # -- what happened
    def step(self, timeout_s: float) -> list:
        """Waits up to `timeout_s` for a run to end; returns the events since the last call (module docstring)."""
        events = self._news()
        if not self.flights:
            time.sleep(timeout_s)
            return events
        ready, _ = self.ray.wait(list(self.flights), num_returns=1, timeout=timeout_s, fetch_local=False)
        if ready:
            ready, _ = self.ray.wait(list(self.flights), num_returns=len(self.flights), timeout=0, fetch_local=False)
        events += self._news()  # a run's "started" comes before its "landed"
        for ref in ready:
            events += self._land(self.flights.pop(ref))
        return events

    def _news(self) -> list:
        events = []
        for kind, key, attempt, payload in self.ray.get(self.board.drain.remote()):
            flight = self.by_key(key)
            if flight is None or flight.attempt != attempt:
                continue  # an earlier attempt's news
            if kind == "started":
                flight.node = payload
                events.append(("started", flight.job, attempt, payload))
            else:
                events.append(("evaluations", flight.job, payload))
        return events

    def _land(self, flight: Flight) -> list:
        exceptions = self.ray.exceptions
        start = time.monotonic()
        try:
            outcome = self.ray.get(flight.ref)
        except exceptions.TaskCancelledError:
            return [("landed", flight.job,
                     Landed(flight.job, None, "cancelled", flight.node, flight.attempt, cancelled=True))]
        except (exceptions.WorkerCrashedError, exceptions.NodeDiedError, exceptions.ObjectLostError,
                exceptions.OutOfMemoryError, exceptions.LocalRayletDiedError) as exc:
            return self._lost(flight, _first_line(exc))
        except exceptions.RayTaskError as exc:  # the task itself raised: no retry would help
            cause = getattr(exc, "cause", None) or exc
            return [("landed", flight.job, Landed(flight.job, None, _first_line(cause), flight.node,
                                                  flight.attempt))]
        got_s = time.monotonic() - start
        self.ray.get(self.board.forget.remote(flight.job.key))
        node = outcome.node or flight.node
        return [("landed", flight.job, Landed(flight.job, outcome, "", node, flight.attempt, get_s=got_s,
                                              bytes=len(outcome.folder)))]

    def _lost(self, flight: Flight, why: str) -> list:
        retrying = not self.stopping and flight.attempt < self.max_attempts
        events: list = [("lost", flight.job, flight.node, why, retrying)]
        if retrying:
            self._launch(flight.job, flight.attempt + 1, flight.resume_ref)
        else:
            reason = f"lost {flight.attempt} times, last with {describe_node(flight.node)}: {why}"
            events.append(("landed", flight.job, Landed(flight.job, None, "stopped" if self.stopping else reason,
                                                        flight.node, flight.attempt, cancelled=self.stopping)))
        return events

    # -- stopping
    def stop(self, key: str, signum: int) -> None:
        """Asks one run to stop with `signum` (it saves a checkpoint and sends its folder back)."""
        self.board.stop.remote(key, signum)

    def stop_all(self, signum: int, grace_s: float) -> list:
        """Every run stops with `signum`: returns the events until each one landed (or was force-cancelled)."""
        self.stopping = True
        self.ray.get(self.board.stop_all.remote(signum))
        events = self._news()
        for flight in self.flights.values():
            if flight.node is None:
                self.ray.cancel(flight.ref)  # not started: it never will
        deadline = time.monotonic() + grace_s
        while self.flights and time.monotonic() < deadline:
            events += self.step(0.5)
        for flight in self.flights.values():
            self.ray.cancel(flight.ref, force=True)
        deadline = time.monotonic() + FORCE_CANCEL_WAIT_S
        while self.flights and time.monotonic() < deadline:
            events += self.step(0.5)
        for flight in list(self.flights.values()):
            events.append(("landed", flight.job,
                           Landed(flight.job, None, "stopped", flight.node, flight.attempt, cancelled=True)))
        self.flights.clear()
        return events


def check_cluster(ray) -> dict:
    """The cluster's alive nodes and CPUs ({"nodes": n, "cpus": c, "hosts": [...]}); a one-line UserError when no
    node can take a run (a CPU and MEMORY_PER_RUN_MB of memory)."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    fit = [node for node in nodes if node["Resources"].get("CPU", 0) >= 1
           and node["Resources"].get("memory", 0) >= MEMORY_PER_RUN_MB * 2**20]
    if not fit:
        raise UserError(f"the Ray cluster has no node with a CPU and {MEMORY_PER_RUN_MB} MB of memory for a run "
                        f"({len(nodes)} nodes); add one with `ray start --address=HEAD:PORT`")
    hosts = sorted({node["NodeManagerAddress"] for node in fit})
    return {"nodes": len(fit), "cpus": int(sum(node["Resources"]["CPU"] for node in fit)), "hosts": hosts}


@contextlib.contextmanager
def cluster_errors_in_one_line(stream: Optional[TextIO] = None) -> Iterator[None]:
    """Ray's driver prints each error the cluster publishes on stdout, a node's death with its raylet's last 20 log
    lines; within the block each is one line on stderr ("ray: ..."), beside the command's own account of the runs
    it cost (Ray has no switch for it: `processes.ray_private.cluster_errors_to`)."""

    def one_line(message: str) -> None:
        out = stream or sys.stderr
        first = next((line.strip() for line in message.splitlines() if line.strip()), "")
        sentences = first.split(". ")
        out.write(f"ray: {'. '.join(sentences[:2]) if len(sentences[0]) < 40 else sentences[0]}\n")
        out.flush()

    with ray_private.cluster_errors_to(one_line):
        yield


def _first_line(exc: BaseException) -> str:
    """The first sentence of the exception's message (Ray's go on with advice for its dashboard and logs)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0].split(". ", 1)[0].rstrip(".")
