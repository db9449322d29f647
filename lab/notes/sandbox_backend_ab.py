"""Why is the Docker backend faster than the process backend when both run the same fork server? A/B on the
HumanEval program set (the bench's 164 canonical + wrong variants), 2 workers, 3 rounds interleaved, medians.

    python lab/notes/sandbox_backend_ab.py

Per variant: wall ms/program, the whole machine's CPU ms/program (from /proc/stat: client, servers, children,
kernel, Docker) and the client's own CPU ms/program. Variants: the process backend with this interpreter and with
Debian's /usr/bin/python3.11 (the one the sandbox image runs), the Docker backend with its default 1 CPU per
container and with 2, and the process backend with each server pinned to one core (what a 1-CPU container quota
comes closest to).

Round 5 (2-core VM, two PPO runs had just finished, load ~1 at the start; ms/program, median of 3 rounds):

    variant                       wall  machine CPU  client CPU
    process                       4.33         8.28        0.28
    process, debian python3.11    3.93         7.49        0.30
    process, servers pinned       4.08         8.12        0.28
    docker, 1 cpu each            3.59         6.99        0.32
    docker, 2 cpus each           3.64         7.01        0.33

The client's share is small (0.3 ms) and the same for both backends; the Docker backend spends 1.3 ms less of the
machine's CPU per program, and the interpreter accounts for 0.8 ms of it: the image runs Debian's python3.11
(PGO + LTO, libpython linked in) where the process backend runs this checkout's pyenv build (--enable-shared, no
PGO). The remaining 0.5 ms (7 %) is within what repeats of this A/B have moved. `open_sandbox("process",
python="/usr/bin/python3.11")` runs the servers on another interpreter (programs then see its site-packages).
"""

import os
import statistics
import time

from sandbox import open_sandbox
from sandbox.api import Limits, Sandbox
from sandbox.pool import LocalLauncher, Pool
from selfplay.bench.humaneval_set import load_programs

LIMITS = dict(timeout_s=3.0, memory_mb=512)


def machine_cpu_s() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def process(python=None, pin=False):
    def make():
        launchers = [LocalLauncher(i, python=python) for i in range(2)]
        pool = Pool(launchers)
        if pin:
            for i, launcher in enumerate(launchers):
                os.sched_setaffinity(launcher.pid, {i % os.cpu_count()})  # the server; its children inherit it
        return Sandbox(pool, "process", Limits(**LIMITS, output_limit=1_000_000), cache=False)

    return make


def docker(cpus):
    return lambda: open_sandbox("docker", workers=2, cache=False, cpus=cpus, **LIMITS)


VARIANTS = {
    "process": process(),
    "process, debian python3.11": process("/usr/bin/python3.11"),
    "process, servers pinned": process(pin=True),
    "docker, 1 cpu each": docker(1.0),
    "docker, 2 cpus each": docker(2.0),
}


def main() -> None:
    programs = [p.source for p in load_programs()]
    rows: dict[str, list[tuple[float, float, float]]] = {}
    for _ in range(3):
        for name, make in VARIANTS.items():
            with make() as sb:
                sb.run_many(["pass"] * 4)
                c0, m0, t0 = time.process_time(), machine_cpu_s(), time.perf_counter()
                sb.run_many(programs)
                wall, machine, client = (time.perf_counter() - t0, machine_cpu_s() - m0, time.process_time() - c0)
            n = len(programs) / 1e3
            rows.setdefault(name, []).append((wall / n, machine / n, client / n))
    print(f"{'variant':28s} {'wall':>8s} {'machine CPU':>12s} {'client CPU':>11s}   (ms/program, median of 3)")
    for name, r in rows.items():
        med = [statistics.median(x[k] for x in r) for k in range(3)]
        print(f"{name:28s} {med[0]:8.2f} {med[1]:12.2f} {med[2]:11.2f}   walls: {', '.join(f'{x[0]:.2f}' for x in r)}")


if __name__ == "__main__":
    main()
