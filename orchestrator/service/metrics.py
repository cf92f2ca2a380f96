"""Prometheus metrics of the orchestrator, under the prefix ``dso_``.

Design: a prometheus-client registry inside the orchestrator actor's process, exposed as
text by the actor (``Orchestrator.metrics_text``) and served by the REST app at
``GET /metrics``. Why not Ray's metric API (``ray.util.metrics``, exported by each node's
metrics agent)?

* Ray's agent prefixes application metrics with ``ray_`` and adds per-process tags
  (``WorkerId``, ``SessionName``, ``NodeAddress``...): a restarted actor becomes new series,
  and our names would no longer be the ``dso_*`` the dashboard and alerts use.
* The agent exports on a timer (``metrics_report_interval_ms``, 10 s by default) from every
  node, so a scrape never shows the actor's exact counters at one instant, and users must
  scrape every Ray node (or use Ray's service discovery) to find one actor's numbers.
* One scrape target next to the REST API (the same port, the same Serve route, the same
  Kubernetes Service) is what users of this service already reach; the numbers are the
  actor's own cumulative counters (``OrchestratorCore.stats()``, which survive restarts
  through ``state_dict``), so a scrape is exact and cheap (one actor call).

The cost: metrics of code running outside the actor's process (e.g. a GiGPO advantage
worker writing to Redis in its own process) land in that process's registry, which nobody
scrapes unless that process serves it (``prometheus_client.start_http_server``). The actor
runs the anchor index's lifecycle (stats, drops, expiry), so those operations are covered;
the Redis operations it performs are timed by its index (``RedisAnchorIndex(observe=...)``),
a drop by expiry counting as ``delete``.

Metric names (``_total`` counters, base units: seconds, ratios 0..1; no task ids):

=======================================  =========  ==========================================
name                                     type       meaning
=======================================  =========  ==========================================
dso_groups_classified_total{outcome}     counter    groups judged by the filter, by outcome
                                                    (informative, all_correct, all_wrong, ...)
dso_groups_dropped_total{reason}         counter    groups finally dropped, by drop reason
                                                    (incl. ``stale`` carry-over)
dso_groups_emitted_total                 counter    informative groups released in batches
dso_groups_padded_total                  counter    dropped groups released as zero-weight padding
dso_groups_held                          gauge      groups held now (carry pool + padding candidates)
dso_groups_carried                       gauge      informative groups carried over (carry pool)
dso_rollouts_total{purpose}              counter    rollouts generated, purpose initial | replenish
dso_rollouts_wasted_total                counter    rollouts of dropped or padding groups
dso_replenish_rounds_total               counter    replenish rounds (submissions into a batch after its first)
dso_batches_total                        counter    batches emitted
dso_batches_partial_total                counter    batches emitted flagged partial
dso_cap_hits_total                       counter    batches closed at the replenish-round cap
dso_rollouts_screen_stopped_total        counter    rollouts of screens that stopped their group (screening)
dso_screens_stopped_total                counter    screens that stopped their group (not completed)
dso_answers_scored_total                 counter    tasks whose reference answer was scored (answer screen)
dso_answers_reused_total                 counter    tasks decided from a recent settled score, not scored again (answer screen)
dso_answer_skips_total                   counter    scored tasks not rolled out (answer screen)
dso_batch_replenish_rounds               histogram  replenish rounds spent per batch
dso_batch_fill_seconds                   histogram  wall time from a batch's first round to release
dso_keep_ratio                           gauge*     informative / classified groups (cumulative)
dso_predicted_keep_rate                  gauge      the keep rate used to size the next round
dso_reward_mean{groups}                  gauge*     mean rollout reward (cumulative), groups = all |
                                                    kept (informative) | trained (emitted, unmasked)
dso_coverage                             gauge*     trained / generated rollouts (cumulative)
dso_batch_reward_mean{groups}            gauge*     the same three means over the last batch's rounds
dso_batch_coverage                       gauge*     trained / generated rollouts of the last batch
dso_rollouts_masked_total                counter    members masked (invalid or stale): zero weight
dso_rollout_staleness_lag_versions       histogram  staleness lag of each trained rollout, in model
                                                    versions (batch's model version - rollout's)
dso_data_exhausted                       gauge      1 once max_epochs / max_rollouts end the data
dso_round_keep_rate{kind}                gauge*     last completed round's keep rate, kind = predicted
                                                    (mean predicted informativeness of its tasks) | realised
dso_round_groups_total                   counter    groups of completed rounds (planned and submitted)
dso_round_informative_groups_total{kind} counter    their informative groups, kind = predicted (sum of
                                                    predicted chances) | realised; ratio of the rates
                                                    to ``dso_round_groups_total`` = keep rate per window
dso_rollouts_dropped_ratio               gauge*     share of all rollouts spent on dropped or padding
                                                    groups (rollouts_wasted / rollouts, cumulative)
dso_replenish_paused                     gauge      1 while replenishment is paused
dso_resampling_policy_revision           gauge      revision counter of the resampling policy
dso_resampling_policy_info{...}          gauge (1)  the resampling policy's settings as labels
dso_model_version                       gauge      newest model weights version seen
dso_anchor_index_entries                 gauge      anchor states held by the anchor index
dso_anchor_group_size                    histogram  size of each anchor-state group formed
dso_redis_op_duration_seconds{op}        histogram  Redis operation latency
dso_redis_op_errors_total{op}            counter    failed Redis operations
dso_errors_total{kind}                   counter    failures: commit, anchor_index, health_watch (the
                                                    actor's), operator, selector (reported by Trinity's)
dso_train_steps_total                    counter    train batches (rollout steps) reported by a trainer
dso_train_entropy_nats                   gauge*     policy entropy, token mean over the last batch
dso_train_pg_clipfrac{bound}             gauge*     share of response tokens clipped, bound = upper |
                                                    lower | dual
dso_train_kl_ref_nats                    gauge*     KL(pi || initial policy), k3 token mean
dso_train_reward_mean                    gauge*     mean reward of the last train batch
dso_train_reward_group_std               gauge*     mean within-group reward std of the last batch
dso_train_heldout_accuracy               gauge*     held-out accuracy (avg@k) at the last evaluation
dso_train_model_version                  gauge*     model version after the trainer's last weight sync
dso_train_success_rate                   gauge*     GiGPO: trajectories reaching the goal in the last batch
dso_train_heldout_success_rate           gauge*     GiGPO: success rate on held-out tasks at the last evaluation
dso_train_episode_length_steps           gauge*     GiGPO: mean trajectory length of the last batch
dso_gigpo_anchor_group_fraction          gauge*     GiGPO: steps in anchor groups of size > 1, last batch
dso_gigpo_step_advantage_abs_mean        gauge*     GiGPO: mean |A^S| of the last batch
dso_gigpo_episode_advantage_abs_mean     gauge*     GiGPO: mean |A^E| of the last batch
dso_train_weight_sync_seconds            histogram  time of one weight load into the rollout engine
=======================================  =========  ==========================================

``gauge*``: absent (no sample at all, not NaN, not 0) while undefined, e.g. the kept-group
reward before any group was kept or when every group of the last batch was dropped; a
dashboard then shows a gap rather than a made-up value.

Vocabulary: "model version" is the *model weights* version that produced a rollout
(``dso_model_version``); the resampling policy's change counter is the *revision*
(``dso_resampling_policy_revision``, the REST API's ETag).

Counters advance by deltas between successive ``stats()`` snapshots. If a snapshot ever
goes backwards (a checkpoint from an older run), the counter is left alone and the new
value becomes the baseline.

Process-level anchor hooks, for code that holds no :class:`DSOMetrics` (e.g. a worker
process): :func:`observe_redis_op`, :func:`set_anchor_entries`,
:func:`observe_anchor_group_sizes`, :func:`set_anchor_stats`, and the :func:`redis_op`
context manager. They record into the process's current :class:`DSOMetrics` (the one the
actor was given, or a default one created on first use).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from orchestrator.core.machine import rollout_lags
from orchestrator.core.outcomes import GroupOutcome
from orchestrator.core.stats import Stats

PREFIX = "dso"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Content type of :meth:`DSOMetrics.exposition` (Prometheus text format 0.0.4)."""

