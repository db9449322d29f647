"""The held-out evaluation of a run's solver, where the loop calls it: at step 0 (the warm start), every
`train.eval_every` steps, at the last step, and on a resume that a stop left without its periodic evaluation.
`run` is the `SelfPlay` whose solver is measured (selfplay/train/loop.py); its results go to TensorBoard
(`eval/<split>/...`) and into `run.evals`, which the next checkpoint keeps."""

from __future__ import annotations

import time

from selfplay.eval.evaluate import BREAKDOWNS, evaluate_heldout, heldout_scalars, heldout_tasks
from selfplay.rollout.episodes import prompt_options
from selfplay.runtime import distributed as D
from selfplay.runtime.checkpoint import preserved_rng


def evaluate(run, step: int) -> dict:
    """Held-out evaluation by rank 0; under ZeRO-3 every rank takes part (each generation step gathers the
    partitioned weights from all ranks) and rank 0 keeps the results."""
    cfg = run.cfg
    everyone = run.world > 1 and run.solver.zero3
    if not (run.main or everyone):
        return {}
    t0 = time.perf_counter()
    tasks = heldout_tasks(run.run_dir, cfg, run.sb, run.corpus) if run.main else None
    if everyone:
        tasks = D.broadcast_object(tasks)
    with preserved_rng():  # a run's last evaluation must not shift the draws of a run that continues it
        results = evaluate_heldout(
            run.solver,
            tasks,
            run.sb,
            samples=cfg.eval.samples,
            max_turns=cfg.train.max_turns,
            reward_cfg=cfg.reward,
            temperature=cfg.eval.temperature,
            max_prompt_tokens=cfg.warmstart.max_len,
            prompt_kw=prompt_options(cfg),
            seed=cfg.run.seed,
        )
    if not run.main:
        return {}
    run.tb.scalars(heldout_scalars(results), step)
    run.evals[str(step)] = results
    line = ", ".join(f"{s} {r.get('pass@1_greedy', 0):.2f}" for s, r in results.items() if s not in BREAKDOWNS)
    run.log(f"eval step {step}: greedy pass@1 {line} ({time.perf_counter() - t0:.0f}s)")
    return results


def evaluate_missed(run) -> None:
    """The periodic evaluation of the step the run resumes at, when a stop came before it: measured now, before
    the run goes on, and saved with the next checkpoint. Rank 0 decides (it holds the evaluations)."""
    t = run.cfg.train
    due = (
        run.learns
        and 0 < run.step < t.steps
        and t.eval_every
        and run.step % t.eval_every == 0
        and str(run.step) not in run.evals
    )
    if D.broadcast_object(bool(due) if run.main else None):
        run.log(f"step {run.step}: its evaluation was left for the resume by a stop; running it now")
        evaluate(run, run.step)
