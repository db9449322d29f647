"""Errors that the CLI turns into a one-line message and a non-zero exit."""


class UserError(Exception):
    """Bad input from the user (config, arguments, files). The message says what to do."""
