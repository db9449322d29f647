"""The solver's warm-start examples in the kinds of `mixer.kinds` (selfplay/train/warmstart.py's solver_examples,
solver/kinds.py's kind_examples): drawn in the kinds' shares, each answered rightly, graded in the real sandbox."""

from __future__ import annotations

from collections import Counter

from generator.build import generate_tasks
from selfplay.runtime.config import load_config
from selfplay.train.mixer import Mixer
from selfplay.train.warmstart import solver_examples
from solver.code_io import verify_many
from solver.kinds import kind_examples
from solver.prompts import answer_text, task_prompt


def test_the_program_kind_alone_keeps_the_examples(task_sb):
    tasks = generate_tasks(4, seed=2, sb=task_sb)
    cfg = load_config()
    assert not cfg.mixer.kinds
    pairs = solver_examples(tasks, {"max_examples": 1}, cfg.mixer, task_sb, cfg.run.seed)
    assert pairs == solver_examples(tasks, {"max_examples": 1})
    assert pairs == [(task_prompt(t, max_examples=1), answer_text(t.reference_solution)) for t in tasks]


def test_examples_follow_the_kinds_shares_and_pass_their_verifiers(task_sb):
    tasks = generate_tasks(12, level=2, seed=4, sb=task_sb)
    cfg = load_config(overrides=["mixer.kinds={program: 2, deduction: 1, abduction: 1, induction: 2}", "run.seed=3"])
    kinds = Mixer(cfg.mixer, seed=3).draw_kinds(len(tasks), step=0)
    assert Counter(kinds) == {"program": 4, "deduction": 2, "abduction": 2, "induction": 4}
    pairs = solver_examples(tasks, None, cfg.mixer, task_sb, cfg.run.seed)
    examples = kind_examples(tasks, kinds, task_sb)
    assert pairs == [(e.prompt, e.answer) for e in examples] and [e.kind for e in examples] == kinds
    asked = [e for e in examples if e.asked is not None]
    verdicts = verify_many([e.asked for e in asked], [e.answer for e in asked], task_sb)
    assert [v.status for v in verdicts] == ["correct"] * 8
    assert sum(p.startswith("Here is a Python function") for p, _ in pairs) == 4  # deduction and abduction
