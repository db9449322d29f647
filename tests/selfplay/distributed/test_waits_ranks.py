"""A wait in a collective on 2 CPU ranks (torchrun, gloo): rank 1 works alone (a sleep) before a barrier, rank 0
waits in it; the wait is recorded on rank 0 with the collective's name, and warned of, naming the collective and
the config key, only when it passes the stated bound (distributed.max_wait_fraction of distributed.timeout_min)."""

from __future__ import annotations

import re

import pytest

from tests.selfplay.distributed.test_distributed import two_ranks

pytestmark = pytest.mark.distributed

# round 1 under the default bound (half of a 1-minute timeout: 30 s), round 2 under a small one (0.6 s); in each,
# rank 1 sleeps 3 s before the barrier of `checkpoint_write`
WAITING_RANKS = """
import time
from selfplay.runtime import distributed as D

info = D.init_distributed("gloo", timeout_min=1)

def checkpoint_write(rank):
    if rank == 1:
        time.sleep(3)
    D.barrier()

for round, fraction in ((1, 0.5), (2, 0.01)):
    D.WAITS.bound(fraction, 1)
    checkpoint_write(info.rank)
    name, seconds = D.WAITS.take()
    print(f"[test] round {round} rank {info.rank} longest wait in {name}: {seconds:.2f} s", flush=True)
    print(f"[test] round {round} rank {info.rank} done", flush=True)
    D.barrier()
    D.WAITS.take()
"""


def test_a_rank_working_alone_before_a_barrier_shows_as_the_other_s_wait_and_is_warned_of_past_the_bound(tmp_path):
    script = tmp_path / "waiting_ranks.py"
    script.write_text(WAITING_RANKS)
    out = two_ranks([str(script)], timeout=300)
    # the two ranks share one stdout, so one rank's line can land inside the other's: read the records, not lines
    waited = re.findall(r"\[test\] round (\d) rank (\d) longest wait in (.+?): ([\d.]+) s", out)
    name = "barrier in __main__.checkpoint_write"
    assert sorted((r, k) for r, k, _, _ in waited) == [("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")], out[-3000:]
    assert all(n == name for _, _, n, _ in waited), out[-3000:]
    warned = re.findall(r"\[selfplay\] rank \d waited .+?\(warned once per collective\)", out)
    warnings = [w for w in warned if name in w]
    # the default bound (30 s) is not reached (round 1 would name 0.5); the small one (0.6 s) is, on rank 0, once
    assert len(warnings) == 1, out[-3000:]
    assert warnings[0].startswith("[selfplay] rank 0 waited")
    assert "distributed.max_wait_fraction (0.01)" in warnings[0] and "distributed.timeout_min (1 min)" in warnings[0]
