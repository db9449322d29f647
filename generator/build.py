"""Make complete procedural tasks: pick a family and parameters for a level and split, write the reference,
signature, description and test inputs, run the reference in the sandbox for the outputs, and validate.

    from generator.build import generate_tasks
    tasks = generate_tasks(100, level=None, split="train", seed=0)   # list[Task], all valid

`generate_tasks` is the simple programmatic entry point (the tokenizer and the warm start use it); the CLI
(`selfplay tasks generate`) adds a progress bar and the corpus store on top.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from generator.descriptions import NOISE_KINDS, describe
from generator.families import (
    FAMILIES,
    FAMILY_STEPS,
    FAMILY_WEIGHTS,
    PipelineError,
    level_depths,
    render_reference,
    render_signature,
    sample_pipeline,
)
from generator.families.catalogue import LITERALS
from generator.families.values import make_inputs
from generator.fingerprint import ast_hash, task_id
from generator.schema import Task
from generator.splits import SplitConfig, SplitError, check_split_name, constraints, split_of
from generator.validity import MemoryIndex, validate_many


@dataclass
class BuildConfig:
    n_visible: int = 3  # visible examples (levels 1-3)
    n_visible_vague: int = 5  # visible examples for level 4 (vague text)
    n_hidden: int = 8  # hidden tests (edge cases first at levels >= 2)
    max_level: int = 4  # highest level drawn when no level is asked for
    splits: SplitConfig = field(default_factory=SplitConfig)
    literals: str = "narrow"  # range of the steps' constants: "narrow" or "wide" (generator.families.catalogue)

    def __post_init__(self) -> None:
        if self.literals not in LITERALS:
            raise SplitError(f"tasks.literals must be one of {', '.join(LITERALS)}, got {self.literals!r}")

    @classmethod
    def from_config(cls, tasks_cfg) -> BuildConfig:
        return cls(
            int(tasks_cfg.n_visible),
            int(tasks_cfg.n_visible_vague),
            int(tasks_cfg.n_hidden),
            int(tasks_cfg.max_level),
            SplitConfig.from_config(tasks_cfg),
            str(tasks_cfg.literals),
        )


@dataclass
class BuildStats:
    attempted: int = 0  # tasks drawn and validated
    valid: int = 0  # tasks accepted
    seconds: float = 0.0  # wall-clock time in generate_tasks
    rejections: Counter = field(default_factory=Counter)  # first failed check -> count
    examples: dict = field(default_factory=dict)  # first failed check -> one full reason

    @property
    def tasks_per_s(self) -> float:
        return self.valid / self.seconds if self.seconds else 0.0


def levels_for(split: str, max_level: int = 4) -> list[int]:
    """Levels a split is drawn at (noisy needs a precise text to add noise to; compositions need >= 2 steps)."""
    allowed = {
        "train": [1, 2, 3, 4],
        "heldout_types": [1, 2, 3, 4],
        "heldout_compositions": [3, 4],
        "deeper": [3],
        "noisy": [2, 3],
    }[check_split_name(split)]
    return [lv for lv in allowed if lv <= max_level] or allowed[:1]


def sample_params(
    rng: random.Random, level: int, split: str = "train", cfg: BuildConfig = BuildConfig(), tries: int = 100
) -> dict:
    """JSON params of one procedural task of `level` in `split`."""
    if level not in (1, 2, 3, 4):
        raise SplitError(f"level must be 1..4, got {level!r}")
    c = constraints(split, cfg.splits)
    families = c["families"]
    weights = [FAMILY_WEIGHTS[f] for f in families]
    for _ in range(tries):
        family = rng.choices(families, weights)[0]
        kind = FAMILIES[family]
        lo, hi = c["depth"] or level_depths(level, cfg.splits.train_max_depth)
        depth = rng.randint(lo, hi)
        pair = tuple(sorted(rng.choice(cfg.splits.pairs))) if c["require_pair"] else None  # sorted: no hash order
        try:
            steps = sample_pipeline(
                rng,
                kind,
                depth,
                forbid_pairs=c["forbid_pairs"],
                require_pair=pair,
                tries=20,
                literals=cfg.literals,
                steps=FAMILY_STEPS.get(family),
            )
        except PipelineError:
            continue
        size = rng.randint(4, 6)
        params = pipeline_params(
            family,
            steps,
            level,
            size=size,
            cfg=cfg,
            noise=sorted(rng.sample(NOISE_KINDS, rng.randint(1, 2))) if c["noise"] else [],
            seed=rng.getrandbits(32),
        )
        if split_of(params, cfg.splits) == split:
            return params
    raise SplitError(f"could not draw a level-{level} task for split {split!r}")


def pipeline_params(
    family: str,
    steps: list[dict],
    level: int,
    *,
    size: int,
    seed: int,
    cfg: BuildConfig = BuildConfig(),
    noise: list[str] = (),
) -> dict:
    """The params of a task running `steps` on `family`'s input at `level` (its sizes, edge cases, text mode and
    number of examples follow the level); `size` is the input length of level 1, `seed` draws text and inputs."""
    depth = len(steps)
    return {
        "family": family,
        "input": FAMILIES[family],
        "steps": steps,
        "level": level,
        "sizes": [size, size] if level == 1 else [0, 12 if depth > 3 else 10],
        "edge_cases": level >= 2,
        "vague": level == 4,
        "noise": list(noise),
        "n_visible": cfg.n_visible_vague if level == 4 else cfg.n_visible,
        "n_hidden": cfg.n_hidden,
        "seed": seed,
    }


def materialise(params: dict, split: str, *, created_step: int = 0) -> Task:
    """The task described by `params`, with test inputs but no outputs yet (validate computes them)."""
    rng = random.Random(params["seed"])
    reference = render_reference(params)
    description = describe(params, rng, vague=params["vague"], noise=params["noise"])
    sizes = tuple(params["sizes"])
    visible_sizes = (max(sizes[0], 2), max(sizes[1], 2))  # examples that show something
    visible = make_inputs(rng, params["input"], params["n_visible"], size_range=visible_sizes, edge_cases=False)
    hidden = make_inputs(rng, params["input"], params["n_hidden"], size_range=sizes, edge_cases=params["edge_cases"])
    return Task(
        id=task_id(reference, "solve", visible + hidden),
        family=params["family"],
        source="procedural",
        split=split,
        level=params["level"],
        description=description,
        entry_point="solve",
        signature=render_signature(params),
        reference_solution=reference,
        visible_tests=[{"input": a} for a in visible],
        hidden_tests=[{"input": a} for a in hidden],
        created_step=created_step,
        params=params,
    )


class ChainIndex:
    """Duplicates against several indexes (the corpus, then the tasks accepted so far)."""

    def __init__(self, *indexes) -> None:
        self.indexes = [i for i in indexes if i is not None]

    def find_duplicate(self, tid, ast_h, beh_h):
        for index in self.indexes:
            dup = index.find_duplicate(tid, ast_h, beh_h)
            if dup is not None:
                return dup
        return None


def _drop_repeats(tasks: list[Task], index, stats: BuildStats) -> list[Task]:
    """Candidates whose program was already accepted (or drawn earlier in the batch) never reach the sandbox."""
    seen, keep = set(), []
    for task in tasks:
        code = ast_hash(task.reference_solution)
        dup = index.find_duplicate(task.id, code, None)
        if dup is None and code not in seen:
            seen.add(code)
            keep.append(task)
        else:
            stats.rejections["novel"] += 1
            stats.examples.setdefault("novel", f"novel: same program as task {dup or 'drawn earlier in the batch'}")
    return keep


def generate_tasks(
    n: int,
    level: int | None = None,
    split: str = "train",
    seed: int = 0,
    sb=None,
    *,
    corpus_index=None,
    cfg: BuildConfig | None = None,
    batch_size: int = 64,
    stats=None,
    on_batch=None,
    max_attempts: int | None = None,
) -> list[Task]:
    """`n` valid tasks (fewer only if `max_attempts`, default 50 n + 200, runs out), deterministic in `seed`.

    level: 1..4, or None for a mix of the split's levels; corpus_index: reject duplicates of a stored corpus;
    stats: a BuildStats to fill (rejection histogram; it may hold earlier calls' counts, which it adds to);
    on_batch(accepted_tasks, stats) after each batch.
    """
    cfg = cfg or BuildConfig()
    check_split_name(split)
    if n < 0:
        raise ValueError("n must be >= 0")
    stats = stats if stats is not None else BuildStats()
    rng = random.Random(f"tasks:{seed}:{split}:{level}")
    levels = [level] if level is not None else levels_for(split, cfg.max_level)
    max_attempts = max_attempts if max_attempts is not None else 50 * n + 200
    accepted = MemoryIndex()
    index = ChainIndex(corpus_index, accepted)
    out: list[Task] = []
    start, seconds0, attempted0 = time.perf_counter(), stats.seconds, stats.attempted
    with contextlib.ExitStack() as stack:
        if sb is None:
            import sandbox

            sb = stack.enter_context(sandbox.open_sandbox(timeout_s=2.0))
        while len(out) < n and stats.attempted - attempted0 < max_attempts:
            want = n - len(out)
            size = min(batch_size, max(8, want + want // 2), max_attempts - (stats.attempted - attempted0))
            tasks = [materialise(sample_params(rng, rng.choice(levels), split, cfg), split) for _ in range(size)]
            stats.attempted += len(tasks)
            tasks = _drop_repeats(tasks, index, stats)
            new = []
            for report in validate_many(tasks, sb, index):
                if report.ok and len(out) < n:
                    out.append(report.task)
                    accepted.add(report.task)
                    new.append(report.task)
                elif not report.ok:
                    stats.rejections[report.rejection] += 1
                    stats.examples.setdefault(report.rejection, report.reason)
            stats.valid += len(new)
            stats.seconds = seconds0 + time.perf_counter() - start
            if on_batch is not None:
                on_batch(new, stats)
    return out
