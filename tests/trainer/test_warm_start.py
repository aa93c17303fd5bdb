"""`trainer.warm_start`: fine-tuning on solved tasks before RL, in the rollout template's token layout.

The loss mask is checked token by token against the chat template's own rendering of the whole exchange.
Over real services (env service, task manager with a pool share, a synthesize job): the warm start's data
holds only trainable synthetic tasks (none of the pool's share, none withheld, none grown from or belonging
to a held-out split, though such tasks are planted in the store), and a real run of the tiny model through
the trainer trains on them and reports the loss curve and token counts in its summary; `source:
environment` trains on the environment's own train references, which the env service refuses for a
held-out task.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import httpx
import pytest

from common.schemas import Task
from engine.models import load_model
from task_manager.models import Call, Reference, StoredTask
from task_manager.seeding import split_for_pool
from task_manager.store import TaskStore
from tests.helpers import ServiceProcess, run_service
from tests.task_manager.conftest import flights_env, write_conf  # noqa: F401 (a fixture)
from trainer.config import TrainerConfig
from trainer.local import LocalTrainer
from trainer.settings import RolloutConfig
from trainer.warm_start import SolvedTask, render

OPENING = [{"role": "system", "content": "You are an airline desk."},
           {"role": "user", "content": "How much travel credit does Ann Lee have?"}]
CALL = '<tool_call>{"name": "get_passenger", "arguments": {"name": "Ann Lee"}}</tool_call>'


def test_the_loss_covers_exactly_the_actions_in_the_chat_templates_layout():
    _, tokenizer = load_model("tiny")
    task = SolvedTask("t", OPENING, [(CALL, '{"passenger_id": "P1001", "travel_credit": 800}'),
                                     ("The answer is 800.", None)])
    [segment] = render(task, tokenizer, RolloutConfig(env="flights"))
    whole = OPENING + [{"role": "assistant", "content": CALL},
                       {"role": "user", "content": '{"passenger_id": "P1001", "travel_credit": 800}'},
                       {"role": "assistant", "content": "The answer is 800."}]
    expected = tokenizer.encode(tokenizer.apply_chat_template(whole, tokenize=False), add_special_tokens=False)
    assert segment.prompt_ids + segment.response_ids == expected
    # Mask 1 on each action's tokens and the end-of-turn token after it (what a generation ends with), else 0.
    eos = tokenizer.eos_token_id
    trained = [tokenizer.encode(CALL, add_special_tokens=False) + [eos],
               tokenizer.encode("The answer is 800.", add_special_tokens=False) + [eos]]
    runs, current = [], []
    for token, mask in zip(segment.response_ids, segment.loss_mask, strict=True):
        if mask:
            current.append(token)
        elif current:
            runs, current = runs + [current], []
    runs += [current] if current else []
    assert runs == trained
    assert sum(segment.loss_mask) == sum(map(len, trained)) < len(expected)
    prompt = tokenizer.encode(tokenizer.apply_chat_template(OPENING, tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)
    assert segment.prompt_ids == prompt  # the rollout's prompt: the opening and the generation prompt


def test_the_loss_is_the_cross_entropy_of_the_action_tokens_only():
    """The loss from the kept logits equals the cross-entropy computed from every position's logits."""
    import torch

    from trainer.warm_start import _summed_loss

    model, tokenizer = load_model("tiny")
    task = SolvedTask("t", OPENING, [(CALL, '{"passenger_id": "P1001", "travel_credit": 800}'),
                                     ("The answer is 800.", None)])
    [segment] = render(task, tokenizer, RolloutConfig(env="flights"))
    ids = segment.prompt_ids + segment.response_ids
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
        start = len(segment.prompt_ids)
        by_hand = -sum(float(log_probs[start + j - 1, token])
                       for j, (token, mask) in enumerate(zip(segment.response_ids, segment.loss_mask, strict=True))
                       if mask)
        assert float(_summed_loss(model, segment, torch.device("cpu"))) == pytest.approx(by_hand, rel=1e-5)


def _solved(name: str, credit: int, extra_steps: int) -> SolvedTask:
    """A solved task opening like every other (the system prompt), with `extra_steps` more lookups."""
    opening = [OPENING[0], {"role": "user", "content": f"How much travel credit does {name} have?"}]
    call = CALL.replace("Ann Lee", name)
    steps = [(call, f'{{"passenger_id": "P1{credit}", "travel_credit": {credit}}}')] * (1 + extra_steps)
    return SolvedTask(name, opening, steps + [(f"The answer is {credit}.", None)])


