"""The Python API (dqn_cartpole.load_config / train / Run / compare), in this process as a notebook uses it.

The runs here are trained in the pytest process, after other runs: each must be the run a fresh
`python -m dqn_cartpole train` process gives for the same config (the session's CLI `smoke_run`), value for value.
"""

from __future__ import annotations

import csv
import gc
import json
import os
import shutil
import time

import imageio.v2 as imageio
import numpy as np
import pytest

from helpers import CONFIGS

import dqn_cartpole as dq
from dqn_cartpole.cli.main import main

SMOKE = os.path.join(CONFIGS, "smoke.yaml")
QUIET = {"video.enabled": False, "output.tensorboard": False}
# Columns that hold the same numbers in any run of a config and seed (the others are seconds and speeds).
TIMED = ("wall_s", "train_steps_per_s")


def rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def untimed(path: str) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k not in TIMED} for row in rows(path)]


def file_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def left_behind() -> tuple[int, int]:
    """What runs could leave in this process for good: TensorFlow's registered custom gradients (each holds the graph
    it was traced in), and the graph operations alive."""
    from tensorflow.python.framework import ops

    gc.collect()
    custom = sum(name.startswith("CustomGradient-") for name in ops.gradient_registry._registry)
    return custom, sum(isinstance(o, ops.Operation) for o in gc.get_objects())


@pytest.fixture(scope="module")
def other_run(tmp_path_factory) -> tuple[dq.Run, tuple[int, int]]:
    """A run of another shape and seed first, so the runs after it are not this process's first: (run, what the
    process held before it)."""
    before = left_behind()
    run = dq.train(SMOKE, tmp_path_factory.mktemp("other") / "run", progress=False,
                   overrides={**QUIET, "training.seed": 1, "network.fc_layer_params": [16, 16],
                              "training.num_iterations": 200})
    return run, before


@pytest.fixture(scope="module")
def api_smoke(other_run, tmp_path_factory) -> tuple[dq.Run, float]:
    """configs/smoke.yaml exactly as the CLI's `smoke_run` trains it, here, after `other_run`: (run, its seconds)."""
    started = time.time()
    run = dq.train(SMOKE, tmp_path_factory.mktemp("api") / "run", progress=False)
    return run, time.time() - started


def test_a_bad_key_raises_a_value_error_with_the_clis_line_in_pythons_words(capsys, tmp_path):
    """The CLI's one line, naming the argument as the Python caller wrote it (not a `--set` it never typed)."""
    assert main(["train", "--config", SMOKE, "--set", "agent.learning_rat=0.001"]) == 2
    cli_line = capsys.readouterr().err.strip()
    assert cli_line.startswith("error: --set agent.learning_rat=0.001: ") and "\n" not in cli_line
    problem = cli_line[len("error: --set agent.learning_rat=0.001: "):]  # did you mean 'agent.learning_rate'?
    for call, where in ((lambda: dq.load_config(SMOKE, {"agent.learning_rat": 0.001}),
                         "overrides['agent.learning_rat']=0.001"),
                        (lambda: dq.load_config(SMOKE, ["agent.learning_rat=0.001"]),
                         "overrides[0]='agent.learning_rat=0.001'"),
                        (lambda: dq.train(SMOKE, tmp_path / "never", overrides={"agent.learning_rat": 0.001}),
                         "overrides['agent.learning_rat']=0.001")):
        with pytest.raises(dq.ConfigError) as raised:
            call()
        assert isinstance(raised.value, ValueError) and isinstance(raised.value, dq.UserError)
        assert str(raised.value) == f"{where}: {problem}"
        assert raised.value._render_traceback_() == [f"ConfigError: {raised.value}"]  # one line in Jupyter
    assert not os.path.exists(tmp_path / "never")
    assert capsys.readouterr() == ("", "")  # nothing printed, no traceback


