"""Memory plan of a run before it starts: per GPU and per phase, the bytes each part of the run holds there.

`plan_memory(cfg, cluster)` reads a config (`load_config`), the model's shape (its folder's config.json when there is
one, else `KNOWN_SHAPES`), the DeepSpeed JSON named by `distributed.zero_config` and a cluster shape, and returns a
`MemoryPlan`: for each phase the bytes per GPU of the policy weights, the references, the value head (or separate
critic), the gradients, the optimiser states, the activations, Hugging Face generation, the vLLM engines and a fixed
reserve, its total against the GPU's memory, and a verdict naming the config keys whose change makes it fit.
Pure arithmetic: nothing here imports torch (`refuse_if_it_cannot_fit` does, inside, on the GPU only).

Phases, as the code runs them (selfplay/train/, selfplay/models/agent.py, selfplay/rollout/engine.py):
- "warm start", under DeepSpeed with several ranks (selfplay/train/warmstart_ranks.py): every rank, one agent at a
  time, its policy inside a DeepSpeed engine with `distributed.zero_config`'s stage and mixed precision, partitioned
  as in the update (`warm_start_on_ranks`: weights, gradients, fp32 masters and moments of every weight, the SFT
  trains them all, LoRA or not) and one micro-batch of the rank's share of the SFT batch (`sft_rows_per_rank`); the
  value head and rank 0's consolidated copies and references stay on the CPUs, the engine is freed before the next
  agent is built. Otherwise rank 0 alone, before any checkpoint: `build_agents` puts both policies and both
  references on its GPU (plain torch, nothing partitioned), and `sft` trains every weight of one agent at a time
  with torch's AdamW (`sft_state_bytes`: a bf16/fp16 model through fp32 master weights, fp32 gradients and fp32
  moments; an fp32 model, its gradients and moments) on micro-batches of `warmstart.micro_batch_size` sequences;
  `sft` frees its gradients and states before the next agent's. The peak: 2 policies + 2 references + one agent's
  SFT gradients and states + one micro-batch's activations. The held-out evaluation at step 0 (Hugging Face
  generation, the SFT optimiser gone) is the phase's other moment; the larger one is shown. A rank-0 warm start
  whose weights and SFT states alone exceed the GPU says that it needs the warm start under DeepSpeed
  (`WARM_START_NEEDS`);
- "load": every rank, from the checkpoint: the solver already wrapped by DeepSpeed (its ZeRO partitions made) and its
  vLLM engine started, the generator loaded whole (DeepSpeed partitions it only in `deepspeed.initialize`);
- "rollout": every rank samples its share of the answers: both agents' weights, references and optimiser states
  stay on the GPU, plus the sampler: Hugging Face `generate` (its KV cache and the [batch, new tokens, vocabulary]
  float32 scores that `selfplay.rl.ppo.generate` keeps and stacks, 2 copies) or the vLLM engines, each holding
  `rollout.gpu_memory_utilization` x the GPU's memory, one per agent on vLLM, both awake while either samples,
  and the trainer re-scoring `rollout.gap_answers` of their answers (`logprob_gap`; not under ZeRO-3);
- "update": one agent's PPO update: gradients and one micro-batch's activations on top of the resident state; the
  vLLM engines sleep (`rollout.sleep`: weights offloaded, KV cache freed) and are counted as 0;
- "evaluation": the held-out evaluation every `train.eval_every`, on every rank: as rollout, the solver sampling
  its shard of the held-out tasks (every world-th task; all of them under ZeRO-3) in batches of at most 64 answers.

ZeRO accounting (Rajbhandari et al., 2020) under bf16/fp16 mixed precision (the DeepSpeed JSON's "bf16" or "fp16"
enabled): 2 bytes of weights and 2 of gradients per trainable parameter, 12 of optimiser states (fp32 master copy,
AdamW's two fp32 moments); stage 1 divides the optimiser states over the ranks, stage 2 the gradients too, stage 3
the weights too (the frozen LoRA base included: ZeRO-3 partitions every parameter of the module). Without mixed
precision (or without DeepSpeed: torch's AdamW) the states are the two moments in the parameters' dtype. The
references are never partitioned: they are plain modules `.to(device)` on every rank (`PlanOptions.
partition_references` shows what partitioning them would give). Decimal units: 1 GB = 1e9 bytes.

What is approximate (the rest is exact accounting of parameter counts and dtypes):
- activations: a per-token, per-block constant (`BLOCK_BYTES_H`, `BLOCK_BYTES_I`), per-logit constants
  (`SFT_LOGIT_BYTES`, `PPO_LOGIT_BYTES`) and a checkpointed block's recomputation (`RECOMPUTED_BLOCK`), fitted to
  measurements (see their comments); the update's are held to measured CPU peaks of small shapes within 15 %
  (tests/selfplay/runtime/test_memory_plan_measured.py);
- sequence lengths are the config's bounds: a prompt of `warmstart.max_len` tokens (the loop's prompt budget) plus
  the answer budget; real prompts are often shorter (`PlanOptions.prompt_tokens` plans for a given length);
- `RESERVE_GB` for the CUDA context, NCCL's buffers and the allocator's fragmentation; ZeRO-3's gathered working set
  as its largest module plus its prefetch bucket.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfplay.runtime.config import CONFIG_DIR
from selfplay.runtime.config_parts import engine_name
from selfplay.runtime.errors import UserError

GB = 1e9  # decimal gigabytes, as GPU memory is sold ("80 GB")
AGENTS = ("solver", "generator")
PHASES = ("warm start", "load", "rollout", "update", "evaluation")
# the columns of a phase, in the table's order
PARTS = (
    "policy weights",
    "reference weights",
    "value head/critic",
    "gradients",
    "optimizer states",
    "activations",
    "generation (hf)",
    "vllm engines",
    "reserve",
)
PART_OF = {
    "policy": "policy weights",
    "reference": "reference weights",
    "critic": "value head/critic",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "generation": "generation (hf)",
    "vllm": "vllm engines",
}  # plan_phases' keywords
RESERVE_GB = 2.0  # per GPU: CUDA context (~0.5-1 GB with torch's kernels), NCCL buffers, allocator fragmentation
HF_SAMPLE_BATCH = 64  # LMAgent.sample's batch_size: prompts per Hugging Face generate call
EVAL_BATCH = HF_SAMPLE_BATCH  # the evaluation samples its many prompts in full batches
# Activations saved for backward per token and per transformer block, in bytes at 2-byte (bf16) precision, without
# gradient checkpointing: BLOCK_BYTES_H x hidden + BLOCK_BYTES_I x intermediate. 8 x intermediate is the SwiGLU MLP's
# four intermediate-wide bf16 tensors (gate output, its SiLU, up output, their product); 18 x hidden the rest
# (RMSNorm inputs and their fp32 copies, q/k/v/o inputs, rotary q and k, the attention output), with flash / SDPA
# attention (no sequence x sequence matrix). Fitted to the two H200 measurements of docs/results.md (forward + backward
# of 4 x 1,536 tokens, checkpointing off minus on: 65.4 bytes per hidden unit for the 1.5B shape, 60.9 for the 7B).
BLOCK_BYTES_H = 18
BLOCK_BYTES_I = 8
# bytes per logit of the SFT loss over every position (bf16 logits, their fp32 copy, cross-entropy's log-softmax and
# the backward's transient gradients): the same H200 peaks less weights, gradients and the blocks' share give 13.5
# (1.5B) and 12.8 (7B)
SFT_LOGIT_BYTES = 13
# bytes per answer logit of a PPO micro-batch (`PPOTrainer._loss`: fp32 tempered log-distribution, its gather, the
# entropy's softmax and product): measured on the CPU through PPOTrainer.step by selfplay/bench/preset_memory.py's
# `measure` (one block of width 64, vocabulary 32,000, 2 x 257 answer positions: 24.2 bytes saved per logit)
PPO_LOGIT_BYTES = 24
# With gradient checkpointing, the peak of a block's recomputation and backward in units of the bytes that block
# saves without it (`block_activation_bytes`): its saved tensors and its backward's transient gradients. Measured on
# the CPU through PPOTrainer.step (tests/selfplay/runtime/test_memory_plan_measured.py's byte counter of live
# storage; bf16, 2 x 256 tokens, hidden 64-256, intermediate 512-704, 2 and 4 blocks, vocabularies of 500 so that
# the block, not the logits, makes the peak): 1.05 to 1.40, 1.3 for the Qwen2-like ratio (intermediate ~5.5 x hidden)
RECOMPUTED_BLOCK = 1.3
MIXED_STATE_BYTES = 12  # per trainable parameter under bf16/fp16 mixed precision: fp32 master, AdamW's m and v
# bytes per answer logit of the no-gradient re-scoring of vLLM answers (`logprob_gap` -> `_policy_forward`): bf16
# logits, their fp32 tempered copy, the log-softmax
GAP_LOGIT_BYTES = 10
# With LoRA, whether a loaded agent's KL reference is its policy with the adapter switched off (no weights of its own)
# rather than a frozen copy of the base: True, as selfplay.models.agent.load_agent_parts does (AdapterOff, when the
# adapter's base is the reference, as after every warm start)
LORA_REFERENCE_IS_BASE = True
SCORE_COPIES = 2  # generate keeps fp32 scores per step (out.scores) and torch.stack copies them before .cpu()
DEFAULT_PREFETCH = 50_000_000  # DeepSpeed's stage3_prefetch_bucket_size default (parameters)
# what a rank-0 warm start needs when its weights and SFT states alone exceed the GPU: no setting of its own helps
WARM_START_NEEDS = (
    "it needs the warm start under DeepSpeed on several ranks (distributed.deepspeed=true, more than one GPU; "
    "selfplay/train/warmstart_ranks.py), which partitions each agent's SFT over them: without it rank 0 alone "
    "builds both agents and fine-tunes each in plain torch, nothing partitioned"
)


# ---------------------------------------------------------------------------- the model's shape


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a causal LM: sizes of its blocks and embeddings (a Llama / Qwen2 / GPT-2 layout)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = True  # the LM head shares the input embedding
    head_dim: int = 0  # 0: hidden // heads
    qkv_bias: bool = False  # Qwen2: biases on q, k and v
    arch: str = "llama"  # llama (Qwen2, SmolLM2 alike: RMSNorm, SwiGLU) | gpt2 (LayerNorm, GELU MLP, fused qkv)
    positions: int = 0  # context length (max_position_embeddings; GPT-2: its learned position table)

    @property
    def dh(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one block, by the module names LoRA targets."""
        h, i, q, kv = self.hidden, self.intermediate, self.heads * self.dh, self.kv_heads * self.dh
        if self.arch == "gpt2":
            return {"c_attn": (h, 3 * h), "attn.c_proj": (h, h), "c_fc": (h, i), "mlp.c_proj": (i, h)}
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def block_params(self) -> int:
        h = self.hidden
        weights = sum(a * b for a, b in self.linears().values())
        if self.arch == "gpt2":  # every linear has a bias; two LayerNorms with weight and bias
            return weights + sum(b for _, b in self.linears().values()) + 4 * h
        bias = (self.heads + 2 * self.kv_heads) * self.dh if self.qkv_bias else 0
        return weights + bias + 2 * h  # two RMSNorm weights

    @property
    def embedding_params(self) -> int:
        table = self.vocab * self.hidden
        return table + (0 if self.tied else table) + (self.positions * self.hidden if self.arch == "gpt2" else 0)

    @property
    def largest_param(self) -> int:
        """Elements of the largest single parameter (the embedding table, GPT-2's position table or one linear)."""
        positions = self.positions * self.hidden if self.arch == "gpt2" else 0
        return max(self.vocab * self.hidden, positions, *(a * b for a, b in self.linears().values()))

    @property
    def params(self) -> int:
        final_norm = 2 * self.hidden if self.arch == "gpt2" else self.hidden
        return self.layers * self.block_params + self.embedding_params + final_norm

    def lora_params(self, r: int, targets: tuple[str, ...], top_layers: int = 0) -> int:
        """Trainable parameters of LoRA adapters of rank r on the named linears of the top `top_layers` blocks
        (0: all): r x (in + out) per adapted linear (peft's A and B, no bias)."""
        names = set(targets)
        per_block = sum(
            r * (a + b) for name, (a, b) in self.linears().items() if name in names or name.rsplit(".", 1)[-1] in names
        )
        return per_block * (min(top_layers, self.layers) if top_layers > 0 else self.layers)

    def hf_config(self) -> dict[str, Any]:
        """Keyword arguments of a transformers Qwen2Config / LlamaConfig of this shape (random-weight measurements)."""
        return dict(
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            vocab_size=self.vocab,
            tie_word_embeddings=self.tied,
        )

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Generation's KV cache per token: keys and values of every block."""
        return 2 * self.layers * self.kv_heads * self.dh * dtype_bytes

    def block_activation_bytes(self, dtype_bytes: int) -> float:
        """Bytes one block saves for backward per token without checkpointing (`BLOCK_BYTES_H`, `BLOCK_BYTES_I`)."""
        return (BLOCK_BYTES_H * self.hidden + BLOCK_BYTES_I * self.intermediate) * dtype_bytes / 2


