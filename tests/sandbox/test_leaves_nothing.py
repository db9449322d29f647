"""Nothing a program leaves reaches the next program on the same worker, on either backend: files in /tmp,
/dev/shm (and on the process backend /run/lock and the other world-writable host dirs, which as root it sees only
as private tmpfs), SysV shared memory, semaphores and message queues (gone after the program, and on the process
backend never in the host's IPC namespace), and the work dir's metadata (each program gets a new one)."""

from __future__ import annotations

import json
import os

import pytest
from sandbox_testlib import BACKENDS, assert_healthy, open_backend, unix_listener

import sandbox

KEY = 0x5E1F0019


@pytest.fixture(scope="module", params=BACKENDS)
def one_worker(request):
    """One worker, so the second program runs where the first ran."""
    box = open_backend(request.param, workers=1)
    yield box
    box.close()


LEAVE_FILES = r"""
import os
left = []
for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock"):
    try:
        with open(os.path.join(d, "note-for-later"), "w") as f:
            f.write("secret")
        os.makedirs(os.path.join(d, "nest/deeper"), exist_ok=True)
        left.append(d)
    except OSError:
        pass
print(sorted(set(left)))
"""

FIND_FILES = r"""
import os
found = [d for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")
         if os.path.exists(os.path.join(d, "note-for-later")) or os.path.exists(os.path.join(d, "nest"))]
print(found)
"""


def test_files_in_shared_dirs_do_not_reach_the_next_program(one_worker):
    first = one_worker.run(LEAVE_FILES)
    assert first.status == "ok" and "/tmp" in first.stdout and "/dev/shm" in first.stdout, first
    if one_worker.backend == "process" and os.geteuid() == 0:
        assert "/run/lock" in first.stdout, first  # it could write there: a private tmpfs, not the host's
        assert not os.path.exists("/run/lock/note-for-later")
    second = one_worker.run(FIND_FILES)
    assert (second.status, second.stdout) == ("ok", "[]\n"), second
    assert_healthy(one_worker)


SYSV = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
KEY = {KEY}
mode = os.environ.get("MODE")
shm = libc.shmget(KEY, 1 << 20, 0o1666 if mode == "make" else 0)
sem = libc.semget(KEY + 1, 1, 0o1666 if mode == "make" else 0)
msg = libc.msgget(KEY + 2, 0o1666 if mode == "make" else 0)
if mode == "make" and shm >= 0:
    libc.shmat.restype = ctypes.c_void_p
    addr = libc.shmat(shm, None, 0)
    ctypes.memset(addr, 7, 1 << 20)  # resident after we exit unless someone removes it
rows = {k: len(open(f"/proc/sysvipc/{k}").read().splitlines()) - 1 for k in ("shm", "sem", "msg")}
print(json.dumps({"ids": [shm >= 0, sem >= 0, msg >= 0], "rows": rows}))
""".replace("{KEY}", str(KEY))


def sysv(box, mode: str) -> dict:
    src = f"import os\nos.environ['MODE'] = {mode!r}\n" + SYSV
    result = box.run(src)
    assert result.status == "ok", result
    return json.loads(result.stdout)


def host_keys() -> set[int]:
    keys = set()
    for kind in ("shm", "sem", "msg"):
        with open(f"/proc/sysvipc/{kind}") as f:
            keys |= {int(row.split()[0]) for row in f.read().splitlines()[1:] if row.split()}
    return keys


def test_sysv_ipc_objects_do_not_survive_a_program(one_worker):
    made = sysv(one_worker, "make")
    assert made["ids"] == [True, True, True], made
    if one_worker.backend == "process" and os.geteuid() == 0:
        assert not {KEY, KEY + 1, KEY + 2} & host_keys()  # never in the host's namespace
    later = sysv(one_worker, "find")
    assert later == {"ids": [False, False, False], "rows": {"shm": 0, "sem": 0, "msg": 0}}, later
    assert_healthy(one_worker)


WORKDIR_MARK = r"""
import os
os.utime(".", (1234567, 1234567))
os.chmod(".", 0o700)
st = os.stat(".")
print(os.getcwd(), st.st_mtime == 1234567)
"""


def test_each_program_gets_a_new_work_dir(one_worker):
    first = one_worker.run(WORKDIR_MARK)
    assert first.status == "ok" and first.stdout.split()[1] == "True", first
    second = one_worker.run("import os\nprint(os.getcwd(), os.stat('.').st_mtime == 1234567, os.listdir('.'))")
    assert second.status == "ok", second
    cwd, marked, listing = second.stdout.split(maxsplit=2)
    assert (marked, listing.strip()) == ("False", "[]"), second
    assert cwd != first.stdout.split()[0]
    assert_healthy(one_worker)


@pytest.mark.skipif(os.geteuid() != 0, reason="the process backend hides /run only when its server runs as root")
def test_host_unix_sockets_under_run_are_out_of_reach():
    """The network namespace does not cover unix sockets in the file system: the server hides /run."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="sandbox-sock-test-", dir="/run")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "host.sock")
    listener = unix_listener(path)
    box = open_backend("process", workers=1)
    try:
        probe = (
            "import os, socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            f"try:\n    s.connect({path!r})\n    print('connected')\n"
            "except OSError as exc:\n    print(type(exc).__name__)\n"
            "print(sorted(os.listdir('/run')))\n"
        )
        result = box.run(probe)
        assert result.status == "ok", result
        assert result.stdout.splitlines()[0] == "FileNotFoundError", result
        assert os.path.basename(folder) not in result.stdout and "docker.sock" not in result.stdout, result
        assert_healthy(box)
    finally:
        box.close()
        listener.close()
        os.unlink(path)
        os.rmdir(folder)


def test_missing_isolation_is_reported(one_worker):
    """What a run could check before it starts: nothing missing on Docker, or as root on the process backend."""
    if one_worker.backend == "docker" or os.geteuid() == 0:
        assert one_worker.missing_isolation() == []
    shared_uid = open_backend("process", workers=1, isolate_user=False)
    try:
        assert "files" in shared_uid.missing_isolation()
    finally:
        shared_uid.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="the process backend has a /proc of its own only as root")
def test_host_processes_are_invisible_on_the_process_backend():
    box = open_backend("process", workers=1)
    try:
        probe = (
            "import os\npids = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
            f"print(os.path.exists('/proc/1'), os.path.exists('/proc/{os.getpid()}'), "
            "all(os.stat(f'/proc/{p}').st_uid == os.getuid() for p in pids if os.path.exists(f'/proc/{p}')))\n"
        )
        result = box.run(probe)
        assert (result.status, result.stdout) == ("ok", "False False True\n"), result
        assert result.meta["private_proc"] is True, result.meta
        assert "processes" not in box.missing_isolation()
        assert_healthy(box)
    finally:
        box.close()


def test_a_run_is_refused_without_isolation_unless_allowed():
    box = open_backend("process", workers=1, isolate_user=False)
    try:
        with pytest.raises(sandbox.SandboxConfigError, match="files"):
            box.require_isolation()
        assert "files" in box.require_isolation(allow=True)
    finally:
        box.close()
    if os.geteuid() == 0:
        isolated = open_backend("process", workers=1)
        try:
            assert isolated.require_isolation() == []
        finally:
            isolated.close()
