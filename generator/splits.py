"""Held-out splits: which procedural tasks are for training and which test generalisation (docs/architecture.md).

    train                 input element types not held out, no held-out pair of steps, depth <= train_max_depth,
                          clean description
    heldout_types         input element type in `heldout_types` (train on int/str/record, test on float/tuple)
    heldout_compositions  both step kinds of some held-out pair in one pipeline (never together in training)
    deeper                more steps than any training task
    noisy                 a training-like program with a noisy description

`split_of(params)` decides membership from a task's params alone, in the order above; generation draws params
aimed at a split (`constraints`) and keeps them only when `split_of` agrees, so the splits are disjoint by
construction, and `check_disjoint` verifies it on any two sets of tasks. A task without params (a free-format
proposal) is judged by its program: `split_of_task` gives it the split of the held-out task it shares an id, a
normalised-AST hash or a behaviour hash with, as the corpus's reserved table does.
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
                raise SplitError(f"held-out pair {p!r} must be two different step kinds 'a+b' from {', '.join(KINDS)}")
        if self.train_max_depth < 1:
            raise SplitError("train_max_depth must be >= 1")

    @classmethod
    def from_config(cls, tasks_cfg) -> SplitConfig:
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
        return {"families": heldout_families, "depth": None, "forbid_pairs": (), "require_pair": False, "noise": False}
    base = {
        "families": train_families,
        "depth": None,
        "forbid_pairs": tuple(cfg.pairs),
        "require_pair": False,
        "noise": False,
    }
    if split == "heldout_compositions":
        if not cfg.pairs:
            raise SplitError("no held-out pairs configured (tasks.heldout_pairs is empty)")
        return {**base, "forbid_pairs": (), "require_pair": True}
    if split == "deeper":
        return {**base, "depth": (cfg.train_max_depth + 1, cfg.train_max_depth + 2)}
    if split == "noisy":
        return {**base, "noise": True}
    return base


def split_of_task(task, heldout: HeldoutIndex | None = None, cfg: SplitConfig = SplitConfig()) -> str:
    """The split a task belongs to. A task the families built (procedural, or compiled from a mutation) has its
    program in its params: `split_of(params)`. A task without them (a free-format proposal: Python the families did
    not build, stored with split "train" and no params) is judged by its program as the held-out hygiene judges it
    (the corpus's reserved table): the split of the held-out task it shares an id, a normalised-AST hash or a
    behaviour hash with, else "train"."""
    params = getattr(task, "params", None) or {}
    if "family" in params and "steps" in params:
        return split_of(params, cfg)
    hit = heldout.match(task) if heldout is not None else None
    return heldout_split(hit[0]) if hit else "train"


def heldout_split(task) -> str:
    """The split a held-out task was drawn for: the evaluation suite names it in the task's params (`eval_split`:
    the test and val splits are train-like programs, kept out of training), else the task's own split."""
    return (getattr(task, "params", None) or {}).get("eval_split", task.split)


class HeldoutIndex:
    """Held-out tasks by id, normalised-AST hash and behaviour hash: the fingerprints the corpus dedups on."""

    def __init__(self, heldout_tasks):
        self.by = {"id": {}, "program": {}, "behaviour": {}}
        for t in heldout_tasks:
            fp = t.fingerprints or {}
            for what, key in (("id", t.id), ("program", fp.get("ast")), ("behaviour", fp.get("behaviour"))):
                if key:
                    self.by[what].setdefault(key, t)

    def match(self, task) -> tuple[object, str] | None:
        """(the held-out task, "id" | "program" | "behaviour") that `task` shares, or None."""
        fp = task.fingerprints or {}
        for what, key in (("id", task.id), ("program", fp.get("ast")), ("behaviour", fp.get("behaviour"))):
            if key and key in self.by[what]:
                return self.by[what][key], what
        return None


def check_disjoint(train_tasks, heldout_tasks, cfg: SplitConfig = SplitConfig()) -> list[str]:
    """Violations (empty when fine): a training task that belongs to a held-out split (`split_of_task`: from its
    params, or for a free-format task without them from its program), a held-out task that belongs to train or to
    another split than it claims, or an id, program or behaviour shared across the two sets."""
    problems = []
    train_tasks, heldout_tasks = list(train_tasks), list(heldout_tasks)
    index = HeldoutIndex(heldout_tasks)
    for t in train_tasks:
        split = split_of_task(t, index, cfg)
        if split != "train":
            how = "" if t.params else " (its program: no params)"
            problems.append(f"train task {t.id} belongs to {split}{how}")
    for t in heldout_tasks:
        if t.params and split_of(t.params, cfg) != t.split:
            problems.append(f"task {t.id} claims split {t.split} but belongs to {split_of(t.params, cfg)}")
    for t in train_tasks:
        hit = index.match(t)
        if hit is None:
            continue
        h, what = hit
        if what == "id":
            problems.append(f"task {h.id} is in both sets")
        else:
            problems.append(f"task {h.id} ({heldout_split(h)}) has the same {what} as a training task ({t.id})")
    return problems
