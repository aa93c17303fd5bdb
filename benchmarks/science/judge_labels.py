"""Generate the judge's ground-truth step labels (a fixed, versioned fixture): trajectories whose every step's
correctness is known, on `flights` and `bfcl`.

    .venv/bin/python benchmarks/science/judge_labels.py [--out benchmarks/fixtures/judge_step_labels_v1.jsonl]
                                                        [--flights-rollouts 4] [--bfcl-rollouts 2] [--no-rollouts]

Sources (the environments run in-process; outcomes are their own graders' scores):
- `reference`: the task's reference solution replayed, then a closing reply: every step GOOD.
- perturbed references (labels follow the rule "BAD at the perturbed step; later steps BAD unless they
  repair it"; steps before it stay GOOD, a closing reply is GOOD only when the episode succeeded):
  `wrong_argument` (the state-changing call with a wrong argument, then the closing reply),
  `wrong_tool` (an information call replaced by another tool, then repaired by the right call),
  `redundant_call` (a call repeated with no new effect), `premature_finish` (the closing reply before the
  state-changing call). On bfcl the perturbation sits in the last user turn; earlier turns are replayed.
- `rollout`: SmolLM2 (through `llm_server`, temperature 0.7, fixed seeds) acting as the agent, labelled by a
  programmatic rule: a step is GOOD when every call in it is a not-yet-made call of the reference solution
  (flights: same tool and arguments, order ids resolved against the live state; bfcl: a ground-truth call
  of the current turn) and none of them errs; a reply without calls is GOOD when the episode (flights) or
  the turn (bfcl: all its ground-truth calls made) is complete; everything else is BAD.

Version 2 (`--version 2`) is version 1's records plus a flights v2 tier-1 part (env `flights_v2`: a world per
task, strict grading), scripted episodes of the test split's lookups, labelled from the environment's ground
truth: a call step is GOOD when it is the task's reference call, not made before, and the desk answers it
without an error; a reply is GOOD when the environment grades it a success AND the reference call was made
earlier in the episode (a right value nobody looked up is a guess). Sources: `v2_correct`, `v2_guess_right`
(a call-free reply of the right value: the environment scores it 1, its label is BAD), `v2_guess_wrong`,
`v2_wrong_argument` (the lookup of another passenger / another date, then the value it showed),
`v2_wrong_argument_repaired` (then the right lookup and answer), `v2_right_call_wrong_reply` (a value the task
names as wrong), `v2_hedge` (the right value and a wrong one), `v2_redundant_call` (the lookup twice). Calls
and replies vary in format across tasks (python calls, <tool_call> JSON, fenced; "$1,234", "1234 USD").

Each line: {trajectory_id, env, task_id, source, split, query, steps: [{action, observation}], outcome,
labels}. `split` is decided by task (a hash of env and task id), so a task's trajectories share a half:
`dev` is for prompt work, `test` is the only half benchmarks/science/judge.py reports.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO  # noqa: E402
from common.actions import ActionParseError, ParsedCall, parse_actions, parse_python_calls  # noqa: E402
from common.schemas import ChatMessage  # noqa: E402
from env_service.environments.base import EnvInstance  # noqa: E402

VERSION = 1
FIXTURES = REPO / "benchmarks" / "fixtures"
DEFAULT_OUT = FIXTURES / f"judge_step_labels_v{VERSION}.jsonl"
V2_MAX_OBSERVATION_CHARS = 20_000
V2_TIER1_TASKS = 24  # the first 24 tier-1 test tasks of flights v2: 8 of each lookup kind
FLIGHT_TASKS = [f"test-{i:04d}" for i in range(8)]  # two of each kind (kinds cycle by index)
BFCL_TASKS = ["multi_turn_base_100", "multi_turn_base_133", "multi_turn_base_147", "multi_turn_base_163",
              "multi_turn_base_45", "multi_turn_base_57"]
CLOSE = "The request is handled."
MAX_OBSERVATION_CHARS = 1200
STATE_CHANGING = {"book_ticket", "cancel_order"}


def split_of(env: str, task_id: str) -> str:
    digest = hashlib.sha256(f"{env}:{task_id}".encode()).digest()
    return "dev" if digest[0] % 2 == 0 else "test"


class Recorder:
    """Steps one instance and keeps (action, observation, label) per step."""

    def __init__(self, instance: EnvInstance, max_observation_chars: int = MAX_OBSERVATION_CHARS) -> None:
        self.instance = instance
        self.max_observation_chars = max_observation_chars
        self.messages = instance.reset()
        self.steps: list[dict[str, str]] = []
        self.labels: list[str] = []
        self.done = False
        self.reward: float | None = None

    def act(self, text: str, label: str) -> str:
        result = self.instance.step(ChatMessage(role="assistant", content=text))
        observation = result.observation.text()
        self.steps.append({"action": text, "observation": observation[:self.max_observation_chars]})
        self.labels.append(label)
        self.done = result.done
        if result.done:
            self.reward = result.reward
        return observation

    def outcome(self) -> float:
        return float(self.reward if self.reward is not None else self.instance.evaluate().score)


def record(trajectory_id: str, env: str, task_id: str, source: str, query: str, rec: Recorder) -> dict[str, Any]:
    return {"trajectory_id": trajectory_id, "env": env, "task_id": task_id, "source": source,
            "split": split_of(env, task_id), "query": query, "steps": rec.steps, "outcome": rec.outcome(),
            "labels": rec.labels}


def python_call(name: str, arguments: dict[str, Any]) -> str:
    return ParsedCall(name=name, arguments=arguments).to_python()


# ---------------------------------------------------------------- flights


def flights_records(env: Any, task_id: str) -> list[dict[str, Any]]:
    from env_service.environments.flights.env import resolve_order_refs

    task = env.task(task_id)
    reference = list(task.reference)
    change = next(i for i, (name, _) in enumerate(reference) if name in STATE_CHANGING)
    info = next(i for i, (name, _) in enumerate(reference) if name in ("search_flight", "list_orders"))
    out: list[dict[str, Any]] = []

    def run(source: str, plan: list[tuple[str, Any, str]]) -> None:
        """plan: (kind, payload, label); kind "call" (name, args) with order refs resolved live, or "close"."""
        rec = Recorder(env.create(task_id))
        for kind, payload, label in plan:
            if kind == "close":
                rec.act(CLOSE, label)
                continue
            name, arguments = payload
            rec.act(python_call(name, resolve_order_refs(rec.instance.desk, arguments)), label)
        outcome = rec.outcome()
        if plan[-1][0] == "close" and plan[-1][2] == "?":  # the closing reply is GOOD exactly when it succeeded
            rec.labels[-1] = "GOOD" if outcome > 0.5 else "BAD"
        out.append(record(f"flights:{task_id}:{source}", "flights", task_id, source, task.query, rec))

    calls = [("call", step, "GOOD") for step in reference]
    run("reference", [*calls, ("close", None, "?")])
    wrong = _wrong_flight_argument(env, task, reference[change])
    run("wrong_argument", [*calls[:change], ("call", wrong, "BAD"), ("close", None, "?")])
    # The wrong tool answers nothing the task needs: the passenger's orders instead of a search, or a
    # search of the reversed route instead of the passenger's orders.
    target = env.world.flights[task.target_flight]
    other = ("list_orders", {"passenger_id": task.passenger_id}) if reference[info][0] == "search_flight" \
        else ("search_flight", {"origin": target.destination, "destination": target.origin, "date": target.date})
    run("wrong_tool", [*calls[:info], ("call", other, "BAD"), *calls[info:], ("close", None, "?")])
    run("redundant_call", [*calls[:info + 1], ("call", reference[info], "BAD"), *calls[info + 1:],
                           ("close", None, "?")])
    run("premature_finish", [*calls[:change], ("close", None, "BAD")])
    return out


def _wrong_flight_argument(env: Any, task: Any, call: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    name, arguments = call
    if name == "book_ticket":
        flight = env.world.flights[arguments["flight_id"]]
        others = [f for f in env.world.route_flights(flight.origin, flight.destination, flight.date)
                  if f.flight_id != flight.flight_id and f.seats > 0]
        if others:
            return name, {**arguments, "flight_id": sorted(others, key=lambda f: f.flight_id)[0].flight_id}
        return name, {**arguments, "passenger_id": "P9999"}
    # cancel_order: the other order of the same passenger (the decoy the query says to keep)
    passenger_id, flight_id = arguments["order_id"].removeprefix("$order:").split(":")
    decoy = next((f for p, f in task.preload if p == passenger_id and f != flight_id), None)
    if decoy is None:
        return name, {"order_id": "O-000000"}
    return name, {"order_id": f"$order:{passenger_id}:{decoy}"}


# ---------------------------------------------------------------- flights v2, tier 1


def flights_v2_env() -> Any:
    from env_service.environments.flights.env import FlightsEnvironment

    return FlightsEnvironment({"version": 2, "tiers": {1: 1}})


def _money(value: str, style: int) -> str:
    amount = int(value)
    return (f"${amount:,}", f"{amount} USD", f"{amount:,}.00 dollars")[style % 3]


def _call_text(name: str, arguments: dict[str, Any], style: int) -> str:
    call = python_call(name, arguments)
    if style % 3 == 1:
        return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
    if style % 3 == 2:
        return f"Let me look that up.\n```\n{call}\n```"
    return call


def _reply(task: Any, value: str, style: int) -> str:
    if task.kind == "id_lookup":
        return f"The passenger id is {value}."
    if task.kind == "credit_lookup":
        return f"{task.query.split(' does ')[1].split(' have')[0]} has {_money(value, style)} of travel credit."
    return f"The cheapest fare with seats left is {_money(value, style)}."


def _wrong_lookup(task: Any) -> tuple[tuple[str, dict[str, Any]], str]:
    """Another passenger's lookup (credit, id) or the route on another date (fare), and the value it shows."""
    name, arguments = task.reference[0]
    world = task.world
    if task.kind == "fare_lookup":
        date = next(d for d in world.dates if d != arguments["date"]
                    and world.route_flights(arguments["origin"], arguments["destination"], d))
        flights = [f for f in world.route_flights(arguments["origin"], arguments["destination"], date) if f.seats]
        shown = str(min(f.price for f in flights)) if flights else task.wrong_answers[0]
        return (name, {**arguments, "date": date}), shown
    other = next(p for p in sorted(world.passengers.values(), key=lambda p: p.passenger_id)
                 if p.name != arguments["name"])
    shown = other.passenger_id if task.kind == "id_lookup" else str(other.balance)
    return (name, {"name": other.name}), shown


