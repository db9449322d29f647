"""`selfplay eval` end to end on a warm-started smoke run (real tiny models, real sandbox, real corpus).

The warm start runs once per session (the `warm_run` fixture of tests/conftest.py, shared with the training tests);
each test evaluates a copy of that run folder (evaluation writes RUN_DIR/eval/, TensorBoard events and the frozen
generator snapshot into it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from generator.schema import Task
from selfplay.cli import main
from selfplay.data.corpus import Corpus
from selfplay.eval.evaluate import BREAKDOWNS
from selfplay.runtime.tb import read_scalars
from tests.conftest import SMOKE, copy_run, selfplay

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch):
    """Tiny models gain nothing from intra-op threads and spin on a busy 2-core machine (several times slower);
    the `selfplay eval` subprocesses inherit this."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture
def run(warm_run, tmp_path) -> Path:
    """A copy of the session's warm-started smoke run (tests/conftest.py)."""
    return copy_run(warm_run, tmp_path)


def evaluate(*args):
    return selfplay("eval", *map(str, args))


def is_rate(x) -> bool:
    return isinstance(x, (int, float)) and 0.0 <= x <= 1.0


def check_pass_metrics(res: dict, k: int) -> None:
    assert is_rate(res["pass@1_greedy"]) and is_rate(res["pass@1"]) and is_rate(res[f"pass@{k}"])
    assert res["pass@1"] <= res[f"pass@{k}"] + 1e-12  # more samples never lower the unbiased estimate
    assert res["samples"] == k


@pytest.mark.slow
def test_heldout_json_table_plot_and_tensorboard(run):
    proc = evaluate(run, "--suite", "heldout", "--samples", "2")
    out = run / "eval" / "step_0.json"
    results = json.loads(out.read_text())
    assert results["step"] == 0 and results["suites"] == ["heldout"] and results["options"]["samples"] == 2
    heldout = results["heldout"]
    expected, levels = {}, {}
    for line in (run / "heldout.jsonl").read_text().splitlines():
        task = Task.from_json(line)
        split = task.params.get("eval_split", task.split)
        expected.setdefault(split, []).append(task.family)
        levels.setdefault(split, []).append(f"level_{task.level}")
    state = json.loads((run / "checkpoints" / "step_0" / "state.json").read_text())
    assert set(expected) == set(state["eval_before"]) - set(BREAKDOWNS) == set(heldout) - set(BREAKDOWNS)
    for split, families in expected.items():
        res = heldout[split]
        assert res["tasks"] == len(families)
        check_pass_metrics(res, 2)
        assert is_rate(res["tests_passed"]) and res["pass@1_greedy"] <= res["tests_passed"] + 1e-12
        by_family = heldout["by_family"][split]
        assert set(by_family) == set(families)
        assert sum(f["tasks"] for f in by_family.values()) == len(families)
        for f in by_family.values():
            check_pass_metrics(f, 2)
        by_level = heldout["by_level"][split]
        assert {lv: g["tasks"] for lv, g in by_level.items()} == {lv: levels[split].count(lv) for lv in levels[split]}
        solved = sum(g["pass@1_greedy"] * g["tasks"] for g in by_level.values())
        assert abs(solved - res["pass@1_greedy"] * res["tasks"]) < 1e-9  # the levels partition the split
        # per task: the greedy outcome and the sampled count behind the split's figures
        per_task = heldout["per_task"][split]
        assert len(per_task) == len(families) and all(n == 2 and 0 <= c <= n for _, n, c in per_task.values())
        assert sum(g for g, _, _ in per_task.values()) == round(res["pass@1_greedy"] * res["tasks"])
        assert sum(c / n for _, n, c in per_task.values()) / len(per_task) == pytest.approx(res["pass@1"])
        assert f"held-out {split}" in proc.stdout  # a table row per split
    assert results["heldout_over_time"]["test"] == [[0, state["eval_before"]["test"]["pass@1_greedy"]]]
    assert results["validity_over_time"] == {"by_step": [], "mean": None, "last": None}  # no iterations yet
    assert (run / "eval" / "step_0.png").read_bytes()[:8] == PNG_MAGIC
    scalars = read_scalars(run)
    # the warm start logged its own evaluation of step 0 under the same tags; this one is added beside it
    assert (0, pytest.approx(heldout["test"]["pass@1_greedy"])) in scalars["eval/heldout/test/pass@1_greedy"]
    # sampling is seeded (run.seed): evaluating the same weights again gives the same samples, task by task
    evaluate(run, "--suite", "heldout", "--samples", "2")
    again = json.loads(out.read_text())["heldout"]
    assert again["per_task"] == heldout["per_task"]
    assert all(again[s]["samples_sha1"] == heldout[s]["samples_sha1"] for s in expected)
    evaluate(run, "--suite", "heldout", "--samples", "2", "--seed", "1")  # another seed, other samples
    other = json.loads(out.read_text())["heldout"]
    assert all(other[s]["samples_sha1"] != heldout[s]["samples_sha1"] for s in expected)
    # another sampling temperature: other samples, recorded in the results, kept out of the run's curves
    tagged = len(read_scalars(run)["eval/heldout/test/pass@1"])
    evaluate(run, "--suite", "heldout", "--samples", "2", "--temperature", "0.5")
    cooler = json.loads(out.read_text())
    assert cooler["options"]["temperature"] == 0.5
    assert all(cooler["heldout"][s]["samples_sha1"] != heldout[s]["samples_sha1"] for s in expected)
    assert len(read_scalars(run)["eval/heldout/test/pass@1"]) == tagged


