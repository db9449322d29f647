"""Held-out splits: which procedural tasks are for training and which test generalisation (docs/architecture.md).

    train                 input element types not held out, no held-out pair of steps, depth <= train_max_depth,
                          clean description
    heldout_types         input element type in `heldout_types` (train on int/str/record, test on float/tuple)
    heldout_compositions  both step kinds of some held-out pair in one pipeline (never together in training)
    deeper                more steps than any training task
    noisy                 a training-like program with a noisy description

`split_of(params)` decides membership from a task's params alone, in the order above; generation draws params
aimed at a split (`constraints`) and keeps them only when `split_of` agrees, so the splits are disjoint by
construction, and `check_disjoint` verifies it on any two sets of tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

from generator.families import FAMILIES, kinds_of
from generator.families.steps import KINDS
from generator.families.values import TYPE_NAMES, input_etype

SPLITS = ("train", "heldout_types", "heldout_compositions", "deeper", "noisy")
# evaluation suites draw two more sets of `train`-split tasks, kept out of the corpus: the in-distribution held-out
# split and a validation split for choosing settings (selfplay/eval/evaluate.py)
TEST_SPLIT = "test"
VAL_SPLIT = "val"


class SplitError(ValueError):
    """An unknown split name or a malformed held-out setting."""


@dataclass(frozen=True)
class SplitConfig:
    heldout_types: tuple[str, ...] = ("float", "tuple")  # element type names (values.TYPE_NAMES)
    heldout_pairs: tuple[str, ...] = ("dedup+sort", "filter+group", "map+top_k")  # "kind+kind"
    train_max_depth: int = 4  # deepest training pipeline

    def __post_init__(self) -> None:
        names = set(TYPE_NAMES.values())
        for t in self.heldout_types:
            if t not in names:
                raise SplitError(f"held-out type {t!r} is not one of {', '.join(sorted(names))}")
        if set(self.heldout_types) >= {TYPE_NAMES[input_etype(k)] for k in FAMILIES.values()}:
            raise SplitError("every element type is held out: nothing is left to train on")
        for p in self.heldout_pairs:
            parts = p.split("+")
            if len(parts) != 2 or not all(k in KINDS for k in parts) or parts[0] == parts[1]:
                raise SplitError(f"held-out pair {p!r} must be two different step kinds 'a+b' from "
                                 f"{', '.join(KINDS)}")
        if self.train_max_depth < 1:
            raise SplitError("train_max_depth must be >= 1")

    @classmethod
    def from_config(cls, tasks_cfg) -> "SplitConfig":
        """From the `tasks:` section of selfplay's config (any object with these attributes)."""
        for name in getattr(tasks_cfg, "heldout_splits", ()):
            if name not in SPLITS[1:]:
                raise SplitError(f"held-out split {name!r} is not one of {', '.join(SPLITS[1:])}")
        return cls(tuple(tasks_cfg.heldout_types), tuple(tasks_cfg.heldout_pairs), int(tasks_cfg.train_max_depth))

    @property
    def pairs(self) -> list[frozenset]:
        return [frozenset(p.split("+")) for p in self.heldout_pairs]

    def family_is_heldout(self, family: str) -> bool:
        return TYPE_NAMES[input_etype(FAMILIES[family])] in self.heldout_types


def check_split_name(split: str) -> str:
    if split not in SPLITS:
        raise SplitError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    return split


def split_of(params: dict, cfg: SplitConfig = SplitConfig()) -> str:
    """The split a procedural task belongs to, from its params alone."""
    if cfg.family_is_heldout(params["family"]):
        return "heldout_types"
    present = set(kinds_of(params["steps"]))
    if any(pair <= present for pair in cfg.pairs):
        return "heldout_compositions"
    if len(params["steps"]) > cfg.train_max_depth:
        return "deeper"
    if params.get("noise"):
        return "noisy"
    return "train"


def constraints(split: str, cfg: SplitConfig = SplitConfig()) -> dict:
    """What to draw for a split: families, depth override, pair rules, noise."""
    check_split_name(split)
    train_families = [f for f in FAMILIES if not cfg.family_is_heldout(f)]
    heldout_families = [f for f in FAMILIES if cfg.family_is_heldout(f)]
    if split == "heldout_types":
        if not heldout_families:
            raise SplitError("no family has a held-out element type (tasks.heldout_types is empty)")
        return {"families": heldout_families, "depth": None, "forbid_pairs": (), "require_pair": False,
                "noise": False}
    base = {"families": train_families, "depth": None, "forbid_pairs": tuple(cfg.pairs), "require_pair": False,
            "noise": False}
    if split == "heldout_compositions":
        if not cfg.pairs:
            raise SplitError("no held-out pairs configured (tasks.heldout_pairs is empty)")
        return {**base, "forbid_pairs": (), "require_pair": True}
    if split == "deeper":
        return {**base, "depth": (cfg.train_max_depth + 1, cfg.train_max_depth + 2)}
    if split == "noisy":
        return {**base, "noise": True}
    return base


def check_disjoint(train_tasks, heldout_tasks, cfg: SplitConfig = SplitConfig()) -> list[str]:
    """Violations (empty when fine): a training task that belongs to a held-out split, a held-out task that
    belongs to train or to another split than it claims, or a program or id shared across the two sets."""
    problems = []
    for t in train_tasks:
        if t.params and split_of(t.params, cfg) != "train":
            problems.append(f"train task {t.id} belongs to {split_of(t.params, cfg)}")
    for t in heldout_tasks:
        if t.params and split_of(t.params, cfg) != t.split:
            problems.append(f"task {t.id} claims split {t.split} but belongs to {split_of(t.params, cfg)}")
    train_ids = {t.id for t in train_tasks}
    train_ast = {t.fingerprints.get("ast") for t in train_tasks} - {None}
    for t in heldout_tasks:
        if t.id in train_ids:
            problems.append(f"task {t.id} is in both sets")
        elif t.fingerprints.get("ast") in train_ast:
            problems.append(f"task {t.id} has the same program as a training task")
    return problems
