"""The topology's rules, in this process and in milliseconds: what each role's end means under each placement, the
readiness check (Reverb's ServerInfo over gRPC), the supervision loop on a fake placement (restarts, backoff,
companions, the give-up line, a role no node can take, the stop order), roles/placement.json, and the copy of a
collector's node-local files into the run folder (`mirror`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from concurrent import futures

import pytest

from dqn_cartpole.console.signals import StopRequest
from dqn_cartpole.distributed import mirror, policy, supervision
from dqn_cartpole.distributed.policy import COLLECTOR, EVALUATOR, LEARNER, SERVER, Role
from dqn_cartpole.distributed.supervision import Ended, Placed, Supervision
from dqn_cartpole.processes.supervisor import Backoff
from dqn_cartpole.run_folder.placement import PlacementRecord, read_placement

C0, C1 = Role(COLLECTOR, 0), Role(COLLECTOR, 1)


def test_each_end_of_each_role_means_what_the_rules_say_under_each_placement():
    for rules in (policy.LOCAL, policy.RAY):
        assert policy.verdict(rules, C0, 0) == policy.LEFT  # it saw the run's stop
        assert policy.verdict(rules, Role(EVALUATOR), 0) == policy.LEFT
        assert policy.verdict(rules, C0, -9) == policy.RESTART
        assert policy.verdict(rules, C0, None) == policy.RESTART  # its node was lost
        assert policy.verdict(rules, Role(LEARNER), 0) == policy.END_RUN
        assert policy.verdict(rules, Role(LEARNER), 1) == policy.END_RUN  # diverged
        assert policy.verdict(rules, Role(LEARNER), 2) == policy.FAIL  # bad input: the same again fails again
    for role, status in ((Role(LEARNER), 3), (Role(LEARNER), -9), (Role(SERVER), -9), (Role(SERVER), None)):
        assert policy.verdict(policy.LOCAL, role, status) == policy.FAIL, (role, status)
        assert policy.verdict(policy.RAY, role, status) == policy.RESTART, (role, status)


def test_a_restarted_learner_takes_the_evaluator_and_the_collectors_that_left_a_restarted_server_takes_all():
    roles = policy.make_roles(2)
    running = {Role(SERVER), Role(LEARNER), Role(EVALUATOR), C0}  # collector 1 left on the learner's stop
    assert policy.companions(Role(LEARNER), roles, running) == [Role(EVALUATOR), C1]
    assert policy.companions(C0, roles, running) == []
    # A restarted server takes every other role (their gRPC channels would wait out a growing backoff).
    assert policy.companions(Role(SERVER), roles, running) == [Role(LEARNER), Role(EVALUATOR), C0, C1]
    assert [[r.name for r in group] for group in policy.stop_groups(roles)] == [
        ["learner", "evaluator", "collector 0", "collector 1"], ["replay server"]]


def test_only_a_reverb_server_is_ready_not_a_port_that_accepts_nor_another_grpc_server():
    import grpc
    import reverb

    server = reverb.Server([reverb.Table.queue("q", 10)], port=None)
    try:
        assert policy.replay_answers(f"localhost:{server.port}")
    finally:
        server.stop()
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as silent:  # accepts, never answers
        silent.bind(("::", 0))
        silent.listen()
        assert not policy.replay_answers(f"localhost:{silent.getsockname()[1]}", timeout_s=0.5)
    other = grpc.server(futures.ThreadPoolExecutor(1))
    port = other.add_insecure_port("[::]:0")
    other.start()
    try:
        assert not policy.replay_answers(f"localhost:{port}")  # UNIMPLEMENTED: not Reverb
    finally:
        other.stop(0)
    assert not policy.replay_answers(f"localhost:{port}")  # nothing listens


class FakePlacement:
    """A placement in memory: the test ends roles; it records starts, signals and stops."""

    def __init__(self):
        self.events: list = []
        self.log: list = []  # ("start", name, restart) / ("stop", names) / ("send", name, signum)
        self.pid = 100

    def start(self, role, restart):
        self.log.append(("start", role.name, restart))
        self.pid += 1
        self.events.append(Placed(role, {"node_ip": "10.0.0.2", "pid": self.pid}))

    def wait(self, timeout_s):
        events, self.events = self.events, []
        return events

    def send(self, role, signum):
        self.log.append(("send", role.name, signum))

    def stop(self, roles, grace_s, signum):
        if roles:
            self.log.append(("stop", [r.name for r in roles]))

    def log_path(self, role):
        return f"RUN/roles/{role.log_name}"


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(supervision, "POLL_S", 0.0)
    monkeypatch.setattr(policy, "replay_answers", lambda address, timeout_s=0: True)


def supervised(tmp_path, rules=policy.RAY, collectors=2):
    placement = FakePlacement()
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir, exist_ok=True)
    loop = Supervision(placement, policy.make_roles(collectors), rules, run_dir, "localhost:1",
                       ("--topology", "ray", "--collectors", str(collectors)), PlacementRecord(run_dir, "ray"))
    for role in loop.roles:
        placement.start(role, restart=False)
    for event in placement.wait(0):
        loop.take(event)  # where each role was placed
    return loop, placement


def step(loop, placement, *events, stop=None):
    """One turn of the loop: the placement reports `events`; returns the run's status, if it ended."""
    placement.events.extend(events)
    stop = stop or StopRequest()
    for event in placement.wait(0):
        outcome = loop.take(event, stop)
        if outcome is not None:
            return outcome
    return loop.restart_due()