# The presets' models (configs/*.yaml) and Qwen2.5-Coder-0.5B, from their Hugging Face config.json files; the key is
# the model's name, lower case, without its organisation and "-instruct" (`shape_key`)
KNOWN_SHAPES: dict[str, ModelShape] = {
    "qwen2.5-coder-0.5b": ModelShape(
        "Qwen2.5-Coder-0.5B", 896, 4864, 24, 14, 2, 151936, tied=True, qkv_bias=True, positions=32768
    ),
    "qwen2.5-coder-1.5b": ModelShape(
        "Qwen2.5-Coder-1.5B", 1536, 8960, 28, 12, 2, 151936, tied=True, qkv_bias=True, positions=32768
    ),
    "qwen2.5-coder-7b": ModelShape(
        "Qwen2.5-Coder-7B", 3584, 18944, 28, 28, 4, 152064, tied=False, qkv_bias=True, positions=32768
    ),
    "smollm2-135m": ModelShape("SmolLM2-135M", 576, 1536, 30, 9, 3, 49152, tied=True, positions=8192),
}


def shape_key(name_or_path: str) -> str:
    """ "Qwen/Qwen2.5-Coder-7B-Instruct" -> "qwen2.5-coder-7b"."""
    key = str(name_or_path).rstrip("/").rsplit("/", 1)[-1].lower()
    return key[: -len("-instruct")] if key.endswith("-instruct") else key


