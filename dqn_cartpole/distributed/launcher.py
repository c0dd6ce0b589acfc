"""`train --topology local --collectors N`: every role as its own OS process on this machine (the local placement).

The launcher stays light (no TensorFlow): it checks the input, creates and locks the run folder, writes the resolved
config.yaml every role reads, stages a resumed run's replay table, then starts the replay server, the learner, the
evaluator and N collectors as child processes (`processes.supervisor`) under the topology's rules (`policy.LOCAL`,
applied by `supervision`; what they restart, what ends the run and how it stops: docs/distributed.md). Every child
gets SIGTERM if the launcher itself dies, and a reaper process (`reaper`) kills what is left of them 10 s later; every
role inherits the run folder's lock (`run_folder.lock`): no `train --resume` starts beside any of them, even after
the launcher's death.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from typing import Optional

from dqn_cartpole.config import Config, check_prioritized_across_processes, dump_yaml
from dqn_cartpole.console import signals
from dqn_cartpole.distributed import policy, reaper
from dqn_cartpole.distributed.policy import Role
from dqn_cartpole.distributed.supervision import Ended, Event, Placed, Supervision
from dqn_cartpole.errors import UserError
from dqn_cartpole.processes.commands import child_command, resume_command
from dqn_cartpole.processes.supervisor import Child, stop_all
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.tracking.send import send_run
from dqn_cartpole.tracking.stream import streamed
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.lock import RunLock
from dqn_cartpole.run_folder.placement import PlacementRecord
from dqn_cartpole.run_folder.resolve import removed_on_bad_input


def free_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::", 0))
        return probe.getsockname()[1]


class LocalPlacement:
    """The roles as child processes of this launcher (`supervision.Placement`), each in its own session, tied
    to the launcher's life, holding the run's lock (`keep_fds`)."""

    def __init__(self, config_file: str, run_dir: str, port: int, resume: bool, quiet: bool, keep_fds: tuple = ()):
        self.config_file, self.run_dir, self.port = config_file, run_dir, port
        self.resume, self.quiet, self.keep_fds = resume, quiet, keep_fds
        self.children: dict = {}  # Role -> Child
        self.reported: set = set()  # roles whose current process's end was reported
        self.started: list = []  # Placed events not yet returned
        os.makedirs(RunLayout(run_dir).roles, exist_ok=True)

    def command(self, role: Role, restart: bool) -> list:
        resume = self.resume or (restart and role.kind == policy.LEARNER)
        return child_command(policy.role_argv(role, self.config_file, f"localhost:{self.port}", self.run_dir,
                                              resume, self.quiet))

    def start(self, role: Role, restart: bool) -> None:
        child = self.children.get(role)
        if child is None:
            log = None if role.kind == policy.LEARNER else self.log_path(role)  # the learner's: the console
            child = self.children[role] = Child(role.name, [], log, keep_fds=self.keep_fds,
                                                extra_env=reaper.marker())  # what the reaper kills if we die
        child.command = self.command(role, restart)
        child.start()
        self.reported.discard(role)
        self.started.append(Placed(role, {"node_ip": "localhost", "pid": child.process.pid}))

    def wait(self, timeout_s: float) -> list[Event]:
        if timeout_s > 0:
            time.sleep(timeout_s)
        events, self.started = list(self.started), []
        for role, child in self.children.items():
            if role not in self.reported and child.returncode is not None:
                self.reported.add(role)
                events.append(Ended(role, child.returncode, child.last_error()))
        return events

    def send(self, role: Role, signum: int) -> None:
        self.children[role].send(signum)

    def stop(self, roles: list, grace_s: float, signum: int) -> None:
        stop_all([self.children[role] for role in roles if role in self.children], grace_s, signum)

    def log_path(self, role: Role) -> str:
        return os.path.join(RunLayout(self.run_dir).roles, role.log_name) if role.kind != policy.LEARNER \
            else "the console above"


class LocalTopology:
    """The replay server, the learner, the evaluator and the collectors of one run, as child processes."""

    def __init__(self, config_file: str, run_dir: str, port: int, collectors: int, resume: bool, quiet: bool,
                 keep_fds: tuple = ()):
        self.run_dir = run_dir
        self.placement = LocalPlacement(config_file, run_dir, port, resume, quiet, keep_fds)
        self.supervision = Supervision(self.placement, policy.make_roles(collectors), policy.LOCAL, run_dir,
                                       f"localhost:{port}", policy.topology_args("local", collectors),
                                       PlacementRecord(run_dir, "local"))

    def run(self, stop: signals.StopRequest) -> int:
        """Starts every role and supervises them; returns the launcher's exit status."""
        guard = reaper.start(self.run_dir)
        try:
            return self.supervision.run(stop)
        finally:
            reaper.finish(guard)


