"""Errors a user can cause: the CLI reports each as one line and exit code 2, never a traceback.

The bottom of the package: every layer raises these and imports nothing of multibranch to do so.
"""


class UserError(Exception):
    """An error caused by the user's input: reported as one clear message, no traceback."""


class ConfigError(UserError, ValueError):
    """A configuration value is missing, unknown or of the wrong type."""


class DataError(UserError, ValueError):
    """Input text or prepared data is unusable; the message names the file (and line) and the fix."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, corrupted, or does not fit the model/run it is loaded into."""
