"""The rules of a topology, whatever places its roles: one replay server, one learner, one evaluator and N collectors.

A placement runs the roles (`launcher.py`: child processes on this machine; `ray_placement.py`: Ray actors
across a cluster); `supervision.py` applies these rules to any placement. The rules:

* **what each role runs**: the existing role commands (`role_argv`), in-process code untouched;
* **what is restarted, with which backoff**: a collector or the evaluator that dies is started again at once the
  first time within the window (a single failure waits for nothing), then after 0.25 s, twice as late each time up
  to 8 s (`RESTART_BACKOFF`). A placement that can bring a role back with its state (`Rules.stateful`: Ray pins
  the learner and the server to the run folder's node, the server on its port) restarts the learner (from its last
  checkpoint, with its buffer: `--resume`) and the server too, each with the roles it takes along (`companions`);
* **what ends the run**: the learner's end (0: finished or solved, 1: diverged); a role that died more than
  `max_restarts` times within `window_s` (5 in 120 s); in `local`, the learner's crash or the server's exit;
  a role that a placement cannot start again within ROLE_START_S; a stop signal, which goes to the learner
  first (it checkpoints). A collector or the evaluator that leaves with status 0 saw the run's stop and stays out;
* **the stop order** (`STOP_ORDER`: see `supervision.Supervision.stop_all`) and **how readiness is known**
  (`replay_answers`: Reverb's own ServerInfo call over gRPC; docs/distributed.md, "How it works").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dqn_cartpole.console import exit_status, signals
from dqn_cartpole.processes.supervisor import Backoff

SERVER, LEARNER, EVALUATOR, COLLECTOR = "replay server", "learner", "evaluator", "collector"
COMMANDS = {SERVER: "replay-server", LEARNER: "learn", EVALUATOR: "evaluate-live", COLLECTOR: "collect"}
RESTART_BACKOFF = Backoff(first_s=0.25, max_s=8.0, max_restarts=5, window_s=120.0, at_once=1)
STOP_ORDER = ((COLLECTOR, EVALUATOR, LEARNER), (SERVER,))
SERVER_START_S = 120.0  # TensorFlow's import on a loaded machine; the roles wait for the server as long
ROLE_START_S = 120.0  # a restarted role that no placement could start again within this long ends the run
STOP_WAIT_S = 12.0  # every role ends within 10 s of SIGTERM; then it is killed
READY_PROBE_S = 2.0  # one readiness call's deadline
_SERVER_INFO = "/deepmind.reverb.ReverbService/ServerInfo"

# What a role's end means (`verdict`).
LEFT, RESTART, END_RUN, FAIL = "left", "restart", "end run", "fail"


@dataclass(frozen=True)
class Role:
    """One role of the run: its kind, its name in messages (`collector 1`), and its log under roles/ (None: the
    learner's output, which is the run's console)."""

    kind: str
    index: int = 0

    @property
    def name(self) -> str:
        return f"{COLLECTOR} {self.index}" if self.kind == COLLECTOR else self.kind

    @property
    def log_name(self) -> str:
        return {SERVER: "replay-server.log", LEARNER: "learner.log", EVALUATOR: "evaluator.log"}.get(
            self.kind, f"collector-{self.index}.log")


def topology_args(topology: str, collectors: int) -> tuple:
    """What a resume command adds for this topology."""
    return ("--topology", topology, "--collectors", str(collectors))


def make_roles(collectors: int) -> list[Role]:
    """The run's roles, the server first."""
    return [Role(SERVER), Role(LEARNER), Role(EVALUATOR), *(Role(COLLECTOR, i) for i in range(collectors))]


def role_argv(role: Role, config_file: str, address: str, run_dir: str, resume: bool, quiet: bool) -> list[str]:
    """The `python -m dqn_cartpole` arguments that run `role` (a role keeps its code). Every role but the server
    waits for the server as long as the placement does (TensorFlow's import is most of each start-up)."""
    argv = [COMMANDS[role.kind], "--config", config_file, "--replay-address", address, "--run-dir", run_dir]
    if role.kind != SERVER:
        argv += ["--set", f"distributed.connect_timeout_s={SERVER_START_S:g}"]
    if role.kind == LEARNER:
        argv += ["--supervised"] + (["--resume"] if resume else []) + (["--quiet"] if quiet else [])
    if role.kind == COLLECTOR:
        argv += ["--collector-id", str(role.index)]
    return argv


