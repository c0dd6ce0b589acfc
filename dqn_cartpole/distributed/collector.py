"""The `collect` role: the tutorial's PyDriver with the agent's collect policy, writing to a remote Reverb.

It writes (n_step + 1)-step windows into the server's queue to the learner (`distributed.replay:
learner`) or into its shared replay table (`server`). It steps its envs as `collection.driver`
says: a TF-Agents `DynamicStepDriver` compiled into one call per weight refresh (`compiled`,
about twice as many env steps per second), or the tutorial's `PyDriver` (`py`). Every
`distributed.weight_refresh_steps`
env steps it pulls the learner's weights and train step (the train step sets epsilon), then
steps on; the items it writes carry that train step as their priority, so the learner can
measure its policy lag. Each collector has its own seed and its own metrics CSV (env steps/s,
episodes, the train step and age of its weights); a restarted collector counts its env steps and episodes
on from the last row of that file (or, under `--topology ray`, from what its actor was told: a collector
there writes into a folder of its own node, whose files its actor streams into the run folder).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from dqn_cartpole.config import Config
from dqn_cartpole.console import exit_status, signals
from dqn_cartpole.core import build
from dqn_cartpole.core.py_collect import StepCounter
from dqn_cartpole.core.seeding import seed_everything
from dqn_cartpole.distributed import parts
from dqn_cartpole.distributed.variables import WeightSync, check_server
from dqn_cartpole.processes.start_time import process_start_time
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.csv_files import CsvLog, read_csv
from dqn_cartpole.run_folder.metrics import COLLECTOR_COLUMNS, counted_before
from dqn_cartpole.run_folder.tensorboard import Scalars

def collect(config: Config, address: str, collector_id: int, run_dir: str,
            count_from: Optional[tuple[int, int]] = None) -> int:
    """Collects until SIGINT/SIGTERM (exit status 128 + the signal) or the run's stop (0). Its rows count on from
    `count_from` (env steps, episodes), else from the last row of its CSV in `run_dir`."""
    start = StartClock(f"collector {collector_id}")
    seed = config.training.seed + parts.COLLECTOR_SEED_OFFSET * (collector_id + 1)
    seed_everything(seed)
    os.makedirs(RunLayout(run_dir).roles, exist_ok=True)
    with signals.StopRequest(give_up_after_s=signals.ROLE_GIVE_UP_S) as stop, \
            parts.lost_server_ends(f"collector {collector_id}", address, stop), contextlib.ExitStack() as stack:
        env, tf_env, agent = parts.agent_with_envs(config, config.env.num_envs, seed, stack)
        start.mark("envs and agent")
        check_server(address, config.distributed.connect_timeout_s)  # after the agent: it overlaps the server's start
        start.mark("the server's answer")
        priorities = actor_priorities(agent, config) if config.replay.prioritized else None
        replay = build.make_stream_writers(config, agent.collect_data_spec, address, stack, priorities)
        sync = WeightSync(address, agent)
        driver_class = PyCollectorDriver if config.collection.driver == "py" else CompiledCollectorDriver
        driver = driver_class(env, tf_env, agent.collect_policy, replay.add_batch,
                              config.distributed.weight_refresh_steps)
        driver.prepare()  # while the learner builds: its first weights come after the server's start
        start.mark("writers and driver")
        csv_path = RunLayout(run_dir).collector_metrics(collector_id)
        before = count_from if count_from is not None else counted_before(read_csv(csv_path))
        csv_log = stack.enter_context(contextlib.closing(CsvLog(csv_path, COLLECTOR_COLUMNS)))
        # Its own TensorBoard run next to the learner's, so the collectors' curves can be compared.
        tensorboard = os.path.join(RunLayout(run_dir).tensorboard, f"collector-{collector_id}")
        scalars = stack.enter_context(contextlib.closing(Scalars(tensorboard if config.output.tensorboard else None)))
        if sync.wait_for_first(lambda: stop.requested):
            start.mark("first weights")
            run_driver(driver, sync, lambda row: log_row(row, csv_log, scalars), stop, replay, before=before,
                       first_write=start)
    return exit_status.for_signal(stop.signum) if stop.signum else 0


def actor_priorities(agent: Any, config: Config) -> Callable[[np.ndarray], np.ndarray]:
    """Packed windows [B, sequence_length, bytes] -> each one's initial priority, |TD error| (or C51's cross-entropy)
    + replay.priority_epsilon, from the weights the collector acts with (`PrioritizedAgent.actor_priorities`): Ape-X's
    actors prioritize what they write, so a new window enters at its own priority, not the largest seen."""
    from dqn_cartpole.replay.packing import StepPacker
    from dqn_cartpole.training.prioritized import check_agent

    check_agent(agent, config.agent.kind)
    packer, epsilon = StepPacker(agent.collect_data_spec), config.replay.priority_epsilon
    spec = packer.window_spec(agent.window_length)

    @tf.function(input_signature=[tf.TensorSpec([None, *spec.shape], spec.dtype)], autograph=False)
    def compute(windows: tf.Tensor) -> tf.Tensor:
        return tf.cast(agent.actor_priorities(packer.unpack(windows)), tf.float64) + epsilon

    return lambda windows: compute(windows).numpy()


def log_row(row: dict, csv_log: CsvLog, scalars: Scalars) -> None:
    csv_log.write(row)
    scalars.write("collector", int(row["env_steps"]),
                  {k: v for k, v in row.items() if k not in ("env_steps", "unix_s")})


class PyCollectorDriver:
    """The tutorial's PyDriver with the collect policy (one compiled call per step), counting in numpy."""

    def __init__(self, env: Any, tf_env: Any, policy: Any, write: Callable, steps: int):
        del tf_env
        self.counter = StepCounter()
        self.driver = build.make_py_collect_driver(env, policy, [write, self.counter], steps)

    def prepare(self) -> None:
        """Nothing to trace ahead: the policy is compiled at its first step."""

    def reset(self) -> Any:
        return self.driver.env.reset()

    def run(self, time_step: Any) -> Any:
        return self.driver.run(time_step, ())[0]

    def counts(self) -> tuple[int, int]:
        """(env steps, finished episodes) so far."""
        return self.counter.steps, self.counter.episodes


