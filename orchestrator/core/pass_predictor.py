"""``pass_predictor``: epoch order, skipping tasks by a pass-rate model shared over all tasks.

Why. ``predicted_skip`` and ``greso_prior`` predict a task that has few groups of its own from
its difficulty tag (``meta["family"]``). On the Trinity route the orchestrator holds only row
indices (:class:`~orchestrator.tasks.taskset.IndexTaskSet`): no tags, so an unseen task is
predicted from the whole population, and a skip can only learn task by task (GRESO's streaks).
The answer screen, which predicts from the policy's likelihood of the reference answer, needs
the rollout engine and is refused there. This mode needs neither: it learns one model over the
tasks' *prompts*, from the group pass rates the orchestrator observes anyway.

The model. Like the value model of Prompt Curriculum Learning (Gao et al., arXiv 2510.01135,
Sec. 3: one network over all prompts, trained on-policy on the observed pass rates of the
groups just rolled out, predicting each prompt's pass rate before its rollouts), but without the
policy's hidden states (which the orchestrator does not have beside Trinity): a logistic
regression on hashed character n-grams of the prompt text (the hashing trick, Weinberger et al.,
ICML 2009), the prompt's features ``x_t`` L2-normalised, plus a bias::

    m_t = sigmoid(w . x_t + b)

fitted by penalised maximum likelihood to every task's *decayed* binomial evidence (``s_t``
correct and ``f_t`` wrong rollouts, each weighted ``0.5 ** ((V - v) / half_life)`` for a rollout of
model version v read at version V, as :class:`~orchestrator.core.passrate.PassRateEstimate`)::

    L(w) = sum_t [-s_t log m_t - f_t log(1 - m_t)] / sum_t (s_t + f_t)  +  l2 / 2 * |w|^2

with ``steps`` gradient-descent steps of size ``lr`` after each round of groups, warm-started
from the last weights (online: the decay makes it follow the policy as it learns). Tasks with
similar prompts (a family's operator, its number of digits, the words of a question) share the
pass rate the model predicts, so a few groups of a family move the prediction of all its
tasks, also of those it skipped (what a per-task history cannot do).

Each task's prediction then combines the model with the task's own decayed evidence, as an
empirical-Bayes prior whose mean comes from a regression on covariates (Gelman et al., *Bayesian
Data Analysis*, 3rd ed., Sec. 5.3 and Ch. 16)::

    p_t ~ Beta(k m_t + s_t, k (1 - m_t) + f_t),   k = prior_strength

and the chance ``I_t`` that its next group of n is informative is the Beta-Binomial predictive of
DAPO's Eq. 11 event (:func:`orchestrator.core.passrate.informativeness`).

Selection. Each epoch walks a seeded permutation of the tasks (``epoch``'s order); when a task's
turn comes it is rolled out with probability ``clip((I_t / keep_at) ** power, floor, 1)``
(:func:`orchestrator.core.passrate.keep_probability`), drawn from ``default_rng([seed, 5, epoch])``
(one uniform per task and epoch, so a checkpoint restores the same skips), and always when it
was passed over at its last ``max_skip_epochs`` turns (the bounded skip age). Skipped tasks keep
coming back three ways: the floor; the bounded age, which bounds how stale a task's own
evidence can get; and the model, which is refitted on the groups of the tasks that *are* rolled
out, so a drift of the policy on a family (forgetting, or learning) reaches the family's
skipped tasks. GRESO (arXiv 2506.02177) has only the first (its ``p_min``); its skip of a prompt
all-correct many times in a row falls to ``p_min ** z``.

Prediction quality is measured online, before each group is learned from: the Pearson
correlation and the Brier score between the predicted pass rate (the posterior mean) and the
group's observed pass rate (``metrics()``: ``prediction_corr``, ``prediction_brier``).

Prompts come from :class:`~orchestrator.core.selection.SelectionContext` ``prompts`` (the task
set's prompt texts; on the Trinity route the task selector reads them from Trinity's taskset,
:class:`~orchestrator.trinity.selector.OrchestratorTaskSelector`); without them, the task ids.
"""

