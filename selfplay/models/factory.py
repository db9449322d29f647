"""Model factory: any Hugging Face causal LM, or the tiny default built here, through one code path.

- `load_model_and_tokenizer(name_or_path)` loads a causal LM + tokenizer from a local folder or a hub name; a model
  that cannot be found (e.g. offline) raises `ModelNotFound` saying how to point at a local copy.
- `train_tokenizer(texts)` builds a small code-aware tokenizer (byte-level BPE or word-level) with the `tokenizers`
  library; `build_tiny_model(tokenizer, cfg)` a GPT-2 or Llama config from `transformers`; `build_tiny(...)` saves
  both with `save_pretrained`, so the tiny default and a pretrained model are loaded the same way afterwards.
- `ensure_chat_template(tokenizer)` gives every tokenizer a chat template, so prompts look the same everywhere.
- `ActorCritic` = policy + value head (or a separate critic backbone); `frozen_copy` makes the reference model;
  `update_mode` is the PPO update's mode (no dropout, gradient checkpointing on where it is enabled).
- `build_models(cfg.model, run_dir, texts)` does all of it from the config.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from selfplay.runtime.errors import UserError
from selfplay.runtime.paths import RunPaths

# ---------------------------------------------------------------------------- tokenizer

PAD, BOS, UNK = "<|pad|>", "<|endoftext|>", "<|unk|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
END = "<|end|>"  # closes every chat message; the tiny tokenizer's eos, so generation stops after an answer
SPECIAL_TOKENS = [PAD, BOS, UNK, *ROLE_TOKENS, END]

# Code-aware pre-tokenisation: identifiers/keywords (with their leading space), single digits (numbers generalise),
# runs of punctuation, newlines, 4-space indentation units, other whitespace. Merges never cross these pieces.
CODE_SPLIT = r" ?[A-Za-z_][A-Za-z_0-9]*| ?[0-9]| ?[^\sA-Za-z_0-9]+|\n| {4}|\s+"

# The tiny tokenizer's template: role tokens are special tokens, each message ends with <|end|>.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# For pretrained base models that ship no template: plain text headers, answers end with the model's eos.
PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}### {{ m['role'] | capitalize }}:\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}### Assistant:\n{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2000, kind: str = "bpe"):
    """Train a small tokenizer on `texts` and wrap it as a `transformers` fast tokenizer (with a chat template).

    kind="bpe": byte-level BPE, any text round-trips exactly (no <unk>). kind="word": one token per
    pre-tokenised piece seen in the corpus, <unk> for the rest (the feasibility point in docs/architecture.md).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    elif kind == "word":
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    else:
        raise UserError(f"model.tokenizer must be 'bpe' or 'word', got {kind!r}")
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CODE_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(texts), trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=END, unk_token=UNK)
    hf.chat_template = TINY_CHAT_TEMPLATE
    return hf


def ensure_chat_template(tokenizer):
    """Give a tokenizer without a chat template a plain one, and a pad token if it has none (uses eos)."""
    if not getattr(tokenizer, "chat_template", None):
        has_roles = all(t in tokenizer.get_vocab() for t in (*ROLE_TOKENS, END))
        tokenizer.chat_template = TINY_CHAT_TEMPLATE if has_roles else PLAIN_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# ---------------------------------------------------------------------------- models


class ModelNotFound(UserError):
    """A model or tokenizer named in the config cannot be loaded."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a `model.dtype` setting (float32, bfloat16, float16)."""
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise UserError(f"model.dtype must be one of {sorted(dtypes)}, got {name!r}")
    return dtypes[name]


