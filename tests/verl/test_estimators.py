"""Our estimators inside veRL: the same numbers as `estimators/`, and GRPO against veRL's own `grpo`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="veRL is installed by the `verl` extra")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

import trainer.verl_plugin  # noqa: E402,F401  (registers, as veRL's plugin loading would)
from estimators import AdcaGrpoConfig, AdvantageBatch, BatchError, GigpoConfig, estimate  # noqa: E402
from trainer.verl_plugin.trainer import evolver_advantage_step, experience_flag_tensor, extras_to_non_tensor  # noqa: E402


def outcome_batch(scores: np.ndarray, lengths: np.ndarray, uids: np.ndarray, width: int) -> DataProto:
    """veRL's layout: the outcome on the last response token of each row."""
    rows = len(scores)
    rewards, mask = torch.zeros(rows, width), torch.zeros(rows, width)
    for i in range(rows):
        mask[i, : lengths[i]] = 1
        rewards[i, lengths[i] - 1] = float(scores[i])
    return DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uids.copy()})


def random_groups(rng: np.random.Generator, binary: bool, min_size: int = 2):
    groups, size = int(rng.integers(1, 6)), int(rng.integers(min_size, 7))
    rows = groups * size
    uids = rng.permutation(np.array([f"prompt-{i // size}" for i in range(rows)], dtype=object))
    scores = rng.integers(0, 2, rows).astype(np.float32) if binary else (rng.random(rows) * 4 - 1).astype(np.float32)
    return scores, rng.integers(1, 9, rows), uids


VERL_STD = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "evolver": {"grpo": {"std": "verl"}}})


@pytest.mark.parametrize("binary", [True, False], ids=["0/1 rewards", "real rewards"])
def test_grpo_with_verl_std_matches_verl_grpo_on_groups_of_two_or_more(binary):
    rng = np.random.default_rng(7 if binary else 11)
    for _ in range(60):
        scores, lengths, uids = random_groups(rng, binary)
        theirs = compute_advantage(outcome_batch(scores, lengths, uids, 8), adv_estimator="grpo")
        ours = compute_advantage(outcome_batch(scores, lengths, uids, 8), adv_estimator="evolver_grpo",
                                 config=VERL_STD)
        a, b = theirs.batch["advantages"], ours.batch["advantages"]
        # veRL accumulates mean and std in float32, we in float64: equal up to a few float32 ulps.
        torch.testing.assert_close(b, a, rtol=4e-6, atol=2e-6)
        assert torch.equal(a == 0, b == 0)  # the same masked and zero-advantage tokens
        assert torch.equal(ours.batch["returns"], b)


def test_dr_grpo_without_std_matches_verl():
    rng = np.random.default_rng(3)
    scores, lengths, uids = random_groups(rng, binary=True)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": False,
                               "evolver": {"grpo": {"std": "verl", "normalize_by_std": False}}})
    theirs = compute_advantage(outcome_batch(scores, lengths, uids, 8), adv_estimator="grpo",
                               norm_adv_by_std_in_grpo=False)
    ours = compute_advantage(outcome_batch(scores, lengths, uids, 8), adv_estimator="evolver_grpo", config=config)
    assert torch.equal(theirs.batch["advantages"], ours.batch["advantages"])


def test_where_our_default_grpo_and_verls_differ():
    # A group of one: veRL uses mean 0, std 1 (the raw score survives); ours (unbiased) gives 0.
    # Epsilon: veRL divides by std + 1e-6, ours by the std itself.
    scores = np.array([1.0, 0.0, 1.0, 0.7], dtype=np.float32)
    uids = np.array(["a", "a", "a", "single"], dtype=object)
    lengths = np.array([3, 3, 3, 3])
    theirs = compute_advantage(outcome_batch(scores, lengths, uids, 4), adv_estimator="grpo").batch["advantages"]
    ours = compute_advantage(outcome_batch(scores, lengths, uids, 4), adv_estimator="evolver_grpo",
                             config=OmegaConf.create({})).batch["advantages"]
    std = np.std([1.0, 0.0, 1.0], ddof=1)
    assert theirs[3, 0].item() == pytest.approx(0.7 / (1 + 1e-6))
    assert ours[3, 0].item() == 0.0
    assert ours[0, 0].item() == pytest.approx((1 - 2 / 3) / std, abs=1e-7)
    assert theirs[0, 0].item() == pytest.approx((1 - 2 / 3) / (std + 1e-6), abs=1e-7)
    assert ours[0, 0].item() != theirs[0, 0].item()


