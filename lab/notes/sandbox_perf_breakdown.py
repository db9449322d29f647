"""Where a process-backend worker spends its CPU, by kernel sampling: `perf record -e cpu-clock -g` (a software
clock: this VM exposes no hardware counters) on one fork server and, through inheritance, every child it forks,
while it runs the bench's HumanEval program set (canonical + wrong variants) twice.

    python lab/notes/sandbox_perf_breakdown.py [--python PATH] [--server forkserver.py] [--freq 20000]

Needs root (or perf_event_paranoid <= 1) and /usr/bin/perf. Prints the share of samples per (server | child) x
(user space, page fault, fork, exit, each syscall), then the user-space functions the server's and the children's
page faults come from. Sampling at 20 kHz inflates everything a little (the sampling's own cost lands in the
profiled tasks), so read the shares, not absolute times; per-program CPU comes from lab/notes/sandbox_cpu_ab.py.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time

import sandbox.pool
from sandbox.api import Limits, Sandbox
from sandbox.pool import LocalLauncher, Pool
from selfplay.bench.humaneval_set import load_programs


def record(python: str | None, server: str | None, freq: int, out: str) -> int:
    sources = [p.source for p in load_programs()]
    saved = sandbox.pool.FORKSERVER_PATH
    sandbox.pool.FORKSERVER_PATH = server or saved
    try:
        pool = Pool([LocalLauncher(0, python=python)])
    finally:
        sandbox.pool.FORKSERVER_PATH = saved
    with Sandbox(pool, "process", Limits(timeout_s=3.0, memory_mb=512, output_limit=1_000_000), cache=False) as sb:
        sb.run_many(["pass"])
        pid = pool.workers[0].launcher.pid
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(freq), "-g", "-o", out, "-p", str(pid)]
        )
        time.sleep(1.0)  # perf attaches
        for _ in range(2):
            sb.run_many(sources)
        perf.send_signal(signal.SIGINT)
        perf.wait()
    return pid


def samples(data: str):
    """(pid, [(symbol, dso), ...] innermost first) per sample."""
    text = subprocess.run(
        ["perf", "script", "-i", data, "-F", "pid,ip,sym,dso"], capture_output=True, text=True, check=True
    ).stdout
    for block in text.split("\n\n"):
        lines = [line.strip() for line in block.strip().splitlines() if line.strip()]
        if not lines:
            continue
        pid = int(lines[0].split()[0].split("/")[0])
        frames = []
        for line in lines[1:]:
            parts = line.split(None, 1)
            if len(parts) < 2:
                continue
            sym, _, dso = parts[1].rpartition(" (")
            frames.append((sym, dso.rstrip(")")))
        yield pid, frames


def category(frames) -> str:
    names = [s for s, _ in frames]
    joined = " ".join(names)
    if "copy_process" in joined or "dup_mmap" in joined:
        return "kernel: fork (copy_process, page tables)"
    if "asm_exc_page_fault" in names:
        return "kernel: page fault"
    if "do_exit" in joined or "exit_mmap" in joined or "do_group_exit" in joined:
        return "kernel: exit (address space teardown)"
    if "do_syscall_64" in names:
        calls = [s for s in names if s.startswith(("__x64_sys_", "__do_sys_"))]
        return "kernel: syscall " + (calls[-1].replace("__x64_sys_", "").replace("__do_sys_", "") if calls else "?")
    if frames and "kernel" in frames[0][1]:
        return "kernel: other"
    return "user: " + (os.path.basename(frames[0][1]) if frames else "?")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=None, help="the fork server's interpreter (default: this one)")
    ap.add_argument("--server", default=None, help="another forkserver.py (default: this checkout's)")
    ap.add_argument("--freq", type=int, default=20000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        server = record(args.python, args.server, args.freq, data)
        cats, faults = collections.Counter(), {"server": collections.Counter(), "child": collections.Counter()}
        pids = set()
        for pid, frames in samples(data):
            who = "server" if pid == server else "child"
            pids.add(pid)
            cats[(who, category(frames))] += 1
            names = [s for s, _ in frames]
            if "asm_exc_page_fault" in names:
                k = names.index("asm_exc_page_fault")
                faults[who][" < ".join(names[k + 1 : k + 3]) or "?"] += 1
    total = sum(cats.values())
    print(f"{total} samples at {args.freq} Hz, {len(pids) - 1} children; share of all samples:")
    for (who, what), n in cats.most_common():
        if n / total >= 0.002:
            print(f"  {who:6s} {100 * n / total:5.1f}%  {what}")
    for who, c in faults.items():
        n = sum(c.values())
        print(f"{who}: page-fault samples by faulting function ({n}):")
        for where, k in c.most_common(12):
            print(f"  {100 * k / n:5.1f}%  {where}")


if __name__ == "__main__":
    sys.exit(main())
