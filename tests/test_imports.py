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
        with heavy_imports(freeze=True):  # what the call that imports TensorFlow does
            assert not gc.isenabled()
            made = [Node() for _ in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen_before + len(made)
    finally:
        gc.unfreeze()


def test_once_tensorflow_is_imported_nothing_more_is_frozen():
    """A process that goes on (the Python API's) must keep its objects collectable: a later call freezes nothing."""
    import sys

    with heavy_imports():
        pass
    assert "tensorflow" in sys.modules
    gc.unfreeze()
    with heavy_imports():
        made = [Node() for _ in range(1000)]
    assert gc.get_freeze_count() == 0 and len(made) == 1000


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


def test_tensorflow_runs_without_onednn_unless_the_environment_asks_for_it():
    """oneDNN's kernels cost the compiled loop 10-25% per iteration at a DQN's sizes; the variable is read once,
    when TensorFlow is imported, so it is checked in fresh interpreters."""
    import os
    import subprocess
    import sys

    code = ("import os\nfrom dqn_cartpole.console.imports import heavy_imports\nwith heavy_imports():\n"
            "    import tensorflow\nprint(os.environ['TF_ENABLE_ONEDNN_OPTS'])\n"
            "from tensorflow.python.util import _pywrap_util_port\nprint(_pywrap_util_port.IsMklEnabled())")
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    default = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert default.stdout.split() == ["0", "False"]
    asked = subprocess.run([sys.executable, "-c", code], env={**env, "TF_ENABLE_ONEDNN_OPTS": "1"},
                           capture_output=True, text=True, check=True)
    assert asked.stdout.split() == ["1", "True"]


def test_the_legacy_gym_finds_pythons_own_distutils_not_setuptools():
    """TF-Agents imports the legacy gym, whose video recorder imports distutils: through setuptools' shim that
    imported all of setuptools (0.2 s of CPU at every start)."""
    import subprocess
    import sys

    code = ("import sys, warnings\nwarnings.simplefilter('ignore')\nfrom dqn_cartpole.console.imports import "
            "stdlib_distutils\nstdlib_distutils()\nimport gym, distutils.spawn\n"
            "print('setuptools' in sys.modules, distutils.__file__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    imported, where = out.stdout.split()
    assert imported == "False" and "setuptools" not in where, out.stdout
