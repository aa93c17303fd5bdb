"""`evolver_env_agent` driven by a fake veRL server manager (vLLM cannot run here) against a real env service.

The tokenizer is a word-level ChatML tokenizer built in code, so every expected id below is written by
hand from its vocabulary. The experience manager runs for real too, for the flagged rollout.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="veRL is installed by the `verl` extra")

from omegaconf import OmegaConf  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import trainer.verl_plugin  # noqa: E402,F401
from tests.helpers import SIGNAL_TWO_WORDS_YAML, run_env_service, run_service  # noqa: E402
from trainer.verl_plugin.agent_loop import TASK_KEY, EvolverEnvAgentLoop  # noqa: E402

VOCAB = ["[UNK]", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "play", "signal", "look", "at",
         "the", "then", "answer", "north", ",", "south", "is", "hi", "search_experience", "(", "query", "=", "'", ")"]
ID = {word: i for i, word in enumerate(VOCAB)}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

ENV_YAML = SIGNAL_TWO_WORDS_YAML
TASK = "signal-train-0000"  # its signal is `north`

# ---- golden values, by hand from VOCAB ----
# <|im_start|>system\nplay signal<|im_end|>\n<|im_start|>user\nlook at the signal then answer north, south<|im_end|>\n
# <|im_start|>assistant\n
PROMPT = [1, 3, 6, 7, 2, 1, 4, 8, 9, 10, 7, 11, 12, 13, 14, 15, 2, 1, 5]
TURN_1 = [17, 2]  # the policy says "hi<|im_end|>"
# the env answers: \n<|im_start|>user\nsignal is north<|im_end|>\n<|im_start|>assistant\n  (the eos is the policy's)
OBSERVATION = [1, 4, 7, 16, 13, 2, 1, 5]
TURN_2 = [13, 2]  # "north<|im_end|>": correct, the episode ends
RESPONSE = TURN_1 + OBSERVATION + TURN_2
MASK = [1, 1] + [0] * 8 + [1, 1]
STEP_IDS = [0] * 10 + [1, 1]


def word_tokenizer() -> PreTrainedTokenizerFast:
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", eos_token="<|im_end|>",
                                  pad_token="[UNK]", additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML
    return tok


class ScriptedServerManager:
    """Stands in for veRL's LLMServerClient: returns scripted token ids, records every request."""

    def __init__(self, replies: list[list[int]]) -> None:
        self.replies = list(replies)
        self.requests: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.requests.append({"request_id": request_id, "prompt_ids": list(prompt_ids),
                              "sampling_params": dict(sampling_params)})
        sampling_params.pop("max_tokens")  # as veRL's vLLM server does: the loop must send a fresh dict
        ids = self.replies.pop(0)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), extra_fields={"global_steps": 3})


@pytest.fixture(scope="module")
def env_url(tmp_path_factory):
    with run_env_service(ENV_YAML, tmp_path_factory.mktemp("env")) as service:
        yield service.url


def veRL_config(env_url: str, experience: dict | None = None, n: int = 4) -> object:
    evolver = {"env_url": env_url, "rollout": {"env": "signal", "max_turns": 4, "max_new_tokens": 8,
                                               "experience_ratio": 0.5}}
    if experience:
        evolver["experience"] = experience
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"n": n, "prompt_length": 64, "response_length": 64}},
        "data": {"apply_chat_template_kwargs": {}},
        "evolver": evolver,
    })


def run_loop(config, server, session_id: int, uid: str = "prompt-uid-1", **extra) -> list[AgentLoopOutput]:
    loop = EvolverEnvAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server,
                               tokenizer=word_tokenizer(), processor=None, dataset_cls=None,
                               data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
    row = {"raw_prompt": [{"role": "user", "content": "unused"}], "uid": uid, "session_id": session_id,
           "extra_info": {TASK_KEY: json.dumps({"task_id": TASK, "env_type": "signal"})}, **extra}
    return asyncio.run(loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **row))


def test_registered_under_our_name():
    assert _agent_loop_registry["evolver_env_agent"]["_target_"].endswith("agent_loop.EvolverEnvAgentLoop")


