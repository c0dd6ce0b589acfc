"""Config loading, overrides and every kind of bad input."""

import os

import pytest

import dataclasses

import gymnasium
import yaml

from dqn_cartpole import config as config_module
from dqn_cartpole import config_docs
from dqn_cartpole.config import declare, files
from dqn_cartpole.cli.main import main
from dqn_cartpole.config import Config, dump_yaml, load_config, locate_config, read_resolved, to_dict
from dqn_cartpole.errors import ConfigError
from dqn_cartpole.report import changed_keys

from helpers import CONFIGS, REPO


def write(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_repo_configs_load():
    for name in ("default", "tutorial", "smoke", "acrobot", "mountaincar"):
        assert isinstance(load_config(os.path.join(CONFIGS, f"{name}.yaml")), Config)


def test_the_lunarlander_preset_needs_only_the_box2d_extra():
    try:
        import Box2D  # noqa: F401  (the optional extra: pip install "dqn_cartpole[box2d]")
    except ImportError:
        with pytest.raises(ConfigError, match=r"env.id: cannot construct env 'LunarLander-v3': Box2D is not "
                                              r"installed; install it with: pip install 'dqn_cartpole\[box2d\]'"):
            load_config(os.path.join(CONFIGS, "lunarlander.yaml"))
    else:
        config = load_config(os.path.join(CONFIGS, "lunarlander.yaml"))
        assert config.env.id == "LunarLander-v3" and config.evaluation.solve_return is None  # the registry's 200


def test_the_code_defaults_are_default_yaml():
    """One source: Config(), train without --config and configs/default.yaml are the same config."""
    from_file = read_resolved(os.path.join(CONFIGS, "default.yaml"))
    assert to_dict(Config()) == from_file
    assert load_config(None) == load_config(os.path.join(CONFIGS, "default.yaml"))
    with open(os.path.join(CONFIGS, "default.yaml")) as handle:
        written = yaml.safe_load(handle)
    assert {s: set(v) for s, v in written.items()} == {s: set(v) for s, v in to_dict(Config()).items()}
    # A file that names a few keys keeps default.yaml's values for the others.
    smoke = load_config(os.path.join(CONFIGS, "smoke.yaml"))
    assert smoke.training.num_iterations == 300
    assert smoke.training.keep_checkpoints == Config().training.keep_checkpoints


def test_a_default_file_without_a_key_or_with_an_unknown_one_is_one_line(tmp_path, monkeypatch):
    def section():
        class Section:  # as the config's sections, before @dataclass turns it into one
            a: int = declare.key("a")
            b: int = declare.key("b")
        return Section

    source = tmp_path / "default.yaml"
    monkeypatch.setattr(files, "default_config_path", lambda: str(source))
    monkeypatch.setattr(declare, "default_values", lambda: files.read_yaml(str(source)))
    source.write_text("s:\n  a: 1\n  b: 2\n")
    assert dataclasses.dataclass(declare.section_defaults("s")(section()))().b == 2
    source.write_text("s:\n  a: 1\n")
    with pytest.raises(ConfigError, match=r"s.b is missing; default.yaml gives every key's default"):
        declare.section_defaults("s")(section())
    source.write_text("s:\n  a: 1\n  b: 2\n  c: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 's.c'"):
        declare.section_defaults("s")(section())


def test_shipped_configs_are_found_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    expected = os.path.realpath(os.path.join(CONFIGS, "acrobot.yaml"))
    for given in ("acrobot", "acrobot.yaml", "configs/acrobot.yaml"):
        assert os.path.realpath(locate_config(given)) == expected
    assert os.path.realpath(locate_config(None)) == os.path.realpath(os.path.join(CONFIGS, "default.yaml"))
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "acrobot.yaml").write_text("env:\n  id: CartPole-v0\n")  # a file there wins
    assert load_config("configs/acrobot.yaml").env.id == "CartPole-v0"
    with pytest.raises(ConfigError, match=r"acrobt: config file not found \(the shipped configs: acrobot, c51, default"):
        locate_config("acrobt")
    space = os.path.realpath(os.path.join(CONFIGS, "tune", "acrobot-space.yaml"))
    for given in ("acrobot-space", "configs/tune/acrobot-space.yaml"):
        assert os.path.realpath(config_module.locate_space(given)) == space
    with pytest.raises(ConfigError, match=r"--space nope: no such file \(the shipped search spaces: acrobot-space"):
        config_module.locate_space("nope")


