"""The public sandbox API: open_sandbox(), results, and output comparison (see sandbox/__init__.py)."""

from __future__ import annotations

import importlib
import json
import math
import os
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Literal, overload

from sandbox.errors import SandboxConfigError
from sandbox.forkserver import CLOCKS
from sandbox.limits import Limits, check_timeout

STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error")
TEST_STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "killed", "not_run", "unserializable")
BACKENDS = ("process", "docker")
MAX_WORKERS = 256  # more fork servers than this is a typo, not a plan


# ------------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class ExecResult:
    status: str  # one of STATUSES
    stdout: str = ""  # captured, capped at output_limit bytes (stdout+stderr together)
    stderr: str = ""
    duration_s: float = 0.0  # wall-clock seconds the run took, measured by the worker's server
    cached: bool = False  # True when this came from the result cache
    meta: dict = field(default_factory=dict)  # backend, network_isolated, user_isolated, exit_code, signal, ...

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ExecResult:
        return cls(
            status=d["status"],
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            duration_s=float(d.get("duration_s", 0.0)),
            cached=bool(d.get("cached", False)),
            meta=dict(d.get("meta") or {}),
        )


@dataclass(frozen=True)
class TestOutcome:
    __test__ = False  # not a pytest class
    status: str  # one of TEST_STATUSES
    output: Any = None  # the normalised JSON value the entry point returned (None if it did not)
    error: str | None = None  # short "ExcType: message"
    passed: bool | None = None  # compared with the expected output in the parent; None without expected
    duration_s: float = 0.0  # measured by the server: previous answer (or the load) to this answer
    calls: list[str] | None = None  # solution functions that ran during this test (record_calls=True)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TestOutcome:
        return cls(
            status=d["status"],
            output=d.get("output"),
            error=d.get("error"),
            passed=d.get("passed"),
            duration_s=float(d.get("duration_s", 0.0)),
            calls=d.get("calls"),
        )


@dataclass(frozen=True)
class TestReport:
    __test__ = False
    status: str  # "ok" when the module loaded and every test ran to an answer
    tests: list[TestOutcome] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    cached: bool = False
    meta: dict = field(default_factory=dict)

    @property
    def passed(self) -> int:
        return sum(1 for t in self.tests if t.passed)

    @property
    def total(self) -> int:
        return len(self.tests)

    @property
    def all_passed(self) -> bool:
        """Every test compared equal (False when there are no tests or no expected outputs)."""
        return bool(self.tests) and all(t.passed for t in self.tests)

    @property
    def outputs(self) -> list:
        return [t.output for t in self.tests]

    @property
    def compute_s(self) -> float:
        """Seconds the module load and the tests took as the server measured them (meta["load_s"] plus each
        test's duration_s): a clock the program cannot set, and work moved into import time still counts."""
        return float(self.meta.get("load_s") or 0.0) + sum(t.duration_s for t in self.tests)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(passed=self.passed, total=self.total, all_passed=self.all_passed)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TestReport:
        return cls(
            status=d["status"],
            tests=[TestOutcome.from_dict(t) for t in d.get("tests", [])],
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            duration_s=float(d.get("duration_s", 0.0)),
            cached=bool(d.get("cached", False)),
            meta=dict(d.get("meta") or {}),
        )


