"""Typed, frozen, documented configuration, loaded from YAML plus `--set` overrides.

Config flows one way: YAML file -> `--set section.key=value` overrides -> one frozen
`Config`, checked here before anything is built. Every field carries a one-line description
in its metadata; `describe()` prints them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from dqn_cartpole.errors import ConfigError


def _f(default: Any, doc: str) -> Any:
    """A dataclass field with a one-line description."""
    if isinstance(default, (list, dict, tuple)):
        return field(default_factory=lambda: default, metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class EnvConfig:
    """The gymnasium environment."""

    id: str = _f("CartPole-v1", "gymnasium env id; needs a Box observation and a Discrete action space")
    num_envs: int = _f(1, "copies of the env stepped together for collection (1 = the tutorial)")
    max_episode_steps: Optional[int] = _f(None, "override the env's time limit (null = the env's own)")


@dataclass(frozen=True)
class NetworkConfig:
    """The Q-network."""

    fc_layer_params: tuple = _f((100, 50), "units of each hidden Dense layer (ReLU, VarianceScaling init)")


@dataclass(frozen=True)
class AgentConfig:
    """The DQN agent."""

    double_dqn: bool = _f(False, "use Double DQN (DdqnAgent) instead of DqnAgent")
    learning_rate: float = _f(1e-3, "Adam learning rate")
    td_loss: str = _f("squared", "TD loss: 'squared' or 'huber'")
    gamma: float = _f(1.0, "discount factor, in [0, 1]")
    epsilon_start: float = _f(0.1, "epsilon of the epsilon-greedy collect policy at train step 0")
    epsilon_end: float = _f(0.1, "epsilon after epsilon_decay_steps train steps")
    epsilon_decay_steps: int = _f(1, "train steps over which epsilon falls linearly from start to end")
    target_update_period: int = _f(1, "train steps between target-network updates")
    target_update_tau: float = _f(1.0, "target update factor, in (0, 1]; 1 copies the weights")
    gradient_clipping: Optional[float] = _f(None, "clip gradients to this global norm (null = off)")
    n_step: int = _f(1, "n-step TD update; replay holds sequences of n_step + 1 steps")


@dataclass(frozen=True)
class ReplayConfig:
    """The replay buffer."""

    backend: str = _f("reverb", "'reverb' (embedded server, opens a port), 'tf_uniform' or 'py_uniform'")
    capacity: int = _f(100_000, "maximum transitions kept; the oldest are evicted first")
    sampling: str = _f("auto", "'dataset' (tf.data, parallel + prefetch), 'direct' (in program order, reproducible; "
                               "uniform buffers only) or 'auto' (direct for the uniform buffers, dataset for Reverb)")
    num_parallel_calls: int = _f(3, "parallel sampling calls in the tf.data pipeline")
    prefetch: int = _f(3, "batches the tf.data pipeline prepares ahead")
    reverb_port: Optional[int] = _f(None, "port of the embedded Reverb server (null = a free port)")
    reverb_max_cycle_length: int = _f(4, "Reverb streams read in parallel, each yielding whole batches (Acme's "
                                         "make_reverb_dataset; 4 was the fastest of 1-8 on 2 cores)")
    reverb_dataset_buffer_size: Optional[int] = _f(None, "samples in flight per Reverb stream (null = 2 x the batch)")
    reverb_num_workers_per_iterator: int = _f(-1, "threads sampling for each Reverb stream (-1 = Reverb picks)")


@dataclass(frozen=True)
class TrainingConfig:
    """The training loop."""

    seed: int = _f(0, "seeds Python, NumPy, TensorFlow and the environments")
    num_iterations: int = _f(20_000, "iterations; each collects, then trains")
    initial_collect_steps: int = _f(100, "env steps of a random policy that fill the buffer first")
    collect_steps_per_iteration: int = _f(1, "env steps collected per iteration, summed over envs")
    train_steps_per_iteration: int = _f(1, "gradient steps per iteration")
    batch_size: int = _f(64, "transitions per gradient step")
    log_interval: int = _f(200, "iterations between loss rows in the metrics")
    checkpoint_interval: int = _f(5000, "iterations between checkpoints (resume with: train --resume RUN_DIR)")
    keep_checkpoints: int = _f(3, "newest complete checkpoints kept in RUN_DIR/checkpoints; older ones are deleted")
    jit_compile: bool = _f(True, "compile each gradient step with XLA (faster on CPU; false for plain TF)")


@dataclass(frozen=True)
class CollectionConfig:
    """How the collect policy steps the envs."""

    driver: str = _f("compiled", "'compiled' (a TF driver inside the compiled loop, fastest) or 'py' (the tutorial's "
                                 "PyDriver + PyTFEagerPolicy in Python, then a compiled train step)")


@dataclass(frozen=True)
class DistributedConfig:
    """Roles as separate processes (train --topology local, replay-server, collect, learn)."""

    replay: str = _f("learner", "'learner': the learner keeps the replay in its own in-graph buffer (fast), fed through "
                                "a queue on the server; 'server': one shared replay table on the server (checkpointed "
                                "there, for several learners), which the learner samples over the network")
    weight_refresh_steps: int = _f(25, "env steps a collector takes between pulls of the learner's weights (about 1 ms "
                                       "each)")
    weight_push_interval: int = _f(25, "learner train steps between pushes of its weights to the variables table "
                                       "(a background thread pushes them while the learner trains)")
    server_checkpoint_s: Optional[float] = _f(None, "seconds between the replay server's own table checkpoints "
                                                    "(null = only when it stops and with each learner checkpoint; "
                                                    "a timer races a learner's checkpoint, which moves the newest)")
    connect_timeout_s: float = _f(10.0, "seconds a role waits for the replay server at start-up before it gives up")
    rate_limiter_timeout_ms: int = _f(60_000, "a learner's sample waits this long for data, then fails (no freeze)")
    final_evaluation_timeout_s: float = _f(120.0, "seconds a learner that trained all its iterations waits for the "
                                                  "evaluate-live role's evaluation of its final weights")
    samples_per_insert: Optional[float] = _f(None, "sampled items per inserted item (a batch of 64 counts 64). replay "
                                                   "learner: the learner reads exactly this (null = as one process: "
                                                   "batch_size x train_steps / collect_steps per iteration); server: "
                                                   "Reverb's SampleToInsertRatio (null = no ratio, MinSize(1))")
    samples_per_insert_tolerance: float = _f(1000.0, "how far (in sampled items) the ratio may drift before one side "
                                                     "waits; learner: the queue holds tolerance / samples_per_insert "
                                                     "items; server: prefetched samples count too")


@dataclass(frozen=True)
class EvaluationConfig:
    """Periodic greedy evaluation."""

    eval_interval: int = _f(1000, "iterations between evaluations")
    num_eval_episodes: int = _f(10, "greedy episodes per evaluation")
    stop_when_solved: bool = _f(False, "stop early once the greedy policy reaches solve_return")
    solve_return: Optional[float] = _f(None, "average return that counts as solved (null = the env's reward threshold)")
    solve_episodes: int = _f(100, "greedy episodes that must average solve_return to stop early")


@dataclass(frozen=True)
class VideoConfig:
    """The mp4s of the trained and the random agent."""

    enabled: bool = _f(True, "record videos at the end of training")
    num_episodes: int = _f(3, "episodes of the trained (greedy) agent in its video")
    random_episodes: int = _f(3, "episodes of the random agent in its video")
    fps: int = _f(50, "frames per second of the mp4")


@dataclass(frozen=True)
class OutputConfig:
    """Where the run's files go."""

    root: str = _f("outputs", "folder that holds one folder per run")
    run_name: Optional[str] = _f(None, "run folder name (null = <env>__s<seed>__<time>)")
    tensorboard: bool = _f(True, "write TensorBoard event files")


