"""`console.imports.heavy_imports`: the big imports run without the garbage collector, and what they made is frozen."""

import gc

import pytest

from dqn_cartpole.console.imports import heavy_imports


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector could free it


def test_the_collector_is_paused_inside_and_back_on_after_with_the_new_objects_frozen():
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    try:
        with heavy_imports():
            assert not gc.isenabled()
            made = [Node() for _ in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen_before + len(made)
    finally:
        gc.unfreeze()


def test_an_error_inside_still_turns_the_collector_back_on():
    try:
        with pytest.raises(ImportError):
            with heavy_imports():
                raise ImportError("no such module")
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with heavy_imports():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
