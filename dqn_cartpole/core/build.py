"""The builder: what a DQN run is made of, asked for by name.

`train`, `specs` (and later every distributed role) build their parts here, so the wiring
env -> agent -> replay -> driver exists once. Reverb is always "a server, then a client": an
embedded run starts the server in its own process and connects to it; a separate process
would only connect, knowing the address.

Everything that must be released (envs, servers, readers and writers) is registered on the
`contextlib.ExitStack` the caller passes in, in the order that releases it safely.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

from tf_agents.drivers import dynamic_step_driver, py_driver
from tf_agents.environments import tf_py_environment
from tf_agents.policies import random_tf_policy

from dqn_cartpole.config import Config, ReplayConfig
from dqn_cartpole.console.quiet import NativeStderrFilter
from dqn_cartpole.core import envs
from dqn_cartpole.core.agents import ValueAgent, build_agent, window_length_for
from dqn_cartpole.core.py_collect import CompiledPyPolicy, StepCounter, StepStash
from dqn_cartpole.core.step_driver import UnrolledStepDriver
from dqn_cartpole.core.tf_cartpole import TFCartPole, is_plain_cartpole, max_episode_steps
from dqn_cartpole.replay import reverb_tables
from dqn_cartpole.replay.base import Replay
from dqn_cartpole.replay.uniform import PyUniformReplay, TFUniformReplay

# Offsets keep the collect, eval, solve-check and video envs on different random streams.
EVAL_SEED_OFFSET, SOLVE_SEED_OFFSET, VIDEO_SEED_OFFSET = 10_000, 20_000, 30_000


@dataclass(frozen=True)
class Envs:
    """The collection envs (as a Python env and its TF env: the TF wrapper, or CartPole in TF ops over it) and the
    evaluation envs."""

    collect: envs.BatchedGymnasiumEnvironment
    tf_env: Union[tf_py_environment.TFPyEnvironment, TFCartPole]
    evaluate: envs.BatchedGymnasiumEnvironment


def make_env_copies(config: Config, copies: int, seed: int, stack: contextlib.ExitStack
                    ) -> envs.BatchedGymnasiumEnvironment:
    """`copies` copies of the configured env stepped together, closed with `stack`."""
    env = envs.make_batched_env(config.env.id, copies, seed=seed, max_episode_steps=config.env.max_episode_steps)
    stack.callback(env.close)
    return env


def uses_graph_env(config: Config) -> bool:
    """Whether the compiled driver steps the collection envs in TF ops (`collection.graph_env`: CartPole only)."""
    collection = config.collection
    return collection.driver == "compiled" and collection.graph_env and is_plain_cartpole(config.env.id)


def make_envs(config: Config, stack: contextlib.ExitStack, graph_env: bool = False) -> Envs:
    """`env.num_envs` collection envs and one evaluation env per evaluation episode. With `graph_env` (see
    `uses_graph_env`), the TF env steps the collection envs' CartPole in TF ops (`tf_cartpole.TFCartPole`)."""
    seed = config.training.seed
    collect = make_env_copies(config, config.env.num_envs, seed, stack)
    evaluate = make_env_copies(config, config.evaluation.num_eval_episodes, seed + EVAL_SEED_OFFSET, stack)
    if graph_env:
        tf_env = TFCartPole(collect, max_episode_steps(config.env.id, config.env.max_episode_steps))
    else:
        tf_env = tf_py_environment.TFPyEnvironment(collect)
    return Envs(collect, tf_env, evaluate)


def make_agent(config: Config, tf_env: tf_py_environment.TFPyEnvironment) -> ValueAgent:
    """The configured agent (`agent.kind`) for the env's specs."""
    return build_agent(config.agent, config.network, tf_env.time_step_spec(), tf_env.action_spec())


# ---------------------------------------------------------------------------- replay


def make_replay_tables(replay_config: ReplayConfig, data_spec: Any, window_length: int,
                       ratio: Optional[reverb_tables.SampleRatio] = None) -> list:
    """Reverb's server side: the tables of `window_length`-step windows of `data_spec` items (`ratio`: see
    `sample_ratio`)."""
    return reverb_tables.make_replay_tables(data_spec, replay_config.capacity, window_length, ratio,
                                            replay_config.priority_exponent if replay_config.prioritized else None)


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


def sample_ratio(config: Config) -> Optional[reverb_tables.SampleRatio]:
    """A standalone server's samples-per-insert ratio (`distributed.samples_per_insert`), if set."""
    spi = config.distributed.samples_per_insert
    if spi is None:
        return None
    return reverb_tables.SampleRatio(spi, config.training.initial_collect_steps,
                                     config.distributed.samples_per_insert_tolerance)


