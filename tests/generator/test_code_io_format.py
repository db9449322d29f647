"""The code_io proposal format (`generator.format=code_io`, generator/code_io_format.py): registered and loadable,
its answers parsed and compiled into tasks that the validity checks accept when sound and reject with a reason when
not (hostile proposals included), its warm-start pairs, its grammar, and a smoke run of `selfplay train` with it."""

from __future__ import annotations

import json
import random
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from generator import code_io_format as cio
from generator.agent import ProposalError
from generator.build import generate_tasks
from generator.code_io import Proposal, rename_entry
from generator.formats import CODE_IO, FORMATS, proposal_format
from generator.grammars import GRAMMARS, code_io_grammar
from generator.rewards import ProposalOutcome, generator_rewards
from generator.schema import Task
from generator.validity import CODE_IO_FAMILY, MemoryIndex, check_safe, validate_many
from selfplay.runtime.config import load_config
from selfplay.runtime.errors import UserError
from selfplay.runtime.tb import read_scalars
from solver.episode import CodeEpisode
from solver.prompts import answer_text
from tests.conftest import selfplay

INPUTS_4 = "input: [3, 1, 2], 2\ninput: [5, 4, 9, 1], 3\ninput: [], 1\ninput: [7], 1\n"
INPUTS = INPUTS_4 + "input: [2, 2, 8], 2\ninput: [6, 0], 1\n"


def answer(program: str, inputs: str = INPUTS, message: str = "the k smallest values, in increasing order") -> str:
    """A code_io answer: the program in a fence, the inputs, the message."""
    return f"```python\n{program.strip()}\n```\n{inputs}" + (f"message: {message}\n" if message else "")


SORTED = "def f(xs, k):\n    return sorted(xs)[:k]\n"


@pytest.fixture(scope="module")
def procedural(task_sb) -> list[Task]:
    return generate_tasks(40, split="train", seed=7, sb=task_sb)


def judge(texts: list[str], sb, index=None, timeout_s: float | None = None) -> list[tuple[str, str]]:
    """Each answer as the rollouts take it (parse, compile, validate in one batch): ("valid", "") or the rejection
    and its reason ("unparsable" with the parse error)."""
    out: list[tuple[str, str] | None] = []
    tasks, where = [], []
    for text in texts:
        parsed = CODE_IO.parse(text)
        if isinstance(parsed, ProposalError):
            out.append(("unparsable", parsed.reason))
            continue
        task = CODE_IO.compile(parsed, [], step=1, n_visible=3, build_cfg=None, checkpoint="step_0")
        assert isinstance(task, Task)
        tasks.append(task)
        where.append(len(out))
        out.append(None)
    for i, report in zip(where, validate_many(tasks, sb, index, timeout_s=timeout_s)):
        out[i] = ("valid", "") if report.ok else (report.rejection, report.reason)
    return out  # type: ignore[return-value]


# ============================================================================================ registry
def test_code_io_is_a_registered_format_that_the_config_loads():
    assert FORMATS["code_io"] is CODE_IO is proposal_format("code_io")
    assert GRAMMARS["code_io"] is CODE_IO.grammar is code_io_grammar
    assert (CODE_IO.needs_program, CODE_IO.weighted, CODE_IO.sampling) == (False, False, "grammar")
    assert CODE_IO.max_answer_tokens == cio.MAX_ANSWER_TOKENS
    cfg = load_config("configs/code_io.yaml")
    assert cfg.generator.format == "code_io" and cfg.model.name_or_path == "tiny"
    assert load_config("configs/smoke.yaml", ["generator.format=code_io"]).generator.format == "code_io"
    with pytest.raises(UserError, match="generator.format must be one of free, mutation, code_io, got 'code-io'"):
        load_config("configs/smoke.yaml", ["generator.format=code-io"])
    with pytest.raises(UserError, match="random_edits .* needs generator.format=mutation"):
        load_config("configs/code_io.yaml", ["generator.source=random_edits"])


