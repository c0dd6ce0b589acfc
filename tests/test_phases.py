"""summary.json's `phases`: exclusive seconds per phase, which add up to the process's time."""

from __future__ import annotations

import pytest

from dqn_cartpole.training import phases as phases_module
from dqn_cartpole.training.phases import BUILD, EXPORT, LOOP, STARTUP, Phases


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(phases_module.time, "perf_counter", fake)
    return fake


def test_an_inner_phase_pauses_the_outer_one_and_the_phases_add_up(clock):
    phases = Phases(started_s_ago=2.5)
    with phases(BUILD):
        clock.now += 1.0
    with phases(LOOP):
        clock.now += 3.0
        with phases(EXPORT):
            clock.now += 0.5
        clock.now += 1.0
        phases.timed(EXPORT, lambda: setattr(clock, "now", clock.now + 0.25))()
    clock.now += 7.0  # outside every phase: charged to none
    phases.add_parallel("encoder", 1.5)
    result = phases.as_dict()
    assert result["phases"] == {STARTUP: 2.5, BUILD: 1.0, LOOP: 4.0, EXPORT: 0.75}
    assert list(result["phases"]) == [STARTUP, BUILD, LOOP, EXPORT]  # the order of a run
    assert result["parallel"] == {"encoder": 1.5}


def test_the_process_start_time_is_the_moment_the_process_was_started():
    """Times "since the process started" count from `process_start_time`. psutil's create_time is early by the
    boot time's fraction of a second on Linux (0.67 s where this was found), and every reported time carried it."""
    import subprocess
    import sys
    import time

    from dqn_cartpole.processes.start_time import process_start_time

    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        started = process_start_time(child.pid)
        assert before - 0.02 <= started <= time.time()  # the clock tick is 10 ms
        assert abs(process_start_time() - process_start_time(None)) < 1e-3  # two reads of two clocks apart
    finally:
        child.communicate(b"")
