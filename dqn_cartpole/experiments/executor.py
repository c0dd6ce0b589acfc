"""Where a sweep's or a study's runs train, seen from its driver: `LocalSlots` here, `RayActors` on a Ray cluster.

The driver submits `RunRequest`s (`submit`, while `room()` says there is room) and reads what happened (`step`), in
order, each event naming its request's key:

  ("started", key, attempt, node)        a run began (node: None here)
  ("evaluations", key, [(step, return)])  a run that reports them evaluated its policy
  ("lost", key, node, why, retrying)     on Ray, its actor or node died: it is submitted again (up to MAX_ATTEMPTS
                                          in all), unless the executor is stopping
  ("landed", key, Ended)                  it ended: its exit status, or why there is none; its folder is at the
                                          request's `run_dir` and its console output in its `log_path`

`busy()` says whether a run is in flight or an event is still to be read; `stop(key, signum)` stops one run (the
pruner's SIGTERM); `stop_all(signum)` stops every run as Ctrl-C does (each saves a checkpoint, within the executor's
`stop_wait_s`) and returns the events until each landed; `close()` ends the executor's processes.

Here (`LocalSlots`) runs train in this machine's reused train processes (`train_worker.WorkerSlots`), `jobs` at a
time; on Ray (`RayActors`: docs/experiments.md, 'On a Ray cluster') in the train processes of a pool of
`run_actor.RunActor`s, one per CPU: Ray's idiom for workers that keep their state from run to run
(`ray.util.ActorPool`'s), with the pool's size following the cluster, and a run lost with its actor run again by the
driver, so the retry is seen and said, and a run stopped on purpose is never run again.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Optional, TextIO

from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import ray_transfer, train_worker
from dqn_cartpole.experiments.run_actor import RunActor, RunOutcome, code_version, new_evaluations
from dqn_cartpole.processes import ray_private
from dqn_cartpole.processes.commands import child_command, resume_argv, train_argv
from dqn_cartpole.processes.supervisor import Child, stop_all
from dqn_cartpole.run_folder.layout import RunLayout

MAX_ATTEMPTS = 3  # a run lost with its node this many times fails
MEMORY_PER_RUN_MB = 700  # peak RSS of one training process (TensorFlow + TF-Agents), measured on the default config
POLL_S = 0.5  # how long a driver waits in `step` between looks at its runs
CAPACITY_REFRESH_S = 5.0
KILL_WAIT_S = 10.0


@dataclass(frozen=True)
class RunRequest:
    """One run the driver wants: `train --config CONFIG_PATH --set OVERRIDES` into `run_dir`, or (`resume`) the
    stopped run there continued; its console output appended to `log_path`."""

    key: str  # unique in the command: a sweep member's name, a trial's number (and seed)
    run_dir: str
    log_path: str
    config_path: str
    overrides: tuple = ()
    resume: bool = False
    report_evaluations: bool = False  # pass the run's evaluations to the driver (a study's pruner)
    reuse: bool = True  # may train in a reused train process (False: a fresh process, as tune's seconds)

    def argv(self, run_dir: Optional[str] = None, config_path: Optional[str] = None) -> list[str]:
        """The `train` argv of the run (in `run_dir`, with the config at `config_path`: where a node has them)."""
        if self.resume:
            return resume_argv(run_dir or self.run_dir, "--quiet")
        return train_argv(config_path or self.config_path, list(self.overrides), run_dir or self.run_dir)


@dataclass
class Ended:
    """How a run ended: its exit status (None: it never gave one, `error` says why; `cancelled`: stopped before it
    ran, or before its folder came back), its last error line, where it ran and for how long."""

    key: str
    status: Optional[int]
    error: str
    log_path: str
    node: Optional[dict] = None
    cancelled: bool = False
    run_s: float = 0.0


# ---------------------------------------------------------------------------- here


@dataclass(eq=False)
class LocalRun:
    """A run here: its request, its process (`supervisor.Child`, or `train_worker.ReusedRun`), when it started and
    how many of its evaluations were passed on."""

    request: RunRequest
    child: Child
    started: float = field(default_factory=time.monotonic)
    reported: int = 0


class LocalSlots:
    """Runs on this machine, `jobs` at a time, each in a reused train process (or a fresh one)."""

    stop_wait_s = 120.0  # a stopped run writes its checkpoint, plots and videos

    def __init__(self, jobs: int, log_dir: str) -> None:
        self.jobs = jobs
        self.slots = train_worker.WorkerSlots(jobs, log_dir)  # the runs' processes, reused from run to run
        self.flights: dict = {}  # key -> LocalRun
        self.stopping = False
        self._news: list = []

    def room(self) -> int:
        return 0 if self.stopping else max(0, self.jobs - len(self.flights))

    def busy(self) -> bool:
        """Whether a run is in flight, or an event is still to be read."""
        return bool(self.flights or self._news)

    def submit(self, request: RunRequest) -> None:
        child = self.slots.start(request.run_dir, child_command(request.argv()), request.log_path,
                                 reuse=request.reuse)
        self.flights[request.key] = LocalRun(request, child)
        self._news.append(("started", request.key, 1, None))

    def step(self, timeout_s: float) -> list:
        events, self._news = self._news, []
        time.sleep(timeout_s)
        return events + self._evaluations() + self._landed()

    def _evaluations(self) -> list:
        events = []
        for run in self.flights.values():
            if run.request.report_evaluations:
                pairs, run.reported = new_evaluations(RunLayout(run.request.run_dir).eval_metrics, run.reported)
                if pairs:
                    events.append(("evaluations", run.request.key, pairs))
        return events

    def _landed(self) -> list:
        events = []
        for key, run in list(self.flights.items()):
            if run.child.returncode is not None:
                del self.flights[key]
                events.append(("landed", key, Ended(key, run.child.returncode, run.child.last_error(),
                                                    run.request.log_path, run_s=time.monotonic() - run.started)))
        return events

    def stop(self, key: str, signum: int) -> None:
        if key in self.flights:
            self.flights[key].child.send(signum)

    def stop_all(self, signum: int) -> list:
        """Every run gets `signum` once; what has not ended after `stop_wait_s` is killed."""
        self.stopping = True
        events, self._news = self._news, []
        stop_all([run.child for run in self.flights.values() if run.child.returncode is None], self.stop_wait_s, signum)
        return events + self._evaluations() + self._landed()

    def close(self) -> None:
        """Ends the idle train processes, and any run still running (after an error in the driver)."""
        stop_all([run.child for run in self.flights.values() if run.child.returncode is None], 10.0)
        self.slots.close()


# ---------------------------------------------------------------------------- on Ray


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


@dataclass
class Flight:
    """A run on Ray: its request, its attempt, the folder to resume (put in the object store once for every attempt)
    and, once an actor took it, the actor, the run's result and the node."""

    request: RunRequest
    attempt: int
    resume_ref: object = None
    actor: Optional["Slot"] = None
    ref: object = None
    node: Optional[dict] = None
    evaluations_ref: object = None


