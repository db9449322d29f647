"""`selfplay bench gpu-check [--tiny] [key=value ...] [--json OUT]`: one prepared check of a GPU machine, each line
PASS or FAIL with its figure, then a JSON of every figure (docs/cluster.md "Checking a GPU machine").

The model is the real Qwen2.5-Coder-1.5B shape (`memory_plan.KNOWN_SHAPES`: hidden 1536, 28 layers, 12 heads / 2 KV
heads, MLP 8960, vocabulary 151,936, tied embeddings, q/k/v biases) with random weights built locally in the
config's dtype on the GPU (no download); `--tiny`: a 2-layer shape of the same layout, for the CPU (the test runs
it, so the check cannot rot). The settings are configs/gpu_1.5b.yaml's (bf16, gradient checkpointing, ZeRO-2,
its `ppo:`) with the check's batch, and on a CPU model.dtype=float32 with the *_cpu.json DeepSpeed configs. One
process; DeepSpeed, where it imports, runs as one rank (RANK=0, WORLD_SIZE=1, a free MASTER_PORT: what torchrun
would set), else plain torch with AdamW (said in the lines). The lines, in order:

- shape: the built model's parameter count against the plan's `ModelShape.params`;
- ppo_step: one `PPOTrainer.step` of --batch answers of --prompt + --answer random tokens through the agent as the
  run builds it (`LMAgent`, wrapped by `distributed.wrap_model`): seconds, peak memory, every stat finite, the
  optimiser steps the engine (or torch optimiser) took, every weight matrix changed;
- plan: `selfplay.runtime.memory_plan`'s bytes for that update (one agent's weights, reference, value head,
  gradients and optimiser states + one micro-batch's activations, as its "update" phase adds them; the reserve
  left out) against the measured allocator peak: the ratio must lie in PLAN_BAND (on a CPU the peak is the RSS
  growth, sampled, and the ratio is shown, not judged);
- weight_sync: `selfplay.rollout.engine.gathered` + `policy_weight_items` (under ZeRO-3 one parameter gathered at
  a time), what a vLLM engine is pushed after each update, copied by name into a stand-in receiver (a second model
  of the shape): max difference 0, every tensor of the receiver loaded;
- generate: `selfplay.rl.ppo.generate` at --gen-batch prompts x --gen-new tokens (eos never drawn): tokens/s, and
  the projected time of an evaluation of --eval-episodes answers of --eval-tokens at that rate;
- checkpoint: `LMAgent.save` then, under DeepSpeed, the weights zeroed and `load_training_state` (the engine's
  checkpoint) restoring them, and the Hugging Face copy read back (`ActorCritic.from_pretrained`): both equal;
- zero3 (DeepSpeed only): a ZeRO-3 engine of the same agent on this one rank, one PPO step, then the weights
  gathered for a push, one parameter at a time (`policy_weight_items`, as the weight sync does): the line gives
  that push's peak, which should stay near what the rank holds (no whole-model gather).

Time on one H100 (80 GB, ~400 TFLOP/s of bf16 at best, ~3 TB/s): building two 1.5 B models on the GPU and the
reference copy, a few seconds; the PPO step on 8 x 512 tokens is 6 x 1.54e9 x 4,096 = 3.8e13 FLOPs of forward and
backward, a third more for checkpointing's recomputation and 2 x 1.3e13 for the old-policy and reference passes:
~9e13 FLOPs, under a second at 30 % of peak, plus DeepSpeed's start (~10-30 s); generate at batch 64 x 128 tokens is
128 sequential steps each reading the 3.1 GB of weights (~1 ms) and launching ~28 x 15 kernels (~10-20 ms): 2-5 s
(tens of seconds at worst); the checkpoint writes and reads ~30 GB (bf16 module and reference, fp32 masters and
AdamW moments, the Hugging Face copy) at ~1 GB/s: about a minute; ZeRO-3's start and step as ZeRO-2's. About 2-3
minutes in all, well inside 9; `wall_s` in the JSON says what it took.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from selfplay.runtime.config import CONFIG_DIR

BASE_CONFIG = CONFIG_DIR / "gpu_1.5b.yaml"

PLAN_BAND = (2 / 3, 1.5)  # measured / planned peak of the PPO step that passes (GPU only)
LINES = ("shape", "ppo_step", "plan", "weight_sync", "generate", "checkpoint", "zero3")
FIRST_TOKEN = 16  # random token ids start above the tokenizer's special tokens (pad, eos, roles)
TOKENIZER_TEXT = ["def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3\n"]


@dataclass(frozen=True)
class Sizes:
    """The check's batch: PPO answers and their lengths, the generation batch, the projected evaluation."""

    batch: int
    prompt: int
    answer: int
    gen_batch: int
    gen_new: int
    eval_episodes: int
    eval_tokens: int  # answer tokens of each projected evaluation episode


