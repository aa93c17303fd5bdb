"""The ingest pipeline: trajectories -> candidate experiences (LLM or heuristic) -> dedup and merge
against the batch and the stored pool -> one durable write.

The slow parts (LLM calls, embedding) run before the write lock; only the plan is built under it.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from loguru import logger

from common.llm import LLMClient
from common.schemas import Experience, Provenance
from common.service import ServiceError
from experience_manager.demonstration import demonstration_of
from experience_manager.durable import DurableStore, Plan
from experience_manager.index import text_key
from experience_manager.scoring import cap_overflow
from experience_manager.settings import ExperienceManagerSettings
from experience_manager.summarize import Candidate, LLMSummarizer, heuristic_case
from experience_manager.text import content_hash
from experience_manager.trajectories import TrajectoryView

PROVENANCE_LIMIT = 10


@dataclass
class _Staged:
    experience: Experience
    vector: np.ndarray
    vector_changed: bool
    candidate_index: int = -1


def _union(a: list[str], b: list[str]) -> list[str]:
    return list(dict.fromkeys([*a, *b]))[-PROVENANCE_LIMIT:]


def new_experience(workspace_id: str, candidate: Candidate, embedding_model: str) -> Experience:
    """A new experience from a candidate; its id is a hash of its text (and task kind)."""
    digest = content_hash(candidate.when_to_use, candidate.content)
    # The same advice distilled from tasks of two kinds is two experiences (two demonstrations): two ids.
    key = digest if candidate.task_kind is None else hashlib.sha256(f"{digest}\n{candidate.task_kind}".encode()
                                                                    ).hexdigest()
    return Experience(
        experience_id=f"exp_{key[:16]}", workspace_id=workspace_id, when_to_use=candidate.when_to_use,
        content=candidate.content, kind=candidate.kind, tags=candidate.tags, tools=candidate.tools,
        quality=candidate.quality, support=candidate.support,
        provenance=Provenance(task_ids=candidate.task_ids[-PROVENANCE_LIMIT:],
                              trajectory_ids=candidate.trajectory_ids[-PROVENANCE_LIMIT:], author=candidate.author),
        content_hash=digest, embedding_model=embedding_model, demonstration=candidate.demonstration,
        task_kind=candidate.task_kind)


def absorb(target: Experience, source: Experience, *, take_text: bool) -> Experience:
    """`target` keeps its id and stats, gains support and provenance, and the better text if asked."""
    update: dict[str, Any] = {
        "support": target.support + source.support,
        "provenance": Provenance(task_ids=_union(target.provenance.task_ids, source.provenance.task_ids),
                                 trajectory_ids=_union(target.provenance.trajectory_ids,
                                                       source.provenance.trajectory_ids),
                                 author=target.provenance.author),
        "updated_at": time.time(),
    }
    # A demonstration is a solved episode of the same advice: keep the one there is, the newer when both.
    if source.demonstration is not None and (take_text or target.demonstration is None):
        update["demonstration"] = source.demonstration
    if take_text:
        update.update(when_to_use=source.when_to_use, content=source.content, kind=source.kind,
                      tags=list(dict.fromkeys([*source.tags, *target.tags]))[:10],
                      tools=list(dict.fromkeys([*source.tools, *target.tools]))[:20], quality=source.quality,
                      content_hash=source.content_hash)
        update["provenance"] = update["provenance"].model_copy(update={"author": source.provenance.author})
    return target.model_copy(update=update)


class IngestPipeline:
    def __init__(self, settings: ExperienceManagerSettings, store: DurableStore,
                 embed: Callable[[list[str]], Awaitable[np.ndarray]]) -> None:
        self.settings, self.store, self.embed = settings, store, embed
        self.jobs: dict[str, dict[str, Any]] = {}
        self._job_tasks: set[asyncio.Task] = set()
        self.summarizer = None
        if settings.summarizer is not None:
            self.summarizer = LLMSummarizer(LLMClient("summarizer", settings.summarizer),
                                            settings.summary.max_items_per_prompt, settings.summary.llm_max_tokens)

    async def close(self) -> None:
        if self.summarizer is not None:
            await self.summarizer.client.aclose()

    async def summarize(self, workspace_id: str, views: list[TrajectoryView], *, mode: str,
                        request_id: str | None, digest: str,
                        progress: Callable[[int, int], None] | None = None) -> dict:
        self.store.writable(workspace_id)
        prior = self.store.prior((workspace_id, "summarize", request_id) if request_id else None, digest)
        if prior is not None:
            return prior
        if mode == "llm" and self.summarizer is None:
            raise ServiceError(422, "no_summarizer", "mode 'llm' needs a summarizer LLM: set "
                                                     "experience_manager.summarizer in the config, or use mode 'auto'")
        groups: dict[str, list[TrajectoryView]] = {}
        for view in views:
            groups.setdefault(view.task_id, []).append(view)
        use_llm = mode in ("auto", "llm") and self.summarizer is not None
        candidates: list[Candidate] = []
        errors: list[str] = []
        modes: set[str] = set()
        for done, (task_id, group) in enumerate(groups.items(), start=1):
            if not group[0].query:
                errors.append(f"task {task_id}: no task text (no user message and no query); skipped")
                continue
            produced: list[Candidate] = []
            if use_llm:
                assert self.summarizer is not None
                produced, problems = await self.summarizer.summarize_group(group)
                errors.extend(problems)
            if produced:
                modes.add("llm")
            else:
                if use_llm:
                    errors.append(f"task {task_id}: LLM summarization gave nothing usable; used a heuristic case")
                produced = [heuristic_case(group)]
                modes.add("heuristic")
            demo = self._demonstration(group)
            for candidate in produced:
                candidate.demonstration, candidate.task_kind = demo, group[0].task_kind
            candidates.extend(produced)
            if progress:
                progress(done, len(groups))
        mode_used = "none" if not modes else modes.pop() if len(modes) == 1 else "mixed"
        vectors = await self.embed([c.when_to_use for c in candidates]) if candidates else np.zeros((0, 1))
        decisions = await self._merge_decisions(workspace_id, candidates, vectors) if self.summarizer else {}
        return await self.store.mutate(workspace_id, "summarize", request_id, digest,
                                       lambda: self._plan_ingest(workspace_id, candidates, vectors, decisions,
                                                                 errors, mode_used))

    def _demonstration(self, group: list[TrajectoryView]) -> list[dict[str, Any]] | None:
        """The group's shortest successful trajectory that fits the caps, as a demonstration."""
        cfg = self.settings.summary
        for view in sorted((v for v in group if v.success), key=lambda v: (-v.reward, len(v.raw_messages))):
            demo = demonstration_of(view, max_messages=cfg.demonstration_max_messages,
                                    max_chars=cfg.demonstration_max_chars)
            if demo is not None:
                return demo
        return None

    async def _merge_decisions(self, workspace_id: str, candidates: list[Candidate], vectors: np.ndarray
                               ) -> dict[tuple[int, str], tuple[str, str, np.ndarray]]:
        """LLM "same advice?" answers for pairs in the merge band, asked before taking the write lock."""
        assert self.summarizer is not None
        low, high = self.settings.dedup.merge_threshold, self.settings.dedup.same_threshold
        index = self.store.indexes.get(workspace_id)
        pairs: list[tuple[int, str, tuple[str, str]]] = []
        for i in range(len(candidates)):
            kind = candidates[i].task_kind
            for j in range(i):
                cos = float(vectors[i] @ vectors[j])
                if low <= cos < high and candidates[j].task_kind == kind:
                    pairs.append((i, f"#{j}", (candidates[j].when_to_use, candidates[j].content)))
            if index is not None:
                for experience_id, cos in index.nearest(vectors[i], 3, task_kind=kind):
                    if low <= cos < high:
                        other = index.experiences[experience_id]
                        pairs.append((i, experience_id, (other.when_to_use, other.content)))
        answers = await asyncio.gather(*(self.summarizer.same_advice(
            other, (candidates[i].when_to_use, candidates[i].content)) for i, _, other in pairs))
        merged = [(pair, answer) for pair, answer in zip(pairs, answers, strict=True) if answer is not None]
        merged_vectors = await self.embed([answer[0] for _, answer in merged]) if merged else []
        return {(i, target): (answer[0], answer[1], vec)
                for ((i, target, _), answer), vec in zip(merged, merged_vectors, strict=True)}

    def _plan_ingest(self, workspace_id: str, candidates: list[Candidate], vectors: np.ndarray,
                     decisions: dict[tuple[int, str], tuple[str, str, np.ndarray]], errors: list[str],
                     mode_used: str) -> Plan:
        same = self.settings.dedup.same_threshold
        index = self.store.indexes.get(workspace_id)
        merged: list[dict[str, Any]] = []

        # 1. Dedup within the batch: exact hash, near duplicate, or an LLM-approved merge.
        kept: list[_Staged] = []
        for i, candidate in enumerate(candidates):
            incoming = new_experience(workspace_id, candidate, self.store.embedding_model)
            vector = vectors[i]
            absorbed = False
            for staged in kept:
                if staged.experience.task_kind != incoming.task_kind:
                    continue  # a demonstration of one kind never stands in for another's
                cos = float(vector @ staged.vector)
                merge_text = decisions.get((i, f"#{staged.candidate_index}"))
                if staged.experience.content_hash == incoming.content_hash or cos >= same or merge_text:
                    better = incoming.quality > staged.experience.quality
                    if merge_text:
                        incoming = incoming.model_copy(update={
                            "when_to_use": merge_text[0], "content": merge_text[1],
                            "content_hash": content_hash(merge_text[0], merge_text[1])})
                        better, vector = True, merge_text[2]
                    staged.experience = absorb(staged.experience, incoming, take_text=better)
                    if better:
                        staged.vector = vector
                    merged.append({"candidate": i, "into": f"batch:{staged.candidate_index}", "similarity": cos,
                                   "reason": "llm_merge" if merge_text else "duplicate"})
                    absorbed = True
                    break
            if not absorbed:
                kept.append(_Staged(incoming, vector, True, i))

        # 2. Against the stored pool (active and archived: re-distilling archived advice must not revive it).
        touched: dict[str, _Staged] = {}
        created: list[_Staged] = []
        for staged in kept:
            incoming = staged.experience
            target_id, reason, cos, merge_text = None, "", 1.0, None
            if index is not None:
                target_id = index.by_text.get(text_key(incoming))
                reason = "exact"
                if target_id is None:
                    for experience_id, cos in index.nearest(staged.vector, 3, task_kind=incoming.task_kind):
                        merge_text = decisions.get((staged.candidate_index, experience_id))
                        if cos >= same or merge_text:
                            target_id, reason = experience_id, ("duplicate" if cos >= same else "llm_merge")
                            merge_text = None if cos >= same else merge_text
                            break
            if target_id is None:
                created.append(staged)
                continue
            assert index is not None
            current = touched.get(target_id)
            base = current.experience if current else index.experiences[target_id]
            base_vector = current.vector if current else index.vector_of(target_id)
            take_text = reason != "exact" and (merge_text is not None or incoming.quality > base.quality)
            if merge_text:
                incoming = incoming.model_copy(update={"when_to_use": merge_text[0], "content": merge_text[1],
                                                       "content_hash": content_hash(merge_text[0], merge_text[1])})
            updated = absorb(base, incoming, take_text=take_text)
            new_vector = (merge_text[2] if merge_text else staged.vector) if take_text else base_vector
            touched[target_id] = _Staged(updated, new_vector, take_text or (current is not None and current.vector_changed))
            merged.append({"candidate": staged.candidate_index, "into": target_id, "similarity": round(cos, 4),
                           "reason": reason})

        # 3. Keep the active pool within its cap by archiving the least useful.
        overflow = cap_overflow(self.settings.scoring, index, len(created),
                                {k: s.experience for k, s in touched.items()})
        for experience in overflow:
            prior = touched.get(experience.experience_id)
            touched[experience.experience_id] = _Staged(experience, prior.vector if prior else None,  # type: ignore[arg-type]
                                                        prior.vector_changed if prior else False)

        upserts = [(s.experience, s.vector) for s in created]
        upserts += [(s.experience, s.vector if s.vector_changed else None) for s in touched.values()]
        result = {
            "workspace_id": workspace_id, "mode_used": mode_used,
            "created": [s.experience.experience_id for s in created],
            "updated": list(touched), "merged": merged,
            "archived": [e.experience_id for e in overflow], "errors": errors,
            "experiences": [s.experience.model_dump(mode="json") for s in created]
                           + [s.experience.model_dump(mode="json") for s in touched.values()],
        }
        return Plan(result=result, upserts=upserts)

    def start_summarize_job(self, workspace_id: str, views: list[TrajectoryView], *, mode: str,
                            request_id: str | None, digest: str) -> dict:
        self.store.writable(workspace_id)
        job_id = f"job_{uuid.uuid4().hex[:16]}"
        job: dict[str, Any] = {"job_id": job_id, "workspace_id": workspace_id, "status": "running",
                               "progress": {"done": 0, "total": len({v.task_id for v in views})},
                               "result": None, "error": None, "created_at": time.time()}
        self.jobs[job_id] = job

        def progress(done: int, total: int) -> None:
            job["progress"] = {"done": done, "total": total}

        async def run() -> None:
            try:
                job["result"] = await self.summarize(workspace_id, views, mode=mode, request_id=request_id,
                                                     digest=digest, progress=progress)
                job["status"] = "done"
            except ServiceError as exc:
                job.update(status="failed", error={"code": exc.code, "message": exc.message})
            except Exception as exc:  # a job must end in a state the client can read
                logger.opt(exception=exc).error("summarize job {} failed", job_id)
                job.update(status="failed", error={"code": "internal_error", "message": str(exc)})

        task = asyncio.create_task(run())
        self._job_tasks.add(task)
        task.add_done_callback(self._job_tasks.discard)
        return {"job_id": job_id, "status": "running", "progress": job["progress"]}

    def job(self, job_id: str) -> dict:
        job = self.jobs.get(job_id)
        if job is None:
            raise ServiceError(404, "job_not_found", f"no summarize job {job_id!r} (jobs live until a restart)")
        return job

