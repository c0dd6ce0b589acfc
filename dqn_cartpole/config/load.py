"""Loading a config: YAML file -> `--set section.key=value` overrides -> one frozen, checked `Config`.

`load` also keeps what the user wrote (the keys the file and the flags named, before `auto` resolves: what `config`
and the report call changed) and where each value came from, so an error names the file, the `--set` or the
shortcut that gave it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from dataclasses import dataclass
from typing import Any, Optional

import yaml

from dqn_cartpole.config import files
from dqn_cartpole.config.coerce import coerce, describe, plain, suggest
from dqn_cartpole.config.output import to_dict, value_of
from dqn_cartpole.config.resolve import resolve_auto
from dqn_cartpole.config.schema import SECTIONS, Config
from dqn_cartpole.config.validate import validate
from dqn_cartpole.errors import ConfigError


@dataclass(frozen=True)
class Flagged:
    """A `section.key=value` override given by a flag other than `--set` (a shortcut such as `--env ID`): an error
    about its value names `flag` (`--env Pendulum-v1: ...`), where the user wrote it."""

    item: str
    flag: str


Override = typing.Union[str, Flagged]


@dataclass(frozen=True)
class Loaded:
    """A loaded config and what the user wrote for it (`load`)."""

    config: Config  # checked, `auto` resolved: what runs
    written: dict  # section.key -> value, for every key the --config file (unless it is the default config) or a
    #                flag named, as written (`auto` stays `auto`)
    origins: dict  # section.key -> where a value came from: the file, `--set ITEM` or e.g. `--env ID`; in the
    #                order they were applied (a key given again moves to the end)


def load(path: Optional[str] = None, overrides: typing.Sequence[Override] = ()) -> Loaded:
    """`load_config`, and what the user wrote: the keys the file and each override named (`Loaded`).

    An override is `section.key=value` (from `--set`) or a `Flagged` one (a shortcut); an error about a value
    names where it came from: the file, `--set ITEM` or the shortcut's flag.
    """
    source, located = path or files.DEFAULT_CONFIG, files.locate_config(path)
    raw = files.read_yaml(located)
    config = build(raw, source)
    named = [f"{section}.{key}" for section, keys in raw.items() for key in (keys or {})]
    origins = dict.fromkeys(named, source)
    is_default = os.path.realpath(located) == os.path.realpath(files.default_config_path())
    # default.yaml's keys are the defaults: a user who named no other file wrote none of them
    written = {} if is_default else {dotted: plain(value_of(config, dotted)) for dotted in named}
    for override in overrides:
        section, key, value, where = _parse(override)
        config = _replace_key(config, section, key, value)
        dotted = f"{section}.{key}"
        origins.pop(dotted, None)  # re-inserted last: the newest source of a value comes last
        written[dotted], origins[dotted] = plain(value), where
    config, note = migrate_double_dqn(config, origins)
    validate(config, source, origins)
    for line in (note, noisy_epsilon_note(config, written)):
        if line:
            _note_once(line)
    return Loaded(resolve_auto(config), written, origins)


def noisy_epsilon_note(config: Config, written: dict) -> Optional[str]:
    """With network.noisy the layers explore and epsilon is 0: one line naming the epsilon keys the user set
    anyway (None if none)."""
    given = [key for key in written if key.startswith("agent.epsilon_")]
    if not config.network.noisy or not given:
        return None
    return (f"note: network.noisy: the noisy layers explore, so the collect policy's epsilon is 0 and "
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} ignored")


def load_config(path: Optional[str] = None, overrides: typing.Sequence[Override] = ()) -> Config:
    """Reads `path` (see `locate_config`; None: configs/default.yaml), applies `section.key=value` overrides,
    checks it all. Keys the file does not name keep their defaults (configs/default.yaml's)."""
    return load(path, overrides).config


def migrate_double_dqn(config: Config, origins: dict) -> tuple[Config, Optional[str]]:
    """An old config's `agent.double_dqn: true/false` as the `agent.kind` it means, and a one-line note saying so
    (None when the config has no double_dqn). `origins` (section.key -> where its value came from, oldest first):
    an agent.kind given after it (a `--set` on an old file) decides instead; one source giving both must agree."""
    agent = config.agent
    if agent.double_dqn is None:
        return config, None
    kind, where = ("double_dqn" if agent.double_dqn else "dqn"), origins.get("agent.double_dqn", "config")
    flag = f"agent.double_dqn: {str(agent.double_dqn).lower()}"
    order = list(origins)
    if "agent.kind" in origins and agent.kind != kind:
        if origins["agent.kind"] == where:
            raise ConfigError(f"{where}: agent.double_dqn: {str(agent.double_dqn).lower()} means agent.kind {kind}, "
                              f"but agent.kind is {agent.kind}; remove agent.double_dqn (deprecated: agent.kind "
                              f"replaces it)")
        if order.index("agent.kind") > order.index("agent.double_dqn"):
            note = f"note: {where}: {flag} is deprecated and ignored: agent.kind: {agent.kind}, given after it, decides"
            return dataclasses.replace(config, agent=dataclasses.replace(agent, double_dqn=None)), note
    note = f"note: {where}: {flag} is deprecated; it is read as agent.kind: {kind}, which replaces it"
    return dataclasses.replace(config, agent=dataclasses.replace(agent, kind=kind, double_dqn=None)), note


_NOTED: set = set()


def _note_once(note: str) -> None:
    """Prints a note on the process's stderr once (a config is loaded more than once). The real stderr: the commands
    load their config inside `redirect_stderr`, which hides gymnasium's import-time notices."""
    if note not in _NOTED:
        _NOTED.add(note)
        print(note, file=sys.__stderr__ or sys.stderr, flush=True)


def config_from_dict(raw: dict, source: str) -> Config:
    """A config held as data (a population's manifest keeps its whole config), checked as `load_config` checks a
    file's."""
    config, _ = migrate_double_dqn(build(raw, source), {})
    validate(config, source)
    return resolve_auto(config)


def read_resolved(path: str) -> dict:
    """A config file with every default filled in and its types checked, as plain data.

    Unlike `load_config` it skips the env-id check, which imports TF-Agents: the report uses it.
    """
    raw = files.read_yaml(files.locate_config(path))
    config, _ = migrate_double_dqn(build(raw, path), {f"agent.{key}": path for key in (raw.get("agent") or {})})
    return to_dict(config)


# ---------------------------------------------------------------------------- overrides


def override_values(overrides: typing.Sequence[Override]) -> dict:
    """section.key -> value of each override, as written (a later one wins)."""
    return {f"{section}.{key}": plain(value) for section, key, value, _ in map(_parse, overrides)}


def apply_override(config: Config, item: str, where: Optional[str] = None) -> Config:
    """Applies one `section.key=value` override; the value is parsed as YAML. Errors name `where` (default
    `--set ITEM`)."""
    return _replace_key(config, *parse_override(item, where))


def parse_override(item: str, where: Optional[str] = None) -> tuple[str, str, Any]:
    """(section, key, value) of a `section.key=value` override, its value parsed as YAML and type-checked; errors
    name `where` (default `--set ITEM`)."""
    where = where or f"--set {item}"
    if "=" not in item:
        raise ConfigError(f"{where}: expected section.key=value")
    dotted, text = item.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"{where}: expected section.key=value, with one dot in the key")
    section, key = parts
    if section not in SECTIONS:
        raise ConfigError(f"{where}: unknown section '{section}'{suggest(section, SECTIONS)}")
    hints = typing.get_type_hints(SECTIONS[section])
    if key not in hints:
        everything = [f"{section}.{k}" for k in hints]
        raise ConfigError(f"{where}: unknown key '{section}.{key}'{suggest(f'{section}.{key}', everything)}")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: malformed value: {files.one_line(exc)}") from None
    return section, key, coerce(value, hints[key], f"{section}.{key}", where)


