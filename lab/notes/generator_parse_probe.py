"""Diagnostic behind the README/issue-5 finding: does the tiny generator's proposal parse, greedy vs sampled at T=1,
before and after more SFT? Run from the repo root after `selfplay compare ... --shared-warmstart --out runs/compare`:

    PYTHONPATH=. python lab/notes/generator_parse_probe.py 400     # 400 more generator SFT steps (~14 min, 2 cores)
"""

import random
import sys
import time
from pathlib import Path

import torch

from generator.agent import ProposalError, build_prompt, parse_proposal
from selfplay.data.corpus import Corpus
from selfplay.models.agent import LMAgent, load_agent_parts
from selfplay.rl.sft import sft
from selfplay.runtime.config import load_config
from selfplay.train.warmstart import generator_examples, tokenize_pairs

torch.set_num_threads(1)
cfg = load_config("configs/tiny.yaml", [])
warm = Path("runs/compare/warmstart")
model, ref, tok = load_agent_parts(warm / "checkpoints/step_0/generator")
agent = LMAgent("generator", model, ref, tok, cfg.ppo)
tasks = Corpus(warm / "corpus.sqlite").query(source="procedural")
rng = random.Random(5)
probe = [build_prompt([t], "mutate") for t in rng.sample(tasks, 24)]


def parse_rate(label):
    ids = [agent.chat_ids(p, 512 - 384) for p in probe]
    for greedy in (True, False):
        ans = agent.sample(ids, greedy=greedy, max_new_tokens=384)
        ok = [not isinstance(parse_proposal(a.text), ProposalError) for a in ans]
        errs = [str(parse_proposal(a.text))[:50] for a in ans if isinstance(parse_proposal(a.text), ProposalError)]
        print(label, "greedy" if greedy else "sampled", f"parse rate {sum(ok)}/{len(ok)}", errs[:3], flush=True)


parse_rate("after 200 steps:")
ex = tokenize_pairs(agent, generator_examples(tasks, 1, 0), 512)
steps = int(sys.argv[1])
t0 = time.time()
losses = sft(
    agent.module.policy,
    ex,
    steps=steps,
    batch_size=16,
    lr=1e-3,
    pad_id=tok.pad_token_id,
    max_len=512,
    seed=1,
    on_step=lambda i, l: print(i, round(l, 3), round(time.time() - t0), flush=True) if i % 50 == 0 else None,
)
print("loss last", sum(losses[-20:]) / 20, flush=True)
parse_rate(f"after 200+{steps} steps:")
