"""The training commands of the ``trinity-dso`` CLI: ``train`` (the main job, ``make demo``),
``ablate-dapo``, ``train-gigpo`` (``make demo-gigpo``) and ``compare-gigpo``. Registered on the
typer app by :func:`register`; the logic lives in :mod:`orchestrator.jobs.dapo_train`,
:mod:`orchestrator.jobs.ablation`, :mod:`orchestrator.jobs.gigpo_train` and
:mod:`orchestrator.jobs.gigpo_compare`."""

from __future__ import annotations

import math
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.jobs.sampling_arms import ARMS as SAMPLING_ARM_TABLE

console = Console()


def _f(x, digits: int = 3, kind: str = "f") -> str:
    """A float with ``digits`` decimals (``kind="e"``: scientific, for small magnitudes); "-" for None or NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}{kind}}" if isinstance(x, float) else str(x)


def progress_line(row: dict) -> str:
    """One line per step: step, rollouts, keep rate, reward, held-out accuracy, model version."""
    acc = row.get("heldout_acc")
    head = f"step {row['step']:3d} | rollouts {row['rollouts']:6d} | keep {_f(row['keep_rate'], 2)} | "
    tail = f"v{row['model_version']}" + (f" | held-out acc {acc:.3f}" if acc is not None else "")
    if row.get("train_skipped"):  # a batch of padding only: no trainer metrics
        return head + "no informative group: no update | " + tail
    return (head + f"reward {_f(row['reward_mean'], 2)} | entropy {_f(row['entropy'], 3)} | "
            f"clip {_f(row['pg_clipfrac'], 3)}/{_f(row['pg_clipfrac_lower'], 3)} | kl {_f(row['kl_ref'], 4)} | " + tail)


def train_table(summary: dict) -> Table:
    """The final table of a training run (the same numbers as train.json)."""
    t = Table(title=f"trinity-dso DAPO training run ({summary['wall_seconds']} s)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    last = summary["steps"][-1] if summary["steps"] else {}
    rows = [
        ("held-out accuracy, warm-started policy", summary["start_heldout_acc"]),
        ("held-out accuracy, end", summary["end_heldout_acc"]),
        ("held-out accuracy gain (points)", f"{100 * (summary['end_heldout_acc'] - summary['start_heldout_acc']):+.1f}"),
        ("train batches (rollout steps)", summary["steps_done"]),
        ("rollouts generated", summary["rollouts"]),
        ("groups trained on", summary["groups_trained"]),
        ("rollouts per emitted group", summary["rollouts_per_emitted_group"]),
        ("model version at end", last.get("model_version")),
        ("weight syncs", summary["sync"]["count"]),
        ("sync seconds, mean (max)", f"{_f(summary['sync']['mean_seconds'], 4)} ({_f(summary['sync']['max_seconds'], 4)})"),
        ("max |engine - trainer| log-prob after syncs", _f(summary["sync"]["max_abs_diff"], 1, "e")),
        ("entropy at end (nats/token)", last.get("entropy")),
        ("KL to initial policy at end", last.get("kl_ref")),
    ]
    stats = summary.get("stats") or {}
    for reason, v in (stats.get("dropped_by_reason") or {}).items():
        if v:
            rows.append((f"groups dropped: {reason}", v))
    for name, value in rows:
        t.add_row(name, _f(value) if not isinstance(value, str) else value)
    return t


def gigpo_progress_line(row: dict) -> str:
    """One line per GiGPO step: trajectories, success, anchor fraction, |A_S|, |A_E|, length."""
    held = row.get("heldout_success")
    return (f"step {row['step']:3d} | trajectories {row['trajectories']:5d} | success {_f(row['success_rate'], 3)} | "
            f"anchor>1 {_f(row['anchor_group_fraction'], 2)} | |A_S| {_f(row['mean_abs_step_advantage'], 3)} | "
            f"|A_E| {_f(row['mean_abs_episode_advantage'], 3)} | length {_f(row['episode_length'], 1)} | "
            f"v{row['model_version']}" + (f" | held-out success {held:.3f}" if held is not None else ""))


def gigpo_train_table(summary: dict) -> Table:
    """The final table of a GiGPO training run (the same numbers as gigpo_train.json)."""
    cfg = summary["config"]
    t = Table(title=f"trinity-dso GiGPO training run ({cfg['advantage']}, omega {cfg['gigpo']['omega']}, "
                    f"norm {cfg['gigpo']['norm']}; {summary['wall_seconds']} s)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    last = summary["steps"][-1] if summary["steps"] else {}
    rows = [
        ("success, training maps, first steps", summary["start_train_success"]),
        ("success, training maps, last steps", summary["end_train_success"]),
        ("success, held-out maps, start", summary["start_heldout_success"]),
        ("success, held-out maps, end", summary["end_heldout_success"]),
        ("train steps", summary["steps_done"]),
        ("trajectories generated", summary["trajectories"]),
        ("anchor index", summary["backend"]),
        ("steps in anchor groups > 1, last step", last.get("anchor_group_fraction")),
        ("mean |A_S|, last step", last.get("mean_abs_step_advantage")),
        ("mean |A_E|, last step", last.get("mean_abs_episode_advantage")),
        ("episode length, last step", last.get("episode_length")),
        ("weight syncs (mean seconds)", f"{summary['sync']['count']} ({_f(summary['sync']['mean_seconds'], 3)})"),
        ("max |engine - trainer| log-prob after syncs", _f(summary["sync"]["max_abs_diff"], 1, "e")),
    ]
    for name, value in rows:
        t.add_row(name, _f(value) if not isinstance(value, str) else value)
    return t


DAPO_ARMS = "dapo, no_clip_higher, no_dynamic_sampling, no_token_loss, no_overlong_shaping, grpo"
"""The arms of ``ablate-dapo`` for its help (the table, :data:`orchestrator.jobs.ablation.ARMS`,
lives in a module that imports torch; a test keeps the two equal)."""
GIGPO_ARMS = "gigpo, omega0, multi_step_grpo, gigpo_norm_none"
"""The arms of ``compare-gigpo`` for its help (:data:`orchestrator.jobs.gigpo_compare.ARMS`)."""
SAMPLING_ARMS = ", ".join(SAMPLING_ARM_TABLE)
"""The arms of ``compare-sampling`` for its help (:data:`orchestrator.jobs.sampling_arms.ARMS`, derived from the mode registries)."""


def _arms(arms: str | None, known: dict) -> list[str]:
    """The arms named in ``--arms`` (comma-separated; None: all), each checked against ``known``."""
    chosen = list(known) if not arms else [a.strip() for a in arms.split(",")]
    unknown = [a for a in chosen if a not in known]
    if unknown:
        raise typer.BadParameter(f"unknown arm(s) {unknown}; choose from {list(known)}", param_hint="--arms")
    return chosen


def register(app: typer.Typer) -> None:
    """Add ``train``, ``ablate-dapo``, ``train-gigpo``, ``compare-gigpo`` and ``compare-sampling`` to ``app``."""

    @app.command("train-gigpo")
    def train_gigpo(
        seed: int | None = typer.Option(None, help="Seeds maps, warm start, sampling and training (default 0)."),
        budget: int | None = typer.Option(None, min=1, help="Trajectories to generate (default: the config's)."),
        redis_url: str | None = typer.Option(None, help="Anchor index in Redis (default: in memory)."),
        config: Path | None = typer.Option(None, exists=True, dir_okay=False,
                                           help="YAML with the fields of GiGPOTrainConfig (in orchestrator/jobs/gigpo_train.py)."),
        out: Path | None = typer.Option(None, help="Output directory (gigpo_train.json, gigpo_curves.png, metrics.prom)."),
    ) -> None:
        """GiGPO training run on CPU: FrozenLake agent, vLLM, anchor index + advantage workers, trainer, weight sync."""
        from orchestrator.cli.service import load_yaml_model
        from orchestrator.jobs.gigpo_train import GiGPOTrainConfig, run_gigpo_training

        cfg = load_yaml_model(config, GiGPOTrainConfig, {"out_dir": out, "rollout_budget": budget, "seed": seed,
                                                         "redis_url": redis_url})
        t0 = time.perf_counter()
        with console.status("starting") as status:

            def say(msg: str) -> None:
                status.update(escape(msg))
                console.print(f"[dim]{time.perf_counter() - t0:6.1f}s[/dim] {escape(msg)}", soft_wrap=True)

            def on_step(row: dict) -> None:
                line = gigpo_progress_line(row)
                status.update(escape(line))
                if "heldout_success" in row or row["step"] % 5 == 0:
                    console.print(f"[dim]{time.perf_counter() - t0:6.1f}s[/dim] {escape(line)}", soft_wrap=True)

            summary = run_gigpo_training(cfg, progress=on_step, log=say)
        console.print(gigpo_train_table(summary))
        console.print(f"written: {cfg.out_dir / 'gigpo_train.json'}, " + ", ".join([*summary["plots"], str(cfg.out_dir / "metrics.prom")]))

    @app.command()
    def train(
        seed: int | None = typer.Option(None, help="Seeds tasks, warm start, sampling and training (default 0)."),
        budget: int | None = typer.Option(None, min=1, help="Rollouts to generate (default: the config's)."),
        config: Path | None = typer.Option(None, exists=True, dir_okay=False,
                                           help="YAML with the fields of DapoTrainConfig (in orchestrator/jobs/dapo_train.py)."),
        out: Path | None = typer.Option(None, help="Output directory (train.json, curves.png, sampling.png, metrics.prom)."),
        http_port: int = typer.Option(0, min=0, max=65535, help="Port of the run's REST service and live page on "
                                      "127.0.0.1 (0: a free one)."),
    ) -> None:
        """The main job: a DAPO training run on CPU (orchestrator + vLLM + trainer + weight sync + held-out eval),
        watched live at the printed /dashboard URL."""
        import uuid

        import ray

        from orchestrator.cli.service import load_yaml_model
        from orchestrator.jobs.dapo_train import DapoTrainConfig, run_dapo_training
        from orchestrator.service.names import DEFAULT_NAMESPACE
        from orchestrator.service.serve import serve_actor

        cfg = load_yaml_model(config, DapoTrainConfig, {"out_dir": out, "rollout_budget": budget, "seed": seed})
        t0 = time.perf_counter()
        if not ray.is_initialized():
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace=DEFAULT_NAMESPACE)
        actor_name = f"dso-train-{uuid.uuid4().hex[:8]}"
        url = serve_actor(actor_name, port=http_port)
        console.print(f"live page of the run: [bold]{url}/dashboard[/bold]  (REST {url}/v1/stats, {url}/v1/policy; "
                      f"metrics {url}/metrics; until the run ends)", soft_wrap=True)
        with console.status("starting") as status:

            def say(msg: str) -> None:
                status.update(escape(msg))
                console.print(f"[dim]{time.perf_counter() - t0:6.1f}s[/dim] {escape(msg)}", soft_wrap=True)

            def on_step(row: dict) -> None:
                line = progress_line(row)
                status.update(escape(line))
                if "heldout_acc" in row:
                    console.print(f"[dim]{time.perf_counter() - t0:6.1f}s[/dim] {escape(line)}", soft_wrap=True)

            summary = run_dapo_training(cfg, progress=on_step, log=say, actor_name=actor_name)
        console.print(train_table(summary))
        console.print(f"written: {cfg.out_dir / 'train.json'}, " + ", ".join([*summary["plots"], str(cfg.out_dir / "metrics.prom")]))

    @app.command("compare-gigpo")
    def compare_gigpo(
        setting: str = typer.Option("frozenlake", help="frozenlake (4x4 maps, 3 seeds) or sokoban (6x6 rooms, 20 turns, "
                                                       "5 seeds: `make compare-gigpo-long`)."),
        seeds: int | None = typer.Option(None, min=1, help="Seeds per arm (default: the setting's)."),
        budget: int | None = typer.Option(None, min=1, help="Trajectories per arm and seed (default: the setting's)."),
        out: Path | None = typer.Option(None, help="Output directory (comparison.md, comparison.json, comparison.png, runs); "
                                                   "default runs/gigpo-compare, runs/gigpo-compare-sokoban."),
        arms: str | None = typer.Option(None, help=f"Comma-separated arms among {GIGPO_ARMS} (default: all)."),
    ) -> None:
        """GiGPO vs omega = 0 vs multi-step GRPO vs no std normalisation, same trajectory budget."""
        from orchestrator.jobs.gigpo_compare import ARMS, SETTINGS, run_comparison

        if setting not in SETTINGS:
            raise typer.BadParameter(f"unknown setting {setting!r}; choose from {list(SETTINGS)}", param_hint="--setting")
        chosen = _arms(arms, ARMS)
        out = out or Path("runs/gigpo-compare" + ("" if setting == "frozenlake" else f"-{setting}"))
        result = run_comparison(out, seeds=seeds, budget=budget, arms=chosen, setting=setting,
                                log=lambda m: console.print(escape(m), soft_wrap=True))
        console.print(result["markdown"])
        console.print(f"written: {out / 'comparison.md'}, {out / 'comparison.png'}")

    @app.command("compare-sampling")
    def compare_sampling(
        seeds: int = typer.Option(5, min=1, help="Seeds per arm."),
        first_seed: int = typer.Option(0, min=0, help="The first seed (seeds first-seed .. first-seed + seeds - 1): "
                                       "another range checks a finding on seeds it was not read from."),
        budget: int | None = typer.Option(None, min=1, help="Rollouts per arm and seed (default: the comparison's)."),
        out: Path | None = typer.Option(None, help="Output directory (comparison.md, comparison.json, comparison.png, runs; "
                                        "default runs/sampling-compare, with --regime reasoning runs/sampling-compare-reasoning)."),
        arms: str | None = typer.Option(None, help=f"Comma-separated arms among {SAMPLING_ARMS} (default: all; "
                                        "with --regime reasoning, epoch and the arms that run on the Trinity route)."),
        spread: bool = typer.Option(False, help="Only measure the task set's difficulty spread on the warm-started policy (seed 0)."),
        rebuild: bool = typer.Option(False, help="Only rewrite the comparison files of --out from its runs' train.json (no training)."),
        regime: str = typer.Option("exact", help="Task regime: 'exact' (the response is the answer alone) or 'reasoning' "
                                   "(reasoning before the answer, the scorer reads the final number; docs/sampling-reasoning.md)."),
    ) -> None:
        """Which tasks to roll out, in real training: our selections and screening vs GRESO, Trinity's
        difficulty_based selector, the DAPO recipe's loop and GRPO, same seeds and rollout budget."""
        from orchestrator.jobs import sampling_compare
        from orchestrator.jobs.sampling_compare import ARMS, REGIMES, base_config, measure_spread, run_comparison

        if regime not in REGIMES:
            raise typer.BadParameter(f"regime must be one of {list(REGIMES)}, got {regime!r}", param_hint="--regime")
        out = out or Path("runs/sampling-compare" + ("-reasoning" if regime == "reasoning" else ""))
        if rebuild:
            console.print(sampling_compare.rebuild(out))
            return
        if spread:
            import json

            console.print(json.dumps(measure_spread(base_config(out / "spread", regime=regime)), indent=1))
            return
        chosen = _arms(arms, ARMS) if arms else None
        result = run_comparison(out, seeds=seeds, first_seed=first_seed, budget=budget, arms=chosen, regime=regime,
                                log=lambda m: console.print(escape(m), soft_wrap=True))
        console.print(result["markdown"])
        console.print(f"written: {out / 'comparison.md'}, {out / 'comparison.png'}")

    @app.command("ablate-dapo")
    def ablate_dapo(
        seeds: int = typer.Option(3, min=1, help="Seeds per arm."),
        budget: int | None = typer.Option(None, min=1, help="Rollouts per arm and seed (default: the ablation's)."),
        out: Path = typer.Option(Path("runs/ablation"), help="Output directory (ablation.md, ablation.json, ablation.png, runs)."),
        arms: str | None = typer.Option(None, help=f"Comma-separated arms among {DAPO_ARMS} (default: all)."),
    ) -> None:
        """Full DAPO vs each technique switched off alone vs plain GRPO, same rollout budget."""
        from orchestrator.jobs.ablation import ARMS, run_ablation

        chosen = _arms(arms, ARMS)

        def say(msg: str) -> None:
            console.print(escape(msg), soft_wrap=True)

        result = run_ablation(out, seeds=seeds, budget=budget, arms=chosen, log=say)
        console.print(result["markdown"])
        console.print(f"written: {out / 'ablation.md'}, {out / 'ablation.png'}")
