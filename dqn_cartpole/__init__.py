"""Train, watch and understand a Deep Q-Network on CartPole with TF-Agents and Reverb."""

__version__ = "0.1.0"
