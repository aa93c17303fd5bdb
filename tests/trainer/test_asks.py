"""Retrieval as the policy's own action (experience.mode action) and at every step (mode step), over real HTTP:
a real env service and a real experience manager; the "model" is a scripted generate function whose fixed
texts the real tiny tokenizer encodes, so every turn is known in advance."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from common.schemas import ChatMessage, Step, Task, Trajectory
from engine.models import load_tokenizer
from tests.helpers import SIGNAL_TWO_WORDS_YAML, run_env_service, run_service
from trainer.asks import (
    AskPolicy,
    Hit,
    ask_metrics,
    environment_steps,
    other_calls,
    parse_ask,
    resolve_format,
    retrieved_ids,
)
from trainer.peers import EnvPeer, ExperiencePeer
from trainer.policy import Generation
from trainer.rollout import RolloutConfig, made_tool_call, run_episode
from trainer.step_batch import StepBatch

ENV_YAML = SIGNAL_TWO_WORDS_YAML
TASK = Task(task_id="signal-train-0000", env_type="signal")  # its signal is `north`
ADVICE = "Say anything first; the next message shows the signal word; repeat that word exactly."


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    with run_env_service(ENV_YAML, tmp_path_factory.mktemp("env")) as env, \
            run_service("experience_manager", ["--store", str(tmp_path_factory.mktemp("em") / "store")]) as em:
        created = httpx.post(f"{em.url}/v1/workspaces/signal-ws/experiences", timeout=60, json={
            "when_to_use": "When asked to look at the signal then answer with the signal word", "content": ADVICE})
        assert created.status_code in (200, 201), created.text
        yield env.url, em.url, created.json()["experience"]["experience_id"]


class Script:
    """The policy: fixed replies in order, encoded by the real tokenizer; remembers every context."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer, self.replies = tokenizer, list(replies)
        self.contexts: list[list[int]] = []
        self.outputs: list[list[int]] = []

    async def __call__(self, prompt_ids, sampling) -> Generation:
        text = self.replies.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        self.contexts.append(list(prompt_ids))
        self.outputs.append(ids)
        return Generation(ids, [-0.5] * len(ids), text, "stop", 0)


class RecordingEnv(EnvPeer):
    """The real env client; remembers which actions reached the environment."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.actions: list[str] = []

    async def step(self, instance_id, action):
        self.actions.append(action)
        return await super().step(instance_id, action)


class RecordingSearch:
    """The real experience manager's search; remembers every query."""

    def __init__(self, peer: ExperiencePeer) -> None:
        self.peer, self.queries = peer, []

    async def search(self, query, task_kind=None):
        self.queries.append(query)
        return await self.peer.search(query, task_kind)


def config(**kw) -> RolloutConfig:
    return RolloutConfig(**{"env": "signal", "max_turns": 3, "max_new_tokens": 32, "max_context": 1024, **kw})


async def episode(env_url, em_url, tok, replies, policy_kw, **config_kw):
    env, peer = RecordingEnv(env_url), ExperiencePeer(em_url, "signal-ws", min_similarity=-1.0)
    script = Script(tok, replies)
    search = RecordingSearch(peer)
    try:
        rollout = await run_episode(TASK, env, script, tok, config(**config_kw), seed=1,
                                    asks=AskPolicy(search, **policy_kw))
    finally:
        await env.aclose()
        await peer.aclose()
    return rollout, script, env, search


def _decoded(tok, traj, step: int, mask: int) -> str:
    return tok.decode([t for t, m, s in zip(traj.response_ids, traj.loss_mask, traj.step_ids, strict=True)
                       if s == step and m == mask])


