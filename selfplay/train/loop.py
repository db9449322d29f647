"""The self-play loop: a generator and a solver co-evolve, kept out of collapse by the difficulty mixer.

    selfplay train                                   # configs/tiny.yaml on a CPU, from nothing
    selfplay train configs/smoke.yaml run.dir=/tmp/s # the 2-3 minute version the tests use
    torchrun --nproc_per_node 2 -m selfplay train configs/smoke.yaml distributed.deepspeed=true

One iteration (all sizes in the `train:` config section):

1. generator proposals   rank 0 picks K reference tasks per proposal near the solver's frontier; each rank samples
                         its share of the P proposals, parses and validates them in the sandbox;
2. solver batch          rank 0's mixer splits `solver_tasks` over fresh generator tasks, procedural tasks (at its
                         current level) and replayed corpus tasks; every valid proposal is attempted, those beyond
                         the generator share only to measure their solve rate;
3. rollouts              k episodes per task, sampled in batches, graded in the sandbox in parallel;
4. rewards               solver: the hybrid reward (correctness by default); generator: learnability 1 - p of its
                         valid tasks, fixed penalties for invalid/unparsable ones, a repetition penalty;
5. PPO updates           solver, then generator (same PPO core, `ppo/solver/...`, `ppo/generator/...`);
6. corpus and mixer      new tasks and measured difficulties are written to the corpus at the end of the
                         iteration (so iteration N sees every task of iterations < N, however the run was
                         checkpointed and resumed); the mixer observes solve rate, validity, diversity and KL and
                         adapts;
7. logs                  TensorBoard scalars (tags: docs/architecture.md), sample proposals and solutions as text.

Modes (`train.mode`): `selfplay` (all of the above), `curriculum` (no generator: procedural tasks on a fixed level
schedule that reaches the top level within `train.steps`, `sources.curriculum_level`), `uniform` (no generator:
procedural tasks, each at a level drawn uniformly from the mixer's range), `warmstart` (no RL at all: the
warm-started solver is only evaluated) — the baselines of the research claim — and `fixed` (no generator: PPO
on one fixed set of `fixed_tasks` corpus tasks at `fixed_levels`, chosen once and kept in RUN_DIR/fixed_tasks.jsonl,
`solver_tasks` of them per iteration in a seeded order that depends only on the step; the plain RL setting of
"train on these problems, measure on held-out ones"). How each mode chooses the solver's tasks is one small source
in selfplay/train/sources.py (`draw`, `observe`, `metrics`, `state_dict`); the loop asks `self.source`.

Checkpoints (`RUN_DIR/checkpoints/step_N/`, `latest` written last): both agents, optimiser and trainer states,
the mixer, RNG states, counters and the corpus size. Starting again on a run folder that holds a checkpoint resumes
from it bit for bit on one process (tests/selfplay/train/test_resume_exact.py): held-out evaluation leaves the RNGs as
it found them, so the evaluation at the end of a run does not shift a continued run's draws. A run killed between
checkpoints leaves the corpus rows of its lost iterations (the corpus is append-only); resuming it is then not
exact, and says so. `train.steps` is the total, so raising it continues a finished run. A stop
request (SIGUSR1/SIGTERM, or the file named by $SELFPLAY_STOP_FILE, as slurm/selfplay.sh does on preemption)
finishes the current iteration, writes a checkpoint and exits 0.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from generator.formats import FORMATS
from generator.schema import Task
from selfplay.data.corpus import Corpus, CorpusError, check_heldout
from selfplay.eval.evaluate import BREAKDOWNS, evaluate_heldout, heldout_scalars, heldout_tasks, suite_size_note
from selfplay.eval.stats import paired_delta
from selfplay.models.agent import LMAgent
from selfplay.rl import core as rl
from selfplay.rollout.engine import engine_metrics
from selfplay.rollout.episodes import ProposalRollout, SolverRollout, prompt_options, solve_rates, solver_rollouts
from selfplay.runtime import distributed as D
from selfplay.runtime import seeds
from selfplay.runtime.checkpoint import (CheckpointManager, code_versions, preserved_rng, rng_state,
                                         set_rng_state)
from selfplay.runtime.config import to_dict
from selfplay.runtime.paths import RunPaths
from selfplay.runtime.tb import TBLogger
from selfplay.train.metrics import Costs, SolverRound, iteration_metrics, iteration_stats
from selfplay.train.mixer import IterationStats, Mixer
from selfplay.train.proposals import ProposalRound, SharedProposal, choose_references, propose, reward_proposals
from selfplay.train.setup import (StopRequest, check_shared_storage, load_agent, open_run_sandbox, progress,
                                  quiet_transformers, reserve_heldout, sandbox_workers, seed_global_generators,
                                  validate_config, wait_for_checkpoint)
from selfplay.train.solver_replay import SolverReplay
from selfplay.train.sources import Draw, make_source
from selfplay.train.warmstart import level_counts, warm_start
from solver.rewards import overlong_penalties

# per-iteration figures kept in the run's history (checkpointed) and summed up at the end: history key -> scalar
HISTORY = {"solve_rate": "solver/pass_rate", "validity": "generator/validity_rate", "level": "mixer/level",
           "parse_rate": "generator/parse_rate", "generator_in_band": "generator/in_band_rate",
           "generator_never_solved": "generator/never_solved_rate",
           "generator_always_solved": "generator/always_solved_rate",
           "solver_in_band": "solver/in_band_rate", "generator_share": "mixer/share/generator",
           "generator_batch_share": "solver/share/generator", "generator_reward": "generator/reward_mean",
           "alarm_solver_collapse": "mixer/alarm/solver_collapse",
           "alarm_generator_diversity": "mixer/alarm/generator_diversity", "alarm_kl_blowup": "mixer/alarm/kl_blowup"}
COLLAPSE_ALARMS = ("alarm_solver_collapse", "alarm_generator_diversity", "alarm_kl_blowup")  # not the trust alarms
SUMMARY_WINDOW = 10  # the closing summary compares the first and the last this many iterations
# what a run has spent, summed over its iterations and ranks (`compute/` scalars, the checkpoint's and the summary's
# `compute`): the solver episodes its PPO batches held, every solver episode sampled (those measuring proposals
# beyond the generator's share too) and their policy-sampled tokens, the proposals made and the tokens of the
# generator's kept answers (none with generator.source=random_edits; answers struck by the novelty screen and drawn
# again are not counted), and the programs the sandbox executed (cache hits left out; held-out evaluation too)
COMPUTE = ("ppo_episodes", "solver_episodes", "solver_tokens", "generator_proposals", "generator_tokens",
           "sandbox_execs")


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(flatten(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


class SelfPlay:
    """One run: both agents, the corpus, the mixer and its task source, the sandbox, checkpoints and logs. `run`
    iterates to `train.steps`; `iteration` is one pass through the stages of the module's docstring."""

    _validate = staticmethod(validate_config)  # the config checks a run makes before it builds anything

    def __init__(self, cfg, *, log=None):
        quiet_transformers()
        if cfg.run.torch_threads > 0:
            torch.set_num_threads(cfg.run.torch_threads)
        self.cfg = cfg
        validate_config(cfg)
        self.info = D.init_distributed(cfg.distributed.backend, cfg.distributed.timeout_min)
        self.rank, self.world = self.info.rank, self.info.world_size
        self.main = self.info.is_main
        seed_global_generators(cfg.run.seed, self.rank)
        self.log = log or (lambda msg: say(f"[selfplay] {msg}") if self.main else None)
        self.run_dir = Path(cfg.run.dir)
        check_shared_storage(self.run_dir, self.rank)
        self.ckpt = CheckpointManager(self.run_dir, cfg.run.keep_last)
        self.tb = TBLogger(self.run_dir, enabled=self.main)
        self.mixer = Mixer(cfg.mixer, seed=cfg.run.seed)
        self.replay = SolverReplay(cfg, rank=self.rank, world=self.world, log=self.log)  # what PPO replays
        self.rng = random.Random(cfg.run.seed)
        self.step = 0
        self.pending_tasks: list[Task] = []  # corpus writes queued until the end of the iteration
        self.pending_difficulty: list[tuple[str, float, int, int]] = []
        self.history: list[dict] = []  # per-iteration summary (also in TensorBoard)
        self.evals: dict[str, dict] = {}  # step -> held-out results
        self.stop = StopRequest(self.main, self.log)
        self.t_start = time.perf_counter()
        self.warmstart_s: float | None = None  # the warm start's wall time (in elapsed_s too)
        self.code = code_versions(None)  # the code versions this run has run under (checkpoint's "code")
        self.solver: LMAgent | None = None
        self.generator: LMAgent | None = None
        workers = sandbox_workers(cfg)
        self.sb = open_run_sandbox(cfg, workers)
        self.corpus = Corpus(self.run_dir)
        # how the solver's tasks are chosen (selfplay/train/sources.py); rank 0 draws them
        self.source = make_source(cfg, mixer=self.mixer, sb=self.sb, corpus=self.corpus, run_dir=self.run_dir,
                                  log=self.log)
        self.generates = cfg.train.mode == "selfplay"  # proposals are made (by the generator or random edits)
        # the generator samples the proposals (generator.source=model) and learns from their rewards
        # (train.train_generator=false: held at its warm start, the frozen-generator baseline)
        self.samples_generator = self.generates and cfg.generator.source == "model"
        self.generator_learns = self.samples_generator and cfg.train.train_generator
        self.compute = dict.fromkeys(COMPUTE, 0)  # what the run has spent so far (checkpointed)
        # the solver learns (warmstart mode: evaluated only; train.train_solver=false: held at its warm start)
        self.learns = cfg.train.mode != "warmstart" and cfg.train.train_solver
        if self.world > 1:  # every rank says it is here (the only line ranks other than 0 print)
            print(f"[selfplay] rank {self.rank} of {self.world} on {os.uname().nodename} ready "
                  f"({workers} sandbox workers)", flush=True)

    # ---- the run --------------------------------------------------------------------------------------------
    def run(self) -> dict:
        """Resume (or warm-start), iterate to `train.steps` or a stop request; the closing summary."""
        self.stop.install()
        self.setup()
        self._evaluate_missed()
        if self.step >= self.cfg.train.steps:
            self.log(f"run already at step {self.step} of {self.cfg.train.steps}: nothing to do (raise train.steps "
                     "to continue)")
            return self.summary()
        if self.main and RunPaths(self.run_dir).heldout.exists():  # a split eval.splits names that the run's
            drawn = heldout_tasks(self.run_dir, self.cfg, self.sb, self.corpus)  # held-out file lacks stops here
            note = suite_size_note(drawn, self.cfg)
            if note:
                self.log(note)
        stopped = self._iterate()
        summary = self.summary()
        if self.main and not stopped:
            print_summary(summary)
            RunPaths(self.run_dir).summary.write_text(json.dumps(summary, indent=2, sort_keys=True))
        summary["stopped"] = stopped
        return summary

    def _iterate(self) -> bool:
        """Iterations, each followed by its evaluation and checkpoint where due; True when a stop request ended
        them."""
        t = self.cfg.train
        bar = progress(total=t.steps, initial=self.step, desc=f"self-play ({t.mode})") if self.main else None
        stopped, first = False, True
        while self.step < t.steps:
            self.step += 1
            t0 = time.perf_counter()
            metrics = self.iteration()
            if first and self.main and self.step < t.steps:  # what the rest will take, once one iteration is known
                self.log(run_estimate(time.perf_counter() - t0, t.steps - self.step, t.eval_every))
            first = False
            self.history.append(history_entry(self.step, metrics))
            if bar:
                bar.update(1)
                bar.set_postfix(pass_rate=f"{metrics['solver/pass_rate']:.2f}",
                                validity=f"{metrics.get('generator/validity_rate', float('nan')):.2f}")
            # a stop is answered before the step's periodic evaluation, so that its checkpoint is written within the
            # signal's grace period; the evaluation it skipped runs when the run resumes (_evaluate_missed)
            stopped = self.stop.now()
            self._evaluate_and_save(stopped)
            if stopped:
                self.log(f"stop requested: checkpoint step_{self.step} written, exiting")
                break
        if bar:
            bar.close()
        return stopped

    def _evaluate_and_save(self, stopped: bool) -> None:
        """After an iteration: the held-out evaluation and the checkpoint, where due."""
        t, step = self.cfg.train, self.step
        last = step >= t.steps
        # a solver that does not learn is the one step 0 evaluated: its figures are those, not measured again
        if self.learns and t.eval_every and step % t.eval_every == 0 and not last and not stopped:
            self._evaluate(step)
        if last and self.learns:
            self._evaluate(step)
        elif last and self.main:
            self.log("the solver was held at its warm start: its held-out figures are step 0's, not measured again")
        if stopped or last or step % t.checkpoint_every == 0:
            self._save(step)

    # ---- one iteration ------------------------------------------------------------------------------------
    def iteration(self) -> dict:
        """One iteration, its stages in the order of the module's docstring; returns its scalars."""
        step, timing = self.step, Counter()
        sandbox0, generator_tokens0 = self.sb.stats(), self._generator_tokens()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()  # perf/gpu_peak_mem_gb is this iteration's peak
        # 1. generator proposals: this rank's, and what every rank learns of everyone's
        mine, groups, shared = self._propose(step, timing)
        valid = [Task.from_dict(x.task) for part in shared for x in part if x.task is not None]
        # 2. solver batch, drawn by the task source; 3. rollouts, graded
        plan = self._solver_batch(valid, timing)
        rollouts, train, rates = self._attempt(plan, timing)
        # 4. rewards of every proposal; this rank's for its generator update
        proposals = reward_proposals([x for part in shared for x in part], valid, rates,
                                     self.mixer.repetition_weight, self.cfg.generator.reward)
        start = sum(len(part) for part in shared[: self.rank])
        # 5. PPO updates; 6. corpus and mixer
        updates = self._update(train, rates, mine, proposals.rewards[start: start + len(mine)], timing)
        stats = self._observe(groups, proposals, plan, train, rates, kl=updates.get("ppo/solver/kl"))
        # 7. logs: the figures that need every rank first, in this order on each, then the scalars
        solver = self._solver_round(plan, train, rates)
        source = self.source.metrics(step)  # mixer/... in self-play, the schedule's level in curriculum
        costs = self._costs(timing, rollouts, train, len(mine), sandbox0, generator_tokens0)
        metrics = iteration_metrics(updates, stats, solver, proposals if self.generates else None, source, costs)
        self._log(step, metrics, mine, train)
        return metrics

    def _propose(self, step: int, timing: Counter) -> tuple[list[ProposalRollout], list[list[Task]],
                                                            list[list[SharedProposal]]]:
        """1. Rank 0 picks the references of every proposal; this rank makes its share of the proposals, parsed and
        validated. Returns them, every proposal's references, and what every rank learns of every rank's."""
        mine, groups = [], []
        if self.generates:
            t0 = time.perf_counter()
            n = self.cfg.train.proposals
            groups = D.broadcast_object(choose_references(self.cfg, self.corpus, self.mixer, step, n)
                                        if self.main else None)
            mine = propose(self.cfg, self.generator, groups[self.rank:: self.world], self.sb, self.corpus, self.mixer,
                           step=step, rank=self.rank)
            timing["generator_s"] += time.perf_counter() - t0
        return mine, groups, D.gather_objects([SharedProposal.of(p) for p in mine])

    def _solver_batch(self, valid_generator: list[Task], timing: Counter) -> Draw:
        """2. Rank 0's task source draws the solver batch (tasks for PPO, extra generator tasks to measure), topped
        up from a replay pool when it drew short, and every rank receives it; new corpus tasks it made are queued."""
        t0, n, plan = time.perf_counter(), self.cfg.train.solver_tasks, None
        if self.main:
            replay_pool = self.corpus.query(split="train", order="random", limit=1024,
                                            seed=seeds.derive(self.cfg.run.seed, "replay-pool", self.step))
            drawn = self.source.draw(n, self.rng, step=self.step, offered=valid_generator, pool=replay_pool)
            self.pending_tasks += drawn.queued
            batch = list(drawn.tasks)
            while len(batch) < n:  # too few valid procedural tasks at a level: top up from the pool
                batch.append(replay_pool[len(batch) % len(replay_pool)] if replay_pool else batch[0])
            plan = Draw(batch[:n], drawn.counts, extra=drawn.extra, new_ids=drawn.new_ids)
        plan = D.broadcast_object(plan)
        timing["plan_s"] += time.perf_counter() - t0
        return plan

    def _attempt(self, plan: Draw, timing: Counter) -> tuple[list[SolverRollout], list[SolverRollout],
                                                              dict[str, float]]:
        """3. k episodes on each of this rank's share of the batch and of the extra tasks, graded in the sandbox.
        Returns them all, the PPO share of them, and every rank's solve rate per task."""
        t = self.cfg.train
        per_rank = len(plan.tasks) // self.world
        my_batch = plan.tasks[self.rank * per_rank: (self.rank + 1) * per_rank]
        my_extra = plan.extra[self.rank:: self.world]
        t0 = time.perf_counter()
        rollouts = solver_rollouts(self.solver, my_batch + my_extra, t.samples_per_task, self.sb,
                                   max_turns=t.max_turns, reward_cfg=self.cfg.reward,
                                   max_prompt_tokens=self.cfg.warmstart.max_len, prompt_kw=prompt_options(self.cfg))
        timing["rollout_s"] += time.perf_counter() - t0
        rates = {}
        for part in D.gather_objects(solve_rates(rollouts)):
            rates.update(part)
        return rollouts, rollouts[: len(my_batch) * t.samples_per_task], rates

    def _update(self, train: list[SolverRollout], rates: dict[str, float], proposals: list[ProposalRollout],
                proposal_rewards: list[float], timing: Counter) -> dict[str, float]:
        """5. The PPO updates, solver then generator; their figures (`ppo/...`, `replay/size`)."""
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        lr_scale = self.mixer.lr_scale
        if self.learns:
            self._update_solver(train, rates, lr_scale, metrics)
            timing["solver_update_s"] = time.perf_counter() - t0
        if self.generator_learns and proposals:
            # train.generator_advantage=rloo_batch: this rank's proposals are one group, each one's baseline the
            # mean return of the others (different prompts, one policy: the baseline leaves the gradient unbiased)
            one_group = [0] * len(proposals) if self.cfg.train.generator_advantage == "rloo_batch" else None
            stats = self.generator.update([p.answer for p in proposals], proposal_rewards, lr_scale=lr_scale,
                                          groups=one_group)
            metrics.update({f"ppo/generator/{k}": D.all_reduce_mean(v) for k, v in stats.items()})
        timing["update_s"] += time.perf_counter() - t0
        return metrics

    def _update_solver(self, train: list[SolverRollout], rates: dict[str, float], lr_scale: float,
                       metrics: dict) -> None:
        """The solver's PPO update on its episodes (and a replay draw), then its successes into the replay buffer."""
        cfg = self.cfg
        update_rollouts = self._update_rollouts(train, metrics)
        replay = self.replay.draw(self.solver, self.corpus, self.step)
        if update_rollouts:  # with ppo.skip_uniform_groups, no task may have had answers that scored differently
            # reward.overlong_cache: DAPO's soft length penalty
            overlong = overlong_penalties([r.mask for r in update_rollouts], cfg.ppo.max_new_tokens,
                                          cfg.reward.overlong_cache)
            rewards = [r.reward + o for r, o in zip(update_rollouts, overlong)]
            if cfg.ppo.null_reward:  # the control: the same episodes and steps, no reward
                rewards = [0.0] * len(rewards)
            stats = self.solver.update(update_rollouts, rewards,
                                       lr_scale=lr_scale, masks=[r.mask for r in update_rollouts], replay=replay,
                                       groups=[r.task.id for r in update_rollouts])
            if cfg.reward.overlong_cache:
                stats["overlong_penalty"] = sum(overlong) / len(overlong)
            metrics.update({f"ppo/solver/{k}": D.all_reduce_mean(v) for k, v in stats.items()})
        metrics.update(self.replay.add(train, rates, self.step))

    def _update_rollouts(self, rollouts, metrics: dict) -> list:
        """The solver episodes the PPO update trains on: all of them, or with `ppo.skip_uniform_groups` only the
        answers to tasks whose answers scored differently (rl.mixed_groups). Every rank keeps the same number of
        tasks, the fewest any rank has, so that all ranks take the same number of optimiser steps."""
        if not self.cfg.ppo.skip_uniform_groups:
            return rollouts
        keep = rl.mixed_groups([r.reward for r in rollouts], [r.task.id for r in rollouts])
        mixed = list(dict.fromkeys(r.task.id for r, k in zip(rollouts, keep) if k))
        chosen = set(mixed[: min(D.gather_objects(len(mixed)))])
        kept = [r for r in rollouts if r.task.id in chosen]
        metrics["ppo/solver/kept_share"] = D.all_reduce_mean(len(kept) / max(1, len(rollouts)))
        return kept

    def _observe(self, groups: list[list[Task]], proposals: ProposalRound, plan: Draw, train: list[SolverRollout],
                 rates: dict[str, float], kl: float | None) -> IterationStats:
        """6. What the iteration measured: rank 0 writes its new tasks and measured difficulties to the corpus and
        its task source (the mixer) observes and adapts; every rank then holds rank 0's mixer."""
        solved = [r.result.solved for r in train]
        stats = iteration_stats(D.all_reduce_mean(sum(solved) / max(1, len(solved))), groups, proposals, plan.tasks,
                                plan.new_ids, rates, kl=kl, mutation=FORMATS[self.cfg.generator.format].weighted)
        if self.main:
            new_tasks, difficulty_rows = corpus_updates(proposals.valid, plan.tasks, plan.new_ids, rates,
                                                        self.cfg.train.samples_per_task, self.step)
            self.pending_tasks += new_tasks
            self.pending_difficulty += difficulty_rows
            # written now, not at the next checkpoint: which tasks the next iteration sees must not depend on
            # where the checkpoints fell (a run resumed after step N would otherwise see step N's tasks early)
            self._flush_corpus()
            self.source.observe(stats)
        if self.world > 1:  # rank 0's mixer state on every rank, in place (the task source holds this mixer)
            self.mixer.load_state_dict(D.broadcast_object(self.mixer.state_dict() if self.main else None))
        return stats

    def _solver_round(self, plan: Draw, train: list[SolverRollout], rates: dict[str, float]) -> SolverRound:
        """7. The solver batch for the iteration's scalars, with its mean reward and reward terms over every rank."""
        rewards = [r.reward for r in train]
        reward_mean = D.all_reduce_mean(statistics.mean(rewards) if rewards else 0.0)
        terms = {name: D.all_reduce_mean(statistics.mean(r.result.terms[name] for r in train))
                 for name in (train[0].result.terms if train else [])}
        return SolverRound(plan.tasks, plan.counts, rates, reward_mean, terms)

    def _costs(self, timing: Counter, rollouts: list[SolverRollout], train: list[SolverRollout], proposals: int,
               sandbox0: dict, generator_tokens0: int) -> Costs:
        """7. What the iteration spent on this rank, and the run's totals over every rank (`COMPUTE`)."""
        sampled = sum(sum(r.mask) for r in rollouts)
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        sandbox1 = self.sb.stats()
        runs, hits = sandbox1["runs"] - sandbox0["runs"], sandbox1["cache_hits"] - sandbox0["cache_hits"]
        engine = engine_metrics(self.solver, self.generator)  # a collective
        spent = {"ppo_episodes": len(train) if self.learns else 0, "solver_episodes": len(rollouts),
                 "solver_tokens": sampled, "generator_proposals": proposals,
                 # every token it sampled: answers the novelty screen struck and drew again too
                 "generator_tokens": self._generator_tokens() - generator_tokens0, "sandbox_execs": runs - hits}
        for part in D.gather_objects(spent):
            for key, value in part.items():
                self.compute[key] += int(value)
        return Costs(timing=dict(timing), sampled_tokens=sampled,
                     update_tokens=sum(len(r.prompt) + len(r.tokens) for r in train), sandbox_runs=runs,
                     cache_hits=hits, sandbox_s=sandbox1["exec_s"] - sandbox0["exec_s"], gpu_peak_gb=peak,
                     engine=engine, compute=dict(self.compute))

    def _generator_tokens(self) -> int:
        return self.generator.sampled_tokens if self.generator is not None else 0

    def _log(self, step: int, metrics: dict, proposals: list[ProposalRollout], rollouts: list[SolverRollout]) -> None:
        """Rank 0: the scalars to TensorBoard, and every `train.log_samples_every` steps a few samples as text."""
        every = self.cfg.train.log_samples_every
        if self.main:
            self.tb.scalars(metrics, step)
            if every and step % every == 0:
                log_samples(self.tb, step, proposals, rollouts)

    # ---- start, resume, checkpoints -----------------------------------------------------------------------
    def setup(self) -> None:
        """Resume from the run folder's latest checkpoint; without one, rank 0 warm-starts first."""
        latest = self.ckpt.latest_checkpoint()
        if latest is None:
            if self.main:
                self.ckpt.clean_partial()
                self._warm_start()
            wait_for_checkpoint(self.ckpt, self.main)
            latest = self.ckpt.latest_checkpoint()
        self._load(latest)
        if self.main:  # no corpus row may be held out (selfplay.data.corpus.check_heldout: stops with the ids)
            check_heldout(self.run_dir, self.corpus.iter_tasks(), self.cfg.tasks, "the corpus at the start of the run")

    def _warm_start(self) -> None:
        """Rank 0: reserve the held-out tasks (and fixed mode's pool), warm-start both agents, evaluate them and
        write checkpoint step_0."""
        t0 = time.perf_counter()
        counts = level_counts(self.cfg.warmstart, self.cfg.tasks.max_level)
        self.log(f"no checkpoint in {self.run_dir}: warm start ({sum(counts.values())} tasks)")
        reserve_heldout(self.cfg, self.sb, self.corpus, self.run_dir, self.log)  # first: training never sees them
        solver, generator, report = warm_start(  # each SFT step's loss reaches TensorBoard as it comes
            self.cfg, self.run_dir, self.sb, self.corpus, log=self.log, progress=progress,
            on_scalar=lambda tag, value, i: self.tb.scalars({f"warmstart/{tag}": value}, i))
        self.solver, self.generator = solver, generator
        self.tb.scalars({f"warmstart/{k}": v for k, v in report.items()}, 0)
        self.warm_report = report
        heldout = self._evaluate(0)
        self.tb.hparams(flatten(to_dict(self.cfg)))
        self.warmstart_s = time.perf_counter() - t0
        self._save(0, extra={"warmstart": report, "eval_before": heldout}, collective=False)

    def _load_agent(self, folder: Path, name: str) -> LMAgent:
        """The agent `name` of checkpoint `folder`, as this run trains it (setup.load_agent)."""
        return load_agent(self.cfg, self.info, folder, name)

    def _load(self, folder: Path) -> None:
        """Both agents and the loop's state from checkpoint `folder`."""
        state = self.ckpt.load_state(folder)
        self.solver, self.generator = (self._load_agent(folder, name) for name in ("solver", "generator"))
        self.step = int(state["step"])
        if "mixer" in state:
            self.mixer.load_state_dict(state["mixer"])
        self.source.load_state_dict(state.get("source", {}))
        if self.replay.buffer is not None and "replay" in state:
            self.replay.buffer.load_state_dict(state["replay"])
        if "rng" in state:
            rngs = state["rng"]
            set_rng_state(rngs[str(self.rank)] if str(self.rank) in rngs else rngs["0"])
            self.rng.setstate(_tuple_state(state["loop_rng"]))
        self.history = state.get("history", [])
        self.compute = {key: int(state.get("compute", {}).get(key, 0)) for key in COMPUTE}  # 0: saved before counted
        self.evals = state.get("evals", {})
        self.t_start = time.perf_counter() - float(state.get("elapsed_s", 0.0))
        self.warmstart_s = state.get("warmstart_s")
        self.code = code_versions(state.get("code"))
        if self.step > 0 or "eval_before" in state:
            self.evals.setdefault("0", state.get("eval_before", {}))
        ahead = len(self.corpus) - int(state.get("corpus_size", len(self.corpus)))
        if ahead > 0:
            self.log(f"the corpus holds {ahead} more tasks than when step {self.step} was saved (written by "
                     f"iterations lost when the run was killed); they stay, so this resume is not exact")
        self.log(f"loaded {folder} (step {self.step}; {len(self.corpus)} tasks in the corpus)")

    def _save(self, step: int, extra: dict | None = None, collective: bool = True) -> None:
        """Checkpoint `step`. collective=False: rank 0 alone (the warm start, while other ranks wait)."""
        sync = D.barrier if collective else (lambda: None)
        if self.main:
            self.ckpt.begin(step)
        sync()
        partial = self.ckpt.root / f"step_{step}.partial"
        for agent in (self.solver, self.generator):
            agent.save(partial / agent.name, write_hf=self.main)
        rngs = D.gather_objects(rng_state()) if collective else [rng_state()]
        checksums = weights_in_sync((self.solver, self.generator), step) if collective and self.world > 1 else {}
        sync()
        if self.main:
            self._flush_corpus()
            state = {"param_checksums": checksums, **self._state(rngs), **(extra or {})}
            self.ckpt.commit(step, json.loads(json.dumps(state, default=_jsonable)))
            self.log(f"checkpoint step_{step} ({len(self.corpus)} tasks in the corpus)")
        sync()

    def _state(self, rngs: list) -> dict:
        """The loop's part of a checkpoint's state.json (every rank's RNG states in `rngs`)."""
        return {
            "mixer": self.mixer.state_dict(),
            "source": self.source.state_dict(),
            **({"replay": self.replay.buffer.state_dict()} if self.replay.buffer is not None else {}),
            "rng": {str(r): s for r, s in enumerate(rngs)},
            "loop_rng": self.rng.getstate(),
            "history": self.history,
            "compute": self.compute,
            "evals": self.evals,
            "elapsed_s": time.perf_counter() - self.t_start,
            "warmstart_s": self.warmstart_s,
            "corpus_size": len(self.corpus),
            "world_size": self.world,
            "config": to_dict(self.cfg),
            "code": self.code,
        }

    def _flush_corpus(self) -> None:
        """The queued tasks and measured difficulties into the corpus (each new row checked against the held-out
        programs)."""
        if self.pending_tasks:
            inserted = self.corpus.insert_many(self.pending_tasks)
            check_heldout(self.run_dir, [t for t, r in zip(self.pending_tasks, inserted) if r.inserted], self.cfg.tasks,
                          f"the corpus rows of step {self.step}")
        for task_id, rate, n, step in self.pending_difficulty:
            try:
                self.corpus.update_difficulty(task_id, rate, n_samples=n, step=step)
            except CorpusError:  # a task the corpus refused as a duplicate of another: nothing to measure
                pass
        self.pending_tasks, self.pending_difficulty = [], []

    # ---- evaluation and summary ---------------------------------------------------------------------------
    def _evaluate(self, step: int) -> dict:
        """Held-out evaluation by rank 0; under ZeRO-3 every rank takes part (each generation step gathers the
        partitioned weights from all ranks) and rank 0 keeps the results."""
        everyone = self.world > 1 and self.solver.zero3
        if not (self.main or everyone):
            return {}
        t0 = time.perf_counter()
        tasks = heldout_tasks(self.run_dir, self.cfg, self.sb, self.corpus) if self.main else None
        if everyone:
            tasks = D.broadcast_object(tasks)
        with preserved_rng():  # a run's last evaluation must not shift the draws of a run that continues it
            results = evaluate_heldout(self.solver, tasks, self.sb, samples=self.cfg.eval.samples,
                                       max_turns=self.cfg.train.max_turns, reward_cfg=self.cfg.reward,
                                       temperature=self.cfg.eval.temperature,
                                       max_prompt_tokens=self.cfg.warmstart.max_len,
                                       prompt_kw=prompt_options(self.cfg), seed=self.cfg.run.seed)
        if not self.main:
            return {}
        self.tb.scalars(heldout_scalars(results), step)
        self.evals[str(step)] = results
        line = ", ".join(f"{s} {r.get('pass@1_greedy', 0):.2f}" for s, r in results.items() if s not in BREAKDOWNS)
        self.log(f"eval step {step}: greedy pass@1 {line} ({time.perf_counter() - t0:.0f}s)")
        return results

    def _evaluate_missed(self) -> None:
        """The periodic evaluation of the step the run resumes at, when a stop came before it (run): measured now,
        before the run goes on, and saved with the next checkpoint. Rank 0 decides (it holds the evaluations)."""
        t = self.cfg.train
        due = (self.learns and 0 < self.step < t.steps and t.eval_every and self.step % t.eval_every == 0
               and str(self.step) not in self.evals)
        if D.broadcast_object(bool(due) if self.main else None):
            self.log(f"step {self.step}: its evaluation was left for the resume by a stop; running it now")
            self._evaluate(self.step)

    def summary(self) -> dict:
        """The run so far: held-out results before and after (with their paired change), the corpus by source,
        what it spent, and the first and last iterations' means."""
        steps = sorted(self.evals, key=int)
        before = self.evals.get(steps[0], {}) if steps else {}
        after = self.evals.get(steps[-1], {}) if steps else {}
        validity = [h["validity"] for h in self.history if h.get("validity") is not None]
        seconds = time.perf_counter() - self.t_start
        return {
            "run_dir": str(self.run_dir), "mode": self.cfg.train.mode, "steps": self.step,
            "seconds": seconds, "warmstart_seconds": self.warmstart_s,
            "selfplay_seconds": seconds - (self.warmstart_s or 0.0),
            "heldout_before": {s: r.get("pass@1_greedy") for s, r in before.items() if s not in BREAKDOWNS},
            "heldout_after": {s: r.get("pass@1_greedy") for s, r in after.items() if s not in BREAKDOWNS},
            "heldout_change": heldout_changes(before, after) if len(steps) > 1 else {},
            "corpus_by_source": self.corpus.counts("source"),
            "compute": dict(self.compute),
            "validity_rate": statistics.mean(validity) if validity else None,
            **window_means(self.history),
        }

    def close(self) -> None:
        self.tb.close()
        self.sb.close()
        self.corpus.close()


