"""A tracked run's metrics streamed while it trains (`streamed`, around the training of every topology): for
MLflow, a side process (`follower`) tails the run folder's metrics CSVs and sends their new rows every few seconds,
and its first lines say where the run goes; `send.send_run` then sends the rest once the run ended. W&B runs are
written when the run ends (offline by default: nothing is visible before `wandb sync` anyway); their first line says
where. Nothing here imports either library: the training process stays as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
from typing import Callable, Iterator, Optional

from dqn_cartpole.config import Config
from dqn_cartpole.tracking.ledger import local_store, read_ledger
from dqn_cartpole.tracking.sent import DEFAULT_PROJECT, run_name, run_tags

INTERVAL_S = 5.0  # the follower sends new rows at most this often (and at the run's end)
STOP_WAIT_S = 90.0  # its last send, to a server that answers slowly (MLflow's own timeouts bound it too)


class Stream:
    """The follower process of one run, and the thread that prints its lines (where the run goes, a warning)."""

    def __init__(self, process: subprocess.Popen, say: Callable[[str], None]):
        self.process, self.say = process, say
        self.relay = threading.Thread(target=self._relay, name="tracking-lines", daemon=True)
        self.relay.start()

    def _relay(self) -> None:
        """Its lines as they come (a thread blocked in a read takes no CPU and no GIL): warnings on stderr."""
        for line in self.process.stdout:
            line = line.rstrip("\n")
            if line.startswith("warning:"):
                print(line, file=sys.stderr, flush=True)
            elif line:
                self.say(line)

    def stop(self) -> None:
        """Closes its stdin (it sends what is new and exits), and waits for it (bounded)."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.relay.join(5)


def start_stream(config: Config, run_dir: str, say: Callable[[str], None]) -> Stream:
    """Starts the follower of `run_dir` (its own session: Ctrl-C and a sweep's signals reach the run, whose end
    closes the follower's stdin; so does the run's death)."""
    tracking = dataclasses.asdict(config.tracking)
    payload = {"project": tracking.get("project") or DEFAULT_PROJECT, "run_name": run_name(run_dir, tracking),
               "tags": run_tags(config.training.seed, config.env.id, config.agent.kind, run_dir, tracking),
               "interval_s": INTERVAL_S}
    process = subprocess.Popen([sys.executable, "-m", "dqn_cartpole.tracking.follower", run_dir, config.output.root,
                                json.dumps(payload)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    return Stream(process, say)


def wandb_lines(config: Config, run_dir: str) -> list[str]:
    """Where a W&B run goes (it is written when the run ends)."""
    project = config.tracking.project or DEFAULT_PROJECT
    folder = local_store(config.output.root, "wandb")
    before = read_ledger(run_dir, "wandb", f"offline:{project}")
    run = f"run {before.run_id} (continued)" if before else "a run"
    if config.tracking.online:
        return [f"Tracking to W&B: {run} in project {project}, sent when the run ends (online with a W&B login, "
                f"else offline under {folder})"]
    return [f"Tracking to W&B offline: {run} in project {project}, written under {folder} when the run ends; send "
            f"it with: wandb sync {folder}/offline-run-*"]


@contextlib.contextmanager
def streamed(config: Config, run_dir: str, say: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """The block's run tracked as it goes: first lines saying where (`say`, default stdout), MLflow's metrics
    streamed until the block ends. Nothing without tracking."""
    say = say or (lambda line: print(line, flush=True))
    backend = config.tracking.backend
    if backend is None:
        yield
        return
    if backend != "mlflow":
        for line in wandb_lines(config, run_dir):
            say(line)
        yield
        return
    from dqn_cartpole.tracking import mlflow_run

    say(mlflow_run.where_line(mlflow_run.tracking_uri(config.output.root), config.tracking.project or DEFAULT_PROJECT))
    stream = start_stream(config, run_dir, say)
    try:
        yield
    finally:
        stream.stop()
