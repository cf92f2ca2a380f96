"""The ``dso_orchestrator`` experience-pipeline operator: Trinity's rollouts in, the orchestrator's batches out."""

from __future__ import annotations

import logging
import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from trinity.buffer.operators import ExperienceOperatorV1
from trinity.common.experience import CustomField
from trinity.common.experience import Experience as TrinityExperience

from algos.dapo import batch_loss_counts
from orchestrator.core.machine import DataExhaustedError
from orchestrator.core.outcomes import GroupOutcome
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.types import GroupTable
from orchestrator.trinity.attach import (
    AttachConfig,
    actor_calls,
    create_orchestrator,
    find_orchestrator_async,
    new_session,
    trinity_task_id,
)
from orchestrator.trinity.fields import MASKED, NO_INFO, tid_codes
from orchestrator.trinity.held import HeldPayloadLostError, HeldPayloads
from orchestrator.trinity.loss import COUNTS_FIELD

COUNTS = CustomField(source_field=COUNTS_FIELD, destination_field=COUNTS_FIELD, data_type=torch.float32)
"""Trinity's way to turn ``info[COUNTS_FIELD]`` into a batch tensor the loss function selects
(``to_data_proto``: one row per experience)."""


def stamp_batch_counts(exps: list[TrinityExperience]) -> None:
    """Write the released batch's loss counts into every experience, in place.

    ``info["dso_batch_counts"]`` = ``[rows, seqs, tokens]`` of the whole batch
    (:func:`algos.dapo.batch_loss_counts` over the action masks, after padding and masked
    members were zeroed), and the :data:`COUNTS` custom field, so that ``dso_clip_higher``
    normalises every micro-batch by the whole batch's counts (verl's rule), not by its own.
    Trinity's trainer reads one released batch per step (``train_batch_size`` = the batch's
    experiences); a step-wise run whose trainer batch spans several released batches gets each
    row normalised by the batch it was released in.
    """
    if not exps:
        return
    masks = [torch.as_tensor(e.action_mask if e.action_mask is not None else torch.ones(len(e.tokens) - e.prompt_length))
             for e in exps]
    width = max(1, max(len(m) for m in masks))
    mask = torch.zeros((len(exps), width))
    for i, m in enumerate(masks):
        mask[i, :len(m)] = m.to(mask.dtype)
    counts = [float(v) for v in batch_loss_counts(mask)]
    for e in exps:
        e.info[COUNTS_FIELD] = counts
        e.custom_fields = [f for f in (e.custom_fields or []) if f.source_field != COUNTS_FIELD] + [COUNTS]

log = logging.getLogger("trinity_dso.trinity")

def _floats(values: list) -> np.ndarray:
    """(N,) float64 of numbers, NaN for None and for anything that is not a number."""
    try:
        return np.array(values, dtype=np.float64).reshape(len(values))
    except (TypeError, ValueError):
        return np.array([x if isinstance(x, (int, float)) and not isinstance(x, bool) else np.nan for x in values],
                        dtype=np.float64)


def _read_steps(exps: list[TrinityExperience], judged: str | None) -> tuple[list, ...]:
    """Each experience's fields for :meth:`OrchestratorOperator.to_table`, read in one visit of it.

    One Python loop reads every field of an experience while it is in cache, where one C-level
    ``map`` pass per field touched every experience, EID, info and metrics dict again (see
    bench/README.md, "Reading and writing experiences").

    Returns:
        lists of N: ``eid.batch``, ``eid.task``, ``eid.run``, ``eid.step``, ``info`` (a missing
        one read as an empty dict), whether ``info`` has ``step_reward``, ``reward``,
        ``info["model_version"]`` (0 when absent) and ``metrics[judged]`` (None when absent, or
        every one None when ``judged`` is None).
    """
    batches, tasks, runs, steps, infos, has_step, rewards, versions, values = [], [], [], [], [], [], [], [], []
    for e in exps:
        eid = e.eid
        batches.append(eid.batch)
        tasks.append(eid.task)
        runs.append(eid.run)
        steps.append(eid.step)
        info = e.info or NO_INFO
        infos.append(info)
        has_step.append("step_reward" in info)
        rewards.append(e.reward)
        versions.append(info.get("model_version", 0))
        values.append((e.metrics or NO_INFO).get(judged) if judged is not None else None)
    return batches, tasks, runs, steps, infos, has_step, rewards, versions, values


def _finite(x: Any) -> bool:
    """``x`` is a finite real number (a Python, numpy or 0-dim torch one; not None, NaN, inf or a bool)."""
    try:
        return not isinstance(x, bool) and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


