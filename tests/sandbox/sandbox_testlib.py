"""Helpers for the sandbox tests: open a backend (failing, never skipping, when it is unavailable) and check
that nothing of a program survived it."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

import sandbox

HOSTILE_TIMEOUT_S = 1.5  # hostile programs get short limits so the suite stays fast
HOSTILE_MEMORY_MB = 256
NEXT_PROGRAMS = 40  # programs that must pass after a hostile one

BACKENDS = ["process", pytest.param("docker", marks=pytest.mark.docker)]


def open_backend(backend: str, **kwargs) -> sandbox.Sandbox:
    kwargs = {"workers": 2, "timeout_s": HOSTILE_TIMEOUT_S, "memory_mb": HOSTILE_MEMORY_MB, "cache": False, **kwargs}
    try:
        return sandbox.open_sandbox(backend=backend, **kwargs)
    except sandbox.SandboxUnavailable as exc:
        pytest.fail(f"backend {backend!r} unavailable: {exc}")


def _uid_processes(uids: set[int]) -> list[int]:
    """Host pids whose real uid is one of `uids` (a /proc scan, no psutil)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) in uids:
                            found.append(int(name))
                        break
        except OSError:
            pass
    return found


def leftovers(box: sandbox.Sandbox) -> list[str]:
    """What the last programs left behind: dead workers, work dirs, processes (empty list = clean)."""
    problems = []
    health = box.health()
    for i, h in enumerate(health):
        if not h["alive"]:
            problems.append(f"worker {i} is dead")
        if h["workdirs"]:
            problems.append(f"worker {i} keeps {h['workdirs']} work dir(s)")
        if h["children"]:
            problems.append(f"worker {i} has child processes {h['children']}")
        if h.get("cgroup_procs"):
            problems.append(f"worker {i} has processes left in its cgroup: {h['cgroup_procs']}")
    if box.backend == "process":  # children run under per-worker uids no other process uses
        uids = {h["info"]["child_uid"] for h in health if h["info"].get("user_isolated")}
        ready = {h["ready"] for h in health}  # the pre-forked child waiting for the next program
        stray = [pid for pid in _uid_processes(uids) if pid not in ready]
        if stray:
            problems.append(f"processes left under sandbox uids: {stray}")
    return problems


def unix_listener(path: str) -> socket.socket:
    """A unix socket listening at `path` (a file path, or "\\0name" in the abstract namespace) that anyone may
    connect to: what a host daemon's socket looks like."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    if not path.startswith("\0"):
        os.chmod(path, 0o777)
    listener.listen(4)
    return listener


def server_fds(box: sandbox.Sandbox) -> list:
    """Each worker's server's open descriptors (none may leak across programs)."""
    return [h.get("fds") for h in box.health()]


def assert_healthy(box: sandbox.Sandbox) -> None:
    """The pool serves the next programs correctly and nothing of the previous one survives."""
    deadline = time.monotonic() + 2.0
    problems = leftovers(box)
    while problems and time.monotonic() < deadline:  # a SIGKILLed process may take a moment to vanish
        time.sleep(0.05)
        problems = leftovers(box)
    assert not problems, problems
    results = box.run_many(["print('alive', 6 * 7)"] * len(box.health()))
    assert [(r.status, r.stdout) for r in results] == [("ok", "alive 42\n")] * len(results)


def assert_serves_the_next_programs(box: sandbox.Sandbox) -> None:
    """assert_healthy, then NEXT_PROGRAMS programs and a grading pass."""
    assert_healthy(box)
    results = box.run_many([f"print({i} * 2)" for i in range(NEXT_PROGRAMS)])
    assert [(r.status, r.stdout) for r in results] == [("ok", f"{i * 2}\n") for i in range(NEXT_PROGRAMS)]
    report = box.run_tests("def f(x):\n    return x + 1\n", "f", [[1], [2]], [2, 3])
    assert report.passed, report


LEFT_BEHIND = r"""
import json, os
dirs = {d: sorted(os.listdir(d)) for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock") if os.path.isdir(d)}
base = os.path.dirname(os.getcwd())
try:  # where it may list it (the same uid as the server); the server's stats count work dirs everywhere
    dirs["work_base"] = sorted(n for n in os.listdir(base) if os.path.join(base, n) != os.getcwd())
except PermissionError:
    pass
for d in ("/tmp", "/var/tmp"):
    if d in dirs:
        dirs[d] = [n for n in dirs[d] if os.path.join(d, n) != base]
ipc = {k: len(open(f"/proc/sysvipc/{k}").read().splitlines()) - 1 for k in ("shm", "sem", "msg")}
print(json.dumps({"dirs": dirs, "ipc": ipc}))
"""


def assert_nothing_left(box: sandbox.Sandbox, fds_before: list) -> None:
    """After a hostile program: the next programs pass, no process, file in the shared dirs or the work base,
    SysV object, cgroup member or server descriptor of it is left (each worker probed; one worker per probe is
    enough where the pool has one)."""
    assert_serves_the_next_programs(box)
    for probe in box.run_many([LEFT_BEHIND] * len(fds_before)):
        assert probe.status == "ok", probe
        found = json.loads(probe.stdout)
        assert all(not names for names in found["dirs"].values()), found
        assert found["ipc"] == {"shm": 0, "sem": 0, "msg": 0}, found
    assert server_fds(box) == fds_before


def forged_frames(entry: str, output_expr: str, calls) -> str:
    """A program whose `entry` finds the harness's request (through the frames), writes a well-formed result frame
    per input itself (answer `output_expr` of the input list `args`, duration 3e-12 s, `calls`) and a "done"
    frame to the result descriptor, then `os._exit(0)`: what a forged verdict looks like."""
    return f"""import json, os, struct, sys

def {entry}(*_):
    frame = sys._getframe(1)
    while frame is not None and "req" not in frame.f_locals:
        frame = frame.f_back
    req = frame.f_locals["req"]
    for i, args in enumerate(req["inputs"]):
        answer = {{"t": "test", "i": i, "status": "ok", "output": {output_expr}, "error": None,
                  "duration_s": 3e-12, "calls": {calls!r}}}
        data = json.dumps(answer).encode()
        os.write(3, struct.pack(">I", len(data)) + data)
    done = json.dumps({{"t": "done"}}).encode()
    os.write(3, struct.pack(">I", len(done)) + done)
    os._exit(0)
"""
