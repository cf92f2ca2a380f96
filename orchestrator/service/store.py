"""The orchestrator's durable state: one SQLite file, one transaction per change.

What the file holds (tables):

* ``dso_state``: the sequence number of the last commit;
* ``dso_parts``: the small state (:meth:`OrchestratorCore.state` with ``payloads=False``:
  counters, task order, policy, and the *keys* of the held groups, plus the anchor index's
  tracked batches), one row per top-level entry (pickled), written when it changed (the task
  ids, for one, are written once);
* ``dso_columns`` / ``dso_column_changes``: the state's per-task columns ((T,) numpy arrays such
  as ``history.mean``), each written whole once, then as the rows that changed in each commit
  (int32 row numbers and the values); a column is written whole again once its changes add up
  to :data:`CHANGES_PER_WRITE` times its length;
* ``dso_log``: one row per commit that accepted groups: the keys and filter labels of the
  groups it accepted (so a retried submit is answered, not counted again; cleared once the
  newer rows hold ``keep_keys`` keys), and the groups that became held by it (one pickle for
  all of them), cleared once none of them is held any more; a row with both cleared is
  deleted. A commit writes one row, whatever its number of groups;
* ``dso_groups``: the same per group, one row each (files of earlier versions; read on load,
  payloads cleared on release, never written otherwise);
* ``dso_ready``: batches emitted but not yet handed to a caller (``pop_batch``);
* ``dso_last_call``: the id of the last ``submit_and_pop`` call that gave one, with the batches
  it handed out (a retry of that call is answered with them);
* with a :class:`~orchestrator.service.sink.SQLiteSink` on the same file, the sink's
  ``batches`` / ``experiences`` tables.

:meth:`StateStore.commit` writes all of a change (new groups, emitted batches into the sink
and the ready queue, hand-outs, the new state) in one SQLite transaction (WAL,
``synchronous=FULL``): after a crash the file holds either everything a change did or none of
it. So a batch id is written once, with the state that produced it, and a batch emitted but
not handed out is handed out after a restart. The cost of a commit grows with what changed
(new groups, emitted batches, tasks touched), not with the number of groups held or of tasks.
"""

from __future__ import annotations

import json
import pickle
import sqlite3
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.core.types import Batch, Group, packed_keys, unpack_groups
from orchestrator.service.sink import SQLiteSink

_SCHEMA = """
CREATE TABLE IF NOT EXISTS dso_state (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    seq INTEGER NOT NULL,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dso_groups (
    key TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    payload BLOB
);
CREATE TABLE IF NOT EXISTS dso_parts (
    name TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS dso_log (
    seq INTEGER PRIMARY KEY,
    seen BLOB,
    held BLOB
);
CREATE TABLE IF NOT EXISTS dso_last_call (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    call_id TEXT NOT NULL,
    payload BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS dso_ready (
    batch_id INTEGER PRIMARY KEY,
    payload BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS dso_columns (
    name TEXT PRIMARY KEY,
    dtype TEXT NOT NULL,
    base BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS dso_column_changes (
    seq INTEGER NOT NULL,
    name TEXT NOT NULL,
    rows BLOB NOT NULL,
    vals BLOB NOT NULL
);
"""


CHANGES_PER_WRITE = 4
"""A per-task column is written whole again once the rows written as its changes (12 bytes
each: an int32 row and the value) add up to this many times its length: the changes it keeps
stay within a few times the column's size, and replaying them on load is one vectorised
assignment per commit."""


class StateStoreError(RuntimeError):
    """The state file cannot be opened or read (names the path)."""


@dataclass
class Saved:
    """What :meth:`StateStore.load` found.

    Attributes:
        seq: number of commits so far.
        state: the last committed state (a JSON-safe dict, stored pickled: its per-task arrays
            make JSON text the largest cost of a commit).
        groups: the held groups by key (with, after a crash, groups released by commits whose
            held-row still holds others: the state's held keys say which are held).
        seen: filter label of each group key accepted by the commits whose keys are kept (see
            ``keep_keys`` of :class:`StateStore`), oldest first.
        ready: batches emitted and not handed out, oldest first.
        last_call: the id of the last call that handed out batches under an id, and those batches.
    """

    seq: int
    state: dict
    groups: dict[str, Group] = field(default_factory=dict)
    seen: dict[str, str] = field(default_factory=dict)
    ready: list[Batch] = field(default_factory=list)
    last_call: tuple[str, list[Batch]] | None = None


