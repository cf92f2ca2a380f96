"""The per-step rows of a batch of Trinity step experiences (GiGPO's input), read off the
experiences into integer-coded arrays."""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
from trinity.common.experience import Experience as TrinityExperience

from algos.gigpo import InvalidStepError, encode_keys
from orchestrator.trinity.fields import (
    MemoryOrder,
    first_appearance_codes,
    group_codes,
    info_column,
    is_number,
)


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
        order: MemoryOrder | None = None,
    ) -> StepRows:
        """Read the rows off ``exps``: the fields :class:`MemoryOrder` read in one pass, then one
        C-level pass per ``info`` key (``map`` over item getters), in memory order; keys
        factorised to integer codes through dicts, no per-row objects; the columns are then put
        back in the batch's order and the groups numbered by first appearance in it.

        Args:
            texts: also read ``info[state_text_key]`` (only similarity grouping needs it).
            order: ``MemoryOrder(exps)`` when the caller already has it (to share it, and the
                infos it read, with :func:`~orchestrator.trinity.fields.masked_rows` and
                :func:`~orchestrator.trinity.writeback.write_token_advantages`).
        Raises:
            algos.gigpo.InvalidStepError: a state hash that is empty, or neither str nor bytes,
                or a step reward that is not a number (names row, group, run, step).
        """
        n = len(exps)
        order = order if order is not None else MemoryOrder(exps)  # read in memory order; columns put back below
        pos, infos, back = order.pos, order.infos, order.back  # batch row i is order.items[back[i]]
        group, group_keys = group_codes(order)  # Trinity's group_by order
        run = np.array(order.runs, dtype=np.int64)[back]
        step = np.array(order.steps, dtype=np.int64)[back]

        def where(i: int) -> str:
            return f"row {i} (group {exps[i].eid.tid!r}, run {int(run[i])}, step {int(step[i])})"

        values, explicit = info_column(infos, step_reward_key, 0.0)
        try:
            reward = np.fromiter(values, dtype=np.float64, count=n)[back]
        except (TypeError, ValueError):
            k = next(k for k, x in enumerate(values) if not is_number(x))
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
        hashes, _ = info_column(infos, env_state_hash_key, None)
        try:
            raw, uniq = first_appearance_codes(hashes)
        except TypeError:  # an unhashable value (bytearray, list): make it hashable, refuse it below
            hashes = [
                bytes(h) if isinstance(h, bytearray) else h if h is None or isinstance(h, (str, bytes)) else ("unhashable", k)
                for k, h in enumerate(hashes)
            ]
            raw, uniq = first_appearance_codes(hashes)
        raw = raw[back]
        if set(map(type, uniq)) == {str} and "" not in uniq:  # distinct non-empty str (the usual case): their codes
            names, state = uniq, raw
        else:
            seen: dict[str, int] = {}
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
                        "orchestrator.anchors.state_hash.state_hash (never str())"
                    )
                remap[code] = seen.setdefault(h, len(seen))
            names, state = list(seen), remap[raw]
        hashed = state >= 0
        solo = np.flatnonzero(~hashed)
        state[solo] = len(names) + np.arange(solo.size)
        if any(map(operator.contains, infos, itertools.repeat(action_valid_key))):
            valid, _ = info_column(infos, action_valid_key, None)
            invalid = np.fromiter(map(operator.is_, valid, itertools.repeat(False)), dtype=bool, count=n)[back]
        else:  # no step says anything about validity (the usual case)
            invalid = np.zeros(n, dtype=bool)
        text = None
        if texts:
            text = np.empty(n, dtype=object)
            text[:] = [infos[k].get(state_text_key) for k in back.tolist()]
        return cls(group, run, step, reward, state, hashed, invalid, text, traj, list(names), group_keys)
