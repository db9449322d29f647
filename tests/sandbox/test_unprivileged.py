"""The process backend as a plain user: what a first run on a laptop or an HPC cluster gets (docs/sandbox.md, "What
isolation holds where", the middle column).

Run as root (as CI does), every sandbox here runs its fork servers as the dedicated unprivileged user
`selfplay-test`, with exactly the command line `open_sandbox(backend="process")` gives them; `.ci/run` creates the
user, and these tests FAIL with what to do when it is missing. Run as a plain user, they use `open_sandbox` itself.
They need unprivileged user namespaces (on by default on current kernels); where the kernel refuses them, the
isolation tests fail saying so and the refusal test checks what the user is told.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import test_confinement
import test_forgery
import test_hostile
from sandbox_testlib import (
    HOSTILE_MEMORY_MB,
    HOSTILE_TIMEOUT_S,
    assert_healthy,
    assert_nothing_left,
    forged_frames,
    open_backend,
    server_fds,
)

import sandbox
from sandbox import forkserver
from sandbox.api import Sandbox
from sandbox.limits import Limits
from sandbox.pool import FORKSERVER_PATH, LocalLauncher, Pool

TEST_USER = "selfplay-test"
REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------- the plain user
def plain_user() -> pwd.struct_passwd | None:
    """The user the servers run as when the tests run as root; None when the tests already run as a plain user."""
    if os.geteuid() != 0:
        return None
    try:
        user = pwd.getpwnam(TEST_USER)
    except KeyError:
        pytest.fail(
            f"no user {TEST_USER!r} to run the sandbox as without root: create it with "
            f"`useradd --system {TEST_USER}` (.ci/run does), or run these tests as a plain user"
        )
    if user.pw_uid == 0:
        pytest.fail(f"user {TEST_USER!r} is root; it must be an unprivileged user")
    return user


def interpreter(user: pwd.struct_passwd | None) -> str:
    """A Python `user` may run (this one where its installation is open to others, else the system's)."""
    if user is None:
        return sys.executable
    for candidate in (sys.executable, shutil.which("python3") or "", "/usr/bin/python3"):
        if candidate and os.path.exists(candidate) and forkserver._blocking_ancestor(candidate) is None:
            return candidate
    pytest.fail("no Python interpreter readable by an unprivileged user; install Debian's python3 (.ci/run does)")


def check_readable(path: str) -> None:
    """Fail, saying what to do, where the plain user cannot read the file `path` (the project's checkout)."""
    blocked = forkserver._blocking_ancestor(os.path.dirname(path))
    if blocked is None and not os.stat(path).st_mode & 0o004:
        blocked = path
    if blocked is not None:
        pytest.fail(
            f"{path} is not readable by other users ({blocked} is closed): check the project out where "
            f"{TEST_USER!r} can read it to run these tests as root"
        )


def userns_allowed(user: pwd.struct_passwd | None) -> bool:
    """Whether the kernel gives `user` (or us) an unprivileged user namespace."""
    cmd = ["unshare", "--user", "--map-root-user", "--net", "true"]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0


def open_unprivileged(workers: int = 2, extra_args: tuple = ()) -> Sandbox:
    """A process-backend sandbox whose servers run as a plain user, started as `open_sandbox` starts them."""
    user = plain_user()
    if user is None:
        if extra_args:
            pytest.fail("extra server options need the tests to run as root")
        return open_backend("process", workers=workers)
    check_readable(FORKSERVER_PATH)
    python = interpreter(user)
    launchers = [
        LocalLauncher(i, python=python, run_as=user.pw_uid, extra_args=("--uid", "auto", *extra_args))
        for i in range(workers)
    ]
    try:
        pool = Pool(launchers)
    except sandbox.SandboxUnavailable as exc:
        pytest.fail(f"the process backend did not start as {TEST_USER!r}: {exc}")
    return Sandbox(pool, "process", Limits(timeout_s=HOSTILE_TIMEOUT_S, memory_mb=HOSTILE_MEMORY_MB), cache=False)


@pytest.fixture(scope="module")
def usb():
    if not userns_allowed(plain_user()):
        pytest.fail(
            "the kernel refuses unprivileged user namespaces here (sysctl kernel.unprivileged_userns_clone "
            "or user.max_user_namespaces): the isolation a plain user gets cannot be tested"
        )
    box = open_unprivileged()
    yield box
    box.close()


def run(box: Sandbox, source: str, **kw):
    return box.run(textwrap.dedent(source), **kw)


# ------------------------------------------------------------------------------------------ a first run
FIRST_RUN = textwrap.dedent("""
    import json, sys
    import sandbox
    out = {}
    with sandbox.open_sandbox(backend="process", workers=1, cache=False) as sb:
        r = sb.run("print(1)")
        out["run"] = [r.status, r.stdout, r.stderr[-2000:]]
        out["meta"] = r.meta
        out["missing"] = sb.missing_isolation()
        out["why"] = sb.missing_isolation(why=True)
        try:
            sb.require_isolation()
            out["refusal"] = None
        except sandbox.SandboxConfigError as exc:
            out["refusal"] = str(exc)
    print(json.dumps(out))
""")


def first_run() -> dict:
    """`open_sandbox(backend="process")` in a fresh interpreter as the plain user, as a user's first run does."""
    user = plain_user()
    cmd = [interpreter(user), "-c", FIRST_RUN]
    if user is not None:
        check_readable(str(REPO / "sandbox" / "__init__.py"))
        cmd = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", *cmd]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": tempfile.gettempdir()}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_a_plain_users_first_run_works_with_isolation_on():
    out = first_run()
    assert out["run"][:2] == ["ok", "1\n"], out["run"]
    meta = out["meta"]
    assert meta["user_namespace"] is True, meta
    for fact in ("network_isolated", "private_tmp", "ipc_isolated", "private_proc", "pid_namespace", "private_root"):
        assert meta[fact] is True, (fact, meta)
    assert meta["tree_memory_limit"] is True and meta["nproc_per_worker"] is True, meta  # no cgroup: TreeMemory
    assert out["missing"] == [] and out["why"] == {} and out["refusal"] is None, out  # a self-play run starts