@dataclass
class ColumnWrites:
    """What one commit writes of the per-task columns (copies, taken by :meth:`StateStore.stage`).

    Attributes:
        whole: columns written whole, by dotted path.
        rows: for the others, the rows that changed since the last commit and their values.
    """

    whole: dict[str, np.ndarray] = field(default_factory=dict)
    rows: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


@dataclass
class Change:
    """One change to commit (see :meth:`StateStore.commit`).

    Attributes:
        state: the whole new small state (replaces the saved one), without its per-task columns.
        columns: what changed in the per-task columns (:meth:`StateStore.stage`).
        seen: new group keys and their filter labels.
        hold: the groups that became held (payload written once), as
            :func:`~orchestrator.core.types.pack_groups` packed them, on the thread that
            changes them, before it changes them again (the commit may be written in another
            thread meanwhile); their keys are read from it (:func:`~orchestrator.core.types.packed_keys`).
        release: keys of groups that left the held set (payload cleared).
        batches: batches emitted by this change (into the sink, when it shares the file,
            and into the ready queue unless ``handed``).
        handed: ids of ready batches handed to a caller by this change.
        call: the call id and the batches it handed out, when the change answers a call with an
            id (replaces the saved one).
    """

    state: dict
    columns: ColumnWrites
    seen: dict[str, str] = field(default_factory=dict)
    hold: tuple = ()
    release: list[str] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    handed: list[int] = field(default_factory=list)
    call: tuple[str, list[Batch]] | None = None


