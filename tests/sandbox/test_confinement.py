"""Confinement of a program's whole process tree and of what it can see (docs/sandbox.md, "What isolation holds
where"): the memory and process limits hold for the tree, not per process (a cgroup per worker on the process
backend as root, the container's cgroup on Docker), a program sees no host process (a pid namespace) and no host
file or unix socket outside its own root (interpreter, standard library, work dir), a full /tmp does not make the
next program's writes fail, and after each of these the pool serves the next programs with nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap

import pytest
from sandbox_testlib import BACKENDS, HOSTILE_MEMORY_MB, assert_nothing_left, open_backend, server_fds, unix_listener

import sandbox
from sandbox import forkserver

ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="cgroups, the pid namespace and the programs' own root need the process backend's server to run as root",
)
BLOCK_MB = 90  # what each child of a tree holds: under memory_mb=128 per process, over it for three together


def tree_limit_mb(box: sandbox.Sandbox, memory_mb: int) -> int:
    """The memory the program's tree may hold together: memory_mb (a cgroup per worker) or the container's."""
    if box.backend == "docker":
        return box._pool.launchers[0].container_memory_mb
    return memory_mb


MEMORY_TREE = textwrap.dedent("""
    import os, time
    N, MB = {n}, {mb}
    r, w = os.pipe()
    for _ in range(N):
        if os.fork() == 0:
            block = b"x" * (MB << 20)  # every page written: resident
            os.write(w, b"+")
            time.sleep(60)
            os._exit(0)
    got = 0
    while got < N:
        got += len(os.read(r, N))
    print("held", N * MB, "MiB")