def test_contradicting_std_switches_are_refused():
    scores, lengths, uids = np.array([1.0, 0.0], dtype=np.float32), np.array([2, 2]), np.array(["a", "a"], dtype=object)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": False, "evolver": {"grpo": {"normalize_by_std": True}}})
    with pytest.raises(ValueError, match="norm_adv_by_std_in_grpo"):
        compute_advantage(outcome_batch(scores, lengths, uids, 2), adv_estimator="evolver_grpo", config=config)


def test_adca_through_stock_verl_says_which_trainer_to_use():
    scores, lengths, uids = np.array([1.0, 0.0], dtype=np.float32), np.array([2, 2]), np.array(["a", "a"], dtype=object)
    with pytest.raises(BatchError, match="evolver_sync"):
        compute_advantage(outcome_batch(scores, lengths, uids, 2), adv_estimator="evolver_adca_grpo",
                          config=OmegaConf.create({}))


# ---------------------------------------------------------------- the trainer's advantage step

ROWS = [
    # uid, outcome, per response token step id (-1 = padding), labels per step, anchor keys per step
    ("task-a", 1.0, [0, 0, 0, 1, 1, -1], [1.0, 1.0], ["initial", "obs:x"]),
    ("task-a", 0.0, [0, 0, 1, 1, 1, 1], [1.0, -1.0], ["initial", "obs:y"]),
    ("task-a", 1.0, [0, 1, 1, 2, 2, -1], [-1.0, 1.0, 1.0], ["initial", "obs:x", "obs:z"]),
    ("task-b", 0.0, [0, 0, 0, 0, -1, -1], [-1.0], ["initial"]),
    ("task-b", 1.0, [0, 0, 1, -1, -1, -1], [1.0, 1.0], ["initial", "obs:w"]),
]
# Observation tokens inside a step (mask 0, step id kept): position 2 of rows 0 and 1.
OBSERVATION = {(0, 2), (1, 1)}


def final_reward(row: tuple) -> list[float]:
    """Step rewards as the built-in environments give them: the final score on the last step."""
    return [0.0] * (len(row[3]) - 1) + [row[1]]


def step_batch() -> tuple[DataProto, AdvantageBatch]:
    width = len(ROWS[0][2])
    step_ids = torch.tensor([row[2] for row in ROWS])
    mask = (step_ids >= 0).float()
    for r, t in OBSERVATION:
        mask[r, t] = 0.0
    rm_scores = torch.zeros(len(ROWS), width)
    for i, row in enumerate(ROWS):
        rm_scores[i, int((step_ids[i] >= 0).sum()) - 1] = row[1]
    extras = [{"step_ids": [s for s in row[2] if s >= 0], "step_labels": row[3], "anchor_keys": row[4],
               "num_steps": len(row[3]), "step_rewards": final_reward(row), "experience_flag": i % 2 == 0,
               "task_id": row[0], "trajectory_id": f"traj-{i}", "segment_index": 0} for i, row in enumerate(ROWS)]
    data = DataProto.from_dict(tensors={"rm_scores": rm_scores, "response_mask": mask},
                               non_tensors={"uid": np.array([row[0] for row in ROWS], dtype=object),
                                            **extras_to_non_tensor(extras)})
    expected = AdvantageBatch(response_mask=mask, step_ids=step_ids, outcome=torch.tensor([r[1] for r in ROWS]),
                              group_index=[r[0] for r in ROWS], step_labels=[r[3] for r in ROWS],
                              anchor_keys=[r[4] for r in ROWS], step_rewards=[final_reward(r) for r in ROWS],
                              num_steps=[len(r[3]) for r in ROWS])
    return data, expected


def run_config(estimator: str, settings: dict) -> object:
    return OmegaConf.create({"algorithm": {"adv_estimator": f"evolver_{estimator}", "use_kl_in_reward": False,
                                           "kl_penalty": "kl", "rollout_correction": None,
                                           "evolver": {estimator: settings}}})


