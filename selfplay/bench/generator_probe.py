"""The warm-started generator's proposals against its SFT steps: parse, validity and in-band rates, and every
rejection with its reason (lab/generator_measured.md, "Measurement: the prompt grammar against SFT steps").

One warm start as `selfplay warmstart` runs it (held-out tasks reserved, the procedural corpus, the generator's
SFT pairs, the tokenizer and tiny models), then the generator's SFT with a probe after each of `--at` steps: N
proposals sampled as training samples them (K random references, an instruction they allow, the configured
temperature), parsed, compiled and validated against the corpus. With `--solver-steps S` the solver is fine-tuned
for S steps first, and each valid proposal is attempted `train.samples_per_task` times: in band when some but not
all attempts pass (0 < p < 1). Writes RUN_DIR/probe.jsonl (one summary per point) and RUN_DIR/probe_<steps>.jsonl
(one line per proposal: instruction, answer, rejection, reason). With `--load` it probes the agents of a finished
warm start in RUN_DIR instead (`selfplay warmstart`; its solver gives the in-band rate), e.g. with
`generator.constrained=true` to compare the same weights under the prompt grammar. With `--load` and
`--generator-from CKPT` the generator's weights come from another checkpoint (e.g. the warm start's step_0) and the
solver's from RUN_DIR's latest: two generators probed against one solver, on the same references, say whether the
trained one proposes more tasks that solver solves sometimes (in band) than its warm start would, apart from how
the solver moved while it trained.

    python -m selfplay.bench.generator_probe configs/tiny.yaml /tmp/probe_s0 --at 200,1000 \
        --n 128 --solver-steps 1000 run.seed=0
    python -m selfplay.bench.generator_probe configs/tiny.yaml RUN --load --references mixer --pool 200 --n 128 \
        --generator-from WARM/checkpoints/step_0
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections import Counter
from pathlib import Path

import torch

from generator.build import BuildConfig
from generator.formats import proposal_format
from selfplay.eval.evaluate import heldout_tasks
from selfplay.models.factory import frozen_copy
from selfplay.rl.sft import sft
from selfplay.rollout.episodes import prompt_options, solve_rates, solver_rollouts
from selfplay.runtime.checkpoint import preserved_rng
from selfplay.runtime.config import load_config
from selfplay.runtime.distributed import param_checksum
from selfplay.train.loop import SelfPlay
from selfplay.train.mixer import Mixer
from selfplay.train.proposals import sample_proposals
from selfplay.train.warmstart import (
    build_agents,
    generator_examples,
    sft_settings,
    solver_examples,
    tokenize_pairs,
    warmstart_corpus,
)


def shape(reason: str) -> str:
    """A reason with its numbers and quoted values blanked, so that alike reasons count together."""
    reason = re.sub(r"task \S+", "task _", re.sub(r"'[^']*'", "'_'", reason))
    reason = re.sub(r"-?\d+(\.\d+)?", "N", reason)
    return reason.split(" (there:")[0].split(" must be one of")[0].split(" (same normalised")[0][:90]


def reference_rates(cfg, solver, pool, sb) -> dict[str, float]:
    """The solver's solve rate on each task of the reference pool (train.samples_per_task attempts each)."""
    attempts = solver_rollouts(
        solver,
        pool,
        cfg.train.samples_per_task,
        sb,
        max_prompt_tokens=cfg.warmstart.max_len,
        prompt_kw=prompt_options(cfg),
    )
    return solve_rates(attempts)


def mixer_groups(cfg, pool, rates: dict[str, float], n: int, seed: str) -> list[list]:
    """n reference groups as the loop's mixer would choose them from this pool, its state set from the measured
    rates as a run at this solver would have it: the procedural solve-rate EMA their mean, the band's centre the
    mean of the in-band ones (`mixer.reference_offset` standing for the edit drop, not yet measured)."""
    mixer = Mixer(cfg.mixer, seed=random.Random(seed).randrange(2**31))
    values = [rates[x.id] for x in pool]
    mixer.s.solve_ema = sum(values) / len(values)
    in_band = [p for p in values if 0 < p < 1]
    if in_band:
        mixer.s.band_centre = sum(in_band) / len(in_band)
    by_id = {x.id: x for x in pool}
    ids, difficulties = list(by_id), [1.0 - rates[i] for i in by_id]
    return [[by_id[i] for i in mixer.choose_references(ids, difficulties, cfg.train.references)] for _ in range(n)]


