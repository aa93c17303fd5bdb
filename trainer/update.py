"""The GRPO policy update: old log-probs recomputed on the stripped context, then several PPO updates.

A training sample is one `Segment` (prompt ids, response ids, loss mask) with a per-token advantage
and the flag "saw injected experience". Old log-probs are computed by the current model on exactly
the training context (experience absent), so the PPO ratio is measured against it. Each batch gets
`epochs` passes of `minibatches` optimizer steps; a minibatch is split into micro-batches whose
gradients accumulate, weighted by their token share, so the loss stays a token mean over the
minibatch whatever the micro-batch size.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import torch

from trainer.loss import policy_loss
from trainer.settings import OptimConfig, PolicyLossConfig


@dataclass
class TrainSample:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    advantages: list[float]
    experience_flag: bool = False  # generated with injected experience (selective boosting applies)

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.advantages) != n:
            raise ValueError(f"sample fields disagree: {n} response ids, {len(self.loss_mask)} mask entries, "
                             f"{len(self.advantages)} advantages")


@dataclass
class _Batch:
    input_ids: torch.Tensor  # (B, L)
    attention_mask: torch.Tensor  # (B, L)
    starts: list[int]  # where each response begins in its row
    lengths: list[int]
    mask: torch.Tensor  # (B, T) response loss mask
    advantages: torch.Tensor  # (B, T)
    experience_flag: torch.Tensor  # (B,)


def collate(samples: list[TrainSample], pad_id: int, device: torch.device) -> _Batch:
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    t = max(len(s.response_ids) for s in samples)
    b = len(samples)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.float32)
    adv = torch.zeros((b, t), dtype=torch.float32)
    for i, s in enumerate(samples):
        seq = s.prompt_ids + s.response_ids
        ids[i, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[i, :len(seq)] = 1
        n = len(s.response_ids)
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        adv[i, :n] = torch.tensor(s.advantages, dtype=torch.float32)
    flags = torch.tensor([s.experience_flag for s in samples], dtype=torch.bool)
    return _Batch(ids.to(device), attn.to(device), [len(s.prompt_ids) for s in samples],
                  [len(s.response_ids) for s in samples], mask.to(device), adv.to(device), flags.to(device))


def response_logprobs(model: Any, batch: _Batch, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob (and entropy) of every response token under `model`, (B, T), 0 beyond each response."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    b, t = batch.mask.shape
    logp = torch.zeros((b, t), dtype=torch.float32, device=logits.device)
    entropy = torch.zeros((b, t), dtype=torch.float32, device=logits.device) if with_entropy else None
    for i in range(b):
        start, n = batch.starts[i], batch.lengths[i]
        # The token at position p is predicted by the logits at p - 1.
        row_logits = logits[i, start - 1:start - 1 + n].float()
        log_probs = torch.log_softmax(row_logits, dim=-1)
        targets = batch.input_ids[i, start:start + n]
        logp[i, :n] = log_probs.gather(-1, targets[:, None]).squeeze(-1)
        if entropy is not None:
            entropy[i, :n] = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


def make_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig, total_steps: int
                   ) -> torch.optim.lr_scheduler.LambdaLR:
    total = max(total_steps, 1)

    def factor(step: int) -> float:
        if config.warmup_steps and step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - config.warmup_steps) / max(total - config.warmup_steps, 1))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if config.schedule == "cosine" else 1 - progress
        return config.min_lr_ratio + (1 - config.min_lr_ratio) * shape

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class PolicyUpdater:
    """Owns the trainable model, its optimizer and schedule, and an optional frozen reference."""

    def __init__(self, model: torch.nn.Module, optim: OptimConfig, loss: PolicyLossConfig, *, pad_id: int,
                 total_updates: int, device: torch.device | str = "cpu", ref_model: torch.nn.Module | None = None,
                 seed: int = 0) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.optim_config, self.loss_config, self.pad_id = optim, loss, pad_id
        self.ref_model = ref_model.to(self.device).eval() if ref_model is not None else None
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)
        steps_per_batch = optim.epochs * optim.minibatches
        self.scheduler = make_scheduler(self.optimizer, optim, total_updates * steps_per_batch)
        self.rng = random.Random(seed)

    @torch.no_grad()
    def _score(self, model: Any, samples: list[TrainSample]) -> list[torch.Tensor]:
        """Per sample, the response log-probs under `model` (no gradient), micro-batched."""
        out: list[torch.Tensor] = []
        size = self.optim_config.micro_batch_size
        for i in range(0, len(samples), size):
            chunk = samples[i:i + size]
            logp, _ = response_logprobs(model, collate(chunk, self.pad_id, self.device))
            out += [logp[j, :len(s.response_ids)].detach() for j, s in enumerate(chunk)]
        return out

    def update(self, samples: list[TrainSample]) -> dict[str, float]:
        """Old log-probs on the training context, then epochs x minibatches optimizer steps."""
        if not samples:
            return {}
        cfg = self.optim_config
        was_training = self.model.training
        self.model.eval()  # no dropout in the old log-probs
        old = self._score(self.model, samples)
        ref = self._score(self.ref_model, samples) if self.ref_model is not None and self.loss_config.kl_coef > 0 \
            else None
        self.model.train()
        want_entropy = self.loss_config.entropy_coef > 0
        totals: dict[str, float] = {}
        counts: dict[str, int] = {}
        order = list(range(len(samples)))
        optimizer_steps = 0
        grad_norms: list[float] = []
        for _ in range(cfg.epochs):
            self.rng.shuffle(order)
            chunks = [order[k::cfg.minibatches] for k in range(cfg.minibatches)]
            for minibatch in (c for c in chunks if c):
                tokens = sum(sum(samples[i].loss_mask) for i in minibatch)
                if tokens == 0:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                for m in range(0, len(minibatch), cfg.micro_batch_size):
                    idx = minibatch[m:m + cfg.micro_batch_size]
                    micro = [samples[i] for i in idx]
                    batch = collate(micro, self.pad_id, self.device)
                    logp, entropy = response_logprobs(self.model, batch, with_entropy=want_entropy)
                    old_logp = _pad([old[i] for i in idx], batch.mask.shape, self.device)
                    ref_logp = _pad([ref[i] for i in idx], batch.mask.shape, self.device) if ref else None
                    loss, metrics = policy_loss(logp, old_logp, batch.advantages, batch.mask, batch.experience_flag,
                                                self.loss_config, ref_logp=ref_logp, entropy=entropy)
                    share = float(batch.mask.sum()) / tokens
                    (loss * share).backward()
                    for key, value in metrics.items():
                        totals[key] = totals.get(key, 0.0) + value
                        counts[key] = counts.get(key, 0) + 1
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                grad_norms.append(float(norm))
                self.optimizer.step()
                self.scheduler.step()
                optimizer_steps += 1
        self.model.train(was_training)
        out = {f"update/{k}": v / counts[k] for k, v in totals.items()}
        out["update/optimizer_steps"] = float(optimizer_steps)
        out["update/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        out["update/lr"] = float(self.scheduler.get_last_lr()[0])
        out["update/samples"] = float(len(samples))
        out["update/tokens"] = float(sum(sum(s.loss_mask) for s in samples))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.rng.setstate(state["rng"])


def _pad(rows: list[torch.Tensor], shape: torch.Size, device: torch.device) -> torch.Tensor:
    out = torch.zeros(tuple(shape), dtype=torch.float32, device=device)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row.to(device)
    return out
