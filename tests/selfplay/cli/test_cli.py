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
