"""One run per folder, for the run's whole life, and one writer per artifact (issue 16, defects 2, 6, 7 and 9).

Fast tests: small processes that hold the run's lock as its roles do (no TensorFlow), in-process checks of the
exports, the checkpoints and a collector's counts; the CLI only where its refusal is what is tested.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from helpers import REPO, SMOKE, cli_command, cli_env, run_cli, wait_for

from dqn_cartpole.config import dump_yaml, load_config
from dqn_cartpole.run_folder import layout


def make_run_folder(run_dir: str) -> dict:
    """A run folder as a crashed distributed run leaves it: its config, an orphan's partial checkpoint and the
    server's staged table. Returns the folder's files, to check that a refused resume touched none of them."""
    os.makedirs(os.path.join(run_dir, layout.CHECKPOINTS_DIR, "ckpt-0000000010.123-abcdef01.tmp"))
    os.makedirs(os.path.join(run_dir, layout.CHECKPOINTS_DIR, "reverb-server", "2026-01-01"))
    with open(os.path.join(run_dir, layout.CONFIG_FILE), "w", encoding="utf-8") as handle:
        handle.write(dump_yaml(load_config(SMOKE, ["replay.backend=reverb"])))
    with open(os.path.join(run_dir, layout.TRAIN_METRICS_FILE), "w", encoding="utf-8") as handle:
        handle.write("train_step,loss\n100,0.5\n")
    return tree(run_dir)


def tree(run_dir: str) -> dict:
    """Every file and folder under `run_dir` (but the lock files) with its size and mtime."""
    found = {}
    for folder, dirs, files in os.walk(run_dir):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if name not in (layout.LOCK_FILE, layout.ROLES_LOCK_FILE):
                info = os.stat(path)
                found[os.path.relpath(path, run_dir)] = (info.st_size, info.st_mtime_ns)
    return found


def resume_is_refused(run_dir: str, *extra: str) -> str:
    """`train --resume RUN_DIR` (plus `extra`): exit status 2 and one line; returns the line."""
    result = run_cli("train", "--resume", run_dir, "--quiet", *extra, timeout=60)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr[-2000:])
    assert "in use by another dqn_cartpole process" in lines[0]
    return lines[0]


def lock_holders(run_dir: str) -> list:
    from dqn_cartpole.run_folder.lock import holders

    return holders(run_dir)


# A launcher whose roles are stuck: each ignores SIGTERM (as a role blocked in a call would). The real LocalTopology
# starts them, with the run's lock, and its reaper (it waits for a server that never answers).
STUCK_LAUNCHER = textwrap.dedent("""
    import sys
    from dqn_cartpole.console import signals
    from dqn_cartpole.distributed import launcher
    from dqn_cartpole.run_folder.lock import lock_run

    run_dir = sys.argv[1]
    lock = lock_run(run_dir)
    stuck = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "run_dir = sys.argv[sys.argv.index('--run-dir') + 1]; "
             "open(os.path.join(os.path.dirname(run_dir), f'stuck-{os.getpid()}'), 'w').close(); time.sleep(300)")
    role_command = launcher.LocalPlacement.command
    launcher.LocalPlacement.command = lambda placement, role, restart: [
        sys.executable, "-c", stuck, *role_command(placement, role, restart)[3:]]  # the role's own arguments
    topology = launcher.LocalTopology("config.yaml", run_dir, 1, 1, resume=False, quiet=True, keep_fds=lock.fds())
    with signals.StopRequest() as stop:
        topology.run(stop)