def test_a_batch_computes_its_common_opening_once_with_the_same_gradient():
    """The opening once per batch (every group continuing its cache, a lone long row too) and one forward per
    sample give one gradient and one loss."""
    import torch

    from trainer.warm_start import _summed_loss, batch_backward, opening_groups, tokens_computed

    model, tokenizer = load_model("tiny")
    rollout = RolloutConfig(env="flights")
    names = (("Ann Lee", 800), ("Bo Chen", 120), ("Cy Diaz", 45), ("Di Wu", 9))

    def gradient(batch: list, grouped: bool, compute: torch.dtype = torch.float32) -> tuple[torch.Tensor, float]:
        trained = sum(sum(s.loss_mask) for s in batch)
        model.zero_grad(set_to_none=True)
        if grouped:
            loss = batch_backward(model, batch, torch.device("cpu"), trained, compute)
        else:
            loss = 0.0
            for sample in batch:
                alone = _summed_loss(model, sample, torch.device("cpu")) / trained
                alone.backward()
                loss += float(alone.detach())
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), loss

    def same(batch: list) -> None:
        (grouped, grouped_loss), (alone, alone_loss) = gradient(batch, True), gradient(batch, False)
        assert torch.allclose(grouped, alone, rtol=1e-4, atol=1e-7)
        assert grouped_loss == pytest.approx(alone_loss, rel=1e-5)

    def length(sample) -> int:
        return len(sample.prompt_ids) + len(sample.response_ids)

    opening = len(tokenizer.encode(tokenizer.apply_chat_template(OPENING[:1], tokenize=False),
                                   add_special_tokens=False))
    # Rows of about one length: one group, its opening (the system turn and the user turn's header) run once.
    alike = [render(_solved(n, c, 0), tokenizer, rollout)[0] for n, c in names]
    shared, [group] = opening_groups(alike, budget=4096)
    assert len(group) == 4 and shared >= opening
    same(alike)
    # A budget of two rows' padded tokens cuts them in pairs, each within it.
    budget = shared + 2 * max(length(s) - shared for s in alike)
    _, pairs = opening_groups(alike, budget=budget)
    assert [len(g) for g in pairs] == [2, 2]
    assert all(shared + len(g) * (max(map(length, g)) - shared) <= budget for g in pairs)
    # Rows of other lengths: a long row continues the opening alone; fewer tokens than every sample alone.
    mixed = [render(_solved(n, c, x), tokenizer, rollout)[0] for (n, c), x in zip(names, (0, 6, 0, 1), strict=True)]
    shared, groups = opening_groups(mixed, budget=shared + 2 * max(length(s) - shared for s in alike))
    assert shared >= opening and sorted(map(id, (s for g in groups for s in g))) == sorted(map(id, mixed))
    assert [len(g) for g in groups][-1] == 1 and groups[-1][0] is max(mixed, key=length)
    assert tokens_computed(shared, groups) < sum(map(length, mixed)) - (len(groups) - 1) * shared
    same(mixed)
    # bf16 autocast (warm_start.dtype): the same gradient's direction and loss, to bf16 rounding.
    (half, half_loss), (full, full_loss) = gradient(mixed, True, torch.bfloat16), gradient(mixed, True)
    assert float(torch.nn.functional.cosine_similarity(half, full, dim=0)) > 0.99
    assert half_loss == pytest.approx(full_loss, rel=0.02) and not torch.equal(half, full)
    # No common opening worth sharing (other system prompts): one forward per sample.
    other = render(SolvedTask("o", [{"role": "system", "content": "Different."}, OPENING[1]], [(CALL, None)]),
                   tokenizer, rollout)[0]
    assert opening_groups([alike[0], other]) == (0, [[alike[0]], [other]])
    same([alike[0], other])


def test_fine_tuning_trains_then_keeps_no_gradient_or_optimizer_state():
    """The weights move, and nothing of the optimizer stays behind: the actor evaluates next, beside it."""
    import gc

    import torch

    from trainer.settings import WarmStartConfig
    from trainer.warm_start import fine_tune

    model, tokenizer = load_model("tiny")
    samples = [render(_solved(n, c, 0), tokenizer, RolloutConfig(env="flights"))[0]
               for n, c in (("Ann Lee", 800), ("Bo Chen", 120))]
    before = [p.detach().clone() for p in model.parameters()]
    fine_tune(model, samples, WarmStartConfig(enabled=True, epochs=1, batch_size=2, lr=1e-3), torch.device("cpu"), 0)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())
    gc.collect()
    optimizers = [o for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer)
                  and any(p is q for g in o.param_groups for p in g["params"] for q in model.parameters())]
    assert all(not o.state for o in optimizers)


