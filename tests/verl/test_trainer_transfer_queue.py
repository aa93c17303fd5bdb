"""`evolver_sync._compute_advantage` against a real TransferQueue (its Ray actors on a private local cluster):
the agent loop's extra fields come out of the queue, ADCA-GRPO advantages and the experience flag go back in,
and the batch handed on to the actor update lists every field (the loss reads the flag from it)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("verl", reason="veRL is installed by the `verl` extra")

import ray  # noqa: E402
import transfer_queue as tq  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

import trainer.verl_plugin  # noqa: E402,F401
from estimators import AdcaGrpoConfig, AdvantageBatch, estimate  # noqa: E402
from trainer.verl_plugin.loss import EXPERIENCE_FLAG_FIELD  # noqa: E402
from trainer.verl_plugin.trainer import EvolverPPOTrainer  # noqa: E402

pytestmark = pytest.mark.slow

# uid, outcome, step id per response token, judge labels, experience flag
SAMPLES = [
    ("prompt-1", 1.0, [0, 0, 1, 1], [1.0, 1.0], True),
    ("prompt-1", 0.0, [0, 1, 1, 1, 1], [1.0, -1.0], False),
    ("prompt-2", 1.0, [0, 0, 0], [-1.0], True),
    ("prompt-2", 0.0, [0, 1, 2], [1.0, -1.0, -1.0], False),
]


@pytest.fixture(scope="module")
def queue():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # address="local": a private cluster, never one another process on this machine started.
    ray.init(address="local", num_cpus=4, include_dashboard=False, object_store_memory=256 * 1024**2,
             log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    try:
        yield
    finally:
        tq.close()
        ray.shutdown()


def put_samples(samples=SAMPLES, prefix: str = ""):
    keys, fields = [], []
    for session, (uid, outcome, steps, labels, flag) in enumerate(samples):
        n = len(steps)
        rm_scores = torch.zeros(n)
        rm_scores[-1] = outcome
        keys.append(f"{prefix}{uid}_{session}_0")
        fields.append({"uid": uid, "prompts": torch.tensor([1, 2, 3]), "responses": torch.arange(n),
                       "response_mask": torch.ones(n, dtype=torch.int64), "rm_scores": rm_scores,
                       "extra_fields": {"experience_flag": flag, "step_ids": steps, "step_labels": labels,
                                        "num_steps": len(labels), "trajectory_id": f"traj-{session}",
                                        "segment_index": 0, "task_id": uid}})
    return keys, tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields),
                                 tags=[{}] * len(keys))


def advantage_only_trainer(alpha: float = 0.4, entropy_coeff: float = 0.0) -> EvolverPPOTrainer:
    trainer = object.__new__(EvolverPPOTrainer)  # only the advantage step: no workers, no GPUs
    trainer.config = OmegaConf.create({"algorithm": {
        "adv_estimator": "evolver_adca_grpo", "use_kl_in_reward": False, "kl_penalty": "kl",
        "rollout_correction": None, "evolver": {"adca_grpo": {"alpha": alpha}}},
        "actor_rollout_ref": {"actor": {"use_kl_loss": False, "kl_loss_coef": 0.0, "entropy_coeff": entropy_coeff}},
        # The run's `evolver` node: the samples carry their labels already (no `trajectory` to judge), so no
        # service is called and these URLs are never dialled.
        "evolver": {"env_url": "http://127.0.0.1:9", "rollout": {"env": "signal"}, "estimator": "adca_grpo",
                    "judge_url": "http://127.0.0.1:9"}})
    trainer.global_steps = 1
    return trainer


def test_advantage_step_reads_extra_fields_from_the_queue_and_writes_flag_back(queue):
    keys, meta = put_samples()
    trainer = advantage_only_trainer()
    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    assert trainer._evolver_zero_gradient is False  # mixed outcomes and judge labels: the actor updates
    assert {"advantages", "returns", EXPERIENCE_FLAG_FIELD, "extra_fields", "responses"} <= set(out.fields)
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages", EXPERIENCE_FLAG_FIELD])
    assert got[EXPERIENCE_FLAG_FIELD].tolist() == [1.0, 0.0, 1.0, 0.0]

    width = max(len(s[2]) for s in SAMPLES)
    step_ids = torch.full((len(SAMPLES), width), -1)
    for i, s in enumerate(SAMPLES):
        step_ids[i, : len(s[2])] = torch.tensor(s[2])
    batch = AdvantageBatch(response_mask=(step_ids >= 0).float(), step_ids=step_ids,
                           outcome=torch.tensor([s[1] for s in SAMPLES]), group_index=[s[0] for s in SAMPLES],
                           step_labels=[s[3] for s in SAMPLES], num_steps=[len(s[3]) for s in SAMPLES])
    expected = estimate("adca_grpo", batch, AdcaGrpoConfig(alpha=0.4)).advantages
    for i, row in enumerate(got["advantages"].unbind()):
        assert torch.equal(row, expected[i, : len(SAMPLES[i][2])])
    assert metrics["evolver/trajectories"] == 4


def test_a_batch_of_zero_advantages_skips_the_actor_update(queue, monkeypatch):
    """Equal outcomes in every group and no attribution term: veRL's actor update (FSDP workers, GPU only;
    recorded here instead) is not called. With an entropy bonus, which has a gradient of its own, it is."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    updates: list = []
    monkeypatch.setattr(PPOTrainerSync, "_update_actor", lambda self, batch, metrics: updates.append(batch) or batch)
    equal = [(uid, outcome, steps, labels, flag) for uid, _, steps, labels, flag in SAMPLES
             for outcome in [1.0 if uid == "prompt-1" else 0.0]]
    _, meta = put_samples(equal, prefix="equal-")
    trainer = advantage_only_trainer(alpha=0.0)
    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    assert trainer._update_actor(out, metrics) is out
    assert updates == [] and metrics["evolver/update_skipped"] == 1.0

    _, meta = put_samples(equal, prefix="entropy-")
    trainer = advantage_only_trainer(alpha=0.0, entropy_coeff=0.01)
    out = trainer._compute_advantage(meta, metrics)
    trainer._update_actor(out, metrics)
    assert len(updates) == 1 and metrics["evolver/update_skipped"] == 0.0
