"""The config's documentation, generated from its fields: the `config` command's output and the reference page.

Everything here is read off the dataclasses in `dqn_cartpole.config` (type, default from
configs/default.yaml, one-line description, when the key applies), so the printed reference and
docs/configuration-reference.md cannot drift from the code: a test checks the page is current.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Optional

import yaml

from dqn_cartpole import config as cfg

REFERENCE_PAGE = "docs/configuration-reference.md"
REGENERATE = "python -m dqn_cartpole config --reference > docs/configuration-reference.md"


@dataclass(frozen=True)
class KeyDoc:
    """One config key, as the reference shows it."""

    key: str  # section.key
    type: str
    default: Any
    doc: str
    when: str  # when it applies ("" = always)


def type_name(hint: Any, choices: Optional[tuple] = None) -> str:
    """A field's type in words: `int`, `float or null`, `list of int`, `one of a, b`."""
    optional = typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint)
    if optional:
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    name = {bool: "bool", int: "int", float: "float", str: "str", tuple: "list of int"}.get(hint) or \
        ("list of str" if hint == tuple[str, ...] else str(hint))
    if choices:
        name = "one of " + ", ".join(choices)
    return f"{name} or null" if optional else name


def keys() -> list[KeyDoc]:
    """Every config key in schema order, with its type, default, description and when it applies."""
    found = []
    for section, cls in cfg.SECTIONS.items():
        hints = typing.get_type_hints(cls)
        when_section = "the roles run as processes" if section in cfg.ROLES_ONLY_SECTIONS else ""
        for spec in dataclasses.fields(cls):
            kind = type_name(hints[spec.name], spec.metadata["choices"])
            found.append(KeyDoc(f"{section}.{spec.name}", kind, _plain(spec.default), spec.metadata["doc"],
                                spec.metadata["when"] or when_section))
    return found


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def show(value: Any) -> str:
    """A value as YAML writes it inline: null, true, [64, 64], 0.002."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").removesuffix("...").strip()


def annotated_yaml(config: cfg.Config, written: Optional[dict] = None) -> str:
    """`config` as YAML (loadable with --config) with each key's type, description and default in a comment
    above it. Keys the user changed say so: with `written` (section.key -> value, as the user wrote it: see
    `config.Loaded`), the keys written with a value other than the default, so an `auto` resolved for this config
    is no change; without it, the keys whose value is not the default."""
    docs = {k.key: k for k in keys()}
    data = cfg.to_dict(config)
    lines = ["# Resolved config: every key, its type, what it does and its default (configs/default.yaml).",
             "# Keys this config changes are marked CHANGED. Save it and train with --config FILE."]
    for section, values in data.items():
        lines.append(f"{section}:  # {cfg.SECTIONS[section].__doc__.splitlines()[0]}")
        for key, value in values.items():
            doc = docs[f"{section}.{key}"]
            given = value if written is None else written.get(doc.key, doc.default)
            mark = f" CHANGED from {show(doc.default)}" if given != doc.default else ""
            if given != value:
                mark += f" {show(given)} resolves to {show(value)} for this config."
            when = f" Applies when {doc.when}." if doc.when else ""
            lines.append(f"  # {doc.type}: {doc.doc}.{when}{mark}")
            lines.append(f"  {key}: {show(value)}")
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    """docs/configuration-reference.md: one table per section."""
    lines = ["# Configuration reference", "",
             f"Generated from the config's fields (`dqn_cartpole/config/schema.py`) by `{REGENERATE}`; a test checks it "
             "is current. Defaults are `configs/default.yaml`'s: a config file or `--set` changes only the keys it "
             "names. `python -m dqn_cartpole config [--config C.yaml] [--set ...]` prints the resolved config with "
             "these descriptions.", ""]
    by_section: dict[str, list[KeyDoc]] = {}
    for doc in keys():
        by_section.setdefault(doc.key.split(".")[0], []).append(doc)
    for section, docs in by_section.items():
        lines += [f"## `{section}`", "", cfg.SECTIONS[section].__doc__.replace("\n    ", " ").strip(), "",
                  "| key | type | default | description |", "| --- | --- | --- | --- |"]
        for doc in docs:
            when = f" *Applies when {doc.when}.*" if doc.when else ""
            description = f"{doc.doc}.{when}".replace("|", "\\|")
            lines.append(f"| `{doc.key}` | {doc.type} | `{show(doc.default)}` | {description} |")
        lines.append("")
    return "\n".join(lines)
