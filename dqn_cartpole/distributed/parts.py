"""What every role builds first, from the builder: its envs and an agent (for the data spec and the weights),
and for the learner and the evaluator, a pipeline around the run's replay (the learner's own buffer fed from the
server's queue, or a client of the server's replay table)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator, Optional

from tf_agents.environments import tf_py_environment

from dqn_cartpole.config import Config
from dqn_cartpole.console import exit_status, signals
from dqn_cartpole.core import build, envs
from dqn_cartpole.distributed.variables import check_server
from dqn_cartpole.replay import deadlines

# Collector i steps its envs on seed + COLLECTOR_SEED_OFFSET * (i + 1): streams apart from the learner's envs.
COLLECTOR_SEED_OFFSET = 100_000


def agent_with_envs(config: Config, copies: int, seed: int, stack: contextlib.ExitStack
                    ) -> tuple[envs.BatchedGymnasiumEnvironment, tf_py_environment.TFPyEnvironment, Any]:
    """`copies` envs on `seed`, their TF wrapper and the configured agent for their specs."""
    env = build.make_env_copies(config, copies, seed, stack)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    return env, tf_env, build.make_agent(config, tf_env)


def remote_pipeline(config: Config, address: str, stack: contextlib.ExitStack,
                    make_replay: Optional[Callable[[Any], Any]] = None) -> Any:
    """What a learner or an evaluator is made of: the run's envs and agent, the replay `make_replay(agent)`
    builds (none for the evaluator), no drivers (the collectors are other processes), the greedy policy and
    its evaluation."""
    from tf_agents.metrics import tf_metrics

    from dqn_cartpole.core.evaluation import make_episode_runner
    from dqn_cartpole.core.policies import compiled_act_fn, greedy_policy
    from dqn_cartpole.training.pipeline import Pipeline

    run_envs = build.make_envs(config, stack)
    agent = build.make_agent(config, run_envs.tf_env)
    # Only now: the roles start with the server, and building the agent overlaps its start-up.
    check_server(address, config.distributed.connect_timeout_s)
    replay = make_replay(agent) if make_replay is not None else None
    return Pipeline(run_envs, agent, replay, tf_metrics.EnvironmentSteps(), None, None, compiled_act_fn(agent.policy),
                    make_episode_runner(greedy_policy(agent), run_envs.evaluate, gamma=config.agent.gamma), stack)


class CollectedSteps:
    """The collectors' env steps as the server counts them: the items inserted into the table they write first
    (every collected step starts one window)."""

    TIMEOUT_S = 10

    def __init__(self, config: Config, address: str):
        import reverb

        self.client = reverb.Client(address)
        self.table = build.distributed_writer_tables(config)[0]

    def __call__(self) -> int:
        info = deadlines.server_info(self.client, self.TIMEOUT_S)[self.table]
        return int(info.rate_limiter_info.insert_stats.completed)


def count_env_steps(pipeline: Any, steps: Callable[[], int]) -> int:
    """Keeps `steps()`, the env steps behind the pipeline's weights, in its env-step counter; returns them."""
    count = steps()
    pipeline.env_steps.environment_steps.assign(count)
    return count


@contextlib.contextmanager
def lost_server_ends(role: str, address: str, stop: signals.StopRequest) -> Iterator[None]:
    """Around a collector's or the evaluator's work: a call to the server that failed or timed out (a
    `deadlines.ServerProblem`) ends the role, quietly after a stop signal (its exit status says the signal),
    else with one line and exit status EXIT_CRASHED (the launcher starts it again after a backoff)."""
    try:
        yield
    except deadlines.ServerProblem as exc:
        if stop.requested:
            return
        print(f"error: {role} lost the replay server at {address} ({exc})", file=sys.stderr, flush=True)
        raise SystemExit(exit_status.EXIT_CRASHED) from None
