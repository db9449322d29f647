"""A fork server that runs untrusted Python programs, one forked child per request.

Stdlib only and free of imports from the `sandbox` package, so the Docker backend can copy this one file into
a container and start it there the same way it is started on the host:

    python3 -I -S forkserver.py --socket /path/to/worker.sock [--uid N|auto] [--no-netns] [--no-private-tmp]
                                [--no-prefork] [--work-dir DIR] [--nproc N] [--fsize-mb N] [--nofile N]
                                [--no-cgroup] [--no-pidns] [--no-private-root] [--container-oom]
                                [--no-seccomp]

Why a fork server: a fresh `python` costs 30-200 ms; forking a small warm process that already imported what
programs commonly use costs a few milliseconds at most. The server is deliberately small (never a fork of a
trainer that imported torch: forking a big process costs ~20 ms). It pre-forks: right after answering, it forks
the next child, which isolates itself and waits on a job pipe, so fork and set-up happen while the client is
busy, not on the latency path; the job (limits, then the source or the request's JSON: job_bytes) then goes
down that pipe and the child applies the request's address-space and CPU limits before running anything.

What a child costs is mostly copy-on-write page faults (each page the child or the server writes after a fork is
a fault, a few microseconds in a VM), so the child path writes as few pages as it can: the pools start the server
with `python -I -S` (no .pth start-up imports, no `threading` and its at-fork hook) and LD_BIND_NOW (no lazy
symbol binding in each child), a program's source reaches its child without JSON, a program's exception is
printed by the interpreter's C printer, and what every child would set the same way (no_new_privs, stdin,
HOME/TMPDIR, sys.argv, ...) the server sets once before forking (ready_for_children).

Protocol (transport-independent: every byte of a result travels inside frames, no descriptor passing, so the
same protocol works over a unix socket in a folder bind-mounted into a container)
---------------------------------------------------------------------------------------------------------
A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON (an object). The client
sends one request frame and reads one response frame; requests are served in order. The server serves a
single connection and exits when it closes, so a client that dies leaves no server behind.

    {"op": "hello"}  -> {"ok": true, "protocol": 1, "pid": int, "python": "3.11.7", "child_uid": int,
                         "network_isolated": bool, "user_isolated": bool, "read_all_files": bool,
                         "private_tmp": bool, "private_dirs": [str], "private_proc": bool, "ipc_isolated": bool,
                         "server_pid": int, "cgroup": "v1" | "v2" | null, "pid_namespace": bool,
                         "private_root": bool, "tree_memory_limit": bool}
    {"op": "ping"}   -> {"ok": true}
    {"op": "stats"}  -> {"ok": true, "workdirs": int, "children": [pid, ...], "ready": pid | null, "fds": int,
                         "cgroup_procs": [pid, ...] | null, "init": pid | null}
                        (leftovers of past programs, the pre-forked child waiting for the next job, the
                        server's open descriptors, processes left in the worker's cgroup, the pid namespace's init)
    {"op": "run", "source": str, "timeout_s": float, "memory_mb": int, "output_limit": int}
                     -> {"status": str, "stdout": str, "stderr": str, "duration_s": float, "meta": {...}}
    {"op": "check", "source": str, "entry_point": str, "test": str (defines check(candidate)), "timeout_s",
     "memory_mb", "output_limit", optional "prompt": str (the problem's own helpers, run in the checker)}
                     -> as "run", meta["check"] = {"passed": bool, "error": str | None} (see child_check)
    {"op": "tests", "source": str, "entry_point": str, "inputs": [[arg, ...], ...],
     "timeout_s": float (module load), "test_timeout_s": float (each test), "stop_on_error": bool,
     "record_calls": bool, "memory_mb": int, "output_limit": int}
                     -> {"status": str, "stdout": str, "stderr": str, "duration_s": float, "meta": {...},
                         "tests": [{"status", "output", "error", "duration_s", "calls"}, ...]}
                        (meta["timing"] = "parent", meta["load_s"]: durations are this server's clock)
    {"op": "shutdown"} -> {"ok": true}, then the server exits.
"run", "check" and "tests" take an optional "clock": "wall" (the default: every timeout is wall-clock time) or
"cpu" (a timeout is the child's CPU time, with a wall-clock cap of CPU_CLOCK_WALL_FACTOR times the limit and
CPU_CLOCK_MIN_CAP_S at least: what a verdict must not owe to the machine's load, e.g. a task's reference;
Server._watch).
A malformed request gets {"status": "sandbox_error", "stderr": reason}. A response with "recycle": reason is the
server's last: it could not remove what the program left, or failed itself; it exits after sending it and the
pool replaces it before the next program (Pool._received). Whatever fails while the server watches a child (a
frame it cannot decode included), the child's process group is killed and reaped and its pipes closed.

Isolation of each child (see sandbox/__init__.py for the whole model)
---------------------------------------------------------------------
- own session and process group (setsid); at the end the group gets SIGKILL, and since the server is a child
  subreaper, descendants that left the group are re-parented to it and killed too;
- rlimits: RLIMIT_AS (memory_mb), RLIMIT_CPU, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0;
- as root, a cgroup per worker (WorkerCgroup: memory and pids, v1 or delegated v2) that every child joins before
  its program runs, so the program's whole tree holds at most memory_mb (set per request) and --nproc tasks; an
  OOM in it ends the tree at once ("memory"). In a container (--container-oom) the container's cgroup bounds the
  tree and its OOM-kill count, read while the program runs, gives the same status; every child sets its
  oom_score_adj to 1000, so the OOM killer picks programs, never the server;
- as root (or inside the unprivileged user namespace), a pid namespace per worker (start_pid_namespace, pid_init):
  programs are pid 2, 3, ... and cannot address the server, which is outside; and a root of their own
  (build_root: read-only system libraries and Python installation, a few /etc files and devices, the private
  temporary dirs) into which every child chroots before it drops root: no host file outside it exists for them;
- when the server runs as root: the child switches to an unprivileged uid of its own (--uid auto), so
  RLIMIT_NPROC counts only this worker's processes, and the child cannot signal the server, read other
  processes' environment, or read/write files that are not world-readable/writable; if the Python
  installation sits in a closed directory (a pyenv under /root), that directory is replaced, in the server's
  mount namespace, by an empty tmpfs into which only the installation is bind-mounted back; only where that
  fails does the child keep CAP_DAC_READ_SEARCH (meta "read_all_files": true: it may read, never write, any
  file); no_new_privs is always set;
- a private temporary working directory (cwd, HOME, TMPDIR), new for every request (no timestamps, extended
  attributes or inode carried over), removed after it without recursion (remove_tree: any depth); as root the server
  also mounts private tmpfs over /tmp, /var/tmp, /dev/shm and every other world-writable directory two levels
  under /run, /var, /dev (/run/lock, ...) in its own mount namespace (size-capped, wiped after every request,
  invisible to the host), after hiding /run (host unix sockets) under an empty tmpfs; in a container
  (--wipe-tmp) the container's own /tmp and /dev/shm are wiped instead;
- as root, a /proc of its own with hidepid=2: a child under its own uid sees only its worker's processes;
- private IPC: the server enters an IPC namespace of its own (as root, or inside its user namespace) and removes
  every SysV shared-memory segment, semaphore set and message queue after each request (in a container, with
  --wipe-ipc, those of the container's namespace): none is seen by the host, another pool or the next program;
- no network: the server enters a new network namespace once at start (as root, or through an unprivileged
  user namespace); where neither is allowed, results say "network_isolated": false;
- a seccomp filter (seccomp.py, beside this file; seccomp_filter), the last step of every child's set-up: keyrings
  (per uid, so they would reach the next program), POSIX message queues, file locks (on shared host inodes),
  sockets of any family but AF_UNIX (AF_VSOCK is outside the network namespace), io_uring and bpf fail with EPERM;
  where the kernel cannot apply it, results say "seccomp": false;
- scrubbed environment (PATH, LANG, PYTHONHASHSEED, and HOME=TMPDIR=the work dir); stdin is /dev/null;
  stdout/stderr are captured up to output_limit bytes together (more ends the program with status "output_limit");
- every descriptor except stdio (and, for tests, the result pipe) is closed before the program runs, so the
  program cannot reach the client connection;
- it dies with the server (PR_SET_PDEATHSIG), and as root without --uid it drops every capability;
- the server ignores the signals a program could send it (ignore_signals: in a container, pid 1 with the
  program's uid, an ignored signal is dropped); the child restores a fresh process's handlers;
- answers of one request total at most MAX_RESULT_BYTES: tests beyond keep no answer ("output_limit");
- answers nest at most MAX_DEPTH lists/dicts deep: a deeper one is "unserializable", a frame nested deeper is a
  protocol violation, decided without a recursive parser (json_too_deep), and clients refuse deeper responses.

Statuses come from what this server observed (Server._exit_status): its deadlines and output count, the wait
status and rusage of the child (CPU time for "timeout" by signal, peak resident set for "memory"), whether the
child read its whole job (only a child that did not may be "sandbox_error"), and for "ok" of a run the
end-of-program exchange: after the program's last statement (and its threads) the harness writes END_ASK on the
result pipe, the server answers with a fresh random nonce on the job pipe, the harness writes END_SAY + nonce. An
exit of any code before that, a signal, or other bytes on the result pipe is never "ok". (The harness shares the
program's process, so a program that drives this exchange itself, deliberately, can still end early as "ok";
nothing is graded on a run's "ok" for that reason: gradings compare answers, and HumanEval uses "check".)

Grading ("tests"): the child imports the solution as module `solution`, calls entry_point(*input) per test and
writes one frame per test to a result pipe: {"t": "test", "i": i, "status", "output", "error", "calls"},
preceded by {"t": "loaded"} (or {"t": "load_error", "error"}) and followed by {"t": "done"}. The server
accepts only well-formed frames, for exactly the next expected test, in order; anything else is a protocol
violation that fails every test of that child. A test's duration is the server's (between arrivals); nothing
in a frame but the answer is believed, and "calls" only by incremental reuse of programs proven unable to touch
it. Expected outputs never reach the server or the child: the client compares. A test that kills its child
(timeout, crash, os._exit) is recorded and the server forks a new child that resumes at the next test (unless
stop_on_error); after a MemoryError the child ends itself so the server can judge it, and the next test resumes.

Checking ("check"): see child_check; the verdict comes from a checker process that runs only trusted code.
"""

from __future__ import annotations

import argparse
import array
import ctypes
import fcntl
import gc
import io
import json
import math
import os
import re
import resource
import select
import shutil
import signal
import socket
import stat
import struct
import sys
import tempfile
import termios
import time
import traceback

TYPE_CHECKING = False  # true to a type checker only: the server imports no module it does not run (not typing)
if TYPE_CHECKING:
    from typing import Any

PROTOCOL = 1
MAX_FRAME = 256 * 1024 * 1024  # largest request/response frame accepted (bytes)
EXIT_ERROR = 1  # harness exit code: the program raised (an exit code means nothing else:
EXIT_HARNESS = 114  # the program can choose any); set-up failed (never read as a status)
END_ASK, END_SAY = b"?", b"!"  # run: after the last statement the child asks for the nonce, says it back
NONCE_BYTES = 32  # the end-of-program nonce, sent only when asked for, after the job
MEMORY_EVIDENCE = 0.5  # "memory" needs a peak resident set >= this share of memory_mb
CPU_SLACK_S = 0.5  # "timeout" by RLIMIT_CPU needs used CPU >= the limit minus this
CLOCKS = ("wall", "cpu")  # a request's "clock": what its timeouts count (see Server._watch)
CPU_CLOCK_WALL_FACTOR = 10  # clock "cpu": a phase still ends at this many times its limit of wall-clock time,
CPU_CLOCK_MIN_CAP_S = 10.0  # and never before this many seconds (a stall of a busy machine is not the program's)
CPU_CLOCK_MIN_WAIT_S = 0.01  # clock "cpu": the shortest wait before the child's CPU time is read again
ACCEPT_TIMEOUT_S = 120  # a server nobody connects to exits after this
RESULT_FD = 3  # the result pipe's descriptor in a grading child
FRAME_SLACK = 64 * 1024  # result frame bytes allowed beyond output_limit (error text, calls)
DRAIN_S = 1.0  # how long to read what killed children left in their pipes
JOB_FD = 4  # where a (pre-forked) child reads its job
JOB_HEADER = ">iIII"  # job: start test (JOB_RUN, JOB_CHECK), memory MiB, CPU s, payload bytes
JOB_RUN, JOB_CHECK = -1, -2  # the "start test" of a run and of a check job
PRELOAD = (  # modules programs commonly import; imported once, shared by fork
    "abc array bisect calendar collections collections.abc copy dataclasses datetime decimal enum fractions "
    "functools hashlib heapq io itertools json math numbers operator random re statistics string "
    "textwrap traceback types typing unicodedata"
).split()
UID_AUTO_BASE = 0x70000000  # --uid auto: this + server pid, unique among live servers, unused
DEFAULT_NPROC = 64  # processes+threads a child may have (per worker uid when root)
DEFAULT_FSIZE_MB = 64  # largest file a child may write
DEFAULT_NOFILE = 64  # open descriptors per child process
DEFAULT_TMPFS_MB = 512  # size of each private tmpfs (root only)
MAX_RESULT_BYTES = 64 << 20  # answers kept per request; tests beyond get "output_limit", no answer
MAX_DEPTH = 100  # deepest answer (lists/dicts) a test may return; deeper is "unserializable"
SERVER_SIGNALS = (
    "SIGINT",
    "SIGTERM",
    "SIGHUP",
    "SIGQUIT",
    "SIGUSR1",
    "SIGUSR2",
    "SIGALRM",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGVTALRM",
    "SIGPROF",
)  # ignored by the server (see main)
STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error")
TEST_STATUSES = ("ok", "error", "unserializable", "output_limit")  # what a child may claim for its own test

