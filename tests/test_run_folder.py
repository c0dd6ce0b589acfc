"""The run-folder API, in-process: atomic writes, read_run, find_runs."""

import json
import os

import pytest

from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder import SUMMARY_VERSION, RunLayout, read_run, write_summary
from dqn_cartpole.run_folder.atomic import replacing, write_text_atomic
from dqn_cartpole.run_folder.csv_files import CsvLog
from dqn_cartpole.run_folder.metrics import EVAL_COLUMNS
from dqn_cartpole.run_folder.record import find_runs


def make_run(root: str, summary: dict | None = None) -> RunLayout:
    layout = RunLayout(root)
    os.makedirs(root)
    write_text_atomic(layout.config, "training:\n  seed: 3\nagent:\n  learning_rate: 0.002\n")
    log = CsvLog(layout.eval_metrics, EVAL_COLUMNS)
    log.write({"train_step": 0, "env_steps": 10, "average_return": 9.5})
    log.close()
    if summary is not None:
        write_summary(layout.summary, summary)
    return layout


def test_read_run_gives_config_summary_and_rows(tmp_path):
    layout = make_run(str(tmp_path / "run"), {"solved_at_iteration": 500, "best_return": 480.0})
    record = read_run(layout.root)
    assert record.version == SUMMARY_VERSION
    assert record.solved and record.finished
    assert record.get("best_return") == 480.0
    assert record.config_value("training.seed") == 3
    assert record.eval_rows == [{**{name: "" for name in EVAL_COLUMNS},
                                 "train_step": "0", "env_steps": "10", "average_return": "9.5"}]
    assert record.train_rows == []


def test_csv_log_adds_new_columns_to_a_file_with_an_old_header(tmp_path):
    """A run resumed from CSVs an older version wrote keeps its rows and gains the new columns."""
    path = str(tmp_path / "eval_metrics.csv")
    old_columns = EVAL_COLUMNS[:6]
    with open(path, "w", newline="") as handle:
        handle.write(",".join(old_columns) + "\n0,10,9.5,9.5,3,1.25\n")
    log = CsvLog(path, EVAL_COLUMNS)
    log.write({"train_step": 100, "env_steps": 110, "average_return": 20.0, "min_return": 15.0})
    log.close()
    with open(path, newline="") as handle:
        lines = handle.read().splitlines()
    assert lines[0] == ",".join(EVAL_COLUMNS)
    assert lines[1] == "0,10,9.5,9.5,3,1.25" + "," * (len(EVAL_COLUMNS) - 6)
    assert lines[2].startswith("100,110,20,,,,15,")
    assert len(lines) == 3 and os.listdir(tmp_path) == ["eval_metrics.csv"]


def test_two_writers_replacing_one_file_each_rename_a_whole_file_of_their_own(tmp_path):
    """Two tune workers redraw the same study plot: neither may rename (or lose) the other's temporary file."""
    import threading

    path, errors = str(tmp_path / "importance.png"), []

    def write(text: str) -> None:
        try:
            for _ in range(200):
                write_text_atomic(path, text * 1000)
        except OSError as exc:
            errors.append(exc)

    writers = [threading.Thread(target=write, args=(c,)) for c in "ab"]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert not errors
    assert open(path).read() in ("a" * 1000, "b" * 1000)
    assert os.listdir(tmp_path) == ["importance.png"]  # no temporary file left behind


def test_unfinished_and_old_and_newer_summaries(tmp_path):
    assert not read_run(make_run(str(tmp_path / "unfinished")).root).finished
    old = make_run(str(tmp_path / "old"))
    with open(old.summary, "w", encoding="utf-8") as handle:
        json.dump({"solved_at_iteration": None}, handle)
    assert read_run(old.root).version == 0
    newer = make_run(str(tmp_path / "newer"))
    with open(newer.summary, "w", encoding="utf-8") as handle:
        json.dump({"version": SUMMARY_VERSION + 1}, handle)
    with pytest.raises(UserError, match="newer dqn_cartpole"):
        read_run(newer.root)


def test_not_a_run_folder_is_one_line(tmp_path):
    with pytest.raises(UserError, match="no such run folder"):
        read_run(str(tmp_path / "missing"))
    with pytest.raises(UserError, match="not a run folder"):
        read_run(str(tmp_path))


def test_find_runs_below_a_folder(tmp_path):
    for name in ("b", "a", "nested/c"):
        make_run(str(tmp_path / name))
    assert find_runs(str(tmp_path)) == [str(tmp_path / n) for n in ("a", "b", "nested/c")]
    assert find_runs(str(tmp_path / "a")) == [str(tmp_path / "a")]


