"""Retrieval as the agent's own action (`trainer.experience.mode: action`) and at every step (`mode: step`).

Shared by the local trainer, evaluation and the veRL agent loop: `run_episode` takes an `AskPolicy` and runs
one `EpisodeAsks` per episode; nothing in this module knows which backend runs the episode.

`action`: the policy asks the experience pool itself, by a reserved tool listed with the environment's tools
(`search_experience(query='...')`, format `tool`) or by EvolveR's tag (`<search_experience>query
</search_experience>`, format `tag`). An ask is answered here and never reaches the environment. It is a
`Step` like an environment step (its generated tokens carry its step index) with `info["ask"]`:
`{"query", "hits": [{"id", "score", "text"}], "over_budget", "withheld"}`. The answer is an observation that
stays in the context (training and generation see the same tokens, so the rollout's log-probs stay valid) and
is mask 0 like every observation.

`step`: before every turn the pool is searched with the task's query and the latest observation (SLEA-RL);
the hits go into the context as an `<experience>` block after that observation (before the first turn: after
the task in its user message), kept for training like any observation. The step's `info["retrieval"]` holds
the query and the hits; it is an environment step, not an ask.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from common.actions import ActionParseError, parse_text_actions
from common.schemas import ChatMessage, Step, Trajectory

if TYPE_CHECKING:
    from trainer.config import ExperienceConfig

AskFormat = Literal["tool", "tag"]
ASK_TOOL = "search_experience"
_TAG = re.compile(r"<search_experience>(.*?)</search_experience>", re.DOTALL)
WITHHELD_NOTE = "No experience is given in this episode: continue without it."


@dataclass(frozen=True)
class Hit:
    """One experience an ask (or a step's retrieval) returned: its id, retrieval score and rendered text."""

    id: str
    score: float
    text: str

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "score": self.score, "text": self.text}


class AskSource(Protocol):
    async def search(self, query: str, task_kind: str | None = None) -> list[Hit]:
        """The pool's hits for `query`, best first (empty: nothing relevant)."""


@dataclass
class AskPolicy:
    """How an episode reaches the pool on its own: `mode` action (the policy asks, at most `budget` times) or
    step (a retrieval before every turn).

    `withhold`: every ask is recorded and counted but answered with `WITHHELD_NOTE` and no retrieval (the
    paired branch's "without the answer"). `on_ask(instance_id, turn)` is awaited before an ask within the
    budget is answered (the paired branch forks the environment there)."""

    source: AskSource
    mode: Literal["action", "step"] = "action"
    budget: int = 2
    format: AskFormat = "tag"
    withhold: bool = False
    on_ask: Callable[[str, int], Awaitable[None]] | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("action", "step"):
            raise ValueError(f"AskPolicy.mode must be action or step, got {self.mode!r}")
        if self.format not in ("tool", "tag"):
            raise ValueError(f"AskPolicy.format must be tool or tag (resolve auto with `resolve_format`), "
                             f"got {self.format!r}")
        if self.budget < 0:
            raise ValueError(f"AskPolicy.budget must be >= 0, got {self.budget}")

    def extra_turns(self) -> int:
        """Generation turns an episode may take beyond `max_turns` environment steps: the asks' budget."""
        return self.budget if self.mode == "action" else 0


def resolve_format(ask_format: str, tokenizer: Any) -> AskFormat:
    """`auto`: the reserved tool when the chat template renders a tools list (the model has a tool-call
    convention, and the environment's tools are called in it), else EvolveR's tag."""
    if ask_format in ("tool", "tag"):
        return ask_format  # type: ignore[return-value]
    if ask_format != "auto":
        raise ValueError(f"trainer.experience.ask_format must be auto, tool or tag, got {ask_format!r}")
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tool" if "tools" in str(template) else "tag"


def instruction(policy: AskPolicy) -> str:
    """What the system message says about asking (action mode), after the environment's own tool list."""
    if policy.format == "tool":
        how = (f"You may also call {ASK_TOOL}(query='...') to search the experience of earlier solved tasks "
               f"for advice")
    else:
        how = ("You may also write <search_experience>what you need to know</search_experience> to search the "
               "experience of earlier solved tasks for advice")
    return (f"{how}; the trainer answers it, not the environment, and it does not count as a step. "
            f"At most {policy.budget} per conversation.")


