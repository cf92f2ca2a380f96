"""Per-task pass-rate estimates: a Beta posterior per task that predicts informative groups.

A group of n rollouts of a task is informative when it is neither all correct nor all wrong
(DAPO, arXiv 2503.14476, Eq. 11: ``0 < |{o_i : is_equivalent(a, o_i)}| < G``). With a pass
rate p the chance of that is ``1 - p**n - (1 - p)**n``. We do not know p; we hold a Beta
posterior over it and predict with the posterior expectation::

    E[1 - p**n - (1-p)**n]  =  1 - B(a + n, b) / B(a, b) - B(a, b + n) / B(a, b)

which is exactly the Beta-Binomial predictive probability that the next group has between 1
and n - 1 correct rollouts (the Beta-Binomial pmf at k = n and k = 0; e.g. Johnson, Kemp and
Kotz, *Univariate Discrete Distributions*, 3rd ed., Sec. 6.7.2). The plug-in
``1 - m**n - (1-m)**n`` at the posterior mean m overstates informativeness (``p**n`` is convex,
so by Jensen ``E[p**n] >= m**n``) and most for the tasks seen least; :func:`plugin_informativeness`
is kept for comparison.

The posterior of task t is ``Beta(a0 + s_t, b0 + f_t)`` (Beta-Binomial conjugacy), where:

* ``s_t``, ``f_t`` are its correct / incorrect rollouts, each weighted by
  ``0.5 ** ((V - v) / half_life)`` for a rollout of model version v read at model version V:
  evidence halves every ``half_life`` model versions, since the model it describes changes.
  (Trinity's ``BaseBetaPREstimator`` discounts per update step instead, by ``1 - lamb``.)
  :meth:`PassRateEstimate.discount` forgets faster where the model changes most: the
  orchestrator multiplies a task's evidence by ``passrate_trained_discount`` each time one of
  its groups is emitted for training (a gradient step on a prompt moves its pass rate most).
* ``(a0, b0)`` is a population prior learned from the tasks' *first* groups (empirical Bayes):
  its mean is their mean pass rate and its strength makes its predicted informativeness equal
  their share of informative groups (:func:`fit_prior_to_informative_share`). So a task never
  seen is predicted exactly as the population's chance of an informative first group. First
  groups are used because later ones come from tasks that were chosen for being informative
  and then trained on, and describe the untouched population no more. The textbook method of
  moments for the Beta-Binomial (Kleinman 1973, JASA 68:46-54; :func:`fit_population_prior`)
  matches the variance instead; it is kept as the ``prior="moments"`` option. Matching the
  n-th-order moment that the selection uses keeps the unseen-task prediction right when the
  population is not Beta-shaped (a third solved, a third unsolved, a third in between), where
  the variance match predicts far too few informative groups.

The keep rule the selection modes and the answer screen share (:func:`keep_probability`) turns a
predicted chance of an informative group into the chance a task is rolled out.

*Per tag* (a task's difficulty tag, e.g. its family ``add2`` read from the task's metadata):
  with ``tags``, the prior above is fitted to the first groups of the tasks sharing a tag
  (at least :data:`MIN_TAG_TASKS` of them seen), else to the whole population. A task never
  seen, or seen once, is then predicted from tasks like it, not from the whole mix: in a task
  set where one family is always solved and another never, the population prior would call
  an unseen task of either family informative half the time. This is the empirical-Bayes
  prior of a hierarchical Beta-Binomial with one level per tag (Gelman et al., *Bayesian Data
  Analysis*, 3rd ed., Sec. 5.3, fitted per group instead of jointly).

Everything is a flat array over tasks; no per-task objects, no loops over tasks or rollouts.
"""

from __future__ import annotations

import numpy as np
import torch

PRIOR_GRID = 2001
"""Grid size of the prior strength search in :func:`fit_prior_to_informative_share`."""
MIN_TAG_TASKS = 4
"""Seen tasks a tag needs before its own prior replaces the population's."""
UNIFORM_PRIOR = (1.0, 1.0)
"""Prior used until at least two tasks have evidence (Bayes-Laplace)."""


