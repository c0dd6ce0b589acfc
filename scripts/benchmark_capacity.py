"""Capacity benchmark: how far one learner goes. `python scripts/benchmark.py --capacity [1,2,4,8,16] [--seconds 8]
[--modes learner,server] [--collectors-share one|each]` (or this file directly, with the same arguments). With the
defaults: about 7 minutes of measurement plus the reference loop's two runs (12.5 minutes in all on the busy 2-core
machine of the capacity plan in docs/benchmarks.md).

One real `replay-server` and one real `learn` process (the roles' own code, default config on `replay.backend:
reverb`), fed by **synthetic collectors** (scripts/capacity_collectors.py): separate processes, as a cluster's
collectors are, that step no env and run no policy but write windows of the run's data spec through the collectors'
own writers as fast as the server takes them. All of them start once; for each count only the first N write.

Phases, each with a fresh server and learner:
  * `distributed.replay: learner` at the run's ratio (one new window per gradient step of 64), then one real
    `collect` role (env, policy, writers) in place of the synthetic ones, for a real collector's cost per env step;
  * `learner` with 64 new windows per gradient step (`samples_per_insert: 1`): how fast the learner drains its queue;
  * `server` at the run's ratio (Reverb's SampleToInsertRatio), and with no ratio (inserts and samples flat out).

For each count it measures, over `--seconds` once the count has settled:
  * the server's inserts/s and the learner's reads (learner mode: windows taken off the queue) or sampled items/s
    (server mode), from the replay table's own counters (`server_info`); the learner's train steps/s, from its log;
  * each process's CPU (psutil): the cores it used and its CPU seconds per 1,000 train steps (learner), inserts
    (server) or windows (collectors), its busiest thread; the machine's busy cores, and those other users took;
  * the replay table's worker thread (Reverb serves every insert and sample of a table on that one thread): the share
    of its time spent working, waiting for inserts (the learner's reads found the queue empty: the collectors were
    behind) and waiting for samples (inserts held back: the learner was behind); from which it names what saturated
    first.

CPU contention: 2 cores cannot hold 16 collectors, a server and a learner, so on this machine the rates stop where
the CPU does. Two things keep that apart from the roles' own limits. The synthetic collectors are forked by one host
process and share its scheduling group (Linux's autogroup: one per session), so the server and the learner keep their
share of the CPU whatever the count, as if the collectors had a machine of their own (`--collectors-share each`
gives each collector its own group, as `train --topology local` runs its roles: then the count takes CPU from the
learner). And the per-unit CPU costs, which do not depend on who else runs, are what extrapolates to other machines;
the table says how busy the machine was and how much of it other users took.

The tutorial's reference loop runs before and after (`--reference PATH`) as the gauge of the machine's load. Every
child is stopped when the command ends, however it ends (and dies with it: PR_SET_PDEATHSIG); the last line says
that no process is left and no port listens.
"""


from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from capacity_collectors import SETUP_FILE, STEPS_FILE, Control, collector_host, synthetic_steps  # noqa: E402
from dqn_cartpole.config import default_config_path  # noqa: E402  (light: no TensorFlow)
from dqn_cartpole.errors import UserError  # noqa: E402

DEFAULT_COUNTS = (1, 2, 4, 8, 16)
MAX_COLLECTORS = 64
DEFAULT_SECONDS = 8.0
SETTLE_S = 2.0  # after every active collector confirmed, before the window opens
START_TIMEOUT_S = 240.0  # a role's TensorFlow import and build on a loaded machine
ACK_TIMEOUT_S = 120.0
STOP_GRACE_S = 15.0
REAL_COLLECTOR_MIN_S = 12.0  # a collector logs its env steps every 5 s: two rows at least
STEPS_IN_POOL = 4096  # synthetic steps a collector cycles through
WARM_UP_STEPS = 600  # train steps before the first count is measured (the learner's tracing is behind it)

# Every role of the benchmark: the default config on Reverb, training for ever (the benchmark stops it), no periodic
# checkpoints (a checkpoint of the learner's buffer is not what is measured), no early stop, no video.
BASE_OVERRIDES = ("replay.backend=reverb", "training.num_iterations=1000000000",
                  "training.checkpoint_interval=1000000000", "evaluation.stop_when_solved=false",
                  "video.enabled=false", f"distributed.connect_timeout_s={START_TIMEOUT_S:g}")


@dataclass(frozen=True)
class Phase:
    key: str
    mode: str  # distributed.replay
    overrides: tuple
    title: str