def _plant_held_out(store_dir: Path) -> list[str]:
    """Synthetic tasks that must never be trained on: one grown from a validation task, one in the test split."""
    store = TaskStore(store_dir / "tasks.sqlite")
    planted = []
    for task_id, split, seed in (("syn-heldout-seed0001", "train", "validation-0000"),
                                 ("syn-heldout-split001", "test", "train-0000")):
        call = Call(name="get_passenger", arguments={"passenger_id": "P1001"})
        task = Task(task_id=task_id, env_type="flights", split=split, synthetic=True, seed_task_id=seed,
                    query="How much travel credit does passenger P1001 have?",
                    metadata={"kind": "lookup", "lookup": "credit_lookup", "synthesizer": "lookup"})
        store.add_task(StoredTask(task=task, reference=Reference(actions=[call.render(), "The answer is 800."],
                                                                      calls=[call], answer="800"),
                                  signature=f"sig-{task_id}", synthesizer="lookup"), goal_key=f"goal-{task_id}")
        planted.append(task_id)
    store.close()
    return planted


def _config(out: Path, env_url: str, task_url: str | None, warm_start: dict, **overrides: object) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "model": "tiny", "seed": 3, "steps": 1, "tasks_per_step": 1, "output_dir": str(out), "torch_threads": 1,
        "progress": False, "tensorboard": False, "plot": False,
        "rollout": {"env": "flights", "n": 2, "max_turns": 1, "max_new_tokens": 4, "max_context": 4096},
        "optim": {"lr": 1e-4, "minibatches": 1, "micro_batch_size": 2},
        "services": {"env_url": env_url, "task_url": task_url},
        "eval": {"before": False, "after": False}, "ray": {"enabled": False},
        "warm_start": {"enabled": True, "epochs": 2, "batch_size": 4, "lr": 1e-3, **warm_start}, **overrides})


def test_a_warm_start_trains_only_on_trainable_synthetic_tasks(flights_env: ServiceProcess,  # noqa: F811
                                                               tmp_path: Path) -> None:
    store_dir = tmp_path / "tm"
    planted = _plant_held_out(store_dir)
    conf = write_conf(tmp_path / "tm.yaml", flights_env.url, store_dir, dedup={"embeddings": False},
                      synthesis={"kinds": ["lookup"], "query_forms": ["names"]},
                      mixture={"synthetic_ratio": 1.0, "use_original": False, "pool_share": 0.3},
                      curriculum={"enabled": False}, serve_training_references=True)
    with run_service("task_manager", ["--conf", str(conf)]) as tm:
        async def synthesize() -> None:
            from task_manager.client import TaskClient

            async with TaskClient(tm.url) as tasks:
                job = await tasks.wait_job((await tasks.submit_job("flights", episodes=6)).job_id, timeout=120)
                assert job.status == "done" and job.progress["kept"] > 0, job

        asyncio.run(synthesize())
        result = asyncio.run(LocalTrainer(_config(tmp_path / "run", flights_env.url, tm.url, {})).run())

    split = split_for_pool(TaskStore(store_dir / "tasks.sqlite").tasks(synthetic=True), 0.3)  # as the service does
    report = result["warm_start"]
    data = set(report["task_ids"])
    assert split.pool and data, (split, report)  # the pool's share is not empty: the exclusion is exercised
    assert data <= split.training and not data & (split.pool | split.withheld | set(planted))
    served = report["source_report"]
    assert served["pool_held"] == len(split.pool) and served["withheld"] == len(split.withheld)
    # The planted tasks are training tasks by the pool split, so only the held-out check keeps them out.
    assert set(planted) <= split.training and served["refused"] >= len(planted)
    assert report["tasks"] == served["replayed"] == served["trainable"] == len(data)
    # The loss curve: one loss per optimizer step, epochs x batches; the tiny model learns its data.
    assert report["steps"] == len(report["loss_curve"]) == 2 * math.ceil(report["samples"] / 4)
    assert len(report["epoch_loss"]) == 2 and report["epoch_loss"][1] < report["epoch_loss"][0]
    assert 0 < report["assistant_tokens"] < report["tokens"]
    assert result["steps"] == 1  # then RL ran from the warm-started weights
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["warm_start"]["loss_curve"] == report["loss_curve"]


