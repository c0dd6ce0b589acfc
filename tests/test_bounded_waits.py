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
import threading
import time

import pytest

from helpers import REPO, cartpole_agent, free_port


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


BLOCKED_ON_A_CLOSED_PORT = """
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


# ---------------------------------------------------------------------------- a learner whose server goes away

SMOKE = os.path.join(REPO, "configs", "smoke.yaml")
ROLE_GIVE_UP_S = 8.0  # console.signals.ROLE_GIVE_UP_S
NO_DATA_S = 3  # distributed.rate_limiter_timeout_ms in these tests, in seconds
LEARNER_SETS = ("--set", "replay.backend=reverb", "--set", "video.enabled=false", "--set",
                f"distributed.rate_limiter_timeout_ms={NO_DATA_S * 1000}", "--set", "distributed.connect_timeout_s=60")


def serve_a_learners_tables(stack, windows: int, queue_size: int = 0):
    """An embedded server with the tables the replay-server role serves for the smoke config (its queue to the
    learner, of 2-step windows, `queue_size` or exactly large enough), holding `windows` windows of CartPole steps: (server, config, an
    agent of the config)."""
    import numpy as np
    from tf_agents.trajectories import trajectory as trajectory_lib

    from dqn_cartpole.config import load_config
    from dqn_cartpole.core import build
    from dqn_cartpole.distributed import parts, status
    from dqn_cartpole.distributed.variables import make_variables_table
    from dqn_cartpole.replay import reverb_tables

    config = load_config(SMOKE, ["replay.backend=reverb"])
    _, _, agent = parts.agent_with_envs(config, 1, 0, stack)
    spec = agent.collect_data_spec
    server = build.start_replay_server(config.replay, spec, agent.window_length, stack,
                                       extra_tables=[make_variables_table(agent), *status.make_tables()],
                                       replay_tables=[reverb_tables.make_queue_table(spec, 2, queue_size or windows)])
    writers = build.make_stream_writers(config, spec, server.address, stack)
    for i in range(windows):
        writers.add_batch(trajectory_lib.mid(observation=np.full([1, 4], i % 7, np.float32),
                                             action=np.array([i % 2], np.int64), policy_info=(),
                                             reward=np.ones([1], np.float32), discount=np.ones([1], np.float32)))
    writers.flush()
    return server, config, agent


def queue_size(server) -> int:
    import reverb

    from dqn_cartpole.replay.reverb_tables import QUEUE_TABLE_NAME

    return int(reverb.Client(server.address).server_info(timeout=5)[QUEUE_TABLE_NAME].current_size)


def start_learner(server, run_dir: str, log_dir) -> subprocess.Popen:
    from helpers import start_cli

    return start_cli("learn", "--config", SMOKE, *LEARNER_SETS, "--replay-address", server.address, "--run-dir",
                     run_dir, "--quiet", log_dir=log_dir)


def drained(server, learner: subprocess.Popen, timeout_s: float) -> None:
    """Waits until the learner has read the whole queue (it then waits for more)."""
    deadline = time.monotonic() + timeout_s
    while queue_size(server) > 0:
        assert learner.poll() is None and time.monotonic() < deadline, "the learner did not read the queue"
        time.sleep(0.2)
    time.sleep(1.0)  # its read of the next window is waiting now


def newest_checkpoint(run_dir: str) -> dict:
    import json

    folder = os.path.join(run_dir, "checkpoints")
    names = sorted(n for n in os.listdir(folder) if n.startswith("ckpt-") and n[5:].isdigit())
    with open(os.path.join(folder, names[-1], "state.json")) as handle:
        return dict(json.load(handle), name=names[-1])


def test_a_learner_whose_first_fill_never_completes_leaves_with_one_line(tmp_path):
    """Its queue holds fewer windows than its first batch needs and no collector comes: the fill's read waits
    rate_limiter_timeout_ms, then the learner says so in one line and exits 3 (it used to crash with a traceback:
    "generator didn't yield")."""
    with contextlib.ExitStack() as stack:
        server, _, _ = serve_a_learners_tables(stack, windows=10)  # the smoke config fills 64 first
        learner = start_learner(server, str(tmp_path / "run"), tmp_path)
        stack.callback(lambda: learner.poll() is None and (learner.kill(), learner.wait()))
        status = learner.wait(timeout=120)
    stderr = (tmp_path / "stderr").read_text()
    assert status == 3 and "had no new data for 3 s" in stderr, (status, stderr[-2000:])
    assert "Traceback" not in stderr and "didn't yield" not in stderr, stderr[-2000:]


@pytest.mark.parametrize("stop", ["no data", "server gone", "SIGTERM"])
def test_a_learner_whose_data_stops_checkpoints_every_step_it_trained_and_leaves(tmp_path, stop):
    """Its queue runs dry (the collectors are gone), then: the server lives on (its read times out), or the server
    stops (Reverb would retry for ever), or the server stops and SIGTERM comes."""
    import json

    run_dir = str(tmp_path / "run")
    with contextlib.ExitStack() as stack:
        server, _, _ = serve_a_learners_tables(stack, windows=64 + 120)
        learner = start_learner(server, run_dir, tmp_path)
        stack.callback(lambda: learner.poll() is None and (learner.kill(), learner.wait()))
        drained(server, learner, timeout_s=90)
        if stop != "no data":
            server.stop()  # Reverb now retries for ever, whatever rate_limiter_timeout_ms says
        stopped = time.monotonic()
        if stop == "SIGTERM":
            learner.send_signal(signal.SIGTERM)
        status = learner.wait(timeout=NO_DATA_S + 20)
        ended_s = time.monotonic() - stopped
    stderr = (tmp_path / "stderr").read_text()
    saved = newest_checkpoint(run_dir)
    trained = json.load(open(os.path.join(run_dir, "summary.json")))["train_steps"]
    assert saved["train_step"] == trained > 100 and saved["iteration"] == trained, (saved, trained)  # 1 per iteration
    if stop == "SIGTERM":
        assert status == 143 and ended_s < 10, (status, ended_s, stderr[-2000:])
        # The graceful path (its blocked chunk cancelled, a checkpoint, the summary), not the watchdog's hard exit.
        assert "gave up waiting" not in stderr and ended_s < ROLE_GIVE_UP_S, (ended_s, stderr[-2000:])
    else:
        expected = "had no new data for 3 s" if stop == "no data" else "did not answer for 3 s"
        assert status == 3 and ended_s < NO_DATA_S + 15, (status, ended_s, stderr[-2000:])  # then its summary
        assert expected in stderr and "Traceback" not in stderr, stderr[-2000:]
    print(f"{stop}: the learner ended {ended_s:.1f} s after its data stopped, status {status}, {saved['name']}")


def write_checkpoint(run_dir: str, iteration: int) -> str:
    """A minimal complete checkpoint (state.json and its manifest), as `checkpointing.scan` accepts it."""
    import hashlib
    import json

    from dqn_cartpole.run_folder import checkpointing

    path = os.path.join(run_dir, "checkpoints", checkpointing.checkpoint_name(iteration))
    os.makedirs(path)
    state = json.dumps({"format": checkpointing.FORMAT, "iteration": iteration}).encode()
    with open(os.path.join(path, checkpointing.STATE_FILE), "wb") as handle:
        handle.write(state)
    files = {checkpointing.STATE_FILE: {"size": len(state), "sha256": hashlib.sha256(state).hexdigest()}}
    with open(os.path.join(path, checkpointing.MANIFEST_FILE), "w") as handle:
        json.dump({"format": checkpointing.FORMAT, "iteration": iteration, "files": files}, handle)
    return os.path.basename(path)


def test_the_launcher_reads_a_learner_crash_as_a_crash_naming_its_last_checkpoint(tmp_path, capsys):
    from dqn_cartpole.console.signals import StopRequest
    from dqn_cartpole.distributed.launcher import LocalTopology
    from dqn_cartpole.distributed.policy import LEARNER, Role
    from dqn_cartpole.distributed.supervision import Ended

    run_dir = str(tmp_path / "run")
    supervision = LocalTopology(os.path.join(run_dir, "config.yaml"), run_dir, 8000, 2, resume=False,
                                quiet=True).supervision
    stop = StopRequest()  # never entered: no signal

    def learner_ended(status: int) -> int:
        return supervision.take(Ended(Role(LEARNER), status), stop)

    assert learner_ended(3) == 1
    assert capsys.readouterr().err.strip().endswith("it wrote no checkpoint yet; resume with: python -m dqn_cartpole "
                                                     f"train --resume {run_dir} --topology local --collectors 2")
    name = write_checkpoint(run_dir, 200)
    for status, how in ((3, "crashed (exit status 3)"), (-9, "was killed by SIGKILL"), (-11, "was killed by SIGSEGV")):
        assert learner_ended(status) == 1
        (line,) = capsys.readouterr().err.strip().splitlines()  # one line
        assert line.startswith(f"error: the learner {how}; every role is stopped; its last checkpoint is {name}; "
                               f"resume with: "), line
    assert learner_ended(1) == 1 and learner_ended(0) == 0  # diverged; finished
    assert capsys.readouterr().err == ""  # the learner said how it ended itself


def test_a_collector_and_an_evaluator_blocked_on_a_gone_server_end_within_10_s_of_sigterm(tmp_path):
    from helpers import start_cli

    from dqn_cartpole.distributed.variables import WeightSync

    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    roles = {}
    with contextlib.ExitStack() as stack:
        server, _, agent = serve_a_learners_tables(stack, windows=0, queue_size=100)
        WeightSync(server.address, agent).push()  # the roles start from these weights
        common = ("--config", SMOKE, *LEARNER_SETS, "--replay-address", server.address, "--run-dir", run_dir)
        for role, extra in (("collect", ()), ("evaluate-live", ())):
            (tmp_path / role).mkdir()
            roles[role] = start_cli(role, *common, *extra, log_dir=tmp_path / role)
            stack.callback(lambda p=roles[role]: p.poll() is None and (p.kill(), p.wait()))
        eval_csv = os.path.join(run_dir, "eval_metrics.csv")
        deadline = time.monotonic() + 90
        while not (queue_size(server) > 0 and os.path.exists(eval_csv)):  # both at work
            assert time.monotonic() < deadline and all(p.poll() is None for p in roles.values()), "roles never worked"
            time.sleep(0.2)
        server.stop()
        time.sleep(1.0)  # each is in a call to the gone server now
        sent = time.monotonic()
        # Under load a role may have seen the gone server and ended on its own first (one line, exit status 3).
        before = {role: process.poll() for role, process in roles.items()}
        for process in roles.values():
            process.send_signal(signal.SIGTERM)
        ended = {}
        for role, process in roles.items():
            status = process.wait(timeout=12)
            ended[role] = (status, round(time.monotonic() - sent, 1))
    print(f"seconds from SIGTERM to exit, on a gone server: {ended}")
    for role, (status, seconds) in ended.items():
        stderr = (tmp_path / role / "stderr").read_text()
        assert seconds < 10 and "Traceback" not in stderr, (role, ended, stderr[-2000:])
        if role == "collect" and before[role] is not None:  # it had ended before the signal, by its one-line crash
            assert status == 3 and "lost the replay server" in stderr.strip().splitlines()[-1], (ended, stderr[-2000:])
        elif role == "collect":  # by its own stop path, not the watchdog's
            assert status == 143 and "gave up waiting" not in stderr, (ended, stderr[-2000:])
        else:  # its publish may have failed before the signal came: one line, and EXIT_CRASHED (or the signal)
            assert status in (143, 3, -signal.SIGTERM), (ended, stderr[-2000:])
