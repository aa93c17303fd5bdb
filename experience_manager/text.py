"""Text rules shared by ingestion and retrieval: validation, normalisation, hashing, query extraction."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
REQUEST_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
_ID_RE = re.compile(ID_PATTERN)

# Injection markers the trainer strips by regex, and chat-template special tokens. Either inside an
# experience would break stripping or the chat template, so such text is rejected at the door.
_MARKER_RE = re.compile(r"</?\s*(exp|experience)\s*>", re.IGNORECASE)
_SPECIAL_TOKEN_RE = re.compile(
    r"<\|[^|<>\s]{1,40}\|>|</?s>|\[/?INST\]|<<\/?SYS>>|<(?:start|end)_of_turn>|<\|?(?:bos|eos|pad|unk)\|?>",
    re.IGNORECASE)
_EXP_BLOCK_RE = re.compile(r"<\s*exp\s*>.*?<\s*/\s*exp\s*>", re.IGNORECASE | re.DOTALL)
_WS_RE = re.compile(r"\s+")

# The heading AgentEvolver puts before an injected block (`experience_template`), removed with the block.
_EXP_HEADING_RE = re.compile(r"Some Related Experience to help you to complete the task:\s*", re.IGNORECASE)


def valid_id(value: str) -> bool:
    return bool(_ID_RE.match(value))


def forbidden_markup(text: str) -> str | None:
    """The first injection marker or special token found in `text`, or None when it is clean."""
    found = _MARKER_RE.search(text) or _SPECIAL_TOKEN_RE.search(text)
    return found.group(0) if found else None


def scrub_markup(text: str) -> str:
    """Remove injected experience blocks, markers and special tokens (for text we derive ourselves)."""
    text = _EXP_BLOCK_RE.sub(" ", text)
    text = _EXP_HEADING_RE.sub(" ", text)
    text = _MARKER_RE.sub(" ", text)
    return _SPECIAL_TOKEN_RE.sub(" ", text)


def normalize(text: str) -> str:
    return _WS_RE.sub(" ", text).strip()


def content_hash(when_to_use: str, content: str) -> str:
    """sha256 over the case- and whitespace-normalised pair: the key of exact deduplication."""
    key = normalize(when_to_use).lower() + "\n" + normalize(content).lower()
    return hashlib.sha256(key.encode()).hexdigest()


def truncate(text: str, limit: int) -> str:
    text = normalize(text)
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def message_text(content: Any) -> str:
    """Text of an OpenAI message `content`: a string, or a list of parts with `text`."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def task_text_from_messages(messages: list[Any]) -> str:
    """The user's task in an initial message list: the first user message, injected experience removed.

    The system prompt is skipped on purpose: MiniLM reads 256 word-pieces, and a long system prompt
    would otherwise be all that gets embedded.
    """
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            text = normalize(scrub_markup(message_text(message.get("content"))))
            if text:
                return text
    return ""


def query_text(query: str) -> str:
    """The text to embed for a retrieval query.

    AgentEvolver's experience client sends `json.dumps(initial_messages)` as the query; recognise that
    (a JSON list of chat messages, or an object with `messages`) and use the user's task text.
    """
    stripped = query.strip()
    if stripped[:1] in ("[", "{"):
        try:
            parsed = json.loads(stripped)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("messages"), list):
            parsed = parsed["messages"]
        if isinstance(parsed, list) and parsed and all(isinstance(m, dict) and "role" in m for m in parsed):
            task = task_text_from_messages(parsed)
            if task:
                return task
    return normalize(scrub_markup(stripped))


_TOKEN_RE = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    "a an the to of in on at for and or with my me i is it this that be by from you your what how do can "
    "please are was were will would should could as into about than then so if not no our we us they them "
    "their there here when where which who whom whose why all any some each".split())


def lexical_tokens(text: str) -> list[str]:
    """Lower-cased word tokens without stopwords, with a light suffix strip (emails -> email)."""
    out = []
    for word in _TOKEN_RE.findall(text.lower()):
        if word in STOPWORDS:
            continue
        for suffix in ("ing", "es", "s", "ed"):
            if len(word) > 4 and word.endswith(suffix):
                word = word[: -len(suffix)]
                break
        out.append(word)
    return out
