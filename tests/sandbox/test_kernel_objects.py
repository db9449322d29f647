"""Kernel objects a program could create and leave, or reach outside its namespaces with, on every backend: a key in
its uid's keyring, a POSIX message queue, a socket of a family other than AF_UNIX (AF_VSOCK reaches the
hypervisor, outside any network namespace), a lock on a host file other workers and host processes share, io_uring.
The fork server's seccomp filter (sandbox/seccomp.py) makes each fail with EPERM; what clears the others is in
docs/sandbox.md's threat model. And a flood of entries in the work dir ends with the program's own status: the
clean-up is bounded in time, the worker is replaced when it did not finish."""

from __future__ import annotations

import fcntl
import json
import os
import textwrap
import threading
import time

import pytest
from sandbox_testlib import BACKENDS, HOSTILE_TIMEOUT_S, assert_healthy, open_backend

from sandbox.api import Sandbox
from sandbox.errors import SandboxConfigError
from sandbox.limits import Limits
from sandbox.pool import LocalLauncher, Pool
from sandbox.seccomp import SYSCALLS

NR = SYSCALLS[os.uname().machine]


@pytest.fixture(scope="module", params=BACKENDS)
def one_worker(request):
    """One worker, so the second program runs where the first ran."""
    box = open_backend(request.param, workers=1)
    yield box
    box.close()


def run_json(box, source: str, **kw) -> dict:
    result = box.run(textwrap.dedent(source), **kw)
    assert result.status == "ok", result
    return json.loads(result.stdout.splitlines()[-1])


KEYS = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
USER_KEYRING = -4
def call(*args):
    r = libc.syscall(*args)
    return r if r >= 0 else -ctypes.get_errno()
added = call({add_key}, b"user", b"sandbox-note", b"answer=42", 9, USER_KEYRING) if {make} else None
found = call({keyctl}, 10, USER_KEYRING, b"user", b"sandbox-note", 0)  # KEYCTL_SEARCH
print(json.dumps({{"added": added, "found": found}}))
"""


def test_a_key_in_the_user_keyring_does_not_reach_the_next_program(one_worker):
    """The program's uid is the worker's, for every program: a key in its user keyring would be read by the next
    one (and outlive the pool). Keyring calls fail with EPERM."""
    first = run_json(one_worker, KEYS.format(add_key=NR["add_key"], keyctl=NR["keyctl"], make=True))
    assert first["added"] == -1, first  # -EPERM: no key was added
    second = run_json(one_worker, KEYS.format(add_key=NR["add_key"], keyctl=NR["keyctl"], make=False))
    assert second["found"] == -1, second  # -EPERM, not a key id
    assert_healthy(one_worker)


QUEUE = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
def call(*args):
    r = libc.syscall(*args)
    return r if r >= 0 else -ctypes.get_errno()
fd = call({mq_open}, b"sandbox-note", {flags}, 0o666, None)
got = None
if fd >= 0 and {make}:
    sent = call({send}, fd, b"answer=42", 9, 0, None)
elif fd >= 0:
    buf = ctypes.create_string_buffer(8192)
    n = call({receive}, fd, buf, 8192, None, None)
    got = buf.raw[:n].decode() if n > 0 else n
print(json.dumps({{"fd": fd, "got": got}}))
"""


def test_a_posix_message_queue_does_not_reach_the_next_program(one_worker):
    """A queue lives in the worker's IPC namespace (the container's on Docker) until unlinked: the next program
    would open it and read what the last one left. mq_* calls fail with EPERM."""
    calls = {"mq_open": NR["mq_open"], "send": NR["mq_timedsend"], "receive": NR["mq_timedreceive"]}
    first = run_json(one_worker, QUEUE.format(flags=os.O_CREAT | os.O_RDWR, make=True, **calls))
    assert first["fd"] == -1, first
    second = run_json(one_worker, QUEUE.format(flags=os.O_RDONLY, make=False, **calls))
    assert second == {"fd": -1, "got": None}, second
    assert_healthy(one_worker)


