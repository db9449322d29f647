"""The research claim, measured: self-play against warm start only and against a fixed procedural curriculum.

    selfplay compare                                       # configs/tiny.yaml, seeds 0 1 2, into runs/compare
    selfplay compare configs/tiny.yaml --seeds 0 1 2 --out runs/compare train.steps=30

Per seed, one warm start (`OUT/seed_S/warmstart`: procedural corpus, tokenizer, both agents behaviour-cloned, the
held-out suite drawn and evaluated), or with `--shared-warmstart` one for all seeds (`OUT/warmstart`, made with the
first seed: the seeds then vary only the RL phase, and the warm-start arm has no spread). Each RL arm starts from a
copy of that folder, so the arms of one seed differ only in what happens after the warm start:

    warmstart    no RL: the warm-started solver's evaluation (step 0) is the result
    curriculum   PPO on procedural tasks only, on a fixed level schedule (`train.mode=curriculum`)
    uniform      PPO on procedural tasks only, each at a level drawn uniformly (`train.mode=uniform`)
    selfplay     generator proposals + the adaptive mixer + PPO for both agents (`train.mode=selfplay`)
    selfplay_free  the same with the free proposal format (`generator.format=free`) and the generator's critic, its
                 value head detached from its backbone (`agents.generator.advantage=gae model.value_model=detached`,
                 the setting it was measured with); the format is learnt at the warm start,
                 so this arm has its own (`OUT/seed_S/warmstart_free`, or `OUT/warmstart_free`), made with the same
                 seed, and is paired with it
    selfplay_follow  self-play whose mixer draws the mutation instructions by their measured yield
                 (`mixer.instruction_follow=true`), from the same warm start as `selfplay`
    selfplay_code_io  self-play with the code_io proposal format (`generator.format=code_io`: a function and its
                 inputs, under its grammar); its own warm start (`OUT/warmstart_code_io`), made with the same seed,
                 as `selfplay_free`
    selfplay_frozen  self-play whose generator never learns (`train.train_generator=false`): the same mixer,
                 references and validity checks, the warm start's generator proposing
    selfplay_random  self-play with a random edit of the same references in place of each generator answer
                 (`generator.source=random_edits`), through the same validity checks and mixer; no generator
                 sampled or trained
    fixed        PPO on one fixed task set (`train.mode=fixed`, `train.fixed_source`; not run by default)

An ablation is an arm of its own, from its base arm's warm start, with overrides of the RL phase added
(`--variant NAME BASE KEY=VALUE ...`, `variant`), e.g. the curriculum without a critic:

    selfplay compare --seeds 0 1 --shared-warmstart --arms warmstart curriculum \
        --variant curriculum_rloo curriculum ppo.advantage=rloo

Equal compute means equal solver training: both RL arms run `train.steps` iterations of `train.solver_tasks` tasks x
`train.samples_per_task` episodes, so the solver sees the same number of episodes and PPO updates; self-play pays
for its generator on top. A comparison whose RL arms would differ in a setting they must share (`PARITY_KEYS`: the
run's length, the learning-rate control, the replayed share of the batch; and the solver's episodes per iteration;
not the PPO settings an ablation compares) is refused before
any run starts, naming the setting and each arm's value (`check_parity`). What each run spent beside its PPO
episodes (the solver episodes sampled to measure proposals too and their tokens, the generator's tokens, the
sandbox's executions: the loop's `compute` counters) is reported per arm (`compute_table`).

Every run is an ordinary run folder (resumable, TensorBoard, `selfplay eval`), and this command skips whatever is
already done, so killing and restarting it loses at most the runs in progress. `--jobs N` runs N of them at a time
(the warm starts first, then the RL runs), each its own process.

Results (OUT/results.json, OUT/results.md, OUT/compare.png): per arm and held-out split, the mean and the sample
standard deviation over seeds of greedy pass@1 and sampled pass@1, the per-seed values, and per RL arm the curves
that explain them (held-out test pass@1 at each evaluation, solver pass rate on its training batch, generator
validity, the mixer's level). Where the warm start's evaluation has per-task outcomes, each RL run's change on the
test split is also given paired over its tasks (`paired_delta`: the same tasks before and after, with a bootstrap
95 % interval), which separates a real gain from the luck of which tasks were drawn, and every two arms are
compared the same way on the seeds and tasks both ran (`paired_arms`: pooled over seeds, with the interval the
design calls for, `selfplay.eval.stats`: seeds and tasks resampled together when the seeds share their tasks, seeds
then each seed's tasks when each drew its own, so that the interval also covers which training runs happened).
`--primary METRIC` declares the comparison's primary metric before its runs (OUT/plan.json, with `--split` and
`--baseline`); the report then opens with each arm against the baseline on it, corrected for the number of arms,
and a report of a comparison that declared none says that its figures are exploratory. The per-task outcomes come from
`selfplay eval RUN --suite heldout` of the final checkpoint when there is one (RUN/eval/step_S.json: more samples
per task lower the noise), else from the run's own evaluation. A comparison's runs run one code: its first start
records the code in OUT/code.json (commit, and a digest of uncommitted changes), and a later start under other code
is refused unless `--allow-code-change` records it (run a long comparison from a checkout nobody edits: `git
worktree add DIR COMMIT`).

Settings are chosen on a validation split, never on the held-out ones: with the override `eval.splits=[val]` every
run draws and evaluates only the validation split (training-distribution tasks apart from the test split and the
corpus), and `--split val` pairs the runs on it (the records then say `split: val`, and never pool with records of
the test split), e.g. the solver's advantage estimator:

    selfplay compare configs/tiny.yaml eval.splits=[val] --split val --seeds 0 1 --shared-warmstart \
        --arms warmstart selfplay --variant selfplay_rloo selfplay ppo.advantage=rloo

Seeds run apart (other machines, other days, a SLURM job each) are pooled with

    selfplay compare --merge A/results.json B/results.json --out DIR

Every run's record in results.json carries what the report needs of it, the test-split outcomes of the warm start
it started from included, and each warm start's fingerprint (its held-out tasks and weights: `warm_start_id`), so
the pooled report says whether the seeds share one warm start (`warm_starts`). A run found in two inputs must be the
same run.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from selfplay.eval import stats
from selfplay.eval.evaluate import BREAKDOWNS, TEST_SPLIT
from selfplay.eval.stats import mean_sd, outcome_value, paired_delta  # noqa: F401 - compare's names for them
from selfplay.runtime import paths
from selfplay.runtime.checkpoint import LATEST
from selfplay.runtime.paths import RunPaths


@dataclass(frozen=True)
class Arm:
    """What an arm runs: `train.mode`, the overrides it adds, and the warm start it starts from (its folder name;
    an arm whose overrides change what the warm start learns needs its own)."""

    mode: str
    overrides: tuple[str, ...] = ()
    warm: str = "warmstart"


ARM_SPECS = {
    "warmstart": Arm("warmstart"),
    "curriculum": Arm("curriculum"),
    "uniform": Arm("uniform"),
    "selfplay": Arm("selfplay"),
    # the free format's answers are ~300 tokens: its critic's gradient in the backbone made its PPO drift, so its
    # value head is detached (docs/generator.md: "The free format under PPO"); the tiny default's critic-free
    # generator advantage was chosen on the mutation format, so this arm keeps the critic it was measured with
    "selfplay_free": Arm(
        "selfplay",
        ("generator.format=free", "agents.generator.advantage=gae", "model.value_model=detached"),
        warm="warmstart_free",
    ),
    "selfplay_follow": Arm("selfplay", ("mixer.instruction_follow=true",)),
    # the generator writes a function and its inputs (Absolute Zero's proposal) under the format's grammar (its
    # answers are longer: the comparison's config gives every arm the room, warmstart.max_len and the generator's
    # max_new_tokens); the format is learnt at the warm start, so this arm has its own, made with the same seed
    "selfplay_code_io": Arm(
        "selfplay", ("generator.format=code_io", "generator.constrained=true"), warm="warmstart_code_io"
    ),
    # what the generator's learning adds: the same mixer, references and validity checks with the generator held
    # at its warm start (no PPO step), and with random edits of the same references in place of its answers
    "selfplay_frozen": Arm("selfplay", ("train.train_generator=false",)),
    "selfplay_random": Arm("selfplay", ("generator.source=random_edits",)),
    "fixed": Arm("fixed"),
}
ARMS = tuple(ARM_SPECS)
METRICS = stats.OUTCOME_METRICS  # per split, from the final held-out evaluation
# what an arm takes from its seed's warm start (reserved_tasks.jsonl: only with train.fixed_source=reserved)
COPIED = (paths.CHECKPOINTS, paths.MODELS, paths.CORPUS, paths.HELDOUT, paths.RESERVED_TASKS)


SHARED_WARMSTART = "warmstart"  # OUT/warmstart: one warm start for every seed (--shared-warmstart)

# a variant shares its base arm's warm start, so it may not change what the warm start reads
WARM_START_KEYS = ("warmstart.", "model.", "tasks.", "generator.format")
# ... but these model settings it may change: a value head with or without gradients into the backbone is the same
# parameters, switchable at any checkpoint (ActorCritic.from_pretrained)
RL_PHASE_MODEL_OVERRIDES = ("model.value_model=head", "model.value_model=detached")
PER_RUN_KEYS = ("run.dir", "run.seed", "train.mode")  # set for each run by `compare` (from --out, --seeds, the arm)


def variant(name: str, base: str, overrides: Sequence[str]) -> Arm:
    """The arm `name`: arm `base` with `overrides` (KEY=VALUE) added to its own, from the same warm start. Raises
    ValueError naming what is wrong (an arm's name taken, an unknown base, a key the shared warm start reads)."""
    if not name.isidentifier() or name in ARM_SPECS:
        raise ValueError(f"variant name {name!r}: an identifier that is not an arm's ({', '.join(ARMS)})")
    if base not in ARM_SPECS or base == "warmstart":
        raise ValueError(f"variant {name}: base {base!r} must be an RL arm ({', '.join(ARMS[1:])})")
    if not overrides or any("=" not in o for o in overrides):
        raise ValueError(f"variant {name}: give its overrides as KEY=VALUE (got {' '.join(overrides) or 'none'})")
    per_run = [o for o in overrides if o.split("=")[0] in PER_RUN_KEYS]
    if per_run:
        raise ValueError(
            f"variant {name}: {', '.join(per_run)} is set per run by `selfplay compare` (its mode is {base}'s)"
        )
    shared = [o for o in overrides if o.startswith(WARM_START_KEYS) and o not in RL_PHASE_MODEL_OVERRIDES]
    if shared:
        raise ValueError(
            f"variant {name}: {', '.join(shared)} would change its warm start, which it shares with "
            f"{base}; a variant changes the RL phase only"
        )
    spec = ARM_SPECS[base]
    return Arm(spec.mode, spec.overrides + tuple(o for o in overrides if o not in spec.overrides), spec.warm)


# what every RL arm of a comparison runs alike, so that the arms differ in where the solver's tasks come from and
# not in how much of it they get: the run's length, the learning-rate control and the share of replayed corpus
# tasks (the solver's episodes per iteration, tasks x samples, are checked as their product: `check_parity`). How
# the solver learns from its episodes (ppo.*: the advantage, the SFT replay loss) is not among them: an ablation
# compares exactly that, with the same episodes for every arm.
PARITY_KEYS = ("train.steps", "mixer.lr_control", "mixer.corpus_replay", "mixer.share_replay", "mixer.max_share_replay")
EPISODES = "the solver's episodes per iteration (train.solver_tasks x train.samples_per_task)"


def check_parity(
    config: str | None, overrides: Sequence[str], arms: Sequence[str], variants: dict[str, Arm] | None = None
) -> None:
    """Raises ValueError (one line) naming the first setting the design says must match that two RL arms of the
    comparison resolve differently (PARITY_KEYS, then the solver's episodes per iteration), with each arm's value.
    A key the config does not have is the same (absent) for every arm."""
    from omegaconf import OmegaConf

    from selfplay.runtime.config import load_config

    specs = arm_specs(variants)
    resolved = {
        arm: load_config(config, [*overrides, *specs[arm].overrides, f"train.mode={specs[arm].mode}"])
        for arm in dict.fromkeys(arms)
        if arm != "warmstart"
    }
    values = {
        key: {arm: OmegaConf.select(cfg, key, default=None) for arm, cfg in resolved.items()} for key in PARITY_KEYS
    }
    values[EPISODES] = {arm: cfg.train.solver_tasks * cfg.train.samples_per_task for arm, cfg in resolved.items()}
    for key, by_arm in values.items():
        if len({repr(value) for value in by_arm.values()}) > 1:
            shown = ", ".join(f"{arm} {value}" for arm, value in by_arm.items())
            raise ValueError(f"the arms differ in {key} ({shown}): a comparison's arms must run alike in it")


def warm_start_overrides(warm: str) -> tuple[str, ...]:
    """The overrides that make warm start `warm` (a folder name): those of the built-in arm it belongs to, whichever
    arm (a variant with RL overrides included) comes to make it first."""
    return next(spec.overrides for spec in ARM_SPECS.values() if spec.warm == warm)


def arm_specs(variants: dict[str, Arm] | None = None) -> dict[str, Arm]:
    """The arms a comparison knows: the built-in ones and its variants."""
    return {**ARM_SPECS, **(variants or {})}


def run_folder(out: Path, seed: int, arm: str) -> Path:
    """OUT/seed_S/ARM; the warm start of every seed is OUT/warmstart when the comparison shares one."""
    if arm == "warmstart" and (out / SHARED_WARMSTART).exists():
        return out / SHARED_WARMSTART
    return out / f"seed_{seed}" / arm


def warm_folder(
    out: Path, seed: int, arm: str, shared: bool | None = None, variants: dict[str, Arm] | None = None
) -> Path:
    """The warm start `arm` starts from: OUT/seed_S/<its warm start>, or OUT/<its warm start> when shared (None:
    shared if the comparison's main warm start is)."""
    name = arm_specs(variants)[arm].warm
    if shared is None:
        shared = (out / SHARED_WARMSTART).exists()
    return out / name if shared else out / f"seed_{seed}" / name


def _selfplay(args: Sequence[str], log_path: Path) -> None:
    """One `selfplay` sub-process (a fresh interpreter per run), its output appended to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"$ selfplay {' '.join(args)}\n")
        log.flush()
        proc = subprocess.run([sys.executable, "-m", "selfplay", *args], stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"selfplay {' '.join(args)} exited {proc.returncode}; see {log_path}")


def copy_warm_start(warm: Path, dst: Path) -> None:
    """An arm's run folder: the warm start's checkpoint, models, corpus and held-out tasks (SQLite's WAL files too)."""
    tmp = dst.with_name(dst.name + ".copying")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in COPIED:
        src = warm / name
        if src.is_dir():
            shutil.copytree(src, tmp / name)
        elif src.exists():
            shutil.copy2(src, tmp / name)
            for extra in warm.glob(name + "-*"):  # corpus.sqlite-wal / -shm
                shutil.copy2(extra, tmp / extra.name)
    tmp.rename(dst)


def run_all(
    config: str | None,
    overrides: Sequence[str],
    seeds: Sequence[int],
    arms: Sequence[str],
    out: Path,
    log=print,
    shared_warmstart: bool = False,
    from_iteration: int = 10,
    variants: dict[str, Arm] | None = None,
    split: str = TEST_SPLIT,
    jobs: int = 1,
) -> dict:
    """Warm start per seed (or one for all), then every arm from it, `jobs` runs at a time; skips finished runs.
    Returns the results, paired on `split` (the test split, or "val" when choosing settings: the overrides then set
    eval.splits=[val])."""
    specs = arm_specs(variants)
    unknown = [a for a in arms if a not in specs]
    if unknown:
        raise ValueError(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(specs)}")
    check_parity(config, overrides, arms, variants)
    base = ([config] if config else []) + list(overrides)
    t0 = time.perf_counter()
    warm_jobs: dict[Path, Job] = {}  # each warm start once (a shared one is made with the first seed)
    rl_runs: list[Job] = []
    for seed in seeds:
        for arm in ["warmstart", *arms]:
            spec = specs[arm]
            warm = warm_folder(out, seed, arm, shared_warmstart, variants)
            if warm not in warm_jobs and not (RunPaths(warm).checkpoints / LATEST).exists():
                warm_jobs[warm] = Job(
                    f"seed {seed}: warm start -> {warm}",
                    ["warmstart", *base, *warm_start_overrides(spec.warm), f"run.dir={warm}", f"run.seed={seed}"],
                    out / "logs" / f"{warm.relative_to(out).as_posix().replace('/', '_')}.log",
                )
            folder = run_folder(out, seed, arm)
            if arm == "warmstart" or RunPaths(folder).summary.exists():
                continue
            rl_runs.append(
                Job(
                    f"seed {seed}: {arm} -> {folder}",
                    [
                        "train",
                        *base,
                        *spec.overrides,
                        f"run.dir={folder}",
                        f"run.seed={seed}",
                        f"train.mode={spec.mode}",
                    ],
                    out / "logs" / f"seed_{seed}_{arm}.log",
                    warm=warm,
                    folder=folder,
                )
            )
    run_jobs(list(warm_jobs.values()), jobs, log, t0)
    run_jobs(rl_runs, jobs, log, t0)
    results = collect(out, seeds, arms, from_iteration, variants, split)
    write_report(results, out)
    return results


@dataclass(frozen=True)
class Job:
    """One `selfplay` sub-process of a comparison: what to log, its arguments, its log file, and for an RL run the
    warm start its folder is copied from (when the folder is not there yet)."""

    message: str
    args: list
    log_path: Path
    warm: Path | None = None
    folder: Path | None = None


def run_jobs(todo: Sequence[Job], jobs: int, log=print, t0: float | None = None) -> None:
    """Run `todo`, `jobs` at a time, in order. A run that fails does not stop the others (their work is kept); once
    all have ended, the failures are raised together (RuntimeError naming each run's log)."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter() if t0 is None else t0
    failed: list[str] = []

    def one(job: Job) -> None:
        if job.folder is not None and not job.folder.exists():
            copy_warm_start(job.warm, job.folder)
        log(f"{job.message} ({(time.perf_counter() - t0) / 60:.0f} min so far)")
        try:
            _selfplay(job.args, job.log_path)
        except RuntimeError as e:
            failed.append(str(e))

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, todo))
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(todo)} runs failed: " + "; ".join(failed))


# ---- results ----------------------------------------------------------------------------------------------------
def _final_state(folder: Path) -> dict:
    from selfplay.runtime.checkpoint import CheckpointManager

    ckpt = CheckpointManager(folder)
    latest = ckpt.latest_checkpoint()
    if latest is None:
        raise FileNotFoundError(f"{folder} holds no checkpoint")
    return ckpt.load_state(latest)


def run_result(folder: Path, arm: str, split: str = TEST_SPLIT) -> dict:
    """{"heldout": {split: {metric: value}}, "test_by_level": {level: {metric: value}}, "history": [...],
    "seconds": s} of one finished run. The test_* entries (levels, per-task outcomes, curve) are those of `split`,
    the split the runs are paired on: the test split, or the validation split when settings are being chosen."""
    state = _final_state(folder)
    evals = state.get("evals") or {}
    if arm == "warmstart":
        step, final = 0, state.get("eval_before") or evals.get("0", {})
    else:
        if not evals:
            raise ValueError(f"{folder} has no held-out evaluation")
        step = max(map(int, evals))
        final = evals[str(step)]
    heldout = {name: {m: res[m] for m in METRICS if m in res} for name, res in final.items() if name not in BREAKDOWNS}
    later = _eval_json(folder, step)  # a `selfplay eval` of the same checkpoint, if any
    by_level = (final.get("by_level") or later.get("by_level") or {}).get(split, {})
    # for the per-task outcomes the later evaluation is preferred (e.g. run with more samples)
    per_task = (later.get("per_task") or final.get("per_task") or {}).get(split, {})
    curve = (
        {
            str(k): {m: res[split][m] for m in METRICS if m in res.get(split, {})}
            for k, res in sorted(evals.items(), key=lambda kv: int(kv[0]))
        }
        if arm != "warmstart"
        else {}
    )
    return {
        "heldout": heldout,
        "history": state.get("history", []),
        "seconds": state.get("elapsed_s"),
        "test_by_level": {lv: {m: res[m] for m in METRICS + ("tasks",) if m in res} for lv, res in by_level.items()},
        "test_per_task": per_task,
        "test_curve": curve,
        "per_iteration": {} if arm == "warmstart" else per_iteration(folder, state),
        # the code versions the run (and the warm start it began as) ran under; runs made before they were
        # recorded keep the record they always had (so that it pools with itself)
        **({"code": state["code"]} if state.get("code") else {}),
        # what the RL phase spent in all (the loop's COMPUTE counters; runs made before they were counted: none)
        **({"compute": state["compute"]} if state.get("compute") and arm != "warmstart" else {}),
        **({} if split == TEST_SPLIT else {"split": split}),
    }  # records of the test split are as they always were


def _eval_json(folder: Path, step: int) -> dict:
    """The held-out results `selfplay eval` wrote for `step` (RUN/eval/step_S.json), or {} (older runs' in-loop
    evaluations have no per-level breakdown; `selfplay eval RUN --suite heldout` adds one)."""
    path = RunPaths(folder).eval_json(step)
    if not path.exists():
        return {}
    return json.loads(path.read_text()).get("heldout") or {}


COST_TAGS = ("time/", "perf/", "sandbox/")  # where an iteration's time goes (TensorBoard tags)


def per_iteration(folder: Path, state: dict) -> dict[str, float]:
    """Median over iterations of each time/, perf/ and sandbox/ scalar of a run, plus solver episodes per second
    of rollout time (`state`: the run's final checkpoint state, for its config)."""
    from selfplay.runtime.tb import read_scalars

    scalars = read_scalars(folder)
    out = {
        tag: statistics.median(v for _, v in series)
        for tag, series in scalars.items()
        if tag.startswith(COST_TAGS) and series
    }
    train = (state.get("config") or {}).get("train", {})
    if "time/rollout_s" in out and train:
        episodes = train["solver_tasks"] * train["samples_per_task"]
        out["perf/solver_episodes_per_rollout_s"] = episodes / max(1e-9, out["time/rollout_s"])
    return out


def gather(
    out: Path,
    seeds: Sequence[int],
    arms: Sequence[str],
    variants: dict[str, Arm] | None = None,
    split: str = TEST_SPLIT,
) -> dict:
    """{arm: {seed: record}} of the finished runs in `out` (`run_result`, paired on `split`). Each record also says
    which warm start it is (the warm-start arm) or started from (an RL arm: `paired_with`, with that warm start's
    outcomes on `split` and task levels), so that a record needs nothing but itself: results from several --out
    folders can be pooled (`merge`); a variant's record also says what it is (`variant`: mode, overrides and warm
    start)."""
    warm_cache: dict[Path, dict] = {}

    def warm_record(folder: Path) -> dict:
        if folder not in warm_cache:
            outcomes, levels = run_result(folder, "warmstart", split)["test_per_task"], _task_levels(folder)
            warm_cache[folder] = {
                "test_per_task": outcomes,
                "warm_start": warm_start_id(folder),
                "levels": {task_id: levels[task_id] for task_id in outcomes if task_id in levels},
            }
        return warm_cache[folder]

    runs = {arm: {str(s): run_result(run_folder(out, s, arm), arm, split) for s in seeds} for arm in arms}
    for arm, by_seed in runs.items():
        for seed, run in by_seed.items():
            if arm == "warmstart":  # a shared warm start is hashed once, not once per seed
                run["warm_start"] = warm_record(run_folder(out, int(seed), arm))["warm_start"]
            else:
                run["paired_with"] = warm_record(warm_folder(out, int(seed), arm, variants=variants))
            if arm in (variants or {}):
                spec = variants[arm]
                run["variant"] = {"mode": spec.mode, "overrides": list(spec.overrides), "warm": spec.warm}
    return runs


def collect(
    out: Path,
    seeds: Sequence[int],
    arms: Sequence[str],
    from_iteration: int = 10,
    variants: dict[str, Arm] | None = None,
    split: str = TEST_SPLIT,
) -> dict:
    """The results of the finished runs in `out` (`gather`, then `analyse`)."""
    return analyse(gather(out, seeds, arms, variants, split), from_iteration)


def paired_split(runs: dict) -> str:
    """The one split every record is paired on (records of the test split name none). Raises ValueError when the
    records mix splits: a validation result never pools with a test result."""
    found = {run.get("split", TEST_SPLIT) for by_seed in runs.values() for run in by_seed.values()}
    if len(found) > 1:
        raise ValueError(
            f"the run records are paired on different splits ({', '.join(sorted(found))}): compare them apart"
        )
    return found.pop() if found else TEST_SPLIT


def split_of(results: dict) -> str:
    """The split a report's runs are paired on (`analyse` records it; test for results made before it did)."""
    return results.get("split", TEST_SPLIT)


def analyse(runs: dict, from_iteration: int = 10, n_boot: int = 4000) -> dict:
    """Every figure of the report from the run records alone ({arm: {seed: record}}, `gather`): the per-run means
    from `from_iteration` on, the summaries over seeds, each RL run against the warm start it started from, and
    every two arms paired over the seeds and tasks both ran (each interval from `n_boot` bootstrap draws)."""
    arms = list(runs)
    split = paired_split(runs)
    seeds = sorted({int(s) for by_seed in runs.values() for s in by_seed})
    for arm, by_seed in runs.items():
        for run in by_seed.values():
            run["from_iteration"] = later_figures(run["history"], from_iteration) if arm != "warmstart" else {}
    paired = {
        arm: {
            seed: paired_groups(
                run["paired_with"]["test_per_task"], run["test_per_task"], run["paired_with"]["levels"], n_boot
            )
            for seed, run in by_seed.items()
            if run["paired_with"]["test_per_task"] and run["test_per_task"]
        }
        for arm, by_seed in runs.items()
        if arm != "warmstart"
    }
    return {
        "seeds": seeds,
        "arms": arms,
        "from_iteration": from_iteration,
        "runs": runs,
        "split": split,
        "warm_starts": warm_starts(runs),
        "summary": summarize(runs),
        "summary_test_by_level": summarize(runs, "test_by_level"),
        "paired_test": {arm: v for arm, v in paired.items() if v},
        "paired_arms": paired_arms({arm: runs[arm] for arm in arms}, n_boot),
    }


def merge(
    results: Sequence[dict], from_iteration: int = 10, names: Sequence[str] | None = None, n_boot: int = 4000
) -> dict:
    """One report from several comparisons' results.json (e.g. seeds run on different machines or days): their run
    records pooled by arm and seed, then `analyse`d. A run found in two of them must be the same run; arms keep
    the order they are first met in. `names`: what to call each input in an error (its path)."""
    names = list(names or [f"results {i + 1}" for i in range(len(results))])
    pooled: dict[str, dict] = {}
    where: dict[tuple[str, str], str] = {}
    for name, res in zip(names, results):
        if not res.get("runs"):
            raise ValueError(f"{name} holds no run records (not a `selfplay compare` results.json?)")
        for arm in res.get("arms") or list(res["runs"]):
            by_seed = res["runs"].get(arm, {})
            for seed, run in by_seed.items():
                if arm != "warmstart" and "paired_with" not in run:
                    raise ValueError(
                        f"{name}: arm {arm}, seed {seed} does not say which warm start it started from "
                        "(results written before records carried it): re-collect it with "
                        "`selfplay compare --report-only`"
                    )
                run = {k: v for k, v in run.items() if k != "from_iteration"}  # recomputed by analyse
                have = pooled.setdefault(arm, {}).get(seed)
                if have is not None and have != run:
                    raise ValueError(
                        f"arm {arm}, seed {seed} is in {where[arm, seed]} and {name} with different "
                        "results: pool each run once"
                    )
                pooled[arm][seed] = run
                where[arm, seed] = name
    runs = {arm: dict(sorted(by_seed.items(), key=lambda kv: int(kv[0]))) for arm, by_seed in pooled.items()}
    return analyse(runs, from_iteration, n_boot)


def warm_start_id(folder: Path) -> str:
    """A short fingerprint of a warm start: its held-out tasks and the weights of its latest checkpoint (every
    `*.safetensors` file), so that two folders made by the same command on different machines can be seen to be
    the same warm start (or not)."""
    import hashlib

    from selfplay.runtime.checkpoint import CheckpointManager

    digest = hashlib.sha256()
    latest = CheckpointManager(folder).latest_checkpoint()
    files = [RunPaths(folder).heldout] + (sorted(latest.rglob("*.safetensors")) if latest else [])
    for path in files:
        if path.exists():
            digest.update(path.relative_to(folder).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def warm_starts(runs: dict) -> dict[str, dict[str, list[int]]]:
    """{warm start (its folder name: warmstart, warmstart_free): {fingerprint: the seeds whose runs started from
    it}}: one fingerprint under a name means every seed shares that warm start."""
    out: dict[str, dict[str, set[int]]] = {}
    for arm, by_seed in runs.items():
        for seed, run in by_seed.items():
            ident = run.get("warm_start") if arm == "warmstart" else (run.get("paired_with") or {}).get("warm_start")
            if ident:
                name = (run.get("variant") or {}).get("warm") or ARM_SPECS[arm].warm
                out.setdefault(name, {}).setdefault(ident, set()).add(int(seed))
    return {name: {ident: sorted(seeds) for ident, seeds in sorted(ids.items())} for name, ids in sorted(out.items())}


def variants_line(results: dict) -> str:
    """One line of the report naming each variant arm's mode and overrides ("" when there is none)."""
    seen = {
        arm: run["variant"]
        for arm, by_seed in results["runs"].items()
        for run in by_seed.values()
        if run.get("variant")
    }
    return (
        (
            "Variants: "
            + "; ".join(
                f"{arm} = train.mode={v['mode']} {' '.join(v['overrides'])}, from {v['warm']}"
                for arm, v in seen.items()
            )
            + "."
        )
        if seen
        else ""
    )


def warm_starts_line(results: dict) -> str:
    """One line of the report: which warm start each seed's runs started from."""
    parts = []
    for name, ids in (results.get("warm_starts") or {}).items():
        shared = "one for every seed" if len(ids) == 1 else f"{len(ids)} different"
        seeds = "; ".join(f"{ident}: seeds {', '.join(map(str, s))}" for ident, s in ids.items())
        parts.append(f"{name} ({shared}; {seeds})")
    return "Warm starts: " + (", ".join(parts) if parts else "not recorded") + "."


def code_line(results: dict) -> str:
    """One line of the report: the code the runs ran under (their checkpoints' `code`: an RL run's includes its
    warm start's) and which runs ran under each version; "" when no record has it (records made before)."""
    where: dict[str, list[str]] = {}
    missing = [
        f"{arm} {seed}"
        for arm, by_seed in results["runs"].items()
        for seed, run in by_seed.items()
        if not run.get("code")
    ]
    for arm, by_seed in results["runs"].items():
        for seed, run in by_seed.items():
            for version in run.get("code") or []:
                name = (version.get("commit") or "")[:12] or f"version {version.get('version')} (no git commit)"
                name += " with uncommitted changes" if version.get("dirty") else ""
                runs = where.setdefault(name, [])
                if f"{arm} {seed}" not in runs:
                    runs.append(f"{arm} {seed}")
    if not where:
        return ""
    if len(where) == 1 and not missing:
        return f"Code: {next(iter(where))}, every run."
    parts = [f"{name} ({', '.join(runs)})" for name, runs in where.items()]
    return "Code: " + "; ".join(parts + ([f"not recorded ({', '.join(missing)})"] if missing else [])) + "."


LATER_FIGURES = (
    "parse_rate",
    "validity",
    "generator_in_band",
    "generator_never_solved",
    "generator_always_solved",
    "generator_share",
    "generator_batch_share",
    "solver_in_band",
    "level",
)


def later_figures(history: list[dict], start: int = 10, window: int = 10) -> dict:
    """What a run did from iteration `start` on (its history, one entry per iteration): the mean of each of
    LATER_FIGURES over those iterations (None where none had it), the longest run of consecutive iterations with a
    collapse alarm on (the solver's pass rate, the generator's diversity or the KL: not the generator's trust), and
    the generator's mean reward over the first and the last `window` iterations of the whole run."""
    from selfplay.train.history import COLLAPSE_ALARMS, window_means

    later = [h for h in history if h["step"] >= start]
    out: dict = {"iterations": len(later)}
    for key in LATER_FIGURES:
        values = [h[key] for h in later if h.get(key) is not None]
        out[key] = statistics.fmean(values) if values else None
    longest = streak = 0
    for h in later:
        streak = streak + 1 if any(h.get(a) for a in COLLAPSE_ALARMS) else 0
        longest = max(longest, streak)
    out["longest_collapse_alarm"] = longest
    windows = window_means(history, window)  # the closing summary's first and last iterations
    out["reward_first"] = windows["first_iterations"]["generator_reward"]
    out["reward_last"] = windows["last_iterations"]["generator_reward"]
    return out


def _task_levels(folder: Path) -> dict[str, int]:
    """{task_id: level} of a run's held-out tasks (RUN/heldout.jsonl)."""
    path = RunPaths(folder).heldout
    if not path.exists():
        return {}
    return {d["id"]: d["level"] for d in map(json.loads, path.read_text().splitlines()) if d}


def paired_groups(before: dict, after: dict, levels: dict[str, int], n_boot: int = 4000) -> dict:
    """{"all" | "level_L": {metric: paired_delta}}: the whole test split, then each level of it."""
    groups = {"all": sorted(set(before) & set(after))}
    for task_id in groups["all"]:
        if task_id in levels:
            groups.setdefault(f"level_{levels[task_id]}", []).append(task_id)
    return {
        name: {m: paired_delta({i: before[i] for i in ids}, {i: after[i] for i in ids}, m, n_boot) for m in METRICS}
        for name, ids in sorted(groups.items(), key=lambda kv: (kv[0] != "all", kv[0]))
    }


def paired_arms(runs: dict, n_boot: int = 4000, seed: int = 0) -> dict:
    """{"B - A": {metric: seed_task_delta}} for every two arms A before B (in `runs`' order) whose test-split
    per-task outcomes share tasks in some seed: B against A on the same tasks of the same seeds, pooled."""
    arms = list(runs)
    out = {}
    for i, first in enumerate(arms):
        for second in arms[i + 1 :]:
            pairs = {
                s: (runs[first][s]["test_per_task"], run["test_per_task"])
                for s, run in runs[second].items()
                if s in runs[first] and run.get("test_per_task") and runs[first][s].get("test_per_task")
            }
            pairs = {s: (a, b) for s, (a, b) in pairs.items() if set(a) & set(b)}
            if pairs:
                out[f"{second} - {first}"] = {m: seed_task_delta(pairs, m, n_boot, seed) for m in METRICS}
    return out


def seed_task_delta(pairs: dict, metric: str = "pass@1", n_boot: int = 4000, seed: int = 0, k: int = 1) -> dict:
    """The change of `metric` from A to B, paired over (seed, task), every task of every seed weighted alike.

    `pairs`: {seed: (A's per-task outcomes, B's)}, each {task_id: [greedy solved, n, c]}; per seed only the tasks
    both evaluated count. The interval is the one the comparison's design calls for (selfplay.eval.stats): seeds
    that share their tasks (`--shared-warmstart`) are resampled together with the tasks (crossed), seeds with tasks
    of their own are resampled and then each seed's tasks (nested); `k` > 1 widens it for k comparisons. The row
    says which (`design`, `resamples`); `ci95` is the interval at 95 % (corrected for k)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    d = stats.paired_interval(pairs, lambda row: outcome_value(row, metric), n_boot, seed, k=k)
    d["ci95"] = d.pop("ci")
    return d


def summarize(runs: dict, key: str = "heldout") -> dict:
    """{arm: {split: {metric: {"mean", "sd", "values"}}}} over seeds (key="test_by_level": levels of the test split
    instead of splits)."""
    out: dict = {}
    for arm, by_seed in runs.items():
        splits = sorted({s for r in by_seed.values() for s in r.get(key, {})})
        for split in splits:
            for metric in METRICS:
                values = [r[key][split][metric] for r in by_seed.values() if metric in r.get(key, {}).get(split, {})]
                if values:
                    mean, sd = mean_sd(values)
                    out.setdefault(arm, {}).setdefault(split, {})[metric] = {"mean": mean, "sd": sd, "values": values}
    return out


def markdown_table(results: dict, metric: str = "pass@1_greedy", summary_key: str = "summary") -> str:
    """Rows: arms; columns: held-out splits (or the paired split's levels); cells: mean ± sd over seeds."""
    summary = results.get(summary_key) or {}
    splits = sorted({s for arm in summary.values() for s in arm}, key=lambda s: (s != TEST_SPLIT, s))
    what = "" if summary_key == "summary" else f", {split_of(results)} split by level"
    lines = [
        f"| arm ({metric}{what}, n={len(results['seeds'])} seeds) | " + " | ".join(splits) + " |",
        "|---|" + "---|" * len(splits),
    ]
    for arm in results["arms"]:
        cells = []
        for split in splits:
            cell = summary.get(arm, {}).get(split, {}).get(metric)
            cells.append(f"{cell['mean']:.3f} ± {cell['sd']:.3f}" if cell else "n/a")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


COST_COLUMNS = (
    "time/generator_s",
    "time/rollout_s",
    "time/sandbox_s",
    "time/solver_update_s",
    "time/update_s",
    "perf/solver_gen_tokens_per_s",
    "perf/solver_update_tokens_per_s",
    "perf/solver_episodes_per_rollout_s",
)


def cost_table(results: dict) -> str:
    """Per RL arm: the median over seeds of each run's median per-iteration cost (seconds, tokens/s, episodes/s)."""
    lines = [
        "| arm | " + " | ".join(c.split("/", 1)[1] for c in COST_COLUMNS) + " |",
        "|---|" + "---|" * len(COST_COLUMNS),
    ]
    for arm in results["arms"]:
        runs = [r.get("per_iteration") or {} for r in results["runs"][arm].values()]
        if not any(runs):
            continue
        cells = []
        for col in COST_COLUMNS:
            values = [r[col] for r in runs if col in r]
            cells.append(f"{statistics.median(values):.1f}" if values else "n/a")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compute_table(results: dict) -> str:
    """Per RL arm: the median over seeds of what each run spent in all (its `compute` record, the loop's COMPUTE
    counters: the episodes its PPO batches held, the solver episodes sampled and their tokens, the proposals and
    the generator's tokens, the sandbox's executions); "" when no run has the record."""
    from selfplay.train.history import COMPUTE

    lines = [
        "| arm | runs | " + " | ".join(c.replace("_", " ") for c in COMPUTE) + " |",
        "|---|---|" + "---|" * len(COMPUTE),
    ]
    for arm in results["arms"]:
        runs = [r["compute"] for r in results["runs"][arm].values() if r.get("compute")]
        if runs:
            cells = [f"{statistics.median(r.get(col, 0) for r in runs):.0f}" for col in COMPUTE]
            lines.append(f"| {arm} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def paired_table(results: dict) -> str:
    """Per RL run: the paired split's change against the warm start, paired over tasks (`paired_delta`), for the
    whole split and each of its levels."""
    split = split_of(results)
    lines = [
        f"{split.capitalize()} split against the warm start, paired over tasks (bootstrap 95 % interval over tasks):",
        "",
        "| arm | seed | tasks | metric | warm start | after | change [95 % CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, by_seed in results["paired_test"].items():
        for seed, by_group in by_seed.items():
            for group, by_metric in by_group.items():
                for metric, d in by_metric.items():
                    what = metric if group == "all" else f"{metric}, {group}"
                    lines.append(
                        f"| {arm} | {seed} | {d['tasks']} | {what} | {d['before']:.3f} | {d['after']:.3f} | "
                        f"{d['delta']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] |"
                    )
    return "\n".join(lines)


def _cell(x, fmt="{:.3f}") -> str:
    """A table cell: the figure formatted, or "-" where the run has none."""
    return "-" if x is None else fmt.format(x)


WINDOW_FIGURES = (
    "validity",
    "generator_in_band",
    "generator_batch_share",
    "solver_in_band",
    "level",
    "generator_reward",
)


def window_figures(history: list[dict], window: int = 10) -> list[dict]:
    """A run's history cut into consecutive windows of `window` iterations (the last one may be shorter): per
    window its first and last step and the mean of each of WINDOW_FIGURES (None where no iteration had it). The
    first and the last window are the closing summary's first and last iterations when the run is a multiple of
    `window` long."""
    out = []
    for i in range(0, len(history), window):
        chunk = history[i : i + window]
        row: dict = {"first": chunk[0]["step"], "last": chunk[-1]["step"]}
        for key in WINDOW_FIGURES:
            values = [h[key] for h in chunk if h.get(key) is not None]
            row[key] = statistics.fmean(values) if values else None
        out.append(row)
    return out


def window_table(results: dict, window: int = 10) -> str:
    """Per RL run longer than two windows: the means over each window of `window` iterations (`window_figures`),
    how the figures moved over a long run rather than their mean from `from_iteration` on."""
    lines = [
        f"Per RL run longer than {2 * window} iterations, means over each {window} iterations:",
        "",
        "| arm | seed | iterations | validity | generator in band | generator share (batch) | solver in band | "
        "level | generator reward |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in results["arms"]:
        for seed, run in results["runs"][arm].items():
            history = run.get("history") or []
            if arm == "warmstart" or len(history) <= 2 * window:
                continue
            for w in window_figures(history, window):
                lines.append(
                    f"| {arm} | {seed} | {w['first']}-{w['last']} | {_cell(w['validity'])} | "
                    f"{_cell(w['generator_in_band'])} | {_cell(w['generator_batch_share'])} | "
                    f"{_cell(w['solver_in_band'])} | {_cell(w['level'], '{:.2f}')} | "
                    f"{_cell(w['generator_reward'], '{:+.3f}')} |"
                )
    return "\n".join(lines) if len(lines) > 4 else ""  # a title, a blank line and the header: no run


def later_table(results: dict) -> str:
    """Per RL run: the means from iteration `from_iteration` on (`later_figures`)."""
    start = results.get("from_iteration", 10)
    lines = [
        f"Per RL run, means from iteration {start} on:",
        "",
        "| arm | seed | iterations | parse | validity | generator in band | generator never / always solved | "
        "generator share (mixer / batch) | solver in band | level | longest collapse alarm | "
        "generator reward, first -> last ten |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in results["arms"]:
        for seed, run in results["runs"][arm].items():
            f = run.get("from_iteration") or {}
            if not f:
                continue
            reward = "-" if f["reward_first"] is None else f"{f['reward_first']:+.3f} -> {f['reward_last']:+.3f}"
            lines.append(
                f"| {arm} | {seed} | {f['iterations']} | {_cell(f.get('parse_rate'))} | "
                f"{_cell(f['validity'])} | {_cell(f['generator_in_band'])} | "
                f"{_cell(f.get('generator_never_solved'))} / {_cell(f.get('generator_always_solved'))} | "
                f"{_cell(f['generator_share'])} / "
                f"{_cell(f['generator_batch_share'])} | {_cell(f['solver_in_band'])} | "
                f"{_cell(f['level'], '{:.2f}')} | {f['longest_collapse_alarm']} | {reward} |"
            )
    return "\n".join(lines)


def paired_arms_table(results: dict) -> str:
    """Every two arms on the paired split, paired over the seeds and tasks both ran (`seed_task_delta`)."""
    split = split_of(results)
    lines = [
        f"Arm against arm on the {split} split, paired over seeds and tasks (bootstrap 95 % interval, "
        "uncorrected for the number of pairs; what it resamples follows the design):",
        "",
        "| B - A | seeds | tasks | metric | A | B | B - A [95 % CI] | resamples |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, by_metric in results["paired_arms"].items():
        for metric, d in by_metric.items():
            lines.append(
                f"| {name} | {d['seeds']} | {d['tasks']} | {metric} | {d['before']:.3f} | {d['after']:.3f} | "
                f"{d['delta']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] | "
                f"{d.get('design', 'nested')} |"
            )
    return "\n".join(lines)


PLAN_FILE = "plan.json"  # OUT/plan.json: the comparison's primary metric, split and baseline, declared before its runs


def declare_plan(out: Path, metric: str | None, split: str, baseline: str | None, arms: Sequence[str]) -> dict | None:
    """The comparison's plan: written to OUT/plan.json by its first run, and held to afterwards.

    `metric` None declares nothing (every figure of the report is then exploratory) and takes the plan already in
    OUT, if any. A plan that differs from the one written before the runs raises ValueError naming the key: a
    primary figure is reported only as it was declared."""
    path = out / PLAN_FILE
    before = json.loads(path.read_text()) if path.exists() else None
    if metric is None:
        return before
    if metric not in METRICS:
        raise ValueError(f"--primary must be one of {', '.join(METRICS)}, got {metric!r}")
    base = baseline or ("warmstart" if "warmstart" in arms else arms[0])
    if base not in arms:
        raise ValueError(f"--baseline {base}: not one of the arms ({', '.join(arms)})")
    plan = {"metric": metric, "split": split, "baseline": base, "family": [arm for arm in arms if arm != base]}
    if before is not None:
        changed = [key for key in ("metric", "split", "baseline") if before.get(key) != plan[key]]
        if changed:
            key = changed[0]
            raise ValueError(
                f"the comparison in {out} declared {key} {before.get(key)!r} before its runs "
                f"({path}); it cannot report {plan[key]!r} as primary"
            )
        return before
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=2, sort_keys=True) + "\n")
    return plan


CODE_FILE = "code.json"  # OUT/code.json: the code the comparison's runs ran, written by its first start


def hold_code(out: Path, current: dict, allow_change: bool = False) -> list[dict]:
    """The code versions a comparison has run under, oldest first. Its first start writes OUT/code.json; a later
    start (a resume, more seeds) under other code (another commit, or other uncommitted changes) raises ValueError
    naming both, so that one comparison's arms and seeds do not run different code unseen, unless `allow_change`,
    which appends the new version to the file (the report's Code line then shows which run ran which)."""
    path = out / CODE_FILE
    versions = json.loads(path.read_text()) if path.exists() else []
    if versions and versions[-1] == current:
        return versions
    if versions and not allow_change:
        first, last = versions[-1], current

        def name(code: dict) -> str:
            commit = (code.get("commit") or "no git")[:12]
            return commit + (f" with uncommitted changes {code['diff']}" if code.get("dirty") else "")

        raise ValueError(
            f"the comparison in {out} ran under {name(first)} ({path}); this start runs {name(last)}: run it from a "
            f"checkout of that code (git worktree add DIR {(first.get('commit') or 'COMMIT')[:12]}), or give "
            "--allow-code-change to go on under this code, recorded"
        )
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([*versions, current], indent=2, sort_keys=True) + "\n")
    return [*versions, current]


def primary_figures(results: dict, plan: dict, n_boot: int = 4000) -> dict:
    """Each arm of the plan's family against its baseline on the declared metric and split, paired over seeds and
    tasks, the interval corrected for the family's size k (Bonferroni: each at 1 - 0.05 / k, so that together
    they hold 95 %)."""
    if plan["split"] != split_of(results):
        raise ValueError(f"the plan declared the {plan['split']} split; these runs are paired on {split_of(results)}")
    runs, base = results["runs"], plan["baseline"]
    family = [arm for arm in plan["family"] if arm in runs]
    rows = {}
    for arm in family:
        pairs = {
            s: (runs[base][s]["test_per_task"], run["test_per_task"])
            for s, run in runs[arm].items()
            if s in runs.get(base, {}) and run.get("test_per_task") and runs[base][s].get("test_per_task")
        }
        if pairs:
            rows[f"{arm} - {base}"] = seed_task_delta(pairs, plan["metric"], n_boot, k=max(len(family), 1))
    return {**plan, "k": max(len(family), 1), "rows": rows}


def primary_table(results: dict) -> str:
    """The declared comparison, first in the report."""
    p = results["primary"]
    lines = [
        f"Primary (declared before the runs): {p['metric']} on the {p['split']} split, each arm against "
        f"{p['baseline']}, paired over seeds and tasks; intervals at {100 * (1 - 0.05 / p['k']):.2f} % each "
        f"(95 % for the family of {p['k']}, Bonferroni):",
        "",
        "| B - A | seeds | tasks | A | B | B - A [CI] | resamples |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, d in p["rows"].items():
        lines.append(
            f"| {name} | {d['seeds']} | {d['tasks']} | {d['before']:.3f} | {d['after']:.3f} | "
            f"{d['delta']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] | {d['resamples']} |"
        )
    return "\n".join(lines)


def write_report(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plan = results.get("plan") or declare_plan(out, None, split_of(results), None, results["arms"])
    if plan:
        results["plan"], results["primary"] = plan, primary_figures(results, plan)
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    tables = (
        [primary_table(results)]
        if results.get("primary")
        else [
            "No primary metric was declared before the runs (`selfplay compare --primary METRIC`): every interval "
            "below is exploratory."
        ]
    )
    tables += [line for line in (warm_starts_line(results), code_line(results), variants_line(results)) if line]
    tables += [markdown_table(results, m) for m in METRICS]
    if results.get("summary_test_by_level"):
        tables.append(markdown_table(results, "pass@1_greedy", "summary_test_by_level"))
    if results.get("paired_test"):
        tables.append(paired_table(results))
    if results.get("paired_arms"):
        tables.append(paired_arms_table(results))
    if any(r.get("from_iteration") for by_seed in results["runs"].values() for r in by_seed.values()):
        tables.append(later_table(results))
    windows = window_table(results)
    if windows:
        tables.append(windows)
    tables.append("Per iteration (medians):\n\n" + cost_table(results))
    spent = compute_table(results)
    if spent:
        tables.append("Spent per run in all (medians over seeds):\n\n" + spent)
    (out / "results.md").write_text("\n\n".join(tables) + "\n")
    plot(results, out / "compare.png")


SEED_STYLES = ("-", "--", ":", "-.")  # plot: one line style per seed (seed % 4), one colour per arm


def first_label(ax, arm: str) -> str:
    """A legend entry for an arm's first line on `ax` only (matplotlib leaves out labels starting with "_")."""
    return f"_{arm}" if any(line.get_label() == arm for line in ax.lines) else arm


def plot(results: dict, path: Path) -> Path:
    """Left: held-out greedy pass@1 by split, one bar per arm (mean over seeds) with each seed as a dot.
    Then, per RL arm and seed over iterations: the paired split's greedy (o) and sampled (x) pass@1 at each held-out
    evaluation, the solver's pass rate on its training batch, the procedural level (the curriculum's schedule or
    the mixer's choice), the generator's validity rate, the share of the solver's tasks in band (solved by some but
    not all of their answers), the share of the generator's valid proposals in band, and the generator's share of
    the solver's batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, arms = results["summary"], results["arms"]
    splits = sorted({s for arm in summary.values() for s in arm}, key=lambda s: (s != TEST_SPLIT, s))
    fig, grid = plt.subplots(2, 4, figsize=(26, 9))
    axes = grid.ravel()
    ax = axes[0]
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        xs = [j + (i - (len(arms) - 1) / 2) * width for j in range(len(splits))]
        cells = [summary.get(arm, {}).get(s, {}).get("pass@1_greedy") for s in splits]
        ax.bar(
            xs,
            [c["mean"] if c else 0 for c in cells],
            width,
            label=arm,
            yerr=[c["sd"] if c else 0 for c in cells],
            capsize=3,
            alpha=0.8,
        )
        for x, c in zip(xs, cells):
            if c:
                ax.plot([x] * len(c["values"]), c["values"], "k.", markersize=4)
    ax.set_xticks(range(len(splits)))
    ax.set_xticklabels(splits, rotation=20)
    ax.set_ylabel("greedy pass@1 (mean ± sd over seeds)")
    ax.set_title("held-out pass@1 after training")
    ax.legend()
    ax = axes[1]
    for arm in arms:
        for seed, run in results["runs"][arm].items():
            curve = run.get("test_curve") or {}
            for metric, marker in (("pass@1_greedy", "o"), ("pass@1", "x")):
                pts = [(int(k), v[metric]) for k, v in curve.items() if metric in v]
                if pts:
                    ax.plot(
                        *zip(*pts),
                        marker=marker,
                        color=f"C{arms.index(arm)}",
                        alpha=0.7,
                        linestyle=SEED_STYLES[int(seed) % 4],
                        label=first_label(ax, arm),
                    )
    ax.set_title(f"held-out {split_of(results)} pass@1 at each evaluation (o greedy, x sampled)")
    ax.set_xlabel("iteration")
    if ax.lines:
        ax.legend(fontsize=7)
    for ax, key, title in (
        (axes[2], "solve_rate", "solver pass rate on its training batch"),
        (axes[3], "level", "procedural level"),
        (axes[4], "validity", "generator validity rate"),
        (axes[5], "solver_in_band", "solver's tasks in band (0 < p < 1)"),
        (axes[6], "generator_in_band", "generator's valid proposals in band"),
        (axes[7], "generator_batch_share", "generator's share of the solver batch"),
    ):
        drawn = False
        for arm in arms:
            for seed, run in results["runs"][arm].items():
                pts = [(h["step"], h[key]) for h in run["history"] if h.get(key) is not None]
                if pts:
                    ax.plot(
                        *zip(*pts),
                        label=first_label(ax, arm),
                        alpha=0.7,
                        color=f"C{arms.index(arm)}",
                        linestyle=SEED_STYLES[int(seed) % 4],
                    )
                    drawn = True
        ax.set_title(title)
        ax.set_xlabel("iteration")
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    seeds = sorted({int(seed) for by_seed in results["runs"].values() for seed in by_seed})
    fig.suptitle(
        "colour: arm; line style: seed (" + ", ".join(f"{SEED_STYLES[s % 4]} {s}" for s in seeds) + ")", fontsize=9
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
