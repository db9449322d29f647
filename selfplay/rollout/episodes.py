"""Rollouts: the solver's episodes on a batch of tasks, and the generator's proposals, as PPO-ready token data.

Solver: every task gets k episodes. All episodes of a turn are sampled in one batch; the answers are applied to
their episodes in parallel threads (the sandbox pool is thread-safe and each episode waits on its own runs).
Between turns the observation is appended to the response as tokens the policy did not choose (mask 0), so one
PPO sequence holds the whole multi-turn episode, with the scalar reward on its last token. A task may be asked in
another kind than "program" (solver/kinds.py: deduction, abduction, induction, `mixer.kinds`): its episodes are
then one turn of code_io's prompt, graded by code_io's verifiers, each kind within its own answer budget
(`mixer.kind_max_new_tokens`); a task that cannot be asked in its kind is asked as a program task.

Generator: P prompts, each with K reference tasks and an instruction; answers parsed into proposals; the valid
ones become tasks (outputs from the reference in the sandbox, every validity check run). The proposal format
(`generator.format`, an object of generator.formats) chooses the instructions, writes the prompts, parses the
answers and compiles them: "free" (the whole task in text, generator.agent) or "mutation" (one reference and one
edit of its program, compiled by the procedural families, generator.mutation); a parsed answer that names no
possible task (an edit that cannot be made) is an invalid proposal, rejected as "edit" with its reason. Under
`generator.constrained` a mutation answer is decoded under the grammar of its own prompt's references
(generator.grammars): only edits that compile; with `generator.redraws` an answer whose program or behaviour the
corpus already has is struck from its grammar and drawn again (`_sample_screened`). A constrained free answer is
drawn in two stages, so that its CODE defines the function its SIGNATURE names (`generator.tie_signature`,
`_sample_tied`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from generator.adequacy import AdequacySettings
from generator.agent import ProposalError
from generator.build import BuildConfig
from generator.formats import proposal_format
from generator.grammars import edits_grammar, free_head_grammar, free_tail_grammar
from generator.mutation import compile_mutation, parse_mutation, possible_edits
from generator.schema import Task
from generator.screen import Screen
from generator.validity import validate_many
from sandbox.incremental import IncrementalRunner
from selfplay.models.agent import Answer, LMAgent
from selfplay.runtime.distributed import gather_objects, is_distributed
from solver.episode import CodeEpisode, EpisodeResult
from solver.kinds import PROGRAM, KindEpisode, code_io_tasks, kind_prompt
from solver.prompts import task_prompt
from solver.rewards import RewardConfig


def prompt_options(cfg) -> dict:
    """task_prompt options from the `tasks:` config section."""
    return {"max_examples": cfg.tasks.prompt_examples, "max_chars": cfg.tasks.prompt_value_chars}


@dataclass
class SolverRollout:
    task: Task
    prompt: list[int]
    tokens: list[int]  # all answer turns and the observations between them
    mask: list[int]  # 1 where the policy chose the token
    text: str  # the answer text of every turn, joined
    result: EpisodeResult
    # the sampler's log-prob of each token (NaN at observations; ppo.tis_cap); None where a turn's sampler gave none
    logprobs: list[float] | None = None
    kind: str = PROGRAM  # how the task was asked (solver/kinds.py)

    @property
    def reward(self) -> float:
        return self.result.reward


TURN_ROOM = 16  # positions a multi-turn episode needs left for another answer; with fewer it is submitted


def solver_rollouts(
    agent: LMAgent,
    tasks: Sequence[Task],
    k: int,
    sb,
    *,
    max_turns: int = 1,
    reward_cfg: RewardConfig | None = None,
    greedy: bool = False,
    threads: int = 8,
    max_prompt_tokens: int | None = None,
    prompt_kw: dict | None = None,
    kinds: Sequence[str] | None = None,
    kind_max_new_tokens: dict[str, int] | None = None,
) -> list[SolverRollout]:
    """k episodes per task (task-major order: task 0's k episodes first). `prompt_kw` goes to
    solver.prompts.task_prompt (max_examples, max_chars). `kinds`: the kind each task is asked in (solver/kinds.py;
    tasks past its end, and all without it, are program tasks); `kind_max_new_tokens`: a kind's answer budget (a
    kind not named keeps the agent's)."""
    asked = [*(kinds or ()), *[PROGRAM] * max(0, len(tasks) - len(kinds or ()))][: len(tasks)]
    io = code_io_tasks(tasks, asked, sb) if any(kind != PROGRAM for kind in asked) else [None] * len(tasks)
    episodes: list[CodeEpisode | KindEpisode] = []
    prompts = []
    for task, io_task in zip(tasks, io):
        if io_task is not None:  # one turn of code_io's question
            prompt = agent.chat_ids(kind_prompt(io_task), max_prompt_tokens)
            episodes += [KindEpisode(task, io_task, sb, reward_cfg=reward_cfg) for _ in range(k)]
            prompts += [prompt] * k
            continue
        prompt = agent.chat_ids(task_prompt(task, multi_turn=max_turns > 1, **(prompt_kw or {})), max_prompt_tokens)
        for _ in range(k):
            runner = IncrementalRunner(sb) if max_turns > 1 else None
            episodes.append(CodeEpisode(task, sb, max_turns=max_turns, reward_cfg=reward_cfg, runner=runner))
            prompts.append(prompt)
    budgets = _kind_budgets(episodes, kind_max_new_tokens, agent.cfg.max_new_tokens)
    tokens = [[] for _ in episodes]
    masks = [[] for _ in episodes]
    texts = [[] for _ in episodes]
    logprobs: list[list[float] | None] = [[] for _ in episodes]
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        limit = agent.max_positions
        for _ in range(max_turns):
            if limit is not None:  # a context with no room for another answer ends the episode (submit)
                full = [
                    i
                    for i, ep in enumerate(episodes)
                    if not ep.done and len(prompts[i]) + len(tokens[i]) + TURN_ROOM > limit
                ]
                list(pool.map(lambda i: episodes[i].act("ACTION: submit"), full))
            active = [i for i, ep in enumerate(episodes) if not ep.done]
            if not _calls_in_step(agent, int(bool(active))):  # every rank done (a rank done early samples nothing)
                break
            if budgets is None:
                answers = agent.sample([prompts[i] + tokens[i] for i in active], greedy=greedy)
            else:
                answers = _sample_budgeted(
                    agent, [prompts[i] + tokens[i] for i in active], [budgets[i] for i in active], greedy
                )
            observations = list(pool.map(lambda pair: episodes[pair[0]].act(pair[1].text), zip(active, answers)))
            for i, answer, obs in zip(active, answers, observations):
                tokens[i] += answer.tokens
                masks[i] += [1] * len(answer.tokens)
                texts[i].append(answer.text)
                lp = logprobs[i]
                if lp is not None and answer.logprobs is not None and len(answer.logprobs) == len(answer.tokens):
                    lp += answer.logprobs
                else:
                    logprobs[i] = None
                if obs is not None:
                    obs_ids = agent.observation_ids(obs)
                    tokens[i] += obs_ids
                    masks[i] += [0] * len(obs_ids)
                    if logprobs[i] is not None:
                        logprobs[i] += [math.nan] * len(obs_ids)
    for i in range(len(episodes)):  # an observation after the last answer carries no action: drop it
        while masks[i] and masks[i][-1] == 0:
            masks[i].pop()
            tokens[i].pop()
            if logprobs[i] is not None:
                logprobs[i].pop()
    return [
        SolverRollout(
            ep.task, prompts[i], tokens[i], masks[i], "\n".join(texts[i]), ep.result, logprobs[i], _kind_of(ep)
        )
        for i, ep in enumerate(episodes)
    ]


def _kind_of(episode) -> str:
    return episode.kind if isinstance(episode, KindEpisode) else PROGRAM


def _kind_budgets(episodes, kind_max_new_tokens: dict[str, int] | None, default: int) -> list[int] | None:
    """Each episode's answer budget, or None when every episode keeps the agent's (`default`)."""
    if not kind_max_new_tokens:
        return None
    budgets = [int(kind_max_new_tokens.get(_kind_of(ep), default)) for ep in episodes]
    return None if all(b == default for b in budgets) else budgets


def _sample_budgeted(agent: LMAgent, prompts, budgets: Sequence[int], greedy: bool) -> list[Answer]:
    """One batch sampled to the largest budget, each answer then cut to its own (Answer.cut: finished only if it
    ended within it): each row's first tokens are drawn from the policy as under its own budget, so the cut answer is
    a sample under that budget, with the log-probs of its tokens."""
    answers = agent.sample(prompts, greedy=greedy, max_new_tokens=max(budgets, default=1))
    for answer, budget in zip(answers, budgets):
        if len(answer.tokens) > budget:
            answer.tokens, answer.finished, answer.allowed, answer.logprobs = answer.cut(budget)
            answer.text = agent.decode(answer.tokens)
    return answers


def solve_rates(rollouts: Sequence[SolverRollout]) -> dict[str, float]:
    """Task id -> share of its episodes that passed every hidden test (in the kind it was asked: for deduction and
    abduction the one question, for induction every held-back input)."""
    counts: dict[str, list[int]] = {}
    for r in rollouts:
        c = counts.setdefault(r.task.id, [0, 0])
        c[0] += r.result.solved
        c[1] += 1
    return {tid: s / n for tid, (s, n) in counts.items()}


@dataclass
class ProposalRollout:
    prompt: list[int]
    answer: Answer
    references: list[Task]
    instruction: str
    task: Task | None = None  # the proposal as a task (None when unparsable or, in the mutation format, impossible)
    parse_error: str | None = None
    valid: bool = False
    rejection: str | None = None  # first failed validity check, "edit" (an impossible mutation) or "unparsable"
    reasons: dict = field(default_factory=dict)
    redrawn: int = 0  # answers drawn before this one and struck by the novelty screen (generator.redraws)

    @property
    def parsed(self) -> bool:
        return self.parse_error is None


def _calls_in_step(agent: LMAgent, calls: int) -> int:
    """How many sampling calls this rank makes in a round where it has `calls` of its own. Under ZeRO-3 across
    ranks with an engine on the trainer's own model (`on_trainer_model`: rollout.engine=hf) every generation step
    gathers the partitioned weights from all ranks, so every rank makes as many calls as the rank with the most,
    calling `agent.sample([])` for those it has nothing for (which takes part in the other ranks' batches:
    HFEngine); elsewhere `calls`. Redraws, the tied free format and multi-turn episodes make data-dependent numbers
    of calls."""
    if not agent.engine.on_trainer_model or not agent.zero3 or not is_distributed():
        return calls
    return max(gather_objects(calls))


def _sample_screened(
    agent: LMAgent, constraint, prompts, references, corpus_index, redraws: int, build_cfg: BuildConfig, max_new_tokens
) -> tuple[list[Answer], list[int]]:
    """Mutation answers, each under its prompt's grammar (the edits that compile, generator.grammars); then, up to
    `redraws` times, every answer whose task the in-process novelty screen rejects (generator.screen.Screen: a
    program or behaviour the corpus or an earlier answer of the batch has) is struck from its prompt's grammar and
    that prompt sampled again. Each kept answer is a sample of the policy under the grammar it was drawn with,
    whose masks it carries, so PPO stays on-policy; the struck answers are not trained on. Returns the answers
    and how many were struck per prompt.

    With redraws the grammar leaves the corpus check to the screen, which judges one compiled answer instead of
    every possible edit (possible_edits with an index renders and hashes ~1,500 programs per reference)."""
    edits = [possible_edits(refs, build_cfg, None if redraws else corpus_index) for refs in references]
    struck: list[set] = [set() for _ in prompts]
    answers: list[Answer | None] = [None] * len(prompts)
    screen = Screen(corpus_index)
    pending = list(range(len(prompts)))

    def draw(attempt: int) -> list[int]:
        """Sample the pending prompts; strike what the screen rejects; the prompts to draw again."""
        agent.constraint = constraint.per_prompt([edits_grammar(edits[i], struck[i]) for i in pending])
        try:
            drawn = agent.sample([prompts[i] for i in pending], max_new_tokens=max_new_tokens)
        finally:
            agent.constraint = constraint
        again = []
        for i, answer in zip(pending, drawn):
            answers[i] = answer
            parsed = parse_mutation(answer.text)
            if attempt == redraws or isinstance(parsed, ProposalError):
                continue
            task = compile_mutation(parsed, references[i], cfg=build_cfg)
            if isinstance(task, Task) and screen.reject(task) is not None:
                struck[i].add((parsed.ref, answer.text.split("EDIT ", 1)[1].split("\n", 1)[0]))  # as the grammar has it
                if edits_grammar(edits[i], struck[i]) is not None:  # else keep it: nothing else is left to draw
                    again.append(i)
        return again

    for attempt in range(redraws + 1):
        if pending:
            pending = draw(attempt)
        else:  # done, while another rank draws again (_calls_in_step)
            agent.sample([])
        if not _calls_in_step(agent, int(bool(pending))):
            break
    return answers, [len(s) for s in struck]


def _rest_groups(lengths: Sequence[int], needs: Sequence[int], limit: int | None) -> list[list[int]]:
    """Rows grouped for batched sampling so that each row gets its own token budget (`needs`): a batch's room is
    the model's positions (`limit`) less its longest prompt (`lengths`), which must cover the batch's largest need.
    Longest prompts first, each row joins the last group if that still holds."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and (limit is None or limit - lengths[groups[-1][0]] >= max(needs[j] for j in [*groups[-1], i])):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _sample_tied(agent: LMAgent, constraint, prompts, max_new_tokens: int | None) -> list[Answer]:
    """Free answers under the free grammar, drawn in two stages so that CODE defines the function SIGNATURE names,
    with its parameters (`generator.tie_signature`; a context-free grammar cannot tie the two lines). Each answer
    is drawn up to the end of its SIGNATURE line (generator.grammars.free_head_grammar); then, from its prompt and
    those tokens, the rest under the grammar of that signature (`free_tail_grammar`), within what is left of the
    same token budget. The answer is the two parts joined, the first part's end-of-sequence token left out: every
    token was drawn from the policy under the mask it carries, given all the tokens before it, so the trainer
    scores the joined answer exactly as it was sampled. A first part the budget cut off is the whole answer."""
    budget = max_new_tokens or agent.cfg.max_new_tokens
    try:
        agent.constraint = constraint.per_prompt([free_head_grammar()] * len(prompts))
        heads = agent.sample(prompts, max_new_tokens=budget)
        answers = list(heads)
        go = [i for i, h in enumerate(heads) if h.finished and h.tokens and h.tokens[-1] in agent.eos_ids]
        firsts = {i: heads[i].cut(len(heads[i].tokens) - 1) for i in go}  # the end-of-sequence token left out
        lengths = [len(prompts[i]) + len(firsts[i][0]) for i in go]
        needs = [budget - len(firsts[i][0]) for i in go]
        groups = _rest_groups(lengths, needs, agent.max_positions)
        for _ in range(len(groups), _calls_in_step(agent, len(groups))):
            agent.sample([])
        for group in groups:
            rows = [go[g] for g in group]
            # the line after the first "\nSIGNATURE: " (a description has no newline; a parameter may hold the word)
            signatures = [heads[i].text.split("\nSIGNATURE: ", 1)[-1].strip() for i in rows]
            agent.constraint = constraint.per_prompt([free_tail_grammar(sig) for sig in signatures])
            rests = agent.sample(
                [list(prompts[i]) + firsts[i][0] for i in rows],
                max_new_tokens=max(needs[g] for g in group),
                budgets=[needs[g] for g in group],
            )
            for g, i, rest in zip(group, rows, rests):
                tokens, finished, allowed, logprobs = rest.cut(needs[g])
                first_tokens, _, first_allowed, first_logprobs = firsts[i]
                joined = first_tokens + tokens
                answers[i] = Answer(
                    list(prompts[i]),
                    joined,
                    agent.decode(joined),
                    finished,
                    None if allowed is None or first_allowed is None else torch.cat([first_allowed, allowed]),
                    None if logprobs is None or first_logprobs is None else list(first_logprobs) + list(logprobs),
                    closed=rest.closed + max(0, heads[i].closed - 1),
                )  # the first part's closing less its end
    finally:
        agent.constraint = constraint
    return answers


def generator_rollouts(
    agent: LMAgent,
    references: Sequence[Sequence[Task]],
    sb,
    *,
    step: int,
    rng: random.Random,
    corpus_index=None,
    n_visible: int = 3,
    checkpoint: str | None = None,
    max_prompt_tokens: int | None = None,
    max_new_tokens: int | None = None,
    fmt: str = "free",
    build_cfg: BuildConfig | None = None,
    redraws: int = 0,
    tie_signature: bool = True,
    instruction_weights: Callable[[list[str]], Sequence[float] | None] | None = None,
    adequacy: AdequacySettings | None = None,
) -> list[ProposalRollout]:
    """One proposal per reference group; parsed, turned into tasks, validated in one sandbox batch. A proposal is
    longer than a solution (description, code and inputs): `max_new_tokens` overrides the agent's default (capped
    by the format's `max_answer_tokens`). `fmt`: the name of a proposal format (generator.formats: it chooses the
    instructions, writes the prompts, parses and compiles; "mutation" builds its tasks with `build_cfg`, the
    `tasks:` section's). `redraws` (generator.redraws): under the mutation grammar, an
    answer the novelty screen rejects is struck from its prompt's grammar and drawn again, up to this many times
    (`_sample_screened`). `tie_signature` (generator.tie_signature): under the free grammar, each answer is drawn in
    two stages whose second makes CODE define SIGNATURE's function (`_sample_tied`). `instruction_weights(names)`:
    the instructions' draw weights among those a prompt's references allow, for a format with
    `weighted` (mutation: the mixer's `instruction_weights`; None: uniform). `adequacy` (generator.adequacy_*): the
    validity checks' optional `adequacy` check."""
    form = proposal_format(fmt)
    build_cfg = build_cfg or BuildConfig()
    instructions = [form.instruction(rng, refs, build_cfg, instruction_weights) for refs in references]
    texts = [form.prompt(refs, instr) for refs, instr in zip(references, instructions)]
    if form.max_answer_tokens is not None:
        max_new_tokens = min(max_new_tokens or form.max_answer_tokens, form.max_answer_tokens)
    prompts = [agent.chat_ids(text, max_prompt_tokens) for text in texts]
    constraint = getattr(agent, "constraint", None)
    redrawn = [0] * len(prompts)
    per_prompt = hasattr(constraint, "per_prompt")  # generator.constrained
    if per_prompt and form.sampling == "edits":  # each prompt's possible edits only
        answers, redrawn = _sample_screened(
            agent, constraint, prompts, references, corpus_index, redraws, build_cfg, max_new_tokens
        )
    elif per_prompt and form.sampling == "tied" and tie_signature:
        answers = _sample_tied(agent, constraint, prompts, max_new_tokens)
    else:
        answers = agent.sample(prompts, max_new_tokens=max_new_tokens)
    rollouts = []
    for prompt, answer, refs, instr, n in zip(prompts, answers, references, instructions, redrawn):
        ro = ProposalRollout(prompt, answer, list(refs), instr, redrawn=n)
        parsed = form.parse(answer.text)
        if isinstance(parsed, ProposalError):  # an answer the token limit cut off says so: no grammar can end it
            ro.rejection = "unparsable"
            ro.parse_error = (
                parsed.reason
                if answer.finished
                else f"cut off at {len(answer.tokens)} tokens before its end: {parsed.reason}"
            )
        else:
            task = form.compile(
                parsed, refs, step=step, n_visible=n_visible, build_cfg=build_cfg, checkpoint=checkpoint
            )
            if isinstance(task, Task):
                ro.task = task
            else:  # a parsed answer that names no possible task (an impossible edit)
                ro.rejection, ro.reasons = "edit", {"reason": task.reason}
        rollouts.append(ro)
    parsed = [ro for ro in rollouts if ro.task is not None]
    for ro, report in zip(parsed, validate_many([ro.task for ro in parsed], sb, corpus_index, adequacy=adequacy)):
        ro.task = report.task
        ro.valid = report.ok
        if not report.ok:
            ro.rejection = report.rejection
            ro.reasons = {"reason": report.reason}
    return rollouts
