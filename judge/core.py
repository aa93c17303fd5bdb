"""The judge: prompt the LLM per trajectory, parse, retry once, reconcile, fall back, cache, count, audit.

With `labeller: reference_rule` or `reference: true` it first fetches each task's verified reference from the
task manager: the rule labels a trajectory that has one, or the LLM reads it in its prompt (its reasons are
then withheld, since they may quote it). Only labels go back: the reference never reaches the caller."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger
from prometheus_client import CollectorRegistry, Counter

from common.faults import JUDGE_FAULT_ENV, FaultInjector, check_disk
from common.jsonl import cut_torn_tail
from common.llm import LLMClient, LLMError, json_schema_format
from judge.parsing import ParsedOutput, complete_labels, parse_judgments, reconcile
from judge.prompt import build_messages, is_success, retry_messages, truncate
from judge.reference_rule import label_steps
from judge.references import FetchedReference, ReferenceSource
from judge.schemas import (
    BatchUsage,
    JudgeResponse,
    JudgeStats,
    JudgeTrajectory,
    LabelSource,
    TrajectoryJudgment,
    fallback_labels,
)
from judge.settings import JudgeSettings
from judge.structured import analysis_chars, answer_tokens, label_schema, parse_json_judgments


class _Metrics:
    """Prometheus counters on the service's registry (served at /metrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.trajectories = Counter("evolver_judge_trajectories", "Trajectories judged, by how",
                                    ["result"], registry=registry)  # llm | fallback | cache
        self.labels = Counter("evolver_judge_labels", "Step labels returned", ["label", "outcome"],
                              registry=registry)
        self.filled = Counter("evolver_judge_filled_steps", "Step labels filled instead of parsed", registry=registry)
        self.calls = Counter("evolver_judge_llm_calls", "Judge LLM calls, by result", ["result"],
                             registry=registry)  # parsed | partial | unparsable | error
        self.tokens = Counter("evolver_judge_llm_tokens", "Judge LLM tokens", ["kind"], registry=registry)
        self.sources = Counter("evolver_judge_source_labels", "Step labels by who gave them", ["source"],
                               registry=registry)  # rule | llm+reference | llm | outcome


@dataclass
class _Outcome:
    """One judged trajectory plus what only the audit log keeps."""

    judgment: TrajectoryJudgment
    raw_outputs: list[str] = field(default_factory=list)
    llm_calls: int = 0
    unparsable_calls: int = 0
    llm_errors: int = 0
    structured_calls: int = 0
    budget_cut_calls: int = 0


def parse_output(text: str) -> ParsedOutput:
    """The JSON answer (constrained, or asked for in the prompt), else `Step i Judgment:` lines."""
    parsed = parse_json_judgments(text)
    return parsed if parsed.labels else parse_judgments(text)


WITHHELD = "reason withheld: the judge read the task's reference"


