"""The single-process training run: the session's phases, the compiled loop, triggers, checkpoints and the run
state. `training.run` starts one; `training.session.train` is the session itself."""