def test_ray_rules_restart_the_learner_from_its_checkpoint_with_the_evaluator_and_the_collector_that_left(
        tmp_path, fast, capsys):
    loop, placement = supervised(tmp_path)
    assert step(loop, placement, Ended(C1, 0)) is None  # collector 1 left on the (old) learner's stop
    placement.log.clear()
    assert step(loop, placement, Ended(Role(LEARNER), -9)) is None
    # A first failure is not waited on: the learner starts again in the same turn of the loop.
    assert "warning: learner was killed by SIGKILL; restarting it in 0.00 s (restart 1" in capsys.readouterr().err
    assert placement.log == [("start", "learner", True), ("stop", ["evaluator"]), ("start", "evaluator", True),
                             ("start", "collector 1", True)]
    assert step(loop, placement) is None  # the Placed events
    record = read_placement(loop.run_dir)
    assert record["roles"]["learner"]["restarts"] == 1 and record["roles"]["learner"]["before"][0]["ended"] == \
        "was killed by SIGKILL"
    assert record["roles"]["evaluator"]["restarts"] == 0  # a companion's restart is not its own
    assert record["roles"]["collector 0"]["state"] == "running"


def test_a_role_that_dies_too_often_stops_the_run_with_one_line_naming_it_its_log_and_the_resume(
        tmp_path, fast, capsys, monkeypatch):
    monkeypatch.setattr(policy, "RAY", policy.Rules(stateful=True, backoff=Backoff(0.25, 8.0, 5, 120.0)))
    loop, placement = supervised(tmp_path, policy.RAY)
    for restart in range(5):
        assert step(loop, placement, Ended(C0, None, "its Ray actor's node was lost (ActorDiedError)")) is None
        loop.states[C0].restart_at = 0.0
        assert step(loop, placement) is None
    assert step(loop, placement, Ended(C0, None, "its Ray actor's node was lost (ActorDiedError)")) == 1
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line == ("error: collector 0 was lost after 5 restarts within 120 s: its Ray actor's node was lost "
                    "(ActorDiedError) (log RUN/roles/collector-0.log); every role is stopped. Resume with: "
                    f"python -m dqn_cartpole train --resume {loop.run_dir} --topology ray --collectors 2")


def test_a_restarted_role_that_no_node_takes_in_time_stops_the_run(tmp_path, fast, capsys, monkeypatch):
    loop, placement = supervised(tmp_path)
    monkeypatch.setattr(placement, "start", lambda role, restart: None)  # never placed again
    step(loop, placement, Ended(C0, None))
    loop.states[C0].restart_at = 0.0
    assert step(loop, placement) is None
    loop.states[C0].placed_by = 0.0  # ROLE_START_S has passed
    assert step(loop, placement) == 1
    assert "error: collector 0 could not be started again within 120 s (no node could take it" in \
        capsys.readouterr().err


