"""The single-process training run: the session's phases, the compiled loop, triggers, resume and the run state."""

from dqn_cartpole.training.session import train

__all__ = ["train"]