def test_without_a_user_namespace_the_refusal_names_the_sysctl_and_the_setting():
    # as on a kernel that refuses unprivileged user namespaces: programs still run, and the refusal says how to
    # turn them on or that sandbox.allow_unisolated=true accepts running without
    if plain_user() is None:
        pytest.fail("needs root: it starts a server as a plain user with --no-userns")
    box = open_unprivileged(workers=1, extra_args=("--no-userns",))
    try:
        r = box.run("print(1)")
        assert (r.status, r.stdout) == ("ok", "1\n"), r
        assert r.meta["user_namespace"] is False and r.meta["network_isolated"] is False, r.meta
        why = box.missing_isolation(why=True)
        assert {"network", "files", "fresh_state", "processes", "resources"} <= set(why), why
        with pytest.raises(sandbox.SandboxConfigError) as refused:
            box.require_isolation()
        text = str(refused.value)
        for needed in ("kernel.unprivileged_userns_clone", "user.max_user_namespaces", "sandbox.allow_unisolated=true"):
            assert needed in text, text
        assert_healthy(box)
    finally:
        box.close()


# ---------------------------------------------------------------------------------------------- isolation
def test_print_is_ok_as_a_plain_user(usb):
    r = usb.run("import os\nprint(1, os.getuid(), len(os.listdir('.')))\n")
    assert (r.status, r.stdout) == ("ok", "1 0 0\n"), r  # uid 0 of its own user namespace, no capabilities
    assert r.meta["user_namespace"] is True and r.meta["user_isolated"] is False, r.meta
    assert usb.missing_isolation() == []