def distributed_replay_tables(config: Config, data_spec: Any) -> list:
    """A standalone server's replay tables: the queue to a learner that keeps the replay (`distributed.replay:
    learner`), or the shared replay tables with the run's ratio (`server`)."""
    if config.distributed.replay == "learner":
        return [reverb_tables.make_queue_table(data_spec, window_length_for(config.agent), queue_size(config))]
    return make_replay_tables(config.replay, data_spec, window_length_for(config.agent), sample_ratio(config))


def distributed_writer_tables(config: Config) -> tuple:
    """The tables a collector writes its windows into (the first one carries the collecting train step)."""
    if config.distributed.replay == "learner":
        return (reverb_tables.QUEUE_TABLE_NAME,)
    return (reverb_tables.TABLE_NAME, reverb_tables.PASS_TABLE_NAME)


def start_replay_server(replay_config: ReplayConfig, data_spec: Any, window_length: int, stack: contextlib.ExitStack,
                        checkpoint_dir: Optional[str] = None,
                        announce: Callable[[str], None] = lambda line: None,
                        extra_tables: Sequence[Any] = (), port: Optional[int] = None,
                        ratio: Optional[reverb_tables.SampleRatio] = None,
                        replay_tables: Optional[list] = None) -> reverb_tables.ReplayServer:
    """Starts a Reverb server with the DQN tables (loading `checkpoint_dir`'s newest checkpoint, if any).

    A standalone server gives its own `replay_tables` (see `distributed_replay_tables`), adds the
    learner's `variables` table (`extra_tables`) and listens on `port` (else `replay.reverb_port`).
    """
    if replay_tables is None:
        replay_tables = make_replay_tables(replay_config, data_spec, window_length, ratio)
    server = reverb_tables.ReplayServer(replay_tables + list(extra_tables), port=port or replay_config.reverb_port,
                                        checkpoint_dir=checkpoint_dir)
    stack.callback(server.stop)
    announce(reverb_tables.exposure_line(server.port))
    return server


def make_replay_client(replay_config: ReplayConfig, data_spec: Any, num_envs: int, window_length: int, address: str,
                       stack: contextlib.ExitStack, rate_limiter_timeout_ms: int = -1, remote: bool = False) -> Replay:
    """A Reverb client (reader and one writer per env) of the server at `address`.

    A reader of a server in another process (`remote`: a learner's) sets `rate_limiter_timeout_ms`, so a sample fails
    instead of waiting forever, and writes its new priorities (prioritized replay) from a thread of their own.
    """
    from dqn_cartpole.replay.reverb_client import PrioritizedReverbReplay, ReverbReplay  # only Reverb pays

    if replay_config.prioritized:
        replay = PrioritizedReverbReplay(data_spec, num_envs, replay_config, window_length, address,
                                         rate_limiter_timeout_ms, in_background=remote)
    else:
        replay = ReverbReplay(data_spec, num_envs, replay_config, window_length, address, rate_limiter_timeout_ms)
    stack.callback(replay.close)
    return replay


def make_stream_writers(config: Config, data_spec: Any, address: str, stack: contextlib.ExitStack,
                        priorities: Optional[Callable[[Any], Any]] = None) -> Any:
    """A collector's writers: one per env, windows into the server's queue or replay tables (see
    `distributed_writer_tables`); with `priorities` (prioritized replay), each window at the priority it gives
    (`StreamWriters`), the writers flushed every `distributed.weight_refresh_steps` env steps."""
    import reverb

    from dqn_cartpole.replay.reverb_writers import StreamWriters  # imports Reverb: only this backend pays

    writers = StreamWriters(reverb.Client(address), data_spec, config.env.num_envs,
                            window_length_for(config.agent), distributed_writer_tables(config),
                            priorities=priorities, refresh_steps=config.distributed.weight_refresh_steps)
    stack.callback(writers.close)
    return writers


def make_learner_replay(config: Config, data_spec: Any, address: str, train_step: Any, stack: contextlib.ExitStack,
                        rate_limiter_timeout_ms: int = -1) -> Replay:
    """The replay a learner keeps itself (`distributed.replay: learner`), fed from the queue of the server at
    `address` at the run's samples per insert."""
    from dqn_cartpole.replay.learner_side import LEARNER_READ_BATCH, LearnerRatio, LearnerSideReplay, QueueReader

    length = window_length_for(config.agent)
    reader = QueueReader(address, data_spec, length, rate_limiter_timeout_ms, read_batch=LEARNER_READ_BATCH)
    ratio = LearnerRatio(samples_per_insert(config), config.training.initial_collect_steps, config.training.batch_size)
    replay = LearnerSideReplay(data_spec, config.replay, length, reader, ratio, train_step)
    stack.callback(replay.close)
    return replay


