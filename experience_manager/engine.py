"""The experience engine: every operation of the service, independent of HTTP.

Concurrency model: one asyncio lock orders all mutations; each mutation plans its absolute end state
in the event loop, makes it durable on the single writer thread (journal intent -> Qdrant -> commit),
then mirrors it into the in-memory index. Retrieval reads only the in-memory index.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from loguru import logger

from common.embeddings import Embedder, shared_embedder
from common.llm import LLMClient
from common.schemas import Experience, ExperienceKind, Provenance
from common.service import ServiceError
from experience_manager.demonstration import demonstration_of
from experience_manager.faults import FaultInjector
from experience_manager.index import Hit, WorkspaceIndex
from experience_manager.journal import Journal, atomic_write
from experience_manager.render import render_experiences
from experience_manager.settings import ExperienceManagerSettings
from experience_manager.store import QdrantStore, encode_vector
from experience_manager.summarize import Candidate, LLMSummarizer, heuristic_case
from experience_manager.text import content_hash, query_text, valid_id
from experience_manager.trajectories import TrajectoryView

PROVENANCE_LIMIT = 10


def body_digest(body: Any) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass
class Plan:
    """What a mutation will write (absolute end states) and what it answers."""

    result: dict[str, Any]
    upserts: list[tuple[Experience, np.ndarray | None]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    drop_workspace: bool = False


@dataclass
class _Staged:
    experience: Experience
    vector: np.ndarray
    vector_changed: bool
    candidate_index: int = -1


def _union(a: list[str], b: list[str]) -> list[str]:
    return list(dict.fromkeys([*a, *b]))[-PROVENANCE_LIMIT:]


class ExperienceEngine:
    def __init__(self, settings: ExperienceManagerSettings, embedder: Embedder | None = None,
                 faults: FaultInjector | None = None) -> None:
        self.settings = settings
        self.embedder = embedder or shared_embedder()
        self.embedding_model = f"{self.embedder.name}@{self.embedder.dimension}"
        self.faults = faults or FaultInjector()
        self.indexes: dict[str, WorkspaceIndex] = {}
        self.done: dict[tuple[str, str, str], tuple[str, dict]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self._job_tasks: set[asyncio.Task] = set()
        self._cache: OrderedDict[tuple, dict] = OrderedDict()
        self.cache_hits = self.cache_misses = 0
        self._lock = asyncio.Lock()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="exp-writer")
        self._embed_pool = ThreadPoolExecutor(1, thread_name_prefix="exp-embed")
        self.summarizer = None
        if settings.summarizer is not None:
            self.summarizer = LLMSummarizer(LLMClient("summarizer", settings.summarizer),
                                            settings.summary.max_items_per_prompt, settings.summary.llm_max_tokens)
        self.ready = False
        self.replayed_ops: list[str] = []
        self.store: QdrantStore | None = None
        self.journal: Journal | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._embed_pool, self.embedder.encode, ["warm up the embedding model"])
        await loop.run_in_executor(self._writer, self._open)
        self.ready = True
        logger.info("experience store ready: {} workspaces, {} experiences, {} ops replayed",
                    len(self.indexes), sum(len(i.experiences) for i in self.indexes.values()), len(self.replayed_ops))

    async def close(self) -> None:
        self.ready = False
        loop = asyncio.get_running_loop()
        if self.store is not None:
            await loop.run_in_executor(self._writer, self._close_store)
        self._writer.shutdown(wait=True)
        self._embed_pool.shutdown(wait=True)
        if self.summarizer is not None:
            await self.summarizer.client.aclose()

    def _close_store(self) -> None:
        if self.journal:
            self.journal.close()
        if self.store:
            self.store.close()

    def _open(self) -> None:
        root = Path(self.settings.store)
        root.mkdir(parents=True, exist_ok=True)
        meta_path = root / "meta.json"
        meta = orjson.loads(meta_path.read_bytes()) if meta_path.exists() else None
        self.store = QdrantStore(
            path=None if self.settings.qdrant_url else root / "qdrant", url=self.settings.qdrant_url,
            api_key=self._qdrant_key(), dimension=self.embedder.dimension, batch_size=self.settings.upsert_batch_size)
        self.journal = Journal(root / "journal.jsonl", fsync=self.settings.journal_fsync)
        self._replay()
        reembed = meta is not None and (meta.get("embedding_model") != self.embedder.name
                                        or meta.get("dimension") != self.embedder.dimension)
        for workspace_id in self.store.workspaces():
            self.indexes[workspace_id] = self._load_workspace(workspace_id, reembed)
        atomic_write(meta_path, orjson.dumps({"embedding_model": self.embedder.name,
                                              "dimension": self.embedder.dimension, "format": 1}))

    def _qdrant_key(self) -> str | None:
        import os

        name = self.settings.qdrant_api_key_env
        return os.environ.get(name) if name else None

    def _replay(self) -> None:
        assert self.journal is not None
        intents: dict[str, dict] = {}
        committed: set[str] = set()
        for record in self.journal.read():
            if record.get("t") == "intent":
                intents[record["op_id"]] = record
            elif record.get("t") == "commit":
                committed.add(record["op_id"])
        for op_id, record in intents.items():
            if op_id not in committed:
                logger.warning("replaying {} {} on workspace {} (interrupted before its commit)",
                               record["op"], op_id, record["ws"])
                self._apply_to_store(record)
                self.journal.append({"t": "commit", "op_id": op_id, "replayed": True, "ts": time.time()})
                self.replayed_ops.append(op_id)
            if record.get("request_id"):
                self.done[(record["ws"], record["op"], record["request_id"])] = (record["body_hash"], record["result"])

    def _load_workspace(self, workspace_id: str, reembed: bool) -> WorkspaceIndex:
        assert self.store is not None
        index = WorkspaceIndex(workspace_id, self.embedder.dimension)
        loaded = list(self.store.load(workspace_id))
        if reembed and loaded:
            # The embedding model changed since these vectors were written: recompute and rewrite them.
            logger.warning("re-embedding {} experiences of {} for {}", len(loaded), workspace_id, self.embedding_model)
            vectors = self.embedder.encode([e.when_to_use for e, _ in loaded])
            self.store.drop(workspace_id)
            self.store.ensure(workspace_id)
            experiences = [e.model_copy(update={"embedding_model": self.embedding_model}) for e, _ in loaded]
            self.store.apply(workspace_id, [{"upsert": e.model_dump(mode="json"), "vector": encode_vector(v)}
                                            for e, v in zip(experiences, vectors, strict=True)])
            loaded = list(zip(experiences, vectors, strict=True))
        for experience, vector in loaded:
            index.put(experience, vector)
        return index

    # ------------------------------------------------------------ durable mutation core

    def _apply_to_store(self, record: dict) -> None:
        assert self.store is not None
        op, workspace_id = record["op"], record["ws"]
        if record.get("drop"):
            self.store.drop(workspace_id)
            return
        self.store.ensure(workspace_id)
        self.store.apply(workspace_id, record["writes"],
                         on_progress=lambda n: self.faults.check(op, "after_upsert", n))

    def _durable(self, record: dict) -> None:
        assert self.journal is not None
        op = record["op"]
        self.journal.append(record)
        self.faults.check(op, "after_intent")
        self._apply_to_store(record)
        self.faults.check(op, "before_commit")
        self.journal.append({"t": "commit", "op_id": record["op_id"], "ts": time.time()})
        self.faults.check(op, "after_commit")

    def _prior(self, key: tuple[str, str, str] | None, digest: str) -> dict | None:
        if key is None or key not in self.done:
            return None
        stored_digest, result = self.done[key]
        if stored_digest != digest:
            raise ServiceError(409, "request_id_conflict",
                               f"request_id {key[2]!r} was already used for a different {key[1]} request on "
                               f"workspace {key[0]!r}; use a new request_id")
        return {**result, "idempotent_replay": True}

    async def _mutate(self, workspace_id: str, op: str, request_id: str | None, digest: str,
                      build: Callable[[], Awaitable[Plan] | Plan]) -> dict:
        key = (workspace_id, op, request_id) if request_id else None
        prior = self._prior(key, digest)
        if prior is not None:
            return prior
        async with self._lock:
            prior = self._prior(key, digest)
            if prior is not None:
                return prior
            plan = build()
            if asyncio.iscoroutine(plan):
                plan = await plan
            assert isinstance(plan, Plan)
            writes = [{"upsert": e.model_dump(mode="json"), "vector": encode_vector(v) if v is not None else None}
                      for e, v in plan.upserts] + [{"delete": d} for d in plan.deletes]
            record = {"t": "intent", "op_id": uuid.uuid4().hex, "op": op, "ws": workspace_id,
                      "request_id": request_id, "body_hash": digest, "ts": time.time(), "writes": writes,
                      "drop": plan.drop_workspace, "result": plan.result}
            await asyncio.get_running_loop().run_in_executor(self._writer, self._durable, record)
            self._mirror(workspace_id, plan)
            if key is not None:
                self.done[key] = (digest, plan.result)
        return plan.result

    def _mirror(self, workspace_id: str, plan: Plan) -> None:
        if plan.drop_workspace:
            self.indexes.pop(workspace_id, None)
            return
        index = self.indexes.get(workspace_id)
        if index is None:
            index = self.indexes[workspace_id] = WorkspaceIndex(workspace_id, self.embedder.dimension)
        for experience, vector in plan.upserts:
            index.put(experience, vector)
        for experience_id in plan.deletes:
            index.delete(experience_id)

    # ------------------------------------------------------------ helpers

    def check_workspace_id(self, workspace_id: str) -> None:
        if not valid_id(workspace_id):
            raise ServiceError(422, "invalid_workspace_id",
                               f"workspace id {workspace_id[:80]!r} must match ^[A-Za-z0-9_-]{{1,64}}$")

    def index(self, workspace_id: str) -> WorkspaceIndex:
        self.check_workspace_id(workspace_id)
        index = self.indexes.get(workspace_id)
        if index is None:
            raise ServiceError(404, "workspace_not_found", f"workspace {workspace_id!r} does not exist",
                               {"workspaces": sorted(self.indexes)[:50]})
        return index

    def _writable(self, workspace_id: str) -> None:
        self.check_workspace_id(workspace_id)
        if workspace_id not in self.indexes and len(self.indexes) >= self.settings.max_workspaces:
            raise ServiceError(409, "too_many_workspaces",
                               f"the service already holds {len(self.indexes)} workspaces (max_workspaces); "
                               f"delete one first")

    def experience(self, workspace_id: str, experience_id: str) -> Experience:
        index = self.index(workspace_id)
        if not valid_id(experience_id):
            raise ServiceError(422, "invalid_experience_id",
                               f"experience id {experience_id[:80]!r} must match ^[A-Za-z0-9_-]{{1,64}}$")
        experience = index.experiences.get(experience_id)
        if experience is None:
            raise ServiceError(404, "experience_not_found",
                               f"experience {experience_id!r} does not exist in workspace {workspace_id!r}")
        return experience

    async def embed(self, texts: list[str]) -> np.ndarray:
        return await asyncio.get_running_loop().run_in_executor(self._embed_pool, self.embedder.encode, texts)

    def archive_reason(self, experience: Experience) -> str | None:
        scoring, usage = self.settings.scoring, experience.usage
        if usage.uses < scoring.min_uses:
            return None
        if usage.advantage_count >= scoring.min_uses:
            mean = usage.mean_advantage or 0.0
            return f"mean advantage {mean:.3f} < {scoring.advantage_margin}" if mean < scoring.advantage_margin else None
        if usage.utility < scoring.utility_floor:
            return f"utility {usage.utility:.3f} < {scoring.utility_floor} without enough baselines"
        return None

    def _cap_overflow(self, index: WorkspaceIndex | None, new_active: int, staged: dict[str, Experience]
                      ) -> list[Experience]:
        """The least useful active experiences to archive so the pool stays within max_active."""
        active = [staged.get(e.experience_id, e) for e in (index.experiences.values() if index else ())]
        active = [e for e in active if e.status == "active"]
        overflow = len(active) + new_active - self.settings.scoring.max_active
        if overflow <= 0:
            return []
        active.sort(key=lambda e: (e.usage.utility, e.updated_at))
        now = time.time()
        return [e.model_copy(update={"status": "archived", "updated_at": now}) for e in active[:overflow]]

    # ------------------------------------------------------------ summarize

    async def summarize(self, workspace_id: str, views: list[TrajectoryView], *, mode: str,
                        request_id: str | None, digest: str,
                        progress: Callable[[int, int], None] | None = None) -> dict:
        self._writable(workspace_id)
        prior = self._prior((workspace_id, "summarize", request_id) if request_id else None, digest)
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
        return await self._mutate(workspace_id, "summarize", request_id, digest,
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
        index = self.indexes.get(workspace_id)
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

    def _new_experience(self, workspace_id: str, candidate: Candidate) -> Experience:
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
            content_hash=digest, embedding_model=self.embedding_model, demonstration=candidate.demonstration,
            task_kind=candidate.task_kind)

    @staticmethod
    def _absorb(target: Experience, source: Experience, *, take_text: bool) -> Experience:
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

    def _plan_ingest(self, workspace_id: str, candidates: list[Candidate], vectors: np.ndarray,
                     decisions: dict[tuple[int, str], tuple[str, str, np.ndarray]], errors: list[str],
                     mode_used: str) -> Plan:
        same = self.settings.dedup.same_threshold
        index = self.indexes.get(workspace_id)
        merged: list[dict[str, Any]] = []

        # 1. Dedup within the batch: exact hash, near duplicate, or an LLM-approved merge.
        kept: list[_Staged] = []
        for i, candidate in enumerate(candidates):
            incoming = self._new_experience(workspace_id, candidate)
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
                    staged.experience = self._absorb(staged.experience, incoming, take_text=better)
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
                target_id = index.by_hash.get(incoming.content_hash)
                if target_id is not None and index.experiences[target_id].task_kind != incoming.task_kind:
                    target_id = None  # the same text of another kind: not the same experience
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
            updated = self._absorb(base, incoming, take_text=take_text)
            new_vector = (merge_text[2] if merge_text else staged.vector) if take_text else base_vector
            touched[target_id] = _Staged(updated, new_vector, take_text or (current is not None and current.vector_changed))
            merged.append({"candidate": staged.candidate_index, "into": target_id, "similarity": round(cos, 4),
                           "reason": reason})

        # 3. Keep the active pool within its cap by archiving the least useful.
        overflow = self._cap_overflow(index, len(created), {k: s.experience for k, s in touched.items()})
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
        self._writable(workspace_id)
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

    # ------------------------------------------------------------ retrieval

    async def retrieve(self, workspace_id: str, query: str, *, top_k: int | None = None,
                       min_similarity: float | None = None, exclude_ids: list[str] | None = None,
                       task_kind: str | None = None) -> dict:
        return (await self.retrieve_batch(workspace_id, [query], top_k=top_k, min_similarity=min_similarity,
                                          exclude_ids=exclude_ids, task_kind=task_kind))[0]

    async def retrieve_batch(self, workspace_id: str, queries: list[str], *, top_k: int | None = None,
                             min_similarity: float | None = None, exclude_ids: list[str] | None = None,
                             task_kind: str | None = None) -> list[dict]:
        """`task_kind`: the queries' task kind, when known; hits of that kind rank first."""
        index = self.index(workspace_id)
        cfg = self.settings.retrieval
        top_k = top_k or cfg.top_k
        min_similarity = cfg.min_similarity if min_similarity is None else min_similarity
        exclude = frozenset(exclude_ids or ())
        texts = [query_text(q) for q in queries]
        for text, raw in zip(texts, queries, strict=True):
            if not text:
                raise ServiceError(422, "empty_query", f"the query has no task text to embed: {raw[:100]!r}")
        results: list[dict | None] = []
        missing: list[int] = []
        for i, text in enumerate(texts):
            key = (workspace_id, text, top_k, min_similarity, exclude, task_kind, index.version)
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.cache_hits += 1
                results.append({**cached, "cached": True})
            else:
                results.append(None)
                missing.append(i)
        if missing:
            self.cache_misses += len(missing)
            vectors = await self.embed([texts[i] for i in missing])
            version = index.version
            for i, vector in zip(missing, vectors, strict=True):
                hits = index.search(vector, texts[i], top_k=top_k, min_relevance=min_similarity,
                                    lexical_weight=cfg.lexical_weight, utility_weight=cfg.utility_weight,
                                    candidate_factor=cfg.candidate_factor, exclude=exclude, task_kind=task_kind)
                response = self._retrieval_response(workspace_id, texts[i], hits, version)
                results[i] = {**response, "cached": False}
                if cfg.cache_size and index.version == version:
                    self._cache[(workspace_id, texts[i], top_k, min_similarity, exclude, task_kind, version)] = response
                    while len(self._cache) > cfg.cache_size:
                        self._cache.popitem(last=False)
        return results  # type: ignore[return-value]

    @staticmethod
    def _retrieval_response(workspace_id: str, text: str, hits: list[Hit], version: int) -> dict:
        experiences = [{
            "experience_id": h.experience.experience_id, "when_to_use": h.experience.when_to_use,
            "content": h.experience.content, "kind": h.experience.kind.value, "tags": h.experience.tags,
            "tools": h.experience.tools, "similarity": round(h.similarity, 5), "relevance": round(h.relevance, 5),
            "score": round(h.score, 5), "utility": round(h.experience.usage.utility, 5),
            "quality": h.experience.quality, "author": h.experience.provenance.author,
            "task_kind": h.experience.task_kind,
            "created_at": h.experience.created_at, "updated_at": h.experience.updated_at,
            **({"demonstration": [m.model_dump(mode="json", exclude_none=True) for m in h.experience.demonstration]}
               if h.experience.demonstration else {}),
        } for h in hits]
        return {"workspace_id": workspace_id, "query": text, "experiences": experiences,
                "experience_ids": [e["experience_id"] for e in experiences],
                "rendered": render_experiences([(h.experience.when_to_use, h.experience.content) for h in hits]),
                "pool_version": version}

    # ------------------------------------------------------------ feedback, pruning

    async def feedback(self, workspace_id: str, items: list[dict[str, Any]], *, request_id: str | None,
                       digest: str) -> dict:
        index = self.index(workspace_id)

        def build() -> Plan:
            staged: dict[str, Experience] = {}
            unknown: list[str] = []
            threshold = self.settings.summary.success_threshold
            now = time.time()
            for item in items:
                reward = float(item["reward"])
                success = item.get("success")
                success = reward >= threshold if success is None else bool(success)
                baseline = item.get("baseline")
                for experience_id in dict.fromkeys(item["experience_ids"]):
                    experience = staged.get(experience_id) or index.experiences.get(experience_id)
                    if experience is None:
                        unknown.append(experience_id)
                        continue
                    usage = experience.usage.model_copy(update={
                        "uses": experience.usage.uses + 1,
                        "successes": experience.usage.successes + int(success),
                        "reward_sum": experience.usage.reward_sum + reward,
                    })
                    if baseline is not None:
                        usage.advantage_sum += reward - float(baseline)
                        usage.advantage_count += 1
                    staged[experience_id] = experience.model_copy(update={"usage": usage, "updated_at": now})
            archived = []
            if self.settings.scoring.auto_prune:
                for experience_id, experience in staged.items():
                    reason = self.archive_reason(experience) if experience.status == "active" else None
                    if reason:
                        staged[experience_id] = experience.model_copy(update={"status": "archived"})
                        archived.append({"experience_id": experience_id, "reason": reason})
            result = {"workspace_id": workspace_id, "updated": len(staged), "archived": archived,
                      "unknown_ids": list(dict.fromkeys(unknown)),
                      "usage": {k: {"uses": e.usage.uses, "successes": e.usage.successes,
                                    "utility": round(e.usage.utility, 5), "mean_advantage": e.usage.mean_advantage,
                                    "status": e.status} for k, e in staged.items()}}
            return Plan(result=result, upserts=[(e, None) for e in staged.values()])

        return await self._mutate(workspace_id, "feedback", request_id, digest, build)

    async def prune(self, workspace_id: str, *, dry_run: bool, request_id: str | None, digest: str) -> dict:
        index = self.index(workspace_id)

        def build() -> Plan:
            now = time.time()
            archived: dict[str, Experience] = {}
            reasons = []
            for experience in index.experiences.values():
                reason = self.archive_reason(experience) if experience.status == "active" else None
                if reason:
                    archived[experience.experience_id] = experience.model_copy(
                        update={"status": "archived", "updated_at": now})
                    reasons.append({"experience_id": experience.experience_id, "reason": reason})
            for experience in self._cap_overflow(index, 0, archived):
                archived[experience.experience_id] = experience
                reasons.append({"experience_id": experience.experience_id, "reason": "active pool over max_active"})
            result = {"workspace_id": workspace_id, "dry_run": dry_run, "archived": reasons,
                      "active_after": index.n_active - len(archived)}
            return Plan(result=result, upserts=[(e, None) for e in archived.values()])

        if dry_run:
            return build().result
        return await self._mutate(workspace_id, "prune", request_id, digest, build)

    # ------------------------------------------------------------ CRUD, import/export, workspaces

    async def create(self, workspace_id: str, fields: dict[str, Any], *, request_id: str | None, digest: str) -> dict:
        self._writable(workspace_id)
        candidate = Candidate(when_to_use=fields["when_to_use"], content=fields["content"],
                              kind=ExperienceKind(fields.get("kind") or "manual"), quality=fields.get("quality", 0.5),
                              author=fields.get("author") or "manual", tags=fields.get("tags", []),
                              tools=fields.get("tools", []), task_ids=fields.get("task_ids", []))
        vector = (await self.embed([candidate.when_to_use]))[0]

        def build() -> Plan:
            incoming = self._new_experience(workspace_id, candidate)
            index = self.indexes.get(workspace_id)
            existing_id = index.by_hash.get(incoming.content_hash) if index else None
            if existing_id is not None:
                assert index is not None
                updated = self._absorb(index.experiences[existing_id], incoming, take_text=False)
                return Plan(result={"experience": updated.model_dump(mode="json"), "deduplicated": True},
                            upserts=[(updated, None)])
            return Plan(result={"experience": incoming.model_dump(mode="json"), "deduplicated": False},
                        upserts=[(incoming, vector)])

        return await self._mutate(workspace_id, "create", request_id, digest, build)

    async def patch(self, workspace_id: str, experience_id: str, fields: dict[str, Any], *,
                    request_id: str | None, digest: str) -> dict:
        current = self.experience(workspace_id, experience_id)
        text_changed = "when_to_use" in fields and fields["when_to_use"] != current.when_to_use
        vector = (await self.embed([fields["when_to_use"]]))[0] if text_changed else None

        def build() -> Plan:
            base = self.experience(workspace_id, experience_id)
            data = {**base.model_dump(), **fields, "updated_at": time.time()}
            data["content_hash"] = content_hash(data["when_to_use"], data["content"])
            updated = Experience.model_validate(data)
            return Plan(result={"experience": updated.model_dump(mode="json")}, upserts=[(updated, vector)])

        return await self._mutate(workspace_id, "patch", request_id, f"{experience_id}:{digest}", build)

    async def delete(self, workspace_id: str, experience_id: str, *, request_id: str | None) -> dict:
        self.experience(workspace_id, experience_id)

        def build() -> Plan:
            self.experience(workspace_id, experience_id)
            return Plan(result={"deleted": experience_id}, deletes=[experience_id])

        return await self._mutate(workspace_id, "delete", request_id, experience_id, build)

    async def import_experiences(self, workspace_id: str, items: list[dict[str, Any]], *, keep_usage: bool,
                                 request_id: str | None, digest: str) -> dict:
        self._writable(workspace_id)
        vectors = await self.embed([item["when_to_use"] for item in items]) if items else []

        def build() -> Plan:
            index = self.indexes.get(workspace_id)
            upserts: list[tuple[Experience, np.ndarray | None]] = []
            seen: set[str] = set()
            imported, skipped = [], []
            for item, vector in zip(items, vectors, strict=True):
                digest_ = content_hash(item["when_to_use"], item["content"])
                data = {k: v for k, v in item.items() if v is not None}
                if not keep_usage:
                    data.pop("usage", None)
                    data.pop("status", None)
                data.update(workspace_id=workspace_id, content_hash=digest_, embedding_model=self.embedding_model)
                data.setdefault("experience_id", f"exp_{digest_[:16]}")
                existing = index.by_hash.get(digest_) if index else None
                if digest_ in seen or (existing is not None and existing != data["experience_id"]):
                    skipped.append(data["experience_id"])
                    continue
                seen.add(digest_)
                experience = Experience.model_validate(data)
                upserts.append((experience, vector))
                imported.append(experience.experience_id)
            return Plan(result={"workspace_id": workspace_id, "imported": imported, "skipped_duplicates": skipped},
                        upserts=upserts)

        return await self._mutate(workspace_id, "import", request_id, digest, build)

    async def export(self, workspace_id: str, *, include_archived: bool, write_file: bool) -> dict:
        index = self.index(workspace_id)
        experiences = [e.model_dump(mode="json") for e in index.experiences.values()
                       if include_archived or e.status == "active"]
        result: dict[str, Any] = {"workspace_id": workspace_id, "embedding_model": self.embedding_model,
                                  "count": len(experiences), "experiences": experiences}
        if write_file:
            path = Path(self.settings.store) / "exports" / f"{workspace_id}.jsonl"
            data = b"".join(orjson.dumps(e) + b"\n" for e in experiences)
            await asyncio.get_running_loop().run_in_executor(self._writer, atomic_write, path, data)
            result["path"] = str(path.resolve())
        return result

    def list_workspaces(self) -> list[dict]:
        return [self.workspace_stats(ws, brief=True) for ws in sorted(self.indexes)]

    def workspace_stats(self, workspace_id: str, brief: bool = False) -> dict:
        index = self.index(workspace_id)
        experiences = list(index.experiences.values())
        active = [e for e in experiences if e.status == "active"]
        stats: dict[str, Any] = {"workspace_id": workspace_id, "active": len(active),
                                 "archived": len(experiences) - len(active), "pool_version": index.version}
        if brief:
            return stats
        kinds: dict[str, int] = {}
        for e in active:
            kinds[e.kind.value] = kinds.get(e.kind.value, 0) + 1
        stats.update(
            kinds=kinds, uses=sum(e.usage.uses for e in experiences),
            mean_utility=round(float(np.mean([e.usage.utility for e in active])), 5) if active else None,
            embedding_model=self.embedding_model, cache={"hits": self.cache_hits, "misses": self.cache_misses,
                                                         "size": len(self._cache)})
        return stats

    async def create_workspace(self, workspace_id: str) -> dict:
        self._writable(workspace_id)
        if workspace_id in self.indexes:
            return {**self.workspace_stats(workspace_id, brief=True), "created": False}
        await self._mutate(workspace_id, "create_workspace", None, workspace_id,
                           lambda: Plan(result={"workspace_id": workspace_id}))
        return {**self.workspace_stats(workspace_id, brief=True), "created": True}

    async def drop_workspace(self, workspace_id: str, *, request_id: str | None) -> dict:
        self.index(workspace_id)
        result = await self._mutate(workspace_id, "drop_workspace", request_id, workspace_id,
                                    lambda: Plan(result={"deleted": workspace_id}, drop_workspace=True))
        # Requests replayed by id against a dropped workspace must not resurrect stale answers.
        self.done = {k: v for k, v in self.done.items() if k[0] != workspace_id or k[1] == "drop_workspace"}
        return result
