"""Procedural families: typed composition, readable references, curriculum levels, description variety."""

import ast
import hashlib
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from generator.build import BuildConfig, materialise, sample_params
from generator.descriptions import IRRELEVANT, _inject_error, describe
from generator.families import FAMILIES, final_type, kinds_of, render_reference, render_signature, sample_pipeline
from generator.families.catalogue import GROUP_KEYS, KEYS, LITERALS, MAPS, PREDICATES, SINKS, find
from generator.families.steps import MAX_K, MAX_WINDOW, output_type
from generator.families.values import ELEMENT_TYPES, input_etype, random_element
from generator.fingerprint import ast_hash

TYPE_CHECK = {"int": int, "float": (int, float), "str": str, "rec": dict, "tup": list}


@pytest.mark.parametrize("literals", LITERALS)
@pytest.mark.parametrize("etype", ELEMENT_TYPES)
def test_catalogue_expressions_evaluate_to_their_declared_types(etype, literals):
    """Every component, with every argument choice of either literal range, evaluates on random elements to the
    type it declares."""
    rng = random.Random(etype)
    elements = [random_element(rng, etype) for _ in range(30)]
    for table in (PREDICATES, MAPS, KEYS, GROUP_KEYS):
        for expr in table.get(etype, []):
            args = expr.choices(literals)
            assert set(expr.wide) <= set(expr.args), expr.name  # "wide" only widens existing placeholders
            choices = [dict(zip(args, combo)) for combo in _combos(args)]
            for args in choices:
                code = expr.fill(args)
                for x in elements:
                    value = eval(code, {}, {"x": x})  # our own catalogue, not untrusted code
                    if table is MAPS:
                        assert isinstance(value, TYPE_CHECK[expr.out]), (code, x, value)
                    if table is PREDICATES:
                        assert isinstance(value, bool), code
    for expr in SINKS[etype]:
        value = eval(expr.fill({}), {}, {"xs": elements})
        assert isinstance(value, TYPE_CHECK[expr.out])


def _combos(args):
    combos = [()]
    for choices in args.values():
        combos = [c + (v,) for c in combos for v in choices]
    return combos


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), family=st.sampled_from(sorted(FAMILIES)), depth=st.integers(1, 6))
def test_pipelines_are_typed_and_render_readable_code(seed, family, depth):
    rng = random.Random(seed)
    kind = FAMILIES[family]
    steps = sample_pipeline(rng, kind, depth)
    assert len(steps) == depth
    kinds = kinds_of(steps)
    assert "sink" not in kinds[:-1]
    assert all(a != b for a, b in zip(kinds, kinds[1:]))
    params = {"input": kind, "steps": steps}
    source = render_reference(params)
    tree = ast.parse(source)
    (fn,) = tree.body
    assert fn.name == "solve" and isinstance(fn.body[-1], ast.Return)
    signature = render_signature(params)
    assert signature.startswith(f"def solve({fn.args.args[0].arg}: ")
    etype, scalar = final_type(kind, steps)
    assert signature.endswith("]") != scalar


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    pair=st.sampled_from([("dedup", "sort"), ("filter", "group"), ("map", "top_k")]),
    depth=st.integers(2, 4),
)
def test_required_and_forbidden_pairs(seed, pair, depth):
    rng = random.Random(seed)
    kind = rng.choice(["list:int", "list:str", "list:rec", "text", "csv"])
    steps = sample_pipeline(rng, kind, depth, require_pair=pair)
    assert set(pair) <= set(kinds_of(steps))
    steps = sample_pipeline(rng, kind, depth, forbid_pairs=[pair])
    assert not set(pair) <= set(kinds_of(steps))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), level=st.sampled_from([1, 2, 3, 4]))