def test_episode_returns_golden_prompt_response_mask_and_fields(env_url):
    server = ScriptedServerManager([TURN_1, TURN_2])
    [out] = run_loop(veRL_config(env_url), server, session_id=0)  # no experience service: never flagged
    assert out.prompt_ids == PROMPT
    assert out.response_ids == RESPONSE
    assert out.response_mask == MASK
    assert out.reward_score == 1.0
    assert out.response_logprobs == [-0.5, -0.5] + [0.0] * 8 + [-0.5, -0.5]
    extra = out.extra_fields
    assert extra["step_ids"] == STEP_IDS and extra["num_steps"] == 2 and extra["segment_index"] == 0
    assert extra["task_id"] == TASK and extra["experience_flag"] is False
    assert extra["min_global_steps"] == extra["max_global_steps"] == 3
    # Token-in/token-out: the second request continued the exact ids, with one sticky request id.
    assert [r["prompt_ids"] for r in server.requests] == [PROMPT, PROMPT + TURN_1 + OBSERVATION]
    assert len({r["request_id"] for r in server.requests}) == 1
    assert server.requests[0]["sampling_params"]["max_tokens"] == 8
    # veRL's own serialisation of the output: rm_scores carries the reward on the last token.
    as_dict = out.as_dict()
    assert as_dict["responses"].tolist() == RESPONSE and as_dict["rm_scores"].tolist()[-1] == 1.0


@pytest.fixture(scope="module")
def experience_url(tmp_path_factory):
    store = tmp_path_factory.mktemp("experience")
    with run_service("experience_manager", ["--store", str(store / "store")]) as service:
        created = httpx.post(f"{service.url}/v1/workspaces/signal-ws/experiences", timeout=60, json={
            "when_to_use": "When asked to look at the signal then answer with the signal word",
            "content": "Say anything first; the next message shows the signal word; repeat that word exactly."})
        assert created.status_code in (200, 201), created.text
        yield service.url


def test_flagged_session_generates_with_experience_and_trains_without_it(env_url, experience_url):
    experience = {"url": experience_url, "workspace": "signal-ws"}
    config = veRL_config(env_url, experience, n=4)  # round(4 * 0.5) = 2: sessions 0 and 1 are flagged
    server = ScriptedServerManager([TURN_1, TURN_2])
    [out] = run_loop(config, server, session_id=1)
    seen = server.requests[0]["prompt_ids"]
    assert len(seen) > len(PROMPT) and seen[-3:] == PROMPT[-3:]  # the experience was in the generation prompt
    assert out.prompt_ids == PROMPT  # ... and is stripped from the training prompt
    assert out.response_ids == RESPONSE and out.response_mask == MASK
    assert out.extra_fields["experience_flag"] is True and out.extra_fields["experience_ids"]
    # The second turn continued from the experience-bearing context, token for token.
    assert server.requests[1]["prompt_ids"] == seen + TURN_1 + OBSERVATION

    unflagged = ScriptedServerManager([TURN_1, TURN_2])
    [plain] = run_loop(config, unflagged, session_id=2)
    assert unflagged.requests[0]["prompt_ids"] == PROMPT and plain.extra_fields["experience_flag"] is False


def test_turns_mode_puts_the_retrieved_demonstration_before_the_task_for_generation_only(env_url, experience_url):
    """`experience.inject: turns` reaches the veRL agent loop through the shared `GroupExperience`."""
    query = "look at the signal then answer north, south"
    solved = [{"role": "user", "content": query}, {"role": "assistant", "content": "hi"},
              {"role": "tool", "content": "signal is south"}, {"role": "assistant", "content": "south"}]
    summarized = httpx.post(f"{experience_url}/v1/workspaces/signal-demos/summarize", timeout=60, json={
        "trajectories": [{"task_id": "signal-train-0001", "messages": solved, "outcome": 1.0}], "mode": "heuristic"})
    assert summarized.status_code == 200, summarized.text
    config = veRL_config(env_url, {"url": experience_url, "workspace": "signal-demos", "inject": "turns"}, n=4)
    server = ScriptedServerManager([TURN_1, TURN_2])
    [out] = run_loop(config, server, session_id=0, uid="prompt-uid-turns")  # a group of its own
    # system, then the demonstration (its observation as a user turn, as the template renders observations),
    # then the real task: by hand from VOCAB.
    demo = [1, 4, 8, 9, 10, 7, 11, 12, 13, 14, 15, 2] + [1, 5, 17, 2] + [1, 4, 7, 16, 15, 2] + [1, 5, 15, 2]
    assert server.requests[0]["prompt_ids"] == PROMPT[:5] + demo + PROMPT[5:]
    assert out.prompt_ids == PROMPT and out.response_ids == RESPONSE and out.response_mask == MASK
    assert out.extra_fields["experience_flag"] is True