def flights_v2_records(env: Any, task_id: str, index: int) -> list[dict[str, Any]]:
    task = env.task(task_id)
    reference = task.reference[0]
    call = _call_text(*reference, index)
    wrong_call, shown = _wrong_lookup(task)
    wrong_text = _call_text(*wrong_call, index + 1)
    right, wrong = _reply(task, task.answer, index), _reply(task, task.wrong_answers[0], index)
    hedge = f"It is {task.answer}, or possibly {task.wrong_answers[0]}."
    plans = {
        "v2_correct": [call, right],
        "v2_guess_right": [right],
        "v2_guess_wrong": [wrong],
        "v2_wrong_argument": [wrong_text, _reply(task, shown, index)],
        "v2_wrong_argument_repaired": [wrong_text, call, right],
        "v2_right_call_wrong_reply": [call, wrong],
        "v2_hedge": [call, hedge],
        "v2_redundant_call": [call, call, right],
    }
    out = []
    for source, actions in plans.items():
        # Whole observations, as the trainer sends them: a route's search result runs past 1,200 characters.
        rec = Recorder(env.create(task_id), max_observation_chars=V2_MAX_OBSERVATION_CHARS)
        looked_up = False
        made: set[str] = set()
        for text in actions:
            calls = parse_calls(text) or []
            observation = rec.act(text, "?")
            if calls:  # ground truth: the task's own reference call, new, and answered without an error
                keys = {_key(c) for c in calls}
                good = keys == {_key(ParsedCall(*reference))} and not keys & made \
                    and not observation.startswith("Error")
                made |= keys
                looked_up |= good
                rec.labels[-1] = "GOOD" if good else "BAD"
            else:  # ground truth: the environment's grade of the reply, and the value was looked up first
                rec.labels[-1] = "GOOD" if looked_up and rec.outcome() > 0.5 else "BAD"
        out.append(record(f"flights_v2:{task_id}:{source}", "flights_v2", task_id, source, task.query, rec))
    return out