PHASES = (
    Phase("learner", "learner", (), "`distributed.replay: learner`, the run's ratio (samples_per_insert 64: one new "
                                    "window per gradient step of 64)"),
    Phase("learner-drain", "learner", ("distributed.samples_per_insert=1", "training.log_interval=50"),
          "`learner`, 64 new windows per gradient step (samples_per_insert 1; a train row every 50 steps): the "
          "learner's drain limit"),
    Phase("server", "server", (), "`distributed.replay: server`, the run's ratio (Reverb's SampleToInsertRatio 64)"),
    Phase("server-free", "server", ("distributed.samples_per_insert=null",),
          "`server`, no ratio: inserts and samples as fast as they go"),
)


def phase_overrides(phase: Phase) -> list:
    return [*BASE_OVERRIDES, f"distributed.replay={phase.mode}", *phase.overrides]


# ---------------------------------------------------------------------------- the input


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one `error: ...` line and exit status 2 (a UserError), not a usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(message)


def parse_counts(text: str) -> list:
    """'1,2,4' -> [1, 2, 4]: distinct numbers of collectors, each 1..MAX_COLLECTORS."""
    if not re.fullmatch(r"\s*\d+\s*(,\s*\d+\s*)*", text or ""):
        raise UserError(f"--capacity {text}: expected numbers of collectors like 1,2,4,8,16")
    counts = [int(part) for part in text.split(",")]
    if any(not 1 <= n <= MAX_COLLECTORS for n in counts):
        raise UserError(f"--capacity {text}: each number of collectors must be 1 to {MAX_COLLECTORS}")
    if len(set(counts)) != len(counts):
        raise UserError(f"--capacity {text}: a number of collectors is listed twice")
    return sorted(counts)


def parse_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 1.0 <= seconds <= 600.0:  # nan fails too
        raise UserError(f"--seconds {text}: expected the measured seconds per point, from 1 to 600")
    return seconds


def parse_modes(text: str) -> list:
    modes = [part.strip() for part in text.split(",")]
    if not modes or any(m not in ("learner", "server") for m in modes) or len(set(modes)) != len(modes):
        raise UserError(f"--modes {text}: expected learner, server or learner,server")
    return [phase for phase in PHASES if phase.mode in modes]


