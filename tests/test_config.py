"""Config loading, overrides and every kind of bad input."""

import os

import pytest

from dqn_cartpole.config import Config, describe, dump_yaml, load_config
from dqn_cartpole.errors import ConfigError

from helpers import CONFIGS, REPO, run_cli


def write(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_repo_configs_load():
    for name in ("default", "tutorial", "smoke"):
        assert isinstance(load_config(os.path.join(CONFIGS, f"{name}.yaml")), Config)


def test_tutorial_config_is_the_tutorial():
    c = load_config(os.path.join(CONFIGS, "tutorial.yaml"))
    assert c.env.id == "CartPole-v0"
    assert c.training.num_iterations == 20000
    assert c.training.initial_collect_steps == 100
    assert c.training.collect_steps_per_iteration == 1
    assert c.replay.capacity == 100000
    assert c.training.batch_size == 64
    assert c.agent.learning_rate == 1e-3
    assert c.network.fc_layer_params == (100, 50)
    assert (c.training.log_interval, c.evaluation.eval_interval, c.evaluation.num_eval_episodes) == (200, 1000, 10)
    assert c.agent.td_loss == "squared"
    assert c.collection.driver == "py"  # the tutorial's PyDriver loop


def test_collection_driver_is_checked():
    assert load_config().collection.driver == "compiled"
    with pytest.raises(ConfigError, match=r"collection.driver: must be one of compiled, py, got 'pydriver'"):
        load_config(overrides=["collection.driver=pydriver"])


def test_scientific_notation_loads_as_float(tmp_path):
    c = load_config(write(tmp_path, "agent:\n  learning_rate: 1e-3\n"))
    assert c.agent.learning_rate == pytest.approx(0.001) and isinstance(c.agent.learning_rate, float)


def test_overrides_apply_in_order_and_parse_as_yaml():
    c = load_config(None, ["agent.learning_rate=5e-4", "network.fc_layer_params=[8, 4]",
                           "agent.double_dqn=true", "training.seed=7", "training.seed=8"])
    assert c.agent.learning_rate == 5e-4
    assert c.network.fc_layer_params == (8, 4)
    assert c.agent.double_dqn is True
    assert c.training.seed == 8


def test_config_is_frozen():
    c = load_config(None)
    with pytest.raises(Exception):
        c.agent.gamma = 0.5  # type: ignore[misc]


def test_dump_round_trips(tmp_path):
    c = load_config(os.path.join(CONFIGS, "tutorial.yaml"), ["agent.gamma=0.9"])
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_yaml(c))
    assert load_config(str(path)) == c


def test_every_field_is_documented():
    text = describe()
    assert text.count("#") >= 30
    assert "learning_rate" in text


@pytest.mark.parametrize("text, needle", [
    ("agent:\n  learning_rat: 0.1\n", "did you mean 'agent.learning_rate'"),
    ("agnet:\n  gamma: 0.9\n", "did you mean 'agent'"),
    ("agent:\n  gamma: 1.5\n", "agent.gamma: must be in [0, 1]"),
    ("agent:\n  gamma: high\n", "agent.gamma: expected a number"),
    ("training:\n  batch_size: 0\n", "training.batch_size: must be positive"),
    ("training:\n  batch_size: 64\nreplay:\n  capacity: 10\n", "larger than replay.capacity"),
    ("training:\n  num_iterations: 2.5\n", "training.num_iterations: expected an integer"),
    ("evaluation:\n  eval_interval: -5\n", "evaluation.eval_interval: must be positive"),
    ("env:\n  id: CartPol-v1\n", "did you mean 'CartPole-v1'"),
    ("env:\n  id: Pendulum-v1\n", "env.id"),
    ("agent:\n  td_loss: hubber\n", "did you mean 'huber'"),
    ("network:\n  fc_layer_params: [64, -1]\n", "network.fc_layer_params"),
    ("network:\n  fc_layer_params: 64\n", "expected a list of integers"),
    ("agent:\n  double_dqn: 3\n", "expected true or false"),
    ("agent: [1, 2]\n", "agent: expected a mapping"),
    ("- 1\n- 2\n", "expected a mapping of sections"),
    ("", "the file is empty"),
    ("agent:\n  gamma: [0.9\n", "malformed YAML"),
    ("!!python/object/apply:os.system ['echo hi']\n", "malformed YAML"),
])
def test_bad_files(tmp_path, text, needle):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("item, needle", [
    ("agent.gamma", "expected section.key=value"),
    ("gamma=0.5", "one dot"),
    ("agent.gama=0.5", "did you mean 'agent.gamma'"),
    ("agent.gamma=[", "malformed value"),
    ("training.batch_size=big", "expected an integer"),
])
def test_bad_overrides(item, needle):
    with pytest.raises(ConfigError) as info:
        load_config(None, [item])
    assert needle in str(info.value)


@pytest.mark.parametrize("args", [
    ["train", "--config", "missing.yaml"],
    ["train", "--set", "agent.gamma=2"],
    ["train", "--set", "nonsense"],
    ["train", "--set", "agent.learning_rat=0.1"],
    ["train", "--bogus-flag"],
    ["evaluate", "no/such/run"],
    ["plot", "no/such/run"],
    ["record"],
])
def test_cli_bad_input_is_one_line_exit_2_and_leaves_no_run(tmp_path, args):
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "outputs").exists()


def test_samples_per_insert_needs_an_error_buffer_reverb_accepts():
    assert load_config(overrides=["distributed.samples_per_insert=8"]).distributed.samples_per_insert == 8.0
    with pytest.raises(ConfigError, match=r"distributed.samples_per_insert_tolerance: must be at least max\(1, "
                                          r"distributed.samples_per_insert\) = 8 .*got 4"):
        load_config(overrides=["distributed.samples_per_insert=8", "distributed.samples_per_insert_tolerance=4"])
    with pytest.raises(ConfigError, match="distributed.samples_per_insert: must be positive or null, got -1"):
        load_config(overrides=["distributed.samples_per_insert=-1"])
