"""A run folder sent to Weights & Biases: offline by default (the run is written under output.root/wandb/ and sent
later with `wandb sync outputs/wandb/offline-run-*`), online only when the config asks for it (tracking.online)
and a W&B login is found (WANDB_API_KEY or `wandb login`).

The resolved config (with what the user changed and the provenance) is the run's config; each train step's metrics
(train rows and evaluations, `env_steps` beside them) are one history step; the outcome is the run's summary; the
files are one artifact of type `run_folder`. A sweep's runs share a group, a resumed run continues its W&B run.
"""

from __future__ import annotations

import os
from typing import Callable

from dqn_cartpole.tracking.ledger import read_ledger, sent_through, write_ledger
from dqn_cartpole.tracking.sent import Sent

BACKEND = "wandb"
MAX_TAG_CHARS = 64  # W&B refuses longer tags


def logged_in() -> bool:
    """Whether an API key is at hand (WANDB_API_KEY, or the netrc entry `wandb login` writes)."""
    from wandb.apis import InternalApi

    try:
        return bool(InternalApi().api_key)
    except Exception:  # pylint: disable=broad-except  # no settings, no key
        return False


def mode(online: bool, say: Callable[[str], None]) -> str:
    """online when asked for and logged in; offline otherwise (a line says why when online was asked for)."""
    if not online:
        return "offline"
    if logged_in():
        return "online"
    say("warning: tracking.online: no W&B login (wandb login, or WANDB_API_KEY); the run is written offline, send "
        "it later with wandb sync")
    return "offline"


def send(sent: Sent, output_root: str, online: bool, say: Callable[[str], None]) -> str:
    """Writes (or sends) `sent` as a W&B run, continuing the folder's earlier run; returns the run's id."""
    import wandb

    run_mode = mode(online, say)
    store = f"{run_mode}:{sent.project}"
    before = read_ledger(sent.run_dir, BACKEND, store)
    folder = os.path.abspath(output_root)
    os.makedirs(folder, exist_ok=True)
    run = wandb.init(project=sent.project, name=sent.run_name, group=sent.group, tags=tag_list(sent),
                     config=run_config(sent), dir=folder, mode=run_mode, id=before.run_id if before else None,
                     resume="allow" if before else None,
                     settings=wandb.Settings(silent=True, quiet=True, console="off", save_code=False,
                                             disable_git=True, x_disable_stats=True))
    try:
        run.define_metric("env_steps")
        log_history(run, sent, before)
        run.summary.update({f"outcome/{key}": value for key, value in sent.outcome.items()})
        log_files(run, wandb, sent)
        write_ledger(sent.run_dir, sent_through(BACKEND, store, run.id, sent.train_rows, sent.eval_rows))
    finally:
        run.finish(exit_code=0 if sent.status == "FINISHED" else 1)
        wandb.teardown()  # waits for W&B's service to write the run out (else at this process's exit)
    return run.id


def tag_list(sent: Sent) -> list:
    """W&B's tags (plain strings): seed=N, env, agent, the group and the user's own."""
    chosen = {key: sent.tags[key] for key in ("seed", "env", "agent", "group") if key in sent.tags}
    chosen.update({key: value for key, value in sent.tags.items()
                   if not key.startswith("changed.") and key not in ("run_dir", *chosen)})
    return [(f"{key}={value}" if value else key)[:MAX_TAG_CHARS] for key, value in chosen.items()]


def run_config(sent: Sent) -> dict:
    """The resolved config by section, what the user changed, the provenance and the run folder."""
    config: dict = {}
    for dotted, value in sent.params.items():
        section, key = dotted.split(".", 1)
        config.setdefault(section, {})[key] = list(value) if isinstance(value, tuple) else value
    changed = {key[len("changed."):]: value for key, value in sent.tags.items() if key.startswith("changed.")}
    return {**config, "changed": changed, "provenance": sent.provenance, "run_dir": sent.tags.get("run_dir")}


def log_history(run, sent: Sent, before) -> None:
    """One history step per train step not sent before: its train row's and evaluation's values, and env_steps."""
    steps: dict = {}
    for rows, last in ((sent.train_rows, before.train_step if before else -1),
                       (sent.eval_rows, before.eval_step if before else -1)):
        for row in rows:
            if row.train_step > last:
                steps.setdefault(row.train_step, {"env_steps": row.env_steps}).update(row.values)
    for step in sorted(steps):
        run.log({**steps[step], "train_step": step}, step=step)


def log_files(run, wandb, sent: Sent) -> None:
    """The plots, videos, report.html, config and summary files and policy/final, as one `run_folder` artifact."""
    artifact = wandb.Artifact(f"run-{run.id}", type="run_folder")
    for folder, paths in sent.artifacts.items():
        for path in paths:
            name = os.path.join(folder, os.path.basename(path)) if folder else os.path.basename(path)
            for file, inside in files_in(path, name):
                artifact.add_file(file, name=inside)
    run.log_artifact(artifact)


def files_in(path: str, name: str) -> list:
    """(file, its name in the artifact) for a file, or for each file under a folder (add_dir prints a line)."""
    if not os.path.isdir(path):
        return [(path, name)]
    return [(os.path.join(top, file), os.path.join(name, os.path.relpath(os.path.join(top, file), path)))
            for top, _, files in os.walk(path) for file in sorted(files)]
