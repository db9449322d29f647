"""`selfplay bench rollout`: the engines on the same prompts (hf, vllm in the process, vllm-child in a process of its
own), one JSON with each engine's figures and the ratios (figures are never bounded: tests time nothing). Runs vLLM's
CPU build for real."""

import json
import math

import pytest

from tests.conftest import selfplay


def tiny_bench(tmp_path, *args):
    """The bench on configs/tiny.yaml at 2 prompts of 8 tokens, 4 new tokens, one repeat: (its run, its JSON)."""
    out = tmp_path / "bench.json"
    proc = selfplay(
        "bench",
        "rollout",
        "configs/tiny.yaml",
        *args,
        *("--batch", "2", "--prompt-len", "8", "--new", "4", "--repeats", "1", "--json", str(out)),
        timeout=600,
    )
    return proc, json.loads(out.read_text())


@pytest.mark.vllm
def test_bench_rollout_runs_both_engines_and_writes_the_ratio(tmp_path):
    proc, result = tiny_bench(tmp_path)
    assert set(result["engines"]) == {"hf", "vllm"} and "vllm / hf tokens/s" in proc.stdout
    for name, r in result["engines"].items():
        assert r["tokens_per_s"] > 0 and r["first_token_s"] > 0, (name, r)
    assert result["engines"]["vllm"]["sync_method"] == "reload" and result["engines"]["vllm"]["weight_sync_s"] > 0
    assert result["ratio_vllm_hf"] == pytest.approx(
        result["engines"]["vllm"]["tokens_per_s"] / result["engines"]["hf"]["tokens_per_s"]
    )


@pytest.mark.vllm
@pytest.mark.slow  # two engine starts: measured over 9 s
def test_bench_rollout_puts_the_child_process_engine_beside_the_in_process_one(tmp_path):
    """vllm (`VLLMEngine`) and vllm-child (`ChildEngine`) through `LMAgent`: every figure finite and positive, the
    child's own memory reported, and the same greedy answers from both (the same weights and prompts), kept after
    the weight syncs: the comparison is of the same work."""
    proc, result = tiny_bench(tmp_path, "run.torch_threads=1", "--engines", "vllm", "vllm-child")
    engines = result["engines"]
    assert set(engines) == {"vllm", "vllm-child"} and "vllm-child / vllm:" in proc.stdout
    assert engines["vllm"]["engine_class"] == "VLLMEngine" and engines["vllm-child"]["engine_class"] == "ChildEngine"
    assert engines["vllm"]["sync_method"] == "reload" and engines["vllm-child"]["sync_method"] == "folder"
    for name, r in engines.items():
        for key in ("start_s", "first_token_s", "tokens_per_s", "weight_sync_s"):
            assert math.isfinite(r[key]) and r[key] > 0, (name, key, r)
        assert r["tokens_sampled"] and all(0 < n <= 2 * 4 for n in r["tokens_sampled"]), (name, r)
        assert r["greedy_kept_after_sync"], name
    assert engines["vllm"]["rss_growth_gb"] > 0
    assert 0 < engines["vllm-child"]["child_rss_gb"] <= engines["vllm-child"]["child_peak_rss_gb"]
    assert engines["vllm"]["greedy_digest"] == engines["vllm-child"]["greedy_digest"]
    assert result["greedy_same_child_vllm"] is True
    for key, ratio in result["ratio_child_vllm"].items():
        assert ratio == pytest.approx(engines["vllm-child"][key] / engines["vllm"][key]), key


def test_bench_rollout_refuses_an_unknown_shape_in_one_line(tmp_path):
    proc = selfplay("bench", "rollout", "--shape", "huge", check=False)
    assert proc.returncode != 0 and "--shape must be one of config, llama-135m" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_bench_rollout_refuses_an_unknown_engine_naming_those_it_takes():
    proc = selfplay("bench", "rollout", "--engines", "vllm", "sglang", check=False)
    assert proc.returncode != 0 and "--engines takes hf, vllm, vllm-child, got sglang" in proc.stderr


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
