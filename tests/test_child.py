"""`processes.child`, the one way the package starts and talks to a worker-like child (the plotter, the renderer,
the snapshot evaluator), with a child module written here: messages both ways in order, the child's prints kept out
of its messages, its warnings passed on, its peak memory as its last message, and one line when it fails."""

from __future__ import annotations

import os
import signal
import textwrap

import pytest

from dqn_cartpole.processes.child import WorkerChild, ChildFailed

ECHO = """
    import sys
    from dqn_cartpole.processes.child import serve

    def serve_child():
        def answer(message, reply):
            print("a print of the child's own")  # goes to stderr, not among the messages
            if message == "warn":
                print("warning: something the parent passes on", file=sys.stderr)
            elif message == "fail":
                raise ValueError("it cannot do that\\nsecond line")
            elif message == "hang":
                import time
                time.sleep(60)
            else:
                reply(("twice", message * 2))
                reply(("big", bytes(1 << 20)))  # larger than a pipe holds
        return serve(answer)
"""


@pytest.fixture()
def echo_module(tmp_path, monkeypatch):
    (tmp_path / "echo_child.py").write_text(textwrap.dedent(ECHO))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    return "echo_child"


def test_messages_go_both_ways_in_order_and_the_last_is_the_peak_memory(echo_module, capsys):
    child = WorkerChild(echo_module, what="the echo")
    try:
        for value in (1, "ab", 3):
            child.send(value)
        child.send("warn")
        answers = [child.receive() for _ in range(6)]
    finally:
        problem = child.wait()
    assert [answer for answer in answers if answer[0] == "twice"] == [("twice", 2), ("twice", "abab"), ("twice", 6)]
    assert [len(answer[1]) for answer in answers if answer[0] == "big"] == [1 << 20] * 3
    assert problem is None and child.process.returncode == 0 and 5 < child.peak_rss_mb < 1000
    assert capsys.readouterr().err.strip() == "warning: something the parent passes on"


def test_a_child_that_raises_is_one_line_and_receive_says_it(echo_module):
    child = WorkerChild(echo_module, what="the echo")
    child.send("fail")
    with pytest.raises(ChildFailed) as failed:
        child.receive()
    assert str(failed.value) == "error: ValueError: it cannot do that"
    assert child.wait() == "error: ValueError: it cannot do that"


def test_a_killed_child_is_one_line_and_close_ends_a_child_that_outlives_it(echo_module):
    child = WorkerChild(echo_module, what="the echo")
    child.send("hang")
    child.process.send_signal(signal.SIGKILL)
    with pytest.raises(ChildFailed) as failed:
        child.receive()
    assert str(failed.value) == "the echo exited with status -9"
    hung = WorkerChild(echo_module, what="the echo")
    hung.send("hang")
    hung.close(timeout_s=1.0)
    assert hung.process.returncode == -signal.SIGKILL