def v2_tier1_part() -> list[dict[str, Any]]:
    env = flights_v2_env()
    return [r for i, t in enumerate(env.task_ids("test")[:V2_TIER1_TASKS]) for r in flights_v2_records(env, t, i)]


# ---------------------------------------------------------------- bfcl


def bfcl_records(env: Any, task_id: str) -> list[dict[str, Any]]:
    from tests.env_service.bfcl_ground_truth import keyword_call

    task = env.tasks[task_id]
    classes = task.involved_classes
    turns = [[keyword_call(c, classes) for c in turn] for turn in task.ground_truth]
    query = bfcl_query(task)
    last = len(turns) - 1
    out: list[dict[str, Any]] = []

    def message(calls: list[str]) -> str:
        return "[" + ", ".join(calls) + "]"

    def run(source: str, last_turn: list[tuple[str, str]]) -> None:
        """Earlier turns replayed (calls, then the closing reply, GOOD); the last turn as given ("?": by outcome)."""
        rec = Recorder(env.create(task_id))
        for turn in turns[:last]:
            if turn:
                rec.act(message(turn), "GOOD")
            rec.act(CLOSE, "GOOD")
        for text, label in last_turn:
            rec.act(text, label)
        outcome = rec.outcome()
        if rec.labels and rec.labels[-1] == "?":
            rec.labels[-1] = "GOOD" if outcome > 0.5 else "BAD"
        out.append(record(f"bfcl:{task_id}:{source}", "bfcl", task_id, source, query, rec))

    final = turns[last]
    run("reference", [(message(final), "GOOD"), (CLOSE, "?")])
    run("wrong_argument", [(message([_wrong_bfcl_argument(c) for c in final[:1]] + final[1:]), "BAD"),
                           (CLOSE, "?")])
    other = _other_function(env, task, final)
    run("wrong_tool", [(message([other]), "BAD"), (message(final), "GOOD"), (CLOSE, "?")])
    run("redundant_call", [(message(final), "GOOD"), (message(final[-1:]), "BAD"), (CLOSE, "?")])
    run("premature_finish", [(CLOSE, "BAD")])
    return out