# ============================================================================================ parsing
def test_an_answer_round_trips_through_target_and_compiles_to_a_task_of_f():
    parsed = CODE_IO.parse(answer(SORTED))
    assert isinstance(parsed, Proposal) and parsed.program == SORTED and len(parsed.inputs) == 6
    assert CODE_IO.parse(CODE_IO.target(parsed)) == parsed
    refs = [Task.from_dict({**_shell(), "id": "r1", "level": 2})]
    task = CODE_IO.compile(parsed, refs, step=4, n_visible=3, build_cfg=None, checkpoint="step_3")
    assert (task.family, task.source, task.split, task.level) == (CODE_IO_FAMILY, "generator", "train", 2)
    assert (task.entry_point, task.signature, task.reference_solution) == ("f", "def f(xs, k)", SORTED)
    assert task.visible_tests == [{"input": [[3, 1, 2], 2]}, {"input": [[5, 4, 9, 1], 3]}, {"input": [[], 1]}]
    assert len(task.hidden_tests) == 3 and not task.outputs_computed
    assert task.description == cio.DESCRIPTION + " Hint: the k smallest values, in increasing order"
    assert (task.parent_ids, task.created_step, task.generator_checkpoint) == (["r1"], 4, "step_3")
    # fewer inputs: the visible ones give way, so that validity's three hidden tests are there when they can be
    four = CODE_IO.compile(CODE_IO.parse(answer(SORTED, INPUTS_4)), [], step=0, n_visible=3, build_cfg=None)
    assert (len(four.visible_tests), len(four.hidden_tests)) == (1, 3)


def _shell() -> dict:
    return dict(
        id="",
        family="list_int",
        source="procedural",
        split="train",
        level=1,
        description="d",
        entry_point="solve",
        signature="def solve(xs)",
        reference_solution="def solve(xs):\n    return xs\n",
    )


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty answer"),
        ("def f(x):\n    return x\ninput: 1\n", "no ```python block"),
        (answer("def f(x:\n    return x\n"), "the program does not parse"),
        (answer("def g(x):\n    return x\n"), "the program defines no top-level function 'f'"),
        (answer(SORTED, "input: [1, 2\n"), "input 1: arguments do not parse"),
        (answer(SORTED, "input: __import__('os').getcwd()\n"), "input 1: arguments are not Python literals"),
        (answer(SORTED, "input: xs=[1], k=2\n"), "input 1: arguments must be positional literals"),
        (answer(SORTED, "input: (1, 2), 1\n"), "input 1: argument 1: tuple is not a JSON value"),
        (answer(SORTED, "input: {1, 2}, 1\n"), "input 1: argument 1: set is not a JSON value"),
        (answer(SORTED, "input: {1: 2}, 1\n"), "input 1: argument 1: dict key 1 is not a string"),
        (answer(SORTED, ""), "no 'input:' line"),
        (answer(SORTED, "input: 1, 1\n" * 11), "11 inputs, at most 10"),
        (answer(SORTED, message="x" * 301), "message of 301 characters exceeds 300"),
    ],
)
def test_answers_that_name_no_task_are_unparsable_with_their_reason(text, reason):
    parsed = CODE_IO.parse(text)
    assert isinstance(parsed, ProposalError) and reason in parsed.reason, parsed


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.sampled_from(["", "```python\n", "```python\ndef f(x):\n    return x\n```\n"]))
def test_any_text_parses_to_a_proposal_or_a_reason_never_an_exception(text, head):
    parsed = CODE_IO.parse(head + text)
    assert isinstance(parsed, (Proposal, ProposalError))
    if isinstance(parsed, Proposal):  # what parses compiles
        assert isinstance(CODE_IO.compile(parsed, [], step=0, n_visible=3, build_cfg=None), Task)


