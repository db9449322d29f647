"""The generator's stage of an iteration: the references of each proposal, the proposals (the generator's answers
or random edits), what every rank learns of every proposal, and their rewards once the solver has measured them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import NamedTuple

from generator.adequacy import AdequacySettings
from generator.build import BuildConfig
from generator.formats import proposal_format
from generator.mutation import random_proposal
from generator.rewards import ProposalOutcome, generator_rewards
from generator.schema import Task
from generator.validity import validate_many
from selfplay.models.agent import Answer, LMAgent
from selfplay.rollout.episodes import ProposalRollout, generator_rollouts
from selfplay.runtime import seeds
from selfplay.train.mixer import Mixer


class SharedProposal(NamedTuple):
    """What every rank learns about one proposal of any rank (gathered each iteration)."""

    task: dict | None  # the valid task (Task.to_dict), None when it failed a check
    rejection: str | None  # the first failed check, "edit" or "unparsable"
    parsed: bool
    cluster: str | None  # its near-duplicate key (the AST fingerprint)
    redrawn: int  # answers struck by the novelty screen before this one
    instruction: str  # the instruction its prompt gave
    cut_off: bool  # its answer reached the token limit before its end
    closed: bool  # its answer was closed under its grammar inside the token budget (generator.close_reserve)

    @classmethod
    def of(cls, p: ProposalRollout) -> SharedProposal:
        return cls(
            p.task.to_dict() if p.valid else None,
            p.rejection,
            p.parsed,
            (p.task.fingerprints or {}).get("ast") if p.task else None,
            p.redrawn,
            p.instruction,
            not p.answer.finished,
            p.answer.closed > 0,
        )


@dataclass(frozen=True)
class ProposalRound:
    """Every rank's proposals of one iteration, in rank order, with what the solver's attempts made of them."""

    shared: list[SharedProposal]
    outcomes: list[ProposalOutcome]  # one per proposal: parsed, valid, measured solve rate, cluster
    rewards: list[float]  # the generator's reward for each
    valid: list[Task]  # the valid ones as tasks


def choose_references(cfg, corpus, mixer: Mixer, step: int, n: int) -> list[list[Task]]:
    """K reference tasks for each of n proposals, chosen by the mixer (`Mixer.choose_references`): near the
    band's centre plus the solve rate an edit measurably takes away."""
    seed = seeds.derive(cfg.run.seed, "references", step)
    pool = corpus.query(split="train", order="random", limit=512, seed=seed)
    # and tasks the solver has been seen to solve, which a random draw from a large corpus would mostly miss
    pool += corpus.query(split="train", order="random", limit=256, seed=seed, max_difficulty=0.999)
    pool = proposal_format(cfg.generator.format).reference_pool(pool)  # mutation: with a program
    if not pool:
        raise RuntimeError("the corpus holds no training task to show the generator")
    by_id = {t.id: t for t in pool}
    ids, difficulties = list(by_id), [t.difficulty for t in by_id.values()]
    return [[by_id[i] for i in mixer.choose_references(ids, difficulties, cfg.train.references)] for _ in range(n)]


def prompt_budget(agent: LMAgent, max_len: int, max_new_tokens: int) -> int:
    """Longest prompt that leaves `max_new_tokens` of room in the model (and at most `max_len`)."""
    positions = agent.max_positions or (max_len + max_new_tokens)
    return max(16, min(max_len, positions - max_new_tokens))


