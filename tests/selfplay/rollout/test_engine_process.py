"""One vLLM engine per process: with both agents on vLLM, make_engine keeps the solver's engine in this process and
puts the generator's in a child process of its own (selfplay/rollout/engine_process.py), which answers as the
in-process engine does, takes the updated weights, reports its errors and its death in one line, and is gone after
close. A second in-process engine is refused. Runs vLLM's CPU build for real (one child start, shared)."""

import os
import signal

import pytest
import torch

from generator.agent import ProposalError
from generator.mutation import MAX_ANSWER_TOKENS, parse_mutation
from selfplay.models.agent import LMAgent
from selfplay.models.factory import ActorCritic, build_tiny_model, frozen_copy, train_tokenizer
from selfplay.rollout.engine import EngineError, VLLMEngine, engine_metrics, logprob_gap
from selfplay.rollout.engine_process import ChildEngine
from selfplay.rollout.engines import make_engine
from selfplay.runtime.config import PPOConfig, load_config
from selfplay.runtime.errors import UserError
from tests.selfplay.rollout.test_engine import (
    GAP_TOL,
    TEMPERATURE,
    TEXTS,
    engine_prompt_logprobs,
    hf_greedy,
    prompts,
    trainer_logprobs,
)

pytestmark = pytest.mark.vllm


def make_agent(name, tok):
    """test_engine's agent (the same weights for both names), named `name`."""
    torch.manual_seed(0)
    policy = build_tiny_model(tok, arch="llama", n_layer=1, n_embd=64, n_head=2, max_positions=256)
    with torch.no_grad():
        policy.model.norm.weight.mul_(5.0)
    cfg = PPOConfig(
        mini_batch_size=4, micro_batch_size=4, max_new_tokens=24, temperature=TEMPERATURE, epochs=1, lr=3e-3
    )
    return LMAgent(name, ActorCritic(policy), frozen_copy(policy), tok, cfg, seed=0)


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    """The solver and the generator, the same weights, their engines made as the loop makes them."""
    import vllm  # noqa: F401 - never skipped: a missing vLLM fails these tests

    tok = train_tokenizer(TEXTS, vocab_size=400, kind="bpe")
    cfg = load_config(None, ["rollout.engine=vllm", f"rollout.sync_dir={tmp_path_factory.mktemp('sync')}"])
    pair = {}
    for name in ("solver", "generator"):
        agent = make_agent(name, tok)
        folder = tmp_path_factory.mktemp(name)
        agent.module.save_pretrained(folder)
        tok.save_pretrained(folder)
        agent.engine = make_engine(cfg, agent, folder)
        pair[name] = agent
    yield pair["solver"], pair["generator"]
    for agent in pair.values():
        agent.engine.close()


def test_the_generators_engine_lives_in_a_child_process(agents):
    solver, generator = agents
    assert type(solver.engine) is VLLMEngine and solver.engine.llm is not None
    assert isinstance(generator.engine, ChildEngine) and not hasattr(generator.engine, "llm")
    assert generator.engine.pid != os.getpid() and generator.engine.process.is_alive()
    with pytest.raises(UserError, match=r"a second vLLM engine in this process"):
        VLLMEngine(generator, "/nonexistent", solver.engine.rcfg)


def test_the_child_answers_as_the_in_process_engine(agents):
    """The same weights: the child's greedy answers are the in-process engine's and Hugging Face's; its sampled
    answers carry the trainer's log-probs."""
    solver, generator = agents
    ps = prompts(generator, 4)
    theirs = [a.tokens for a in generator.sample(ps, greedy=True)]
    assert theirs == [a.tokens for a in solver.sample(ps, greedy=True)]
    assert theirs[0] == hf_greedy(generator, ps[:1])[0].tokens
    answers = generator.sample(prompts(generator, 8))
    for a in answers:
        assert 0 < len(a.tokens) and len(a.logprobs) == len(a.tokens) and a.text == generator.decode(a.tokens)
        assert a.finished == (a.tokens[-1] in generator.eos_ids)
    assert logprob_gap(generator, answers) < GAP_TOL
    metrics = engine_metrics(solver, generator)
    assert 0 <= metrics["rollout/logprob_gap/generator"] < GAP_TOL


def test_the_child_decodes_under_the_generators_grammar(agents):
    _, generator = agents
    generator.constrain("mutation")
    try:
        answers = generator.sample(prompts(generator, 4), max_new_tokens=MAX_ANSWER_TOKENS)
    finally:
        generator.constraint = None
    assert not [a.text for a in answers if isinstance(parse_mutation(a.text), ProposalError)]
    assert all(a.allowed is not None and a.allowed.shape[0] == len(a.tokens) for a in answers)
    assert logprob_gap(generator, answers) < GAP_TOL
    generator.engine.take_metrics()


def test_after_an_update_the_child_holds_the_new_weights_and_the_solvers_engine_its_own(agents):
    solver, generator = agents
    ids = generator.chat_ids("Edit one reference task's program. 1") + [5, 6, 7, 8]
    before, solver_before = engine_prompt_logprobs(generator, ids), engine_prompt_logprobs(solver, ids)
    assert (before - solver_before).abs().max() < GAP_TOL
    stats = generator.update(generator.sample(prompts(generator, 4)), [1.0, 0.0, 1.0, 0.0])
    assert stats["weight_sync_s"] > 0 and generator.engine.sync_method == "folder"
    assert not generator.engine.sync_folder().exists()  # the copy left no memory taken in rollout.sync_dir
    after = engine_prompt_logprobs(generator, ids)
    assert (after - trainer_logprobs(generator, ids)).abs().max() < GAP_TOL
    assert (after - before).abs().max() > 100 * GAP_TOL
    assert (engine_prompt_logprobs(solver, ids) - solver_before).abs().max() < GAP_TOL  # another engine, untouched
    assert logprob_gap(generator, generator.sample(prompts(generator, 4))) < GAP_TOL  # no stale prefix cache
    assert engine_metrics(generator)["time/weight_sync_s"] == pytest.approx(stats["weight_sync_s"])


def test_a_childs_error_is_one_line_naming_the_agent_and_it_serves_on(agents):
    _, generator = agents
    with pytest.raises(EngineError, match=r"^the generator's vLLM engine failed: [^\n]+$"):
        generator.sample([[10**6, 5]])
    assert generator.sample(prompts(generator, 2))[0].tokens
    engine = generator.engine  # a request whose caller was interrupted: its late answer is not the next one's
    engine.seq += 1
    engine.conn.send((engine.seq, "generate", [[5, 6]], [dict(max_tokens=1, detokenize=False)]))
    greedy = generator.sample(prompts(generator, 3), greedy=True)
    assert len(greedy) == 3 and [a.tokens for a in greedy] == [
        a.tokens for a in generator.sample(prompts(generator, 3), greedy=True)
    ]


def test_a_dead_child_is_reported_and_close_leaves_no_process(agents):
    """Last: it kills the shared child. The request ends on the child's death (the message names its process), not
    on the request's time limit; how soon is the watcher's poll, not bounded here (a loaded machine stretches it)."""
    _, generator = agents
    engine = generator.engine
    os.kill(engine.pid, signal.SIGKILL)
    with pytest.raises(
        EngineError,
        match=rf"^the generator's vLLM engine failed: its process {engine.pid} "
        r"(exited|is not running|cannot be reached)",
    ):
        generator.sample(prompts(generator, 2))
    engine.close()
    engine.close()  # twice: nothing left to do
    assert not engine.process.is_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(engine.pid, 0)
