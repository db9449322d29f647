"""`generate_tasks`: bookkeeping across calls (one BuildStats filled by several draws, as the warm start does) and
wide literal ranges through the real validity checks."""

from generator.build import BuildConfig, BuildStats, generate_tasks
from generator.families.catalogue import MAPS, PREDICATES, find
from generator.families.values import input_etype


def test_stats_add_up_over_calls_and_do_not_cut_later_draws_short(task_sb):
    stats = BuildStats(attempted=10_000, valid=7, seconds=5.0)  # as if earlier draws had used a large budget
    tasks = generate_tasks(4, level=1, seed=3, sb=task_sb, stats=stats)
    assert len(tasks) == 4  # its own attempt budget (50 n + 200), not what earlier calls spent
    assert stats.valid == 7 + 4 and stats.attempted >= 10_004 and stats.seconds > 5.0


def test_wide_literal_tasks_pass_the_validity_checks(task_sb):
    """Wide constants make valid tasks (not mostly trivial ones that the checks reject), and some of them lie
    outside the narrow range, so the option reaches the tasks."""
    stats = BuildStats()
    tasks = generate_tasks(40, level=1, seed=5, sb=task_sb, cfg=BuildConfig(literals="wide"), stats=stats)
    assert len(tasks) == 40 and stats.valid / stats.attempted > 0.5, stats.rejections
    outside = 0
    for task in tasks:
        step = task.params["steps"][0]
        if step["kind"] in ("filter", "map"):
            expr = find(PREDICATES if step["kind"] == "filter" else MAPS, input_etype(task.params["input"]),
                        step["expr"])
            outside += any(v not in expr.args[k] for k, v in step["args"].items())
        outside += step["kind"] in ("take", "top_k") and step["k"] > 4
    assert outside >= 3, [t.params["steps"] for t in tasks]