def say(msg: str) -> None:
    """A log line on stdout that does not glue onto a progress bar (tqdm clears and redraws the bars around it)."""
    tqdm.write(msg, file=sys.stdout)
    sys.stdout.flush()


def run_estimate(iteration_s: float, left: int, eval_every: int) -> str:
    """One line after the first iteration: how long the iterations left will take at its pace."""
    evals = f", plus {left // eval_every} periodic evaluations" if eval_every and left >= eval_every else ""
    return (f"the first iteration took {iteration_s:.0f} s: the {left} left take about {iteration_s * left / 60:.0f} "
            f"min at that pace{evals}, plus the closing evaluation")


def verdict(change: dict) -> str:
    """The paired change of a held-out figure in words: its 95 % interval above 0, below 0, or across it."""
    low, high = change["ci95"]
    if low > 0:
        return "the solver improved"
    if high < 0:
        return "the solver got worse"
    return "no measurable change (the interval holds 0)"


def print_summary(s: dict) -> None:
    """The closing summary (`SelfPlay.summary`) as a few lines on stdout."""
    ws = s["warmstart_seconds"]
    took = (f"warm start {ws / 60:.1f} min, " if ws is not None else "") + f"{s['steps']} iterations"
    lines = [f"run {s['run_dir']} ({s['mode']}): {took} (self-play {s['selfplay_seconds'] / 60:.1f} min)"]
    for split in s["heldout_after"]:
        b, a = s["heldout_before"].get(split), s["heldout_after"][split]
        change = s["heldout_change"].get(split)
        paired = (f" ({change['tasks']} tasks; change {change['delta']:+.3f}, 95 % CI "
                  f"[{change['ci95'][0]:+.3f}, {change['ci95'][1]:+.3f}])" if change else "")
        lines.append(f"  held-out {split:<22} greedy pass@1 {_fmt(b)} -> {_fmt(a)}{paired}"
                     + (f": {verdict(change)}" if change else ""))
    lines.append(f"  corpus by source: {s['corpus_by_source']}")
    if s["validity_rate"] is not None:
        lines.append(f"  generator validity rate (mean): {s['validity_rate']:.2f}")
    first, last = s["first_iterations"], s["last_iterations"]
    shown = [k for k in HISTORY if first.get(k) is not None or last.get(k) is not None]
    if shown:
        heads = f"first {first['n']}", f"last {last['n']}"
        lines.append(f"  {'per iteration (mean)':<26} {heads[0]:>9} {heads[1]:>9}")
        lines += [f"  {HISTORY[k]:<26} {_fmt(first.get(k)):>9} {_fmt(last.get(k)):>9}" for k in shown]
    print("\n".join(lines), flush=True)


