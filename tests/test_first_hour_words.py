"""The first hour, third pass (issue 41), in-process on hand-made run folders: the outcome's words say which checks
ran, Python callers get Python's words, and `record` loses no file."""

import hashlib
import os
import re

import pytest
import yaml

import dqn_cartpole as dq
from dqn_cartpole.api.display import run_html
from dqn_cartpole.cli.main import main
from dqn_cartpole.config import load, to_dict
from dqn_cartpole.experiments.compare import load_runs, run_compare
from dqn_cartpole.report.run_page import write_run_report
from dqn_cartpole.run_folder import RunLayout, read_run, write_summary
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.csv_files import CsvLog
from dqn_cartpole.run_folder.metrics import EVAL_COLUMNS


def make_run(root: str, overrides=(), best: float = 200.0, solved: bool = False) -> str:
    """A finished run folder as `train` leaves it (config, metrics, summary, a video and a policy file), trained on
    nothing: CartPole-v0 (target 195), its best evaluation `best`."""
    layout = RunLayout(root)
    os.makedirs(layout.videos)
    os.makedirs(layout.best_policy)
    config = load(None, ["env.id=CartPole-v0", *overrides]).config
    write_text_atomic(layout.config, yaml.safe_dump(to_dict(config)))
    log = CsvLog(layout.eval_metrics, EVAL_COLUMNS)
    log.write({"train_step": 0, "env_steps": 100, "average_return": 20.0, "num_episodes": 10, "wall_s": 1.0})
    log.write({"train_step": 1000, "env_steps": 1100, "average_return": best, "num_episodes": 10, "wall_s": 9.0})
    log.close()
    write_summary(layout.summary, {"iterations": 1000, "env_steps": 1100, "best_return": best, "final_return": best,
                                   "wall_s": 10.0, "solved_at_iteration": 1000 if solved else None,
                                   "solved_env_steps": 1100 if solved else None, "solved_wall_s": 9.5})
    with open(layout.trained_video, "wb") as handle:
        handle.write(b"\0\0\0\x18ftypmp42 the run's own video")
    with open(os.path.join(layout.best_policy, "saved_model.pb"), "wb") as handle:
        handle.write(b"a policy")
    return root


def outcome(page: str) -> str:
    return re.search(r'<p class="outcome (\w+)">([^<]*)</p>', page).group(2)


# ---------------------------------------------------------------------------- words that match what happened


def test_a_run_without_a_solve_check_says_so_and_is_not_called_unsolved(tmp_path):
    """The notebook's tutorial run: CartPole-v0, stop_when_solved false, best 200 >= 195."""
    run = make_run(str(tmp_path / "off"), ["evaluation.stop_when_solved=false"])
    page = open(write_run_report(run), encoding="utf-8").read()
    text = outcome(page)
    assert text.startswith("No solve check ran (evaluation.stop_when_solved: false): the best greedy average return "
                           "was 200.0, at or above the target 195"), text
    assert "Not solved" not in page and 'class="outcome unchecked"' in page
    shown = run_html(read_run(run))  # the notebook's Run view says the same
    assert "No solve check ran" in shown and "Not solved" not in shown
    below = make_run(str(tmp_path / "low"), ["evaluation.stop_when_solved=false"], best=150.0)
    assert "was 150.0, below the target 195" in outcome(open(write_run_report(below), encoding="utf-8").read())


def test_a_run_with_the_check_on_is_solved_or_not_solved(tmp_path):
    checked = make_run(str(tmp_path / "on"), best=150.0)
    assert outcome(open(write_run_report(checked), encoding="utf-8").read()).startswith(
        "Not solved: the best greedy average return was 150.0, the target is 195")
    solved = make_run(str(tmp_path / "solved"), solved=True)
    assert outcome(open(write_run_report(solved), encoding="utf-8").read()).startswith("Solved at iteration 1,000")


def test_a_run_that_trains_on_past_its_solve_checks_for_it_and_an_unconfirmed_best_is_not_called_a_solve(tmp_path):
    """stop_when_solved false with the default's solved_target_update_* keys: the run checks for its solve (its
    summary says so), so it is solved or not solved; a best evaluation at the target that no check confirmed is said
    to be just that, not a bare "Not solved" beside 200 >= 195."""
    run = make_run(str(tmp_path / "on"), ["evaluation.stop_when_solved=false"])
    summary_path = RunLayout(run).summary
    summary = yaml.safe_load(open(summary_path, encoding="utf-8"))
    write_summary(summary_path, {**summary, "solve_checked": True, "solve_return_target": 195.0})
    text = outcome(open(write_run_report(run), encoding="utf-8").read())
    assert text.startswith("Not solved: no solve check confirmed it; the best greedy average return was 200.0, at or "
                           "above the target 195 in an evaluation, not confirmed on fresh episodes"), text
    write_summary(summary_path, {**summary, "solve_checked": False, "solve_return_target": 195.0})
    assert outcome(open(write_run_report(run), encoding="utf-8").read()).startswith("No solve check ran")


