"""The search space of `tune`: one YAML entry per config key.

    agent.learning_rate: {low: 3e-4, high: 3e-3, log: true}   # a float field: suggest_float
    agent.target_update_period: {low: 20, high: 200}          # an int field: suggest_int
    agent.n_step: {choices: [1, 2, 3]}                        # any field: suggest_categorical
    network.fc_layer_params: {choices: [[64, 64], [100, 50]]}

Whether a range is int or float comes from the config field's type. Keys are checked against the
config schema (an unknown key is an error that suggests the nearest name), and every bound and
choice is checked by loading the config with it, so a trial never starts with a value the
trainer would refuse.
"""

from __future__ import annotations

import difflib
import os
import typing
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import yaml

from dqn_cartpole.errors import UserError

FORBIDDEN = ("training.seed", "output.")  # tuning the seed fits noise; output keys only move folders


@dataclass(frozen=True)
class Param:
    """One dimension of the search space."""

    key: str  # section.key
    kind: str  # "int", "float" or "choice"
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    choices: tuple = ()

    def values_to_check(self) -> list:
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]


def field_type(dotted: str) -> Optional[type]:
    """The Python type of config field `section.key` (Optional[X] -> X), or None if there is no such field."""
    from dqn_cartpole.config import SECTIONS

    section, _, key = dotted.partition(".")
    if section not in SECTIONS:
        return None
    hint = typing.get_type_hints(SECTIONS[section]).get(key)
    if typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def all_keys() -> list[str]:
    from dqn_cartpole.config import SECTIONS

    return [f"{s}.{k}" for s, cls in SECTIONS.items() for k in typing.get_type_hints(cls)]


def load_space(path: str) -> list[Param]:
    """Reads and checks SPACE.yaml; raises UserError (one line) naming the first problem."""
    if not os.path.isfile(path):
        raise UserError(f"--space {path}: no such file")
    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UserError(f"--space {path}: cannot read: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict) or not raw:
        raise UserError(f"--space {path}: expected a mapping of section.key: {{low, high}} or {{choices}} entries")
    return [parse_param(f"{path}: {key}", str(key), entry) for key, entry in raw.items()]


def parse_param(where: str, key: str, entry: Any) -> Param:
    hint = field_type(key)
    if hint is None:
        match = difflib.get_close_matches(key, all_keys(), n=1, cutoff=0.5)
        raise UserError(f"{where}: unknown config key{f' (did you mean {match[0]!r}?)' if match else ''}")
    if key.startswith(FORBIDDEN) or key == FORBIDDEN[0]:
        raise UserError(f"{where}: cannot be tuned (seed and output keys are fixed per study)")
    if not isinstance(entry, dict):
        raise UserError(f"{where}: expected {{low: ..., high: ...}} or {{choices: [...]}}")
    unknown = set(entry) - {"low", "high", "log", "choices"}
    if unknown:
        raise UserError(f"{where}: unknown field {sorted(unknown)[0]!r} (use low, high, log or choices)")
    if "choices" in entry:
        choices = entry["choices"]
        if set(entry) != {"choices"} or not isinstance(choices, list) or not choices:
            raise UserError(f"{where}: choices must be a non-empty list, without low/high/log")
        return Param(key, "choice", choices=tuple(tuple(c) if isinstance(c, list) else c for c in choices))
    if hint not in (int, float):
        raise UserError(f"{where}: a {hint.__name__} field needs choices: [...], not a low/high range")
    try:
        low, high = float(entry["low"]), float(entry["high"])
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{where}: expected numbers low and high (or choices)") from None
    if hint is int and not (low.is_integer() and high.is_integer()):
        raise UserError(f"{where}: an integer field needs integer low and high")
    if not low < high:
        raise UserError(f"{where}: low must be below high, got {low:g} and {high:g}")
    log = entry.get("log", False)
    if not isinstance(log, bool):
        raise UserError(f"{where}: log must be true or false")
    if log and low <= 0:
        raise UserError(f"{where}: a log range needs low > 0")
    return Param(key, "int" if hint is int else "float", low, high, log)


def override(key: str, value: Any) -> str:
    """`section.key=value` as `--set` reads it."""
    text = yaml.safe_dump(list(value) if isinstance(value, tuple) else value, default_flow_style=True)
    return f"{key}={text.strip().removesuffix('...').strip()}"


def suggest(trial, params: Sequence[Param]) -> list[str]:
    """Asks the Optuna trial for a value of every parameter; returns them as `--set` overrides."""
    overrides = []
    for p in params:
        if p.kind == "int":
            value = trial.suggest_int(p.key, int(p.low), int(p.high), log=p.log)
        elif p.kind == "float":
            value = trial.suggest_float(p.key, p.low, p.high, log=p.log)
        else:  # Optuna stores categorical values as scalars: lists travel as their YAML text
            labels = [override(p.key, c).split("=", 1)[1] for c in p.choices]
            value = yaml.safe_load(trial.suggest_categorical(p.key, labels)) if any(
                isinstance(c, tuple) for c in p.choices) else trial.suggest_categorical(p.key, list(p.choices))
        overrides.append(override(p.key, value))
    return overrides