def log_samples(tb: TBLogger, step: int, proposals: list[ProposalRollout], rollouts: list[SolverRollout]) -> None:
    """The first two proposals and solutions of an iteration as text, for a reader of the run's TensorBoard."""
    for p in proposals[:2]:
        status = "valid" if p.valid else f"rejected: {p.parse_error or p.reasons.get('reason') or p.rejection}"
        tb.text("samples/generator", f"**{status}**\n\n```\n{p.answer.text}\n```", step)
    for r in rollouts[:2]:
        head = f"**{r.task.family} L{r.task.level}** passed {r.result.hidden_passed}/{r.result.hidden_total}"
        tb.text("samples/solver", f"{head}\n\n{r.task.description}\n\n```python\n{r.result.code}\n```", step)


def weights_in_sync(agents, step: int) -> dict:
    """Every rank must hold the same weights after an update (replicated under DDP and ZeRO-1/2, gathered from
    the partitions under ZeRO-3). Returns this rank's checksums; raises if ranks differ."""
    mine = {a.name: a.checksum() for a in agents}
    everyone = D.gather_objects(mine)
    for name in mine:
        if len({c[name] for c in everyone}) != 1:
            raise RuntimeError(f"{name} weights differ across ranks at step {step}: "
                               f"{[c[name][:12] for c in everyone]}")
    return mine


