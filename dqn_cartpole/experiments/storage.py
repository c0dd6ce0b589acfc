"""Where an Optuna study lives: a journal file on one machine, or PostgreSQL/MySQL shared by several
(docs/experiments.md, 'tune: an Optuna study', Storage)."""

from __future__ import annotations

import os
import re
import socket
import warnings
from typing import Optional

from dqn_cartpole.errors import UserError

RDB_SCHEMES = ("postgresql", "postgres", "mysql", "sqlite")
HEARTBEAT_S = 10  # a worker's trials are stale after GRACE_S without a heartbeat
GRACE_S = 30
CONNECT_TIMEOUT_S = 5  # an unreachable server is an error within seconds, not a hang
# The package that installs each driver module SQLAlchemy may ask for: `postgresql://` is psycopg 3 since SQLAlchemy
# 2.1 (the postgres extra), `postgresql+psycopg2://` psycopg2, `mysql://` PyMySQL.
DRIVERS = {"psycopg": '"dqn_cartpole[postgres]"', "psycopg2": "psycopg2-binary", "pymysql": "PyMySQL",
           "MySQLdb": "PyMySQL"}
WORKER_ATTR = "worker"


def describe(url: str) -> str:
    """The URL without its password, for messages."""
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def is_rdb(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] in RDB_SCHEMES and "://" in url


def check_url(url: str) -> None:
    """Refuses what is neither an RDB URL nor a path (e.g. redis://, a typo'd scheme)."""
    if "://" in url and not is_rdb(url):
        raise UserError(f"--storage {describe(url)}: unsupported; use postgresql://, mysql://, sqlite:/// or a "
                        f"journal .log file path")
    if not is_rdb(url):  # a journal file: it, and the folders above it, must be creatable
        from dqn_cartpole.run_folder.resolve import check_can_create

        if os.path.isdir(url):
            example = os.path.join(url, "journal.log")
            raise UserError(f"--storage {url}: is a folder; give a journal file, e.g. {example}")
        check_can_create(url, "--storage ")


def open_storage(url: str):
    """An Optuna storage for `url` (an RDB URL or a journal file path); fails fast if unreachable."""
    import optuna

    if not is_rdb(url):
        from optuna.storages.journal import JournalFileBackend

        folder = os.path.dirname(os.path.abspath(url))
        os.makedirs(folder, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(url))
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    scheme = "postgresql" if scheme == "postgres" else scheme
    engine_kwargs = {"pool_pre_ping": True}
    if scheme in ("postgresql", "mysql"):
        engine_kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat_interval
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=GRACE_S)
    except Exception as exc:  # pylint: disable=broad-except  # SQLAlchemy's OperationalError and kin
        missing = missing_module(exc)
        if missing:
            raise UserError(f"--storage {describe(url)}: needs the {missing} driver (pip install "
                            f"{DRIVERS.get(missing, missing)})") from None
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        raise UserError(f"--storage {describe(url)}: cannot use the database: {reason[0] if reason else exc}") from None


def missing_module(exc: BaseException) -> Optional[str]:
    """The top-level module whose import failed behind `exc` (Optuna re-raises a driver's ModuleNotFoundError as
    its own ImportError), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            return exc.name.split(".")[0]
        exc = exc.__cause__ or exc.__context__
    return None


def worker_id() -> str:
    """host:pid:start-time of this process (the start time tells a reused pid apart)."""
    import psutil

    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.0f}"


def worker_alive(worker: str) -> Optional[bool]:
    """Whether the worker process is alive; None if it ran on another host (cannot tell)."""
    import psutil

    host, _, rest = worker.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        return f"{psutil.Process(int(pid)).create_time():.0f}" == started
    except psutil.Error:
        return False


def fail_dead_workers_trials(storage, study_name: str) -> list[int]:
    """Marks FAILED the RUNNING trials whose worker on this host is gone; returns their numbers."""
    import optuna
    from optuna.trial import TrialState

    study_id = storage.get_study_id_from_name(study_name)
    failed = []
    for trial in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get(WORKER_ATTR)
        if not worker or worker_alive(worker) is not False:
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        try:
            storage.set_trial_user_attr(trial_id, "reason", f"its worker {worker} died while it ran")
            if storage.set_trial_state_values(trial_id, TrialState.FAIL):
                failed.append(trial.number)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker got there first
    return failed
