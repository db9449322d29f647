"""`selfplay compare [CONFIG] [--seeds ...] [--arms ...] [--out DIR] [key=value ...]`: the research claim
(self-play vs warm start only vs a fixed curriculum, per seed and held-out split); see selfplay/eval/compare.py.
`selfplay compare --merge A/results.json B/results.json --out DIR` pools comparisons run apart (records may be
gzipped: `.json.gz`, as docs/data keeps them)."""

from __future__ import annotations

from pathlib import Path

from selfplay.cli.train import split_args


def configure(parser) -> None:
    parser.add_argument("config", nargs="?", default=None, help="YAML config (default configs/tiny.yaml)")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run, e.g. train.steps=30")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="run.seed of each repetition")
    parser.add_argument(
        "--arms",
        nargs="+",
        default=["warmstart", "curriculum", "selfplay"],
        help="what runs after each seed's warm start: warmstart (nothing), curriculum, uniform "
        "(procedural levels drawn uniformly), selfplay, selfplay_free (the free proposal format, "
        "from a warm start of its own), selfplay_code_io (the code_io proposal format, from a warm "
        "start of its own), selfplay_follow (instructions drawn by their measured "
        "yield), selfplay_frozen (the generator never learns), selfplay_random (random edits of "
        "the same references in place of the generator's answers), fixed (PPO on a fixed task "
        "set); default: warmstart curriculum selfplay",
    )
    parser.add_argument("--out", default="runs/compare", help="folder of all runs and the results")
    parser.add_argument(
        "--shared-warmstart",
        action="store_true",
        help="one warm start (with the first seed) for every seed: seeds vary only the RL phase",
    )
    parser.add_argument(
        "--from-iteration",
        type=int,
        default=10,
        help="the report's per-run means (validity, in-band shares, generator share, level, the "
        "longest collapse alarm) are over the iterations from this one on (default 10)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="only collect the finished runs in --out into results.json/.md and compare.png",
    )
    parser.add_argument(
        "--variant",
        nargs="+",
        action="append",
        default=[],
        metavar="WORD",
        help="NAME BASE KEY=VALUE...: an arm of your own, arm BASE with these overrides of its RL "
        "phase, from BASE's warm start; repeatable; it runs with the --arms (e.g. --variant "
        "curriculum_rloo curriculum ppo.advantage=rloo; it takes every word up to the next "
        "option, so put the config and overrides before it); give it again with --report-only",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at a time (default 1), each its own process: the warm starts first, then the RL "
        "runs; on a CPU machine about one per core (with run.torch_threads=1)",
    )
    parser.add_argument(
        "--split",
        default="test",
        help="the held-out split the runs are paired and compared on: test (default), or val to "
        "choose a setting without looking at the held-out splits (the runs must evaluate it: "
        "give the override eval.splits=[val], which draws the validation split)",
    )
    parser.add_argument(
        "--primary",
        metavar="METRIC",
        default=None,
        help="the comparison's primary metric (pass@1_greedy or pass@1), declared before the runs: "
        "written to OUT/plan.json with --split and --baseline by the first run, and held to "
        "afterwards; the report then opens with each arm against the baseline on it, the "
        "intervals corrected for the number of arms (Bonferroni). Without it every figure is "
        "reported as exploratory",
    )
    parser.add_argument(
        "--baseline",
        metavar="ARM",
        default=None,
        help="the arm the primary figures compare every other arm with (default: warmstart when it "
        "runs, else the first arm)",
    )
    parser.add_argument(
        "--allow-code-change",
        action="store_true",
        help="go on although this start runs other code than the comparison's first start "
        "(OUT/code.json; refused without it): the new version is recorded",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="RESULTS_JSON",
        default=None,
        help="pool the runs of several comparisons' results.json (e.g. seeds run on different "
        "machines) into one report in --out; runs nothing",
    )


