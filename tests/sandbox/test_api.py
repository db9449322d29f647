"""The public API: ordinary programs, run_many order, result serialisation, cache hooks, and bad calls."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading

import pytest
from sandbox_testlib import assert_healthy, open_backend

import sandbox
import sandbox.pool


def test_ok_error_and_output(sb):
    r = sb.run("import math\nprint(math.factorial(5))\n")
    assert (r.status, r.stdout, r.stderr, r.cached) == ("ok", "120\n", "", False)
    assert r.meta["backend"] == sb.backend and r.duration_s > 0
    r = sb.run("assert 1 + 1 == 3, 'arithmetic'\n")
    assert r.status == "error" and "AssertionError: arithmetic" in r.stderr
    r = sb.run("import sys\nsys.exit(0)\n")  # an exit, even with 0, is not the program's end
    assert r.status == "error" and r.meta["exit_code"] == 0 and "before its end" in r.meta["reason"]
    r = sb.run("import sys\nsys.exit(3)\n")
    assert r.status == "error" and r.meta["exit_code"] == 3
    assert sb.run("import sys\nsys.exit('bye')\n").stderr == "bye\n"
    r = sb.run("def f(:\n")
    assert r.status == "error" and "SyntaxError" in r.stderr


def test_program_runs_as_main_with_fresh_state(sb):
    r = sb.run("import sys\nsys.modules['math'].pi = 3\nprint(__name__)\n")
    assert r.stdout == "__main__\n"
    assert sb.run("import math\nprint(math.pi > 3.1)\n").stdout == "True\n"  # nothing leaks between programs


def test_unicode_and_binary_output(sb):
    r = sb.run("import sys\nprint('héllo ✓')\nsys.stdout.flush()\nsys.stdout.buffer.write(b'\\xff\\n')\n")
    assert r.stdout.startswith("héllo ✓\n") and r.status == "ok"


def test_run_many_keeps_input_order(sb):
    sources = [f"import time\ntime.sleep({0.05 * (i % 3)})\nprint({i})\n" for i in range(12)]
    sources[5] = "1/0"
    results = sb.run_many(sources)
    assert [r.stdout for i, r in enumerate(results) if i != 5] == [f"{i}\n" for i in range(12) if i != 5]
    assert results[5].status == "error"
    assert sb.run_many([]) == []


def test_run_tests_many_keeps_order(sb):
    jobs = [
        dict(solution=f"def f(x):\n    return x + {k}\n", entry_point="f", inputs=[[1], [2]], expected=[1 + k, 2 + k])
        for k in range(6)
    ]
    jobs[2]["expected"] = [0, 0]
    reports = sb.run_tests_many(jobs)
    assert [r.all_passed for r in reports] == [True, True, False, True, True, True]


def test_results_round_trip_through_dicts(sb):
    r = sb.run("print('x')")
    assert sandbox.ExecResult.from_dict(r.to_dict()) == r
    rep = sb.run_tests("def f(x):\n    return [x, 1.5]\n", "f", [[1], [2]], [[1, 1.5], [0, 0]], record_calls=True)
    d = rep.to_dict()
    assert (d["passed"], d["total"], d["all_passed"]) == (1, 2, False)
    assert sandbox.TestReport.from_dict(d) == rep


def test_floats_nan_and_tuples_compare_after_normalisation(sb):
    rep = sb.run_tests(
        "def f(x):\n    return [x / 3, float('nan'), (1, 2), {1: 'a'}]\n",
        "f",
        [[1.0]],
        [[0.3333333333, math.nan, [1, 2], {"1": "a"}]],
    )
    assert rep.all_passed, rep


def test_cache_hits_are_marked_and_skip_execution():
    box = open_backend("process", workers=1, cache=True)
    try:
        src = "import random\nprint(random.random())\n"  # different every run, unless cached
        first, second = box.run(src), box.run(src)
        assert (first.cached, second.cached) == (False, True)
        assert second.stdout == first.stdout
        assert box.run(src, use_cache=False).stdout != first.stdout
        sol = "import random\ndef f(x):\n    return random.random()\n"
        a = box.run_tests(sol, "f", [[1]])
        b = box.run_tests(sol, "f", [[1]], expected=[a.outputs[0]])
        assert b.cached and b.all_passed
        c = box.run_tests(sol, "f", [[1]], expected=[a.outputs[0]], use_cache=False)
        assert not c.cached and not c.all_passed
        assert box.stats()["cache_hits"] == 2
    finally:
        box.close()


def test_trace_log_records_runs(tmp_path):
    path = tmp_path / "trace.jsonl"
    box = open_backend("process", workers=1, trace_path=str(path))
    try:
        box.run("print(1)")
        box.run_tests("def f():\n    return 1\n", "f", [[]])
    finally:
        box.close()
    assert len(path.read_text().splitlines()) == 2


# ---------------------------------------------------------------------------------------------- bad calls
@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(backend="kubernetes"), "unknown sandbox backend"),
        (dict(workers=0), "workers=0"),
        (dict(workers="4"), "workers='4'"),
        (dict(timeout_s=-1), "timeout_s=-1"),
        (dict(timeout_s=float("inf")), "timeout_s=inf"),
        (dict(timeout_s=10**9), "timeout_s"),
        (dict(memory_mb=1), "memory_mb=1"),
        (dict(memory_mb=10**12), "memory_mb"),
        (dict(memory_mb=256.5), "memory_mb"),
        (dict(output_limit=0), "output_limit=0"),
        (dict(colour="blue"), "unknown option"),
        (dict(python="/no/such/python3"), "python='/no/such/python3'"),
    ],
)
def test_bad_open_arguments(kwargs, words):
    with pytest.raises(sandbox.SandboxConfigError, match=words) as info:
        sandbox.open_sandbox(**kwargs)
    assert "\n" not in str(info.value)


def test_bad_calls(sb):
    with pytest.raises(sandbox.SandboxConfigError, match="must be a str"):
        sb.run(b"print(1)")
    with pytest.raises(sandbox.SandboxConfigError, match="must be a str"):
        sb.run(None)
    with pytest.raises(sandbox.SandboxConfigError, match="list of program sources"):
        sb.run_many("print(1)")
    with pytest.raises(sandbox.SandboxConfigError, match="timeout_s"):
        sb.run("print(1)", timeout_s=0)
    with pytest.raises(sandbox.SandboxConfigError, match="memory_mb"):
        sb.run("print(1)", memory_mb=-5)
    with pytest.raises(sandbox.SandboxConfigError, match="entry_point"):
        sb.run_tests("def f(): pass", "f()", [[]])
    with pytest.raises(sandbox.SandboxConfigError, match="each a list"):
        sb.run_tests("def f(x): pass", "f", [1, 2])
    with pytest.raises(sandbox.SandboxConfigError, match="2 expected outputs for 1 inputs"):
        sb.run_tests("def f(x): pass", "f", [[1]], expected=[1, 2])
    with pytest.raises(sandbox.SandboxConfigError, match="not JSON-serialisable"):
        sb.run_tests("def f(x): pass", "f", [[{1, 2}]])
    with pytest.raises(sandbox.SandboxConfigError, match="each job is a dict"):
        sb.run_tests_many([dict(solution="", entry_point="f", inputs=[], colour=1)])
    assert sb.run("print('still fine')").stdout == "still fine\n"


def test_closed_sandbox_refuses_work():
    box = open_backend("process", workers=1)
    box.close()
    box.close()  # idempotent
    with pytest.raises(sandbox.SandboxError, match="closed"):
        box.run("print(1)")


def test_concurrent_callers_share_the_pool(sb):
    results: dict[int, list] = {}

    def worker(k: int) -> None:
        results[k] = [sb.run(f"print({k} * {j})").stdout for j in range(4)]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {k: [f"{k * j}\n" for j in range(4)] for k in range(4)}


def test_a_hung_worker_is_replaced_and_reported_as_our_fault(monkeypatch):
    monkeypatch.setattr(sandbox.pool, "GRACE_S", 0.5)
    box = open_backend("process", workers=1)
    try:
        pid = box.health()[0]["info"]["pid"]
        os.kill(pid, signal.SIGSTOP)  # the worker stops answering (a bug of ours, or the machine)
        r = box.run("print(1)", timeout_s=0.2)
        assert r.status == "sandbox_error" and r.meta["worker_restarted"]
        assert box.run("print(2)").stdout == "2\n"
        assert box.health()[0]["restarts"] == 1
    finally:
        box.close()


def test_run_many_over_many_workers_survives_a_killed_worker():
    box = open_backend("process", workers=3, isolate_user=False, confine=False)  # programs can reach the server
    try:
        sources = ["print('a')", "import os\nos.kill(os.getppid(), 9)", "print('c')", "print('d')"] * 2
        results = box.run_many(sources)
        assert [r.status for r in results] == ["ok", "killed", "ok", "ok"] * 2
        assert [r.stdout for r in results if r.ok] == ["a\n", "c\n", "d\n"] * 2
        assert_healthy(box)
    finally:
        box.close()


def test_process_backend_on_another_interpreter(tmp_path):
    """`python=` runs the fork servers (and so the programs) on that interpreter, e.g. a PGO-built system Python;
    here this interpreter under another name, which the programs see as sys.executable."""
    python = tmp_path / "another-python"
    python.symlink_to(os.path.realpath(sys.executable))
    box = sandbox.open_sandbox("process", workers=1, cache=False, python=str(python))
    try:
        r = box.run("import sys; print(sys.executable)")
        assert r.ok and r.stdout.strip() == str(python), r
    finally:
        box.close()


class FlakyLauncher(sandbox.pool.LocalLauncher):
    """A real local worker whose second start fails (fault injection for the restart path)."""

    def __init__(self):
        super().__init__(0, isolate_user=False, extra_args=("--no-pidns",))  # its programs can reach it
        self.starts = 0

    def start(self) -> str:
        self.starts += 1
        if self.starts == 2:
            raise sandbox.SandboxUnavailable("injected start failure")
        return super().start()


def test_a_failed_restart_is_our_fault_and_retried():
    from sandbox.api import Sandbox
    from sandbox.limits import Limits

    launcher = FlakyLauncher()
    box = Sandbox(sandbox.pool.Pool([launcher]), "process", Limits(timeout_s=2.0), cache=False)
    try:
        r = box.run("import os\nos.kill(os.getppid(), 9)\n")
        assert r.status == "sandbox_error" and "injected start failure" in r.stderr
        r = box.run("print('back')")  # the next request restarts the worker first
        assert (r.status, r.stdout, launcher.starts) == ("ok", "back\n", 3)
        assert_healthy(box)
    finally:
        box.close()


def test_default_workers_follow_the_cpu_affinity_not_the_machine():
    # One worker per CPU this process may use: under `--cpus-per-task` (or taskset) a job gets its share of a node,
    # and a pool sized by os.cpu_count() would start a worker per core of the whole machine on it.
    code = (
        "import os, sys; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); import sandbox; "
        "sb = sandbox.open_sandbox(backend='process'); "
        "print(sandbox.usable_cpus(), len(sb._pool.workers), os.cpu_count()); sb.close()"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    usable, workers, machine = map(int, out.stdout.split())
    assert (usable, workers) == (1, 1) and machine >= 1
    assert sandbox.usable_cpus() == len(os.sched_getaffinity(0))
