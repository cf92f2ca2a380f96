"""Data records that flow through the orchestrator: experiences, groups and batches.

Field names follow Trinity-RFT's ``trinity.common.experience.Experience`` (``eid`` with
``task`` / ``run`` / ``step``, ``tokens``, ``prompt_length``, ``logprobs``, ``reward``,
``info``, ``metrics``) so the Trinity plugin can pass experiences through unchanged.
Plain dataclasses (not pydantic): they are data, created by the thousand per step, and
must pickle cheaply across Ray.
"""

from __future__ import annotations

import operator
import pickle
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

Purpose = Literal["initial", "replenish"]


@dataclass
class ExperienceId:
    """Identity of one rollout (or one step of a multi-turn rollout).

    Attributes:
        task: the task id (one prompt or environment instance).
        run: index of the rollout within its group, in [0, n).
        step: turn index within a multi-turn trajectory; 0 for single-turn rollouts.
        round_tag: the explore step / round that produced it (free-form, e.g. ``"b3r1"``).
    """

    task: str
    run: int = 0
    step: int = 0
    round_tag: str = ""


@dataclass
class Experience:
    """One rollout: prompt plus response tokens, behaviour log-probs and its reward.

    Attributes:
        eid: identity (task, run, step, batch).
        tokens: prompt followed by response token ids, length ``prompt_length + T``.
        prompt_length: number of prompt tokens at the start of ``tokens``.
        logprobs: (T,) behaviour-policy log-probabilities of the response tokens, in nats.
        reward: scalar reward of the rollout (after any shaping); None: no reward (refused under
            ``group_validity="reject"``, masked under ``"mask"``).
        response_text: decoded response.
        info: free-form metadata (``model_version``, ``env_state_hash``, padding flags...).
        metrics: per-rollout numeric metrics (e.g. ``accuracy`` in {0, 1}, ``response_length``).
    """

    eid: ExperienceId
    tokens: list[int] = field(default_factory=list)
    prompt_length: int = 0
    logprobs: list[float] = field(default_factory=list)
    reward: float | None = 0.0
    response_text: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Group:
    """The n rollouts of one task from one round, as judged together by the filter.

    The core judges a group on its *member columns* (``rewards``, ``values``, ``valid``,
    ``versions``: (n,) arrays indexed by run, set on acceptance), never on per-rollout objects.
    ``rollouts`` is the optional payload: the rollouts themselves (the standalone route, whose
    trainer needs their tokens), or empty when the payload stays with the submitter (the Trinity
    route, which submits a :class:`GroupTable` and finds its experiences again by ``ref``).

    Attributes:
        task_id: the task all rollouts share.
        rollouts: the n experiences with distinct ``eid.run`` in [0, n), or empty (see above).
        model_version: model weights version that produced the rollouts (the oldest member's).
        purpose: ``initial`` (first round of a batch) or ``replenish``.
        round: replenish round within its batch (0 for the initial round).
        reason: filter outcome label (``informative``, ``all_correct``, ...); set on submit.
        padding: True when emitted only to keep the batch shape (zero loss weight).
        key: storage key given by the orchestrator on submit (:func:`group_key`, or a unique
            ``anon:`` key for a group without a round tag).
        ref: the submitter's handle of the group's payload (:attr:`GroupTable.refs`), returned as is.
        size: members submitted (``group_size``, fewer under ``group_validity="mask"``).
        rewards: (n,) float64 by run, NaN where no member; set on acceptance.
        values: (n,) float64 judged value by run (the filter's input), NaN where unusable.
        valid: (n,) bool by run: the member is present and in play (not masked).
        versions: (n,) int64 model version by run (the group's where no member).
    """

    task_id: str
    rollouts: list[Experience] = field(default_factory=list)
    model_version: int = 0
    purpose: Purpose = "initial"
    round: int = 0
    reason: str = ""
    padding: bool = False
    key: str = ""
    ref: str = ""
    size: int = 0
    rewards: np.ndarray | None = None
    values: np.ndarray | None = None
    valid: np.ndarray | None = None
    versions: np.ndarray | None = None

    def __reduce__(self) -> tuple:
        # a flat tuple with the columns as bytes: pickles several times faster than the
        # dataclass with its arrays (lists of groups go as columns: see pack_groups)
        cols = tuple(None if c is None else (c.dtype.str, c.tobytes()) for c in (self.rewards, self.values, self.valid, self.versions))
        return _unpickle_group, (self._fields(), cols)

    def _fields(self) -> tuple:
        return (self.task_id, self.rollouts, self.model_version, self.purpose, self.round, self.reason, self.padding,
                self.key, self.ref, self.size)


