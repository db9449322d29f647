"""vLLM engines on 2 real ranks (torchrun, gloo, CPU): each rank's two agents sample their own prompts with their own
engines (the solver's in the rank's process, the generator's in a child process: one engine per process), take a PPO
step (the solver under DDP, the generator under DeepSpeed ZeRO-2) on the trainer's
process group, and the engines then score tokens as the updated trainer does, on every rank
(tests/selfplay/distributed/vllm_ranks.py runs on each rank)."""

import json
import os
from pathlib import Path

import pytest

from tests.selfplay.distributed.test_distributed import two_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.vllm, pytest.mark.slow]
SCRIPT = Path(__file__).with_name("vllm_ranks.py")
REPO = Path(__file__).resolve().parents[3]
GAP_TOL = 1e-4  # as tests/selfplay/rollout/test_engine.py: float32 engine vs float32 trainer


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import vllm  # noqa: F401 - never skipped: a missing vLLM fails these tests

    out = tmp_path_factory.mktemp("vllm_ranks")
    two_ranks(
        [str(SCRIPT), str(out)],
        timeout=600,
        env={"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in (0, 1)]


def test_each_rank_has_its_own_engines_beside_the_trainers_group(ranks):
    for r in ranks:
        assert r["world"] == 2 and r["backend"] == "gloo"  # the trainer's group, as torchrun made it
        assert r["all_reduce"] == 3.0  # and it still reduces over both ranks after the engines were built
        assert (r["vllm_world"], r["vllm_tp"], r["vllm_dp"]) == (2, 1, 1)  # vLLM: external data parallel, TP 1
        assert set(r["agents"]) == {"solver", "generator"}  # two engines on each rank (one in its process)


def test_engines_sample_each_ranks_own_prompts_with_the_trainers_log_probs(ranks):
    for name in ("solver", "generator"):
        a, b = (r["agents"][name] for r in ranks)
        assert a["answers"] != b["answers"]  # each rank its own prompts and seed
        for r in (a, b):
            assert all(r["answers"]) and r["gap_sampled"] < GAP_TOL and r["gap_fixed_before"] < GAP_TOL


def test_after_a_ppo_step_every_ranks_engine_holds_the_updated_weights(ranks):
    for name in ("solver", "generator"):
        a, b = (r["agents"][name] for r in ranks)
        assert a["checksum"] == b["checksum"]  # DDP / ZeRO-2 kept the trainers identical
        for r in (a, b):
            assert r["weight_sync_s"] > 0
            assert r["gap_fixed_after"] < GAP_TOL, (name, r["gap_fixed_after"])
            assert r["moved"] > 100 * GAP_TOL, (name, r["moved"])  # the update changed what the engine scores
            assert r["gap_sampled_after"] < GAP_TOL  # answers after the sync: no stale weights or prefix cache