def test_config_command_prints_a_documented_config_that_loads_back(tmp_path, capsys):
    assert main(["config", "--config", os.path.join(CONFIGS, "smoke.yaml"), "--set", "agent.gamma=0.9"]) == 0
    text = capsys.readouterr().out
    assert "  # float: discount factor, in [0, 1]. CHANGED from 0.99\n  gamma: 0.9\n" in text
    assert "  # float: Adam learning rate. CHANGED from 0.0050812235136948915\n" in text
    assert "# int: env steps collected per iteration, summed over envs.\n  collect_steps_per_iteration: 1\n" in text  # unchanged: no mark
    keys = [line for line in text.splitlines() if line.startswith("  ") and not line.startswith("  #")]
    assert len(keys) == len(config_docs.keys())  # every key, each with its comment
    path = tmp_path / "resolved.yaml"
    path.write_text(text)
    assert load_config(str(path)) == load_config(os.path.join(CONFIGS, "smoke.yaml"), ["agent.gamma=0.9"])


def test_shortcuts_are_set_overrides_and_a_later_set_wins(capsys):
    assert main(["config", "--plain", "--env", "Acrobot-v1", "--seed", "3", "-n", "50"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert (resolved["env"]["id"], resolved["training"]["seed"], resolved["training"]["num_iterations"]) == (
        "Acrobot-v1", 3, 50)
    assert main(["config", "--plain", "--iterations", "50", "--set", "training.num_iterations=70"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["training"]["num_iterations"] == 70


def test_the_configuration_reference_page_is_current():
    with open(os.path.join(REPO, config_docs.REFERENCE_PAGE), encoding="utf-8") as handle:
        page = handle.read()
    assert page == config_docs.reference_markdown(), f"regenerate it: {config_docs.REGENERATE}"
    for doc in config_docs.keys():
        assert f"| `{doc.key}` |" in page


def test_only_the_keys_that_apply_to_a_run_are_listed():
    single = to_dict(load_config(None))
    assert config_module.applies(single, "agent.gamma")
    assert not config_module.applies(single, "distributed.samples_per_insert")
    assert config_module.applies(single, "distributed.samples_per_insert", distributed=True)
    assert not config_module.applies(single, "replay.reverb_port")
    assert not config_module.applies(single, "replay.prefetch")  # tf_uniform reads directly
    reverb = to_dict(load_config(None, ["replay.backend=reverb"]))
    assert config_module.applies(reverb, "replay.reverb_port") and config_module.applies(reverb, "replay.prefetch")


def test_an_auto_value_resolved_as_auto_means_is_not_a_difference():
    default = read_resolved(os.path.join(CONFIGS, "default.yaml"))
    run = to_dict(load_config(None))
    assert run["replay"]["sampling"] == "direct" and default["replay"]["sampling"] == "auto"
    assert not changed_keys.written_differs(run, default, "replay.sampling")
    reverb = to_dict(load_config(None, ["replay.backend=reverb"]))
    assert not changed_keys.written_differs(reverb, default, "replay.sampling")  # auto means dataset for Reverb
    assert changed_keys.written_differs(reverb, default, "replay.backend")
    direct_on_purpose = to_dict(load_config(None, ["replay.sampling=dataset"]))
    assert changed_keys.written_differs(direct_on_purpose, default, "replay.sampling")


def test_solve_return_comes_from_the_registry_or_the_config():
    assert load_config(os.path.join(CONFIGS, "acrobot.yaml")).evaluation.solve_return is None  # the registry's -100
    if "DqnCartpoleTest/NoThreshold-v0" not in gymnasium.registry:
        gymnasium.register("DqnCartpoleTest/NoThreshold-v0",
                           entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=50)
    with pytest.raises(ConfigError, match=r"evaluation.solve_return: DqnCartpoleTest/NoThreshold-v0 registers no "
                                          r"reward threshold"):
        load_config(None, ["env.id=DqnCartpoleTest/NoThreshold-v0"])
    assert load_config(None, ["env.id=DqnCartpoleTest/NoThreshold-v0", "evaluation.solve_return=40"])
    assert load_config(None, ["env.id=DqnCartpoleTest/NoThreshold-v0", "evaluation.stop_when_solved=false"])


def test_py_uniform_with_several_envs_is_refused_when_the_config_loads():
    with pytest.raises(ConfigError, match=r"replay.backend: py_uniform stores a single stream of steps; set "
                                          r"env.num_envs: 1 \(got 2\)"):
        load_config(None, ["replay.backend=py_uniform", "env.num_envs=2", "training.collect_steps_per_iteration=2"])


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
    assert c.agent.kind == "double_dqn" and c.agent.double_dqn is None  # the deprecated key, read as the kind
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
    docs = config_docs.keys()
    assert len(docs) >= 50 and all(doc.doc and doc.type for doc in docs)
    assert {doc.key.split(".")[0] for doc in docs} == set(config_module.SECTIONS)


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
def test_cli_bad_input_is_one_line_exit_2_and_leaves_no_run(tmp_path, monkeypatch, capsys, args):
    """In-process (tests/test_bad_input.py runs the table of cases as subprocesses)."""
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert not (tmp_path / "outputs").exists()


def test_samples_per_insert_needs_an_error_buffer_reverb_accepts():
    assert load_config(overrides=["distributed.samples_per_insert=8"]).distributed.samples_per_insert == 8.0
    with pytest.raises(ConfigError, match=r"distributed.samples_per_insert_tolerance: must be at least max\(1, "
                                          r"distributed.samples_per_insert\) = 8 .*got 4"):
        load_config(overrides=["distributed.samples_per_insert=8", "distributed.samples_per_insert_tolerance=4"])
    with pytest.raises(ConfigError, match="distributed.samples_per_insert: must be positive or null, got -1"):
        load_config(overrides=["distributed.samples_per_insert=-1"])


@pytest.mark.parametrize("args, start", [
    (["--set", "agent.gamma=1.5"], "error: --set agent.gamma=1.5: agent.gamma: must be in [0, 1], got 1.5"),
    (["--set", "replay.backend=foo"], "error: --set replay.backend=foo: replay.backend: must be one of"),
    (["--env", "Pendulum-v1"], "error: --env Pendulum-v1: env.id: env 'Pendulum-v1' has unsupported action space"),
    (["-n", "0"], "error: -n 0: training.num_iterations: must be positive"),
    (["--seed", "-1"], "error: --seed -1: training.seed: must be in [0, 2147483647], got -1"),
    (["--set", "agent.gamma=abc"], "error: --set agent.gamma=abc: agent.gamma: expected a number, got str 'abc'"),
    # a constraint between keys blames the newest of their values: here the flag, not the file
    (["--config", "smoke", "--set", "replay.capacity=10"],
     "error: --set replay.capacity=10: training.batch_size: 32 is larger than replay.capacity (10)"),
    (["--env", "DqnCartpoleTest/NoThreshold-v0"], "error: --env DqnCartpoleTest/NoThreshold-v0: "
                                                  "evaluation.solve_return: DqnCartpoleTest/NoThreshold-v0 registers"),
])
def test_a_bad_value_names_the_flag_it_came_from(capsys, args, start):
    if "DqnCartpoleTest/NoThreshold-v0" not in gymnasium.registry:
        gymnasium.register("DqnCartpoleTest/NoThreshold-v0",
                           entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=50)
    assert main(["config", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(start) and err.count("\n") == 1, err


def test_a_bad_value_in_a_file_names_the_file_even_after_flags(tmp_path, capsys):
    path = write(tmp_path, "agent:\n  gamma: 1.5\nreplay:\n  capacity: 10\n")
    assert main(["config", "--config", path, "--set", "agent.learning_rate=1e-3"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {path}: agent.gamma: must be in [0, 1]")
    assert main(["config", "--config", path, "--set", "agent.gamma=0.9"]) == 2  # the file's capacity is the newest
    assert capsys.readouterr().err.startswith(f"error: {path}: training.batch_size: 64 is larger than replay.capacity")


@pytest.mark.parametrize("value, needle", [
    ("[128,abc]", "expected a list of integers, but item 2 is str 'abc'"),
    ("[64, true]", "expected a list of integers, but item 2 is bool True"),
    ("[[8]]", "expected a list of integers, but item 1 is list"),
    ("64", "expected a list of integers, got int 64"),
])
def test_a_list_error_names_the_bad_element(value, needle):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"network.fc_layer_params={value}"])
    assert str(info.value) == f"--set network.fc_layer_params={value}: network.fc_layer_params: {needle}"


def test_config_marks_only_what_the_user_wrote_as_changed(capsys):
    """Changed means written with another value than the default; an `auto` the config resolved is no change."""
    assert main(["config", "--set", "agent.learning_rate=1e-3"]) == 0
    text = capsys.readouterr().out
    assert [line for line in text.splitlines() if "CHANGED" in line and line.startswith("  #")] == [
        "  # float: Adam learning rate. CHANGED from 0.0050812235136948915"]
    assert "auto resolves to direct for this config.\n  sampling: direct\n" in text
    assert main(["config", "--set", "replay.sampling=direct"]) == 0  # written, so changed, though auto means it too
    assert "CHANGED from auto\n  sampling: direct\n" in capsys.readouterr().out
    assert main(["config", "--config", "smoke"]) == 0  # smoke.yaml writes sampling: auto and gamma: 0.99
    text = capsys.readouterr().out
    assert "CHANGED" not in text.split("  sampling:")[0].rsplit("\n", 2)[-2]
    assert "discount factor, in [0, 1].\n  gamma: 0.99\n" in text


def test_what_was_written_is_kept_apart_from_what_resolved(tmp_path):
    loaded = config_module.load(os.path.join(CONFIGS, "smoke.yaml"),
                                [config_module.Flagged("env.id=\"CartPole-v0\"", "--env CartPole-v0"),
                                 "replay.sampling=direct", "agent.gamma=0.9"])
    assert loaded.written["replay.sampling"] == "direct" and loaded.written["agent.gamma"] == 0.9
    assert loaded.origins["env.id"] == "--env CartPole-v0" and loaded.origins["agent.gamma"] == "--set agent.gamma=0.9"
    assert list(loaded.origins)[-1] == "agent.gamma"  # the newest value last
    assert "replay.sampling" in changed_keys.changes(loaded.written)
    assert "evaluation.solve_episodes" not in loaded.written  # smoke.yaml does not name it
    default = config_module.load(None, ["agent.learning_rate=1e-3"])
    assert default.written == {"agent.learning_rate": 1e-3}  # default.yaml's own keys are not the user's
    assert default.config.replay.sampling == "direct"
    assert config_module.load_config(None, ["agent.learning_rate=1e-3"]) == default.config
    text = config_module.dump_written(loaded.written)
    assert yaml.safe_load(text)["replay"] == {"backend": "tf_uniform", "capacity": 2000, "sampling": "direct",
                                              "num_parallel_calls": 3, "prefetch": 3}
    assert config_module.load_config(write(tmp_path, text)) == loaded.config  # a config file that gives the same run


def test_the_default_config_on_an_env_with_a_preset_says_so(tmp_path, monkeypatch, capsys):
    """`--env Acrobot-v1` alone trains with CartPole's hyperparameters: one line on stderr names the preset."""
    from dqn_cartpole.training import run

    note = ("note: Acrobot-v1 has a preset tuned for it: add --config acrobot (configs/acrobot.yaml) to use it; "
            "without it, configs/default.yaml's hyperparameters, tuned for CartPole-v1, are used\n")
    assert main(["config", "--plain", "--env", "Acrobot-v1"]) == 0
    out, err = capsys.readouterr()
    assert err == note and yaml.safe_load(out)["env"]["id"] == "Acrobot-v1"  # stdout is still a config file
    for args in (["--config", "acrobot"], ["--env", "CartPole-v0"], ["--config", "smoke", "--env", "Acrobot-v1"]):
        assert main(["config", "--plain", *args]) == 0
        assert capsys.readouterr().err == ""  # a preset, an env without one (the tutorial is none), another file
    monkeypatch.setattr(run, "run_new", lambda config, run_dir, *_: 0)  # what train does before it trains
    assert main(["train", "--env", "Acrobot-v1", "--output-dir", str(tmp_path / "run")]) == 0
    assert capsys.readouterr().err == note
    written = yaml.safe_load((tmp_path / "run" / "config.written.yaml").read_text())
    assert written == {"env": {"id": "Acrobot-v1"}}  # what the user wrote: the flag, not default.yaml's keys
