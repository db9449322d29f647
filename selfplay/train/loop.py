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
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

import sandbox
from sandbox.files import owner_dir
from generator.rewards import ProposalOutcome, check_closed_invalid, check_learnability, generator_rewards, in_band
from generator.rewards import diversity as proposal_diversity
from generator.schema import Task
from generator.validity import validate_many
from selfplay.runtime import distributed as D
from selfplay.rl import core as rl
from selfplay.models.agent import Answer, LMAgent, agent_ppo_config, load_agent_parts
from selfplay.models.factory import is_lora, lora_settings
from selfplay.runtime.checkpoint import (CheckpointManager, code_versions, preserved_rng, rng_state,
                                         set_rng_state)
from selfplay.runtime.config import to_dict
from selfplay.data.corpus import Corpus, CorpusError, check_heldout
from selfplay.runtime import seeds
from selfplay.runtime.errors import UserError
from selfplay.runtime.paths import RunPaths
from selfplay.eval.evaluate import BREAKDOWNS, evaluate_heldout, heldout_scalars, heldout_tasks, suite_size_note
from selfplay.eval.stats import paired_delta
from selfplay.train.mixer import IterationStats, Mixer, edit_drops, in_band_share
from selfplay.train.sources import RESERVED_TASKS_FILE, make_source, reserve_fixed_pool
from selfplay.train.sources import validate as validate_task_choice
from selfplay.rl.replay import AnswerSet, ReplayBuffer, ReplayItem, successes
from selfplay.rollout.engine import engine_metrics, make_engine
from selfplay.rollout.episodes import (ProposalRollout, generator_rollouts, prompt_options, solve_rates,
                                       solver_rollouts)
from selfplay.runtime.tb import TBLogger

REPLAY_SOURCES = ("successes", "sft")  # ppo.replay_source
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


class SharedProposal(NamedTuple):
    """What every rank learns about one proposal of any rank (gathered each iteration)."""

    task: dict | None  # the valid task (Task.to_dict), None when it failed a check
    rejection: str | None  # the first failed check, "edit" or "unparsable"
    parsed: bool
    cluster: str | None  # its near-duplicate key (the AST fingerprint)
    redrawn: int  # answers struck by the novelty screen before this one
    instruction: str  # the instruction its prompt gave
    cut_off: bool  # its answer reached the token limit before its end
    closed: bool  # its answer was closed under its grammar inside the token budget (generator.close_reserve)


