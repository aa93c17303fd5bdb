"""TextArena single-player games as text conversations.

We make the `-raw` variant of a game (no TextArena action wrapper), so that wrapping a reply in
the `[...]` the games read is done by our parser and counted as a mapped action. A game's reward
is in [0, 1] with partial credit for progress; only a full reward counts as success.
"""

from __future__ import annotations

import re
from typing import Any

from common.schemas import Split
from env_service.environments.textgames import (
    Parsed,
    SuiteEnvironment,
    TextGameInstance,
    Turn,
    extract_wrapped,
)
from env_service.environments.textgames.packages import quietly

_BRACKETED = re.compile(r"\[[^\[\]\n]+\]")
_INVALID_MOVE = re.compile(r"invalid move", re.IGNORECASE)


class TextArenaInstance(TextGameInstance):
    def __init__(self, lib: Any, make_id: str, env_id: str, seed: int, query: str | None, max_turns: int) -> None:
        super().__init__(env_id, seed, query, max_turns)
        self.lib, self.make_id = lib, make_id
        self.env: Any = None
        self.reward: float | None = None

    def _new_text(self) -> str:
        """The game's messages since the last call (a raw env returns only new (sender, text, type) tuples;
        the player's own echoed move is left out)."""
        _, observation = self.env.get_observation()
        if isinstance(observation, str):
            return observation.strip()
        return "\n".join(str(m[1]) for m in observation if isinstance(m, tuple) and len(m) >= 2 and m[0] != 0).strip()

    def start(self) -> tuple[str, str]:
        self.env = quietly(lambda: self.lib.make(self.make_id))
        self.env.reset(num_players=1, seed=self.seed)
        self.reward = None
        system = (f"You are playing the TextArena game {self.env_id}. Each turn, give your move in square "
                  "brackets, for example [5].")
        return system, self._new_text()

    def parse(self, text: str) -> Parsed[str]:
        return extract_wrapped(text, _BRACKETED, lambda move: f"[{move}]")

    def apply(self, action: str) -> Turn:
        done, _ = self.env.step(action=action)
        observation = self._new_text()
        info: dict[str, Any] = {}
        if done:
            rewards, game_info = self.env.close()
            self.reward = float((rewards or {}).get(0, 0.0))
            info["reason"] = str((game_info or {}).get(0, {}).get("reason", ""))
            observation = f"{observation}\n{info['reason']}".strip()
        return Turn(observation, self.reward or 0.0, bool(done), invalid=bool(_INVALID_MOVE.search(observation)),
                    info=info)

    def success(self) -> bool:
        return self.reward is not None and self.reward >= 1.0

    def invalid_hint(self) -> str:
        return "Invalid action: your reply was empty. Give your move in square brackets, e.g. [5]."

    def snapshot(self) -> dict[str, Any] | None:
        state = getattr(getattr(self.env, "state", None), "game_state", None)
        return {"game_state": state} if state is not None else None


class TextArenaEnvironment(SuiteEnvironment):
    name = "textarena"
    module = "textarena"
    distribution = "textarena"
    default_envs = ("GuessTheNumber-v0", "TowerOfHanoi-v0")
    background = "TextArena single-player text games; moves are written in [brackets]."

    def check_env_id(self, env_id: str) -> str:
        from textarena.envs.registration import ENV_REGISTRY

        if env_id not in ENV_REGISTRY:
            base = sorted(k for k in ENV_REGISTRY if k.endswith("-v0"))
            raise ValueError(f"textarena.envs: {env_id!r} is not a TextArena id; known ones include "
                             f"{', '.join(base[:10])} ... ({len(ENV_REGISTRY)} in all)")
        try:  # a probe game: multi-player games and games needing downloads fail here, at start
            quietly(lambda: self.lib.make(self._make_id(env_id)).reset(num_players=1, seed=0))
        except Exception as exc:  # noqa: BLE001 (any failure of a third-party game means it cannot be served)
            raise ValueError(f"textarena.envs: {env_id} cannot run as a single-player game offline: "
                             f"{type(exc).__name__}: {exc}") from None
        return env_id

    @staticmethod
    def _make_id(env_id: str) -> str:
        from textarena.envs.registration import ENV_REGISTRY

        raw = f"{env_id}-raw"
        return raw if raw in ENV_REGISTRY else env_id

    def instance(self, env_id: str, split: Split, seed: int, query: str | None) -> TextArenaInstance:
        return TextArenaInstance(self.lib, self._make_id(env_id), env_id, seed, query, self.max_turns)
