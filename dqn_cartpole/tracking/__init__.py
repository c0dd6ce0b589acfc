"""Tracking: a run folder tracked in MLflow or Weights & Biases (`train --track mlflow | wandb`).

What a run sends comes from its folder alone (`sent`: config.yaml, config.written.yaml, the metrics CSVs,
summary.json, the artifacts), so the training is untouched: `stream.streamed` says where the run goes and, for MLflow,
has a side process (`follower`) send the metrics CSVs' new rows while the run trains; `send.send_run` sends the rest
once the run ended. `ledger` keeps the tracked run's id and the last rows sent in the folder, so the end's send and a
resumed run continue the same tracked run. A failure is one warning line, never the run's; a tracker whose extra is
missing is refused before the run starts (`send.check_installed`). The training process imports neither library
while it trains (the end's send imports one once the run ended).
"""