def make_replay_buffer(replay_config: ReplayConfig, data_spec: Any, num_envs: int, window_length: int,
                       stack: contextlib.ExitStack, checkpoint_dir: Optional[str] = None,
                       announce: Callable[[str], None] = lambda line: None) -> Replay:
    """A replay for one process: a uniform buffer, or an embedded Reverb server and its client."""
    if replay_config.backend == "reverb":
        stack.enter_context(NativeStderrFilter())  # Reverb's info lines, while its server lives here
        server = start_replay_server(replay_config, data_spec, window_length, stack, checkpoint_dir, announce)
        return make_replay_client(replay_config, data_spec, num_envs, window_length, server.address, stack)
    if replay_config.backend == "py_uniform" and replay_config.prioritized:
        from dqn_cartpole.replay.prioritized_py import PrioritizedPyReplay

        replay = PrioritizedPyReplay(data_spec, num_envs, replay_config, window_length)
    else:
        buffer_class = TFUniformReplay if replay_config.backend == "tf_uniform" else PyUniformReplay
        replay = buffer_class(data_spec, num_envs, replay_config)
    stack.callback(replay.close)
    return replay


def make_replay(config: Config, agent: ValueAgent, stack: contextlib.ExitStack, checkpoint_dir: Optional[str] = None,
                announce: Callable[[str], None] = lambda line: None) -> Replay:
    """The configured replay of a single-process run, for `agent`'s steps and windows."""
    return make_replay_buffer(config.replay, agent.collect_data_spec, config.env.num_envs, agent.window_length, stack,
                              checkpoint_dir, announce)


# ---------------------------------------------------------------------------- collection


def make_collect_driver(tf_env: tf_py_environment.TFPyEnvironment, policy: Any, observers: Sequence[Callable],
                        num_steps: int) -> dynamic_step_driver.DynamicStepDriver:
    """A TF-Agents driver that steps `policy` in `tf_env` for `num_steps` env steps per `run` (a `DynamicStepDriver`
    whose few steps per run are written out: `step_driver.UnrolledStepDriver`)."""
    return UnrolledStepDriver(tf_env, policy, list(observers), num_steps=num_steps)


def make_random_driver(tf_env: tf_py_environment.TFPyEnvironment, observers: Sequence[Callable],
                       num_steps: int) -> dynamic_step_driver.DynamicStepDriver:
    """The collect driver of a uniformly random policy (fills replay before training)."""
    policy = random_tf_policy.RandomTFPolicy(tf_env.time_step_spec(), tf_env.action_spec())
    return make_collect_driver(tf_env, policy, observers, num_steps)


def make_py_collect_driver(env: envs.BatchedGymnasiumEnvironment, policy: Any, observers: Sequence[Callable],
                           num_steps: int) -> py_driver.PyDriver:
    """The tutorial's driver: `policy` (a TF policy, one compiled call per step) steps the Python `env`.

    The observers get numpy Trajectory batches ([envs, ...]), as a TF driver's observers get tensors.
    """
    return py_driver.PyDriver(env, CompiledPyPolicy(policy), list(observers), max_steps=num_steps)


@dataclass
class PyCollection:
    """Collection in Python (`collection.driver: py`): the PyDriver, its numpy step counter and, for a buffer
    that lives in the graph, the stash that hands each iteration's steps to the compiled train call."""

    driver: py_driver.PyDriver
    counter: StepCounter
    stash: Optional[StepStash]
    env_steps: Any  # the run's EnvironmentSteps metric
    counted: int = 0

    def count(self) -> None:
        """Adds the env steps taken since the last call to the run's metric (once per chunk, not per step)."""
        self.env_steps.environment_steps.assign_add(self.counter.steps - self.counted)
        self.counted = self.counter.steps


def make_py_collection(env: envs.BatchedGymnasiumEnvironment, policy: Any, replay: Replay, env_steps: Any,
                       num_steps: int) -> PyCollection:
    """A PyDriver that writes `replay` the cheapest way: directly in numpy (Reverb's writers, the numpy buffer),
    or through a stash written inside the compiled train call (a buffer in the graph)."""
    counter = StepCounter()
    stash = StepStash(replay.data_spec, env.batch_size, replay.add_batch) if replay.writes_in_graph else None
    driver = make_py_collect_driver(env, policy, [stash or replay.add_batch, counter], num_steps)
    return PyCollection(driver, counter, stash, env_steps)