def sample_proposals(
    cfg,
    generator: LMAgent,
    references: list[list[Task]],
    sb,
    corpus,
    *,
    step: int,
    rng: random.Random,
    checkpoint: str | None = None,
    instruction_weights=None,
) -> list[ProposalRollout]:
    """The generator's proposals for these reference groups as the config asks for them (`generator_rollouts`
    with the format, its redraws and signature tie, the `tasks:` section's build, the prompt budget, validity
    against `corpus`): the training loop's, the warm start's probe's and the probe bench's one call."""
    budget = generator.cfg.max_new_tokens  # agents.generator.max_new_tokens (or ppo's)
    return generator_rollouts(
        generator,
        references,
        sb,
        step=step,
        rng=rng,
        corpus_index=corpus,
        n_visible=cfg.tasks.n_visible,
        checkpoint=checkpoint,
        max_prompt_tokens=prompt_budget(generator, cfg.warmstart.max_len, budget),
        max_new_tokens=budget,
        fmt=cfg.generator.format,
        build_cfg=BuildConfig.from_config(cfg.tasks),
        redraws=cfg.generator.redraws,
        tie_signature=cfg.generator.tie_signature,
        instruction_weights=instruction_weights,
        adequacy=AdequacySettings.from_config(cfg.generator),
    )


def propose(
    cfg, generator: LMAgent, references: list[list[Task]], sb, corpus, mixer: Mixer, *, step: int, rank: int
) -> list[ProposalRollout]:
    """One proposal per reference group, parsed and validated in the sandbox: the generator's answer
    (generator.source=model) or a random edit of the same references (generator.source=random_edits)."""
    rng = seeds.stream(cfg.run.seed, step, rank)
    if cfg.generator.source == "model":
        return sample_proposals(
            cfg,
            generator,
            references,
            sb,
            corpus,
            step=step,
            rng=rng,
            checkpoint=f"step_{step - 1}",
            instruction_weights=mixer.instruction_weights,
        )
    return random_edit_rollouts(
        references,
        sb,
        step=step,
        rng=rng,
        corpus_index=corpus,
        build_cfg=BuildConfig.from_config(cfg.tasks),
        instruction_weights=mixer.instruction_weights,
        adequacy=AdequacySettings.from_config(cfg.generator),
    )


def random_edit_rollouts(
    references: list[list[Task]],
    sb,
    *,
    step: int,
    rng: random.Random,
    corpus_index=None,
    build_cfg=None,
    instruction_weights=None,
    adequacy: AdequacySettings | None = None,
) -> list[ProposalRollout]:
    """generator.source=random_edits: one proposal per reference group, a random edit of its references
    (`generator.mutation.random_proposal`, with the mixer's instruction weights) in place of the generator's answer,
    then the validity checks a generator's answer meets (`validate_many`, one sandbox batch). The answers hold the
    edit's text and no token: nothing was sampled, nothing is trained on."""
    rollouts = []
    for refs in references:
        instruction, text, task = random_proposal(
            rng, refs, cfg=build_cfg or BuildConfig(), weights=instruction_weights, step=step
        )
        ro = ProposalRollout([], Answer([], [], text, True), list(refs), instruction)
        if isinstance(task, Task):
            ro.task = task
        else:  # no edit found, or one that cannot be made (a held-out program): an impossible edit, as an answer's
            ro.rejection, ro.reasons = "edit", {"reason": task.reason}
        rollouts.append(ro)
    made = [ro for ro in rollouts if ro.task is not None]
    for ro, report in zip(made, validate_many([ro.task for ro in made], sb, corpus_index, adequacy=adequacy)):
        ro.task, ro.valid = report.task, report.ok
        if not report.ok:
            ro.rejection, ro.reasons = report.rejection, {"reason": report.reason}
    return rollouts


def reward_proposals(
    shared: list[SharedProposal], valid: list[Task], rates: dict[str, float], repetition_weight: float, reward_cfg
) -> ProposalRound:
    """The generator's reward for every rank's proposals (`generator.reward`): learnability of the valid ones at
    their measured solve rate, fixed penalties for the others, a repetition penalty of weight `repetition_weight`."""
    outcomes = [
        ProposalOutcome(
            parsed=x.parsed,
            valid=x.task is not None,
            solve_rate=rates.get(x.task["id"]) if x.task is not None else None,
            cluster=x.cluster,
            closed=x.closed,
        )
        for x in shared
    ]
    rewards = generator_rewards(outcomes, repetition_weight, reward_cfg.learnability, reward_cfg.closed_invalid)
    return ProposalRound(shared, outcomes, rewards, valid)
