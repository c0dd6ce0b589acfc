"""`train --topology local --collectors N`: every role as its own OS process on this machine, supervised.

The launcher stays light (no TensorFlow): it checks the input, creates and locks the run
folder, writes the resolved config.yaml every role reads, stages a resumed run's replay table,
then starts the replay server, the learner, the evaluator and N collectors and watches them:

* a collector or the evaluator that dies is started again;
* the learner finishing (or the evaluator's confirmed solve) stops the collectors and the evaluator
  through the server's `stop` table, then the launcher stops the server;
* the learner dying stops everything and prints the command that resumes the run;
* Ctrl-C / SIGTERM is passed to the learner (which checkpoints), then the rest are stopped;
  the exit status is 130 / 143. Every child also gets SIGTERM if the launcher itself dies.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Optional

from dqn_cartpole.config import Config, dump_yaml
from dqn_cartpole.console import signals
from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.layout import RunLayout

POLL_S = 0.25
SERVER_START_S = 120.0  # TensorFlow's import on a loaded machine
STOP_WAIT_S = 20.0
READY_LINE = "replay server ready"
EXIT_FAILED = 1
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::", 0))
        return probe.getsockname()[1]


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher dies, however it dies (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def resume_line(run_dir: str, collectors: int) -> str:
    from dqn_cartpole.cli.summary import resume_command

    return f"{resume_command(run_dir)} --topology local --collectors {collectors}"


@dataclass
class Child:
    """One role's process, its command and its log (None: it writes to the launcher's console)."""

    name: str
    argv: list
    log_path: Optional[str]
    process: Optional[subprocess.Popen] = None
    restarts: int = 0
    log: Optional[IO] = field(default=None, repr=False)

    def start(self) -> None:
        if self.log_path:
            self.log = open(self.log_path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
        out = self.log or None
        # Its own session: a terminal's Ctrl-C reaches the launcher only, which decides the order of the stop.
        self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT if out else None,
                                        start_new_session=True, preexec_fn=die_with_parent)

    def exited(self) -> Optional[int]:
        return None if self.process is None else self.process.poll()

    def send(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self, timeout_s: float = STOP_WAIT_S, signum: int = signal.SIGTERM) -> Optional[int]:
        """SIGTERM, then SIGKILL after `timeout_s`; returns the exit status."""
        if self.process is None:
            return None
        self.send(signum)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.log:
            self.log.close()
            self.log = None
        return self.process.returncode


class LocalTopology:
    """The replay server, the learner and the collectors of one run, as child processes."""

    def __init__(self, config_file: str, run_dir: str, port: int, collectors: int, resume: bool, quiet: bool):
        self.run_dir, self.collectors_wanted = run_dir, collectors
        roles = RunLayout(run_dir).roles
        os.makedirs(roles, exist_ok=True)
        common = ["--config", config_file, "--replay-address", f"localhost:{port}", "--run-dir", run_dir]
        python = [sys.executable, "-m", "dqn_cartpole"]
        self.server = Child("replay server", python + ["replay-server", *common],
                            os.path.join(roles, "replay-server.log"))
        # The roles start while the server does (TensorFlow's import is most of each start-up): they wait
        # for it as long as the launcher does.
        common += ["--set", f"distributed.connect_timeout_s={SERVER_START_S:g}"]
        learn = ["learn", *common, "--supervised"] + (["--resume"] if resume else []) + (["--quiet"] if quiet else [])
        self.learner = Child("learner", python + learn, None)
        self.evaluator = Child("evaluator", python + ["evaluate-live", *common], os.path.join(roles, "evaluator.log"))
        self.collectors = [Child(f"collector {i}", python + ["collect", *common, "--collector-id", str(i)],
                                 os.path.join(roles, f"collector-{i}.log")) for i in range(collectors)]

    def children(self) -> list:
        return [self.server, self.learner, self.evaluator, *self.collectors]

    def restartable(self) -> list:
        """The roles that are started again when they die (the run's state is the learner's and the server's)."""
        return [self.evaluator, *self.collectors]

    def wait_for_server(self, stop: signals.StopRequest) -> None:
        """Waits for the server's ready line (or a stop request); a one-line UserError if it exits or does not
        come up in time."""
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline and not stop.requested:
            if self.server.exited() is not None:
                raise UserError(f"the replay server did not start: {last_line(self.server.log_path)}")
            if READY_LINE in read_text(self.server.log_path):
                return
            time.sleep(POLL_S)
        if stop.requested:
            return
        raise UserError(f"the replay server did not start within {SERVER_START_S:.0f} s")

    def run(self, stop: signals.StopRequest) -> int:
        """Starts every role and supervises them; returns the launcher's exit status."""
        try:
            self.server.start()
            self.learner.start()
            for child in self.restartable():
                child.start()
            self.wait_for_server(stop)
            return self.supervise(stop)
        finally:
            self.stop_all()

    def supervise(self, stop: signals.StopRequest) -> int:
        forwarded = False
        while True:
            if stop.requested and not forwarded:
                self.learner.send(stop.signum)  # the learner checkpoints (the table too) before it exits
                forwarded = True
            status = self.learner.exited()
            if status is not None:
                return self.learner_ended(status, stop)
            if self.server.exited() is not None:
                print(f"error: the replay server exited ({self.server.exited()}); see {self.server.log_path}. "
                      f"Resume with:\n  {resume_line(self.run_dir, self.collectors_wanted)}", file=sys.stderr)
                return EXIT_FAILED
            if not stop.requested:
                self.restart_dead_roles()
            time.sleep(POLL_S)

    def restart_dead_roles(self) -> None:
        """Starts again a collector or the evaluator that died (status 0: it saw the run's stop, and stays out)."""
        for child in self.restartable():
            status = child.exited()
            if status not in (None, 0):
                child.restarts += 1
                print(f"warning: {child.name} exited with status {status}; restarting it "
                      f"(restart {child.restarts}, log {child.log_path})", file=sys.stderr, flush=True)
                if child.log:
                    child.log.close()
                child.start()

    def learner_ended(self, status: int, stop: signals.StopRequest) -> int:
        if stop.requested:
            print(f"Every role is stopped. Resume the run with:\n  {resume_line(self.run_dir, self.collectors_wanted)}",
                  file=sys.stderr)
            return signals.exit_status(stop.signum)
        if status in (0, 1):  # finished, solved, or diverged (the learner said which)
            return status
        print(f"error: the learner exited with status {status}; every role is stopped. Its newest checkpoint is "
              f"kept; resume with:\n  {resume_line(self.run_dir, self.collectors_wanted)}", file=sys.stderr)
        return EXIT_FAILED

    def stop_all(self) -> None:
        """Collectors and the evaluator first (nothing then waits on the server), the learner, then the server
        (it checkpoints).

        A collector blocked in a Reverb call (a samples-per-insert ratio waiting on a learner that is gone)
        never sees its SIGTERM: after STOP_WAIT_S it is killed, all collectors at once.
        """
        for child in self.restartable():
            child.send(signal.SIGTERM)
        for child in [*self.restartable(), self.learner, self.server]:
            child.stop()


def read_text(path: Optional[str]) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (OSError, TypeError):
        return ""


def last_line(path: Optional[str]) -> str:
    lines = [l for l in read_text(path).splitlines() if l.strip()]
    return lines[-1] if lines else "no output"


def launch(config: Config, run_dir: str, collectors: int, plan: Optional[checkpointing.ResumePlan],
           quiet: bool) -> int:
    """Writes the run's config, stages a resumed table, then runs the local topology. The caller holds the lock."""
    from dqn_cartpole.replay.reverb_tables import check_port_free

    port = config.replay.reverb_port or free_port()
    check_port_free(port)
    layout = RunLayout(run_dir)
    write_text_atomic(layout.config, dump_yaml(config))
    os.makedirs(layout.checkpoints, exist_ok=True)
    # The server loads the shared replay's table from here; a queue to a learner-side replay starts empty.
    shared = config.distributed.replay == "server"
    checkpointing.stage_reverb(layout.checkpoints, plan.found if plan and shared else None)
    print(f"Local topology: a replay server on port {port}, a learner, an evaluator and {collectors} collector(s) -> "
          f"{run_dir} "
          f"(logs in {layout.roles})", flush=True)
    topology = LocalTopology(layout.config, run_dir, port, collectors, plan is not None, quiet)
    with signals.StopRequest() as stop:
        status = topology.run(stop)
    redraw(run_dir)
    return status


def redraw(run_dir: str) -> None:
    """Redraws the plots and report.html once every role has stopped: the learner drew them before the
    collectors wrote their last rows."""
    from dqn_cartpole.report.command import redraw_run  # matplotlib, no TensorFlow

    if not os.path.exists(RunLayout(run_dir).summary):
        return  # the learner never finished: nothing was drawn
    try:
        redraw_run(run_dir)
    except Exception as exc:  # pylint: disable=broad-except  # the run is saved; only the redraw failed
        print(f"warning: could not redraw the plots of {run_dir}: {exc}", file=sys.stderr)
