"""The sandbox's exceptions. A program's own failures are never exceptions: they are result statuses."""


class SandboxError(Exception):
    """Base class of every error the sandbox raises."""


class SandboxConfigError(SandboxError, ValueError):
    """A bad argument (unknown backend, absurd limit, non-string program); the message says what to pass."""


class SandboxUnavailable(SandboxError, RuntimeError):
    """The backend cannot run here (e.g. Docker not running); the message names the command that fixes it."""
