"""``dso_gigpo_index``: ``dso_gigpo`` with the statistics taken from the orchestrator's shared
anchor index (in memory behind the orchestrator's Ray actor, or in Redis), so that the
advantage workers of one run share the anchor and episode groups.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import ray
from trinity.algorithm.advantage_fn import AdvantageFn
from trinity.buffer.operators import ExperienceOperatorV1
from trinity.common.experience import Experience as TrinityExperience

from algos.checks import check_number
from algos.gigpo import InvalidStepError, discounted_returns, encode_keys
from algos.groups import first_rows, group_value_order
from orchestrator.anchors.index import AnchorIndex, trajectory_records
from orchestrator.anchors.owner import orchestrator_anchor_index
from orchestrator.anchors.redis_index import RedisAnchorIndex
from orchestrator.anchors.remote import RemoteAnchorIndex
from orchestrator.service.names import DEFAULT_NAME
from orchestrator.trinity.advantage.gigpo import GIGPO_ARGS, DsoGiGPOAdvantageFn, refuse_unknown
from orchestrator.trinity.attach import OrchestratorNotFoundError, find_orchestrator
from orchestrator.trinity.fields import NO_INFO, MemoryOrder, masked_rows
from orchestrator.trinity.writeback import TokenMasks, write_token_advantages

EPISODE_SUFFIX = ":episode"
"""Batch-key suffix under which the trajectories' total rewards are stored (one record each)."""
EPISODE_STATE = "episode"


class DsoGiGPOIndexAdvantageFn(AdvantageFn, ExperienceOperatorV1):
    """``dso_gigpo_index``: :class:`orchestrator.trinity.advantage.gigpo.DsoGiGPOAdvantageFn` with the statistics
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
        ValueError: GiGPO arguments or timeouts that are not finite or out of range (named).
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
        refuse_unknown("dso_gigpo_index", gigpo, list(GIGPO_ARGS) + own)
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
        if group_size is not None:
            check_number("group_size", group_size, ge=1, integer=True)
        check_number("ttl_s", ttl_s, gt=0.0)
        check_number("wait_timeout_s", wait_timeout_s, ge=0.0)
        check_number("lookup_timeout_s", lookup_timeout_s, ge=0.0)
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
    def compute(self, exps: list[TrinityExperience], order: MemoryOrder | None = None) -> dict[str, np.ndarray]:
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
        order = group_value_order(r.traj, ep_reward)  # canonical summation order, as algos.gigpo
        totals = np.bincount(r.traj[order], weights=ep_reward[order], minlength=num_traj)
        first_row = first_rows(r.traj, num_traj)
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
        order = MemoryOrder(exps)  # shared by the reading and the write-back
        masked = masked_rows(exps, order)
        if masked is not None:
            k = int(np.flatnonzero(masked)[0])
            raise InvalidStepError(
                f"dso_gigpo_index: {int(masked.sum())} steps of members the orchestrator masked (first: row {k}, group "
                f"{exps[k].eid.tid!r}, run {exps[k].eid.run}); the index's anchor groups wait for every run of a task, so it "
                "cannot leave them out: set the policy's group_validity to 'reject' and stale_members to 'oldest', or use dso_gigpo"
            )
        masks = TokenMasks(order)  # joined in a worker thread while the rows are read and the index answers
        res = self.compute(exps, order)
        seconds = time.perf_counter() - t0
        write_token_advantages(exps, res["advantages"], masks=masks)
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


