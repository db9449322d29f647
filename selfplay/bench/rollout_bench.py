"""`selfplay bench rollout [CONFIG] [key=value ...] [--engines hf vllm] [--batch N] --json OUT`: the same prompts
through each rollout engine, side by side in one run (docs/rl.md "Rollout engines").

The model has random weights and a shape: `--shape config` (CONFIG's `model:` section: arch, n_layer, n_embd,
n_head, vocab_size, max_positions) or `--shape llama-135m` (SmolLM2-135M's: 30 layers, 576 wide, 9 heads of 64,
3 KV heads, MLP 1536, vocabulary 49,152, tied embeddings). Every answer has exactly --new tokens (eos never
stops it), sampled at temperature 1 from the distribution the trainer scores (selfplay.rollout.engine).
Per engine: engine start (s), time to the first token (a batch of one-token answers, s), generated tokens/s
(median of --repeats), the process's peak memory growth (RSS on CPU, device memory on a GPU) and, for vLLM, the
weight-sync time (s, median of --repeats pushes of the model's weights, rollout.sync=auto's method); then the
ratio vllm/hf of tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

SHAPES = ("config", "llama-135m")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", default=None, help="config file (default configs/tiny.yaml)")
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],
        help="key=value config overrides (after CONFIG, before the options), e.g. model.n_layer=2",
    )
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], help="engines to run: hf, vllm")
    parser.add_argument("--shape", default="config", help=f"model shape: {' | '.join(SHAPES)}")
    parser.add_argument("--batch", type=int, default=32, help="answers per batch")
    parser.add_argument("--prompt-len", type=int, default=64, help="prompt tokens per answer")
    parser.add_argument("--new", type=int, default=128, help="generated tokens per answer")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (medians are reported)")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON")


def build_policy(cfg, shape: str):
    """A random-weight causal LM of `shape` (see the module's docstring)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.run.seed)
    if shape == "llama-135m":
        return LlamaForCausalLM(
            LlamaConfig(
                hidden_size=576,
                intermediate_size=1536,
                num_hidden_layers=30,
                num_attention_heads=9,
                num_key_value_heads=3,
                vocab_size=49152,
                max_position_embeddings=2048,
                tie_word_embeddings=True,
                bos_token_id=1,
                eos_token_id=2,
                pad_token_id=0,
            )
        )
    m = cfg.model
    ids = dict(vocab_size=m.vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if m.arch == "gpt2":
        return GPT2LMHeadModel(
            GPT2Config(
                n_layer=m.n_layer,
                n_embd=m.n_embd,
                n_head=m.n_head,
                n_positions=m.max_positions,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                **ids,
            )
        )
    return LlamaForCausalLM(
        LlamaConfig(
            hidden_size=m.n_embd,
            intermediate_size=4 * m.n_embd,
            num_hidden_layers=m.n_layer,
            num_attention_heads=m.n_head,
            num_key_value_heads=m.n_head,
            max_position_embeddings=m.max_positions,
            tie_word_embeddings=True,
            **ids,
        )
    )


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _memory_gb() -> float:
    """Memory this process holds at its peak so far (CPU) or the device's memory in use (GPU)."""
    import torch

    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        return (total - free) / 2**30
    return _rss_gb()


def bench_hf(policy, prompts, new: int, repeats: int) -> dict:
    from selfplay.rl.ppo import generate

    vocab = policy.config.vocab_size
    m0 = _memory_gb()
    kw = dict(pad_token_id=0, eos_token_id=vocab + 1, temperature=1.0)  # an eos id never drawn: fixed lengths
    t0 = time.perf_counter()
    generate(policy, prompts, max_new_tokens=1, **kw)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        samples = generate(policy, prompts, max_new_tokens=new, **kw)
        times.append(time.perf_counter() - t0)
        assert all(len(s.tokens) == new for s in samples)
    return {
        "start_s": 0.0,
        "first_token_s": first,
        "tokens_per_s": len(prompts) * new / statistics.median(times),
        "peak_mem_growth_gb": _memory_gb() - m0,
        "weight_sync_s": 0.0,
    }


def bench_vllm(policy, prompts, new: int, repeats: int, cfg) -> dict:
    from selfplay.rollout.engine import llm_kwargs, on_gpu, push_weights, require_vllm

    vllm = require_vllm()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{cfg.rollout.kv_cache_gb:g}")
    with tempfile.TemporaryDirectory(dir=cfg.rollout.sync_dir if os.path.isdir(cfg.rollout.sync_dir) else None) as d:
        policy.save_pretrained(d)
        m0 = _memory_gb()
        t0 = time.perf_counter()
        llm = vllm.LLM(
            **llm_kwargs(d, cfg.rollout, seed=cfg.run.seed, max_len=len(prompts[0]) + new + 1, skip_tokenizer_init=True)
        )
        start = time.perf_counter() - t0
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def run(n):
        return llm.generate(
            batch,
            SamplingParams(
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_tokens=n,
                min_tokens=n,
                ignore_eos=True,
                detokenize=False,
                logprobs=0,
            ),
            use_tqdm=False,
        )

    run(1)  # warm-up (the first call builds the engine's schedules)
    t0 = time.perf_counter()
    run(1)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        outs = run(new)
        times.append(time.perf_counter() - t0)
        assert all(len(o.outputs[0].token_ids) == new for o in outs)
    method = cfg.rollout.sync if cfg.rollout.sync != "auto" else ("load_weights" if on_gpu() else "reload")
    syncs = []
    for _ in range(repeats):
        weights = {k: v.detach() for k, v in policy.state_dict().items()}
        t0 = time.perf_counter()
        push_weights(llm, method, weights, Path(cfg.rollout.sync_dir) / f"selfplay-bench-{os.getpid()}")
        syncs.append(time.perf_counter() - t0)
    return {
        "start_s": start,
        "first_token_s": first,
        "tokens_per_s": len(prompts) * new / statistics.median(times),
        "peak_mem_growth_gb": _memory_gb() - m0,
        "weight_sync_s": statistics.median(syncs),
        "sync_method": method,
    }


def run(args: argparse.Namespace) -> int:
    import torch

    from selfplay.runtime.config import load_config
    from selfplay.runtime.errors import UserError

    if args.shape not in SHAPES:
        raise UserError(f"--shape must be one of {', '.join(SHAPES)}, got {args.shape!r}")
    bad = [e for e in args.engines if e not in ("hf", "vllm")]
    if bad:
        raise UserError(f"--engines takes hf and vllm, got {', '.join(bad)}")
    if min(args.batch, args.prompt_len, args.new, args.repeats) < 1:
        raise UserError("--batch, --prompt-len, --new and --repeats must be >= 1")
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config:  # no CONFIG, overrides only
        config, overrides = None, [config, *overrides]
    cfg = load_config(config, overrides)
    policy = build_policy(cfg, args.shape)
    policy.eval()
    params = sum(p.numel() for p in policy.parameters())
    gen = torch.Generator().manual_seed(cfg.run.seed)
    prompts = torch.randint(3, policy.config.vocab_size, (args.batch, args.prompt_len), generator=gen).tolist()
    out = {
        "shape": args.shape,
        "params_m": params / 1e6,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "engines": {},
    }
    if torch.cuda.is_available():
        policy.to("cuda")
    print(
        f"== {args.shape}: {params / 1e6:.1f} M parameters, batch {args.batch}, {args.prompt_len} prompt + "
        f"{args.new} new tokens"
    )
    for name in args.engines:
        r = (
            bench_hf(policy, prompts, args.new, args.repeats)
            if name == "hf"
            else bench_vllm(
                policy.cpu() if not torch.cuda.is_available() else policy, prompts, args.new, args.repeats, cfg
            )
        )
        out["engines"][name] = r
        print(
            f"{name:>5}: {r['tokens_per_s']:9.1f} tokens/s, first token {r['first_token_s']:.3f} s, start "
            f"{r['start_s']:.1f} s, peak memory +{r['peak_mem_growth_gb']:.2f} GB, weight sync "
            f"{r['weight_sync_s']:.3f} s"
        )
    if {"hf", "vllm"} <= set(out["engines"]):
        out["ratio_vllm_hf"] = out["engines"]["vllm"]["tokens_per_s"] / out["engines"]["hf"]["tokens_per_s"]
        print(f"vllm / hf tokens/s: {out['ratio_vllm_hf']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0
