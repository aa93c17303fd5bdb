"""`python -m trainer.evaluate`: held-out avg@k, best@k and invalid-action rate of any policy.

The policy is one of:
- `--checkpoint PATH`: a trainer checkpoint (`step_N.pt`, or a run's `checkpoints/` folder for its
  latest); the model spec comes from the checkpoint's config unless `--model` is given;
- `--model SPEC`: `tiny`, `smollm2` or an exported HF directory (what `export_dir` writes);
- `--endpoint URL`: an OpenAI-compatible server. With token ids (llm_server, vLLM) the episode runs
  through the same context template as training (`--tokenizer` names the model whose tokenizer
  renders the context, default `--model` or smollm2); `--chat` instead sends chat messages to
  `/v1/chat/completions`, for hosted APIs without token ids (evaluation only).

    python -m trainer.evaluate --env-url http://127.0.0.1:8080 --env signal --model runs/x/export \\
        --split test --tasks 64 --k 4 --sample

`--asks action|step` evaluates a second time with the policy's asks of the experience pool (or a search before
every turn) on, against `--experience-url` / `--workspace`, and reports it under `with_asks` beside the plain
numbers. The pool must hold train-split content only: it is refused when an experience was distilled from any
task of the evaluated split (seed it from train references, e.g. the task manager's verified train tasks).

Prints rich tables and, last, one JSON line; `--out FILE` writes the same JSON with per-task scores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from loguru import logger

from common.llm import LLMClient, LLMRoleConfig
from common.schemas import ChatMessage, Step, Task
from engine.models import ModelLoadError
from trainer.asks import ask_policy, refuse_held_out
from trainer.config import ExperienceConfig
from trainer.peers import EnvPeer, ExperiencePeer
from trainer.rollout import (
    EpisodeResult,
    EvalSummary,
    RolloutConfig,
    environment_error,
    evaluate_policy,
    evaluation_progress,
    is_invalid_action,
    made_tool_call,
    summarize_episodes,
)
from trainer.summary import interval, per_task_values


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--env-url", required=True, help="the environment service base URL")
    parser.add_argument("--env", required=True, help="environment name on the service")
    parser.add_argument("--split", default="validation", choices=["train", "validation", "test"])
    parser.add_argument("--tasks", type=int, default=64, help="the first N task ids of the split (0: all)")
    parser.add_argument("--k", type=int, default=1, help="samples per task (avg@k, best@k)")
    parser.add_argument("--sample", action="store_true", help="sample at --temperature (default: greedy)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    policy = parser.add_mutually_exclusive_group()
    policy.add_argument("--checkpoint", help="a trainer checkpoint file, or a checkpoints/ folder (latest)")
    policy.add_argument("--endpoint", help="an OpenAI-compatible base URL (without /v1)")
    parser.add_argument("--model", help="tiny, smollm2 or an HF directory (the policy, or the checkpoint's base)")
    parser.add_argument("--served-model", default=None, help="the `model` name sent to --endpoint")
    parser.add_argument("--tokenizer", default=None, help="with --endpoint: model spec whose tokenizer to use")
    parser.add_argument("--chat", action="store_true", help="with --endpoint: chat messages, no token ids")
    parser.add_argument("--api-key-env", default=None, help="with --endpoint: variable holding the API key")
    parser.add_argument("--template", default="linear",
                        choices=["linear", "linear_think", "sliding_window", "self_managed"])
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight at once")
    parser.add_argument("--max-batch", type=int, default=32,
                        help="in-process policy: rows its engine generates together (give --concurrency as many)")
    parser.add_argument("--prefix-cache-mb", type=int, default=1024,
                        help="in-process policy: MiB of caches kept for an episode's next turn (0: off)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the in-process policy")
    parser.add_argument("--out", default=None, help="write the JSON result (with per-task scores) here")
    parser.add_argument("--asks", choices=["action", "step"], default=None,
                        help="also evaluate with asks of the experience pool on (reported under with_asks)")
    parser.add_argument("--experience-url", default=None, help="with --asks: the experience manager")
    parser.add_argument("--workspace", default="default", help="with --asks: its workspace (train content only)")
    parser.add_argument("--ask-budget", type=int, default=2, help="with --asks action: asks per episode")
    parser.add_argument("--ask-format", choices=["auto", "tool", "tag"], default="auto")
    args = parser.parse_args(argv)
    if args.asks and not args.experience_url:
        parser.error("--asks needs --experience-url (and --workspace): the pool the policy asks")
    if args.asks and args.chat:
        parser.error("--asks runs through the context template: it needs token ids, not --chat")
    if args.checkpoint is None and args.endpoint is None and args.model is None:
        parser.error("give the policy: --checkpoint, --model or --endpoint")
    if args.chat and not args.endpoint:
        parser.error("--chat needs --endpoint")
    return args


def load_checkpoint_model(path: str | Path, model_spec: str | None = None) -> tuple[Any, Any, int]:
    """(model, tokenizer, step) from a trainer checkpoint file or folder."""
    from engine.models import load_model
    from trainer.checkpoint import latest_checkpoint, load_checkpoint

    path = Path(path)
    if path.is_dir():
        found = latest_checkpoint(path) or latest_checkpoint(path / "checkpoints")
        if found is None:
            raise FileNotFoundError(f"no step_*.pt checkpoint in {path}")
        path = found
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    state = load_checkpoint(path)
    spec = model_spec or state.get("config", {}).get("model")
    if not spec:
        raise ValueError(f"checkpoint {path} names no model; pass --model")
    model, tokenizer = load_model(spec)
    model.load_state_dict(state["model"])
    model.eval()
    return model, tokenizer, int(state["step"])


async def _chat_episode(task: Task, env: EnvPeer, llm: LLMClient, config: RolloutConfig, *, temperature: float,
                        seed: int) -> EpisodeResult:
    """One episode over chat messages (no token ids)."""
    created = await env.create(config.env, task)
    try:
        messages = [{"role": m.role, "content": m.text()} for m in
                    (ChatMessage.model_validate(m) if not isinstance(m, ChatMessage) else m for m in created.messages)]
        steps = invalid = 0
        action = ""
        called = failed = False
        for turn in range(config.max_turns):
            reply = await llm.chat(messages, max_tokens=config.max_new_tokens, temperature=temperature,
                                   seed=seed * 1000 + turn)
            action = reply.text
            result = await env.step(created.instance_id, action)
            steps += 1
            invalid += int(is_invalid_action(result.info))
            failed = environment_error(result.info) is not None
            called = called or made_tool_call([Step(index=turn, action=ChatMessage(role="assistant", content=action),
                                                    observation=result.observation, info=result.info)])
            messages += [{"role": "assistant", "content": action},
                         {"role": "user", "content": result.observation.text()}]
            if result.done:
                break
        outcome = float((await env.evaluate(created.instance_id, config.evaluate_params)).score)
        return EpisodeResult(task.task_id, outcome, steps, invalid, action, called, environment_error=failed)
    finally:
        await env.release(created.instance_id)


async def evaluate_chat(tasks: list[Task], env: EnvPeer, llm: LLMClient, config: RolloutConfig, *, k: int,
                        temperature: float, seed: int) -> EvalSummary:
    limit = asyncio.Semaphore(config.concurrency)

    async def one(task: Task, i: int) -> EpisodeResult:
        async with limit:
            return await _chat_episode(task, env, llm, config, temperature=temperature, seed=seed + i)

    return summarize_episodes(await asyncio.gather(*(one(t, i) for t in tasks for i in range(k))), k)


def result_json(summary: EvalSummary, meta: dict[str, Any]) -> dict[str, Any]:
    values = per_task_values(summary)
    metrics = {m: interval([v[m] for v in values.values()], (0.0, 1.0)) for m in
               (f"avg@{summary.k}", f"best@{summary.k}", "invalid_action_rate")}
    return {**meta, f"avg@{summary.k}": summary.avg_at_k, f"best@{summary.k}": summary.best_at_k,
            "invalid_action_rate": summary.invalid_action_rate,
            "environment_error_rate": summary.environment_error_rate, "tasks": summary.tasks, "k": summary.k,
            "ci95": metrics, "per_task": summary.per_task, "answers": summary.per_task_answer,
            "prompts": summary.per_task_prompt, "experience_rollouts": summary.experience_rollouts,
            "per_task_steps": summary.per_task_steps, "replies": summary.per_task_replies,
            "per_task_called": summary.per_task_called, "successes_with_tool_call": summary.successes_with_tool_call(),
            "per_task_invalid": summary.per_task_invalid}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    config = RolloutConfig(env=args.env, template=args.template, max_turns=args.max_turns,
                           max_new_tokens=args.max_new_tokens, max_context=args.max_context,
                           temperature=args.temperature, concurrency=args.concurrency, retries=1)
    env = EnvPeer(args.env_url)
    policy = None
    try:
        ids = await env.task_ids(args.env, args.split)
        if not ids:
            raise SystemExit(f"trainer.evaluate: environment {args.env!r} has no {args.split} tasks")
        ids = ids[:args.tasks] if args.tasks else ids
        tasks = [Task(task_id=t, env_type=args.env, split=args.split) for t in ids]
        temperature = args.temperature if args.sample else 0.0
        meta: dict[str, Any] = {"env": args.env, "split": args.split, "greedy": not args.sample}
        if args.chat:
            llm = LLMClient("evaluate", LLMRoleConfig(base_url=args.endpoint.rstrip("/") + "/v1",
                                                      model=args.served_model or args.model or "policy",
                                                      api_key_env=args.api_key_env, max_retries=2))
            try:
                summary = await evaluate_chat(tasks, env, llm, config, k=args.k, temperature=temperature,
                                              seed=args.seed)
            finally:
                await llm.aclose()
            meta["policy"] = {"endpoint": args.endpoint, "chat": True}
        else:
            from engine.models import load_model
            from trainer.policy import EndpointPolicy, InProcessPolicy, engine_usage

            if args.endpoint:
                _, tokenizer = load_model(args.tokenizer or args.model or "smollm2")
                policy = EndpointPolicy(args.endpoint, args.served_model or args.model or "policy",
                                        api_key_env=args.api_key_env)
                meta["policy"] = {"endpoint": args.endpoint, "chat": False}
            elif args.checkpoint:
                model, tokenizer, step = load_checkpoint_model(args.checkpoint, args.model)
                policy = InProcessPolicy(model, tokenizer, max_batch=args.max_batch, threads=args.threads,
                                         prefix_cache_mb=args.prefix_cache_mb)
                meta["policy"] = {"checkpoint": str(args.checkpoint), "step": step}
            else:
                model, tokenizer = load_model(args.model)
                policy = InProcessPolicy(model, tokenizer, max_batch=args.max_batch, threads=args.threads,
                                         prefix_cache_mb=args.prefix_cache_mb)
                meta["policy"] = {"model": args.model}
            summary = await evaluate_policy(tasks, env, policy.generate, tokenizer, config, k=args.k,
                                            greedy=not args.sample, seed=args.seed,
                                            on_rollout=evaluation_progress(len(tasks) * args.k, time.monotonic()))
            with_asks = (await _evaluate_with_asks(args, tasks, env, policy.generate, tokenizer, config)
                         if args.asks else None)
            if isinstance(policy, InProcessPolicy):
                meta["engine"] = engine_usage(policy.stats)
            result = result_json(summary, meta)
            if with_asks is not None:
                result["with_asks"] = {**result_json(with_asks, {"mode": args.asks, "workspace": args.workspace}),
                                       **with_asks.ask_split()}
            return result
        return result_json(summary, meta)
    finally:
        if policy is not None:
            await policy.aclose()
        await env.aclose()


async def _evaluate_with_asks(args: argparse.Namespace, tasks: list[Task], env: EnvPeer, generate: Any,
                              tokenizer: Any, config: RolloutConfig) -> EvalSummary:
    """The same tasks and seeds with asks on, after checking the pool holds no experience of the split's tasks."""
    experience = ExperiencePeer(args.experience_url, args.workspace)
    try:
        refuse_held_out(await experience.source_task_ids(), await env.task_ids(args.env, args.split), args.workspace)
        settings = ExperienceConfig(workspace=args.workspace, mode=args.asks, ask_budget=args.ask_budget,
                                    ask_format=args.ask_format)
        return await evaluate_policy(tasks, env, generate, tokenizer, config, k=args.k, greedy=not args.sample,
                                     seed=args.seed, asks=ask_policy(settings, experience, tokenizer),
                                     on_rollout=evaluation_progress(len(tasks) * args.k, time.monotonic()))
    finally:
        await experience.aclose()


def print_result(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['env']} {result['split']}: {result['tasks']} tasks, k={result['k']}, "
                        f"{'greedy' if result['greedy'] else 'sampled'}")
    table.add_column("metric")
    table.add_column("mean [95% CI]")
    for metric, value in result["ci95"].items():
        table.add_row(metric, f"{value['mean']:.3f} [{value['lo']:.3f}, {value['hi']:.3f}]")
    for metric, value in (result.get("with_asks") or {}).get("ci95", {}).items():
        table.add_row(f"{metric} (with asks)", f"{value['mean']:.3f} [{value['lo']:.3f}, {value['hi']:.3f}]")
    Console(stderr=True).print(table)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    try:
        result = asyncio.run(run(args))
    except (FileNotFoundError, ValueError, ModelLoadError) as exc:
        print(f"trainer.evaluate: {exc}", file=sys.stderr)
        return 2
    print_result(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    logger.info("evaluated {} tasks", result["tasks"])
    print(json.dumps({k: v for k, v in result.items() if k != "per_task"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
