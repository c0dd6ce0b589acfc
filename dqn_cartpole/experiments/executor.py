"""Where a sweep's or a study's runs train, seen from its driver: `RayActors` on a Ray cluster.

The driver submits `RunJob`s (`submit`, while `room()` says there is room) and reads what happened (`step`), in
order:

  ("started", job, attempt, node)        a run began on a node
  ("evaluations", job, [(step, return)])  a study's run evaluated its policy
  ("lost", job, node, why, retrying)     its actor or node died: it is submitted again (up to MAX_ATTEMPTS in all),
                                          unless the executor is stopping
  ("landed", job, Landed)                 it ended: its RunOutcome, or why there is none

`stop(key, signum)` stops one run (the pruner's SIGTERM); `stop_all(signum, grace_s)` stops every run as Ctrl-C
does and returns the events until each landed.

On Ray the runs train on a pool of `run_actor.RunActor`s, one per CPU of the cluster (re-read every few seconds,
as nodes come and go; `--jobs` caps it), each holding a CPU and the memory a run needs: Ray's idiom for workers
that keep their state (the train process, TensorFlow imported once) from run to run (`ray.util.ActorPool`'s, with
the pool's size following the cluster, and a run lost with its actor run again by the driver, so the retry is seen
and said, and a run stopped on purpose is never run again).
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, TextIO

from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments.run_actor import RunActor, RunJob, RunOutcome
from dqn_cartpole.processes import ray_private

MAX_ATTEMPTS = 3  # a run lost with its node this many times fails
MEMORY_PER_RUN_MB = 700  # as sweep.MEMORY_PER_RUN_MB: Ray places no more runs on a node than its memory holds
CAPACITY_REFRESH_S = 5.0
KILL_WAIT_S = 10.0


@dataclass
class Flight:
    """A job submitted: its attempt, the folder to resume (put in the object store once for every attempt) and,
    once an actor took it, the actor, the run's result and the node."""

    job: RunJob
    attempt: int
    resume_ref: object = None
    actor: Optional["Slot"] = None
    ref: object = None
    node: Optional[dict] = None
    evaluations_ref: object = None


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


@dataclass(eq=False)
class Slot:
    """One actor of the pool: its handle, where it is (once it started) and the run it trains."""

    handle: object
    where_ref: object
    node: Optional[dict] = None
    flight: Optional[Flight] = None
    created: float = field(default_factory=time.monotonic)


def describe_node(node: Optional[dict]) -> str:
    if not node:
        return "an unknown node"
    return f"{node['ip']} ({node['host']}, node {node['node_id'][:8]})"


