"""A new agent is one module plus its config: tests/fake_agent.py (no TF-Agents agent class, its own loss, no NumPy
twin, a constant epsilon), registered from outside the package as `agent.kind: fake_q`, runs a whole short `train`
in this process through `dqn_cartpole.train` and the agent interface alone."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import fake_agent
from helpers import rows

import dqn_cartpole as dq
from dqn_cartpole.config import load_config
from dqn_cartpole.core.agents import ValueAgent, registry
from dqn_cartpole.errors import ConfigError


@pytest.fixture
def fake_kind():
    registry.register(fake_agent.KIND, fake_agent.build_fake_agent)
    try:
        yield fake_agent.KIND
    finally:
        registry.unregister(fake_agent.KIND)


def test_an_unregistered_kind_is_one_line_and_a_registered_one_loads(fake_kind):
    assert load_config(None, [f"agent.kind={fake_kind}"]).agent.kind == fake_kind
    registry.unregister(fake_kind)
    with pytest.raises(ConfigError, match=r"agent.kind: must be one of dqn, double_dqn, c51, got 'fake_q'"):
        load_config(None, [f"agent.kind={fake_kind}"])
    with pytest.raises(ValueError, match="shipped"):
        registry.unregister("c51")
    registry.register(fake_kind, fake_agent.build_fake_agent)  # for the fixture's own unregister


def test_a_fake_agent_trains_a_whole_run_through_the_interface(fake_kind, tmp_path, monkeypatch):
    built = []
    monkeypatch.setitem(registry.BUILDERS, fake_kind, lambda *args: built.append(fake_agent.build_fake_agent(*args))
                        or built[-1])
    run = dq.train("smoke", tmp_path / "run", progress=False, overrides={
        "agent.kind": fake_kind, "agent.td_loss": "huber", "agent.n_step": 2, "video.enabled": False,
        "output.tensorboard": False, "training.num_iterations": 200, "training.checkpoint_interval": 100,
        "evaluation.eval_interval": 100})
    assert run.summary["exit_status"] == 0 and run.config.agent.kind == fake_kind
    (agent,) = built  # the run's agent is the fake, built once, and holds the interface
    assert isinstance(agent, ValueAgent) and agent.window_length == 3
    train = rows(os.path.join(run.path, "train_metrics.csv"))
    assert [int(r["train_step"]) for r in train] == [50, 100, 150, 200]
    assert all(np.isfinite(float(r["loss"])) and float(r["epsilon"]) == fake_agent.EPSILON for r in train)
    assert len({r["mean_max_q"] for r in train}) > 1  # its Q-values, probed as they train
    evals = rows(os.path.join(run.path, "eval_metrics.csv"))
    assert [int(r["train_step"]) for r in evals] == [0, 100, 200] and all(float(r["average_return"]) > 0 for r in evals)
    assert "evaluations (another process)" not in run.summary.get("parallel", {})  # no NumPy twin: in line
    checkpoint = os.path.join(run.path, "checkpoints", "ckpt-0000000200", "tf", "ckpt")
    assert any(name.startswith(fake_agent.CHECKPOINT_NAME) for name, _ in tf.train.list_variables(checkpoint))
    policy = tf.saved_model.load(os.path.join(run.path, "policy", "final"))
    assert int(policy.get_train_step().numpy()) == 200
    for saved, live in zip(policy.model_variables, agent.policy.variables()):
        np.testing.assert_array_equal(saved.numpy(), live.numpy())  # its own greedy policy, exported
    assert not os.path.exists(os.path.join(run.path, "atoms.json"))