def test_load_config_takes_the_clis_shortcuts_and_python_values():
    config = dq.load_config("smoke", {"network.fc_layer_params": (64, 64), "agent.learning_rate": 5e-4,
                                      "output.run_name": "123"}, env="CartPole-v0", seed=3, iterations=50)
    assert isinstance(config, dq.Config)
    assert (config.env.id, config.training.seed, config.training.num_iterations) == ("CartPole-v0", 3, 50)
    assert config.network.fc_layer_params == (64, 64) and config.agent.learning_rate == 5e-4
    assert config.output.run_name == "123"  # a string stays a string
    assert config == dq.load_config(SMOKE, ["network.fc_layer_params=[64,64]", "agent.learning_rate=5e-4",
                                            "output.run_name='123'", "env.id=CartPole-v0", "training.seed=3",
                                            "training.num_iterations=50"])
    for bad, needle in (({"training.batch_size": 1.5}, "training.batch_size: expected an integer"),
                        ("agent.gamma=1", "expected a mapping"), ({"agent.gamma": object()}, "expected a number")):
        with pytest.raises(dq.ConfigError, match=needle):
            dq.load_config("smoke", bad)


def test_a_run_in_this_process_is_the_run_a_fresh_process_gives(api_smoke, smoke_run):
    (run, seconds), (cli_dir, _) = api_smoke, smoke_run
    for name in ("train_metrics.csv", "eval_metrics.csv"):
        assert untimed(os.path.join(run.path, name)) == untimed(os.path.join(cli_dir, name)), name
    for which in ("best", "final"):  # the same weights, bit for bit
        variables = os.path.join("policy", which, "variables", "variables.data-00000-of-00001")
        assert file_bytes(os.path.join(run.path, variables)) == file_bytes(os.path.join(cli_dir, variables))
    assert file_bytes(os.path.join(run.path, "config.yaml")) == file_bytes(os.path.join(cli_dir, "config.yaml"))
    with open(os.path.join(cli_dir, "summary.json")) as handle:
        fresh = json.load(handle)
    for key in ("iterations", "train_steps", "env_steps", "best_return", "final_return", "solved_env_steps"):
        assert run.summary[key] == fresh[key], key
    # Its clocks count from its own start, not from the process's (which trained other runs before it).
    assert run.summary["wall_s"] <= seconds and run.summary["cpu_s"] <= seconds * 2


def test_runs_in_this_process_leave_nothing_behind(other_run, api_smoke):
    """Two runs later the process holds no more custom gradients, nor their traced graphs, than before them; nor do
    their folders keep a lock file (run.lock, roles.lock: removed as each run ended)."""
    _, (custom_before, operations_before) = other_run
    custom, operations = left_behind()
    assert custom == custom_before and operations <= operations_before + 100, (operations_before, operations)
    for run in (other_run[0], api_smoke[0]):
        assert not [name for name in os.listdir(run.path) if name.endswith(".lock")], run.path


def test_open_reads_a_run_folder_as_columns_and_summary(smoke_run, tmp_path):
    cli_dir, _ = smoke_run
    run = dq.Run.open(cli_dir)
    assert run.finished and not run.solved and not run.stopped and run == dq.Run.open(cli_dir + "/")
    with open(os.path.join(cli_dir, "summary.json")) as handle:
        assert run.summary == json.load(handle)
    assert isinstance(run.config, dq.Config) and run.config.training.num_iterations == 300
    evals = run.eval_metrics
    assert list(evals)[:3] == ["train_step", "env_steps", "average_return"]
    assert evals["train_step"].tolist() == [0, 100, 200, 300] and evals["average_return"].dtype == np.float64
    assert np.array_equal(evals["average_return"], [float(r["average_return"])
                                                    for r in rows(os.path.join(cli_dir, "eval_metrics.csv"))])
    assert run.train_metrics["train_step"].tolist() == [50, 100, 150, 200, 250, 300]
    for path, needle in ((tmp_path / "missing", "no such run folder"), (tmp_path, "not a run folder")):
        with pytest.raises(dq.UserError, match=needle):
            dq.Run.open(path)