def bfcl_query(task: Any) -> str:
    turns = ["\n".join(m["content"] for m in turn) for turn in task.turns]
    return "\n".join(f"Turn {i + 1}: {text}" for i, text in enumerate(turns))


def _wrong_bfcl_argument(call: str) -> str:
    parsed = parse_python_calls(call)[0]
    arguments = dict(parsed.arguments)
    if not arguments:
        return call
    key = sorted(arguments)[0]
    value = arguments[key]
    if isinstance(value, bool):
        arguments[key] = not value
    elif isinstance(value, (int, float)):
        arguments[key] = value * 2 + 1
    elif isinstance(value, str):
        arguments[key] = value[::-1] + "X" if value else "X"
    elif isinstance(value, list):
        arguments[key] = value[:-1] if value else ["X"]
    return ParsedCall(name=parsed.name, arguments=arguments).to_python()


def _other_function(env: Any, task: Any, final: list[str]) -> str:
    """A function of the task's classes that takes no argument and is not among the turn's calls."""
    used = {parse_python_calls(c)[0].name for c in final}
    for tool in env.tool_docs(task.task_id):
        fn = tool["function"]
        if fn["name"] not in used and not (fn.get("parameters") or {}).get("required") \
                and "available_from_turn" not in tool:
            return f"{fn['name']}()"
    return "pwd()"


