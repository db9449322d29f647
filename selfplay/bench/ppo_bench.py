"""`selfplay bench ppo`: tokens/s of batched generation and of one PPO update on the tiny default shape.

Runs `bench` once per `--threads` value and prints the medians; with several values it also prints the speed ratio
against the first. `bench` builds the tiny shape's policy and trainer (selfplay/rl/ppo.py) and times `generate` and
`PPOTrainer.step` on random prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=16, help="sequences per rollout batch")
    parser.add_argument("--prompt-len", type=int, default=64, help="prompt tokens per sequence")
    parser.add_argument("--response-len", type=int, default=64, help="sampled tokens per sequence")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (medians are reported)")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[0], help="torch intra-op threads to compare (0 = torch's default)"
    )
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON")


def run(args: argparse.Namespace) -> int:
    from selfplay.runtime.errors import UserError

    if min(args.batch, args.prompt_len, args.response_len, args.repeats) < 1 or args.batch < 2:
        raise UserError("--batch must be >= 2 and --prompt-len, --response-len, --repeats >= 1")
    results = []
    for threads in args.threads:
        print(f"== threads={threads or 'default'}")
        results.append(bench(args.batch, args.prompt_len, args.response_len, args.repeats, threads=threads))
    for r in results[1:]:
        ratio = r["ppo_step_tokens_per_s"] / results[0]["ppo_step_tokens_per_s"]
        print(f"ppo step speed, threads={r['threads']} vs threads={results[0]['threads']}: {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def bench(
    batch: int = 16, prompt_len: int = 64, response_len: int = 64, repeats: int = 3, seed: int = 0, threads: int = 0
) -> dict:
    """Throughput of generation and of one PPO update on the tiny default shape (4 layers, 128 wide, vocab 2000).

    Prints medians; returns them. Response length is fixed (eos suppressed) so every repeat does the same work.
    threads: torch intra-op threads (0 = torch's default); on a busy machine 1 thread is often faster.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from selfplay.models.factory import ActorCritic, frozen_copy
    from selfplay.rl.ppo import PPOTrainer, generate
    from selfplay.runtime.config import PPOConfig

    if threads:
        torch.set_num_threads(threads)

    torch.manual_seed(seed)
    vocab = 2000
    policy = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=vocab,
            n_layer=4,
            n_embd=128,
            n_head=4,
            n_positions=512,
            bos_token_id=1,
            eos_token_id=1,
            pad_token_id=0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    )
    model, ref = ActorCritic(policy), frozen_copy(policy)
    cfg = PPOConfig(mini_batch_size=batch // 2, micro_batch_size=batch // 2)
    trainer = PPOTrainer(model, ref, cfg, pad_token_id=0, seed=seed)
    prompts = torch.randint(1, vocab, (batch, prompt_len)).tolist()
    gen_s, upd_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        samples = generate(model, prompts, pad_token_id=0, eos_token_id=vocab + 1, max_new_tokens=response_len)
        gen_s.append(time.perf_counter() - t0)
        responses = [s.tokens for s in samples]
        scores = [float(s.tokens[0] % 2) for s in samples]
        t0 = time.perf_counter()
        trainer.step(prompts, responses, scores)
        upd_s.append(time.perf_counter() - t0)
    tokens = batch * response_len
    result = {
        "batch": batch,
        "prompt_len": prompt_len,
        "response_len": response_len,
        "epochs": cfg.epochs,
        "threads": torch.get_num_threads(),
        "generate_s_median": statistics.median(gen_s),
        "update_s_median": statistics.median(upd_s),
        "generate_tokens_per_s": tokens / statistics.median(gen_s),
        "update_tokens_per_s": tokens / statistics.median(upd_s),
        "ppo_step_tokens_per_s": tokens / (statistics.median(gen_s) + statistics.median(upd_s)),
    }
    for k, v in result.items():
        print(f"{k:>24}: {v:.3f}" if isinstance(v, float) else f"{k:>24}: {v}")
    return result
