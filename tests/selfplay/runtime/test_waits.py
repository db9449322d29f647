"""The bookkeeping of waits in collectives (selfplay.runtime.distributed.Waits): the longest wait since the loop last
asked, and a warning, once per collective, when a wait passes the stated bound (distributed.max_wait_fraction of
distributed.timeout_min)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from selfplay.runtime.config import DistributedConfig
from selfplay.runtime.distributed import Waits

NAMES = st.sampled_from(["barrier in a.save", "broadcast_object in b.draw", "gather_objects in c.stop"])


@given(st.lists(st.tuples(NAMES, st.floats(0, 4000, allow_nan=False)), max_size=30), st.floats(0.01, 1.0))
def test_the_longest_wait_is_kept_until_taken_and_each_collective_past_the_bound_is_warned_of_once(waits, fraction):
    lines: list[str] = []
    w = Waits(fraction, 30, warn=lines.append)
    for name, seconds in waits:
        w.record(name, seconds)
    longest = max(waits, key=lambda x: x[1], default=("", 0.0))
    assert w.take() == (longest if longest[1] > 0 else ("", 0.0))
    assert w.take() == ("", 0.0)  # a fresh start
    over = list(dict.fromkeys(name for name, seconds in waits if seconds > fraction * 30 * 60))
    assert [line.split(" s in ")[1].split(", more than")[0] for line in lines] == over
    assert all("distributed.max_wait_fraction" in line and "distributed.timeout_min" in line for line in lines)


def test_a_timed_collective_is_named_by_its_kind_and_its_caller():
    w = Waits(0.5, 30)

    def save_checkpoint():
        with w.timed("barrier"):
            pass

    save_checkpoint()
    name, seconds = w.take()
    assert name == f"barrier in {__name__}.save_checkpoint"


def test_the_stated_bound_is_half_the_collective_timeout_by_default():
    cfg = DistributedConfig()
    assert cfg.max_wait_fraction == 0.5
    w = Waits(cfg.max_wait_fraction, cfg.timeout_min)
    assert w.limit_s == 0.5 * 30 * 60