FULL = Sizes(
    batch=8, prompt=256, answer=256, gen_batch=64, gen_new=128, eval_episodes=800, eval_tokens=512
)  # configs/gpu_1.5b.yaml's ppo.max_new_tokens
TINY = Sizes(batch=4, prompt=12, answer=12, gen_batch=8, gen_new=8, eval_episodes=800, eval_tokens=12)


@dataclass
class Line:
    """One checked thing: PASS or FAIL, the sentence printed, and its figures for the JSON."""

    name: str
    ok: bool
    text: str
    figures: dict = field(default_factory=dict)

    def show(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name:<11} {self.text}"


# ---------------------------------------------------------------------------- command line


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", default=[], help="key=value overrides of configs/gpu_1.5b.yaml")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer shape of the same layout (CPU, the tests)")
    parser.add_argument("--no-deepspeed", action="store_true", help="plain torch even where DeepSpeed imports")
    parser.add_argument("--batch", type=int, help="PPO answers (default 8; --tiny 4)")
    parser.add_argument("--prompt", type=int, help="prompt tokens per answer (default 256; --tiny 12)")
    parser.add_argument("--answer", type=int, help="answer tokens (default 256; --tiny 12)")
    parser.add_argument("--gen-batch", type=int, help="prompts per generate call (default 64; --tiny 8)")
    parser.add_argument("--gen-new", type=int, help="generated tokens per prompt (default 128; --tiny 8)")
    parser.add_argument("--eval-episodes", type=int, help="answers of the projected evaluation (default 800)")
    parser.add_argument("--eval-tokens", type=int, help="tokens of each of those answers (default 512; --tiny 12)")
    parser.add_argument("--workdir", help="where the checkpoint is written (default: a temporary folder)")
    parser.add_argument("--json", metavar="OUT", help="write every figure as JSON")


def sizes_of(args: argparse.Namespace) -> Sizes:
    from selfplay.runtime.errors import UserError

    base = TINY if args.tiny else FULL
    values = {k: getattr(args, k) if getattr(args, k) is not None else getattr(base, k) for k in Sizes.__annotations__}
    bad = [k for k, v in values.items() if v < 1]
    if bad:
        raise UserError(f"--{bad[0].replace('_', '-')} must be >= 1, got {values[bad[0]]}")
    return Sizes(**values)


def load_check_config(args: argparse.Namespace, sizes: Sizes, cuda: bool, deepspeed: bool):
    """configs/gpu_1.5b.yaml with the check's batch (one optimiser step over it), the device's dtype and DeepSpeed
    configs, then the user's overrides."""
    from selfplay.runtime.config import load_config

    cpu = "" if cuda else "_cpu"
    own = [
        f"model.dtype={'bfloat16' if cuda else 'float32'}",
        f"distributed.deepspeed={str(deepspeed).lower()}",
        f"distributed.zero_config=zero2{cpu}.json",
        f"ppo.mini_batch_size={sizes.batch}",
        f"ppo.micro_batch_size={min(sizes.batch, 4)}",
        "ppo.epochs=1",
        f"ppo.max_new_tokens={sizes.answer}",
    ]
    return load_config(BASE_CONFIG, [*own, *args.overrides])


