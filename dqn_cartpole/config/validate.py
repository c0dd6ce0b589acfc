"""The config's constraints: each value's range and choices, the keys of another agent kind, the constraints between
keys and the env id; every problem is one line naming the key and where its value came from."""

from __future__ import annotations

from typing import Any, Callable, Optional

import yaml

from dqn_cartpole.config.coerce import suggest
from dqn_cartpole.config.resolve import c51_values
from dqn_cartpole.config.schema import CHOICES, KIND_KEYS, MAX_SEED, AgentConfig, Config
from dqn_cartpole.errors import ConfigError


def validate(config: Config, source: str, origins: Optional[dict] = None) -> None:
    """Checks ranges and cross-field constraints; raises ConfigError naming the key and where its value came from:
    `origins[key]` (the file, `--set ITEM`, a shortcut's flag; see `Loaded.origins`), else `source`."""

    def fail(key: str, problem: str, *others: str) -> None:
        raise ConfigError(f"{blame(origins, source, key, *others)}: {key}: {problem}")

    for (section, key), options in CHOICES.items():
        value = getattr(getattr(config, section), key)
        if value not in options:
            fail(f"{section}.{key}", f"must be one of {', '.join(options)}, got {value!r}{suggest(value, options)}")
    _validate_kind(config.agent, fail)
    positive = {
        "env": ["num_envs", "max_episode_steps"],
        "agent": ["epsilon_decay_steps", "target_update_period", "n_step", "gradient_clipping", "learning_rate"],
        "replay": ["capacity", "num_parallel_calls", "prefetch", "reverb_max_cycle_length",
                   "reverb_dataset_buffer_size"],
        "training": ["num_iterations", "collect_steps_per_iteration", "train_steps_per_iteration",
                     "batch_size", "log_interval", "checkpoint_interval", "keep_checkpoints"],
        "evaluation": ["eval_interval", "num_eval_episodes", "solve_episodes"],
        "distributed": ["weight_refresh_steps", "weight_push_interval", "server_checkpoint_s", "connect_timeout_s",
                        "rate_limiter_timeout_ms", "final_evaluation_timeout_s"],
        "video": ["num_episodes", "random_episodes", "fps"],
    }
    for section, keys in positive.items():
        for key in keys:
            value = getattr(getattr(config, section), key)
            if value is not None and not value > 0:
                fail(f"{section}.{key}", f"must be positive, got {value}")
    if not 0 <= config.training.seed <= MAX_SEED:  # NumPy takes seeds below 2^32, and the offsets are added to it
        fail("training.seed", f"must be in [0, {MAX_SEED}], got {config.training.seed}")
    if not config.evaluation.solve_margin >= 0:
        fail("evaluation.solve_margin", f"must be 0 or more, got {config.evaluation.solve_margin}")
    for key in ("gamma", "epsilon_start", "epsilon_end"):
        value = getattr(config.agent, key)
        if not 0.0 <= value <= 1.0:
            fail(f"agent.{key}", f"must be in [0, 1], got {value}")
    if not 0.0 < config.agent.target_update_tau <= 1.0:
        fail("agent.target_update_tau", f"must be in (0, 1], got {config.agent.target_update_tau}")
    if not config.network.fc_layer_params or min(config.network.fc_layer_params) <= 0:
        fail("network.fc_layer_params",
             f"must be a non-empty list of positive sizes, got {list(config.network.fc_layer_params)}")
    _validate_combinations(config, fail)
    validate_env_id(config.env.id, blame(origins, source, "env.id"))
    _check_solve_return(config, blame(origins, source, "evaluation.stop_when_solved", "evaluation.solve_return",
                                      "env.id"))


def blame(origins: Optional[dict], source: str, *keys: str) -> str:
    """Where the newest of `keys`' values came from (`origins`: section.key -> source, oldest first): the value
    that broke a constraint between keys is the one written last. `source` if none of them was written."""
    order = list(origins or {})
    given = [key for key in keys if key in order]
    return origins[max(given, key=order.index)] if given else source


def _validate_kind(agent: AgentConfig, fail: Callable[..., None]) -> None:
    """A key of another agent kind keeps its default (null for C51's); C51's support is at least 2 atoms, low to
    high."""
    defaults = AgentConfig()
    for key, kinds in KIND_KEYS.items():
        value = getattr(agent, key)
        if agent.kind not in kinds and value != getattr(defaults, key):
            fail(f"agent.{key}", f"applies to agent.kind {' or '.join(kinds)} only, not to kind {agent.kind}; "
                                 f"remove it or give it its default, {_plain_yaml(getattr(defaults, key))} (got "
                                 f"{_plain_yaml(value)})", "agent.kind")
    if agent.kind == "c51":
        atoms, low, high = c51_values(agent)
        if atoms < 2:
            fail("agent.num_atoms", f"must be at least 2, got {atoms}")
        if not low < high:
            fail("agent.max_q_value", f"must be above agent.min_q_value ({low:g}), got {high:g}", "agent.min_q_value")


