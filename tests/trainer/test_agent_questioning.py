"""Questioning for a user's own agent, on real services over HTTP: `llm_server --model tiny` (the gateway), the
env service (flights v2, tier 1) and the task manager. Forced exploration runs the agent's own tools; an observed
job synthesizes tasks from what they returned (the task manager's own synthesizers); a task is kept only when
the agent's run of its reference reaches it, ids its tools generate (order numbers) carried across runs; the
funnel is per kind with its failure reasons; forced episodes never become RL rollouts; the warm start trains on
the kept runs' recorded references; the studio shows the run's mechanism counters as it does an in-loop run's."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import httpx
import pytest
import torch
import yaml

from engine.models import load_model
from env_service.client import EnvClient
from env_service.environments.flights import FlightsEnvironment
from llm_server.client import LLMServerClient
from studio.app import build_app
from studio.settings import StudioSettings
from task_manager.envs import EnvAccess
from task_manager.models import Call
from task_manager.protocol import JobRequest, ObservedEpisode, ObservedToolCall
from tests.helpers import InProcessServer, ServiceProcess, run_service
from tests.trainer import gateway_agents
from trainer.agent_questioning import CLOSING_REPLY, AgentQuestioning, warm_start_segments
from trainer.agent_trainer import AgentTrainer
from trainer.agents import AgentRunner
from trainer.config import TrainerConfig
from trainer.gateway_rollouts import rollout_from_record
from trainer.peers import EnvPeer, TaskPeer
from trainer.settings import AgentConfig, AgentQuestioningConfig, WarmStartConfig
from trainer.warm_start import fine_tune

FLIGHTS = {"version": 2, "tiers": [1], "splits": {"train": 8, "validation": 4, "test": 4}}
SEED = "train-t1-0000"  # "What is the cheapest fare with seats left from San Francisco (SFO) to Chicago (ORD) ...?"
SEARCH = '<tool_call>{"name": "search_flight", "arguments": {"origin": "SFO", "destination": "ORD", ' \
         '"date": "2025-06-06"}}</tool_call>'


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    root = tmp_path_factory.mktemp("questioning")
    (root / "env.yaml").write_text(yaml.safe_dump({"env_service": {"environments": {"flights": FLIGHTS}}}))
    with run_service("env_service", ["--conf", str(root / "env.yaml")]) as env:
        (root / "tm.yaml").write_text(yaml.safe_dump({"task_manager": {
            "env_url": env.url, "store_dir": str(root / "store"), "environments": ["flights"],
            "serve_training_references": True, "dedup": {"embeddings": False},
            "synthesis": {"synthesizer": "hindsight", "kinds": ["lookup", "goal"], "query_forms": ["ids", "names"],
                          "lookup_kinds": "profile", "max_lookups": 4},
            "mixture": {"synthetic_ratio": 1.0, "use_original": False}}}))
        with run_service("task_manager", ["--conf", str(root / "tm.yaml")]) as tm:
            yield env, tm


def _runner(gateway: LLMServerClient, env: ServiceProcess, tasks: TaskPeer, callable_: str,
            agent: object) -> AgentRunner:
    config = AgentConfig(callable=callable_, tasks="unused.jsonl", env="flights", timeout_s=120)
    return AgentRunner(config, gateway, agent, env=EnvPeer(env.url), env_url=env.url,  # type: ignore[arg-type]
                       task_grader=tasks)


async def short_flights_agent(task: dict, base_url: str) -> str | None:
    """The flights example as a user would configure it for a small model: short replies, few turns."""
    from examples.agents.openai_flights import agent

    return await agent(task, base_url, max_tokens=48, max_turns=4, seed=0)


async def budget_flights_agent(task: dict, base_url: str) -> str | None:
    """The flights example with a reply budget that a forced call fits in, so that the random model's forced calls
    complete and their results come back. Its sampling seed makes the random model's grounded call on
    train-t1-0001 the passenger lookup by the request's name (other seeds pick arguments that return errors)."""
    from examples.agents.openai_flights import agent

    return await agent(task, base_url, max_tokens=128, max_turns=3, seed=10)


