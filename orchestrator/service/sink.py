"""Buffer sink: emitted batches written durably to SQLite, one transaction per batch.

Each experience row carries its batch id, group index, padding flag and the group-relative
advantage (``algos.dapo.group_advantages``, ``norm="std"``; zero for padding groups and for
masked members, which also stay out of their group's mean and std), so a
trainer can read a batch back without the orchestrator. A masked member's reward that is
missing, NaN or infinite is stored as NULL (never ``inf``), the original kept as a string in
``info["dso_reward"]`` (``"inf"``, ``"-inf"`` or ``"nan"``; absent for a missing one).

Given to the orchestrator actor, the same file also holds the actor's state
(:mod:`orchestrator.service.store`): each batch is then written in the transaction that commits
the state which produced it.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Protocol

import torch

from algos.dapo import group_advantages
from orchestrator.core.types import Batch

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    batch_id INTEGER PRIMARY KEY,
    num_groups INTEGER NOT NULL,
    num_padding INTEGER NOT NULL,
    partial INTEGER NOT NULL,
    rounds INTEGER NOT NULL,
    model_version INTEGER NOT NULL,
    fill_seconds REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS experiences (
    batch_id INTEGER NOT NULL REFERENCES batches(batch_id),
    group_index INTEGER NOT NULL,
    task TEXT NOT NULL,
    run INTEGER NOT NULL,
    step INTEGER NOT NULL,
    reason TEXT NOT NULL,
    padding INTEGER NOT NULL,
    model_version INTEGER NOT NULL,
    reward REAL,               -- NULL for a masked member whose reward was missing, NaN or infinite
    advantage REAL NOT NULL,
    prompt_length INTEGER NOT NULL,
    tokens TEXT NOT NULL,
    logprobs TEXT NOT NULL,
    response_text TEXT NOT NULL,
    info TEXT NOT NULL,
    metrics TEXT NOT NULL,
    PRIMARY KEY (batch_id, group_index, run, step)
);
"""


class BatchSink(Protocol):
    """Where emitted batches go (the orchestrator calls ``write`` once per batch, in order)."""

    def write(self, batch: Batch) -> None: ...


class DuplicateBatchError(ValueError):
    """A batch id that the sink already holds (batches are written exactly once)."""


class SQLiteSink:
    """Writes batches to a SQLite file (WAL mode; each batch in one transaction).

    Args:
        path: database file; parent directories are created.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        _ = self._db  # create the file and schema now, so a bad path fails at construction

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.executescript(_SCHEMA)
        return self._conn

    def __getstate__(self) -> dict:
        # Sent to the actor by path; the connection is reopened there.
        return {"path": self.path, "_conn": None}

    def write(self, batch: Batch) -> None:
        """Write one batch atomically.

        Raises:
            DuplicateBatchError: ``batch.batch_id`` was written before (nothing is changed).
        """
        try:
            with self._db:
                self._db.execute("BEGIN")
                self.insert(self._db, batch)
        except sqlite3.IntegrityError as err:
            raise DuplicateBatchError(f"batch_id: batch {batch.batch_id} already written to {self.path}") from err
        self.wal_checkpoint()

    def wal_checkpoint(self) -> None:
        """Move committed batches from the write-ahead log into the database file itself, so the
        .db file alone (e.g. a copy) holds every written batch. Readers may keep reading."""
        self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    @staticmethod
    def insert(db: sqlite3.Connection, batch: Batch) -> None:
        """Insert one batch's rows inside the caller's open transaction (no commit).

        Raises:
            sqlite3.IntegrityError: the batch id is already written.
        """
        rows = []
        gid = [i for i, g in enumerate(batch.groups) for _ in g.rollouts]
        rewards = [r.reward for g in batch.groups for r in g.rollouts]
        valid = [not r.info.get("dso_masked") for g in batch.groups for r in g.rollouts]
        rewards = [float(x) if ok else float("nan") for x, ok in zip(rewards, valid)]
        adv = (
            group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(gid), valid=torch.tensor(valid))
            if rewards else []
        )
        k = 0
        for i, g in enumerate(batch.groups):
            for r in g.rollouts:
                reward, info = r.reward, r.info
                if reward is not None and not math.isfinite(reward):  # a masked member's (others are refused)
                    reward, info = None, {**info, "dso_reward": str(float(reward))}  # 'inf', '-inf' or 'nan'
                rows.append((
                    batch.batch_id, i, r.eid.task, r.eid.run, r.eid.step, g.reason, int(g.padding), g.model_version,
                    reward, 0.0 if g.padding else float(adv[k]), r.prompt_length, json.dumps(r.tokens),
                    json.dumps(r.logprobs), r.response_text, json.dumps(info, default=str), json.dumps(r.metrics),
                ))
                k += 1
        db.execute(
            "INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?)",
            (batch.batch_id, len(batch.groups), batch.num_padding, int(batch.partial), batch.rounds,
             batch.model_version, batch.fill_seconds),
        )
        db.executemany(f"INSERT INTO experiences VALUES ({', '.join('?' * 16)})", rows)

    def batch_ids(self) -> list[int]:
        return [r[0] for r in self._db.execute("SELECT batch_id FROM batches ORDER BY batch_id")]

    def read_batch(self, batch_id: int) -> list[dict]:
        """Rows of one batch as dicts, in group then run order. Raises KeyError when absent."""
        cur = self._db.execute("SELECT * FROM experiences WHERE batch_id = ? ORDER BY group_index, run, step", (batch_id,))
        cols = [c[0] for c in cur.description]
        rows = [dict(zip(cols, r)) for r in cur]
        if not rows and batch_id not in self.batch_ids():
            raise KeyError(f"batch_id: batch {batch_id} not in {self.path}")
        for row in rows:
            for key in ("tokens", "logprobs", "info", "metrics"):
                row[key] = json.loads(row[key])
        return rows

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