def test_an_ask_is_answered_in_context_masked_from_the_loss_within_its_budget(services, tok):
    env_url, em_url, exp_id = services
    asks = ["<search_experience>which signal word</search_experience>", "<search_experience>again</search_experience>",
            "<search_experience>once more</search_experience>"]
    rollout, script, env, search = asyncio.run(episode(env_url, em_url, tok, [*asks, "hi", "north"],
                                                       {"budget": 2, "format": "tag"}))
    traj = rollout.trajectory
    # Two asks answered, the third refused (over the budget, no search), none reached the environment.
    assert env.actions == ["hi", "north"] and search.queries == ["which signal word", "again"]
    assert (rollout.asks, rollout.asks_over_budget, rollout.invalid_steps) == (2, 1, 0)
    assert [s.index for s in traj.steps] == [0, 1, 2, 3, 4] and len(environment_steps(traj.steps)) == 2
    first = traj.steps[0].info["ask"]
    assert first["query"] == "which signal word" and not first["over_budget"] and not first["withheld"]
    assert [h["id"] for h in first["hits"]] == [exp_id] and isinstance(first["hits"][0]["score"], float)
    assert traj.steps[2].info["ask"] == {"query": "once more", "hits": [], "over_budget": True, "withheld": False}
    assert "budget of 2" in traj.steps[2].observation.text()
    assert traj.outcome == 1.0 and not traj.experience_flag and not made_tool_call(traj.steps)
    assert retrieved_ids(traj) == [exp_id]
    assert ask_metrics([traj, Trajectory(task_id="t", outcome=0.0)]) == {
        "ask_rate": 0.5, "asks_mean": 1.0, "asks_over_budget": 1.0, "success_asked": 1.0, "success_not_asked": 0.0}
    # The system message lists the ask; the answer (with its score) is what the policy saw next ...
    assert "<search_experience>" in tok.decode(traj.prompt_ids)
    answer = traj.steps[0].observation.text()
    assert answer.startswith("<experience>\n[1] (score ") and ADVICE in answer
    assert answer in tok.decode(script.contexts[1])
    # ... and stays in the training sample, token for token: every generation context is the training prompt
    # plus the response so far (nothing stripped, so the rollout's log-probs are the old ones).
    for context in script.contexts:
        assert context == traj.prompt_ids + traj.response_ids[:len(context) - len(traj.prompt_ids)]
    # Token level: the ask's generated ids are its step's mask-1 tokens; its answer is mask 0 under its step id.
    assert [t for t, m, s in zip(traj.response_ids, traj.loss_mask, traj.step_ids, strict=True)
            if s == 0 and m] == script.outputs[0]
    assert ADVICE in _decoded(tok, traj, 0, 0) and ADVICE not in _decoded(tok, traj, 0, 1)
    [sample] = StepBatch([[rollout]], advantages=[[1.0] * len(traj.response_ids)]).samples()
    assert sample.response_ids == traj.response_ids and sample.loss_mask == traj.loss_mask
    assert not sample.experience_flag


def test_asks_are_turns_on_top_of_max_turns_and_a_withheld_ask_is_recorded(services, tok):
    env_url, em_url, _ = services
    calls: list[tuple[str, int]] = []

    async def on_ask(instance_id: str, turn: int) -> None:
        calls.append((instance_id, turn))

    ask = "<search_experience>which signal word</search_experience>"
    rollout, _, env, search = asyncio.run(episode(env_url, em_url, tok, [ask, "hi", ask, "south"],
                                                  {"budget": 1, "withhold": True, "on_ask": on_ask}, max_turns=2))
    traj = rollout.trajectory
    # max_turns 2 environment steps plus one answered ask; the second ask is over the budget (no on_ask).
    assert env.actions == ["hi"] and search.queries == [] and traj.truncated
    assert (rollout.asks, rollout.asks_over_budget) == (1, 1) and calls == [(rollout.instance_id, 0)]
    assert traj.steps[0].info["ask"]["withheld"] and traj.steps[0].info["ask"]["hits"] == []
    assert "No experience is given" in traj.steps[0].observation.text() and retrieved_ids(traj) == []
    assert [g.token_ids for g in rollout.turn_generations][0] == traj.response_ids[:len(rollout.turn_generations[0].token_ids)]
    assert rollout.seed == 1


