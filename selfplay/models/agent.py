"""One trainable LLM agent (the solver or the generator): policy + value head, frozen reference, tokenizer,
optimiser or DeepSpeed engine, PPO trainer — and the few things the loop does with it: turn chat messages into
token ids, sample answers, run a PPO update, save and load.

Checkpoint layout of an agent inside `RUN_DIR/checkpoints/step_N/<name>/`:
    policy in HF `save_pretrained` format (loadable alone by `selfplay eval` or any HF code), `value_head.pt`,
    tokenizer files, `reference/` (the frozen KL anchor; written once: a later checkpoint holds `reference.json`
    naming it, selfplay/runtime/checkpoint.py; a LoRA adapter's own base, `lora/base/`, likewise), `trainer.pt`
    (PPO counters, KL controller, RNG), and either `optimizer.pt` (plain torch) or `deepspeed/` (a DeepSpeed
    checkpoint, engine + optimiser shards, in `deepspeed/agent/`; once resumed on another number of ranks, also their
    universal conversion, `deepspeed/universal/`: `zero_universal`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from selfplay.models.factory import (
    ActorCritic,
    AdapterOff,
    ensure_chat_template,
    fresh_lora,
    frozen_copy,
    is_lora,
    save_plain,
    torch_dtype,
)
from selfplay.rl.ppo import PPOTrainer, is_deepspeed_engine, policy_of
from selfplay.rollout.engine import HFEngine
from selfplay.rollout.engines import Answer, RolloutEngine, Sampling
from selfplay.runtime.checkpoint import LORA_BASE_DIR, REFERENCE_DIR, reference_folder, write_reference_pointer


class LMAgent:
    def __init__(self, name: str, model: ActorCritic, reference, tokenizer, ppo_cfg, *, wrap=None, seed: int = 0):
        """`wrap(model) -> (model_or_engine, optimizer_or_None)` puts the model under DeepSpeed/DDP (see
        selfplay.runtime.distributed.wrap_model); without it a plain AdamW is used."""
        self.name, self.tokenizer, self.cfg = name, tokenizer, ppo_cfg
        self.reference = reference
        self.module = model  # the ActorCritic itself (engines and DDP wrap it)
        self.model, optimizer = wrap(model) if wrap is not None else (model, None)
        self.trainer = PPOTrainer(
            self.model, reference, ppo_cfg, optimizer, pad_token_id=tokenizer.pad_token_id, seed=seed
        )
        self.eos_ids = sorted(
            {
                tokenizer.eos_token_id,
                *([tokenizer.convert_tokens_to_ids("<|end|>")] if "<|end|>" in tokenizer.get_vocab() else []),
            }
        )
        self.constraint = None  # a compiled grammar (selfplay.rollout.constrained): sample() then decodes under it
        # what samples its answers (selfplay/rollout/engines.py); the loop's agents get rollout.engine's (make_engine)
        self.engine: RolloutEngine = HFEngine()
        self.close_reserve = 0  # tokens of the budget kept to close a cut-off answer under its grammar (constrain)
        self.closer = None
        self.sampled_tokens = 0  # every answer token this agent has sampled (redrawn and struck answers included)
        # where a checkpoint of the run holds the frozen reference ("step_0/solver/reference", relative to its
        # checkpoints folder): later saves point there (`save_reference`); set when saved or loaded
        self.reference_home: str | None = None
        self.lora_base_home: str | None = None  # the same for a LoRA adapter's own base (`lora/base`), if it has one

    def constrain(self, fmt: str, close_reserve: int = 0) -> None:
        """Decode every answer under the grammar of proposal format `fmt` (generator.constrained); refuses, naming
        the key, a grammar that cannot be compiled for this tokenizer. `close_reserve` > 0 (generator.close_reserve):
        answers are sampled within the budget less that many tokens, and one still unfinished there is closed under
        its grammar in what is left (selfplay.rollout.constrained.Closer)."""
        from selfplay.rollout.constrained import Closer, compile_constraint

        vocab = policy_of(self.model).config.vocab_size  # the logits' width (weights may be partitioned)
        self.constraint = compile_constraint(self.tokenizer, fmt, vocab, self.eos_ids)
        self.close_reserve = int(close_reserve)
        self.closer = Closer(self.tokenizer, vocab, self.eos_ids) if close_reserve > 0 else None

    @property
    def zero3(self) -> bool:
        """ZeRO-3 partitions parameters: every rank must take part in each generation step."""
        return is_deepspeed_engine(self.model) and self.model.zero_optimization_stage() == 3

    @property
    def lora(self) -> bool:
        """Whether PPO trains a LoRA adapter over frozen weights."""
        return is_lora(self.module.policy)

    @property
    def max_positions(self) -> int | None:
        """Longest sequence the model can take (prompt + answer), if its config says."""
        config = policy_of(self.model).config
        return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)

    # ---- text <-> ids ---------------------------------------------------------------------------------
    def chat_ids(self, user: str, max_prompt_tokens: int | None = None) -> list[int]:
        """The user message through the chat template, with the generation prompt. Prompts longer than
        `max_prompt_tokens` (default: what leaves room for `max_new_tokens` in the model) lose their start."""
        ids = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        if self.max_positions is not None:
            room = self.max_positions - self.cfg.max_new_tokens
            max_prompt_tokens = room if max_prompt_tokens is None else min(max_prompt_tokens, room)
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            ids = ids[-max_prompt_tokens:]  # keep the end: the instruction and the generation prompt
        return ids

    def observation_ids(self, text: str) -> list[int]:
        """Tokens of a user message inserted between two assistant turns (an observation), followed by the
        assistant generation prompt: the chat template's rendering of that message in context, whatever the
        template (some add a default system prompt to a conversation's first message only)."""
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        before = self.tokenizer.apply_chat_template(base, tokenize=False)
        after = self.tokenizer.apply_chat_template(
            base + [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        delta = after[len(before) :] if after.startswith(before) else after
        return list(self.tokenizer(delta, add_special_tokens=False)["input_ids"])

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode([t for t in tokens if t not in self.eos_ids], skip_special_tokens=True)

    # ---- sampling -------------------------------------------------------------------------------------
    def sampling(self, *, greedy: bool = False, max_new_tokens: int | None = None, batch_size: int = 64) -> Sampling:
        """The sampling parameters of a batch: this agent's temperature and stop ids, `max_new_tokens` (default
        ppo.max_new_tokens)."""
        return Sampling(
            temperature=float(self.cfg.temperature),
            greedy=greedy,
            stop_ids=tuple(self.eos_ids),
            max_new_tokens=max_new_tokens or self.cfg.max_new_tokens,
            batch_size=batch_size,
        )

    def sample(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        greedy: bool = False,
        max_new_tokens: int | None = None,
        batch_size: int = 64,
        budgets: Sequence[int] | None = None,
    ) -> list[Answer]:
        """One answer per prompt (repeat a prompt for k samples), batched, from the agent's rollout engine. Under a
        grammar with a closing reserve (`constrain`), sampling stops `close_reserve` tokens short of the budget and
        an answer unfinished there is closed under its grammar within the rest (its closing tokens forced: masks
        that allow only them, so every policy gives them log-prob 0 and PPO stays on-policy). `budgets`: each row's
        own budget, at most `max_new_tokens` (a row is then cut at its budget less the reserve, and closed within it;
        without a reserve the caller cuts)."""
        from selfplay.rollout.constrained import close_answers, grammars_ahead

        max_new = max_new_tokens or self.cfg.max_new_tokens
        closing = self.closer is not None and self.constraint is not None and len(prompts) > 0
        grammars = grammars_ahead(self.constraint, len(prompts)) if closing else None
        budget = max(1, max_new - self.close_reserve) if closing else max_new
        answers = self.engine.sample(
            self, prompts, self.sampling(greedy=greedy, max_new_tokens=budget, batch_size=batch_size)
        )
        if closing:
            limit = self.max_positions
            budgets = [max_new] * len(answers) if budgets is None else budgets
            for a, b in zip(answers, budgets):
                keep = max(1, b - self.close_reserve)
                if len(a.tokens) > keep:  # this row's own budget is shorter than the batch's
                    a.tokens, a.finished, a.allowed, a.logprobs = a.cut(keep)
                    a.text = self.decode(a.tokens)
            room = [
                (b if limit is None else min(b, limit - len(a.prompt))) - len(a.tokens)
                for a, b in zip(answers, budgets)
            ]
            close_answers(answers, grammars, self.closer, room, self.decode)
        self.sampled_tokens += sum(len(a.tokens) for a in answers)
        return answers

    # ---- learning -------------------------------------------------------------------------------------
    def set_learning_rate(self, lr: float) -> None:
        """The base learning rate of every parameter group (`update` multiplies it by its lr_scale). Called after
        loading a checkpoint: the optimiser state restores the learning rate it was saved with, and a run's
        configured one must win (`ppo.lr`, `agents.<name>.lr_scale`)."""
        for group in self.trainer.optimizer.param_groups if self.trainer.optimizer is not None else []:
            group["lr"] = group["base_lr"] = float(lr)

    def update(
        self,
        answers: Sequence,
        scores: Sequence[float],
        lr_scale: float = 1.0,
        masks: Sequence[Sequence[int]] | None = None,
        replay: Sequence | None = None,
        groups: Sequence | None = None,
    ) -> dict:
        """One PPO update on these answers (anything with .prompt and .tokens) and their scalar rewards;
        `masks` marks the response tokens the policy chose (0 for observations in multi-turn episodes).
        `replay`: past successes (selfplay.rl.replay.ReplayItem) for the auxiliary NLL loss (ppo.replay_coef);
        `groups`: the task of each answer (the leave-one-out baseline of ppo.advantage=rloo). A rollout engine
        gets the updated weights after it (stats' weight_sync_s, where it holds weights of its own)."""
        self.engine.before_update()
        for group in self.trainer.optimizer.param_groups:
            group.setdefault("base_lr", group["lr"])
            group["lr"] = group["base_lr"] * lr_scale
        replayed = None
        if replay:
            replayed = (
                [x.prompt for x in replay],
                [x.tokens for x in replay],
                [x.mask if x.mask is not None else [1] * len(x.tokens) for x in replay],
            )
        allowed = [getattr(a, "allowed", None) for a in answers]  # the grammar's masks, when answers were constrained
        # the sampler's log-probs (ppo.tis_cap), where an answer carries one per token; else unknown (weight 1)
        behaviour = [
            lp if (lp := getattr(a, "logprobs", None)) is not None and len(lp) == len(a.tokens) else None
            for a in answers
        ]
        stats = self.trainer.step(
            [a.prompt for a in answers],
            [a.tokens for a in answers],
            list(scores),
            response_masks=masks,
            replay=replayed,
            groups=groups,
            allowed=allowed if any(x is not None for x in allowed) else None,
            behaviour_logprobs=behaviour if any(x is not None for x in behaviour) else None,
        )
        seconds = self.engine.sync(self)
        if seconds is not None:
            stats["weight_sync_s"] = seconds
        return stats

    # ---- checkpoints ----------------------------------------------------------------------------------
    def save(self, folder: Path, write_hf: bool = True) -> None:
        """Everything needed to resume (collective under DeepSpeed: call on every rank). The weights go into their
        files one tensor at a time (`ActorCritic.save_pretrained`: a LoRA policy merged one layer at a time), so no
        copy of the model is made; under ZeRO-3 each tensor is gathered alone, every rank taking part while rank 0
        (`write_hf`) writes it. What is frozen (the reference, a LoRA adapter's own base) is written once and pointed
        to afterwards (`save_reference`)."""
        folder.mkdir(parents=True, exist_ok=True)
        if is_deepspeed_engine(self.model):
            # a LoRA policy's frozen base is the reference (or lora/base), written once: DeepSpeed's files keep the
            # trained tensors' states, not every rank's share of the frozen weights again (`load_training_state`)
            self.model.save_checkpoint(str(folder / "deepspeed"), tag="agent", exclude_frozen_parameters=self.lora)
        if write_hf or self.zero3:  # (under ZeRO-3 the ranks that write nothing take part in the gathers)
            base_home = self.earlier(self.lora_base_home, folder)
            self.module.save_pretrained(folder if write_hf else None, lora_base_home=base_home)
            if is_lora(self.module.policy) and self.module.lora_base == "base" and base_home is None:
                self.lora_base_home = self.home_in(folder, LORA_BASE_DIR)
            self.save_reference(folder, write=write_hf)
        if write_hf:  # rank 0 only
            self.tokenizer.save_pretrained(folder)
            torch.save(self.trainer.state_dict(), folder / "trainer.pt")
            if not is_deepspeed_engine(self.model):
                torch.save(self.trainer.optimizer.state_dict(), folder / "optimizer.pt")

    @staticmethod
    def earlier(home: str | None, folder: Path) -> str | None:
        """`home` (frozen weights, relative to the checkpoints folder) where agent folder `folder`
        (checkpoints/step_N[.partial]/<name>) may point to it: in an earlier checkpoint that exists; else None."""
        root, step = folder.parent.parent, folder.parent.name.removesuffix(".partial")
        return home if home and not home.startswith(f"{step}/") and (root / home).is_dir() else None

    @staticmethod
    def home_in(folder: Path, sub: str) -> str:
        """Where frozen part `sub` written into agent folder `folder` will lie once its checkpoint is committed."""
        return f"{folder.parent.name.removesuffix('.partial')}/{folder.name}/{sub}"

    def save_reference(self, folder: Path, write: bool = True) -> None:
        """The frozen reference into agent folder `folder` (checkpoints/step_N[.partial]/<name>): a pointer to where
        an earlier checkpoint of the run holds it (`reference_home`), else its bytes, once, streamed one tensor at a
        time. A LoRA policy's adapter over that reference loads it through the pointer too
        (selfplay/models/factory.py `load_lora`). Under ZeRO-3 the reference that is the policy's partitioned base
        (`AdapterOff`) is gathered one tensor at a time on every rank (`write` on the one that writes)."""
        home = self.earlier(self.reference_home, folder)
        if home is not None:
            if write:
                write_reference_pointer(folder, home)
            return
        out = folder / REFERENCE_DIR if write else None
        if isinstance(self.reference, AdapterOff):
            self.reference.save_pretrained(out)  # a collective under ZeRO-3
        elif write:
            save_plain(self.reference, out)
        self.reference_home = self.home_in(folder, REFERENCE_DIR)

    def checksum(self) -> str:
        """sha256 of the weights (a collective under ZeRO-3, which gathers the partitions: call on every rank)."""
        from selfplay.runtime.distributed import param_checksum

        return param_checksum(self.module)["sha256"]

    def load_training_state(self, folder: Path) -> None:
        """Optimiser (engine) and trainer state saved with the weights. A checkpoint written by the other kind of
        optimiser (e.g. the single-process warm start, then a DeepSpeed run) keeps the weights and starts the
        optimiser afresh."""
        if is_deepspeed_engine(self.model):
            # ZeRO shards its optimiser states per rank: shards of another world size load from their universal
            # conversion (`zero_universal`, made by checkpointing.resized); without one they keep the weights (read
            # from the HF copy) and start the optimiser afresh (checkpointing.resized says so, naming what was reset)
            if (folder / "deepspeed").is_dir() and zero_shards(folder) in (0, self.model.world_size):
                # (a LoRA engine's checkpoint holds no frozen weights: they are loaded from the HF copy's base)
                self.model.load_checkpoint(str(folder / "deepspeed"), tag="agent", load_module_strict=not self.lora)
            elif (folder / "deepspeed" / UNIVERSAL_TAG).is_dir():
                self.load_universal(folder / "deepspeed")
        elif (folder / "optimizer.pt").exists() and not fresh_lora(folder):  # a fresh adapter: a fresh optimiser
            self.trainer.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu"))
        self.trainer.load_state_dict(torch.load(folder / "trainer.pt", map_location="cpu", weights_only=False))

    def load_universal(self, ds_folder: Path) -> None:
        """The engine's state from the universal checkpoint in `ds_folder` (`zero_universal`): every rank takes its
        share of each parameter's fp32 master weights and Adam moments, the step counts (the optimiser's, the
        engine's global_steps) and the trained weights (copied from the masters). DeepSpeed reads the universal
        format where its config says `checkpoint.load_universal`; it is set for this load alone."""
        config = self.model._config
        config.load_universal_checkpoint = True
        try:
            self.model.load_checkpoint(str(ds_folder), tag=UNIVERSAL_TAG, load_module_strict=not self.lora)
        finally:
            config.load_universal_checkpoint = False


UNIVERSAL_TAG = "universal"  # agent/deepspeed/universal/: the ZeRO shards converted for any world size


def zero_universal(folder: Path) -> Path:
    """Agent folder `folder`'s DeepSpeed ZeRO checkpoint (`deepspeed/agent/`, one optimiser shard per rank that wrote
    it) converted by DeepSpeed's `ds_to_universal` into its universal format, `deepspeed/universal/`: each
    parameter's fp32 master weights, Adam moments and step count whole, which load on any number of ranks
    (`LMAgent.load_universal`). Converted once and kept with the checkpoint (written into `universal.partial/`, then
    renamed); one process converts (serially: no worker processes are forked from a rank). Raises where DeepSpeed
    cannot convert the checkpoint."""
    ds = folder / "deepspeed"
    out, partial = ds / UNIVERSAL_TAG, ds / f"{UNIVERSAL_TAG}.partial"
    if out.is_dir():
        return out
    shutil.rmtree(partial, ignore_errors=True)
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    args = argparse.Namespace(
        input_folder=str(ds / "agent"),
        output_folder=str(partial),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # the model states name no universal-checkpoint info (no tensor parallelism)
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # (its progress)
            ds_to_universal(args)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    os.rename(partial, out)
    (ds / "latest_universal").write_text(UNIVERSAL_TAG)  # (the converter named the partial folder)
    return out


def zero_shards(folder: Path) -> int:
    """The number of ranks whose ZeRO optimiser shards agent folder `folder`'s DeepSpeed checkpoint holds (0: none,
    or no DeepSpeed checkpoint)."""
    return len(list((folder / "deepspeed" / "agent").glob("*_optim_states.pt")))


def agent_ppo_config(cfg, name: str):
    """One agent's PPO settings: a copy of `cfg.ppo` with what `agents.<name>` sets over it: its sampling temperature
    (PPO scores its tokens at that temperature too), answer budget, KL coefficient and constant entropy bonus; the
    generator's advantage (`agents.generator.advantage`: GAE, or `rloo` over one group, the iteration's proposals,
    which the loop passes: it writes one proposal per prompt, so there is no task group as the solver's
    `ppo.advantage=rloo` has). The learning rate's scale is applied by the loop (`set_learning_rate`)."""
    ppo, own = copy.deepcopy(cfg.ppo), cfg.agents[name]
    if own.temperature is not None:
        ppo.temperature = own.temperature
    if own.max_new_tokens is not None:
        ppo.max_new_tokens = own.max_new_tokens
    if own.kl_coef is not None:
        ppo.kl_coef = own.kl_coef
    if own.entropy_coef is not None:
        ppo.entropy_coef_start = ppo.entropy_coef_end = own.entropy_coef
    if name == "generator":
        ppo.advantage = "rloo" if own.advantage == "rloo_batch" else "gae"
    return ppo


def load_agent_parts(folder: Path, dtype: str = "float32", value_model: str | None = None):
    """(ActorCritic, reference, tokenizer) from an agent's checkpoint folder (value_model: see
    ActorCritic.from_pretrained; the loop passes the config's, so a run may switch head <-> detached)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = ensure_chat_template(AutoTokenizer.from_pretrained(folder, local_files_only=True))
    model = ActorCritic.from_pretrained(folder, value_model, trainable_lora=True, dtype=torch_dtype(dtype))
    if is_lora(model.policy) and model.lora_base == "reference":  # the adapter's base is the reference: no copy
        return model, AdapterOff(model.policy), tokenizer
    reference = frozen_copy(AutoModelForCausalLM.from_pretrained(reference_folder(folder), dtype=torch_dtype(dtype)))
    return model, reference, tokenizer
