"""One topology's run under its rules (`policy`), on any placement: start, readiness, restarts, the end, the stop.

A placement (`launcher.LocalPlacement`: child processes; `ray_placement.RayPlacement`: Ray actors) knows
only how to start, signal and stop one role and how to hear of its end (`Placement`); everything else is
here: the restart backoff and its window, the companions a restart takes with it, what ends the run and
with which line, the stop order, and `roles/placement.json` (where each role runs now, its pid and its
restarts), which any placement feeds through `Placed` events.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Protocol, Union

from dqn_cartpole.console import exit_status, signals
from dqn_cartpole.distributed import policy
from dqn_cartpole.distributed.policy import Role
from dqn_cartpole.errors import UserError
from dqn_cartpole.processes.commands import resume_command
from dqn_cartpole.processes.supervisor import RestartWindow
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.placement import PlacementRecord

POLL_S = 0.25


@dataclass(frozen=True)
class Ended:
    """`role` ended with `status` (None: its process or its node vanished without one); `why`: its last error."""

    role: Role
    status: Optional[int]
    why: str = ""


@dataclass(frozen=True)
class Placed:
    """`role` runs now at `where` (node IP, node id, pids: what `roles/placement.json` records)."""

    role: Role
    where: dict


Event = Union[Ended, Placed]


class Placement(Protocol):
    """How one placement runs roles; see the module docstring."""

    def start(self, role: Role, restart: bool) -> None:
        """Starts `role` (again, after it ended, if `restart`: the learner then resumes its checkpoint)."""

    def wait(self, timeout_s: float) -> list[Event]:
        """Waits up to `timeout_s` and returns what happened since the last call (each end reported once)."""

    def send(self, role: Role, signum: int) -> None:
        """Sends `signum` to the running `role`."""

    def stop(self, roles: list[Role], grace_s: float, signum: int) -> None:
        """One `signum` to each running role of `roles`, then SIGKILL to what is left after `grace_s`."""

    def log_path(self, role: Role) -> str:
        """Where a person reads `role`'s output (in the run folder)."""


@dataclass
class RoleState:
    window: RestartWindow
    running: bool = True
    restart_at: Optional[float] = None  # a pending restart (time.monotonic())
    placed_by: Optional[float] = None  # a restarted role must be placed again by then


