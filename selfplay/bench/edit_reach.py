"""How far a warm-started solver reaches into the edits of its own training tasks: the in-band rate any mutation
generator could get with this solver, by instruction and by the reference's solve rate (lab/selfplay_measured.md,
"What the solver can reach").

R reference tasks of levels <= L are drawn from the run's procedural corpus and attempted by the solver
(`train.samples_per_task` attempts each, as the loop measures them). For every reference and every instruction of
the mutation format, one edit is drawn as the generator's warm start draws its targets (`random_mutation`), compiled
and validated against the corpus; the valid ones are attempted the same way. A task is in band when some but not all
of its attempts pass every hidden test. Prints one JSON summary; writes RUN_DIR/edit_reach.jsonl (one line per valid
edit, with the reference and the edit as tasks).

`--tasks-from FILE` attempts exactly the valid edits of an earlier run's edit_reach.jsonl, and their references
(those with a valid edit), instead of drawing them (another solver, another model: the tasks are the same whatever
the tokenizer), and adds to the summary the paired comparison with that run's solve rates: each solver's share in
band on those edits and the difference with a 95 % bootstrap interval over the edits, and both solvers' solve rates.

    python -m selfplay.bench.edit_reach configs/tiny.yaml runs/ws0 --refs 48 --max-level 2
    python -m selfplay.bench.edit_reach configs/smollm2.yaml runs/smol --tasks-from runs/ws0/edit_reach.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path

import torch

from generator.build import BuildConfig
from generator.families.grammar import program_of
from generator.mutation import INSTRUCTIONS, random_mutation
from generator.rewards import in_band
from generator.schema import Task
from generator.validity import validate_many
from selfplay.bench.generator_probe import reference_rates
from selfplay.eval.stats import bootstrap_ci95
from selfplay.runtime.config import load_config
from selfplay.train.loop import SelfPlay


def bucket(p: float) -> str:
    return "reference never solved" if p <= 0 else ("reference always solved" if p >= 1 else "reference in band")


def draw_edits(cfg, tasks, sb, corpus, n_refs: int, max_level: int, rng: random.Random) -> tuple[list, int, list]:
    """n_refs references of levels <= max_level and, for each with each instruction, one random edit: the
    references, the number of edits drawn, and the valid ones as (reference, instruction, task)."""
    pool = [t for t in tasks if t.level <= max_level and program_of(t) is not None]
    refs = rng.sample(pool, min(n_refs, len(pool)))
    build = BuildConfig.from_config(cfg.tasks)
    drawn = [
        (ref, name, found[1])
        for ref in refs
        for name in INSTRUCTIONS
        if name != "compose"
        for found in [random_mutation(rng, [ref], name, cfg=build)]
        if found is not None
    ]
    reports = validate_many([task for _, _, task in drawn], sb, corpus)
    return refs, len(drawn), [(ref, name, report.task) for (ref, name, _), report in zip(drawn, reports) if report.ok]


def edits_from(rows: list[dict]) -> tuple[list, list]:
    """The references (in first-seen order) and the valid edits of an earlier run's edit_reach.jsonl rows."""
    refs: dict[str, Task] = {}
    valid = []
    for r in rows:
        ref = refs.setdefault(r["reference"], Task.from_dict(r["reference_task"]))
        valid.append((ref, r["instruction"], Task.from_dict(r["edit"])))
    return list(refs.values()), valid


def paired(rows: list[dict], earlier: list[dict]) -> dict:
    """In-band shares of the same edits under this solver and the earlier run's, and their difference (this minus
    that) with a 95 % bootstrap interval over the edits; beside them both solvers' mean solve rates of the edits
    and of their references."""
    then = {r["task"]: r["solve_rate"] for r in earlier}
    now_in = [float(in_band(r["solve_rate"])) for r in rows]
    then_in = [float(in_band(then[r["task"]])) for r in rows]
    diff = [a - b for a, b in zip(now_in, then_in)]
    refs_now = {r["reference"]: r["reference_solve_rate"] for r in rows}
    refs_then = {r["reference"]: r["reference_solve_rate"] for r in earlier}

    def mean(xs) -> float:
        xs = list(xs)
        return round(sum(xs) / len(xs), 3)

    return {
        "edits": len(rows),
        "in_band": mean(now_in),
        "earlier_in_band": mean(then_in),
        "difference": mean(diff),
        "ci95": [round(x, 3) for x in bootstrap_ci95(diff)],
        "solve_rate": mean(r["solve_rate"] for r in rows),
        "earlier_solve_rate": mean(then[r["task"]] for r in rows),
        "references": len(refs_now),
        "reference_solve_rate": mean(refs_now.values()),
        "earlier_reference_solve_rate": mean(refs_then[k] for k in refs_now),
    }


