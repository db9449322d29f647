"""Checkpoints: `RUN_DIR/checkpoints/step_N/` plus a `latest` marker, written so that a kill at any moment
leaves either the previous complete checkpoint or the new one — never a half one that resume would trust.

The order of a save (docs/architecture.md, run folder):
1. everything is written into `step_N.partial/` (models via `save_pretrained` or DeepSpeed, optimiser, mixer,
   RNG states, counters in `state.json`), each file flushed to disk;
2. `step_N.partial/` is renamed to `step_N/` (atomic on one filesystem);
3. `latest` is rewritten through a temporary file and `os.replace` (atomic), naming `step_N`;
4. only then are checkpoints beyond `keep_last` removed (never the one `latest` names, nor step_0: the warm start,
   which `selfplay eval` compares a finished run with, nor a checkpoint that holds a frozen reference another one
   points to).

Frozen weights never change, so they are written once, with the first checkpoint that holds them (step_0 for a
warm-started run): the KL reference (`reference/`) and a LoRA adapter's base when it is not that reference
(`lora/base/`). A later checkpoint's agent folder holds `reference.json` (`lora/base.json`) instead, naming the
folder, relative to `checkpoints/`, where their bytes lie (`reference_folder`, `frozen_folder` follow it).

On start, `latest_checkpoint()` follows `latest`; leftover `*.partial` folders from a killed save are removed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import shutil
import subprocess
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np

from selfplay.runtime.paths import RunPaths

STATE_FILE = "state.json"
LATEST = "latest"
REFERENCE_DIR = "reference"  # an agent folder's own frozen reference
REFERENCE_POINTER = "reference.json"  # or, instead, {"path": "step_0/solver/reference"} relative to checkpoints/
LORA_BASE_DIR = "lora/base"  # a LoRA adapter's own frozen base (one that is not the reference), or lora/base.json
FROZEN_DIRS = (REFERENCE_DIR, LORA_BASE_DIR)  # what an agent folder may hold or point to instead


def pointer_of(own: Path) -> Path:
    """The pointer that stands for frozen folder `own` in a later checkpoint: `reference/` -> `reference.json`."""
    return own.with_name(own.name + ".json")


def frozen_folder(agent_folder: Path, sub: str) -> Path:
    """The folder holding frozen part `sub` (one of FROZEN_DIRS) of the agent saved in `agent_folder`
    (checkpoints/step_N/<name>): its own, or the one its pointer names. Raises FileNotFoundError naming a pointer
    whose target is gone."""
    own = agent_folder / sub
    pointer = pointer_of(own)
    if own.is_dir() or not pointer.exists():
        return own
    target = agent_folder.parent.parent / json.loads(pointer.read_text())["path"]
    if not target.is_dir():
        raise FileNotFoundError(
            f"{pointer} names the frozen weights {target}, which are missing (a checkpoint copied without "
            f"the one holding them: copy that one too)"
        )
    return target


def reference_folder(agent_folder: Path) -> Path:
    """The folder holding the frozen reference of the agent saved in `agent_folder` (checkpoints/step_N/<name>):
    its own `reference/`, or the one its `reference.json` names (`frozen_folder`)."""
    return frozen_folder(agent_folder, REFERENCE_DIR)


def frozen_home(agent_folder: Path, sub: str = REFERENCE_DIR) -> str | None:
    """Where frozen part `sub` of `agent_folder` lies, relative to its checkpoints root ("step_0/solver/reference"),
    for a later checkpoint's pointer; None for a folder outside a checkpoints root or without that part."""
    folder = frozen_folder(agent_folder, sub)
    root = agent_folder.parent.parent
    try:
        relative = folder.resolve().relative_to(root.resolve())
    except ValueError:
        return None
    return relative.as_posix() if folder.is_dir() and relative.parts[0].startswith("step_") else None


def reference_home(agent_folder: Path) -> str | None:
    """`frozen_home` of the reference."""
    return frozen_home(agent_folder, REFERENCE_DIR)


def write_pointer(agent_folder: Path, sub: str, home: str) -> None:
    """The pointer of frozen part `sub` in `agent_folder` (`reference.json`, `lora/base.json`): its bytes are in
    `checkpoints/<home>`."""
    pointer = pointer_of(agent_folder / sub)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(pointer, {"path": home})


def write_reference_pointer(agent_folder: Path, home: str) -> None:
    """`reference.json` in `agent_folder`: its frozen reference is `checkpoints/<home>`."""
    write_pointer(agent_folder, REFERENCE_DIR, home)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a flushed temporary file and `os.replace`: readers see the old or the new text, whole."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True))


