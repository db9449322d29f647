"""Every seed a run derives from `run.seed`, in one place.

    derive(seed, "procedural", step)   # -> int: the seed of one named stream
    stream(seed, "generator", step, rank)  # -> random.Random keyed by "seed:step:rank"

A named stream whose results a test, a resumed run or a published figure depends on keeps the arithmetic it has
always had (`LEGACY`): changing it would draw other tasks and move every figure in docs/results.md. Any other name
gets a stable hash of the base and the names (SHA-256, the same on every machine and Python version), so a new
stream never collides with an old one by accident.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

# name -> (base, *args) -> seed: today's derivations, kept exactly
LEGACY: dict[str, Callable[..., int]] = {
    "procedural": lambda seed, step: seed * 100_003 + step,  # an iteration's fresh procedural tasks
    "fixed-fresh": lambda seed: seed * 100_003 + 99_991,  # train.fixed_source=fresh: the fixed task set
    "heldout": lambda seed: seed + 10_007,  # the held-out tasks (drawn first, before any training task)
    "reserved-pool": lambda seed: seed + 20_011,  # train.fixed_source=reserved: the pool kept out of SFT
    "replay-pool": lambda seed, step: step + 7,  # the corpus sample replayed from at a step (independent of seed)
    "references": lambda seed, step: step,  # the corpus sample the generator's references come from
}


def derive(seed: int, name: str, *args) -> int:
    """The seed of stream `name` (with its arguments, e.g. the step) of a run with base seed `seed`."""
    if name in LEGACY:
        return int(LEGACY[name](seed, *args))
    key = ":".join(str(x) for x in (seed, name, *args)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1  # a non-negative 63-bit int


def stream(*parts) -> random.Random:
    """A random.Random keyed by its parts joined with ":" (random seeds a string by its SHA-512: stable)."""
    return random.Random(":".join(str(x) for x in parts))
