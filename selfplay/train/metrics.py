"""What one iteration measured, from its stages' results: the task source's observation (`iteration_stats`) and
the scalars it logs (`iteration_metrics`; tags: docs/architecture.md).

Both are pure functions: every figure that needs the other ranks (a mean over ranks, a gather) is measured by the
loop first and handed in, so the same inputs give the same figures on any rank.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from generator.rewards import diversity, in_band
from generator.schema import Task
from selfplay.runtime.errors import UserError
from selfplay.train.mixer import IterationStats, edit_drops, in_band_share
from selfplay.train.proposals import ProposalRound


@dataclass(frozen=True)
class SolverRound:
    """The solver batch of one iteration as every rank served it, and how it went."""

    batch: list[Task]  # the PPO tasks of every rank, in the order the task source listed them
    counts: dict[str, int]  # tasks per origin, in that order
    rates: dict[str, float]  # task id -> measured solve rate, every rank's tasks (generator extras too)
    reward_mean: float  # the mean reward of the PPO episodes over every rank
    reward_terms: dict[str, float] = field(default_factory=dict)  # each reward term's mean, likewise
    # solver task kind -> [PPO episodes, solved, reward sum] over every rank (`kind_tallies`; empty: the program
    # kind alone, mixer.kinds)
    kinds: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Costs:
    """What one iteration spent: seconds per stage, tokens, memory, sandbox runs, and the run's totals so far."""

    timing: dict[str, float]  # stage -> seconds, in the order the stages ran
    sampled_tokens: int  # tokens the solver's policy sampled on this rank
    update_tokens: int  # prompt and answer tokens of this rank's PPO episodes
    sandbox_runs: int  # programs the sandbox was asked to run on this rank ...
    cache_hits: int  # ... of which its cache answered
    sandbox_s: float  # seconds the sandbox spent executing
    gpu_peak_gb: float | None = None  # this iteration's peak GPU memory (None without CUDA)
    engine: dict[str, float] = field(default_factory=dict)  # the rollout engines' figures (engine_metrics)
    compute: dict[str, int] = field(default_factory=dict)  # the run's totals (`compute/` scalars)


def kind_tallies(rollouts: Iterable, kinds: Iterable[str]) -> dict[str, list[float]]:
    """Solver task kind -> [episodes, solved, reward sum] of `rollouts` (anything with .kind, .result.solved and
    .reward), every kind of `kinds` listed (zeros for one not asked), then any other kind met."""
    out = {kind: [0.0, 0.0, 0.0] for kind in kinds}
    for r in rollouts:
        tally = out.setdefault(r.kind, [0.0, 0.0, 0.0])
        tally[0] += 1
        tally[1] += float(r.result.solved)
        tally[2] += float(r.reward)
    return out


def kind_totals(parts: Iterable[dict[str, list[float]]]) -> dict[str, list[float]]:
    """The ranks' `kind_tallies` summed, kind by kind (in the order first met)."""
    out: dict[str, list[float]] = {}
    for part in parts:
        for kind, tally in part.items():
            total = out.setdefault(kind, [0.0] * len(tally))
            for i, x in enumerate(tally):
                total[i] += x
    return out


def iteration_stats(
    solve_rate: float,
    groups: list[list[Task]],
    proposals: ProposalRound,
    batch: list[Task],
    new_ids: set[str],
    rates: dict[str, float],
    *,
    kl: float | None,
    mutation: bool,
    kinds: Sequence[str] = (),
) -> IterationStats:
    """What the task source observes of an iteration: `solve_rate` (the solver batch's, over every rank), the
    proposals' validity, diversity and solve rates, each served task's solve rate, for mutation proposals
    (`mutation`) each instruction and whether it gave a valid task in band (the mixer's instruction draw), and with
    `kinds` (the kind each task of `batch` was asked in, Draw.kinds) each kind's tasks' solve rates."""
    outcomes = proposals.outcomes
    served = list({x.id: x for x in batch}.values())  # the solver batch's distinct tasks, with their rates
    return IterationStats(
        solve_rate=solve_rate,
        validity_rate=sum(o.valid for o in outcomes) / len(outcomes) if outcomes else None,
        diversity=diversity(outcomes),  # among the valid proposals: few valid ones is no repetition
        kl=kl,
        task_rates=[rates[x.id] for x in served if x.id in rates],
        procedural_rates=[rates[x.id] for x in served if x.id in new_ids and x.id in rates],
        generator_in_band=in_band_share([o.solve_rate for o in outcomes if o.valid and o.solve_rate is not None]),
        edit_drops=edit_drops(groups, proposals.valid, rates),
        instructions=(
            [(x.instruction, o.valid and in_band(o.solve_rate)) for x, o in zip(proposals.shared, outcomes)]
            if mutation
            else None
        ),
        proposal_rates={x.id: rates[x.id] for x in proposals.valid if x.id in rates},
        kind_rates=_kind_rates(batch, kinds, rates) if kinds else None,
    )