def test_an_ask_of_the_scripted_model_is_answered_by_the_shared_ask_handling(env_url, experience_url):
    """experience.mode action through the veRL agent loop: the scripted model asks once (the reserved tool,
    `search_experience ( query = ' signal ' )` in this word vocabulary), the real experience manager answers, the
    answer stays in the context with mask 0 and the environment never sees the ask."""
    experience = {"url": experience_url, "workspace": "signal-ws", "mode": "action", "ask_format": "tool",
                  "min_similarity": -1.0}
    config = veRL_config(env_url, experience, n=2)
    config.evolver.rollout.experience_ratio = 0.0  # the modes are exclusive
    config.actor_rollout_ref.rollout.response_length = 256  # room for the answer
    ask = [ID[w] for w in ("search_experience", "(", "query", "=", "'", "signal", "'", ")")] + [2]
    server = ScriptedServerManager([ask, TURN_1, TURN_2])
    [out] = run_loop(config, server, session_id=0, uid="prompt-uid-ask")
    record = json.loads(out.extra_fields["trajectory"])
    ask_step = record["steps"][0]["info"]["ask"]
    assert ask_step["query"] == "signal" and ask_step["hits"] and not ask_step["over_budget"]
    assert record["steps"][0]["observation"]["role"] == "tool"
    # The answer (a JSON tool result, its words mostly outside the vocabulary) follows the ask as a user turn.
    answer_ids = word_tokenizer().encode(record["steps"][0]["observation"]["content"], add_special_tokens=False)
    answer = len(answer_ids)
    assert out.response_ids == ask + [1, 4] + answer_ids + [2, 1, 5] + RESPONSE
    assert out.response_mask == [1] * len(ask) + [0] * (answer + 5) + MASK
    assert out.extra_fields["step_ids"] == [0] * (len(ask) + answer + 5) + [s + 1 for s in STEP_IDS]
    # Nothing is stripped: the training prompt is the generation prompt, and turn 2 continued the answer.
    assert out.prompt_ids == server.requests[0]["prompt_ids"]
    assert server.requests[1]["prompt_ids"] == out.prompt_ids + out.response_ids[:len(ask) + answer + 5]
    assert out.reward_score == 1.0 and out.extra_fields["experience_flag"] is False
    assert (out.extra_fields["asks"], out.extra_fields["asks_over_budget"], out.extra_fields["num_steps"]) == (1, 0, 3)


def test_validation_rows_run_without_experience_or_asks(env_url, experience_url):
    """A row `evolver_sync` marked as validation: the flagged session gets no experience and, with
    experience.mode action, the policy is offered no ask (its first prompt is the plain task's)."""
    injected = veRL_config(env_url, {"url": experience_url, "workspace": "signal-ws"}, n=4)
    server = ScriptedServerManager([TURN_1, TURN_2])
    [out] = run_loop(injected, server, session_id=1, uid="prompt-uid-val", evolver_validate=True)
    assert server.requests[0]["prompt_ids"] == PROMPT  # session 1 of 4 at ratio 0.5 is flagged in training
    assert out.extra_fields["experience_flag"] is False and out.extra_fields["experience_ids"] == []

    asking = veRL_config(env_url, {"url": experience_url, "workspace": "signal-ws", "mode": "action",
                                   "ask_format": "tool", "min_similarity": -1.0}, n=2)
    asking.evolver.rollout.experience_ratio = 0.0
    trained = ScriptedServerManager([TURN_1, TURN_2])
    run_loop(asking, trained, session_id=0, uid="prompt-uid-train")
    assert trained.requests[0]["prompt_ids"] != PROMPT  # training: the ask tool is offered in the prompt
    validated = ScriptedServerManager([TURN_1, TURN_2])
    [out] = run_loop(asking, validated, session_id=0, uid="prompt-uid-val-asks", evolver_validate=True)
    assert validated.requests[0]["prompt_ids"] == PROMPT and out.extra_fields["asks"] == 0
    assert out.response_ids == RESPONSE and out.reward_score == 1.0


# ---- log-probs of experience rollouts vs the stripped training prompt ----

