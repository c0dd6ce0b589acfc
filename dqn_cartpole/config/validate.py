"""The config's checks: each key's own constraints, as its field declares them (`declare.key`: choices, the
constraint on its value, the agent kinds it belongs to), then the constraints between keys and the env id. Every
problem is one line naming the key and where its value came from."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from dqn_cartpole.config.coerce import suggest
from dqn_cartpole.config.declare import show
from dqn_cartpole.config.resolve import c51_values
from dqn_cartpole.config.schema import SECTIONS, Config
from dqn_cartpole.errors import ConfigError, UserError

Fail = Callable[..., None]  # fail(key, problem, *other keys involved)
REGISTERED_CHOICES: dict[str, tuple] = {}  # section.key -> values added from outside (`register_agent_kind`)


def register_agent_kind(kind: str, registered: bool = True) -> None:
    """Lets `agent.kind` take `kind` (or, with `registered=False`, no longer), beside the ones its field declares:
    the hook behind `core.agents.registry.register`, for an agent module that lives outside this package."""
    kinds = tuple(k for k in REGISTERED_CHOICES.get("agent.kind", ()) if k != kind)
    REGISTERED_CHOICES["agent.kind"] = kinds + ((kind,) if registered else ())


def validate(config: Config, source: str, origins: Optional[dict] = None) -> None:
    """Checks ranges and cross-field constraints; raises ConfigError naming the key and where its value came from:
    `origins[key]` (the file, `--set ITEM`, a shortcut's flag; see `Loaded.origins`), else `source`."""

    def fail(key: str, problem: str, *others: str) -> None:
        raise ConfigError(f"{blame(origins, source, key, *others)}: {key}: {problem}")

    for section in SECTIONS:
        values = getattr(config, section)
        for spec in dataclasses.fields(values):
            check_key(section, spec, values, fail)
    for rule in BETWEEN_KEYS:
        rule(config, fail)
    validate_env_id(config.env.id, blame(origins, source, "env.id"))
    _check_solve_return(config, blame(origins, source, "evaluation.stop_when_solved", "evaluation.solve_return",
                                      "env.id"))


def check_key(section: str, spec: dataclasses.Field, values: Any, fail: Fail) -> None:
    """One key's own constraints, as its field declares them: its choices; for an agent kind's own key, that another
    kind leaves it at its default; the constraint on its value (for a kind's key, when the kind is one of its own)."""
    dotted, value, meta = f"{section}.{spec.name}", getattr(values, spec.name), spec.metadata
    choices = meta["choices"] + REGISTERED_CHOICES.get(dotted, ()) if meta["choices"] else ()
    if choices and value is not None and value not in choices:  # null: an optional key left out
        fail(dotted, f"must be one of {', '.join(choices)}, got {value!r}{suggest(value, choices)}")
    condition = meta["condition"]
    if meta["exclusive"] and not condition.holds({condition.key: getattr(values, condition.key)}):
        if value != spec.default:
            other = getattr(values, condition.key)
            fail(dotted, f"applies to {section}.{condition.key} {' or '.join(condition.values)} only, not to "
                         f"{condition.key} {other}; remove it or give it its default, {show(spec.default)} (got "
                         f"{show(value)})", f"{section}.{condition.key}")
        return
    problem = meta["check"].problem(value) if meta["check"] else None
    if problem:
        fail(dotted, problem)


def blame(origins: Optional[dict], source: str, *keys: str) -> str:
    """Where the newest of `keys`' values came from (`origins`: section.key -> source, oldest first): the value
    that broke a constraint between keys is the one written last. `source` if none of them was written."""
    order = list(origins or {})
    given = [key for key in keys if key in order]
    return origins[max(given, key=order.index)] if given else source


# ---------------------------------------------------------------------------- constraints between keys
# Each a one-line error naming the key to change; `fail`'s further keys are the others involved, so the error names
# where the newest of their values came from.


def _c51_support(config: Config, fail: Fail) -> None:
    if config.agent.kind == "c51":
        _, low, high = c51_values(config.agent)
        if not low < high:
            fail("agent.max_q_value", f"must be above agent.min_q_value ({low:g}), got {high:g}", "agent.min_q_value")


def _batch_fits_the_replay(config: Config, fail: Fail) -> None:
    if config.training.batch_size > config.replay.capacity:
        fail("training.batch_size",
             f"{config.training.batch_size} is larger than replay.capacity ({config.replay.capacity})",
             "replay.capacity")


def _reverb_reads_a_dataset(config: Config, fail: Fail) -> None:
    if config.replay.backend == "reverb" and config.replay.sampling == "direct":
        fail("replay.sampling", "Reverb is read through a tf.data dataset; use sampling: dataset (or auto) with "
                                "backend: reverb", "replay.backend")


def _first_sample_finds_a_window(config: Config, fail: Fail) -> None:
    window = (config.agent.n_step + 1) * config.env.num_envs
    if config.training.initial_collect_steps < window:
        fail("training.initial_collect_steps",
             f"must be at least (agent.n_step + 1) x env.num_envs = {window}, so the first sample finds a whole "
             f"{config.agent.n_step + 1}-step window in every env's stream; "
             f"got {config.training.initial_collect_steps}", "agent.n_step", "env.num_envs")


def _collect_steps_split_over_envs(config: Config, fail: Fail) -> None:
    if config.env.num_envs > 1 and config.training.collect_steps_per_iteration % config.env.num_envs:
        fail("training.collect_steps_per_iteration",
             f"must be a multiple of env.num_envs ({config.env.num_envs}), "
             f"got {config.training.collect_steps_per_iteration}", "env.num_envs")


def _ratio_has_an_error_buffer(config: Config, fail: Fail) -> None:
    spi, tolerance = config.distributed.samples_per_insert, config.distributed.samples_per_insert_tolerance
    if spi is not None and tolerance < max(1.0, spi):
        # Reverb's SampleToInsertRatio needs max_diff - min_diff = 2 x tolerance >= 2 x max(1, spi).
        fail("distributed.samples_per_insert_tolerance",
             f"must be at least max(1, distributed.samples_per_insert) = {max(1.0, spi):g} (Reverb needs the "
             f"ratio's error buffer to span 2 x that), got {tolerance:g}", "distributed.samples_per_insert")


def _py_uniform_holds_one_stream(config: Config, fail: Fail) -> None:
    if config.replay.backend == "py_uniform" and config.env.num_envs != 1:
        fail("replay.backend", f"py_uniform stores a single stream of steps; set env.num_envs: 1 (got "
                               f"{config.env.num_envs}) or use replay.backend: tf_uniform", "env.num_envs")


def _priorities_need_a_backend_that_keeps_them(config: Config, fail: Fail) -> None:
    if config.replay.prioritized and config.replay.backend == "tf_uniform":
        fail("replay.prioritized", "tf_uniform samples uniformly and keeps no priorities; use replay.backend: "
                                   "reverb or py_uniform for prioritized replay", "replay.backend")


def check_prioritized_across_processes(config: Config, who: str) -> None:
    """One line if `who` (a topology, a role) cannot prioritize: across processes the priorities live in the replay
    server's table (Ape-X: the collectors write each window at its priority, the learner writes the new ones back);
    the learner's own buffer (distributed.replay: learner) samples uniformly."""
    if config.replay.prioritized and config.distributed.replay == "learner":
        raise UserError(f"replay.prioritized: {who} keeps the replay in the learner's own buffer (distributed.replay: "
                        f"learner), which samples uniformly; set distributed.replay: server (a prioritized table on "
                        f"the replay server, as Ape-X), or replay.prioritized: false")


def _tracking_keys_need_a_backend(config: Config, fail: Fail) -> None:
    """A tracking key given without a tracker would be silently ignored: name it, and how to track."""
    tracking, defaults = config.tracking, type(config.tracking)()
    for spec in dataclasses.fields(tracking):
        value = getattr(tracking, spec.name)
        if spec.name == "backend" or value == getattr(defaults, spec.name):
            continue
        if tracking.backend is None:
            fail(f"tracking.{spec.name}", f"is set, but the run is not tracked: add --track mlflow or --track "
                                          f"wandb (or remove it)", "tracking.backend")
        if spec.name == "online" and tracking.backend != "wandb":
            fail("tracking.online", f"applies to --track wandb only, not {tracking.backend} (MLflow sends to "
                                    f"MLFLOW_TRACKING_URI when it is set)", "tracking.backend")


BETWEEN_KEYS = (_c51_support, _batch_fits_the_replay, _reverb_reads_a_dataset, _first_sample_finds_a_window,
                _collect_steps_split_over_envs, _ratio_has_an_error_buffer, _py_uniform_holds_one_stream,
                _priorities_need_a_backend_that_keeps_them, _tracking_keys_need_a_backend)


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