OUTCOMES: tuple[str, ...] = tuple(r.label for r in GroupOutcome)
"""Label values of ``outcome`` (filter outcomes, ``orchestrator.core.outcomes.GroupOutcome``)."""
DROP_REASONS: tuple[str, ...] = tuple(r.label for r in GroupOutcome if r != GroupOutcome.INFORMATIVE)
"""Label values of ``reason`` on ``dso_groups_dropped_total``."""
PURPOSES: tuple[str, ...] = ("initial", "replenish")
KEEP_KINDS: tuple[str, ...] = ("predicted", "realised")
"""Label values of ``kind`` on the round keep-rate metrics."""
REWARD_GROUPS: tuple[str, ...] = ("all", "kept", "trained")
REDIS_OPS: tuple[str, ...] = ("insert", "query", "complete", "stats", "delete", "ping", "other")
"""Label values of ``op`` on the Redis metrics; any other name is recorded as ``other``."""
ERROR_KINDS: tuple[str, ...] = ("commit", "anchor_index", "health_watch", "operator", "selector")
"""Label values of ``kind`` on ``dso_errors_total``: a failed state commit, a failed anchor-index
operation of the actor, an unexpected error of the Redis health check, and failures reported by
the Trinity operator and task selector (``Orchestrator.report_error``)."""

