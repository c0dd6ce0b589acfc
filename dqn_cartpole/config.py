"""Typed, frozen, documented configuration, loaded from YAML plus `--set` overrides.

Config flows one way: YAML file -> `--set section.key=value` overrides -> one frozen
`Config`, checked here before anything is built. `load` also keeps what the user wrote (the keys the
file and the flags named, before `auto` resolves: what `config` and the report call changed) and
where each value came from, so an error names the file, the `--set` or the shortcut that gave it.
Every field carries a one-line description in its metadata (`dqn_cartpole.config_docs` turns them
into the `config` command's output and docs/configuration-reference.md).

Defaults have one source, configs/default.yaml: every field takes its default from that file
when this module is imported, so `Config()`, a config file that names only a few keys, and
`train` without `--config` all start from the same values. The package reads its configs
through `importlib.resources` (`dqn_cartpole/configs`): in a checkout that is a symlink to the
top-level configs/ folder, in a wheel the copy the build made of it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.resources
import math
import os
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import yaml

from dqn_cartpole.errors import ConfigError

DEFAULT_CONFIG = "default.yaml"
CONFIGS_PREFIX = "configs/"  # `--config configs/NAME.yaml` finds a shipped config from any folder


# ---------------------------------------------------------------------------- reading and types


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
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: {key}: expected a list of integers, got {_describe(value)}")
        for number, item in enumerate(value, 1):
            if not isinstance(item, int) or isinstance(item, bool):
                raise ConfigError(f"{source}: {key}: expected a list of integers, but item {number} is "
                                  f"{_describe(item)}")
        return tuple(value)
    raise AssertionError(f"unsupported config type {hint}")


def _type_name(hint: Any) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


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


def shipped_configs_dir() -> str:
    """The folder of the configs that come with the package (the top-level configs/ in a checkout)."""
    return os.path.realpath(str(importlib.resources.files("dqn_cartpole") / "configs"))


def shipped_config_names(subfolder: str = "") -> list[str]:
    """The shipped configs' names, without .yaml: default, tutorial, smoke and the presets (or, with
    `subfolder="tune"`, the search spaces)."""
    folder = os.path.join(shipped_configs_dir(), subfolder)
    return sorted(name[:-5] for name in os.listdir(folder) if name.endswith(".yaml")) if os.path.isdir(folder) else []


def default_config_path() -> str:
    return os.path.join(shipped_configs_dir(), DEFAULT_CONFIG)


def locate_config(path: Optional[str]) -> str:
    """The config file `path` means: the file itself if it exists, else a shipped config of that name.

    `--config acrobot`, `--config acrobot.yaml` and `--config configs/acrobot.yaml` find the shipped
    preset from any working directory (and from a wheel); None is the default config.
    """
    if path is None:
        return default_config_path()
    found = _shipped(path, "")
    if found is None:
        raise ConfigError(f"{path}: config file not found (the shipped configs: {', '.join(shipped_config_names())})")
    return found


def locate_space(path: str) -> str:
    """The search space `path` means, as `locate_config`: `--space acrobot-space` or
    `--space configs/tune/acrobot-space.yaml` finds a shipped one from any folder."""
    found = _shipped(path, "tune")
    if found is None:
        raise ConfigError(f"--space {path}: no such file (the shipped search spaces: "
                          f"{', '.join(shipped_config_names('tune'))})")
    return found


def _shipped(path: str, subfolder: str) -> Optional[str]:
    """`path` if it exists, else the shipped file it names (NAME, NAME.yaml or configs/[tune/]NAME.yaml), else None."""
    if os.path.exists(path):
        return path
    prefix = CONFIGS_PREFIX + (f"{subfolder}/" if subfolder else "")
    name = path[len(prefix):] if path.startswith(prefix) else path
    name = name[:-5] if name.endswith(".yaml") else name
    if name in shipped_config_names(subfolder):
        return os.path.join(shipped_configs_dir(), subfolder, f"{name}.yaml")
    return None


NOT_PRESETS = ("default", "smoke", "tutorial")  # shipped configs that are no env's tuned preset


def preset_for(env_id: str) -> Optional[str]:
    """The name of the shipped preset tuned for `env_id` (`acrobot` for Acrobot-v1), if there is one."""
    for name in shipped_config_names():
        if name not in NOT_PRESETS:
            env = (_read_yaml(os.path.join(shipped_configs_dir(), f"{name}.yaml")).get("env") or {})
            if env.get("id") == env_id:
                return name
    return None


def preset_note(config_file: str, config: "Config") -> Optional[str]:
    """One line when the default config (CartPole's hyperparameters) is about to train an env that has a shipped
    preset: which one, and how to use it. None otherwise (another config file was given, or no preset fits)."""
    if os.path.realpath(config_file) != os.path.realpath(default_config_path()):
        return None
    name = preset_for(config.env.id)
    if name is None:
        return None
    return (f"note: {config.env.id} has a preset tuned for it: add --config {name} (configs/{name}.yaml) to use it; "
            f"without it, configs/default.yaml's hyperparameters, tuned for {Config().env.id}, are used")


@functools.lru_cache(maxsize=None)
def _default_values() -> dict:
    """configs/default.yaml as data: `section -> key -> value`, read once."""
    return _read_yaml(default_config_path())


def _section_defaults(section: str) -> Callable[[type], type]:
    """Class decorator: sets each field's default from configs/default.yaml's `section` (before @dataclass).

    A key that default.yaml lacks, or one the schema does not know, is an error naming the file:
    it is the one place every default is written.
    """

    def apply(cls: type) -> type:
        source = default_config_path()
        given = _default_values().get(section) or {}
        hints = typing.get_type_hints(cls)
        unknown = sorted(set(given) - set(hints))
        if unknown:
            raise ConfigError(f"{source}: unknown key '{section}.{unknown[0]}'")
        for name, hint in hints.items():
            if name not in given:
                raise ConfigError(f"{source}: {section}.{name} is missing; {DEFAULT_CONFIG} gives every key's default")
            spec = cls.__dict__[name]
            spec.default = _coerce(given[name], hint, f"{section}.{name}", source)
        return cls

    return apply


def _f(doc: str, applies: Optional[Callable[[dict], bool]] = None, when: str = "") -> Any:
    """A dataclass field with a one-line description; its default comes from configs/default.yaml.

    `applies(config_dict)` says whether the key matters for a run with that (resolved) config, and
    `when` says the same in words; a key without it always applies.
    """
    return field(metadata={"doc": doc, "applies": applies, "when": when})


def _reverb(c: dict) -> bool:
    return c.get("replay", {}).get("backend") == "reverb"


def _dataset(c: dict) -> bool:
    return c.get("replay", {}).get("sampling") == "dataset"


def _video(c: dict) -> bool:
    return bool(c.get("video", {}).get("enabled"))


def _solve_check(c: dict) -> bool:
    return bool(c.get("evaluation", {}).get("stop_when_solved"))


@dataclass(frozen=True)
@_section_defaults("env")
class EnvConfig:
    """The gymnasium environment."""

    id: str = _f("gymnasium env id; needs a Box observation and a Discrete action space")
    num_envs: int = _f("copies of the env stepped together for collection (1 = the tutorial)")
    max_episode_steps: Optional[int] = _f("override the env's time limit (null = the env's own)")


@dataclass(frozen=True)
@_section_defaults("network")
class NetworkConfig:
    """The Q-network."""

    fc_layer_params: tuple = _f("units of each hidden Dense layer (ReLU, VarianceScaling init)")


AGENT_KINDS = ("dqn", "double_dqn", "c51")
# A kind's own keys: the kinds each applies to. Another kind's key is an error unless it keeps its default.
KIND_KEYS = {"td_loss": ("dqn", "double_dqn"), "num_atoms": ("c51",), "min_q_value": ("c51",),
             "max_q_value": ("c51",)}
C51_DEFAULTS = {"num_atoms": 51, "min_q_value": -10.0, "max_q_value": 10.0}  # what null means for kind c51


def _kinds(*kinds: str) -> Callable[[dict], bool]:
    return lambda c: c.get("agent", {}).get("kind") in kinds


@dataclass(frozen=True)
@_section_defaults("agent")
class AgentConfig:
    """The value-based agent."""

    kind: str = _f("the agent: dqn (TF-Agents' DqnAgent), double_dqn (DdqnAgent: the target network evaluates the "
                   "online network's greedy action) or c51 (CategoricalDqnAgent: a distribution over num_atoms "
                   "values per action)")
    double_dqn: Optional[bool] = _f("deprecated: write kind: double_dqn (true) or kind: dqn (false); loading it "
                                    "prints a note and sets kind (null = not given)")
    learning_rate: float = _f("Adam learning rate")
    td_loss: str = _f("TD loss: huber is linear beyond an error of 1, so large errors move the weights less (C51's "
                      "loss is the cross-entropy of the projected target distribution)", _kinds("dqn", "double_dqn"),
                      "kind is dqn or double_dqn")
    gamma: float = _f("discount factor, in [0, 1]")
    epsilon_start: float = _f("epsilon of the epsilon-greedy collect policy at train step 0")
    epsilon_end: float = _f("epsilon after epsilon_decay_steps train steps")
    epsilon_decay_steps: int = _f("train steps over which epsilon falls linearly from start to end")
    target_update_period: int = _f("train steps between target-network updates")
    target_update_tau: float = _f("target update factor, in (0, 1]; 1 copies the weights")
    gradient_clipping: Optional[float] = _f("clip gradients to this global norm (null = off)")
    n_step: int = _f("n-step TD update; replay holds sequences of n_step + 1 steps")
    num_atoms: Optional[int] = _f(f"C51: atoms of each action's return distribution, at least 2 (null = "
                                  f"{C51_DEFAULTS['num_atoms']})", _kinds("c51"), "kind is c51")
    min_q_value: Optional[float] = _f(f"C51: the lowest atom, the smallest return the distribution can hold (null = "
                                      f"{C51_DEFAULTS['min_q_value']:g}, the paper's, for rewards clipped to [-1, 1])",
                                      _kinds("c51"), "kind is c51")
    max_q_value: Optional[float] = _f(f"C51: the highest atom, above min_q_value (null = "
                                      f"{C51_DEFAULTS['max_q_value']:g})", _kinds("c51"), "kind is c51")


@dataclass(frozen=True)
@_section_defaults("replay")
class ReplayConfig:
    """The replay buffer."""

    backend: str = _f("replay buffer: reverb (an embedded server, opens a port), tf_uniform or py_uniform (one env "
                      "only)")
    capacity: int = _f("maximum transitions kept; the oldest are evicted first")
    sampling: str = _f("dataset (tf.data, parallel + prefetch), direct (in program order, reproducible; uniform "
                       "buffers only) or auto (direct for the uniform buffers, dataset for Reverb)")
    num_parallel_calls: int = _f("parallel sampling calls in the tf.data pipeline", _dataset, "sampling is dataset")
    prefetch: int = _f("batches the tf.data pipeline prepares ahead", _dataset, "sampling is dataset")
    reverb_port: Optional[int] = _f("port of the embedded Reverb server (null = a free port)", _reverb,
                                    "backend is reverb")
    reverb_max_cycle_length: int = _f("Reverb streams read in parallel, each yielding whole batches (Acme's "
                                      "make_reverb_dataset; 4 was the fastest of 1-8 on 2 cores)",
                                      _reverb, "backend is reverb")
    reverb_dataset_buffer_size: Optional[int] = _f("samples in flight per Reverb stream (null = 2 x the batch)",
                                                   _reverb, "backend is reverb")
    reverb_num_workers_per_iterator: int = _f("threads sampling for each Reverb stream (-1 = Reverb picks)",
                                              _reverb, "backend is reverb")


@dataclass(frozen=True)
@_section_defaults("training")
class TrainingConfig:
    """The training loop."""

    seed: int = _f("seeds Python, NumPy, TensorFlow and the environments")
    num_iterations: int = _f("iterations; each collects, then trains")
    initial_collect_steps: int = _f("env steps of a random policy that fill the buffer first")
    collect_steps_per_iteration: int = _f("env steps collected per iteration, summed over envs")
    train_steps_per_iteration: int = _f("gradient steps per iteration")
    batch_size: int = _f("transitions per gradient step")
    log_interval: int = _f("iterations between rows of train_metrics.csv (loss: mean and max over the interval)")
    checkpoint_interval: int = _f("iterations between checkpoints (resume with: train --resume RUN_DIR)")
    keep_checkpoints: int = _f("newest complete checkpoints kept in RUN_DIR/checkpoints; older ones are deleted")
    jit_compile: bool = _f("compile each gradient step with XLA (slower inside the compiled loop on CPU: off by "
                           "default)")


@dataclass(frozen=True)
@_section_defaults("collection")
class CollectionConfig:
    """How the collect policy steps the envs."""

    driver: str = _f("compiled (a TF driver inside the compiled loop, fastest) or py (the tutorial's PyDriver + "
                     "PyTFEagerPolicy in Python, then a compiled train step)")


@dataclass(frozen=True)
@_section_defaults("distributed")
class DistributedConfig:
    """Roles as separate processes (train --topology local, replay-server, collect, learn); a single-process run
    ignores this section."""

    replay: str = _f("where the replay lives: 'learner' keeps it in the learner's own in-graph buffer (fast), fed "
                     "through a queue on the server; 'server' keeps one shared replay table on the server "
                     "(checkpointed there, for several learners), which the learner samples over the network")
    weight_refresh_steps: int = _f("env steps a collector takes between pulls of the learner's weights (about 1 ms "
                                   "each)")
    weight_push_interval: int = _f("learner train steps between pushes of its weights to the variables table (a "
                                   "background thread pushes them while the learner trains)")
    server_checkpoint_s: Optional[float] = _f("seconds between the replay server's own table checkpoints (null = "
                                              "only when it stops and with each learner checkpoint; a timer races "
                                              "a learner's checkpoint, which moves the newest)")
    connect_timeout_s: float = _f("seconds a role waits for the replay server at start-up before it gives up")
    rate_limiter_timeout_ms: int = _f("a learner's sample waits this long for data, then fails (no freeze)")
    final_evaluation_timeout_s: float = _f("seconds a learner that trained all its iterations waits for the "
                                           "evaluate-live role's evaluation of its final weights")
    samples_per_insert: Optional[float] = _f("sampled items per inserted item (a batch of 64 counts 64). replay "
                                             "learner: the learner reads exactly this (null = as one process: "
                                             "batch_size x train_steps / collect_steps per iteration); server: "
                                             "Reverb's SampleToInsertRatio (null = no ratio, MinSize(1))")
    samples_per_insert_tolerance: float = _f("how far (in sampled items) the ratio may drift before one side waits; "
                                             "learner: the queue holds tolerance / samples_per_insert items; "
                                             "server: prefetched samples count too")


@dataclass(frozen=True)
@_section_defaults("evaluation")
class EvaluationConfig:
    """Periodic greedy evaluation."""

    eval_interval: int = _f("iterations between evaluations")
    num_eval_episodes: int = _f("greedy episodes per evaluation")
    stop_when_solved: bool = _f("stop early once the greedy policy reaches solve_return")
    solve_return: Optional[float] = _f("average return that counts as solved (null = the env's registered reward "
                                       "threshold; an env without one needs it)")
    solve_episodes: int = _f("fresh greedy episodes that must average solve_return to stop early", _solve_check,
                             "stop_when_solved is true")
    solve_margin: float = _f("standard errors of the check's average that must lie above solve_return (0: the "
                             "average alone, gymnasium's definition of solved)", _solve_check,
                             "stop_when_solved is true")
    overlap: str = _f("where the evaluations and the solve check run: process (a child process on the other core, "
                      "on a copy of the weights, while the training goes on; the result is taken in one eval_interval "
                      "later, so a solve stops the run there and policy/final is the copy that passed), thread (the "
                      "same in a thread, which shares the trainer's GIL) or inline (training waits for each)")


@dataclass(frozen=True)
@_section_defaults("video")
class VideoConfig:
    """The mp4s of the trained and the random agent."""

    enabled: bool = _f("record videos at the end of training")
    num_episodes: int = _f("episodes of the trained (greedy) agent in its video", _video, "enabled is true")
    random_episodes: int = _f("episodes of the random agent in its video", _video, "enabled is true")
    fps: int = _f("frames per second of the mp4", _video, "enabled is true")


@dataclass(frozen=True)
@_section_defaults("output")
class OutputConfig:
    """Where the run's files go."""

    root: str = _f("folder that holds one folder per run (relative to the working directory)")
    run_name: Optional[str] = _f("run folder name (null = <env>__s<seed>__<time>)")
    tensorboard: bool = _f("write TensorBoard event files")


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
CHOICES = {("agent", "kind"): AGENT_KINDS, ("agent", "td_loss"): ("squared", "huber"),
           ("replay", "backend"): ("reverb", "tf_uniform", "py_uniform"),
           ("replay", "sampling"): ("auto", "dataset", "direct"), ("collection", "driver"): ("compiled", "py"),
           ("distributed", "replay"): ("learner", "server"), ("evaluation", "overlap"): ("process", "thread", "inline")}
MAX_SEED = 2**31 - 1


def register_agent_kind(kind: str, registered: bool = True) -> None:
    """Lets `agent.kind` take `kind` (or, with `registered=False`, no longer): the hook behind
    `core.agents.registry.register`, for an agent module that lives outside this package."""
    kinds = tuple(k for k in CHOICES[("agent", "kind")] if k != kind)
    CHOICES[("agent", "kind")] = kinds + ((kind,) if registered else ())
ROLES_ONLY_SECTIONS = ("distributed",)  # read only when the roles run as processes
_UNKNOWN_DEFAULT_SECTIONS = sorted(set(_default_values()) - set(SECTIONS))
if _UNKNOWN_DEFAULT_SECTIONS:  # the sections' own keys are checked as each section takes its defaults
    raise ConfigError(f"{default_config_path()}: unknown section '{_UNKNOWN_DEFAULT_SECTIONS[0]}'"
                      f"{_suggest(_UNKNOWN_DEFAULT_SECTIONS[0], SECTIONS)}")


def fields(section: str) -> dict[str, dataclasses.Field]:
    """The fields of one section, by key."""
    return {f.name: f for f in dataclasses.fields(SECTIONS[section])}


def applies(config: dict, dotted: str, distributed: bool = False) -> bool:
    """Whether `section.key` matters for a run with this resolved config (as plain data, e.g. a run's
    config.yaml); `distributed`: the run's roles are separate processes."""
    section, key = dotted.split(".", 1)
    if section in ROLES_ONLY_SECTIONS:
        return distributed
    spec = fields(section).get(key)
    test = spec.metadata["applies"] if spec is not None else None
    return test is None or test(config)


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


# ---------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class Flagged:
    """A `section.key=value` override given by a flag other than `--set` (a shortcut such as `--env ID`): an error
    about its value names `flag` (`--env Pendulum-v1: ...`), where the user wrote it."""

    item: str
    flag: str


@dataclass(frozen=True)
class Loaded:
    """A loaded config and what the user wrote for it (`load`)."""

    config: Config  # checked, `auto` resolved: what runs
    written: dict  # section.key -> value, for every key the --config file (unless it is the default config) or a
    #                flag named, as written (`auto` stays `auto`)
    origins: dict  # section.key -> where a value came from: the file, `--set ITEM` or e.g. `--env ID`; in the
    #                order they were applied (a key given again moves to the end)


def nested(written: dict) -> dict:
    """section.key -> value as `{section: {key: value}}`, in schema order: a config file's shape."""
    found: dict = {}
    for section in SECTIONS:
        for key in fields(section):
            if f"{section}.{key}" in written:
                found.setdefault(section, {})[key] = written[f"{section}.{key}"]
    return found


def changes(written: dict) -> list[str]:
    """The keys of `written` (section.key -> value, as the user wrote it) whose value is not the default: what the
    user changed. An `auto` a run resolved is no change, and neither is a default written out."""
    defaults = {f"{section}.{key}": _plain(value) for section, keys in to_dict(Config()).items()
                for key, value in keys.items()}
    return [dotted for dotted, value in written.items() if dotted in defaults and value != defaults[dotted]]


def load(path: Optional[str] = None, overrides: typing.Sequence[typing.Union[str, Flagged]] = ()) -> Loaded:
    """`load_config`, and what the user wrote: the keys the file and each override named (`Loaded`).

    An override is `section.key=value` (from `--set`) or a `Flagged` one (a shortcut); an error about a value
    names where it came from: the file, `--set ITEM` or the shortcut's flag.
    """
    source, located = path or DEFAULT_CONFIG, locate_config(path)
    raw = _read_yaml(located)
    config = _build(raw, source)
    named = [f"{section}.{key}" for section, keys in raw.items() for key in (keys or {})]
    origins = dict.fromkeys(named, source)
    is_default = os.path.realpath(located) == os.path.realpath(default_config_path())
    # default.yaml's keys are the defaults: a user who named no other file wrote none of them
    written = {} if is_default else {dotted: _plain(value_of(config, dotted)) for dotted in named}
    for override in overrides:
        section, key, value, where = _parse(override)
        config = _replace_key(config, section, key, value)
        dotted = f"{section}.{key}"
        origins.pop(dotted, None)  # re-inserted last: the newest source of a value comes last
        written[dotted], origins[dotted] = _plain(value), where
    config, note = migrate_double_dqn(config, origins)
    validate(config, source, origins)
    if note:
        _note_once(note)
    return Loaded(resolve_auto(config), written, origins)


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


def c51_values(agent: AgentConfig) -> tuple[int, float, float]:
    """(num_atoms, min_q_value, max_q_value) of a C51 agent, null meaning `C51_DEFAULTS`."""
    def value(key: str) -> Any:
        given = getattr(agent, key)
        return C51_DEFAULTS[key] if given is None else given

    return value("num_atoms"), value("min_q_value"), value("max_q_value")


def override_values(overrides: typing.Sequence[typing.Union[str, Flagged]]) -> dict:
    """section.key -> value of each override, as written (a later one wins)."""
    return {f"{section}.{key}": _plain(value) for section, key, value, _ in map(_parse, overrides)}


def _parse(override: typing.Union[str, Flagged]) -> tuple[str, str, Any, str]:
    """(section, key, value, where the user wrote it) of a `--set` item or a `Flagged` override."""
    item, where = (override.item, override.flag) if isinstance(override, Flagged) else (override, f"--set {override}")
    return (*parse_override(item, where), where)


def load_config(path: Optional[str] = None, overrides: typing.Sequence[typing.Union[str, Flagged]] = ()) -> Config:
    """Reads `path` (see `locate_config`; None: configs/default.yaml), applies `section.key=value` overrides,
    checks it all. Keys the file does not name keep their defaults (configs/default.yaml's)."""
    return load(path, overrides).config


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def value_of(config: Config, dotted: str) -> Any:
    """The value of `section.key` in `config`."""
    section, key = dotted.split(".", 1)
    return getattr(getattr(config, section), key)


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
    agent = config.agent
    if agent.kind == "c51":
        agent = dataclasses.replace(agent, **dict(zip(("num_atoms", "min_q_value", "max_q_value"), c51_values(agent))))
    return dataclasses.replace(config, replay=replay, agent=agent)


def read_resolved(path: str) -> dict:
    """A config file with every default filled in and its types checked, as plain data.

    Unlike `load_config` it skips the env-id check, which imports TF-Agents: the report uses it.
    """
    raw = _read_yaml(locate_config(path))
    config, _ = migrate_double_dqn(_build(raw, path), {f"agent.{key}": path for key in (raw.get("agent") or {})})
    return to_dict(config)


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


# The command line's shortcuts for the keys changed most: argparse dest -> (config key, the flag's name in errors).
SHORTCUTS = {"env_id": ("env.id", "--env"), "seed": ("training.seed", "--seed"),
             "iterations": ("training.num_iterations", "-n")}


def add_shortcut_args(parser: Any, seed: bool = True) -> None:
    """Adds the shortcuts to an argparse parser: `--env ID`, `--seed N` (unless the command has a --seed of its
    own) and `-n/--iterations N`; `shortcut_overrides` reads them back."""
    parser.add_argument("--env", metavar="ID", dest="env_id", help="shortcut for --set env.id=ID")
    if seed:
        parser.add_argument("--seed", metavar="N", type=int, help="shortcut for --set training.seed=N")
    parser.add_argument("-n", "--iterations", metavar="N", type=int,
                        help="shortcut for --set training.num_iterations=N")


def shortcut_overrides(args: Any, seed: bool = True, flagged: bool = False) -> list:
    """`section.key=value` overrides for the shortcuts given on a command line (`--env`, `--seed`, `-n`); with
    `seed=False`, the command's own --seed (tune's sampler seed) is not one of them. `flagged`: as `Flagged`
    overrides, so an error about one names the flag the user typed (`--env Pendulum-v1`)."""
    import json

    found = []
    for dest, (key, flag) in SHORTCUTS.items():
        if dest == "seed" and not seed:
            continue
        value = getattr(args, dest, None)
        if value is not None:
            item = f"{key}={json.dumps(value)}"  # JSON is YAML: an env id stays a string
            found.append(Flagged(item, f"{flag} {value}") if flagged else item)
    return found


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
        raise ConfigError(f"{where}: unknown section '{section}'{_suggest(section, SECTIONS)}")
    hints = typing.get_type_hints(SECTIONS[section])
    if key not in hints:
        everything = [f"{section}.{k}" for k in hints]
        raise ConfigError(f"{where}: unknown key '{section}.{key}'{_suggest(f'{section}.{key}', everything)}")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: malformed value: {_one_line(exc)}") from None
    return section, key, _coerce(value, hints[key], f"{section}.{key}", where)


def _replace_key(config: Config, section: str, key: str, value: Any) -> Config:
    new_section = dataclasses.replace(getattr(config, section), **{key: value})
    return dataclasses.replace(config, **{section: new_section})


# ---------------------------------------------------------------------------- ranges


def validate(config: Config, source: str, origins: Optional[dict] = None) -> None:
    """Checks ranges and cross-field constraints; raises ConfigError naming the key and where its value came from:
    `origins[key]` (the file, `--set ITEM`, a shortcut's flag; see `Loaded.origins`), else `source`."""

    def fail(key: str, problem: str, *others: str) -> None:
        raise ConfigError(f"{blame(origins, source, key, *others)}: {key}: {problem}")

    for (section, key), options in CHOICES.items():
        value = getattr(getattr(config, section), key)
        if value not in options:
            fail(f"{section}.{key}", f"must be one of {', '.join(options)}, got {value!r}{_suggest(value, options)}")
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


# ---------------------------------------------------------------------------- output


def to_dict(config: Config) -> dict:
    """The config as plain YAML-able data (tuples become lists)."""

    return {s: {k: _plain(v) for k, v in dataclasses.asdict(getattr(config, s)).items()} for s in SECTIONS}


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
