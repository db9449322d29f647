"""`selfplay bench rollout [CONFIG] [key=value ...] [--engines hf vllm vllm-child] [--batch N] --json OUT`: the same
prompts through each rollout engine, side by side in one run (docs/engines.md, "One engine per
process").

The model has random weights and a shape: `--shape config` (CONFIG's `model:` section: arch, n_layer, n_embd,
n_head, vocab_size, max_positions) or `--shape llama-135m` (SmolLM2-135M's: 30 layers, 576 wide, 9 heads of 64,
3 KV heads, MLP 1536, vocabulary 49,152, tied embeddings), on `run.torch_threads` threads. Sampling is at
temperature 1 from the distribution the trainer scores (selfplay.rollout.engine). The engines:

- hf: Hugging Face `generate` on the model; every answer has exactly --new tokens (eos never drawn);
- vllm: `VLLMEngine`, the engine in the trainer's process, and vllm-child: `ChildEngine`, the same in a child
  process of its own (the generator's when both agents sample with vLLM), each as the run serves an agent: answers
  through `LMAgent.sample` (they may stop at the tokenizer's eos: the tokens sampled are counted), weight syncs
  through `engine.sync`, what `LMAgent.update` calls (rollout.sync=auto's method in-process, `folder` for the
  child), after every weight changed.

Per engine: engine start (s), time to the first token (a batch of one-token answers, s), generated tokens/s
(median of --repeats), the process's peak memory growth (RSS on CPU, device memory on a GPU); for vLLM the
weight-sync time (s, median of --repeats), this process's RSS growth while the engine lives, a digest of the
greedy answers to the prompts (and whether they are the same after the syncs), and for the child its own RSS now
and at its peak. Then the ratio vllm/hf of tokens/s, and vllm-child/vllm of start, tokens/s and sync with whether
both engines' greedy answers are the same.
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
ENGINES = ("hf", "vllm", "vllm-child")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", default=None, help="config file (default configs/tiny.yaml)")
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],
        help="key=value config overrides (after CONFIG, before the options), e.g. model.n_layer=2",
    )
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], help=f"engines to run: {', '.join(ENGINES)}")
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


def _status_gb(pid: int | str, field: str) -> float:
    """A memory line of /proc/PID/status (VmRSS: resident now, VmHWM: its peak) in GB; 0 where there is none."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20  # KiB
    except OSError:
        pass
    return 0.0


def build_agent(cfg, policy):
    """The bench's `LMAgent` of `policy` (as `gpu_check` builds one, with a small tokenizer: token-id prompts need no
    more) and that tokenizer."""
    from selfplay.bench.gpu_check import TOKENIZER_TEXT
    from selfplay.bench.gpu_check import build_agent as check_agent
    from selfplay.models.factory import train_tokenizer

    tokenizer = train_tokenizer(TOKENIZER_TEXT, vocab_size=300)
    return check_agent(cfg, policy, tokenizer), tokenizer