_KEY_FIELD = 7
"""Where ``key`` is in :meth:`Group._fields`."""
_COLUMNS = ("rewards", "values", "valid", "versions")
_COLUMN_GETTERS = tuple((name, operator.attrgetter(name)) for name in _COLUMNS)


def _unpickle_group(fields: tuple, cols: tuple) -> Group:
    """:meth:`Group.__reduce__` undone (columns come back read-only: the core replaces, never edits, them)."""
    return Group(*fields, *(None if c is None else np.frombuffer(c[1], dtype=c[0]) for c in cols))


def pack_groups(groups: list[Group]) -> tuple:
    """Groups as columns, to pickle (the state store's held groups, a :class:`Batch` over Ray).

    Each scalar field becomes one list and each member column one (G, n) array when every
    group has it with the same shape and dtype (else a list of the groups' own): a list of 256
    groups pickles in one pass over a few objects, not 256 reductions. Columns travel in their
    smallest lossless dtype (:func:`narrow`), and ``values`` not at all when it equals
    ``rewards`` (NaN included), so that a batch of 256 groups of 16 stays well under Ray's
    100 KiB inline limit.
    See :func:`unpack_groups`.
    """
    if not groups:
        return (), ()
    fields = tuple(map(list, zip(*map(Group._fields, groups))))
    return pack_columns(fields, {name: _stack(list(map(getter, groups))) for name, getter in _COLUMN_GETTERS})


def pack_columns(fields: tuple[list, ...], stacked: dict[str, np.ndarray | list]) -> tuple:
    """:func:`pack_groups` from the fields as lists (in :meth:`Group._fields` order) and the member
    columns by name, each a (G, n) array or a list of the groups' own (for
    :meth:`~orchestrator.core.rows.GroupRows.pack`, which has them already)."""
    cols = []
    for name, col in stacked.items():
        if not isinstance(col, np.ndarray):
            cols.append(col)
        elif name == "values" and isinstance(stacked["rewards"], np.ndarray) and col.dtype == stacked["rewards"].dtype \
                and np.array_equal(col, stacked["rewards"], equal_nan=True):
            cols.append("rewards")
        elif (small := narrow(col)).dtype != col.dtype:
            cols.append((col.dtype.str, small))
        else:
            cols.append(col)
    return fields, tuple(cols)


def packed_keys(packed: tuple) -> list[str]:
    """The ``key`` of each group :func:`pack_groups` packed, in order, without unpacking them."""
    fields = packed[0] if packed else ()
    return list(fields[_KEY_FIELD]) if fields else []


def narrow(col: np.ndarray) -> np.ndarray:
    """``col`` in the smallest dtype of its kind that holds every value exactly: int8, int16 or
    int32 for integers (by their range), float32 for float64 (when every value survives the
    round trip bit for bit, NaN and -0.0 included); else ``col`` itself.
    ``narrow(col).astype(col.dtype)`` equals ``col`` bit for bit. Used on what crosses Ray or
    goes to the state file (+-1 rewards, small run ids and model versions shrink 2x-8x)."""
    if col.dtype.kind == "i" and col.dtype.itemsize > 1:
        if col.size == 0:
            return col.astype(np.int8)
        lo, hi = int(col.min()), int(col.max())
        for small in (np.int8, np.int16, np.int32):
            info = np.iinfo(small)
            if np.dtype(small).itemsize >= col.dtype.itemsize:
                break
            if info.min <= lo and hi <= info.max:
                return col.astype(small)
    elif col.dtype == np.float64:
        with np.errstate(over="ignore"):  # beyond float32's range: inf, then unequal
            small = col.astype(np.float32)
        if np.array_equal(small.astype(np.float64).view(np.uint64), col.view(np.uint64)):  # bit for bit
            return small
    return col