def shape_from_hf_config(conf: dict, name: str = "") -> ModelShape:
    """A `ModelShape` from a Hugging Face config.json's fields (Llama, Qwen2, Mistral-like, GPT-2)."""
    if conf.get("model_type") == "gpt2" or "n_embd" in conf:
        h = int(conf["n_embd"])
        return ModelShape(
            name or "gpt2",
            h,
            int(conf.get("n_inner") or 4 * h),
            int(conf["n_layer"]),
            int(conf["n_head"]),
            int(conf["n_head"]),
            int(conf["vocab_size"]),
            tied=True,
            arch="gpt2",
            positions=int(conf.get("n_positions", 1024)),
        )
    heads = int(conf["num_attention_heads"])
    return ModelShape(
        name or str(conf.get("model_type", "model")),
        int(conf["hidden_size"]),
        int(conf["intermediate_size"]),
        int(conf["num_hidden_layers"]),
        heads,
        int(conf.get("num_key_value_heads") or heads),
        int(conf["vocab_size"]),
        tied=bool(conf.get("tie_word_embeddings", False)),
        head_dim=int(conf.get("head_dim") or 0),
        qkv_bias=bool(conf.get("attention_bias", conf.get("model_type") == "qwen2")),
        positions=int(conf.get("max_position_embeddings") or 0),
    )


def _config_json(name_or_path: str) -> Path | None:
    """The model's config.json on this machine: a local folder's, or a snapshot in the Hugging Face cache."""
    folder = Path(name_or_path).expanduser()
    if (folder / "config.json").is_file():
        return folder / "config.json"
    if "/" not in name_or_path or folder.is_absolute():
        return None
    hub = Path(
        os.environ.get("HF_HUB_CACHE")
        or Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"
    )
    snapshots = hub / f"models--{name_or_path.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []
    return found[-1] if found else None


def model_shape(model_cfg) -> ModelShape:
    """The shape of the model `model:` names: the tiny default from its settings, a folder's (or the Hugging Face
    cache's) config.json, else `KNOWN_SHAPES`; a model of none of these is refused naming model.name_or_path."""
    name = str(model_cfg.name_or_path)
    if name == "tiny":  # selfplay.models.factory.build_tiny_model; its vocabulary is at most model.vocab_size
        h, arch = int(model_cfg.n_embd), str(model_cfg.arch)
        return ModelShape(
            f"tiny {arch}",
            h,
            4 * h,
            int(model_cfg.n_layer),
            int(model_cfg.n_head),
            int(model_cfg.n_head),
            int(model_cfg.vocab_size),
            tied=True,
            arch="gpt2" if arch == "gpt2" else "llama",
            positions=int(model_cfg.max_positions),
        )
    path = _config_json(name)
    if path is not None:
        return shape_from_hf_config(json.loads(path.read_text()), name=shape_key(name))
    key = shape_key(name)
    if key in KNOWN_SHAPES:
        return KNOWN_SHAPES[key]
    raise UserError(
        f"model.name_or_path={name}: no config.json found for it and not a known shape "
        f"({', '.join(sorted(KNOWN_SHAPES))}); point it at the model's folder"
    )


# ---------------------------------------------------------------------------- what the plan reads from a config


@dataclass(frozen=True)
class Cluster:
    """Where the run goes: GPUs per node x nodes (one rank per GPU), each with `gpu_gb` GB."""

    gpus_per_node: int = 8
    nodes: int = 1
    gpu_gb: float = 80.0

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class PlanOptions:
    """What a config does not say. prompt_tokens: the prompt length planned for (0: the config's bound,
    warmstart.max_len; else also the SFT sequences are this plus the longer answer budget, at most warmstart.max_len);
    partition_references: plan as if the references were ZeRO-3 partitioned (they are not)."""

    prompt_tokens: int = 0
    partition_references: bool = False


@dataclass(frozen=True)
class RunSettings:
    """The config values the plan depends on (flat, so that a what-if is a `dataclasses.replace`)."""

    dtype_bytes: int
    deepspeed: bool
    zero_stage: int  # 0: no ZeRO (plain torch + AdamW, DDP across ranks)
    mixed_precision: bool  # DeepSpeed's bf16 / fp16: fp32 master weights and moments
    prefetch: int  # ZeRO-3's stage3_prefetch_bucket_size (parameters)
    value_model: str
    gradient_checkpointing: bool
    lora_r: int
    lora_layers: int
    lora_targets: tuple[str, ...]
    lora_agents: tuple[str, ...]
    micro_batch: int
    mini_batch: int
    solver_new: int  # agents.solver.max_new_tokens (or ppo.max_new_tokens)
    generator_new: int  # agents.generator.max_new_tokens
    prompt: int  # prompt tokens planned for
    sft_batch: int
    sft_len: int
    sft_steps: tuple[int, int]  # warmstart.solver_steps, warmstart.generator_steps
    engines: tuple[str, str]  # the solver's and the generator's rollout engine
    gpu_memory_utilization: float
    sleep: bool
    solver_answers: int  # train.solver_tasks x train.samples_per_task (all ranks)
    proposals: int  # train.proposals (all ranks)
    gap_answers: int = 0  # rollout.gap_answers: vLLM answers the trainer re-scores per batch
    sft_micro: int = 0  # warmstart.micro_batch_size: sequences per SFT forward/backward (0: the whole batch)
    eval_tasks: int = 0  # held-out tasks of an evaluation, all splits (at most; 0: unknown, full batches planned)
    eval_samples: int = 1  # eval.samples: sampled answers per task (besides the greedy one)

    @property
    def sft_rows(self) -> int:
        """Sequences in one SFT forward/backward."""
        return min(self.sft_micro or self.sft_batch, self.sft_batch)


