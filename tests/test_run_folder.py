"""The run-folder API, in-process: atomic writes, read_run, find_runs."""

import json
import os

import pytest

from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder import SUMMARY_VERSION, RunLayout, read_run, write_summary
from dqn_cartpole.run_folder.atomic import replacing, write_text_atomic
from dqn_cartpole.run_folder.metrics import EVAL_COLUMNS, CsvLog
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
    from dqn_cartpole.run_folder.layout import LOCK_FILE
    from dqn_cartpole.run_folder.lock import lock_run
    from dqn_cartpole.run_folder.resolve import create_run_dir

    run = make_run(str(tmp_path / "run"))
    created, lock = create_run_dir(run.root, overwrite=True)
    assert created and os.listdir(run.root) == [LOCK_FILE]
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
