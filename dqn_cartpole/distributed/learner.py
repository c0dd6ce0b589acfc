"""The `learn` role: the single-process training session, minus collection, reading a remote Reverb.

It is `training.session.TrainingSession` with three parts swapped: the pipeline (a Reverb client
of the server at `--replay-address`, with `rate_limiter_timeout_ms`, and no drivers), the
replay fill (wait until the collectors have written `initial_collect_steps` items) and one
more trigger (push the weights every `distributed.weight_push_interval` train steps). The
compiled gradient step, evaluation, checkpoints, exports, metrics and plots are the same code.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from tf_agents.metrics import tf_metrics

from dqn_cartpole.config import Config
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.core import build
from dqn_cartpole.core.evaluation import make_episode_runner
from dqn_cartpole.core.policies import compiled_act_fn
from dqn_cartpole.distributed.policy_lag import IntervalLag, tagged_sampler
from dqn_cartpole.distributed.variables import WeightSync, check_server
from dqn_cartpole.replay.base import sequence_length_for
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.training.loop import Chunk, make_train_step
from dqn_cartpole.training.pipeline import Pipeline
from dqn_cartpole.training.session import TrainingSession

WAIT_POLL_S = 0.2


class LearnerSession(TrainingSession):
    """A training session whose data comes from collectors in other processes."""

    def __init__(self, config: Config, layout: RunLayout, progress: Progress,
                 plan: Optional[checkpointing.ResumePlan], address: str):
        super().__init__(config, layout, progress, plan)
        self.address = address
        self.sync: Optional[WeightSync] = None
        self.lag = IntervalLag(config.training.log_interval)

    def stage_replay(self, found: Optional[checkpointing.Found]) -> Optional[str]:
        return None  # the server loaded its table when it started (the launcher staged it)

    def make_pipeline(self, reverb_dir: Optional[str]) -> Pipeline:
        cfg, stack = self.config, self.stack
        check_server(self.address, cfg.distributed.connect_timeout_s)
        envs = build.make_envs(cfg, stack)
        agent = build.make_agent(cfg, envs.tf_env)
        replay = build.make_replay_client(cfg.replay, agent.collect_data_spec, cfg.env.num_envs, cfg.agent.n_step,
                                          self.address, stack,
                                          rate_limiter_timeout_ms=cfg.distributed.rate_limiter_timeout_ms)
        return Pipeline(envs, agent, replay, tf_metrics.EnvironmentSteps(), None, None,
                        compiled_act_fn(agent.policy), make_episode_runner(agent.policy, envs.evaluate,
                                                                           gamma=cfg.agent.gamma), stack)

    def fill_replay(self) -> tuple[Any, Any]:
        return (), ()  # the collectors fill it: `iterate` waits for them

    def iterate(self, time_step: Any, policy_state: Any) -> None:
        # Made only now: a restore re-seeds TensorFlow, which clears the eager kernels and with them the
        # TF Reverb client a container made before it ("Resource ... ReverbClient does not exist").
        self.sync = WeightSync(self.address, self.pipeline.agent)
        self.push_weights()  # the collectors start from these weights
        if self.wait_for_data():
            super().iterate((), ())

    def make_train(self) -> Callable:
        """The session's gradient step, on samples that carry their collecting train step (policy lag)."""
        cfg = self.config
        sample = self.pipeline.replay.sampler(cfg.training.batch_size, sequence_length_for(cfg.agent.n_step),
                                              with_info=True)
        return make_train_step(self.pipeline.agent, tagged_sampler(sample), cfg.training.train_steps_per_iteration,
                               cfg.training.jit_compile, tagged=True)

    def after_chunk(self, chunk: Chunk) -> None:
        self.checkpoints.time_step = None  # no env stream here: checkpoints keep no seam
        self.state.policy_lag, self.state.policy_lag_max = self.lag.add(chunk.first, chunk.lags)

    def wait_for_data(self) -> bool:
        """Waits until the replay holds `initial_collect_steps` items, so the first sample finds data."""
        wanted = self.config.training.initial_collect_steps
        while self.pipeline.replay.size() < wanted:
            if self.stop_request.requested:
                return False
            time.sleep(WAIT_POLL_S)
        self.count_env_steps()
        return True

    def count_env_steps(self) -> None:
        """The collectors' env steps, as the items they inserted (one per collected step)."""
        self.pipeline.env_steps.environment_steps.assign(self.pipeline.replay.inserts())

    def push_weights(self) -> None:
        self.sync.push()
        self.count_env_steps()

    def extra_triggers(self) -> list:
        return [(self.config.distributed.weight_push_interval, self.push_weights)]


def learn(config: Config, layout: RunLayout, progress: Progress, plan: Optional[checkpointing.ResumePlan],
          address: str) -> dict:
    """Trains from the server at `address`, writing everything under `layout.root`; returns the summary."""
    return LearnerSession(config, layout, progress, plan, address).run()
