"""Each key's constraints are declared on its field (`dqn_cartpole.config.declare.key`) and nowhere else: declaring
one there is all it takes for `load_config`, the `config` command and the reference to enforce and show it."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from dqn_cartpole import config_docs
from dqn_cartpole.cli.main import main
from dqn_cartpole.config import SECTIONS, applies, declare, load_config, to_dict
from dqn_cartpole.config.coerce import coerce
from dqn_cartpole.errors import ConfigError


def declare_again(monkeypatch, dotted: str, **declared) -> None:
    """Declares `section.key` anew, as a developer would edit its field: the same description, `declared` added."""
    section, name = dotted.split(".")
    spec = {f.name: f for f in dataclasses.fields(SECTIONS[section])}[name]
    monkeypatch.setattr(spec, "metadata", declare.key(spec.metadata["doc"], **declared).metadata)


def test_a_range_declared_on_a_field_is_enforced_with_the_standard_line(monkeypatch, tmp_path, capsys):
    declare_again(monkeypatch, "training.train_steps_per_iteration", check=declare.between(1, 8))
    assert load_config(None, ["training.train_steps_per_iteration=8"]).training.train_steps_per_iteration == 8
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["training.train_steps_per_iteration=9"])
    assert str(caught.value) == ("--set training.train_steps_per_iteration=9: training.train_steps_per_iteration: "
                                 "must be in [1, 8], got 9")
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  train_steps_per_iteration: 0\n")
    assert main(["config", "--config", str(path)]) == 2
    assert capsys.readouterr().err == (f"error: {path}: training.train_steps_per_iteration: must be in [1, 8], "
                                       f"got 0\n")


def test_choices_and_an_agent_kind_declared_on_a_field_are_enforced_and_documented(monkeypatch, capsys):
    declare_again(monkeypatch, "output.root", choices=("outputs", "runs"))
    declare_again(monkeypatch, "agent.gradient_clipping", check=declare.positive(), kinds=("c51",))
    assert main(["config", "--set", "output.root=output"]) == 2
    assert capsys.readouterr().err == ("error: --set output.root=output: output.root: must be one of outputs, runs, "
                                       "got 'output' (did you mean 'outputs'?)\n")
    with pytest.raises(ConfigError, match=r"^--set agent.gradient_clipping=5: agent.gradient_clipping: applies to "
                                          r"agent.kind c51 only, not to kind double_dqn; remove it or give it its "
                                          r"default, 10.0 \(got 5.0\)$"):
        load_config(None, ["agent.gradient_clipping=5"])
    with pytest.raises(ConfigError, match=r"^--set agent.gradient_clipping=-1: agent.gradient_clipping: must be "
                                          r"positive, got -1.0$"):  # its own kind checks its value
        load_config(None, ["agent.kind=c51", "agent.gradient_clipping=-1"])
    assert not applies(to_dict(load_config(None)), "agent.gradient_clipping")  # the report leaves it out
    docs = {doc.key: doc for doc in config_docs.keys()}
    assert docs["output.root"].type == "one of outputs, runs"
    assert docs["agent.gradient_clipping"].when == "kind is c51"


BAD_VALUES = (0, -1, -2, 2**40, [], "a/b", "", ["=no-name"])


def declared_checks() -> list[tuple[str, typing.Any, declare.Check]]:
    """Every field of the schema that declares a check, with a value of its type that the check refuses."""
    found = []
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for spec in dataclasses.fields(cls):
            check = spec.metadata["check"]
            if check is not None:
                bad = [v for v in BAD_VALUES if _fits(v, hints[spec.name]) and check.problem(_as(v, hints[spec.name]))]
                found.append((f"{section}.{spec.name}", bad[0] if bad else None, check))
    return found


def _fits(value, hint) -> bool:
    try:
        coerce(value, hint, "k", "s")
    except ConfigError:
        return False
    return True


def _as(value, hint):
    return coerce(value, hint, "k", "s")


@pytest.mark.parametrize("dotted, bad, check", declared_checks(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_declared_check_is_enforced_by_loading(dotted, bad, check):
    assert bad is not None, f"no value in {BAD_VALUES} breaks {dotted}'s check; add one"
    overrides = [f"{dotted}={bad!r}".replace("'", '"')]
    section, name = dotted.split(".")
    condition = {f.name: f for f in dataclasses.fields(SECTIONS[section])}[name].metadata["condition"]
    if condition is not None:  # e.g. a C51 key's check applies to kind c51
        overrides.insert(0, f"{section}.{condition.key}={str(condition.values[0]).lower()}")
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    assert str(caught.value).startswith(f"--set {overrides[-1]}: {dotted}: must be {check.words}, got ")