# ---------------------------------------------------------------------------- memory and time


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Peak:
    """The peak memory of a block in bytes: the CUDA allocator's (everything allocated, not only the block's), or on
    a CPU the process's resident memory, sampled every 2 ms, less `base`."""

    def __init__(self, cuda: bool, base: int = 0):
        self.cuda, self.base, self.bytes = cuda, base, 0
        self._stop = threading.Event()

    def __enter__(self) -> Peak:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.bytes = max(self.bytes, _rss() - self.base)

    def __exit__(self, *exc) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()
            self.bytes = max(self.bytes, _rss() - self.base)


def _resident(cuda: bool, base: int) -> int:
    """Bytes held now: the CUDA allocator's, or the CPU's resident memory less `base`."""
    import torch

    return torch.cuda.memory_allocated() if cuda else _rss() - base


def _sync(cuda: bool) -> None:
    import torch

    if cuda:
        torch.cuda.synchronize()


def _gb(n: float) -> str:
    """Bytes as GB, three significant digits (a tiny model's MB stay visible)."""
    return f"{n / 1e9:.3g} GB"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# ---------------------------------------------------------------------------- the model and the agent


def check_shape(tiny: bool):
    """The plan's record of Qwen2.5-Coder-1.5B, or a tiny shape of the same layout (head size 32)."""
    from selfplay.runtime.memory_plan import KNOWN_SHAPES, ModelShape

    if tiny:
        return ModelShape("tiny qwen2", 64, 128, 2, 2, 1, 512, tied=True, qkv_bias=True, positions=512)
    return KNOWN_SHAPES["qwen2.5-coder-1.5b"]


def build_policy(shape, tokenizer, dtype, device, seed: int):
    """A random-weight Qwen2 causal LM of `shape`, made on `device` in `dtype` (no download)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        **shape.hf_config(),
        max_position_embeddings=shape.positions,
        use_sliding_window=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def single_rank_env() -> None:
    """What torchrun sets for one process, so that `deepspeed.initialize` makes its one-rank group here."""
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
    ):
        os.environ.setdefault(key, value)


def build_agent(cfg, policy, tokenizer):
    """The solver as `selfplay.train.setup.load_agent` builds it: ActorCritic + frozen reference, wrapped by
    `wrap_model` (DeepSpeed engine) where distributed.deepspeed is set, else a plain AdamW."""
    from selfplay.models.agent import LMAgent
    from selfplay.models.factory import ActorCritic, frozen_copy
    from selfplay.runtime import distributed as D

    if cfg.model.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    reference = frozen_copy(policy)
    model = ActorCritic(policy, cfg.model.value_model)
    wrap = None
    if cfg.distributed.deepspeed:
        wrap = lambda m: D.wrap_model(m, cfg.ppo, cfg.distributed, D.DistInfo())  # noqa: E731
    return LMAgent("solver", model, reference, tokenizer, cfg.ppo, wrap=wrap, seed=cfg.run.seed)


def release(*objects) -> None:
    """Destroy the DeepSpeed engine of each agent given, then free what nothing refers to any more (GPU cache)."""
    import torch

    for obj in objects:
        engine = getattr(obj, "model", None)
        if hasattr(engine, "destroy"):
            engine.destroy()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def rollouts(sizes: Sizes, vocab: int, seed: int):
    """Random prompts, answers of exactly `answer` tokens (no special token), 0/1 scores, two answers per task."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tasks = max(1, sizes.batch // 2)
    prompts = torch.randint(FIRST_TOKEN, vocab, (tasks, sizes.prompt), generator=g).tolist()
    queries = [prompts[i % tasks] for i in range(sizes.batch)]
    answers = torch.randint(FIRST_TOKEN, vocab, (sizes.batch, sizes.answer), generator=g).tolist()
    scores = [float(i % 2) for i in range(sizes.batch)]
    return queries, answers, scores, [i % tasks for i in range(sizes.batch)]