@pytest.mark.slow
def test_humaneval_on_a_checkpoint_folder(run, tmp_path):
    out = tmp_path / "he" / "results.json"
    evaluate(run / "checkpoints" / "step_0", "--suite", "humaneval", "--limit", "5", "--samples", "2", "--json", out)
    he = json.loads(out.read_text())["humaneval"]
    assert he["problems"] == 5
    check_pass_metrics(he, 2)
    assert set(he["greedy_solved"]) <= {f"HumanEval/{i}" for i in range(5)}
    assert he["pass@1_greedy"] == len(he["greedy_solved"]) / 5
    assert out.with_suffix(".png").read_bytes()[:8] == PNG_MAGIC


def add_generated_tasks(run: Path, n: int) -> list[Task]:
    """Store n tasks as the loop stores valid generator proposals (source "generator", a creation step, a
    measured difficulty for most): procedural training tasks re-labelled, so the solver's answers are real."""
    with Corpus(run, create=False) as corpus:
        base = corpus.query(split="train", limit=n)
        tasks = [
            Task.from_dict(
                dict(
                    t.to_dict(),
                    id=t.id + "g",
                    source="generator",
                    family="generator/" + t.family,
                    created_step=1 + i // 3,
                    difficulty=None,
                    fingerprints={"ast": f"prog{i % 4}"},
                )
            )
            for i, t in enumerate(base)
        ]
        corpus.insert_many(tasks, dedup=False)
        for i, t in enumerate(tasks[:-1]):  # the last one never measured
            corpus.update_difficulty(t.id, solve_rate=(i % 3) / 2, n_samples=2, step=t.created_step)
    return tasks


