"""What a training run settles around its iterations: the config checks, the process's global seeds, a run folder
every rank sees, the sandbox, the held-out reservation before a warm start, each agent as a checkpoint holds it,
and the stop request the loop answers at each stage boundary of an iteration.

None of them draws from the run's named RNG streams, so they leave an exact resume as they found it.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

import sandbox
from generator.rewards import check_closed_invalid, check_learnability
from sandbox.files import owner_dir
from selfplay.eval.evaluate import heldout_tasks
from selfplay.models.agent import LMAgent, agent_ppo_config, load_agent_parts
from selfplay.models.factory import is_lora, lora_settings
from selfplay.rollout.engine import refuse_without_vllm
from selfplay.rollout.engines import make_engine
from selfplay.runtime import distributed as D
from selfplay.runtime import seeds
from selfplay.runtime.checkpoint import CheckpointManager
from selfplay.runtime.errors import UserError
from selfplay.train.mixer import Mixer
from selfplay.train.sources import RESERVED_TASKS_FILE, reserve_fixed_pool
from selfplay.train.sources import validate as validate_task_choice

REPLAY_SOURCES = ("successes", "sft")  # ppo.replay_source


def validate_config(cfg) -> None:
    """Refuse, before anything is built, a config the loop cannot run (sizes that do not split over the ranks,
    unknown reward or replay choices, a mixer that cannot be made)."""
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
        raise UserError(f"ppo.replay_source must be one of {', '.join(REPLAY_SOURCES)}, got {cfg.ppo.replay_source!r}")
    refuse_without_vllm(cfg.rollout)


def quiet_transformers() -> None:
    """Keep the run's output readable: no per-file progress bars or padding advice from transformers."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def seed_global_generators(seed: int, rank: int) -> None:
    """Seed python's and numpy's global generators, for any library that draws from them (the project's own draws
    use named streams), so that two runs of one command save the same states; a checkpoint saves and restores
    them with torch's."""
    random.seed(seeds.derive(seed, "python-global", rank))
    np.random.seed(seeds.derive(seed, "numpy-global", rank) % 2**32)


def progress(**kwargs) -> tqdm:
    """A progress bar on stderr, as wide as the terminal."""
    return tqdm(dynamic_ncols=True, file=sys.stderr, **kwargs)