def parse_args(argv: list) -> argparse.Namespace:
    from benchmark_common import DEFAULT_REFERENCE  # scripts/ is on the path

    parser = OneLineParser(prog="benchmark.py --capacity", description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", nargs="?", const=",".join(map(str, DEFAULT_COUNTS)),
                        default=",".join(map(str, DEFAULT_COUNTS)), metavar="N,N,...", help="numbers of collectors")
    parser.add_argument("--seconds", default=f"{DEFAULT_SECONDS:g}", help="measured seconds per point")
    parser.add_argument("--modes", default="learner,server", help="distributed.replay modes to measure")
    parser.add_argument("--collectors-share", default="one", help="one: the synthetic collectors share one scheduling "
                        "group (their host's session), so the server and the learner keep their share of the CPU "
                        "whatever their number; each: each collector is a group of its own, as train --topology local "
                        "runs its roles")
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, metavar="PATH",
                        help="the tutorial's training loop, run first and last as a gauge of the machine's load")
    parser.add_argument("--iterations", default="3000", help="iterations of each reference-loop run")
    parser.add_argument("--collector-host", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--own-sessions", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.collector_host is not None:
        return args
    args.counts, args.seconds = parse_counts(args.capacity), parse_seconds(args.seconds)
    args.phases = parse_modes(args.modes)
    if args.collectors_share not in ("one", "each"):
        raise UserError(f"--collectors-share {args.collectors_share}: expected one or each")
    if not re.fullmatch(r"[1-9]\d{3,5}", args.iterations):
        raise UserError(f"--iterations {args.iterations}: expected the reference loop's iterations, 1000 to 999999")
    args.iterations = int(args.iterations)
    return args


# ---------------------------------------------------------------------------- the processes


class Processes:
    """Every child of the benchmark (supervisor.Child: own session, SIGTERM when this process dies), stopped on the
    way out (SIGTERM, then SIGKILL after STOP_GRACE_S), and the ports their servers used."""

    def __init__(self, workdir: str):
        self.workdir, self.children, self.ports = workdir, [], []

    def start(self, name: str, command: list) -> Any:
        """`command` as a supervisor Child (in a session of its own: Linux schedules each session's autogroup as one
        unit), its output in workdir/logs."""
        from dqn_cartpole.processes.supervisor import Child

        child = Child(name, command, os.path.join(self.workdir, "logs", re.sub(r"\W+", "-", name) + ".log")).start()
        self.children.append(child)
        return child

    def check_alive(self, children: list) -> None:
        for child in children:
            if child.returncode is not None:
                raise RuntimeError(f"{child.name} ended with status {child.returncode}: "
                                   f"{child.last_error() or 'no output'} (log: {child.log_path})")

    def stop(self, children: list) -> None:
        from dqn_cartpole.processes.supervisor import stop_all

        stop_all(children, STOP_GRACE_S)

    def close(self) -> str:
        """Stops every child; one line saying that nothing is left (or what is)."""
        import psutil

        self.stop(self.children)
        left = [c.name for c in self.children if c.returncode is None]
        listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        busy = [port for port in self.ports if port in listening]
        if left or busy:
            return f"LEFT BEHIND: processes {left or 'none'}, ports {busy or 'none'}"
        ports = f"ports {', '.join(map(str, self.ports))} no longer listen" if self.ports else "no port opened"
        return f"cleaned up: {len(self.children)} child processes (and their own children) stopped, {ports}"


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float, check: Callable[[], None]) -> Any:
    """`condition()`'s first true value, polled; RuntimeError if `timeout_s` passes or `check()` raises first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        check()
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not within {timeout_s:g} s")


def role_command(role: str, phase: Phase, address: str, run_dir: str, *extra: str) -> list:
    from dqn_cartpole.processes.commands import child_command, set_flags

    return child_command([role, "--config", default_config_path(), "--replay-address", address, "--run-dir", run_dir,
                          *extra, *set_flags(phase_overrides(phase))])


# ---------------------------------------------------------------------------- what one window measures


@dataclass
class Snapshot:
    at: float
    table: Any  # the replay table's TableInfo (the queue, or the shared uniform table)
    cpu: dict  # process name -> CPU seconds (user + system)
    threads: dict  # process name -> {thread id: CPU seconds}
    machine_busy_s: float  # CPU seconds of every core, busy (any process)
    learner_row: Optional[dict]
    collector_row: Optional[dict] = None  # a real collector's newest metrics row
    pids: dict = field(default_factory=dict)  # process name -> pid


def cpu_of(process: Any) -> tuple:
    import psutil

    try:
        times = process.cpu_times()
        threads = {t.id: t.user_time + t.system_time for t in process.threads()}
        return times.user + times.system, threads
    except psutil.NoSuchProcess:
        return float("nan"), {}


def machine_busy_s() -> float:
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def last_row(path: str) -> Optional[dict]:
    from dqn_cartpole.run_folder.csv_files import read_csv

    rows = read_csv(path)
    return rows[-1] if rows else None


@dataclass
class Watch:
    """What a phase watches: the server's client and table, the processes by name, the learner's train log."""

    client: Any
    table: str
    processes: dict  # name -> psutil.Process
    learner_csv: str
    collector_csv: Optional[str] = None

    def snapshot(self) -> Snapshot:
        from dqn_cartpole.replay import deadlines

        info = deadlines.server_info(self.client, 10)[self.table]
        cpu, threads = {}, {}
        for name, process in self.processes.items():
            cpu[name], threads[name] = cpu_of(process)
        return Snapshot(time.monotonic(), info, cpu, threads, machine_busy_s(), last_row(self.learner_csv),
                        last_row(self.collector_csv) if self.collector_csv else None,
                        {name: process.pid for name, process in self.processes.items()})


WORKER_FIELDS = ("running_ms", "inserting_ms", "sampling_ms", "sleeping_ms", "waiting_for_inserts_ms",
                 "waiting_for_sampling_ms")


def worker_shares(a: Any, b: Any) -> dict:
    """The table worker's time over the window: busy (running, inserting, sampling), asleep (nothing to do), waiting
    for inserts (samples wanted, none allowed: the queue was empty), waiting for samples (inserts held back)."""
    delta = {f: getattr(b.table_worker_time, f) - getattr(a.table_worker_time, f) for f in WORKER_FIELDS}
    total = sum(delta.values()) or 1
    return {"busy": (delta["running_ms"] + delta["inserting_ms"] + delta["sampling_ms"]) / total,
            "asleep": delta["sleeping_ms"] / total, "wait_inserts": delta["waiting_for_inserts_ms"] / total,
            "wait_samples": delta["waiting_for_sampling_ms"] / total}


def rate_between(row_a: Optional[dict], row_b: Optional[dict], count: str, clock: str) -> float:
    """d(count) / d(clock) between two metrics rows (nan without two distinct rows)."""
    try:
        return (float(row_b[count]) - float(row_a[count])) / (float(row_b[clock]) - float(row_a[clock]))
    except (TypeError, KeyError, ValueError, ZeroDivisionError):
        return float("nan")


def per_thousand(cpu_s: float, count: float) -> float:
    return 1000 * cpu_s / count if count > 0 else float("nan")


def measure(a: Snapshot, b: Snapshot, groups: dict) -> dict:
    """Every figure of one window. `groups`: role -> the process names it is made of (the collectors are many)."""
    seconds = b.at - a.at
    inserted = b.table.rate_limiter_info.insert_stats.completed - a.table.rate_limiter_info.insert_stats.completed
    sampled = b.table.rate_limiter_info.sample_stats.completed - a.table.rate_limiter_info.sample_stats.completed
    train_rate = rate_between(a.learner_row, b.learner_row, "train_step", "wall_s")
    cpu = {role: sum(b.cpu[n] - a.cpu[n] for n in names) for role, names in groups.items()}
    top = {role: max([b.threads[n][t] - a.threads[n][t] for n in names for t in b.threads[n] if t in a.threads[n]]
                     or [float("nan")]) / seconds for role, names in groups.items()}
    ours = sum(b.cpu[n] - a.cpu[n] for n in b.cpu)
    machine = (b.machine_busy_s - a.machine_busy_s) / seconds
    figures = {"seconds": seconds, "inserts_per_s": inserted / seconds, "reads_per_s": sampled / seconds,
               "train_steps_per_s": train_rate, "worker": worker_shares(a.table, b.table),
               "queue_size": b.table.current_size, "cores": {r: c / seconds for r, c in cpu.items()},
               "top_thread": top, "machine_cores": machine, "others_cores": max(0.0, machine - ours / seconds),
               "cpu_cores": os.cpu_count() or 1}
    figures["learner_s_per_1k_steps"] = per_thousand(cpu.get("learner", 0.0), train_rate * seconds)
    figures["server_s_per_1k_inserts"] = per_thousand(cpu.get("server", 0.0), inserted)
    figures["server_s_per_1k_items"] = per_thousand(cpu.get("server", 0.0), inserted + sampled)
    figures["collectors_s_per_1k_windows"] = per_thousand(cpu.get("collectors", 0.0), inserted)
    if b.collector_row is not None:
        env_rate = rate_between(a.collector_row, b.collector_row, "env_steps", "unix_s")
        figures["env_steps_per_s"] = env_rate
        figures["real_collector_s_per_1k_env_steps"] = per_thousand(cpu.get("real collector", 0.0),
                                                                    env_rate * seconds)
    figures["busiest_threads"] = {role: busiest_threads(a, b, names) for role, names in groups.items()
                                  if len(names) == 1}
    figures["first"] = saturates_first(figures)
    return figures


def busiest_threads(a: Snapshot, b: Snapshot, names: list, keep: int = 4) -> list:
    """The process's busiest threads over the window: [(thread name, share of a core)] (in the JSON, to see where a
    role's CPU goes: its main loop, TensorFlow's pools, gRPC's pollers)."""
    name = names[0]
    seconds, pid = b.at - a.at, b.pids.get(name)
    shares = sorted(((b.threads[name][t] - a.threads[name][t]) / seconds, t) for t in b.threads[name]
                    if t in a.threads[name])[::-1][:keep]
    found = []
    for share, tid in shares:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8") as handle:
                found.append((handle.read().strip(), round(share, 3)))
        except OSError:
            found.append((str(tid), round(share, 3)))
    return found


