"""K independent DQN (or Double DQN) runs as one TF-Agents agent: the same `DqnAgent`/`DdqnAgent` classes as a single
run (`dqn`), over the population's ensemble Q-network (`core.ensemble`), with the seeds in the batch dimension.

What keeps the seeds independent, in the train step the project already overrides (`_train`):

* each seed's gradient is its own loss's: TF-Agents averages the loss over all K * B rows, so the loss is scaled
  back by K (d(K * mean over K*B rows)/dW_k = d(mean over seed k's B rows)/dW_k);
* `gradient_clipping` clips each seed's global norm on its own (`clip_per_seed`): one norm across the seeds would
  let one seed's large gradients shrink every other seed's step;
* Adam is elementwise, so one optimizer over the stacked variables keeps each seed's moments apart;
* `seed_rates` says which seeds train (1) and which are held (0: a seed past its solve, `agent.solved_learning_rate`
  0, or one that stopped): a held seed leaves the batch (`ensemble.only_seeds`), so it costs no compute, and its
  weights and train-step count (`seed_train_steps`) stay put (`PopulationAgent.hold_seed`).

The train step returns each seed's loss ([K]), the mean over its B rows: a single run's loss.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from dqn_cartpole.config import AgentConfig, NetworkConfig
from dqn_cartpole.config.population import KINDS  # the agent kinds a population batches
from dqn_cartpole.core import ensemble
from dqn_cartpole.core.agents.common import TfAgentAdapter, agent_args
from dqn_cartpole.core.agents.dqn import TD_LOSSES, DdqnAgent, DqnAgent



def clip_per_seed(grads: Sequence[tf.Tensor], clip_norm: float) -> list:
    """Each seed's gradients ([K, ...] each) scaled as `tf.clip_by_global_norm` scales a single run's: by
    clip_norm / max(norm_k, clip_norm), norm_k the global norm of seed k's slices."""
    squares = tf.add_n([tf.reduce_sum(tf.square(g), axis=list(range(1, g.shape.rank))) for g in grads])
    norms = tf.sqrt(squares)  # [K]
    scale = clip_norm * tf.minimum(1.0 / norms, 1.0 / clip_norm)
    scale = tf.where(tf.math.is_finite(scale), scale, tf.zeros_like(scale))  # a zero norm: nothing to scale
    return [g * tf.reshape(scale, [-1] + [1] * (g.shape.rank - 1)) for g in grads]


class PopulationTrainMixin:
    """The train step of K seeds in one agent (see the module docstring). Set `seeds` before the agent's __init__."""

    seeds: int = 1

    def make_seed_variables(self) -> None:
        """The per-seed rate of each update and train-step count (checkpointed with the agent)."""
        self.seed_rates = tf.Variable(tf.ones([self.seeds]), trainable=False, name="seed_rates")
        self.seed_train_steps = tf.Variable(tf.zeros([self.seeds], tf.int64), trainable=False,
                                            name="seed_train_steps")

    def active_seeds(self) -> tf.Tensor:
        """[K'] the seeds that still train (rate above 0), ascending."""
        return tf.cast(tf.where(self.seed_rates > 0)[:, 0], tf.int32)

    def _train(self, experience, weights):
        variables = self._q_network.trainable_weights
        only = ensemble.current_seeds()  # the batch holds only these seeds' rows (None: every seed's)
        with tf.GradientTape() as tape:
            loss_info = self.train_loss(experience, weights, training=True)
            seeds = float(self.seeds) if only is None else tf.cast(tf.size(only), tf.float32)
            scaled = loss_info.loss * seeds  # each seed's gradient: its own loss's
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled, variables)]  # (gathered: IndexedSlices)
        if only is None:  # a held seed's rows are in the batch: its gradient is dropped here
            grads = [g * tf.reshape(self.seed_rates, [-1] + [1] * (g.shape.rank - 1)) for g in grads]
        if self._gradient_clipping is not None:
            grads = clip_per_seed(grads, self._gradient_clipping)
        # A held seed's gradient is 0, and its Adam first moment was zeroed when it was held (`hold_seed`): Adam's
        # step, lr * m / (sqrt(v) + eps), is then exactly 0, with no masking op per step.
        self._optimizer.apply_gradients(list(zip(grads, variables)))
        self.seed_train_steps.assign_add(tf.cast(self.seed_rates > 0, tf.int64))
        self.train_step_counter.assign_add(1)
        self._update_target()
        rows = self.seeds if only is None else tf.size(only)
        per_seed = tf.reduce_mean(tf.reshape(loss_info.extra.td_loss, [rows, -1]), axis=1)
        if only is not None:  # a held seed's loss: 0 (it trained on nothing)
            per_seed = tf.scatter_nd(only[:, tf.newaxis], per_seed, [self.seeds])
        return loss_info._replace(loss=per_seed)


class PopulationDqnAgent(PopulationTrainMixin, DqnAgent):
    """`dqn.DqnAgent` over K seeds."""


class PopulationDdqnAgent(PopulationTrainMixin, DdqnAgent):
    """`dqn.DdqnAgent` over K seeds."""


class PopulationAgent(TfAgentAdapter):
    """The `ValueAgent` of a population: its train step's loss is [K] (one per seed); it has no NumPy twin (each
    seed's greedy policy is evaluated through a single-seed agent holding its weights: `training.population`)."""

    def __init__(self, agent: PopulationTrainMixin):
        super().__init__(agent, agent._q_network, None)  # pylint: disable=protected-access
        self.seeds = agent.seeds

    def seed_train_steps(self) -> list[int]:
        return [int(n) for n in self.tf_agent.seed_train_steps.numpy()]

    def hold_seed(self, seed_index: int) -> None:
        """Seed `seed_index`'s weights change no more: it leaves the train step's batch, its gradient is 0 from now
        on, and its Adam first moments are zeroed (Adam's step is then exactly 0)."""
        agent = self.tf_agent
        agent.seed_rates.scatter_nd_update([[seed_index]], [0.0])
        for variable in self.q_network.trainable_variables:
            first_moment = agent._optimizer.get_slot(variable, "m")  # pylint: disable=protected-access
            first_moment.scatter_nd_update([[seed_index]], tf.zeros([1, *variable.shape[1:]]))

    def online_variables(self) -> list:
        """The online network's variables, [K, ...] each, in a single-seed network's order."""
        return list(self.q_network.variables)


def build_population_agent(agent_config: AgentConfig, network_config: NetworkConfig, time_step_spec: ts.TimeStep,
                           action_spec: tensor_spec.BoundedTensorSpec, seeds: int) -> PopulationAgent:
    """`seeds` independent agents of `agent_config` (`kind` dqn or double_dqn, a plain network) as one."""
    if agent_config.kind not in KINDS or network_config.dueling or network_config.noisy:
        raise ValueError(f"a population batches dqn and double_dqn over plain networks, not {agent_config.kind}")
    num_actions = int(action_spec.maximum - action_spec.minimum + 1)
    base = PopulationDdqnAgent if agent_config.kind == "double_dqn" else PopulationDqnAgent
    agent_class = type(base.__name__, (base,), {"seeds": seeds})
    agent = agent_class(
        time_step_spec, action_spec,
        q_network=ensemble.build_population_q_network(network_config.fc_layer_params, num_actions, seeds),
        td_errors_loss_fn=TD_LOSSES[agent_config.td_loss],
        **agent_args(agent_config, network_config),
    )
    agent.make_seed_variables()
    agent.initialize()
    return PopulationAgent(agent)