_libc = ctypes.CDLL(None, use_errno=True)
_print_exception = sys.__excepthook__  # the interpreter's own printer, whatever a program does to sys later
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWIPC = 0x00020000, 0x10000000, 0x40000000, 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWUTS = 0x04000000
SANDBOX_HOSTNAME = b"sandbox"  # what a program's gethostname() says where the UTS namespace is ours
IPC_RMID = 0
SHARED_DIR_ROOTS = ("/run", "/var", "/dev")  # where private_tmp looks for other world-writable dirs (2 levels)
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV, MS_BIND, MNT_DETACH = 16384, 1 << 18, 2, 4, 4096, 2
MS_NOEXEC, MS_RDONLY, MS_REMOUNT = 8, 1, 32
PR_SET_NO_NEW_PRIVS, PR_SET_KEEPCAPS, PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG = 38, 8, 36, 1
PR_SET_DUMPABLE = 4
CAP_DAC_READ_SEARCH, CAP_KILL = 2, 5
CGROUP_PREFIX = "selfplay-sandbox-"  # a worker's cgroup: CGROUP_PREFIX + server pid, under the server's own
ROOT_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # read-only in a program's root
ROOT_ETC = ("ld.so.cache", "ld.so.conf", "localtime")  # the only files of /etc a program's root holds
ROOT_DEV = ("null", "zero", "full", "random", "urandom")  # device nodes in it
OOM_CHECK_S = 0.05  # how often a container's OOM count is read while a program runs
OOM_SCORE_ADJ = b"1000"  # children are the OOM killer's first choice, never the server or trainer
CLEAN_S = 2.0  # longest a program's clean-up may take; the rest goes with the worker
REMOVE_CHECK = 256  # remove_tree looks at its deadline once per this many entries


# ----------------------------------------------------------------------------------------------- framing
def send_frame(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    sock.sendall(struct.pack(">I", len(data)) + data)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("connection closed")
        got += k
    return bytes(buf)


def recv_frame_bytes(sock: socket.socket) -> bytes:
    (n,) = struct.unpack(">I", recv_exact(sock, 4))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes exceeds {MAX_FRAME}")
    return recv_exact(sock, n)


def recv_frame(sock: socket.socket, max_depth: int | None = None) -> dict:
    """One frame as a dict; ValueError when it is not one JSON object, or (max_depth) nested deeper than that."""
    raw = recv_frame_bytes(sock)
    if max_depth is not None and json_too_deep(raw, max_depth):
        raise ValueError(f"frame nested deeper than {max_depth}")
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise ValueError("frame nested too deep to decode") from None
    if not isinstance(obj, dict):
        raise ValueError("frame is not a JSON object")
    return obj


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)  # compiled here: a program cannot rebind them
_JSON_LEAF = re.compile(rb"\[\]|\{\}")
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def json_too_deep(data, limit: int, _count=bytes.count, _len=len) -> bool:
    """Whether JSON text nests lists/objects deeper than `limit`, decided without parsing it (so without
    recursion, whatever its depth): strip strings, keep only brackets, then remove innermost pairs one level
    per pass (a pass is one C-level regex substitution; at most limit + 1 passes)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if _count(data, b"[") + _count(data, b"{") <= limit:  # the common case: too few brackets to be too deep
        return False
    data = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    for _ in range(limit):
        if not data:
            return False
        data, n = _JSON_LEAF.subn(b"", data)
        if n == 0:  # unbalanced brackets: not JSON; let the parser refuse it, at a depth we now know is bounded
            return _len(data) > limit
    return _len(data) > 0


def remove_tree(path: str, deadline: float | None = None) -> bool:
    """Remove `path` and everything under it, iteratively (any depth, any path length: it walks by descriptors,
    one open at a time, up through ".."), making closed directories accessible first. Symlinks are removed, never
    followed. True when nothing is left; never raises. With a `deadline` (time.monotonic()), it gives up once past
    it, leaving the rest (False): however many entries a program made, its clean-up is bounded in time, and what
    is left goes with the worker (Server._clean_tmp)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = -1
    budget = REMOVE_CHECK  # entries until the next look at the clock
    try:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path)
            return True
        if os.geteuid() != 0:
            os.chmod(path, 0o700)
        fd = os.open(path, flags)
        names: list[str] = []
        while True:
            sub = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    budget -= 1
                    if budget <= 0 and deadline is not None:
                        if time.monotonic() > deadline:
                            return False
                        budget = REMOVE_CHECK
                    if entry.is_dir(follow_symlinks=False):
                        sub = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
            if sub is not None:
                if os.geteuid() != 0:
                    os.chmod(sub, 0o700, dir_fd=fd)
                down = os.open(sub, flags, dir_fd=fd)
                os.close(fd)
                fd = down
                names.append(sub)
                continue
            if not names:
                break
            up = os.open("..", flags, dir_fd=fd)
            os.close(fd)
            fd = up
            os.rmdir(names.pop(), dir_fd=fd)
        os.close(fd)
        fd = -1
        os.rmdir(path)
        return True
    except Exception:  # noqa: BLE001 - the caller recycles the worker when something is left
        return not os.path.lexists(path)
    finally:
        if fd >= 0:
            os.close(fd)


# ------------------------------------------------------------------------------------- server set-up
def _unshare(flags: int) -> bool:
    return _libc.unshare(flags) == 0


USERNS_SYSCTLS = ("kernel.unprivileged_userns_clone", "user.max_user_namespaces")  # what turns them on or off
PR_CAPBSET_DROP, PR_SET_SECUREBITS, SECBIT_NOROOT, SECBIT_NOROOT_LOCKED = 24, 28, 1, 2


def userns_sysctls() -> str:
    """The sysctls that allow or refuse unprivileged user namespaces, as this kernel has them ("name=value")."""
    found = []
    for name in USERNS_SYSCTLS:
        try:
            with open("/proc/sys/" + name.replace(".", "/")) as f:
                found.append(f"{name}={f.read().strip()}")
        except OSError:
            pass
    return ", ".join(found) or "neither sysctl exists"


def enter_user_namespace() -> str | None:
    """Without root: enter a user namespace of our own, whose id map holds one id (our uid and gid, as 0 in it: no
    setuid helper such as newuidmap is needed, so there is no second uid for children), so that the network, IPC,
    mount and pid namespaces, the private tmpfs and the programs' root (Server.__init__) need no privilege outside
    it. What a uid per worker gives as root is replaced by: that one uid owns nothing outside the programs' root,
    every child drops every capability (_child_setup) and can regain none (an empty bounding set, SECBIT_NOROOT,
    no_new_privs; chrooted, it cannot make a user namespace), and each program gets a fresh work dir on a private
    tmpfs. None when it worked, else why not (reported by missing_isolation, with the sysctls to look at)."""
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(CLONE_NEWUSER) != 0:
        err = ctypes.get_errno()
        return f"the kernel refused an unprivileged user namespace ({os.strerror(err)}; {userns_sysctls()})"
    _write("/proc/self/setgroups", "deny")  # as the namespace's creator this cannot fail; if it did, we would
    _write("/proc/self/uid_map", f"0 {uid} 1")  # be an unmapped uid: better not to start (the pool says why)
    _write("/proc/self/gid_map", f"0 {gid} 1")
    for cap in range(64):  # the server keeps its capabilities in the namespace; children can never regain one
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    _libc.prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED, 0, 0, 0)
    return None


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def isolate_network() -> bool:
    """Enter a new network namespace (only loopback, down). True when it worked."""
    if os.geteuid() == 0 and _unshare(CLONE_NEWNET):
        return True
    uid, gid = os.geteuid(), os.getegid()
    if not _unshare(CLONE_NEWUSER | CLONE_NEWNET):
        return False
    try:  # map ourselves to root inside the new user namespace so we keep working as before
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    except OSError:
        pass
    return True


def isolate_uts() -> bool:
    """Enter a new UTS namespace named SANDBOX_HOSTNAME: a program sees neither the host's name nor its domain name.
    Works as root, or inside the user namespace isolate_network made. True when it worked."""
    if not _unshare(CLONE_NEWUTS):
        return False
    return _libc.sethostname(SANDBOX_HOSTNAME, len(SANDBOX_HOSTNAME)) == 0


def isolate_ipc() -> bool:
    """Enter a new IPC namespace (SysV shared memory, semaphores, message queues and POSIX message queues of our
    own: nothing a program creates is visible outside this server, and the server removes it after each program).
    Works as root, or inside the user namespace isolate_network made. True when it worked."""
    return _unshare(CLONE_NEWIPC)


def remove_sysv_ipc() -> int:
    """Remove every SysV shared-memory segment, semaphore set and message queue of this IPC namespace (the
    server's own, or a container's); returns how many. Only ever called where the namespace is ours."""
    removed = 0
    for kind, ctl in (("shm", _libc.shmctl), ("sem", _libc.semctl), ("msg", _libc.msgctl)):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 1 and fields[1].isdigit():
                ipc_id = int(fields[1])
                if (ctl(ipc_id, 0, IPC_RMID, None) if kind == "sem" else ctl(ipc_id, IPC_RMID, None)) == 0:
                    removed += 1
    return removed


def shared_dirs() -> list[str]:
    """World-writable directories through which programs could leave notes for later ones: /tmp, /var/tmp,
    /dev/shm, and any other within two levels of SHARED_DIR_ROOTS (such as /run/lock)."""
    found = ["/tmp", "/var/tmp", "/dev/shm"]
    level = list(SHARED_DIR_ROOTS)
    for _ in range(2):
        below = []
        for base in level:
            try:
                entries = list(os.scandir(base))
            except OSError:
                continue
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        below.append(e.path)
                        if e.stat(follow_symlinks=False).st_mode & stat.S_IWOTH and e.path not in found:
                            found.append(e.path)
                except OSError:
                    pass
        level = below
    return [p for p in found if os.path.isdir(p) and not os.path.islink(p)]


HIDDEN_DIRS = ("/run",)  # host sockets (munge, docker, dbus), pid files: replaced by an empty tmpfs (root only)


def private_proc() -> bool:
    """Mount a /proc of our own with hidepid=2 in our mount namespace (root only, after private_tmp entered it): a
    child under a uid of its own then sees only its own worker's processes, not the host's command lines,
    environments or open files; the server (root) still sees all. True when it worked."""
    return _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=2") == 0


def private_tmp(size_mb: int) -> list[str]:
    """Give this server private tmpfs mounts over every shared (world-writable) directory (root only), after
    hiding HIDDEN_DIRS under empty ones (so no host unix socket there can be reached: the network namespace does
    not cover sockets in the file system); world-writable dirs that were inside them (/run/lock) come back as
    private tmpfs. Returns the shared dirs mounted (empty when it did not work)."""
    if os.geteuid() != 0 or not _unshare(CLONE_NEWNS):
        return []
    if _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return []
    shared = shared_dirs()
    for hidden in HIDDEN_DIRS:
        if (
            os.path.isdir(hidden)
            and not os.path.islink(hidden)
            and _libc.mount(b"tmpfs", hidden.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755") == 0
        ):
            for path in shared:
                if path.startswith(hidden + os.sep):
                    os.makedirs(path, mode=0o755, exist_ok=True)
    mounted = []
    for path in shared:
        opts = f"size={size_mb}m,mode=1777".encode()
        if _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) == 0:
            mounted.append(path)
    return mounted


def _blocking_ancestor(path: str) -> str | None:
    """The first directory on the way to `path` that other users may not enter or read (None: all open)."""
    parts = os.path.realpath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        p = os.sep.join(parts[:i])
        try:
            mode = os.stat(p).st_mode
        except OSError:
            return None
        if not (mode & stat.S_IXOTH and mode & stat.S_IROTH):
            return p
    return None


def python_paths() -> list[str]:
    """Directories a child needs to read to import modules (the installation, sys.path)."""
    found = {os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, *sys.path) if p}
    paths = sorted(p for p in found if os.path.isdir(p))
    return [p for p in paths if not any(p.startswith(q + os.sep) for q in paths if q != p)]


