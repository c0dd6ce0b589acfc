"""Errors the user can act on. The CLI turns each into one line and exit status 2."""


class UserError(Exception):
    """Bad input from the user: a config, a flag or a path. Its message is one line."""


class ConfigError(UserError):
    """A config file or a `--set` override is invalid."""
