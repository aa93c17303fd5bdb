"""`python -m trainer.evaluate` on a checkpoint, an exported model and an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from engine.models import export_model, load_model
from tests.helpers import REPO, run_env_service, run_service
from trainer.checkpoint import save_checkpoint
from trainer.evaluate import main

ENV_YAML = "env_service:\n  environments:\n    signal: {fallback: first_char}\n"
TASKS = 8


@pytest.fixture(scope="module")
def env_url(tmp_path_factory):
    with run_env_service(ENV_YAML, tmp_path_factory.mktemp("env")) as service:
        yield service.url


def common_args(env_url: str, split: str = "test") -> list[str]:
    return ["--env-url", env_url, "--env", "signal", "--split", split, "--tasks", str(TASKS), "--max-turns", "2",
            "--max-new-tokens", "2", "--max-context", "256", "--threads", "1"]


def test_checkpoint_and_its_export_score_the_same(env_url, tmp_path, capsys):
    torch.manual_seed(0)
    model, tokenizer = load_model("tiny")
    with torch.no_grad():  # weights unlike the base tiny model, so loading the checkpoint matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_checkpoint(tmp_path / "checkpoints", 7, {"model": model.state_dict(), "config": {"model": "tiny"}})
    export_model(model, tokenizer, tmp_path / "export")

    assert main([*common_args(env_url), "--checkpoint", str(tmp_path / "checkpoints"), "--k", "2",
                 "--out", str(tmp_path / "ckpt.json")]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main([*common_args(env_url), "--model", str(tmp_path / "export"), "--k", "2",
                 "--out", str(tmp_path / "export.json")]) == 0
    from_checkpoint = json.loads((tmp_path / "ckpt.json").read_text())
    from_export = json.loads((tmp_path / "export.json").read_text())

    assert printed["policy"] == {"checkpoint": str(tmp_path / "checkpoints"), "step": 7}
    # Where the engine's time went: every prompt token was computed once or copied as a shared prefix.
    engine = from_checkpoint["engine"]
    assert engine["prefill_tokens"] + engine["shared_prefix_tokens"] <= engine["prompt_tokens"]
    assert engine["prefill_tokens"] > 0 and engine["generated_tokens"] >= TASKS * 2
    assert engine["prefill_s"] > 0 and engine["decode_s"] > 0 and engine["decode_steps"] > 0
    assert 0 < engine["decode_padding_share"] < 1  # columns come in blocks: some padding is read, never only padding
    # Every second turn resumed from its first turn's kept cache (policy.prefix_cache_mb's default is on).
    turns = sum(sum(v) for v in from_checkpoint["per_task_steps"].values())
    assert turns > TASKS * 2 and engine["resumed_rows"] == turns - TASKS * 2
    assert from_checkpoint["tasks"] == TASKS and from_checkpoint["k"] == 2
    assert all(len(v) == 2 for v in from_checkpoint["per_task"].values())
    # Each sample's episode length, beside its outcome (2 turns at most here).
    assert sorted(from_checkpoint["per_task_steps"]) == sorted(from_checkpoint["per_task"])
    assert all(len(v) == 2 and all(1 <= n <= 2 for n in v) for v in from_checkpoint["per_task_steps"].values())
    # Whether each sample called a tool: signal answers in text, never as a tool, so no sample did.
    assert from_checkpoint["per_task_called"] == {t: [False, False] for t in from_checkpoint["per_task"]}
    # Greedy decoding of the same weights: the same answers, task by task.
    assert from_checkpoint["per_task"] == from_export["per_task"]
    assert from_checkpoint["answers"] == from_export["answers"]
    # Every sample's last reply, in sample order; the first sample's is the task's answer.
    assert from_checkpoint["replies"] == from_export["replies"]
    assert all(len(from_checkpoint["replies"][t]) == 2 and from_checkpoint["replies"][t][0] == a
               for t, a in from_checkpoint["answers"].items())
    assert sorted(from_checkpoint["answers"]) == sorted(from_checkpoint["per_task"])
    for key in ("avg@2", "best@2", "invalid_action_rate"):
        assert 0.0 <= from_checkpoint[key] <= 1.0
        ci = from_checkpoint["ci95"][key]
        assert ci["lo"] <= ci["mean"] <= ci["hi"]
    assert from_checkpoint["best@2"] >= from_checkpoint["avg@2"]


def test_endpoint_with_token_ids_and_chat_only(env_url, tiny_server, tmp_path):
    results = {}
    for mode in ("tokens", "chat"):
        extra = ["--tokenizer", "tiny"] if mode == "tokens" else ["--chat"]
        out = tmp_path / f"{mode}.json"
        proc = subprocess.run([sys.executable, "-m", "trainer.evaluate", *common_args(env_url, "validation"),
                               "--endpoint", tiny_server.url, "--served-model", "tiny", *extra, "--out", str(out)],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout.strip().splitlines()[-1])["tasks"] == TASKS
        results[mode] = json.loads(out.read_text())
        if mode == "tokens":  # the same progress lines as the trainer's evaluations, about 8 of them
            progress = re.findall(r"evaluation episodes (\d+)/(\d+): [\d.]+ tokens/s", proc.stderr)
            assert progress == [(str(i), str(TASKS)) for i in range(1, TASKS + 1)], proc.stderr[-3000:]
    for result in results.values():
        assert result["tasks"] == TASKS and result["greedy"]
        assert len(result["answers"]) == TASKS and all(isinstance(a, str) for a in result["answers"].values())
        assert all(len(v) == 1 and 1 <= v[0] <= 2 for v in result["per_task_steps"].values())
        assert {t: [a] for t, a in result["answers"].items()} == result["replies"]
        # Two turns per episode, the second's answer is read with the first_char fallback when it names
        # no option: the invalid-action rate is reported beside success (at most one invalid step of two).
        assert 0.0 <= result["invalid_action_rate"] <= 0.5
    assert results["chat"]["policy"] == {"endpoint": tiny_server.url, "chat": True}


def test_bad_checkpoint_path_is_a_clear_error(env_url, tmp_path, capsys):
    assert main([*common_args(env_url), "--checkpoint", str(tmp_path / "missing.pt")]) == 2
    assert "missing.pt does not exist" in capsys.readouterr().err


def test_training_through_a_served_endpoint_pushes_each_update(env_url, tmp_path):
    """policy.kind=endpoint: rollouts from llm_server, new weights pushed after every step."""
    import asyncio

    import httpx

    from trainer.config import TrainerConfig
    from trainer.local import LocalTrainer

    weights = tmp_path / "run" / "weights"  # where the trainer writes them; the server loads only from there
    with run_service("llm_server", ["--model", "tiny", "--threads", "1", "--weights-dir", str(weights)]) as server:
        config = TrainerConfig.model_validate({
            "model": "tiny", "seed": 2, "steps": 2, "tasks_per_step": 2, "output_dir": str(tmp_path / "run"),
            "torch_threads": 1, "progress": False, "tensorboard": False, "plot": False,
            "rollout": {"env": "signal", "n": 2, "max_turns": 2, "max_new_tokens": 2, "max_context": 256},
            "policy": {"kind": "endpoint", "url": server.url, "served_model": "tiny"},
            "optim": {"lr": 1e-3}, "services": {"env_url": env_url},
            "eval": {"before": False, "after": False}, "ray": {"enabled": False},
        })
        result = asyncio.run(LocalTrainer(config).run())
        served_version = httpx.get(f"{server.url}/v1/weights", timeout=10).json()["policy_version"]
    assert result["steps"] == 2 and served_version == 2
    records = [r for r in result["history"] if "policy/version" in r]
    assert [r["policy/version"] for r in records] == [1.0, 2.0]
    # Every sample of a step came from the weights pushed after the previous step.
    assert all(r["rollout/version_lag_max"] == 0.0 for r in records)


def test_a_wider_evaluation_engine_scores_the_same_and_leaves_the_rollout_engine_current(env_url, tmp_path,
                                                                                          monkeypatch):
    """eval.max_batch evaluates on an engine of its own: the same greedy replies as the rollout engine's,
    before and after an update, and the rollout engine still serves the updated weights afterwards."""
    import asyncio

    from trainer.config import TrainerConfig
    from trainer.local import LocalTrainer

    config = TrainerConfig.model_validate({
        "model": "tiny", "seed": 0, "steps": 1, "tasks_per_step": 2, "output_dir": str(tmp_path / "run"),
        "torch_threads": 1, "progress": False, "tensorboard": False, "plot": False,
        "rollout": {"env": "signal", "n": 2, "max_turns": 2, "max_new_tokens": 3, "max_context": 256,
                    "concurrency": 4},
        "policy": {"max_batch": 2, "threads": 1, "dtype": "float32"},
        "optim": {"lr": 5e-2, "minibatches": 1}, "services": {"env_url": env_url},
        "eval": {"split": "test", "tasks": TASKS, "k": 2, "greedy": True, "before": False, "after": False},
        "ray": {"enabled": False}})
    wide = config.model_copy(update={"eval": config.eval.model_copy(update={"max_batch": 16})})
    trainer = LocalTrainer(config)

    async def both(label: str) -> tuple[dict, dict]:
        trainer.config = config
        assert trainer._evaluation_engine() is None
        timings.append(await trainer.evaluate(f"{label}-rollout-engine"))
        trainer.config = wide
        engine = trainer._evaluation_engine()
        assert engine is not None and engine.engine.max_batch == 16
        await engine.aclose()
        timings.append(await trainer.evaluate(f"{label}-wide"))
        narrow, wider = trainer.evaluations[f"{label}-rollout-engine"], trainer.evaluations[f"{label}-wide"]
        return narrow.per_task_replies, wider.per_task_replies

    async def scenario() -> tuple[tuple[dict, dict], tuple[dict, dict], dict]:
        await trainer.setup()
        try:
            start = await both("start")
            trainer.config = config
            metrics = await trainer.train_step()
            return start, await both("updated"), metrics
        finally:
            await trainer.close()

    from loguru import logger

    from trainer.local import evaluate_policy as real_evaluate

    in_flight: list[int] = []  # episodes each evaluation runs at once (the real evaluate_policy still runs)

    async def spy(*args, **kwargs):
        in_flight.append(args[4].concurrency)
        return await real_evaluate(*args, **kwargs)

    timings: list[dict] = []
    progress: list[str] = []
    sink = logger.add(lambda message: progress.append(message.record["message"]), level="INFO",
                      filter=lambda record: record["message"].startswith("evaluation episodes"))
    monkeypatch.setattr("trainer.local.evaluate_policy", spy)
    try:
        (start_narrow, start_wide), (updated_narrow, updated_wide), metrics = asyncio.run(scenario())
    finally:
        logger.remove(sink)
    # The 16-row engine gets 16 episodes at once, not rollout.concurrency's 4; the rollout engine keeps 4.
    assert in_flight == [4, 16, 4, 16]
    # Each of the four evaluations says how far it is about 8 times: 16 episodes (8 tasks x k 2), every 2nd.
    assert [line.split(":")[0] for line in progress] == [f"evaluation episodes {i}/16" for i in range(2, 17, 2)] * 4
    assert metrics["update/samples"] > 0 and len(start_narrow) == TASKS
    # Each evaluation's own engine time (the rollout engine's counters run on: its share is a difference).
    assert len(timings) == 4
    for evaluation in timings:
        assert 0 < evaluation["time/eval_prefill_s"] and 0 < evaluation["time/eval_decode_s"]
        assert evaluation["time/eval_prefill_s"] + evaluation["time/eval_decode_s"] < evaluation["time/eval_s"]
    assert start_wide == start_narrow
    assert updated_wide == updated_narrow
    # lr 5e-2 on the tiny model changes its greedy replies: the second comparison is of new weights.
    assert updated_narrow != start_narrow


# What a change of batch shape may change in a greedy evaluation (docs/performance.md, "Batch shape and the same
# answers"): at most this share of tasks' outcomes, and the mean by at most this much.
BATCH_SHAPE_TASKS_THAT_MAY_DIFFER = 1 / 16
BATCH_SHAPE_AVG_DIFFERENCE = 1 / 16


def test_a_greedy_evaluation_gives_the_same_answers_whatever_the_batch_shape(env_url):
    """Each episode alone on a one-row engine without kept caches, against the evaluation's shape: every episode
    in flight on one wide engine (prompts prefilled together, their common opening once, next turns resumed from
    kept caches). The signal environment's first-character fallback makes every reply count."""
    import asyncio

    from common.schemas import Task
    from trainer.peers import EnvPeer
    from trainer.policy import InProcessPolicy
    from trainer.rollout import evaluate_policy
    from trainer.settings import RolloutConfig

    torch.manual_seed(0)
    model, tokenizer = load_model("tiny")
    with torch.no_grad():  # far from the base tiny model, whose replies here are blank lines (no answer at all)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    tasks = [Task(task_id=f"signal-test-{i:04d}", env_type="signal", split="test") for i in range(16)]

    async def evaluate(rows: int, prefix_cache_mb: int) -> tuple[object, object]:
        config = RolloutConfig(env="signal", max_turns=2, max_new_tokens=4, max_context=256, concurrency=rows)
        env, policy = EnvPeer(env_url), InProcessPolicy(model, tokenizer, max_batch=rows, threads=1,
                                                        prefix_cache_mb=prefix_cache_mb)
        try:
            return await evaluate_policy(tasks, env, policy.generate, tokenizer, config, k=1, greedy=True), policy.stats
        finally:
            await policy.aclose()
            await env.aclose()

    (alone, alone_stats), (batched, stats) = asyncio.run(evaluate(1, 0)), asyncio.run(evaluate(32, 64))
    # The wide engine really batched: many rows at once, second turns resumed from kept caches.
    assert alone_stats.max_rows_in_batch == 1 and stats.max_rows_in_batch > 8
    assert stats.resumed_rows > 0 and stats.prefill_batches < alone_stats.prefill_batches
    means = [{t: sum(v) / len(v) for t, v in s.per_task.items()} for s in (alone, batched)]
    differing = sum(means[0][t] != means[1][t] for t in means[0])
    assert differing <= BATCH_SHAPE_TASKS_THAT_MAY_DIFFER * len(tasks)
    assert abs(batched.avg_at_k - alone.avg_at_k) <= BATCH_SHAPE_AVG_DIFFERENCE
    assert 0 < alone.avg_at_k < 1  # outcomes that differ between tasks: the comparison can fail