def saturates_first(f: dict) -> str:
    """Which part held the others back over the window: the table worker's waits say which side of the replay
    waited for the other (with a ratio or a queue); its busy share whether the server itself was the limit; the
    machine's CPU whether the limit was the CPU all of them share."""
    worker, learner_cores = f["worker"], f["cores"].get("learner", float("nan"))
    full = f["machine_cores"] >= 0.9 * f["cpu_cores"]
    cpu_note = f"; CPU full ({f['machine_cores']:.1f} of {f['cpu_cores']} cores busy)" if full else ""
    if worker["busy"] >= 0.8:
        return f"the server: its table worker busy {worker['busy']:.0%} of the time{cpu_note}"
    if worker["wait_samples"] > max(worker["wait_inserts"], 0.2):
        return (f"the learner: inserts held back {worker['wait_samples']:.0%} of the time (it used "
                f"{learner_cores:.2f} cores){cpu_note}")
    if worker["wait_inserts"] > max(worker["wait_samples"], 0.2):
        return f"the collectors: the learner waited for data {worker['wait_inserts']:.0%} of the time{cpu_note}"
    if full:
        return f"the CPU: neither side waited for the other{cpu_note}"
    return "none: neither side waited for the other, and the CPU was not full"


# ---------------------------------------------------------------------------- a phase


