"""A run folder: its layout, atomic writes, metrics CSVs, and `read_run` for consumers.

Nothing in here imports TensorFlow, so tools that only read runs (compare, report, sweeps)
start fast.
"""

from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.record import SUMMARY_VERSION, RunRecord, read_run, write_summary

__all__ = ["RunLayout", "RunRecord", "SUMMARY_VERSION", "read_run", "write_summary"]