class ContextLM:
    """A tiny fixed causal LM over VOCAB: the next-token logits read the mean embedding of the whole context,
    so a token's log-prob changes when experience is in (or out of) the context. It plays the policy twice:
    as the rollout server (generating context) and as the actor recomputing on the training prompt."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.randn(len(VOCAB), 8, generator=generator)
        self.head = torch.randn(8, len(VOCAB), generator=generator)

    def logprobs(self, context: list[int], tokens: list[int]) -> list[float]:
        out, ids = [], list(context)
        for token in tokens:
            hidden = self.embed[torch.tensor(ids)].mean(dim=0)
            out.append(float(torch.log_softmax(hidden @ self.head, dim=-1)[token]))
            ids.append(token)
        return out


class LMServerManager(ScriptedServerManager):
    """Scripted token ids, with the log-probs the LM gives them in the context actually sent."""

    def __init__(self, replies: list[list[int]], lm: ContextLM) -> None:
        super().__init__(replies)
        self.lm = lm

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        return TokenOutput(token_ids=out.token_ids, log_probs=self.lm.logprobs(list(prompt_ids), out.token_ids))


def test_experience_rollouts_get_importance_weight_one_for_an_unchanged_policy(env_url, experience_url):
    from verl.protocol import DataProto

    from trainer.verl_plugin.trainer import evolver_advantage_step, extras_to_non_tensor

    lm = ContextLM()
    config = veRL_config(env_url, {"url": experience_url, "workspace": "signal-ws"}, n=4)
    flagged, = run_loop(config, LMServerManager([TURN_1, TURN_2], lm), session_id=0)
    plain, = run_loop(config, LMServerManager([TURN_1, TURN_2], lm), session_id=3)
    assert flagged.extra_fields["experience_flag"] and not plain.extra_fields["experience_flag"]
    outputs = [flagged, plain]

    width = max(len(o.response_ids) for o in outputs)
    mask, rollout_lp, old_lp, scores = (torch.zeros((2, width)) for _ in range(4))
    for row, out in enumerate(outputs):
        n = len(out.response_ids)
        mask[row, :n] = torch.tensor(out.response_mask, dtype=torch.float32)
        rollout_lp[row, :n] = torch.tensor(out.response_logprobs)
        # The actor, unchanged since the rollout, recomputes on the training (stripped) prompt.
        recomputed = lm.logprobs(out.prompt_ids, out.response_ids)
        old_lp[row, :n] = torch.tensor(recomputed) * mask[row, :n]
        scores[row, n - 1] = out.reward_score
    policy = mask.bool()
    # Generated with experience in context, trained without it: the rollout's log-probs do not match the actor's.
    assert not torch.allclose(rollout_lp[0][policy[0]], old_lp[0][policy[0]], atol=1e-4)
    assert torch.allclose(rollout_lp[1][policy[1]], old_lp[1][policy[1]], atol=1e-5)

    data = DataProto.from_dict(tensors={"response_mask": mask.long(), "rm_scores": scores, "rollout_log_probs": rollout_lp,
                                        "old_log_probs": old_lp},
                               non_tensors={"uid": np.array(["u", "u"], dtype=object)})
    data.non_tensor_batch.update(extras_to_non_tensor([dict(o.extra_fields) for o in outputs]))
    trainer_config = OmegaConf.create({"algorithm": {
        "adv_estimator": "evolver_grpo", "use_kl_in_reward": False, "kl_penalty": "kl",
        "rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 100.0, "bypass_mode": False},
        "evolver": {}}})
    data, metrics, corrected = evolver_advantage_step(data, trainer_config, global_steps=1)
    assert corrected and metrics["evolver/stripped_logprob_rows"] == 1.0
    weights = data.batch["rollout_is_weights"]
    assert torch.allclose(weights[policy], torch.ones(int(policy.sum())), atol=1e-5)


def test_the_outage_budget_and_log_folder_of_the_settings_reach_the_rollout_workers_peers():
    """A down env service: the agent loop waits `evolver.outage_budget_s` (not the 120 s default), then
    fails naming the service and its log under `evolver.logs_dir`."""
    from common.http import PeerUnavailable
    from tests.helpers import free_port

    config = veRL_config(f"http://127.0.0.1:{free_port()}")
    config.evolver.outage_budget_s = 0.5
    config.evolver.logs_dir = "runs/verl-run/logs"
    with pytest.raises(PeerUnavailable) as caught:
        run_loop(config, ScriptedServerManager([]), session_id=0)
    assert "env_service" in str(caught.value) and "runs/verl-run/logs/env_service.log" in str(caught.value)
