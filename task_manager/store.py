"""The task store: one SQLite file holding tasks, references, explorations, jobs and pass rates.

SQLite gives atomic commits that survive a SIGKILL: a job writes one episode's exploration, its
new tasks and the job's cursor in one transaction, so a restart resumes exactly after the last
committed episode and never holds half an episode. Task ids of synthetic tasks are derived from
their content, and a unique index on (env, signature) makes a duplicate impossible even if an
episode is redone.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from common.faults import check_disk
from common.schemas import Task
from task_manager.dedup import DedupIndex
from task_manager.models import Exploration, Reference, StoredTask

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    env_type TEXT NOT NULL,
    seed_task_id TEXT,
    query TEXT,
    split TEXT NOT NULL DEFAULT 'train',
    synthetic INTEGER NOT NULL,
    signature TEXT NOT NULL,
    goal_key TEXT,
    end_state TEXT,
    synthesizer TEXT,
    confidence REAL,
    job_id TEXT,
    exploration_id TEXT,
    reference TEXT,
    metadata TEXT NOT NULL DEFAULT '{}',
    embedding BLOB,
    created_at REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS tasks_signature ON tasks(env_type, signature);
CREATE INDEX IF NOT EXISTS tasks_env ON tasks(env_type, synthetic);
CREATE TABLE IF NOT EXISTS explorations (
    exploration_id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    episode INTEGER NOT NULL,
    env_type TEXT NOT NULL,
    data TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE(job_id, episode)
);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    params TEXT NOT NULL,
    status TEXT NOT NULL,
    cursor INTEGER NOT NULL DEFAULT 0,
    progress TEXT NOT NULL DEFAULT '{}',
    error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS pass_rates (
    task_id TEXT PRIMARY KEY,
    recent TEXT NOT NULL,
    total INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    solved INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS feedback_requests (
    request_id TEXT PRIMARY KEY,
    updated INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS heldout (
    env_type TEXT NOT NULL,
    task_id TEXT NOT NULL,
    query TEXT NOT NULL,
    embedding BLOB,
    PRIMARY KEY (env_type, task_id)
);
"""


