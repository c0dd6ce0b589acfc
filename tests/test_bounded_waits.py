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


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::", 0))
        return probe.getsockname()[1]


BLOCKED_ON_A_CLOSED_PORT = """
import sys, time
import reverb
from dqn_cartpole.console import signals
with signals.StopRequest(give_up_after_s={give_up}) as stop:
    stop.when_signalled(lambda signum: print(f"seen {{signum}}", flush=True))
    client = reverb.Client("localhost:{port}")  # nothing listens: Reverb waits for it for ever
    print("blocked", flush=True)
    next(client.sample("variables"))
print("unreachable", flush=True)
"""


def start_python(code: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True)


class Lines:
    """A child's stdout, line by line, each waited for at most `timeout_s` (None once it has not come)."""

    def __init__(self, stream):
        import queue

        self.queue = queue.Queue()
        threading.Thread(target=lambda: [self.queue.put(line.strip()) for line in stream], daemon=True).start()

    def next(self, timeout_s: float):
        import queue

        try:
            return self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return None


def test_a_process_blocked_in_a_reverb_call_sees_sigterm_at_once_and_ends_with_143_after_its_grace():
    process = start_python(BLOCKED_ON_A_CLOSED_PORT.format(give_up=2.0, port=free_port()))
    lines = Lines(process.stdout)
    try:
        assert lines.next(60) == "blocked"
        time.sleep(0.5)  # in the C++ client by now
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        assert lines.next(5) == f"seen {int(signal.SIGTERM)}"  # the callback, at once
        seen_s = time.monotonic() - sent
        status = process.wait(timeout=10)
        ended_s = time.monotonic() - sent
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert status == 143, stderr[-2000:]
    assert seen_s < 1.0 and 1.9 < ended_s < 4.0, (seen_s, ended_s)
    gave_up = [line for line in stderr.splitlines() if "gave up waiting" in line]
    assert gave_up == ["error: still running 2 s after SIGTERM; gave up waiting (exit status 143)"], stderr[-2000:]
