"""Sampling on 2 real ranks under DeepSpeed ZeRO-3 (torchrun, gloo, CPU): redraws, the tied free format, batches and
the solver's multi-turn episodes (which end earlier on one rank) make data-dependent numbers of `generate` calls,
and each generation step is a collective, so the ranks agree on their calls (`episodes._calls_in_step`,
`HFEngine.sample`); tests/selfplay/distributed/sampling_ranks.py runs on each rank."""

import json
import os
from pathlib import Path

import pytest

from tests.selfplay.distributed.test_distributed import two_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
SCRIPT = Path(__file__).with_name("sampling_ranks.py")
REPO = Path(__file__).resolve().parents[3]


def test_ranks_that_sample_different_numbers_of_times_under_zero3_finish(tmp_path):
    two_ranks(
        [str(SCRIPT), str(tmp_path)],
        timeout=600,
        env={"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )
    ranks = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["redrawn"] > 0 and ranks[1]["redrawn"] == 0, ranks  # rank 0 made calls rank 1 did not
    assert ranks[0]["answers"] == 3 and ranks[1]["answers"] == 1, ranks
    assert ranks[0]["second_stages"] > 0 and ranks[1]["second_stages"] == 0, ranks  # only rank 0 drew them
    # the solver's episodes sampled every turn on rank 0 and only the first on rank 1, which sat the others out
    assert ranks[0]["solver_answers"] == [3] * 4 and ranks[1]["solver_answers"] == [1] * 4, ranks
    assert ranks[0]["solver_actions"] == [["check"] * 3] * 4, ranks
    assert ranks[1]["solver_actions"] == [["check", "submit"]] * 4, ranks  # submitted for want of room
