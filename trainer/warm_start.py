"""`trainer.warm_start`: supervised fine-tuning of the policy on solved tasks before the first RL step.

The data (`source`):
- `synthetic`: the task manager's trainable synthetic tasks (the ones its batches sample: grown from train
  tasks, never the pool's share nor a task whose answer a pool demonstration shows), each solved by its
  verified reference, replayed by the task manager in a fresh instance of its seed task started with the
  synthetic query, as the trainer starts it, so the observations are the environment's own. Self-questioning
  made them: zero human data. The references reach the trainer only here, as training text; rollouts,
  grading and batches still never carry one.
- `environment`: the environment's own train tasks solved by its references (for comparison).

Each solved task is rendered by the rollout's own context template, turn by turn as an episode is: the
opening messages, then each action as the tokens the policy would have generated (the action's tokens and
the end-of-turn token) and the observation after it. So the model learns the exact token layout it
generates in, and the loss mask is the rollout's: 1 on the action tokens, 0 on everything else.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from loguru import logger

from common.schemas import ChatMessage, Trajectory
from engine.kv_slots import return_freed_memory
from trainer import lora
from trainer.settings import OptimConfig, RolloutConfig, WarmStartConfig
from trainer.templates import Segment, make_template
from trainer.update import make_scheduler

if TYPE_CHECKING:
    from task_manager.client import TaskClient
    from trainer.peers import EnvPeer
    from trainer.policy import Policy


# A group's padded tokens (its common opening plus its rows' remainders): a max-context sample's.
GROUP_TOKENS = 1536
# Below this common opening, one unpadded forward per sample costs less than padding the rows together.
MIN_SHARED_TOKENS = 32
# What one more forward call costs, in tokens' worth of compute: padding a row by fewer tokens beats a call of its own.
CALL_TOKENS = 16


@dataclass
class SolvedTask:
    task_id: str
    opening: list[dict[str, str]]  # the instance's first messages (system, user), as rollouts start from
    steps: list[tuple[str, str | None]]  # (action, the observation after it; None where the episode ended)


def from_trajectory(trajectory: Trajectory) -> SolvedTask:
    """A replayed reference from the task manager (`seeding.reference_trajectory`)."""
    first_action = next(i for i, m in enumerate(trajectory.messages) if m.role == "assistant")
    opening = [{"role": m.role, "content": m.text()} for m in trajectory.messages[:first_action]]
    steps = [(s.action.text(), s.observation.text() if s.observation is not None else None) for s in trajectory.steps]
    return SolvedTask(trajectory.task_id, opening, steps)


def from_messages(task_id: str, messages: list[ChatMessage]) -> SolvedTask:
    """An environment's reference episode: opening messages, then each action and the observation after it
    (none after the closing reply)."""
    first_action = next(i for i, m in enumerate(messages) if m.role == "assistant")
    opening = [{"role": m.role, "content": m.text()} for m in messages[:first_action]]
    steps: list[tuple[str, str | None]] = []
    for message in messages[first_action:]:
        if message.role == "assistant":
            steps.append((message.text(), None))
        elif steps and steps[-1][1] is None:
            steps[-1] = (steps[-1][0], message.text())
        else:
            raise ValueError(f"reference episode of {task_id}: two observations in a row")
    return SolvedTask(task_id, opening, steps)


def render(task: SolvedTask, tokenizer: Any, rollout: RolloutConfig) -> list[Segment]:
    """The solved task as the rollout template renders an episode: each action's tokens end with the
    end-of-turn token, as a generation does, and are the only tokens with loss mask 1."""
    template = make_template(rollout.template, tokenizer, rollout.max_context, **rollout.template_options)
    template.start(task.opening)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for index, (action, observation) in enumerate(task.steps):
        template.add_turn(index, template.encode(action) + eos, action)
        template.add_observation(observation)
    return template.segments()


async def gather(settings: WarmStartConfig, env_name: str, env: EnvPeer, tasks: TaskClient | None
                 ) -> tuple[list[SolvedTask], dict[str, Any]]:
    """The configured source's solved tasks, and what the source reported about them."""
    if settings.source == "synthetic":
        if tasks is None:
            raise ValueError("warm_start.source=synthetic needs services.task_url (the task manager)")
        served = await tasks.training_references(env_name, limit=settings.max_tasks or 100_000)
        report = served.model_dump(exclude={"trajectories", "env"})
        return [from_trajectory(t) for t in served.trajectories], report
    train_ids = await env.task_ids(env_name, "train")
    chosen = train_ids[: settings.max_tasks] if settings.max_tasks else train_ids
    solved = [from_messages(task_id, await env.reference_episode(env_name, task_id)) for task_id in chosen]
    return solved, {"train_tasks": len(train_ids)}


