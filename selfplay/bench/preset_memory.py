"""Memory and speed of one PPO update micro-batch for the model shapes of the GPU presets (configs/gpu_*.yaml),
measured through the PPO trainer itself (selfplay.rl.ppo.PPOTrainer, in the update's own mode: evaluation mode with
gradient checkpointing active where it is enabled, as `model.gradient_checkpointing` does in a run).

The weights are random (Qwen2.5-Coder's architecture and sizes, built from a config: nothing is downloaded), so the
figures are those of the shapes, not of the trained models. For each shape, with and without gradient
checkpointing, one `trainer.step` on `micro_batch` rollouts of `seq_len` tokens (`answer_len` of them answer tokens),
one epoch of one minibatch = one micro-batch: the rollout pass without gradients, then the PPO forward + backward
(policy, value head, entropy over the full vocabulary). It reports:
- `saved_for_backward_gb`: the bytes autograd keeps for the backward pass during the update (activations; any
  device, the CPU included): what gradient checkpointing reduces;
- on a GPU, `peak_update_gb`: the peak allocated memory of the whole update (weights and gradients included);
- the weights, the fp32 AdamW states DeepSpeed keeps (12 bytes per parameter, divided across GPUs by ZeRO; computed,
  not allocated: the measurement uses SGD with lr 0) and the update's tokens/s.

This measures one micro-batch of a shape; `selfplay plan CONFIG` (selfplay/runtime/memory_plan.py) plans a whole
run, per GPU and phase, with activation constants fitted to these measurements.

    python -m selfplay.bench.preset_memory --json preset_memory.json         # on a GPU machine
    python -m selfplay.bench.preset_memory --shapes test --device cpu        # the code path, on a CPU
    python -m selfplay.bench.preset_memory --shapes 1.5b --layers 2 --micro-batch 1 --seq-len 512 --answer-len 256 \
        --device cpu
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from selfplay.models.factory import ActorCritic
from selfplay.rl.ppo import PPOTrainer
from selfplay.runtime.config import PPOConfig
from selfplay.runtime.memory_plan import KNOWN_SHAPES, MIXED_STATE_BYTES

# the presets' shapes come from the memory plan's table (selfplay/runtime/memory_plan.py), whose activation
# constants these measurements fit
SHAPES = {
    "1.5b": KNOWN_SHAPES["qwen2.5-coder-1.5b"].hf_config(),
    "7b": KNOWN_SHAPES["qwen2.5-coder-7b"].hf_config(),
    "test": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        tie_word_embeddings=True,
    ),
}
GB = 2**30


def measure(
    shape: str,
    micro_batch: int,
    seq_len: int,
    answer_len: int,
    checkpointing: bool,
    device: str,
    layers: int = 0,
    steps: int = 2,
) -> dict:
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated() if cuda else 0
    dims = dict(SHAPES[shape], **({"num_hidden_layers": layers} if layers else {}))
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            policy = Qwen2ForCausalLM(Qwen2Config(**dims, max_position_embeddings=max(4096, seq_len)))
            model = ActorCritic(policy)
    finally:
        torch.set_default_dtype(torch.float32)
    params = sum(p.numel() for p in model.parameters())
    weights = (torch.cuda.memory_allocated() - base) / GB if cuda else params * 2 / GB
    if checkpointing:
        policy.gradient_checkpointing_enable()
    policy.config.use_cache = False
    cfg = PPOConfig(epochs=1, mini_batch_size=micro_batch, micro_batch_size=micro_batch, lr=0.0)
    # the policy is its own reference (a frozen copy would only add its weights); SGD keeps no state
    trainer = PPOTrainer(model, policy, cfg, torch.optim.SGD(model.parameters(), lr=0.0), pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    vocab = dims["vocab_size"]
    queries = torch.randint(1, vocab, (micro_batch, seq_len - answer_len), generator=g).tolist()
    responses = torch.randint(1, vocab, (micro_batch, answer_len), generator=g).tolist()
    scores = [float(i % 2) for i in range(micro_batch)]
    saved, times = [0], []

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    for _ in range(steps):
        saved[0] = 0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            trainer.step(queries, responses, scores)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() - base) / GB if cuda else float("nan")
    step_s = min(times[1:] or times)
    del model, policy, trainer
    return {
        "shape": shape,
        "layers": dims["num_hidden_layers"],
        "params_b": params / 1e9,
        "micro_batch": micro_batch,
        "seq_len": seq_len,
        "answer_len": answer_len,
        "gradient_checkpointing": checkpointing,
        "weights_gb": weights,
        "saved_for_backward_gb": saved[0] / GB,
        "peak_update_gb": peak,
        "adamw_fp32_states_gb": params * MIXED_STATE_BYTES / GB,
        "update_s": step_s,
        "update_tokens_per_s": micro_batch * seq_len / step_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["1.5b", "7b"], choices=sorted(SHAPES))
    p.add_argument("--micro-batch", type=int, default=4, help="the presets' ppo.micro_batch_size")
    p.add_argument("--seq-len", type=int, default=1536, help="prompt + answer tokens (the presets: ~1 k + 512)")
    p.add_argument("--answer-len", type=int, default=512, help="answer tokens of those (ppo.max_new_tokens)")
    p.add_argument("--layers", type=int, default=0, help="keep only this many transformer blocks (0 = all)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", default="", help="write the rows here too")
    a = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for shape in a.shapes:
        for ckpt in (True, False):
            try:
                rows.append(measure(shape, a.micro_batch, a.seq_len, a.answer_len, ckpt, a.device, a.layers))
            except torch.OutOfMemoryError as exc:
                rows.append({"shape": shape, "gradient_checkpointing": ckpt, "error": str(exc).splitlines()[0]})
            print(json.dumps(rows[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
