"""Context templates: how a multi-turn episode becomes exact token ids, loss masks and step ids.

The policy's generated ids are kept as they came out of the model (never re-tokenized); everything
else (the prompt, the glue that closes an assistant turn, observations) is rendered through the
tokenizer's chat template and gets loss mask 0. A training sample is one or more `Segment`s: a
segment grows while the context only appends; when a template rewrites the context (a sliding
window drops a turn, the model drops turns itself), the segment closes and a new one starts with
the rewritten context as its prompt.

Experience (self-navigating) is injected for generation only: as text in the user message between
`<EXP>` markers (`inject: text`), or as a solved task's chat turns between the system prompt and the
task (`inject: turns`, `demonstration_turns`). The training prompt is rendered from the same messages
*without* it, so those tokens are absent from the training sample, and the generated ids are reused
as they are.

Templates:
- `linear`: the whole history, one segment.
- `linear_think`: like linear, the model reasons in `<think>...</think>` first; only the text after
  the reasoning goes to the environment (the reasoning tokens are still trained).
- `sliding_window`: keeps the prompt plus the last `window` turns (constant memory on long horizons).
- `self_managed`: the model may write `<drop>1,3</drop>` (or `<drop>2-4</drop>`) to remove earlier
  turns, numbered from 1, from its context; the directive is removed from the action.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

EXP_OPEN, EXP_CLOSE = "<EXP>", "</EXP>"
_PLACEHOLDER = "\u2063EVOLVER_TURN\u2063"
THINK_PATTERN = re.compile(r"<think>.*?</think>", re.DOTALL)
DROP_PATTERN = re.compile(r"<drop>\s*([\d,\s\-]+)\s*</drop>")


def inject_experience(query: str, experience: str) -> str:
    return f"{EXP_OPEN}\n{experience.strip()}\n{EXP_CLOSE}\n\n{query}"


def _call_text(call: dict[str, Any]) -> str:
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return "<tool_call>" + json.dumps({"name": function.get("name"), "arguments": arguments}) + "</tool_call>"


def demonstration_turns(demonstration: list[dict[str, Any]]) -> list[dict[str, str]]:
    """A demonstration as the chat turns the policy sees: observations become user turns (as
    `_turn_glue` renders the episode's own observations), structured tool calls become text.

    The turns alternate and end with the assistant: the task's own user message follows them, and two
    user turns in a row (a replayed reference ends at the observation of its last call) are a shape the
    chat model never saw. So consecutive observations are joined into one turn and trailing ones dropped.
    """
    turns: list[dict[str, str]] = []
    for message in demonstration:
        content = message.get("content") or ""
        role = "assistant" if message.get("role") == "assistant" else "user"
        if role == "assistant":
            calls = message.get("tool_calls") or []
            content = content or "\n".join(_call_text(c) for c in calls if isinstance(c, dict))
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += "\n" + content
        else:
            turns.append({"role": role, "content": content})
    while turns and turns[-1]["role"] != "assistant":
        turns.pop()
    return turns


@dataclass(frozen=True)
class DemonstrationBudget:
    """How much room a demonstration must leave for the episode itself, and how it is shortened.

    The episode needs as many turns as the demonstration shows (at most `max_turns`): a full generation
    for each, and between them observations like the demonstration's own (the same kind of task gets
    results of the same size), counted uncut. When the demonstration does not fit whole, each of its
    observations is cut to `observation_tokens` (the calls stay whole)."""

    max_new_tokens: int
    max_turns: int
    observation_tokens: int

    def reserve(self, turns: list[dict[str, str]], count_tokens: Callable[[str], int]) -> int:
        needed = max(1, min(self.max_turns, sum(t["role"] == "assistant" for t in turns)))
        observations = [t for t in turns[1:] if t["role"] != "assistant"][: needed - 1]
        return needed * self.max_new_tokens + sum(count_tokens(t["content"]) for t in observations)


DemonstrationFit = Literal["whole", "shortened", "dropped"]


@dataclass
class Segment:
    """One training sample: prompt ids (mask 0) then response ids with per-token mask and step id."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    step_ids: list[int] = field(default_factory=list)

    def extend(self, ids: list[int], mask: int, step: int) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.step_ids.extend([step] * len(ids))


@dataclass
class _Turn:
    step: int
    generated: list[int]  # the policy's ids, exactly
    rest: list[int]  # glue closing the turn + the observation + the next generation prompt
    has_observation: bool


