"""A sharded held-out evaluation (selfplay.train.evaluation on several ranks): each rank takes every world-th task,
and merging the ranks' episodes gives back every task's greedy and sampled episodes in task order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from selfplay.eval.evaluate import merge_shards, shard_of


@given(st.integers(0, 60), st.integers(1, 8), st.integers(0, 4))
def test_shards_partition_the_tasks_and_merge_back_in_order(n, world, samples):
    shards = [shard_of(n, rank, world) for rank in range(world)]
    assert sorted(i for shard in shards for i in shard) == list(range(n))  # every task once
    assert max(map(len, shards)) - min(map(len, shards)) <= 1  # balanced
    episodes = [
        ([("greedy", i) for i in shard], [("sampled", i, j) for i in shard for j in range(samples)]) for shard in shards
    ]
    greedy, sampled = merge_shards(episodes, n, samples)
    assert greedy == [("greedy", i) for i in range(n)]
    assert sampled == [("sampled", i, j) for i in range(n) for j in range(samples)]


def test_one_rank_is_its_own_shard():
    assert shard_of(5, 0, 1) == [0, 1, 2, 3, 4]
    assert shard_of(5, 1, 2) == [1, 3]
    assert merge_shards([(["a", "b"], [])], 2, 3) == (["a", "b"], [])
