"""`python -m llm_server --model tiny` over real HTTP: weight updates, the typed client, bad input."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest
import torch
from safetensors.torch import save_file

from common.http import ServiceCallError
from engine.models import export_model, load_model
from llm_server.client import LLMServerClient
from tests.helpers import ServiceProcess

PROMPT = [{"role": "user", "content": "go left"}]


def _post(server: ServiceProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def _greedy(server: ServiceProcess) -> dict:
    response = _post(server, "/v1/chat/completions",
                     {"model": "tiny", "messages": PROMPT, "max_tokens": 8, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()


async def test_weight_update_bumps_policy_version_and_changes_outputs(tiny_server: ServiceProcess,
                                                                      tmp_path: Path) -> None:
    model, tokenizer = load_model("tiny")
    before = _greedy(tiny_server)
    async with LLMServerClient(tiny_server.url) as llm:
        start = await llm.policy_version()
        assert before["policy_version"] == start
        with torch.no_grad():
            # Make "left" the greedy first token: its output row becomes twice the current winner's.
            ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)
            logits = model(**ids).logits[0, -1]
            assert logits.max() > 0
            model.lm_head.weight[tokenizer.convert_tokens_to_ids("left")] = 2 * model.lm_head.weight[logits.argmax()]
        update = await llm.update_weights(str(export_model(model, tokenizer, tmp_path / "step1")))
        assert update.policy_version == start + 1 and update.loaded_tensors > 0
        after = _greedy(tiny_server)
        assert after["policy_version"] == start + 1
        assert after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]
        assert after["choices"][0]["message"]["content"].startswith("left")

        # A plain state-dict file and an explicit version number work too; back to the original weights.
        original, _ = load_model("tiny")
        save_file({k: v.contiguous() for k, v in original.state_dict().items() if k != "lm_head.weight"},
                  str(tmp_path / "original.safetensors"))
        update = await llm.update_weights(str(tmp_path / "original.safetensors"), policy_version=start + 5)
        assert update.policy_version == start + 5
        restored = await llm.complete_tokens("tiny", before["prompt_token_ids"], max_tokens=8, temperature=0)
        assert restored.policy_version == start + 5
        assert restored.choices[0].token_ids == before["choices"][0]["token_ids"]
        stats = await llm.stats()
        assert stats["weight_updates"] >= 2 and stats["policy_version"] == start + 5


async def test_bad_weights_are_refused_and_nothing_changes(tiny_server: ServiceProcess, tmp_path: Path) -> None:
    async with LLMServerClient(tiny_server.url) as llm:
        version = await llm.policy_version()
        with pytest.raises(ServiceCallError) as missing:
            await llm.update_weights(str(tmp_path / "nope"))
        assert missing.value.status == 400 and "does not exist" in missing.value.message
        save_file({"model.norm.weight": torch.zeros(3)}, str(tmp_path / "bad.safetensors"))
        with pytest.raises(ServiceCallError) as mismatch:
            await llm.update_weights(str(tmp_path / "bad.safetensors"))
        assert mismatch.value.code == "weights_mismatch"
        assert "model.norm.weight: got (3,), model has (64,)" in mismatch.value.message
        assert "missing keys" in mismatch.value.message
        assert await llm.policy_version() == version


async def test_weight_paths_outside_weights_dir_are_refused_alike(tiny_server: ServiceProcess,
                                                                  tmp_path: Path) -> None:
    """A `..` walk to a system file and a path to nothing get the same 403: no probing of other files."""
    async with LLMServerClient(tiny_server.url) as llm:
        version = await llm.policy_version()
        answers = []
        for path in ("/etc/passwd", str(tmp_path) + "/../" * 12 + "etc/passwd", "/etc/no-such-file-here",
                     "../../../../../../../../etc/shadow"):
            with pytest.raises(ServiceCallError) as refused:
                await llm.update_weights(path)
            answers.append((refused.value.status, refused.value.code, refused.value.message))
        assert answers[0][:2] == (403, "weights_path_forbidden")
        assert len(set(answers)) == 1 and "passwd" not in answers[0][2]
        (tmp_path / "escape").symlink_to("/etc")  # a link inside the directory does not lead out of it
        with pytest.raises(ServiceCallError) as linked:
            await llm.update_weights(str(tmp_path / "escape" / "passwd"))
        assert linked.value.status == 403
        assert await llm.policy_version() == version


async def test_weights_travel_as_the_body_when_the_trainer_shares_no_folder(tiny_server: ServiceProcess,
                                                                           tmp_path: Path) -> None:
    """A trainer on another node (`weights_transfer: http`) uploads the file; the server reads no path of it."""
    from trainer.policy import EndpointPolicy, uploads_weights

    model, tokenizer = load_model("tiny")
    before = _greedy(tiny_server)
    with torch.no_grad():
        ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        winner = model(**ids).logits[0, -1].argmax()
        model.lm_head.weight[tokenizer.convert_tokens_to_ids("right")] = 2 * model.lm_head.weight[winner]
    policy = EndpointPolicy(tiny_server.url, "tiny", weights_dir=tmp_path / "trainer-node", transfer="http")
    uploads = httpx.get(f"{tiny_server.url}/v1/stats", timeout=30).json()["weight_uploads"]
    try:
        policy.policy_version = before["policy_version"]
        version = await policy.load_weights(model)
        assert version == before["policy_version"] + 1
        assert httpx.get(f"{tiny_server.url}/v1/stats", timeout=30).json()["weight_uploads"] == uploads + 1
        after = _greedy(tiny_server)
        assert after["policy_version"] == version and after["choices"][0]["message"]["content"].startswith("right")
        refused = httpx.post(f"{tiny_server.url}/v1/weights/upload", content=b"not safetensors", timeout=30,
                             headers={"content-type": "application/octet-stream"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "weights_invalid"
        assert _greedy(tiny_server)["policy_version"] == version
        assert httpx.get(f"{tiny_server.url}/v1/stats", timeout=30).json()["weight_uploads"] == uploads + 1
    finally:
        await policy.aclose()
        original, _ = load_model("tiny")  # back to the weights the other tests expect
        restore = EndpointPolicy(tiny_server.url, "tiny", weights_dir=tmp_path / "trainer-node", transfer="http")
        restore.policy_version = version
        await restore.load_weights(original)
        await restore.aclose()
    assert not uploads_weights("auto", "http://127.0.0.2:8001") and not uploads_weights("path", "http://10.0.0.5:1")
    assert uploads_weights("auto", "http://10.0.0.5:8001") and uploads_weights("http", "http://127.0.0.1:8001")


def test_openai_client_and_chat_features(tiny_server: ServiceProcess) -> None:
    client = openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0)
    response = client.chat.completions.create(
        model="tiny", max_tokens=5, temperature=0.8, seed=3, n=3, stop=["\n\n"],
        messages=[{"role": "system", "content": "You move."}, *PROMPT,
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "c1", "type": "function", "function": {"name": "move", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
        tools=[{"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}])
    assert len(response.choices) == 3 and [c.index for c in response.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length", "tool_calls") for c in response.choices)
    assert response.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in response.choices)
    completion = client.completions.create(model="tiny", prompt="go left", max_tokens=4, temperature=0, logprobs=2)
    choice = completion.choices[0]
    assert len(choice.logprobs.tokens) == len(choice.model_extra["token_ids"]) == 4
    assert all(len(alternatives) == 2 for alternatives in choice.logprobs.top_logprobs)
    assert "".join(choice.logprobs.tokens) == choice.text


def test_tokenize_matches_chat_prompt_and_stop_token_ids(tiny_server: ServiceProcess) -> None:
    chat = _greedy(tiny_server)
    tokenized = _post(tiny_server, "/tokenize", {"model": "tiny", "messages": PROMPT}).json()
    assert tokenized["tokens"] == chat["prompt_token_ids"] and tokenized["max_model_len"] == 2048
    text = _post(tiny_server, "/detokenize", {"model": "tiny", "tokens": tokenized["tokens"]}).json()["prompt"]
    assert text == "<|im_start|>user\ngo left<|im_end|>\n<|im_start|>assistant\n"
    assert _post(tiny_server, "/tokenize", {"model": "tiny", "prompt": "go left"}).json()["count"] == 2
    # A stop token id ends the row where it is sampled, and stays in token_ids (as EOS does).
    generated = chat["choices"][0]["token_ids"]
    stopped = _post(tiny_server, "/v1/completions", {"model": "tiny", "prompt_token_ids": chat["prompt_token_ids"],
                                                     "max_tokens": 8, "temperature": 0,
                                                     "stop_token_ids": [generated[2]]}).json()
    first_stop = generated.index(generated[2]) + 1
    assert stopped["choices"][0]["token_ids"] == generated[:first_stop]
    assert stopped["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(("body", "status", "code", "fragment"), [
    ({"model": "gpt-4", "messages": PROMPT}, 404, "model_not_found", "serves 'tiny'"),
    ({"model": "tiny", "messages": PROMPT, "max_tokens": 5000}, 400, "context_length_exceeded",
     "exceed the model's context of 2048 tokens by"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "go " * 2100}]}, 400, "context_length_exceeded",
     "more than fit: the model's context is 2048 tokens"),
    ({"model": "tiny", "messages": PROMPT, "n": 4, "max_tokens": 100}, 400, "request_too_large",
     "n * max_tokens = 400 exceeds this server's limit of 256"),
    ({"model": "tiny", "messages": PROMPT, "n": 9}, 400, "n_too_large", "max batch of 8"),
    ({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_message",
     "messages[0].role"),
    ({"model": "tiny", "messages": []}, 422, "validation_error", "messages"),
    ({"model": "tiny", "messages": PROMPT, "temperature": -1}, 422, "validation_error", "temperature"),
])
def test_bad_chat_requests(tiny_server: ServiceProcess, body: dict, status: int, code: str, fragment: str) -> None:
    response = _post(tiny_server, "/v1/chat/completions", body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and fragment in error["message"], error


@pytest.mark.parametrize(("body", "code", "fragment"), [
    ({"model": "tiny", "prompt_token_ids": [1, 99999]}, "invalid_prompt", "must be in [0, 1024)"),
    ({"model": "tiny", "prompt": ""}, "invalid_prompt", "the prompt is empty"),
    ({"model": "tiny", "prompt": ["a", "b"]}, "invalid_prompt", "one prompt per request"),
    ({"model": "tiny", "prompt": "hi", "prompt_token_ids": [1]}, "invalid_prompt", "not both"),
    ({"model": "tiny", "prompt": "hi", "echo": True}, "unsupported_parameter", "echo"),
    ({"model": "tiny", "prompt": "hi", "stream": True}, "unsupported_parameter", "stream=true on /v1/completions"),
])
def test_bad_completion_requests(tiny_server: ServiceProcess, body: dict, code: str, fragment: str) -> None:
    response = _post(tiny_server, "/v1/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and fragment in error["message"], error


def test_model_errors_through_the_openai_client(tiny_server: ServiceProcess) -> None:
    client = openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=PROMPT, max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=PROMPT, max_tokens=3000)


def test_metrics_and_stats_agree(tiny_server: ServiceProcess) -> None:
    _greedy(tiny_server)
    stats = httpx.get(f"{tiny_server.url}/v1/stats").json()
    metrics = httpx.get(f"{tiny_server.url}/metrics").text
    assert f"llm_generated_tokens_total {float(stats['generated_tokens'])}" in metrics
    assert f"llm_decode_steps_total {float(stats['decode_steps'])}" in metrics
    assert stats["forward_batches"] == stats["prefill_batches"] + stats["decode_steps"]
    for phase in ("prefill", "decode"):  # where the engine's time goes, in both views
        scraped = re.search(rf"^llm_{phase}_seconds_total (\S+)$", metrics, re.MULTILINE)
        assert scraped is not None and stats[f"{phase}_seconds"] > 0
        assert abs(float(scraped.group(1)) - stats[f"{phase}_seconds"]) < 1e-5
    assert 0 < stats["prefill_tokens"] + stats["shared_prefix_tokens"] <= stats["prompt_tokens"]


def test_unknown_model_spec_fails_at_start() -> None:
    import subprocess
    import sys

    from tests.helpers import REPO

    done = subprocess.run([sys.executable, "-m", "llm_server", "--port", "1", "--model", "/no/such/dir"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "not `smollm2`, `tiny` or an existing local HF directory" in done.stderr


async def test_common_llm_client_gets_token_ids(tiny_server: ServiceProcess) -> None:
    from common.llm import LLMClient, LLMRoleConfig

    client = LLMClient("explorer", LLMRoleConfig(base_url=f"{tiny_server.url}/v1", model="tiny", max_tokens=4))
    try:
        result = await client.chat(PROMPT, temperature=0.5, seed=2, n=2)
    finally:
        await client.aclose()
    assert len(result.texts) == 2 and result.prompt_token_ids == _greedy(tiny_server)["prompt_token_ids"]
    assert [len(ids) for ids in result.completion_token_ids] == [len(lps) for lps in result.completion_logprobs]
    assert result.completion_tokens == sum(len(ids) for ids in result.completion_token_ids)


def test_settings_come_from_the_yaml_section(tiny_server: ServiceProcess, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.helpers import REPO

    stats = httpx.get(f"{tiny_server.url}/v1/stats").json()
    assert stats["model"] == "tiny" and stats["max_batch"] == 8
    conf = tmp_path / "bad.yaml"
    conf.write_text("llm_server:\n  modle: tiny\n")
    done = subprocess.run([sys.executable, "-m", "llm_server", "--port", "1", "--conf", str(conf)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "llm_server.modle" in done.stderr


def test_a_token_id_conversation_resumes_its_next_turn_over_http(tiny_server: ServiceProcess) -> None:
    tok = load_model("tiny")[1]
    prompt = tok.apply_chat_template(
        [{"role": "system", "content": "You are an agent in a house. Call one tool per turn, then answer."},
         {"role": "user", "content": "open the red box in the attic"}],
        add_generation_prompt=True, tokenize=True, return_dict=False)
    body = {"model": "tiny", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    before = httpx.get(f"{tiny_server.url}/v1/stats").json()
    first = _post(tiny_server, "/v1/completions", {**body, "prompt_token_ids": prompt}).json()
    reply = first["choices"][0]["token_ids"]
    observation = tok.encode("<|im_end|>\n<|im_start|>user\nthe box is locked<|im_end|>\n<|im_start|>assistant\n")
    second = _post(tiny_server, "/v1/completions", {**body, "prompt_token_ids": prompt + reply + observation})
    assert second.status_code == 200, second.text
    after = httpx.get(f"{tiny_server.url}/v1/stats").json()
    assert after["resumed_rows"] - before["resumed_rows"] == 1
    # The kept cache held the first prompt and the reply but its last token (sampled, never fed).
    assert after["reused_prefix_tokens"] - before["reused_prefix_tokens"] == len(prompt) + len(reply) - 1
    metrics = httpx.get(f"{tiny_server.url}/metrics").text
    assert f"llm_resumed_rows_total {float(after['resumed_rows'])}" in metrics
