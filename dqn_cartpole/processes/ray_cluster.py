"""Ray, for the commands that ask for it: the optional extra, the cluster a command joins, or the local
instance it starts for itself, and the one-line errors of both.

`train --topology ray`, `sweep --ray` and `tune --ray` take the cluster from `--address HOST:PORT`, else from
`RAY_ADDRESS`; with neither they start a Ray instance on this machine for the command and shut it down at its
end. Ray is an extra (`pip install "dqn_cartpole[ray]"`): without it such a command is one line and exit
status 2, before anything is created. An address where nothing answers is one line too, within the
command's connect timeout: `ray.init` itself would retry for minutes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from dqn_cartpole.errors import UserError

EXTRA = "ray"
INSTALL_HINT = 'pip install "dqn_cartpole[ray]" (in a checkout: pip install -e ".[ray]")'
ADDRESS_ENV = "RAY_ADDRESS"
# A local instance's object store: a run's results are small (a run folder, some MB); Ray's default is 30% of RAM.
LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024


def import_ray(what: str) -> Any:
    """The `ray` module, or a one-line UserError naming the extra that `what` (e.g. '--topology ray') needs."""
    try:
        import ray  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise UserError(f"{what} needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def ray_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def cluster_address(given: Optional[str]) -> Optional[str]:
    """The cluster to join: `--address`, else RAY_ADDRESS, else None (start a local instance)."""
    return given or os.environ.get(ADDRESS_ENV) or None


def parse_cluster_address(address: str, flag: str = "--address") -> Optional[tuple[str, int]]:
    """HOST:PORT (or ray://HOST:PORT) -> (host, port); None for 'auto' (a cluster `ray start` began on this
    machine, which ray.init finds itself); a one-line UserError otherwise."""
    if address == "auto":
        return None
    text = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{flag} {address!r}: expected HOST:PORT of a Ray cluster's head, e.g. 10.0.0.1:6379, "
                        f"or auto")
    return host.strip("[]"), int(port)


# A Ray cluster's head answers this call of its GCS (OK, or UNAUTHENTICATED under Ray's token auth); a port that
# only accepts TCP, or a proxy in between, does not. `ray.init` on a silent address would retry for minutes.
_GCS_PROBE = "/ray.rpc.NodeInfoGcsService/GetClusterId"


def check_answers(address: str, timeout_s: float, flag: str = "--address") -> None:
    """A one-line UserError unless a Ray cluster's head answers at `address` within `timeout_s`."""
    import grpc  # pylint: disable=import-outside-toplevel  # gRPC comes with TensorFlow and Ray

    parsed = parse_cluster_address(address, flag)
    if parsed is None:
        return
    host, port = parsed
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    channel = grpc.insecure_channel(target)
    try:
        channel.unary_unary(_GCS_PROBE)(b"", timeout=timeout_s)
        return
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:  # a Ray head under token authentication
            problem = _token_problem(channel, timeout_s)
            if problem is None:
                return
            raise UserError(f"{flag} {address}: {problem}") from None
        if code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT):
            return
        why = {grpc.StatusCode.DEADLINE_EXCEEDED: "timed out", grpc.StatusCode.UNAVAILABLE: "nothing listens",
               grpc.StatusCode.UNIMPLEMENTED: "what answers is not a Ray cluster"}.get(code, code.name.lower())
    finally:
        channel.close()
    raise UserError(f"{flag} {address}: no Ray cluster answers there within {timeout_s:g} s ({why}); start one "
                    f"with `ray start --head`, or leave out {flag} and RAY_ADDRESS for a local instance")


# Ray's token authentication (on by default for a local `ray.init()` from Ray 2.59, and for `ray start --head` when
# ~/.ray/auth_token exists): a driver that joins by address only sends the token with RAY_AUTH_MODE=token, and
# `ray.init` without it retries for 20 s, logging a warning every second, before a ConnectionError.
AUTH_MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
TOKEN_HINT = "the head's token in ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN"


def local_token() -> tuple[Optional[str], str]:
    """The token Ray would send from this process, and where it comes from (Ray's order of precedence)."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip(), TOKEN_ENV
    path = os.environ.get(TOKEN_PATH_ENV) or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or None, path
    except OSError:
        return None, path


def _token_problem(channel, timeout_s: float) -> Optional[str]:
    """Why this process cannot pass the head's token authentication (None: it can)."""
    import grpc  # pylint: disable=import-outside-toplevel

    if os.environ.get(AUTH_MODE_ENV, "").lower() != "token":
        return f"the cluster uses token authentication: set {AUTH_MODE_ENV}=token, with {TOKEN_HINT}"
    token, source = local_token()
    if token is None:
        return f"the cluster uses token authentication and this machine has no token ({source}): give it {TOKEN_HINT}"
    try:
        channel.unary_unary(_GCS_PROBE)(b"", timeout=timeout_s, metadata=[("authorization", f"Bearer {token}")])
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            return f"the cluster refuses this machine's token (from {source}): give it {TOKEN_HINT}"
    return None


@dataclass(frozen=True)
class Session:
    """The cluster a command runs on: its address and whether this command started it."""

    address: str
    started_here: bool


@contextlib.contextmanager
def ray_session(address: Optional[str], connect_timeout_s: float, what: str, num_cpus: Optional[int] = None,
                flag: str = "--address") -> Iterator[Session]:
    """Joins the cluster `address` (or RAY_ADDRESS) names, or starts a local Ray instance with `num_cpus`
    (None: the machine's), for the `with` block; `ray.shutdown()` at its end (a local instance stops with it).

    Bad input (no Ray, a malformed or silent address) is a one-line UserError raised before Ray starts.
    """
    ray = import_ray(what)
    address = cluster_address(address)
    if address is not None:
        check_answers(address, connect_timeout_s, flag)
    options: dict = {"log_to_driver": False, "configure_logging": False}
    if address is None:
        options.update(num_cpus=num_cpus, include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES)
        # Ray turns token authentication on for a local instance, and says so in a warning on every start.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    try:  # "local": a new instance, never one that `ray start` left running on this machine (ray.init's default)
        context = ray.init(address=address or "local", **options)
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = f"{flag} {address}" if address else "a local Ray instance"
        raise UserError(f"{where}: cannot start Ray: {first}") from None
    try:
        yield Session(address=context.address_info.get("gcs_address", address or ""), started_here=address is None)
    finally:
        ray.shutdown()
