"""`bfcl`: BFCL v3 multi-turn tasks as episodes, graded by bfcl-eval's own checker.

Episode protocol (BFCL's own inference loop, one assistant message per step):
- reset gives [system (BFCL's default prompt with the tool docs), user (turn 0)];
- a message with calls runs them on the episode's backends; the observation is one `tool` message
  holding every result;
- a message with no call ends the user turn; the observation is the next user turn (for a
  miss_func holdout turn: the newly available function docs, as BFCL words it); after the last
  turn the episode is done and the reward is the checker's verdict;
- more than `max_steps_per_turn` steps in one turn (malformed ones included) force-terminates the
  episode, as BFCL does after 20.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from bfcl_eval.constants.default_prompts import (
    DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING,
    MAXIMUM_STEP_LIMIT,
    OUTPUT_FORMAT_MAPPING,
    PARAM_TYPE_MAPPING,
    PROMPT_STYLE_TEMPLATES,
    PROMPT_TEMPLATE_MAPPING,
)
from pydantic import Field, field_validator, model_validator

from common.actions import ActionParseError, ParsedCall, parse_actions
from common.config import StrictModel
from common.schemas import ChatMessage, Split
from env_service.environments.base import EnvInstance, Environment, EvalResult, StepResult

from .backend import EpisodeBackend, check, to_jsonable
from .data import (
    CATEGORIES,
    DEFAULT_SPLIT_FRACTIONS,
    SHORT_CATEGORY_NAMES,
    BfclTask,
    all_tasks,
    class_function_docs,
    split_task_ids,
    task_function_docs,
    to_openai_tool,
)

EPISODE_OVER = "The conversation is over: every user turn has been handled. Nothing more will run."


class BfclConfig(StrictModel):
    """The `bfcl` section of the env service config."""

    categories: list[str] = Field(default_factory=lambda: list(CATEGORIES),
                                  description="which of base, miss_func, miss_param, long_context to serve")
    split_fractions: dict[Literal["train", "validation", "test"], float] = Field(
        default_factory=lambda: dict(DEFAULT_SPLIT_FRACTIONS))
    split_seed: int = 0
    max_steps_per_turn: int = Field(default=MAXIMUM_STEP_LIMIT, ge=1)

    @field_validator("categories")
    @classmethod
    def _known_categories(cls, value: list[str]) -> list[str]:
        names = []
        for name in value:
            full = SHORT_CATEGORY_NAMES.get(name, name)
            if full not in CATEGORIES:
                raise ValueError(f"unknown BFCL category {name!r}; choose from {sorted(SHORT_CATEGORY_NAMES)}")
            names.append(full)
        return names

    @model_validator(mode="after")
    def _fractions_cover_everything(self) -> BfclConfig:
        if set(self.split_fractions) != {"train", "validation", "test"}:
            raise ValueError("split_fractions needs train, validation and test")
        if abs(sum(self.split_fractions.values()) - 1.0) > 1e-6 or min(self.split_fractions.values()) < 0:
            raise ValueError(f"split_fractions must be >= 0 and sum to 1, got {self.split_fractions}")
        return self


def system_prompt(function_docs: list[dict[str, Any]]) -> str:
    """BFCL's default system prompt (python call format, JSON docs, plaintext, classic style)."""
    style = PROMPT_STYLE_TEMPLATES["classic"]
    return PROMPT_TEMPLATE_MAPPING["plaintext"].format(
        persona=style["persona"], task=style["task"],
        tool_call_format=style["tool_call_no_tag"].format(output_format=OUTPUT_FORMAT_MAPPING["python"],
                                                          param_types=PARAM_TYPE_MAPPING["python"]),
        multiturn_behavior=style["multiturn_behavior"],
        available_tools=style["available_tools"].format(format="json", functions=json.dumps(function_docs, indent=4)))


