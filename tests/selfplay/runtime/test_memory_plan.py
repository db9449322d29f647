"""The memory plan (selfplay/runtime/memory_plan.py): exact accounting on hand-computed shapes, ZeRO's partitioning,
LoRA, the warm start's fp32 masters and micro-batches, the presets' verdicts (every configs/gpu_*.yaml on the cluster
its header names), the `selfplay plan` command, the check at `selfplay train`, and measured CPU steps."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selfplay.runtime import memory_plan as mp
from selfplay.runtime.config import CONFIG_DIR, load_config
from selfplay.runtime.errors import UserError

# hidden 4, intermediate 8, 2 blocks, 2 heads of 2, 1 KV head, vocabulary 100, tied embeddings. Per block: q 4x4,
# k 4x2, v 4x2, o 4x4, gate 4x8, up 4x8, down 8x4 = 16 + 8 + 8 + 16 + 32 + 32 + 32 = 144, two RMSNorms 8: 152;
# 2 blocks 304 + embedding 400 + final norm 4 = 708 parameters; the value head 4 + 1
TOY = mp.ModelShape("toy", hidden=4, intermediate=8, layers=2, heads=2, kv_heads=1, vocab=100, tied=True)
TOY_PARAMS, HEAD = 708, 5


def settings_for(**kw) -> mp.RunSettings:
    base = dict(
        dtype_bytes=4,
        deepspeed=False,
        zero_stage=0,
        mixed_precision=False,
        prefetch=0,
        value_model="head",
        gradient_checkpointing=False,
        lora_r=0,
        lora_layers=0,
        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        lora_agents=("solver", "generator"),
        micro_batch=2,
        mini_batch=4,
        solver_new=8,
        generator_new=8,
        prompt=8,
        sft_batch=2,
        sft_len=16,
        sft_steps=(1, 1),
        engines=("hf", "hf"),
        gpu_memory_utilization=0.3,
        sleep=True,
        solver_answers=64,
        proposals=8,
    )
    return mp.RunSettings(**{**base, **kw})


def test_toy_shape_counts_its_parameters_by_hand():
    assert TOY.block_params == 152
    assert TOY.params == TOY_PARAMS
    assert dataclasses.replace(TOY, tied=False).params == TOY_PARAMS + 400  # its own LM head
    assert dataclasses.replace(TOY, qkv_bias=True).params == TOY_PARAMS + 2 * (4 + 2 + 2)


def test_fp32_torch_adamw_bytes_are_exact():
    s = settings_for()  # float32, no DeepSpeed, one process: torch AdamW keeps m and v in fp32
    a = mp.agent_state(TOY, s, "solver", world=1)
    assert a.weights == TOY_PARAMS * 4
    assert a.critic == HEAD * 4
    assert a.trainable == TOY_PARAMS + HEAD
    assert a.gradients == (TOY_PARAMS + HEAD) * 4
    assert a.optimizer == (TOY_PARAMS + HEAD) * 8
    assert a.reference == TOY_PARAMS * 4


def test_bf16_mixed_precision_keeps_12_bytes_of_states_per_trainable_parameter():
    s = settings_for(dtype_bytes=2, deepspeed=True, zero_stage=0, mixed_precision=True)
    a = mp.agent_state(TOY, s, "solver", world=1)
    assert (a.weights, a.gradients, a.optimizer) == (TOY_PARAMS * 2, (TOY_PARAMS + HEAD) * 2, (TOY_PARAMS + HEAD) * 12)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stages_partition_states_then_gradients_then_weights(stage):
    world = 8
    s = settings_for(dtype_bytes=2, deepspeed=True, zero_stage=stage, mixed_precision=True)
    a = mp.agent_state(TOY, s, "solver", world)
    trainable = TOY_PARAMS + HEAD
    assert a.optimizer == trainable * 12 / (world if stage >= 1 else 1)
    assert a.gradients == trainable * 2 / (world if stage >= 2 else 1)
    assert a.weights == TOY_PARAMS * 2 / (world if stage >= 3 else 1)
    assert a.reference == TOY_PARAMS * 2  # plain modules on every rank, never partitioned
    assert (
        mp.agent_state(TOY, s, "solver", world, mp.PlanOptions(partition_references=True)).reference
        == TOY_PARAMS * 2 / world
    )


def test_ddp_without_deepspeed_keeps_gradient_buckets_beside_the_gradients():
    a = mp.agent_state(TOY, settings_for(), "solver", world=4)
    assert a.gradients == 2 * (TOY_PARAMS + HEAD) * 4
    assert a.optimizer == (TOY_PARAMS + HEAD) * 8  # nothing partitioned without ZeRO


def test_lora_trains_only_the_adapters():
    # r = 2 on every linear: 2 x (in + out) = 2 x (8 + 6 + 6 + 8 + 12 + 12 + 12) = 128 per block
    assert TOY.lora_params(2, settings_for().lora_targets) == 256
    assert TOY.lora_params(2, settings_for().lora_targets, top_layers=1) == 128
    assert TOY.lora_params(2, ("q_proj", "v_proj")) == 2 * 2 * ((4 + 4) + (4 + 2))
    s = settings_for(dtype_bytes=2, deepspeed=True, zero_stage=2, mixed_precision=True, lora_r=2)
    full = mp.agent_state(TOY, dataclasses.replace(s, lora_r=0), "solver", 1)
    lora = mp.agent_state(TOY, s, "solver", 1)
    assert lora.trainable == 256 + HEAD
    assert lora.optimizer == (256 + HEAD) * 12 < full.optimizer
    assert lora.gradients == (256 + HEAD) * 2
    assert lora.weights == (TOY_PARAMS + 256) * 2  # the frozen base stays, the adapters beside it
    only_solver = dataclasses.replace(s, lora_agents=("solver",))
    assert mp.agent_state(TOY, only_solver, "generator", 1).optimizer == full.optimizer


def test_lora_layers_limit_the_blocks_that_keep_activations():
    s = settings_for(lora_r=2, lora_layers=1)
    logits = s.micro_batch * (s.solver_new + 1) * TOY.vocab * mp.PPO_LOGIT_BYTES
    tokens = s.micro_batch * (s.prompt + s.solver_new)
    one_block = tokens * TOY.block_activation_bytes(4)
    assert mp.update_activations(TOY, s, "solver") == pytest.approx(one_block + logits)
    assert mp.update_activations(TOY, dataclasses.replace(s, lora_r=0), "solver") == pytest.approx(
        2 * one_block + logits
    )


def test_gradient_checkpointing_keeps_block_inputs_and_the_larger_of_logits_and_one_block():
    s = settings_for(dtype_bytes=2)
    on = dataclasses.replace(s, gradient_checkpointing=True)
    tokens = s.micro_batch * (s.prompt + s.solver_new)
    logits = s.micro_batch * (s.solver_new + 1) * TOY.vocab * mp.PPO_LOGIT_BYTES
    per_block = mp.BLOCK_BYTES_H * 4 + mp.BLOCK_BYTES_I * 8  # bf16: the constants as they stand
    assert mp.update_activations(TOY, s, "solver") == pytest.approx(tokens * per_block * 2 + logits)
    # the logits' backward is over before a block is recomputed: block inputs + the larger of the two
    inputs = tokens * 4 * 2 * 2
    assert logits > mp.RECOMPUTED_BLOCK * tokens * per_block
    assert mp.update_activations(TOY, on, "solver") == pytest.approx(inputs + logits)
    few = dataclasses.replace(TOY, vocab=2)  # a vocabulary so small that the recomputed block is the larger
    assert mp.update_activations(few, on, "solver") == pytest.approx(inputs + mp.RECOMPUTED_BLOCK * tokens * per_block)


def test_generation_counts_kv_cache_and_two_copies_of_fp32_scores():
    s = settings_for(dtype_bytes=2, prompt=10)
    kv = 3 * (10 + 5) * 2 * TOY.layers * TOY.kv_heads * TOY.dh * 2
    assert mp.generation_bytes(TOY, s, batch=3, new=5) == kv + 2 * 3 * 5 * TOY.vocab * 4


def test_known_shapes_match_the_transformers_models():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    for shape in mp.KNOWN_SHAPES.values():
        conf, model = (Qwen2Config, Qwen2ForCausalLM) if shape.qkv_bias else (LlamaConfig, LlamaForCausalLM)
        with torch.device("meta"):
            built = model(conf(**shape.hf_config()))
        assert sum(p.numel() for p in built.parameters()) == shape.params, shape.name


def test_shape_comes_from_a_folder_config_json_or_the_table(tmp_path):
    conf = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 500,
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
    }
    (tmp_path / "config.json").write_text(json.dumps(conf))
    cfg = load_config(CONFIG_DIR / "smoke.yaml", [f"model.name_or_path={tmp_path}"])
    shape = mp.model_shape(cfg.model)
    assert (shape.hidden, shape.layers, shape.kv_heads, shape.vocab, shape.tied) == (64, 3, 2, 500, False)
    assert mp.model_shape(load_config(CONFIG_DIR / "gpu_7b.yaml").model) is mp.KNOWN_SHAPES["qwen2.5-coder-7b"]
    with pytest.raises(UserError, match="model.name_or_path"):
        mp.model_shape(load_config(CONFIG_DIR / "smoke.yaml", ["model.name_or_path=nobody/unknown-9b"]).model)


def test_the_7b_warm_start_on_8_gpus_of_80_gb_is_partitioned_like_the_update():
    cfg = load_config(CONFIG_DIR / "gpu_7b.yaml", ["model.lora.r=0"])  # every weight trained by PPO too
    plan = mp.plan_memory(cfg, mp.Cluster(8, 1, 80.0))
    warm = plan.phase("warm start")
    p = mp.KNOWN_SHAPES["qwen2.5-coder-7b"].params
    gathered = mp._zero3_gathered(plan.model, plan.settings, 8)
    # every rank, one agent's SFT in a ZeRO-3 engine: bf16 weights and gradients and 12 bytes of fp32 master and
    # moments per parameter, each over the 8 ranks; no reference or value head on the GPU (rank 0's CPU holds them)
    assert warm.where == "every rank" and warm.fits
    assert warm.parts["policy weights"] == pytest.approx(p * 2 / 8 + gathered)
    assert warm.parts["gradients"] == pytest.approx(p * 2 / 8)
    assert warm.parts["optimizer states"] == pytest.approx(p * 12 / 8)
    assert warm.parts["reference weights"] == warm.parts["value head/critic"] == 0
    # one pass of a rank's share of the batch of 16: 2 sequences (warmstart.micro_batch_size) of 3,072 tokens
    assert warm.parts["activations"] == pytest.approx(mp.sft_activations(plan.model, plan.settings, 2))
    # the update under ZeRO-3: 16 bytes per parameter of both agents over 8 ranks + 2 unpartitioned references
    update = plan.phase("update")
    assert update.parts["optimizer states"] == pytest.approx(2 * (p + 3585) * 12 / 8)
    assert update.parts["reference weights"] == 2 * p * 2


def test_the_7b_warm_start_on_one_gpu_runs_on_rank_0_and_does_not_fit():
    plan = mp.plan_memory(load_config(CONFIG_DIR / "gpu_7b.yaml"), mp.Cluster(1, 1, 80.0))
    warm = plan.phase("warm start")
    p = mp.KNOWN_SHAPES["qwen2.5-coder-7b"].params
    assert warm.where == "rank 0" and not warm.fits
    assert warm.parts["policy weights"] == warm.parts["reference weights"] == 2 * p * 2  # rank 0, unpartitioned
    assert warm.fixed > 80e9  # weights and SFT states alone, before any activation
    verdict = next(v for v in plan.verdicts if v.phase == "warm start")
    assert not verdict.fits and verdict.keys and "warmstart.solver_steps" in verdict.keys
    assert "does not fit" in verdict.line and mp.WARM_START_NEEDS in verdict.line


def test_verdict_keys_are_config_keys_the_config_accepts():
    path = CONFIG_DIR / "gpu_7b.yaml"
    cfg = load_config(path)
    for cluster in (mp.Cluster(8, 1, 80.0), mp.Cluster(8, 2, 80.0), mp.Cluster(1, 1, 40.0)):
        plan = mp.plan_memory(cfg, cluster)
        for v in plan.verdicts:
            for key in v.keys:
                assert (
                    key == "--nodes"
                    or key == "model.name_or_path"
                    or load_config(path, [f"{key}={_value_in(v.line, key)}"]) is not None
                )


def _value_in(line: str, key: str) -> str:
    return line.split(f"{key}=", 1)[1].split()[0].rstrip(";(")


def test_a_fix_the_verdict_names_makes_the_phase_fit():
    cfg = load_config(CONFIG_DIR / "gpu_1.5b.yaml", ["rollout.engine=vllm", "rollout.gpu_memory_utilization=0.45"])
    plan = mp.plan_memory(cfg, mp.Cluster(4, 1, 80.0))
    rollout = next(v for v in plan.verdicts if v.phase == "rollout")
    assert not rollout.fits and "rollout.gpu_memory_utilization" in rollout.keys
    value = _value_in(rollout.line, "rollout.gpu_memory_utilization")
    fixed = load_config(
        CONFIG_DIR / "gpu_1.5b.yaml", ["rollout.engine=vllm", f"rollout.gpu_memory_utilization={value}"]
    )
    assert mp.plan_memory(fixed, mp.Cluster(4, 1, 80.0)).phase("rollout").fits


def test_sleeping_engines_leave_the_update_their_memory():
    cfg = load_config(CONFIG_DIR / "gpu_1.5b.yaml", ["rollout.engine=vllm"])
    awake = load_config(CONFIG_DIR / "gpu_1.5b.yaml", ["rollout.engine=vllm", "rollout.sleep=false"])
    cluster = mp.Cluster(4, 1, 80.0)
    assert mp.plan_memory(cfg, cluster).phase("update").parts["vllm engines"] == 0
    share = cfg.rollout.gpu_memory_utilization  # the preset's: 0.25 of a GPU an engine
    assert mp.plan_memory(awake, cluster).phase("update").parts["vllm engines"] == pytest.approx(2 * share * 80e9)
    rollout = mp.plan_memory(cfg, cluster).phase("rollout")
    assert share == 0.25 and rollout.parts["vllm engines"] == pytest.approx(2 * share * 80e9)
    assert rollout.parts["generation (hf)"] == 0
    # the trainer re-scores rollout.gap_answers (8) of the engines' answers: 8 x (512 + 1) logits of 151,936
    assert rollout.parts["activations"] == 8 * 513 * 151936 * mp.GAP_LOGIT_BYTES


def test_a_lora_reference_that_is_the_policy_s_base_holds_no_weights(monkeypatch):
    s = settings_for(dtype_bytes=2, deepspeed=True, zero_stage=2, mixed_precision=True, lora_r=2)
    assert mp.agent_state(TOY, s, "solver", 1).reference == 0  # AdapterOff: the policy with its adapter off
    assert mp.agent_state(TOY, dataclasses.replace(s, lora_r=0), "solver", 1).reference == TOY_PARAMS * 2
    monkeypatch.setattr(mp, "LORA_REFERENCE_IS_BASE", False)  # a frozen copy of the base
    assert mp.agent_state(TOY, s, "solver", 1).reference == TOY_PARAMS * 2


@settings(max_examples=60, deadline=None)
@given(
    stage=st.sampled_from([1, 2, 3]),
    gpus=st.integers(1, 8),
    more=st.integers(1, 8),
    micro=st.sampled_from([1, 2, 4]),
    lora=st.sampled_from([0, 8]),
    engine=st.sampled_from(["hf", "vllm"]),
)
def test_more_gpus_never_raise_the_bytes_per_gpu_under_zero(stage, gpus, more, micro, lora, engine):
    shape = mp.KNOWN_SHAPES["qwen2.5-coder-1.5b"]
    s = settings_for(
        dtype_bytes=2,
        deepspeed=True,
        zero_stage=stage,
        mixed_precision=True,
        micro_batch=micro,
        mini_batch=4,
        lora_r=lora,
        engines=(engine, engine),
        solver_answers=512,
        proposals=64,
    )
    few = mp.plan_phases(shape, s, mp.Cluster(gpus, 1, 80.0))
    many = mp.plan_phases(shape, s, mp.Cluster(gpus + more, 1, 80.0))
    for a, b in zip(few, many):
        assert b.total <= a.total + 1e-6, a.phase
        assert a.total == pytest.approx(sum(a.parts.values()))


def test_plan_command_prints_the_table_writes_json_and_exits_1_when_it_does_not_fit(tmp_path, capsys):
    from selfplay.cli import main

    out = tmp_path / "plan.json"
    assert (
        main(["plan", str(CONFIG_DIR / "gpu_7b.yaml"), "--gpus-per-node", "1", "--nodes", "1", "--json", str(out)]) == 1
    )
    text = capsys.readouterr().out
    assert "| warm start | rank 0 |" in text and "does not fit" in text
    data = json.loads(out.read_text())
    assert [p["phase"] for p in data["phases"]] == list(mp.PHASES) and data["fits"] is False
    assert main(["plan", str(CONFIG_DIR / "tiny.yaml"), "--gpus-per-node", "1"]) == 0
    assert main(["plan", str(CONFIG_DIR / "tiny.yaml"), "--gpu-mem", "0.01", "run.seed=1"]) == 1


def test_train_check_is_a_no_op_without_a_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mp.refuse_if_it_cannot_fit(load_config(CONFIG_DIR / "gpu_7b.yaml")) is None


def test_train_check_refuses_in_one_line_naming_the_key_on_a_gpu_that_cannot_hold_it(monkeypatch, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda _i: type("Props", (), {"total_memory": int(80e9)})()
    )
    monkeypatch.setenv("WORLD_SIZE", "1")  # one rank: the warm start on rank 0 alone, in plain torch
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.delenv("SELFPLAY_NO_MEMORY_PLAN", raising=False)
    cfg = load_config(CONFIG_DIR / "gpu_7b.yaml", [f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(UserError) as exc:
        mp.refuse_if_it_cannot_fit(cfg)
    message = str(exc.value)
    assert "\n" not in message and "warm start" in message and mp.WARM_START_NEEDS in message
    monkeypatch.setenv("SELFPLAY_NO_MEMORY_PLAN", "1")
    assert mp.refuse_if_it_cannot_fit(cfg) is None
    # a phase that only its length-bound activations push over warns instead (the 1.5B preset's SFT batch unsplit,
    # on rank 0 alone; Hugging Face generation, since its two vLLM engines beside unpartitioned states would not fit)
    monkeypatch.delenv("SELFPLAY_NO_MEMORY_PLAN")
    overrides = [f"run.dir={tmp_path / 'run15'}", "warmstart.micro_batch_size=0", "rollout.engine=hf"]
    small = load_config(CONFIG_DIR / "gpu_1.5b.yaml", overrides)
    assert mp.refuse_if_it_cannot_fit(small) is None
    assert "memory plan: the warm start may need" in capsys.readouterr().out


def test_measured_adamw_step_matches_the_plan_on_a_small_llama():
    """A 4-block Llama of width 256 (vocabulary 2,000) in float32 with its value head, one AdamW step on a
    micro-batch: the bytes of its parameters, gradients and optimiser states (tensor sizes, not RSS) against the
    plan's; the activations saved for backward of one PPO micro-batch (bf16, through PPOTrainer.step) reported and
    held to a factor of 2 (saved tensors only). The update's peak is held to 15 % by test_memory_plan_measured.py."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    from selfplay.models.factory import ActorCritic

    shape = mp.ModelShape("llama-4x256", hidden=256, intermediate=1024, layers=4, heads=4, kv_heads=4, vocab=2000)
    torch.manual_seed(0)
    policy = LlamaForCausalLM(LlamaConfig(**shape.hf_config(), max_position_embeddings=256))
    model = ActorCritic(policy)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, shape.vocab, (2, 64))
    logits, values = model(ids, torch.ones_like(ids))
    (logits.float().logsumexp(-1).mean() + values.float().mean()).backward()
    optimizer.step()

    def nbytes(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    params = list(model.parameters())
    weights = nbytes(params)
    grads = nbytes(p.grad for p in params if p.grad is not None)
    states = nbytes(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))
    a = mp.agent_state(shape, settings_for(), "solver", world=1)
    planned = a.weights + a.critic + a.gradients + a.optimizer
    measured = weights + grads + states
    assert sum(p.numel() for p in policy.parameters()) == shape.params  # the parameter count is exact
    assert planned == pytest.approx(measured, rel=0.15)

    from selfplay.bench import preset_memory

    preset_memory.SHAPES["plan-check"] = shape.hf_config()
    try:
        row = preset_memory.measure(
            "plan-check", micro_batch=2, seq_len=256, answer_len=128, checkpointing=False, device="cpu", steps=1
        )
    finally:
        del preset_memory.SHAPES["plan-check"]
    s = settings_for(dtype_bytes=2, micro_batch=2, prompt=128, solver_new=128)
    saved = row["saved_for_backward_gb"] * preset_memory.GB
    estimate = mp.update_activations(shape, s, "solver")
    print(f"activations: plan {estimate / 1e6:.1f} MB, measured (saved for backward, CPU) {saved / 1e6:.1f} MB")
    assert saved / 2 <= estimate <= saved * 2