ROUNDS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
FILL_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
ANCHOR_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128)
LAG_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32)
REDIS_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

POLICY_INFO_FIELDS = (
    "target_groups",
    "group_size",
    "max_replenish_rounds",
    "on_cap",
    "replenish",
    "selection",
    "replenish_paused",
    "min_keep_rate",
    "max_staleness",
    "filter_judge",
    "filter_band",
)
"""Labels of ``dso_resampling_policy_info`` (a handful of settings; one series at a time)."""

# stats() key -> counter attribute (unlabelled counters)
_SIMPLE_COUNTERS = {
    "groups_emitted": "groups_emitted",
    "groups_padded": "groups_padded",
    "rollouts_wasted": "rollouts_wasted",
    "replenish_rounds": "replenish_rounds",
    "batches_emitted": "batches",
    "batches_partial": "batches_partial",
    "cap_hits": "cap_hits",
    "rollouts_screen_stopped": "rollouts_screen_stopped",
    "screens_stopped": "screens_stopped",
    "answers_scored": "answers_scored",
    "answers_reused": "answers_reused",
    "answer_skips": "answer_skips",
}


TRAIN_GAUGES: dict[str, tuple[str, str | None]] = {
    f"{PREFIX}_train_entropy_nats": ("Policy entropy on response tokens, token mean of the last train batch, nats.", None),
    f"{PREFIX}_train_pg_clipfrac": ("Share of response tokens where the clip was active (0..1), by bound (upper, lower, dual).", "bound"),
    f"{PREFIX}_train_kl_ref_nats": ("KL divergence of the policy to the initial policy (k3 estimator, token mean), nats.", None),
    f"{PREFIX}_train_reward_mean": ("Mean rollout reward of the last train batch.", None),
    f"{PREFIX}_train_reward_group_std": ("Mean within-group reward standard deviation of the last train batch.", None),
    f"{PREFIX}_train_heldout_accuracy": ("Held-out accuracy (avg@k, 0..1) at the last evaluation.", None),
    f"{PREFIX}_train_model_version": ("Model weights version after the trainer's last weight sync.", None),
    f"{PREFIX}_train_success_rate": ("Agent trajectories reaching the goal (0..1) in the last train batch (GiGPO).", None),
    f"{PREFIX}_train_heldout_success_rate": ("Agent success rate (0..1) on held-out tasks at the last evaluation (GiGPO).", None),
    f"{PREFIX}_train_episode_length_steps": ("Mean agent trajectory length of the last train batch, environment steps (GiGPO).", None),
    f"{PREFIX}_gigpo_anchor_group_fraction": ("Share of steps whose anchor-state group has more than one member (0..1), last batch.", None),
    f"{PREFIX}_gigpo_step_advantage_abs_mean": ("Mean |A^S| (GiGPO step advantage, Eq. 7) of the last batch.", None),
    f"{PREFIX}_gigpo_episode_advantage_abs_mean": ("Mean |A^E| (GiGPO episode advantage, Eq. 3) of the last batch.", None),
}
"""The trainer's gauges: absent until a trainer reports (``Orchestrator.report_training``)."""
SYNC_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class OptionalGauges:
    """Gauges whose series are absent while undefined (a prometheus-client custom collector).

    ``set(name, None)`` removes the series; ``set(name, x)`` sets it. Each family is always
    described (HELP and TYPE lines), so its name is known before the first sample.

    Args:
        specs: ``{name: (help, label name or None)}``.
    """

    def __init__(self, specs: dict[str, tuple[str, str | None]]):
        self.specs = specs
        self.values: dict[tuple[str, str], float] = {}

    def set(self, name: str, value: float | None, label: str = "") -> None:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            self.values.pop((name, label), None)
        else:
            self.values[(name, label)] = float(value)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        for name, (doc, label) in self.specs.items():
            fam = GaugeMetricFamily(name, doc, labels=[label] if label else None)
            for (n, lv), v in sorted(self.values.items()):
                if n == name:
                    fam.add_metric([lv] if label else [], v)
            yield fam


