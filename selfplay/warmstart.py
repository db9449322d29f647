"""Warm start of both agents by behaviour cloning (seed article §4.1), the first stage of every run.

1. procedural training tasks (levels 1..max) are generated, validated in the sandbox and stored in the corpus;
2. the tokenizer and the tiny models are built from those texts (or a pretrained model is loaded: same path);
3. the solver is fine-tuned on (task prompt -> reference solution), the generator on (K references +
   instruction -> the task written as a proposal);
4. each agent's frozen reference (the KL anchor of PPO) is a copy of its warm-started policy.

`selfplay warmstart` runs this alone; `selfplay train` runs it when the run folder has no checkpoint yet.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from typing import Callable, Sequence

from generator.agent import build_prompt, format_proposal
from generator.schema import Task
from selfplay.agent import LMAgent
from selfplay.models import build_models, frozen_copy
from selfplay.rollout import prompt_options
from selfplay.sft import sft
from solver.prompts import answer_text, task_prompt


def solver_examples(tasks: Sequence[Task], prompt_kw: dict | None = None) -> list[tuple[str, str]]:
    """(user prompt, answer text) pairs: the solver writes the reference solution."""
    return [(task_prompt(t, **(prompt_kw or {})), answer_text(t.reference_solution)) for t in tasks]


def generator_examples(tasks: Sequence[Task], k_refs: int, seed: int) -> list[tuple[str, str]]:
    """(user prompt, answer text) pairs: given K other tasks of the same family, the generator writes a task.
    The instruction names what relates the target to its references (same family: mutate; a deeper pipeline:
    harder)."""
    rng = random.Random(seed)
    by_family: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by_family[t.family].append(t)
    out = []
    for t in tasks:
        pool = [r for r in by_family[t.family] if r.id != t.id]
        refs = rng.sample(pool, min(k_refs, len(pool))) if pool else []
        deeper = refs and t.level > max(r.level for r in refs)
        out.append((build_prompt(refs, "harder" if deeper else "mutate"), format_proposal(t)))
    return out


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
        out.append((ids[-(max_len - len(ans)):], ans))
    return out


def build_agents(cfg, run_dir, texts: Sequence[str] | None, wrap=None):
    """(solver, generator) LMAgents built from the `model:` section (tiny models are built from `texts`)."""
    agents = []
    for name in ("solver", "generator"):
        model, reference, tokenizer = build_models(cfg.model, run_dir, texts, seed=cfg.run.seed)
        agents.append(LMAgent(name, model, reference, tokenizer, cfg.ppo, wrap=wrap, seed=cfg.run.seed))
    return agents


def warm_start(cfg, run_dir, sb, corpus, *, log: Callable[[str], None] = print, progress=None) -> dict:
    """Generate the procedural corpus, build and fine-tune both agents. Returns (solver, generator, report)."""
    from generator.build import BuildConfig, BuildStats, generate_tasks

    t0 = time.perf_counter()
    ws = cfg.warmstart
    stats = BuildStats()
    bar = progress(total=ws.tasks, desc="procedural tasks") if progress else None
    tasks = generate_tasks(ws.tasks, split="train", seed=cfg.run.seed, sb=sb, corpus_index=corpus,
                           cfg=BuildConfig.from_config(cfg.tasks), stats=stats,
                           on_batch=(lambda new, _s: bar.update(len(new))) if bar else None)
    if bar:
        bar.close()
    corpus.insert_many(tasks)
    log(f"warm start: {len(tasks)} procedural tasks ({stats.tasks_per_s:.0f}/s, {stats.attempted} drawn)")

    s_pairs = solver_examples(tasks, prompt_options(cfg))
    g_pairs = generator_examples(tasks, cfg.train.references, cfg.run.seed)
    texts = [x for pair in s_pairs + g_pairs for x in pair]
    solver, generator = build_agents(cfg, run_dir, texts)

    report = {"tasks": len(tasks), "task_gen_s": stats.seconds}
    for agent, pairs, steps in ((solver, s_pairs, ws.solver_steps), (generator, g_pairs, ws.generator_steps)):
        examples = tokenize_pairs(agent, pairs, ws.max_len)
        report[f"{agent.name}_sft_examples"] = len(examples)
        bar = progress(total=steps, desc=f"SFT {agent.name}") if progress else None
        t1 = time.perf_counter()
        losses = sft(agent.module.policy, examples, steps=steps, batch_size=ws.batch_size, lr=ws.lr,
                     pad_id=agent.tokenizer.pad_token_id, max_len=ws.max_len, seed=cfg.run.seed,
                     on_step=(lambda i, loss: (bar.update(1), bar.set_postfix(loss=f"{loss:.3f}"))) if bar else None)
        if bar:
            bar.close()
        # the KL anchor of PPO is the warm-started policy
        agent.reference = frozen_copy(agent.module.policy)
        agent.trainer.ref_model = agent.reference
        report[f"{agent.name}_sft_loss_first"] = losses[0]
        report[f"{agent.name}_sft_loss_last"] = sum(losses[-20:]) / len(losses[-20:])
        report[f"{agent.name}_sft_s"] = time.perf_counter() - t1
        log(f"warm start: {agent.name} SFT {steps} steps, loss {losses[0]:.3f} -> {report[agent.name + '_sft_loss_last']:.3f}")
    report["seconds"] = time.perf_counter() - t0
    return solver, generator, report