def _lbeta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log B(a, b), float64, via lgamma (numpy has none; torch's is exact to float64)."""
    a_t = torch.as_tensor(np.asarray(a, dtype=np.float64))
    b_t = torch.as_tensor(np.asarray(b, dtype=np.float64))
    return (torch.lgamma(a_t) + torch.lgamma(b_t) - torch.lgamma(a_t + b_t)).numpy()


def prob_all_equal(alpha: np.ndarray, beta: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Chance that a group of n rollouts is all correct / all wrong, p ~ Beta(alpha, beta).

    ``E[p**n] = B(alpha + n, beta) / B(alpha, beta)`` and ``E[(1-p)**n] = B(alpha, beta + n) /
    B(alpha, beta)``: the Beta-Binomial pmf at k = n and k = 0.

    Args:
        alpha, beta: (T,) float, > 0. Beta parameters per task.
        n: rollouts per group, >= 1.
    Returns:
        ((T,) float64, (T,) float64): P(all correct), P(all wrong).
    Raises:
        ValueError: n < 1 or a parameter <= 0 (the index is named).
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    if n < 1:
        raise ValueError(f"n: group size must be >= 1, got {n}")
    bad = np.flatnonzero(~((alpha > 0) & (beta > 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"alpha/beta: Beta parameters must be > 0, got ({alpha[i]!r}, {beta[i]!r}) at index {i}")
    base = _lbeta(alpha, beta)
    return np.exp(_lbeta(alpha + n, beta) - base), np.exp(_lbeta(alpha, beta + n) - base)


def informativeness(alpha: np.ndarray, beta: np.ndarray, n: int) -> np.ndarray:
    """Posterior-predictive chance that a group of n rollouts is informative (DAPO Eq. 11).

    ``E[1 - p**n - (1-p)**n]`` for ``p ~ Beta(alpha, beta)``; see the module docstring.

    Args:
        alpha, beta: (T,) float, > 0.
        n: rollouts per group. With n == 1 every group is all-equal: the result is 0.
    Returns:
        (T,) float64 in [0, 1].
    """
    correct, wrong = prob_all_equal(alpha, beta, n)
    return np.clip(1.0 - correct - wrong, 0.0, 1.0)


def informative_after_unanimous_screen(alpha: np.ndarray, beta: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Chance that a group of n is informative once its first k rollouts came out all correct /
    all wrong, p ~ Beta(alpha, beta) before them.

    After k correct rollouts the posterior is ``Beta(alpha + k, beta)`` (conjugacy), and the
    completed group is uninformative only when the other n - k are all correct too:
    ``1 - E[p**(n-k)]`` under that posterior, ``= 1 - B(alpha + n, beta) / B(alpha + k, beta)``.
    All wrong, symmetrically: ``1 - B(alpha, beta + n) / B(alpha, beta + k)``. (Beta-Binomial
    predictive, as :func:`prob_all_equal`; a screen that is not all equal completes to an
    informative group for certain.)

    Args:
        alpha, beta: (T,) float, > 0: each task's posterior before the screen.
        n: group size; k: screen rollouts, 1 <= k < n.
    Returns:
        ((T,) float64, (T,) float64): after an all-correct screen, after an all-wrong one.
    """
    if not 1 <= k < n:
        raise ValueError(f"k: screen rollouts must be in [1, n) = [1, {n}), got {k}")
    alpha = np.asarray(alpha, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    rest_correct, _ = prob_all_equal(alpha + k, beta, n - k)
    _, rest_wrong = prob_all_equal(alpha, beta + k, n - k)
    return 1.0 - rest_correct, 1.0 - rest_wrong


def plugin_informativeness(p: np.ndarray, n: int) -> np.ndarray:
    """``1 - p**n - (1-p)**n`` at known pass rates p: (T,) float -> (T,) float64 (DAPO Eq. 11)."""
    p = np.asarray(p, dtype=np.float64)
    return np.clip(1.0 - p**n - (1.0 - p) ** n, 0.0, 1.0)


def keep_probability(informative: np.ndarray, keep_at: float, floor: float, power: float = 1.0) -> np.ndarray:
    """The keep rule: ``clip((I / keep_at) ** power, floor, 1)``, the chance a task is rolled out
    when its turn comes, from its predicted chance ``I`` of an informative group (shared by
    ``predicted_skip``, ``greso_prior`` and the answer screen).

    ``power`` 1 keeps a task in proportion to its chance of an informative group below ``keep_at``
    (``predicted_skip``'s rule, like GRESO's probabilistic skip, Zheng et al. arXiv 2506.02177 Sec. 4, with
    the prediction in place of the zero-variance streak); a larger power is a softer form
    of a threshold at ``keep_at`` (the answer screen's default, :mod:`orchestrator.core.policy`).

    Args:
        informative: (k,) float in [0, 1], predicted chance of an informative group.
        keep_at: in (0, 1]; tasks predicted at least this informative are always kept.
        floor: in [0, 1]; the least chance of a turn.
        power: > 0; how sharply the chance falls below ``keep_at``.
    Returns:
        (k,) float64 in [floor, 1].
    """
    return np.clip((np.asarray(informative, dtype=np.float64) / keep_at) ** power, floor, 1.0)


def fit_population_prior(
    successes: np.ndarray,
    trials: np.ndarray,
    *,
    min_tasks: int = 2,
    min_trials: float = 1.0,
    strength_range: tuple[float, float] = (0.2, 1000.0),
) -> tuple[float, float]:
    """Beta prior ``(a0, b0)`` of the task population, by the method of moments.

    Each task with at least ``min_trials`` (possibly fractional, decayed) trials contributes
    its observed rate ``x_t = s_t / m_t``. Under ``p_t ~ Beta(a0, b0)`` and ``s_t ~ Bin(m_t, p_t)``
    (Kleinman 1973, equal task weights)::

        mu = mean(x_t);   Var(x) = Var(p) + (mu (1 - mu) - Var(p)) * h,   h = mean(1 / m_t)
        Var(p) = (Var(x) - mu (1 - mu) h) / (1 - h);   a0 + b0 = mu (1 - mu) / Var(p) - 1

    ``a0 + b0`` is clipped to ``strength_range`` (a spread wider than a Bernoulli's or no spread
    at all would give a negative or infinite strength); ``mu`` to [1e-3, 1 - 1e-3].

    Args:
        successes, trials: (T,) float >= 0. Per-task (decayed) correct rollouts and rollouts.
        min_tasks: below this many tasks with evidence, return :data:`UNIFORM_PRIOR`.
    Returns:
        (a0, b0), floats > 0.
    """
    s = np.asarray(successes, dtype=np.float64)
    m = np.asarray(trials, dtype=np.float64)
    seen = m >= min_trials
    if int(seen.sum()) < max(min_tasks, 2):
        return UNIFORM_PRIOR
    x = s[seen] / m[seen]
    mu = float(np.clip(x.mean(), 1e-3, 1 - 1e-3))
    h = float(np.mean(1.0 / m[seen]))
    lo, hi = strength_range
    if h >= 1.0:  # every task seen once: the spread says nothing about Var(p)
        strength = lo
    else:
        var_p = (float(x.var()) - mu * (1 - mu) * h) / (1.0 - h)
        strength = hi if var_p <= 0 else mu * (1 - mu) / var_p - 1.0
    strength = float(np.clip(strength, lo, hi))
    return mu * strength, (1 - mu) * strength


def fit_prior_to_informative_share(
    mean: float, informative_share: float, n: int, *, strength_range: tuple[float, float] = (0.05, 1000.0)
) -> tuple[float, float]:
    """Beta prior ``(a0, b0)`` with mean ``mean`` whose predicted informativeness equals
    ``informative_share`` (the population's observed share of informative groups of n).

    The strength ``k = a0 + b0`` is the smallest of ``PRIOR_GRID`` log-spaced values in
    ``strength_range`` with ``informativeness(mean * k, (1 - mean) * k, n) >= share`` (the left
    side rises from 0 as k -> 0, a Bernoulli, to ``1 - mean**n - (1 - mean)**n`` as k -> inf, a
    point mass; relative step of k about 0.5 %); a share outside that range gives the nearer
    end. Matching the n-th-order moment that the selection uses, instead of the variance
    (:func:`fit_population_prior`), keeps the prediction for a task never seen equal to the
    population's share of informative groups even when the population is not Beta-shaped
    (e.g. a third solved, a third unsolved, a third in between).

    Args:
        mean: in (0, 1). Population mean pass rate (clipped to [1e-3, 1 - 1e-3]).
        informative_share: in [0, 1].
        n: rollouts per group.
    Returns:
        (a0, b0), floats > 0.
    """
    mu = float(np.clip(mean, 1e-3, 1 - 1e-3))
    k = np.geomspace(strength_range[0], strength_range[1], PRIOR_GRID)
    predicted = informativeness(mu * k, (1 - mu) * k, n)  # rises with k
    i = min(int(np.searchsorted(predicted, informative_share)), PRIOR_GRID - 1)
    return mu * float(k[i]), (1 - mu) * float(k[i])


def task_tags(task_set) -> list[str] | None:
    """Each task's difficulty tag, from a task set that holds its tasks (``meta["family"]``, else
    ``kind``), or None when the set does not iterate its tasks or all tags are equal."""
    if not hasattr(task_set, "__iter__"):
        return None
    tags = [str((getattr(t, "meta", None) or {}).get("family", getattr(t, "kind", ""))) for t in task_set]
    return tags if len(set(tags)) > 1 else None


class PassRateEstimate:
    """Decayed Beta-Binomial pass-rate evidence per task, with a learned population prior.

    Arrays of length T (number of tasks): ``successes`` and ``failures`` (float64, rollouts
    judged correct or not, decayed to model version ``version``; int64, -1 for a task never
    seen); ``first_rate``, ``first_informative``, ``first_version``: the pass rate, outcome
    (1.0 informative) and model version of each task's first group (the prior's evidence).
    Reading at model version V multiplies a task's counts by ``0.5 ** ((V - version) / half_life)``.

    Args:
        num_tasks: T.
        half_life: model versions after which evidence counts half; None keeps it forever.
        prior: ``"informative_share"`` (default, :func:`fit_prior_to_informative_share`) or
            ``"moments"`` (Kleinman's method of moments, :func:`fit_population_prior`).
    ``half_life`` and ``prior`` are settings (from the resampling policy), not state: they are
    not in :meth:`state_dict`.
    """

    FIELDS = ("successes", "failures")

    def __init__(self, num_tasks: int, half_life: float | None = 16.0, prior: str = "informative_share",
                 tags: list[str] | None = None):
        if prior not in ("informative_share", "moments"):
            raise ValueError(f"prior: expected 'informative_share' or 'moments', got {prior!r}")
        if tags is not None and len(tags) != num_tasks:
            raise ValueError(f"tags: expected one per task ({num_tasks}), got {len(tags)}")
        self.num_tasks = num_tasks
        names, codes = np.unique(np.asarray(tags if tags is not None else [""] * num_tasks, dtype=str), return_inverse=True)
        self.tag_names = [str(x) for x in names]
        self.tag = codes.astype(np.int64)  # (T,) index into tag_names
        self.half_life = half_life
        self.prior_fit = prior
        for name in self.FIELDS:
            setattr(self, name, np.zeros(num_tasks, dtype=np.float64))
        self.version = np.full(num_tasks, -1, dtype=np.int64)
        # each task's first group: pass rate, informative (0/1), model version (-1: none yet)
        self.first_rate = np.zeros(num_tasks, dtype=np.float64)
        self.first_informative = np.zeros(num_tasks, dtype=np.float64)
        self.first_version = np.full(num_tasks, -1, dtype=np.int64)
        self._changes = 0  # bumped by every change of the evidence: the key of the priors' cache
        self._priors_cache: tuple[tuple, tuple[np.ndarray, np.ndarray]] | None = None

    def task_tags(self) -> list[str] | None:
        """The tags given at construction (None when there was one tag)."""
        return [self.tag_names[i] for i in self.tag] if len(self.tag_names) > 1 else None

    def _decay(self, age: np.ndarray) -> np.ndarray:
        age = np.maximum(np.asarray(age, dtype=np.float64), 0.0)
        if self.half_life is None:
            return np.ones_like(age)
        return 0.5 ** (age / self.half_life)

    def observe(
        self, task_idx: np.ndarray, correct: np.ndarray, trials: np.ndarray, informative: np.ndarray, versions: np.ndarray
    ) -> None:
        """Add G groups of evidence.

        Args:
            task_idx: (G,) int64 in [0, T). A task may repeat.
            correct: (G,) int. Correct rollouts of each group.
            trials: (G,) int. Rollouts of each group.
            informative: (G,) bool. Whether the group was informative (0 < correct < trials, DAPO Eq. 11).
            versions: (G,) int64. Model version that produced each group.
        Each task's counts move to the newest version among its old counts and new groups
        (older evidence decayed to it); a group from an older version enters decayed too.
        """
        self._changes += 1
        t = np.asarray(task_idx, dtype=np.int64)
        v = np.asarray(versions, dtype=np.int64)
        c = np.asarray(correct, dtype=np.float64)
        m = np.asarray(trials, dtype=np.float64)
        uniq, first_at = np.unique(t, return_index=True)
        new = self.first_version[uniq] < 0
        f, g = uniq[new], first_at[new]
        self.first_rate[f] = c[g] / m[g]
        self.first_informative[f] = np.asarray(informative, dtype=np.float64)[g]
        self.first_version[f] = v[g]
        # only the tasks of these groups change (the others' decay factor would be 0.5 ** 0 = 1):
        # O(G) per call, whatever the number of tasks
        at = np.searchsorted(uniq, t)  # each group's row among the tasks it touches
        old_version = self.version[uniq]
        new_version = old_version.copy()
        np.maximum.at(new_version, at, v)
        keep = np.where(old_version >= 0, self._decay(new_version - old_version), 0.0)
        w = self._decay(new_version[at] - v)
        for name, x in (("successes", c), ("failures", m - c)):
            arr = getattr(self, name)
            rows = arr[uniq] * keep
            np.add.at(rows, at, w * x)
            arr[uniq] = rows
        self.version[uniq] = new_version

    def discount(self, task_idx: np.ndarray, factor: float) -> None:
        """Multiply the evidence of tasks ``task_idx`` ((G,) int64; a repeat discounts again) by
        ``factor`` in [0, 1], e.g. when their groups are trained on (their pass rate moves)."""
        self._changes += 1
        t = np.asarray(task_idx, dtype=np.int64)
        uniq = np.unique(t)
        w = np.ones(uniq.size, dtype=np.float64)
        np.multiply.at(w, np.searchsorted(uniq, t), factor)
        for name in self.FIELDS:
            getattr(self, name)[uniq] *= w

    def counts(self, model_version: int) -> dict[str, np.ndarray]:
        """Every field, (T,) float64, decayed to ``model_version``; 0 for tasks never seen."""
        w = np.where(self.version >= 0, self._decay(model_version - self.version), 0.0)
        return {name: getattr(self, name) * w for name in self.FIELDS}

    def prior(self, model_version: int, n: int, rows: np.ndarray | None = None) -> tuple[float, float]:
        """The population prior (a0, b0) at ``model_version`` for groups of n, over the tasks
        ``rows`` ((T,) bool; None: all).

        Tasks with at least one (decayed) rollout of evidence count, each once: the mean is
        the mean of their observed pass rates; the strength follows ``prior``. With fewer than
        two such tasks: :data:`UNIFORM_PRIOR`.
        """
        rows = np.ones(self.num_tasks, dtype=bool) if rows is None else rows
        c = self.counts(model_version)
        trials = c["successes"] + c["failures"]
        if self.prior_fit == "moments":
            return fit_population_prior(c["successes"][rows], trials[rows])
        seen = (self.first_version >= 0) & rows
        if int(seen.sum()) < 2:
            return UNIFORM_PRIOR
        w = self._decay(model_version - self.first_version[seen])
        mean = float(np.average(self.first_rate[seen], weights=w))
        share = float(np.average(self.first_informative[seen], weights=w))
        return fit_prior_to_informative_share(mean, share, n)

    def priors(self, model_version: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(a0, b0): (T,) float64 each, read-only, every task's prior: its tag's (fitted to that
        tag's tasks, once :data:`MIN_TAG_TASKS` of them were seen), else the population's
        (:meth:`prior`).

        Kept until the evidence, the model version, n or the settings change: a fit scans
        :data:`PRIOR_GRID` strengths per tag, and a round asks for the priors several times
        between two changes (the answer screen's top-ups: about two thirds of the actor's time in
        a comparison run went to refitting the same priors)."""
        key = (model_version, n, self.half_life, self.prior_fit, self._changes)
        if self._priors_cache is None or self._priors_cache[0] != key:
            a0, b0 = self._fit_priors(model_version, n)
            a0.flags.writeable = b0.flags.writeable = False
            self._priors_cache = (key, (a0, b0))
        return self._priors_cache[1]

    def _fit_priors(self, model_version: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        pop = self.prior(model_version, n)
        if len(self.tag_names) == 1:
            return np.full(self.num_tasks, pop[0]), np.full(self.num_tasks, pop[1])
        seen_per_tag = np.bincount(self.tag[self.first_version >= 0], minlength=len(self.tag_names))
        table = np.array([self.prior(model_version, n, self.tag == k) if seen_per_tag[k] >= MIN_TAG_TASKS else pop
                          for k in range(len(self.tag_names))])  # one fit per tag (a handful), not per task
        return table[self.tag, 0], table[self.tag, 1]

    def posterior(self, model_version: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(alpha, beta): (T,) float64 each, ``a0 + s_t`` and ``b0 + f_t`` at ``model_version``."""
        c = self.counts(model_version)
        a0, b0 = self.priors(model_version, n)
        return a0 + c["successes"], b0 + c["failures"]

    def informativeness(self, model_version: int, n: int) -> np.ndarray:
        """(T,) float64: predicted chance each task's next group of n is informative."""
        return informativeness(*self.posterior(model_version, n), n)

    def row(self, i: int, model_version: int, n: int) -> dict:
        """Plain view of task ``i`` (REST): posterior, its mean, evidence, predicted informativeness."""
        c = self.counts(model_version)
        a0s, b0s = self.priors(model_version, n)
        a0, b0 = float(a0s[i]), float(b0s[i])
        alpha, beta = a0 + c["successes"][i], b0 + c["failures"][i]
        return {
            "alpha": float(alpha),
            "beta": float(beta),
            "pass_rate_mean": float(alpha / (alpha + beta)),
            "evidence_rollouts": float(c["successes"][i] + c["failures"][i]),
            "predicted_informative": float(informativeness(np.array([alpha]), np.array([beta]), n)[0]),
            "seen": bool(self.version[i] >= 0),
            "tag": self.tag_names[int(self.tag[i])],
            "prior_alpha": a0,
            "prior_beta": b0,
        }

    STATE = {
        "successes": np.float64, "failures": np.float64, "version": np.int64, "first_rate": np.float64, "first_informative": np.float64, "first_version": np.int64,
    }

    def state_dict(self) -> dict:
        """By field, the (T,) arrays themselves, not copies (as torch's ``state_dict``): copy one to keep it past the next change (the core's :meth:`state_dict` makes them JSON lists)."""
        return {name: getattr(self, name) for name in self.STATE}

    def load_state_dict(self, state: dict) -> None:
        """Restore from copies of ``state``'s arrays; raises ValueError when one does not match the task count."""
        self._changes += 1
        for name, dtype in self.STATE.items():
            arr = np.array(state[name], dtype=dtype)
            if arr.shape != (self.num_tasks,):
                raise ValueError(f"passrate.{name}: expected {self.num_tasks} tasks, got shape {arr.shape}")
            setattr(self, name, arr)