""")


def test_a_killed_launchers_roles_keep_the_lock_until_its_reaper_kills_them_then_resume_may_start(tmp_path):
    run_dir = str(tmp_path / "run")
    make_run_folder(run_dir)
    launcher = subprocess.Popen([sys.executable, "-c", STUCK_LAUNCHER, run_dir], env=cli_env(), cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The launcher, its 4 roles (server, learner, evaluator, collector) and its reaper's view of them.
        wait_for(lambda: len(lock_holders(run_dir)) == 5, 60, "the launcher and its 4 roles to hold the lock",
                 poll_s=0.1)
        wait_for(lambda: len([n for n in os.listdir(tmp_path) if n.startswith("stuck-")]) == 4, 60,
                 "the 4 roles to ignore SIGTERM", poll_s=0.1)
        roles = [(pid, role) for pid, role in lock_holders(run_dir) if pid != launcher.pid]
        assert sorted(role for _, role in roles) == ["collect --collector-id 0", "evaluate-live", "learn",
                                                     "replay-server"]
        before = tree(run_dir)  # with the roles' logs
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        killed_at = time.monotonic()
        # Orphans: each got SIGTERM (and ignores it), and still holds the run's lock.
        line = resume_is_refused(run_dir)
        collector = next(pid for pid, role in roles if role.startswith("collect"))
        assert f"pid {collector} (collect --collector-id 0)" in line
        resume_is_refused(run_dir, "--topology", "local")
        learn = run_cli("learn", "--resume", "--config", os.path.join(run_dir, layout.CONFIG_FILE),
                        "--replay-address", "localhost:1", "--run-dir", run_dir, timeout=60)
        assert learn.returncode == 2 and f"pid {collector} (collect --collector-id 0)" in learn.stderr, learn.stderr
        assert len(learn.stderr.strip().splitlines()) == 1
        assert tree(run_dir) == before  # no set-aside of the orphan's ckpt-N.tmp, no staging of reverb-server/
        wait_for(lambda: not lock_holders(run_dir), 20, "the reaper to kill every role", poll_s=0.1)
        assert time.monotonic() - killed_at < 15
        from dqn_cartpole.run_folder.lock import lock_run

        lock_run(run_dir).close()  # the lock is free
    finally:
        launcher.kill()
        launcher.wait(10)
        for pid, _ in lock_holders(run_dir):
            os.kill(pid, signal.SIGKILL)


def test_resume_refuses_to_run_beside_a_hand_started_role_and_names_it(tmp_path):
    run_dir = str(tmp_path / "run")
    before = make_run_folder(run_dir)
    role = subprocess.Popen(cli_command("collect", "--config", os.path.join(run_dir, layout.CONFIG_FILE),
                                        "--replay-address", "localhost:1", "--run-dir", run_dir,
                                        "--collector-id", "3", "--set", "distributed.connect_timeout_s=60"),
                            env=cli_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: lock_holders(run_dir), 30, "the collector to join the run", poll_s=0.1)
        assert f"pid {role.pid} (collect --collector-id 3)" in resume_is_refused(run_dir)
        resume_is_refused(run_dir, "--topology", "local")
        assert tree(run_dir) == before
    finally:
        role.kill()
        role.wait(30)


def test_a_role_cannot_join_a_run_that_a_train_owns(tmp_path):
    from dqn_cartpole.errors import UserError
    from dqn_cartpole.run_folder.lock import join_run, lock_run

    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    role = join_run(run_dir)
    with pytest.raises(UserError, match="in use by another dqn_cartpole process"):
        lock_run(run_dir)  # a train beside a live role
    learner = lock_run(run_dir, beside_roles=True)  # a hand-started learn runs beside its roles
    with pytest.raises(UserError, match="in use by another dqn_cartpole process"):
        lock_run(run_dir, beside_roles=True)  # but never beside another owner
    learner.close()
    role.close()
    owner = lock_run(run_dir)
    join_run(run_dir).close()  # the owner's own roles join it
    owner.close()


def lock_files(run_dir: str) -> list:
    return sorted(name for name in os.listdir(run_dir) if name in (layout.LOCK_FILE, layout.ROLES_LOCK_FILE))


# A run's owner as `train` is one, killed before it lets go of the lock.
KILLED_OWNER = "import sys, time; from dqn_cartpole.run_folder.lock import lock_run; lock_run(sys.argv[1]); " \
               "print('locked', flush=True); time.sleep(300)"


def test_a_run_that_ends_removes_its_lock_files_unless_a_process_of_the_run_still_holds_them(tmp_path):
    """The owner lets go (`RunLock.close`, as a finished or stopped `train` does): both files go. Not while a role
    holds roles.lock, nor while a child it gave run.lock to (`fds()`, as the local launcher does) lives; and a
    killed owner cannot remove them, but its lock went with it: the next run takes them."""
    from dqn_cartpole.run_folder.lock import join_run, lock_run

    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    lock_run(run_dir).close()
    assert lock_files(run_dir) == []
    owner = lock_run(run_dir)
    role = join_run(run_dir)
    owner.close()
    assert lock_files(run_dir) == ["roles.lock", "run.lock"]  # the role still runs in the folder
    role.close()
    owner = lock_run(run_dir)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], pass_fds=owner.fds())
    try:
        owner.close()
        assert lock_files(run_dir) == ["roles.lock", "run.lock"]  # the child keeps the run's lock
    finally:
        child.kill()
        child.wait(10)
    lock_run(run_dir).close()  # free, and removed by this clean end
    assert lock_files(run_dir) == []
    killed = subprocess.Popen([sys.executable, "-c", KILLED_OWNER, run_dir], env=cli_env(), cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout.readline().strip() == "locked"
    finally:
        killed.kill()
        killed.wait(10)
    assert lock_files(run_dir) == ["roles.lock", "run.lock"]  # a killed run leaves them, unlocked
    lock_run(run_dir).close()
    assert lock_files(run_dir) == []


def test_a_lock_file_removed_while_a_process_locks_it_is_not_taken_for_the_lock(tmp_path, monkeypatch):
    """A run that ends between another process's open and its flock removes the file that process opened: the
    process must lock the file now at the path, or two runs would each hold a lock on a different file."""
    from dqn_cartpole.errors import UserError
    from dqn_cartpole.run_folder import lock

    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    real_flock, removed = lock.fcntl.flock, []

    def ending_meanwhile(fd: int, how: int) -> None:
        path = os.path.join(run_dir, layout.LOCK_FILE)
        if not removed and os.path.exists(path):
            removed.append(path)
            os.unlink(path)  # as `RunLock.close` of a run that just ended
        real_flock(fd, how)

    monkeypatch.setattr(lock.fcntl, "flock", ending_meanwhile)
    owner = lock.lock_run(run_dir)
    monkeypatch.setattr(lock.fcntl, "flock", real_flock)
    try:
        assert removed and os.path.samestat(os.fstat(owner.handles[0].fileno()), os.stat(removed[0]))
        with pytest.raises(UserError, match="in use by another dqn_cartpole process"):
            lock.lock_run(run_dir)  # the file at the path is the one locked
    finally:
        owner.close()


# ---------------------------------------------------------------------------- one writer per artifact


class FakeSaver:
    """Writes a policy folder as PolicySaver lays it out (a saved_model.pb and variables), with a tag."""

    def __init__(self, tag: str):
        self.tag = tag

    def save(self, folder: str) -> None:
        os.makedirs(os.path.join(folder, "variables"), exist_ok=True)
        with open(os.path.join(folder, "saved_model.pb"), "w", encoding="utf-8") as handle:
            handle.write(self.tag)


def policy_run(tmp_path) -> str:
    run_dir = str(tmp_path / "run")
    os.makedirs(os.path.join(run_dir, layout.POLICY_DIR))
    with open(os.path.join(run_dir, layout.CONFIG_FILE), "w", encoding="utf-8") as handle:
        handle.write(dump_yaml(load_config(SMOKE)))
    return run_dir


def read_tag(policy_dir: str) -> str:
    with open(os.path.join(policy_dir, "saved_model.pb"), encoding="utf-8") as handle:
        return handle.read()


def pause_between_renames(monkeypatch, reached: threading.Event, hold_s: float) -> None:
    """Every export stops `hold_s` between its two renames (where `policy/final` does not exist)."""
    from dqn_cartpole.run_folder import export

    def between(stage: str) -> None:
        reached.set()
        time.sleep(hold_s)

    monkeypatch.setattr(export, "crash_point", between)


def in_thread(target, *args) -> threading.Thread:
    """Runs `target(*args)` in a started thread whose `errors` lists what it raised."""
    thread = threading.Thread(target=lambda: _record_errors(thread, target, args))
    thread.errors = []
    thread.start()
    return thread


def _record_errors(thread: threading.Thread, target, args) -> None:
    try:
        target(*args)
    except Exception as exc:  # pylint: disable=broad-except
        thread.errors.append(exc)


def test_evaluate_and_record_finding_a_policy_never_move_a_live_exports_folder_away(tmp_path, monkeypatch):
    from dqn_cartpole.run_folder.export import save_policy
    from dqn_cartpole.run_folder.resolve import resolve_policy

    run_dir = policy_run(tmp_path)
    final = os.path.join(run_dir, layout.POLICY_DIR, layout.FINAL_POLICY)
    save_policy(FakeSaver("first"), final)
    reached = threading.Event()
    pause_between_renames(monkeypatch, reached, 0.5)
    writer = in_thread(save_policy, FakeSaver("second"), final)
    try:
        assert reached.wait(10)
        found, _ = resolve_policy(run_dir, final=True)  # what `evaluate RUN --final` and `record RUN` do first
    finally:
        writer.join(10)
    assert writer.errors == []  # the export was not broken under it
    assert found == final and read_tag(final) == "second"
    assert sorted(os.listdir(os.path.dirname(final))) == [".final.lock", "final"]  # no .tmp or .old left


def test_an_unsolved_final_policy_never_replaces_a_solved_one_whatever_the_order(tmp_path, monkeypatch):
    from dqn_cartpole.run_folder.export import save_policy
    from dqn_cartpole.run_folder.policy_files import read_info

    run_dir = policy_run(tmp_path)
    final = os.path.join(run_dir, layout.POLICY_DIR, layout.FINAL_POLICY)
    # The learner's finish (past final_evaluation_timeout_s) is writing when the evaluator's solve export comes.
    reached = threading.Event()
    pause_between_renames(monkeypatch, reached, 0.3)
    learner = in_thread(save_policy, FakeSaver("learner"), final, {"solved": False}, True)
    assert reached.wait(10)
    save_policy(FakeSaver("evaluator"), final, {"solved": True})  # waits for the learner's export, then replaces it
    learner.join(10)
    assert learner.errors == []
    assert read_tag(final) == "evaluator" and read_info(final)["solved"]
    # The other order: the solve export first; the learner's finish keeps it.
    save_policy(FakeSaver("learner"), final, {"solved": False}, keep_solved=True)
    assert read_tag(final) == "evaluator"
    save_policy(FakeSaver("resumed"), final, {"solved": False})  # a single process's own finish replaces it
    assert read_tag(final) == "resumed"


# ---------------------------------------------------------------------------- checkpoints


class TinyAgent:
    """The part of a ValueAgent a checkpoint writer reads: its checkpoint objects."""

    def __init__(self):
        import tensorflow as tf

        self.weights = tf.Variable([1.0, 2.0])

    def checkpoint_objects(self) -> dict:
        return {"weights": self.weights}


class ServerTable:
    """A Reverb replay's checkpoint call as the server answers it: a new timestamped folder in its own
    checkpoint folder, its DONE file written last."""

    backend = "reverb"

    def __init__(self, server_dir: str):
        self.server_dir, self.count = server_dir, 0

    def checkpoint(self) -> str:
        self.count += 1
        path = os.path.join(self.server_dir, f"2026-01-01T00:00:{10 + self.count:02d}.000000000+00:00")
        os.makedirs(path)
        for name in ("tables.tfrecord", "chunks.tfrecord", "DONE"):
            with open(os.path.join(path, name), "w", encoding="utf-8") as handle:
                handle.write(name)
        return path

    def priority_trackables(self) -> dict:
        return {}  # a uniform table: no largest priority to keep


def test_a_checkpoint_leaves_no_partial_table_and_prunes_what_no_resume_reads(tmp_path):
    import tensorflow as tf

    from dqn_cartpole.run_folder import checkpointing

    root = str(tmp_path / "checkpoints")
    server_dir = checkpointing.reverb_server_dir(root)
    interrupted = os.path.join(server_dir, "2026-01-01T00:00:05.000000000+00:00")  # a write cut short: no DONE
    os.makedirs(interrupted)
    for name in ("ckpt-0000000001.damaged", "ckpt-0000000002.damaged", "ckpt-0000000004.123-abcdef01.old"):
        os.makedirs(os.path.join(root, name))
    writer = checkpointing.CheckpointWriter(root, TinyAgent(), tf.Variable(0, dtype=tf.int64),
                                            ServerTable(server_dir), keep=3)
    writer.save(4, {"config": {}}, {})
    writer.save(5, {"config": {}}, {})
    assert os.listdir(server_dir) == []  # each table went into its checkpoint; the interrupted one is gone
    assert sorted(os.listdir(root)) == ["ckpt-0000000002.damaged", "ckpt-0000000004", "ckpt-0000000005",
                                        "reverb-server"]  # the newest damaged one is kept for a look
    good, bad = checkpointing.scan(root)
    assert [found.iteration for found in good] == [5, 4] and not bad
    assert os.listdir(os.path.join(root, "ckpt-0000000005", checkpointing.REVERB_DIR)) == [
        "2026-01-01T00:00:12.000000000+00:00"]


def test_set_aside_keeps_only_the_newest_damaged_checkpoint(tmp_path):
    from dqn_cartpole.run_folder import checkpointing

    root = str(tmp_path / "checkpoints")
    for name in ("ckpt-0000000100.damaged", "ckpt-0000000200", "ckpt-0000000300"):
        os.makedirs(os.path.join(root, name))
    checkpointing.set_aside([checkpointing.Bad(os.path.join(root, "ckpt-0000000200"), "damaged: x"),
                             checkpointing.Bad(os.path.join(root, "ckpt-0000000300"), "damaged: y")])
    assert sorted(os.listdir(root)) == ["ckpt-0000000300.damaged"]


# ---------------------------------------------------------------------------- a restarted collector


class HundredStepsDriver:
    """A collector driver that takes 100 env steps and finishes one episode per run."""

    def __init__(self):
        self.steps = self.episodes = 0

    def reset(self):
        return None

    def run(self, time_step):
        self.steps, self.episodes = self.steps + 100, self.episodes + 1
        return time_step

    def counts(self) -> tuple:
        return self.steps, self.episodes


class ThreePulls:
    """The learner's weights (train step 7); SIGTERM comes with the third pull."""

    def __init__(self, stop):
        self.stop, self.pulls = stop, 0

    def pull(self) -> int:
        self.pulls += 1
        if self.pulls == 3:
            self.stop.signum = signal.SIGTERM
        return 7

    def stopped(self) -> bool:
        return False