from __future__ import annotations

import zlib

import numpy as np
from pydantic import Field

from orchestrator.core.passrate import informativeness, keep_probability
from orchestrator.core.registry import ModeOptions
from orchestrator.core.selection import EpochSelection, SelectionContext, register_selection

BUCKETS = 1024
"""Hashed feature buckets (the bias is one more weight). Small, since the weights are written to
the orchestrator's checkpoint with each commit (as a list: 1-d numpy arrays there are per-task
columns)."""
NGRAMS = (1, 2, 3)
"""Character n-gram lengths of the prompt text hashed into the features."""
SHAPE_NGRAMS = (3, 5)
"""Character n-gram lengths of the prompt's *shape* (every digit written ``0``) hashed into the
features too, and the whole shape as one more feature: the form of a problem (``000+000``,
``00,00``) independent of its numbers."""


class PassPredictorOptions(ModeOptions):
    """Options of ``pass_predictor`` (the policy's ``selection_options``; unknown keys refused)."""

    keep_at: float = Field(0.5, gt=0.0, le=1.0, description="Tasks predicted at least this informative are always rolled out.")
    floor: float = Field(0.05, ge=0.0, le=1.0, description="The least chance a task is rolled out at its turn (GRESO's p_min).")
    power: float = Field(3.0, gt=0.0, description="How sharply the keep chance falls below keep_at (1: in proportion; 3, "
                         "chosen on the reasoning regime's tuning seeds 100-101: docs/sampling-predictor.md).")
    max_skip_epochs: int = Field(3, ge=0, description="A task passed over at this many consecutive turns is rolled out at the next.")
    prior_strength: float = Field(4.0, gt=0.0, description="Rollouts the model's prediction counts for in a task's posterior.")
    half_life: float = Field(8.0, gt=0.0, description="Model versions after which a rollout's evidence counts half.")
    lr: float = Field(4.0, gt=0.0, le=16.0, description="Gradient-descent step size of the model fit.")
    steps: int = Field(32, ge=1, le=1000, description="Gradient steps after each round of groups.")
    l2: float = Field(1e-4, ge=0.0, description="L2 penalty on the model's weights.")