# ---------------------------------------------------------------- rollouts


def _key(call: ParsedCall) -> str:
    return json.dumps([call.name, call.arguments], sort_keys=True, default=str)


async def rollouts(env_name: str, env: Any, task_ids: list[str], llm_url: str, per_env: int,
                   seed: int) -> list[dict[str, Any]]:
    from common.llm import LLMClient, LLMRoleConfig

    llm = LLMClient("agent", LLMRoleConfig(base_url=llm_url, model="smollm2", max_retries=0, timeout=600,
                                           structured="off"))
    rng = random.Random(seed)
    out = []
    try:
        for n in range(per_env):
            task_id = task_ids[n % len(task_ids)]
            out.append(await _rollout(env_name, env, task_id, llm, rng.randrange(1 << 30), n))
            print(f"rollout {env_name} {n + 1}/{per_env}: {task_id}, {len(out[-1]['steps'])} steps, "
                  f"outcome {out[-1]['outcome']}", file=sys.stderr, flush=True)
    finally:
        await llm.aclose()
    return out


async def _rollout(env_name: str, env: Any, task_id: str, llm: Any, seed: int, n: int) -> dict[str, Any]:
    rec = Recorder(env.create(task_id))
    messages = [m.model_dump(exclude_none=True) for m in rec.messages]
    if env_name == "flights":
        task = env.task(task_id)
        query, judge_step = task.query, _flights_rule(env, task, rec)
        max_steps = 6
    else:
        task = env.tasks[task_id]
        query, judge_step = bfcl_query(task), _bfcl_rule(task, rec)
        max_steps = 2 * len(task.turns)
    for _ in range(max_steps):
        result = await llm.chat(messages, temperature=0.7, max_tokens=64, seed=seed)
        text = result.text.strip() or "(empty reply)"
        label = judge_step(text)
        observation = rec.act(text, label)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": observation}]
        if rec.done:
            break
    outcome = rec.outcome()
    rec.labels = [("GOOD" if outcome > 0.5 else "BAD") if lab == "?" else lab  # a closing reply, by the outcome
                  for lab in rec.labels]
    return record(f"{env_name}:{task_id}:rollout{n}", env_name, task_id, "rollout", query, rec)


def parse_calls(text: str) -> list[ParsedCall] | None:
    """The calls in an action; None when it does not parse."""
    try:
        return parse_actions(ChatMessage(role="assistant", content=text))
    except ActionParseError:
        return None


def _flights_rule(env: Any, task: Any, rec: Recorder) -> Callable[[str], str]:
    from env_service.environments.flights.env import resolve_order_refs

    made: set[str] = set()

    def label(text: str) -> str:
        calls = parse_calls(text)
        if calls is None:
            return "BAD"
        if not calls:
            return "?"  # a closing reply: decided by the outcome once the episode ends
        wanted = {}
        for name, arguments in task.reference:
            try:
                wanted[_key(ParsedCall(name=name, arguments=resolve_order_refs(rec.instance.desk, arguments)))] = 1
            except StopIteration:  # the order it refers to does not exist (yet, or any more)
                continue
        keys = [_key(c) for c in calls]
        good = all(k in wanted and k not in made for k in keys) and len(set(keys)) == len(keys)
        made.update(keys)
        return "GOOD" if good and not _errs(rec, text) else "BAD"

    return label


def _errs(rec: Recorder, text: str) -> bool:
    """Whether the calls would fail: tried on a copy of the live desk, so the real episode is unchanged."""
    import copy

    from env_service.environments.flights.desk import ToolError

    desk = copy.deepcopy(rec.instance.desk)
    for call in parse_calls(text) or []:
        try:
            desk.call(call.name, call.arguments)
        except (ToolError, TypeError, KeyError, ValueError):
            return True
    return False


