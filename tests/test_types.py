"""The packages held to their annotations pass mypy, as configured in pyproject.toml ([tool.mypy]: which files,
and the third-party packages that ship no type information)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # measured at 30-90 s (torch's and numpy's types are read)
def test_mypy_finds_nothing():
    assert shutil.which("mypy"), "mypy is missing: pip install -e '.[test]'"
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout
