"""`specs`: the data's way from env to learner, printed as the replay buffer tutorial shows it.

It builds the env, the agent and the configured replay exactly as `train` does, collects a few
steps with a random policy, then shows the specs and the shapes each reading API returns.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np
import tensorflow as tf
import tree  # dm-tree, which Reverb and tf-agents use: flattens nests with their paths
from tf_agents.environments import tf_py_environment
from tf_agents.specs import tensor_spec

from dqn_cartpole.config import Config
from dqn_cartpole.core import build
from dqn_cartpole.replay.base import Replay

# The tutorial's reads: get_next(10, 1), as_dataset(4, 2), then everything.
GET_NEXT = dict(sample_batch_size=10, num_steps=1)
AS_DATASET = dict(sample_batch_size=4, num_steps=2)


def describe_spec(spec: Any, indent: str = "  ") -> list[str]:
    """One line per leaf: its path in the nest, dtype, shape and bounds when it has them."""
    lines = []
    for path, leaf in _leaves(spec):
        bounds = ""
        if isinstance(leaf, tensor_spec.BoundedTensorSpec):
            low, high = np.asarray(leaf.minimum), np.asarray(leaf.maximum)
            bounds = f"  in [{_compact(low)}, {_compact(high)}]"
        lines.append(f"{indent}{path or '(value)':<16} {leaf.dtype.name:<8} {list(leaf.shape)}{bounds}")
    return lines or [f"{indent}(empty)"]


def _compact(array: np.ndarray) -> str:
    return np.array2string(array, precision=3, max_line_width=200) if array.ndim else f"{array.item():g}"


def describe_shapes(nest: Any) -> str:
    """`path [shape], ...` for a nest of arrays or tensors, on one line."""
    return ", ".join(f"{path} {list(np.shape(leaf))}" for path, leaf in _leaves(nest))


def _leaves(nest: Any) -> list[tuple[str, Any]]:
    """(path, leaf) pairs; a path joins field names and tuple indices with '/'."""
    return [("/".join(str(p) for p in path), leaf) for path, leaf in tree.flatten_with_path(nest)]


def collect(tf_env: tf_py_environment.TFPyEnvironment, replay: Replay, steps: int) -> None:
    """Runs a random policy for `steps` env steps, with `replay.add_batch` observing, as `train` fills it."""
    driver = build.make_random_driver(tf_env, [replay.add_batch], steps)
    tf.function(driver.run, autograph=False)(tf_env.reset(), ())


def _reading(label: str, read: Callable[[], Any]) -> str:
    try:
        return f"  {label}:\n    {describe_shapes(read())}"
    except ValueError as exc:  # e.g. Reverb cannot cut 2-step windows out of 3-step items
        return f"  {label}: not possible here: {str(exc).splitlines()[0]}"


def replay_lines(replay: Replay, steps: int) -> list[str]:
    """The replay's size after `steps` env steps, then the shape of each read."""
    config = replay.config
    if replay.backend == "reverb":
        stores = (f"Reverb stores items of sequence_length={replay.sequence_length} consecutive steps of one env: "
                  f"{replay.size()} items from {steps} random env steps (windows stay inside an episode; its "
                  f"last steps are padded)")
        everything = "single pass over everything stored (oldest first; shape [items, sequence_length, ...])"
    else:
        stores = (f"it stores single steps, one column per env: {replay.size()} steps from {steps} random env "
                  f"steps (episode-boundary steps are stored too)")
        everything = "single pass over everything stored (oldest first; shape [envs, steps, ...])"
    first, _ = replay.get_next(**GET_NEXT)
    return [
        f"Replay backend {config.backend} (capacity {config.capacity}); {stores}.",
        f"  get_next(sample_batch_size={GET_NEXT['sample_batch_size']}, num_steps={GET_NEXT['num_steps']}):"
        f"\n    {describe_shapes(first)}",
        _reading(f"as_dataset(sample_batch_size={AS_DATASET['sample_batch_size']}, "
                 f"num_steps={AS_DATASET['num_steps']}), one batch",
                 lambda: next(iter(replay.as_dataset(**AS_DATASET)))[0]),
        f"  {everything}:\n    {describe_shapes(replay.single_pass())}",
    ]


def specs_report(config: Config, steps: int, announce: Callable[[str], None]) -> list[str]:
    """Everything `specs` prints, for `config`, after collecting `steps` env steps."""
    with contextlib.ExitStack() as stack:
        envs = build.make_envs(config, stack)
        tf_env = envs.tf_env
        agent = build.make_agent(config, tf_env)
        lines = [f"Environment {config.env.id} ({config.env.num_envs} env(s) stepped together)", "time_step_spec:"]
        lines += describe_spec(tf_env.time_step_spec())
        lines += ["action_spec:"] + describe_spec(tf_env.action_spec())
        lines += ["collect_data_spec (the agent's Trajectory: what one env step adds to replay):"]
        lines += describe_spec(agent.collect_data_spec)
        lines += [f"The learner samples windows of {agent.window_length} steps (the agent's window: n_step + 1)."]
        replay = build.make_replay(config, agent, stack, announce=announce)
        collect(tf_env, replay, steps)
        return lines + replay_lines(replay, steps)
