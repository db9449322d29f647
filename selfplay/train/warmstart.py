"""Warm start of both agents by behaviour cloning (docs/architecture.md), the first stage of every run.

1. procedural training tasks (levels 1..max) are generated, validated in the sandbox and stored in the corpus;
2. the tokenizer and the tiny models are built from those texts (or a pretrained model is loaded: same path);
3. the solver is fine-tuned on (task prompt -> reference solution), the generator on (K references +
   instruction -> the task written as a proposal);
4. each agent's frozen reference (the KL anchor of PPO) is a copy of its warm-started policy;
5. optional critic pretraining (`warmstart.critic_steps` > 0): the solver attempts a few training tasks k times,
   the answers are graded in the sandbox, and the value head is regressed (MSE) on the discounted outcome with the
   policy frozen, so PPO starts with a critic that knows roughly how likely a task is to be solved.

`selfplay warmstart` runs this alone; `selfplay train` runs it when the run folder has no checkpoint yet.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence

import torch

from generator.formats import proposal_format
from generator.schema import Task
from selfplay.models.agent import LMAgent, agent_ppo_config
from selfplay.models.factory import build_models, frozen_copy
from selfplay.rl import core as rl
from selfplay.rl.ppo import first_action, last_index, pad_rollouts
from selfplay.rl.sft import sft
from selfplay.rollout.episodes import prompt_options, solver_rollouts
from selfplay.runtime.config_parts import engine_key, engine_name
from selfplay.runtime.distributed import local_device
from selfplay.runtime.errors import UserError
from selfplay.train.proposals import sample_proposals
from solver.prompts import answer_text, task_prompt


def solver_examples(
    tasks: Sequence[Task], prompt_kw: dict | None = None, mixer_cfg=None, sb=None, seed: int = 0
) -> list[tuple[str, str]]:
    """(user prompt, answer text) pairs: the solver writes the reference solution. When `mixer_cfg.kinds` names a
    kind besides the program kind, each task is asked in a kind drawn in the kinds' shares (Mixer.draw_kinds, seeded
    by `seed`) and answered rightly there (solver.kinds.kind_examples; the references run in the sandbox `sb`)."""
    from selfplay.train.mixer import Mixer
    from solver.kinds import kind_examples

    mixer = Mixer(mixer_cfg, seed=seed) if mixer_cfg is not None else None
    if mixer is None or not mixer.asks_kinds:
        return [(task_prompt(t, **(prompt_kw or {})), answer_text(t.reference_solution)) for t in tasks]
    examples = kind_examples(tasks, mixer.draw_kinds(len(tasks), step=0), sb, prompt_kw=prompt_kw)
    return [(e.prompt, e.answer) for e in examples]


def generator_examples(
    tasks: Sequence[Task], k_refs: int, seed: int, fmt: str = "free", sb=None, corpus_index=None, build_cfg=None
) -> list[tuple[str, str]]:
    """The generator's (user prompt, answer text) pairs in format `fmt` (its `examples`: free, `free_examples`,
    each task written as a proposal from K others of its family; mutation, `mutation_examples`, random edits of
    K references that pass every validity check in `sb` against `corpus_index`)."""
    return proposal_format(fmt).examples(tasks, k_refs, seed, sb=sb, corpus_index=corpus_index, build_cfg=build_cfg)


def sft_settings(cfg) -> dict:
    """The SFT's keyword arguments from `warmstart:` (and the run's seed): the warm start's and the probes' one
    reading of them."""
    ws = cfg.warmstart
    return dict(
        batch_size=ws.batch_size, lr=ws.lr, max_len=ws.max_len, seed=cfg.run.seed, micro_batch_size=ws.micro_batch_size
    )


def tokenize_pairs(agent: LMAgent, pairs: Sequence[tuple[str, str]], max_len: int):
    """(prompt ids, answer ids + eos) per pair. Pairs whose answer takes more than half of `max_len` are dropped:
    cut to fit, they would teach answers without their prompt."""
    tok = agent.tokenizer
    out = []
    for prompt, answer in pairs:
        ans = list(tok(answer, add_special_tokens=False)["input_ids"]) + [agent.eos_ids[0]]
        if len(ans) > max_len // 2:
            continue
        ids = agent.chat_ids(prompt)
        out.append((ids[-(max_len - len(ans)) :], ans))
    return out


def build_agents(cfg, run_dir, texts: Sequence[str] | None, wrap=None, device: torch.device | None = None):
    """(solver, generator) LMAgents built from the `model:` section (tiny models are built from `texts`), on
    `device` (default: this rank's GPU when there is one, else the CPU)."""
    device = device or local_device()
    agents = []
    for name in ("solver", "generator"):
        engine = engine_name(cfg.rollout, name)
        # vLLM loads the merged weights of a LoRA policy
        merges = f"{engine_key(cfg.rollout, name)}={engine}" if engine == "vllm" else None
        model, reference, tokenizer = build_models(
            cfg.model, run_dir, texts, seed=cfg.run.seed, agent=name, engine_key=merges
        )
        model.to(device)
        reference.to(device)
        agents.append(
            LMAgent(name, model, reference, tokenizer, agent_ppo_config(cfg, name), wrap=wrap, seed=cfg.run.seed)
        )
    if cfg.generator.constrained:  # the probe samples under the format's grammar (SFT itself is not sampled)
        agents[1].constrain(cfg.generator.format, cfg.generator.close_reserve)
    return agents


def critic_batch(rollouts: Sequence, pad_id: int, gamma: float, device: torch.device | str = "cpu"):
    """Padded rollouts (anything with .prompt, .tokens, .mask, .reward) and their per-token discounted returns
    (the reward on the last action token), on the shifted axis from the first action position, on `device`."""
    ids, att, act = pad_rollouts(
        [r.prompt for r in rollouts], [r.tokens for r in rollouts], pad_id, [r.mask for r in rollouts]
    )
    start, act = first_action(act)
    rewards = torch.zeros_like(act)
    rewards[torch.arange(len(rollouts)), last_index(act)] = torch.tensor([float(r.reward) for r in rollouts])
    returns = rl.discounted_returns(rewards, act, gamma)
    return ids.to(device), att.to(device), start, act.to(device), returns.to(device)


def _squared_errors(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of squared value errors over the action tokens, their count) for one `critic_batch`."""
    ids, att, start, act, returns = batch
    _, values = model(ids, att, logits_to_keep=ids.shape[1] - start)
    err = (values[:, :-1].float() - returns) ** 2
    return rl.masked_sum(err, act), act.sum()


def critic_value_loss(model, rollouts: Sequence, *, pad_id: int, gamma: float, batch_size: int = 16) -> float:
    """Token-mean squared error of the value head against the discounted outcome over `rollouts`."""
    total, count, device = 0.0, 0.0, next(model.parameters()).device
    with torch.no_grad():
        for i in range(0, len(rollouts), batch_size):
            s, n = _squared_errors(model, critic_batch(rollouts[i : i + batch_size], pad_id, gamma, device))
            total, count = total + s.item(), count + n.item()
    return total / max(count, 1.0)


def pretrain_critic(
    model, rollouts: Sequence, *, steps: int, batch_size: int, lr: float, pad_id: int, gamma: float = 1.0, seed: int = 0
) -> dict:
    """Regress the value head (and a separate critic backbone, if any) of an ActorCritic on the outcomes of graded
    rollouts for `steps` AdamW steps; the policy is frozen. Returns the value loss (MSE) before and after."""
    if not rollouts:
        raise ValueError("critic pretraining needs at least one rollout")
    critic = list(model.value_head.parameters()) + (list(model.critic.parameters()) if model.critic is not None else [])
    device = next(model.parameters()).device
    frozen = [p for p in model.policy.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    was_training = model.training
    model.train(False)
    try:
        before = critic_value_loss(model, rollouts, pad_id=pad_id, gamma=gamma, batch_size=batch_size)
        optimizer = torch.optim.AdamW(critic, lr=lr, weight_decay=0.0)
        rng, order, losses = random.Random(seed), [], []
        for _ in range(steps):
            if len(order) < batch_size:
                order += rng.sample(range(len(rollouts)), len(rollouts))
            idx, order = order[:batch_size], order[batch_size:]
            s, n = _squared_errors(model, critic_batch([rollouts[i] for i in idx], pad_id, gamma, device))
            loss = s / n.clamp(min=1.0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        for p in critic:
            p.grad = None
        after = critic_value_loss(model, rollouts, pad_id=pad_id, gamma=gamma, batch_size=batch_size)
    finally:
        for p in frozen:
            p.requires_grad_(True)
        model.train(was_training)
    return {"before": before, "after": after, "losses": losses}


def critic_warm_start(cfg, solver: LMAgent, tasks: Sequence[Task], sb) -> dict:
    """Sample `critic_samples` answers on `critic_tasks` training tasks, grade them, pretrain the solver's critic."""
    ws = cfg.warmstart
    chosen = random.Random(cfg.run.seed).sample(list(tasks), min(ws.critic_tasks, len(tasks)))
    t0 = time.perf_counter()
    rollouts = solver_rollouts(
        solver,
        chosen,
        ws.critic_samples,
        sb,
        max_turns=cfg.train.max_turns,
        reward_cfg=cfg.reward,
        max_prompt_tokens=ws.max_len,
        prompt_kw=prompt_options(cfg),
    )
    result = pretrain_critic(
        solver.module,
        rollouts,
        steps=ws.critic_steps,
        batch_size=ws.batch_size,
        lr=ws.critic_lr,
        pad_id=solver.tokenizer.pad_token_id,
        gamma=cfg.ppo.gamma,
        seed=cfg.run.seed,
    )
    return {
        "solver_critic_episodes": len(rollouts),
        "solver_critic_solve_rate": sum(r.result.solved for r in rollouts) / max(1, len(rollouts)),
        "solver_critic_loss_before": result["before"],
        "solver_critic_loss_after": result["after"],
        "solver_critic_s": time.perf_counter() - t0,
    }


def probe_generator(cfg, generator: LMAgent, tasks: Sequence[Task], sb, corpus) -> dict:
    """Sample `warmstart.generator_probe` proposals as training would (K random references from `tasks`, the
    configured format, prompt budget and temperature), parse and validate them against the corpus: the warm-started
    generator's parse and validity rates, and the first rejection reasons."""
    from collections import Counter

    rng = random.Random(f"probe:{cfg.run.seed}")
    pool = proposal_format(cfg.generator.format).reference_pool(tasks)
    groups = [rng.sample(pool, min(cfg.train.references, len(pool))) for _ in range(cfg.warmstart.generator_probe)]
    t0 = time.perf_counter()
    rollouts = sample_proposals(cfg, generator, groups, sb, corpus, step=0, rng=rng)
    n = max(1, len(rollouts))
    rejections = Counter(r.rejection for r in rollouts if not r.valid)
    return {
        "generator_probe_proposals": len(rollouts),
        "generator_probe_parse_rate": sum(r.parsed for r in rollouts) / n,
        "generator_probe_validity_rate": sum(r.valid for r in rollouts) / n,
        "generator_probe_redrawn": sum(r.redrawn for r in rollouts) / n,
        "generator_probe_cut_off_rate": sum(not r.answer.finished for r in rollouts) / n,  # hit the token limit
        "generator_probe_closed_rate": sum(r.answer.closed > 0 for r in rollouts) / n,  # generator.close_reserve
        **{f"generator_probe_rejected_{k}": v / n for k, v in rejections.items()},
        "generator_probe_s": time.perf_counter() - t0,
    }


def level_counts(ws, max_level: int = 4) -> dict:
    """{level (None = a mix of levels 1..max_level): tasks to draw} for the warm-start corpus, from `warmstart`."""
    if not ws.level_tasks:
        return {None: ws.tasks}
    counts = list(ws.level_tasks)
    if len(counts) > max_level or any(n < 0 for n in counts) or sum(counts) == 0:
        raise UserError(
            f"warmstart.level_tasks must be 1 to {max_level} (tasks.max_level) counts >= 0 for levels 1, "
            f"2, ..., not all 0; got {counts}"
        )
    return {level: n for level, n in enumerate(counts, start=1) if n > 0}


def warmstart_corpus(cfg, sb, corpus, stats=None, on_batch=None) -> list[Task]:
    """The warm start's procedural training tasks, drawn (after the held-out ones) and inserted into `corpus`."""
    from generator.build import BuildConfig, generate_tasks

    ws = cfg.warmstart
    build_cfg = dataclasses.replace(
        BuildConfig.from_config(cfg.tasks), max_level=min(ws.max_level, cfg.tasks.max_level)
    )
    tasks: list[Task] = []
    # each level's tasks enter the corpus before the next level is drawn, so no program appears twice
    for level, n in level_counts(ws, cfg.tasks.max_level).items():
        new = generate_tasks(
            n,
            level=level,
            split="train",
            seed=cfg.run.seed,
            sb=sb,
            corpus_index=corpus,
            cfg=build_cfg,
            stats=stats,
            on_batch=on_batch,
        )
        corpus.insert_many(new)
        tasks += new
    return tasks


def sft_report(report: dict, name: str, steps: int, losses: list[float], seconds: float, log, how: str = "") -> None:
    """One agent's SFT into `report` (its first loss, the mean of its last 20, its seconds) and the log (`how`: where
    it ran, e.g. " on 2 ranks (DeepSpeed)")."""
    if losses:  # steps=0: the model as it came (e.g. a pretrained model evaluated before any SFT)
        report[f"{name}_sft_loss_first"] = losses[0]
        report[f"{name}_sft_loss_last"] = sum(losses[-20:]) / len(losses[-20:])
    report[f"{name}_sft_s"] = seconds
    log(
        f"warm start: {name} SFT {steps} steps{how}"
        + (f", loss {losses[0]:.3f} -> {report[name + '_sft_loss_last']:.3f}" if losses else " (the model as it came)")
    )


def after_sft(cfg, solver: LMAgent, generator: LMAgent, tasks, sb, corpus, report: dict, log, device=None) -> None:
    """The warm start's optional generator probe and critic pretraining (`warmstart.generator_probe`,
    `warmstart.critic_steps`), their figures into `report`; `device`: where an agent kept on the CPU
    (selfplay/train/warmstart_ranks.py) is moved for them, and back after."""
    ws = cfg.warmstart
    if ws.generator_probe > 0:
        if device is not None:
            generator.module.to(device)
        report.update(probe_generator(cfg, generator, tasks, sb, corpus))
        mode = ", constrained" if generator.constraint is not None else ""
        log(
            f"warm start: generator ({cfg.generator.format} format{mode}) on {ws.generator_probe} proposals: parse "
            f"rate {report['generator_probe_parse_rate']:.3f}, validity rate "
            f"{report['generator_probe_validity_rate']:.3f}"
        )
        if generator.constraint is not None:  # the same weights and references without the grammar, for comparison
            constraint, generator.constraint = generator.constraint, None
            try:
                free = probe_generator(cfg, generator, tasks, sb, corpus)
            finally:
                generator.constraint = constraint
            report.update({k.replace("generator_probe_", "generator_probe_unconstrained_"): v for k, v in free.items()})
            log(
                f"warm start: the same without the grammar: parse rate {free['generator_probe_parse_rate']:.3f}, "
                f"validity rate {free['generator_probe_validity_rate']:.3f}"
            )
        if device is not None:
            generator.module.to("cpu")
    if ws.critic_steps > 0:
        if device is not None:
            solver.module.to(device)
        report.update(critic_warm_start(cfg, solver, tasks, sb))
        log(
            f"warm start: solver critic {ws.critic_steps} steps on {report['solver_critic_episodes']} graded "
            f"episodes (solved {report['solver_critic_solve_rate']:.2f}), value loss "
            f"{report['solver_critic_loss_before']:.4f} -> {report['solver_critic_loss_after']:.4f}"
        )
        if device is not None:
            solver.module.to("cpu")


def warm_start(
    cfg,
    run_dir,
    sb,
    corpus,
    *,
    log: Callable[[str], None] = print,
    progress=None,
    on_scalar: Callable[[str, float, int], None] | None = None,
) -> dict:
    """Generate the procedural corpus, build and fine-tune both agents. Returns (solver, generator, report).
    `on_scalar(tag, value, step)`: each SFT step's loss as it comes (`solver_sft_loss`, `generator_sft_loss`), so a
    long warm start shows its curve while it runs. Rank 0 alone, in plain torch; under DeepSpeed with several ranks
    the warm start is `warm_start_on_ranks` (selfplay/train/warmstart_ranks.py) instead."""
    from generator.build import BuildConfig, BuildStats

    t0 = time.perf_counter()
    ws = cfg.warmstart
    stats = BuildStats()
    counts = level_counts(ws, cfg.tasks.max_level)
    bar = progress(total=sum(counts.values()), desc="procedural tasks") if progress else None
    tasks = warmstart_corpus(cfg, sb, corpus, stats, on_batch=(lambda new, _s: bar.update(len(new))) if bar else None)
    if bar:
        bar.close()
    log(f"warm start: {len(tasks)} procedural tasks ({stats.tasks_per_s:.0f}/s, {stats.attempted} drawn)")

    s_pairs = solver_examples(tasks, prompt_options(cfg), cfg.mixer, sb, cfg.run.seed)
    g_pairs = generator_examples(
        tasks, cfg.train.references, cfg.run.seed, cfg.generator.format, sb, corpus, BuildConfig.from_config(cfg.tasks)
    )
    log(f"warm start: {len(g_pairs)} {cfg.generator.format}-format generator examples")
    texts = [x for pair in s_pairs + g_pairs for x in pair]
    solver, generator = build_agents(cfg, run_dir, texts)

    report = {"tasks": len(tasks), "task_gen_s": stats.seconds}
    for agent, pairs, steps in ((solver, s_pairs, ws.solver_steps), (generator, g_pairs, ws.generator_steps)):
        examples = tokenize_pairs(agent, pairs, ws.max_len)
        report[f"{agent.name}_sft_examples"] = len(examples)
        bar = progress(total=steps, desc=f"SFT {agent.name}") if progress else None
        t1 = time.perf_counter()

        def on_step(i: int, loss: float, name: str = agent.name, bar=bar) -> None:
            if bar:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
            if on_scalar is not None:
                on_scalar(f"{name}_sft_loss", loss, i)

        losses = sft(
            agent.module.policy,
            examples,
            steps=steps,
            pad_id=agent.tokenizer.pad_token_id,
            on_step=on_step,
            **sft_settings(cfg),
        )
        if bar:
            bar.close()
        # the KL anchor of PPO is the warm-started policy
        agent.reference = frozen_copy(agent.module.policy)
        agent.trainer.ref_model = agent.reference
        sft_report(report, agent.name, steps, losses, time.perf_counter() - t1, log)
    after_sft(cfg, solver, generator, tasks, sb, corpus, report, log)
    report["seconds"] = time.perf_counter() - t0
    return solver, generator, report
