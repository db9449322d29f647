"""Helpers for the sandbox tests: open a backend (failing, never skipping, when it is unavailable) and check
that nothing of a program survived it."""

from __future__ import annotations

import os
import time

import pytest

import sandbox

HOSTILE_TIMEOUT_S = 1.5     # hostile programs get short limits so the suite stays fast
HOSTILE_MEMORY_MB = 256

BACKENDS = ["process", pytest.param("docker", marks=pytest.mark.docker)]


def open_backend(backend: str, **kwargs) -> sandbox.Sandbox:
    kwargs = {"workers": 2, "timeout_s": HOSTILE_TIMEOUT_S, "memory_mb": HOSTILE_MEMORY_MB, "cache": False,
              **kwargs}
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
    if box.backend == "process":  # children run under per-worker uids no other process uses
        uids = {h["info"]["child_uid"] for h in health if h["info"].get("user_isolated")}
        ready = {h["ready"] for h in health}  # the pre-forked child waiting for the next program
        stray = [pid for pid in _uid_processes(uids) if pid not in ready]
        if stray:
            problems.append(f"processes left under sandbox uids: {stray}")
    return problems


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
