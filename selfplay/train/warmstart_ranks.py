"""The warm start under DeepSpeed on every rank (`distributed.deepspeed` with several ranks): the behaviour cloning of
selfplay/train/warmstart.py with each agent's weights, gradients and optimiser states partitioned over the ranks as
the RL loop partitions them, so that a model whose SFT does not fit one GPU gets past its warm start.

1. rank 0 draws the procedural corpus (into the corpus, as without DeepSpeed) and writes both agents' SFT pairs;
   they are broadcast to every rank (`broadcast_object`), so every rank fine-tunes on the same examples;
2. one agent after the other (so that one agent's optimiser states exist at a time), every rank builds it from the
   `model:` section (rank 0 first: a tiny model is built into the run folder, then loaded by the others; the value
   head, the only freshly drawn weights, is rank 0's on every rank) and wraps its policy in a DeepSpeed engine with
   `distributed.zero_config`'s ZeRO stage and mixed precision (bf16/fp16 with DeepSpeed's fp32 masters), and the
   SFT's own optimiser settings (`engine_config`: AdamW as `sft` runs it, lr `warmstart.lr`, clipping at 1);
   `sft_engine` runs `sft`'s steps with each batch split over the ranks (`rank_batching`: each rank its share, in
   micro-batches of `warmstart.micro_batch_size`, gradients accumulated to the whole batch), the same loss
   (`answer_loss`, normalised by the batch's answer tokens) and learning-rate schedule (`lr_at`);
3. the trained policy is consolidated one parameter at a time (`gathered_one_by_one`: under ZeRO-3 a parameter is
   gathered alone, copied to rank 0's CPU and released) into rank 0's plain copy of the model; every rank's
   checksum of the weights it trained (gathered likewise) must equal that copy's, else the warm start stops; the
   engine and its optimiser states are then freed before the next agent is built;
4. rank 0 makes each agent's KL reference as the plain warm start does (a frozen copy of the warm-started policy:
   the run loads it as the loop builds its reference under DeepSpeed, a frozen copy beside the partitioned
   policy, or with LoRA the policy with its fresh adapter off, since step_0's reference is byte for byte its
   policy) and returns both agents, on its CPU, for checkpoint step_0, which it writes alone
   (selfplay/train/checkpointing.py): the same layout as the plain warm start's, which `selfplay train` loads.

The optional generator probe and critic pretraining (`warmstart.generator_probe`, `warmstart.critic_steps`) run on
rank 0 afterwards, each agent moved whole to its GPU for them, as without DeepSpeed. One process under DeepSpeed keeps
the plain warm start (nothing to partition: its fp32 masters are `sft`'s `MasterWeights`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch

from selfplay.models.agent import LMAgent, agent_ppo_config
from selfplay.models.factory import build_models, frozen_copy
from selfplay.rl.sft import MAX_GRAD_NORM, WEIGHT_DECAY, rank_batching, sft_engine
from selfplay.rollout.episodes import prompt_options
from selfplay.runtime import distributed as D
from selfplay.runtime import seeds
from selfplay.train.warmstart import (
    after_sft,
    generator_examples,
    level_counts,
    sft_report,
    solver_examples,
    tokenize_pairs,
    warmstart_corpus,
)

SFT_BETAS = (0.9, 0.999)  # torch's AdamW defaults, as `sft` steps


def on_every_rank(cfg, world: int) -> bool:
    """Whether the warm start runs on every rank inside DeepSpeed engines (DeepSpeed and several ranks)."""
    return bool(cfg.distributed.deepspeed) and world > 1


def engine_config(cfg, world: int) -> dict:
    """The DeepSpeed config of one agent's SFT: `distributed.zero_config` (its ZeRO stage, mixed precision and
    buckets, as the RL loop runs) with the warm start's batch split over `world` ranks (`rank_batching`) and the
    SFT's optimiser: AdamW at `warmstart.lr` (the schedule sets it each step), `sft`'s weight decay, betas and
    gradient clipping."""
    ws = cfg.warmstart
    micro, passes = rank_batching(ws.batch_size, ws.micro_batch_size, world)
    batch = SimpleNamespace(
        micro_batch_size=micro,
        mini_batch_size=micro * passes,
        max_grad_norm=MAX_GRAD_NORM,
        lr=ws.lr,
        weight_decay=WEIGHT_DECAY,
    )
    ds = D.load_deepspeed_config(cfg.distributed.zero_config)
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        ds[key] = "auto"  # the SFT's batch, not the PPO one a config may spell out
    ds["gradient_clipping"] = "auto"
    ds = D.fill_deepspeed_config(ds, batch, world)
    ds["optimizer"] = {
        "type": "AdamW",
        "params": {
            **ds.get("optimizer", {}).get("params", {}),
            "lr": ws.lr,
            "weight_decay": WEIGHT_DECAY,
            "betas": list(SFT_BETAS),
        },
    }
    ds.pop("scheduler", None)  # lr_at, set by sft_engine
    return ds


def start_engine(policy: torch.nn.Module, ds_config: dict):
    import os

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    trainable = [p for p in policy.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=policy, model_parameters=trainable, config=ds_config)
    return engine


def _build(cfg, run_dir, texts, name: str, info: D.DistInfo):
    """(ActorCritic, rank 0's plain copy of the policy or None, tokenizer) on this rank's CPU, rank 0 first (a tiny
    model is built into the run folder once, then loaded); the value head is rank 0's on every rank."""
    made = None
    for turn in (True, False):
        if info.is_main == turn:
            torch.manual_seed(seeds.derive(cfg.run.seed, "warmstart-build", name))
            made = build_models(cfg.model, run_dir, texts, seed=cfg.run.seed, agent=name)
        D.barrier()
    model, copy, tokenizer = made
    head = D.broadcast_object(model.value_head.state_dict() if info.is_main else None)
    model.value_head.load_state_dict(head)
    return model, (copy if info.is_main else None), tokenizer


def consolidate(policy: torch.nn.Module, into: torch.nn.Module | None) -> None:
    """Copy `policy`'s weights (an engine's module; under ZeRO-3 partitioned) into `into` (rank 0's plain copy;
    None on the other ranks), one parameter gathered at a time. A collective: every rank calls it."""
    target = into.state_dict(keep_vars=True) if into is not None else {}
    with torch.no_grad():
        for name, t in D.gathered_one_by_one(policy.state_dict(keep_vars=True).items()):
            if into is not None:
                target[name].data.copy_(t)


def fine_tune(
    cfg, run_dir, info: D.DistInfo, name: str, pairs, steps: int, texts, on_step: Callable[[int, float], None] | None
) -> tuple[LMAgent | None, list[float], int, str]:
    """One agent's SFT on every rank inside a DeepSpeed engine: (rank 0's plain agent with the consolidated
    weights and its reference, None elsewhere; the losses; the number of examples; the checksum of the weights,
    which every rank's matched)."""
    ws = cfg.warmstart
    model, plain, tokenizer = _build(cfg, run_dir, texts, name, info)
    # (an agent for its tokenisation only: the policy stands in for the reference it does not use)
    examples = tokenize_pairs(
        LMAgent(name, model, model.policy, tokenizer, agent_ppo_config(cfg, name)), pairs, ws.max_len
    )
    losses: list[float] = []
    policy = model.policy
    if steps > 0:
        policy.requires_grad_(True)
        policy.to(D.local_device(info.local_rank))
        engine = start_engine(policy, engine_config(cfg, info.world_size))
        losses = sft_engine(
            engine,
            examples,
            steps=steps,
            batch_size=ws.batch_size,
            lr=ws.lr,
            pad_id=tokenizer.pad_token_id,
            max_len=ws.max_len,
            seed=cfg.run.seed,
            micro_batch_size=ws.micro_batch_size,
            rank=info.rank,
            world=info.world_size,
            on_step=on_step,
        )
    else:
        engine = None
    if plain is not None:
        plain.requires_grad_(True)
    consolidate(policy, plain)
    trained = D.param_checksum(model)["sha256"]  # (a collective under ZeRO-3)
    if engine is not None:
        engine.destroy()
    del engine, policy
    out = None
    if info.is_main:
        model.policy = plain
        plain.train(False)
        out = LMAgent(
            name, model, frozen_copy(plain), tokenizer, agent_ppo_config(cfg, name), seed=cfg.run.seed
        )  # the KL anchor of PPO is the warm-started policy
        mine = D.param_checksum(model)["sha256"]
    else:
        mine = None
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    everyone = D.gather_objects(trained)
    written = D.broadcast_object(mine)
    if len(set(everyone)) != 1 or everyone[0] != written:
        raise RuntimeError(
            f"the {name}'s warm-started weights differ across ranks or from rank 0's consolidated copy: "
            f"{[c[:12] for c in everyone]} vs {str(written)[:12]}"
        )
    return out, losses, len(examples), written


def warm_start_on_ranks(
    cfg,
    run_dir,
    sb,
    corpus,
    info: D.DistInfo,
    *,
    log: Callable[[str], None] = print,
    progress=None,
    on_scalar: Callable[[str, float, int], None] | None = None,
):
    """`warm_start` on every rank (`on_every_rank`): (solver, generator, report) on rank 0, the agents on its CPU
    with their weights consolidated; (None, None, report) on the others. The report's `param_checksums` are the
    agents' checksums, which every rank's weights matched."""
    from generator.build import BuildConfig, BuildStats

    t0 = time.perf_counter()
    ws = cfg.warmstart
    tasks, made = [], None
    if info.is_main:
        stats = BuildStats()
        counts = level_counts(ws, cfg.tasks.max_level)
        bar = progress(total=sum(counts.values()), desc="procedural tasks") if progress else None
        on_batch = (lambda new, _s: bar.update(len(new))) if bar else None
        tasks = warmstart_corpus(cfg, sb, corpus, stats, on_batch=on_batch)
        if bar:
            bar.close()
        log(f"warm start: {len(tasks)} procedural tasks ({stats.tasks_per_s:.0f}/s, {stats.attempted} drawn)")
        s_pairs = solver_examples(tasks, prompt_options(cfg), cfg.mixer, sb, cfg.run.seed)
        g_pairs = generator_examples(
            tasks,
            cfg.train.references,
            cfg.run.seed,
            cfg.generator.format,
            sb,
            corpus,
            BuildConfig.from_config(cfg.tasks),
        )
        log(f"warm start: {len(g_pairs)} {cfg.generator.format}-format generator examples")
        made = (s_pairs, g_pairs, len(tasks), stats.seconds)
    s_pairs, g_pairs, n_tasks, task_gen_s = D.broadcast_object(made)
    texts = [x for pair in s_pairs + g_pairs for x in pair]
    report: dict = {"tasks": n_tasks, "task_gen_s": task_gen_s, "sft_ranks": info.world_size}
    sums: dict[str, str] = {}
    agents = []
    for name, pairs, steps in (("solver", s_pairs, ws.solver_steps), ("generator", g_pairs, ws.generator_steps)):
        bar = progress(total=steps, desc=f"SFT {name} ({info.world_size} ranks)") if progress and info.is_main else None
        t1 = time.perf_counter()

        def on_step(i: int, loss: float, name: str = name, bar=bar) -> None:
            if bar:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
            if on_scalar is not None and info.is_main:
                on_scalar(f"{name}_sft_loss", loss, i)

        agent, losses, n_examples, sums[name] = fine_tune(cfg, run_dir, info, name, pairs, steps, texts, on_step)
        if bar:
            bar.close()
        agents.append(agent)
        report[f"{name}_sft_examples"] = n_examples
        sft_report(
            report, name, steps, losses, time.perf_counter() - t1, log, f" on {info.world_size} ranks (DeepSpeed)"
        )
    solver, generator = agents
    if info.is_main:
        if cfg.generator.constrained:
            generator.constrain(cfg.generator.format, cfg.generator.close_reserve)
        after_sft(cfg, solver, generator, tasks, sb, corpus, report, log, device=D.local_device(info.local_rank))
    report["seconds"] = time.perf_counter() - t0
    report["param_checksums"] = sums
    return solver, generator, report
