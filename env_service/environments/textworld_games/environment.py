"""TextWorld games as text conversations.

A reply is mapped to the nearest admissible command (TextWorld lists them each turn), so the
mapped-action rate shows how much of the play came from our matching rather than the model.
The state snapshot is the room description, the inventory and the score (what the game shows), and
the admissible commands as `valid_actions` (what self-questioning's random explorer plays).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from common.schemas import Split
from env_service.environments.textgames import Parsed, SuiteEnvironment, TextGameInstance, Turn, match_choice
from env_service.environments.textworld_games.games import (
    TEXTWORLD_LOCK,
    check_game_id,
    game_file,
    request_infos,
)


def clean(text: str) -> str:
    """Game text without the Z-machine's '>' prompt and its runs of blank lines."""
    lines = [line.rstrip() for line in str(text).splitlines()]
    lines = [line for line in lines if line.strip() != ">"]
    out: list[str] = []
    for line in lines:
        if line.strip() or (out and out[-1]):
            out.append(line.strip())
    return "\n".join(out).strip()


def default_games_dir() -> Path:
    base = os.environ.get("EVOLVER_CACHE_DIR")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "evolver") / "textworld"


class TextWorldInstance(TextGameInstance):
    def __init__(self, path: Path, env_id: str, seed: int, query: str | None, max_turns: int,
                 show_commands: bool) -> None:
        super().__init__(env_id, seed, query, max_turns)
        self.path, self.show_commands = path, show_commands
        self.env: Any = None
        self.game: Any = None  # the last textworld GameState

    def _commands(self) -> list[str]:
        return [c for c in (self.game.admissible_commands or []) if c]

    def _with_commands(self, text: str) -> str:
        if not self.show_commands:
            return text
        return f"{text}\nValid commands: {', '.join(self._commands())}."

    def start(self) -> tuple[str, str]:
        import textworld

        with TEXTWORLD_LOCK:
            if self.env is None:
                self.env = textworld.start(str(self.path), request_infos=request_infos())
            self.game = self.env.reset()
        system = ("You play a text adventure. Each turn, reply with one command, e.g. 'Action: go north' or "
                  "'Action: take apple'.")
        # A synthetic task's query (put first by reset) is the goal: the game's own objective would contradict it.
        opening = self.game.description if self.query else f"{self.game.objective}\n\n{self.game.description}"
        return system, self._with_commands(clean(opening))

    def parse(self, text: str) -> Parsed[str]:
        return match_choice(text, {c: c for c in self._commands()})

    def apply(self, action: str) -> Turn:
        with TEXTWORLD_LOCK:
            self.game, reward, done = self.env.step(action)
        return Turn(self._with_commands(clean(self.game.feedback)), float(reward), bool(done),
                    info={"score": self.game.score, "max_score": self.game.max_score})

    def success(self) -> bool:
        return bool(self.game is not None and self.game.won)

    def invalid_hint(self) -> str:
        return f"That is not a command here. Valid commands: {', '.join(self._commands())}."

    def valid_actions(self) -> list[str] | None:
        return self._commands() if self.game is not None else None

    def snapshot(self) -> dict[str, Any] | None:
        if self.game is None:
            return None
        return {"description": self.game.description, "inventory": self.game.inventory, "score": self.game.score,
                "won": bool(self.game.won), "lost": bool(self.game.lost)}

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None


class TextWorldEnvironment(SuiteEnvironment):
    name = "textworld"
    module = "textworld"
    distribution = "textworld"
    default_envs = ("tw-coin_collector-L1", "tw-treasure_hunter-L1")
    default_max_turns = 20
    extra_keys = frozenset({"games_dir", "pregenerate", "show_commands"})
    background = "TextWorld text adventures generated offline: rooms, doors, containers and objects."

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        self.games_dir = Path(self.config.get("games_dir") or default_games_dir()).expanduser()
        self.show_commands = bool(self.config.get("show_commands", True))
        if self.config.get("pregenerate"):
            # Generation takes seconds per game: done at start so that creates stay fast.
            for split in self.splits.sizes:
                for task_id in self.task_ids(split):  # type: ignore[arg-type]
                    env_id, _, seed = self.splits.parse(task_id)
                    game_file(self.games_dir, env_id, seed)

    def check_env_id(self, env_id: str) -> str:
        return check_game_id(env_id)

    def instance(self, env_id: str, split: Split, seed: int, query: str | None) -> TextWorldInstance:
        return TextWorldInstance(game_file(self.games_dir, env_id, seed), env_id, seed, query, self.max_turns,
                                 self.show_commands)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "games_dir": str(self.games_dir)}