@dataclass(frozen=True)
class Config:
    """The whole configuration of a run."""

    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    collection: CollectionConfig = field(default_factory=CollectionConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    video: VideoConfig = field(default_factory=VideoConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


SECTIONS: dict[str, type] = typing.get_type_hints(Config)
CHOICES = {("agent", "td_loss"): ("squared", "huber"), ("replay", "backend"): ("reverb", "tf_uniform", "py_uniform"),
           ("replay", "sampling"): ("auto", "dataset", "direct"), ("collection", "driver"): ("compiled", "py"),
           ("distributed", "replay"): ("learner", "server")}


# ---------------------------------------------------------------------------- loading


def load_config(path: Optional[str] = None, overrides: typing.Sequence[str] = ()) -> Config:
    """Reads `path` (or the defaults), applies `section.key=value` overrides, checks it all."""
    source = path or "<defaults>"
    raw = _read_yaml(path) if path else {}
    config = _build(raw, source)
    for item in overrides:
        config = apply_override(config, item)
    validate(config, source)
    return resolve_auto(config)


def sampling_mode(replay: "ReplayConfig") -> str:
    """'direct' or 'dataset': `auto` reads Reverb through tf.data and the uniform buffers directly."""
    if replay.sampling != "auto":
        return replay.sampling
    return "dataset" if replay.backend == "reverb" else "direct"


def samples_per_insert(config: Config) -> Optional[float]:
    """The ratio a distributed run keeps: the configured one, or (replay on the learner) a single process's."""
    spi = config.distributed.samples_per_insert
    if spi is None and config.distributed.replay == "learner":
        training = config.training
        return training.batch_size * training.train_steps_per_iteration / training.collect_steps_per_iteration
    return spi


def queue_size(config: Config) -> int:
    """Items the learner's queue holds before the collectors wait: the tolerance, in inserted items."""
    return max(1, round(config.distributed.samples_per_insert_tolerance / samples_per_insert(config)))


def resolve_auto(config: Config) -> Config:
    """Replaces `auto` settings by what they stand for, so a run's config.yaml says what ran."""
    replay = dataclasses.replace(config.replay, sampling=sampling_mode(config.replay))
    return dataclasses.replace(config, replay=replay)


def read_resolved(path: str) -> dict:
    """A config file with every default filled in and its types checked, as plain data.

    Unlike `load_config` it skips the env-id check, which imports TF-Agents: the report uses it.
    """
    return to_dict(_build(_read_yaml(path), path))


def _read_yaml(path: str) -> dict:
    if not os.path.exists(path):
        raise ConfigError(f"{path}: config file not found")
    if os.path.isdir(path):
        raise ConfigError(f"{path}: is a folder, not a config file")
    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML: {_one_line(exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    if raw is None:
        raise ConfigError(f"{path}: the file is empty; expected a mapping of sections")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    return raw


def _one_line(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{problem}{where}".replace("\n", " ")


def _suggest(name: str, options: typing.Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(options), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _build(raw: dict, source: str) -> Config:
    sections = {}
    for name, value in raw.items():
        if name not in SECTIONS:
            raise ConfigError(f"{source}: unknown section '{name}'{_suggest(str(name), SECTIONS)}")
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {name}: expected a mapping of keys, got {_describe(value)}")
        sections[name] = _build_section(name, value, source)
    return Config(**sections)


def _build_section(section: str, raw: dict, source: str) -> Any:
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in raw.items():
        if key not in hints:
            everything = [f"{section}.{k}" for k in hints]
            raise ConfigError(
                f"{source}: unknown key '{section}.{key}'{_suggest(f'{section}.{key}', everything)}"
            )
        values[key] = _coerce(value, hints[key], f"{section}.{key}", source)
    return cls(**values)


def apply_override(config: Config, item: str) -> Config:
    """Applies one `section.key=value` override; the value is parsed as YAML."""
    where = f"--set {item}"
    if "=" not in item:
        raise ConfigError(f"{where}: expected section.key=value")
    dotted, text = item.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"{where}: expected section.key=value, with one dot in the key")
    section, key = parts
    if section not in SECTIONS:
        raise ConfigError(f"{where}: unknown section '{section}'{_suggest(section, SECTIONS)}")
    hints = typing.get_type_hints(SECTIONS[section])
    if key not in hints:
        everything = [f"{section}.{k}" for k in hints]
        raise ConfigError(f"{where}: unknown key '{dotted}'{_suggest(dotted, everything)}")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: malformed value: {_one_line(exc)}") from None
    value = _coerce(value, hints[key], dotted, "--set")
    new_section = dataclasses.replace(getattr(config, section), **{key: value})
    return dataclasses.replace(config, **{section: new_section})


# ---------------------------------------------------------------------------- types


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, (dict, list)) else type(value).__name__


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    """Checks `value` against the field's type; numbers written as strings like '1e-3' load as floats."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union and type(None) in args:
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
    problem = f"{source}: {key}: expected {_type_name(hint)}, got {_describe(value)}"
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(problem)
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            return int(value)
        raise ConfigError(problem)
    if hint is float:
        if isinstance(value, bool):
            raise ConfigError(problem)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:  # PyYAML reads 1e-3 (no dot) as a string: coerce on purpose.
                return float(value)
            except ValueError:
                pass
        raise ConfigError(problem)
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(problem)
    if hint is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
        raise ConfigError(f"{source}: {key}: expected a list of integers, got {_describe(value)}")
    raise AssertionError(f"unsupported config type {hint}")


def _type_name(hint: Any) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


# ---------------------------------------------------------------------------- ranges


def validate(config: Config, source: str) -> None:
    """Checks ranges and cross-field constraints; raises ConfigError naming the key."""

    def fail(key: str, problem: str) -> None:
        raise ConfigError(f"{source}: {key}: {problem}")

    for (section, key), options in CHOICES.items():
        value = getattr(getattr(config, section), key)
        if value not in options:
            fail(f"{section}.{key}", f"must be one of {', '.join(options)}, got {value!r}{_suggest(value, options)}")
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
    for key in ("gamma", "epsilon_start", "epsilon_end"):
        value = getattr(config.agent, key)
        if not 0.0 <= value <= 1.0:
            fail(f"agent.{key}", f"must be in [0, 1], got {value}")
    if not 0.0 < config.agent.target_update_tau <= 1.0:
        fail("agent.target_update_tau", f"must be in (0, 1], got {config.agent.target_update_tau}")
    if not config.network.fc_layer_params or min(config.network.fc_layer_params) <= 0:
        fail("network.fc_layer_params",
             f"must be a non-empty list of positive sizes, got {list(config.network.fc_layer_params)}")
    if config.training.batch_size > config.replay.capacity:
        fail("training.batch_size",
             f"{config.training.batch_size} is larger than replay.capacity ({config.replay.capacity})")
    if config.replay.backend == "reverb" and config.replay.sampling == "direct":
        fail("replay.sampling", "Reverb is read through a tf.data dataset; use sampling: dataset (or auto) with "
                                "backend: reverb")
    window = (config.agent.n_step + 1) * config.env.num_envs
    if config.training.initial_collect_steps < window:
        fail("training.initial_collect_steps",
             f"must be at least (agent.n_step + 1) x env.num_envs = {window}, so the first sample finds a whole "
             f"{config.agent.n_step + 1}-step window in every env's stream; "
             f"got {config.training.initial_collect_steps}")
    if config.replay.reverb_port is not None and not 0 < config.replay.reverb_port < 65536:
        fail("replay.reverb_port", f"must be a port in 1..65535, got {config.replay.reverb_port}")
    if config.replay.reverb_num_workers_per_iterator == 0 or config.replay.reverb_num_workers_per_iterator < -1:
        fail("replay.reverb_num_workers_per_iterator",
             f"must be -1 (Reverb picks) or positive, got {config.replay.reverb_num_workers_per_iterator}")
    if config.env.num_envs > 1 and config.training.collect_steps_per_iteration % config.env.num_envs:
        fail("training.collect_steps_per_iteration",
             f"must be a multiple of env.num_envs ({config.env.num_envs}), "
             f"got {config.training.collect_steps_per_iteration}")
    if config.output.run_name is not None and (not config.output.run_name or "/" in config.output.run_name):
        fail("output.run_name", f"must be a plain folder name, got {config.output.run_name!r}")
    spi, tolerance = config.distributed.samples_per_insert, config.distributed.samples_per_insert_tolerance
    if spi is not None and not spi > 0:
        fail("distributed.samples_per_insert", f"must be positive or null, got {spi}")
    if spi is not None and tolerance < max(1.0, spi):
        # Reverb's SampleToInsertRatio needs max_diff - min_diff = 2 x tolerance >= 2 x max(1, spi).
        fail("distributed.samples_per_insert_tolerance",
             f"must be at least max(1, distributed.samples_per_insert) = {max(1.0, spi):g} (Reverb needs the "
             f"ratio's error buffer to span 2 x that), got {tolerance:g}")
    validate_env_id(config.env.id, source)


def validate_env_id(env_id: str, source: str) -> None:
    from dqn_cartpole.core.env_ids import EnvSpecError, check_env_id  # gymnasium only: no TensorFlow yet

    try:
        check_env_id(env_id)
    except EnvSpecError as exc:
        raise ConfigError(f"{source}: env.id: {exc}") from None


# ---------------------------------------------------------------------------- output


def to_dict(config: Config) -> dict:
    """The config as plain YAML-able data (tuples become lists)."""

    def plain(value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else value

    return {s: {k: plain(v) for k, v in dataclasses.asdict(getattr(config, s)).items()} for s in SECTIONS}


def dump_yaml(config: Config) -> str:
    """The fully resolved config as YAML text, one section after another."""
    return yaml.safe_dump(to_dict(config), sort_keys=False, default_flow_style=None)


def describe() -> str:
    """Every field with its type, default and one-line description."""
    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"{section}:")
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"  {f.name}: {default!r:<14} # {f.metadata['doc']}")
    return "\n".join(lines)
