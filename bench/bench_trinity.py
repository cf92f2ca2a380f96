"""Benchmark: our Trinity adapters against Trinity 0.6's built-ins, in the same process, on Trinity Experiences.

Each comparison alternates the reference and ours in the same loop (``--repeats`` rounds), checks
every row's results against the reference's (max |diff| of the advantages; the DAPO rows also
check that every released experience is one the reference kept, with its reward and tokens),
and prints the min and the median seconds and the speed-up ``reference seconds / ours`` of the
medians (and of the mins; above 1: ours is faster):

* **GiGPO** on 64 tasks x 8 runs x 50 steps (25,600 step experiences, 16 response tokens
  each): Trinity's ``gigpo`` (``GiGPOAdvantageFn``) against ``dso_gigpo`` and, with
  ``--redis-url``, ``dso_gigpo_index`` as deployed: an orchestrator actor (state file, metrics)
  owns the Redis index, and each call registers its two batch keys with it. Same arguments
  (gamma 0.95, F_norm std). The check is against ``dso_gigpo`` (GiGPO variants differ from
  Trinity's by design where tasks share a state text).
* **GRPO** on 4096 groups x 16 single-turn experiences: Trinity's ``grpo`` against ``dso_grpo``.
* **DAPO pipeline** on the same 4096 x 16: Trinity's ``dapo_dynamic_sampling`` filter plus
  ``grpo`` against ``OrchestratorOperator`` + actor + ``dso_grpo`` as the README deploys them
  (:class:`Deployed`: the actor created by the operator, detached, with its state file and
  Prometheus metrics, ``held_dir`` on, sizes pinned).
* **DAPO, multi-step**: 20 consecutive explore steps of 512 x 16 through both pipelines
  (carry-over across steps, garbage collection included), per-step seconds.

Other processes on the machine inflate the seconds; the ratios are measured side by side.

    python bench/bench_trinity.py [--redis-url redis://127.0.0.1:6379/0] [--repeats 5] [--skip-ray] [--only dapo]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import time
import uuid

os.environ.setdefault("VLLM_PLUGINS", "none")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np
import torch
from trinity.algorithm.advantage_fn.gigpo_advantage import GiGPOAdvantageFn
from trinity.algorithm.advantage_fn.grpo_advantage import GRPOGroupedAdvantage
from trinity.buffer.operators.filters.reward_filter import DAPODynamicSamplingFilter
from trinity.common.experience import EID
from trinity.common.experience import Experience as TExp

from orchestrator.trinity.advantage.gigpo import DsoGiGPOAdvantageFn
from orchestrator.trinity.advantage.gigpo_index import DsoGiGPOIndexAdvantageFn
from orchestrator.trinity.advantage.grpo import DsoGRPOAdvantageFn


def agent_batch(tasks: int = 64, runs: int = 8, steps: int = 50, states: int = 16, response: int = 16, seed: int = 0):
    """Step experiences of ``tasks x runs`` trajectories of ``steps`` steps, shuffled: 5 % of
    steps rewarded, each step acting from one of ``states`` states of its task."""
    rng = np.random.default_rng(seed)
    tokens = torch.arange(8 + response)
    out = [
        TExp(eid=EID(batch=0, task=t, run=r, step=s), tokens=tokens, prompt_length=8, reward=0.0,
             info={"step_reward": float(rng.random() < 0.05), "env_state_hash": f"{t}-{int(rng.integers(0, states))}"})
        for t in range(tasks) for r in range(runs) for s in range(steps)
    ]
    return [out[i] for i in rng.permutation(len(out))]


def dapo_batch(groups: int = 4096, n: int = 16, response: int = 16, seed: int = 0):
    """One explore step of single-turn experiences: ``groups`` tasks x ``n`` runs, rewards +-1
    (accuracy 1 / 0) with p(correct) drawn per task, so about half the groups are informative."""
    rng = np.random.default_rng(seed)
    p = rng.choice([0.0, 0.3, 0.6, 1.0], size=groups)
    correct = rng.random((groups, n)) < p[:, None]
    tokens = torch.arange(8 + response)
    return [
        TExp(eid=EID(batch=1, task=t, run=r), tokens=tokens, prompt_length=8, reward=1.0 if correct[t, r] else -1.0,
             info={"model_version": 0, "task_index": {"index": t}}, metrics={"accuracy": float(correct[t, r])})
        for t in range(groups) for r in range(n)
    ]


def stats(times: list[float]) -> tuple[float, float]:
    """(min, median) of a variant's seconds."""
    return min(times), float(np.median(times))