@dataclass
class Supervision:
    """The run's roles on `placement` under `rules`; `run(stop)` returns the topology's exit status."""

    placement: Placement
    roles: list
    rules: policy.Rules
    run_dir: str
    probe_address: str  # where the server answers the placement's process
    topology_args: tuple  # what the resume command adds: --topology ... --collectors N
    record: PlacementRecord
    states: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.states = {role: RoleState(RestartWindow(self.rules.backoff)) for role in self.roles}
        self.learner = next(role for role in self.roles if role.kind == policy.LEARNER)
        self.server = next(role for role in self.roles if role.kind == policy.SERVER)

    def run(self, stop: signals.StopRequest) -> int:
        try:
            for role in self.roles:
                self.placement.start(role, restart=False)
            return self.supervise(stop)
        finally:
            self.stop_all()

    def resume(self) -> str:
        return resume_command(self.run_dir, *self.topology_args)

    def supervise(self, stop: signals.StopRequest) -> int:
        """Until the run ends: its status. A one-line UserError if the server ends before it ever answered, or
        does not answer Reverb's ServerInfo within SERVER_START_S."""
        ready, ready_by, forwarded = False, time.monotonic() + policy.SERVER_START_S, False
        while True:
            if stop.requested and not forwarded:
                self.placement.send(self.learner, stop.signum)  # the learner checkpoints (the table too) first
                forwarded = True
            for event in self.placement.wait(POLL_S):
                if not ready and isinstance(event, Ended) and event.role == self.server and self.failed_start(event):
                    raise UserError(f"the replay server did not start: it {policy.how_it_ended(event.status)}: "
                                    f"{event.why or 'no output'} (log {self.placement.log_path(self.server)})")
                outcome = self.take(event, stop)
                if outcome is not None:
                    return outcome
            if not ready:
                ready = policy.replay_answers(self.probe_address)
                if not ready and time.monotonic() > ready_by and not stop.requested:
                    raise UserError(f"the replay server did not start within {policy.SERVER_START_S:.0f} s "
                                    f"(log {self.placement.log_path(self.server)})")
            if not stop.requested:
                failed = self.restart_due()
                if failed is not None:
                    return failed

    @staticmethod
    def failed_start(event: Ended) -> bool:
        """Whether the server's end before it answered is its own failure to start (bad input, a port taken: exit
        status 2, or 1), which would happen again; a server that was killed, lost or crashed (its process could not
        be started) is restarted as at any time, under the policy's bound."""
        return event.status in (exit_status.EXIT_USAGE, exit_status.EXIT_FAILED)

    def take(self, event: Event, stop: Optional[signals.StopRequest] = None) -> Optional[int]:
        """Records a placement or handles an end (`stop` None: only records it); the run's exit status if it
        ends the run."""
        state = self.states[event.role]
        if isinstance(event, Placed):
            state.placed_by = None
            self.record.placed(event.role.name, event.where, state.window.restarts)
            return None
        state.running = False
        self.record.ended(event.role.name, policy.how_it_ended(event.status))
        if stop is None:
            return None
        if stop.requested:
            if event.role != self.learner:
                return None
            print(f"Every role is stopped. Resume the run with:\n  {self.resume()}", file=sys.stderr)
            return exit_status.for_signal(stop.signum)
        return self.ended(event)

    def ended(self, event: Ended) -> Optional[int]:
        role, status = event.role, event.status
        decision = policy.verdict(self.rules, role, status)
        if decision == policy.LEFT:
            return None
        if decision == policy.END_RUN:
            return status
        if decision == policy.FAIL:
            found = checkpointing.plan_resume(self.run_dir).found
            print(policy.crash_line(role, status, found.name if found else None, self.resume()), file=sys.stderr)
            return exit_status.EXIT_FAILED
        return self.schedule_restart(event)

    def schedule_restart(self, event: Ended) -> Optional[int]:
        role, state, now = event.role, self.states[event.role], time.monotonic()
        delay = state.window.due(now)
        log = self.placement.log_path(role)
        if delay is None:
            print(policy.gave_up_line(role, event.status, event.why, log, self.rules.backoff, self.resume()),
                  file=sys.stderr, flush=True)
            return exit_status.EXIT_FAILED
        state.restart_at = now + delay
        print(f"warning: {role.name} {policy.how_it_ended(event.status)}; restarting it in {delay:.2f} s (restart "
              f"{state.window.restarts + 1}, log {log})", file=sys.stderr, flush=True)
        return None

    def restart_due(self) -> Optional[int]:
        """Starts again each role whose backoff has passed, with its companions (stopped first; their restart is
        not theirs to count); the run's status if a restarted role could not be placed again in time."""
        now = time.monotonic()
        for role, state in self.states.items():
            if state.placed_by is not None and now > state.placed_by:
                print(f"error: {role.name} could not be started again within {policy.ROLE_START_S:.0f} s (no node "
                      f"could take it; log {self.placement.log_path(role)}); every role is stopped. Resume with: "
                      f"{self.resume()}", file=sys.stderr)
                return exit_status.EXIT_FAILED
            if state.restart_at is None or now < state.restart_at:
                continue
            running = {r for r, s in self.states.items() if s.running or s.restart_at is not None}
            companions = policy.companions(role, self.roles, running)
            self.restart(role, now, counted=True)  # first: it starts while its companions stop
            self.placement.stop([r for r in companions if self.states[r].running], policy.STOP_WAIT_S,
                                signal.SIGTERM)
            for companion in companions:
                self.states[companion].restart_at = None
                self.restart(companion, now, counted=False)
        return None

    def restart(self, role: Role, now: float, counted: bool) -> None:
        state = self.states[role]
        state.restart_at, state.running, state.placed_by = None, True, now + policy.ROLE_START_S
        if counted:
            state.window.restarted(now)
        self.placement.start(role, restart=True)

    def stop_all(self) -> None:
        """The collectors, the evaluator and the learner together, then the server; each gets one SIGTERM.

        Every role ends within 10 s of its SIGTERM, even blocked on a server that is gone (the learner first
        writes its checkpoint), so they stop side by side; what is left after STOP_WAIT_S is killed. The server
        goes last: in `server` mode the learner's checkpoint asks it to checkpoint the shared table.
        """
        for group in policy.stop_groups(self.roles):
            self.placement.stop(group, policy.STOP_WAIT_S, signal.SIGTERM)
        for event in self.placement.wait(0.0):
            self.take(event)