class ArrayHistogram:
    """A histogram fed a whole array per call (a prometheus-client custom collector).

    prometheus-client's ``Histogram.observe`` takes one value per call, under a lock, with
    its bucket found in Python: for the rollout lags of a released batch, more than the
    orchestrator's whole work on the call that released it (see bench/README.md, "The actor's
    heap and histograms").
    :meth:`observe_many` bins an array at once: ``np.searchsorted(bounds, values, "left")``
    puts a value equal to a bound in that bound's bucket, as Prometheus' ``le`` (less than or
    equal) does, and ``np.bincount`` counts each bucket. :meth:`collect` exposes what
    ``Histogram`` exposes (cumulative ``_bucket{le}`` with ``+Inf``, ``_count``, ``_sum``),
    except its ``_created`` timestamp.

    Args:
        name, documentation: the family's name (without ``_bucket``) and its HELP text.
        buckets: the upper bounds, increasing (``+Inf`` is added).
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]):
        self.name, self.documentation = name, documentation
        self.bounds = np.asarray([float(b) for b in buckets], dtype=np.float64)
        if self.bounds.size == 0 or (np.diff(self.bounds) <= 0).any():
            raise ValueError(f"buckets: expected increasing bounds, got {list(buckets)}")
        self.counts = np.zeros(self.bounds.size + 1, dtype=np.int64)  # the last: above every bound (+Inf)
        self.total = 0.0
        self._lock = threading.Lock()  # the anchor hooks may observe from a worker thread

    def observe_many(self, values: Any) -> None:
        """Count every value of ``values`` (array-like of numbers; NaN counts in ``+Inf`` only, as in ``Histogram``)."""
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        if v.size == 0:
            return
        counts = np.bincount(np.searchsorted(self.bounds, v, side="left"), minlength=self.counts.size)
        with self._lock:
            self.counts += counts
            self.total += float(v.sum())

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        with self._lock:
            cumulative, total = self.counts.cumsum().tolist(), self.total
        les = [*map(floatToGoString, self.bounds.tolist()), "+Inf"]
        yield HistogramMetricFamily(self.name, self.documentation, buckets=list(zip(les, cumulative)), sum_value=total)


class DSOMetrics:
    """The orchestrator's metrics (the ``metrics=`` hook of :class:`orchestrator.service.actor.Orchestrator`).

    The prometheus-client objects are created lazily, on first use, in the process that
    uses them: an instance is cheap to build in a driver and pickles (without its registry)
    into the actor. Every labelled series is created at 0 when the metrics are created, so
    dashboards and ``rate()`` see them before the first event.

    Args:
        registry: a ``prometheus_client.CollectorRegistry``; None creates a private one
            (the process-global default registry is never touched).
        make_current: become the target of the module-level anchor/Redis hooks in the
            process where the metrics are first used.
    """

    def __init__(self, registry: Any = None, *, make_current: bool = True):
        self._registry = registry
        self._make_current = make_current
        self._m: dict[str, Any] | None = None
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()  # built once: the actor's loop, its commit and Redis threads may come first

    # -------------------------------------------------------------- pickling
    def __getstate__(self) -> dict:
        if self._m is not None:
            raise TypeError("DSOMetrics cannot be pickled once its metrics exist (create it fresh for the actor)")
        return {"_registry": None, "_make_current": self._make_current, "_m": None, "_last": {}}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -------------------------------------------------------------- creation
    @property
    def registry(self) -> Any:
        """The registry (created on first access)."""
        self._ensure()
        return self._registry

    def _ensure(self) -> dict[str, Any]:
        if self._m is not None:
            return self._m
        with self._lock:  # once, whichever thread comes first (two builds would register every name twice)
            if self._m is None:
                self._build()
        return self._m

    def _build(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

        if self._registry is None:
            self._registry = CollectorRegistry(auto_describe=True)
        r = self._registry
        p = PREFIX
        m: dict[str, Any] = {
            "groups_classified": Counter(f"{p}_groups_classified", "Groups judged by the dynamic-sampling filter, by outcome.", ["outcome"], registry=r),
            "groups_dropped": Counter(f"{p}_groups_dropped", "Groups dropped for good, by drop reason.", ["reason"], registry=r),
            "groups_emitted": Counter(f"{p}_groups_emitted", "Informative groups released in train batches.", registry=r),
            "groups_padded": Counter(f"{p}_groups_padded", "Dropped groups released as zero-weight padding.", registry=r),
            "groups_held": Gauge(f"{p}_groups_held", "Groups held now: carry pool plus padding candidates.", registry=r),
            "groups_carried": Gauge(f"{p}_groups_carried", "Informative groups carried over to the next batch (carry pool).", registry=r),
            "rollouts": Counter(f"{p}_rollouts", "Rollouts generated, by purpose (initial or replenish round).", ["purpose"], registry=r),
            "rollouts_wasted": Counter(f"{p}_rollouts_wasted", "Rollouts of dropped or padding groups.", registry=r),
            "replenish_rounds": Counter(f"{p}_replenish_rounds", "Replenish rounds: submissions into a batch that already had one (counted the same with or without Trinity).", registry=r),
            "batches": Counter(f"{p}_batches", "Train batches emitted.", registry=r),
            "batches_partial": Counter(f"{p}_batches_partial", "Train batches emitted flagged partial.", registry=r),
            "cap_hits": Counter(f"{p}_cap_hits", "Batches closed at the replenish-round cap.", registry=r),
            "rollouts_screen_stopped": Counter(f"{p}_rollouts_screen_stopped", "Rollouts of screens that stopped their group.", registry=r),
            "screens_stopped": Counter(f"{p}_screens_stopped", "Screens that stopped their group (screening).", registry=r),
            "answers_scored": Counter(f"{p}_answers_scored", "Tasks whose reference answer was scored (answer screen; no rollout).", registry=r),
            "answers_reused": Counter(f"{p}_answers_reused", "Tasks decided from a recent settled score, not scored again (answer screen).", registry=r),
            "answer_skips": Counter(f"{p}_answer_skips", "Scored tasks not rolled out (answer screen).", registry=r),
            "batch_rounds": Histogram(f"{p}_batch_replenish_rounds", "Replenish rounds spent per emitted batch.", buckets=ROUNDS_BUCKETS, registry=r),
            "batch_fill": Histogram(f"{p}_batch_fill_seconds", "Wall time from a batch's first round to its release, in seconds.", buckets=FILL_SECONDS_BUCKETS, registry=r),
            "rollouts_masked": Counter(f"{p}_rollouts_masked", "Rollouts masked (invalid or stale members): zero loss weight, out of the baseline.", registry=r),
            "staleness": ArrayHistogram(f"{p}_rollout_staleness_lag_versions", "Staleness lag of each trained rollout when its batch was assembled, in model versions.", LAG_BUCKETS),
            "exhausted": Gauge(f"{p}_data_exhausted", "1 once max_epochs or max_rollouts allow no further round, else 0.", registry=r),
            "predicted_keep_rate": Gauge(f"{p}_predicted_keep_rate", "Laplace-smoothed keep rate that sizes the next round (0..1).", registry=r),
            "round_groups": Counter(f"{p}_round_groups", "Groups of completed rounds (planned by the orchestrator and submitted).", registry=r),
            "round_informative": Counter(f"{p}_round_informative_groups", "Informative groups of completed rounds: predicted (sum of predicted chances) or realised.", ["kind"], registry=r),
            "optional": OptionalGauges({
                f"{p}_keep_ratio": ("Share of classified groups that were informative (cumulative, 0..1; absent before any).", None),
                f"{p}_reward_mean": ("Mean rollout reward (cumulative): all classified groups, kept (informative) groups, trained rollouts; absent while undefined.", "groups"),
                f"{p}_coverage": ("Trained / generated rollouts (cumulative, 0..1; absent before any).", None),
                f"{p}_batch_reward_mean": ("Mean rollout reward over the last batch's rounds: all, kept, trained; absent while undefined.", "groups"),
                f"{p}_batch_coverage": ("Trained / generated rollouts of the last batch (0..1; absent before any).", None),
                f"{p}_round_keep_rate": ("Keep rate of the last completed round: predicted (mean predicted informativeness of its tasks) or realised (0..1; absent before any).", "kind"),
                f"{p}_rollouts_dropped_ratio": ("Share of all rollouts spent on dropped or padding groups (cumulative, 0..1; absent before any).", None),
                **TRAIN_GAUGES,
            }),
            "train_steps": Counter(f"{p}_train_steps", "Train batches (rollout steps) reported by the trainer.", registry=r),
            "train_sync_seconds": Histogram(f"{p}_train_weight_sync_seconds", "Time to load the trainer's weights into the rollout engine, seconds.", buckets=SYNC_SECONDS_BUCKETS, registry=r),
            "replenish_paused": Gauge(f"{p}_replenish_paused", "1 while replenish rounds are paused, else 0.", registry=r),
            "policy_revision": Gauge(f"{p}_resampling_policy_revision", "Revision counter of the resampling policy (bumped by every accepted change; the REST ETag). Not the model weights version.", registry=r),
            "policy_info": Info(f"{p}_resampling_policy", "Current resampling policy settings.", registry=r),
            "model_version": Gauge(f"{p}_model_version", "Newest model weights version (model version) seen by the orchestrator.", registry=r),
            "anchor_entries": Gauge(f"{p}_anchor_index_entries", "Anchor states held by the anchor-state index.", registry=r),
            "anchor_sizes": ArrayHistogram(f"{p}_anchor_group_size", "Size (steps) of each anchor-state group formed.", ANCHOR_SIZE_BUCKETS),
            "redis_seconds": Histogram(f"{p}_redis_op_duration_seconds", "Latency of Redis operations of the anchor index, in seconds.", ["op"], buckets=REDIS_SECONDS_BUCKETS, registry=r),
            "redis_errors": Counter(f"{p}_redis_op_errors", "Failed Redis operations of the anchor index.", ["op"], registry=r),
            "anchor_outages": Counter(f"{p}_anchor_index_outages", "Outages of the Redis anchor index seen by the orchestrator's health check (up -> down).", registry=r),
            "errors": Counter(f"{p}_errors", "Failures seen by the orchestrator or reported to it, by kind (commit, anchor_index, health_watch, operator, selector).", ["kind"], registry=r),
        }
        for v in ERROR_KINDS:
            m["errors"].labels(kind=v)
        for v in OUTCOMES:
            m["groups_classified"].labels(outcome=v)
        for v in DROP_REASONS:
            m["groups_dropped"].labels(reason=v)
        for v in PURPOSES:
            m["rollouts"].labels(purpose=v)
        for name in ("optional", "staleness", "anchor_sizes"):
            r.register(m[name])
        for v in KEEP_KINDS:
            m["round_informative"].labels(kind=v)
        for v in REDIS_OPS:
            m["redis_seconds"].labels(op=v)
            m["redis_errors"].labels(op=v)
        self._m = m
        if self._make_current:
            set_current(self)

    # -------------------------------------------------------------- actor hooks
    def _advance(self, counter: Any, key: str, value: float) -> None:
        last = self._last.get(key)
        if last is not None and value > last:
            counter.inc(value - last)
        elif last is None and value > 0:
            counter.inc(value)
        self._last[key] = value

    def update(self, stats: Stats, policy: Any = None) -> None:
        """Bring every metric up to a :class:`~orchestrator.core.stats.Stats` snapshot.

        Args:
            stats: the snapshot (cumulative counters; ``OrchestratorCore.stats()``).
            policy: the current :class:`orchestrator.core.policy.ResamplingPolicy` (for the info metric).
        """
        m = self._ensure()
        for key, attr in _SIMPLE_COUNTERS.items():
            self._advance(m[attr], key, getattr(stats, key))
        for outcome, n in stats.classified_by_reason.items():
            self._advance(m["groups_classified"].labels(outcome=outcome), f"classified:{outcome}", n)
        for reason, n in stats.dropped_by_reason.items():
            self._advance(m["groups_dropped"].labels(reason=reason), f"dropped:{reason}", n)
        self._advance(m["rollouts"].labels(purpose="initial"), "rollouts_initial", stats.rollouts_initial)
        self._advance(m["rollouts"].labels(purpose="replenish"), "rollouts_replenish", stats.rollouts_replenish)
        self._advance(m["round_groups"], "round_groups", stats.round_groups)
        self._advance(m["round_informative"].labels(kind="predicted"), "round_predicted", stats.round_predicted_informative)
        self._advance(m["round_informative"].labels(kind="realised"), "round_realised", stats.round_realised_informative)
        m["groups_held"].set(stats.groups_held)
        m["groups_carried"].set(stats.groups_carried)
        self._advance(m["rollouts_masked"], "rollouts_masked", stats.rollouts_masked)
        m["predicted_keep_rate"].set(stats.predicted_keep_rate)
        m["exhausted"].set(1 if stats.exhausted else 0)
        opt, p = m["optional"], PREFIX
        opt.set(f"{p}_keep_ratio", stats.keep_ratio)
        opt.set(f"{p}_coverage", stats.coverage)
        opt.set(f"{p}_rollouts_dropped_ratio", stats.rollouts_dropped_share)
        rnd = stats.last_round
        opt.set(f"{p}_round_keep_rate", rnd.predicted_keep_rate if rnd else None, "predicted")
        opt.set(f"{p}_round_keep_rate", rnd.realised_keep_rate if rnd else None, "realised")
        last = stats.last_batch
        opt.set(f"{p}_batch_coverage", last.coverage if last else None)
        for g in REWARD_GROUPS:
            opt.set(f"{p}_reward_mean", getattr(stats, f"mean_reward_{g}"), g)
            opt.set(f"{p}_batch_reward_mean", getattr(last, f"mean_reward_{g}") if last else None, g)
        m["replenish_paused"].set(1 if stats.replenish_paused else 0)
        m["policy_revision"].set(stats.policy_revision)
        m["model_version"].set(stats.model_version)
        if policy is not None:
            m["policy_info"].info(policy_labels(policy))

    def update_training(self, metrics: dict) -> None:
        """Record one trainer step (``orchestrator.train.trainer.PolicyTrainer.train_batch``'s
        metrics plus ``heldout_acc``, ``model_version``, ``sync_seconds`` when present)."""
        m = self._ensure()
        m["train_steps"].inc()
        for key, name in (("entropy", "entropy_nats"), ("kl_ref", "kl_ref_nats"), ("reward_mean", "reward_mean"),
                          ("reward_std_group", "reward_group_std"), ("heldout_acc", "heldout_accuracy"),
                          ("model_version", "model_version"), ("success_rate", "success_rate"),
                          ("heldout_success", "heldout_success_rate"), ("episode_length", "episode_length_steps")):
            if metrics.get(key) is not None:
                m["optional"].set(f"{PREFIX}_train_{name}", float(metrics[key]))
        for key, name in (("anchor_group_fraction", "anchor_group_fraction"), ("mean_abs_step_advantage", "step_advantage_abs_mean"),
                          ("mean_abs_episode_advantage", "episode_advantage_abs_mean")):
            if metrics.get(key) is not None:
                m["optional"].set(f"{PREFIX}_gigpo_{name}", float(metrics[key]))
        for key, bound in (("pg_clipfrac", "upper"), ("pg_clipfrac_lower", "lower"), ("pg_clipfrac_dual", "dual")):
            if metrics.get(key) is not None:
                m["optional"].set(f"{PREFIX}_train_pg_clipfrac", float(metrics[key]), bound)
        if metrics.get("sync_seconds") is not None:
            m["train_sync_seconds"].observe(max(0.0, float(metrics["sync_seconds"])))

    def observe_batch(self, batch: Any) -> None:
        """Record one emitted batch: its replenish rounds and its fill time (seconds)."""
        m = self._ensure()
        m["batch_rounds"].observe(batch.rounds)
        m["staleness"].observe_many(rollout_lags(batch))
        m["batch_fill"].observe(max(0.0, float(batch.fill_seconds)))

    # -------------------------------------------------------------- anchor index hooks
    def observe_redis_op(self, op: str, seconds: float, error: bool = False) -> None:
        """One Redis operation: its latency (seconds) and whether it failed.

        ``op`` should be one of :data:`REDIS_OPS`; anything else is recorded as ``other``.
        """
        m = self._ensure()
        op = op if op in REDIS_OPS else "other"
        m["redis_seconds"].labels(op=op).observe(max(0.0, float(seconds)))
        if error:
            m["redis_errors"].labels(op=op).inc()

    def set_anchor_index_up(self, up: bool) -> None:
        """The Redis anchor index's health: 1 up, 0 down; a transition up -> down counts an outage.

        ``dso_anchor_index_up`` exists from the first health check on (absent without a Redis index).
        """
        m = self._ensure()
        with self._lock:
            if "anchor_up" not in m:
                from prometheus_client import Gauge

                m["anchor_up"] = Gauge(f"{PREFIX}_anchor_index_up", "1 while the Redis anchor index answers the "
                                       "orchestrator's health check, 0 during an outage.", registry=self._registry)
        if not up and self._last.get("anchor_up") == 1.0:
            m["anchor_outages"].inc()
        m["anchor_up"].set(1.0 if up else 0.0)
        self._last["anchor_up"] = 1.0 if up else 0.0

    def count_error(self, kind: str) -> None:
        """One failure of ``kind`` (one of :data:`ERROR_KINDS`; anything else counts as ``operator``)."""
        self._ensure()["errors"].labels(kind=kind if kind in ERROR_KINDS else "operator").inc()

    def set_anchor_entries(self, entries: int) -> None:
        """Anchor states currently held by the index."""
        self._ensure()["anchor_entries"].set(entries)

    def observe_anchor_group_sizes(self, sizes: Iterable[int]) -> None:
        """Sizes (steps per group) of anchor groups just formed; call once per group formed."""
        self._ensure()["anchor_sizes"].observe_many(list(sizes))

    # -------------------------------------------------------------- exposition
    def exposition(self) -> str:
        """The registry in Prometheus text format 0.0.4 (see :data:`CONTENT_TYPE`)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