class ContextTemplate:
    """Linear context; subclasses change what the policy sees and how actions are extracted."""

    name = "linear"

    def __init__(self, tokenizer: Any, max_context: int = 4096) -> None:
        self.tokenizer, self.max_context = tokenizer, max_context
        self.eos_id: int | None = tokenizer.eos_token_id
        self._turns: list[_Turn] = []
        self._segments: list[Segment] = []
        self._context_turns: list[int] = []  # indices into _turns that the policy currently sees

    # ------------------------------------------------------------------ rendering helpers

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _turn_glue(self, ended_with_eos: bool, observation: str | None) -> str:
        """Text that follows a generated turn: the chat template's closing of the assistant message,
        then (when there is one) the observation as a user turn and the next generation prompt."""
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PLACEHOLDER}]
        if observation is None:
            text = self.render(base, add_generation_prompt=False)
        else:
            text = self.render(base + [{"role": "user", "content": observation}], add_generation_prompt=True)
        glue = text.split(_PLACEHOLDER, 1)[1]
        eos_text = self.tokenizer.eos_token or ""
        if ended_with_eos and eos_text and glue.startswith(eos_text):
            glue = glue[len(eos_text):]
        return glue

    # ------------------------------------------------------------------ episode API

    def start(self, messages: list[dict], experience: str | None = None,
              demonstration: list[dict[str, Any]] | None = None,
              budget: DemonstrationBudget | None = None) -> None:
        """Begin an episode from the environment's initial [system, user] messages; `demonstration`
        (chat turns of a solved task) goes before the first non-system message, for generation only.

        With a `budget`, the demonstration must leave `budget.reserve` tokens of the context: else its
        observations are cut to `budget.observation_tokens` each (the calls stay whole), and if it still
        does not fit the episode starts without it. `demonstration_fit` says which happened."""
        self.messages = [dict(m) for m in messages]
        plain = self.render(self.messages, add_generation_prompt=True)
        self.prompt_plain = self.encode(plain)
        self.demonstration_fit: DemonstrationFit | None = None
        if demonstration:
            self.prompt_generation, self.demonstration_fit = self._fit_demonstration(
                demonstration_turns(demonstration), budget)
        elif experience:
            with_exp = [dict(m) for m in self.messages]
            last_user = max(i for i, m in enumerate(with_exp) if m["role"] == "user")
            with_exp[last_user]["content"] = inject_experience(with_exp[last_user]["content"], experience)
            self.prompt_generation = self.encode(self.render(with_exp, add_generation_prompt=True))
        else:
            self.prompt_generation = list(self.prompt_plain)
        self._segments = [Segment(prompt_ids=list(self.prompt_plain))]

    def _with_demonstration(self, turns: list[dict[str, str]]) -> list[int]:
        at = next((i for i, m in enumerate(self.messages) if m["role"] != "system"), len(self.messages))
        return self.encode(self.render([*self.messages[:at], *turns, *self.messages[at:]], add_generation_prompt=True))

    def _cut(self, text: str, tokens: int) -> str:
        ids = self.encode(text)
        if len(ids) <= tokens:
            return text
        return self.tokenizer.decode(ids[:tokens]) + " ..."

    def _fit_demonstration(self, turns: list[dict[str, str]],
                           budget: DemonstrationBudget | None) -> tuple[list[int], DemonstrationFit]:
        ids = self._with_demonstration(turns)
        limit = self.max_context - (budget.reserve(turns, lambda text: len(self.encode(text))) if budget else 0)
        if budget is None or len(ids) <= limit:
            return ids, "whole"
        # The first turn is the demonstrated task's query; the later user turns are its observations.
        cut = [t if i == 0 or t["role"] == "assistant" else {**t, "content": self._cut(t["content"],
                                                                                         budget.observation_tokens)}
               for i, t in enumerate(turns)]
        ids = self._with_demonstration(cut)
        if len(ids) <= limit:
            return ids, "shortened"
        return list(self.prompt_plain), "dropped"

    def generation_context(self) -> list[int]:
        """The ids the policy continues from now (with experience, when injected)."""
        ids = list(self.prompt_generation)
        for i in self._context_turns:
            ids += self._turns[i].generated + self._turns[i].rest
        return ids

    def budget(self) -> int:
        """Tokens the next generation may use before the context limit."""
        return self.max_context - len(self.generation_context())

    def action_text(self, generated_text: str) -> str:
        """What of the generated text is sent to the environment."""
        return generated_text

    def add_turn(self, step: int, generated_ids: list[int], generated_text: str) -> str:
        """Record the policy's ids for `step`; returns the action to send to the environment."""
        self._turns.append(_Turn(step=step, generated=list(generated_ids), rest=[], has_observation=False))
        self._context_turns.append(len(self._turns) - 1)
        self._segments[-1].extend(generated_ids, 1, step)
        return self.action_text(generated_text)

    def add_observation(self, observation: str | None) -> None:
        """Append the environment's answer (None: the episode ended, only close the turn)."""
        turn = self._turns[-1]
        ended = bool(turn.generated) and self.eos_id is not None and turn.generated[-1] == self.eos_id
        rest = self.encode(self._turn_glue(ended, observation))
        turn.rest, turn.has_observation = rest, observation is not None
        self._segments[-1].extend(rest, 0, turn.step)
        self.after_observation()

    def after_observation(self) -> None:
        """Hook for templates that rewrite the context between turns."""

    def _restart_segment(self) -> None:
        """The context was rewritten: later tokens train against the new context as their prompt."""
        prompt = list(self.prompt_plain)
        for i in self._context_turns:
            prompt += self._turns[i].generated + self._turns[i].rest
        self._segments.append(Segment(prompt_ids=prompt))

    def segments(self) -> list[Segment]:
        """The training samples, without experience; empty trailing segments are dropped."""
        return [s for s in self._segments if any(s.loss_mask)]