class BfclInstance(EnvInstance):
    def __init__(self, task: BfclTask, query: str | None, max_steps_per_turn: int) -> None:
        self.task = task
        self.query = query
        self.max_steps_per_turn = max_steps_per_turn
        self.backend: EpisodeBackend | None = None
        # A replaced query is a one-turn episode on the task's initial state (a synthesized task).
        self.n_turns = 1 if query is not None else len(task.turns)
        self._clear_episode()

    def _clear_episode(self) -> None:
        self.turn = 0
        self.steps_in_turn = 0
        self.decoded: list[list[list[str]]] = [[]]  # per turn, per step: executed call strings
        self.done = False
        self.force_terminated = False
        self.verdict: dict[str, Any] | None = None
        self.available: dict[str, dict[str, Any]] = {}
        self.later_docs: dict[int, list[dict[str, Any]]] = {}

    # ------------------------------------------------------------------ episode

    def reset(self) -> list[ChatMessage]:
        if self.backend is not None:
            self.backend.close()
        self._clear_episode()
        self.backend = EpisodeBackend(self.task)
        docs, self.later_docs = task_function_docs(self.task)
        self.available = {doc["name"]: doc for doc in docs}
        first = self.query if self.query is not None else self._turn_text(0)
        return [ChatMessage(role="system", content=system_prompt(docs)), ChatMessage(role="user", content=first)]

    def step(self, action: ChatMessage) -> StepResult:
        if self.backend is None:
            raise RuntimeError("step() before reset()")
        if self.done:
            return StepResult(observation=ChatMessage(role="user", content=EPISODE_OVER), done=True,
                              info={"turn": self.turn})
        try:
            calls = parse_actions(action, self.backend.parameters)
        except ActionParseError as exc:
            # Counted as a step, so a turn of nothing but malformed calls still ends.
            return self._count_step(ChatMessage(role="tool", content=f"Could not parse your function call: {exc}"),
                                    parse_error=True)
        if not calls:
            return self._end_turn()
        return self._run_calls(calls)

    def _run_calls(self, calls: list[ParsedCall]) -> StepResult:
        assert self.backend is not None
        # Only the backends' own methods reach bfcl-eval's executor, which `eval`s the call string:
        # any other name (a builtin such as open) is answered with an error and never run.
        runnable = [call for call in calls if call.name in self.backend.callable_names]
        results = iter(self.backend.execute([call.to_python() for call in runnable]))
        if runnable:
            self.decoded[self.turn].append([call.to_python() for call in runnable])
        outputs = [{"call": call.to_python(),
                    "result": next(results) if call.name in self.backend.callable_names
                    else self._unavailable(call.name)}
                   for call in calls]
        content = outputs[0]["result"] if len(outputs) == 1 else json.dumps(outputs, ensure_ascii=False)
        call_id = calls[0].call_id if len(calls) == 1 else None
        message = ChatMessage(role="tool", content=content, tool_call_id=call_id)
        return self._count_step(message, calls=len(calls), executed=len(runnable))

    def _count_step(self, message: ChatMessage, **info: Any) -> StepResult:
        self.steps_in_turn += 1
        if self.steps_in_turn > self.max_steps_per_turn:
            # BFCL force-quits a turn after this many steps and fails the whole entry.
            self.done = self.force_terminated = True
            return self._finish(message)
        return self._observe(message, **info)

    def _unavailable(self, name: str) -> str:
        return (f"Error during execution: no function named {name!r} is available. "
                f"Available functions: {', '.join(sorted(self.available))}")

    def _end_turn(self) -> StepResult:
        self.turn += 1
        self.steps_in_turn = 0
        if self.turn >= self.n_turns:
            self.done = True
            return self._finish(ChatMessage(role="user", content=EPISODE_OVER))
        self.decoded.append([])
        new_docs = self.later_docs.get(self.turn, [])
        for doc in new_docs:
            self.available[doc["name"]] = doc
        return self._observe(ChatMessage(role="user", content=self._turn_text(self.turn)),
                             new_functions=[doc["name"] for doc in new_docs])

    def _turn_text(self, turn: int) -> str:
        if turn in self.task.held_out:
            # BFCL's holdout turn has no user message: the user hands over the missing functions.
            return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(
                functions=json.dumps(self.later_docs[turn], indent=4))
        return "\n".join(message["content"] for message in self.task.turns[turn])

    def _observe(self, message: ChatMessage, **info: Any) -> StepResult:
        return StepResult(observation=message, info={"turn": self.turn, **info})

    def _finish(self, message: ChatMessage) -> StepResult:
        result = self.evaluate()
        return StepResult(observation=message, reward=result.score, done=True,
                          info={"turn": self.turn, **result.info})

    # ------------------------------------------------------------------ grading and state

    def evaluate(self, params: dict[str, Any] | None = None) -> EvalResult:
        if self.query is not None:
            return EvalResult(score=0.0, info={
                "valid": False, "error_type": "no_ground_truth",
                "error_message": "the user query was replaced, so BFCL's ground truth does not apply; "
                                 "grade this episode by its state"})
        if not self.done or self.force_terminated:
            # bfcl-eval's runner fails an entry whose turn count differs from the ground truth's.
            return EvalResult(score=0.0, info={
                "valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"the episode handled {self.turn} of {self.n_turns} user turns"})
        if self.verdict is None:
            try:
                self.verdict = check(self.task, self.decoded)
            except Exception as exc:  # an assertion inside the checker: report it, never crash the service
                self.verdict = {"valid": False, "error_type": "multi_turn:checker_error", "error_message": repr(exc)}
        info = {"valid": bool(self.verdict["valid"])}
        if not info["valid"]:
            info.update(error_type=self.verdict.get("error_type"), error_message=self.verdict.get("error_message"))
            if "details" in self.verdict and "differences" in self.verdict["details"]:
                info["differences"] = to_jsonable(self.verdict["details"]["differences"])
        return EvalResult(score=1.0 if info["valid"] else 0.0, info=info)

    def state(self) -> dict[str, Any] | None:
        return self.backend.snapshot() if self.backend is not None else None

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


class BfclEnvironment(Environment):
    name = "bfcl"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        self.settings = BfclConfig.model_validate(self.config)
        served = set(self.settings.categories)
        self.tasks = {tid: task for tid, task in all_tasks().items() if task.category in served}
        table = split_task_ids(self.settings.split_fractions, self.settings.split_seed)
        self.splits = {split: [tid for tid in ids if tid in self.tasks] for split, ids in table.items()}

    def task_ids(self, split: Split) -> list[str]:
        if split not in self.splits:
            raise KeyError(f"unknown split {split!r}; choose from {sorted(self.splits)}")
        return list(self.splits[split])

    def _task(self, task_id: str) -> BfclTask:
        try:
            return self.tasks[task_id]
        except KeyError:
            raise KeyError(f"unknown bfcl task id {task_id!r}; ids look like multi_turn_base_0 "
                           f"(categories served: {', '.join(self.settings.categories)})") from None

    def create(self, task_id: str, params: dict[str, Any] | None = None) -> BfclInstance:
        query = (params or {}).get("query")
        if query is not None and not isinstance(query, str):
            raise ValueError("params.query must be a string")
        return BfclInstance(self._task(task_id), query, self.settings.max_steps_per_turn)

    def tool_docs(self, task_id: str | None = None) -> list[dict[str, Any]]:
        """OpenAI tool schemas of a task, held-out miss_func functions included (they unlock later)."""
        if task_id is None:
            classes = sorted({c for task in self.tasks.values() for c in task.involved_classes})
            return [to_openai_tool(doc) for c in classes for doc in class_function_docs(c)]
        docs, later = task_function_docs(self._task(task_id))
        tools = [to_openai_tool(doc) for doc in docs]
        for turn, held in sorted(later.items()):
            for doc in held:
                tool = to_openai_tool(doc)
                tool["available_from_turn"] = turn
                tools.append(tool)
        return tools

    def profile(self) -> dict[str, Any]:
        classes = sorted({c for task in self.tasks.values() for c in task.involved_classes})
        entities = []
        for class_name in classes:
            docs = class_function_docs(class_name)
            entities.append({
                "name": class_name,
                "description": docs[0]["description"].split(" Tool description:")[0] if docs else class_name,
                "attrs": {},
                "opts": [{"name": d["name"], "description": d["description"].split("Tool description: ")[-1]}
                         for d in docs],
            })
        return {"name": self.name,
                "background": "BFCL v3 multi-turn: a user asks, turn by turn, for work on simulated APIs "
                              "(file system, messaging, posting, tickets, trading, travel, vehicle, math).",
                "entities": entities,
                "task_preference": {"num_entities": 2, "num_opts": 3, "relation_difficulty": 2}}

    def info(self) -> dict[str, Any]:
        return {**super().info(), "categories": self.settings.categories}