def local_config(config: Config, run_dir: str, plan: Optional[checkpointing.ResumePlan],
                 topology: str = "local") -> Config:
    """The run's config as the roles share it (replay.backend: reverb), or a one-line UserError: a resumed run
    must have kept its replay in Reverb, and with a shared table, its checkpoint must hold that table."""
    check_prioritized_across_processes(config, f"--topology {topology}")
    if plan is not None and config.replay.backend != "reverb":  # its replay is in the checkpoint, not in a server
        raise UserError(f"--resume {run_dir}: the run's replay is {config.replay.backend}, and --topology {topology} "
                        f"shares a Reverb server; continue it in one process: {resume_command(run_dir)}")
    if config.distributed.replay == "server" and plan is not None and plan.found is not None and not os.path.isdir(
            os.path.join(plan.found.path, checkpointing.REVERB_DIR)):
        raise UserError(f"--resume {run_dir}: {plan.found.name} holds no Reverb table to restore")
    if config.replay.backend == "reverb":
        return config
    print(f"note: --topology {topology} shares the replay through a Reverb server: replay.backend: reverb",
          file=sys.stderr)
    return dataclasses.replace(config, replay=dataclasses.replace(config.replay, backend="reverb", sampling="dataset"))


def launch(config: Config, run_dir: str, collectors: int, plan: Optional[checkpointing.ResumePlan],
           quiet: bool, created: bool, lock: RunLock) -> int:
    """Writes the run's config, stages a resumed table, then runs the local topology; bad input removes the run
    folder if this command `created` it. The caller holds the `lock`, which every role inherits."""
    from dqn_cartpole.replay.reverb_tables import check_port_free

    with removed_on_bad_input(run_dir, created):
        port = config.replay.reverb_port or free_port()
        check_port_free(port)
        layout = prepare_folder(config, run_dir, plan)
        print(f"Local topology: a replay server on port {port}, a learner, an evaluator and {collectors} collector(s) "
              f"-> {run_dir} (logs in {layout.roles})", flush=True)
        topology = LocalTopology(layout.config, run_dir, port, collectors, plan is not None, quiet, lock.fds())
        with signals.StopRequest() as stop, streamed(config, run_dir):
            status = topology.run(stop)
        redraw(run_dir)
        send_run(config, run_dir)  # --track: once every role stopped and the plots are final
        return status


def prepare_folder(config: Config, run_dir: str, plan: Optional[checkpointing.ResumePlan]) -> RunLayout:
    """Writes the run's config.yaml (which every role reads) and stages a resumed run's shared table."""
    layout = RunLayout(run_dir)
    write_text_atomic(layout.config, dump_yaml(config))
    os.makedirs(layout.checkpoints, exist_ok=True)
    # The server loads the shared replay's table from here; a queue to a learner-side replay starts empty.
    shared = config.distributed.replay == "server"
    checkpointing.stage_reverb(layout.checkpoints, plan.found if plan and shared else None)
    return layout


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
