"""`signal`: the smallest environment whose reward depends on what an earlier observation said.

Episode: the user asks the agent to look; whatever the agent says first, the environment answers
with the task's signal word (one of `options`, shown `cue_repeat` times at the observation's end);
the agent's second turn is read as its answer and scores 1 when it names the signal. A policy that
ignores the cue scores exactly 1/len(options) in expectation (signals are balanced over a split),
which makes "chance" a known number.

`fallback: first_char` makes every answer count: an answer naming no option is read by its first
character, as the option starting with that letter, else option `ord(char) % len(options)`. That
keeps a random-initialised model at chance instead of at zero, so reinforcement learning has a
signal to climb from; with `fallback: none` (the default) such an answer is invalid and scores 0.

The wording (`system`, `query`, `cue`) is configurable: a tiny random-initialised model learns to
read the cue in a few dozen steps only when the context is short and the cue is loud (repeated),
because attention at initialisation is nearly uniform over the context.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from pydantic import Field, field_validator

from common.config import StrictModel, validate
from common.schemas import ChatMessage, Split
from env_service.environments.base import EnvInstance, Environment, EvalResult, StepResult

SYSTEM = ("You are playing Signal. First say anything to see the signal. "
          "Then answer with the signal word only.")
QUERY = "Look at the signal, then answer with its word: {choices}."
CUE = "Answer now. The signal is {signal}"


class SignalConfig(StrictModel):
    options: list[str] = Field(default_factory=lambda: ["north", "south", "east", "west"], min_length=2)
    fallback: Literal["none", "first_char"] = "none"
    system: str = Field(default=SYSTEM, min_length=1)
    query: str = Field(default=QUERY, description="the user turn; {choices} lists the options")
    cue: str = Field(default=CUE, description="the first observation; must contain {signal}")
    cue_repeat: int = Field(default=1, ge=1, le=64,
                            description="the signal word shown this many times (a louder cue for tiny models)")
    tasks_per_split: dict[str, int] = Field(default_factory=lambda: {"train": 256, "validation": 64, "test": 64})
    seed: int = 0

    @field_validator("options")
    @classmethod
    def _distinct_words(cls, options: list[str]) -> list[str]:
        cleaned = [o.strip().lower() for o in options]
        if any(not re.fullmatch(r"[a-z]+", o) for o in cleaned) or len(set(cleaned)) != len(cleaned):
            raise ValueError(f"options must be distinct lowercase words, got {options}")
        return cleaned

    @field_validator("cue")
    @classmethod
    def _cue_shows_signal(cls, cue: str) -> str:
        if "{signal}" not in cue:
            raise ValueError("cue must contain {signal}: the observation has to show the signal")
        return cue


class SignalInstance(EnvInstance):
    def __init__(self, config: SignalConfig, signal: str, query: str | None) -> None:
        self.config, self.signal = config, signal
        self.query = query or config.query.format(choices=", ".join(config.options))
        self.turn = 0
        self.answer: str | None = None
        self.valid = False

    def reset(self) -> list[ChatMessage]:
        return [ChatMessage(role="system", content=self.config.system), ChatMessage(role="user", content=self.query)]

    def step(self, action: ChatMessage) -> StepResult:
        self.turn += 1
        if self.turn == 1:
            return StepResult(observation=ChatMessage(role="user", content=self.config.cue.format(signal=" ".join([self.signal] * self.config.cue_repeat))))
        if self.turn == 2:
            self.answer, self.valid = self._read_answer(action.text())
            correct = self.answer == self.signal
            text = "Correct." if correct else f"Wrong: the signal was {self.signal}."
            return StepResult(observation=ChatMessage(role="user", content=text), reward=float(correct), done=True,
                              info={"answer": self.answer, "valid": self.valid})
        return StepResult(observation=ChatMessage(role="user", content="The episode is over."), done=True,
                          info={"error": "episode already finished"})

    def _read_answer(self, text: str) -> tuple[str | None, bool]:
        lowered = text.lower()
        named = [(m.start(), o) for o in self.config.options for m in [re.search(rf"\b{o}\b", lowered)] if m]
        if named:
            return min(named)[1], True
        stripped = text.strip()
        if self.config.fallback == "first_char" and stripped:
            first = stripped[0].lower()
            by_letter = next((o for o in self.config.options if o.startswith(first)), None)
            return by_letter or self.config.options[ord(first) % len(self.config.options)], False
        return None, False

    def evaluate(self, params: dict[str, Any] | None = None) -> EvalResult:
        return EvalResult(score=float(self.answer == self.signal),
                          info={"answer": self.answer, "signal": self.signal, "valid": self.valid,
                                "turns": self.turn})

    def state(self) -> dict[str, Any] | None:
        return {"turn": self.turn, "answer": self.answer}


class SignalEnvironment(Environment):
    name = "signal"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        self.settings = validate(SignalConfig, self.config, root="signal")
        self._signals: dict[str, str] = {}
        self._splits: dict[str, list[str]] = {}
        for split, count in self.settings.tasks_per_split.items():
            # Balanced: signal i % K for the i-th task, in an order shuffled by a seeded hash.
            ids = [f"signal-{split}-{i:04d}" for i in range(count)]
            options = self.settings.options
            order = sorted(range(count), key=lambda i: hashlib.sha256(f"{self.settings.seed}:{split}:{i}".encode())
                           .hexdigest())
            for rank, i in enumerate(order):
                self._signals[ids[i]] = options[rank % len(options)]
            self._splits[split] = ids

    def task_ids(self, split: Split) -> list[str]:
        return list(self._splits.get(split, []))

    def create(self, task_id: str, params: dict[str, Any] | None = None) -> SignalInstance:
        if task_id not in self._signals:
            raise KeyError(task_id)
        return SignalInstance(self.settings, self._signals[task_id], (params or {}).get("query"))

    def profile(self) -> dict[str, Any]:
        return {"name": self.name, "background": "Remember a signal word shown once and answer with it.",
                "entities": [{"name": "signal", "description": "a word shown after the first turn",
                              "attrs": {"options": self.settings.options}, "opts": []}],
                "task_preference": {"num_entities": 1, "num_opts": 1, "relation_difficulty": 1}}