def test_a_stop_signal_goes_to_the_learner_then_every_role_stops_in_order(tmp_path, fast, capsys):
    loop, placement = supervised(tmp_path)
    stop = StopRequest()
    stop.signum = signal.SIGTERM

    def learner_leaves():
        placement.events.append(Ended(Role(LEARNER), 143))

    threading.Timer(0.05, learner_leaves).start()
    assert loop.supervise(stop) == 143
    loop.stop_all()
    assert ("send", "learner", signal.SIGTERM) in placement.log
    assert [entry for entry in placement.log if entry[0] == "stop"] == [
        ("stop", ["learner", "evaluator", "collector 0", "collector 1"]), ("stop", ["replay server"])]
    assert "Every role is stopped. Resume the run with:" in capsys.readouterr().err


def test_a_collectors_node_local_files_reach_the_run_folder_whole_and_once(tmp_path):
    node, run = tmp_path / "node", tmp_path / "run"
    (node / "roles").mkdir(parents=True)
    (node / "tensorboard" / "collector-0").mkdir(parents=True)
    csv_path, events = node / "roles" / "collector-0.csv", node / "tensorboard" / "collector-0" / "events.1"
    csv_path.write_bytes(b"env_steps,episodes\n100,4\n200,")  # a row still being written
    events.write_bytes(b"\x00\x01binary")
    (node / "roles.lock").write_text("")
    appender = mirror.RunFolderAppender(str(run))
    appender.append("p1", mirror.read_new(str(node), appender.offsets_by_token().get("p1", {})))
    assert (run / "roles" / "collector-0.csv").read_bytes() == b"env_steps,episodes\n100,4\n"
    csv_path.write_bytes(b"env_steps,episodes\n100,4\n200,8\n")
    events.write_bytes(b"\x00\x01binary\x02more")
    stale = mirror.read_new(str(node), {})  # a reply that crossed a newer one: ignored
    appender.append("p1", mirror.read_new(str(node), appender.offsets_by_token()["p1"]))
    appender.append("p1", stale)
    # The collector's next process (another node): a fresh file, its header kept only once.
    appender.append("p2", [("roles/collector-0.csv", 0, b"env_steps,episodes\n300,12\n"),
                           ("../escape.txt", 0, b"no"), ("roles/../../escape.txt", 0, b"no")])
    assert (run / "roles" / "collector-0.csv").read_bytes() == b"env_steps,episodes\n100,4\n200,8\n300,12\n"
    assert (run / "tensorboard" / "collector-0" / "events.1").read_bytes() == b"\x00\x01binary\x02more"
    assert not (tmp_path / "escape.txt").exists() and not (run / "roles.lock").exists()


def test_the_placement_record_keeps_each_roles_current_place_and_where_it_was(tmp_path):
    record = PlacementRecord(str(tmp_path), "ray")
    record.placed("collector 1", {"node_ip": "10.0.0.2", "pid": 11}, 0)
    record.ended("collector 1", "was lost")
    record.placed("collector 1", {"node_ip": "10.0.0.3", "pid": 12}, 1)
    data = json.loads((tmp_path / "roles" / "placement.json").read_text())
    entry = data["roles"]["collector 1"]
    assert (entry["node_ip"], entry["pid"], entry["restarts"], entry["state"]) == ("10.0.0.3", 12, 1, "running")
    assert [(b["node_ip"], b["pid"], b["ended"]) for b in entry["before"]] == [("10.0.0.2", 11, "was lost")]
    assert read_placement(str(tmp_path))["topology"] == "ray"