@pytest.mark.parametrize(("estimator", "settings", "model"), [
    ("adca_grpo", {"alpha": 0.5, "alpha_schedule": "cosine", "total_steps": 10, "alpha_min": 0.1}, AdcaGrpoConfig),
    ("gigpo", {"step_weight": 0.7, "gamma": 0.9}, GigpoConfig),
])
def test_trainer_advantage_step_equals_advantage_package(estimator, settings, model):
    data, expected_batch = step_batch()
    data, metrics, corrected = evolver_advantage_step(data, run_config(estimator, settings), global_steps=4)
    expected = estimate(estimator, expected_batch, model(**settings), training_step=3).advantages
    assert not corrected and metrics["evolver/trajectories"] == len(ROWS)
    assert torch.equal(data.batch["advantages"], expected)
    assert torch.equal(data.batch["returns"], expected)
    assert torch.equal(data.batch["token_level_rewards"], data.batch["rm_scores"])
    # Step structure really reached the estimator: within row 2, steps differ.
    assert len({round(v, 6) for v in data.batch["advantages"][2, :5].tolist()}) > 1
    assert experience_flag_tensor(data.non_tensor_batch, len(ROWS)).tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]


def test_segments_of_one_trajectory_are_joined_then_split_back():
    """A context-rewriting template makes two rows of one trajectory; the estimator must see one row."""
    data, expected_batch = step_batch()
    # Split row 2 (tokens 0..4, steps 0,1,1,2,2) into segments [0,1,1] and [2,2] as two rows.
    rm = data.batch["rm_scores"]
    mask = data.batch["response_mask"]
    seg_mask = torch.zeros(2, mask.shape[1])
    seg_mask[0, :3], seg_mask[1, :2] = mask[2, :3], mask[2, 3:5]
    seg_rm = torch.zeros(2, mask.shape[1])
    seg_rm[0, 2] = seg_rm[1, 1] = 1.0  # veRL copies the trajectory's reward onto every segment
    rows = [0, 1, 3, 4]
    extras = [{"step_ids": [s for s in ROWS[i][2] if s >= 0], "step_labels": ROWS[i][3], "num_steps": len(ROWS[i][3]),
               "trajectory_id": f"traj-{i}", "segment_index": 0} for i in rows]
    extras += [{"step_ids": [0, 1, 1], "step_labels": ROWS[2][3], "num_steps": 3, "trajectory_id": "traj-2",
                "segment_index": 0},
               {"step_ids": [2, 2], "step_labels": ROWS[2][3], "num_steps": 3, "trajectory_id": "traj-2",
                "segment_index": 1}]
    # Put the second segment first: the order of rows in a batch is not the order of segments.
    order = [0, 1, 5, 2, 3, 4]
    all_mask = torch.cat([mask[rows], seg_mask])[order]
    all_rm = torch.cat([rm[rows], seg_rm])[order]
    uids = np.array([ROWS[i][0] for i in rows] + ["task-a", "task-a"], dtype=object)[order]
    data = DataProto.from_dict(tensors={"rm_scores": all_rm, "response_mask": all_mask},
                               non_tensors={"uid": uids, **extras_to_non_tensor([extras[i] for i in order])})
    settings = {"alpha": 0.3}
    data, metrics, _ = evolver_advantage_step(data, run_config("adca_grpo", settings), global_steps=1)
    expected_batch.anchor_keys = expected_batch.step_rewards = None
    expected = estimate("adca_grpo", expected_batch, AdcaGrpoConfig(**settings)).advantages
    got = data.batch["advantages"]
    assert metrics["evolver/trajectories"] == 5 and metrics["evolver/rows"] == 6
    for out_row, source in zip([0, 1, 3, 4], [0, 1, 3, 4], strict=True):
        assert torch.equal(got[out_row], expected[source])
    assert torch.equal(got[5, :3], expected[2, :3]) and torch.equal(got[2, :2], expected[2, 3:5])
    assert float(got[2, 2:].abs().sum()) == 0.0 and float(got[5, 3:].abs().sum()) == 0.0
