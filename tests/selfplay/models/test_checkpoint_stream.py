"""The checkpoint's weights written one tensor at a time (`save_streamed`, `ActorCritic.save_pretrained`,
`LMAgent.save`): the same files as Hugging Face's `save_pretrained` of the model (a LoRA policy: of its merged copy;
its own base: of the adapter unloaded), byte for byte, hence tensor for tensor; no copy of the model made on the
way; and what is frozen (the reference, a LoRA adapter's own base) written once, later checkpoints pointing to it."""

from __future__ import annotations

import copy
import json

import peft  # noqa: F401  (the test extra installs it; a missing peft fails collection, never skips)
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from selfplay.models import factory as models
from selfplay.models.agent import LMAgent, load_agent_parts
from selfplay.runtime.checkpoint import LORA_BASE_DIR, REFERENCE_POINTER, frozen_folder, pointer_of, reference_folder
from tests.selfplay.models.test_lora import _agent_folder
from tests.selfplay.models.test_lora_sync import NewMemory, tok, trained_lora  # noqa: F401  (tok: the fixture)


def files(folder) -> dict[str, bytes]:
    return {f.relative_to(folder).as_posix(): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def tensors(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_streamed_files_are_save_pretrained_s_byte_for_byte(tok, arch, dtype, tmp_path):  # noqa: F811
    """A plain policy, a LoRA policy's merged copy and its own base: the streamed files are those Hugging Face
    writes from the whole model (the tied head left out as it leaves it out), so they load as before."""
    policy = trained_lora(tok, arch).to(dtype)
    plain = copy.deepcopy(policy).unload()
    models.save_plain(plain, tmp_path / "plain")
    plain.save_pretrained(tmp_path / "plain_hf")
    model = models.ActorCritic(policy)
    model.lora_base = "base"
    model.save_pretrained(tmp_path / "lora")
    models.merged_copy(policy).save_pretrained(tmp_path / "merged_hf")
    copy.deepcopy(policy).unload().save_pretrained(tmp_path / "base_hf")
    assert files(tmp_path / "plain") == files(tmp_path / "plain_hf")
    written = files(tmp_path / "lora")
    merged = files(tmp_path / "merged_hf")
    assert {k: v for k, v in written.items() if k in merged} == merged and "value_head.pt" in written
    assert files(tmp_path / "lora" / "lora" / "base") == files(tmp_path / "base_hf")
    # tensor for tensor, max difference 0, against the merged copy in memory
    expected = models.merged_copy(policy).state_dict()
    got = tensors(tmp_path / "lora" / "model.safetensors")
    assert got and set(got) <= set(expected)
    assert max((got[k].float() - expected[k].float()).abs().max().item() for k in got) == 0.0
    again, lora_base = models.load_lora(tmp_path / "lora")  # the adapter over its saved base, as a resume loads it
    assert lora_base == "base"
    assert all(torch.equal(t, policy.state_dict()[k]) for k, t in again.state_dict().items())


def test_the_streamed_save_allocates_a_few_layers_where_the_old_one_copied_the_model(tok, tmp_path):  # noqa: F811
    """Measured by the allocation meter of the weight sync's test: the LoRA checkpoint's new memory is one adapted
    layer's merge (3 x its largest weight) and the adapter; the old save's merged copy allocated the whole model.
    A plain model's streamed save allocates nothing of its own (its tensors are written where they lie)."""
    policy = trained_lora(tok, "llama", n_layer=4)
    model = models.ActorCritic(policy)
    # the model's storages, each once: tied weights (the output layer and the embedding) are one storage under two
    # names in the state dict
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in policy.state_dict().values()}
    model_bytes = sum(storages.values())
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in policy.named_parameters() if "lora_" in n)
    largest = max(
        m.get_base_layer().weight.numel() * m.get_base_layer().weight.element_size()
        for m in policy.modules()
        if hasattr(m, "merged_adapters")
    )
    assert 10 * (largest + adapter_bytes) < model_bytes  # so the bound below tells a layer from the model
    with NewMemory() as streamed:
        model.save_pretrained(tmp_path / "new")
    with NewMemory() as old:
        models.merged_copy(policy).save_pretrained(tmp_path / "old")
    assert 0 < streamed.peak <= 3 * largest + adapter_bytes, (streamed.peak, largest, adapter_bytes)
    assert old.peak >= model_bytes, (old.peak, model_bytes)
    plain = copy.deepcopy(policy).unload()
    with NewMemory() as plain_save:
        models.save_plain(plain, tmp_path / "plain")
    assert plain_save.peak < largest, plain_save.peak
    assert (
        tensors(tmp_path / "new" / "model.safetensors").keys() == tensors(tmp_path / "old" / "model.safetensors").keys()
    )


