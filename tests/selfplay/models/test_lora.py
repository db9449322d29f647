"""LoRA through peft: the warm start's checkpoint asks for a fresh adapter, later loads train it over the frozen
reference weights, saves write merged full weights beside the adapter, and a reload gives the same model."""

import json

import peft  # noqa: E402,F401  (the test extra installs it; a missing peft fails collection, never skips)
import pytest
import torch

from selfplay.models import factory as models
from selfplay.models.agent import load_agent_parts
from selfplay.rl.ppo import PPOTrainer
from selfplay.runtime.config import load_config
from selfplay.runtime.distributed import DistInfo
from selfplay.runtime.errors import UserError
from selfplay.train.setup import load_agent

CODE = ["def add(a, b):\n    return a + b\n", "def double_all(xs):\n    return [x * 2 for x in xs]\n"] * 8


def _agent_folder(tmp_path, overrides=()):
    """A warm-start-like agent folder: tiny llama policy (with the pending adapter), reference, tokenizer."""
    cfg = load_config(
        overrides=[
            "model.arch=llama",
            "model.n_layer=2",
            "model.n_embd=32",
            "model.n_head=2",
            "model.vocab_size=300",
            "model.lora.r=4",
            *overrides,
        ]
    )
    model, reference, tokenizer = models.build_models(cfg.model, tmp_path / "run", CODE, agent="solver")
    folder = tmp_path / "solver"
    model.save_pretrained(folder)
    reference.save_pretrained(folder / "reference")
    tokenizer.save_pretrained(folder)
    return cfg, folder, tokenizer


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, torch.ones_like(ids))[0]


def test_lora_checkpoint_round_trip(tmp_path):
    _, folder, tokenizer = _agent_folder(tmp_path)
    assert json.loads((folder / "lora" / models.LORA_STATE).read_text()) == {"base": "policy"}
    model, reference, _ = load_agent_parts(folder)
    assert models.is_lora(model.policy) and model.lora_base == "reference"
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("value_head") for n in trainable)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    # B = 0 at the start: the adapted policy is its reference
    ref_logits = reference(ids).logits
    assert torch.allclose(_logits(model, ids), ref_logits, atol=1e-6)
    with torch.no_grad():  # a trained adapter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05 * torch.randn_like(p))
    before = _logits(model, ids)
    assert not torch.allclose(before, ref_logits, atol=1e-4)
    out = tmp_path / "step_2" / "solver"
    model.save_pretrained(out)
    reference.save_pretrained(out / "reference")
    tokenizer.save_pretrained(out)
    assert json.loads((out / "lora" / models.LORA_STATE).read_text()) == {"base": "reference"}
    assert not (out / "lora" / "base").exists()  # the base is the reference: not saved twice
    again, _, _ = load_agent_parts(out)
    assert models.is_lora(again.policy)
    assert torch.equal(_logits(again, ids), before)
    # the folder's own weights are the adapter merged: what eval and export load
    merged = models.ActorCritic.from_pretrained(out)
    assert not models.is_lora(merged.policy)
    assert torch.allclose(_logits(merged, ids), before, atol=1e-5)


def test_lora_base_saved_when_it_is_not_the_reference(tmp_path):
    _, folder, _ = _agent_folder(tmp_path)
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        next(policy.parameters()).add_(0.01)
    policy.save_pretrained(folder)  # the policy moved away from the reference before the adapter was attached
    model, _, _ = load_agent_parts(folder)
    assert model.lora_base == "base"
    out = tmp_path / "out"
    model.save_pretrained(out)
    assert (out / "lora" / "base" / "config.json").exists()
    ids = torch.tensor([[3, 4, 5]])
    again = models.ActorCritic.from_pretrained(out, trainable_lora=True)
    assert again.lora_base == "base" and torch.equal(_logits(again, ids), _logits(model, ids))


def test_lora_for_one_agent_only(tmp_path):
    cfg = load_config(
        overrides=[
            "model.arch=llama",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "model.vocab_size=300",
            "model.lora.r=4",
            "model.lora.agents=[generator]",
        ]
    )
    solver, _, _ = models.build_models(cfg.model, tmp_path, CODE, agent="solver")
    generator, _, _ = models.build_models(cfg.model, tmp_path, CODE, agent="generator")
    assert solver.lora_pending is None and generator.lora_pending is not None


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.lora.target_modules=[no_such_layer]", "model.lora.target_modules"),
        ("model.lora.agents=[critic]", "model.lora.agents"),
        ("model.value_model=separate", "model.value_model=separate"),
        ("model.lora.layers=2", "model.lora.layers=2"),  # a model of one block
        ("model.lora.layers=-1", "model.lora.layers=-1"),
    ],
)
def test_bad_lora_settings_are_named(tmp_path, override, key):
    cfg = load_config(
        overrides=[
            "model.arch=llama",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "model.vocab_size=300",
            "model.lora.r=4",
            override,
        ]
    )
    with pytest.raises(UserError, match=key.replace("[", r"\[").replace("]", r"\]")):
        models.build_models(cfg.model, tmp_path, CODE, agent="solver")


def test_a_fresh_adapter_starts_its_optimiser_afresh(tmp_path):
    """The warm start's optimiser state is for all weights; the first load with LoRA attaches the adapter and
    starts AdamW on the adapter alone, then the adapter's own state is saved and restored."""
    from selfplay.models.agent import LMAgent

    cfg, folder, tokenizer = _agent_folder(tmp_path)
    plain = models.ActorCritic.from_pretrained(folder)  # all weights trainable, as the warm start's agent
    full = LMAgent("solver", plain, plain.policy, tokenizer, cfg.ppo)
    torch.save(full.trainer.optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(full.trainer.state_dict(), folder / "trainer.pt")
    assert models.fresh_lora(folder)
    model, reference, tok = load_agent_parts(folder)
    agent = LMAgent("solver", model, reference, tok, cfg.ppo)
    agent.load_training_state(folder)
    groups = agent.trainer.optimizer.param_groups
    assert sum(p.numel() for g in groups for p in g["params"]) < sum(p.numel() for p in model.parameters()) / 2
    out = tmp_path / "next"
    agent.save(out)
    assert not models.fresh_lora(out) and (out / "lora" / "adapter_model.safetensors").exists()
    again, ref2, tok2 = load_agent_parts(out)
    LMAgent("solver", again, ref2, tok2, cfg.ppo).load_training_state(out)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # block 2's input needs no gradient: the point
def test_adapters_on_the_top_blocks_only_train_nothing_below_them(tmp_path):
    """model.lora.layers=2 of 4 blocks: adapters in blocks 2 and 3 only (after a save and a reload too), the same
    outputs as the base at the start, and a backward pass that never reaches blocks 0 and 1."""
    cfg, folder, _ = _agent_folder(tmp_path, ["model.n_layer=4", "model.lora.layers=2"])
    model, reference, _ = load_agent_parts(folder)
    torch.save(PPOTrainer(model, reference, cfg.ppo).state_dict(), folder / "trainer.pt")
    agent = load_agent(cfg, DistInfo(), tmp_path, "solver")  # as the loop loads it: the settings are accepted
    assert models.is_lora(agent.module.policy)
    adapted = {int(n.split(".layers.")[1].split(".")[0]) for n, p in model.named_parameters() if "lora_" in n}
    assert adapted == {2, 3}
    reached = []
    for i, block in enumerate(models.base_of(model.policy).model.layers):
        block.register_full_backward_hook(lambda *a, i=i: reached.append(i))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    logits, _ = model(ids, torch.ones_like(ids))
    logits.logsumexp(-1).sum().backward()
    assert sorted(set(reached)) == [2, 3]
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)