def load_model_and_tokenizer(
    name_or_path: str, *, local_files_only: bool = False, dtype: str = "float32", trust_remote_code: bool = False
):
    """(causal LM, tokenizer) from a local folder or a hub name; `ModelNotFound` with a fix when neither works."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selfplay.models.gguf_import import resolve_model_name

    name_or_path = resolve_model_name(name_or_path)  # a GGUF file (alias, gguf:PACKAGE/FILE): its imported folder
    local = Path(name_or_path).expanduser()
    looks_like_path = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_like_path and not local.exists():
        raise ModelNotFound(f"model folder {name_or_path} does not exist (set model.name_or_path to a saved model)")
    offline = local_files_only or os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")
    kwargs = dict(local_files_only=offline or local.is_dir(), trust_remote_code=trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(local) if local.is_dir() else name_or_path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            str(local) if local.is_dir() else name_or_path, dtype=torch_dtype(dtype), **kwargs
        )
    except (OSError, ValueError) as exc:
        reason = str(exc).strip().split("\n")[0]
        raise ModelNotFound(
            f"cannot load model {name_or_path!r} ({reason}); offline, download it elsewhere "
            f"(`huggingface-cli download {name_or_path} --local-dir DIR`), copy DIR here and set "
            f"model.name_or_path=DIR, or use model.name_or_path=tiny"
        ) from exc
    return model, ensure_chat_template(tokenizer)


def build_tiny_model(
    tokenizer,
    *,
    arch: str = "gpt2",
    n_layer: int = 4,
    n_embd: int = 128,
    n_head: int = 4,
    max_positions: int = 1024,
    seed: int = 0,
):
    """A freshly initialised small causal LM sized to `tokenizer` (dropout off: PPO ratios must start at 1)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if n_embd % n_head:
        raise UserError(f"model.n_embd ({n_embd}) must be divisible by model.n_head ({n_head})")
    ids = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    if arch == "gpt2":
        config = GPT2Config(
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_positions=max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **ids,
        )
        return GPT2LMHeadModel(config)
    if arch == "llama":
        config = LlamaConfig(
            hidden_size=n_embd,
            intermediate_size=4 * n_embd,
            num_hidden_layers=n_layer,
            num_attention_heads=n_head,
            num_key_value_heads=n_head,
            max_position_embeddings=max_positions,
            tie_word_embeddings=True,
            **ids,
        )
        return LlamaForCausalLM(config)
    raise UserError(f"model.arch must be 'gpt2' or 'llama', got {arch!r}")


