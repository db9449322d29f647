"""Where the solver's tasks come from: one small source per `train.mode`, behind one interface.

    source = make_source(cfg, mixer=mixer, sb=sb, corpus=corpus, run_dir=run_dir, log=log)
    drawn = source.draw(n, rng, step=step, offered=valid_generator_tasks, pool=replay_pool)
    ...                                   # rollouts, rewards, updates on drawn.tasks (+ drawn.extra to measure)
    source.observe(stats)                 # what happened (an IterationStats); a source may adapt to it
    metrics.update(source.metrics(step))  # its figures for TensorBoard
    state = source.state_dict()           # checkpointed; load_state_dict(state) on resume

| mode         | source             | the solver's tasks                                                            |
|--------------|--------------------|-------------------------------------------------------------------------------|
| `selfplay`   | `MixerSource`      | generator proposals, procedural and replayed tasks, split by the adaptive mixer |
| `warmstart`  | `MixerSource`      | the same split by a mixer that never adapts (no RL: the solver is evaluated)  |
| `curriculum` | `CurriculumSource` | procedural tasks on a fixed level schedule that reaches the top within the run |
| `uniform`    | `UniformSource`    | procedural tasks, each at a level drawn uniformly from the mixer's range       |
| `fixed`      | `FixedSource`      | one fixed task set, in a seeded order that depends only on the step           |

How each task is asked (the program kind, or code_io's deduction, abduction, induction: `mixer.kinds`) is drawn
by the mixer for the whole batch in every mode, after the source (`Draw.kinds`, `Mixer.draw_kinds`).

A source is used by rank 0 alone (the loop broadcasts what it draws). Its draws are a function of the step, the
loop's RNG, the corpus and (for `MixerSource`) the mixer, so a run resumed from a checkpoint draws exactly what the
uninterrupted run drew. The mixer is checkpointed by the loop (it also weighs the generator's repetition penalty,
picks its reference tasks and scales the learning rate); what a source keeps of its own is in `state_dict()`.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from generator.schema import Task
from selfplay.runtime import paths, seeds
from selfplay.runtime.errors import UserError
from selfplay.runtime.paths import RunPaths
from selfplay.train.mixer import IterationStats, Mixer

MODES = ("selfplay", "curriculum", "uniform", "fixed", "warmstart")
FIXED_SOURCES = ("corpus", "fresh", "reserved")  # train.fixed_source
FIXED_TASKS_FILE = paths.FIXED_TASKS  # fixed mode: the task set, chosen on first use
RESERVED_TASKS_FILE = paths.RESERVED_TASKS  # train.fixed_source=reserved: the pool the warm start kept out of SFT


@dataclass
class Draw:
    """One iteration's solver tasks as a source chose them."""

    tasks: list[Task]  # for PPO, in this order (the loop tops it up from the replay pool if short)
    counts: dict[str, int]  # tasks per origin, in the order `tasks` lists them: the `solver/batch/<origin>` scalars
    extra: list[Task] = field(default_factory=list)  # generator tasks beyond its share: attempted to measure only
    new_ids: set[str] = field(default_factory=set)  # fresh procedural tasks, not yet in the corpus
    queued: list[Task] = field(default_factory=list)  # new tasks to write to the corpus now (fixed_source=fresh)
    # the kind each of `tasks` is asked in (solver/kinds.py), drawn by the mixer for the batch the loop serves
    # (Mixer.draw_kinds, mixer.kinds); empty: every task a program task. `extra` tasks are program tasks
    kinds: list[str] = field(default_factory=list)


class ProceduralStream:
    """Fresh procedural tasks at given levels, seeded by the step: they may repeat a training program (with new
    inputs), never a reserved (held-out) one."""

    def __init__(self, tasks_cfg, seed: int, sb, corpus):
        self.tasks_cfg, self.seed, self.sb, self.corpus = tasks_cfg, seed, sb, corpus

    def __call__(self, levels: list[int], step: int) -> list[Task]:
        from generator.build import BuildConfig, generate_tasks

        out = []
        for level, count in sorted(Counter(levels).items()):
            out += generate_tasks(
                count,
                level=level,
                split="train",
                seed=seeds.derive(self.seed, "procedural", step),
                sb=self.sb,
                corpus_index=self.corpus.reserved_index(),
                cfg=BuildConfig.from_config(self.tasks_cfg),
            )
        return out


