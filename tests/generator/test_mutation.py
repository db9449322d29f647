"""The mutation proposal format: its text round-trips, any text parses or fails with a reason, every edit kind
compiles to a task that passes the validity checks in the sandbox, and impossible edits are rejected by name."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generator.agent import ProposalError
from generator.build import materialise, pipeline_params
from generator.families.catalogue import AGGREGATES
from generator.families.grammar import (
    INPUT_NAMES,
    GrammarError,
    check_pipeline,
    format_program,
    format_step,
    parse_step,
    program_of,
)
from generator.families.steps import KINDS
from generator.mutation import (
    INSTRUCTIONS,
    OPS,
    Edit,
    Mutation,
    MutationError,
    build_mutation_prompt,
    choose_mutation_instruction,
    compile_mutation,
    feasible_instructions,
    format_edit,
    format_mutation,
    known_program,
    parse_mutation,
    possible_edits,
    random_mutation,
)
from generator.schema import Task
from generator.splits import split_of
from generator.validity import MemoryIndex, validate_many

# ---- strategies: everything the syntax can express (names and values need not exist in the catalogue) -----------
names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
values = st.one_of(
    st.integers(-999, 999),
    st.integers(-400, 400).map(lambda q: q / 4),
    st.from_regex(r"[A-Za-z0-9_!?.#*+\-]{0,6}", fullmatch=True),
)
arg_dicts = st.dictionaries(names, values, max_size=3)
numbers = st.integers(0, 99)


def steps_strategy():
    named = st.builds(
        lambda kind, e, a: {"kind": kind, "expr": e, "args": a},
        st.sampled_from(["filter", "map", "sink"]),
        names,
        arg_dicts,
    )
    sort = st.builds(
        lambda k, a, d, i: {"kind": "sort", "key": k, "args": a, "desc": d, "in_place": i},
        names,
        arg_dicts,
        st.booleans(),
        st.booleans(),
    )
    top_k = st.builds(
        lambda key, a, k, big: {"kind": "top_k", "key": key, "args": a, "k": k, "largest": big},
        names,
        arg_dicts,
        numbers,
        st.booleans(),
    )
    take = st.builds(lambda k, end: {"kind": "take", "k": k, "end": end}, numbers, st.sampled_from(["first", "last"]))
    window = st.builds(lambda w, agg: {"kind": "window", "w": w, "agg": agg}, numbers, names)
    group = st.builds(lambda k, v, agg: {"kind": "group", "key": k, "val": v, "agg": agg}, names, names, names)
    plain = st.sampled_from([{"kind": "reverse"}, {"kind": "dedup"}])
    return st.one_of(named, sort, top_k, take, window, group, plain)


EDITS = {  # op -> a strategy of its edits
    "const": st.builds(lambda at, n, v: Edit("const", at=at, name=n, value=v), numbers, names, values),
    **{
        op: st.builds(lambda at, n, a, op=op: Edit(op, at=at, name=n, args=a), numbers, names, arg_dicts)
        for op in ("key", "expr")
    },
    **{op: st.builds(lambda at, op=op: Edit(op, at=at), numbers) for op in ("order", "drop")},
    "type": st.builds(lambda n: Edit("type", name=n), names),
    **{op: st.builds(lambda at, s, op=op: Edit(op, at=at, step=s), numbers, steps_strategy()) for op in ("add", "set")},
    "swap": st.builds(lambda at, to: Edit("swap", at=at, to=to), numbers, numbers),
    "splice": st.builds(lambda at, r, to: Edit("splice", at=at, ref=r, to=to), numbers, numbers, numbers),
}


def edits_strategy():
    return st.one_of(*EDITS.values())


@given(ref=st.integers(0, 999), edit=edits_strategy())
def test_any_expressible_mutation_round_trips(ref, edit):
    mutation = Mutation(ref, edit)
    assert parse_mutation(format_mutation(mutation)) == mutation


@given(steps_strategy())
def test_any_expressible_step_round_trips(step):
    assert parse_step(format_step(step).split()) == step


@given(data=st.data(), op=st.sampled_from(OPS))
def test_every_edit_kind_is_in_the_round_trip(data, op):
    assert set(EDITS) == set(OPS)
    assert data.draw(EDITS[op]).op == op


@given(st.text(max_size=300))
def test_random_text_never_crashes_the_parser(text):
    assert isinstance(parse_mutation(text), (Mutation, ProposalError))


@settings(max_examples=200)
@given(st.integers(0, 999), edits_strategy(), st.data())
def test_damaged_answers_never_crash_the_parser(ref, edit, data):
    """Answers one token away from a well-formed one (dropped, doubled or replaced)."""
    tokens = format_mutation(Mutation(ref, edit)).split(" ")
    i = data.draw(st.integers(0, len(tokens) - 1))
    how = data.draw(st.sampled_from(["drop", "double", "replace"]))
    new = data.draw(st.text(max_size=6))
    tokens = (
        tokens[:i] + tokens[i + 1 :]
        if how == "drop"
        else tokens[: i + 1] + tokens[i:]
        if how == "double"
        else tokens[:i] + [new] + tokens[i + 1 :]
    )
    assert isinstance(parse_mutation(" ".join(tokens)), (Mutation, ProposalError))


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty"),
        ("REF 1\nEDIT drop 1\n", "END"),
        ("EDIT drop 1\nEND", "line"),
        ("REF one\nEDIT drop 1\nEND", "REF n"),
        ("REF 1\nEDITS drop 1\nEND", "EDIT"),
        ("REF 1\nEDIT explode 1\nEND", "unknown edit"),
        ("REF 1\nEDIT drop\nEND", "step number"),
        ("REF 1\nEDIT drop 1 2\nEND", "operand"),
        ("REF 1\nEDIT const 1 k=\nEND", "value"),
        ('REF 1\nEDIT const 1 c="a b"\nEND', "operand"),
        ('REF 1\nEDIT const 1 c="a\\"b"\nEND', "value"),
        ("REF 1\nEDIT add 1 sort abs\nEND", "asc or desc"),
        ("REF 1\nEDIT add 1 launch rockets\nEND", "unknown step kind"),
        ("REF 1\nEDIT key 1 mod m=3 m=4\nEND", "twice"),
    ],
)
def test_malformed_answers_say_why(text, reason):
    result = parse_mutation(text)
    assert isinstance(result, ProposalError) and reason in result.reason, result


def test_text_after_end_and_blank_lines_are_ignored():
    assert parse_mutation("\nREF 2\n\nEDIT  swap 1  2\nEND\nREF 9 whatever") == Mutation(2, Edit("swap", at=1, to=2))


# ---- compiling ------------------------------------------------------------------------------------------------
def reference(family: str, steps_text: list[str], level: int = 3, tid: str = "") -> Task:
    steps = [parse_step(s.split()) for s in steps_text]
    task = materialise(pipeline_params(family, steps, level, size=5, seed=len(tid) + 7), "train")
    return Task(**{**task.to_dict(), "id": tid or task.id})


@pytest.fixture(scope="module")
def refs():
    a = reference("list_int", ["filter gt k=3", "map mul k=2"], tid="ref-a")
    b = reference("list_int", ["sort abs desc", "take first 2"], tid="ref-b")
    c = reference("list_str", ["sort len desc", "take first 2"], tid="ref-c")
    return [a, b, c]


SENSIBLE = [
    ("const", "REF 1\nEDIT const 1 k=5\nEND", ["filter gt k=5", "map mul k=2"]),
    ("key", "REF 2\nEDIT key 1 last_digit\nEND", ["sort last_digit desc", "take first 2"]),
    ("expr", "REF 1\nEDIT expr 1 even\nEND", ["filter even", "map mul k=2"]),
    ("order", "REF 2\nEDIT order 1\nEND", ["sort abs asc", "take first 2"]),
    ("type", "REF 3\nEDIT type text\nEND", None),
    ("add", "REF 1\nEDIT add 3 take last 2\nEND", ["filter gt k=3", "map mul k=2", "take last 2"]),
    ("drop", "REF 1\nEDIT drop 1\nEND", ["map mul k=2"]),
    ("swap", "REF 1\nEDIT swap 1 2\nEND", ["map mul k=2", "filter gt k=3"]),
    ("set", "REF 1\nEDIT set 2 map add k=5\nEND", ["filter gt k=3", "map add k=5"]),
    ("splice", "REF 1\nEDIT splice 3 2 1\nEND", ["filter gt k=3", "map mul k=2", "sort abs desc"]),
]


def test_the_sensible_cases_cover_every_edit_kind():
    assert {op for op, *_ in SENSIBLE} == set(OPS)


def test_every_edit_kind_compiles_to_a_valid_task(refs, task_sb):
    tasks = []
    for op, text, expected in SENSIBLE:
        mutation = parse_mutation(text)
        assert isinstance(mutation, Mutation), (op, mutation)
        task = compile_mutation(mutation, refs, step=5, generator_checkpoint="step_4")
        assert isinstance(task, Task), (op, task)
        kind, steps = program_of(task)
        if expected is not None:
            assert [format_step(s) for s in steps] == expected, op
        else:
            assert kind == "text" and steps == program_of(refs[2])[1]
        assert task.source == "generator" and task.family.startswith("generator/") and task.created_step == 5
        assert task.parent_ids[0] == refs[mutation.ref - 1].id and task.generator_checkpoint == "step_4"
        assert split_of(task.params) == "train"
        assert "solve" in task.reference_solution and task.description and not task.outputs_computed
        tasks.append(task)
    assert compile_mutation(parse_mutation(SENSIBLE[-1][1]), refs).parent_ids == ["ref-a", "ref-b"]
    reports = validate_many(tasks, task_sb, MemoryIndex(refs))
    assert [r.reason for r in reports] == [""] * len(tasks)


def test_compiling_is_deterministic(refs):
    mutation = parse_mutation("REF 1\nEDIT const 2 k=4\nEND")
    assert compile_mutation(mutation, refs).to_json() == compile_mutation(mutation, refs).to_json()


IMPOSSIBLE = [
    ("REF 4\nEDIT drop 1\nEND", "reference 4 does not exist"),
    ("REF 1\nEDIT drop 9\nEND", "step 9 does not exist"),
    ("REF 2\nEDIT const 1 z=3\nEND", "no constant 'z'"),
    ("REF 1\nEDIT const 1 k=3\nEND", "changes nothing"),
    ("REF 1\nEDIT key 1 abs\nEND", "has no key"),
    ("REF 1\nEDIT expr 1 palindrome\nEND", "no 'palindrome' for int"),
    ("REF 1\nEDIT expr 1 gt\nEND", "changes nothing"),  # gt keeps its k=3
    ("REF 1\nEDIT order 1\nEND", "has no order"),
    ("REF 1\nEDIT type str\nEND", "no 'gt' for str"),
    ("REF 2\nEDIT type float\nEND", "held-out split heldout_types"),
    ("REF 2\nEDIT type int\nEND", "already int"),
    ("REF 2\nEDIT type bool\nEND", "unknown input type"),
    ("REF 2\nEDIT type str\nEND", "no 'abs' for str"),
    ("REF 1\nEDIT add 1 sink sum\nEND", "a sink must be the last step"),
    ("REF 1\nEDIT add 3 group parity value sum\nEND", "held-out split heldout_compositions"),
    ("REF 3\nEDIT add 3 window 3 sum\nEND", "window does not apply to str"),
    ("REF 3\nEDIT expr 1 gt\nEND", "has no expression"),
    ("REF 1\nEDIT swap 2 2\nEND", "two different steps"),
    ("REF 2\nEDIT set 1 sort abs desc inplace\nEND", "changes nothing but how a sort is written"),
    ("REF 1\nEDIT splice 1 4 1\nEND", "reference 4 does not exist"),
    ("REF 1\nEDIT splice 1 2 5\nEND", "reference 2's step 5 does not exist"),
    ("REF 1\nEDIT set 1 map tostr\nEND", "no 'mul' for str"),
]


@pytest.mark.parametrize("text, reason", IMPOSSIBLE)
def test_impossible_edits_are_rejected_with_their_reason(refs, text, reason):
    result = compile_mutation(parse_mutation(text), refs)
    assert isinstance(result, MutationError) and reason in result.reason, result


# constants are read as the catalogue offers them: moved to the nearest offered value, a missing one kept from the
# step it replaces (or, one given under another name, taken for the one missing), one the expression lacks ignored
REPAIRED = [
    ("REF 1\nEDIT const 1 k=99\nEND", ["filter gt k=15", "map mul k=2"]),  # gt's k: -15..15 (narrow and wide)
    ("REF 1\nEDIT const 2 m=4\nEND", ["filter gt k=3", "map mul k=4"]),  # mul's one constant is k
    ("REF 1\nEDIT const 2 k=2.6\nEND", ["filter gt k=3", "map mul k=3"]),
    ("REF 2\nEDIT const 2 k=0\nEND", ["sort abs desc", "take first 1"]),
    ("REF 1\nEDIT expr 1 lt\nEND", ["filter lt k=3", "map mul k=2"]),
    ("REF 1\nEDIT expr 1 even k=3\nEND", ["filter even", "map mul k=2"]),
    ("REF 1\nEDIT expr 1 div k=4\nEND", ["filter div m=4", "map mul k=2"]),
    ("REF 1\nEDIT set 2 map add\nEND", ["filter gt k=3", "map add k=2"]),
    ("REF 1\nEDIT add 3 window 9 sum\nEND", ["filter gt k=3", "map mul k=2", "window 5 sum"]),
    ("REF 2\nEDIT key 1 mod\nEND", ["sort mod m=3 desc", "take first 2"]),
    ("REF 3\nEDIT splice 1 1 1\nEND", None),  # filter gt on str elements: no such filter, rejected
]


@pytest.mark.parametrize("text, expected", REPAIRED)
def test_constants_are_read_as_the_catalogue_offers_them(refs, text, expected):
    result = compile_mutation(parse_mutation(text), refs)
    if expected is None:
        assert isinstance(result, MutationError), result
        return
    assert isinstance(result, Task), result
    assert [format_step(s) for s in program_of(result)[1]] == expected


def test_drop_of_the_only_step_and_a_deeper_program_are_rejected():
    one = reference("list_int", ["reverse"], level=2)
    assert "only step" in compile_mutation(parse_mutation("REF 1\nEDIT drop 1\nEND"), [one]).reason
    deep = reference("list_int", ["filter even", "map neg", "reverse", "take first 3"], level=4)
    result = compile_mutation(parse_mutation("REF 1\nEDIT add 5 dedup\nEND"), [deep])
    assert isinstance(result, MutationError) and "deeper" in result.reason


def test_a_reference_without_a_program_cannot_be_edited(refs):
    bare = Task(**{**refs[0].to_dict(), "params": {}, "id": "bare"})
    result = compile_mutation(parse_mutation("REF 1\nEDIT drop 1\nEND"), [bare])
    assert isinstance(result, MutationError) and "no program" in result.reason
    assert "(no program)" in build_mutation_prompt([bare], "mutate")


def test_level_follows_the_new_depth(refs):
    one = reference("list_int", ["reverse"], level=1)
    assert compile_mutation(parse_mutation("REF 1\nEDIT add 2 take first 2\nEND"), [one]).level == 3
    assert compile_mutation(parse_mutation("REF 1\nEDIT set 1 dedup\nEND"), [one]).level == 1
    assert compile_mutation(parse_mutation("REF 1\nEDIT drop 1\nEND"), refs).level == 2


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), edit=edits_strategy())
def test_compiling_any_parsed_edit_never_raises(task_pool, data, edit):
    references = data.draw(st.lists(st.sampled_from(task_pool), min_size=1, max_size=3))
    result = compile_mutation(Mutation(data.draw(st.integers(0, 4)), edit), references)
    assert isinstance(result, (Task, MutationError))
    if isinstance(result, Task):
        check_pipeline(*program_of(result))
        assert split_of(result.params) == "train"


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), instruction=st.sampled_from(sorted(INSTRUCTIONS)), seed=st.integers(0, 10**6))
def test_random_mutations_follow_their_instruction_and_compile(task_pool, data, instruction, seed):
    train = [t for t in task_pool if t.split == "train"]
    references = data.draw(st.lists(st.sampled_from(train), min_size=1, max_size=3, unique_by=lambda t: t.id))
    found = random_mutation(random.Random(seed), references, instruction)
    if found is None:  # e.g. compose with one reference, swap on one-step programs only
        return
    mutation, task = found
    assert mutation.edit.op in INSTRUCTIONS[instruction][1]
    assert parse_mutation(format_mutation(mutation)) == mutation
    assert compile_mutation(mutation, references).to_json() == task.to_json()


def test_instructions_are_drawn_uniformly_or_by_the_given_weights(task_pool):
    refs = [t for t in task_pool if program_of(t) is not None][:1]
    names = feasible_instructions(refs)
    assert len(names) >= 2
    # no weights (or None from the caller) is the uniform draw, the same rng stream as before weights existed
    plain = [choose_mutation_instruction(random.Random(s), refs) for s in range(20)]
    assert plain == [choose_mutation_instruction(random.Random(s), refs, weights=lambda n: None) for s in range(20)]
    asked = []

    def favour_the_last(ns):  # the caller is shown the allowed names and nearly always gets the last one
        asked.append(list(ns))
        return [1000.0 if n == names[-1] else 1e-9 for n in ns]

    rng = random.Random(0)
    assert {choose_mutation_instruction(rng, refs, weights=favour_the_last) for _ in range(20)} == {names[-1]}
    assert asked == [names] * 20
    with pytest.raises(ValueError, match="one positive number per name"):
        choose_mutation_instruction(rng, refs, weights=lambda ns: [1.0])
    with pytest.raises(ValueError, match="one positive number per name"):
        choose_mutation_instruction(rng, refs, weights=lambda ns: [0.0] * len(ns))


def test_the_prompt_shows_every_reference_program(refs):
    prompt = build_mutation_prompt(refs, "compose")
    for i, ref in enumerate(refs, 1):
        assert f"Reference {i}: {format_program(*program_of(ref))}" in prompt
    assert INSTRUCTIONS["compose"][0] in prompt
    with pytest.raises(ValueError):
        build_mutation_prompt(refs, "explode")


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "filter", "expr": "gt", "args": {}},
        {"kind": "window", "w": 3, "agg": "sum"},  # on str
        {"kind": "group", "key": "parity", "val": "value", "agg": "sum"},  # on str
    ],
)
def test_check_pipeline_names_what_is_wrong(bad):
    with pytest.raises(GrammarError, match="step 1"):
        check_pipeline("list:str", [bad])


def test_procedural_programs_are_all_in_the_grammar(task_pool):
    """Every family and level of the task pool carries a program that prints and parses back exactly."""
    for task in task_pool:
        kind, steps = program_of(task)
        lines = format_program(kind, steps).split("\n")
        assert INPUT_NAMES[lines[0]] == kind
        assert [parse_step(line.split()[1:]) for line in lines[1:]] == steps
    assert {s["kind"] for t in task_pool for s in t.params["steps"]} <= set(KINDS)
    assert set(AGGREGATES)  # the group aggregates the expr edit may name


def test_an_unknown_format_is_named_before_any_work():
    from selfplay.runtime.config import load_config
    from selfplay.runtime.errors import UserError

    assert load_config(overrides=["generator.format=free"]).generator.format == "free"
    with pytest.raises(UserError, match="generator.format must be one of free, mutation"):
        load_config(overrides=["generator.format=prose"])


# ---- possible_edits: what the prompt's grammar offers ----------------------------------------------------------
def test_possible_edits_are_exactly_the_edits_that_compile(refs):
    possible = possible_edits(refs)
    texts = {r: {format_edit(e) for e in edits} for r, edits in possible.items()}
    assert set(possible) == {1, 2, 3}
    assert "const 1 k=15" in texts[1] and "const 1 k=3" not in texts[1]  # the same value changes nothing
    assert not any(t.startswith("order") for t in texts[1])  # filter and map have no order
    assert "add 1 sink sum" not in texts[1] and "add 3 sink sum" in texts[1]  # a sink only at the end
    assert not any(t.startswith("add 3 group") for t in texts[1])  # filter+group is a held-out pair
    assert "type str" not in texts[1] and "type float" not in texts[2]  # no 'gt' for str; float is held out
    assert "key 1 lower" in texts[3] and "key 1 len" not in texts[3] and "key 1 abs" not in texts[3]
    assert "splice 3 2 1" in texts[1] and "splice 3 3 1" not in texts[1] and "drop 1" in texts[1]
    rng = random.Random(0)
    for ref, edits in possible.items():
        for edit in rng.sample(edits, 25):
            task = compile_mutation(Mutation(ref, edit), refs)
            assert isinstance(task, Task), (ref, format_edit(edit), task)
            assert split_of(task.params) == "train"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data(), instruction=st.sampled_from(sorted(INSTRUCTIONS)), seed=st.integers(0, 10**6))
def test_possible_edits_hold_every_drawn_mutation(task_pool, data, instruction, seed):
    train = [t for t in task_pool if t.split == "train"]
    references = data.draw(st.lists(st.sampled_from(train), min_size=1, max_size=3, unique_by=lambda t: t.id))
    found = random_mutation(random.Random(seed), references, instruction)
    if found is None:
        return
    mutation, _ = found
    assert format_edit(mutation.edit) in {format_edit(e) for e in possible_edits(references)[mutation.ref]}


def test_possible_edits_leave_out_programs_the_corpus_holds(refs):
    from generator.fingerprint import ast_hash

    target = compile_mutation(parse_mutation("REF 1\nEDIT const 1 k=5\nEND"), refs)
    index = MemoryIndex([Task(**{**target.to_dict(), "fingerprints": {"ast": ast_hash(target.reference_solution)}})])
    assert known_program(*program_of(target), index) and not known_program(*program_of(target), MemoryIndex())
    free, known = possible_edits(refs), possible_edits(refs, index=index)
    lost = {format_edit(e) for e in free[1]} - {format_edit(e) for e in known[1]}
    assert lost == {"const 1 k=5", "expr 1 gt k=5", "set 1 filter gt k=5"}  # three ways to write that program
    assert {format_edit(e) for e in free[2]} == {format_edit(e) for e in known[2]}


@pytest.mark.parametrize(
    "steps, text, same",
    [
        (["filter gt k=3", "map mul k=2", "sink sum"], "add 1 sort abs desc", True),  # the sum sees no order
        (["filter gt k=3", "map mul k=2", "sink sum"], "add 3 reverse", True),
        (["filter gt k=3", "map mul k=2", "sink sum"], "add 3 take first 2", False),  # which two depends on the order
        (["filter gt k=3", "filter even", "reverse"], "swap 1 2", True),  # two filters commute
        (["filter gt k=3", "filter even", "reverse"], "swap 2 3", True),  # a filter and a reverse commute
        (["filter gt k=3", "map mul k=2", "reverse"], "swap 1 2", False),  # a filter and a map do not
        (["sort abs desc", "take first 2"], "add 2 reverse", False),
    ],
)
def test_edits_the_outputs_cannot_show_change_nothing(steps, text, same):
    ref = reference("list_int", steps, tid="ref-o")
    result = compile_mutation(parse_mutation(f"REF 1\nEDIT {text}\nEND"), [ref])
    assert isinstance(result, MutationError) == same, result
    if same:
        assert "changes nothing the outputs show" in result.reason
        assert text not in {format_edit(e) for e in possible_edits([ref])[1]}
