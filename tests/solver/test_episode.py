"""Solver episodes on a real process sandbox: single-turn grading, the hybrid multi-turn actions, rewards."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sandbox
from generator.schema import Task
from sandbox.incremental import IncrementalRunner
from solver.episode import CodeEpisode, merge_module, parse_action
from solver.prompts import answer_text
from solver.rewards import RewardConfig
from tests.sandbox.sandbox_testlib import forged_frames

REF = "def solve(xs):\n    return sorted(xs)\n"


@pytest.fixture(scope="module")
def sb():
    with sandbox.open_sandbox(workers=2, timeout_s=2.0) as box:
        yield box


@pytest.fixture(scope="module")
def task(sb):
    inputs = [[[3, 1, 2]], [[]], [[5, -1]], [[2, 2, 1]], [[9, 8, 7, 6]]]
    outputs = sb.run_tests(REF, "solve", inputs).outputs
    tests = [{"input": i, "output": o} for i, o in zip(inputs, outputs)]
    return Task(
        id="t",
        family="list_int",
        source="procedural",
        split="train",
        level=1,
        description="Sort.",
        entry_point="solve",
        signature="def solve(xs: list[int]) -> list[int]",
        reference_solution=REF,
        visible_tests=tests[:2],
        hidden_tests=tests[2:],
    )


def test_single_turn_right_and_wrong(sb, task):
    ep = CodeEpisode(task, sb)
    assert ep.act(answer_text(REF)) is None and ep.done
    assert ep.result.solved and ep.result.reward == 1.0 and ep.result.actions == ["write"]
    wrong = CodeEpisode(task, sb)
    wrong.act(answer_text("def solve(xs):\n    return xs\n"))
    assert not wrong.result.solved and wrong.result.reward == pytest.approx(0.0)
    assert wrong.result.hidden_passed < wrong.result.hidden_total


def test_penalties_are_flagged_and_weighted(sb, task):
    cfg = RewardConfig(syntax_error=0.5, empty_answer=0.25, banned_api=1.0)
    ep = CodeEpisode(task, sb, reward_cfg=cfg)
    ep.act("```python\ndef solve(xs):\n    return sorted(xs\n```")
    assert ep.result.terms["syntax_error"] == -1.0 and ep.result.reward == -0.5
    empty = CodeEpisode(task, sb, reward_cfg=cfg)
    empty.act("I do not know.")
    assert empty.result.terms["empty_answer"] == -1.0 and empty.result.reward == -0.25
    banned = CodeEpisode(task, sb, reward_cfg=cfg)
    banned.act(answer_text("import os\n\ndef solve(xs):\n    return sorted(xs)\n"))
    assert banned.result.terms["banned_api"] == -1.0 and banned.result.reward == pytest.approx(0.0)


def test_multi_turn_write_run_fix_submit(sb, task):
    ep = CodeEpisode(task, sb, max_turns=6, reward_cfg=RewardConfig(progress=0.5), runner=IncrementalRunner(sb))
    obs = ep.act("ACTION: write\n" + answer_text("def helper(x):\n    return x\n\ndef solve(xs):\n    return xs\n"))
    assert obs.startswith("Result:") and "module updated" in obs
    obs = ep.act("ACTION: run")
    assert "visible tests pass" in obs and "expected" in obs
    ep.act("ACTION: write\n" + answer_text("def solve(xs):\n    return sorted(helper(x) for x in xs)\n"))
    assert "def helper" in ep.module and "sorted(helper" in ep.module  # solve replaced, helper kept
    obs = ep.act("ACTION: run")
    assert obs.startswith("Result:\n2/2 visible tests pass")
    assert "defines solve: yes" in ep.act("ACTION: check")
    assert ep.act("ACTION: submit") is None
    r = ep.result
    assert r.solved and r.actions == ["write", "run", "write", "run", "check", "submit"]
    assert r.turns_to_success == 4 and r.visible_progress == [1, 2]
    assert r.terms["progress"] > 0 and r.reward == pytest.approx(1.0 + 0.5 * r.terms["progress"])


def test_turn_limit_submits(sb, task):
    ep = CodeEpisode(task, sb, max_turns=2)
    assert ep.act("ACTION: run") is not None
    assert ep.act("ACTION: write\n" + answer_text(REF)) is None
    assert ep.result.solved and len(ep.result.actions) == 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4), st.integers(0, 9))
def test_merge_replaces_by_name(names, k):
    module = "import math\n\n" + "\n\n".join(f"def {n}(x):\n    return {i}" for i, n in enumerate(sorted(set(names))))
    merged = merge_module(module, f"def {names[0]}(x):\n    return {k + 100}\n")
    assert merged.count(f"def {names[0]}(") == 1 and f"return {k + 100}" in merged
    assert merged.count("import math") == 1
    for other in set(names) - {names[0]}:
        assert f"def {other}(" in merged


def test_parse_action():
    assert parse_action("ACTION: run") == ("run", None)
    assert parse_action(answer_text(REF)) == ("write", REF)
    assert parse_action("nothing useful") == ("submit", None)


def test_efficiency_term_compares_runtimes_with_the_reference(sb, task):
    slow = "def solve(xs):\n    for _ in range(3_000_000):\n        pass\n    return sorted(xs)\n"
    cfg = RewardConfig(correctness=1.0, efficiency=1.0)
    fast_ep, slow_ep = CodeEpisode(task, sb, reward_cfg=cfg), CodeEpisode(task, sb, reward_cfg=cfg)
    fast_ep.act(answer_text(REF))
    slow_ep.act(answer_text(slow))
    assert slow_ep.result.solved and slow_ep.result.terms["efficiency"] < 0.5 < fast_ep.result.terms["efficiency"]


FORGED_FRAMES = forged_frames("solve", "sorted(args[0])", None)


def test_forged_result_frames_earn_no_efficiency(sb, task):
    # correct answers with forged durations written straight to the result pipe: the frames are refused, and the
    # efficiency term would be on the server's clock anyway (TestReport.compute_s)
    ep = CodeEpisode(task, sb, reward_cfg=RewardConfig(correctness=1.0, efficiency=1.0))
    ep.act(answer_text(FORGED_FRAMES))
    assert not ep.result.solved and ep.result.terms["efficiency"] == 0.0, ep.result
