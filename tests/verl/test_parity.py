"""The same step through both backends: the local trainer and veRL's path give the same service calls and
the same advantages, with all three mechanisms on.

Real services over HTTP on 127.0.0.1: env_service (flights), the task manager (a short synthesis job first,
so batches mix original and synthetic tasks), the experience manager (Qdrant local mode, one seeded
experience per workspace; heuristic summaries) and the judge (behind a stand-in of a hosted LLM: a step is
GOOD when its action says "useful"). The policy is scripted in both paths, a stand-in for vLLM (veRL) and
for the in-process engine (local): it says "useful" when injected experience is in its context, else "hi",
so flagged and plain rollouts differ and ADCA-GRPO's advantages are not all zero.

- local: `LocalTrainer.train_step` itself (the tiny model does the update; the policy is the script);
- veRL: `EvolverTaskDataset` (the batch from the task manager), `EvolverEnvAgentLoop` (an `AgentLoopBase`)
  per session, a `DataProto` of its outputs, then `evolver_sync`'s step hooks: `evolver_advantage` (the judge
  once per batch, our estimator) and `evolver_after_step` (summaries, usage feedback, pass rates). The actor
  update cannot run on CPU.
Each path has its own experience workspace, seeded alike, so neither sees what the other wrote.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

pytest.importorskip("verl", reason="veRL is installed by the `verl` extra")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import trainer.verl_plugin  # noqa: E402,F401
from common import http  # noqa: E402
from experience_manager.client import ExperienceClient  # noqa: E402
from task_manager.client import TaskClient  # noqa: E402
from tests.helpers import run_service  # noqa: E402
from tests.judge.fake_judge_llm import fake_judge_llm  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.local import LocalTrainer  # noqa: E402
from trainer.policy import Generation  # noqa: E402
from trainer.templates import EXP_OPEN  # noqa: E402
from trainer.verl_plugin.agent_loop import EvolverEnvAgentLoop, task_from_row  # noqa: E402
from trainer.verl_plugin.dataset import EvolverTaskDataset  # noqa: E402
from trainer.verl_plugin.settings import TASK_MANAGER_FILES  # noqa: E402
from trainer.verl_plugin.trainer import EvolverPPOTrainer  # noqa: E402

pytestmark = pytest.mark.slow

WORKSPACES = {"local": "parity-local", "verl": "parity-verl"}
SEED, TASKS, N = 3, 2, 2
ROLLOUT = {"env": "flights", "n": N, "max_turns": 2, "max_new_tokens": 4, "max_context": 4096,
           "experience_ratio": 0.5}
ADVANTAGE = {"estimator": "adca_grpo", "adca_grpo": {"alpha": 0.5}}


def started_together(stack: ExitStack, *services):
    """Enter several `run_service` contexts at once (each waits for its /healthz): start-up is mostly
    imports, so starting them side by side saves most of a minute."""
    with ThreadPoolExecutor(len(services)) as pool:
        return list(pool.map(stack.enter_context, services))


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    (root / "env.yaml").write_text(yaml.safe_dump({"env_service": {"environments": {"flights": {}}}}))
    with ExitStack() as stack:
        llm_url, _ = stack.enter_context(fake_judge_llm())
        (root / "judge.yaml").write_text(json.dumps({"judge": {
            "llm": {"base_url": llm_url, "model": "fake", "max_retries": 0}, "audit_log": str(root / "audit.jsonl")}}))
        env, em, judge = started_together(
            stack, run_service("env_service", ["--conf", str(root / "env.yaml")]),
            run_service("experience_manager", ["--store", str(root / "experience")]),
            run_service("judge", ["--conf", str(root / "judge.yaml")]))
        (root / "tm.yaml").write_text(yaml.safe_dump({"task_manager": {
            "env_url": env.url, "store_dir": str(root / "tasks"), "environments": ["flights"],
            "mixture": {"synthetic_ratio": 0.5}}}))
        tm = stack.enter_context(run_service("task_manager", ["--conf", str(root / "tm.yaml")]))
        asyncio.run(_prepare(tm.url, em.url))
        yield {"env": env.url, "tasks": tm.url, "experience": em.url, "judge": judge.url}


async def _prepare(task_url: str, experience_url: str) -> None:
    async with TaskClient(task_url) as tasks:
        # A short exploration: a few synthetic tasks are all the step needs.
        job = await tasks.submit_job("flights", episodes=4, seed=0)
        info = await tasks.wait_job(job.job_id, timeout=300)
        assert info.status == "done" and info.progress["kept"] > 0, info
    async with ExperienceClient(experience_url) as pool:
        for workspace in WORKSPACES.values():
            await pool.create_workspace(workspace)
            await pool.create_experience(
                workspace, "When asked to book, cancel or change a flight ticket for a passenger",
                "Search the flights of the route and date first, then act on the matching flight id.")


class ScriptedPolicy:
    """The policy of both paths: "useful" with experience in context, else "hi" (then end of turn)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.policy_version = 0

    def reply(self, prompt_ids: list[int]) -> list[int]:
        word = "useful" if EXP_OPEN in self.tokenizer.decode(prompt_ids) else "hi"
        return self.tokenizer.encode(word, add_special_tokens=False) + [self.tokenizer.eos_token_id]

    async def generate(self, prompt_ids, sampling) -> Generation:  # the local trainer's engine
        ids = self.reply(list(prompt_ids))
        return Generation(ids, [-0.25] * len(ids), self.tokenizer.decode(ids, skip_special_tokens=True), "stop",
                          self.policy_version)

    async def load_weights(self, model) -> int:
        return self.policy_version

    async def aclose(self) -> None:
        return None


