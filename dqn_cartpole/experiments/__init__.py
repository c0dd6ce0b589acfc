"""Experiments over many runs: `sweep` (a grid x seeds), `compare` (statistics across seeds) and `tune`
(an Optuna study).

Every run here is an ordinary `python -m dqn_cartpole train ... --quiet` in its own process, and
results are read back through `dqn_cartpole.run_folder`; nothing in this package imports the
trainer or TensorFlow.
"""
