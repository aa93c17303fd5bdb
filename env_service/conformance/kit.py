"""The conformance run: every check against one environment of one env server.

Checks (each PASS or FAIL with the reason, a FAIL also with what to fix; `<api>` is `v1` and/or `ae`,
whichever the server offers):
- `healthz`: GET /healthz answers 200.
- `apis`: the server offers our /v1 API or the AgentEvolver routes (both are checked when offered).
- `<api>.profile` / `v1.environments`: task ids per split are lists of strings, some task exists.
- `<api>.create_shape`, `<api>.step_shape`: answers have the protocol's shapes (exactly [system, user]
  on create, exactly one message per step, a number reward, a boolean done).
- `environment_errors`: no step ends in an environment error (`info.error.code == "environment_error"`:
  the environment raised, or answered what JSON cannot carry). Every episode plays a plain-text reply and
  a malformed tool call first, the two actions an untrained policy writes most; the environment must answer
  both with an explanatory observation.
- `v1.state`: GET /v1/instances/{id}/state answers 200 with a JSON object or null, after every step (the
  task manager verifies synthetic tasks by it).
- `<api>.evaluate_range`: every score is a number in [0, 1].
- `<api>.synthetic_query`: a create with `params.query` shows that query in its user message (how a
  synthetic task's question reaches the environment; one that ignores it trains on the seed task's own
  prompt while being graded on another goal).
- `<api>.release`: release works, a released instance answers not-found, releasing twice is harmless.
- `<api>.unknown_instance`: step/evaluate on an unknown id give the API's not-found error
  (v1: 404 `{"error": ...}`; ae: a 4xx with `success: false`), never a success or a 5xx.
- `<api>.unknown_env`, `<api>.unknown_task`, `<api>.malformed`: client errors are 4xx in the API's error shape.
- `v1.fork`: an environment that declares the `fork` capability forks a stepped instance into a new one in
  the same state, and stepping the fork leaves the original's state as it was (PASS "not declared" otherwise).
- `episodes`: N random-agent episodes (random tool calls from the tool docs, random text) run to
  the end or to `max_steps`, then evaluate and release.
- `concurrency`: C instances created, stepped, evaluated and released at the same time; ids unique.
- `leak`: after every release none of our instances is still listed (GET /v1/instances), and the live
  count is back where it started; without a listing, `<api>.release` is the leak check.
- `timeouts`: no call took longer than the limit (a hanging step fails here).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from .agent import RandomAgent
from .apis import AgentEvolverApi, Answer, Api, Step, Transport, V1Api, Violation

SPLITS = ("train", "validation", "test")

# What to change when a check fails, by check name without its API prefix; written for the author of an
# environment (a plugin's class or a server of their own).
FIXES = {
    "healthz": "serve GET /healthz answering 200 once the environment can serve (check --url)",
    "apis": "serve evolver's /v1 API (env_service does for a plugin) or AgentEvolver's routes; check --url",
    "transport": "the server dropped the connection: read its log (a crash or a worker killed mid-call)",
    "environments": "task_ids(split) must return a list of string ids, with tasks in at least one split",
    "profile": "task_ids(split) must return a list of string ids, with tasks in at least one split",
    "create_shape": "reset() must return exactly [ChatMessage(role='system'), ChatMessage(role='user')] "
                    "with string content",
    "step_shape": "step() must return StepResult(observation=<one ChatMessage with string content>, "
                  "reward=<number>, done=<bool>, info=<dict of JSON values>)",
    "environment_errors": "step() must answer every action, a plain-text reply or a malformed call "
                          "included, with an explanatory observation (and info={'valid': False}), never an "
                          "exception; observation content must be a string and info JSON (no sets, no "
                          "objects). The traceback is in the env service's log (runs/<exp>/logs/env_service.log "
                          "in a launch)",
    "state": "state() must return a dict of JSON values (lists, not sets; no objects) or None",
    "evaluate_range": "evaluate() must return EvalResult(score=<a number in [0, 1]>) and never raise",
    "synthetic_query": "when create() gets params['query'], reset() must show that text as the user message",
    "release": "DELETE /v1/instances/{id} must release a live instance once (a second release says it was "
               "not live), and a released id must answer not-found",
    "unknown_instance": "a call on an unknown instance id must answer the API's not-found error, not 2xx/5xx",
    "unknown_env": "a create for an environment the server does not serve must answer a 4xx error",
    "unknown_task": "create() must raise KeyError(task_id) for a task id it does not know (answered 404)",
    "malformed": "a request body that is not JSON must answer a 4xx error in the API's error shape",
    "fork": "fork() must return an independent copy (copy.deepcopy of the world), or do not declare 'fork'",
    "episodes": "a random-agent episode must run to its end: create, steps, evaluate and release all answer",
    "concurrency": "instances must not share mutable state: create() must build a fresh world each time",
    "leak": "release must drop the instance (close() must not fail, nothing may keep it listed)",
    "timeouts": "every call must answer within --timeout: a step that waits on something must time out itself",
}


def fix_for(check: str) -> str:
    return FIXES.get(check.split(".", 1)[-1], "")


@dataclass
class CheckResult:
    name: str
    ok: bool = True
    detail: str = ""

    def fix(self) -> str:
        """What to change; a check another one stopped points there (its own fix would mislead)."""
        stopped = re.match(r"stopped by ([\w.]+):", self.detail)
        return f"fix {stopped.group(1)} (above) first" if stopped else fix_for(self.name)


@dataclass
class Report:
    url: str
    env: str
    checks: dict[str, CheckResult] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks.values())

    @property
    def failed(self) -> list[str]:
        return [name for name, c in self.checks.items() if not c.ok]

    def render(self) -> str:
        lines = [f"env_service conformance: {self.url} env={self.env}"]
        for check in self.checks.values():
            lines.append(f"{'PASS' if check.ok else 'FAIL'} {check.name}" + (f": {check.detail}" if check.detail else ""))
            if not check.ok and (fix := check.fix()):
                lines.append(f"     fix: {fix}")
        passed = sum(c.ok for c in self.checks.values())
        verdict = "CONFORMS" if self.ok else f"DOES NOT CONFORM (failed: {', '.join(self.failed)})"
        lines.append(f"{passed}/{len(self.checks)} checks passed: {verdict}")
        return "\n".join(lines)


class ConformanceKit:
    def __init__(self, url: str, env: str, *, episodes: int = 5, concurrency: int = 8, timeout_s: float = 10.0,
                 max_steps: int = 20, seed: int = 0, token: str | None = None) -> None:
        self.url, self.env = url.rstrip("/"), env
        self.episodes, self.concurrency, self.timeout_s = episodes, concurrency, timeout_s
        self.max_steps, self.seed, self.token = max_steps, seed, token
        self.report = Report(self.url, env)
        self.rng = random.Random(seed)
        self.created: list[str] = []
        self.released: set[str] = set()
        self.task_pool: list[str] = []
        self.steps = 0

    # ------------------------------------------------------------------ bookkeeping

    def _fail(self, name: str, detail: str) -> None:
        check = self.report.checks.setdefault(name, CheckResult(name))
        if check.ok:  # keep the first reason: later ones are usually its consequences
            check.ok, check.detail = False, detail

    def _pass(self, name: str, detail: str = "") -> None:
        check = self.report.checks.setdefault(name, CheckResult(name))
        if check.ok and detail:
            check.detail = detail

    @contextlib.asynccontextmanager
    async def check(self, name: str) -> AsyncIterator[None]:
        """Run a block as check `name`; a Violation fails its own check and this one."""
        self.report.checks.setdefault(name, CheckResult(name))
        try:
            yield
        except Violation as violation:
            self._fail(violation.check, violation.message)
            if violation.check != name:
                self._fail(name, f"stopped by {violation.check}: {violation.message}")
        except Exception as exc:  # a response so malformed that reading it failed
            self._fail(name, f"unexpected answer: {exc!r}")

    # ------------------------------------------------------------------ the run

    async def run(self) -> Report:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        limits = httpx.Limits(max_connections=max(8, self.concurrency * 2))
        async with httpx.AsyncClient(base_url=self.url, headers=headers, limits=limits) as client:
            transport = Transport(client, self.timeout_s)
            await self._run(transport)
            self.report.checks["timeouts"] = CheckResult(
                "timeouts", not transport.slow_calls,
                _summarize(transport.slow_calls) if transport.slow_calls else f"every call answered within {self.timeout_s:g}s")
        return self.report

    async def _run(self, transport: Transport) -> None:
        async with self.check("healthz"):
            answer = await transport.call("GET", "/healthz", "healthz")
            if answer.status != 200:
                raise Violation("healthz", f"GET /healthz answered {answer.status}")
        apis: list[Api] = []
        async with self.check("apis"):
            for api in (V1Api(transport, self.env), AgentEvolverApi(transport, self.env)):
                if await api.offered():
                    apis.append(api)
            if not apis:
                raise Violation("apis", "neither GET /v1/environments nor POST /get_env_profile answers")
            self._pass("apis", "offered: " + ", ".join(api.prefix for api in apis))
        if not apis:
            return
        listed_before = await self._live(transport)
        self.report.checks.setdefault("environment_errors", CheckResult("environment_errors"))
        for api in apis:
            await self._check_api(api)
        if not self.task_pool:
            return
        async with self.check("episodes"):
            for i in range(self.episodes):
                await self._episode(apis[i % len(apis)], i)
            self._pass("episodes", f"{self.episodes} random-agent episodes, each opening with a plain-text "
                                   "reply and a malformed tool call")
        async with self.check("concurrency"):
            await self._concurrent(apis[0])
        self._pass("environment_errors", f"none in {self.steps} steps")
        await self._leak_check(transport, listed_before)
        await self._cleanup(apis[0])

    async def _check_api(self, api: Api) -> None:
        p = api.prefix
        profile_check = "v1.environments" if p == "v1" else "ae.profile"
        async with self.check(profile_check):
            ids = {split: await api.task_ids(split) for split in SPLITS}
            pool = sorted({t for split_ids in ids.values() for t in split_ids})
            if not pool:
                raise Violation(profile_check, f"environment {self.env!r} lists no task in any split")
            if self.task_pool and set(pool) != set(self.task_pool):
                raise Violation(profile_check, "the two APIs list different task ids")
            self.task_pool = self.task_pool or pool
            self._pass(profile_check, ", ".join(f"{s}: {len(v)}" for s, v in ids.items()))
        if not self.task_pool:
            return
        task_id = self.task_pool[0]
        instance_id = None
        async with self.check(f"{p}.create_shape"):
            instance_id, _ = await self._create(api, task_id)
        if instance_id is None:
            return
        async with self.check(f"{p}.step_shape"):
            await self._step(api, instance_id, RandomAgent(await api.tools(task_id), self.seed).action())
        if isinstance(api, V1Api):
            async with self.check("v1.state"):
                await api.state(instance_id, "v1.state")
                self._pass("v1.state", "an object or null after every step")
        async with self.check(f"{p}.evaluate_range"):
            await self._evaluate(api, instance_id)
        async with self.check(f"{p}.synthetic_query"):
            await self._synthetic_query(api, task_id)
        async with self.check(f"{p}.release"):
            await self._release(api, instance_id)
            gone = api.is_not_found(await api.step_raw(instance_id, {"role": "assistant", "content": "hello"}))
            if gone:
                raise Violation(f"{p}.release", f"a step on a released instance must answer not-found: {gone}")
            again = await api.release(instance_id)
            if again.status >= 500 or _claims_released(again):
                raise Violation(f"{p}.release", f"releasing twice must be harmless and say it was not live, "
                                f"got HTTP {again.status}: {str(again.body)[:200]}")
        if isinstance(api, V1Api):
            async with self.check("v1.fork"):
                await self._fork(api, task_id)
        async with self.check(f"{p}.unknown_instance"):
            bogus = f"conformance_missing_{uuid.uuid4().hex[:8]}"
            for what, answer in (("step", await api.step_raw(bogus, {"role": "assistant", "content": "hi"})),
                                 ("evaluate", await api.evaluate_raw(bogus))):
                problem = api.is_not_found(answer)
                if problem:
                    raise Violation(f"{p}.unknown_instance", f"{what} on an unknown instance: {problem}")
        for name, call in ((f"{p}.unknown_env", api.create_raw(f"no_such_env_{uuid.uuid4().hex[:6]}", task_id)),
                           (f"{p}.unknown_task", api.create_raw(self.env, f"no_such_task_{uuid.uuid4().hex[:6]}")),
                           (f"{p}.malformed", api.malformed_create())):
            async with self.check(name):
                answer = await call
                if 200 <= answer.status < 300:
                    self._track_accidental(answer)
                problem = api.is_error_shape(answer)
                if problem:
                    raise Violation(name, problem)

    # ------------------------------------------------------------------ helpers

    async def _create(self, api: Api, task_id: str,
                      params: dict[str, Any] | None = None) -> tuple[str, list[dict[str, Any]]]:
        instance_id, messages = await api.create(task_id, params)
        self.created.append(instance_id)
        return instance_id, messages

    async def _step(self, api: Api, instance_id: str, action: dict[str, Any]) -> Step:
        """One step, checked like its shape: an environment error fails, naming the action and the message;
        on /v1 the state must still read."""
        step = await api.step(instance_id, action)
        self.steps += 1
        problem = step.environment_error()
        if problem is not None:
            raise Violation("environment_errors", f"the action {str(action.get('content'))[:80]!r} ended the "
                            f"episode in an environment error: {problem[:300]}")
        if isinstance(api, V1Api):
            await api.state(instance_id, "v1.state")
        return step

    async def _synthetic_query(self, api: Api, task_id: str) -> None:
        query = f"Conformance question {uuid.uuid4().hex[:8]}: describe what you can do here."
        instance_id, messages = await self._create(api, task_id, {"query": query})
        try:
            user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
            if query not in user:
                raise Violation(f"{api.prefix}.synthetic_query", f"a create with params.query must show that query "
                                f"in its user message (a synthetic task's question), got {user[:200]!r}")
        finally:
            await self._release(api, instance_id)

    async def _fork(self, api: V1Api, task_id: str) -> None:
        if not (await api.capabilities()).get("fork"):
            self._pass("v1.fork", "not declared")
            return
        agent = RandomAgent(await api.tools(task_id), self.seed)
        original, _ = await self._create(api, task_id)
        twin = None
        try:
            await self._step(api, original, agent.action())
            before = await api.state(original, "v1.fork")
            twin = await api.fork(original)
            self.created.append(twin)
            if await api.state(twin, "v1.fork") != before:
                raise Violation("v1.fork", "the fork's state differs from the original's at the fork")
            await self._step(api, twin, agent.action())
            if await api.state(original, "v1.fork") != before:
                raise Violation("v1.fork", "stepping the fork changed the original's state")
            self._pass("v1.fork", "a fork is an independent copy")
        finally:
            for instance_id in (original, twin):
                if instance_id is not None:
                    await self._release(api, instance_id)

    async def _evaluate(self, api: Api, instance_id: str) -> float:
        score = await api.evaluate(instance_id)
        if not 0.0 <= score <= 1.0:
            raise Violation(f"{api.prefix}.evaluate_range", f"evaluate gave {score}, outside [0, 1]")
        return score

    async def _release(self, api: Api, instance_id: str) -> None:
        answer = await api.release(instance_id)
        if answer.status != 200 or not _claims_released(answer):
            raise Violation(f"{api.prefix}.release", f"release of a live instance answered HTTP {answer.status}: "
                            f"{str(answer.body)[:200]}")
        self.released.add(instance_id)

    def _track_accidental(self, answer: Answer) -> None:
        """A create that should have failed but made an instance: remember it for the cleanup."""
        body = answer.body if isinstance(answer.body, dict) else {}
        data = body.get("data") if isinstance(body.get("data"), dict) else {}
        instance_id = body.get("instance_id") or (data.get("info") or {}).get("instance_id")
        if isinstance(instance_id, str):
            self.created.append(instance_id)

    async def _episode(self, api: Api, index: int) -> None:
        task_id = self.rng.choice(self.task_pool)
        agent = RandomAgent(await api.tools(task_id), self.seed * 1000 + index)
        instance_id, _ = await self._create(api, task_id)
        opening = agent.opening(index)
        try:
            for turn in range(self.max_steps):
                action = opening[turn] if turn < len(opening) else agent.action()
                if (await self._step(api, instance_id, action)).done:
                    break
            await self._evaluate(api, instance_id)
        finally:
            await self._release(api, instance_id)

    async def _concurrent(self, api: Api) -> None:
        tasks = [self.rng.choice(self.task_pool) for _ in range(self.concurrency)]
        created = await asyncio.gather(*(self._create(api, t) for t in tasks), return_exceptions=True)
        ids = [c[0] for c in created if isinstance(c, tuple)]
        try:
            errors = [c for c in created if isinstance(c, BaseException)]
            if errors:
                raise errors[0]
            if len(set(ids)) != len(ids):
                raise Violation("concurrency", f"{len(ids)} concurrent creates gave only {len(set(ids))} distinct ids")
            agents = [RandomAgent([], self.seed + i) for i in range(len(ids))]
            for _ in range(2):
                await asyncio.gather(*(self._step(api, i, a.action()) for i, a in zip(ids, agents, strict=True)))
            await asyncio.gather(*(self._evaluate(api, i) for i in ids))
        finally:
            results = await asyncio.gather(*(self._release(api, i) for i in ids), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        self._pass("concurrency", f"{len(ids)} instances at once")

    async def _live(self, transport: Transport) -> tuple[int, set[str]] | None:
        """(live count, listed ids) from GET /v1/instances, or None when the server has no listing."""
        try:
            answer = await transport.call("GET", "/v1/instances", "list instances")
        except Violation:
            return None
        if answer.status != 200 or not isinstance(answer.body, dict):
            return None
        listed = {i.get("instance_id") for i in answer.body.get("instances") or [] if isinstance(i, dict)}
        stats = answer.body.get("stats") or {}
        live = stats.get("live") if isinstance(stats.get("live"), int) else len(listed)
        return live, {i for i in listed if isinstance(i, str)}

    async def _leak_check(self, transport: Transport, before: tuple[int, set[str]] | None) -> None:
        async with self.check("leak"):
            after = await self._live(transport)
            if before is None or after is None:
                self._pass("leak", "no instance listing (GET /v1/instances); released instances answer "
                                   "not-found (see the release checks)")
                return
            still = sorted(self.released & after[1])
            if still:
                raise Violation("leak", f"{len(still)} released instance(s) still listed, e.g. {still[0]}")
            if after[0] > before[0]:
                raise Violation("leak", f"live instances went from {before[0]} to {after[0]} although the kit "
                                "released everything it created")
            self._pass("leak", f"{len(self.released)} instances created and released; live {before[0]} -> {after[0]}")

    async def _cleanup(self, api: Api) -> None:
        """Best effort: release what a failed check left behind, so the kit leaves the server as it found it."""
        for instance_id in [i for i in self.created if i not in self.released]:
            with contextlib.suppress(Violation):
                await api.release(instance_id)


def _summarize(slow_calls: list[str]) -> str:
    distinct = list(dict.fromkeys(slow_calls))
    return f"{len(slow_calls)} call(s) over the limit: " + "; ".join(distinct[:3])


def _claims_released(answer: Answer) -> bool:
    """Does a release answer say the instance was live and is now released?"""
    body = answer.body
    if not isinstance(body, dict) or answer.status != 200:
        return False
    if "released" in body:
        return body["released"] is True
    return body.get("success") is True


async def run_conformance(url: str, env: str, **options: Any) -> Report:
    return await ConformanceKit(url, env, **options).run()