def test_a_warm_start_from_the_environments_train_references(flights_env: ServiceProcess,  # noqa: F811
                                                             tmp_path: Path) -> None:
    with httpx.Client(base_url=flights_env.url, timeout=30) as http:
        refused = http.get("/v1/environments/flights/tasks/validation-0000/reference")
        assert refused.status_code == 403 and "validation" in refused.json()["error"]["message"]
        episode = http.get("/v1/environments/flights/tasks/train-0000/reference").json()["messages"]
    assert [m["role"] for m in episode[:3]] == ["system", "user", "assistant"] and episode[-1]["role"] == "assistant"
    # Evaluated before, right after the warm start (eval.before on: after_warm_start follows it) and after RL.
    run = tmp_path / "run"
    config = _config(run, flights_env.url, None, {"source": "environment", "max_tasks": 3, "epochs": 1},
                     eval={"split": "validation", "tasks": 2, "k": 1}, checkpoint={"every": 1, "keep": 2})
    assert config.evaluates_after_warm_start
    result = asyncio.run(LocalTrainer(config).run())
    report = result["warm_start"]
    assert report["task_ids"] == ["train-0000", "train-0001", "train-0002"] and report["steps"] == 1
    assert report["source_report"]["train_tasks"] > 3 and 0 < report["assistant_tokens"] < report["tokens"]
    [avg] = [row for row in result["eval"]["rows"] if row["metric"] == "avg@1"]
    assert {"before", "warm_start", "after", "delta_warm_start", "delta_rl", "delta"} <= set(avg)
    assert all(avg[key]["n"] == 2 for key in ("delta_warm_start", "delta_rl", "delta"))
    assert set(json.loads((run / "summary.json").read_text())["eval"]["per_task"]) == {"before", "warm_start", "after"}

    # Killed after the step-0 checkpoint: the resumed run neither fine-tunes nor evaluates again before step 1.
    def step0_evaluations() -> int:
        return sum(1 for line in (run / "metrics.jsonl").read_text().splitlines()
                   if json.loads(line)["step"] == 0 and "eval/avg@1" in json.loads(line))

    assert step0_evaluations() == 2
    (run / "checkpoints" / "step_000001.pt").unlink()
    resumed = asyncio.run(LocalTrainer(config.model_copy(update={"resume": True})).run())
    assert step0_evaluations() == 2 and resumed["warm_start"] == report and resumed["steps"] == 1
    assert resumed["eval"]["per_task"]["warm_start"] == result["eval"]["per_task"]["warm_start"]


def test_a_shared_warm_start_is_only_a_warm_started_step_0_checkpoint_with_its_weights(tmp_path: Path) -> None:
    import pytest
    import torch

    from trainer.warm_start import shared_warm_start, weights_digest

    weights = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5], dtype=torch.bfloat16)}
    assert weights_digest(weights) == weights_digest({k: v.clone() for k, v in reversed(weights.items())})
    assert weights_digest(weights) != weights_digest({**weights, "w": torch.tensor([1.0, 2.5])})
    path = tmp_path / "step_000000.pt"
    torch.save({"step": 0, "model": weights, "warm_start": {"tasks": 3, "weights_sha256": weights_digest(weights)}}, path)
    loaded, report = shared_warm_start(str(path))
    assert report["tasks"] == 3 and torch.equal(loaded["w"], weights["w"])
    torch.save({"step": 2, "model": weights, "warm_start": {"tasks": 3}}, path)  # RL already moved these weights
    with pytest.raises(ValueError, match="not a warm-started run's step-0 checkpoint"):
        shared_warm_start(str(path))
    torch.save({"step": 0, "model": weights, "warm_start": None}, path)
    with pytest.raises(ValueError, match="warm start absent"):
        shared_warm_start(str(path))
    torch.save({"step": 0, "model": {**weights, "w": torch.tensor([9.0, 9.0])},
                "warm_start": {"weights_sha256": weights_digest(weights)}}, path)
    with pytest.raises(ValueError, match="differ from the warm start's digest"):
        shared_warm_start(str(path))


def test_the_evaluation_after_the_warm_start_follows_eval_before_unless_set(tmp_path: Path) -> None:
    config = _config(tmp_path, "http://127.0.0.1:1", None, {"source": "environment"}).model_dump()

    def evaluates(eval_settings: dict, warm: bool = True) -> bool:
        merged = {**config, "eval": {**config["eval"], **eval_settings}, "warm_start": {**config["warm_start"], "enabled": warm}}
        return TrainerConfig.model_validate(merged).evaluates_after_warm_start

    assert evaluates({"before": True}) and not evaluates({"before": False})
    assert evaluates({"before": False, "after_warm_start": True}) and not evaluates({"after_warm_start": False})
    assert not evaluates({"before": True}, warm=False)  # no warm start, nothing to evaluate after
    with pytest.raises(ValueError, match="eval.after_warm_start: true evaluates after the warm start, which is off"):
        evaluates({"after_warm_start": True}, warm=False)


def test_zero_rl_steps_only_with_a_warm_start(tmp_path: Path) -> None:
    import pytest

    config = _config(tmp_path, "http://127.0.0.1:1", None, {"source": "environment"}).model_dump()
    assert TrainerConfig.model_validate({**config, "steps": 0}).steps == 0
    with pytest.raises(ValueError, match="steps: 0 trains nothing"):
        TrainerConfig.model_validate({**config, "steps": 0, "warm_start": {"enabled": False}})
