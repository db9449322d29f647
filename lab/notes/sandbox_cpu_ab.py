"""Where does the process backend's CPU go, per program, and what does the interpreter change? Counted, not timed.

    python lab/notes/sandbox_cpu_ab.py [--rounds 5] [--pythons 3.11.7 debian 3.12 3.13] [--runners process fork exec]
                                   [--workers 1] [--limit N]

Every figure is CPU time from the kernel's accounting (utime+stime and minor page faults from /proc/PID/stat and
getrusage), so another job on the machine changes it little (cache and TLB pressure still do); wall time is
reported too, but only as a ratio inside a round. The programs are the bench's (HumanEval canonical + wrong
variants, `selfplay.bench.humaneval_set`, before the bench drops equivalent mutants). Rounds are interleaved:
each round runs every (runner, interpreter) pair once, in a rotated order; the table gives medians over rounds.

Runners, all with the same interpreter per column:
- process: `open_sandbox("process", python=PY)`: the fork servers' own CPU ("server"), their reaped children's
  ("children": the programs, their set-up and exit, reaped by the server), the client's (this process);
- fork: the bench's bare-fork runner (a preloaded `-I -S` interpreter forking once per program, no isolation):
  the parent's own CPU and its children's;
- exec: in-process `exec` of every program in a preloaded `-I -S` interpreter (the floor): its CPU;
- noprefork: process with `--no-prefork`; base: process with another forkserver.py (--base-server, e.g. an
  older commit's); lazybind: process without LD_BIND_NOW in the servers' environment.
With two runners and one interpreter the rounds alternate them closely; --paired prints the median over rounds
of the per-round ratio of the second runner's CPU to the first's (load that comes and goes cancels out better).
Results: lab/notes/sandbox_speed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import sandbox.pool
from sandbox.api import Limits, Sandbox
from sandbox.forkserver import PRELOAD
from sandbox.pool import LocalLauncher, Pool
from selfplay.bench.humaneval_set import load_programs
from selfplay.bench.sandbox_bench import BARE_FORK, drive_fork_workers

PYTHONS = {
    "3.11.7": sys.executable,
    "debian": "/usr/bin/python3.11",
    "3.12": "/root/.pyenv/versions/3.12.1/bin/python3.12",
    "3.13": "/root/.pyenv/versions/3.13.0/bin/python3.13",
}
TICK = os.sysconf("SC_CLK_TCK")

# The floor in an interpreter of its own (preloaded like a server), reporting its rusage over the loop.
EXEC_FLOOR = r"""
import contextlib, io, json, resource, sys, time
for name in sys.argv[1:]:
    try:
        __import__(name)
    except ImportError:
        pass
programs = json.loads(sys.stdin.readline())
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
ok = []
for source in programs:
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            exec(compile(source, "<program>", "exec"), {"__name__": "__main__"})
        ok.append(True)
    except BaseException:
        ok.append(False)
r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
print(json.dumps({"verdicts": ok, "wall": t1 - t0, "cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
                  "user": r1.ru_utime - r0.ru_utime, "faults": r1.ru_minflt - r0.ru_minflt}))
"""

# The bench's bare-fork script, with rusage of the parent and its reaped children around the loop.
BARE_FORK_COUNTED = BARE_FORK.replace(
    "verdicts, seconds = [], []",
    "import resource\nR = resource.getrusage\nr0 = (R(resource.RUSAGE_SELF), R(resource.RUSAGE_CHILDREN))\n"
    "verdicts, seconds = [], []",
).replace(
    "print(json.dumps([verdicts, seconds]), flush=True)",
    "r1 = (R(resource.RUSAGE_SELF), R(resource.RUSAGE_CHILDREN))\n"
    "d = [(b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime, b.ru_minflt - a.ru_minflt) for a, b in zip(r0, r1)]\n"
    "print(json.dumps([verdicts, seconds, d]), flush=True)",
)


def proc_cpu(pid: int) -> dict:
    """utime+stime, the reaped children's cutime+cstime (seconds) and minor faults of a live process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is state (field 3); minflt=10, cminflt=11, utime=14, stime=15, cutime=16, cstime=17
    g = lambda k: int(fields[k - 3])  # noqa: E731
    return {
        "self": (g(14) + g(15)) / TICK,
        "self_user": g(14) / TICK,
        "children": (g(16) + g(17)) / TICK,
        "children_user": g(16) / TICK,
        "faults": g(10),
        "child_faults": g(11),
    }


def run_process(
    python: str,
    sources: list[str],
    workers: int,
    extra_args: tuple = (),
    server: str | None = None,
    env_drop: tuple = (),
) -> dict:
    saved, saved_env = sandbox.pool.FORKSERVER_PATH, sandbox.pool.server_env
    sandbox.pool.FORKSERVER_PATH = server or saved  # both read by LocalLauncher.start (here, in Pool())
    sandbox.pool.server_env = lambda: {k: v for k, v in saved_env().items() if k not in env_drop}
    try:
        pool = Pool([LocalLauncher(i, python=python, extra_args=extra_args) for i in range(workers)])
    finally:
        sandbox.pool.FORKSERVER_PATH, sandbox.pool.server_env = saved, saved_env
    with Sandbox(pool, "process", Limits(timeout_s=3.0, memory_mb=512, output_limit=1_000_000), cache=False) as sb:
        sb.run_many(["pass"] * workers)
        pids = [w.launcher.pid for w in sb._pool.workers]
        before = [proc_cpu(p) for p in pids]
        c0, t0 = time.process_time(), time.perf_counter()
        results = sb.run_many(sources)
        wall, client = time.perf_counter() - t0, time.process_time() - c0
        after = [proc_cpu(p) for p in pids]
    d = {k: sum(a[k] - b[k] for a, b in zip(after, before)) for k in before[0]}
    return {
        "wall": wall,
        "client": client,
        "server": d["self"],
        "children": d["children"],
        "children_user": d["children_user"],
        "server_faults": d["faults"],
        "child_faults": d["child_faults"],
        "verdicts": [r.status == "ok" for r in results],
        "python": sb._pool.workers[0].info.get("python"),
    }


