"""`processes.child`, the one way the package starts and talks to a worker-like child (the plotter, the renderer,
the snapshot evaluator, the reused train process), with a child module written here: messages both ways in order, the
child's prints kept out of its messages, its warnings passed on, its peak memory as its last message, and one line
when it fails; an answer that ends the child with its status, a parent that polls, a child whose output goes to a log
and one tied to its parent's life."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from dqn_cartpole.processes.child import WorkerChild, ChildFailed

ECHO = """
    import os
    import sys
    from dqn_cartpole.processes.child import serve

    def serve_child():
        def answer(message, reply):
            if message == "hang":  # says so, then hangs (and prints nothing)
                import time
                reply(("hanging", None))
                time.sleep(60)
            print("a print of the child's own")  # goes to stderr, not among the messages
            if message == "warn":
                print("warning: something the parent passes on", file=sys.stderr)
            elif message == "fail":
                raise ValueError("it cannot do that\\nsecond line")
            elif message == "env":
                reply(("env", os.environ.get("ECHO_MARK")))
            elif message == "end":
                return 3  # it ends with this status, the messages after it unanswered
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
    assert child.receive() == ("hanging", None)
    child.process.send_signal(signal.SIGKILL)
    with pytest.raises(ChildFailed) as failed:
        child.receive()
    assert str(failed.value) == "the echo exited with status -9"
    hung = WorkerChild(echo_module, what="the echo")
    hung.send("hang")
    hung.close(timeout_s=1.0)
    assert hung.process.returncode == -signal.SIGKILL


def test_an_answer_ends_the_child_with_its_status_and_a_parent_can_poll(echo_module, tmp_path):
    log = tmp_path / "logs" / "child.log"
    child = WorkerChild(echo_module, what="the echo", log_path=str(log), extra_env={"ECHO_MARK": "here"})
    try:
        assert child.receive(block=False) is None  # nothing has come: it does not wait
        for message in ("env", "end", 5):
            child.send(message)
        answers, deadline = [], time.monotonic() + 60
        with pytest.raises(ChildFailed) as failed:
            while time.monotonic() < deadline:
                answer = child.receive(block=False)
                if answer is None:
                    time.sleep(0.05)
                answers += [answer] if answer is not None else []
    finally:
        child.close()
    assert answers == [("env", "here")], "the message after the ending answer is not answered"
    assert str(failed.value) == "the echo exited with status 3" and child.process.returncode == 3
    assert 5 < child.peak_rss_mb < 1000, "its peak memory still came, before its end"
    assert log.read_text().count("a print of the child's own") == 2  # its output in its log, not the parent's


PARENT = """
    import sys
    from dqn_cartpole.processes.child import WorkerChild

    child = WorkerChild("echo_child", tied=len(sys.argv) > 1)
    child.send("hang")
    child.receive()  # it is at its work
    print(child.process.pid, flush=True)
    child.process.wait()
"""


@pytest.mark.parametrize("tied", [True, False])
def test_a_tied_child_gets_sigterm_when_its_parent_dies(echo_module, tmp_path, tied):
    (tmp_path / "parent.py").write_text(textwrap.dedent(PARENT))
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), *(["tied"] if tied else [])],
                              stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    try:
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + (10 if tied else 1)
        while not ended(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ended(child) == tied, "a tied child ends with its parent; another one goes on with its work"
    finally:
        if not ended(child):
            child.kill()


def ended(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # ended, not yet reaped by whoever adopted it
    except psutil.NoSuchProcess:
        return True