def corpus_updates(proposals: list[Task], batch: list[Task], new_ids: set, rates: dict, n_samples: int,
                   step: int) -> tuple[list[Task], list[tuple[str, float, int, int]]]:
    """What an iteration adds to the corpus: this iteration's valid proposals and the batch's new procedural tasks
    that were attempted, and a solve rate for every task measured, each once. A task served again (replayed, or a
    proposal from the in-band pool) is measured again by the solver it now meets: its difficulty follows that."""
    tasks = list(proposals) + [x for x in batch if x.id in new_ids and x.id in rates]
    measured = {x.id: rates[x.id] for x in [*proposals, *batch] if x.id in rates}  # each once, first seen first
    return tasks, [(task_id, rate, n_samples, step) for task_id, rate in measured.items()]


def history_entry(step: int, metrics: dict) -> dict:
    """One iteration's figures for the run's history: None where the iteration had none (or NaN)."""
    entry = {"step": step}
    for key, tag in HISTORY.items():
        value = metrics.get(tag)
        entry[key] = None if value is None or not np.isfinite(value) else float(value)
    return entry


def heldout_changes(before: dict, after: dict) -> dict:
    """Per held-out split, the paired change of greedy pass@1 between two evaluations with its task count and a
    bootstrap 95 % interval over the tasks (stats.paired_delta); splits without per-task outcomes are left out."""
    b, a = before.get("per_task", {}), after.get("per_task", {})
    return {split: paired_delta(b[split], a[split], "pass@1_greedy")
            for split in sorted(set(b) & set(a)) if set(b[split]) & set(a[split])}


def window_means(history: list[dict], n: int = SUMMARY_WINDOW) -> dict:
    """Means of each history figure over the first and the last n iterations (they overlap in a run shorter than
    2n), for the closing summary; None where no iteration of the window had the figure."""
    out = {}
    for name, part in (("first_iterations", history[:n]), ("last_iterations", history[-n:])):
        means = {"n": len(part)}
        for key in HISTORY:
            values = [h[key] for h in part if h.get(key) is not None]
            means[key] = statistics.fmean(values) if values else None
        out[name] = means
    return out


def _fmt(x) -> str:
    return "  n/a" if x is None else f"{x:.3f}"


def _jsonable(obj):
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _tuple_state(state):
    return (state[0], tuple(state[1]), state[2])


def train(cfg, log=None) -> dict:
    loop = SelfPlay(cfg, log=log)
    try:
        return loop.run()
    finally:
        loop.close()
