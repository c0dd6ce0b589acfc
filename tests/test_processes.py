"""The process supervisor, in this process: tiny `python -c` children in their own session, tied to the parent's
life, stopped with exactly one SIGTERM then SIGKILL after the grace, restarted with a doubling backoff until the
cap, their log's tail; the exit-status rule, the continue command and the stop request. Every test is bounded in
time (a few seconds) and kills every child it started."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from dqn_cartpole.console import exit_status
from dqn_cartpole.console.signals import STOP_CHILDREN, StopRequest
from dqn_cartpole.processes import commands, supervisor
from dqn_cartpole.processes.supervisor import Backoff, Child, stop_all
from dqn_cartpole.run_folder import lock

# A child that writes one line per SIGTERM it receives (and otherwise ignores it), then says it is ready.
COUNT_TERMS = textwrap.dedent("""
    import signal, sys, time
    def on_term(signum, frame):
        with open(sys.argv[1], "a") as out:
            out.write("TERM\\n")
    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    while True:
        time.sleep(60)
""")


@pytest.fixture
def started():
    """Children a test starts go in here; whatever still runs at the end is killed."""
    children: list[Child] = []
    yield children
    for child in children:
        if child.returncode is None:
            child.process.kill()
        if child.process is not None:
            child.process.wait(10)


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def start(started: list, name: str, command: list, log_path=None, **kwargs) -> Child:
    child = Child(name, command, str(log_path) if log_path else None, **kwargs)
    started.append(child)
    return child.start()


def test_a_child_runs_in_its_own_session_and_its_output_goes_to_its_log(tmp_path, started):
    log = tmp_path / "logs" / "child.log"
    child = start(started, "sleeper", python("import os, time; print('pid', os.getpid(), flush=True); time.sleep(30)"),
                  log, header=True)
    wait_until(lambda: "pid" in child.output())
    assert os.getsid(child.process.pid) == child.process.pid != os.getsid(0)  # a new session, led by the child
    assert child.output().split() == ["pid", str(child.process.pid)]  # the header is not the child's output
    assert log.read_text().startswith("$ python -c ")
    assert child.stop(5) == -signal.SIGTERM


def test_a_child_started_from_a_thread_that_blocks_sigint_still_gets_a_ctrl_c(tmp_path, started):
    """A Ray actor's event loop blocks SIGINT, and a child inherits its starting thread's signal mask: the role it
    started never saw the Ctrl-C sent on to it. A child starts with no signal blocked."""
    on_int = ("import signal, sys, time\n"
              "signal.signal(signal.SIGINT, lambda s, f: (open(sys.argv[1], 'w').write('INT'), sys.exit(0)))\n"
              "open(sys.argv[1] + '.ready', 'w').close()\n"
              "time.sleep(30)")
    out, done = str(tmp_path / "got"), threading.Event()

    def start_blocked() -> None:  # lives as long as the child: its death would be the child's (PR_SET_PDEATHSIG)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
        start(started, "role", python(on_int, out))
        done.wait(10)

    thread = threading.Thread(target=start_blocked)
    thread.start()
    try:
        wait_until(lambda: os.path.exists(out + ".ready"))
        started[-1].send(signal.SIGINT)
        wait_until(lambda: started[-1].returncode is not None, 5.0)
    finally:
        done.set()
        thread.join()
    assert started[-1].returncode == 0 and open(out).read() == "INT"


def test_a_child_gets_sigterm_when_its_parent_dies_however_it_dies(tmp_path, started):
    """A parent that starts a child and is then SIGKILLed: the child still ends (PR_SET_PDEATHSIG)."""
    parent_code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {supervisor.package_root()!r})
        from dqn_cartpole.processes.supervisor import Child
        child = Child("orphan", [sys.executable, "-c", "import time; time.sleep(30)"]).start()
        print(child.process.pid, flush=True)
        import time; time.sleep(30)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        orphan = int(parent.stdout.readline())
        parent.kill()
        parent.wait(10)

        def gone() -> bool:
            try:
                os.kill(orphan, 0)
            except ProcessLookupError:
                return True
            with open(f"/proc/{orphan}/stat") as stat:  # a zombie waiting for init to reap it counts as gone
                return stat.read().split()[2] == "Z"
        wait_until(gone, 10)
    finally:
        parent.kill()
        parent.wait(10)
        try:
            os.kill(orphan, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass


def test_stop_sends_exactly_one_sigterm_then_sigkill_after_the_grace(tmp_path, started, sent):
    children = [start(started, f"stubborn {i}", python(COUNT_TERMS, str(tmp_path / f"terms-{i}")),
                      tmp_path / f"{i}.log") for i in range(2)]
    for child in children:
        wait_until(lambda child=child: "ready" in child.output())
    began = time.monotonic()
    stop_all(children, grace_s=1.0)
    took = time.monotonic() - began
    assert 1.0 <= took < 1.9  # one grace for all of them together, not one each
    for signum in (signal.SIGTERM, signal.SIGKILL):  # one TERM each, then one KILL each
        assert sorted(pid for pid, sig in sent if sig == signum) == sorted(child.process.pid for child in children)
    for i, child in enumerate(children):
        assert child.returncode == -signal.SIGKILL
        assert (tmp_path / f"terms-{i}").read_text() == "TERM\n"


def test_a_child_that_leaves_on_sigterm_is_not_killed_and_a_finished_one_gets_no_signal(tmp_path, started):
    polite = start(started, "polite", python("import time; print('ready', flush=True); time.sleep(30)"),
                   tmp_path / "polite.log")
    done = start(started, "done", python("pass"))
    wait_until(lambda: "ready" in polite.output() and done.returncode is not None)
    began = time.monotonic()
    stop_all([polite, done], grace_s=5.0)
    assert time.monotonic() - began < 2.0
    assert (polite.returncode, done.returncode) == (-signal.SIGTERM, 0)
    assert not done.send(signal.SIGTERM)


def test_the_backoff_doubles_to_its_cap_and_then_gives_up():
    backoff = Backoff(first_s=0.25, max_s=2.0, max_restarts=6, window_s=60.0)
    assert [backoff.delay(n) for n in range(7)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0, None]
    # The topology's: a single failure is not waited on; a second within the window is.
    at_once = Backoff(first_s=0.25, max_s=2.0, max_restarts=5, window_s=60.0, at_once=1)
    assert [at_once.delay(n) for n in range(6)] == [0.0, 0.25, 0.5, 1.0, 2.0, None]


def test_a_restart_window_waits_its_backoff_until_the_cap_within_the_window():
    window = supervisor.RestartWindow(Backoff(first_s=1.0, max_s=5.0, max_restarts=3, window_s=100.0))
    now = 1000.0
    for restart, delay in enumerate([1.0, 2.0, 4.0], start=1):
        assert window.due(now) == delay
        now += delay
        window.restarted(now)
        assert window.restarts == restart
    assert window.due(now) is None  # 3 restarts within 100 s: give up
    # Restarts older than the window no longer count: the backoff starts again from its first delay.
    assert window.due(now + 100.0) == 1.0 and window.restarts == 3


def test_the_log_tail_is_what_the_child_wrote_since_its_last_start(tmp_path, started):
    log = tmp_path / "role.log"
    log.write_text("replay server ready\nerror: from an earlier run\n")
    child = start(started, "role", python("print('warning: slow'); print('error: bad thing'); print('bye')"), log)
    wait_until(lambda: child.returncode is not None)
    assert "earlier run" not in child.output() and "replay server ready" not in child.output()
    assert child.last_error() == "error: bad thing"
    assert child.last_line() == "bye"
    child.start()  # a restart: only its own output counts
    wait_until(lambda: child.returncode is not None)
    assert child.output().count("error: bad thing") == 1
    assert len(child.output()) < supervisor.TAIL_BYTES
    assert Child("console", python("pass")).output() == ""  # no log: nothing to read


def test_stop_all_stops_only_the_children_still_running(tmp_path, started):
    running = start(started, "runner", python(COUNT_TERMS, str(tmp_path / "terms")), tmp_path / "runner.log")
    gone = start(started, "gone", python("pass"))
    wait_until(lambda: "ready" in running.output() and gone.returncode is not None)
    stop_all([running, gone], grace_s=10, signum=signal.SIGINT)  # it ends on the SIGINT at once; the grace: load
    assert gone.returncode == 0
    assert running.returncode == -signal.SIGINT and not (tmp_path / "terms").exists()  # the signal given, once


def test_a_child_stops_on_sigint_when_its_parent_ignores_sigint(tmp_path, started):
    """A command started in the background by a script (or nohup) has SIGINT ignored; its children must not."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = start(started, "runner", python(COUNT_TERMS, str(tmp_path / "terms")), tmp_path / "runner.log")
    finally:
        signal.signal(signal.SIGINT, before)
    wait_until(lambda: "ready" in child.output())
    assert child.stop(grace_s=10, signum=signal.SIGINT) == -signal.SIGINT