def training_data(solved: list[SolvedTask], tokenizer: Any, rollout: RolloutConfig
                  ) -> tuple[list[Segment], dict[str, Any]]:
    """The samples of the solved tasks that fit the rollout's context whole, and their counts."""
    samples: list[Segment] = []
    task_ids: list[str] = []
    too_long = 0
    for task in solved:
        segments = render(task, tokenizer, rollout)
        if any(len(s.prompt_ids) + len(s.response_ids) > rollout.max_context for s in segments):
            too_long += 1  # a rollout could never have seen it whole
            continue
        samples += segments
        task_ids.append(task.task_id)
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    assistant = sum(sum(s.loss_mask) for s in samples)
    return samples, {"tasks": len(task_ids), "samples": len(samples), "too_long": too_long, "tokens": tokens,
                     "assistant_tokens": assistant, "task_ids": task_ids}


def fine_tune(model: torch.nn.Module, samples: list[Segment], settings: WarmStartConfig, device: torch.device,
              seed: int) -> dict[str, Any]:
    """AdamW over `samples` (shuffled per epoch), the loss the mean cross-entropy over a batch's mask-1 tokens.

    Returns the loss of every step (the curve) and of every epoch."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    per_epoch = math.ceil(len(samples) / settings.batch_size)
    scheduler = make_scheduler(optimizer, OptimConfig(lr=settings.lr, schedule=settings.schedule,
                                                      warmup_steps=settings.warmup_steps), settings.epochs * per_epoch)
    rng = random.Random(seed)
    compute = getattr(torch, settings.dtype)
    curve: list[float] = []
    epoch_loss: list[float] = []
    was_training = model.training
    model.train()
    try:
        for epoch in range(settings.epochs):
            order = list(range(len(samples)))
            rng.shuffle(order)
            token_loss, token_count = 0.0, 0
            for start in range(0, len(order), settings.batch_size):
                batch = [samples[i] for i in order[start:start + settings.batch_size]]
                trained = sum(sum(s.loss_mask) for s in batch)
                optimizer.zero_grad(set_to_none=True)
                step_loss = 0.0
                if settings.share_opening:
                    step_loss = batch_backward(model, batch, device, trained, compute)
                else:
                    for sample in batch:  # gradients add up over the batch
                        with _autocast(device, compute):
                            loss = _summed_loss(model, sample, device) / trained
                        loss.backward()
                        step_loss += float(loss.detach())
                torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
                optimizer.step()
                scheduler.step()
                curve.append(step_loss)
                logger.debug("warm start step {}: loss {:.4f}", len(curve), step_loss)
                token_loss, token_count = token_loss + step_loss * trained, token_count + trained
            epoch_loss.append(token_loss / max(token_count, 1))
            logger.info("warm start epoch {}/{}: loss {:.4f}", epoch + 1, settings.epochs, epoch_loss[-1])
    finally:
        # The trainer evaluates next, with a 128-row engine, in the same process: the gradients, the Adam
        # moments and the heap pages glibc keeps from the activations would otherwise sit beside it.
        model.zero_grad(set_to_none=True)
        optimizer.state.clear()
        return_freed_memory()
        model.train(was_training)
    return {"steps": len(curve), "loss_curve": curve, "epoch_loss": epoch_loss}


def opening_groups(batch: list[Segment], budget: int = GROUP_TOKENS) -> tuple[int, list[list[Segment]]]:
    """The batch's common opening (its length; 0: none worth sharing) and its rows cut into groups that continue
    it together.

    Every sample opens with the same system prompt and tool list (246 of about 530 tokens on flights v2). The
    opening runs once per batch; each group continues its keys and values with its rows' remainders padded to
    the longest, so rows of similar length go together (sorted), and a group's padded tokens (the opening's
    included) stay within `budget`, which bounds the activations the backward keeps to what one max-context
    sample needed alone; a group of one row continues the opening whatever the budget.
    """
    ids = [s.prompt_ids + s.response_ids for s in batch]
    # The opening ends before any trained token's predicting position: inside every prompt, one token short.
    shared = min(min(len(s.prompt_ids) for s in batch) - 1, _common_prefix(ids))
    if len(batch) == 1 or shared < MIN_SHARED_TOKENS:
        return 0, [[s] for s in batch]
    rows = sorted(batch, key=lambda s: len(s.prompt_ids) + len(s.response_ids))
    rest = [len(s.prompt_ids) + len(s.response_ids) - shared for s in rows]
    # Sorted rows cut into runs, fewest computed tokens first: a run costs its rows padded to its last (longest)
    # row, plus a few tokens' worth for the forward call itself, so equal rows go together rather than alone.
    best, cut = [0.0] + [math.inf] * len(rows), [0] * (len(rows) + 1)
    for end in range(1, len(rows) + 1):
        for begin in range(end):
            padded = (end - begin) * rest[end - 1]
            cost = padded + CALL_TOKENS
            if (end - begin == 1 or shared + padded <= budget) and best[begin] + cost < best[end]:
                best[end], cut[end] = best[begin] + cost, begin
    groups, end = [], len(rows)
    while end:
        groups.insert(0, rows[cut[end]:end])
        end = cut[end]
    return shared, groups


def tokens_computed(shared: int, groups: list[list[Segment]]) -> int:
    """Tokens the forwards of `opening_groups`' answer run: the opening once plus each group's rows padded to its
    longest; without an opening, each sample alone."""
    if not shared:
        return sum(len(s.prompt_ids) + len(s.response_ids) for g in groups for s in g)
    return shared + sum(len(g) * (max(len(s.prompt_ids) + len(s.response_ids) for s in g) - shared) for g in groups)


def _common_prefix(sequences: list[list[int]]) -> int:
    first = sequences[0]
    length = min(len(s) for s in sequences)
    for other in sequences[1:]:
        length = next((i for i in range(length) if other[i] != first[i]), length)
    return length


def batch_backward(model: torch.nn.Module, batch: list[Segment], device: torch.device, scale: float,
                   compute: torch.dtype = torch.float32) -> float:
    """Backward of the batch's summed mask-1 cross-entropy divided by `scale`; returns that loss.

    The common opening (`opening_groups`) runs forward and backward once: its keys and values enter every group
    as detached leaves, each group's backward adds its share of their gradient there, and one last backward
    carries the sum into the opening's graph. The same gradient as one forward per sample, up to rounding;
    without an opening, one forward per sample. `compute`: the forwards' autocast dtype (fp32: none)."""
    shared, groups = opening_groups(batch)
    total = 0.0
    if not shared:
        for sample in batch:
            with _autocast(device, compute):
                loss = _summed_loss(model, sample, device) / scale
            loss.backward()
            total += float(loss.detach())
        return total
    with _autocast(device, compute):
        opening = model.get_decoder()(input_ids=torch.tensor([batch[0].prompt_ids[:shared]], device=device),
                                      use_cache=True).past_key_values
    computed = [t for layer in opening.layers for t in (layer.keys, layer.values)]
    leaves = [t.detach().requires_grad_() for t in computed]
    for group in groups:
        with _autocast(device, compute):
            loss = _continued_loss(model, group, shared, leaves, device) / scale
        loss.backward()
        total += float(loss.detach())
    torch.autograd.backward(computed, [leaf.grad for leaf in leaves])
    return total


