"""No program breaks what comes after it: not the worker's clean-up (a directory tree too deep for recursion),
not the server's frame parser (a forged frame nested deeper than any parser's recursion), not the trainer
(an answer nested deep enough to make a recursive decoder raise), not the server itself (signals sent to it).
After each, on both backends, the pool serves the next 40 programs, no process of the program survives, and the
server holds no more descriptors than before."""

from __future__ import annotations

import textwrap

import pytest
from sandbox_testlib import BACKENDS, assert_serves_the_next_programs, open_backend, server_fds

DEPTH = 1200  # nested directories: deeper than Python's default recursion limit


DEEP_TREE = textwrap.dedent("""
    import os
    base = {base}
    os.chdir(base)
    for _ in range({depth}):
        os.mkdir("d")
        os.chdir("d")
    open("bottom.txt", "w").write("x")
    os.symlink("/", "root-link")
    print("made")
""")


@pytest.mark.parametrize("where", ["work_dir", "dev_shm"])
def test_a_deep_directory_tree_is_removed_and_breaks_nothing(sb, where):
    base = "os.getcwd()" if where == "work_dir" else "'/dev/shm'"
    before = server_fds(sb)
    for _ in range(2):  # twice: the second program runs where the first left its tree
        result = sb.run(DEEP_TREE.format(base=base, depth=DEPTH), timeout_s=30)
        assert (result.status, result.stdout) == ("ok", "made\n"), result
    assert_serves_the_next_programs(sb)
    if where == "dev_shm":  # the tree is gone, not merely hidden from the next program
        left = sb.run("import os; print(sorted(n for n in os.listdir('/dev/shm') if n == 'd'))")
        assert (left.status, left.stdout) == ("ok", "[]\n"), left
    assert server_fds(sb) == before


FORGED_DEEP_FRAME = textwrap.dedent("""
    import os, struct, time
    if os.fork() == 0:        # a descendant that would outlive the request if the server skipped its kill
        time.sleep(60)
        os._exit(0)
    body = {body}
    os.write(3, struct.pack(">I", len(body)) + body)
    time.sleep(60)            # still alive when the frame arrives
    def f(x):
        return x
""")


@pytest.mark.parametrize("depth", [150, 950, 200_000])
def test_a_forged_deeply_nested_result_frame_fails_the_program_only(sb, depth):
    body = repr(b"[" * depth + b"]" * depth)
    before = server_fds(sb)
    report = sb.run_tests(FORGED_DEEP_FRAME.format(body=body), "f", [[1], [2]], [1, 2], timeout_s=20)
    assert report.status == "error", report
    assert [t.status for t in report.tests] == ["error", "error"], report
    assert all("ProtocolError" in (t.error or "") for t in report.tests), report
    assert_serves_the_next_programs(sb)
    assert server_fds(sb) == before


FORGED_DEEP_ANSWER = textwrap.dedent("""
    import json, os, struct
    def f(x):
        deep = "[" * {depth} + "]" * {depth}
        frame = '{{"t":"test","i":0,"status":"ok","error":null,"calls":null,"output":' + deep + '}}'
        data = frame.encode()
        os.write(3, struct.pack(">I", len(data)) + data)
        os._exit(0)
""")


@pytest.mark.parametrize("depth", [150, 950])
def test_a_forged_deep_answer_never_reaches_the_trainer(sb, depth):
    report = sb.run_tests(FORGED_DEEP_ANSWER.format(depth=depth), "f", [[1]], [[]])
    assert report.tests[0].status != "ok" and not report.passed, report
    assert_serves_the_next_programs(sb)


NESTED_ANSWER = textwrap.dedent("""
    def f(depth):
        value = []
        for _ in range(depth - 1):
            value = [value]
        return value
""")


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [150, 990, 1000, 5000])
def test_a_deeply_nested_answer_is_unserializable_not_an_exception(sb, depth):
    report = sb.run_tests(NESTED_ANSWER, "f", [[depth], [3]], [None, nested(3)])
    assert report.tests[0].status == "unserializable", report
    assert report.tests[1].status == "ok" and report.tests[1].output == nested(3), report
    assert_serves_the_next_programs(sb)


def test_an_answer_within_the_depth_limit_passes(sb):
    report = sb.run_tests(NESTED_ANSWER, "f", [[100]], [nested(100)])
    assert report.passed, report


SIGNALS = textwrap.dedent("""
    import os, signal, time
    sent = 0
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGALRM, signal.SIGTSTP, signal.SIGPROF):
        for pid in {1, os.getppid()}:
            try:
                os.kill(pid, sig)
                sent += 1
            except OSError:
                pass
    time.sleep(0.3)
    print("sent", sent > 0)
""")


@pytest.fixture(params=BACKENDS)
def same_uid_box(request):
    """Children that share the server's uid (the Docker backend's model; the process backend without a uid of
    their own and outside a pid namespace), so the program's signals reach the server."""
    options = {"isolate_user": False, "confine": False} if request.param == "process" else {}
    box = open_backend(request.param, **options)
    yield box
    box.close()


def test_the_server_ignores_signals_from_its_programs(same_uid_box):
    box = same_uid_box
    restarts = [h["restarts"] for h in box.health()]
    for _ in range(3):
        result = box.run(SIGNALS)
        assert (result.status, result.stdout) == ("ok", "sent True\n"), result
        assert "worker_restarted" not in result.meta, result.meta
    assert [h["restarts"] for h in box.health()] == restarts
    # the program itself still gets a fresh process's handlers: SIGINT raises KeyboardInterrupt in it
    own = box.run(
        "import os, signal\ntry:\n    os.kill(os.getpid(), signal.SIGINT)\n"
        "except KeyboardInterrupt:\n    print('interrupted')\n"
    )
    assert (own.status, own.stdout) == ("ok", "interrupted\n"), own
    assert_serves_the_next_programs(box)


def test_answers_are_bounded_in_total_bytes(sb):
    """Each answer under output_limit, 80 of them over the server's total: later tests keep no answer."""
    from sandbox.forkserver import MAX_RESULT_BYTES

    size = 900_000
    n = MAX_RESULT_BYTES // size + 8
    report = sb.run_tests(
        "def f(i):\n    return 'z' * 900_000\n", "f", [[i] for i in range(n)], ["z" * size] * n, timeout_s=60
    )
    statuses = [t.status for t in report.tests]
    kept = statuses.count("ok")
    assert 0 < kept <= MAX_RESULT_BYTES // size and statuses[kept:] == ["output_limit"] * (n - kept), statuses
    assert all(t.output is None for t in report.tests[kept:])
    assert_serves_the_next_programs(sb)


def test_a_request_the_server_fails_on_is_answered_and_the_worker_recycled(sb):
    """Our own failure on a request (here a memory limit too large for the job header, which only a buggy client
    sends): the answer is sandbox_error, the worker is replaced before the next program, nothing is left."""
    pool = sb._pool
    restarts = sum(h["restarts"] for h in sb.health())
    req = {
        "op": "tests",
        "source": "import time\ntime.sleep(30)\ndef f():\n    return 1\n",
        "entry_point": "f",
        "inputs": [[]],
        "timeout_s": 5,
        "memory_mb": 1 << 33,
        "output_limit": 10_000,
    }
    (resp,) = pool.execute([req])
    assert resp["status"] == "sandbox_error", resp
    assert resp["meta"].get("worker_recycled"), resp["meta"]
    assert sum(h["restarts"] for h in sb.health()) == restarts + 1
    assert_serves_the_next_programs(sb)
