"""The payloads of the groups the orchestrator holds for the Trinity operator: in memory, and in ``held_dir``.

The actor holds a carried-over group as columns (rewards, runs, versions) and a ``ref``; the
group's Trinity experiences (tokens, log-probs, masks, infos) stay with the operator that
submitted it. :class:`HeldPayloads` keeps them by ``ref``:

* in memory, for the groups this process submitted (the step's complete groups are staged
  before the submit; after the actor's reply only those it holds are kept);
* in ``held_dir``, so that the next explorer process can release them: after each submit, the
  groups the actor *holds* from that step (never the ones it dropped or released) are written
  as **one file per explore step** (``<session>-<seq>.held``), each tensor field of all their
  experiences concatenated into one buffer (no per-experience serialisation with Trinity's
  ``Experience.serialize_many``; see bench/README.md, "Held payloads"), in a worker thread off the
  step's critical path. A file is deleted once none of its groups is held.

Crash consistency (see ``docs/guide/held-payloads.md``): the actor commits a submit (SQLite) before
the payloads of the groups it holds are on disk. A kill of the explorer in between leaves the
actor holding groups without a payload; the next operator finds them at its attach
(:meth:`HeldPayloads.recover`, before it submits anything) and has the actor drop them as
``lost`` (counted, logged), so a batch never names a group whose experiences are gone. Files
whose groups are no longer held (released or dropped before the explorer died) are deleted
then too.

File format (written and read only here): two pickles, the refs of the file's groups (read
alone at recovery), then ``{"sizes", "meta", "tensors"}``: group sizes in experiences; per
experience its ``__dict__`` without the tensor fields; per tensor field, the experiences that
have it, their shapes, its dtype and the concatenated bytes. Files of the earlier format (one
``<quoted ref>.bin`` per group, Trinity's ``serialize_many``) are still read.
"""

from __future__ import annotations

import logging
import operator
import os
import pickle
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import torch
from trinity.common.experience import EID
from trinity.common.experience import Experience as TrinityExperience

log = logging.getLogger("trinity_dso.trinity")

SUFFIX = ".held"
LEGACY_SUFFIX = ".bin"  # one group per file, Trinity's serialize_many (written by earlier versions)
TENSORS = TrinityExperience._TENSOR_FIELDS
"""Trinity's tensor fields of an experience, each packed as one buffer per file."""


class HeldPayloadLostError(KeyError):
    """A released group's experiences are neither in memory nor in ``held_dir``."""


_NONES = dict.fromkeys(TENSORS)
_DTYPE = operator.attrgetter("dtype")


def _flat(ts: list[torch.Tensor]) -> tuple[list, str, np.ndarray]:
    """One tensor field of several experiences (one dtype): their shapes, the dtype's name and
    their elements concatenated, as bytes (a 1-D field, the usual case, in one C-level ``cat``)."""
    if all(t.dim() == 1 for t in ts):
        shapes = list(map(len, ts))
    else:
        shapes = [tuple(t.shape) for t in ts]
        ts = [t.reshape(-1) for t in ts]
    with torch.no_grad():
        flat = (torch.cat(ts) if len(ts) > 1 else ts[0].clone()).cpu()  # tensors on several devices: torch refuses
    return shapes, str(flat.dtype).removeprefix("torch."), flat.contiguous().view(torch.uint8).numpy()


_SCALARS = (str, int, float, bool)


def _columns(exps: list[TrinityExperience]) -> dict:
    """The non-tensor attributes of ``exps`` by name: one list per attribute that varies, one
    value for an attribute every experience has equal and immutable (None, a string, a number),
    ``eid`` as tuples; one pass per attribute, so a batch costs what its few varying fields cost
    (not a dict of 25 keys pickled per experience; see bench/README.md, "Held payloads")."""
    dicts = [e.__dict__ for e in exps]
    names = [k for k in dicts[0] if k not in _NONES]
    if any(d.keys() != dicts[0].keys() for d in dicts):  # attributes that differ between experiences
        return {"rows": [{k: v for k, v in d.items() if k not in _NONES} for d in dicts]}
    varying, same = {}, {}
    for name in names:
        col = [d[name] for d in dicts]
        first = col[0]
        if (first is None or type(first) in _SCALARS) and col.count(first) == len(col):
            same[name] = first
        elif name == "eid" and all(type(x) is EID for x in col):
            varying[name] = [(x.batch, x.task, x.run, x.step, x.suffix) for x in col]
        else:
            varying[name] = col
    return {"same": same, "varying": varying}