def _plain_yaml(value: Any) -> str:
    """A value as YAML writes it inline: null, huber, 51."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _validate_combinations(config: Config, fail: Callable[..., None]) -> None:
    """The constraints between keys (each a one-line error naming the key to change; `fail`'s further keys are the
    others involved, so the error names where the newest of their values came from)."""
    if config.training.batch_size > config.replay.capacity:
        fail("training.batch_size",
             f"{config.training.batch_size} is larger than replay.capacity ({config.replay.capacity})",
             "replay.capacity")
    if config.replay.backend == "reverb" and config.replay.sampling == "direct":
        fail("replay.sampling", "Reverb is read through a tf.data dataset; use sampling: dataset (or auto) with "
                                "backend: reverb", "replay.backend")
    window = (config.agent.n_step + 1) * config.env.num_envs
    if config.training.initial_collect_steps < window:
        fail("training.initial_collect_steps",
             f"must be at least (agent.n_step + 1) x env.num_envs = {window}, so the first sample finds a whole "
             f"{config.agent.n_step + 1}-step window in every env's stream; "
             f"got {config.training.initial_collect_steps}", "agent.n_step", "env.num_envs")
    if config.replay.reverb_port is not None and not 0 < config.replay.reverb_port < 65536:
        fail("replay.reverb_port", f"must be a port in 1..65535, got {config.replay.reverb_port}")
    if config.replay.reverb_num_workers_per_iterator == 0 or config.replay.reverb_num_workers_per_iterator < -1:
        fail("replay.reverb_num_workers_per_iterator",
             f"must be -1 (Reverb picks) or positive, got {config.replay.reverb_num_workers_per_iterator}")
    if config.env.num_envs > 1 and config.training.collect_steps_per_iteration % config.env.num_envs:
        fail("training.collect_steps_per_iteration",
             f"must be a multiple of env.num_envs ({config.env.num_envs}), "
             f"got {config.training.collect_steps_per_iteration}", "env.num_envs")
    if config.output.run_name is not None and (not config.output.run_name or "/" in config.output.run_name):
        fail("output.run_name", f"must be a plain folder name, got {config.output.run_name!r}")
    spi, tolerance = config.distributed.samples_per_insert, config.distributed.samples_per_insert_tolerance
    if spi is not None and not spi > 0:
        fail("distributed.samples_per_insert", f"must be positive or null, got {spi}")
    if spi is not None and tolerance < max(1.0, spi):
        # Reverb's SampleToInsertRatio needs max_diff - min_diff = 2 x tolerance >= 2 x max(1, spi).
        fail("distributed.samples_per_insert_tolerance",
             f"must be at least max(1, distributed.samples_per_insert) = {max(1.0, spi):g} (Reverb needs the "
             f"ratio's error buffer to span 2 x that), got {tolerance:g}", "distributed.samples_per_insert")
    if config.replay.backend == "py_uniform" and config.env.num_envs != 1:
        fail("replay.backend", f"py_uniform stores a single stream of steps; set env.num_envs: 1 (got "
                               f"{config.env.num_envs}) or use replay.backend: tf_uniform", "env.num_envs")


def _check_solve_return(config: Config, source: str) -> None:
    """A run that stops when solved needs a target: evaluation.solve_return, else the env's registered threshold."""
    from dqn_cartpole.env_ids import reward_threshold  # gymnasium only: no TensorFlow yet

    evaluation = config.evaluation
    if evaluation.stop_when_solved and evaluation.solve_return is None and reward_threshold(config.env.id) is None:
        raise ConfigError(f"{source}: evaluation.solve_return: {config.env.id} registers no reward threshold, so "
                          f"give the average return that counts as solved (or set evaluation.stop_when_solved: "
                          f"false)")


def validate_env_id(env_id: str, source: str) -> None:
    from dqn_cartpole.env_ids import EnvSpecError, check_env_id  # gymnasium only: no TensorFlow yet

    try:
        check_env_id(env_id)
    except EnvSpecError as exc:
        raise ConfigError(f"{source}: env.id: {exc}") from None