def test_the_exit_status_of_a_stop_is_128_plus_the_signal():
    assert exit_status.for_signal(signal.SIGINT) == 130
    assert exit_status.for_signal(signal.SIGTERM) == 143
    assert [exit_status.is_stop(s) for s in (130, 143, 0, 1, 2, 137)] == [True, True, False, False, False, False]


def test_every_continue_command_is_one_quoted_python_m_dqn_cartpole_line():
    assert commands.resume_command("outputs/my run") == "python -m dqn_cartpole train --resume 'outputs/my run'"
    assert commands.resume_command("r", "--topology", "local", "--collectors", "2") == \
        "python -m dqn_cartpole train --resume r --topology local --collectors 2"
    assert commands.child_command(["train"]) == [sys.executable, "-m", "dqn_cartpole", "train"]


def test_a_second_signal_stops_a_run_at_once_but_a_supervisor_keeps_waiting(capsys):
    before = signal.getsignal(signal.SIGINT)
    with StopRequest(STOP_CHILDREN, second_signal_interrupts=False) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.signum == signal.SIGTERM
    assert "SIGTERM received: stopping every run" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        with StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert stop.signum == signal.SIGINT
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert "send Ctrl-C again to stop at once" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # restored


# ---------------------------------------------------------------------------- the local topology on the supervisor