@dataclass
class Bench:
    """The run's shared state: its folder, its children, the collectors' orders, the settings."""

    workdir: str
    processes: Processes
    control: Control
    host: Any  # the synthetic collectors' parent (a supervisor Child)
    counts: list
    seconds: float
    results: dict = field(default_factory=dict)  # phase key -> [(count, figures)], and "real collector"
    collectors: list = field(default_factory=list)  # the synthetic collectors' pids, by index

    def say(self, line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)

    def wait_started(self, count: int) -> None:
        """Waits until each of the `count` synthetic collectors has answered (their host imports TensorFlow once,
        then forks them); keeps their pids."""
        def all_answered() -> Optional[list]:
            answers = self.control.answers(count)
            return None if None in answers else answers

        started = time.monotonic()
        answers = wait_for(all_answered, "the synthetic collectors starting", START_TIMEOUT_S, self.check_collectors)
        self.collectors = [answer["pid"] for answer in answers]
        self.say(f"{count} synthetic collectors started ({time.monotonic() - started:.0f} s)")

    def check_collectors(self) -> None:
        """RuntimeError (naming the host's log) if the collectors' host or any collector has ended."""
        import psutil

        self.processes.check_alive([self.host])
        gone = [i for i, pid in enumerate(self.collectors) if not psutil.pid_exists(pid)]
        if gone:
            raise RuntimeError(f"synthetic collector(s) {gone} ended (log: {self.host.log_path})")

    def order(self, phase_index: int, phase: Phase, address: str, active: int) -> None:
        """Tells the synthetic collectors which of them write (the first `active`), where; waits for their answers."""
        self.control.write(phase=phase_index, address=address, overrides=phase_overrides(phase), active=active)
        expected = [{"phase": phase_index, "active": i < active, "pid": pid} for i, pid in enumerate(self.collectors)]
        wait_for(lambda: self.control.answers(len(self.collectors)) == expected,
                 f"the synthetic collectors taking the order of {active} writing", ACK_TIMEOUT_S, self.check_collectors)


def start_roles(bench: Bench, phase: Phase) -> tuple:
    """A replay server (ready: it answers server_info) and a learner (ready: it pushed its weights); returns
    (address, run folder, server, learner, client)."""
    import reverb

    from dqn_cartpole.distributed.launcher import free_port
    from dqn_cartpole.distributed.variables import VARIABLES_TABLE, check_server
    from dqn_cartpole.replay import deadlines

    port = free_port()
    address, run_dir = f"localhost:{port}", os.path.join(bench.workdir, phase.key)
    bench.processes.ports.append(port)
    server = bench.processes.start(f"{phase.key} replay server", role_command("replay-server", phase, address, run_dir))
    wait_for(lambda: _answers(address), "the replay server answering", START_TIMEOUT_S,
             lambda: bench.processes.check_alive([server]))
    check_server(address, 10)
    learner = bench.processes.start(f"{phase.key} learner", role_command("learn", phase, address, run_dir, "--quiet"))
    client = reverb.Client(address)
    wait_for(lambda: deadlines.server_info(client, 10)[VARIABLES_TABLE].current_size > 0,
             "the learner's first weights", START_TIMEOUT_S, lambda: bench.processes.check_alive([server, learner]))
    return address, run_dir, server, learner, client


def _answers(address: str) -> bool:
    from dqn_cartpole.distributed.variables import wait_for_port

    return wait_for_port(address, time.monotonic()) is None


