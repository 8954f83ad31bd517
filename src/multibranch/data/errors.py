"""Errors raised for bad input data."""


class DataError(ValueError):
    """Input text or prepared data is unusable; the message names the file (and line) and the fix."""
