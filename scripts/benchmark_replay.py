"""Replay throughput of each backend, in transitions per second, with the DQN's own data spec.

Inserts are `add_batch` calls inside one compiled loop, as the training loop's driver makes
them; samples are batches of 64 two-step windows read inside one compiled loop, from
`as_dataset` (sampling: dataset) or `get_next` (sampling: direct). Every variant is measured
`--repeats` times, round-robin, so a busy machine slows them all alike: compare the ratios in
the last column, and prefer CPU time per transition (all threads of this process) to wall
time when other work shares the cores.

Usage:
    python scripts/benchmark_replay.py [--repeats 3] [--sweep] [--backends tf_uniform,py_uniform,reverb]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dqn_cartpole.console import quiet  # noqa: E402  (silences TensorFlow before it is imported)

quiet.silence()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tf_agents.environments import tf_py_environment  # noqa: E402
from tf_agents.replay_buffers import py_uniform_replay_buffer  # noqa: E402
from tf_agents.specs import tensor_spec  # noqa: E402

from dqn_cartpole.core.agents import build_agent  # noqa: E402
from dqn_cartpole.config import ReplayConfig, load_config  # noqa: E402
from dqn_cartpole.core.envs import make_batched_env  # noqa: E402
from dqn_cartpole.core import build  # noqa: E402
from dqn_cartpole.replay.base import Replay  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, NUM_STEPS, N_STEP = 64, 2, 1
# The stream count TF-Agents' ReverbReplayBuffer used (32); the project's reader batches inside each stream.
TF_AGENTS_REVERB = dict(reverb_max_cycle_length=32, reverb_dataset_buffer_size=None, reverb_num_workers_per_iterator=-1)


@dataclass
class Variant:
    """One row of the table: a backend, its settings, and how the learner reads it."""

    label: str
    backend: str
    sampling: str = "dataset"
    settings: dict = field(default_factory=dict)
    library_py_sampling: bool = False  # py_uniform read through tf-agents' own per-item sampler


@dataclass
class Measurement:
    insert_s: list = field(default_factory=list)  # wall seconds per inserted transition
    sample_s: list = field(default_factory=list)  # wall seconds per batch
    sample_cpu_s: list = field(default_factory=list)  # CPU seconds (all threads) per batch


def dqn_data_spec() -> Any:
    """`agent.collect_data_spec` of the tutorial's agent, built with the project's own builders."""
    config = load_config(os.path.join(REPO, "configs", "tutorial.yaml"))
    env = make_batched_env(config.env.id, 1, seed=0)
    try:
        tf_env = tf_py_environment.TFPyEnvironment(env)
        agent = build_agent(config.agent, config.network, tf_env.time_step_spec(), tf_env.action_spec())
        return agent.collect_data_spec
    finally:
        env.close()


def variants(sweep: bool) -> list[Variant]:
    rows = [
        Variant("tf_uniform", "tf_uniform"),
        Variant("tf_uniform, direct", "tf_uniform", sampling="direct"),
        Variant("py_uniform, tf-agents sampler", "py_uniform", library_py_sampling=True),
        Variant("py_uniform", "py_uniform"),
        Variant("py_uniform, direct", "py_uniform", sampling="direct"),
        Variant("reverb, 32 streams (tf-agents' count)", "reverb", settings=TF_AGENTS_REVERB),
        Variant("reverb, project defaults", "reverb"),
    ]
    if sweep:  # one knob at a time, then the two that matter together
        for streams in (1, 4, 8, 16):
            rows.append(Variant(f"reverb, {streams} streams", "reverb",
                                settings=dict(TF_AGENTS_REVERB, reverb_max_cycle_length=streams)))
        for in_flight in (16, 64, 256):
            rows.append(Variant(f"reverb, {in_flight} in flight", "reverb",
                                settings=dict(TF_AGENTS_REVERB, reverb_dataset_buffer_size=in_flight)))
        for workers in (1, 2):
            rows.append(Variant(f"reverb, {workers} worker(s)", "reverb",
                                settings=dict(TF_AGENTS_REVERB, reverb_num_workers_per_iterator=workers)))
        for streams, in_flight in ((4, 64), (8, 64), (16, 64)):
            rows.append(Variant(f"reverb, {streams} streams, {in_flight} in flight", "reverb",
                                settings=dict(TF_AGENTS_REVERB, reverb_max_cycle_length=streams,
                                              reverb_dataset_buffer_size=in_flight)))
    return rows


def make_replay(variant: Variant, data_spec: Any, capacity: int, stack: contextlib.ExitStack) -> Replay:
    config = dataclasses.replace(ReplayConfig(), backend=variant.backend, sampling=variant.sampling,
                                 capacity=capacity, **variant.settings)
    return build.make_replay_buffer(config, data_spec, 1, N_STEP + 1, stack)  # windows of N_STEP + 1 steps


def library_py_dataset(replay: Replay) -> tf.data.Dataset:
    """py_uniform as the project read it before: tf-agents' generator, one Python call per item."""
    library = py_uniform_replay_buffer.PyUniformReplayBuffer(replay.buffer.data_spec, replay.buffer.capacity)
    # pylint: disable=protected-access
    library._storage, library._np_state = replay.buffer._storage, replay.buffer._np_state
    return library.as_dataset(sample_batch_size=BATCH, num_steps=NUM_STEPS).prefetch(replay.config.prefetch)