def _stack(col: list) -> np.ndarray | list:
    """(G, ...) array of equal-shape, equal-dtype arrays; else the list as it is.

    The checks run as C-level ``map`` passes (a set of dtypes, of lengths): a column of 256
    groups costs about one ``np.concatenate`` more, not 256 Python-level comparisons."""
    try:
        dtypes = set(map(_DTYPE, col))
        ndims = set(map(_NDIM, col))
    except AttributeError:  # a group without this column
        return col
    if len(dtypes) != 1 or len(ndims) != 1 or 0 in ndims:
        return col
    if len(set(map(len, col)) if ndims == {1} else set(map(_SHAPE, col))) != 1:  # len: no shape tuples
        return col
    return np.concatenate(col).reshape((len(col), *col[0].shape))


_DTYPE, _NDIM, _SHAPE = operator.attrgetter("dtype"), operator.attrgetter("ndim"), operator.attrgetter("shape")


def unpack_groups(packed: tuple) -> list[Group]:
    """:func:`pack_groups` undone: equal groups, dtypes included (stacked columns come back as row views)."""
    fields, cols = packed
    if not fields:
        return []
    cols = [c[1].astype(c[0]) if isinstance(c, tuple) else c for c in cols]  # narrowed columns widened back
    cols = [cols[0].copy() if isinstance(c, str) else c for c in cols]  # "rewards": values equal to the rewards
    return [Group(*f, *c) for f, c in zip(zip(*fields), zip(*(list(c) for c in cols)))]


@dataclass
class GroupTable:
    """Complete groups as columns: one object per call, no per-rollout objects (the Trinity route).

    Row ``i`` is one group of ``n`` rollouts; column ``j`` one of its members, in any run order
    (``runs`` says which).

    Attributes:
        task_ids: (G,) str, the task of each group.
        round_tags: (G,) str, the round that produced it (its identity: a retried submit of the
            same task, tag and runs is recognised, see :func:`group_key`).
        refs: (G,) str, the submitter's handle of each group's payload (returned on the
            released :class:`Group` as ``ref``).
        runs: (G, n) integers, the run id of each member.
        rewards: (G, n) floats, each member's reward (NaN: none).
        versions: (G, n) integers, each member's model version.
        metrics: name -> (G, n) floats, judged metrics (e.g. ``accuracy``; NaN: missing).
    Each column is kept in its smallest lossless dtype (:func:`narrow`), so that a call crosses
    Ray in few bytes; readers widen them (int64, float64).
    Raises:
        algos.dapo.InvalidGroupError: ragged or mistyped columns (names the field and shapes).
    """

    task_ids: list[str]
    round_tags: list[str]
    refs: list[str]
    runs: np.ndarray
    rewards: np.ndarray
    versions: np.ndarray
    metrics: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from algos.dapo import InvalidGroupError

        g = len(self.task_ids)
        for name in ("round_tags", "refs"):
            col = getattr(self, name)
            if len(col) != g:
                raise InvalidGroupError(f"{name}: {len(col)} values for {g} groups")
            if not all(isinstance(x, str) for x in col):
                raise InvalidGroupError(f"{name}: expected str values")
        self.runs = np.asarray(self.runs)
        if self.runs.ndim != 2 or self.runs.shape[0] != g or not np.issubdtype(self.runs.dtype, np.integer):
            raise InvalidGroupError(f"runs: expected ({g}, n) integers, got {self.runs.dtype} {self.runs.shape}")
        shape = self.runs.shape
        for name, kind in (("rewards", np.floating), ("versions", np.integer)):
            col = np.asarray(getattr(self, name))
            if col.shape != shape or not np.issubdtype(col.dtype, kind):
                raise InvalidGroupError(f"{name}: expected {shape} {kind.__name__}, got {col.dtype} {col.shape}")
            setattr(self, name, col)
        # every column in its smallest lossless dtype (narrow): a call of 256 groups of 16, with
        # a judged metric, then stays well under Ray's 100 KiB inline-argument limit (larger
        # arguments go through the object store)
        for name in ("runs", "versions", "rewards"):
            setattr(self, name, narrow(getattr(self, name)))
        for name, col in self.metrics.items():
            col = np.asarray(col)
            if col.shape != shape or not np.issubdtype(col.dtype, np.floating):
                raise InvalidGroupError(f"metrics[{name!r}]: expected {shape} floats, got {col.dtype} {col.shape}")
            self.metrics[name] = narrow(col)

    def __len__(self) -> int:
        return len(self.task_ids)

    def take(self, rows: Any) -> GroupTable:
        """The table of the given rows (an index array or a slice), in that order."""
        rows = np.arange(len(self))[rows] if isinstance(rows, slice) else np.asarray(rows, dtype=np.int64)
        pick = rows.tolist()
        return GroupTable(
            [self.task_ids[i] for i in pick], [self.round_tags[i] for i in pick], [self.refs[i] for i in pick],
            self.runs[rows], self.rewards[rows], self.versions[rows], {k: v[rows] for k, v in self.metrics.items()},
        )

    def keys(self) -> list[str]:
        """:func:`group_key` of each row (runs sorted), without building the groups."""
        ordered = np.sort(self.runs, axis=1)
        if len(ordered) and (ordered == ordered[:1]).all():  # the usual case: every row has runs 0..n-1
            runs = [",".join(map(str, ordered[0].tolist()))] * len(ordered)
        else:
            runs = [",".join(map(str, r)) for r in ordered.tolist()]
        if all(self.round_tags):  # every row has a round tag (the usual case): one C-level join per row
            try:
                return list(map("\x1f".join, zip(self.task_ids, self.round_tags, runs)))
            except TypeError:  # a task id that is not a str (an unknown task, refused on submit)
                pass
        return [f"{t}\x1f{tag}\x1f{r}" if tag else None for t, tag, r in zip(self.task_ids, self.round_tags, runs)]


