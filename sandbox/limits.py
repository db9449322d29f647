"""Resource limits of one program run, validated once where the user gives them."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from sandbox.errors import SandboxConfigError

MAX_TIMEOUT_S = 3600.0  # longer than an hour per program is a mistake, not a limit
MIN_MEMORY_MB = 64  # the forked interpreter alone maps ~30 MB of address space
MAX_MEMORY_MB = 1024 * 1024  # 1 TiB
MIN_OUTPUT_LIMIT = 1024  # bytes; below this even a traceback is cut
MAX_OUTPUT_LIMIT = 1 << 30  # bytes


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0  # wall-clock seconds for a program (for tests: to load the module, and per test)
    memory_mb: int = 512  # address-space limit (RLIMIT_AS) of the program's process
    output_limit: int = 1_000_000  # bytes of stdout+stderr kept; more ends the program ("output_limit")

    def __post_init__(self) -> None:
        check_timeout(self.timeout_s, "timeout_s")
        if (
            isinstance(self.memory_mb, bool)
            or not isinstance(self.memory_mb, int)
            or not MIN_MEMORY_MB <= self.memory_mb <= MAX_MEMORY_MB
        ):
            raise SandboxConfigError(
                f"memory_mb={self.memory_mb!r}: pass an integer number of MiB between "
                f"{MIN_MEMORY_MB} and {MAX_MEMORY_MB}"
            )
        if (
            isinstance(self.output_limit, bool)
            or not isinstance(self.output_limit, int)
            or not MIN_OUTPUT_LIMIT <= self.output_limit <= MAX_OUTPUT_LIMIT
        ):
            raise SandboxConfigError(
                f"output_limit={self.output_limit!r}: pass an integer number of bytes between "
                f"{MIN_OUTPUT_LIMIT} and {MAX_OUTPUT_LIMIT}"
            )

    def as_dict(self) -> dict:
        return asdict(self)


def check_timeout(value, name: str = "timeout_s") -> float:
    """A positive, finite number of seconds up to MAX_TIMEOUT_S, or SandboxConfigError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= MAX_TIMEOUT_S
    ):
        raise SandboxConfigError(f"{name}={value!r}: pass a number of seconds in (0, {MAX_TIMEOUT_S:g}]")
    return float(value)