# ============================================================================================ validity
def test_a_sound_proposal_is_valid_and_the_ordinary_solver_solves_it(task_sb):
    ((verdict, reason),) = judge([answer(SORTED)], task_sb)
    assert (verdict, reason) == ("valid", "")
    task = CODE_IO.compile(CODE_IO.parse(answer(SORTED)), [], step=0, n_visible=3, build_cfg=None)
    report = validate_many([task], task_sb)[0]
    valid = report.task
    assert valid.outputs_computed and valid.visible_tests[0] == {"input": [[3, 1, 2], 2], "output": [1, 2]}
    assert valid.fingerprints["behaviour"] and all(valid.checks.values())
    episode = CodeEpisode(valid, task_sb)  # the write-the-function solver, given the program as its answer
    episode.act(answer_text(valid.reference_solution))
    assert episode.result.solved
    # novelty: the same program under other names, or another program with the same calls and outputs, is not new
    index = MemoryIndex([valid])
    renamed = "def f(values, n):\n    return sorted(values)[:n]\n"
    same_behaviour = "def f(xs, k):\n    out = sorted(xs)\n    return out[:k]\n"
    assert [v for v, _ in judge([answer(renamed), answer(same_behaviour)], task_sb, index)] == ["novel", "novel"]


HOSTILE = {
    # name: (program, inputs or None for INPUTS, the check that rejects it, a part of its reason)
    "constant": ("def f(xs, k):\n    return 7\n", None, "diverse", "every hidden test has the same output"),
    "identity": ("def f(xs, k):\n    return xs\n", None, "trivial_fail", "identity"),
    "clock": (
        "import time\n\ndef f(xs, k):\n    return [time.time()] * k\n",
        None,
        "safe",
        "imports banned module 'time'",
    ),
    "clock_by_datetime": (
        "from datetime import datetime\n\ndef f(xs, k):\n    return str(datetime.now())\n",
        None,
        "safe",
        "imports banned module 'datetime'",
    ),
    "os_by_dunder_import": (
        "def f(xs, k):\n    return __import__('o' + 's').getpid()\n",
        None,
        "safe",
        "calls banned function '__import__'",
    ),
    "os_by_importlib": (
        "import importlib\n\ndef f(xs, k):\n    return importlib.import_module('os').getpid()\n",
        None,
        "safe",
        "imports banned module 'importlib'",
    ),
    "os_by_builtins": (
        "def f(xs, k):\n    return __builtins__['__import__']('os').getpid()\n",
        None,
        "safe",
        "uses '__builtins__'",
    ),
    "seeded_random": (  # a fixed seed passes generator.validity for other tasks, not code_io's stricter rule
        "import random\n\ndef f(xs, k):\n    random.seed(0)\n    return random.sample(xs, min(k, len(xs)))\n",
        None,
        "safe",
        "imports banned module 'random'",
    ),
    "hash_seed": ("def f(xs, k):\n    return hash(str(xs)) % 7 + k\n", None, "safe", "calls banned function 'hash'"),
    "state_across_calls": (
        "SEEN = []\n\ndef f(xs, k):\n    SEEN.append(k)\n    return len(SEEN) + k\n",
        None,
        "deterministic",
        "on one run",
    ),
    "huge_output": ("def f(xs, k):\n    return 'x' * 10 ** 7\n", None, "runs", "output_limit"),
    "long_output": ("def f(xs, k):\n    return 'x' * (2000 + k)\n", None, "json_values", "characters exceeds 1000"),
    "not_json_output": ("def f(xs, k):\n    return {k}\n", None, "json_values", "not JSON-serialisable"),
    "raises": ("def f(xs, k):\n    return xs[k]\n", None, "runs", "error"),
    "loops": ("def f(xs, k):\n    while True:\n        pass\n", None, "runs", "timeout"),
    "wrong_arity": ("def f(xs):\n    return sorted(xs)\n", None, "signature", "takes 1..1"),
    "too_few_inputs": ("def f(xs, k):\n    return sorted(xs)[:k]\n", "input: [1, 2], 1\n", "diverse", "needs >= 1"),
    "repeated_inputs": ("def f(xs, k):\n    return sorted(xs)[:k]\n", "input: [1, 2], 1\n" * 6, "diverse", "distinct"),
}