def quiet_transformers() -> None:
    """Keep the run's output readable: no per-file progress bars or padding advice from transformers."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def _progress(**kwargs):
    from tqdm import tqdm

    return tqdm(dynamic_ncols=True, file=sys.stderr, **kwargs)


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(flatten(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


class SelfPlay:
    def __init__(self, cfg, *, log=None):
        quiet_transformers()
        if cfg.run.torch_threads > 0:
            torch.set_num_threads(cfg.run.torch_threads)
        self.cfg = cfg
        self._validate(cfg)
        self.info = D.init_distributed(cfg.distributed.backend, cfg.distributed.timeout_min)
        self.rank, self.world = self.info.rank, self.info.world_size
        self.main = self.info.is_main
        # python's and numpy's global generators, for any library that draws from them (the project's own draws use
        # named streams): seeded, so that two runs of one command save the same states; a checkpoint saves and
        # restores them with torch's
        random.seed(seeds.derive(cfg.run.seed, "python-global", self.rank))
        np.random.seed(seeds.derive(cfg.run.seed, "numpy-global", self.rank) % 2**32)
        self.log = log or (lambda msg: print(f"[selfplay] {msg}", flush=True) if self.main else None)
        self.run_dir = Path(cfg.run.dir)
        self._check_shared_storage()
        self.ckpt = CheckpointManager(self.run_dir, cfg.run.keep_last)
        self.tb = TBLogger(self.run_dir, enabled=self.main)
        self.mixer = Mixer(cfg.mixer, seed=cfg.run.seed)
        self.replay = (ReplayBuffer(cfg.ppo.replay_capacity, seed=cfg.run.seed, half_life=cfg.ppo.replay_half_life)
                       if cfg.ppo.replay_coef > 0 and cfg.ppo.replay_source == "successes"
                       else None)  # solver successes (same on every rank)
        self.sft_answers: AnswerSet | None = None  # ppo.replay_source=sft: built from the corpus on first use
        self.rng = random.Random(cfg.run.seed)
        self.step = 0
        self.pending_tasks: list[Task] = []  # corpus writes queued until the end of the iteration
        self.pending_difficulty: list[tuple[str, float, int, int]] = []
        self.history: list[dict] = []  # per-iteration summary (also in TensorBoard)
        self.evals: dict[str, dict] = {}  # step -> held-out results
        self.stop_requested = False
        self.t_start = time.perf_counter()
        self.warmstart_s: float | None = None  # the warm start's wall time (in elapsed_s too)
        self.code = code_versions(None)  # the code versions this run has run under (checkpoint's "code")
        self.solver: LMAgent | None = None
        self.generator: LMAgent | None = None
        # one worker per CPU this rank may use (its affinity: SLURM's --cpus-per-task), shared by the node's ranks
        workers = cfg.sandbox.workers or max(1, sandbox.usable_cpus() // max(1, self._local_world()))
        self.sb = sandbox.open_sandbox(cfg.sandbox.backend, workers=workers, timeout_s=cfg.sandbox.timeout_s,
                                       memory_mb=cfg.sandbox.memory_mb, cache=cfg.sandbox.cache,
                                       **({"cache_path": cfg.sandbox.cache_path} if cfg.sandbox.cache_path else {}),
                                       **({"trace_path": cfg.sandbox.trace_path} if cfg.sandbox.trace_path else {}),
                                       **({"image": cfg.sandbox.image} if cfg.sandbox.backend == "docker" else {}))
        try:  # a policy that can read hidden tests or the host would learn to: refused unless allowed
            self.sb.require_isolation(allow=cfg.sandbox.allow_unisolated)
        except sandbox.SandboxConfigError as exc:
            self.sb.close()
            raise UserError(str(exc)) from None
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

    # ---- set-up -----------------------------------------------------------------------------------------
    @staticmethod
    def _validate(cfg) -> None:
        t = cfg.train
        validate_task_choice(t)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        for key, value in (("train.solver_tasks", t.solver_tasks), ("train.proposals", t.proposals)):
            if value < 1 or value % world:
                raise UserError(f"{key} ({value}) must be a positive multiple of the number of ranks ({world})")
        if t.samples_per_task < 1:
            raise UserError("train.samples_per_task must be >= 1")
        try:
            check_learnability(cfg.generator.reward.learnability)
            check_closed_invalid(cfg.generator.reward.closed_invalid)
            Mixer(cfg.mixer)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
        if cfg.ppo.replay_source not in REPLAY_SOURCES:
            raise UserError(f"ppo.replay_source must be one of {', '.join(REPLAY_SOURCES)}, "
                            f"got {cfg.ppo.replay_source!r}")

    @staticmethod
    def _local_world() -> int:
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    def _check_shared_storage(self) -> None:
        """Every rank must see the run folder rank 0 writes to (checkpoints and the corpus live there).

        Rank 0 creates the folder and a probe file with a fresh random name; every rank looks for that file (a
        same-named folder on a node's local disk cannot hold it). Rank 0's own failure to create the folder is
        sent to every rank, so each one stops with the same message instead of waiting on the others."""
        token, error = os.urandom(8).hex(), None
        if self.main:
            try:
                owner_dir(self.run_dir)  # the corpus, checkpoints, traces: readable by their owner only
                (self.run_dir / f".rank_probe_{token}").write_text(str(os.getpid()))
            except OSError as exc:
                error = f"run.dir {self.run_dir} cannot be written by rank 0 on {os.uname().nodename}: {exc}"
        token, error = D.broadcast_object((token, error) if self.main else None)
        if error:
            raise UserError(error)
        probe = self.run_dir / f".rank_probe_{token}"
        oks = D.gather_objects((self.rank, probe.exists(), os.uname().nodename))
        bad = [f"rank {r} on {host}" for r, good, host in oks if not good]
        if self.main:
            probe.unlink(missing_ok=True)
        if bad:
            raise UserError(f"run.dir {self.run_dir} is not visible from {', '.join(bad)}: rank 0 on "
                            f"{os.uname().nodename} wrote a file there that they cannot see; put run.dir on "
                            f"storage every node shares")

    def _install_signal_handlers(self) -> None:
        def request_stop(signum, _frame):
            self.stop_requested = True
            self.log(f"signal {signal.Signals(signum).name}: will checkpoint and stop after this iteration (its "
                     "periodic evaluation is left for the resume)")

        for sig in (signal.SIGUSR1, signal.SIGTERM):
            try:
                signal.signal(sig, request_stop)
            except ValueError:  # not the main thread (e.g. inside a test runner thread)
                pass

    def _stop_now(self) -> bool:
        stop_file = os.environ.get("SELFPLAY_STOP_FILE")
        local = self.stop_requested or bool(stop_file and Path(stop_file).exists())
        return bool(D.broadcast_object(local if self.main else None)) or local

    def setup(self) -> None:
        latest = self.ckpt.latest_checkpoint()
        if latest is None:
            if self.main:
                self.ckpt.clean_partial()
                self._warm_start()
            self._wait_for_checkpoint()
            latest = self.ckpt.latest_checkpoint()
        self._load(latest)
        if self.main:  # no corpus row may be held out (selfplay.data.corpus.check_heldout: stops with the ids)
            check_heldout(self.run_dir, self.corpus.iter_tasks(), self.cfg.tasks, "the corpus at the start of the run")

    def _wait_for_checkpoint(self) -> None:
        """Other ranks wait (polling the file system, not a collective) while rank 0 warm-starts."""
        if self.main:
            D.barrier()
            return
        while self.ckpt.latest_checkpoint() is None:
            time.sleep(2.0)
        D.barrier()

    def _warm_start(self) -> None:
        from selfplay.train.warmstart import level_counts, warm_start

        t0 = time.perf_counter()
        counts = level_counts(self.cfg.warmstart, self.cfg.tasks.max_level)
        self.log(f"no checkpoint in {self.run_dir}: warm start ({sum(counts.values())} tasks)")
        # held-out tasks first, reserved in the corpus: training never sees their programs
        heldout = heldout_tasks(self.run_dir, self.cfg, self.sb, self.corpus)
        self.log(f"held-out tasks: {', '.join(f'{s} {len(ts)}' for s, ts in heldout.items())} "
                 f"({self.corpus.reserved_count()} programs reserved)")
        if self.cfg.train.fixed_source == "reserved":
            pool = reserve_fixed_pool(self.cfg, self.sb, self.corpus, self.run_dir)
            self.log(f"fixed mode's pool: {len(pool)} tasks reserved before the SFT corpus -> "
                     f"{self.run_dir / RESERVED_TASKS_FILE}")
        solver, generator, report = warm_start(self.cfg, self.run_dir, self.sb, self.corpus, log=self.log,
                                               progress=_progress)
        self.solver, self.generator = solver, generator
        self.tb.scalars({f"warmstart/{k}": v for k, v in report.items()}, 0)
        self.warm_report = report
        heldout = self._evaluate(0)
        self.tb.hparams(flatten(to_dict(self.cfg)))
        self.warmstart_s = time.perf_counter() - t0
        self._save(0, extra={"warmstart": report, "eval_before": heldout}, collective=False)

    def _load_agent(self, folder: Path, name: str) -> LMAgent:
        """The agent `name` ("solver" or "generator") of checkpoint `folder`: weights, reference, tokenizer and
        training state, wrapped for DeepSpeed/DDP where the run is, at the config's learning rate."""
        wrap = None
        if self.cfg.distributed.deepspeed or self.world > 1:
            wrap = lambda m: D.wrap_model(m, self.cfg.ppo, self.cfg.distributed, self.info)  # noqa: E731
        model, reference, tokenizer = load_agent_parts(folder / name, self.cfg.model.dtype, self.cfg.model.value_model)
        if (lora_settings(self.cfg.model, name) is not None) != is_lora(model.policy):
            had = "has a LoRA adapter" if is_lora(model.policy) else "has no LoRA adapter"
            raise UserError(f"model.lora: the {name}'s checkpoint in {folder} {had}, the config says "
                            "otherwise; LoRA is chosen at the warm start (keep its model.lora settings or start a "
                            "new run.dir)")
        device = D.local_device(self.info.local_rank)  # one GPU per rank; DeepSpeed/DDP keep it there
        model.to(device)
        reference.to(device)
        agent = LMAgent(name, model, reference, tokenizer, agent_ppo_config(self.cfg, name), wrap=wrap,
                        seed=self.cfg.run.seed)
        agent.load_training_state(folder / name)
        if name == "generator" and self.cfg.generator.constrained:  # refused here if it cannot compile
            agent.constrain(self.cfg.generator.format, self.cfg.generator.close_reserve)
        scale = self.cfg.train.generator_lr_scale if name == "generator" else 1.0
        agent.set_learning_rate(self.cfg.ppo.lr * scale)  # the config's, not the one saved with the optimiser
        agent.engine = make_engine(self.cfg, agent, folder / name, rank=self.rank)  # rollout.engine; hf: None
        return agent

    def _load(self, folder: Path) -> None:
        state = self.ckpt.load_state(folder)
        self.solver, self.generator = (self._load_agent(folder, name) for name in ("solver", "generator"))
        self.step = int(state["step"])
        if "mixer" in state:
            self.mixer.load_state_dict(state["mixer"])
        self.source.load_state_dict(state.get("source", {}))
        if self.replay is not None and "replay" in state:
            self.replay.load_state_dict(state["replay"])
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

    # ---- checkpoints --------------------------------------------------------------------------------------
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
        checksums = self._weights_in_sync() if collective and self.world > 1 else {}
        sync()
        if self.main:
            self._flush_corpus()
            state = {
                "param_checksums": checksums,
                "mixer": self.mixer.state_dict(),
                "source": self.source.state_dict(),
                **({"replay": self.replay.state_dict()} if self.replay is not None else {}),
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
                **(extra or {}),
            }
            self.ckpt.commit(step, json.loads(json.dumps(state, default=_jsonable)))
            self.log(f"checkpoint step_{step} ({len(self.corpus)} tasks in the corpus)")
        sync()

    def _weights_in_sync(self) -> dict:
        """Every rank must hold the same weights after an update (replicated under DDP and ZeRO-1/2, gathered from
        the partitions under ZeRO-3). Returns the checksums; raises if ranks differ."""
        mine = {a.name: a.checksum() for a in (self.solver, self.generator)}
        everyone = D.gather_objects(mine)
        for name in mine:
            if len({c[name] for c in everyone}) != 1:
                raise RuntimeError(f"{name} weights differ across ranks at step {self.step}: "
                                   f"{[c[name][:12] for c in everyone]}")
        return mine

    def _flush_corpus(self) -> None:
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

    # ---- one iteration ------------------------------------------------------------------------------------
    def _references(self, n: int) -> list[list[Task]]:
        """K reference tasks for each of n proposals, chosen by the mixer (`Mixer.choose_references`): near the
        band's centre plus the solve rate an edit measurably takes away."""
        k = self.cfg.train.references
        seed = seeds.derive(self.cfg.run.seed, "references", self.step)
        pool = self.corpus.query(split="train", order="random", limit=512, seed=seed)
        # and tasks the solver has been seen to solve, which a random draw from a large corpus would mostly miss
        pool += self.corpus.query(split="train", order="random", limit=256, seed=seed, max_difficulty=0.999)
        if self.cfg.generator.format == "mutation":  # an edit needs a program (procedural and edited tasks have one)
            from generator.families.grammar import program_of

            pool = [x for x in pool if program_of(x) is not None]
        if not pool:
            raise RuntimeError("the corpus holds no training task to show the generator")
        by_id = {t.id: t for t in pool}
        ids, difficulties = list(by_id), [t.difficulty for t in by_id.values()]
        return [[by_id[i] for i in self.mixer.choose_references(ids, difficulties, k)] for _ in range(n)]

    def _prompt_budget(self, agent: LMAgent, max_new_tokens: int) -> int:
        """Longest prompt that leaves `max_new_tokens` of room in the model (and at most warmstart.max_len)."""
        positions = agent.max_positions or (self.cfg.warmstart.max_len + max_new_tokens)
        return max(16, min(self.cfg.warmstart.max_len, positions - max_new_tokens))

    def _plan(self, valid_generator: list[Task]) -> dict:
        """Rank 0: the solver batch of this iteration (tasks for PPO, extra generator tasks to measure)."""
        n = self.cfg.train.solver_tasks
        replay_pool = self.corpus.query(split="train", order="random", limit=1024,
                                        seed=seeds.derive(self.cfg.run.seed, "replay-pool", self.step))
        drawn = self.source.draw(n, self.rng, step=self.step, offered=valid_generator, pool=replay_pool)
        self.pending_tasks += drawn.queued
        batch = list(drawn.tasks)
        while len(batch) < n:  # too few valid procedural tasks at a level: top up from the pool
            batch.append(replay_pool[len(batch) % len(replay_pool)] if replay_pool else batch[0])
        return {"batch": batch[:n], "extra": drawn.extra, "counts": drawn.counts, "new_ids": drawn.new_ids}

    def iteration(self) -> dict:
        cfg, t = self.cfg, self.cfg.train
        step = self.step
        metrics: dict[str, float] = {}
        timing = Counter()
        sb0 = self.sb.stats()
        generator_tokens0 = self.generator.sampled_tokens if self.generator is not None else 0
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()  # perf/gpu_peak_mem_gb is this iteration's peak

        # 1. generator proposals ----------------------------------------------------------------------------
        proposals, groups = [], []
        if self.generates:
            from generator.build import BuildConfig

            t0 = time.perf_counter()
            groups = D.broadcast_object(self._references(t.proposals) if self.main else None)
            mine = groups[self.rank:: self.world]
            if self.samples_generator:
                proposals = generator_rollouts(
                    self.generator, mine, self.sb, step=step, rng=seeds.stream(cfg.run.seed, step, self.rank),
                    corpus_index=self.corpus, n_visible=cfg.tasks.n_visible, checkpoint=f"step_{step - 1}",
                    max_prompt_tokens=self._prompt_budget(self.generator, t.generator_max_new_tokens),
                    max_new_tokens=t.generator_max_new_tokens, fmt=cfg.generator.format,
                    build_cfg=BuildConfig.from_config(cfg.tasks), redraws=cfg.generator.redraws,
                    tie_signature=cfg.generator.tie_signature,
                    instruction_weights=self.mixer.instruction_weights)
            else:  # generator.source=random_edits: the same references, a random edit of them in place of an answer
                proposals = random_edit_rollouts(mine, self.sb, step=step,
                                                 rng=seeds.stream(cfg.run.seed, step, self.rank),
                                                 corpus_index=self.corpus, build_cfg=BuildConfig.from_config(cfg.tasks),
                                                 instruction_weights=self.mixer.instruction_weights)
            timing["generator_s"] += time.perf_counter() - t0
        shared = D.gather_objects([SharedProposal(p.task.to_dict() if p.valid else None, p.rejection, p.parsed,
                                                  (p.task.fingerprints or {}).get("ast") if p.task else None,
                                                  p.redrawn, p.instruction, not p.answer.finished,
                                                  p.answer.closed > 0)
                                   for p in proposals])
        flat = [x for rank_list in shared for x in rank_list]
        valid_generator = [Task.from_dict(x.task) for x in flat if x.task is not None]

        # 2. solver batch -------------------------------------------------------------------------------------
        t0 = time.perf_counter()
        plan = D.broadcast_object(self._plan(valid_generator) if self.main else None)
        timing["plan_s"] += time.perf_counter() - t0
        batch, extra = plan["batch"], plan["extra"]
        per_rank = len(batch) // self.world
        my_batch = batch[self.rank * per_rank: (self.rank + 1) * per_rank]
        my_extra = extra[self.rank:: self.world]

        # 3. rollouts --------------------------------------------------------------------------------------
        t0 = time.perf_counter()
        rollouts = solver_rollouts(self.solver, my_batch + my_extra, t.samples_per_task, self.sb,
                                   max_turns=t.max_turns, reward_cfg=cfg.reward,
                                   max_prompt_tokens=cfg.warmstart.max_len, prompt_kw=prompt_options(cfg))
        timing["rollout_s"] += time.perf_counter() - t0
        gen_tokens = sum(sum(r.mask) for r in rollouts)
        train_rollouts = rollouts[: len(my_batch) * t.samples_per_task]
        rates_all = {}
        for part in D.gather_objects(solve_rates(rollouts)):
            rates_all.update(part)

        # 4. rewards -------------------------------------------------------------------------------------------
        outcomes = [ProposalOutcome(parsed=x.parsed, valid=x.task is not None,
                                    solve_rate=rates_all.get(x.task["id"]) if x.task is not None else None,
                                    cluster=x.cluster, closed=x.closed) for x in flat]
        g_rewards_all = generator_rewards(outcomes, self.mixer.repetition_weight,
                                          cfg.generator.reward.learnability, cfg.generator.reward.closed_invalid)
        offsets = np.cumsum([0] + [len(x) for x in shared])
        g_rewards = g_rewards_all[offsets[self.rank]: offsets[self.rank + 1]]

        # 5. PPO updates -----------------------------------------------------------------------------------
        t0 = time.perf_counter()
        lr_scale = self.mixer.lr_scale
        if self.learns:
            update_rollouts = self._update_rollouts(train_rollouts, metrics)
            replay = self._replay_draw(step)
            if update_rollouts:  # with ppo.skip_uniform_groups, no task may have had answers that scored differently
                from solver.rewards import overlong_penalties  # reward.overlong_cache: DAPO's soft length penalty
                overlong = overlong_penalties([r.mask for r in update_rollouts], cfg.ppo.max_new_tokens,
                                              cfg.reward.overlong_cache)
                stats = self.solver.update(update_rollouts, [r.reward + o for r, o in zip(update_rollouts, overlong)],
                                           lr_scale=lr_scale, masks=[r.mask for r in update_rollouts], replay=replay,
                                           groups=[r.task.id for r in update_rollouts])
                if cfg.reward.overlong_cache:
                    stats["overlong_penalty"] = sum(overlong) / len(overlong)
                metrics.update({f"ppo/solver/{k}": D.all_reduce_mean(v) for k, v in stats.items()})
            self._replay_add(train_rollouts, rates_all, step, metrics)
            timing["solver_update_s"] = time.perf_counter() - t0
        if self.generator_learns and proposals:
            # train.generator_advantage=rloo_batch: this rank's proposals are one group, each one's baseline the
            # mean return of the others (different prompts, one policy: the baseline leaves the gradient unbiased)
            one_group = [0] * len(proposals) if t.generator_advantage == "rloo_batch" else None
            stats = self.generator.update([p.answer for p in proposals], g_rewards, lr_scale=lr_scale,
                                          groups=one_group)
            metrics.update({f"ppo/generator/{k}": D.all_reduce_mean(v) for k, v in stats.items()})
        timing["update_s"] += time.perf_counter() - t0

        # 6. corpus and mixer --------------------------------------------------------------------------------
        batch_rates = [r.result.solved for r in train_rollouts]
        solve_rate = D.all_reduce_mean(sum(batch_rates) / max(1, len(batch_rates)))
        n_props = len(flat)
        validity = sum(o.valid for o in outcomes) / n_props if n_props else None
        diversity = proposal_diversity(outcomes)  # among the valid proposals: few valid ones is no repetition
        served = list({x.id: x for x in batch}.values())  # the solver batch's distinct tasks, with their rates
        task_rates = [rates_all[x.id] for x in served if x.id in rates_all]
        procedural_rates = [rates_all[x.id] for x in served if x.id in plan["new_ids"] and x.id in rates_all]
        generator_in_band = in_band_share([o.solve_rate for o in outcomes if o.valid and o.solve_rate is not None])
        drops = edit_drops(groups, valid_generator, rates_all)
        # each mutation proposal's instruction and whether it gave a valid task in band (the mixer's instruction draw)
        instructions = ([(x.instruction, o.valid and in_band(o.solve_rate)) for x, o in zip(flat, outcomes)]
                        if cfg.generator.format == "mutation" else None)
        if self.main:
            new_tasks, difficulty_rows = corpus_updates(valid_generator, batch, plan["new_ids"], rates_all,
                                                        t.samples_per_task, step)
            self.pending_tasks += new_tasks
            self.pending_difficulty += difficulty_rows
            # written now, not at the next checkpoint: which tasks the next iteration sees must not depend on
            # where the checkpoints fell (a run resumed after step N would otherwise see step N's tasks early)
            self._flush_corpus()
            self.source.observe(IterationStats(solve_rate=solve_rate, validity_rate=validity, diversity=diversity,
                                               kl=metrics.get("ppo/solver/kl"), task_rates=task_rates,
                                               procedural_rates=procedural_rates,
                                               generator_in_band=generator_in_band, edit_drops=drops,
                                               instructions=instructions,
                                               proposal_rates={x.id: rates_all[x.id] for x in valid_generator
                                                               if x.id in rates_all}))
        if self.world > 1:  # rank 0's mixer state on every rank, in place (the task source holds this mixer)
            self.mixer.load_state_dict(D.broadcast_object(self.mixer.state_dict() if self.main else None))

        # 7. logs ----------------------------------------------------------------------------------------------
        rewards = [r.reward for r in train_rollouts]
        metrics["solver/pass_rate"] = solve_rate
        # tasks solved (every hidden test passed) by some but not all of their samples: what PPO can learn from
        solver_in_band = in_band_share(task_rates)
        metrics["solver/in_band_rate"] = solver_in_band if solver_in_band is not None else float("nan")
        start = 0  # ... and by where they came from (a draw lists its sources' tasks in the order of its counts)
        for origin, count in plan["counts"].items():
            part = in_band_share([rates_all[x.id] for x in batch[start: start + count] if x.id in rates_all])
            start += count
            if part is not None:
                metrics[f"solver/in_band_rate/{origin}"] = part
        metrics["solver/reward_mean"] = D.all_reduce_mean(statistics.mean(rewards) if rewards else 0.0)
        for name in train_rollouts[0].result.terms if train_rollouts else []:
            metrics[f"solver/reward/{name}"] = D.all_reduce_mean(
                statistics.mean(r.result.terms[name] for r in train_rollouts))
        if self.generates:
            metrics["generator/reward_mean"] = statistics.mean(g_rewards_all) if g_rewards_all else 0.0
            metrics["generator/validity_rate"] = validity if validity is not None else 0.0
            metrics["generator/parse_rate"] = sum(o.parsed for o in outcomes) / max(1, n_props)
            # answers struck by the novelty screen and drawn again, per proposal (generator.redraws)
            metrics["generator/redrawn"] = sum(x.redrawn for x in flat) / max(1, n_props)
            # answers that reached their token limit before their end (train.generator_max_new_tokens)
            metrics["generator/cut_off_rate"] = sum(x.cut_off for x in flat) / max(1, n_props)
            metrics["generator/closed_rate"] = sum(x.closed for x in flat) / max(1, n_props)
            # valid proposals solved by some but not all of the solver's samples
            metrics["generator/in_band_rate"] = generator_in_band if generator_in_band is not None else float("nan")
            metrics["solver/share/generator"] = plan["counts"]["generator"] / max(1, len(batch))
            measured = [o.solve_rate for o in outcomes if o.valid and o.solve_rate is not None]
            metrics["generator/solve_rate_mean"] = statistics.mean(measured) if measured else float("nan")
            # where the valid proposals out of band fall: never solved (too hard) or solved by every sample (too easy)
            for name, end in (("never_solved_rate", 0.0), ("always_solved_rate", 1.0)):
                metrics[f"generator/{name}"] = (sum(r == end for r in measured) / len(measured) if measured
                                                else float("nan"))
            metrics["generator/diversity"] = diversity if diversity is not None else 0.0
            metrics["generator/valid_tasks"] = len(valid_generator)
            rejections = Counter(x.rejection for x in flat if x.rejection)
            for reason, count in rejections.items():
                metrics[f"generator/rejected/{reason}"] = count
        metrics.update(self.source.metrics(step))  # mixer/... in self-play, the schedule's level in curriculum
        for source, count in plan["counts"].items():
            metrics[f"solver/batch/{source}"] = count
        metrics["perf/solver_gen_tokens_per_s"] = gen_tokens / max(1e-9, timing["rollout_s"])
        if timing["solver_update_s"] > 0:
            update_tokens = sum(len(r.prompt) + len(r.tokens) for r in train_rollouts)
            metrics["perf/solver_update_tokens_per_s"] = update_tokens / timing["solver_update_s"]
        if torch.cuda.is_available():
            metrics["perf/gpu_peak_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
        sb1 = self.sb.stats()
        runs, hits = sb1["runs"] - sb0["runs"], sb1["cache_hits"] - sb0["cache_hits"]
        sandbox_s = sb1["exec_s"] - sb0["exec_s"]
        for k, v in timing.items():
            metrics[f"time/{k}"] = v
        metrics["time/sandbox_s"] = sandbox_s
        metrics.update(engine_metrics(self.solver, self.generator))  # time/weight_sync_s, rollout/logprob_gap
        metrics["sandbox/execs_per_s"] = (runs - hits) / sandbox_s if sandbox_s > 0 else 0.0
        metrics["sandbox/cache_hit_rate"] = hits / runs if runs else 0.0
        metrics.update(self._spend({"ppo_episodes": len(train_rollouts) if self.learns else 0,
                                    "solver_episodes": len(rollouts), "solver_tokens": gen_tokens,
                                    "generator_proposals": len(proposals),
                                    # every token it sampled: answers the novelty screen struck and drew again too
                                    "generator_tokens": (self.generator.sampled_tokens - generator_tokens0
                                                         if self.generator is not None else 0),
                                    "sandbox_execs": runs - hits}))
        if self.main:
            self.tb.scalars(metrics, step)
            if t.log_samples_every and step % t.log_samples_every == 0:
                self._log_samples(step, proposals, train_rollouts)
        return metrics

    def _spend(self, spent: dict) -> dict:
        """Add what every rank spent this iteration to the run's totals (`COMPUTE`); their `compute/` scalars."""
        for part in D.gather_objects(spent):
            for key, value in part.items():
                self.compute[key] += int(value)
        return {f"compute/{key}": float(value) for key, value in self.compute.items()}

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

    def _replay_draw(self, step: int):
        """This rank's share of a draw of past successes (prioritised; every rank holds the same buffer and RNG) or
        of the warm start's SFT examples (uniform, a function of the step)."""
        if self.cfg.ppo.replay_coef <= 0:
            return None
        pool = self.replay if self.replay is not None else self._sft_answer_set()
        drawn = pool.sample(self.cfg.ppo.replay_batch * self.world, step)
        return drawn[self.rank:: self.world] if len(drawn) >= self.world else None

    def _sft_answer_set(self) -> AnswerSet:
        """The warm start's SFT examples (the corpus's first rows, which the warm start inserted; later procedural
        tasks also have created_step 0), with their reference answers, tokenized as the warm start tokenized them."""
        if self.sft_answers is None:
            from selfplay.train.warmstart import level_counts, solver_examples, tokenize_pairs
            n_sft = sum(level_counts(self.cfg.warmstart, self.cfg.tasks.max_level).values())
            tasks = self.corpus.query(split="train", order="insertion", limit=n_sft)
            pairs = tokenize_pairs(self.solver, solver_examples(tasks, prompt_options(self.cfg)),
                                   self.cfg.warmstart.max_len)
            if not pairs:
                raise UserError("ppo.replay_source=sft: the corpus holds no warm-start training task to replay")
            self.sft_answers = AnswerSet([ReplayItem(f"sft:{i}", list(p), list(a), 1.0, 1.0, 0)
                                          for i, (p, a) in enumerate(pairs)], seed=self.cfg.run.seed)
            self.log(f"replaying {len(pairs)} warm-start SFT examples (ppo.replay_coef={self.cfg.ppo.replay_coef})")
        return self.sft_answers

    def _replay_add(self, rollouts, rates: dict, step: int, metrics: dict) -> None:
        """Every rank's successful episodes of this iteration into every rank's buffer (after this update's draw)."""
        if self.replay is None:
            return
        for part in D.gather_objects(successes(rollouts, rates, step)):
            for item in part:
                self.replay.add(item)
        metrics["replay/size"] = len(self.replay)

    def _log_samples(self, step: int, proposals, rollouts) -> None:
        for p in proposals[:2]:
            status = "valid" if p.valid else f"rejected: {p.parse_error or p.reasons.get('reason') or p.rejection}"
            self.tb.text("samples/generator", f"**{status}**\n\n```\n{p.answer.text}\n```", step)
        for r in rollouts[:2]:
            head = f"**{r.task.family} L{r.task.level}** passed {r.result.hidden_passed}/{r.result.hidden_total}"
            self.tb.text("samples/solver", f"{head}\n\n{r.task.description}\n\n```python\n{r.result.code}\n```", step)

    # ---- evaluation ---------------------------------------------------------------------------------------
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

    # ---- the run --------------------------------------------------------------------------------------------
    def run(self) -> dict:
        self._install_signal_handlers()
        self.setup()
        t = self.cfg.train
        self._evaluate_missed()
        if self.step >= t.steps:
            self.log(f"run already at step {self.step} of {t.steps}: nothing to do (raise train.steps to continue)")
            return self.summary()
        if self.main and RunPaths(self.run_dir).heldout.exists():  # a split eval.splits names that the run's
            drawn = heldout_tasks(self.run_dir, self.cfg, self.sb, self.corpus)  # held-out file lacks stops here
            note = suite_size_note(drawn, self.cfg)
            if note:
                self.log(note)
        bar = _progress(total=t.steps, initial=self.step, desc=f"self-play ({t.mode})") if self.main else None
        stopped = False
        while self.step < t.steps:
            self.step += 1
            metrics = self.iteration()
            self.history.append(history_entry(self.step, metrics))
            if bar:
                bar.update(1)
                bar.set_postfix(pass_rate=f"{metrics['solver/pass_rate']:.2f}",
                                validity=f"{metrics.get('generator/validity_rate', float('nan')):.2f}")
            last = self.step >= t.steps
            # a stop is answered before the step's periodic evaluation, so that its checkpoint is written within the
            # signal's grace period; the evaluation it skipped runs when the run resumes (_evaluate_missed)
            stopped = self._stop_now()
            # a solver that does not learn is the one step 0 evaluated: its figures are those, not measured again
            if self.learns and t.eval_every and self.step % t.eval_every == 0 and not last and not stopped:
                self._evaluate(self.step)
            if last and self.learns:
                self._evaluate(self.step)
            elif last and self.main:
                self.log("the solver was held at its warm start: its held-out figures are step 0's, not measured again")
            if stopped or last or self.step % t.checkpoint_every == 0:
                self._save(self.step)
            if stopped:
                self.log(f"stop requested: checkpoint step_{self.step} written, exiting")
                break
        if bar:
            bar.close()
        summary = self.summary()
        if self.main and not stopped:
            self._print_summary(summary)
            RunPaths(self.run_dir).summary.write_text(json.dumps(summary, indent=2, sort_keys=True))
        summary["stopped"] = stopped
        return summary

    def summary(self) -> dict:
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

    def _print_summary(self, s: dict) -> None:
        ws = s["warmstart_seconds"]
        took = (f"warm start {ws / 60:.1f} min, " if ws is not None else "") + f"{s['steps']} iterations"
        lines = [f"run {s['run_dir']} ({s['mode']}): {took} (self-play {s['selfplay_seconds'] / 60:.1f} min)"]
        for split in s["heldout_after"]:
            b, a = s["heldout_before"].get(split), s["heldout_after"][split]
            change = s["heldout_change"].get(split)
            paired = (f" ({change['tasks']} tasks; change {change['delta']:+.3f}, 95 % CI "
                      f"[{change['ci95'][0]:+.3f}, {change['ci95'][1]:+.3f}])" if change else "")
            lines.append(f"  held-out {split:<22} greedy pass@1 {_fmt(b)} -> {_fmt(a)}{paired}")
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

    def close(self) -> None:
        self.tb.close()
        self.sb.close()
        self.corpus.close()


def random_edit_rollouts(references: list[list[Task]], sb, *, step: int, rng: random.Random, corpus_index=None,
                         build_cfg=None, instruction_weights=None) -> list[ProposalRollout]:
    """generator.source=random_edits: one proposal per reference group, a random edit of its references
    (`generator.mutation.random_proposal`, with the mixer's instruction weights) in place of the generator's answer,
    then the validity checks a generator's answer meets (`validate_many`, one sandbox batch). The answers hold the
    edit's text and no token: nothing was sampled, nothing is trained on."""
    from generator.build import BuildConfig
    from generator.mutation import random_proposal

    rollouts = []
    for refs in references:
        instruction, text, task = random_proposal(rng, refs, cfg=build_cfg or BuildConfig(),
                                                  weights=instruction_weights, step=step)
        ro = ProposalRollout([], Answer([], [], text, True), list(refs), instruction)
        if isinstance(task, Task):
            ro.task = task
        else:  # no edit found, or one that cannot be made (a held-out program): an impossible edit, as an answer's
            ro.rejection, ro.reasons = "edit", {"reason": task.reason}
        rollouts.append(ro)
    made = [ro for ro in rollouts if ro.task is not None]
    for ro, report in zip(made, validate_many([ro.task for ro in made], sb, corpus_index)):
        ro.task, ro.valid = report.task, report.ok
        if not report.ok:
            ro.rejection, ro.reasons = report.rejection, {"reason": report.reason}
    return rollouts


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