# -------------------------------------------------------------------------------------- comparison
def normalize(value: Any) -> Any:
    """A value as it looks after a JSON round trip (tuples -> lists, int keys -> str). SandboxConfigError if
    it is not JSON-serialisable."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError, RecursionError) as exc:
        raise SandboxConfigError(
            f"value is not JSON-serialisable ({exc}); use lists, dicts, str, numbers, bool and None"
        ) from None


def outputs_equal(output: Any, expected: Any) -> bool:
    """Compare a normalised output with a normalised expectation, exactly where the expectation is exact:
    - a float expectation accepts an int or float within math.isclose(rel_tol=1e-6, abs_tol=1e-9) (NaN == NaN):
      the tolerance exists only where the reference itself produced a float; an int too large for a float is
      compared exactly (never converted);
    - an int expectation accepts only an int of the same value (12345678.0 is not 12345679, nor is 12345679.0);
    - bool only equals bool (True is not 1), strings and None exactly;
    - lists (and tuples) element by element, dicts by equal keys and values, each by the same rules.
    Total: it never raises, whatever the two values are (any nesting depth, huge ints, NaN, inf, values outside
    the protocol): what cannot be compared is not equal."""
    try:
        return _equal(output, expected)
    except Exception:  # noqa: BLE001 - a value outside the protocol whose ==, keys() or hash raised: not equal
        return False


def _float_close(a: Any, b: float) -> bool:
    """An int or float answer against a float expectation (bools are handled by the caller)."""
    if not isinstance(a, (int, float)):
        return False
    if math.isnan(b) or (isinstance(a, float) and math.isnan(a)):
        return isinstance(a, float) and math.isnan(a) and math.isnan(b)
    try:
        return math.isclose(float(a), b, rel_tol=1e-6, abs_tol=1e-9)
    except OverflowError:  # an int beyond a float's range: no float is within tolerance unless exactly so
        if math.isinf(b):
            return False
        fa, fb = Fraction(int(a)), Fraction(b)
        return abs(fa - fb) <= max(Fraction(1e-6) * max(abs(fa), abs(fb)), Fraction(1e-9))


def _equal(output: Any, expected: Any) -> bool:
    pending = [(output, expected)]  # a stack, not recursion: any nesting depth compares
    while pending:
        a, b = pending.pop()
        if isinstance(a, bool) or isinstance(b, bool):
            same = type(a) is type(b) and a == b
        elif isinstance(b, float):
            same = _float_close(a, b)
        elif isinstance(b, int):
            same = type(a) is int and a == b
        elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            same = type(a) is type(b) and len(a) == len(b)
            if same:
                pending.extend(zip(a, b))
        elif isinstance(a, dict) and isinstance(b, dict):
            same = a.keys() == b.keys()
            if same:
                pending.extend((a[k], b[k]) for k in a)
        else:
            same = type(a) is type(b) and a == b
        if not same:
            return False
    return True


# ------------------------------------------------------------------------------------------ sandbox
def _optional(module: str, name: str):
    """A class from a sibling module written by another part of the project, or None while it is absent."""
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None
        raise


def _check_source(source, what: str = "program") -> str:
    if not isinstance(source, str):
        raise SandboxConfigError(f"the {what} must be a str of Python source, got {type(source).__name__}")
    return source


NO_USERNS = "no user namespace"  # in a gap's reason: the kernel refused the server an unprivileged one


def process_isolation_gaps(infos: list[dict]) -> dict[str, str]:
    """What the process backend's workers lack, each with why, from their hello (forkserver.Server.meta)."""
    refused = next((i["userns_error"] for i in infos if i.get("userns_error")), None)
    cause = f" ({NO_USERNS}: {refused})" if refused else ""
    gaps = {}
    if not all(i.get("network_isolated") for i in infos):
        gaps["network"] = "programs share the host's network (no network namespace)" + cause
    files = []
    if not all(i.get("private_root") for i in infos):
        files.append("programs see the host's file tree, not a root of their own")
    if not all(i.get("user_isolated") or i.get("user_namespace") for i in infos):
        files.append("they run under the server's uid, outside any user namespace of theirs")
    if any(i.get("read_all_files") for i in infos):
        files.append("they may read every file (CAP_DAC_READ_SEARCH: the Python installation is in a closed directory)")
    if files:
        gaps["files"] = "; ".join(files) + cause
    if not all(i.get("private_tmp") and i.get("ipc_isolated") for i in infos):
        gaps["fresh_state"] = "/tmp, /dev/shm and SysV IPC are the host's, shared with other programs" + cause
    if not all(i.get("private_proc") and i.get("pid_namespace") for i in infos):
        gaps["processes"] = "programs see and may signal host processes (no pid namespace)" + cause
    # a program's whole tree: a cgroup, or the server's own reading of its memory (TreeMemory) with a process limit
    # that counts only the worker's processes (a uid of its own, or its user namespace)
    if not all(i.get("cgroup") or (i.get("tree_memory_limit") and i.get("nproc_per_worker")) for i in infos):
        tree = []
        if not all(i.get("cgroup") or i.get("tree_memory_limit") for i in infos):
            tree.append("no cgroup per worker and the server does not read the tree's memory (--no-cgroup)")
        if not all(i.get("cgroup") or i.get("nproc_per_worker") for i in infos):
            tree.append("RLIMIT_NPROC counts every process of the server's user (no uid of its own, no user namespace)")
        gaps["resources"] = "a program's whole tree is not held: " + "; ".join(tree) + cause
    return gaps


