"""What `auto` and null mean for a config: the values the config resolves before a run, so a run's config.yaml says
what ran."""

from __future__ import annotations

import dataclasses
from typing import Any

from dqn_cartpole.config.schema import C51_DEFAULTS, AgentConfig, Config, ReplayConfig


def sampling_mode(replay: ReplayConfig) -> str:
    """'direct' or 'dataset': `auto` reads Reverb through tf.data and the uniform buffers directly."""
    if replay.sampling != "auto":
        return replay.sampling
    return "dataset" if replay.backend == "reverb" else "direct"


def c51_values(agent: AgentConfig) -> tuple[int, float, float]:
    """(num_atoms, min_q_value, max_q_value) of a C51 agent, null meaning `C51_DEFAULTS`."""
    def value(key: str) -> Any:
        given = getattr(agent, key)
        return C51_DEFAULTS[key] if given is None else given

    return value("num_atoms"), value("min_q_value"), value("max_q_value")


def resolve_auto(config: Config) -> Config:
    """Replaces `auto` settings by what they stand for, so a run's config.yaml says what ran."""
    replay = dataclasses.replace(config.replay, sampling=sampling_mode(config.replay))
    agent = config.agent
    if agent.kind == "c51":
        agent = dataclasses.replace(agent, **dict(zip(("num_atoms", "min_q_value", "max_q_value"), c51_values(agent))))
    return dataclasses.replace(config, replay=replay, agent=agent)