def bench_served(policy, prompts, new: int, repeats: int, cfg, child: bool) -> dict:
    """A vLLM engine as the run serves an agent, through `LMAgent.sample` and `engine.sync` (what `LMAgent.update`
    calls): `VLLMEngine` in this process, or (`child`) `ChildEngine` in a process of its own. The weights change
    before each timed sync (every tensor x2, then x0.5: exact, so the engine ends on the weights it started with,
    and its greedy answers then are compared with those before). Answers may stop at the tokenizer's eos: tokens/s
    counts the tokens sampled."""
    import hashlib

    import torch
    from omegaconf import OmegaConf

    from selfplay.rollout.engine import VLLMEngine
    from selfplay.rollout.engine_process import ChildEngine

    # the trainer's re-scoring of a few answers (rollout/logprob_gap) is not the engine's time
    cfg = OmegaConf.merge(cfg, {"ppo": {"temperature": 1.0}, "rollout": {"gap_answers": 0}})
    agent, tokenizer = build_agent(cfg, policy)
    rcfg = cfg.rollout
    kwargs = dict(seed=cfg.run.seed, dtype=cfg.model.dtype)
    if cfg.run.torch_threads > 0:  # the child's torch reads it when it starts: the parent's thread count
        os.environ.setdefault("OMP_NUM_THREADS", str(cfg.run.torch_threads))
    with tempfile.TemporaryDirectory(dir=cfg.rollout.sync_dir if os.path.isdir(cfg.rollout.sync_dir) else None) as d:
        policy.save_pretrained(d)
        tokenizer.save_pretrained(d)
        rss0, peak0 = _status_gb("self", "VmRSS"), _memory_gb()
        t0 = time.perf_counter()
        engine = (ChildEngine if child else VLLMEngine)(agent, d, rcfg, **kwargs)
        start = time.perf_counter() - t0
    agent.engine = engine
    try:

        def greedy() -> str:
            answers = agent.sample(prompts, greedy=True, max_new_tokens=new, batch_size=len(prompts))
            return hashlib.sha256(json.dumps([a.tokens for a in answers]).encode()).hexdigest()[:16]

        before = greedy()  # also the warm-up
        t0 = time.perf_counter()
        agent.sample(prompts, max_new_tokens=1, batch_size=len(prompts))
        first = time.perf_counter() - t0
        times, tokens = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            answers = agent.sample(prompts, max_new_tokens=new, batch_size=len(prompts))
            times.append(time.perf_counter() - t0)
            tokens.append(sum(len(a.tokens) for a in answers))
        syncs = []
        for i in range(repeats + repeats % 2):  # an even number: the weights end as they began
            with torch.no_grad():
                for p in policy.parameters():
                    p.mul_(2.0 if i % 2 == 0 else 0.5)
            seconds = engine.sync(agent)
            if i < repeats:
                syncs.append(seconds)
        after = greedy()
        out = {
            "engine_class": type(engine).__name__,
            "start_s": start,
            "first_token_s": first,
            "tokens_per_s": statistics.median(n / t for n, t in zip(tokens, times)),
            "tokens_sampled": tokens,
            "weight_sync_s": statistics.median(syncs),
            "sync_method": engine.sync_method,
            "greedy_digest": before,
            "greedy_kept_after_sync": after == before,
            "rss_growth_gb": _status_gb("self", "VmRSS") - rss0,
            "peak_mem_growth_gb": _memory_gb() - peak0,
        }
        if child:
            out.update(child_rss_gb=_status_gb(engine.pid, "VmRSS"), child_peak_rss_gb=_status_gb(engine.pid, "VmHWM"))
        return out
    finally:
        engine.close()
        agent.engine = None


def run(args: argparse.Namespace) -> int:
    import torch

    from selfplay.runtime.config import load_config
    from selfplay.runtime.errors import UserError

    if args.shape not in SHAPES:
        raise UserError(f"--shape must be one of {', '.join(SHAPES)}, got {args.shape!r}")
    bad = [e for e in args.engines if e not in ENGINES]
    if bad:
        raise UserError(f"--engines takes {', '.join(ENGINES)}, got {', '.join(bad)}")
    if min(args.batch, args.prompt_len, args.new, args.repeats) < 1:
        raise UserError("--batch, --prompt-len, --new and --repeats must be >= 1")
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config:  # no CONFIG, overrides only
        config, overrides = None, [config, *overrides]
    cfg = load_config(config, overrides)
    if cfg.run.torch_threads > 0:
        torch.set_num_threads(cfg.run.torch_threads)
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
            else bench_served(policy, prompts, args.new, args.repeats, cfg, child=name == "vllm-child")
        )
        out["engines"][name] = r
        child = f", child RSS {r['child_rss_gb']:.2f} GB" if "child_rss_gb" in r else ""
        print(
            f"{name:>10}: {r['tokens_per_s']:9.1f} tokens/s, first token {r['first_token_s']:.3f} s, start "
            f"{r['start_s']:.1f} s, peak memory +{r['peak_mem_growth_gb']:.2f} GB{child}, weight sync "
            f"{r['weight_sync_s']:.3f} s"
        )
    engines = out["engines"]
    if {"hf", "vllm"} <= set(engines):
        out["ratio_vllm_hf"] = engines["vllm"]["tokens_per_s"] / engines["hf"]["tokens_per_s"]
        print(f"vllm / hf tokens/s: {out['ratio_vllm_hf']:.2f}x")
    if {"vllm", "vllm-child"} <= set(engines):
        child, own = engines["vllm-child"], engines["vllm"]
        out["ratio_child_vllm"] = {k: child[k] / own[k] for k in ("start_s", "tokens_per_s", "weight_sync_s")}
        out["greedy_same_child_vllm"] = child["greedy_digest"] == own["greedy_digest"]
        print(
            "vllm-child / vllm: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in out["ratio_child_vllm"].items())
            + f"; greedy answers {'identical' if out['greedy_same_child_vllm'] else 'DIFFER'}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0
