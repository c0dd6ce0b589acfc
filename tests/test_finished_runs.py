"""`train --resume` of a finished run, in-process and without TensorFlow: it trains on only when asked to go past
where the run ended (a solved run: past its solve), says in one line why there is nothing to do otherwise, and
never redraws the artifacts of a run whose artifacts are all there."""

import json
import os
import shutil

import pytest
import yaml

from dqn_cartpole.cli.main import main
from dqn_cartpole.config import dump_yaml, load_config
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.training import finished

from helpers import SMOKE, write_checkpoint

SOLVED_AT = 2500


def make_finished_run(root: str, solved: bool, artifacts: bool = True) -> checkpointing.Found:
    """A run folder as a finished run leaves it (no TF files: nothing here reads them): its config, a finished
    checkpoint's state.json and manifest, summary.json listing one artifact, report.html."""
    layout = RunLayout(root)
    os.makedirs(layout.root, exist_ok=True)
    with open(layout.config, "w", encoding="utf-8") as handle:  # a solved run stopped when solved
        handle.write(dump_yaml(load_config(SMOKE, [f"evaluation.stop_when_solved={str(solved).lower()}"])))
    path = write_checkpoint(layout.checkpoints, SOLVED_AT, finished=True,
                            num_iterations=30000 if solved else SOLVED_AT,
                            run_state={"solved_at_iteration": SOLVED_AT if solved else None})
    with open(os.path.join(path, checkpointing.STATE_FILE)) as handle:
        state = json.load(handle)
    os.makedirs(layout.plots)
    if artifacts:
        open(layout.returns_plot, "w").close()
    with open(layout.summary, "w") as handle:
        json.dump({"iterations": SOLVED_AT, "run_dir": root, "artifacts": {"returns.png": layout.returns_plot}}, handle)
    open(layout.report, "w").close()
    return checkpointing.Found(path, SOLVED_AT, state)


def config(*overrides: str):
    return load_config(SMOKE, list(overrides))


def test_a_solved_run_of_a_config_that_holds_its_solved_weights_trains_them_on_when_asked_for_more(tmp_path):
    """The default holds the weights that passed its solve check (agent.solved_learning_rate 0): a solved run asked
    to train on past its solve trains them (the key becomes null, and the first line says so), unless the command
    sets the key itself."""
    found = make_finished_run(str(tmp_path / "run"), solved=True)
    asked = load_config(None, ["training.num_iterations=3500"])
    assert asked.agent.solved_learning_rate == 0
    resume = finished.plan_finished("RUN", found, asked, {"training.num_iterations": 3500})
    assert resume.run and resume.config.agent.solved_learning_rate is None
    assert resume.written == (("evaluation.stop_when_solved", False), ("agent.solved_learning_rate", None))
    assert resume.line.endswith("(evaluation.stop_when_solved: false and agent.solved_learning_rate: null from now on)")
    kept = load_config(None, ["training.num_iterations=3500", "agent.solved_learning_rate=0"])
    resume = finished.plan_finished("RUN", found, kept, {"training.num_iterations": 3500,
                                                         "agent.solved_learning_rate": 0.0})
    assert resume.config.agent.solved_learning_rate == 0 and resume.written == (("evaluation.stop_when_solved", False),)


def test_a_solved_run_asked_for_more_iterations_trains_on_past_its_solve(tmp_path):
    found = make_finished_run(str(tmp_path / "run"), solved=True)
    asked = config("training.num_iterations=3500", "evaluation.stop_when_solved=true")
    resume = finished.plan_finished("RUN", found, asked, {"training.num_iterations": 3500})
    assert resume.run and not resume.config.evaluation.stop_when_solved
    assert resume.line == ("RUN was solved at iteration 2500; training on past the solve to iteration 3500 "
                           "(evaluation.stop_when_solved: false from now on)")
    assert resume.written == (("evaluation.stop_when_solved", False),)
    assert not finished.already_done(found, resume.config)  # so the session iterates


@pytest.mark.parametrize("given, overrides, needle", [
    ({}, ("training.num_iterations=30000", "evaluation.stop_when_solved=true"),
     "RUN was solved at iteration 2500 and stopped there: nothing to do (its artifacts are written). To train on "
     "past the solve: python -m dqn_cartpole train --resume RUN -n N, with N above 2500"),
    ({"training.num_iterations": 3500, "evaluation.stop_when_solved": True},
     ("training.num_iterations=3500", "evaluation.stop_when_solved=true"),
     "RUN was solved at iteration 2500 and stops when solved (evaluation.stop_when_solved): nothing to do. To train "
     "on past the solve: python -m dqn_cartpole train --resume RUN -n 3500 --set evaluation.stop_when_solved=false"),
    ({"training.num_iterations": 2000}, ("training.num_iterations=2000", "evaluation.stop_when_solved=true"),
     "RUN was solved at iteration 2500 and stopped there: nothing to do"),
])
def test_a_solved_run_with_nothing_to_do_says_why_and_how_to_go_on(tmp_path, monkeypatch, given, overrides,
                                                                   needle):
    monkeypatch.chdir(tmp_path)
    found = make_finished_run("RUN", solved=True)
    resume = finished.plan_finished("RUN", found, config(*overrides), given)
    assert not resume.run and resume.line.startswith(needle)


