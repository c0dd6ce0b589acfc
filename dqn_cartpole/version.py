"""The package's version: the one place it is written (pyproject.toml reads it; provenance records it).

A leaf module, so any layer can name the version without importing the package's top (`dqn_cartpole/__init__.py`).
"""

__version__ = "0.1.0"