def test_compare_counts_solves_only_among_runs_that_checked(tmp_path):
    off = [make_run(str(tmp_path / f"off{i}"), ["evaluation.stop_when_solved=false", f"training.seed={i}"])
           for i in range(2)]
    table = run_compare(load_runs(off), str(tmp_path / "cmp"))
    (row,) = [line for line in table.splitlines() if line.startswith("| ") and "| 2 |" in line]
    assert "| no solve check (stop_when_solved: false) |" in row and "0/" not in row
    csv_text = open(tmp_path / "cmp" / "table.csv", encoding="utf-8").read().splitlines()
    assert csv_text[0].split(",")[2:4] == ["solve checked", "solved fraction"]
    assert csv_text[1].split(",")[2:4] == ["0", ""]  # no fraction of nothing
    # solved, then trained on past its solve (a resume turns the check off): it did check
    mixed = off + [make_run(str(tmp_path / "past"), ["evaluation.stop_when_solved=false", "training.seed=2"],
                            solved=True)]
    table = run_compare(load_runs(mixed), str(tmp_path / "cmp2"))
    assert "1/1 (100%); 2 of 3 not checked" in table and "only the runs that checked" in table


def test_the_report_says_none_changed_in_words(tmp_path):
    run = make_run(str(tmp_path / "run"), ["env.id=CartPole-v1"])  # back to the default: nothing changed
    written = RunLayout(run).written_config
    assert not os.path.exists(written)  # compared by its resolved values
    config = open(write_run_report(run), encoding="utf-8").read().split("<h2>Config</h2>", 1)[1]
    assert "the user changed none" in config and "the 0" not in config


# ---------------------------------------------------------------------------- Python's words for Python callers


@pytest.mark.parametrize("overrides, needle", [
    ({"training.batch_size": "64"}, "overrides['training.batch_size']='64': training.batch_size: expected an integer"),
    (["training.batch_size=abc"], "overrides[0]='training.batch_size=abc': training.batch_size: expected an integer"),
    ({"trainig.seed": 1}, "overrides['trainig.seed']=1: unknown section 'trainig' (did you mean 'training'?)"),
    ({"training.seed": object()}, "overrides['training.seed']: expected a number, string, true/false, null or a list"),
])
def test_load_config_names_the_argument_as_python_wrote_it(overrides, needle):
    with pytest.raises(dq.ConfigError) as caught:
        dq.load_config("default", overrides=overrides)
    assert str(caught.value).startswith(needle) and "--set" not in str(caught.value)


# ---------------------------------------------------------------------------- record loses no file


def snapshot(root: str) -> dict:
    """Every file under `root` and its bytes' digest, and every folder."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(folder, name), root)] = "folder"
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                found[os.path.relpath(os.path.join(folder, name), root)] = hashlib.sha256(handle.read()).hexdigest()
    return found


@pytest.mark.parametrize("target, overwrite, needle", [
    ("config.yaml", False, "is in the run folder"),
    ("config.yaml", True, "is in the run folder"),  # overwrite allows replacing a recording, not a run's file
    ("summary.json", True, "is in the run folder"),
    ("new.mp4", False, "is in the run folder"),
    ("policy/best/saved_model.pb", True, "is in the run folder"),
    ("policy/best/new.mp4", False, "is in the run folder"),
    ("videos/trained-agent.mp4", False, "exists; pass --overwrite to replace it"),
])
def test_record_refuses_a_runs_own_files_and_leaves_the_folder_as_it_was(tmp_path, capsys, target, overwrite, needle):
    run = make_run(str(tmp_path / "run"))
    before = snapshot(run)
    output = os.path.join(run, target)
    for argv in (["record", "--random", "-o", output], ["record", run, "-o", output]):
        assert main(argv + (["--overwrite"] if overwrite else [])) == 2
        err = capsys.readouterr().err
        assert err == f"error: --output {output}: {needle}" + err.split(needle, 1)[1] and err.count("\n") == 1, err
    with pytest.raises(dq.UserError, match=re.escape(f"output {output}: {needle.replace('--overwrite', 'overwrite=True')}")):
        dq.Run.open(run).record(output, overwrite=overwrite)
    assert snapshot(run) == before


def test_record_refuses_an_existing_file_unless_told_to_overwrite_it(tmp_path, capsys, monkeypatch):
    from dqn_cartpole.report import video

    mine = tmp_path / "mine.mp4"
    mine.write_bytes(b"someone's video")
    assert main(["record", "--random", "-o", str(mine)]) == 2
    assert capsys.readouterr().err == (f"error: --output {mine}: exists; pass --overwrite to replace it, or give "
                                       f"another name\n")
    run = make_run(str(tmp_path / "run"))
    with pytest.raises(dq.UserError, match="exists; pass overwrite=True to replace it"):
        dq.Run.open(run).record(mine)
    assert mine.read_bytes() == b"someone's video"
    written = []
    monkeypatch.setattr(video, "record_video", lambda act, env_id, path, *_: written.append(path) or [9.0])
    assert main(["record", "--random", "-o", str(mine), "--overwrite"]) == 0 and written == [str(mine)]
    assert main(["record", "--random", "-o", os.path.join(run, "videos", "extra.mp4")]) == 0  # a new video: fine
