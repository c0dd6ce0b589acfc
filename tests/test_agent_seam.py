"""The agent decides its replay window: the replay, a server's tables, a collector's writers and the train step's
sampler are made for the agent's `window_length` (or, before an agent is built, `core.agents.window_length_for`,
the kind's own declaration), never from `agent.n_step` outside `core/agents/`."""

from __future__ import annotations

import contextlib
import os

import pytest
from tf_agents.environments import tf_py_environment

from dqn_cartpole.config import load_config
from dqn_cartpole.core import agents, build
from dqn_cartpole.core.agents import registry
from dqn_cartpole.replay.reverb_tables import QUEUE_TABLE_NAME

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


@pytest.mark.parametrize("kind,config_file", [("dqn", "default.yaml"), ("double_dqn", "default.yaml"),
                                              ("c51", "c51.yaml")])
def test_each_kind_declares_the_window_its_built_agent_trains_on(kind, config_file):
    config = load_config(os.path.join(CONFIGS, config_file), [f"agent.kind={kind}", "agent.n_step=3"])
    with contextlib.ExitStack() as stack:
        agent = build.make_agent(config, build.make_envs(config, stack).tf_env)
    assert agent.window_length == agents.window_length_for(config.agent) == 4


class LongWindowAgent:
    """An agent that trains on 5-step windows whatever its n_step (as a new agent kind may)."""

    window_length = 5

    def __init__(self, collect_data_spec):
        self.collect_data_spec = collect_data_spec


def test_an_agent_with_its_own_window_gets_a_replay_server_tables_and_writers_of_that_window(monkeypatch):
    config = load_config(os.path.join(CONFIGS, "smoke.yaml"), ["replay.backend=reverb"])
    assert config.agent.n_step + 1 != 5
    with contextlib.ExitStack() as stack:
        env = build.make_env_copies(config, 1, 0, stack)
        spec = build.make_agent(config, tf_py_environment.TFPyEnvironment(env)).collect_data_spec
        # A single process's replay: an embedded server's table and its client's windows are the agent's.
        replay = build.make_replay(config, LongWindowAgent(spec), stack)
        assert replay.sequence_length == 5 and replay.writers.writers[0]._length == 5  # pylint: disable=W0212
        # Before any agent is built (a standalone server, a collector's writers): the kind's declaration.
        monkeypatch.setitem(registry.WINDOW_LENGTHS, "dqn", lambda agent_config: 5)
        (queue,) = build.distributed_replay_tables(config, spec)
        assert queue.name == QUEUE_TABLE_NAME and queue.info.signature.shape[0] == 5
        # An agent whose window differs from its kind's declaration is refused when built.
        with pytest.raises(ValueError, match="WINDOW_LENGTHS"):
            build.make_agent(config, tf_py_environment.TFPyEnvironment(env))
