"""`run_tests(..., clock="cpu")`: timeouts counted in the child's CPU time, so a verdict does not depend on the
machine's load (a program that gets no CPU for a while, here one that sleeps, is not ended by it), while a busy
loop still times out and a program that waits for ever meets the wall-clock cap (docs/sandbox.md, "Timeouts")."""

from __future__ import annotations

import pytest

import sandbox
from sandbox.forkserver import CPU_CLOCK_MIN_CAP_S, CPU_CLOCK_WALL_FACTOR

LIMIT_S = 0.2
WAITS = "import time\ndef f(x):\n    time.sleep(0.6)\n    return x\n"  # 3 x the limit of wall clock, no CPU


def test_a_test_that_waits_times_out_on_the_wall_clock_but_not_on_the_cpu_clock(sb):
    wall = sb.run_tests(WAITS, "f", [[1], [2]], [1, 2], timeout_s=LIMIT_S, use_cache=False)
    cpu = sb.run_tests(WAITS, "f", [[1], [2]], [1, 2], timeout_s=LIMIT_S, use_cache=False, clock="cpu")
    assert [t.status for t in wall.tests] == ["timeout", "timeout"]
    assert all("wall-clock timeout" in t.error for t in wall.tests)
    assert cpu.status == "ok"
    assert [t.passed for t in cpu.tests] == [True, True]


def test_the_module_load_counts_on_the_same_clock(sb):
    """The load's limit is the sandbox's timeout_s (1.5 s here): an import that waits 2 s of wall clock."""
    source = "import time\ntime.sleep(2.0)\ndef f(x):\n    return x\n"
    wall = sb.run_tests(source, "f", [[1]], [1], timeout_s=LIMIT_S, use_cache=False)
    cpu = sb.run_tests(source, "f", [[1]], [1], timeout_s=LIMIT_S, use_cache=False, clock="cpu")
    assert wall.status == "timeout"
    assert not wall.tests[0].passed
    assert cpu.status == "ok"
    assert cpu.tests[0].passed


def test_the_cpu_clock_ends_a_busy_loop(sb):
    """By its CPU time, or at the wall-clock cap where the machine is so busy that the loop got under a fiftieth
    of a CPU (the docker backend's container shares its CPUs)."""
    report = sb.run_tests("def f(x):\n    while True:\n        pass\n", "f", [[1]], timeout_s=LIMIT_S, clock="cpu")
    assert report.status == "timeout"
    assert report.tests[0].status == "timeout"
    assert report.tests[0].error.split(" (clock cpu)")[0] in (
        "CPU-time timeout",
        f"wall-clock timeout at {CPU_CLOCK_WALL_FACTOR} x the limit, {CPU_CLOCK_MIN_CAP_S:g} s at least",
    )


def test_the_cpu_clock_ends_a_program_that_waits_at_its_wall_clock_cap(sb):
    """10 x the limit, 10 s at least (cpu_clock_cap_s): the one test here that waits for it."""
    source = "import time\ndef f(x):\n    time.sleep(3600)\n"
    report = sb.run_tests(source, "f", [[1]], timeout_s=LIMIT_S, use_cache=False, clock="cpu")
    assert report.tests[0].status == "timeout"
    assert f"{CPU_CLOCK_WALL_FACTOR} x the limit, {CPU_CLOCK_MIN_CAP_S:g} s at least" in report.tests[0].error


def test_an_unknown_clock_is_refused(sb):
    with pytest.raises(sandbox.SandboxConfigError, match="clock"):
        sb.run_tests("def f(x):\n    return x\n", "f", [[1]], clock="monotonic")


def test_the_result_cache_keeps_the_clocks_apart(tmp_path):
    """A wall-clock timeout in the cache is never the answer to the same job on the CPU clock."""
    with sandbox.open_sandbox(
        backend="process", workers=1, timeout_s=LIMIT_S, cache=True, cache_path=str(tmp_path / "cache.sqlite")
    ) as sb:
        wall = sb.run_tests(WAITS, "f", [[1]], [1])
        cpu = sb.run_tests(WAITS, "f", [[1]], [1], clock="cpu")
        again = sb.run_tests(WAITS, "f", [[1]], [1], clock="cpu")
    assert wall.status == "timeout"
    assert (cpu.status, cpu.cached) == ("ok", False)
    assert (again.status, again.cached) == ("ok", True)
