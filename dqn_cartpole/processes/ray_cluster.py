"""Ray, for the commands that ask for it: the optional extra, the cluster a command joins, or the local
instance it starts for itself, and the one-line errors of both.

`train --topology ray`, `sweep --ray` and `tune --ray` find their cluster as Ray's own `ray.init()` does: from
`--address HOST:PORT`, else from `RAY_ADDRESS`, else the cluster that the latest `ray start` began on this machine
(they say so in one line); with none of these, or with `--address local`, they start a private Ray instance on this
machine for the command and shut it down at its end. A private instance's token (Ray turns token authentication on
for it) is kept in a file of the command's own, mode 0600, removed at its end: nothing is written under HOME. Ray is
an extra (`pip install "dqn_cartpole[ray]"`): without it such a command is one line and exit status 2, before
anything is created. An address where nothing answers is one line too, within the command's connect timeout:
`ray.init` itself would retry for minutes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from dqn_cartpole.errors import UserError
from dqn_cartpole.processes import ray_private

INSTALL_HINT = 'pip install "dqn_cartpole[ray]" (in a checkout: pip install -e ".[ray]")'
ADDRESS_ENV = "RAY_ADDRESS"
# A local instance's object store: a run's results are small (a run folder, some MB); Ray's default is 30% of RAM.
LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024
START_ATTEMPTS = 2  # a private instance that does not come up is started once more (see `init_ray`)


def import_ray(what: str) -> Any:
    """The `ray` module, or a one-line UserError naming the extra that `what` (e.g. '--topology ray') needs."""
    try:
        import ray  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise UserError(f"{what} needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


LOCAL = "local"  # as an address: a private instance, even beside a `ray start` cluster (Ray's own word)


def cluster_address(given: Optional[str]) -> Optional[str]:
    """The cluster named: `--address`, else RAY_ADDRESS, else None (this machine's `ray start` cluster, if any)."""
    return given or os.environ.get(ADDRESS_ENV) or None


def this_machines_cluster() -> Optional[str]:
    """The address of the cluster that the latest `ray start` began on this machine, as Ray records it for its own
    `ray.init()` (None: there is none): Ray's private API, so `ray_private` reads it."""
    return ray_private.read_ray_address()


def parse_cluster_address(address: str, flag: str = "--address") -> Optional[tuple[str, int]]:
    """HOST:PORT (or ray://HOST:PORT) -> (host, port); None for 'auto' (a cluster `ray start` began on this
    machine, which ray.init finds itself) and 'local' (a private instance); a one-line UserError otherwise."""
    if address in ("auto", LOCAL):
        return None
    text = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{flag} {address!r}: expected HOST:PORT of a Ray cluster's head, e.g. 10.0.0.1:6379, "
                        f"auto, or local (a private instance)")
    return host.strip("[]"), int(port)


# A Ray cluster's head answers this call of its GCS (OK, or UNAUTHENTICATED under Ray's token auth); a port that
# only accepts TCP, or a proxy in between, does not. `ray.init` on a silent address would retry for minutes.
_GCS_PROBE = "/ray.rpc.NodeInfoGcsService/GetClusterId"


# How long past its own deadline a probe may take before this process stops waiting for gRPC to end it.
PROBE_BACKSTOP_S = 1.0


def _probe(channel, timeout_s: float, metadata: Optional[list] = None) -> Any:
    """The GCS call's status code (grpc.StatusCode.OK when it answered). gRPC's deadline is `timeout_s`, and the
    wait is bounded by this process's clock as well, so the one line within the connect timeout does not rest on
    gRPC's timers alone: past the backstop the call is cancelled and read as timed out. (Added for a 38 s stall of
    a 2 s check in a CI pytest worker; the stall came back once with the backstop in place, so its cause lies
    elsewhere, and it was not found.)"""
    import grpc  # pylint: disable=import-outside-toplevel

    future = channel.unary_unary(_GCS_PROBE).future(b"", timeout=timeout_s, metadata=metadata)
    try:
        future.result(timeout=timeout_s + PROBE_BACKSTOP_S)
        return grpc.StatusCode.OK
    except grpc.FutureTimeoutError:
        future.cancel()
        return grpc.StatusCode.DEADLINE_EXCEEDED
    except grpc.RpcError as exc:
        return exc.code()


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
        code = _probe(channel, timeout_s)
        if code == grpc.StatusCode.UNAUTHENTICATED:  # a Ray head under token authentication
            problem = _token_problem(channel, timeout_s)
            if problem is None:
                return
            raise UserError(f"{flag} {address}: {problem}")
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
    if _probe(channel, timeout_s, metadata=[("authorization", f"Bearer {token}")]) == grpc.StatusCode.UNAUTHENTICATED:
        return f"the cluster refuses this machine's token (from {source}): give it {TOKEN_HINT}"
    return None