def whole(module):
    """A context in which ZeRO-3's partitioned parameters of `module` are whole (a collective); else nothing."""
    params = list(module.parameters())
    if params and hasattr(params[0], "ds_id"):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params)
    return contextlib.nullcontext()


def snapshot(module) -> dict:
    """Every parameter, copied to the CPU in its own dtype."""
    with whole(module):
        return {n: p.detach().to("cpu", copy=True) for n, p in module.named_parameters()}


def differences(module, snap: dict) -> dict:
    """Max |difference| of each parameter from `snap`."""
    with whole(module):
        return {
            n: (p.detach().float() - snap[n].to(p.device).float()).abs().max().item()
            for n, p in module.named_parameters()
        }


def optimizer_steps(agent) -> int:
    """Steps the agent's optimiser took so far: the DeepSpeed engine's count, or torch AdamW's state."""
    engine = agent.model
    if hasattr(engine, "global_steps"):
        return int(engine.global_steps)
    states = agent.trainer.optimizer.state.values()
    return max((int(s["step"]) for s in states if "step" in s), default=0)


# ---------------------------------------------------------------------------- the checks


def line_shape(shape, policy, build_s: float) -> Line:
    built = sum(p.numel() for p in policy.parameters())
    return Line(
        "shape",
        built == shape.params,
        f"{shape.name}: {built / 1e6:.1f} M parameters built, plan's shape {shape.params / 1e6:.1f} M "
        f"({build_s:.1f} s to build)",
        {"params": built, "plan_params": shape.params, "build_s": build_s},
    )


def line_ppo(agent, batch, cuda: bool, base: int, backend: str) -> tuple[Line, int]:
    """One PPO step; returns the line and the measured peak (bytes) for the plan's line."""
    queries, answers, scores, groups = batch
    before, steps0 = snapshot(agent.module), optimizer_steps(agent)
    with Peak(cuda, base) as peak:
        t0 = time.perf_counter()
        stats = agent.trainer.step(queries, answers, scores, groups=groups)
        _sync(cuda)
        seconds = time.perf_counter() - t0
    steps = optimizer_steps(agent) - steps0
    diffs = differences(agent.module, before)
    matrices = [n for n, t in before.items() if t.dim() >= 2]  # (ZeRO-3 partitions are flat)
    unchanged = [n for n in matrices if diffs[n] == 0]
    bad = [k for k, v in stats.items() if isinstance(v, float) and not math.isfinite(v)]
    expected = math.ceil(len(queries) / agent.cfg.mini_batch_size) * agent.cfg.epochs
    ok = not bad and steps == expected and not unchanged
    text = (
        f"{backend}: {seconds:.2f} s, peak {_gb(peak.bytes)}, {len(stats) - len(bad)}/{len(stats)} "
        f"stats finite{' (' + ', '.join(bad) + ')' if bad else ''}, {steps} optimiser step(s) of {expected}, "
        f"{len(matrices) - len(unchanged)}/{len(matrices)} weight matrices changed "
        f"({sum(v > 0 for v in diffs.values())}/{len(diffs)} tensors)"
    )
    figures = {
        "backend": backend,
        "seconds": seconds,
        "peak_gb": peak.bytes / 1e9,
        "optimizer_steps": steps,
        "expected_steps": expected,
        "nonfinite_stats": len(bad),
        "changed_matrices": len(matrices) - len(unchanged),
        "matrices": len(matrices),
        "tokens": len(queries) * (len(queries[0]) + len(answers[0])),
        "loss": float(stats.get("loss", float("nan"))),
    }
    return Line("ppo_step", ok, text, figures), peak.bytes