def test_the_warm_start_trains_one_agent_through_fp32_masters_and_micro_batches():
    # bf16: fp32 gradients (4 bytes per parameter) and the largest parameter's bf16 gradient (the 100 x 4 embedding),
    # 12 bytes of states (fp32 master, m, v); the solver's SFT left nothing behind, so one agent's, not two
    s = settings_for(dtype_bytes=2, sft_batch=4, sft_len=16, solver_new=1)  # the step-0 evaluation the smaller moment
    warm = mp.plan_phases(TOY, s, mp.Cluster(1, 1, 80.0))[0]
    assert warm.moment.startswith("SFT of one agent")
    assert warm.parts["gradients"] == TOY_PARAMS * 4 + 400 * 2
    assert warm.parts["optimizer states"] == TOY_PARAMS * 12
    assert warm.parts["policy weights"] == warm.parts["reference weights"] == 2 * TOY_PARAMS * 2
    # fp32: its own gradients and AdamW's two moments, no masters
    fp32 = mp.plan_phases(TOY, dataclasses.replace(s, dtype_bytes=4), mp.Cluster(1, 1, 80.0))[0]
    assert (fp32.parts["gradients"], fp32.parts["optimizer states"]) == (TOY_PARAMS * 4, TOY_PARAMS * 8)
    # micro-batches of 1 of the batch's 4 sequences: a quarter of the activations, the same states
    whole = mp.sft_activations(TOY, s)
    assert mp.sft_activations(TOY, dataclasses.replace(s, sft_micro=1)) == pytest.approx(whole / 4)
    assert mp.sft_activations(TOY, dataclasses.replace(s, sft_micro=4)) == whole
    assert mp.sft_state_bytes(TOY, dataclasses.replace(s, sft_micro=1)) == mp.sft_state_bytes(TOY, s)


