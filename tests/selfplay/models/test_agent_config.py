"""Per-agent PPO settings (selfplay.models.agent.agent_ppo_config)."""

from selfplay.models.agent import agent_ppo_config
from selfplay.runtime.config import load_config


def test_generator_samples_at_its_own_temperature_and_agents_do_not_share_settings():
    cfg = load_config(None, ["ppo.temperature=1.0", "agents.generator.temperature=0.4", "ppo.kl_coef=0.2"])
    solver, generator = agent_ppo_config(cfg, "solver"), agent_ppo_config(cfg, "generator")
    assert (solver.temperature, generator.temperature) == (1.0, 0.4)
    assert solver.kl_coef == generator.kl_coef == 0.2
    solver.kl_coef = 0.9  # one agent's settings changing at run time (e.g. eval's temperature) leaves the other's
    assert generator.kl_coef == cfg.ppo.kl_coef == 0.2 and cfg.ppo.temperature == 1.0


def test_the_generator_takes_its_own_kl_and_entropy_coefficients_where_set():
    from selfplay.rl.core import linear_schedule

    base = ["ppo.kl_coef=0.05", "ppo.entropy_coef_start=0.01", "ppo.entropy_coef_end=0.001"]
    cfg = load_config(None, base + ["agents.generator.kl_coef=null", "agents.generator.entropy_coef=null"])
    solver, generator = agent_ppo_config(cfg, "solver"), agent_ppo_config(cfg, "generator")
    assert generator.kl_coef == solver.kl_coef == 0.05  # unset: as ppo's
    assert (generator.entropy_coef_start, generator.entropy_coef_end) == (0.01, 0.001)
    cfg = load_config(None, base + ["agents.generator.kl_coef=0.2", "agents.generator.entropy_coef=0"])
    solver, generator = agent_ppo_config(cfg, "solver"), agent_ppo_config(cfg, "generator")
    assert (solver.kl_coef, generator.kl_coef) == (0.05, 0.2)
    assert (solver.entropy_coef_start, solver.entropy_coef_end) == (0.01, 0.001)
    for update in (0, 10, 10_000):  # the generator's bonus is the same at every update
        g = linear_schedule(
            generator.entropy_coef_start, generator.entropy_coef_end, update, generator.entropy_decay_updates
        )
        assert g == 0.0
    assert linear_schedule(solver.entropy_coef_start, solver.entropy_coef_end, 0, solver.entropy_decay_updates) == 0.01


def test_the_generator_takes_its_own_advantage_and_the_solver_keeps_ppos():
    cfg = load_config("configs/smoke.yaml", ["ppo.advantage=gae"])
    assert agent_ppo_config(cfg, "generator").advantage == "gae"  # the key's default: its critic
    assert agent_ppo_config(load_config(None), "generator").advantage == "rloo"  # the tiny default's
    cfg = load_config(None, ["ppo.advantage=gae", "agents.generator.advantage=rloo_batch"])
    solver, generator = agent_ppo_config(cfg, "solver"), agent_ppo_config(cfg, "generator")
    assert (solver.advantage, generator.advantage) == ("gae", "rloo")
    cfg = load_config(None, ["ppo.advantage=rloo", "agents.generator.advantage=gae"])
    assert (agent_ppo_config(cfg, "solver").advantage, agent_ppo_config(cfg, "generator").advantage) == ("rloo", "gae")


def test_settings_that_cannot_learn_are_refused_at_start_naming_their_keys():
    import pytest

    from selfplay.runtime.errors import UserError

    cases = {
        ("train.samples_per_task=1", "ppo.skip_uniform_groups=true"): "train.samples_per_task.*ppo.skip_uniform_groups",
        ("train.samples_per_task=1", "ppo.advantage=rloo"): "train.samples_per_task.*ppo.advantage",
        ("ppo.top_k=5",): "ppo.top_k",
        ("ppo.top_p=0.9",): "ppo.top_p",
        ("ppo.mini_batch_size=6", "ppo.micro_batch_size=4"): "ppo.mini_batch_size",
        ("agents.generator.kl_coef=-0.1",): "agents.generator.kl_coef",
        ("agents.generator.entropy_coef=-1",): "agents.generator.entropy_coef",
        ("agents.generator.advantage=grpo",): "agents.generator.advantage",
        ("agents.generator.advantage=rloo_batch", "train.proposals=1"): "agents.generator.advantage.*train.proposals",
        ("agents.solver.temperature=0",): "agents.solver.temperature",
        ("agents.solver.max_new_tokens=0",): "agents.solver.max_new_tokens",
        ("agents.generator.lr_scale=-1",): "agents.generator.lr_scale",
    }
    for overrides, match in cases.items():
        with pytest.raises(UserError, match=match):
            load_config(None, list(overrides))
    load_config(None, ["train.samples_per_task=2", "ppo.skip_uniform_groups=true", "ppo.advantage=rloo"])


def test_the_solver_takes_its_own_budget_temperature_and_kl_over_ppos():
    cfg = load_config(
        None,
        [
            "ppo.max_new_tokens=100",
            "agents.solver.max_new_tokens=40",
            "agents.solver.temperature=0.5",
            "agents.solver.kl_coef=0.01",
        ],
    )
    solver, generator = agent_ppo_config(cfg, "solver"), agent_ppo_config(cfg, "generator")
    assert (solver.max_new_tokens, solver.temperature, solver.kl_coef) == (40, 0.5, 0.01)
    assert generator.max_new_tokens == cfg.agents.generator.max_new_tokens and generator.temperature == 0.7
    assert agent_ppo_config(load_config(None, ["ppo.max_new_tokens=100"]), "solver").max_new_tokens == 100


def test_a_moved_key_is_refused_naming_its_new_place(tmp_path):
    import pytest

    from selfplay.runtime.config import MOVED
    from selfplay.runtime.errors import UserError

    for old, new in MOVED.items():
        with pytest.raises(UserError, match=f"override: {old} is now {new}"):
            load_config(None, [f"{old}=1"])
    path = tmp_path / "old.yaml"
    path.write_text("base: " + str(load_config.__globals__["DEFAULT_CONFIG"]) + "\ntrain:\n  generator_kl_coef: 0.1\n")
    with pytest.raises(UserError, match="train.generator_kl_coef is now agents.generator.kl_coef"):
        load_config(path)