def test_a_program_has_no_capabilities_as_a_plain_user(usb):
    r = run(
        usb,
        """
        import ctypes, os
        caps = {l.split(":")[0]: int(l.split()[1], 16) for l in open("/proc/self/status") if l.startswith("Cap")}
        print(caps["CapEff"], caps["CapPrm"], caps["CapBnd"], caps["CapAmb"])
        for attempt in (lambda: os.chroot("/tmp"), lambda: os.setuid(1), lambda: os.setgroups([0])):
            try:
                attempt()
                print("allowed")
            except OSError:
                print("refused")
        libc = ctypes.CDLL(None, use_errno=True)
        for flags in (0x10000000, 0x40000000, 0x00020000):  # a user, network, mount namespace
            print("allowed" if libc.unshare(flags) == 0 else "refused")
    """,
    )
    assert r.status == "ok", r
    lines = r.stdout.split("\n")
    assert lines[0] == "0 0 0 0", r.stdout
    assert lines[1:7] == ["refused"] * 6, r.stdout


def test_a_program_sees_no_network_as_a_plain_user(usb):
    host = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    host.bind(("127.0.0.1", 0))
    host.listen(1)
    port = host.getsockname()[1]
    try:
        r = run(
            usb,
            f"""
            import socket
            print(sorted(line.split(":")[0].strip() for line in open("/proc/self/net/dev").readlines()[2:]))
            for address in [("127.0.0.1", {port}), ("10.0.0.1", 53), ("1.1.1.1", 53)]:
                try:
                    socket.create_connection(address, 1).close()
                    print("connected")
                except OSError as exc:
                    print(type(exc).__name__)
        """,
        )
        assert r.status == "ok" and r.meta["network_isolated"] is True, r
        lines = r.stdout.split("\n")
        assert lines[0] == "['lo']", r.stdout
        assert "connected" not in r.stdout and len(lines) == 5, r.stdout
        host.settimeout(0.2)
        with pytest.raises(OSError):
            host.accept()
    finally:
        host.close()
    assert_healthy(usb)


def test_a_program_sees_no_host_process_as_a_plain_user(usb):
    before = server_fds(usb)
    # the test and its parent, by their host pids; not a pid the namespace's own few processes can hold (a parent
    # reparented to init is pid 1 on the host, and the namespace has a pid 1 of its own)
    probes = [pid for pid in (os.getpid(), os.getppid()) if pid > 16]
    assert probes, "the test's own pid is one a pid namespace's processes could hold"
    r = run(
        usb,
        f"""
        import json, os, signal
        child = os.fork()
        if child == 0:
            import time; time.sleep(5); os._exit(0)
        pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
        reached = []
        for pid in {probes!r}:
            try:
                os.kill(pid, 0)
                reached.append(pid)
            except OSError:
                pass
        print(json.dumps({{'pids': pids, 'me': os.getpid(), 'child': child, 'ppid': os.getppid(), 'reached': reached}}))
    """,
    )
    assert r.status == "ok" and r.meta["pid_namespace"] is True and r.meta["private_proc"] is True, r
    seen = json.loads(r.stdout)
    assert seen["ppid"] == 0, seen  # its server is outside its pid namespace
    assert seen["me"] in seen["pids"] and set(seen["pids"]) <= {1, seen["me"], seen["child"]}, seen
    assert seen["reached"] == [], seen
    assert "processes" not in usb.missing_isolation()
    assert_nothing_left(usb, before)


FORK_BOMB = test_confinement.FORK_BOMB  # as many children as it can make, each sleeping


def test_a_fork_bomb_is_held_by_the_process_limit_as_a_plain_user(usb):
    # RLIMIT_NPROC counts the processes of the program's uid in its worker's user namespace: its own tree (plus the
    # server and the namespace's init), not every process of the user on the host
    before = server_fds(usb)
    r = usb.run(FORK_BOMB, timeout_s=30)
    assert r.status == "ok", r
    assert 0 < int(r.stdout) < forkserver.DEFAULT_NPROC, r.stdout
    assert_nothing_left(usb, before)


