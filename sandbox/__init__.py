"""Run untrusted Python safely and fast.

    import sandbox
    with sandbox.open_sandbox(backend="process", workers=None, timeout_s=5.0, memory_mb=512, cache=True) as sb:
        r = sb.run("print(1 + 1)")              # ExecResult(status="ok", stdout="2\\n", ...)
        rs = sb.run_many([src1, src2])          # parallel over the workers, input order
        rep = sb.run_tests(solution, "f", [[1, 2], [3, 4]], expected=[3, 7])   # TestReport
        reps = sb.run_tests_many([dict(solution=..., entry_point=..., inputs=..., expected=...), ...])
        c = sb.run_check(module, "f", "def check(candidate):\n    assert candidate(2) == 4\n")  # "ok" = passed

Options of open_sandbox: output_limit= (bytes of stdout+stderr, default 1 MB), cache_path= (on-disk cache),
trace_path= (log of every run); the process backend takes isolate_user=, python= and confine= (default True: a
cgroup, a pid namespace and a root of their own for its programs, as root; docs/sandbox.md); the docker backend
takes its own (image=, ...) and is opened through
`sandbox.docker_backend.open_docker_backend(workers=, limits=, **options) -> sandbox.pool.Pool`.

Statuses (ExecResult.status, TestReport.status), each decided from what the worker's server observed (its own
deadlines and byte counts, the kernel's wait status and resource usage, the end-of-program report), never from
what the program printed or which exit code or signal it chose (details and the reasoning: docs/sandbox.md):
    ok            the program ran to its end: after its last statement the harness asked the server for a
                  nonce that exists nowhere else and said it back; an exit before that (sys.exit, exit(),
                  raise SystemExit, os._exit, exec, an exit code 0 included) is never "ok"
    error         an uncaught exception (a failed assert included), or an exit with any code before the end
                  (meta["reason"] says which, meta["exit_code"] the code)
    timeout       wall-clock timeout_s passed, or the CPU-seconds limit hit (CPU time used >= the limit); for
                  run_tests(..., clock="cpu"): the child used timeout_s of CPU time, or 10 x timeout_s (10 s at
                  least) of wall-clock time passed (a verdict independent of the machine's load)
    memory        an abnormal end after the program's resident memory reached half of memory_mb (kernel
                  accounting); a single allocation beyond the limit fails before it uses anything: that is a
                  MemoryError exception, "error"
    output_limit  stdout+stderr exceeded output_limit bytes (what came before is kept)
    killed        any other signal (a segfault, os.abort(), a signal the program sent itself), or the program
                  killed its worker
    sandbox_error our fault, never the program's: the child died before it read its job (so no program ran),
                  or a worker could not start or stopped answering
Every non-ok result has meta["reason"]. Per test (TestOutcome.status) the same, plus "not_run" (after
stop_on_failure, or after the module failed to load) and "unserializable" (the return value is not JSON); the
child may claim only "ok" (with its answer), "error", "unserializable" or "output_limit" for a test, all of which
fail it but "ok", and a claim never sets TestReport.status. TestReport.status is "ok" when the module loaded and
every test ran to an answer (right or wrong); a test that timed out, ran out of memory or crashed its process
makes it that status, and the remaining tests still run in a fresh child (so does the test after a MemoryError).

Grading without trusting the child: the solution is imported as module `solution` in a forked child, which
calls entry_point(*input) per test and sends each return value JSON-serialised on a pipe. The expected outputs
never enter the child (nor the worker); this process compares with `outputs_equal(output, expected)`: exactly
where the expectation is exact (an int expectation needs an int, strings, bools and None exactly), within
math.isclose(rel_tol=1e-6, abs_tol=1e-9) only where the expectation is a float (NaN == NaN). The worker accepts
only well-formed frames for exactly the next test; anything else fails every test of that child. So os._exit,
sys.exit, `__eq__` overrides, gc walks or forged frames cannot turn a failure into a pass: the best a program can
do is return values, which is what is graded. TestOutcome.duration_s is the server's clock (the previous answer,
or the load, to this answer; meta["load_s"] the load; TestReport.compute_s both), never a number the child sent.
With stop_on_failure the worker stops at the first test that raises; a wrong answer is found here, so later
tests may have run but are reported "not_run". record_calls=True gives, per test, the qualified names of
top-level solution functions/methods that ran while the test was called and its answer serialised
(sys.setprofile in the child: a claim, which incremental reuse trusts only for programs it can prove cannot
touch it, sandbox/incremental.py).

Trusted checks (`sb.run_check(module, entry_point, check_code)`, HumanEval's form: check_code defines
check(candidate)): the check code runs in a checker process, never next to the program; the module is loaded
in a process of its own that only answers calls (candidate(...) and any module function the check code names,
never one named like a builtin) with values; "ok" means check(entry_point) returned. Given the problem's prompt
(`run_check(..., prompt=PROMPT)`), the checker runs the prompt's own helper definitions itself and takes only the
entry point from the module, so an answer that redefines a helper the test uses cannot pass through it. The
program can fail its check (exit, die, raise, hang, kill the checker) but no byte it writes can pass it.
`selfplay.eval.evaluate.grade_humaneval` grades this way, with the prompt.

Isolation model of the process backend (details in sandbox/forkserver.py)
    - each worker is a small fork server (not a fork of the trainer) that preloads common modules; one forked
      child per program: a few ms of CPU instead of a 30-200 ms Python start-up;
    - the child gets its own session/process group, rlimits (address space, CPU seconds, processes, file
      size, open files, no core), a private working directory (also HOME and TMPDIR) removed afterwards, a
      scrubbed environment, stdin from /dev/null, capped stdout/stderr; after the program ends or times out the
      whole group gets SIGKILL and every escaped descendant (re-parented to the worker, a child subreaper) too;
    - as root (the usual case in containers and CI) each worker also has a cgroup (memory_mb and 64 tasks for
      the program's whole tree, not per process; over it the tree is ended: "memory"), a pid namespace (a
      program sees only its own processes and cannot address its server) and a root file tree of its own for
      its programs (the Python installation, system libraries, its private temporary dirs: no corpus, run
      folder, project checkout or host socket in reach); `confine=False` turns these three off;
    - as root (the usual case in containers and CI): children run under an unprivileged uid of their own
      per worker, so they cannot signal the worker, read other processes' environment, read files that are
      not world-readable (/etc/shadow, a home directory), write host files, or exceed the process limit
      together; each worker also has private tmpfs mounts over /tmp, /var/tmp and /dev/shm, wiped after every
      program, and hides closed directories that hold the Python installation (e.g. /root around a pyenv)
      behind an empty tmpfs with only the installation mounted back;
    - no network: each worker enters a new network namespace at start (as root, or through an unprivileged
      user namespace, where it also gets private tmpfs mounts). Fallback: where neither is allowed, programs
      run with the host network and every result says meta["network_isolated"] = False; use the docker
      backend there when that matters.
    - without root (meta["user_isolated"] = False) children run as the calling user: they could read that
      user's files and processes, RLIMIT_NPROC counts all of that user's processes, and a program that kills
      its worker can leave its own detached children running (until they exit). That mode is a research
      convenience for laptops, not a security boundary; the root and docker setups are.
    - a program that kills its worker gets "killed" and the worker is restarted transparently; a worker that
      stops answering is replaced and the run reported as "sandbox_error".
    - workers pre-fork: the next child is forked and isolated while the client is busy, so fork and set-up
      are off the latency path of a run (not off the CPU bill: a trivial program costs ~4-5 ms of CPU here,
      of which a bare fork+exit of the worker is ~2.7 ms on this VM).
sandbox.health() reports per worker what the last program left (work dirs, processes: both should be none).
Set iteration order is the same in every worker (PYTHONHASHSEED=0), so runs are reproducible across workers.
"""

from sandbox.api import (
    ExecResult,
    Sandbox,
    TestOutcome,
    TestReport,
    normalize,
    open_sandbox,
    outputs_equal,
    usable_cpus,
)
from sandbox.errors import SandboxConfigError, SandboxError, SandboxUnavailable
from sandbox.limits import Limits

__all__ = [
    "open_sandbox",
    "Sandbox",
    "ExecResult",
    "TestReport",
    "TestOutcome",
    "normalize",
    "outputs_equal",
    "SandboxError",
    "SandboxConfigError",
    "SandboxUnavailable",
    "Limits",
    "usable_cpus",
]
