"""Ray's private API, as `processes/ray_private.py` (its one user) relies on it: this fails loudly when a Ray release
moves or changes it, rather than the commands' output changing silently. In this process, no cluster started."""

from __future__ import annotations

import inspect
import io
import logging

import pytest

ray = pytest.importorskip("ray")

from dqn_cartpole.distributed import ray_topology  # noqa: E402
from dqn_cartpole.experiments.executor import cluster_errors_in_one_line  # noqa: E402
from dqn_cartpole.processes import ray_private  # noqa: E402

NODE_DIED = ("A worker died or was killed while executing a task by an unexpected system error. To troubleshoot "
             "the problem, check the logs for the dead worker.\nlast 20 lines of the raylet's log: ...")


def test_rays_driver_still_prints_the_clusters_errors_through_the_printer_that_is_replaced():
    from ray._private import utils, worker  # pylint: disable=protected-access

    assert list(inspect.signature(worker.print_to_stdstream).parameters) == ["data", "ignore_prefix"]
    listener = inspect.getsource(worker.listen_error_messages)
    assert "print_to_stdstream(" in listener and '"pid": "raylet"' in listener, listener
    assert "listen_error_messages" in inspect.getsource(worker.connect)  # the thread `ray.init` starts
    assert list(inspect.signature(utils.read_ray_address).parameters) == ["temp_dir"]


def test_the_clusters_errors_go_to_the_sink_and_every_other_line_to_rays_printer(capsys):
    from ray._private import worker  # pylint: disable=protected-access

    original, got = worker.print_to_stdstream, []
    with ray_private.cluster_errors_to(got.append):
        worker.print_to_stdstream({"lines": [NODE_DIED], "pid": "raylet", "is_err": False}, False)
        worker.print_to_stdstream({"lines": ["hello from a task"], "pid": 4242, "ip": "10.0.0.2", "is_err": False,
                                   "task_name": "run", "actor_name": "", "localhost": "10.0.0.1"}, False)
    assert got == [NODE_DIED]
    assert "hello from a task" in capsys.readouterr().out and NODE_DIED not in capsys.readouterr().out
    assert worker.print_to_stdstream is original


def test_sweep_and_tune_say_each_error_in_one_line_and_the_topology_logs_it(tmp_path):
    from ray._private import worker  # pylint: disable=protected-access

    stream = io.StringIO()
    with cluster_errors_in_one_line(stream):
        worker.print_to_stdstream({"lines": [NODE_DIED], "pid": "raylet", "is_err": False}, False)
    assert stream.getvalue() == "ray: A worker died or was killed while executing a task by an unexpected system error\n"
    roles = tmp_path / "roles"
    with ray_topology.quiet_ray(str(roles)):
        worker.print_to_stdstream({"lines": ["before the folder"], "pid": "raylet", "is_err": False}, False)
        roles.mkdir()
        worker.print_to_stdstream({"lines": [NODE_DIED], "pid": "raylet", "is_err": False}, False)
        assert logging.getLogger("ray").level == logging.ERROR
    log = (roles / ray_topology.RAY_ERRORS_LOG).read_text()
    assert "before the folder" not in log and "A worker died" in log and log.endswith("raylet's log: ...\n")


def test_the_notice_that_a_local_instance_uses_a_token_is_quieted_and_its_errors_are_not(caplog):
    from ray._private.authentication import authentication_token_setup as setup  # pylint: disable=protected-access

    assert setup.logger.name == ray_private.TOKEN_SETUP_LOGGER
    assert "logger.warning(" in inspect.getsource(setup._warn_token_auth_enabled)  # pylint: disable=protected-access
    level = setup.logger.level
    try:
        with caplog.at_level(logging.WARNING):  # the root's level: what a command's console would show
            ray_private.quiet_token_notice()
            setup._warn_token_auth_enabled()  # pylint: disable=protected-access
            setup.logger.error("an error of Ray's token set-up")
        assert [r.levelno for r in caplog.records if r.name == setup.logger.name] == [logging.ERROR], caplog.text
    finally:
        setup.logger.setLevel(level)