def prompt_features(texts: list[str], buckets: int = BUCKETS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hashed character n-grams of each text (:data:`NGRAMS`) and of its shape (:data:`SHAPE_NGRAMS`:
    the text with every digit written ``0``), as a sparse (T, buckets) matrix in CSR form.

    Each n-gram (a shape n-gram prefixed ``#``, the whole shape ``$``, so the kinds hash apart) is hashed with CRC-32 (stable across processes, unlike ``hash``) to a bucket; a
    text's row holds its n-gram counts per bucket, scaled to unit L2 norm (an empty text: an
    empty row).

    Args:
        texts: T strings.
    Returns:
        (indptr (T + 1,) int64, indices (nnz,) int64 in [0, buckets), values (nnz,) float64).
    """
    indptr, indices, values = [0], [], []
    for text in texts:
        shape = "".join("0" if ch.isdigit() else ch for ch in text)
        grams = [text[i:i + n] for n in NGRAMS for i in range(len(text) - n + 1)]
        grams += ["#" + shape[i:i + n] for n in SHAPE_NGRAMS for i in range(len(shape) - n + 1)] + ["$" + shape]
        cols, counts = np.unique(np.array([zlib.crc32(g.encode()) % buckets for g in grams], dtype=np.int64),
                                 return_counts=True)
        indices.append(cols)
        values.append(counts / np.sqrt(float((counts**2).sum())) if len(counts) else counts.astype(np.float64))
        indptr.append(indptr[-1] + len(cols))
    return (np.array(indptr, dtype=np.int64), np.concatenate(indices).astype(np.int64) if indices else np.zeros(0, np.int64),
            np.concatenate(values).astype(np.float64) if values else np.zeros(0))


def sparse_dot(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``X @ w`` for X in CSR form: (T,) float64 (0 for an empty row)."""
    prod = values * w[indices]
    out = np.zeros(len(indptr) - 1)
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    np.add.at(out, rows, prod)
    return out


def fit_logistic(w: np.ndarray, b: float, X: tuple, successes: np.ndarray, failures: np.ndarray, *, lr: float, steps: int,
                 l2: float) -> tuple[np.ndarray, float]:
    """``steps`` gradient-descent steps on the penalised binomial log-loss of the module docstring.

    Gradient: ``dL/dw = X^T ((s + f) * m - s) / N + l2 * w``, ``dL/db = sum((s + f) * m - s) / N``
    (the bias is not penalised), ``N = sum(s + f)``.

    Args:
        w: (D,) float64 weights, b: bias (the start; not changed in place).
        X: (indptr, indices, values), the (T, D) features (:func:`prompt_features`).
        successes, failures: (T,) float64 >= 0, decayed correct / wrong rollouts per task.
    Returns:
        (w, b) after the steps; unchanged when there is no evidence.
    """
    indptr, indices, values = X
    n = successes + failures
    total = float(n.sum())
    if total <= 0:
        return w, b
    w = w.copy()
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    for _ in range(steps):
        m = 1.0 / (1.0 + np.exp(-(sparse_dot(indptr, indices, values, w) + b)))
        r = (n * m - successes) / total  # (T,)
        grad = np.zeros_like(w)
        np.add.at(grad, indices, values * r[rows])
        w -= lr * (grad + l2 * w)
        b -= lr * float(r.sum())
    return w, b


@register_selection
class PassPredictorSelection(EpochSelection):
    """Epoch order; a task is rolled out with the keep chance of its predicted informativeness
    (see the module docstring), always after ``max_skip_epochs`` turns passed over.

    State: the epoch order's, the model (``weights``, ``bias``), each task's decayed evidence
    (``successes``, ``failures``: (T,) float64; ``version``: (T,) int64, -1 never seen),
    ``last_drawn`` ((T,) int64, the epoch each task was last rolled out in, -1 never), the counter
    ``forced`` (tasks rolled out by the skip-age bound) and the prediction-quality sums.
    """

    name = "pass_predictor"
    Options = PassPredictorOptions

    def __init__(self, num_tasks: int, seed: int = 0, options: ModeOptions | None = None, max_idle_epochs: int = 2):
        super().__init__(num_tasks, seed, options, max_idle_epochs)
        self.weights = np.zeros(BUCKETS, dtype=np.float64)
        self.bias = 0.0
        self.successes = np.zeros(num_tasks, dtype=np.float64)
        self.failures = np.zeros(num_tasks, dtype=np.float64)
        self.version = np.full(num_tasks, -1, dtype=np.int64)
        self.last_drawn = np.full(num_tasks, -1, dtype=np.int64)
        self.forced = 0
        # prediction quality: n, sum pred, sum obs, sum pred^2, sum obs^2, sum pred*obs, sum (pred - obs)^2
        self.quality = np.zeros(7, dtype=np.float64)
        self._features: tuple[int, tuple] | None = None  # (id of the texts, CSR matrix): derived, not state
        self._texts: list[str] | None = None
        self._model_version = 0

    # ------------------------------------------------------------------ settings and inputs
    def configure(self, policy, options: ModeOptions | None = None) -> None:
        """Takes its :class:`PassPredictorOptions` (validated by the policy) when this mode is active."""
        super().configure(policy, options)

    def _bind(self, ctx: SelectionContext) -> None:
        """Take the prompts and model version of ``ctx`` (features built once per prompt list)."""
        texts = ctx.prompts
        if texts is not None and len(texts) != self.num_tasks:
            raise ValueError(f"prompts: expected one per task ({self.num_tasks}), got {len(texts)}")
        if texts is not None and (self._features is None or self._features[0] != id(texts)):
            self._features = (id(texts), prompt_features(list(texts)))
            self._texts = texts  # keeps the id valid
        self._model_version = max(self._model_version, int(ctx.model_version))

    def _X(self) -> tuple:
        if self._features is None:  # no prompts yet: the bias alone
            self._features = (-1, prompt_features([""] * self.num_tasks))
        return self._features[1]

    # ------------------------------------------------------------------ predictions
    def _decayed(self, at_version: int) -> tuple[np.ndarray, np.ndarray]:
        """(s, f): (T,) float64, each task's evidence decayed to model version ``at_version``."""
        age = np.maximum(at_version - self.version, 0).astype(np.float64)
        d = np.where(self.version >= 0, 0.5 ** (age / self.options.half_life), 0.0)
        return self.successes * d, self.failures * d

    def model_pass_rate(self) -> np.ndarray:
        """(T,) float64: the shared model's pass rate ``m_t`` of each task, from its prompt alone."""
        return 1.0 / (1.0 + np.exp(-(sparse_dot(*self._X(), self.weights) + self.bias)))

    def posterior(self, at_version: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(alpha, beta): (T,) float64, ``k m_t + s_t`` and ``k (1 - m_t) + f_t`` at ``at_version``
        (default: the newest model version seen)."""
        s, f = self._decayed(self._model_version if at_version is None else at_version)
        k, m = self.options.prior_strength, self.model_pass_rate()
        return k * m + s, k * (1.0 - m) + f

    def predicted_informative(self, n: int) -> np.ndarray:
        """(T,) float64: predicted chance each task's next group of ``n`` is informative."""
        return informativeness(*self.posterior(), n)

    def keep(self, tasks: np.ndarray, ctx: SelectionContext) -> np.ndarray:
        """(k,) float64: the chance each of ``tasks`` is rolled out when its turn comes (1 when
        the skip-age bound forces it)."""
        self._bind(ctx)
        o = self.options
        p = keep_probability(self.predicted_informative(ctx.group_size)[tasks], o.keep_at, o.floor, o.power)
        return np.where(self._overdue(tasks), 1.0, p)

    def _overdue(self, tasks: np.ndarray) -> np.ndarray:
        """(k,) bool: passed over at their last ``max_skip_epochs`` turns (epochs), so due now."""
        return self._epoch - self.last_drawn[tasks] > self.options.max_skip_epochs

    # ------------------------------------------------------------------ the selection
    def eligible(self, tasks: np.ndarray, ctx: SelectionContext) -> np.ndarray:
        base = super().eligible(tasks, ctx)
        u = np.random.default_rng([self.seed, 5, self._epoch]).random(self.num_tasks)[tasks]
        return base & (u < self.keep(tasks, ctx))

    def select(self, count: int, ctx: SelectionContext) -> np.ndarray:
        chosen = super().select(count, ctx)
        if len(chosen):
            self.forced += int(self._overdue_at(chosen, self.picked_epochs).sum())
            self.last_drawn[chosen] = self.picked_epochs
        return chosen

    def _overdue_at(self, tasks: np.ndarray, epochs: np.ndarray) -> np.ndarray:
        return epochs - self.last_drawn[tasks] > self.options.max_skip_epochs

    def observe_rates(self, task_idx: np.ndarray, correct: np.ndarray, trials: np.ndarray, versions: np.ndarray) -> None:
        """Learn from G groups: score the predictions made before them, add their evidence
        (older evidence decayed to each task's newest version), refit the model.

        Args:
            task_idx: (G,) int64 in [0, T); correct, trials: (G,) int, correct / valid rollouts;
            versions: (G,) int64, the model version that produced each group.
        """
        t = np.asarray(task_idx, dtype=np.int64)
        c = np.asarray(correct, dtype=np.float64)
        m = np.asarray(trials, dtype=np.float64)
        v = np.asarray(versions, dtype=np.int64)
        ok = m > 0
        if not ok.any():
            return
        t, c, m, v = t[ok], c[ok], m[ok], v[ok]
        self._model_version = max(self._model_version, int(v.max()))
        alpha, beta = self.posterior()
        pred, obs = alpha[t] / (alpha[t] + beta[t]), c / m
        self.quality += [len(t), pred.sum(), obs.sum(), (pred**2).sum(), (obs**2).sum(), (pred * obs).sum(),
                         ((pred - obs) ** 2).sum()]
        for i, ci, mi, vi in zip(t.tolist(), c.tolist(), m.tolist(), v.tolist()):  # G groups, a task may repeat
            new = max(vi, int(self.version[i]))
            keep_old = 0.5 ** ((new - self.version[i]) / self.options.half_life) if self.version[i] >= 0 else 0.0
            add = 0.5 ** ((new - vi) / self.options.half_life)
            self.successes[i] = self.successes[i] * keep_old + ci * add
            self.failures[i] = self.failures[i] * keep_old + (mi - ci) * add
            self.version[i] = new
        s, f = self._decayed(self._model_version)
        o = self.options
        self.weights, self.bias = fit_logistic(self.weights, self.bias, self._X(), s, f, lr=o.lr, steps=o.steps, l2=o.l2)

    # ------------------------------------------------------------------ views and state
    def task_row(self, i: int, ctx: SelectionContext) -> dict:
        """The prediction for task ``i``: the model's pass rate from the prompt, the posterior's,
        the predicted chance of an informative group, the keep chance at its turn, and the
        evidence it rests on."""
        self._bind(ctx)
        alpha, beta = self.posterior()
        s, f = self._decayed(self._model_version)
        return {
            "model_pass_rate": float(self.model_pass_rate()[i]),
            "predicted_pass_rate": float(alpha[i] / (alpha[i] + beta[i])),
            "predicted_informative": float(informativeness(alpha[i:i + 1], beta[i:i + 1], ctx.group_size)[0]),
            "keep_probability": float(self.keep(np.array([i]), ctx)[0]),
            "own_evidence_rollouts": float(s[i] + f[i]),
            "epochs_since_drawn": int(self._epoch - self.last_drawn[i]) if self.last_drawn[i] >= 0 else -1,
        }

    def state_dict(self) -> dict:
        """Per-task columns as (T,) arrays (the core's store writes their changed rows); the model's
        weights as a list (not a per-task column)."""
        return {**super().state_dict(), "weights": self.weights.tolist(), "bias": self.bias,
                "successes": self.successes, "failures": self.failures, "version": self.version,
                "last_drawn": self.last_drawn, "forced": self.forced, "quality": self.quality.tolist(),
                "model_version": self._model_version}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` (copies).

        Raises:
            ValueError: a per-task column of another length, or weights of another size (named).
        """
        super().load_state_dict(state)
        for name, dtype, size in (("weights", np.float64, BUCKETS), ("successes", np.float64, self.num_tasks),
                                  ("failures", np.float64, self.num_tasks), ("version", np.int64, self.num_tasks),
                                  ("last_drawn", np.int64, self.num_tasks), ("quality", np.float64, 7)):
            arr = np.array(state[name], dtype=dtype)
            if arr.shape != (size,):
                raise ValueError(f"pass_predictor.{name}: expected shape ({size},), got {arr.shape}")
            setattr(self, name, arr)
        self.bias = float(state["bias"])
        self.forced = int(state["forced"])
        self._model_version = int(state["model_version"])

    def metrics(self) -> dict[str, float]:
        """The epoch order's, ``forced`` (tasks rolled out by the skip-age bound), and the prediction
        quality so far: ``prediction_corr`` (Pearson; absent before two groups or without spread),
        ``prediction_brier`` (mean squared error of the predicted pass rate; absent before a group),
        ``predictions_scored`` (groups scored)."""
        n, sp, so, spp, soo, spo, sq = self.quality.tolist()
        out = {**super().metrics(), "forced_revisits": float(self.forced), "predictions_scored": n}
        if n:
            out["prediction_brier"] = sq / n
            vp, vo = spp - sp**2 / n, soo - so**2 / n
            if n >= 2 and vp > 1e-12 and vo > 1e-12:
                out["prediction_corr"] = float((spo - sp * so / n) / np.sqrt(vp * vo))
        return out
