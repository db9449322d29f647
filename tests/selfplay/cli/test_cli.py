"""The console entry point: what a run prints that is not the project's own."""

from __future__ import annotations

import subprocess
import sys

# an answer a small model writes: valid Python 3.11, but `1if` raises "SyntaxWarning: invalid decimal literal"
ANSWER = "def f(x):\n    return 1if x else 0\n"
PARSE = f"from solver.parse import extract_code; r = extract_code({ANSWER!r}); assert r.ok, r"


def _stderr(prelude: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-c", prelude + PARSE], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_model_written_code_raises_no_syntax_warning_on_the_console():
    assert "SyntaxWarning" in _stderr("")  # without the CLI's filter the parse is noisy
    assert "SyntaxWarning" not in _stderr("from selfplay.cli import quiet_model_code; quiet_model_code(); ")


def test_the_project_s_own_warnings_still_show():
    code = (
        "from selfplay.cli import quiet_model_code; quiet_model_code(); compile('x = 1if 1 else 0', 'mine.py', 'exec')"
    )
    proc = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=120)
    assert "SyntaxWarning" in proc.stderr


def test_train_with_no_config_runs_the_first_run_and_a_first_word_with_a_sign_is_an_override():
    import argparse

    from selfplay.cli.train import configure, train_args
    from selfplay.runtime.config import FIRST_RUN_CONFIG, load_config

    parser = argparse.ArgumentParser()
    configure(parser)
    first = str(FIRST_RUN_CONFIG)
    assert train_args(parser.parse_args([])) == (first, [])
    assert train_args(parser.parse_args(["run.dir=x", "train.steps=2"])) == (first, ["run.dir=x", "train.steps=2"])
    assert train_args(parser.parse_args(["configs/tiny.yaml", "train.steps=2"])) == (
        "configs/tiny.yaml",
        ["train.steps=2"],
    )
    cfg = load_config(first)  # the pretrained world, RL on a fixed set, a held-out figure before and after
    assert (cfg.model.name_or_path, cfg.train.mode, cfg.eval.tasks_per_split) == ("smollm2-135m-instruct", "fixed", 200)