def parse_ask(text: str, ask_format: AskFormat) -> str | None:
    """The query of an ask in a generated turn, or None when the turn is not an ask.

    tool: a call of `search_experience` among the turn's calls (its `query` argument, else its first string
    argument), read from the action the template extracts (after any reasoning); tag: the first
    `<search_experience>` block anywhere in the generated text (EvolveR asks inside its reasoning). A turn that
    asks is answered as an ask as a whole: other calls in it are not executed (the answer says so)."""
    if ask_format == "tag":
        match = _TAG.search(text)
        return match.group(1).strip() if match else None
    if ASK_TOOL not in text:
        return None
    try:
        calls = parse_text_actions(text)
    except ActionParseError:
        return None
    for call in calls:
        if call.name == ASK_TOOL:
            query = call.arguments.get("query")
            if not isinstance(query, str):
                query = next((v for v in [*call.positional, *call.arguments.values()] if isinstance(v, str)), "")
            return query.strip()
    return None


def other_calls(text: str) -> int:
    """Calls in an ask turn besides the ask (not executed), in either format."""
    try:
        return sum(call.name != ASK_TOOL for call in parse_text_actions(_TAG.sub("", text)))
    except ActionParseError:
        return 0


def render_hits(hits: Sequence[Hit], ask_format: AskFormat) -> str:
    """The answer to an ask: a tool result (JSON, like the environment's) or EvolveR's `<experience>` block."""
    if ask_format == "tool":
        return json.dumps({"experiences": [{"score": round(h.score, 3), "advice": h.text} for h in hits]},
                          ensure_ascii=False)
    return experience_block(hits)


def experience_block(hits: Sequence[Hit]) -> str:
    """Hits as an `<experience>` block, one numbered line each with its score."""
    if not hits:
        return "<experience>\nNo relevant experience.\n</experience>"
    lines = [f"[{i}] (score {h.score:.2f}) {h.text.strip()}" for i, h in enumerate(hits, 1)]
    return "<experience>\n" + "\n".join(lines) + "\n</experience>"


def answer(query: str, hits: Sequence[Hit], policy: AskPolicy, *, over_budget: bool, skipped_calls: int) -> str:
    """The observation an ask gets."""
    if over_budget:
        return f"No answer: the budget of {policy.budget} experience searches per conversation is spent."
    if policy.withhold:
        text = WITHHELD_NOTE
    elif not query:
        text = f"{ASK_TOOL} needs a query: say what you need to know."
    else:
        text = render_hits(hits, policy.format)
    if skipped_calls:
        text += f"\n({skipped_calls} other call(s) in that message were not run: send them again.)"
    return text


def ask_record(query: str, hits: Sequence[Hit], *, over_budget: bool, withheld: bool) -> dict[str, Any]:
    """`Step.info["ask"]`."""
    return {"query": query, "hits": [h.record() for h in hits], "over_budget": over_budget, "withheld": withheld}


class EpisodeAsks:
    """One episode's asks (mode action) or searches before every turn (mode step), as `run_episode` meets them:
    the opening chat, each generated turn (an ask is answered here and never reaches the environment), each
    environment step's info and observation. Counts what it did."""

    def __init__(self, policy: AskPolicy, task_query: str, task_kind: str | None) -> None:
        self.policy, self.task_query, self.task_kind = policy, task_query, task_kind
        self.asked = 0  # answered asks (withheld ones included)
        self.over_budget = 0
        self.retrievals = 0  # mode step: searches
        self._pending: dict[str, Any] | None = None  # mode step: the search the next environment step acts on

    async def opening(self, chat: list[dict[str, str]]) -> list[dict[str, str]]:
        """The episode's opening messages: the ask listed after the environment's tools (action), or the first
        search, on the task alone, after the task in its user message (step)."""
        if self.policy.mode == "action":
            if chat and chat[0]["role"] == "system":
                return [{**chat[0], "content": f"{chat[0]['content']}\n{instruction(self.policy)}"}, *chat[1:]]
            return [{"role": "system", "content": instruction(self.policy)}, *chat]
        block = await self._search(self.task_query)
        if not block:
            return chat
        last_user = max(i for i, m in enumerate(chat) if m["role"] == "user")
        return [*chat[:last_user], {**chat[last_user], "content": f"{chat[last_user]['content']}\n\n{block}"},
                *chat[last_user + 1:]]

    async def ask(self, turn: int, instance_id: str, generated_text: str, action: str,
                  finish_reason: str) -> Step | None:
        """The ask step of a generated turn, answered; None when the turn is no ask (it goes to the environment).
        The tool format reads the template's action (after any reasoning), the tag the whole generated text."""
        policy = self.policy
        if policy.mode != "action":
            return None
        query = parse_ask(action if policy.format == "tool" else generated_text, policy.format)
        if query is None:
            return None
        over = self.asked >= policy.budget
        self.asked += not over
        self.over_budget += over
        if policy.on_ask is not None and not over:
            await policy.on_ask(instance_id, turn)
        hits = [] if over or policy.withhold or not query else await policy.source.search(query, self.task_kind)
        text = answer(query, hits, policy, over_budget=over, skipped_calls=other_calls(action))
        return Step(index=turn, action=ChatMessage(role="assistant", content=action),
                    observation=ChatMessage(role="tool" if policy.format == "tool" else "user", content=text),
                    info={"ask": ask_record(query, hits, over_budget=over, withheld=policy.withhold),
                          "finish_reason": finish_reason})

    def step_info(self, info: dict[str, Any]) -> dict[str, Any]:
        """An environment step's info, with the search it acted on (mode step) as `retrieval`."""
        if self._pending is None:
            return info
        info, self._pending = {**info, "retrieval": self._pending}, None
        return info

    async def observation(self, text: str) -> str:
        """What the policy sees of an observation another turn follows: with the search keyed on it (mode step)."""
        if self.policy.mode != "step":
            return text
        block = await self._search(step_query(self.task_query, text))
        return f"{text}\n\n{block}" if block else text

    def counts(self) -> dict[str, int]:
        """The `Rollout` fields of what the episode asked and searched."""
        return {"asks": self.asked, "asks_over_budget": self.over_budget, "retrievals": self.retrievals}

    async def _search(self, query: str) -> str:
        hits = await self.policy.source.search(query, self.task_kind)
        self.retrievals += 1
        self._pending = {"query": query, "hits": [h.record() for h in hits]}
        return experience_block(hits) if hits else ""