class ScriptedServerManager:
    """veRL's `server_manager` (vLLM behind it on a GPU), answering with the same script."""

    def __init__(self, policy: ScriptedPolicy) -> None:
        self.policy = policy

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        ids = self.policy.reply(list(prompt_ids))
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids))


class CallLog:
    """Every call our typed clients make (they all go through `ServiceClient.request`), as
    (service, method, path with ids and workspace names replaced by *)."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.names = {url: name for name, url in urls.items()}
        self.calls: list[tuple[str, str, str]] = []

    def normalise(self, path: str) -> str:
        parts = [p if p == "v1" or not (re.search(r"\d", p) or p in WORKSPACES.values()) else "*"
                 for p in path.split("/")]
        return "/".join(parts)

    def install(self, monkeypatch) -> None:
        original = http.ServiceClient.request
        log = self

        async def request(client, method, path, **kwargs):
            log.calls.append((log.names.get(client.base_url, client.base_url), method.upper(), log.normalise(path)))
            return await original(client, method, path, **kwargs)

        monkeypatch.setattr(http.ServiceClient, "request", request)

    def take(self) -> Counter:
        calls, self.calls = Counter(self.calls), []
        return calls


def run_local(services, out):
    """The local trainer set up for one step: (trainer, the samples its update gets, the call log, the step)."""
    config = TrainerConfig.model_validate({
        "model": "tiny", "seed": SEED, "steps": 1, "tasks_per_step": TASKS, "output_dir": str(out),
        "torch_threads": 1, "progress": False, "tensorboard": False, "plot": False, "rollout": ROLLOUT,
        "optim": {"lr": 1e-4, "minibatches": 1, "micro_batch_size": 4}, "advantage": ADVANTAGE,
        "services": {"env_url": services["env"], "task_url": services["tasks"],
                     "experience_url": services["experience"], "judge_url": services["judge"]},
        "experience": {"workspace": WORKSPACES["local"], "summarize_mode": "heuristic"},
        "tasks": {"synthetic_ratio": 0.5},
        "eval": {"before": False, "after": False, "tasks": 1}, "ray": {"enabled": False},
    })
    trainer = LocalTrainer(config)
    samples: list = []

    async def step() -> None:
        await trainer.setup()
        trainer.policy = ScriptedPolicy(trainer.tokenizer)
        update = trainer.updater.update
        trainer.updater.update = lambda batch, **kw: (samples.extend(batch), update(batch, **kw))[1]  # observe, then update
        log.take()  # setup's calls (task ids of the splits, the workspace) are not the step's
        try:
            await trainer.train_step()
        finally:
            await trainer.close()

    log = CallLog(services)
    return trainer, samples, log, step


def verl_config(services):
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"n": N, "prompt_length": 4096, "response_length": 512}},
        "data": {"apply_chat_template_kwargs": {}, "evolver": {
            "env": "flights", "batch_size": TASKS, "steps": 1, "seed": SEED, "task_url": services["tasks"],
            "synthetic_ratio": 0.5}},
        "algorithm": {"adv_estimator": "evolver_adca_grpo", "use_kl_in_reward": False, "kl_penalty": "kl",
                      "rollout_correction": None, "evolver": ADVANTAGE},
        "evolver": {
            "env_url": services["env"], "rollout": ROLLOUT, "estimator": "adca_grpo", "seed": SEED,
            "tasks_per_step": TASKS, "judge_url": services["judge"], "run_id": "parity",
            "experience": {"url": services["experience"], "workspace": WORKSPACES["verl"],
                           "summarize_mode": "heuristic"},
            "tasks": {"url": services["tasks"], "synthetic_ratio": 0.5},
        },
    })


async def verl_rollouts(config, rows, tokenizer, policy):
    """veRL's rollout worker, in short: each prompt gets a uid and N sessions, all run concurrently."""
    server = ScriptedServerManager(policy)

    async def session(row, uid: str, session_id: int):
        loop = EvolverEnvAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server,
                                   tokenizer=tokenizer, processor=None, dataset_cls=EvolverTaskDataset,
                                   data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
        return await loop.run({"temperature": 1.0, "top_p": 1.0}, **row, uid=uid, session_id=session_id)

    results = await asyncio.gather(*(session(row, f"uid-{i}", s) for i, row in enumerate(rows) for s in range(N)))
    return [out for outputs in results for out in outputs]