def lora_agent(tmp_path, base: str) -> tuple[LMAgent, object]:
    """A LoRA solver as a run loads it after the warm start (its base the reference, `AdapterOff`), or over a base
    that is not the reference (`lora/base`), with a trained adapter."""
    cfg, folder, _ = _agent_folder(tmp_path)
    if base == "base":
        policy = AutoModelForCausalLM.from_pretrained(folder)
        with torch.no_grad():
            next(policy.parameters()).add_(0.01)
        policy.save_pretrained(folder)  # the policy moved away from the reference before the adapter was attached
    model, reference, tokenizer = load_agent_parts(folder)
    assert model.lora_base == base
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.05)
    return LMAgent("solver", model, reference, tokenizer, cfg.ppo), cfg


@pytest.mark.parametrize("base", ["reference", "base"])
def test_a_second_checkpoint_writes_no_frozen_bytes_and_loads_the_same_agent(tmp_path, base):
    """A LoRA agent's first checkpoint holds its reference (and its own base); the second points to them:
    `reference.json` (`lora/base.json`), no reference or base bytes; loaded from either, the same weights."""
    agent, _ = lora_agent(tmp_path, base)
    root = tmp_path / "run" / "checkpoints"
    first, second = root / "step_1.partial" / "solver", root / "step_2.partial" / "solver"
    agent.save(first)
    first.parent.rename(root / "step_1")  # committed (CheckpointManager.commit renames it)
    first = root / "step_1" / "solver"
    agent.save(second)
    frozen = ["reference", *(["lora/base"] if base == "base" else [])]
    assert all((first / sub / "model.safetensors").is_file() for sub in frozen)
    assert agent.reference_home == "step_1/solver/reference"
    written = files(second)
    assert not [k for k in written if k.startswith(("reference/", "lora/base/"))]  # no frozen bytes
    assert json.loads(written[REFERENCE_POINTER]) == {"path": "step_1/solver/reference"}
    if base == "base":
        assert json.loads(written[pointer_of(second / LORA_BASE_DIR).relative_to(second).as_posix()]) == {
            "path": "step_1/solver/lora/base"
        }
    second.parent.rename(root / "step_2")
    second = root / "step_2" / "solver"
    assert reference_folder(second) == first / "reference"
    assert frozen_folder(second, LORA_BASE_DIR) == (first / "lora" / "base" if base == "base" else second / "lora/base")
    saved = sum(len(v) for v in files(first).values()) - sum(len(v) for v in files(second).values())
    assert saved >= sum((first / sub / "model.safetensors").stat().st_size for sub in frozen)
    a, ref_a, _ = load_agent_parts(first)
    b, ref_b, _ = load_agent_parts(second)
    assert a.lora_base == b.lora_base == base
    for (name, t), (other, u) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert name == other and torch.equal(t, u), name
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(ref_a(ids).logits, ref_b(ids).logits)


def test_a_tensor_not_announced_or_one_missing_is_refused(tmp_path):
    """The header is written before the tensors: a tensor that differs from its announcement, or one announced and
    never given, would leave a file that lies; both are refused."""
    specs = [("a", (2, 3), torch.float32), ("b", (4,), torch.bfloat16)]
    a, b = torch.ones(2, 3), torch.zeros(4, dtype=torch.bfloat16)
    models.write_safetensors(specs, [("b", b), ("a", a)], tmp_path / "ok.safetensors")  # any order
    got = tensors(tmp_path / "ok.safetensors")
    assert torch.equal(got["a"], a) and torch.equal(got["b"], b)
    with pytest.raises(ValueError, match="weight a"):
        models.write_safetensors(specs, [("a", torch.ones(3, 2)), ("b", b)], tmp_path / "shape.safetensors")
    with pytest.raises(ValueError, match="announced and not given: b"):
        models.write_safetensors(specs, [("a", a)], tmp_path / "short.safetensors")
