"""Fast batched action selection for TF policies, saved policies and the random policy.

A policy here is reduced to `act(time_step) -> actions`, numpy in and out, so evaluation and
video recording don't care whether it came from the agent, a SavedModel or a coin flip.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import tensorflow as tf
from tf_agents.policies import random_py_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

ActFn = Callable[[ts.TimeStep], np.ndarray]


def compiled_act_fn(policy, time_step_spec: Optional[ts.TimeStep] = None) -> ActFn:
    """Wraps `policy.action` in one compiled call per batched step.

    Works for an in-memory TFPolicy and for a policy loaded with `tf.saved_model.load`.
    """
    spec = time_step_spec if time_step_spec is not None else policy.time_step_spec
    signature = tensor_spec.add_outer_dim(spec)  # any batch size, one trace

    @tf.function(input_signature=[signature], autograph=False)
    def action(time_step):
        return policy.action(time_step).action

    def act(time_step: ts.TimeStep) -> np.ndarray:
        return action(time_step).numpy()

    return act


def random_act_fn(time_step_spec, action_spec, seed: Optional[int] = None) -> ActFn:
    """Uniformly random actions from TF-Agents' RandomPyPolicy."""
    policy = random_py_policy.RandomPyPolicy(
        tensor_spec.to_nest_array_spec(time_step_spec), tensor_spec.to_nest_array_spec(action_spec), seed=seed,
        outer_dims=None,
    )

    def act(time_step: ts.TimeStep) -> np.ndarray:
        batch = np.asarray(time_step.step_type).shape[0]
        return np.stack([policy.action(ts.TimeStep(*[np.asarray(x)[i] for x in time_step])).action
                         for i in range(batch)])

    return act