def run_phase(bench: Bench, index: int, phase: Phase, real_collector: bool) -> None:
    """One server and one learner for `phase`; each count of synthetic collectors measured in turn; then, if
    `real_collector`, one real collect role alone."""
    import psutil

    from dqn_cartpole.core import build
    from dqn_cartpole.config import load_config
    from dqn_cartpole.run_folder.layout import RunLayout

    started = time.monotonic()
    address, run_dir, server, learner, client = start_roles(bench, phase)
    roles = [server, learner]
    alive = lambda: (bench.processes.check_alive(roles), bench.check_collectors())  # noqa: E731
    table = build.distributed_writer_tables(load_config(default_config_path(), phase_overrides(phase)))[0]
    names = {f"collector {i}": pid for i, pid in enumerate(bench.collectors)}
    watch = Watch(client, table, {"server": psutil.Process(server.process.pid),
                                  "learner": psutil.Process(learner.process.pid), "benchmark": psutil.Process(),
                                  **{n: psutil.Process(pid) for n, pid in names.items()}},
                  RunLayout(run_dir).train_metrics)
    groups = {"server": ["server"], "learner": ["learner"], "collectors": list(names)}
    bench.order(index, phase, address, 1)
    wait_for(lambda: float((last_row(watch.learner_csv) or {}).get("train_step", 0)) >= WARM_UP_STEPS,
             "the learner's first train steps", START_TIMEOUT_S, alive)
    bench.say(f"{phase.key}: server and learner up, training ({time.monotonic() - started:.0f} s)")
    rows = bench.results.setdefault(phase.key, [])
    for count in bench.counts:
        bench.order(index, phase, address, count)
        time.sleep(SETTLE_S)
        first = watch.snapshot()
        time.sleep(bench.seconds)
        alive()
        figures = measure(first, watch.snapshot(), groups)
        rows.append((count, figures))
        bench.say(f"{phase.key}, {count} collector(s): {figures['inserts_per_s']:,.0f} inserts/s, "
                  f"{figures['train_steps_per_s']:,.0f} train steps/s; first to saturate: {figures['first']}")
    bench.order(index, phase, address, 0)
    if real_collector:
        bench.results["real collector"] = measure_real_collector(bench, phase, address, run_dir, watch, alive)
    bench.processes.stop([learner, server])


def measure_real_collector(bench: Bench, phase: Phase, address: str, run_dir: str, watch: Watch,
                           alive: Callable[[], None]) -> dict:
    """One real `collect` role (env, policy, writers) in place of the synthetic ones: its env steps/s and CPU."""
    import psutil

    from dqn_cartpole.run_folder.layout import RunLayout

    child = bench.processes.start(f"{phase.key} real collector",
                                  role_command("collect", phase, address, run_dir, "--collector-id", "0"))
    watch.processes["real collector"] = psutil.Process(child.process.pid)
    watch.collector_csv = RunLayout(run_dir).collector_metrics(0)
    from dqn_cartpole.run_folder.csv_files import read_csv

    checks = lambda: (alive(), bench.processes.check_alive([child]))  # noqa: E731
    wait_for(lambda: len(read_csv(watch.collector_csv)) >= 2, "the real collector's first metrics rows",
             START_TIMEOUT_S, checks)
    first = watch.snapshot()
    time.sleep(max(bench.seconds, REAL_COLLECTOR_MIN_S))
    checks()
    figures = measure(first, watch.snapshot(), {"server": ["server"], "learner": ["learner"],
                                                "real collector": ["real collector"]})
    bench.say(f"{phase.key}, 1 real collector: {figures['env_steps_per_s']:,.0f} env steps/s, "
              f"{figures['real_collector_s_per_1k_env_steps']:.2f} CPU s per 1,000 env steps")
    bench.processes.stop([child])
    del watch.processes["real collector"]
    watch.collector_csv = None
    return figures


def prepare_collectors(bench_dir: str) -> None:
    """The run's data spec (from the agent a role builds) and the synthetic steps, for the collectors to load."""
    from dqn_cartpole.config import load_config
    from dqn_cartpole.distributed import parts

    config = load_config(default_config_path(), phase_overrides(PHASES[0]))
    with contextlib.ExitStack() as stack:
        _, _, agent = parts.agent_with_envs(config, 1, config.training.seed, stack)
        data_spec = agent.collect_data_spec
    with open(os.path.join(bench_dir, STEPS_FILE), "wb") as handle:
        pickle.dump((data_spec, synthetic_steps(data_spec, STEPS_IN_POOL)), handle)
    with open(os.path.join(bench_dir, SETUP_FILE), "w", encoding="utf-8") as handle:
        json.dump({"config": default_config_path()}, handle)


# ---------------------------------------------------------------------------- the report