@dataclass(eq=False)
class Slot:
    """One actor of the pool: its handle, where it is (once it started) and the run it trains."""

    handle: object
    where_ref: object
    node: Optional[dict] = None
    flight: Optional[Flight] = None


def describe_node(node: Optional[dict]) -> str:
    if not node:
        return "an unknown node"
    return f"{node['node_ip']} ({node['host']}, node {node['node_id'][:8]})"


class RayActors:
    """The driver's runs on a pool of actors (see the module docstring)."""

    stop_wait_s = 150.0  # the 120 s a stopped run takes for its checkpoint, and its folder's way back

    def __init__(self, ray, jobs: Optional[int] = None, max_attempts: int = MAX_ATTEMPTS) -> None:
        self.ray, self.jobs, self.max_attempts = ray, jobs, max_attempts
        self.actor_class = ray.remote(RunActor).options(num_cpus=1, memory=MEMORY_PER_RUN_MB * 2**20,
                                                        max_concurrency=2, max_restarts=0)
        self.code = code_version()
        self.transfers = Transfers()
        self.slots: list[Slot] = []
        self.queue: list[Flight] = []  # submitted, waiting for an actor
        self.flights: dict = {}  # key -> Flight, queued or running
        self.stopping = False
        self._news: list = []
        self._configs: dict = {}  # path -> text
        self._capacity, self._capacity_at = 1, float("-inf")

    # -- submitting
    def capacity(self) -> int:
        """The cluster's CPUs (re-read every CAPACITY_REFRESH_S), capped by --jobs."""
        if time.monotonic() - self._capacity_at > CAPACITY_REFRESH_S:
            self._capacity = max(1, int(self.ray.cluster_resources().get("CPU", 0)))
            self._capacity_at = time.monotonic()
        return min(self._capacity, self.jobs) if self.jobs else self._capacity

    def room(self) -> int:
        """How many more runs to submit now: the capacity less those submitted and not landed."""
        return 0 if self.stopping else max(0, self.capacity() - len(self.flights))

    def busy(self) -> bool:
        """Whether a run is in flight (queued or training), or an event is still to be read."""
        return bool(self.flights or self._news)

    def submit(self, request: RunRequest) -> None:
        """Queues the run for the next idle actor; a stopped run's folder goes with it, to be resumed."""
        if request.config_path not in self._configs:
            with open(request.config_path, encoding="utf-8") as handle:
                self._configs[request.config_path] = handle.read()
        resume_ref = None
        if request.resume:
            try:
                resume_ref = self.ray.put(ray_transfer.pack(request.run_dir))
            except ray_transfer.FolderTooLarge as exc:
                _append(request.log_path, f"# failed: cannot resume on Ray: {exc}")
                self._news.append(("landed", request.key, Ended(request.key, None, f"cannot resume on Ray: {exc}",
                                                                request.log_path)))
                return
        self._enqueue(Flight(request, 1, resume_ref))

    def _enqueue(self, flight: Flight, first: bool = False) -> None:
        self.flights[flight.request.key] = flight
        self.queue.insert(0 if first else len(self.queue), flight)

    # -- what happened
    def step(self, timeout_s: float) -> list:
        """Waits up to `timeout_s` for a run to end; returns the events since the last call (module docstring)."""
        events, self._news = self._news, []
        events += self._start_queued()
        running = [f.ref for f in self.flights.values() if f.ref is not None]
        ready: list = []
        if running:
            ready, _ = self.ray.wait(running, num_returns=1, timeout=timeout_s, fetch_local=False)
            if ready:
                ready, _ = self.ray.wait(running, num_returns=len(running), timeout=0, fetch_local=False)
        else:
            time.sleep(timeout_s)
        events += self._evaluations()
        by_ref = {f.ref: f for f in self.flights.values() if f.ref is not None}
        for ref in ready:
            events += self._land(by_ref[ref])
        return events + self._start_queued()

    def _start_queued(self) -> list:
        """Gives queued runs to idle actors (the pool grown to the capacity, or shrunk by idle ones)."""
        self._fit_pool()
        events: list = []
        for slot in self._ready_idle():
            if not self.queue or self.stopping:
                break
            flight = self.queue.pop(0)
            flight.actor, flight.node = slot, slot.node
            flight.ref = slot.handle.run.remote(flight.request, self._configs[flight.request.config_path], self.code,
                                                flight.resume_ref)
            slot.flight = flight
            events.append(("started", flight.request.key, flight.attempt, slot.node))
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
            ready, _ = self.ray.wait(waiting, num_returns=len(waiting), timeout=0)
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
            if flight.ref is None or not flight.request.report_evaluations:
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
                    events.append(("evaluations", flight.request.key, pairs))
            flight.evaluations_ref = flight.actor.handle.evaluations.remote()
        return events

    def _land(self, flight: Flight) -> list:
        exceptions, request = self.ray.exceptions, flight.request
        start = time.monotonic()
        del self.flights[flight.request.key]
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
            error = _first_line(getattr(exc, "cause", None) or exc)
            _append(request.log_path, f"# failed: {error}")
            return [("landed", request.key, Ended(request.key, None, error, request.log_path, flight.node))]
        got_s = time.monotonic() - start
        node = outcome.node or flight.node
        self._install(flight, outcome, got_s)
        events: list = [("evaluations", request.key, outcome.evaluations)] if outcome.evaluations else []
        return events + [("landed", request.key, Ended(request.key, outcome.status, outcome.last_error,
                                                       request.log_path, node, run_s=outcome.seconds.get("run", 0)))]

    def _install(self, flight: Flight, outcome: RunOutcome, got_s: float) -> None:
        """The run's folder in its place here, its output in its log; what that cost in `transfers`."""
        start, t = time.monotonic(), self.transfers
        if outcome.folder:
            ray_transfer.install(outcome.folder, flight.request.run_dir, outcome.written_at)
        t.install_s += time.monotonic() - start
        t.folders += bool(outcome.folder)
        t.bytes += len(outcome.folder)
        t.pack_s += outcome.seconds.get("pack", 0.0)
        t.get_s += got_s
        node = describe_node(outcome.node or flight.node)
        t.nodes[node] += 1
        _append(flight.request.log_path, f"# attempt {flight.attempt} on {node}\n{outcome.log_text}")

    def _lost(self, flight: Flight, why: str) -> list:
        retrying = not self.stopping and flight.attempt < self.max_attempts
        key, log = flight.request.key, flight.request.log_path
        events: list = [("lost", key, flight.node, why, retrying)]
        again = "; running it again on another node" if retrying else ""
        _append(log, f"# lost with {describe_node(flight.node)}: {why}{again}")
        if retrying:
            self.transfers.retried += 1
            self._enqueue(Flight(flight.request, flight.attempt + 1, flight.resume_ref), first=True)
        elif self.stopping:
            events.append(("landed", key, Ended(key, None, "stopped", log, flight.node, cancelled=True)))
        else:
            reason = f"lost {flight.attempt} times, last with {describe_node(flight.node)}: {why}"
            _append(log, f"# failed: {reason}")
            events.append(("landed", key, Ended(key, None, reason, log, flight.node)))
        return events

    # -- stopping
    def stop(self, key: str, signum: int) -> None:
        """Asks one run to stop with `signum` (it saves a checkpoint and sends its folder back)."""
        flight = self.flights.get(key)
        if flight is not None and flight.actor is not None:
            flight.actor.handle.stop.remote(key, signum)

    def stop_all(self, signum: int) -> list:
        """Every run stops with `signum`: returns the events until each one landed (or its actor was killed). The
        pool's actors end with it."""
        self.stopping = True
        events, self._news = self._news, []
        for flight in self.queue:  # not started: it never will
            key = flight.request.key
            del self.flights[key]
            events.append(("landed", key, Ended(key, None, "cancelled", flight.request.log_path, cancelled=True)))
        self.queue.clear()
        for flight in self.flights.values():
            flight.actor.handle.stop.remote(flight.request.key, signum)
        deadline = time.monotonic() + self.stop_wait_s
        while self.flights and time.monotonic() < deadline:
            events += self.step(0.5)
        for slot in list(self.slots):
            if slot.flight is not None:
                self.ray.kill(slot.handle)  # its run did not end in time: it goes with its actor
        deadline = time.monotonic() + KILL_WAIT_S
        while self.flights and time.monotonic() < deadline:
            events += self.step(0.5)
        for key, flight in self.flights.items():
            events.append(("landed", key, Ended(key, None, "stopped", flight.request.log_path, flight.node,
                                                cancelled=True)))
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


def _append(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text if text.endswith("\n") else text + "\n")


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
