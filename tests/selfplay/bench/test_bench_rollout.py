"""`selfplay bench rollout`: both engines on the same prompts, one JSON with each engine's figures and the ratio
(figures are never asserted: tests time nothing). Runs vLLM's CPU build for real."""

import json

import pytest

from tests.conftest import selfplay


@pytest.mark.vllm
def test_bench_rollout_runs_both_engines_and_writes_the_ratio(tmp_path):
    out = tmp_path / "bench.json"
    proc = selfplay(
        "bench",
        "rollout",
        "configs/tiny.yaml",
        "--batch",
        "2",
        "--prompt-len",
        "8",
        "--new",
        "4",
        "--repeats",
        "1",
        "--json",
        str(out),
        timeout=600,
    )
    result = json.loads(out.read_text())
    assert set(result["engines"]) == {"hf", "vllm"} and "vllm / hf tokens/s" in proc.stdout
    for name, r in result["engines"].items():
        assert r["tokens_per_s"] > 0 and r["first_token_s"] > 0, (name, r)
    assert result["engines"]["vllm"]["sync_method"] == "reload" and result["engines"]["vllm"]["weight_sync_s"] > 0
    assert result["ratio_vllm_hf"] == pytest.approx(
        result["engines"]["vllm"]["tokens_per_s"] / result["engines"]["hf"]["tokens_per_s"]
    )


def test_bench_rollout_refuses_an_unknown_shape_in_one_line(tmp_path):
    proc = selfplay("bench", "rollout", "--shape", "huge", check=False)
    assert proc.returncode != 0 and "--shape must be one of config, llama-135m" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_bench_rollout_takes_config_overrides(tmp_path):
    """key=value after CONFIG (slurm/gpu_check.sh passes its own overrides): the model shape follows them."""
    runs = {}
    for layers in (1, 2):
        out = tmp_path / f"bench_{layers}.json"
        selfplay(
            "bench",
            "rollout",
            "configs/smoke.yaml",
            f"model.n_layer={layers}",
            "--engines",
            "hf",
            "--batch",
            "1",
            "--prompt-len",
            "4",
            "--new",
            "2",
            "--repeats",
            "1",
            "--json",
            str(out),
            timeout=300,
        )
        runs[layers] = json.loads(out.read_text())
    assert set(runs[1]["engines"]) == {"hf"} and runs[2]["params_m"] > runs[1]["params_m"]