def build_tiny(
    texts: Iterable[str],
    out_dir: str | Path,
    *,
    vocab_size: int = 2000,
    tokenizer_kind: str = "bpe",
    seed: int = 0,
    **model_kwargs,
):
    """Train the tokenizer on `texts`, build the tiny model, save both to `out_dir`; return (model, tokenizer)."""
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size, kind=tokenizer_kind)
    model = build_tiny_model(tokenizer, seed=seed, **model_kwargs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    model.save_pretrained(out_dir)
    return model, tokenizer


# ---------------------------------------------------------------------------- value head, reference


VALUE_MODELS = ("head", "detached", "separate")


class ValueHead(nn.Module):
    """A scalar value per position from the backbone's last hidden state."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.summary = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.summary.weight, std=1.0 / (hidden_size + 1) ** 0.5)
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.summary(hidden.to(self.summary.weight.dtype)).squeeze(-1)


class ActorCritic(nn.Module):
    """The trainable agent: a causal LM policy and a value function, in one module (one optimiser / engine).

    value_model="head": the value head reads the policy's last hidden state (value gradients reach the backbone);
    value_model="detached": the same head on the same hidden state, with no gradient into the backbone: the
    policy is trained by the policy loss alone (a small model's features are not pulled toward predicting value);
    value_model="separate": a copy of the backbone feeds the head, so policy and value share no parameters.
    """

    def __init__(self, policy: nn.Module, value_model: str = "head"):
        super().__init__()
        if value_model not in VALUE_MODELS:
            raise UserError(f"model.value_model must be one of {', '.join(VALUE_MODELS)}, got {value_model!r}")
        if value_model == "separate" and is_lora(policy):
            raise UserError(
                "model.value_model=separate with model.lora.r > 0: a separate critic copies the whole "
                "backbone, LoRA trains an adapter; use value_model=head or detached with LoRA"
            )
        self.value_model = value_model
        self.policy = policy
        self.critic = copy.deepcopy(policy) if value_model == "separate" else None
        self.lora_pending = None  # a peft LoraConfig: the adapter is attached when this folder is next loaded
        self.lora_base = "reference"  # the frozen weights under the adapter: the reference's, or saved in lora/base
        self.value_head = ValueHead(policy.config.hidden_size)
        self.value_head.to(next(policy.parameters()).dtype)
        self._keeps_logits = accepts_logits_to_keep(base_of(policy))

    @property
    def config(self):
        return self.policy.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int = 0,
        prompt_lens: Sequence[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, T, V] and values [B, T] (value at t = value of the state before token t+1).

        logits_to_keep=k > 0: only the last k positions (the answer; the prompt's logits are never needed and
        dominate memory with a large vocabulary).
        prompt_lens: each row's prompt length (rows right-padded, prompt then answer): rows with the same prompt
        share one pass over it (`shared_prompt_forward`); the same numbers, fewer tokens."""
        if (
            prompt_lens is not None
            and self.critic is None
            and shares_prompts(self.policy)
            and not getattr(base_of(self.policy).model, "gradient_checkpointing", False)
        ):  # (checkpointing keeps no cache)
            return shared_prompt_forward(self, input_ids, attention_mask, list(prompt_lens), logits_to_keep)
        extra = {"logits_to_keep": logits_to_keep} if logits_to_keep and self._keeps_logits else {}
        out = self.policy(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=self.critic is None,
            use_cache=False,
            **extra,
        )
        if self.critic is None:
            hidden = out.hidden_states[-1]
            if self.value_model == "detached":
                hidden = hidden.detach()
        else:
            hidden = self.critic.base_model(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).last_hidden_state
        logits = out.logits
        if logits_to_keep:
            logits, hidden = logits[:, -logits_to_keep:], hidden[:, -logits_to_keep:]
        return logits, self.value_head(hidden)

    def save_pretrained(self, out_dir: str | Path | None, lora_base_home: str | None = None) -> None:
        """The policy in HF format at out_dir (loadable alone), value head (+ critic) beside it. The weights are
        streamed into their files one tensor at a time (`save_streamed`): a LoRA policy's merged one layer at a time
        (`merged_weight_items`), never a copy of the model; under ZeRO-3 each is gathered alone (a collective: every
        rank calls this, the ranks that write nothing with out_dir None). `lora_base_home`: where an earlier
        checkpoint holds the adapter's frozen base when it is not the reference (`save_lora`)."""
        out_dir = Path(out_dir) if out_dir is not None else None
        if is_lora(self.policy):  # full weights for whoever samples (eval, export, vLLM), the adapter beside them
            named = [(name, t) for name, t, _ in merged_names(self.policy)]
            save_streamed(base_of(self.policy), named, merged_weight_items(self.policy), out_dir)
            save_lora(self.policy, out_dir / LORA_DIR if out_dir else None, self.lora_base, lora_base_home)
        else:
            save_plain(self.policy, out_dir)
            if self.lora_pending is not None and out_dir is not None:
                save_lora(self.lora_pending, out_dir / LORA_DIR, "policy")
        with gathered_whole(self.value_head.parameters()):
            if out_dir is not None:
                torch.save(self.value_head.state_dict(), out_dir / "value_head.pt")
        if self.critic is not None:
            save_plain(self.critic, out_dir / "critic" if out_dir is not None else None)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, value_model: str | None = None, trainable_lora: bool = False, **load_kwargs
    ) -> ActorCritic:
        """Inverse of `save_pretrained`; a folder with only a policy gets a fresh value head.

        trainable_lora: a folder with a LoRA adapter (lora/) gives its frozen base and the trainable adapter (to
        resume training); without it, the merged full weights (to sample: eval, export).

        value_model: the critic kind to use (default: what the folder holds, "separate" or "head"). "head" and
        "detached" are the same parameters and may be switched at any checkpoint; "separate" is fixed when the
        critic is first made (a folder without critic/ cannot become one, and one with it cannot drop it)."""
        from transformers import AutoModelForCausalLM

        path = Path(path)
        lora_base = None
        if trainable_lora and (path / LORA_DIR / "adapter_config.json").exists():
            policy, lora_base = load_lora(path, **load_kwargs)
        else:
            policy = AutoModelForCausalLM.from_pretrained(path, **load_kwargs)
        separate = (path / "critic").is_dir()
        if value_model is not None and (value_model == "separate") != separate:
            raise UserError(
                f"model.value_model={value_model} but {path} holds "
                f"{'a separate critic' if separate else 'a value head on the policy (no critic/)'}: "
                "a separate critic is chosen at warm start; use 'head' or 'detached' with this run"
            )
        model = cls(policy, value_model or ("separate" if separate else "head"))
        model.lora_base = lora_base or model.lora_base
        if separate:
            model.critic = AutoModelForCausalLM.from_pretrained(path / "critic", **load_kwargs)
        if (path / "value_head.pt").exists():
            model.value_head.load_state_dict(torch.load(path / "value_head.pt", map_location="cpu"))
        return model


# model types whose causal LM is a decoder stack under `.model` whose last hidden state (after the final norm) goes
# straight into `lm_head` (no logit scaling or soft-capping) and that take a cache and explicit positions
SHARED_PROMPT_MODELS = ("llama", "mistral", "qwen2", "qwen3")


def shares_prompts(policy) -> bool:
    """Whether `shared_prompt_forward` gives this model's own numbers (SHARED_PROMPT_MODELS)."""
    base = base_of(policy)
    return (
        getattr(base.config, "model_type", None) in SHARED_PROMPT_MODELS
        and hasattr(base, "lm_head")
        and hasattr(getattr(base, "model", None), "layers")
    )


def shared_prompt_forward(
    model: ActorCritic,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_lens: list[int],
    logits_to_keep: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ActorCritic.forward` with each distinct prompt run once: the prompts (right-padded) in one pass that keeps
    their keys and values (with their gradients), those selected for every row that has the prompt, then the
    answers in one pass over that cache at their own positions. A task's k answers share a prompt, so its tokens
    are computed once instead of k times; each row's logits and values are those of the plain forward (the prompt's
    own positions from the prompt pass), up to float rounding."""
    from transformers import DynamicCache

    base = base_of(model.policy)
    rows, width = input_ids.shape
    device = input_ids.device
    keys = [tuple(input_ids[b, :n].tolist()) for b, n in enumerate(prompt_lens)]
    distinct = list(dict.fromkeys(keys))
    which = torch.tensor([distinct.index(k) for k in keys], device=device)
    p_width = max(prompt_lens)
    p_ids = torch.zeros((len(distinct), p_width), dtype=input_ids.dtype, device=device)
    p_mask = torch.zeros((len(distinct), p_width), dtype=attention_mask.dtype, device=device)
    for u, k in enumerate(distinct):
        p_ids[u, : len(k)] = torch.tensor(k, dtype=input_ids.dtype)
        p_mask[u, : len(k)] = 1
    cache = DynamicCache(config=base.config)
    prompt_hidden = base.model(
        input_ids=p_ids, attention_mask=p_mask, past_key_values=cache, use_cache=True
    ).last_hidden_state
    cache.batch_select_indices(which)
    a_width = max(1, width - min(prompt_lens))
    a_ids = torch.zeros((rows, a_width), dtype=input_ids.dtype, device=device)
    a_mask = torch.zeros((rows, a_width), dtype=attention_mask.dtype, device=device)
    for b, n in enumerate(prompt_lens):
        m = int(attention_mask[b].sum()) - n  # this row's answer tokens
        a_ids[b, :m], a_mask[b, :m] = input_ids[b, n : n + m], 1
    positions = torch.tensor(prompt_lens, device=device)[:, None] + torch.arange(a_width, device=device)[None]
    answer_hidden = base.model(
        input_ids=a_ids,
        attention_mask=torch.cat([p_mask[which], a_mask], 1),
        past_key_values=cache,
        position_ids=positions,
        use_cache=True,
    ).last_hidden_state
    # each row's hidden states on the plain forward's axis: its prompt's positions, then its answer's
    keep = logits_to_keep or width
    hidden = torch.stack(
        [
            torch.cat([prompt_hidden[which[b], :n], answer_hidden[b, : width - n]])[width - keep :]
            for b, n in enumerate(prompt_lens)
        ]
    )
    logits = base.lm_head(hidden)
    value_in = hidden.detach() if model.value_model == "detached" else hidden
    return logits, model.value_head(value_in)


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Whether a HF causal LM can compute logits for the last k positions only (`logits_to_keep`)."""
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


def update_mode(model: nn.Module) -> int:
    """Put `model` in the mode of a PPO update: evaluation mode everywhere (no dropout: the ratios must be exactly 1
    before the first optimiser step), except the flag of each module that does gradient checkpointing (Hugging Face
    checkpoints only modules in training mode, and reads the flag of the checkpointing module itself, not of its
    children). Returns how many modules checkpoint; `model.train(False)` ends the mode."""
    model.train(False)
    checkpointing = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    for m in checkpointing:
        m.training = True  # this module alone: its children (attention, MLP, dropout) stay in evaluation mode
    return len(checkpointing)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen copy (eval mode, no gradients) for the KL reference policy (a LoRA policy: merged, plain)."""
    ref = merged_copy(model) if is_lora(model) else copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


# ---------------------------------------------------------------------------- from the config


def build_models(
    model_cfg,
    run_dir: str | Path,
    texts: Iterable[str] | None = None,
    seed: int = 0,
    agent: str | None = None,
    engine_key: str | None = None,
):
    """(ActorCritic, frozen reference policy, tokenizer) from a `model:` config section.

    engine_key: where this agent samples from an engine that loads the policy's merged weights (vLLM), the config
    key and value that chose it (e.g. "rollout.engine=vllm"): an adapter those weights cannot be merged from, one
    layer at a time (a tied weight), is refused now, naming both keys, not at the first weight sync after the warm
    start.

    agent (solver | generator; None = any): with `model.lora.r` > 0 for this agent (`model.lora.agents`), the
    warm start trains all weights and its checkpoint asks for a fresh adapter over them (`lora_settings`), which
    every later load attaches: PPO trains the adapter, the warm-started weights under it are the KL reference.

    name_or_path="tiny": reuse the tiny model saved in `tiny_dir` (default RUN_DIR/models/tiny), or build it from
    `texts` (the corpus the tokenizer learns from) when that folder is empty. Anything else: load it.
    """
    if model_cfg.name_or_path == "tiny":
        tiny_dir = Path(model_cfg.tiny_dir or RunPaths(run_dir).models / "tiny")
        if not (tiny_dir / "config.json").exists():
            if texts is None:
                raise UserError(f"no tiny model in {tiny_dir} and no corpus given to build one")
            build_tiny(
                texts,
                tiny_dir,
                vocab_size=model_cfg.vocab_size,
                tokenizer_kind=model_cfg.tokenizer,
                seed=seed,
                arch=model_cfg.arch,
                n_layer=model_cfg.n_layer,
                n_embd=model_cfg.n_embd,
                n_head=model_cfg.n_head,
                max_positions=model_cfg.max_positions,
            )
        name, local_only = str(tiny_dir), True
    else:
        name, local_only = model_cfg.name_or_path, model_cfg.local_files_only
    policy, tokenizer = load_model_and_tokenizer(
        name, local_files_only=local_only, dtype=model_cfg.dtype, trust_remote_code=model_cfg.trust_remote_code
    )
    if model_cfg.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    reference = frozen_copy(policy)
    model = ActorCritic(policy, model_cfg.value_model)
    model.lora_pending = lora_settings(model_cfg, agent, n_layers=getattr(policy.config, "num_hidden_layers", None))
    if model.lora_pending is not None:
        adapted = attach_lora(copy.deepcopy(policy), model.lora_pending)  # target modules checked now, not later
        if engine_key:
            try:
                merged_names(adapted)
            except ValueError as exc:
                raise UserError(
                    f"model.lora.target_modules={list(model_cfg.lora.target_modules)} with {engine_key}: {exc}; "
                    "the engine loads the policy's merged weights: leave that module out of "
                    "model.lora.target_modules, or sample this agent with the hf engine"
                ) from None
    return model, reference, tokenizer


def param_count(model: nn.Module) -> int:
    """Number of parameters (for logs and reports)."""
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------- LoRA (peft)

LORA_DIR = "lora"  # in an agent folder: the adapter (peft's adapter_config.json, adapter_model.safetensors)
LORA_STATE = "selfplay_lora.json"  # {"base": "reference" | "base" | "policy"}: where the weights under it are
LORA_AGENTS = ("solver", "generator")


def is_lora(model) -> bool:
    """Whether `model` is a peft model (a LoRA adapter over a frozen base)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_of(model):
    """The Hugging Face model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if is_lora(model) else model


def lora_settings(model_cfg, agent: str | None = None, n_layers: int | None = None):
    """peft's LoraConfig from `model.lora` when it applies to `agent`, else None. `n_layers`: the model's
    transformer blocks, which `model.lora.layers` (the top N of them) needs."""
    lora = getattr(model_cfg, "lora", None)
    if lora is None or lora.r <= 0:
        return None
    unknown = sorted(set(lora.agents) - set(LORA_AGENTS))
    if unknown:
        raise UserError(
            f"model.lora.agents: unknown agent(s) {', '.join(unknown)} (choose from {', '.join(LORA_AGENTS)})"
        )
    if agent is not None and agent not in lora.agents:
        return None
    if model_cfg.value_model == "separate":
        raise UserError(
            "model.value_model=separate with model.lora.r > 0: a separate critic copies the whole "
            "backbone, LoRA trains an adapter; use value_model=head or detached with LoRA"
        )
    try:
        from peft import LoraConfig
    except ImportError as exc:
        raise UserError(
            "model.lora.r > 0 needs the peft package (pip install peft, or pip install -e '.[pretrained]')"
        ) from exc
    top = int(getattr(lora, "layers", 0) or 0)
    if top and n_layers is None:
        raise UserError(f"model.lora.layers={top}: this model's config gives no num_hidden_layers; use 0 (every block)")
    if top < 0 or (top and top > n_layers):
        raise UserError(
            f"model.lora.layers={top}: the top blocks to adapt, from 0 (every block) to {n_layers} "
            "(this model's blocks)"
        )
    layers = list(range(n_layers - top, n_layers)) if top and n_layers is not None else None
    return LoraConfig(
        r=int(lora.r),
        lora_alpha=float(lora.alpha),
        lora_dropout=float(lora.dropout),
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        layers_to_transform=layers,
    )


def attach_lora(policy, config, seed: int = 0):
    """`policy` under a fresh LoRA adapter (B = 0: the same outputs as `policy`; A drawn from `seed`, whatever
    the global RNG); target modules the model lacks are a `UserError` naming model.lora.target_modules."""
    from peft import get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            return get_peft_model(policy, copy.deepcopy(config))
        except ValueError as exc:
            names = sorted({n.rsplit(".", 1)[-1] for n, m in policy.named_modules() if isinstance(m, nn.Linear)})
            raise UserError(
                f"model.lora.target_modules={list(config.target_modules)}: {str(exc).splitlines()[0]} "
                f"(this model's linear layers: {', '.join(names)})"
            ) from exc


class AdapterOff:
    """The KL reference of a LoRA policy whose base is the reference (`lora_base == "reference"`): the policy itself
    with its adapter switched off for the call (peft's `disable_adapter`), so no second copy of the weights is held.
    It has no parameters of its own; `save_pretrained` writes the base as a plain model (the adapter removed from a
    copy, unmerged), which is what a reference folder holds."""

    def __init__(self, policy):
        if not is_lora(policy):
            raise TypeError("AdapterOff needs a peft (LoRA) policy")
        self.policy = policy
        self.config = policy.config

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, logits_to_keep: int = 0, **kwargs
    ):
        with torch.no_grad(), self.policy.disable_adapter():
            extra = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
            return self.policy(input_ids=input_ids, attention_mask=attention_mask, **extra, **kwargs)

    forward = __call__  # (accepts_logits_to_keep reads its signature)

    def to(self, *args, **kwargs) -> AdapterOff:
        return self  # it lives where the policy does

    def eval(self) -> AdapterOff:
        return self

    def parameters(self):
        return iter(())

    def save_pretrained(self, out_dir: str | Path | None) -> None:
        """The base streamed (`save_base`): a collective under ZeRO-3, out_dir None on the ranks that write nothing."""
        save_base(self.policy, Path(out_dir) if out_dir is not None else None)


def merged_copy(policy):
    """A plain model with the adapter merged into a copy of the base weights (the policy itself is untouched): a
    whole second model, for what keeps one (a frozen reference); the weight sync and the checkpoint's Hugging Face
    copy stream `merged_weight_items` instead."""
    merged = copy.deepcopy(policy).merge_and_unload()
    for p in merged.parameters():
        p.requires_grad_(True)
    return merged


def merged_names(policy) -> list[tuple[str, torch.Tensor, nn.Module | None]]:
    """Each tensor of `merged_copy(policy).state_dict()`, in its order, without copying anything: (its name there,
    the policy's tensor it comes from, the adapted layer that merges into it or None). peft's own names are mapped as
    TRL maps them for vLLM: the wrapper's prefix and `.base_layer` dropped, the adapters' tensors left out. A base
    tensor of an adapted layer that is also held under another name (a tied weight) is refused: merged under one name
    and not the other, it would not be the merged copy."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = {name: m for name, m in policy.named_modules() if isinstance(m, BaseTunerLayer)}
    owner: dict[str, str] = {}  # state-dict name -> its adapted layer
    for name, layer in layers.items():
        for key in layer.state_dict(keep_vars=True):
            owner[f"{name}.{key}"] = name
    prefix = "base_model.model."
    out: list[tuple[str, torch.Tensor, nn.Module | None]] = []
    merged_ids: dict[int, str] = {}
    plain_ids: dict[int, str] = {}
    for key, t in policy.state_dict(keep_vars=True).items():
        layer_name = owner.get(key)
        rest = key[len(layer_name) + 1 :] if layer_name else ""
        if layer_name and not rest.startswith("base_layer."):
            continue  # lora_A / lora_B / ...: merged into the base weights
        name = key.removeprefix(prefix).replace(".base_layer.", ".")
        if "original_module." in name:
            continue  # modules_to_save: the trained copy is the one sampled
        name = name.replace("modules_to_save.default.", "")
        (merged_ids if layer_name else plain_ids)[id(t)] = name
        out.append((name, t, layers[layer_name] if layer_name else None))
    tied = sorted(f"{merged_ids[i]} / {plain_ids[i]}" for i in merged_ids.keys() & plain_ids.keys())
    if tied:
        raise ValueError(f"LoRA on a tied weight cannot be merged one layer at a time: {', '.join(tied)}")
    return out


def merged_weight_items(policy) -> Iterator[tuple[str, torch.Tensor]]:
    """`merged_copy(policy).state_dict()`'s (name, tensor) pairs, the same values bit for bit, with no copy of the
    model. Each adapted layer in turn gets a copy of its base tensors, peft merges the adapter into them in place
    (the layer's `merge`, which `merge_adapter` and `merge_and_unload` run on every layer, so the sums are theirs bit
    for bit), the merged tensors are taken for the consumer, and the layer's own storage, set aside untouched, is put
    back (the layer marked unmerged) before they are yielded. Nothing is subtracted: peft's `unmerge` subtracts the
    delta it added, and in floating point (W + d) - d is not always W (measured on a tiny fp32 Llama: every adapted
    weight came back with elements off, by up to 7e-9), whereas the policy ends here bit for bit as it was, in its
    own storage, and is never merged while the consumer holds a tensor. A yielded tensor stays valid as long as the
    consumer keeps it (vLLM's layerwise reload keeps a layer's tensors until the layer is complete), so the new
    memory is what the consumer keeps plus, while a layer merges, peft's delta and its scaled product: a few weights
    of one layer, never the model. Under ZeRO-3 each tensor is gathered alone (an adapted layer with its adapter)
    while it is read: a collective, iterate to the end on every rank."""
    import contextlib
    from itertools import groupby

    from selfplay.runtime.distributed import gathered_one_by_one

    check = getattr(policy.base_model, "_check_merge_allowed", None)
    if check is not None:
        check()  # what peft refuses to merge (e.g. some quantized layers), refused here as merge_adapter does
    for layer, group in groupby(merged_names(policy), key=lambda entry: entry[2]):
        named = [(name, t) for name, t, _ in group]
        if layer is None:
            yield from gathered_one_by_one(named)
            continue
        parts = [p for p in layer.parameters() if hasattr(p, "ds_id")]  # the layer with its adapter, under ZeRO-3
        if parts:
            import deepspeed

            whole = deepspeed.zero.GatheredParameters(parts)
        else:
            whole = contextlib.nullcontext()
        with whole:
            own = [(p, p.data) for p in layer.get_base_layer().parameters()]  # the layer's storage, set aside
            was = list(layer.merged_adapters)
            try:
                for p, data in own:
                    p.data = data.clone()  # what the merge adds into: the new tensors handed to the consumer
                layer.merge()  # peft's in-place merge, as merge_adapter and merge_and_unload do it
                merged = [(name, t.detach()) for name, t in named]
            finally:
                for p, data in own:
                    p.data = data
                layer.merged_adapters[:] = was
            del own
            yield from merged  # inside the gather, as `gathered_one_by_one` yields (a bias not merged is the layer's)
        del merged


def save_lora(policy_or_config, folder: Path | None, base: str, base_home: str | None = None) -> None:
    """The adapter (or only its config, for a fresh one) in `folder`, and where its base weights are; a base that
    is neither the reference nor the folder's policy is frozen: streamed into `folder/base` once (`save_base`), and a
    later checkpoint's `folder/base.json` names where an earlier one holds it (`base_home`, relative to the
    checkpoints folder). Under ZeRO-3 a collective (the adapter gathered whole, the base one tensor at a time):
    every rank calls it, those that write nothing with folder None."""
    import json

    from selfplay.runtime.checkpoint import LORA_BASE_DIR, write_pointer

    if not is_lora(policy_or_config):  # a LoraConfig: adapter_config.json alone
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            policy_or_config.save_pretrained(folder)
            (folder / LORA_STATE).write_text(json.dumps({"base": base}))
        return
    adapter = [p for name, p in policy_or_config.named_parameters() if p.requires_grad or "lora_" in name]
    with gathered_whole(adapter):
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            policy_or_config.save_pretrained(folder)
            (folder / LORA_STATE).write_text(json.dumps({"base": base}))
    if base != "base":
        return
    if base_home is not None:
        if folder is not None:
            write_pointer(folder.parent, LORA_BASE_DIR, base_home)
        return
    save_base(policy_or_config, folder / "base" if folder is not None else None)


def gathered_whole(params: Iterable[torch.Tensor]):
    """A context in which these parameters are whole, gathered together under ZeRO-3 (a collective: every rank
    enters it; for a few small tensors: the value head, an adapter); else nothing."""
    import contextlib

    parts = [p for p in params if hasattr(p, "ds_id")]
    if not parts:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(parts)


def save_base(policy, out_dir: Path | None) -> None:
    """The frozen base under a LoRA adapter as a plain model at `out_dir` (what `unload` of a copy saves, bit for
    bit), streamed one tensor at a time from the policy's own tensors (`merged_names` without the merge)."""
    from selfplay.runtime.distributed import gathered_one_by_one

    named = [(name, t) for name, t, _ in merged_names(policy)]
    save_streamed(base_of(policy), named, gathered_one_by_one(named), out_dir)


def save_plain(model: nn.Module, out_dir: Path | None) -> None:
    """`model.save_pretrained(out_dir)`'s files, streamed (`save_streamed`): its state dict one tensor at a time, each
    gathered alone under ZeRO-3 (a collective: every rank calls it, those that write nothing with out_dir None)."""
    save_streamed(model, model.state_dict(keep_vars=True).items(), None, out_dir)


# safetensors' Dtype enum, in its order: a file holds its tensors by dtype, the last of these first, then by name
SAFETENSORS_ORDER = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.float8_e5m2: "F8_E5M2",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.int16: "I16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
}


def write_safetensors(
    specs: Sequence[tuple[str, Sequence[int], torch.dtype]],
    items: Iterable[tuple[str, torch.Tensor]],
    path: Path | None,
) -> None:
    """The file `safetensors.torch.save_file` writes (metadata {"format": "pt"}), byte for byte, written one tensor
    at a time as `items` gives them, in any order: `specs` announces each (name, shape, dtype), so the header and the
    tensors' places (safetensors' order: `SAFETENSORS_ORDER`, then name) are known first, and each tensor is then
    copied to the CPU alone (where it is not there already), written at its offset and dropped. The memory this takes
    beyond the file is one tensor. Every announced name must come once, as announced (ValueError otherwise); path
    None: the items are taken (a collective's gathers) and nothing is written."""
    import json
    import math
    import struct

    order = list(SAFETENSORS_ORDER)
    header: dict = {"__metadata__": {"format": "pt"}}
    place: dict[str, tuple[int, tuple[int, ...], torch.dtype]] = {}
    offset = 0
    for name, shape, dtype in sorted(specs, key=lambda s: (-order.index(s[2]), s[0])):
        size = math.prod(shape) * dtype.itemsize
        header[name] = {
            "dtype": SAFETENSORS_ORDER[dtype],
            "shape": [int(n) for n in shape],
            "data_offsets": [offset, offset + size],
        }
        place[name] = (offset, tuple(int(n) for n in shape), dtype)
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    f = open(path, "wb") if path is not None else None  # noqa: SIM115 - closed below, after the items
    try:
        if f is not None:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            f.truncate(start + offset)
        for name, tensor in items:
            if name not in place or (tuple(tensor.shape), tensor.dtype) != place[name][1:]:
                raise ValueError(f"weight {name} {tuple(tensor.shape)} {tensor.dtype}: not announced as such, or twice")
            at = place.pop(name)[0]
            if f is not None:
                f.seek(start + at)
                f.write(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())
        if place:
            raise ValueError(f"weights announced and not given: {', '.join(sorted(place))}")
    finally:
        if f is not None:
            f.close()


def save_streamed(
    model,
    named: Iterable[tuple[str, torch.Tensor]],
    items: Iterable[tuple[str, torch.Tensor]] | None,
    out_dir: Path | None,
) -> None:
    """What `model.save_pretrained(out_dir)` writes (its config files, `model.safetensors`: the same tensors under the
    same names), with the weights written one tensor at a time (`write_safetensors`). `named`: each (name, tensor)
    of the state dict to write, in its order, not gathered (a ZeRO-3 partition knows its whole shape, `ds_shape`); a
    tensor under several names (tied weights) is written under the first, as Hugging Face drops the others. `items`:
    the same pairs, whole (default: `named`, each gathered alone under ZeRO-3: a collective, every rank calls this,
    those that write nothing with out_dir None). One file, whatever the size (Hugging Face shards above 50 GB; both
    load alike)."""
    from selfplay.runtime.distributed import gathered_one_by_one

    named = list(named)
    first: dict[int, str] = {}
    specs = []
    ignored = set(getattr(model, "_keys_to_ignore_on_save", None) or ())  # what Hugging Face leaves out too
    for name, t in named:
        if name not in ignored and first.setdefault(id(t), name) == name:
            specs.append((name, tuple(getattr(t, "ds_shape", t.shape)), t.dtype))
    kept = {name for name, _, _ in specs}
    items = gathered_one_by_one(named) if items is None else items
    path = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir, state_dict={})  # its config files (and a weights file with none, replaced)
        path = out_dir / "model.safetensors"
    write_safetensors(specs, ((name, t) for name, t in items if name in kept), path)


def fresh_lora(folder: Path) -> bool:
    """Whether an agent folder asks for a fresh adapter (the warm start's, with LoRA): its optimiser state is for
    other parameters (all weights) and is not loaded."""
    lora = Path(folder) / LORA_DIR
    return (lora / "adapter_config.json").exists() and not (lora / "adapter_model.safetensors").exists()


def _same_weights(model, folder: Path) -> bool:
    """Whether `model`'s parameters equal the safetensors weights saved in `folder`."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return False
    params = dict(model.named_parameters())
    seen = set()
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if key in params:
                    if not torch.equal(st.get_tensor(key).to(params[key].dtype), params[key].detach()):
                        return False
                    seen.add(key)
    return len(seen) == len(params)


def load_lora(path: Path, **load_kwargs):
    """(peft model with a trainable adapter, where its base is) from an agent folder with lora/ (`save_lora`)."""
    import json

    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM

    from selfplay.runtime.checkpoint import LORA_BASE_DIR, frozen_folder, reference_folder

    folder = path / LORA_DIR
    base = json.loads((folder / LORA_STATE).read_text())["base"] if (folder / LORA_STATE).exists() else "policy"
    if base == "policy":  # the warm start asked for a fresh adapter over the folder's weights
        plain = AutoModelForCausalLM.from_pretrained(path, **load_kwargs)
        ref = reference_folder(path)
        same = ref.is_dir() and _same_weights(plain, ref)  # true after a warm start: its reference is its policy
        return attach_lora(plain, LoraConfig.from_pretrained(folder)), "reference" if same else "base"
    # the reference, or the adapter's own base: in this folder, or where its pointer names (written once)
    source = reference_folder(path) if base == "reference" else frozen_folder(path, LORA_BASE_DIR)
    plain = AutoModelForCausalLM.from_pretrained(source, **load_kwargs)
    return PeftModel.from_pretrained(plain, folder, is_trainable=True), base