def reach(
    cfg, solver, tasks, sb, corpus, n_refs: int, max_level: int, seed: str, earlier: list[dict] | None = None
) -> tuple[dict, list[dict]]:
    """Draw (or, given an earlier run's rows, take) the references and their valid edits and measure them."""
    attempts = cfg.train.samples_per_task

    def rates_of(xs):
        return reference_rates(cfg, solver, xs, sb) if xs else {}

    if earlier is None:
        refs, n_drawn, valid = draw_edits(cfg, tasks, sb, corpus, n_refs, max_level, random.Random(seed))
    else:
        refs, valid = edits_from(earlier)
        n_drawn, max_level = len(valid), max(ref.level for ref in refs)
    ref_rates = rates_of(refs)
    rates = rates_of([task for _, _, task in valid])
    rows = [
        {
            "reference": ref.id,
            "level": ref.level,
            "instruction": name,
            "task": task.id,
            "reference_solve_rate": ref_rates[ref.id],
            "solve_rate": rates[task.id],
            "reference_task": ref.to_dict(),
            "edit": task.to_dict(),
        }
        for ref, name, task in valid
    ]
    groups = defaultdict(list)
    for r in rows:
        for key in ("all", r["instruction"], bucket(r["reference_solve_rate"])):
            groups[key].append(r)
    ref_values = list(ref_rates.values())
    summary = {
        "references": len(refs),
        "max_level": max_level,
        "attempts": attempts,
        "reference_solve_rate": sum(ref_values) / max(1, len(ref_values)),
        "references_in_band": sum(map(in_band, ref_values)) / max(1, len(ref_values)),
        "edits": n_drawn,
        "valid": len(valid),
        "in_band": {
            k: {
                "n": len(v),
                "in_band": round(sum(in_band(r["solve_rate"]) for r in v) / len(v), 3),
                "never_solved": round(sum(r["solve_rate"] <= 0 for r in v) / len(v), 3),
                "always_solved": round(sum(r["solve_rate"] >= 1 for r in v) / len(v), 3),
                "solve_rate": round(sum(r["solve_rate"] for r in v) / len(v), 3),
            }
            for k, v in sorted(groups.items())
        },
    }
    if earlier is not None and rows:
        summary["paired"] = paired(rows, earlier)
    return summary, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("run_dir", help="a finished warm start (or any run folder): its latest checkpoint's solver")
    ap.add_argument("--refs", type=int, default=48, help="reference tasks drawn from the procedural corpus")
    ap.add_argument("--max-level", type=int, default=2, help="the references' highest level")
    ap.add_argument(
        "--tasks-from",
        type=Path,
        default=None,
        help="an earlier run's edit_reach.jsonl: attempt its references and edits instead of drawing them",
    )
    ap.add_argument("overrides", nargs="*", help="key=value config overrides (e.g. ppo.temperature=0.7)")
    args = ap.parse_intermixed_args()
    run = Path(args.run_dir)
    earlier = None
    if args.tasks_from is not None:
        if not args.tasks_from.is_file():
            ap.error(f"--tasks-from {args.tasks_from}: no such file")
        earlier = [json.loads(line) for line in args.tasks_from.read_text().splitlines() if line.strip()]
        if not earlier:
            ap.error(f"--tasks-from {args.tasks_from}: no edits in it")
        if any("reference_task" not in r or "edit" not in r for r in earlier):
            ap.error(f"--tasks-from {args.tasks_from}: rows without their tasks (written by an older edit_reach)")
    cfg = load_config(args.config, [f"run.dir={run}", *args.overrides])
    torch.manual_seed(cfg.run.seed)
    loop = SelfPlay(cfg)
    try:
        loop._load(loop.ckpt.latest_checkpoint())
        summary, rows = reach(
            cfg,
            loop.solver,
            loop.corpus.query(source="procedural"),
            loop.sb,
            loop.corpus,
            args.refs,
            args.max_level,
            f"reach:{cfg.run.seed}",
            earlier,
        )
    finally:
        loop.close()
    print(json.dumps(summary), flush=True)
    with (run / "edit_reach.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