class TaskSource:
    """The interface: `draw` the solver's tasks, `observe` what happened, report `metrics`, checkpoint state."""

    name = "source"
    # the modes without a generator (curriculum, uniform, fixed): the loop's mixer, whose solver detectors they run
    # (`Mixer.watch`: the learning-rate scale and the replay share, mixer.lr_control and mixer.corpus_replay)
    control: Mixer | None = None

    def draw(self, n: int, rng: random.Random, *, step: int, offered: list[Task], pool: list[Task]) -> Draw:
        """`n` tasks for iteration `step` (1-based). `offered`: this iteration's valid generator proposals;
        `pool`: corpus training tasks in a seeded random order (to replay from)."""
        raise NotImplementedError

    def observe(self, stats: IterationStats) -> None:
        """What the iteration measured; a source that adapts uses it."""

    def metrics(self, step: int) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def _replayed(self, n: int, pool: list[Task]) -> list[Task]:
        """The control mixer's replayed corpus tasks for a batch of n (none without it or with corpus_replay off)."""
        if self.control is None:
            return []
        k = self.control.replay_count(n, len(pool))
        chosen = set(self.control.choose_replay([x.id for x in pool], [x.difficulty for x in pool], k)) if k else set()
        return [x for x in pool if x.id in chosen]

    def _watch(self, stats: IterationStats, level_rose: bool = False) -> None:
        if self.control is not None:
            self.control.watch(stats, level_rose)

    def _watch_metrics(self) -> dict[str, float]:
        return self.control.watch_metrics() if self.control is not None else {}


class InBandPool:
    """Generator tasks the solver was measured to solve sometimes (0 < p < 1), kept to fill the generator's share
    of a later batch (`mixer.generator_tasks=in_band`). A fresh proposal is in band about one time in four on the
    tiny default; one measured in band once is likelier to be in band again (its measure selected it), so the
    solver trains on generator tasks that give its PPO a signal, as SFL trains on the levels of highest measured
    learnability. Each task is served once, newest first; one measured more than `max_age` iterations ago is
    dropped (the solver it was measured against has moved on)."""

    def __init__(self, max_age: int):
        self.max_age = max_age
        self.entries: list[tuple[int, Task]] = []  # (iteration measured, task), oldest first

    def add(self, tasks: list[Task], rates: dict[str, float], step: int) -> None:
        for task in tasks:
            p = rates.get(task.id)
            if p is not None and 0.0 < p < 1.0:
                self.entries.append((step, task))

    def prune(self, step: int) -> int:
        """Drop what is too old to serve at `step`; the number of tasks left."""
        self.entries = [(s, t) for s, t in self.entries if step - s <= self.max_age]
        return len(self.entries)

    def take(self, n: int, step: int) -> list[Task]:
        """Up to n tasks for iteration `step`, newest first, each removed from the pool."""
        self.prune(step)
        k = min(max(0, n), len(self.entries))
        taken = [t for _, t in reversed(self.entries[len(self.entries) - k :])]
        del self.entries[len(self.entries) - k :]
        return taken

    def state_dict(self) -> dict:
        return {"in_band_pool": [[s, t.to_dict()] for s, t in self.entries]}

    def load_state_dict(self, state: dict) -> None:
        self.entries = [(int(s), Task.from_dict(t)) for s, t in state.get("in_band_pool", [])]


