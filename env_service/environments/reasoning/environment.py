"""reasoning-gym datasets as episodes: one question, answered once (or, with `attempts: N`, up to N
times with feedback), scored by the dataset's own `score_answer`."""

from __future__ import annotations

import re
from typing import Any

from common.schemas import Split
from env_service.environments.textgames import Parsed, SuiteEnvironment, TextGameInstance, Turn
from env_service.environments.textgames.parse import candidate

_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL | re.IGNORECASE)
_LABELLED = re.compile(r"(?:final answer|answer)\**\s*[:=]", re.IGNORECASE)
SOLVED = 1.0  # score_answer gives partial credit; only a full score counts as success


class ReasoningInstance(TextGameInstance):
    def __init__(self, lib: Any, env_id: str, seed: int, query: str | None, attempts: int) -> None:
        super().__init__(env_id, seed, query, attempts)
        self.lib = lib
        self.dataset: Any = None
        self.entry: dict[str, Any] = {}
        self.best = 0.0
        self.answers: list[str] = []

    def start(self) -> tuple[str, str]:
        if self.dataset is None:
            self.dataset = self.lib.create_dataset(self.env_id, size=1, seed=self.seed)
            self.entry = self.dataset[0]
        self.best, self.answers = 0.0, []
        tries = "one answer" if self.max_turns == 1 else f"up to {self.max_turns} answers; you are told if one is wrong"
        system = ("Solve the problem. Think briefly, then end your reply with 'Answer: <your answer>' "
                  f"(or <answer>...</answer>). You may give {tries}.")
        return system, str(self.entry["question"])

    def parse(self, text: str) -> Parsed[str]:
        tagged = _ANSWER_TAG.findall(text)
        if tagged and tagged[-1].strip():
            return Parsed(tagged[-1].strip(), "exact", tagged[-1])
        if _LABELLED.search(text):
            answer = candidate(text)
            return Parsed(answer, "exact", answer) if answer else Parsed(None, "invalid")
        # No label: the last non-empty line is taken as the answer, and counted as mapped.
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        return Parsed(lines[-1], "mapped", lines[-1]) if lines else Parsed(None, "invalid")

    def apply(self, action: str) -> Turn:
        score = float(self.dataset.score_answer(action, self.entry))
        self.answers.append(action)
        self.best = max(self.best, score)
        solved = score >= SOLVED
        if solved:
            observation = "Correct."
        elif len(self.answers) < self.max_turns:
            observation = "That answer is not correct. Try again."
        else:
            observation = "That answer is not correct."
        return Turn(observation, score, solved, info={"score": score})

    def success(self) -> bool:
        return self.best >= SOLVED

    def invalid_hint(self) -> str:
        return "No answer found. End your reply with 'Answer: <your answer>'."

    def snapshot(self) -> dict[str, Any]:
        return {"answers": self.answers, "best_score": self.best}


class ReasoningGymEnvironment(SuiteEnvironment):
    name = "reasoning_gym"
    module = "reasoning_gym"
    distribution = "reasoning-gym"
    default_envs = ("basic_arithmetic", "letter_counting")
    default_max_turns = 1
    extra_keys = frozenset({"attempts"})
    background = "reasoning-gym procedural reasoning tasks with exact verifiers."

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        if "attempts" in config:  # attempts is the user-facing name of max_turns here
            config["max_turns"] = config.pop("attempts")
        super().__init__(config)

    def check_env_id(self, env_id: str) -> str:
        from reasoning_gym.factory import DATASETS

        if env_id not in DATASETS:
            raise ValueError(f"reasoning_gym.envs: {env_id!r} is not a reasoning-gym dataset; known ones include "
                             f"{', '.join(sorted(DATASETS)[:10])} ... ({len(DATASETS)} in all)")
        return env_id

    def instance(self, env_id: str, split: Split, seed: int, query: str | None) -> ReasoningInstance:
        return ReasoningInstance(self.lib, env_id, seed, query, self.max_turns)