def test_step_mode_searches_before_every_turn_with_the_latest_observation(services, tok):
    env_url, em_url, exp_id = services
    rollout, script, env, search = asyncio.run(episode(env_url, em_url, tok, ["hi", "north"], {"mode": "step"}))
    traj = rollout.trajectory
    query = "look at the signal then answer north, south"
    observation = traj.steps[0].observation.text()
    assert search.queries == [query, f"{query}\n\n{observation}"] and rollout.retrievals == 2
    assert [s.info["retrieval"]["query"] for s in traj.steps] == search.queries
    assert traj.steps[1].info["retrieval"]["hits"][0]["id"] == exp_id and rollout.asks == 0
    # The first search follows the task in the (training) prompt; the second follows the observation, mask 0.
    assert ADVICE in tok.decode(traj.prompt_ids) and ADVICE in _decoded(tok, traj, 0, 0)
    assert ADVICE in tok.decode(script.contexts[1][len(script.contexts[0]):])
    for context in script.contexts:
        assert context == traj.prompt_ids + traj.response_ids[:len(context) - len(traj.prompt_ids)]
    assert env.actions == ["hi", "north"] and traj.outcome == 1.0


def test_ask_feedback_moves_utility_and_prunes_under_the_floor(services, tok):
    """An ask's outcome updates the usage of what it returned: (s+1)/(n+2), archived under 0.3 after 5 uses."""
    env_url, em_url, _ = services
    workspace = "signal-feedback"
    created = httpx.post(f"{em_url}/v1/workspaces/{workspace}/experiences", timeout=60,
                         json={"when_to_use": "When asked about the signal", "content": ADVICE})
    exp_id = created.json()["experience"]["experience_id"]

    async def asked(reply: str) -> Trajectory:
        env, peer = EnvPeer(env_url), ExperiencePeer(em_url, workspace, min_similarity=-1.0)
        script = Script(tok, ["<search_experience>signal</search_experience>", "hi", reply])
        try:
            return (await run_episode(TASK, env, script, tok, config(), asks=AskPolicy(peer, budget=1))).trajectory
        finally:
            await env.aclose()
            await peer.aclose()

    async def run() -> list[dict]:
        peer = ExperiencePeer(em_url, workspace)
        usages = []
        try:
            for step, reply in enumerate(["north", "south", "south", "south", "south"]):
                # Its group: the asking rollout and one that asked nothing (the baseline), then asking ones only.
                group = [await asked(reply)]
                if step == 0:
                    group.append(Trajectory(task_id=TASK.task_id, outcome=0.0))
                await peer.after_step([group], summarize=False, feedback=True, request_id=f"ask-{step}")
                usages.append((await peer.client.get_experience(workspace, exp_id)).model_dump())
        finally:
            await peer.aclose()
        return usages

    usages = asyncio.run(run())
    first = usages[0]["usage"]
    assert (first["uses"], first["successes"], first["advantage_count"]) == (1, 1, 1)
    assert first["advantage_sum"] == pytest.approx(1.0)  # reward 1 against the no-ask baseline 0
    assert [u["usage"]["uses"] for u in usages] == [1, 2, 3, 4, 5]
    utilities = [(u["usage"]["successes"] + 1) / (u["usage"]["uses"] + 2) for u in usages]
    assert utilities == pytest.approx([2 / 3, 2 / 4, 2 / 5, 2 / 6, 2 / 7])
    # 2/7 < 0.3 after min_uses (5) with fewer than 5 baselines: archived by the pool's own rule.
    assert [u["status"] for u in usages] == ["active"] * 4 + ["archived"]


