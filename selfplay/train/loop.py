"""The self-play loop: a generator and a solver co-evolve, kept out of collapse by the difficulty mixer.

    selfplay train                                   # configs/first_run.yaml: the first run, about 40 min on a CPU
    selfplay train configs/tiny.yaml                 # the tiny world, from nothing (the tests' fixture)
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

Checkpoints (`RUN_DIR/checkpoints/step_N/`, `latest` written last; selfplay/train/checkpointing.py): both agents,
optimiser and trainer states, the mixer, RNG states, counters and the corpus size. Starting again on a run folder
that holds a checkpoint resumes from it bit for bit on one process (tests/selfplay/train/test_resume_exact.py):
held-out evaluation leaves the RNGs as it found them, so the evaluation at the end of a run does not shift a
continued run's draws. A run killed between checkpoints leaves the corpus rows of its lost iterations (the corpus is
append-only); resuming it is then not exact, and says so. `train.steps` is the total, so raising it continues a
finished run. A stop request (SIGUSR1/SIGTERM, or the file named by $SELFPLAY_STOP_FILE, as slurm/selfplay.sh does
on preemption) is answered at the next stage boundary of the iteration (`STAGES`): before the PPO update, the
iteration's unfinished work is abandoned and the last completed step is checkpointed as it stood (its RNGs, mixer
and task source as they were when the iteration began, so the resumed run repeats the iteration and matches an
uninterrupted one); after the update, the rest of the iteration (corpus, mixer, logs) is cheap and is finished,
then the step is checkpointed without its periodic evaluation (run on the resume). A request that comes during an
evaluation is answered between two of its pieces (selfplay/train/evaluation.py): the evaluation is dropped, the step
checkpointed without it, and the resumed run measures it first (step 0's, a periodic one or the last step's, which
is then saved again with it). Then the run exits 0.

Several ranks: the longest wait of any rank in a collective since the last iteration is `time/max_wait_s`; a wait
past `distributed.max_wait_fraction` of `distributed.timeout_min` is warned of (selfplay/runtime/distributed.py).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections import Counter
from pathlib import Path

import torch

from generator.formats import FORMATS
from generator.schema import Task
from selfplay.data.corpus import Corpus
from selfplay.eval.evaluate import heldout_tasks, suite_size_note
from selfplay.models.agent import LMAgent
from selfplay.rl import core as rl
from selfplay.rollout.engine import engine_metrics
from selfplay.rollout.episodes import ProposalRollout, SolverRollout, prompt_options, solve_rates, solver_rollouts
from selfplay.runtime import distributed as D
from selfplay.runtime import seeds
from selfplay.runtime.checkpoint import CheckpointManager, code_versions, rng_state, set_rng_state
from selfplay.runtime.paths import RunPaths
from selfplay.runtime.tb import TBLogger
from selfplay.train.checkpointing import flush_corpus, restore, save, start
from selfplay.train.evaluation import EvaluationStopped, evaluate, evaluate_missed
from selfplay.train.history import COMPUTE, history_entry, print_summary, run_estimate, run_summary, say
from selfplay.train.metrics import (
    Costs,
    SolverRound,
    iteration_metrics,
    iteration_stats,
    kind_tallies,
    kind_totals,
    lead_warning,
    signal_lead_s,
    stop_bound_s,
)
from selfplay.train.mixer import IterationStats, Mixer
from selfplay.train.proposals import ProposalRound, SharedProposal, choose_references, propose, reward_proposals
from selfplay.train.setup import (
    StopRequest,
    check_shared_storage,
    load_agent,
    open_run_sandbox,
    progress,
    quiet_transformers,
    sandbox_workers,
    seed_global_generators,
    validate_config,
)
from selfplay.train.solver_replay import SolverReplay
from selfplay.train.sources import Draw, make_source
from solver.rewards import overlong_penalties

# the stage boundaries where a stop request is answered: at the first three the iteration is abandoned (nothing it
# did is kept), at the last it is finished (the update is done; what is left is bookkeeping)
STAGES = ("the iteration's start", "the proposals", "the solver batch", "the solver rollouts", "the PPO update")


class SelfPlay:
    """One run: both agents, the corpus, the mixer and its task source, the sandbox, checkpoints and logs. `run`
    iterates to `train.steps`; `iteration` is one pass through the stages of the module's docstring. Where the run
    starts from and what it saves are in checkpointing.py, its held-out evaluation in evaluation.py, its history and
    closing summary in history.py."""

    _validate = staticmethod(validate_config)  # the config checks a run makes before it builds anything

    def __init__(self, cfg, *, log=None):
        quiet_transformers()
        if cfg.run.torch_threads > 0:
            torch.set_num_threads(cfg.run.torch_threads)
        self.cfg = cfg
        validate_config(cfg)
        # slurm/selfplay.sh: how long before the time limit SLURM signals a stop (None: no such signal)
        self.signal_lead = signal_lead_s(os.environ)
        self.checkpoint_s = 0.0  # the last checkpoint's write, seconds (time/stop_bound_s)
        self.lead_warned = False
        dc = cfg.distributed
        self.info = D.init_distributed(dc.backend, dc.timeout_min, dc.max_wait_fraction)
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
        self.source = make_source(
            cfg, mixer=self.mixer, sb=self.sb, corpus=self.corpus, run_dir=self.run_dir, log=self.log
        )
        self.generates = cfg.train.mode == "selfplay"  # proposals are made (by the generator or random edits)
        # the generator samples the proposals (generator.source=model) and learns from their rewards
        # (train.train_generator=false: held at its warm start, the frozen-generator baseline)
        self.samples_generator = self.generates and cfg.generator.source == "model"
        self.generator_learns = self.samples_generator and cfg.train.train_generator
        self.compute = dict.fromkeys(COMPUTE, 0)  # what the run has spent so far (checkpointed)
        # the solver learns (warmstart mode: evaluated only; train.train_solver=false: held at its warm start)
        self.learns = cfg.train.mode != "warmstart" and cfg.train.train_solver
        if self.world > 1:  # every rank says it is here (the only line ranks other than 0 print)
            print(
                f"[selfplay] rank {self.rank} of {self.world} on {os.uname().nodename} ready "
                f"({workers} sandbox workers)",
                flush=True,
            )

    # ---- the run --------------------------------------------------------------------------------------------
    def run(self) -> dict:
        """Resume (or warm-start), iterate to `train.steps` or a stop request; the closing summary."""
        self.stop.install()
        try:
            self.setup()  # step 0's evaluation, when the warm start was not yet evaluated
            missed = evaluate_missed(self)
        except EvaluationStopped as stop:  # the checkpoint the run resumed at stands: the evaluation is for later
            self._log_abandoned(stop.step)
            self._save_stopped()
            return {**self.summary(), "stopped": True}
        if self.step >= self.cfg.train.steps and missed:  # the last step's evaluation, which a stop left
            save(self, self.step)
        elif self.step >= self.cfg.train.steps:
            self.log(
                f"run already at step {self.step} of {self.cfg.train.steps}: nothing to do (raise train.steps "
                "to continue)"
            )
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
        bar = progress(total=t.steps, initial=self.step, desc=f"iterations ({t.mode})") if self.main else None
        stopped, first = False, True
        while self.step < t.steps and not stopped:
            if self.stop.now(STAGES[0]):  # e.g. a request that came during the last step's evaluation
                stopped = True
                self._save_stopped()
                break
            self.step += 1
            t0 = time.perf_counter()
            metrics = self.iteration()
            if metrics is None:  # a stop abandoned it: the last completed step is checkpointed
                self.step -= 1
                stopped = True
                self._save_stopped()
                break
            if first and self.main and self.step < t.steps:  # what the rest will take, once one iteration is known
                self.log(run_estimate(time.perf_counter() - t0, t.steps - self.step, t.eval_every))
            first = False
            self.history.append(history_entry(self.step, metrics))
            if bar:
                bar.update(1)
                bar.set_postfix(
                    pass_rate=f"{metrics['solver/pass_rate']:.2f}",
                    validity=f"{metrics.get('generator/validity_rate', float('nan')):.2f}",
                )
            # a stop is answered before the step's periodic evaluation, so that its checkpoint is written within the
            # signal's grace period; the evaluation it skipped runs when the run resumes (evaluation.evaluate_missed)
            stopped = self._evaluate_and_save(self.stop.now(STAGES[-1]))
            if stopped:
                self._log_stopped()
        if bar:
            bar.close()
        return stopped

    def _evaluate_and_save(self, stopped: bool) -> bool:
        """After an iteration: the held-out evaluation and the checkpoint, where due. A stop (`stopped`: requested
        at the update's boundary) leaves the evaluation for the resumed run; one that comes within the evaluation
        abandons it. Whether the run stops."""
        t, step = self.cfg.train, self.step
        last = step >= t.steps
        # a solver that does not learn is the one step 0 evaluated: its figures are those, not measured again
        if self.learns and not stopped and (last or (t.eval_every and step % t.eval_every == 0)):
            try:
                evaluate(self, step)
            except EvaluationStopped:
                self._log_abandoned(step)
                stopped = True
        elif last and not self.learns and self.main:
            self.log("the solver was held at its warm start: its held-out figures are step 0's, not measured again")
        if stopped or last or step % t.checkpoint_every == 0:
            self._save(step)
        return stopped

    def _save(self, step: int) -> None:
        """Checkpoint `step`, timing its write (a stop's bound, time/stop_bound_s)."""
        t0 = time.perf_counter()
        save(self, step)
        self.checkpoint_s = time.perf_counter() - t0

    def _log_abandoned(self, step: int) -> None:
        self.log(f"stop requested during step {step}'s evaluation: it is abandoned and runs first on the resume")

    def _save_stopped(self) -> None:
        """A stop before an iteration's update: checkpoint the last completed step, unless it is the latest one."""
        latest = self.ckpt.latest_checkpoint() if self.main else None
        if D.broadcast_object(latest is not None and latest.name == f"step_{self.step}"):
            self.log(f"stop requested: step_{self.step} is already checkpointed")
        else:
            self._save(self.step)
        self._log_stopped()

    def _log_stopped(self) -> None:
        self.log(
            f"stop requested: checkpoint step_{self.step} written {self.stop.waited_s():.1f} s after the request "
            f"(answered after {self.stop.answered}), exiting"
        )

    # ---- one iteration ------------------------------------------------------------------------------------
    def _snapshot(self) -> dict:
        """What an iteration changes before its update, as it was when it began (see `_abandon`): the RNGs, the
        mixer and task source (their draws), the queued corpus writes. The replay buffer changes in the update."""
        return {
            "rng": rng_state(),
            "loop_rng": self.rng.getstate(),
            "mixer": json.loads(json.dumps(self.mixer.state_dict())),
            "source": json.loads(json.dumps(self.source.state_dict())),
            "pending": (list(self.pending_tasks), list(self.pending_difficulty)),
        }

    def _abandon(self, snapshot: dict, stage: str) -> bool:
        """At a stage boundary before the update: whether a stop was requested; if so, the loop's state is put back
        as `snapshot` holds it (the weights, optimisers and corpus are untouched until the update), so that the
        checkpoint written is the last completed step's, and a resumed run repeats this iteration from its start."""
        if not self.stop.now(stage):
            return False
        set_rng_state(snapshot["rng"])
        self.rng.setstate(snapshot["loop_rng"])
        self.mixer.load_state_dict(snapshot["mixer"])
        self.source.load_state_dict(snapshot["source"])
        self.pending_tasks, self.pending_difficulty = (list(x) for x in snapshot["pending"])
        self.log(f"stop requested after {stage} of step {self.step}: the iteration is abandoned")
        return True

    def iteration(self) -> dict | None:
        """One iteration, its stages in the order of the module's docstring; returns its scalars, or None when a
        stop request abandoned it before its update (`_abandon`)."""
        step, timing = self.step, Counter()
        snapshot = self._snapshot()
        sandbox0, generator_tokens0 = self.sb.stats(), self._generator_tokens()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()  # perf/gpu_peak_mem_gb is this iteration's peak
        # 1. generator proposals: this rank's, and what every rank learns of everyone's
        mine, groups, shared = self._propose(step, timing)
        if self._abandon(snapshot, STAGES[1]):
            return None
        valid = [Task.from_dict(x.task) for part in shared for x in part if x.task is not None]
        # 2. solver batch, drawn by the task source; 3. rollouts, graded
        plan = self._solver_batch(valid, timing)
        if self._abandon(snapshot, STAGES[2]):
            return None
        rollouts, train, rates = self._attempt(plan, timing)
        if self._abandon(snapshot, STAGES[3]):
            return None
        # 4. rewards of every proposal; this rank's for its generator update
        proposals = reward_proposals(
            [x for part in shared for x in part], valid, rates, self.mixer.repetition_weight, self.cfg.generator.reward
        )
        start = sum(len(part) for part in shared[: self.rank])
        # 5. PPO updates; 6. corpus and mixer
        updates = self._update(train, rates, mine, proposals.rewards[start : start + len(mine)], timing)
        stats = self._observe(groups, proposals, plan, train, rates, kl=updates.get("ppo/solver/kl"))
        # 7. logs: the figures that need every rank first, in this order on each, then the scalars
        solver = self._solver_round(plan, train, rates)
        source = self.source.metrics(step)  # mixer/... in self-play, the schedule's level in curriculum
        costs = self._costs(timing, rollouts, train, len(mine), sandbox0, generator_tokens0)
        metrics = iteration_metrics(updates, stats, solver, proposals if self.generates else None, source, costs)
        metrics.update(self._waits(step))
        metrics["time/stop_bound_s"] = stop_bound_s(costs.timing, self.checkpoint_s)
        self._check_lead(metrics["time/stop_bound_s"])
        self._log(step, metrics, mine, train)
        return metrics

    def _check_lead(self, bound_s: float) -> None:
        """Rank 0, once a run: warn where a stop's bound passes the SLURM signal's lead (`lead_warning`)."""
        warning = lead_warning(bound_s, self.signal_lead) if self.main and not self.lead_warned else None
        if warning:
            self.lead_warned = True
            self.log(warning)

    def _waits(self, step: int) -> dict[str, float]:
        """Several ranks: the longest wait of any rank in one collective since the last iteration's (its evaluation
        and checkpoint included), `time/max_wait_s`, and which collective on which rank as text (`time/max_wait`).
        The stated bound on it is `distributed.max_wait_fraction` of `distributed.timeout_min` (runtime/distributed.py
        `Waits` warns past it)."""
        if self.world == 1:
            return {}
        waits = D.gather_objects(D.WAITS.take())
        rank = max(range(self.world), key=lambda r: waits[r][1])
        name, seconds = waits[rank]
        if self.main:
            self.tb.text("time/max_wait", f"rank {rank}: {seconds:.2f} s in {name or 'no collective'}", step)
        return {"time/max_wait_s": seconds}

    def _propose(
        self, step: int, timing: Counter
    ) -> tuple[list[ProposalRollout], list[list[Task]], list[list[SharedProposal]]]:
        """1. Rank 0 picks the references of every proposal; this rank makes its share of the proposals, parsed and
        validated. Returns them, every proposal's references, and what every rank learns of every rank's."""
        mine, groups = [], []
        if self.generates:
            t0 = time.perf_counter()
            n = self.cfg.train.proposals
            groups = D.broadcast_object(
                choose_references(self.cfg, self.corpus, self.mixer, step, n) if self.main else None
            )
            mine = propose(
                self.cfg,
                self.generator,
                groups[self.rank :: self.world],
                self.sb,
                self.corpus,
                self.mixer,
                step=step,
                rank=self.rank,
            )
            timing["generator_s"] += time.perf_counter() - t0
        return mine, groups, D.gather_objects([SharedProposal.of(p) for p in mine])

    def _solver_batch(self, valid_generator: list[Task], timing: Counter) -> Draw:
        """2. Rank 0's task source draws the solver batch (tasks for PPO, extra generator tasks to measure), topped
        up from a replay pool when it drew short, and every rank receives it; new corpus tasks it made are queued."""
        t0, n, plan = time.perf_counter(), self.cfg.train.solver_tasks, None
        if self.main:
            replay_pool = self.corpus.query(
                split="train",
                order="random",
                limit=1024,
                seed=seeds.derive(self.cfg.run.seed, "replay-pool", self.step),
            )
            drawn = self.source.draw(n, self.rng, step=self.step, offered=valid_generator, pool=replay_pool)
            self.pending_tasks += drawn.queued
            batch = list(drawn.tasks)
            while len(batch) < n:  # too few valid procedural tasks at a level: top up from the pool
                batch.append(replay_pool[len(batch) % len(replay_pool)] if replay_pool else batch[0])
            kinds = self.mixer.draw_kinds(n, self.step)  # how each task is asked (mixer.kinds)
            plan = Draw(batch[:n], drawn.counts, extra=drawn.extra, new_ids=drawn.new_ids, kinds=kinds)
        plan = D.broadcast_object(plan)
        timing["plan_s"] += time.perf_counter() - t0
        return plan

    def _attempt(
        self, plan: Draw, timing: Counter
    ) -> tuple[list[SolverRollout], list[SolverRollout], dict[str, float]]:
        """3. k episodes on each of this rank's share of the batch and of the extra tasks, graded in the sandbox.
        Returns them all, the PPO share of them, and every rank's solve rate per task."""
        t = self.cfg.train
        per_rank = len(plan.tasks) // self.world
        my_batch = plan.tasks[self.rank * per_rank : (self.rank + 1) * per_rank]
        my_extra = plan.extra[self.rank :: self.world]
        t0 = time.perf_counter()
        rollouts = solver_rollouts(
            self.solver,
            my_batch + my_extra,
            t.samples_per_task,
            self.sb,
            max_turns=t.max_turns,
            reward_cfg=self.cfg.reward,
            max_prompt_tokens=self.cfg.warmstart.max_len,
            prompt_kw=prompt_options(self.cfg),
            kinds=plan.kinds[self.rank * per_rank : (self.rank + 1) * per_rank],
            kind_max_new_tokens=dict(self.cfg.mixer.kind_max_new_tokens),
        )
        timing["rollout_s"] += time.perf_counter() - t0
        rates = {}
        for part in D.gather_objects(solve_rates(rollouts)):
            rates.update(part)
        return rollouts, rollouts[: len(my_batch) * t.samples_per_task], rates

    def _update(
        self,
        train: list[SolverRollout],
        rates: dict[str, float],
        proposals: list[ProposalRollout],
        proposal_rewards: list[float],
        timing: Counter,
    ) -> dict[str, float]:
        """5. The PPO updates, solver then generator; their figures (`ppo/...`, `replay/size`)."""
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        lr_scale = self.mixer.lr_scale
        if self.learns:
            self._update_solver(train, rates, lr_scale, metrics)
            timing["solver_update_s"] = time.perf_counter() - t0
        if self.generator_learns and proposals:
            # agents.generator.advantage=rloo_batch: this rank's proposals are one group, each one's baseline the
            # mean return of the others (different prompts, one policy: the baseline leaves the gradient unbiased)
            one_group = [0] * len(proposals) if self.cfg.agents.generator.advantage == "rloo_batch" else None
            stats = self.generator.update(
                [p.answer for p in proposals], proposal_rewards, lr_scale=lr_scale, groups=one_group
            )
            metrics.update({f"ppo/generator/{k}": D.all_reduce_mean(v) for k, v in stats.items()})
        timing["update_s"] += time.perf_counter() - t0
        return metrics

    def _update_solver(
        self, train: list[SolverRollout], rates: dict[str, float], lr_scale: float, metrics: dict
    ) -> None:
        """The solver's PPO update on its episodes (and a replay draw), then its successes into the replay buffer."""
        cfg = self.cfg
        update_rollouts = self._update_rollouts(train, metrics)
        replay = self.replay.draw(self.solver, self.corpus, self.step, self.sb)
        if update_rollouts:  # with ppo.skip_uniform_groups, no task may have had answers that scored differently
            # reward.overlong_cache: DAPO's soft length penalty
            overlong = overlong_penalties(
                [r.mask for r in update_rollouts], self.solver.cfg.max_new_tokens, cfg.reward.overlong_cache
            )
            rewards = [r.reward + o for r, o in zip(update_rollouts, overlong)]
            if cfg.ppo.null_reward:  # the control: the same episodes and steps, no reward
                rewards = [0.0] * len(rewards)
            stats = self.solver.update(
                update_rollouts,
                rewards,
                lr_scale=lr_scale,
                masks=[r.mask for r in update_rollouts],
                replay=replay,
                groups=[r.task.id for r in update_rollouts],
            )
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

    def _observe(
        self,
        groups: list[list[Task]],
        proposals: ProposalRound,
        plan: Draw,
        train: list[SolverRollout],
        rates: dict[str, float],
        kl: float | None,
    ) -> IterationStats:
        """6. What the iteration measured: rank 0 writes its new tasks and measured difficulties to the corpus and
        its task source (the mixer) observes and adapts; every rank then holds rank 0's mixer."""
        solved = [r.result.solved for r in train]
        stats = iteration_stats(
            D.all_reduce_mean(sum(solved) / max(1, len(solved))),
            groups,
            proposals,
            plan.tasks,
            plan.new_ids,
            rates,
            kl=kl,
            mutation=FORMATS[self.cfg.generator.format].weighted,
            kinds=plan.kinds,
        )
        if self.main:
            new_tasks, difficulty_rows = corpus_updates(
                proposals.valid, plan.tasks, plan.new_ids, rates, self.cfg.train.samples_per_task, self.step
            )
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
        terms = {
            name: D.all_reduce_mean(statistics.mean(r.result.terms[name] for r in train))
            for name in (train[0].result.terms if train else [])
        }
        kinds = (
            kind_totals(D.gather_objects(kind_tallies(train, self.mixer.kind_weights))) if self.mixer.asks_kinds else {}
        )
        return SolverRound(plan.tasks, plan.counts, rates, reward_mean, terms, kinds)

    def _costs(
        self,
        timing: Counter,
        rollouts: list[SolverRollout],
        train: list[SolverRollout],
        proposals: int,
        sandbox0: dict,
        generator_tokens0: int,
    ) -> Costs:
        """7. What the iteration spent on this rank, and the run's totals over every rank (`COMPUTE`)."""
        sampled = sum(sum(r.mask) for r in rollouts)
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        sandbox1 = self.sb.stats()
        runs, hits = sandbox1["runs"] - sandbox0["runs"], sandbox1["cache_hits"] - sandbox0["cache_hits"]
        engine = engine_metrics(self.solver, self.generator)  # a collective
        spent = {
            "ppo_episodes": len(train) if self.learns else 0,
            "solver_episodes": len(rollouts),
            "solver_tokens": sampled,
            "generator_proposals": proposals,
            # every token it sampled: answers the novelty screen struck and drew again too
            "generator_tokens": self._generator_tokens() - generator_tokens0,
            "sandbox_execs": runs - hits,
        }
        for part in D.gather_objects(spent):
            for key, value in part.items():
                self.compute[key] += int(value)
        return Costs(
            timing=dict(timing),
            sampled_tokens=sampled,
            update_tokens=sum(len(r.prompt) + len(r.tokens) for r in train),
            sandbox_runs=runs,
            cache_hits=hits,
            sandbox_s=sandbox1["exec_s"] - sandbox0["exec_s"],
            gpu_peak_gb=peak,
            engine=engine,
            compute=dict(self.compute),
        )

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
        """Resume from the run folder's latest checkpoint, or warm-start first (checkpointing.start)."""
        start(self)

    def _load_agent(self, folder: Path, name: str) -> LMAgent:
        """The agent `name` of checkpoint `folder`, as this run trains it (setup.load_agent)."""
        return load_agent(self.cfg, self.info, folder, name)

    def _load(self, folder: Path) -> None:
        """Both agents and the loop's state from checkpoint `folder` (checkpointing.restore)."""
        restore(self, folder)

    def _flush_corpus(self) -> None:
        """The queued tasks and measured difficulties into the corpus (checkpointing.flush_corpus)."""
        flush_corpus(self.corpus, self.run_dir, self.cfg.tasks, self.step, self.pending_tasks, self.pending_difficulty)
        self.pending_tasks, self.pending_difficulty = [], []

    # ---- summary --------------------------------------------------------------------------------------------
    def summary(self) -> dict:
        """The run so far (history.run_summary)."""
        return run_summary(
            self.run_dir,
            self.cfg.train.mode,
            self.step,
            time.perf_counter() - self.t_start,
            self.warmstart_s,
            self.evals,
            self.history,
            self.corpus.counts("source"),
            self.compute,
        )

    def close(self) -> None:
        self.tb.close()
        self.sb.close()
        self.corpus.close()


def log_samples(tb: TBLogger, step: int, proposals: list[ProposalRollout], rollouts: list[SolverRollout]) -> None:
    """The first two proposals and solutions of an iteration as text, for a reader of the run's TensorBoard."""
    for p in proposals[:2]:
        status = "valid" if p.valid else f"rejected: {p.parse_error or p.reasons.get('reason') or p.rejection}"
        tb.text("samples/generator", f"**{status}**\n\n```\n{p.answer.text}\n```", step)
    for r in rollouts[:2]:
        head = f"**{r.task.family} L{r.task.level}** passed {r.result.hidden_passed}/{r.result.hidden_total}"
        tb.text("samples/solver", f"{head}\n\n{r.task.description}\n\n```python\n{r.result.code}\n```", step)


def corpus_updates(
    proposals: list[Task], batch: list[Task], new_ids: set, rates: dict, n_samples: int, step: int
) -> tuple[list[Task], list[tuple[str, float, int, int]]]:
    """What an iteration adds to the corpus: this iteration's valid proposals and the batch's new procedural tasks
    that were attempted, and a solve rate for every task measured, each once. A task served again (replayed, or a
    proposal from the in-band pool) is measured again by the solver it now meets: its difficulty follows that."""
    tasks = list(proposals) + [x for x in batch if x.id in new_ids and x.id in rates]
    measured = {x.id: rates[x.id] for x in [*proposals, *batch] if x.id in rates}  # each once, first seen first
    return tasks, [(task_id, rate, n_samples, step) for task_id, rate in measured.items()]


def train(cfg, log=None) -> dict:
    loop = SelfPlay(cfg, log=log)
    try:
        return loop.run()
    finally:
        loop.close()