class MixerSource(TaskSource):
    """Self-play (`adapt=True`): the mixer splits the batch over the generator's tasks, procedural tasks at its level
    and replayed corpus tasks near the solver's frontier, and adapts to what it observes. The generator's tasks are
    its fresh proposals (shuffled; those beyond its share kept to measure their solve rate), or with an
    `InBandPool` (`mixer.generator_tasks=in_band`) earlier proposals measured in band, topped up with fresh ones;
    then every fresh proposal not served is measured and those in band join the pool. The `warmstart` mode draws
    the same way and never adapts."""

    def __init__(self, mixer: Mixer, procedural: ProceduralStream, *, adapt: bool, in_band: InBandPool | None = None):
        self.mixer, self.procedural, self.adapt, self.in_band = mixer, procedural, adapt, in_band
        self.name = "selfplay" if adapt else "warmstart"
        self.step, self.unserved, self.served_in_band = 0, [], 0  # the last draw's, for observe and metrics

    def draw(self, n, rng, *, step, offered, pool):
        kept = self.in_band.prune(step) if self.in_band is not None else 0
        plan = self.mixer.plan(n, available={"generator": len(offered) + kept, "replay": len(pool)})
        gen = list(offered)
        rng.shuffle(gen)
        share = plan.counts["generator"]
        from_pool = self.in_band.take(share, step) if self.in_band is not None else []
        chosen = from_pool + gen[: share - len(from_pool)]
        extra = gen[share - len(from_pool) :]
        self.step, self.unserved, self.served_in_band = step, extra, len(from_pool)
        pooled_ids = {x.id for x in from_pool}
        pool = [x for x in pool if x.id not in pooled_ids]  # a task is served once in a batch
        replay_ids = set(
            self.mixer.choose_replay([x.id for x in pool], [x.difficulty for x in pool], plan.counts["replay"])
        )
        replay = [x for x in pool if x.id in replay_ids]
        procedural = self.procedural(plan.levels, step)
        return Draw(
            chosen + procedural + replay,
            extra=extra,
            new_ids={x.id for x in procedural},
            counts={"generator": len(chosen), "procedural": len(procedural), "replay": len(replay)},
        )

    def observe(self, stats):
        if self.adapt:
            self.mixer.observe(stats)
            if self.in_band is not None and stats.proposal_rates:
                self.in_band.add(self.unserved, stats.proposal_rates, self.step)

    def metrics(self, step):
        if not self.adapt:
            return {}  # a mixer that never adapts has nothing to say
        out = self.mixer.metrics()
        if self.in_band is not None:  # generator tasks served from the pool this iteration, and kept for later
            out["mixer/in_band_pool/served"] = self.served_in_band
            out["mixer/in_band_pool/kept"] = len(self.in_band.entries)
        return out

    def state_dict(self):
        return self.in_band.state_dict() if self.in_band is not None else {}

    def load_state_dict(self, state):
        if self.in_band is not None:
            self.in_band.load_state_dict(state)


