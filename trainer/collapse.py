"""Collapse detectors: stop a run whose policy degenerated, judged on the rollouts without injected experience.

Three collapses ended the v1 flights ablation's runs: the empty reply, token soup (invalid actions) and prose
(ever longer replies). Every step, the rollouts generated without injected experience (the policy on its own)
give three numbers over their replies (assistant turns):
- the share of empty replies,
- the share of steps the environment called invalid (the invalid-action rate),
- the median reply length in policy tokens (the loss-mask tokens of one turn),
and each is compared with the baseline's: the first step with at least `min_rollouts` such rollouts. A signal
breaches when it reaches its threshold (`CollapseSettings`): `empty_replies` and `invalid_actions` on a rise
of the share, `short_replies` and `long_replies` on the ratio of the medians. One signal breaching in
`consecutive` judged steps in a row is a collapse: the trainer writes its summary saying so and exits 4.

`replay` runs the same judgement over recorded rollouts (`<output_dir>/rollouts/` shards, or any JSONL of
rollout records); `python -m trainer.collapse FILE_OR_DIR` prints its verdict as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainer.settings import CollapseSettings

SIGNALS = ("empty_replies", "invalid_actions", "short_replies", "long_replies")
COLLAPSED_EXIT = 4  # the trainer's exit code; the launcher exits with it and does not restart the trainer
_EPS = 1e-9  # a share or ratio computed to exactly its threshold reaches it despite rounding


class RunCollapsed(RuntimeError):
    """The run collapsed: the message names the signal, the steps and the numbers."""


@dataclass(frozen=True)
class Replies:
    """One rollout's replies: each one's length in policy tokens, how many were empty (blank), how many steps the
    environment called invalid, and whether the rollout saw injected experience."""

    lengths: tuple[int, ...]
    empty: int
    invalid: int
    experience: bool = False

    @classmethod
    def of(cls, actions: Sequence[str], step_ids: Sequence[int], loss_mask: Sequence[int], invalid: int,
           experience: bool) -> Replies:
        """`actions`: the reply texts in turn order (turn i wrote the response tokens with step id i)."""
        tokens = Counter(s for s, m in zip(step_ids, loss_mask, strict=True) if m)
        return cls(tuple(tokens.get(turn, 0) for turn in range(len(actions))),
                   sum(1 for a in actions if not a.strip()), int(invalid), bool(experience))


def replies_of_trajectory(trajectory: Any, invalid_steps: int) -> Replies:
    """A finished episode's replies (`trainer.rollout.Rollout`: its trajectory and invalid-step count)."""
    return Replies.of([s.action.text() for s in trajectory.steps], trajectory.step_ids, trajectory.loss_mask,
                      invalid_steps, trajectory.experience_flag)


def replies_of_record(record: dict[str, Any]) -> Replies:
    """A rollout record's replies (`trainer.records.rollout_record`)."""
    return Replies.of([s["action"].get("content") or "" for s in record["steps"]], record["step_ids"],
                      record["loss_mask"], record["invalid_steps"], record["experience_flag"])


@dataclass(frozen=True)
class StepStats:
    rollouts: int
    replies: int
    empty_share: float
    invalid_rate: float
    median_tokens: float


def step_stats(rollouts: Sequence[Replies]) -> StepStats | None:
    """The three numbers over every reply of `rollouts`; None when they have no reply."""
    lengths = [n for r in rollouts for n in r.lengths]
    if not lengths:
        return None
    return StepStats(rollouts=len(rollouts), replies=len(lengths),
                     empty_share=sum(r.empty for r in rollouts) / len(lengths),
                     invalid_rate=sum(r.invalid for r in rollouts) / len(lengths),
                     median_tokens=float(statistics.median(lengths)))