def step_query(task_query: str, observation: str | None) -> str:
    """`mode: step`: the search text of a turn -- the task, then the observation the policy acts on."""
    return task_query if not observation else f"{task_query}\n\n{observation}"


def is_ask(step: Step) -> bool:
    """Whether a step is an ask (answered by the trainer, not the environment)."""
    return isinstance(step.info.get("ask"), dict)


def environment_steps(steps: Sequence[Step]) -> list[Step]:
    """The steps the environment answered (asks left out)."""
    return [s for s in steps if not is_ask(s)]


def asked(trajectory: Trajectory) -> bool:
    """Whether an episode asked at least once (within the budget)."""
    return any(is_ask(s) and not s.info["ask"].get("over_budget") for s in trajectory.steps)


def retrieved_ids(trajectory: Trajectory) -> list[str]:
    """The experiences an episode was shown by its asks (answered ones) and step retrievals, each once, in
    order: the ids its outcome is reported against (usage, utility, pruning)."""
    ids: list[str] = []
    for step in trajectory.steps:
        record = step.info.get("ask") if is_ask(step) else step.info.get("retrieval")
        if not isinstance(record, dict) or record.get("over_budget") or record.get("withheld"):
            continue
        for hit in record.get("hits", []):
            if hit.get("id") and hit["id"] not in ids:
                ids.append(hit["id"])
    return ids


def ask_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """A batch's asking: the share of rollouts that asked, answered and over-budget asks per rollout, and the
    success rate of the rollouts that asked and of those that did not (both backends log these)."""
    if not trajectories:
        return {}
    records = [[s.info["ask"] for s in t.steps if is_ask(s)] for t in trajectories]
    answered = [sum(not r.get("over_budget") for r in rs) for rs in records]
    out = {"ask_rate": sum(a > 0 for a in answered) / len(trajectories),
           "asks_mean": sum(answered) / len(trajectories),
           "asks_over_budget": float(sum(r.get("over_budget", False) for rs in records for r in rs))}
    for name, side in (("success_asked", True), ("success_not_asked", False)):
        chosen = [float(t.outcome or 0.0) >= 1.0 for t, a in zip(trajectories, answered, strict=True) if (a > 0) == side]
        if chosen:
            out[name] = sum(chosen) / len(chosen)
    return out


def refuse_held_out(pool_task_ids: Iterable[str], held_out_task_ids: Iterable[str], workspace: str) -> None:
    """An evaluation with asks searches a pool that must hold train-split content only: refuse one with an
    experience distilled from a held-out task (it would hand the policy the answer)."""
    leaked = sorted(set(pool_task_ids) & set(held_out_task_ids))
    if leaked:
        raise ValueError(f"experience workspace {workspace!r} holds experience distilled from {len(leaked)} held-out "
                         f"task(s) ({', '.join(leaked[:5])}{' ...' if len(leaked) > 5 else ''}): evaluating with "
                         "asks needs a pool seeded from train tasks only; use a workspace without them")


def ask_policy(experience: ExperienceConfig, source: AskSource | None, tokenizer: Any) -> AskPolicy | None:
    """The run's `AskPolicy` from `trainer.experience` (None for mode group_start), searching `source`."""
    if experience.mode == "group_start":
        return None
    if source is None:
        raise ValueError(f"experience.mode={experience.mode} searches the pool: configure the experience manager "
                         "(services.experience_url)")
    return AskPolicy(source, mode=experience.mode, budget=experience.ask_budget,  # type: ignore[arg-type]
                     format=resolve_format(experience.ask_format, tokenizer))
