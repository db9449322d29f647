"""The held-out evaluation of a run's solver, sharded over the ranks, where the loop calls it: at step 0 (the warm
start), every `train.eval_every` steps, at the last step, and on a resume that a stop left without its periodic
evaluation. `run` is the `SelfPlay` whose solver is measured (selfplay/train/loop.py); its results go to TensorBoard
(`eval/<split>/...`) and into `run.evals`, which the next checkpoint keeps.

A stop request is answered between two pieces of an evaluation (`heldout_rollouts`: 64 prompts each, 512 on an engine
of its own such as vLLM), every rank at the same piece (`run.stop.now` is the loop's stop agreement, a collective):
the evaluation is abandoned (`EvaluationStopped`), nothing of it is kept or logged, and the run that resumes measures
it first (`evaluate_missed`; step 0's by `checkpointing.evaluate_warm_start`)."""

from __future__ import annotations

import time

from selfplay.eval.evaluate import (
    BREAKDOWNS,
    ENGINE_PIECE,
    EVAL_BATCH,
    heldout_rollouts,
    heldout_scalars,
    heldout_tasks,
    merge_shards,
    shard_of,
    summarize_heldout,
)
from selfplay.rollout.episodes import prompt_options
from selfplay.runtime import distributed as D
from selfplay.runtime.checkpoint import preserved_rng


class EvaluationStopped(Exception):
    """A stop request answered within the evaluation of `step`: its results are dropped."""

    def __init__(self, step: int):
        super().__init__(f"a stop request abandoned step {step}'s evaluation")
        self.step = step


def evaluate(run, step: int) -> dict:
    """Held-out evaluation of the solver; rank 0 keeps the results. On several ranks each evaluates a shard of the
    tasks (`shard_of`: every world-th task) with its own engine and rank 0 merges them, so an evaluation takes
    1/world of the time and no rank idles in a collective while rank 0 works alone. Under ZeRO-3 every rank takes
    part in the whole evaluation instead (each generation step gathers the partitioned weights from all ranks, so
    the ranks must run the same steps). A shard's samples are drawn from `run.seed + rank`: on one rank, and for
    a given world size, the same weights give the same samples. Raises `EvaluationStopped` when a stop request
    comes before its last piece."""
    cfg = run.cfg
    zero3 = run.world > 1 and run.solver.zero3
    t0 = time.perf_counter()
    tasks = heldout_tasks(run.run_dir, cfg, run.sb, run.corpus) if run.main else None
    if run.world > 1:
        tasks = D.broadcast_object(tasks)
    assert tasks is not None
    order = [task for split_tasks in tasks.values() for task in split_tasks]
    mine = order if zero3 else [order[i] for i in shard_of(len(order), run.rank, run.world)]
    with preserved_rng():  # a run's last evaluation must not shift the draws of a run that continues it
        pieces = heldout_rollouts(
            run.solver,
            mine,
            run.sb,
            samples=cfg.eval.samples,
            max_turns=cfg.train.max_turns,
            reward_cfg=cfg.reward,
            temperature=cfg.eval.temperature,
            max_prompt_tokens=cfg.warmstart.max_len,
            prompt_kw=prompt_options(cfg),
            seed=cfg.run.seed + (0 if zero3 else run.rank),
            between=lambda: run.stop.now(f"a piece of step {step}'s evaluation"),
            pad_to=len(order) if zero3 else len(shard_of(len(order), 0, run.world)),  # rank 0's shard is the largest
            batch=EVAL_BATCH if run.solver.engine.on_trainer_model else ENGINE_PIECE,
        )
    if pieces is None:
        raise EvaluationStopped(step)
    episodes = pieces
    if run.world > 1 and not zero3:
        episodes = merge_shards(D.gather_objects(episodes), len(order), cfg.eval.samples)
    if not run.main:
        return {}
    results = summarize_heldout(tasks, *episodes, cfg.eval.samples)
    run.tb.scalars(heldout_scalars(results), step)
    run.evals[str(step)] = results
    line = ", ".join(f"{s} {r.get('pass@1_greedy', 0):.2f}" for s, r in results.items() if s not in BREAKDOWNS)
    shards = f", {run.world} shards" if run.world > 1 and not zero3 else ""
    run.log(f"eval step {step}: greedy pass@1 {line} ({time.perf_counter() - t0:.0f}s{shards})")
    return results


def evaluate_missed(run) -> bool:
    """The evaluation due at the step the run resumes at (periodic, or the last step's), when a stop came before
    it or within it: measured now, before the run goes on, and saved with the next checkpoint (the last step's:
    the loop saves that step again). Rank 0 decides (it holds the evaluations). Whether it ran; raises
    `EvaluationStopped` when a stop abandons it again."""
    t = run.cfg.train
    periodic = 0 < run.step < t.steps and t.eval_every and run.step % t.eval_every == 0
    due = run.learns and (periodic or (0 < run.step == t.steps)) and str(run.step) not in run.evals
    if not D.broadcast_object(bool(due) if run.main else None):
        return False
    run.log(f"step {run.step}: its evaluation was left for the resume by a stop; running it now")
    evaluate(run, run.step)
    return True
