"""How a config field is declared, all in one place: its one-line description, its choices or the constraint on its
value, when it applies (and whether another agent kind must leave it alone), and its default, which comes from
configs/default.yaml (the one place every default is written)."""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import yaml

from dqn_cartpole.config import files
from dqn_cartpole.config.coerce import coerce, plain
from dqn_cartpole.errors import ConfigError


@functools.lru_cache(maxsize=None)
def default_values() -> dict:
    """configs/default.yaml as data: `section -> key -> value`, read once."""
    return files.read_yaml(files.default_config_path())


def section_defaults(section: str) -> Callable[[type], type]:
    """Class decorator: sets each field's default from configs/default.yaml's `section` (before @dataclass).

    A key that default.yaml lacks, or one the schema does not know, is an error naming the file:
    it is the one place every default is written.
    """

    def apply(cls: type) -> type:
        source = files.default_config_path()
        given = default_values().get(section) or {}
        hints = typing.get_type_hints(cls)
        unknown = sorted(set(given) - set(hints))
        if unknown:
            raise ConfigError(f"{source}: unknown key '{section}.{unknown[0]}'")
        for name, hint in hints.items():
            if name not in given:
                raise ConfigError(f"{source}: {section}.{name} is missing; {files.DEFAULT_CONFIG} gives every key's "
                                  f"default")
            spec = cls.__dict__[name]
            spec.default = coerce(given[name], hint, f"{section}.{name}", source)
        return cls

    return apply


@dataclass(frozen=True)
class Check:
    """A constraint on one key's value: `test(value)` holds for a valid one; else the error says the key `must be
    WORDS, got VALUE`. A null value (an optional key left out) is not checked."""

    test: Callable[[Any], bool]
    words: str
    show: Callable[[Any], str] = lambda value: f"{plain(value)}"

    def problem(self, value: Any) -> Optional[str]:
        """`must be ..., got ...`, or None when the value is valid (a NaN is not: every comparison with it fails)."""
        if value is None or self.test(value):
            return None
        return f"must be {self.words}, got {self.show(value)}"


def positive(words: str = "positive") -> Check:
    return Check(lambda value: value > 0, words)


def at_least(low: float, words: str = "") -> Check:
    return Check(lambda value: value >= low, words or f"at least {low}")


def between(low: float, high: float, low_open: bool = False) -> Check:
    """In [low, high], or (low, high] with `low_open`."""
    if low_open:
        return Check(lambda value: low < value <= high, f"in ({low}, {high}]")
    return Check(lambda value: low <= value <= high, f"in [{low}, {high}]")


@dataclass(frozen=True)
class When:
    """A key matters only when another key of its section (`key`) has one of `values`."""

    key: str
    values: tuple

    def holds(self, section: dict) -> bool:
        return section.get(self.key) in self.values

    def words(self) -> str:
        """`kind is dqn or double_dqn`, `enabled is true`."""
        return f"{self.key} is {' or '.join(show(value) for value in self.values)}"


def show(value: Any) -> str:
    """A value as YAML writes it inline: null, true, huber, 51."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def key(doc: str, *, choices: tuple = (), check: Optional[Check] = None, when: Optional[When] = None,
        kinds: tuple = ()) -> Any:
    """A config field, declared with everything about it; its default comes from configs/default.yaml.

    doc: its one-line description (the `config` command, docs/configuration-reference.md).
    choices: the values it may take (checked, and shown as its type).
    check: the constraint on its value (`positive()`, `between(0, 1)`, ...), checked when the config loads.
    when: the key matters only when another key of its section has one of some values (the report and `compare`
        leave it out otherwise; the reference says when it applies).
    kinds: an agent kind's own key: it applies to those `agent.kind`s only (`when`), and for any other kind it must
        keep its default (one line naming it otherwise); its `check` applies to those kinds only.
    """
    if kinds:
        when = When("kind", tuple(kinds))
    return field(metadata={"doc": doc, "choices": tuple(choices), "check": check, "condition": when,
                           "exclusive": bool(kinds), "when": when.words() if when else ""})