def group_key(group: Group) -> str | None:
    """The identity of a group: ``task \x1f round tags \x1f runs``, or None without a round tag.

    A group is the same group when its task, its rollouts' round tags (``eid.round_tag``) and
    its run ids are the same: a retried submit of it is recognised and not counted twice.
    Groups whose rollouts carry no round tag have no identity (every submit is new).
    """
    tags = sorted({r.eid.round_tag for r in group.rollouts})
    if tags == [""] or not tags:
        return None
    runs = ",".join(str(r.eid.run) for r in sorted(group.rollouts, key=lambda r: r.eid.run))
    return f"{group.task_id}\x1f{'|'.join(tags)}\x1f{runs}"


class Batch:
    """One train batch released by the orchestrator.

    Attributes:
        batch_id: consecutive id from 0.
        groups: exactly ``target_groups`` groups unless ``partial``.
        partial: True when the replenish cap was hit under ``on_cap="partial"``.
        rounds: replenish rounds spent on this batch (the initial round not counted).
        model_version: the orchestrator's model version when emitted.
        fill_seconds: wall time from the batch's first round to its release.

    Args:
        groups: a list of :class:`Group`, or the core's rows of them
            (:class:`~orchestrator.core.rows.GroupRows`), of which ``groups`` is made on first
            access: the actor seals and sends a batch without making its groups.
    """

    def __init__(self, batch_id: int, groups: Any = (), partial: bool = False, rounds: int = 0, model_version: int = 0,
                 fill_seconds: float = 0.0) -> None:
        self.batch_id, self.partial, self.rounds = batch_id, partial, rounds
        self.model_version, self.fill_seconds = model_version, fill_seconds
        self._groups: list[Group] | None = list(groups) if isinstance(groups, (list, tuple)) else None
        self._rows = None if self._groups is not None else groups
        self._sealed: bytes | None = None

    @property
    def groups(self) -> list[Group]:
        if self._groups is None:
            self._groups = self._rows.groups()
        return self._groups

    @groups.setter
    def groups(self, groups: list[Group]) -> None:
        self._groups, self._rows = list(groups), None

    def __repr__(self) -> str:
        size = len(self._groups) if self._groups is not None else len(self._rows)
        return (f"Batch(batch_id={self.batch_id}, groups=<{size} groups>, partial={self.partial}, "
                f"rounds={self.rounds}, model_version={self.model_version}, fill_seconds={self.fill_seconds})")

    @property
    def num_padding(self) -> int:
        return sum(self._rows.padding) if self._groups is None else sum(g.padding for g in self._groups)

    def columns(self, *names: str) -> list[np.ndarray]:
        """Columns over the batch's groups, in order: a member column (``rewards``, ``values``,
        ``valid``, ``versions``) as (G, n), or ``padding`` as (G,) bool."""
        out = []
        for name in names:
            if self._groups is None:
                col = self._rows.padding if name == "padding" else getattr(self._rows, name)
            else:
                col = [getattr(g, name) for g in self._groups]
            if name == "padding":
                col = np.asarray(col, dtype=bool)
            elif isinstance(col, list):
                col = np.stack(col) if col else np.empty((0, 0), dtype=bool if name == "valid" else np.float64)
            out.append(col)
        return out

    def packed(self) -> tuple:
        """The groups as :func:`pack_groups` packs them (from the rows, when they were never made)."""
        return self._rows.pack() if self._groups is None else pack_groups(self._groups)

    def seal(self) -> None:
        """Pickle the groups once, now, for every later pickling of this batch (the actor's
        state file, its retry record and the Ray reply each reuse the bytes). Call it when the
        batch is final: a change to its groups after it is not pickled."""
        self._sealed = pickle.dumps(self.packed(), protocol=pickle.HIGHEST_PROTOCOL)

    def __reduce__(self) -> tuple:
        # the groups as columns (pack_groups): a batch of 256 groups pickles several times faster
        groups = self._sealed if self._sealed is not None else self.packed()
        return _unpickle_batch, (self.batch_id, groups, self.partial, self.rounds, self.model_version, self.fill_seconds)