async def test_tasks_from_observed_tool_results_are_kept_only_where_the_agent_reaches_them(
        tiny_server: ServiceProcess, services: tuple[ServiceProcess, ServiceProcess]) -> None:
    env, tm = services
    config = AgentQuestioningConfig(explore_tasks=1, explore_episodes=1, max_tasks=8)
    async with LLMServerClient(tiny_server.url) as gateway:
        tasks = TaskPeer(tm.url)
        runner = _runner(gateway, env, tasks, "examples.agents.openai_flights:agent", short_flights_agent)
        questioning = AgentQuestioning(config, runner, tasks.client, "flights")
        # Forced exploration: an agent that leaves the choice of a tool to the model, which (random) calls none by
        # itself; in a forced episode every call is a call of its tool, and the gateway records what each returned.
        moves = AgentRunner(AgentConfig(callable="tests.trainer.gateway_agents:auto_agent", tasks="unused.jsonl"),
                            gateway, gateway_agents.auto_agent)
        assert not (await moves.play({"task_id": "a", "query": "go left"}, grade=False)).record.calls[0].tool_calls
        (explored,) = await AgentQuestioning(config, moves, tasks.client, "agent").explore(
            [{"task_id": "a", "query": "go left"}], grounded=False)
        assert explored.seed_task_id == "a" and [c.name for c in explored.calls] == ["move", "move"]
        assert all(c.result == f"you are {c.arguments['to']}" for c in explored.calls)
        forced = await moves.play({"task_id": "a", "query": "go left"}, force_tools=True, grade=False)
        assert forced.record.mode == "forced" and all(c.tool_calls for c in forced.record.calls[:2])
        with pytest.raises(ValueError, match="never trains the RL update"):  # off-policy: never an RL rollout
            rollout_from_record(forced.record, task_id="a", outcome=0.0, group_id="g")

        # What a grounded forced call of the seed task may take: its request's own values where it has some.
        known = (await tasks.client.argument_values("flights", SEED)).tools
        origins = set(known["search_flight"]["origin"])  # the request's codes ("USD" is in it too), not the docs' JFK
        assert {"SFO", "ORD"} <= origins and "JFK" not in origins and "2025-06-06" in known["search_flight"]["date"]

        # What an agent that searched the seed task's route observed: the task manager's lookup synthesizer writes
        # tasks from those results (answers taken from them), verified by replay, stored.
        searched = await runner.play({"task_id": SEED}, script=[SEARCH, "I searched."], grade=False)
        (observed,) = searched.record.observed
        fares = json.loads(observed.result)
        assert observed.name == "search_flight" and fares
        assert await questioning.synthesize([ObservedEpisode(seed_task_id=SEED, calls=[ObservedToolCall(
            name=observed.name, arguments=observed.arguments, result=observed.result)])])
        funnel = questioning.report.by_kind
        assert funnel and all(k.split(":")[1].startswith("search_flight(") for k in funnel)  # from what was observed
        assert sum(f.stored for f in funnel.values()) >= 2
        for row in funnel.values():
            assert row.proposed == row.verified + sum(row.failures.by_reason.values()) and row.stored <= row.verified

        # A blind agent (its tools answer nothing) plays the same references and reaches none of them.
        blind = AgentQuestioning(config, _runner(gateway, env, tasks, "tests.trainer.gateway_agents:blind_flights_agent",
                                                 gateway_agents.blind_flights_agent), tasks.client, "flights")
        await blind.keep_reached()
        assert blind.report.kept == [] and sum(f.played for f in blind.report.by_kind.values()) >= 2
        assert {r for f in blind.report.by_kind.values() for r in f.failures.by_reason} == {"agent_tools_differ"}
        assert blind.runner.synthetic == {}

        # The flights example, unchanged, reaches every reference: those tasks are kept.
        await questioning.keep_reached()
        report = questioning.report
        stored = sum(f.stored for f in funnel.values())
        assert len(report.kept) == stored == sum(f.kept for f in funnel.values())
        answers = {str(r.get("price")) for r in fares} | {str(r.get("flight_id")) for r in fares} | {
            str(r.get("seats_left")) for r in fares}
        for kept in report.kept:
            assert kept.env_task.seed_task_id == SEED and kept.played.outcome == 1.0
            assert kept.played.record.mode == "scripted" and kept.task["query"] == kept.env_task.query
            closing = kept.played.record.calls[-1].content
            assert closing.startswith("The answer is ") and closing[len("The answer is "):-1] in answers
        summary = report.summary()
        assert summary["kept"] == len(report.kept) and set(summary["by_kind"]) == set(funnel)
        assert summary["job_status"] == "done" and summary["job_failures"]["by_reason"] == {}

    # The warm start trains on the kept runs as the gateway recorded them: exactly the reference's calls and the
    # closing answer, rendered into the agent's own episode, under the loss mask.
    model, tokenizer = load_model("tiny")
    segments = warm_start_segments(report.kept)
    for kept in report.kept:
        trained = [t for s in segments for t, m in zip(s.response_ids, s.loss_mask, strict=True) if m]
        assert all(t in trained for c in kept.played.record.calls for t in c.token_ids)
    masked = tokenizer.decode([t for s in segments[:1] for t, m in zip(s.response_ids, s.loss_mask, strict=True)
                               if m])
    assert "search_flight" in masked and "The answer is" in masked
    before = [p.detach().clone() for p in model.parameters()]
    result = fine_tune(model, segments, WarmStartConfig(enabled=True, epochs=2, batch_size=4, lr=1e-3),
                       torch.device("cpu"), seed=0)
    assert result["epoch_loss"][-1] < result["epoch_loss"][0]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