SOCKETS = """
import ctypes, json, socket
def attempt(family, kind=socket.SOCK_STREAM):
    try:
        s = socket.socket(family, kind)
    except OSError as exc:
        return exc.errno
    s.close()
    return 0
out = {name: attempt(getattr(socket, name), kind)
       for name, kind in [("AF_VSOCK", socket.SOCK_STREAM), ("AF_INET", socket.SOCK_STREAM),
                          ("AF_INET6", socket.SOCK_DGRAM), ("AF_NETLINK", socket.SOCK_RAW),
                          ("AF_PACKET", socket.SOCK_RAW), ("AF_ALG", socket.SOCK_SEQPACKET)]}
try:
    a, b = socket.socketpair(socket.AF_INET)
    out["socketpair_inet"] = 0
except OSError as exc:
    out["socketpair_inet"] = exc.errno
a, b = socket.socketpair()  # AF_UNIX: what asyncio and multiprocessing use
a.sendall(b"x")
out["socketpair_unix"] = b.recv(1).decode()
out["unix"] = attempt(socket.AF_UNIX)
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(IO_URING_SETUP, 1, params)  # io_uring could open sockets without socket()
out["io_uring"] = 0 if fd >= 0 else ctypes.get_errno()
print(json.dumps(out))
"""


def test_only_unix_sockets_can_be_opened(sb):
    """AF_VSOCK is outside the network namespace; every family but AF_UNIX fails with EPERM (1), whatever the
    kernel would have said, and so does io_uring."""
    out = run_json(sb, SOCKETS.replace("IO_URING_SETUP", str(NR["io_uring_setup"])))
    eperm = 1
    assert {k: v for k, v in out.items() if k not in ("socketpair_unix", "unix")} == {
        "AF_VSOCK": eperm,
        "AF_INET": eperm,
        "AF_INET6": eperm,
        "AF_NETLINK": eperm,
        "AF_PACKET": eperm,
        "AF_ALG": eperm,
        "socketpair_inet": eperm,
        "io_uring": eperm,
    }, out
    assert (out["socketpair_unix"], out["unix"]) == ("x", 0), out


LOCKS = """
import fcntl, json, os, struct, time
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "locked"
    except OSError as exc:
        out[name] = exc.errno
host = os.open(os.__file__, os.O_RDONLY)  # the Python installation: a host file, bound read-only
mine = os.open("mine", os.O_RDWR | os.O_CREAT)
attempt("flock_host", lambda: fcntl.flock(host, fcntl.LOCK_SH))
attempt("flock_mine", lambda: fcntl.flock(mine, fcntl.LOCK_EX))
attempt("lockf_mine", lambda: fcntl.lockf(mine, fcntl.LOCK_EX | fcntl.LOCK_NB))
record = struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0)
attempt("posix_host", lambda: fcntl.fcntl(host, fcntl.F_SETLK, record))
attempt("ofd_host", lambda: fcntl.fcntl(host, 37, record))  # F_OFD_SETLK
attempt("getlk_host", lambda: fcntl.fcntl(host, fcntl.F_GETLK, record))
if "locked" in out.values():
    time.sleep(1.0)  # hold them while the host looks
print(json.dumps(out))
"""


def test_a_program_cannot_lock_a_file(sb):
    """A lock is on the inode: one a program held on a read-only bound host file would be seen by host processes
    and other workers (a covert channel, a way to block a host process). flock and fcntl locks fail with EPERM;
    on the process backend, the host meanwhile always gets the file's lock."""
    seen: dict = {}
    host_blocked = []

    def program():
        seen["out"] = run_json(sb, LOCKS)

    runner = threading.Thread(target=program)
    runner.start()
    with open(os.__file__, "rb") as f:
        while runner.is_alive():
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
            except BlockingIOError:
                host_blocked.append(True)
            time.sleep(0.01)
    runner.join()
    eperm = 1
    assert seen["out"] == {
        k: eperm for k in ("flock_host", "flock_mine", "lockf_mine", "posix_host", "ofd_host", "getlk_host")
    }, seen
    if sb.backend == "process":  # the same inode as the host's
        assert not host_blocked
    assert_healthy(sb)