def read_zero_config(name_or_path: str) -> dict:
    """The DeepSpeed JSON `distributed.zero_config` names: a file in configs/deepspeed/ or a path (as
    selfplay.runtime.distributed.load_deepspeed_config, which imports torch)."""
    path = Path(name_or_path)
    if not path.exists():
        path = CONFIG_DIR / "deepspeed" / name_or_path
    if not path.is_file():
        names = sorted(p.name for p in (CONFIG_DIR / "deepspeed").glob("*.json"))
        raise UserError(f"distributed.zero_config={name_or_path}: not found (choose one of {names} or give a path)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"distributed.zero_config={name_or_path}: not valid JSON ({exc})") from exc


def run_settings(cfg, options: PlanOptions = PlanOptions()) -> RunSettings:
    """`RunSettings` of a loaded config."""
    dist, m, p, t, ws = cfg.distributed, cfg.model, cfg.ppo, cfg.train, cfg.warmstart
    solver_new, generator_new = (
        int(cfg.agents[name].max_new_tokens or p.max_new_tokens) for name in ("solver", "generator")
    )
    stage, mixed, prefetch = 0, False, DEFAULT_PREFETCH
    if dist.deepspeed:
        ds = read_zero_config(dist.zero_config)
        zero = ds.get("zero_optimization", {})
        stage = int(zero.get("stage", 0))
        mixed = any(bool(ds.get(k, {}).get("enabled", False)) for k in ("bf16", "fp16"))
        prefetch = int(zero.get("stage3_prefetch_bucket_size", DEFAULT_PREFETCH))
    return RunSettings(
        dtype_bytes={"float32": 4, "bfloat16": 2, "float16": 2}.get(str(m.dtype), 4),
        deepspeed=bool(dist.deepspeed),
        zero_stage=stage,
        mixed_precision=mixed,
        prefetch=prefetch,
        value_model=str(m.value_model),
        gradient_checkpointing=bool(m.gradient_checkpointing),
        lora_r=int(m.lora.r),
        lora_layers=int(m.lora.layers),
        lora_targets=tuple(m.lora.target_modules),
        lora_agents=tuple(m.lora.agents),
        micro_batch=int(p.micro_batch_size),
        mini_batch=int(p.mini_batch_size),
        solver_new=solver_new,
        generator_new=generator_new,
        prompt=int(options.prompt_tokens or ws.max_len),
        sft_batch=int(ws.batch_size),
        sft_len=int(
            min(ws.max_len, options.prompt_tokens + max(solver_new, generator_new))
            if options.prompt_tokens
            else ws.max_len
        ),
        sft_steps=(int(ws.solver_steps), int(ws.generator_steps)),
        engines=(engine_name(cfg.rollout, "solver"), engine_name(cfg.rollout, "generator")),
        gpu_memory_utilization=float(cfg.rollout.gpu_memory_utilization),
        sleep=bool(cfg.rollout.sleep),
        solver_answers=int(t.solver_tasks) * int(t.samples_per_task),
        proposals=int(t.proposals),
        gap_answers=int(cfg.rollout.gap_answers),
        sft_micro=int(ws.micro_batch_size),
        # selfplay.eval.evaluate.suite_splits: eval.splits, or the test split and every tasks.heldout_splits
        eval_tasks=int(cfg.eval.tasks_per_split) * len(list(cfg.eval.splits) or [None, *cfg.tasks.heldout_splits]),
        eval_samples=max(1, int(cfg.eval.samples)),
    )


# ---------------------------------------------------------------------------- the plan


@dataclass
class PhasePlan:
    """One phase on one GPU: bytes per part (`PARTS`), what moment they are, and the GPU's memory."""

    phase: str
    where: str  # "rank 0" or "every rank"
    moment: str  # what is happening at the phase's peak
    parts: dict[str, float]
    budget: float  # bytes

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    @property
    def fixed(self) -> float:
        """The total less the parts that scale with sequence lengths the config only bounds (activations, Hugging
        Face generation): exact accounting of parameters, dtypes and shares, plus the engines and the reserve."""
        return self.total - self.parts["activations"] - self.parts["generation (hf)"]


@dataclass
class Verdict:
    """A phase's verdict: fits or not, and the changes (config keys, or the cluster's size) that make it fit."""

    phase: str
    fits: bool
    keys: list[str]  # config keys (or --nodes) of the changes named in `line`
    line: str
    missing: str = ""  # what no setting gives and a fit needs (code that does not exist yet); "" = nothing


@dataclass
class MemoryPlan:
    config: str
    model: ModelShape
    cluster: Cluster
    settings: RunSettings
    options: PlanOptions
    phases: list[PhasePlan]
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.phases)

    def phase(self, name: str) -> PhasePlan:
        return next(p for p in self.phases if p.phase == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "model": dataclasses.asdict(self.model),
            "params": self.model.params,
            "cluster": dataclasses.asdict(self.cluster),
            "settings": dataclasses.asdict(self.settings),
            "options": dataclasses.asdict(self.options),
            "fits": self.fits,
            "phases": [
                {
                    "phase": p.phase,
                    "where": p.where,
                    "moment": p.moment,
                    "parts_gb": {k: v / GB for k, v in p.parts.items()},
                    "total_gb": p.total / GB,
                    "budget_gb": p.budget / GB,
                    "fits": p.fits,
                }
                for p in self.phases
            ],
            "verdicts": [dataclasses.asdict(v) for v in self.verdicts],
        }


@dataclass(frozen=True)
class AgentState:
    """Bytes one agent keeps on one GPU between steps (policy, reference, critic, optimiser) and per update
    (gradients)."""

    weights: float
    reference: float
    critic: float
    gradients: float
    optimizer: float
    trainable: int  # parameters


def agent_state(
    shape: ModelShape, s: RunSettings, agent: str, world: int, options: PlanOptions = PlanOptions()
) -> AgentState:
    """One agent under DeepSpeed (or DDP) after `deepspeed.initialize`, per GPU."""
    b, p = s.dtype_bytes, shape.params
    lora = s.lora_r > 0 and agent in s.lora_agents
    adapters = shape.lora_params(s.lora_r, s.lora_targets, s.lora_layers) if lora else 0
    head = shape.hidden + 1  # ValueHead: Linear(hidden, 1)
    critic = head + (p if s.value_model == "separate" else 0)
    trainable = (adapters if lora else p) + critic
    # fp32 master + m + v under DeepSpeed's mixed precision, else AdamW's m and v in the parameters' dtype
    per_state = MIXED_STATE_BYTES if s.deepspeed and s.mixed_precision else 2 * b
    grads: float = trainable * b * (2 if not s.deepspeed and world > 1 else 1)  # DDP: its buckets beside .grad
    optimizer: float = trainable * per_state
    weights: float = (p + adapters) * b
    critic_b: float = critic * b
    if s.deepspeed and world > 1:
        if s.zero_stage >= 1:
            optimizer /= world
        if s.zero_stage >= 2:
            grads /= world
        if s.zero_stage >= 3:
            weights, critic_b = weights / world, critic_b / world
    ref = p * b / (world if options.partition_references and world > 1 else 1)
    if lora and LORA_REFERENCE_IS_BASE:
        ref = 0.0
    return AgentState(weights, ref, critic_b, grads, optimizer, trainable)