async def _book_then_cancel(env: ServiceProcess) -> ObservedEpisode:
    """An agent's episode on the seed task that books the route's cheapest flight and cancels that order: the
    cancel names the order id the booking generated in this run."""
    flights = FlightsEnvironment(FLIGHTS)
    world = flights.world_of(flights.task(SEED))
    route = {"origin": "SFO", "destination": "ORD", "date": "2025-06-06"}
    flight = min((f for f in world.route_flights(*route.values()) if f.seats > 0), key=lambda f: f.price)
    passenger = next(p for p in world.passengers.values() if p.balance >= flight.price)
    calls = [Call(name="search_flight", arguments=route),
             Call(name="book_ticket", arguments={"passenger_id": passenger.passenger_id, "flight_id": flight.flight_id})]
    async with EnvClient(env.url) as client, EnvAccess(client).instance("flights", SEED) as instance:
        results = [(await instance.step(c.render())).observation for c in calls]
        calls.append(Call(name="cancel_order", arguments={"order_id": json.loads(results[1])["order_id"]}))
        results.append((await instance.step(calls[-1].render())).observation)
    assert json.loads(results[2])["status"] == "cancelled"
    return ObservedEpisode(seed_task_id=SEED, calls=[ObservedToolCall(name=c.name, arguments=c.arguments, result=r)
                                                     for c, r in zip(calls, results, strict=True)])