class CollapseDetector:
    """Judges each step against the baseline and keeps, per signal, how many judged steps in a row breached."""

    def __init__(self, settings: CollapseSettings) -> None:
        self.settings = settings
        self.baseline: StepStats | None = None
        self.baseline_step: int | None = None
        self.judged_steps = 0
        self.streaks = dict.fromkeys(SIGNALS, 0)
        self.breached_steps: dict[str, list[int]] = {s: [] for s in SIGNALS}
        self.collapse: dict[str, Any] | None = None

    def length_ratio(self, stats: StepStats) -> float | None:
        if self.baseline is None or self.baseline.median_tokens <= 0:
            return None
        return stats.median_tokens / self.baseline.median_tokens

    def breaches(self, stats: StepStats) -> dict[str, str]:
        """Signal -> what reached its threshold, for the signals `stats` breaches against the baseline."""
        base, s = self.baseline, self.settings
        assert base is not None
        where = f"the baseline's (step {self.baseline_step})"
        out = {}
        if stats.empty_share - base.empty_share >= s.empty_reply_rise - _EPS:
            out["empty_replies"] = (f"empty replies {stats.empty_share:.2f} against {base.empty_share:.2f} in {where}"
                                    f" (a rise of at least {s.empty_reply_rise})")
        if stats.invalid_rate - base.invalid_rate >= s.invalid_action_rise - _EPS:
            out["invalid_actions"] = (f"invalid-action rate {stats.invalid_rate:.2f} against {base.invalid_rate:.2f}"
                                      f" in {where} (a rise of at least {s.invalid_action_rise})")
        ratio = self.length_ratio(stats)
        if ratio is not None:
            lengths = f"median reply {stats.median_tokens:g} tokens, {ratio:.2f} x {where} {base.median_tokens:g}"
            if ratio <= s.reply_length_shrink + _EPS:
                out["short_replies"] = f"{lengths} (at most {s.reply_length_shrink} x)"
            if ratio >= s.reply_length_bloat - _EPS:
                out["long_replies"] = f"{lengths} (at least {s.reply_length_bloat} x)"
        return out

    def observe(self, step: int, rollouts: Sequence[Replies]) -> dict[str, float]:
        """Judge training step `step` (1-based) on its rollouts; returns its `collapse/` metrics.

        The numbers are logged whenever the step has rollouts without experience; the step is judged when it
        has at least `min_rollouts` of them, the detector is enabled and the run has not collapsed yet.
        """
        plain = [r for r in rollouts if not r.experience]
        metrics = {"collapse/rollouts": float(len(plain))}
        stats = step_stats(plain)
        if stats is None:
            return metrics
        metrics.update({"collapse/empty_reply_share": stats.empty_share,
                        "collapse/invalid_action_rate": stats.invalid_rate,
                        "collapse/median_reply_tokens": stats.median_tokens})
        if len(plain) < self.settings.min_rollouts:
            return metrics
        if self.baseline is None:
            self.baseline, self.baseline_step = stats, step
        ratio = self.length_ratio(stats)
        if ratio is not None:
            metrics["collapse/reply_length_ratio"] = ratio
        if not self.settings.enabled or self.collapse is not None:
            return metrics
        self.judged_steps += 1
        found = self.breaches(stats)
        for signal in SIGNALS:
            self.streaks[signal] = self.streaks[signal] + 1 if signal in found else 0
            if signal in found:
                self.breached_steps[signal].append(step)
        metrics["collapse/breaches"] = float(len(found))
        signal = next((s for s in SIGNALS if self.streaks[s] >= self.settings.consecutive), None)
        if signal is not None:
            steps = self.breached_steps[signal][-self.settings.consecutive:]
            self.collapse = {"signal": signal, "step": step, "steps": steps,
                             "message": f"collapsed: {signal} breached in {len(steps)} judged steps in a row "
                                        f"({', '.join(map(str, steps))}); at step {step}: {found[signal]}"}
        return metrics

    @property
    def collapsed(self) -> bool:
        return self.collapse is not None

    def summary(self) -> dict[str, Any]:
        """For summary.json: whether and how the run collapsed, the baseline, and which steps breached what."""
        return {"enabled": self.settings.enabled, "collapsed": self.collapsed,
                "signal": self.collapse["signal"] if self.collapse else None,
                "step": self.collapse["step"] if self.collapse else None,
                "message": self.collapse["message"] if self.collapse else None,
                "judged_steps": self.judged_steps, "baseline_step": self.baseline_step,
                "baseline": asdict(self.baseline) if self.baseline else None,
                "breached_steps": {s: steps for s, steps in self.breached_steps.items() if steps},
                "thresholds": self.settings.model_dump()}

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": asdict(self.baseline) if self.baseline else None, "baseline_step": self.baseline_step,
                "judged_steps": self.judged_steps, "streaks": dict(self.streaks),
                "breached_steps": {s: list(v) for s, v in self.breached_steps.items()}, "collapse": self.collapse}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline = StepStats(**state["baseline"]) if state.get("baseline") else None
        self.baseline_step = state.get("baseline_step")
        self.judged_steps = int(state.get("judged_steps", 0))
        self.streaks = {s: int(state.get("streaks", {}).get(s, 0)) for s in SIGNALS}
        self.breached_steps = {s: list(state.get("breached_steps", {}).get(s, [])) for s in SIGNALS}
        self.collapse = state.get("collapse")


def replay(records: Iterable[dict[str, Any]], settings: CollapseSettings) -> tuple[CollapseDetector, list[dict]]:
    """The trainer's judgement over recorded rollouts, step by step, up to a collapse (where the trainer stops).
    Returns the detector and each observed step's metrics (with its `step`)."""
    by_step: dict[int, list[Replies]] = {}
    for record in records:
        by_step.setdefault(int(record["step"]), []).append(replies_of_record(record))
    detector, history = CollapseDetector(settings), []
    for step in sorted(by_step):
        history.append({"step": step, **detector.observe(step, by_step[step])})
        if detector.collapsed:
            break
    return detector, history


def read_records(path: Path) -> list[dict[str, Any]]:
    """Rollout records from a JSONL file, or from a run's rollouts folder (its shards, oldest first)."""
    files = [path] if path.is_file() else sorted(path.glob("shard-*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{path}: neither a JSONL file nor a folder of rollout shards (shard-*.jsonl)")
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.collapse", description=__doc__.splitlines()[0])
    parser.add_argument("rollouts", type=Path, help="a JSONL of rollout records, or <output_dir>/rollouts")
    parser.add_argument("overrides", nargs="*", help="thresholds as key=value, e.g. min_rollouts=8")
    args = parser.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        parser.error(f"overrides are key=value, got {bad[0]!r}")
    try:
        settings = CollapseSettings.model_validate(dict(o.split("=", 1) for o in args.overrides))
        records = read_records(args.rollouts)
    except (ValueError, FileNotFoundError) as exc:
        print(f"trainer.collapse: {exc}", file=sys.stderr)
        return 2
    detector, history = replay(records, settings)
    print(json.dumps({**detector.summary(), "steps": history}))
    return COLLAPSED_EXIT if detector.collapsed else 0


if __name__ == "__main__":
    sys.exit(main())