@dataclass(frozen=True)
class Session:
    """The cluster a command runs on: its address, and how the command came to it (its one line)."""

    address: str
    how: str


def choose_cluster(address: Optional[str], connect_timeout_s: float, flag: str) -> tuple[Optional[str], str]:
    """(the address to join, None for a private instance; how it was chosen), as `ray.init()` chooses: the
    address named, else this machine's `ray start` cluster, else a private instance. A named address that does
    not answer is a one-line UserError; a `ray start` cluster that no longer answers is passed over, in one line."""
    if address is not None and address != LOCAL:
        check_answers(address, connect_timeout_s, flag)
        return address, f"joined the Ray cluster at {address}"
    if address is None:
        found = this_machines_cluster()
        if found is not None:
            try:
                check_answers(found, connect_timeout_s)
            except UserError as exc:
                why = str(exc).split(": ", 1)[-1].split(";")[0]
                print(f"note: the Ray cluster that `ray start` began on this machine, at {found}, does not answer "
                      f"({why}); starting a local Ray instance instead", file=sys.stderr, flush=True)
            else:
                return found, (f"joined the Ray cluster that `ray start` began on this machine, at {found} "
                               f"(--address local for a private instance instead)")
    return None, "started a local Ray instance"


@contextlib.contextmanager
def private_token() -> Iterator[None]:
    """For a private instance, unless the user gave a token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH): a new token in
    a file of this command's own (mode 0600, in a folder only its owner reads), for the block. Ray would otherwise
    write one to ~/.ray/auth_token, readable by others, which every later `ray start --head` on the machine takes
    as an order to turn token authentication on."""
    if os.environ.get(TOKEN_ENV) or os.environ.get(TOKEN_PATH_ENV):
        yield
        return
    folder = tempfile.mkdtemp(prefix="dqn_cartpole-ray-")  # mode 0700
    path = os.path.join(folder, "auth_token")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(secrets.token_hex(32))
    os.environ[TOKEN_PATH_ENV] = path
    try:
        yield
    finally:
        if os.environ.get(TOKEN_PATH_ENV) == path:
            del os.environ[TOKEN_PATH_ENV]
        shutil.rmtree(folder, ignore_errors=True)


def init_ray(ray: Any, address: Optional[str], options: dict, flag: str, attempts: int = START_ATTEMPTS) -> Any:
    """`ray.init`: joins `address`, or starts a private instance (LOCAL: never one that `ray start` left running on
    this machine). A private instance that does not come up in time is started again once: on a loaded machine
    (load 15-20 on 2 cores) Ray's raylet missed Ray's own fixed 30 s to register, and Ray raised a bare Exception,
    leaving its processes running. What failed is one line (a UserError)."""
    import psutil  # pylint: disable=import-outside-toplevel

    for attempt in range(1, attempts + 1):
        ours = set(psutil.Process().children(recursive=True))
        try:
            return ray.init(address=address or LOCAL, **options)
        except Exception as exc:  # pylint: disable=broad-except  # Ray's start-up raises bare Exceptions too
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            left = set(psutil.Process().children(recursive=True)) - ours  # what the failed start left (none if joined)
            for process in left:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            psutil.wait_procs(list(left), timeout=10)
            with contextlib.suppress(Exception):
                ray.shutdown()
            if address is not None or attempt == attempts:
                where = f"{flag} {address}" if address else "a local Ray instance"
                raise UserError(f"{where}: cannot start Ray: {first}") from None
            load = "/".join(f"{value:.1f}" for value in os.getloadavg())
            print(f"note: the local Ray instance did not start ({first}; load average {load}); starting it again",
                  file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def ray_session(address: Optional[str], connect_timeout_s: float, what: str, num_cpus: Optional[int] = None,
                flag: str = "--address") -> Iterator[Session]:
    """Joins the cluster `address` (or RAY_ADDRESS, or this machine's `ray start`) names, or starts a private Ray
    instance with `num_cpus` (None: the machine's), for the `with` block; `ray.shutdown()` at its end (a private
    instance stops with it).

    Bad input (no Ray, a malformed or silent address) is a one-line UserError raised before Ray starts.
    """
    ray = import_ray(what)
    address, how = choose_cluster(cluster_address(address), connect_timeout_s, flag)
    options: dict = {"log_to_driver": False, "configure_logging": False}
    if address is None:
        options.update(num_cpus=num_cpus, include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES)
        ray_private.quiet_token_notice()
    with contextlib.ExitStack() as stack:
        if address is None:
            stack.enter_context(private_token())
        context = init_ray(ray, address, options, flag)
        try:
            yield Session(address=context.address_info.get("gcs_address", address or ""), how=how)
        finally:
            ray.shutdown()