def expose_python(paths: list[str]) -> bool:
    """Let an unprivileged child read the Python installation when it sits in a closed directory (e.g. a pyenv
    under /root, mode 700): mount an empty tmpfs over the closed directory, hiding everything else in it, and
    bind-mount the needed paths back in. Root only, inside our private mount namespace. True when nothing is
    left blocked."""
    blocked: dict[str, list[str]] = {}
    for p in paths:
        anc = _blocking_ancestor(p)
        if anc is not None:
            blocked.setdefault(anc, []).append(p)
    if not blocked:
        return True
    stage = tempfile.mkdtemp(prefix="sandbox-stage-")
    for k, (anc, needed) in enumerate(sorted(blocked.items())):
        if any(anc.startswith(other + os.sep) for other in blocked):
            return False  # nested closed directories: keep it simple and let the caller fall back
        staged = []
        for j, p in enumerate(needed):
            tmp = os.path.join(stage, f"{k}-{j}")
            os.mkdir(tmp)
            if _libc.mount(p.encode(), tmp.encode(), None, MS_BIND | MS_REC, None) != 0:
                return False
            staged.append((p, tmp))
        if _libc.mount(b"tmpfs", anc.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755") != 0:
            return False
        for p, tmp in staged:
            os.makedirs(p, mode=0o755, exist_ok=True)
            if _libc.mount(tmp.encode(), p.encode(), None, MS_BIND | MS_REC, None) != 0:
                return False
            _libc.umount2(tmp.encode(), MNT_DETACH)
    shutil.rmtree(stage, ignore_errors=True)
    return all(_blocking_ancestor(p) is None for p in paths)


# ------------------------------------------------------------------- a root of its own (root only)
def _bind(src: str, dst: str, readonly: bool, nodev: bool = True) -> bool:
    """Bind-mount src on dst (not recursive: mounts below src stay out); read-only and nosuid when asked."""
    if _libc.mount(src.encode(), dst.encode(), None, MS_BIND, None) != 0:
        return False
    if readonly:
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (MS_NODEV if nodev else 0)
        if _libc.mount(None, dst.encode(), None, flags, None) != 0:
            _libc.umount2(dst.encode(), MNT_DETACH)
            return False
    return True


def _mkdirs(root: str, path: str) -> str:
    target = root + path
    os.makedirs(target, mode=0o755, exist_ok=True)
    return target


def build_root(readable: list[str], writable: list[str]) -> str | None:
    """A root file tree for programs, in our private mount namespace (root only; children chroot into it,
    Server._fork_child): an empty read-only tmpfs holding, at their usual paths, read-only binds of the system
    directories (ROOT_SYSTEM: the interpreter's shared libraries) and of `readable` (the Python installation), a
    few files of /etc (ROOT_ETC), a /dev of a few device nodes, and read-write binds of `writable` (our private
    tmpfs mounts: /tmp, which holds the work dirs, /var/tmp, /dev/shm, /run/lock, ...). Nothing else of the host:
    no /home, /root, /work, /srv, /opt, /mnt, /var, /etc, /sys, no project checkout or run folder. /proc is
    mounted later, from inside the pid namespace (pid_init), else by mount_root_proc. Returns its path, or None
    when any step failed (the caller then runs without it: meta "private_root": false)."""
    try:
        root = tempfile.mkdtemp(prefix="sandbox-root-", dir="/run")  # /run: our own empty tmpfs (private_tmp)
        if _libc.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755") != 0:
            return None
        bound: list[str] = []
        for path in ROOT_SYSTEM:
            if os.path.islink(path):
                os.symlink(os.readlink(path), root + path)
            elif os.path.isdir(path):
                if not _bind(path, _mkdirs(root, path), readonly=True):
                    return None
                bound.append(path)
        for path in sorted(set(readable)):
            if os.path.isdir(path) and not any(path == b or path.startswith(b + os.sep) for b in bound):
                if not _bind(path, _mkdirs(root, path), readonly=True):
                    return None
                bound.append(path)
        _mkdirs(root, "/etc")
        for name in ROOT_ETC:
            src = os.path.join("/etc", name)
            if os.path.islink(src):
                os.symlink(os.readlink(src), root + src)
            elif os.path.isfile(src):
                open(root + src, "w").close()
                if not _bind(src, root + src, readonly=True):
                    return None
        _mkdirs(root, "/dev")
        for name in ROOT_DEV:
            src = os.path.join("/dev", name)
            if os.path.exists(src):
                open(root + src, "w").close()
                if not _bind(src, root + src, readonly=True, nodev=False):
                    return None
        for name, target in (
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ):
            os.symlink(target, f"{root}/dev/{name}")
        for path in ("/proc", "/run"):
            _mkdirs(root, path)
        for path in writable:
            if not _bind(path, _mkdirs(root, path), readonly=False):
                return None
        if _libc.mount(None, root.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None) != 0:
            return None
        return root
    except OSError:
        return None


def mount_root_proc(root: str) -> bool:
    """/proc in the programs' root with hidepid=2 (a program sees only its own uid's processes), mounted by the
    calling process: from pid_init, a /proc of the pid namespace; from the server, of the host's pids."""
    return _libc.mount(b"proc", f"{root}/proc".encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=2") == 0


# ---------------------------------------------------------------------- a pid namespace (root only)
SWEEP, SWEPT, SWEEP_LEFT = b"k", b"1", b"0"  # server -> init: kill all; init -> server: done / some remain


def pid_init(cmd_fd: int, ack_fd: int, root: str | None) -> None:
    """Pid 1 of the server's pid namespace: every child the server forks after start_pid_namespace is in it (pid
    2, 3, ...), sees no host process, and any descendant whose parent dies is re-parented here (not to the
    server, which is outside) and reaped at once (SIGCHLD ignored). It mounts the namespace's /proc in the
    programs' root, keeps only CAP_KILL, and on SWEEP kills every process of the namespace but itself. Programs
    cannot signal it (another uid; pid 1 ignores signals from inside anyway). It dies with the server
    (PDEATHSIG), and with it every process of the namespace. Never returns."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.setsid()
    high_cmd, high_ack = (fcntl.fcntl(fd, fcntl.F_DUPFD, 1000) for fd in (cmd_fd, ack_fd))
    os.dup2(high_cmd, 3)
    os.dup2(high_ack, 4)
    os.closerange(5, 1 << 20)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    ok = root is None or mount_root_proc(root)
    if root is not None:
        os.chroot(root)
        os.chdir("/")
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = 1 << CAP_KILL
    _libc.capset(ctypes.byref(header), data)
    os.write(4, b"1" if ok else b"0")
    while True:
        try:
            cmd = os.read(3, 1)
        except InterruptedError:
            continue
        if not cmd:
            os._exit(0)
        deadline = time.monotonic() + 2.0
        while True:
            try:
                os.kill(-1, signal.SIGKILL)  # every process of the namespace but pid 1; zombies count until reaped
            except ProcessLookupError:
                os.write(4, SWEPT)
                break
            except OSError:
                pass
            if time.monotonic() > deadline:
                os.write(4, SWEEP_LEFT)
                break
            time.sleep(0.0005)


def start_pid_namespace(root: str | None) -> tuple[int, int, int] | None:
    """unshare(CLONE_NEWPID) and fork the namespace's init (pid_init): (its pid, our command fd, its answer fd),
    or None where it failed (the server then forks children into its own pid namespace)."""
    if not _unshare(CLONE_NEWPID):
        return None
    cmd_r, cmd_w = os.pipe()
    ack_r, ack_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            pid_init(cmd_r, ack_w, root)
        finally:
            os._exit(1)
    os.close(cmd_r)
    os.close(ack_w)
    if os.read(ack_r, 1) != b"1":
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(cmd_w)
        os.close(ack_r)
        return None
    return pid, cmd_w, ack_r


class TreeMemory:
    """Where the worker has no cgroup (not root): the program's whole tree held to memory_mb by the server itself,
    read every OOM_CHECK_S while a program runs (Server._watch polls it as it polls a container's OOM count). It
    sums the proportional set size (Pss: a page shared by n processes counts 1/n in each, so what a fork shares
    with its parent counts once) of every process the server's children left, through the pid namespace's init
    (which reaps orphans: its own Pss is not counted); over memory_mb the server ends the tree, "memory". A single
    process is already held by its RLIMIT_AS, so until the program forks only the lists of children are read. It
    is not the kernel's limit: between two reads a tree may pass it (each process within its RLIMIT_AS), but it is
    read again whenever a result arrives, so no answer given while the tree is over the limit is taken; files in
    the private tmpfs count against the tmpfs size, not here."""

    def __init__(self, server_pid: int, init_pid: int | None):
        self.server_pid, self.init_pid = server_pid, init_pid
        self.memory_mb: int | None = None  # the request's (Server._start)

    def _tree(self) -> list[int]:
        found, todo = [], [self.server_pid]
        while todo:
            pid = todo.pop()
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/children") as f:
                        kids = [int(k) for k in f.read().split()]
                except (OSError, ValueError):
                    continue
                todo += kids
                found += [k for k in kids if k != self.init_pid]
        return found

    def oom_fired(self) -> bool:
        if not self.memory_mb:
            return False
        tree = self._tree()
        if len(tree) < 2:
            return False
        total_kb = 0
        for pid in tree:
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Pss:"):
                            total_kb += int(line.split()[1])
                            break
            except (OSError, ValueError):
                continue
        return total_kb > self.memory_mb * 1024


# ------------------------------------------------------------------ a cgroup per worker (root only)
def _cgroup_mounts() -> list[tuple[str, str, str, set]]:
    """(mount point, root inside the hierarchy, fstype, super options) of every cgroup mount we see."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rest = left.split(), right.split()
                if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                    unescape = lambda s: s.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
                    out.append((unescape(fields[4]), unescape(fields[3]), rest[0], set(rest[2].split(","))))
    except OSError:
        pass
    return out


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for the v2 hierarchy) -> this process's cgroup path in it, from /proc/self/cgroup."""
    out = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) == 3:
                    for ctrl in parts[1].split(",") if parts[1] else [""]:
                        out[ctrl] = parts[2]
    except OSError:
        pass
    return out


def _hierarchy_dir(mount: str, mount_root: str, path: str) -> str | None:
    if mount_root != "/" and not (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        return None
    rel = path[len(mount_root) :] if mount_root != "/" else path
    return os.path.join(mount, rel.lstrip("/"))


def cgroup_parents() -> tuple[str, dict[str, str]] | None:
    """Where a worker's cgroups go: ("v1", {"memory": dir, "pids": dir}) or ("v2", {"": dir}), each dir the
    calling process's own cgroup (so a worker stays under whatever limits its parent has), or None."""
    mounts, own = _cgroup_mounts(), _own_cgroups()
    v1: dict[str, str] = {}
    for ctrl in ("memory", "pids"):
        for mount, mroot, fstype, opts in mounts:
            if fstype == "cgroup" and ctrl in opts and ctrl in own:
                d = _hierarchy_dir(mount, mroot, own[ctrl])
                if d and os.path.isdir(d):
                    v1[ctrl] = d
                    break
    if len(v1) == 2:
        return "v1", v1
    for mount, mroot, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            d = _hierarchy_dir(mount, mroot, own[""])
            if d and os.path.isdir(d):
                return "v2", {"": d}
    return None


def worker_cgroup_dirs(server_pid: int) -> list[str]:
    """The cgroup directories WorkerCgroup.create makes for the server `server_pid` (started by this process,
    so under this process's cgroups), whether or not they exist: for the launcher to remove after the server."""
    found = cgroup_parents()
    if found is None:
        return []
    return [os.path.join(d, f"{CGROUP_PREFIX}{server_pid}") for d in found[1].values()]


def remove_cgroup_dirs(dirs: list[str], wait_s: float = 2.0) -> list[str]:
    """rmdir each cgroup (it goes once its last process is gone: retried for wait_s); returns those left."""
    deadline = time.monotonic() + wait_s
    left = [d for d in dirs if os.path.isdir(d)]
    while left:
        still = []
        for d in left:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                still.append(d)
        left = still
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return left


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists (ours to signal or not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkerCgroup:
    """A cgroup of this worker's own (memory and pids controllers; v1, or v2 where the parent delegates them)
    that every child joins before its program runs (Server._fork_child), so the limits hold for the program's
    whole tree, not per process: memory (set per request to memory_mb: resident memory, page cache and tmpfs
    files the tree charges, swap included) and pids (processes + threads). Over the memory limit the kernel's
    OOM killer acts inside this cgroup only; the server is told (an eventfd on v1, POLLPRI on v2's memory.events)
    and kills the tree at once: status "memory". The server itself stays outside it."""

    def __init__(self, version: str, dirs: dict[str, str]):
        self.version, self.dirs = version, dirs
        self.memory_dir = dirs["memory"] if version == "v1" else dirs[""]
        self.pids_dir = dirs["pids"] if version == "v1" else dirs[""]
        self.attach_fds = [
            os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC) for d in dict.fromkeys(dirs.values())
        ]
        self.pids_current = os.open(os.path.join(self.pids_dir, "pids.current"), os.O_RDONLY | os.O_CLOEXEC)
        self.memory_mb: int | None = None
        if version == "v1":
            self.notify_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            oom = os.open(os.path.join(self.memory_dir, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
            try:
                _write(os.path.join(self.memory_dir, "cgroup.event_control"), f"{self.notify_fd} {oom}")
            finally:
                os.close(oom)
            self.notify_events = select.POLLIN
        else:
            self.notify_fd = os.open(os.path.join(self.memory_dir, "memory.events"), os.O_RDONLY | os.O_CLOEXEC)
            self.notify_events = select.POLLPRI | select.POLLERR
            self._ooms = self._v2_ooms()

    @classmethod
    def create(cls, nproc: int) -> WorkerCgroup | None:
        """Make this server's cgroup(s) under its own (removing those of dead servers there first); None where
        cgroups cannot be made (not root, a read-only cgroupfs, controllers not delegated on v2)."""
        found = cgroup_parents()
        if found is None:
            return None
        version, parents = found
        dirs = {}
        try:
            for ctrl, parent in parents.items():
                for name in os.listdir(parent):
                    if (
                        name.startswith(CGROUP_PREFIX)
                        and name[len(CGROUP_PREFIX) :].isdigit()
                        and not pid_alive(int(name[len(CGROUP_PREFIX) :]))
                    ):
                        remove_cgroup_dirs([os.path.join(parent, name)], wait_s=0)
                if version == "v2":
                    with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                        enabled = set(f.read().split())
                    if not {"memory", "pids"} <= enabled:
                        _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
                d = os.path.join(parent, f"{CGROUP_PREFIX}{os.getpid()}")
                os.mkdir(d, 0o755)
                dirs[ctrl] = d
            _write(os.path.join(dirs["pids" if version == "v1" else ""], "pids.max"), str(nproc))
            if version == "v2":
                _write(os.path.join(dirs[""], "memory.oom.group"), "1")
            return cls(version, dirs)
        except OSError:
            remove_cgroup_dirs(list(dirs.values()), wait_s=0)
            return None

    def _v2_ooms(self) -> int:
        data = os.pread(self.notify_fd, 4096, 0).decode()
        for line in data.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom":
                return int(value)
        return 0

    def set_memory(self, memory_mb: int) -> bool:
        """The tree's memory limit, memory_mb MiB, swap included (written only when it changes)."""
        if memory_mb == self.memory_mb:
            return True
        value = str(memory_mb * 1024 * 1024)
        if self.version == "v1":
            files = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]  # memsw must stay >= the limit:
            if self.memory_mb is not None and memory_mb > self.memory_mb:  # raise it first, lower it last
                files.reverse()
        else:
            files = ["memory.max", "memory.swap.max"]
        ok = True
        for name in files:
            path = os.path.join(self.memory_dir, name)
            if not os.path.exists(path):
                continue
            try:
                _write(path, value if name != "memory.swap.max" else "0")
            except OSError:
                ok = False
        self.memory_mb = memory_mb if ok else None
        return ok

    def oom_fired(self) -> bool:
        """Whether the tree hit its memory limit (and the OOM killer acted) since the last call."""
        if self.version == "v1":
            try:
                return int.from_bytes(os.read(self.notify_fd, 8), sys.byteorder) > 0
            except BlockingIOError:
                return False
        ooms = self._v2_ooms()
        fired, self._ooms = ooms > self._ooms, ooms
        return fired

    def tasks(self) -> int:
        """Processes and threads in the cgroup (pids.current)."""
        return int(os.pread(self.pids_current, 64, 0) or b"0")

    def procs(self) -> list[int]:
        """The processes in the cgroup (pids as the server sees them)."""
        with open(os.path.join(self.pids_dir, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]

    def close(self) -> list[str]:
        """Close our descriptors and remove the cgroup (its processes must be gone); returns what is left."""
        for fd in (*self.attach_fds, self.pids_current, self.notify_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.attach_fds = []
        return remove_cgroup_dirs(list(self.dirs.values()))


class ContainerOom:
    """Inside a container (--container-oom): the container's own memory cgroup, read-only, seen at
    /sys/fs/cgroup/memory (v1) or /sys/fs/cgroup (v2 with a cgroup namespace). The container's limit bounds the
    program's whole tree (one program at a time per container); its OOM-kill count, read while a program runs
    (every OOM_CHECK_S) and after it, says whether the OOM killer ended one of its processes."""

    PATHS = (("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"), ("/sys/fs/cgroup/memory.events", "oom_kill"))

    def __init__(self, path: str, key: str):
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.key = key
        self.kills = self._kills()

    @classmethod
    def open(cls) -> ContainerOom | None:
        for path, key in cls.PATHS:
            try:
                return cls(path, key)
            except (OSError, ValueError):
                continue
        return None

    def _kills(self) -> int:
        for line in os.pread(self.fd, 4096, 0).decode().splitlines():
            key, _, value = line.partition(" ")
            if key == self.key:
                return int(value)
        raise ValueError(f"no {self.key} count")

    def oom_fired(self) -> bool:
        try:
            kills = self._kills()
        except (OSError, ValueError):
            return False
        fired, self.kills = kills > self.kills, kills
        return fired


def _count_user_processes(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _cap_args(keep_read: bool) -> tuple:
    """capset() arguments that keep CAP_DAC_READ_SEARCH only, or nothing (built once in the server)."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = (1 << CAP_DAC_READ_SEARCH) if keep_read else 0
    return ctypes.byref(header), data, header


def scrub_environment() -> None:
    """Leave only what Python needs in this (server) process's environment; children inherit it."""
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "PYTHONHASHSEED") if k in os.environ}
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **keep})


def ignore_signals() -> None:
    """The server ignores every signal a program could send it (in a container, where the program shares its
    uid, and the server is pid 1, an ignored signal is dropped by the kernel: even SIGKILL and SIGSTOP from inside
    are). Children restore the defaults (_child_setup) before anything of theirs runs."""
    for name in SERVER_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)


def _default_signals(_signal=signal.signal, _dfl=signal.SIG_DFL) -> None:
    for name in SERVER_SIGNALS:
        _signal(getattr(signal, name), signal.default_int_handler if name == "SIGINT" else _dfl)


def ready_for_children() -> None:
    """Once, before the first fork: the interpreter state a program finds, as in a fresh process. Set here in the
    server, not in each child, because each page a child writes is a copy-on-write fault (~3 us here); children
    inherit it, and the server changes none of it afterwards (HOME and TMPDIR: Server._fork_child)."""
    tempfile.tempdir = None  # the server's own mkdtemp calls pass dir= from now on; children honour TMPDIR
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__  # see install_stdio()
    sys.argv = ["<program>"]
    sys.setrecursionlimit(1000)


def seccomp_filter():
    """The children's seccomp filter (sandbox/seccomp.py: keyrings, POSIX message queues, file locks, sockets of
    any family but AF_UNIX, io_uring and bpf fail with EPERM), built once here in the server and installed by
    every child last in _child_setup; None where this machine cannot apply it (no seccomp in the kernel, another
    architecture, or the file missing beside this one), which results say (meta "seccomp": false). Loaded by path:
    the server runs as a script, in a container too, without the `sandbox` package on sys.path."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seccomp.py")
    try:
        spec = importlib.util.spec_from_file_location("_sandbox_seccomp", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        filt = module.build()
        return filt if filt is not None and module.works(filt) else None
    except (OSError, ImportError, AttributeError):
        return None


def install_stdio() -> None:
    """Standard streams on descriptors 0-2 that children reuse (they dup their pipes onto 0-2)."""
    # sys.__stdin__ and the others are Final to a type checker: this server replaces them on purpose
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(  # type: ignore[misc]
        io.FileIO(0, "r", closefd=False), encoding="utf-8"
    )
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(  # type: ignore[misc]
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace"
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(  # type: ignore[misc]
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )


# ---------------------------------------------------------------------------------------- the child
def cpu_budget_s(req: dict) -> float:
    """Seconds of CPU a request may use in total (module load plus every test)."""
    total = float(req["timeout_s"])
    if req.get("op") == "tests":
        total += len(req["inputs"]) * float(req.get("test_timeout_s") or req["timeout_s"])
    return total


def cpu_clock_cap_s(limit: float) -> float:
    """Clock "cpu": the wall-clock time after which a phase (load, run or test) of CPU limit `limit` ends anyway."""
    return max(CPU_CLOCK_WALL_FACTOR * limit, CPU_CLOCK_MIN_CAP_S)


def wall_budget_s(req: dict) -> float:
    """The longest wall-clock time a request's program may legitimately run (its deadlines together): the CPU
    budget, or under the "cpu" clock the sum of its phases' caps (cpu_clock_cap_s)."""
    if req.get("clock") != "cpu":
        return cpu_budget_s(req)
    total = cpu_clock_cap_s(float(req["timeout_s"]))
    if req.get("op") == "tests":
        total += len(req["inputs"]) * cpu_clock_cap_s(float(req.get("test_timeout_s") or req["timeout_s"]))
    return total


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system, every thread) process `pid` has used, as the kernel counts them
    (/proc/PID/stat); None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