def curriculum_level(step: int, steps: int, levels, steps_per_level: int | None = None) -> int:
    """The curriculum's level at iteration `step` (1-based) of a run of `steps` iterations over `levels` (lowest
    first). Without `steps_per_level`, the run is cut into len(levels) equal stretches, the k-th at the k-th level
    (level index floor((step - 1) * L / steps)): every level is visited, in order, and the last stretch is the top
    level, whatever the run's length (a run shorter than L iterations goes from the lowest to the highest level
    evenly, skipping some between). With `steps_per_level`: that many iterations per level, then the top level
    (a run shorter than L * steps_per_level never reaches it)."""
    levels = list(levels)
    top = len(levels) - 1
    if steps_per_level:
        return levels[min(top, (step - 1) // steps_per_level)]
    steps = max(1, steps)
    if steps >= len(levels):
        return levels[min(top, (step - 1) * len(levels) // steps)]
    if steps == 1:
        return levels[0]
    return levels[min(top, math.floor((step - 1) * top / (steps - 1) + 0.5))]


class CurriculumSource(TaskSource):
    """Procedural tasks only, on a fixed schedule from the lowest of `levels` to the highest
    (`curriculum_level`): `steps_per_level` iterations per level when given (train.curriculum_steps_per_level),
    else the run's `steps` (train.steps) cut into one equal stretch per level, so that the schedule reaches the top
    level within the run whatever its length."""

    name = "curriculum"

    def __init__(
        self, procedural: ProceduralStream, steps_per_level: int | None = None, *, steps: int = 0, levels=(1, 2, 3, 4)
    ):
        if not levels:
            raise UserError("mode curriculum: mixer.level_min..mixer.level_max holds no level")
        if steps_per_level is None and steps < 1:
            raise UserError("mode curriculum: the schedule needs train.steps >= 1 or train.curriculum_steps_per_level")
        self.procedural, self.steps_per_level = procedural, steps_per_level
        self.steps, self.levels = steps, sorted(levels)
        self.step = 0  # the last draw's

    def level(self, step: int) -> int:
        return curriculum_level(step, self.steps, self.levels, self.steps_per_level)

    def draw(self, n, rng, *, step, offered, pool):
        self.step = step
        replay = self._replayed(n, pool)
        procedural = self.procedural([self.level(step)] * (n - len(replay)), step)
        return Draw(
            procedural + replay,
            new_ids={x.id for x in procedural},
            counts={"generator": 0, "procedural": len(procedural), "replay": len(replay)},
        )

    def observe(self, stats):  # a step up the schedule resets the collapse baseline, as a rise of the mixer's level
        self._watch(stats, level_rose=self.step > 1 and self.level(self.step) > self.level(self.step - 1))

    def metrics(self, step):
        return {**self._watch_metrics(), "mixer/level": self.level(step)}  # the schedule's level


class UniformSource(TaskSource):
    """Procedural tasks only, each at a level drawn uniformly from `levels` (the mixer's range,
    `mixer.level_min`..`mixer.level_max`): the baseline with no curriculum at all. The levels are a function of the
    run's seed and the step, so a resumed run draws what the uninterrupted one drew."""

    name = "uniform"

    def __init__(self, procedural: ProceduralStream, levels: list[int], seed: int):
        if not levels:
            raise UserError("mode uniform: mixer.level_min..mixer.level_max holds no level")
        self.procedural, self.levels, self.seed = procedural, list(levels), seed
        self.drawn: list[int] = []  # the last draw's levels

    def draw_levels(self, n: int, step: int) -> list[int]:
        rng = random.Random(seeds.derive(self.seed, "uniform_levels", step))
        return [rng.choice(self.levels) for _ in range(n)]

    def draw(self, n, rng, *, step, offered, pool):
        replay = self._replayed(n, pool)
        self.drawn = self.draw_levels(n, step)[: n - len(replay)]
        procedural = self.procedural(self.drawn, step)
        return Draw(
            procedural + replay,
            new_ids={x.id for x in procedural},
            counts={"generator": 0, "procedural": len(procedural), "replay": len(replay)},
        )

    def observe(self, stats):
        self._watch(stats)

    def metrics(self, step):
        out = self._watch_metrics()
        if self.drawn:
            out["mixer/level"] = sum(self.drawn) / len(self.drawn)  # this draw's mean level
        return out


class FixedSource(TaskSource):
    """One fixed set of `train.fixed_tasks` tasks at `train.fixed_levels`, `n` of them per iteration in the order
    of `fixed_schedule`. The set is read from RUN_DIR/fixed_tasks.jsonl, or on first use made and written there:
    equal shares per level of the corpus's procedural training tasks (seeded order), or with fixed_source=fresh
    new procedural tasks deduplicated against the corpus and the reserved held-out programs (then queued for the
    corpus, like any task the solver trains on), or with fixed_source=reserved the warm start's reserved pool
    (RUN_DIR/reserved_tasks.jsonl; its programs stay reserved, out of the corpus). Its state is the set's
    fingerprint: a resume whose set differs from the checkpointed one says it is not exact."""

    name = "fixed"

    def __init__(self, train_cfg, tasks_cfg, seed: int, sb, corpus, run_dir: Path, log: Callable[[str], None]):
        self.t, self.tasks_cfg, self.seed = train_cfg, tasks_cfg, seed
        self.sb, self.corpus, self.run_dir, self.log = sb, corpus, Path(run_dir), log
        self.tasks: list[Task] | None = None
        self.expected: str | None = None  # the fingerprint a checkpoint recorded

    def draw(self, n, rng, *, step, offered, pool):
        queued = self._load_or_make() if self.tasks is None else []
        fixed = [self.tasks[i] for i in fixed_schedule(len(self.tasks), step, n, self.seed)]
        return Draw(fixed, counts={"fixed": len(fixed)}, queued=queued)

    def observe(self, stats):  # the learning-rate control only: the fixed set has no replayed tasks
        self._watch(stats)

    def metrics(self, step):
        return {k: v for k, v in self._watch_metrics().items() if k != "mixer/share/replay"}

    def _load_or_make(self) -> list[Task]:
        """Sets self.tasks; returns the tasks to queue for the corpus (fresh ones, on first use)."""
        from generator.build import BuildConfig, generate_tasks
        from selfplay.eval.evaluate import read_tasks, write_tasks

        path, queued = RunPaths(self.run_dir).fixed_tasks, []
        if path.exists():
            self.tasks = read_tasks(path)
            self._check_resume()
            return queued
        t, levels, tasks = self.t, list(self.t.fixed_levels), []
        reserved = self._reserved_pool() if t.fixed_source == "reserved" else []
        for level, share in level_shares(t.fixed_tasks, levels):
            if t.fixed_source == "reserved":
                found = [x for x in reserved if x.level == level][:share]
            elif t.fixed_source == "fresh":
                found = generate_tasks(
                    share,
                    level=level,
                    split="train",
                    seed=seeds.derive(self.seed, "fixed-fresh"),
                    sb=self.sb,
                    corpus_index=self.corpus,
                    cfg=BuildConfig.from_config(self.tasks_cfg),
                )
                queued += found
            else:
                found = self.corpus.query(
                    split="train", source="procedural", level=level, order="random", seed=self.seed, limit=share
                )
            if len(found) < share:
                self.log(
                    f"fixed task set: {len(found)} {t.fixed_source} procedural level-{level} tasks, "
                    f"not {share}; using those"
                )
            tasks += found
        if len(tasks) < t.solver_tasks:
            raise UserError(
                f"fixed mode: {len(tasks)} {t.fixed_source} procedural tasks at levels {levels}, "
                f"fewer than train.solver_tasks ({t.solver_tasks}); choose other levels or fixed_source"
            )
        write_tasks(path, tasks)
        self.log(f"fixed task set: {len(tasks)} tasks at levels {levels} -> {path}")
        self.tasks = tasks
        self._check_resume()
        return queued

    def _reserved_pool(self) -> list[Task]:
        from selfplay.eval.evaluate import read_tasks

        path = RunPaths(self.run_dir).reserved_tasks
        if not path.exists():
            raise UserError(
                f"train.fixed_source=reserved: {path} is missing; the pool is drawn by the warm start, so "
                "warm start with train.fixed_source=reserved (and the same train.fixed_tasks)"
            )
        return read_tasks(path)

    def fingerprint(self) -> str | None:
        if self.tasks is None:
            return None
        return hashlib.sha256("\n".join(x.id for x in self.tasks).encode()).hexdigest()[:16]

    def _check_resume(self) -> None:
        if self.expected is not None and self.fingerprint() != self.expected:
            self.log(
                f"the fixed task set ({RunPaths(self.run_dir).fixed_tasks}) is not the one the checkpoint trained "
                f"on; this resume is not exact"
            )

    def state_dict(self) -> dict:
        fp = self.fingerprint() or self.expected
        return {"fixed_tasks": fp} if fp else {}

    def load_state_dict(self, state: dict) -> None:
        self.expected = state.get("fixed_tasks")
        if self.tasks is not None:
            self._check_resume()


def make_source(cfg, *, mixer: Mixer, sb, corpus, run_dir: Path, log: Callable[[str], None]) -> TaskSource:
    """The source of `cfg.train.mode` (checked by `validate`)."""
    t = cfg.train
    procedural = ProceduralStream(cfg.tasks, cfg.run.seed, sb, corpus)
    if t.mode in ("selfplay", "warmstart"):
        in_band = InBandPool(cfg.mixer.in_band_max_age) if cfg.mixer.generator_tasks == "in_band" else None
        return MixerSource(mixer, procedural, adapt=t.mode == "selfplay", in_band=in_band)
    if t.mode == "curriculum":
        source = CurriculumSource(procedural, t.curriculum_steps_per_level, steps=t.steps, levels=mixer_levels(cfg))
    elif t.mode == "uniform":
        source = UniformSource(procedural, mixer_levels(cfg), cfg.run.seed)
    else:
        source = FixedSource(t, cfg.tasks, cfg.run.seed, sb, corpus, run_dir, log)
    source.control = mixer  # the solver's collapse detectors, as self-play's (mixer.lr_control, corpus_replay)
    return source


def mixer_levels(cfg) -> list[int]:
    """The whole levels of the mixer's range, mixer.level_min..mixer.level_max: where self-play's level moves, the
    uniform baseline draws and the curriculum climbs."""
    return list(range(math.ceil(cfg.mixer.level_min), math.floor(cfg.mixer.level_max) + 1))


def validate(train_cfg) -> None:
    """The task-choice settings of the `train:` section; bad ones raise a UserError naming the key."""
    t = train_cfg
    if t.mode not in MODES:
        raise UserError(f"train.mode must be one of {', '.join(MODES)}, got {t.mode!r}")
    if t.fixed_source not in FIXED_SOURCES:  # any mode: the warm start draws the reserved pool
        raise UserError(f"train.fixed_source must be one of {', '.join(FIXED_SOURCES)}, got {t.fixed_source!r}")
    if t.curriculum_steps_per_level is not None and t.curriculum_steps_per_level < 1:
        raise UserError(
            f"train.curriculum_steps_per_level must be >= 1 or null (train.steps cut into one stretch per "
            f"level), got {t.curriculum_steps_per_level}"
        )
    if t.mode == "fixed":
        if t.fixed_tasks < t.solver_tasks:
            raise UserError(f"train.fixed_tasks ({t.fixed_tasks}) must be >= train.solver_tasks ({t.solver_tasks})")
        bad = [lv for lv in t.fixed_levels if lv not in (1, 2, 3, 4)]
        if bad or not t.fixed_levels:
            raise UserError(f"train.fixed_levels must be a non-empty list of levels 1..4, got {list(t.fixed_levels)}")


def reserve_fixed_pool(cfg, sb, corpus, run_dir: Path) -> list[Task]:
    """Warm start with train.fixed_source=reserved: train.fixed_tasks procedural tasks at train.fixed_levels,
    drawn right after the held-out ones and like them (so they sample the same distribution, not the programs
    the SFT corpus left over), reserved in the corpus so SFT never sees their programs, written to
    RUN_DIR/reserved_tasks.jsonl."""
    from generator.build import BuildConfig, generate_tasks
    from selfplay.eval.evaluate import write_tasks

    t = cfg.train
    pool: list[Task] = []
    for level, share in level_shares(t.fixed_tasks, t.fixed_levels):
        pool += generate_tasks(
            share,
            level=level,
            split="train",
            seed=seeds.derive(cfg.run.seed, "reserved-pool"),
            sb=sb,
            corpus_index=corpus,
            cfg=BuildConfig.from_config(cfg.tasks),
        )
    corpus.reserve(pool, reason="fixed pool")
    write_tasks(RunPaths(run_dir).reserved_tasks, pool)
    return pool


def level_shares(total: int, levels) -> list[tuple[int, int]]:
    """[(level, count)]: `total` split over `levels` as evenly as possible, the first levels taking the remainder."""
    levels = list(levels)
    return [(lv, total // len(levels) + (i < total % len(levels))) for i, lv in enumerate(levels)]


def fixed_schedule(n_tasks: int, step: int, per_step: int, seed: int) -> list[int]:
    """Fixed mode: the indices of step `step`'s (1-based) `per_step` tasks. The steps read an endless stream of
    seeded reshuffles of range(n_tasks), one per pass, so every task is seen once per pass and a resumed run sees
    exactly the batches it would have seen."""
    out, orders = [], {}
    for pos in range((step - 1) * per_step, step * per_step):
        epoch, i = divmod(pos, n_tasks)
        if epoch not in orders:
            orders[epoch] = seeds.stream(seed, "fixed", epoch).sample(range(n_tasks), n_tasks)
        out.append(orders[epoch][i])
    return out
