"""`agent.kind` and each kind's own keys, in process: a key of another kind is one line naming it; the deprecated
`agent.double_dqn` still loads, as the kind it means, with a one-line note."""

from __future__ import annotations

import pytest

from dqn_cartpole.config import C51_DEFAULTS, Config, load, load_config, read_resolved, to_dict
from dqn_cartpole.report.changed_keys import written_differs
from dqn_cartpole.errors import ConfigError


def write(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("overrides, problem", [
    (["agent.kind=dqn", "agent.num_atoms=11"], "agent.num_atoms: applies to agent.kind c51 only, not to kind dqn"),
    (["agent.min_q_value=-1"], "agent.min_q_value: applies to agent.kind c51 only, not to kind double_dqn"),
    (["agent.kind=c51", "agent.td_loss=squared"], "agent.td_loss: applies to agent.kind dqn or double_dqn only"),
    (["agent.kind=c51", "agent.num_atoms=1"], "agent.num_atoms: must be at least 2, got 1"),
    (["agent.kind=c51", "agent.min_q_value=5", "agent.max_q_value=5"], "agent.max_q_value: must be above"),
    (["agent.kind=c51", "agent.max_q_value=-20"], "agent.max_q_value: must be above agent.min_q_value (-10)"),
    (["agent.kind=c52"], "agent.kind: must be one of dqn, double_dqn, c51, got 'c52' (did you mean 'c51'?)"),
])
def test_a_key_that_does_not_fit_the_kind_is_one_line_naming_it(overrides, problem):
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    message = str(caught.value)
    assert problem in message and "\n" not in message
    # The value written last is the one to change; the deprecated key is the one to remove.
    assert message.startswith(f"--set {overrides[-1]}: ")


def test_c51_resolves_its_nulls_and_keeps_what_is_written():
    config = load_config(None, ["agent.kind=c51", "agent.num_atoms=21"])
    assert (config.agent.num_atoms, config.agent.min_q_value, config.agent.max_q_value) == \
        (21, C51_DEFAULTS["min_q_value"], C51_DEFAULTS["max_q_value"])
    assert load_config().agent.num_atoms is None  # a DQN run's config.yaml says null: it reloads as it is
    # The report's "changed" keys: a null C51 resolved to what it means is no change; a written 21 is one.
    run, default = to_dict(config), to_dict(Config())
    assert not written_differs(run, default, "agent.min_q_value")
    assert written_differs(run, default, "agent.num_atoms") and written_differs(run, default, "agent.kind")


@pytest.mark.parametrize("flag, kind", [("true", "double_dqn"), ("false", "dqn")])
def test_an_old_config_with_double_dqn_loads_as_its_kind_with_one_note(tmp_path, capfd, flag, kind):
    path = write(tmp_path, f"agent:\n  double_dqn: {flag}\n")
    loaded = load(path)
    assert loaded.config.agent.kind == kind and loaded.config.agent.double_dqn is None
    assert read_resolved(path)["agent"]["kind"] == kind  # the report reads an old run's config.yaml the same way
    load(path)  # loaded again (a child, a resume): no second note
    err = capfd.readouterr().err.strip().splitlines()
    assert err == [f"note: {path}: agent.double_dqn: {flag} is deprecated; it is read as agent.kind: {kind}, "
                   f"which replaces it"]
    # The same kind written beside it agrees: loads, with the note.
    assert load_config(write(tmp_path, f"agent:\n  kind: {kind}\n  double_dqn: {flag}\n")).agent.kind == kind


def test_double_dqn_and_a_kind_the_newest_decides_one_file_must_agree(tmp_path, capfd):
    old = write(tmp_path, "agent:\n  double_dqn: true\n")
    assert load_config(old, ["agent.kind=c51"]).agent.kind == "c51"  # an old file, a new --set
    assert load_config("tutorial", ["agent.double_dqn=true"]).agent.kind == "double_dqn"  # kind: dqn, then the flag
    err = capfd.readouterr().err
    assert "agent.double_dqn: true is deprecated and ignored: agent.kind: c51, given after it, decides" in err
    with pytest.raises(ConfigError, match=r"c.yaml: agent.double_dqn: false means agent.kind dqn, but agent.kind is "
                                          r"c51; remove agent.double_dqn"):
        load_config(write(tmp_path, "agent:\n  kind: c51\n  double_dqn: false\n"))