async def test_a_book_then_cancel_task_is_kept_though_every_run_books_under_its_own_order_id(
        tiny_server: ServiceProcess, services: tuple[ServiceProcess, ServiceProcess]) -> None:
    """Each run of book-then-cancel (the agent's observed one, the task manager's replays, the agent's run of the
    reference) gets another order id from the booking, and the cancel must name that run's. The observed job's
    replay and the gateway's scripted replies carry it over by one rule (`common.generated_ids`), and the agent's
    results are compared with the reference's up to it, so the agent's run reaches the task and it is kept."""
    env, tm = services
    observed = await _book_then_cancel(env)
    booked_when_observed = observed.calls[2].arguments["order_id"]
    config = AgentQuestioningConfig(explore_tasks=1, explore_episodes=1, max_tasks=64)
    async with LLMServerClient(tiny_server.url) as gateway:
        tasks = TaskPeer(tm.url)
        runner = _runner(gateway, env, tasks, "examples.agents.openai_flights:agent", short_flights_agent)
        questioning = AgentQuestioning(config, runner, tasks.client, "flights")
        assert await questioning.synthesize([observed])
        references = (await tasks.client.training_references("flights")).trajectories
        await questioning.keep_reached()
    report = questioning.report
    reference_cancels = [s.action.text() for r in references for s in r.steps if "cancel_order" in s.action.text()]
    assert reference_cancels  # a stored task books and then cancels
    runs = [k.played.record for k in report.kept if [o.name for o in k.played.record.observed][-1:] == ["cancel_order"]]
    assert runs, report.summary()
    for record in runs:
        book, cancel = record.observed[-2:]
        booked = json.loads(book.result)["order_id"]
        # The agent's tools cancelled the order its own run booked, an id no earlier run had.
        assert book.name == "book_ticket" and cancel.arguments == {"order_id": booked}
        assert json.loads(cancel.result)["status"] == "cancelled"
        assert booked != booked_when_observed and not any(booked in text for text in reference_cancels)
        assert record.calls[-1].content == CLOSING_REPLY  # the hindsight reference ends on a call: a closing reply
    assert not any("agent_tools_differ" in f.failures.by_reason for f in report.by_kind.values()), report.summary()


async def test_the_runner_questions_then_trains_and_reports_it(tiny_server: ServiceProcess,
                                                               services: tuple[ServiceProcess, ServiceProcess],
                                                               tmp_path: Path) -> None:
    """`trainer.agent.questioning` in a run: forced exploration before RL (the random model's forced calls fit the
    agent's reply budget, so their results come back), an observed job on them, a warm start on the kept tasks'
    runs, then RL on the kept tasks only (`train_on_tasks: false`: the tasks file only seeds the exploration, no
    human label grades an RL episode), which the task manager grades. Forced and scripted
    episodes are not rollouts (only the RL episodes are recorded). The summary has questioning's report beside
    the in-loop mechanism counters, and the studio shows them as it shows an in-loop run's."""
    env, tm = services
    original = "train-t1-0001"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": original}) + "\n")
    config = TrainerConfig.model_validate({
        "model": "tiny", "steps": 1, "tasks_per_step": 2, "output_dir": str(tmp_path / "runs" / "gateway"),
        "tensorboard": False, "plot": False, "progress": False, "ray": {"enabled": False},
        "rollout": {"env": "flights", "n": 2}, "optim": {"lr": 1e-3},
        "warm_start": {"enabled": True, "source": "synthetic", "epochs": 1},
        "policy": {"kind": "endpoint", "url": tiny_server.url, "served_model": "tiny"},
        "services": {"env_url": env.url, "task_url": tm.url}, "eval": {"before": False, "after": False},
        "agent": {"callable": "tests.trainer.test_agent_questioning:budget_flights_agent", "tasks": str(tasks),
                  "env": "flights",
                  "timeout_s": 120, "questioning": {"explore_tasks": 1, "explore_episodes": 2, "max_tasks": 4,
                                                    "train_on_tasks": False}}})
    result = await AgentTrainer(config).run()
    questioning = result["mechanisms"]["self_questioning"]
    agent = questioning["agent"]
    assert agent["explored_episodes"] == 2 and agent["observed_calls"] > 0, agent
    assert agent["job_status"] == "done" and agent["kept"] >= 1, agent
    assert "synthetic_graded" in questioning and "funnel_by_kind" in questioning  # the in-loop counters too
    warm = result["warm_start"]
    assert warm["source"] == "agent_runs" and warm["tasks"] == agent["kept"] and warm["samples"] >= 1, warm
    assert warm["policy_version"] >= 1 and "skipped" not in warm
    assert result["agent"]["episodes"] == 4  # the RL episodes only: exploration ran on its own runner
    run_dir = tmp_path / "runs" / "gateway"
    index = [json.loads(line) for line in (run_dir / "rollouts" / "index.jsonl").open()]
    # Kept tasks only, graded by the task manager like every synthetic task (beside the scripted runs that kept
    # them); the task file's line only seeded the exploration.
    assert len(index) == 4 and original not in {r["task_id"] for r in index}
    assert questioning["synthetic_graded"] >= agent["kept"] + 4

    with InProcessServer(build_app(StudioSettings(runs=str(tmp_path / "runs")), token="")) as server:
        page = httpx.get(f"{server.url}/runs/gateway", timeout=30)
    assert page.status_code == 200, page.text[:500]
    shown = counter_table(page.text, 'data-mechanism="self_questioning"')
    for key in ("explored_episodes", "observed_calls", "kept", "job_status"):
        assert shown[f"agent/{key}"] == str(agent[key])
    assert shown["synthetic_graded"] == str(questioning["synthetic_graded"])
    kind, row = next(iter(agent["by_kind"].items()))
    assert shown[f"agent/by_kind/{kind}/kept"] == str(row["kept"])
    logged = counter_table(page.text, 'data-section="metrics"')  # the metrics in-loop runs show as counters
    assert {"tasks/synthetic_graded", "rollout/groups", "rollout/dropped_groups"} <= set(logged)
    assert counter_table(page.text, 'data-section="gateway"')["episodes"] == "4"


