"""The task record: one programming task, as stored in the corpus and exported as a dataset row.

Fields follow the task record of docs/architecture.md. Every value is plain JSON (lists stand for tuples, dicts for
records), so a record round-trips through `to_json`/`from_json` unchanged. Test outputs are produced by running the
reference solution in the sandbox (`generator.validity.validate` fills them in); a test whose "output" key is missing
is "not yet computed".
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
SOURCES = ("procedural", "generator", "import")


class SchemaError(ValueError):
    """A record that does not fit the task schema. The message names the field."""


def check_json_value(value: Any, where: str) -> None:
    """Raise SchemaError unless `value` is plain JSON (None, bool, int, finite float, str, list, dict[str, ...])."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SchemaError(f"{where}: {value!r} is not a finite JSON number")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_json_value(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SchemaError(f"{where}: dict key {key!r} is not a string")
            check_json_value(item, f"{where}[{key!r}]")
        return
    raise SchemaError(f"{where}: {type(value).__name__} is not a JSON value")


@dataclass
class Task:
    """One task. `visible_tests` are shown to the solver; `hidden_tests` (edge cases included) grade it."""

    id: str  # deterministic: hash of the normalised reference and the test inputs (see task_id)
    family: str  # procedural family name (e.g. "list_int", "record_pipeline") or "generator" / an imported name
    source: str  # "procedural" | "generator" | "import"
    split: str  # "train" or a held-out split name (generator.splits.SPLITS)
    level: int  # curriculum level 1..4 (generator.families)
    description: str  # natural-language statement shown to the solver
    entry_point: str  # name of the function the tests call
    signature: str  # e.g. "def solve(xs: list[int]) -> list[int]"
    reference_solution: str  # Python source defining entry_point
    visible_tests: list[dict] = field(default_factory=list)  # [{"input": [args], "output": value}, ...]
    hidden_tests: list[dict] = field(default_factory=list)  # same shape; graded, never shown
    difficulty: float | None = None  # 1 - measured solver solve rate; None until measured
    checks: dict[str, bool] = field(default_factory=dict)  # validity check name -> passed
    parent_ids: list[str] = field(default_factory=list)  # tasks this one was derived from (generator, mutation)
    created_step: int = 0  # training step at creation (0 for offline generation)
    generator_checkpoint: str | None = None  # checkpoint of the generator that proposed it, if any
    params: dict = field(default_factory=dict)  # procedural spec (family, steps, input kind, noise); {} otherwise
    fingerprints: dict = field(default_factory=dict)  # {"ast": hash, "behaviour": hash or None} for dedup
    schema_version: int = SCHEMA_VERSION

    # ---- tests -------------------------------------------------------------------------------------------
    @property
    def tests(self) -> list[dict]:
        return list(self.visible_tests) + list(self.hidden_tests)

    @property
    def outputs_computed(self) -> bool:
        return all("output" in t for t in self.tests)

    # ---- JSON --------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no NaN): equal records give equal strings."""
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict) -> Task:
        if not isinstance(data, dict):
            raise SchemaError(f"a task record must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise SchemaError(f"unknown field(s) {', '.join(unknown)}")
        version = data.get("schema_version", SCHEMA_VERSION)
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise SchemaError(f"schema_version {version!r} is newer than this code ({SCHEMA_VERSION})")
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [n for n in required if n not in data]
        if missing:
            raise SchemaError(f"missing field(s) {', '.join(missing)}")
        task = cls(**data)
        task.validate_shape()
        return task

    @classmethod
    def from_json(cls, text: str) -> Task:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"not JSON: {exc}") from exc
        return cls.from_dict(data)

    def validate_shape(self) -> None:
        """Field types and JSON-only values. Raises SchemaError naming the first bad field."""
        for name in (
            "id",
            "family",
            "source",
            "split",
            "description",
            "entry_point",
            "signature",
            "reference_solution",
        ):
            if not isinstance(getattr(self, name), str):
                raise SchemaError(f"{name} must be a string")
        if self.source not in SOURCES:
            raise SchemaError(f"source {self.source!r} is not one of {', '.join(SOURCES)}")
        if not isinstance(self.level, int) or isinstance(self.level, bool) or not 1 <= self.level <= 4:
            raise SchemaError(f"level must be an integer 1..4, got {self.level!r}")
        if self.difficulty is not None and not (
            isinstance(self.difficulty, (int, float)) and 0.0 <= self.difficulty <= 1.0
        ):
            raise SchemaError(f"difficulty must be null or a number in [0, 1], got {self.difficulty!r}")
        if not isinstance(self.created_step, int):
            raise SchemaError("created_step must be an integer")
        if self.generator_checkpoint is not None and not isinstance(self.generator_checkpoint, str):
            raise SchemaError("generator_checkpoint must be null or a string")
        if not isinstance(self.parent_ids, list) or not all(isinstance(p, str) for p in self.parent_ids):
            raise SchemaError("parent_ids must be a list of strings")
        if not isinstance(self.checks, dict) or not all(isinstance(v, bool) for v in self.checks.values()):
            raise SchemaError("checks must map check names to true/false")
        for name in ("params", "fingerprints"):
            if not isinstance(getattr(self, name), dict):
                raise SchemaError(f"{name} must be an object")
            check_json_value(getattr(self, name), name)
        for name in ("visible_tests", "hidden_tests"):
            tests = getattr(self, name)
            if not isinstance(tests, list):
                raise SchemaError(f"{name} must be a list")
            for i, test in enumerate(tests):
                where = f"{name}[{i}]"
                if not isinstance(test, dict) or "input" not in test or set(test) - {"input", "output"}:
                    raise SchemaError(f'{where} must be {{"input": [args], "output": value}}')
                if not isinstance(test["input"], list):
                    raise SchemaError(f"{where}.input must be a list of positional arguments")
                check_json_value(test["input"], f"{where}.input")
                if "output" in test:
                    check_json_value(test["output"], f"{where}.output")


def without_outputs(tests: list[dict]) -> list[dict]:
    return [{"input": t["input"]} for t in tests]