def pack(groups: list[list[TrinityExperience]]) -> dict:
    """The experiences of ``groups`` as a few columns and buffers (see the module docstring)."""
    exps = [e for g in groups for e in g]
    tensors = {}
    for name in TENSORS:
        values = [getattr(e, name, None) for e in exps]
        have = [i for i, t in enumerate(values) if t is not None]
        if not have:
            continue
        ts = [values[i] for i in have]
        if len(set(map(_DTYPE, ts))) > 1:  # mixed dtypes in one field: each tensor as it is (pickled by torch)
            tensors[name] = (have, None, None, [t.detach().cpu() for t in ts])
            continue
        tensors[name] = (have, *_flat(ts))
    return {"sizes": [len(g) for g in groups], "columns": _columns(exps) if exps else {"rows": []}, "tensors": tensors}


def unpack(data: dict) -> list[list[TrinityExperience]]:
    """The groups :func:`pack` packed: experiences with the same attributes and tensors (each its own storage)."""
    n = sum(data["sizes"])
    new = TrinityExperience.__new__
    exps = [new(TrinityExperience) for _ in range(n)]
    cols = data["columns"]
    for i, e in enumerate(exps):
        d = e.__dict__
        d.update(_NONES)
        if "rows" in cols:
            d.update(cols["rows"][i])
    if "rows" not in cols:
        for name, value in cols["same"].items():
            for e in exps:
                e.__dict__[name] = value
        for name, col in cols["varying"].items():
            if name == "eid" and col and type(col[0]) is tuple:
                col = [EID(*x) for x in col]
            for e, value in zip(exps, col):
                e.__dict__[name] = value
    for name, (have, shapes, dtype, buf) in data["tensors"].items():
        if shapes is None:
            ts = buf
        else:
            flat = torch.from_numpy(np.array(buf, dtype=np.uint8)).view(getattr(torch, dtype))
            if shapes and isinstance(shapes[0], int):
                ts = [t.clone() for t in torch.split(flat, shapes)]
            else:
                sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
                ts = [t.reshape(s).clone() for t, s in zip(torch.split(flat, sizes), shapes)]
        for i, t in zip(have, ts):
            setattr(exps[i], name, t)
    out, at = [], 0
    for n in data["sizes"]:
        out.append(exps[at:at + n])
        at += n
    return out


