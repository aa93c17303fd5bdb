"""`evolver_sync`: veRL's synchronous v1 trainer with our advantage step, our loss and our mechanisms.

Selected with `trainer.v1.trainer_mode=evolver_sync`. Three changes to `PPOTrainerSync`:
- `_compute_advantage` also fetches the agent loop's `extra_fields` (step ids, judge labels, anchor
  states, trajectory/segment ids, experience flag) from TransferQueue, so ADCA-GRPO and GiGPO get
  what veRL's registered-estimator hook never passes; it writes the advantages back together with
  the per-sample experience flag as a tensor field the loss can read.
- after `init`, the actor's loss is `evolver_ppo_loss` (through `set_loss_fn`), which boosts the
  clip bound of flagged samples with positive advantage.
- the mechanisms layer (`trainer.mechanisms`, as in the local trainer): before the advantage step, the
  judge labels the whole batch in one call when the estimator declares it needs step labels; after the
  step (`on_step_end`), the trajectories are summarized into the experience pool with usage feedback,
  and pass rates go to the task manager's curriculum (whose next batch `EvolverTaskDataset` then asks for).
With a non-evolver `algorithm.adv_estimator`, the advantage step is veRL's own.
Validation batches are marked row by row (`ValidationBatches`), so the agent loop runs them without
experience and without asks.

Experience rollouts' log-probs: their `rollout_log_probs` were computed with the experience in the
context, which the training prompt no longer has. Before rollout correction they are replaced by the
actor's `old_log_probs` (recomputed on the stripped prompt), so their importance weight is 1 for an
unchanged policy instead of a bogus ratio between two different contexts.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from loguru import logger
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.padding import response_to_nested

from trainer.loss import gradient_is_zero
from trainer.verl_plugin.dataset import ValidationBatches
from trainer.verl_plugin.estimators import STEP_FIELDS, compute_evolver_advantage, estimator_name
from trainer.verl_plugin.loss import EXPERIENCE_FLAG_FIELD, evolver_ppo_loss
from trainer.verl_plugin.mechanisms import VerlMechanisms
from trainer.verl_plugin.settings import VERL_POLICY_LOSS, VERL_TRAINER, evolver_settings

_BASE_FIELDS = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "values"]


def extras_to_non_tensor(extras: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """The agent loop's per-sample dicts as veRL non-tensor columns (object arrays), ours only."""
    columns: dict[str, np.ndarray] = {}
    for key in (*STEP_FIELDS, "experience_flag", "task_id"):
        if any(key in e for e in extras):
            column = np.empty(len(extras), dtype=object)
            column[:] = [e.get(key) for e in extras]
            columns[key] = column
    return columns


def experience_flag_tensor(non_tensor: dict[str, np.ndarray], rows: int) -> torch.Tensor:
    """(B,) float 1.0 where the sample saw injected experience."""
    if "experience_flag" not in non_tensor:
        return torch.zeros(rows)
    return torch.tensor([float(bool(v)) for v in non_tensor["experience_flag"]])


def use_stripped_logprobs(data: DataProto) -> int:
    """Flagged rows' rollout log-probs := the actor's log-probs on the stripped prompt (see the module doc).

    Returns the number of rows replaced."""
    flags = experience_flag_tensor(data.non_tensor_batch, len(data)).bool()
    if not flags.any() or "rollout_log_probs" not in data.batch.keys() or "old_log_probs" not in data.batch.keys():
        return 0
    rollout, old = data.batch["rollout_log_probs"], data.batch["old_log_probs"]
    rows = flags.to(rollout.device)
    data.batch["rollout_log_probs"] = torch.where(rows.unsqueeze(-1), old.to(rollout.dtype), rollout)
    return int(rows.sum())


def evolver_advantage_step(data: DataProto, config: Any, *, global_steps: int, kl_ctrl: Any = None
                           ) -> tuple[DataProto, dict[str, Any], bool]:
    """veRL's advantage step (KL in reward, rollout correction) with our estimator at step 3.

    `data` holds `rm_scores`, `response_mask`, `uid` and our non-tensor columns. Returns the data
    with `token_level_rewards`, `advantages`, `returns`, the metrics, and whether rollout
    correction ran (then `response_mask`/`rollout_is_weights` changed and must be written back).
    """
    metrics: dict[str, Any] = {}
    algorithm = config.algorithm
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    if algorithm.use_kl_in_reward:
        data, kl_metrics = apply_kl_penalty(data, kl_ctrl=kl_ctrl, kl_penalty=algorithm.kl_penalty)
        metrics.update(kl_metrics)
    else:
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]

    rollout_corr = algorithm.get("rollout_correction", None)
    bypass = bool(rollout_corr and rollout_corr.get("bypass_mode", False))
    corrected = rollout_corr is not None and "rollout_log_probs" in data.batch and not bypass
    if rollout_corr is not None and bypass and bool(experience_flag_tensor(data.non_tensor_batch, len(data)).any()):
        raise ValueError("algorithm.rollout_correction.bypass_mode takes rollout log-probs as the old policy, but "
                         "experience rollouts generated with experience in context and train without it: turn "
                         "bypass_mode off (or rollout.experience_ratio to 0)")
    if corrected:
        metrics["evolver/stripped_logprob_rows"] = float(use_stripped_logprobs(data))
        data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rollout_corr)
        metrics.update(is_metrics)

    # veRL counts steps from 1; our schedules (ADCA alpha decay, prm_steps) from 0.
    metrics.update(compute_evolver_advantage(data, algorithm.adv_estimator, algorithm,
                                             training_step=max(global_steps - 1, 0)))
    return data, metrics, corrected