class OrchestratorOperator(ExperienceOperatorV1):
    """Experience-pipeline operator ``dso_orchestrator``: forward to the orchestrator, pass on what it releases.

    Each call receives the experiences of one explore step. They are grouped into rollouts
    (``eid.rid``: one trajectory, one or more steps) and groups (``eid.tid``: the n rollouts of
    one task), and sent to the actor as one :class:`~orchestrator.core.types.GroupTable` (columns,
    no per-rollout objects; see :meth:`to_table`):

    * ``rewards``: the sum of ``info["step_reward"]`` over a rollout's steps when present, else
      its last step's ``reward`` (single-turn: the reward);
    * ``metrics``: the judged metric of its last step (e.g. ``accuracy``);
    * ``versions``: Trinity's ``info["model_version"]`` (each member keeps its own; the group is
      stamped with its *oldest* member's, so staleness is judged per member).

    Complete groups (exactly ``group_size`` runs; under ``group_validity="mask"`` also groups
    that lost runs, the missing members masked, see :meth:`to_table`) are submitted with ``on_invalid="drop"``: a
    group the orchestrator cannot use (e.g. a ``None`` reward under ``group_validity="reject"``)
    is dropped with reason ``invalid``, counted (``dso/groups_invalid``) and logged by the
    actor, and the other groups of the step go on. Every batch the actor then releases
    (``submit_and_pop`` returns them with the labels: one call per step) is expanded back to
    its Trinity experiences (all steps), in group order, runs and steps ascending, and returned
    (:meth:`expand`). Groups released as padding (``on_cap="pad"``) and masked members get an
    all-zero ``action_mask`` (zero loss weight) and ``info["dso_padding"]`` /
    ``info["dso_masked"] = True``. Every released experience carries ``info["dso_batch_id"]``
    and ``info["dso_reason"]``.

    End of data: when the actor is exhausted (``max_epochs`` / ``max_rollouts``) and nothing
    was released, its kept groups are released as a last batch (``finish_batch``, per ``on_cap``).

    Replenish cap: one explore step counts as one round. When ``policy.max_replenish_rounds``
    is > 0 and that many rounds after the first passed without a release, the operator closes
    the open batch (``close_batch``: pad, partial or raise per ``policy.on_cap``).

    Held groups survive an explorer restart (:class:`~orchestrator.trinity.held.HeldPayloads`,
    ``docs/guide/held-payloads.md``): the ``submit_and_pop`` reply names the groups the actor holds,
    and the step's newly held ones (never the dropped or released ones) are written to
    ``held_dir`` as one file per step, in a worker thread, after the reply; files are deleted
    once none of their groups is held. A group carried over by the actor is then released by the
    next explorer process from that file; its ``eid.batch`` gets ``@<session>`` appended, so that
    it never shares an ``eid.tid`` (the GRPO grouping key) with a group of the new process,
    which numbers its explore steps from its checkpoint again. At attach, held groups whose
    payload was never written (the explorer died between the actor's commit and the write) are
    dropped by the actor as ``lost``.

    Args (the pipeline's ``operators[...].args``): an
        :class:`~orchestrator.trinity.attach.AttachConfig` (``actor_name``, ``namespace``,
        ``policy``, ``held_dir``, ...), filled by ``configure_orchestrated_run``. With
        ``num_tasks`` the operator creates the actor when absent; without, it waits up to
        ``lookup_timeout_s`` for the selector (or ``trinity-dso serve``) to create it.
    Raises:
        OrchestratorNotFoundError: at the first call, no actor and no ``num_tasks``.
        orchestrator.service.names.RunConflictError: the actor serves another run.
        orchestrator.core.machine.ReplenishCapError: cap hit under ``on_cap="raise"``.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.settings = AttachConfig.parse(kwargs, "operators[dso_orchestrator].args")
        self.policy = self.settings.resampling_policy()
        self.session = new_session()
        self.held_dir = Path(self.settings.held_dir) if self.settings.held_dir else None
        self._actor = None
        self._calls = None  # the actor's calls, re-sent while it restarts (orchestrator.service.calls)
        self.held = HeldPayloads(self.held_dir, self.session)  # group ref -> its experiences (by run, step)
        self._rounds_open = 0  # explore steps submitted since the last release
        self.auxiliary_models = {}

    async def actor(self) -> Any:
        """The orchestrator actor (created with ``num_tasks``, else looked up), attached to the run once."""
        if self._actor is None:
            cfg = self.settings
            if cfg.num_tasks:
                actor = create_orchestrator(cfg, cfg.num_tasks)
            else:
                actor = await find_orchestrator_async(cfg.actor_name, cfg.namespace, timeout_s=cfg.lookup_timeout_s)
            calls = actor_calls(cfg, actor)
            await calls.acall(
                "attach_run", cfg.run or "trinity-run", session=self.session, role="operator", num_tasks=cfg.num_tasks,
                pinned=dict(cfg.pinned), pinned_by=cfg.pinned_by,
            )
            await self._recover(calls)
            self._actor, self._calls = actor, calls
        return self._actor

    # ------------------------------------------------------------- held experiences
    async def _recover(self, calls: Any) -> None:
        """At attach, before this process submits: index ``held_dir`` by the groups the actor
        holds, delete the files of groups it no longer holds, and have it drop, as ``lost``, the
        held groups whose payload is nowhere (an explorer killed between the actor's commit of a
        step and the write of that step's held groups: see ``docs/guide/held-payloads.md``)."""
        lost = self.held.recover(await calls.acall("held_refs"))
        if lost:
            log.warning("held_dir %s: no payload for %d held groups (the previous explorer died before writing "
                        "them); the orchestrator drops them as lost: %s", self.held_dir, len(lost), lost[:8])
            await calls.acall("drop_held", lost)  # idempotent: re-sent while the actor restarts

    def _hold(self, payload: dict[str, list[TrinityExperience]]) -> None:
        self.held.stage(payload)

    def _take(self, key: str, task_id: str) -> list[TrinityExperience]:
        try:
            return self.held.take(key)
        except HeldPayloadLostError:
            raise HeldPayloadLostError(
                f"ref: no experiences held for group {key!r} (task {task_id!r}); set held_dir to a path "
                "that survives an explorer restart"
            ) from None

    async def close(self) -> None:
        """Trinity's pipeline closes: the last write of held groups is finished."""
        self.held.close()

    def to_table(self, exps: list[TrinityExperience]) -> tuple[GroupTable | None, dict[str, list[TrinityExperience]], int]:
        """Group one explore step's experiences into columns (each experience read in one visit, :func:`_read_steps`).

        Rollouts are ``(eid.batch, eid.task, eid.run)``, groups ``(eid.batch, eid.task)`` (Trinity's
        ``rid`` and ``tid``), in order of first appearance. Each rollout's row values: ``reward``
        = the sum of ``info["step_reward"]`` over its steps when any step has one, else its last
        step's ``reward`` (None: NaN); the judged metric (``accuracy`` under ``judge="auto"``)
        and ``info["model_version"]`` of its last step.

        A group with fewer than ``group_size`` runs is left out under ``group_validity="reject"``;
        under ``"mask"`` it is kept when its runs are all in ``[0, group_size)``: each missing
        member gets reward and judged metric NaN (and the group's newest model version), so
        the actor masks it as it masks a missing rollout on the direct route, and keeps the
        group while ``min_valid_group_size`` members remain.

        Returns:
            the table of the groups kept (None when there is none), the payload of each (its
            experiences sorted by run, then step) by ``ref``, and the number of incomplete
            groups left out.
        """
        n = self.policy.group_size
        num = len(exps)
        if not num:
            return None, {}, 0
        judge = self.policy.filter.judge
        name = "accuracy" if judge == "auto" else None if judge == "reward" else judge
        batches, tasks, runs, steps, infos, has_step, rewards_of, versions_of, judged_of = _read_steps(exps, name)
        group, group_keys = tid_codes(batches, tasks)
        run = np.array(runs, dtype=np.int64).reshape(num)
        step = np.array(steps, dtype=np.int64).reshape(num)
        lo = int(run.min())
        order = np.lexsort((step, run, group))  # by group, run, step (stable: ties keep their order)
        rollout_key = (group * (int(run.max()) - lo + 1) + (run - lo))[order]
        first = np.flatnonzero(np.r_[True, rollout_key[1:] != rollout_key[:-1]])  # each rollout's first row
        last = order[np.r_[first[1:], num] - 1]  # each rollout's last step (row in exps)
        r_group = group[order[first]]
        r_run = run[order[first]]
        sizes = np.bincount(r_group, minlength=len(group_keys))
        complete = sizes == n
        # group_validity "mask": a group that lost runs is kept, its missing members masked (as the direct
        # route does), when every run it has is in [0, n); the actor then keeps it while min_valid_group_size remain
        short = (sizes < n) & (np.bincount(r_group, weights=(r_run < 0) | (r_run >= n), minlength=sizes.size) == 0)
        short &= self.policy.group_validity == "mask"
        complete |= short
        has_step = np.array(has_step, dtype=bool).reshape(num)
        if has_step.any():  # multi-turn: per-step rewards add up to the rollout's
            step_r = np.fromiter((float(i.get("step_reward", 0.0)) for i in infos), np.float64, num)[order]
            sums = np.add.reduceat(step_r, first)
            uses_steps = np.add.reduceat(has_step[order].astype(np.int64), first) > 0
        else:
            sums, uses_steps = None, None
        last_list = last.tolist()
        rewards = _floats(list(map(rewards_of.__getitem__, last_list)))
        if sums is not None:
            rewards = np.where(uses_steps, sums, rewards)
        versions = np.fromiter((int(versions_of[i] or 0) for i in last_list), np.int64, len(last_list))
        metrics = {}
        if name is not None:
            metrics[name] = _floats(list(map(judged_of.__getitem__, last_list)))
        keep = complete[r_group]  # rollouts of complete groups, grouped, runs ascending
        incomplete = int((~complete).sum())
        if not keep.any():
            return None, {}, incomplete
        rows = np.flatnonzero(complete)  # group codes in first-appearance order
        sorted_group = group[order]
        heads = np.searchsorted(sorted_group, rows)  # first sorted row of each kept group
        ends = np.searchsorted(sorted_group, rows, side="right")
        refs = [f"{self.session}:{group_keys[g][0]}/{group_keys[g][1]}" for g in rows.tolist()]
        payload = {ref: [exps[i] for i in order[h:e].tolist()] for ref, h, e in zip(refs, heads.tolist(), ends.tolist())}
        shape = (len(rows), n)
        if short.any():  # members by run, a missing one with reward and metrics NaN (masked by the actor)
            slot = np.full(sizes.size, -1, dtype=np.int64)
            slot[rows] = np.arange(len(rows))
            at = (slot[r_group[keep]], r_run[keep])
            runs_m = np.broadcast_to(np.arange(n), shape).copy()
            newest = np.zeros(sizes.size, dtype=np.int64)
            np.maximum.at(newest, r_group[keep], versions[keep])  # absent members: no effect on the oldest version
            cols = {"rewards": rewards, **{f"metric:{k}": v for k, v in metrics.items()}}
            full = {}
            for key, col in cols.items():
                full[key] = np.full(shape, np.nan)
                full[key][at] = col[keep]
            versions_m = np.repeat(newest[rows][:, None], n, axis=1)
            versions_m[at] = versions[keep]
            runs_m[at] = r_run[keep]
            columns = (runs_m, full["rewards"], versions_m, {k: full[f"metric:{k}"] for k in metrics})
        else:
            columns = (r_run[keep].reshape(shape), rewards[keep].reshape(shape), versions[keep].reshape(shape),
                       {k: v[keep].reshape(shape) for k, v in metrics.items()})
        table = GroupTable(
            task_ids=[trinity_task_id(exps[order[h]]) for h in heads.tolist()],
            round_tags=[str(group_keys[g][0]) for g in rows.tolist()],
            refs=refs,
            runs=columns[0],
            rewards=columns[1],
            versions=columns[2],
            metrics=columns[3],
        )
        return table, payload, incomplete

    def expand(self, batch: Any) -> list[TrinityExperience]:
        """The Trinity experiences of a released batch, in group order; frees their payload.

        Every experience gets ``info["dso_batch_id"]`` and ``info["dso_reason"]``. Padding
        groups and masked members (``Group.valid`` False: a NaN reward under
        ``group_validity="mask"``, or a stale member) get an all-zero ``action_mask`` (zero
        loss weight) and ``info["dso_padding"]`` / ``info["dso_masked"]``. Such an experience
        whose ``reward`` is missing or not finite gets ``reward`` 0.0, the original kept in
        ``info["dso_reward"]``: Trinity's trainer gathers every experience's reward into one
        tensor (one None drops the batch's rewards, one NaN makes its reward metrics NaN);
        ``dso_grpo`` leaves masked members out of the baseline whatever their reward.
        Every experience carries the batch's loss counts (:func:`stamp_batch_counts`).
        """
        out: list[TrinityExperience] = []
        batch_id = int(batch.batch_id)
        for g in batch.groups:
            steps = self._take(g.ref, g.task_id)
            masked = set() if g.padding or g.valid is None or g.valid.all() else set(np.flatnonzero(~g.valid).tolist())
            for s in steps:
                info = s.info
                info["dso_batch_id"] = batch_id
                info["dso_reason"] = g.reason
                if g.padding or (masked and int(s.eid.run) in masked):
                    info["dso_padding" if g.padding else MASKED] = True
                    if s.action_mask is not None:
                        s.action_mask = torch.zeros_like(s.action_mask)
                    if not _finite(s.reward):  # Trinity's trainer gathers every reward
                        info["dso_reward"], s.reward = s.reward, 0.0
            out.extend(steps)
        stamp_batch_counts(out)
        return out

    async def _sweep(self, actor: Any, held: list[str], refresh: bool) -> None:
        """Free the payload of every group the actor no longer holds (dropped as non-informative,
        invalid, stale, or a padding candidate left unused at a release), in memory and in
        ``held_dir``, and write the step's newly held ones (:meth:`HeldPayloads.settle`).

        ``held``: the refs the actor holds, from the step's ``submit_and_pop`` reply. ``refresh``
        (a ``close_batch`` / ``finish_batch`` released a batch after it, and dropped the unused
        padding candidates): asked again with ``held_refs``; if that call fails, the reply's refs
        are used (the released batch is already expanded and returned: nothing is lost, and the
        groups the close dropped are freed at the next step)."""
        if refresh:
            try:
                held = await self._calls.acall("held_refs")
            except (TimeoutError, ray.exceptions.RayError) as err:
                log.warning("held_refs after a close failed (%s): the unused candidates are freed at the next step", err)
        self.held.settle(held)

    def _call_id(self) -> str:
        return f"{self.session}:{uuid.uuid4().hex}"

    async def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """One explore step (see the class docstring). Every call to the actor is re-sent, with
        the same call id, while the actor restarts (``restart_deadline_s``). A failure is logged
        with the explore step, reported to the actor (``dso_errors_total{kind="operator"}``, the
        last error of ``GET /v1/stats``) when it answers, and raised (Trinity then stops its
        explorer)."""
        try:
            return await self._process(exps)
        except Exception as exc:
            step = exps[0].eid.batch if exps else None
            log.error("dso_orchestrator operator failed at explore step %s: %s: %s", step, type(exc).__name__, exc)
            if self._actor is not None:  # best effort, not awaited: the actor may be the one that failed
                self._actor.report_error.remote("operator", f"{type(exc).__name__}: {exc}", step)
            raise

    async def _process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        actor = await self.actor()
        calls = self._calls
        # the live policy (a REST change of the cap or filter applies from this step on)
        self.policy = ResamplingPolicy.parse((await calls.acall("get_policy"))["policy"])
        table, payload, incomplete = self.to_table(exps)
        if table is not None:
            self._hold(payload)  # in memory; those the actor holds are written once it replied (_sweep)
            self._rounds_open += 1
        # one call: the groups in, every ready batch out (an empty submit only collects)
        # re-sent with the same call id while the actor restarts: a committed first attempt's batches come back;
        # held=True: the reply also names every group the actor holds now (no second call after a release)
        labels, ready, held = await calls.acall("submit_and_pop", table if table is not None else [], on_invalid="drop",
                                                call_id=self._call_id(), held=True)
        labels = np.asarray(labels, dtype=str)
        released: list[TrinityExperience] = []
        batches = 0
        padded = 0
        for batch in ready:
            released.extend(self.expand(batch))
            batches += 1
            padded += batch.num_padding
            self._rounds_open = 0
        cap = self.policy.max_replenish_rounds
        if not batches and cap > 0 and self._rounds_open > cap:
            batch = await calls.acall("close_batch", call_id=self._call_id())
            released.extend(self.expand(batch))
            batches += 1
            padded += batch.num_padding
            self._rounds_open = 0
        if not batches and await calls.acall("exhausted"):
            try:
                batch = await calls.acall("finish_batch", call_id=self._call_id())
            except DataExhaustedError:
                batch = None
            if batch is not None:
                released.extend(self.expand(batch))
                batches += 1
                padded += batch.num_padding
                self._rounds_open = 0
        await self._sweep(actor, held, refresh=batches > len(ready))
        metrics = {
            "dso/groups_submitted": len(labels),
            "dso/groups_kept": int((labels == GroupOutcome.INFORMATIVE.label).sum()),
            "dso/groups_incomplete": incomplete,
            "dso/groups_invalid": int((labels == GroupOutcome.INVALID.label).sum()),
            "dso/batches_released": batches,
            "dso/groups_padding": padded,
            "dso/experiences_released": len(released),
            "dso/groups_held": len(self.held),
        }
        return released, metrics


