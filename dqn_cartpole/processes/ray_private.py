"""Every use of Ray's private API, in this one module: what Ray 2.60 offers no public option for.

* `read_ray_address`: the address of the cluster that the latest `ray start` began on this machine, as Ray records it
  for its own `ray.init()` (a command without `--address` joins it, as `ray.init()` would).
* `cluster_errors_to`: the errors the cluster publishes to a driver (a worker died; a node died, with its raylet's last
  20 log lines). Ray's driver prints each on stdout from a thread that `ray.init` starts (`listen_error_messages`,
  through `print_to_stdstream` with the pid "raylet"), whatever `log_to_driver` says; within the block each goes to
  a function of the caller's instead (one line on stderr for `sweep`/`tune --ray`, a log file for `--topology ray`).
* `quiet_token_notice`: Ray turns token authentication on for a local instance when a token is at hand (a private
  instance's own, `ray_cluster.private_token`) and says so in a warning on every start. Saying the mode instead
  (RAY_AUTH_MODE=token, its documented variable) silences it, but this process's Ray has read its config by then and
  would not send the token: its logger, named after its private module, is quieted instead.

tests/test_ray_private.py fails loudly when a Ray release moves or changes either.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterator, Optional

RAYLET = "raylet"  # the pid Ray's driver gives the messages the cluster publishes
TOKEN_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"


def read_ray_address() -> Optional[str]:
    """The cluster address of this machine's latest `ray start` (None: there is none)."""
    from ray._private.utils import read_ray_address as read  # pylint: disable=import-outside-toplevel,protected-access

    return read() or None


def quiet_token_notice() -> None:
    """Ray's warning that it turned token authentication on for a local instance, off (its errors stay)."""
    logging.getLogger(TOKEN_SETUP_LOGGER).setLevel(logging.ERROR)


@contextlib.contextmanager
def cluster_errors_to(sink: Callable[[str], None]) -> Iterator[None]:
    """Within the block, each error message the cluster publishes to this driver goes to `sink` (one call a message)
    instead of stdout. Ray looks its printer up at each message, so the block may begin before or after `ray.init`;
    every other output of Ray's printer is left as it was."""
    from ray._private import worker as ray_driver  # pylint: disable=import-outside-toplevel,protected-access

    original = getattr(ray_driver, "print_to_stdstream", None)
    if original is None:  # a Ray that moved it: its messages stay on stdout (tests/test_ray_private.py says so)
        yield
        return

    def print_to_stdstream(data, ignore_prefix):
        if data.get("pid") != RAYLET:
            return original(data, ignore_prefix)
        for message in data.get("lines", []):
            sink(str(message))
        return None

    ray_driver.print_to_stdstream = print_to_stdstream
    try:
        yield
    finally:
        ray_driver.print_to_stdstream = original