def test_hostile_proposals_are_each_rejected_by_their_check_with_a_reason(task_sb):
    """One batch, as the rollouts validate one: every hostile proposal is invalid, by the check that names what is
    wrong with it and a reason a reader can act on; nothing raises."""
    texts = [answer(program, inputs or INPUTS) for program, inputs, _, _ in HOSTILE.values()]
    verdicts = judge(texts, task_sb, timeout_s=1.0)
    for name, (check, reason), (_, _, want, part) in zip(HOSTILE, verdicts, HOSTILE.values()):
        assert check == want and part in reason, (name, check, reason)
        assert reason.startswith(f"{check}: ")


def test_check_safe_holds_only_code_io_tasks_to_code_io_rules():
    seeded = "import random\n\ndef f(xs):\n    random.seed(0)\n    return random.random()\n"
    other = Task.from_dict({**_shell(), "reference_solution": seeded, "entry_point": "f"})
    assert check_safe(other).passed  # a fixed seed is enough elsewhere
    mine = Task.from_dict({**other.to_dict(), "family": CODE_IO_FAMILY})
    assert check_safe(mine).reason == "imports banned module 'random'"


def test_the_proposer_reward_is_the_projects_learnability_reward():
    """code_io adds no reward of its own: its proposals are scored by generator.rewards (1 - p inside (0, 1), 0 at
    the ends, the fixed penalties for unparsable and invalid answers)."""
    outcomes = [ProposalOutcome(True, True, 0.25), ProposalOutcome(True, True, 1.0), ProposalOutcome(True, False)]
    outcomes.append(ProposalOutcome(False, False))
    assert generator_rewards(outcomes, repetition_weight=0.0) == [0.75, 0.0, -0.5, -1.0]


# ============================================================================================ warm start
def test_a_procedural_reference_is_renamed_f_with_its_layout_kept():
    program = (
        "def solve(xs):\n    return [solve_one(x) for x in xs]  # solve\n\n\ndef solve_one(x):\n    return x.solve\n"
    )
    renamed = rename_entry(program, "solve")
    assert renamed == program.replace("def solve(", "def f(", 1)
    taken = "def solve(f):\n    return f + 1\n"
    assert rename_entry(taken, "solve") == "def f(f_0):\n    return f_0 + 1\n"
    assert rename_entry("def g(x):\n    return x\n", "solve") is None


def test_warm_start_pairs_are_procedural_tasks_as_code_io_answers_that_are_valid(procedural, task_sb):
    pairs = CODE_IO.examples(procedural, 2, 0, sb=task_sb)
    assert len(pairs) >= 20  # 28 of the 40: the others' calls are too long for a target, or too alike
    tasks = []
    for prompt, text in pairs:
        assert prompt.startswith("Write a new Python function `f` for ") and "Reference 1:" in prompt
        assert "def solve" not in prompt and "input: <the arguments of one call" in prompt
        parsed = CODE_IO.parse(text)
        assert isinstance(parsed, Proposal) and CODE_IO.target(parsed) == text
        assert 4 <= len(parsed.inputs) <= cio.N_INPUTS  # a visible call and three hidden at least
        tasks.append(CODE_IO.compile(parsed, [], step=0, n_visible=3, build_cfg=None))
    reports = validate_many(tasks, task_sb)
    assert all(r.ok for r in reports), [r.reason for r in reports if not r.ok][:3]
    # against a corpus that holds the procedural tasks they are no new task: their programs are known
    assert {r.rejection for r in validate_many(tasks[:5], task_sb, MemoryIndex(procedural))} == {"novel"}
    assert CODE_IO.examples(procedural, 2, 0, sb=task_sb) == pairs  # a function of its arguments


