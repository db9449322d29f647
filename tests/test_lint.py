"""The whole checkout passes the linter and the formatter configured in pyproject.toml (line length 120, pyflakes,
syntax, import order, bugbear, pyupgrade; `ruff format`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff")
    assert exe, "ruff is missing: pip install -e '.[test]'"
    return subprocess.run([exe, *args, "--no-cache", str(REPO)], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_ruff_finds_nothing():
    proc = ruff("check")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_ruff_format_would_change_nothing():
    proc = ruff("format", "--check")
    assert proc.returncode == 0, "run `ruff format` (or pre-commit): " + proc.stdout[-4000:] + proc.stderr[-2000:]