def write_file(path: Path, refs: list[str], groups: list[list[TrinityExperience]]) -> None:
    """Write one step's held groups to ``path`` atomically (a temporary file, fsync, rename, fsync of the folder)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(refs, f, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.dump(pack(groups), f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_refs(path: Path) -> list[str]:
    """The refs of the groups in a step file (its first pickle only); for a legacy file, its one ref."""
    if path.suffix == LEGACY_SUFFIX:
        return [unquote(path.stem)]
    with open(path, "rb") as f:
        return list(pickle.load(f))


def read_file(path: Path) -> dict[str, list[TrinityExperience]]:
    """Every group of a step file (or of a legacy one-group file), by ref."""
    if path.suffix == LEGACY_SUFFIX:
        return {unquote(path.stem): TrinityExperience.deserialize_many(path.read_bytes())}
    with open(path, "rb") as f:
        refs = pickle.load(f)
        groups = unpack(pickle.load(f))
    return dict(zip(refs, groups))


class HeldPayloads:
    """The experiences of held groups by ``ref`` (see the module docstring).

    Args:
        held_dir: the folder (None: memory only; then nothing survives the explorer).
        session: this process's session id (names its files).
    """

    def __init__(self, held_dir: Path | None, session: str) -> None:
        self.dir = held_dir
        self.session = session
        self.memory: dict[str, list[TrinityExperience]] = {}  # ref -> its experiences (by run, step)
        self._file_of: dict[str, Path] = {}  # ref -> the file it is in
        self._live: dict[Path, set[str]] = {}  # file -> its refs still held
        self._seq = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dso-held") if held_dir is not None else None
        self._pending: Future | None = None
        self.last_write_s = 0.0

    def __len__(self) -> int:
        return len(set(self.memory) | set(self._file_of))

    # ---------------------------------------------------------------- a process's start
    def recover(self, held: Iterable[str]) -> list[str]:
        """At attach, before the first submit: index the files of earlier processes by the
        actor's held refs, delete the files (and unfinished temporaries) none of whose groups is
        held, and return the held refs that have no payload (to be dropped as lost)."""
        held = set(held)
        if self.dir is not None and self.dir.is_dir():
            for path in sorted(self.dir.iterdir()):
                if path.name.endswith(".tmp"):
                    path.unlink(missing_ok=True)  # a write cut off by the kill: its groups were never on disk
                    continue
                if path.suffix not in (SUFFIX, LEGACY_SUFFIX):
                    continue
                try:
                    refs = read_refs(path)
                except (OSError, EOFError, pickle.UnpicklingError) as err:
                    log.warning("held_dir: unreadable file %s (%s): its groups count as lost", path, err)
                    continue
                live = {r for r in refs if r in held}
                if not live:
                    path.unlink(missing_ok=True)
                    continue
                self._live[path] = live
                for r in live:
                    self._file_of[r] = path
        return sorted(r for r in held if r not in self.memory and r not in self._file_of)

    # ---------------------------------------------------------------- each step
    def stage(self, payload: dict[str, list[TrinityExperience]]) -> None:
        """The step's complete groups, in memory, before the submit (released ones are taken from here)."""
        self.memory.update(payload)

    def settle(self, held: Iterable[str]) -> None:
        """After the step's calls, given the refs the actor holds: free the others, in memory and
        on disk, and write the held groups not yet on disk (the step's newly held ones; one file,
        in the worker thread)."""
        held = set(held)
        for ref in [r for r in self.memory if r not in held]:
            self.forget(ref)
        for ref in [r for r in self._file_of if r not in held]:
            self.forget(ref)
        new = [r for r in self.memory if r not in self._file_of]
        if new and self.dir is not None:
            self.wait()  # the previous step's write (it ran during this step's submit): on disk, or its error raised
            self._seq += 1
            path = self.dir / f"{self.session}-{self._seq:06d}{SUFFIX}"
            self._live[path] = set(new)
            for r in new:
                self._file_of[r] = path
            groups = [self.memory[r] for r in new]
            self._pending = self._pool.submit(self._write, path, new, groups)

    def _write(self, path: Path, refs: list[str], groups: list) -> None:
        t0 = time.perf_counter()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, refs, groups)
        self.last_write_s = time.perf_counter() - t0

    def wait(self) -> None:
        """Until the last write is on disk; raises its error (e.g. ``OSError``) if it failed."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def close(self) -> None:
        """Until every write and deletion queued is done (the worker thread stays, idle)."""
        self.wait()
        if self._pool is not None:
            self._pool.submit(int).result()

    # ---------------------------------------------------------------- releases
    def take(self, ref: str) -> list[TrinityExperience]:
        """A released group's experiences, freed here. Raises :class:`HeldPayloadLostError` when
        there are none.

        Groups read from an earlier process's file get ``@<its session>`` appended to their
        ``eid.batch``, so that they never share an ``eid.tid`` (the GRPO grouping key) with a
        group of this process, which numbers its explore steps from its checkpoint again. The
        file's other held groups are kept in memory until released."""
        steps = self.memory.pop(ref, None)
        path = self._file_of.get(ref)
        if steps is None and path is not None:
            self.wait()
            for r, g in read_file(path).items():
                session = r.split(":", 1)[0]
                for s in g:
                    s.eid.batch = f"{s.eid.batch}@{session}"
                if r == ref:
                    steps = g
                elif self._file_of.get(r) == path:
                    self.memory.setdefault(r, g)
        self._drop_file_ref(ref)
        if steps is None:
            raise HeldPayloadLostError(ref)
        return steps

    def forget(self, ref: str) -> None:
        """Free a group the actor no longer holds (dropped, or released elsewhere)."""
        self.memory.pop(ref, None)
        self._drop_file_ref(ref)

    def _drop_file_ref(self, ref: str) -> None:
        path = self._file_of.pop(ref, None)
        if path is None:
            return
        live = self._live.get(path)
        if live is not None:
            live.discard(ref)
            if not live:
                del self._live[path]
                if self._pool is not None:  # after any write of it, in order
                    self._pool.submit(path.unlink, missing_ok=True)
                else:
                    path.unlink(missing_ok=True)
