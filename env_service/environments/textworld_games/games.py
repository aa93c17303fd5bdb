"""Generating TextWorld games: env id + seed -> a compiled game file, made once and cached.

Env ids: `tw-coin_collector-L<level>`, `tw-treasure_hunter-L<level>` (TextWorld's challenges) and
`custom-R<rooms>-O<objects>-Q<quest length>` (its random game maker). The same id and seed always
give the same game, so the seed ranges of the splits are stable game sets.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

_CHALLENGE = re.compile(r"^tw-(coin_collector|treasure_hunter)-L(\d+)$")
_CUSTOM = re.compile(r"^custom-R(\d+)-O(\d+)-Q(\d+)$")
EXAMPLES = "tw-coin_collector-L1, tw-treasure_hunter-L1, custom-R3-O6-Q3"
# TextWorld keeps its logic parser's state at module level: generating, loading and stepping games on
# several threads at once fails ("pop from empty list", "FailedToken"). Every call into TextWorld in
# this process takes this lock; building a game holds it for seconds (`pregenerate` avoids that).
TEXTWORLD_LOCK = threading.Lock()


def check_game_id(env_id: str) -> str:
    challenge, custom = _CHALLENGE.match(env_id), _CUSTOM.match(env_id)
    if challenge:
        level = int(challenge.group(2))
        top = 300 if challenge.group(1) == "coin_collector" else 30
        if not 1 <= level <= top:
            raise ValueError(f"textworld.envs: {env_id}: level must be 1..{top}")
        return env_id
    if custom:
        rooms, objects, quest = (int(g) for g in custom.groups())
        if not (1 <= rooms <= 20 and 0 <= objects <= 40 and 1 <= quest <= 20):
            raise ValueError(f"textworld.envs: {env_id}: rooms 1..20, objects 0..40, quest length 1..20")
        return env_id
    raise ValueError(f"textworld.envs: {env_id!r} is not a TextWorld game id; use one like {EXAMPLES}")


def _build(env_id: str, seed: int, target: Path) -> None:
    import textworld
    from textworld.challenges import coin_collector, treasure_hunter

    options = textworld.GameOptions()
    options.seeds = seed
    options.path = str(target)
    options.force_recompile = True
    challenge, custom = _CHALLENGE.match(env_id), _CUSTOM.match(env_id)
    if challenge:
        maker = coin_collector if challenge.group(1) == "coin_collector" else treasure_hunter
        game = maker.make({"level": int(challenge.group(2))}, options=options)
        textworld.generator.compile_game(game, options)
    else:
        assert custom is not None
        options.nb_rooms, options.nb_objects, options.quest_length = (int(g) for g in custom.groups())
        textworld.make(options)


def game_file(games_dir: Path, env_id: str, seed: int) -> Path:
    """The compiled game for (env id, seed), built on first use."""
    final = games_dir / env_id / f"{seed}.z8"
    if final.exists():
        return final
    with TEXTWORLD_LOCK:
        if final.exists():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        # Built aside and moved in, so another process never sees half a game.
        with tempfile.TemporaryDirectory(dir=final.parent) as scratch:
            built = Path(scratch) / f"{seed}.z8"
            _build(env_id, seed, built)
            shutil.move(str(built.with_suffix(".json")), final.with_suffix(".json"))
            shutil.move(str(built), final)
    return final


def request_infos() -> Any:
    from textworld import EnvInfos

    return EnvInfos(admissible_commands=True, won=True, lost=True, score=True, max_score=True, objective=True,
                    description=True, inventory=True, policy_commands=True)
