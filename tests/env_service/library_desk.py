"""A library desk, written as a user writes their first plugin, and four ways users got it wrong.

`LibraryDesk`: tools `find_book(title)` -> `{id, title, shelf, copies}` and `reserve(book_id, member)`;
tasks "Which shelf holds 'Dune'?" (graded on the text answer) and "Reserve 'Dune' for member M-17."
(graded on the state). Its profile has a `lookups` section for `find_book`, so self-questioning can ask
questions answered by what a search read.

The broken variants each differ from it by one bug that a training run fails on, and that the
conformance kit must fail (`tests/env_service/test_conformance_variants.py`):
- `PlainTextCrash`: step() reads the call with a regex and indexes its first match: IndexError on every
  reply that calls no tool;
- `SetInfo`: step info holds a Python set (the tools used so far);
- `DictContent`: the observation's content is a dict rather than text;
- `SetState`: state() holds a set of reservations, which JSON cannot carry (GET .../state answers 502).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from common.actions import ActionParseError, parse_actions
from common.schemas import ChatMessage
from env_service.environments.base import EnvInstance, Environment, EvalResult, StepResult

TITLES = ("Dune", "Emma", "Ulysses", "Beloved", "Hamlet", "Walden")
SHELVES = ("A1", "A2", "B1", "B2", "C1")
MEMBERS = ("M-17", "M-23", "M-42")
SPLIT_SEEDS = {"train": 0, "validation": 1000, "test": 2000}
MAX_TURNS = 6
SYSTEM = ("You work at a library desk. Call find_book(title) to look a book up and reserve(book_id, member) "
          'to reserve it, e.g. <tool_call>{"name": "find_book", "arguments": {"title": "Dune"}}</tool_call>. '
          "Answer a question in plain text.")

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "find_book", "description": "Look a book up by its title: its id, shelf and copies left.",
        "parameters": {"type": "object", "required": ["title"], "properties": {
            "title": {"type": "string", "enum": list(TITLES), "description": "the book's title"}}}}},
    {"type": "function", "function": {
        "name": "reserve", "description": "Reserve a copy of a book for a member.",
        "parameters": {"type": "object", "required": ["book_id", "member"], "properties": {
            "book_id": {"type": "string", "description": "the book's id, from find_book"},
            "member": {"type": "string", "enum": list(MEMBERS), "description": "the member's card"}}}}},
]

PROFILE: dict[str, Any] = {
    "name": "library_desk",
    "background": "A library desk: look books up by title, reserve copies for members.",
    "entities": [{"name": "book", "description": "a book on a shelf",
                  "attrs": {"id": "the book's id", "shelf": "where it stands", "copies": "copies left"},
                  "opts": [
                      {"name": "find_book", "description": "Look a book up by its title.",
                       "lookups": [{"kind": "shelf_lookup", "answer": "shelf", "forms": {
                           "ids": {"query": "Which shelf holds '{title}'? Reply with the shelf.",
                                   "call": {"title": "{title}"}}}}]},
                      {"name": "reserve", "description": "Reserve a copy of a book for a member.",
                       "template": "reserve book {book_id} for member {member}"}]}],
    "task_preference": {"num_entities": 1, "num_opts": 2, "relation_difficulty": 2},
}


class LibraryDeskSettings(BaseModel):
    """run.yaml's `env_service.environments.<name>`."""

    model_config = ConfigDict(extra="forbid")
    tasks_per_split: int = 8