def test_a_server_that_ends_or_never_answers_before_it_is_ready_is_one_line(tmp_path, monkeypatch):
    from dqn_cartpole.errors import UserError

    monkeypatch.setattr(supervision, "POLL_S", 0.0)
    monkeypatch.setattr(policy, "replay_answers", lambda address, timeout_s=0: False)  # never ready
    monkeypatch.setattr(policy, "SERVER_START_S", 0.2)
    loop, placement = supervised(tmp_path)
    calls = []

    def wait(timeout_s):  # a loop that goes on for 2 s did not see that the server never answered
        calls.append(timeout_s)
        assert len(calls) < 200, "the run went on without a server"
        time.sleep(0.01)
        return []

    monkeypatch.setattr(placement, "wait", wait)
    with pytest.raises(UserError, match=r"^the replay server did not start within 0 s \(log RUN/roles/"):
        loop.supervise(StopRequest())
    loop, placement = supervised(tmp_path / "second")
    placement.events.append(Ended(Role(SERVER), 2, "error: replay.reverb_port: port 8000 is already in use"))
    with pytest.raises(UserError, match="did not start: it exited with status 2: error: replay.reverb_port: port "
                                        "8000 is already in use"):
        loop.supervise(StopRequest())
    # A server that started and was killed before the first probe saw it (its log says it was ready) did not fail
    # to start: it is restarted, as at any time, and the run goes on.
    monkeypatch.setattr(policy, "SERVER_START_S", 60.0)
    loop, placement = supervised(tmp_path / "third")
    placement.log.clear()
    placement.events.append(Ended(Role(SERVER), -9, "replay server ready at port 8000"))
    restarted = []

    def answers(address, timeout_s=0):
        restarted.append(("start", "replay server", True) in placement.log)
        return restarted[-1]

    def until_restarted(timeout_s):  # the run's own end (the learner's), once the server is back
        assert len(restarted) < 200, "the killed server was never started again"
        if restarted and restarted[-1]:
            placement.events.append(Ended(Role(LEARNER), 0))
        return FakePlacement.wait(placement, timeout_s)

    monkeypatch.setattr(policy, "replay_answers", answers)
    monkeypatch.setattr(placement, "wait", until_restarted)
    assert loop.supervise(StopRequest()) == 0
    assert placement.log[0] == ("start", "replay server", True)


# ---------------------------------------------------------------------------- the Ray placement on a fake Ray


class FakeRef:
    """A call's result: pending until the test sets `done` (with a value, or an error to raise)."""

    def __init__(self, call):
        self.call, self.done, self.value, self.error = call, False, None, None


class FakeMethod:
    def __init__(self, actor, name):
        self.actor, self.name = actor, name

    def options(self, **_):
        return self

    def remote(self, *args):
        ref = FakeRef((self.actor.name, self.name))
        ref.args = args
        self.actor.ray.calls.append(ref)
        return ref


class FakeActor:
    def __init__(self, ray, name):
        self.ray, self.name = ray, name
        for method in ("run", "where", "ready", "files", "stop", "send", "close"):
            setattr(self, method, FakeMethod(self, method))


class FakeRay:
    """What `RayPlacement` calls of Ray: actors whose calls the test answers, `wait`, `get`, `kill`."""

    class exceptions:  # noqa: N801  # as ray.exceptions
        RayError = type("RayError", (Exception,), {})

    def __init__(self):
        self.calls, self.killed = [], []

    def remote(self, _cls):
        ray = self

        class Options:
            def options(self, **_):
                return self

            def remote(self, role_name, *_):
                return FakeActor(ray, role_name)

        return Options()

    def wait(self, refs, num_returns=1, timeout=None):
        return [r for r in refs if r.done], [r for r in refs if not r.done]

    def get(self, ref):
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, actor, no_restart=True):
        self.killed.append((actor.name, no_restart))

    def answer(self, name, method, value=None, error=None):
        """Answers the newest pending `method` call to the actor of `name`."""
        ref = [r for r in self.calls if r.call == (name, method) and not r.done][-1]
        ref.done, ref.value, ref.error = True, value, error