try:
    _CLK_TCK = float(os.sysconf("SC_CLK_TCK"))
except (OSError, ValueError):
    _CLK_TCK = 100.0


def _child_setup(cfg: dict, workdir: str, out_w: int, err_w: int, res_w: int, job_r: int) -> None:
    """Runs in the forked child before it knows its job: isolation and fixed limits."""
    os.setsid()
    _default_signals()  # the server ignores them (ignore_signals); a program gets what a fresh process has
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # if the program kills the server, it dies too
    for fd in cfg["cgroup_fds"]:  # join the worker's cgroup (WorkerCgroup) before anything of the program runs
        os.write(fd, b"0")
    if cfg["oom_adj"]:  # the OOM killer's first choice (raising it needs no privilege; a program cannot lower
        try:  # it below the server's again)
            fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
            try:
                os.write(fd, OOM_SCORE_ADJ)
            finally:
                os.close(fd)
        except OSError:
            pass
    os.dup2(cfg["null"], 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(res_w, RESULT_FD)
    os.dup2(job_r, JOB_FD)
    os.closerange(JOB_FD + 1, 1 << 20)  # the client connection, the listening socket, other pipes, pidfds
    if cfg["root"] is not None:  # the programs' root (build_root); chrooted, it cannot make a user namespace
        os.chroot(cfg["root"])  # (the kernel refuses CLONE_NEWUSER in a chroot), so it cannot chroot out
    os.chdir(workdir)  # (same path inside: /tmp is bound into the root)
    limits = [  # address space and CPU come with the job
        (resource.RLIMIT_FSIZE, cfg["fsize_mb"] * 1024 * 1024),
        (resource.RLIMIT_NOFILE, cfg["nofile"]),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, cfg["nproc"]),
    ]
    for which, value in limits:
        resource.setrlimit(which, (value, value))
    if cfg["uid"] is not None:
        if cfg["read_cap"]:
            _libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
        if cfg["read_cap"] and _libc.capset(cfg["cap_args"][0], cfg["cap_args"][1]) != 0:
            raise OSError(ctypes.get_errno(), "capset failed")
    elif os.geteuid() == 0 and _libc.capset(cfg["cap_args"][0], cfg["cap_args"][1]) != 0:  # root, no uid:
        raise OSError(ctypes.get_errno(), "capset failed")  # at least no capabilities (no mount, setns, ...)
    if not cfg["no_new_privs"]:  # normally inherited from the server (Server.__init__), like what follows:
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if cfg.get("seccomp") is not None:  # last: keyrings, message queues, locks, sockets but AF_UNIX (seccomp.py)
        cfg["seccomp"].install()  # fail with EPERM for the program and every process it makes
    # the server set, before forking us, what a program sees as a fresh process would (each page written here
    # would be a copy-on-write fault in every child): HOME=TMPDIR=workdir (Server._fork_child), tempfile.tempdir
    # None, sys.argv, the recursion limit and sys.std* = sys.__std*__ (Server.ready_for_children); `random`
    # reseeds itself from os.urandom after every fork (os.register_at_fork), as a fresh process would


def _read_fd(fd: int, n: int, _len=len, _min=min) -> bytes:  # builtins bound here: a program may rebind them
    chunks = []
    while n:
        data = _os_read(fd, _min(n, 1 << 20))
        if not data:
            raise EOFError
        chunks.append(data)
        n -= _len(data)
    return b"".join(chunks)


def job_bytes(req: dict, raw: bytes, start: int) -> bytes:
    """What the server writes down a child's job pipe: JOB_HEADER (start, memory MiB, CPU seconds, payload size),
    then the payload: for "run" (start -1) the source as UTF-8, else the request's JSON. A program's source goes
    as is so that its child parses no JSON (fewer pages written: less copy-on-write)."""
    payload = req["source"].encode("utf-8", "surrogatepass") if start == JOB_RUN else raw
    cpu = int(math.ceil(cpu_budget_s(req))) + 1
    return struct.pack(JOB_HEADER, start, int(req["memory_mb"]), cpu, len(payload)) + payload


def child_job() -> None:
    """Wait for the job on JOB_FD (see job_bytes), apply its limits, run it. Never returns."""
    try:
        start, memory_mb, cpu, size = struct.unpack(JOB_HEADER, _read_fd(JOB_FD, struct.calcsize(JOB_HEADER)))
        payload = _read_fd(JOB_FD, size)
    except EOFError:  # the server went away without a job for us
        os._exit(0)
    memory = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    if start == JOB_CHECK:
        os.close(JOB_FD)
        child_check(json.loads(payload))
    elif start < 0:
        child_run(payload.decode("utf-8", "surrogatepass"))
    else:
        os.close(JOB_FD)
        child_tests(json.loads(payload), start)


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code)