class LinearThinkTemplate(ContextTemplate):
    name = "linear_think"
    instruction = ("First think step by step inside <think></think>, then write only your action after it.")

    def start(self, messages: list[dict], experience: str | None = None,
              demonstration: list[dict[str, Any]] | None = None,
              budget: DemonstrationBudget | None = None) -> None:
        messages = [dict(m) for m in messages]
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{self.instruction}"
        super().start(messages, experience, demonstration, budget)

    def action_text(self, generated_text: str) -> str:
        text = THINK_PATTERN.sub("", generated_text)
        if "<think>" in text:  # reasoning never closed: no action was given
            return ""
        return text.strip()


class SlidingWindowTemplate(ContextTemplate):
    name = "sliding_window"

    def __init__(self, tokenizer: Any, max_context: int = 4096, window: int = 3) -> None:
        super().__init__(tokenizer, max_context)
        if window < 1:
            raise ValueError("sliding_window needs window >= 1")
        self.window = window

    def after_observation(self) -> None:
        if len(self._context_turns) > self.window:
            self._context_turns = self._context_turns[-self.window:]
            self._restart_segment()


class SelfManagedTemplate(ContextTemplate):
    name = "self_managed"

    def add_turn(self, step: int, generated_ids: list[int], generated_text: str) -> str:
        self._pending_drop = self._parse_drop(generated_text)
        super().add_turn(step, generated_ids, generated_text)
        return DROP_PATTERN.sub("", generated_text).strip()

    @staticmethod
    def _parse_drop(text: str) -> set[int]:
        turns: set[int] = set()
        for match in DROP_PATTERN.finditer(text):
            for part in match.group(1).split(","):
                part = part.strip()
                if "-" in part:
                    lo, _, hi = part.partition("-")
                    if lo.strip().isdigit() and hi.strip().isdigit():
                        turns.update(range(int(lo), int(hi) + 1))
                elif part.isdigit():
                    turns.add(int(part))
        return turns

    def after_observation(self) -> None:
        # Turns are numbered from 1 in the order they happened; the current turn is never dropped.
        current = len(self._turns) - 1
        drop = {n - 1 for n in self._pending_drop} - {current}
        kept = [i for i in self._context_turns if i not in drop]
        if kept != self._context_turns:
            self._context_turns = kept
            self._restart_segment()


TEMPLATES: dict[str, type[ContextTemplate]] = {
    t.name: t for t in (ContextTemplate, LinearThinkTemplate, SlidingWindowTemplate, SelfManagedTemplate)
}


def make_template(name: str, tokenizer: Any, max_context: int = 4096, **options: Any) -> ContextTemplate:
    try:
        cls = TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown context template {name!r}; choose one of {', '.join(TEMPLATES)}") from None
    return cls(tokenizer, max_context, **options)
