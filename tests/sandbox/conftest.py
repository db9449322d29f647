"""Fixtures shared by the sandbox tests: one sandbox per backend (helpers live in sandbox_testlib.py).

The `sb` fixture is parametrised over backends; the docker half is marked `docker` and FAILS (never skips) with
the SandboxUnavailable message when Docker is not usable, so CI cannot silently lose it.
"""

from __future__ import annotations

import pytest
from sandbox_testlib import BACKENDS, open_backend


@pytest.fixture(scope="module", params=BACKENDS)
def sb(request):
    box = open_backend(request.param)
    yield box
    box.close()
