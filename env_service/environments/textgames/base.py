"""The shape every suite adapter and text world shares.

Task ids are `<env id>/<split>-<index>` (e.g. `game:Sokoban-v0-easy/test-0003`); a task is a seed,
and the splits use disjoint seed ranges so train, validation and test never share a generated game.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from common.schemas import ChatMessage, Split
from env_service.environments.base import SPLITS, EnvInstance, Environment, EvalResult, StepResult
from env_service.environments.textgames.packages import package_version, require_package
from env_service.environments.textgames.parse import Parsed

SPLIT_SEED_BASE: dict[str, int] = {"train": 0, "validation": 100_000, "test": 200_000}
DEFAULT_SPLITS: dict[str, int] = {"train": 100, "validation": 20, "test": 64}


class TaskSplits:
    """Seeded task ids per environment id and split."""

    def __init__(self, env_ids: list[str], sizes: dict[str, Any] | None) -> None:
        merged = {**DEFAULT_SPLITS, **(sizes or {})}
        unknown = sorted(set(merged) - set(SPLITS))
        if unknown:
            raise ValueError(f"splits: unknown split(s) {', '.join(unknown)}; allowed: {', '.join(SPLITS)}")
        self.env_ids = list(env_ids)
        self.sizes = {s: int(merged[s]) for s in SPLITS}
        if any(n < 0 or n > 100_000 for n in self.sizes.values()):
            raise ValueError(f"splits: sizes must be between 0 and 100000, got {self.sizes}")

    def ids(self, split: Split) -> list[str]:
        return [f"{env_id}/{split}-{i:04d}" for env_id in self.env_ids for i in range(self.sizes[split])]

    def parse(self, task_id: str) -> tuple[str, Split, int]:
        """(env id, split, seed) of a task id; KeyError naming the expected shape otherwise."""
        env_id, _, rest = task_id.rpartition("/")
        split, _, index = rest.partition("-")
        if env_id not in self.env_ids or split not in self.sizes or not index.isdigit() \
                or int(index) >= self.sizes[split] or rest != f"{split}-{int(index):04d}":
            example = f"{self.env_ids[0]}/train-0000" if self.env_ids else "<env id>/train-0000"
            raise KeyError(f"no task {task_id!r}; ids look like {example} (env ids: {', '.join(self.env_ids)})")
        return env_id, split, SPLIT_SEED_BASE[split] + int(index)  # type: ignore[return-value]


def seed_and_query(params: dict[str, Any] | None, seed: int) -> tuple[int, str | None]:
    """The episode seed (`params.seed` overrides the task's) and the replacement query, validated."""
    params = params or {}
    if "seed" in params:
        if not isinstance(params["seed"], int) or isinstance(params["seed"], bool):
            raise ValueError("params.seed must be an integer")
        seed = params["seed"]
    query = params.get("query")
    if query is not None and (not isinstance(query, str) or not query.strip()):
        raise ValueError("params.query must be a non-empty string")
    return seed, query


@dataclass
class Turn:
    """What a suite's engine answered to one parsed action."""

    observation: str
    reward: float = 0.0
    done: bool = False
    invalid: bool = False  # the engine itself rejected the action (counted beside our parse failures)
    info: dict[str, Any] = field(default_factory=dict)


class TextGameInstance(EnvInstance):
    """One episode: parse the reply, apply it, count exact/mapped/invalid actions, end at max_turns."""

    def __init__(self, env_id: str, seed: int, query: str | None, max_turns: int) -> None:
        self.env_id, self.seed, self.query, self.max_turns = env_id, seed, query, max_turns
        self.turns = self.mapped = self.invalid = 0
        self.total_reward = 0.0
        self.done = False

    # ------------------------------------------------------------------ what a suite implements
    @abstractmethod
    def start(self) -> tuple[str, str]:
        """Start the engine; (system prompt, first observation)."""

    @abstractmethod
    def parse(self, text: str) -> Parsed[Any]:
        """The action in a reply (see parse.py)."""

    @abstractmethod
    def apply(self, action: Any) -> Turn:
        """Apply a parsed action to the engine."""

    @abstractmethod
    def success(self) -> bool:
        """Whether the episode so far solved the task."""

    def invalid_hint(self) -> str:
        return "Invalid action: no action found in your reply. Reply with one action, e.g. 'Action: <action>'."

    def snapshot(self) -> dict[str, Any] | None:
        return None

    def valid_actions(self) -> list[str] | None:
        """The commands the engine accepts now, where it lists them (None: it does not). Published in the
        state as `valid_actions`: the task manager's random explorer picks among them."""
        return None

    # ------------------------------------------------------------------ the EnvInstance contract
    def reset(self) -> list[ChatMessage]:
        self.turns = self.mapped = self.invalid = 0
        self.total_reward, self.done = 0.0, False
        system, first = self.start()
        if self.query:
            first = f"{self.query}\n\n{first}"
        return [ChatMessage(role="system", content=system), ChatMessage(role="user", content=first)]

    def step(self, action: ChatMessage) -> StepResult:
        if self.done:
            return StepResult(observation=ChatMessage(role="user", content="The episode is over."), done=True,
                              info={"error": "episode_over"})
        self.turns += 1
        parsed = self.parse(action.text())
        if parsed.action is None:
            # Unusable replies still use up turns, so an agent that never acts still ends.
            self.invalid += 1
            self.done = self.turns >= self.max_turns
            return StepResult(observation=ChatMessage(role="user", content=self.invalid_hint()), done=self.done,
                              info={"error": "invalid_action", "action_kind": "invalid", "turns": self.turns})
        self.mapped += parsed.kind == "mapped"
        turn = self.apply(parsed.action)
        self.invalid += turn.invalid
        self.total_reward += turn.reward
        self.done = turn.done or self.turns >= self.max_turns
        observation = turn.observation
        if self.done:
            observation += "\nThe episode is over: " + ("success." if self.success() else "not solved.")
        info: dict[str, Any] = {"action": parsed.action if isinstance(parsed.action, (str, int)) else str(parsed.action),
                                "action_kind": parsed.kind, "mapped": parsed.kind == "mapped", "turns": self.turns,
                                **turn.info}
        if turn.invalid:
            info["error"] = "invalid_action"
        return StepResult(observation=ChatMessage(role="user", content=observation), reward=turn.reward,
                          done=self.done, info=info)

    def evaluate(self, params: dict[str, Any] | None = None) -> EvalResult:
        turns = max(self.turns, 1)
        return EvalResult(score=1.0 if self.success() else 0.0,
                          info={"env_id": self.env_id, "seed": self.seed, "turns": self.turns, "done": self.done,
                                "total_reward": self.total_reward, "mapped_actions": self.mapped,
                                "invalid_actions": self.invalid, "mapped_action_rate": self.mapped / turns,
                                "invalid_action_rate": self.invalid / turns})

    def state(self) -> dict[str, Any] | None:
        snapshot = self.snapshot()
        if snapshot is None:
            return None
        actions = self.valid_actions()
        return {"env_id": self.env_id, "seed": self.seed, **snapshot,
                **({"valid_actions": actions} if actions is not None else {})}


class SuiteEnvironment(Environment):
    """An environment over one package's catalogue: any of its env ids is selected in the YAML."""

    module: ClassVar[str]  # the import name, e.g. "gem"
    distribution: ClassVar[str]  # the PyPI name, e.g. "gem-llm"
    default_envs: ClassVar[tuple[str, ...]]
    default_max_turns: ClassVar[int] = 20
    extra_keys: ClassVar[frozenset[str]] = frozenset()
    background: ClassVar[str] = ""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        allowed = {"envs", "splits", "max_turns", *self.extra_keys}
        unknown = sorted(set(self.config) - allowed)
        if unknown:
            raise ValueError(f"unknown {self.name} config key(s) {', '.join(unknown)}; allowed: "
                             f"{', '.join(sorted(allowed))}")
        self.lib = require_package(self.module, self.distribution, self.name)
        envs = self.config.get("envs", self.default_envs)
        if isinstance(envs, str) or not envs:
            raise ValueError(f"{self.name}.envs must be a non-empty list of environment ids")
        self.env_ids = [self.check_env_id(str(e)) for e in envs]
        self.splits = TaskSplits(self.env_ids, self.config.get("splits"))
        self.max_turns = int(self.config.get("max_turns", self.default_max_turns))
        if self.max_turns < 1:
            raise ValueError(f"{self.name}.max_turns must be at least 1")

    @abstractmethod
    def check_env_id(self, env_id: str) -> str:
        """The id if the suite knows it; ValueError naming some valid ids otherwise."""

    @abstractmethod
    def instance(self, env_id: str, split: Split, seed: int, query: str | None) -> TextGameInstance:
        """A new (not yet reset) episode."""

    def task_ids(self, split: Split) -> list[str]:
        return self.splits.ids(split)

    def create(self, task_id: str, params: dict[str, Any] | None = None) -> TextGameInstance:
        env_id, split, seed = self.splits.parse(task_id)
        seed, query = seed_and_query(params, seed)
        return self.instance(env_id, split, seed, query)

    def profile(self) -> dict[str, Any]:
        return {"name": self.name, "background": self.background,
                "entities": [{"name": env_id, "description": f"{self.distribution} environment {env_id}",
                              "attrs": {"observation": "text"}, "opts": []} for env_id in self.env_ids],
                "task_preference": {"num_entities": 1, "num_opts": 1, "relation_difficulty": 1}}

    def info(self) -> dict[str, Any]:
        # The run manifest records what the service serves, so the package version and env ids land there.
        return {**super().info(), "package": {"name": self.distribution, "version": package_version(self.distribution)},
                "env_ids": self.env_ids, "max_turns": self.max_turns}
