"""Every call to the Reverb server has a deadline and a stop path (issue 16).

Reverb 0.14 retries a server that is gone for ever, and a signal handler never runs while the main thread is in
its C++ client. In this process: the status tables' and the weights' calls against a stopped embedded server give
up within their deadline; the stop request's watchdog ends a process stuck in such a call; a learner's compiled
chunk blocked on a gone server is cancelled and checkpointed. In subprocesses: a role blocked on a dead server
exits within 10 s of SIGTERM with 143.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def finishes(call, within_s: float):
    """(finished, result or exception) of `call()` run on a daemon thread given `within_s` (today's code would
    block the test for ever)."""
    outcome = {}

    def run():
        try:
            outcome["result"] = call()
        except BaseException as exc:  # pylint: disable=broad-except
            outcome["result"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within_s)
    return not thread.is_alive(), outcome.get("result")


def cartpole_agent(stack):
    from dqn_cartpole.config import load_config
    from dqn_cartpole.distributed import parts

    config = load_config(None, ["replay.backend=reverb"])
    _, _, agent = parts.agent_with_envs(config, 1, 0, stack)
    return config, agent


@pytest.fixture
def short_deadlines(monkeypatch):
    from dqn_cartpole.distributed import status
    from dqn_cartpole.replay import deadlines

    monkeypatch.setattr(status, "TIMEOUT_S", 1.0)
    monkeypatch.setattr(deadlines, "CALL_TIMEOUT_S", 1.0)


def test_status_reads_and_weight_pulls_give_up_on_a_stopped_server_within_their_deadline(short_deadlines):
    import reverb

    from dqn_cartpole.distributed import status
    from dqn_cartpole.distributed.variables import WeightSync, make_variables_table
    from dqn_cartpole.replay.deadlines import ServerUnanswered

    with contextlib.ExitStack() as stack:
        _, agent = cartpole_agent(stack)
        server = reverb.Server([make_variables_table(agent), *status.make_tables()])
        address = f"localhost:{server.port}"
        client = reverb.Client(address)
        sync = WeightSync(address, agent)
        sync.push()
        status.publish_evaluation(client, status.Evaluation(10, 20, 30.0, 30.0, 1))
        info = client.server_info(timeout=5)
        assert status.read_evaluation(client, info).train_step == 10 and sync.pull() == 0
        server.stop()  # the items are still listed in `info`: the sample itself must give up
        started = time.monotonic()
        for call in (lambda: status.read_evaluation(client, info), sync.pull):
            done, result = finishes(call, within_s=6)
            assert done, "a Reverb call waited on a stopped server without a deadline"
            assert isinstance(result, (ServerUnanswered, RuntimeError)), result
        assert time.monotonic() - started < 6
