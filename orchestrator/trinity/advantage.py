"""Advantage functions for Trinity, vectorised over the batch: ``dso_grpo`` (the DAPO bundle's
group-relative advantages), ``dso_gigpo`` (in process) and ``dso_gigpo_index`` (through the
orchestrator's anchor index).

Each reads the fields it needs off the experiences once, into arrays; computes on the arrays;
and writes the token advantages back with :func:`write_token_advantages` (a constant number of
tensor operations for the whole batch, not one multiply and one copy per experience).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import itertools
import logging
import operator
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
from trinity.algorithm.advantage_fn import AdvantageFn
from trinity.buffer.operators import ExperienceOperator, ExperienceOperatorV1
from trinity.common.experience import Experience as TrinityExperience

from algos.dapo import InvalidGroupError
from algos.gigpo import (
    GiGPOAdvantages,
    GiGPOConfig,
    InvalidStepError,
    discounted_returns,
    encode_keys,
    gigpo_advantages,
    gigpo_advantages_coded,
)
from orchestrator.anchors.index import AnchorIndex, trajectory_records
from orchestrator.anchors.owner import orchestrator_anchor_index
from orchestrator.anchors.redis_index import RedisAnchorIndex
from orchestrator.anchors.remote import RemoteAnchorIndex
from orchestrator.service.actor import DEFAULT_NAME
from orchestrator.trinity.attach import OrchestratorNotFoundError, find_orchestrator
from orchestrator.trinity.fields import BATCH, EID, INFO, MASKED, NO_INFO, TASK, first_appearance_codes, tid_codes

log = logging.getLogger("trinity_dso.trinity")



# ---------------------------------------------------------------------------------- token write-back
def write_token_advantages(exps: list[TrinityExperience], scalars: Any, *, order: tuple[list, np.ndarray] | None = None) -> None:
    """Set ``advantages = A * action_mask`` and ``returns`` (an equal copy) on every experience.

    The result is bit for bit the per-experience ``action_mask.to(float32) * A`` then
    ``.clone()`` of Trinity's ``gigpo`` / ``grpo`` write-back (``GiGPOAdvantageFn._apply_mask``:
    A rounded to float32, a 0 mask entry gives a signed zero), done for the whole batch as one
    concatenation of the masks (one ``torch.stack`` into (N, T) when they have equal lengths,
    else one ``torch.cat``), one multiply (a broadcast over the rows, else with the scalars
    repeated over the tokens) and one copy. The two arrays are then split into per-experience
    views (their rows, or slices at the mask boundaries), each wrapped without copying by
    ``torch.from_numpy`` and assigned with ``setattr`` in C-level ``map`` passes. The views do
    not overlap, and each is its own storage for torch (pickling or serialising one experience writes only its own tokens;
    Trinity's ``Experience.serialize_many`` sees distinct storages and clones nothing). An
    experience without ``action_mask`` gets a 0-dim ``tensor(A, float32)``, as in Trinity. The
    experiences are visited in memory order (:func:`_address_order`), which only changes which
    rows of the arrays back which experience.

    Args:
        exps: N experiences; ``action_mask`` (T_i,) bool / int / float on the CPU, or None.
        scalars: (N,) float, one advantage per experience, in the order of ``exps``.
        order: ``_address_order(exps)`` when the caller already has it (read the rows with it).
    Raises:
        ValueError: ``scalars`` is not one value per experience.
    """
    a = np.asarray(scalars, dtype=np.float32).reshape(-1)
    if a.shape[0] != len(exps):
        raise ValueError(f"scalars: {a.shape[0]} values for {len(exps)} experiences")
    if not exps:
        return
    exps, pos = order if order is not None else _address_order(exps)  # memory order: each pass walks the heap forward
    masks = list(map(_ACTION_MASK, exps))
    a = a[pos]
    if any(map(operator.is_, masks, itertools.repeat(None))):
        with_mask = [k for k, m in enumerate(masks) if m is not None]
        for k in sorted(set(range(len(exps))) - set(with_mask)):
            exps[k].advantages = torch.tensor(float(a[k]), dtype=torch.float32)
            exps[k].returns = exps[k].advantages.clone()
        exps = [exps[k] for k in with_mask]
        masks = [masks[k] for k in with_mask]
        a = a[with_mask]
        if not exps:
            return
    try:  # equal lengths (the usual case): one (N, T) stack, and the rows are the views
        flat = torch.stack(masks)
    except RuntimeError:  # ragged masks: one flat concatenation, sliced at the mask boundaries
        flat = None
    if flat is not None and flat.ndim == 2 and flat.shape[1] > 0:
        adv = flat.to(torch.float32).numpy() * a[:, None]
        ret = adv.copy()
        adv_parts, ret_parts = map(torch.from_numpy, adv), map(torch.from_numpy, ret)
    else:
        lengths = np.fromiter(map(torch.Tensor.numel, masks), dtype=np.int64, count=len(masks))
        adv = torch.cat(masks).reshape(-1).to(torch.float32).numpy() * np.repeat(a, lengths)
        ret = adv.copy()
        ends = np.cumsum(lengths)
        cuts = list(map(slice, (ends - lengths).tolist(), ends.tolist()))
        adv_parts = map(torch.from_numpy, map(adv.__getitem__, cuts))
        ret_parts = map(torch.from_numpy, map(ret.__getitem__, cuts))
    with _gc_paused():  # 2N new tensors, no reference cycles: no collection is due for them
        _consume(map(setattr, exps, itertools.repeat("advantages"), adv_parts))
        _consume(map(setattr, exps, itertools.repeat("returns"), ret_parts))


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while a batch allocates its many acyclic objects
    (each allocation would otherwise count towards a collection that scans the whole heap;
    measured: a first write-back of 25,600 experiences spent 0.3 s of 0.43 s in collections;
    ``dso_gigpo`` paused over its reading and maths too: 116 ms -> 80 ms per 25,600 steps);
    restored on exit, also when it was already disabled by the caller. The collections that
    fall due run after it, at the next allocation."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


_consume = collections.deque(maxlen=0).extend
"""Run an iterator to its end in C (``deque(maxlen=0).extend``), keeping nothing."""


_ACTION_MASK = operator.attrgetter("action_mask")


def _masked_rows(exps: list[TrinityExperience], order: tuple[list, np.ndarray] | None = None) -> np.ndarray | None:
    """(N,) bool in the order of ``exps``: the experience is of a member the orchestrator masked
    (``info["dso_masked"]``, zero loss weight); None when none is. One C-level pass over the
    infos, in memory order when ``order`` (:func:`_address_order`) is given (a shuffled batch of
    25,600 steps: 11 ms in list order)."""
    xs = exps if order is None else order[0]
    infos = list(map(INFO, xs))
    if not all(infos):  # None or {}: read as an empty info
        infos = [i or NO_INFO for i in infos]
    if not any(map(operator.contains, infos, itertools.repeat(MASKED))):
        return None
    masked = np.fromiter(map(bool, map(operator.methodcaller("get", MASKED), infos)), dtype=bool, count=len(xs))
    if order is None:
        return masked
    out = np.empty_like(masked)
    out[order[1]] = masked  # xs[k] is exps[pos[k]]
    return out


def _address_order(exps: list) -> tuple[list, np.ndarray]:
    """The experiences sorted by address (``id``), and ``pos``: ``sorted[k] is exps[pos[k]]``.

    A batch is usually a shuffle of objects allocated one after the other; reading a field off
    each in list order then misses the cache on almost every object, while in address order the
    hardware prefetcher follows (measured: the field passes of a 25,600-step batch 2.5x faster).
    Costs one ``id`` pass and one integer argsort.
    """
    addr = np.fromiter(map(id, exps), dtype=np.uint64, count=len(exps))
    pos = np.argsort(addr)  # distinct objects have distinct addresses: no ties to order
    return list(map(exps.__getitem__, pos.tolist())), pos


def _inverse(pos: np.ndarray) -> np.ndarray:
    """The inverse permutation: ``_inverse(pos)[pos] == arange(N)``."""
    back = np.empty_like(pos)
    back[pos] = np.arange(pos.size)
    return back


def _relabel_by_first_row(codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes in [0, k) renumbered in order of first appearance along the rows; also the old
    code of each new label (no sort of the rows: a first-row table over the k codes)."""
    first = np.full(k, codes.size, dtype=np.int64)
    first[codes[::-1]] = np.arange(codes.size)[::-1]  # the last write of a code is its first row
    old_of_new = np.argsort(first, kind="stable")
    new_of_old = np.empty(k, dtype=np.int64)
    new_of_old[old_of_new] = np.arange(k)
    return new_of_old[codes], old_of_new


def _group_codes(exps: list[TrinityExperience]) -> np.ndarray:
    """(N,) int64: each experience's group, Trinity's ``eid.tid`` (explore step, task), numbered
    in order of first appearance (Trinity's ``group_by`` order)."""
    eids = list(map(EID, exps))
    return tid_codes(list(map(BATCH, eids)), list(map(TASK, eids)))[0]


# ---------------------------------------------------------------------------------- GRPO
class DsoGRPOAdvantageFn(AdvantageFn, ExperienceOperator):
    """``dso_grpo``: GRPO group-relative advantages, the baseline DAPO keeps (arXiv 2402.03300
    Sec. 4.1.2; arXiv 2503.14476 Eq. 9), vectorised over the batch.

    ``A_i = (r_i - mean_g) / (std_g + epsilon)`` over the experiences of one group (``eid.tid``:
    the n rollouts of one task from one explore step), std unbiased, broadcast over
    ``action_mask`` into ``advantages`` and ``returns`` (float32). This is Trinity 0.6's
    ``grpo`` (``GRPOGroupedAdvantage`` with its defaults): float32 rewards, float32 mean and
    std, the same float32 arithmetic after them, a singleton group with mean 0 and std 1
    (Trinity's convention; :func:`algos.dapo.group_advantages` gives it 0), the experiences
    returned grouped, groups in order of first appearance (Trinity's ``group_by`` order), and
    the same metrics.

    Where it differs from Trinity's ``grpo``:

    * the group mean and std are computed exactly (float64 segment sums over the float32
      rewards, two-pass std) and then rounded to float32; Trinity sums in float32 in torch's
      reduction order. The two agree bit for bit when the float32 sums are exact (DAPO's
      +-1 / 0 rewards) and otherwise to float32 rounding (a few 1e-7 relative). Where the
      difference shows: a group of equal non-dyadic rewards (e.g. all 0.7) gets exactly 0
      here, while Trinity's float32 mean can miss 0.7 by one ulp and, divided by ``epsilon``,
      gives each member a spurious advantage of about 0.06;
    * a NaN, infinite or missing reward raises instead of spreading NaN through its group;
    * a member the orchestrator masked (``info["dso_masked"]``, set by
      :class:`~orchestrator.trinity.operator.OrchestratorOperator`: a missing or NaN reward
      under ``group_validity="mask"``, or a stale member) is left out of its group's mean and
      std (its reward may be missing) and gets advantage 0, as in
      :func:`algos.dapo.group_advantages` with ``valid``; the other members are normalised over
      the usable ones (one usable member: Trinity's singleton convention). Trinity's ``grpo``
      counts every member (and fails on a missing reward);
    * ``std_threshold``, ``rank_penalty``, ``std_cal_level="batch"`` and
      ``duplicate_experiences`` are not offered (use ``grpo``).

    Args:
        epsilon: added to the std, > 0 (Trinity's and verl's 1e-6).
    Raises:
        ValueError: ``epsilon <= 0``, or one of the options above set to a non-default value.
        algos.dapo.InvalidGroupError: at call time, a missing or non-finite reward (names the
            row and the group).
    """

    _UNSUPPORTED = {"std_threshold": None, "duplicate_experiences": False, "rank_penalty": None, "std_cal_level": "group"}

    def __init__(self, epsilon: float = 1e-6, **kwargs: Any) -> None:
        if not float(epsilon) > 0:
            raise ValueError(f"epsilon: must be > 0, got {epsilon!r}")
        for key, default in self._UNSUPPORTED.items():
            if kwargs.get(key, default) != default:
                raise ValueError(f"{key}: {kwargs[key]!r} is not supported by dso_grpo (only {default!r}); use Trinity's grpo")
        self.epsilon = float(epsilon)

    @classmethod
    def default_args(cls) -> dict:
        return {"epsilon": 1e-6}

    @classmethod
    def compute_in_trainer(cls) -> bool:
        return False

    def __call__(self, exps, **kwargs):
        return self.process(exps)

    def compute(self, exps: list[TrinityExperience]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Group codes and advantages of a batch, no side effects.

        Returns:
            codes: (N,) int64 group of each experience (first-appearance order);
            advantages: (N,) float32 in the batch's order (0 for a masked member);
            mean, std: (G,) float32 per group over its usable members (0 and 1 for a singleton).
        Raises:
            algos.dapo.InvalidGroupError: a missing or non-finite reward of a member not masked.
        """
        codes = _group_codes(exps)
        rewards = [e.reward for e in exps]
        r64 = np.array([np.nan if x is None else x for x in rewards] if None in rewards else rewards, dtype=np.float64)
        masked = _masked_rows(exps)
        if masked is not None:
            r64[masked] = 0.0  # out of every statistic below
        bad = ~np.isfinite(r64)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InvalidGroupError(f"reward: {rewards[i]!r} at row {i} (group {exps[i].eid.tid!r}) is not a finite number")
        r32 = r64.astype(np.float32)
        x = r32.astype(np.float64)
        used = None if masked is None else (~masked).astype(np.float64)
        sizes = np.bincount(codes, weights=used)
        mean = np.bincount(codes, weights=x) / np.maximum(sizes, 1.0)  # exact for float32 inputs (< 2**29 per group)
        d = x - mean[codes]
        if used is not None:
            d *= used
        std = np.sqrt(np.bincount(codes, weights=d * d) / np.maximum(sizes - 1.0, 1.0))
        solo = sizes <= 1
        mean32 = np.where(solo, 0.0, mean).astype(np.float32)
        std32 = np.where(solo, 1.0, std).astype(np.float32)
        adv = (r32 - mean32[codes]) / (std32[codes] + np.float32(self.epsilon))
        if masked is not None:
            adv[masked] = 0.0
        return codes, adv, mean32, std32

    def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """Set ``advantages`` / ``returns`` ((T,) float32) on each experience.

        Returns:
            the experiences grouped (see the class docstring), and Trinity's ``grpo`` metrics:
            ``group_advantages/reward_mean/{mean,max,min}``,
            ``group_advantages/reward_std/{mean,max,min}`` (over groups) and
            ``filtered_count`` (0).
        """
        if not exps:
            return [], {}
        with _gc_paused():  # no cycles allocated: no collection mid-batch
            codes, adv, mean, std = self.compute(exps)
            order = np.argsort(codes, kind="stable")
            out = [exps[i] for i in order.tolist()]
            write_token_advantages(out, adv[order])
        metrics: dict[str, float] = {}
        for name, values in (("reward_mean", mean), ("reward_std", std)):
            v = values.astype(np.float64)
            for stat, fn in (("mean", np.mean), ("max", np.max), ("min", np.min)):
                metrics[f"group_advantages/{name}/{stat}"] = fn(v).item()
        metrics["filtered_count"] = 0
        return out, metrics


# ---------------------------------------------------------------------------------- GiGPO rows
@dataclass
class StepRows:
    """The per-step rows of a batch of Trinity experiences, each (N,) in the batch's order.

    Attributes:
        group: int64, Trinity's ``eid.tid`` (explore step, task), first-appearance order.
        run: int64, ``eid.run``.
        step: int64, ``eid.step``.
        reward: float64, ``info[step_reward_key]``; a trajectory with none takes its last
            step's ``reward`` (0 when None) as a terminal reward, its other steps 0.
        state: int64 anchor state: equal codes for equal ``info[env_state_hash_key]`` (str, or
            bytes taken as their hex text); a step without a hash gets a code of its own.
        hashed: bool, the step has an ``env_state_hash``.
        invalid: bool, ``info[action_valid_key] is False``.
        text: object, ``info[state_text_key]`` (None where absent); None when not read.
        traj: int64 in [0, num_traj), the trajectory (group, run).
        state_names: the hash text of each code below ``len(state_names)`` (hashed states).
        group_keys: the ``(eid.batch, eid.task)`` of each group code.
    """

    group: np.ndarray
    run: np.ndarray
    step: np.ndarray
    reward: np.ndarray
    state: np.ndarray
    hashed: np.ndarray
    invalid: np.ndarray
    text: np.ndarray | None
    traj: np.ndarray
    state_names: list[str]
    group_keys: list[tuple[Any, Any]]

    def state_keys(self, solo: str = "\x00solo/{row}") -> np.ndarray:
        """(N,) object: each row's hash text, or ``solo`` formatted with its ``row`` when it has none."""
        names = np.empty(int(self.state.max()) + 1, dtype=object)
        names[: len(self.state_names)] = self.state_names
        rows = np.flatnonzero(~self.hashed)
        names[self.state[rows]] = [solo.format(row=i) for i in rows.tolist()]
        return names[self.state]

    def group_names(self) -> list[str]:
        """Trinity's ``eid.tid`` text (``"<batch>/<task>"``) of each group code."""
        return [f"{b}/{t}" for b, t in self.group_keys]

    @classmethod
    def read(
        cls,
        exps: list[TrinityExperience],
        step_reward_key: str,
        env_state_hash_key: str,
        action_valid_key: str = "is_action_valid",
        state_text_key: str = "env_state_text",
        *,
        texts: bool = True,
        order: tuple[list, np.ndarray] | None = None,
    ) -> StepRows:
        """Read the rows off ``exps``: one C-level pass per field (``map`` over attribute and
        item getters) over the experiences in memory order (:func:`_address_order`), keys
        factorised to integer codes through dicts, no per-row objects; the columns are then put
        back in the batch's order and the groups numbered by first appearance in it.

        Args:
            texts: also read ``info[state_text_key]`` (only similarity grouping needs it).
            order: ``_address_order(exps)`` when the caller already has it (to share it with
                :func:`write_token_advantages`).
        Raises:
            algos.gigpo.InvalidStepError: a state hash that is empty, or neither str nor bytes,
                or a step reward that is not a number (names row, group, run, step).
        """
        n = len(exps)
        xs, pos = order if order is not None else _address_order(exps)  # passes in memory order; columns put back below
        back = _inverse(pos)  # batch row i is xs[back[i]]
        eids = list(map(EID, xs))
        infos = list(map(INFO, xs))
        if not all(infos):  # None or {}: read as an empty info
            infos = [i or NO_INFO for i in infos]
        batches, tasks, runs, steps = (list(map(get, eids)) for get in _EID_FIELDS)
        code, uniq = tid_codes(batches, tasks)
        group, old_of_new = _relabel_by_first_row(code[back], len(uniq))  # Trinity's group_by order
        group_keys = [uniq[k] for k in old_of_new.tolist()]
        run = np.array(runs, dtype=np.int64)[back]
        step = np.array(steps, dtype=np.int64)[back]

        def where(i: int) -> str:
            return f"row {i} (group {exps[i].eid.tid!r}, run {int(run[i])}, step {int(step[i])})"

        values, explicit = _info_column(infos, step_reward_key, 0.0)
        try:
            reward = np.fromiter(values, dtype=np.float64, count=n)[back]
        except (TypeError, ValueError):
            k = next(k for k, x in enumerate(values) if not _is_number(x))
            raise InvalidStepError(f"info[{step_reward_key!r}]: {values[k]!r} at {where(int(pos[k]))} is not a number") from None
        if explicit is not None:
            explicit = explicit[back]
        traj, num_traj = encode_keys(group, run)
        if explicit is not None:  # some steps have no step reward
            has_explicit = np.bincount(traj, weights=explicit, minlength=num_traj) > 0
            last = np.full(num_traj, -1, dtype=np.int64)
            np.maximum.at(last, traj, step)
            terminal = np.flatnonzero(~has_explicit[traj] & (step == last[traj]))
            if terminal.size:
                reward[terminal] = [0.0 if (x := exps[i].reward) is None else float(x) for i in terminal.tolist()]
        hashes, _ = _info_column(infos, env_state_hash_key, None)
        try:
            raw, uniq = first_appearance_codes(hashes)
        except TypeError:  # an unhashable value (bytearray, list): make it hashable, refuse it below
            hashes = [
                bytes(h) if isinstance(h, bytearray) else h if h is None or isinstance(h, (str, bytes)) else ("unhashable", k)
                for k, h in enumerate(hashes)
            ]
            raw, uniq = first_appearance_codes(hashes)
        raw = raw[back]
        names: dict[str, int] = {}
        remap = np.empty(len(uniq), dtype=np.int64)
        for code, h in enumerate(uniq):
            if h is None:
                remap[code] = -1
                continue
            if isinstance(h, (bytes, bytearray)):
                h = bytes(h).hex()
            elif not isinstance(h, str) or h == "":
                i = int(np.flatnonzero(raw == code)[0])
                what = "empty" if h == "" else f"expected str or bytes, got {type(infos[back[i]].get(env_state_hash_key)).__name__}"
                raise InvalidStepError(
                    f"info[{env_state_hash_key!r}]: {what} at {where(i)}; hash structured observations with "
                    "orchestrator.anchors.keys.state_hash (never str())"
                )
            remap[code] = names.setdefault(h, len(names))
        state = remap[raw]
        hashed = state >= 0
        solo = np.flatnonzero(~hashed)
        state[solo] = len(names) + np.arange(solo.size)
        if any(map(operator.contains, infos, itertools.repeat(action_valid_key))):
            valid, _ = _info_column(infos, action_valid_key, None)
            invalid = np.fromiter(map(operator.is_, valid, itertools.repeat(False)), dtype=bool, count=n)[back]
        else:  # no step says anything about validity (the usual case)
            invalid = np.zeros(n, dtype=bool)
        text = None
        if texts:
            text = np.empty(n, dtype=object)
            text[:] = [infos[k].get(state_text_key) for k in back.tolist()]
        return cls(group, run, step, reward, state, hashed, invalid, text, traj, list(names), group_keys)


_EID_FIELDS = tuple(map(operator.attrgetter, ("batch", "task", "run", "step")))


def _info_column(infos: list[dict], key: str, default: Any) -> tuple[list, np.ndarray | None]:
    """``info[key]`` of every step in one C-level pass, and where the key is present.

    Returns:
        the (N,) values (``default`` where absent), and None when every info has the key,
        else (N,) bool: the key is present.
    """
    try:
        return list(map(operator.itemgetter(key), infos)), None
    except KeyError:  # some steps lack it: a second pass with the default
        present = np.fromiter(map(operator.contains, infos, itertools.repeat(key)), dtype=bool, count=len(infos))
        return list(map(operator.methodcaller("get", key, default), infos)), present


def _is_number(x: Any) -> bool:
    try:
        float(x)
    except (TypeError, ValueError):
        return False
    return True


# ---------------------------------------------------------------------------------- GiGPO
_PAPER = GiGPOConfig()

_GIGPO_ARGS: dict[str, Any] = {
    "omega": _PAPER.omega,
    "gamma": _PAPER.gamma,
    "fnorm": _PAPER.norm,
    "epsilon": _PAPER.eps,
    "std": _PAPER.std,
    "episode_weighting": _PAPER.episode_weighting,
    "singleton_episode": _PAPER.singleton_episode,
    "invalid_action_penalty": _PAPER.invalid_action_penalty,
    "penalty_timing": _PAPER.penalty_timing,
    "similarity_threshold": _PAPER.similarity_threshold,
    "similarity": _PAPER.similarity,
    "similarity_grouping": _PAPER.similarity_grouping,
    "step_reward_key": "step_reward",
    "env_state_hash_key": "env_state_hash",
    "action_valid_key": "is_action_valid",
    "state_text_key": "env_state_text",
}
"""``advantage_fn_args`` of ``dso_gigpo`` and their defaults (the paper's)."""


def refuse_unknown(kind: str, given: dict, valid: list[str]) -> None:
    """Raise ValueError naming unknown ``advantage_fn_args`` keys and listing the valid ones."""
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ValueError(f"{kind}: unknown argument(s) {unknown}; valid arguments: {sorted(valid)}")


class DsoGiGPOAdvantageFn(AdvantageFn, ExperienceOperator):
    """``dso_gigpo``: GiGPO advantages over one batch of Trinity experiences (arXiv 2505.10978).

    A thin adapter: it flattens the batch into per-step rows and calls
    :func:`algos.gigpo.gigpo_advantages` (see there for the equations). Rows are keyed so that

    * a *group* (GiGPO's "task" in Eq. 3) is Trinity's ``eid.tid`` (explore step and task):
      the n trajectories of one task from one round;
    * a trajectory is ``eid.rid``; its steps are ordered by ``eid.step`` (consecutive from 0);
    * the step reward is ``info[step_reward_key]``; a trajectory with none takes its last
      step's ``reward`` as a terminal reward (Trinity's convention), other steps 0;
    * the anchor state is ``info[env_state_hash_key]`` (str or bytes; anything else is refused,
      never ``str()``-ed: hash structured observations with
      :func:`orchestrator.anchors.keys.state_hash`); a step without one is its own anchor
      group (so A_S = 0 for it, as in Trinity);
    * an action is invalid when ``info[action_valid_key]`` is False (verl-agent's
      ``is_action_valid``); the state text for similarity grouping is ``info[state_text_key]``.

    The scalar ``A = A_E + omega * A_S`` is broadcast over ``action_mask`` into
    ``advantages`` and ``returns`` ((T,) float32).

    Where it differs from Trinity's built-in ``gigpo`` (``GiGPOAdvantageFn``):

    * anchor groups are keyed by (group, state) (Eq. 6 groups states *within a task's group*):
      two tasks whose observations render to the same text, e.g. two FrozenLake maps where the
      agent sees the same window, are kept apart; Trinity buckets states across the whole
      batch and would compare their returns;
    * a singleton episode group gets A_E = 0 (Trinity: ``R / (1 + epsilon)``);
    * statistics are float64 (Trinity: float32);
    * defaults are the paper's (gamma 0.95, F_norm = std); Trinity's are gamma 1, F_norm 1;
    * the steps of a trajectory the orchestrator masked (``info["dso_masked"]``: a missing or
      NaN reward under ``group_validity="mask"``, or a stale member) are left out of their
      episode group and of every anchor group (their step rewards may be missing) and get
      advantage 0; the others get exactly what the batch without them gives. Trinity's
      ``gigpo`` counts every trajectory (and fails on a missing reward).

    On a batch of one task with n > 1 trajectories and the same arguments the two agree up to
    float32 rounding.

    Args (every :class:`algos.gigpo.GiGPOConfig` field is reachable from the YAML's
    ``advantage_fn_args``; the options that restore verl-agent's behaviour are documented there):
        omega: weight of the step advantage, >= 0 (paper: 1).
        gamma: discount in [0, 1] (paper: 0.95).
        fnorm: ``"std"`` (paper, Eq. 3 and 7) or ``"none"`` (F_norm = 1).
        epsilon: added to the std, > 0.
        std: ``"sample"`` (ddof 1, verl-agent) or ``"population"`` (ddof 0).
        episode_weighting: ``"trajectory"`` (paper) or ``"step"`` (verl-agent's default).
        singleton_episode: ``"zero"`` or ``"raw"`` (verl-agent).
        invalid_action_penalty: >= 0, subtracted for each invalid action.
        penalty_timing: ``"before_returns"`` or ``"after_returns"`` (verl-agent).
        similarity_threshold: None (exact hashes) or in (0, 1]: group similar state texts.
        similarity: ``"ratio"`` or ``"jaccard"``.
        similarity_grouping: ``"components"`` or ``"greedy"`` (verl-agent).
        step_reward_key, env_state_hash_key, action_valid_key, state_text_key:
            ``Experience.info`` keys.
    Raises:
        ValueError: an unknown argument (the message lists the valid ones).
        pydantic.ValidationError: out-of-range arguments (via :class:`algos.gigpo.GiGPOConfig`).
        algos.gigpo.InvalidStepError: at call time, a non-finite reward, a duplicate or
            missing step of a trajectory (the message names the row, group and run).
    """

    def __init__(self, **kwargs: Any) -> None:
        refuse_unknown("dso_gigpo", kwargs, list(_GIGPO_ARGS))
        a = {**_GIGPO_ARGS, **kwargs}
        self.config = GiGPOConfig(
            omega=a["omega"], gamma=a["gamma"], norm=a["fnorm"], eps=a["epsilon"], std=a["std"],
            episode_weighting=a["episode_weighting"], singleton_episode=a["singleton_episode"],
            invalid_action_penalty=a["invalid_action_penalty"], penalty_timing=a["penalty_timing"],
            similarity_threshold=a["similarity_threshold"], similarity=a["similarity"],
            similarity_grouping=a["similarity_grouping"],
        )
        self.step_reward_key = str(a["step_reward_key"])
        self.env_state_hash_key = str(a["env_state_hash_key"])
        self.action_valid_key = str(a["action_valid_key"])
        self.state_text_key = str(a["state_text_key"])

    @classmethod
    def default_args(cls) -> dict:
        return dict(_GIGPO_ARGS)

    @classmethod
    def compute_in_trainer(cls) -> bool:
        return False

    def __call__(self, exps, **kwargs):
        return self.process(exps)

    def rows(self, exps: list[TrinityExperience], order: tuple[list, np.ndarray] | None = None) -> StepRows:
        """Per-step rows of a batch, one per experience, in the batch's order (one pass per field).

        A trajectory without any explicit step reward takes its last step's ``reward`` (0 when
        None) as a terminal reward, other steps 0 (Trinity's ``gigpo`` convention). State texts
        are read only when similarity grouping needs them.
        """
        return StepRows.read(
            exps, self.step_reward_key, self.env_state_hash_key, self.action_valid_key, self.state_text_key,
            texts=self.config.similarity_threshold is not None, order=order,
        )

    def compute(self, exps: list[TrinityExperience]) -> GiGPOAdvantages:
        """GiGPO advantages of a batch, (N,) arrays in the batch's order (no side effects)."""
        return self._compute(exps, self.rows(exps))

    def _compute(self, exps: list[TrinityExperience], r: StepRows) -> GiGPOAdvantages:
        if self.config.similarity_threshold is None:  # integer keys all the way (the usual case)
            return gigpo_advantages_coded(
                r.group, r.run, r.step, r.reward, r.state, config=self.config, invalid=r.invalid, group_names=r.group_names()
            )
        missing = [k for k, t in enumerate(r.text) if not isinstance(t, str)]
        if missing:
            k = missing[0]
            raise InvalidStepError(
                f"info[{self.state_text_key!r}]: similarity_threshold is set but row {k} (group {exps[k].eid.tid!r}) "
                "has no state text"
            )
        return gigpo_advantages(
            r.group, r.run, r.step, r.reward, r.state_keys(), config=self.config, invalid=r.invalid, state_texts=list(r.text)
        )

    def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """Set ``advantages`` and ``returns`` ((T,) float32, A times ``action_mask``) on each experience.

        Returns:
            the same experiences, and metrics ``dso_gigpo/mean_abs_A_E``,
            ``dso_gigpo/mean_abs_A_S``, ``dso_gigpo/anchor_groups_total`` (anchor groups of
            states with a hash), ``dso_gigpo/anchor_groups_size_gt1`` and
            ``dso_gigpo/anchor_group_hit_ratio`` (their share of size > 1).
        """
        if not exps:
            return [], {}
        with _gc_paused():  # reading, maths and write-back allocate no cycles: no collection mid-batch
            order = _address_order(exps)  # shared by the reading and the write-back
            masked = _masked_rows(exps, order)
            if masked is not None:  # computed without them; their steps get 0
                _, metrics = self.process(list(itertools.compress(exps, ~masked))) if not masked.all() else ([], {})
                write_token_advantages(list(itertools.compress(exps, masked)), np.zeros(int(masked.sum())))
                return exps, metrics
            r = self.rows(exps, order)
            res = self._compute(exps, r)
            write_token_advantages(exps, res.advantages, order=order)
        return exps, gigpo_metrics(res.episode, res.step, res.anchor_ids, res.anchor_sizes, r.hashed)


def gigpo_metrics(
    episode: np.ndarray, step: np.ndarray, anchor_ids: np.ndarray, anchor_sizes: np.ndarray, hashed: np.ndarray
) -> dict[str, float | int]:
    """The ``dso_gigpo/*`` metrics of a batch: mean |A_E| and |A_S|, anchor groups of hashed
    states, those of size > 1 and their share.

    Args:
        episode, step: (N,) float64, A_E and A_S per step.
        anchor_ids, anchor_sizes: (N,) int64, anchor group and its size per step.
        hashed: (N,) bool, the step has an ``env_state_hash``.
    """
    sizes = np.zeros(int(anchor_ids.max()) + 1, dtype=np.int64)
    sizes[anchor_ids] = anchor_sizes
    ids = np.unique(anchor_ids[hashed])
    total, hit = int(ids.size), int((sizes[ids] > 1).sum())
    return {
        "dso_gigpo/mean_abs_A_E": float(np.abs(episode).mean()),
        "dso_gigpo/mean_abs_A_S": float(np.abs(step).mean()),
        "dso_gigpo/anchor_groups_total": total,
        "dso_gigpo/anchor_groups_size_gt1": hit,
        "dso_gigpo/anchor_group_hit_ratio": hit / total if total else 0.0,
    }


# ---------------------------------------------------------------------------------- GiGPO via the index
EPISODE_SUFFIX = ":episode"
"""Batch-key suffix under which the trajectories' total rewards are stored (one record each)."""
EPISODE_STATE = "episode"


class DsoGiGPOIndexAdvantageFn(AdvantageFn, ExperienceOperatorV1):
    """``dso_gigpo_index``: :class:`orchestrator.trinity.advantage.DsoGiGPOAdvantageFn` with the statistics
    taken from the orchestrator's shared anchor index (GiGPO, arXiv 2505.10978, Eq. 3, 5-8).

    Per call (the experiences of one explore step, or a share of them):

    1. the rows are read as ``dso_gigpo`` reads them (group = ``eid.tid``, trajectory =
       ``eid.rid``, step order ``eid.step``, step reward ``info[step_reward_key]`` or the
       terminal ``reward``, anchor state ``info[env_state_hash_key]``); only what the index
       cannot hold is computed here: the discounted returns R_t (Eq. 5, which also validates
       the steps) and each trajectory's total reward;
    2. the call's trajectories are written to the index under batch key ``trinity-<eid.batch>``
       as whole trajectories (:meth:`AnchorIndex.insert_trajectories`: task = ``eid.tid``,
       run = ``eid.run``, steps 0..L-1; one record per trajectory and one per anchor group, the
       group moments prepared here in numpy), then every trajectory's total reward under
       ``trinity-<eid.batch>:episode`` (state ``"episode"``), so that the episode groups (Eq.
       3, each trajectory counted once) are shared too. A step without a state hash gets a
       state of its own (A_S = 0, as in ``dso_gigpo``);
    3. the episode insert reports, atomically with its write, each group's complete
       trajectories: with ``group_size`` set, groups the call holds whole are queried at once,
       and only groups split over calls or workers are waited for (up to ``wait_timeout_s``)
       until the index holds ``group_size`` complete trajectories of each - written by this or
       any other advantage worker. The wait blocks (Redis: on the batch's event stream; an
       in-process memory index: on its condition), except through an index served by a Ray
       actor, which is polled. A_S per (group, state) and A_E per group then come from the
       index's moments (:meth:`AnchorIndex.group_step_advantages`, one read of each distinct
       group, ``n_runs=group_size``, which refuses an incomplete group);
    4. ``A = A_E + omega * A_S`` is broadcast over ``action_mask`` as ``dso_gigpo`` does.

    When each call holds whole groups (Trinity's default), the numbers equal ``dso_gigpo``'s to
    ~1e-15 (one-pass moments vs. two-pass sums, both float64); when a group's trajectories are
    split over several workers or calls, each gets the statistics of the whole group, which a
    per-batch computation cannot. A trajectory's steps must arrive in one call, numbered from 0.

    Where the index is: ``redis_url`` (a :class:`RedisAnchorIndex` opened here), else the
    orchestrator actor ``actor_name`` in ``namespace`` (default: the caller's Ray namespace,
    i.e. the run's), whose ``anchor_spec()`` names its Redis or the Ray actor serving its memory
    index (both queried directly, never through the orchestrator). When the actor exists, batch keys are registered with
    it (``anchor_register``, at the experiences' ``model_version``) so its version-based
    expiry drops them; otherwise the index TTL does.

    Args:
        every ``dso_gigpo`` argument (keyword), except that the shared index needs
            ``singleton_episode="zero"``, ``std="sample"``, ``episode_weighting="trajectory"``
            and no ``similarity_threshold`` (other values are refused, naming them).
        actor_name, namespace: the orchestrator actor (default ``dso-orchestrator``).
        redis_url, prefix, ttl_s: a Redis index to use without an actor (prefix and TTL as
            :class:`~orchestrator.anchors.owner.AnchorIndexConfig`).
        group_size: trajectories per group to wait for (usually ``algorithm.repeat_times``);
            None: the groups are whole in each call (no waiting, no completeness check).
        wait_timeout_s: longest wait for incomplete groups, seconds.
        lookup_timeout_s: longest wait for the actor to appear, seconds.
    Raises:
        ValueError: an unknown argument (the valid ones are listed) or an option the index
            cannot honour.
        pydantic.ValidationError: out-of-range GiGPO arguments.
        algos.gigpo.InvalidStepError: a non-finite reward, a duplicate or missing step.
        orchestrator.trinity.attach.OrchestratorNotFoundError: no ``redis_url`` and no actor.
        orchestrator.anchors.owner.AnchorIndexNotConfiguredError: the actor has no anchor index.
        orchestrator.anchors.index.AnchorIndexError: Redis unreachable, batch state lost, a
            group still incomplete after ``wait_timeout_s``, or a conflicting re-insert.
    """

    def __init__(
        self,
        actor_name: str = DEFAULT_NAME,
        namespace: str | None = None,
        redis_url: str | None = None,
        prefix: str = "dso",
        ttl_s: float = 6 * 3600.0,
        group_size: int | None = None,
        wait_timeout_s: float = 60.0,
        lookup_timeout_s: float = 60.0,
        **gigpo: Any,
    ) -> None:
        own = ["actor_name", "namespace", "redis_url", "prefix", "ttl_s", "group_size", "wait_timeout_s", "lookup_timeout_s"]
        refuse_unknown("dso_gigpo_index", gigpo, list(_GIGPO_ARGS) + own)
        self.local = DsoGiGPOAdvantageFn(**gigpo)
        self.config = self.local.config
        unsupported = {
            k: getattr(self.config, f) for k, f, ok in (
                ("singleton_episode", "singleton_episode", "zero"),
                ("similarity_threshold", "similarity_threshold", None),
                ("std", "std", "sample"),
                ("episode_weighting", "episode_weighting", "trajectory"),
            ) if getattr(self.config, f) != ok
        }
        if unsupported:
            raise ValueError(
                f"dso_gigpo_index: {unsupported} need the whole batch in one place; the shared index supports "
                "singleton_episode='zero', std='sample', episode_weighting='trajectory' and exact state hashes "
                "only (use dso_gigpo for these options)"
            )
        if group_size is not None and int(group_size) < 1:
            raise ValueError(f"group_size: must be >= 1 or null, got {group_size}")
        self.group_size = None if group_size is None else int(group_size)
        self.actor_name = actor_name
        self.namespace = namespace
        self.redis_url = redis_url
        self.prefix = prefix
        self.ttl_s = float(ttl_s)
        self.wait_timeout_s = float(wait_timeout_s)
        self.lookup_timeout_s = float(lookup_timeout_s)
        self._index: AnchorIndex | RemoteAnchorIndex | None = None
        self._actor: Any = None
        self.auxiliary_models = {}

    @classmethod
    def default_args(cls) -> dict:
        return {
            **DsoGiGPOAdvantageFn.default_args(),
            "actor_name": DEFAULT_NAME,
            "namespace": None,
            "redis_url": None,
            "prefix": "dso",
            "ttl_s": 6 * 3600.0,
            "group_size": None,
            "wait_timeout_s": 60.0,
            "lookup_timeout_s": 60.0,
        }

    @classmethod
    def compute_in_trainer(cls) -> bool:
        return False

    # -- the index
    def index(self) -> AnchorIndex | RemoteAnchorIndex:
        """The anchor index (opened once): ``redis_url`` if set, else the actor's."""
        if self._index is None:
            if self.redis_url:
                self._index = RedisAnchorIndex(self.redis_url, prefix=self.prefix, ttl_s=self.ttl_s)
                try:
                    self._actor = find_orchestrator(self.actor_name, self.namespace, timeout_s=0.0)
                except OrchestratorNotFoundError:
                    self._actor = None  # no expiry by version: the TTL applies
            else:
                self._actor = find_orchestrator(self.actor_name, self.namespace, timeout_s=self.lookup_timeout_s)
                self._index = orchestrator_anchor_index(self._actor)
        return self._index

    def close_index(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

    async def close(self) -> None:
        self.close_index()

    # -- computation
    def compute(self, exps: list[TrinityExperience], order: tuple[list, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """GiGPO advantages of a call's experiences from the shared index (``order``: as
        :meth:`StepRows.read`).

        Only what the index cannot hold is computed here: the discounted returns R_t (Eq. 5)
        and each trajectory's total reward, from this call's steps; the write itself is
        prepared in numpy (one record per trajectory and per anchor group, see
        :func:`orchestrator.anchors.index.trajectory_records`). The anchor groups' statistics
        (A_S, Eq. 6-7) and the episode groups' (A_E, Eq. 3) come from the index, read once per
        distinct group. The insert reports, atomically with the write, how many complete
        trajectories each group now has, so groups the call holds whole (the usual Trinity
        case) are queried at once; only groups split over calls or workers are waited for, by
        :meth:`AnchorIndex.wait_complete` (Redis: blocking on the batch's event stream; an
        in-process memory index: woken by each insert; an index behind a Ray actor: polled),
        up to ``wait_timeout_s``.

        Returns:
            ``advantages``, ``episode`` (A_E), ``step`` (A_S), each (N,) float64 in the call's order.
        Raises:
            see the class docstring.
        """
        cfg = self.config
        r = self.local.rows(exps, order)
        n = len(exps)
        # the invalid-action penalty as algos.gigpo.gigpo_advantages applies it
        penalty = cfg.invalid_action_penalty * r.invalid
        if cfg.penalty_timing == "before_returns":
            returns = discounted_returns(r.reward - penalty, r.traj, r.step, gamma=cfg.gamma)
        else:
            returns = discounted_returns(r.reward, r.traj, r.step, gamma=cfg.gamma) - penalty
        ep_reward = r.reward - penalty
        num_traj = int(r.traj.max()) + 1
        order = np.lexsort((ep_reward, r.traj))  # canonical summation order, as algos.gigpo
        totals = np.bincount(r.traj[order], weights=ep_reward[order], minlength=num_traj)
        first_row = np.full(num_traj, -1, dtype=np.int64)
        first_row[r.traj[::-1]] = np.arange(n)[::-1]
        traj_group, traj_run = r.group[first_row], r.run[first_row]
        # names shared by every worker: group = eid.tid, batch key = trinity-<eid.batch>, state = hash text
        group_name = r.group_names()
        group_batch = np.array([f"trinity-{b}" for b, _ in r.group_keys], dtype=object)
        solo = np.flatnonzero(~r.hashed)  # their codes follow the hashed ones, in row order
        state_name = r.state_names + [f"dso-solo:{exps[i].eid.rid}:{int(r.step[i])}" for i in solo.tolist()]
        runs_per_group = np.bincount(traj_group, minlength=len(group_name))
        index = self.index()
        episode = np.full(n, np.nan)
        step = np.full(n, np.nan)
        n_runs = self.group_size
        for bk in sorted(set(group_batch.tolist())):
            in_batch = group_batch == bk
            rows = np.flatnonzero(in_batch[r.group])
            trajs = np.flatnonzero(in_batch[traj_group])
            if self._actor is not None:
                version = max(int((exps[i].info or NO_INFO).get("model_version", 0) or 0) for i in rows.tolist())
                ray.get(self._actor.anchor_register.remote(bk, version))
                ray.get(self._actor.anchor_register.remote(bk + EPISODE_SUFFIX, version))
            steps_receipt = index.insert_trajectories(bk, trajectory_records(
                r.group[rows], group_name, r.run[rows], r.step[rows], r.state[rows], state_name, returns[rows]
            ))
            # the episode returns after the steps: a complete episode group implies complete steps
            zeros = np.zeros(trajs.size, dtype=np.int64)
            receipt = index.insert_trajectories(bk + EPISODE_SUFFIX, trajectory_records(
                traj_group[trajs], group_name, traj_run[trajs], zeros, zeros, [EPISODE_STATE], totals[trajs]
            ))
            gid, _ = encode_keys(r.group[rows], r.state[rows])  # the records' anchor-group codes
            egid, enum = encode_keys(traj_group[trajs])  # and their episode-group codes
            # groups complete when written: the index's moments came back with the writes
            a_s = steps_receipt.step_advantages(gid, returns[rows], norm=cfg.norm, eps=cfg.eps, n_runs=n_runs)
            a_e = receipt.step_advantages(egid, totals[trajs], norm=cfg.norm, eps=cfg.eps, n_runs=n_runs)
            if a_s is None or a_e is None:  # a group split over calls or workers: wait, then read
                if n_runs is not None:
                    groups = np.flatnonzero(in_batch)
                    split = [group_name[g] for g in groups[runs_per_group[groups] != n_runs].tolist()]
                    if any(receipt.done.get(g, 0) < n_runs for g in split):
                        index.wait_complete(bk + EPISODE_SUFFIX, sorted(split), n_runs, self.wait_timeout_s, receipt=receipt)
                first = np.full(int(gid.max()) + 1, -1, dtype=np.int64)
                first[gid] = rows
                keys = [(group_name[g], state_name[h]) for g, h in zip(r.group[first].tolist(), r.state[first].tolist())]
                a_s = index.group_step_advantages(bk, keys, gid, returns[rows], norm=cfg.norm, eps=cfg.eps, n_runs=n_runs)
                efirst = np.full(enum, -1, dtype=np.int64)
                efirst[egid] = traj_group[trajs]
                a_e = index.group_step_advantages(
                    bk + EPISODE_SUFFIX, [(group_name[g], EPISODE_STATE) for g in efirst.tolist()], egid, totals[trajs],
                    norm=cfg.norm, eps=cfg.eps, n_runs=n_runs,
                )
            step[rows] = a_s
            per_traj = np.full(num_traj, np.nan)
            per_traj[trajs] = a_e
            episode[rows] = per_traj[r.traj[rows]]
        return {"advantages": episode + cfg.omega * step, "episode": episode, "step": step}

    def process_sync(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """Set ``advantages`` / ``returns`` ((T,) float32, A times ``action_mask``) on each experience.

        Returns:
            the experiences, and ``dso_gigpo/mean_abs_A_E``, ``dso_gigpo/mean_abs_A_S`` and
            ``dso_gigpo_index/seconds`` (reading, index round trips and waiting).
        Raises:
            algos.gigpo.InvalidStepError: a step of a member the orchestrator masked
                (``info["dso_masked"]``): the index's anchor groups wait for every run of a
                task and cannot leave it out (names the first, and the policy fields to change).
        """
        if not exps:
            return [], {}
        t0 = time.perf_counter()
        order = _address_order(exps)  # shared by the reading and the write-back
        masked = _masked_rows(exps, order)
        if masked is not None:
            k = int(np.flatnonzero(masked)[0])
            raise InvalidStepError(
                f"dso_gigpo_index: {int(masked.sum())} steps of members the orchestrator masked (first: row {k}, group "
                f"{exps[k].eid.tid!r}, run {exps[k].eid.run}); the index's anchor groups wait for every run of a task, so it "
                "cannot leave them out: set the policy's group_validity to 'reject' and stale_members to 'oldest', or use dso_gigpo"
            )
        res = self.compute(exps, order)
        seconds = time.perf_counter() - t0
        write_token_advantages(exps, res["advantages"], order=order)
        metrics = {
            "dso_gigpo/mean_abs_A_E": float(np.abs(res["episode"]).mean()),
            "dso_gigpo/mean_abs_A_S": float(np.abs(res["step"]).mean()),
            "dso_gigpo_index/seconds": seconds,
        }
        return exps, metrics

    def __call__(self, exps, **kwargs):
        return self.process_sync(exps)

    async def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """:meth:`process_sync` in a worker thread (index round trips block; the pipeline's loop does not)."""
        return await asyncio.to_thread(self.process_sync, exps)