class CompiledCollectorDriver:
    """A TF-Agents DynamicStepDriver compiled into one call of `steps` env steps, counting with TF metrics."""

    def __init__(self, env: Any, tf_env: Any, policy: Any, write: Callable, steps: int):
        from tf_agents.metrics import tf_metrics

        del env
        self.tf_env = tf_env
        self.env_steps, self.episodes = tf_metrics.EnvironmentSteps(), tf_metrics.NumberOfEpisodes()
        driver = build.make_collect_driver(tf_env, policy, [write, self.env_steps, self.episodes], steps)
        self._run = tf.function(lambda time_step: driver.run(time_step, ())[0], autograph=False)

    def prepare(self) -> None:
        """Traces the compiled call now (about 1 s on 2 loaded cores), for a batched time step of the env's specs."""
        from tf_agents.specs import tensor_spec

        self._run.get_concrete_function(tensor_spec.add_outer_dim(self.tf_env.time_step_spec(),
                                                                  self.tf_env.batch_size))

    def reset(self) -> Any:
        return self.tf_env.reset()

    def run(self, time_step: Any) -> Any:
        from dqn_cartpole.replay.reverb_writers import WriterInterrupted

        try:
            return self._run(time_step)
        except tf.errors.OpError as exc:  # the writers run in a numpy_function, which wraps their exceptions
            if WriterInterrupted.__name__ in str(exc):
                raise WriterInterrupted(str(exc).splitlines()[0]) from None
            raise

    def counts(self) -> tuple[int, int]:
        return int(self.env_steps.result().numpy()), int(self.episodes.result().numpy())


def run_driver(driver: Any, sync: WeightSync, log: Callable[[dict], None], stop: signals.StopRequest, replay: Any,
               log_every_s: float = 5.0, before: tuple[int, int] = (0, 0),
               first_write: Optional["StartClock"] = None) -> None:
    """Pull weights (and tag the items with their train step), collect `weight_refresh_steps` env steps,
    flush the writers, repeat until a signal or the run's stop (the learner finished, or the evaluator
    confirmed a solve); a metrics row every `log_every_s`, and one when it stops. The rows count on from
    `before` (env steps, episodes of the collector's earlier processes); the speed is this process's own.

    A write held back by a samples-per-insert ratio (the learner has stopped sampling) is given up
    on as soon as either stop comes, so a collector never has to be killed.
    """
    from dqn_cartpole.replay.reverb_writers import WriterInterrupted

    run_stopped = RunStop(sync)
    replay.give_up_waiting_when(lambda: stop.requested or run_stopped())
    started = last_log = pulled_at = time.monotonic()
    weights_step = 0
    time_step = driver.reset()
    with contextlib.suppress(WriterInterrupted):  # stopped while the server held a write back: those items are dropped
        while not stop.requested and not run_stopped():
            weights_step, pulled_at = sync.pull(), time.monotonic()
            replay.tag_items(weights_step)
            time_step = driver.run(time_step)
            replay.flush()  # unconfirmed items pile up in the writers otherwise
            if first_write is not None:
                first_write.mark("first windows written")
                print(first_write.line(), flush=True)
                first_write = None
            if time.monotonic() - last_log >= log_every_s:
                last_log = time.monotonic()
                log(metrics_row(driver.counts(), started, weights_step, pulled_at, before))
    log(metrics_row(driver.counts(), started, weights_step, pulled_at, before))


class RunStop:
    """Whether the run's `stop` table has its item, asked of the server at most every `every_s` (a look costs about
    2 ms; the weights are pulled far more often)."""

    def __init__(self, sync: WeightSync, every_s: float = 0.5):
        self.sync, self.every_s = sync, every_s
        self.stopped, self.asked_at = False, float("-inf")

    def __call__(self) -> bool:
        if not self.stopped and time.monotonic() - self.asked_at >= self.every_s:
            self.stopped, self.asked_at = self.sync.stopped(), time.monotonic()
        return self.stopped


def metrics_row(counts: tuple[int, int], started: float, weights_step: int, pulled_at: float,
                before: tuple[int, int] = (0, 0)) -> dict:
    now = time.monotonic()
    steps, episodes = counts
    return {"wall_s": now - started, "env_steps": before[0] + steps, "episodes": before[1] + episodes,
            "env_steps_per_s": steps / max(now - started, 1e-9),
            "weights_train_step": weights_step, "weights_age_s": now - pulled_at,
            "unix_s": f"{time.time():.1f}"}  # a string: the CSV writes floats with 6 digits


class StartClock:
    """How long a role's start took, phase by phase, from its process's start (the kernel's record of it): the
    phases between `mark`s, in one line of its log (`line`), which says where a restarted collector's seconds go."""

    def __init__(self, name: str):
        self.name, self.started_unix = name, process_start_time()
        self.marks = [("imports and config", time.time())]

    def mark(self, phase: str) -> None:
        self.marks.append((phase, time.time()))

    def line(self) -> str:
        times = [self.started_unix or self.marks[0][1]] + [t for _, t in self.marks]
        phases = ", ".join(f"{phase} {b - a:.2f} s" for (phase, _), a, b in zip(self.marks, times, times[1:]))
        return (f"{self.name}: writing {times[-1] - times[0]:.2f} s after its process started at unix "
                f"{times[0]:.2f} ({phases})")