# A role that writes one line per signal it receives to argv[1]; `exit_on` (a signal name or "") makes it leave.
# Given a port (argv[3]), it answers Reverb's ServerInfo call there, as a replay server that is ready does.
ROLE = textwrap.dedent("""
    import signal, sys, time
    out, exit_on, port = sys.argv[1], sys.argv[2], sys.argv[3]
    def on_signal(signum, frame):
        with open(out, "a") as handle:
            handle.write(signal.Signals(signum).name + "\\n")
        if signal.Signals(signum).name == exit_on:
            sys.exit(128 + signum)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    if port:
        from concurrent import futures
        import grpc
        server = grpc.server(futures.ThreadPoolExecutor(2))
        answer = grpc.unary_unary_rpc_method_handler(lambda request, context: b"")
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "deepmind.reverb.ReverbService", {"ServerInfo": answer}),))
        server.add_insecure_port(f"[::]:{port}")
        server.start()
    open(out + ".ready", "w").close()
    while True:
        time.sleep(60)
""")


@pytest.fixture
def bounded():
    """The test fails (instead of hanging) if it takes longer than 30 s."""
    def expire(_signum, _frame):
        raise TimeoutError("the test took longer than 30 s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def sent(monkeypatch) -> list:
    """Every signal this process sends through Popen, as (pid, signal)."""
    calls: list = []
    send_signal = subprocess.Popen.send_signal
    monkeypatch.setattr(subprocess.Popen, "send_signal",
                        lambda process, signum: (calls.append((process.pid, signum)), send_signal(process, signum)))
    return calls


def fake_topology(tmp_path, monkeypatch, learner_exits_on: str, collector_code: str = ""):
    """A LocalTopology whose roles are tiny Python processes (the server answers Reverb's ServerInfo); the signals
    they get are logged in tmp_path/NAME."""
    from dqn_cartpole.distributed import launcher, policy, supervision
    from dqn_cartpole.distributed.policy import COLLECTOR, LEARNER, SERVER

    monkeypatch.setattr(policy, "STOP_WAIT_S", 0.5)
    monkeypatch.setattr(supervision, "POLL_S", 0.05)
    monkeypatch.setattr(policy, "LOCAL", policy.Rules(stateful=False, backoff=Backoff(
        first_s=0.01, max_s=0.04, max_restarts=3, window_s=60)))
    port = free_port()

    def command(placement, role, restart):
        if collector_code and role == policy.Role(COLLECTOR, 0):  # only collector 0: which of two dying
            return python(collector_code, str(tmp_path))           # collectors gives up first is a race
        exits_on = learner_exits_on if role.kind == LEARNER else ""
        return python(ROLE, str(tmp_path / role.name.replace(" ", "-")), exits_on,
                      str(port) if role.kind == SERVER else "")

    monkeypatch.setattr(launcher.LocalPlacement, "command", command)
    topology = launcher.LocalTopology("config.yaml", str(tmp_path / "run"), port, 2, resume=False, quiet=True)
    monkeypatch.setattr(launcher.LocalPlacement, "log_path",
                        lambda placement, role: str(tmp_path / f"{role.name.replace(' ', '-')}.log"))
    return topology


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::", 0))
        return probe.getsockname()[1]


def child_of(topology, name: str) -> Child:
    return next(child for role, child in topology.placement.children.items() if role.name == name)


def signals_of(sent: list, child: Child) -> list:
    """The signals the launcher sent to the child's current process."""
    return [signal.Signals(signum).name for pid, signum in sent if pid == child.process.pid]


def signals_got(tmp_path, name: str) -> list[str]:
    path = tmp_path / name
    return path.read_text().split() if path.exists() else []


def all_ready(tmp_path, roles: int) -> bool:
    """Whether `roles` fake roles have installed their signal handlers."""
    return len(list(tmp_path.glob("*.ready"))) >= roles


# Collector 0: dies with status 3 as soon as the other four roles are up (a signal must find their handlers).
DIES_ONCE_THE_OTHERS_ARE_UP = ("import glob, sys, time\n"
                               "while len(glob.glob(sys.argv[1] + '/*.ready')) < 4: time.sleep(0.01)\n"
                               "sys.exit(3)")


def test_a_role_that_keeps_dying_stops_the_run_with_status_1_and_every_role_gets_one_sigterm(
        tmp_path, monkeypatch, capsys, bounded, sent):
    topology = fake_topology(tmp_path, monkeypatch, learner_exits_on="", collector_code=DIES_ONCE_THE_OTHERS_ARE_UP)
    try:
        began = time.monotonic()
        assert topology.supervision.run(StopRequest()) == exit_status.EXIT_FAILED
        assert time.monotonic() - began < 15
        err = capsys.readouterr().err
        assert "warning: collector 0 exited with status 3; restarting it in" in err
        (line,) = [line for line in err.splitlines() if line.startswith("error:")]  # one line
        assert line.startswith("error: collector 0 exited with status 3 after 3 restarts within 60 s"), line
        assert f"(log {tmp_path / 'collector-0.log'})" in line
        assert line.endswith("Resume with: python -m dqn_cartpole train --resume "
                             f"{tmp_path / 'run'} --topology local --collectors 2"), line
        record = json.loads((tmp_path / "run" / "roles" / "placement.json").read_text())
        assert record["roles"]["collector 0"]["restarts"] == 3
        assert len(record["roles"]["collector 0"]["before"]) == 3
        for name in ("learner", "evaluator", "replay server"):
            child = child_of(topology, name)
            assert signals_of(sent, child) == ["SIGTERM", "SIGKILL"], name  # one TERM; KILL after the grace
            assert signals_got(tmp_path, name.replace(" ", "-")) == ["SIGTERM"], name
        assert all(child.returncode is not None for child in topology.placement.children.values())
    finally:
        stop_all(topology.placement.children.values(), 0.0)


def test_a_stop_goes_to_the_learner_first_and_the_launcher_exits_128_plus_the_signal(
        tmp_path, monkeypatch, capsys, bounded, sent):
    topology = fake_topology(tmp_path, monkeypatch, learner_exits_on="SIGINT")
    try:
        stop = StopRequest()

        def ctrl_c_once_every_role_is_up() -> None:
            wait_until(lambda: all_ready(tmp_path, 5))
            stop.signum = signal.SIGINT  # as if Ctrl-C reached the launcher

        threading.Thread(target=ctrl_c_once_every_role_is_up, daemon=True).start()
        assert topology.supervision.run(stop) == 130
        assert "Every role is stopped. Resume the run with:" in capsys.readouterr().err
        learner = child_of(topology, "learner")
        assert signals_of(sent, learner) == ["SIGINT"] and signals_got(tmp_path, "learner") == ["SIGINT"]
        for name in ("evaluator", "collector 0", "collector 1", "replay server"):
            child = child_of(topology, name)
            assert signals_of(sent, child) == ["SIGTERM", "SIGKILL"], name
            assert signals_got(tmp_path, name.replace(" ", "-")) == ["SIGTERM"], name
    finally:
        stop_all(topology.placement.children.values(), 0.0)


def test_the_local_topology_shares_its_replay_through_reverb_and_checks_what_a_resume_needs(tmp_path, capsys):
    import dataclasses

    from dqn_cartpole.config import Config
    from dqn_cartpole.distributed.launcher import local_config
    from dqn_cartpole.errors import UserError
    from dqn_cartpole.run_folder.checkpointing import REVERB_DIR, Found, ResumePlan

    base = Config()
    tf_uniform = dataclasses.replace(base, replay=dataclasses.replace(base.replay, backend="tf_uniform"))
    shared = local_config(tf_uniform, "run", None)
    assert (shared.replay.backend, shared.replay.sampling) == ("reverb", "dataset")
    assert "note: --topology local shares the replay through a Reverb server" in capsys.readouterr().err
    with pytest.raises(UserError, match="continue it in one process: python -m dqn_cartpole train --resume run$"):
        local_config(tf_uniform, "run", ResumePlan(None))
    reverb = dataclasses.replace(base, replay=dataclasses.replace(base.replay, backend="reverb"))
    server = dataclasses.replace(reverb, distributed=dataclasses.replace(reverb.distributed, replay="server"))
    checkpoint = tmp_path / "ckpt-0000000100"
    checkpoint.mkdir()
    plan = ResumePlan(Found(str(checkpoint), 100, {}))
    with pytest.raises(UserError, match="ckpt-0000000100 holds no Reverb table to restore"):
        local_config(server, "run", plan)
    (checkpoint / REVERB_DIR).mkdir()
    assert local_config(server, "run", plan) is server
    assert local_config(reverb, "run", ResumePlan(None)) is reverb and capsys.readouterr().err == ""


# A program a warm start-up process forks (`python -m warm_program ARGV`): `exit N`, or `wait` (it says so, then
# ends with 143 on SIGTERM); it prints whether its parent is the warm process and what it inherited.
WARM_PROGRAM = textwrap.dedent("""
    import os, signal, sys, time
    print("argv", sys.argv[1:], "sigint", signal.getsignal(signal.SIGINT) is signal.default_int_handler,
          "session", os.getsid(0) == os.getpid(), flush=True)
    if sys.argv[1] == "exit":
        sys.exit(int(sys.argv[2]))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print("waiting", flush=True)
    while True:
        time.sleep(60)
""")


def test_a_warm_start_forks_each_command_with_its_log_status_signals_and_its_forks_outlive_the_warm_process(
        tmp_path, monkeypatch):
    from dqn_cartpole.processes.warm_start import KILLED, WarmChild, WarmStarter

    (tmp_path / "warm_program.py").write_text(WARM_PROGRAM)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    starter = WarmStarter(signal.SIGKILL, modules=(), program="warm_program")
    forks = []

    def start(*argv):
        # A log of its own each: in a shared one, a child's "waiting" could be another's line (seen under load).
        log = str(tmp_path / f"role-{len(forks)}.log")
        forks.append(WarmChild("role", list(argv), log, starter=starter).start())
        return forks[-1]

    def waiting(child):
        deadline = time.monotonic() + 20
        while "waiting" not in child.output() and time.monotonic() < deadline:
            time.sleep(0.05)
        return "waiting" in child.output()

    try:
        done = start("exit", "3")
        assert done.process.wait(20) == 3
        assert done.output().startswith("argv ['exit', '3'] sigint True session True")  # as a fresh Python's
        polite, killed = start("wait"), start("wait")
        assert waiting(polite) and waiting(killed)
        # `ps` and the run folder's lock (`role_of`) see the fork's own command line.
        with open(f"/proc/{polite.process.pid}/cmdline", "rb") as cmdline:
            assert cmdline.read().rstrip(b"\0").split(b"\0") == [sys.executable.encode(), b"-m", b"warm_program",
                                                                   b"wait"]
        role = start("collect", "--collector-id", "3")
        assert waiting(role) and lock.role_of(role.process.pid) == "collect --collector-id 3"
        role.process.kill()
        polite.send(signal.SIGTERM)
        killed.process.kill()
        assert (polite.process.wait(10), killed.process.wait(10)) == (143, -signal.SIGKILL)
        # The warm process dies (SIGKILL): the roles it forked run on, and their ends are still known exactly.
        survivor, finisher = start("wait"), start("wait")
        assert waiting(survivor) and waiting(finisher)
        first_warm = starter.process
        first_warm.kill()
        first_warm.wait(10)
        time.sleep(0.3)
        assert survivor.returncode is None and finisher.returncode is None
        assert os.path.exists(f"/proc/{survivor.process.pid}")
        finisher.send(signal.SIGTERM)
        assert finisher.process.wait(10) == 143  # what it said at its exit: no warm process reaped it
        again = start("exit", "7")  # a new warm process
        assert again.process.wait(20) == 7 and starter.process is not first_warm
        assert survivor.returncode is None
        starter.close()  # the client lets its forks go: they end at once
        assert survivor.process.wait(10) == KILLED
        assert wait_gone(survivor.process.pid) or open(f"/proc/{survivor.process.pid}/stat").read().split()[2] == "Z"
    finally:
        starter.close()
        for fork in forks:  # none is left, even when the code under test is broken
            with contextlib.suppress(ProcessLookupError):
                os.kill(fork.process.pid, signal.SIGKILL)


# A client of a warm process on a socket, in a process of its own (killed by the test, as Ray kills an actor's
# worker): it forks `warm_program wait` and prints the warm process's pid and the fork's, then waits.
WARM_CLIENT = textwrap.dedent("""
    import signal, sys, time
    from dqn_cartpole.processes.warm_start import WarmChild, WarmStarter
    starter = WarmStarter(signal.SIGKILL, modules=(), program="warm_program", socket_path=sys.argv[1], linger_s=30)
    child = WarmChild("role", ["wait"], sys.argv[2], starter=starter).start()
    print(starter.warm_pid, child.process.pid, flush=True)
    time.sleep(60)
""")


def test_a_warm_process_on_a_socket_outlives_a_killed_client_kills_its_forks_serves_others_then_lingers_out(
        tmp_path, monkeypatch):
    """What a Ray actor's restart in a new worker process relies on (`ray_role`): no import again."""
    from dqn_cartpole.processes.warm_start import WarmChild, WarmStarter

    (tmp_path / "warm_program.py").write_text(WARM_PROGRAM)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    folder = tempfile.mkdtemp(prefix="warm-")  # a short path: a Unix socket's is at most 107 bytes
    path = os.path.join(folder, "role.sock")
    client = subprocess.Popen([sys.executable, "-c", WARM_CLIENT, path, str(tmp_path / "first.log")],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    warm_pid = fork_pid = None
    starters = []
    try:
        warm_pid, fork_pid = map(int, client.stdout.readline().split())
        client.kill()  # the client's worker dies: its fork goes, the warm process stays
        client.wait(10)
        assert wait_gone(fork_pid) and os.path.exists(f"/proc/{warm_pid}")
        # Two clients at once (two roles on one node) share it; one's end leaves the other's forks running.
        first, second = (WarmStarter(signal.SIGKILL, modules=(), program="warm_program", socket_path=path)
                         for _ in range(2))
        starters += [first, second]
        again = WarmChild("role", ["exit", "4"], str(tmp_path / "second.log"), starter=first).start()
        beside = WarmChild("other", ["wait"], str(tmp_path / "beside.log"), starter=second).start()
        assert first.warm_pid == second.warm_pid == warm_pid and again.process.wait(20) == 4  # the same process
        # Faults of other clients cost them alone: a reset socket (a client killed with an answer unread), a
        # request that is not JSON, one without its descriptors. The warm process serves on; `beside` runs on.
        for nonsense in (None, b"{not json\n", b'{"argv": ["wait"], "log": "/dev/null"}\n'):
            rogue = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            rogue.connect(path)
            if nonsense is None:
                time.sleep(0.3)  # its greeting is there, never read: closing now resets the warm process's side
            else:
                rogue.sendall(nonsense)
            rogue.close()
        time.sleep(0.5)
        assert os.path.exists(f"/proc/{warm_pid}") and beside.returncode is None
        served = WarmChild("role", ["exit", "6"], str(tmp_path / "served.log"), starter=first).start()
        assert served.process.wait(20) == 6 and first.warm_pid == warm_pid
        first.close()
        time.sleep(0.3)
        assert beside.returncode is None and os.path.exists(f"/proc/{beside.process.pid}")
        assert os.path.exists(f"/proc/{warm_pid}")
        second.close()  # the last client's close: the warm process ends at once, its socket is removed
        assert beside.process.wait(10) == -signal.SIGKILL
        assert wait_gone(warm_pid) and not os.path.exists(path) and not os.path.exists(path + ".lock")
        starters.append(WarmStarter(signal.SIGKILL, modules=(), program="warm_program", socket_path=path, linger_s=1))
        orphan = WarmChild("role", ["wait"], str(tmp_path / "third.log"), starter=starters[-1]).start()
        lingering = starters[-1].process  # this one started it: its child
        assert lingering.pid == starters[-1].warm_pid != warm_pid
        starters[-1].channel.shutdown(socket.SHUT_RDWR)  # its client gone, and no next one within linger_s
        orphan.process.release()  # (a client that goes lets its forks go: see the first client above)
        assert orphan.process.wait(10) == -signal.SIGKILL
        assert lingering.wait(10) == 0 and not os.path.exists(path)
        # Its lifeline (a Ray node's raylet) ends: so does it, and the forks, at once, though a client is there.
        raylet = subprocess.Popen(["sleep", "60"])
        starters.append(WarmStarter(signal.SIGKILL, modules=(), program="warm_program", socket_path=path,
                                    lifeline=raylet.pid))
        served = WarmChild("role", ["wait"], str(tmp_path / "fourth.log"), starter=starters[-1]).start()
        raylet.kill()
        raylet.wait()
        assert served.process.wait(10) == -signal.SIGKILL and starters[-1].process.wait(10) == 0
    finally:
        client.kill()
        for starter in starters:
            starter.close()
        for pid in (warm_pid, fork_pid):
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


def test_stale_warm_sockets_and_free_locks_are_removed_a_live_socket_is_kept(tmp_path):
    """A warm process SIGKILLed leaves its socket file behind; the next run's actors remove it (`ray_role`)."""
    from dqn_cartpole.processes.warm_start import remove_stale

    folder = tempfile.mkdtemp(prefix="warm-")  # a short path: a Unix socket's is at most 107 bytes
    live, stale = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    try:
        live.bind(os.path.join(folder, "w-live.sock"))
        live.listen(1)
        stale.bind(os.path.join(folder, "w-stale.sock"))  # bound, never listening: as a dead process's file
        stale.close()
        for name in ("w-live.sock.lock", "w-stale.sock.lock", "w-gone.sock.lock"):
            open(os.path.join(folder, name), "w").close()
        with open(os.path.join(folder, "w-held.sock.lock"), "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # a client starting its warm process holds it
            removed = remove_stale(os.path.join(folder, "w-*.sock"))
        assert sorted(os.path.basename(path) for path in removed) == ["w-gone.sock.lock", "w-stale.sock",
                                                                      "w-stale.sock.lock"]
        assert sorted(os.listdir(folder)) == ["w-held.sock.lock", "w-live.sock", "w-live.sock.lock"]
    finally:
        live.close()
        shutil.rmtree(folder, ignore_errors=True)


def wait_gone(pid: int, timeout_s: float = 10) -> bool:
    """Whether process `pid` is gone (reaped: not even a zombie) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    return not os.path.exists(f"/proc/{pid}")


def test_a_warm_start_runs_the_real_command_line_with_its_one_line_errors(tmp_path):
    from dqn_cartpole.processes.warm_start import WarmChild, WarmStarter

    starter = WarmStarter(signal.SIGKILL, modules=())
    try:
        child = WarmChild("collector 0", ["collect", "--config", str(tmp_path / "nope.yaml"), "--replay-address",
                                          "localhost:1", "--run-dir", str(tmp_path / "run")],
                          str(tmp_path / "collector.log"), starter=starter).start()
        assert child.process.wait(60) == exit_status.EXIT_USAGE
        assert child.last_error().startswith(f"error: {tmp_path / 'nope.yaml'}: config file not found")
    finally:
        starter.close()
