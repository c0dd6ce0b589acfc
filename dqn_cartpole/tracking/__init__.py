"""Tracking: a run folder sent to MLflow or Weights & Biases once its run ended (`train --track mlflow | wandb`).

What a run sends comes from its folder alone (`sent`: config.yaml, config.written.yaml, the metrics CSVs,
summary.json, the artifacts), so the training is untouched and the time to its policy unchanged; `ledger` keeps the
tracked run's id in the folder, so a resumed run continues it. `send.send_run` is the one entry point: a failure is
one warning line, never the run's. This package imports neither library until a run asks to be tracked.
"""