def override_source(override: Override) -> tuple[str, str]:
    """(the `section.key=value` item, where the user wrote it) of a `--set` item or a `Flagged` override."""
    return (override.item, override.flag) if isinstance(override, Flagged) else (override, f"--set {override}")


def _parse(override: Override) -> tuple[str, str, Any, str]:
    """(section, key, value, where the user wrote it) of a `--set` item or a `Flagged` override."""
    item, where = override_source(override)
    return (*parse_override(item, where), where)


def _replace_key(config: Config, section: str, key: str, value: Any) -> Config:
    new_section = dataclasses.replace(getattr(config, section), **{key: value})
    return dataclasses.replace(config, **{section: new_section})


# ---------------------------------------------------------------------------- a file's sections


def build(raw: dict, source: str) -> Config:
    """The `Config` a file's data gives: its keys type-checked, every other key its default."""
    sections = {}
    for name, value in raw.items():
        if name not in SECTIONS:
            raise ConfigError(f"{source}: unknown section '{name}'{suggest(str(name), SECTIONS)}")
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {name}: expected a mapping of keys, got {describe(value)}")
        sections[name] = _build_section(name, value, source)
    return Config(**sections)


def _build_section(section: str, raw: dict, source: str) -> Any:
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in raw.items():
        if key not in hints:
            everything = [f"{section}.{k}" for k in hints]
            raise ConfigError(f"{source}: unknown key '{section}.{key}'{suggest(f'{section}.{key}', everything)}")
        values[key] = coerce(value, hints[key], f"{section}.{key}", source)
    return cls(**values)
