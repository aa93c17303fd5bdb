"""The collapse detectors: their math on hand-built rollout sets, a replay of a v1 run that collapsed, and a
healthy tiny-model run (real env service over HTTP) that they leave alone under the default thresholds."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from tests.helpers import REPO, run_env_service
from trainer.collapse import CollapseDetector, Replies, main, read_records, replay, step_stats
from trainer.settings import CollapseSettings

V1_COLLAPSE = REPO / "benchmarks/results/ablation/flights/full-seed1-rollouts.jsonl"


def reply(*lengths: int, empty: int = 0, invalid: int = 0, experience: bool = False) -> Replies:
    return Replies(tuple(lengths), empty, invalid, experience)


def healthy(n: int = 4) -> list[Replies]:
    """n rollouts of two replies each, 20 and 40 tokens: median 30, nothing empty or invalid."""
    return [reply(20, 40) for _ in range(n)]


def test_replies_count_each_turns_policy_tokens_and_empty_texts():
    # Turn 0 wrote 3 policy tokens, turn 1 one (an end token alone); mask-0 tokens (observations) do not count.
    r = Replies.of(["search(x)", "  \n"], step_ids=[0, 0, 0, 0, 1, 1], loss_mask=[1, 1, 1, 0, 0, 1], invalid=1,
                   experience=False)
    assert r == Replies((3, 1), empty=1, invalid=1, experience=False)


def test_step_numbers_by_hand():
    stats = step_stats([reply(10, 2, empty=1, invalid=1), reply(6), reply(30, 8, 4, invalid=2)])
    # replies: 10, 2, 6, 30, 8, 4 -> median (6 + 8) / 2; 1 empty and 3 invalid of 6
    assert (stats.rollouts, stats.replies, stats.median_tokens) == (3, 6, 7.0)
    assert stats.empty_share == pytest.approx(1 / 6) and stats.invalid_rate == pytest.approx(3 / 6)
    assert step_stats([reply()]) is None  # a rollout cut before its first reply


def test_each_signal_breaches_at_its_threshold_against_the_first_judged_step():
    settings = CollapseSettings(min_rollouts=4, consecutive=2)  # rises 0.3 / 0.2, shrink 0.3, bloat 3
    detector = CollapseDetector(settings)
    first = detector.observe(1, healthy())
    assert first["collapse/reply_length_ratio"] == 1.0 and first["collapse/breaches"] == 0
    assert detector.baseline_step == 1 and detector.baseline.median_tokens == 30
    cases = {
        # 3 of 8 replies empty: 0.375 >= 0.3 above the baseline's 0
        "empty_replies": [reply(20, 40, empty=1), reply(20, 40, empty=1), reply(20, 40, empty=1), reply(20, 40)],
        # 2 of 8 invalid: 0.25 >= 0.2
        "invalid_actions": [reply(20, 40, invalid=1), reply(20, 40, invalid=1), reply(20, 40), reply(20, 40)],
        "short_replies": [reply(9, 9)] * 4,  # 9 / 30 = 0.3: at the threshold
        "long_replies": [reply(90, 90)] * 4,  # 90 / 30 = 3
    }
    for signal, rollouts in cases.items():
        probe = CollapseDetector(settings)
        probe.observe(1, healthy())
        assert set(probe.breaches(step_stats(rollouts))) == {signal}
    below = {"empty_replies": [reply(20, 40, empty=1), reply(20, 40, empty=1)] + healthy(2),  # 0.25 < 0.3
             "invalid_actions": [reply(20, 40, invalid=1)] + healthy(3),  # 0.125 < 0.2
             "short_replies": [reply(10, 10)] * 4,  # 0.33
             "long_replies": [reply(89, 89)] * 4}  # 2.97
    for rollouts in below.values():
        assert detector.breaches(step_stats(rollouts)) == {}


def test_a_collapse_needs_one_signal_in_consecutive_judged_steps():
    detector = CollapseDetector(CollapseSettings(min_rollouts=4, consecutive=2))
    short, empty = [reply(3, 3)] * 4, [reply(20, 40, empty=2)] * 4
    detector.observe(1, healthy())
    detector.observe(2, short)
    detector.observe(3, empty)  # another signal: the short replies' streak restarts
    assert not detector.collapsed and detector.streaks["short_replies"] == 0
    detector.observe(4, short)
    # Too few rollouts without experience: not judged, and the streak stays where it was.
    quiet = detector.observe(5, [reply(3, 3)] * 3 + [reply(3, 3, experience=True)] * 8)
    assert "collapse/breaches" not in quiet and quiet["collapse/rollouts"] == 3
    assert not detector.collapsed and detector.streaks["short_replies"] == 1
    detector.observe(6, short + [reply(500, 500, experience=True)] * 8)  # rollouts with experience do not count
    assert detector.collapsed
    summary = detector.summary()
    assert (summary["signal"], summary["step"], summary["judged_steps"]) == ("short_replies", 6, 5)
    assert summary["breached_steps"] == {"short_replies": [2, 4, 6], "empty_replies": [3]}
    assert "(4, 6)" in summary["message"] and "0.10 x the baseline's (step 1) 30" in summary["message"]
    # A checkpoint carries the judgement: a resumed detector is the same detector.
    resumed = CollapseDetector(detector.settings)
    resumed.load_state_dict(json.loads(json.dumps(detector.state_dict())))
    assert resumed.summary() == summary


def test_the_baseline_is_the_first_step_with_enough_rollouts_and_disabled_only_logs():
    detector = CollapseDetector(CollapseSettings(min_rollouts=4, enabled=False))
    assert "collapse/reply_length_ratio" not in detector.observe(1, healthy(2))
    for step in (2, 3, 4):
        metrics = detector.observe(step, [reply(1, 1, empty=2)] * 4 if step > 2 else healthy())
    assert detector.baseline_step == 2 and metrics["collapse/reply_length_ratio"] == pytest.approx(1 / 30)
    assert not detector.collapsed and detector.judged_steps == 0


def test_thresholds_are_validated():
    for bad in ({"reply_length_shrink": 0}, {"reply_length_shrink": 1.5}, {"reply_length_bloat": 0.9},
                {"empty_reply_rise": 0}, {"invalid_action_rise": 1.2}, {"min_rollouts": 0}, {"consecutive": 0},
                {"median": 3}):
        with pytest.raises(ValidationError):
            CollapseSettings(**bad)


def test_the_v1_full_seed1_run_is_found_collapsed_by_the_default_thresholds(capsys):
    """benchmarks/results/ablation/flights/full-seed1-rollouts.jsonl: 8 steps of 2 groups of 4, half with a
    demonstration. The 4 rollouts a step without one went from a median reply of 58 tokens to 10 at step 6 and
    15.5 at step 7 (and 2 of 4 empty replies at step 8, where the trainer would no longer be running)."""
    detector, history = replay(read_records(V1_COLLAPSE), CollapseSettings())
    assert detector.collapsed and detector.baseline_step == 1 and detector.baseline.median_tokens == 58
    assert (detector.collapse["signal"], detector.collapse["step"], detector.collapse["steps"]) == (
        "short_replies", 7, [6, 7])
    assert [h["step"] for h in history] == list(range(1, 8))  # judged up to the collapse, where the trainer stops
    assert [h["collapse/breaches"] for h in history] == [0, 0, 0, 0, 0, 1, 1]
    assert all(h["collapse/rollouts"] == 4 for h in history)
    # Replayed past it with the length signal off, the empty replies of step 8 breach too.
    _, rest = replay(read_records(V1_COLLAPSE), CollapseSettings(reply_length_shrink=0.01))
    assert rest[-1]["step"] == 8 and rest[-1]["collapse/empty_reply_share"] == 0.5
    # The command line gives the same verdict, exit 4.
    assert main([str(V1_COLLAPSE)]) == 4
    printed = json.loads(capsys.readouterr().out)
    assert printed["collapsed"] and printed["signal"] == "short_replies" and printed["step"] == 7


ENV_YAML = "env_service:\n  environments:\n    signal: {fallback: first_char}\n"


@pytest.mark.slow
def test_a_healthy_tiny_run_is_not_stopped_and_logs_kl_and_the_detectors_every_step(tmp_path):
    """The tiny model trained for 3 steps against the real env service under the default thresholds; with a KL
    term its per-step KL to the frozen reference is in the metrics too."""
    from trainer.config import TrainerConfig
    from trainer.local import LocalTrainer

    with run_env_service(ENV_YAML, tmp_path) as env:
        config = TrainerConfig.model_validate({
            "model": "tiny", "seed": 0, "steps": 3, "tasks_per_step": 2, "output_dir": str(tmp_path / "run"),
            "torch_threads": 1, "progress": False, "tensorboard": False, "plot": False,
            "rollout": {"env": "signal", "n": 4, "max_turns": 2, "max_new_tokens": 6, "max_context": 256},
            "optim": {"lr": 1e-3, "minibatches": 1}, "loss": {"kl_coef": 0.05}, "services": {"env_url": env.url},
            "eval": {"before": False, "after": False}, "ray": {"enabled": False}})
        result = asyncio.run(LocalTrainer(config).run())
    assert result["status"] == "finished" and result["steps"] == 3
    collapse = result["collapse"]
    assert not collapse["collapsed"] and collapse["judged_steps"] == 3 and collapse["baseline_step"] == 1
    steps = [r for r in result["history"] if r["step"] > 0]
    assert all(r["collapse/rollouts"] == 8 and r["collapse/breaches"] == 0 for r in steps)
    # The first update starts at the reference (KL 0); the weights then move away from it.
    kl = [r["update/kl"] for r in steps]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[2] > 0
    on_disk = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["update/kl"] for r in on_disk if r["step"] > 0] == kl
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["status"] == "finished" and written["collapse"]["thresholds"] == CollapseSettings().model_dump()