def test_evaluate_record_report_and_how_a_run_shows_itself(api_smoke, tmp_path):
    run, _ = api_smoke
    evaluation = run.evaluate(episodes=4, seed=1)
    assert len(evaluation.returns) == 4 and 8 <= evaluation.mean <= 500
    assert str(evaluation).startswith(f"{run.path}/policy/best on CartPole-v1, 4 greedy episodes: mean ")
    assert len(run.evaluate(episodes=2, final=True).returns) == 2
    with pytest.raises(dq.UserError, match="--episodes: must be positive"):
        run.evaluate(episodes=0)
    out = run.record(tmp_path / "agent.mp4", fps=30)
    assert out == str(tmp_path / "agent.mp4") and imageio.get_reader(out).get_meta_data()["fps"] == 30
    random_video = run.record(random=True)  # the command's frame rate: the run's video.fps
    assert random_video == os.path.join(run.path, "videos", "random-agent-2.mp4")  # never replaced
    assert imageio.get_reader(random_video).get_meta_data()["fps"] == run.config.video.fps != 30
    assert hasattr(run.policy(), "action")
    os.remove(os.path.join(run.path, "plots", "returns.png"))
    assert run.report() == os.path.join(run.path, "report.html")
    assert os.path.exists(os.path.join(run.path, "plots", "returns.png"))
    shown = run._repr_html_()
    # the smoke config checks for no solve (stop_when_solved: false), and the view says so
    assert "No solve check ran (evaluation.stop_when_solved: false)" in shown and "Not solved" not in shown
    assert shown.count("data:image/png;base64,") == 1
    assert shown.count("data:video/mp4;base64,") == 1


def test_resume_continues_a_run_with_new_iterations(other_run, capsys):
    other_run, _ = other_run
    with pytest.raises(dq.UserError, match="cannot change network.fc_layer_params"):  # the CLI's check and line
        dq.train(resume=other_run, overrides={"network.fc_layer_params": [32]})
    with pytest.raises(dq.UserError, match="give no config"):
        dq.train("smoke", resume=other_run)
    resumed = dq.train(resume=other_run.path, overrides={"training.num_iterations": 300}, progress=False)
    assert resumed == other_run and resumed.summary["resumed_from"].endswith("ckpt-0000000200")
    assert resumed.train_metrics["train_step"].tolist() == [50, 100, 150, 200, 250, 300]
    assert resumed.eval_metrics["train_step"].tolist() == [0, 100, 200, 300]
    env_steps = resumed.train_metrics["env_steps"]
    assert np.all(np.diff(env_steps) > 0) and resumed.config.network.fc_layer_params == (16, 16)
    # Finished, as `train --resume` answers it: nothing to do, said in one line, its folder untouched.
    summary = file_bytes(os.path.join(other_run.path, "summary.json"))
    capsys.readouterr()
    assert dq.train(resume=other_run, progress=False) == other_run
    said = capsys.readouterr().out.strip()
    assert said == (f"{other_run.path} finished all its 300 iterations: nothing to do (its artifacts are written). To "
                    f"train longer: dqn_cartpole.train(resume={other_run.path!r}, overrides={{'training.num_iterations'"
                    f": N}}), with N above 300"), said
    assert file_bytes(os.path.join(other_run.path, "summary.json")) == summary


def test_sweep_is_the_sweep_command(api_smoke, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # smoke.yaml's output.root, outputs/, is relative
    with pytest.raises(dq.UserError, match="grid: agent.learning_rate: expected a list of values"):
        dq.sweep("smoke", grid={"agent.learning_rate": 0.001})
    with pytest.raises(dq.UserError, match="--seeds 0-x: expected seeds like 0-4"):
        dq.sweep("smoke", seeds="0-x")
    # A sweep whose members are done (copies of a finished run, in the folder the command planned) trains nothing
    # and returns them, as the command skips them; its own checks, manifest and summary apply.
    from dqn_cartpole.config import locate_config
    from dqn_cartpole.experiments.sweep import plan_sweep, write_manifest

    plan = plan_sweep(locate_config("smoke"), "0,1", ["agent.learning_rate=[0.001]"], [], None, "done")
    os.makedirs(plan.folder)
    write_manifest(plan)
    folder = tmp_path / "outputs" / "sweeps" / "done"
    for seed in (0, 1):
        shutil.copytree(api_smoke[0].path, folder / f"learning_rate=0.001__s{seed}")
    runs = dq.sweep("smoke", seeds=[0, 1], grid={"agent.learning_rate": [0.001]}, name="done", progress=False)
    assert runs == [dq.Run(str(folder / f"learning_rate=0.001__s{seed}")) for seed in (0, 1)]
    assert "sweep done: 2 runs (2 already done, 0 finished now, 0 failed)" in capsys.readouterr().out
    assert (folder / "report.html").is_file()