class Writers:
    def give_up_waiting_when(self, stopped) -> None:
        pass

    def tag_items(self, train_step: int) -> None:
        pass

    def flush(self) -> None:
        pass


def test_a_restarted_collector_counts_its_env_steps_on_from_its_csv(tmp_path):
    from dqn_cartpole.console.signals import StopRequest
    from dqn_cartpole.distributed import collector
    from dqn_cartpole.run_folder.csv_files import CsvLog, read_csv
    from dqn_cartpole.run_folder.metrics import COLLECTOR_COLUMNS, counted_before as counted

    def counted_before(path: str) -> tuple[int, int]:
        return counted(read_csv(path))

    path = str(tmp_path / "collector-0.csv")
    first = CsvLog(path, COLLECTOR_COLUMNS)
    for steps, episodes in ((1000, 40), (1100, 44)):
        first.write({"wall_s": 1.0, "env_steps": steps, "episodes": episodes, "unix_s": "1.0"})
    first.close()
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("9.5,12")  # the row a SIGKILL cut short
    assert counted_before(path) == (1100, 44)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("\n")
    log = CsvLog(path, COLLECTOR_COLUMNS)
    stop = StopRequest()  # never entered: no signal handler, the fake pull "signals" it
    collector.run_driver(HundredStepsDriver(), ThreePulls(stop), log.write, stop, Writers(), log_every_s=0.0,
                         before=counted_before(path))
    log.close()
    steps = [int(row["env_steps"]) for row in read_csv(path) if row["episodes"]]
    assert steps == [1000, 1100, 1200, 1300, 1400, 1400], steps  # no sawtooth: 1,100 then 100 on today's code
    assert counted_before(path) == (1400, 47)


