"""`processes/ray_cluster.py` in this process: a private instance's token, and its start again when Ray's own start-up
timed out (no Ray cluster is started: the parts that would be are faked, the processes they leave are real)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from dqn_cartpole.errors import UserError
from dqn_cartpole.processes import ray_cluster


def test_a_private_instances_token_is_the_commands_own_file_mode_0600_and_gone_after(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    with ray_cluster.private_token():
        path = os.environ["RAY_AUTH_TOKEN_PATH"]
        assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
        assert re.fullmatch(r"[0-9a-f]{64}", open(path).read())
        assert not path.startswith(os.path.expanduser("~"))
    assert "RAY_AUTH_TOKEN_PATH" not in os.environ and not os.path.exists(os.path.dirname(path))
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "mine"))  # the user's own token: left as it is
    with ray_cluster.private_token():
        assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "mine")
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "mine")


class StartsBadly:
    """A `ray` whose `init` times out as Ray's did on a loaded machine (a bare Exception, its processes left running)
    `failures` times, then starts."""

    def __init__(self, failures: int):
        self.failures, self.calls, self.left, self.shutdowns = failures, [], [], 0

    def init(self, address, **options):
        self.calls.append(address)
        if len(self.calls) <= self.failures:
            self.left.append(subprocess.Popen(["sleep", "60"]))  # as a raylet that never registered
            raise Exception("The current node timed out during startup. This could happen because ...")
        return "context"

    def shutdown(self):
        self.shutdowns += 1


def test_a_private_instance_that_times_out_is_started_again_once_its_leftovers_killed_then_one_line(capsys):
    ray = StartsBadly(failures=1)
    assert ray_cluster.init_ray(ray, None, {}, "--address") == "context"
    assert ray.calls == ["local", "local"] and ray.left[0].wait(10) is not None  # what the failed start left: gone
    assert re.fullmatch(r"note: the local Ray instance did not start \(The current node timed out during startup\. "
                        r"This could happen because \.\.\.; load average [\d./]+\); starting it again\n",
                        capsys.readouterr().err)
    ray = StartsBadly(failures=2)
    with pytest.raises(UserError, match=r"^a local Ray instance: cannot start Ray: The current node timed out during "
                                        r"startup\. This could happen because \.\.\.$"):
        ray_cluster.init_ray(ray, None, {}, "--address")
    assert len(ray.calls) == 2 and all(process.wait(10) is not None for process in ray.left)
    ray = StartsBadly(failures=1)  # a cluster that was named is not started: joined once, or one line
    with pytest.raises(UserError, match=r"^--address 10.0.0.1:6379: cannot start Ray: The current node"):
        ray_cluster.init_ray(ray, "10.0.0.1:6379", {}, "--address")
    assert ray.calls == ["10.0.0.1:6379"]


