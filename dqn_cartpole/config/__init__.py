"""Typed, frozen, documented configuration, loaded from YAML plus `--set` overrides.

Config flows one way: YAML file -> `--set section.key=value` overrides -> one frozen `Config`, checked before
anything is built. One module per concern:

- `schema`: the sections, one frozen dataclass each; every field declares its one-line description, when it
  applies and its constraints (`declare.key`); its default is configs/default.yaml's, the one source of defaults,
  so `Config()`, a config file that names only a few keys, and `train` without `--config` start from the same values.
- `files`: finding the shipped configs, search spaces and presets (from any folder, in a checkout or a wheel) and
  reading one YAML file; `coerce`: a value against its field's type.
- `load`: a file plus overrides into a `Loaded` (the config, what the user wrote, where each value came from);
  `validate`: the declared constraints and those between keys, each a one-line error naming where the value came
  from; `resolve`: what `auto` and null stand for; `output`: the config as data and YAML.

`dqn_cartpole.config_docs` turns the fields' descriptions into the `config` command's output and
docs/configuration-reference.md. Every public name is importable from `dqn_cartpole.config`.
"""

from dqn_cartpole.config.coerce import plain
from dqn_cartpole.config.files import (CONFIGS_PREFIX, DEFAULT_CONFIG, NOT_PRESETS, default_config_path,
                                       locate_config, locate_space, preset_for, read_yaml, shipped_config_names,
                                       shipped_configs_dir)
from dqn_cartpole.config.load import (Flagged, config_from_dict, Loaded, Override, apply_override, load, load_config, migrate_double_dqn,
                                      override_source, override_values, parse_override, read_resolved)
from dqn_cartpole.config.output import dump_written, dump_yaml, nested, to_dict, value_of
from dqn_cartpole.config.population import population_problem
from dqn_cartpole.config.resolve import c51_values, resolve_auto, sampling_mode
from dqn_cartpole.config.schema import (AGENT_KINDS, C51_DEFAULTS, MAX_SEED, ROLES_ONLY_SECTIONS, SECTIONS,
                                        AgentConfig, CollectionConfig, Config, DistributedConfig, EnvConfig,
                                        EvaluationConfig, NetworkConfig, OutputConfig, ReplayConfig, TrainingConfig,
                                        VideoConfig, applies, fields)
from dqn_cartpole.config.validate import (blame, check_prioritized_across_processes, register_agent_kind, validate,
                                         validate_env_id)

__all__ = [
    "config_from_dict",
    "AGENT_KINDS", "C51_DEFAULTS", "CONFIGS_PREFIX", "DEFAULT_CONFIG", "MAX_SEED", "NOT_PRESETS",
    "ROLES_ONLY_SECTIONS", "SECTIONS", "AgentConfig", "CollectionConfig", "Config", "DistributedConfig", "EnvConfig",
    "EvaluationConfig", "Flagged", "Loaded", "NetworkConfig", "Override", "OutputConfig", "ReplayConfig", "TrainingConfig",
    "VideoConfig", "applies", "apply_override", "blame", "c51_values", "check_prioritized_across_processes",
    "default_config_path", "dump_written",
    "dump_yaml", "fields", "load", "load_config", "locate_config", "locate_space", "migrate_double_dqn", "nested",
    "override_source", "override_values", "parse_override", "plain", "preset_for", "read_resolved", "read_yaml", "register_agent_kind",
    "population_problem", "resolve_auto", "sampling_mode", "shipped_config_names", "shipped_configs_dir", "to_dict", "validate",
    "validate_env_id", "value_of",
]
