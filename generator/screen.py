"""Novelty judged in this process, before the sandbox: the behaviour of a catalogue program on the probe inputs,
and a screen that tells a compiled mutation task the novelty check would reject from one it would not.

The code run here is never model text. It is the reference solution the families render
(`families.render_reference`) from an edited program whose every step, name and constant comes from the catalogue
(`mutation.possible_edits` enumerates them; the prompt grammar lets the model choose only among them): the same
trusted code the procedural tasks are built from. Model-written code (the free format, the solver's answers) runs
only in the sandbox, and every proposal is still validated there (`validity.validate_many`); the screen only lets
the generator's sampler strike a known program from the grammar and draw again (selfplay.rollout.episodes).

`program_behaviour(kind, steps)` is the hash `validity._behaviour` gives the same program run in the sandbox on the
same probe inputs (errors as `!error:ExceptionName`, answers through JSON; tests/generator/test_screen.py compares
the two), or None when fewer than three probes return or all return the same answer (such a task's hidden
outputs are nearly always all equal, and the novelty check cannot judge it by behaviour)."""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict

from generator.families import render_reference
from generator.families.grammar import program_of
from generator.families.values import probe_inputs
from generator.fingerprint import ast_hash, behaviour_hash, canonical_json
from generator.validity import MemoryIndex

CACHE_SIZE = 100_000  # programs whose behaviour is remembered (about 200 bytes each)
_cache: OrderedDict[str, str | None] = OrderedDict()
_probes: dict[str, list[str]] = {}


def _probe_texts(kind: str) -> list[str]:
    """The probe inputs of `kind` as JSON text (each run gets a fresh copy: a step may sort its input in place)."""
    if kind not in _probes:
        _probes[kind] = [json.dumps(args) for args in probe_inputs(kind)]
    return _probes[kind]


def _answer(fn, args):
    try:
        out = fn(*args)
    except Exception as exc:  # noqa: BLE001 - a program that raises on a probe: part of its behaviour
        return False, f"!error:{type(exc).__name__}"
    try:
        return True, json.loads(json.dumps(out))  # as the sandbox serialises an answer
    except (TypeError, ValueError, RecursionError) as exc:
        return False, f"!unserializable:{type(exc).__name__}"


def program_behaviour(kind: str, steps: list[dict]) -> str | None:
    """The behaviour hash of the program `steps` on input kind `kind` (see the module docstring); cached."""
    key = canonical_json([kind, steps])
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    namespace: dict = {}
    exec(compile(render_reference({"input": kind, "steps": steps}), "<catalogue>", "exec"), namespace)  # noqa: S102
    answers, ok = [], []
    for text in _probe_texts(kind):
        passed, answer = _answer(namespace["solve"], json.loads(text))
        answers.append(answer)
        if passed:
            ok.append(json.dumps(answer, sort_keys=True))
    try:
        result = behaviour_hash(answers) if len(ok) >= 3 and len(set(ok)) >= 2 else None
    except ValueError:  # NaN or infinity in an answer: not a JSON value (the task fails json_values)
        result = None
    _cache[key] = result
    if len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return result


class Screen:
    """Judges compiled mutation tasks, one after another, against a corpus index and the ones it passed before
    (a batch's proposals are judged for novelty in order, against the corpus and each other)."""

    def __init__(self, index) -> None:
        self.index, self.passed = index, MemoryIndex()

    def reject(self, task) -> str | None:
        """Why the novelty check would reject `task` (a program or a behaviour the corpus or an earlier passed
        task has, or too little behaviour to judge), or None, after which `task` counts as passed."""
        program = program_of(task)
        if program is None:
            return None
        behaviour = program_behaviour(*program)
        if behaviour is None:
            return "too little behaviour on the probe inputs"
        fingerprint = ast_hash(task.reference_solution)
        for index in (self.index, self.passed):
            if index is not None and index.find_duplicate("", fingerprint, behaviour) is not None:
                return "a program or a behaviour the corpus or the batch has"
        self.passed.add(
            dataclasses.replace(
                task, id=f"passed{len(self.passed.ids)}", fingerprints={"ast": fingerprint, "behaviour": behaviour}
            )
        )
        return None