class Library:
    """One episode's catalogue, drawn from the task's seed."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.books = {title: {"id": f"B-{100 + i}", "title": title, "shelf": rng.choice(SHELVES),
                              "copies": rng.randint(1, 3)} for i, title in enumerate(TITLES)}
        self.reservations: list[dict[str, str]] = []
        self.title, self.member = rng.choice(TITLES), rng.choice(MEMBERS)
        self.asks_shelf = rng.random() < 0.5

    def question(self) -> str:
        if self.asks_shelf:
            return f"Which shelf holds '{self.title}'?"
        return f"Reserve '{self.title}' for member {self.member}."

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        if name == "find_book":
            book = self.books.get(str(arguments.get("title")))
            return (json.dumps(book), True) if book else (f"Error: no book titled {arguments.get('title')!r}", False)
        if name == "reserve":
            book = next((b for b in self.books.values() if b["id"] == arguments.get("book_id")), None)
            if book is None or arguments.get("member") not in MEMBERS:
                return "Error: reserve needs a book id from find_book and a member card", False
            if book["copies"] < 1:
                return f"Error: no copy of {book['title']} left", False
            book["copies"] -= 1
            self.reservations.append({"book_id": book["id"], "member": str(arguments["member"])})
            return json.dumps({"reserved": book["id"], "member": arguments["member"]}), True
        return f"Error: no tool {name!r}; the tools are find_book and reserve", False

    def score(self, last_reply: str) -> float:
        if self.asks_shelf:
            return float(self.books[self.title]["shelf"] in last_reply)
        wanted = {"book_id": self.books[self.title]["id"], "member": self.member}
        return float(wanted in self.reservations)

    def state(self) -> dict[str, Any]:
        return {"reservations": sorted(self.reservations, key=lambda r: (r["book_id"], r["member"])),
                "copies": {b["id"]: b["copies"] for b in self.books.values()}}


class LibraryDeskInstance(EnvInstance):
    def __init__(self, library: Library, query: str | None) -> None:
        self.library, self.query, self.turns, self.last_reply = library, query, 0, ""

    def reset(self) -> list[ChatMessage]:
        return [ChatMessage(role="system", content=SYSTEM),
                ChatMessage(role="user", content=self.query or self.library.question())]

    def step(self, action: ChatMessage) -> StepResult:
        self.turns += 1
        done = self.turns >= MAX_TURNS
        try:
            calls = parse_actions(action)
        except ActionParseError as exc:
            return self.observe(f"Could not read your tool call: {exc}", valid=False, done=done)
        if not calls:  # a plain-text reply is the answer to a question
            self.last_reply = action.text()
            return self.observe("Noted.", valid=True, done=True)
        texts, valid = [], True
        for call in calls:
            text, ok = self.library.call(call.name, call.arguments)
            texts.append(text)
            valid = valid and ok
        return self.observe("\n".join(texts), valid=valid, done=done)

    def observe(self, text: str, *, valid: bool, done: bool) -> StepResult:
        return StepResult(observation=ChatMessage(role="user", content=text), done=done, info={"valid": valid},
                          reward=self.library.score(self.last_reply) if done else 0.0)

    def evaluate(self, params: dict[str, Any] | None = None) -> EvalResult:
        return EvalResult(score=self.library.score(self.last_reply))

    def state(self) -> dict[str, Any]:
        return self.library.state()


class LibraryDesk(Environment):
    name = "library_desk"
    settings_model = LibraryDeskSettings  # a misspelled key in its section fails at start
    instance_class: type[LibraryDeskInstance] = LibraryDeskInstance

    def task_ids(self, split: str) -> list[str]:
        count = self.settings.tasks_per_split
        return [f"{split}-{i:04d}" for i in range(count)]

    def create(self, task_id: str, params: dict[str, Any] | None = None) -> EnvInstance:
        split, _, index = task_id.partition("-")
        if split not in SPLIT_SEEDS or task_id not in self.task_ids(split):
            raise KeyError(task_id)
        return self.instance_class(Library(SPLIT_SEEDS[split] + int(index)), (params or {}).get("query"))

    def profile(self) -> dict[str, Any]:
        return PROFILE

    def tool_docs(self, task_id: str | None = None) -> list[dict[str, Any]]:
        return TOOLS


# ---------------------------------------------------------------- the four bugs


class PlainTextCrashInstance(LibraryDeskInstance):
    def step(self, action: ChatMessage) -> StepResult:
        self.turns += 1
        name, arguments = re.findall(r"(\w+)\((.*)\)", action.text())[0]  # IndexError without a call
        pairs = dict(re.findall(r"(\w+)=['\"]?([^,'\"]*)", arguments))
        text, ok = self.library.call(name, pairs)
        return self.observe(text, valid=ok, done=self.turns >= MAX_TURNS)


class SetInfoInstance(LibraryDeskInstance):
    def observe(self, text: str, *, valid: bool, done: bool) -> StepResult:
        result = super().observe(text, valid=valid, done=done)
        result.info["tools_used"] = {name for name in ("find_book", "reserve") if name in text}
        return result


class DictContentInstance(LibraryDeskInstance):
    def observe(self, text: str, *, valid: bool, done: bool) -> StepResult:
        reward = self.library.score(self.last_reply) if done else 0.0
        return StepResult(observation=ChatMessage(role="user", content={"result": text, "turn": self.turns}),
                          done=done, reward=reward, info={"valid": valid})


class SetStateInstance(LibraryDeskInstance):
    def state(self) -> dict[str, Any]:
        return {"reservations": {(r["book_id"], r["member"]) for r in self.library.reservations}}


class PlainTextCrash(LibraryDesk):
    instance_class = PlainTextCrashInstance


class SetInfo(LibraryDesk):
    instance_class = SetInfoInstance


class DictContent(LibraryDesk):
    instance_class = DictContentInstance


class SetState(LibraryDesk):
    instance_class = SetStateInstance
