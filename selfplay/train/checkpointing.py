"""Where a run starts from and what it leaves behind: `start` resumes from the run folder's latest checkpoint or,
in a folder without one, warm-starts both agents and writes step_0 (`first_checkpoint`); `save` writes
`checkpoints/step_N/` (both agents, every rank's RNG states and the loop's state, `loop_state`), `restore` puts a run
back where a checkpoint left it, and `flush_corpus` writes the tasks and difficulties an iteration queued (before
every checkpoint too, so that the corpus a checkpoint names holds them). `run` is the `SelfPlay` whose state they
write or restore (selfplay/train/loop.py); the layout of a checkpoint is in docs/architecture.md."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from generator.schema import Task
from selfplay.data.corpus import Corpus, CorpusError, check_heldout
from selfplay.models.agent import UNIVERSAL_TAG, zero_shards, zero_universal
from selfplay.runtime import distributed as D
from selfplay.runtime import seeds
from selfplay.runtime.checkpoint import (
    STATE_FILE,
    code_versions,
    reference_home,
    rng_state,
    set_rng_state,
    write_json_atomic,
)
from selfplay.runtime.config import to_dict
from selfplay.train.evaluation import evaluate
from selfplay.train.history import COMPUTE
from selfplay.train.setup import load_agent, progress, reserve_heldout, seed_global_generators, wait_for_checkpoint
from selfplay.train.warmstart import level_counts, warm_start
from selfplay.train.warmstart_ranks import on_every_rank, warm_start_on_ranks


def start(run) -> None:
    """Resume from the run folder's latest checkpoint; without one, rank 0 warm-starts first (under DeepSpeed with
    several ranks every rank takes part: selfplay/train/warmstart_ranks.py)."""
    latest = run.ckpt.latest_checkpoint()
    if latest is None:
        if run.main:
            run.ckpt.clean_partial()
        if run.main or on_every_rank(run.cfg, run.world):
            first_checkpoint(run)
        wait_for_checkpoint(run.ckpt, run.main)
        latest = run.ckpt.latest_checkpoint()
    restore(run, latest)
    if run.step == 0 and "eval_before" not in run.ckpt.load_state(latest):
        evaluate_warm_start(run, latest)
    if run.main:  # no corpus row may be held out (selfplay.data.corpus.check_heldout: stops with the ids)
        check_heldout(run.run_dir, run.corpus.iter_tasks(), run.cfg.tasks, "the corpus at the start of the run")


def first_checkpoint(run) -> None:
    """Rank 0: reserve the held-out tasks (and fixed mode's pool), warm-start both agents and write checkpoint
    step_0 (evaluated after it is loaded back: `evaluate_warm_start`). Under DeepSpeed with several ranks every rank
    comes here and takes part in the SFT; rank 0 alone writes step_0, its `param_checksums` those every rank's
    warm-started weights matched."""
    cfg, t0 = run.cfg, time.perf_counter()
    counts = level_counts(cfg.warmstart, cfg.tasks.max_level)
    run.log(f"no checkpoint in {run.run_dir}: warm start ({sum(counts.values())} tasks)")
    if run.main:
        reserve_heldout(cfg, run.sb, run.corpus, run.run_dir, run.log)  # first: training never sees them
    # each SFT step's loss reaches TensorBoard as it comes
    kw = dict(
        log=run.log, progress=progress, on_scalar=lambda tag, value, i: run.tb.scalars({f"warmstart/{tag}": value}, i)
    )
    if on_every_rank(cfg, run.world):  # DeepSpeed and several ranks: every rank fine-tunes inside its engine
        solver, generator, report = warm_start_on_ranks(cfg, run.run_dir, run.sb, run.corpus, run.info, **kw)
    else:
        solver, generator, report = warm_start(cfg, run.run_dir, run.sb, run.corpus, **kw)
    checksums = report.pop("param_checksums", None)
    if not run.main:
        return
    run.solver, run.generator = solver, generator
    run.tb.scalars({f"warmstart/{k}": v for k, v in report.items()}, 0)
    run.warm_report = report
    run.tb.hparams(flatten(to_dict(cfg)))
    run.warmstart_s = time.perf_counter() - t0
    extra = {"warmstart": report, **({"param_checksums": checksums} if checksums else {})}
    save(run, 0, extra=extra, collective=False)


def evaluate_warm_start(run, folder: Path) -> None:
    """Evaluate the warm start as checkpoint step_0 (`folder`) loaded it, with the configured rollout engine
    (the warm start itself trains and samples with Hugging Face generation, which is slow for a pretrained model),
    and add the results to step_0's state (`eval_before`, and `evals` as every checkpoint keeps them). A run stopped
    before this resumes by measuring it."""
    heldout = evaluate(run, 0)
    if run.main:
        state = run.ckpt.load_state(folder)
        state["eval_before"] = heldout
        state["evals"] = {**state.get("evals", {}), "0": heldout}
        write_json_atomic(folder / STATE_FILE, json.loads(json.dumps(state, default=_jsonable)))


def save(run, step: int, extra: dict | None = None, collective: bool = True) -> None:
    """Checkpoint `step`. collective=False: rank 0 alone (the warm start, while other ranks wait)."""
    sync = D.barrier if collective else (lambda: None)
    if run.main:
        run.ckpt.begin(step)
    sync()
    partial = run.ckpt.root / f"step_{step}.partial"
    for agent in (run.solver, run.generator):
        agent.save(partial / agent.name, write_hf=run.main)
    rngs = D.gather_objects(rng_state()) if collective else [rng_state()]
    checksums = weights_in_sync((run.solver, run.generator), step) if collective and run.world > 1 else {}
    sync()
    if run.main:
        run._flush_corpus()
        state = {"param_checksums": checksums, **loop_state(run, rngs), **(extra or {})}
        run.ckpt.commit(step, json.loads(json.dumps(state, default=_jsonable)))
        run.log(f"checkpoint step_{step} ({len(run.corpus)} tasks in the corpus)")
    sync()


def loop_state(run, rngs: list) -> dict:
    """The loop's part of a checkpoint's state.json (every rank's RNG states in `rngs`)."""
    return {
        "mixer": run.mixer.state_dict(),
        "source": run.source.state_dict(),
        **({"replay": run.replay.buffer.state_dict()} if run.replay.buffer is not None else {}),
        "rng": {str(r): s for r, s in enumerate(rngs)},
        "loop_rng": run.rng.getstate(),
        "history": run.history,
        "compute": run.compute,
        "evals": run.evals,
        "elapsed_s": time.perf_counter() - run.t_start,
        "warmstart_s": run.warmstart_s,
        "corpus_size": len(run.corpus),
        "world_size": run.world,
        "config": to_dict(run.cfg),
        "code": run.code,
    }


def restore(run, folder: Path) -> None:
    """Both agents and the loop's state from checkpoint `folder`."""
    state = run.ckpt.load_state(folder)
    resized(run, folder, int(state.get("world_size", 1)))
    run.solver, run.generator = (load_agent(run.cfg, run.info, folder, name) for name in ("solver", "generator"))
    for agent in (run.solver, run.generator):  # later checkpoints point to the reference this one holds or names
        agent.reference_home = reference_home(folder / agent.name)
    run.step = int(state["step"])
    if "mixer" in state:
        run.mixer.load_state_dict(state["mixer"])
    run.source.load_state_dict(state.get("source", {}))
    if run.replay.buffer is not None and "replay" in state:
        run.replay.buffer.load_state_dict(state["replay"])
    if "rng" in state:
        rngs = state["rng"]
        if str(run.rank) in rngs:
            set_rng_state(rngs[str(run.rank)])
        else:  # a rank the saving run did not have (resumed on more ranks): streams of its own, from the seed
            seed_global_generators(seeds.derive(run.cfg.run.seed, "resized", run.step), run.rank)
            torch.manual_seed(seeds.derive(run.cfg.run.seed, "resized-torch", run.step, run.rank))
        run.rng.setstate(_tuple_state(state["loop_rng"]))
    run.history = state.get("history", [])
    run.compute = {key: int(state.get("compute", {}).get(key, 0)) for key in COMPUTE}  # 0: saved before counted
    run.evals = state.get("evals", {})
    run.t_start = time.perf_counter() - float(state.get("elapsed_s", 0.0))
    run.warmstart_s = state.get("warmstart_s")
    run.code = code_versions(state.get("code"))
    if run.step > 0 or "eval_before" in state:
        run.evals.setdefault("0", state.get("eval_before", {}))
    ahead = len(run.corpus) - int(state.get("corpus_size", len(run.corpus)))
    if ahead > 0:
        run.log(
            f"the corpus holds {ahead} more tasks than when step {run.step} was saved (written by "
            f"iterations lost when the run was killed); they stay, so this resume is not exact"
        )
    run.log(f"loaded {folder} (step {run.step}; {len(run.corpus)} tasks in the corpus)")


def resized(run, folder: Path, saved_world: int) -> None:
    """A checkpoint written by `saved_world` ranks, resumed on another number: say so, and under DeepSpeed say what
    carries over. The weights are whole in every checkpoint (the HF copy; DDP's optimiser.pt is whole too, so a DDP
    run loses nothing); ZeRO's optimiser shards are cut per rank, so rank 0 converts each agent's into DeepSpeed's
    universal checkpoint (`zero_universal`, kept in the checkpoint beside the shards) while the other ranks wait,
    and every rank loads its share of it (LMAgent.load_training_state): the Adam moments, fp32 master weights and
    step counts carry over. Where DeepSpeed cannot convert them the warning names why, and that agent's optimiser
    restarts from the saved weights; the PPO trainer's counters, KL controller and RNG are kept either way."""
    if saved_world == run.world:
        return
    run.log(f"{folder.name} was written by {saved_world} rank(s); resuming on {run.world}")
    sharded = [name for name in ("solver", "generator") if zero_shards(folder / name) not in (0, run.world)]
    if not (run.cfg.distributed.deepspeed and sharded):
        return
    failed: dict[str, str] = {}
    if run.main:
        for name in sharded:
            try:
                zero_universal(folder / name)
            except Exception as exc:  # noqa: BLE001 - named in the warning; that optimiser starts afresh
                failed[name] = f"{type(exc).__name__}: {exc}".strip()
    failed = D.broadcast_object(failed)  # (the other ranks wait here for rank 0's conversion)
    carried = [name for name in sharded if name not in failed]
    if carried:
        run.log(
            f"the ZeRO optimiser states of the {' and '.join(carried)} in {folder.name}, sharded over {saved_world} "
            f"rank(s), load on {run.world} from DeepSpeed's universal checkpoint (<agent>/deepspeed/{UNIVERSAL_TAG}): "
            "their Adam moments, fp32 master weights and step counts carry over"
        )
    for name, why in failed.items():
        run.log(
            f"warning: the ZeRO optimiser states of the {name} in {folder.name} are sharded over {saved_world} "
            f"rank(s) and could not be converted to DeepSpeed's universal checkpoint ({why}): its optimiser (Adam "
            "moments, fp32 master weights, step count) starts afresh from the saved weights; the trainer's counters, "
            "KL controller and RNG are kept"
        )


def flush_corpus(
    corpus: Corpus,
    run_dir: Path,
    tasks_cfg,
    step: int,
    tasks: list[Task],
    difficulty: list[tuple[str, float, int, int]],
) -> None:
    """Queued tasks and measured difficulties into the corpus (each new row checked against the held-out
    programs)."""
    if tasks:
        inserted = corpus.insert_many(tasks)
        check_heldout(
            run_dir, [t for t, r in zip(tasks, inserted) if r.inserted], tasks_cfg, f"the corpus rows of step {step}"
        )
    for task_id, rate, n, measured_at in difficulty:
        try:
            corpus.update_difficulty(task_id, rate, n_samples=n, step=measured_at)
        except CorpusError:  # a task the corpus refused as a duplicate of another: nothing to measure
            pass


def weights_in_sync(agents, step: int) -> dict:
    """Every rank must hold the same weights after an update (replicated under DDP and ZeRO-1/2, gathered from
    the partitions under ZeRO-3). Returns this rank's checksums; raises if ranks differ."""
    mine = {a.name: a.checksum() for a in agents}
    everyone = D.gather_objects(mine)
    for name in mine:
        if len({c[name] for c in everyone}) != 1:
            raise RuntimeError(f"{name} weights differ across ranks at step {step}: {[c[name][:12] for c in everyone]}")
    return mine


def flatten(d: dict, prefix: str = "") -> dict:
    """A nested config as one level of dotted keys (TensorBoard's hparams)."""
    out: dict = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(flatten(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


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