def _continued_loss(model: torch.nn.Module, group: list[Segment], shared: int, opening: list[torch.Tensor],
                    device: torch.device) -> torch.Tensor:
    """Summed cross-entropy of the group's mask-1 tokens, its rows continuing the opening's keys and values
    (`opening`: per layer keys then values, [1, kv_heads, shared, head_dim])."""
    from transformers import DynamicCache

    rows = len(group)
    cache = DynamicCache()
    for layer in range(len(opening) // 2):
        cache.update(opening[2 * layer].repeat(rows, 1, 1, 1), opening[2 * layer + 1].repeat(rows, 1, 1, 1), layer)
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in group) - shared
    ids = torch.zeros((rows, width), dtype=torch.long)
    attention = torch.zeros((rows, shared + width), dtype=torch.long)
    trained = torch.zeros((rows, width), dtype=torch.bool)
    attention[:, :shared] = 1
    for i, s in enumerate(group):
        rest = (s.prompt_ids + s.response_ids)[shared:]
        ids[i, :len(rest)] = torch.tensor(rest)
        attention[i, shared:shared + len(rest)] = 1
        trained[i, len(s.prompt_ids) - shared:len(rest)] = torch.tensor(s.loss_mask, dtype=torch.bool)
    rows_at, cols = torch.nonzero(trained, as_tuple=True)
    # Token c of a row's remainder is predicted at its position c - 1 (c >= 1: the opening ends inside every prompt).
    kept, where = torch.unique(cols - 1, sorted=True, return_inverse=True)
    end = int(kept[-1]) + 1  # nothing after the last predicting position is needed
    logits = model(input_ids=ids[:, :end].to(device), attention_mask=attention[:, :shared + end].to(device),
                   past_key_values=cache, use_cache=False, logits_to_keep=kept.to(device)).logits
    picked = logits[rows_at.to(device), where.to(device)].float()
    return torch.nn.functional.cross_entropy(picked, ids[rows_at, cols].to(device), reduction="sum")