def planned_update_bytes(cfg, shape, prompt: int) -> dict:
    """The memory plan's bytes for one agent's PPO update on one GPU (its "update" phase's terms for that agent,
    without the other agent and the reserve)."""
    from selfplay.runtime.memory_plan import PlanOptions, agent_state, run_settings, update_activations

    s = run_settings(cfg, PlanOptions(prompt_tokens=prompt))
    st = agent_state(shape, s, "solver", 1)
    parts = {
        "weights": st.weights,
        "reference": st.reference,
        "value_head": st.critic,
        "gradients": st.gradients,
        "optimizer": st.optimizer,
        "activations": update_activations(shape, s, "solver"),
    }
    return {**parts, "total": sum(parts.values())}


def line_plan(cfg, shape, prompt: int, measured: int, cuda: bool) -> Line:
    planned = planned_update_bytes(cfg, shape, prompt)
    ratio = measured / planned["total"] if planned["total"] else float("nan")
    judged = cuda
    ok = _finite(ratio) and ratio > 0 and (not judged or PLAN_BAND[0] <= ratio <= PLAN_BAND[1])
    where = f"within {PLAN_BAND[0]:.2f}-{PLAN_BAND[1]:.2f}" if judged else "CPU: RSS growth, shown, not judged"
    text = (
        f"memory plan {_gb(planned['total'])} for the update (weights {_gb(planned['weights'])}, "
        f"optimiser {_gb(planned['optimizer'])}, activations {_gb(planned['activations'])}), measured "
        f"{_gb(measured)}: ratio {ratio:.2f} ({where})"
    )
    return Line(
        "plan",
        ok,
        text,
        {
            "planned_gb": planned["total"] / 1e9,
            "measured_gb": measured / 1e9,
            "ratio": ratio,
            "judged": judged,
            **{f"planned_{k}_gb": v / 1e9 for k, v in planned.items() if k != "total"},
        },
    )


def push_into(agent, receiver) -> tuple[float, int, int, float]:
    """The agent's weights through the project's gather into `receiver`, copied by name: (seconds, tensors loaded,
    tensors of the receiver, max |difference| after)."""
    import torch

    from selfplay.rollout.engine import gathered, policy_weight_items

    target = receiver.state_dict()  # tied tensors appear under each of their names
    loaded: set[str] = set()
    seconds, diff = 0.0, 0.0
    with gathered(agent), torch.no_grad():
        t0 = time.perf_counter()
        for name, tensor in policy_weight_items(agent):  # under ZeRO-3 each one gathered alone while it is copied
            if name in target:
                target[name].copy_(tensor)
                _sync(tensor.is_cuda)
                seconds += time.perf_counter() - t0
                diff = max(diff, (target[name].float() - tensor.float()).abs().max().item())  # not timed
                loaded.add(name)
                t0 = time.perf_counter()
        seconds += time.perf_counter() - t0
    return seconds, len(loaded), len(target), diff if loaded else 1.0


def line_sync(agent, receiver) -> Line:
    seconds, loaded, total, diff = push_into(agent, receiver)
    ok = loaded == total and diff == 0
    return Line(
        "weight_sync",
        ok,
        f"gathered + policy_weight_items (one parameter at a time) into a stand-in receiver by name: {loaded}/{total} "
        f"tensors loaded, max difference {diff:g}, {seconds:.2f} s",
        {"seconds": seconds, "loaded": loaded, "tensors": total, "max_diff": diff},
    )


