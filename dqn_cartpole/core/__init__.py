"""The agent and everything it acts in: envs, the Q-network, the DQN agent, policies, evaluation, the builder."""
