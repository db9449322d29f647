"""A sharded held-out evaluation (selfplay.train.evaluation on several ranks): each rank takes every world-th task,
and merging the ranks' episodes gives back every task's greedy and sampled episodes in task order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from selfplay.eval.evaluate import ENGINE_PIECE, EVAL_BATCH, eval_pieces, merge_shards, shard_of


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


@given(st.integers(0, 1200), st.integers(0, 9), st.integers(1, 8), st.sampled_from([EVAL_BATCH, ENGINE_PIECE]))
def test_evaluation_pieces_cover_the_tasks_in_order_and_fill_whole_batches(n, samples, world, batch):
    """The pieces an evaluation runs (and between which it answers a stop): every task once, in order, greedy in
    batches of EVAL_BATCH, sampled in pieces whose samples fill whole batches (so that single-turn episodes are
    sampled in the batches one call over every task would); every rank of a sharded evaluation, padded to rank 0's
    shard, has as many pieces (it asks for the stop as often)."""
    greedy, sampled = eval_pieces(n, samples, batch)
    assert [i for part in greedy for i in part] == list(range(n))
    assert all(len(part) == batch for part in greedy[:-1])
    assert [i for part in sampled for i in part] == (list(range(n)) if samples > 1 else [])
    assert all(len(part) * samples % batch == 0 for part in sampled[:-1])
    most = len(shard_of(n, 0, world))
    counts = {tuple(map(len, eval_pieces(max(most, len(shard_of(n, r, world))), samples, batch))) for r in range(world)}
    assert len(counts) == 1 and most == max(len(shard_of(n, r, world)) for r in range(world))
    whole = eval_pieces(n, samples, 0)  # without a stop to answer: one piece each
    assert whole == ([range(n)] if n else [], [range(n)] if n and samples > 1 else [])