def line_generate(agent, sizes: Sizes, cuda: bool, base: int) -> Line:
    import torch

    from selfplay.rl.ppo import generate

    vocab = agent.module.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(FIRST_TOKEN, vocab, (sizes.gen_batch, sizes.prompt), generator=g).tolist()
    kw = dict(pad_token_id=agent.tokenizer.pad_token_id, eos_token_id=vocab + 1, temperature=1.0)  # eos never drawn
    generate(agent.model, prompts, max_new_tokens=2, **kw)  # warm-up (kernels, allocator)
    with Peak(cuda, base) as peak:
        t0 = time.perf_counter()
        samples = generate(agent.model, prompts, max_new_tokens=sizes.gen_new, **kw)
        _sync(cuda)
        seconds = time.perf_counter() - t0
    full = sum(len(s.tokens) == sizes.gen_new for s in samples)
    rate = sizes.gen_batch * sizes.gen_new / seconds
    eval_tokens = sizes.eval_tokens
    projected = sizes.eval_episodes * eval_tokens / rate
    ok = full == len(samples) and _finite(rate) and rate > 0
    return Line(
        "generate",
        ok,
        f"batch {sizes.gen_batch} x {sizes.gen_new} tokens: {rate:.0f} tokens/s, peak "
        f"{_gb(peak.bytes)}, {full}/{len(samples)} answers full; an evaluation of "
        f"{sizes.eval_episodes} episodes x {eval_tokens} tokens: {projected / 60:.1f} min at that rate",
        {
            "tokens_per_s": rate,
            "seconds": seconds,
            "peak_gb": peak.bytes / 1e9,
            "full_answers": full,
            "eval_episodes": sizes.eval_episodes,
            "eval_tokens": eval_tokens,
            "eval_projected_s": projected,
        },
    )


def _folder_gb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e9


def line_checkpoint(agent, folder: Path, dtype) -> Line:
    """Save, then (DeepSpeed) zero the weights and load the engine's checkpoint; read the Hugging Face copy back."""
    import torch

    from selfplay.models.factory import ActorCritic
    from selfplay.rl.ppo import is_deepspeed_engine

    snap = snapshot(agent.module)
    t0 = time.perf_counter()
    agent.save(folder)
    save_s = time.perf_counter() - t0
    deepspeed = is_deepspeed_engine(agent.model)
    if deepspeed:  # the engine's checkpoint holds the weights: they must come back
        with torch.no_grad():
            for p in agent.module.parameters():
                p.zero_()
    steps = optimizer_steps(agent)
    t0 = time.perf_counter()
    agent.load_training_state(folder)  # (plain torch: optimizer.pt and trainer.pt)
    load_s = time.perf_counter() - t0
    engine_diff = max(differences(agent.module, snap).values())
    t0 = time.perf_counter()
    copy = ActorCritic.from_pretrained(folder, dtype=dtype)
    hf_s = time.perf_counter() - t0
    hf_diff = max(differences(copy, snap).values())
    missing = set(snap) - {n for n, _ in copy.named_parameters()}
    ok = engine_diff == 0 and hf_diff == 0 and not missing and optimizer_steps(agent) == steps
    how = (
        f"DeepSpeed checkpoint: weights zeroed then restored (max difference {engine_diff:g}, load {load_s:.1f} s)"
        if deepspeed
        else f"torch optimiser and trainer state reloaded ({load_s:.1f} s)"
    )
    return Line(
        "checkpoint",
        ok,
        f"{how}; Hugging Face copy read back: max difference {hf_diff:g} "
        f"({hf_s:.1f} s); {_folder_gb(folder):.3g} GB written in {save_s:.1f} s",
        {
            "deepspeed": deepspeed,
            "engine_max_diff": engine_diff,
            "hf_max_diff": hf_diff,
            "missing_tensors": len(missing),
            "save_s": save_s,
            "load_s": load_s,
            "hf_load_s": hf_s,
            "written_gb": _folder_gb(folder),
        },
    )


