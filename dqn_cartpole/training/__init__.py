"""The training run: the session's phases (`session`), built from parts (`parts`; a single process's in `local`),
the compiled loop, triggers, checkpoints and the run state. `training.run` starts one; `training.session.train` is
the session itself."""
