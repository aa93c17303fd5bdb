"""Reading `Step i Judgment: GOOD|BAD` out of the judge's text and reconciling it to one label per step."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from common.schemas import StepLabel
from judge.schemas import MAX_REASON_CHARS

Label = Literal["GOOD", "BAD"]

# Tolerates markdown (`**Step 0 Judgment:** GOOD`), missing colons and case; a template echo such as
# `GOOD/BAD` or `GOOD or BAD` is not a judgment.
_JUDGMENT = re.compile(r"step\W{0,8}(\d+)\W{0,8}judge?ment\W{0,8}(good|bad)\b(?!\s*(?:/|or\b)\s*(?:good|bad))",
                       re.IGNORECASE)
_ANALYSIS = re.compile(r"step\W{0,8}(\d+)\W{0,8}analysis\W{0,8}([^\n]*)", re.IGNORECASE)


@dataclass
class ParsedOutput:
    """What one LLM answer says, by step index as written (before renumbering)."""

    labels: dict[int, Label] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    duplicates: list[int] = field(default_factory=list)


def parse_judgments(text: str) -> ParsedOutput:
    out = ParsedOutput()
    for match in _JUDGMENT.finditer(text):
        step, label = int(match.group(1)), match.group(2).upper()
        if step in out.labels:
            out.duplicates.append(step)  # the first judgment of a step wins
            continue
        out.labels[step] = label  # type: ignore[assignment]
    for match in _ANALYSIS.finditer(text):
        step = int(match.group(1))
        reason = match.group(2).strip().strip("*").strip()
        if step not in out.reasons and reason:
            out.reasons[step] = reason[:MAX_REASON_CHARS]
    return out


@dataclass
class Reconciled:
    """Labels for steps 0..K-1 as far as the output gives them, with notes on every adjustment."""

    labels: dict[int, Label]
    reasons: dict[int, str]
    notes: list[str]

    @property
    def parsed(self) -> int:
        return len(self.labels)


def reconcile(parsed: ParsedOutput, steps: int) -> Reconciled:
    """Map the written step numbers onto 0..K-1: accept 1-based numbering, drop steps beyond the last."""
    labels, reasons, notes = dict(parsed.labels), dict(parsed.reasons), []
    if labels and 0 not in labels and max(labels) == steps and min(labels) >= 1:
        labels = {k - 1: v for k, v in labels.items()}
        reasons = {k - 1: v for k, v in reasons.items()}
        notes.append("steps were numbered from 1; shifted to 0-based")
    extra = sorted(k for k in labels if k >= steps)
    if extra:
        notes.append(f"dropped judgments for steps {extra}, beyond the last step {steps - 1}")
        labels = {k: v for k, v in labels.items() if k < steps}
    if parsed.duplicates:
        notes.append(f"steps {sorted(set(parsed.duplicates))} were judged more than once; kept the first")
    return Reconciled(labels, {k: v for k, v in reasons.items() if k < steps}, notes)


def complete_labels(reconciled: Reconciled, steps: int, success: bool) -> tuple[list[StepLabel], list[int], list[str]]:
    """One label per step: missing steps get the outcome's sign (GOOD on success, BAD on failure)."""
    fill: Label = "GOOD" if success else "BAD"
    missing = [t for t in range(steps) if t not in reconciled.labels]
    notes = list(reconciled.notes)
    if missing:
        notes.append(f"steps {missing} had no judgment; filled with {fill} (the outcome's sign: "
                     f"{'success' if success else 'failure'})")
    labels = [StepLabel(step=t, label=reconciled.labels.get(t, fill),
                        reason=reconciled.reasons.get(t, "") if t in reconciled.labels
                        else "filled: no judgment for this step")
              for t in range(steps)]
    return labels, missing, notes
