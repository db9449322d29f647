"""The generator probe on a finished run (`--load`), with the generator from another checkpoint (`--generator-from`):
two generators against one solver (smoke config, real models and sandbox)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from selfplay.models.agent import load_agent_parts
from selfplay.runtime.distributed import param_checksum
from tests.conftest import REPO, SMOKE, copy_run, selfplay  # the warm_run fixture lives there too


def weights(checkpoint, agent: str) -> str:
    model, _, _ = load_agent_parts(checkpoint / agent)
    return param_checksum(model.policy)["sha256"][:16]


def probe(run, *args):
    return subprocess.run(
        [sys.executable, "-m", "selfplay.bench.generator_probe", SMOKE[0], str(run), *args, *SMOKE[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_a_run_probed_with_its_warm_starts_generator_against_its_own_solver(warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)
    selfplay("train", *SMOKE, f"run.dir={run}", "train.steps=1", "train.checkpoint_every=1")
    step_0, step_1 = warm_run / "checkpoints" / "step_0", run / "checkpoints" / "step_1"
    assert weights(step_0, "generator") != weights(step_1, "generator")  # one PPO step moved it

    proc = probe(run, "--load", "--n", "4", "--generator-from", str(step_0))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # only the generator is taken from step_0: the run's state is not loaded from it (the corpus has grown since,
    # which a resume from step_0 would report)
    assert "resume is not exact" not in proc.stdout + proc.stderr
    summary = json.loads((run / "probe_loaded_gen_step_0.jsonl").read_text())
    assert summary["generator_weights"] == weights(step_0, "generator")
    assert summary["solver_weights"] == weights(step_1, "solver")
    assert summary["n"] == 4 and 0.0 <= summary["validity_rate"] <= summary["parse_rate"] <= 1.0
    rows = (run / "probe_loaded_rows_gen_step_0.jsonl").read_text().splitlines()
    assert len(rows) == 4

    proc = probe(run, "--load", "--n", "4")  # the run's own generator, the same solver
    assert proc.returncode == 0, proc.stderr[-3000:]
    own = json.loads((run / "probe_loaded.jsonl").read_text())
    assert own["generator_weights"] == weights(step_1, "generator")
    assert own["solver_weights"] == summary["solver_weights"]

    proc = probe(run, "--n", "4", "--generator-from", str(step_0))
    assert proc.returncode == 2 and "--generator-from goes with --load" in proc.stderr
