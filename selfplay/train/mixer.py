"""The adaptive difficulty mixer: what the solver trains on next, so that neither agent collapses.

Each iteration the loop asks the mixer for a `BatchPlan` (how many tasks from each source — fresh generator
proposals, procedural tasks, replayed corpus tasks — and at which procedural level) and afterwards tells it
what happened (`IterationStats`, with each task's measured solve rate p over k attempts). The mixer then
(formulas, defaults and reasons in docs/selfplay.md):

1. **moves the procedural level to where the solver's tasks are learnable**: a task teaches PPO something only
   when 0 < p < 1 (its answers then score differently). With `band=adaptive` the signal is the EMA of
   (share of procedural tasks always solved) − (share never solved): above `level_margin` the level rises by
   `level_step`, below −`level_margin` it falls, so the level settles where the two tails balance and most tasks
   are in band, whatever the solver's ability. A fractional level 2.3 samples level 2 with probability 0.7 and
   level 3 with 0.3. (`band=fixed`: the solve-rate EMA against the fixed band `target_low`..`target_high`.)
2. **centres the target band on the solver's ability**: with `band=adaptive` the band's centre is the EMA of the
   mean solve rate of the batch's in-band tasks (`target_low`/`target_high` give the initial centre and the
   width); replayed tasks are chosen near it: a weak solver is shown the tasks it sometimes solves, not tasks at a
   solve rate it never reaches. Replay weights never reach zero. The generator's references are chosen near a
   point above it, the centre plus the measured *edit drop* (EMA of a valid proposal's reference's solve rate
   minus its own; `reference_offset` until one is measured): an edit of a task is, for this solver, harder than
   the task, so an edit lands in the band when its reference sits above it by about that much. A reference never
   attempted counts at the solver's mean procedural solve rate (what a task of its kind is solved at).
3. **lets the generator earn its share of the solver batch**: the share moves (by `share_rate` of the gap per
   iteration) towards `share_generator` while the generator is *trusted* and towards `min_share_generator`
   while it is not, the rest going to procedural tasks (each source's rounding to whole tasks carried to the next
   batch, `carry_rounding`, so that a small batch holds its shares on average). It becomes trusted when the EMAs
   of its validity rate and of its in-band rate (share of valid proposals with 0 < p < 1) reach `earn_validity`
   and `earn_in_band`, and loses that when either falls below `min_validity` or `min_in_band` (hysteresis: in
   between, nothing changes);
4. **can ask for the edits that land in the band** (mutation format, `instruction_follow`): the instruction of each
   generator prompt (add a step, change a constant, change the input type, ...) is then drawn among those its
   references allow with weights that follow each instruction's measured *yield*, the share of its proposals that
   were valid and in band (discounted counts, `instruction_discount`, with one success in two as the prior: an
   instruction not yet tried counts as promising), raised to `instruction_power` (1: in proportion; larger leans on
   the best), mixed with `instruction_explore` of the uniform draw so that no instruction is dropped; with
   `instruction_follow=false` (the default) the draw stays uniform, the warm start's, and the yields are only
   measured and logged;
5. **chooses how each task is asked** (solver/kinds.py, `kinds`): each batch's tasks are split over the solver's
   task kinds (program, deduction, abduction, induction) by the kinds' shares, each kind's rounding carried from
   batch to batch as the sources' is, its places in the batch shuffled by a stream of the seed and the step
   (`draw_kinds`). The shares are the weights of `kinds` (empty: the program kind alone, which draws nothing and
   keeps a run as it was); with `kind_follow` they follow weight × the kind's measured *learnability* (the EMA of
   the share of its tasks in band, 0 < p < 1; one half until measured), mixed with `kind_explore` of the weights
   alone, so that no kind is dropped. Learnability is measured in every mode (`observe` and `watch`);
6. **watches for collapse** and reacts, each detector with its own reaction:
   - proposal diversity below `min_diversity` → raise the generator's repetition-penalty weight (×1.5, capped);
   - solver collapse (the solve-rate EMA falls `pass_drop` below a slow baseline of itself, which a rise of the
     level resets) → more replay, lower learning rate;
   - KL to the reference above `kl_max` → lower learning rate.
   The learning-rate and replay reactions apply in every mode or in none (`lr_control`, `corpus_replay`): the
   curriculum, uniform and fixed sources run the solver's detectors through `watch`, and the loop scales every
   mode's learning rate by `lr_scale`.

Every decision is visible in `metrics()` under `mixer/…` and the whole state round-trips through
`state_dict()` / `load_state_dict()` for checkpoints. The mixer is plain Python (no torch) and deterministic
given its RNG seed.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from selfplay.runtime import seeds

# the mixer: section and its checks, on the config's floor; its names kept here
from selfplay.runtime.config_parts import BANDS, GENERATOR_TASKS, MixerConfig, check_mixer  # noqa: F401
from solver.kinds import KINDS, PROGRAM

SOURCES = ("generator", "procedural", "replay")


@dataclass
class BatchPlan:
    counts: dict[str, int]  # source -> number of tasks
    levels: list[int]  # procedural level of each procedural task
    target_solve_rate: float  # centre of the band: replay and generator tasks are chosen near it


@dataclass
class IterationStats:
    solve_rate: float  # solver solve rate on this iteration's batch (all sources)
    validity_rate: float | None = None  # share of generator proposals that passed every check (None: none made)
    diversity: float | None = None  # unique near-duplicate clusters / valid proposals (None: none valid)
    kl: float | None = None  # mean KL of the solver policy to its reference
    task_rates: Sequence[float] | None = None  # measured solve rate p of each task of the solver batch
    procedural_rates: Sequence[float] | None = None  # ... of each of its procedural tasks
    generator_in_band: float | None = None  # share of valid proposals with 0 < p < 1 (None: none valid)
    # per valid proposal whose reference had a measured solve rate: the reference's rate minus the proposal's
    edit_drops: Sequence[float] | None = None
    # (instruction, valid and in band) for each mutation proposal of the iteration
    instructions: Sequence[tuple[str, bool]] | None = None
    # task id -> measured solve rate p of each valid proposal of the iteration
    proposal_rates: dict[str, float] | None = None
    # solver task kind -> the measured solve rate p of each task of the batch asked in it (mixer.kinds)
    kind_rates: dict[str, list[float]] | None = None


@dataclass
class _State:
    level: float
    band_centre: float = 0.65
    level_signal: float | None = None  # EMA of (always solved - never solved) over procedural tasks
    solve_ema: float | None = None
    baseline: float | None = None  # slow EMA of solve_ema: what a sudden drop is measured against
    validity_ema: float | None = None
    in_band_ema: float | None = None
    edit_drop: float | None = None  # EMA of (reference's solve rate - its valid proposal's)
    trusted: bool = False  # the generator has earned its share
    shares: dict[str, float] = field(default_factory=dict)
    repetition_weight: float = 1.0
    lr_scale: float = 1.0
    alarms: dict[str, bool] = field(default_factory=dict)
    steps: int = 0
    # instruction -> [discounted proposals valid and in band, discounted proposals]
    instruction_counts: dict[str, list[float]] = field(default_factory=dict)
    carry: dict[str, float] = field(default_factory=dict)  # source -> its share's rounding owed from past batches
    kind_learnability: dict[str, float] = field(default_factory=dict)  # solver task kind -> EMA of its in-band share
    kind_carry: dict[str, float] = field(default_factory=dict)  # solver task kind -> its rounding owed


def _ema(old: float | None, new: float, w: float) -> float:
    return new if old is None else w * old + (1.0 - w) * new


def in_band_share(rates: Sequence[float]) -> float | None:
    """Share of rates strictly between 0 and 1 (None for none)."""
    return sum(0.0 < p < 1.0 for p in rates) / len(rates) if rates else None


def edit_drops(references, proposals, rates: dict[str, float]) -> list[float]:
    """For each proposal (a task with `parent_ids`) with a measured solve rate in `rates` whose first parent is
    among the reference groups `references` with a measured difficulty: the parent's solve rate minus its own."""
    parent_rate = {t.id: 1.0 - t.difficulty for group in references for t in group if t.difficulty is not None}
    return [
        parent_rate[x.parent_ids[0]] - rates[x.id]
        for x in proposals
        if x.id in rates and x.parent_ids and x.parent_ids[0] in parent_rate
    ]