def test_a_role_whose_process_ended_starts_again_in_the_same_actor_process_a_lost_or_silent_actor_in_a_new_one(
        tmp_path):
    from dqn_cartpole.distributed.ray_placement import RayPlacement

    ray = FakeRay()
    node = {"node_id": "ab" * 28, "node_ip": "10.0.0.1"}
    placement = RayPlacement(ray, str(tmp_path / "run"), "config: 1\n", 1234, node, False, True)
    for role in (C0, C1, Role(EVALUATOR)):
        placement.start(role, restart=False)

    def runs(name):
        return len([r for r in ray.calls if r.call == (name, "run")])

    # Its process was SIGKILLed: the actor answered `run` with the status, so it is alive and idle.
    ray.answer("collector 0", "run", {"status": -signal.SIGKILL, "why": ""})
    assert [e for e in placement.wait(0) if isinstance(e, Ended)] == [Ended(C0, -signal.SIGKILL, "")]
    placement.start(C0, restart=True)
    assert runs("collector 0") == 2 and ray.killed == []  # `run` again, no new actor process
    # `where` asks for the place of that `run` (Ray may start a later call first: it must not answer the old pid).
    (run_call,) = [r for r in ray.calls if r.call == ("collector 0", "run") and not r.done]
    (where_call,) = [r for r in ray.calls if r.call == ("collector 0", "where") and not r.done][-1:]
    assert run_call.args[-1] == where_call.args[-1] != None

    # Its actor died (its worker or its node): Ray starts a new process, which is asked for its token first.
    ray.answer("collector 1", "run", error=FakeRay.exceptions.RayError("The actor died"))
    assert [e.status for e in placement.wait(0) if isinstance(e, Ended)] == [None]
    placement.start(C1, restart=True)
    assert runs("collector 1") == 1 and ray.killed == [] and any(r.call == ("collector 1", "ready") for r in ray.calls)

    # A companion whose actor did not answer its stop (its `run` still pending): a new actor process.
    placement.start(Role(EVALUATOR), restart=True)
    assert ray.killed == [("evaluator", False)] and runs("evaluator") == 1


def test_where_answers_the_place_of_the_run_it_names_not_an_earlier_one(tmp_path):
    import asyncio

    from dqn_cartpole.distributed import ray_role

    host = ray_role.RoleHost.__new__(ray_role.RoleHost)  # its state alone: no warm process
    host.child, host.run_id, host.token = None, None, "t"

    class Old:
        process = type("P", (), {"pid": 111})()

    async def scenario():
        host.child, host.run_id = Old(), 1  # the earlier run's process
        asked = asyncio.ensure_future(host.where(2))  # sent after `run` 2, started before it
        await asyncio.sleep(0.3)
        assert not asked.done()  # it does not answer the old pid
        host.child = type("New", (), {"process": type("P", (), {"pid": 222})()})()
        host.run_id = 2
        return await asyncio.wait_for(asked, 5)

    from unittest import mock
    node = {"node_id": "n1", "node_ip": "10.0.0.1", "host": "h"}
    with mock.patch.object(ray_role, "this_node", return_value=node):  # the node from Ray's runtime: faked here
        assert asyncio.run(scenario()) == {**node, "pid": 222, "worker_pid": os.getpid(), "token": "t"}


def test_a_role_not_started_yet_is_never_recorded_as_running_without_a_process(tmp_path):
    """`where` answers pid None while the role's process is not started (its node's warm process still imports):
    no placement is recorded then, and the placement asks again until the role runs."""
    from dqn_cartpole.distributed.ray_placement import RayPlacement

    ray = FakeRay()
    node = {"node_id": "ab" * 28, "node_ip": "10.0.0.1"}
    placement = RayPlacement(ray, str(tmp_path / "run"), "config: 1\n", 1234, node, False, True)
    placement.start(Role(SERVER), restart=False)
    where = {"node_ip": "10.0.0.1", "node_id": "n1", "worker_pid": 50, "token": "t"}
    ray.answer("replay server", "where", {**where, "pid": None})
    assert [e for e in placement.wait(0) if isinstance(e, Placed)] == []
    asked = [r for r in ray.calls if r.call == ("replay server", "where")]
    assert len(asked) == 2 and not asked[-1].done  # asked again, for the same `run`
    assert asked[-1].args == asked[0].args
    ray.answer("replay server", "where", {**where, "pid": 4242})
    (placed,) = [e for e in placement.wait(0) if isinstance(e, Placed)]
    assert placed.where["pid"] == 4242
    record = PlacementRecord(str(tmp_path / "run"), "ray")
    record.placed("replay server", {"node_ip": "10.0.0.1", "pid": None}, 0)  # even if told so, not "running"
    assert read_placement(str(tmp_path / "run"))["roles"]["replay server"]["state"] == "starting"