def test_levels_shape_the_tasks(seed, level):
    cfg = BuildConfig()
    params = sample_params(random.Random(seed), level, "train", cfg)
    task = materialise(params, "train")
    depth = len(params["steps"])
    sizes = {len(t["input"][0]) if params["input"] != "text" else len(t["input"][0].split()) for t in task.tests}
    if level == 1:
        assert depth == 1 and len(sizes) == 1  # one fixed small size
    if level == 2:
        assert depth == 1
    if level >= 2:
        assert 0 in sizes and 1 in sizes  # empty and single-element edge cases among the hidden tests
    if level == 3:
        assert 2 <= depth <= 3
    if level == 4:
        assert 3 <= depth <= cfg.splits.train_max_depth
        assert len(task.visible_tests) == cfg.n_visible_vague
        assert "example" in task.description
    else:
        assert len(task.visible_tests) == cfg.n_visible
    assert len(task.hidden_tests) == cfg.n_hidden


def test_descriptions_vary_and_noise_is_applied():
    rng = random.Random(0)
    params = {"input": "list:int", "steps": sample_pipeline(rng, "list:int", 3)}
    texts = {describe(params, random.Random(s)) for s in range(40)}
    assert len(texts) >= 15
    noisy = describe(params, random.Random(1), noise=["irrelevant"])
    assert any(sentence in noisy for sentence in IRRELEVANT)
    assert _inject_error(["keep only the numbers greater than 3"], random.Random(0)) == [
        "keep only the numbers greater than 4"
    ]
    assert _inject_error(["sort in ascending order"], random.Random(0)) == ["sort in descending order"]
    vague = describe(params, random.Random(2), vague=True)
    assert "example" in vague and len(vague) < min(len(t) for t in texts) + 80


# ---- literal ranges (tasks.literals) ----------------------------------------------------------------------


def test_narrow_literals_draw_what_the_default_world_always_drew():
    """The digest of 200 draws made before `tasks.literals` existed: the default world's runs stay reproducible."""
    rng = random.Random("pinned")
    draws = [
        sample_params(rng, level, "train", BuildConfig(literals="narrow")) for level in (1, 2, 3, 4) for _ in range(50)
    ]
    digest = hashlib.sha256(json.dumps(draws, sort_keys=True).encode()).hexdigest()
    assert digest == "df2afed948902967f9dfbe3bffd6dcbd47c0c0d715e5adb15ad2758b6915bcf8"


STEP_TABLES = {"filter": (PREDICATES, "expr"), "map": (MAPS, "expr"), "sort": (KEYS, "key"), "top_k": (KEYS, "key")}


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32), level=st.sampled_from([1, 2, 3, 4]), literals=st.sampled_from(LITERALS))
def test_step_constants_come_from_their_literal_range(seed, level, literals):
    params = sample_params(random.Random(seed), level, "train", BuildConfig(literals=literals))
    etype = input_etype(params["input"])
    for step in params["steps"]:
        if step["kind"] in STEP_TABLES:
            table, name = STEP_TABLES[step["kind"]]
            choices = find(table, etype, step[name]).choices(literals)
            assert set(step["args"]) == set(choices)
            assert all(step["args"][k] in choices[k] for k in choices), step
        if step["kind"] in ("take", "top_k"):
            assert 1 <= step["k"] <= MAX_K[literals]
        if step["kind"] == "window":
            assert 2 <= step["w"] <= MAX_WINDOW[literals]
        etype, _ = output_type(step, etype)


def test_wide_literals_make_one_step_programs_repeat_less():
    """Distinct one-step programs in 3,000 level-1 draws (the tiny solver's solvable level)."""

    def programs(literals):
        rng, cfg = random.Random(0), BuildConfig(literals=literals)
        return {ast_hash(render_reference(sample_params(rng, 1, "train", cfg))) for _ in range(3000)}

    narrow, wide = programs("narrow"), programs("wide")
    assert len(wide) > 1.3 * len(narrow), (len(narrow), len(wide))  # 598 and 826 (20,000 draws: 721 and 1697)


def test_unknown_literal_range_is_refused():
    from generator.splits import SplitError

    with pytest.raises(SplitError, match="tasks.literals must be one of narrow, wide, got 'huge'"):
        BuildConfig(literals="huge")