def _bfcl_rule(task: Any, rec: Recorder) -> Callable[[str], str]:
    from tests.env_service.bfcl_ground_truth import keyword_call

    truth = [{_key(parse_python_calls(keyword_call(c, task.involved_classes))[0]) for c in turn}
             for turn in task.ground_truth]
    made: list[set[str]] = [set() for _ in truth]

    def label(text: str) -> str:
        turn = min(rec.instance.turn, len(truth) - 1)
        calls = parse_calls(text)
        if calls is None:
            return "BAD"
        if not calls:
            return "GOOD" if made[turn] == truth[turn] else "BAD"
        keys = [_key(c) for c in calls]
        good = all(k in truth[turn] and k not in made[turn] for k in keys) and len(set(keys)) == len(keys)
        made[turn].update(k for k in keys if k in truth[turn])
        return "GOOD" if good else "BAD"

    return label


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--flights-rollouts", type=int, default=4)
    parser.add_argument("--bfcl-rollouts", type=int, default=2, help="fewer: bfcl's tool docs make long prompts")
    parser.add_argument("--no-rollouts", action="store_true")
    parser.add_argument("--llm-url", default=None, help="a running llm_server (…/v1) serving smollm2")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--version", type=int, choices=[1, 2], default=VERSION, help=(
        "2: version 1's records (read from its fixture) plus the flights v2 tier-1 part"))
    args = parser.parse_args()
    if args.version == 2:
        v1 = FIXTURES / "judge_step_labels_v1.jsonl"
        records = [json.loads(line) for line in v1.read_text().splitlines() if line.strip()] + v2_tier1_part()
        out = args.out if args.out != DEFAULT_OUT else FIXTURES / "judge_step_labels_v2.jsonl"
        write(out, records)
        print(json.dumps({"benchmark": "judge_labels", "version": 2, "out": str(out.relative_to(REPO)),
                          **summarize(records)}))
        return

    from env_service.environments.bfcl import BfclEnvironment
    from env_service.environments.flights.env import FlightsEnvironment

    flights = FlightsEnvironment()
    bfcl = BfclEnvironment({"categories": ["multi_turn_base"]})
    records = [r for t in FLIGHT_TASKS for r in flights_records(flights, t)]
    records += [r for t in BFCL_TASKS for r in bfcl_records(bfcl, t)]
    if not args.no_rollouts:
        records += asyncio.run(_all_rollouts(flights, bfcl, args))
    write(args.out, records)
    summary = summarize(records)
    print(json.dumps({"benchmark": "judge_labels", "version": VERSION, "out": str(args.out),
                      **summary}))


async def _all_rollouts(flights: Any, bfcl: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    from contextlib import ExitStack

    from tests.helpers import run_service

    with ExitStack() as stack:
        url = args.llm_url or stack.enter_context(run_service("llm_server", ["--model", "smollm2"],
                                                              timeout=600)).url + "/v1"
        out = await rollouts("flights", flights, FLIGHT_TASKS, url, args.flights_rollouts, args.seed)
        out += await rollouts("bfcl", bfcl, BFCL_TASKS, url, args.bfcl_rollouts, args.seed + 1)
    return out


def write(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for r in records:
            handle.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    from judge.agreement import LabelledTrajectory, fixture_summary

    rows = [LabelledTrajectory.model_validate(r) for r in records]  # the fixture's own schema, checked here
    summary: dict[str, Any] = {split: fixture_summary([r for r in rows if r.split == split])
                               for split in ("dev", "test")}
    summary["by_source"] = {}
    for r in records:
        entry = summary["by_source"].setdefault(r["source"], {"trajectories": 0, "steps": 0, "successes": 0})
        entry["trajectories"] += 1
        entry["steps"] += len(r["labels"])
        entry["successes"] += int(r["outcome"] > 0.5)
    return summary


if __name__ == "__main__":
    main()
