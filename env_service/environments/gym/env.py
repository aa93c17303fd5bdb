"""The `gym` environment: gymnasium toy-text games served as text conversations."""

from __future__ import annotations

import json
import warnings
from typing import Any

import gymnasium
import numpy as np

from common.schemas import ChatMessage, Split
from env_service.environments.base import SPLITS, EnvInstance, Environment, EvalResult, StepResult
from env_service.environments.gym.text import (
    GAMES,
    ActionParseFailure,
    GameText,
    describe_taxi,
    generic_game,
    is_exact_action,
    parse_action,
    render_text,
)
from env_service.environments.textgames.base import seed_and_query

DEFAULT_GAMES = ("FrozenLake-v1", "Taxi-v4", "CliffWalking-v1")
DEFAULT_SPLITS = {"train": 100, "validation": 20, "test": 20}
SPLIT_SEED_BASE = {"train": 0, "validation": 100_000, "test": 200_000}


class GameConfig:
    """One gymnasium id as a text game: a built-in description (toy-text) or a generic one.

    Any registered id with a Discrete action space works: the board is its ANSI render when the env
    offers one, else its observation written as text; actions are named by the `actions` key, by the
    env's `get_action_meanings()`, or by their numbers.

    An env describes itself the same way: a `description` string attribute (what the game is, shown in
    the system message) and an `instruction` (the task's goal, shown as the user message): a string, or
    a method called after each seeded reset, so every task can state its own goal. The YAML keys of the
    same names win over both.
    """

    KEYS = ("id", "kwargs", "max_steps", "actions", "success", "description", "instruction")

    def __init__(self, spec: str | dict[str, Any]) -> None:
        if isinstance(spec, str):
            spec = {"id": spec}
        unknown = sorted(set(spec) - set(self.KEYS))
        if unknown:
            raise ValueError(f"gym.envs entry {spec}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(self.KEYS)}")
        self.id: str = str(spec.get("id", ""))
        # Only ids already registered with gymnasium: an id like "module:Env" would import code.
        if ":" in self.id or self.id not in gymnasium.registry:
            raise ValueError(f"gym.envs: {self.id!r} is not a registered gymnasium environment id "
                             "(register your own in a module listed under env_service.plugins)")
        self.kwargs: dict[str, Any] = dict(spec.get("kwargs") or {})
        registered = gymnasium.spec(self.id).max_episode_steps
        self.max_steps: int = int(spec.get("max_steps") or registered or 100)
        self.ansi = True
        self.instruction: str | None = str(spec["instruction"]) if spec.get("instruction") else None
        builtin = GAMES.get(self.id)
        self.text: GameText = builtin or self._generic_text(spec)

    def _generic_text(self, spec: dict[str, Any]) -> GameText:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env = gymnasium.make(self.id, **self.kwargs)
        try:
            if not isinstance(env.action_space, gymnasium.spaces.Discrete):
                raise ValueError(f"gym.envs: {self.id} has a {type(env.action_space).__name__} action space; "
                                 "only Discrete actions can be named in text")
            self.ansi = "ansi" in (env.metadata.get("render_modes") or [])
            n = int(env.action_space.n)
            names = spec.get("actions") or getattr(env.unwrapped, "get_action_meanings", lambda: None)()
            if names is not None and len(names) != n:
                raise ValueError(f"gym.envs: {self.id}: {len(names)} action names for {n} actions")
        finally:
            env.close()
        success = str(spec.get("success", "positive_reward"))
        if success not in ("positive_reward", "terminated"):
            raise ValueError(f"gym.envs: {self.id}: success must be positive_reward or terminated")
        described = getattr(env.unwrapped, "description", None)
        description = spec.get("description") or (described if isinstance(described, str) else None)
        return generic_game(n, [str(a).lower() for a in names] if names else None,
                            str(description or f"The gymnasium environment {self.id}."), success)

    def make(self) -> gymnasium.Env:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gymnasium warns that some envs do not declare 'ansi'
            render = {"render_mode": "ansi"} if self.ansi else {}  # some envs take no render_mode at all
            return gymnasium.make(self.id, max_episode_steps=self.max_steps, **render, **self.kwargs)