class RayActors:
    """The driver's runs on a pool of actors (see the module docstring)."""

    def __init__(self, ray, jobs: Optional[int] = None, max_attempts: int = MAX_ATTEMPTS) -> None:
        self.ray, self.jobs, self.max_attempts = ray, jobs, max_attempts
        self.actor_class = ray.remote(RunActor).options(num_cpus=1, memory=MEMORY_PER_RUN_MB * 2**20,
                                                        max_concurrency=2, max_restarts=0)
        self.slots: list[Slot] = []
        self.queue: list[Flight] = []  # submitted, waiting for an actor
        self.flights: dict = {}  # job key -> Flight, queued or running
        self.stopping = False
        self._capacity, self._capacity_at = 1, float("-inf")

    # -- submitting
    def capacity(self) -> int:
        """The cluster's CPUs (re-read every CAPACITY_REFRESH_S), capped by --jobs."""
        if time.monotonic() - self._capacity_at > CAPACITY_REFRESH_S:
            self._capacity = max(1, int(self.ray.cluster_resources().get("CPU", 0)))
            self._capacity_at = time.monotonic()
        return min(self._capacity, self.jobs) if self.jobs else self._capacity

    def room(self) -> int:
        """How many more jobs to submit now: the capacity less those submitted and not landed."""
        return 0 if self.stopping else max(0, self.capacity() - len(self.flights))

    def submit(self, job: RunJob, resume_folder: Optional[bytes] = None) -> None:
        resume_ref = self.ray.put(resume_folder) if resume_folder is not None else None
        self._enqueue(Flight(job, 1, resume_ref))

    def _enqueue(self, flight: Flight, first: bool = False) -> None:
        self.flights[flight.job.key] = flight
        self.queue.insert(0 if first else len(self.queue), flight)

    # -- what happened
    def step(self, timeout_s: float) -> list:
        """Waits up to `timeout_s` for a run to end; returns the events since the last call (module docstring)."""
        events = self._start_queued()
        running = [f.ref for f in self.flights.values() if f.ref is not None]
        if running:
            ready, _ = self.ray.wait(running, num_returns=1, timeout=timeout_s, fetch_local=False)
            if ready:
                ready, _ = self.ray.wait(running, num_returns=len(running), timeout=0, fetch_local=False)
        else:
            time.sleep(timeout_s)
            ready = []
        events += self._evaluations()
        by_ref = {f.ref: f for f in self.flights.values() if f.ref is not None}
        for ref in ready:
            events += self._land(by_ref[ref])
        return events + self._start_queued()

    def _start_queued(self) -> list:
        """Gives queued jobs to idle actors (the pool grown to the capacity, or shrunk by idle ones)."""
        self._fit_pool()
        events: list = []
        for slot in self._ready_idle():
            if not self.queue or self.stopping:
                break
            flight = self.queue.pop(0)
            flight.actor, flight.node = slot, slot.node
            flight.ref = slot.handle.run.remote(flight.job, flight.resume_ref)
            slot.flight = flight
            events.append(("started", flight.job, flight.attempt, slot.node))
        return events

    def _fit_pool(self) -> None:
        want = 0 if self.stopping else self.capacity()
        while len(self.slots) < want:
            handle = self.actor_class.remote()
            self.slots.append(Slot(handle, handle.where.remote()))
        idle = [s for s in self.slots if s.flight is None]
        for slot in sorted(idle, key=lambda s: s.node is not None)[:max(0, len(self.slots) - want)]:
            self._drop(slot)

    def _ready_idle(self) -> list[Slot]:
        """The actors that started (their node known) and train nothing."""
        waiting = [s.where_ref for s in self.slots if s.node is None]
        if waiting:
            ready, _ = self.ray.wait(waiting, num_returns=len(waiting), timeout=0, fetch_local=True)
            for slot in [s for s in self.slots if s.where_ref in ready]:
                try:
                    slot.node = self.ray.get(slot.where_ref)
                except self.ray.exceptions.RayError:  # it died starting (its node went): another takes its place
                    self._drop(slot)
        return [s for s in self.slots if s.node is not None and s.flight is None]

    def _drop(self, slot: Slot) -> None:
        self.slots.remove(slot)
        self.ray.kill(slot.handle)

    def _evaluations(self) -> list:
        """The new evaluations of each running run that reports them (one call in the air per run)."""
        events = []
        for flight in self.flights.values():
            if flight.ref is None or not flight.job.report_evaluations:
                continue
            if flight.evaluations_ref is not None:
                ready, _ = self.ray.wait([flight.evaluations_ref], timeout=0)
                if not ready:
                    continue
                try:
                    pairs = self.ray.get(flight.evaluations_ref)
                except self.ray.exceptions.RayError:  # its actor died: the run's own result says so
                    pairs = []
                if pairs:
                    events.append(("evaluations", flight.job, pairs))
            flight.evaluations_ref = flight.actor.handle.evaluations.remote()
        return events

    def _land(self, flight: Flight) -> list:
        exceptions = self.ray.exceptions
        start = time.monotonic()
        del self.flights[flight.job.key]
        if flight.actor is not None:
            flight.actor.flight = None
        try:
            outcome = self.ray.get(flight.ref)
        except (exceptions.RayActorError, exceptions.WorkerCrashedError, exceptions.NodeDiedError,
                exceptions.ObjectLostError, exceptions.OutOfMemoryError, exceptions.LocalRayletDiedError) as exc:
            if flight.actor in self.slots:
                self._drop(flight.actor)
            return self._lost(flight, _first_line(exc))
        except exceptions.RayTaskError as exc:  # the run itself raised: no retry would help
            cause = getattr(exc, "cause", None) or exc
            return [("landed", flight.job, Landed(flight.job, None, _first_line(cause), flight.node,
                                                  flight.attempt))]
        got_s = time.monotonic() - start
        events: list = [("evaluations", flight.job, outcome.evaluations)] if outcome.evaluations else []
        node = outcome.node or flight.node
        return events + [("landed", flight.job, Landed(flight.job, outcome, "", node, flight.attempt, get_s=got_s,
                                                       bytes=len(outcome.folder)))]

    def _lost(self, flight: Flight, why: str) -> list:
        retrying = not self.stopping and flight.attempt < self.max_attempts
        events: list = [("lost", flight.job, flight.node, why, retrying)]
        if retrying:
            self._enqueue(Flight(flight.job, flight.attempt + 1, flight.resume_ref), first=True)
        else:
            reason = f"lost {flight.attempt} times, last with {describe_node(flight.node)}: {why}"
            events.append(("landed", flight.job, Landed(flight.job, None, "stopped" if self.stopping else reason,
                                                        flight.node, flight.attempt, cancelled=self.stopping)))
        return events

    # -- stopping
    def stop(self, key: str, signum: int) -> None:
        """Asks one run to stop with `signum` (it saves a checkpoint and sends its folder back)."""
        flight = self.flights.get(key)
        if flight is not None and flight.actor is not None:
            flight.actor.handle.stop.remote(key, signum)

    def stop_all(self, signum: int, grace_s: float) -> list:
        """Every run stops with `signum`: returns the events until each one landed (or its actor was killed). The
        pool's actors end with it."""
        self.stopping = True
        events: list = []
        for flight in list(self.queue):  # not started: it never will
            self.queue.remove(flight)
            del self.flights[flight.job.key]
            events.append(("landed", flight.job, Landed(flight.job, None, "cancelled", None, flight.attempt,
                                                        cancelled=True)))
        for flight in self.flights.values():
            flight.actor.handle.stop.remote(flight.job.key, signum)
        deadline = time.monotonic() + grace_s
        while self.flights and time.monotonic() < deadline:
            events += self.step(0.5)
        for slot in list(self.slots):
            if slot.flight is not None:
                self.ray.kill(slot.handle)  # its run did not end in time: it goes with its actor
        deadline = time.monotonic() + KILL_WAIT_S
        while self.flights and time.monotonic() < deadline:
            events += self.step(0.5)
        for flight in list(self.flights.values()):
            events.append(("landed", flight.job,
                           Landed(flight.job, None, "stopped", flight.node, flight.attempt, cancelled=True)))
        self.flights.clear()
        self.close()
        return events

    def close(self) -> None:
        """Ends the idle actors' train processes, then the actors."""
        closing = [slot.handle.close.remote() for slot in self.slots if slot.flight is None and slot.node]
        if closing:
            self.ray.wait(closing, num_returns=len(closing), timeout=KILL_WAIT_S)
        for slot in list(self.slots):
            self._drop(slot)


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