@pytest.fixture
def users_secret():
    """A folder and a file of the plain user's own, outside the sandbox (what a run folder or a home holds): its
    server may read and write them; its programs must not."""
    user = plain_user()
    # not under a dir the sandbox replaces with a private tmpfs (/tmp, /var/tmp): only the programs' root hides it
    folder = tempfile.mkdtemp(prefix="sandbox-unpriv-test-", dir="/var/lib" if user is not None else Path.home())
    secret = os.path.join(folder, "corpus.sqlite")
    with open(secret, "w") as f:
        f.write("expected outputs")
    if user is not None:
        for path in (folder, secret):
            os.chown(path, user.pw_uid, user.pw_gid)
    os.chmod(secret, 0o600)
    try:
        yield folder, secret
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_program_cannot_read_or_write_outside_its_dir_as_a_plain_user(usb, users_secret):
    folder, secret = users_secret
    marker = f"sandbox-unpriv-marker-{os.getpid()}"
    targets = [
        secret,
        os.path.join(folder, "new"),
        str(REPO / "sandbox" / "forkserver.py"),
        "/usr/lib/owned",
        "/etc/owned",
        "/owned",
        "/proc/sys/kernel/hostname",
        sys.executable,
    ]
    r = run(
        usb,
        f"""
        import json, os
        out = dict()
        try:
            out["read"] = open({secret!r}).read()
        except OSError as exc:
            out["read"] = type(exc).__name__
        for path in {targets!r}:
            try:
                with open(path, "a") as f:
                    f.write("owned")
                out[path] = "written"
            except OSError as exc:
                out[path] = type(exc).__name__
        open("mine.txt", "w").write("ok")
        open("/tmp/{marker}", "w").write("ok")
        out["root"] = sorted(os.listdir("/"))
        print(json.dumps(out))
    """,
    )
    assert r.status == "ok", r
    out = json.loads(r.stdout)
    assert out["read"] in ("FileNotFoundError", "PermissionError"), out
    for path in targets:
        assert out[path] in ("FileNotFoundError", "PermissionError", "OSError"), (path, out)  # OSError: EROFS
    system = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "dev", "etc", "proc", "run", "tmp", "var"}
    python = interpreter(plain_user())  # its installation and the server's own directory are bound in, read-only
    bound = {Path(os.path.realpath(p)).parts[1] for p in (python, FORKSERVER_PATH, sys.prefix)}
    assert set(out["root"]) <= system | bound, out
    with open(secret) as f:
        assert f.read() == "expected outputs"
    assert os.listdir(folder) == ["corpus.sqlite"]
    assert not os.path.exists("/owned") and not os.path.exists(f"/tmp/{marker}")
    assert r.meta["private_root"] is True and r.meta["private_tmp"] is True, r.meta
    assert "files" not in usb.missing_isolation() and "fresh_state" not in usb.missing_isolation()
    assert_healthy(usb)


def test_nothing_of_a_program_reaches_the_next_as_a_plain_user(usb):
    before = server_fds(usb)
    r = run(
        usb,
        """
        import ctypes, os
        ctypes.CDLL(None).shmget(0, 4096, 0o1666)  # a SysV segment (IPC_PRIVATE, IPC_CREAT)
        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            open(os.path.join(d, "note"), "w").write("from the last program")
        open("note", "w").write("in the work dir")
        os.makedirs("deep/" * 50)
        if os.fork() == 0:
            os.setsid()
            import time
            time.sleep(100)
    """,
    )
    assert r.status == "ok", r
    assert_nothing_left(usb, before)