""")


def test_a_process_tree_is_held_to_its_memory_limit(sb):
    """Forked children each under the per-process limit, together over the tree's: the tree is ended, "memory".
    (Each child's RLIMIT_AS alone would let them hold N x memory_mb.)"""
    before = server_fds(sb)
    n = tree_limit_mb(sb, 128) // BLOCK_MB + 2
    r = sb.run(MEMORY_TREE.format(n=n, mb=BLOCK_MB), memory_mb=128, timeout_s=30)
    assert r.status == "memory", r
    if not r.meta.get("tree_memory_polled"):  # the kernel's limit: the tree never got to hold it all
        assert "held" not in r.stdout, r
    # polled (no cgroup): the tree may pass the limit and print between two reads; it is still ended "memory"
    # "memory", not "timeout": the tree was ended at its limit, not at the 30 s wall clock; durations are measured by
    # `selfplay bench sandbox`, not bounded here (a loaded machine stretches them)
    assert "together" in r.meta["reason"] and r.duration_s > 0, r
    assert_nothing_left(sb, before)


def test_a_grading_whose_test_overruns_the_tree_limit_fails_that_test_only(sb):
    """The tree of one test is ended ("memory"); the next test runs in a fresh child and passes."""
    before = server_fds(sb)
    n = tree_limit_mb(sb, HOSTILE_MEMORY_MB) // BLOCK_MB + 2
    hold = textwrap.indent(MEMORY_TREE.format(n=n, mb=BLOCK_MB), "    ")
    solution = f"def hold():\n{hold}\n\ndef f(x):\n    if x == 0:\n        hold()\n    return x\n"
    report = sb.run_tests(solution, "f", [[0], [5]], [0, 5], timeout_s=30)
    assert [t.status for t in report.tests] == ["memory", "ok"], report
    assert report.status == "memory" and report.tests[1].passed, report
    assert_nothing_left(sb, before)


FORK_BOMB = textwrap.dedent("""
    import os, time
    n = 0
    for _ in range(600):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    print(n)
""")


@pytest.fixture(params=BACKENDS)
def same_uid_box(request):
    """As root on the process backend: children under uid 0 without capabilities (isolate_user=False), which
    RLIMIT_NPROC never limits (the kernel exempts uid 0); on Docker the usual containers."""
    if request.param == "process" and os.geteuid() != 0:
        pytest.skip("the pids cgroup needs the process backend's server to run as root")
    box = open_backend(request.param, isolate_user=False) if request.param == "process" else open_backend(request.param)
    yield box
    box.close()


def test_a_fork_bomb_is_held_by_the_pids_limit(same_uid_box):
    box = same_uid_box
    before = server_fds(box)
    limit = box._pool.launchers[0].pids_limit if box.backend == "docker" else forkserver.DEFAULT_NPROC
    r = box.run(FORK_BOMB, timeout_s=30)
    assert r.status == "ok", r
    assert 0 < int(r.stdout) < limit, (r.stdout, limit)
    assert_nothing_left(box, before)


@ROOT_ONLY
def test_a_program_sees_no_host_process():
    """Its own pid namespace: at most its own tree and the namespace's init, and no way to address the server
    (outside the namespace: its parent pid reads 0), with a uid of its own or as uid 0 without capabilities."""
    probe = (
        "import json, os\nchild = os.fork()\nif child == 0:\n    import time; time.sleep(5); os._exit(0)\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(json.dumps({'pids': pids, 'me': os.getpid(), 'child': child, 'ppid': os.getppid()}))\n"
    )
    for options in ({}, {"isolate_user": False}):
        box = open_backend("process", workers=1, **options)
        try:
            before = server_fds(box)
            r = box.run(probe)
            assert r.status == "ok" and r.meta["pid_namespace"] is True, r
            seen = json.loads(r.stdout)
            assert seen["ppid"] == 0, seen  # the server is outside the namespace
            # (a child under a uid of its own is not dumpable: hidepid=2 hides its own children from it too)
            assert seen["me"] in seen["pids"] and set(seen["pids"]) <= {1, seen["me"], seen["child"]}, seen
            assert "processes" not in box.missing_isolation()
            assert_nothing_left(box, before)
        finally:
            box.close()


@pytest.fixture
def host_secrets():
    """A world-readable run folder with a corpus outside every directory the sandbox hides, and a unix socket
    anyone may connect to beside it (what a careless run folder or a host daemon looks like)."""
    folder = tempfile.mkdtemp(prefix="sandbox-confine-test-", dir="/var/lib")
    os.chmod(folder, 0o755)
    corpus = os.path.join(folder, "corpus.sqlite")
    with open(corpus, "w") as f:
        f.write("expected outputs")
    os.chmod(corpus, 0o644)
    path = os.path.join(folder, "host.sock")
    listener = unix_listener(path)
    abstract = unix_listener(f"\0{os.path.basename(folder)}")  # abstract: only the network namespace hides it
    try:
        yield {"corpus": corpus, "socket": path, "abstract": f"\0{os.path.basename(folder)}"}
    finally:
        listener.close()
        abstract.close()
        shutil.rmtree(folder, ignore_errors=True)


READ_AND_CONNECT = textwrap.dedent("""
    import json, os, socket
    out = dict()
    for path in {files!r}:
        try:
            with open(path, "rb") as f:
                out[path] = "read " + f.read(40).decode(errors="replace")
        except OSError as exc:
            out[path] = type(exc).__name__
    for path in {sockets!r}:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            out[repr(path)] = "connected"
        except OSError as exc:
            out[repr(path)] = type(exc).__name__
    import sqlite3, decimal, ctypes  # what programs need still loads: extension modules and their libraries
    sqlite3.connect(":memory:").execute("select 1")
    ctypes.CDLL(None).getpid()
    out["root"] = sorted(os.listdir("/"))
    print(json.dumps(out))
""")


@ROOT_ONLY
def test_host_files_and_sockets_outside_the_programs_root_are_out_of_reach(host_secrets):
    checkout = os.path.abspath(forkserver.__file__)
    munge = "/run/munge/munge.socket.2"
    files = [host_secrets["corpus"], checkout, "/etc/passwd", "/etc/hostname"]
    sockets = [host_secrets["socket"], host_secrets["abstract"], munge, "/run/docker.sock"]
    box = open_backend("process", workers=1)
    try:
        before = server_fds(box)
        r = box.run(READ_AND_CONNECT.format(files=files, sockets=sockets))
        assert r.status == "ok", r
        seen = json.loads(r.stdout)
        for path in files + [repr(s) for s in sockets]:
            assert seen[path] in ("FileNotFoundError", "ConnectionRefusedError", "PermissionError"), (path, seen)
        system = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr"}
        assert set(seen["root"]) <= system | {"dev", "etc", "proc", "run", "tmp", "var", "root"}, seen
        assert r.meta["private_root"] is True and "files" not in box.missing_isolation()
        assert_nothing_left(box, before)
    finally:
        box.close()


FILL_TMP = textwrap.dedent("""
    import os
    chunk, n = b"z" * (16 << 20), 0
    try:
        for i in range(200):
            with open(f"/tmp/fill-{i}", "wb") as f:
                f.write(chunk)
            n += 1
    except OSError as exc:
        print(type(exc).__name__, n)
""")

WRITE_AFTER = textwrap.dedent("""
    import os
    data = os.urandom(1 << 20) * 8
    for path in ("written", "/tmp/written-too"):
        with open(path, "wb") as f:
            f.write(data)
        with open(path, "rb") as f:
            assert f.read() == data, path
    print("wrote", len(data) * 2)
""")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_full_tmp_does_not_fail_the_next_programs_writes(backend):
    """One worker: a program fills /tmp (ENOSPC on Docker's tmpfs; on the process backend as root the tree's
    memory limit, which tmpfs pages count against, may end it first: "memory"); the next program's writes in its
    work dir and /tmp succeed and read back, and nothing of the filler is left."""
    box = open_backend(backend, workers=1, memory_mb=256)
    try:
        before = server_fds(box)
        filler = box.run(FILL_TMP, timeout_s=60)
        assert filler.status in ("ok", "memory"), filler
        if filler.status == "ok":
            assert filler.stdout.startswith("OSError") and int(filler.stdout.split()[1]) > 0, filler
        for _ in range(2):
            after = box.run(WRITE_AFTER, timeout_s=30)
            assert (after.status, after.stdout) == ("ok", f"wrote {16 << 20}\n"), after
        assert_nothing_left(box, before)
    finally:
        box.close()


@ROOT_ONLY
def test_worker_cgroups_go_with_their_workers():
    """Each worker's cgroup exists while it runs and is removed when the pool closes, and when a worker killed
    from outside is replaced (its launcher removes the cgroup the dead server could not)."""
    box = open_backend("process", workers=2)
    try:
        pids = [h["info"]["pid"] for h in box.health()]
        dirs = [d for pid in pids for d in forkserver.worker_cgroup_dirs(pid)]
        assert dirs and all(os.path.isdir(d) for d in dirs), dirs
        os.kill(pids[0], 9)
        results = box.run_many(["print(1)"] * 4)
        assert any(r.meta.get("worker_restarted") for r in results), results
        assert not any(os.path.isdir(d) for d in forkserver.worker_cgroup_dirs(pids[0]))
    finally:
        box.close()
    assert not any(os.path.isdir(d) for d in dirs), dirs


def test_missing_confinement_is_reported():
    """Without the cgroup, the pid namespace and the programs' own root (confine=False, or no root) a sandbox
    says so: "resources", "processes" and "files"; an RL run refuses it unless allowed."""
    box = open_backend("process", workers=1, confine=False)
    try:
        missing = box.missing_isolation()
        assert {"resources", "processes", "files"} <= set(missing), missing
        with pytest.raises(sandbox.SandboxConfigError, match="resources"):
            box.require_isolation()
    finally:
        box.close()


HOSTILE = {  # each leaves something behind if the sandbox let it: processes, files, SysV objects, descriptors
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n",
    "threads": "import threading, time\nfor _ in range(20):\n    threading.Thread(target=time.sleep, args=(60,),"
    " daemon=True).start()\ntime.sleep(60)\n",
    "files": "import os\nfor d in ('/tmp', '/var/tmp', '/dev/shm', '/run/lock', '.'):\n    try:\n"
    "        os.mkfifo(os.path.join(d, 'fifo'))\n        open(os.path.join(d, 'f'), 'w').write('x')\n"
    "        os.chmod(d if d != '.' else '.', 0o500)\n    except OSError:\n        pass\n",
    "sysv": "import ctypes\nlibc = ctypes.CDLL(None)\nfor k in range(5):\n"
    "    libc.shmget(0x5E1F0100 + k, 1 << 16, 0o1666); libc.semget(0x5E1F0200 + k, 1, 0o1666)\n",
    "descriptors": "import os, socket, time\nfds = [os.open('/dev/null', os.O_RDONLY) for _ in range(40)]\n"
    "s = socket.socket(socket.AF_UNIX)\ns.bind('/tmp/listen.sock')\ns.listen(1)\ntime.sleep(60)\n",
    "memory_tree": MEMORY_TREE.format(n=6, mb=BLOCK_MB),
    "tmp_flood": FILL_TMP,
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_nothing_of_a_hostile_program_is_left(sb, kind):
    before = server_fds(sb)
    r = sb.run(HOSTILE[kind], timeout_s=3)
    assert r.status != "sandbox_error", r
    assert_nothing_left(sb, before)


ESCAPE = textwrap.dedent("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    out = []
    # a user namespace would give it CAP_SYS_CHROOT there: the kernel refuses one to a chrooted process
    out.append(("userns", libc.unshare(0x10000000) == 0 and "made" or os.strerror(ctypes.get_errno())))
    try:  # the classic climb: chroot into a subdirectory, then walk up past it
        os.mkdir("x")
        os.chroot("x")
        for _ in range(64):
            os.chdir("..")
        os.chroot(".")
        out.append(("chroot", "escaped", sorted(os.listdir("/"))))
    except OSError as exc:
        out.append(("chroot", type(exc).__name__))
    print(out)
""")


@ROOT_ONLY
def test_a_program_cannot_climb_out_of_its_root():
    for options in ({}, {"isolate_user": False}):
        box = open_backend("process", workers=1, **options)
        try:
            r = box.run(ESCAPE)
            assert r.status == "ok", r
            assert "made" not in r.stdout and "escaped" not in r.stdout, r
            assert "('chroot', 'PermissionError')" in r.stdout, r
        finally:
            box.close()