def run_fork(python: str, sources: list[str], workers: int) -> dict:
    shares, wall = drive_fork_workers(BARE_FORK_COUNTED, sources, workers, python=python, timeout_s=3.0)
    verdicts = [False] * len(sources)
    for k, (v, _, _) in enumerate(shares):
        for j, i in enumerate(range(k, len(sources), workers)):
            verdicts[i] = v[j]
    return {
        "wall": wall,
        "server": sum(s[2][0][0] for s in shares),
        "children": sum(s[2][1][0] for s in shares),
        "server_faults": sum(s[2][0][1] for s in shares),
        "child_faults": sum(s[2][1][1] for s in shares),
        "client": 0.0,
        "verdicts": verdicts,
    }


def run_exec(python: str, sources: list[str], workers: int) -> dict:
    out = subprocess.run(
        [python, "-I", "-S", "-c", EXEC_FLOOR, *PRELOAD],
        input=json.dumps(sources) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    r = json.loads(out.stdout)
    return {
        "wall": r["wall"],
        "server": r["cpu"],
        "children": 0.0,
        "client": 0.0,
        "server_faults": r["faults"],
        "child_faults": 0,
        "verdicts": r["verdicts"],
    }


RUNNERS = {
    "process": run_process,
    "fork": run_fork,
    "exec": run_exec,
    "noprefork": lambda py, src, w: run_process(py, src, w, ("--no-prefork",)),
    "base": lambda py, src, w: run_process(py, src, w, server=BASE_SERVER),
    "lazybind": lambda py, src, w: run_process(py, src, w, env_drop=("LD_BIND_NOW",)),
}
BASE_SERVER = None  # --base-server: another forkserver.py (e.g. `git show COMMIT:sandbox/forkserver.py > F`)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pythons", nargs="*", default=list(PYTHONS))
    ap.add_argument("--runners", nargs="*", default=list(RUNNERS))
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--base-server", default=None, help="forkserver.py the 'base' runner starts")
    ap.add_argument("--paired", action="store_true", help="with 2 runners: the per-round CPU ratio, second/first")
    args = ap.parse_args()
    global BASE_SERVER
    BASE_SERVER = args.base_server and os.path.abspath(args.base_server)
    sources = [p.source for p in load_programs(args.limit)]
    n = len(sources)
    pairs = [(r, p) for r in args.runners for p in args.pythons if os.path.exists(PYTHONS[p])]
    rows: dict[tuple, list[dict]] = {}
    for k in range(args.rounds):
        order = pairs[k % len(pairs) :] + pairs[: k % len(pairs)]
        for runner, py in order:
            rows.setdefault((runner, py), []).append(RUNNERS[runner](PYTHONS[py], sources, args.workers))
        print(f"round {k + 1}/{args.rounds} done (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    ref = rows[pairs[0]][0]["verdicts"]
    print(
        f"{n} programs, {args.workers} worker(s), medians of {args.rounds} rounds; ms of CPU per program "
        f"(faults per program)"
    )
    print(
        f"{'runner':8s} {'python':7s} {'total CPU':>9s} {'server':>7s} {'children':>8s} {'client':>6s} "
        f"{'srv flt':>7s} {'chld flt':>8s} {'wall':>6s}  verdicts"
    )
    table = {}
    for (runner, py), rs in rows.items():
        med = lambda key, rs=rs: statistics.median(r[key] for r in rs) * 1e3 / n  # noqa: E731
        total = statistics.median((r["server"] + r["children"] + r["client"]) for r in rs) * 1e3 / n
        same = all(r["verdicts"] == ref for r in rs)
        table[f"{runner}/{py}"] = {
            "total": total,
            "server": med("server"),
            "children": med("children"),
            "client": med("client"),
            "server_faults": med("server_faults") / 1e3,
            "child_faults": med("child_faults") / 1e3,
            "wall": med("wall"),
            "totals": [(r["server"] + r["children"] + r["client"]) * 1e3 / n for r in rs],
            "same_verdicts": same,
        }
        t = table[f"{runner}/{py}"]
        print(
            f"{runner:8s} {py:7s} {total:9.3f} {t['server']:7.3f} {t['children']:8.3f} {t['client']:6.3f} "
            f"{t['server_faults']:7.1f} {t['child_faults']:8.1f} {t['wall']:6.3f}  "
            f"{'same' if same else 'DIFFER'}  rounds: {', '.join(f'{x:.2f}' for x in t['totals'])}"
        )
    if args.paired and len(pairs) == 2:
        a, b = (table[f"{r}/{p}"]["totals"] for r, p in pairs)
        ratios = sorted(y / x for x, y in zip(a, b))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(
            f"{pairs[1][0]}/{pairs[0][0]} CPU per round: median {statistics.median(ratios):.3f} "
            f"(quartiles {q[0]:.3f}-{q[2]:.3f}, {len(ratios)} rounds)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=2)


if __name__ == "__main__":
    main()