def test_the_ask_format_follows_the_chat_template_and_is_parsed_either_way(tok):
    assert resolve_format("auto", tok) == "tool"  # the template renders a tools list
    plain = type("Plain", (), {"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"})()
    assert resolve_format("auto", plain) == "tag" and resolve_format("tag", tok) == "tag"
    with pytest.raises(ValueError, match="auto, tool or tag"):
        resolve_format("xml", tok)
    assert parse_ask("search_experience(query='book a flight')", "tool") == "book a flight"
    assert parse_ask('<tool_call>{"name": "search_experience", "arguments": {"query": "x"}}</tool_call>', "tool") == "x"
    assert parse_ask("search_flight(origin='SFO')", "tool") is None
    assert parse_ask("search_experience(query='x'", "tool") is None  # malformed: goes to the environment
    assert parse_ask("think <search_experience> fares </search_experience>", "tag") == "fares"
    assert parse_ask("search_experience(query='x')", "tag") is None
    # The rest of an ask's message is not run; the answer counts it.
    assert other_calls("search_experience(query='x')\nsearch_flight(origin='SFO')") == 1
    assert other_calls("<search_experience>x</search_experience>") == 0
    # An ask answered as a tool result is no tool call of the environment (the strict metric).
    ask = Step(index=0, action=ChatMessage(role="assistant", content="search_experience(query='x')"),
               observation=ChatMessage(role="tool", content="{}"),
               info={"ask": {"query": "x", "hits": [Hit("exp_1", 0.5, "t").record()], "over_budget": False,
                             "withheld": False}})
    assert not made_tool_call([ask]) and retrieved_ids(Trajectory(task_id="t", steps=[ask])) == ["exp_1"]


def test_evaluation_with_asks_reports_them_apart_and_refuses_a_pool_with_held_out_content(services, tok):
    from trainer.asks import refuse_held_out
    from trainer.rollout import evaluate_policy

    env_url, em_url, _ = services
    leaked = httpx.post(f"{em_url}/v1/workspaces/leaky/experiences", timeout=60, json={
        "when_to_use": "When asked about the signal", "content": ADVICE, "task_ids": ["signal-validation-0001"]})
    assert leaked.status_code in (200, 201), leaked.text

    async def run():
        env, peer, leaky = EnvPeer(env_url), ExperiencePeer(em_url, "signal-ws", min_similarity=-1.0), \
            ExperiencePeer(em_url, "leaky")
        try:
            held_out = await env.task_ids("signal", "validation")
            refuse_held_out(await peer.source_task_ids(), held_out, "signal-ws")  # train content only: accepted
            with pytest.raises(ValueError, match="held-out task.*signal-validation-0001"):
                refuse_held_out(await leaky.source_task_ids(), held_out, "leaky")
            script = Script(tok, ["<search_experience>signal</search_experience>", "hi", "north"])
            task = Task(task_id=held_out[0], env_type="signal", split="validation")
            return await evaluate_policy([task], env, script, tok, config(), asks=AskPolicy(peer))
        finally:
            await env.aclose()
            await peer.aclose()
            await leaky.aclose()

    summary = asyncio.run(run())
    metrics = summary.metrics("eval_asks")
    # The ask is counted apart: two environment steps, one sample that asked.
    assert summary.per_task_steps == {"signal-validation-0000": [2]} and metrics["eval_asks/ask_rate"] == 1.0
    assert "eval_asks/success_asked" in metrics and "eval_asks/success_not_asked" not in metrics
    assert summary.invalid_action_rate == 0.0


def test_the_modes_are_exclusive_and_need_the_experience_manager():
    from common.config import ConfigError, validate
    from trainer.config import TrainerConfig

    base = {"rollout": {"env": "signal"}, "services": {"env_url": "http://127.0.0.1:1"}}
    with pytest.raises(ConfigError, match="experience.mode=action searches the pool"):
        validate(TrainerConfig, {**base, "experience": {"mode": "action"}}, root="trainer")
    with pytest.raises(ConfigError, match="experience_ratio to 0"):
        validate(TrainerConfig, {"rollout": {"env": "signal", "experience_ratio": 0.5}, "experience": {"mode": "step"},
                                 "services": {"env_url": "http://127.0.0.1:1", "experience_url": "http://127.0.0.1:2"}},
                 root="trainer")
    with pytest.raises(ConfigError, match="eval.asks"):
        validate(TrainerConfig, {**base, "eval": {"asks": True}}, root="trainer")
    ok = validate(TrainerConfig, {**base, "experience": {"mode": "action", "ask_budget": 1},
                                  "services": {"env_url": "http://127.0.0.1:1", "experience_url": "http://127.0.0.1:2"}},
                  root="trainer")
    assert ok.experience.mode == "action" and ok.experience.ask_budget == 1
