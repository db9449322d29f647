"""A third learnability for the generator's reward, the worked example of docs/extending.md "A reward":
`generator.reward.learnability=uncertainty` rewards a valid proposal that the solver solves at rate p with R-Zero's
uncertainty reward, 1 - 2 |p - 1/2|: 1 when the solver succeeds half the time, falling linearly to 0 at p = 0 and
p = 1 (where every learnability is 0). The repetition penalty and the floor above invalid proposals apply as to the
built-in ones (generator/rewards.py). Importing this module registers it; tests/generator/test_reward_example.py
runs it."""

from __future__ import annotations

from generator.rewards import register_learnability


@register_learnability("uncertainty")
def uncertainty(p: float) -> float:
    """R-Zero's uncertainty reward: 1 at p = 1/2, 0 at p in {0, 1}, linear in between."""
    return 1.0 - 2.0 * abs(p - 0.5)