def _space_json(space: gymnasium.Space) -> dict[str, Any]:
    if isinstance(space, gymnasium.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    return {"type": type(space).__name__}


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class GymEnvironment(Environment):
    name = "gym"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        unknown = sorted(set(self.config) - {"envs", "splits"})
        if unknown:
            raise ValueError(f"unknown gym config key(s) {', '.join(unknown)}; allowed: envs, splits")
        self.games = {g.id: g for g in (GameConfig(s) for s in self.config.get("envs", DEFAULT_GAMES))}
        sizes = {**DEFAULT_SPLITS, **self.config.get("splits", {})}
        self.split_sizes = {s: int(sizes[s]) for s in SPLITS}
        self._spaces = {gid: self._spaces_of(game) for gid, game in self.games.items()}

    @staticmethod
    def _spaces_of(game: GameConfig) -> dict[str, Any]:
        env = game.make()
        try:
            return {"observation": _space_json(env.observation_space),
                    "action": {**_space_json(env.action_space), "names": list(game.text.actions)}}
        finally:
            env.close()

    def task_ids(self, split: Split) -> list[str]:
        return [f"{gid}/{split}-{i:04d}" for gid in self.games for i in range(self.split_sizes[split])]

    def parse_task(self, task_id: str) -> tuple[GameConfig, int]:
        game_id, _, rest = task_id.rpartition("/")
        split, _, index = rest.partition("-")
        game = self.games.get(game_id)
        if game is None or split not in self.split_sizes or not index.isdigit() \
                or int(index) >= self.split_sizes[split] or rest != f"{split}-{int(index):04d}":
            raise KeyError(f"no gym task {task_id!r}; ids look like {next(iter(self.games))}/train-0000 "
                           f"(games: {', '.join(self.games)})")
        return game, SPLIT_SEED_BASE[split] + int(index)

    def create(self, task_id: str, params: dict[str, Any] | None = None) -> GymInstance:
        game, seed = self.parse_task(task_id)
        seed, query = seed_and_query(params, seed)
        return GymInstance(game, seed, query)

    def tool_docs(self, task_id: str | None = None) -> list[dict[str, Any]]:
        return []  # actions are words in plain text, not tool calls

    def profile(self) -> dict[str, Any]:
        return {"name": self.name, "background": "Classic gymnasium toy-text games played through text.",
                "entities": [{"name": gid, "description": game.text.description,
                              "attrs": {"observation": "a text map of the board"},
                              # The task manager's discrete action schema: these words, sent as the action.
                              "opts": [{"name": a, "description": f"action {i}", "template": f"play {a}"}
                                       for i, a in enumerate(game.text.actions)]}
                             for gid, game in self.games.items()],
                "task_preference": {"num_entities": 1, "num_opts": 1, "relation_difficulty": 1}}

    def capabilities(self) -> dict[str, bool]:
        # Every episode resets with its task's seed (gymnasium's contract: a seeded reset reproduces the
        # episode), so the same actions reach the same board.
        return {"fork": False, "deterministic": True}

    def info(self) -> dict[str, Any]:
        return {**super().info(), "games": list(self.games), "spaces": self._spaces}


class GymInstance(EnvInstance):
    def __init__(self, game: GameConfig, seed: int, query: str | None) -> None:
        self.game, self.seed, self.query = game, seed, query
        self.env: gymnasium.Env | None = None
        self.observation: Any = None
        self.turns = self.mapped = self.invalid = 0
        self.total_reward = 0.0
        self.last_reward = 0.0
        self.terminated = self.truncated = False

    def reset(self) -> list[ChatMessage]:
        if self.env is None:
            self.env = self.game.make()
        self.observation, info = self.env.reset(seed=self.seed)
        self.turns, self.total_reward, self.last_reward = 0, 0.0, 0.0
        self.mapped = self.invalid = 0
        self.terminated = self.truncated = False
        text = self.game.text
        system = (f"You are playing {self.game.id}. {text.description}\n"
                  f"Actions: {', '.join(f'{name} ({i})' for i, name in enumerate(text.actions))}.\n"
                  f"Each turn, reply with one action, e.g. 'Action: {text.actions[0]}'. {text.legend}")
        goal = self.query or self._instruction()
        return [ChatMessage(role="system", content=system),
                ChatMessage(role="user", content=f"{goal}\n\n{self._board()}")]

    def _instruction(self) -> str:
        """The task's goal: the YAML's `instruction`, else the env's own (a string or a method), else a generic one."""
        assert self.env is not None
        own = getattr(self.env.unwrapped, "instruction", None)
        own = own() if callable(own) else own
        return self.game.instruction or (own if isinstance(own, str) and own.strip() else "Reach the goal.")

    def _board(self) -> str:
        assert self.env is not None
        if not self.game.ansi:
            return f"Observation: {json.dumps(_jsonable(self.observation))}"
        board = render_text(self.env.render())
        if self.game.id == "Taxi-v4":
            board = f"{board}\n{describe_taxi(self.env, int(self.observation))}"
        return board

    def step(self, action: ChatMessage) -> StepResult:
        assert self.env is not None, "reset() first"
        if self.terminated or self.truncated:
            return StepResult(observation=ChatMessage(role="user", content="The episode is over."), done=True,
                              info=self._gym_info(None, {}))
        self.turns += 1
        try:
            number = parse_action(action.text(), self.game.text)
        except ActionParseFailure as exc:
            # Invalid replies count as turns, so an agent that never names an action still ends.
            self.truncated = self.turns >= self.game.max_steps
            self.invalid += 1
            return StepResult(observation=ChatMessage(role="user", content=str(exc)), done=self.truncated,
                              info={**self._gym_info(None, {}), "error": "invalid_action"})
        kind = "exact" if is_exact_action(action.text(), self.game.text) else "mapped"
        self.mapped += kind == "mapped"
        self.observation, reward, terminated, truncated, info = self.env.step(number)
        self.last_reward = float(reward)
        self.total_reward += self.last_reward
        self.terminated = bool(terminated)
        self.truncated = bool(truncated) or (not terminated and self.turns >= self.game.max_steps)
        lines = [self._board(), f"Reward: {self.last_reward:g}."]
        if self.terminated or self.truncated:
            lines.append("The episode is over: " + ("success." if self._success() else "not solved."))
        return StepResult(observation=ChatMessage(role="user", content="\n".join(lines)), reward=self.last_reward,
                          done=self.terminated or self.truncated,
                          info={**self._gym_info(number, info), "action_kind": kind, "mapped": kind == "mapped"})

    def _gym_info(self, action: int | None, info: dict[str, Any]) -> dict[str, Any]:
        return {"observation": _jsonable(self.observation), "action": action, "terminated": self.terminated,
                "truncated": self.truncated, "gym_info": _jsonable(info)}

    def _success(self) -> bool:
        if not self.terminated:
            return False
        return self.game.text.success == "terminated" or self.last_reward > 0

    def evaluate(self, params: dict[str, Any] | None = None) -> EvalResult:
        return EvalResult(score=1.0 if self._success() else 0.0,
                          info={"terminated": self.terminated, "truncated": self.truncated, "turns": self.turns,
                                "total_reward": self.total_reward, "mapped_actions": self.mapped,
                                "invalid_actions": self.invalid, "mapped_action_rate": self.mapped / max(self.turns, 1),
                                "invalid_action_rate": self.invalid / max(self.turns, 1)})

    def state(self) -> dict[str, Any]:
        return {"game": self.game.id, "seed": self.seed, "observation": _jsonable(self.observation),
                "turns": self.turns, "total_reward": self.total_reward, "terminated": self.terminated,
                "truncated": self.truncated}

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
