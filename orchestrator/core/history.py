"""Per-task reward history, held as flat arrays indexed by task (no per-task objects).

Running mean and variance use the parallel form of Welford's algorithm (Chan, Golub and
LeVeque 1979): a group of m rewards with mean ``mu_b`` and sum of squared deviations
``M2_b`` merges into ``(n_a, mu_a, M2_a)`` as::

    n = n_a + m;  delta = mu_b - mu_a
    mu = mu_a + delta * m / n
    M2 = M2_a + M2_b + delta**2 * n_a * m / n

so whole groups are merged at once, vectorised over tasks.
"""

from __future__ import annotations

import numpy as np

from algos.dapo import GroupReason

_FIELDS = {
    "groups": np.int64,
    "informative": np.int64,
    "rollouts": np.int64,
    "correct": np.int64,
    "mean": np.float64,
    "m2": np.float64,
    "consec_all_correct": np.int64,
    "consec_all_wrong": np.int64,
    "last_model_version": np.int64,
    "skip_until_epoch": np.int64,
    "answer_prob": np.float64,
    "answer_prob_version": np.int64,
}
_LATER = {"answer_prob", "answer_prob_version"}
"""Fields added after checkpoints existed: a checkpoint without them loads them as never set."""


class TaskHistory:
    """Reward statistics per task: arrays of length T (number of tasks), float64/int64."""

    # the columns, made from _FIELDS: (T,) int64 unless noted
    groups: np.ndarray
    informative: np.ndarray
    rollouts: np.ndarray
    correct: np.ndarray
    mean: np.ndarray  # float64
    m2: np.ndarray  # float64
    consec_all_correct: np.ndarray
    consec_all_wrong: np.ndarray
    last_model_version: np.ndarray
    skip_until_epoch: np.ndarray
    answer_prob: np.ndarray  # float64
    answer_prob_version: np.ndarray

    def __init__(self, num_tasks: int):
        self.num_tasks = num_tasks
        for name, dtype in _FIELDS.items():
            setattr(self, name, np.zeros(num_tasks, dtype=dtype))
        self.last_model_version[:] = -1
        self.answer_prob_version[:] = -1  # never scored (the answer screen's last p and its model version)

    def update(
        self,
        task_idx: np.ndarray,
        rewards: np.ndarray,
        correct: np.ndarray,
        reasons: np.ndarray,
        model_versions: np.ndarray,
        valid: np.ndarray | None = None,
    ) -> None:
        """Merge G groups into the history.

        Args:
            task_idx: (G,) int64. Task index of each group; a task may repeat.
            rewards: (G, n) float. Rewards of each group's rollouts.
            correct: (G, n) bool. Whether each rollout counts as correct.
            reasons: (G,) int8. :class:`GroupReason` code of each group.
            model_versions: (G,) int64. Model version of each group.
            valid: optional (G, n) bool. Members to count (masked members are left out).
        Groups of a repeated task are merged in submission order (one vectorised pass over the
        first group of each task, then the same for the rest), so consecutive all-correct /
        all-wrong counts stay exact.
        """
        task_idx = np.asarray(task_idx, dtype=np.int64)
        rewards = np.asarray(rewards, dtype=np.float64)
        valid = np.ones(rewards.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
        # the first group of each task in this submission, then (again, in submission order) the others
        order = np.argsort(task_idx, kind="stable")  # stable: a task's groups in submission order
        sorted_idx = task_idx[order]
        later = np.zeros(len(task_idx), dtype=bool)
        later[order[1:]] = sorted_idx[1:] == sorted_idx[:-1]
        if not later.any():
            self._merge(task_idx, rewards, correct, reasons, model_versions, valid)
            return
        first = ~later
        self._merge(task_idx[first], rewards[first], correct[first], reasons[first], model_versions[first], valid[first])
        self.update(task_idx[later], rewards[later], correct[later], reasons[later], model_versions[later], valid[later])

    def _merge(self, t, rewards, correct, reasons, versions, valid) -> None:
        m = valid.sum(axis=1).astype(np.float64)
        r = np.where(valid, rewards, 0.0)
        mu_b = r.sum(axis=1) / np.maximum(m, 1.0)
        m2_b = (np.where(valid, rewards - mu_b[:, None], 0.0) ** 2).sum(axis=1)
        n_a = self.rollouts[t].astype(np.float64)
        n = n_a + m
        delta = mu_b - self.mean[t]
        self.mean[t] += delta * m / n
        self.m2[t] += m2_b + delta**2 * n_a * m / n
        self.rollouts[t] += m.astype(np.int64)
        self.groups[t] += 1
        self.correct[t] += (correct & valid).sum(axis=1)
        self.informative[t] += reasons == GroupReason.INFORMATIVE
        all_correct = reasons == GroupReason.ALL_CORRECT
        all_wrong = reasons == GroupReason.ALL_WRONG
        self.consec_all_correct[t] = np.where(all_correct, self.consec_all_correct[t] + 1, 0)
        self.consec_all_wrong[t] = np.where(all_wrong, self.consec_all_wrong[t] + 1, 0)
        self.last_model_version[t] = np.maximum(self.last_model_version[t], versions)

    def variance(self) -> np.ndarray:
        """(T,) float64. Unbiased reward variance per task; NaN with fewer than 2 rollouts."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.rollouts > 1, self.m2 / (self.rollouts - 1), np.nan)

    def pass_rate(self) -> np.ndarray:
        """(T,) float64. Fraction of rollouts judged correct; NaN for unseen tasks."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.rollouts > 0, self.correct / np.maximum(self.rollouts, 1), np.nan)

    def row(self, i: int) -> dict:
        """Plain-Python view of task ``i``'s history (for REST and the CLI)."""
        out = {name: getattr(self, name)[i].item() for name in _FIELDS}
        out["variance"] = None if self.rollouts[i] < 2 else float(self.variance()[i])
        out["pass_rate"] = None if self.rollouts[i] == 0 else float(self.pass_rate()[i])
        out["answer_prob"] = None if self.answer_prob_version[i] < 0 else float(self.answer_prob[i])
        return out

    def state_dict(self) -> dict:
        """By field, the (T,) arrays themselves, not copies (as torch's ``state_dict``): copy one to keep it past the next change (the core's :meth:`state_dict` makes them JSON lists)."""
        return {name: getattr(self, name) for name in _FIELDS}

    def load_state_dict(self, state: dict) -> None:
        """Restore from copies of ``state``'s arrays; raises ValueError when one does not match the task count.
        A field of :data:`_LATER` missing from ``state`` (an older checkpoint) keeps its initial value."""
        for name, dtype in _FIELDS.items():
            if name in _LATER and name not in state:
                continue
            arr = np.array(state[name], dtype=dtype)
            if arr.shape != (self.num_tasks,):
                raise ValueError(f"history.{name}: expected {self.num_tasks} tasks, got shape {arr.shape}")
            setattr(self, name, arr)
