"""engine.models: the tiny model and tokenizer, the chat template, export and load."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.models import (
    SMOLLM2_SYSTEM,
    ModelLoadError,
    chatml_template,
    export_model,
    load_from_directory,
    load_model,
    resolve_model_dir,
)

# SmolLM2-135M-Instruct's own template, as it ships in the GGUF metadata.
SMOLLM2_ORIGINAL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    return load_model("tiny")


def test_tiny_builds_deterministically_in_fresh_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = []
    for name in ("a", "b"):
        monkeypatch.setenv("EVOLVER_CACHE_DIR", str(tmp_path / name))
        dirs.append(resolve_model_dir("tiny"))
    assert dirs[0] != dirs[1] and dirs[0].parent.parent == tmp_path / "a"
    weights = [load_file(str(d / "model.safetensors")) for d in dirs]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    vocabularies = [json.loads((d / "tokenizer.json").read_text())["model"]["vocab"] for d in dirs]
    assert vocabularies[0] == vocabularies[1]
    # Built once: a second resolve reuses the directory and leaves no temporary directories behind.
    assert resolve_model_dir("tiny") == dirs[1]
    assert [p.name for p in dirs[1].parent.iterdir()] == [dirs[1].name]


def test_builds_abandoned_by_dead_processes_are_cleaned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    finished = subprocess.Popen(["true"])
    finished.wait()
    dead_pid = finished.pid
    monkeypatch.setenv("EVOLVER_CACHE_DIR", str(tmp_path))
    leftover = tmp_path / "models" / f".tiny-llama-v1.tmp-{dead_pid}-0123abcd"
    mine = tmp_path / "models" / f".tiny-llama-v1.tmp-{os.getpid()}-0123abcd"  # a live builder's
    leftover.mkdir(parents=True)
    mine.mkdir()
    resolve_model_dir("tiny")
    assert not leftover.exists() and mine.exists()


def test_tiny_tokenizer_is_small_and_sensible(tiny) -> None:
    _, tok = tiny
    assert 256 < len(tok) <= 2048
    for word in ["left", "right", "go", " left", " right", " go", " north", "<|im_start|>", "<|im_end|>"]:
        assert len(tok.encode(word, add_special_tokens=False)) == 1, word
    assert [tok.decode([t]) for t in tok.encode("2024", add_special_tokens=False)] == ["2", "0", "2", "4"]
    text = "Ünïcode ✓ and 中文 — any text: {\"a\": [1, 2]}"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.eos_token == "<|im_end|>"


def test_tiny_model_is_small_and_generates(tiny) -> None:
    model, tok = tiny
    assert model.num_parameters() < 500_000
    ids = tok.apply_chat_template([{"role": "user", "content": "go left"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        first = model(**ids).logits[0, -1]
        second = model(**ids).logits[0, -1]
    assert first.shape[-1] == len(tok) and torch.equal(first, second)


def test_chat_template_matches_smollm2_for_plain_messages(tiny) -> None:
    _, tok = tiny
    template = chatml_template(SMOLLM2_SYSTEM)
    for messages in (
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}],
    ):
        for generation_prompt in (True, False):
            ours = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                           add_generation_prompt=generation_prompt)
            original = tok.apply_chat_template(messages, chat_template=SMOLLM2_ORIGINAL_TEMPLATE, tokenize=False,
                                               add_generation_prompt=generation_prompt)
            assert ours == original


def test_chat_template_renders_tool_calls_and_tools(tiny) -> None:
    _, tok = tiny
    messages = [
        {"role": "user", "content": "go left"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "move", "arguments": "{\"direction\": \"left\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "moved"},
    ]
    tools = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert '{"type": "function", "function": {"name": "move"' in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "move", "arguments": {"direction": "left"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>tool\nmoved<|im_end|>\n<|im_start|>assistant\n') in text


def test_export_round_trip_serves_new_weights(tiny, tmp_path: Path) -> None:
    model, tok = load_model("tiny")
    with torch.no_grad():
        model.model.norm.weight.mul_(2.0)
    out = export_model(model, tok, tmp_path / "policy")
    export_model(model, tok, tmp_path / "policy")  # replacing an export works too
    reloaded, reloaded_tok = load_from_directory(out)
    assert torch.equal(reloaded.model.norm.weight, model.model.norm.weight)
    assert reloaded_tok.chat_template == tok.chat_template
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]


def test_bad_specs_name_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not `smollm2`, `tiny` or an existing local HF directory"):
        load_model("Qwen/Qwen2.5-7B-Instruct")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))