# -------------------------------------------------------------------------------------- grading, forgeries
def test_grading_works_and_forgeries_fail_as_a_plain_user(usb):
    right = usb.run_tests("def f(x):\n    return 2 * x\n", "f", [[1], [2], [3]], [2, 4, 6])
    assert right.status == "ok" and right.passed == 3, right
    wrong = usb.run_tests("def f(x):\n    return x\n", "f", [[1], [2], [3]], [2, 4, 6])
    assert wrong.passed == 0, wrong
    forged = usb.run_tests(
        forged_frames("f", "args[0]", ["forged"]), "f", [[1], [2], [3]], [2, 4, 6], record_calls=True
    )
    assert forged.passed == 0 and all(t.duration_s != 3e-12 and t.calls != ["forged"] for t in forged.tests), forged
    early = usb.run_tests("import os\ndef f(x):\n    os._exit(0)\n", "f", [[1], [2]], [2, 4])
    assert early.passed == 0 and all(t.status != "ok" for t in early.tests), early
    task = test_forgery.HUMANEVAL_TASK
    verdict = usb.run_check(
        task["prompt"] + "    return 2 * x\n\n" + test_forgery.FORGED_VERDICT, "double", task["test"]
    )
    assert verdict.meta["check"]["passed"] is False, verdict
    honest = usb.run_check(
        test_forgery.HUMANEVAL_TASK["prompt"] + "    return 2 * x\n", "double", test_forgery.HUMANEVAL_TASK["test"]
    )
    assert honest.status == "ok" and honest.meta["check"]["passed"] is True, honest
    assert_healthy(usb)


# The forgery, hostile and confinement suites, each test run again against the plain user's sandbox (the tree's
# memory held without a cgroup included). Left out: tests that start sandboxes of their own (as root), or
# that check root-only facts (a uid per worker, cgroup directories).
SUITES = [
    (test_forgery.test_an_early_exit_is_never_ok, {"name": name}) for name in sorted(test_forgery.EARLY_EXITS)
] + [
    (fn, {})
    for fn in (
        test_forgery.test_a_program_that_runs_to_its_end_is_ok_whatever_it_did_on_the_way,
        test_forgery.test_garbage_on_the_harness_descriptors_is_not_an_end,
        test_forgery.test_exit_code_114_is_the_program_s_error_not_ours,
        test_forgery.test_exit_code_113_is_not_a_memory_verdict,
        test_forgery.test_printing_memoryerror_and_aborting_is_not_a_memory_verdict,
        test_forgery.test_raising_memoryerror_without_using_memory_is_an_error,
        test_forgery.test_sigxcpu_sent_to_itself_is_not_a_timeout,
        test_forgery.test_a_test_that_exits_with_114_is_the_program_s_failure,
        test_forgery.test_a_fake_memory_error_in_a_test_is_not_a_memory_verdict,
        test_forgery.test_forged_result_frames_cannot_set_durations_or_calls,
        test_forgery.test_durations_are_the_parent_s,
        test_forgery.test_an_integer_task_rejects_an_approximate_float,
        test_forgery.test_a_check_sees_values_not_objects,
        test_hostile.test_fork_bomb,
        test_hostile.test_memory_bomb,
        test_hostile.test_memory_limit_is_per_call,
        test_hostile.test_infinite_loop,
        test_hostile.test_cpu_spin_ignoring_sigterm_with_child,
        test_hostile.test_output_flood,
        test_hostile.test_huge_file_write,
        test_hostile.test_writes_outside_work_dir_leave_host_files_untouched,
        test_hostile.test_work_dir_is_private_and_removed,
        test_hostile.test_loopback_connection_fails,
        test_hostile.test_killing_the_worker_is_contained,
        test_hostile.test_deep_recursion,
        test_hostile.test_ctypes_segfault,
        test_hostile.test_daemon_thread_outliving_the_program,
        test_hostile.test_forkserver_file_is_untouched,
        test_hostile.test_closed_host_files_are_unreadable,
        test_hostile.test_sleeping_and_reading_stdin,
        test_confinement.test_a_process_tree_is_held_to_its_memory_limit,
        test_confinement.test_a_grading_whose_test_overruns_the_tree_limit_fails_that_test_only,
        test_forgery.test_pool_is_healthy_after_the_forgeries,
    )
]


SUITE_IDS = [f"{fn.__module__}.{fn.__name__}" + (f"[{kw['name']}]" if kw else "") for fn, kw in SUITES]


@pytest.mark.parametrize("test,kwargs", SUITES, ids=SUITE_IDS)
def test_the_forgery_and_hostile_suites_hold_as_a_plain_user(usb, test, kwargs):
    test(usb, **kwargs)