def test_the_reference_of_an_adapter_over_it_is_the_policy_with_the_adapter_off(tmp_path):
    """A LoRA agent whose base is its reference holds no second copy: the reference is the policy with its adapter
    switched off, equal to the reference folder's model before and after the adapter trains, and saved as that
    plain model; PPO scores it (KL 0 at the start, > 0 once the adapter moved)."""
    from transformers import AutoModelForCausalLM

    from selfplay.rl.ppo import PPOTrainer

    cfg, folder, tokenizer = _agent_folder(tmp_path)
    model, _, _ = load_agent_parts(folder)  # the fresh adapter over the warm start: its base is the reference
    out = tmp_path / "step_1" / "solver"
    model.save_pretrained(out)
    models.frozen_copy(AutoModelForCausalLM.from_pretrained(folder / "reference")).save_pretrained(out / "reference")
    tokenizer.save_pretrained(out)
    model, reference, _ = load_agent_parts(out)
    assert isinstance(reference, models.AdapterOff) and list(reference.parameters()) == []
    stored = AutoModelForCausalLM.from_pretrained(out / "reference")
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05 * torch.randn_like(p))
        assert torch.allclose(reference(ids).logits, stored(ids).logits, atol=1e-6)
        assert not torch.allclose(_logits(model, ids), stored(ids).logits, atol=1e-4)
    reference.save_pretrained(tmp_path / "saved_reference")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved_reference")
    assert not models.is_lora(again) and torch.allclose(again(ids).logits, stored(ids).logits, atol=1e-6)
    trainer = PPOTrainer(model, reference, cfg.ppo, pad_token_id=tokenizer.pad_token_id)
    stats = trainer.step([[5, 6, 7]] * 2, [[8, 9], [9, 8]], [1.0, 0.0], groups=["t", "t"])
    assert stats["kl"] != 0.0 and all(p.grad is None for p in stored.parameters())


# head size 32: one the vLLM CPU build takes, so that a config naming vLLM passes its own checks
TINY_LORA = ["model.arch=llama", "model.n_layer=1", "model.n_embd=32", "model.n_head=1", "model.vocab_size=300"]


@pytest.mark.parametrize("engine_key", ["rollout.engine=vllm", "rollout.generator_engine=vllm"])
def test_an_adapter_on_a_tied_weight_is_refused_at_build_for_an_engine_that_loads_merged_weights(tmp_path, engine_key):
    """The tiny llama ties its output layer to its embedding: an adapter on `lm_head` cannot be merged one layer at a
    time, which a vLLM engine's weight sync needs, so the build refuses it naming both keys (it would otherwise
    fail at the first sync, after the warm start); sampled by the trainer's own model it is built."""
    tied = load_config(overrides=[*TINY_LORA, "model.lora.r=4", "model.lora.target_modules=[q_proj,lm_head]"])
    with pytest.raises(UserError, match=r"model\.lora\.target_modules=\['q_proj', 'lm_head'\] with " + engine_key):
        models.build_models(tied.model, tmp_path, CODE, agent="solver", engine_key=engine_key)
    model, _, _ = models.build_models(tied.model, tmp_path, CODE, agent="solver")
    assert model.lora_pending is not None
    # the default targets, the blocks' linear layers, merge one layer at a time: built for vLLM too
    blocks = load_config(overrides=[*TINY_LORA, "model.lora.r=4"])
    model, _, _ = models.build_models(blocks.model, tmp_path, CODE, agent="solver", engine_key=engine_key)
    assert model.lora_pending is not None


def test_the_warm_start_builds_each_agent_naming_the_engine_that_merges_its_weights(tmp_path):
    """build_agents hands the refusal the key that chose each agent's engine: the generator's own engine key
    where it is set."""
    from selfplay.train.warmstart import build_agents

    overrides = [*TINY_LORA, "model.lora.r=4", "model.lora.target_modules=[q_proj,lm_head]"]
    cfg = load_config(overrides=[*overrides, "rollout.generator_engine=vllm"])
    with pytest.raises(UserError, match=r"with rollout\.generator_engine=vllm"):
        build_agents(cfg, tmp_path, CODE)
    cfg = load_config(overrides=[*overrides, "model.lora.agents=[generator]", "rollout.engine=vllm"])
    with pytest.raises(UserError, match=r"with rollout\.engine=vllm"):  # the generator takes the solver's engine
        build_agents(cfg, tmp_path, CODE)
    solver, generator = build_agents(load_config(overrides=overrides), tmp_path, CODE)  # the hf engine: built
    assert solver.model.lora_pending is not None and generator.model.lora_pending is not None