def _wait_threads() -> None:
    """Join non-daemon threads as interpreter shutdown would (bounded by the wall-clock timeout)."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass


def _report_exception(exc: BaseException) -> int:
    """Print what an uncaught exception prints and return the exit code. SystemExit keeps its code (0 included):
    an exit is never the end of the program, whatever its code (the server reads the end from END_SAY)."""
    if isinstance(exc, MemoryError):
        try:
            os.write(2, b"MemoryError\n")
        except OSError:
            pass
        return EXIT_ERROR
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if not isinstance(code, int):
            try:
                print(code, file=sys.stderr)
            except BaseException:
                pass
            return EXIT_ERROR
        return code & 0xFF
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:  # hide the harness's own frames
        tb = tb.tb_next
    try:  # what an uncaught exception prints, by the interpreter's C printer: the traceback module's Python
        exc.__traceback__ = tb  # code would cost a failing child ~150 copy-on-write page faults (~1 ms)
        _print_exception(type(exc), exc, tb)
    except BaseException:
        pass
    return EXIT_ERROR


_os_write, _os_read, _os_exit = os.write, os.read, os._exit  # the harness's own, whatever a program rebinds


def _end_report(_len=len) -> None:
    """After the program's last statement: ask the server for this run's nonce (it exists only in the server
    until asked for, and is asked for only here) and say it back; the server counts "ok" only after that."""
    try:
        _os_write(RESULT_FD, END_ASK)
        nonce = b""
        while _len(nonce) < NONCE_BYTES:
            data = _os_read(JOB_FD, NONCE_BYTES - _len(nonce))
            if not data:
                break
            nonce += data
        _os_write(RESULT_FD, END_SAY + nonce)
    except OSError:
        _os_exit(EXIT_ERROR)


def child_run(source: str) -> None:
    """Execute a program as __main__ and exit with its verdict code."""
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    try:
        code = compile(source, "<program>", "exec")
        exec(code, main.__dict__)
        _wait_threads()
    except BaseException as exc:  # noqa: BLE001 - the program's exception is the verdict
        _flush_and_exit(_report_exception(exc))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    _end_report()
    _os_exit(0)


def _short_error(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:
        text = type(exc).__name__
    return text[:500]


def child_tests(req: dict, start: int) -> None:
    """Import the solution, run tests start.., write one frame per test to RESULT_FD, exit."""
    import types

    dumps, pack, write = json.dumps, struct.pack, _os_write
    len_, sorted_, setprofile = len, sorted, sys.setprofile  # the harness's own, whatever the program rebinds
    getprofile = sys.getprofile
    getattr_, callable_, range_, too_deep = getattr, callable, range, json_too_deep
    record = bool(req.get("record_calls"))
    calls: set = set()
    limit = int(req["output_limit"])

    def emit(obj: dict) -> None:
        emit_raw(dumps(obj, separators=(",", ":")))

    def emit_raw(text: str) -> None:
        data = text.encode()
        data = pack(">I", len_(data)) + data
        view = memoryview(data)
        while view:
            view = view[write(RESULT_FD, view) :]

    module = types.ModuleType("solution")
    module.__dict__["__builtins__"] = __builtins__
    sys.modules["solution"] = module
    try:
        exec(compile(req["source"], "<solution>", "exec"), module.__dict__)
        fn: Any = module  # then the attribute the entry point names
        for part in req["entry_point"].split("."):
            fn = getattr_(fn, part)
        if not callable_(fn):
            raise TypeError(f"entry point {req['entry_point']!r} is not callable")
    except BaseException as exc:  # noqa: BLE001
        rc = _report_exception(exc)
        try:
            emit({"t": "load_error", "error": _short_error(exc)})
        except BaseException:
            pass
        _flush_and_exit(rc or EXIT_ERROR)
    emit({"t": "loaded"})

    def profiler(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == "<solution>":
            name = getattr_(frame.f_code, "co_qualname", frame.f_code.co_name).split(".<locals>")[0]
            if not name.startswith("<"):
                calls.add(name)

    inputs = req["inputs"]
    for i in range_(start, len_(inputs)):
        calls.clear()
        status, output, error, text = "ok", None, None, None
        if record:  # on until the answer is serialised: __str__, items() of a returned subclass count as calls
            setprofile(profiler)
        try:
            output = fn(*inputs[i])
        except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt fail the test too
            status, error = "error", _short_error(exc)
        if status == "ok":
            try:
                text = dumps(output)
                if len_(text) > limit:
                    status, error, text = "output_limit", f"output of {len_(text)} bytes exceeds {limit}", None
                elif too_deep(text, MAX_DEPTH):
                    status, error, text = "unserializable", f"answer nested deeper than {MAX_DEPTH}", None
            except BaseException as exc:  # noqa: BLE001 - a set, an object, a cycle: not an answer
                status, error = "unserializable", _short_error(exc)
        # CPython drops a profile function that raised (the recursion limit reached inside it, a MemoryError):
        # calls after that went unrecorded, so a record with a gap is no record ("calls": null, never reused)
        whole = record and getprofile() is profiler
        if record:
            setprofile(None)
        frame = {
            "t": "test",
            "i": i,
            "status": status,
            "output": None,
            "error": error,
            "calls": sorted_(calls) if whole else None,
        }
        if text is None:
            emit(frame)
        else:  # splice the serialised output in rather than parse and dump it again
            del frame["output"]
            emit_raw(dumps(frame, separators=(",", ":"))[:-1] + ',"output":' + text + "}")
        output = None
        if error is not None and error.startswith("MemoryError"):
            _flush_and_exit(EXIT_ERROR)  # end this child: the server judges from its memory use, resumes in a new one
        if status != "ok" and req.get("stop_on_error"):
            break
    emit({"t": "done"})
    _flush_and_exit(0)


# ------------------------------------------------------------------------------------ trusted checks
# A "check" grades a module with trusted test code (HumanEval's `check(candidate)`) that never runs next to the
# program: the job's child becomes the checker, forks the candidate process, and runs the test code itself (after
# the problem's prompt, when given: its helpers are trusted code too), with the entry point as a proxy whose every
# call goes to the candidate process and comes back as a value.
# Values cross in VALUE tags so tuples, sets and dict keys survive; the checker builds only plain builtin values
# from them, so a program's answers are data there, never objects with behaviour of their own.
VALUE_TAGS: dict[str, Any] = {"l": list, "t": tuple, "s": set, "f": frozenset}


class Unencodable(TypeError):
    """A value with no VALUE form (an object, a generator, a cycle)."""


def encode_value(v, depth: int = 0, isinstance=isinstance, type=type, sorted=sorted):  # noqa: A002 - bound
    """A value as JSON: scalars as themselves, containers and bytes/complex as one-key tagged objects."""
    if depth > 200:
        raise Unencodable("nested too deep")
    if v is None or type(v) in (bool, str):
        return v
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, int):
        return int.__index__(v)
    if isinstance(v, float):
        return float.__float__(v)
    if isinstance(v, dict):
        return {"d": [[encode_value(k, depth + 1), encode_value(x, depth + 1)] for k, x in dict.items(v)]}
    for tag, kind in VALUE_TAGS.items():
        if isinstance(v, kind):
            items = [encode_value(x, depth + 1) for x in kind.__iter__(v)]
            return {tag: sorted(items, key=json.dumps) if tag in "sf" else items}
    if isinstance(v, (bytes, bytearray)):
        return {"b": bytes(v).hex()}
    if isinstance(v, complex):
        return {"c": [v.real, v.imag]}
    raise Unencodable(f"a {type(v).__name__} cannot leave the candidate process")


def decode_value(v, len=len, type=type):  # noqa: A002 - builtins bound: the candidate decodes with these too
    """The inverse of encode_value, building plain builtin values only; ValueError for anything else."""
    if v is None or type(v) in (bool, int, float, str):
        return v
    if type(v) is not dict or len(v) != 1:
        raise ValueError("not a value")
    ((tag, body),) = v.items()
    if tag == "d" and type(body) is list:
        return {decode_value(k): decode_value(x) for k, x in body}
    if tag in VALUE_TAGS and type(body) is list:
        return VALUE_TAGS[tag](decode_value(x) for x in body)
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "c" and type(body) is list and len(body) == 2:
        return complex(float(body[0]), float(body[1]))
    raise ValueError("not a value")


def write_frame(fd: int, obj: dict, _len=len, _dumps=json.dumps, _pack=struct.pack) -> None:
    data = _dumps(obj, separators=(",", ":")).encode("utf-8", "surrogatepass")
    view = memoryview(_pack(">I", _len(data)) + data)
    while view:
        view = view[_os_write(fd, view) :]


def read_frame(
    fd: int, limit: int, _len=len, _type=type, _unpack=struct.unpack, _decode=json.JSONDecoder().raw_decode
) -> dict:  # bound: json.loads itself calls len()
    """One frame from a pipe; EOFError when it closes, ValueError when the frame is malformed or too big."""
    (size,) = _unpack(">I", _read_fd(fd, 4))
    if size > limit:
        raise ValueError("oversized frame")
    text = _read_fd(fd, size).decode("utf-8", "surrogatepass")
    frame, end = _decode(text)
    if end != _len(text) or _type(frame) is not dict:
        raise ValueError("frame is not one object")
    return frame


def candidate_process(req: dict, call_fd: int, answer_fd: int) -> None:
    """The program's side of a check: import the module, then answer calls until the checker hangs up."""
    import types

    module = types.ModuleType("solution")
    module.__dict__["__builtins__"] = __builtins__
    sys.modules["solution"] = module
    try:
        exec(compile(req["source"], "<solution>", "exec"), module.__dict__)
    except BaseException as exc:  # noqa: BLE001
        rc = _report_exception(exc)
        write_frame(answer_fd, {"t": "load_error", "error": _short_error(exc)})
        _flush_and_exit(rc or EXIT_ERROR)
    names = [
        k
        for k, v in list(module.__dict__.items())
        if isinstance(k, str) and not k.startswith("__") and isinstance(v, types.FunctionType)
    ]
    write_frame(answer_fd, {"t": "loaded", "names": names})
    while True:
        try:
            call = read_frame(call_fd, MAX_FRAME)
        except EOFError:
            _flush_and_exit(0)
        try:
            fn = module.__dict__[call["fn"]]
            value = fn(*decode_value(call["args"]), **decode_value(call["kwargs"]))
            answer = {"t": "value", "value": encode_value(value)}
        except BaseException as exc:  # noqa: BLE001 - the candidate's exception is its answer
            answer = {"t": "raised", "type": type(exc).__name__, "error": _short_error(exc)}
        write_frame(answer_fd, answer)


class CandidateGone(BaseException):
    """The candidate process died, exited, or broke the protocol: the check fails whatever the test code does."""


def child_check(req: dict) -> None:
    """The checker: fork the candidate process, run the trusted test code with a proxy of the entry point (and,
    without req["prompt"], of the module's other functions but those named like a builtin; with it, the prompt's
    own helpers run here), send the verdict on RESULT_FD (which the candidate never holds), exit."""
    import builtins

    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the candidate (same uid) cannot ptrace us or open our descriptors
    call_r, call_w = os.pipe()
    answer_r, answer_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(answer_w, RESULT_FD)  # the candidate's fd 3 is its answer pipe to us, not our verdict pipe
            os.dup2(call_r, JOB_FD)
            os.closerange(JOB_FD + 1, 1 << 20)
            candidate_process(req, JOB_FD, RESULT_FD)
        finally:
            _os_exit(EXIT_ERROR)
    os.close(call_r)
    os.close(answer_w)
    limit = int(req["output_limit"]) + FRAME_SLACK
    gone: list = []

    def answer() -> dict:
        if gone:
            raise CandidateGone(gone[0])
        try:
            return read_frame(answer_r, limit)
        except Exception as exc:  # noqa: BLE001 - EOF, malformed, or nested too deep to decode (RecursionError)
            gone.append(f"the candidate process ended or broke the protocol ({type(exc).__name__})")
            raise CandidateGone(gone[0]) from None

    class Proxy:
        __slots__ = ("name",)

        def __init__(self, name: str):
            self.name = name

        def __call__(self, *args, **kwargs):
            if gone:
                raise CandidateGone(gone[0])
            try:
                write_frame(
                    call_w, {"fn": self.name, "args": encode_value(list(args)), "kwargs": encode_value(dict(kwargs))}
                )
            except OSError:
                gone.append("the candidate process ended")
                raise CandidateGone(gone[0]) from None
            reply = answer()
            if reply.get("t") == "value":
                try:
                    return decode_value(reply.get("value"))
                except Exception:  # noqa: BLE001 - not a value, unhashable keys, nested too deep
                    gone.append("the candidate sent a malformed value")
                    raise CandidateGone(gone[0]) from None
            if reply.get("t") == "raised":
                kind = getattr(builtins, str(reply.get("type")), None)
                if kind in (SystemExit, KeyboardInterrupt, GeneratorExit):
                    gone.append(f"the candidate raised {kind.__name__}")
                    raise CandidateGone(gone[0])
                if not (isinstance(kind, type) and issubclass(kind, Exception)):
                    kind = Exception
                raise kind(str(reply.get("error")))
            gone.append("the candidate sent an unexpected frame")
            raise CandidateGone(gone[0])

    verdict = {"t": "verdict", "passed": False, "error": None}
    try:
        first = answer()
        if first.get("t") != "loaded" or not isinstance(first.get("names"), list):
            raise CandidateGone(f"the module did not load: {str(first.get('error'))[:300]}")
        namespace: dict[str, Any] = {"__name__": "check", "__builtins__": builtins}
        entry, prompt, builtin_names = req["entry_point"], req.get("prompt"), frozenset(vars(builtins))
        if isinstance(prompt, str):  # the problem's own helpers run here: only the entry point is the module's
            exec(compile(prompt, "<prompt>", "exec"), namespace)
        else:  # helpers from the module, never one named like a builtin (a module `abs` would answer the test's)
            namespace.update(
                {name: Proxy(name) for name in first["names"] if isinstance(name, str) and name not in builtin_names}
            )
        if entry in builtin_names:  # passed as `candidate` only: the test's own calls of that name stay builtin
            namespace.pop(entry, None)
        else:
            namespace[entry] = Proxy(entry)
        exec(compile(req["test"], "<check>", "exec"), namespace)
        namespace["check"](Proxy(entry))
        verdict["passed"] = not gone
    except BaseException as exc:  # noqa: BLE001 - a failed assert, a candidate that raised or died
        verdict["error"] = _short_error(exc)
    if gone:
        verdict["passed"], verdict["error"] = False, gone[0]
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass
    write_frame(RESULT_FD, verdict)
    _os_exit(0)


# ------------------------------------------------------------------------------------- the server
class _Child:
    """A forked child and the server's ends of its pipes."""

    __slots__ = (
        "pid",
        "workdir",
        "out_r",
        "err_r",
        "res_r",
        "job_w",
        "job_sent",
        "job_failed",
        "pidfd",
        "pipes_closed",
        "job_closed",
    )

    def __init__(self, pid: int, workdir: str, out_r: int, err_r: int, res_r: int, job_w: int):
        self.pid, self.workdir = pid, workdir
        self.out_r, self.err_r, self.res_r, self.job_w = out_r, err_r, res_r, job_w
        self.job_sent, self.job_failed = 0.0, False
        self.pidfd: int | None = None
        self.pipes_closed, self.job_closed = False, False


