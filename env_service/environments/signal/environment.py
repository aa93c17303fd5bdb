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

`labels` turns the task into a lookup, hard enough for a pretrained model: the query names one label
("Which way does the river point?") and the observation lists `fields` readings ("Wind: down. River:
south. ..."), each a different option, in a seeded order. Every task has its own labels, words and
order, so held-out tasks are new prompts rather than repeats of the training ones. SmolLM2-135M
answers with the first reading it sees about as often as with the asked one (about 0.2 success).

`turns: 1` makes either mode single-turn: the cue (or the readings) follows the query in the first
user message and the agent's first answer is scored. That is the shape a single-turn trainer (TRL's
GRPOTrainer on a prompt dataset) can run too, so `benchmarks/speed/trainer_vs_trl.py` compares on it.
"""

from __future__ import annotations

import copy
import hashlib
import random
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from common.config import StrictModel, validate
from common.schemas import ChatMessage, Split
from env_service.environments.base import EnvInstance, Environment, EvalResult, StepResult

SYSTEM = ("You are playing Signal. First say anything to see the signal. "
          "Then answer with the signal word only.")
QUERY = "Look at the signal, then answer with its word: {choices}."
CUE = "Answer now. The signal is {signal}"
LOOKUP_SYSTEM = ("You are playing Signal. First say anything to see the readings. "
                 "Then answer with the requested word only.")
LOOKUP_QUERY = "Which way does the {label} point? First look, then answer with one word: {choices}."
LOOKUP_CUE = "{signal} Answer now."
# Single-turn wording: nothing to "look" at first, the cue is already in the question.
ONE_TURN_SYSTEM = "You are playing Signal. Answer with the signal word only."
ONE_TURN_QUERY = "Answer with the signal word: {choices}."
ONE_TURN_LOOKUP_SYSTEM = "You are playing Signal. Answer with the requested word only."
ONE_TURN_LOOKUP_QUERY = "Which way does the {label} point? Answer with one word: {choices}."


class SignalConfig(StrictModel):
    options: list[str] = Field(default_factory=lambda: ["north", "south", "east", "west"], min_length=2)
    fallback: Literal["none", "first_char"] = "none"
    system: str | None = Field(default=None, min_length=1, description="None: the mode's default")
    query: str | None = Field(default=None, description="the user turn; {choices} lists the options, "
                                                        "{label} names the asked label (lookup mode)")
    cue: str | None = Field(default=None, description="the first observation; must contain {signal} "
                                                      "(the signal word, or the readings in lookup mode)")
    cue_repeat: int = Field(default=1, ge=1, le=64,
                            description="the signal word shown this many times (a louder cue for tiny models)")
    labels: list[str] = Field(default_factory=list,
                              description="lookup mode: the query asks for one of these labels' readings")
    fields: int = Field(default=4, ge=2, description="lookup mode: readings shown per task")
    turns: Literal[1, 2] = Field(default=2, description="2: look, then answer; 1: the cue is in the question, "
                                                        "the first answer is scored")
    tasks_per_split: dict[str, int] = Field(default_factory=lambda: {"train": 256, "validation": 64, "test": 64})
    seed: int = 0

    @field_validator("options", "labels")
    @classmethod
    def _distinct_words(cls, words: list[str], info: ValidationInfo) -> list[str]:
        cleaned = [w.strip().lower() for w in words]
        if any(not re.fullmatch(r"[a-z]+", w) for w in cleaned) or len(set(cleaned)) != len(cleaned):
            raise ValueError(f"{info.field_name} must be distinct lowercase words, got {words}")
        return cleaned

    @model_validator(mode="after")
    def _mode_defaults(self) -> SignalConfig:
        lookup, one = bool(self.labels), self.turns == 1
        self.system = self.system or {(False, False): SYSTEM, (True, False): LOOKUP_SYSTEM,
                                      (False, True): ONE_TURN_SYSTEM, (True, True): ONE_TURN_LOOKUP_SYSTEM}[lookup, one]
        self.query = self.query or {(False, False): QUERY, (True, False): LOOKUP_QUERY,
                                    (False, True): ONE_TURN_QUERY, (True, True): ONE_TURN_LOOKUP_QUERY}[lookup, one]
        self.cue = self.cue or (LOOKUP_CUE if lookup else CUE)
        if "{signal}" not in self.cue:
            raise ValueError("cue must contain {signal}: the observation has to show the signal")
        if not lookup:
            return self
        if self.fields > min(len(self.labels), len(self.options)):
            raise ValueError(f"fields={self.fields} needs at least that many labels ({len(self.labels)}) "
                             f"and options ({len(self.options)})")
        if "{label}" not in self.query:
            raise ValueError("lookup mode (labels set) needs a query containing {label}: the asked label")
        return self


@dataclass(frozen=True)
class SignalTask:
    signal: str
    label: str = ""
    readings: str = ""  # lookup mode: "Wind: down. River: south. ..."


class SignalInstance(EnvInstance):
    def __init__(self, config: SignalConfig, task: SignalTask, query: str | None) -> None:
        self.config, self.task, self.signal = config, task, task.signal
        self.query = query or config.query.format(choices=", ".join(config.options), label=task.label)
        self.turn = 0
        self.answer: str | None = None
        self.valid = False

    def cue(self) -> str:
        shown = self.task.readings or " ".join([self.signal] * self.config.cue_repeat)
        return self.config.cue.format(signal=shown)

    def reset(self) -> list[ChatMessage]:
        query = self.query if self.config.turns == 2 else f"{self.query}\n{self.cue()}"
        return [ChatMessage(role="system", content=self.config.system), ChatMessage(role="user", content=query)]

    def step(self, action: ChatMessage) -> StepResult:
        self.turn += 1
        if self.turn < self.config.turns:
            return StepResult(observation=ChatMessage(role="user", content=self.cue()))
        if self.turn == self.config.turns:
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
                                "turns": self.turn, **({"label": self.task.label} if self.task.label else {})})

    def state(self) -> dict[str, Any] | None:
        return {"turn": self.turn, "answer": self.answer}

    def fork(self) -> SignalInstance:
        return copy.copy(self)  # what changes is scalars; the config and the task are shared read-only


class SignalEnvironment(Environment):
    name = "signal"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        self.settings = validate(SignalConfig, self.config, root="env_service.environments.signal")
        self._tasks: dict[str, SignalTask] = {}
        self._splits: dict[str, list[str]] = {}
        for split, count in self.settings.tasks_per_split.items():
            # Balanced: signal i % K for the i-th task, in an order shuffled by a seeded hash.
            ids = [f"signal-{split}-{i:04d}" for i in range(count)]
            options = self.settings.options
            order = sorted(range(count), key=lambda i: self._digest(split, i))
            # The asked label is balanced the same way, in an independent order.
            label_rank = {i: rank for rank, i in enumerate(sorted(range(count), key=lambda i: self._digest(split, i, "label")))}
            for rank, i in enumerate(order):
                signal = options[rank % len(options)]
                self._tasks[ids[i]] = (self._lookup_task(signal, label_rank[i], split, i) if self.settings.labels
                                       else SignalTask(signal))
            self._splits[split] = ids

    def _digest(self, split: str, index: int, salt: str = "") -> str:
        return hashlib.sha256(f"{self.settings.seed}:{split}:{index}{salt}".encode()).hexdigest()

    def _lookup_task(self, signal: str, label_rank: int, split: str, index: int) -> SignalTask:
        rng = random.Random(self._digest(split, index))
        asked = self.settings.labels[label_rank % len(self.settings.labels)]
        labels = [asked, *rng.sample([la for la in self.settings.labels if la != asked], self.settings.fields - 1)]
        words = [signal, *rng.sample([o for o in self.settings.options if o != signal], self.settings.fields - 1)]
        shown = list(zip(labels, words, strict=True))
        rng.shuffle(shown)
        readings = " ".join(f"{label.capitalize()}: {word}." for label, word in shown)
        return SignalTask(signal=signal, label=labels[0], readings=readings)

    def task_ids(self, split: Split) -> list[str]:
        return list(self._splits.get(split, []))

    def create(self, task_id: str, params: dict[str, Any] | None = None) -> SignalInstance:
        if task_id not in self._tasks:
            raise KeyError(task_id)
        return SignalInstance(self.settings, self._tasks[task_id], (params or {}).get("query"))

    def capabilities(self) -> dict[str, bool]:
        return {"fork": True, "deterministic": True}  # no randomness at all once the task is chosen

    def profile(self) -> dict[str, Any]:
        background = ("Read the reading of the asked label among several and answer with it." if self.settings.labels
                      else "Remember a signal word shown once and answer with it.")
        return {"name": self.name, "background": background,
                # attrs map an attribute to its description (a string): the task manager's profile schema.
                "entities": [{"name": "signal", "description": "a word shown after the first turn",
                              "attrs": {"options": "one of " + ", ".join(self.settings.options)}, "opts": []}],
                "task_preference": {"num_entities": 1, "num_opts": 1, "relation_difficulty": 1}}
