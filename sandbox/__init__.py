"""Run untrusted Python safely and fast.

    import sandbox
    with sandbox.open_sandbox(backend="process", workers=None, timeout_s=5.0, memory_mb=512, cache=True) as sb:
        r = sb.run("print(1 + 1)")              # ExecResult(status="ok", stdout="2\\n", ...)
        rs = sb.run_many([src1, src2])          # parallel over the workers, input order
        rep = sb.run_tests(solution, "f", [[1, 2], [3, 4]], expected=[3, 7])   # TestReport
        reps = sb.run_tests_many([dict(solution=..., entry_point=..., inputs=..., expected=...), ...])

Options of open_sandbox: output_limit= (bytes of stdout+stderr, default 1 MB), cache_path= (on-disk cache),
trace_path= (log of every run); the docker backend takes its own (image=, ...) and is opened through
`sandbox.docker_backend.open_docker_backend(workers=, limits=, **options) -> sandbox.pool.Pool`.

Statuses (ExecResult.status, TestReport.status)
    ok            the program finished without an exception (sys.exit(0) included)
    error         an exception (a failed assert included) or a non-zero exit code
    timeout       wall-clock timeout_s passed, or the CPU-seconds limit hit
    memory        MemoryError (the address-space limit memory_mb was hit)
    output_limit  stdout+stderr exceeded output_limit bytes (what came before is kept)
    killed        any other abnormal end: a signal (segfault), or the program killed its worker
    sandbox_error our fault, never the program's (a worker that could not start or stopped answering)
Per test (TestOutcome.status) the same, plus "not_run" (after stop_on_failure, or after the module failed to
load) and "unserializable" (the return value is not JSON). TestReport.status is "ok" when the module loaded and
every test ran to an answer (right or wrong); a test that timed out, ran out of memory or crashed its process
makes it that status, and the remaining tests still run in a fresh child.

Grading without trusting the child: the solution is imported as module `solution` in a forked child, which
calls entry_point(*input) per test and sends each return value JSON-serialised on a pipe. The expected outputs
never enter the child (nor the worker); this process compares `normalize(output)` with `normalize(expected)`
using `outputs_equal` (floats: math.isclose(rel_tol=1e-6, abs_tol=1e-9), NaN == NaN, bool only equals bool,
the rest exactly). The worker accepts only well-formed frames for exactly the next test; anything else fails
every test of that child. So os._exit, sys.exit, `__eq__` overrides, gc walks or forged frames cannot turn a
failure into a pass: the best a program can do is return values, which is what is graded. With
stop_on_failure the worker stops at the first test that raises; a wrong answer is found here, so later tests
may have run but are reported "not_run". record_calls=True gives, per test, the qualified names of top-level
solution functions/methods that were called (sys.setprofile), for incremental re-execution.

Isolation model of the process backend (details in sandbox/forkserver.py)
    - each worker is a small fork server (not a fork of the trainer) that preloads common modules; one forked
      child per program: a few ms of CPU instead of a 30-200 ms Python start-up;
    - the child gets its own session/process group, rlimits (address space, CPU seconds, processes, file
      size, open files, no core), a private working directory (also HOME and TMPDIR) removed afterwards, a
      scrubbed environment, stdin from /dev/null, capped stdout/stderr; after the program ends or times out the
      whole group gets SIGKILL and every escaped descendant (re-parented to the worker, a child subreaper) too;
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

from sandbox.api import (ExecResult, Sandbox, TestOutcome, TestReport, normalize, open_sandbox,
                         outputs_equal)
from sandbox.errors import SandboxConfigError, SandboxError, SandboxUnavailable
from sandbox.limits import Limits

__all__ = ["open_sandbox", "Sandbox", "ExecResult", "TestReport", "TestOutcome", "normalize", "outputs_equal",
           "SandboxError", "SandboxConfigError", "SandboxUnavailable", "Limits"]