def test_replacing_keeps_the_old_file_on_error(tmp_path):
    path = str(tmp_path / "f.txt")
    write_text_atomic(path, "old")
    with pytest.raises(RuntimeError):
        with replacing(path) as tmp:
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write("half")
            raise RuntimeError("crash")
    assert open(path, encoding="utf-8").read() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]


# ---------------------------------------------------------------------------- resolving run folders


def test_resolve_run_dir_never_replaces_a_run_or_a_folder_that_is_not_one(tmp_path):
    from dqn_cartpole.run_folder.resolve import resolve_run_dir

    run = make_run(str(tmp_path / "run"))
    with pytest.raises(UserError, match="already holds a run"):
        resolve_run_dir(None, run.root, overwrite=False)
    assert resolve_run_dir(None, run.root, overwrite=True) == run.root
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("precious")
    with pytest.raises(UserError, match="not a run folder"):
        resolve_run_dir(None, str(junk), overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        resolve_run_dir(None, str(tmp_path / "file"), overwrite=False)
    assert resolve_run_dir(None, str(tmp_path / "new" / "run"), overwrite=False) == str(tmp_path / "new" / "run")


def test_create_run_dir_overwrites_under_its_lock(tmp_path):
    from dqn_cartpole.run_folder.layout import LOCK_FILE, ROLES_LOCK_FILE
    from dqn_cartpole.run_folder.lock import lock_run
    from dqn_cartpole.run_folder.resolve import create_run_dir

    run = make_run(str(tmp_path / "run"))
    created, lock = create_run_dir(run.root, overwrite=True)
    assert created and sorted(os.listdir(run.root)) == sorted([LOCK_FILE, ROLES_LOCK_FILE])
    with pytest.raises(UserError, match=f"in use by another dqn_cartpole process \\(pid {os.getpid()}\\)"):
        lock_run(run.root)  # a second lock on the folder (flock locks are per open file)
    lock.close()
    lock_run(run.root).close()


def test_resolve_policy_prefers_best_then_final(tmp_path):
    from dqn_cartpole.run_folder.resolve import resolve_policy

    run = make_run(str(tmp_path / "run"))
    with pytest.raises(UserError, match="no saved_model.pb"):
        resolve_policy(run.root)
    for path in (run.best_policy, run.final_policy):
        os.makedirs(path)
        open(os.path.join(path, "saved_model.pb"), "w").close()
    assert resolve_policy(run.root) == (run.best_policy, run.root)
    assert resolve_policy(run.root, final=True) == (run.final_policy, run.root)
    assert resolve_policy(run.final_policy) == (run.final_policy, run.root)


# ---------------------------------------------------------------------------- record's output, provenance


def test_record_never_replaces_a_runs_own_video_unless_asked(tmp_path):
    import argparse

    from dqn_cartpole.cli.single_process import record_output

    run = make_run(str(tmp_path / "run"))
    os.makedirs(run.videos)

    def output(**flags) -> str:
        args = argparse.Namespace(**{"output": None, "random": False, "overwrite": False, **flags})
        return record_output(args, run.root)

    assert output() == run.trained_video  # none yet: the run's own name, which report.html shows
    open(run.trained_video, "w").close()
    assert output() == os.path.join(run.videos, "trained-agent-2.mp4")
    open(os.path.join(run.videos, "trained-agent-2.mp4"), "w").close()
    assert output() == os.path.join(run.videos, "trained-agent-3.mp4")
    assert output(overwrite=True) == run.trained_video
    assert output(output=run.trained_video) == run.trained_video  # -o to that path asks for it
    assert output(random=True) == run.random_video
    assert record_output(argparse.Namespace(output=None, random=True, overwrite=False), None) == "random-agent.mp4"


def test_provenance_names_the_code_the_libraries_and_the_machine(tmp_path):
    import subprocess

    from dqn_cartpole.run_folder import provenance

    found = provenance.provenance()
    assert set(found) == {"package_version", "git_commit", "git_dirty", "python", "tensorflow", "tf_agents",
                          "reverb", "gymnasium", "cpu_model", "cpu_cores", "os"}
    assert found["tensorflow"] == "2.15.1" and found["tf_agents"] == "0.19.0" and found["reverb"] == "0.14.0"
    assert found["cpu_cores"] == os.cpu_count() and found["cpu_model"] and found["os"]
    repo = str(tmp_path / "repo")
    os.makedirs(repo)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "repo" / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    assert provenance.git_state(repo) == (head, False)
    (tmp_path / "repo" / "new.py").write_text("untracked\n")  # not part of the code that ran
    assert provenance.git_state(repo) == (head, False)
    (tmp_path / "repo" / "a.py").write_text("x = 2\n")
    assert provenance.git_state(repo) == (head, True)
    assert provenance.git_state(None) == (None, None)
    assert provenance.git_state(str(tmp_path)) == (None, None)  # not a repository


def test_a_metrics_cell_that_is_not_a_number_is_one_line_naming_it(tmp_path):
    layout = make_run(str(tmp_path / "run"))
    with open(layout.train_metrics, "w") as handle:
        handle.write("train_step,loss\n50,0.5\n100,nan\n150,lots\n")
    with pytest.raises(UserError, match=r"train_metrics.csv: line 4, column loss: 'lots' is not a number"):
        read_run(layout.root)
    with open(layout.train_metrics, "w") as handle:
        handle.write("train_step,loss\n50,0.5,7\n")
    with pytest.raises(UserError, match=r"train_metrics.csv: line 2 has more cells than the header has columns"):
        read_run(layout.root)


def test_replacing_dir_swaps_a_whole_folder_in_and_a_crash_between_the_renames_is_recovered(tmp_path):
    from dqn_cartpole.run_folder.atomic import recover_dir, replacing_dir

    path = tmp_path / "final"
    for which in ("first", "second"):
        with replacing_dir(str(path)) as tmp:
            assert os.listdir(tmp) == [] and os.path.basename(tmp) != "final.tmp"  # a name unique to the call
            (tmp_path / tmp / "which").write_text(which)
        assert (path / "which").read_text() == which and os.listdir(tmp_path) == ["final"]

    class Crash(Exception):
        pass

    def crash() -> None:  # killed between the two renames: the old one is aside, the new one complete
        raise Crash

    with pytest.raises(Crash), replacing_dir(str(path), between=crash) as tmp:
        (tmp_path / tmp / "which").write_text("third")
    assert (path / "which").read_text() == "second" and os.listdir(tmp_path) == ["final"]  # put back on error

    token = "123-0abc1234"
    (tmp_path / f"final.{token}.tmp").mkdir()
    (tmp_path / f"final.{token}.tmp" / "which").write_text("new")
    os.replace(path, tmp_path / f"final.{token}.old")
    (tmp_path / "final.456-0def5678.tmp").mkdir()  # another write, cut short before its swap
    recover_dir(str(path))
    assert (path / "which").read_text() == "new" and "final.456-0def5678.tmp" in os.listdir(tmp_path)
    recover_dir(str(path), remove_leftovers=True)
    assert os.listdir(tmp_path) == ["final"]


def test_whole_csv_files_are_written_as_the_csv_module_writes_them_and_read_back(tmp_path):
    import csv
    import io

    from dqn_cartpole.run_folder.csv_files import dict_rows, read_csv, write_csv_atomic

    rows = [{"run": "a", "best return": 500.0, "state": None}, {"run": "b,c", "best return": "", "state": "done"}]
    expected = io.StringIO()
    writer = csv.DictWriter(expected, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    path = tmp_path / "members.csv"
    write_csv_atomic(str(path), list(rows[0]), dict_rows(list(rows[0]), rows))
    assert path.read_bytes() == expected.getvalue().encode() and os.listdir(tmp_path) == ["members.csv"]
    assert read_csv(str(path)) == [{"run": "a", "best return": "500.0", "state": ""},
                                   {"run": "b,c", "best return": "", "state": "done"}]
    assert read_csv(str(tmp_path / "missing.csv")) == []


@pytest.mark.parametrize("info, what", [
    ({"solved": True}, "the weights that passed the solve check (the run stopped on it)"),
    ({}, "the weights at the last step"),
    ({"held_since": 4750}, "the weights at the last step: those that passed the solve check at iteration 4,750, held "
                           "since (agent.solved_learning_rate 0)"),
    ({"held_since": 5120, "held_weights": "live"}, "the weights at the last step: the live ones, held since iteration "
                                                   "5,120 (agent.solved_learning_rate 0; those that passed the solve "
                                                   "check were no longer kept)"),
])
def test_policy_final_says_whether_its_weights_stopped_the_run_moved_on_or_were_held_since_the_solve(tmp_path, info,
                                                                                                    what):
    from dqn_cartpole.run_folder.policy_files import INFO_FILE, describe_policy

    os.makedirs(tmp_path / "final")
    with open(tmp_path / "final" / INFO_FILE, "w", encoding="utf-8") as handle:
        json.dump({"iteration": 10000, "env_steps": 11000, "average_return": 492.1, "episodes": 100, **info}, handle)
    assert describe_policy(str(tmp_path / "final"), "final")["what"] == what
