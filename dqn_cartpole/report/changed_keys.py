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