def _kind_rates(batch: list[Task], kinds: Sequence[str], rates: dict[str, float]) -> dict[str, list[float]]:
    """Kind -> the solve rate of each distinct task of the batch asked in it (first place counts)."""
    out: dict[str, list[float]] = {}
    seen: set[str] = set()
    for task, kind in zip(batch, kinds):
        if task.id in rates and task.id not in seen:
            seen.add(task.id)
            out.setdefault(kind, []).append(rates[task.id])
    return out


def iteration_metrics(
    updates: dict[str, float],
    stats: IterationStats,
    solver: SolverRound,
    proposals: ProposalRound | None,
    source: dict[str, float],
    costs: Costs,
) -> dict[str, float]:
    """One iteration's scalars, by tag, in the order they are logged: the PPO updates' figures (`updates`), the
    solver's batch, the generator's proposals (None where the mode makes none), the task source's figures
    (`source`), then time, throughput and spend. `stats` is what the task source observed."""
    metrics = dict(updates)
    metrics.update(solver_metrics(stats, solver))
    if proposals is not None:
        metrics.update(generator_metrics(stats, proposals, solver))
    metrics.update(source)
    for origin, count in solver.counts.items():
        metrics[f"solver/batch/{origin}"] = count
    metrics.update(cost_metrics(costs))
    return metrics


def solver_metrics(stats: IterationStats, solver: SolverRound) -> dict[str, float]:
    """Pass rate, the share of tasks in band (solved by some but not all of their samples: what PPO can learn
    from), overall and by where the tasks came from, and the mean reward and its terms."""
    in_band = in_band_share(stats.task_rates)
    out = {
        "solver/pass_rate": stats.solve_rate,
        "solver/in_band_rate": in_band if in_band is not None else float("nan"),
    }
    start = 0  # a draw lists its origins' tasks in the order of its counts
    for origin, count in solver.counts.items():
        part = in_band_share([solver.rates[x.id] for x in solver.batch[start : start + count] if x.id in solver.rates])
        start += count
        if part is not None:
            out[f"solver/in_band_rate/{origin}"] = part
    out["solver/reward_mean"] = solver.reward_mean
    out.update({f"solver/reward/{name}": value for name, value in solver.reward_terms.items()})
    out.update(kind_metrics(stats, solver))
    return out


def kind_metrics(stats: IterationStats, solver: SolverRound) -> dict[str, float]:
    """Per solver task kind (mixer.kinds; none for the program kind alone): its PPO episodes, their pass rate and
    mean reward, and the share of its tasks in band (NaN where the kind had none)."""
    nan, out = float("nan"), {}
    for kind, (episodes, solved, reward) in solver.kinds.items():
        out[f"solver/{kind}/episodes"] = episodes
        out[f"solver/{kind}/pass_rate"] = solved / episodes if episodes else nan
        out[f"solver/{kind}/reward_mean"] = reward / episodes if episodes else nan
        share = in_band_share((stats.kind_rates or {}).get(kind, []))
        out[f"solver/{kind}/in_band_rate"] = share if share is not None else nan
    return out