def run(args) -> int:
    import gzip
    import json

    from selfplay.eval.compare import (
        PER_RUN_KEYS,
        PLAN_FILE,
        arm_specs,
        check_parity,
        collect,
        declare_plan,
        hold_code,
        merge,
        run_all,
        variant,
        write_report,
    )
    from selfplay.eval.evaluate import suite_splits
    from selfplay.runtime.checkpoint import code_version
    from selfplay.runtime.config import load_config
    from selfplay.runtime.errors import UserError

    out = Path(args.out)
    if args.merge:  # runs nothing, so reads no config
        if args.config or args.overrides:
            given = " ".join([args.config or ""] + list(args.overrides)).strip()
            raise UserError(f"--merge runs nothing and takes no config or overrides (given: {given})")
        paths = [Path(p) for p in args.merge]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise UserError(f"--merge: no such file {', '.join(missing)}")
        try:
            records = [
                json.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_text()) for p in paths
            ]
            results = merge(records, args.from_iteration, [str(p) for p in paths])
        except (ValueError, OSError) as e:  # json's decode errors too, and gzip's (a .gz that is not gzip)
            raise UserError(f"--merge: {e}") from None
        plans = {json.dumps(r.get("plan"), sort_keys=True) for r in records}
        if args.primary:
            raise UserError(
                "--merge: --primary is declared before a comparison's runs; the records carry their own "
                "plan (or none), which the merged report keeps when they all agree"
            )
        if len(plans) == 1 and records[0].get("plan"):
            results["plan"] = records[0]["plan"]
        write_report(results, out)
        return finish(results, out)
    config, overrides = split_args(args)
    variants = {}
    for words in args.variant:  # NAME BASE KEY=VALUE ...
        name, base, keys = words[0], (words[1] if len(words) > 1 else ""), words[2:]
        try:
            variants[name] = variant(name, base, keys)
        except ValueError as e:
            raise UserError(f"--variant: {e}") from None
    arms = list(args.arms) + [name for name in variants if name not in args.arms]
    specs = arm_specs(variants)
    bad = [a for a in arms if a not in specs]
    if bad:
        raise UserError(f"--arms: unknown arm(s) {', '.join(bad)}; choose from {', '.join(specs)}")
    for key in PER_RUN_KEYS:
        if any(o.startswith(key + "=") for o in overrides):
            raise UserError(f"{key} is set per run by `selfplay compare`; use --out, --seeds or --arms instead")
    if args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: at least 1")
    cfg = load_config(config, overrides)  # a bad config fails here, before any run starts
    if args.split not in suite_splits(cfg):
        raise UserError(
            f"--split {args.split}: the runs evaluate {', '.join(suite_splits(cfg))} (set eval.splits to "
            f"include {args.split})"
        )
    for name, spec in variants.items():
        try:
            load_config(config, overrides + list(spec.overrides))
        except UserError as e:
            raise UserError(f"--variant {name}: {e}") from None
    if not args.report_only:
        try:  # the arms must run alike where the design says so: refused before any run starts
            check_parity(config, overrides, arms, variants)
        except ValueError as e:
            raise UserError(str(e)) from None
    if args.report_only and args.primary and not (out / PLAN_FILE).exists():
        raise UserError(
            f"--primary {args.primary}: the comparison in {out} declared no primary metric before its "
            "runs; report it without --primary (every figure exploratory)"
        )
    try:
        declare_plan(out, args.primary, args.split, args.baseline, arms)
        if not args.report_only:  # the runs of one comparison run one code, or say where they did not
            hold_code(out, code_version(diff=True), args.allow_code_change)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.report_only:
        try:
            results = collect(out, args.seeds, arms, args.from_iteration, variants, args.split)
        except (FileNotFoundError, ValueError) as e:  # a run not there, or not finished
            raise UserError(f"--report-only: {e}") from None
        write_report(results, out)
    else:
        results = run_all(
            config,
            overrides,
            args.seeds,
            arms,
            out,
            log=lambda m: print(f"[compare] {m}", flush=True),
            shared_warmstart=args.shared_warmstart,
            from_iteration=args.from_iteration,
            variants=variants,
            split=args.split,
            jobs=args.jobs,
        )
    return finish(results, out)


def finish(results: dict, out: Path) -> int:
    from selfplay.eval.compare import markdown_table

    print(markdown_table(results))
    print(f"results: {out / 'results.md'}, {out / 'results.json'}, {out / 'compare.png'}")
    return 0