def check_kinds(c) -> None:
    """`mixer.kinds` (known kinds, positive weights), `mixer.kind_max_new_tokens` (known kinds, >= 1) and
    `mixer.kind_explore` (in (0, 1]): a ValueError naming the key."""
    for key in ("kinds", "kind_max_new_tokens"):
        unknown = sorted(set(getattr(c, key)) - set(KINDS))
        if unknown:
            raise ValueError(f"mixer.{key}: unknown kind(s) {', '.join(map(str, unknown))}; use {', '.join(KINDS)}")
    bad = {k: w for k, w in c.kinds.items() if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0)}
    if bad:
        raise ValueError(f"mixer.kinds: weights must be positive (leave a kind out to not ask it), got {bad}")
    short = {k: n for k, n in c.kind_max_new_tokens.items() if not (isinstance(n, int) and n >= 1)}
    if short:
        raise ValueError(f"mixer.kind_max_new_tokens: budgets must be whole tokens >= 1, got {short}")
    if not 0.0 < c.kind_explore <= 1.0:
        raise ValueError(f"mixer.kind_explore must be in (0, 1] (0 could drop a kind for good), got {c.kind_explore}")


def _bump(p: float, centre: float, width: float) -> float:
    """A preference for solve rate p: a Gaussian bump at `centre` over a floor of 0.02."""
    return 0.02 + math.exp(-(((p - centre) / width) ** 2))


