"""The config sections owned by rooms above the runtime, as pure data and their checks: the `rollout:` section (and
the names of the rollout engines, whose registry `selfplay/rollout/engines.py` fills) and the `mixer:` section.

They sit here, on the runtime's floor, so that `selfplay/runtime/config.py` holds and checks every section without
importing the rooms that use them (the engines, the agents and the trainer they reach, the training loop). Those
rooms re-export what they read from here: `selfplay.rollout.settings`, `selfplay.rollout.engines` and
`selfplay.train.mixer` keep their names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from selfplay.runtime.errors import UserError

# ---- rollout: (selfplay/rollout/) ----

# name -> the module that registers it (imported at the first make_engine that asks for it)
BUILT_IN = {"hf": "selfplay.rollout.engine", "vllm": "selfplay.rollout.engine_process"}
# name -> builder(cfg, agent, folder, *, rank) -> engine, filled by selfplay.rollout.engines.register_engine as the
# engines' modules are imported
ENGINES: dict[str, Callable[..., Any]] = {}
SYNCS = ("auto", "reload", "load_weights", "folder")
KEY = "rollout.engine"
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM CPU attention's head sizes


@dataclass
class RolloutConfig:
    # hf (Hugging Face generate on the trainer's model) | vllm (a vLLM engine in each rank) | a registered engine
    engine: str = "hf"
    generator_engine: str = ""  # the generator's engine, when it differs from rollout.engine ("" = the same)
    kv_cache_gb: float = 1.0  # vllm, CPU build: KV-cache space per engine in GiB (VLLM_CPU_KVCACHE_SPACE)
    gpu_memory_utilization: float = 0.3  # vllm on a GPU: share of its memory each engine takes (weights + KV cache)
    sleep: bool = True  # vllm on a GPU: the engines sleep (weights offloaded, KV cache freed) during PPO updates
    # weight sync after each update: auto (CPU: reload, GPU: load_weights) | reload | load_weights | folder
    sync: str = "auto"
    sync_dir: str = "/dev/shm"  # rollout.sync=folder: where the weights are written for the engine to reload
    gap_answers: int = 8  # answers per sampled batch the trainer re-scores for rollout/logprob_gap (0 = off)


def engine_names() -> tuple[str, ...]:
    """Every name `rollout.engine` takes: the built-in engines and those registered since."""
    return tuple(dict.fromkeys([*BUILT_IN, *ENGINES]))


def engine_key(rcfg: RolloutConfig, agent: str) -> str:
    """The config key that chooses agent `agent`'s engine: the generator's own where it is set."""
    return "rollout.generator_engine" if agent == "generator" and rcfg.generator_engine else "rollout.engine"


def engine_name(rcfg: RolloutConfig, agent: str) -> str:
    """The engine of agent `agent` ("solver" or "generator")."""
    return rcfg.generator_engine if engine_key(rcfg, agent) == "rollout.generator_engine" else rcfg.engine


def check_rollout(cfg: Any) -> None:
    """The `rollout:` values, before any work (one line naming the key); the tiny model's head size where the CPU
    build is to serve it (a pretrained model's is checked when its engine starts)."""
    rcfg, m = cfg.rollout, cfg.model
    if (
        "vllm" in (rcfg.engine, rcfg.generator_engine)
        and m.name_or_path == "tiny"
        and m.n_head > 0
        and m.n_embd % m.n_head == 0
        and m.n_embd // m.n_head not in CPU_HEAD_SIZES
        and not on_gpu()
    ):
        raise UserError(head_size_error(m.n_embd // m.n_head))
    for key in ("engine", "generator_engine"):
        value = getattr(rcfg, key)
        if value not in engine_names() and not (key == "generator_engine" and value == ""):
            raise UserError(f"rollout.{key} must be one of {', '.join(engine_names())}, got {value!r}")
    if rcfg.sync not in SYNCS:
        raise UserError(f"rollout.sync must be one of {', '.join(SYNCS)}, got {rcfg.sync!r}")
    if rcfg.kv_cache_gb <= 0 or not 0 < rcfg.gpu_memory_utilization <= 1:
        raise UserError("rollout.kv_cache_gb must be > 0 and rollout.gpu_memory_utilization in (0, 1]")
    if rcfg.gap_answers < 0:
        raise UserError(f"rollout.gap_answers must be >= 0, got {rcfg.gap_answers}")


def head_size_error(head: int) -> str:
    return (
        f"{KEY}=vllm: vLLM's CPU attention takes head sizes {', '.join(map(str, CPU_HEAD_SIZES))}, this "
        f"model's is {head} (model.n_embd / model.n_head): change them or use {KEY}=hf"
    )


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


# ---- mixer: (selfplay/train/mixer.py) ----

GENERATOR_TASKS = ("fresh", "in_band")  # mixer.generator_tasks
BANDS = ("adaptive", "fixed")


@dataclass
class MixerConfig:
    # adaptive: the level follows where tasks are in band, the band's centre the in-band solve rates;
    # fixed: the level keeps the solve-rate EMA inside target_low..target_high (the classic 90 % promotion rule)
    band: str = "adaptive"
    target_low: float = 0.4  # fixed: lower the level below this solve-rate EMA; adaptive: initial band
    target_high: float = 0.9  # fixed: raise the level above this (the classic 90 %); adaptive: initial band
    level_margin: float = 0.1  # adaptive: move the level when EMA(always solved - never solved) leaves +-this
    ema: float = 0.7  # smoothing of the measured rates (weight of the past)
    level_min: float = 1.0  # lowest procedural level
    level_max: float = 4.0  # highest procedural level
    level_start: float = 1.0  # where the curriculum starts
    level_step: float = 0.25  # level change per iteration when out of band
    share_generator: float = 0.4  # share of fresh generator proposals in a solver batch while the generator is trusted
    share_procedural: float = 0.4  # base share of procedural tasks
    share_replay: float = 0.2  # base share of replayed corpus tasks
    min_share_generator: float = 0.05  # ... while it is not (it must stay observable); where it starts
    share_rate: float = 0.25  # per-iteration move of the generator share towards its target (share of the gap)
    earn_validity: float = 0.5  # the generator becomes trusted when its validity-rate EMA reaches this ...
    earn_in_band: float = 0.2  # ... and its in-band-rate EMA this
    max_share_replay: float = 0.6  # cap on the replay share when the solver collapses
    recover: float = 0.1  # per-iteration pull of the replay share, penalty weight and lr scale back to their base
    min_validity: float = 0.2  # validity-rate EMA below this = generator collapse: trust lost
    min_in_band: float = 0.1  # in-band-rate EMA below this = the generator's tasks teach nothing: trust lost
    min_diversity: float = 0.3  # diversity (unique clusters / valid proposals) below this = diversity collapse
    repetition_weight: float = 1.0  # base weight of the generator's repetition penalty
    repetition_weight_max: float = 4.0  # cap when diversity collapses
    pass_drop: float = 0.25  # solver collapse when the solve-rate EMA falls this far below its baseline ...
    baseline_ema: float = 0.95  # ... a slower EMA of it (weight of the past), reset to it when the level rises
    kl_max: float = 1.0  # KL to the reference above this = policy drifting too fast
    lr_scale_min: float = 0.1  # the learning-rate multiplier never goes below this
    replay_width: float = 0.2  # width of the replay preference around the band's centre (in solve rate)
    # the generator's references: preferred at solve rate (band centre + the measured edit drop), the drop being
    # how much lower a valid proposal is solved than its reference; reference_offset stands for it until measured
    reference_offset: float = 0.3
    reference_follow: bool = True  # false: always band centre + reference_offset (0 = references at the centre)
    # mutation format: draw each prompt's edit instruction by its measured yield (valid and in band), not uniformly;
    # off by default: on the tiny default it did not raise the share of valid proposals in band (docs/selfplay.md)
    instruction_follow: bool = False
    instruction_explore: float = 0.25  # share of the uniform draw mixed into the yield-weighted one
    instruction_discount: float = 0.9  # weight of the past in each instruction's (successes, proposals) counts
    instruction_power: float = 1.0  # weights follow yield ** power: 1 in proportion, larger leans on the best yields
    # each source's rounding carried from batch to batch, so that over iterations its tasks follow its share to
    # within one task however small the batch (false: each batch rounded alone, by largest remainder: in a batch of
    # 4 a share of 0.37 is 1 task, 0.25, every time)
    carry_rounding: bool = True
    # which generator tasks fill its share of the batch: fresh (this iteration's valid proposals, unmeasured) or
    # in_band (proposals the solver was measured to solve sometimes, 0 < p < 1, in the last in_band_max_age
    # iterations, each served once, newest first; fresh ones top the share up while too few are kept)
    generator_tasks: str = "fresh"
    in_band_max_age: int = 4
    # the collapse alarms' learning-rate control in every mode that trains the solver, or in none: true = a solver
    # collapse or a KL blow-up halves the learning-rate scale (both agents' rate = ppo.lr * it, down to lr_scale_min),
    # which recovers by `recover` an iteration, in selfplay as in the curriculum, uniform and fixed baselines (their
    # sources run the same detectors, Mixer.watch); false = the scale stays 1 in every mode (the alarms are still
    # logged). The same for all arms of a comparison
    lr_control: bool = True
    # replayed corpus tasks in every mode that draws procedural tasks, or in none: true = share_replay of the solver
    # batch (raised on a solver collapse, chosen near the band's centre) in selfplay, curriculum and uniform alike;
    # false = no replayed task in any mode (the fixed mode's task set is its own, with none either way)
    corpus_replay: bool = True
    # the solver's task kinds (solver/kinds.py) and their weights, in every mode: each solver batch is asked in these
    # kinds in these shares (program: write the function; deduction, abduction, induction: code_io's questions about
    # the same tasks). Empty: the program kind alone. (A YAML or key=value dict is merged into the default, so the
    # default names no kind: one it named could not be taken out.) Checked by selfplay.train.mixer.check_kinds
    kinds: dict[str, float] = field(default_factory=dict)
    # answer tokens of a kind (deduction and abduction answer with a value or a call); a kind not named here keeps
    # agents.solver.max_new_tokens
    kind_max_new_tokens: dict[str, int] = field(default_factory=dict)
    # draw the kinds by weight x measured learnability (the EMA of the share of the kind's tasks in band, 0 < p < 1),
    # mixed with kind_explore of the weights alone; false (the default): the weights' fixed shares (learnability is
    # measured and logged either way)
    kind_follow: bool = False
    kind_explore: float = 0.25


def check_mixer(c: MixerConfig) -> None:
    """The `mixer:` values (a ValueError naming the key), checked when a `Mixer` is built."""
    if c.band not in BANDS:
        raise ValueError(f"mixer.band must be one of {', '.join(BANDS)}, got {c.band!r}")
    if not 0.0 <= c.target_low < c.target_high <= 1.0:
        raise ValueError(
            f"mixer band must satisfy 0 <= target_low < target_high <= 1, got {c.target_low}, {c.target_high}"
        )
    total = c.share_generator + c.share_procedural + c.share_replay
    if total <= 0 or min(c.share_generator, c.share_procedural, c.share_replay) < 0:
        raise ValueError("mixer shares must be non-negative and not all zero")
    if not c.min_validity <= c.earn_validity or not c.min_in_band <= c.earn_in_band:
        raise ValueError(
            "mixer thresholds must satisfy min_validity <= earn_validity and "
            "min_in_band <= earn_in_band (the generator's trust has hysteresis)"
        )
    if not -1.0 <= c.reference_offset <= 1.0:
        raise ValueError(
            f"mixer.reference_offset must be in [-1, 1] (a difference of solve rates), got {c.reference_offset}"
        )
    if not 0.0 < c.share_rate <= 1.0:
        raise ValueError(f"mixer.share_rate must be in (0, 1], got {c.share_rate}")
    if not 0.0 < c.instruction_explore <= 1.0:
        raise ValueError(
            f"mixer.instruction_explore must be in (0, 1] (0 could drop an instruction for good), got "
            f"{c.instruction_explore}"
        )
    if c.generator_tasks not in GENERATOR_TASKS:
        raise ValueError(
            f"mixer.generator_tasks must be one of {', '.join(GENERATOR_TASKS)}, got {c.generator_tasks!r}"
        )
    if c.in_band_max_age < 1:
        raise ValueError(f"mixer.in_band_max_age must be >= 1 (iterations), got {c.in_band_max_age}")
    if not 0.0 <= c.instruction_discount < 1.0:
        raise ValueError(f"mixer.instruction_discount must be in [0, 1), got {c.instruction_discount}")
    if not 0.0 < c.instruction_power <= 32.0:
        raise ValueError(
            f"mixer.instruction_power must be in (0, 32] (0 is the uniform draw: "
            f"mixer.instruction_follow=false), got {c.instruction_power}"
        )