def fmt(value: float, digits: int = 0) -> str:
    return "-" if value != value else f"{value:,.{digits}f}"


def phase_table(phase: Phase, rows: list, reference: Optional[float]) -> list:
    reads = "learner reads/s" if phase.mode == "learner" else "sampled items/s"
    lines = [f"\n{phase.title}\n",
             f"| collectors | inserts/s | {reads} | train steps/s (x ref) | table worker: busy / waits for inserts / "
             "waits for samples | learner: cores, CPU s per 1k train steps, busiest thread | server: cores, CPU s per "
             "1k inserts, busiest thread | collectors: cores, CPU s per 1k windows | machine: cores busy, others' | "
             "first to saturate |", "|" + " --- |" * 10]
    for count, f in rows:
        w, c, top = f["worker"], f["cores"], f["top_thread"]
        ratio = f" (x{f['train_steps_per_s'] / reference:.1f})" if reference else ""
        lines.append(
            f"| {count} | {fmt(f['inserts_per_s'])} | {fmt(f['reads_per_s'])} | {fmt(f['train_steps_per_s'])}{ratio} | "
            f"{w['busy']:.0%} / {w['wait_inserts']:.0%} / {w['wait_samples']:.0%} | {c['learner']:.2f}, "
            f"{fmt(f['learner_s_per_1k_steps'], 2)}, {top['learner']:.0%} | {c['server']:.2f}, "
            f"{fmt(f['server_s_per_1k_inserts'], 3)}, {top['server']:.0%} | {c['collectors']:.2f}, "
            f"{fmt(f['collectors_s_per_1k_windows'], 3)} | {f['machine_cores']:.2f}, {f['others_cores']:.2f} | "
            f"{f['first']} |")
    return lines


# (what, the phases it is measured in, the figure, its unit, what one core of it does)
COSTS = (("learner, `learner` mode at the run's ratio", ("learner",), "learner_s_per_1k_steps", "train steps"),
         ("learner, `learner` mode, 64 new windows per step", ("learner-drain",), "learner_s_per_1k_steps",
          "train steps"),
         ("learner, `server` mode at the run's ratio", ("server",), "learner_s_per_1k_steps", "train steps"),
         ("learner, `server` mode, no ratio", ("server-free",), "learner_s_per_1k_steps", "train steps"),
         ("server, `learner` mode (a window's insert and its read)", ("learner", "learner-drain"),
          "server_s_per_1k_inserts", "inserts"),
         ("server, `server` mode at the run's ratio (an insert, in 2 tables, and 64 samples)", ("server",),
          "server_s_per_1k_inserts", "inserts"),
         ("server, `server` mode, no ratio", ("server-free",), "server_s_per_1k_items", "items (inserted + sampled)"),
         ("synthetic collector (the writers alone)", ("learner-drain", "server-free"), "collectors_s_per_1k_windows",
          "windows"))


def cost_lines(results: dict) -> list:
    """Per-role CPU costs (medians over every count of the phases that measure them) and one core's worth of each."""
    from benchmark_common import median

    lines = ["\n| role (median over the counts) | measured: CPU s per 1,000 | extrapolated: one core's worth per s |",
             "| --- | --- | --- |"]
    for name, keys, figure, unit in COSTS:
        cost = median(f[figure] for key in keys for _, f in results.get(key, []))
        if cost == cost:
            lines.append(f"| {name} | {cost:.3f} ({unit}) | {1000 / cost:,.0f} {unit} |")
    real = results.get("real collector")
    if real and real["real_collector_s_per_1k_env_steps"] == real["real_collector_s_per_1k_env_steps"]:
        cost = real["real_collector_s_per_1k_env_steps"]
        lines.append(f"| real collector (CartPole, compiled driver, its writers) | {cost:.3f} (env steps) | "
                     f"{1000 / cost:,.0f} env steps |")
    return lines


def worker_ceiling_lines(results: dict) -> list:
    """Items/s one table's worker thread would take at 100% busy (the busiest measured point, scaled: extrapolated)."""
    lines = []
    for key, rows in results.items():
        if key == "real collector" or not rows:
            continue
        count, f = max(rows, key=lambda row: row[1]["inserts_per_s"] + row[1]["reads_per_s"])
        items = f["inserts_per_s"] + f["reads_per_s"]
        if f["worker"]["busy"] > 0:
            lines.append(f"- {key}: {items:,.0f} items/s (inserted + read/sampled) with {count} collector(s), its "
                         f"table worker busy {f['worker']['busy']:.0%}: about {items / f['worker']['busy']:,.0f} "
                         f"items/s at 100% (extrapolated)")
    return ["\nThe replay table's single worker thread:"] + lines if lines else []