@pytest.mark.slow
def test_generator_suite(run):
    tasks = add_generated_tasks(run, 6)
    proc = evaluate(run, "--suite", "generator", "--limit", "3", "--samples", "2")
    gen = json.loads((run / "eval" / "step_0.json").read_text())["generator"]
    assert gen["validity"] == {"by_step": [], "mean": None, "last": None}  # a warm start has no iterations yet
    rates = gen["solve_rates"]
    assert rates["measured"] == 5 == sum(rates["histogram"]["counts"])
    assert rates["never_solved"] == pytest.approx(2 / 5) and rates["learnable"] == pytest.approx(2 / 5)
    assert rates["always_solved"] == pytest.approx(1 / 5)
    div = gen["diversity"]
    assert div["tasks"] == 6 and div["distinct_programs"] == 4
    assert [(p["step"], p["tasks"]) for p in div["by_step"]] == [(1, 3), (2, 3)]
    assert sum(div["families"].values()) == 6 and all(f.startswith("generator/") for f in div["families"])
    snap = gen["snapshot"]
    assert snap["tasks"] == 3
    check_pass_metrics(snap, 2)
    frozen = [Task.from_json(line).id for line in (run / "generator_snapshot.jsonl").read_text().splitlines()]
    assert sorted(frozen) == sorted(t.id for t in tasks)  # eval.generator_snapshot (64) > 6: all of them
    assert "generated snapshot" in proc.stdout and "generator: validity" in proc.stdout