def isolation_refusal(backend: str, why: dict[str, str]) -> str:
    """Why a run that needs isolation does not start, and what to do about it."""
    gaps = "; ".join(f"{name}: {reason}" for name, reason in why.items())
    remedy = "run the process backend as root or use the docker backend"
    if any(NO_USERNS in reason for reason in why.values()):
        remedy = (
            "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 where the kernel "
            "has it, and user.max_user_namespaces above 0), " + remedy
        )
    return (
        f"the {backend} sandbox lacks isolation: {gaps} (docs/sandbox.md, 'What isolation holds where'): "
        f"programs could read hidden tests or the host; {remedy}, or set sandbox.allow_unisolated=true to "
        f"accept it"
    )


class Sandbox:
    """Runs programs and gradings over a pool of workers. Use as a context manager (or call close())."""

    def __init__(
        self,
        pool,
        backend: str,
        limits: Limits,
        cache: bool = True,
        cache_path: str | None = None,
        trace_path: str | None = None,
    ):
        self._pool = pool
        self._finalizer = weakref.finalize(self, pool.close)  # workers stop even if close() is forgotten
        self.backend = backend
        self.limits = limits
        self._cache = None
        if cache:
            result_cache = _optional("sandbox.cache", "ResultCache")
            self._cache = result_cache(path=cache_path) if result_cache else None
        self._trace = None
        if trace_path is not None:
            trace_log = _optional("sandbox.trace", "TraceLog")
            if trace_log is None:
                raise SandboxConfigError("trace_path needs sandbox/trace.py, which this installation lacks")
            self._trace = trace_log(trace_path)
        self._lock = threading.Lock()
        self.counters = {"runs": 0, "cache_hits": 0, "exec_s": 0.0}  # for sandbox/* logging

    # -- plumbing
    def _limits(self, timeout_s=None, memory_mb=None) -> Limits:
        if timeout_s is None and memory_mb is None:
            return self.limits
        return Limits(
            timeout_s=self.limits.timeout_s if timeout_s is None else timeout_s,
            memory_mb=self.limits.memory_mb if memory_mb is None else memory_mb,
            output_limit=self.limits.output_limit,
        )

    def _count(self, n_runs: int, n_hits: int, seconds: float) -> None:
        with self._lock:
            self.counters["runs"] += n_runs
            self.counters["cache_hits"] += n_hits
            self.counters["exec_s"] += seconds

    def _cached_execute(self, kind: str, jobs: Sequence[tuple[str, dict | None, dict, dict]], use_cache: list[bool]):
        """jobs: (source, payload, limits, request); use_cache: per job. Returns raw responses, "cached" set."""
        out: list[dict | None] = [None] * len(jobs)
        keys: list[str | None] = [None] * len(jobs)
        todo = []
        for i, (source, payload, limits, _req) in enumerate(jobs):
            if self._cache is not None and use_cache[i]:
                keys[i] = self._cache.key(kind, source, payload, {**limits, "backend": self.backend})
                hit = self._cache.get(keys[i])
                if hit is not None:
                    out[i] = {**hit, "cached": True}
                    continue
            todo.append(i)
        t0 = time.perf_counter()
        responses = self._pool.execute([jobs[i][3] for i in todo]) if todo else []
        for i, resp in zip(todo, responses):
            resp["cached"] = False
            out[i] = resp
            if (
                self._cache is not None
                and resp["status"] != "sandbox_error"
                and not resp.get("meta", {}).get("worker_restarted")
            ):
                key = keys[i] or self._cache.key(kind, jobs[i][0], jobs[i][1], {**jobs[i][2], "backend": self.backend})
                self._cache.put(key, {k: v for k, v in resp.items() if k != "cached"})
        self._count(len(jobs), len(jobs) - len(todo), time.perf_counter() - t0)
        if self._trace is not None:
            for (source, _, _, _), resp in zip(jobs, out):
                self._trace.record(kind, source, resp)
        return out

    # -- programs
    def run(
        self, source: str, *, timeout_s: float | None = None, memory_mb: int | None = None, use_cache: bool = True
    ) -> ExecResult:
        """Run a self-contained Python program as __main__."""
        return self.run_many([source], timeout_s=timeout_s, memory_mb=memory_mb, use_cache=use_cache)[0]

    def run_many(
        self,
        sources: Sequence[str],
        *,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        use_cache: bool = True,
    ) -> list[ExecResult]:
        """Run programs in parallel over the workers; results in input order."""
        if isinstance(sources, str) or not isinstance(sources, (list, tuple)):
            raise SandboxConfigError("run_many takes a list of program sources; use run() for one program")
        limits = self._limits(timeout_s, memory_mb)
        ld = limits.as_dict()
        jobs = [(_check_source(s), None, ld, {"op": "run", "source": s, **ld}) for s in sources]
        return [ExecResult.from_dict(r) for r in self._cached_execute("run", jobs, [use_cache] * len(jobs))]

    # -- trusted checks
    def run_check(
        self,
        source: str,
        entry_point: str,
        check: str,
        *,
        prompt: str | None = None,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        use_cache: bool = True,
    ) -> ExecResult:
        """Grade module `source` with trusted test code `check` that defines `check(candidate)` (HumanEval's
        form). The test code runs in a checker process the program cannot reach; every call of `candidate` is
        answered by the module in its own process, as a value. `prompt` (the problem's own code, e.g. HumanEval's
        prompt, which `source` usually begins with) runs in the checker before the test code, so the helpers the
        test uses (`poly`, `encode_cyclic`) are the problem's, not the module's: then only the entry point comes
        from the module. Without it the test code may also call the module's other functions, but never one named
        like a builtin (`abs`, `range`, `len` stay the builtins).
        status "ok" means check(entry_point) returned; "error" that it raised (meta["check"]["error"]), or that
        the module did not load, raised, exited or died where an answer was due; otherwise how the run ended."""
        job = dict(source=source, entry_point=entry_point, check=check)
        if prompt is not None:
            job["prompt"] = prompt
        return self.run_check_many([job], timeout_s=timeout_s, memory_mb=memory_mb, use_cache=use_cache)[0]

    def run_check_many(
        self,
        jobs: Sequence[dict],
        *,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        use_cache: bool = True,
    ) -> list[ExecResult]:
        """Many run_check calls (dicts with source, entry_point, check and optionally prompt) in parallel over
        the workers."""
        limits = self._limits(timeout_s, memory_mb)
        ld = limits.as_dict()
        prepared = []
        for job in jobs:
            if not isinstance(job, dict) or not {"source", "entry_point", "check"} <= set(job) <= {
                "source",
                "entry_point",
                "check",
                "prompt",
            }:
                raise SandboxConfigError(
                    "each check job is a dict with source, entry_point, check and optionally prompt"
                )
            _check_source(job["source"], "module")
            _check_source(job["check"], "check code")
            if not isinstance(job["entry_point"], str) or not job["entry_point"].isidentifier():
                raise SandboxConfigError(f"entry_point={job['entry_point']!r}: pass the name of a module function")
            payload = {"entry_point": job["entry_point"], "check": job["check"]}
            req = {
                "op": "check",
                "source": job["source"],
                "entry_point": job["entry_point"],
                "test": job["check"],
                **ld,
            }
            if job.get("prompt") is not None:
                _check_source(job["prompt"], "prompt")
                try:
                    compile(job["prompt"], "<prompt>", "exec")
                except (SyntaxError, ValueError) as exc:
                    raise SandboxConfigError(f"the prompt does not compile: {exc}") from None
                payload["prompt"] = req["prompt"] = job["prompt"]
            prepared.append((job["source"], payload, ld, req))
        out = self._cached_execute("check", prepared, [use_cache] * len(prepared))
        return [ExecResult.from_dict(r) for r in out]

    # -- gradings
    def _tests_job(self, solution, entry_point, inputs, timeout_s, stop_on_failure, record_calls, clock="wall"):
        _check_source(solution, "solution")
        if not isinstance(entry_point, str) or not all(part.isidentifier() for part in entry_point.split(".")):
            raise SandboxConfigError(f"entry_point={entry_point!r}: pass the name of a function in the solution")
        if not isinstance(inputs, (list, tuple)) or not all(isinstance(x, (list, tuple)) for x in inputs):
            raise SandboxConfigError("inputs must be a list of tests, each a list of positional arguments")
        inputs = normalize(list(inputs))
        test_timeout = self.limits.timeout_s if timeout_s is None else check_timeout(timeout_s)
        if clock not in CLOCKS:
            raise SandboxConfigError(f"clock={clock!r}: pass one of {', '.join(CLOCKS)}")
        ld = self.limits.as_dict()
        if clock != "wall":  # (a wall-clock job's cache key is what it was before clocks existed)
            ld["clock"] = clock
        payload = {
            "entry_point": entry_point,
            "inputs": inputs,
            "stop_on_failure": bool(stop_on_failure),
            "record_calls": bool(record_calls),
        }
        limits = {**ld, "test_timeout_s": test_timeout}
        req = {
            "op": "tests",
            "source": solution,
            "entry_point": entry_point,
            "inputs": inputs,
            "test_timeout_s": test_timeout,
            "stop_on_error": bool(stop_on_failure),
            "record_calls": bool(record_calls),
            **ld,
        }
        return solution, payload, limits, req

    @staticmethod
    def _grade(resp: dict, expected, stop_on_failure: bool) -> TestReport:
        """Compare the child's outputs with expected, here in the parent; nothing the child sent is trusted
        beyond being a JSON value."""
        raw = resp.get("tests") or []
        tests = []
        failed = False
        for i, t in enumerate(raw):
            status = t.get("status") if t.get("status") in TEST_STATUSES else "error"
            output = t.get("output") if status == "ok" else None
            passed = None
            if expected is not None:
                passed = status == "ok" and outputs_equal(output, expected[i])
            if failed and stop_on_failure:
                status, output, passed = "not_run", None, (None if expected is None else False)
            tests.append(
                TestOutcome(
                    status=status,
                    output=output,
                    error=t.get("error"),
                    passed=passed,
                    duration_s=float(t.get("duration_s") or 0.0),
                    calls=t.get("calls"),
                )
            )
            failed = failed or status != "ok" or passed is False
        return TestReport(
            status=resp["status"],
            tests=tests,
            stdout=resp.get("stdout", ""),
            stderr=resp.get("stderr", ""),
            duration_s=float(resp.get("duration_s", 0.0)),
            cached=bool(resp.get("cached")),
            meta=dict(resp.get("meta") or {}),
        )

    def run_tests(
        self,
        solution: str,
        entry_point: str,
        inputs: Sequence[Sequence],
        expected=None,
        *,
        timeout_s: float | None = None,
        stop_on_failure: bool = False,
        record_calls: bool = False,
        use_cache: bool = True,
        clock: str = "wall",
    ) -> TestReport:
        """Call solution's entry_point(*input) for each input in a child; compare with expected here. `clock`:
        what `timeout_s` (the module load's, and each test's) counts: "wall" (the default: wall-clock time; how
        every answer is graded) or "cpu" (the child's CPU time as the kernel counts it, with a wall-clock cap of
        10 x the limit, 10 s at least, for a program that sleeps or waits: forkserver.cpu_clock_cap_s): a verdict
        that must not depend on the machine's load, such as whether a task's reference runs (docs/sandbox.md,
        "Timeouts")."""
        return self.run_tests_many(
            [
                dict(
                    solution=solution,
                    entry_point=entry_point,
                    inputs=inputs,
                    expected=expected,
                    timeout_s=timeout_s,
                    stop_on_failure=stop_on_failure,
                    record_calls=record_calls,
                    use_cache=use_cache,
                    clock=clock,
                )
            ]
        )[0]

    def run_tests_many(self, jobs: Sequence[dict]) -> list[TestReport]:
        """Many run_tests calls (dicts of its arguments) in parallel over the workers; reports in order."""
        allowed = {
            "solution",
            "entry_point",
            "inputs",
            "expected",
            "timeout_s",
            "stop_on_failure",
            "record_calls",
            "use_cache",
            "clock",
        }
        prepared, use_cache = [], []
        for job in jobs:
            if (
                not isinstance(job, dict)
                or not {"solution", "entry_point", "inputs"} <= job.keys()
                or job.keys() - allowed
            ):
                raise SandboxConfigError(
                    f"each job is a dict with solution, entry_point, inputs and optionally "
                    f"{sorted(allowed - {'solution', 'entry_point', 'inputs'})}"
                )
            expected = job.get("expected")
            if expected is not None:
                expected = normalize(list(expected))
                if len(expected) != len(job["inputs"]):
                    raise SandboxConfigError(f"{len(expected)} expected outputs for {len(job['inputs'])} inputs")
            prepared.append(
                (
                    self._tests_job(
                        job["solution"],
                        job["entry_point"],
                        job["inputs"],
                        job.get("timeout_s"),
                        job.get("stop_on_failure", False),
                        job.get("record_calls", False),
                        job.get("clock", "wall"),
                    ),
                    expected,
                    bool(job.get("stop_on_failure", False)),
                )
            )
            use_cache.append(bool(job.get("use_cache", True)))
        responses = self._cached_execute("tests", [p[0] for p in prepared], use_cache)
        return [self._grade(resp, expected, stop) for resp, (_, expected, stop) in zip(responses, prepared)]

    # -- lifetime
    def health(self) -> list[dict]:
        """Per worker: alive, restarts, leftovers of the last program (work dirs, child processes), info."""
        return self._pool.health()

    @overload
    def missing_isolation(self, why: Literal[False] = False) -> list[str]: ...

    @overload
    def missing_isolation(self, why: Literal[True]) -> dict[str, str]: ...

    def missing_isolation(self, why: bool = False) -> list[str] | dict[str, str]:
        """What isolation this sandbox lacks (empty: none; docs/sandbox.md, "What isolation holds where"):
        "network" when a worker has no network namespace, "files" when programs may read every file or see the
        host's file tree rather than a root of their own, or run under the server's uid outside a user namespace
        of its own, "fresh_state" when the shared temporary dirs and IPC are not private, "processes" when
        programs see host processes in /proc or share the host's pid namespace, "resources" when a program's
        processes are limited only one by one (memory and pids of the whole tree: neither a cgroup per worker nor
        the server's own reading of the tree's memory with a process limit counted per worker),
        "seccomp" (either backend) when the kernel cannot apply the children's seccomp filter (keyrings, POSIX
        message queues, file locks and socket families but AF_UNIX denied: sandbox/seccomp.py). The docker
        backend lacks nothing else: the container is the boundary. Without root the process backend lacks nothing either
        where the kernel allows an unprivileged user namespace (docs/sandbox.md). `why=True`: a dict, each
        missing name with why it is missing. An RL run should refuse to start when this is not empty unless its
        configuration says otherwise."""
        infos = [h["info"] for h in self.health()]
        gaps = {} if self.backend == "docker" else process_isolation_gaps(infos)
        if not all(i.get("seccomp") for i in infos):
            gaps["seccomp"] = "the kernel cannot apply the children's seccomp filter (sandbox/seccomp.py)"
        return gaps if why else list(gaps)

    def require_isolation(self, allow: bool = False) -> list[str]:
        """missing_isolation(), refused (SandboxConfigError) unless `allow`: what an RL run calls before it starts,
        since a policy that can read hidden tests or the host learns to."""
        why = self.missing_isolation(why=True)
        if why and not allow:
            raise SandboxConfigError(isolation_refusal(self.backend, why))
        return list(why)

    def stats(self) -> dict:
        """Counters since opening: runs, cache_hits, exec_s (seconds spent waiting on workers)."""
        with self._lock:
            return dict(self.counters)

    def close(self) -> None:
        self._finalizer()
        for part in (self._cache, self._trace):
            if part is not None and hasattr(part, "close"):
                part.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (what SLURM's `--cpus-per-task`, taskset or a cgroup cpuset
    gives the job), not the machine's count, which on a shared node can be many times larger."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def open_sandbox(
    backend: str = "process",
    workers: int | None = None,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    cache: bool = True,
    *,
    output_limit: int = 1_000_000,
    cache_path: str | None = None,
    trace_path: str | None = None,
    **options,
) -> Sandbox:
    """Start a sandbox (see the package docstring). Raises SandboxConfigError / SandboxUnavailable."""
    if backend not in BACKENDS:
        raise SandboxConfigError(f"unknown sandbox backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if workers is None:
        workers = usable_cpus()
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise SandboxConfigError(
            f"workers={workers!r}: pass an integer between 1 and {MAX_WORKERS} (or None for one per usable CPU)"
        )
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb, output_limit=output_limit)
    if backend == "docker":
        open_docker = _optional("sandbox.docker_backend", "open_docker_backend")
        if open_docker is None:
            raise SandboxConfigError(
                "backend='docker' needs sandbox/docker_backend.py, which this installation lacks; use backend='process'"
            )
        pool = open_docker(workers=workers, limits=limits, **options)
    else:
        from sandbox.pool import LocalLauncher, Pool

        isolate_user = options.pop("isolate_user", True)
        python = options.pop("python", None)
        confine = options.pop("confine", True)
        if options:
            raise SandboxConfigError(
                f"unknown option(s) for the process backend: {', '.join(sorted(options))}; "
                f"it takes isolate_user=, python=, confine="
            )
        if python is not None and not (
            isinstance(python, str) and os.path.isfile(python) and os.access(python, os.X_OK)
        ):
            raise SandboxConfigError(f"python={python!r}: pass the path of a Python interpreter (or None for this one)")
        extra = () if confine else ("--no-cgroup", "--no-pidns", "--no-private-root")  # docs/sandbox.md
        pool = Pool(
            [LocalLauncher(i, isolate_user=bool(isolate_user), python=python, extra_args=extra) for i in range(workers)]
        )
    return Sandbox(pool, backend, limits, cache=cache, cache_path=cache_path, trace_path=trace_path)
