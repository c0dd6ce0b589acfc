"""Which config keys a run changed from the default it started from: the report's highlighted keys.

Changed means written (config.written.yaml: the run's --config file and flags) with another value than the default;
for a run folder without that file, a resolved value that differs from the default, where an `auto` or a null that
resolved to what it stands for is no difference.
"""

from __future__ import annotations

from dqn_cartpole.config import C51_DEFAULTS, Config, ReplayConfig, sampling_mode, to_dict


def written_differs(run: dict, default: dict, dotted: str) -> bool:
    """Whether a run's resolved value of `section.key` differs from the default the user started from.

    An `auto` default resolved to what `auto` means for this run is not a difference: the user did not
    write it (`replay.sampling: auto` becomes `direct` for the uniform buffers).
    """
    section, key = dotted.split(".", 1)
    value, default_value = run.get(section, {}).get(key), default.get(section, {}).get(key)
    c51 = run.get("agent", {}).get("kind") == "c51"
    if section == "agent" and key in C51_DEFAULTS and default_value is None and c51:
        default_value = C51_DEFAULTS[key]  # null resolved to what it means for C51
    if (section, key) == ("replay", "sampling") and default_value == "auto":
        default_value = sampling_mode(ReplayConfig(backend=run.get("replay", {}).get("backend", "tf_uniform")))
    return value != default_value


def changes(written: dict) -> list[str]:
    """The keys of `written` (section.key -> value, as the user wrote it) whose value is not the default: what the
    user changed. An `auto` a run resolved is no change, and neither is a default written out."""
    defaults = {f"{section}.{key}": value for section, keys in to_dict(Config()).items()
                for key, value in keys.items()}
    return [dotted for dotted, value in written.items() if dotted in defaults and value != defaults[dotted]]


class _NotRead:
    """The value of a key a run does not read: shown as `not read`, never equal to a value a config can hold."""

    def __repr__(self) -> str:
        return "not read"


NOT_READ = _NotRead()  # a key the run's agent, network or loop does not read (`config.applies`)


def acting_values(config: dict, flat: dict, distributed: bool) -> dict:
    """`flat` (section.key -> value of the run's resolved `config`) with each key the run does not read (as
    `config.applies` says: the C51 keys of a DQN run, noisy_sigma0 without noisy layers) as NOT_READ."""
    from dqn_cartpole.config import applies

    return {dotted: value if applies(config, dotted, distributed) else NOT_READ for dotted, value in flat.items()}


def differing(runs: list[dict]) -> list[str]:
    """The keys whose values differ among the runs that read them (`acting_values` of each run). A key that only
    some runs read is no difference of its own: the key that decides it (agent.kind, network.noisy) is."""
    keys = sorted({dotted for values in runs for dotted in values})
    return [dotted for dotted in keys
            if len({repr(values.get(dotted)) for values in runs if values.get(dotted) is not NOT_READ}) > 1]


SIGNIFICANT = 4


def show_values(values: list) -> list[str]:
    """Each value as YAML writes it (null, true, [64, 64]); floats at 4 significant digits (0.005081), or at more
    where two different values would read the same; NOT_READ as it is."""
    distinct = len({repr(value) for value in values})
    for digits in range(SIGNIFICANT, 18):
        shown = [show_value(value, digits) for value in values]
        if len(set(shown)) == distinct:
            return shown
    return [show_value(value, 17) for value in values]


def show_value(value, digits: int = SIGNIFICANT) -> str:
    """One value as YAML writes it, a float at `digits` significant digits."""
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(show_value(v, digits) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        text = f"{value:.{digits}g}"
        return text if any(c in text for c in ".einf") else f"{text}.0"  # 1.0 stays a float, as YAML writes it
    return str(value)