class TaskStore:
    """Thread-safe access to the store file. All writes of one unit of work go through `transaction`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        columns = {row["name"] for row in self._db.execute("PRAGMA table_info(pass_rates)")}
        if "solved" not in columns:  # a store written before solved rollouts were counted: none counted yet
            self._db.execute("ALTER TABLE pass_rates ADD COLUMN solved INTEGER NOT NULL DEFAULT 0")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One unit of work: all of it is committed, or (an error, a full disk at COMMIT) none of it."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                check_disk(self.path)  # test-only: a full disk fails the commit, as SQLITE_FULL would
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    # ------------------------------------------------------------ tasks

    @staticmethod
    def insert_task(db: sqlite3.Connection, stored: StoredTask, goal_key: str | None,
                    embedding: np.ndarray | None) -> None:
        task = stored.task
        db.execute(
            "INSERT INTO tasks (task_id, env_type, seed_task_id, query, split, synthetic, signature, goal_key,"
            " end_state, synthesizer, confidence, job_id, exploration_id, reference, metadata, embedding, created_at)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (task.task_id, task.env_type, task.seed_task_id, task.query, task.split, int(task.synthetic),
             stored.signature, goal_key, stored.reference.end_state_hash if stored.reference else None,
             stored.synthesizer, stored.confidence, stored.job_id,
             stored.exploration_id, stored.reference.model_dump_json() if stored.reference else None,
             json.dumps(task.metadata), _blob(embedding), stored.created_at))

    def add_task(self, stored: StoredTask, goal_key: str | None = None, embedding: np.ndarray | None = None) -> None:
        with self.transaction() as db:
            self.insert_task(db, stored, goal_key, embedding)

    def get(self, task_id: str) -> StoredTask | None:
        rows = self._query("SELECT * FROM tasks WHERE task_id = ?", (task_id,))
        return _stored(rows[0]) if rows else None

    def tasks(self, env_type: str | None = None, synthetic: bool | None = None, limit: int | None = None,
              offset: int = 0) -> list[StoredTask]:
        sql, args = _matching("SELECT * FROM tasks", "created_at, task_id", env_type=env_type,
                              synthetic=None if synthetic is None else int(synthetic))
        if limit is not None:
            sql += " LIMIT ? OFFSET ?"
            args += [limit, offset]
        return [_stored(r) for r in self._query(sql, args)]

    def count(self, env_type: str | None = None) -> int:
        if env_type is None:
            return int(self._query("SELECT COUNT(*) FROM tasks")[0][0])
        return int(self._query("SELECT COUNT(*) FROM tasks WHERE env_type = ?", (env_type,))[0][0])

    def dedup_index(self, env_type: str, threshold: float, contamination_threshold: float) -> DedupIndex:
        """Every stored task of `env_type` and its held-out evaluation tasks, ready to compare new ones with."""
        index = DedupIndex(threshold=threshold, contamination_threshold=contamination_threshold)
        rows = self._query("SELECT signature, goal_key, end_state, query, embedding FROM tasks WHERE env_type = ?",
                           (env_type,))
        for row in rows:
            index.add(row["query"] or "", row["signature"], row["goal_key"], _array(row["embedding"]), row["end_state"])
        heldout = [(q, v) for _, q, v in self.heldout(env_type) if v is not None]
        if heldout:
            index.set_heldout([q for q, _ in heldout], np.stack([v for _, v in heldout]))
        return index

    # ------------------------------------------------------------ explorations

    @staticmethod
    def insert_exploration(db: sqlite3.Connection, exploration: Exploration) -> None:
        db.execute("INSERT OR REPLACE INTO explorations (exploration_id, job_id, episode, env_type, data, created_at)"
                   " VALUES (?,?,?,?,?,?)",
                   (exploration.exploration_id, exploration.job_id, exploration.episode, exploration.env_type,
                    exploration.model_dump_json(), time.time()))

    def explorations(self, job_id: str | None = None, env_type: str | None = None) -> list[Exploration]:
        sql, args = _matching("SELECT data FROM explorations", "job_id, episode", job_id=job_id, env_type=env_type)
        return [Exploration.model_validate_json(r["data"]) for r in self._query(sql, args)]

    def exploration_count(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM explorations")[0][0])

    # ------------------------------------------------------------ jobs

    def create_job(self, job_id: str, kind: str, params: dict[str, Any], progress: dict[str, Any]) -> None:
        now = time.time()
        with self.transaction() as db:
            db.execute("INSERT INTO jobs (job_id, kind, params, status, cursor, progress, created_at, updated_at)"
                       " VALUES (?,?,?,?,?,?,?,?)",
                       (job_id, kind, json.dumps(params), "queued", 0, json.dumps(progress), now, now))

    @staticmethod
    def update_job(db: sqlite3.Connection, job_id: str, *, status: str | None = None, cursor: int | None = None,
                   progress: dict[str, Any] | None = None, error: str | None = None) -> None:
        sets, args = ["updated_at = ?"], [time.time()]
        for column, value in (("status", status), ("cursor", cursor), ("error", error)):
            if value is not None:
                sets.append(f"{column} = ?")
                args.append(value)
        if progress is not None:
            sets.append("progress = ?")
            args.append(json.dumps(progress))
        db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE job_id = ?", (*args, job_id))

    def set_job(self, job_id: str, **fields: Any) -> None:
        with self.transaction() as db:
            self.update_job(db, job_id, **fields)

    def job(self, job_id: str) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM jobs WHERE job_id = ?", (job_id,))
        return _job(rows[0]) if rows else None

    def jobs(self, status: str | None = None) -> list[dict[str, Any]]:
        if status is None:
            return [_job(r) for r in self._query("SELECT * FROM jobs ORDER BY created_at")]
        return [_job(r) for r in self._query("SELECT * FROM jobs WHERE status = ? ORDER BY created_at", (status,))]

    # ------------------------------------------------------------ pass rates

    def record_outcomes(self, outcomes: dict[str, list[float]], window: int,
                        request_id: str | None = None) -> bool:
        """Append `outcomes` to the pass-rate windows; False (and nothing written) if `request_id` was
        recorded before. The id is stored in the same transaction as the outcomes."""
        now = time.time()
        with self.transaction() as db:
            if request_id is not None:
                if db.execute("SELECT 1 FROM feedback_requests WHERE request_id = ?", (request_id,)).fetchone():
                    return False
                db.execute("INSERT INTO feedback_requests (request_id, updated, at) VALUES (?,?,?)",
                           (request_id, len(outcomes), now))
            for task_id, values in outcomes.items():
                row = db.execute("SELECT recent, total, solved FROM pass_rates WHERE task_id = ?",
                                 (task_id,)).fetchone()
                recent = (json.loads(row["recent"]) if row else []) + [float(v) for v in values]
                total = (row["total"] if row else 0) + len(values)
                solved = (row["solved"] if row else 0) + sum(v >= 1.0 for v in values)
                db.execute("INSERT OR REPLACE INTO pass_rates (task_id, recent, total, solved, updated_at) "
                           "VALUES (?,?,?,?,?)", (task_id, json.dumps(recent[-window:]), total, solved, now))
        return True

    def pass_rates(self) -> dict[str, tuple[float, int]]:
        """task_id -> (recent pass rate, rollouts seen in total)."""
        out = {}
        for row in self._query("SELECT task_id, recent, total FROM pass_rates"):
            recent = json.loads(row["recent"])
            out[row["task_id"]] = (sum(recent) / len(recent) if recent else 0.0, int(row["total"]))
        return out

    def tries(self) -> dict[str, tuple[int, int]]:
        """task_id -> (rollouts seen in total, those that solved it: outcome 1)."""
        return {row["task_id"]: (int(row["total"]), int(row["solved"]))
                for row in self._query("SELECT task_id, total, solved FROM pass_rates")}

    # ------------------------------------------------------------ held-out evaluation tasks

    def heldout(self, env_type: str) -> list[tuple[str, str, np.ndarray | None]]:
        rows = self._query("SELECT task_id, query, embedding FROM heldout WHERE env_type = ?", (env_type,))
        return [(r["task_id"], r["query"], _array(r["embedding"])) for r in rows]

    def set_heldout(self, env_type: str, items: list[tuple[str, str, np.ndarray | None]]) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM heldout WHERE env_type = ?", (env_type,))
            db.executemany("INSERT INTO heldout (env_type, task_id, query, embedding) VALUES (?,?,?,?)",
                           [(env_type, task_id, query, _blob(vec)) for task_id, query, vec in items])


def _matching(select: str, order_by: str, **equal: Any) -> tuple[str, list[Any]]:
    """`select` narrowed to the rows whose columns equal the given values (a None value: any), in order."""
    given = {column: value for column, value in equal.items() if value is not None}
    where = "".join(f" AND {column} = ?" for column in given)
    return f"{select} WHERE 1=1{where} ORDER BY {order_by}", list(given.values())


def _blob(vec: np.ndarray | None) -> bytes | None:
    return None if vec is None else np.asarray(vec, dtype=np.float32).tobytes()


def _array(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=np.float32)


def _stored(row: sqlite3.Row) -> StoredTask:
    task = Task(task_id=row["task_id"], env_type=row["env_type"], split=row["split"], query=row["query"],
                seed_task_id=row["seed_task_id"], synthetic=bool(row["synthetic"]),
                metadata=json.loads(row["metadata"] or "{}"))
    reference = Reference.model_validate_json(row["reference"]) if row["reference"] else None
    return StoredTask(task=task, reference=reference, signature=row["signature"], synthesizer=row["synthesizer"] or "",
                      confidence=row["confidence"] if row["confidence"] is not None else 1.0,
                      job_id=row["job_id"] or "", exploration_id=row["exploration_id"] or "",
                      created_at=row["created_at"])


def _job(row: sqlite3.Row) -> dict[str, Any]:
    return {"job_id": row["job_id"], "kind": row["kind"], "params": json.loads(row["params"]),
            "status": row["status"], "cursor": row["cursor"], "progress": json.loads(row["progress"]),
            "error": row["error"], "created_at": row["created_at"], "updated_at": row["updated_at"]}

