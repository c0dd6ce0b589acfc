"""What a population (`train --population`, `sweep --population`: K seeds in one batched graph) can run, as one line
naming the key that stops it."""

from __future__ import annotations

from typing import Optional

from dqn_cartpole.config.resolve import sampling_mode
from dqn_cartpole.config.schema import Config

KINDS = ("dqn", "double_dqn")
BACKENDS = ("tf_uniform", "py_uniform")


def population_problem(config: Config) -> Optional[str]:
    """Why a population cannot run `config` (one line, naming the key), or None."""
    agent, network, replay = config.agent, config.network, config.replay
    checks = [
        (agent.kind not in KINDS, f"agent.kind: {agent.kind}: a population batches dqn and double_dqn only"),
        (network.dueling, "network.dueling: a population batches plain networks only (no dueling head)"),
        (network.noisy, "network.noisy: a population batches plain networks only (no noisy layers)"),
        (replay.prioritized, "replay.prioritized: a population samples uniformly only"),
        (replay.backend not in BACKENDS, f"replay.backend: {replay.backend}: a population keeps its seeds' replay in "
                                         f"its own process; use tf_uniform or py_uniform"),
        (sampling_mode(replay) != "direct", "replay.sampling: dataset: a population samples directly (direct)"),
        (config.env.num_envs != 1, f"env.num_envs: {config.env.num_envs}: a population steps one env per seed"),
        (config.collection.driver != "compiled", "collection.driver: py: a population collects in the compiled loop"),
        (config.tracking.backend is not None, f"tracking.backend: {config.tracking.backend}: a population is not "
                                              f"tracked yet; track single runs or sweeps without --population"),
        (_changes_solved_seed(config), "agent.solved_learning_rate: a population holds a solved seed's weights (0) but "
                                       "cannot train one seed on at another rate or change its target updates"),
    ]
    return next((line for failed, line in checks if failed), None)


def _changes_solved_seed(config: Config) -> bool:
    agent = config.agent
    acts = any(v is not None for v in (agent.solved_learning_rate, agent.solved_target_update_period,
                                       agent.solved_target_update_tau))
    return not config.evaluation.stop_when_solved and acts and agent.solved_learning_rate != 0