class Judge:
    def __init__(self, settings: JudgeSettings, llm: LLMClient | None, registry: CollectorRegistry | None = None,
                 references: ReferenceSource | None = None) -> None:
        if llm is None and settings.labeller != "reference_rule":
            raise ValueError("the judge needs an LLM unless labeller is reference_rule")
        self.settings, self.llm, self.references = settings, llm, references
        self.metrics = _Metrics(registry or CollectorRegistry())
        self._limit = asyncio.Semaphore(settings.max_concurrency)
        self._cache: OrderedDict[str, TrajectoryJudgment] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[_Outcome]] = {}
        self._stats = JudgeStats()
        self._audit_path = Path(settings.audit_log) if settings.audit_log else None
        if self._audit_path:
            self._audit_path.parent.mkdir(parents=True, exist_ok=True)
            cut_torn_tail(self._audit_path)  # a kill mid-append: the next request's lines start on their own
        self._audit_lock = asyncio.Lock()
        self._audited = 0  # audited requests (the fault points count them)
        self.faults = FaultInjector(JUDGE_FAULT_ENV)

    async def aclose(self) -> None:
        if self.llm is not None:
            await self.llm.aclose()
        if self.references is not None:
            await self.references.aclose()

    # ------------------------------------------------------------ batch

    async def judge_batch(self, items: list[JudgeTrajectory], request_id: str = "-") -> JudgeResponse:
        references = await self._fetch_references(items)
        outcomes = await asyncio.gather(*(self._judge_safely(item, references.get(item.task_id or ""))
                                          for item in items))
        usage = BatchUsage()
        for out in outcomes:
            usage.llm_calls += out.llm_calls
            usage.prompt_tokens += out.judgment.prompt_tokens
            usage.completion_tokens += out.judgment.completion_tokens
            usage.cache_hits += int(out.judgment.cached)
        steps = sum(len(item.steps) for item in items)
        parsed = sum(out.judgment.parsed_labels for out in outcomes)
        for item, out in zip(items, outcomes, strict=True):
            self._count(item, out)
        await self._audit(items, outcomes, request_id)
        fallbacks = sum(out.judgment.fallback for out in outcomes)
        logger.info("judged {} trajectories ({} steps): {} fallback, {} cached, {} LLM calls, {}+{} tokens",
                    len(items), steps, fallbacks, usage.cache_hits, usage.llm_calls, usage.prompt_tokens,
                    usage.completion_tokens)
        return JudgeResponse(judgments=[out.judgment for out in outcomes], usage=usage, fallback_count=fallbacks,
                             raw_parse_rate=parsed / steps if steps else 0.0)

    async def _fetch_references(self, items: list[JudgeTrajectory]) -> dict[str, FetchedReference]:
        """The references of the batch's tasks (each task asked once), when the settings use them."""
        if self.references is None:
            return {}
        task_ids = sorted({item.task_id for item in items if item.task_id})
        found = await asyncio.gather(*(self.references.get(task_id) for task_id in task_ids))
        return {task_id: ref for task_id, ref in zip(task_ids, found, strict=True) if ref is not None}

    def _source(self, reference: FetchedReference | None) -> LabelSource:
        if reference is not None and self.settings.labeller == "reference_rule":
            return "rule"
        if self.llm is None:
            return "outcome"
        return "llm+reference" if reference is not None and self.settings.reference else "llm"

    async def _judge_safely(self, item: JudgeTrajectory, reference: FetchedReference | None) -> _Outcome:
        """Never lets one trajectory fail the batch: anything unexpected becomes a flagged fallback."""
        source = self._source(reference)
        success = is_success(item.outcome, self.settings.success_threshold)
        try:
            if source == "rule":
                assert reference is not None
                labels = label_steps(item.steps, reference.rule)
                return _Outcome(TrajectoryJudgment(trajectory_id=item.trajectory_id, labels=labels, source="rule",
                                                   parsed_labels=len(labels)))
            if source == "outcome":
                return _Outcome(self._fallback(item, success, "no reference for this task and no judge.llm "
                                               "configured", attempts=0, tokens=(0, 0), source=source))
            return await self._judge_deduplicated(item, reference.prompt if source == "llm+reference" else None)
        except Exception as exc:  # a bug or an odd input must not sink the other trajectories
            logger.opt(exception=exc).error("judging trajectory {} failed; falling back", item.trajectory_id)
            why = f"internal error: {type(exc).__name__}: {exc}"
            return _Outcome(self._fallback(item, success, why, attempts=0, tokens=(0, 0), source=source))

    # ------------------------------------------------------------ one trajectory

    @property
    def _llm(self) -> LLMClient:
        assert self.llm is not None  # only the LLM path calls this, and `_source` keeps others off it
        return self.llm

    async def _structured(self) -> bool:
        return await self._llm.supports_structured()

    def _messages(self, item: JudgeTrajectory, structured: bool, reference: str | None = None) -> list[dict]:
        s = self.settings
        chars = self._budget(len(item.steps))[0] if structured else None
        return build_messages(item, max_step_chars=s.max_step_chars, max_query_chars=s.max_query_chars,
                              success_threshold=s.success_threshold, structured_analysis_chars=chars,
                              reference=reference)

    def _budget(self, steps: int) -> tuple[int, int]:
        """(analysis characters per step, max_tokens) for a trajectory of `steps` steps: the analysis as long
        as the cap allows, and the budget the worst-case answer of that schema, so no answer is cut below
        the cap (a text answer gets the same budget)."""
        s = self.settings
        cap = min(s.max_output_tokens, self._llm.config.max_tokens or s.max_output_tokens)
        chars = analysis_chars(steps, cap, s.max_analysis_chars)
        return chars, min(answer_tokens(steps, chars), cap)

    def _call_params(self, steps: int, structured: bool) -> dict:
        s, role = self.settings, self._llm.config
        chars, max_tokens = self._budget(steps)
        temperature = role.temperature if role.temperature is not None else s.temperature
        params: dict = {"max_tokens": max_tokens, "temperature": temperature}
        if structured:
            params["response_format"] = json_schema_format("step_judgments", label_schema(steps, chars))
        return params

    def _cache_key(self, messages: list[dict], params: dict) -> str:
        payload = json.dumps([self._llm.config.model, messages, params, self.settings.retries], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()

    async def _judge_deduplicated(self, item: JudgeTrajectory, reference: str | None = None) -> _Outcome:
        """Serve from the cache, join an identical judgment in flight, or judge and cache it."""
        structured = await self._structured()
        params = self._call_params(len(item.steps), structured)
        messages = self._messages(item, structured, reference)
        key = self._cache_key(messages, params)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return _Outcome(self._as_cached(cached, item.trajectory_id))
        pending = self._inflight.get(key)
        if pending is not None:  # an identical trajectory (common within a GRPO group) is being judged
            first = await asyncio.shield(pending)
            return _Outcome(self._as_cached(first.judgment, item.trajectory_id))
        future: asyncio.Future[_Outcome] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            out = await self._judge_with_llm(item, messages, params)
            if reference is not None:
                out.judgment = out.judgment.model_copy(update={"source": "llm+reference"})
                out.judgment = self._withhold_reasons(out.judgment)
            if out.llm_calls > out.llm_errors and self.settings.cache_size:  # the LLM answered: deterministic
                self._cache[key] = out.judgment
                while len(self._cache) > self.settings.cache_size:
                    self._cache.popitem(last=False)
            future.set_result(out)
            return out
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it, nobody else needs to
            raise
        finally:
            self._inflight.pop(key, None)

    @staticmethod
    def _withhold_reasons(judgment: TrajectoryJudgment) -> TrajectoryJudgment:
        """An LLM that read the reference may quote it in its reasons: those stay in the audit log only."""
        labels = [label.model_copy(update={"reason": WITHHELD}) for label in judgment.labels]
        return judgment.model_copy(update={"labels": labels})

    @staticmethod
    def _as_cached(judgment: TrajectoryJudgment, trajectory_id: str) -> TrajectoryJudgment:
        return judgment.model_copy(update={"trajectory_id": trajectory_id, "cached": True, "attempts": 0,
                                           "prompt_tokens": 0, "completion_tokens": 0})

    async def _judge_with_llm(self, item: JudgeTrajectory, messages: list[dict], params: dict) -> _Outcome:
        steps = len(item.steps)
        success = is_success(item.outcome, self.settings.success_threshold)
        best = None
        outputs: list[str] = []
        errors: list[str] = []
        prompt_tokens = completion_tokens = unparsable = structured_calls = budget_cut = 0
        conversation = messages
        async with self._limit:
            for _ in range(1 + self.settings.retries):
                try:
                    result = await self._llm.chat(conversation, **params)
                except LLMError as exc:
                    errors.append(str(exc))
                    self.metrics.calls.labels("error").inc()
                    logger.warning("judge LLM call for {} failed: {}", item.trajectory_id, exc)
                    continue
                if not result.cached:
                    prompt_tokens += result.prompt_tokens
                    completion_tokens += result.completion_tokens
                text = result.text
                outputs.append(text)
                structured_calls += int(result.structured)
                cut = bool(result.finish_reasons) and result.finish_reasons[0] == "length"
                budget_cut += int(cut)
                found = reconcile(parse_output(text), steps)
                kind = "parsed" if found.parsed == steps else ("partial" if found.parsed else "unparsable")
                self.metrics.calls.labels(kind).inc()
                unparsable += int(found.parsed == 0)
                if best is None or found.parsed > best.parsed:
                    best = found
                if found.parsed == steps or result.structured:
                    break  # a constrained answer comes back the same (temperature 0) or cut the same way
                conversation = retry_messages(messages, text, found.parsed, steps)
        self.metrics.tokens.labels("prompt").inc(prompt_tokens)
        self.metrics.tokens.labels("completion").inc(completion_tokens)
        calls = len(outputs) + len(errors)
        if best is not None and best.parsed > 0:
            labels, filled, notes = complete_labels(best, steps, success)
            judgment = TrajectoryJudgment(
                trajectory_id=item.trajectory_id, labels=labels, parsed_labels=best.parsed, filled_steps=filled,
                reconciliation=notes, attempts=calls, prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens, structured=structured_calls > 0, budget_cut=budget_cut > 0)
        else:
            why = (f"LLM output unparsable after {len(outputs)} attempt(s)" if outputs
                   else f"LLM unavailable: {errors[-1] if errors else 'no attempt made'}")
            judgment = self._fallback(item, success, why, attempts=calls, tokens=(prompt_tokens, completion_tokens))
        return _Outcome(judgment, outputs, llm_calls=calls, unparsable_calls=unparsable, llm_errors=len(errors),
                        structured_calls=structured_calls, budget_cut_calls=budget_cut)

    def _fallback(self, item: JudgeTrajectory, success: bool, why: str, *, attempts: int,
                  tokens: tuple[int, int], source: LabelSource = "llm") -> TrajectoryJudgment:
        steps = len(item.steps)
        fill = "GOOD" if success else "BAD"
        return TrajectoryJudgment(
            trajectory_id=item.trajectory_id, source=source, labels=fallback_labels(steps, success, why), fallback=True,
            parsed_labels=0, filled_steps=list(range(steps)), attempts=attempts, error=why,
            reconciliation=[f"fallback: all {steps} steps labelled {fill}, the outcome's sign "
                            f"({'success' if success else 'failure'})"],
            prompt_tokens=tokens[0], completion_tokens=tokens[1])

    # ------------------------------------------------------------ accounting

    def _count(self, item: JudgeTrajectory, out: _Outcome) -> None:
        j, stats = out.judgment, self._stats
        success = is_success(item.outcome, self.settings.success_threshold)
        outcome = "success" if success else "failure"
        self.metrics.trajectories.labels("cache" if j.cached else ("fallback" if j.fallback else "llm")).inc()
        self.metrics.filled.inc(len(j.filled_steps))
        stats.trajectories += 1
        stats.steps += len(j.labels)
        stats.parsed_labels += j.parsed_labels
        stats.filled_steps += len(j.filled_steps)
        stats.cache_hits += int(j.cached)
        stats.llm_calls += out.llm_calls
        stats.unparsable_calls += out.unparsable_calls
        stats.llm_errors += out.llm_errors
        stats.structured_calls += out.structured_calls
        stats.budget_cut_calls += out.budget_cut_calls
        stats.trajectories_with_filled += int(bool(j.filled_steps) and not j.fallback)
        stats.prompt_tokens += j.prompt_tokens
        stats.completion_tokens += j.completion_tokens
        stats.labels_by_source[j.source] = stats.labels_by_source.get(j.source, 0) + len(j.labels)
        self.metrics.sources.labels(j.source).inc(len(j.labels))
        for label in j.labels:
            self.metrics.labels.labels(label.label, outcome).inc()
        if j.fallback:
            stats.fallbacks += 1
            return
        rates = stats.successful if success else stats.failed
        rates.trajectories += 1
        rates.steps += len(j.labels)
        rates.good += sum(label.label == "GOOD" for label in j.labels)
        rates.bad += sum(label.label == "BAD" for label in j.labels)

    def stats(self) -> JudgeStats:
        s = self._stats.model_copy(deep=True)
        s.reference_lookup_failures = self.references.failures if self.references is not None else 0
        s.fallback_rate = s.fallbacks / s.trajectories if s.trajectories else 0.0
        s.raw_parse_rate = s.parsed_labels / s.steps if s.steps else 0.0
        s.filled_rate = s.filled_steps / s.steps if s.steps else 0.0
        for rates in (s.successful, s.failed):
            rates.good_rate = rates.good / rates.steps if rates.steps else 0.0
        return s

    async def _audit(self, items: list[JudgeTrajectory], outcomes: list[_Outcome], request_id: str) -> None:
        if self._audit_path is None:
            return
        limit = self.settings.audit_output_chars
        now = time.time()
        lines = []
        for item, out in zip(items, outcomes, strict=True):
            record = {
                "time": now, "request_id": request_id, "model": self.llm.config.model if self.llm else None,
                "trajectory_id": item.trajectory_id, "task_id": item.task_id, "outcome": item.outcome,
                "success": is_success(item.outcome, self.settings.success_threshold), "steps": len(item.steps),
                "query": truncate(item.query, 500),
                **out.judgment.model_dump(mode="json", exclude={"trajectory_id"}),
                "raw_outputs": [truncate(text, limit) for text in out.raw_outputs],
            }
            lines.append(json.dumps(record, ensure_ascii=False))
        async with self._audit_lock:
            check_disk(self._audit_path)
            self._audited += 1
            with self._audit_path.open("ab") as handle:
                self.faults.write_record(handle, ("\n".join(lines) + "\n").encode(), "audit", self._audited)
