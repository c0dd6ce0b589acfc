"""`train --topology local --collectors N`: every role as its own OS process on this machine, supervised.

The launcher stays light (no TensorFlow): it checks the input, creates and locks the run
folder, writes the resolved config.yaml every role reads, stages a resumed run's replay table,
then starts the replay server, the learner, the evaluator and N collectors and watches them:

* a collector or the evaluator that dies is started again after a backoff (0.25 s, doubling up to 8 s);
  one that dies more than 5 times within 120 s stops the run (exit status 1 and the resume command);
* the learner finishing (or the evaluator's confirmed solve) stops the collectors and the evaluator
  through the server's `stop` table, then the launcher stops the server;
* the learner dying stops everything and prints the command that resumes the run;
* Ctrl-C / SIGTERM is passed to the learner (which checkpoints), then the rest are stopped;
  the exit status is 130 / 143. Every child also gets SIGTERM if the launcher itself dies, and a
  reaper process (`reaper`) kills what is left of them 10 s later.

Every role inherits the run folder's lock (`run_folder.lock`): no `train --resume` starts beside any of them,
even after the launcher's death.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import sys
import time
from typing import Optional

from dqn_cartpole.config import Config, dump_yaml
from dqn_cartpole.console import exit_status, signals
from dqn_cartpole.distributed import reaper
from dqn_cartpole.errors import UserError
from dqn_cartpole.processes.commands import child_command, resume_command
from dqn_cartpole.processes.supervisor import DIED, GAVE_UP, Backoff, Child, stop_all
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.lock import RunLock

POLL_S = 0.25
SERVER_START_S = 120.0  # TensorFlow's import on a loaded machine
STOP_WAIT_S = 12.0  # every role ends within 10 s of SIGTERM; then it is killed
READY_LINE = "replay server ready"
RESTART_BACKOFF = Backoff(first_s=0.25, max_s=8.0, max_restarts=5, window_s=120.0)


def free_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::", 0))
        return probe.getsockname()[1]


def resume_line(run_dir: str, collectors: int) -> str:
    return resume_command(run_dir, "--topology", "local", "--collectors", str(collectors))


class LocalTopology:
    """The replay server, the learner and the collectors of one run, as child processes."""

    def __init__(self, config_file: str, run_dir: str, port: int, collectors: int, resume: bool, quiet: bool,
                 keep_fds: tuple = ()):
        self.run_dir, self.collectors_wanted = run_dir, collectors
        roles = RunLayout(run_dir).roles
        os.makedirs(roles, exist_ok=True)
        common = ["--config", config_file, "--replay-address", f"localhost:{port}", "--run-dir", run_dir]
        self.server = Child("replay server", child_command(["replay-server", *common]),
                            os.path.join(roles, "replay-server.log"))
        # The roles start while the server does (TensorFlow's import is most of each start-up): they wait
        # for it as long as the launcher does.
        common += ["--set", f"distributed.connect_timeout_s={SERVER_START_S:g}"]
        learn = ["learn", *common, "--supervised"] + (["--resume"] if resume else []) + (["--quiet"] if quiet else [])
        self.learner = Child("learner", child_command(learn), None)
        self.evaluator = Child("evaluator", child_command(["evaluate-live", *common]),
                               os.path.join(roles, "evaluator.log"))
        self.collectors = [Child(f"collector {i}", child_command(["collect", *common, "--collector-id", str(i)]),
                                 os.path.join(roles, f"collector-{i}.log")) for i in range(collectors)]
        for child in self.children():
            child.keep_fds = keep_fds  # the run's lock lives as long as any role does
            child.extra_env = reaper.marker()  # what the reaper kills if this launcher dies

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
            if self.server.returncode is not None:
                raise UserError(f"the replay server did not start: {self.server.last_line() or 'no output'}")
            if READY_LINE in self.server.output():
                return
            time.sleep(POLL_S)
        if stop.requested:
            return
        raise UserError(f"the replay server did not start within {SERVER_START_S:.0f} s")

    def run(self, stop: signals.StopRequest) -> int:
        """Starts every role and supervises them; returns the launcher's exit status."""
        guard = reaper.start(self.run_dir)
        try:
            for child in self.children():
                child.start()
            self.wait_for_server(stop)
            return self.supervise(stop)
        finally:
            self.stop_all()
            reaper.finish(guard)

    def supervise(self, stop: signals.StopRequest) -> int:
        forwarded = False
        while True:
            if stop.requested and not forwarded:
                self.learner.send(stop.signum)  # the learner checkpoints (the table too) before it exits
                forwarded = True
            status = self.learner.returncode
            if status is not None:
                return self.learner_ended(status, stop)
            if self.server.returncode is not None:
                print(f"error: the replay server exited ({self.server.returncode}); see {self.server.log_path}. "
                      f"Resume with:\n  {resume_line(self.run_dir, self.collectors_wanted)}", file=sys.stderr)
                return exit_status.EXIT_FAILED
            if not stop.requested and not self.restart_dead_roles():
                return exit_status.EXIT_FAILED
            time.sleep(POLL_S)

    def restart_dead_roles(self) -> bool:
        """Starts again, after a backoff, a collector or the evaluator that died (status 0: it saw the run's stop,
        and stays out). False once a role died too often to go on."""
        for child in self.restartable():
            event = child.keep_alive(RESTART_BACKOFF)
            if event == DIED:
                print(f"warning: {child.name} exited with status {child.returncode}; restarting it in "
                      f"{child.restart_at - time.monotonic():.2f} s (restart {child.restarts + 1}, log "
                      f"{child.log_path})", file=sys.stderr, flush=True)
            elif event == GAVE_UP:
                print(f"error: {child.name} exited with status {child.returncode} after "
                      f"{RESTART_BACKOFF.max_restarts} restarts within {RESTART_BACKOFF.window_s:.0f} s: "
                      f"{child.last_error() or 'no output'} (log {child.log_path}); every role is stopped. "
                      f"Resume with:\n  {resume_line(self.run_dir, self.collectors_wanted)}", file=sys.stderr)
                return False
        return True

    def learner_ended(self, status: int, stop: signals.StopRequest) -> int:
        if stop.requested:
            print(f"Every role is stopped. Resume the run with:\n  {resume_line(self.run_dir, self.collectors_wanted)}",
                  file=sys.stderr)
            return exit_status.for_signal(stop.signum)
        if status in (exit_status.EXIT_OK, exit_status.EXIT_FAILED):  # finished, solved, or diverged
            return status
        print(crash_line("the learner", status, self.run_dir, self.collectors_wanted), file=sys.stderr)
        return exit_status.EXIT_FAILED

    def stop_all(self) -> None:
        """The collectors, the evaluator and the learner together, then the server; each gets one SIGTERM.

        Every role ends within 10 s of its SIGTERM, even blocked on a server that is gone (the learner first
        writes its checkpoint), so they stop side by side; what is left after STOP_WAIT_S is killed. The server
        goes last: in `server` mode the learner's checkpoint asks it to checkpoint the shared table.
        """
        stop_all([*self.restartable(), self.learner], STOP_WAIT_S, signal.SIGTERM)
        stop_all([self.server], STOP_WAIT_S, signal.SIGTERM)