def test_prompts_show_references_as_f_with_calls_and_a_message(procedural):
    rng = random.Random(0)
    refs = procedural[:2]
    instruction = CODE_IO.instruction(rng, refs, None, None)
    prompt = CODE_IO.prompt(refs, instruction)
    assert instruction in ("deduction", "abduction", "induction") and f"for a {instruction}" in prompt.replace(
        "an abduction", "a abduction"
    )
    assert prompt.count("```python\ndef f(") == 2 + 1 and prompt.count("\nf(") <= 2 * cio.PROMPT_PAIRS  # + the form
    assert "message: " in prompt


@pytest.mark.slow  # a tokenizer trained and the grammar compiled for it: over 9 s
def test_the_grammar_accepts_every_warm_start_answer(procedural, task_sb):
    xgr = pytest.importorskip("xgrammar")
    from selfplay.models.factory import train_tokenizer
    from selfplay.rollout.constrained import compile_constraint

    pairs = CODE_IO.examples(procedural, 1, 0, sb=task_sb)
    tok = train_tokenizer([x for pair in pairs for x in pair] * 3, vocab_size=400, kind="bpe")
    compiled = compile_constraint(tok, "code_io", len(tok)).compiled
    for _, text in pairs:
        matcher = xgr.GrammarMatcher(compiled)
        assert matcher.accept_string(text) and matcher.accept_token(tok.eos_token_id), text
    assert not xgr.GrammarMatcher(compiled).accept_string(answer(SORTED, "input: (1, 2), 1\n"))


# ============================================================================================ end to end
@pytest.mark.slow
def test_a_smoke_run_of_configs_code_io_proposes_parses_and_validates(tmp_path):
    """`selfplay train configs/code_io.yaml` at the smoke world's size: the warm-started generator's answers are
    parsed and validated each iteration; the valid ones reach the corpus as code_io tasks with their outputs, the
    others are counted by the check that rejected them (generator/rejected/<check>)."""
    run = tmp_path / "run"
    selfplay(
        "train",
        "configs/code_io.yaml",
        f"run.dir={run}",
        "model.n_layer=2",
        "model.n_embd=64",
        "model.n_head=2",
        "model.vocab_size=800",
        "warmstart.tasks=200",
        "warmstart.solver_steps=40",
        "warmstart.generator_steps=60",
        "warmstart.lr=3.0e-3",
        "ppo.mini_batch_size=4",
        "ppo.micro_batch_size=4",
        "ppo.epochs=1",
        "ppo.max_new_tokens=96",
        "train.steps=2",
        "train.solver_tasks=4",
        "train.samples_per_task=2",
        "train.proposals=4",
        "train.eval_every=0",
        "train.log_samples_every=1",
        "eval.tasks_per_split=2",
        "eval.samples=2",
        timeout=1500,
    )
    scalars = read_scalars(run)
    assert len(scalars["generator/parse_rate"]) == 2
    for step, rate in scalars["generator/validity_rate"]:  # every proposal valid, or rejected by a named check
        rejected = sum(v for k, s in scalars.items() if k.startswith("generator/rejected/") for t, v in s if t == step)
        assert round(rate * 4) + rejected == 4, {k: s for k, s in scalars.items() if k.startswith("generator/")}
    with sqlite3.connect(run / "corpus.sqlite") as db:
        rows = [json.loads(r[0]) for r in db.execute("SELECT record FROM tasks WHERE source = 'generator'")]
    for row in rows:  # the valid ones, with their outputs computed by the sandbox
        task = Task.from_dict(row)
        assert task.family == CODE_IO_FAMILY and task.entry_point == "f" and task.outputs_computed
        assert all(task.checks.values()) and task.description.startswith(cio.DESCRIPTION)
