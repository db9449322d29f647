"""What the solver's PPO update replays beside its fresh episodes (`ppo.replay_coef` > 0): its own past successes
(`ppo.replay_source=successes`: a prioritised buffer, the same on every rank, checkpointed) or the warm start's SFT
examples (`ppo.replay_source=sft`: read from the corpus on first use, a function of the run's seed).
"""

from __future__ import annotations

from collections.abc import Callable

from selfplay.models.agent import LMAgent
from selfplay.rl.replay import AnswerSet, ReplayBuffer, ReplayItem, successes
from selfplay.rollout.episodes import SolverRollout, prompt_options
from selfplay.runtime import distributed as D
from selfplay.runtime.errors import UserError
from selfplay.train.warmstart import level_counts, solver_examples, tokenize_pairs


class SolverReplay:
    """The replay of one run: `draw` before each solver update, `add` after it."""

    def __init__(self, cfg, *, rank: int, world: int, log: Callable[[str], None]):
        self.cfg, self.rank, self.world, self.log = cfg, rank, world, log
        ppo = cfg.ppo
        self.buffer = (
            ReplayBuffer(ppo.replay_capacity, seed=cfg.run.seed, half_life=ppo.replay_half_life)
            if ppo.replay_coef > 0 and ppo.replay_source == "successes"
            else None
        )
        self.sft_answers: AnswerSet | None = None

    def draw(self, solver: LMAgent, corpus, step: int, sb=None) -> list[ReplayItem] | None:
        """This rank's share of a draw of past successes (prioritised; every rank holds the same buffer and RNG) or
        of the warm start's SFT examples (uniform, a function of the step; `sb`: the sandbox that answers them in the
        kinds the warm start asked, under `mixer.kinds`)."""
        if self.cfg.ppo.replay_coef <= 0:
            return None
        pool = self.buffer if self.buffer is not None else self._sft_answer_set(solver, corpus, sb)
        drawn = pool.sample(self.cfg.ppo.replay_batch * self.world, step)
        return drawn[self.rank :: self.world] if len(drawn) >= self.world else None

    def add(self, rollouts: list[SolverRollout], rates: dict[str, float], step: int) -> dict[str, float]:
        """Every rank's successful episodes of this iteration into every rank's buffer (after this update's draw);
        the buffer's size as `replay/size` (nothing without a buffer)."""
        if self.buffer is None:
            return {}
        for part in D.gather_objects(successes(rollouts, rates, step)):
            for item in part:
                self.buffer.add(item)
        return {"replay/size": len(self.buffer)}

    def _sft_answer_set(self, solver: LMAgent, corpus, sb) -> AnswerSet:
        """The warm start's SFT examples (the corpus's first rows, which the warm start inserted; later procedural
        tasks also have created_step 0), asked and answered as the warm start asked them (its kinds drawn with the
        same seed) and tokenized as it tokenized them."""
        if self.sft_answers is None:
            cfg = self.cfg
            n_sft = sum(level_counts(cfg.warmstart, cfg.tasks.max_level).values())
            tasks = corpus.query(split="train", order="insertion", limit=n_sft)
            pairs = tokenize_pairs(
                solver, solver_examples(tasks, prompt_options(cfg), cfg.mixer, sb, cfg.run.seed), cfg.warmstart.max_len
            )
            if not pairs:
                raise UserError("ppo.replay_source=sft: the corpus holds no warm-start training task to replay")
            self.sft_answers = AnswerSet(
                [ReplayItem(f"sft:{i}", list(p), list(a), 1.0, 1.0, 0) for i, (p, a) in enumerate(pairs)],
                seed=cfg.run.seed,
            )
            self.log(f"replaying {len(pairs)} warm-start SFT examples (ppo.replay_coef={cfg.ppo.replay_coef})")
        return self.sft_answers
