"""The rollout engine as an extension point (docs/extending.md "A rollout engine"): every agent samples through an
engine, `make_engine` builds the registered one `rollout.engine` names, and the worked example of the docs,
docs/examples/copy_engine.py, samples, takes part in a PPO update and reports its syncs as the shipped engines do."""

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from docs.examples.copy_engine import CopyEngine
from selfplay.models.factory import train_tokenizer
from selfplay.rollout.engine import HFEngine, engine_metrics
from selfplay.rollout.engines import make_engine
from selfplay.runtime.config import load_config
from selfplay.runtime.errors import UserError
from tests.selfplay.rollout.test_engine import TEXTS, make_agent, prompts


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXTS, vocab_size=400, kind="bpe")


def test_an_agent_samples_through_the_hf_engine_unless_given_another(tok, tmp_path):
    agent = make_agent(tok)
    assert type(agent.engine) is HFEngine  # built outside the loop (warm start, selfplay eval): Hugging Face
    assert type(make_engine(load_config(None, []), agent, tmp_path)) is HFEngine
    copy = load_config(None, ["rollout.generator_engine=copy"])  # the example registered itself on import
    assert type(make_engine(copy, agent, tmp_path)) is CopyEngine
    agent.name = "solver"
    assert type(make_engine(copy, agent, tmp_path)) is HFEngine  # rollout.engine stays hf


@pytest.mark.parametrize("key", ["rollout.engine", "rollout.generator_engine"])
def test_an_engine_nobody_registered_is_refused_naming_the_key_and_the_names(key):
    with pytest.raises(UserError, match=rf"^{key} must be one of hf, vllm, copy, got 'cpoy'$"):
        load_config(None, [f"{key}=cpoy"])


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), greedy=st.booleans())
def test_the_copy_engine_draws_what_generate_on_the_trainers_model_draws(tok, seed, greedy):
    agent = make_agent(tok)
    agent.engine = CopyEngine(agent)
    ps = prompts(agent, 3)
    torch.manual_seed(seed)
    mine = agent.sample(ps, greedy=greedy, max_new_tokens=12)
    torch.manual_seed(seed)
    theirs = HFEngine().sample(agent, ps, agent.sampling(greedy=greedy, max_new_tokens=12))
    assert [(a.tokens, a.logprobs, a.finished) for a in mine] == [(a.tokens, a.logprobs, a.finished) for a in theirs]


def test_the_copy_engine_takes_the_weights_of_a_ppo_update_and_reports_its_sync(tok, tmp_path):
    agent = make_agent(tok)
    agent.engine = make_engine(load_config(None, ["rollout.engine=copy"]), agent, tmp_path)
    before = {k: v.clone() for k, v in agent.engine.policy.state_dict().items()}
    answers = agent.sample(prompts(agent, 4))
    stats = agent.update(answers, [1.0, 0.0, 0.5, 0.0])
    now = agent.engine.policy.state_dict()
    trained = agent.module.policy.state_dict()
    assert all(torch.equal(now[k], trained[k]) for k in now)
    assert any(not torch.equal(now[k], before[k]) for k in now)  # the update moved them, and the copy followed
    assert engine_metrics(agent) == {"time/weight_sync_s": stats["weight_sync_s"]}
    assert engine_metrics(agent) == {"time/weight_sync_s": 0.0}  # taken: nothing since the last call
    torch.manual_seed(7)
    mine = agent.sample(prompts(agent, 2), greedy=True)
    assert [a.tokens for a in mine] == [
        a.tokens for a in HFEngine().sample(agent, prompts(agent, 2), agent.sampling(greedy=True))
    ]


def test_the_hf_engine_adds_no_sync_to_an_update_and_no_engine_metrics(tok):
    agent = make_agent(tok)
    stats = agent.update(agent.sample(prompts(agent, 4)), [1.0, 0.0, 0.5, 0.0])
    assert "weight_sync_s" not in stats and engine_metrics(agent) == {}


def test_docs_example_is_the_module_the_test_runs():
    """docs/extending.md shows docs/examples/copy_engine.py's engine as it is, not a copy that could drift."""
    root = Path(__file__).resolve().parents[3]
    guide = (root / "docs" / "extending.md").read_text()
    section = guide[guide.index("## 1. A rollout engine") : guide.index("## 2. ")]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    module = (root / "docs" / "examples" / "copy_engine.py").read_text()
    assert block.startswith("class CopyEngine:") and block in module