def probe(
    cfg, generator, solver, tasks, sb, corpus, n: int, rng_seed: str, *, references: str = "random", pool_size: int = 0
) -> tuple[dict, list[dict]]:
    t = cfg.train
    rng = random.Random(rng_seed)
    pool = proposal_format(cfg.generator.format).reference_pool(tasks)
    ref_rates: dict[str, float] = {}
    if pool_size:  # references from a pool whose solve rates the solver's attempts measured
        pool = rng.sample(pool, min(pool_size, len(pool)))
        ref_rates = reference_rates(cfg, solver, pool, sb)
    if references == "mixer":
        groups = mixer_groups(cfg, pool, ref_rates, n, rng_seed)
    else:
        groups = [rng.sample(pool, min(t.references, len(pool))) for _ in range(n)]
    rollouts = sample_proposals(cfg, generator, groups, sb, corpus, step=0, rng=rng)
    valid = [r for r in rollouts if r.valid]
    rates = {}
    if solver is not None and valid:
        attempts = solver_rollouts(
            solver,
            [r.task for r in valid],
            t.samples_per_task,
            sb,
            max_prompt_tokens=cfg.warmstart.max_len,
            prompt_kw=prompt_options(cfg),
        )
        rates = solve_rates(attempts)
    rows = []
    for r in rollouts:
        op = r.answer.text.split("EDIT ", 1)[1].split()[0] if "EDIT " in r.answer.text else ""
        rate = rates.get(r.task.id) if r.valid else None
        parents = (r.task.parent_ids if r.valid else None) or [x.id for x in r.references[:1]]
        rows.append(
            {
                "instruction": r.instruction,
                "op": op,
                "answer": r.answer.text,
                "valid": r.valid,
                "rejection": r.rejection,
                "reason": r.parse_error or r.reasons.get("reason", ""),
                "solve_rate": rate,
                "reference_solve_rate": ref_rates.get(parents[0]) if parents else None,
            }
        )
    count = max(1, len(rows))
    summary = {
        "n": len(rows),
        "parse_rate": sum(r.parsed for r in rollouts) / count,
        "validity_rate": len(valid) / count,
        "redrawn": sum(r.redrawn for r in rollouts) / count,
        "cut_off_rate": sum(not r.answer.finished for r in rollouts) / count,  # reached the token limit
        "closed_rate": sum(r.answer.closed > 0 for r in rollouts) / count,  # generator.close_reserve
        "rejected": {k: v / count for k, v in Counter(r["rejection"] for r in rows if not r["valid"]).items()},
        "by_op": {
            op: f"{sum(r['valid'] for r in rows if r['op'] == op)}/{c}"
            for op, c in Counter(r["op"] for r in rows).most_common()
        },
        "reasons": Counter(f"{r['rejection']}: {shape(r['reason'])}" for r in rows if not r["valid"]).most_common(12),
    }
    if rates:
        summary["in_band_rate"] = sum(0 < p < 1 for p in rates.values()) / len(rates)
        summary["solved_rate_of_valid"] = sum(rates.values()) / len(rates)
    if ref_rates:
        summary["reference_pool_solve_rate"] = sum(ref_rates.values()) / len(ref_rates)
        shown = [r["reference_solve_rate"] for r in rows if r["reference_solve_rate"] is not None]
        summary["reference_solve_rate"] = sum(shown) / max(1, len(shown))
        # in band (of valid) by the solve rate of the proposal's reference: never, sometimes, always solved
        buckets = {"never": lambda p: p <= 0, "sometimes": lambda p: 0 < p < 1, "always": lambda p: p >= 1}
        summary["in_band_by_reference"] = {
            name: f"{sum(0 < r['solve_rate'] < 1 for r in mine)}/{len(mine)}"
            for name, test in buckets.items()
            for mine in [
                [
                    r
                    for r in rows
                    if r["valid"]
                    and r["solve_rate"] is not None
                    and r["reference_solve_rate"] is not None
                    and test(r["reference_solve_rate"])
                ]
            ]
        }
        drops = [
            r["reference_solve_rate"] - r["solve_rate"]
            for r in rows
            if r["valid"] and r["solve_rate"] is not None and r["reference_solve_rate"] is not None
        ]
        if drops:
            summary["edit_drop"] = sum(drops) / len(drops)
    return summary, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("run_dir")
    ap.add_argument("--at", default="200,1000", help="SFT steps after which to probe (the last is the SFT length)")
    ap.add_argument("--n", type=int, default=128, help="proposals per probe")
    ap.add_argument("--solver-steps", type=int, default=0, help="solver SFT steps (0: no in-band rate)")
    ap.add_argument(
        "--load",
        action="store_true",
        help="probe the agents of RUN_DIR's latest checkpoint (step_0 after a warm start; its solver "
        "gives the in-band rate) instead of training",
    )
    ap.add_argument(
        "--references",
        choices=("random", "mixer"),
        default="random",
        help="how each prompt's references are chosen: at random, or as the loop's mixer chooses them "
        "(Mixer.choose_references) from solve rates measured on --pool tasks (with --load)",
    )
    ap.add_argument(
        "--pool",
        type=int,
        default=0,
        help="with --load: draw references from this many procedural tasks, each attempted by the "
        "solver first (their solve rates split the in-band rate by the reference's)",
    )
    ap.add_argument(
        "--generator-from",
        default=None,
        metavar="CKPT",
        help="with --load: the generator from this checkpoint folder (RUN/checkpoints/step_N), the solver "
        "from RUN_DIR's latest; the files written are tagged with the folder's name",
    )
    ap.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = ap.parse_intermixed_args()
    at = sorted({int(x) for x in args.at.split(",")})
    run = Path(args.run_dir)
    if args.generator_from and not args.load:
        ap.error("--generator-from goes with --load (the solver is RUN_DIR's latest)")
    if args.references == "mixer" and not (args.load and args.pool):
        ap.error("--references mixer needs --load and --pool N (the solve rates it chooses by)")
    cfg = load_config(args.config, [f"run.dir={run}", *args.overrides])
    torch.manual_seed(cfg.run.seed)
    loop = SelfPlay(cfg)
    tag = f"_gen_{Path(args.generator_from).name}" if args.generator_from else ""
    out = (run / (f"probe_loaded{tag}.jsonl" if args.load else "probe.jsonl")).open("w")
    try:
        if args.load:  # a finished warm start's or run's own agents and corpus
            loop._load(loop.ckpt.latest_checkpoint())
            generator = loop.generator
            if args.generator_from:  # that checkpoint's generator alone; the random states stay the run's
                with preserved_rng():
                    generator = loop._load_agent(Path(args.generator_from), "generator")
            if generator.tokenizer.get_vocab() != loop.generator.tokenizer.get_vocab():
                ap.error(f"--generator-from {args.generator_from}: its tokenizer is not RUN_DIR's")
            tasks = loop.corpus.query(source="procedural")
            summary, rows = probe(
                cfg,
                generator,
                loop.solver,
                tasks,
                loop.sb,
                loop.corpus,
                args.n,
                f"probe:{cfg.run.seed}",
                references=args.references,
                pool_size=args.pool,
            )
            summary = {
                "references": args.references,
                "pool": args.pool,
                "generator_from": args.generator_from or str(loop.ckpt.latest_checkpoint()),
                "generator_weights": param_checksum(generator.module.policy)["sha256"][:16],
                "solver_weights": param_checksum(loop.solver.module.policy)["sha256"][:16],
                **summary,
            }
            print(json.dumps(summary), flush=True)
            out.write(json.dumps(summary) + "\n")
            with (run / f"probe_loaded_rows{tag}.jsonl").open("w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            return
        heldout_tasks(loop.run_dir, cfg, loop.sb, loop.corpus)  # reserved first, as the warm start does
        tasks = warmstart_corpus(cfg, loop.sb, loop.corpus)
        build = BuildConfig.from_config(cfg.tasks)
        s_pairs = solver_examples(tasks, prompt_options(cfg))
        g_pairs = generator_examples(
            tasks, cfg.train.references, cfg.run.seed, cfg.generator.format, loop.sb, loop.corpus, build
        )
        solver, generator = build_agents(cfg, run, [x for pair in s_pairs + g_pairs for x in pair])
        if cfg.generator.constrained:
            generator.constrain(cfg.generator.format, cfg.generator.close_reserve)
        ws = cfg.warmstart
        trained_solver = None
        if args.solver_steps > 0:
            sft(
                solver.module.policy,
                tokenize_pairs(solver, s_pairs, ws.max_len),
                steps=args.solver_steps,
                pad_id=solver.tokenizer.pad_token_id,
                **sft_settings(cfg),
            )
            trained_solver = solver
        examples = tokenize_pairs(generator, g_pairs, ws.max_len)
        print(f"{len(tasks)} tasks, {len(g_pairs)} generator pairs ({len(examples)} fit)", flush=True)
        policy = generator.module.policy
        generator.reference = frozen_copy(policy)
        t0 = time.perf_counter()

        def on_step(i: int, loss: float) -> None:
            if i + 1 not in at:
                return
            policy.eval()
            constraint = generator.constraint
            for grammar in [True, False] if constraint is not None else [False]:  # the same weights without it
                generator.constraint = constraint if grammar else None
                with torch.random.fork_rng():  # the probe's sampling leaves the SFT's random state alone
                    summary, rows = probe(
                        cfg, generator, trained_solver, tasks, loop.sb, loop.corpus, args.n, f"probe:{cfg.run.seed}"
                    )
                summary = {
                    "seed": cfg.run.seed,
                    "sft_steps": i + 1,
                    "grammar": grammar,
                    "loss": loss,
                    "sft_s": time.perf_counter() - t0,
                    **summary,
                }
                print(json.dumps(summary), flush=True)
                out.write(json.dumps(summary) + "\n")
                out.flush()
                with (run / f"probe_{i + 1}{'_grammar' if grammar else ''}.jsonl").open("w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
            generator.constraint = constraint
            policy.train()

        sft(
            policy,
            examples,
            steps=at[-1],
            pad_id=generator.tokenizer.pad_token_id,
            on_step=on_step,
            **sft_settings(cfg),
        )
    finally:
        out.close()
        loop.close()


if __name__ == "__main__":
    main()