def local_world() -> int:
    """The number of ranks on this node."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def check_shared_storage(run_dir: Path, rank: int) -> None:
    """Every rank must see the run folder rank 0 writes to (checkpoints and the corpus live there).

    Rank 0 creates the folder and a probe file with a fresh random name; every rank looks for that file (a
    same-named folder on a node's local disk cannot hold it). Rank 0's own failure to create the folder is
    sent to every rank, so each one stops with the same message instead of waiting on the others."""
    main = rank == 0
    token, error = os.urandom(8).hex(), None
    if main:
        try:
            owner_dir(run_dir)  # the corpus, checkpoints, traces: readable by their owner only
            (run_dir / f".rank_probe_{token}").write_text(str(os.getpid()))
        except OSError as exc:
            error = f"run.dir {run_dir} cannot be written by rank 0 on {os.uname().nodename}: {exc}"
    token, error = D.broadcast_object((token, error) if main else None)
    if error:
        raise UserError(error)
    probe = run_dir / f".rank_probe_{token}"
    oks = D.gather_objects((rank, probe.exists(), os.uname().nodename))
    bad = [f"rank {r} on {host}" for r, good, host in oks if not good]
    if main:
        probe.unlink(missing_ok=True)
    if bad:
        raise UserError(
            f"run.dir {run_dir} is not visible from {', '.join(bad)}: rank 0 on "
            f"{os.uname().nodename} wrote a file there that they cannot see; put run.dir on "
            f"storage every node shares"
        )


def sandbox_workers(cfg) -> int:
    """One sandbox worker per CPU this rank may use (its affinity: SLURM's --cpus-per-task), shared by the node's
    ranks, unless `sandbox.workers` says how many."""
    return cfg.sandbox.workers or max(1, sandbox.usable_cpus() // max(1, local_world()))


def open_run_sandbox(cfg, workers: int) -> sandbox.Sandbox:
    """The run's sandbox. A policy that can read hidden tests or the host would learn to: an unisolated sandbox is
    refused unless `sandbox.allow_unisolated`."""
    sb = sandbox.open_sandbox(
        cfg.sandbox.backend,
        workers=workers,
        timeout_s=cfg.sandbox.timeout_s,
        memory_mb=cfg.sandbox.memory_mb,
        cache=cfg.sandbox.cache,
        **({"cache_path": cfg.sandbox.cache_path} if cfg.sandbox.cache_path else {}),
        **({"trace_path": cfg.sandbox.trace_path} if cfg.sandbox.trace_path else {}),
        **({"image": cfg.sandbox.image} if cfg.sandbox.backend == "docker" else {}),
    )
    try:
        sb.require_isolation(allow=cfg.sandbox.allow_unisolated)
    except sandbox.SandboxConfigError as exc:
        sb.close()
        raise UserError(str(exc)) from None
    return sb


def wait_for_checkpoint(ckpt: CheckpointManager, main: bool) -> None:
    """Ranks other than 0 wait (polling the file system, not a collective) while rank 0 warm-starts."""
    if main:
        D.barrier()
        return
    while ckpt.latest_checkpoint() is None:
        time.sleep(2.0)
    D.barrier()


def reserve_heldout(cfg, sb, corpus, run_dir: Path, log: Callable[[str], None]) -> None:
    """Before the warm start fills the corpus: the held-out tasks, their programs reserved in the corpus so that
    training never sees them, and fixed mode's pool where `train.fixed_source=reserved`."""
    heldout = heldout_tasks(run_dir, cfg, sb, corpus)
    log(
        f"held-out tasks: {', '.join(f'{s} {len(ts)}' for s, ts in heldout.items())} "
        f"({corpus.reserved_count()} programs reserved)"
    )
    if cfg.train.fixed_source == "reserved":
        pool = reserve_fixed_pool(cfg, sb, corpus, run_dir)
        log(f"fixed mode's pool: {len(pool)} tasks reserved before the SFT corpus -> {run_dir / RESERVED_TASKS_FILE}")


def load_agent(cfg, info: D.DistInfo, folder: Path, name: str) -> LMAgent:
    """The agent `name` ("solver" or "generator") of checkpoint `folder`: weights, reference, tokenizer and
    training state, wrapped for DeepSpeed/DDP where the run is, at the config's learning rate."""
    wrap = None
    if cfg.distributed.deepspeed or info.world_size > 1:
        wrap = lambda m: D.wrap_model(m, cfg.ppo, cfg.distributed, info)  # noqa: E731
    model, reference, tokenizer = load_agent_parts(folder / name, cfg.model.dtype, cfg.model.value_model)
    n_layers = getattr(model.config, "num_hidden_layers", None)
    if (lora_settings(cfg.model, name, n_layers=n_layers) is not None) != is_lora(model.policy):
        had = "has a LoRA adapter" if is_lora(model.policy) else "has no LoRA adapter"
        raise UserError(
            f"model.lora: the {name}'s checkpoint in {folder} {had}, the config says "
            "otherwise; LoRA is chosen at the warm start (keep its model.lora settings or start a "
            "new run.dir)"
        )
    device = D.local_device(info.local_rank)  # one GPU per rank; DeepSpeed/DDP keep it there
    model.to(device)
    reference.to(device)
    agent = LMAgent(name, model, reference, tokenizer, agent_ppo_config(cfg, name), wrap=wrap, seed=cfg.run.seed)
    agent.load_training_state(folder / name)
    if name == "generator" and cfg.generator.constrained:  # refused here if it cannot compile
        agent.constrain(cfg.generator.format, cfg.generator.close_reserve)
    agent.set_learning_rate(cfg.ppo.lr * cfg.agents[name].lr_scale)  # the config's, not the one the optimiser saved
    agent.engine = make_engine(cfg, agent, folder / name, rank=info.rank)  # rollout.engine's
    return agent


class StopRequest:
    """A request to stop: SIGUSR1/SIGTERM, or the file named by $SELFPLAY_STOP_FILE (slurm/selfplay.sh writes it on
    preemption). The loop asks at each stage boundary of an iteration (`now`, with the stage's name); a request
    any rank received stops every rank. `since` is when the request was made (the signal's arrival, or
    the stop file's modification time), so that the loop can say how long it took to answer."""

    def __init__(self, main: bool, log: Callable[[str], None]):
        self.main, self.log = main, log
        self.requested = False
        self.since: float | None = None  # wall-clock time of the request (time.time())
        self.answered: str | None = None  # the stage boundary where the loop first saw it

    def install(self) -> None:
        """Answer SIGUSR1 and SIGTERM by requesting a stop (where signals can be handled: the main thread)."""
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            try:
                signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread (e.g. inside a test runner thread)
                pass

    def _on_signal(self, signum, _frame) -> None:
        if not self.requested:
            self.requested, self.since = True, time.time()
        self.log(
            f"signal {signal.Signals(signum).name}: will checkpoint the last completed step at the next stage "
            "boundary and stop (a periodic evaluation due is left for the resume)"
        )

    def now(self, stage: str = "") -> bool:
        """Whether to stop now: a collective (every rank asks at the same point, `stage` names it), true on every
        rank when any rank was asked (a signal reaches the ranks at slightly different moments: they must agree)."""
        stop_file = os.environ.get("SELFPLAY_STOP_FILE")
        if not self.requested and stop_file:
            try:
                self.since = Path(stop_file).stat().st_mtime
                self.requested = True
            except OSError:
                pass
        asked = [since for requested, since in D.gather_objects((self.requested, self.since)) if requested]
        if asked and not self.requested:
            self.requested, self.since = True, min((s for s in asked if s is not None), default=None)
        if self.requested and self.answered is None:
            self.answered = stage or "an iteration"
        return self.requested

    def waited_s(self) -> float:
        """Seconds since the request was made (0 without one)."""
        return max(0.0, time.time() - self.since) if self.since is not None else 0.0