def line_zero3(cfg3, shape, tokenizer, batch, cuda: bool, base: int) -> Line:
    """A ZeRO-3 engine (cfg3's distributed.zero_config) on this one rank: one PPO step, then the whole-model gather
    of a weight push."""
    from selfplay.models.factory import torch_dtype

    dtype, device = torch_dtype(cfg3.model.dtype), "cuda" if cuda else "cpu"
    left = _resident(cuda, base)  # what the ZeRO-2 lines left behind (0 on a GPU when all was freed)
    agent = build_agent(cfg3, build_policy(shape, tokenizer, dtype, device, cfg3.run.seed), tokenizer)
    receiver = None
    try:
        stage = agent.model.zero_optimization_stage()
        ppo, _ = line_ppo(agent, batch, cuda, base, f"ZeRO-{stage}")
        receiver = build_policy(shape, tokenizer, dtype, device, cfg3.run.seed + 1)
        before = _resident(cuda, base)
        with Peak(cuda, base) as peak:
            seconds, loaded, total, diff = push_into(agent, receiver)
    finally:
        release(agent, receiver)
    ok = ppo.ok and stage == 3 and loaded == total and diff == 0
    text = (
        f"one rank ({_gb(left)} held before it), {ppo.text}; push gathered one parameter at a time: "
        f"peak {_gb(peak.bytes)} ({_gb(peak.bytes - before)} over the {_gb(before)} "
        f"held), {loaded}/{total} tensors pushed, max difference {diff:g}, {seconds:.2f} s"
    )
    figures = {
        **{f"step_{k}": v for k, v in ppo.figures.items()},
        "stage": stage,
        "gather": "per parameter",
        "gather_peak_gb": peak.bytes / 1e9,
        "gather_growth_gb": (peak.bytes - before) / 1e9,
        "held_before_gb": left / 1e9,
        "gather_s": seconds,
        "loaded": loaded,
        "tensors": total,
        "max_diff": diff,
    }
    return Line("zero3", ok, text, figures)


# ---------------------------------------------------------------------------- the run


def deepspeed_importable() -> bool:
    try:
        import deepspeed  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install counts as none
        return False
    return True


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"


def guarded(name: str, step) -> Line:
    """`step()`'s line, or a FAIL line with the error's first line."""
    try:
        return step()
    except Exception as exc:  # noqa: BLE001 - every failure is a FAIL line, the others still run
        return Line(name, False, f"error: {first_line(exc)}", {"error": first_line(exc)})


@dataclass
class Setting:
    """What every line of one run shares: the config, the shape, the tokenizer, the batch, where it runs."""

    args: argparse.Namespace
    cfg: object
    shape: object
    sizes: Sizes
    tokenizer: object
    cuda: bool
    base: int  # the CPU's resident bytes before any model (0 on a GPU: the allocator's peak is absolute)
    backend: str

    @property
    def device(self) -> str:
        return "cuda" if self.cuda else "cpu"

    @property
    def dtype(self):
        from selfplay.models.factory import torch_dtype

        return torch_dtype(self.cfg.model.dtype)


def agent_lines(st: Setting, emit) -> None:
    """shape, ppo_step, plan, weight_sync, generate, checkpoint on the agent as the run wraps it; its engine is
    destroyed on return (the caller's `release()` then frees the rest)."""
    shaped = False  # the shape's line is out
    try:
        t0 = time.perf_counter()
        policy = build_policy(st.shape, st.tokenizer, st.dtype, st.device, st.cfg.run.seed)
        emit(line_shape(st.shape, policy, time.perf_counter() - t0))
        shaped = True
        agent = build_agent(st.cfg, policy, st.tokenizer)
    except Exception as exc:  # noqa: BLE001 - no agent: its lines FAIL, naming why
        hint = " (CHECK_ARGS=--no-deepspeed runs them in plain torch)" if st.cfg.distributed.deepspeed else ""
        for name in LINES[int(shaped) : -1]:
            emit(
                Line(
                    name,
                    False,
                    f"not run: the agent was not built: {first_line(exc)}{hint}",
                    {"error": first_line(exc)},
                )
            )
        return
    try:
        batch = rollouts(st.sizes, st.shape.vocab, st.cfg.run.seed)
        measured = [0]

        def ppo() -> Line:
            line, measured[0] = line_ppo(agent, batch, st.cuda, st.base, st.backend)
            return line

        def sync() -> Line:
            receiver = build_policy(st.shape, st.tokenizer, st.dtype, st.device, st.cfg.run.seed + 1)
            try:
                return line_sync(agent, receiver)
            finally:
                del receiver

        emit(guarded("ppo_step", ppo))
        emit(guarded("plan", lambda: line_plan(st.cfg, st.shape, st.sizes.prompt, measured[0], st.cuda)))
        emit(guarded("weight_sync", sync))
        release()
        emit(guarded("generate", lambda: line_generate(agent, st.sizes, st.cuda, st.base)))
        work = st.args.workdir
        with contextlib.nullcontext(work) if work else tempfile.TemporaryDirectory() as work:
            emit(guarded("checkpoint", lambda: line_checkpoint(agent, Path(work) / "checkpoint", st.dtype)))
    finally:
        release(agent)


