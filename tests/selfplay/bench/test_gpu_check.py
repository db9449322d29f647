"""`selfplay bench gpu-check` through slurm/gpu_check.sh, on the CPU with the tiny shape: the check a GPU machine runs
cannot rot. Every line must PASS and the JSON must hold every line's figures, finite (figures are never compared
with a bound: tests time nothing)."""

import importlib.util
import json
import math
import subprocess

import pytest

from selfplay.bench.gpu_check import LINES
from tests.conftest import REPO, selfplay

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def numbers(value):
    """Every number inside a JSON value."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from numbers(v)


def run_script(*args, env=None):
    return subprocess.run(
        ["bash", "slurm/gpu_check.sh", *args], cwd=REPO, capture_output=True, text=True, timeout=600, env=env
    )


@pytest.mark.slow  # measured over 9 s (two DeepSpeed engines start): out of the fast subset
@pytest.mark.parametrize("deepspeed", [True, False], ids=["deepspeed", "torch"])
def test_tiny_check_passes_every_line_and_writes_finite_figures(tmp_path, deepspeed):
    import os

    env = {**os.environ, "CHECK_ARGS": "" if deepspeed else "--no-deepspeed"}
    proc = run_script("--tiny", str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdicts = {
        line.split()[1]: line.split()[0]
        for line in proc.stdout.splitlines()
        if line.startswith(("PASS", "FAIL", "SKIP"))
    }
    assert set(verdicts) == {*LINES, "all"}, proc.stdout
    zero3 = "PASS" if deepspeed and HAS_DEEPSPEED else "SKIP"
    assert verdicts == {**dict.fromkeys(verdicts, "PASS"), "zero3": zero3}, proc.stdout
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["passed"] is True and result["deepspeed"] is (deepspeed and HAS_DEEPSPEED)
    assert set(result["lines"]) == set(LINES) and all(x["ok"] for x in result["lines"].values())
    assert all(math.isfinite(x) for x in numbers(result)), result
    ppo, sync, ckpt = result["lines"]["ppo_step"], result["lines"]["weight_sync"], result["lines"]["checkpoint"]
    assert ppo["optimizer_steps"] == ppo["expected_steps"] == 1 and ppo["changed_matrices"] == ppo["matrices"] > 0
    assert sync["loaded"] == sync["tensors"] > 0 and sync["max_diff"] == 0
    assert ckpt["engine_max_diff"] == ckpt["hf_max_diff"] == 0 and ckpt["deepspeed"] is result["deepspeed"]
    plan = result["lines"]["plan"]
    assert plan["planned_gb"] > 0 and plan["measured_gb"] > 0 and plan["judged"] is False  # the CPU's RSS
    assert result["lines"]["generate"]["full_answers"] == result["sizes"]["gen_batch"]
    if result["deepspeed"]:
        z3 = result["lines"]["zero3"]
        assert z3["stage"] == 3 and z3["gather"] == "per parameter" and z3["loaded"] == z3["tensors"]


@pytest.mark.slow  # measured over 9 s
def test_an_agent_that_cannot_be_built_fails_its_lines_and_the_exit_status():
    """No traceback and no silent pass: each line that needs the agent says FAIL with the reason, the exit is 1."""
    proc = selfplay("bench", "gpu-check", "--tiny", "--no-deepspeed", "model.value_model=bogus", check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith(("PASS", "FAIL", "SKIP"))]
    assert proc.returncode == 1 and lines[0].startswith("PASS  shape") and lines[-1].startswith("FAIL  all")
    assert [x.split()[1] for x in lines[1:6]] == list(LINES[1:6]), proc.stdout
    assert all(x.startswith("FAIL") and "model.value_model must be one of" in x for x in lines[1:6]), proc.stdout
    assert lines[6].startswith("SKIP  zero3"), proc.stdout


def test_a_size_below_one_is_refused_in_one_line_naming_the_option():
    proc = selfplay("bench", "gpu-check", "--tiny", "--gen-batch", "0", check=False)
    assert proc.returncode != 0 and "--gen-batch must be >= 1, got 0" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_script_help_names_the_check_and_the_selfplay_flag():
    proc = run_script("--help")
    assert proc.returncode == 0 and "selfplay bench gpu-check" in proc.stdout and "--selfplay" in proc.stdout
    assert "--tiny" in proc.stdout