def largest_remainder(shares: dict[str, float], n: int) -> dict[str, int]:
    """Split n items by shares (summing to 1) into integers that sum to n, order-independent ties by name."""
    return round_quotas({k: v * n for k, v in shares.items()}, n)


def round_quotas(quotas: dict[str, float], n: int) -> dict[str, int]:
    """Non-negative integers summing to n from quotas summing to n: each quota's floor (0 for a negative quota),
    one more for the largest remainders, ties by name; so each count is its quota's floor or ceiling, unless
    several quotas are negative and the floors pass n, when the smallest remainders give back (a plan's carried
    quotas have at most one below 0, by less than 1)."""
    counts = {k: max(0, int(math.floor(v))) for k, v in quotas.items()}
    by_remainder = sorted(quotas, key=lambda k: (-(quotas[k] - counts[k]), k))
    rest = n - sum(counts.values())
    for k in by_remainder[: max(rest, 0)]:
        counts[k] += 1
    while rest < 0:  # floors above n (a negative quota's 0 stands above it): the smallest remainder gives one back
        k = min((k for k in quotas if counts[k] > 0), key=lambda k: (quotas[k] - counts[k], k))
        counts[k] -= 1
        rest += 1
    return counts


class Mixer:
    def __init__(self, cfg: MixerConfig | None = None, seed: int = 0):
        self.cfg = cfg or MixerConfig()
        c = self.cfg
        check_mixer(c)
        check_kinds(c)
        weights = {k: float(w) for k, w in c.kinds.items()} or {PROGRAM: 1.0}
        total_weight = sum(weights.values())
        # solver task kind -> its base share, in the order of KINDS (a function of the config, not of its order)
        self.kind_weights = {k: weights[k] / total_weight for k in KINDS if k in weights}
        self.seed = seed
        total = c.share_generator + c.share_procedural + c.share_replay
        self.base_shares = {
            "generator": c.share_generator / total,
            "procedural": c.share_procedural / total,
            "replay": c.share_replay / total,
        }
        if not c.corpus_replay:  # no replay in any mode: its share goes to procedural tasks
            self.base_shares["procedural"] += self.base_shares["replay"]
            self.base_shares["replay"] = 0.0
        self.min_generator = min(c.min_share_generator, self.base_shares["generator"])
        shares = dict(self.base_shares, generator=self.min_generator)
        shares["procedural"] = 1.0 - shares["generator"] - shares["replay"]
        self.rng = random.Random(seed)
        self.s = _State(
            level=min(max(c.level_start, c.level_min), c.level_max),
            band_centre=0.5 * (c.target_low + c.target_high),
            shares=shares,
            repetition_weight=c.repetition_weight,
        )

    # ---- what to train on -------------------------------------------------------------------------------
    @property
    def target_solve_rate(self) -> float:
        return self.s.band_centre

    @property
    def band(self) -> tuple[float, float]:
        """(low, high): the band's edges, its width that of target_low..target_high, clipped to [0, 1]."""
        half = 0.5 * (self.cfg.target_high - self.cfg.target_low)
        return max(0.0, self.s.band_centre - half), min(1.0, self.s.band_centre + half)

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

    @property
    def trusted(self) -> bool:
        return self.s.trusted

    def sample_level(self) -> int:
        lo = math.floor(self.s.level)
        return int(min(lo + (self.rng.random() < self.s.level - lo), self.cfg.level_max))

    def plan(self, batch_size: int, available: dict[str, int] | None = None) -> BatchPlan:
        """Counts per source for a batch; sources with nothing available hand their share to procedural."""
        shares = dict(self.s.shares)
        carry = dict(self.s.carry)
        if available is not None:
            for src in ("generator", "replay"):
                if available.get(src, 0) <= 0:
                    shares["procedural"] += shares[src]
                    shares[src] = 0.0
                    # it is owed nothing it cannot take: what rounding owed it goes to procedural with its share
                    carry["procedural"] = carry.get("procedural", 0.0) + carry.pop(src, 0.0)
        # this batch's quotas plus what rounding owes each source from the last ones (nothing unless carry_rounding)
        quotas = {k: v * batch_size + carry.get(k, 0.0) for k, v in shares.items()}
        counts = round_quotas(quotas, batch_size)
        if self.cfg.carry_rounding:
            self.s.carry = {k: quotas[k] - counts[k] for k in quotas}
        if available is not None:
            for src in ("generator", "replay"):
                extra = max(0, counts[src] - available.get(src, 0))
                counts[src] -= extra
                counts["procedural"] += extra
        levels = [self.sample_level() for _ in range(counts["procedural"])]
        return BatchPlan(counts=counts, levels=levels, target_solve_rate=self.target_solve_rate)

    def replay_count(self, batch_size: int, available: int) -> int:
        """The modes without a generator (curriculum, uniform; mixer.corpus_replay): replayed corpus tasks in a batch
        of `batch_size`, at the replay share (its rounding carried from batch to batch with carry_rounding, as
        `plan` carries it), at most `available`; the rest of the batch is the source's procedural tasks."""
        if available <= 0 or not self.cfg.corpus_replay:
            return 0
        quota = self.s.shares["replay"] * batch_size + self.s.carry.get("replay", 0.0)
        count = min(batch_size, max(0, math.floor(quota + 0.5)))
        if self.cfg.carry_rounding:
            self.s.carry = {"replay": quota - count}
        return min(count, available)

    @property
    def asks_kinds(self) -> bool:
        """Whether any kind but the program kind is asked (else the draw, the state and the scalars are as before)."""
        return set(self.kind_weights) != {PROGRAM}

    def kind_learnability(self, kind: str) -> float:
        """The EMA of the share of the kind's tasks in band (0 < p < 1); one half until measured."""
        return self.s.kind_learnability.get(kind, 0.5)

    def kind_shares(self) -> dict[str, float]:
        """The share of the next batch asked in each kind: the weights, or with `kind_follow` weight × learnability,
        normalised, mixed with `kind_explore` of the weights."""
        weights = self.kind_weights
        if not self.cfg.kind_follow:
            return dict(weights)
        followed = {k: w * self.kind_learnability(k) for k, w in weights.items()}
        total, explore = sum(followed.values()), self.cfg.kind_explore
        if total <= 0:  # every kind measured never in band: nothing to follow
            return dict(weights)
        return {k: (1.0 - explore) * followed[k] / total + explore * weights[k] for k in weights}

    def draw_kinds(self, n: int, step: int) -> list[str]:
        """The kind of each of a batch's n tasks (in the batch's order): each kind's count its share's quota with
        the rounding carried from past batches (`carry_rounding`), the places shuffled by a stream of the run's seed
        and the step (so a resumed run draws what the straight one drew). The program kind alone: n of it, with no
        draw and no state changed."""
        if not self.asks_kinds:
            return [PROGRAM] * n
        shares, carry = self.kind_shares(), self.s.kind_carry
        quotas = {k: v * n + carry.get(k, 0.0) for k, v in shares.items()}
        counts = round_quotas(quotas, n)
        if self.cfg.carry_rounding:
            self.s.kind_carry = {k: quotas[k] - counts[k] for k in quotas}
        kinds = [k for k in shares for _ in range(counts[k])]
        random.Random(seeds.derive(self.seed, "kinds", step)).shuffle(kinds)
        return kinds

    def _track_kinds(self, stats: IterationStats) -> None:
        """Each kind's learnability: the EMA of its tasks' in-band share this iteration (kinds with tasks only; none
        measured for the program kind alone, whose state stays as it was)."""
        if not self.asks_kinds:
            return
        for kind, rates in (stats.kind_rates or {}).items():
            share = in_band_share(rates)
            if share is not None:
                self.s.kind_learnability[kind] = _ema(self.s.kind_learnability.get(kind), share, self.cfg.ema)

    def kind_metrics(self) -> dict[str, float]:
        """Each kind's share of the next batch and learnability, under `mixer/kind/` (none for the program kind
        alone)."""
        if not self.asks_kinds:
            return {}
        out = {f"mixer/kind/{k}/share": v for k, v in self.kind_shares().items()}
        out.update({f"mixer/kind/{k}/learnability": self.kind_learnability(k) for k in self.kind_weights})
        return out

    def replay_weights(self, difficulties: Sequence[float | None]) -> list[float]:
        """Preference for replaying tasks of measured difficulty d (solve rate 1 - d): a bump at the band's
        centre with a floor, so every task keeps some chance; unmeasured tasks count as at the centre."""
        return [
            _bump(self.target_solve_rate if d is None else 1.0 - d, self.target_solve_rate, self.cfg.replay_width)
            for d in difficulties
        ]

    @property
    def reference_target(self) -> float:
        """The solve rate the generator's references are preferred at: the band's centre plus the edit drop."""
        c, s = self.cfg, self.s
        drop = s.edit_drop if c.reference_follow and s.edit_drop is not None else c.reference_offset
        return min(1.0, max(0.0, self.target_solve_rate + drop))

    def reference_weights(self, difficulties: Sequence[float | None]) -> list[float]:
        """Preference for showing the generator a reference of measured difficulty d: the replay bump moved to
        `reference_target`; a task never attempted counts at the solver's mean procedural solve rate."""
        prior = self.s.solve_ema if self.s.solve_ema is not None else self.target_solve_rate
        return [
            _bump(prior if d is None else 1.0 - d, self.reference_target, self.cfg.replay_width) for d in difficulties
        ]

    def choose_replay(self, ids: Sequence[str], difficulties: Sequence[float | None], n: int) -> list[str]:
        """n distinct ids (or all of them if fewer), drawn without replacement by `replay_weights`."""
        return self._draw(ids, self.replay_weights(difficulties), n)

    def choose_references(self, ids: Sequence[str], difficulties: Sequence[float | None], n: int) -> list[str]:
        """n distinct reference ids for one generator prompt, drawn without replacement by `reference_weights`."""
        return self._draw(ids, self.reference_weights(difficulties), n)

    def instruction_yield(self, name: str) -> float:
        """The measured share of `name`'s proposals that were valid and in band: (successes + 1) / (proposals + 2)
        over discounted counts, 0.5 for an instruction not yet tried."""
        hits, n = self.s.instruction_counts.get(name, (0.0, 0.0))
        return (hits + 1.0) / (n + 2.0)

    def instruction_weights(self, names: Sequence[str]) -> list[float] | None:
        """Draw weights for the edit instructions `names` (those one prompt's references allow): their yields raised
        to `instruction_power`, normalised, mixed with `instruction_explore` of the uniform draw. None with
        `instruction_follow=false` (the caller then draws uniformly, as the warm start does)."""
        if not self.cfg.instruction_follow or not names:
            return None
        powered = [self.instruction_yield(n) ** self.cfg.instruction_power for n in names]
        total, explore = sum(powered), self.cfg.instruction_explore
        return [(1.0 - explore) * y / total + explore / len(names) for y in powered]

    def _draw(self, ids: Sequence[str], weights: Sequence[float], n: int) -> list[str]:
        pool = list(zip(ids, weights))
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
        self._track_solve_rate(stats)
        self._track_kinds(stats)
        level = s.level
        self._follow_the_solver(stats)
        if s.level > level:  # harder tasks are solved less often: that is the curriculum, not a collapse
            s.baseline = s.solve_ema
        self._trust_the_generator(stats)
        if stats.edit_drops:
            s.edit_drop = _ema(s.edit_drop, statistics.fmean(stats.edit_drops), c.ema)
        if stats.instructions:
            self._count_instructions(stats.instructions)

        alarms = {
            "generator_validity": s.validity_ema is not None and s.validity_ema < c.min_validity,
            "generator_in_band": s.in_band_ema is not None and s.in_band_ema < c.min_in_band,
            "generator_diversity": stats.diversity is not None and stats.diversity < c.min_diversity,
            **self._solver_alarms(stats),
        }
        s.alarms = alarms
        shares = s.shares
        target = self.base_shares["generator"] if s.trusted else self.min_generator
        shares["generator"] += c.share_rate * (target - shares["generator"])
        self._react_replay(alarms, shares["generator"])

        if alarms["generator_diversity"]:
            s.repetition_weight = min(c.repetition_weight_max, 1.5 * s.repetition_weight)
        else:
            s.repetition_weight += c.recover * (c.repetition_weight - s.repetition_weight)
        self._react_lr(alarms)

    def watch(self, stats: IterationStats, level_rose: bool = False) -> None:
        """The solver's detectors and reactions alone, for the modes without a generator (curriculum, uniform,
        fixed): the solve-rate EMA against its slow baseline (reset when the source's level rose, `level_rose`, as
        self-play's is when the mixer's rises), the solver-collapse and KL alarms, the band's centre the replayed
        tasks are chosen near (band=adaptive), the replay share (mixer.corpus_replay) and the learning-rate scale
        (mixer.lr_control), by the same rules as `observe`. The level, the generator's share and trust, the
        repetition penalty and the instruction yields stay where they are."""
        c, s = self.cfg, self.s
        s.steps += 1
        self._track_solve_rate(stats)
        self._track_kinds(stats)
        if level_rose:
            s.baseline = s.solve_ema
        if c.band == "adaptive" and stats.task_rates:
            in_band = [p for p in stats.task_rates if 0.0 < p < 1.0]
            if in_band:
                s.band_centre = _ema(s.band_centre, statistics.fmean(in_band), c.ema)
        s.alarms = self._solver_alarms(stats)
        self._react_replay(s.alarms, 0.0)  # no generator: the replay share is out of the whole batch
        self._react_lr(s.alarms)

    def _track_solve_rate(self, stats: IterationStats) -> None:
        c, s = self.cfg, self.s
        # the procedural tasks' solve rate when there are some: the generator's share (and its tasks' difficulty)
        # must not read as the solver getting better or worse
        rate = statistics.fmean(stats.procedural_rates) if stats.procedural_rates else stats.solve_rate
        s.solve_ema = _ema(s.solve_ema, rate, c.ema)
        s.baseline = _ema(s.baseline, s.solve_ema, c.baseline_ema)

    def _solver_alarms(self, stats: IterationStats) -> dict[str, bool]:
        c, s = self.cfg, self.s
        return {
            "solver_collapse": s.steps > 3 and s.solve_ema < s.baseline - c.pass_drop,
            "kl_blowup": stats.kl is not None and stats.kl > c.kl_max,
        }

    def _react_replay(self, alarms: dict[str, bool], generator_share: float) -> None:
        """More replay on a solver collapse, back towards the base share otherwise (none with corpus_replay off)."""
        c, shares = self.cfg, self.s.shares
        if not c.corpus_replay:
            shares["replay"] = 0.0
        elif alarms["solver_collapse"]:
            shares["replay"] = min(c.max_share_replay, 1.5 * shares["replay"] + 0.05)
        else:
            shares["replay"] += c.recover * (self.base_shares["replay"] - shares["replay"])
        shares["replay"] = min(shares["replay"], 1.0 - generator_share)
        shares["procedural"] = max(0.0, 1.0 - shares["generator"] - shares["replay"])

    def _react_lr(self, alarms: dict[str, bool]) -> None:
        """Halve the learning-rate scale on a solver collapse or a KL blow-up, recover otherwise (lr_control)."""
        c, s = self.cfg, self.s
        if not c.lr_control:
            s.lr_scale = 1.0
        elif alarms["solver_collapse"] or alarms["kl_blowup"]:
            s.lr_scale = max(c.lr_scale_min, 0.5 * s.lr_scale)
        else:
            s.lr_scale += c.recover * (1.0 - s.lr_scale)

    def _follow_the_solver(self, stats: IterationStats) -> None:
        """The level (and, adaptive, the band's centre) after this iteration's measured solve rates."""
        c, s = self.cfg, self.s
        if c.band == "adaptive" and stats.task_rates:
            in_band = [p for p in stats.task_rates if 0.0 < p < 1.0]
            if in_band:  # none in band says nothing about where the band is: the level moves instead
                s.band_centre = _ema(s.band_centre, statistics.fmean(in_band), c.ema)
        if c.band == "adaptive" and stats.procedural_rates is not None:
            rates = stats.procedural_rates
            if rates:
                tails = (sum(p >= 1.0 for p in rates) - sum(p <= 0.0 for p in rates)) / len(rates)
                s.level_signal = _ema(s.level_signal, tails, c.ema)
                if s.level_signal > c.level_margin:
                    s.level = min(c.level_max, s.level + c.level_step)
                elif s.level_signal < -c.level_margin:
                    s.level = max(c.level_min, s.level - c.level_step)
            return
        low, high = self.band  # fixed (or no per-task rates): keep the solve-rate EMA inside the band
        if s.solve_ema > high:
            s.level = min(c.level_max, s.level + c.level_step)
        elif s.solve_ema < low:
            s.level = max(c.level_min, s.level - c.level_step)

    def _count_instructions(self, outcomes: Sequence[tuple[str, bool]]) -> None:
        """Discount every instruction's counts, then add this iteration's proposals."""
        d, counts = self.cfg.instruction_discount, self.s.instruction_counts
        for pair in counts.values():
            pair[0], pair[1] = d * pair[0], d * pair[1]
        for name, good in outcomes:
            pair = counts.setdefault(name, [0.0, 0.0])
            pair[0] += float(good)
            pair[1] += 1.0

    def _trust_the_generator(self, stats: IterationStats) -> None:
        c, s = self.cfg, self.s
        if stats.validity_rate is not None:
            s.validity_ema = _ema(s.validity_ema, stats.validity_rate, c.ema)
        if stats.generator_in_band is not None:
            s.in_band_ema = _ema(s.in_band_ema, stats.generator_in_band, c.ema)
        if s.validity_ema is None or s.in_band_ema is None:
            return
        if s.trusted:
            s.trusted = s.validity_ema >= c.min_validity and s.in_band_ema >= c.min_in_band
        else:
            s.trusted = s.validity_ema >= c.earn_validity and s.in_band_ema >= c.earn_in_band

    def metrics(self) -> dict[str, float]:
        """Scalars for TensorBoard, under the `mixer/` prefix."""
        s = self.s
        nan = float("nan")
        low, high = self.band
        out = {
            "mixer/target_solve_rate": self.target_solve_rate,
            "mixer/target_low": low,
            "mixer/target_high": high,
            "mixer/level": s.level,
            "mixer/level_signal": s.level_signal if s.level_signal is not None else nan,
            "mixer/solve_rate_ema": s.solve_ema if s.solve_ema is not None else nan,
            "mixer/validity_ema": s.validity_ema if s.validity_ema is not None else nan,
            "mixer/in_band_ema": s.in_band_ema if s.in_band_ema is not None else nan,
            "mixer/reference_target": self.reference_target,
            "mixer/generator_trusted": float(s.trusted),
            "mixer/repetition_weight": s.repetition_weight,
            "mixer/lr_scale": s.lr_scale,
        }
        if s.edit_drop is not None:  # from the first valid proposal of a measured reference on
            out["mixer/edit_drop"] = s.edit_drop
        out.update({f"mixer/share/{k}": v for k, v in s.shares.items()})
        out.update({f"mixer/instruction_yield/{k}": self.instruction_yield(k) for k in sorted(s.instruction_counts)})
        out.update({f"mixer/alarm/{k}": float(v) for k, v in s.alarms.items()})
        out.update(self.kind_metrics())
        return out

    def watch_metrics(self) -> dict[str, float]:
        """What `watch` moves, under the `mixer/` prefix (the modes without a generator)."""
        s = self.s
        out = {
            "mixer/lr_scale": s.lr_scale,
            "mixer/share/replay": s.shares["replay"],
            "mixer/target_solve_rate": self.target_solve_rate,
            "mixer/solve_rate_ema": s.solve_ema if s.solve_ema is not None else float("nan"),
        }
        out.update({f"mixer/alarm/{k}": float(v) for k, v in s.alarms.items()})
        out.update(self.kind_metrics())
        return out

    # ---- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"state": asdict(self.s), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        """A state saved before a field existed keeps that field's starting value (one that no longer exists is
        dropped)."""
        fields = asdict(self.s)
        fields.update({k: v for k, v in state["state"].items() if k in fields})
        self.s = _State(**fields)
        rng_state = state["rng"]
        # JSON turns the RNG's tuples into lists; random.setstate needs tuples back
        self.rng.setstate((rng_state[0], tuple(rng_state[1]), rng_state[2]))