def real_collector_lines(f: dict) -> list:
    return ["\n| 1 real collector (`learner` mode, the run's ratio) | env steps/s | cores | CPU s per 1,000 env steps "
            "| learner train steps/s | first to saturate |", "| --- | --- | --- | --- | --- | --- |",
            f"| collect role, default config | {fmt(f['env_steps_per_s'])} | {f['cores']['real collector']:.2f} | "
            f"{fmt(f['real_collector_s_per_1k_env_steps'], 3)} | {fmt(f['train_steps_per_s'])} | {f['first']} |"]


# ---------------------------------------------------------------------------- the command


def run_phases(args: argparse.Namespace, workdir: str) -> dict:
    """Starts the synthetic collectors, runs every phase, stops everything; returns the results."""
    processes = Processes(workdir)
    bench = None
    try:
        with heavy():
            prepare_collectors(workdir)
        host = processes.start("synthetic collectors", [
            sys.executable, os.path.abspath(__file__), "--collector-host", str(max(args.counts)), "--workdir", workdir,
            *(["--own-sessions"] if args.collectors_share == "each" else [])])
        bench = Bench(workdir, processes, Control(workdir), host, args.counts, args.seconds)
        bench.wait_started(max(args.counts))
        for index, phase in enumerate(args.phases):
            run_phase(bench, index, phase, real_collector=index == 0 and phase.key == "learner")
        bench.control.write(exit=True)
    except RuntimeError as exc:
        raise SystemExit(f"error: the capacity benchmark failed: {exc}") from None
    finally:
        print(processes.close(), file=sys.stderr, flush=True)
    return bench.results


@contextlib.contextmanager
def heavy():
    from dqn_cartpole.console.imports import heavy_imports

    with heavy_imports():
        yield


def capacity(args: argparse.Namespace) -> None:
    from benchmark_common import load_averages, reference_rate

    workdir = tempfile.mkdtemp(prefix="dqn-capacity-")
    started, load_before = time.time(), load_averages()
    has_reference = os.path.isfile(args.reference)
    if not has_reference:
        print(f"no reference loop at {args.reference}: the ratios to it are skipped (give it with --reference PATH)",
              file=sys.stderr)
    points = len(args.counts) * len(args.phases)
    estimate = points * (args.seconds + SETTLE_S + 1.5) + 40 * len(args.phases) + 45 * has_reference * 2 + 40
    print(f"capacity benchmark: {points} points of {args.seconds:g} s, about {estimate / 60:.0f} min on 2 cores; "
          f"work in {workdir}", file=sys.stderr, flush=True)
    before = reference_rate(args.reference, args.iterations) if has_reference else None
    results = run_phases(args, workdir)
    after = reference_rate(args.reference, args.iterations) if has_reference else None
    reference = (before + after) / 2 if has_reference else None
    lines = [f"load average (1/5/15 min): {load_before} at the start, {load_averages()} at the end; {os.cpu_count()} cores"]
    if reference:
        lines.append(f"reference loop (the tutorial's own): {before:.0f} it/s at the start, {after:.0f} at the end "
                     f"(ratios use their mean, {reference:.0f})")
    for phase in args.phases:
        lines += phase_table(phase, results.get(phase.key, []), reference)
    if "real collector" in results:
        lines += real_collector_lines(results["real collector"])
    lines += cost_lines(results) + worker_ceiling_lines(results)
    with open(os.path.join(workdir, "capacity.json"), "w", encoding="utf-8") as handle:
        json.dump({"reference": [before, after], "results": results, "argv": sys.argv[1:]}, handle, indent=1)
    lines.append(f"\nthe benchmark took {time.time() - started:.0f} s; every figure in {workdir}/capacity.json")
    print("\n".join(lines), flush=True)


def main(argv: list) -> None:
    args = parse_args(argv)
    if args.collector_host is not None:
        raise SystemExit(collector_host(args.collector_host, args.workdir, args.own_sessions))
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the children are stopped on the way
    try:
        capacity(args)
    except KeyboardInterrupt:  # Ctrl-C: the children were stopped on the way out
        print("stopped (Ctrl-C)", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    from benchmark_common import run_main

    run_main(main, sys.argv[1:])