def zero3_line(st: Setting, emit) -> None:
    """The ZeRO-3 line where DeepSpeed runs, else a SKIP line (which counts as passed)."""
    if st.cfg.distributed.deepspeed:
        cfg3 = load_check_config(st.args, st.sizes, st.cuda, True)
        cfg3.distributed.zero_config = f"zero3{'' if st.cuda else '_cpu'}.json"
        batch = rollouts(st.sizes, st.shape.vocab, st.cfg.run.seed)
        emit(guarded("zero3", lambda: line_zero3(cfg3, st.shape, st.tokenizer, batch, st.cuda, st.base)))
        return
    why = "--no-deepspeed" if st.args.no_deepspeed else "DeepSpeed does not import here"
    emit(Line("zero3", True, f"not run: {why}", {"skipped": True}), verdict="SKIP")


def run_checks(args: argparse.Namespace) -> dict:
    import torch

    from selfplay.models.factory import train_tokenizer
    from selfplay.train.setup import quiet_transformers

    started = time.perf_counter()
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before DeepSpeed is imported
    quiet_transformers()
    sizes = sizes_of(args)
    deepspeed = not args.no_deepspeed and deepspeed_importable()
    if deepspeed:
        single_rank_env()
    cfg = load_check_config(args, sizes, cuda, deepspeed)
    shape = check_shape(args.tiny)
    backend = f"DeepSpeed ZeRO-2 ({cfg.distributed.zero_config})" if deepspeed else "plain torch AdamW (no DeepSpeed)"
    device_name = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"== gpu check: {device_name}, {shape.name}, {cfg.model.dtype}, {backend}", flush=True)
    tokenizer = train_tokenizer(TOKENIZER_TEXT, vocab_size=300)
    from transformers import AutoModelForCausalLM  # noqa: F401 - imported before the CPU's memory baseline

    st = Setting(args, cfg, shape, sizes, tokenizer, cuda, 0 if cuda else _rss(), backend)
    lines: list[Line] = []

    def emit(line: Line, verdict: str = "") -> None:
        lines.append(line)
        print(f"{verdict}  {line.name:<11} {line.text}" if verdict else line.show(), flush=True)

    agent_lines(st, emit)
    release()
    zero3_line(st, emit)
    wall = time.perf_counter() - started
    passed = all(line.ok for line in lines)
    print(
        f"{'PASS' if passed else 'FAIL'}  {'all':<11} {sum(x.ok for x in lines)}/{len(lines)} lines pass in "
        f"{wall:.0f} s",
        flush=True,
    )
    return {
        "device": device_name,
        "shape": shape.name,
        "params": shape.params,
        "dtype": str(cfg.model.dtype),
        "deepspeed": deepspeed,
        "backend": backend,
        "sizes": sizes.__dict__,
        "lines": {x.name: {"ok": x.ok, "text": x.text, **x.figures} for x in lines},
        "passed": passed,
        "wall_s": wall,
    }


def run(args: argparse.Namespace) -> int:
    result = run_checks(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m selfplay.bench.gpu_check", description=__doc__.split("\n")[0])
    configure(parser)
    from selfplay.runtime.errors import UserError

    try:
        return run(parser.parse_args(argv))
    except UserError as exc:  # bad input: one line naming the key, as the `selfplay` command prints it
        parser.exit(2, f"error: {exc}\n")


if __name__ == "__main__":
    raise SystemExit(main())
