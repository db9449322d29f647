"""A small prioritised buffer of the solver's successful trajectories, replayed as an auxiliary loss in PPO.

Each entry is one episode that passed every hidden test: its prompt ids, answer ids (with the mask of the tokens the
policy chose, for multi-turn episodes), task id, reward, the solve rate of its task when it was added and the loop
step. Entries are unique by (task id, answer ids): seeing the same answer again refreshes its step and solve rate.

Priority favours hard and recent successes:

    priority = (1 - solve_rate + MIN_HARDNESS) * 0.5 ** ((now - step) / half_life)

a success on a task the solver rarely solves is worth more than one on a task it always solves, and old successes
fade. Over capacity, the lowest-priority entry is evicted (ties: the oldest). `sample(n, now)` draws n distinct
entries with probability proportional to priority (Efraimidis-Spirakis keys u ** (1 / priority)) from a seeded RNG;
`state_dict()` is plain JSON, so a checkpointed and resumed run draws exactly the same samples. Pure Python.

`AnswerSet` replays a fixed set instead (`ppo.replay_source=sft`: the warm start's SFT examples), uniformly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from selfplay.runtime.seeds import stream

MIN_HARDNESS = 0.05  # priority floor factor: an always-solved task's success still has a small chance


@dataclass
class ReplayItem:
    """One successful episode. `tokens` and `prompt` are what PPO's `update` reads (like a rollout)."""

    task_id: str
    prompt: list[int]
    tokens: list[int]
    reward: float
    solve_rate: float  # share of the task's k episodes solved when this one was added (0..1)
    step: int  # loop step it was (last) added
    mask: list[int] | None = None  # 1 where the policy chose the token; None = every token

    @property
    def key(self) -> tuple[str, tuple[int, ...]]:
        return self.task_id, tuple(self.tokens)


def priority(item: ReplayItem, now: int, half_life: float) -> float:
    """Hardness of the task times an exponential recency decay (half-life in loop steps)."""
    age = max(0, now - item.step)
    return (1.0 - item.solve_rate + MIN_HARDNESS) * 0.5 ** (age / half_life)


class ReplayBuffer:
    def __init__(self, capacity: int, seed: int = 0, half_life: float = 50.0):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        if half_life <= 0:
            raise ValueError(f"replay half-life must be > 0, got {half_life}")
        self.capacity, self.half_life = capacity, float(half_life)
        self.rng = random.Random(seed)
        self._items: dict[tuple[str, tuple[int, ...]], ReplayItem] = {}  # insertion order = sampling order

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[ReplayItem]:
        return list(self._items.values())

    def add(self, item: ReplayItem) -> bool:
        """Insert (or refresh a duplicate); evict the lowest-priority entries beyond capacity. True if it is new."""
        if not 0.0 <= item.solve_rate <= 1.0:
            raise ValueError(f"solve_rate must lie in [0, 1], got {item.solve_rate}")
        if not item.tokens:
            raise ValueError(f"replay item of task {item.task_id}: empty answer")
        old = self._items.get(item.key)
        if old is not None:
            old.step, old.solve_rate, old.reward = max(old.step, item.step), item.solve_rate, item.reward
            return False
        self._items[item.key] = item
        now = max(x.step for x in self._items.values())
        while len(self._items) > self.capacity:
            self._items.pop(
                min(self._items, key=lambda k: (priority(self._items[k], now, self.half_life), self._items[k].step))
            )
        return item.key in self._items

    def ranked(self, now: int) -> list[ReplayItem]:
        """Entries by decreasing priority at step `now` (ties: the newest first)."""
        return sorted(self._items.values(), key=lambda x: (-priority(x, now, self.half_life), -x.step))

    def sample(self, n: int, now: int) -> list[ReplayItem]:
        """min(n, len) distinct entries drawn with probability proportional to their priority at step `now`."""
        items = list(self._items.values())
        # log of u ** (1 / p), u in (0, 1]: same order, and no overflow for tiny priorities
        keys = [math.log(1.0 - self.rng.random()) / max(priority(x, now, self.half_life), 1e-300) for x in items]
        order = sorted(range(len(items)), key=lambda i: -keys[i])
        return [items[i] for i in order[: max(0, n)]]

    def state_dict(self) -> dict:
        """JSON-ready state: entries in order and the RNG."""
        return {
            "capacity": self.capacity,
            "half_life": self.half_life,
            "rng": self.rng.getstate(),
            "items": [asdict(x) for x in self._items.values()],
        }

    def load_state_dict(self, state: dict) -> None:
        rng = state["rng"]
        self.rng.setstate((rng[0], tuple(rng[1]), rng[2]))  # JSON turns the RNG's tuples into lists
        self._items = {}
        for d in state["items"]:
            item = ReplayItem(**d)
            self._items[item.key] = item
        while len(self._items) > self.capacity:  # resumed with a smaller capacity: keep the best
            now = max(x.step for x in self._items.values())
            keep = {x.key for x in self.ranked(now)[: self.capacity]}
            self._items = {k: v for k, v in self._items.items() if k in keep}


class AnswerSet:
    """A fixed set of answers replayed uniformly: with `ppo.replay_source=sft`, the warm start's own SFT examples
    (InstructGPT's PPO-ptx mixes the pretraining loss into PPO the same way, so that RL does not overwrite what
    supervised training taught). Stateless: the draw at step `now` depends only on (seed, now), so a resumed run
    draws what an uninterrupted one would."""

    def __init__(self, items: Sequence[ReplayItem], seed: int = 0):
        if not items:
            raise ValueError("an answer set needs at least one answer")
        self._items, self.seed = list(items), seed

    def __len__(self) -> int:
        return len(self._items)

    def sample(self, n: int, now: int) -> list[ReplayItem]:
        """min(n, len) distinct answers, uniformly at random."""
        rng = stream(self.seed, now)
        return rng.sample(self._items, min(max(0, n), len(self._items)))


def successes(rollouts: Sequence, rates: dict[str, float], step: int) -> list[ReplayItem]:
    """Replay items for the rollouts that solved their task (anything with .task, .prompt, .tokens, .mask, .reward,
    .result.solved); `rates` maps task id -> solve rate of this iteration."""
    out = []
    for r in rollouts:
        if r.result.solved and r.tokens:
            mask = None if all(r.mask) else list(r.mask)
            out.append(
                ReplayItem(
                    r.task.id,
                    list(r.prompt),
                    list(r.tokens),
                    float(r.reward),
                    float(rates.get(r.task.id, 1.0)),
                    step,
                    mask,
                )
            )
    return out
