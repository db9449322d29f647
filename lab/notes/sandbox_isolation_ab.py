"""Which host-side isolation costs the process backend its time? A/B on the HumanEval program set, 2 workers.

    python lab/notes/sandbox_isolation_ab.py

Each variant opens a pool of 2 fork servers and runs the bench's 478 programs (canonical + wrong variants) once per
round, 3 rounds interleaved; prints the median ms/program. Variants: the default (a uid per worker, a network
namespace, private tmp mounts), without each of those, without all three, and with Debian's PGO-built
/usr/bin/python3.11 as the servers' interpreter instead of this one (pyenv's 3.11.7, built --enable-shared without
PGO). Round 4, idle 2-core VM: default 3.63, no uid 3.89, no netns 3.59, no private tmp 3.77, none of the three
3.56, Debian's python 3.28 ms/program: the host-side isolation costs nothing measurable and the interpreter build
~10 %; neither explains the Docker backend's 2.80 ms in `selfplay bench sandbox` the same hour.
"""

import os
import statistics
import time

from sandbox.api import Limits, Sandbox
from sandbox.pool import LocalLauncher, Pool
from selfplay.bench.humaneval_set import load_programs

VARIANTS = {  # name: (isolate_user, forkserver.py options, interpreter)
    "default": (True, (), None),
    "no uid": (False, (), None),
    "no netns": (True, ("--no-netns",), None),
    "no private tmp": (True, ("--no-private-tmp",), None),
    "none of the three": (False, ("--no-netns", "--no-private-tmp"), None),
    "debian python3.11": (True, (), "/usr/bin/python3.11"),
}


def main() -> None:
    programs = [p.source for p in load_programs()]
    times: dict[str, list[float]] = {}
    for _ in range(3):
        for name, (isolate_user, extra, python) in VARIANTS.items():
            if python and not os.path.exists(python):
                continue
            pool = Pool(
                [LocalLauncher(i, isolate_user=isolate_user, extra_args=extra, python=python) for i in range(2)]
            )
            with Sandbox(
                pool, "process", Limits(timeout_s=3.0, memory_mb=512, output_limit=1_000_000), cache=False
            ) as sb:
                sb.run_many(["pass"] * 2)
                t0 = time.perf_counter()
                sb.run_many(programs)
                times.setdefault(name, []).append((time.perf_counter() - t0) / len(programs) * 1e3)
    for name, ms in times.items():
        print(f"{name:20s} {statistics.median(ms):.2f} ms/program (rounds: {', '.join(f'{x:.2f}' for x in ms)})")


if __name__ == "__main__":
    main()