def _zero3_gathered(shape: ModelShape, s: RunSettings, world: int) -> float:
    """ZeRO-3's working set in a forward pass: the largest module gathered whole, and the prefetch bucket."""
    if not (s.deepspeed and s.zero_stage >= 3 and world > 1):
        return 0.0
    largest = max(shape.vocab * shape.hidden, shape.block_params)
    return (largest + s.prefetch) * s.dtype_bytes


def update_activations(shape: ModelShape, s: RunSettings, agent: str) -> float:
    """One PPO micro-batch's forward + backward: the blocks' saved activations and the answer logits' share. With
    gradient checkpointing the answer logits' backward (the first thing the backward does) is over before the first
    block is recomputed: the blocks' inputs and the larger of the logits' bytes and one recomputed block's
    (`RECOMPUTED_BLOCK` x its saved bytes), not their sum."""
    new = s.solver_new if agent == "solver" else s.generator_new
    tokens = s.micro_batch * (s.prompt + new)
    lora = s.lora_r > 0 and agent in s.lora_agents
    trained = min(s.lora_layers, shape.layers) if lora and s.lora_layers > 0 else shape.layers
    logits = s.micro_batch * (new + 1) * shape.vocab * PPO_LOGIT_BYTES
    # the critic's own backbone (value_model=separate) runs forward and backward too
    critic = _block_activations(shape, s, tokens, shape.layers) if s.value_model == "separate" else 0.0
    if not s.gradient_checkpointing:
        return _block_activations(shape, s, tokens, trained) + critic + logits
    inputs = tokens * shape.hidden * s.dtype_bytes * trained
    return inputs + critic + max(logits, RECOMPUTED_BLOCK * tokens * shape.block_activation_bytes(s.dtype_bytes))


def sft_activations(shape: ModelShape, s: RunSettings, rows: int = 0) -> float:
    """One SFT micro-batch (`rows` sequences, default warmstart.micro_batch_size, else warmstart.batch_size, of up to
    warmstart.max_len): every block, every position's logits (selfplay.rl.sft.answer_loss)."""
    tokens = (rows or s.sft_rows) * s.sft_len
    return _block_activations(shape, s, tokens, shape.layers) + tokens * shape.vocab * SFT_LOGIT_BYTES


def sft_state_bytes(shape: ModelShape, s: RunSettings) -> tuple[float, float]:
    """(gradients, optimiser states) of one agent's SFT (selfplay.rl.sft), every weight trained (the warm start trains
    all of them, LoRA or not). A bf16/fp16 model through fp32 master weights: fp32 gradients (each low-precision
    gradient is added into them as backward makes it: the largest parameter's held besides) and
    `MIXED_STATE_BYTES` of states (the fp32 master, AdamW's fp32 m and v); an fp32 model: its gradients and AdamW's
    two moments."""
    p = shape.params
    if s.dtype_bytes >= 4:
        return float(p * s.dtype_bytes), float(p * 2 * s.dtype_bytes)
    return float(p * 4 + shape.largest_param * s.dtype_bytes), float(p * MIXED_STATE_BYTES)


def warm_start_on_ranks(s: RunSettings, world: int) -> bool:
    """Whether the warm start runs on every rank inside DeepSpeed engines (selfplay/train/warmstart_ranks.py
    `on_every_rank`: DeepSpeed and several ranks); else rank 0 alone in plain torch."""
    return s.deepspeed and world > 1


