"""Solver task kinds in training (mixer.kinds): the mixer's draw of each task's kind, the refusals, the rollouts of
each kind with a real tiny model and sandbox, the per-kind scalars, and a default run left as it was."""

from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from generator.build import generate_tasks
from selfplay.models.agent import LMAgent
from selfplay.models.factory import ActorCritic, build_tiny_model, frozen_copy, train_tokenizer
from selfplay.rollout.episodes import solver_rollouts
from selfplay.runtime.config import PPOConfig, load_config
from selfplay.runtime.errors import UserError
from selfplay.runtime.tb import read_scalars
from selfplay.train.metrics import SolverRound, kind_metrics, kind_tallies, kind_totals
from selfplay.train.mixer import IterationStats, Mixer, MixerConfig
from selfplay.train.setup import validate_config
from solver.kinds import KINDS
from solver.prompts import conversation
from tests.conftest import SMOKE, copy_run, selfplay

weights = st.dictionaries(st.sampled_from(KINDS), st.floats(0.05, 10.0), min_size=1)


# ------------------------------------------------------------------------------------------- the mixer's draw
@settings(max_examples=60, deadline=None)
@given(w=weights, n=st.integers(1, 12), steps=st.integers(1, 12), seed=st.integers(0, 3))
def test_the_kinds_shares_follow_their_weights(w, n, steps, seed):
    """Over any number of batches each kind's count stays within one task of its share of all the tasks drawn (the
    rounding carried from batch to batch), every batch has n kinds, and only the configured kinds are drawn."""
    mixer = Mixer(MixerConfig(kinds=w), seed=seed)
    total = sum(w.values())
    counts: Counter = Counter()
    for step in range(1, steps + 1):
        drawn = mixer.draw_kinds(n, step)
        assert len(drawn) == n and set(drawn) <= set(w)
        counts.update(drawn)
        for kind, weight in w.items():
            assert abs(counts[kind] - weight / total * n * step) < 1.0 + 1e-9


def test_the_draw_is_a_function_of_the_seed_the_step_and_the_mixers_state():
    mixer = Mixer(MixerConfig(kinds={"deduction": 1.0, "induction": 1.0, "program": 2.0}), seed=5)
    twin = copy.deepcopy(mixer)
    assert [mixer.draw_kinds(8, s) for s in range(1, 6)] == [twin.draw_kinds(8, s) for s in range(1, 6)]
    resumed = Mixer(MixerConfig(kinds={"deduction": 1.0, "induction": 1.0, "program": 2.0}), seed=5)
    resumed.load_state_dict(mixer.state_dict())
    assert resumed.draw_kinds(8, 6) == mixer.draw_kinds(8, 6)
    # places shuffled: over batches, a kind is not always at the same places (the batch lists origins in order)
    places = {i for s in range(1, 20) for i, k in enumerate(mixer.draw_kinds(8, s)) if k == "deduction"}
    assert len(places) > 2