# ---- bad input: one line on stderr, exit status 2 ------------------------------------------------------------
def one_line_error(capsys, *argv) -> str:
    assert main(["eval", *map(str, argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("selfplay eval: error: "), err
    return err


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    assert "no such folder" in one_line_error(capsys, tmp_path / "missing")
    assert "holds no checkpoint" in one_line_error(capsys, tmp_path)
    assert "unknown suite 'everything'" in one_line_error(capsys, tmp_path, "--suite", "everything")
    assert "--samples must be >= 1" in one_line_error(capsys, tmp_path, "--samples", "0")
    assert "--temperature must be > 0" in one_line_error(capsys, tmp_path, "--temperature", "0")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_7\n")
    assert "step_7, which is missing" in one_line_error(capsys, tmp_path)
    step = tmp_path / "checkpoints" / "step_7"
    step.mkdir()
    (step / "state.json").write_text("{}")
    assert "no solver/ folder" in one_line_error(capsys, step)
    (step / "solver").mkdir()
    assert "holds no run config" in one_line_error(capsys, step)
    (step / "state.json").write_text("{not json")
    assert "cannot read" in one_line_error(capsys, tmp_path)
    (step / "state.json").write_text(json.dumps({"step": 7, "config": {"train": {"stepz": 3}}}))
    assert "config does not fit" in one_line_error(capsys, step)
    (step / "state.json").write_text(json.dumps({"step": 7, "config": {}}))
    assert "name it *.png" in one_line_error(capsys, step, "--plot", tmp_path / "x.svg")
    assert "is a folder" in one_line_error(capsys, step, "--json", tmp_path)
    assert "--engine nonesuch: rollout.engine must be one of" in one_line_error(capsys, step, "--engine", "nonesuch")
    with pytest.raises(SystemExit) as exc:
        main(["eval", str(step), "--limit", "many"])
    assert exc.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.vllm
def test_the_solver_is_sampled_by_the_engine_the_run_trained_with_or_the_one_named(run):
    """`--engine vllm` samples the checkpoint's solver with the vLLM engine built from its folder (as the run's own
    evaluation does): the results name it, and its greedy verdicts are Hugging Face generate's on the same tasks;
    without `--engine` the run's rollout.engine (the smoke run's: hf) samples."""
    evaluate(run, "--suite", "heldout", "--samples", "1", "--limit", "4", "--json", run / "hf.json")
    evaluate(run, "--suite", "heldout", "--samples", "1", "--limit", "4", "--engine", "vllm", "--json", run / "v.json")
    hf, vllm = (json.loads((run / name).read_text()) for name in ("hf.json", "v.json"))
    assert (hf["engine"], hf["options"]["engine"]) == ("hf", "hf")
    assert (vllm["engine"], vllm["options"]["engine"]) == ("vllm", "vllm")
    greedy = {
        name: {t: row[0] for split in r["heldout"]["per_task"].values() for t, row in split.items()}
        for name, r in (("hf", hf), ("vllm", vllm))
    }
    assert len(greedy["hf"]) >= 10 and greedy["vllm"] == greedy["hf"]  # the same tasks, the same verdicts


def test_heldout_programs_are_reserved_before_the_warm_start_corpus(warm_run):
    """The held-out tasks are drawn first and reserved: no corpus task repeats a held-out program or behaviour."""
    heldout = [Task.from_json(line) for line in (warm_run / "heldout.jsonl").read_text().splitlines()]
    corpus = Corpus(warm_run / "corpus.sqlite", create=False)
    try:
        assert corpus.reserved_count() == len({t.id for t in heldout}) > 0
        stored = corpus.query()
        assert stored and not {t.fingerprints["ast"] for t in heldout} & {t.fingerprints["ast"] for t in stored}
        assert not {t.fingerprints["behaviour"] for t in heldout} & {t.fingerprints["behaviour"] for t in stored}
        assert all(corpus.find_duplicate("probe", t.fingerprints["ast"], None) == t.id for t in heldout[:5])
    finally:
        corpus.close()


def test_validation_split_is_drawn_like_test_and_apart_from_everything(tmp_path):
    """eval.splits=[val]: a validation split of training-distribution tasks, drawn with the suite and reserved like
    it, disjoint from the test split; the test split is the one drawn without it; each evaluation runs only the
    splits eval.splits names; a split the run's file lacks is a one-line error, never drawn after the corpus."""
    import sandbox
    from selfplay.eval.evaluate import TEST_SPLIT, VAL_SPLIT, heldout_tasks, suite_size_note
    from selfplay.runtime.config import load_config
    from selfplay.runtime.errors import UserError

    n = ["eval.tasks_per_split=12", "tasks.heldout_splits=[deeper]"]
    with_val = load_config(overrides=n + ["eval.splits=[val]"])
    plain = load_config(overrides=n)
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb:
        with Corpus(tmp_path / "a.sqlite") as corpus:
            only_val = heldout_tasks(tmp_path / "a", with_val, sb, corpus)
            reserved = corpus.reserved_count()
        with Corpus(tmp_path / "b.sqlite") as corpus:
            default = heldout_tasks(tmp_path / "b", plain, sb, corpus)
        assert list(only_val) == [VAL_SPLIT] and list(default) == [TEST_SPLIT, "deeper"]
        every = heldout_tasks(tmp_path / "a", load_config(overrides=n + ["eval.splits=[test,val,deeper]"]), sb)
        with pytest.raises(UserError, match="eval.splits: val is not in"):
            heldout_tasks(tmp_path / "b", with_val, sb)
    val, test = every[VAL_SPLIT], every[TEST_SPLIT]
    assert len(val) == len(test) == 12 and reserved == 36
    assert {t.split for t in val} == {"train"} and {t.params["eval_split"] for t in val} == {VAL_SPLIT}
    assert not {t.fingerprints["ast"] for t in val} & {t.fingerprints["ast"] for t in test}
    assert [t.id for t in test] == [t.id for t in default[TEST_SPLIT]]  # drawing val leaves test as it was
    assert [t.id for t in every["deeper"]] == [t.id for t in default["deeper"]]
    with pytest.raises(UserError, match="eval.splits: 'heldout_types' is not a split"):
        load_config(overrides=n + ["eval.splits=[heldout_types]"])
    # the suite's size is fixed at its first draw: a later eval.tasks_per_split is said to be ignored, not silently
    assert suite_size_note(every, load_config(overrides=n)) is None
    note = suite_size_note(every, load_config(overrides=n[1:] + ["eval.tasks_per_split=20"]))
    assert "eval.tasks_per_split=20" in note and "12 test, 12 val" in note


def test_a_run_whose_heldout_file_lacks_a_split_it_evaluates_stops_before_training(warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)
    proc = selfplay("train", *SMOKE, "eval.splits=[val]", "train.steps=1", f"run.dir={run}", check=False)
    assert proc.returncode == 2 and "eval.splits: val is not in" in proc.stderr
    assert not (run / "checkpoints" / "step_1").exists()