def policy_labels(policy: Any) -> dict[str, str]:
    """Label values of ``dso_resampling_policy_info`` for a ResamplingPolicy (or its dict)."""
    d = policy if isinstance(policy, dict) else policy.model_dump(mode="json")
    f = d.get("filter", {})
    out = {}
    for name in POLICY_INFO_FIELDS:
        value = f.get(name[len("filter_"):]) if name.startswith("filter_") else d.get(name)
        out[name] = "" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
    return out


# ------------------------------------------------------------------ process-wide hooks

_current: DSOMetrics | None = None


def set_current(metrics: DSOMetrics) -> None:
    """Make ``metrics`` the target of the module-level hooks in this process."""
    global _current
    _current = metrics


def current() -> DSOMetrics:
    """The process's current metrics (the actor's, or a default one created now)."""
    global _current
    if _current is None:
        _current = DSOMetrics()
    return _current


def observe_redis_op(op: str, seconds: float, error: bool = False) -> None:
    """Record one Redis operation of the anchor index (see :meth:`DSOMetrics.observe_redis_op`)."""
    current().observe_redis_op(op, seconds, error)


@contextmanager
def redis_op(op: str) -> Iterator[None]:
    """Time a Redis operation; an exception counts as an error and propagates.

    Example::

        with metrics.redis_op("insert"):
            pipe.execute()
    """
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        observe_redis_op(op, time.perf_counter() - start, error=True)
        raise
    observe_redis_op(op, time.perf_counter() - start)


def set_anchor_entries(entries: int) -> None:
    current().set_anchor_entries(entries)


def observe_anchor_group_sizes(sizes: Iterable[int]) -> None:
    current().observe_anchor_group_sizes(sizes)


def set_anchor_stats(entries: int, sizes: Sequence[int] = ()) -> None:
    """Anchor index statistics: ``entries`` anchor states held, ``sizes`` of groups just formed."""
    m = current()
    m.set_anchor_entries(entries)
    m.observe_anchor_group_sizes(sizes)
