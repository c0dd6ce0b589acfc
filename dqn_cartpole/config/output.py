"""A config as data and as YAML: a run's config.yaml (what ran) and config.written.yaml (what the user wrote)."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from dqn_cartpole.config.coerce import plain
from dqn_cartpole.config.schema import SECTIONS, Config, fields


def to_dict(config: Config) -> dict:
    """The config as plain YAML-able data (tuples become lists)."""

    return {s: {k: plain(v) for k, v in dataclasses.asdict(getattr(config, s)).items()} for s in SECTIONS}


def value_of(config: Config, dotted: str) -> Any:
    """The value of `section.key` in `config`."""
    section, key = dotted.split(".", 1)
    return getattr(getattr(config, section), key)


def nested(written: dict) -> dict:
    """section.key -> value as `{section: {key: value}}`, in schema order: a config file's shape."""
    found: dict = {}
    for section in SECTIONS:
        for key in fields(section):
            if f"{section}.{key}" in written:
                found.setdefault(section, {})[key] = written[f"{section}.{key}"]
    return found


def dump_written(written: dict) -> str:
    """A run's config.written.yaml: the keys the user wrote (section.key -> value), as a config file."""
    header = ("# The keys written for this run (its --config file, unless the default, and its flags), as written:\n"
              "# `auto` stays auto. config.yaml holds what ran; report.html highlights the keys whose value here is\n"
              "# not the default.\n")
    found = nested(written)
    return header + (yaml.safe_dump(found, sort_keys=False, default_flow_style=None) if found else "{}\n")


def dump_yaml(config: Config) -> str:
    """The fully resolved config as YAML text, one section after another."""
    return yaml.safe_dump(to_dict(config), sort_keys=False, default_flow_style=None)
