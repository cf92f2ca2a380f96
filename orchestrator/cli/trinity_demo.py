"""``trinity-dso trinity-demo`` (``make demo-trinity``): the orchestrator inside Trinity-RFT's own explorer, on CPU.

The logic lives in :mod:`orchestrator.jobs.trinity_demo`; this module prints its URLs while it
runs and its table at the end.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()


def demo_table(summary: dict) -> Table:
    """The closing table of the demo (the same numbers as trinity_demo.json)."""
    inv, stats, tr = summary["invariants"], summary["stats"], summary["trinity"]
    t = Table(title=f"trinity-dso inside Trinity-RFT 0.6.0's explorer, CPU ({summary['wall_seconds']} s)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    rows = [
        ("held-out accuracy, warm-started policy", f"{summary['start_heldout_acc']:.3f}"),
        ("held-out accuracy, end", f"{summary['end_heldout_acc']:.3f}"),
        ("held-out accuracy gain (points)", f"{summary['gain_points']:+.1f}"),
        ("Trinity explore steps (tasks x rollouts)", f"{tr['total_steps']} ({tr['batch_size']} x {tr['repeat_times']})"),
        ("rollouts generated", stats["rollouts_total"]),
        ("batches read by the trainer (Trinity QueueReader)", summary["batches_read"]),
        (f"experiences per batch (train_batch_size {tr['train_batch_size']})", ", ".join(map(str, inv["batch_sizes"]))),
        ("experiences read / read twice", f"{inv['experiences_read']} / {inv['experiences_read_twice']}"),
        ("groups kept (emitted)", stats["groups_emitted"]),
    ]
    for reason, v in stats["dropped_by_reason"].items():
        rows.append((f"groups dropped: {reason}", v))
    rows += [
        ("padding groups read (tokens with loss weight)", f"{summary['groups_read']['padding']} ({inv['padding_tokens_with_loss']})"),
        ("staleness drops (max_staleness 1, Trinity's stamps)", stats["dropped_by_reason"].get("stale", 0)),
        (f"advantages: trainer's {tr['advantage_fn']} vs pipeline's, max |diff|", f"{inv['advantage_max_abs_diff']:.1e}"),
        ("loss", tr["policy_loss_fn"]),
        ("weight syncs passing the check (|engine - trainer| log-prob <= 1e-3)", f"{inv['syncs_passed']} / {inv['syncs']}"),
        ("max |engine - trainer| log-prob after a sync", f"{inv['sync_max_abs_diff']:.1e}"),
        ("model version at end", summary["model_version_end"]),
    ]
    for name, value in rows:
        t.add_row(name, str(value))
    return t


def register(app: typer.Typer) -> None:
    """Add ``trinity-demo`` to the app."""

    @app.command("trinity-demo")
    def trinity_demo(
        seed: int = typer.Option(0, help="Seed of tasks, warm start, sampling and trainer."),
        budget: int = typer.Option(12_000, help="Rollouts to explore."),
        out: Path = typer.Option(Path("runs/trinity"), help="Output directory."),
        port: int = typer.Option(0, help="HTTP port of REST and /metrics (0: a free one)."),
    ) -> None:
        """A DAPO run inside Trinity-RFT 0.6.0's own explorer on CPU: orchestrator, vLLM, CPU trainer, weight sync."""
        from orchestrator.jobs.trinity_demo import TrinityDemoConfig, run_trinity_demo

        cfg = TrinityDemoConfig(seed=seed, rollout_budget=budget, out_dir=out, http_port=port)
        summary = run_trinity_demo(cfg, log=lambda m: console.print(escape(m)))
        console.print(demo_table(summary))
        console.print(f"wrote {escape(str(cfg.out_dir))}/trinity_demo.json, curves.png, metrics.prom")
        inv = summary["invariants"]
        if not (inv["every_batch_is_train_batch_size"] and inv["experiences_read_twice"] == 0
                and inv["syncs_passed"] == inv["syncs"]):
            raise typer.Exit(1)

    @app.command("compare-sampling-trinity")
    def compare_sampling_trinity(
        seeds: int = typer.Option(3, min=1, help="Seeds per arm."),
        first_seed: int = typer.Option(0, min=0, help="The first seed."),
        budget: int | None = typer.Option(None, min=64, help="Rollouts per arm and seed (default: twelve passes)."),
        train_size: int | None = typer.Option(None, min=8, help="Training tasks (default: compare-sampling's)."),
        arms: str | None = typer.Option(None, help="Comma-separated arms (default: epoch,pass_predictor)."),
        regime: str = typer.Option("reasoning", help="Task regime: 'reasoning' (reasoning before the answer) or 'exact' (the response is the answer)."),
        out: Path = typer.Option(Path("runs/sampling-compare-trinity"), help="Output directory (comparison.md, comparison.json, runs)."),
    ) -> None:
        """epoch vs the best selection usable on the Trinity route, inside Trinity-RFT 0.6.0's explorer (CPU trainer)."""
        from orchestrator.jobs.trinity_compare import run_comparison

        chosen = [a.strip() for a in arms.split(",")] if arms else None
        try:
            run_comparison(out, seeds=seeds, first_seed=first_seed, budget=budget, regime=regime, train_size=train_size,
                           arms=chosen, log=lambda m: console.print(escape(m)))
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
        console.print((out / "comparison.md").read_text())
