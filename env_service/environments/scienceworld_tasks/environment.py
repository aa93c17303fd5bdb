"""ScienceWorld as text conversations.

Splits are ScienceWorld's own train/dev/test variations of each task (a task id's index picks
the variation), so held-out tasks are the ones its authors held out. Each simulator is a JVM
driven over py4j on loopback; starting one takes about a second, so idle simulators are pooled
and reused (loading another task into a running one takes well under a second).
"""

from __future__ import annotations

import shutil
import threading
from typing import Any

from common.schemas import Split
from env_service.environments.base import SPLITS
from env_service.environments.textgames import Parsed, SuiteEnvironment, TextGameInstance, Turn, match_choice

_VARIATIONS = {"train": "get_variations_train", "validation": "get_variations_dev", "test": "get_variations_test"}
SOLVED = 100  # ScienceWorld scores 0..100 (and -100 for a failed task)


class SimulatorPool:
    def __init__(self, lib: Any, step_limit: int, max_idle: int = 4) -> None:
        self.lib, self.step_limit, self.max_idle = lib, step_limit, max_idle
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def acquire(self) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self.lib.ScienceWorldEnv("", envStepLimit=self.step_limit)

    def give_back(self, simulator: Any) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(simulator)
                return
        simulator.close()


class ScienceWorldInstance(TextGameInstance):
    def __init__(self, pool: SimulatorPool, env_id: str, variation: int, query: str | None, max_turns: int) -> None:
        super().__init__(env_id, variation, query, max_turns)
        self.pool = pool
        self.sim: Any = None
        self.valid: list[str] = []
        self.score = 0
        self.completed = False
        self.look = ""

    def start(self) -> tuple[str, str]:
        if self.sim is None:
            self.sim = self.pool.acquire()
        self.sim.load(self.env_id, self.seed, "", generateGoldPath=False)
        observation, info = self.sim.reset()
        self.valid, self.score, self.completed = list(info.get("valid", [])), int(info.get("score", 0)), False
        self.look = observation
        system = ("You are an agent in ScienceWorld, a text simulation of rooms, objects and science experiments. "
                  "Each turn, reply with one command, e.g. 'Action: look around', 'Action: open door to kitchen', "
                  "'Action: go to kitchen', 'Action: pick up thermometer', 'Action: focus on water'.")
        return system, f"{self.sim.get_task_description()}\n\n{observation}"

    def parse(self, text: str) -> Parsed[str]:
        return match_choice(text, {c: c for c in self.valid})

    def apply(self, action: str) -> Turn:
        observation, reward, completed, info = self.sim.step(action)
        self.valid = list(info.get("valid", self.valid))
        self.score, self.completed = int(info.get("score", self.score)), bool(completed)
        self.look = str(info.get("look", self.look))
        return Turn(str(observation), float(reward) / SOLVED, self.completed, info={"score": self.score})

    def success(self) -> bool:
        return self.score >= SOLVED

    def invalid_hint(self) -> str:
        return ("That command is not possible here. Commands look like 'look around', 'go to kitchen', "
                "'open door to kitchen', 'pick up <object>', 'focus on <object>', 'inventory'.")

    def snapshot(self) -> dict[str, Any]:
        return {"look": self.look, "score": self.score, "completed": self.completed}

    def close(self) -> None:
        if self.sim is not None:
            self.pool.give_back(self.sim)
            self.sim = None


class ScienceWorldEnvironment(SuiteEnvironment):
    name = "scienceworld"
    module = "scienceworld"
    distribution = "scienceworld"
    default_envs = ("find-living-thing", "boil")
    default_max_turns = 20
    background = "ScienceWorld: elementary-school science experiments in a simulated house and its surroundings."

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        if shutil.which("java") is None:
            raise ValueError("the 'scienceworld' environment needs a Java runtime (17+): apt-get install "
                             "default-jre-headless (install.sh does this)")
        super().__init__(config)
        self.pool = SimulatorPool(self.lib, step_limit=max(self.max_turns * 2, 100))
        # Each task's own held-out variations; loading every task once at start costs ~0.3 s per task.
        simulator = self.pool.acquire()
        try:
            names = list(simulator.get_task_names())
            unknown = [e for e in self.env_ids if e not in names]
            if unknown:
                raise ValueError(f"scienceworld.envs: {', '.join(unknown)} not ScienceWorld task(s); "
                                 f"tasks: {', '.join(names)}")
            self.variations: dict[str, dict[str, list[int]]] = {}
            for env_id in self.env_ids:
                simulator.load(env_id, 0, "")
                self.variations[env_id] = {s: list(getattr(simulator, _VARIATIONS[s])())[:self.splits.sizes[s]]
                                           for s in SPLITS}
        finally:
            self.pool.give_back(simulator)

    def check_env_id(self, env_id: str) -> str:
        return env_id  # checked against the simulator's own task list in __init__, once one is running

    def task_ids(self, split: Split) -> list[str]:
        return [f"{env_id}/{split}-{i:04d}" for env_id in self.env_ids
                for i in range(len(self.variations[env_id][split]))]

    def instance(self, env_id: str, split: Split, seed: int, query: str | None) -> ScienceWorldInstance:
        index = seed - {"train": 0, "validation": 100_000, "test": 200_000}[split]
        variations = self.variations[env_id][split]
        if index >= len(variations):
            raise KeyError(f"no task {env_id}/{split}-{index:04d}: {env_id} has {len(variations)} {split} variations")
        return ScienceWorldInstance(self.pool, env_id, variations[index], query, self.max_turns)
