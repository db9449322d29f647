"""`selfplay bench update ARM [ARM ...]`: one solver PPO update of an iteration's batch, per arm, side by side.

An arm is a config file with optional overrides after colons, e.g. `configs/smol.yaml:model.lora.layers=0`. Each
arm loads its `model:` (the pretrained model, LoRA as configured), builds its `ppo:` trainer and times
`PPOTrainer.step` on the iteration's solver batch (`train.solver_tasks` x `train.samples_per_task` answers, grouped by
task, scores 0/1 drawn from a fixed seed) of `--prompt-len` prompt tokens and `ppo.max_new_tokens` answer tokens
(token ids drawn from the vocabulary, no eos: every answer at full length), `run.torch_threads` threads. Reported per
arm: the first update (it allocates the optimiser's state) and the median of the later ones, their split into the
scoring passes without gradients (old policy, reference) and the optimisation (forward and backward), trainable
parameters, the process's peak memory so far, and each arm's median against the first arm's. The arms run one
after the other in one process: compare them only within one run.

    selfplay bench update configs/smollm2.yaml configs/smol.yaml --repeats 3 --json OUT
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("arms", nargs="+", help="CONFIG[:key=value[:key=value ...]] per arm; the first is the baseline")
    parser.add_argument("--prompt-len", type=int, default=160, help="prompt tokens per answer")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per arm after the first")
    parser.add_argument("--seed", type=int, default=0, help="seed of the token ids and scores")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_arm(arm: str, prompt_len: int, repeats: int, seed: int) -> dict:
    import torch

    from selfplay.models.factory import ActorCritic, attach_lora, frozen_copy, load_model_and_tokenizer, lora_settings
    from selfplay.rl.ppo import PPOTrainer
    from selfplay.runtime.config import load_config

    path, *overrides = arm.split(":")
    cfg = load_config(path, overrides=overrides)
    torch.set_num_threads(cfg.run.torch_threads or torch.get_num_threads())
    policy, tokenizer = load_model_and_tokenizer(
        cfg.model.name_or_path, local_files_only=cfg.model.local_files_only, dtype=cfg.model.dtype
    )
    reference = frozen_copy(policy)  # the warm-started weights: the KL reference (and, with LoRA, the base)
    lora = lora_settings(cfg.model, "solver", n_layers=getattr(policy.config, "num_hidden_layers", None))
    if lora is not None:
        policy = attach_lora(policy, lora)
    model = ActorCritic(policy, cfg.model.value_model)
    trainer = PPOTrainer(model, reference, cfg.ppo, pad_token_id=tokenizer.pad_token_id, seed=seed)

    tasks, samples, answer_len = cfg.train.solver_tasks, cfg.train.samples_per_task, cfg.ppo.max_new_tokens
    gen = torch.Generator().manual_seed(seed)
    vocab = policy.config.vocab_size
    eos = {tokenizer.eos_token_id, tokenizer.pad_token_id}

    def ids(n: int) -> list[int]:
        out = torch.randint(0, vocab, (n,), generator=gen).tolist()
        return [t if t not in eos else (t + 1) % vocab for t in out]

    prompts = [ids(prompt_len) for _ in range(tasks)]
    queries = [prompts[i // samples] for i in range(tasks * samples)]
    groups = [i // samples for i in range(tasks * samples)]

    split = {"scoring_s": 0.0}
    prepare = trainer._prepare

    def timed_prepare(*a, **k):
        t = time.perf_counter()
        try:
            return prepare(*a, **k)
        finally:
            split["scoring_s"] = time.perf_counter() - t

    trainer._prepare = timed_prepare
    times, scoring = [], []
    for _ in range(repeats + 1):
        responses = [ids(answer_len) for _ in queries]
        scores = torch.randint(0, 2, (len(queries),), generator=gen).float().tolist()
        t = time.perf_counter()
        trainer.step(queries, responses, scores, groups=groups)
        times.append(time.perf_counter() - t)
        scoring.append(split["scoring_s"])
    later, later_scoring = times[1:] or times, scoring[1:] or scoring
    median = statistics.median(later)
    tokens = len(queries) * (prompt_len + answer_len)
    return {
        "arm": arm,
        "answers": len(queries),
        "prompt_len": prompt_len,
        "answer_len": answer_len,
        "threads": torch.get_num_threads(),
        "lora_r": cfg.model.lora.r if lora is not None else 0,
        "lora_layers": cfg.model.lora.layers if lora is not None else 0,
        "advantage": cfg.ppo.advantage,
        "epochs": cfg.ppo.epochs,
        "mini_batch_size": cfg.ppo.mini_batch_size,
        "kl_coef": cfg.ppo.kl_coef,
        "kl_metric": cfg.ppo.kl_metric,
        "old_pass_reused": trainer.reuses_forward(len(queries)),
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "first_update_s": times[0],
        "update_s": median,
        "scoring_s": statistics.median(later_scoring),
        "optimise_s": statistics.median(t - s for t, s in zip(later, later_scoring)),
        "updates_s": times,
        "tokens_per_s": tokens / median,
        "process_peak_rss_mb": _rss_mb(),
    }


def run(args: argparse.Namespace) -> int:
    from selfplay.runtime.errors import UserError

    if args.repeats < 0 or args.prompt_len < 1:
        raise UserError("--repeats must be >= 0 and --prompt-len >= 1")
    results = []
    for arm in args.arms:
        print(f"== {arm}", flush=True)
        r = run_arm(arm, args.prompt_len, args.repeats, args.seed)
        results.append(r)
        print(
            f"   {r['answers']} answers x ({r['prompt_len']} + {r['answer_len']}) tokens, {r['threads']} threads, "
            f"lora r={r['lora_r']} layers={r['lora_layers'] or 'all'}, {r['advantage']}, old pass reused: "
            f"{r['old_pass_reused']}, kl_coef {r['kl_coef']}, kl_metric {r['kl_metric']}"
        )
        print(
            f"   update {r['update_s']:.1f} s (scoring {r['scoring_s']:.1f}, optimisation {r['optimise_s']:.1f}; "
            f"first {r['first_update_s']:.1f}), {r['trainable_params'] / 1e6:.2f} M trainable, "
            f"process peak RSS so far {r['process_peak_rss_mb']:.0f} MB",
            flush=True,
        )
    base = results[0]["update_s"]
    print("\n| arm | update s (median) | scoring s | optimisation s | speed vs first |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| `{r['arm']}` | {r['update_s']:.1f} | {r['scoring_s']:.1f} | {r['optimise_s']:.1f} | "
            f"{base / r['update_s']:.2f}x |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
