"""GPU memory and speed of one training micro-batch for the model shapes of the GPU presets (configs/gpu_*.yaml).

The weights are random (Qwen2.5-Coder's architecture and sizes, built from a config: nothing is downloaded), so
the figures are those of the shapes, not of the trained models. For each shape it measures, on one GPU in bf16:
the weights, and the peak of one forward + backward pass of a PPO micro-batch (answer-only loss over the whole
sequence, as the policy loss needs the log-probabilities of every token) with and without gradient checkpointing,
and the tokens/s of that pass. The fp32 AdamW states that DeepSpeed keeps (master weights + two moments, 12 bytes per
parameter, divided across GPUs by ZeRO) are computed, not allocated.

    python notes/preset_memory.py --json preset_memory.json                 # on a GPU machine
    python notes/preset_memory.py --shapes test --device cpu                 # the code path, on a CPU, in seconds
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

SHAPES = {
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "test": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
}
GB = 2**30


def measure(shape: str, micro_batch: int, seq_len: int, checkpointing: bool, device: str, steps: int = 3) -> dict:
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape], max_position_embeddings=max(4096, seq_len)))
    finally:
        torch.set_default_dtype(torch.float32)
    params = sum(p.numel() for p in model.parameters())
    weights = (torch.cuda.memory_allocated() - base) / GB if cuda else params * 2 / GB
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (micro_batch, seq_len), device=device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = model(input_ids=ids).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-logp.mean()).backward()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        del logits, logp
    peak = (torch.cuda.max_memory_allocated() - base) / GB if cuda else float("nan")
    step_s = sorted(times[1:] or times)[len(times[1:] or times) // 2]
    del model
    return {"shape": shape, "params_b": params / 1e9, "micro_batch": micro_batch, "seq_len": seq_len,
            "gradient_checkpointing": checkpointing, "weights_gb": weights, "peak_fwd_bwd_gb": peak,
            "adamw_fp32_states_gb": params * 12 / GB, "fwd_bwd_s": step_s,
            "train_tokens_per_s": micro_batch * seq_len / step_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["1.5b", "7b"], choices=sorted(SHAPES))
    p.add_argument("--micro-batch", type=int, default=4, help="the presets' ppo.micro_batch_size")
    p.add_argument("--seq-len", type=int, default=1536, help="prompt + answer tokens (the presets: ~1 k + 512)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", default="", help="write the rows here too")
    a = p.parse_args()
    rows = []
    for shape in a.shapes:
        for ckpt in (True, False):
            try:
                rows.append(measure(shape, a.micro_batch, a.seq_len, ckpt, a.device))
            except torch.OutOfMemoryError as exc:
                rows.append({"shape": shape, "gradient_checkpointing": ckpt, "error": str(exc).splitlines()[0]})
            print(json.dumps(rows[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