def generator_metrics(stats: IterationStats, proposals: ProposalRound, solver: SolverRound) -> dict[str, float]:
    """The proposals' reward, validity, parse, redraw, cut-off and closed rates, where the valid ones fell against
    the solver (in band, never or always solved), their diversity and why the others were rejected."""
    shared, outcomes, n = proposals.shared, proposals.outcomes, max(1, len(proposals.shared))
    out = {
        "generator/reward_mean": statistics.mean(proposals.rewards) if proposals.rewards else 0.0,
        "generator/validity_rate": stats.validity_rate if stats.validity_rate is not None else 0.0,
        "generator/parse_rate": sum(o.parsed for o in outcomes) / n,
        # answers struck by the novelty screen and drawn again, per proposal (generator.redraws)
        "generator/redrawn": sum(x.redrawn for x in shared) / n,
        # answers that reached their token limit before their end (agents.generator.max_new_tokens)
        "generator/cut_off_rate": sum(x.cut_off for x in shared) / n,
        "generator/closed_rate": sum(x.closed for x in shared) / n,
        # valid proposals solved by some but not all of the solver's samples
        "generator/in_band_rate": (stats.generator_in_band if stats.generator_in_band is not None else float("nan")),
        "solver/share/generator": solver.counts["generator"] / max(1, len(solver.batch)),
    }
    measured = [o.solve_rate for o in outcomes if o.valid and o.solve_rate is not None]
    out["generator/solve_rate_mean"] = statistics.mean(measured) if measured else float("nan")
    # where the valid proposals out of band fall: never solved (too hard) or solved by every sample (too easy)
    for name, end in (("never_solved_rate", 0.0), ("always_solved_rate", 1.0)):
        out[f"generator/{name}"] = sum(r == end for r in measured) / len(measured) if measured else float("nan")
    out["generator/diversity"] = stats.diversity if stats.diversity is not None else 0.0
    out["generator/valid_tasks"] = len(proposals.valid)
    for reason, count in Counter(x.rejection for x in shared if x.rejection).items():
        out[f"generator/rejected/{reason}"] = count
    return out


# the iteration's stages between two of the boundaries where a stop is answered (loop.STAGES), as `timing` names them
STOP_STAGES = ("generator_s", "plan_s", "rollout_s", "update_s")
SLURM_LATE_S = 60.0  # SLURM may send `--signal` this late (its docs: up to 60 s)


def stop_bound_s(timing: dict, checkpoint_s: float) -> float:
    """`time/stop_bound_s`: the longest a stop request waits for its checkpoint in this iteration, at worst, were
    it to come at the start of its longest stage: that stage, then the checkpoint's write (the last one measured)."""
    return max((timing.get(stage, 0.0) for stage in STOP_STAGES), default=0.0) + checkpoint_s


def lead_warning(bound_s: float, lead_s: float | None) -> str | None:
    """Where a stop's bound, with SLURM's lateness, passes the signal's lead (`SELFPLAY_SIGNAL_LEAD`, which
    slurm/selfplay.sh sets from its `--signal`): what to raise, else None."""
    if lead_s is None or bound_s + SLURM_LATE_S <= lead_s:
        return None
    return (
        f"a stop is answered up to {bound_s:.0f} s after its signal here (the longest stage of an iteration, then a "
        f"checkpoint; time/stop_bound_s), and SLURM may signal {SLURM_LATE_S:.0f} s late: more than the signal's "
        f"lead of {lead_s:.0f} s (SELFPLAY_SIGNAL_LEAD, from `#SBATCH --signal=B:USR1@{lead_s:.0f}` in "
        "slurm/selfplay.sh); raise both, or the job can end before its checkpoint (warned once)"
    )


def signal_lead_s(environ) -> float | None:
    """The signal's lead in seconds from `SELFPLAY_SIGNAL_LEAD` (None where unset: no SLURM signal to answer)."""
    value = environ.get("SELFPLAY_SIGNAL_LEAD", "").strip()
    try:
        return float(value) if value else None
    except ValueError:
        raise UserError(f"SELFPLAY_SIGNAL_LEAD={value!r}: the signal's lead in seconds, a number") from None


def cost_metrics(costs: Costs) -> dict[str, float]:
    """Throughput, peak memory, seconds per stage, the sandbox's rate and cache hits, and the run's spend."""
    out = {"perf/solver_gen_tokens_per_s": costs.sampled_tokens / max(1e-9, costs.timing.get("rollout_s", 0.0))}
    update_s = costs.timing.get("solver_update_s", 0.0)
    if update_s > 0:
        out["perf/solver_update_tokens_per_s"] = costs.update_tokens / update_s
    if costs.gpu_peak_gb is not None:
        out["perf/gpu_peak_mem_gb"] = costs.gpu_peak_gb
    out.update({f"time/{stage}": seconds for stage, seconds in costs.timing.items()})
    out["time/sandbox_s"] = costs.sandbox_s
    out.update(costs.engine)  # time/weight_sync_s, rollout/logprob_gap
    executed = costs.sandbox_runs - costs.cache_hits
    out["sandbox/execs_per_s"] = executed / costs.sandbox_s if costs.sandbox_s > 0 else 0.0
    out["sandbox/cache_hit_rate"] = costs.cache_hits / costs.sandbox_runs if costs.sandbox_runs else 0.0
    out.update({f"compute/{key}": float(value) for key, value in costs.compute.items()})
    return out