def _kill_and_reap(pid: int) -> None:
    """SIGKILL a child's process group and the child, and reap it."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class ProtocolViolation(Exception):
    """The child wrote something on the result pipe that the harness would never write."""


class Server:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        # read seccomp.py first, while this file's folder is still in our view: a checkout under /tmp is hidden by
        # the private /tmp below, and a filter loaded after it would silently be none
        seccomp = None if getattr(args, "no_seccomp", False) else seccomp_filter()
        # without root, first a user namespace of our own (enter_user_namespace): inside it we are uid 0 with the
        # capabilities the namespaces, mounts, root and pid namespace below need; userns_error says why not
        self.userns, self.userns_error = False, None
        if os.geteuid() != 0 and not (args.no_netns and args.no_private_tmp):  # (in a container: neither is asked)
            self.userns_error = "not tried (--no-userns)" if args.no_userns else enter_user_namespace()
            self.userns = self.userns_error is None
        no_netns = args.no_netns or (os.geteuid() != 0)  # still not root: no user namespace, so no network one
        self.network_isolated = False if no_netns else isolate_network()
        self.ipc_isolated = isolate_ipc()  # after isolate_network: without root, inside its user namespace
        self.uts_isolated = False if no_netns else isolate_uts()  # the same: a hostname of its own
        self.private_dirs = [] if args.no_private_tmp else private_tmp(args.tmpfs_mb)
        self.private_tmp = bool(self.private_dirs)
        as_root = os.geteuid() == 0
        self.root = None  # the programs' own root file tree (build_root), chrooted into by every child
        needed = python_paths()
        # under a uid of its own a child must read the installation by its own modes: never with
        # CAP_DAC_READ_SEARCH in a chroot (open_by_handle_at would leave it), so a closed one means no root
        readable = all(os.stat(p).st_mode & 0o005 == 0o005 for p in needed)
        # (in our user namespace children keep our one uid, which reads the installation as we do)
        if (
            as_root
            and "/tmp" in self.private_dirs
            and not args.no_private_root
            and (args.uid is None or self.userns or readable)
        ):
            self.root = build_root(needed, self.private_dirs)
        self.pidns = None  # (init pid, command fd, answer fd) of the pid namespace children are forked into
        if as_root and self.private_tmp and not args.no_pidns:
            self.pidns = start_pid_namespace(self.root)
        self.init_pid = self.pidns[0] if self.pidns else None
        if self.root is not None:  # the programs' /proc is the one in their root, hidepid=2
            self.private_proc = self.pidns is not None or mount_root_proc(self.root)
        else:  # else ours, remounted with hidepid=2
            self.private_proc = self.private_tmp and private_proc()
        base = None if self.private_tmp else args.work_dir
        self.work_base = tempfile.mkdtemp(prefix="sandbox-work-", dir=base)
        os.chmod(self.work_base, 0o711)
        uid = None
        if args.uid is not None and os.geteuid() == 0 and not self.userns:  # (its map has no second uid)
            uid = UID_AUTO_BASE + os.getpid() if args.uid == "auto" else int(args.uid)
        read_cap = False
        if uid is not None and self.root is None:  # (in the root: bound under open directories of ours)
            if any(_blocking_ancestor(p) for p in needed):
                read_cap = not (self.private_tmp and expose_python(needed))
        if uid is not None:
            nproc = args.nproc
        elif self.userns:  # RLIMIT_NPROC counts per user namespace: its processes are ours, the init and theirs
            nproc = args.nproc + 2
        else:
            nproc = _count_user_processes(os.geteuid()) + args.nproc
        # not root: works only where the server's own cgroup (v2) is delegated to its user (create says None)
        self.cgroup = WorkerCgroup.create(args.nproc) if not args.no_cgroup else None
        # the container's OOM count, or the tree's own memory reading polled as that is (below)
        self.container_oom: ContainerOom | TreeMemory | None = ContainerOom.open() if args.container_oom else None
        self.tree_memory = None  # no cgroup (not root): the server reads the tree's memory itself (TreeMemory)
        if self.cgroup is None and not args.container_oom and not args.no_cgroup:
            self.tree_memory = self.container_oom = TreeMemory(os.getpid(), self.init_pid)  # polled as that is
        self.oom_watch = self.cgroup or self.container_oom  # whichever tells us of an OOM kill in the tree
        self.cfg = {
            "uid": uid,
            "read_cap": read_cap,
            "nproc": nproc,
            "fsize_mb": args.fsize_mb,
            "nofile": args.nofile,
            "cap_args": _cap_args(read_cap),
            "root": self.root,
            "cgroup_fds": self.cgroup.attach_fds if self.cgroup else [],
            "oom_adj": True,
        }
        self.meta = {
            "network_isolated": self.network_isolated,
            "user_isolated": uid is not None,
            "read_all_files": read_cap,
            "private_tmp": self.private_tmp,
            "private_dirs": self.private_dirs,
            "private_proc": self.private_proc,
            "ipc_isolated": self.ipc_isolated or bool(args.wipe_ipc),
            "server_pid": os.getpid(),
            "uts_isolated": self.uts_isolated,
            "cgroup": self.cgroup.version if self.cgroup else None,
            "pid_namespace": self.pidns is not None,
            "private_root": self.root is not None,
            "tree_memory_limit": bool(self.oom_watch),
            "tree_memory_polled": self.tree_memory is not None,
            # RLIMIT_NPROC counts only this worker's processes (a uid of its own, or its user namespace)
            "nproc_per_worker": bool(self.cgroup) or uid is not None or self.userns,
            "user_namespace": self.userns,
            "userns_error": self.userns_error,
        }
        self.cfg["seccomp"] = seccomp  # installed last in _child_setup
        self.meta["seccomp"] = self.cfg["seccomp"] is not None
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        # no_new_privs is inherited by every child and cannot be unset; the server never execs, so setting it
        # here, once, takes nothing from the server and spares each child the call (a failure: children set it)
        self.cfg["no_new_privs"] = _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
        self.cfg["null"] = os.open(os.devnull, os.O_RDONLY)  # every child's stdin (dup2'd onto 0)
        self.children_file = f"/proc/self/task/{os.getpid()}/children"
        self.wipe_tmp = self.private_tmp or args.wipe_tmp  # empty the shared dirs after each program
        self.wipe_dirs = self.private_dirs or ["/tmp", "/var/tmp", "/dev/shm"]
        self.wipe_ipc = self.ipc_isolated or args.wipe_ipc  # the IPC namespace is ours (or the container's)
        self.recycle: str | None = None  # why this server must be replaced after its current answer
        self._ready: _Child | None = None  # the pre-forked child waiting for the next job
        self._env_workdir: str | None = None  # HOME and TMPDIR in our environment, which children inherit
        self.preforking = not args.no_prefork

    # -- leftovers
    def _children(self) -> list[int]:
        try:
            with open(self.children_file) as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []

    def _sweep(self) -> None:
        """SIGKILL every descendant that was re-parented to us (we are a child subreaper) and reap it (never the
        pid namespace's init; descendants in the namespace go to that init: _sweep_namespace)."""
        for _ in range(10000):
            kids = [pid for pid in self._children() if pid != self.init_pid]
            if not kids:
                return
            for pid in kids:
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            for pid in kids:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass

    def _sweep_all(self) -> None:
        """After the program's child is reaped: kill and reap whatever of its tree is left, ours or the pid
        namespace's. With a cgroup, an empty one (pids.current 0) says at once that nothing is."""
        if self.cgroup is not None and self._ready is None:
            try:
                if self.cgroup.tasks() == 0:
                    return
            except (OSError, ValueError):
                pass
        if self.pidns is None:
            try:  # fast path: no child left means no descendant survived (orphans are re-parented to us)
                os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
        self._sweep()
        self._sweep_namespace()

    def _sweep_namespace(self) -> None:
        """Have the pid namespace's init kill every process in it (pid_init), then reap what was ours."""
        if self.pidns is None:
            return
        if self._ready is not None:  # it would be killed too: forget it (it is never mid-job here)
            self._discard_ready()
        _, cmd, ack = self.pidns
        try:
            os.write(cmd, SWEEP)
            answer = os.read(ack, 1)
        except OSError:
            answer = b""
        self._sweep()
        if answer != SWEPT:
            self.recycle = self.recycle or "processes of a program survived in the pid namespace"

    def _discard_ready(self) -> None:
        child, self._ready = self._ready, None
        if child is None:
            return
        _kill_and_reap(child.pid)
        for fd in (child.out_r, child.err_r, child.res_r, child.job_w):
            try:
                os.close(fd)
            except OSError:
                pass
        remove_tree(child.workdir)

    def close(self) -> None:
        """At exit: the pre-forked child, the pid namespace (its init, and with it every process in it) and the
        worker's cgroup go."""
        self._discard_ready()
        self._sweep()
        if self.pidns is not None:
            init, cmd, ack = self.pidns
            for fd in (cmd, ack):
                os.close(fd)
            try:
                os.kill(init, signal.SIGKILL)
                os.waitpid(init, 0)
            except OSError:
                pass
            self.pidns = None
        if self.cgroup is not None:
            self.cgroup.close()
            self.cgroup = None

    def _clean_tmp(self, workdir: str) -> None:
        """Remove the program's work dir (never reused: the next program gets a new one, with no timestamps,
        extended attributes or inode of this one), anything else in the work base, and with private or wiped
        temporary dirs what it left there. Anything left over (remove_tree failed, or CLEAN_S passed: a flood of
        entries) recycles the worker, so the clean-up is bounded in time however many entries the program made:
        the response (the program's own status) goes out, the server exits, and what it left goes with its private
        tmpfs mounts (the kernel drops them whole with the server's mount namespace) or its container."""
        deadline = time.monotonic() + CLEAN_S
        left = []
        if not remove_tree(workdir, deadline):
            left.append(workdir)
        keep = {self._ready.workdir} if self._ready else set()
        left += self._empty_dir(self.work_base, keep, deadline)  # without a uid of its own it could write here
        if self.wipe_tmp:
            left += self._wipe_shared_tmp(deadline)
        if self.wipe_ipc:
            remove_sysv_ipc()
        if left:
            self.recycle = f"could not remove what a program left (in {CLEAN_S:g} s): {left[:3]}"

    @staticmethod
    def _empty_dir(base: str, keep: set, deadline: float | None) -> list[str]:
        """Remove every entry of `base` but those in `keep` (never listing it whole: a program may have made
        millions); returns what is left (`base` itself when it could not be read, or the deadline passed)."""
        left: list[str] = []
        try:
            with os.scandir(base) as entries:
                for entry in entries:
                    if deadline is not None and time.monotonic() > deadline:
                        return left + [base]
                    if entry.path not in keep and not remove_tree(entry.path, deadline):
                        left.append(entry.path)
        except OSError:
            left.append(base)
        return left

    def _wipe_shared_tmp(self, deadline: float | None = None) -> list[str]:
        """Remove what the program left in the shared dirs (our private tmpfs mounts: /tmp, /var/tmp, /dev/shm,
        /run/lock, ...; or in a container its own /tmp, /dev/shm); returns what could not be removed."""
        left = []
        for base in self.wipe_dirs:
            if os.path.isdir(base):
                left += self._empty_dir(base, {self.work_base}, deadline)
        return left

    # -- one child
    def _fork_child(self, workdir: str) -> _Child:
        """Fork a child that sets itself up and then waits for its job (see child_job)."""
        if workdir != self._env_workdir:  # usually the same (spare) dir as last time: nothing to write
            os.environ["HOME"] = os.environ["TMPDIR"] = self._env_workdir = workdir  # the rest: scrub_environment
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        job_r, job_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # child: never returns into server code
            try:
                _child_setup(self.cfg, workdir, out_w, err_w, res_w, job_r)
            except BaseException:  # noqa: BLE001
                try:
                    traceback.print_exc()
                finally:
                    os._exit(EXIT_HARNESS)
            try:
                child_job()
            finally:
                os._exit(EXIT_ERROR)
        for fd in (out_w, err_w, res_w, job_r):
            os.close(fd)
        return _Child(pid, workdir, out_r, err_r, res_r, job_w)

    def prefork(self) -> None:
        """Fork the next child ahead of time, while the client is busy: its fork and set-up cost no latency."""
        if self._ready is None and self.preforking:
            try:
                self._ready = self._fork_child(self._workdir())
            except OSError:
                self._ready = None

    def _start(self, req: dict, raw: bytes, start: int, workdir: str | None) -> _Child:
        """Hand a job to the pre-forked child (or a new one in `workdir`)."""
        data = job_bytes(req, raw, start)  # first: should it fail, no child has been handed a job
        if self.cgroup is not None and not self.cgroup.set_memory(int(req["memory_mb"])):
            self.recycle = self.recycle or "could not set the worker cgroup's memory limit"
        if self.tree_memory is not None:  # (no cgroup: the server holds the tree to it, TreeMemory)
            self.tree_memory.memory_mb = int(req["memory_mb"])
        if self.oom_watch is not None:
            self.oom_watch.oom_fired()  # forget what happened before this job
        child = None
        if workdir is None and self._ready is not None:
            child, self._ready = self._ready, None
        if child is None:
            child = self._fork_child(workdir or self._workdir())
        child.job_sent = time.monotonic()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(child.job_w, view) :]
        except OSError:
            child.job_failed = True  # the child died during set-up, before it read its job: _collect sees how
        return child

    def _collect(self, req: dict, child: _Child, out: dict, tests: list | None, start: int) -> dict:
        """Watch one child until it exits, times out, floods or breaks protocol. Returns what happened. Should
        anything fail outside the watch itself (which handles its own failures), the child's group is killed and
        reaped and its descriptors closed before the failure goes on (the server then asks to be replaced)."""
        try:
            return self._watch(req, child, out, tests, start)
        except Exception:
            self._abandon(child)
            raise

    def _abandon(self, child: _Child) -> None:
        _kill_and_reap(child.pid)
        self._sweep()
        self._sweep_namespace()
        fds = [] if child.pipes_closed else [child.out_r, child.err_r, child.res_r]
        fds += [] if child.job_closed else [child.job_w]
        fds += [child.pidfd] if child.pidfd is not None else []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        child.pipes_closed = child.job_closed = True
        child.pidfd = None
        self.recycle = self.recycle or "failed while collecting a program"

    def _watch(self, req: dict, child: _Child, out: dict, tests: list | None, start: int) -> dict:
        pid, out_r, err_r, res_r = child.pid, child.out_r, child.err_r, child.res_r
        pidfd = child.pidfd = os.pidfd_open(pid)
        poller = select.poll()
        names = {out_r: "stdout", err_r: "stderr", pidfd: "exit", res_r: "result"}
        for fd in names:
            poller.register(fd, select.POLLIN)
        cgroup = self.cgroup  # its OOM events are polled with the pipes (None: no cgroup, no events)
        oom_fd = cgroup.notify_fd if cgroup is not None else None
        if cgroup is not None and oom_fd is not None:
            poller.register(oom_fd, cgroup.notify_events)
        oom_poll = self.container_oom  # no notification there: read its count every OOM_CHECK_S
        next_oom_check = time.monotonic() + OOM_CHECK_S
        now = time.monotonic()
        load_deadline = now + float(req["timeout_s"])
        test_timeout = float(req.get("test_timeout_s") or req["timeout_s"])
        deadline = load_deadline
        # clock "cpu": a phase (the load or run, then each test) times out when the child has used its limit of
        # CPU time, or at its wall-clock cap (cpu_clock_cap_s: a program that sleeps or waits); a slow share of a
        # loaded machine alone does not end it. Where the child's CPU time cannot be read the wall clock decides, as
        # for clock "wall". (Only the child's own CPU time counts: processes it starts are bounded by the cap.)
        cpu_clock = req.get("clock") == "cpu"
        phase = {"t0": now, "limit": float(req["timeout_s"]), "cpu0": cpu_seconds(pid) if cpu_clock else None}
        limit = int(req["output_limit"])
        res_buf = bytearray()
        state: dict[str, Any] = {
            "reason": None,
            "next": start,
            "loaded": tests is None,
            "done": False,
            "load_error": None,
            "violation": None,
            "max_frame": limit + FRAME_SLACK,  # an honest frame holds <= limit of output
            "result_bytes": 0,
            "asked": False,
            "ended": False,
            "nonce": os.urandom(NONCE_BYTES) if tests is None else b"",
            "t_mark": child.job_sent,
            "load_s": None,
            "after_memory_error": False,
            "check": req.get("op") == "check",
            "verdict": None,
        }
        if state["check"]:
            state["nonce"] = b""
        n = len(req["inputs"]) if tests is not None else 0
        open_fds = set(names)
        exited = False
        try:  # whatever goes wrong here (ours or a frame we cannot handle), the kill-and-reap below runs
            while not exited and state["reason"] is None:
                now = time.monotonic()
                wait = deadline - now
                if wait <= 0:
                    later = self._cpu_clock_deadline(pid, phase, now) if cpu_clock else None
                    if later is None:
                        state["reason"] = "timeout"
                        state["timeout_clock"] = phase.get("ended_by", "wall")
                        break
                    deadline, wait = later, later - now
                if oom_poll is not None:
                    if now >= next_oom_check:
                        next_oom_check = now + OOM_CHECK_S
                        if oom_poll.oom_fired():
                            state["reason"] = "memory"
                            break
                    wait = min(wait, next_oom_check - now)
                for fd, _ in poller.poll(max(1, int(wait * 1000) + 1)):
                    if cgroup is not None and fd == oom_fd:
                        if cgroup.oom_fired():  # the tree hit its memory limit: end it now
                            state["reason"] = "memory"
                            break
                        continue
                    name = names[fd]
                    if name == "exit":
                        exited = True
                        continue
                    data = os.read(fd, 1 << 16)
                    if not data:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                        continue
                    if name == "result":
                        if self.tree_memory is not None and self.tree_memory.oom_fired():
                            # a polled limit: the tree is read once more before a result is taken, so a program
                            # that passes the limit and answers between two reads is not "ok"
                            state["reason"] = "memory"
                            break
                        res_buf += data
                        try:
                            if self._result_bytes(res_buf, state, tests, n, child):
                                now = time.monotonic()
                                deadline = now + test_timeout
                                if cpu_clock:
                                    phase = {"t0": now, "limit": test_timeout, "cpu0": cpu_seconds(pid)}
                        except ProtocolViolation as exc:
                            state["violation"] = str(exc)
                            state["reason"] = "protocol"
                            break
                    else:
                        out[name] += data
                        if len(out["stdout"]) + len(out["stderr"]) > limit:
                            state["reason"] = "output_limit"
                            break
        except Exception as exc:  # noqa: BLE001 - our failure: the program is killed, the worker recycled
            state["reason"], state["internal"] = "internal", f"{type(exc).__name__}: {exc}"[:300]
            self.recycle = f"failed while watching a program: {state['internal']}"
        # Kill the group while the child (alive or zombie) still pins its pid, reap it, then every escapee.
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _, wstatus, rusage = os.wait4(pid, 0)
        self._sweep_all()
        if oom_fd is not None:
            poller.unregister(oom_fd)
        if self.oom_watch is not None and self.oom_watch.oom_fired() and state["reason"] is None:
            state["oom"] = True  # the OOM killer ended a process of the tree (maybe the child itself)
        # Every writer is dead now: drain what is left in the pipes (bounded, in case a descriptor escaped).
        if pidfd in open_fds:
            poller.unregister(pidfd)
            open_fds.discard(pidfd)
        os.close(pidfd)
        child.pidfd = None
        try:
            drain_deadline = time.monotonic() + DRAIN_S
            while open_fds and time.monotonic() < drain_deadline:
                for fd, _ in poller.poll(100):
                    data = os.read(fd, 1 << 16)
                    if not data:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                    elif fd == res_r:
                        if state["reason"] is None:
                            res_buf += data
                            try:
                                self._result_bytes(res_buf, state, tests, n, child)
                            except ProtocolViolation as exc:
                                state["violation"] = str(exc)
                                state["reason"] = "protocol"
                    elif len(out["stdout"]) + len(out["stderr"]) <= limit:
                        out[names[fd]] += data
                        if len(out["stdout"]) + len(out["stderr"]) > limit and state["reason"] is None:
                            state["reason"] = "output_limit"
        except Exception as exc:  # noqa: BLE001
            if state["reason"] is None:
                state["reason"], state["internal"] = "internal", f"{type(exc).__name__}: {exc}"[:300]
            self.recycle = f"failed while draining a program's pipes: {exc}"[:300]
        for fd in (out_r, err_r, child.res_r):
            os.close(fd)
        child.pipes_closed = True
        if res_buf and state["reason"] is None:
            state["violation"] = "trailing bytes on the result pipe"
            state["reason"] = "protocol"
        # The program runs only after its child read the whole job: bytes of it still unread (or a job that could
        # not be written) mean the child died during our set-up, the one end that is our fault.
        unread = array.array("i", [0])
        try:
            fcntl.ioctl(child.job_w, termios.FIONREAD, unread)
        except OSError:
            unread[0] = 0
        os.close(child.job_w)
        child.job_closed = True
        state["setup_failed"] = child.job_failed or (unread[0] > 0 and not state["asked"])
        state["wstatus"], state["rusage"] = wstatus, rusage
        state["memory_mb"] = int(req["memory_mb"])
        state["tree_limit"] = f"{state['memory_mb']} MiB, cgroup" if self.cgroup is not None else "the container's"
        state["cpu_limit_s"] = int(math.ceil(cpu_budget_s(req))) + 1
        return state

    @staticmethod
    def _cpu_clock_deadline(pid: int, phase: dict, now: float) -> float | None:
        """Clock "cpu", the wall-clock deadline of a phase passed: the next time to look (the CPU time it has left,
        at least CPU_CLOCK_MIN_WAIT_S, within its wall-clock cap), or None when it timed out (phase["ended_by"]:
        "cpu" when it used its limit of CPU time, "wall cap" at the cap, "wall" where its CPU time cannot be read)."""
        cap = phase["t0"] + cpu_clock_cap_s(phase["limit"])
        used = cpu_seconds(pid)
        if used is None or phase["cpu0"] is None:
            phase["ended_by"] = "wall"
            return None
        left = phase["limit"] - (used - phase["cpu0"])
        if left <= 0:
            phase["ended_by"] = "cpu"
            return None
        if now >= cap:
            phase["ended_by"] = "wall cap"
            return None
        return min(now + max(left, CPU_CLOCK_MIN_WAIT_S), cap)

    def _result_bytes(self, buf: bytearray, state: dict, tests: list | None, n: int, child: _Child) -> bool:
        """What arrived on the result pipe: test frames (see _frames); for a check the checker's one verdict
        frame; for a run the end-of-program exchange: END_ASK, to which we answer with the nonce, then
        END_SAY + nonce. Anything else is a violation."""
        if tests is not None:
            return self._frames(buf, state, tests, n, time.monotonic())
        if state["check"]:
            while len(buf) >= 4:
                (size,) = struct.unpack(">I", buf[:4])
                if size > state["max_frame"] or state["ended"]:
                    raise ProtocolViolation("unexpected checker frame")
                if len(buf) < 4 + size:
                    break
                raw = bytes(buf[4 : 4 + size])
                del buf[: 4 + size]
                try:
                    frame = None if json_too_deep(raw, 2) else json.loads(raw)
                except (ValueError, RecursionError, MemoryError):
                    frame = None
                if type(frame) is not dict or frame.get("t") != "verdict" or type(frame.get("passed")) is not bool:
                    raise ProtocolViolation("malformed verdict")
                state["verdict"] = {"passed": frame["passed"], "error": str(frame.get("error") or "")[:500] or None}
                state["ended"] = True
            return False
        if not state["asked"] and buf:
            if buf[:1] != END_ASK:
                raise ProtocolViolation("unexpected bytes on the result pipe")
            del buf[:1]
            state["asked"] = True
            try:
                os.write(child.job_w, state["nonce"])
            except OSError:
                pass
        if state["asked"] and not state["ended"] and len(buf) >= 1 + NONCE_BYTES:
            if bytes(buf[: 1 + NONCE_BYTES]) != END_SAY + state["nonce"]:
                raise ProtocolViolation("a wrong end-of-program report")
            del buf[: 1 + NONCE_BYTES]
            state["ended"] = True
        if state["ended"] and buf:
            raise ProtocolViolation("bytes after the end-of-program report")
        return False

    def _frames(self, buf: bytearray, state: dict, tests: list, n: int, now: float) -> bool:
        """Decode complete frames from buf (strictly). Returns True when a test or load frame arrived. A test's
        duration is ours: from the arrival of the previous frame ("loaded" for the first) to the arrival of its
        own; the load's from handing the job over to "loaded"."""
        progressed = False
        while len(buf) >= 4:
            (size,) = struct.unpack(">I", buf[:4])
            if size > state["max_frame"]:
                raise ProtocolViolation("oversized result frame")
            if len(buf) < 4 + size:
                break
            raw = bytes(buf[4 : 4 + size])
            del buf[: 4 + size]
            if json_too_deep(raw, MAX_DEPTH + 1):  # the frame object itself is one level
                raise ProtocolViolation(f"result frame nested deeper than {MAX_DEPTH}")
            try:
                frame = json.loads(raw)
            except (ValueError, RecursionError, MemoryError):
                raise ProtocolViolation("result frame is not JSON") from None
            if not isinstance(frame, dict) or state["done"]:
                raise ProtocolViolation("unexpected result frame")
            kind = frame.get("t")
            if kind == "loaded" and not state["loaded"]:
                state["loaded"] = True
                state["load_s"], state["t_mark"] = now - state["t_mark"], now
                progressed = True
            elif kind == "load_error" and not state["loaded"] and state["load_error"] is None:
                state["load_error"] = str(frame.get("error"))[:500]
            elif kind == "test" and state["loaded"]:
                i = frame.get("i")
                status = frame.get("status")
                if type(i) is not int or i != state["next"] or i >= n or status not in TEST_STATUSES:
                    raise ProtocolViolation("result frame for a test that was not asked for")
                if set(frame) != {"t", "i", "status", "output", "error", "calls"}:
                    raise ProtocolViolation("result frame with unexpected fields")
                error, calls = frame["error"], frame["calls"]
                if not (error is None or isinstance(error, str)):
                    raise ProtocolViolation("result frame with wrong field types")
                if calls is not None and not (isinstance(calls, list) and all(isinstance(c, str) for c in calls)):
                    raise ProtocolViolation("result frame with wrong calls")
                if status != "ok" and frame["output"] is not None:
                    raise ProtocolViolation("output on a failed test")
                state["result_bytes"] += size
                if state["result_bytes"] > MAX_RESULT_BYTES and status == "ok":  # bounded whatever the test count
                    status, error, frame["output"] = (
                        "output_limit",
                        f"answers exceeded {MAX_RESULT_BYTES} bytes in total",
                        None,
                    )
                tests[i] = {
                    "status": status,
                    "output": frame["output"],
                    "error": error,
                    "duration_s": now - state["t_mark"],
                    "calls": calls,
                }
                state["t_mark"] = now
                state["after_memory_error"] = (
                    status == "error" and error is not None and error.startswith("MemoryError")
                )
                state["next"] = i + 1
                progressed = True
            elif kind == "done" and state["loaded"] and state["next"] == n:
                state["done"] = True
            elif kind == "done" and state["loaded"]:
                state["done"] = True  # stop_on_error ended early; checked by the caller
            else:
                raise ProtocolViolation("result frame out of order")
        return progressed

    @staticmethod
    def _exit_status(state: dict) -> tuple[str, dict]:
        """How a child ended, as (status, facts for meta), from what this server observed: its own deadlines and
        output accounting, the kernel's wait status and resource usage, the end-of-program nonce (run) or the
        frames (tests). Never from the program's stderr or its choice of exit code or signal:
            ok            exit code 0 after the end report (run) / after "done" (tests);
            timeout       our wall-clock deadline (clock "cpu": the phase's CPU time as the kernel counts it, or
                          its wall-clock cap), or a CPU signal when the CPU time used reached the limit;
            output_limit  our count of stdout+stderr bytes;
            memory        any other abnormal end with a peak resident set >= MEMORY_EVIDENCE of memory_mb;
            killed        any other signal (whoever sent it);
            sandbox_error the child died before it read its whole job (our set-up failed; no program ran);
            error         everything else: an exception, an exit with any code before the end, bad frames."""
        reason, wstatus, ru = state["reason"], state["wstatus"], state["rusage"]
        if reason == "timeout":
            by = state.get("timeout_clock", "wall")
            if by == "cpu":
                return "timeout", {"reason": "CPU-time timeout (clock cpu)", "clock": "cpu"}
            if by == "wall cap":
                return "timeout", {
                    "reason": f"wall-clock timeout at {CPU_CLOCK_WALL_FACTOR} x the limit, {CPU_CLOCK_MIN_CAP_S:g} s "
                    "at least (clock cpu)",
                    "clock": "cpu",
                }
            return "timeout", {"reason": "wall-clock timeout"}
        if reason == "output_limit":
            return "output_limit", {"reason": "stdout+stderr exceeded output_limit"}
        if reason == "memory" or (reason is None and state.get("oom") and not state["setup_failed"]):
            return "memory", {
                "reason": f"the program's processes together reached their memory limit "
                f"({state['tree_limit']}): the kernel's OOM killer acted; all were ended"
            }
        if reason == "protocol":
            return "error", {"reason": f"protocol violation: {state['violation']}"}
        if reason == "internal":
            return "sandbox_error", {"reason": f"the sandbox server failed ({state['internal']}); worker recycled"}
        if state["setup_failed"]:
            return "sandbox_error", {"reason": "the sandbox child died during set-up, before the program ran"}
        memory = ru.ru_maxrss * 1024 >= MEMORY_EVIDENCE * state["memory_mb"] * 1024 * 1024
        if os.WIFSIGNALED(wstatus):
            sig = os.WTERMSIG(wstatus)
            facts = {"signal": sig}
            if (
                sig in (signal.SIGXCPU, signal.SIGKILL)
                and ru.ru_utime + ru.ru_stime >= state["cpu_limit_s"] - CPU_SLACK_S
            ):
                return "timeout", {**facts, "reason": "CPU time limit"}
            if memory:
                return "memory", {**facts, "reason": f"signal {sig} at a peak of {ru.ru_maxrss // 1024} MiB"}
            return "killed", {**facts, "reason": f"killed by signal {sig}"}
        code = os.WEXITSTATUS(wstatus)
        if code == 0 and (state["ended"] or state["done"]):
            return "ok", {}
        facts = {"exit_code": code}
        if memory:
            return "memory", {**facts, "reason": f"exit code {code} at a peak of {ru.ru_maxrss // 1024} MiB"}
        if code == 0:
            return "error", {**facts, "reason": "exited before its end (exit code 0)"}
        return "error", {**facts, "reason": f"exit code {code} (an uncaught exception exits with 1)"}

    @staticmethod
    def _text(data: bytearray, cap: int) -> str:
        return bytes(data[:cap]).decode("utf-8", errors="replace")

    def _finish(self, t0: float, out: dict, status: str, req: dict, extra: dict | None = None) -> dict:
        cap = int(req["output_limit"])
        meta = dict(self.meta)
        if extra:
            meta.update(extra)
        return {
            "status": status,
            "stdout": self._text(out["stdout"], cap),
            "stderr": self._text(out["stderr"], max(0, cap - min(len(out["stdout"]), cap))),
            "duration_s": time.monotonic() - t0,
            "meta": meta,
        }

    def handle_run(self, req: dict, raw: bytes) -> dict:
        t0 = time.monotonic()
        out = {"stdout": bytearray(), "stderr": bytearray()}
        child = self._start(req, raw, -1, None)
        try:
            state = self._collect(req, child, out, None, 0)
        finally:
            self._clean_tmp(child.workdir)
        status, facts = self._exit_status(state)
        return self._finish(t0, out, status, req, facts)

    def handle_check(self, req: dict, raw: bytes) -> dict:
        """A trusted check (see child_check): "ok" only when the checker's test code passed; "error" when it
        failed (meta["check"]["error"] says why); otherwise how the checker's process group ended."""
        t0 = time.monotonic()
        out = {"stdout": bytearray(), "stderr": bytearray()}
        child = self._start(req, raw, JOB_CHECK, None)
        try:
            state = self._collect(req, child, out, None, 0)
        finally:
            self._clean_tmp(child.workdir)
        status, facts = self._exit_status(state)
        if status == "ok":
            verdict = state["verdict"]
            facts = {"check": verdict}
            if not verdict["passed"]:
                status, facts["reason"] = "error", f"the check failed: {verdict['error']}"
        return self._finish(t0, out, status, req, facts)

    def handle_tests(self, req: dict, raw: bytes) -> dict:
        t0 = time.monotonic()
        n = len(req["inputs"])
        tests: list = [None] * n
        out = {"stdout": bytearray(), "stderr": bytearray()}
        extra: dict[str, Any] = {"timing": "parent"}
        overall, start, workdir = "ok", 0, None
        try:
            while start < n or start == 0:
                child = self._start(req, raw, start, workdir)
                workdir = child.workdir  # tests that resume in a new child share the work dir
                state = self._collect(req, child, out, tests, start)
                status, facts = self._exit_status(state)
                if state.get("internal"):  # our failure: no verdict on this or any later test
                    for i in range(start, n):
                        tests[i] = {
                            "status": "sandbox_error",
                            "output": None,
                            "calls": None,
                            "duration_s": 0.0,
                            "error": facts["reason"],
                        }
                    overall, extra["reason"] = "sandbox_error", facts["reason"]
                    break
                if "load_s" not in extra and state["load_s"] is not None:
                    extra["load_s"] = state["load_s"]
                if state["violation"]:
                    for i in range(start, n):
                        tests[i] = {
                            "status": "error",
                            "output": None,
                            "calls": None,
                            "duration_s": 0.0,
                            "error": f"ProtocolError: {state['violation']}",
                        }
                    overall, extra["protocol_violation"] = "error", state["violation"]
                    break
                if not state["loaded"]:  # the module did not load: nothing ran
                    overall = status if status != "ok" else "error"
                    extra["load_error"] = state["load_error"] or f"module did not load ({status})"
                    extra["reason"] = facts.get("reason")
                    break
                i = state["next"]
                if state["after_memory_error"] and not state["done"]:
                    # the child ended itself after a MemoryError in test i - 1: that test is "memory" when we saw
                    # the memory used, and the next test starts in a fresh child (nothing of it ran yet)
                    if status == "memory":
                        tests[i - 1]["status"] = "memory"
                        overall = "memory" if overall == "ok" else overall
                    if i >= n or req.get("stop_on_error"):
                        break
                    start = i
                    continue
                if i >= n or (state["done"] and status == "ok"):
                    break  # all ran, or stop_on_error stopped the child after a failing test
                # the child ended abnormally inside test i
                tstatus = status if status not in ("ok", "sandbox_error") else "error"
                tests[i] = {
                    "status": tstatus,
                    "output": None,
                    "duration_s": time.monotonic() - state["t_mark"],
                    "calls": None,
                    "error": f"{facts.get('reason', tstatus)} during the test",
                }
                if tstatus != "error" and overall == "ok":
                    overall = tstatus
                if tstatus == "output_limit" or req.get("stop_on_error"):
                    break
                start = i + 1
        finally:
            if workdir is not None:
                self._clean_tmp(workdir)
        for i in range(n):
            if tests[i] is None:
                tests[i] = {"status": "not_run", "output": None, "error": None, "duration_s": 0.0, "calls": None}
        result = self._finish(t0, out, overall, req, extra)
        result["tests"] = tests
        return result

    def _workdir(self) -> str:
        workdir = tempfile.mkdtemp(prefix="run-", dir=self.work_base)
        if self.cfg["uid"] is not None:
            os.chown(workdir, self.cfg["uid"], self.cfg["uid"])
        return workdir

    # -- requests
    def handle(self, req: dict, raw: bytes | None = None) -> dict:
        op = req.get("op")
        if op == "hello":
            return {
                "ok": True,
                "protocol": PROTOCOL,
                "pid": os.getpid(),
                "python": sys.version.split()[0],
                "child_uid": self.cfg["uid"] if self.cfg["uid"] is not None else os.geteuid(),
                **self.meta,
            }
        if op == "ping":
            return {"ok": True}
        if op == "stats":
            ours = {self._ready and self._ready.workdir}
            dirs = [d for d in os.listdir(self.work_base) if os.path.join(self.work_base, d) not in ours]
            kids = [
                pid for pid in self._children() if not (self._ready and pid == self._ready.pid) and pid != self.init_pid
            ]
            tasks: list | None = None
            if self.cgroup is not None:  # processes in the worker's cgroup, the pre-forked child aside
                tasks = [p for p in self.cgroup.procs() if not (self._ready and p == self._ready.pid)]
            return {
                "ok": True,
                "workdirs": len(dirs),
                "children": kids,
                "ready": self._ready.pid if self._ready else None,
                "fds": len(os.listdir("/proc/self/fd")),
                "cgroup_procs": tasks,
                "init": self.init_pid,
            }
        if op in ("run", "tests", "check"):
            error = _validate(req)
            if error:
                return {
                    "status": "sandbox_error",
                    "stdout": "",
                    "stderr": error,
                    "duration_s": 0.0,
                    "meta": dict(self.meta),
                }
            raw = raw if raw is not None else json.dumps(req).encode()
            return {"run": self.handle_run, "tests": self.handle_tests, "check": self.handle_check}[op](req, raw)
        return {
            "status": "sandbox_error",
            "stdout": "",
            "stderr": f"unknown op {op!r}",
            "duration_s": 0.0,
            "meta": dict(self.meta),
        }

    def serve(self, listener: socket.socket) -> None:
        """Serve the one client connection; exit when it closes (so a dead client leaves no server behind)."""
        listener.settimeout(ACCEPT_TIMEOUT_S)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            return
        listener.close()
        conn.settimeout(None)
        self.prefork()
        with conn:
            while True:
                try:
                    raw = recv_frame_bytes(conn)
                    req = json.loads(raw)
                    if not isinstance(req, dict):
                        raise ValueError("frame is not a JSON object")
                except (EOFError, ConnectionError):
                    break
                except ValueError as exc:
                    send_frame(conn, {"status": "sandbox_error", "stderr": f"bad request: {exc}"})
                    break
                if req.get("op") == "shutdown":
                    send_frame(conn, {"ok": True})
                    return
                try:
                    resp = self.handle(req, raw)
                except Exception:  # noqa: BLE001 - our fault: report it, then let the pool replace us
                    resp = {
                        "status": "sandbox_error",
                        "stdout": "",
                        "stderr": traceback.format_exc()[-4000:],
                        "duration_s": 0.0,
                        "meta": dict(self.meta),
                    }
                    self.recycle = self.recycle or "a request failed inside the server"
                if self.recycle:  # the pool replaces this worker before its next program (Pool._received)
                    resp["recycle"] = self.recycle
                try:
                    send_frame(conn, resp)
                except (OSError, ValueError, RecursionError):
                    break
                if self.recycle:
                    break
                self.prefork()