def _summed_loss(model: torch.nn.Module, sample: Segment, device: torch.device) -> torch.Tensor:
    """Sum of the cross-entropy of the sample's mask-1 tokens given everything before them.

    The logits are computed only at the positions that predict a mask-1 token (`logits_to_keep`): the
    vocabulary projection over every position was about a fifth of the step, for the few action tokens."""
    ids = sample.prompt_ids + sample.response_ids
    start = len(sample.prompt_ids)
    targets = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
    # The token at position p is predicted by the logits at p - 1.
    predicting = [start + j - 1 for j, m in enumerate(sample.loss_mask) if m]
    logits = model(input_ids=torch.tensor([ids], device=device),
                   logits_to_keep=torch.tensor(predicting, device=device)).logits[0].float()
    return torch.nn.functional.cross_entropy(logits, torch.tensor(targets, device=device), reduction="sum")


def _autocast(device: torch.device, dtype: torch.dtype) -> torch.autocast:
    """Forwards in `dtype` where it is not fp32 (weights, gradients and the optimizer stay fp32)."""
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype != torch.float32)


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over a state dict's names and raw bytes: equal digests, equal weights."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous().reshape(-1)
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def shared_warm_start(path: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The weights and warm-start report of a checkpoint a warm-started run saved before its first RL step."""
    from trainer.checkpoint import load_checkpoint

    state = load_checkpoint(Path(path))
    report = state.get("warm_start")
    if not report or int(state.get("step", -1)) != 0:
        raise ValueError(f"warm_start.from_checkpoint: {path} is not a warm-started run's step-0 checkpoint "
                         f"(step {state.get('step')}, warm start {'recorded' if report else 'absent'})")
    if report.get("weights_sha256") and weights_digest(state["model"]) != report["weights_sha256"]:
        raise ValueError(f"warm_start.from_checkpoint: {path}: the weights differ from the warm start's digest")
    return state["model"], report


async def warm_start(settings: WarmStartConfig, rollout: RolloutConfig, seed: int, *, env: EnvPeer,
                     tasks: TaskClient | None, tokenizer: Any, model: torch.nn.Module, device: torch.device,
                     policy: Policy, ref_model: torch.nn.Module | None) -> dict[str, Any]:
    """Fine-tune the trainer's model on the configured source (or load a shared warm start,
    `settings.from_checkpoint`), then load the weights into the policy (and the KL reference, which is the policy
    RL starts from). Returns the report for the summary."""
    if settings.from_checkpoint:
        if lora.is_peft(model):
            raise ValueError("warm_start.from_checkpoint loads full weights; it does not apply to a LoRA run")
        weights, report = shared_warm_start(settings.from_checkpoint)
        model.load_state_dict(weights)
        await policy.load_weights(lora.serving_view(model))
        if ref_model is not None:
            ref_model.load_state_dict(weights)
        logger.info("warm start loaded from {} (computed once, shared): {} solved {} tasks", settings.from_checkpoint,
                    report.get("tasks"), report.get("source"))
        return {**report, "from_checkpoint": settings.from_checkpoint,
                "weights_sha256": weights_digest(lora.merged_state_dict(model))}
    solved, source_report = await gather(settings, rollout.env, env, tasks)
    samples, data = training_data(solved, tokenizer, rollout)
    if not samples:
        raise RuntimeError(f"warm_start (source: {settings.source}) found no solved task to train on "
                           f"(source: {source_report}; {data['too_long']} longer than rollout.max_context)")
    logger.info("warm start on {} solved {} tasks ({} samples, {} tokens, {} trained)", data["tasks"],
                settings.source, data["samples"], data["tokens"], data["assistant_tokens"])
    trained = await asyncio.to_thread(fine_tune, model, samples, settings, device, seed)
    await policy.load_weights(lora.serving_view(model))
    if ref_model is not None:
        ref_model.load_state_dict(lora.merged_state_dict(model))
    return {"source": settings.source, "epochs": settings.epochs, "lr": settings.lr,
            "batch_size": settings.batch_size, **trained, **data, "source_report": source_report,
            "weights_sha256": weights_digest(lora.merged_state_dict(model))}