def to_data_proto(outputs, uids: list[str]) -> tuple[DataProto, list[dict]]:
    """The agent loop's outputs as the batch veRL's trainer hands its advantage step."""
    width = max(len(o.response_ids) for o in outputs)
    mask = torch.zeros((len(outputs), width), dtype=torch.int64)
    scores = torch.zeros((len(outputs), width))
    for row, out in enumerate(outputs):
        n = len(out.response_ids)
        mask[row, :n] = torch.tensor(out.response_mask)
        scores[row, n - 1] = out.reward_score  # veRL's rm_scores: the reward on the last response token
    data = DataProto.from_dict(tensors={"response_mask": mask, "rm_scores": scores},
                               non_tensors={"uid": np.array(uids, dtype=object)})
    return data, [dict(o.extra_fields) for o in outputs]


def test_local_and_verl_paths_make_the_same_calls_and_advantages(services, tmp_path, monkeypatch):
    local, samples, log, local_step = run_local(services, tmp_path / "local")
    log.install(monkeypatch)

    # veRL, part 1: the step's batch from the task manager, before the local step's feedback moves the curriculum.
    config = verl_config(services)
    dataset = EvolverTaskDataset(TASK_MANAGER_FILES, config=config.data)
    rows = [dataset[i] for i in range(TASKS)]
    verl_tasks = [task_from_row(r) for r in rows]
    verl_sampling = log.take()

    asyncio.run(local_step())
    local_calls = log.take()
    local_tasks = [json.loads(line) for line in (tmp_path / "local" / "batches.jsonl").read_text().splitlines()]
    assert local_tasks[0]["task_ids"] == [t.task_id for t in verl_tasks]  # the same batch, by the same seed
    assert any(t.synthetic for t in verl_tasks), "self-questioning: the batch has synthetic tasks"

    # veRL, part 2: rollouts through the agent loop, then evolver_sync's hooks.
    tokenizer = local.tokenizer
    trainer = object.__new__(EvolverPPOTrainer)  # the step hooks only: no workers, no GPUs
    trainer.config = config
    trainer.global_steps = 1
    mechanisms = trainer.evolver_mechanisms()
    log.take()  # creating the workspace is set-up, as in the local trainer
    outputs = asyncio.run(verl_rollouts(config, rows, tokenizer, ScriptedPolicy(tokenizer)))
    data, extras = to_data_proto(outputs, [f"uid-{i}" for i in range(TASKS) for _ in range(N)])
    metrics: dict = {}
    data, _ = trainer.evolver_advantage(data, extras, metrics)
    trainer.evolver_after_step()
    verl_calls = verl_sampling + log.take()
    mechanisms.close()

    # The same service calls, call for call.
    assert verl_calls == local_calls, (sorted(local_calls.items()), sorted(verl_calls.items()))
    assert local_calls[("judge", "POST", "/v1/judge")] == 1  # the judge once per batch
    assert local_calls[("tasks", "POST", "/v1/batches")] == 1
    assert local_calls[("tasks", "POST", "/v1/feedback")] == 1  # pass rates back to the curriculum
    assert local_calls[("experience", "POST", "/v1/workspaces/*/retrieve")] == TASKS  # one retrieval per group
    assert local_calls[("experience", "POST", "/v1/workspaces/*/summarize")] == 1  # the pool is written
    synthetic = sum(t.synthetic for t in verl_tasks)
    assert local_calls[("tasks", "POST", "/v1/grade")] == synthetic * N

    # What each mechanism did, by the counters of each path.
    assert mechanisms.mechanisms.judge.counters.batches == 1 == local.mechanisms.judge.counters.batches
    navigating = mechanisms.mechanisms.experience.counters
    assert navigating.summarized_trajectories == TASKS * N
    assert navigating.injected_rollouts == local.mechanisms.experience.counters.injected_rollouts == TASKS
    assert navigating.feedback_items == local.mechanisms.experience.counters.feedback_items

    # The same advantages, token for token (rows in the same task and session order).
    assert len(samples) == len(outputs) == TASKS * N
    verl_adv = data.batch["advantages"]
    for row, (sample, out) in enumerate(zip(samples, outputs, strict=True)):
        assert sample.response_ids == out.response_ids and sample.prompt_ids == out.prompt_ids
        assert sample.experience_flag == out.extra_fields["experience_flag"]
        assert verl_adv[row, :len(sample.advantages)].tolist() == pytest.approx(sample.advantages, abs=1e-6)
    assert any(abs(a) > 1e-3 for s in samples for a in s.advantages), "advantages must carry a signal"