FLOOD = """
import os
os.fork()  # two processes: one per core here, more on a bigger machine
d = f"d{os.getpid()}"
os.mkdir(d)
open(f"{d}/f", "w").close()
i = 0
while True:
    MAKE
    i += 1
"""


def test_a_program_sees_a_hostname_of_its_own_not_the_host_s(sb):
    # The process backend's server enters a UTS namespace named "sandbox"; Docker gives each container its own name.
    import socket

    seen = sb.run("import socket\nprint(socket.gethostname())")
    assert seen.status == "ok" and seen.stdout.strip() and seen.stdout.strip() != socket.gethostname()
    changed = sb.run("import ctypes\nprint(ctypes.CDLL(None, use_errno=True).sethostname(b'x', 1))")
    assert changed.status == "ok" and changed.stdout.strip() == "-1"  # no capability to rename it either


@pytest.mark.parametrize(
    "make", ['os.link(f"{d}/f", f"{d}/{i}")', 'os.mkdir(f"{d}/{i}")'], ids=["hard_links", "directories"]
)
def test_a_flood_of_entries_ends_with_the_programs_own_status(one_worker, make):
    """Entries made until the timeout: their removal is bounded in time (what is left goes with the worker, which
    is replaced), so the result is the program's own status, never the sandbox's error for a worker that kept
    cleaning past the client's grace. Its own status is "timeout", or "memory" where its entries filled the memory
    its private tmpfs is charged to first (a fast machine makes more of them in the time)."""
    result = one_worker.run(FLOOD.replace("MAKE", make), timeout_s=2.0)
    assert result.status in ("timeout", "memory"), result
    assert_healthy(one_worker)


def test_missing_isolation_names_seccomp_where_children_have_no_filter():
    """Where the kernel cannot apply the filter (here: a server told not to, --no-seccomp), results say so and
    missing_isolation() names it, so a self-play run refuses to start unless allowed."""
    box = Sandbox(
        Pool([LocalLauncher(0, extra_args=("--no-seccomp",))]),
        "process",
        Limits(timeout_s=HOSTILE_TIMEOUT_S, memory_mb=256),
        cache=False,
    )
    try:
        assert "seccomp" in box.missing_isolation()
        result = box.run("print(1)")
        assert result.status == "ok" and result.meta["seccomp"] is False, result
        with pytest.raises(SandboxConfigError, match="seccomp"):
            box.require_isolation()
    finally:
        box.close()
    filtered = open_backend("process", workers=1)
    try:
        assert "seccomp" not in filtered.missing_isolation()
        assert filtered.run("print(1)").meta["seccomp"] is True
    finally:
        filtered.close()


def test_remove_tree_stops_at_its_deadline_and_finishes_without_one(tmp_path):
    """The bound itself: past its deadline remove_tree leaves the rest and says so (False); the caller then has
    the worker replaced. Without a deadline it removes everything."""
    from sandbox.forkserver import REMOVE_CHECK, remove_tree

    tree = tmp_path / "flood"
    tree.mkdir()
    (tree / "f").write_text("x")
    for i in range(3 * REMOVE_CHECK):
        os.link(tree / "f", tree / str(i))
        (tree / f"d{i}").mkdir()
    assert remove_tree(str(tree), deadline=time.monotonic() - 1) is False
    assert tree.is_dir() and len(os.listdir(tree)) > REMOVE_CHECK
    assert remove_tree(str(tree)) is True and not tree.exists()
