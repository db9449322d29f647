"""`selfplay bench ppo`: generation and one PPO update on the tiny shape, per thread count, one JSON row each
(figures are never asserted beyond being measured: tests time nothing)."""

import json

import pytest

from tests.conftest import selfplay


@pytest.mark.slow  # measured at 13 s (torch and transformers imported, two models built)
def test_bench_ppo_measures_each_thread_count_and_prints_the_ratio(tmp_path):
    out = tmp_path / "ppo.json"
    args = "--batch 2 --prompt-len 4 --response-len 4 --repeats 1 --threads 1 2 --json".split()
    proc = selfplay("bench", "ppo", *args, str(out), timeout=300)
    rows = json.loads(out.read_text())
    assert [r["threads"] for r in rows] == [1, 2] and "ppo step speed, threads=2 vs threads=1" in proc.stdout
    for r in rows:
        assert r["batch"] == 2 and r["response_len"] == 4 and r["generate_tokens_per_s"] > 0
        assert r["ppo_step_tokens_per_s"] == pytest.approx(
            r["batch"] * r["response_len"] / (r["generate_s_median"] + r["update_s_median"])
        )


def test_bench_ppo_refuses_a_batch_of_one_in_one_line():
    proc = selfplay("bench", "ppo", "--batch", "1", check=False, timeout=120)
    assert proc.returncode == 2 and "--batch must be >= 2" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
