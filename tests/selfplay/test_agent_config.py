"""Per-agent PPO settings (selfplay.agent.agent_ppo_config)."""

from selfplay.agent import agent_ppo_config
from selfplay.config import load_config


def test_generator_samples_at_its_own_temperature_and_agents_do_not_share_settings():
    cfg = load_config(None, ["ppo.temperature=1.0", "train.generator_temperature=0.4", "ppo.kl_coef=0.2"])
    solver, generator = agent_ppo_config(cfg, "solver"), agent_ppo_config(cfg, "generator")
    assert (solver.temperature, generator.temperature) == (1.0, 0.4)
    assert solver.kl_coef == generator.kl_coef == 0.2
    solver.kl_coef = 0.9  # one agent's settings changing at run time (e.g. eval's temperature) leaves the other's
    assert generator.kl_coef == cfg.ppo.kl_coef == 0.2 and cfg.ppo.temperature == 1.0