def table(title: str, rows: list[tuple[str, list[float], float | None]]) -> None:
    """One row per variant: min and median seconds, the speed-up of the medians (and of the mins)
    against the first row (the reference), and the max |diff| of its results against the reference's."""
    ref_min, ref_med = stats(rows[0][1])
    print(f"\n{title}")
    print(f"  {'variant':<52}{'min s':>8}{'median s':>10}{'speed-up (median / min)':>26}{'max|diff|':>11}")
    for name, times, diff in rows:
        lo, med = stats(times)
        d = "" if diff is None else f"{diff:.1e}"
        print(f"  {name:<52}{lo:>8.3f}{med:>10.3f}{ref_med / med:>17.2f}x / {ref_min / lo:.2f}x{d:>11}")


def fresh(exps: list) -> None:
    """Untimed, before each timed call: every experience's ``advantages`` and ``returns`` reset
    to None, as they arrive in Trinity's pipeline, a full garbage collection, so that no variant
    pays for freeing the previous variant's tensors or for a collection that the previous variant
    made due, and one 64 KiB allocation: glibc defers merging the many small blocks just freed
    until the next request of that size, and that merge took 13-16 ms in whichever variant came
    first (measured in the first rounds; about 1 ms once the heap has settled)."""
    for e in exps:
        e.advantages = e.returns = None
    gc.collect()
    bytearray(1 << 16)  # glibc merges the freed blocks now, not inside the timed call


def interleaved(variants: list[tuple[str, object]], exps: list, repeats: int, before=None) -> tuple[list[list[float]], list[list]]:
    """Seconds of each variant in each of ``repeats`` rounds of one call each (interleaved, so
    that a change of the machine's load between variants does not bias the ratios), and each
    variant's token advantages. Before each timed call (untimed): ``before()``, then :func:`fresh`."""
    times: list[list[float]] = [[] for _ in variants]
    outs: list = [None] * len(variants)
    for _ in range(repeats):
        for v, (_, fn) in enumerate(variants):
            if before is not None:
                before()
            fresh(exps)
            t0 = time.perf_counter()
            out, _ = fn()
            times[v].append(time.perf_counter() - t0)
            outs[v] = [e.advantages.clone() for e in out]
    return times, outs


