"""The agent and everything it acts in: envs, the Q-network, the DQN agent, policies, evaluation, the builder."""

from dqn_cartpole.console.quiet import silence_gym_notice

silence_gym_notice()  # before anything here imports TF-Agents, which imports gym (see silence_gym_notice)