def counter_table(html: str, attribute: str) -> dict[str, str]:
    """A counters table of the studio's run page: key -> the value shown."""
    table = re.search(rf'<table class="counters" {attribute}>(.*?)</table>', html, re.S)
    assert table is not None, f"no counters table with {attribute}"
    return {unescape(k): unescape(v) for k, v in re.findall(r'<tr><td>(.*?)</td><td class="n">(.*?)</td></tr>',
                                                           table.group(1))}


def test_the_example_yaml_plans_questioning_and_bad_settings_name_what_to_fix() -> None:
    from tests.launcher.test_config import plan_for

    plan = plan_for(Path("examples/agents/flights_openai.yaml"))
    assert plan.data["task_manager"]["serve_training_references"] is True  # the agent's references are played
    trainer = TrainerConfig.model_validate(plan.data["trainer"])
    assert trainer.agent is not None and trainer.agent.questioning is not None and trainer.warm_start.enabled
    base = {"model": "tiny", "rollout": {"env": "flights"}, "policy": {"kind": "endpoint", "url": "http://127.0.0.1:1"},
            "services": {"env_url": "http://127.0.0.1:2"},
            "agent": {"callable": "m:f", "tasks": "t.jsonl", "env": "flights", "questioning": {}}}
    with pytest.raises(ValueError, match="agent.questioning synthesizes through the task manager"):
        TrainerConfig.model_validate(base)
    with pytest.raises(ValueError, match="set agent.env"):
        AgentConfig(callable="m:f", tasks="t.jsonl", questioning=AgentQuestioningConfig())
    with pytest.raises(ValueError, match="train_on_tasks and train_on_kept are both false"):
        AgentQuestioningConfig(train_on_tasks=False, train_on_kept=False)
    with pytest.raises(ValueError, match="warm-starts only on the synthetic tasks its own runs reached"):
        TrainerConfig.model_validate({**base, "agent": {"callable": "m:f", "tasks": "t.jsonl"},
                                      "warm_start": {"enabled": True}})
    with pytest.raises(ValueError, match="observed: give it exactly when kind is 'observed'"):
        JobRequest(env="flights", kind="observed")
    assert JobRequest(env="flights", kind="observed", observed=[ObservedEpisode(seed_task_id=SEED, calls=[
        ObservedToolCall(name="search_flight", result="[]")])] * 3).episodes == 3