def test_the_default_is_the_program_kind_alone_with_nothing_drawn():
    mixer = Mixer(MixerConfig(), seed=0)
    state, rng = mixer.state_dict(), mixer.rng.getstate()
    assert mixer.draw_kinds(7, 1) == ["program"] * 7 and not mixer.asks_kinds
    assert mixer.state_dict() == state and mixer.rng.getstate() == rng
    assert not [k for k in mixer.metrics() if k.startswith("mixer/kind/")]
    mixer.observe(IterationStats(solve_rate=0.5, kind_rates={"program": [0.5, 1.0]}))
    assert mixer.state_dict()["state"]["kind_learnability"] == {} == mixer.state_dict()["state"]["kind_carry"]
    assert load_config(None).mixer.kinds == {}  # an empty dict: no kind a merged override could not take out


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("mixer.kinds={deduction: 0}", "mixer.kinds: weights must be positive"),
        ("mixer.kinds={program: 1, abduction: -2}", "mixer.kinds: weights must be positive"),
        ("mixer.kinds={poetry: 1}", "mixer.kinds: unknown kind(s) poetry; use program, deduction, abduction"),
        ("mixer.kind_max_new_tokens={essay: 10}", "mixer.kind_max_new_tokens: unknown kind(s) essay"),
        ("mixer.kind_max_new_tokens={deduction: 0}", "mixer.kind_max_new_tokens: budgets must be whole tokens"),
        ("mixer.kind_explore=0", "mixer.kind_explore must be in"),
    ],
)
def test_bad_kinds_are_refused_naming_the_key(override, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")) as refused:
        validate_config(load_config(None, [override]))
    assert "\n" not in str(refused.value)


@pytest.mark.slow  # a subprocess that imports torch: over 9 s on 2 cores
def test_the_command_line_refuses_an_unknown_kind_in_one_line(tmp_path):
    proc = selfplay("train", "configs/smoke.yaml", f"run.dir={tmp_path}/r", "mixer.kinds={haiku: 1}", check=False)
    assert proc.returncode == 2 and not (tmp_path / "r").exists()
    assert proc.stderr.strip().splitlines() == [
        "selfplay train: error: mixer.kinds: unknown kind(s) haiku; use program, deduction, abduction, induction"
    ]


def test_learnability_is_measured_per_kind_and_followed_when_asked():
    kinds = {"program": 1.0, "deduction": 1.0}
    stats = IterationStats(solve_rate=0.5, kind_rates={"program": [0.0, 1.0, 1.0], "deduction": [0.5, 0.25]})
    fixed, follow = Mixer(MixerConfig(kinds=kinds)), Mixer(MixerConfig(kinds=kinds, kind_follow=True))
    for mixer in (fixed, follow):
        assert mixer.kind_learnability("deduction") == 0.5  # until measured
        mixer.observe(stats)
        assert mixer.kind_learnability("deduction") == 1.0 and mixer.kind_learnability("program") == 0.0
    assert fixed.kind_shares() == {"program": 0.5, "deduction": 0.5}  # the weights' fixed shares
    # weight x learnability, with kind_explore (0.25) of the weights: a kind never in band keeps 0.125
    assert follow.kind_shares() == pytest.approx({"program": 0.125, "deduction": 0.875})
    metrics = follow.metrics()
    assert metrics["mixer/kind/deduction/learnability"] == 1.0 and metrics["mixer/kind/program/share"] == 0.125
    watched = Mixer(MixerConfig(kinds=kinds))  # the modes without a generator measure it too
    watched.watch(stats)
    assert watched.kind_learnability("deduction") == 1.0 and "mixer/kind/deduction/share" in watched.watch_metrics()


# ------------------------------------------------------------------------------------------------ the scalars
class _Result:
    def __init__(self, solved: bool):
        self.solved = solved


class _Rollout:
    def __init__(self, kind: str, solved: bool, reward: float):
        self.kind, self.result, self.reward = kind, _Result(solved), reward


def test_per_kind_scalars_from_every_ranks_tallies():
    rank0 = kind_tallies([_Rollout("deduction", True, 1.0), _Rollout("program", False, 0.5)], ["program", "deduction"])
    rank1 = kind_tallies([_Rollout("deduction", False, 0.0)], ["program", "deduction", "induction"])
    totals = kind_totals([rank0, rank1])
    assert totals == {"program": [1, 0, 0.5], "deduction": [2, 1, 1.0], "induction": [0, 0, 0]}
    stats = IterationStats(solve_rate=0.5, kind_rates={"deduction": [0.5, 1.0]})
    out = kind_metrics(stats, SolverRound([], {}, {}, 0.5, {}, totals))
    assert out["solver/deduction/episodes"] == 2 and out["solver/deduction/pass_rate"] == 0.5
    assert out["solver/deduction/reward_mean"] == 0.5 and out["solver/deduction/in_band_rate"] == 0.5
    assert out["solver/program/pass_rate"] == 0.0 and math.isnan(out["solver/induction/pass_rate"])
    assert kind_metrics(stats, SolverRound([], {}, {}, 0.5)) == {}  # the program kind alone: no scalar


# ----------------------------------------------------------------------------------------------- the rollouts
@pytest.fixture(scope="module")
def tiny(task_sb):
    tasks = generate_tasks(2, level=1, seed=0, sb=task_sb)
    tok = train_tokenizer([conversation(t)[0]["content"] for t in tasks] * 4, vocab_size=300, kind="bpe")
    torch.manual_seed(0)
    policy = build_tiny_model(tok, arch="llama", n_layer=1, n_embd=32, n_head=2, max_positions=1024)
    return tasks, tok, policy


def agent_of(tiny, seed: int = 0) -> LMAgent:
    _, tok, policy = tiny
    return LMAgent("solver", ActorCritic(policy), frozen_copy(policy), tok, PPOConfig(max_new_tokens=12), seed=seed)


@pytest.mark.slow  # the first tiny model imports transformers: over 9 s
@pytest.mark.usefixtures("one_thread")
def test_the_default_runs_episodes_are_unchanged(tiny, task_sb):
    """The default mixer's kinds (all program, no budgets) give the very episodes of a rollout that names none."""
    tasks = tiny[0]
    torch.manual_seed(1)
    plain = solver_rollouts(agent_of(tiny), tasks, 2, task_sb)
    drawn = Mixer(MixerConfig(), seed=0).draw_kinds(len(tasks), 1)
    torch.manual_seed(1)
    default = solver_rollouts(agent_of(tiny), tasks, 2, task_sb, kinds=drawn, kind_max_new_tokens={})
    assert [(r.tokens, r.logprobs, r.text, r.reward, r.kind) for r in plain] == [
        (r.tokens, r.logprobs, r.text, r.reward, r.kind) for r in default
    ]
    assert {r.kind for r in plain} == {"program"}


@pytest.mark.slow  # the first tiny model imports transformers: over 9 s
@pytest.mark.usefixtures("one_thread")
def test_rollouts_of_each_kind_within_its_budget(tiny, task_sb):
    tasks = tiny[0] * 2
    kinds = ["deduction", "abduction", "induction", "program"]
    rollouts = solver_rollouts(
        agent_of(tiny), tasks, 2, task_sb, kinds=kinds, kind_max_new_tokens={"deduction": 3, "abduction": 5}
    )
    assert [r.kind for r in rollouts] == [k for k in kinds for _ in range(2)]
    for r in rollouts:
        assert len(r.tokens) <= {"deduction": 3, "abduction": 5}.get(r.kind, 12) and all(r.mask)
        assert r.logprobs is not None and len(r.logprobs) == len(r.tokens)
        assert r.result.hidden_total >= 1 and r.reward in (0.0, 1.0) or r.kind in ("program", "induction")
    prompt_of = {r.kind: r.prompt for r in rollouts}
    assert prompt_of["deduction"] != prompt_of["abduction"] != prompt_of["program"]
    assert rollouts[0].prompt == rollouts[1].prompt  # the k samples of a task share its question


# ------------------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_train_with_all_four_kinds_writes_the_per_kind_scalars(warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)
    selfplay(
        "train",
        *SMOKE,
        f"run.dir={run}",
        "train.steps=2",
        "train.checkpoint_every=2",
        "mixer.kinds={program: 1, deduction: 1, abduction: 1, induction: 1}",
        "mixer.kind_max_new_tokens={deduction: 32, abduction: 32}",
    )
    tags = read_scalars(run)
    for kind in KINDS:
        for name in ("pass_rate", "episodes", "reward_mean", "in_band_rate"):
            assert f"solver/{kind}/{name}" in tags, (kind, name)
        assert f"mixer/kind/{kind}/share" in tags and f"mixer/kind/{kind}/learnability" in tags
    # 4 tasks x 2 samples an iteration, one task of each kind (a kind's episodes may fall back to program)
    episodes = sum(tags[f"solver/{kind}/episodes"][-1][1] for kind in KINDS)
    assert episodes == 8
