"""selfplay: a task generator and a PPO-trained solver co-evolve over a sandbox.

Orchestration and training live here (config, models, PPO, the loop, mixer, corpus, checkpoints,
logging, evaluation, export, CLI). The agents themselves live in `generator/` and `solver/`,
code execution in `sandbox/`.
"""

__version__ = "0.1.0"