def one_batch_of_steps(data_spec: Any) -> Any:
    """A batch of one env step; the contents do not matter to the buffers."""
    return tensor_spec.sample_spec_nest(data_spec, seed=0, outer_dims=(1,))


def time_inserts(replay: Replay, step: Any, count: int) -> float:
    """Wall seconds per add_batch, called `count` times in one compiled loop."""

    @tf.function(autograph=False)
    def insert(n):
        def body(i):
            with tf.control_dependencies([replay.add_batch(step)]):
                return i + 1

        return tf.while_loop(lambda i: i < n, body, [tf.constant(0)], parallel_iterations=1)

    insert(tf.constant(10))  # traces
    started = time.perf_counter()
    insert(tf.constant(count))
    return (time.perf_counter() - started) / count


def sample_fn(variant: Variant, replay: Replay) -> Callable[[], Any]:
    if variant.library_py_sampling:
        iterator = iter(library_py_dataset(replay))
        return iterator.get_next  # the library's dataset yields bare items, without (ids, probabilities)
    return replay.sampler(BATCH, NUM_STEPS)


def time_samples(sample: Callable[[], Any], count: int) -> tuple[float, float]:
    """(wall, CPU) seconds per batch, `count` batches read in one compiled loop."""

    @tf.function(autograph=False)
    def read(n):
        def body(i, total):
            return i + 1, total + tf.reduce_sum(tf.cast(sample().reward, tf.float32))

        return tf.while_loop(lambda i, _: i < n, body, (tf.constant(0), tf.constant(0.0)), parallel_iterations=1)

    read(tf.constant(20))  # traces, starts the pipeline's threads
    wall, cpu = time.perf_counter(), time.process_time()
    read(tf.constant(count))
    return (time.perf_counter() - wall) / count, (time.process_time() - cpu) / count


def measure(variant: Variant, data_spec: Any, args: argparse.Namespace, into: Measurement) -> None:
    stack = contextlib.ExitStack()
    replay = make_replay(variant, data_spec, args.capacity, stack)
    try:
        into.insert_s.append(time_inserts(replay, one_batch_of_steps(data_spec), args.inserts))
        batches = args.batches // 3 if variant.library_py_sampling else args.batches  # that one is slow
        sample = sample_fn(variant, replay)
        wall, cpu = time_samples(sample, batches)
        into.sample_s.append(wall)
        into.sample_cpu_s.append(cpu)
    finally:
        sample = None  # the iterator's sampler threads must end with this variant, not linger
        stack.close()  # the replay, then its server
        gc.collect()


def native_threads() -> str:
    """OS threads of this process (Linux): a leak of sampler threads would show here."""
    return str(len(os.listdir("/proc/self/task"))) if os.path.isdir("/proc/self/task") else "?"


def report(rows: list[Variant], results: dict[str, Measurement]) -> str:
    reference = statistics.median(results[rows[0].label].sample_s)
    lines = [f"{'backend and settings':32s} {'insert tr/s':>12s} {'sample tr/s':>12s} {'ms/batch':>9s} "
             f"{'CPU us/tr':>10s} {'batch time vs ' + rows[0].label:>24s}"]
    for variant in rows:
        result = results[variant.label]
        insert, sample = statistics.median(result.insert_s), statistics.median(result.sample_s)
        cpu = statistics.median(result.sample_cpu_s)
        spread = f"{min(result.sample_s) * 1e3:.2f}-{max(result.sample_s) * 1e3:.2f}"
        lines.append(f"{variant.label:32s} {1 / insert:12,.0f} {BATCH / sample:12,.0f} {sample * 1e3:9.3f} "
                     f"{cpu / BATCH * 1e6:10.1f} {sample / reference:23.1f}x   (ms/batch range {spread})")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each variant, round-robin")
    parser.add_argument("--inserts", type=int, default=3000, help="add_batch calls timed per measurement")
    parser.add_argument("--batches", type=int, default=300, help="batches of 64 timed per measurement")
    parser.add_argument("--capacity", type=int, default=100_000, help="replay capacity")
    parser.add_argument("--sweep", action="store_true", help="also try other Reverb dataset settings")
    parser.add_argument("--backends", default="tf_uniform,py_uniform,reverb", help="comma-separated backends")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    np.random.seed(0)
    data_spec = dqn_data_spec()
    wanted = set(args.backends.split(","))
    rows = [v for v in variants(args.sweep) if v.backend in wanted]
    results = {v.label: Measurement() for v in rows}
    print(f"{len(rows)} variants x {args.repeats} repeats: {args.inserts} inserts, then {args.batches} batches of "
          f"{BATCH} x {NUM_STEPS} steps; CPU cores: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    for repeat in range(args.repeats):
        for variant in rows:
            measure(variant, data_spec, args, results[variant.label])
        print(f"repeat {repeat + 1}/{args.repeats} done (load average {os.getloadavg()[0]:.1f}, "
              f"{native_threads()} threads left in this process)", flush=True)
    print(report(rows, results))


if __name__ == "__main__":
    main()
