"""A LoRA policy's weights for its rollout engine (`merged_weight_items`): one adapted layer at a time merged by peft
and its own storage put back, the tensors of `merged_copy` bit for bit under the same names, the policy left bit for
bit as it was in its own storage, and never more than a few weights of one layer of new memory, where `merged_copy`
allocates the whole model."""

from __future__ import annotations

import weakref

import peft  # noqa: F401  (the test extra installs it; a missing peft fails collection, never skips)
import pytest
import torch
from peft import LoraConfig
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from selfplay.models import factory as models

CODE = ["def add(a, b):\n    return a + b\n", "def double_all(xs):\n    return [x * 2 for x in xs]\n"] * 8
TARGETS = {"llama": ["q_proj", "v_proj", "o_proj", "down_proj"], "gpt2": ["c_attn", "c_proj"]}  # gpt2's carry biases


@pytest.fixture(scope="module")
def tok():
    return models.train_tokenizer(CODE, vocab_size=300, kind="bpe")


def trained_lora(tok, arch: str, n_layer: int = 2):
    """A tiny policy under an adapter whose B is not 0 (a trained adapter: merging changes the weights)."""
    torch.manual_seed(0)
    base = models.build_tiny_model(tok, arch=arch, n_layer=n_layer, n_embd=64, n_head=2, max_positions=128)
    policy = models.attach_lora(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS[arch], task_type="CAUSAL_LM")
    )
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    return policy


def snapshot(policy) -> dict[str, tuple[torch.Tensor, int]]:
    return {k: (v.detach().clone(), v.data_ptr()) for k, v in policy.state_dict(keep_vars=True).items()}


def assert_as_before(policy, before) -> None:
    now = policy.state_dict(keep_vars=True)
    assert list(now) == list(before)
    for k, v in now.items():
        assert torch.equal(v.detach(), before[k][0]), k  # bit for bit, not within rounding
        assert v.data_ptr() == before[k][1], k  # in its own storage: nothing swapped in
    assert not any(m.merged for m in policy.modules() if hasattr(m, "merged_adapters"))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_stream_gives_the_merged_copys_tensors_and_leaves_the_policy_as_it_was(tok, arch):
    policy = trained_lora(tok, arch)
    before = snapshot(policy)
    expected = models.merged_copy(policy).state_dict()
    got = [(name, t.clone()) for name, t in models.merged_weight_items(policy)]
    assert [name for name, _ in got] == list(expected)  # the engine's names: no base_layer, no lora_
    mismatched = [name for name, t in got if not torch.equal(t, expected[name])]
    assert mismatched == []  # max difference 0: the same in-place sum merge_and_unload does
    adapted = [n for n in expected if n.endswith(".weight") and n.split(".")[-2] in TARGETS[arch]]
    unmerged = {n: before["base_model.model." + n.replace(".weight", ".base_layer.weight")][0] for n in adapted}
    assert adapted and all(not torch.equal(expected[n], unmerged[n]) for n in adapted)  # the merge shows
    assert_as_before(policy, before)


def test_the_policy_is_as_it_was_while_the_consumer_holds_each_merged_tensor_and_a_kept_one_stays_merged(tok):
    """At every step of the stream the policy is bit for bit as before (no layer left merged while the consumer
    works), and the tensors a consumer keeps (as vLLM's layerwise reload keeps a layer's until it is complete) keep
    the merged values after the stream has moved on, and after it was stopped."""
    policy = trained_lora(tok, "llama")
    before = snapshot(policy)
    expected = models.merged_copy(policy).state_dict()
    kept = []
    items = models.merged_weight_items(policy)
    for name, t in items:
        assert_as_before(policy, before)
        kept.append((name, t))
        if name.endswith("layers.1.self_attn.o_proj.weight"):
            break
    items.close()
    assert_as_before(policy, before)
    assert len(kept) > 4 and all(torch.equal(t, expected[name]) for name, t in kept)


class NewMemory(TorchDispatchMode):
    """Bytes of the storages that operations create, live and at their peak while the mode is on (a storage counts
    from the operation that made it until it is freed: its Python object is kept with it and finalized with it)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.tracked: set[int] = set()

    def _freed(self, ptr: int, n: int) -> None:
        self.tracked.discard(ptr)
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0] if torch.is_tensor(a)}
        for t in tree_flatten(out)[0]:
            if torch.is_tensor(t):
                storage = t.untyped_storage()
                ptr, n = storage.data_ptr(), storage.nbytes()
                if ptr and ptr not in inputs and ptr not in self.tracked:
                    self.tracked.add(ptr)
                    self.live += n
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._freed, ptr, n)
        return out


def test_the_stream_allocates_a_few_layers_where_the_merged_copy_allocates_the_model(tok):
    """A consumer that drops each tensor once it has it (as an engine's loader copies it into its own): the new
    memory at any time is the merged weight and peft's delta with its scaled product, at most 3 times the largest
    adapted weight; `merged_copy`, measured the same way, allocates at least the whole model."""
    policy = trained_lora(tok, "llama", n_layer=4)
    # the model's storages, each once: tied weights (the output layer and the embedding) are one storage under two
    # names in the state dict
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in policy.state_dict().values()}
    model_bytes = sum(storages.values())
    largest = max(
        m.get_base_layer().weight.numel() * m.get_base_layer().weight.element_size()
        for m in policy.modules()
        if hasattr(m, "merged_adapters")
    )
    assert 10 * largest < model_bytes  # so the bound below tells a layer from the model
    with NewMemory() as streamed:
        names = []
        for name, t in models.merged_weight_items(policy):
            names.append(name)
            del t
    with NewMemory() as copied:
        merged = models.merged_copy(policy)
    assert len(names) == len(merged.state_dict())
    assert 0 < streamed.peak <= 3 * largest, (streamed.peak, largest)
    assert copied.peak >= model_bytes, (copied.peak, model_bytes)  # the meter sees a whole copy
