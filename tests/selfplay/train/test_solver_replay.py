"""The SFT replay (`ppo.replay_source=sft`, selfplay/train/solver_replay.py): the warm start's own examples, asked
and answered as the warm start asked them, in the kinds `mixer.kinds` drew for them."""

from __future__ import annotations

import pytest

from selfplay.data.corpus import Corpus
from selfplay.models.agent import LMAgent, agent_ppo_config, load_agent_parts
from selfplay.rollout.episodes import prompt_options
from selfplay.runtime.config import load_config
from selfplay.train.solver_replay import SolverReplay
from selfplay.train.warmstart import level_counts, solver_examples, tokenize_pairs
from tests.conftest import SMOKE

KINDS = "mixer.kinds={program: 1, deduction: 1, abduction: 1}"


@pytest.mark.slow  # the shared warm-start fixture (a smoke warm start)
def test_the_sft_replay_holds_the_warm_starts_examples_in_their_kinds(warm_run, task_sb):
    cfg = load_config(
        SMOKE[0], [*SMOKE[1:], f"run.dir={warm_run}", KINDS, "ppo.replay_coef=0.5", "ppo.replay_source=sft"]
    )
    model, reference, tok = load_agent_parts(warm_run / "checkpoints" / "step_0" / "solver")
    solver = LMAgent("solver", model, reference, tok, agent_ppo_config(cfg, "solver"))
    with Corpus(warm_run / "corpus.sqlite") as corpus:
        replay = SolverReplay(cfg, rank=0, world=1, log=lambda _m: None)
        assert replay.draw(solver, corpus, 1, task_sb)  # a draw of the set
        n_sft = sum(level_counts(cfg.warmstart, cfg.tasks.max_level).values())
        tasks = corpus.query(split="train", order="insertion", limit=n_sft)
    # what the warm start made of these tasks under these kinds (its solver_examples call)
    pairs = solver_examples(tasks, prompt_options(cfg), cfg.mixer, task_sb, cfg.run.seed)
    expected = tokenize_pairs(solver, pairs, cfg.warmstart.max_len)
    held = replay.sft_answers
    assert held is not None
    replayed = sorted((tuple(item.prompt), tuple(item.tokens)) for item in held.sample(len(held), 0))
    assert replayed == sorted((tuple(p), tuple(a)) for p, a in expected)
    # the kinds were asked: some answers are not programs (a deduction's value, an abduction's call)
    program_only = tokenize_pairs(solver, solver_examples(tasks, prompt_options(cfg)), cfg.warmstart.max_len)
    assert sum(list(p) != list(q) for (p, _), (q, _) in zip(expected, program_only, strict=False)) > len(expected) // 4