def _unpickle_batch(batch_id: int, groups: tuple | bytes, *rest: Any) -> Batch:
    """:meth:`Batch.__reduce__` undone (``groups``: the packed groups, or their pickle when sealed)."""
    return Batch(batch_id, unpack_groups(pickle.loads(groups) if isinstance(groups, bytes) else groups), *rest)


class UnknownTaskError(KeyError, ValueError):
    """A task id is not in the task set (a ``KeyError`` and a ``ValueError``)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class InvalidTaskError(ValueError):
    """A task cannot be scored (unknown answer format, duplicate id, empty prompt)."""


@dataclass
class Task:
    """One prompt (or environment instance) with what is needed to score a response.

    Attributes:
        task_id: stable, unique id within its task set.
        prompt: the chat messages (``[{"role": ..., "content": ...}]``) sent to the model.
        answer: the reference answer.
        kind: the family the task comes from (e.g. ``parity``, ``champ``), used for scoring.
        meta: anything else the scorer needs. Single-turn tasks built here carry
            ``format`` (one of :data:`ANSWER_FORMATS`) and ``source`` (e.g.
            ``"reasoning_gym:syllogism"``, ``"champ:P_Combinatorics_17"``, ``"generated"``);
            reasoning-gym tasks also ``rg_dataset`` and ``rg_entry`` (the generator's entry,
            passed to its scorer).
    """

    task_id: str
    prompt: list[dict[str, str]]
    answer: str
    kind: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def answer_format(self) -> str:
        """``meta["format"]``, or ``""`` when the task has none."""
        return str(self.meta.get("format", ""))


class TaskSetLike(Protocol):
    """What the orchestrator needs of a task set: stable ids and a lookup.

    ``get`` raises :class:`UnknownTaskError` for an id outside the set.
    """

    task_ids: list[str]

    def get(self, task_id: str) -> Task: ...