def crash_line(role: str, status: int, run_dir: str, collectors: int) -> str:
    """One line: `role` crashed (EXIT_CRASHED, a signal, or a status no role exits with), every role is stopped,
    the run's newest complete checkpoint and the command that resumes it."""
    how = f"was killed by {signals.signal_name(-status)}" if status < 0 else f"crashed (exit status {status})"
    found = checkpointing.plan_resume(run_dir).found
    last = f"its last checkpoint is {found.name}" if found else "it wrote no checkpoint yet"
    return (f"error: {role} {how}; every role is stopped; {last}; resume with: "
            f"{resume_line(run_dir, collectors)}")


def local_config(config: Config, run_dir: str, plan: Optional[checkpointing.ResumePlan]) -> Config:
    """The run's config as the roles share it (replay.backend: reverb), or a one-line UserError: a resumed run
    must have kept its replay in Reverb, and with a shared table, its checkpoint must hold that table."""
    if plan is not None and config.replay.backend != "reverb":  # its replay is in the checkpoint, not in a server
        raise UserError(f"--resume {run_dir}: the run's replay is {config.replay.backend}, and --topology local "
                        f"shares a Reverb server; continue it in one process: {resume_command(run_dir)}")
    if config.distributed.replay == "server" and plan is not None and plan.found is not None and not os.path.isdir(
            os.path.join(plan.found.path, checkpointing.REVERB_DIR)):
        raise UserError(f"--resume {run_dir}: {plan.found.name} holds no Reverb table to restore")
    if config.replay.backend == "reverb":
        return config
    print("note: --topology local shares the replay through a Reverb server: replay.backend: reverb", file=sys.stderr)
    return dataclasses.replace(config, replay=dataclasses.replace(config.replay, backend="reverb", sampling="dataset"))


def launch(config: Config, run_dir: str, collectors: int, plan: Optional[checkpointing.ResumePlan],
           quiet: bool, created: bool, lock: RunLock) -> int:
    """Runs the local topology; bad input removes the run folder if this command `created` it. The caller holds
    the `lock`, which every role inherits."""
    try:
        return run_topology(config, run_dir, collectors, plan, quiet, lock)
    except UserError:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)  # bad input leaves no run folder behind
        raise


def run_topology(config: Config, run_dir: str, collectors: int, plan: Optional[checkpointing.ResumePlan],
                 quiet: bool, lock: RunLock) -> int:
    """Writes the run's config, stages a resumed table, then runs the local topology."""
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
    topology = LocalTopology(layout.config, run_dir, port, collectors, plan is not None, quiet, lock.fds())
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
