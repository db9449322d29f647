"""configs/gpu_1x24gb.yaml, the one-GPU preset for a 24 GB card: it loads, its plan fits 24 GB in every phase with
room to spare (the warm start's SFT in plain torch included), the 1.5B would not fit its warm start there, and
`selfplay train` refuses a variant of it that cannot fit, naming the key."""

from __future__ import annotations

import pytest

from selfplay.runtime import memory_plan as mp
from selfplay.runtime.config import CONFIG_DIR, load_config
from selfplay.runtime.config_parts import engine_name

PRESET = CONFIG_DIR / "gpu_1x24gb.yaml"
ONE_24GB_GPU = mp.Cluster(gpus_per_node=1, nodes=1, gpu_gb=24.0)
MARGIN = 0.85  # every phase within this share of the card's 24 GB


def test_the_preset_loads_with_lora_on_both_agents_and_vllm_for_both():
    cfg = load_config(PRESET)
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-Coder-0.5B-Instruct" and cfg.model.dtype == "bfloat16"
    assert cfg.model.lora.r > 0 and set(cfg.model.lora.agents) == set(mp.AGENTS)
    assert not cfg.distributed.deepspeed
    assert [engine_name(cfg.rollout, a) for a in mp.AGENTS] == ["vllm", "vllm"] and cfg.rollout.sleep
    # the budgets of the other presets: prompts of 2,048 tokens, answers of 512
    assert cfg.warmstart.max_len == 2048 and cfg.ppo.max_new_tokens == 512
    shape = mp.model_shape(cfg.model)
    assert (shape.hidden, shape.layers, shape.vocab) == (896, 24, 151936) and 490e6 < shape.params < 500e6


def test_every_phase_after_the_warm_start_fits_one_24_gb_gpu_with_a_margin():
    """Load, rollout (both engines awake), update and evaluation, each within the margin, and the warm start fits
    (its SFT; step_0 is evaluated after it is loaded back, with the configured engines: the evaluation row,
    selfplay/train/checkpointing.py `evaluate_warm_start`)."""
    plan = mp.plan_memory(load_config(PRESET), ONE_24GB_GPU)
    assert [p.phase for p in plan.phases] == list(mp.PHASES)
    after = [p for p in plan.phases if p.phase != "warm start"]
    over = {p.phase: round(p.total / mp.GB, 1) for p in after if p.total > MARGIN * p.budget}
    assert not over, mp.format_table(plan)
    assert plan.phase("rollout").parts["vllm engines"] == 2 * 0.25 * ONE_24GB_GPU.gpu_gb * mp.GB
    warm = plan.phase("warm start")
    assert warm.fits and warm.moment != "held-out evaluation at step 0", mp.format_table(plan)


def test_the_warm_start_sft_fits_in_plain_torch_on_one_rank():
    """The warm start on one GPU, as the plan counts its SFT (answers of 1 token, so that the step-0 evaluation it
    also counts stays below it): both policies and references, one agent's fp32 gradients, masters and moments, one
    2,048-token sequence a pass, within the margin; two sequences a pass would not be."""
    short = ["ppo.max_new_tokens=1"]  # the solver's answers, which the step-0 evaluation samples
    warm = mp.plan_memory(load_config(PRESET, short), ONE_24GB_GPU).phase("warm start")
    assert warm.where == "rank 0" and warm.moment.startswith("SFT of one agent (1 of 16 sequences a pass")
    assert warm.parts["gradients"] > 0 and warm.parts["optimizer states"] > 0
    assert warm.total <= MARGIN * warm.budget, round(warm.total / mp.GB, 1)
    two = mp.plan_memory(load_config(PRESET, [*short, "warmstart.micro_batch_size=2"]), ONE_24GB_GPU)
    assert two.phase("warm start").total > MARGIN * warm.budget


def test_the_1_5b_in_its_place_cannot_warm_start_on_24_gb():
    """Why the preset's model is the 0.5B: the 1.5B's weights and SFT states alone exceed the card."""
    cfg = load_config(PRESET, ["model.name_or_path=Qwen/Qwen2.5-Coder-1.5B-Instruct"])
    plan = mp.plan_memory(cfg, ONE_24GB_GPU)
    verdict = next(v for v in plan.verdicts if v.phase == "warm start")
    assert not verdict.fits and mp.WARM_START_NEEDS in verdict.missing


@pytest.fixture
def a_24gb_gpu(monkeypatch):
    """What `selfplay train`'s check reads of the GPU, as a 24 GB card reports it (this machine may have none)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda _i: type("Props", (), {"total_memory": int(24e9)})()
    )
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "SELFPLAY_NO_MEMORY_PLAN"):
        monkeypatch.delenv(name, raising=False)


def test_train_starts_the_preset_as_written_on_a_24_gb_gpu(a_24gb_gpu, tmp_path):
    cfg = load_config(PRESET, [f"run.dir={tmp_path / 'run'}"])
    assert mp.refuse_if_it_cannot_fit(cfg) is None


def test_train_refuses_a_variant_that_cannot_fit_naming_the_key(a_24gb_gpu, tmp_path, capsys):
    """Engines at 0.45 of the card each: both awake hold 21.6 GB beside the agents, which no activation estimate
    excuses; `selfplay train` stops before any work in one line naming rollout.gpu_memory_utilization."""
    from selfplay.cli import main

    run_dir = tmp_path / "run"
    code = main(["train", str(PRESET), f"run.dir={run_dir}", "rollout.gpu_memory_utilization=0.45"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "memory plan: the rollout needs" in err and "rollout.gpu_memory_utilization" in err
    assert not run_dir.exists()
