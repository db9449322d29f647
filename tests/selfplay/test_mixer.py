"""The adaptive difficulty mixer, tested on simulated solvers and generators (CPU, pure Python, fast)."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings, strategies as st

from selfplay.mixer import IterationStats, Mixer, MixerConfig, largest_remainder


class SimSolver:
    """A solver of skill s solves a level-L task with probability sigmoid(3 (s - L)); training on level L
    raises its skill by `speed * p (1 - p)` — it learns most at its frontier, nothing on tasks it always or
    never solves."""

    def __init__(self, skill: float, speed: float, rng: random.Random):
        self.skill, self.speed, self.rng = skill, speed, rng

    def p(self, level: float) -> float:
        return 1.0 / (1.0 + math.exp(-3.0 * (self.skill - level)))

    def train_batch(self, levels: list[int]) -> float:
        solved = [self.rng.random() < self.p(L) for L in levels]
        for L in levels:
            p = self.p(L)
            self.skill += self.speed * p * (1 - p) / len(levels)
        return sum(solved) / len(levels)


def run_curriculum(mixer: Mixer, solver: SimSolver, iters: int, batch: int = 32):
    true_rates, levels = [], []
    for _ in range(iters):
        plan = mixer.plan(batch, available={"generator": 0, "replay": 0})
        rate = solver.train_batch(plan.levels)
        mixer.observe(IterationStats(solve_rate=rate))
        true_rates.append(sum(solver.p(L) for L in plan.levels) / len(plan.levels))
        levels.append(mixer.level)
    return true_rates, levels


@settings(max_examples=40, deadline=None)
@given(skill=st.floats(1.0, 4.0), speed=st.floats(0.0, 0.05), seed=st.integers(0, 10_000))
def test_keeps_a_solver_in_band(skill, speed, seed):
    """Whatever the solver's skill (inside the curriculum's range) and learning speed, after a burn-in the
    solve rate of what the mixer serves stays near the band most of the time."""
    mixer = Mixer(MixerConfig(), seed=seed)
    solver = SimSolver(skill, speed, random.Random(seed))
    rates, _ = run_curriculum(mixer, solver, iters=150)
    if solver.skill > mixer.cfg.level_max + 0.5:
        return  # the solver outgrew the curriculum: nothing harder to serve (tested separately)
    late = rates[40:]
    in_band = [0.25 <= r <= 0.97 for r in late]
    assert sum(in_band) / len(late) >= 0.8, (sum(in_band) / len(late), late[-10:])


def test_a_learning_solver_climbs_the_levels():
    mixer = Mixer(MixerConfig(), seed=0)
    solver = SimSolver(skill=1.0, speed=0.3, rng=random.Random(0))
    _, levels = run_curriculum(mixer, solver, iters=300)
    assert levels[0] <= 1.25
    assert levels[-1] >= 3.5 and solver.skill > 3.5


def test_a_forgetting_solver_brings_the_level_down():
    mixer = Mixer(MixerConfig(level_start=4.0), seed=1)
    solver = SimSolver(skill=1.2, speed=0.0, rng=random.Random(1))
    _, levels = run_curriculum(mixer, solver, iters=60)
    assert levels[-1] <= 2.0


def test_recovers_from_a_collapsed_generator():
    """A generator whose proposals stop passing validity loses its share to procedural tasks; once valid
    proposals come back, its share returns towards the base."""
    cfg = MixerConfig()
    mixer = Mixer(cfg, seed=0)
    base = mixer.shares["generator"]
    for _ in range(5):
        mixer.observe(IterationStats(solve_rate=0.6, validity_rate=0.8, diversity=0.9))
    assert mixer.shares["generator"] == pytest.approx(base)
    for _ in range(15):
        mixer.observe(IterationStats(solve_rate=0.6, validity_rate=0.0, diversity=0.9))
    assert mixer.metrics()["mixer/alarm/generator_validity"] == 1.0
    assert mixer.shares["generator"] == pytest.approx(cfg.min_share_generator)
    assert mixer.shares["procedural"] > 0.7
    for _ in range(60):
        mixer.observe(IterationStats(solve_rate=0.6, validity_rate=0.9, diversity=0.9))
    assert mixer.metrics()["mixer/alarm/generator_validity"] == 0.0
    assert mixer.shares["generator"] == pytest.approx(base, abs=0.02)


def test_diversity_collapse_raises_the_repetition_penalty_then_relaxes():
    mixer = Mixer(MixerConfig(), seed=0)
    for _ in range(10):
        mixer.observe(IterationStats(solve_rate=0.6, validity_rate=0.9, diversity=0.05))
    assert mixer.repetition_weight == pytest.approx(mixer.cfg.repetition_weight_max)
    for _ in range(80):
        mixer.observe(IterationStats(solve_rate=0.6, validity_rate=0.9, diversity=0.9))
    assert mixer.repetition_weight == pytest.approx(mixer.cfg.repetition_weight, abs=0.01)


def test_solver_collapse_and_kl_blowup_lower_the_learning_rate_and_raise_replay():
    mixer = Mixer(MixerConfig(), seed=0)
    for _ in range(10):
        mixer.observe(IterationStats(solve_rate=0.85))
    for _ in range(6):
        mixer.observe(IterationStats(solve_rate=0.05))
    assert mixer.metrics()["mixer/alarm/solver_collapse"] == 1.0
    assert mixer.lr_scale < 0.2
    assert mixer.shares["replay"] > mixer.base_shares["replay"]
    mixer2 = Mixer(MixerConfig(), seed=0)
    mixer2.observe(IterationStats(solve_rate=0.6, kl=5.0))
    assert mixer2.lr_scale == pytest.approx(0.5)


@given(st.dictionaries(st.sampled_from(["generator", "procedural", "replay"]), st.floats(0, 1), min_size=3),
       st.integers(0, 500))
def test_largest_remainder_sums_to_n(raw, n):
    total = sum(raw.values())
    if total == 0:
        return
    shares = {k: v / total for k, v in raw.items()}
    counts = largest_remainder(shares, n)
    assert sum(counts.values()) == n
    for k in shares:
        assert abs(counts[k] - shares[k] * n) < 1.0 + 1e-9


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.one_of(st.none(), st.floats(0, 1)),
                          st.one_of(st.none(), st.floats(0, 1)), st.one_of(st.none(), st.floats(0, 10))),
                max_size=40),
       st.integers(1, 64), st.integers(0, 20), st.integers(0, 20))
def test_plans_are_always_well_formed(history, batch, n_gen, n_replay):
    mixer = Mixer(MixerConfig(), seed=0)
    for solve, validity, diversity, kl in history:
        mixer.observe(IterationStats(solve, validity, diversity, kl))
        shares = mixer.shares
        assert sum(shares.values()) == pytest.approx(1.0)
        assert all(v >= 0 for v in shares.values())
        assert mixer.cfg.level_min <= mixer.level <= mixer.cfg.level_max
        assert mixer.cfg.lr_scale_min <= mixer.lr_scale <= 1.0 + 1e-12
    plan = mixer.plan(batch, available={"generator": n_gen, "replay": n_replay})
    assert sum(plan.counts.values()) == batch
    assert plan.counts["generator"] <= n_gen and plan.counts["replay"] <= n_replay
    assert len(plan.levels) == plan.counts["procedural"]
    assert all(1 <= L <= 4 for L in plan.levels)


def test_replay_prefers_the_learnability_band():
    mixer = Mixer(MixerConfig(target_low=0.4, target_high=0.8), seed=0)
    w_easy, w_mid, w_hard = mixer.replay_weights([0.0, 0.4, 1.0])  # solve rates 1.0, 0.6, 0.0
    assert w_mid > w_easy and w_mid > w_hard and min(w_easy, w_hard) > 0
    ids = [f"t{i}" for i in range(200)]
    diffs = [0.4 if i < 20 else 0.0 for i in range(200)]  # 20 tasks in band, 180 always solved
    picked = mixer.choose_replay(ids, diffs, 20)
    assert len(set(picked)) == 20
    assert sum(int(t[1:]) < 20 for t in picked) >= 10  # 10 % of the pool, at least half the picks


def test_state_round_trips_through_json():
    mixer = Mixer(MixerConfig(), seed=3)
    for r in (0.95, 0.95, 0.2, 0.6):
        mixer.observe(IterationStats(solve_rate=r, validity_rate=0.1, diversity=0.1, kl=0.1))
    state = json.loads(json.dumps(mixer.state_dict()))
    clone = Mixer(MixerConfig(), seed=99)
    clone.load_state_dict(state)
    assert clone.metrics() == mixer.metrics()
    assert clone.plan(16).levels == mixer.plan(16).levels


def test_bad_band_is_rejected():
    with pytest.raises(ValueError, match="target_low"):
        Mixer(MixerConfig(target_low=0.9, target_high=0.5))