@dataclass(frozen=True)
class Rules:
    """What a placement can restart: `stateful` ones bring back the learner (from its checkpoint) and the server
    (on its port, with its table checkpoint in `server` mode), on the run folder's node."""

    stateful: bool
    backoff: Backoff = RESTART_BACKOFF

    def restarted(self, kind: str) -> bool:
        return kind in (COLLECTOR, EVALUATOR) or self.stateful


LOCAL = Rules(stateful=False)
RAY = Rules(stateful=True)


def verdict(rules: Rules, role: Role, status: Optional[int]) -> str:
    """What the end of `role` with `status` (None: its process or its node vanished without one) means:
    LEFT (it saw the run's stop: it stays out), END_RUN (the learner's own end: the run's status), RESTART,
    or FAIL (the run stops, with the crash line and the resume command)."""
    if status == exit_status.EXIT_OK and role.kind in (COLLECTOR, EVALUATOR):
        return LEFT
    if role.kind == LEARNER and status in (exit_status.EXIT_OK, exit_status.EXIT_FAILED):
        return END_RUN
    if status == exit_status.EXIT_USAGE and role.kind in (LEARNER, SERVER):
        return FAIL  # bad input: the same again would fail the same way
    return RESTART if rules.restarted(role.kind) else FAIL


def companions(role: Role, roles: list[Role], running: set) -> list[Role]:
    """The roles a restart of `role` takes with it (each stopped first with one SIGTERM, then started again):

    * a restarted learner (back at its checkpoint's train step) takes the evaluator, which follows its
      eval_metrics.csv, and brings back the collectors that left on its stop;
    * a restarted server takes every other role: each one's gRPC channel to the lost server retries on a backoff
      that grows to minutes (measured: a server back on its port after about 30 s was answered 50 s later, and
      the learner's limit, `distributed.rate_limiter_timeout_ms`, passed first), while a new process connects at
      once. The learner's SIGTERM makes it checkpoint its own buffer first: it resumes where it stopped.
    """
    if role.kind == SERVER:
        return [other for other in roles if other.kind != SERVER]
    if role.kind != LEARNER:
        return []
    return [other for other in roles if other.kind == EVALUATOR or other.kind == COLLECTOR and other not in running]


def stop_groups(roles: list[Role]) -> list[list[Role]]:
    """`roles` in STOP_ORDER: the groups stopped one after the other."""
    return [[role for role in roles if role.kind in kinds] for kinds in STOP_ORDER]


def replay_answers(address: str, timeout_s: float = READY_PROBE_S) -> bool:
    """Whether a Reverb server answers its ServerInfo call at HOST:PORT within `timeout_s` (gRPC alone: the
    placements import no TensorFlow)."""
    import grpc  # pylint: disable=import-outside-toplevel  # comes with TensorFlow

    # Its own subchannel: gRPC shares connections, and their reconnect backoff, across a process's channels, so a
    # probe would otherwise wait out the backoff of earlier failed probes (a server restarted on its port).
    channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    try:
        channel.unary_unary(_SERVER_INFO)(b"", timeout=timeout_s)
        return True
    except grpc.RpcError:
        return False
    finally:
        channel.close()


# ---------------------------------------------------------------------------- the lines a person reads


def how_it_ended(status: Optional[int]) -> str:
    if status is None:
        return "was lost"
    if status < 0:
        return f"was killed by {signals.signal_name(-status)}"
    return f"exited with status {status}"


def crash_line(role: Role, status: Optional[int], last_checkpoint: Optional[str], resume: str) -> str:
    """One line: `role` ended the run (its crash, or in `local` the server's exit), every role is stopped, the
    run's newest complete checkpoint and the command that resumes it."""
    how = "crashed (exit status 3)" if status == exit_status.EXIT_CRASHED else how_it_ended(status)
    last = f"its last checkpoint is {last_checkpoint}" if last_checkpoint else "it wrote no checkpoint yet"
    return f"error: the {role.name} {how}; every role is stopped; {last}; resume with: {resume}"


def gave_up_line(role: Role, status: Optional[int], why: str, log_path: str, backoff: Backoff, resume: str) -> str:
    return (f"error: {role.name} {how_it_ended(status)} after {backoff.max_restarts} restarts within "
            f"{backoff.window_s:.0f} s: {why or 'no output'} (log {log_path}); every role is stopped. "
            f"Resume with: {resume}")