def _validate(req: dict) -> str | None:
    if not isinstance(req.get("source"), str):
        return "source must be a string"
    for key in ("timeout_s", "memory_mb", "output_limit"):
        if not isinstance(req.get(key), (int, float)) or req[key] <= 0:
            return f"{key} must be a positive number"
    if req.get("clock", "wall") not in CLOCKS:
        return f"clock must be one of {', '.join(CLOCKS)}"
    if req.get("op") == "tests":
        if not isinstance(req.get("entry_point"), str) or not isinstance(req.get("inputs"), list):
            return "tests need entry_point (str) and inputs (list)"
        if not all(isinstance(x, list) for x in req["inputs"]):
            return "each test input must be a list of positional arguments"
    if req.get("op") == "check" and not (isinstance(req.get("entry_point"), str) and isinstance(req.get("test"), str)):
        return "checks need entry_point (str) and test (str: code that defines check(candidate))"
    return None


def add_site_packages() -> None:
    """Under `python -S` (how the pools start us): put site-packages on sys.path, as `site` would, but without
    running its .pth files. Those import modules at start-up (threading among them, whose at-fork hook costs
    every child ~130 copy-on-write page faults, ~0.6 ms) and editable-install finders programs have no use for."""
    import site

    for path in site.getsitepackages():
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="sandbox fork server (see the module docstring)")
    parser.add_argument("--socket", required=True, help="unix socket path to listen on")
    parser.add_argument(
        "--uid", default=None, help="unprivileged uid for children (root only); 'auto' = UID_AUTO_BASE + server pid"
    )
    parser.add_argument("--nproc", type=int, default=DEFAULT_NPROC, help="RLIMIT_NPROC for children")
    parser.add_argument("--fsize-mb", type=int, default=DEFAULT_FSIZE_MB, help="RLIMIT_FSIZE for children")
    parser.add_argument("--nofile", type=int, default=DEFAULT_NOFILE, help="RLIMIT_NOFILE for children")
    parser.add_argument("--tmpfs-mb", type=int, default=DEFAULT_TMPFS_MB, help="size of private tmpfs mounts")
    parser.add_argument("--work-dir", default=None, help="where work dirs go without a private tmpfs")
    parser.add_argument("--no-prefork", action="store_true", help="fork each child only when its job comes")
    parser.add_argument("--no-netns", action="store_true", help="do not try to isolate the network")
    parser.add_argument(
        "--no-userns",
        action="store_true",
        help="without root, no user namespace of its own (enter_user_namespace): no namespace at all",
    )
    parser.add_argument("--no-private-tmp", action="store_true", help="do not mount private tmpfs (root only)")
    parser.add_argument(
        "--wipe-ipc",
        action="store_true",
        help="remove every SysV IPC object after every program (a container's own namespace)",
    )
    parser.add_argument(
        "--wipe-tmp", action="store_true", help="empty /tmp, /var/tmp, /dev/shm after every program (a container's own)"
    )
    parser.add_argument("--no-cgroup", action="store_true", help="no cgroup per worker (root only)")
    parser.add_argument("--no-pidns", action="store_true", help="no pid namespace for programs (root only)")
    parser.add_argument(
        "--no-private-root",
        action="store_true",
        help="programs see the host's file tree, not a root of their own (root only)",
    )
    parser.add_argument(
        "--container-oom",
        action="store_true",
        help="read the container's OOM-kill count during and after every program",
    )
    parser.add_argument("--no-seccomp", action="store_true", help="no seccomp filter for children (seccomp.py)")
    args = parser.parse_args(argv)
    if sys.flags.no_site:
        add_site_packages()
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    # Bind before entering a private mount namespace, so the socket lives in the filesystem the client sees.
    if os.path.exists(args.socket):
        os.unlink(args.socket)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp_path = args.socket + ".tmp"
    if os.path.exists(tmp_path):
        os.unlink(tmp_path)
    listener.bind(tmp_path)
    os.chmod(tmp_path, 0o666)
    listener.listen(1)
    os.rename(tmp_path, args.socket)  # appears when it accepts connections (they wait in the backlog)
    scrub_environment()
    install_stdio()
    ignore_signals()
    server = Server(args)
    ready_for_children()
    gc.collect()
    gc.freeze()  # keep the preloaded heap out of the collector, so children do not copy it on write
    try:
        server.serve(listener)
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