def test_a_dead_launchers_reaper_kills_only_that_launchers_roles(tmp_path):
    """A process that holds the run's lock but was not started by the dead launcher (a `train --resume` that took
    the lock once the launcher's roles were gone) is not the reaper's to kill."""
    from dqn_cartpole.distributed import reaper

    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    wait = "import time; print('started', flush=True); time.sleep(60)"
    with open(os.path.join(run_dir, layout.LOCK_FILE), "a", encoding="utf-8") as lock:
        # A role of this "launcher" (the test), holding its lock; another process holding the same file.
        role = subprocess.Popen([sys.executable, "-c", wait], pass_fds=(lock.fileno(),), stdout=subprocess.PIPE,
                                text=True, env={**cli_env(), **reaper.marker()})
        other = subprocess.Popen([sys.executable, "-c", wait], pass_fds=(lock.fileno(),), stdout=subprocess.PIPE,
                                 text=True, env=cli_env())
    try:
        assert role.stdout.readline().strip() == "started" and other.stdout.readline().strip() == "started"
        assert [process.pid for process in reaper.left_behind(run_dir, os.getpid())] == [role.pid]
        reaper.reap(run_dir, os.getpid(), grace_s=0.5)
        assert role.wait(10) == -signal.SIGKILL and other.poll() is None
    finally:
        for process in (role, other):
            process.kill()
            process.wait(10)