class StateStore:
    """The orchestrator's state file (SQLite, WAL, ``synchronous=FULL``).

    Args:
        path: the SQLite file; parent directories are created.
        sink: a :class:`SQLiteSink` on the same file: emitted batches are then written into its
            tables in the same transaction as the state.
        keep_keys: keep the accepted group keys of the newest commits that hold at least this
            many of them (the keys of an older commit are cleared by the commit that passes the
            count); None keeps every key.
    Raises:
        StateStoreError: the file exists and is not a SQLite database (e.g. a JSON checkpoint
            of an older version).
    """

    def __init__(self, path: str | Path, sink: SQLiteSink | None = None, keep_keys: int | None = None):
        if keep_keys is not None and keep_keys < 1:
            raise ValueError(f"keep_keys: must be at least 1 (or None for every key), got {keep_keys!r}")
        self.path = Path(path)
        self.sink = sink
        self.keep_keys = keep_keys
        if sink is not None and Path(sink.path).resolve() != self.path.resolve():
            raise ValueError(f"sink: {sink.path} is not the state file {self.path}")
        try:
            if sink is not None:
                self._db = sink._db
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as err:
            raise StateStoreError(
                f"checkpoint_path: {self.path} is not a SQLite state file ({err}); a JSON checkpoint of an "
                "older version cannot be resumed: move it away to start afresh"
            ) from None
        self.seq = 0
        self._columns: dict[str, np.ndarray] = {}  # each column as last committed
        self._parts: dict[str, Any] = {}  # each top-level entry of the small state as last committed
        self._changed: dict[str, int] = {}  # rows written as changes since its last whole write
        self._chunk_of: dict[str, int] = {}  # held group key -> the dso_log row holding its payload
        self._live: dict[int, int] = {}  # dso_log row -> its groups not yet released
        self._legacy: set[str] = set()  # held group keys whose payload is in dso_groups (older files)
        self._given: dict[str, Any] = {}  # the small state of the last commit, as given
        self._key_rows: deque[tuple[int, int]] = deque()  # (seq, keys) of the dso_log rows whose keys are kept
        self._kept_keys = 0  # their sum

    def __getstate__(self) -> dict:
        raise TypeError("StateStore: open it where it is used (it holds a SQLite connection)")

    def load(self) -> Saved | None:
        """The last committed state, or None for a new file. Either way, what this store holds of
        the file (the columns as last written, included) is read again: after a failed commit,
        what it staged is forgotten."""
        self.seq, self._columns, self._changed, self._parts, self._given = 0, {}, {}, {}, {}
        row = self._db.execute("SELECT seq, state FROM dso_state WHERE id = 0").fetchone()
        if row is None:
            return None
        self.seq = int(row[0])
        state = pickle.loads(row[1]) if isinstance(row[1], bytes) else json.loads(row[1])  # older files: all of it
        parts = self._db.execute("SELECT name, value FROM dso_parts").fetchall()
        state.update((name, pickle.loads(value)) for name, value in parts)
        self._parts = {name: pickle.loads(value) for name, value in parts}  # copies: the caller may keep the state's
        columns = {name: np.frombuffer(base, dtype=dtype).copy()
                   for name, dtype, base in self._db.execute("SELECT name, dtype, base FROM dso_columns")}
        changed = dict.fromkeys(columns, 0)
        for name, rows, vals in self._db.execute("SELECT name, rows, vals FROM dso_column_changes ORDER BY seq, rowid"):
            col = columns[name]
            count = len(vals) // col.itemsize
            idx = np.frombuffer(rows, dtype=np.int32 if len(rows) == 4 * count else np.int64)  # int64: older files
            col[idx] = np.frombuffer(vals, dtype=col.dtype)
            changed[name] += idx.size
        self._columns, self._changed = {k: v.copy() for k, v in columns.items()}, changed
        state = _join(state, columns)
        seen: dict[str, str] = {}
        groups: dict[str, Group] = {}
        for key, reason, payload in self._db.execute("SELECT key, reason, payload FROM dso_groups"):
            seen[key] = reason
            if payload is not None:
                groups[key] = pickle.loads(payload)
        self._legacy = set(groups)
        self._chunk_of, self._live, self._key_rows, self._kept_keys = {}, {}, deque(), 0
        for seq, keys, held in self._db.execute("SELECT seq, seen, held FROM dso_log ORDER BY seq"):
            if keys is not None:
                names, labels = pickle.loads(keys)
                if not seen.keys().isdisjoint(names):  # accepted again after the actor forgot it: its newer place
                    for k in names:
                        seen.pop(k, None)
                seen.update(zip(names, labels))
                self._key_rows.append((seq, len(names)))
                self._kept_keys += len(names)
            for g in unpack_groups(pickle.loads(held)) if held is not None else ():
                groups[g.key] = g
                self._chunk_of[g.key] = seq
                self._live[seq] = self._live.get(seq, 0) + 1
        ready = [pickle.loads(p) for (p,) in self._db.execute("SELECT payload FROM dso_ready ORDER BY batch_id")]
        last = self._db.execute("SELECT call_id, payload FROM dso_last_call").fetchone()
        return Saved(self.seq, state, groups, seen, ready, None if last is None else (last[0], pickle.loads(last[1])))

    def commit(self, change: Change) -> int:
        """Write one change atomically; returns the new sequence number.

        The groups accepted and held by the change go into one ``dso_log`` row; a released
        group only counts down its row's live groups, and the row's payload is cleared when
        that reaches 0.

        Raises:
            sqlite3.Error (e.g. ``IntegrityError`` for a batch id already in the sink): nothing
            of the change is written.
        """
        db = self._db
        seq = self.seq + 1
        handed = set(change.handed)
        dump = lambda x: pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)  # noqa: E731
        # a part given as the very object of the last commit is unchanged (the core's task ids)
        changed = {k: v for k, v in change.state.items() if v is not self._given.get(k, _same)
                   and not _same(self._parts.get(k, _same), v)}
        parts = {k: dump(v) for k, v in changed.items()}
        freed = Counter(self._chunk_of[k] for k in change.release if k in self._chunk_of)
        cleared = [s for s, n in freed.items() if self._live[s] == n]
        legacy = [k for k in change.release if k in self._legacy]
        forget = self._forget(len(change.seen))
        hold_keys = packed_keys(change.hold)
        with db:
            db.execute("BEGIN IMMEDIATE")
            for name, col in change.columns.whole.items():
                db.execute("INSERT OR REPLACE INTO dso_columns VALUES (?, ?, ?)", (name, col.dtype.str, col.tobytes()))
                db.execute("DELETE FROM dso_column_changes WHERE name = ?", (name,))
            db.executemany("INSERT INTO dso_column_changes VALUES (?, ?, ?, ?)",
                           ((seq, name, idx.tobytes(), vals.tobytes()) for name, (idx, vals) in change.columns.rows.items()))
            if change.seen or hold_keys:
                db.execute("INSERT INTO dso_log VALUES (?, ?, ?)", (
                    seq, dump((list(change.seen), list(change.seen.values()))) if change.seen else None,
                    dump(change.hold) if hold_keys else None,
                ))
            db.executemany("UPDATE dso_log SET held = NULL WHERE seq = ?", ((s,) for s in cleared))
            db.executemany("UPDATE dso_log SET seen = NULL WHERE seq = ?", ((s,) for s in forget))
            db.executemany("DELETE FROM dso_log WHERE seq = ? AND seen IS NULL AND held IS NULL",
                           ((s,) for s in (*cleared, *forget)))
            db.executemany("UPDATE dso_groups SET payload = NULL WHERE key = ?", ((k,) for k in legacy))
            for batch in change.batches:
                if self.sink is not None:
                    self.sink.insert(db, batch)
                if batch.batch_id not in handed:
                    db.execute("INSERT INTO dso_ready VALUES (?, ?)", (batch.batch_id, dump(batch)))
            db.executemany("DELETE FROM dso_ready WHERE batch_id = ?", ((b,) for b in handed))
            if change.call is not None:
                db.execute("INSERT OR REPLACE INTO dso_last_call VALUES (0, ?, ?)", (change.call[0], dump(change.call[1])))
            db.executemany("INSERT OR REPLACE INTO dso_parts VALUES (?, ?)", parts.items())
            db.execute(
                "INSERT INTO dso_state (id, seq, state) VALUES (0, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET seq = excluded.seq, state = excluded.state",
                (seq, dump({})),
            )
        self.seq = seq
        self._parts.update((k, pickle.loads(v)) for k, v in parts.items())  # copies, not the caller's objects
        self._given = change.state
        for k in change.release:
            self._chunk_of.pop(k, None)
        self._legacy.difference_update(legacy)
        for s, n in freed.items():
            self._live[s] -= n
        for s in cleared:
            del self._live[s]
        for _ in forget:
            self._kept_keys -= self._key_rows.popleft()[1]
        if change.seen:
            self._key_rows.append((seq, len(change.seen)))
            self._kept_keys += len(change.seen)
        for k in hold_keys:
            self._chunk_of[k] = seq
        if hold_keys:
            self._live[seq] = len(hold_keys)
        if change.batches and self.sink is not None:
            self.sink.wal_checkpoint()
        return self.seq

    def _forget(self, new_keys: int) -> list[int]:
        """The oldest ``dso_log`` rows whose keys a commit adding ``new_keys`` keys clears: those
        not needed for the newer rows to hold ``keep_keys`` keys."""
        if self.keep_keys is None:
            return []
        total = self._kept_keys + new_keys
        forget = []
        for seq, n in self._key_rows:
            if total - n < self.keep_keys:
                break
            forget.append(seq)
            total -= n
        return forget

    def stage(self, state: dict, rows: np.ndarray | None = None) -> tuple[dict, ColumnWrites]:
        """Split a new state into its small part and the column writes of its commit; call it on
        the thread that changes the state, before it changes again (the columns may be the
        state's own arrays: only what is written is copied).

        A column is written whole when it is new or reshaped, or when its changes would pass
        :data:`CHANGES_PER_WRITE` times its length; else as the rows that differ (bit for bit)
        from the last staged state. ``rows``: the only rows that can differ (sorted task rows,
        :meth:`OrchestratorCore.touched_rows`); None compares every row. The staged columns
        count as committed from here: the commit must follow, and a failed commit is followed by
        :meth:`load` (the actor's rollback), which reads them back from the file.
        """
        small, columns = _split(state)
        writes = ColumnWrites()
        for name, col in columns.items():
            old = self._columns.get(name)
            if old is None or old.shape != col.shape or old.dtype != col.dtype:
                idx = None
            else:
                bits = f"u{col.dtype.itemsize}"
                if rows is None:
                    idx = np.flatnonzero(old.view(bits) != col.view(bits))
                else:
                    idx = rows[old.view(bits)[rows] != col.view(bits)[rows]]
                if not idx.size:
                    continue
                if self._changed[name] + idx.size > CHANGES_PER_WRITE * col.size:
                    idx = None
            if idx is None:
                self._columns[name] = writes.whole[name] = col.copy()
                self._changed[name] = 0
            else:
                writes.rows[name] = (idx.astype(np.int32), vals := col[idx])
                old[idx] = vals
                self._changed[name] += idx.size
        return small, writes

    def close(self) -> None:
        if self.sink is None:
            self._db.close()


def _same(old: Any, new: Any) -> bool:
    """``old == new`` as a plain truth value (False where the comparison is not one)."""
    try:
        return bool(old == new)
    except Exception:  # e.g. an array inside: write it
        return False


def _split(state: Any, path: str = "") -> tuple[Any, dict[str, np.ndarray]]:
    """The state without its 1-d numpy arrays, and those arrays by dotted path."""
    if isinstance(state, dict):
        small, columns = {}, {}
        for k, v in state.items():
            if isinstance(v, np.ndarray) and v.ndim == 1:
                columns[f"{path}{k}"] = np.ascontiguousarray(v)
            else:
                small[k], more = _split(v, f"{path}{k}.")
                columns.update(more)
        return small, columns
    return state, {}


def _join(state: dict, columns: dict[str, np.ndarray]) -> dict:
    """:func:`_split` undone: each column put back at its dotted path."""
    for name, col in columns.items():
        *parents, leaf = name.split(".")
        node = state
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = col
    return state