def test_measured_sft_masters_and_states_are_the_plan_s_bytes():
    """A 2-block Llama of width 64 in bf16: after one SFT step through `MasterWeights` (the loop `sft` runs), the
    fp32 masters, their gradients and AdamW's moments add up to the plan's bytes, exactly; the model keeps no
    gradient of its own."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    from selfplay.rl.sft import MasterWeights, batch_backward, collate

    shape = mp.ModelShape("llama-2x64", hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=300)
    torch.manual_seed(0)
    policy = LlamaForCausalLM(LlamaConfig(**shape.hf_config(), max_position_embeddings=64)).to(torch.bfloat16)
    masters = MasterWeights(list(policy.parameters()))
    optimizer = torch.optim.AdamW(masters.masters, lr=1e-4)
    batch = collate([([1, 2, 3], [4, 5]), ([6, 7], [8, 9, 10]), ([11], [12])], pad_id=0, max_len=64)
    batch_backward(policy, *batch, micro_batch_size=2)
    grads = sum(m.grad.numel() * m.grad.element_size() for m in masters.masters)
    optimizer.step()
    masters.write_back()
    states = sum(m.numel() * m.element_size() for m in masters.masters) + sum(
        v.numel() * v.element_size() for st in optimizer.state.values() for k, v in st.items() if k != "step"
    )
    masters.close()
    s = settings_for(dtype_bytes=2)
    planned_grads, planned_states = mp.sft_state_bytes(shape, s)
    assert sum(p.numel() for p in policy.parameters()) == shape.params
    assert states == planned_states == shape.params * 12
    assert grads == shape.params * 4 == planned_grads - shape.vocab * shape.hidden * 2  # + the bf16 one in flight
    assert all(p.grad is None for p in policy.parameters())


def test_a_rank_0_warm_start_that_no_setting_fits_says_it_needs_the_deepspeed_one():
    cfg = load_config(CONFIG_DIR / "gpu_7b.yaml", ["distributed.deepspeed=false"])
    plan = mp.plan_memory(cfg, mp.Cluster(8, 2, 80.0))
    verdict = next(v for v in plan.verdicts if v.phase == "warm start")
    assert plan.phase("warm start").where == "rank 0"
    assert not verdict.fits and verdict.missing and mp.WARM_START_NEEDS in verdict.line
    assert "distributed.deepspeed" in verdict.keys  # the change that fits: the warm start under DeepSpeed
    # under DeepSpeed (the preset as it is) every rank takes its share and it fits: nothing missing
    on_ranks = mp.plan_memory(load_config(CONFIG_DIR / "gpu_7b.yaml"), mp.Cluster(8, 2, 80.0))
    verdict = next(v for v in on_ranks.verdicts if v.phase == "warm start")
    assert verdict.fits and not verdict.missing and on_ranks.phase("warm start").where == "every rank"
    # the 1.5B's warm start on 4 ranks fits with micro-batches; unsplit (each rank's share of 4 sequences in one
    # pass of 8,192 tokens) on 8 GB GPUs it does not, but a smaller pass makes it: nothing missing
    unsplit = mp.plan_memory(
        load_config(CONFIG_DIR / "gpu_1.5b.yaml", ["warmstart.micro_batch_size=0"]), mp.Cluster(4, 1, 24.0)
    )
    verdict = next(v for v in unsplit.verdicts if v.phase == "warm start")
    assert not verdict.fits and not verdict.missing and "warmstart.micro_batch_size" in verdict.keys
    value = _value_in(verdict.line, "warmstart.micro_batch_size")
    fixed = load_config(CONFIG_DIR / "gpu_1.5b.yaml", [f"warmstart.micro_batch_size={value}"])
    assert mp.plan_memory(fixed, mp.Cluster(4, 1, 24.0)).phase("warm start").fits


def test_the_warm_start_under_deepspeed_divides_by_the_zero_stage_as_the_update_does():
    for stage in (1, 2, 3):
        s = settings_for(
            dtype_bytes=2, deepspeed=True, zero_stage=stage, mixed_precision=True, sft_batch=8, sft_micro=0
        )
        warm = mp.plan_phases(TOY, s, mp.Cluster(4, 1, 80.0))[0]
        assert warm.where == "every rank"
        assert warm.parts["optimizer states"] == pytest.approx(TOY_PARAMS * 12 / 4)
        assert warm.parts["gradients"] == pytest.approx(TOY_PARAMS * 2 / (4 if stage >= 2 else 1))
        weights = TOY_PARAMS * 2 / (4 if stage == 3 else 1) + mp._zero3_gathered(TOY, s, 4)
        assert warm.parts["policy weights"] == pytest.approx(weights)
        # each rank's share of the batch of 8 over 4 ranks: 2 sequences in one pass (no micro-batch size set)
        assert mp.sft_rows_per_rank(s, 4) == 2
        assert warm.parts["activations"] == pytest.approx(mp.sft_activations(TOY, s, 2))
    assert mp.sft_rows_per_rank(dataclasses.replace(s, sft_micro=1), 4) == 1
    assert mp.sft_rows_per_rank(dataclasses.replace(s, sft_micro=5), 4) == 2  # never more than the share
    # one rank under DeepSpeed: the warm start on rank 0 in plain torch (nothing to partition)
    assert mp.plan_phases(TOY, s, mp.Cluster(1, 1, 80.0))[0].where == "rank 0"


# presets that do not fit the cluster their header names, with the phase that does not and why
DOES_NOT_FIT: dict[str, tuple[str, str]] = {}


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("gpu_*.yaml")), ids=lambda p: p.name)
def test_every_gpu_preset_fits_the_cluster_its_header_names(path, capsys):
    """Each configs/gpu_*.yaml names in its header the `selfplay plan` command of the cluster it is meant for; that
    command exits 0 (every phase fits), or the preset is listed in DOES_NOT_FIT and only that phase does not fit,
    for the reason listed."""
    from selfplay.cli import main

    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    found = re.findall(rf"selfplay plan configs/{re.escape(path.name)}((?: --[\w-]+ \S+)+)", header)
    assert len(found) == 1, f"{path.name}: no `selfplay plan configs/{path.name} --gpus-per-node N ...` in its header"
    args = shlex.split(found[0])
    assert "--gpus-per-node" in args and "--nodes" in args and "--gpu-mem" in args
    code = main(["plan", str(path), *args])
    text = capsys.readouterr().out
    if path.name not in DOES_NOT_FIT:
        assert code == 0, text
        return
    phase, reason = DOES_NOT_FIT[path.name]
    assert code == 1
    failing = [line for line in text.splitlines() if "does not fit" in line]  # the verdict lines
    assert [line.split(":", 1)[0] for line in failing] == [phase] and reason in failing[0]


def test_the_review_s_figures_for_the_7b_preset_fully_fine_tuned_with_hf_generation():
    """configs/gpu_7b.yaml with model.lora.r=0 rollout.engine=hf on the cluster its header names (2 nodes x 8 GPUs
    of 80 GB): the unpartitioned references, 2 x 15.2 GB on every GPU, and the update per GPU, to 0.1 GB, so that
    the arithmetic cannot drift unseen. The update was 56.7 GB (8.8 GB of activations) before a checkpointed
    update's logits and recomputed block were planned as the larger of the two rather than their sum
    (`RECOMPUTED_BLOCK`, measured): 55.1 GB (7.2 GB of activations)."""
    cfg = load_config(CONFIG_DIR / "gpu_7b.yaml", ["model.lora.r=0", "rollout.engine=hf"])
    plan = mp.plan_memory(cfg, mp.Cluster(8, 2, 80.0))
    update = plan.phase("update")
    assert round(update.parts["reference weights"] / mp.GB, 1) == 30.5
    assert round(update.total / mp.GB, 1) == 55.1
    assert round(update.parts["activations"] / mp.GB, 1) == 7.2
    table = mp.format_table(plan)
    assert (
        "| update | every rank | 3.1 | 30.5 | 0.0 | 1.0 | 11.4 | 7.2 | 0.0 | 0.0 | 2.0 | 55.1 | 80.0 | yes |" in table
    )


def test_the_evaluation_runs_on_every_rank_each_sampling_its_shard():
    """selfplay/train/evaluation.py: each rank evaluates every world-th held-out task (all of them under ZeRO-3), in
    Hugging Face batches of at most 64 answers: every rank holds a batch, smaller where its shard is."""
    s = settings_for(dtype_bytes=2, eval_tasks=40, eval_samples=4)  # 40 tasks x 4 samples
    assert mp.eval_batch(s, 1) == 64
    assert mp.eval_batch(s, 4) == 40  # 10 tasks a rank, 4 samples each
    assert mp.eval_batch(s, 16) == 12  # 3 tasks a rank
    zero3 = dataclasses.replace(s, deepspeed=True, zero_stage=3, mixed_precision=True)
    assert mp.eval_batch(zero3, 16) == 64  # every rank every task
    assert mp.eval_batch(dataclasses.replace(s, eval_tasks=0), 16) == 64  # unknown: full batches
    for world in (1, 4, 16):
        ev = mp.plan_phases(TOY, s, mp.Cluster(world, 1, 80.0))[-1]
        assert ev.phase == "evaluation" and ev.where == "every rank"
        assert ev.parts["generation (hf)"] == mp.generation_bytes(TOY, s, mp.eval_batch(s, world), s.solver_new)
    # from a config: the 7B preset's shard on each of 16 ranks outnumbers a batch
    cfg = load_config(CONFIG_DIR / "gpu_7b.yaml", ["model.lora.r=0", "rollout.engine=hf"])
    plan = mp.plan_memory(cfg, mp.Cluster(8, 2, 80.0))
    assert plan.settings.eval_tasks >= 16 * 64 // plan.settings.eval_samples
    assert plan.phase("evaluation").where == "every rank"
    assert plan.phase("evaluation").parts["generation (hf)"] == mp.generation_bytes(
        plan.model, plan.settings, 64, plan.settings.solver_new
    )