@register_trainer(VERL_TRAINER)
class EvolverPPOTrainer(PPOTrainerSync):
    """The sync trainer with our advantage step and experience-aware loss (see the module doc)."""

    def _build_replay_buffer(self):
        # veRL compares the mode *name* with "sync" in several places (replay buffer, refill,
        # checkpoint resume); this trainer is the sync trainer, so it answers to that name.
        self.trainer_mode = "sync"
        self.parameter_sync_step = self.config.trainer.v1.get("sync", {}).get("parameter_sync_step", 1)
        return super()._build_replay_buffer()

    def _init_dataloader(self):
        super()._init_dataloader()
        # Held-out rollouts run without experience or asks: the agent loop learns it is validating from the rows.
        self.val_dataloader = ValidationBatches(self.val_dataloader)

    def init(self):
        super().init()
        actor = self.config.actor_rollout_ref.actor
        if actor.policy_loss.get("loss_mode") != VERL_POLICY_LOSS:
            raise ValueError(f"trainer_mode={VERL_TRAINER} needs actor_rollout_ref.actor.policy_loss.loss_mode="
                             f"{VERL_POLICY_LOSS}, got {actor.policy_loss.get('loss_mode')!r}")
        if self.config.get("distillation") and self.config.distillation.get("enabled", False):
            raise ValueError(f"trainer_mode={VERL_TRAINER} does not combine with distillation")
        settings = evolver_settings(self.config)
        actor_config = omega_conf_to_dataclass(actor)
        self.actor_rollout_wg.set_loss_fn(partial(evolver_ppo_loss, config=actor_config,
                                                  clip_high_boosted=settings.clip_high_boosted))
        logger.info("evolver_sync: actor loss = evolver_ppo_loss (clip_high_boosted={})", settings.clip_high_boosted)

    def evolver_mechanisms(self) -> VerlMechanisms:
        """The judge/feedback side of the mechanisms layer, built on first use."""
        if getattr(self, "_evolver_mechanisms", None) is None:
            self._evolver_mechanisms = VerlMechanisms(evolver_settings(self.config))
        return self._evolver_mechanisms

    def evolver_advantage(self, data: DataProto, extras: list[dict[str, Any]], metrics: dict
                          ) -> tuple[DataProto, bool]:
        """Judge the batch (once, when the estimator needs labels), then our advantage step on `data`."""
        mechanisms = self.evolver_mechanisms()
        mechanisms.label_batch(extras, step=self.global_steps)
        data.non_tensor_batch.update(extras_to_non_tensor(extras))
        data, step_metrics, corrected = evolver_advantage_step(
            data, self.config, global_steps=self.global_steps, kl_ctrl=getattr(self, "kl_ctrl_in_reward", None))
        metrics.update(step_metrics)
        return data, corrected

    def on_step_end(self):
        super().on_step_end()
        self.evolver_after_step()

    def evolver_after_step(self) -> dict[str, float]:
        """Feedback of the step just trained: summaries and usage to the pool, pass rates to the curriculum."""
        if getattr(self, "_evolver_mechanisms", None) is None:
            return {}
        self._evolver_mechanisms.after_step()
        return self._evolver_mechanisms.metrics()

    def evolver_zero_gradient(self, advantages: torch.Tensor, response_mask: torch.Tensor) -> bool:
        """The actor loss's gradient is exactly 0 on this batch (see `gradient_is_zero`), with the actor's
        KL-loss and entropy coefficients."""
        actor = self.config.actor_rollout_ref.actor
        kl = float(actor.get("kl_loss_coef", 0.0)) if actor.get("use_kl_loss", False) else 0.0
        return gradient_is_zero(advantages, response_mask, kl_coef=kl, entropy_coef=float(actor.get("entropy_coeff", 0.0)))

    def _update_actor(self, batch, metrics: dict):
        # A batch whose gradient is exactly 0 (every advantage 0, no KL or entropy term) cannot change the
        # weights: no forward, backward or optimizer step (veRL's LR scheduler steps inside the update, so it
        # waits too, as in the local trainer).
        skip = bool(getattr(self, "_evolver_zero_gradient", False))
        self._evolver_zero_gradient = False
        metrics["evolver/update_skipped"] = float(skip)
        if skip:
            logger.info("step {}: actor update skipped: every advantage is 0 and the loss has no other term",
                        self.global_steps)
            return batch
        return super()._update_actor(batch, metrics)

    def _compute_advantage(self, batch, metrics: dict):
        if estimator_name(self.config.algorithm.adv_estimator) is None:
            return super()._compute_advantage(batch, metrics)
        fetched = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=_BASE_FIELDS)
        extras = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                 select_fields=["extra_fields"]).pop("extra_fields").tolist()
        response_mask = fetched["response_mask"]
        data = DataProto(batch=fetched.to_padded_tensor())
        data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
        data, corrected = self.evolver_advantage(data, [dict(getattr(e, "data", e)) for e in extras], metrics)

        fields = ["advantages", "returns"]
        if self.config.algorithm.use_kl_in_reward:
            fields.append("token_level_rewards")
        if corrected:
            fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                fields.append("rollout_is_weights")
        self._evolver_zero_gradient = self.evolver_zero_gradient(data.batch["advantages"], data.batch["response_mask"])
        output = {field: response_to_nested(data.batch[field], response_mask) for field in fields}
        output[EXPERIENCE_FLAG_FIELD] = experience_flag_tensor(data.non_tensor_batch, len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                               fields=TensorDict(output, batch_size=len(batch)))
