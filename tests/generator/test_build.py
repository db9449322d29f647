"""`generate_tasks` bookkeeping across calls (one BuildStats filled by several draws, as the warm start does)."""

from generator.build import BuildStats, generate_tasks


def test_stats_add_up_over_calls_and_do_not_cut_later_draws_short(task_sb):
    stats = BuildStats(attempted=10_000, valid=7, seconds=5.0)  # as if earlier draws had used a large budget
    tasks = generate_tasks(4, level=1, seed=3, sb=task_sb, stats=stats)
    assert len(tasks) == 4  # its own attempt budget (50 n + 200), not what earlier calls spent
    assert stats.valid == 7 + 4 and stats.attempted >= 10_004 and stats.seconds > 5.0