def bench_gigpo(args) -> None:
    """Trinity's ``gigpo``, ``dso_gigpo`` and ``dso_gigpo_index`` (:func:`interleaved`).

    ``dso_gigpo_index`` runs as a Trinity run deploys it: an orchestrator actor (detached, state
    file, metrics) owns the Redis anchor index, and the advantage function registers each batch
    with it (two ``anchor_register`` calls per call: the step batch and its episode batch)."""
    exps = agent_batch(args.tasks, args.runs, args.steps)
    theirs = GiGPOAdvantageFn(gamma=0.95, fnorm="std")
    ours = DsoGiGPOAdvantageFn()
    variants = [(f"Trinity gigpo ({len(exps)} steps)", lambda: theirs.process(exps)), ("dso_gigpo", lambda: ours.process(exps))]
    index, actor, state_dir = None, None, None
    if args.redis_url:
        import ray

        from orchestrator.trinity.attach import AttachConfig, create_orchestrator

        ray.init(namespace="trinity-dso", include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        prefix = f"bench:{uuid.uuid4().hex[:8]}"
        state_dir = tempfile.TemporaryDirectory()
        name = f"dso-bench-gigpo-{uuid.uuid4().hex[:8]}"
        cfg = AttachConfig(actor_name=name, policy={"group_size": args.runs, "target_groups": args.tasks},
                           checkpoint_path=os.path.join(state_dir.name, "orchestrator.db"),
                           anchor_index={"redis_url": args.redis_url, "prefix": prefix, "ttl_s": 600})
        actor = create_orchestrator(cfg, args.tasks)
        ray.get(actor.ping.remote())  # up before the advantage function looks it up
        index = DsoGiGPOIndexAdvantageFn(redis_url=args.redis_url, prefix=prefix, ttl_s=600, group_size=args.runs,
                                         actor_name=name, namespace=cfg.namespace)
        # opened before any timing: the actor lookup starts a Ray runtime, whose start-up would
        # otherwise overlap (and slow) whichever variant is timed next
        index.index()
        assert index._actor is not None, "dso_gigpo_index found no orchestrator actor: it would skip anchor_register"
        variants.append(("dso_gigpo_index (Redis, orchestrator actor)", lambda: index.process_sync(exps)))
    batch = iter(range(1_000_000))

    def fresh_step() -> None:  # a fresh explore step per call (the index refuses conflicting re-inserts)
        b = next(batch)
        for e in exps:
            e.eid.batch = b

    try:
        times, outs = interleaved(variants, exps, args.repeats, before=fresh_step)
    finally:
        if index is not None:
            index.close_index()
        if actor is not None:
            import ray

            ray.kill(actor)
            state_dir.cleanup()
    ours_adv = outs[1]

    def diff(adv: list) -> float:
        return max(float((x - y).abs().max()) for x, y in zip(adv, ours_adv))

    rows = [(variants[0][0], times[0], None)] + [(variants[v][0], times[v], diff(outs[v])) for v in range(1, len(variants))]
    table(f"GiGPO: {args.tasks} tasks x {args.runs} runs x {args.steps} steps (interleaved rounds; "
          "max|diff| against dso_gigpo, which differs from Trinity's by design where tasks share a state text)", rows)


def bench_grpo(args):
    """Trinity's ``grpo`` and ``dso_grpo`` (:func:`interleaved`); the check is on each
    experience's advantages (``grpo`` and ``dso_grpo`` both return the experiences grouped)."""
    exps = dapo_batch(args.groups, args.n)
    theirs, ours = GRPOGroupedAdvantage(), DsoGRPOAdvantageFn()
    (t_ref, t_ours), (ref_adv, our_adv) = interleaved(
        [("Trinity grpo", lambda: theirs.process(exps)), ("dso_grpo", lambda: ours.process(exps))], exps, args.repeats)
    diff = max(float((x - y).abs().max()) for x, y in zip(our_adv, ref_adv))
    table(f"GRPO: {args.groups} groups x {args.n} (interleaved rounds)", [("Trinity grpo", t_ref, None), ("dso_grpo", t_ours, diff)])


class Deployed:
    """The DAPO operator as ``configure_orchestrated_run`` deploys it for a Trinity run: the
    operator creates the orchestrator actor (detached, with its state file and Prometheus
    metrics), ``held_dir`` on, ``group_size`` and ``target_groups`` pinned; then ``dso_grpo``
    on what it releases. A fresh actor, state file and ``held_dir`` per instance (the same
    decisions each time); :meth:`close` kills the actor."""

    def __init__(self, groups: int, n: int, target_groups: int, num_tasks: int) -> None:
        import ray

        from orchestrator.trinity.operator import OrchestratorOperator

        ray.init(namespace="trinity-dso", include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        self.dir = tempfile.TemporaryDirectory()
        name = f"dso-bench-{uuid.uuid4().hex[:8]}"
        self.op = OrchestratorOperator(
            actor_name=name, namespace="trinity-dso", num_tasks=num_tasks, policy={},
            checkpoint_path=os.path.join(self.dir.name, "dso", "orchestrator.db"),
            held_dir=os.path.join(self.dir.name, "dso", "held"),
            pinned={"group_size": n, "target_groups": target_groups}, pinned_by="bench: buffer.batch_size",
        )
        self.grpo = DsoGRPOAdvantageFn()
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.op.actor())  # attached once per explorer process: not timed

    def step(self, exps: list) -> tuple[list, dict]:
        released, metrics = self.loop.run_until_complete(self.op.process(exps))
        return self.grpo.process(released)[0], metrics

    def close(self) -> None:
        import ray

        try:
            self.loop.run_until_complete(self.op.close())
        except Exception:  # an operator without close (the code before this benchmark)
            pass
        ray.kill(self.op._actor)
        self.loop.close()
        self.dir.cleanup()


def eid_key(e) -> tuple:
    return (str(e.eid.batch).split("@")[0], e.eid.task, e.eid.run)


def check_released(released: list, adv: list, ref: dict) -> float:
    """max |diff| of the released experiences' advantages against the reference's (by eid);
    raises when one was not kept by the reference or differs in reward or tokens."""
    worst = 0.0
    for e, a in zip(released, adv):
        r = ref.get(eid_key(e))
        if r is None or r[1] != e.reward or not torch.equal(r[2], e.tokens):
            raise AssertionError(f"released experience {e.eid} differs from the reference's (or was not kept by it)")
        worst = max(worst, float((a - r[0]).abs().max()))
    return worst


def bench_dapo(args) -> None:
    """Trinity's ``dapo_dynamic_sampling`` + ``grpo`` against the deployed operator (:class:`Deployed`)
    on one explore step of ``groups x n``, alternating in the same loop (a fresh actor per round)."""
    exps = dapo_batch(args.groups, args.n)
    dapo_filter, grpo = DAPODynamicSamplingFilter(), GRPOGroupedAdvantage()
    times: list[list[float]] = [[], []]
    worst, counts = 0.0, None
    for _ in range(args.repeats):
        fresh(exps)
        t0 = time.perf_counter()
        kept, _ = dapo_filter.process(exps)
        ref_out, _ = grpo.process(kept)
        times[0].append(time.perf_counter() - t0)
        ref = {eid_key(e): (e.advantages.clone(), e.reward, e.tokens) for e in ref_out}
        ours = Deployed(args.groups, args.n, args.target_groups, args.groups)
        try:
            fresh(exps)
            t0 = time.perf_counter()
            out, m = ours.step(exps)
            times[1].append(time.perf_counter() - t0)
            worst = max(worst, check_released(out, [e.advantages for e in out], ref))
            counts = (len(ref_out), len(out), m["dso/groups_held"])
        finally:
            ours.close()
    print(f"\n  (reference keeps {counts[0]} experiences; the operator releases {counts[1]} in batches of "
          f"{args.target_groups} groups, {counts[2]} groups held as carry-over, their payload in held_dir)")
    table(f"DAPO pipeline: {args.groups} groups x {args.n}, as deployed (Ray actor with state file and metrics, "
          "held_dir on, sizes pinned; alternating)",
          [("Trinity dapo_dynamic_sampling + grpo", times[0], None),
           ("OrchestratorOperator + actor + dso_grpo", times[1], worst)])


def bench_steps(args) -> None:
    """``--steps-run`` consecutive explore steps of ``--step-groups x n`` (fresh tasks each step)
    through Trinity's ``dapo_dynamic_sampling`` + ``grpo`` and through the deployed operator and
    actor + ``dso_grpo`` (:class:`Deployed`: carry-over across steps, ``held_dir`` written), in
    whole passes that alternate, ``--repeats`` of each. Nothing is reset between the steps of a
    pass and no collection is forced: each step pays the garbage collections it makes due
    (ours freeze and unfreeze the caller's heap), as in a run. Every experience our pipeline
    releases is checked against the reference's advantages for it."""
    groups, n, steps = args.step_groups, args.n, args.steps_run
    def step_batch(s: int) -> list:  # the same experiences for both pipelines
        exps = dapo_batch(groups, n, seed=1000 + s)
        for e in exps:  # explore step s: its own tasks and eid.batch
            e.eid.batch = s
            e.info["task_index"]["index"] += s * groups
        return exps

    per_step: list[list[float]] = [[], []]
    gc_s = [0.0, 0.0]
    worst, released_total, held_end = 0.0, 0, 0
    clock = {"t": None, "sum": 0.0}

    def on_gc(phase, info):  # time inside the collector during timed steps
        if phase == "start":
            clock["t"] = time.perf_counter()
        elif clock["t"] is not None:
            clock["sum"] += time.perf_counter() - clock["t"]
            clock["t"] = None

    gc.callbacks.append(on_gc)
    dapo_filter, grpo = DAPODynamicSamplingFilter(), GRPOGroupedAdvantage()
    try:
        for _ in range(args.step_passes):
            ref: dict = {}
            data = [step_batch(s) for s in range(steps)]
            gc.collect()
            for s in range(steps):
                clock["sum"] = 0.0
                t0 = time.perf_counter()
                kept, _ = dapo_filter.process(data[s])
                out, _ = grpo.process(kept)
                per_step[0].append(time.perf_counter() - t0)
                gc_s[0] += clock["sum"]
                ref.update({eid_key(e): (e.advantages.clone(), e.reward, e.tokens) for e in out})
            del data, kept, out
            data = [step_batch(s) for s in range(steps)]
            ours = Deployed(groups, n, args.target_groups, groups * steps)
            gc.collect()
            try:
                released_total = 0
                for s in range(steps):
                    clock["sum"] = 0.0
                    t0 = time.perf_counter()
                    out, m = ours.step(data[s])
                    per_step[1].append(time.perf_counter() - t0)
                    gc_s[1] += clock["sum"]
                    worst = max(worst, check_released(out, [e.advantages for e in out], ref))
                    released_total += len(out)
                    held_end = m["dso/groups_held"]
            finally:
                ours.close()
            del data, ref
    finally:
        gc.callbacks.remove(on_gc)
    print(f"\n  ({steps} steps per pass, {args.step_passes} passes each; the operator released {released_total} "
          f"experiences per pass, {held_end} groups held at the end; time in the garbage collector per step, "
          f"mean: Trinity {gc_s[0] / len(per_step[0]) * 1e3:.1f} ms, ours {gc_s[1] / len(per_step[1]) * 1e3:.1f} ms)")
    table(f"DAPO pipeline, {steps} consecutive explore steps of {groups} groups x {n} (per step; "
          "garbage collection included; alternating passes)",
          [("Trinity dapo_dynamic_sampling + grpo", per_step[0], None),
           ("OrchestratorOperator + actor + dso_grpo", per_step[1], worst)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="'' to skip dso_gigpo_index")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--groups", type=int, default=4096)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--target-groups", type=int, default=256)
    ap.add_argument("--step-groups", type=int, default=512, help="groups per explore step of the multi-step run")
    ap.add_argument("--steps-run", type=int, default=20, help="explore steps of the multi-step run")
    ap.add_argument("--step-passes", type=int, default=2, help="passes of the multi-step run, each pipeline")
    ap.add_argument("--skip-ray", action="store_true", help="leave out the DAPO pipelines (they start Ray)")
    ap.add_argument("--only", choices=["gigpo", "grpo", "dapo", "steps"], help="run one comparison")
    args = ap.parse_args()
    print(f"Trinity adapters vs Trinity built-ins, {args.repeats} rounds, min and median "
          "(speed-up = Trinity seconds / ours)")
    if args.only in (None, "gigpo"):
        bench_gigpo(args)
    if args.only in (None, "grpo"):
        bench_grpo(args)
    if args.only in (None, "dapo") and not args.skip_ray:
        bench_dapo(args)
    if args.only in (None, "steps") and not args.skip_ray:
        bench_steps(args)


if __name__ == "__main__":
    main()
