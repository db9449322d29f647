"""The whole checkout passes the linter configured in pyproject.toml (line length 120, pyflakes, syntax)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff")
    assert ruff, "ruff is missing: pip install -e '.[test]'"
    proc = subprocess.run([ruff, "check", "--no-cache", str(REPO)], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
