"""The `replay-server` role: a standalone Reverb server with the replay's tables, `variables`, `evaluation` and `stop`.

The replay's tables are the queue to a learner that keeps the replay itself (`distributed.replay:
learner`), or the shared replay tables (`server`). It never calls `server.wait()` (which blocks
Python's signal handlers): it polls the stop request and, holding the shared replay, checkpoints
its tables into the run folder on a timer and once more when stopped. A queue is not
checkpointed: the learner's checkpoint holds the replay.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

from dqn_cartpole.config import Config
from dqn_cartpole.console import exit_status, signals
from dqn_cartpole.core import build
from dqn_cartpole.distributed import parts, status
from dqn_cartpole.distributed.variables import VARIABLES_TABLE, make_variables_table
from dqn_cartpole.replay import deadlines
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.layout import RunLayout

log = logging.getLogger(__name__)
POLL_S = 0.25


def announce(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def serve(config: Config, port: int, run_dir: str) -> int:
    """Serves until SIGINT/SIGTERM; returns the exit status (128 + the signal)."""
    checkpoints = RunLayout(run_dir).checkpoints
    checkpoint_dir = checkpointing.reverb_server_dir(checkpoints)
    os.makedirs(checkpoint_dir, exist_ok=True)  # the launcher stages a resumed run's table here first
    holds_replay = config.distributed.replay == "server"
    if holds_replay:  # started again within the run: its newest table, not an empty one
        restaged = checkpointing.restage_newest_table(checkpoints)
        if restaged is not None:
            announce(f"replay server: loading the replay table of {restaged}, the run's newest checkpoint")
    with signals.StopRequest(give_up_after_s=signals.ROLE_GIVE_UP_S) as stop, contextlib.ExitStack() as stack:
        _, _, agent = parts.agent_with_envs(config, 1, config.training.seed, stack)
        server = build.start_replay_server(config.replay, agent.collect_data_spec, agent.window_length, stack,
                                           checkpoint_dir, announce,
                                           extra_tables=[make_variables_table(agent), *status.make_tables()],
                                           port=port,
                                           replay_tables=build.distributed_replay_tables(config, agent.collect_data_spec))
        import reverb

        client = reverb.Client(server.address)
        # A restored checkpoint's weights, result and stop belong to the learner before the stop: the roles
        # wait for this learner's first push, and a resumed run must not stop at once.
        deadlines.within(deadlines.CALL_TIMEOUT_S, lambda: client.reset(VARIABLES_TABLE), "reset variables")
        status.clear(client)
        announce(f"replay server ready at port {server.port}")
        every_s = config.distributed.server_checkpoint_s if holds_replay else None
        next_checkpoint = time.monotonic() + every_s if every_s else float("inf")
        while not stop.requested:
            time.sleep(POLL_S)
            if time.monotonic() >= next_checkpoint:
                deadlines.checkpoint(client)
                next_checkpoint = time.monotonic() + every_s
        if holds_replay:
            deadlines.checkpoint(client)  # a stopped server leaves its newest table behind
        announce(f"replay server on port {server.port} stopped")
    return exit_status.for_signal(stop.signum)
