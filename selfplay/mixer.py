"""The adaptive difficulty mixer: what the solver trains on next, so that neither agent collapses.

Each iteration the loop asks the mixer for a `BatchPlan` (how many tasks from each source — fresh generator
proposals, procedural tasks, replayed corpus tasks — and at which procedural level) and afterwards tells it
what happened (`IterationStats`). The mixer then

1. **keeps the solver in a target band** (seed article: raise the difficulty when success passes 90 %, lower it when
   success drops): an exponential moving average of the solver's solve rate moves a *fractional* procedural level
   up or down by `level_step`; a level of 2.3 samples level 2 with probability 0.7 and level 3 with 0.3, so the
   curriculum moves smoothly;
2. **prefers replayed tasks near the learnability band**: replay weights peak where the measured solve rate
   (1 − difficulty) is in the middle of the band, and never reach zero;
3. **watches for collapse** and reacts, each detector with its own reaction:
   - generator validity rate below `min_validity` → halve the generator share (down to `min_share_generator`),
     the rest goes to procedural tasks; it recovers towards its base share once validity is back;
   - proposal diversity below `min_diversity` → raise the generator's repetition-penalty weight (×1.5, capped);
   - solver collapse (solve-rate EMA falls `pass_drop` below its best) → more replay, lower learning rate;
   - KL to the reference above `kl_max` → lower learning rate.

Every decision is visible in `metrics()` under `mixer/…` and the whole state round-trips through
`state_dict()` / `load_state_dict()` for checkpoints. The mixer is plain Python (no torch) and deterministic
given its RNG seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Sequence

SOURCES = ("generator", "procedural", "replay")


@dataclass
class MixerConfig:
    target_low: float = 0.4  # lower the procedural level when the solver's solve-rate EMA drops below this
    target_high: float = 0.9  # raise it when the EMA passes this (the seed article's 90 %)
    ema: float = 0.7  # smoothing of the solve rate (weight of the past)
    level_min: float = 1.0  # lowest procedural level
    level_max: float = 4.0  # highest procedural level
    level_start: float = 1.0  # where the curriculum starts
    level_step: float = 0.25  # level change per iteration when out of band
    share_generator: float = 0.4  # base share of fresh generator proposals in a solver batch
    share_procedural: float = 0.4  # base share of procedural tasks
    share_replay: float = 0.2  # base share of replayed corpus tasks
    min_share_generator: float = 0.05  # the generator share never falls below this (it must stay observable)
    max_share_replay: float = 0.6  # cap on the replay share when the solver collapses
    recover: float = 0.1  # per-iteration pull of shares, penalty weight and lr scale back to their base values
    min_validity: float = 0.2  # generator validity-rate EMA below this = generator collapse
    min_diversity: float = 0.3  # proposal diversity (unique clusters / proposals) below this = diversity collapse
    repetition_weight: float = 1.0  # base weight of the generator's repetition penalty
    repetition_weight_max: float = 4.0  # cap when diversity collapses
    pass_drop: float = 0.25  # solver collapse when the solve-rate EMA falls this far below its best
    kl_max: float = 1.0  # KL to the reference above this = policy drifting too fast
    lr_scale_min: float = 0.1  # the learning-rate multiplier never goes below this
    replay_width: float = 0.2  # width of the replay preference around the band's centre (in solve rate)


@dataclass
class BatchPlan:
    counts: dict[str, int]  # source -> number of tasks
    levels: list[int]  # procedural level of each procedural task
    target_solve_rate: float  # centre of the band: replay and generator tasks are chosen near it


@dataclass
class IterationStats:
    solve_rate: float  # solver solve rate on this iteration's batch (all sources)
    validity_rate: float | None = None  # share of generator proposals that passed every check (None: none made)
    diversity: float | None = None  # unique near-duplicate clusters / proposals (None: none made)
    kl: float | None = None  # mean KL of the solver policy to its reference


@dataclass
class _State:
    level: float
    solve_ema: float | None = None
    best_ema: float = 0.0
    validity_ema: float | None = None
    shares: dict[str, float] = field(default_factory=dict)
    repetition_weight: float = 1.0
    lr_scale: float = 1.0
    alarms: dict[str, bool] = field(default_factory=dict)
    steps: int = 0


def _ema(old: float | None, new: float, w: float) -> float:
    return new if old is None else w * old + (1.0 - w) * new


def largest_remainder(shares: dict[str, float], n: int) -> dict[str, int]:
    """Split n items by shares (summing to 1) into integers that sum to n, order-independent ties by name."""
    raw = {k: v * n for k, v in shares.items()}
    counts = {k: int(math.floor(v)) for k, v in raw.items()}
    rest = n - sum(counts.values())
    for k in sorted(raw, key=lambda k: (-(raw[k] - counts[k]), k))[:rest]:
        counts[k] += 1
    return counts


class Mixer:
    def __init__(self, cfg: MixerConfig | None = None, seed: int = 0):
        self.cfg = cfg or MixerConfig()
        c = self.cfg
        if not 0.0 <= c.target_low < c.target_high <= 1.0:
            raise ValueError(f"mixer band must satisfy 0 <= target_low < target_high <= 1, got "
                             f"{c.target_low}, {c.target_high}")
        total = c.share_generator + c.share_procedural + c.share_replay
        if total <= 0 or min(c.share_generator, c.share_procedural, c.share_replay) < 0:
            raise ValueError("mixer shares must be non-negative and not all zero")
        self.base_shares = {"generator": c.share_generator / total, "procedural": c.share_procedural / total,
                            "replay": c.share_replay / total}
        self.rng = random.Random(seed)
        self.s = _State(level=min(max(c.level_start, c.level_min), c.level_max),
                        shares=dict(self.base_shares), repetition_weight=c.repetition_weight)

    # ---- what to train on -------------------------------------------------------------------------------
    @property
    def target_solve_rate(self) -> float:
        return 0.5 * (self.cfg.target_low + self.cfg.target_high)

    @property
    def level(self) -> float:
        return self.s.level

    @property
    def lr_scale(self) -> float:
        return self.s.lr_scale

    @property
    def repetition_weight(self) -> float:
        return self.s.repetition_weight

    @property
    def shares(self) -> dict[str, float]:
        return dict(self.s.shares)

    def sample_level(self) -> int:
        lo = math.floor(self.s.level)
        return int(min(lo + (self.rng.random() < self.s.level - lo), self.cfg.level_max))

    def plan(self, batch_size: int, available: dict[str, int] | None = None) -> BatchPlan:
        """Counts per source for a batch; sources with nothing available hand their share to procedural."""
        shares = dict(self.s.shares)
        if available is not None:
            for src in ("generator", "replay"):
                if available.get(src, 0) <= 0:
                    shares["procedural"] += shares[src]
                    shares[src] = 0.0
        counts = largest_remainder(shares, batch_size)
        if available is not None:
            for src in ("generator", "replay"):
                extra = max(0, counts[src] - available.get(src, 0))
                counts[src] -= extra
                counts["procedural"] += extra
        levels = [self.sample_level() for _ in range(counts["procedural"])]
        return BatchPlan(counts=counts, levels=levels, target_solve_rate=self.target_solve_rate)

    def replay_weights(self, difficulties: Sequence[float | None]) -> list[float]:
        """Preference for replaying tasks of measured difficulty d (solve rate 1 - d): a bump at the band's
        centre with a floor, so every task keeps some chance; unmeasured tasks count as at the centre."""
        out = []
        for d in difficulties:
            p = self.target_solve_rate if d is None else 1.0 - d
            out.append(0.02 + math.exp(-(((p - self.target_solve_rate) / self.cfg.replay_width) ** 2)))
        return out

    def choose_replay(self, ids: Sequence[str], difficulties: Sequence[float | None], n: int) -> list[str]:
        """n distinct ids (or all of them if fewer), drawn without replacement by `replay_weights`."""
        pool = list(zip(ids, self.replay_weights(difficulties)))
        chosen = []
        for _ in range(min(n, len(pool))):
            total = sum(w for _, w in pool)
            x = self.rng.random() * total
            for i, (task_id, w) in enumerate(pool):
                x -= w
                if x <= 0 or i == len(pool) - 1:
                    chosen.append(task_id)
                    pool.pop(i)
                    break
        return chosen

    # ---- what happened ----------------------------------------------------------------------------------
    def observe(self, stats: IterationStats) -> None:
        c, s = self.cfg, self.s
        s.steps += 1
        s.solve_ema = _ema(s.solve_ema, stats.solve_rate, c.ema)
        s.best_ema = max(s.best_ema, s.solve_ema)

        # 1. curriculum: keep the solver inside the band
        if s.solve_ema > c.target_high:
            s.level = min(c.level_max, s.level + c.level_step)
        elif s.solve_ema < c.target_low:
            s.level = max(c.level_min, s.level - c.level_step)

        # 2. collapse detectors, each with its reaction (or a slow recovery once it is quiet)
        if stats.validity_rate is not None:
            s.validity_ema = _ema(s.validity_ema, stats.validity_rate, c.ema)
        alarms = {
            "generator_validity": s.validity_ema is not None and s.validity_ema < c.min_validity,
            "generator_diversity": stats.diversity is not None and stats.diversity < c.min_diversity,
            "solver_collapse": s.steps > 3 and s.solve_ema < s.best_ema - c.pass_drop,
            "kl_blowup": stats.kl is not None and stats.kl > c.kl_max,
        }
        s.alarms = alarms
        shares = s.shares
        if alarms["generator_validity"]:
            shares["generator"] = max(c.min_share_generator, 0.5 * shares["generator"])
        if alarms["solver_collapse"]:
            shares["replay"] = min(c.max_share_replay, 1.5 * shares["replay"] + 0.05)
        for src in ("generator", "replay"):
            quiet = not (alarms["generator_validity"] if src == "generator" else alarms["solver_collapse"])
            if quiet:
                shares[src] += c.recover * (self.base_shares[src] - shares[src])
        shares["procedural"] = max(0.0, 1.0 - shares["generator"] - shares["replay"])

        if alarms["generator_diversity"]:
            s.repetition_weight = min(c.repetition_weight_max, 1.5 * s.repetition_weight)
        else:
            s.repetition_weight += c.recover * (c.repetition_weight - s.repetition_weight)

        if alarms["solver_collapse"] or alarms["kl_blowup"]:
            s.lr_scale = max(c.lr_scale_min, 0.5 * s.lr_scale)
        else:
            s.lr_scale += c.recover * (1.0 - s.lr_scale)

    def metrics(self) -> dict[str, float]:
        """Scalars for TensorBoard, under the `mixer/` prefix (DESIGN.md §4)."""
        s = self.s
        out = {
            "mixer/target_solve_rate": self.target_solve_rate,
            "mixer/level": s.level,
            "mixer/solve_rate_ema": s.solve_ema if s.solve_ema is not None else float("nan"),
            "mixer/repetition_weight": s.repetition_weight,
            "mixer/lr_scale": s.lr_scale,
        }
        out.update({f"mixer/share/{k}": v for k, v in s.shares.items()})
        out.update({f"mixer/alarm/{k}": float(v) for k, v in s.alarms.items()})
        return out

    # ---- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"state": asdict(self.s), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.s = _State(**state["state"])
        rng_state = state["rng"]
        # JSON turns the RNG's tuples into lists; random.setstate needs tuples back
        self.rng.setstate((rng_state[0], tuple(rng_state[1]), rng_state[2]))
