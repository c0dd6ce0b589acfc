"""How a config field is declared: its one-line description, when it applies, and its default, which comes from
configs/default.yaml (the one place every default is written)."""

from __future__ import annotations

import functools
import typing
from dataclasses import field
from typing import Any, Callable, Optional

from dqn_cartpole.config import files
from dqn_cartpole.config.coerce import coerce
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


def key(doc: str, applies: Optional[Callable[[dict], bool]] = None, when: str = "") -> Any:
    """A dataclass field with a one-line description; its default comes from configs/default.yaml.

    `applies(config_dict)` says whether the key matters for a run with that (resolved) config, and
    `when` says the same in words; a key without it always applies.
    """
    return field(metadata={"doc": doc, "applies": applies, "when": when})