def sft_rows_per_rank(s: RunSettings, world: int) -> int:
    """Sequences in one SFT forward/backward of a rank when the warm start's batches are split over `world` ranks
    (selfplay.rl.sft.rank_batching: a share of ceil(batch / world), passed warmstart.micro_batch_size at a time)."""
    share = -(-s.sft_batch // world)
    return min(s.sft_micro, share) if s.sft_micro > 0 else share


def sft_states_on_ranks(shape: ModelShape, s: RunSettings, world: int) -> tuple[float, float, float]:
    """(weights, gradients, optimiser states) per GPU of one agent's SFT inside a DeepSpeed engine, every weight
    trained: accounted as `agent_state` accounts the update (2 or 4 bytes of weights and of gradients, 12 bytes of
    fp32 master, m and v under mixed precision, else two moments in the weights' dtype), divided over the ranks by
    the ZeRO stage (1: states, 2: and gradients, 3: and weights)."""
    b, p = s.dtype_bytes, shape.params
    weights, grads = float(p * b), float(p * b)
    optimizer = float(p * (MIXED_STATE_BYTES if s.mixed_precision else 2 * b))
    if world > 1:
        if s.zero_stage >= 1:
            optimizer /= world
        if s.zero_stage >= 2:
            grads /= world
        if s.zero_stage >= 3:
            weights /= world
    return weights, grads, optimizer


def _block_activations(shape: ModelShape, s: RunSettings, tokens: int, blocks: int) -> float:
    full = shape.block_activation_bytes(s.dtype_bytes)
    if not s.gradient_checkpointing:
        return tokens * full * blocks
    # checkpointing keeps each block's input and recomputes one block at a time in the backward pass
    return tokens * (shape.hidden * s.dtype_bytes * blocks + full)


def generation_bytes(shape: ModelShape, s: RunSettings, batch: int, new: int) -> float:
    """One Hugging Face `generate` call (selfplay.rl.ppo.generate): the KV cache of `batch` prompts of `s.prompt`
    tokens and `new` answer tokens, and the float32 scores of every step, kept and stacked (`SCORE_COPIES`)."""
    if batch <= 0:
        return 0.0
    kv = batch * (s.prompt + new) * shape.kv_bytes_per_token(s.dtype_bytes)
    return kv + SCORE_COPIES * batch * new * shape.vocab * 4


def _rollout_batches(s: RunSettings, world: int) -> dict[str, tuple[int, int]]:
    """(answers per generate call, answer budget) of each agent sampling on a rank."""
    per_rank = {"solver": max(1, s.solver_answers // world), "generator": max(1, s.proposals // world)}
    return {a: (min(HF_SAMPLE_BATCH, per_rank[a]), s.solver_new if a == "solver" else s.generator_new) for a in AGENTS}


def eval_batch(s: RunSettings, world: int) -> int:
    """Answers per Hugging Face generate call of a rank's held-out evaluation (selfplay/train/evaluation.py): each
    rank evaluates every world-th task (`shard_of`; under ZeRO-3 every rank all of them, in step), in batches of at
    most `EVAL_BATCH` answers: its shard's tasks x eval.samples where that is fewer (the sampled pieces' answers
    outnumber the greedy ones)."""
    if s.eval_tasks <= 0:
        return EVAL_BATCH
    tasks = s.eval_tasks if s.deepspeed and s.zero_stage >= 3 and world > 1 else -(-s.eval_tasks // world)
    return min(EVAL_BATCH, tasks * s.eval_samples)


def push_bytes(shape: ModelShape, s: RunSettings, agent: str, world: int) -> float:
    """What pushing an agent's weights into its vLLM engine holds besides (selfplay.rollout.engine `sync`, which
    streams `policy_weight_items` one tensor at a time): under ZeRO-3 across ranks the largest parameter gathered
    whole; a LoRA policy's adapted layer merged into a copy of its own base weights (`merged_weight_items`: at most
    3 x the largest adapted weight, as tests/selfplay/models/test_lora_sync.py measures)."""
    b = s.dtype_bytes
    gathered = shape.largest_param * b if s.deepspeed and s.zero_stage >= 3 and world > 1 else 0.0
    adapted = max(x * y for x, y in shape.linears().values())
    merged = 3 * adapted * b if s.lora_r > 0 and agent in s.lora_agents else 0.0
    return gathered + merged


def _engine_count(s: RunSettings) -> int:
    return sum(e == "vllm" for e in s.engines)


def _rank0_warm_start(
    shape: ModelShape, s: RunSettings, budget: float, critic_full: float, trains: bool, parts: Callable
) -> PhasePlan:
    """The warm start on rank 0 alone (plain torch, nothing partitioned; one agent's SFT at a time). Its step_0 is
    evaluated after it is loaded back with the configured engines (checkpointing.evaluate_warm_start): that is the
    evaluation phase, not this one."""
    p, b = shape.params, s.dtype_bytes
    grads, states_b = sft_state_bytes(shape, s) if trains else (0.0, 0.0)
    sft = parts(
        policy=2 * p * b,
        reference=2 * p * b,
        critic=2 * critic_full,
        gradients=grads,
        optimizer=states_b,
        activations=sft_activations(shape, s) if trains else 0.0,
    )
    masters = ", fp32 masters" if s.dtype_bytes < 4 else ""
    what = (
        f"SFT of one agent ({s.sft_rows} of {s.sft_batch} sequences a pass{masters})" if trains else "no SFT (steps 0)"
    )
    return PhasePlan("warm start", "rank 0", what, sft, budget)


def plan_phases(
    shape: ModelShape, s: RunSettings, cluster: Cluster, options: PlanOptions = PlanOptions()
) -> list[PhasePlan]:
    """Per GPU bytes of each phase (`PHASES`), at its peak."""
    world, b, budget = cluster.world, s.dtype_bytes, cluster.gpu_gb * GB
    p = shape.params
    reserve = RESERVE_GB * GB
    states = {a: agent_state(shape, s, a, world, options) for a in AGENTS}
    vllm_bytes = s.gpu_memory_utilization * budget
    gathered = _zero3_gathered(shape, s, world)
    engine_of = dict(zip(AGENTS, s.engines))

    def parts(**kw: float) -> dict[str, float]:
        """`PARTS` from keywords named by their first word (policy=, reference=, critic=, ...)."""
        out = dict.fromkeys(PARTS, 0.0)
        out.update({PART_OF[k]: v for k, v in kw.items()})
        out["reserve"] = reserve
        return out

    def resident(**kw: float) -> dict[str, float]:
        """Both agents as DeepSpeed / DDP hold them between steps."""
        return parts(
            policy=sum(x.weights for x in states.values()) + gathered,
            reference=sum(x.reference for x in states.values()),
            critic=sum(x.critic for x in states.values()),
            optimizer=sum(x.optimizer for x in states.values()),
            **kw,
        )

    phases = []
    critic_full = (shape.hidden + 1 + (p if s.value_model == "separate" else 0)) * b
    trains = any(n > 0 for n in s.sft_steps)
    if warm_start_on_ranks(s, world):
        # warm start under DeepSpeed: every rank, one agent's SFT in an engine, partitioned as in the update; the
        # value head and rank 0's consolidated copies on the CPUs
        rows = sft_rows_per_rank(s, world)
        weights, grads, states_b = sft_states_on_ranks(shape, s, world)
        masters = ", fp32 masters" if s.mixed_precision else ""
        phases.append(
            PhasePlan(
                "warm start",
                "every rank",
                f"SFT of one agent under ZeRO-{s.zero_stage} ({rows} of {s.sft_batch} sequences a pass per rank"
                f"{masters})"
                if trains
                else "no SFT (steps 0): the agents built and saved",
                parts(
                    policy=weights + gathered,
                    gradients=grads if trains else 0.0,
                    optimizer=states_b if trains else 0.0,
                    activations=sft_activations(shape, s, rows) if trains else 0.0,
                ),
                budget,
            )
        )
    else:
        # warm start: rank 0, plain torch, nothing partitioned; one agent's SFT at a time
        phases.append(_rank0_warm_start(shape, s, budget, critic_full, trains, parts))

    # load: the solver wrapped (and its engine started), the generator whole until deepspeed.initialize
    sv = states["solver"]
    load = parts(
        policy=sv.weights + p * b,
        reference=2 * states["generator"].reference,
        critic=sv.critic + critic_full,
        optimizer=sv.optimizer,
        vllm=vllm_bytes if engine_of["solver"] == "vllm" else 0.0,
    )
    phases.append(
        PhasePlan("load", "every rank", "the generator loaded whole, the solver already partitioned", load, budget)
    )

    # rollout: each agent samples in turn; every vLLM engine awake
    batches = _rollout_batches(s, world)
    gen = max((generation_bytes(shape, s, *batches[a]) for a in AGENTS if engine_of[a] == "hf"), default=0.0)
    sampler = "the larger agent's Hugging Face batch" if gen else "the vLLM engines awake"
    gap = 0.0  # the trainer re-scores a few vLLM answers beside the awake engines (not under ZeRO-3)
    if _engine_count(s) and s.gap_answers > 0 and not (s.deepspeed and s.zero_stage >= 3 and world > 1):
        gap = max(
            s.gap_answers * (batches[a][1] + 1) * shape.vocab * GAP_LOGIT_BYTES
            for a in AGENTS
            if engine_of[a] == "vllm"
        )
    rollout = PhasePlan(
        "rollout",
        "every rank",
        f"sampling ({sampler})",
        resident(generation=gen, activations=gap, vllm=_engine_count(s) * vllm_bytes),
        budget,
    )
    push = max((push_bytes(shape, s, a, world) for a in AGENTS if engine_of[a] == "vllm"), default=0.0)
    if push:  # an agent's weights pushed into its woken engine, the engines awake
        pushing = resident(vllm=_engine_count(s) * vllm_bytes)
        pushing["policy weights"] += push
        rollout = max(
            rollout,
            PhasePlan("rollout", "every rank", "an engine taking the updated weights", pushing, budget),
            key=lambda x: x.total,
        )
    phases.append(rollout)

    # update: one agent's micro-batch forward + backward; engines asleep (or not, rollout.sleep=false)
    upd = max(AGENTS, key=lambda a: states[a].gradients + update_activations(shape, s, a))
    phases.append(
        PhasePlan(
            "update",
            "every rank",
            f"the {upd}'s PPO micro-batch backward",
            resident(
                gradients=states[upd].gradients,
                activations=update_activations(shape, s, upd),
                vllm=0.0 if s.sleep else _engine_count(s) * vllm_bytes,
            ),
            budget,
        )
    )

    # evaluation: every rank samples its shard of the held-out tasks (every rank all of them under ZeRO-3)
    ev_gen = generation_bytes(shape, s, eval_batch(s, world), s.solver_new) if engine_of["solver"] == "hf" else 0.0
    phases.append(
        PhasePlan(
            "evaluation",
            "every rank",
            "the solver sampling its shard of the held-out tasks",
            resident(generation=ev_gen, vllm=_engine_count(s) * vllm_bytes),
            budget,
        )
    )
    return phases


# ---------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Change:
    """A what-if: the keys it sets (as `key=value` words), and the settings and cluster it gives."""

    words: tuple[str, ...]
    settings: RunSettings
    cluster: Cluster

    @property
    def keys(self) -> list[str]:
        return [w.split("=", 1)[0] for w in self.words]


def _changes(shape: ModelShape, s: RunSettings, cluster: Cluster, options: PlanOptions, phase: str) -> list[Change]:
    """Changes that lower a phase's bytes, each at the value that makes the phase fit where one does (the largest
    micro-batch, utilisation, ... that fits), else at its most frugal value."""
    out: list[Change] = []
    rep = dataclasses.replace

    def add(words: tuple[str, ...], settings: RunSettings | None = None, cl: Cluster | None = None) -> None:
        out.append(Change(words, settings or s, cl or cluster))

    def fits(settings: RunSettings, cl: Cluster = cluster) -> bool:
        return next(p for p in plan_phases(shape, settings, cl, options) if p.phase == phase).fits

    def largest(values: list[int], make: Callable[[int], RunSettings]) -> int:
        """The largest value that fits (values in decreasing order), else the last one."""
        return next((v for v in values if fits(make(v))), values[-1])

    if phase == "warm start":
        on_ranks = warm_start_on_ranks(s, cluster.world)
        if any(n > 0 for n in s.sft_steps):
            add(("warmstart.solver_steps=0", "warmstart.generator_steps=0"), rep(s, sft_steps=(0, 0)))
            rows = sft_rows_per_rank(s, cluster.world) if on_ranks else s.sft_rows
            smaller = [n for n in range(rows - 1, 0, -1)]
            if smaller:  # the same steps in smaller passes
                n = largest(smaller, lambda v: rep(s, sft_micro=v))
                add((f"warmstart.micro_batch_size={n}",), rep(s, sft_micro=n))
        if not s.gradient_checkpointing:
            add(("model.gradient_checkpointing=true",), rep(s, gradient_checkpointing=True))
        if on_ranks and s.zero_stage < 3:
            add((f"distributed.zero_config=zero{s.zero_stage + 1}.json",), rep(s, zero_stage=s.zero_stage + 1))
        if not s.deepspeed and cluster.world > 1:  # the warm start under DeepSpeed, partitioned over the ranks
            add(
                ("distributed.deepspeed=true", "distributed.zero_config=zero3.json"),
                rep(s, deepspeed=True, zero_stage=3, mixed_precision=s.dtype_bytes == 2),
            )
        if on_ranks and s.zero_stage >= 1:
            nodes = next((n for n in range(cluster.nodes + 1, 65) if fits(s, rep(cluster, nodes=n))), 0)
            if nodes:
                add((f"--nodes={nodes}",), s, rep(cluster, nodes=nodes))
        return out
    if s.deepspeed and s.zero_stage < 3 and cluster.world > 1:
        add((f"distributed.zero_config=zero{s.zero_stage + 1}.json",), rep(s, zero_stage=s.zero_stage + 1))
    if not s.deepspeed and cluster.world > 1:
        add(
            ("distributed.deepspeed=true", "distributed.zero_config=zero3.json"),
            rep(s, deepspeed=True, zero_stage=3, mixed_precision=s.dtype_bytes == 2),
        )
    if s.lora_r == 0 and s.value_model != "separate":
        add(("model.lora.r=16",), rep(s, lora_r=16))
    if phase == "update":
        smaller = [n for n in range(s.micro_batch - 1, 0, -1) if s.mini_batch % n == 0]
        if smaller:
            n = largest(smaller, lambda v: rep(s, micro_batch=v))
            add((f"ppo.micro_batch_size={n}",), rep(s, micro_batch=n))
        if not s.gradient_checkpointing:
            add(("model.gradient_checkpointing=true",), rep(s, gradient_checkpointing=True))
        if not s.sleep and _engine_count(s):
            add(("rollout.sleep=true",), rep(s, sleep=True))
    if phase in ("rollout", "evaluation", "load") or (phase == "update" and not s.sleep):
        # an engine needs at least its weights and ~1 GB of KV cache; utilisations from 0.95 down by 0.05 to that
        floor = (shape.params * s.dtype_bytes + GB) / (cluster.gpu_gb * GB)
        percents = [u for u in range(95, 0, -5) if u / 100 >= floor]
        if _engine_count(s) and percents:
            lower = [u for u in percents if u / 100 < s.gpu_memory_utilization] or percents[-1:]
            u = largest(lower, lambda v: rep(s, gpu_memory_utilization=v / 100)) / 100
            add((f"rollout.gpu_memory_utilization={u:.2f}",), rep(s, gpu_memory_utilization=u))
        if phase != "load" and "hf" in s.engines and percents:
            u = largest(percents, lambda v: rep(s, engines=("vllm", "vllm"), gpu_memory_utilization=v / 100)) / 100
            add(
                ("rollout.engine=vllm", f"rollout.gpu_memory_utilization={u:.2f}"),
                rep(s, engines=("vllm", "vllm"), gpu_memory_utilization=u),
            )
    if s.deepspeed and s.zero_stage >= 1 and phase != "warm start":
        nodes = next((n for n in range(cluster.nodes + 1, 65) if fits(s, rep(cluster, nodes=n))), 0)
        if nodes:
            add((f"--nodes={nodes}",), s, rep(cluster, nodes=nodes))
    return out


def verdicts(
    shape: ModelShape, s: RunSettings, cluster: Cluster, phases: list[PhasePlan], options: PlanOptions = PlanOptions()
) -> list[Verdict]:
    """One line per phase: its total against the GPU's memory and, where it does not fit, what would make it."""
    out = []
    for p in phases:
        head = (
            f"{p.phase}: {p.total / GB:.1f} GB of {p.budget / GB:.1f} GB per GPU ({p.where}; {p.moment}): "
            f"{'fits' if p.fits else 'does not fit'}"
        )
        if p.fits:
            out.append(Verdict(p.phase, True, [], head))
            continue
        missing = _missing(shape, s, p)
        if missing:
            head += f"; {missing}"
        tried = []
        for change in _changes(shape, s, cluster, options, p.phase):
            after = next(q for q in plan_phases(shape, change.settings, change.cluster, options) if q.phase == p.phase)
            if after.total < p.total:
                tried.append((change, after))
        good = [(c, a) for c, a in tried if a.fits]
        if good:
            said = "; ".join(f"{' '.join(c.words)} ({a.total / GB:.1f} GB)" for c, a in good)
            out.append(
                Verdict(
                    p.phase, False, _unique(k for c, _ in good for k in c.keys), f"{head}; fits with {said}", missing
                )
            )
        elif tried:
            c, a = min(tried, key=lambda x: x[1].total)
            out.append(
                Verdict(
                    p.phase,
                    False,
                    c.keys,
                    f"{head}; no single change makes it fit, the largest cut: "
                    f"{' '.join(c.words)} ({a.total / GB:.1f} GB)",
                    missing,
                )
            )
        else:
            out.append(
                Verdict(
                    p.phase,
                    False,
                    ["model.name_or_path"],
                    f"{head}; no setting lowers it: a smaller model.name_or_path or a larger GPU",
                    missing,
                )
            )
    return out


def _missing(shape: ModelShape, s: RunSettings, p: PhasePlan) -> str:
    """`WARM_START_NEEDS`, with its figure, when rank 0's warm start (not under DeepSpeed on several ranks) holds
    more than the GPU before any activation (both agents' weights and references, one agent's fp32 masters,
    gradients and AdamW states): no micro-batch or checkpointing lowers that; else ""."""
    if p.phase != "warm start" or p.where != "rank 0" or not any(n > 0 for n in s.sft_steps):
        return ""
    b = s.dtype_bytes
    held = sum(p.parts[k] for k in ("policy weights", "reference weights", "value head/critic", "reserve"))
    fixed = held + sum(sft_state_bytes(shape, s))
    if fixed <= p.budget:
        return ""
    return (
        f"its weights and SFT states alone are {fixed / GB:.1f} GB on rank 0 (both agents' weights and "
        f"references, one agent's gradients and AdamW states{' and fp32 masters' if b < 4 else ''}): "
        f"{WARM_START_NEEDS}"
    )


def _unique(keys) -> list[str]:
    return list(dict.fromkeys(keys))


def plan_memory(
    cfg,
    cluster: Cluster = Cluster(),
    options: PlanOptions = PlanOptions(),
    shape: ModelShape | None = None,
    config_name: str = "",
) -> MemoryPlan:
    """The memory plan of config `cfg` on `cluster` (the model's shape read from the config unless given)."""
    shape = shape or model_shape(cfg.model)
    s = run_settings(cfg, options)
    phases = plan_phases(shape, s, cluster, options)
    return MemoryPlan(config_name, shape, cluster, s, options, phases, verdicts(shape, s, cluster, phases, options))


# ---------------------------------------------------------------------------- the table


def format_table(plan: MemoryPlan) -> str:
    """The plan as a Markdown table (GB per GPU, one row per phase) and its verdict lines."""
    short = {
        "policy weights": "policy",
        "reference weights": "refs",
        "value head/critic": "critic",
        "gradients": "grads",
        "optimizer states": "optim",
        "activations": "activ",
        "generation (hf)": "hf gen",
        "vllm engines": "vllm",
        "reserve": "reserve",
    }
    c, m, s = plan.cluster, plan.model, plan.settings
    zero = f"ZeRO-{s.zero_stage}" if s.deepspeed else ("DDP" if c.world > 1 else "one process")
    size = f"{m.params / 1e9:.2f} B" if m.params >= 1e9 else f"{m.params / 1e6:.1f} M"
    lines = [
        f"{plan.config or 'config'}: {m.name} ({size} parameters), {zero}, "
        f"{c.nodes} node(s) x {c.gpus_per_node} GPU(s) of {c.gpu_gb:g} GB, engines "
        f"{'/'.join(s.engines)}, prompts of {s.prompt} tokens, SFT batches of {s.sft_batch} x {s.sft_len} tokens"
        f"{f' in passes of {s.sft_rows}' if s.sft_rows < s.sft_batch else ''}; GB per GPU",
        "",
        "| phase | where | " + " | ".join(short[k] for k in PARTS) + " | total | budget | fits |",
        "|---" * (len(PARTS) + 5) + "|",
    ]
    for p in plan.phases:
        cells = " | ".join(f"{p.parts[k] / GB:.1f}" for k in PARTS)
        lines.append(
            f"| {p.phase} | {p.where} | {cells} | {p.total / GB:.1f} | {p.budget / GB:.1f} | "
            f"{'yes' if p.fits else 'NO'} |"
        )
    lines.append("")
    lines += [v.line for v in plan.verdicts]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the check at `selfplay train`


def refuse_if_it_cannot_fit(cfg) -> None:
    """At `selfplay train`'s start on a GPU: refuse, in one line naming the key(s) to change, a run whose plan cannot
    fit this GPU (WORLD_SIZE ranks, LOCAL_WORLD_SIZE per node, this GPU's memory). It refuses only on the fixed parts
    (`PhasePlan.fixed`: weights, references, gradients, optimiser states, engines), which are exact; a phase that
    only its activations or generation (estimates at the config's length bounds) push over gets a warning line from
    rank 0. A no-op on a CPU (no GPU memory to plan), for a model of unknown shape, or with
    SELFPLAY_NO_MEMORY_PLAN=1. The warm start is checked only when run.dir holds no checkpoint yet."""
    if os.environ.get("SELFPLAY_NO_MEMORY_PLAN") == "1":
        return
    import torch

    if not torch.cuda.is_available():
        return
    from selfplay.runtime.checkpoint import CheckpointManager

    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    gpu_gb = torch.cuda.get_device_properties(local).total_memory / GB
    try:
        shape = model_shape(cfg.model)
    except UserError:
        return  # nothing to plan with; loading the model says what is wrong with its name
    plan = plan_memory(cfg, Cluster(per_node, max(1, world // per_node), gpu_gb), shape=shape)
    resuming = CheckpointManager(cfg.run.dir).latest_checkpoint() is not None
    where = f"this GPU has {gpu_gb:.1f} GB ({world} rank(s))"
    for v in plan.verdicts:
        p = plan.phase(v.phase)
        if v.fits or (resuming and v.phase == "warm start"):
            continue
        if p.fixed > p.budget:
            todo = v.missing or f"change {' or '.join(v.keys)}"
            raise UserError(
                f"memory plan: the {v.phase} needs {p.fixed / GB:.1f} GB per GPU before activations, "
                f"{where}: {todo} (`selfplay plan CONFIG` shows the table; SELFPLAY_NO_MEMORY_PLAN=1 "
                "starts anyway)"
            )
        if int(os.environ.get("RANK", "0")) == 0:
            print(
                f"[selfplay] memory plan: the {v.phase} may need {p.total / GB:.1f} GB per GPU at the config's "
                f"longest sequences, {where}; if it runs out, change {' or '.join(v.keys)} (`selfplay plan`)",
                flush=True,
            )