def test_a_finished_run_with_missing_artifacts_writes_them_again_and_says_so(tmp_path):
    root = str(tmp_path / "run")
    found = make_finished_run(root, solved=False, artifacts=False)
    resume = finished.plan_finished(root, found, config(f"training.num_iterations={SOLVED_AT}"), {})
    assert resume.run and "its summary and artifacts were not all written: writing them now" in resume.line
    open(RunLayout(root).returns_plot, "w").close()
    resume = finished.plan_finished(root, found, config(f"training.num_iterations={SOLVED_AT}"), {})
    assert not resume.run and "finished all its 2500 iterations: nothing to do" in resume.line
    moved = str(tmp_path / "moved")  # summary.json names the artifacts under the folder's old path
    os.rename(root, moved)
    assert not finished.plan_finished(moved, found, config(f"training.num_iterations={SOLVED_AT}"), {}).run
    longer = finished.plan_finished(moved, found, config("training.num_iterations=3000"),
                                    {"training.num_iterations": 3000})
    assert longer.run and longer.line is None and longer.config.evaluation.stop_when_solved is False  # smoke's


def test_a_run_stopped_before_its_end_is_simply_resumed(tmp_path):
    found = make_finished_run(str(tmp_path / "run"), solved=False)
    unfinished = checkpointing.Found(found.path, found.iteration, {**found.state, "finished": False})
    resume = finished.plan_finished("RUN", unfinished, config(), {})
    assert resume.run and resume.line is None and not resume.written


def test_resume_of_a_solved_run_answers_in_one_line_and_touches_nothing(tmp_path, capsys):
    """The command line, in-process: nothing is imported, built or redrawn; the line is the whole output."""
    root = str(tmp_path / "run")
    make_finished_run(root, solved=True)
    before = sorted((p, os.path.getmtime(os.path.join(d, p))) for d, _, files in os.walk(root) for p in files
                    if not p.endswith(".lock"))
    assert main(["train", "--resume", root]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{root} was solved at iteration 2500 and stopped there: nothing to do") and not err
    assert out.count("\n") == 1
    after = sorted((p, os.path.getmtime(os.path.join(d, p))) for d, _, files in os.walk(root) for p in files
                   if not p.endswith(".lock"))
    assert after == before


def test_a_real_finished_run_moved_elsewhere_has_nothing_to_do(smoke_run, tmp_path, capsys):
    """The session's smoke run (train --config smoke, 300 iterations), copied: its summary's artifact paths name the
    old folder, and each is found in the new one. `train` wrote what the user wrote next to config.yaml, and left
    no lock file (run.lock, roles.lock)."""
    root = str(tmp_path / "moved")
    assert not [name for name in os.listdir(smoke_run[0]) if name.endswith(".lock")]  # removed as the run ended
    shutil.copytree(smoke_run[0], root)
    written = RunLayout(root).written_config
    with open(SMOKE, encoding="utf-8") as handle:
        smoke = yaml.safe_load(handle)
    with open(written, encoding="utf-8") as handle:
        wrote = yaml.safe_load(handle)
    assert {s: sorted(keys) for s, keys in wrote.items()} == {s: sorted(keys) for s, keys in smoke.items()}
    assert wrote["replay"]["sampling"] == "auto" and wrote["agent"]["learning_rate"] == 1e-3  # as written, typed
    assert main(["train", "--resume", root]) == 0
    out = capsys.readouterr().out
    assert out == (f"{root} finished all its 300 iterations: nothing to do (its artifacts are written). To train "
                   f"longer: python -m dqn_cartpole train --resume {root} -n N, with N above 300\n")
    assert not [name for name in os.listdir(root) if name.endswith(".lock")]  # nor after a resume that did nothing


def test_training_on_past_the_solve_records_what_the_user_wrote(tmp_path, monkeypatch, capsys):
    """The command line up to the training (stubbed): the line it says first, the config it trains with, and the
    keys added to config.written.yaml (the -n given, and the solve check turned off for it)."""
    from dqn_cartpole.training import run

    root = str(tmp_path / "run")
    make_finished_run(root, solved=True)
    with open(RunLayout(root).written_config, "w", encoding="utf-8") as handle:
        handle.write("agent:\n  learning_rate: 0.001\n")
    ran = []
    monkeypatch.setattr(run, "run_resumed", lambda config, run_dir, plan, quiet: ran.append(config) or 0)
    assert main(["train", "--resume", root, "-n", "3500"]) == 0
    assert capsys.readouterr().err.startswith(f"{root} was solved at iteration 2500; training on past the solve")
    (config,) = ran
    assert config.training.num_iterations == 3500 and not config.evaluation.stop_when_solved
    with open(RunLayout(root).written_config, encoding="utf-8") as handle:
        assert yaml.safe_load(handle) == {"agent": {"learning_rate": 0.001}, "training": {"num_iterations": 3500},
                                          "evaluation": {"stop_when_solved": False}}
