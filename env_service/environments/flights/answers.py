"""Tier-1 answer grading; it lives in `common.answers` so that the task manager grades its synthetic
lookups with the very same function (a synthetic lookup is graded exactly like one of these)."""

from common.answers import amounts, answer_alone, answer_correct, identifiers, passenger_ids

__all__ = ["amounts", "answer_alone", "answer_correct", "identifiers", "passenger_ids"]
