"""Shared helpers for the experience manager tests: trajectories and a service per test module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

AGENT_SYSTEM_PROMPT = "You are a tool-using agent. " * 40  # long on purpose: it must not be what gets embedded


def chat_trajectory(task_id: str, query: str, calls: list[tuple[str, dict]], reward: float,
                    error: str | None = None) -> dict[str, Any]:
    """A Trajectory (wire dict) whose assistant turns call `calls` in order; `error` is the last tool answer."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": AGENT_SYSTEM_PROMPT},
                                      {"role": "user", "content": query}]
    for n, (name, args) in enumerate(calls):
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        last = n == len(calls) - 1
        messages.append({"role": "tool", "tool_call_id": f"call_{n}",
                         "content": error if (error and last) else json.dumps({"ok": True})})
    messages.append({"role": "assistant", "content": "Done."})
    return {"task_id": task_id, "messages": messages, "outcome": reward}


def reme_trajectory(query: str, calls: list[tuple[str, dict]], score: float) -> dict[str, Any]:
    """AgentEvolver's call_summarizer shape: {messages, score}."""
    traj = chat_trajectory("unused", query, calls, score)
    return {"messages": traj["messages"], "score": score}


def write_conf(path: Path, section: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump({"experience_manager": section}))
    return str(path)


# Task families used across the tests: (task id, task text, successful calls, paraphrase of the task).
TASKS = [
    ("flight", "Book a one-way flight from Paris to Rome on May 3 for Ann Lee",
     [("search_flight", {"origin": "Paris", "destination": "Rome", "date": "2024-05-03"}),
      ("book_ticket", {"flight_id": "F1", "passenger": "Ann Lee"})],
     "I need a single plane ticket from Boston to Denver next Friday"),
    ("weather", "What is the weather forecast for Berlin tomorrow?",
     [("geocode", {"city": "Berlin"}), ("get_forecast", {"lat": 52.5, "lon": 13.4, "date": "tomorrow"})],
     "Will it rain in London this weekend?"),
    ("files", "Delete all .log files in the /tmp/app directory",
     [("find_files", {"pattern": "*.log", "root": "/tmp/app"}), ("delete_file", {"path": "/tmp/app/a.log"})],
     "Remove every temporary .tmp file under my project folder"),
    ("email", "Send an email to Alice telling her the meeting moved to 3pm",
     [("search_contacts", {"name": "Alice"}), ("send_email", {"to": "alice@x.org", "subject": "Meeting",
                                                              "body": "Moved to 3pm"})],
     "Shoot an e-mail to Bob saying the report is ready"),
]