class CheckpointManager:
    def __init__(self, run_dir: str | Path, keep_last: int = 3):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root = RunPaths(run_dir).checkpoints
        self.keep_last = keep_last

    # ---- reading ------------------------------------------------------------------------------------------
    def latest_checkpoint(self) -> Path | None:
        marker = self.root / LATEST
        if not marker.exists():
            return None
        name = marker.read_text().strip()
        path = self.root / name
        if not (path / STATE_FILE).exists():
            raise RuntimeError(
                f"{marker} names {name}, which is missing or incomplete; "
                f"remove the marker to start over or restore the folder"
            )
        return path

    def load_state(self, path: Path) -> dict:
        return json.loads((path / STATE_FILE).read_text())

    def steps(self) -> list[int]:
        if not self.root.exists():
            return []
        out = []
        for p in self.root.iterdir():
            if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit():
                out.append(int(p.name[5:]))
        return sorted(out)

    # ---- writing ------------------------------------------------------------------------------------------
    def clean_partial(self) -> None:
        if self.root.exists():
            for p in self.root.glob("*.partial"):
                shutil.rmtree(p, ignore_errors=True)

    def begin(self, step: int) -> Path:
        """Create (empty) `step_N.partial/` for the files of checkpoint `step` and return it."""
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f"step_{step}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        return partial

    def commit(self, step: int, state: dict) -> Path:
        """Write state.json into the partial folder, flush everything, rename it, then point `latest` at it."""
        final = self.root / f"step_{step}"
        partial = self.root / f"step_{step}.partial"
        write_json_atomic(partial / STATE_FILE, {"step": step, **state})
        for f in partial.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if final.exists():  # re-saving the same step (e.g. a resumed run's final save): replace it
            shutil.rmtree(final)
        os.rename(partial, final)
        _fsync_dir(self.root)
        write_text_atomic(self.root / LATEST, final.name + "\n")
        self._prune(keep=final.name)
        return final

    def save(self, step: int, state: dict, write_files: Callable[[Path], None] | None = None) -> Path:
        """Write checkpoint `step` in one process: `write_files(folder)` writes models/optimisers, `state` goes
        to state.json. (Several ranks: `begin` on rank 0, every rank writes, barrier, `commit` on rank 0.)"""
        partial = self.begin(step)
        if write_files is not None:
            write_files(partial)
        return self.commit(step, state)

    def _prune(self, keep: str) -> None:
        steps = [s for s in self.steps() if s != 0]  # step_0, the warm start, stays: a run's "before" to evaluate
        doomed = [f"step_{s}" for s in steps[: max(0, len(steps) - self.keep_last)] if f"step_{s}" != keep]
        kept = [self.root / f"step_{s}" for s in self.steps() if f"step_{s}" not in doomed]
        pointed = {  # a checkpoint holding frozen weights that a kept one points to stays
            json.loads(p.read_text())["path"].split("/")[0]
            for k in kept
            for sub in FROZEN_DIRS
            for p in k.glob(f"*/{pointer_of(Path(sub)).as_posix()}")
        }
        for name in doomed:
            if name not in pointed:
                shutil.rmtree(self.root / name, ignore_errors=True)


# ---- the code a run ran -----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def code_version(diff: bool = False) -> dict:
    """{"version", "commit", "dirty"}: the package's version and, where it runs from a git checkout of the project,
    the commit and whether tracked files had changes not committed (`dirty`); commit and dirty are None otherwise
    (an installed wheel, no git). Read once per process, when the run starts: the code it imported then. Every
    checkpoint records the versions its run ran under (`code` in state.json), so a figure can be traced to its
    code, and two warm starts that differ can be told apart from one that is not repeatable. With `diff`, a checkout
    with uncommitted changes also gets "diff", a digest of them (`git diff HEAD`), so that two starts on different
    uncommitted edits are told apart (`selfplay compare` holds a comparison to one code by it)."""
    import selfplay

    root = Path(selfplay.__file__).resolve().parent.parent
    out: dict[str, Any] = {"version": selfplay.__version__, "commit": None, "dirty": None}

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top and Path(top).resolve() == root and (root / "setup.cfg").exists():  # this project's checkout, no other
        out["commit"] = git("rev-parse", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
        out["dirty"] = None if status is None else bool(status)
        if diff and out["dirty"]:
            out["diff"] = hashlib.sha256((git("diff", "HEAD") or "").encode()).hexdigest()[:16]
    return out


def code_versions(recorded: list | None) -> list[dict]:
    """The code versions a run has run under, oldest first: those `recorded` in its checkpoint, then this
    process's when it differs from the last (a run resumed or a warm start trained on by other code)."""
    versions = list(recorded or [])
    return versions if versions and versions[-1] == code_version() else versions + [code_version()]


# ---- RNG states ---------------------------------------------------------------------------------------------
def rng_state() -> dict:
    """Python, NumPy and torch (CPU and, if present, CUDA) RNG states, JSON-serialisable."""
    import torch

    py = random.getstate()
    np_state = cast(tuple, np.random.get_state())  # the legacy tuple (numpy's stub names the dict form)
    out = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        out["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return out


def set_rng_state(state: dict) -> None:
    import torch

    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


@contextmanager
def preserved_rng():
    """Run a block without moving the Python, NumPy and torch (CPU, CUDA) RNGs: their states are put back after.

    For work that happens at some step boundaries but not others (held-out evaluation at the last step of a run,
    which a continued run does not repeat): training must draw the same random numbers either way."""
    import torch

    py, np_state, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
