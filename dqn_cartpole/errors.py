"""Errors the user can act on. The CLI turns each into one line and exit status 2; the Python API raises them."""


class UserError(ValueError):
    """Bad input from the user: a config, a flag, an argument or a path. Its message is one line.

    A `ValueError`, Python's error for a bad argument value, so a caller of the Python API (`dqn_cartpole.train`,
    `load_config`, `Run.open`) can catch it as one; the CLI catches it before anything else.
    """

    def _render_traceback_(self) -> list[str]:
        """What IPython (a Jupyter notebook) shows instead of a traceback: the one line, as the CLI does."""
        return [f"{type(self).__name__}: {self}"]


class ConfigError(UserError):
    """A config file or a `--set` override is invalid."""
